//! ABI 0.12 kvq row calls (issue 38): symmetric and checkable. A dequantize ordered like
//! quantize with an output length, rows in and out as f32, f16 or bf16 (an engine with an
//! f16 cache needs no scratch or conversion of its own), and attention on a cache of any
//! layout (token-major as llama.cpp, or head-major `[H, S, D]`). Every call is all or
//! nothing: every row is checked before the output is written.

use std::ffi::c_void;

use half::{bf16, f16};
use kvc_kvq::attention::{attend_heads_strided, CacheRows};
use kvc_kvq::Isa;
use kvc_kvq::RowCodec;

use kvc_types::FloatDtype;

use crate::boundary::{in_slice, out_slice, status_boundary};
use crate::codec::KvcTensor;
use crate::convert::{KvcDtype, KVC_DTYPE_I8};
use crate::error::Error;
use crate::handle::handle_ref;
use crate::kvq::{row_sizes, KvcKvq};
use crate::status::KvcStatus;

/// The most values of one row (head_dim 256).
const MAX_D: usize = 256;

/// The row element type of a typed call: f32, f16 or bf16; `KVC_DTYPE_I8` is a dtype kvq
/// rows do not take (`KVC_UNSUPPORTED`), any other value not a dtype.
fn row_dtype(code: KvcDtype) -> Result<FloatDtype, Error> {
    match FloatDtype::from_code(code) {
        Some(d) => Ok(d),
        None if code == KVC_DTYPE_I8 => Err(Error::Wrapped {
            status: KvcStatus::KVC_UNSUPPORTED,
            message: "dtype KVC_DTYPE_I8: kvq rows are f32, f16 or bf16".into(),
        }),
        None => Err(Error::invalid(
            "dtype",
            format!(
                "{code} is not a kvc_dtype (KVC_DTYPE_F16 = 0, KVC_DTYPE_BF16 = 1, \
                 KVC_DTYPE_F32 = 2)"
            ),
        )),
    }
}

/// Typed input rows, read one row at a time into f32.
enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl Rows<'_> {
    fn row(&self, r: usize, d: usize, buf: &mut [f32]) {
        match self {
            Rows::F32(x) => buf.copy_from_slice(&x[r * d..(r + 1) * d]),
            Rows::F16(x) => {
                for (b, v) in buf.iter_mut().zip(&x[r * d..(r + 1) * d]) {
                    *b = v.to_f32();
                }
            }
            Rows::Bf16(x) => {
                for (b, v) in buf.iter_mut().zip(&x[r * d..(r + 1) * d]) {
                    *b = v.to_f32();
                }
            }
        }
    }
}

/// Quantizes `n` typed rows into `dst`: every row checked first, then written.
fn quantize_typed(c: &RowCodec, x: &Rows, n: usize, dst: &mut [u8]) -> Result<(), Error> {
    let d = c.dim();
    let mut buf = [0f32; MAX_D];
    let buf = &mut buf[..d];
    for r in 0..n {
        x.row(r, d, buf);
        c.check_rows_codable(buf).map_err(|e| e.at_row(r))?;
    }
    for (r, o) in dst.chunks_exact_mut(c.row_bytes()).take(n).enumerate() {
        x.row(r, d, buf);
        c.quantize_row(buf, o).map_err(|e| e.at_row(r))?;
    }
    Ok(())
}

/// Quantizes `n_rows` rows of `head_dim` values of type `dtype` (`KVC_DTYPE_F32`,
/// `KVC_DTYPE_F16` or `KVC_DTYPE_BF16`) at `src` into `dst` (`dst_len` bytes, at least
/// `n_rows * row_bytes`; only those are written): `kvc_kvq_quantize_rows` for an engine
/// whose rows are f16 or bf16. The bytes are those of the f32 call on the same values.
/// Errors as `kvc_kvq_quantize_rows` (a value that is not finite, or a row whose scale
/// would overflow f16, is `KVC_INVALID_ARGUMENT` naming the row and element); another
/// dtype value is `KVC_INVALID_ARGUMENT`, `KVC_DTYPE_I8` `KVC_UNSUPPORTED`. All or
/// nothing: on any error `dst` is byte-identical to before the call. No allocation.
///
/// Threads: safe from any thread; runs on the caller's thread.
///
/// # Safety
/// `kvq` a live handle; `src` readable for `n_rows * head_dim` elements of `dtype` and
/// aligned for it; `dst` writable for `dst_len` bytes, not overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_quantize_rows_typed(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    dtype: KvcDtype,
    src: *const c_void,
    n_rows: usize,
    dst: *mut u8,
    dst_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_quantize_rows_typed", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        let c = h.codec(layer, tensor)?;
        let dt = row_dtype(dtype)?;
        let (n, need) = row_sizes(h.head_dim, c.row_bytes(), n_rows)?;
        if dst_len < need {
            return Err(kvc_kvq::Error::BufferTooSmall {
                what: "dst (n_rows * row_bytes)",
                needed: need,
                found: dst_len,
            }
            .into());
        }
        crate::boundary::check_disjoint(
            src.cast(),
            n.saturating_mul(dt.size()),
            dst.cast_const(),
            need,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked by `in_slice`.
        let x = unsafe {
            match dt {
                FloatDtype::F32 => Rows::F32(in_slice(src.cast::<f32>(), n, "src")?),
                FloatDtype::F16 => Rows::F16(in_slice(src.cast::<f16>(), n, "src")?),
                FloatDtype::Bf16 => Rows::Bf16(in_slice(src.cast::<bf16>(), n, "src")?),
            }
        };
        // SAFETY: as above; disjoint from `src` (checked).
        let d = unsafe { out_slice(dst, need, "dst") }?;
        quantize_typed(c, &x, n_rows, d)
    })
}

/// Shared body of the checked and typed dequantize calls: `n_rows` rows from `src` into
/// `dst` as `dt`, `dst_len` elements.
///
/// # Safety
/// As `kvc_kvq_dequantize_rows_typed`.
#[allow(clippy::too_many_arguments)]
unsafe fn dequantize_typed(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    src: *const u8,
    src_len: usize,
    n_rows: usize,
    dt: FloatDtype,
    dst: *mut c_void,
    dst_len: usize,
) -> Result<(), Error> {
    // SAFETY: caller contract.
    let h = unsafe { handle_ref(kvq, "kvq") }?;
    let c = h.codec(layer, tensor)?;
    let (n, need) = row_sizes(h.head_dim, c.row_bytes(), n_rows)?;
    if src_len < need {
        return Err(kvc_kvq::Error::BufferTooSmall {
            what: "src (n_rows * row_bytes)",
            needed: need,
            found: src_len,
        }
        .into());
    }
    if dst_len < n {
        return Err(Error::BufferTooSmall {
            argument: "dst (n_rows * head_dim elements)",
            needed: n,
            capacity: dst_len,
        });
    }
    crate::boundary::check_disjoint(
        src,
        need,
        dst.cast_const().cast(),
        n.saturating_mul(dt.size()),
        "dst",
    )?;
    // SAFETY: caller contract; NULL, alignment and size are checked.
    let p = unsafe { in_slice(src, need, "src") }?;
    let d = h.head_dim;
    // Every row's scales first: a corrupt row leaves `dst` untouched.
    c.check_packed_rows(p)?;
    let mut buf = [0f32; MAX_D];
    let buf = &mut buf[..d];
    match dt {
        FloatDtype::F32 => {
            // SAFETY: as above; disjoint from `src` (checked).
            let y = unsafe { out_slice(dst.cast::<f32>(), n, "dst") }?;
            Ok(c.dequantize_rows(p, y)?)
        }
        FloatDtype::F16 => {
            // A decoded value beyond f16's range would become an infinity: refused, found
            // before anything is written.
            for (r, row) in p.chunks_exact(c.row_bytes()).enumerate() {
                c.dequantize_row(row, buf).map_err(|e| e.at_row(r))?;
                if let Some(i) = buf.iter().position(|v| v.abs() > f16::MAX.to_f32()) {
                    return Err(kvc_kvq::Error::BadValue {
                        what: "decoded row (dtype KVC_DTYPE_F16)",
                        row: r,
                        element: i,
                        value: buf[i],
                        reason: "does not fit in f16; ask for KVC_DTYPE_F32 or BF16",
                    }
                    .into());
                }
            }
            // SAFETY: as above; disjoint from `src` (checked).
            let y = unsafe { out_slice(dst.cast::<f16>(), n, "dst") }?;
            for (r, (row, o)) in p
                .chunks_exact(c.row_bytes())
                .zip(y.chunks_exact_mut(d))
                .enumerate()
            {
                c.dequantize_row(row, buf).map_err(|e| e.at_row(r))?;
                for (o, &v) in o.iter_mut().zip(buf.iter()) {
                    *o = f16::from_f32(v);
                }
            }
            Ok(())
        }
        FloatDtype::Bf16 => {
            // SAFETY: as above; disjoint from `src` (checked).
            let y = unsafe { out_slice(dst.cast::<bf16>(), n, "dst") }?;
            for (r, (row, o)) in p
                .chunks_exact(c.row_bytes())
                .zip(y.chunks_exact_mut(d))
                .enumerate()
            {
                c.dequantize_row(row, buf).map_err(|e| e.at_row(r))?;
                for (o, &v) in o.iter_mut().zip(buf.iter()) {
                    *o = bf16::from_f32(v);
                }
            }
            Ok(())
        }
    }
}

/// Dequantizes `n_rows` packed rows from `src` (`src_len` bytes, at least `n_rows *
/// row_bytes`) into `dst` (`dst_len` floats, at least `n_rows * head_dim`; only those are
/// written): `kvc_kvq_dequantize_rows` with its arguments ordered like
/// `kvc_kvq_quantize_rows` and the output's length checked. A short `src` or `dst` is
/// `KVC_BUFFER_TOO_SMALL`; a row with a non-finite scale `KVC_CORRUPT_DATA` naming the
/// row. All or nothing: on any error `dst` is byte-identical to before the call. No
/// allocation.
///
/// Threads: safe from any thread; runs on the caller's thread.
///
/// # Safety
/// `kvq` a live handle; `src` readable for `src_len` bytes; `dst` writable for `dst_len`
/// floats, not overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_dequantize_rows_checked(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    src: *const u8,
    src_len: usize,
    n_rows: usize,
    dst: *mut f32,
    dst_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_dequantize_rows_checked", || {
        // SAFETY: caller contract, forwarded.
        unsafe {
            dequantize_typed(
                kvq,
                layer,
                tensor,
                src,
                src_len,
                n_rows,
                FloatDtype::F32,
                dst.cast(),
                dst_len,
            )
        }
    })
}

/// As `kvc_kvq_dequantize_rows_checked`, writing the rows as `dtype` (`KVC_DTYPE_F32`,
/// `KVC_DTYPE_F16` or `KVC_DTYPE_BF16`; `dst_len` in elements). Each value is the f32
/// value rounded to nearest even; for f16, a decoded value beyond 65504 is
/// `KVC_INVALID_ARGUMENT` naming the row and element (ask for f32 or bf16), found before
/// anything is written. Another dtype value is `KVC_INVALID_ARGUMENT`, `KVC_DTYPE_I8`
/// `KVC_UNSUPPORTED`. All or nothing. No allocation.
///
/// Threads: safe from any thread; runs on the caller's thread.
///
/// # Safety
/// `kvq` a live handle; `src` readable for `src_len` bytes; `dst` writable for `dst_len`
/// elements of `dtype`, aligned for it, not overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_dequantize_rows_typed(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    src: *const u8,
    src_len: usize,
    n_rows: usize,
    dtype: KvcDtype,
    dst: *mut c_void,
    dst_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_dequantize_rows_typed", || {
        let dt = row_dtype(dtype)?;
        // SAFETY: caller contract, forwarded.
        unsafe { dequantize_typed(kvq, layer, tensor, src, src_len, n_rows, dt, dst, dst_len) }
    })
}

/// `kvc_kvq_attend` on a packed cache of any layout: row `(t, h)` of K starts at byte `h *
/// k_head_stride + t * k_token_stride` of `k` (`k_len` bytes), likewise V. Token-major
/// (llama.cpp, what `kvc_kvq_attend` reads): `token_stride = n_kv_head * row_bytes`,
/// `head_stride = row_bytes`; head-major `[H, S, D]` with `S` slots per head:
/// `token_stride = row_bytes`, `head_stride = S * row_bytes`. A token stride shorter
/// than a row is `KVC_INVALID_ARGUMENT`; a cache whose last row ends past its length
/// `KVC_BUFFER_TOO_SMALL`. Everything else as `kvc_kvq_attend` (the scores it leaves, the
/// thread pool, all or nothing).
///
/// # Safety
/// `kvq` a live handle; every pointer valid for the lengths stated; `scores` and `out`
/// writable and not overlapping each other or the inputs.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_attend_strided(
    kvq: *const KvcKvq,
    layer: u32,
    q: *const f32,
    n_head: u32,
    k: *const u8,
    k_len: usize,
    k_token_stride: usize,
    k_head_stride: usize,
    v: *const u8,
    v_len: usize,
    v_token_stride: usize,
    v_head_stride: usize,
    n_tokens: usize,
    scale: f32,
    scores: *mut f32,
    scores_len: usize,
    out: *mut f32,
) -> KvcStatus {
    status_boundary("kvc_kvq_attend_strided", || {
        let strides = CacheStrides {
            k_token: k_token_stride,
            k_head: k_head_stride,
            v_token: v_token_stride,
            v_head: v_head_stride,
        };
        // SAFETY: caller contract, forwarded.
        unsafe {
            attend(
                kvq,
                layer,
                q,
                n_head,
                (k, k_len),
                (v, v_len),
                Some(strides),
                n_tokens,
                scale,
                (scores, scores_len),
                out,
            )
        }
    })
}

/// Byte strides of a K and a V cache (`kvc_kvq_attend_strided`'s layout arguments).
pub(crate) struct CacheStrides {
    k_token: usize,
    k_head: usize,
    v_token: usize,
    v_head: usize,
}

/// The body of `kvc_kvq_attend` (`strides` None: token-major rows) and
/// `kvc_kvq_attend_strided`: the handle, layer and buffers checked, then every head
/// attended.
///
/// # Safety
/// As `kvc_kvq_attend_strided`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attend(
    kvq: *const KvcKvq,
    layer: u32,
    q: *const f32,
    n_head: u32,
    (k, k_len): (*const u8, usize),
    (v, v_len): (*const u8, usize),
    strides: Option<CacheStrides>,
    n_tokens: usize,
    scale: f32,
    (scores, scores_len): (*mut f32, usize),
    out: *mut f32,
) -> Result<(), Error> {
    // SAFETY: caller contract.
    let h = unsafe { handle_ref(kvq, "kvq") }?;
    let lc = h.layers.get(layer as usize).ok_or_else(|| {
        Error::invalid(
            "layer",
            format!("{layer} is out of range ({} layers)", h.layers.len()),
        )
    })?;
    let nq = (n_head as usize)
        .checked_mul(h.head_dim)
        .ok_or_else(|| Error::invalid("n_head", "overflows"))?;
    crate::boundary::check_disjoint(
        scores.cast_const().cast(),
        scores_len.saturating_mul(4),
        out.cast_const().cast(),
        nq.saturating_mul(4),
        "out",
    )?;
    // SAFETY: caller contract; NULL, alignment and size are checked.
    let qs = unsafe { in_slice(q, nq, "q") }?;
    // SAFETY: as above.
    let ks = unsafe { in_slice(k, k_len, "k") }?;
    // SAFETY: as above.
    let vs = unsafe { in_slice(v, v_len, "v") }?;
    // SAFETY: as above; `scores` and `out` are disjoint (checked); that they do not
    // overlap the inputs is the caller's contract.
    let sc = unsafe { out_slice(scores, scores_len, "scores") }?;
    // SAFETY: as above.
    let o = unsafe { out_slice(out, nq, "out") }?;
    // Token-major (llama.cpp's cells): a token's rows of every KV head, one after another.
    let (kb, vb) = (lc.k.row_bytes(), lc.v.row_bytes());
    let st = strides.unwrap_or(CacheStrides {
        k_token: h.n_kv_head.saturating_mul(kb),
        k_head: kb,
        v_token: h.n_kv_head.saturating_mul(vb),
        v_head: vb,
    });
    let kr = CacheRows {
        bytes: ks,
        token_stride: st.k_token,
        head_stride: st.k_head,
    };
    let vr = CacheRows {
        bytes: vs,
        token_stride: st.v_token,
        head_stride: st.v_head,
    };
    Ok(attend_heads_strided(
        Isa::detect(),
        lc,
        qs,
        kr,
        vr,
        n_tokens,
        h.n_kv_head,
        scale,
        sc,
        o,
    )?)
}
