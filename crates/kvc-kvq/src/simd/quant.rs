//! The AVX2 quantizer of Lloyd-Max rows (2-8 bits), byte for byte the portable one
//! (`docs/formats/kvq.md`): the same float operations in the same order (the butterflies
//! of the rotation and the eight-lane sums map onto eight-lane vectors; no FMA), codes
//! counted by compares. Levels and boundaries are exactly symmetric (`c_k = -c_{2^b-1-k}`,
//! the middle boundary 0), so with `a = |u|` and `P` the upper levels:
//! code = `2^(b-1) + #{upper boundaries < a}` for `u > 0`, and `2^(b-1) - 1 - #{upper
//! boundaries <= a}` otherwise, level `= ±P[count]`; half the compares of a full count
//! (2-5 bits: a compare per upper boundary; 6-8 bits: a bucket table and a few gathered
//! compares, `Wide`).

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
