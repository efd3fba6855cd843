//! The one error type of `kvc-kvq`.

use std::fmt;

/// The broad class of an [`Error`] (kvc's one `kvc_types::ErrorKind`, shared by
/// every crate), which `kvc-capi` maps to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong in `kvc-kvq`; each variant names what and where.
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
    /// A buffer is shorter than the format needs.
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Bytes (or elements, as `what` says) needed.
        needed: usize,
        /// Bytes (or elements) given.
        found: usize,
    },
    /// A size computed from the arguments does not fit in `usize`.
    SizeOverflow {
        /// What was being computed.
        what: &'static str,
    },
    /// A numeric argument is out of its range.
    InvalidValue {
        /// Which argument.
        what: &'static str,
        /// What was given.
        value: i64,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A layer of C8 parameters (or of a plan) that must exist is missing.
    MissingLayer {
        /// Layer number.
        layer: usize,
        /// Which tensor or entry.
        which: &'static str,
    },
    /// A kvq config string (`k4v4`, `k3v3:lm`, ...) does not parse.
    BadConfig {
        /// The string given.
        input: String,
        /// Why.
        reason: String,
    },
    /// A kvq plan (JSON) is malformed or inconsistent.
    BadPlan {
        /// Why.
        reason: String,
    },
    /// A packed buffer holds a value its format forbids (a non-finite norm or scale).
    CorruptRow {
        /// Which field.
        what: &'static str,
        /// Row index in the buffer.
        row: usize,
    },
    /// A caller's input value that kvq cannot code: not finite, beyond
    /// [`MAX_ABS_VALUE`](crate::row::MAX_ABS_VALUE), or a row (or group) whose scale
    /// would not fit in f16. Names the row and the element (for a scale, the element of
    /// largest magnitude).
    BadValue {
        /// Which input (`"kvq row"`, `"query"`, ...).
        what: &'static str,
        /// Row index in the call's input (0 for a one-row call).
        row: usize,
        /// Element index within the row.
        element: usize,
        /// The value found.
        value: f32,
        /// Why it is refused.
        reason: &'static str,
    },
    /// Well-formed input that kvc-kvq does not handle.
    Unsupported {
        /// What is not handled.
        what: &'static str,
        /// The value given.
        value: i64,
    },
    /// A shape or spec that a kvq packed cache file ([`crate::file`]) cannot hold.
    FileShape {
        /// Why, naming the field.
        reason: String,
    },
    /// A value a kvq packed cache file cannot code, at its layer, token and head.
    FileValues {
        /// Where and why.
        reason: String,
    },
    /// Bytes that are not a valid kvq packed cache file: its header, or the body's length.
    BadFile {
        /// Why, naming the field.
        reason: String,
    },
    /// A layer of a kvq packed cache file holds a value its format forbids (a non-finite
    /// scale, step, minimum or f16 tail value), at its layer, token and head.
    FileData {
        /// Where and why.
        reason: String,
    },
}

impl Error {
    /// The same error naming row `row` of a batch (for errors that name a row: a bad
    /// input value or a corrupt packed row); any other error unchanged.
    pub fn at_row(self, row: usize) -> Error {
        match self {
            Error::BadValue {
                what,
                element,
                value,
                reason,
                ..
            } => Error::BadValue {
                what,
                row,
                element,
                value,
                reason,
            },
            Error::CorruptRow { what, .. } => Error::CorruptRow { what, row },
            e => e,
        }
    }

    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::LayoutMismatch { .. }
            | Error::SizeOverflow { .. }
            | Error::InvalidValue { .. }
            | Error::BadConfig { .. }
            | Error::BadValue { .. }
            | Error::FileShape { .. }
            | Error::FileValues { .. } => ErrorKind::InvalidArgument,
            Error::BufferTooSmall { .. } => ErrorKind::BufferTooSmall,
            Error::NonFinite { .. }
            | Error::MissingLayer { .. }
            | Error::BadPlan { .. }
            | Error::CorruptRow { .. }
            | Error::BadFile { .. }
            | Error::FileData { .. } => ErrorKind::CorruptData,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
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
            Error::BufferTooSmall {
                what,
                needed,
                found,
            } => write!(f, "{what} too small: needs {needed}, got {found}"),
            Error::SizeOverflow { what } => write!(f, "size overflow computing {what}"),
            Error::InvalidValue {
                what,
                value,
                reason,
            } => write!(f, "invalid {what} {value}: {reason}"),
            Error::MissingLayer { layer, which } => {
                write!(f, "layer {layer}: missing {which}")
            }
            Error::BadConfig { input, reason } => {
                write!(f, "bad kvq config {input:?}: {reason}")
            }
            Error::BadPlan { reason } => write!(f, "bad kvq plan: {reason}"),
            Error::CorruptRow { what, row } => {
                write!(f, "packed row {row}: {what} is not finite")
            }
            Error::BadValue {
                what,
                row,
                element,
                value,
                reason,
            } => write!(
                f,
                "{what}: row {row}, element {element}: {value:e} {reason}"
            ),
            Error::Unsupported { what, value } => write!(f, "unsupported {what} {value}"),
            Error::FileShape { reason }
            | Error::FileValues { reason }
            | Error::FileData { reason } => f.write_str(reason),
            Error::BadFile { reason } => write!(f, "not a valid kvq packed file: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
