//! The one error type of `kvc-codec` and its coarse kind.

use std::fmt;

use crate::dtype::Dtype;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong in `kvc-codec`. Each variant names what is wrong.
///
/// Variants prefixed `GearV1` concern the gear-v1 (MNN) blob format, those prefixed `V2` the
/// gear-v2 format; the others are shared by every codec in the crate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A dtype name that is none of `f16`, `bf16`, `f32`, `i8`.
    UnknownDtype {
        /// The name given.
        name: String,
    },
    /// The input length is not a whole number of elements of the dtype.
    InputNotWholeElements {
        /// The dtype of the input.
        dtype: Dtype,
        /// The input length in bytes.
        len: usize,
    },
    /// A chunk size of zero bytes or one that is not a whole number of elements.
    InvalidChunkSize {
        /// The dtype of the input.
        dtype: Dtype,
        /// The chunk size in bytes.
        chunk_bytes: usize,
    },
    /// A caller-provided output buffer is too small.
    OutputTooSmall {
        /// Bytes needed (at least).
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The sizes of decoded chunks do not add up to the output buffer.
    ChunkSizesMismatch {
        /// The sum of the chunks' decoded sizes.
        decoded: usize,
        /// The output buffer length.
        output: usize,
    },
    /// A zstd compression level outside what the linked zstd accepts.
    ZstdLevelOutOfRange {
        /// The level given.
        level: i32,
        /// The smallest accepted level.
        min: i32,
        /// The largest accepted level.
        max: i32,
    },
    /// zstd could not allocate a compression or decompression context.
    ZstdContextAllocation,
    /// `ZSTD_compress` failed (valid input never causes this).
    ZstdCompress {
        /// zstd's error name.
        reason: &'static str,
    },
    /// A zstd payload is not one well-formed zstd frame.
    ZstdFrameInvalid {
        /// zstd's error name, or what is wrong.
        reason: &'static str,
    },
    /// A zstd frame does not span exactly its payload.
    ZstdFrameLength {
        /// The payload length.
        payload_len: usize,
        /// The length of the zstd frame found at its start.
        frame_len: usize,
    },
    /// A zstd frame's declared content size differs from the stream's expected length.
    ZstdContentSize {
        /// The expected decompressed length.
        expected: usize,
        /// The content size the frame declares, `None` when it declares none.
        declared: Option<u64>,
    },
    /// zstd decompression failed or produced a length other than declared.
    ZstdDecompress {
        /// zstd's error name, or what is wrong.
        reason: &'static str,
    },
    /// A predictor name that is none of `raw`, `delta_seq`, `xor_seq`.
    GearV1UnknownPredictorName {
        /// The name given.
        name: String,
    },
    /// A predictor set with no predictor enabled.
    GearV1EmptyPredictorSet,
    /// More elements than gear-v1's 32-bit counts can describe.
    GearV1TooManyElements {
        /// The number of elements in the input.
        elements: usize,
        /// The largest number gear-v1 accepts.
        max: usize,
    },
    /// The blob ends inside a header or before a payload it declares.
    GearV1Truncated {
        /// Which part was cut: `"word_count"`, `"frame header"` or `"payload"`.
        what: &'static str,
        /// The stream index (0-based) the part belongs to, when it belongs to one.
        stream: Option<usize>,
        /// Offset in the blob where the part starts.
        offset: usize,
        /// Bytes the part needs.
        needed: usize,
        /// Bytes left in the blob from `offset`.
        available: usize,
    },
    /// A frame's predictor mode byte is not 0 (raw), 1 (delta_seq) or 2 (xor_seq).
    GearV1UnknownMode {
        /// The stream index.
        stream: usize,
        /// The byte found.
        mode: u8,
    },
    /// A frame's codec byte is not 0 (RLE) or 1 (zstd).
    GearV1UnknownCodec {
        /// The stream index.
        stream: usize,
        /// The byte found.
        codec: u8,
    },
    /// A frame's raw_len differs from the blob's word_count.
    GearV1RawLenMismatch {
        /// The stream index.
        stream: usize,
        /// The frame's raw_len.
        raw_len: u32,
        /// The blob's word_count.
        word_count: u32,
    },
    /// A frame declares more raw bytes than its payload could possibly expand to.
    GearV1ImplausibleRawLen {
        /// The stream index.
        stream: usize,
        /// The frame's raw_len.
        raw_len: u32,
        /// The frame's payload_len.
        payload_len: u32,
    },
    /// An RLE payload ends inside a segment.
    GearV1RleTruncated {
        /// The stream index.
        stream: usize,
        /// Offset in the payload of the segment's control byte.
        offset: usize,
    },
    /// An RLE payload produces more bytes than the stream's raw_len.
    GearV1RleOverrun {
        /// The stream index.
        stream: usize,
        /// Offset in the payload of the segment that overflows.
        offset: usize,
        /// The stream's raw_len.
        raw_len: usize,
    },
    /// An RLE payload produces fewer bytes than the stream's raw_len.
    GearV1RleUnderrun {
        /// The stream index.
        stream: usize,
        /// Bytes produced.
        produced: usize,
        /// The stream's raw_len.
        raw_len: usize,
    },
    /// Bytes follow the last frame of a blob.
    GearV1TrailingBytes {
        /// Offset where the trailing bytes start.
        offset: usize,
        /// How many there are.
        count: usize,
    },
    /// gear-v2: `channels` is zero.
    V2ZeroChannels,
    /// gear-v2: `chunk_tokens` is zero.
    V2ZeroChunkTokens,
    /// gear-v2: the input length is not a whole number of tokens.
    V2InputNotWholeTokens {
        /// Input length in bytes.
        len: usize,
        /// Bytes per token (`channels * dtype size`).
        token_bytes: usize,
    },
    /// gear-v2: the tensor is larger than the format can describe.
    V2TooLarge {
        /// What overflowed.
        what: &'static str,
    },
    /// gear-v2: the blob is shorter than a field it must contain.
    V2Truncated {
        /// The structure being read.
        what: &'static str,
        /// Bytes needed from the start of that structure.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// gear-v2: the blob does not start with the gear-v2 magic.
    V2BadMagic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// gear-v2: the format version is not one this build decodes.
    V2UnsupportedVersion {
        /// Version found.
        found: u8,
    },
    /// gear-v2: a header field holds a value outside its domain.
    V2BadField {
        /// Field name.
        field: &'static str,
        /// Byte offset in the blob.
        offset: usize,
        /// Value found.
        found: u64,
    },
    /// gear-v2: a Huffman table is malformed.
    V2BadTable {
        /// Table number in the model section.
        table: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// gear-v2: the chunk index does not add up to the blob length.
    V2ChunkIndexMismatch {
        /// Sum of the indexed chunk lengths.
        indexed: u64,
        /// Bytes present after the index.
        present: u64,
    },
    /// gear-v2: a chunk's payload is inconsistent.
    V2BadChunk {
        /// Chunk number.
        chunk: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// gear-v2: the row dictionary (format version 3) is inconsistent.
    V2BadDictionary {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// gear-v2: a chunk number past the last chunk was requested.
    V2ChunkOutOfRange {
        /// Requested chunk.
        chunk: usize,
        /// Chunks in the blob.
        chunks: usize,
    },
}

impl Error {
    /// The coarse class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::V2ZeroChannels
            | Error::V2ZeroChunkTokens
            | Error::V2InputNotWholeTokens { .. }
            | Error::V2TooLarge { .. }
            | Error::V2ChunkOutOfRange { .. } => ErrorKind::InvalidArgument,
            Error::V2Truncated { .. }
            | Error::V2BadMagic { .. }
            | Error::V2BadField { .. }
            | Error::V2BadTable { .. }
            | Error::V2ChunkIndexMismatch { .. }
            | Error::V2BadChunk { .. }
            | Error::V2BadDictionary { .. } => ErrorKind::CorruptData,
            Error::V2UnsupportedVersion { .. } => ErrorKind::Unsupported,
            Error::UnknownDtype { .. }
            | Error::InputNotWholeElements { .. }
            | Error::InvalidChunkSize { .. }
            | Error::ZstdLevelOutOfRange { .. }
            | Error::GearV1UnknownPredictorName { .. }
            | Error::GearV1EmptyPredictorSet
            | Error::ChunkSizesMismatch { .. } => ErrorKind::InvalidArgument,
            Error::OutputTooSmall { .. } => ErrorKind::BufferTooSmall,
            Error::GearV1TooManyElements { .. } => ErrorKind::Unsupported,
            Error::ZstdContextAllocation | Error::ZstdCompress { .. } => ErrorKind::Internal,
            Error::ZstdFrameInvalid { .. }
            | Error::ZstdFrameLength { .. }
            | Error::ZstdContentSize { .. }
            | Error::ZstdDecompress { .. }
            | Error::GearV1Truncated { .. }
            | Error::GearV1UnknownMode { .. }
            | Error::GearV1UnknownCodec { .. }
            | Error::GearV1RawLenMismatch { .. }
            | Error::GearV1ImplausibleRawLen { .. }
            | Error::GearV1RleTruncated { .. }
            | Error::GearV1RleOverrun { .. }
            | Error::GearV1RleUnderrun { .. }
            | Error::GearV1TrailingBytes { .. } => ErrorKind::CorruptData,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::V2ZeroChannels => write!(f, "gear-v2: channels must be at least 1"),
            Error::V2ZeroChunkTokens => write!(f, "gear-v2: chunk_tokens must be at least 1"),
            Error::V2InputNotWholeTokens { len, token_bytes } => write!(
                f,
                "gear-v2: input of {len} bytes is not a whole number of {token_bytes}-byte tokens"
            ),
            Error::V2TooLarge { what } => write!(f, "gear-v2: {what} exceeds the format's limits"),
            Error::V2Truncated {
                what,
                needed,
                available,
            } => write!(
                f,
                "gear-v2: truncated {what}: needs {needed} bytes, {available} present"
            ),
            Error::V2BadMagic { found } => {
                write!(f, "gear-v2: bad magic {found:02x?}, expected \"KVG2\"")
            }
            Error::V2UnsupportedVersion { found } => {
                write!(
                    f,
                    "gear-v2: unsupported version {found} (this build reads 1)"
                )
            }
            Error::V2BadField {
                field,
                offset,
                found,
            } => write!(
                f,
                "gear-v2: invalid {field} = {found} at byte offset {offset}"
            ),
            Error::V2BadTable { table, reason } => {
                write!(f, "gear-v2: Huffman table {table}: {reason}")
            }
            Error::V2ChunkIndexMismatch { indexed, present } => write!(
                f,
                "gear-v2: chunk index sums to {indexed} bytes but {present} bytes follow it"
            ),
            Error::V2BadChunk { chunk, reason } => write!(f, "gear-v2: chunk {chunk}: {reason}"),
            Error::V2BadDictionary { reason } => write!(f, "gear-v2: row dictionary: {reason}"),
            Error::V2ChunkOutOfRange { chunk, chunks } => write!(
                f,
                "gear-v2: chunk {chunk} requested but the blob has {chunks} chunks"
            ),
            Error::UnknownDtype { name } => {
                write!(f, "unknown dtype {name:?} (expected f16, bf16, f32 or i8)")
            }
            Error::InputNotWholeElements { dtype, len } => write!(
                f,
                "input of {len} bytes is not a whole number of {dtype} elements ({} bytes each)",
                dtype.size()
            ),
            Error::InvalidChunkSize { dtype, chunk_bytes } => write!(
                f,
                "chunk size {chunk_bytes} bytes is not a positive multiple of the {dtype} width ({})",
                dtype.size()
            ),
            Error::OutputTooSmall { needed, available } => write!(
                f,
                "output buffer too small: need at least {needed} bytes, have {available}"
            ),
            Error::ChunkSizesMismatch { decoded, output } => write!(
                f,
                "chunks decode to {decoded} bytes in all but the output buffer holds {output}"
            ),
            Error::ZstdLevelOutOfRange { level, min, max } => {
                write!(f, "zstd level {level} out of range {min}..={max}")
            }
            Error::ZstdContextAllocation => f.write_str("zstd could not allocate a context"),
            Error::ZstdCompress { reason } => write!(f, "zstd compression failed: {reason}"),
            Error::ZstdFrameInvalid { reason } => write!(f, "invalid zstd frame: {reason}"),
            Error::ZstdFrameLength {
                payload_len,
                frame_len,
            } => write!(
                f,
                "zstd frame is {frame_len} bytes but its payload is {payload_len} bytes"
            ),
            Error::ZstdContentSize { expected, declared } => match declared {
                Some(d) => write!(
                    f,
                    "zstd frame declares {d} content bytes, expected {expected}"
                ),
                None => write!(
                    f,
                    "zstd frame declares no content size, expected {expected}"
                ),
            },
            Error::ZstdDecompress { reason } => write!(f, "zstd decompression failed: {reason}"),
            Error::GearV1UnknownPredictorName { name } => write!(
                f,
                "unknown gear-v1 predictor {name:?} (expected raw, delta_seq or xor_seq)"
            ),
            Error::GearV1EmptyPredictorSet => {
                f.write_str("gear-v1 predictor set is empty: enable at least one predictor")
            }
            Error::GearV1TooManyElements { elements, max } => write!(
                f,
                "gear-v1 blob cannot hold {elements} elements (at most {max})"
            ),
            Error::GearV1Truncated {
                what,
                stream,
                offset,
                needed,
                available,
            } => {
                write!(f, "gear-v1 blob truncated: {what}")?;
                if let Some(s) = stream {
                    write!(f, " of stream {s}")?;
                }
                write!(
                    f,
                    " at offset {offset} needs {needed} bytes, {available} left"
                )
            }
            Error::GearV1UnknownMode { stream, mode } => write!(
                f,
                "gear-v1 stream {stream}: unknown predictor mode {mode} (expected 0, 1 or 2)"
            ),
            Error::GearV1UnknownCodec { stream, codec } => write!(
                f,
                "gear-v1 stream {stream}: unknown codec {codec} (expected 0 RLE or 1 zstd)"
            ),
            Error::GearV1RawLenMismatch {
                stream,
                raw_len,
                word_count,
            } => write!(
                f,
                "gear-v1 stream {stream}: raw_len {raw_len} differs from word_count {word_count}"
            ),
            Error::GearV1ImplausibleRawLen {
                stream,
                raw_len,
                payload_len,
            } => write!(
                f,
                "gear-v1 stream {stream}: raw_len {raw_len} cannot come from a {payload_len}-byte payload"
            ),
            Error::GearV1RleTruncated { stream, offset } => write!(
                f,
                "gear-v1 stream {stream}: RLE payload ends inside the segment at payload offset {offset}"
            ),
            Error::GearV1RleOverrun {
                stream,
                offset,
                raw_len,
            } => write!(
                f,
                "gear-v1 stream {stream}: RLE segment at payload offset {offset} writes past raw_len {raw_len}"
            ),
            Error::GearV1RleUnderrun {
                stream,
                produced,
                raw_len,
            } => write!(
                f,
                "gear-v1 stream {stream}: RLE payload produces {produced} bytes, raw_len is {raw_len}"
            ),
            Error::GearV1TrailingBytes { offset, count } => write!(
                f,
                "gear-v1 blob has {count} trailing bytes after the last frame at offset {offset}"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// The result type of `kvc-codec`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
