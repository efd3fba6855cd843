//! The crate's error type.

use std::fmt;

/// What kind of failure an [`Error`] is; `kvc-capi` maps each kind to one C status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller passed arguments that cannot work (shape, length, options).
    InvalidArgument,
    /// The input blob is not a valid encoding.
    CorruptData,
    /// The caller's output buffer is too small.
    BufferTooSmall,
    /// Valid but not supported by this build (e.g. a newer format version).
    Unsupported,
}

/// Everything that can go wrong in `kvc-codec`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
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
    /// gear-v2: a chunk number past the last chunk was requested.
    V2ChunkOutOfRange {
        /// Requested chunk.
        chunk: usize,
        /// Chunks in the blob.
        chunks: usize,
    },
    /// The output buffer is too small.
    OutputTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
}

impl Error {
    /// The kind of this error.
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
            | Error::V2BadChunk { .. } => ErrorKind::CorruptData,
            Error::V2UnsupportedVersion { .. } => ErrorKind::Unsupported,
            Error::OutputTooSmall { .. } => ErrorKind::BufferTooSmall,
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
            Error::V2ChunkOutOfRange { chunk, chunks } => write!(
                f,
                "gear-v2: chunk {chunk} requested but the blob has {chunks} chunks"
            ),
            Error::OutputTooSmall { needed, available } => write!(
                f,
                "output buffer too small: needs {needed} bytes, {available} available"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
