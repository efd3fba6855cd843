//! The one error type of `kvc-mlp-train`.

use std::fmt;
use std::path::PathBuf;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong while loading dumps or training.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A training option or shape is not valid.
    InvalidArgument {
        /// The option's name.
        name: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// A dump file or its JSON sidecar is not what the dump mode writes.
    BadDump {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Reading a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// kvc-mlp refused the trained weights (cannot happen for finite weights of the right
    /// shapes; kept rather than unwrapped).
    Mlp(kvc_mlp::Error),
}

impl Error {
    /// The broad class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::BadDump { .. } => ErrorKind::CorruptData,
            Error::Io { .. } => ErrorKind::Io,
            Error::Mlp(e) => match e.kind() {
                kvc_mlp::ErrorKind::Io => ErrorKind::Io,
                kvc_mlp::ErrorKind::CorruptData => ErrorKind::CorruptData,
                _ => ErrorKind::InvalidArgument,
            },
        }
    }

    pub(crate) fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            name,
            reason: reason.into(),
        }
    }

    pub(crate) fn bad_dump(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::BadDump {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument { name, reason } => write!(f, "invalid {name}: {reason}"),
            Error::BadDump { path, reason } => write!(f, "{}: {reason}", path.display()),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Mlp(e) => write!(f, "kvc-mlp: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Mlp(e) => Some(e),
            _ => None,
        }
    }
}

impl From<kvc_mlp::Error> for Error {
    fn from(e: kvc_mlp::Error) -> Self {
        Error::Mlp(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
