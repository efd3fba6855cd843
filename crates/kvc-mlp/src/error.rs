//! The one error type of `kvc-mlp`.

use std::fmt;
use std::path::PathBuf;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong in `kvc-mlp`. File errors name the field and its byte offset.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The file ends before `field` (at byte `offset`) is complete.
    Truncated {
        /// What was being read.
        field: &'static str,
        /// Byte offset where it starts.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file at `offset`.
        available: u64,
    },
    /// The magic number at byte 0 is not `0x4B56434D`.
    BadMagic {
        /// The value found.
        found: u32,
    },
    /// The version at byte 4 is not 1.
    UnsupportedVersion {
        /// The value found.
        found: u32,
    },
    /// A header field holds a value that is not allowed.
    BadHeaderField {
        /// The field's name as the spec spells it.
        field: &'static str,
        /// Byte offset of the field.
        offset: u64,
        /// The value found.
        found: u64,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// A weight block's `rows`, `cols` or `has_bias` disagrees with the header's shapes.
    BadWeightField {
        /// The layer the block belongs to.
        layer: u32,
        /// The block's index inside its layer (prefix * 3 + slot).
        index: u32,
        /// `rows`, `cols` or `has_bias`.
        field: &'static str,
        /// Byte offset of the field.
        offset: u64,
        /// The value found.
        found: u64,
        /// The value the header implies.
        expected: u64,
    },
    /// A size computed from the file (`rows * cols * element size`, ...) overflows.
    SizeOverflow {
        /// What was being sized.
        field: &'static str,
        /// Byte offset of the field the size came from.
        offset: u64,
    },
    /// Bytes are left after the last weight block.
    TrailingBytes {
        /// Where the unexpected bytes start.
        offset: u64,
        /// How many there are.
        count: u64,
    },
    /// A caller-supplied value is not valid.
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// The layer index is not in the weight file.
    LayerOutOfRange {
        /// The index asked for.
        layer: usize,
        /// How many layers the weights have.
        num_layers: usize,
    },
    /// A buffer is too small for what must be read from or written to it.
    BufferTooSmall {
        /// The buffer's name.
        name: &'static str,
        /// Elements needed.
        needed: usize,
        /// Elements available.
        found: usize,
    },
    /// Reading a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl Error {
    /// The broad class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Truncated { .. }
            | Error::BadMagic { .. }
            | Error::BadHeaderField { .. }
            | Error::BadWeightField { .. }
            | Error::SizeOverflow { .. }
            | Error::TrailingBytes { .. } => ErrorKind::CorruptData,
            Error::UnsupportedVersion { .. } => ErrorKind::Unsupported,
            Error::InvalidArgument { .. } | Error::LayerOutOfRange { .. } => {
                ErrorKind::InvalidArgument
            }
            Error::BufferTooSmall { .. } => ErrorKind::BufferTooSmall,
            Error::Io { .. } => ErrorKind::Io,
        }
    }

    pub(crate) fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            name,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated {
                field,
                offset,
                needed,
                available,
            } => write!(
                f,
                "truncated weight file: {field} at byte {offset} needs {needed} bytes, {available} left"
            ),
            Error::BadMagic { found } => write!(
                f,
                "not a kvc compressor weight file: magic at byte 0 is {found:#010x}, expected 0x4b56434d"
            ),
            Error::UnsupportedVersion { found } => {
                write!(f, "unsupported weight file version {found} at byte 4, expected 1")
            }
            Error::BadHeaderField {
                field,
                offset,
                found,
                expected,
            } => write!(f, "bad header field {field} at byte {offset}: {found}, expected {expected}"),
            Error::BadWeightField {
                layer,
                index,
                field,
                offset,
                found,
                expected,
            } => write!(
                f,
                "bad weight block {index} of layer {layer}: {field} at byte {offset} is {found}, expected {expected}"
            ),
            Error::SizeOverflow { field, offset } => {
                write!(f, "size of {field} (from byte {offset}) overflows")
            }
            Error::TrailingBytes { offset, count } => write!(
                f,
                "{count} unexpected bytes after the last weight block at byte {offset}"
            ),
            Error::InvalidArgument { name, reason } => write!(f, "invalid {name}: {reason}"),
            Error::LayerOutOfRange { layer, num_layers } => write!(
                f,
                "layer {layer} out of range: the weights have {num_layers} layers"
            ),
            Error::BufferTooSmall {
                name,
                needed,
                found,
            } => write!(f, "{name} too small: needs {needed} elements, has {found}"),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
