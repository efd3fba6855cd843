//! Content addresses: the model-and-layout [`Fingerprint`] and the chained [`ChunkKey`].
//!
//! The key of chunk `i` of a token sequence is, as vLLM's prefix-cache block hash,
//! `BLAKE3("kvc-tiers chunk v1" ‖ key(i-1) ‖ fingerprint ‖ n ‖ token ids)`, with 32 zero
//! bytes for the key before the first chunk. So a key names the whole prefix up to the end
//! of its chunk, under one model, layout and codec: equal keys mean equal KV (up to a
//! BLAKE3 collision), and a second engine instance that sees the same prefix finds the
//! work the first one did. docs/formats/kv-chunk.md gives the exact bytes.

use std::fmt;
use std::io::Read;
use std::path::Path;

use kvc_types::Dtype;

use crate::codec::ChunkCodec;
use crate::error::{Error, Result};

/// The shape of every chunk of one [`crate::Tiers`]: the model's KV layout and the chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkShape {
    /// Layers.
    pub n_layer: usize,
    /// KV heads per layer.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// The cache's element type (f16, bf16 or f32).
    pub dtype: Dtype,
    /// Tokens per chunk (256 by default in engines).
    pub chunk_tokens: usize,
}

/// The largest value of each shape field (the blob stores them as `u32`; this bound also
/// keeps `n_layer * chunk_tokens * row` far from overflow).
pub const MAX_DIM: usize = 1 << 20;

impl ChunkShape {
    /// Checks every field: non-zero, at most [`MAX_DIM`], dtype not int8, and one chunk's
    /// K plus V at most 4 GiB.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("n_layer", self.n_layer),
            ("n_kv_head", self.n_kv_head),
            ("head_dim", self.head_dim),
            ("chunk_tokens", self.chunk_tokens),
        ] {
            if v == 0 || v > MAX_DIM {
                return Err(Error::invalid(
                    field,
                    format!("{v} is not in 1..={MAX_DIM}"),
                ));
            }
        }
        if self.dtype == Dtype::I8 {
            return Err(Error::invalid(
                "dtype",
                "int8 caches are not stored in tiers",
            ));
        }
        let total =
            (self.n_layer as u128) * (self.chunk_tokens as u128) * (self.row_bytes() as u128) * 2;
        if total > u32::MAX as u128 {
            return Err(Error::invalid(
                "shape",
                format!("one chunk would hold {total} bytes of K and V, more than 4 GiB"),
            ));
        }
        Ok(())
    }

    /// Bytes of one token of one layer of K (or V).
    pub fn row_bytes(&self) -> usize {
        self.n_kv_head * self.head_dim * self.dtype.size()
    }

    /// Bytes of one chunk of one layer of K (or V).
    pub fn section_bytes(&self) -> usize {
        self.chunk_tokens * self.row_bytes()
    }

    /// Bytes of one chunk's K and V, all layers, uncompressed.
    pub fn chunk_raw_bytes(&self) -> usize {
        2 * self.n_layer * self.section_bytes()
    }
}

pub(crate) fn dtype_id(d: Dtype) -> u8 {
    match d {
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
        Dtype::F32 => 3,
        Dtype::I8 => 4,
    }
}

/// What a chunk's KV depends on besides its tokens: the model file, the KV layout, the
/// element type, the chunk size and the codec. Two engines share chunks exactly when
/// their fingerprints are equal.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a model whose file hashes to `model_hash` (see
    /// [`hash_model_file`]), with `shape` and `codec`.
    pub fn new(model_hash: &[u8; 32], shape: &ChunkShape, codec: &ChunkCodec) -> Fingerprint {
        Fingerprint::with_config(model_hash, shape, &codec.config_string())
    }

    /// [`Fingerprint::new`] with a codec's config string given directly (the transform
    /// coder's names its bound and its calibration's fingerprint).
    pub fn with_config(model_hash: &[u8; 32], shape: &ChunkShape, cfg: &str) -> Fingerprint {
        let mut h = blake3::Hasher::new();
        h.update(b"kvc-tiers fingerprint v1\0");
        h.update(model_hash);
        for v in [
            shape.n_layer,
            shape.n_kv_head,
            shape.head_dim,
            shape.chunk_tokens,
        ] {
            h.update(&(v as u32).to_le_bytes());
        }
        h.update(&[dtype_id(shape.dtype)]);
        h.update(&(cfg.len() as u32).to_le_bytes());
        h.update(cfg.as_bytes());
        Fingerprint(*h.finalize().as_bytes())
    }

    /// Lower-case hex, 64 characters (messages).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", hex(&self.0))
    }
}

/// BLAKE3 of a model file's bytes, streamed (the `model_hash` of [`Fingerprint::new`]).
pub fn hash_model_file(path: &Path) -> Result<[u8; 32]> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("open model {}", path.display()), e))?;
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io(format!("read model {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(*h.finalize().as_bytes())
}

/// The content address of one chunk: names the chunk's K and V for all layers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey(pub [u8; 32]);

impl ChunkKey {
    /// The key before the first chunk (32 zero bytes).
    pub const ROOT: ChunkKey = ChunkKey([0; 32]);

    /// The key of the chunk of `tokens` that follows the chunk keyed `prev`.
    pub fn next(prev: &ChunkKey, fp: &Fingerprint, tokens: &[u32]) -> ChunkKey {
        let mut h = blake3::Hasher::new();
        h.update(b"kvc-tiers chunk v1\0");
        h.update(&prev.0);
        h.update(&fp.0);
        h.update(&(tokens.len() as u32).to_le_bytes());
        let mut buf = [0u8; 4 * 256];
        for part in tokens.chunks(256) {
            for (d, t) in buf.chunks_exact_mut(4).zip(part) {
                d.copy_from_slice(&t.to_le_bytes());
            }
            h.update(&buf[..4 * part.len()]);
        }
        ChunkKey(*h.finalize().as_bytes())
    }

    /// Lower-case hex, 64 characters (file names and Redis keys).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses [`ChunkKey::to_hex`]'s form; `None` for anything else.
    pub fn from_hex(s: &str) -> Option<ChunkKey> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            let nib = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            *o = (nib(pair[0])? << 4) | nib(pair[1])?;
        }
        Some(ChunkKey(out))
    }
}

impl fmt::Debug for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkKey({})", &self.to_hex()[..16])
    }
}

/// The keys of every full chunk of `tokens` (a trailing partial chunk has no key).
pub fn chain_keys(fp: &Fingerprint, chunk_tokens: usize, tokens: &[u32]) -> Vec<ChunkKey> {
    let mut prev = ChunkKey::ROOT;
    tokens
        .chunks_exact(chunk_tokens.max(1))
        .map(|c| {
            prev = ChunkKey::next(&prev, fp, c);
            prev
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * b.len());
    for &x in b {
        s.push(H[(x >> 4) as usize] as char);
        s.push(H[(x & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ChunkShape {
        ChunkShape {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 4,
            dtype: Dtype::F16,
            chunk_tokens: 4,
        }
    }

    #[test]
    fn keys_chain_and_cover_everything() {
        let fp = Fingerprint::new(&[1; 32], &shape(), &ChunkCodec::GearV2);
        let toks: Vec<u32> = (0..13).collect();
        let k = chain_keys(&fp, 4, &toks);
        assert_eq!(k.len(), 3);
        // A prefix has the same keys; a change in chunk 1 changes chunk 1 and 2, not 0.
        assert_eq!(chain_keys(&fp, 4, &toks[..8]), k[..2]);
        let mut t2 = toks.clone();
        t2[5] = 99;
        let k2 = chain_keys(&fp, 4, &t2);
        assert_eq!(k2[0], k[0]);
        assert_ne!(k2[1], k[1]);
        assert_ne!(k2[2], k[2]);
        // Another model, layout, dtype or codec changes every key.
        let others = [
            Fingerprint::new(&[2; 32], &shape(), &ChunkCodec::GearV2),
            Fingerprint::new(
                &[1; 32],
                &ChunkShape {
                    n_layer: 3,
                    ..shape()
                },
                &ChunkCodec::GearV2,
            ),
            Fingerprint::new(
                &[1; 32],
                &ChunkShape {
                    n_kv_head: 1,
                    ..shape()
                },
                &ChunkCodec::GearV2,
            ),
            Fingerprint::new(
                &[1; 32],
                &ChunkShape {
                    head_dim: 8,
                    ..shape()
                },
                &ChunkCodec::GearV2,
            ),
            Fingerprint::new(
                &[1; 32],
                &ChunkShape {
                    dtype: Dtype::Bf16,
                    ..shape()
                },
                &ChunkCodec::GearV2,
            ),
            Fingerprint::new(&[1; 32], &shape(), &ChunkCodec::GearV1),
            Fingerprint::new(&[1; 32], &shape(), &ChunkCodec::Raw),
            Fingerprint::new(&[1; 32], &shape(), &ChunkCodec::KvqK4V4),
            Fingerprint::new(&[1; 32], &shape(), &ChunkCodec::KvqK8V4),
            Fingerprint::new(&[1; 32], &shape(), &ChunkCodec::KvqK4V2),
        ];
        for (i, o) in others.iter().enumerate() {
            assert_ne!(*o, fp);
            assert_ne!(chain_keys(o, 4, &toks)[0], k[0]);
            // ... and every pair differs (the kvq presets among themselves included).
            for p in &others[i + 1..] {
                assert_ne!(o, p);
            }
        }
    }

    #[test]
    fn hex_round_trip() {
        let k = ChunkKey::next(&ChunkKey::ROOT, &Fingerprint([7; 32]), &[1, 2, 3]);
        assert_eq!(ChunkKey::from_hex(&k.to_hex()), Some(k));
        assert_eq!(ChunkKey::from_hex("zz"), None);
        assert_eq!(ChunkKey::from_hex(&"A".repeat(64)), None);
    }
}
