//! The coded low byte of f32 values (flag bit 3, format version 3, shared-shape model).
//!
//! gear-v2 stores the 23 bits below an f32's sign and exponent raw, which is right for K
//! (RoPE's sin/cos multiply leaves the low byte at 8.0 bits of entropy) but not for V of a
//! quantized model: llama.cpp's V comes out of integer dot products (Q4_1 x Q8_1) scaled to
//! f32, so the lowest byte has few distinct values (order-0 entropy ~6.5 bits on the real
//! data; 47 % of values have four or more trailing zero bits). With the flag, the lowest byte
//! of every value is Huffman-coded with one table of the blob, the next 15 bits stay packed
//! raw, and the top 9 bits are coded as usual.
//!
//! Body layout with the flag: the four lane lengths and lanes as in any coded body, then a
//! u32 LE byte length and the low-byte stream (every value's low byte in token-major order,
//! LSB-first codes, exactly the bytes its bits need), then bits 8..=22 of every value packed
//! LSB-first, 15 per value. The table follows the cluster tables in the model section, in
//! the run encoding with code lengths 1..=11 (a complete code, or one symbol of length 1).
//! The encoder sets the flag when the estimated coded size (entropy plus table) is below 98 %
//! of the raw low bytes.

use super::huffman::{self, LengthBuilder, INVALID_ENTRY, MAX_LEN_ANY, SYM_SHIFT};
use crate::error::Result;

/// Symbols of the low-byte table.
const SYMBOLS: usize = 256;
/// Entries of the decode table: one per 11-bit index.
const ENTRIES: usize = 1 << MAX_LEN_ANY;
/// Bits of the raw field packed above the coded byte.
pub(crate) const MID_BITS: u32 = 15;
/// Bytes of the length of the low-byte stream in a body.
pub(crate) const STREAM_LEN_BYTES: usize = 4;

/// The encoder's low-byte model: whether it pays, and the codes.
#[derive(Debug, Default)]
pub(crate) struct LowByteCodes {
    counts: Vec<u32>,
    lens: Vec<u8>,
    builder: LengthBuilder,
    /// `rev | len << 12` per byte value.
    codes: Vec<u16>,
    /// Whether the tensor's low bytes are coded (flag bit 3).
    pub(crate) on: bool,
}

impl LowByteCodes {
    /// Measures the low bytes of the f32 `values` (little-endian) and, when coding them pays,
    /// builds the codes and appends the table to `section`.
    pub(crate) fn fit(&mut self, values: &[u8], section: &mut Vec<u8>) {
        self.counts.clear();
        self.counts.resize(SYMBOLS, 0);
        for v in values.chunks_exact(4) {
            self.counts[v[0] as usize] += 1;
        }
        let n: u64 = self.counts.iter().map(|&c| c as u64).sum();
        self.lens.clear();
        self.lens.resize(SYMBOLS, 0);
        self.builder
            .build_lengths_limited(&self.counts, &mut self.lens, MAX_LEN_ANY);
        let coded: u64 = self
            .counts
            .iter()
            .zip(&self.lens)
            .map(|(&c, &l)| c as u64 * l as u64)
            .sum();
        // The table: about a nibble per used symbol and a run byte per run.
        let used = self.lens.iter().filter(|&&l| l > 0).count() as u64;
        let table_bits = 8 * (used / 2 + 16);
        self.on = n > 0 && (coded + table_bits) * 50 < 8 * n * 49;
        if !self.on {
            return;
        }
        huffman::write_table(&self.lens, section);
        self.codes.clear();
        self.codes.resize(SYMBOLS, 0);
        huffman::build_codes(&self.lens, &mut self.codes);
    }

    /// Appends the stream length and the coded low bytes of the f32 `values`.
    pub(crate) fn encode(&self, values: &[u8], out: &mut Vec<u8>) {
        let len_at = out.len();
        out.extend_from_slice(&[0; STREAM_LEN_BYTES]);
        let start = out.len();
        append_bits(values, out, |v| {
            let code = self.codes[v[0] as usize] as u64;
            (code & 0xfff, (code >> 12) as u32)
        });
        let len = (out.len() - start) as u32;
        out[len_at..start].copy_from_slice(&len.to_le_bytes());
    }
}

/// Appends bits 8..=22 of every f32 of `values`, 15 per value, packed LSB-first.
pub(crate) fn pack_mid_bits(values: &[u8], out: &mut Vec<u8>) {
    append_bits(values, out, |v| {
        let x = u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        ((x >> 8) as u64 & 0x7fff, MID_BITS)
    });
}

/// Appends, LSB-first, the `(bits, count)` that `field` gives for every f32 of `values`
/// (at most 16 bits each), the last byte zero-padded.
#[inline(always)]
fn append_bits(values: &[u8], out: &mut Vec<u8>, field: impl Fn(&[u8]) -> (u64, u32)) {
    let (mut acc, mut n) = (0u64, 0u32);
    for v in values.chunks_exact(4) {
        let (bits, count) = field(v);
        acc |= bits << n;
        n += count;
        if n >= 32 {
            out.extend_from_slice(&(acc as u32).to_le_bytes());
            acc >>= 32;
            n -= 32;
        }
    }
    out.extend_from_slice(&acc.to_le_bytes()[..n.div_ceil(8) as usize]);
}

/// ORs the packed 15-bit fields `mid` into bits 8..=22 of the f32 values of `out`
/// (`mid` holds at least `ceil(values * 15 / 8)` bytes).
pub(crate) fn merge_mid_bits(mid: &[u8], out: &mut [u8]) {
    for (i, v) in out.chunks_exact_mut(4).enumerate() {
        let bit = i * MID_BITS as usize;
        let mut a = [0u8; 4];
        let src = &mid[bit / 8..(bit / 8 + 4).min(mid.len())];
        a[..src.len()].copy_from_slice(src);
        let field = (u32::from_le_bytes(a) >> (bit % 8)) & 0x7fff;
        let x = u32::from_le_bytes([v[0], v[1], v[2], v[3]]) | field << 8;
        v.copy_from_slice(&x.to_le_bytes());
    }
}

/// The decoder's low-byte table: `sym << SYM_SHIFT | len` per 11-bit index.
#[derive(Debug, Default)]
pub(crate) struct LowByteTable {
    entries: Vec<u16>,
    used: Vec<u16>,
}

impl LowByteTable {
    /// Reads the table at `model[*pos..]` (table number `table` in errors).
    pub(crate) fn read(&mut self, model: &[u8], pos: &mut usize, table: usize) -> Result<()> {
        let single_symbol =
            huffman::read_complete_table(model, pos, SYMBOLS, &mut self.used, table, MAX_LEN_ANY)?;
        self.entries.clear();
        self.entries.resize(ENTRIES, INVALID_ENTRY);
        if single_symbol {
            // The one symbol owns both code words (the encoder writes a 0 bit).
            self.entries.fill(self.used[0]);
        } else {
            huffman::build_decode_table_bits(&self.used, &mut self.entries, MAX_LEN_ANY);
        }
        Ok(())
    }

    /// Decodes one low byte per f32 of `out` from `stream` (which must hold exactly the
    /// bytes its codes need) and ORs it into the value's lowest byte.
    pub(crate) fn decode(
        &self,
        stream: &[u8],
        out: &mut [u8],
    ) -> std::result::Result<(), &'static str> {
        let mask = ENTRIES as u64 - 1;
        let (mut acc, mut n, mut at) = (0u64, 0u32, 0usize);
        for v in out.chunks_exact_mut(4) {
            if n < MAX_LEN_ANY {
                if let Some(w) = stream.get(at..at + 8) {
                    // Eight bytes at once; the bytes that did not fit are read again.
                    acc |= u64::from_le_bytes(w.try_into().expect("8 bytes")) << n;
                    let bytes = (63 - n) / 8;
                    at += bytes as usize;
                    n += 8 * bytes;
                } else {
                    // Near the end whole bytes; past it zeros come in (checked below).
                    while n <= 56 {
                        let b = stream.get(at).copied().unwrap_or(0);
                        acc |= (b as u64) << n;
                        at += 1;
                        n += 8;
                    }
                }
            }
            let e = self.entries[(acc & mask) as usize];
            let len = (e & 15) as u32;
            acc >>= len;
            n -= len;
            v[0] |= (e >> SYM_SHIFT) as u8;
        }
        let used_bits = at as u64 * 8 - n as u64;
        if used_bits.div_ceil(8) != stream.len() as u64 {
            return Err(if used_bits > stream.len() as u64 * 8 {
                "low-byte stream truncated"
            } else {
                "low-byte stream has trailing bytes"
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<u8> {
        (0..n as u32)
            .flat_map(|i| {
                let low = [0u8, 0x10, 0x80, 0xc0, i.wrapping_mul(7) as u8][(i % 5) as usize];
                (0x3f80_0000u32 | i.wrapping_mul(2654435761) & 0x007f_ff00 | low as u32)
                    .to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn low_bytes_and_mid_bits_round_trip() {
        for n in [0usize, 1, 7, 8, 33, 1000] {
            let v = values(n);
            let mut codes = LowByteCodes::default();
            let mut section = Vec::new();
            codes.fit(&v, &mut section);
            // Below a few hundred values the table costs more than it saves.
            assert!(codes.on || n < 1000, "{n} values");
            if !codes.on {
                continue;
            }
            let mut table = LowByteTable::default();
            let mut pos = 0;
            table.read(&section, &mut pos, 0).unwrap();
            assert_eq!(pos, section.len());
            let mut body = Vec::new();
            codes.encode(&v, &mut body);
            let len = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
            assert_eq!(len, body.len() - 4);
            let mid_at = body.len();
            pack_mid_bits(&v, &mut body);
            assert_eq!(body.len() - mid_at, (n * 15).div_ceil(8));
            // Top 9 bits as the lanes would leave them, then the two merges.
            let mut out: Vec<u8> = v
                .chunks_exact(4)
                .flat_map(|x| {
                    (u32::from_le_bytes(x.try_into().unwrap()) & 0xff80_0000).to_le_bytes()
                })
                .collect();
            merge_mid_bits(&body[mid_at..], &mut out);
            table.decode(&body[4..mid_at], &mut out).unwrap();
            assert_eq!(out, v);
            // A stream one byte short or long is refused.
            let mut o = out.clone();
            assert!(table.decode(&body[4..mid_at - 1], &mut o).is_err());
            let mut long = body[4..mid_at].to_vec();
            long.push(0);
            assert!(table.decode(&long, &mut o).is_err());
        }
    }

    #[test]
    fn noise_low_bytes_stay_raw() {
        let v: Vec<u8> = (0..4096u32)
            .flat_map(|i| (i.wrapping_mul(2654435761) >> 3).to_le_bytes())
            .collect();
        let mut codes = LowByteCodes::default();
        let mut section = Vec::new();
        codes.fit(&v, &mut section);
        assert!(!codes.on);
        assert!(section.is_empty());
    }
}
