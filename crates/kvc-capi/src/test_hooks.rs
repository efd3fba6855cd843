//! Entry points that exist only to test the C boundary from C and C++ (built with the
//! `test-hooks` feature, declared in the header under `KVC_TEST_HOOKS`): a deliberate
//! panic, and a small counted handle that follows the handle pattern of [`crate::handle`].

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::boundary::{out_ref, status_boundary, value_boundary};
use crate::error::Error;
use crate::handle::{free_handle, handle_mut, handle_ref, store_handle};
use crate::status::KvcStatus;

/// Panics inside the boundary: `mode` 0 with a `&str` payload, 1 with a `String`, 2 with
/// a non-string payload; any other mode returns `KVC_OK` without panicking.
/// Returns `KVC_PANIC` with the payload in the last-error message.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub extern "C" fn kvc_test_panic(mode: i32) -> KvcStatus {
    status_boundary("kvc_test_panic", || match mode {
        0 => panic!("deliberate test panic"),
        1 => panic!("deliberate test panic {mode}"),
        2 => std::panic::panic_any(mode),
        _ => Ok(()),
    })
}

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// A test handle holding one integer.
pub struct KvcTestCounter {
    value: i64,
}

impl Drop for KvcTestCounter {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Creates a counter holding `start` and stores it in `*out` (only on `KVC_OK`).
/// Free it with `kvc_test_counter_free`.
///
/// # Safety
/// `out` must be valid for writing a pointer.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_test_counter_new(
    start: i64,
    out: *mut *mut KvcTestCounter,
) -> KvcStatus {
    status_boundary("kvc_test_counter_new", || {
        // SAFETY: `out` is writable (contract); checked before anything is allocated.
        unsafe { out_ref(out, "out") }?;
        LIVE.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { store_handle(out, KvcTestCounter { value: start }) }
    })
}

/// Adds `delta` and stores the new value in `*value` (only on `KVC_OK`). An overflow is
/// `KVC_INVALID_ARGUMENT` and leaves the counter unchanged. Needs exclusive access.
///
/// # Safety
/// `counter` must be a live handle from `kvc_test_counter_new`; `value` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_test_counter_add(
    counter: *mut KvcTestCounter,
    delta: i64,
    value: *mut i64,
) -> KvcStatus {
    status_boundary("kvc_test_counter_add", || {
        // SAFETY: a live handle used exclusively (contract).
        let counter = unsafe { handle_mut(counter, "counter") }?;
        // SAFETY: writable (contract).
        let value = unsafe { out_ref(value, "value") }?;
        let sum = counter.value.checked_add(delta).ok_or_else(|| {
            Error::invalid(
                "delta",
                format!("{} + {delta} overflows int64_t", counter.value),
            )
        })?;
        counter.value = sum;
        *value = sum;
        Ok(())
    })
}

/// Reads the counter into `*value`. May run concurrently with other reads.
///
/// # Safety
/// `counter` must be a live handle from `kvc_test_counter_new`; `value` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_test_counter_get(
    counter: *const KvcTestCounter,
    value: *mut i64,
) -> KvcStatus {
    status_boundary("kvc_test_counter_get", || {
        // SAFETY: a live handle (contract).
        let counter = unsafe { handle_ref(counter, "counter") }?;
        // SAFETY: writable (contract).
        *unsafe { out_ref(value, "value") }? = counter.value;
        Ok(())
    })
}

/// Frees a counter; NULL is a no-op.
///
/// # Safety
/// `counter` must be NULL or a live handle from `kvc_test_counter_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_test_counter_free(counter: *mut KvcTestCounter) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(counter) })
}

/// Number of counters alive in the process (created and not yet freed).
#[no_mangle]
pub extern "C" fn kvc_test_live_counters() -> usize {
    value_boundary(0, || LIVE.load(Ordering::Relaxed))
}
