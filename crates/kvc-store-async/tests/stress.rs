//! Stress: 8 threads of mixed write / compress / poll / restore / evict / materialize
//! operations on one store over random data, with injected codec faults. Every restore
//! must be bit-exact, and at the end no range may be lost or held twice.
//!
//! It runs twice, with restored chunks released after each attention (the default) and
//! with MNN's decode cache. `KVC_STRESS_OPS` sets the operations per thread of both runs
//! together (default 12 500: 10^5 in all, half in each run).

mod common;

use std::sync::Arc;

use common::{quiet_injected_panics, Faults, FaultyCodec, Rng};
use kvc_cache::KvLayout;
use kvc_store_async::{ChunkStatus, ErrorKind, Store, StoreConfig};
use kvc_types::Dtype;
use parking_lot::Mutex;

const THREADS: usize = 8;
const LAYERS: usize = 12;
const CAP: usize = 512;
const ROW: usize = 2 * 8 * 2;

fn ops_per_thread() -> usize {
    std::env::var("KVC_STRESS_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12_500)
}

#[test]
fn eight_threads_mixed_operations_lose_nothing_evicting_after_attention() {
    stress(true);
}

#[test]
fn eight_threads_mixed_operations_lose_nothing_with_a_decode_cache() {
    stress(false);
}

fn stress(evict_after_attention: bool) {
    quiet_injected_panics();
    let layout = KvLayout::llama(Dtype::F16, 2, 8, 8, CAP, false).unwrap();
    let cfg = StoreConfig {
        hot_sink_tokens: 4,
        hot_recent_tokens: 16,
        bootstrap_tokens: 4,
        group_tokens: 12,
        async_threads: 3,
        queue_capacity: 8,
        layer_cache_capacity: 6,
        global_cache_capacity: 24,
        evict_after_attention,
        ..StoreConfig::default()
    };
    let codec = Arc::new(FaultyCodec::new(Faults {
        fail: 41,
        corrupt: 43,
        panic: 47,
    }));
    let store = Store::new(cfg, &vec![layout; LAYERS], codec).unwrap();
    // The reference: what every layer must read back, token-major K then V.
    let reference: Vec<Mutex<(Vec<u8>, Vec<u8>)>> = (0..LAYERS)
        .map(|_| Mutex::new((Vec::new(), Vec::new())))
        .collect();
    let ops = ops_per_thread().div_ceil(2);
    let restores = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (store, reference, restores) = (&store, &reference, &restores);
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                for _ in 0..ops {
                    let layer = rng.below(LAYERS);
                    match rng.below(100) {
                        // Append or overwrite tokens.
                        0..=34 => {
                            let mut r = reference[layer].lock();
                            let len = r.0.len() / ROW;
                            let count = 1 + rng.below(6);
                            let start = if rng.below(4) == 0 {
                                rng.below(len + 1)
                            } else {
                                len
                            };
                            if start + count > CAP {
                                continue;
                            }
                            let k = rng.f16_bytes(count * 16);
                            let v = rng.f16_bytes(count * 16);
                            match store.write_tokens(layer, start, &k, &v) {
                                Ok(()) => {
                                    let end = (start + count) * ROW;
                                    if r.0.len() < end {
                                        r.0.resize(end, 0);
                                        r.1.resize(end, 0);
                                    }
                                    r.0[start * ROW..end].copy_from_slice(&k);
                                    r.1[start * ROW..end].copy_from_slice(&v);
                                }
                                Err(e) => assert_eq!(e.kind(), ErrorKind::Busy, "{e}"),
                            }
                        }
                        // Compress what is cold.
                        35..=54 => {
                            store.schedule(layer).unwrap();
                        }
                        // Take in finished tasks (release verified raw ranges).
                        55..=69 => {
                            store.poll().unwrap();
                        }
                        // Restore and compare bit for bit.
                        70..=89 => {
                            let r = reference[layer].lock();
                            let len = r.0.len() / ROW;
                            let (k, v) = store.read_tokens(layer, 0, len).unwrap();
                            assert!(k == r.0 && v == r.1, "layer {layer} differs after restore");
                            restores.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        // Prefetch a layer (its chunks stay resident until its next read).
                        90..=92 => {
                            store.restore_layer(layer).unwrap();
                        }
                        // Evict decoded chunks (one layer or all).
                        93..=96 => {
                            let which = if rng.below(3) == 0 { None } else { Some(layer) };
                            store.evict_decoded(which).unwrap();
                        }
                        // Back to plain raw tokens.
                        _ => {
                            let _r = reference[layer].lock();
                            store.materialize(layer).unwrap();
                        }
                    }
                }
            });
        }
    });
    store.wait_idle().unwrap();
    let m = store.metrics().unwrap();
    assert_eq!(m.in_flight, 0);
    // Every task ended exactly once: stored, fallback, or abandoned by materialize.
    assert_eq!(
        m.chunks_submitted,
        m.chunks_stored + m.fallbacks + m.stale_results,
        "{m:?}"
    );
    assert_eq!(m.restore_failures, 0);
    // Prefetched chunks are hits in both runs.
    assert!(
        m.chunks_stored > 0 && m.restores > 0 && m.decode_cache_hits > 0,
        "{m:?}"
    );
    assert!(m.fallbacks > 0, "{m:?}");
    for (layer, r) in reference.iter().enumerate() {
        let r = r.lock();
        let len = r.0.len() / ROW;
        assert_eq!(store.len(layer).unwrap(), len);
        // No range held twice, none past the written length.
        let chunks = store.chunks(layer).unwrap();
        for w in chunks.windows(2) {
            assert!(w[0].start + w[0].count <= w[1].start, "overlap {w:?}");
        }
        assert!(chunks
            .iter()
            .all(|c| c.start + c.count <= len && c.status != ChunkStatus::InFlight));
        let (k, v) = store.read_tokens(layer, 0, len).unwrap();
        assert!(k == r.0 && v == r.1, "layer {layer} lost data");
    }
    eprintln!(
        "stress (evict after attention: {evict_after_attention}): {} threads x {ops} ops, {} restores checked; {m:?}",
        THREADS,
        restores.into_inner()
    );
}
