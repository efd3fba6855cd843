//! The one error type of `kvc-kvq-cells`.

use std::fmt;

pub use kvc_types::ErrorKind;

/// Everything that can go wrong in `kvc-kvq-cells`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// An argument is out of range or inconsistent with the others or with the cells'
    /// configuration.
    Invalid {
        /// Which argument.
        what: &'static str,
        /// What is wrong, with the values involved.
        why: String,
    },
    /// A call came in an order the cells do not allow (a write without its ubatch).
    State {
        /// What is wrong.
        why: String,
    },
    /// Saved cells ([`KvqCells::load`](crate::KvqCells::load)) that are not what their
    /// format says: a magic, version, length, checksum or field that does not hold.
    Corrupt {
        /// What is wrong, with the byte offset where it helps.
        why: String,
    },
    /// The kvq codec's error.
    Kvq(kvc_kvq::Error),
}

impl Error {
    /// The broad class, which `kvc-capi` maps to one C status.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid { .. } => ErrorKind::InvalidArgument,
            Error::State { .. } => ErrorKind::InvalidState,
            Error::Corrupt { .. } => ErrorKind::CorruptData,
            Error::Kvq(e) => e.kind(),
        }
    }

    pub(crate) fn corrupt(why: impl Into<String>) -> Error {
        Error::Corrupt { why: why.into() }
    }

    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> Error {
        Error::Invalid {
            what,
            why: why.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid { what, why } => write!(f, "kvq cells: invalid {what}: {why}"),
            Error::State { why } => write!(f, "kvq cells: {why}"),
            Error::Corrupt { why } => write!(f, "kvq cells: saved cells are corrupt: {why}"),
            Error::Kvq(e) => write!(f, "kvq cells: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<kvc_kvq::Error> for Error {
    fn from(e: kvc_kvq::Error) -> Error {
        Error::Kvq(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
