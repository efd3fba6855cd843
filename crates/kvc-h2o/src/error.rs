//! The one error type of `kvc-h2o`.

use std::fmt;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Why a `kvc-h2o` call failed. Every variant names the field and the values involved.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A configuration field is out of its valid range.
    InvalidConfig {
        /// The field's name as the spec spells it (`h2o_block_tokens`, ...).
        field: &'static str,
        /// What the field must satisfy and what it was.
        reason: String,
    },
    /// A layer index is not below the policy's layer count.
    LayerOutOfRange {
        /// The layer asked for.
        layer: usize,
        /// How many layers the policy manages state for.
        n_layers: usize,
    },
    /// A call shape value is invalid (zero, too large, or inconsistent).
    InvalidShape {
        /// The field (`kv_len`, `n_queries`, `n_heads`, `n_kv_heads`, ...).
        field: &'static str,
        /// What was expected and what was found.
        reason: String,
    },
    /// A buffer has the wrong number of elements.
    WrongLength {
        /// Which buffer.
        what: &'static str,
        /// How many elements were expected (or the minimum needed).
        expected: usize,
        /// How many were given.
        found: usize,
    },
    /// An index given with a buffer (head, first key, row count) is out of range.
    IndexOutOfRange {
        /// Which index.
        what: &'static str,
        /// Its value.
        index: usize,
        /// The exclusive bound it must stay below (or, for ranges, the end it may reach).
        bound: usize,
    },
    /// The accumulated attention sums of a block are not finite, or negative.
    InvalidScore {
        /// The layer of the call.
        layer: usize,
        /// The block (and, in per-KV-head mode, `block * n_groups + group`) index.
        index: usize,
        /// The offending value.
        value: f32,
    },
    /// `begin_call` was called for a layer that already has an open call.
    CallAlreadyOpen {
        /// The layer.
        layer: usize,
    },
    /// Ingestion or `end_call` without a matching `begin_call`.
    NoOpenCall {
        /// The layer.
        layer: usize,
    },
    /// Growing the layer's score buffers to the call's block count failed.
    OutOfMemory {
        /// The layer of the call.
        layer: usize,
        /// Elements that could not be reserved.
        elements: usize,
    },
    /// The ingestion path does not fit the configured score granularity.
    Unsupported {
        /// What was asked for and why it cannot be served.
        reason: &'static str,
    },
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidConfig { .. }
            | Error::LayerOutOfRange { .. }
            | Error::InvalidShape { .. }
            | Error::WrongLength { .. }
            | Error::IndexOutOfRange { .. }
            | Error::InvalidScore { .. } => ErrorKind::InvalidArgument,
            Error::CallAlreadyOpen { .. } | Error::NoOpenCall { .. } => ErrorKind::InvalidState,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::OutOfMemory { .. } => ErrorKind::OutOfMemory,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidConfig { field, reason } => write!(f, "invalid {field}: {reason}"),
            Error::LayerOutOfRange { layer, n_layers } => {
                write!(f, "layer {layer} out of range (policy has {n_layers} layers)")
            }
            Error::InvalidShape { field, reason } => write!(f, "invalid {field}: {reason}"),
            Error::WrongLength {
                what,
                expected,
                found,
            } => write!(f, "{what}: expected {expected} elements, found {found}"),
            Error::IndexOutOfRange { what, index, bound } => {
                write!(f, "{what} {index} out of range (bound {bound})")
            }
            Error::InvalidScore {
                layer,
                index,
                value,
            } => write!(
                f,
                "layer {layer}: accumulated attention sum {value} at index {index} is not a finite non-negative number"
            ),
            Error::CallAlreadyOpen { layer } => {
                write!(f, "layer {layer}: begin_call while a call is already open")
            }
            Error::NoOpenCall { layer } => write!(f, "layer {layer}: no open call (begin_call first)"),
            Error::Unsupported { reason } => write!(f, "unsupported: {reason}"),
            Error::OutOfMemory { layer, elements } => {
                write!(f, "layer {layer}: cannot allocate {elements} score elements")
            }
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
