//! The codecs a KV store applies to one tensor (K or V) of one chunk: the [`StoreCodec`]
//! trait, what it is handed ([`ChunkInfo`]), and its implementations gear-v1
//! ([`GearV1Codec`]), gear-v2 ([`GearV2Codec`]) and C8 int8 quantization before either
//! ([`C8Codec`]), with reusable per-thread encoders and decoders.
//!
//! Both stores use it: `kvc-store-async` (compress cold ranges, restore on demand) and
//! `kvc-store-tiers` (shared prefix chunks). It is not a store: no worker pool, no cache,
//! no keys or tiers, and it defines no format of its own (the blobs are `kvc-codec`'s, the
//! quantization is `kvc-int8`'s C8).

pub mod codec;
pub mod error;

pub use codec::{C8Codec, ChunkInfo, GearV1Codec, GearV2Codec, StoreCodec, Tensor};
pub use error::{Error, ErrorKind, Result};
