//! `kvc_h2o`: the H2O / StreamingLLM token-eviction policy (`kvc-h2o`) behind an opaque
//! handle, driven one attention call at a time.

use kvc_h2o::{
    CallShape, H2oConfig, H2oMetrics, H2oPolicy, LayerMetrics, PlanResolution, PlanScope,
    ScoreGranularity, Selection, SoftmaxTile,
};

use crate::boundary::{in_ref, in_slice, out_ref, out_slice, status_boundary, value_boundary};
use crate::error::Error;
use crate::handle::{free_handle, handle_mut, handle_ref, store_handle};
use crate::status::KvcStatus;

/// One kept token range `[offset, offset + length)` of a cache before compaction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcReservePair {
    /// First kept token.
    pub offset: u32,
    /// Number of kept tokens from `offset` on.
    pub length: u32,
}

/// `kvc_h2o_config.granularity`: one score per block for the whole layer (the spec).
pub const KVC_H2O_SCORES_PER_LAYER: u32 = 0;
/// `kvc_h2o_config.granularity`: one score per block and KV head (one plan per KV head).
pub const KVC_H2O_SCORES_PER_KV_HEAD: u32 = 1;
/// `kvc_h2o_config.selection`: H2O, keep the heavy hitters by EMA score.
pub const KVC_H2O_SELECT_HEAVY_HITTERS: u32 = 0;
/// `kvc_h2o_config.selection`: StreamingLLM, keep sink plus the most recent blocks.
pub const KVC_H2O_SELECT_STREAMING_LLM: u32 = 1;
/// `kvc_h2o_config.scope`: every layer plans alone (MNN).
pub const KVC_H2O_SCOPE_PER_LAYER: u32 = 0;
/// `kvc_h2o_config.scope`: one plan for all layers (cells shared by all layers: llama.cpp).
pub const KVC_H2O_SCOPE_LAYER_UNIFORM: u32 = 1;
/// `kvc_h2o_config.layer_end` meaning "the last layer".
pub const KVC_H2O_LAYER_END_LAST: i64 = -1;

/// `kvc_h2o_begin_call` resolution: there was no pending plan.
pub const KVC_H2O_NO_PLAN: u32 = 0;
/// `kvc_h2o_begin_call` resolution: the pending plan was applied (`kv_len == kept +
/// n_queries`).
pub const KVC_H2O_PLAN_APPLIED: u32 = 1;
/// `kvc_h2o_begin_call` resolution: the pending plan was dropped (`kv_len` did not match).
pub const KVC_H2O_PLAN_DROPPED: u32 = 2;

/// H2O settings: field `x` is the spec's `h2o_x`. Fill it with `kvc_h2o_config_default`
/// (the spec's defaults, shown in brackets), then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvcH2oConfig {
    /// Tokens per scored block (default 64); at least 1.
    pub block_tokens: u32,
    /// Leading tokens never evicted (default 32).
    pub sink_tokens: u32,
    /// Trailing tokens never evicted (default 256).
    pub recent_tokens: u32,
    /// Tokens before / tokens kept the plan aims at (default 3.5); finite, >= 1.
    pub target_lossy_ratio: f32,
    /// Weight of the history in the EMA (default 0.9); in [0, 1].
    pub ema_alpha: f32,
    /// No plan below this kv_len (default 512).
    pub trigger_min_tokens: u32,
    /// Calls of a layer between two of its plans (default 16).
    pub update_interval: u32,
    /// First managed layer (default 0).
    pub layer_start: u32,
    /// Last managed layer, inclusive, or `KVC_H2O_LAYER_END_LAST` (-1) [-1].
    pub layer_end: i64,
    /// `KVC_H2O_SCORES_PER_LAYER` or `KVC_H2O_SCORES_PER_KV_HEAD` [per layer].
    pub granularity: u32,
    /// `KVC_H2O_SELECT_HEAVY_HITTERS` or `KVC_H2O_SELECT_STREAMING_LLM` [heavy hitters].
    pub selection: u32,
    /// `KVC_H2O_SCOPE_PER_LAYER` or `KVC_H2O_SCOPE_LAYER_UNIFORM` [per layer].
    pub scope: u32,
}

impl From<&H2oConfig> for KvcH2oConfig {
    fn from(c: &H2oConfig) -> Self {
        KvcH2oConfig {
            block_tokens: c.block_tokens,
            sink_tokens: c.sink_tokens,
            recent_tokens: c.recent_tokens,
            target_lossy_ratio: c.target_lossy_ratio,
            ema_alpha: c.ema_alpha,
            trigger_min_tokens: c.trigger_min_tokens,
            update_interval: c.update_interval,
            layer_start: c.layer_start,
            layer_end: c.layer_end.map_or(KVC_H2O_LAYER_END_LAST, i64::from),
            granularity: match c.granularity {
                ScoreGranularity::PerLayer => KVC_H2O_SCORES_PER_LAYER,
                ScoreGranularity::PerKvHead => KVC_H2O_SCORES_PER_KV_HEAD,
            },
            selection: match c.selection {
                Selection::HeavyHitters => KVC_H2O_SELECT_HEAVY_HITTERS,
                Selection::StreamingLlm => KVC_H2O_SELECT_STREAMING_LLM,
            },
            scope: match c.scope {
                PlanScope::PerLayer => KVC_H2O_SCOPE_PER_LAYER,
                PlanScope::LayerUniform => KVC_H2O_SCOPE_LAYER_UNIFORM,
            },
        }
    }
}

impl KvcH2oConfig {
    /// The Rust config (the policy validates the values).
    pub fn to_config(&self) -> Result<H2oConfig, Error> {
        let enum_err = |argument, value: u32, names: &str| {
            Error::invalid(argument, format!("{value} is not one of {names}"))
        };
        let layer_end = match self.layer_end {
            KVC_H2O_LAYER_END_LAST => None,
            e => Some(u32::try_from(e).map_err(|_| {
                Error::invalid(
                    "config.layer_end",
                    format!(
                        "{e} is neither a layer index (0..=UINT32_MAX) nor -1 (the last layer)"
                    ),
                )
            })?),
        };
        Ok(H2oConfig {
            block_tokens: self.block_tokens,
            sink_tokens: self.sink_tokens,
            recent_tokens: self.recent_tokens,
            target_lossy_ratio: self.target_lossy_ratio,
            ema_alpha: self.ema_alpha,
            trigger_min_tokens: self.trigger_min_tokens,
            update_interval: self.update_interval,
            layer_start: self.layer_start,
            layer_end,
            granularity: match self.granularity {
                KVC_H2O_SCORES_PER_LAYER => ScoreGranularity::PerLayer,
                KVC_H2O_SCORES_PER_KV_HEAD => ScoreGranularity::PerKvHead,
                g => {
                    return Err(enum_err(
                        "config.granularity",
                        g,
                        "KVC_H2O_SCORES_PER_LAYER (0), KVC_H2O_SCORES_PER_KV_HEAD (1)",
                    ))
                }
            },
            selection: match self.selection {
                KVC_H2O_SELECT_HEAVY_HITTERS => Selection::HeavyHitters,
                KVC_H2O_SELECT_STREAMING_LLM => Selection::StreamingLlm,
                s => {
                    return Err(enum_err(
                        "config.selection",
                        s,
                        "KVC_H2O_SELECT_HEAVY_HITTERS (0), KVC_H2O_SELECT_STREAMING_LLM (1)",
                    ))
                }
            },
            scope: match self.scope {
                KVC_H2O_SCOPE_PER_LAYER => PlanScope::PerLayer,
                KVC_H2O_SCOPE_LAYER_UNIFORM => PlanScope::LayerUniform,
                s => {
                    return Err(enum_err(
                        "config.scope",
                        s,
                        "KVC_H2O_SCOPE_PER_LAYER (0), KVC_H2O_SCOPE_LAYER_UNIFORM (1)",
                    ))
                }
            },
        })
    }
}

/// The shape of one attention call of one layer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvcH2oCallShape {
    /// Tokens attended to, this call's new tokens included (1..=UINT32_MAX).
    pub kv_len: usize,
    /// Query rows of the call: its new tokens (1..=kv_len).
    pub n_queries: usize,
    /// Query heads (at least 1).
    pub n_heads: usize,
    /// KV heads; divides n_heads.
    pub n_kv_heads: usize,
}

/// What `kvc_h2o_end_call` decided.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcH2oDecision {
    /// 1 when a plan was made (it is then pending: read it with `kvc_h2o_plan_pairs` and
    /// apply it before the layer's next call), else 0.
    pub triggered: u32,
    /// The call's kv_len.
    pub kv_len: usize,
    /// Tokens the layer keeps: the plan's count, or kv_len without a plan.
    pub kept_tokens: usize,
}

/// The pending plan of a layer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvcH2oPlanInfo {
    /// 1 when a plan is pending for the layer, else 0 (then the other fields are 0).
    pub pending: u32,
    /// Number of pair lists: 1, or the KV head count with per-KV-head scores.
    pub n_groups: u32,
    /// The cache length the plan was made for.
    pub kv_len: usize,
    /// Tokens kept (per group; every group keeps the same count).
    pub kept_tokens: usize,
}

/// Counters of the policy (or of one layer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvcH2oMetrics {
    /// Managed layers (for one layer: 1 when managed, else 0).
    pub managed_layers: u64,
    /// Tokens the cache holds (kv_len of the last call), summed over managed layers.
    pub cached_tokens: u64,
    /// Tokens it would hold without eviction, summed over managed layers.
    pub logical_tokens: u64,
    /// Plans made.
    pub plans_made: u64,
    /// Plans the engine applied.
    pub plans_applied: u64,
    /// Plans dropped (the next call's kv_len did not match).
    pub plans_dropped: u64,
    /// Sequence restarts detected (scores cleared).
    pub resets: u64,
    /// logical / cached tokens (1 with nothing cached).
    pub lossy_ratio: f64,
}

impl From<H2oMetrics> for KvcH2oMetrics {
    fn from(m: H2oMetrics) -> Self {
        KvcH2oMetrics {
            managed_layers: m.managed_layers,
            cached_tokens: m.cached_tokens,
            logical_tokens: m.logical_tokens,
            plans_made: m.plans_made,
            plans_applied: m.plans_applied,
            plans_dropped: m.plans_dropped,
            resets: m.resets,
            lossy_ratio: m.lossy_ratio(),
        }
    }
}

impl From<LayerMetrics> for KvcH2oMetrics {
    fn from(m: LayerMetrics) -> Self {
        KvcH2oMetrics {
            managed_layers: u64::from(m.managed),
            cached_tokens: m.cached_tokens,
            logical_tokens: m.logical_tokens,
            plans_made: m.plans_made,
            plans_applied: m.plans_applied,
            plans_dropped: m.plans_dropped,
            resets: m.resets,
            lossy_ratio: m.lossy_ratio(),
        }
    }
}

/// An H2O policy for one model: opaque; create with `kvc_h2o_new`, free with
/// `kvc_h2o_free`.
pub struct KvcH2o {
    policy: H2oPolicy,
}

fn check_layer(policy: &H2oPolicy, layer: usize) -> Result<(), Error> {
    if layer >= policy.n_layers() {
        return Err(Error::invalid(
            "layer",
            format!(
                "{layer} is not below the policy's {} layers",
                policy.n_layers()
            ),
        ));
    }
    Ok(())
}

/// Writes the spec's default H2O settings into `*out` (see `kvc_h2o_config`).
///
/// Ownership: `out` is caller-owned. Threads: safe from any thread.
///
/// # Safety
/// `out` must be NULL or point to a writable `kvc_h2o_config`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_config_default(out: *mut KvcH2oConfig) -> KvcStatus {
    status_boundary("kvc_h2o_config_default", || {
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = KvcH2oConfig::from(&H2oConfig::default());
        Ok(())
    })
}

/// Creates a policy for a model of `n_layers` layers with `config` and stores it in
/// `*out` (only on `KVC_OK`). An out-of-range setting or `n_layers == 0` is
/// `KVC_INVALID_ARGUMENT`, with the spec's key name in the message.
///
/// Ownership: `config` is only read; the caller owns the handle and frees it with
/// `kvc_h2o_free`. Threads: safe from any thread.
///
/// # Safety
/// `config` readable; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_new(
    config: *const KvcH2oConfig,
    n_layers: usize,
    out: *mut *mut KvcH2o,
) -> KvcStatus {
    status_boundary("kvc_h2o_new", || {
        // SAFETY: caller contract.
        let config = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let policy = H2oPolicy::new(config.to_config()?, n_layers)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, KvcH2o { policy }) }
    })
}

/// Opens a call of `layer` with `shape`: resolves the layer's pending plan (applied iff
/// `kv_len == kept + n_queries`, else dropped) and stores what happened to it in
/// `*resolution` (`KVC_H2O_NO_PLAN`, `_PLAN_APPLIED`, `_PLAN_DROPPED`) unless
/// `resolution` is NULL. A bad shape is `KVC_INVALID_ARGUMENT`; a call already open for
/// the layer is `KVC_INVALID_STATE`.
///
/// Threads: exclusive use of `h2o`.
///
/// # Safety
/// `h2o` live; `shape` readable; `resolution` NULL or writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_begin_call(
    h2o: *mut KvcH2o,
    layer: usize,
    shape: *const KvcH2oCallShape,
    resolution: *mut u32,
) -> KvcStatus {
    status_boundary("kvc_h2o_begin_call", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(h2o, "h2o") }?;
        // SAFETY: caller contract.
        let s = unsafe { in_ref(shape, "shape") }?;
        let resolution = if resolution.is_null() {
            None
        } else {
            // SAFETY: caller contract.
            Some(unsafe { out_ref(resolution, "resolution") }?)
        };
        check_layer(&h.policy, layer)?;
        let r = h.policy.begin_call(
            layer,
            CallShape {
                kv_len: s.kv_len,
                n_queries: s.n_queries,
                n_heads: s.n_heads,
                n_kv_heads: s.n_kv_heads,
            },
        )?;
        if let Some(out) = resolution {
            *out = match r {
                PlanResolution::NoPlan => KVC_H2O_NO_PLAN,
                PlanResolution::Applied => KVC_H2O_PLAN_APPLIED,
                PlanResolution::Dropped => KVC_H2O_PLAN_DROPPED,
            };
        }
        Ok(())
    })
}

/// Which statistics an ingestion carries.
#[derive(Clone, Copy)]
enum Ingest {
    Probabilities,
    ColumnSums,
    BlockSums,
}

unsafe fn ingest(
    function: &str,
    what: Ingest,
    h2o: *mut KvcH2o,
    layer: usize,
    data: *const f32,
    count: usize,
) -> KvcStatus {
    status_boundary(function, || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(h2o, "h2o") }?;
        // SAFETY: caller contract.
        let data = unsafe { in_slice(data, count, "data") }?;
        check_layer(&h.policy, layer)?;
        match what {
            Ingest::Probabilities => h.policy.ingest_probabilities(layer, data)?,
            Ingest::ColumnSums => h.policy.ingest_column_sums(layer, data)?,
            Ingest::BlockSums => h.policy.ingest_block_sums(layer, data)?,
        }
        Ok(())
    })
}

/// Adds the call's full softmax probabilities `[n_heads][n_queries][kv_len]` (`count`
/// floats at `data`) to the open call of `layer`. A wrong count is
/// `KVC_INVALID_ARGUMENT`; no open call is `KVC_INVALID_STATE`.
///
/// Ownership: `data` is only read during the call. Threads: exclusive use of `h2o`.
///
/// # Safety
/// `h2o` live; `data` readable for `count` floats.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_ingest_probabilities(
    h2o: *mut KvcH2o,
    layer: usize,
    data: *const f32,
    count: usize,
) -> KvcStatus {
    // SAFETY: forwarded contract.
    unsafe {
        ingest(
            "kvc_h2o_ingest_probabilities",
            Ingest::Probabilities,
            h2o,
            layer,
            data,
            count,
        )
    }
}

/// Adds per-token column sums (probabilities summed over heads and queries): `[kv_len]`
/// for the layer, or `[n_kv_heads][kv_len]` with per-KV-head scores. The layer-wide form
/// with per-KV-head scores is `KVC_UNSUPPORTED`. Otherwise as
/// `kvc_h2o_ingest_probabilities`.
///
/// # Safety
/// `h2o` live; `data` readable for `count` floats.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_ingest_column_sums(
    h2o: *mut KvcH2o,
    layer: usize,
    data: *const f32,
    count: usize,
) -> KvcStatus {
    // SAFETY: forwarded contract.
    unsafe {
        ingest(
            "kvc_h2o_ingest_column_sums",
            Ingest::ColumnSums,
            h2o,
            layer,
            data,
            count,
        )
    }
}

/// Adds raw block sums (probabilities summed over heads, queries and the block's tokens):
/// `[n_blocks]`, or `[n_blocks][n_kv_heads]` with per-KV-head scores (what an offline
/// trace records). Otherwise as `kvc_h2o_ingest_probabilities`.
///
/// # Safety
/// `h2o` live; `data` readable for `count` floats.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_ingest_block_sums(
    h2o: *mut KvcH2o,
    layer: usize,
    data: *const f32,
    count: usize,
) -> KvcStatus {
    // SAFETY: forwarded contract.
    unsafe {
        ingest(
            "kvc_h2o_ingest_block_sums",
            Ingest::BlockSums,
            h2o,
            layer,
            data,
            count,
        )
    }
}

/// Adds a block-local softmax tile as a flash-attention loop sees it: `n_rows` query rows
/// of query head `head`, row `r` being `rows[r * row_stride ..][.. n_keys]` (`rows_count`
/// floats in all), over keys `first_key .. first_key + n_keys` of the call. Indices out of
/// range or too few floats are `KVC_INVALID_ARGUMENT`.
///
/// Ownership: `rows` is only read during the call. Threads: exclusive use of `h2o`.
///
/// # Safety
/// `h2o` live; `rows` readable for `rows_count` floats.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_h2o_ingest_softmax_tile(
    h2o: *mut KvcH2o,
    layer: usize,
    head: usize,
    first_key: usize,
    n_keys: usize,
    rows: *const f32,
    rows_count: usize,
    n_rows: usize,
    row_stride: usize,
) -> KvcStatus {
    status_boundary("kvc_h2o_ingest_softmax_tile", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(h2o, "h2o") }?;
        // SAFETY: caller contract.
        let rows = unsafe { in_slice(rows, rows_count, "rows") }?;
        check_layer(&h.policy, layer)?;
        h.policy.ingest_softmax_tile(
            layer,
            SoftmaxTile {
                head,
                first_key,
                n_keys,
                rows,
                n_rows,
                row_stride,
            },
        )?;
        Ok(())
    })
}

/// Closes the open call of `layer`: updates the EMA scores and, when the layer triggers,
/// makes a plan (then pending). Stores the decision in `*decision` unless it is NULL.
/// Non-finite or negative sums are `KVC_INVALID_ARGUMENT` (the call is discarded, scores
/// unchanged); no open call is `KVC_INVALID_STATE`.
///
/// Threads: exclusive use of `h2o`.
///
/// # Safety
/// `h2o` live; `decision` NULL or writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_end_call(
    h2o: *mut KvcH2o,
    layer: usize,
    decision: *mut KvcH2oDecision,
) -> KvcStatus {
    status_boundary("kvc_h2o_end_call", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(h2o, "h2o") }?;
        let decision = if decision.is_null() {
            None
        } else {
            // SAFETY: caller contract.
            Some(unsafe { out_ref(decision, "decision") }?)
        };
        check_layer(&h.policy, layer)?;
        let d = h.policy.end_call(layer)?;
        if let Some(out) = decision {
            *out = KvcH2oDecision {
                triggered: u32::from(d.triggered),
                kv_len: d.kv_len,
                kept_tokens: d.kept_tokens,
            };
        }
        Ok(())
    })
}

/// Describes the plan pending for `layer` (in the layer-uniform scope, the shared plan) in
/// `*out`; `out->pending` is 0 when there is none.
///
/// Threads: reads the handle only; may run concurrently with other `const` calls on it.
///
/// # Safety
/// `h2o` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_get_plan_info(
    h2o: *const KvcH2o,
    layer: usize,
    out: *mut KvcH2oPlanInfo,
) -> KvcStatus {
    status_boundary("kvc_h2o_get_plan_info", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(h2o, "h2o") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out, "out") }?;
        check_layer(&h.policy, layer)?;
        *out = h
            .policy
            .pending_plan(layer)
            .map_or_else(KvcH2oPlanInfo::default, |p| KvcH2oPlanInfo {
                pending: 1,
                n_groups: u32::try_from(p.n_groups()).unwrap_or(u32::MAX),
                kv_len: p.kv_len(),
                kept_tokens: p.kept_tokens(),
            });
        Ok(())
    })
}

/// Copies the reserve pairs of group `group` (0 unless scores are per KV head) of the
/// plan pending for `layer` into `pairs`: sorted, merged, inside the plan's kv_len. The
/// engine compacts its cache to these ranges before the layer's next call.
///
/// Size query: `pairs == NULL && capacity == 0` stores the pair count in `*n_pairs`. Too
/// small a capacity is `KVC_BUFFER_TOO_SMALL` with the count in `*n_pairs`. No pending
/// plan is `KVC_INVALID_STATE`; a group out of range is `KVC_INVALID_ARGUMENT`.
///
/// Threads: reads the handle only; may run concurrently with other `const` calls on it.
///
/// # Safety
/// `h2o` live; `pairs` writable for `capacity` pairs; `n_pairs` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_plan_pairs(
    h2o: *const KvcH2o,
    layer: usize,
    group: usize,
    pairs: *mut KvcReservePair,
    capacity: usize,
    n_pairs: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_h2o_plan_pairs", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(h2o, "h2o") }?;
        // SAFETY: caller contract.
        let n_pairs = unsafe { out_ref(n_pairs, "n_pairs") }?;
        check_layer(&h.policy, layer)?;
        let plan = h.policy.pending_plan(layer).ok_or(Error::Wrapped {
            status: KvcStatus::KVC_INVALID_STATE,
            message: format!("no plan is pending for layer {layer}"),
        })?;
        if group >= plan.n_groups() {
            return Err(Error::invalid(
                "group",
                format!("{group} is not below the plan's {} groups", plan.n_groups()),
            ));
        }
        let src = plan.group_pairs(group);
        if pairs.is_null() && capacity == 0 {
            *n_pairs = src.len();
            return Ok(());
        }
        // SAFETY: caller contract.
        let dst = unsafe { out_slice(pairs, capacity, "pairs") }?;
        let Some(dst) = dst.get_mut(..src.len()) else {
            *n_pairs = src.len();
            return Err(Error::BufferTooSmall {
                argument: "pairs",
                needed: src.len(),
                capacity,
            });
        };
        for (d, s) in dst.iter_mut().zip(src) {
            *d = KvcReservePair {
                offset: s.offset,
                length: s.length,
            };
        }
        *n_pairs = src.len();
        Ok(())
    })
}

/// Whole-model counters in `*out`.
///
/// Threads: reads the handle only; may run concurrently with other `const` calls on it.
///
/// # Safety
/// `h2o` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_get_metrics(
    h2o: *const KvcH2o,
    out: *mut KvcH2oMetrics,
) -> KvcStatus {
    status_boundary("kvc_h2o_get_metrics", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(h2o, "h2o") }?;
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = h.policy.metrics().into();
        Ok(())
    })
}

/// One layer's counters in `*out` (`managed_layers` is 1 for a managed layer, else 0).
/// A layer out of range is `KVC_INVALID_ARGUMENT`.
///
/// Threads: reads the handle only; may run concurrently with other `const` calls on it.
///
/// # Safety
/// `h2o` live; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_h2o_get_layer_metrics(
    h2o: *const KvcH2o,
    layer: usize,
    out: *mut KvcH2oMetrics,
) -> KvcStatus {
    status_boundary("kvc_h2o_get_layer_metrics", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(h2o, "h2o") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out, "out") }?;
        check_layer(&h.policy, layer)?;
        *out = h.policy.layer_metrics(layer).into();
        Ok(())
    })
}

/// Frees a policy; NULL is a no-op.
///
/// Ownership: the handle is invalid afterwards. Threads: no other call may be using it.
///
/// # Safety
/// `h2o` must be NULL or a live handle from `kvc_h2o_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_h2o_free(h2o: *mut KvcH2o) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(h2o) })
}
