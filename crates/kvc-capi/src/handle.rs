//! The opaque-handle pattern every kvc object follows (codec, h2o policy, mlp compressor,
//! cache view, quantizer, store).
//!
//! - The C type is an incomplete struct (`typedef struct kvc_codec kvc_codec;`): C code
//!   only ever holds a pointer.
//! - `kvc_<thing>_new(<config>..., kvc_<thing>** out)` returns a status and, only on
//!   `KVC_OK`, stores a new handle in `*out`. The handle is a `Box<T>` turned into a raw
//!   pointer ([`into_handle`]); the caller owns it.
//! - `kvc_<thing>_free(kvc_<thing>* thing)` returns nothing, accepts NULL (a no-op), and
//!   must be called exactly once per handle; using a handle after freeing it is undefined
//!   behaviour, as in C.
//! - Functions that only read a handle take `const kvc_<thing>*` and may run
//!   concurrently on one handle when `T: Sync` (their documentation says so); functions
//!   that take `kvc_<thing>*` need exclusive access: one thread at a time per handle.
//!   Different handles are independent. Every handle is `Send`: it may be created on
//!   one thread and used and freed on another.
//! - After a call on a handle returns `KVC_PANIC`, the only safe call is `_free`.

use crate::boundary::{in_ref, out_ref};
use crate::error::Error;

/// Moves `value` to the heap and hands ownership to the C caller.
pub fn into_handle<T: Send>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Writes a new handle to the caller's `out` pointer (the last step of a `_new`).
///
/// # Safety
/// `out` must be valid for writing a pointer (it was checked with [`out_ref`] already,
/// or this function checks it).
pub unsafe fn store_handle<T: Send>(out: *mut *mut T, value: T) -> Result<(), Error> {
    // SAFETY: forwarded contract of `out_ref`.
    let slot = unsafe { out_ref(out, "out") }?;
    *slot = into_handle(value);
    Ok(())
}

/// Borrows the object behind a handle for reading.
///
/// # Safety
/// A non-NULL `handle` must have come from [`into_handle`] for the same `T` and not have
/// been freed; no call may hold it mutably at the same time.
pub unsafe fn handle_ref<'a, T>(handle: *const T, argument: &'static str) -> Result<&'a T, Error> {
    // SAFETY: forwarded contract.
    unsafe { in_ref(handle, argument) }
}

/// Borrows the object behind a handle exclusively.
///
/// # Safety
/// A non-NULL `handle` must have come from [`into_handle`] for the same `T` and not have
/// been freed; no other call may use it at the same time.
pub unsafe fn handle_mut<'a, T>(
    handle: *mut T,
    argument: &'static str,
) -> Result<&'a mut T, Error> {
    // SAFETY: forwarded contract (exclusive access to a live boxed `T`).
    unsafe { out_ref(handle, argument) }
}

/// Frees a handle; NULL is a no-op.
///
/// # Safety
/// A non-NULL `handle` must have come from [`into_handle`] for the same `T`, not have been
/// freed, and not be in use by another call.
pub unsafe fn free_handle<T>(handle: *mut T) {
    if !handle.is_null() {
        // SAFETY: the pointer came from `Box::into_raw` and is freed once (contract).
        drop(unsafe { Box::from_raw(handle) });
    }
}
