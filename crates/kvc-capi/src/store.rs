//! `kvc_store`: the asynchronous compressed KV store (`kvc-store-async`) behind an opaque
//! handle. The store owns its cache (llama-style layers, one per model layer); the engine
//! appends tokens, lets the store compress what became cold on its worker pool, and reads
//! tokens back (restored bit-exactly) before a layer's attention.
//!
//! The store is thread-safe: every call but `kvc_store_free` takes a `const kvc_store *`
//! and may run concurrently with any other call on the same handle, from any thread.

use std::sync::Arc;

use kvc_cache::KvLayout;
use kvc_codec::gear_v1::EncodeOptions;
use kvc_store_async::{
    GearV1Codec, GearV2Codec, Mode, Scope, Store, StoreCodec, StoreConfig, StoreMetrics,
};
use kvc_types::Dtype;

use crate::boundary::{
    check_disjoint, in_ref, in_slice, out_ref, out_slice, status_boundary, value_boundary,
};
use crate::convert::KvcDtype;
use crate::error::Error;
use crate::handle::{free_handle, handle_ref, store_handle};
use crate::status::KvcStatus;

/// `kvc_store_config.mode`: measure one layer per scope, never write back.
pub const KVC_STORE_MODE_PROBE: u32 = 0;
/// `kvc_store_config.mode`: compress, decode, verify, write back synchronously.
pub const KVC_STORE_MODE_FULL: u32 = 1;
/// `kvc_store_config.mode`: compress on the worker pool, release, restore on demand.
pub const KVC_STORE_MODE_STORE: u32 = 2;
/// `kvc_store_config.scope`: the first `front_n` layers, all tokens (MNN's 1).
pub const KVC_STORE_SCOPE_FRONT_N: u32 = 1;
/// `kvc_store_config.scope`: the H2O layers, the tokens they keep (MNN's 2).
pub const KVC_STORE_SCOPE_H2O_KEPT: u32 = 2;
/// `kvc_store_config.scope`: both (MNN's 3, recommended).
pub const KVC_STORE_SCOPE_BOTH: u32 = 3;
/// `kvc_store_config.codec`: gear-v1, the MNN format.
pub const KVC_STORE_CODEC_GEAR_V1: u32 = 0;
/// `kvc_store_config.codec`: gear-v2, kvc's own format.
pub const KVC_STORE_CODEC_GEAR_V2: u32 = 1;
/// `kvc_store_config.h2o_layer_end` meaning "the last layer".
pub const KVC_STORE_LAYER_END_LAST: i64 = -1;
/// `kvc_store_evict_decoded`'s `layer` meaning "every layer".
pub const KVC_STORE_ALL_LAYERS: i64 = -1;

/// Store settings. Fill it with `kvc_store_config_default` (defaults in brackets: MNN's
/// `h2o_lossless_*` settings, and restored chunks released after attention), then change
/// fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvcStoreConfig {
    /// `KVC_STORE_MODE_PROBE`, `_FULL` or `_STORE` (default store).
    pub mode: u32,
    /// `KVC_STORE_SCOPE_FRONT_N` (1), `_H2O_KEPT` (2) or `_BOTH` (3) (default 3).
    pub scope: u32,
    /// `KVC_STORE_CODEC_GEAR_V1` or `KVC_STORE_CODEC_GEAR_V2` [gear-v1].
    pub codec: u32,
    /// Layers below this are the front scope (default 2).
    pub front_n: u32,
    /// First H2O layer (default 2).
    pub h2o_layer_start: u32,
    /// Last H2O layer, inclusive, or `KVC_STORE_LAYER_END_LAST` (-1) [-1].
    pub h2o_layer_end: i64,
    /// Leading tokens never compressed (default 16).
    pub hot_sink_tokens: u32,
    /// Trailing tokens never compressed (default 256).
    pub hot_recent_tokens: u32,
    /// Tokens of the first cold chunk (default 16); 0 disables it.
    pub bootstrap_tokens: u32,
    /// Tokens of every later chunk (default 384); at least 1.
    pub group_tokens: u32,
    /// Worker threads (default 2); 1..=256 in store mode.
    pub async_threads: u32,
    /// Tasks queued before submissions are skipped (backpressure) (default 16); at least 1 in
    /// store mode.
    pub queue_capacity: u32,
    /// Restored chunks one layer keeps resident when not evicting after attention (default 64).
    pub layer_cache_capacity: u32,
    /// Restored chunks the model keeps resident when not evicting after attention (default 64).
    pub global_cache_capacity: u32,
    /// 1: check each restored chunk against the hash taken at compression (default 1).
    pub verify_restore: u32,
    /// 1: a read releases what it restored once it returns, so memory stays at the
    /// codec's saving (default 1); 0: MNN's decode cache (restored chunks stay resident, bounded
    /// by the two capacities above).
    pub evict_after_attention: u32,
}

impl From<&StoreConfig> for KvcStoreConfig {
    fn from(c: &StoreConfig) -> Self {
        let u = |x: usize| x.min(u32::MAX as usize) as u32;
        KvcStoreConfig {
            mode: match c.mode {
                Mode::Probe => KVC_STORE_MODE_PROBE,
                Mode::Full => KVC_STORE_MODE_FULL,
                Mode::Store => KVC_STORE_MODE_STORE,
            },
            scope: u32::from(c.scope.value()),
            codec: KVC_STORE_CODEC_GEAR_V1,
            front_n: u(c.front_n),
            h2o_layer_start: u(c.h2o_layer_start),
            h2o_layer_end: if c.h2o_layer_end == usize::MAX {
                KVC_STORE_LAYER_END_LAST
            } else {
                c.h2o_layer_end as i64
            },
            hot_sink_tokens: u(c.hot_sink_tokens),
            hot_recent_tokens: u(c.hot_recent_tokens),
            bootstrap_tokens: u(c.bootstrap_tokens),
            group_tokens: u(c.group_tokens),
            async_threads: u(c.async_threads),
            queue_capacity: u(c.queue_capacity),
            layer_cache_capacity: u(c.layer_cache_capacity),
            global_cache_capacity: u(c.global_cache_capacity),
            verify_restore: u32::from(c.verify_restore),
            evict_after_attention: u32::from(c.evict_after_attention),
        }
    }
}

impl KvcStoreConfig {
    /// The Rust config and codec (the store validates the values).
    fn to_config(self) -> Result<(StoreConfig, Arc<dyn StoreCodec>), Error> {
        let flag = |argument, v: u32| match v {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::invalid(argument, format!("{v} is neither 0 nor 1"))),
        };
        let mode = match self.mode {
            KVC_STORE_MODE_PROBE => Mode::Probe,
            KVC_STORE_MODE_FULL => Mode::Full,
            KVC_STORE_MODE_STORE => Mode::Store,
            m => {
                return Err(Error::invalid(
                    "config.mode",
                    format!("{m} is not one of KVC_STORE_MODE_PROBE (0), _FULL (1), _STORE (2)"),
                ))
            }
        };
        let scope = u8::try_from(self.scope)
            .ok()
            .and_then(Scope::from_value)
            .ok_or_else(|| {
                Error::invalid(
                    "config.scope",
                    format!(
                        "{} is not 1 (front_n), 2 (h2o_kept) or 3 (both)",
                        self.scope
                    ),
                )
            })?;
        let codec: Arc<dyn StoreCodec> = match self.codec {
            KVC_STORE_CODEC_GEAR_V1 => Arc::new(GearV1Codec::new(EncodeOptions::default())?),
            KVC_STORE_CODEC_GEAR_V2 => Arc::new(GearV2Codec::default()),
            c => {
                return Err(Error::invalid(
                    "config.codec",
                    format!("{c} is not KVC_STORE_CODEC_GEAR_V1 (0) or _GEAR_V2 (1)"),
                ))
            }
        };
        let h2o_layer_end = match self.h2o_layer_end {
            KVC_STORE_LAYER_END_LAST => usize::MAX,
            e => usize::try_from(e).map_err(|_| {
                Error::invalid(
                    "config.h2o_layer_end",
                    format!("{e} is neither a layer index nor -1 (the last layer)"),
                )
            })?,
        };
        let z = |x: u32| x as usize;
        let config = StoreConfig {
            mode,
            scope,
            front_n: z(self.front_n),
            h2o_layer_start: z(self.h2o_layer_start),
            h2o_layer_end,
            hot_sink_tokens: z(self.hot_sink_tokens),
            hot_recent_tokens: z(self.hot_recent_tokens),
            bootstrap_tokens: z(self.bootstrap_tokens),
            group_tokens: z(self.group_tokens),
            async_threads: z(self.async_threads),
            queue_capacity: z(self.queue_capacity),
            layer_cache_capacity: z(self.layer_cache_capacity),
            global_cache_capacity: z(self.global_cache_capacity),
            verify_restore: flag("config.verify_restore", self.verify_restore)?,
            evict_after_attention: flag(
                "config.evict_after_attention",
                self.evict_after_attention,
            )?,
        };
        config.validate()?;
        Ok((config, codec))
    }
}

/// One layer of the store's cache, llama.cpp style: K rows of `n_kv_heads * head_dim_k`
/// values per token; V the same, or transposed (`v_trans`: one row of `capacity` values
/// per channel).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcStoreLayer {
    /// `KVC_DTYPE_F16`, `_BF16`, `_F32` or `_I8`.
    pub dtype: KvcDtype,
    /// 0: V rows per token; 1: V transposed.
    pub v_trans: u32,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Values per K head.
    pub head_dim_k: usize,
    /// Values per V head.
    pub head_dim_v: usize,
    /// Tokens the layer holds at most.
    pub capacity: usize,
}

impl KvcStoreLayer {
    fn layout(&self, i: usize) -> Result<KvLayout, Error> {
        let dtype = Dtype::from_code(self.dtype).ok_or_else(|| {
            Error::invalid(
                "layers",
                format!("layer {i}: dtype {} is not a kvc_dtype", self.dtype),
            )
        })?;
        let v_trans = match self.v_trans {
            0 => false,
            1 => true,
            v => {
                return Err(Error::invalid(
                    "layers",
                    format!("layer {i}: v_trans {v} is neither 0 nor 1"),
                ))
            }
        };
        KvLayout::llama(
            dtype,
            self.n_kv_heads,
            self.head_dim_k,
            self.head_dim_v,
            self.capacity,
            v_trans,
        )
        .map_err(|e| Error::invalid("layers", format!("layer {i}: {e}")))
    }
}

/// What the store holds and did, whole model (every layer, K and V). Byte counts are
/// bytes; times are microseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvcStoreMetrics {
    /// Chunks handed to the worker pool.
    pub chunks_submitted: u64,
    /// Chunks released after verification (cumulative).
    pub chunks_stored: u64,
    /// Chunks held compressed now.
    pub chunks_held: u64,
    /// Chunks skipped because the queue was full.
    pub backpressure_skips: u64,
    /// Chunks left raw because something failed (encoder error, verification mismatch,
    /// a panicking task, bytes changed meanwhile).
    pub fallbacks: u64,
    /// Tasks queued or running now.
    pub in_flight: u64,
    /// The deepest the queue has been.
    pub queue_peak: u64,
    /// Raw bytes of the chunks held compressed.
    pub stored_raw_bytes: u64,
    /// Bytes of their blobs.
    pub blob_bytes: u64,
    /// Bytes of the store's bookkeeping.
    pub metadata_bytes: u64,
    /// Bytes that left memory when ranges were released (cumulative, `mincore`).
    pub released_bytes_total: u64,
    /// Bytes of the store's cache resident now (`mincore`).
    pub cache_resident_bytes: u64,
    /// Bytes the store's cache maps.
    pub cache_mapped_bytes: u64,
    /// Chunks restored (decoded).
    pub restores: u64,
    /// Restores that failed (a blob no longer decodes to its hash).
    pub restore_failures: u64,
    /// Restores served by a chunk still resident.
    pub decode_cache_hits: u64,
    /// Restores that decoded.
    pub decode_cache_misses: u64,
    /// Restored chunks resident now.
    pub decode_cache_resident: u64,
    /// Microseconds callers spent in `kvc_store_wait_idle`.
    pub async_wait_us: u64,
    /// Microseconds of compression work (all chunks).
    pub compress_us_total: u64,
    /// Microseconds of decode work (all restores).
    pub decomp_us_total: u64,
    /// `stored_raw_bytes / blob_bytes` (0 when nothing is held).
    pub lossless_ratio: f64,
    /// Median microseconds to restore one chunk of `group_tokens` tokens.
    pub restore_us_p50: f64,
    /// 99th percentile of the same.
    pub restore_us_p99: f64,
}

impl From<&StoreMetrics> for KvcStoreMetrics {
    fn from(m: &StoreMetrics) -> Self {
        KvcStoreMetrics {
            chunks_submitted: m.chunks_submitted,
            chunks_stored: m.chunks_stored,
            chunks_held: m.chunks_held,
            backpressure_skips: m.backpressure_skips,
            fallbacks: m.fallbacks,
            in_flight: m.in_flight,
            queue_peak: m.queue_peak,
            stored_raw_bytes: m.stored_raw_bytes,
            blob_bytes: m.blob_bytes,
            metadata_bytes: m.metadata_bytes,
            released_bytes_total: m.released_bytes_total,
            cache_resident_bytes: m.cache_resident_bytes,
            cache_mapped_bytes: m.cache_mapped_bytes,
            restores: m.restores,
            restore_failures: m.restore_failures,
            decode_cache_hits: m.decode_cache_hits,
            decode_cache_misses: m.decode_cache_misses,
            decode_cache_resident: m.decode_cache_resident,
            async_wait_us: m.async_wait_us,
            compress_us_total: m.compress_us_total,
            decomp_us_total: m.decomp_us_total,
            lossless_ratio: m.lossless_ratio,
            restore_us_p50: m.group_restore_us_p50,
            restore_us_p99: m.group_restore_us_p99,
        }
    }
}

/// A compressed KV store over its own cache: opaque; create with `kvc_store_new`, free
/// with `kvc_store_free`. Thread-safe (see the module's functions).
pub struct KvcStore {
    store: Store,
}

/// Writes the default store settings into `*out` (see `kvc_store_config`).
///
/// Ownership: `out` is caller-owned. Threads: safe from any thread.
///
/// # Safety
/// `out` must be NULL or point to a writable `kvc_store_config`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_config_default(out: *mut KvcStoreConfig) -> KvcStatus {
    status_boundary("kvc_store_config_default", || {
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = KvcStoreConfig::from(&StoreConfig::default());
        Ok(())
    })
}

/// Creates a store of `n_layers` layers (`layers[i]` describes layer `i`) with `config`
/// and stores it in `*out` (only on `KVC_OK`). Its cache is mapped at once and starts
/// its worker threads (store mode). An out-of-range setting, an unknown codec, dtype or
/// mode, `n_layers == 0`, or a layer whose size overflows: `KVC_INVALID_ARGUMENT`; the
/// mapping failing: `KVC_IO`.
///
/// Ownership: `config` and `layers` are only read; the caller owns the handle and frees
/// it with `kvc_store_free`. Threads: safe from any thread.
///
/// # Safety
/// `config` readable; `layers` readable for `n_layers` entries; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_new(
    config: *const KvcStoreConfig,
    layers: *const KvcStoreLayer,
    n_layers: usize,
    out: *mut *mut KvcStore,
) -> KvcStatus {
    status_boundary("kvc_store_new", || {
        // SAFETY: caller contract.
        let config = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        let layers = unsafe { in_slice(layers, n_layers, "layers") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        if layers.is_empty() {
            return Err(Error::invalid(
                "n_layers",
                "the store needs at least one layer",
            ));
        }
        let (config, codec) = config.to_config()?;
        let layouts = layers
            .iter()
            .enumerate()
            .map(|(i, l)| l.layout(i))
            .collect::<Result<Vec<_>, _>>()?;
        let store = Store::new(config, &layouts, codec)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, KvcStore { store }) }
    })
}

/// Appends tokens to layer `layer`: `k_bytes` bytes of K rows at `k` and `v_bytes` of V
/// rows at `v` (token-major, `n_kv_heads * head_dim` values per row, the layer's dtype,
/// the same number of tokens in both). `*new_len` receives the layer's token count.
/// A wrong layer, lengths that are not whole rows or disagree, or tokens past the
/// capacity: `KVC_INVALID_ARGUMENT` (nothing is written). Writing over tokens the store
/// holds is impossible by construction (appends go past the end).
///
/// Ownership: `k` and `v` are copied into the store. Threads: any call may run
/// concurrently; appends to one layer from two threads interleave in an unspecified
/// order.
///
/// # Safety
/// `store` live; `k`, `v` readable for their byte counts; `new_len` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_append_tokens(
    store: *const KvcStore,
    layer: usize,
    k: *const u8,
    k_bytes: usize,
    v: *const u8,
    v_bytes: usize,
    new_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_store_append_tokens", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        // SAFETY: caller contract.
        let k = unsafe { in_slice(k, k_bytes, "k") }?;
        // SAFETY: caller contract.
        let v = unsafe { in_slice(v, v_bytes, "v") }?;
        // SAFETY: caller contract.
        let new_len = unsafe { out_ref(new_len, "new_len") }?;
        *new_len = s.store.append_tokens(layer, k, v)?;
        Ok(())
    })
}

/// Compresses what became cold in layer `layer`: in store mode, every new cold chunk
/// is queued for the workers (never blocking; a full queue skips the chunk, counted);
/// in probe and full modes the work is done now. `*handled` receives the chunks queued
/// or processed. A layer out of range: `KVC_INVALID_ARGUMENT`.
///
/// Threads: any call may run concurrently (a chunk claimed by another thread is
/// skipped).
///
/// # Safety
/// `store` live; `handled` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_schedule(
    store: *const KvcStore,
    layer: usize,
    handled: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_store_schedule", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        // SAFETY: caller contract.
        let handled = unsafe { out_ref(handled, "handled") }?;
        *handled = s.store.schedule(layer)?;
        Ok(())
    })
}

/// Takes in every finished task without blocking: verified chunks release their raw
/// pages, failed ones stay raw (counted fallbacks). `*finished` receives the tasks
/// taken in.
///
/// Threads: any call may run concurrently.
///
/// # Safety
/// `store` live; `finished` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_poll(store: *const KvcStore, finished: *mut usize) -> KvcStatus {
    status_boundary("kvc_store_poll", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        // SAFETY: caller contract.
        let finished = unsafe { out_ref(finished, "finished") }?;
        *finished = s.store.poll()?;
        Ok(())
    })
}

/// Blocks until no task is in flight, taking in every result (the time is counted as
/// async wait).
///
/// Threads: any call may run concurrently; tasks queued meanwhile are waited for too.
///
/// # Safety
/// `store` live.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_wait_idle(store: *const KvcStore) -> KvcStatus {
    status_boundary("kvc_store_wait_idle", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        Ok(s.store.wait_idle()?)
    })
}

/// Copies tokens `[start, end)` of layer `layer` into `k_dst` and `v_dst` (token-major
/// rows, the layer's dtype), restoring stored chunks first (bit-exactly, K and V of
/// several chunks decoded in parallel). `*k_len` and `*v_len` receive the bytes needed;
/// if `k_capacity` or `v_capacity` is smaller, the call returns `KVC_BUFFER_TOO_SMALL`
/// and writes only the two lengths (pass NULL buffers with capacity 0 to ask for the
/// size). A layer or range out of bounds (`start > end`, `end` past the layer's
/// length): `KVC_INVALID_ARGUMENT`; a blob that no longer decodes to what was stored:
/// `KVC_CORRUPT_DATA` (its tokens were not read; the blob is kept).
///
/// With `evict_after_attention` (the default) the chunks this call restored are
/// released again before it returns.
///
/// Ownership: the buffers are caller-owned and must not overlap. Threads: any call may
/// run concurrently; reads of one layer are serialised inside the store.
///
/// # Safety
/// `store` live; `k_dst`, `v_dst` writable for their capacities; `k_len`, `v_len`
/// writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_store_read_tokens(
    store: *const KvcStore,
    layer: usize,
    start: usize,
    end: usize,
    k_dst: *mut u8,
    k_capacity: usize,
    v_dst: *mut u8,
    v_capacity: usize,
    k_len: *mut usize,
    v_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_store_read_tokens", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        check_disjoint(
            k_dst.cast_const(),
            k_capacity,
            v_dst.cast_const(),
            v_capacity,
            "v_dst",
        )?;
        // SAFETY: caller contract.
        let k_dst = unsafe { out_slice(k_dst, k_capacity, "k_dst") }?;
        // SAFETY: caller contract.
        let v_dst = unsafe { out_slice(v_dst, v_capacity, "v_dst") }?;
        // SAFETY: caller contract.
        let k_len = unsafe { out_ref(k_len, "k_len") }?;
        // SAFETY: caller contract.
        let v_len = unsafe { out_ref(v_len, "v_len") }?;
        let len = s.store.len(layer)?;
        if start > end || end > len {
            return Err(Error::invalid(
                "end",
                format!("tokens {start}..{end} are not within the layer's {len} tokens"),
            ));
        }
        let (kn, vn) = s.store.token_bytes(layer, start, end)?;
        if k_capacity < kn || v_capacity < vn {
            *k_len = kn;
            *v_len = vn;
            let (argument, needed, capacity) = if k_capacity < kn {
                ("k_dst", kn, k_capacity)
            } else {
                ("v_dst", vn, v_capacity)
            };
            return Err(Error::BufferTooSmall {
                argument,
                needed,
                capacity,
            });
        }
        s.store
            .read_tokens_into(layer, start, end, &mut k_dst[..kn], &mut v_dst[..vn])?;
        *k_len = kn;
        *v_len = vn;
        Ok(())
    })
}

/// Restores every stored chunk of layer `layer` ahead of its attention (a prefetch, for
/// example while the previous layer attends); the chunks stay resident until the
/// layer's next read or `kvc_store_evict_decoded`. `*decoded` receives the chunks
/// decoded, `*hits` those already resident. Errors as `kvc_store_read_tokens`.
///
/// Threads: any call may run concurrently.
///
/// # Safety
/// `store` live; `decoded`, `hits` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_restore_layer(
    store: *const KvcStore,
    layer: usize,
    decoded: *mut usize,
    hits: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_store_restore_layer", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        // SAFETY: caller contract.
        let decoded = unsafe { out_ref(decoded, "decoded") }?;
        // SAFETY: caller contract.
        let hits = unsafe { out_ref(hits, "hits") }?;
        let r = s.store.restore_layer(layer)?;
        *decoded = r.decoded;
        *hits = r.hits;
        Ok(())
    })
}

/// Releases the restored chunks of layer `layer` (or of every layer with
/// `KVC_STORE_ALL_LAYERS`): their raw pages go back to the OS. `*released` receives the
/// chunks released. Any other negative layer, or one out of range:
/// `KVC_INVALID_ARGUMENT`.
///
/// Threads: any call may run concurrently.
///
/// # Safety
/// `store` live; `released` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_evict_decoded(
    store: *const KvcStore,
    layer: i64,
    released: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_store_evict_decoded", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        // SAFETY: caller contract.
        let released = unsafe { out_ref(released, "released") }?;
        let which = match layer {
            KVC_STORE_ALL_LAYERS => None,
            l => Some(usize::try_from(l).map_err(|_| {
                Error::invalid(
                    "layer",
                    format!("{l} is neither a layer nor KVC_STORE_ALL_LAYERS (-1)"),
                )
            })?),
        };
        *released = s.store.evict_decoded(which)?;
        Ok(())
    })
}

/// The store's whole-model metrics now in `*out` (resident bytes measured with
/// `mincore`).
///
/// Threads: any call may run concurrently.
///
/// # Safety
/// `store` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_store_get_metrics(
    store: *const KvcStore,
    out: *mut KvcStoreMetrics,
) -> KvcStatus {
    status_boundary("kvc_store_get_metrics", || {
        // SAFETY: caller contract.
        let s = unsafe { handle_ref(store, "store") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out, "out") }?;
        *out = KvcStoreMetrics::from(&s.store.metrics()?);
        Ok(())
    })
}

/// Frees a store: joins its workers (results still queued are discarded) and unmaps its
/// cache; NULL is a no-op.
///
/// Ownership: the handle is invalid afterwards. Threads: no other call may be using it.
///
/// # Safety
/// `store` must be NULL or a live handle from `kvc_store_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_store_free(store: *mut KvcStore) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(store) })
}
