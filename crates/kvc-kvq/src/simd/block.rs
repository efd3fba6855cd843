//! Block kernels for whole rows of 2-4-bit codes (Lloyd-Max, and uniform with any group:
//! each lane holds eight codes of one group, so a group's scale is a lane's), for attention: the codes of
//! a 64-value block are loaded at once and turned into eight vectors of eight values with
//! one shift and one or two `vpermps` each, in a fixed lane order ([`block_code`]) that is
//! not the code order. The query is permuted into that order once per call and the V
//! accumulator is un-permuted once at the end, so no per-row shuffle restores the order.

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
                    0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, 4, 5, 6, -1, 7, 8, 9, -1,
                    10, 11, 12, -1, 13, 14, 15, -1,
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
