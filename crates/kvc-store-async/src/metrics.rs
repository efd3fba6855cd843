//! The store's counters and the whole-model report built from them (spec 5.4).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

/// Monotonic counters, updated by every thread without locks.
#[derive(Default)]
pub(crate) struct Counters {
    pub submitted: AtomicU64,
    pub stored: AtomicU64,
    pub backpressure_skips: AtomicU64,
    pub fallback_encode: AtomicU64,
    pub fallback_verify: AtomicU64,
    pub fallback_panic: AtomicU64,
    pub fallback_raw_changed: AtomicU64,
    pub stale: AtomicU64,
    pub compressed_raw_bytes: AtomicU64,
    pub compressed_blob_bytes: AtomicU64,
    pub compress_us: AtomicU64,
    pub verified_sync: AtomicU64,
    pub restores: AtomicU64,
    pub restore_failures: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub decomp_us: AtomicU64,
    pub async_wait_us: AtomicU64,
    pub released_bytes: AtomicU64,
    /// (tokens of the chunk, microseconds) of every restore, up to 2^22 of them.
    pub restore_us: Mutex<Vec<(u32, u32)>>,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    pub(crate) fn restore_sample(&self, tokens: usize, us: u64) {
        let mut v = self.restore_us.lock();
        if v.len() < 1 << 22 {
            let c = |x: u64| x.min(u64::from(u32::MAX)) as u32;
            v.push((c(tokens as u64), c(us)));
        }
    }
}

/// A whole-model snapshot of the store: what it holds, what it did, how long it took.
/// Byte counts are summed over every layer, K and V.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreMetrics {
    /// The codec's name.
    pub codec: String,
    /// probe / full / store.
    pub mode: &'static str,
    /// Chunks handed to the worker pool.
    pub chunks_submitted: u64,
    /// Chunks whose raw range was released after verification (cumulative).
    pub chunks_stored: u64,
    /// Chunks held compressed now.
    pub chunks_held: u64,
    /// Chunks compressed, decoded and verified synchronously (probe and full modes).
    pub chunks_verified_sync: u64,
    /// Chunks not submitted because the queue was full.
    pub backpressure_skips: u64,
    /// Chunks that stayed raw because something failed (sum of the four below).
    pub fallbacks: u64,
    /// ... because the codec returned an error.
    pub fallback_encode_errors: u64,
    /// ... because the decoded blob differed from the raw bytes.
    pub fallback_verify_mismatches: u64,
    /// ... because the task panicked.
    pub fallback_panics: u64,
    /// ... because the cache's bytes changed while the task ran.
    pub fallback_raw_changed: u64,
    /// Results discarded because their chunk was dropped meanwhile.
    pub stale_results: u64,
    /// Tasks queued or running now.
    pub in_flight: u64,
    /// The deepest the queue has been.
    pub queue_peak: u64,
    /// Raw bytes of the chunks held compressed now.
    pub stored_raw_bytes: u64,
    /// Bytes of their blobs (allocated).
    pub blob_bytes: u64,
    /// Bytes of the store's bookkeeping for them (chunk records, LRU entries).
    pub metadata_bytes: u64,
    /// Raw copies held by tasks in flight.
    pub in_flight_bytes: u64,
    /// `stored_raw_bytes / blob_bytes`: the codec's ratio on what is held, whole model.
    pub lossless_ratio: f64,
    /// Raw / blob bytes over everything ever compressed (all modes).
    pub compressed_ratio_total: f64,
    /// Microseconds spent compressing and verifying, all chunks.
    pub compress_us_total: u64,
    /// Chunks decoded back into the cache (decode-cache misses that succeeded).
    pub restores: u64,
    /// Restores that failed (blob no longer decodes to its hash).
    pub restore_failures: u64,
    /// Restores served by a chunk still resident in the decode cache.
    pub decode_cache_hits: u64,
    /// Restores that had to decode.
    pub decode_cache_misses: u64,
    /// Restored chunks resident now.
    pub decode_cache_resident: u64,
    /// Microseconds spent decoding restores, all chunks (the spec's decomp us).
    pub decomp_us_total: u64,
    /// Median microseconds to restore one chunk, any size (decode K and V, check, write
    /// back), from the start of its first tensor's decode to the end of its write-back.
    pub restore_us_p50: f64,
    /// 99th percentile of the same.
    pub restore_us_p99: f64,
    /// Largest of the same.
    pub restore_us_max: f64,
    /// Restores of chunks of `group_tokens` tokens (the bootstrap chunk is smaller).
    pub group_restores: u64,
    /// Median microseconds to restore one chunk of `group_tokens` tokens.
    pub group_restore_us_p50: f64,
    /// 99th percentile of the same.
    pub group_restore_us_p99: f64,
    /// Microseconds callers spent in `wait_idle`.
    pub async_wait_us: u64,
    /// Bytes that left memory when the store released ranges (cumulative, measured with
    /// `mincore` before and after each release).
    pub released_bytes_total: u64,
    /// Bytes the store's cache maps.
    pub cache_mapped_bytes: u64,
    /// Bytes of the store's cache resident now (`mincore`).
    pub cache_resident_bytes: u64,
}

/// The `p`-quantile (0..=1) of `v`, nearest rank; 0 when empty.
pub(crate) fn quantile(v: &mut [u32], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    f64::from(v[i])
}
