//! A counting global allocator for kvc's allocation-limit tests, and nothing else.
//!
//! The tests that check what a small hostile input can make a parser allocate (issue 25:
//! weight files, C8 checkpoints, codec blobs, replay traces) install [`Counting`] as their
//! test binary's global allocator and wrap one call in [`measure`], which returns the peak
//! of the bytes that call held at once and its largest single request. Counting is per
//! thread and only inside `measure`, so the test harness's own threads do not disturb it.
//! [`allocations`] counts every request (allocations and reallocations) a thread makes,
//! always, for the tests that check a steady state allocates nothing. It is a
//! dev-dependency only: no library crate links it.
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: kvc_test_alloc::Counting = kvc_test_alloc::Counting;
//! let (peak, largest) = kvc_test_alloc::measure(|| { let _ = parse(&input); });
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting what the current thread holds while [`measure`] runs.
pub struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static REQUESTS: Cell<u64> = const { Cell::new(0) };
}

fn request() {
    let _ = REQUESTS.try_with(|r| r.set(r.get() + 1));
}

fn grow(n: usize) {
    let _ = ON.try_with(|on| {
        if on.get() {
            let live = LIVE.with(|l| {
                l.set(l.get() + n as i64);
                l.get()
            });
            PEAK.with(|p| p.set(p.get().max(live)));
            LARGEST.with(|m| m.set(m.get().max(n)));
        }
    });
}

fn shrink(n: usize) {
    let _ = ON.try_with(|on| {
        if on.get() {
            LIVE.with(|l| l.set(l.get() - n as i64));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; the counters are
// const-initialised thread-local `Cell`s without destructors, so touching them never
// allocates or recurses.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        request();
        grow(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        request();
        grow(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrink(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        request();
        shrink(layout.size());
        grow(new_size);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns the peak of the bytes it held at once (allocated during the call
/// and not yet freed) and its largest single allocation. Meaningful only in a binary whose
/// global allocator is [`Counting`]; elsewhere both are 0.
pub fn measure(f: impl FnOnce()) -> (usize, usize) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    LARGEST.with(|m| m.set(0));
    ON.with(|on| on.set(true));
    f();
    ON.with(|on| on.set(false));
    (PEAK.with(Cell::get) as usize, LARGEST.with(Cell::get))
}

/// How many allocation requests (`alloc`, `alloc_zeroed`, `realloc`) the current thread
/// has made since it started, counted whether or not [`measure`] runs: take it before and
/// after a call to see whether the call allocated. Meaningful only in a binary whose global
/// allocator is [`Counting`]; elsewhere it stays 0.
pub fn allocations() -> u64 {
    REQUESTS.with(Cell::get)
}

/// Deterministic bytes (xorshift64) for the random inputs of those tests.
pub fn random_bytes(seed: u64, out: &mut [u8]) {
    let mut s = seed | 1;
    for b in out {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_bytes_are_deterministic_and_seed_dependent() {
        let (mut a, mut b, mut c) = ([0u8; 32], [0u8; 32], [0u8; 32]);
        super::random_bytes(7, &mut a);
        super::random_bytes(7, &mut b);
        super::random_bytes(8, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
