//! The one error type of `kvc-int8`.

use std::fmt;

/// The broad class of an [`Error`] (kvc's one `kvc_types::ErrorKind`, shared by
/// every crate), which `kvc-capi` maps to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong with C8: parameters, kernels, calibration, row batches and
/// msmodelslim files; each variant names what and where.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A shape value (channels, tokens) is zero or out of range.
    InvalidShape {
        /// Which dimension.
        field: &'static str,
        /// What was given.
        value: usize,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A size computed from the shape does not fit in `usize`.
    SizeOverflow {
        /// What was being computed.
        what: &'static str,
    },
    /// A buffer is shorter than its layout.
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes given.
        found: usize,
    },
    /// Two lengths or layouts that must agree do not.
    LayoutMismatch {
        /// What differs.
        what: &'static str,
        /// Expected value.
        expected: usize,
        /// Found value.
        found: usize,
    },
    /// A token range is reversed or beyond the capacity.
    InvalidRange {
        /// Start token.
        start: usize,
        /// End token (exclusive).
        end: usize,
        /// The limit it must stay within.
        limit: usize,
    },
    /// The element type cannot be used for this operation.
    UnsupportedDType {
        /// Where.
        what: &'static str,
        /// The dtype's name.
        dtype: String,
    },
    /// `quant_model_description.json` is not valid JSON or not an object.
    BadDescription {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The description does not declare C8 KV quantization.
    NotC8 {
        /// The file.
        path: String,
        /// What `kv_cache_type` / `kv_quant_type` holds (or `missing`).
        found: String,
    },
    /// The safetensors file is malformed.
    BadSafetensors {
        /// The file.
        path: String,
        /// The parser's reason.
        reason: String,
    },
    /// A C8 tensor is unusable: bad shape, bad values, duplicate, no layer number.
    BadTensor {
        /// The tensor name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A C8 tensor (or a layer's parameters) that must exist is missing.
    MissingTensor {
        /// Layer number.
        layer: usize,
        /// Which one (`k_proj.kv_cache_scale`, ...).
        which: &'static str,
    },
    /// A value that quantization cannot use (NaN or infinity in a cache or a parameter).
    NonFinite {
        /// Where.
        what: &'static str,
        /// Element index.
        index: usize,
    },
    /// A file could not be read or written.
    Io {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A cache layout refused (`kvc-cache`'s error, shown as it is).
    Layout(kvc_cache::Error),
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidShape { .. }
            | Error::SizeOverflow { .. }
            | Error::LayoutMismatch { .. }
            | Error::InvalidRange { .. } => ErrorKind::InvalidArgument,
            Error::BufferTooSmall { .. } => ErrorKind::BufferTooSmall,
            Error::UnsupportedDType { .. } | Error::NotC8 { .. } => ErrorKind::Unsupported,
            Error::BadDescription { .. }
            | Error::BadSafetensors { .. }
            | Error::BadTensor { .. }
            | Error::MissingTensor { .. }
            | Error::NonFinite { .. } => ErrorKind::CorruptData,
            Error::Io { .. } => ErrorKind::Io,
            Error::Layout(e) => e.kind(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidShape {
                field,
                value,
                reason,
            } => write!(f, "invalid layout: {field} = {value}: {reason}"),
            Error::SizeOverflow { what } => write!(f, "size overflow computing {what}"),
            Error::BufferTooSmall {
                what,
                needed,
                found,
            } => write!(
                f,
                "{what} buffer too small: layout needs {needed} bytes, got {found}"
            ),
            Error::LayoutMismatch {
                what,
                expected,
                found,
            } => write!(
                f,
                "layout mismatch: {what} expected {expected}, found {found}"
            ),
            Error::InvalidRange { start, end, limit } => {
                write!(f, "invalid token range {start}..{end} (limit {limit})")
            }
            Error::UnsupportedDType { what, dtype } => {
                write!(f, "unsupported dtype {dtype} for {what}")
            }
            Error::BadDescription { path, reason } => {
                write!(f, "{path}: bad description: {reason}")
            }
            Error::NotC8 { path, found } => write!(
                f,
                "{path}: not a C8 KV-cache checkpoint (kv_cache_type/kv_quant_type is {found})"
            ),
            Error::BadSafetensors { path, reason } => {
                write!(f, "{path}: bad safetensors: {reason}")
            }
            Error::BadTensor { name, reason } => write!(f, "tensor {name}: {reason}"),
            Error::MissingTensor { layer, which } => {
                write!(f, "layer {layer}: missing tensor {which}")
            }
            Error::NonFinite { what, index } => {
                write!(f, "{what}: non-finite value at element {index}")
            }
            Error::Io { path, source } => write!(f, "{path}: {source}"),
            Error::Layout(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Layout(e) => Some(e),
            _ => None,
        }
    }
}

impl From<kvc_cache::Error> for Error {
    fn from(e: kvc_cache::Error) -> Error {
        Error::Layout(e)
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
