//! The one error type of `kvc-store-codec`. `kvc-store-async` turns each variant into its
//! own variant of the same name and message.

use std::fmt;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong while a store codec encodes or decodes a chunk.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value the codec cannot work with.
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// The value given.
        value: usize,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A decoded blob's header does not describe the chunk it was stored for.
    BlobMismatch {
        /// The header field.
        what: &'static str,
        /// What the chunk has.
        expected: usize,
        /// What the blob says.
        found: usize,
    },
    /// A layout error from `kvc-cache`.
    Cache(kvc_cache::Error),
    /// A C8 error from `kvc-int8` (a missing layer, a layout C8 refuses).
    Int8(kvc_int8::Error),
    /// An encode or decode error from `kvc-codec`.
    Codec(kvc_codec::Error),
    /// A [`crate::StoreCodec`] implemented outside this crate failed in a way valid input
    /// should not cause.
    Failed {
        /// The codec's name.
        codec: String,
        /// What went wrong.
        reason: String,
    },
}

impl Error {
    /// The coarse class of this error (as `kvc-store-async` has always classed it).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidConfig { .. } => ErrorKind::InvalidArgument,
            Error::BlobMismatch { .. } => ErrorKind::CorruptData,
            Error::Cache(e) => match e.kind() {
                ErrorKind::Io => ErrorKind::Io,
                ErrorKind::CorruptData => ErrorKind::CorruptData,
                _ => ErrorKind::InvalidArgument,
            },
            Error::Int8(e) => match e.kind() {
                ErrorKind::Io => ErrorKind::Io,
                ErrorKind::CorruptData => ErrorKind::CorruptData,
                _ => ErrorKind::InvalidArgument,
            },
            Error::Codec(e) => match e.kind() {
                ErrorKind::CorruptData => ErrorKind::CorruptData,
                ErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
                _ => ErrorKind::Internal,
            },
            Error::Failed { .. } => ErrorKind::Internal,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidConfig {
                field,
                value,
                reason,
            } => write!(f, "store config {field} = {value}: {reason}"),
            Error::BlobMismatch {
                what,
                expected,
                found,
            } => write!(f, "blob header {what} is {found}, the chunk has {expected}"),
            Error::Cache(e) => write!(f, "cache: {e}"),
            Error::Int8(e) => write!(f, "C8: {e}"),
            Error::Codec(e) => write!(f, "codec: {e}"),
            Error::Failed { codec, reason } => write!(f, "codec {codec}: {reason}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cache(e) => Some(e),
            Error::Int8(e) => Some(e),
            Error::Codec(e) => Some(e),
            _ => None,
        }
    }
}

impl From<kvc_cache::Error> for Error {
    fn from(e: kvc_cache::Error) -> Self {
        Error::Cache(e)
    }
}

impl From<kvc_int8::Error> for Error {
    fn from(e: kvc_int8::Error) -> Self {
        Error::Int8(e)
    }
}

impl From<kvc_codec::Error> for Error {
    fn from(e: kvc_codec::Error) -> Self {
        Error::Codec(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
