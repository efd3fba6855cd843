//! Training kvc-mlp's learned KV-cache compressor.
//!
//! `kvc-mlp-train` fits the seed's compressor (per layer, a K and a V MLP
//! `Linear(D*F -> D), ReLU, Linear(D -> D), ReLU, Linear(D -> D)` over groups of `F`
//! consecutive tokens of one KV head) to a frozen model, from K/V/Q dumps of the model's own
//! attention (`kvc_llama_eval --modes dump`). The objective is layer-local attention-output
//! matching ([`objective`]): queries after the compressed span must see, through the
//! compressed cache, the attention output they see through the full one. Forward and backward
//! passes are written out by hand (checked against finite differences), the optimiser is Adam,
//! computation is f32 with f64 sums for softmax denominators and losses, one layer at a time
//! on one thread: a seed gives the same weights bit for bit on every run on one machine, for
//! any number of threads running layers side by side (the GEMM crate picks its kernel by CPU
//! feature, so another instruction set may round differently).
//!
//! It is not a general autodiff or deep-learning framework, does not run a model (no logit
//! distillation through the rest of the network), and does not read engine caches: the
//! trained MLPs go to kvc-mlp ([`LayerResult`] -> [`kvc_mlp::CompressorWeights`] via
//! [`to_weights`]), which runs them.

#![deny(missing_docs)]

pub mod dump;
mod error;
pub mod mlp;
pub mod objective;
mod real;
pub mod rng;
pub mod train;

pub use dump::Dump;
pub use error::{Error, ErrorKind, Result};
pub use mlp::{MlpCache, MlpParams};
pub use objective::{
    window_loss, window_norm, Compression, Geometry, Grads, LayerData, LossParts, Scratch, Window,
};
pub use real::Real;
pub use rng::Rng;
pub use train::{eval_windows, evaluate, train_layer, Init, LayerResult, TrainConfig};

/// kvc-mlp weights (text MLPs only) from trained layers, in layer order, with the scales
/// folded into the first and last Linear of each MLP. `min_seq_len` is the file's default
/// minimum number of groups.
pub fn to_weights(
    layers: &[LayerResult],
    min_seq_len: usize,
) -> Result<kvc_mlp::CompressorWeights> {
    let first = layers
        .first()
        .ok_or_else(|| Error::invalid("layers", "no trained layers"))?;
    let mut out = Vec::with_capacity(layers.len());
    for l in layers {
        out.push(kvc_mlp::LayerMlps {
            text_k: Some(l.k.to_kvc(l.k_scale)?),
            text_v: Some(l.v.to_kvc(l.v_scale)?),
            ..Default::default()
        });
    }
    Ok(kvc_mlp::CompressorWeights::from_layers(
        first.k.head_dim,
        first.k.factor,
        min_seq_len,
        out,
    )?)
}
