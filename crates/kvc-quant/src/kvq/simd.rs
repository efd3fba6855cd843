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

/// Block kernels for whole rows of 2-4-bit codes with one scale per row or per multiple
/// of 64 values (Lloyd-Max; uniform with `group % 64 == 0`), for attention: the codes of
/// a 64-value block are loaded at once and turned into eight vectors of eight values with
/// one shift and one or two `vpermps` each, in a fixed lane order ([`block_code`]) that is
/// not the code order. The query is permuted into that order once per call and the V
/// accumulator is un-permuted once at the end, so no per-row shuffle restores the order.
#[cfg(target_arch = "x86_64")]
pub(crate) mod block {
    use std::arch::x86_64::*;

    /// Values per block.
    pub(crate) const BLOCK: usize = 64;

    /// The code index (within its 64-value block) that lane `j` of vector `n` holds.
    #[inline(always)]
    pub(crate) fn block_code(bits: u32, n: usize, j: usize) -> usize {
        if bits == 2 {
            // Dword `j % 4` holds codes `16 (j % 4) ..`; lanes 4..8 take its upper half.
            16 * (j % 4) + 8 * (j / 4) + n
        } else {
            // Lane `j` holds the eight codes `8j .. 8j + 8`.
            8 * j + n
        }
    }

    /// Bytes of one block of 64 codes.
    #[inline(always)]
    pub(crate) const fn block_bytes(bits: u32) -> usize {
        8 * bits as usize
    }

    /// The table registers: `lo` = values 0..8 (2 bits: 0..4 twice), `hi` = values 8..16.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    pub(crate) unsafe fn tables(bits: u32, table: &[f32; 16]) -> (__m256, __m256) {
        // SAFETY: AVX2 is guaranteed by the caller; `table` has 16 f32, every load reads
        // inside it.
        unsafe {
            if bits == 2 {
                let t = _mm_loadu_ps(table.as_ptr());
                return (_mm256_set_m128(t, t), _mm256_setzero_ps());
            }
            (
                _mm256_loadu_ps(table.as_ptr()),
                _mm256_loadu_ps(table.as_ptr().add(8)),
            )
        }
    }

    /// Calls `f(n, values)` for the eight vectors of the block of 64 codes at `codes`.
    ///
    /// # Safety
    /// The CPU must have AVX2; `codes` must point at `block_bytes(BITS)` readable bytes;
    /// `BITS` is 2, 3 or 4.
    #[inline(always)]
    pub(crate) unsafe fn block_values<const BITS: u32>(
        codes: *const u8,
        lo: __m256,
        hi: __m256,
        mut f: impl FnMut(usize, __m256),
    ) {
        // SAFETY: AVX2 is guaranteed by the caller. Loads: 4 bits reads bytes 0..32, 3 bits
        // 0..16 and 8..24, 2 bits 0..16, all within the block's `8 * BITS` bytes.
        unsafe {
            match BITS {
                4 => {
                    let v = _mm256_loadu_si256(codes.cast());
                    for n in 0..8 {
                        let idx = _mm256_srlv_epi32(v, _mm256_set1_epi32(4 * n as i32));
                        let a = _mm256_permutevar8x32_ps(lo, idx);
                        let b = _mm256_permutevar8x32_ps(hi, idx);
                        // Bit 3 of the code to the sign bit picks the upper table.
                        let sel = _mm256_sllv_epi32(v, _mm256_set1_epi32(28 - 4 * n as i32));
                        f(n, _mm256_blendv_ps(a, b, _mm256_castsi256_ps(sel)));
                    }
                }
                3 => {
                    // Lane j gets bytes 3j .. 3j + 3 (codes 8j .. 8j + 8): lanes 0..4 from
                    // bytes 0..12 of the first load, lanes 4..8 from bytes 12..24, which
                    // are bytes 4..16 of the second load (at byte 8).
                    let a = _mm_loadu_si128(codes.cast());
                    let b = _mm_loadu_si128(codes.add(8).cast());
                    let ctrl = _mm256_setr_epi8(
                        0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, 4, 5, 6, -1, 7, 8, 9,
                        -1, 10, 11, 12, -1, 13, 14, 15, -1,
                    );
                    let v = _mm256_shuffle_epi8(_mm256_set_m128i(b, a), ctrl);
                    for n in 0..8 {
                        let idx = _mm256_srlv_epi32(v, _mm256_set1_epi32(3 * n as i32));
                        f(n, _mm256_permutevar8x32_ps(lo, idx));
                    }
                }
                _ => {
                    // Dword k holds codes 16k .. 16k + 16; lanes 4..8 take its upper half.
                    let x = _mm_loadu_si128(codes.cast());
                    let v = _mm256_set_m128i(_mm_srli_epi32::<16>(x), x);
                    for n in 0..8 {
                        let idx = _mm256_srlv_epi32(v, _mm256_set1_epi32(2 * n as i32));
                        f(n, _mm256_permutevar8x32_ps(lo, idx));
                    }
                }
            }
        }
    }

    /// Sum of the eight lanes.
    ///
    /// # Safety
    /// The CPU must have AVX.
    #[inline(always)]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: register-only AVX/SSE operations; the caller guarantees AVX.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }
    }

    /// The f16 scale at `p` as f32, or `None` when it is not finite.
    ///
    /// # Safety
    /// The CPU must have F16C; `p` must point at 2 readable bytes.
    #[inline(always)]
    pub(crate) unsafe fn scale_at(p: *const u8) -> Option<f32> {
        // SAFETY: the caller guarantees 2 readable bytes and F16C.
        unsafe {
            let h = u16::from_le_bytes([*p, *p.add(1)]);
            if h & 0x7c00 == 0x7c00 {
                return None;
            }
            Some(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h)))))
        }
    }

    /// Shape of the rows a block kernel reads.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Rows<'a> {
        /// Row `t` starts at byte `t * stride`; every row's `row_bytes` are inside.
        pub bytes: &'a [u8],
        pub stride: usize,
        /// f16 scales at the start of a row.
        pub n_scales: usize,
        /// Values per scale (a multiple of 64).
        pub per_scale: usize,
    }

    /// `scores[t] = scale * (q . row t)` for every `t < scores.len()`, `qp` the rotated
    /// query in block lane order (`NB` blocks). `Err(t)`: row `t` has a non-finite scale.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `rows` as [`Rows`] says for `scores.len()`
    /// rows, each `2 * n_scales + NB * block_bytes(BITS)` bytes; `qp.len() >= 64 * NB`.
    #[inline(always)]
    pub(crate) unsafe fn scores<const BITS: u32, const NB: usize>(
        qp: &[f32],
        rows: Rows,
        table: &[f32; 16],
        scale: f32,
        scores: &mut [f32],
    ) -> Result<(), usize> {
        // SAFETY: features guaranteed by the caller; row `t`'s bytes are at
        // `t * stride .. t * stride + row_bytes`, inside `rows.bytes` (caller); `qp` holds
        // `64 * NB` values, every load below reads inside it.
        unsafe {
            let (lo, hi) = tables(BITS, table);
            let bpb = rows.per_scale / BLOCK;
            let base = rows.bytes.as_ptr();
            let q = qp.as_ptr();
            for (t, s) in scores.iter_mut().enumerate() {
                let row = base.add(t * rows.stride);
                let codes = row.add(2 * rows.n_scales);
                let mut total = _mm256_setzero_ps();
                for si in 0..rows.n_scales {
                    let Some(sf) = scale_at(row.add(2 * si)) else {
                        return Err(t);
                    };
                    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                    for b in si * bpb..(si + 1) * bpb {
                        let qb = q.add(BLOCK * b);
                        block_values::<BITS>(codes.add(b * block_bytes(BITS)), lo, hi, |n, v| {
                            let qv = _mm256_loadu_ps(qb.add(8 * n));
                            if n % 2 == 0 {
                                a0 = _mm256_fmadd_ps(qv, v, a0);
                            } else {
                                a1 = _mm256_fmadd_ps(qv, v, a1);
                            }
                        });
                    }
                    total = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(sf), total);
                }
                *s = scale * hsum(total);
            }
            Ok(())
        }
    }

    /// `acc += sum_t w[t] * (row t)` in block lane order (`acc`: `64 * NB` values), for
    /// every `t < w.len()`. `Err(t)`: row `t` has a non-finite scale (`acc` is then
    /// partial).
    ///
    /// # Safety
    /// As [`scores`], with `w` in place of `scores` and `acc.len() >= 64 * NB`.
    #[inline(always)]
    pub(crate) unsafe fn accumulate<const BITS: u32, const NB: usize>(
        w: &[f32],
        rows: Rows,
        table: &[f32; 16],
        acc: &mut [f32],
    ) -> Result<(), usize> {
        // SAFETY: as in `scores`; `acc` holds `64 * NB` values (caller).
        unsafe {
            let (lo, hi) = tables(BITS, table);
            let bpb = rows.per_scale / BLOCK;
            let base = rows.bytes.as_ptr();
            let mut regs = [[_mm256_setzero_ps(); 8]; NB];
            let mut result = Ok(());
            for (t, &p) in w.iter().enumerate() {
                let row = base.add(t * rows.stride);
                let codes = row.add(2 * rows.n_scales);
                for si in 0..rows.n_scales {
                    let Some(sf) = scale_at(row.add(2 * si)) else {
                        result = Err(t);
                        break;
                    };
                    let ws = _mm256_set1_ps(p * sf);
                    for (b, rb) in regs
                        .iter_mut()
                        .enumerate()
                        .take((si + 1) * bpb)
                        .skip(si * bpb)
                    {
                        block_values::<BITS>(codes.add(b * block_bytes(BITS)), lo, hi, |n, v| {
                            rb[n] = _mm256_fmadd_ps(ws, v, rb[n]);
                        });
                    }
                }
                if result.is_err() {
                    break;
                }
            }
            for (b, rb) in regs.iter().enumerate() {
                for (n, r) in rb.iter().enumerate() {
                    let a = acc.as_mut_ptr().add(BLOCK * b + 8 * n);
                    _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), *r));
                }
            }
            result
        }
    }

    /// `e^x` for eight lanes (Cephes' `expf`: range reduction by `ln 2` in two parts, a
    /// degree-5 polynomial; within 2 ulp, 0 below -87.3).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline(always)]
    pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: register-only AVX2/FMA operations; the caller guarantees the features.
        unsafe {
            let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_54));
            let x = _mm256_min_ps(
                _mm256_max_ps(x, _mm256_set1_ps(-87.336_54)),
                _mm256_set1_ps(88.722_83),
            );
            let fx = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            );
            let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
            let x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), x);
            let mut y = _mm256_set1_ps(1.987_569_1e-4);
            for c in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                1.666_666_5e-1,
                0.5,
            ] {
                y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(c));
            }
            y = _mm256_fmadd_ps(
                y,
                _mm256_mul_ps(x, x),
                _mm256_add_ps(x, _mm256_set1_ps(1.0)),
            );
            let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(fx),
                _mm256_set1_epi32(127),
            ));
            _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)))
        }
    }

    /// Softmax of `scores` in place (max subtracted), eight lanes at a time; returns
    /// `1 / sum`. The packed and the f16 attention kernels both use it.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline(always)]
    pub(crate) unsafe fn softmax(scores: &mut [f32]) -> f32 {
        // SAFETY: features guaranteed by the caller; every vector load and store covers
        // one 8-value chunk of `scores`.
        unsafe {
            let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut chunks = scores.chunks_exact_mut(8);
            for c in chunks.by_ref() {
                mv = _mm256_max_ps(mv, _mm256_loadu_ps(c.as_ptr()));
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
            let m = chunks
                .into_remainder()
                .iter()
                .chain(&lanes)
                .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mvec = _mm256_set1_ps(m);
            let mut sum = _mm256_setzero_ps();
            let mut chunks = scores.chunks_exact_mut(8);
            for c in chunks.by_ref() {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mvec));
                _mm256_storeu_ps(c.as_mut_ptr(), e);
                sum = _mm256_add_ps(sum, e);
            }
            let mut s = hsum(sum);
            for v in chunks.into_remainder() {
                let mut l = [*v - m; 8];
                _mm256_storeu_ps(l.as_mut_ptr(), exp8(_mm256_loadu_ps(l.as_ptr())));
                *v = l[0];
                s += l[0];
            }
            1.0 / s
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::block::*;

    #[test]
    fn block_lane_order_is_a_permutation() {
        for bits in 2..=4 {
            let mut seen = [false; BLOCK];
            for n in 0..8 {
                for j in 0..8 {
                    let c = block_code(bits, n, j);
                    assert!(!seen[c], "bits {bits}: code {c} twice");
                    seen[c] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn vector_exp_and_softmax_match_f64() {
        if !crate::Isa::detect().is_avx2() {
            return;
        }
        let xs: Vec<f32> = (0..2000).map(|i| -100.0 + i as f32 * 0.0537).collect();
        let mut s = xs.clone();
        // SAFETY: `Isa::detect` saw AVX2, FMA and F16C.
        let inv = unsafe { softmax(&mut s) };
        let m = xs.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let e: Vec<f64> = xs.iter().map(|&x| f64::from(x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        assert!(
            (f64::from(inv) * z - 1.0).abs() < 1e-5,
            "{inv} vs {}",
            1.0 / z
        );
        for (a, b) in s.iter().zip(&e) {
            let tol = 3e-7 * b + 1e-37;
            assert!((f64::from(*a) - b).abs() <= tol, "{a} vs {b}");
        }
    }
}
