//! Merging the raw low bits of a coded chunk into the decoded values.
//!
//! f16 keeps whole low bytes: they are spread into the even bytes of the output before the
//! lanes store the top bytes. bf16 and f32 keep packed low bits (7 and 23 per value): they
//! are ORed into the values after the lanes wrote the top fields. The bf16 and f16 paths
//! have an AVX2 version chosen at run time (`is_x86_feature_detected!`); the portable
//! version is the reference, and the tests compare the two.

// The transposes index several arrays with one channel index; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use super::shared::{from_rel, RelMap};
use super::values::load;

/// Writes the low byte of every f16 value: `out[2 * i] = rest[i]`, `out[2 * i + 1] = 0`
/// (the top byte is stored after). Other splits with whole low bytes have none (i8).
pub(crate) fn spread_low_bytes<const BPV: usize, const REST: u32>(rest: &[u8], out: &mut [u8]) {
    if !(REST == 8 && BPV == 2) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { spread_low_bytes_avx2(rest, out) };
        return;
    }
    spread_low_bytes_portable(rest, out);
}

/// Portable [`spread_low_bytes`] for f16.
pub(crate) fn spread_low_bytes_portable(rest: &[u8], out: &mut [u8]) {
    for (o, &l) in out.chunks_exact_mut(2).zip(rest) {
        o[0] = l;
        o[1] = 0;
    }
}

/// AVX2 [`spread_low_bytes`] for f16: 32 low bytes become 64 output bytes per step.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn spread_low_bytes_avx2(rest: &[u8], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = rest.len().min(out.len() / 2);
    let blocks = n / 32;
    let zero = _mm256_setzero_si256();
    for i in 0..blocks {
        // SAFETY: i * 32 + 32 <= n <= rest.len() and i * 64 + 64 <= 2 * n <= out.len(), so
        // every load and store stays inside its slice; loads/stores are unaligned.
        unsafe {
            let l = _mm256_loadu_si256(rest.as_ptr().add(i * 32) as *const __m256i);
            // Lanes: [0..16 | 16..32]; unpack interleaves within each 128-bit half.
            let lo = _mm256_unpacklo_epi8(l, zero); // values 0..8, 16..24
            let hi = _mm256_unpackhi_epi8(l, zero); // values 8..16, 24..32
            let a = _mm256_permute2x128_si256(lo, hi, 0x20); // values 0..16
            let b = _mm256_permute2x128_si256(lo, hi, 0x31); // values 16..32
            let o = out.as_mut_ptr().add(i * 64);
            _mm256_storeu_si256(o as *mut __m256i, a);
            _mm256_storeu_si256(o.add(32) as *mut __m256i, b);
        }
    }
    let done = blocks * 32;
    spread_low_bytes_portable(&rest[done..n], &mut out[2 * done..2 * n]);
}

/// Writes f16 values token-major from the channel-major relative top bytes `syms` (channel
/// `c`'s `tokens` bytes at `c * stride`, mapped back with `from_rel(_, locs[c], 8)` on the
/// way) and the token-major low bytes `rest`.
pub(crate) fn interleave_f16(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    rest: &[u8],
    tokens: usize,
    out: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && !force_portable() {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { interleave_f16_avx2(syms, stride, locs, rest, tokens, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse2") && !force_portable() {
        // SAFETY: the CPU supports SSE2, checked just above.
        unsafe { interleave_f16_sse2(syms, stride, locs, rest, tokens, out, 0) };
        return;
    }
    interleave_f16_portable(syms, stride, locs, rest, tokens, out, 0, 0);
}

/// Whether a test asked this thread for the portable versions of the SIMD loops.
#[cfg(test)]
pub(crate) fn force_portable() -> bool {
    super::lane_decode::force_portable()
}
/// Never outside tests.
#[cfg(not(test))]
pub(crate) fn force_portable() -> bool {
    false
}

/// Portable [`interleave_f16`] for the channels from `c_from` and, below `c_from`, the
/// tokens from `t_from` (what the SIMD version's whole blocks left).
#[allow(clippy::too_many_arguments)]
pub(crate) fn interleave_f16_portable(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    rest: &[u8],
    tokens: usize,
    out: &mut [u8],
    c_from: usize,
    t_from: usize,
) {
    let channels = locs.len();
    // Tokens per block: the block's columns of `syms` stay in L1 while its rows are written.
    const BLOCK: usize = 16;
    let mut t0 = 0;
    while t0 < tokens {
        let t1 = (t0 + BLOCK).min(tokens);
        for c in 0..channels {
            let from = if c < c_from { t_from.max(t0) } else { t0 };
            for t in from..t1 {
                let at = t * channels + c;
                out[2 * at] = rest[at];
                out[2 * at + 1] = from_rel(syms[c * stride + t] as u32, locs[c] as u32, 8) as u8;
            }
        }
        t0 = t1;
    }
}

/// AVX2 [`interleave_f16`]: blocks of 16 channels x 32 tokens are transposed in registers
/// (four rounds of byte unpacking within each 128-bit lane: lane 0 holds tokens `t0..t0 +
/// 16`, lane 1 the next 16) and interleaved with the low bytes; the tokens past the last
/// whole block of 32 are left to the SSE2 version.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn interleave_f16_avx2(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    rest: &[u8],
    tokens: usize,
    out: &mut [u8],
) {
    use std::arch::x86_64::*;
    let channels = locs.len();
    let cb = channels / 16 * 16;
    let tb = tokens / 32 * 32;
    let n = channels * tokens;
    assert!(syms.len() >= channels.saturating_sub(1) * stride + tokens);
    assert!(rest.len() >= n && out.len() >= 2 * n);
    let mut t0 = 0;
    while t0 < tb {
        let mut c0 = 0;
        while c0 < cb {
            // SAFETY: AVX2 is enabled on this function. Rows c0..c0 + 16 of `syms` hold bytes
            // t0..t0 + 32 (t0 + 32 <= tokens, c0 + 16 <= channels, checked against syms'
            // length above); the low bytes and output of tokens t0..t0 + 32, channels c0..c0 +
            // 16 lie inside `rest` and `out` (n values, checked above). All loads and stores
            // are unaligned.
            unsafe {
                let r = map_transpose_16x32(&syms[c0 * stride..], stride, &locs[c0..c0 + 16], t0);
                for (j, &top) in r.iter().enumerate() {
                    let a = (t0 + j) * channels + c0;
                    let b = a + 16 * channels;
                    let low = _mm256_inserti128_si256::<1>(
                        _mm256_castsi128_si256(_mm_loadu_si128(
                            rest.as_ptr().add(a) as *const __m128i
                        )),
                        _mm_loadu_si128(rest.as_ptr().add(b) as *const __m128i),
                    );
                    let lo = _mm256_unpacklo_epi8(low, top);
                    let hi = _mm256_unpackhi_epi8(low, top);
                    let o = out.as_mut_ptr();
                    _mm256_storeu_si256(
                        o.add(2 * a) as *mut __m256i,
                        _mm256_permute2x128_si256::<0x20>(lo, hi),
                    );
                    _mm256_storeu_si256(
                        o.add(2 * b) as *mut __m256i,
                        _mm256_permute2x128_si256::<0x31>(lo, hi),
                    );
                }
            }
            c0 += 16;
        }
        t0 += 32;
    }
    // SAFETY: AVX2 implies SSE2.
    unsafe { interleave_f16_sse2(syms, stride, locs, rest, tokens, out, tb) };
}

/// [`map_transpose_16x16`] for 32 tokens in AVX2 registers (sign-magnitude map, f16): the
/// unpacking works within each 128-bit lane, so register `j`'s lane `l` holds token `t0 + 16
/// * l + j` of the 16 channels.
///
/// # Safety
/// The CPU must support AVX2; `syms` must hold bytes `t0..t0 + 32` of rows `0..16` at `i *
/// stride`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn map_transpose_16x32(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    t0: usize,
) -> [std::arch::x86_64::__m256i; 16] {
    use std::arch::x86_64::*;
    debug_assert!(locs.len() == 16 && syms.len() >= 15 * stride + t0 + 32);
    // SAFETY: AVX2 is enabled on this function; the loads read bytes t0..t0 + 32 of rows
    // 0..16, inside `syms` by the caller's contract. All loads are unaligned.
    unsafe {
        let mut r = [_mm256_setzero_si256(); 16];
        let sign = _mm256_set1_epi8(0x80u8 as i8);
        for (i, reg) in r.iter_mut().enumerate() {
            let x = _mm256_loadu_si256(syms.as_ptr().add(i * stride + t0) as *const __m256i);
            // The low bits by a byte add, the sign bit by a xor.
            let loc = _mm256_set1_epi8(locs[i] as i8);
            let t = _mm256_add_epi8(x, loc);
            let s = _mm256_and_si256(_mm256_xor_si256(x, loc), sign);
            *reg = _mm256_or_si256(_mm256_andnot_si256(sign, t), s);
        }
        for _ in 0..4 {
            let mut x = [_mm256_setzero_si256(); 16];
            for i in 0..8 {
                x[2 * i] = _mm256_unpacklo_epi8(r[i], r[i + 8]);
                x[2 * i + 1] = _mm256_unpackhi_epi8(r[i], r[i + 8]);
            }
            r = x;
        }
        r
    }
}

/// SSE2 [`interleave_f16`] for the tokens from `t_from` (a multiple of 16; the channels
/// before the last whole block of 16 and the tokens before `t_from` are done already): blocks
/// of 16 channels x 16 tokens are transposed in registers (four rounds of byte unpacking) and
/// interleaved with the low bytes.
///
/// # Safety
/// The CPU must support SSE2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
pub(crate) unsafe fn interleave_f16_sse2(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    rest: &[u8],
    tokens: usize,
    out: &mut [u8],
    t_from: usize,
) {
    use std::arch::x86_64::*;
    let channels = locs.len();
    let cb = channels / 16 * 16;
    let tb = tokens / 16 * 16;
    let n = channels * tokens;
    assert!(syms.len() >= channels.saturating_sub(1) * stride + tokens);
    assert!(rest.len() >= n && out.len() >= 2 * n);
    let mut t0 = t_from;
    while t0 < tb {
        let mut c0 = 0;
        while c0 < cb {
            // SAFETY: rows c0..c0 + 16 of `syms` hold bytes t0..t0 + 16 (t0 + 16 <= tokens,
            // c0 + 16 <= channels, checked against syms' length above); the low bytes and
            // output of tokens t0..t0 + 16, channels c0..c0 + 16 lie inside `rest` and `out`
            // (n values, checked above). All loads and stores are unaligned.
            unsafe {
                let r =
                    map_transpose_16x16(&syms[c0 * stride..], stride, &locs[c0..c0 + 16], t0, 0x80);
                for (j, &top) in r.iter().enumerate() {
                    let at = (t0 + j) * channels + c0;
                    let low = _mm_loadu_si128(rest.as_ptr().add(at) as *const __m128i);
                    let o = out.as_mut_ptr().add(2 * at);
                    _mm_storeu_si128(o as *mut __m128i, _mm_unpacklo_epi8(low, top));
                    _mm_storeu_si128(o.add(16) as *mut __m128i, _mm_unpackhi_epi8(low, top));
                }
            }
            c0 += 16;
        }
        t0 += 16;
    }
    // What the whole blocks left: channels from cb, and tokens from tb of the others.
    interleave_f16_portable(syms, stride, locs, rest, tokens, out, cb, tb);
}

/// Loads 16 tokens (from `t0`) of the 16 channels `locs` names (channel `i`'s bytes at
/// `syms[i * stride..]`), maps them back from relative symbols and transposes them: register
/// `j` holds token `t0 + j` of the 16 channels. The map is `((r ^ loc) & sign) | ((r + loc)
/// & !sign)` per byte: `sign` 0x80 for the sign-magnitude map of 8-bit fields
/// ([`from_rel`]), 0 for the wrapping map.
///
/// # Safety
/// `syms` must hold bytes `t0..t0 + 16` of rows `0..16` at `i * stride`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn map_transpose_16x16(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    t0: usize,
    sign: u8,
) -> [std::arch::x86_64::__m128i; 16] {
    use std::arch::x86_64::*;
    debug_assert!(locs.len() == 16 && syms.len() >= 15 * stride + t0 + 16);
    // SAFETY: SSE2 is part of x86-64; the loads read bytes t0..t0 + 16 of rows 0..16, inside
    // `syms` by the caller's contract. All loads are unaligned.
    unsafe {
        let mut r = [_mm_setzero_si128(); 16];
        let sign = _mm_set1_epi8(sign as i8);
        for (i, reg) in r.iter_mut().enumerate() {
            let x = _mm_loadu_si128(syms.as_ptr().add(i * stride + t0) as *const __m128i);
            // The low bits by a byte add, the sign bit (if any) by a xor.
            let loc = _mm_set1_epi8(locs[i] as i8);
            let t = _mm_add_epi8(x, loc);
            let s = _mm_and_si128(_mm_xor_si128(x, loc), sign);
            *reg = _mm_or_si128(_mm_andnot_si128(sign, t), s);
        }
        // Each round rotates the (register, byte) index bits left by one; after four,
        // register = token and byte = channel.
        for _ in 0..4 {
            let mut x = [_mm_setzero_si128(); 16];
            for i in 0..8 {
                x[2 * i] = _mm_unpacklo_epi8(r[i], r[i + 8]);
                x[2 * i + 1] = _mm_unpackhi_epi8(r[i], r[i + 8]);
            }
            r = x;
        }
        r
    }
}

/// Writes int8 codes token-major from the channel-major relative symbols `syms` (channel
/// `c`'s `tokens` bytes at `c * stride`), mapped back with the wrapping map (`wrapping`) or
/// the sign-magnitude one.
pub(crate) fn transpose_u8(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    wrapping: bool,
    tokens: usize,
    out: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if !force_portable() {
        // SAFETY: SSE2 is part of x86-64.
        unsafe { transpose_u8_sse2(syms, stride, locs, wrapping, tokens, out) };
        return;
    }
    transpose_u8_portable(syms, stride, locs, wrapping, tokens, out, 0, 0);
}

/// Portable [`transpose_u8`] for the channels from `c_from` and, below `c_from`, the tokens
/// from `t_from`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn transpose_u8_portable(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    wrapping: bool,
    tokens: usize,
    out: &mut [u8],
    c_from: usize,
    t_from: usize,
) {
    let map = if wrapping {
        RelMap::wrapping(8)
    } else {
        RelMap::sign_magnitude(8)
    };
    let channels = locs.len();
    const BLOCK: usize = 16;
    let mut t0 = 0;
    while t0 < tokens {
        let t1 = (t0 + BLOCK).min(tokens);
        for c in 0..channels {
            let from = if c < c_from { t_from.max(t0) } else { t0 };
            for t in from..t1 {
                out[t * channels + c] =
                    map.absolute(syms[c * stride + t] as u32, locs[c] as u32) as u8;
            }
        }
        t0 = t1;
    }
}

/// SSE2 [`transpose_u8`]: blocks of 16 channels x 16 tokens transposed in registers.
///
/// # Safety
/// The CPU must support SSE2 (every x86-64 does).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn transpose_u8_sse2(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    wrapping: bool,
    tokens: usize,
    out: &mut [u8],
) {
    use std::arch::x86_64::*;
    let channels = locs.len();
    let cb = channels / 16 * 16;
    let tb = tokens / 16 * 16;
    assert!(syms.len() >= channels.saturating_sub(1) * stride + tokens);
    assert!(out.len() >= channels * tokens);
    let sign = if wrapping { 0 } else { 0x80 };
    for t0 in (0..tb).step_by(16) {
        for c0 in (0..cb).step_by(16) {
            // SAFETY: rows c0..c0 + 16 of `syms` hold bytes t0..t0 + 16 (checked against
            // syms' length above); tokens t0..t0 + 16 of channels c0..c0 + 16 lie inside
            // `out` (checked above). Unaligned stores.
            unsafe {
                let r =
                    map_transpose_16x16(&syms[c0 * stride..], stride, &locs[c0..c0 + 16], t0, sign);
                for (j, &row) in r.iter().enumerate() {
                    let o = out.as_mut_ptr().add((t0 + j) * channels + c0);
                    _mm_storeu_si128(o as *mut __m128i, row);
                }
            }
        }
    }
    transpose_u8_portable(syms, stride, locs, wrapping, tokens, out, cb, tb);
}

/// Writes `from_rel(sym, locs[c], 9) << shift` for every 16-bit value token-major from the
/// channel-major 9-bit relative top fields `syms` (channel `c`'s `tokens` values at element
/// `c * stride`).
pub(crate) fn transpose_u16(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    shift: u32,
    tokens: usize,
    out: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse2") && !force_portable() {
        // SAFETY: the CPU supports SSE2, checked just above.
        unsafe { transpose_u16_sse2(syms, stride, locs, shift, tokens, out) };
        return;
    }
    transpose_u16_portable(syms, stride, locs, shift, tokens, out, 0, 0);
}

/// Portable [`transpose_u16`] for the channels from `c_from` and, below it, the tokens from
/// `t_from`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn transpose_u16_portable(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    shift: u32,
    tokens: usize,
    out: &mut [u8],
    c_from: usize,
    t_from: usize,
) {
    let channels = locs.len();
    const BLOCK: usize = 16;
    let mut t0 = 0;
    while t0 < tokens {
        let t1 = (t0 + BLOCK).min(tokens);
        for c in 0..channels {
            let from = if c < c_from { t_from.max(t0) } else { t0 };
            for t in from..t1 {
                let i = 2 * (c * stride + t);
                let r = u16::from_le_bytes([syms[i], syms[i + 1]]) as u32;
                let v = (from_rel(r, locs[c] as u32, 9) as u16) << shift;
                let at = 2 * (t * channels + c);
                out[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        t0 = t1;
    }
}

/// SSE2 [`transpose_u16`]: blocks of 8 channels x 8 tokens, three rounds of unpacking.
///
/// # Safety
/// The CPU must support SSE2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
pub(crate) unsafe fn transpose_u16_sse2(
    syms: &[u8],
    stride: usize,
    locs: &[u16],
    shift: u32,
    tokens: usize,
    out: &mut [u8],
) {
    use std::arch::x86_64::*;
    let channels = locs.len();
    let cb = channels / 8 * 8;
    let tb = tokens / 8 * 8;
    assert!(syms.len() >= 2 * (channels.saturating_sub(1) * stride + tokens));
    assert!(out.len() >= 2 * channels * tokens);
    let count = _mm_cvtsi32_si128(shift as i32);
    let mut t0 = 0;
    while t0 < tb {
        let mut c0 = 0;
        while c0 < cb {
            // SAFETY: rows c0..c0 + 8 hold values t0..t0 + 8 (bounds checked above against
            // the slices' lengths); the output values of tokens t0..t0 + 8, channels
            // c0..c0 + 8 lie inside `out`. All loads and stores are unaligned.
            unsafe {
                let mut r = [_mm_setzero_si128(); 8];
                let sign = _mm_set1_epi16(0x100);
                let low = _mm_set1_epi16(0xff);
                for (i, reg) in r.iter_mut().enumerate() {
                    let x = _mm_loadu_si128(
                        syms.as_ptr().add(2 * ((c0 + i) * stride + t0)) as *const __m128i
                    );
                    // from_rel for 9-bit fields: the low 8 bits by an add, bit 8 by a xor.
                    let loc = _mm_set1_epi16(locs[c0 + i] as i16);
                    let t = _mm_and_si128(_mm_add_epi16(x, loc), low);
                    let s = _mm_and_si128(_mm_xor_si128(x, loc), sign);
                    *reg = _mm_or_si128(t, s);
                }
                for _ in 0..3 {
                    let mut x = [_mm_setzero_si128(); 8];
                    for i in 0..4 {
                        x[2 * i] = _mm_unpacklo_epi16(r[i], r[i + 4]);
                        x[2 * i + 1] = _mm_unpackhi_epi16(r[i], r[i + 4]);
                    }
                    r = x;
                }
                for (j, &v) in r.iter().enumerate() {
                    let at = 2 * ((t0 + j) * channels + c0);
                    _mm_storeu_si128(
                        out.as_mut_ptr().add(at) as *mut __m128i,
                        _mm_sll_epi16(v, count),
                    );
                }
            }
            c0 += 8;
        }
        t0 += 8;
    }
    transpose_u16_portable(syms, stride, locs, shift, tokens, out, cb, tb);
}

/// The encoder's side of [`spread_low_bytes`]: `low[i] = raw[2 * i]` (f16 low bytes).
pub(crate) fn split_low_bytes(raw: &[u8], low: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { split_low_bytes_avx2(raw, low) };
        return;
    }
    split_low_bytes_portable(raw, low);
}

/// Portable [`split_low_bytes`].
pub(crate) fn split_low_bytes_portable(raw: &[u8], low: &mut [u8]) {
    for (d, s) in low.iter_mut().zip(raw.chunks_exact(2)) {
        *d = s[0];
    }
}

/// AVX2 [`split_low_bytes`]: 64 input bytes become 32 low bytes per step.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn split_low_bytes_avx2(raw: &[u8], low: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = low.len().min(raw.len() / 2);
    let blocks = n / 32;
    let even = _mm256_set1_epi16(0xff);
    for i in 0..blocks {
        // SAFETY: i * 64 + 64 <= 2 * n <= raw.len() and i * 32 + 32 <= n <= low.len(), so
        // every load and store stays inside its slice; all unaligned.
        unsafe {
            let p = raw.as_ptr().add(i * 64);
            let a = _mm256_and_si256(_mm256_loadu_si256(p as *const __m256i), even);
            let b = _mm256_and_si256(_mm256_loadu_si256(p.add(32) as *const __m256i), even);
            // packus works per 128-bit half: [a0 b0 a1 b1] in 64-bit units; reorder.
            let packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0b11_01_10_00);
            _mm256_storeu_si256(low.as_mut_ptr().add(i * 32) as *mut __m256i, packed);
        }
    }
    let done = blocks * 32;
    split_low_bytes_portable(&raw[2 * done..2 * n], &mut low[done..n]);
}

/// ORs the packed low bits (`REST` bits per element, LSB-first) into the elements of `out`.
pub(crate) fn merge_low_bits<const BPV: usize, const REST: u32>(rest: &[u8], out: &mut [u8]) {
    let mut done = 0;
    if BPV == 2 && REST == 7 {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            done = unsafe { merge_bf16_avx2(rest, out) };
        }
        done += merge_bf16_portable(&rest[done / 8 * 7..], &mut out[done * 2..]);
    }
    merge_low_bits_generic::<BPV, REST>(rest, out, done);
}

/// ORs packed 7-bit fields into bf16 values, eight values per 7 bytes, as long as whole
/// groups of eight are available; returns the values done.
pub(crate) fn merge_bf16_portable(rest: &[u8], out: &mut [u8]) -> usize {
    let mut done = 0;
    for (o, r) in out.chunks_exact_mut(16).zip(rest.chunks_exact(7)) {
        let mut a = [0u8; 8];
        a[..7].copy_from_slice(r);
        let w = u64::from_le_bytes(a);
        for i in 0..8 {
            let v = u16::from_le_bytes([o[2 * i], o[2 * i + 1]]) | ((w >> (7 * i)) & 0x7f) as u16;
            o[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
        done += 8;
    }
    done
}

/// AVX2 version of [`merge_bf16_portable`]: sixteen values (14 packed bytes) per step, as
/// long as 16 bytes can be loaded; returns the values done (a multiple of 16).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn merge_bf16_avx2(rest: &[u8], out: &mut [u8]) -> usize {
    use std::arch::x86_64::*;
    // Value i (0..16) has its bits at [7i, 7i + 7) of the 14 bytes. Its 16-bit lane takes
    // the bytes p, p + 1 with p = ceil(7i / 8) - 1 (byte -1 reads as zero), so that the
    // field starts at bit s = 7i - 8p in 1..=8 of the lane; a high multiply by 2^(16 - s)
    // shifts it down by s.
    let mut shuf = [0i8; 32];
    let mut mul = [0i16; 16];
    for i in 0..16 {
        // Both 128-bit halves use the pattern of values 0..8 (the upper half's source is
        // shifted by 7 bytes, below).
        let j = (i % 8) as i32;
        let p = (7 * j + 7) / 8 - 1;
        let s = 7 * j - 8 * p;
        shuf[2 * i] = if p < 0 { -1 } else { p as i8 };
        shuf[2 * i + 1] = (p + 1) as i8;
        mul[i] = (1i32 << (16 - s)) as u16 as i16;
    }
    // SAFETY: the loads read 16 bytes at 14 * step while that stays within `rest`, and the
    // loads/stores of `out` cover 32 bytes at 32 * step while that stays within `out` (the
    // loop condition); all are unaligned loads/stores; AVX2 is enabled by the caller.
    unsafe {
        let shuf = _mm256_loadu_si256(shuf.as_ptr() as *const __m256i);
        let mul = _mm256_loadu_si256(mul.as_ptr() as *const __m256i);
        let low7 = _mm256_set1_epi16(0x7f);
        let mut step = 0;
        while 14 * step + 16 <= rest.len() && 32 * step + 32 <= out.len() {
            let r = _mm_loadu_si128(rest.as_ptr().add(14 * step) as *const __m128i);
            // Values 0..8 come from bytes 0..7, values 8..16 from bytes 7..14: the upper
            // half sees the source shifted by 7 bytes, so one shuffle pattern serves both.
            let r2 = _mm_srli_si128(r, 7);
            let src = _mm256_set_m128i(r2, r);
            let x = _mm256_shuffle_epi8(src, shuf);
            let v = _mm256_and_si256(_mm256_mulhi_epu16(x, mul), low7);
            let o = out.as_mut_ptr().add(32 * step) as *mut __m256i;
            _mm256_storeu_si256(o, _mm256_or_si256(_mm256_loadu_si256(o), v));
            step += 1;
        }
        step * 16
    }
}

/// ORs the low bits of elements `done..` in, one at a time.
fn merge_low_bits_generic<const BPV: usize, const REST: u32>(
    rest: &[u8],
    out: &mut [u8],
    done: usize,
) {
    let mask = (1u64 << REST) - 1;
    let values = out.len() / BPV;
    for j in done..values {
        let v = load::<BPV>(out, j) as u64 | (read_bits(rest, j * REST as usize) & mask);
        out[j * BPV..j * BPV + BPV].copy_from_slice(&(v as u32).to_le_bytes()[..BPV]);
    }
}

/// Reads 64 bits at bit offset `bit` of `data` (LSB-first), bytes past the end as zero.
fn read_bits(data: &[u8], bit: usize) -> u64 {
    let b = bit >> 3;
    let mut a = [0u8; 8];
    let tail = data.get(b..).unwrap_or(&[]);
    let n = tail.len().min(8);
    a[..n].copy_from_slice(&tail[..n]);
    u64::from_le_bytes(a) >> (bit & 7)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut rng = crate::gear_v2::test_rng::XorShift64(seed | 1);
        (0..n).map(|_| (rng.next() >> 24) as u8).collect()
    }

    #[test]
    fn f16_spread_simd_matches_portable() {
        for values in [0usize, 1, 31, 32, 33, 64, 100, 1000] {
            let rest = noise(values, values as u64 + 1);
            let mut a = noise(2 * values, 7);
            let mut b = a.clone();
            spread_low_bytes_portable(&rest, &mut a);
            spread_low_bytes::<2, 8>(&rest, &mut b);
            assert_eq!(a, b, "{values} values");
            for i in 0..values {
                assert_eq!((a[2 * i], a[2 * i + 1]), (rest[i], 0));
            }
        }
    }

    #[test]
    fn transposes_match_portable() {
        for (channels, tokens) in [
            (1usize, 1usize),
            (16, 16),
            (17, 33),
            (40, 8),
            (32, 64),
            (48, 100),
            (192, 50),
        ] {
            let stride = tokens + 2;
            let syms = noise(2 * channels * stride, 3);
            let rest = noise(channels * tokens, 4);
            let locs: Vec<u16> = noise(2 * channels, 9)
                .chunks(2)
                .map(|p| u16::from_le_bytes([p[0], p[1]]))
                .collect();
            let loc8: Vec<u16> = locs.iter().map(|&l| l & 0xff).collect();
            let mut a = vec![0u8; 2 * channels * tokens];
            let mut b = a.clone();
            interleave_f16_portable(&syms, stride, &loc8, &rest, tokens, &mut a, 0, 0);
            interleave_f16(&syms, stride, &loc8, &rest, tokens, &mut b);
            assert_eq!(a, b, "{channels}x{tokens}");
            #[cfg(target_arch = "x86_64")]
            {
                // The SSE2 version on its own (the AVX2 one only calls it for its tail).
                b.fill(0);
                // SAFETY: SSE2 is part of x86-64.
                unsafe { interleave_f16_sse2(&syms, stride, &loc8, &rest, tokens, &mut b, 0) };
                assert_eq!(a, b, "{channels}x{tokens} SSE2");
            }
            for t in 0..tokens {
                for c in 0..channels {
                    let at = t * channels + c;
                    assert_eq!(a[2 * at], rest[at]);
                    let s = from_rel(syms[c * stride + t] as u32, loc8[c] as u32, 8);
                    assert_eq!(a[2 * at + 1] as u32, s);
                }
            }
            // int8 codes, both maps.
            for wrapping in [false, true] {
                let mut a = vec![0u8; channels * tokens];
                let mut b = a.clone();
                transpose_u8_portable(&syms, stride, &loc8, wrapping, tokens, &mut a, 0, 0);
                transpose_u8(&syms, stride, &loc8, wrapping, tokens, &mut b);
                assert_eq!(a, b, "{channels}x{tokens} int8");
                let map = if wrapping {
                    RelMap::wrapping(8)
                } else {
                    RelMap::sign_magnitude(8)
                };
                for t in 0..tokens {
                    for c in 0..channels {
                        let s = map.absolute(syms[c * stride + t] as u32, loc8[c] as u32);
                        assert_eq!(a[t * channels + c] as u32, s);
                    }
                }
            }
            // 9-bit relative fields, as the decoder leaves them.
            let syms: Vec<u8> = syms
                .chunks(2)
                .flat_map(|p| (u16::from_le_bytes([p[0], p[1]]) & 0x1ff).to_le_bytes())
                .collect();
            let loc9: Vec<u16> = locs.iter().map(|&l| l & 0x1ff).collect();
            let mut a = vec![0u8; 2 * channels * tokens];
            let mut b = a.clone();
            transpose_u16_portable(&syms, stride, &loc9, 7, tokens, &mut a, 0, 0);
            transpose_u16(&syms, stride, &loc9, 7, tokens, &mut b);
            assert_eq!(a, b, "{channels}x{tokens}");
            for t in 0..tokens {
                for c in 0..channels {
                    let i = 2 * (c * stride + t);
                    let r = u16::from_le_bytes([syms[i], syms[i + 1]]) as u32;
                    let v = (from_rel(r, loc9[c] as u32, 9) as u16) << 7;
                    let at = 2 * (t * channels + c);
                    assert_eq!(u16::from_le_bytes([a[at], a[at + 1]]), v);
                }
            }
        }
    }

    #[test]
    fn f16_split_simd_matches_portable() {
        for values in [0usize, 1, 31, 32, 33, 64, 100, 1000] {
            let raw = noise(2 * values, values as u64 + 5);
            let mut a = vec![0u8; values];
            let mut b = vec![1u8; values];
            split_low_bytes_portable(&raw, &mut a);
            split_low_bytes(&raw, &mut b);
            assert_eq!(a, b, "{values} values");
            let mut back = vec![0u8; 2 * values];
            spread_low_bytes::<2, 8>(&a, &mut back);
            for i in 0..values {
                assert_eq!(back[2 * i], raw[2 * i]);
            }
        }
    }

    #[test]
    fn bf16_merge_simd_matches_portable_and_generic() {
        for values in [0usize, 1, 7, 8, 15, 16, 17, 31, 32, 48, 100, 1001] {
            let rest = noise((values * 7).div_ceil(8), values as u64 + 3);
            // Top fields only (low 7 bits clear), as the lanes leave them.
            let tops: Vec<u8> = noise(2 * values, 11)
                .chunks(2)
                .flat_map(|p| (u16::from_le_bytes([p[0], p[1]]) & !0x7f).to_le_bytes())
                .collect();
            let mut generic = tops.clone();
            merge_low_bits_generic::<2, 7>(&rest, &mut generic, 0);
            let mut best = tops.clone();
            merge_low_bits::<2, 7>(&rest, &mut best);
            assert_eq!(best, generic, "{values} values");
            let mut portable = tops.clone();
            let done = merge_bf16_portable(&rest, &mut portable);
            merge_low_bits_generic::<2, 7>(&rest, &mut portable, done);
            assert_eq!(portable, generic, "{values} values");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                let mut simd = tops.clone();
                // SAFETY: AVX2 checked just above.
                let done = unsafe { merge_bf16_avx2(&rest, &mut simd) };
                assert_eq!(done % 16, 0);
                merge_low_bits_generic::<2, 7>(&rest, &mut simd, done);
                assert_eq!(simd, generic, "{values} values");
            }
        }
    }
}
