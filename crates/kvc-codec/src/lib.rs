//! Lossless codecs for KV-cache tensors.
//!
//! `kvc-codec` turns the raw bytes of a KV-cache tensor (fp16, bf16, fp32 or int8 values)
//! into a compact blob and back, bit for bit. It implements the MNN "gear predictive"
//! format (gear-v1: byte-plane split, per-stream predictor, RLE or zstd backend) exactly as
//! engines already write it, and kvc's own KV-aware format. It knows nothing about engines,
//! layouts, eviction or threads beyond data-parallel encoding of independent chunks: callers
//! hand it bytes and a dtype. It is not a general-purpose compressor and never loses data.

pub mod dtype;
pub mod error;
pub mod gear_v1;
pub mod gear_v2;
pub mod zstd;

pub use dtype::Dtype;
pub use error::{Error, ErrorKind, Result};
