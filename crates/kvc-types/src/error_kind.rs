//! The coarse class of a kvc error.

/// What class of failure a kvc crate's `Error` is: each crate's `Error::kind()` returns
/// one, and `kvc-capi` maps each kind to one C status (named after each variant). A crate
/// uses the kinds that its errors can be; the others never come out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller passed something unusable: a shape, a range, a config value, an option
    /// (`KVC_INVALID_ARGUMENT`).
    InvalidArgument,
    /// Bytes to decode or load are not what their format says: a blob, a file, a dump
    /// (`KVC_CORRUPT_DATA`).
    CorruptData,
    /// A caller-provided buffer is smaller than the result or the layout
    /// (`KVC_BUFFER_TOO_SMALL`).
    BufferTooSmall,
    /// Well-formed input that kvc does not handle: a dtype, a head_dim, a version
    /// (`KVC_UNSUPPORTED`).
    Unsupported,
    /// The operating system or a tier's medium failed: a file, mmap, Redis (`KVC_IO`).
    Io,
    /// Memory could not be allocated (`KVC_OUT_OF_MEMORY`).
    OutOfMemory,
    /// The call sequence is wrong: ingesting without an open call, opening one twice
    /// (`KVC_INVALID_STATE`).
    InvalidState,
    /// The asynchronous store holds the range (in flight or compressed), so it cannot be
    /// written now (`KVC_INVALID_STATE`).
    Busy,
    /// A valid chunk blob that belongs to another key or another model and layout
    /// (`KVC_CORRUPT_DATA`); the tiers treat it as a miss.
    Foreign,
    /// A failure inside kvc or a library it calls (zstd, a worker) that valid input
    /// should never cause (`KVC_INTERNAL`).
    Internal,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::InvalidArgument,
        ErrorKind::CorruptData,
        ErrorKind::BufferTooSmall,
        ErrorKind::Unsupported,
        ErrorKind::Io,
        ErrorKind::OutOfMemory,
        ErrorKind::InvalidState,
        ErrorKind::Busy,
        ErrorKind::Foreign,
        ErrorKind::Internal,
    ];
}
