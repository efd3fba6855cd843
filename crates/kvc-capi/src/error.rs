//! The crate's error type and the thread-local last-error message that C reads back.

use std::fmt;

use kvc_types::ErrorKind;

use crate::status::KvcStatus;

/// Why a kvc entry point failed. Each variant names what is wrong; [`Error::kind`] gives
/// the [`KvcStatus`] the C caller receives and [`fmt::Display`] the message that
/// `kvc_last_error_message` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A required pointer argument was NULL.
    NullArgument {
        /// The parameter's name as the header spells it.
        argument: &'static str,
    },
    /// An argument is out of range or inconsistent with the others.
    InvalidArgument {
        /// The parameter's name as the header spells it.
        argument: &'static str,
        /// What is wrong with it, with the values involved.
        reason: String,
    },
    /// A caller-owned output buffer is too small.
    BufferTooSmall {
        /// The buffer parameter's name as the header spells it.
        argument: &'static str,
        /// The capacity needed, in the buffer's unit (elements or bytes).
        needed: usize,
        /// The capacity the caller passed.
        capacity: usize,
    },
    /// A library crate's error, already mapped to its status (how the codec, h2o, mlp,
    /// cache and store errors cross the boundary: their `ErrorKind` picks the status and
    /// their `Display` becomes the message).
    Wrapped {
        /// The status the error maps to.
        status: KvcStatus,
        /// The error's own message.
        message: String,
    },
    /// kvc panicked; the panic was caught at the boundary.
    Panic {
        /// The panic payload, when it was a string.
        message: String,
    },
}

impl Error {
    /// The status the C caller receives for this error.
    pub fn kind(&self) -> KvcStatus {
        match self {
            Error::NullArgument { .. } => KvcStatus::KVC_NULL_ARGUMENT,
            Error::InvalidArgument { .. } => KvcStatus::KVC_INVALID_ARGUMENT,
            Error::BufferTooSmall { .. } => KvcStatus::KVC_BUFFER_TOO_SMALL,
            Error::Wrapped { status, .. } => *status,
            Error::Panic { .. } => KvcStatus::KVC_PANIC,
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(argument: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NullArgument { argument } => write!(f, "`{argument}` is NULL"),
            Error::InvalidArgument { argument, reason } => {
                write!(f, "invalid `{argument}`: {reason}")
            }
            Error::BufferTooSmall {
                argument,
                needed,
                capacity,
            } => write!(
                f,
                "`{argument}` holds {capacity} but {needed} are needed (the length output \
                 received {needed})"
            ),
            Error::Wrapped { message, .. } => f.write_str(message),
            Error::Panic { message } => {
                write!(
                    f,
                    "internal error: kvc panicked ({message}); this is a bug in kvc"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// The C status of each kind of a library crate's error: one status per kind, whichever
/// crate the error comes from. Kinds added later (the kind is `#[non_exhaustive]`) become
/// `KVC_INTERNAL` until mapped here.
impl From<ErrorKind> for KvcStatus {
    fn from(kind: ErrorKind) -> KvcStatus {
        match kind {
            ErrorKind::InvalidArgument => KvcStatus::KVC_INVALID_ARGUMENT,
            ErrorKind::CorruptData | ErrorKind::Foreign => KvcStatus::KVC_CORRUPT_DATA,
            ErrorKind::BufferTooSmall => KvcStatus::KVC_BUFFER_TOO_SMALL,
            ErrorKind::Unsupported => KvcStatus::KVC_UNSUPPORTED,
            ErrorKind::Io => KvcStatus::KVC_IO,
            ErrorKind::OutOfMemory => KvcStatus::KVC_OUT_OF_MEMORY,
            ErrorKind::InvalidState | ErrorKind::Busy => KvcStatus::KVC_INVALID_STATE,
            ErrorKind::Internal => KvcStatus::KVC_INTERNAL,
            #[allow(unreachable_patterns)]
            _ => KvcStatus::KVC_INTERNAL,
        }
    }
}

/// Maps a library crate's error whose `kind()` is the shared [`ErrorKind`] to the
/// boundary's error: the kind picks the status, its `Display` is the message.
macro_rules! wrap_shared_kind_error {
    ($($krate:ident),* $(,)?) => {$(
        impl From<$krate::Error> for Error {
            fn from(err: $krate::Error) -> Error {
                Error::Wrapped {
                    status: err.kind().into(),
                    message: err.to_string(),
                }
            }
        }
    )*};
}

wrap_shared_kind_error!(
    kvc_codec,
    kvc_kvq,
    kvc_kvq_cells,
    kvc_h2o,
    kvc_mlp,
    kvc_int8,
    kvc_cache,
    kvc_store_codec,
    kvc_store_async,
    kvc_store_tiers
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The status of every shared kind, as the crates' own mappings gave it before the
    /// kinds were shared (kvc-store-async's `Busy` was `KVC_INVALID_STATE`,
    /// kvc-store-tiers' `Foreign` was `KVC_CORRUPT_DATA`).
    #[test]
    fn each_shared_kind_maps_to_its_status() {
        let expected = [
            (ErrorKind::InvalidArgument, KvcStatus::KVC_INVALID_ARGUMENT),
            (ErrorKind::CorruptData, KvcStatus::KVC_CORRUPT_DATA),
            (ErrorKind::BufferTooSmall, KvcStatus::KVC_BUFFER_TOO_SMALL),
            (ErrorKind::Unsupported, KvcStatus::KVC_UNSUPPORTED),
            (ErrorKind::Io, KvcStatus::KVC_IO),
            (ErrorKind::OutOfMemory, KvcStatus::KVC_OUT_OF_MEMORY),
            (ErrorKind::InvalidState, KvcStatus::KVC_INVALID_STATE),
            (ErrorKind::Busy, KvcStatus::KVC_INVALID_STATE),
            (ErrorKind::Foreign, KvcStatus::KVC_CORRUPT_DATA),
            (ErrorKind::Internal, KvcStatus::KVC_INTERNAL),
        ];
        assert_eq!(expected.map(|(k, _)| k), ErrorKind::ALL);
        for (kind, status) in expected {
            assert_eq!(KvcStatus::from(kind), status, "{kind:?}");
        }
    }

    #[test]
    fn a_crate_error_keeps_its_status_and_message() {
        let e = kvc_codec::Error::OutputTooSmall {
            needed: 8,
            available: 4,
        };
        let message = e.to_string();
        let wrapped = Error::from(e);
        assert_eq!(wrapped.kind(), KvcStatus::KVC_BUFFER_TOO_SMALL);
        assert_eq!(wrapped.to_string(), message);
    }
}
