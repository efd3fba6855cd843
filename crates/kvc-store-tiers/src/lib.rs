//! Shared KV tiers: content-addressed, compressed prefix chunks kept in memory, on disk
//! and in Redis (standalone or Cluster), so that a second engine instance finds the
//! prefill work a first one did.
//!
//! A chunk is `chunk_tokens` tokens of K and V for all layers. Its [`ChunkKey`] is a
//! chained BLAKE3 hash (vLLM's block hash scheme) of the previous key, the chunk's token
//! ids and a [`Fingerprint`] of the model file, the KV layout, the dtype, the chunk size
//! and the codec; its value is a self-describing, checksummed blob (docs/formats/kv-chunk.md)
//! whose sections are raw, gear-v1, gear-v2 (lossless) or kvq rows (lossy, see
//! [`ChunkCodec::lossless`]). [`Tiers`] looks up the longest cached
//! prefix, restores it with fallthrough memory → disk → Redis and promotion, and stores
//! through every tier; every failure is a counted miss, never a wrong restore.
//! [`Tiers::export_prefix`] and [`Tiers::import_prefix`] carry one prefix's chunks in a
//! single checksummed file ([`prefix_file`], docs/formats/kv-prefix.md), for an engine that
//! saves a sequence to disk and loads it in another process.
//!
//! This crate does not know engines or their caches (restores are
//! `[n_layer][tokens][n_kv_head][head_dim]`; `kvc-cache`'s layouts or the engine copy
//! from there), does not run Redis (it is a client), and does not choose what to cache:
//! the engine calls `store` after prefill and `lookup`/`restore` before it.
//!
//! ```
//! use kvc_types::Dtype;
//! use kvc_store_tiers::{ChunkCodec, ChunkShape, MemoryTier, Tiers, TiersConfig};
//!
//! let shape = ChunkShape { n_layer: 2, n_kv_head: 2, head_dim: 8, dtype: Dtype::F16, chunk_tokens: 16 };
//! let cfg = TiersConfig { shape, codec: ChunkCodec::GearV2, model_hash: [7; 32] };
//! let tiers = Tiers::new(cfg, vec![Box::new(MemoryTier::new(1 << 20))])?;
//! let tokens: Vec<u32> = (0..40).collect();
//! let kv: Vec<u8> = (0..2 * 40 * 2 * 8 * 2).map(|i| (i % 7) as u8).collect();
//! let report = tiers.store(&tokens, &kv, &kv, 40)?;
//! assert_eq!(report.chunks_encoded, 2); // 40 tokens: two full chunks of 16
//! assert_eq!(tiers.lookup(&tokens), 32);
//! let r = tiers.restore(&tokens);
//! assert_eq!(r.tokens, 32);
//! assert_eq!(&r.k[..32 * 32], &kv[..32 * 32]); // layer 0, bit-exact
//! # Ok::<(), kvc_store_tiers::Error>(())
//! ```

pub mod blob;
#[cfg(test)]
mod blob_golden;
pub mod codec;
pub mod disk;
pub mod error;
pub mod key;
pub mod prefix_file;
pub mod redis_tier;
pub mod tier;
pub mod tiers;

pub use blob::{verify, BlobHeader};
pub use codec::ChunkCodec;
pub use disk::DiskTier;
pub use error::{Error, ErrorKind, Result};
pub use key::{chain_keys, hash_model_file, ChunkKey, ChunkShape, Fingerprint};
pub use kvc_transform_coder::TransformCodec;
pub use prefix_file::PrefixFile;
pub use redis_tier::{RedisConfig, RedisTier};
pub use tier::{Blob, MemoryTier, Tier, TierStats};
pub use tiers::{
    CheckedPrefix, PrefixExport, PrefixImport, Restored, StoreReport, TierMetrics, Tiers,
    TiersConfig, TiersMetrics,
};

/// The transform codec named `name` (`tc-<bound>`) of the calibration file at `path`
/// (`kvc tc calibrate` writes one): unreadable is [`Error::Io`], a damaged file or a target
/// it does not have is [`Error::InvalidArgument`].
pub fn load_transform(
    path: &std::path::Path,
    name: &str,
) -> Result<std::sync::Arc<TransformCodec>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::io(format!("reading calibration {}", path.display()), e))?;
    TransformCodec::from_file(&bytes, name)
        .map(std::sync::Arc::new)
        .map_err(|e| Error::invalid("calibration", format!("{}: {e}", path.display())))
}
