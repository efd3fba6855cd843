//! What a small trace can make `kvc h2o replay` allocate (issue 25): a config and trace of
//! about 100 bytes, whatever lengths and head counts they claim, make the parser and
//! replay hold at most [`MAX_BYTES_PER_INPUT_BYTE`] times their size at once, plus
//! [`FIXED_BYTES`], plus [`MAX_BYTES_PER_LAYER`] for each layer up to the highest one the
//! trace names: the policy keeps a state per layer, and layer indices are capped at
//! `trace::MAX_LAYERS` (65536), so a trace can make it hold at most 32 MiB. Compiles the
//! command's own trace.rs, as the fuzz target does.

#[allow(dead_code)]
#[path = "../src/cmd/h2o/trace.rs"]
mod trace;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The stated bound: bytes held at once per input byte...
const MAX_BYTES_PER_INPUT_BYTE: usize = 16;
/// ...plus this much for any call (the policy's fixed state, messages).
const FIXED_BYTES: usize = 4 * 1024;
/// ...plus this much per layer up to the highest one named.
const MAX_BYTES_PER_LAYER: usize = 512;

// A global allocator that counts, per thread and only while `measure` runs, the bytes
// live above the starting point (their peak) and the largest single request.
struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
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
        grow(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
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
        shrink(layout.size());
        grow(new_size);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` and returns the peak of the bytes it held at once (allocated during the call
/// and not yet freed) and its largest single allocation.
fn measure(f: impl FnOnce()) -> (usize, usize) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    LARGEST.with(|m| m.set(0));
    ON.with(|on| on.set(true));
    f();
    ON.with(|on| on.set(false));
    (PEAK.with(Cell::get) as usize, LARGEST.with(Cell::get))
}

/// xorshift64: deterministic bytes for the random inputs.
fn random_bytes(seed: u64, out: &mut [u8]) {
    let mut s = seed | 1;
    for b in out {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
}

#[test]
fn a_100_byte_trace_allocates_little() {
    let mut cases: Vec<(Option<String>, String)> = vec![
        (None, r#"{"layer": 65535, "kv_len": 1, "n_heads": 1, "n_queries": 1, "block_acc": [1]}"#.into()),
        (None, r#"{"layer": 0, "kv_len": 18446744073709551615, "n_heads": 1, "n_queries": 1, "block_acc": []}"#.into()),
        (None, r#"{"layer": 0, "kv_len": 64, "n_heads": 18446744073709551615, "n_queries": 18446744073709551615, "block_acc": [1]}"#.into()),
        (Some(r#"{"h2o_block_tokens": 1, "h2o_recent_tokens": 4294967295}"#.into()),
         r#"{"layer": 3, "kv_len": 3, "n_heads": 1, "n_queries": 9, "block_acc": [1, 2, 3]}"#.into()),
        (Some(r#"{"h2o_block_tokens": 4294967295, "h2o_layer_end": 4294967295}"#.into()),
         r#"{"layer": 9, "kv_len": 4294967295, "n_heads": 1, "n_queries": 1, "block_acc": [1]}"#.into()),
        (None, "[".repeat(100)),
        (None, format!(r#"{{"layer": 1{}}}"#, "0".repeat(80))),
    ];
    // Random lines made of the trace's own keys and numbers.
    for seed in 0..300u64 {
        let mut r = [0u8; 8];
        random_bytes(seed, &mut r);
        let n =
            |i: usize| [0u64, 1, 4, 63, 64, 65535, u32::MAX as u64, u64::MAX][r[i] as usize % 8];
        cases.push((
            None,
            format!(
                r#"{{"layer": {}, "kv_len": {}, "n_heads": {}, "n_queries": {}, "block_acc": [1]}}"#,
                n(0) % 65536,
                n(1),
                n(2),
                n(3)
            ),
        ));
    }
    let mut worst = 0;
    for (config, text) in &cases {
        let input = config.as_ref().map_or(0, String::len) + text.len();
        let (peak, largest) = measure(|| {
            if let Ok(c) = trace::parse_config(config.as_deref()) {
                let _ = trace::replay(c, "t.jsonl", text);
            }
        });
        worst = worst.max(peak);
        let layers = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v["layer"].as_u64())
            .filter(|&l| l < trace::MAX_LAYERS as u64)
            .map_or(0, |l| l as usize + 1);
        let bound = MAX_BYTES_PER_INPUT_BYTE * input + FIXED_BYTES + MAX_BYTES_PER_LAYER * layers;
        assert!(
            peak <= bound && largest <= bound,
            "{input} bytes of config and trace held {peak} bytes at once (largest \
             allocation {largest}), bound {bound}: {config:?} {text}"
        );
    }
    assert!(worst > 0);
    eprintln!("h2o replay: at most {worst} bytes held for ~100-byte traces");
}
