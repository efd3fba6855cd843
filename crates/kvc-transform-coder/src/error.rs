//! The one error type of `kvc-transform-coder`.

use std::fmt;

/// The broad class of an [`Error`] (kvc's one `kvc_types::ErrorKind`).
pub use kvc_types::ErrorKind;

/// Everything that can go wrong; each variant names what and where.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// An argument or a setting is out of range or inconsistent.
    Invalid {
        /// What.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// Stored bytes (a calibration file or a coded section) fail a check.
    Corrupt {
        /// What.
        what: &'static str,
        /// Which check.
        reason: String,
    },
    /// A calibration made for another model layout, or bytes coded with another one.
    Foreign {
        /// What differs.
        what: &'static str,
        /// Expected and found.
        reason: String,
    },
    /// A value the coder cannot represent (NaN, infinity, or a component beyond the coded
    /// range); nothing is written for the section.
    NonFinite {
        /// Row (token × head) of the section.
        row: usize,
        /// Element or component index.
        index: usize,
    },
    /// A section decoded to values whose hash is not the one the encoder recorded: this
    /// host reconstructs differently, or the bytes were altered.
    ReconstructionMismatch,
}

impl Error {
    pub(crate) fn invalid(what: &'static str, reason: String) -> Error {
        Error::Invalid { what, reason }
    }

    pub(crate) fn corrupt(what: &'static str, reason: impl Into<String>) -> Error {
        Error::Corrupt {
            what,
            reason: reason.into(),
        }
    }

    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid { .. } => ErrorKind::InvalidArgument,
            Error::Corrupt { .. } | Error::NonFinite { .. } | Error::ReconstructionMismatch => {
                ErrorKind::CorruptData
            }
            Error::Foreign { .. } => ErrorKind::Foreign,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid { what, reason } => write!(f, "invalid {what}: {reason}"),
            Error::Corrupt { what, reason } => write!(f, "corrupt {what}: {reason}"),
            Error::Foreign { what, reason } => write!(f, "foreign {what}: {reason}"),
            Error::NonFinite { row, index } => write!(
                f,
                "row {row}, index {index}: not representable (NaN, infinity or beyond the coded range)"
            ),
            Error::ReconstructionMismatch => f.write_str(
                "decoded values differ from the encoder's reconstruction (hash mismatch)",
            ),
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
