//! `kvc_tiers`: shared KV tiers (`kvc-store-tiers`) behind an opaque handle. Content-
//! addressed prefix chunks in memory, in a disk directory and in Redis (standalone or
//! Cluster); an engine stores a prefix's KV after prefill and a second engine instance
//! looks it up and restores it. Every tier failure is a counted fallback, never an error
//! of `lookup`/`restore`/`store` and never a wrong restore.
//!
//! The handle is thread-safe: every call but `kvc_tiers_free` takes a
//! `const kvc_tiers *` and may run concurrently with any other call on the same handle.

use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::time::Duration;

use kvc_store_tiers::{
    ChunkCodec, ChunkShape, DiskTier, MemoryTier, RedisConfig, RedisTier, Tier, Tiers, TiersConfig,
    TiersMetrics,
};
use kvc_types::Dtype;

use crate::boundary::{
    check_disjoint, in_ref, in_slice, out_ref, out_slice, status_boundary, value_boundary,
};
use crate::convert::{KvcDtype, KVC_DTYPE_F16};
use crate::error::Error;
use crate::handle::{free_handle, handle_ref, store_handle};
use crate::status::KvcStatus;

/// `kvc_tiers_config.codec`: the cache's bytes as they are.
pub const KVC_TIERS_CODEC_RAW: u32 = 0;
/// `kvc_tiers_config.codec`: gear-v1 (lossless).
pub const KVC_TIERS_CODEC_GEAR_V1: u32 = 1;
/// `kvc_tiers_config.codec`: gear-v2 (lossless).
pub const KVC_TIERS_CODEC_GEAR_V2: u32 = 2;
/// `kvc_tiers_config.codec`: kvq, 4-bit K and V rows (lossy: a restore approximates the
/// stored KV, about f16/3.7 on the wire; head_dim 64, 128 or 256). (ABI 0.8)
pub const KVC_TIERS_CODEC_KVQ_K4V4: u32 = 3;
/// `kvc_tiers_config.codec`: kvq, 8-bit K and 4-bit V rows (lossy). (ABI 0.8)
pub const KVC_TIERS_CODEC_KVQ_K8V4: u32 = 4;
/// `kvc_tiers_config.codec`: kvq, 4-bit K and 2-bit V rows (lossy). (ABI 0.8)
pub const KVC_TIERS_CODEC_KVQ_K4V2: u32 = 5;
/// `kvc_tiers_config.codec`: the transform coder `tc-<bound>` (lossy; about f16/4 to f16/8
/// on SmolLM2-135M by target): only through `kvc_tiers_new_tc`, which names the target and
/// the calibration file. (ABI 0.13)
pub const KVC_TIERS_CODEC_TC: u32 = 6;
/// Index of the memory tier in `kvc_tiers_metrics.tiers`.
pub const KVC_TIERS_MEMORY: usize = 0;
/// Index of the disk tier in `kvc_tiers_metrics.tiers`.
pub const KVC_TIERS_DISK: usize = 1;
/// Index of the Redis tier in `kvc_tiers_metrics.tiers`.
pub const KVC_TIERS_REDIS: usize = 2;

/// Tiers settings. Fill it with `kvc_tiers_config_default` (defaults in brackets), then
/// set the model's layout and hash and the tiers wanted. The strings are only read
/// during `kvc_tiers_new`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvcTiersConfig {
    /// `KVC_DTYPE_F16`, `_BF16` or `_F32` [f16].
    pub dtype: KvcDtype,
    /// `KVC_TIERS_CODEC_RAW`, `_GEAR_V1`, `_GEAR_V2` (lossless), `_KVQ_K4V4`, `_KVQ_K8V4`
    /// or `_KVQ_K4V2` (lossy) [gear-v2].
    pub codec: u32,
    /// Layers [0: must be set].
    pub n_layer: usize,
    /// KV heads per layer [0: must be set].
    pub n_kv_head: usize,
    /// Values per head [0: must be set].
    pub head_dim: usize,
    /// Tokens per chunk (default 256).
    pub chunk_tokens: usize,
    /// BLAKE3 of the model file (`kvc_tiers_hash_model_file`) (default zeros).
    pub model_hash: [u8; 32],
    /// Byte budget of the in-process memory tier; 0: no memory tier [256 MiB].
    pub memory_budget_bytes: u64,
    /// Directory of the disk tier (NUL-terminated); NULL: no disk tier (default NULL).
    pub disk_dir: *const c_char,
    /// Byte budget of the disk tier [1 GiB].
    pub disk_budget_bytes: u64,
    /// `redis://host:port` or `redis+cluster://host:port,host:port,...`; NULL: no Redis
    /// tier (default NULL).
    pub redis_url: *const c_char,
    /// Expiry of values stored in Redis in seconds; 0: none (Redis's maxmemory LRU
    /// evicts) (default 0).
    pub redis_ttl_s: u32,
    /// Redis connect and command timeout in milliseconds (default 1000).
    pub redis_timeout_ms: u32,
}

impl Default for KvcTiersConfig {
    fn default() -> Self {
        KvcTiersConfig {
            dtype: KVC_DTYPE_F16,
            codec: KVC_TIERS_CODEC_GEAR_V2,
            n_layer: 0,
            n_kv_head: 0,
            head_dim: 0,
            chunk_tokens: 256,
            model_hash: [0; 32],
            memory_budget_bytes: 256 << 20,
            disk_dir: std::ptr::null(),
            disk_budget_bytes: 1 << 30,
            redis_url: std::ptr::null(),
            redis_ttl_s: 0,
            redis_timeout_ms: 1000,
        }
    }
}

/// Counters of one tier.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcTierMetrics {
    /// 1 when the tier is configured.
    pub present: u32,
    /// Chunks read from it that passed validation.
    pub hits: u64,
    /// Chunks asked of it that it did not hold.
    pub misses: u64,
    /// Failed operations (server down, timeout, I/O error).
    pub errors: u64,
    /// Blobs that failed the checksum or format checks (removed).
    pub corrupt: u64,
    /// Valid blobs of another key or model (removed).
    pub foreign: u64,
    /// Chunks written (stores and promotions).
    pub chunks_written: u64,
    /// Blob bytes written.
    pub bytes_written: u64,
    /// Blob bytes read.
    pub bytes_read: u64,
    /// Blobs held (memory and disk; 0 for Redis).
    pub entries: u64,
    /// Bytes held (memory and disk; 0 for Redis).
    pub bytes: u64,
    /// Blobs evicted for the byte budget.
    pub evictions: u64,
}

/// What a `kvc_tiers` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcTiersMetrics {
    /// `kvc_tiers_lookup` calls.
    pub lookups: u64,
    /// `kvc_tiers_restore` calls.
    pub restores: u64,
    /// Chunks restored.
    pub chunks_restored: u64,
    /// Chunks encoded by stores.
    pub chunks_encoded: u64,
    /// Their uncompressed bytes.
    pub raw_bytes_encoded: u64,
    /// Their blob bytes.
    pub blob_bytes_encoded: u64,
    /// Chunks copied from a lower tier into the tiers above.
    pub promotions: u64,
    /// Every failure that became a miss: the sum of the tiers' errors, corrupt, foreign.
    pub fallbacks: u64,
    /// Indexed by `KVC_TIERS_MEMORY`, `_DISK`, `_REDIS`.
    pub tiers: [KvcTierMetrics; 3],
}

/// What a `kvc_tiers_store` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcTiersStoreReport {
    /// Full chunks the tokens and KV cover.
    pub chunks: usize,
    /// Chunks encoded (the others every tier already held).
    pub chunks_encoded: usize,
    /// Blob bytes of the encoded chunks.
    pub bytes_stored: u64,
    /// Their bytes in the cache's dtype.
    pub bytes_raw: u64,
    /// Tier writes that failed (counted in the metrics as errors).
    pub failures: usize,
}

/// Shared KV tiers: opaque; create with `kvc_tiers_new`, free with `kvc_tiers_free`.
pub struct KvcTiers {
    tiers: Tiers,
    /// Which of memory, disk, Redis are configured, and their index in `tiers`.
    slots: [Option<usize>; 3],
}

/// A NUL-terminated UTF-8 string, or `None` for NULL.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
unsafe fn opt_str(p: *const c_char, argument: &'static str) -> Result<Option<String>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated (contract).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| Error::invalid(argument, "is not valid UTF-8"))
}

/// Writes the default tiers settings into `*out` (see `kvc_tiers_config`).
///
/// Ownership: `out` is caller-owned. Threads: safe from any thread.
///
/// # Safety
/// `out` must be NULL or point to a writable `kvc_tiers_config`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_config_default(out: *mut KvcTiersConfig) -> KvcStatus {
    status_boundary("kvc_tiers_config_default", || {
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = KvcTiersConfig::default();
        Ok(())
    })
}

/// Hashes the model file at `path` (NUL-terminated) with BLAKE3 into `out_hash`
/// (32 bytes), for `kvc_tiers_config.model_hash`. An unreadable file: `KVC_IO`.
///
/// Ownership: both caller-owned. Threads: safe from any thread.
///
/// # Safety
/// `path` NUL-terminated; `out_hash` writable for 32 bytes.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_hash_model_file(
    path: *const c_char,
    out_hash: *mut u8,
) -> KvcStatus {
    status_boundary("kvc_tiers_hash_model_file", || {
        // SAFETY: caller contract (NULL checked first).
        unsafe { in_ref(path, "path") }?;
        // SAFETY: non-NULL and NUL-terminated (contract).
        let path = unsafe { opt_str(path, "path") }?.unwrap_or_default();
        // SAFETY: caller contract.
        let out = unsafe { out_slice(out_hash, 32, "out_hash") }?;
        let h = kvc_store_tiers::hash_model_file(std::path::Path::new(&path))?;
        out.copy_from_slice(&h);
        Ok(())
    })
}

/// Creates tiers with `config` and stores them in `*out` (only on `KVC_OK`). At least
/// one tier (memory, disk or Redis) must be configured. A bad layout, codec or dtype,
/// a Redis URL that does not parse, no tier: `KVC_INVALID_ARGUMENT`; a disk directory
/// that cannot be created or listed: `KVC_IO`. A Redis server that is down is not an
/// error: it is a miss (counted) until it answers.
///
/// Ownership: `config` and its strings are only read; the caller owns the handle and
/// frees it with `kvc_tiers_free`. Threads: safe from any thread.
///
/// # Safety
/// `config` readable, its strings NULL or NUL-terminated; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_new(
    config: *const KvcTiersConfig,
    out: *mut *mut KvcTiers,
) -> KvcStatus {
    status_boundary("kvc_tiers_new", || {
        // SAFETY: caller contract.
        let c = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        // SAFETY: caller contract (config's strings).
        let t = unsafe { new_tiers(c, None) }?;
        // SAFETY: checked above.
        unsafe { store_handle(out, t) }
    })
}

/// Creates tiers whose chunks the transform coder codes, as `kvc_tiers_new` does
/// otherwise: `config->codec` must be `KVC_TIERS_CODEC_TC`, `codec_name` the target
/// (`"tc-<bound>"`, e.g. `"tc-0.008"`) and `calibration_path` the model's calibration file
/// (`kvc tc calibrate`); the storing and every restoring process load the same file, whose
/// fingerprint is part of every key. An unreadable file: `KVC_IO`; a damaged one, a target
/// it lacks, or a calibration for another layout: `KVC_INVALID_ARGUMENT`. (ABI 0.13)
///
/// Ownership: all arguments are only read; the caller owns the handle and frees it with
/// `kvc_tiers_free`. Threads: safe from any thread.
///
/// # Safety
/// As `kvc_tiers_new`; `codec_name` and `calibration_path` NUL-terminated.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_new_tc(
    config: *const KvcTiersConfig,
    codec_name: *const c_char,
    calibration_path: *const c_char,
    out: *mut *mut KvcTiers,
) -> KvcStatus {
    status_boundary("kvc_tiers_new_tc", || {
        // SAFETY: caller contract.
        let c = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        unsafe { in_ref(codec_name, "codec_name") }?;
        // SAFETY: caller contract.
        unsafe { in_ref(calibration_path, "calibration_path") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        // SAFETY: non-NULL, NUL-terminated (contract).
        let name = unsafe { opt_str(codec_name, "codec_name") }?.unwrap_or_default();
        // SAFETY: non-NULL, NUL-terminated (contract).
        let path = unsafe { opt_str(calibration_path, "calibration_path") }?.unwrap_or_default();
        if c.codec != KVC_TIERS_CODEC_TC {
            return Err(Error::invalid(
                "config.codec",
                format!(
                    "{} with kvc_tiers_new_tc: must be KVC_TIERS_CODEC_TC (6)",
                    c.codec
                ),
            ));
        }
        let tc = kvc_store_tiers::load_transform(std::path::Path::new(&path), &name)?;
        // SAFETY: caller contract (config's strings).
        let t = unsafe { new_tiers(c, Some(tc)) }?;
        // SAFETY: checked above.
        unsafe { store_handle(out, t) }
    })
}

/// The tiers `c` describes, coded by `tc` when given (then `c.codec` is
/// `KVC_TIERS_CODEC_TC`).
///
/// # Safety
/// `c`'s strings NULL or NUL-terminated.
unsafe fn new_tiers(
    c: &KvcTiersConfig,
    tc: Option<std::sync::Arc<kvc_store_tiers::TransformCodec>>,
) -> Result<KvcTiers, Error> {
    let dtype = Dtype::from_code(c.dtype)
        .filter(|d| d.is_float())
        .ok_or_else(|| {
            Error::invalid(
                "config.dtype",
                format!("{} is not KVC_DTYPE_F16, _BF16 or _F32", c.dtype),
            )
        })?;
    let codec = match c.codec {
        KVC_TIERS_CODEC_RAW => ChunkCodec::Raw,
        KVC_TIERS_CODEC_GEAR_V1 => ChunkCodec::GearV1,
        KVC_TIERS_CODEC_GEAR_V2 => ChunkCodec::GearV2,
        KVC_TIERS_CODEC_KVQ_K4V4 => ChunkCodec::KvqK4V4,
        KVC_TIERS_CODEC_KVQ_K8V4 => ChunkCodec::KvqK8V4,
        KVC_TIERS_CODEC_KVQ_K4V2 => ChunkCodec::KvqK4V2,
        KVC_TIERS_CODEC_TC if tc.is_some() => ChunkCodec::Transform,
        KVC_TIERS_CODEC_TC => {
            return Err(Error::invalid(
                "config.codec",
                "KVC_TIERS_CODEC_TC needs its target and calibration: use kvc_tiers_new_tc",
            ))
        }
        x => {
            return Err(Error::invalid(
                "config.codec",
                format!(
                    "{x} is not KVC_TIERS_CODEC_RAW (0), _GEAR_V1 (1), _GEAR_V2 (2), \
                     _KVQ_K4V4 (3), _KVQ_K8V4 (4) or _KVQ_K4V2 (5)"
                ),
            ))
        }
    };
    // SAFETY: caller contract.
    let disk_dir = unsafe { opt_str(c.disk_dir, "config.disk_dir") }?;
    // SAFETY: caller contract.
    let redis_url = unsafe { opt_str(c.redis_url, "config.redis_url") }?;
    let mut list: Vec<Box<dyn Tier>> = Vec::new();
    let mut slots = [None; 3];
    if c.memory_budget_bytes > 0 {
        slots[KVC_TIERS_MEMORY] = Some(list.len());
        list.push(Box::new(MemoryTier::new(c.memory_budget_bytes)));
    }
    if let Some(dir) = disk_dir {
        slots[KVC_TIERS_DISK] = Some(list.len());
        list.push(Box::new(DiskTier::open(dir, c.disk_budget_bytes)?));
    }
    if let Some(url) = redis_url {
        if c.redis_timeout_ms == 0 {
            return Err(Error::invalid(
                "config.redis_timeout_ms",
                "must be at least 1",
            ));
        }
        let mut rc = RedisConfig::new(url);
        rc.ttl = (c.redis_ttl_s > 0).then(|| Duration::from_secs(c.redis_ttl_s.into()));
        rc.connect_timeout = Duration::from_millis(c.redis_timeout_ms.into());
        rc.io_timeout = rc.connect_timeout;
        slots[KVC_TIERS_REDIS] = Some(list.len());
        list.push(Box::new(RedisTier::new(rc)?));
    }
    let cfg = TiersConfig {
        shape: ChunkShape {
            n_layer: c.n_layer,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            dtype,
            chunk_tokens: c.chunk_tokens,
        },
        codec,
        model_hash: c.model_hash,
    };
    let tiers = match tc {
        None => Tiers::new(cfg, list)?,
        Some(tc) => Tiers::with_transform(cfg, tc, list)?,
    };
    Ok(KvcTiers { tiers, slots })
}

/// Stores in `*out_tokens` the tokens of the longest prefix of `tokens` (`n_tokens` token
/// ids) whose chunks some tier holds: a multiple of the chunk size, 0 when none. A hint:
/// `kvc_tiers_restore` validates and may restore fewer.
///
/// Ownership: all caller-owned. Threads: safe, concurrently on one handle.
///
/// # Safety
/// `tiers` live; `tokens` readable for `n_tokens`; `out_tokens` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_lookup(
    tiers: *const KvcTiers,
    tokens: *const u32,
    n_tokens: usize,
    out_tokens: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_tiers_lookup", || {
        // SAFETY: caller contract.
        let t = unsafe { handle_ref(tiers, "tiers") }?;
        // SAFETY: caller contract.
        let tokens = unsafe { in_slice(tokens, n_tokens, "tokens") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out_tokens, "out_tokens") }?;
        *out = t.tiers.lookup(tokens);
        Ok(())
    })
}

fn kv_bytes(t: &Tiers, kv_tokens: usize) -> Result<usize, Error> {
    let s = t.shape();
    s.n_layer
        .checked_mul(kv_tokens)
        .and_then(|x| x.checked_mul(s.row_bytes()))
        .ok_or_else(|| Error::invalid("kv_tokens", format!("{kv_tokens} overflows")))
}

/// Restores the longest valid cached prefix of `tokens` into `k` and `v`, each
/// `[n_layer][kv_tokens][n_kv_head][head_dim]` in the config's dtype (`k_len`/`v_len`
/// bytes, at least `n_layer * kv_tokens * row`), tokens `[0, *out_tokens)` of every
/// layer; stores the tokens restored (a multiple of the chunk size, at most `kv_tokens`)
/// in `*out_tokens`. Chunks are decoded as they arrive, in parallel, straight into their
/// place in `k` and `v`, before the restore knows where the valid prefix ends: the bytes
/// of tokens from `*out_tokens` up to the last full chunk of the first `min(n_tokens,
/// kv_tokens)` tokens are unspecified (a chunk after a miss, or one whose blob passed its
/// checksum but failed to decode, may have been written); bytes past that are untouched.
/// The engine prefills from `*out_tokens` on, which overwrites them. Nothing found or
/// every tier failing is `KVC_OK` with 0 tokens (failures are counted in the metrics).
/// Buffers too small:
/// `KVC_BUFFER_TOO_SMALL`, with nothing written.
///
/// Ownership: all caller-owned. Threads: safe, concurrently on one handle.
///
/// # Safety
/// `tiers` live; `tokens` readable for `n_tokens`; `k`/`v` writable for `k_len`/`v_len`
/// bytes and not overlapping; `out_tokens` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_tiers_restore(
    tiers: *const KvcTiers,
    tokens: *const u32,
    n_tokens: usize,
    kv_tokens: usize,
    k: *mut c_void,
    k_len: usize,
    v: *mut c_void,
    v_len: usize,
    out_tokens: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_tiers_restore", || {
        // SAFETY: caller contract.
        let t = unsafe { handle_ref(tiers, "tiers") }?;
        // SAFETY: caller contract.
        let tokens = unsafe { in_slice(tokens, n_tokens, "tokens") }?;
        check_disjoint(k.cast::<u8>(), k_len, v.cast::<u8>(), v_len, "v")?;
        // SAFETY: caller contract.
        let k = unsafe { out_slice(k.cast::<u8>(), k_len, "k") }?;
        // SAFETY: caller contract.
        let v = unsafe { out_slice(v.cast::<u8>(), v_len, "v") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out_tokens, "out_tokens") }?;
        let need = kv_bytes(&t.tiers, kv_tokens)?;
        if k.len() < need || v.len() < need {
            return Err(Error::BufferTooSmall {
                argument: if k.len() < need { "k_len" } else { "v_len" },
                needed: need,
                capacity: k.len().min(v.len()),
            });
        }
        // Decoded straight into the caller's buffers (no buffer of our own, no copy).
        *out = t.tiers.restore_into(tokens, kv_tokens, k, v)?;
        Ok(())
    })
}

/// Stores every full chunk of the first `min(n_tokens, kv_tokens)` tokens; `k` and `v`
/// are `[n_layer][kv_tokens][n_kv_head][head_dim]` in the config's dtype (`k_len`/`v_len`
/// bytes, exactly `n_layer * kv_tokens * row`). Chunks every tier holds are skipped.
/// Tier failures (Redis down, disk full) are not errors: they are counted and reported in
/// `*out_report` (may be NULL). Wrong sizes: `KVC_INVALID_ARGUMENT`.
///
/// Ownership: all caller-owned. Threads: safe, concurrently on one handle.
///
/// # Safety
/// `tiers` live; `tokens` readable for `n_tokens`; `k`/`v` readable for `k_len`/`v_len`
/// bytes; `out_report` NULL or writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_tiers_store(
    tiers: *const KvcTiers,
    tokens: *const u32,
    n_tokens: usize,
    kv_tokens: usize,
    k: *const c_void,
    k_len: usize,
    v: *const c_void,
    v_len: usize,
    out_report: *mut KvcTiersStoreReport,
) -> KvcStatus {
    status_boundary("kvc_tiers_store", || {
        // SAFETY: caller contract.
        let t = unsafe { handle_ref(tiers, "tiers") }?;
        // SAFETY: caller contract.
        let tokens = unsafe { in_slice(tokens, n_tokens, "tokens") }?;
        // SAFETY: caller contract.
        let k = unsafe { in_slice(k.cast::<u8>(), k_len, "k") }?;
        // SAFETY: caller contract.
        let v = unsafe { in_slice(v.cast::<u8>(), v_len, "v") }?;
        let report = if out_report.is_null() {
            None
        } else {
            // SAFETY: caller contract (non-NULL here).
            Some(unsafe { out_ref(out_report, "out_report") }?)
        };
        let r = t.tiers.store(tokens, k, v, kv_tokens)?;
        if let Some(out) = report {
            *out = KvcTiersStoreReport {
                chunks: r.chunks,
                chunks_encoded: r.chunks_encoded,
                bytes_stored: r.bytes_stored,
                bytes_raw: r.bytes_raw,
                failures: r.failures,
            };
        }
        Ok(())
    })
}

fn to_c(t: &KvcTiers, m: &TiersMetrics) -> KvcTiersMetrics {
    let mut out = KvcTiersMetrics {
        lookups: m.lookups,
        restores: m.restores,
        chunks_restored: m.chunks_restored,
        chunks_encoded: m.chunks_encoded,
        raw_bytes_encoded: m.raw_bytes_encoded,
        blob_bytes_encoded: m.blob_bytes_encoded,
        promotions: m.promotions,
        fallbacks: m.fallbacks,
        tiers: [KvcTierMetrics::default(); 3],
    };
    for (slot, idx) in t.slots.iter().enumerate() {
        if let Some(tm) = idx.and_then(|i| m.tiers.get(i)) {
            out.tiers[slot] = KvcTierMetrics {
                present: 1,
                hits: tm.hits,
                misses: tm.misses,
                errors: tm.errors,
                corrupt: tm.corrupt,
                foreign: tm.foreign,
                chunks_written: tm.chunks_written,
                bytes_written: tm.bytes_written,
                bytes_read: tm.bytes_read,
                entries: tm.stats.entries,
                bytes: tm.stats.bytes,
                evictions: tm.stats.evictions,
            };
        }
    }
    out
}

/// Writes the counters into `*out`.
///
/// Ownership: `out` caller-owned. Threads: safe, concurrently on one handle.
///
/// # Safety
/// `tiers` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_get_metrics(
    tiers: *const KvcTiers,
    out: *mut KvcTiersMetrics,
) -> KvcStatus {
    status_boundary("kvc_tiers_get_metrics", || {
        // SAFETY: caller contract.
        let t = unsafe { handle_ref(tiers, "tiers") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out, "out") }?;
        *out = to_c(t, &t.tiers.metrics());
        Ok(())
    })
}

/// A NUL-terminated UTF-8 path argument (NULL: `KVC_NULL_ARGUMENT`).
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
unsafe fn path_arg(p: *const c_char, argument: &'static str) -> Result<PathBuf, Error> {
    // SAFETY: caller contract (NULL checked first).
    unsafe { in_ref(p, argument) }?;
    // SAFETY: non-NULL and NUL-terminated (contract).
    let s = unsafe { opt_str(p, argument) }?.unwrap_or_default();
    if s.is_empty() {
        return Err(Error::invalid(argument, "is empty"));
    }
    Ok(PathBuf::from(s))
}

/// Exports the prefix `tokens` (`n_tokens` token ids, at most 2^26) as a kv-prefix file
/// (docs/formats/kv-prefix.md) at `path` (NUL-terminated): every token id, and the blobs of
/// the leading run of its whole chunks that the tiers hold valid (fetched and checked as
/// `kvc_tiers_restore` fetches them, promoted into the tiers above where they were found;
/// not decoded), up to the first chunk no tier holds. The file is written atomically (a
/// temporary file in the same directory, renamed over `path`): a reader sees the old file
/// or the whole new one. Stores in `*out_tokens` the tokens the file's chunks cover (a
/// multiple of the chunk size; 0 with no whole chunk held, which is still a valid file).
/// A file that cannot be written: `KVC_IO`; more than 2^26 tokens: `KVC_INVALID_ARGUMENT`.
/// (ABI 0.20)
///
/// Ownership: all caller-owned; the file is the caller's. Threads: safe, concurrently on
/// one handle (two exports to one path: the last rename wins, both files whole).
///
/// # Safety
/// `tiers` live; `tokens` readable for `n_tokens`; `path` NUL-terminated; `out_tokens`
/// writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_export_prefix(
    tiers: *const KvcTiers,
    tokens: *const u32,
    n_tokens: usize,
    path: *const c_char,
    out_tokens: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_tiers_export_prefix", || {
        // SAFETY: caller contract.
        let t = unsafe { handle_ref(tiers, "tiers") }?;
        // SAFETY: caller contract.
        let tokens = unsafe { in_slice(tokens, n_tokens, "tokens") }?;
        // SAFETY: caller contract.
        let path = unsafe { path_arg(path, "path") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out_tokens, "out_tokens") }?;
        let export = t.tiers.export_prefix_file(tokens, &path)?;
        *out = export.tokens_covered;
        Ok(())
    })
}

/// Imports the kv-prefix file at `path` (NUL-terminated; `kvc_tiers_export_prefix` wrote
/// it, here or in another process): checks all of it (every field, its length, its
/// checksum, each chunk blob's own checks and its key against the file's token ids, the
/// blobs against these tiers' codec and layout), then puts every chunk into the tiers'
/// **first** tier (memory when configured); the engine then restores the file's tokens
/// with `kvc_tiers_restore` as usual. The file's token ids are copied into `tokens`
/// (`capacity` of them) and their count stored in `*out_n_tokens`; the tokens of the
/// leading chunks the first tier holds after the import (a multiple of the chunk size,
/// what a restore right after gives) in `*out_chunk_tokens_imported`.
///
/// Size query: `tokens == NULL && capacity == 0` checks the file and stores the count in
/// `*out_n_tokens` without importing (`*out_chunk_tokens_imported` untouched). Too small
/// a capacity: `KVC_BUFFER_TOO_SMALL` with the count in `*out_n_tokens`, nothing imported.
/// A damaged or truncated file: `KVC_CORRUPT_DATA`; a valid file of another model,
/// layout, dtype, chunk size, codec or calibration: `KVC_INVALID_ARGUMENT`, with
/// `foreign kv-prefix file` in the last-error message; both import nothing. An unreadable
/// file, or a first tier (disk, Redis) that fails the write: `KVC_IO`. The handle stays
/// usable after any of them. (ABI 0.20)
///
/// Ownership: all caller-owned. Threads: safe, concurrently on one handle.
///
/// # Safety
/// `tiers` live; `path` NUL-terminated; `tokens` NULL with `capacity` 0, or writable for
/// `capacity` token ids; `out_n_tokens` and `out_chunk_tokens_imported` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_tiers_import_prefix(
    tiers: *const KvcTiers,
    path: *const c_char,
    tokens: *mut u32,
    capacity: usize,
    out_n_tokens: *mut usize,
    out_chunk_tokens_imported: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_tiers_import_prefix", || {
        // SAFETY: caller contract.
        let t = unsafe { handle_ref(tiers, "tiers") }?;
        // SAFETY: caller contract.
        let path = unsafe { path_arg(path, "path") }?;
        // SAFETY: caller contract.
        let out_n = unsafe { out_ref(out_n_tokens, "out_n_tokens") }?;
        // SAFETY: caller contract.
        let out_imported =
            unsafe { out_ref(out_chunk_tokens_imported, "out_chunk_tokens_imported") }?;
        let size_query = tokens.is_null() && capacity == 0;
        let dst = if size_query {
            None
        } else {
            // SAFETY: caller contract.
            Some(unsafe { out_slice(tokens, capacity, "tokens") }?)
        };
        let bytes = std::fs::read(&path).map_err(|e| Error::Wrapped {
            status: KvcStatus::KVC_IO,
            message: format!("read {}: {e}", path.display()),
        })?;
        let checked = t
            .tiers
            .check_prefix(&bytes)
            .map_err(foreign_is_an_argument)?;
        let n = checked.file().tokens().len();
        if size_query {
            *out_n = n;
            return Ok(());
        }
        let Some(dst) = dst.and_then(|d| d.get_mut(..n)) else {
            *out_n = n;
            return Err(Error::BufferTooSmall {
                argument: "tokens",
                needed: n,
                capacity,
            });
        };
        let imported = t
            .tiers
            .import_checked(checked)
            .map_err(foreign_is_an_argument)?;
        dst.copy_from_slice(&imported.tokens);
        *out_n = n;
        *out_imported = imported.tokens_covered;
        Ok(())
    })
}

/// A foreign kv-prefix file (another model, layout or codec) is the caller's mismatch,
/// `KVC_INVALID_ARGUMENT`, not damage (`KVC_CORRUPT_DATA`, which other foreign data maps
/// to); its message says "foreign".
fn foreign_is_an_argument(e: kvc_store_tiers::Error) -> Error {
    if e.kind() == kvc_store_tiers::ErrorKind::Foreign {
        Error::Wrapped {
            status: KvcStatus::KVC_INVALID_ARGUMENT,
            message: e.to_string(),
        }
    } else {
        e.into()
    }
}

/// Frees tiers (closes Redis connections; files on disk and values in Redis stay); NULL
/// is a no-op.
///
/// Ownership: the handle is invalid afterwards. Threads: no other call may be using it.
///
/// # Safety
/// `tiers` must be NULL or a live handle from `kvc_tiers_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_tiers_free(tiers: *mut KvcTiers) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(tiers) })
}
