//! Decode attention on packed rows: one query against every cached token of a head.
//!
//! `out = sum_t softmax_t(scale * q.k_t) v_t` where `k_t` and `v_t` are read from packed
//! rows. The query is rotated once (`q.k = (Rq).(Rk)`), the weighted sum of V is formed in
//! the rotated domain and un-rotated once (`sum p_t v_t = R^T sum p_t (R v_t)`). The caller
//! gives `scores` (one `f32` per token); nothing is allocated. The loop is compiled twice,
//! portable and with AVX2+FMA+F16C enabled, and [`Isa`] picks one at run time. On AVX2,
//! rows of 2-4-bit codes (Lloyd-Max or uniform; a uniform group's scale is a lane's)
//! go through block kernels: the query is permuted once into the lane order in which a
//! 64-code block unpacks with one shift per eight codes, each eight codes become values
//! with one or two `vpermps`, and V is accumulated in registers in that order and put back
//! once; rows of 5-8 bits go through per-row gather kernels. The AVX2 softmax is a
//! vectorized `exp` (within 2 ulp). AVX2 results agree with the portable path to rounding
//! (tests: within 1e-5 of the output's largest magnitude), not bit for bit.
//!
//! [`attend_head_f16`] is the same kernel on an f16 cache, the baseline `kvc bench quant`
//! measures packed attention against.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::rotation::MAX_HEAD_DIM;
use super::row::dot8;
use super::LayerCodec;
use crate::error::{Error, Result};
use crate::isa::{dispatch, Isa};

/// Where one head's packed rows are: row `t` starts at byte `t * stride` of the slice.
#[derive(Debug, Clone, Copy)]
pub struct HeadRows<'a> {
    /// The bytes (row 0 at offset 0).
    pub bytes: &'a [u8],
    /// Bytes from one token's row to the next (`row_bytes` for a head-major cache,
    /// `n_kv_head * row_bytes` for a token-major one).
    pub stride: usize,
}

pub(super) fn check_rows(
    what: &'static str,
    rows: &HeadRows,
    n: usize,
    row_bytes: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if rows.stride < row_bytes {
        return Err(Error::InvalidValue {
            what: "row stride",
            value: rows.stride as i64,
            reason: "smaller than row_bytes",
        });
    }
    let need = (n - 1)
        .checked_mul(rows.stride)
        .and_then(|v| v.checked_add(row_bytes))
        .ok_or(Error::SizeOverflow {
            what: "packed rows extent",
        })?;
    if rows.bytes.len() < need {
        return Err(Error::BufferTooSmall {
            what,
            needed: need,
            found: rows.bytes.len(),
        });
    }
    Ok(())
}

fn check_len(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected != found {
        return Err(Error::LayoutMismatch {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// One decode step of one head on packed K and V: `n_tokens` rows each, `q` and `out` of
/// `head_dim` values, `scale` the score factor (usually `1/sqrt(head_dim)`), `scores` at
/// least `n_tokens` long (scratch). With no tokens the output is zeros.
///
/// Errors: K and V codecs of different head_dim, wrong `q`/`out` lengths, short scratch,
/// rows that do not fit their buffers, a non-finite `q` or scale, or a packed row with a
/// non-finite scale ([`Error::CorruptRow`], naming the token).
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    isa: Isa,
    layer: &LayerCodec,
    q: &[f32],
    k: HeadRows,
    v: HeadRows,
    n_tokens: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let d = layer.k.dim();
    check_len("V head_dim", d, layer.v.dim())?;
    check_len("query (head_dim)", d, q.len())?;
    check_len("output (head_dim)", d, out.len())?;
    if scores.len() < n_tokens {
        return Err(Error::BufferTooSmall {
            what: "scores scratch (f32 per token)",
            needed: n_tokens,
            found: scores.len(),
        });
    }
    check_rows("packed K rows", &k, n_tokens, layer.k.row_bytes())?;
    check_rows("packed V rows", &v, n_tokens, layer.v.row_bytes())?;
    if !scale.is_finite() {
        return Err(Error::BadValue {
            what: "attention scale",
            row: 0,
            element: 0,
            value: scale,
            reason: "is not finite",
        });
    }
    if let Some(i) = q.iter().position(|x| !x.is_finite()) {
        return Err(Error::BadValue {
            what: "query",
            row: 0,
            element: i,
            value: q[i],
            reason: "is not finite",
        });
    }
    let scores = &mut scores[..n_tokens];
    // The kernels need the shapes and rows checked above.
    dispatch!(isa,
        portable => attend_body(
            layer,
            q,
            k,
            v,
            scale,
            scores,
            out,
            |qr, row, t| layer.k.dot_rotated_portable(qr, row, t),
            |row, w, acc, t| layer.v.accumulate_rotated(row, w, acc, t),
        ),
        avx2 => avx2::attend(layer, q, k, v, scale, scores, out),
        avx512 => avx2::attend_avx512(layer, q, k, v, scale, scores, out),
    )
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::super::simd::block::Rows;
    use super::super::simd::block::{self, block_code, BLOCK};
    use super::super::simd::block512;
    use super::*;
    use std::arch::x86_64::{
        _mm_loadu_ps, _mm_movehl_ps, _mm_movelh_ps, _mm_storeu_ps, _mm_unpackhi_ps, _mm_unpacklo_ps,
    };

    /// Calls the block kernel `$m::$f::<BITS, NB>` for the shape `($bits, $nb)`.
    macro_rules! by_shape {
        ($m:ident, $f:ident, $bits:expr, $nb:expr, $($arg:expr),*) => {
            match ($bits, $nb) {
                (2, 1) => $m::$f::<2, 1>($($arg),*),
                (2, 2) => $m::$f::<2, 2>($($arg),*),
                (2, 4) => $m::$f::<2, 4>($($arg),*),
                (3, 1) => $m::$f::<3, 1>($($arg),*),
                (3, 2) => $m::$f::<3, 2>($($arg),*),
                (3, 4) => $m::$f::<3, 4>($($arg),*),
                (4, 1) => $m::$f::<4, 1>($($arg),*),
                (4, 2) => $m::$f::<4, 2>($($arg),*),
                (4, 4) => $m::$f::<4, 4>($($arg),*),
                _ => return Err(Error::Unsupported {
                    what: "kvq block kernel shape (bits, blocks)",
                    value: i64::from($bits),
                }),
            }
        };
    }

    fn corrupt(t: usize) -> Error {
        Error::CorruptRow {
            what: "f16 scale",
            row: t,
        }
    }

    /// [`attend_body`] compiled with AVX2, FMA and F16C: rows of 2-4-bit codes go through
    /// the block kernels (query permuted into their lane order once, V accumulated in that
    /// order and put back once), the others through the per-row gather kernels; the
    /// softmax is [`block::softmax`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend(
        layer: &LayerCodec,
        q: &[f32],
        k: HeadRows,
        v: HeadRows,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) -> Result<()> {
        // SAFETY: AVX2, FMA and F16C are enabled here (only called after `Isa::detect`).
        unsafe { attend_impl::<false>(layer, q, k, v, scale, scores, out) }
    }

    /// [`attend`] with the 512-bit block kernels ([`block512`]) for 2-4-bit rows. Only
    /// those kernels are AVX-512 functions; the rest stays AVX2 code.
    /// On our test machine (`kvc bench quant`, one core, 32k tokens) 4-bit rows, which
    /// need two `vpermps` and a blend per eight values on AVX2, run about 1.7x faster;
    /// 2- and 3-bit rows about as fast as on AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_avx512(
        layer: &LayerCodec,
        q: &[f32],
        k: HeadRows,
        v: HeadRows,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) -> Result<()> {
        // SAFETY: AVX-512F, AVX2, FMA and F16C are on this CPU (only called after
        // `Isa::detect` saw them).
        unsafe { attend_impl::<true>(layer, q, k, v, scale, scores, out) }
    }

    /// [`block512::scores`] for rows of `bits` and `nb` blocks, as one AVX-512 function.
    ///
    /// # Safety
    /// As [`block512::scores`].
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn scores512(
        bits: u32,
        nb: usize,
        qp: &[f32],
        rows: Rows,
        t: &[f32; 16],
        scale: f32,
        scores: &mut [f32],
    ) -> Result<std::result::Result<(), usize>> {
        // SAFETY: as the caller guarantees.
        unsafe {
            Ok(by_shape!(
                block512, scores, bits, nb, qp, rows, t, scale, scores
            ))
        }
    }

    /// [`block512::accumulate`] for rows of `bits` and `nb` blocks, as one AVX-512
    /// function.
    ///
    /// # Safety
    /// As [`block512::accumulate`].
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn accumulate512(
        bits: u32,
        nb: usize,
        w: &[f32],
        rows: Rows,
        t: &[f32; 16],
        acc: &mut [f32],
    ) -> Result<std::result::Result<(), usize>> {
        // SAFETY: as the caller guarantees.
        unsafe { Ok(by_shape!(block512, accumulate, bits, nb, w, rows, t, acc)) }
    }

    /// The body of [`attend`] (`Z`: the 512-bit block kernels).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C, and AVX-512F when `Z`.
    #[inline(always)]
    unsafe fn attend_impl<const Z: bool>(
        layer: &LayerCodec,
        q: &[f32],
        k: HeadRows,
        v: HeadRows,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) -> Result<()> {
        let d = layer.k.dim();
        let nb = d / BLOCK;
        let mut qr = [0f32; MAX_HEAD_DIM];
        let qr = &mut qr[..d];
        qr.copy_from_slice(q);
        layer.k.rotation().rotate(qr);
        let kbits = u32::from(layer.k.bits());
        match layer.k.block_rows(k.bytes, k.stride) {
            Some(rows) => {
                let mut qp = [0f32; MAX_HEAD_DIM];
                permute_in(kbits, qr, &mut qp[..d]);
                let qp = &qp[..d];
                // SAFETY: AVX2, FMA and F16C are enabled here (this function is only
                // called after `Isa::detect` saw them); `attend_head` checked that every
                // one of the `scores.len()` rows fits in `k.bytes` at `k.stride`; `qp`
                // holds `64 * nb` values.
                unsafe {
                    let t = layer.k.table();
                    let r = 'r: {
                        if Z {
                            break 'r scores512(kbits, nb, qp, rows, t, scale, scores)?;
                        }
                        by_shape!(block, scores, kbits, nb, qp, rows, t, scale, scores)
                    };
                    r.map_err(corrupt)?
                };
            }
            None => {
                for (t, s) in scores.iter_mut().enumerate() {
                    let row = &k.bytes[t * k.stride..];
                    // SAFETY: AVX2 and FMA are enabled here (see above).
                    *s = scale * unsafe { layer.k.dot_rotated_avx2(qr, row, t)? };
                }
            }
        }
        let mut acc = [0f32; MAX_HEAD_DIM];
        let acc = &mut acc[..d];
        if !scores.is_empty() {
            // SAFETY: AVX2 and FMA are enabled here (see above).
            let inv = unsafe { block::softmax(scores) };
            let vbits = u32::from(layer.v.bits());
            match layer.v.block_rows(v.bytes, v.stride) {
                Some(rows) => {
                    for s in scores.iter_mut() {
                        *s *= inv;
                    }
                    let mut accp = [0f32; MAX_HEAD_DIM];
                    let w: &[f32] = scores;
                    // SAFETY: as for K: features enabled, every row of `v` checked by
                    // `attend_head`, `accp` holds `64 * nb` values.
                    unsafe {
                        let a = &mut accp[..d];
                        let t = layer.v.table();
                        let r = 'r: {
                            if Z {
                                break 'r accumulate512(vbits, nb, w, rows, t, a)?;
                            }
                            by_shape!(block, accumulate, vbits, nb, w, rows, t, a)
                        };
                        r.map_err(corrupt)?
                    };
                    permute_out(vbits, &accp[..d], acc);
                }
                None => {
                    for (t, &p) in scores.iter().enumerate() {
                        let row = &v.bytes[t * v.stride..];
                        // SAFETY: AVX2 and FMA are enabled here (see above).
                        unsafe { layer.v.accumulate_rotated_avx2(row, p * inv, acc, t)? };
                    }
                }
            }
            layer.v.rotation().unrotate(acc);
        }
        out.copy_from_slice(acc);
        Ok(())
    }

    /// `dst[8 n + j] = src[8 j + n]` over one block of 64 values (an 8 x 8 transpose, its own
    /// inverse), in four 4 x 4 SSE transposes (SSE2 is part of x86-64).
    #[inline(always)]
    fn transpose8(src: &[f32], dst: &mut [f32]) {
        let (src, dst) = (&src[..BLOCK], &mut dst[..BLOCK]);
        for jb in [0usize, 4] {
            for nb in [0usize, 4] {
                // SAFETY: SSE2 is baseline on x86-64; rows `jb..jb + 4`, columns `nb..nb + 4`
                // of `src` and the transposed block of `dst` lie inside the 64 values.
                unsafe {
                    let r0 = _mm_loadu_ps(src.as_ptr().add(8 * jb + nb));
                    let r1 = _mm_loadu_ps(src.as_ptr().add(8 * (jb + 1) + nb));
                    let r2 = _mm_loadu_ps(src.as_ptr().add(8 * (jb + 2) + nb));
                    let r3 = _mm_loadu_ps(src.as_ptr().add(8 * (jb + 3) + nb));
                    let t0 = _mm_unpacklo_ps(r0, r1);
                    let t1 = _mm_unpacklo_ps(r2, r3);
                    let t2 = _mm_unpackhi_ps(r0, r1);
                    let t3 = _mm_unpackhi_ps(r2, r3);
                    let d = dst.as_mut_ptr();
                    _mm_storeu_ps(d.add(8 * nb + jb), _mm_movelh_ps(t0, t1));
                    _mm_storeu_ps(d.add(8 * (nb + 1) + jb), _mm_movehl_ps(t1, t0));
                    _mm_storeu_ps(d.add(8 * (nb + 2) + jb), _mm_movelh_ps(t2, t3));
                    _mm_storeu_ps(d.add(8 * (nb + 3) + jb), _mm_movehl_ps(t3, t2));
                }
            }
        }
    }

    /// `qp` = `q` in block lane order: `qp[64 b + 8 n + j] = q[64 b + block_code(n, j)]`.
    pub(crate) fn permute_in(bits: u32, q: &[f32], qp: &mut [f32]) {
        if bits != 2 {
            for (qb, pb) in q.chunks_exact(BLOCK).zip(qp.chunks_exact_mut(BLOCK)) {
                transpose8(qb, pb);
            }
            return;
        }
        for (qb, pb) in q.chunks_exact(BLOCK).zip(qp.chunks_exact_mut(BLOCK)) {
            for n in 0..8 {
                for j in 0..8 {
                    pb[8 * n + j] = qb[block_code(bits, n, j)];
                }
            }
        }
    }

    /// The inverse of [`permute_in`].
    pub(crate) fn permute_out(bits: u32, ap: &[f32], a: &mut [f32]) {
        if bits != 2 {
            for (pb, ab) in ap.chunks_exact(BLOCK).zip(a.chunks_exact_mut(BLOCK)) {
                transpose8(pb, ab);
            }
            return;
        }
        for (pb, ab) in ap.chunks_exact(BLOCK).zip(a.chunks_exact_mut(BLOCK)) {
            for n in 0..8 {
                for j in 0..8 {
                    ab[block_code(bits, n, j)] = pb[8 * n + j];
                }
            }
        }
    }

    /// [`f16_body`] compiled with AVX2 and FMA, with the same softmax as the packed
    /// kernel.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn attend_f16(
        q: &[f32],
        k: &[f16],
        v: &[f16],
        stride: usize,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        // SAFETY: AVX2 and FMA are enabled here (only called after `Isa::detect`).
        f16_body(q, k, v, stride, scale, scores, out, |s| unsafe {
            block::softmax(s)
        })
    }
}

/// Softmax of `scores` in place (max subtracted); returns `1 / sum`.
#[inline(always)]
fn softmax(scores: &mut [f32]) -> f32 {
    let m = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - m).exp();
        sum += *s;
    }
    1.0 / sum
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body(
    layer: &LayerCodec,
    q: &[f32],
    k: HeadRows,
    v: HeadRows,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
    dot: impl Fn(&[f32], &[u8], usize) -> Result<f32>,
    axpy: impl Fn(&[u8], f32, &mut [f32], usize) -> Result<()>,
) -> Result<()> {
    let d = layer.k.dim();
    let mut qr = [0f32; MAX_HEAD_DIM];
    let qr = &mut qr[..d];
    qr.copy_from_slice(q);
    layer.k.rotation().rotate(qr);
    for (t, s) in scores.iter_mut().enumerate() {
        let row = &k.bytes[t * k.stride..];
        *s = scale * dot(qr, row, t)?;
    }
    let mut acc = [0f32; MAX_HEAD_DIM];
    let acc = &mut acc[..d];
    if !scores.is_empty() {
        let inv = softmax(scores);
        for (t, &p) in scores.iter().enumerate() {
            let row = &v.bytes[t * v.stride..];
            axpy(row, p * inv, acc, t)?;
        }
        layer.v.rotation().unrotate(acc);
    }
    out.copy_from_slice(acc);
    Ok(())
}

/// The same decode step on an f16 cache (`k`, `v`: row `t` at element `t * stride`,
/// `head_dim = q.len()` values): the baseline for packed attention. Rows are converted to
/// `f32` one at a time on the stack, as the packed kernel decodes its rows.
#[allow(clippy::too_many_arguments)]
pub fn attend_head_f16(
    isa: Isa,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    n_tokens: usize,
    stride: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let d = q.len();
    super::rotation::check_head_dim(d)?;
    check_len("output (head_dim)", d, out.len())?;
    if scores.len() < n_tokens {
        return Err(Error::BufferTooSmall {
            what: "scores scratch (f32 per token)",
            needed: n_tokens,
            found: scores.len(),
        });
    }
    for (what, buf) in [("f16 K rows", k), ("f16 V rows", v)] {
        let rows = HeadRows {
            bytes: bytemuck_len(buf),
            stride: stride.saturating_mul(2),
        };
        check_rows(what, &rows, n_tokens, 2 * d)?;
    }
    let scores = &mut scores[..n_tokens];
    // The kernel needs the rows checked above.
    dispatch!(isa,
        portable => f16_body(q, k, v, stride, scale, scores, out, softmax),
        avx2 => avx2::attend_f16(q, k, v, stride, scale, scores, out),
    );
    Ok(())
}

/// `q . row` for one f16 row of `q.len()` values (64, 128 or 256), converted to f32 on the
/// stack and summed in eight lanes, with the loops [`attend_head_f16`] uses: the per-row
/// baseline `kvc bench quant` measures [`RowCodec::dot_rotated`](super::RowCodec::dot_rotated) against.
pub fn dot_f16_row(isa: Isa, q: &[f32], row: &[f16]) -> Result<f32> {
    super::rotation::check_head_dim(q.len())?;
    check_len("f16 row (head_dim)", q.len(), row.len())?;
    // The kernel needs the lengths checked above.
    Ok(dispatch!(isa,
        portable => f16_dot_body(q, row),
        avx2 => avx2_f16_dot(q, row),
    ))
}

#[inline(always)]
fn f16_dot_body(q: &[f32], row: &[f16]) -> f32 {
    let mut buf = [0f32; MAX_HEAD_DIM];
    let buf = &mut buf[..q.len()];
    row.convert_to_f32_slice(buf);
    dot8(q, buf)
}

/// [`f16_dot_body`] compiled with AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_f16_dot(q: &[f32], row: &[f16]) -> f32 {
    f16_dot_body(q, row)
}

/// One f16 row to f32 (`out.len() == row.len()`, 64, 128 or 256): the per-row baseline
/// of [`RowCodec::dequantize_row_rotated`](super::RowCodec::dequantize_row_rotated) in `kvc bench quant`.
pub fn f16_row_to_f32(row: &[f16], out: &mut [f32]) -> Result<()> {
    super::rotation::check_head_dim(out.len())?;
    check_len("f16 row (head_dim)", out.len(), row.len())?;
    row.convert_to_f32_slice(out);
    Ok(())
}

/// A zero-copy byte view for the length check only (never read).
fn bytemuck_len(x: &[f16]) -> &[u8] {
    // SAFETY: f16 is 2 plain bytes with no padding; the view covers exactly the same memory
    // and lives as long as `x`.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn f16_body(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    stride: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
    softmax: impl Fn(&mut [f32]) -> f32,
) {
    let d = q.len();
    let mut row = [0f32; MAX_HEAD_DIM];
    let row = &mut row[..d];
    for (t, s) in scores.iter_mut().enumerate() {
        k[t * stride..t * stride + d].convert_to_f32_slice(row);
        *s = scale * dot8(q, row);
    }
    let mut acc = [0f32; MAX_HEAD_DIM];
    let acc = &mut acc[..d];
    if !scores.is_empty() {
        let inv = softmax(scores);
        for (t, &p) in scores.iter().enumerate() {
            v[t * stride..t * stride + d].convert_to_f32_slice(row);
            let w = p * inv;
            for (a, &x) in acc.iter_mut().zip(row.iter()) {
                *a += w * x;
            }
        }
    }
    out.copy_from_slice(acc);
}

/// One decode step of every query head of a layer, threads over heads (rayon).
///
/// The cache is token-major, as llama.cpp keeps it: row `(t, h)` of K is at byte
/// `(t * n_kv_head + h) * k.row_bytes()` of `k_rows` (likewise V). `q` and `out` hold
/// `n_head * head_dim` values; query head `i` reads KV head `i / (n_head / n_kv_head)`
/// (grouped-query attention). `scores` is scratch of at least `n_head * n_tokens`.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    isa: Isa,
    layer: &LayerCodec,
    q: &[f32],
    k_rows: &[u8],
    v_rows: &[u8],
    n_tokens: usize,
    n_kv_head: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let (kb, vb) = (layer.k.row_bytes(), layer.v.row_bytes());
    let k = CacheRows {
        bytes: k_rows,
        token_stride: n_kv_head.saturating_mul(kb),
        head_stride: kb,
    };
    let v = CacheRows {
        bytes: v_rows,
        token_stride: n_kv_head.saturating_mul(vb),
        head_stride: vb,
    };
    attend_heads_strided(isa, layer, q, k, v, n_tokens, n_kv_head, scale, scores, out)
}

/// Packed rows of every KV head of a cache, at any layout: row `(t, h)` starts at byte
/// `h * head_stride + t * token_stride` of `bytes`. Token-major (llama.cpp):
/// `token_stride = n_kv_head * row_bytes`, `head_stride = row_bytes`; head-major (an
/// `[H, S, D]` cache of `S` slots per head): `token_stride = row_bytes`, `head_stride = S *
/// row_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct CacheRows<'a> {
    /// The bytes (row `(0, 0)` at offset 0).
    pub bytes: &'a [u8],
    /// Bytes from one token's row to the next of the same head (at least `row_bytes`).
    pub token_stride: usize,
    /// Bytes from one KV head's first row to the next head's.
    pub head_stride: usize,
}

/// [`attend_heads`] on a cache of any layout ([`CacheRows`]). Errors: those of
/// `attend_heads`, a token stride shorter than a row, and a cache whose last row ends past
/// its bytes. All or nothing: every packed row is checked before `out` is written.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads_strided(
    isa: Isa,
    layer: &LayerCodec,
    q: &[f32],
    k_rows: CacheRows,
    v_rows: CacheRows,
    n_tokens: usize,
    n_kv_head: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let d = layer.k.dim();
    if n_kv_head == 0
        || !q.len().is_multiple_of(d)
        || !(q.len() / d).is_multiple_of(n_kv_head)
        || q.is_empty()
    {
        return Err(Error::InvalidValue {
            what: "query heads / n_kv_head",
            value: n_kv_head as i64,
            reason: "q must hold n_head * head_dim values, n_head a non-zero multiple of n_kv_head",
        });
    }
    let n_head = q.len() / d;
    check_len("output (n_head x head_dim)", q.len(), out.len())?;
    let need = n_head.checked_mul(n_tokens).ok_or(Error::SizeOverflow {
        what: "scores scratch",
    })?;
    if scores.len() < need {
        return Err(Error::BufferTooSmall {
            what: "scores scratch (n_head x n_tokens f32)",
            needed: need,
            found: scores.len(),
        });
    }
    let group = n_head / n_kv_head;
    // The byte after the last row: (n_kv_head - 1) * head_stride + (n_tokens - 1) *
    // token_stride + row_bytes; token rows of a head must not overlap.
    let rows = |c: &CacheRows, rb: usize| -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        if c.token_stride < rb {
            return Err(Error::InvalidValue {
                what: "token stride (bytes)",
                value: c.token_stride as i64,
                reason: "shorter than a packed row",
            });
        }
        let extent = (n_kv_head - 1)
            .checked_mul(c.head_stride)
            .and_then(|a| {
                (n_tokens - 1)
                    .checked_mul(c.token_stride)
                    .and_then(|b| a.checked_add(b))
            })
            .and_then(|e| e.checked_add(rb))
            .ok_or(Error::SizeOverflow {
                what: "packed cache bytes",
            })?;
        if c.bytes.len() < extent {
            return Err(Error::BufferTooSmall {
                what: "packed cache (n_tokens x n_kv_head rows)",
                needed: extent,
                found: c.bytes.len(),
            });
        }
        Ok(())
    };
    rows(&k_rows, layer.k.row_bytes())?;
    rows(&v_rows, layer.v.row_bytes())?;
    if !scale.is_finite() {
        return Err(Error::BadValue {
            what: "attention scale",
            row: 0,
            element: 0,
            value: scale,
            reason: "is not finite",
        });
    }
    if let Some(i) = q.iter().position(|x| !x.is_finite()) {
        return Err(Error::BadValue {
            what: "query",
            row: i / d,
            element: i % d,
            value: q[i],
            reason: "is not finite",
        });
    }
    // All or nothing: every packed row is checked before any head writes `out` (the
    // heads run in parallel, so a corrupt row found inside one would leave the others
    // written). The error names the row as `token * n_kv_head + head`.
    for (what, c, codec) in [
        ("K row f16 scale", &k_rows, &layer.k),
        ("V row f16 scale", &v_rows, &layer.v),
    ] {
        let rb = codec.row_bytes();
        for h in 0..n_kv_head {
            for t in 0..n_tokens {
                let at = h * c.head_stride + t * c.token_stride;
                codec
                    .check_packed_rows(&c.bytes[at..at + rb])
                    .map_err(|e| match e {
                        Error::CorruptRow { .. } => Error::CorruptRow {
                            what,
                            row: t * n_kv_head + h,
                        },
                        e => e,
                    })?;
            }
        }
    }
    if n_tokens == 0 {
        out.fill(0.0);
        return Ok(());
    }
    out.par_chunks_mut(d)
        .zip(q.par_chunks(d))
        .zip(scores[..need].par_chunks_mut(n_tokens))
        .enumerate()
        .try_for_each(|(h, ((o, qh), sc))| {
            let kvh = h / group;
            let k = HeadRows {
                bytes: k_rows.bytes.get(kvh * k_rows.head_stride..).unwrap_or(&[]),
                stride: k_rows.token_stride,
            };
            let v = HeadRows {
                bytes: v_rows.bytes.get(kvh * v_rows.head_stride..).unwrap_or(&[]),
                stride: v_rows.token_stride,
            };
            attend_head(isa, layer, qh, k, v, n_tokens, scale, sc, o)
        })
}
