//! The one error type of `kvc-cache`.

use std::fmt;

/// The coarse class of an [`Error`], shared by every kvc crate; `kvc-capi` maps each
/// kind to one C status.
pub use kvc_types::ErrorKind;

/// Everything that can go wrong in `kvc-cache`; each variant names what and where.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A layout dimension is zero or out of range.
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
    /// Two layouts that must agree do not.
    LayoutMismatch {
        /// What differs.
        what: &'static str,
        /// Expected value.
        expected: usize,
        /// Found value.
        found: usize,
    },
    /// A reserve span is empty, unsorted, overlapping or out of range.
    InvalidPlan {
        /// Index of the offending span.
        span: usize,
        /// Its offset.
        offset: usize,
        /// Its length.
        length: usize,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A token range is empty-reversed or beyond the capacity.
    InvalidRange {
        /// Start token.
        start: usize,
        /// End token (exclusive).
        end: usize,
        /// The limit it must stay within.
        limit: usize,
    },
    /// A cell index or sequence id is out of range.
    InvalidCell {
        /// What is wrong.
        what: &'static str,
        /// The value given.
        value: i64,
        /// The limit.
        limit: i64,
    },
    /// The element type cannot be used for this operation.
    UnsupportedDType {
        /// Where.
        what: &'static str,
        /// The dtype's name.
        dtype: String,
    },
    /// A borrowed buffer is not aligned for its element type (the MLP works on typed
    /// slices).
    Misaligned {
        /// Which buffer.
        what: &'static str,
        /// The alignment needed, in bytes.
        align: usize,
    },
    /// A cell of the sequence is also used by another sequence, so it cannot be rewritten.
    SharedCell {
        /// The cell index.
        cell: usize,
        /// The sequence being rewritten.
        seq: i32,
        /// The cell's full sequence mask.
        seq_mask: u64,
    },
    /// Two cells of one sequence hold the same position.
    DuplicatePosition {
        /// The sequence.
        seq: i32,
        /// The position.
        pos: i32,
    },
    /// A kvc-h2o plan with one list of pairs per KV head where one list is needed.
    GroupedPlan {
        /// Groups in the plan.
        groups: usize,
    },
    /// The MLP compressor refused (layer out of range, factor or head_dim mismatch).
    Mlp(kvc_mlp::Error),
    /// mmap / madvise failed.
    Os {
        /// The call.
        call: &'static str,
        /// errno.
        errno: i32,
    },
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidShape { .. }
            | Error::SizeOverflow { .. }
            | Error::LayoutMismatch { .. }
            | Error::InvalidPlan { .. }
            | Error::InvalidRange { .. }
            | Error::InvalidCell { .. }
            | Error::Misaligned { .. }
            | Error::DuplicatePosition { .. } => ErrorKind::InvalidArgument,
            Error::SharedCell { .. } | Error::GroupedPlan { .. } => ErrorKind::Unsupported,
            Error::Mlp(e) => match e.kind() {
                kvc_mlp::ErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
                kvc_mlp::ErrorKind::BufferTooSmall => ErrorKind::BufferTooSmall,
                kvc_mlp::ErrorKind::Unsupported => ErrorKind::Unsupported,
                kvc_mlp::ErrorKind::Io => ErrorKind::Io,
                _ => ErrorKind::CorruptData,
            },
            Error::BufferTooSmall { .. } => ErrorKind::BufferTooSmall,
            Error::UnsupportedDType { .. } => ErrorKind::Unsupported,
            Error::Os { .. } => ErrorKind::Io,
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
            } => {
                write!(f, "invalid layout: {field} = {value}: {reason}")
            }
            Error::SizeOverflow { what } => write!(f, "size overflow computing {what}"),
            Error::BufferTooSmall {
                what,
                needed,
                found,
            } => {
                write!(
                    f,
                    "{what} buffer too small: layout needs {needed} bytes, got {found}"
                )
            }
            Error::LayoutMismatch {
                what,
                expected,
                found,
            } => {
                write!(
                    f,
                    "layout mismatch: {what} expected {expected}, found {found}"
                )
            }
            Error::InvalidPlan {
                span,
                offset,
                length,
                reason,
            } => write!(
                f,
                "invalid reserve plan: span {span} (offset {offset}, length {length}): {reason}"
            ),
            Error::InvalidRange { start, end, limit } => {
                write!(f, "invalid token range {start}..{end} (limit {limit})")
            }
            Error::InvalidCell { what, value, limit } => {
                write!(f, "invalid {what} {value} (limit {limit})")
            }
            Error::UnsupportedDType { what, dtype } => {
                write!(f, "unsupported dtype {dtype} for {what}")
            }
            Error::Misaligned { what, align } => {
                write!(f, "{what} buffer is not aligned to {align} bytes")
            }
            Error::SharedCell { cell, seq, seq_mask } => write!(
                f,
                "cell {cell} of sequence {seq} is shared with other sequences (mask {seq_mask:#x})"
            ),
            Error::DuplicatePosition { seq, pos } => {
                write!(f, "sequence {seq} has two cells at position {pos}")
            }
            Error::GroupedPlan { groups } => write!(
                f,
                "the kvc-h2o plan has {groups} groups (one per KV head); convert one group at a time"
            ),
            Error::Mlp(e) => write!(f, "MLP compression: {e}"),
            Error::Os { call, errno } => write!(f, "{call} failed: errno {errno}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Mlp(e) => Some(e),
            _ => None,
        }
    }
}

impl From<kvc_mlp::Error> for Error {
    fn from(e: kvc_mlp::Error) -> Error {
        Error::Mlp(e)
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
