//! `kvc_status`: the one result code every fallible entry point returns.

use std::ffi::{c_char, c_int, CStr};

use crate::boundary::value_boundary;

/// Result of a kvc call. `KVC_OK` (zero) is success; every other value is a failure
/// whose human-readable explanation `kvc_last_error_message` returns on the same thread.
///
/// kvc only ever *returns* this type; values that C passes in (to `kvc_status_name`)
/// travel as a plain `int`, so an out-of-range value is reported, never undefined
/// behaviour. New codes may be appended in later ABI minor versions: treat an unknown
/// non-zero value as a generic failure.
#[repr(C)]
#[must_use]
#[allow(non_camel_case_types)] // the variants carry their C names
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvcStatus {
    /// Success. Outputs were written.
    KVC_OK = 0,
    /// A required pointer argument was NULL (or a buffer pointer was NULL while its
    /// length was not zero). Nothing was written.
    KVC_NULL_ARGUMENT = 1,
    /// An argument is out of range, misaligned, overlapping another, or inconsistent
    /// with the others (e.g. an unknown dtype). Nothing was written.
    KVC_INVALID_ARGUMENT = 2,
    /// Input data (a frame, a file, a blob) is malformed, truncated or fails a check.
    /// Nothing was written.
    KVC_CORRUPT_DATA = 3,
    /// A caller-owned output buffer is smaller than needed. The `*_len` output received
    /// the size needed; the buffer itself was not touched.
    KVC_BUFFER_TOO_SMALL = 4,
    /// An operating-system I/O operation failed (open, read, write, mmap).
    KVC_IO = 5,
    /// The request is valid but this build or this data does not support it (an unknown
    /// format version, a feature compiled out).
    KVC_UNSUPPORTED = 6,
    /// Memory could not be allocated.
    KVC_OUT_OF_MEMORY = 7,
    /// A handle was used in a state that does not allow the call (e.g. closed).
    KVC_INVALID_STATE = 8,
    /// kvc panicked inside the call (a bug in kvc). The panic was caught at the
    /// boundary and never unwinds into C; the handle involved, if any, should be freed.
    KVC_PANIC = 9,
    /// A library kvc relies on (zstd) failed in a way the input does not explain. The
    /// message says what failed. Added in ABI 0.2.
    KVC_INTERNAL = 10,
}

impl KvcStatus {
    /// Every status, in numeric order.
    pub fn all() -> [KvcStatus; 11] {
        [
            KvcStatus::KVC_OK,
            KvcStatus::KVC_NULL_ARGUMENT,
            KvcStatus::KVC_INVALID_ARGUMENT,
            KvcStatus::KVC_CORRUPT_DATA,
            KvcStatus::KVC_BUFFER_TOO_SMALL,
            KvcStatus::KVC_IO,
            KvcStatus::KVC_UNSUPPORTED,
            KvcStatus::KVC_OUT_OF_MEMORY,
            KvcStatus::KVC_INVALID_STATE,
            KvcStatus::KVC_PANIC,
            KvcStatus::KVC_INTERNAL,
        ]
    }

    /// The C enumerator's name, e.g. `"KVC_BUFFER_TOO_SMALL"`.
    pub fn name(self) -> &'static str {
        self.name_cstr()
            .to_str()
            .expect("status names are ASCII literals")
    }

    /// The C enumerator's name as a static NUL-terminated string.
    pub fn name_cstr(self) -> &'static CStr {
        match self {
            KvcStatus::KVC_OK => c"KVC_OK",
            KvcStatus::KVC_NULL_ARGUMENT => c"KVC_NULL_ARGUMENT",
            KvcStatus::KVC_INVALID_ARGUMENT => c"KVC_INVALID_ARGUMENT",
            KvcStatus::KVC_CORRUPT_DATA => c"KVC_CORRUPT_DATA",
            KvcStatus::KVC_BUFFER_TOO_SMALL => c"KVC_BUFFER_TOO_SMALL",
            KvcStatus::KVC_IO => c"KVC_IO",
            KvcStatus::KVC_UNSUPPORTED => c"KVC_UNSUPPORTED",
            KvcStatus::KVC_OUT_OF_MEMORY => c"KVC_OUT_OF_MEMORY",
            KvcStatus::KVC_INVALID_STATE => c"KVC_INVALID_STATE",
            KvcStatus::KVC_PANIC => c"KVC_PANIC",
            KvcStatus::KVC_INTERNAL => c"KVC_INTERNAL",
        }
    }

    /// The status whose numeric value is `code`, if there is one.
    pub fn from_code(code: c_int) -> Option<KvcStatus> {
        KvcStatus::all().into_iter().find(|s| *s as c_int == code)
    }
}

/// Name of the enumerator whose value is `status`, e.g. `"KVC_CORRUPT_DATA"`, or
/// `"KVC_UNKNOWN_STATUS"` when `status` is not a value this library defines.
///
/// Ownership: the returned string is static; never free it. Never returns NULL.
/// Threads: safe to call from any thread at any time. Does not touch the last error.
#[no_mangle]
pub extern "C" fn kvc_status_name(status: c_int) -> *const c_char {
    value_boundary(c"KVC_UNKNOWN_STATUS".as_ptr(), || {
        KvcStatus::from_code(status)
            .map_or(c"KVC_UNKNOWN_STATUS", KvcStatus::name_cstr)
            .as_ptr()
    })
}
