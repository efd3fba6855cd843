//! The codecs a chunk's sections are stored with: raw (the cache's own bytes), gear-v1 and
//! gear-v2 (both lossless, from `kvc-codec` through `kvc-store-async`'s [`StoreCodec`]
//! implementations, which keep reusable per-thread encoders and decoders).

use std::sync::Arc;

use kvc_cache::DType;
use kvc_store_async::{ChunkInfo, GearV1Codec, GearV2Codec, StoreCodec, Tensor};

use crate::error::{Error, Result};

/// Which codec a chunk's sections use. Its id is stored in each blob's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkCodec {
    /// The cache's bytes as they are (id 0): the baseline of the wire-size comparison.
    Raw,
    /// gear-v1 with its default options (id 1), lossless.
    GearV1,
    /// gear-v2 with its default random-access chunking (id 2), lossless.
    GearV2,
}

impl ChunkCodec {
    /// Every codec.
    pub const ALL: [ChunkCodec; 3] = [ChunkCodec::Raw, ChunkCodec::GearV1, ChunkCodec::GearV2];

    /// The id stored in blobs.
    pub fn id(self) -> u8 {
        match self {
            ChunkCodec::Raw => 0,
            ChunkCodec::GearV1 => 1,
            ChunkCodec::GearV2 => 2,
        }
    }

    /// The codec of a stored id.
    pub fn from_id(id: u8) -> Option<ChunkCodec> {
        ChunkCodec::ALL.into_iter().find(|c| c.id() == id)
    }

    /// `raw`, `gear-v1` or `gear-v2`.
    pub fn name(self) -> &'static str {
        match self {
            ChunkCodec::Raw => "raw",
            ChunkCodec::GearV1 => "gear-v1",
            ChunkCodec::GearV2 => "gear-v2",
        }
    }

    /// The codec named `name` (as [`ChunkCodec::name`]).
    pub fn from_name(name: &str) -> Result<ChunkCodec> {
        ChunkCodec::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| {
                Error::invalid(
                    "codec",
                    format!("{name:?}: expected raw, gear-v1 or gear-v2"),
                )
            })
    }

    /// Everything about the codec that changes the stored bytes, for the fingerprint.
    pub fn config_string(self) -> String {
        match self {
            ChunkCodec::Raw => "raw".to_string(),
            ChunkCodec::GearV1 => "gear-v1/default-options".to_string(),
            ChunkCodec::GearV2 => format!(
                "gear-v2/chunk_tokens={}",
                kvc_codec::gear_v2::DEFAULT_CHUNK_TOKENS
            ),
        }
    }
}

/// A codec ready to encode and decode sections, shared by threads.
#[derive(Clone)]
pub(crate) struct SectionCoder {
    pub(crate) codec: ChunkCodec,
    inner: Option<Arc<dyn StoreCodec>>,
}

impl SectionCoder {
    pub(crate) fn new(codec: ChunkCodec) -> Result<SectionCoder> {
        let inner: Option<Arc<dyn StoreCodec>> = match codec {
            ChunkCodec::Raw => None,
            ChunkCodec::GearV1 => Some(Arc::new(
                GearV1Codec::new(kvc_codec::gear_v1::EncodeOptions::default()).map_err(|e| {
                    Error::invalid("codec", format!("gear-v1 options rejected: {e}"))
                })?,
            )),
            ChunkCodec::GearV2 => Some(Arc::new(GearV2Codec::default())),
        };
        Ok(SectionCoder { codec, inner })
    }

    fn info(
        layer: usize,
        tensor: Tensor,
        dtype: DType,
        heads: usize,
        dim: usize,
        n: usize,
    ) -> ChunkInfo {
        ChunkInfo {
            layer,
            tensor,
            dtype,
            n_heads: heads,
            head_dim: dim,
            start: 0,
            count: n,
        }
    }

    /// Appends the encoding of `raw` (`n` tokens of one layer's K or V) to `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode(
        &self,
        layer: usize,
        tensor: Tensor,
        dtype: DType,
        heads: usize,
        dim: usize,
        n: usize,
        raw: &[u8],
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        match &self.inner {
            None => out.extend_from_slice(raw),
            Some(c) => {
                let info = Self::info(layer, tensor, dtype, heads, dim, n);
                c.encode(&info, raw, scratch).map_err(|e| Error::Codec {
                    layer,
                    tensor: tensor.name(),
                    reason: e.to_string(),
                })?;
                out.extend_from_slice(scratch);
            }
        }
        Ok(())
    }

    /// Decodes `blob` into exactly `out` (`n` tokens of one layer's K or V).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode(
        &self,
        layer: usize,
        tensor: Tensor,
        dtype: DType,
        heads: usize,
        dim: usize,
        n: usize,
        blob: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        match &self.inner {
            None => {
                if blob.len() != out.len() {
                    return Err(Error::BadField {
                        field: "raw section length",
                        expected: out.len() as u64,
                        found: blob.len() as u64,
                    });
                }
                out.copy_from_slice(blob);
                Ok(())
            }
            Some(c) => {
                let info = Self::info(layer, tensor, dtype, heads, dim, n);
                c.decode(&info, blob, out).map_err(|e| Error::Codec {
                    layer,
                    tensor: tensor.name(),
                    reason: e.to_string(),
                })
            }
        }
    }
}
