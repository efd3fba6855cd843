//! `kvc_kvq_block_*`: kvq packed rows addressed by `(head_dim, bits)` alone, with no
//! handle, for engines whose type system names a row format by a number and calls its
//! kernels through plain function pointers (ggml's type traits: `from_float`, `to_float`,
//! `vec_dot`). One block is one row of `head_dim` values, Lloyd-Max codes with the
//! default rotation seed (`docs/formats/kvq.md`, format version 1): exactly the bytes
//! `kvc_kvq_quantize_rows` writes for the config `k<bits>v<bits>:lm`.
//!
//! Two things differ from the handle API, because a type trait returns nothing and runs
//! once per cell inside an engine's attention loop:
//! - **Poisoned rows instead of errors.** A row holding a non-finite value (or one whose
//!   scale overflows f16) is stored with an f16 NaN scale; reading such a row gives NaN
//!   values and NaN dot products. The engine sees NaN exactly where an f16 cache would hold
//!   inf or NaN, never a plausible wrong number. Any other row is bit-exact kvq.
//! - **Rotated-basis entry points.** `kvc_kvq_block_rotate` turns a query into the
//!   rotated basis once, `kvc_kvq_block_dot` dots it with packed rows without rotating
//!   again, and `kvc_kvq_block_dequantize_rotated` returns rows in the rotated basis so
//!   that an attention kernel can accumulate softmax-weighted V there and call
//!   `kvc_kvq_block_unrotate` once on the output.
//!
//! The codecs are built on first use and shared by every thread (read-only).

use std::sync::OnceLock;

use kvc_kvq::attention::HeadRows;
use kvc_kvq::config::DEFAULT_SEED;
use kvc_kvq::row::{poison_row, row_scale_is_finite as scale_is_finite};
use kvc_kvq::{Method, RowCodec};

use crate::boundary::{in_slice, out_ref, out_slice, status_boundary};
use crate::error::Error;
use crate::status::KvcStatus;

/// head_dims with a block format, in table order.
const DIMS: [usize; 3] = [64, 128, 256];
/// Bits with a block format: 2..=8.
const MIN_BITS: u32 = 2;
const MAX_BITS: u32 = 8;
const N_BITS: usize = (MAX_BITS - MIN_BITS + 1) as usize;

static CODECS: [OnceLock<RowCodec>; DIMS.len() * N_BITS] = [const { OnceLock::new() }; 21];

fn dim_index(head_dim: u32) -> Result<usize, Error> {
    DIMS.iter()
        .position(|&d| d == head_dim as usize)
        .ok_or_else(|| Error::invalid("head_dim", format!("{head_dim} is not 64, 128 or 256")))
}

/// The shared codec of one block format.
fn codec(head_dim: u32, bits: u32) -> Result<&'static RowCodec, Error> {
    let di = dim_index(head_dim)?;
    if !(MIN_BITS..=MAX_BITS).contains(&bits) {
        return Err(Error::invalid("bits", format!("{bits} is not in 2..=8")));
    }
    let slot = &CODECS[di * N_BITS + (bits - MIN_BITS) as usize];
    if let Some(c) = slot.get() {
        return Ok(c);
    }
    let c = RowCodec::new(
        Method::LloydMax,
        bits as u8,
        head_dim as usize,
        DEFAULT_SEED,
    )?;
    Ok(slot.get_or_init(|| c))
}

/// The number of blocks in `n_values`, which must be a whole number of them.
fn blocks(n_values: usize, head_dim: usize) -> Result<usize, Error> {
    if !n_values.is_multiple_of(head_dim) {
        return Err(Error::invalid(
            "n_values",
            format!("{n_values} is not a multiple of head_dim {head_dim}"),
        ));
    }
    Ok(n_values / head_dim)
}

/// Packed bytes of `n` blocks, or an error on overflow.
fn packed_size(c: &RowCodec, n: usize) -> Result<usize, Error> {
    n.checked_mul(c.row_bytes())
        .ok_or_else(|| Error::invalid("n_values", "the packed size overflows"))
}

fn short(what: &'static str, needed: usize, found: usize) -> Error {
    kvc_kvq::Error::BufferTooSmall {
        what,
        needed,
        found,
    }
    .into()
}

/// Bytes of one packed block (row) of `head_dim` values at `bits` bits, written to
/// `*out`: `2 + head_dim * bits / 8` (one f16 scale, then the codes).
/// `KVC_INVALID_ARGUMENT` for a head_dim other than 64, 128 or 256 or bits outside 2..=8.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_bytes(
    head_dim: u32,
    bits: u32,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_block_bytes", || {
        let c = codec(head_dim, bits)?;
        // SAFETY: caller contract.
        let o = unsafe { out_ref(out, "out") }?;
        *o = c.row_bytes();
        Ok(())
    })
}

/// Quantizes `n_values` floats at `src` (a whole number of rows of `head_dim`) into
/// packed blocks at `dst` (`dst_len` bytes, at least `n_values / head_dim` blocks; only
/// those are written). A row with a non-finite value, or too large for an f16 scale, is
/// written poisoned (see the module notes) and is not an error. No allocation.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `src` readable for `n_values` floats; `dst` writable for `dst_len` bytes, not
/// overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_quantize(
    head_dim: u32,
    bits: u32,
    src: *const f32,
    n_values: usize,
    dst: *mut u8,
    dst_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_block_quantize", || {
        let c = codec(head_dim, bits)?;
        let n = blocks(n_values, c.dim())?;
        let need = packed_size(c, n)?;
        if dst_len < need {
            return Err(short("dst (blocks * block bytes)", need, dst_len));
        }
        crate::boundary::check_disjoint(
            src.cast(),
            n_values.saturating_mul(4),
            dst.cast_const(),
            need,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let x = unsafe { in_slice(src, n_values, "src") }?;
        // SAFETY: as above; disjoint from `src` (checked).
        let d = unsafe { out_slice(dst, need, "dst") }?;
        for (xr, o) in x
            .chunks_exact(c.dim())
            .zip(d.chunks_exact_mut(c.row_bytes()))
        {
            if c.quantize_row(xr, o).is_err() {
                // Non-finite input or a scale beyond f16: nothing was written; poison.
                poison_row(o);
            }
        }
        Ok(())
    })
}

/// Shared body of the two dequantize entry points.
///
/// # Safety
/// As `kvc_kvq_block_dequantize`.
#[allow(clippy::too_many_arguments)]
unsafe fn dequantize(
    function: &str,
    head_dim: u32,
    bits: u32,
    src: *const u8,
    src_len: usize,
    dst: *mut f32,
    n_values: usize,
    rotated: bool,
) -> KvcStatus {
    status_boundary(function, || {
        let c = codec(head_dim, bits)?;
        let n = blocks(n_values, c.dim())?;
        let need = packed_size(c, n)?;
        if src_len < need {
            return Err(short("src (blocks * block bytes)", need, src_len));
        }
        crate::boundary::check_disjoint(
            src,
            need,
            dst.cast_const().cast(),
            n_values.saturating_mul(4),
            "dst",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let p = unsafe { in_slice(src, need, "src") }?;
        // SAFETY: as above; disjoint from `src` (checked).
        let y = unsafe { out_slice(dst, n_values, "dst") }?;
        for (row, out) in p
            .chunks_exact(c.row_bytes())
            .zip(y.chunks_exact_mut(c.dim()))
        {
            if !scale_is_finite(row) {
                out.fill(f32::NAN);
                continue;
            }
            if rotated {
                c.dequantize_row_rotated(row, out)?;
            } else {
                c.dequantize_row(row, out)?;
            }
        }
        Ok(())
    })
}

/// Dequantizes `n_values` floats (a whole number of `head_dim` rows) from packed blocks
/// at `src` (`src_len` bytes, at least that many blocks) into `dst`. A poisoned row (an
/// f16 NaN or infinite scale) gives `head_dim` NaNs. No allocation.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `src` readable for `src_len` bytes; `dst` writable for `n_values` floats, not
/// overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_dequantize(
    head_dim: u32,
    bits: u32,
    src: *const u8,
    src_len: usize,
    dst: *mut f32,
    n_values: usize,
) -> KvcStatus {
    // SAFETY: the same contract.
    unsafe {
        dequantize(
            "kvc_kvq_block_dequantize",
            head_dim,
            bits,
            src,
            src_len,
            dst,
            n_values,
            false,
        )
    }
}

/// As `kvc_kvq_block_dequantize`, but the rows stay in the rotated basis (`R x`, the
/// basis the codes live in): for a kernel that sums weighted rows and calls
/// `kvc_kvq_block_unrotate` once on the sum.
///
/// Threads: safe from any thread.
///
/// # Safety
/// As `kvc_kvq_block_dequantize`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_dequantize_rotated(
    head_dim: u32,
    bits: u32,
    src: *const u8,
    src_len: usize,
    dst: *mut f32,
    n_values: usize,
) -> KvcStatus {
    // SAFETY: the same contract.
    unsafe {
        dequantize(
            "kvc_kvq_block_dequantize_rotated",
            head_dim,
            bits,
            src,
            src_len,
            dst,
            n_values,
            true,
        )
    }
}

/// Shared body of rotate / unrotate.
///
/// # Safety
/// `x` readable and writable for `n_values` floats.
unsafe fn rotation_in_place(
    function: &str,
    head_dim: u32,
    x: *mut f32,
    n_values: usize,
    inverse: bool,
) -> KvcStatus {
    status_boundary(function, || {
        // Any bit width shares the rotation of its head_dim.
        let c = codec(head_dim, MIN_BITS)?;
        blocks(n_values, c.dim())?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let v = unsafe { out_slice(x, n_values, "x") }?;
        for row in v.chunks_exact_mut(c.dim()) {
            if inverse {
                c.rotation().unrotate(row);
            } else {
                c.rotation().rotate(row);
            }
        }
        Ok(())
    })
}

/// Rotates `n_values` floats at `x` (a whole number of `head_dim` rows) in place into the
/// basis of the block formats of this head_dim: `x <- R x` per row (the seeded Hadamard
/// rotation of `docs/formats/kvq.md`, default seed). Dot products are kept:
/// `q . k = (R q) . (R k)`.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `x` readable and writable for `n_values` floats.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_rotate(
    head_dim: u32,
    x: *mut f32,
    n_values: usize,
) -> KvcStatus {
    // SAFETY: the same contract.
    unsafe { rotation_in_place("kvc_kvq_block_rotate", head_dim, x, n_values, false) }
}

/// The inverse of `kvc_kvq_block_rotate`, in place: `x <- R^T x` per row.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `x` readable and writable for `n_values` floats.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_unrotate(
    head_dim: u32,
    x: *mut f32,
    n_values: usize,
) -> KvcStatus {
    // SAFETY: the same contract.
    unsafe { rotation_in_place("kvc_kvq_block_unrotate", head_dim, x, n_values, true) }
}

/// The dot product of `n_values` packed values at `packed` (`packed_len` bytes, a whole
/// number of blocks) with `n_values` floats at `q_rot`, a query already rotated with
/// `kvc_kvq_block_rotate`, summed over the blocks, written to `*out`. Equal to the dot
/// product of the unrotated query with the dequantized row, up to rounding. A poisoned
/// row gives NaN. No allocation.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `packed` readable for `packed_len` bytes; `q_rot` readable for `n_values` floats;
/// `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_dot(
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    packed_len: usize,
    q_rot: *const f32,
    n_values: usize,
    out: *mut f32,
) -> KvcStatus {
    status_boundary("kvc_kvq_block_dot", || {
        let c = codec(head_dim, bits)?;
        let n = blocks(n_values, c.dim())?;
        let need = packed_size(c, n)?;
        if packed_len < need {
            return Err(short("packed (blocks * block bytes)", need, packed_len));
        }
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let p = unsafe { in_slice(packed, need, "packed") }?;
        // SAFETY: as above.
        let q = unsafe { in_slice(q_rot, n_values, "q_rot") }?;
        // SAFETY: caller contract.
        let o = unsafe { out_ref(out, "out") }?;
        let mut s = 0f32;
        for (row, qr) in p.chunks_exact(c.row_bytes()).zip(q.chunks_exact(c.dim())) {
            if !scale_is_finite(row) {
                s = f32::NAN;
                continue;
            }
            s += c.dot_rotated(qr, row, 0)?;
        }
        *o = s;
        Ok(())
    })
}

/// Bytes a strided run of `n_rows` rows spans: `(n_rows - 1) * stride + row_bytes`, or an
/// error when `stride` is shorter than a row or the span overflows.
fn strided_span(c: &RowCodec, stride: usize, n_rows: usize) -> Result<usize, Error> {
    if n_rows == 0 {
        return Ok(0);
    }
    if stride < c.row_bytes() {
        return Err(Error::invalid(
            "stride",
            format!("{stride} is shorter than a row ({} bytes)", c.row_bytes()),
        ));
    }
    (n_rows - 1)
        .checked_mul(stride)
        .and_then(|v| v.checked_add(c.row_bytes()))
        .ok_or_else(|| Error::invalid("n_rows", "(n_rows - 1) * stride + row bytes overflows"))
}

/// The codec of `(head_dim, bits)` and the bytes a strided run of `n_rows` rows spans at
/// `packed`, or `None` for no rows (nothing is read then, and `packed` may be NULL).
///
/// # Safety
/// `packed` readable for `(n_rows - 1) * stride + row bytes` when `n_rows > 0`.
unsafe fn strided_rows<'a>(
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    stride: usize,
    n_rows: usize,
) -> Result<Option<(&'static RowCodec, &'a [u8])>, Error> {
    let c = codec(head_dim, bits)?;
    let span = strided_span(c, stride, n_rows)?;
    if n_rows == 0 {
        return Ok(None);
    }
    // SAFETY: caller contract; NULL, alignment and size are checked.
    let p = unsafe { in_slice(packed, span, "packed") }?;
    Ok(Some((c, p)))
}

/// The float counts of a tile call's per-query arrays (`n_queries x head_dim`: queries or
/// sums) and of its grid (`n_queries x n_rows`: scores or weights), or an error when either
/// overflows.
fn tile_lens(dim: usize, n_queries: usize, n_rows: usize) -> Result<(usize, usize), Error> {
    let per_query = n_queries
        .checked_mul(dim)
        .ok_or_else(|| Error::invalid("n_queries", "n_queries * head_dim overflows"))?;
    let grid = n_queries
        .checked_mul(n_rows)
        .ok_or_else(|| Error::invalid("n_queries", "n_queries * n_rows overflows"))?;
    Ok((per_query, grid))
}

/// Checks that a tile call's output (`out`, `out_len` floats) overlaps neither its float
/// input (`input`, `input_len` floats) nor the packed rows; `name` is the output's.
fn check_output_disjoint(
    out: *mut f32,
    out_len: usize,
    input: *const f32,
    input_len: usize,
    packed: &[u8],
    name: &'static str,
) -> Result<(), Error> {
    let out_bytes = out_len.saturating_mul(4);
    let out = out.cast_const().cast();
    crate::boundary::check_disjoint(
        out,
        out_bytes,
        input.cast(),
        input_len.saturating_mul(4),
        name,
    )?;
    crate::boundary::check_disjoint(out, out_bytes, packed.as_ptr(), packed.len(), name)
}

/// The shared body of the `_dot_rows` entry points: `n_queries` rotated queries against a
/// strided tile of rows, `scores` `n_queries x n_rows`.
///
/// # Safety
/// As `kvc_kvq_block_dot_rows_multi`.
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows(
    function: &str,
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    stride: usize,
    n_rows: usize,
    q_rot: *const f32,
    n_queries: usize,
    scores: *mut f32,
) -> KvcStatus {
    status_boundary(function, || {
        // SAFETY: caller contract.
        let Some((c, p)) = unsafe { strided_rows(head_dim, bits, packed, stride, n_rows) }? else {
            return Ok(());
        };
        let (nq, ns) = tile_lens(c.dim(), n_queries, n_rows)?;
        if n_queries == 0 {
            return Ok(());
        }
        check_output_disjoint(scores, ns, q_rot, nq, p, "scores")?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let q = unsafe { in_slice(q_rot, nq, "q_rot") }?;
        // SAFETY: as above; disjoint from the inputs (checked).
        let s = unsafe { out_slice(scores, ns, "scores") }?;
        c.dot_rows_multi(q, HeadRows { bytes: p, stride }, n_rows, s)?;
        Ok(())
    })
}

/// The dot products of one rotated query (`head_dim` floats at `q_rot`, from
/// `kvc_kvq_block_rotate`) with `n_rows` packed rows, row `i` at `packed + i * stride`
/// (`stride >= ` the row's bytes; an engine's cache keeps one head's rows a token apart),
/// written to `scores[i]`. A poisoned row scores NaN. No allocation. One call per tile of
/// cells instead of one per cell: what an attention kernel's inner loop calls. Each score
/// equals `kvc_kvq_block_dot` of that row up to rounding (the tile runs kvq's block
/// kernels); it equals `kvc_kvq_block_dot_rows_multi` with one query bit for bit.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `packed` readable for `(n_rows - 1) * stride + row bytes`; `q_rot` readable for
/// `head_dim` floats; `scores` writable for `n_rows` floats, not overlapping the inputs.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_dot_rows(
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    stride: usize,
    n_rows: usize,
    q_rot: *const f32,
    scores: *mut f32,
) -> KvcStatus {
    // SAFETY: the same contract with one query.
    unsafe {
        dot_rows(
            "kvc_kvq_block_dot_rows",
            head_dim,
            bits,
            packed,
            stride,
            n_rows,
            q_rot,
            1,
            scores,
        )
    }
}

/// `kvc_kvq_block_dot_rows` for `n_queries` rotated queries at once (`q_rot`: `n_queries x
/// head_dim` floats, query `g` at `q_rot + g * head_dim`), each packed row decoded once for
/// all of them: the query heads of one KV head under grouped-query attention. Query `g`'s
/// score of row `i` is written to `scores[g * n_rows + i]`, bit for bit what
/// `kvc_kvq_block_dot_rows` gives for that query alone. A poisoned row scores NaN for every
/// query. With no rows or no queries nothing is read or written. No allocation.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `packed` readable for `(n_rows - 1) * stride + row bytes`; `q_rot` readable for
/// `n_queries * head_dim` floats; `scores` writable for `n_queries * n_rows` floats, not
/// overlapping the inputs.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_block_dot_rows_multi(
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    stride: usize,
    n_rows: usize,
    q_rot: *const f32,
    n_queries: usize,
    scores: *mut f32,
) -> KvcStatus {
    // SAFETY: the same contract.
    unsafe {
        dot_rows(
            "kvc_kvq_block_dot_rows_multi",
            head_dim,
            bits,
            packed,
            stride,
            n_rows,
            q_rot,
            n_queries,
            scores,
        )
    }
}

/// The shared body of the `_accumulate_rows` entry points.
///
/// # Safety
/// As `kvc_kvq_block_accumulate_rows_multi`.
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_rows(
    function: &str,
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    stride: usize,
    n_rows: usize,
    weights: *const f32,
    n_queries: usize,
    acc: *mut f32,
) -> KvcStatus {
    status_boundary(function, || {
        // SAFETY: caller contract.
        let Some((c, p)) = unsafe { strided_rows(head_dim, bits, packed, stride, n_rows) }? else {
            return Ok(());
        };
        let (na, nw) = tile_lens(c.dim(), n_queries, n_rows)?;
        if n_queries == 0 {
            return Ok(());
        }
        check_output_disjoint(acc, na, weights, nw, p, "acc")?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let w = unsafe { in_slice(weights, nw, "weights") }?;
        // SAFETY: as above; disjoint from the inputs (checked).
        let a = unsafe { out_slice(acc, na, "acc") }?;
        c.accumulate_rows_multi(w, HeadRows { bytes: p, stride }, n_rows, a)?;
        Ok(())
    })
}

/// Adds `sum_i weights[i] * (rotated row i)` to the `head_dim` floats at `acc`, rows
/// strided as in `kvc_kvq_block_dot_rows`: the softmax-weighted sum of V rows, kept in the
/// rotated basis (un-rotate the final sum once with `kvc_kvq_block_unrotate`). A row of
/// weight 0 is skipped (a masked cell adds nothing, even when poisoned); a poisoned row of
/// non-zero weight makes the sum NaN. No allocation. Bit for bit
/// `kvc_kvq_block_accumulate_rows_multi` with one query.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `packed` readable for `(n_rows - 1) * stride + row bytes`; `weights` readable for
/// `n_rows` floats; `acc` readable and writable for `head_dim` floats, not overlapping the
/// inputs.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_accumulate_rows(
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    stride: usize,
    n_rows: usize,
    weights: *const f32,
    acc: *mut f32,
) -> KvcStatus {
    // SAFETY: the same contract with one query.
    unsafe {
        accumulate_rows(
            "kvc_kvq_block_accumulate_rows",
            head_dim,
            bits,
            packed,
            stride,
            n_rows,
            weights,
            1,
            acc,
        )
    }
}

/// `kvc_kvq_block_accumulate_rows` for `n_queries` queries at once, each packed row decoded
/// once for all of them: `weights` is `n_queries x n_rows` (query `g`'s weight of row `i` at
/// `weights[g * n_rows + i]`), `acc` is `n_queries x head_dim` (query `g`'s rotated sum at
/// `acc + g * head_dim`). Query `g`'s sum is bit for bit what `kvc_kvq_block_accumulate_rows`
/// gives for its weights alone: a weight of 0 skips the row for that query, a poisoned row
/// of non-zero weight makes that query's sum NaN. With no rows or no queries nothing is
/// read or written. No allocation.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `packed` readable for `(n_rows - 1) * stride + row bytes`; `weights` readable for
/// `n_queries * n_rows` floats; `acc` readable and writable for `n_queries * head_dim`
/// floats, not overlapping the inputs.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_block_accumulate_rows_multi(
    head_dim: u32,
    bits: u32,
    packed: *const u8,
    stride: usize,
    n_rows: usize,
    weights: *const f32,
    n_queries: usize,
    acc: *mut f32,
) -> KvcStatus {
    // SAFETY: the same contract.
    unsafe {
        accumulate_rows(
            "kvc_kvq_block_accumulate_rows_multi",
            head_dim,
            bits,
            packed,
            stride,
            n_rows,
            weights,
            n_queries,
            acc,
        )
    }
}
