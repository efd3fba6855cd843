//! AVX2 + FMA kernels for codes of 2, 3 and 4 bits: eight codes at a time are pulled out
//! of the bit stream with one variable shift, mapped to their values through an 8- or
//! 16-entry table held in registers (`vpermps`, plus a blend on bit 3 for 16 entries), and
//! multiplied into the query (scores) or added into the accumulator (V). Wider codes (5-8
//! bits): one byte shuffle, shift and mask turn 16 code bytes into eight codes, their
//! values fetched with `vgatherdps` from the full table. Sums are in a different order than the portable
//! path (eight lanes, FMA), so results agree to rounding, not bit for bit.

use std::arch::x86_64::*;

/// Whether these kernels handle `bits`.
#[inline(always)]
pub(crate) fn handles(bits: u32) -> bool {
    (2..=4).contains(&bits)
}

/// The `8 * bits` bits holding codes `8j .. 8j + 8` of `codes` (little-endian), in the
/// low bits of the result. `codes` is a row's whole code area (at least 16 bytes).
#[inline(always)]
fn word(codes: &[u8], j: usize, bits: usize) -> u32 {
    let o = j * bits;
    let len = codes.len();
    if o + 4 <= len {
        // SAFETY: bytes `o .. o + 4` are inside `codes` (just checked).
        return unsafe { codes.as_ptr().add(o).cast::<u32>().read_unaligned() };
    }
    if len >= 4 && o + bits <= len {
        // The last bytes: the 4 ending the slice, shifted down to start at `o`.
        // SAFETY: `len - 4 .. len` is inside `codes` (`len >= 4`).
        let w = unsafe { codes.as_ptr().add(len - 4).cast::<u32>().read_unaligned() };
        return w >> (8 * (o + 4 - len));
    }
    let mut w = [0u8; 4];
    for (d, s) in w.iter_mut().zip(codes.iter().skip(o).take(bits)) {
        *d = *s;
    }
    u32::from_le_bytes(w)
}

/// Eight table values for the eight codes in `w`.
///
/// # Safety
/// The CPU must have AVX2 (only called from the `target_feature` functions below).
#[inline(always)]
unsafe fn lookup(
    w: u32,
    shifts: __m256i,
    mask: __m256i,
    lo: __m256,
    hi: __m256,
    bits: u32,
) -> __m256 {
    // SAFETY: register-only AVX2 operations; the caller guarantees AVX2.
    unsafe {
        let idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), mask);
        let a = _mm256_permutevar8x32_ps(lo, idx);
        if bits < 4 {
            return a;
        }
        let b = _mm256_permutevar8x32_ps(hi, idx);
        _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)))
    }
}

/// Shift amounts, code mask and the two table halves.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn setup(bits: u32, table: &[f32; 16]) -> (__m256i, __m256i, __m256, __m256) {
    let b = bits as i32;
    // SAFETY: AVX2 is guaranteed by the caller; `table` has 16 f32, the two unaligned
    // loads read elements 0..8 and 8..16.
    unsafe {
        let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
        let mask = _mm256_set1_epi32((1 << b) - 1);
        let lo = _mm256_loadu_ps(table.as_ptr());
        let hi = _mm256_loadu_ps(table.as_ptr().add(8));
        (shifts, mask, lo, hi)
    }
}

/// Sum of the eight lanes.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only AVX/SSE operations; the caller guarantees AVX2.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

/// `sum_i q[i] * table[code_i]` over `q.len()` codes (a multiple of 8) starting at
/// code `8 * first` of the row's code area `codes`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `bits` in 2..=4.
#[inline(always)]
pub(crate) unsafe fn dot_lut(
    q: &[f32],
    codes: &[u8],
    first: usize,
    bits: u32,
    table: &[f32; 16],
) -> f32 {
    // SAFETY: AVX2 and FMA are guaranteed by the caller; each `qc` is 8 f32, read with
    // an unaligned load; `word` reads `codes` through bounds-checked slices.
    unsafe {
        let (shifts, mask, lo, hi) = setup(bits, table);
        let mut acc = _mm256_setzero_ps();
        for (j, qc) in q.chunks_exact(8).enumerate() {
            let w = word(codes, first + j, bits as usize);
            let vals = lookup(w, shifts, mask, lo, hi, bits);
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qc.as_ptr()), vals, acc);
        }
        hsum(acc)
    }
}

/// `acc[i] += w * table[code_i]` over `acc.len()` codes (a multiple of 8) starting at
/// code `8 * first` of the row's code area `codes`.
///
/// # Safety
/// As [`dot_lut`].
#[inline(always)]
pub(crate) unsafe fn axpy_lut(
    acc: &mut [f32],
    codes: &[u8],
    first: usize,
    bits: u32,
    table: &[f32; 16],
    w: f32,
) {
    // SAFETY: AVX2 and FMA are guaranteed by the caller; each `ac` is 8 f32, loaded and
    // stored in place (unaligned); `word` reads `codes` through bounds-checked slices.
    unsafe {
        let (shifts, mask, lo, hi) = setup(bits, table);
        let wv = _mm256_set1_ps(w);
        for (j, ac) in acc.chunks_exact_mut(8).enumerate() {
            let vals = lookup(
                word(codes, first + j, bits as usize),
                shifts,
                mask,
                lo,
                hi,
                bits,
            );
            let a = _mm256_loadu_ps(ac.as_ptr());
            _mm256_storeu_ps(ac.as_mut_ptr(), _mm256_fmadd_ps(wv, vals, a));
        }
    }
}

/// Byte shuffle (per 32-bit lane: the 4 bytes from the one holding the lane's first
/// bit) and bit shifts that turn 16 code bytes starting at code `8k` into the eight
/// codes `8k .. 8k + 8`, for `bits` 5, 6, 7 (constants, so no per-call setup).
const fn wide_consts(bits: usize) -> ([u8; 32], [i32; 8]) {
    let mut ctrl = [0u8; 32];
    let mut sh = [0i32; 8];
    let mut j = 0;
    while j < 8 {
        let o = bits * j;
        let mut i = 0;
        while i < 4 {
            ctrl[4 * j + i] = (o / 8 + i) as u8;
            i += 1;
        }
        sh[j] = (o % 8) as i32;
        j += 1;
    }
    (ctrl, sh)
}
static WIDE: [([u8; 32], [i32; 8]); 3] = [wide_consts(5), wide_consts(6), wide_consts(7)];

/// The shuffle, shifts and mask of [`wide_consts`] for `bits` 5..=8 (8: unused).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn wide_setup(bits: u32) -> (__m256i, __m256i, __m256i) {
    let (ctrl, sh) = &WIDE[(bits.clamp(5, 7) - 5) as usize];
    // SAFETY: AVX2 guaranteed by the caller; the loads read the 32-byte constants.
    unsafe {
        (
            _mm256_loadu_si256(ctrl.as_ptr().cast()),
            _mm256_loadu_si256(sh.as_ptr().cast()),
            _mm256_set1_epi32((1i32 << bits) - 1),
        )
    }
}

/// A row's packed code area for the 16-byte loads of [`wide_index`]: the last 32
/// bytes again, followed by 16 zero bytes, for the loads that would run past its end.
pub(crate) struct WideCodes<'a> {
    area: &'a [u8],
    tail: [u8; 48],
}

impl<'a> WideCodes<'a> {
    /// The code area of a row of `bits` (5..=8) codes (at least 40 bytes; 8-bit codes
    /// are read in place, no tail).
    #[inline(always)]
    pub(crate) fn new(area: &'a [u8], bits: u32) -> Option<WideCodes<'a>> {
        let n = area.len();
        let mut tail = [0u8; 48];
        let last = area.get(n.checked_sub(32)?..)?;
        if bits < 8 {
            tail[..32].copy_from_slice(last);
        }
        Some(WideCodes { area, tail })
    }
}

/// Codes `8k .. 8k + 8` as dwords.
///
/// # Safety
/// The CPU must have AVX2; codes `8k .. 8k + 8` are inside the area; `bits` 5..=8 and
/// the constants of [`wide_setup`] for it.
#[inline(always)]
unsafe fn wide_index(
    codes: &WideCodes,
    k: usize,
    bits: u32,
    (ctrl, sh, mask): (__m256i, __m256i, __m256i),
) -> __m256i {
    let len = codes.area.len();
    // SAFETY: 8 bits: bytes `8k .. 8k + 8` are the codes, inside the area. Else the
    // 16 bytes at `o = k * bits` come from the area when `o + 16 <= len`, and
    // otherwise from `tail` at `o - (len - 32)`: `o > len - 16` makes that at least
    // 16 and `o + bits <= len` at most 32 - bits, so the 16 bytes stay in its 48.
    unsafe {
        if bits == 8 {
            let p = codes.area.as_ptr().add(8 * k);
            return _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
        }
        let o = k * bits as usize;
        let p = if o + 16 <= len {
            codes.area.as_ptr().add(o)
        } else {
            codes.tail.as_ptr().add(o + 32 - len)
        };
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, ctrl), sh), mask)
    }
}

/// `sum_i q[i] * table[code_i]` over `q.len()` codes (a multiple of 8) of `bits` 5..=8
/// starting at code `8 * first` of the packed code area `codes`, values fetched with
/// `vgatherdps`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; the codes read are inside the area; `table` has
/// `2^bits` entries.
#[inline(always)]
pub(crate) unsafe fn dot_gather(
    q: &[f32],
    codes: &WideCodes,
    first: usize,
    bits: u32,
    table: &[f32],
) -> f32 {
    // SAFETY: AVX2 and FMA are guaranteed by the caller; each `qc` is 8 f32; the code
    // reads stay inside `codes` (caller); every gathered index is a `bits`-bit code
    // (masked), inside `table`.
    unsafe {
        let setup = wide_setup(bits);
        let mut acc = _mm256_setzero_ps();
        for (j, qc) in q.chunks_exact(8).enumerate() {
            let idx = wide_index(codes, first + j, bits, setup);
            let vals = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qc.as_ptr()), vals, acc);
        }
        hsum(acc)
    }
}

/// `acc[i] += w * table[code_i]` over `acc.len()` codes (a multiple of 8), as
/// [`dot_gather`] reads them.
///
/// # Safety
/// As [`dot_gather`].
#[inline(always)]
pub(crate) unsafe fn axpy_gather(
    acc: &mut [f32],
    codes: &WideCodes,
    first: usize,
    bits: u32,
    table: &[f32],
    w: f32,
) {
    // SAFETY: as in `dot_gather`; each `ac` is 8 f32, loaded and stored in place.
    unsafe {
        let setup = wide_setup(bits);
        let wv = _mm256_set1_ps(w);
        for (j, ac) in acc.chunks_exact_mut(8).enumerate() {
            let idx = wide_index(codes, first + j, bits, setup);
            let vals = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
            let a = _mm256_loadu_ps(ac.as_ptr());
            _mm256_storeu_ps(ac.as_mut_ptr(), _mm256_fmadd_ps(wv, vals, a));
        }
    }
}
