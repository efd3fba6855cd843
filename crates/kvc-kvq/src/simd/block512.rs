//! The block kernels in 512-bit vectors (AVX-512F): a 64-code block is the same eight
//! dwords as in [`block`], broadcast to both halves of a 512-bit vector; vector `m` shifts
//! the lower half by `2m * bits` and the upper by `(2m + 1) * bits`, so its 16 lanes are
//! exactly [`block`]'s vectors `2m` and `2m + 1` (same lane order, same query and
//! accumulator layout), and one `vpermps` over a 16-entry table gives the values (no
//! blend: the table has 16 entries; 2 and 3 bits repeat theirs).

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
unsafe fn values<const BITS: u32>(codes: *const u8, c: Consts, mut f: impl FnMut(usize, __m512)) {
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
