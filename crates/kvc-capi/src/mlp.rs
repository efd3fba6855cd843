//! `kvc_mlp`: the learned KV compressor (`kvc-mlp`, `.bin` v1 weight files) behind an
//! opaque handle, compressing InfiniLM-style `[H, S_max, D]` caches in place.

use std::ffi::{c_char, c_void, CStr};

use half::{bf16, f16};
use kvc_mlp::{
    CacheShape, CompressParams, CompressedLen, Compressor, CompressorWeights, KvElement,
};

use kvc_types::FloatDtype;

use crate::boundary::{
    check_disjoint, in_ref, in_slice, out_ref, out_slice, status_boundary, value_boundary,
};
use crate::convert::{KvcDtype, KVC_DTYPE_I8};
use crate::error::Error;
use crate::handle::{free_handle, handle_ref, store_handle};
use crate::status::KvcStatus;

/// The header of a loaded compressor weight file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcMlpInfo {
    /// Element type of the stored weights (`KVC_DTYPE_F16`, `_BF16` or `_F32`).
    pub weight_dtype: KvcDtype,
    /// Layers with weights.
    pub num_layers: u32,
    /// KV heads of the model the file was trained for.
    pub num_heads: u32,
    /// Head dimension `D` every MLP maps to.
    pub head_dim: u32,
    /// Hidden width of the MLPs.
    pub hidden_size: u32,
    /// Tokens per compressed group.
    pub compression_factor: u32,
    /// A segment with fewer whole groups than this is left unchanged.
    pub min_seq_len: u32,
}

/// A loaded compressor: opaque; create with `kvc_mlp_new` or `kvc_mlp_new_from_memory`,
/// free with `kvc_mlp_free`.
pub struct KvcMlp {
    compressor: Compressor,
    info: KvcMlpInfo,
}

impl KvcMlp {
    fn new(weights: CompressorWeights) -> Result<KvcMlp, Error> {
        let h = weights
            .header()
            .copied()
            .ok_or_else(|| Error::invalid("weights", "the weights carry no file header"))?;
        let info = KvcMlpInfo {
            weight_dtype: KvcDtype::from(h.dtype.code()),
            num_layers: h.num_layers,
            num_heads: h.num_heads,
            head_dim: h.head_dim,
            hidden_size: h.hidden_size,
            compression_factor: h.compression_factor,
            min_seq_len: h.min_seq_len,
        };
        Ok(KvcMlp {
            compressor: Compressor::new(weights),
            info,
        })
    }

    /// Compresses one layer in place (see `kvc_mlp_compress_inplace`).
    #[allow(clippy::too_many_arguments)]
    fn compress<T: KvElement>(
        &self,
        layer: usize,
        shape: CacheShape,
        k: *mut c_void,
        v: *mut c_void,
        n: usize,
        image_kv_len: usize,
    ) -> Result<CompressedLen, Error> {
        let bytes = n.saturating_mul(size_of::<T>());
        check_disjoint(
            k.cast_const().cast(),
            bytes,
            v.cast_const().cast(),
            bytes,
            "v",
        )?;
        // SAFETY: caller contract; NULL, alignment, size and overlap are checked.
        let k = unsafe { out_slice(k.cast::<T>(), n, "k") }?;
        // SAFETY: as above.
        let v = unsafe { out_slice(v.cast::<T>(), n, "v") }?;
        let params = CompressParams {
            image_kv_len,
            ..self.compressor.default_params()
        };
        Ok(self
            .compressor
            .compress_layer_inplace(layer, shape, k, v, &params)?)
    }
}

/// Loads the compressor weight file (`.bin` v1) at `path` (a NUL-terminated path) and
/// stores a new compressor in `*out` (only on `KVC_OK`). A file that cannot be read is
/// `KVC_IO`; a malformed one `KVC_CORRUPT_DATA`; an unknown version `KVC_UNSUPPORTED`.
///
/// Ownership: `path` is only read; the caller owns the handle and frees it with
/// `kvc_mlp_free`. Threads: safe from any thread.
///
/// # Safety
/// `path` must be a NUL-terminated string; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_mlp_new(path: *const c_char, out: *mut *mut KvcMlp) -> KvcStatus {
    status_boundary("kvc_mlp_new", || {
        // SAFETY: caller contract (checked for NULL and alignment first).
        let p = unsafe { in_ref(path, "path") }?;
        // SAFETY: `p` is a valid pointer to a NUL-terminated string (contract).
        let path = unsafe { CStr::from_ptr(p) };
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let path = path
            .to_str()
            .map_err(|_| Error::invalid("path", "is not valid UTF-8"))?;
        let mlp = KvcMlp::new(CompressorWeights::load(path)?)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, mlp) }
    })
}

/// Parses a complete compressor weight file held in memory (`len` bytes at `bytes`) and
/// stores a new compressor in `*out` (only on `KVC_OK`). The bytes are copied: the caller
/// may free them right after the call. Errors as `kvc_mlp_new`.
///
/// # Safety
/// `bytes` readable for `len` bytes; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_mlp_new_from_memory(
    bytes: *const c_void,
    len: usize,
    out: *mut *mut KvcMlp,
) -> KvcStatus {
    status_boundary("kvc_mlp_new_from_memory", || {
        // SAFETY: caller contract.
        let bytes = unsafe { in_slice(bytes.cast::<u8>(), len, "bytes") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let mlp = KvcMlp::new(CompressorWeights::from_bytes(bytes)?)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, mlp) }
    })
}

/// The weight file's header in `*out`.
///
/// Threads: reads the handle only; safe concurrently with any `const` call on it.
///
/// # Safety
/// `mlp` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_mlp_get_info(mlp: *const KvcMlp, out: *mut KvcMlpInfo) -> KvcStatus {
    status_boundary("kvc_mlp_get_info", || {
        // SAFETY: caller contract.
        let mlp = unsafe { handle_ref(mlp, "mlp") }?;
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = mlp.info;
        Ok(())
    })
}

/// Compresses layer `layer` of an InfiniLM StaticKVCache in place: `k` and `v` are each
/// `[n_heads, capacity, head_dim]` elements of `dtype` (`KVC_DTYPE_F16`, `_BF16` or
/// `_F32`) whose first `seq_len` tokens per head hold data (the first `image_kv_len` of
/// them an image prefix, compressed with the image MLPs). Afterwards tokens
/// `[0, *new_kv_len)` of each head hold the result; what lies beyond is unspecified.
/// `*rope_position` receives the position of the next token (the original `seq_len`).
///
/// Errors (nothing is changed): a layer without weights, a `head_dim` other than the
/// file's, `seq_len > capacity`, a shape whose size overflows: `KVC_INVALID_ARGUMENT`;
/// `KVC_DTYPE_I8`: `KVC_UNSUPPORTED`.
///
/// Ownership: `k` and `v` are engine-owned, must not overlap, and are only used during
/// the call. Threads: `mlp` is only read: calls on one handle may run concurrently (on
/// different caches); the work runs on kvc's thread pool.
///
/// # Safety
/// `mlp` live; `k` and `v` writable for `n_heads * capacity * head_dim` elements each,
/// aligned for `dtype`; `new_kv_len` and `rope_position` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_mlp_compress_inplace(
    mlp: *const KvcMlp,
    layer: usize,
    dtype: KvcDtype,
    k: *mut c_void,
    v: *mut c_void,
    n_heads: usize,
    capacity: usize,
    seq_len: usize,
    head_dim: usize,
    image_kv_len: usize,
    new_kv_len: *mut usize,
    rope_position: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_mlp_compress_inplace", || {
        // SAFETY: caller contract.
        let mlp = unsafe { handle_ref(mlp, "mlp") }?;
        // SAFETY: caller contract.
        let new_kv_len = unsafe { out_ref(new_kv_len, "new_kv_len") }?;
        // SAFETY: caller contract.
        let rope_position = unsafe { out_ref(rope_position, "rope_position") }?;
        let n = n_heads
            .checked_mul(capacity)
            .and_then(|x| x.checked_mul(head_dim))
            .ok_or_else(|| {
                Error::invalid(
                    "capacity",
                    format!("{n_heads} x {capacity} x {head_dim} elements overflow size_t"),
                )
            })?;
        if seq_len > capacity {
            return Err(Error::invalid(
                "seq_len",
                format!("{seq_len} exceeds the capacity {capacity}"),
            ));
        }
        let shape = CacheShape {
            heads: n_heads,
            capacity,
            seq_len,
            head_dim,
        };
        let lens = match dtype {
            KVC_DTYPE_I8 => {
                return Err(Error::Wrapped {
                    status: KvcStatus::KVC_UNSUPPORTED,
                    message: "the compressor works on float caches; KVC_DTYPE_I8 is not \
                              supported"
                        .into(),
                })
            }
            d => match FloatDtype::from_code(d) {
                Some(FloatDtype::F16) => {
                    mlp.compress::<f16>(layer, shape, k, v, n, image_kv_len)?
                }
                Some(FloatDtype::Bf16) => {
                    mlp.compress::<bf16>(layer, shape, k, v, n, image_kv_len)?
                }
                Some(FloatDtype::F32) => {
                    mlp.compress::<f32>(layer, shape, k, v, n, image_kv_len)?
                }
                None => {
                    return Err(Error::invalid(
                        "dtype",
                        format!("{d} is not a kvc_dtype (F16 = 0, BF16 = 1, F32 = 2)"),
                    ))
                }
            },
        };
        *new_kv_len = lens.kv_len;
        *rope_position = lens.rope_position;
        Ok(())
    })
}

/// Frees a compressor; NULL is a no-op.
///
/// Ownership: the handle is invalid afterwards. Threads: no other call may be using it.
///
/// # Safety
/// `mlp` must be NULL or a live handle from `kvc_mlp_new*`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_mlp_free(mlp: *mut KvcMlp) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(mlp) })
}
