//! An asynchronous compressed KV store that really frees memory and restores on demand.
//!
//! `kvc-store-async` compresses cold token ranges of a kvc-owned cache on a worker pool,
//! releases the raw range only after the blob has been decoded and compared bit for bit,
//! and restores ranges before a layer's attention through a two-level (per-layer and
//! global) LRU decode cache. It implements MNN's store mode (probe / full / store, scopes
//! front_n / h2o_kept / both, hot sink and recent zones, bootstrap then grouped chunks)
//! without MNN's flaw of keeping a raw copy. It does not choose which tokens an H2O policy
//! keeps (that is `kvc-h2o`), does not define a codec (the codec is a [`StoreCodec`]
//! parameter: gear-v1, gear-v2, or C8 int8 before either) and does not know engines' own caches.
//!
//! ```
//! use std::sync::Arc;
//! use kvc_cache::KvLayout;
//! use kvc_types::Dtype;
//! use kvc_codec::gear_v1::EncodeOptions;
//! use kvc_store_async::{GearV1Codec, Store, StoreConfig};
//!
//! let layout = KvLayout::llama(Dtype::F16, 2, 8, 8, 1024, false)?;
//! let codec = Arc::new(GearV1Codec::new(EncodeOptions::default())?);
//! let store = Store::new(StoreConfig::default(), &[layout], codec)?;
//! let row = vec![0x3cu8; 2 * 8 * 2];
//! for _ in 0..700 {
//!     store.append_tokens(0, &row, &row)?;
//!     store.schedule(0)?;
//!     store.poll()?;
//! }
//! store.wait_idle()?;
//! let m = store.metrics()?;
//! assert_eq!(m.chunks_held, 2); // the bootstrap chunk and one group of 384
//! let (k, _v) = store.read_tokens(0, 0, 700)?; // restored bit-exactly
//! assert!(k.iter().all(|&b| b == 0x3c));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// The store's codecs, from `kvc-store-codec` (shared with `kvc-store-tiers`).
pub mod codec {
    pub use kvc_store_codec::codec::*;
}
pub mod config;
pub mod error;
mod gather;
pub mod hash;
pub mod metrics;
mod pool;
pub mod store;

pub use codec::{C8Codec, ChunkInfo, GearV1Codec, GearV2Codec, StoreCodec, Tensor};
pub use config::{Mode, Scope, StoreConfig};
pub use error::{Error, ErrorKind, Result};
pub use metrics::StoreMetrics;
pub use store::{ChunkStatus, ChunkView, DecodeKey, RestoreStats, Store};
