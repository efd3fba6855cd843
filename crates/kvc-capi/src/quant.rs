//! `kvc_quant`: int8 "C8" KV-cache quantization (`kvc-int8`, msmodelslim's per-channel
//! scheme) behind an opaque handle.
//!
//! A handle holds, per layer and tensor (K, V), one scale and one offset per channel:
//! `q = clamp(round_half_even(x / scale + offset), -128, 127)`, `x' = (q - offset) * scale`.
//! They come from calibration over the rows an engine writes (`_observe_rows`, then
//! `_finish`), from an msmodelslim checkpoint, or from the caller (`_set_params`). The
//! per-token entry points (`_quantize_rows`, `_dequantize_rows`, `_roundtrip_rows`) take
//! `const kvc_quant*`, may run concurrently, and allocate nothing.

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;

use kvc_int8::msmodelslim::{read_checkpoint, write_checkpoint};
use kvc_int8::{
    dequantize_rows, quantize_rows, roundtrip_rows, C8Params, ChannelQuant, ChannelStats,
    LayerQuant, RopeStats, RopeStyle,
};
use kvc_types::{Dtype, FloatDtype};

use crate::boundary::{
    check_disjoint, in_ref, in_slice, out_ref, out_slice, status_boundary, value_boundary,
};
use crate::codec::{KvcTensor, KVC_TENSOR_K, KVC_TENSOR_V};
use crate::convert::{KvcDtype, KVC_DTYPE_BF16, KVC_DTYPE_F16, KVC_DTYPE_F32};
use crate::elements::{cache_dtype, in_bytes, mul, out_bytes};
use crate::error::Error;
use crate::handle::{free_handle, handle_mut, handle_ref, store_handle};
use crate::status::KvcStatus;

/// The most layers a quantizer describes.
pub const KVC_QUANT_MAX_LAYERS: usize = 1 << 16;
/// The most channels (`n_kv_heads * head_dim`) of a K or V row.
pub const KVC_QUANT_MAX_CHANNELS: usize = 1 << 20;

/// How a rotary position embedding pairs the channels of a K head (llama.cpp's
/// `llama_model_rope_type`). Added in ABI 0.5.
pub type KvcRopeStyle = u32;
/// `LLAMA_ROPE_TYPE_NORM`: dims `(2i, 2i + 1)` of each head rotate together.
pub const KVC_ROPE_NORM: KvcRopeStyle = 0;
/// `LLAMA_ROPE_TYPE_NEOX`: dims `(i, i + head_dim / 2)` of each head rotate together.
pub const KVC_ROPE_NEOX: KvcRopeStyle = 1;

/// Shape and calibration mode of a quantizer. Fill it with `kvc_quant_config_default`,
/// then set the shape (defaults in brackets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcQuantConfig {
    /// Layers of the model, `1..=KVC_QUANT_MAX_LAYERS` [0: must be set].
    pub n_layers: usize,
    /// Channels of a K row, `n_kv_heads * head_dim_k` (llama.cpp `n_embd_k_gqa`),
    /// `1..=KVC_QUANT_MAX_CHANNELS` [0: must be set].
    pub k_channels: usize,
    /// Channels of a V row, `n_kv_heads * head_dim_v`; may differ from K's [0: must be
    /// set].
    pub v_channels: usize,
    /// How `kvc_quant_finish` turns statistics into parameters: 0 asymmetric
    /// (msmodelslim `int8_per_channel_asym`, offsets used), 1 symmetric
    /// (`int8_per_channel_sym`, offsets 0) [0, as `kvc quant calibrate`].
    pub symmetric: u32,
}

/// Per-layer, per-tensor C8 parameters and calibration statistics: opaque; create with
/// `kvc_quant_new` or `kvc_quant_new_from_msmodelslim`, free with `kvc_quant_free`.
pub struct KvcQuant {
    config: KvcQuantConfig,
    /// Running statistics by layer and tensor (K = 0, V = 1), made at the first rows.
    stats: Vec<[Option<ChannelStats>; 2]>,
    /// Parameters by layer and tensor; `None` until calibrated, set or loaded.
    params: Vec<[Option<ChannelQuant>; 2]>,
    /// Rotary K (`kvc_quant_set_rope`): head_dim and pairing.
    rope: Option<(usize, RopeStyle)>,
    /// Per-pair radius statistics of K by layer, made at the first K rows when `rope` is set.
    rope_stats: Vec<Option<RopeStats>>,
}

const TENSOR_NAMES: [&str; 2] = ["K", "V"];

fn invalid_state(message: String) -> Error {
    Error::Wrapped {
        status: KvcStatus::KVC_INVALID_STATE,
        message,
    }
}

impl KvcQuant {
    fn new(config: &KvcQuantConfig) -> Result<KvcQuant, Error> {
        let range = |argument, value: usize, max: usize| {
            if (1..=max).contains(&value) {
                Ok(())
            } else {
                Err(Error::invalid(
                    argument,
                    format!("{value} is not in 1..={max}"),
                ))
            }
        };
        range("config.n_layers", config.n_layers, KVC_QUANT_MAX_LAYERS)?;
        range(
            "config.k_channels",
            config.k_channels,
            KVC_QUANT_MAX_CHANNELS,
        )?;
        range(
            "config.v_channels",
            config.v_channels,
            KVC_QUANT_MAX_CHANNELS,
        )?;
        if config.symmetric > 1 {
            return Err(Error::invalid(
                "config.symmetric",
                format!(
                    "{} is neither 0 (asymmetric) nor 1 (symmetric)",
                    config.symmetric
                ),
            ));
        }
        Ok(KvcQuant {
            config: *config,
            stats: (0..config.n_layers).map(|_| [None, None]).collect(),
            params: (0..config.n_layers).map(|_| [None, None]).collect(),
            rope: None,
            rope_stats: (0..config.n_layers).map(|_| None).collect(),
        })
    }

    fn channels(&self, tensor: usize) -> usize {
        [self.config.k_channels, self.config.v_channels][tensor]
    }

    /// `(layer, tensor index)` after checking both.
    fn slot(&self, layer: usize, tensor: KvcTensor) -> Result<(usize, usize), Error> {
        if layer >= self.config.n_layers {
            return Err(Error::invalid(
                "layer",
                format!(
                    "{layer} is not below the quantizer's {} layers",
                    self.config.n_layers
                ),
            ));
        }
        let t = match tensor {
            KVC_TENSOR_K => 0,
            KVC_TENSOR_V => 1,
            _ => {
                return Err(Error::invalid(
                    "tensor",
                    format!("{tensor} is not KVC_TENSOR_K (0) or KVC_TENSOR_V (1)"),
                ))
            }
        };
        Ok((layer, t))
    }

    /// The checks every row-batch call makes first, in this order: a NULL row pointer
    /// (`argument`) with `n_rows > 0`, the layer and tensor, the dtype, and `n_rows *
    /// channels` overflowing. Returns `(layer, tensor index, dtype, elements)`.
    fn row_batch(
        &self,
        layer: usize,
        tensor: KvcTensor,
        dtype: KvcDtype,
        (rows_null, argument): (bool, &'static str),
        n_rows: usize,
    ) -> Result<(usize, usize, Dtype, usize), Error> {
        if rows_null && n_rows > 0 {
            return Err(Error::NullArgument { argument });
        }
        let (layer, t) = self.slot(layer, tensor)?;
        let dtype = cache_dtype(dtype, "dtype")?;
        let elems = mul(n_rows, self.channels(t), "n_rows")?;
        Ok((layer, t, dtype, elems))
    }

    /// The parameters of a checked slot, or `KVC_INVALID_STATE` saying how to get them.
    fn params(&self, layer: usize, t: usize) -> Result<&ChannelQuant, Error> {
        self.params[layer][t].as_ref().ok_or_else(|| {
            invalid_state(format!(
                "layer {layer} {} has no C8 parameters: observe its rows and call \
                 kvc_quant_finish, set them with kvc_quant_set_params, or load an msmodelslim \
                 checkpoint",
                TENSOR_NAMES[t]
            ))
        })
    }

    fn from_checkpoint(params: &C8Params) -> Result<KvcQuant, Error> {
        let corrupt = |message: String| Error::Wrapped {
            status: KvcStatus::KVC_CORRUPT_DATA,
            message,
        };
        let (last, first) = match (params.layers().last(), params.layers().next()) {
            (Some((last, _)), Some((_, first))) => (last, first),
            _ => return Err(corrupt("the checkpoint has no C8 layers".into())),
        };
        if last >= KVC_QUANT_MAX_LAYERS {
            return Err(corrupt(format!(
                "the checkpoint names layer {last}; at most {KVC_QUANT_MAX_LAYERS} layers are \
                 supported"
            )));
        }
        for (what, c) in [("K", first.k.channels()), ("V", first.v.channels())] {
            if c > KVC_QUANT_MAX_CHANNELS {
                return Err(corrupt(format!(
                    "the checkpoint's {what} rows have {c} channels; at most \
                     {KVC_QUANT_MAX_CHANNELS} are supported"
                )));
            }
        }
        let mut q = KvcQuant::new(&KvcQuantConfig {
            n_layers: last + 1,
            k_channels: first.k.channels(),
            v_channels: first.v.channels(),
            symmetric: u32::from(params.is_symmetric()),
        })?;
        for (i, l) in params.layers() {
            q.params[i] = [Some(l.k.clone()), Some(l.v.clone())];
        }
        Ok(q)
    }

    fn to_checkpoint(&self) -> Result<C8Params, Error> {
        let mut out = C8Params::new();
        for (i, [k, v]) in self.params.iter().enumerate() {
            match (k, v) {
                (Some(k), Some(v)) => out.insert(
                    i,
                    LayerQuant {
                        k: k.clone(),
                        v: v.clone(),
                    },
                )?,
                (None, None) => {}
                (Some(_), None) | (None, Some(_)) => {
                    return Err(invalid_state(format!(
                        "layer {i} has {} parameters but no {} parameters; an msmodelslim \
                         checkpoint holds both for every layer it names",
                        if k.is_some() { "K" } else { "V" },
                        if k.is_some() { "V" } else { "K" },
                    )))
                }
            }
        }
        if out.is_empty() {
            return Err(invalid_state(
                "no layer has C8 parameters yet: nothing to save".into(),
            ));
        }
        Ok(out)
    }
}

/// A NUL-terminated UTF-8 path argument.
///
/// # Safety
/// A non-NULL `path` must point to a NUL-terminated string.
unsafe fn path_arg<'a>(path: *const c_char, argument: &'static str) -> Result<&'a Path, Error> {
    // SAFETY: caller contract (checked for NULL and alignment first).
    let p = unsafe { in_ref(path, argument) }?;
    // SAFETY: `p` points to a NUL-terminated string (contract).
    let s = unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Error::invalid(argument, "is not valid UTF-8"))?;
    Ok(Path::new(s))
}

/// Writes the default quantizer settings into `*out`: shape 0 (to be set), asymmetric.
///
/// Ownership: `out` is caller-owned. Threads: safe from any thread.
///
/// # Safety
/// `out` must be NULL or point to a writable `kvc_quant_config`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_config_default(out: *mut KvcQuantConfig) -> KvcStatus {
    status_boundary("kvc_quant_config_default", || {
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = KvcQuantConfig::default();
        Ok(())
    })
}

/// Creates a quantizer for `config` with no parameters yet and stores it in `*out` (only
/// on `KVC_OK`). A shape of 0 or above the limits, or `symmetric` other than 0 / 1, is
/// `KVC_INVALID_ARGUMENT`.
///
/// Ownership: `config` is only read; the caller owns the handle and frees it with
/// `kvc_quant_free`. Threads: safe from any thread.
///
/// # Safety
/// `config` readable; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_new(
    config: *const KvcQuantConfig,
    out: *mut *mut KvcQuant,
) -> KvcStatus {
    status_boundary("kvc_quant_new", || {
        // SAFETY: caller contract.
        let config = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let q = KvcQuant::new(config)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, q) }
    })
}

/// Loads the C8 parameters of the msmodelslim checkpoint directory `dir`
/// (`quant_model_description.json` declaring `"kv_cache_type": "C8"` and
/// `quant_model_weight*.safetensors` with `<layer>.k_proj.kv_cache_scale` /
/// `_offset` and `v_proj` tensors) into a new quantizer in `*out` (only on `KVC_OK`).
///
/// The shape comes from the file: `n_layers` is the highest layer named plus one (layers
/// it does not name have no parameters), channels from the tensors, `symmetric` 1 when
/// every offset is 0. Read it back with `kvc_quant_get_config` and check it against the
/// model. A missing directory or file is `KVC_IO`; a malformed, truncated or
/// inconsistent file `KVC_CORRUPT_DATA`; a description that is not C8 `KVC_UNSUPPORTED`.
///
/// Ownership: `dir` is only read; the caller owns the handle. Threads: safe from any
/// thread.
///
/// # Safety
/// `dir` must be a NUL-terminated string; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_new_from_msmodelslim(
    dir: *const c_char,
    out: *mut *mut KvcQuant,
) -> KvcStatus {
    status_boundary("kvc_quant_new_from_msmodelslim", || {
        // SAFETY: caller contract.
        let dir = unsafe { path_arg(dir, "dir") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let q = KvcQuant::from_checkpoint(&read_checkpoint(dir)?)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, q) }
    })
}

/// Writes the parameters as an msmodelslim checkpoint into directory `dir` (created if
/// needed): `quant_model_description.json` and `quant_model_weight.safetensors` with
/// Llama/Qwen tensor names (`model.layers.<i>.self_attn.k_proj.kv_cache_scale`, ...),
/// scales and offsets stored as `scale_dtype` (`KVC_DTYPE_F32` keeps them exactly; F16
/// and BF16 round). Layers without parameters are left out.
///
/// A layer with K but not V parameters (or the reverse), or none at all, is
/// `KVC_INVALID_STATE`; a `scale_dtype` that is not a float type `KVC_INVALID_ARGUMENT`;
/// a failed write `KVC_IO`.
///
/// Threads: reads the handle only; safe concurrently with any `const` call on it.
///
/// # Safety
/// `quant` live; `dir` a NUL-terminated string.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_save_msmodelslim(
    quant: *const KvcQuant,
    dir: *const c_char,
    scale_dtype: KvcDtype,
) -> KvcStatus {
    status_boundary("kvc_quant_save_msmodelslim", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_ref(quant, "quant") }?;
        // SAFETY: caller contract.
        let dir = unsafe { path_arg(dir, "dir") }?;
        let sd = match scale_dtype {
            KVC_DTYPE_F16 => FloatDtype::F16,
            KVC_DTYPE_BF16 => FloatDtype::Bf16,
            KVC_DTYPE_F32 => FloatDtype::F32,
            d => {
                return Err(Error::invalid(
                    "scale_dtype",
                    format!(
                        "{d}: scales are stored as KVC_DTYPE_F16 (0), KVC_DTYPE_BF16 (1) or \
                         KVC_DTYPE_F32 (2)"
                    ),
                ))
            }
        };
        let params = q.to_checkpoint()?;
        write_checkpoint(dir, &params, sd)?;
        Ok(())
    })
}

/// The quantizer's shape and mode in `*out` (for a loaded checkpoint: what the file
/// holds).
///
/// Threads: reads the handle only; safe concurrently with any `const` call on it.
///
/// # Safety
/// `quant` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_get_config(
    quant: *const KvcQuant,
    out: *mut KvcQuantConfig,
) -> KvcStatus {
    status_boundary("kvc_quant_get_config", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_ref(quant, "quant") }?;
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = q.config;
        Ok(())
    })
}

/// Calibration: adds `n_rows` rows at `src` (each `k_channels` or `v_channels`
/// contiguous elements of `dtype`, `KVC_DTYPE_F16`, `_BF16` or `_F32`; token-major, as
/// llama.cpp's `Kcur` / `Vcur` rows) to the running per-channel min / max of `layer`'s
/// `tensor` (`KVC_TENSOR_K` / `_V`). Call it for as many batches as wanted, then
/// `kvc_quant_finish`.
///
/// All or nothing: a NaN or infinity anywhere (`KVC_CORRUPT_DATA`, with its index), a
/// bad layer, tensor or dtype (`KVC_INVALID_ARGUMENT`), `KVC_DTYPE_I8`
/// (`KVC_UNSUPPORTED`), or a size that overflows (`KVC_INVALID_ARGUMENT`) leave the
/// statistics unchanged. `n_rows == 0` does nothing (`src` may then be NULL).
///
/// Ownership: `src` is only read during the call. Threads: exclusive use of `quant`.
///
/// # Safety
/// `quant` live; `src` readable for `n_rows` rows, aligned for `dtype`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_observe_rows(
    quant: *mut KvcQuant,
    layer: usize,
    tensor: KvcTensor,
    dtype: KvcDtype,
    src: *const c_void,
    n_rows: usize,
) -> KvcStatus {
    status_boundary("kvc_quant_observe_rows", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_mut(quant, "quant") }?;
        let (l, t, dt, elems) =
            q.row_batch(layer, tensor, dtype, (src.is_null(), "src"), n_rows)?;
        let channels = q.channels(t);
        // SAFETY: caller contract.
        let src = unsafe { in_bytes(src, elems, dt, "src") }?;
        if dt == Dtype::I8 {
            return Err(Error::Wrapped {
                status: KvcStatus::KVC_UNSUPPORTED,
                message: "calibration needs float rows; KVC_DTYPE_I8 is not supported".into(),
            });
        }
        if n_rows == 0 {
            return Ok(());
        }
        if let (0, Some((head_dim, style))) = (t, q.rope) {
            // First: it checks everything the per-channel statistics check, so both
            // succeed or neither changes.
            let rs = match &mut q.rope_stats[l] {
                Some(rs) => rs,
                slot => slot.insert(RopeStats::new(channels, head_dim, style)?),
            };
            rs.observe_rows(src, dt, n_rows)?;
        }
        let stats = q.stats[l][t].get_or_insert_with(|| ChannelStats::new(channels));
        stats.observe_rows(src, dt, n_rows)?;
        Ok(())
    })
}

/// Turns the statistics into parameters: every layer and tensor that has observed rows
/// gets msmodelslim's INT8 parameters (`config.symmetric` picks sym / asym); the others
/// keep what they had (none, or what was set or loaded). The statistics are kept, so
/// more rows can be observed and `_finish` called again.
///
/// No rows observed at all is `KVC_INVALID_STATE`; nothing changes on failure.
///
/// Threads: exclusive use of `quant`.
///
/// # Safety
/// `quant` live.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_finish(quant: *mut KvcQuant) -> KvcStatus {
    status_boundary("kvc_quant_finish", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_mut(quant, "quant") }?;
        let symmetric = q.config.symmetric == 1;
        let mut made = Vec::new();
        for (l, slots) in q.stats.iter().enumerate() {
            for (t, s) in slots.iter().enumerate() {
                if let Some(s) = s.as_ref().filter(|s| s.tokens_observed() > 0) {
                    let p = match (t, &q.rope_stats[l]) {
                        (0, Some(rs)) if q.rope.is_some() => rs.finish()?,
                        _ => s.finish(symmetric)?,
                    };
                    made.push((l, t, p));
                }
            }
        }
        if made.is_empty() {
            return Err(invalid_state(
                "no rows were observed: call kvc_quant_observe_rows first".into(),
            ));
        }
        for (l, t, p) in made {
            q.params[l][t] = Some(p);
        }
        Ok(())
    })
}

/// Declares K as rotary (RoPE) with heads of `head_dim` channels paired as `style`
/// (`KVC_ROPE_NORM` or `KVC_ROPE_NEOX`, as llama.cpp's `llama_model_rope_type`): from
/// then on `kvc_quant_observe_rows` also tracks, for K of every layer, the maximum radius
/// `sqrt(x^2 + y^2)` of each rotated channel pair, and `kvc_quant_finish` gives both
/// channels of a pair the symmetric scale `max_radius / 127` (offset 0). RoPE only
/// rotates a pair, so K at positions after the calibrated ones never clips, where each
/// channel's own min / max would. V keeps the per-channel rule of `config.symmetric`.
/// Added in ABI 0.5.
///
/// Call it before the first K rows are observed: afterwards it is `KVC_INVALID_STATE`.
/// A `head_dim` that is zero, odd or does not divide `k_channels`, or another `style`,
/// is `KVC_INVALID_ARGUMENT`. On error nothing changes. Calling it again before K rows
/// replaces the declaration.
///
/// Threads: exclusive use of `quant`.
///
/// # Safety
/// `quant` live.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_set_rope(
    quant: *mut KvcQuant,
    head_dim: usize,
    style: KvcRopeStyle,
) -> KvcStatus {
    status_boundary("kvc_quant_set_rope", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_mut(quant, "quant") }?;
        let style = match style {
            KVC_ROPE_NORM => RopeStyle::Norm,
            KVC_ROPE_NEOX => RopeStyle::Neox,
            s => {
                return Err(Error::invalid(
                    "style",
                    format!("{s} is neither KVC_ROPE_NORM (0) nor KVC_ROPE_NEOX (1)"),
                ))
            }
        };
        // Checks the geometry against the K rows.
        RopeStats::new(q.config.k_channels, head_dim, style)?;
        if let Some(l) = q.stats.iter().position(|s| s[0].is_some()) {
            return Err(invalid_state(format!(
                "layer {l} K rows were already observed; declare RoPE with \
                 kvc_quant_set_rope before the first kvc_quant_observe_rows"
            )));
        }
        q.rope = Some((head_dim, style));
        q.rope_stats.iter_mut().for_each(|r| *r = None);
        Ok(())
    })
}

/// Sets the parameters of `layer`'s `tensor`: `n_channels` scales and offsets (each
/// array `k_channels` or `v_channels` floats). A wrong count, a scale that is not finite
/// and > 0, or an offset that is not finite is `KVC_INVALID_ARGUMENT` (nothing changes).
///
/// Ownership: the arrays are copied. Threads: exclusive use of `quant`.
///
/// # Safety
/// `quant` live; `scale` and `offset` readable for `n_channels` floats.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_set_params(
    quant: *mut KvcQuant,
    layer: usize,
    tensor: KvcTensor,
    scale: *const f32,
    offset: *const f32,
    n_channels: usize,
) -> KvcStatus {
    status_boundary("kvc_quant_set_params", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_mut(quant, "quant") }?;
        // SAFETY: caller contract.
        let scale = unsafe { in_slice(scale, n_channels, "scale") }?;
        // SAFETY: caller contract.
        let offset = unsafe { in_slice(offset, n_channels, "offset") }?;
        let (l, t) = q.slot(layer, tensor)?;
        if n_channels != q.channels(t) {
            return Err(Error::invalid(
                "n_channels",
                format!(
                    "{n_channels}, but layer {l} {} rows have {} channels",
                    TENSOR_NAMES[t],
                    q.channels(t)
                ),
            ));
        }
        if let Some(i) = scale.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(Error::invalid(
                "scale",
                format!("element {i} is {}; scales must be finite and > 0", scale[i]),
            ));
        }
        if let Some(i) = offset.iter().position(|o| !o.is_finite()) {
            return Err(Error::invalid(
                "offset",
                format!("element {i} is {}; offsets must be finite", offset[i]),
            ));
        }
        q.params[l][t] = Some(ChannelQuant::new(scale.to_vec(), offset.to_vec())?);
        Ok(())
    })
}

/// Copies the parameters of `layer`'s `tensor` into `scale` and `offset` (each
/// `capacity` floats) and stores the channel count in `*n_channels`.
///
/// Size query: `scale == NULL && offset == NULL && capacity == 0` stores the channel
/// count (known from the shape, even before calibration). Too small a capacity is
/// `KVC_BUFFER_TOO_SMALL` with the count in `*n_channels`; no parameters yet is
/// `KVC_INVALID_STATE`.
///
/// Threads: reads the handle only; safe concurrently with any `const` call on it.
///
/// # Safety
/// `quant` live; `scale` and `offset` writable for `capacity` floats and not
/// overlapping; `n_channels` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_get_params(
    quant: *const KvcQuant,
    layer: usize,
    tensor: KvcTensor,
    scale: *mut f32,
    offset: *mut f32,
    capacity: usize,
    n_channels: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_quant_get_params", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_ref(quant, "quant") }?;
        // SAFETY: caller contract.
        let n_channels = unsafe { out_ref(n_channels, "n_channels") }?;
        let (l, t) = q.slot(layer, tensor)?;
        let channels = q.channels(t);
        if scale.is_null() && offset.is_null() && capacity == 0 {
            *n_channels = channels;
            return Ok(());
        }
        let p = q.params(l, t)?;
        if scale.is_null() {
            return Err(Error::NullArgument { argument: "scale" });
        }
        if offset.is_null() {
            return Err(Error::NullArgument { argument: "offset" });
        }
        if capacity < channels {
            *n_channels = channels;
            return Err(Error::BufferTooSmall {
                argument: "scale",
                needed: channels,
                capacity,
            });
        }
        let bytes = channels * size_of::<f32>(); // <= 4 MiB: channels are bounded
        check_disjoint(
            scale.cast_const().cast(),
            bytes,
            offset.cast_const().cast(),
            bytes,
            "offset",
        )?;
        // SAFETY: caller contract; NULL, alignment, size and overlap are checked.
        let s = unsafe { out_slice(scale, channels, "scale") }?;
        // SAFETY: as above.
        let o = unsafe { out_slice(offset, channels, "offset") }?;
        s.copy_from_slice(p.scale());
        o.copy_from_slice(p.offset());
        *n_channels = channels;
        Ok(())
    })
}

/// Quantizes `n_rows` rows at `src` (`dtype` `KVC_DTYPE_F16`, `_BF16` or `_F32`, each
/// row `k_channels` or `v_channels` elements) with `layer`'s `tensor` parameters into
/// `dst` as int8, row after row. Allocates nothing.
///
/// Buffers: `dst_capacity` counts int8 elements; `dst == NULL && dst_capacity == 0` is a
/// size query (`*dst_len` receives `n_rows * channels`, even before calibration); too
/// small a capacity is `KVC_BUFFER_TOO_SMALL` with the size in `*dst_len`. `dst` must
/// not overlap `src`. No parameters yet is `KVC_INVALID_STATE`; a bad layer, tensor or
/// dtype, a misaligned pointer, or `n_rows * channels` overflowing is
/// `KVC_INVALID_ARGUMENT`; `KVC_DTYPE_I8` `KVC_UNSUPPORTED`.
///
/// Ownership: `src` and `dst` are only used during the call. Threads: reads the handle
/// only; calls on one handle may run concurrently.
///
/// # Safety
/// `quant` live; `src` readable for `n_rows` rows of `dtype`; `dst` writable for
/// `dst_capacity` bytes; `dst_len` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_quant_quantize_rows(
    quant: *const KvcQuant,
    layer: usize,
    tensor: KvcTensor,
    dtype: KvcDtype,
    src: *const c_void,
    n_rows: usize,
    dst: *mut i8,
    dst_capacity: usize,
    dst_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_quant_quantize_rows", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_ref(quant, "quant") }?;
        // SAFETY: caller contract.
        let dst_len = unsafe { out_ref(dst_len, "dst_len") }?;
        let (l, t, dt, elems) =
            q.row_batch(layer, tensor, dtype, (src.is_null(), "src"), n_rows)?;
        // SAFETY: caller contract.
        let src_bytes = unsafe { in_bytes(src, elems, dt, "src") }?;
        if dst.is_null() && dst_capacity == 0 {
            *dst_len = elems;
            return Ok(());
        }
        let p = q.params(l, t)?;
        check_output(dst.is_null(), dst_capacity, elems, dst_len)?;
        check_disjoint(
            src.cast(),
            src_bytes.len(),
            dst.cast_const().cast(),
            elems,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, size and overlap are checked.
        let out = unsafe { out_slice(dst.cast::<u8>(), elems, "dst") }?;
        quantize_rows(src_bytes, dt, n_rows, p, out)?;
        *dst_len = elems;
        Ok(())
    })
}

/// The checks on a row batch's output buffer once the size query is answered: a NULL
/// `dst` is `KVC_NULL_ARGUMENT`; a capacity below `needed` elements is
/// `KVC_BUFFER_TOO_SMALL` with `needed` written to `*dst_len`.
fn check_output(
    dst_is_null: bool,
    dst_capacity: usize,
    needed: usize,
    dst_len: &mut usize,
) -> Result<(), Error> {
    if dst_is_null {
        return Err(Error::NullArgument { argument: "dst" });
    }
    if dst_capacity < needed {
        *dst_len = needed;
        return Err(Error::BufferTooSmall {
            argument: "dst",
            needed,
            capacity: dst_capacity,
        });
    }
    Ok(())
}

/// Dequantizes `n_rows` int8 rows at `src` (each `k_channels` or `v_channels` bytes) with
/// `layer`'s `tensor` parameters into `dst` as `dtype` (`KVC_DTYPE_F16`, `_BF16` or
/// `_F32`, rounded to nearest even). Allocates nothing.
///
/// Buffers: `dst_capacity` counts elements of `dtype`; size query, too-small capacity
/// and errors as `kvc_quant_quantize_rows`.
///
/// Ownership: `src` and `dst` are only used during the call. Threads: reads the handle
/// only; calls on one handle may run concurrently.
///
/// # Safety
/// `quant` live; `src` readable for `n_rows` rows; `dst` writable for `dst_capacity`
/// elements of `dtype`; `dst_len` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_quant_dequantize_rows(
    quant: *const KvcQuant,
    layer: usize,
    tensor: KvcTensor,
    src: *const i8,
    n_rows: usize,
    dtype: KvcDtype,
    dst: *mut c_void,
    dst_capacity: usize,
    dst_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_quant_dequantize_rows", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_ref(quant, "quant") }?;
        // SAFETY: caller contract.
        let dst_len = unsafe { out_ref(dst_len, "dst_len") }?;
        let (l, t, dt, elems) =
            q.row_batch(layer, tensor, dtype, (src.is_null(), "src"), n_rows)?;
        // SAFETY: caller contract.
        let src_bytes = unsafe { in_bytes(src.cast(), elems, Dtype::I8, "src") }?;
        if dst.is_null() && dst_capacity == 0 {
            *dst_len = elems;
            return Ok(());
        }
        let p = q.params(l, t)?;
        check_output(dst.is_null(), dst_capacity, elems, dst_len)?;
        let dst_bytes = mul(elems, dt.size(), "n_rows")?;
        check_disjoint(src.cast(), elems, dst.cast_const().cast(), dst_bytes, "dst")?;
        // SAFETY: caller contract; NULL, alignment, size and overlap are checked.
        let out = unsafe { out_bytes(dst, elems, dt, "dst") }?;
        dequantize_rows(src_bytes, n_rows, p, out, dt)?;
        *dst_len = elems;
        Ok(())
    })
}

/// Quantizes `n_rows` rows at `data` (`dtype` `KVC_DTYPE_F16`, `_BF16` or `_F32`, each
/// row `k_channels` or `v_channels` elements) with `layer`'s `tensor` parameters and
/// writes them back dequantized, in place: the values a C8 cache would give attention,
/// in the engine's own dtype (to measure C8's quality cost inside an engine, e.g. from
/// llama.cpp's graph callback on `Kcur` / `Vcur`). Bit-identical to
/// `kvc_quant_quantize_rows` then `kvc_quant_dequantize_rows`. Allocates nothing.
///
/// No parameters yet is `KVC_INVALID_STATE`; a bad layer, tensor or dtype, a misaligned
/// `data`, or `n_rows * channels` overflowing is `KVC_INVALID_ARGUMENT`; `KVC_DTYPE_I8`
/// `KVC_UNSUPPORTED`. Nothing is written on failure. `n_rows == 0` does nothing (`data`
/// may then be NULL).
///
/// Ownership: `data` is engine-owned, used during the call only. Threads: reads the
/// handle only; calls on one handle may run concurrently (on different rows).
///
/// # Safety
/// `quant` live; `data` readable and writable for `n_rows` rows of `dtype`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_quant_roundtrip_rows(
    quant: *const KvcQuant,
    layer: usize,
    tensor: KvcTensor,
    dtype: KvcDtype,
    data: *mut c_void,
    n_rows: usize,
) -> KvcStatus {
    status_boundary("kvc_quant_roundtrip_rows", || {
        // SAFETY: caller contract.
        let q = unsafe { handle_ref(quant, "quant") }?;
        let (l, t, dt, elems) =
            q.row_batch(layer, tensor, dtype, (data.is_null(), "data"), n_rows)?;
        let p = q.params(l, t)?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let data = unsafe { out_bytes(data, elems, dt, "data") }?;
        roundtrip_rows(data, dt, n_rows, p)?;
        Ok(())
    })
}

/// Frees a quantizer; NULL is a no-op.
///
/// Ownership: the handle is invalid afterwards. Threads: no other call may be using it.
///
/// # Safety
/// `quant` must be NULL or a live handle from `kvc_quant_new*`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_quant_free(quant: *mut KvcQuant) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(quant) })
}
