//! The one error type of `kvc-store-tiers` and its coarse kind.

use std::fmt;

use crate::key::Fingerprint;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong in `kvc-store-tiers`. Each variant names what is wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A configuration or argument value the tiers cannot work with.
    InvalidArgument {
        /// The field or argument.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A blob shorter than its fixed header and trailer, or whose length is not the one
    /// its header declares.
    BadLength {
        /// Bytes the blob must have.
        expected: u64,
        /// Bytes it has.
        found: u64,
    },
    /// A blob that does not start with the kv-chunk magic.
    BadMagic {
        /// The first 8 bytes found.
        found: [u8; 8],
    },
    /// A blob of a format version this build does not read.
    BadVersion {
        /// The version found.
        found: u16,
    },
    /// The BLAKE3 checksum over the blob does not match its trailer.
    ChecksumMismatch,
    /// A header field (codec, dtype, shape, token count, section length) that is not what
    /// the reader expects or is not valid.
    BadField {
        /// The field.
        field: &'static str,
        /// The value expected.
        expected: u64,
        /// The value found.
        found: u64,
    },
    /// A valid blob stored under another key, or made for another model/layout/codec.
    ForeignBlob {
        /// `"key"` or `"fingerprint"`.
        what: &'static str,
    },
    /// A codec failed to encode, or a section did not decode to its expected bytes.
    Codec {
        /// The layer.
        layer: usize,
        /// `"K"` or `"V"`.
        tensor: &'static str,
        /// What the codec said.
        reason: String,
    },
    /// A chunk holds a NaN or an infinity, which kvq cannot encode: the chunk is refused
    /// (counted in `chunks_refused`), never stored approximately.
    NonFinite {
        /// The layer.
        layer: usize,
        /// `"K"` or `"V"`.
        tensor: &'static str,
        /// The row (token × KV head) within the chunk's section.
        row: usize,
        /// The value within the row.
        index: usize,
    },
    /// A file system operation of the disk tier failed.
    Io {
        /// What was being done, with the path.
        op: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A Redis command or connection failed (including timeouts and a server that is down).
    Redis {
        /// What was being done.
        op: &'static str,
        /// What the client said.
        reason: String,
    },
    /// A kv-prefix file (docs/formats/kv-prefix.md) that is not what its format says: too
    /// short, a wrong magic, version, reserved field, header length or count, a blob
    /// length past the end, bytes after the last blob, a checksum mismatch.
    BadPrefixFile {
        /// The field or part (`magic`, `version`, `n_tokens`, `blob length`, `checksum`, ...).
        field: &'static str,
        /// Its byte offset in the file.
        offset: u64,
        /// What is wrong, with the values found and expected.
        reason: String,
    },
    /// A chunk blob of a kv-prefix file that fails the blob's own checks (the kv-chunk
    /// reader's error is the source), or that is not the chunk of the file's tokens at its
    /// position (another key, fingerprint, token count, codec or shape).
    BadPrefixChunk {
        /// The chunk's index in the file (chunk `i` holds tokens `i·n .. (i+1)·n`).
        chunk: usize,
        /// The byte offset of its blob in the file.
        offset: u64,
        /// What is wrong with the blob.
        source: Box<Error>,
    },
    /// A valid kv-prefix file made for another model, layout, dtype, chunk size, codec or
    /// calibration than the tiers importing it (its fingerprint is not theirs).
    ForeignPrefixFile {
        /// The importing tiers' fingerprint.
        expected: Fingerprint,
        /// The file's.
        found: Fingerprint,
    },
}

impl Error {
    /// The coarse kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument { .. } | Error::NonFinite { .. } => ErrorKind::InvalidArgument,
            Error::BadLength { .. }
            | Error::BadMagic { .. }
            | Error::BadVersion { .. }
            | Error::ChecksumMismatch
            | Error::BadField { .. }
            | Error::BadPrefixFile { .. }
            | Error::BadPrefixChunk { .. } => ErrorKind::CorruptData,
            Error::ForeignBlob { .. } | Error::ForeignPrefixFile { .. } => ErrorKind::Foreign,
            Error::Codec { .. } => ErrorKind::Internal,
            Error::Io { .. } | Error::Redis { .. } => ErrorKind::Io,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            op: op.into(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument { field, reason } => write!(f, "invalid {field}: {reason}"),
            Error::BadLength { expected, found } => {
                write!(f, "kv-chunk blob has {found} bytes, expected {expected}")
            }
            Error::BadMagic { found } => write!(f, "not a kv-chunk blob (magic {found:02x?})"),
            Error::BadVersion { found } => write!(f, "kv-chunk version {found} is not supported"),
            Error::ChecksumMismatch => write!(f, "kv-chunk checksum mismatch"),
            Error::BadField {
                field,
                expected,
                found,
            } => write!(f, "kv-chunk field {field} is {found}, expected {expected}"),
            Error::ForeignBlob { what } => {
                write!(f, "kv-chunk blob belongs to another {what}")
            }
            Error::Codec {
                layer,
                tensor,
                reason,
            } => write!(f, "codec failed on layer {layer} {tensor}: {reason}"),
            Error::NonFinite {
                layer,
                tensor,
                row,
                index,
            } => write!(
                f,
                "layer {layer} {tensor} row {row} value {index} is not finite: kvq cannot encode it"
            ),
            Error::Io { op, source } => write!(f, "{op}: {source}"),
            Error::Redis { op, reason } => write!(f, "redis {op}: {reason}"),
            Error::BadPrefixFile {
                field,
                offset,
                reason,
            } => write!(
                f,
                "damaged kv-prefix file: {field} at byte {offset}: {reason}"
            ),
            Error::BadPrefixChunk {
                chunk,
                offset,
                source,
            } => write!(
                f,
                "damaged kv-prefix file: chunk {chunk} (blob at byte {offset}): {source}"
            ),
            Error::ForeignPrefixFile { expected, found } => write!(
                f,
                "foreign kv-prefix file: made for another model, layout, codec or calibration \
                 (fingerprint {}.., these tiers' {}..)",
                &found.to_hex()[..16],
                &expected.to_hex()[..16]
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::BadPrefixChunk { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
