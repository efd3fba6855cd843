//! int8 "C8" KV-cache quantization, msmodelslim's scheme: per channel
//! (`channel = kv_head * head_dim + dim`) a scale and an offset,
//! `q = clamp(round(x / scale + offset), -128, 127)`, `x = (q - offset) * scale`.
//!
//! The parameters and the element kernels live in `kvc_int8::c8` (re-exported here);
//! this module walks engine layouts and row batches, converts dtypes, calibrates and reads
//! msmodelslim files.
//!
//! Arithmetic is `f32`; `round` is round-half-to-even (as `torch.round`). Parameters come
//! from msmodelslim files or from calibration: per-channel min / max ([`ChannelStats`]) or,
//! for post-RoPE K, each rotary pair's maximum radius ([`RopeStats`]), which no later
//! rotation can exceed.

mod calibrate;
mod kernel;
pub mod msmodelslim;
pub mod rows;

pub use calibrate::{calibrate, ChannelStats, RopeStats, RopeStyle};
pub use kernel::{dequantize, quant_error, quantize, ErrorStats};
pub use kvc_int8::{C8Params, ChannelQuant, LayerQuant};
pub use rows::{dequantize_rows, quantize_rows, roundtrip_rows};
