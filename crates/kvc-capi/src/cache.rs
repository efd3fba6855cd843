//! `kvc_cache`: a view of an engine-owned KV cache layer (`kvc-cache` layouts) behind an
//! opaque handle: compaction by reserve pairs (whole layer or per KV head) and zeroing of
//! token ranges, in place, on the engine's pointers.
//!
//! The handle holds only the layout (llama.cpp, InfiniLM or MNN; dtype; capacity). Every
//! operation takes one layer's K and V pointers, so one view serves every layer with that
//! layout, from any number of threads at once.

use std::ffi::c_void;

use kvc_cache::{compact_heads, compact_layer, zero_layer_tokens, KvLayout, LayerMut, ReservePlan};

use crate::boundary::{check_disjoint, in_ref, in_slice, out_ref, status_boundary, value_boundary};
use crate::convert::{KvcDtype, KVC_DTYPE_F16};
use crate::elements::{c_dtype, cache_dtype, out_bytes};
use crate::error::Error;
use crate::h2o::KvcReservePair;
use crate::handle::{free_handle, handle_ref, store_handle};
use crate::status::KvcStatus;

/// `kvc_cache_config.layout`: llama.cpp. Per layer K is `[n_embd_k_gqa, kv_size]` (one
/// row of `n_kv_heads * head_dim_k` elements per cell) and V the same, or transposed
/// (`[kv_size, n_embd_v_gqa]`, one column per cell) when `v_trans` is 1 (llama.cpp does
/// so with flash attention off). With `n_stream > 1`, stream `s` starts
/// `s * n_embd * kv_size` elements into each tensor: pass that address.
pub const KVC_CACHE_LAYOUT_LLAMA: u32 = 0;
/// `kvc_cache_config.layout`: InfiniLM StaticKVCache, K and V each `[n_kv_heads,
/// capacity, head_dim]`, contiguous.
pub const KVC_CACHE_LAYOUT_INFINILM: u32 = 1;
/// `kvc_cache_config.layout`: MNN CPUKVCacheManager, float path: K packed per head as
/// `[ceil(cap/hP), ceil(D/lP), hP, lP]`, V as `[ceil(cap/B), ceil(D/hP), ceil(B/lP), hP,
/// lP]` with `B` the flash-attention block (`mFlashAttentionUpperKv`, or the capacity).
pub const KVC_CACHE_LAYOUT_MNN: u32 = 2;

/// The layout of one layer of an engine's cache. Fill it with `kvc_cache_config_default`,
/// then set the shape (defaults in brackets).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvcCacheConfig {
    /// `KVC_CACHE_LAYOUT_LLAMA`, `_INFINILM` or `_MNN` (default llama).
    pub layout: u32,
    /// Element type: `KVC_DTYPE_F16`, `_BF16`, `_F32` or `_I8` (default F16).
    pub dtype: KvcDtype,
    /// KV heads of the layer (>= 1) [0: must be set].
    pub n_kv_heads: usize,
    /// Elements per head of a K token (>= 1) [0: must be set].
    pub head_dim_k: usize,
    /// Elements per head of a V token; 0 means `head_dim_k`. Only llama.cpp caches may
    /// have a different one (default 0).
    pub head_dim_v: usize,
    /// Token slots: llama.cpp `kv_size`, InfiniLM `S_max`, MNN `mMaxLength` (>= 1) [0:
    /// must be set].
    pub capacity: usize,
    /// llama.cpp only: 1 when V is stored transposed (flash attention off), else 0 (default 0).
    pub v_trans: u32,
    /// MNN only: the backend's `hP` pack (`MNNGetMatMulPackMode`) [0: must be set for
    /// MNN].
    pub mnn_hp: u32,
    /// MNN only: the backend's `lP` pack [0: must be set for MNN].
    pub mnn_lp: u32,
    /// MNN only: `mFlashAttentionUpperKv`, or 0 when flash attention is off (default 0).
    pub mnn_flash_block: usize,
}

impl Default for KvcCacheConfig {
    fn default() -> Self {
        KvcCacheConfig {
            layout: KVC_CACHE_LAYOUT_LLAMA,
            dtype: KVC_DTYPE_F16,
            n_kv_heads: 0,
            head_dim_k: 0,
            head_dim_v: 0,
            capacity: 0,
            v_trans: 0,
            mnn_hp: 0,
            mnn_lp: 0,
            mnn_flash_block: 0,
        }
    }
}

/// Sizes of one layer of a cache view.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcCacheInfo {
    /// The element type.
    pub dtype: KvcDtype,
    /// Token slots.
    pub capacity: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Elements of one token's K (`n_kv_heads * head_dim_k`).
    pub k_channels: usize,
    /// Elements of one token's V.
    pub v_channels: usize,
    /// Bytes the K buffer of one layer must hold (padding included).
    pub k_bytes: usize,
    /// Bytes the V buffer of one layer must hold.
    pub v_bytes: usize,
    /// `k_bytes + v_bytes`: the bytes of one layer.
    pub layer_bytes: usize,
    /// Bytes of one token of one layer, K and V, padding excluded.
    pub token_bytes: usize,
}

/// A cache layer layout: opaque; create with `kvc_cache_new`, free with
/// `kvc_cache_free`.
pub struct KvcCache {
    layout: KvLayout,
}

fn layout_of(c: &KvcCacheConfig) -> Result<KvLayout, Error> {
    let dtype = cache_dtype(c.dtype, "config.dtype")?;
    for (argument, value) in [
        ("config.n_kv_heads", c.n_kv_heads),
        ("config.head_dim_k", c.head_dim_k),
        ("config.capacity", c.capacity),
    ] {
        if value == 0 {
            return Err(Error::invalid(argument, "must be at least 1"));
        }
    }
    let only = |argument: &'static str, value: usize, layout: &str| {
        if value == 0 {
            Ok(())
        } else {
            Err(Error::invalid(
                argument,
                format!("is {value} but is only used by {layout}; set it to 0"),
            ))
        }
    };
    let same_head_dim = || {
        if c.head_dim_v == 0 || c.head_dim_v == c.head_dim_k {
            Ok(())
        } else {
            Err(Error::invalid(
                "config.head_dim_v",
                format!(
                    "{} differs from head_dim_k {}; only llama.cpp caches may differ",
                    c.head_dim_v, c.head_dim_k
                ),
            ))
        }
    };
    let head_dim_v = if c.head_dim_v == 0 {
        c.head_dim_k
    } else {
        c.head_dim_v
    };
    Ok(match c.layout {
        KVC_CACHE_LAYOUT_LLAMA => {
            only("config.mnn_hp", c.mnn_hp as usize, "KVC_CACHE_LAYOUT_MNN")?;
            only("config.mnn_lp", c.mnn_lp as usize, "KVC_CACHE_LAYOUT_MNN")?;
            only(
                "config.mnn_flash_block",
                c.mnn_flash_block,
                "KVC_CACHE_LAYOUT_MNN",
            )?;
            if c.v_trans > 1 {
                return Err(Error::invalid(
                    "config.v_trans",
                    format!("{} is neither 0 nor 1", c.v_trans),
                ));
            }
            KvLayout::llama(
                dtype,
                c.n_kv_heads,
                c.head_dim_k,
                head_dim_v,
                c.capacity,
                c.v_trans == 1,
            )?
        }
        KVC_CACHE_LAYOUT_INFINILM => {
            only(
                "config.v_trans",
                c.v_trans as usize,
                "KVC_CACHE_LAYOUT_LLAMA",
            )?;
            only("config.mnn_hp", c.mnn_hp as usize, "KVC_CACHE_LAYOUT_MNN")?;
            only("config.mnn_lp", c.mnn_lp as usize, "KVC_CACHE_LAYOUT_MNN")?;
            only(
                "config.mnn_flash_block",
                c.mnn_flash_block,
                "KVC_CACHE_LAYOUT_MNN",
            )?;
            same_head_dim()?;
            KvLayout::infinilm(dtype, c.n_kv_heads, c.head_dim_k, c.capacity)?
        }
        KVC_CACHE_LAYOUT_MNN => {
            only(
                "config.v_trans",
                c.v_trans as usize,
                "KVC_CACHE_LAYOUT_LLAMA",
            )?;
            same_head_dim()?;
            for (argument, value) in [("config.mnn_hp", c.mnn_hp), ("config.mnn_lp", c.mnn_lp)] {
                if value == 0 {
                    return Err(Error::invalid(
                        argument,
                        "must be set for KVC_CACHE_LAYOUT_MNN (the backend's matmul pack, \
                         MNNGetMatMulPackMode)",
                    ));
                }
            }
            let flash = (c.mnn_flash_block != 0).then_some(c.mnn_flash_block);
            KvLayout::mnn(
                dtype,
                c.n_kv_heads,
                c.head_dim_k,
                c.capacity,
                c.mnn_hp as usize,
                c.mnn_lp as usize,
                flash,
            )?
        }
        l => {
            return Err(Error::invalid(
                "config.layout",
                format!(
                    "{l} is not KVC_CACHE_LAYOUT_LLAMA (0), KVC_CACHE_LAYOUT_INFINILM (1) or \
                     KVC_CACHE_LAYOUT_MNN (2)"
                ),
            ))
        }
    })
}

impl KvcCache {
    /// Borrows one layer's K and V: sizes from the layout, NULL, alignment and overlap
    /// checked.
    ///
    /// # Safety
    /// `k` and `v` writable for the layout's K and V bytes, used by nothing else.
    unsafe fn layer<'a>(&self, k: *mut c_void, v: *mut c_void) -> Result<LayerMut<'a>, Error> {
        let (kl, vl) = (&self.layout.k, &self.layout.v);
        for (ptr, argument) in [(k, "k"), (v, "v")] {
            if ptr.is_null() {
                return Err(Error::NullArgument { argument });
            }
        }
        check_disjoint(
            k.cast_const().cast(),
            kl.byte_len(),
            v.cast_const().cast(),
            vl.byte_len(),
            "v",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let kb = unsafe { out_bytes(k, kl.elem_count(), kl.dtype(), "k") }?;
        // SAFETY: as above; `v` does not overlap `k` (checked).
        let vb = unsafe { out_bytes(v, vl.elem_count(), vl.dtype(), "v") }?;
        Ok(LayerMut::new(self.layout, kb, vb)?)
    }

    fn check_len(&self, len: usize) -> Result<(), Error> {
        if len > self.layout.capacity() {
            return Err(Error::invalid(
                "len",
                format!(
                    "{len} tokens exceed the cache's capacity {}",
                    self.layout.capacity()
                ),
            ));
        }
        Ok(())
    }
}

fn spans(pairs: &[KvcReservePair]) -> Vec<(usize, usize)> {
    pairs
        .iter()
        .map(|p| (p.offset as usize, p.length as usize))
        .collect()
}

/// Writes the default cache settings into `*out` (llama.cpp layout, f16, shape 0 to be
/// set).
///
/// Ownership: `out` is caller-owned. Threads: safe from any thread.
///
/// # Safety
/// `out` must be NULL or point to a writable `kvc_cache_config`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_cache_config_default(out: *mut KvcCacheConfig) -> KvcStatus {
    status_boundary("kvc_cache_config_default", || {
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = KvcCacheConfig::default();
        Ok(())
    })
}

/// Creates a view of the cache layout `config` and stores it in `*out` (only on
/// `KVC_OK`). A zero or unknown field, a field the layout does not use set non-zero, or
/// a size overflowing `size_t` / `PTRDIFF_MAX` bytes is `KVC_INVALID_ARGUMENT`.
///
/// Ownership: `config` is only read; the caller owns the handle and frees it with
/// `kvc_cache_free`. Threads: safe from any thread.
///
/// # Safety
/// `config` readable; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_cache_new(
    config: *const KvcCacheConfig,
    out: *mut *mut KvcCache,
) -> KvcStatus {
    status_boundary("kvc_cache_new", || {
        // SAFETY: caller contract.
        let config = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let layout = layout_of(config)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, KvcCache { layout }) }
    })
}

/// The sizes of one layer in `*out`: allocate (or check) each layer's K and V buffers
/// with `k_bytes` and `v_bytes`.
///
/// Threads: reads the handle only; safe concurrently with any call on it.
///
/// # Safety
/// `cache` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_cache_get_info(
    cache: *const KvcCache,
    out: *mut KvcCacheInfo,
) -> KvcStatus {
    status_boundary("kvc_cache_get_info", || {
        // SAFETY: caller contract.
        let c = unsafe { handle_ref(cache, "cache") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out, "out") }?;
        let (k, v) = (&c.layout.k, &c.layout.v);
        let es = k.dtype().size();
        *out = KvcCacheInfo {
            dtype: c_dtype(k.dtype()),
            capacity: c.layout.capacity(),
            n_kv_heads: k.n_heads(),
            k_channels: k.channels(),
            v_channels: v.channels(),
            k_bytes: k.byte_len(),
            v_bytes: v.byte_len(),
            // Each is at most PTRDIFF_MAX (checked when the layout was made).
            layer_bytes: k.byte_len() + v.byte_len(),
            token_bytes: (k.channels() + v.channels()) * es,
        };
        Ok(())
    })
}

/// Compacts one layer in place: of the first `len` tokens of `k` and `v` (each one
/// layer's buffer, `k_bytes` / `v_bytes` of `kvc_cache_get_info`), keeps the ranges
/// `pairs[0 .. n_pairs]` in order and moves them to the front; `*new_len` receives the
/// tokens kept. Tokens at and beyond `*new_len` are left as they were or hold moved-from
/// data (zero them with `kvc_cache_zero_tokens` if needed).
///
/// `pairs` is what `kvc_h2o_plan_pairs` emits (for a plan made with `kv_len == len`):
/// sorted, disjoint, non-empty, inside `len`; anything else is `KVC_INVALID_ARGUMENT`,
/// as is `len` beyond the capacity. With llama.cpp's shared cells, apply the same pairs
/// to every layer (and to the engine's cell metadata). Everything is checked before any
/// byte moves: on failure nothing changes.
///
/// Ownership: `k`, `v` and `pairs` are the caller's, used during the call only; `k` and
/// `v` must not overlap. Threads: reads the handle only; calls on one handle may run
/// concurrently on different layers.
///
/// # Safety
/// `cache` live; `k` / `v` writable for `k_bytes` / `v_bytes`, aligned for the dtype;
/// `pairs` readable for `n_pairs` pairs; `new_len` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_cache_compact_layer(
    cache: *const KvcCache,
    k: *mut c_void,
    v: *mut c_void,
    pairs: *const KvcReservePair,
    n_pairs: usize,
    len: usize,
    new_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_cache_compact_layer", || {
        // SAFETY: caller contract.
        let c = unsafe { handle_ref(cache, "cache") }?;
        // SAFETY: caller contract.
        let new_len = unsafe { out_ref(new_len, "new_len") }?;
        // SAFETY: caller contract.
        let pairs = unsafe { in_slice(pairs, n_pairs, "pairs") }?;
        c.check_len(len)?;
        let plan = ReservePlan::new(&spans(pairs), len)?;
        // SAFETY: caller contract.
        let mut layer = unsafe { c.layer(k, v) }?;
        let kept = compact_layer(&mut layer, &plan)?;
        *new_len = kept;
        Ok(())
    })
}

/// Compacts one layer head by head, each KV head by its own pairs (a `kvc_h2o` plan with
/// per-KV-head scores: group `h` of `kvc_h2o_plan_pairs` is head `h`). `pairs` holds
/// every head's pairs back to back, head 0 first; `head_pair_counts[h]` (`n_heads`
/// entries, `n_heads` equal to the view's KV heads) says how many are head `h`'s, and
/// they add up to `n_pairs`. Every head must keep the same number of tokens, which
/// `*new_len` receives. Otherwise as `kvc_cache_compact_layer`: all checked first,
/// nothing changes on failure.
///
/// Ownership and threads as `kvc_cache_compact_layer`.
///
/// # Safety
/// As `kvc_cache_compact_layer`; `head_pair_counts` readable for `n_heads` entries.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_cache_compact_heads(
    cache: *const KvcCache,
    k: *mut c_void,
    v: *mut c_void,
    pairs: *const KvcReservePair,
    n_pairs: usize,
    head_pair_counts: *const usize,
    n_heads: usize,
    len: usize,
    new_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_cache_compact_heads", || {
        // SAFETY: caller contract.
        let c = unsafe { handle_ref(cache, "cache") }?;
        // SAFETY: caller contract.
        let new_len = unsafe { out_ref(new_len, "new_len") }?;
        // SAFETY: caller contract.
        let pairs = unsafe { in_slice(pairs, n_pairs, "pairs") }?;
        // SAFETY: caller contract.
        let counts = unsafe { in_slice(head_pair_counts, n_heads, "head_pair_counts") }?;
        c.check_len(len)?;
        if n_heads != c.layout.k.n_heads() {
            return Err(Error::invalid(
                "n_heads",
                format!(
                    "{n_heads}, but the cache has {} KV heads",
                    c.layout.k.n_heads()
                ),
            ));
        }
        counts
            .iter()
            .try_fold(0usize, |a, &n| a.checked_add(n))
            .filter(|&t| t == n_pairs)
            .ok_or_else(|| {
                Error::invalid(
                    "head_pair_counts",
                    format!("the counts do not add up to n_pairs ({n_pairs})"),
                )
            })?;
        let mut plans = Vec::with_capacity(n_heads);
        let mut at = 0;
        for &n in counts {
            plans.push(ReservePlan::new(&spans(&pairs[at..at + n]), len)?);
            at += n;
        }
        // SAFETY: caller contract.
        let mut layer = unsafe { c.layer(k, v) }?;
        let (kl, vl) = (c.layout.k, c.layout.v);
        let (kb, vb) = layer.kv_mut();
        // compact_heads checks every plan (count, range, equal kept) before moving; K and
        // V have the same heads and capacity, so when K passes, V passes too.
        let kept = compact_heads(kb, &kl, &plans)?;
        compact_heads(vb, &vl, &plans)?;
        *new_len = kept;
        Ok(())
    })
}

/// Zeroes tokens `[start, end)` of one layer's `k` and `v` (all bytes of those tokens,
/// in every layout). `start > end` or `end` beyond the capacity is
/// `KVC_INVALID_ARGUMENT` (nothing changes).
///
/// Ownership and threads as `kvc_cache_compact_layer`.
///
/// # Safety
/// `cache` live; `k` / `v` writable for `k_bytes` / `v_bytes`, aligned for the dtype.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_cache_zero_tokens(
    cache: *const KvcCache,
    k: *mut c_void,
    v: *mut c_void,
    start: usize,
    end: usize,
) -> KvcStatus {
    status_boundary("kvc_cache_zero_tokens", || {
        // SAFETY: caller contract.
        let c = unsafe { handle_ref(cache, "cache") }?;
        // SAFETY: caller contract.
        let mut layer = unsafe { c.layer(k, v) }?;
        if start > end || end > c.layout.capacity() {
            return Err(Error::invalid(
                "end",
                format!(
                    "tokens {start}..{end} are not a range inside the capacity {}",
                    c.layout.capacity()
                ),
            ));
        }
        zero_layer_tokens(&mut layer, start, end)?;
        Ok(())
    })
}

/// Frees a cache view; NULL is a no-op. The engine's memory is not touched.
///
/// Ownership: the handle is invalid afterwards. Threads: no other call may be using it.
///
/// # Safety
/// `cache` must be NULL or a live handle from `kvc_cache_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_cache_free(cache: *mut KvcCache) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(cache) })
}
