//! The learned KV-cache compressor: `.bin` v1 weight files and grouped MLP compression.
//!
//! `kvc-mlp` loads the per-layer MLP weights of InfiniLM's compressor and shortens a layer's
//! K and V by a factor, pushing each group of consecutive tokens through a small
//! Linear-ReLU-Linear-ReLU-Linear network on the CPU. It works on contiguous `[H, S, D]`
//! tensors; it does not know engine layouts, eviction policies or how a cache is stored.
//!
//! ```no_run
//! use kvc_mlp::{CompressorWeights, Compressor, KvShape};
//! let compressor = Compressor::new(CompressorWeights::load("compressor.bin")?);
//! let params = compressor.default_params();
//! let shape = KvShape { heads: 8, seq_len: 4096, head_dim: 128 };
//! let (k, v) = (vec![half::f16::ZERO; 8 * 4096 * 128], vec![half::f16::ZERO; 8 * 4096 * 128]);
//! let (mut out_k, mut out_v) = (k.clone(), v.clone());
//! let lens = compressor.compress_layer(0, shape, &k, &v, &mut out_k, &mut out_v, &params)?;
//! // lens.kv_len rows now hold data; the next token's RoPE position is lens.rope_position.
//! # Ok::<(), kvc_mlp::Error>(())
//! ```
//!
//! Compression of a segment of `L` tokens: `S' = L / factor` groups of `factor` consecutive
//! tokens go through the MLP (`[S', factor * D] -> [S', D]`), the `L mod factor` remaining
//! tokens are appended unchanged; with `S' < min_seq_len` the segment is left unchanged. An
//! image prefix of `image_kv_len` tokens is compressed separately with the image MLPs (or
//! copied if the file has none) and the result is `[image | text]`.

mod compressor;
mod dtype;
mod error;
mod forward;
mod plan;
mod weights;

pub use compressor::{CacheShape, Compressor, KvShape, LayerKv};
pub use dtype::KvElement;
pub use error::{Error, ErrorKind, Result};
pub use plan::{CompressParams, CompressedLen, SegmentPlan, SequencePlan};
pub use weights::{
    parse_header, CompressorWeights, LayerMlps, Linear, Mlp, WeightRecord, WeightsHeader,
    HEADER_SIZE, MAGIC, PREFIXES, VERSION, WEIGHT_META_SIZE,
};

pub use half::{bf16, f16};
