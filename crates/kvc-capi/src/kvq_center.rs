//! `kvc_kvq_*_centered` and `kvc_kvq_mean_center` (ABI 0.11): kvq rows coded relative to a
//! fixed center per KV head (`kvc_kvq::center`). Attention on centered rows needs no
//! change for K (the softmax ignores `q . center`) and one addition of the center to each
//! head's output for V.

use kvc_kvq::center::mean_center;

use crate::boundary::{check_disjoint, in_slice, out_slice, status_boundary};
use crate::codec::KvcTensor;
use crate::handle::handle_ref;
use crate::kvq::{row_sizes, KvcKvq};
use crate::kvq_channel::short;
use crate::status::KvcStatus;

/// Quantizes `n_rows` rows as `kvc_kvq_quantize_rows` does, each coded as `row - center`:
/// `center` holds `center_len` floats, a whole number `h` of rows of `head_dim`, and row
/// `r` uses center row `r % h` (so llama.cpp-style rows, `[token][n_kv_head][head_dim]`,
/// take an `[n_kv_head][head_dim]` center). The packed rows are ordinary kvq rows.
/// Attention on them: K scores need no correction; add the V center to each head's output.
/// A center that is not whole rows, a non-finite center value, or a row whose difference
/// is not finite or beyond 2^32, is `KVC_INVALID_ARGUMENT` (the message names the row and
/// the element). All or nothing, as `kvc_kvq_quantize_rows`. No allocation.
///
/// Ownership: every buffer stays the caller's. Threads: any number of calls may share one
/// `kvq`.
///
/// # Safety
/// `kvq` a live handle; `src` readable for `n_rows * head_dim` floats; `center` readable for
/// `center_len` floats; `dst` writable for `dst_len` bytes and not overlapping either.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_quantize_rows_centered(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    src: *const f32,
    n_rows: usize,
    center: *const f32,
    center_len: usize,
    dst: *mut u8,
    dst_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_quantize_rows_centered", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        let c = h.codec(layer, tensor)?;
        let (n, need) = row_sizes(c.dim(), c.row_bytes(), n_rows)?;
        if dst_len < need {
            return Err(short("dst (n_rows * row_bytes)", need, dst_len));
        }
        check_disjoint(
            src.cast(),
            n.saturating_mul(4),
            dst.cast_const(),
            need,
            "dst",
        )?;
        check_disjoint(
            center.cast(),
            center_len.saturating_mul(4),
            dst.cast_const(),
            need,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let x = unsafe { in_slice(src, n, "src") }?;
        // SAFETY: as above.
        let cs = unsafe { in_slice(center, center_len, "center") }?;
        // SAFETY: as above; disjoint from `src` and `center` (checked).
        let d = unsafe { out_slice(dst, need, "dst") }?;
        Ok(c.quantize_rows_centered(x, cs, d)?)
    })
}

/// Dequantizes `n_rows` packed rows as `kvc_kvq_dequantize_rows` does and adds the center
/// back (row `r` center row `r % (center_len / head_dim)`): the values of rows written
/// with `kvc_kvq_quantize_rows_centered` and the same center. A center that is not whole
/// rows, or a non-finite one, is `KVC_INVALID_ARGUMENT`; a short `src`
/// `KVC_BUFFER_TOO_SMALL`. No allocation.
///
/// Ownership and threads: as `kvc_kvq_quantize_rows_centered`.
///
/// # Safety
/// `kvq` a live handle; `src` readable for `src_len` bytes; `center` readable for
/// `center_len` floats; `dst` writable for `n_rows * head_dim` floats and not overlapping
/// either.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_dequantize_rows_centered(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    src: *const u8,
    src_len: usize,
    center: *const f32,
    center_len: usize,
    dst: *mut f32,
    n_rows: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_dequantize_rows_centered", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        let c = h.codec(layer, tensor)?;
        let (n, need) = row_sizes(c.dim(), c.row_bytes(), n_rows)?;
        if src_len < need {
            return Err(short("src (n_rows * row_bytes)", need, src_len));
        }
        let out_bytes = n.saturating_mul(4);
        check_disjoint(src, need, dst.cast_const().cast(), out_bytes, "dst")?;
        check_disjoint(
            center.cast(),
            center_len.saturating_mul(4),
            dst.cast_const().cast(),
            out_bytes,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let p = unsafe { in_slice(src, need, "src") }?;
        // SAFETY: as above.
        let cs = unsafe { in_slice(center, center_len, "center") }?;
        // SAFETY: as above; disjoint from `src` and `center` (checked).
        let y = unsafe { out_slice(dst, n, "dst") }?;
        Ok(c.dequantize_rows_centered(p, cs, y)?)
    })
}

/// A center for `kvc_kvq_quantize_rows_centered`: the mean over tokens of `rows`
/// (`n_values` floats, `[token][n_kv_head][head_dim]`, at least one token) per KV head and
/// channel, rounded to f16 (the precision to store it in), written to `out` (`out_len` must
/// be `n_kv_head * head_dim`) only on success. A length that is not whole tokens or a wrong
/// `out_len`, or a non-finite value, is `KVC_INVALID_ARGUMENT`. Handle-free;
/// no allocation.
///
/// Ownership: every buffer stays the caller's. Threads: safe from any thread.
///
/// # Safety
/// `rows` readable for `n_values` floats; `out` writable for `out_len` floats and not
/// overlapping `rows`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_mean_center(
    rows: *const f32,
    n_values: usize,
    n_kv_head: u32,
    head_dim: u32,
    out: *mut f32,
    out_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_mean_center", || {
        check_disjoint(
            rows.cast(),
            n_values.saturating_mul(4),
            out.cast_const().cast(),
            out_len.saturating_mul(4),
            "out",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let x = unsafe { in_slice(rows, n_values, "rows") }?;
        // SAFETY: as above; disjoint from `rows` (checked).
        let o = unsafe { out_slice(out, out_len, "out") }?;
        Ok(mean_center(x, n_kv_head as usize, head_dim as usize, o)?)
    })
}
