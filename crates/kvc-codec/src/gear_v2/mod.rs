//! gear-v2: kvc's own KV-aware lossless format.
//!
//! A tensor `[tokens, channels]` of f16, bf16, f32 or int8 values is cut into chunks of
//! whole tokens that each decode alone. Every value is split into a top field (sign and
//! exponent, plus the top mantissa bits for f16: 8 bits for f16/int8, 9 for bf16/f32) and the
//! low bits. The low bits are near-uniform noise and are stored packed; the top field is
//! coded with static canonical Huffman tables (optionally per sign of the previous token in
//! the same channel), chosen for the tensor by measured size: with the shared-shape coder
//! (the default) a few tables shared by clusters of channels code each channel's symbols
//! relative to its usual value (sign and magnitude for floats, the wrapping difference from
//! the median for int8); with the grouped coder one table per group of channels codes them
//! as they are.
//! Tables live once in the blob's model section; each chunk holds four interleaved Huffman
//! lanes (channel `c` in lane `c % 4`) and the packed low bits. Tokens that repeat an earlier
//! row (layer 0's V repeats the rows of repeated words) are stored as references: to an
//! earlier token of their chunk (format version 2), or to the blob's row dictionary, which
//! holds once the rows seen in several chunks (version 3). See `docs/formats/gear-v2.md`.

mod code_index;
mod decode;
mod encode;
mod format;
mod huffman;
mod lane_decode;
mod lanes;
mod low_bits;
mod low_byte;
mod model;
mod pair_tables;
mod parallel;
mod repeats;
mod shared;
mod shared_decode;
#[cfg(test)]
mod test_rng;
mod values;

pub use decode::{Decoder, OpenBlob};
pub use encode::{max_encoded_len, Coder, EncodeParams, Encoder, DEFAULT_CHUNK_TOKENS};
pub use format::{BlobHeader, FieldSplit, TensorKind, HEADER_LEN, MAGIC, MIN_VERSION, VERSION};

/// Whether `blob` starts with the gear-v2 magic.
pub fn is_gear_v2(blob: &[u8]) -> bool {
    blob.starts_with(&MAGIC)
}
