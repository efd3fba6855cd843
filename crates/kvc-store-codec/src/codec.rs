//! The codec is a parameter of a store: [`StoreCodec`], with gear-v1 ([`GearV1Codec`]),
//! gear-v2 ([`GearV2Codec`]) and C8 int8 quantization before either ([`C8Codec`])
//! implementations.
//!
//! A codec sees one tensor (K or V) of one chunk in canonical order: `count` tokens of
//! `n_heads * head_dim` channels, token-major, in the cache's dtype.

use parking_lot::Mutex;

use kvc_cache::{Addressing, TensorLayout};
use kvc_int8::{dequantize, quantize, C8Params, ChannelQuant};
use kvc_types::Dtype;
use std::sync::Arc;

use kvc_codec::gear_v1::{EncodeOptions, GearV1Decoder, GearV1Encoder};
use kvc_codec::gear_v2::{self, EncodeParams, TensorKind};
pub use kvc_types::Tensor;

use crate::error::{Error, Result};

/// What a codec is handed: one tensor of one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    /// The layer.
    pub layer: usize,
    /// K or V.
    pub tensor: Tensor,
    /// The cache's element type.
    pub dtype: Dtype,
    /// KV heads.
    pub n_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// First token.
    pub start: usize,
    /// Tokens.
    pub count: usize,
}

impl ChunkInfo {
    /// Bytes of the chunk in the cache's dtype.
    pub fn raw_len(&self) -> usize {
        self.count * self.n_heads * self.head_dim * self.dtype.size()
    }

    /// The chunk's canonical layout: `count` rows of channels.
    pub fn layout(&self, dtype: Dtype) -> Result<TensorLayout> {
        Ok(TensorLayout::new(
            Addressing::CellRows,
            dtype,
            self.n_heads,
            self.head_dim,
            self.count.max(1),
        )?)
    }
}

/// A codec the store compresses chunks with. Implementations are shared by every worker
/// and restoring thread, so they keep per-thread state (encoders, zstd contexts) inside.
pub trait StoreCodec: Send + Sync {
    /// A short name for reports (`gear-v1`, `c8+gear-v1`).
    fn name(&self) -> String;

    /// Whether `decode(encode(raw)) == raw`. A lossy codec must make `decode(encode(raw))`
    /// equal [`StoreCodec::reference`] bit for bit.
    fn is_lossless(&self) -> bool;

    /// Encodes `raw` (`info.raw_len()` bytes) into `blob`, replacing its contents.
    fn encode(&self, info: &ChunkInfo, raw: &[u8], blob: &mut Vec<u8>) -> Result<()>;

    /// Decodes `blob` into `out` (`info.raw_len()` bytes); any malformed blob is an error.
    fn decode(&self, info: &ChunkInfo, blob: &[u8], out: &mut [u8]) -> Result<()>;

    /// What decoding must give back for `raw`: `raw` itself for a lossless codec.
    fn reference(&self, info: &ChunkInfo, raw: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let _ = info;
        out.clear();
        out.extend_from_slice(raw);
        Ok(())
    }
}

/// gear-v1 (the MNN format) with reusable encoders and decoders.
pub struct GearV1Codec {
    options: EncodeOptions,
    encoders: Mutex<Vec<GearV1Encoder>>,
    decoders: Mutex<Vec<GearV1Decoder>>,
}

impl GearV1Codec {
    /// gear-v1 with the given options (checked here).
    pub fn new(options: EncodeOptions) -> Result<GearV1Codec> {
        let first = GearV1Encoder::new(options)?;
        Ok(GearV1Codec {
            options,
            encoders: Mutex::new(vec![first]),
            decoders: Mutex::new(Vec::new()),
        })
    }

    fn encode_dtype(&self, dtype: Dtype, raw: &[u8], blob: &mut Vec<u8>) -> Result<()> {
        let popped = self.encoders.lock().pop();
        let mut enc = match popped {
            Some(e) => e,
            None => GearV1Encoder::new(self.options)?,
        };
        let r = enc.encode(dtype, raw, blob);
        self.encoders.lock().push(enc);
        Ok(r?)
    }

    fn decode_dtype(&self, dtype: Dtype, blob: &[u8], out: &mut [u8]) -> Result<()> {
        let popped = self.decoders.lock().pop();
        let mut dec = match popped {
            Some(d) => d,
            None => GearV1Decoder::new()?,
        };
        let r = dec.decode_into(dtype, blob, out);
        self.decoders.lock().push(dec);
        let mismatch = |found| Error::BlobMismatch {
            what: "decoded bytes",
            expected: out.len(),
            found,
        };
        match r {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(mismatch(n)),
            Err(kvc_codec::Error::OutputTooSmall { needed, .. }) => Err(mismatch(needed)),
            Err(e) => Err(e.into()),
        }
    }
}

impl StoreCodec for GearV1Codec {
    fn name(&self) -> String {
        "gear-v1".to_string()
    }
    fn is_lossless(&self) -> bool {
        true
    }
    fn encode(&self, info: &ChunkInfo, raw: &[u8], blob: &mut Vec<u8>) -> Result<()> {
        self.encode_dtype(info.dtype, raw, blob)
    }
    fn decode(&self, info: &ChunkInfo, blob: &[u8], out: &mut [u8]) -> Result<()> {
        self.decode_dtype(info.dtype, blob, out)
    }
}

/// gear-v2 (kvc's own format) with reusable encoders and decoders. Each store chunk is
/// one blob whose channels are `n_heads * head_dim` and whose kind is K or V; inside it,
/// tokens are cut into independently decodable gear-v2 chunks of `chunk_tokens`.
pub struct GearV2Codec {
    chunk_tokens: u32,
    encoders: Mutex<Vec<gear_v2::Encoder>>,
    decoders: Mutex<Vec<gear_v2::Decoder>>,
}

impl Default for GearV2Codec {
    fn default() -> Self {
        GearV2Codec {
            chunk_tokens: gear_v2::DEFAULT_CHUNK_TOKENS,
            encoders: Mutex::new(Vec::new()),
            decoders: Mutex::new(Vec::new()),
        }
    }
}

impl GearV2Codec {
    /// gear-v2 with `chunk_tokens` tokens per random-access chunk inside a blob
    /// ([`gear_v2::DEFAULT_CHUNK_TOKENS`] by default).
    pub fn new(chunk_tokens: u32) -> Result<GearV2Codec> {
        if chunk_tokens == 0 {
            return Err(Error::InvalidConfig {
                field: "gear_v2_chunk_tokens",
                value: 0,
                reason: "must be at least 1",
            });
        }
        Ok(GearV2Codec {
            chunk_tokens,
            ..GearV2Codec::default()
        })
    }

    fn params(&self, info: &ChunkInfo) -> Result<EncodeParams> {
        let channels = info.n_heads.saturating_mul(info.head_dim);
        let channels = u32::try_from(channels).map_err(|_| Error::InvalidConfig {
            field: "channels",
            value: channels,
            reason: "more than gear-v2 accepts",
        })?;
        Ok(EncodeParams {
            dtype: info.dtype,
            channels,
            kind: match info.tensor {
                Tensor::K => TensorKind::K,
                Tensor::V => TensorKind::V,
            },
            chunk_tokens: self.chunk_tokens,
        })
    }
}

impl StoreCodec for GearV2Codec {
    fn name(&self) -> String {
        "gear-v2".to_string()
    }
    fn is_lossless(&self) -> bool {
        true
    }
    fn encode(&self, info: &ChunkInfo, raw: &[u8], blob: &mut Vec<u8>) -> Result<()> {
        let params = self.params(info)?;
        let popped = self.encoders.lock().pop();
        let mut enc = popped.unwrap_or_default();
        let r = enc.encode_into(&params, raw, blob);
        self.encoders.lock().push(enc);
        Ok(r?)
    }
    fn decode(&self, info: &ChunkInfo, blob: &[u8], out: &mut [u8]) -> Result<()> {
        let params = self.params(info)?;
        let popped = self.decoders.lock().pop();
        let mut dec = popped.unwrap_or_default();
        let r = (|| {
            let open = dec.open(blob)?;
            let h = open.header();
            let mismatch = |what, expected: usize, found: usize| {
                Err(Error::BlobMismatch {
                    what,
                    expected,
                    found,
                })
            };
            if h.dtype != params.dtype {
                return mismatch("dtype width", params.dtype.size(), h.dtype.size());
            }
            if h.channels != params.channels {
                return mismatch("channels", params.channels as usize, h.channels as usize);
            }
            if h.tokens as usize != info.count || h.decoded_len() != out.len() {
                return mismatch("tokens", info.count, h.tokens as usize);
            }
            open.decode_into(out)?;
            Ok(())
        })();
        self.decoders.lock().push(dec);
        r
    }
}

/// C8 (int8 per channel, msmodelslim's scheme, via `kvc-int8`), then a lossless codec
/// on the int8 bytes (gear-v1 or gear-v2). Lossy: restores give the dequantized values,
/// rounded to the cache dtype.
pub struct C8Codec {
    params: C8Params,
    inner: Arc<dyn StoreCodec>,
}

impl C8Codec {
    /// With per-layer C8 parameters and the lossless codec of the int8 bytes (it is handed
    /// chunks whose dtype is [`Dtype::I8`]).
    pub fn new(params: C8Params, inner: Arc<dyn StoreCodec>) -> C8Codec {
        C8Codec { params, inner }
    }

    /// C8 then gear-v1 with `options`.
    pub fn gear_v1(params: C8Params, options: EncodeOptions) -> Result<C8Codec> {
        Ok(C8Codec::new(params, Arc::new(GearV1Codec::new(options)?)))
    }

    /// C8 then gear-v2 with its default chunking.
    pub fn gear_v2(params: C8Params) -> C8Codec {
        C8Codec::new(params, Arc::new(GearV2Codec::default()))
    }

    fn quant(&self, info: &ChunkInfo) -> Result<&ChannelQuant> {
        let l = self.params.require(info.layer)?;
        Ok(match info.tensor {
            Tensor::K => &l.k,
            Tensor::V => &l.v,
        })
    }

    fn int8_info(info: &ChunkInfo) -> ChunkInfo {
        ChunkInfo {
            dtype: Dtype::I8,
            ..*info
        }
    }

    fn quantize(&self, info: &ChunkInfo, raw: &[u8]) -> Result<Vec<u8>> {
        let src = info.layout(info.dtype)?;
        let dst = info.layout(Dtype::I8)?;
        let mut q = vec![0u8; info.count * info.n_heads * info.head_dim];
        if info.count > 0 {
            quantize(raw, &src, &mut q, &dst, 0..info.count, self.quant(info)?)?;
        }
        Ok(q)
    }

    fn dequantize(&self, info: &ChunkInfo, q: &[u8], out: &mut [u8]) -> Result<()> {
        if info.count == 0 {
            return Ok(());
        }
        let src = info.layout(Dtype::I8)?;
        let dst = info.layout(info.dtype)?;
        dequantize(q, &src, out, &dst, 0..info.count, self.quant(info)?)?;
        Ok(())
    }
}

impl StoreCodec for C8Codec {
    fn name(&self) -> String {
        format!("c8+{}", self.inner.name())
    }
    fn is_lossless(&self) -> bool {
        false
    }
    fn encode(&self, info: &ChunkInfo, raw: &[u8], blob: &mut Vec<u8>) -> Result<()> {
        let q = self.quantize(info, raw)?;
        self.inner.encode(&Self::int8_info(info), &q, blob)
    }
    fn decode(&self, info: &ChunkInfo, blob: &[u8], out: &mut [u8]) -> Result<()> {
        let mut q = vec![0u8; info.count * info.n_heads * info.head_dim];
        self.inner.decode(&Self::int8_info(info), blob, &mut q)?;
        self.dequantize(info, &q, out)
    }
    fn reference(&self, info: &ChunkInfo, raw: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let q = self.quantize(info, raw)?;
        out.clear();
        out.resize(raw.len(), 0);
        self.dequantize(info, &q, out)
    }
}
