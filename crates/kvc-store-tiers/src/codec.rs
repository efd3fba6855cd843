//! The codecs a chunk's sections are stored with: raw (the cache's own bytes), gear-v1 and
//! gear-v2 (both lossless, from `kvc-codec` through `kvc-store-codec`'s [`StoreCodec`]
//! implementations, which keep reusable per-thread encoders and decoders), and kvq
//! (lossy: `kvc-kvq`'s rotated Lloyd-Max rows, three K/V bit presets), and the transform
//! coder (lossy: `kvc-transform-coder`, calibrated per model, `tc-<bound>`).

use std::sync::Arc;

use kvc_kvq::{config::DEFAULT_SEED, Method, RowCodec};
use kvc_store_codec::{ChunkInfo, GearV1Codec, GearV2Codec, StoreCodec, Tensor};
use kvc_transform_coder::TransformCodec;
use kvc_types::{load_f32, store_f32, Dtype};

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
    /// kvq, Lloyd-Max, 4-bit K and 4-bit V rows (id 3), lossy (docs/formats/kvq.md).
    KvqK4V4,
    /// kvq, Lloyd-Max, 8-bit K and 4-bit V rows (id 4), lossy.
    KvqK8V4,
    /// kvq, Lloyd-Max, 4-bit K and 2-bit V rows (id 5), lossy.
    KvqK4V2,
    /// The transform coder (id 6), lossy: a calibration file and a target make it a
    /// [`TransformCodec`] (`tc-<bound>`), given to [`crate::Tiers::with_transform`].
    Transform,
}

impl ChunkCodec {
    /// Every codec.
    pub const ALL: [ChunkCodec; 7] = [
        ChunkCodec::Raw,
        ChunkCodec::GearV1,
        ChunkCodec::GearV2,
        ChunkCodec::KvqK4V4,
        ChunkCodec::KvqK8V4,
        ChunkCodec::KvqK4V2,
        ChunkCodec::Transform,
    ];

    /// The id stored in blobs.
    pub fn id(self) -> u8 {
        match self {
            ChunkCodec::Raw => 0,
            ChunkCodec::GearV1 => 1,
            ChunkCodec::GearV2 => 2,
            ChunkCodec::KvqK4V4 => 3,
            ChunkCodec::KvqK8V4 => 4,
            ChunkCodec::KvqK4V2 => 5,
            ChunkCodec::Transform => 6,
        }
    }

    /// Whether a restore gives back exactly the stored bytes (raw, gear-v1, gear-v2) or
    /// an approximation (kvq: callers must not expect identical bytes or logits).
    pub fn lossless(self) -> bool {
        matches!(
            self,
            ChunkCodec::Raw | ChunkCodec::GearV1 | ChunkCodec::GearV2
        )
    }

    /// K and V bits of a kvq preset; `None` for the lossless codecs.
    pub fn kvq_bits(self) -> Option<(u8, u8)> {
        match self {
            ChunkCodec::Raw | ChunkCodec::GearV1 | ChunkCodec::GearV2 | ChunkCodec::Transform => {
                None
            }
            ChunkCodec::KvqK4V4 => Some((4, 4)),
            ChunkCodec::KvqK8V4 => Some((8, 4)),
            ChunkCodec::KvqK4V2 => Some((4, 2)),
        }
    }

    /// The codec of a stored id.
    pub fn from_id(id: u8) -> Option<ChunkCodec> {
        ChunkCodec::ALL.into_iter().find(|c| c.id() == id)
    }

    /// `raw`, `gear-v1`, `gear-v2`, `kvq-k4v4`, `kvq-k8v4`, `kvq-k4v2` or `tc` (whose
    /// codecs are named `tc-<bound>`, see [`TransformCodec::name`]).
    pub fn name(self) -> &'static str {
        match self {
            ChunkCodec::Raw => "raw",
            ChunkCodec::GearV1 => "gear-v1",
            ChunkCodec::GearV2 => "gear-v2",
            ChunkCodec::KvqK4V4 => "kvq-k4v4",
            ChunkCodec::KvqK8V4 => "kvq-k8v4",
            ChunkCodec::KvqK4V2 => "kvq-k4v2",
            ChunkCodec::Transform => "tc",
        }
    }

    /// The codec named `name` (as [`ChunkCodec::name`]; `kvq` alone is `kvq-k4v4`,
    /// `tc-<bound>` is [`ChunkCodec::Transform`]).
    pub fn from_name(name: &str) -> Result<ChunkCodec> {
        if name == "kvq" {
            return Ok(ChunkCodec::KvqK4V4);
        }
        if name.starts_with("tc-") {
            kvc_transform_coder::parse_name(name)
                .map_err(|e| Error::invalid("codec", e.to_string()))?;
            return Ok(ChunkCodec::Transform);
        }
        ChunkCodec::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| {
                Error::invalid(
                    "codec",
                    format!(
                        "{name:?}: expected raw, gear-v1, gear-v2, kvq (= kvq-k4v4), \
                         kvq-k8v4, kvq-k4v2 or tc-<bound> (with a calibration file)"
                    ),
                )
            })
    }

    /// Everything about the codec that changes the stored bytes, for the fingerprint (the
    /// transform coder's is [`TransformCodec::config_string`], which names its bound and
    /// calibration).
    pub fn config_string(self) -> String {
        match self {
            ChunkCodec::Transform => "tc/without-calibration".to_string(),
            ChunkCodec::Raw => "raw".to_string(),
            ChunkCodec::GearV1 => "gear-v1/default-options".to_string(),
            ChunkCodec::GearV2 => format!(
                "gear-v2/chunk_tokens={}",
                kvc_codec::gear_v2::DEFAULT_CHUNK_TOKENS
            ),
            ChunkCodec::KvqK4V4 | ChunkCodec::KvqK8V4 | ChunkCodec::KvqK4V2 => {
                let (kb, vb) = self.kvq_bits().unwrap_or_default();
                format!(
                    "kvq/format={}/lm/k{kb}v{vb}/seed={DEFAULT_SEED:#x}",
                    kvc_kvq::FORMAT_VERSION
                )
            }
        }
    }
}

/// The K and V row codecs of a kvq preset.
struct KvqRows {
    k: RowCodec,
    v: RowCodec,
}

impl KvqRows {
    fn row(&self, tensor: Tensor) -> &RowCodec {
        match tensor {
            Tensor::K => &self.k,
            Tensor::V => &self.v,
        }
    }
}

/// A transform coder's error as the tiers report it: a value it cannot code refuses the
/// chunk ([`Error::NonFinite`], counted); anything else is a codec failure of the section.
fn tc_error(layer: usize, tensor: Tensor, e: kvc_transform_coder::Error) -> Error {
    match e {
        kvc_transform_coder::Error::NonFinite { row, index } => Error::NonFinite {
            layer,
            tensor: tensor.name(),
            row,
            index,
        },
        e => Error::Codec {
            layer,
            tensor: tensor.name(),
            reason: e.to_string(),
        },
    }
}

/// Values per row (one token of one KV head): the largest head_dim kvq takes.
const MAX_ROW: usize = 256;

/// A codec ready to encode and decode sections, shared by threads.
#[derive(Clone)]
pub(crate) struct SectionCoder {
    pub(crate) codec: ChunkCodec,
    inner: Option<Arc<dyn StoreCodec>>,
    kvq: Option<Arc<KvqRows>>,
    tc: Option<Arc<TransformCodec>>,
}

impl SectionCoder {
    /// The coder of `codec` for rows of `head_dim` values (kvq takes 64, 128 or 256);
    /// `tc` is required for [`ChunkCodec::Transform`] and refused with any other codec.
    pub(crate) fn new(
        codec: ChunkCodec,
        head_dim: usize,
        tc: Option<Arc<TransformCodec>>,
    ) -> Result<SectionCoder> {
        if (codec == ChunkCodec::Transform) != tc.is_some() {
            return Err(Error::invalid(
                "codec",
                if tc.is_some() {
                    format!("a transform codec given with {}", codec.name())
                } else {
                    "tc-<bound> needs a calibration file (Tiers::with_transform)".to_string()
                },
            ));
        }
        let kvq = match codec.kvq_bits() {
            None => None,
            Some((kb, vb)) => {
                let mk = |bits| {
                    RowCodec::new(Method::LloydMax, bits, head_dim, DEFAULT_SEED).map_err(|e| {
                        Error::invalid(
                            "codec",
                            format!("{} at head_dim {head_dim}: {e}", codec.name()),
                        )
                    })
                };
                Some(Arc::new(KvqRows {
                    k: mk(kb)?,
                    v: mk(vb)?,
                }))
            }
        };
        let inner: Option<Arc<dyn StoreCodec>> = match codec {
            ChunkCodec::Raw
            | ChunkCodec::KvqK4V4
            | ChunkCodec::KvqK8V4
            | ChunkCodec::KvqK4V2
            | ChunkCodec::Transform => None,
            ChunkCodec::GearV1 => Some(Arc::new(
                GearV1Codec::new(kvc_codec::gear_v1::EncodeOptions::default()).map_err(|e| {
                    Error::invalid("codec", format!("gear-v1 options rejected: {e}"))
                })?,
            )),
            ChunkCodec::GearV2 => Some(Arc::new(GearV2Codec::default())),
        };
        Ok(SectionCoder {
            codec,
            inner,
            kvq,
            tc,
        })
    }

    /// Quantizes `n * heads` rows of `dim` values of `raw` into packed kvq rows on `out`.
    /// A non-finite value refuses the whole section with [`Error::NonFinite`] before
    /// anything is written for its row.
    #[allow(clippy::too_many_arguments)]
    fn kvq_encode(
        rows: &KvqRows,
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
        dim: usize,
        raw: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let rc = rows.row(tensor);
        let (rb, es) = (rc.row_bytes(), dtype.size());
        let n_rows = raw.len() / (dim * es);
        let mut x = [0f32; MAX_ROW];
        let x = &mut x[..dim];
        let start = out.len();
        out.resize(start + n_rows * rb, 0);
        for (r, src) in raw.chunks_exact(dim * es).enumerate() {
            load_f32(dtype, src, x);
            if let Some(i) = x.iter().position(|v| !v.is_finite()) {
                out.truncate(start);
                return Err(Error::NonFinite {
                    layer,
                    tensor: tensor.name(),
                    row: r,
                    index: i,
                });
            }
            let o = start + r * rb;
            if let Err(e) = rc.quantize_row(x, &mut out[o..o + rb]) {
                out.truncate(start);
                return Err(Error::Codec {
                    layer,
                    tensor: tensor.name(),
                    reason: e.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Dequantizes packed kvq rows `blob` into exactly `out` (in `dtype`).
    fn kvq_decode(
        rows: &KvqRows,
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
        dim: usize,
        blob: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        let rc = rows.row(tensor);
        let (rb, es) = (rc.row_bytes(), dtype.size());
        let n_rows = out.len() / (dim * es);
        if blob.len() != n_rows * rb {
            return Err(Error::BadField {
                field: "kvq section length",
                expected: (n_rows * rb) as u64,
                found: blob.len() as u64,
            });
        }
        let mut x = [0f32; MAX_ROW];
        let x = &mut x[..dim];
        for (packed, dst) in blob.chunks_exact(rb).zip(out.chunks_exact_mut(dim * es)) {
            rc.dequantize_row(packed, x).map_err(|e| Error::Codec {
                layer,
                tensor: tensor.name(),
                reason: e.to_string(),
            })?;
            store_f32(dtype, x, dst);
        }
        Ok(())
    }

    fn info(
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
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

    /// Appends the encoding of `raw` (`n` tokens of one layer's K or V, the first at
    /// position `pos0`) to `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode(
        &self,
        pos0: u64,
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
        heads: usize,
        dim: usize,
        n: usize,
        raw: &[u8],
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if let Some(rows) = &self.kvq {
            return Self::kvq_encode(rows, layer, tensor, dtype, dim, raw, out);
        }
        if let Some(tc) = &self.tc {
            return tc
                .encode_section(layer, tensor, dtype, pos0, n, raw, out)
                .map_err(|e| tc_error(layer, tensor, e));
        }
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

    /// Decodes `blob` into exactly `out` (`n` tokens of one layer's K or V, the first at
    /// position `pos0`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode(
        &self,
        pos0: u64,
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
        heads: usize,
        dim: usize,
        n: usize,
        blob: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        if let Some(rows) = &self.kvq {
            return Self::kvq_decode(rows, layer, tensor, dtype, dim, blob, out);
        }
        if let Some(tc) = &self.tc {
            return tc
                .decode_section(layer, tensor, dtype, pos0, n, blob, out)
                .map_err(|e| tc_error(layer, tensor, e));
        }
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
