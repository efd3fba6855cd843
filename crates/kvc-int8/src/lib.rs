//! int8 "C8" KV-cache quantization, msmodelslim's scheme, whole: per channel
//! (`channel = kv_head * head_dim + dim`) a scale and an offset,
//! `q = clamp(round(x / scale + offset), -128, 127)`, `x = (q - offset) * scale`.
//!
//! Arithmetic is `f32`; `round` is round-half-to-even (as `torch.round`). Parameters come
//! from msmodelslim files or from calibration: per-channel min / max ([`ChannelStats`]) or,
//! for post-RoPE K, each rotary pair's maximum radius ([`RopeStats`]), which no later
//! rotation can exceed.
//!
//! - [`params`]: the parameters ([`ChannelQuant`], [`LayerQuant`], [`C8Params`]).
//! - [`isa`]: the element kernels on `f32` runs (portable and AVX2, picked by [`Isa`]).
//! - [`kernel`]: quantize / dequantize a token range of a cache tensor laid out as any
//!   engine lays it out (`kvc_cache::TensorLayout`), and the round trip's error.
//! - [`rows`]: the same on row batches (llama.cpp's `Kcur` / `Vcur`), without allocating.
//! - [`calibrate`](mod@calibrate): parameters from a cache's own values.
//! - [`msmodelslim`]: reading and writing msmodelslim checkpoints.
//!
//! This crate is int8 C8 only: not kvq's 2-8-bit rotated rows (`kvc-kvq`), not engine
//! layouts or compaction (`kvc-cache`, whose layouts it walks), not a store codec
//! (`kvc-store-codec` applies C8 before a lossless codec). Its C functions keep their
//! historical names (`kvc_quant_*`, `kvc-capi`).

pub mod calibrate;
pub mod error;
pub mod isa;
pub mod kernel;
pub mod msmodelslim;
pub mod params;
pub mod rows;

pub use calibrate::{calibrate, ChannelStats, RopeStats, RopeStyle};
pub use error::{Error, ErrorKind, Result};
pub use isa::{q1, q_fast, Isa};
pub use kernel::{dequantize, quant_error, quantize, ErrorStats};
pub use params::{C8Params, ChannelQuant, LayerQuant};
pub use rows::{dequantize_rows, quantize_rows, roundtrip_rows};
