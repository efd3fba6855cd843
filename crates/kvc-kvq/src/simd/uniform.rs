//! The AVX2 uniform quantizer, byte for byte the portable one: per group of `g` rotated
//! values, `m = max |y|` (exact in any order), `S = f16(m / half)`, codes
//! `clamp(round_half_even(y * (1 / f32(S)) + half), 0, 2^b - 1)` with the same multiply,
//! add and rounding per value.

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
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
            -1, -1, -1, -1, -1, -1, -1, -1, -1,
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
                let c =
                    _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), tv));
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
