//! The entropy coder: a byte-wise rANS (range asymmetric numeral system) with static
//! tables, and the mapping of a quantized integer to a table symbol plus raw extra bits.
//!
//! rANS codes at the entropy of the table's distribution within a fraction of a percent,
//! decodes with one table lookup, a multiply and a shift per symbol, and needs only integer
//! arithmetic, so every host decodes the same values. Tables are static (made at
//! calibration and stored in the calibration file): a 256-token chunk holds only a few
//! hundred values per component, too few for an adaptive model to learn from. kvc's
//! Huffman (gear) costs up to one bit per symbol more, which at the one or two bits per value
//! this coder spends would be a large overhead.
//!
//! Two interleaved states of 32 bits in `[L, 256·L)`, `L = 2^23`, renormalized a byte at a
//! time, take turns coding (step `i` uses state `i % 2`). The stream is the two final states
//! (4 bytes each, little-endian, state 0 first) followed by the renormalization bytes in the
//! order the decoder reads them; a decoder that ends with bytes left over or a state other
//! than `L` has read a damaged stream.

use crate::error::{Error, Result};

/// Table precision: frequencies sum to `2^SCALE_BITS`.
pub const SCALE_BITS: u32 = 14;
/// Symbols of a table: 0, then a sign and a magnitude class for each of 31 classes.
pub const NSYM: usize = 63;
/// The largest magnitude a quantized value may have.
pub const MAX_MAGNITUDE: u32 = 1 << 30;

const RANS_L: u32 = 1 << 23;
const TOTAL: u32 = 1 << SCALE_BITS;

/// The symbol of `q` and its extra bits: `(symbol, extra bit count, extra value)`.
///
/// Magnitudes 1 and 2 are their own classes; class `b >= 3` holds `2^(b-2)+1 ..= 2^(b-1)`
/// with `b-2` extra bits. Symbol `2b-1` is `+`, `2b` is `-`. `|q| <= MAX_MAGNITUDE`.
pub fn split(q: i32) -> (u8, u32, u32) {
    let v = q.unsigned_abs();
    debug_assert!(v <= MAX_MAGNITUDE);
    if v == 0 {
        return (0, 0, 0);
    }
    let (b, nb, extra) = if v <= 2 {
        (v, 0, 0)
    } else {
        let k = 32 - (v - 1).leading_zeros(); // ceil(log2 v)
        (k + 1, k - 1, v - (1 << (k - 1)) - 1)
    };
    ((2 * b - 1 + u32::from(q < 0)) as u8, nb, extra)
}

/// Extra bits that follow `symbol`.
pub fn extra_bits(symbol: u8) -> u32 {
    let b = u32::from(symbol).div_ceil(2);
    b.saturating_sub(2)
}

/// The value of `symbol` with its `extra` bits (the inverse of [`split`]).
pub fn join(symbol: u8, extra: u32) -> i32 {
    if symbol == 0 {
        return 0;
    }
    let b = u32::from(symbol).div_ceil(2);
    let v = if b <= 2 {
        b
    } else {
        (1 << (b - 2)) + 1 + extra
    };
    if symbol.is_multiple_of(2) {
        -(v as i32)
    } else {
        v as i32
    }
}

/// A static distribution over the [`NSYM`] symbols.
///
/// Decoding finds a slot's symbol through `coarse`, the symbol at each multiple of
/// `2^COARSE_SHIFT`, then a short forward scan: some 640 bytes a table, so the tables of a
/// whole calibration stay in the fastest caches (a full slot table, 16 KiB a table, missed
/// the cache on almost every symbol).
#[derive(Clone)]
pub struct SymbolTable {
    freq: [u16; NSYM],
    start: [u16; NSYM],
    /// `start + freq` of each symbol (`2^SCALE_BITS` for the last).
    end: [u16; NSYM],
    coarse: [u8; 1 << (SCALE_BITS - COARSE_SHIFT)],
}

/// Slots per `coarse` entry: `2^COARSE_SHIFT`.
const COARSE_SHIFT: u32 = 6;

impl std::fmt::Debug for SymbolTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymbolTable")
            .field("freq", &self.freq)
            .finish()
    }
}

impl PartialEq for SymbolTable {
    fn eq(&self, o: &SymbolTable) -> bool {
        self.freq == o.freq
    }
}

impl SymbolTable {
    /// A table from stored frequencies: every one at least 1, summing to `2^SCALE_BITS`.
    pub fn from_freqs(freq: &[u16]) -> Result<SymbolTable> {
        if freq.len() != NSYM {
            return Err(Error::corrupt(
                "symbol table",
                format!("{} entries", freq.len()),
            ));
        }
        if freq.contains(&0) {
            return Err(Error::corrupt("symbol table", "a zero frequency"));
        }
        let sum: u32 = freq.iter().map(|&f| u32::from(f)).sum();
        if sum != TOTAL {
            return Err(Error::corrupt(
                "symbol table",
                format!("frequencies sum to {sum}, not {TOTAL}"),
            ));
        }
        let mut t = SymbolTable {
            freq: [0; NSYM],
            start: [0; NSYM],
            end: [0; NSYM],
            coarse: [0; 1 << (SCALE_BITS - COARSE_SHIFT)],
        };
        let mut c = 0u32;
        for (s, &f) in freq.iter().enumerate() {
            t.freq[s] = f;
            t.start[s] = c as u16;
            c += u32::from(f);
            // `end` of the last symbol is 2^SCALE_BITS, one past u16 when SCALE_BITS is 16;
            // at 14 it fits.
            t.end[s] = c as u16;
        }
        let mut s = 0usize;
        for (k, e) in t.coarse.iter_mut().enumerate() {
            let slot = (k as u32) << COARSE_SHIFT;
            while u32::from(t.end[s]) <= slot {
                s += 1;
            }
            *e = s as u8;
        }
        Ok(t)
    }

    /// The table closest to `counts` (observed symbol counts) in which every symbol keeps
    /// at least frequency 1. Deterministic: the same counts give the same table.
    pub fn from_counts(counts: &[u64; NSYM]) -> SymbolTable {
        let total: u64 = counts.iter().sum();
        let spare = u64::from(TOTAL) - NSYM as u64;
        let mut freq = [1u16; NSYM];
        if total > 0 {
            for (f, &c) in freq.iter_mut().zip(counts) {
                *f += ((c as u128 * spare as u128) / total as u128) as u16;
            }
        }
        // Give what rounding left to the most frequent symbols, one each, in order.
        let mut left = TOTAL - freq.iter().map(|&f| u32::from(f)).sum::<u32>();
        let mut order: Vec<usize> = (0..NSYM).collect();
        order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
        let mut i = 0;
        while left > 0 {
            freq[order[i % NSYM]] += 1;
            left -= 1;
            i += 1;
        }
        SymbolTable::from_freqs(&freq).expect("normalized table is valid")
    }

    /// The stored frequencies.
    pub fn freqs(&self) -> &[u16; NSYM] {
        &self.freq
    }
}

/// One coding step, recorded in decoding order and played back in reverse.
#[derive(Clone, Copy)]
pub(crate) enum Op {
    /// A table symbol: start, frequency.
    Symbol(u16, u16),
    /// `n <= 16` raw bits.
    Bits(u32, u32),
}

/// Codes `ops` (in the order the decoder will read them) into a stream appended to `out`.
///
/// Two rANS states take turns (op `i` uses state `i % 2`) over one byte stream, so a decoder
/// works on two independent dependency chains at once; the stream starts with both final
/// states (state 0, then state 1).
pub(crate) fn encode(ops: &[Op], out: &mut Vec<u8>) {
    let mut x = [RANS_L; 2];
    let mut rev = Vec::with_capacity(ops.len() / 2 + 16);
    for (i, op) in ops.iter().enumerate().rev() {
        let (start, freq, bits) = match *op {
            Op::Symbol(s, f) => (u32::from(s), u32::from(f), SCALE_BITS),
            Op::Bits(n, v) => (v, 1, n),
        };
        let xs = &mut x[i & 1];
        let x_max = ((RANS_L >> bits) << 8) * freq;
        while *xs >= x_max {
            rev.push(*xs as u8);
            *xs >>= 8;
        }
        *xs = ((*xs / freq) << bits) + (*xs % freq) + start;
    }
    out.extend_from_slice(&x[0].to_le_bytes());
    out.extend_from_slice(&x[1].to_le_bytes());
    out.extend(rev.iter().rev());
}

/// The values of symbols 0..5.
const SMALL: [i32; 5] = [0, 1, -1, 2, -2];

/// Reads a stream written by [`encode`].
pub(crate) struct Decoder<'a> {
    x: [u32; 2],
    /// Which state the next op uses.
    turn: usize,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Result<Decoder<'a>> {
        let state = |o: usize| -> Result<u32> {
            let b: [u8; 4] = buf
                .get(o..o + 4)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| Error::corrupt("rANS stream", "shorter than its two states"))?;
            let x = u32::from_le_bytes(b);
            if x < RANS_L {
                return Err(Error::corrupt("rANS stream", "initial state out of range"));
            }
            Ok(x)
        };
        Ok(Decoder {
            x: [state(0)?, state(4)?],
            turn: 0,
            buf,
            pos: 8,
        })
    }

    /// Brings state `k` back into `[L, 256·L)` from the stream.
    #[inline(always)]
    fn renorm(&mut self, k: usize) -> Result<()> {
        while self.x[k] < RANS_L {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| Error::corrupt("rANS stream", "ends early"))?;
            self.x[k] = (self.x[k] << 8) | u32::from(b);
            self.pos += 1;
        }
        Ok(())
    }

    #[inline(always)]
    pub(crate) fn symbol(&mut self, t: &SymbolTable) -> Result<u8> {
        let k = self.turn;
        self.turn ^= 1;
        let x = self.x[k];
        let slot = x & (TOTAL - 1);
        let mut s = t.coarse[(slot >> COARSE_SHIFT) as usize] as usize;
        // The slot's symbol is at or after the coarse one; `end` of the last symbol is
        // TOTAL > slot, so the scan stops inside the table.
        while u32::from(t.end[s]) <= slot {
            s += 1;
        }
        let (start, freq) = (u32::from(t.start[s]), u32::from(t.freq[s]));
        self.x[k] = freq * (x >> SCALE_BITS) + slot - start;
        self.renorm(k)?;
        Ok(s as u8)
    }

    #[inline(always)]
    pub(crate) fn bits(&mut self, n: u32) -> Result<u32> {
        let k = self.turn;
        self.turn ^= 1;
        let v = self.x[k] & ((1 << n) - 1);
        self.x[k] >>= n;
        self.renorm(k)?;
        Ok(v)
    }

    /// Checks that the stream ended exactly where the encoder started.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.pos != self.buf.len() || self.x != [RANS_L; 2] {
            return Err(Error::corrupt(
                "rANS stream",
                format!(
                    "{} of {} bytes read, final states {:#x} {:#x}",
                    self.pos,
                    self.buf.len(),
                    self.x[0],
                    self.x[1]
                ),
            ));
        }
        Ok(())
    }
}

/// Appends the ops of `q` (its symbol under `t`, then its extra bits, high chunk first).
pub(crate) fn push_value(ops: &mut Vec<Op>, t: &SymbolTable, q: i32) {
    let (s, nb, extra) = split(q);
    ops.push(Op::Symbol(t.start[s as usize], t.freq[s as usize]));
    if nb > 16 {
        ops.push(Op::Bits(nb - 16, extra >> 16));
        ops.push(Op::Bits(16, extra & 0xffff));
    } else if nb > 0 {
        ops.push(Op::Bits(nb, extra));
    }
}

/// Reads one value written by [`push_value`].
#[inline(always)]
pub(crate) fn read_value(d: &mut Decoder<'_>, t: &SymbolTable) -> Result<i32> {
    let s = d.symbol(t)?;
    if s < 5 {
        // 0, ±1, ±2: no extra bits (most values at the rates the coder runs at)
        return Ok(SMALL[s as usize]);
    }
    let nb = extra_bits(s);
    let extra = if nb > 16 {
        let hi = d.bits(nb - 16)?;
        (hi << 16) | d.bits(16)?
    } else if nb > 0 {
        d.bits(nb)?
    } else {
        0
    };
    Ok(join(s, extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_symbols_match_join() {
        for (s, &v) in SMALL.iter().enumerate() {
            assert_eq!(join(s as u8, 0), v);
            assert_eq!(extra_bits(s as u8), 0);
        }
    }

    #[test]
    fn split_and_join_are_inverse() {
        let mut vals: Vec<i32> = (-70_000..70_000).collect();
        vals.extend([
            MAX_MAGNITUDE as i32,
            -(MAX_MAGNITUDE as i32),
            1 << 29,
            (1 << 29) + 1,
        ]);
        for q in vals {
            let (s, nb, e) = split(q);
            assert!((s as usize) < NSYM, "{q}");
            assert_eq!(nb, extra_bits(s));
            assert!(nb == 0 || e < (1 << nb));
            assert_eq!(join(s, e), q);
        }
    }

    #[test]
    fn stream_round_trips_and_detects_damage() {
        let mut counts = [0u64; NSYM];
        let vals: Vec<i32> = (0..5000)
            .map(|i: i32| ((i.wrapping_mul(2_654_435_761u32 as i32) >> 20) % 9) - 4)
            .chain([1_000_000, -(MAX_MAGNITUDE as i32), 70_000])
            .collect();
        for &q in &vals {
            counts[split(q).0 as usize] += 1;
        }
        let t = SymbolTable::from_counts(&counts);
        let mut ops = Vec::new();
        for &q in &vals {
            push_value(&mut ops, &t, q);
        }
        let mut buf = Vec::new();
        encode(&ops, &mut buf);
        let mut d = Decoder::new(&buf).unwrap();
        let back: Vec<i32> = vals
            .iter()
            .map(|_| read_value(&mut d, &t).unwrap())
            .collect();
        d.finish().unwrap();
        assert_eq!(back, vals);
        // Truncation is always caught; a flipped byte is caught or decodes to other values
        // (the section hash catches those).
        for cut in 0..buf.len() {
            let r = (|| {
                let mut d = Decoder::new(&buf[..cut])?;
                for _ in &vals {
                    read_value(&mut d, &t)?;
                }
                d.finish()
            })();
            assert!(r.is_err(), "cut {cut}");
        }
    }

    #[test]
    fn bad_tables_are_refused() {
        assert!(SymbolTable::from_freqs(&[0u16; NSYM]).is_err());
        let mut f = [260u16; NSYM];
        assert!(SymbolTable::from_freqs(&f).is_err());
        f[0] = (TOTAL - 260 * (NSYM as u32 - 1)) as u16;
        assert!(SymbolTable::from_freqs(&f).is_ok());
        assert!(SymbolTable::from_freqs(&f[1..]).is_err());
    }
}
