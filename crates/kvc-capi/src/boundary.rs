//! The panic boundary every entry point runs in, and the checked conversions from C
//! pointers to Rust references and slices that entry points do first.
//!
//! The pattern for an entry point that returns a status:
//!
//! ```ignore
//! #[no_mangle]
//! pub unsafe extern "C" fn kvc_thing_do(thing: *mut KvcThing, out: *mut u32) -> KvcStatus {
//!     status_boundary("kvc_thing_do", || {
//!         // 1. every pointer is checked before anything else happens
//!         let thing = unsafe { handle_mut(thing, "thing") }?;
//!         let out = unsafe { out_ref(out, "out") }?;
//!         // 2. the work happens into locals
//!         let value = thing.inner.do_it()?;
//!         // 3. outputs are written last, only on success
//!         *out = value;
//!         Ok(())
//!     })
//! }
//! ```

use std::any::Any;
use std::mem::{align_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::error::Error;
use crate::last_error::{clear_last_error, set_last_error};
use crate::status::KvcStatus;

#[cfg(panic = "abort")]
compile_error!(
    "kvc-capi must be built with panic = \"unwind\": its entry points catch panics so that \
     they never cross into C"
);

/// Runs the body of a status-returning entry point: catches any panic, turns an `Err`
/// into its status and this thread's last-error message, and clears the message on
/// success. `function` is the C name, used as the message's prefix.
#[inline]
pub fn status_boundary(function: &str, body: impl FnOnce() -> Result<(), Error>) -> KvcStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            clear_last_error();
            KvcStatus::KVC_OK
        }
        Ok(Err(err)) => {
            record(function, &err);
            err.kind()
        }
        Err(payload) => {
            let err = Error::Panic {
                message: panic_message(payload),
            };
            record(function, &err);
            KvcStatus::KVC_PANIC
        }
    }
}

/// Stores `err` as the thread's last error; a panic while formatting it (a broken
/// `Display` of a wrapped error) must not escape either, and leaves the old message.
fn record(function: &str, err: &Error) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| set_last_error(function, err))) {
        drop_payload(payload);
    }
}

/// Like [`status_boundary`] but leaves the last-error message alone, for the functions
/// that report on it (`kvc_last_error_message`).
#[inline]
pub fn status_boundary_keep_error(body: impl FnOnce() -> Result<(), Error>) -> KvcStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => KvcStatus::KVC_OK,
        Ok(Err(err)) => err.kind(),
        Err(payload) => {
            drop_payload(payload);
            KvcStatus::KVC_PANIC
        }
    }
}

/// Runs the body of an entry point that returns a value rather than a status (a name,
/// a version, a table pointer, `void`): a panic yields `fallback`. Does not touch the
/// last error.
#[inline]
pub fn value_boundary<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            drop_payload(payload);
            fallback
        }
    }
}

/// The panic payload as text, dropping the payload without letting its destructor
/// unwind further.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    };
    drop_payload(payload);
    message
}

fn drop_payload(payload: Box<dyn Any + Send>) {
    // A payload's destructor may itself panic; that must not unwind into C either.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
}

/// Checks that `ptr` is non-NULL and aligned for `T`.
fn check_ptr<T>(ptr: *const T, argument: &'static str) -> Result<NonNull<T>, Error> {
    let nn = NonNull::new(ptr.cast_mut()).ok_or(Error::NullArgument { argument })?;
    if !(ptr as usize).is_multiple_of(align_of::<T>()) {
        return Err(misaligned::<T>(ptr, argument));
    }
    Ok(nn)
}

fn misaligned<T>(ptr: *const T, argument: &'static str) -> Error {
    Error::invalid(
        argument,
        format!(
            "pointer {ptr:p} is not aligned to {} bytes",
            align_of::<T>()
        ),
    )
}

/// A shared reference to the `T` that `ptr` points to (an input parameter or a handle).
///
/// # Safety
/// If `ptr` is non-NULL and aligned it must point to a valid `T` that nothing mutates
/// for `'a` (the caller's contract, stated in the header).
pub unsafe fn in_ref<'a, T>(ptr: *const T, argument: &'static str) -> Result<&'a T, Error> {
    let nn = check_ptr(ptr, argument)?;
    // SAFETY: non-NULL and aligned (checked); validity is the caller's contract.
    Ok(unsafe { nn.as_ref() })
}

/// An exclusive reference to the `T` that `ptr` points to (an output parameter or a
/// handle used exclusively).
///
/// # Safety
/// If `ptr` is non-NULL and aligned it must point to a valid `T` that nothing else
/// accesses for `'a`. Output parameters are plain C data (`Copy`, any bit pattern
/// valid), so "valid" there only means writable.
pub unsafe fn out_ref<'a, T>(ptr: *mut T, argument: &'static str) -> Result<&'a mut T, Error> {
    let mut nn = check_ptr(ptr, argument)?;
    // SAFETY: non-NULL and aligned (checked); validity is the caller's contract.
    Ok(unsafe { nn.as_mut() })
}

/// Checks that `len` elements of `T` fit in one Rust allocation (`isize::MAX` bytes).
fn check_len<T>(len: usize, argument: &'static str) -> Result<(), Error> {
    match len.checked_mul(size_of::<T>()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(()),
        _ => Err(Error::invalid(
            argument,
            format!(
                "{len} elements of {} bytes exceed the largest possible buffer",
                size_of::<T>()
            ),
        )),
    }
}

/// The input slice `ptr[0..len]`. A NULL `ptr` is accepted when `len` is zero.
///
/// # Safety
/// If `ptr` is non-NULL and aligned it must point to `len` initialised `T`s that nothing
/// mutates for `'a`.
pub unsafe fn in_slice<'a, T>(
    ptr: *const T,
    len: usize,
    argument: &'static str,
) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    check_len::<T>(len, argument)?;
    let nn = check_ptr(ptr, argument)?;
    // SAFETY: non-NULL, aligned, `len * size_of::<T>() <= isize::MAX` (checked);
    // that `len` elements are readable is the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(nn.as_ptr(), len) })
}

/// The output slice `ptr[0..len]`. A NULL `ptr` is accepted when `len` is zero.
///
/// # Safety
/// If `ptr` is non-NULL and aligned it must point to `len` writable `T`s that nothing
/// else accesses for `'a`; `T` must be plain data (any bit pattern valid).
pub unsafe fn out_slice<'a, T: Copy>(
    ptr: *mut T,
    len: usize,
    argument: &'static str,
) -> Result<&'a mut [T], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_len::<T>(len, argument)?;
    let nn = check_ptr(ptr.cast_const(), argument)?;
    // SAFETY: non-NULL, aligned, `len * size_of::<T>() <= isize::MAX` (checked);
    // that `len` elements are writable and unaliased is the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(nn.as_ptr(), len) })
}

/// Fails when the byte ranges `[a, a + a_bytes)` and `[b, b + b_bytes)` overlap; called
/// before an input and an output slice are formed from C pointers, since Rust may not
/// hold a shared and an exclusive reference to the same memory.
pub fn check_disjoint(
    a: *const u8,
    a_bytes: usize,
    b: *const u8,
    b_bytes: usize,
    argument: &'static str,
) -> Result<(), Error> {
    if a_bytes == 0 || b_bytes == 0 {
        return Ok(());
    }
    let (a0, b0) = (a as usize, b as usize);
    let disjoint = a0.saturating_add(a_bytes) <= b0 || b0.saturating_add(b_bytes) <= a0;
    if disjoint {
        Ok(())
    } else {
        Err(Error::invalid(
            argument,
            "the output buffer overlaps the input buffer",
        ))
    }
}
