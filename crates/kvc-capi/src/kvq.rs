//! `kvc_kvq`: kvq packed rows (`kvc-kvq`, `docs/formats/kvq.md`) behind an opaque
//! handle: per-layer K/V codecs from a config string or a plan, quantize / dequantize of
//! row batches, and decode attention on the packed rows.

use std::ffi::{c_char, CStr};

use kvc_kvq::config::DEFAULT_SEED;
use kvc_kvq::{KvqConfig, KvqPlan, LayerCodec, Method, RowCodec};

use crate::boundary::{in_ref, in_slice, out_ref, out_slice, status_boundary};
use crate::codec::{KvcTensor, KVC_TENSOR_K, KVC_TENSOR_V};
use crate::error::Error;
use crate::handle::{free_handle, handle_ref, store_handle};
use crate::status::KvcStatus;

/// kvq codecs of every layer: opaque; create with `kvc_kvq_new` or
/// `kvc_kvq_new_from_plan`, free with `kvc_kvq_free`. Read-only after creation: every
/// other function takes `const kvc_kvq*` and may run concurrently on one handle.
pub struct KvcKvq {
    pub(crate) layers: Vec<LayerCodec>,
    pub(crate) head_dim: usize,
    pub(crate) n_kv_head: usize,
    /// Why these codecs are not the handle-free block formats (`kvc_kvq_block_*`), if
    /// they are not.
    not_block: Option<String>,
    /// The plan's protections (sink, window, window bits, K center); zeros for a config.
    pub(crate) protections: KvcKvqProtections,
}

/// The protections a kvq plan asks the engine for (plan version 3, `docs/formats/kvq.md`):
/// what `kvc_kvq_cells` applies per layer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvcKvqProtections {
    /// Leading positions of each sequence held as f16 rows.
    pub sink: u32,
    /// Newest positions of each sequence held as `window_bits` kvq rows.
    pub window: u32,
    /// Bits of the window rows (2..=8; 0 when `window` is 0).
    pub window_bits: u32,
    /// 1 when K is coded relative to a per-sequence center, else 0.
    pub k_center: u32,
}

impl KvcKvq {
    pub(crate) fn codec(&self, layer: u32, tensor: KvcTensor) -> Result<&RowCodec, Error> {
        let l = self.layers.get(layer as usize).ok_or_else(|| {
            Error::invalid(
                "layer",
                format!("{layer} is out of range ({} layers)", self.layers.len()),
            )
        })?;
        match tensor {
            KVC_TENSOR_K => Ok(&l.k),
            KVC_TENSOR_V => Ok(&l.v),
            t => Err(Error::invalid(
                "tensor",
                format!("{t} is neither KVC_TENSOR_K nor KVC_TENSOR_V"),
            )),
        }
    }
}

/// Creates codecs for `n_layer` layers of one kvq config string (`"k4v4"`, `"k4v2:u32"`,
/// `"k3v3:lm"`, ... see `docs/formats/kvq.md`) at `head_dim` (64, 128 or 256) with
/// `n_kv_head` KV heads, and stores the handle in `*out` (only on `KVC_OK`). A bad
/// string, head_dim or count is `KVC_INVALID_ARGUMENT` or `KVC_UNSUPPORTED`.
///
/// Ownership: `config` is only read; the caller frees the handle with `kvc_kvq_free`.
/// Threads: safe from any thread.
///
/// # Safety
/// `config` must be a NUL-terminated string; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_new(
    config: *const c_char,
    head_dim: u32,
    n_layer: u32,
    n_kv_head: u32,
    out: *mut *mut KvcKvq,
) -> KvcStatus {
    status_boundary("kvc_kvq_new", || {
        // SAFETY: caller contract (checked for NULL and alignment first).
        let c = unsafe { in_ref(config, "config") }?;
        // SAFETY: `c` points to a NUL-terminated string (contract).
        let text = unsafe { CStr::from_ptr(c) }
            .to_str()
            .map_err(|_| Error::invalid("config", "is not valid UTF-8"))?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let cfg = KvqConfig::parse(text)?;
        if n_layer == 0 || n_layer as usize > kvc_kvq::config::MAX_PLAN_LAYERS {
            return Err(Error::invalid(
                "n_layer",
                format!("{n_layer} is not in 1..=4096"),
            ));
        }
        // The arguments are checked here, as arguments: the plan below is made from them,
        // so its validation would otherwise report a caller's mistake as a bad plan.
        if n_kv_head == 0 {
            return Err(Error::invalid("n_kv_head", "is 0 (at least one KV head)"));
        }
        kvc_kvq::rotation::check_head_dim(head_dim as usize)?;
        if let Method::Uniform { group } = cfg.method {
            if u32::from(group) > head_dim {
                return Err(Error::Wrapped {
                    status: KvcStatus::KVC_UNSUPPORTED,
                    message: format!(
                        "config {text:?}: uniform group {group} is larger than head_dim \
                         {head_dim} (kvc codes groups within one row)"
                    ),
                });
            }
        }
        let plan = KvqPlan::uniform(&cfg, head_dim, n_kv_head, n_layer as usize);
        let h = from_plan(&plan)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, h) }
    })
}

fn from_plan(plan: &KvqPlan) -> Result<KvcKvq, Error> {
    plan.validate()?;
    let d = plan.head_dim as usize;
    let layers = (0..plan.layers.len())
        .map(|i| Ok(LayerCodec::new(&plan.layer_config(i)?, d)?))
        .collect::<Result<Vec<_>, Error>>()?;
    let not_block = if plan.method()? != Method::LloydMax {
        Some(format!("method `{}` is not lm", plan.method))
    } else if plan.seed != DEFAULT_SEED {
        Some(format!(
            "rotation seed {} is not the default {DEFAULT_SEED}",
            plan.seed
        ))
    } else if plan.recent_tokens != 0 && plan.recent_bits.is_none() {
        Some(format!(
            "the plan keeps {} recent tokens in f16, which a cache of block rows cannot hold \
             (plan version 3's recent_bits keeps them as kvq rows: kvc_kvq_cells)",
            plan.recent_tokens
        ))
    } else {
        None
    };
    Ok(KvcKvq {
        layers,
        head_dim: d,
        n_kv_head: plan.n_kv_head as usize,
        not_block,
        protections: KvcKvqProtections {
            sink: plan.sink_tokens,
            window: if plan.recent_bits.is_some() {
                plan.recent_tokens
            } else {
                0
            },
            window_bits: plan.recent_bits.map_or(0, u32::from),
            k_center: u32::from(plan.k_center),
        },
    })
}

/// Creates codecs from a kvq plan: `len` bytes of JSON at `json` (format
/// `kvc-kvq-plan` version 1 or 2, per-layer K/V bits, in version 2 optionally with the
/// calibration record `kvc quant plan` writes; `docs/formats/kvq.md`), and stores the
/// handle in `*out` (only on `KVC_OK`). A malformed plan is `KVC_CORRUPT_DATA`; another
/// version `KVC_UNSUPPORTED`. The bytes are copied.
///
/// # Safety
/// `json` readable for `len` bytes; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_new_from_plan(
    json: *const c_char,
    len: usize,
    out: *mut *mut KvcKvq,
) -> KvcStatus {
    status_boundary("kvc_kvq_new_from_plan", || {
        // SAFETY: caller contract.
        let bytes = unsafe { in_slice(json.cast::<u8>(), len, "json") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let text =
            std::str::from_utf8(bytes).map_err(|_| Error::invalid("json", "is not valid UTF-8"))?;
        let h = from_plan(&KvqPlan::from_json(text)?)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, h) }
    })
}

/// Bytes of one packed row (one token of one KV head) of `tensor` (`KVC_TENSOR_K` or
/// `KVC_TENSOR_V`) in `layer`, written to `*out`.
///
/// # Safety
/// `kvq` a live handle; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_row_bytes(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_row_bytes", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        // SAFETY: caller contract.
        let o = unsafe { out_ref(out, "out") }?;
        *o = h.codec(layer, tensor)?.row_bytes();
        Ok(())
    })
}

/// The shape the handle was made for: layers, KV heads and head_dim, each written to its
/// output (only on `KVC_OK`; every output must be non-NULL).
///
/// Threads: safe from any thread.
///
/// # Safety
/// `kvq` a live handle; the outputs writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_shape(
    kvq: *const KvcKvq,
    n_layer: *mut u32,
    n_kv_head: *mut u32,
    head_dim: *mut u32,
) -> KvcStatus {
    status_boundary("kvc_kvq_shape", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        // SAFETY: caller contract.
        let l = unsafe { out_ref(n_layer, "n_layer") }?;
        // SAFETY: caller contract.
        let k = unsafe { out_ref(n_kv_head, "n_kv_head") }?;
        // SAFETY: caller contract.
        let d = unsafe { out_ref(head_dim, "head_dim") }?;
        // All three fit: a plan has at most 4096 layers and validated u32 fields.
        *l = h.layers.len() as u32;
        *k = h.n_kv_head as u32;
        *d = h.head_dim as u32;
        Ok(())
    })
}

/// The bits of `tensor` (`KVC_TENSOR_K` or `KVC_TENSOR_V`) in `layer` as a handle-free
/// block format (`kvc_kvq_block_*`, the formats an engine's type system can name by
/// `(head_dim, bits)`), written to `*bits`. `KVC_UNSUPPORTED` when the handle's codecs
/// are not block formats: another method than `lm`, another rotation seed than the
/// default, or a plan that keeps sink or recent tokens in f16; the last-error message
/// says which. This is how an engine checks a plan before it sizes its cache from it.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `kvq` a live handle; `bits` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_block_bits(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    bits: *mut u32,
) -> KvcStatus {
    status_boundary("kvc_kvq_block_bits", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        // SAFETY: caller contract.
        let o = unsafe { out_ref(bits, "bits") }?;
        let c = h.codec(layer, tensor)?;
        if let Some(why) = &h.not_block {
            return Err(Error::Wrapped {
                status: KvcStatus::KVC_UNSUPPORTED,
                message: format!("these kvq codecs are not block formats: {why}"),
            });
        }
        *o = u32::from(c.bits());
        Ok(())
    })
}

/// The protections the plan behind `kvq` asks for (plan version 3: sink, recent window
/// as kvq rows, K center; `docs/formats/kvq.md`), written to `*out`: all zero for codecs
/// made from a config string or a plan without them. An engine applies them with one
/// `kvc_kvq_cells` per layer and tensor.
///
/// Threads: safe from any thread.
///
/// # Safety
/// `kvq` a live handle; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_get_protections(
    kvq: *const KvcKvq,
    out: *mut KvcKvqProtections,
) -> KvcStatus {
    status_boundary("kvc_kvq_get_protections", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        // SAFETY: caller contract.
        let o = unsafe { out_ref(out, "out") }?;
        *o = h.protections;
        Ok(())
    })
}

/// Floats (`n_rows * head_dim`) and packed bytes (`n_rows * row_bytes`) of `n_rows` rows,
/// or an error when either overflows.
pub(crate) fn row_sizes(
    head_dim: usize,
    row_bytes: usize,
    n_rows: usize,
) -> Result<(usize, usize), Error> {
    let n = n_rows
        .checked_mul(head_dim)
        .ok_or_else(|| Error::invalid("n_rows", "n_rows * head_dim overflows"))?;
    let need = n_rows
        .checked_mul(row_bytes)
        .ok_or_else(|| Error::invalid("n_rows", "n_rows * row_bytes overflows"))?;
    Ok((n, need))
}

/// Quantizes `n_rows` rows of `head_dim` floats at `src` (one row = one token of one KV
/// head; llama.cpp's K/V rows of a layer are `n_tokens * n_kv_head` such rows) into
/// `dst` (`dst_len` bytes, at least `n_rows * row_bytes`; only those are written). A
/// value that is not finite or beyond 2^32, or a row whose f16 scale would overflow, is
/// `KVC_INVALID_ARGUMENT`, the message naming the row and the element; a short `dst`
/// `KVC_BUFFER_TOO_SMALL`. All or nothing: every row is checked before `dst` is written,
/// so on any error `dst` is byte-identical to before the call. No allocation.
///
/// # Safety
/// `kvq` a live handle; `src` readable for `n_rows * head_dim` floats; `dst` writable for
/// `dst_len` bytes and not overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_quantize_rows(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    src: *const f32,
    n_rows: usize,
    dst: *mut u8,
    dst_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_quantize_rows", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(kvq, "kvq") }?;
        let c = h.codec(layer, tensor)?;
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
            n.saturating_mul(4),
            dst.cast_const(),
            need,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let x = unsafe { in_slice(src, n, "src") }?;
        // SAFETY: as above; disjoint from `src` (checked).
        let d = unsafe { out_slice(dst, need, "dst") }?;
        Ok(c.quantize_rows(x, d)?)
    })
}

/// Dequantizes `n_rows` packed rows from `src` (`src_len` bytes, at least `n_rows *
/// row_bytes`) into `n_rows * head_dim` floats at `dst`. A short `src` is
/// `KVC_BUFFER_TOO_SMALL`; a row with a non-finite scale `KVC_CORRUPT_DATA`, the message
/// naming the row. All or nothing: every row is checked before `dst` is written, so on
/// any error `dst` is byte-identical to before the call. The argument order differs from
/// `kvc_kvq_quantize_rows` and `dst` has no length: `kvc_kvq_dequantize_rows_checked` is
/// the same call ordered like quantize, with `dst_len` (ABI 0.12).
///
/// # Safety
/// `kvq` a live handle; `src` readable for `src_len` bytes; `dst` writable for
/// `n_rows * head_dim` floats and not overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_dequantize_rows(
    kvq: *const KvcKvq,
    layer: u32,
    tensor: KvcTensor,
    src: *const u8,
    src_len: usize,
    dst: *mut f32,
    n_rows: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_dequantize_rows", || {
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
        crate::boundary::check_disjoint(
            src,
            need,
            dst.cast_const().cast(),
            n.saturating_mul(4),
            "dst",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let p = unsafe { in_slice(src, need, "src") }?;
        // SAFETY: as above; disjoint from `src` (checked).
        let y = unsafe { out_slice(dst, n, "dst") }?;
        Ok(c.dequantize_rows(p, y)?)
    })
}

/// One decode step of every query head of `layer` on packed K and V: `q` holds `n_head *
/// head_dim` floats (query head `i` reads KV head `i / (n_head / n_kv_head)`), `k` and `v`
/// hold `n_tokens * n_kv_head` packed rows, token-major (`k_len`, `v_len` bytes, at least
/// that), `scale` multiplies the scores (usually `1/sqrt(head_dim)`), `scores` is scratch of
/// `scores_len >= n_head * n_tokens` floats, and `out` receives `n_head * head_dim`
/// floats. On `KVC_OK` with `n_tokens > 0`, `scores[h * n_tokens + t]` holds the
/// unnormalized softmax weight of token `t` for query head `h`, `exp(scale * q_h . k_t -
/// max_t')` (the largest is 1; token `t`'s weight is it divided by the head's sum); on
/// error its contents are unspecified (scratch).
/// A NaN or infinite `scale` or query value is `KVC_INVALID_ARGUMENT`; a packed row with
/// a non-finite scale `KVC_CORRUPT_DATA` naming the row (`token * n_kv_head + head`),
/// found before anything is written to `out` (all or nothing).
///
/// Threads: runs the heads in parallel on rayon's global pool, shared by every kvc call
/// in the process; it has one thread per CPU unless the environment variable
/// `RAYON_NUM_THREADS` is set before the first call. No allocation beyond the pool's.
///
/// # Safety
/// `kvq` a live handle; every pointer valid for the lengths stated; `scores` and `out`
/// writable and not overlapping each other or the inputs.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_attend(
    kvq: *const KvcKvq,
    layer: u32,
    q: *const f32,
    n_head: u32,
    k: *const u8,
    k_len: usize,
    v: *const u8,
    v_len: usize,
    n_tokens: usize,
    scale: f32,
    scores: *mut f32,
    scores_len: usize,
    out: *mut f32,
) -> KvcStatus {
    status_boundary("kvc_kvq_attend", || {
        // SAFETY: caller contract, forwarded.
        unsafe {
            crate::kvq_rows::attend(
                kvq,
                layer,
                q,
                n_head,
                (k, k_len),
                (v, v_len),
                None,
                n_tokens,
                scale,
                (scores, scores_len),
                out,
            )
        }
    })
}

/// Frees a handle from `kvc_kvq_new` / `kvc_kvq_new_from_plan`; NULL is a no-op.
///
/// # Safety
/// A non-NULL `kvq` must be a live handle not in use by another call; it is invalid after.
#[no_mangle]
pub unsafe extern "C" fn kvc_kvq_free(kvq: *mut KvcKvq) {
    // SAFETY: caller contract.
    unsafe { free_handle(kvq) }
}
