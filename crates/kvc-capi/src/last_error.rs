//! The thread-local last-error message: set by a failing entry point, cleared by a
//! succeeding one, copied out by `kvc_last_error_message`.

use std::cell::RefCell;
use std::ffi::c_char;
use std::fmt;

use crate::boundary::{out_ref, out_slice, status_boundary_keep_error};
use crate::error::Error;
use crate::status::KvcStatus;

thread_local! {
    /// The message of the last failed call on this thread, NUL-terminated, or empty.
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Records `message` (prefixed with the entry point's name) as this thread's last error.
pub(crate) fn set_last_error(function: &str, message: &dyn fmt::Display) {
    use std::io::Write;
    LAST_ERROR.with(|cell| {
        // A re-entrant borrow cannot happen (nothing here calls back into C), but never
        // panic at the boundary: if it did, keep the old message.
        if let Ok(mut buf) = cell.try_borrow_mut() {
            buf.clear();
            // Writing into a Vec cannot fail.
            let _ = write!(buf, "{function}: {message}");
            // An interior NUL would truncate the message for C; replace it.
            for b in buf.iter_mut() {
                if *b == 0 {
                    *b = b'?';
                }
            }
            buf.push(0);
        }
    });
}

/// Clears this thread's last error (called when an entry point succeeds).
pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|cell| {
        if let Ok(mut buf) = cell.try_borrow_mut() {
            buf.clear();
        }
    });
}

/// Runs `f` on this thread's last error message including its NUL terminator
/// (`b"\0"` when there is none).
pub(crate) fn with_last_error<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    LAST_ERROR.with(|cell| match cell.try_borrow() {
        Ok(buf) if !buf.is_empty() => f(&buf),
        _ => f(b"\0"),
    })
}

/// Copies the message explaining this thread's last failed kvc call into `buf`.
///
/// The message is UTF-8, NUL-terminated, one line, and starts with the name of the
/// function that failed (e.g. `"kvc_convert: invalid `src_dtype`: 7 is not a
/// kvc_dtype ..."`). It is the empty string when the last status-returning call on this
/// thread succeeded or none was made. Functions that return no status
/// (`kvc_version`, `kvc_status_name`, `kvc_*_free`, ...) leave it unchanged.
///
/// - `needed` (optional, may be NULL): receives the size in bytes the message needs
///   including its NUL terminator (1 for the empty message).
/// - `buf`, `capacity`: the caller's buffer. `buf == NULL && capacity == 0` is a size
///   query. When `capacity` is too small nothing is copied and `KVC_BUFFER_TOO_SMALL`
///   is returned (there is no truncation: call again with `*needed` bytes).
///
/// This function never changes the last error, so it can be called repeatedly (first
/// to size, then to copy).
///
/// Returns `KVC_OK`, `KVC_NULL_ARGUMENT` (`buf` NULL with `capacity > 0`),
/// `KVC_BUFFER_TOO_SMALL`.
/// Ownership: `buf` is the caller's; the message stays owned by kvc.
/// Threads: reads only the calling thread's message; other threads' calls never
/// change it.
///
/// # Safety
/// `buf` must be valid for writing `capacity` bytes; `needed`, if non-NULL, for writing
/// a `size_t`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_last_error_message(
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> KvcStatus {
    status_boundary_keep_error(|| {
        with_last_error(|message| {
            if !needed.is_null() {
                // SAFETY: non-NULL `needed` is writable (contract).
                *unsafe { out_ref(needed, "needed") }? = message.len();
            }
            if buf.is_null() && capacity == 0 {
                return Ok(());
            }
            if buf.is_null() {
                return Err(Error::NullArgument { argument: "buf" });
            }
            if capacity < message.len() {
                return Err(Error::BufferTooSmall {
                    argument: "buf",
                    needed: message.len(),
                    capacity,
                });
            }
            // SAFETY: `buf` is writable for `capacity >= message.len()` bytes (contract).
            let out = unsafe { out_slice(buf.cast::<u8>(), message.len(), "buf") }?;
            out.copy_from_slice(message);
            Ok(())
        })
    })
}
