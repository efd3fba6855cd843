//! The gear-v2 blob header, the chunk index and the value fields of each dtype.
//!
//! Byte layout (all integers little-endian), see `docs/formats/gear-v2.md`:
//!
//! ```text
//! 0   magic "KVG2"      4  version (2)   5 dtype   6 kind   7 flags
//! 8   tokens u32        12 channels u32  16 chunk_tokens u32
//! 20  group_size u32    24 model_len u32 28 dict_rows u32 (version 3; 0 before)
//! 32  model section (model_len bytes: the Huffman tables)
//! ..  chunk index: one u32 byte length per chunk, after the row dictionary's when
//!     dict_rows > 0
//! ..  the row dictionary (a stored or coded chunk of dict_rows rows), then the chunks
//! ```

use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// The four bytes every gear-v2 blob starts with.
pub const MAGIC: [u8; 4] = *b"KVG2";
/// The format version this build writes. Version 2 added chunk mode 2 (repeated tokens),
/// version 3 the row dictionary (rows that repeat across chunks, stored once per blob);
/// this build reads versions 1 to 3.
pub const VERSION: u8 = 3;
/// The oldest format version this build reads.
pub const MIN_VERSION: u8 = 1;
/// Size of the fixed blob header in bytes.
pub const HEADER_LEN: usize = 32;
/// Flag bit: each symbol is coded with a table chosen by the sign of the previous token's
/// value in the same channel (two tables per channel group instead of one).
pub const FLAG_SIGN_CONTEXT: u8 = 1;
/// Flag bit: the shared-shape model (relative symbols, tables per cluster of channels,
/// codes up to 11 bits; `group_size` must be 1).
pub const FLAG_SHARED: u8 = 2;
/// Flag bit (version 3, int8 with the shared-shape model only): relative symbols are
/// wrapping differences `(s - loc) mod 256` instead of sign and magnitude.
pub const FLAG_WRAPPING: u8 = 4;
/// Flag bit (version 3, f32 with the shared-shape model only): the lowest byte of every
/// value is Huffman-coded with one more table, and 15 raw bits are packed above it.
pub const FLAG_LOW_BYTE: u8 = 8;
/// The largest channel count the format accepts.
pub const MAX_CHANNELS: u32 = 1 << 16;

/// Which cache tensor a blob holds; recorded for tools, it does not change decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TensorKind {
    /// Not recorded.
    #[default]
    Unspecified,
    /// Keys.
    K,
    /// Values.
    V,
}

impl TensorKind {
    fn code(self) -> u8 {
        match self {
            TensorKind::Unspecified => 0,
            TensorKind::K => 1,
            TensorKind::V => 2,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(TensorKind::Unspecified),
            1 => Some(TensorKind::K),
            2 => Some(TensorKind::V),
            _ => None,
        }
    }
}

pub(crate) fn dtype_code(d: Dtype) -> u8 {
    match d {
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
        Dtype::F32 => 3,
        Dtype::I8 => 4,
    }
}

fn dtype_from_code(c: u8) -> Option<Dtype> {
    match c {
        1 => Some(Dtype::F16),
        2 => Some(Dtype::Bf16),
        3 => Some(Dtype::F32),
        4 => Some(Dtype::I8),
        _ => None,
    }
}

/// How a value of a dtype is split: the top `sym_bits` bits (sign, exponent, and for f16 the
/// top two mantissa bits) are entropy-coded; the low `rest_bits` are stored packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSplit {
    /// Bits of the entropy-coded top field.
    pub sym_bits: u32,
    /// Bits stored raw below it.
    pub rest_bits: u32,
}

impl FieldSplit {
    /// The split gear-v2 uses for `dtype`.
    pub const fn of(dtype: Dtype) -> FieldSplit {
        match dtype {
            Dtype::F16 => FieldSplit {
                sym_bits: 8,
                rest_bits: 8,
            },
            Dtype::Bf16 => FieldSplit {
                sym_bits: 9,
                rest_bits: 7,
            },
            Dtype::F32 => FieldSplit {
                sym_bits: 9,
                rest_bits: 23,
            },
            Dtype::I8 => FieldSplit {
                sym_bits: 8,
                rest_bits: 0,
            },
        }
    }

    /// Alphabet size of the coded field.
    pub const fn alphabet(self) -> usize {
        1 << self.sym_bits
    }
}

/// The parsed fixed header of a gear-v2 blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobHeader {
    /// Format version the blob was written in ([`MIN_VERSION`]..=[`VERSION`]).
    pub version: u8,
    /// Element type.
    pub dtype: Dtype,
    /// Tensor kind recorded by the encoder.
    pub kind: TensorKind,
    /// Tokens (rows).
    pub tokens: u32,
    /// Channels per token (`kv_heads * head_dim`).
    pub channels: u32,
    /// Tokens per chunk (the last chunk may hold fewer).
    pub chunk_tokens: u32,
    /// Channels that share one statistics table.
    pub group_size: u32,
    /// Whether the previous token's sign selects the table.
    pub sign_context: bool,
    /// Whether the model is the shared-shape one (flag bit 1).
    pub shared: bool,
    /// Whether the shared-shape model's relative symbols are wrapping differences (flag
    /// bit 2; int8, version 3).
    pub wrapping: bool,
    /// Whether f32 low bytes are Huffman-coded (flag bit 3; version 3).
    pub low_byte: bool,
    /// Bytes of the model section.
    pub model_len: u32,
    /// Rows of the row dictionary (version 3; 0 in earlier versions): rows that repeat
    /// across chunks, decoded once per blob and referenced by the chunks' mode-2 tokens.
    pub dict_rows: u32,
}

impl BlobHeader {
    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        (self.tokens as usize).div_ceil(self.chunk_tokens as usize)
    }
    /// Number of channel groups.
    pub fn group_count(&self) -> usize {
        (self.channels as usize).div_ceil(self.group_size as usize)
    }
    /// Contexts per group (1 or 2).
    pub fn contexts(&self) -> usize {
        if self.sign_context {
            2
        } else {
            1
        }
    }
    /// Number of Huffman tables in the model section.
    pub fn table_count(&self) -> usize {
        self.group_count() * self.contexts()
    }
    /// Decoded size in bytes (checked: the header parser refuses sizes that overflow).
    pub fn decoded_len(&self) -> usize {
        self.tokens as usize * self.channels as usize * self.dtype.size()
    }
    /// Tokens held by chunk `i`.
    pub fn chunk_tokens_of(&self, i: usize) -> usize {
        let start = i * self.chunk_tokens as usize;
        (self.tokens as usize - start).min(self.chunk_tokens as usize)
    }
    /// Byte offset of the chunk index.
    pub fn index_offset(&self) -> usize {
        HEADER_LEN + self.model_len as usize
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(self.version);
        out.push(dtype_code(self.dtype));
        out.push(self.kind.code());
        out.push(
            if self.sign_context {
                FLAG_SIGN_CONTEXT
            } else {
                0
            } | if self.shared { FLAG_SHARED } else { 0 }
                | if self.wrapping { FLAG_WRAPPING } else { 0 }
                | if self.low_byte { FLAG_LOW_BYTE } else { 0 },
        );
        for v in [
            self.tokens,
            self.channels,
            self.chunk_tokens,
            self.group_size,
            self.model_len,
            self.dict_rows,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Parses and validates the fixed header at the start of `blob`.
    pub fn parse(blob: &[u8]) -> Result<BlobHeader> {
        if blob.len() < 4 || blob[..4] != MAGIC {
            let mut found = [0u8; 4];
            let n = blob.len().min(4);
            found[..n].copy_from_slice(&blob[..n]);
            if blob.len() >= 4 || !MAGIC.starts_with(&blob[..n]) {
                return Err(Error::V2BadMagic { found });
            }
        }
        if blob.len() < HEADER_LEN {
            return Err(Error::V2Truncated {
                what: "header",
                needed: HEADER_LEN,
                available: blob.len(),
            });
        }
        if !(MIN_VERSION..=VERSION).contains(&blob[4]) {
            return Err(Error::V2UnsupportedVersion { found: blob[4] });
        }
        let bad = |field, offset, found: u64| Error::V2BadField {
            field,
            offset,
            found,
        };
        let dtype = dtype_from_code(blob[5]).ok_or(bad("dtype", 5, blob[5] as u64))?;
        let kind = TensorKind::from_code(blob[6]).ok_or(bad("kind", 6, blob[6] as u64))?;
        let flags = blob[7];
        let v3_shared = blob[4] >= 3 && flags & FLAG_SHARED != 0;
        let known = FLAG_SIGN_CONTEXT
            | FLAG_SHARED
            | match dtype {
                Dtype::I8 if v3_shared => FLAG_WRAPPING,
                Dtype::F32 if v3_shared => FLAG_LOW_BYTE,
                _ => 0,
            };
        if flags & !known != 0 {
            return Err(bad("flags", 7, flags as u64));
        }
        let u = |o: usize| u32::from_le_bytes([blob[o], blob[o + 1], blob[o + 2], blob[o + 3]]);
        let (tokens, channels, chunk_tokens, group_size, model_len, dict_rows) =
            (u(8), u(12), u(16), u(20), u(24), u(28));
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(bad("channels", 12, channels as u64));
        }
        if chunk_tokens == 0 {
            return Err(bad("chunk_tokens", 16, 0));
        }
        let shared = flags & FLAG_SHARED != 0;
        if group_size == 0 || group_size > channels || (shared && group_size != 1) {
            return Err(bad("group_size", 20, group_size as u64));
        }
        if blob[4] < 3 && dict_rows != 0 {
            return Err(bad("reserved", 28, dict_rows as u64));
        }
        // A dictionary row is referenced at least twice, so there are fewer than tokens;
        // this also bounds the dictionary's memory by the decoded size.
        if dict_rows > tokens {
            return Err(bad("dict_rows", 28, dict_rows as u64));
        }
        let total = (tokens as u64)
            .checked_mul(channels as u64)
            .and_then(|v| v.checked_mul(dtype.size() as u64))
            .filter(|&v| v <= isize::MAX as u64)
            .ok_or(bad("tokens", 8, tokens as u64))?;
        let _ = total;
        Ok(BlobHeader {
            version: blob[4],
            dtype,
            kind,
            tokens,
            channels,
            chunk_tokens,
            group_size,
            sign_context: flags & FLAG_SIGN_CONTEXT != 0,
            shared,
            wrapping: flags & FLAG_WRAPPING != 0,
            low_byte: flags & FLAG_LOW_BYTE != 0,
            model_len,
            dict_rows,
        })
    }

    /// Entries of the chunk index: one per chunk, plus the row dictionary's first.
    pub fn index_entries(&self) -> usize {
        self.chunk_count() + (self.dict_rows > 0) as usize
    }
}

/// The fewest bytes a chunk of `tokens` tokens can take, which bounds the decoded size by
/// the blob's size. In a stored or coded chunk (and the row dictionary) every value costs at
/// least one bit after the mode byte. A chunk with repeated tokens (version 2) has its
/// bitmap, at least two bytes per repeated token, and at least one coded token; with a row
/// dictionary (version 3) every token may be a reference.
fn min_chunk_len(header: &BlobHeader, tokens: u64, dictionary: bool) -> u64 {
    let channels = header.channels as u64;
    let coded = 1 + (tokens * channels).div_ceil(8);
    if dictionary {
        return coded;
    }
    if header.dict_rows > 0 {
        return coded.min(1 + tokens.div_ceil(8) + 2 * tokens);
    }
    if header.version < 2 || tokens < 2 {
        return coded;
    }
    let repeated = 1 + tokens.div_ceil(8) + 2 * (tokens - 1) + channels.div_ceil(8);
    coded.min(repeated)
}

/// Where each chunk lies in a blob, validated against the blob's length.
#[derive(Debug, Clone, Default)]
pub struct ChunkIndex {
    /// Start offset of chunk `i` in the blob is `offsets[i]`; its end is `offsets[i + 1]`.
    pub offsets: Vec<usize>,
    /// Where the row dictionary lies (empty when the blob has none).
    pub dictionary: std::ops::Range<usize>,
}

impl ChunkIndex {
    /// Reads the chunk index of `blob` described by `header` into `self` (reusing its storage).
    pub fn read(&mut self, header: &BlobHeader, blob: &[u8]) -> Result<()> {
        let n = header.index_entries();
        let dictionary = header.dict_rows > 0;
        let start = header.index_offset();
        let need = (n as u64) * 4 + start as u64;
        if (blob.len() as u64) < need {
            return Err(Error::V2Truncated {
                what: "chunk index",
                needed: need as usize,
                available: blob.len(),
            });
        }
        let data_start = start + n * 4;
        self.offsets.clear();
        self.offsets.reserve(n + 1);
        let mut pos = data_start as u64;
        self.offsets.push(data_start);
        for e in 0..n {
            let o = start + e * 4;
            let len = u32::from_le_bytes([blob[o], blob[o + 1], blob[o + 2], blob[o + 3]]);
            // Entry 0 is the dictionary's when there is one; chunks are numbered without it.
            let is_dict = dictionary && e == 0;
            let i = e.saturating_sub(dictionary as usize);
            let min = if is_dict {
                min_chunk_len(header, header.dict_rows as u64, true)
            } else {
                min_chunk_len(header, header.chunk_tokens_of(i) as u64, false)
            };
            if (len as u64) < min {
                return Err(if is_dict {
                    Error::V2BadDictionary {
                        reason: "indexed length too small for its values",
                    }
                } else {
                    Error::V2BadChunk {
                        chunk: i,
                        reason: "indexed length too small for its values",
                    }
                });
            }
            pos += len as u64;
            if pos > blob.len() as u64 {
                break;
            }
            self.offsets.push(pos as usize);
        }
        if pos != blob.len() as u64 {
            return Err(Error::V2ChunkIndexMismatch {
                indexed: pos.saturating_sub(data_start as u64),
                present: (blob.len() - data_start) as u64,
            });
        }
        self.dictionary = data_start..data_start;
        if dictionary {
            self.offsets.remove(0);
            self.dictionary.end = self.offsets[0];
        }
        Ok(())
    }
}
