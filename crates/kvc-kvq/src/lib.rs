//! kvq: rotated 2-8-bit KV codes in packed rows of fixed size, and decode attention that
//! reads the packed rows directly. This crate holds the codec (rows, K channel groups,
//! centered rows), its kernels (portable, AVX2, AVX-512F, picked once at run time by
//! [`Isa`]), the plan format (per-layer bits, [`config`]) that engines load, and the
//! packed cache file ([`file`](mod@file)) that holds a whole K or V cache. It is not calibration
//! (making plans from data: `kvc-kvq-calibrate`), not int8 C8 (`kvc-int8`), and it never
//! codes losslessly (`kvc-codec`). It works on `f32` slices and byte buffers the caller
//! owns and knows nothing about engines.
//!
//! A row is one token's vector of one KV head (`head_dim` values: 64, 128 or 256). It is
//! rotated by a seeded randomized Hadamard ([`rotation`]), coded with Lloyd-Max levels for
//! the rotated-coordinate law and one f16 scale per row, or with uniform codes and one f16
//! scale per group ([`codebook`], [`row`]), and bit-packed into `row_bytes` bytes, the same
//! for every row, so row `i` of a cache is at `i * row_bytes` (format:
//! `docs/formats/kvq.md`). K and V have their own bit widths ([`config`]); K is the
//! sensitive one (in llama.cpp, q8_0 K with q4_0 V costs about +0.6 % / +0.1 % perplexity
//! on our two texts, q4_0 for both +6.6 % / +7.3 %), so plans give K more bits.
//! [`attention`] computes one decode step for a head from packed K and V: the query is
//! rotated once, scores are read from packed K, the softmax-weighted sum of packed V is
//! formed in the rotated domain and un-rotated once. No f16 copy of the cache is made and
//! nothing is allocated per call; the caller gives the score scratch. An engine with its
//! own attention loop uses the per-row entry points instead: [`RowCodec::dot_rotated`] per
//! K row (the query rotated once) and [`RowCodec::dequantize_row_rotated`] per V row (the
//! weighted sum un-rotated once), or, for a tile of rows and the several query heads of one KV
//! head (grouped-query attention), [`RowCodec::dot_rows_multi`] and
//! [`RowCodec::accumulate_rows_multi`], which decode each row once for all queries. Kernels: portable, AVX2 (+FMA, F16C) and, for the
//! attention block kernels, AVX-512F, picked at run time ([`crate::Isa`]); speed in
//! `docs/results/kvq-speed.md`.
//!
//! Plans (per-layer K/V bits) are read and checked here ([`KvqPlan`]) and made from
//! calibration data by `kvc-kvq-calibrate` (`kvc kvq plan`).
//!
//! [`file`](mod@file) is the kvq packed cache file (`KVCKVQPK`): a whole K or V cache with its config
//! or plan and shape in a checked header, as `kvc kvq apply` writes it.
//!
//! [`channel_group`] is the other K layout: K per channel over groups of tokens (KIVI), no
//! rotation, one f16 step and minimum per channel and group, for a model whose K has
//! outlier channels that a per-row scale cannot follow (`docs/results/kvq-frontier.md`).
//!
//! [`center`] codes rows relative to a fixed vector per KV head (`x - c`), which attention
//! on K ignores (the softmax is shift-invariant): for K whose channels carry large offsets.
//!
//! Sink and recent tokens kept in higher precision inside an engine's cache, and the
//! per-sequence centers, are `kvc-kvq-cells`: a plan (version 3) says how many, this crate
//! only codes rows.

pub mod attention;
pub mod center;
pub mod channel_group;
pub mod codebook;
pub mod config;
pub mod error;
pub mod file;
pub mod isa;
mod multi;
pub mod rotation;
pub mod row;
mod simd;

pub use error::{Error, ErrorKind, Result};
pub use isa::Isa;

pub use channel_group::ChannelGroupCodec;
pub use config::{KvqConfig, KvqPlan, LayerBits, Method};
pub use row::{row_bits_per_value, row_bytes, RowCodec, FORMAT_VERSION};

/// The K and V codecs of one layer.
#[derive(Debug, Clone)]
pub struct LayerCodec {
    /// K rows.
    pub k: RowCodec,
    /// V rows.
    pub v: RowCodec,
}

impl LayerCodec {
    /// Codecs for `cfg` at `head_dim`.
    pub fn new(cfg: &KvqConfig, head_dim: usize) -> Result<LayerCodec> {
        Ok(LayerCodec {
            k: RowCodec::new(cfg.method, cfg.k_bits, head_dim, cfg.seed)?,
            v: RowCodec::new(cfg.method, cfg.v_bits, head_dim, cfg.seed)?,
        })
    }

    /// Mean bits per value of K and V, scales included.
    pub fn bits_per_value(&self) -> f64 {
        0.5 * (self.k.bits_per_value() + self.v.bits_per_value())
    }
}
