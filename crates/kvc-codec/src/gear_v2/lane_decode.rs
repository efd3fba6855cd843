//! Decoding a coded chunk: the four interleaved Huffman lanes, then the raw low bits.
//!
//! A chunk's channels are walked four at a time (channel `base + k` in lane `k`), each for all
//! the chunk's tokens, so every lane keeps one table (two with the sign context) hot for a
//! whole run. Each lane keeps a 64-bit window: while at least 8 bytes are left after a lane's
//! position, one unaligned load refills it with at least 57 bits, enough for
//! [`SYMS_PER_WORD`] symbols of at most `MAX_LEN` bits, decoded with one table lookup each
//! and no further checks (the fast path); the last symbols of a run, near the end of the
//! chunk, take a slow path that pads past the end with zeros. The symbols are stored straight
//! into the output rows (the low bytes of f16/i8 are already there; packed low bits are ORed
//! in after). On x86-64 with BMI2 the same code is compiled a second time with BMI2 enabled
//! and LZCNT (variable shifts without the `cl` register, a one-instruction leading-zero
//! count), chosen at run time.

// The lane loops index several per-lane arrays with one `k`; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use super::encode::LANES;
use super::huffman::{DECODE_ENTRIES, INVALID_ENTRY, MAX_LEN, SYM_SHIFT};
use super::lanes::SYMS_PER_WORD;
use super::low_bits;

/// A channel's decode tables as one array: with the sign context, the table for context 1
/// follows the one for context 0, so `ctx << MAX_LEN | bits` indexes both without a branch
/// or a bounds check (the decoder keeps one padding table after the last).
type DecodeTables = [u16; 2 * DECODE_ENTRIES];

/// Bit position of a fast-path window's sentinel: the window holds 57 valid bits below it.
const SENTINEL_BIT: usize = 57;
const SENTINEL: u64 = 1 << SENTINEL_BIT;

/// What the lane decoder needs from the blob's model.
pub(crate) struct LaneModel<'a> {
    /// All decode tables, `DECODE_ENTRIES` each, table `group * contexts + ctx`, and one
    /// padding table after the last.
    pub tables: &'a [u16],
    /// Channels per token.
    pub channels: usize,
    /// Channels per table group.
    pub group: usize,
    /// Whether the previous token's sign selects the table.
    pub sign_context: bool,
}

/// A coded chunk's bytes and where its four lanes lie in them.
pub(crate) struct Lanes<'a> {
    /// The whole chunk (lanes may read past their end into it; the lengths are checked after).
    pub data: &'a [u8],
    /// Byte offset of each lane in `data`.
    pub starts: [usize; LANES],
    /// Byte length of each lane.
    pub lens: [usize; LANES],
}

impl LaneModel<'_> {
    #[inline(always)]
    fn table(&self, channel: usize) -> Option<&DecodeTables> {
        let nctx = if self.sign_context { 2 } else { 1 };
        let t = (channel / self.group) * nctx;
        self.tables
            .get(t * DECODE_ENTRIES..(t + 2) * DECODE_ENTRIES)?
            .try_into()
            .ok()
    }
}

/// Reads 64 bits at bit offset `bit` of `data` (LSB-first) shifted so that bit `bit` is bit
/// 0: at least 57 valid bits. Bytes past the end read as zero.
#[inline(always)]
fn read_bits(data: &[u8], bit: usize) -> u64 {
    let b = bit >> 3;
    let mut a = [0u8; 8];
    match data.get(b..b + 8) {
        Some(s) => a.copy_from_slice(s),
        None => {
            let tail = data.get(b..).unwrap_or(&[]);
            a[..tail.len()].copy_from_slice(tail);
        }
    }
    u64::from_le_bytes(a) >> (bit & 7)
}

/// Writes the top field `sym` of element `k` of `cell`. When the low bits fill whole bytes
/// (f16, i8) only the top byte is stored (the low bytes were spread before); otherwise the
/// whole element is written with zero low bits, merged after.
#[inline(always)]
fn put<const BPV: usize, const REST: u32>(cell: &mut [u8], k: usize, sym: u32) {
    if REST.is_multiple_of(8) {
        cell[k * BPV + REST as usize / 8] = sym as u8;
    } else {
        let v = (sym << REST).to_le_bytes();
        cell[k * BPV..k * BPV + BPV].copy_from_slice(&v[..BPV]);
    }
}

/// Decodes the lanes of a coded chunk and merges the low bits `rest` into `out` (whole
/// tokens). Errors are the reason of a `V2BadChunk`.
pub(crate) fn decode_coded<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneModel<'_>,
    lanes: &Lanes<'_>,
    rest: &[u8],
    out: &mut [u8],
) -> Result<(), &'static str> {
    if REST.is_multiple_of(8) {
        low_bits::spread_low_bytes::<BPV, REST>(rest, out);
    }
    let bits = decode_lanes_best::<BPV, REST, SYM>(model, lanes, out)?;
    for k in 0..LANES {
        let used = bits[k] - lanes.starts[k] * 8;
        if used.div_ceil(8) != lanes.lens[k] {
            return Err(if used > lanes.lens[k] * 8 {
                "Huffman lane truncated"
            } else {
                "Huffman lane has trailing bytes"
            });
        }
    }
    if !REST.is_multiple_of(8) {
        low_bits::merge_low_bits::<BPV, REST>(rest, out);
    }
    Ok(())
}

/// Whether a test asked this thread's decodes to take the portable lane decoders.
#[cfg(test)]
pub(crate) fn force_portable() -> bool {
    tests::FORCE_PORTABLE.get()
}

/// The fastest lane decoder this CPU runs.
fn decode_lanes_best<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneModel<'_>,
    lanes: &Lanes<'_>,
    out: &mut [u8],
) -> Result<[usize; LANES], &'static str> {
    #[cfg(test)]
    if tests::FORCE_PORTABLE.get() {
        return decode_lanes_portable::<BPV, REST, SYM>(model, lanes, out);
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("bmi2") && std::is_x86_feature_detected!("lzcnt") {
        // SAFETY: the CPU supports BMI2 and LZCNT, checked just above; the function is
        // otherwise safe.
        return unsafe { decode_lanes_bmi2::<BPV, REST, SYM>(model, lanes, out) };
    }
    decode_lanes_portable::<BPV, REST, SYM>(model, lanes, out)
}

/// [`decode_lanes`] compiled without extra target features.
pub(crate) fn decode_lanes_portable<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneModel<'_>,
    lanes: &Lanes<'_>,
    out: &mut [u8],
) -> Result<[usize; LANES], &'static str> {
    if model.sign_context {
        decode_lanes::<BPV, REST, SYM, true>(model, lanes, out)
    } else {
        decode_lanes::<BPV, REST, SYM, false>(model, lanes, out)
    }
}

/// [`decode_lanes`] compiled with BMI2 and LZCNT.
///
/// # Safety
/// The CPU must support BMI2 and LZCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,lzcnt")]
pub(crate) unsafe fn decode_lanes_bmi2<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneModel<'_>,
    lanes: &Lanes<'_>,
    out: &mut [u8],
) -> Result<[usize; LANES], &'static str> {
    if model.sign_context {
        decode_lanes::<BPV, REST, SYM, true>(model, lanes, out)
    } else {
        decode_lanes::<BPV, REST, SYM, false>(model, lanes, out)
    }
}

/// Decodes every lane of the chunk into `out` (`tokens * channels * BPV` bytes); returns the
/// bit position each lane stopped at. `CTX`: the sign context is on.
#[inline(always)]
fn decode_lanes<const BPV: usize, const REST: u32, const SYM: u32, const CTX: bool>(
    model: &LaneModel<'_>,
    lanes: &Lanes<'_>,
    out: &mut [u8],
) -> Result<[usize; LANES], &'static str> {
    const MISSING: &str = "table missing for a channel";
    // An entry is `sym << SYM_SHIFT | len`; the symbol's top (sign) bit moved to bit
    // `MAX_LEN` is the offset of the next symbol's table.
    let ctx_shift = SYM_SHIFT + SYM - 1 - MAX_LEN;
    let ctx_bit = DECODE_ENTRIES;
    let mask = DECODE_ENTRIES - 1;
    let ch = model.channels;
    let row = ch * BPV;
    let tokens = out.len() / row;
    let data = lanes.data;
    // A lane refills on the fast path while its byte position is at most this.
    let fast_end = data.len().checked_sub(8);
    let mut bit = lanes.starts.map(|s| s * 8);
    let mut flags = 0u16;
    let mut base = 0;
    while base + LANES <= ch {
        let mut tb = [model.table(base).ok_or(MISSING)?; LANES];
        for k in 1..LANES {
            tb[k] = model.table(base + k).ok_or(MISSING)?;
        }
        let mut ctx = [0usize; LANES];
        let mut t = 0;
        // Fast path: whole groups of SYMS_PER_WORD tokens, every lane 8 bytes from the end.
        if let Some(fast_end) = fast_end {
            while t + SYMS_PER_WORD <= tokens && bit.iter().all(|&b| b >> 3 <= fast_end) {
                // Each window keeps its 57 valid bits below a sentinel bit 57: after the
                // group, the sentinel's position tells the bits consumed (one leading-zero
                // count per lane instead of an add per symbol). The group's codes take at
                // most 54 bits, so every lookup's 9 bits lie below the sentinel.
                let mut w = [0u64; LANES];
                for k in 0..LANES {
                    let b = bit[k] >> 3;
                    let bytes: [u8; 8] = data[b..b + 8].try_into().unwrap_or([0; 8]);
                    let v = u64::from_le_bytes(bytes) >> (bit[k] & 7);
                    w[k] = (v & (SENTINEL - 1)) | SENTINEL;
                }
                let at = t * row + base * BPV;
                let Some(cells) = out.get_mut(at..at + (SYMS_PER_WORD - 1) * row + LANES * BPV)
                else {
                    return Err("output shape");
                };
                for s in 0..SYMS_PER_WORD {
                    let cell = &mut cells[s * row..s * row + LANES * BPV];
                    for k in 0..LANES {
                        let e = tb[k][ctx[k] | (w[k] as usize & mask)];
                        // Bits 4 and 5 of an entry are zero: the shift is by its length.
                        w[k] = w[k].wrapping_shr(e as u32);
                        flags |= e;
                        put::<BPV, REST>(cell, k, (e >> SYM_SHIFT) as u32);
                        if CTX {
                            ctx[k] = (e as usize >> ctx_shift) & ctx_bit;
                        }
                    }
                }
                for k in 0..LANES {
                    bit[k] += w[k].leading_zeros() as usize - (63 - SENTINEL_BIT);
                }
                t += SYMS_PER_WORD;
            }
        }
        // Slow path: the rest of the run, reading zeros past the end of the chunk.
        while t < tokens {
            let n = SYMS_PER_WORD.min(tokens - t);
            let mut w = [0u64; LANES];
            for k in 0..LANES {
                w[k] = read_bits(data, bit[k]);
            }
            for s in 0..n {
                let at = (t + s) * row + base * BPV;
                let Some(cell) = out.get_mut(at..at + LANES * BPV) else {
                    return Err("output shape");
                };
                for k in 0..LANES {
                    let e = tb[k][ctx[k] | (w[k] as usize & mask)];
                    let len = (e & 15) as u32;
                    w[k] >>= len;
                    bit[k] += len as usize;
                    flags |= e;
                    put::<BPV, REST>(cell, k, (e >> SYM_SHIFT) as u32);
                    if CTX {
                        ctx[k] = (e as usize >> ctx_shift) & ctx_bit;
                    }
                }
            }
            t += n;
        }
        base += LANES;
    }
    // The last `channels % 4` channels, one per lane.
    for c in base..ch {
        let k = c - base;
        let tb = model.table(c).ok_or(MISSING)?;
        let mut ctx = 0usize;
        let mut t = 0;
        while t < tokens {
            let n = SYMS_PER_WORD.min(tokens - t);
            let mut w = read_bits(data, bit[k]);
            for s in 0..n {
                let at = (t + s) * row + c * BPV;
                let Some(cell) = out.get_mut(at..at + BPV) else {
                    return Err("output shape");
                };
                let e = tb[ctx | (w as usize & mask)];
                let len = (e & 15) as u32;
                w >>= len;
                bit[k] += len as usize;
                flags |= e;
                put::<BPV, REST>(cell, 0, (e >> SYM_SHIFT) as u32);
                if CTX {
                    ctx = (e as usize >> ctx_shift) & ctx_bit;
                }
            }
            t += n;
        }
    }
    if flags & INVALID_ENTRY != 0 {
        return Err("invalid Huffman code");
    }
    Ok(bit)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::{Coder, Decoder, EncodeParams, Encoder, TensorKind};
    use crate::Dtype;
    use std::cell::Cell;

    thread_local! {
        /// Set by a test to make this thread's decodes take the portable lane decoder.
        pub(crate) static FORCE_PORTABLE: Cell<bool> = const { Cell::new(false) };
    }

    #[test]
    fn bmi2_and_portable_lane_decoders_agree() {
        // Skewed tops with sign runs (the sign context pays), several chunk and channel
        // shapes so that fast path, slow tail and leftover channels all run.
        let mut rng = crate::gear_v2::test_rng::XorShift64(0x2545_f491_4f6c_dd1d);
        for dtype in [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8] {
            for (tokens, channels, chunk) in [(300, 22, 64), (97, 8, 13), (5, 3, 256)] {
                let w = dtype.size();
                let mut data = vec![0u8; tokens * channels * w];
                for (i, b) in data.iter_mut().enumerate() {
                    let x = rng.next();
                    let top = i % w == w - 1;
                    let sign = ((i / (channels * w)) / 7 + i / w) as u8 & 1;
                    *b = if top {
                        sign << 7 | 0x30 | (x >> 60) as u8
                    } else {
                        (x >> 24) as u8
                    };
                }
                let mut params = EncodeParams::new(dtype, channels as u32);
                params.chunk_tokens = chunk;
                params.kind = TensorKind::K;
                for coder in [Coder::Grouped, Coder::SharedShape] {
                    let blob = Encoder::with_coder(coder).encode(&params, &data).unwrap();
                    let mut dec = Decoder::new();
                    let best = dec.decode(&blob).unwrap();
                    FORCE_PORTABLE.set(true);
                    let portable = dec.decode(&blob);
                    FORCE_PORTABLE.set(false);
                    let what = format!("{coder:?} {dtype:?} {tokens}x{channels}");
                    assert_eq!(best, data, "{what}");
                    assert_eq!(portable.unwrap(), data, "{what}");
                }
            }
        }
    }
}
