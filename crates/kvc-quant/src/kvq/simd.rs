//! AVX2 + FMA kernels for codes of 2, 3 and 4 bits: eight codes at a time are pulled out
//! of the bit stream with one variable shift, mapped to their values through an 8- or
//! 16-entry table held in registers (`vpermps`, plus a blend on bit 3 for 16 entries), and
//! multiplied into the query (scores) or added into the accumulator (V). Wider codes (5-8
//! bits) are unpacked to bytes and their values fetched with `vgatherdps` from the full
//! table. Sums are in a different order than the portable
//! path (eight lanes, FMA), so results agree to rounding, not bit for bit.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// Whether these kernels handle `bits`.
    #[inline(always)]
    pub(crate) fn handles(bits: u32) -> bool {
        (2..=4).contains(&bits)
    }

    /// The `8 * bits` bits holding codes `8j .. 8j + 8` (little-endian).
    #[inline(always)]
    fn word(codes: &[u8], j: usize, bits: usize) -> u32 {
        let o = j * bits;
        // Bits above `8 * bits` belong to later codes; the lanes' shifts and mask never
        // reach them, so a whole 4-byte load is fine where the slice has the bytes.
        if let Some(b) = codes.get(o..o + 4) {
            return u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        let mut w = [0u8; 4];
        for (d, s) in w.iter_mut().zip(&codes[o..o + bits]) {
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
            let idx =
                _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), mask);
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

    /// `sum_i q[i] * table[code_i]` over `q.len()` codes (a multiple of 8) at the start of
    /// `codes` (at least `q.len() * bits / 8` bytes).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `bits` in 2..=4; the lengths as stated.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot_lut(q: &[f32], codes: &[u8], bits: u32, table: &[f32; 16]) -> f32 {
        // SAFETY: AVX2 and FMA are guaranteed by the caller; each `qc` is 8 f32, read with
        // an unaligned load; `word` reads `codes` through bounds-checked slices.
        unsafe {
            let (shifts, mask, lo, hi) = setup(bits, table);
            let mut acc = _mm256_setzero_ps();
            for (j, qc) in q.chunks_exact(8).enumerate() {
                let vals = lookup(word(codes, j, bits as usize), shifts, mask, lo, hi, bits);
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qc.as_ptr()), vals, acc);
            }
            hsum(acc)
        }
    }

    /// `acc[i] += w * table[code_i]` over `acc.len()` codes (a multiple of 8).
    ///
    /// # Safety
    /// As [`dot_lut`].
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy_lut(
        acc: &mut [f32],
        codes: &[u8],
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
                let vals = lookup(word(codes, j, bits as usize), shifts, mask, lo, hi, bits);
                let a = _mm256_loadu_ps(ac.as_ptr());
                _mm256_storeu_ps(ac.as_mut_ptr(), _mm256_fmadd_ps(wv, vals, a));
            }
        }
    }

    /// `sum_i q[i] * table[codes[i]]` over `q.len()` codes (a multiple of 8), one code per
    /// byte (already unpacked), values fetched with `vgatherdps`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `codes.len() >= q.len()`; every code must be a
    /// valid index of `table`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot_gather(q: &[f32], codes: &[u8], table: &[f32]) -> f32 {
        // SAFETY: AVX2 and FMA are guaranteed by the caller; each `qc` is 8 f32 and each
        // `cc` 8 bytes, read with unaligned loads; every gathered index is a code, which
        // the caller guarantees is within `table`.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for (qc, cc) in q.chunks_exact(8).zip(codes.chunks_exact(8)) {
                let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(cc.as_ptr().cast()));
                let vals = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qc.as_ptr()), vals, acc);
            }
            hsum(acc)
        }
    }

    /// `acc[i] += w * table[codes[i]]` over `acc.len()` codes (a multiple of 8), one code
    /// per byte.
    ///
    /// # Safety
    /// As [`dot_gather`].
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy_gather(acc: &mut [f32], codes: &[u8], table: &[f32], w: f32) {
        // SAFETY: as in `dot_gather`; each `ac` is 8 f32, loaded and stored in place.
        unsafe {
            let wv = _mm256_set1_ps(w);
            for (ac, cc) in acc.chunks_exact_mut(8).zip(codes.chunks_exact(8)) {
                let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(cc.as_ptr().cast()));
                let vals = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
                let a = _mm256_loadu_ps(ac.as_ptr());
                _mm256_storeu_ps(ac.as_mut_ptr(), _mm256_fmadd_ps(wv, vals, a));
            }
        }
    }
}
