//! Several queries against one tile of packed rows, each row decoded once.
//!
//! With grouped-query attention `G = n_head / n_kv_head` query heads read the same K and V
//! rows. An engine that runs each query head on its own decodes every packed row `G` times;
//! [`RowCodec::dot_rows_multi`] and [`RowCodec::accumulate_rows_multi`] decode a row once
//! and use its values for all `G` queries (scores `G x n`, weighted V sums `G x head_dim`,
//! both in the rotated basis). Rows of 2-4-bit codes go through the block kernels of
//! [`super::attention`] (AVX2, or AVX-512F where built and detected): the queries are
//! permuted once per call into the block lane order, a row's values are decoded into a
//! stack buffer, then each query's dot product (or `acc += w v`) reads that buffer. Other
//! rows (5-8 bits, or the portable loops) are decoded with
//! [`RowCodec::dequantize_row_rotated`] and used the same way.
//!
//! Rows are not errors here: a row whose scale is not finite (a poisoned row) scores NaN
//! for every query and makes the sum of every query that gives it a non-zero weight NaN; a
//! row of weight 0 is skipped (a masked cell adds nothing, even when poisoned). Each
//! query's result depends only on that query and the rows, computed in the same order
//! whatever `G` is, so a call with `G` queries equals `G` calls with one, bit for bit. The
//! AVX2 and AVX-512 results agree with the portable ones to rounding (tests: within `1e-5`
//! of `|q| |row|` for a score).

use super::attention::{check_rows, HeadRows};
use super::rotation::MAX_HEAD_DIM;
use super::row::{dot8, RowCodec};
use crate::error::{Error, Result};
use crate::isa::dispatch;

/// Queries per pass over the rows on the block path (their permuted copies live on the
/// stack); more queries make more passes.
#[cfg(target_arch = "x86_64")]
const PASS: usize = 8;

/// Rows decoded at a time by the block path's weighted sums (their values live on the stack),
/// each added to every query's sum.
#[cfg(target_arch = "x86_64")]
const CHUNK: usize = 32;

/// A float buffer aligned for vector loads.
#[repr(C, align(64))]
struct Aligned<const N: usize>([f32; N]);

/// The number of queries in `len` floats of `dim`-value rows.
fn n_queries(what: &'static str, len: usize, dim: usize) -> Result<usize> {
    if !len.is_multiple_of(dim) {
        return Err(Error::LayoutMismatch {
            what,
            expected: len / dim * dim,
            found: len,
        });
    }
    Ok(len / dim)
}

/// `g * n`, checked against `found`.
fn check_grid(what: &'static str, g: usize, n: usize, found: usize) -> Result<()> {
    let need = g.checked_mul(n).ok_or(Error::SizeOverflow { what })?;
    if need != found {
        return Err(Error::LayoutMismatch {
            what,
            expected: need,
            found,
        });
    }
    Ok(())
}

/// Whether every scale of the packed row is finite.
#[inline(always)]
fn scales_finite(c: &RowCodec, row: &[u8]) -> bool {
    row[..2 * c.n_scales()]
        .chunks_exact(2)
        .all(|b| half::f16::from_le_bytes([b[0], b[1]]).is_finite())
}

impl RowCodec {
    /// The dot products of `G` rotated queries (`q_rot`: `G x head_dim`, query `g` at
    /// `g * head_dim`, each rotated with [`rotation`](Self::rotation)`().rotate`) with
    /// `n_rows` packed rows (row `i` at byte `i * rows.stride`), written to `scores[g *
    /// n_rows + i]`. Each row is decoded once for all queries. A row with a non-finite
    /// scale scores NaN (see the module notes). No allocation.
    ///
    /// Errors: `q_rot.len()` not a multiple of head_dim, `scores.len() != G * n_rows`,
    /// rows that do not fit `rows.bytes` at `rows.stride`.
    pub fn dot_rows_multi(
        &self,
        q_rot: &[f32],
        rows: HeadRows,
        n_rows: usize,
        scores: &mut [f32],
    ) -> Result<()> {
        let g = n_queries("queries (G x head_dim)", q_rot.len(), self.dim())?;
        check_grid("scores (G x n_rows)", g, n_rows, scores.len())?;
        check_rows("packed rows", &rows, n_rows, self.row_bytes())?;
        if g == 0 || n_rows == 0 {
            return Ok(());
        }
        // The kernels need only the shapes checked above.
        dispatch!(self.isa(),
            portable => rowwise_dot(self, q_rot, rows, n_rows, scores),
            avx2 => avx2::dot(self, q_rot, rows, n_rows, scores),
            avx512 => avx512::dot(self, q_rot, rows, n_rows, scores),
        )
    }

    /// `acc[g] += sum_i weights[g * n_rows + i] * (rotated row i)` for `G` queries
    /// (`weights`: `G x n_rows`; `acc`: `G x head_dim`, query `g`'s sum at `g *
    /// head_dim`), rows as in [`dot_rows_multi`](Self::dot_rows_multi): the
    /// softmax-weighted V sums in the rotated basis (un-rotate each once). Each row is
    /// decoded once for all queries that weight it; a weight of 0 skips the row for that
    /// query. A row with a non-finite scale makes the sum of every query that weights it
    /// NaN (see the module notes). No allocation.
    ///
    /// Errors: `acc.len()` not a multiple of head_dim, `weights.len() != G * n_rows`,
    /// rows that do not fit `rows.bytes` at `rows.stride`.
    pub fn accumulate_rows_multi(
        &self,
        weights: &[f32],
        rows: HeadRows,
        n_rows: usize,
        acc: &mut [f32],
    ) -> Result<()> {
        let g = n_queries("sums (G x head_dim)", acc.len(), self.dim())?;
        check_grid("weights (G x n_rows)", g, n_rows, weights.len())?;
        check_rows("packed rows", &rows, n_rows, self.row_bytes())?;
        if g == 0 || n_rows == 0 {
            return Ok(());
        }
        // The kernels need only the shapes checked above.
        dispatch!(self.isa(),
            portable => rowwise_accumulate(self, weights, rows, n_rows, acc),
            avx2 => avx2::accumulate(self, weights, rows, n_rows, acc),
            avx512 => avx512::accumulate(self, weights, rows, n_rows, acc),
        )
    }
}

impl RowCodec {
    /// Whether [`dot_rows_multi`](Self::dot_rows_multi) and
    /// [`accumulate_rows_multi`](Self::accumulate_rows_multi) decode this codec's rows one at
    /// a time (5-8 bits, groups under 8 values, or the portable loops): then rows decoded
    /// once with [`decode_row_for_multi`](Self::decode_row_for_multi) and read with
    /// [`dot_decoded_multi`](Self::dot_decoded_multi) and
    /// [`accumulate_decoded_multi`](Self::accumulate_decoded_multi) give the same results bit
    /// for bit.
    pub fn multi_decodes_rows(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            matches!(self.isa().0, crate::isa::IsaKind::Portable)
                || self.block_rows(&[], 0).is_none()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            true
        }
    }

    /// Row `row`'s rotated values as the row-at-a-time kernels use them: those of
    /// [`dequantize_row_rotated`](Self::dequantize_row_rotated), or NaN throughout for a row
    /// with a non-finite scale (a poisoned row). For a caller that reads the same rows many
    /// times (a prefill's window rows) and keeps them decoded.
    ///
    /// Errors: `out.len() != head_dim`, `row.len() < row_bytes`.
    pub fn decode_row_for_multi(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        if out.len() != self.dim() {
            return Err(Error::LayoutMismatch {
                what: "decoded row",
                expected: self.dim(),
                found: out.len(),
            });
        }
        if row.len() < self.row_bytes() {
            return Err(Error::BufferTooSmall {
                what: "packed row",
                needed: self.row_bytes(),
                found: row.len(),
            });
        }
        if !scales_finite(self, row) {
            out.fill(f32::NAN);
            return Ok(());
        }
        self.dequantize_row_rotated(row, out)
    }

    /// [`dot_rows_multi`](Self::dot_rows_multi) over rows already decoded by
    /// [`decode_row_for_multi`](Self::decode_row_for_multi) (`vals`: row `i`'s head_dim
    /// values at `i * stride`): `scores[g * n_rows + i]`, the same sums as the row-at-a-time
    /// path (see [`multi_decodes_rows`](Self::multi_decodes_rows)). No allocation.
    ///
    /// Errors: shapes as in `dot_rows_multi`; rows beyond `vals`.
    pub fn dot_decoded_multi(
        &self,
        q_rot: &[f32],
        vals: &[f32],
        stride: usize,
        n_rows: usize,
        scores: &mut [f32],
    ) -> Result<()> {
        let d = self.dim();
        let g = n_queries("queries (G x head_dim)", q_rot.len(), d)?;
        check_grid("scores (G x n_rows)", g, n_rows, scores.len())?;
        check_decoded(vals, stride, n_rows, d)?;
        // The same loop on every path (the AVX2 build only widens the eight lanes' loads).
        dispatch!(self.isa(),
            portable => decoded_dot(d, q_rot, vals, stride, n_rows, scores),
            avx2 => decoded_dot_avx2(d, q_rot, vals, stride, n_rows, scores),
        );
        Ok(())
    }

    /// [`accumulate_rows_multi`](Self::accumulate_rows_multi) over rows already decoded by
    /// [`decode_row_for_multi`](Self::decode_row_for_multi) (`vals` as in
    /// [`dot_decoded_multi`](Self::dot_decoded_multi)): the same sums as the row-at-a-time
    /// path, a row of weight 0 skipped for that query. No allocation.
    ///
    /// Errors: shapes as in `accumulate_rows_multi`; rows beyond `vals`.
    pub fn accumulate_decoded_multi(
        &self,
        weights: &[f32],
        vals: &[f32],
        stride: usize,
        n_rows: usize,
        acc: &mut [f32],
    ) -> Result<()> {
        let d = self.dim();
        let g = n_queries("sums (G x head_dim)", acc.len(), d)?;
        check_grid("weights (G x n_rows)", g, n_rows, weights.len())?;
        check_decoded(vals, stride, n_rows, d)?;
        for t in 0..n_rows {
            if weights.iter().skip(t).step_by(n_rows).all(|&x| x == 0.0) {
                continue;
            }
            add_weighted_row(acc, weights, t, n_rows, &vals[t * stride..t * stride + d]);
        }
        Ok(())
    }
}

/// [`RowCodec::dot_decoded_multi`]'s loop (shapes checked by the caller).
#[inline(always)]
fn decoded_dot(d: usize, q: &[f32], vals: &[f32], stride: usize, n: usize, scores: &mut [f32]) {
    for t in 0..n {
        score_row(q, scores, t, n, &vals[t * stride..t * stride + d]);
    }
}

/// Row `t`'s score for each query (`scores[g * n + t]`): one `dot8` per query. The row-at-a-time
/// kernels and the decoded rows' both go through here, so their scores agree bit for bit.
#[inline(always)]
fn score_row(q: &[f32], scores: &mut [f32], t: usize, n: usize, row: &[f32]) {
    for (qg, s) in q
        .chunks_exact(row.len())
        .zip(scores.iter_mut().skip(t).step_by(n))
    {
        *s = dot8(qg, row);
    }
}

/// `acc[g] += w[g * n + t] * row` for each query of non-zero weight: the one sum both the
/// row-at-a-time kernels and the decoded rows' use.
#[inline(always)]
fn add_weighted_row(acc: &mut [f32], w: &[f32], t: usize, n: usize, row: &[f32]) {
    for (ag, &wg) in acc
        .chunks_exact_mut(row.len())
        .zip(w.iter().skip(t).step_by(n))
    {
        if wg == 0.0 {
            continue;
        }
        for (a, &v) in ag.iter_mut().zip(row.iter()) {
            *a += wg * v;
        }
    }
}

/// [`decoded_dot`] compiled for AVX2 (the same operations in the same order).
///
/// # Safety
/// The CPU must have AVX2 and FMA; shapes checked by the caller.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn decoded_dot_avx2(
    d: usize,
    q: &[f32],
    vals: &[f32],
    stride: usize,
    n: usize,
    scores: &mut [f32],
) {
    decoded_dot(d, q, vals, stride, n, scores)
}

/// `n` decoded rows of `d` values at `stride` fit in `vals`.
fn check_decoded(vals: &[f32], stride: usize, n: usize, d: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let need = (n - 1)
        .checked_mul(stride)
        .and_then(|x| x.checked_add(d))
        .ok_or(Error::SizeOverflow {
            what: "decoded rows",
        })?;
    if stride < d || vals.len() < need {
        return Err(Error::BufferTooSmall {
            what: "decoded rows",
            needed: need.max(d),
            found: vals.len(),
        });
    }
    Ok(())
}

/// [`RowCodec::dot_rows_multi`] one row at a time: the row's rotated values, then a dot
/// product per query (shapes checked by the caller).
#[inline(always)]
fn rowwise_dot(
    c: &RowCodec,
    q: &[f32],
    rows: HeadRows,
    n: usize,
    scores: &mut [f32],
) -> Result<()> {
    let d = c.dim();
    let mut vals = [0f32; MAX_HEAD_DIM];
    let vals = &mut vals[..d];
    for t in 0..n {
        let row = &rows.bytes[t * rows.stride..t * rows.stride + c.row_bytes()];
        if !scales_finite(c, row) {
            for s in scores.iter_mut().skip(t).step_by(n) {
                *s = f32::NAN;
            }
            continue;
        }
        c.dequantize_row_rotated(row, vals)?;
        score_row(q, scores, t, n, vals);
    }
    Ok(())
}

/// [`RowCodec::accumulate_rows_multi`] one row at a time (shapes checked by the caller).
#[inline(always)]
fn rowwise_accumulate(
    c: &RowCodec,
    w: &[f32],
    rows: HeadRows,
    n: usize,
    acc: &mut [f32],
) -> Result<()> {
    let d = c.dim();
    let mut vals = [0f32; MAX_HEAD_DIM];
    let vals = &mut vals[..d];
    for t in 0..n {
        if w.iter().skip(t).step_by(n).all(|&x| x == 0.0) {
            continue;
        }
        let row = &rows.bytes[t * rows.stride..t * rows.stride + c.row_bytes()];
        if !scales_finite(c, row) {
            for (ag, &wg) in acc.chunks_exact_mut(d).zip(w.iter().skip(t).step_by(n)) {
                if wg != 0.0 {
                    ag.fill(f32::NAN);
                }
            }
            continue;
        }
        c.dequantize_row_rotated(row, vals)?;
        add_weighted_row(acc, w, t, n, vals);
    }
    Ok(())
}

/// Calls `$f::<BITS, NB, $z>` for the shape `($bits, $nb)` (2-4 bits, 1, 2 or 4
/// blocks: every block-format shape).
#[cfg(target_arch = "x86_64")]
macro_rules! by_shape {
    ($f:ident, $z:expr, $bits:expr, $nb:expr, $($arg:expr),*) => {
        match ($bits, $nb) {
            (2, 1) => $f::<2, 1, $z>($($arg),*),
            (2, 2) => $f::<2, 2, $z>($($arg),*),
            (2, 4) => $f::<2, 4, $z>($($arg),*),
            (3, 1) => $f::<3, 1, $z>($($arg),*),
            (3, 2) => $f::<3, 2, $z>($($arg),*),
            (3, 4) => $f::<3, 4, $z>($($arg),*),
            (4, 1) => $f::<4, 1, $z>($($arg),*),
            (4, 2) => $f::<4, 2, $z>($($arg),*),
            (4, 4) => $f::<4, 4, $z>($($arg),*),
            _ => return Err(Error::Unsupported {
                what: "kvq block kernel shape (bits, blocks)",
                value: i64::from($bits),
            }),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::attention::avx2::{permute_in, permute_out};
    use super::super::simd::block::{self, BLOCK};
    use super::super::simd::block512;
    use super::*;

    /// What the block decoder needs, made once per call.
    #[derive(Clone, Copy)]
    struct Kit {
        lo: __m256,
        hi: __m256,
        lanes: __m256i,
        c512: Option<block512::Consts>,
    }

    /// # Safety
    /// The CPU must have AVX2, and AVX-512F when `Z`.
    #[inline(always)]
    unsafe fn kit<const Z: bool>(c: &RowCodec, bits: u32, group: usize) -> Kit {
        // SAFETY: features guaranteed by the caller; register operations and loads from
        // the 16-entry table.
        unsafe {
            let (lo, hi) = block::tables(bits, c.table());
            Kit {
                lo,
                hi,
                lanes: block::lane_scale_index(bits, group),
                c512: if Z {
                    Some(block512::consts(bits, c.table()))
                } else {
                    None
                },
            }
        }
    }

    /// The row's values before the factor returned, in block lane order (`None`: a
    /// non-finite scale).
    ///
    /// # Safety
    /// As [`block::row_levels`] (and [`block512::row_levels`] when `Z`).
    #[inline(always)]
    unsafe fn decode<const BITS: u32, const NB: usize, const Z: bool>(
        row: *const u8,
        n_scales: usize,
        group: usize,
        k: &Kit,
        vals: *mut f32,
    ) -> Option<f32> {
        // SAFETY: as the caller guarantees.
        unsafe {
            if let (true, Some(c)) = (Z, k.c512) {
                return block512::row_levels::<BITS, NB>(row, n_scales, group, k.lanes, c, vals);
            }
            block::row_levels::<BITS, NB>(row, n_scales, group, k.lanes, k.lo, k.hi, vals)
        }
    }

    /// `sum q[i] v[i]` over `64 * NB` values (two accumulators, lanes summed at the end).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA (and AVX-512F when `Z`); `q` and `v` readable for
    /// `64 * NB` floats.
    #[inline(always)]
    unsafe fn dotv<const NB: usize, const Z: bool>(q: *const f32, v: *const f32) -> f32 {
        // SAFETY: as the caller guarantees; loads stay inside the `64 * NB` floats.
        unsafe {
            if Z {
                let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                for k in (0..4 * NB).step_by(2) {
                    a0 = _mm512_fmadd_ps(
                        _mm512_loadu_ps(q.add(16 * k)),
                        _mm512_loadu_ps(v.add(16 * k)),
                        a0,
                    );
                    a1 = _mm512_fmadd_ps(
                        _mm512_loadu_ps(q.add(16 * k + 16)),
                        _mm512_loadu_ps(v.add(16 * k + 16)),
                        a1,
                    );
                }
                return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
            }
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for k in (0..8 * NB).step_by(2) {
                a0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(q.add(8 * k)),
                    _mm256_loadu_ps(v.add(8 * k)),
                    a0,
                );
                a1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(q.add(8 * k + 8)),
                    _mm256_loadu_ps(v.add(8 * k + 8)),
                    a1,
                );
            }
            block::hsum(_mm256_add_ps(a0, a1))
        }
    }

    /// `a[i] += w v[i]` over `64 * NB` values.
    ///
    /// # Safety
    /// As [`dotv`], `a` writable.
    #[inline(always)]
    unsafe fn axpy<const NB: usize, const Z: bool>(w: f32, v: *const f32, a: *mut f32) {
        // SAFETY: as the caller guarantees.
        unsafe {
            if Z {
                let ws = _mm512_set1_ps(w);
                for k in 0..4 * NB {
                    let p = a.add(16 * k);
                    let x = _mm512_fmadd_ps(ws, _mm512_loadu_ps(v.add(16 * k)), _mm512_loadu_ps(p));
                    _mm512_storeu_ps(p, x);
                }
                return;
            }
            let ws = _mm256_set1_ps(w);
            for k in 0..8 * NB {
                let p = a.add(8 * k);
                let x = _mm256_fmadd_ps(ws, _mm256_loadu_ps(v.add(8 * k)), _mm256_loadu_ps(p));
                _mm256_storeu_ps(p, x);
            }
        }
    }

    /// The block path of `dot_rows_multi` (shapes checked by the caller).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C (AVX-512F when `Z`); `rows` holds `n` rows of
    /// `c`; `q.len() = G * 64 * NB`, `scores.len() = G * n`.
    #[inline(always)]
    pub(super) unsafe fn dot_block<const BITS: u32, const NB: usize, const Z: bool>(
        c: &RowCodec,
        q: &[f32],
        rows: HeadRows,
        n: usize,
        scores: &mut [f32],
    ) -> Result<()> {
        let d = BLOCK * NB;
        let (ns, group) = (c.n_scales(), c.dim() / c.n_scales());
        // SAFETY: features as the caller guarantees.
        let k = unsafe { kit::<Z>(c, BITS, group) };
        let mut qp = Aligned([0f32; PASS * MAX_HEAD_DIM]);
        let mut vals = Aligned([0f32; MAX_HEAD_DIM]);
        let base = rows.bytes.as_ptr();
        for (pass, qs) in q.chunks(PASS * d).enumerate() {
            let gc = qs.len() / d;
            for (qg, pg) in qs.chunks_exact(d).zip(qp.0.chunks_exact_mut(d)) {
                permute_in(BITS, qg, pg);
            }
            let out = &mut scores[pass * PASS * n..(pass * PASS + gc) * n];
            for t in 0..n {
                // SAFETY: row `t` is inside `rows.bytes` (checked by the caller); `vals`
                // holds `64 * NB` floats; features as above.
                let f = unsafe {
                    decode::<BITS, NB, Z>(
                        base.add(t * rows.stride),
                        ns,
                        group,
                        &k,
                        vals.0.as_mut_ptr(),
                    )
                };
                let Some(f) = f else {
                    for s in out.iter_mut().skip(t).step_by(n) {
                        *s = f32::NAN;
                    }
                    continue;
                };
                for (gi, s) in out.iter_mut().skip(t).step_by(n).enumerate() {
                    // SAFETY: query `gi` of the pass is at `gi * d` of `qp` (`gi < PASS`);
                    // both hold `d = 64 * NB` floats there.
                    *s = f * unsafe { dotv::<NB, Z>(qp.0.as_ptr().add(gi * d), vals.0.as_ptr()) };
                }
            }
        }
        Ok(())
    }

    /// `a[r][i] += wf[r][t] v_t[i]` for `R` sums (`a`: `R x 64 * NB`, query `r` at `r * 64 *
    /// NB`) over the `cn` decoded rows of a chunk (`vals`: row `t` at `t * 64 * NB`, factor
    /// `fs[t]`, `live[t]` whether it was decoded; weights `w[r * n + c0 + t]`), each sum held
    /// in registers across the chunk. Each value gets `fma(w f, v, a)` row after row, as
    /// [`axpy`] gives it; a weight of 0 skips the row, a poisoned row makes the sum NaN.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA (and AVX-512F when `Z`); `R * 4 * NB <= 16` when `Z`,
    /// `R * 8 * NB <= 8` otherwise; `vals` readable for `cn` rows, `a` for `R` sums.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn axpy_chunk<const NB: usize, const Z: bool, const R: usize>(
        w: &[f32],
        n: usize,
        c0: usize,
        cn: usize,
        live: &[bool],
        fs: &[Option<f32>],
        vals: *const f32,
        a: *mut f32,
    ) {
        let d = BLOCK * NB;
        // SAFETY: as the caller guarantees; every load and store stays inside the `R` sums
        // and the `cn` rows.
        unsafe {
            if Z {
                let nv = 4 * NB;
                let mut r512 = [_mm512_setzero_ps(); 16];
                for r in 0..R {
                    for k in 0..nv {
                        r512[r * nv + k] = _mm512_loadu_ps(a.add(r * d + 16 * k));
                    }
                }
                for t in 0..cn {
                    if !live[t] {
                        continue;
                    }
                    let row = vals.add(t * d);
                    for r in 0..R {
                        let wg = w[r * n + c0 + t];
                        if wg == 0.0 {
                            continue;
                        }
                        match fs[t] {
                            Some(f) => {
                                let ws = _mm512_set1_ps(wg * f);
                                for k in 0..nv {
                                    r512[r * nv + k] = _mm512_fmadd_ps(
                                        ws,
                                        _mm512_loadu_ps(row.add(16 * k)),
                                        r512[r * nv + k],
                                    );
                                }
                            }
                            None => {
                                for k in 0..nv {
                                    r512[r * nv + k] = _mm512_set1_ps(f32::NAN);
                                }
                            }
                        }
                    }
                }
                for r in 0..R {
                    for k in 0..nv {
                        _mm512_storeu_ps(a.add(r * d + 16 * k), r512[r * nv + k]);
                    }
                }
                return;
            }
            let nv = 8 * NB;
            let mut r256 = [_mm256_setzero_ps(); 8];
            for r in 0..R {
                for k in 0..nv {
                    r256[r * nv + k] = _mm256_loadu_ps(a.add(r * d + 8 * k));
                }
            }
            for t in 0..cn {
                if !live[t] {
                    continue;
                }
                let row = vals.add(t * d);
                for r in 0..R {
                    let wg = w[r * n + c0 + t];
                    if wg == 0.0 {
                        continue;
                    }
                    match fs[t] {
                        Some(f) => {
                            let ws = _mm256_set1_ps(wg * f);
                            for k in 0..nv {
                                r256[r * nv + k] = _mm256_fmadd_ps(
                                    ws,
                                    _mm256_loadu_ps(row.add(8 * k)),
                                    r256[r * nv + k],
                                );
                            }
                        }
                        None => {
                            for k in 0..nv {
                                r256[r * nv + k] = _mm256_set1_ps(f32::NAN);
                            }
                        }
                    }
                }
            }
            for r in 0..R {
                for k in 0..nv {
                    _mm256_storeu_ps(a.add(r * d + 8 * k), r256[r * nv + k]);
                }
            }
        }
    }

    /// The block path of `accumulate_rows_multi` (shapes checked by the caller): each sum is
    /// permuted into block lane order in place, accumulated, and permuted back. Rows are
    /// decoded a chunk at a time, each once for all queries; then each query's sum (or a few
    /// queries' sums together) stays in registers across the chunk (where they fit: 512-bit
    /// vectors, or 256-bit ones and 64-value rows), else it is added row by row in memory.
    /// Each value of each sum gets the same operations in the same order either way.
    ///
    /// # Safety
    /// As [`dot_block`], with `w` (`G * n`) and `acc` (`G * 64 * NB`).
    #[inline(always)]
    pub(super) unsafe fn accumulate_block<const BITS: u32, const NB: usize, const Z: bool>(
        c: &RowCodec,
        w: &[f32],
        rows: HeadRows,
        n: usize,
        acc: &mut [f32],
    ) -> Result<()> {
        let d = BLOCK * NB;
        let (ns, group) = (c.n_scales(), c.dim() / c.n_scales());
        // SAFETY: features as the caller guarantees.
        let k = unsafe { kit::<Z>(c, BITS, group) };
        let mut tmp = [0f32; MAX_HEAD_DIM];
        let tmp = &mut tmp[..d];
        for ag in acc.chunks_exact_mut(d) {
            tmp.copy_from_slice(ag);
            permute_in(BITS, tmp, ag);
        }
        let base = rows.bytes.as_ptr();
        let g = acc.len() / d;
        let in_registers = Z || NB == 1;
        if !in_registers || g == 1 {
            let mut vals = Aligned([0f32; MAX_HEAD_DIM]);
            for t in 0..n {
                if w.iter().skip(t).step_by(n).all(|&x| x == 0.0) {
                    continue;
                }
                // SAFETY: as in `dot_block`.
                let f = unsafe {
                    decode::<BITS, NB, Z>(
                        base.add(t * rows.stride),
                        ns,
                        group,
                        &k,
                        vals.0.as_mut_ptr(),
                    )
                };
                for (ag, &wg) in acc.chunks_exact_mut(d).zip(w.iter().skip(t).step_by(n)) {
                    if wg == 0.0 {
                        continue;
                    }
                    match f {
                        // SAFETY: `ag` and `vals` hold `d = 64 * NB` floats; features as above.
                        Some(f) => unsafe {
                            axpy::<NB, Z>(wg * f, vals.0.as_ptr(), ag.as_mut_ptr())
                        },
                        None => ag.fill(f32::NAN),
                    }
                }
            }
        } else {
            // written row by row before any read (only decoded rows are read): not zeroed,
            // which would cost as much as a small call's work
            let mut vals = std::mem::MaybeUninit::<Aligned<{ CHUNK * MAX_HEAD_DIM }>>::uninit();
            let vbase = vals.as_mut_ptr().cast::<f32>();
            let mut fs = [None; CHUNK];
            let mut live = [false; CHUNK];
            for c0 in (0..n).step_by(CHUNK) {
                let cn = CHUNK.min(n - c0);
                for t in 0..cn {
                    live[t] = w.iter().skip(c0 + t).step_by(n).any(|&x| x != 0.0);
                    if live[t] {
                        // SAFETY: as in `dot_block`; row `t` of the chunk at `t * d` of `vals`.
                        fs[t] = unsafe {
                            decode::<BITS, NB, Z>(
                                base.add((c0 + t) * rows.stride),
                                ns,
                                group,
                                &k,
                                vbase.add(t * d),
                            )
                        };
                    }
                }
                // queries whose sums fit the registers together: 16 vectors of 512 bits,
                // 8 of 256
                let r = if Z { 4 / NB } else { 1 };
                let mut qi = 0;
                while qi < g {
                    // four, two or one queries' sums, as many as the registers hold
                    let take = match r.min(g - qi) {
                        3 => 2,
                        k => k,
                    };
                    let wq = &w[qi * n..];
                    let aq = acc[qi * d..].as_mut_ptr();
                    let vp = vbase.cast_const();
                    // SAFETY: queries `qi..qi + take` exist, their sums at `qi * d`; the
                    // chunk's `cn` rows decoded; `take <= r` keeps the sums in the registers
                    // axpy_chunk asks for.
                    unsafe {
                        match take {
                            4 => axpy_chunk::<NB, Z, 4>(wq, n, c0, cn, &live, &fs, vp, aq),
                            2 => axpy_chunk::<NB, Z, 2>(wq, n, c0, cn, &live, &fs, vp, aq),
                            _ => axpy_chunk::<NB, Z, 1>(wq, n, c0, cn, &live, &fs, vp, aq),
                        }
                    }
                    qi += take;
                }
            }
        }
        for ag in acc.chunks_exact_mut(d) {
            tmp.copy_from_slice(ag);
            permute_out(BITS, tmp, ag);
        }
        Ok(())
    }

    /// `dot_rows_multi` compiled with AVX2, FMA and F16C.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; shapes checked by the caller.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(
        c: &RowCodec,
        q: &[f32],
        rows: HeadRows,
        n: usize,
        scores: &mut [f32],
    ) -> Result<()> {
        let bits = u32::from(c.bits());
        if c.block_rows(rows.bytes, rows.stride).is_none() {
            return rowwise_dot(c, q, rows, n, scores);
        }
        // SAFETY: features enabled here; shapes checked by the caller.
        unsafe {
            by_shape!(
                dot_block,
                false,
                bits,
                c.dim() / BLOCK,
                c,
                q,
                rows,
                n,
                scores
            )
        }
    }

    /// `accumulate_rows_multi` compiled with AVX2, FMA and F16C.
    ///
    /// # Safety
    /// As [`dot`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn accumulate(
        c: &RowCodec,
        w: &[f32],
        rows: HeadRows,
        n: usize,
        acc: &mut [f32],
    ) -> Result<()> {
        let bits = u32::from(c.bits());
        if c.block_rows(rows.bytes, rows.stride).is_none() {
            return rowwise_accumulate(c, w, rows, n, acc);
        }
        // SAFETY: features enabled here; shapes checked by the caller.
        unsafe {
            by_shape!(
                accumulate_block,
                false,
                bits,
                c.dim() / BLOCK,
                c,
                w,
                rows,
                n,
                acc
            )
        }
    }
}

/// The AVX-512F entry points of the tile calls: the block decoder and the dot products /
/// axpys in 512-bit vectors (`Z = true` of the shared block loops in [`avx2`]), run only
/// when [`crate::Isa::detect`] saw AVX-512F.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::simd::block::BLOCK;
    use super::avx2::{accumulate_block, dot_block};
    use super::*;

    /// `dot_rows_multi` with the 512-bit block decoder and vectors.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, AVX2, FMA and F16C; shapes checked by the caller.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot(
        c: &RowCodec,
        q: &[f32],
        rows: HeadRows,
        n: usize,
        scores: &mut [f32],
    ) -> Result<()> {
        let bits = u32::from(c.bits());
        if c.block_rows(rows.bytes, rows.stride).is_none() {
            return rowwise_dot(c, q, rows, n, scores);
        }
        // SAFETY: features enabled here; shapes checked by the caller.
        unsafe {
            by_shape!(
                dot_block,
                true,
                bits,
                c.dim() / BLOCK,
                c,
                q,
                rows,
                n,
                scores
            )
        }
    }

    /// `accumulate_rows_multi` with the 512-bit block decoder and vectors.
    ///
    /// # Safety
    /// As [`dot`].
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn accumulate(
        c: &RowCodec,
        w: &[f32],
        rows: HeadRows,
        n: usize,
        acc: &mut [f32],
    ) -> Result<()> {
        let bits = u32::from(c.bits());
        if c.block_rows(rows.bytes, rows.stride).is_none() {
            return rowwise_accumulate(c, w, rows, n, acc);
        }
        // SAFETY: features enabled here; shapes checked by the caller.
        unsafe {
            by_shape!(
                accumulate_block,
                true,
                bits,
                c.dim() / BLOCK,
                c,
                w,
                rows,
                n,
                acc
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_SEED;
    use crate::isa::Isa;
    use crate::Method;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    /// Every ISA this CPU runs, the portable one first.
    fn isas() -> Vec<Isa> {
        let d = Isa::detect();
        let mut v = vec![Isa::PORTABLE];
        if d.is_avx2() {
            v.push(d.without_avx512());
        }
        if d.is_avx512() {
            v.push(d);
        }
        v
    }

    struct Case {
        packed: Vec<u8>,
        stride: usize,
        n: usize,
    }

    /// `n` rows of `c`, `stride` bytes apart (3 heads a token), row 5 poisoned.
    fn case(c: &RowCodec, n: usize) -> Case {
        let (d, rb) = (c.dim(), c.row_bytes());
        let stride = 3 * rb + 1;
        let x = values(n * d, 7 + c.bits() as u64 + d as u64);
        let mut packed = vec![0u8; (n - 1) * stride + rb];
        for t in 0..n {
            let row = &mut packed[t * stride..t * stride + rb];
            c.quantize_row(&x[t * d..(t + 1) * d], row).unwrap();
        }
        packed[5 * stride..5 * stride + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
        Case { packed, stride, n }
    }

    #[test]
    fn decoded_rows_read_as_the_row_at_a_time_path_bit_for_bit() {
        for method in [Method::LloydMax, Method::Uniform { group: 32 }] {
            for d in [64usize, 128] {
                for bits in 2u8..=8 {
                    let Ok(base) = RowCodec::new(method, bits, d, DEFAULT_SEED) else {
                        continue;
                    };
                    let cs = case(&base, 37);
                    let rows = HeadRows {
                        bytes: &cs.packed,
                        stride: cs.stride,
                    };
                    let n = cs.n;
                    for isa in isas() {
                        let c = base.with_isa(isa);
                        if !c.multi_decodes_rows() {
                            assert!(
                                isa.is_avx2() && (2..=4).contains(&bits),
                                "only the block kernels decode in blocks"
                            );
                            continue;
                        }
                        // decoded once, laid out as a scratch of 2 heads a token
                        let stride = 2 * d + 3;
                        let mut vals = vec![0f32; (n - 1) * stride + d];
                        for t in 0..n {
                            let row = &cs.packed[t * cs.stride..];
                            c.decode_row_for_multi(row, &mut vals[t * stride..t * stride + d])
                                .unwrap();
                        }
                        for g in [1usize, 3] {
                            let q = values(g * d, 3 + g as u64);
                            let mut w = values(g * n, 11);
                            w.iter_mut().step_by(4).for_each(|x| *x = 0.0);
                            for gi in 0..g {
                                w[gi * n + 5] = if gi == 0 { 1.0 } else { 0.0 };
                            }
                            let (mut s1, mut s2) = (vec![0f32; g * n], vec![0f32; g * n]);
                            c.dot_rows_multi(&q, rows, n, &mut s1).unwrap();
                            c.dot_decoded_multi(&q, &vals, stride, n, &mut s2).unwrap();
                            let bits_of =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits_of(&s1),
                                bits_of(&s2),
                                "scores, {bits} bits d {d} g {g}"
                            );
                            let (mut a1, mut a2) = (values(g * d, 5), values(g * d, 5));
                            c.accumulate_rows_multi(&w, rows, n, &mut a1).unwrap();
                            c.accumulate_decoded_multi(&w, &vals, stride, n, &mut a2)
                                .unwrap();
                            assert_eq!(bits_of(&a1), bits_of(&a2), "sums, {bits} bits d {d} g {g}");
                        }
                        // shapes are checked
                        let mut s = vec![0f32; n];
                        assert!(c
                            .dot_decoded_multi(&values(d, 1), &vals[..stride], stride, n, &mut s)
                            .is_err());
                        assert!(c
                            .decode_row_for_multi(
                                &cs.packed[..c.row_bytes() - 1],
                                &mut vec![0f32; d]
                            )
                            .is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn multi_equals_single_queries_and_the_portable_path() {
        for method in [Method::LloydMax, Method::Uniform { group: 32 }] {
            for d in [64usize, 128, 256] {
                for bits in 2u8..=8 {
                    let Ok(base) = RowCodec::new(method, bits, d, DEFAULT_SEED) else {
                        continue;
                    };
                    let cs = case(&base, 37);
                    let rows = HeadRows {
                        bytes: &cs.packed,
                        stride: cs.stride,
                    };
                    let n = cs.n;
                    for g in [1usize, 3, 9] {
                        let q = values(g * d, 3 + g as u64);
                        let mut w = values(g * n, 11);
                        w.iter_mut().step_by(4).for_each(|x| *x = 0.0);
                        // row 5 (poisoned): weighted by query 0 only
                        for gi in 0..g {
                            w[gi * n + 5] = if gi == 0 { 1.0 } else { 0.0 };
                        }
                        let mut want_s = vec![0f32; g * n];
                        let mut want_a = values(g * d, 5);
                        let p = base.portable();
                        p.dot_rows_multi(&q, rows, n, &mut want_s).unwrap();
                        p.accumulate_rows_multi(&w, rows, n, &mut want_a).unwrap();
                        for isa in isas() {
                            let c = base.with_isa(isa);
                            let mut s = vec![0f32; g * n];
                            let mut a = values(g * d, 5);
                            c.dot_rows_multi(&q, rows, n, &mut s).unwrap();
                            c.accumulate_rows_multi(&w, rows, n, &mut a).unwrap();
                            for gi in 0..g {
                                // one query at a time: bit for bit the same
                                let mut s1 = vec![0f32; n];
                                let mut a1 = values(g * d, 5)[gi * d..(gi + 1) * d].to_vec();
                                c.dot_rows_multi(&q[gi * d..(gi + 1) * d], rows, n, &mut s1)
                                    .unwrap();
                                c.accumulate_rows_multi(&w[gi * n..(gi + 1) * n], rows, n, &mut a1)
                                    .unwrap();
                                let tag = format!("{method:?} d{d} b{bits} g{g}/{gi} {isa:?}");
                                for t in 0..n {
                                    let (x, y) = (s[gi * n + t], s1[t]);
                                    assert!(x.to_bits() == y.to_bits(), "{tag} t{t}: {x} {y}");
                                }
                                for (x, y) in a[gi * d..(gi + 1) * d].iter().zip(&a1) {
                                    assert!(x.to_bits() == y.to_bits(), "{tag}: {x} {y}");
                                }
                                // against the portable loops: to rounding
                                let qn = q[gi * d..(gi + 1) * d]
                                    .iter()
                                    .map(|x| x * x)
                                    .sum::<f32>()
                                    .sqrt();
                                let mut v = vec![0f32; d];
                                for t in 0..n {
                                    let (x, y) = (s[gi * n + t], want_s[gi * n + t]);
                                    if t == 5 {
                                        assert!(x.is_nan() && y.is_nan(), "{tag}");
                                        continue;
                                    }
                                    let row = &cs.packed[t * cs.stride..];
                                    p.dequantize_row_rotated(&row[..p.row_bytes()], &mut v)
                                        .unwrap();
                                    let vn = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                                    assert!((x - y).abs() <= 1e-5 * qn * vn, "{tag} t{t}: {x} {y}");
                                }
                                let big = want_a[gi * d..(gi + 1) * d]
                                    .iter()
                                    .fold(1f32, |m, x| m.max(x.abs()));
                                for (x, y) in a[gi * d..(gi + 1) * d]
                                    .iter()
                                    .zip(&want_a[gi * d..(gi + 1) * d])
                                {
                                    if gi == 0 {
                                        assert!(x.is_nan() && y.is_nan(), "{tag}");
                                    } else {
                                        assert!((x - y).abs() <= 1e-5 * big, "{tag}: {x} {y}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let c = RowCodec::new(Method::LloydMax, 4, 64, DEFAULT_SEED).unwrap();
        let cs = case(&c, 8);
        let rows = HeadRows {
            bytes: &cs.packed,
            stride: cs.stride,
        };
        let q = values(2 * 64, 1);
        let mut s = vec![0f32; 2 * 8];
        assert!(c.dot_rows_multi(&q[..100], rows, 8, &mut s).is_err());
        assert!(c.dot_rows_multi(&q, rows, 8, &mut s[..15]).is_err());
        assert!(c.dot_rows_multi(&q, rows, 9, &mut [0f32; 18]).is_err());
        let short = HeadRows {
            bytes: &cs.packed,
            stride: c.row_bytes() - 1,
        };
        assert!(c.dot_rows_multi(&q, short, 8, &mut s).is_err());
        let mut a = vec![0f32; 2 * 64];
        assert!(c.accumulate_rows_multi(&s[..15], rows, 8, &mut a).is_err());
        assert!(c.accumulate_rows_multi(&s, rows, 8, &mut a[..100]).is_err());
        assert!(c.dot_rows_multi(&q, rows, 8, &mut s).is_ok());
        assert!(c.accumulate_rows_multi(&s, rows, 8, &mut a).is_ok());
    }
}
