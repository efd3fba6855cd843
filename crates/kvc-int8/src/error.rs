//! The one error type of `kvc-int8`.

use std::fmt;

/// The broad class of an [`Error`] (kvc's one `kvc_types::ErrorKind`, shared by
/// every crate), which `kvc-capi` maps to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong with C8 parameters; each variant names what and where.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// Two lengths that must agree do not.
    LayoutMismatch {
        /// What differs.
        what: &'static str,
        /// Expected value.
        expected: usize,
        /// Found value.
        found: usize,
    },
    /// A value that quantization cannot use (NaN or infinity).
    NonFinite {
        /// Where.
        what: &'static str,
        /// Element index.
        index: usize,
    },
    /// A layer of C8 parameters that must exist is missing.
    MissingLayer {
        /// Layer number.
        layer: usize,
        /// Which tensor or entry.
        which: &'static str,
    },
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::LayoutMismatch { .. } => ErrorKind::InvalidArgument,
            Error::NonFinite { .. } | Error::MissingLayer { .. } => ErrorKind::CorruptData,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LayoutMismatch {
                what,
                expected,
                found,
            } => write!(
                f,
                "layout mismatch: {what} expected {expected}, found {found}"
            ),
            Error::NonFinite { what, index } => {
                write!(f, "{what}: non-finite value at element {index}")
            }
            Error::MissingLayer { layer, which } => {
                write!(f, "layer {layer}: missing {which}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
