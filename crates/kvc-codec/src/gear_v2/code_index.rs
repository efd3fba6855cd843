//! The encoder's first pass over a chunk: every value's **code index**, the position of its
//! code in its channel's pair of encode tables, written channel-major (the order the lanes
//! code them in).
//!
//! A value's index is its top field made relative to its channel's location ([`RelMap`];
//! location 0 with the sign-magnitude map leaves the field unchanged, the grouped model), plus
//! a context step ([`CTX_STEP`] for the encoder) when the sign context is on and the previous
//! token's relative symbol in the same channel had its top bit set (never for a chunk's first
//! token). An encode table holds [`CODE_ENTRIES`] codes and a channel's context-1 table
//! directly follows its context-0 table, so `codes[table * CODE_ENTRIES + index]` is the
//! value's code in either context. With the alphabet as the step, the same indices address a
//! channel's histograms of both contexts (`model`'s statistics).
//!
//! Why a separate pass: it is the same arithmetic for every value of a row (a vector loop
//! over channels, compiled a second time with AVX2 and chosen at run time), so the lane loop
//! that follows does one load, one table lookup and the bit appending per value instead of
//! the field extraction, the map and the context selection. The rows are computed eight
//! tokens at a time into a small block and transposed from there (SSE2, 8x8 `u16`): the
//! lanes then read every channel's indices contiguously, where reading a column of the
//! token-major chunk costs a cache line per value.

use super::lanes::CODE_ENTRIES;
use super::shared::RelMap;

/// What the sign context adds to an encoder's index: one table further.
pub(crate) const CTX_STEP: u16 = CODE_ENTRIES as u16;

/// Tokens per block of `for_each_block`.
const BLOCK: usize = 8;

/// Computes the code indices of `raw` (whole rows of `locs.len()` channels; contexts start
/// at its first row) [`BLOCK`] rows at a time into `block` and hands every block to `f` as
/// `(first token, token-major indices of its rows)`. `ctx_step`: what the context adds (0:
/// no context).
fn for_each_block<const BPV: usize, const REST: u32, const SYM: u32>(
    raw: &[u8],
    locs: &[u16],
    map: RelMap,
    ctx_step: u16,
    block: &mut Vec<u16>,
    mut f: impl FnMut(usize, &[u16]),
) {
    let channels = locs.len();
    let row = channels * BPV;
    if channels == 0 {
        return;
    }
    let tokens = raw.len() / row;
    block.resize((BLOCK + 1) * channels, 0);
    let mut t0 = 0;
    while t0 < tokens {
        let n = BLOCK.min(tokens - t0);
        // Rows t0 - 1 ..t0 + n: the previous row only gives the first one its context.
        let from = t0.saturating_sub(1);
        let skip = t0 - from;
        let rows = skip + n;
        code_indices::<BPV, REST, SYM>(
            &raw[from * row..(t0 + n) * row],
            locs,
            map,
            ctx_step,
            &mut block[..rows * channels],
        );
        f(t0, &block[skip * channels..rows * channels]);
        t0 += n;
    }
}

/// Fills `cm` (channel `c`'s indices at `c * tokens..`) with the code index of every value
/// of `raw` (whole rows of `locs.len()` channels, as for [`code_indices`]); `ctx_step`: what
/// the context adds (0: no context); `block` is scratch.
pub(crate) fn channel_major_indices<const BPV: usize, const REST: u32, const SYM: u32>(
    raw: &[u8],
    locs: &[u16],
    map: RelMap,
    ctx_step: u16,
    block: &mut Vec<u16>,
    cm: &mut [u16],
) {
    let channels = locs.len();
    let tokens = raw.len() / (channels * BPV).max(1);
    for_each_block::<BPV, REST, SYM>(raw, locs, map, ctx_step, block, |t0, rows| {
        transpose_block(rows, channels, tokens, t0, cm)
    });
}

/// Writes the `n = rows.len() / channels` token-major rows `rows` (tokens `t0..t0 + n`) into
/// the channel-major `cm` (`tokens` per channel).
fn transpose_block(rows: &[u16], channels: usize, tokens: usize, t0: usize, cm: &mut [u16]) {
    let n = rows.len() / channels;
    let mut c0 = 0;
    #[cfg(target_arch = "x86_64")]
    if n == BLOCK && !super::low_bits::force_portable() {
        // SAFETY: SSE2 is part of x86-64; the function is otherwise safe.
        c0 = unsafe { transpose_block_sse2(rows, channels, tokens, t0, cm) };
    }
    for c in c0..channels {
        let dst = &mut cm[c * tokens + t0..c * tokens + t0 + n];
        for (j, d) in dst.iter_mut().enumerate() {
            *d = rows[j * channels + c];
        }
    }
}

/// [`transpose_block`] for a whole block of [`BLOCK`] rows, eight channels at a time;
/// returns the channels done (a multiple of eight).
///
/// # Safety
/// The CPU must support SSE2 (every x86-64 does).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn transpose_block_sse2(
    rows: &[u16],
    channels: usize,
    tokens: usize,
    t0: usize,
    cm: &mut [u16],
) -> usize {
    use std::arch::x86_64::*;
    let whole = channels / 8 * 8;
    assert!(rows.len() >= BLOCK * channels && t0 + BLOCK <= tokens);
    assert!(cm.len() >= channels * tokens);
    for c0 in (0..whole).step_by(8) {
        let mut r = [_mm_setzero_si128(); BLOCK];
        for (j, reg) in r.iter_mut().enumerate() {
            // SAFETY: elements j * channels + c0 .. + 8 of `rows` exist: j < BLOCK and
            // c0 + 8 <= channels, and rows holds BLOCK rows (asserted). Unaligned load.
            *reg =
                unsafe { _mm_loadu_si128(rows.as_ptr().add(j * channels + c0) as *const __m128i) };
        }
        // Each round rotates the (register, element) index bits by one; after three,
        // register = channel and element = token.
        for _ in 0..3 {
            let mut x = [_mm_setzero_si128(); BLOCK];
            for i in 0..4 {
                x[2 * i] = _mm_unpacklo_epi16(r[i], r[i + 4]);
                x[2 * i + 1] = _mm_unpackhi_epi16(r[i], r[i + 4]);
            }
            r = x;
        }
        for (i, reg) in r.iter().enumerate() {
            // SAFETY: elements (c0 + i) * tokens + t0 .. + 8 of `cm` exist: c0 + i < channels
            // and t0 + 8 <= tokens, and cm holds channels * tokens (asserted). Unaligned.
            unsafe {
                _mm_storeu_si128(
                    cm.as_mut_ptr().add((c0 + i) * tokens + t0) as *mut __m128i,
                    *reg,
                )
            };
        }
    }
    whole
}

/// Fills `idx` (one element per value of `raw`, token-major) with the code index of every
/// value of `raw` (whole rows of `locs.len()` channels of `BPV`-byte values, top field above
/// the low `REST` bits, `SYM` bits wide); `ctx_step`: what the context adds (0: none).
fn code_indices<const BPV: usize, const REST: u32, const SYM: u32>(
    raw: &[u8],
    locs: &[u16],
    map: RelMap,
    ctx_step: u16,
    idx: &mut [u16],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && !super::low_bits::force_portable() {
        // SAFETY: the CPU supports AVX2, checked just above; the function is otherwise safe.
        unsafe { code_indices_avx2::<BPV, REST, SYM>(raw, locs, map, ctx_step, idx) };
        return;
    }
    code_indices_any::<BPV, REST, SYM>(raw, locs, map, ctx_step, idx)
}

/// [`code_indices`] compiled with AVX2 (the row loop vectorises to 16 values per step).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn code_indices_avx2<const BPV: usize, const REST: u32, const SYM: u32>(
    raw: &[u8],
    locs: &[u16],
    map: RelMap,
    ctx_step: u16,
    idx: &mut [u16],
) {
    code_indices_any::<BPV, REST, SYM>(raw, locs, map, ctx_step, idx)
}

#[inline(always)]
fn code_indices_any<const BPV: usize, const REST: u32, const SYM: u32>(
    raw: &[u8],
    locs: &[u16],
    map: RelMap,
    ctx_step: u16,
    idx: &mut [u16],
) {
    let channels = locs.len();
    if channels == 0 {
        return;
    }
    // The previous row's top bit, moved to the context step (0 without the context).
    let ctx_shift = (SYM - 1) as u16;
    let sign = map.sign() as u16;
    let diff = map.diff() as u16;
    let rows = raw
        .chunks_exact(channels * BPV)
        .zip(0..idx.len() / channels);
    for (row, t) in rows {
        let (done, rest) = idx.split_at_mut(t * channels);
        let cur = &mut rest[..channels];
        let prev = done.get(done.len().wrapping_sub(channels)..);
        match prev {
            Some(prev) => {
                for (((d, &p), &loc), v) in
                    cur.iter_mut().zip(prev).zip(locs).zip(values::<BPV>(row))
                {
                    let top = field::<REST, SYM>(v);
                    let r = ((top ^ loc) & sign) | (top.wrapping_sub(loc) & diff);
                    *d = r | (((p >> ctx_shift) & 1).wrapping_neg() & ctx_step);
                }
            }
            None => {
                for ((d, &loc), v) in cur.iter_mut().zip(locs).zip(values::<BPV>(row)) {
                    let top = field::<REST, SYM>(v);
                    *d = ((top ^ loc) & sign) | (top.wrapping_sub(loc) & diff);
                }
            }
        }
    }
}

/// The values of a row, each widened to `u32`.
#[inline(always)]
fn values<const BPV: usize>(row: &[u8]) -> impl Iterator<Item = u32> + '_ {
    row.chunks_exact(BPV).map(|b| match BPV {
        1 => b[0] as u32,
        2 => u16::from_le_bytes([b[0], b[1]]) as u32,
        _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    })
}

/// The top field of a value, as `u16`.
#[inline(always)]
fn field<const REST: u32, const SYM: u32>(v: u32) -> u16 {
    ((v >> REST) & ((1 << SYM) - 1)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gear_v2::values::load;

    /// The index of every value, computed one value at a time as the format defines it.
    fn reference<const BPV: usize, const REST: u32, const SYM: u32>(
        raw: &[u8],
        locs: &[u16],
        map: RelMap,
        ctx: bool,
    ) -> Vec<u16> {
        let c = locs.len();
        let rel = |j: usize| {
            let top = (load::<BPV>(raw, j) >> REST) & ((1 << SYM) - 1);
            map.relative(top, locs[j % c] as u32)
        };
        (0..raw.len() / BPV)
            .map(|i| {
                let x = ctx && i >= c && rel(i - c) >> (SYM - 1) == 1;
                (rel(i) + if x { CODE_ENTRIES as u32 } else { 0 }) as u16
            })
            .collect()
    }

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 33) as u8
            })
            .collect()
    }

    fn check<const BPV: usize, const REST: u32, const SYM: u32>(map: RelMap) {
        for channels in [1usize, 3, 16, 17, 40] {
            let tokens = 7;
            let raw = noise(tokens * channels * BPV, channels as u64);
            let locs: Vec<u16> = noise(channels * 2, 99)
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) & ((1 << SYM) - 1))
                .collect();
            for ctx in [false, true] {
                let want = reference::<BPV, REST, SYM>(&raw, &locs, map, ctx);
                let mut got = vec![0u16; want.len()];
                let step = if ctx { CTX_STEP } else { 0 };
                code_indices::<BPV, REST, SYM>(&raw, &locs, map, step, &mut got);
                assert_eq!(got, want, "channels {channels} ctx {ctx}");
                let mut portable = vec![0u16; want.len()];
                code_indices_any::<BPV, REST, SYM>(&raw, &locs, map, step, &mut portable);
                assert_eq!(portable, want);
            }
        }
    }

    #[test]
    fn channel_major_indices_transpose_the_token_major_ones() {
        let map = RelMap::sign_magnitude(9);
        for channels in [1usize, 5, 8, 16, 21] {
            for tokens in [1usize, 7, 8, 9, 17, 40] {
                let raw = noise(tokens * channels * 2, (channels * tokens) as u64);
                let locs: Vec<u16> = (0..channels as u16).map(|c| c * 37 % 512).collect();
                let tm = reference::<2, 7, 9>(&raw, &locs, map, true);
                for portable in [false, true] {
                    crate::gear_v2::lane_decode::tests::FORCE_PORTABLE.set(portable);
                    let mut cm = vec![0u16; tm.len()];
                    let mut block = Vec::new();
                    channel_major_indices::<2, 7, 9>(
                        &raw, &locs, map, CTX_STEP, &mut block, &mut cm,
                    );
                    crate::gear_v2::lane_decode::tests::FORCE_PORTABLE.set(false);
                    for c in 0..channels {
                        for t in 0..tokens {
                            assert_eq!(cm[c * tokens + t], tm[t * channels + c], "{c} {t}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn indices_match_the_definition_for_every_dtype() {
        check::<2, 8, 8>(RelMap::sign_magnitude(8));
        check::<2, 7, 9>(RelMap::sign_magnitude(9));
        check::<4, 23, 9>(RelMap::sign_magnitude(9));
        check::<1, 0, 8>(RelMap::wrapping(8));
        check::<1, 0, 8>(RelMap::sign_magnitude(8));
    }
}
