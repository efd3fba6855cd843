//! The one error type of `kvc-store-async` and its coarse kind.

use std::fmt;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong in `kvc-store-async`. Each variant names what is wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A configuration field has a value the store cannot work with.
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// The value given.
        value: usize,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A layer index at or beyond the number of layers.
    LayerOutOfRange {
        /// The layer given.
        layer: usize,
        /// The number of layers.
        layers: usize,
    },
    /// A token range that is empty where it must not be, reversed, or past the capacity
    /// or the written length.
    InvalidRange {
        /// The layer.
        layer: usize,
        /// First token.
        start: usize,
        /// One past the last token.
        end: usize,
        /// The limit it must respect.
        limit: usize,
    },
    /// Token bytes handed in whose length is not `tokens * token bytes`.
    WrongLength {
        /// Which tensor: `"K"` or `"V"`.
        tensor: &'static str,
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
    /// A write into tokens the store holds (in flight or compressed).
    RangeBusy {
        /// The layer.
        layer: usize,
        /// First token of the held chunk.
        start: usize,
        /// Tokens in the held chunk.
        count: usize,
    },
    /// A stored blob did not decode to the bytes it was verified against (memory
    /// corruption after the store took it).
    RestoreFailed {
        /// The layer.
        layer: usize,
        /// First token of the chunk.
        start: usize,
        /// What went wrong.
        reason: String,
    },
    /// A blob whose header does not describe the chunk it is decoded for.
    BlobMismatch {
        /// The header field.
        what: &'static str,
        /// What the chunk has.
        expected: usize,
        /// What the blob says.
        found: usize,
    },
    /// The worker pool could not be started or has stopped.
    Pool {
        /// What happened.
        reason: String,
    },
    /// An error from `kvc-cache` (layouts, paged memory).
    Cache(kvc_cache::Error),
    /// An error from `kvc-codec`.
    Codec(kvc_codec::Error),
    /// A store codec error of a kind added to `kvc-store-codec` after this crate's own
    /// variants (its own kind and message).
    StoreCodec(kvc_store_codec::Error),
}

impl Error {
    /// The coarse class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidConfig { .. }
            | Error::LayerOutOfRange { .. }
            | Error::InvalidRange { .. }
            | Error::WrongLength { .. } => ErrorKind::InvalidArgument,
            Error::RangeBusy { .. } => ErrorKind::Busy,
            Error::RestoreFailed { .. } | Error::BlobMismatch { .. } => ErrorKind::CorruptData,
            Error::Pool { .. } => ErrorKind::Internal,
            Error::Cache(e) => match e.kind() {
                kvc_cache::ErrorKind::Io => ErrorKind::Io,
                kvc_cache::ErrorKind::CorruptData => ErrorKind::CorruptData,
                _ => ErrorKind::InvalidArgument,
            },
            Error::Codec(e) => match e.kind() {
                kvc_codec::ErrorKind::CorruptData => ErrorKind::CorruptData,
                kvc_codec::ErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
                _ => ErrorKind::Internal,
            },
            Error::StoreCodec(e) => e.kind(),
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
            Error::LayerOutOfRange { layer, layers } => {
                write!(f, "layer {layer} out of range (the store has {layers})")
            }
            Error::InvalidRange {
                layer,
                start,
                end,
                limit,
            } => write!(
                f,
                "layer {layer}: token range {start}..{end} is invalid (limit {limit})"
            ),
            Error::WrongLength {
                tensor,
                expected,
                found,
            } => write!(f, "{tensor} bytes: expected {expected}, got {found}"),
            Error::RangeBusy {
                layer,
                start,
                count,
            } => write!(
                f,
                "layer {layer}: tokens {start}..{} are held by the store (in flight or compressed)",
                start + count
            ),
            Error::RestoreFailed {
                layer,
                start,
                reason,
            } => write!(
                f,
                "layer {layer}: restoring the chunk at token {start} failed: {reason}"
            ),
            Error::BlobMismatch {
                what,
                expected,
                found,
            } => write!(f, "blob header {what} is {found}, the chunk has {expected}"),
            Error::Pool { reason } => write!(f, "worker pool: {reason}"),
            Error::Cache(e) => write!(f, "cache: {e}"),
            Error::Codec(e) => write!(f, "codec: {e}"),
            Error::StoreCodec(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cache(e) => Some(e),
            Error::Codec(e) => Some(e),
            Error::StoreCodec(e) => Some(e),
            _ => None,
        }
    }
}

/// A store codec's error, as the variant of the same name and message.
impl From<kvc_store_codec::Error> for Error {
    fn from(e: kvc_store_codec::Error) -> Self {
        match e {
            kvc_store_codec::Error::InvalidConfig {
                field,
                value,
                reason,
            } => Error::InvalidConfig {
                field,
                value,
                reason,
            },
            kvc_store_codec::Error::BlobMismatch {
                what,
                expected,
                found,
            } => Error::BlobMismatch {
                what,
                expected,
                found,
            },
            kvc_store_codec::Error::Cache(e) => Error::Cache(e),
            kvc_store_codec::Error::Codec(e) => Error::Codec(e),
            #[allow(unreachable_patterns)]
            e => Error::StoreCodec(e),
        }
    }
}

impl From<kvc_cache::Error> for Error {
    fn from(e: kvc_cache::Error) -> Self {
        Error::Cache(e)
    }
}

impl From<kvc_codec::Error> for Error {
    fn from(e: kvc_codec::Error) -> Self {
        Error::Codec(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
