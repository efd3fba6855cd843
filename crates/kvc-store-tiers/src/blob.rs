//! The kv-chunk blob: one chunk's K and V for all layers, self-describing and checksummed.
//! The exact bytes are specified in docs/formats/kv-chunk.md; this module is the one
//! writer and the one reader, and the reader validates every field before it trusts it.

use kvc_store_codec::Tensor;
use kvc_types::Dtype;
use rayon::prelude::*;

use crate::codec::{ChunkCodec, SectionCoder};
use crate::error::{Error, Result};
use crate::key::{dtype_id, ChunkKey, ChunkShape, Fingerprint, MAX_DIM};

/// The first 8 bytes of every blob.
pub const MAGIC: [u8; 8] = *b"KVCCHUNK";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 112;
/// Bytes of the trailing BLAKE3 checksum.
pub const CHECKSUM_LEN: usize = 32;

/// The fixed header of a blob, parsed and checked for self-consistency only (magic,
/// version, header length, total length), not against any expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobHeader {
    /// The codec id (see [`ChunkCodec::id`]).
    pub codec: u8,
    /// The dtype id (1 f16, 2 bf16, 3 f32).
    pub dtype: u8,
    /// Layers.
    pub n_layer: u32,
    /// KV heads.
    pub n_kv_head: u32,
    /// Values per head.
    pub head_dim: u32,
    /// Tokens in the chunk.
    pub n_tokens: u32,
    /// The key the blob was stored under.
    pub key: ChunkKey,
    /// The fingerprint of the model, layout and codec it was made for.
    pub fingerprint: Fingerprint,
    /// Bytes of the section table and sections.
    pub payload_len: u64,
}

/// Little-endian integers at `o` (the caller has checked the length); the kv-prefix reader
/// reads its header with the same helpers.
pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(w)
}
fn arr32(b: &[u8], o: usize) -> [u8; 32] {
    let mut w = [0u8; 32];
    w.copy_from_slice(&b[o..o + 32]);
    w
}

impl BlobHeader {
    /// Parses the header of `blob` (at least [`HEADER_LEN`] bytes of it).
    pub fn parse(blob: &[u8]) -> Result<BlobHeader> {
        if blob.len() < HEADER_LEN {
            return Err(Error::BadLength {
                expected: (HEADER_LEN + CHECKSUM_LEN) as u64,
                found: blob.len() as u64,
            });
        }
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&blob[..8]);
        if magic != MAGIC {
            return Err(Error::BadMagic { found: magic });
        }
        let version = u16_at(blob, 8);
        if version != VERSION {
            return Err(Error::BadVersion { found: version });
        }
        let header_len = u32_at(blob, 28);
        if header_len as usize != HEADER_LEN {
            return Err(Error::BadField {
                field: "header_len",
                expected: HEADER_LEN as u64,
                found: header_len.into(),
            });
        }
        let reserved = u64_at(blob, 104);
        if reserved != 0 {
            return Err(Error::BadField {
                field: "reserved",
                expected: 0,
                found: reserved,
            });
        }
        Ok(BlobHeader {
            codec: blob[10],
            dtype: blob[11],
            n_layer: u32_at(blob, 12),
            n_kv_head: u32_at(blob, 16),
            head_dim: u32_at(blob, 20),
            n_tokens: u32_at(blob, 24),
            key: ChunkKey(arr32(blob, 32)),
            fingerprint: Fingerprint(arr32(blob, 64)),
            payload_len: u64_at(blob, 96),
        })
    }

    /// Bytes of the whole blob this header declares (saturating: a huge value never
    /// equals a real length).
    pub fn total_len(&self) -> u64 {
        self.payload_len
            .saturating_add((HEADER_LEN + CHECKSUM_LEN) as u64)
    }
}

/// Encodes one chunk. `k` and `v` are `[n_layer][..][row]` with `layer_stride` bytes from
/// one layer to the next; the chunk's tokens start `offset` bytes into each layer, at
/// position `pos0` of the sequence.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_chunk(
    coder: &SectionCoder,
    shape: &ChunkShape,
    key: &ChunkKey,
    fp: &Fingerprint,
    k: &[u8],
    v: &[u8],
    layer_stride: usize,
    offset: usize,
    pos0: u64,
) -> Result<Vec<u8>> {
    let sec = shape.section_bytes();
    let table = 8 * shape.n_layer;
    let mut out = Vec::with_capacity(HEADER_LEN + table + 2 * shape.n_layer * sec + CHECKSUM_LEN);
    out.resize(HEADER_LEN + table, 0);
    let mut scratch = Vec::new();
    for layer in 0..shape.n_layer {
        for (ti, (tensor, src)) in [(Tensor::K, k), (Tensor::V, v)].into_iter().enumerate() {
            let from = layer * layer_stride + offset;
            let raw = src.get(from..from + sec).ok_or_else(|| {
                Error::invalid(
                    "kv",
                    format!(
                        "layer {layer} {} needs bytes {from}..{}, has {}",
                        tensor.name(),
                        from + sec,
                        src.len()
                    ),
                )
            })?;
            let before = out.len();
            coder.encode(
                pos0,
                layer,
                tensor,
                shape.dtype,
                shape.n_kv_head,
                shape.head_dim,
                shape.chunk_tokens,
                raw,
                &mut scratch,
                &mut out,
            )?;
            let len = u32::try_from(out.len() - before)
                .map_err(|_| Error::invalid("kv", "a section is over 4 GiB"))?;
            let t = HEADER_LEN + 8 * layer + 4 * ti;
            out[t..t + 4].copy_from_slice(&len.to_le_bytes());
        }
    }
    let payload_len = (out.len() - HEADER_LEN) as u64;
    out[..8].copy_from_slice(&MAGIC);
    out[8..10].copy_from_slice(&VERSION.to_le_bytes());
    out[10] = coder.codec.id();
    out[11] = dtype_id(shape.dtype);
    for (o, v) in [
        (12, shape.n_layer),
        (16, shape.n_kv_head),
        (20, shape.head_dim),
        (24, shape.chunk_tokens),
        (28, HEADER_LEN),
    ] {
        out[o..o + 4].copy_from_slice(&(v as u32).to_le_bytes());
    }
    out[32..64].copy_from_slice(&key.0);
    out[64..96].copy_from_slice(&fp.0);
    out[96..104].copy_from_slice(&payload_len.to_le_bytes());
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    Ok(out)
}

/// Validates `blob` completely without decoding it: length, magic, version, checksum,
/// fingerprint, key, codec, dtype, shape and the section table (lengths that tile the
/// payload exactly). Returns the section lengths, `[K, V]` per layer.
pub(crate) fn check_chunk(
    coder: &SectionCoder,
    shape: &ChunkShape,
    key: &ChunkKey,
    fp: &Fingerprint,
    blob: &[u8],
) -> Result<Vec<[usize; 2]>> {
    let h = verify(blob)?;
    if h.fingerprint != *fp {
        return Err(Error::ForeignBlob {
            what: "model, layout or codec (fingerprint)",
        });
    }
    if h.key != *key {
        return Err(Error::ForeignBlob { what: "key" });
    }
    let expect = |field: &'static str, expected: u64, found: u64| {
        if expected == found {
            Ok(())
        } else {
            Err(Error::BadField {
                field,
                expected,
                found,
            })
        }
    };
    expect("codec", coder.codec.id().into(), h.codec.into())?;
    expect("dtype", dtype_id(shape.dtype).into(), h.dtype.into())?;
    expect("n_layer", shape.n_layer as u64, h.n_layer.into())?;
    expect("n_kv_head", shape.n_kv_head as u64, h.n_kv_head.into())?;
    expect("head_dim", shape.head_dim as u64, h.head_dim.into())?;
    expect("n_tokens", shape.chunk_tokens as u64, h.n_tokens.into())?;
    debug_assert!(shape.n_layer <= MAX_DIM);
    let table = 8 * shape.n_layer;
    let payload_len = blob.len() - HEADER_LEN - CHECKSUM_LEN;
    if payload_len < table {
        return Err(Error::BadField {
            field: "payload_len",
            expected: table as u64,
            found: payload_len as u64,
        });
    }
    let tab = &blob[HEADER_LEN..HEADER_LEN + table];
    let mut lens = Vec::with_capacity(shape.n_layer);
    let mut rest = (payload_len - table) as u64;
    for layer in 0..shape.n_layer {
        let mut pair = [0usize; 2];
        for (ti, p) in pair.iter_mut().enumerate() {
            let len = u64::from(u32_at(tab, 8 * layer + 4 * ti));
            if len > rest {
                return Err(Error::BadField {
                    field: "section length",
                    expected: rest,
                    found: len,
                });
            }
            rest -= len;
            *p = len as usize;
        }
        lens.push(pair);
    }
    if rest != 0 {
        return Err(Error::BadField {
            field: "bytes after the last section",
            expected: 0,
            found: rest,
        });
    }
    Ok(lens)
}

/// Decodes a blob that passed [`check_chunk`] (with its section lengths; its first token
/// at position `pos0`) into one piece
/// per layer of K and of V, each exactly one section's bytes. The sections decode in
/// parallel on the rayon pool (each is independent), so a restore of fewer chunks than
/// threads still uses them all; the first error in section order is returned.
pub(crate) fn decode_checked(
    coder: &SectionCoder,
    shape: &ChunkShape,
    blob: &[u8],
    lens: &[[usize; 2]],
    pos0: u64,
    k: &mut [&mut [u8]],
    v: &mut [&mut [u8]],
) -> Result<()> {
    let mut at = HEADER_LEN + 8 * shape.n_layer;
    let mut jobs: Vec<(usize, Tensor, &[u8], &mut [u8])> = Vec::with_capacity(2 * lens.len());
    for ((layer, pair), (kd, vd)) in lens.iter().enumerate().zip(k.iter_mut().zip(v.iter_mut())) {
        for (ti, (tensor, dst)) in [(Tensor::K, &mut **kd), (Tensor::V, &mut **vd)]
            .into_iter()
            .enumerate()
        {
            jobs.push((layer, tensor, &blob[at..at + pair[ti]], dst));
            at += pair[ti];
        }
    }
    jobs.into_par_iter()
        .map(|(layer, tensor, section, dst)| {
            coder.decode(
                pos0,
                layer,
                tensor,
                shape.dtype,
                shape.n_kv_head,
                shape.head_dim,
                shape.chunk_tokens,
                section,
                dst,
            )
        })
        .collect::<Vec<Result<()>>>()
        .into_iter()
        .collect()
}

/// Checks what a blob says about itself: header, exact length and checksum. Tiers use it
/// to vet files and values without a model at hand.
pub fn verify(blob: &[u8]) -> Result<BlobHeader> {
    let h = BlobHeader::parse(blob)?;
    if h.total_len() != blob.len() as u64 {
        return Err(Error::BadLength {
            expected: h.total_len(),
            found: blob.len() as u64,
        });
    }
    let (body, sum) = blob.split_at(blob.len() - CHECKSUM_LEN);
    if blake3::hash(body).as_bytes() != sum {
        return Err(Error::ChecksumMismatch);
    }
    if ChunkCodec::from_id(h.codec).is_none() {
        return Err(Error::BadField {
            field: "codec",
            expected: 5,
            found: h.codec.into(),
        });
    }
    Ok(h)
}

/// The dtype of a stored dtype id.
pub fn dtype_of_id(id: u8) -> Option<Dtype> {
    match id {
        1 => Some(Dtype::F16),
        2 => Some(Dtype::Bf16),
        3 => Some(Dtype::F32),
        _ => None,
    }
}
