//! AVX2 + FMA kernels for codes of 2, 3 and 4 bits: eight codes at a time are pulled out
//! of the bit stream with one variable shift, mapped to their values through an 8- or
//! 16-entry table held in registers (`vpermps`, plus a blend on bit 3 for 16 entries), and
//! multiplied into the query (scores) or added into the accumulator (V). Wider codes (5-8
//! bits): one byte shuffle, shift and mask turn 16 code bytes into eight codes, their
//! values fetched with `vgatherdps` from the full table. Sums are in a different order than the portable
//! path (eight lanes, FMA), so results agree to rounding, not bit for bit.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
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
}

/// Block kernels for whole rows of 2-4-bit codes (Lloyd-Max, and uniform with any group:
/// each lane holds eight codes of one group, so a group's scale is a lane's), for attention: the codes of
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

    /// The block of 64 codes at `codes` as eight dwords from which vector `n`'s indices
    /// are the dwords shifted right by `n * BITS` (low `BITS` bits; 2 bits: the table is
    /// repeated, so the bits above do not matter).
    ///
    /// # Safety
    /// The CPU must have AVX2; `codes` must point at `block_bytes(BITS)` readable bytes;
    /// `BITS` is 2, 3 or 4.
    #[inline(always)]
    pub(crate) unsafe fn block_dwords<const BITS: u32>(codes: *const u8) -> __m256i {
        // SAFETY: AVX2 is guaranteed by the caller. Loads: 4 bits reads bytes 0..32, 3 bits
        // 0..16 and 8..24, 2 bits 0..16, all within the block's `8 * BITS` bytes.
        unsafe {
            match BITS {
                4 => _mm256_loadu_si256(codes.cast()),
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
                    _mm256_shuffle_epi8(_mm256_set_m128i(b, a), ctrl)
                }
                _ => {
                    // Dword k holds codes 16k .. 16k + 16; lanes 4..8 take its upper half.
                    let x = _mm_loadu_si128(codes.cast());
                    _mm256_set_m128i(_mm_srli_epi32::<16>(x), x)
                }
            }
        }
    }

    /// Calls `f(n, values)` for the eight vectors of the block of 64 codes at `codes`.
    ///
    /// # Safety
    /// As [`block_dwords`].
    #[inline(always)]
    pub(crate) unsafe fn block_values<const BITS: u32>(
        codes: *const u8,
        lo: __m256,
        hi: __m256,
        mut f: impl FnMut(usize, __m256),
    ) {
        // SAFETY: AVX2 and the block's bytes are guaranteed by the caller.
        unsafe {
            let v = block_dwords::<BITS>(codes);
            for n in 0..8 {
                let idx = _mm256_srlv_epi32(v, _mm256_set1_epi32((BITS as usize * n) as i32));
                if BITS == 4 {
                    let a = _mm256_permutevar8x32_ps(lo, idx);
                    let b = _mm256_permutevar8x32_ps(hi, idx);
                    // Bit 3 of the code to the sign bit picks the upper table.
                    let sel = _mm256_sllv_epi32(v, _mm256_set1_epi32(28 - 4 * n as i32));
                    f(n, _mm256_blendv_ps(a, b, _mm256_castsi256_ps(sel)));
                } else {
                    f(n, _mm256_permutevar8x32_ps(lo, idx));
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
        /// Values per scale (8 to 256; `head_dim` with one scale).
        pub group: usize,
    }

    /// Lane `j`'s scale index relative to the block's first scale: every lane holds eight
    /// consecutive codes of one group (groups are at least 8).
    ///
    /// # Safety
    /// The CPU must have AVX.
    #[inline(always)]
    pub(crate) unsafe fn lane_scale_index(bits: u32, group: usize) -> __m256i {
        let mut idx = [0i32; 8];
        for (j, v) in idx.iter_mut().enumerate() {
            *v = (block_code(bits, 0, j) / group) as i32;
        }
        // SAFETY: AVX guaranteed by the caller; `idx` holds 8 i32.
        unsafe { _mm256_loadu_si256(idx.as_ptr().cast()) }
    }

    /// The scale of each lane of block `b` of the row at `row` (several scales per row),
    /// or `None` when one of them is not finite.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C; the row's `2 * n_scales + NB * block_bytes` bytes
    /// are readable (the 16 bytes read from scale `64 b / group` on stay inside them: a
    /// block's scales are its last at most 8, and at least 16 code bytes follow them).
    #[inline(always)]
    pub(crate) unsafe fn block_scales(
        row: *const u8,
        b: usize,
        group: usize,
        lanes: __m256i,
    ) -> Option<__m256> {
        // SAFETY: as stated above; register operations otherwise.
        unsafe {
            let h = _mm_loadu_si128(row.add(2 * (BLOCK * b / group)).cast());
            let sv = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), lanes);
            let e = _mm256_set1_epi32(0x7f80_0000);
            let bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(sv), e), e);
            if _mm256_testz_si256(bad, bad) == 0 {
                return None;
            }
            Some(sv)
        }
    }

    /// The eight-lane sum of `q * values` over block `b` of the codes at `codes`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; block `b` of `codes` is readable; `q` points at
    /// `64 (b + 1)` values.
    #[inline(always)]
    unsafe fn block_dot<const BITS: u32>(
        codes: *const u8,
        b: usize,
        q: *const f32,
        lo: __m256,
        hi: __m256,
    ) -> __m256 {
        // SAFETY: as stated above.
        unsafe {
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let qb = q.add(BLOCK * b);
            block_values::<BITS>(codes.add(b * block_bytes(BITS)), lo, hi, |n, v| {
                let qv = _mm256_loadu_ps(qb.add(8 * n));
                if n % 2 == 0 {
                    a0 = _mm256_fmadd_ps(qv, v, a0);
                } else {
                    a1 = _mm256_fmadd_ps(qv, v, a1);
                }
            });
            _mm256_add_ps(a0, a1)
        }
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
            let lanes = lane_scale_index(BITS, rows.group);
            let base = rows.bytes.as_ptr();
            let q = qp.as_ptr();
            let block = |codes: *const u8, b: usize| block_dot::<BITS>(codes, b, q, lo, hi);
            for (t, s) in scores.iter_mut().enumerate() {
                let row = base.add(t * rows.stride);
                let codes = row.add(2 * rows.n_scales);
                let total = if rows.n_scales == 1 {
                    let Some(sf) = scale_at(row) else {
                        return Err(t);
                    };
                    let mut acc = block(codes, 0);
                    for b in 1..NB {
                        acc = _mm256_add_ps(acc, block(codes, b));
                    }
                    _mm256_mul_ps(acc, _mm256_set1_ps(sf))
                } else {
                    let mut total = _mm256_setzero_ps();
                    for b in 0..NB {
                        let Some(sv) = block_scales(row, b, rows.group, lanes) else {
                            return Err(t);
                        };
                        total = _mm256_fmadd_ps(block(codes, b), sv, total);
                    }
                    total
                };
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
            let lanes = lane_scale_index(BITS, rows.group);
            let base = rows.bytes.as_ptr();
            let mut regs = [[_mm256_setzero_ps(); 8]; NB];
            let mut result = Ok(());
            'rows: for (t, &p) in w.iter().enumerate() {
                let row = base.add(t * rows.stride);
                let codes = row.add(2 * rows.n_scales);
                let one = if rows.n_scales == 1 {
                    let Some(sf) = scale_at(row) else {
                        result = Err(t);
                        break;
                    };
                    Some(_mm256_set1_ps(p * sf))
                } else {
                    None
                };
                for (b, rb) in regs.iter_mut().enumerate() {
                    let ws = match one {
                        Some(ws) => ws,
                        None => match block_scales(row, b, rows.group, lanes) {
                            Some(sv) => _mm256_mul_ps(sv, _mm256_set1_ps(p)),
                            None => {
                                result = Err(t);
                                break 'rows;
                            }
                        },
                    };
                    block_values::<BITS>(codes.add(b * block_bytes(BITS)), lo, hi, |n, v| {
                        rb[n] = _mm256_fmadd_ps(ws, v, rb[n]);
                    });
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

    /// The values of the `NB` blocks of the row at `row` before the row's scale, in block
    /// lane order (`vals[64 b + 8 n + j]` = value of code `64 b + block_code(n, j)`), and
    /// the factor that makes them the row's rotated values: the f16 scale when the row has
    /// one, `1` when it has several (the lane scales are then multiplied in). `None`: a
    /// scale is not finite (`vals` is then partial). For kernels that decode a row once
    /// and use it for several queries.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; the row's `2 * n_scales + NB *
    /// block_bytes(BITS)` bytes are readable; `vals` is writable for `64 * NB` floats;
    /// `lanes` is `lane_scale_index(BITS, group)`, `lo`/`hi` `tables(BITS, ..)`.
    #[inline(always)]
    pub(crate) unsafe fn row_levels<const BITS: u32, const NB: usize>(
        row: *const u8,
        n_scales: usize,
        group: usize,
        lanes: __m256i,
        lo: __m256,
        hi: __m256,
        vals: *mut f32,
    ) -> Option<f32> {
        // SAFETY: as the caller guarantees; stores write `vals[64 b + 8 n .. + 8]`, inside
        // its `64 * NB` floats.
        unsafe {
            let codes = row.add(2 * n_scales);
            if n_scales == 1 {
                let sf = scale_at(row)?;
                for b in 0..NB {
                    block_values::<BITS>(codes.add(b * block_bytes(BITS)), lo, hi, |n, v| {
                        _mm256_storeu_ps(vals.add(BLOCK * b + 8 * n), v);
                    });
                }
                return Some(sf);
            }
            for b in 0..NB {
                let sv = block_scales(row, b, group, lanes)?;
                block_values::<BITS>(codes.add(b * block_bytes(BITS)), lo, hi, |n, v| {
                    _mm256_storeu_ps(vals.add(BLOCK * b + 8 * n), _mm256_mul_ps(v, sv));
                });
            }
            Some(1.0)
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

    /// The symmetric half-count gives `#{boundaries < u}` and its level exactly, ties
    /// included: every boundary, its float neighbours, zeros, levels, extremes.
    #[test]
    fn lm_codes_equal_the_full_count_at_every_boundary() {
        use super::quant::{code_of, code_of_wide, LmTables};
        use std::arch::x86_64::*;
        if !crate::Isa::detect().is_avx2() {
            return;
        }
        for bits in 2..=8u8 {
            for d in [64, 128, 256] {
                let levels = crate::kvq::codebook::lloyd_max(bits, d).unwrap();
                let bounds = crate::kvq::codebook::boundaries(&levels);
                let t = LmTables::new(&levels, &bounds).expect("symmetric");
                let mut us = vec![0.0f32, -0.0, 1e-40, -1e-40, f32::MAX, f32::MIN, 1e30, -1e30];
                for &b in bounds.iter().chain(&levels) {
                    for v in [
                        b,
                        f32::from_bits(b.to_bits() + 1),
                        f32::from_bits(b.to_bits().saturating_sub(1)),
                    ] {
                        us.push(v);
                        us.push(-v);
                    }
                }
                while us.len() % 8 != 0 {
                    us.push(0.5);
                }
                for c in us.chunks_exact(8) {
                    let (mut codes, mut lv) = ([0i32; 8], [0f32; 8]);
                    // SAFETY: `Isa::detect` saw AVX2; the loads and stores cover 8 values.
                    unsafe {
                        let u = _mm256_loadu_ps(c.as_ptr());
                        let (k, l) = match &t.wide {
                            None => code_of(u, &t, u32::from(bits)),
                            Some(w) => code_of_wide(u, w, u32::from(bits)).expect("complete"),
                        };
                        _mm256_storeu_si256(codes.as_mut_ptr().cast(), k);
                        _mm256_storeu_ps(lv.as_mut_ptr(), l);
                    }
                    for j in 0..8 {
                        let want = bounds.iter().filter(|&&b| b < c[j]).count();
                        assert_eq!(codes[j] as usize, want, "bits {bits} d {d} u {:e}", c[j]);
                        assert_eq!(
                            lv[j].to_bits(),
                            levels[want].to_bits(),
                            "bits {bits} u {:e}",
                            c[j]
                        );
                    }
                }
            }
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

/// The block kernels in 512-bit vectors (AVX-512F): a 64-code block is the same eight
/// dwords as in [`block`], broadcast to both halves of a 512-bit vector; vector `m` shifts
/// the lower half by `2m * bits` and the upper by `(2m + 1) * bits`, so its 16 lanes are
/// exactly [`block`]'s vectors `2m` and `2m + 1` (same lane order, same query and
/// accumulator layout), and one `vpermps` over a 16-entry table gives the values (no
/// blend: the table has 16 entries; 2 and 3 bits repeat theirs).
// The AVX-512 intrinsics are stable from rustc 1.89; `build.rs` sets `kvq_avx512` there,
// so an older rustc (the workspace MSRV is 1.85) builds without this module.
#[cfg(all(target_arch = "x86_64", kvq_avx512))]
#[allow(clippy::incompatible_msrv)]
pub(crate) mod block512 {
    use std::arch::x86_64::*;

    use super::block::{
        block_bytes, block_dwords, block_scales, lane_scale_index, scale_at, Rows, BLOCK,
    };

    /// The 16-entry table: `table[i mod 2^bits]`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline(always)]
    unsafe fn table16(bits: u32, table: &[f32; 16]) -> __m512 {
        let mut t = [0f32; 16];
        for (i, v) in t.iter_mut().enumerate() {
            *v = table[i % (1 << bits)];
        }
        // SAFETY: AVX-512F guaranteed by the caller; `t` holds 16 f32.
        unsafe { _mm512_loadu_ps(t.as_ptr()) }
    }

    /// The table and the four shift vectors (vector `m`: `2m` code widths in the lower
    /// half, `2m + 1` in the upper), made once per call.
    #[derive(Clone, Copy)]
    pub(crate) struct Consts {
        t: __m512,
        sh: [__m512i; 4],
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn consts(bits: u32, table: &[f32; 16]) -> Consts {
        // SAFETY: AVX-512F guaranteed by the caller; register operations.
        unsafe {
            let mut sh = [_mm512_setzero_si512(); 4];
            for (m, v) in sh.iter_mut().enumerate() {
                let lo = _mm512_set1_epi32((bits as usize * 2 * m) as i32);
                let hi = _mm256_set1_epi32((bits as usize * (2 * m + 1)) as i32);
                *v = _mm512_inserti64x4::<1>(lo, hi);
            }
            Consts {
                t: table16(bits, table),
                sh,
            }
        }
    }

    /// Calls `f(m, values)` for the four 16-lane vectors of the block at `codes`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX2; as [`block_dwords`] for `codes`.
    #[inline(always)]
    unsafe fn values<const BITS: u32>(
        codes: *const u8,
        c: Consts,
        mut f: impl FnMut(usize, __m512),
    ) {
        // SAFETY: features and the block's bytes guaranteed by the caller.
        unsafe {
            let z = _mm512_broadcast_i64x4(block_dwords::<BITS>(codes));
            for m in 0..4 {
                f(m, _mm512_permutexvar_ps(_mm512_srlv_epi32(z, c.sh[m]), c.t));
            }
        }
    }

    /// A 256-bit lane vector in both halves.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline(always)]
    unsafe fn both(v: __m256) -> __m512 {
        // SAFETY: register-only AVX-512F operations.
        unsafe { _mm512_castsi512_ps(_mm512_broadcast_i64x4(_mm256_castps_si256(v))) }
    }

    /// The sum of `q * values` over block `b` (16 lanes).
    ///
    /// # Safety
    /// As [`values`]; `q` points at `64 (b + 1)` values.
    #[inline(always)]
    unsafe fn block_dot<const BITS: u32>(
        codes: *const u8,
        b: usize,
        q: *const f32,
        t: Consts,
    ) -> __m512 {
        // SAFETY: as stated above.
        unsafe {
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let qb = q.add(BLOCK * b);
            values::<BITS>(codes.add(b * block_bytes(BITS)), t, |m, v| {
                let qv = _mm512_loadu_ps(qb.add(16 * m));
                if m % 2 == 0 {
                    a0 = _mm512_fmadd_ps(qv, v, a0);
                } else {
                    a1 = _mm512_fmadd_ps(qv, v, a1);
                }
            });
            _mm512_add_ps(a0, a1)
        }
    }

    /// [`super::block::row_levels`] in 512-bit vectors (the same values in the same
    /// order: vector `m` of a block holds lane vectors `2m` and `2m + 1`).
    ///
    /// # Safety
    /// As [`super::block::row_levels`], and the CPU must have AVX-512F; `c` is
    /// `consts(BITS, ..)`.
    #[inline(always)]
    pub(crate) unsafe fn row_levels<const BITS: u32, const NB: usize>(
        row: *const u8,
        n_scales: usize,
        group: usize,
        lanes: __m256i,
        c: Consts,
        vals: *mut f32,
    ) -> Option<f32> {
        // SAFETY: as the caller guarantees; stores write `vals[64 b + 16 m .. + 16]`,
        // inside its `64 * NB` floats.
        unsafe {
            let codes = row.add(2 * n_scales);
            if n_scales == 1 {
                let sf = scale_at(row)?;
                for b in 0..NB {
                    values::<BITS>(codes.add(b * block_bytes(BITS)), c, |m, v| {
                        _mm512_storeu_ps(vals.add(BLOCK * b + 16 * m), v);
                    });
                }
                return Some(sf);
            }
            for b in 0..NB {
                let sv = both(block_scales(row, b, group, lanes)?);
                values::<BITS>(codes.add(b * block_bytes(BITS)), c, |m, v| {
                    _mm512_storeu_ps(vals.add(BLOCK * b + 16 * m), _mm512_mul_ps(v, sv));
                });
            }
            Some(1.0)
        }
    }

    /// [`super::block::scores`] in 512-bit vectors.
    ///
    /// # Safety
    /// As [`super::block::scores`], and the CPU must have AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn scores<const BITS: u32, const NB: usize>(
        qp: &[f32],
        rows: Rows,
        table: &[f32; 16],
        scale: f32,
        scores: &mut [f32],
    ) -> Result<(), usize> {
        // SAFETY: as in `block::scores`.
        unsafe {
            let t = consts(BITS, table);
            let lanes = lane_scale_index(BITS, rows.group);
            let base = rows.bytes.as_ptr();
            let q = qp.as_ptr();
            for (i, s) in scores.iter_mut().enumerate() {
                let row = base.add(i * rows.stride);
                let codes = row.add(2 * rows.n_scales);
                let total = if rows.n_scales == 1 {
                    let Some(sf) = scale_at(row) else {
                        return Err(i);
                    };
                    let mut acc = block_dot::<BITS>(codes, 0, q, t);
                    for b in 1..NB {
                        acc = _mm512_add_ps(acc, block_dot::<BITS>(codes, b, q, t));
                    }
                    _mm512_mul_ps(acc, _mm512_set1_ps(sf))
                } else {
                    let mut total = _mm512_setzero_ps();
                    for b in 0..NB {
                        let Some(sv) = block_scales(row, b, rows.group, lanes) else {
                            return Err(i);
                        };
                        total = _mm512_fmadd_ps(block_dot::<BITS>(codes, b, q, t), both(sv), total);
                    }
                    total
                };
                *s = scale * _mm512_reduce_add_ps(total);
            }
            Ok(())
        }
    }

    /// [`super::block::accumulate`] in 512-bit vectors.
    ///
    /// # Safety
    /// As [`super::block::accumulate`], and the CPU must have AVX-512F.
    #[inline(always)]
    pub(crate) unsafe fn accumulate<const BITS: u32, const NB: usize>(
        w: &[f32],
        rows: Rows,
        table: &[f32; 16],
        acc: &mut [f32],
    ) -> Result<(), usize> {
        // SAFETY: as in `block::accumulate`.
        unsafe {
            let t = consts(BITS, table);
            let lanes = lane_scale_index(BITS, rows.group);
            let base = rows.bytes.as_ptr();
            let mut regs = [[_mm512_setzero_ps(); 4]; NB];
            let mut result = Ok(());
            'rows: for (i, &p) in w.iter().enumerate() {
                let row = base.add(i * rows.stride);
                let codes = row.add(2 * rows.n_scales);
                let one = if rows.n_scales == 1 {
                    let Some(sf) = scale_at(row) else {
                        result = Err(i);
                        break;
                    };
                    Some(_mm512_set1_ps(p * sf))
                } else {
                    None
                };
                for (b, rb) in regs.iter_mut().enumerate() {
                    let ws = match one {
                        Some(ws) => ws,
                        None => match block_scales(row, b, rows.group, lanes) {
                            Some(sv) => _mm512_mul_ps(both(sv), _mm512_set1_ps(p)),
                            None => {
                                result = Err(i);
                                break 'rows;
                            }
                        },
                    };
                    values::<BITS>(codes.add(b * block_bytes(BITS)), t, |m, v| {
                        rb[m] = _mm512_fmadd_ps(ws, v, rb[m]);
                    });
                }
            }
            for (b, rb) in regs.iter().enumerate() {
                for (m, r) in rb.iter().enumerate() {
                    let a = acc.as_mut_ptr().add(BLOCK * b + 16 * m);
                    _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), *r));
                }
            }
            result
        }
    }
}

/// The AVX2 quantizer of Lloyd-Max rows (2-8 bits), byte for byte the portable one
/// (`docs/formats/kvq.md`): the same float operations in the same order (the butterflies
/// of the rotation and the eight-lane sums map onto eight-lane vectors; no FMA), codes
/// counted by compares. Levels and boundaries are exactly symmetric (`c_k = -c_{2^b-1-k}`,
/// the middle boundary 0), so with `a = |u|` and `P` the upper levels:
/// code = `2^(b-1) + #{upper boundaries < a}` for `u > 0`, and `2^(b-1) - 1 - #{upper
/// boundaries <= a}` otherwise, level `= ±P[count]`; half the compares of a full count
/// (2-5 bits: a compare per upper boundary; 6-8 bits: a bucket table and a few gathered
/// compares, `Wide`).
#[cfg(target_arch = "x86_64")]
pub(crate) mod quant {
    use std::arch::x86_64::*;

    use super::super::rotation::MAX_HEAD_DIM;

    /// What the row kernel needs of a codec, derived once.
    #[derive(Debug, Clone)]
    pub(crate) struct LmTables {
        /// Upper boundaries `b_{2^(b-1)} ..` (`2^(b-1) - 1` values).
        pub upper_bounds: Vec<f32>,
        /// Upper levels `c_{2^(b-1)} ..` (`2^(b-1)` values), zero-padded to 16.
        pub upper_levels: [f32; 16],
        /// 6-8 bits: the search tables.
        pub wide: Option<Wide>,
    }

    /// Code search for 6-8 bits: `start[k]` = upper boundaries below the start of bucket
    /// `k - 1` of [`WIDE_BUCKETS`] over `[0, range]`; from there `steps` gathered compares
    /// forward; one more compare checks that the count is complete (else the row goes to
    /// the portable code), so the codes are exact whatever the table.
    #[derive(Debug, Clone)]
    pub(crate) struct Wide {
        start: Vec<i32>,
        /// Upper boundaries, then `+inf`.
        bounds: Vec<f32>,
        /// Upper levels (`2^(b-1)`).
        levels: Vec<f32>,
        scale: f32,
        steps: usize,
    }

    /// Buckets of [`Wide`].
    pub(crate) const WIDE_BUCKETS: usize = 4096;

    impl LmTables {
        /// Tables of the symmetric `levels` / `bounds`, or `None` when they are not exactly
        /// symmetric or have more than 256 levels.
        pub(crate) fn new(levels: &[f32], bounds: &[f32]) -> Option<LmTables> {
            let n = levels.len();
            if !(4..=256).contains(&n) || bounds.len() + 1 != n {
                return None;
            }
            let h = n / 2;
            let sym = (0..n).all(|k| levels[k] == -levels[n - 1 - k])
                && (0..n - 1).all(|k| bounds[k] == -bounds[n - 2 - k])
                && bounds[h - 1] == 0.0;
            if !sym {
                return None;
            }
            let ub = &bounds[h..];
            let mut upper_levels = [0f32; 16];
            let wide = if h <= 16 {
                upper_levels[..h].copy_from_slice(&levels[h..]);
                None
            } else {
                let range = 2.0 * ub.last().copied().unwrap_or(1.0).max(1e-3);
                let scale = WIDE_BUCKETS as f32 / range;
                let lo = |k: usize| k as f32 / scale;
                let below = |x: f32| ub.partition_point(|&b| b < x);
                let start: Vec<i32> = (0..WIDE_BUCKETS)
                    .map(|k| below(lo(k.saturating_sub(1))) as i32)
                    .collect();
                // Bounds a search may have to pass: from bucket k - 1's start to bucket
                // k + 2's (one bucket of slack for rounding in the bucket index).
                let steps = (0..WIDE_BUCKETS)
                    .map(|k| below(lo(k + 2)) - below(lo(k.saturating_sub(1))))
                    .max()
                    .unwrap_or(0);
                let mut b = ub.to_vec();
                b.push(f32::INFINITY);
                Some(Wide {
                    start,
                    bounds: b,
                    levels: levels[h..].to_vec(),
                    scale,
                    steps,
                })
            };
            Some(LmTables {
                upper_bounds: ub.to_vec(),
                upper_levels,
                wide,
            })
        }
    }

    /// [`code_of`] for 6-8 bits, or `None` when a count was not complete after the
    /// table's steps (never seen; the caller then uses the portable code).
    ///
    /// # Safety
    /// The CPU must have AVX2; `w` made with `bits` 6..=8.
    #[inline(always)]
    pub(crate) unsafe fn code_of_wide(u: __m256, w: &Wide, bits: u32) -> Option<(__m256i, __m256)> {
        // SAFETY: AVX2 guaranteed by the caller. Gathers: bucket indices are clamped to
        // `0 .. WIDE_BUCKETS` (`start` has that many); counts start at a `start` value
        // (<= the number of upper bounds) and grow by one per step only where the bound at
        // the count is below `a`, never past the `+inf` at the end of `bounds`, so every
        // index into `bounds` is at most its last and every level index below `2^(b-1)`.
        unsafe {
            let half = 1i32 << (bits - 1);
            let pos = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(u, _mm256_setzero_ps()));
            let not_pos = _mm256_xor_si256(pos, _mm256_set1_epi32(-1));
            let a = _mm256_and_si256(_mm256_castps_si256(u), _mm256_set1_epi32(0x7fff_ffff));
            let a = _mm256_castsi256_ps(_mm256_sub_epi32(a, not_pos));
            let kf = _mm256_min_ps(
                _mm256_mul_ps(a, _mm256_set1_ps(w.scale)),
                _mm256_set1_ps((WIDE_BUCKETS - 1) as f32),
            );
            let k = _mm256_cvttps_epi32(kf);
            let mut cnt = _mm256_i32gather_epi32::<4>(w.start.as_ptr(), k);
            for _ in 0..w.steps {
                let b = _mm256_i32gather_ps::<4>(w.bounds.as_ptr(), cnt);
                let lt = _mm256_cmp_ps::<_CMP_LT_OQ>(b, a);
                cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(lt));
            }
            let b = _mm256_i32gather_ps::<4>(w.bounds.as_ptr(), cnt);
            if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(b, a)) != 0 {
                return None;
            }
            let lv = _mm256_i32gather_ps::<4>(w.levels.as_ptr(), cnt);
            let neg = _mm256_and_si256(not_pos, _mm256_set1_epi32(i32::MIN));
            let lv = _mm256_xor_ps(lv, _mm256_castsi256_ps(neg));
            let up = _mm256_add_epi32(cnt, _mm256_set1_epi32(half));
            let flip = _mm256_and_si256(not_pos, _mm256_set1_epi32(2 * half - 1));
            Some((_mm256_xor_si256(up, flip), lv))
        }
    }

    /// `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))` of the lanes.
    ///
    /// # Safety
    /// The CPU must have AVX.
    #[inline(always)]
    unsafe fn lane_combine(v: __m256) -> f32 {
        // SAFETY: register-only AVX/SSE operations; the caller guarantees AVX.
        unsafe {
            let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let p = _mm_add_ps(t, _mm_shuffle_ps(t, t, 0b10_11_00_01));
            _mm_cvtss_f32(_mm_add_ss(p, _mm_movehl_ps(p, p)))
        }
    }

    /// One butterfly stage inside each vector (`h` = 1, 2 or 4): `(a, b) <- (a + b, a - b)`
    /// for the lanes `h` apart.
    ///
    /// # Safety
    /// The CPU must have AVX.
    #[inline(always)]
    unsafe fn stage_in(v: __m256, h: usize) -> __m256 {
        // SAFETY: register-only AVX operations; the caller guarantees AVX.
        unsafe {
            let b = match h {
                1 => _mm256_permute_ps::<0b10_11_00_01>(v),
                2 => _mm256_permute_ps::<0b01_00_11_10>(v),
                _ => _mm256_permute2f128_ps::<0x01>(v, v),
            };
            // Lower lanes: a + b (own + partner); upper lanes: partner - own = a - b.
            let s = _mm256_add_ps(v, b);
            let t = _mm256_sub_ps(b, v);
            match h {
                1 => _mm256_blend_ps::<0b1010_1010>(s, t),
                2 => _mm256_blend_ps::<0b1100_1100>(s, t),
                _ => _mm256_blend_ps::<0b1111_0000>(s, t),
            }
        }
    }

    /// `y = R x` in vectors (`x.len() = signs.len() = 8 * nv`, `nv` 8, 16 or 32).
    ///
    /// # Safety
    /// The CPU must have AVX; lengths as stated.
    #[inline(always)]
    pub(crate) unsafe fn rotate(x: &[f32], signs: &[f32], inv_sqrt: f32, y: &mut [__m256]) {
        // SAFETY: AVX guaranteed by the caller; each load reads 8 values of `x` / `signs`
        // at `8 i < x.len()`.
        unsafe {
            let nv = y.len();
            for (i, v) in y.iter_mut().enumerate() {
                let a = _mm256_loadu_ps(x.as_ptr().add(8 * i));
                let s = _mm256_loadu_ps(signs.as_ptr().add(8 * i));
                let mut w = _mm256_mul_ps(a, s);
                w = stage_in(w, 1);
                w = stage_in(w, 2);
                *v = stage_in(w, 4);
            }
            let mut h = 1;
            while h < nv {
                for blk in y.chunks_exact_mut(2 * h) {
                    let (a, b) = blk.split_at_mut(h);
                    for (u, w) in a.iter_mut().zip(b.iter_mut()) {
                        let (p, q) = (*u, *w);
                        *u = _mm256_add_ps(p, q);
                        *w = _mm256_sub_ps(p, q);
                    }
                }
                h *= 2;
            }
            let is = _mm256_set1_ps(inv_sqrt);
            for v in y.iter_mut() {
                *v = _mm256_mul_ps(*v, is);
            }
        }
    }

    /// `x <- R^T x` in vectors, the same operations as `Rotation::unrotate` (the
    /// butterflies, then `* (s_i * inv_sqrt)`): bit for bit its result.
    ///
    /// # Safety
    /// The CPU must have AVX; `x.len() == signs.len()` is 64, 128 or 256.
    #[inline(always)]
    pub(crate) unsafe fn unrotate(x: &mut [f32], signs: &[f32], inv_sqrt: f32) {
        // SAFETY: AVX guaranteed by the caller; each load and store covers 8 values at
        // `8 i < x.len() = signs.len()`.
        unsafe {
            let mut y = [_mm256_setzero_ps(); MAX_HEAD_DIM / 8];
            let y = &mut y[..x.len() / 8];
            for (i, v) in y.iter_mut().enumerate() {
                let w = _mm256_loadu_ps(x.as_ptr().add(8 * i));
                *v = stage_in(stage_in(stage_in(w, 1), 2), 4);
            }
            let nv = y.len();
            let mut h = 1;
            while h < nv {
                for blk in y.chunks_exact_mut(2 * h) {
                    let (a, b) = blk.split_at_mut(h);
                    for (u, w) in a.iter_mut().zip(b.iter_mut()) {
                        let (p, q) = (*u, *w);
                        *u = _mm256_add_ps(p, q);
                        *w = _mm256_sub_ps(p, q);
                    }
                }
                h *= 2;
            }
            let is = _mm256_set1_ps(inv_sqrt);
            for (i, v) in y.iter().enumerate() {
                let s = _mm256_mul_ps(_mm256_loadu_ps(signs.as_ptr().add(8 * i)), is);
                _mm256_storeu_ps(x.as_mut_ptr().add(8 * i), _mm256_mul_ps(*v, s));
            }
        }
    }

    /// Whether every value of `x` (a multiple of 8 long) is finite.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    pub(crate) unsafe fn all_finite(x: &[f32]) -> bool {
        // SAFETY: AVX2 guaranteed by the caller; each load reads one 8-value chunk.
        unsafe {
            let e = _mm256_set1_epi32(0x7f80_0000);
            let mut bad = _mm256_setzero_si256();
            for c in x.chunks_exact(8) {
                let v = _mm256_and_si256(_mm256_loadu_si256(c.as_ptr().cast()), e);
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(v, e));
            }
            _mm256_testz_si256(bad, bad) == 1
        }
    }

    /// Codes `#{boundaries < u}` (dwords) and their levels for eight normalized values.
    ///
    /// # Safety
    /// The CPU must have AVX2; `t` made with `bits` 2..=5.
    #[inline(always)]
    pub(crate) unsafe fn code_of(u: __m256, t: &LmTables, bits: u32) -> (__m256i, __m256) {
        // SAFETY: AVX2 guaranteed by the caller; the table loads read inside the 16-entry
        // `upper_levels`.
        unsafe {
            let half = 1i32 << (bits - 1);
            let pos = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(u, _mm256_setzero_ps()));
            let not_pos = _mm256_xor_si256(pos, _mm256_set1_epi32(-1));
            // For u <= 0 count boundaries <= |u|: compare against the next float up.
            let a = _mm256_and_si256(_mm256_castps_si256(u), _mm256_set1_epi32(0x7fff_ffff));
            let a = _mm256_castsi256_ps(_mm256_sub_epi32(a, not_pos));
            let mut cnt = _mm256_setzero_si256();
            for &b in &t.upper_bounds {
                let lt = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_set1_ps(b), a);
                cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(lt));
            }
            // Level: +-P[cnt] (negative where u <= 0).
            let mut lv = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.upper_levels.as_ptr()), cnt);
            if bits == 5 {
                let hi = _mm256_loadu_ps(t.upper_levels.as_ptr().add(8));
                let sel = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(cnt));
                lv = _mm256_blendv_ps(lv, _mm256_permutevar8x32_ps(hi, cnt), sel);
            }
            let neg = _mm256_and_si256(not_pos, _mm256_set1_epi32(i32::MIN));
            let lv = _mm256_xor_ps(lv, _mm256_castsi256_ps(neg));
            // Code: half + cnt, or half - 1 - cnt = (half + cnt) ^ (2 half - 1).
            let up = _mm256_add_epi32(cnt, _mm256_set1_epi32(half));
            let flip = _mm256_and_si256(not_pos, _mm256_set1_epi32(2 * half - 1));
            (_mm256_xor_si256(up, flip), lv)
        }
    }

    /// Codes (one per byte, in order) and the f32 least-squares scale `num / den` of the
    /// rotated row `y` (`nv` vectors), `None` when the row is all zeros (the portable code
    /// handles that case).
    ///
    /// # Safety
    /// The CPU must have AVX2; `codes.len() >= 8 * y.len()`; `t` made from this codec's
    /// levels with `bits` 2..=8.
    #[inline(always)]
    pub(crate) unsafe fn code_lm(
        y: &[__m256],
        t: &LmTables,
        bits: u32,
        codes: &mut [u8],
    ) -> Option<f32> {
        // SAFETY: AVX2 guaranteed by the caller; the table loads read inside the 16-entry
        // `upper_levels`; each code store writes 32 bytes at `32 i` of `codes`, which holds
        // `8 * y.len()` (a multiple of 32) bytes.
        unsafe {
            let mut n2 = _mm256_setzero_ps();
            for v in y {
                n2 = _mm256_add_ps(n2, _mm256_mul_ps(*v, *v));
            }
            let norm2 = lane_combine(n2);
            if norm2 == 0.0 {
                return None;
            }
            let d = 8 * y.len();
            let inv = _mm256_set1_ps((d as f32).sqrt() / norm2.sqrt());
            let (mut num, mut den) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut cv = [_mm256_setzero_si256(); MAX_HEAD_DIM / 8];
            for (v, c) in y.iter().zip(cv.iter_mut()) {
                let u = _mm256_mul_ps(*v, inv);
                let (code, lv) = match &t.wide {
                    None => code_of(u, t, bits),
                    Some(w) => code_of_wide(u, w, bits)?,
                };
                num = _mm256_add_ps(num, _mm256_mul_ps(*v, lv));
                den = _mm256_add_ps(den, _mm256_mul_ps(lv, lv));
                *c = code;
            }
            // Dwords to bytes, in order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for (i, q) in cv[..y.len()].chunks_exact(4).enumerate() {
                let a = _mm256_packus_epi32(q[0], q[1]);
                let b = _mm256_packus_epi32(q[2], q[3]);
                let p = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order);
                _mm256_storeu_si256(codes.as_mut_ptr().add(32 * i).cast(), p);
            }
            Some(lane_combine(num) / lane_combine(den))
        }
    }

    /// Codes of the row `x` (`d` = 64, 128 or 256 values, rotation signs and `1/sqrt(d)`
    /// given) into `codes[..d]`, and the f32 least-squares scale; `None` for a row the
    /// portable code must handle (a non-finite value, all zeros).
    ///
    /// # Safety
    /// The CPU must have AVX2; `x.len() == signs.len()` is 64, 128 or 256;
    /// `codes.len() >= x.len()`; `t` made from this codec's levels with `bits` 2..=8.
    #[inline(always)]
    pub(crate) unsafe fn quantize_lm(
        x: &[f32],
        signs: &[f32],
        inv_sqrt: f32,
        t: &LmTables,
        bits: u32,
        codes: &mut [u8],
    ) -> Option<f32> {
        // SAFETY: AVX2 guaranteed by the caller; lengths as the callees require.
        unsafe {
            if !all_finite(x) {
                return None;
            }
            let mut y = [_mm256_setzero_ps(); MAX_HEAD_DIM / 8];
            let y = &mut y[..x.len() / 8];
            rotate(x, signs, inv_sqrt, y);
            code_lm(y, t, bits, codes)
        }
    }
}

/// The AVX2 uniform quantizer, byte for byte the portable one: per group of `g` rotated
/// values, `m = max |y|` (exact in any order), `S = f16(m / half)`, codes
/// `clamp(round_half_even(y * (1 / f32(S)) + half), 0, 2^b - 1)` with the same multiply,
/// add and rounding per value.
#[cfg(target_arch = "x86_64")]
pub(crate) mod uniform {
    use std::arch::x86_64::*;

    use half::f16;

    use super::super::rotation::MAX_HEAD_DIM;

    /// Codes (one per byte, in order, into `codes[..d]`) and the f16 scales (`d / group`
    /// into `scales`) of the row `x`, or `None` for a row the portable code must handle
    /// (a non-finite value, a scale beyond f16).
    ///
    /// # Safety
    /// The CPU must have AVX2; `x.len() == signs.len()` is 64, 128 or 256; `group` divides
    /// it and is a multiple of 8; `codes.len() >= x.len()`, `scales.len() >= x.len() /
    /// group`; `bits` 2..=8.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn quantize(
        x: &[f32],
        signs: &[f32],
        inv_sqrt: f32,
        group: usize,
        bits: u32,
        codes: &mut [u8],
        scales: &mut [f16],
    ) -> Option<()> {
        // SAFETY: AVX2 guaranteed by the caller; lengths as stated; each code store
        // writes 8 bytes at `8 i` of `codes` (`8 i + 8 <= x.len()`).
        unsafe {
            if !super::quant::all_finite(x) {
                return None;
            }
            let nv = x.len() / 8;
            let mut y = [_mm256_setzero_ps(); MAX_HEAD_DIM / 8];
            let y = &mut y[..nv];
            super::quant::rotate(x, signs, inv_sqrt, y);
            let top = ((1u32 << bits) - 1) as f32;
            let half = 0.5 * top;
            let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
            let gv = group / 8;
            let shuf = _mm256_setr_epi8(
                0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1,
                -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            for (gi, (yg, s)) in y.chunks_exact(gv).zip(scales.iter_mut()).enumerate() {
                let mut m = _mm256_setzero_ps();
                for v in yg {
                    m = _mm256_max_ps(m, _mm256_and_ps(*v, abs_mask));
                }
                let t = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                let t = _mm_max_ps(t, _mm_movehl_ps(t, t));
                let t = _mm_max_ss(t, _mm_shuffle_ps(t, t, 1));
                let sc = f16::from_f32(_mm_cvtss_f32(t) / half);
                if !sc.is_finite() {
                    return None;
                }
                *s = sc;
                let sf = sc.to_f32();
                let out = codes.as_mut_ptr().add(gi * group);
                if sf == 0.0 {
                    std::ptr::write_bytes(out, (1u32 << (bits - 1)) as u8, group);
                    continue;
                }
                let inv = _mm256_set1_ps(1.0 / sf);
                let (hv, tv) = (_mm256_set1_ps(half), _mm256_set1_ps(top));
                for (i, v) in yg.iter().enumerate() {
                    let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                        _mm256_add_ps(_mm256_mul_ps(*v, inv), hv),
                    );
                    let c = _mm256_cvttps_epi32(_mm256_min_ps(
                        _mm256_max_ps(r, _mm256_setzero_ps()),
                        tv,
                    ));
                    // Low byte of each dword: 4 bytes per 128-bit lane, then the two lanes.
                    let b = _mm256_shuffle_epi8(c, shuf);
                    let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(b)) as u32;
                    let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(b)) as u32;
                    let w = u64::from(lo) | (u64::from(hi) << 32);
                    out.add(8 * i).cast::<u64>().write_unaligned(w);
                }
            }
            Some(())
        }
    }
}
