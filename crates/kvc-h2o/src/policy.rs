//! The stateful policy: per-layer scores, the EMA, the trigger and the double-buffered
//! plan, driven one attention call at a time.

use crate::accumulate::{add_rows, fold_lanes, Kernel, Lanes, Rows, Target, LANES};
use crate::config::{H2oConfig, PlanScope, ScoreGranularity};
use crate::error::{Error, Result};
use crate::metrics::{H2oMetrics, LayerMetrics};
use crate::plan::{block_count, Planner, ReservePlan, MAX_KV_LEN};

/// The shape of one attention call of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallShape {
    /// Tokens attended to, this call's new tokens included (`1..=u32::MAX`).
    pub kv_len: usize,
    /// Query rows of the call: its new tokens (`1..=kv_len`).
    pub n_queries: usize,
    /// Query heads (at least 1).
    pub n_heads: usize,
    /// KV heads; must divide `n_heads` (GQA groups of `n_heads / n_kv_heads`).
    pub n_kv_heads: usize,
}

/// A block-local softmax tile: `n_rows` query rows of head `head`, row `r` being
/// `rows[r * row_stride..][..n_keys]`, over keys `first_key..first_key + n_keys` of the
/// call (MNN's `qkSoftmax` with its first global key index `i * mBlockKV`).
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxTile<'a> {
    /// Query head of the tile.
    pub head: usize,
    /// Global index of the tile's first key.
    pub first_key: usize,
    /// Keys per row.
    pub n_keys: usize,
    /// The probabilities.
    pub rows: &'a [f32],
    /// Query rows (at most the call's `n_queries`).
    pub n_rows: usize,
    /// Distance between rows, in elements (at least `n_keys` when `n_rows > 1`).
    pub row_stride: usize,
}

/// What happened to the layer's pending plan when a call began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanResolution {
    /// There was no pending plan.
    NoPlan,
    /// The call's `kv_len` was `kept + n_queries`: the plan counts as applied and the
    /// scores moved with their blocks.
    Applied,
    /// The call's `kv_len` did not match: the plan was dropped.
    Dropped,
}

/// What [`H2oPolicy::end_call`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDecision {
    /// Whether a plan was made; it is then pending ([`H2oPolicy::pending_plan`]) and the
    /// engine applies it before this layer's next call (every layer's, in the
    /// layer-uniform scope).
    pub triggered: bool,
    /// The call's `kv_len`.
    pub kv_len: usize,
    /// Tokens the layer keeps: the plan's count, or `kv_len` without a plan.
    pub kept_tokens: usize,
}

#[derive(Clone, Copy, Debug)]
struct OpenCall {
    shape: CallShape,
    managed: bool,
    /// Score groups of the call (1, or `n_kv_heads`).
    groups: usize,
    /// Query heads per score group.
    heads_per_group: usize,
    lanes_used: bool,
}

#[derive(Clone, Debug, Default)]
struct LayerState {
    /// EMA scores, `[n_blocks][n_groups]`.
    scores: Vec<f32>,
    n_groups: usize,
    known_tokens: usize,
    calls: u64,
    last_plan_call: Option<u64>,
    pending: bool,
    plan: ReservePlan,
    evicted_total: u64,
    metrics: LayerMetrics,
    open: Option<OpenCall>,
    /// This call's block sums, `[n_blocks][n_groups]`.
    acc: Vec<f32>,
    lanes: Vec<Lanes>,
}

#[derive(Clone, Debug, Default)]
struct UniformState {
    pending: bool,
    plan: ReservePlan,
    calls: u64,
    last_plan_call: Option<u64>,
    plans_made: u64,
    plans_applied: u64,
    plans_dropped: u64,
}

/// The H2O policy for one model: state per layer, fed one attention call at a time.
///
/// A call is `begin_call`, any number of ingestions (all adding into the same block sums),
/// then `end_call`, which updates the EMA and may make a plan. Calls of different layers
/// may interleave; layers outside the managed range pass through untouched.
#[derive(Clone, Debug)]
pub struct H2oPolicy {
    config: H2oConfig,
    layers: Vec<LayerState>,
    uniform: UniformState,
    planner: Planner,
    gather: Vec<f32>,
    kernel: Kernel,
}

fn shape_err(field: &'static str, reason: String) -> Error {
    Error::InvalidShape { field, reason }
}

impl H2oPolicy {
    /// A policy for a model of `n_layers` layers (at least 1).
    pub fn new(config: H2oConfig, n_layers: usize) -> Result<Self> {
        config.validate()?;
        if n_layers == 0 {
            return Err(shape_err("n_layers", "must be at least 1, found 0".into()));
        }
        let mut layers = Vec::new();
        layers.resize_with(n_layers, LayerState::default);
        for (i, l) in layers.iter_mut().enumerate() {
            l.metrics.managed = config.manages(i);
        }
        Ok(H2oPolicy {
            config,
            layers,
            uniform: UniformState::default(),
            planner: Planner::default(),
            gather: Vec::new(),
            kernel: Kernel::detect(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &H2oConfig {
        &self.config
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether `layer` is managed (in range and in `[layer_start, layer_end]`).
    pub fn is_managed(&self, layer: usize) -> bool {
        layer < self.layers.len() && self.config.manages(layer)
    }

    /// The last managed layer, if any layer is managed.
    fn last_managed(&self) -> Option<usize> {
        let end = self.config.layer_end.map_or(self.layers.len() - 1, |e| {
            (e as usize).min(self.layers.len() - 1)
        });
        (end >= self.config.layer_start as usize).then_some(end)
    }

    #[cfg(test)]
    pub(crate) fn set_kernel(&mut self, kernel: Kernel) {
        self.kernel = kernel;
    }

    fn layer_mut(&mut self, layer: usize) -> Result<&mut LayerState> {
        let n_layers = self.layers.len();
        self.layers
            .get_mut(layer)
            .ok_or(Error::LayerOutOfRange { layer, n_layers })
    }

    /// Opens a call of `layer`: resolves the pending plan (applied iff
    /// `kv_len == kept + n_queries`, else dropped), then sizes the block sums.
    pub fn begin_call(&mut self, layer: usize, shape: CallShape) -> Result<PlanResolution> {
        validate_shape(&shape)?;
        let managed = self.is_managed(layer);
        let granularity = self.config.granularity;
        let scope = self.config.scope;
        let st = self.layer_mut(layer)?;
        if st.open.is_some() {
            return Err(Error::CallAlreadyOpen { layer });
        }
        let groups = match granularity {
            ScoreGranularity::PerLayer => 1,
            ScoreGranularity::PerKvHead => shape.n_kv_heads,
        };
        let open = OpenCall {
            shape,
            managed,
            groups,
            heads_per_group: shape.n_heads / groups,
            lanes_used: false,
        };
        if !managed {
            st.open = Some(open);
            st.metrics.cached_tokens = shape.kv_len as u64;
            st.metrics.logical_tokens = shape.kv_len as u64;
            return Ok(PlanResolution::NoPlan);
        }
        if st.n_groups != 0 && st.n_groups != groups && st.known_tokens > 0 {
            return Err(shape_err(
                "n_kv_heads",
                format!(
                    "layer {layer} keeps {} score groups, this call has {groups}",
                    st.n_groups
                ),
            ));
        }
        let block = self.config.block_tokens as usize;
        let resolution = match scope {
            PlanScope::PerLayer => resolve_layer(&mut self.layers[layer], &shape, block),
            PlanScope::LayerUniform => self.resolve_uniform(&shape, block),
        };
        let st = &mut self.layers[layer];
        if shape.kv_len < st.known_tokens {
            st.scores.clear();
            st.known_tokens = 0;
            st.evicted_total = 0;
            st.metrics.resets += 1;
        }
        let n = block_count(shape.kv_len, block) * groups;
        let oom = |_| Error::OutOfMemory { layer, elements: n };
        st.scores
            .try_reserve(n.saturating_sub(st.scores.len()))
            .map_err(oom)?;
        st.acc.clear();
        st.acc.try_reserve(n).map_err(oom)?;
        st.scores.resize(n, 0.0);
        st.n_groups = groups;
        st.acc.resize(n, 0.0);
        st.open = Some(open);
        Ok(resolution)
    }

    fn resolve_uniform(&mut self, shape: &CallShape, block: usize) -> PlanResolution {
        let u = &mut self.uniform;
        if !u.pending {
            return PlanResolution::NoPlan;
        }
        u.pending = false;
        if Some(shape.kv_len) != u.plan.kept_tokens().checked_add(shape.n_queries) {
            u.plans_dropped += 1;
            return PlanResolution::Dropped;
        }
        u.plans_applied += 1;
        for (i, st) in self.layers.iter_mut().enumerate() {
            if self.config.manages(i) && st.known_tokens == u.plan.kv_len() {
                compact(st, &u.plan, block);
            }
        }
        PlanResolution::Applied
    }

    fn open_call(&mut self, layer: usize) -> Result<(OpenCall, &mut LayerState)> {
        let st = self.layer_mut(layer)?;
        let open = st.open.ok_or(Error::NoOpenCall { layer })?;
        Ok((open, st))
    }

    /// Adds a block-local softmax tile as a flash-attention loop sees it (see
    /// [`SoftmaxTile`]).
    pub fn ingest_softmax_tile(&mut self, layer: usize, tile: SoftmaxTile<'_>) -> Result<()> {
        let SoftmaxTile {
            head,
            first_key,
            n_keys,
            rows,
            n_rows,
            row_stride,
        } = tile;
        let kernel = self.kernel;
        let block = self.config.block_tokens as usize;
        let (open, st) = self.open_call(layer)?;
        let s = open.shape;
        if head >= s.n_heads {
            return Err(Error::IndexOutOfRange {
                what: "head",
                index: head,
                bound: s.n_heads,
            });
        }
        if n_rows > s.n_queries {
            return Err(Error::IndexOutOfRange {
                what: "n_rows",
                index: n_rows,
                bound: s.n_queries,
            });
        }
        if first_key > s.kv_len || n_keys > s.kv_len - first_key {
            return Err(Error::IndexOutOfRange {
                what: "first_key + n_keys",
                index: first_key.saturating_add(n_keys),
                bound: s.kv_len,
            });
        }
        if n_rows > 1 && row_stride < n_keys {
            return Err(shape_err(
                "row_stride",
                format!("must be >= n_keys ({n_keys}), found {row_stride}"),
            ));
        }
        let needed = if n_rows == 0 || n_keys == 0 {
            0
        } else {
            (n_rows - 1) * row_stride + n_keys
        };
        if rows.len() < needed {
            return Err(Error::WrongLength {
                what: "softmax tile",
                expected: needed,
                found: rows.len(),
            });
        }
        if needed == 0 || !open.managed {
            return Ok(());
        }
        let rows = Rows {
            data: rows,
            n_rows,
            stride: row_stride,
            len: n_keys,
            first_token: first_key,
            group_base: head / open.heads_per_group,
            rows_per_group: n_rows,
        };
        add_dense(st, layer, kernel, block, rows)
    }

    /// Adds full softmax probabilities `[n_heads][n_queries][kv_len]` of the call.
    pub fn ingest_probabilities(&mut self, layer: usize, probs: &[f32]) -> Result<()> {
        let kernel = self.kernel;
        let block = self.config.block_tokens as usize;
        let (open, st) = self.open_call(layer)?;
        let s = open.shape;
        let expected = s
            .n_heads
            .checked_mul(s.n_queries)
            .and_then(|x| x.checked_mul(s.kv_len))
            .ok_or_else(|| shape_err("n_heads * n_queries * kv_len", "overflows usize".into()))?;
        if probs.len() != expected {
            return Err(Error::WrongLength {
                what: "probabilities [n_heads][n_queries][kv_len]",
                expected,
                found: probs.len(),
            });
        }
        if !open.managed {
            return Ok(());
        }
        let rows = Rows {
            data: probs,
            n_rows: s.n_heads * s.n_queries,
            stride: s.kv_len,
            len: s.kv_len,
            first_token: 0,
            group_base: 0,
            rows_per_group: open.heads_per_group * s.n_queries,
        };
        add_dense(st, layer, kernel, block, rows)
    }

    /// Adds per-token column sums (probabilities summed over heads and queries): `[kv_len]`
    /// for the whole layer, or `[n_kv_heads][kv_len]` per KV head. The layer-wide form
    /// needs per-layer scores.
    pub fn ingest_column_sums(&mut self, layer: usize, sums: &[f32]) -> Result<()> {
        let kernel = self.kernel;
        let block = self.config.block_tokens as usize;
        let (open, st) = self.open_call(layer)?;
        let s = open.shape;
        let n_rows = if sums.len() == s.kv_len {
            1
        } else if Some(sums.len()) == s.kv_len.checked_mul(s.n_kv_heads) {
            s.n_kv_heads
        } else {
            return Err(Error::WrongLength {
                what: "column sums [kv_len] or [n_kv_heads][kv_len]",
                expected: s.kv_len.saturating_mul(s.n_kv_heads),
                found: sums.len(),
            });
        };
        if n_rows == 1 && open.groups > 1 && s.n_kv_heads > 1 {
            return Err(Error::Unsupported {
                reason: "layer-wide column sums cannot feed per-KV-head scores",
            });
        }
        if !open.managed {
            return Ok(());
        }
        let rows = Rows {
            data: sums,
            n_rows,
            stride: s.kv_len,
            len: s.kv_len,
            first_token: 0,
            group_base: 0,
            rows_per_group: if open.groups == 1 { n_rows } else { 1 },
        };
        add_dense(st, layer, kernel, block, rows)
    }

    /// Adds raw block sums (probabilities summed over heads, queries and the block's
    /// tokens): `[n_blocks]` per layer, or `[n_blocks][n_kv_heads]` with per-KV-head
    /// scores. This is what an offline trace records.
    pub fn ingest_block_sums(&mut self, layer: usize, sums: &[f32]) -> Result<()> {
        let block = self.config.block_tokens as usize;
        let (open, st) = self.open_call(layer)?;
        let expected = block_count(open.shape.kv_len, block) * open.groups;
        if sums.len() != expected {
            return Err(Error::WrongLength {
                what: "block sums",
                expected,
                found: sums.len(),
            });
        }
        if open.managed {
            for (a, &v) in st.acc.iter_mut().zip(sums) {
                *a += v;
            }
        }
        Ok(())
    }

    /// Closes the call: folds the block sums, updates the EMA of every block
    /// (`s = alpha * s + (1 - alpha) * acc / (heads * queries)`), and makes a plan when the
    /// layer triggers. On error (non-finite or negative sums) the call is discarded and the
    /// scores are unchanged.
    pub fn end_call(&mut self, layer: usize) -> Result<CallDecision> {
        let (open, _) = self.open_call(layer)?;
        let st = &mut self.layers[layer];
        st.open = None;
        let s = open.shape;
        let not_triggered = CallDecision {
            triggered: false,
            kv_len: s.kv_len,
            kept_tokens: s.kv_len,
        };
        if !open.managed {
            return Ok(not_triggered);
        }
        if open.lanes_used {
            fold_lanes(&st.lanes[..st.acc.len()], &mut st.acc);
        }
        if let Some((index, &value)) = st
            .acc
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(Error::InvalidScore {
                layer,
                index,
                value,
            });
        }
        let uniform_last =
            self.config.scope == PlanScope::LayerUniform && self.last_managed() == Some(layer);
        if uniform_last {
            let kv_len = s.kv_len;
            if let Some((other, st)) =
                self.layers.iter().enumerate().find(|(i, st)| {
                    *i != layer && self.config.manages(*i) && st.known_tokens != kv_len
                })
            {
                return Err(shape_err(
                    "kv_len",
                    format!(
                        "layer-uniform scope: layer {layer} has {kv_len} tokens, layer {other} {}",
                        st.known_tokens
                    ),
                ));
            }
        }
        let st = &mut self.layers[layer];
        let alpha = self.config.ema_alpha;
        let norm = (open.heads_per_group * s.n_queries).max(1) as f32;
        for (score, &a) in st.scores.iter_mut().zip(&st.acc) {
            let current = a / norm;
            *score = alpha * *score + (1.0 - alpha) * current;
        }
        st.known_tokens = s.kv_len;
        st.metrics.cached_tokens = s.kv_len as u64;
        st.metrics.logical_tokens = s.kv_len as u64 + st.evicted_total;
        let index = st.calls;
        st.calls += 1;
        match self.config.scope {
            PlanScope::PerLayer => {
                if !trigger(&self.config, s.kv_len, index, st.last_plan_call) {
                    return Ok(not_triggered);
                }
                st.plan.clear(s.kv_len);
                let groups = open.groups;
                let mut kept = None;
                for g in 0..groups {
                    let scores: &[f32] = if groups == 1 {
                        &st.scores
                    } else {
                        self.gather.clear();
                        self.gather
                            .extend(st.scores.iter().skip(g).step_by(groups).copied());
                        &self.gather
                    };
                    kept = self
                        .planner
                        .plan_group(&self.config, s.kv_len, scores, &mut st.plan);
                    if kept.is_none() {
                        break;
                    }
                }
                let Some(kept) = kept else {
                    return Ok(not_triggered);
                };
                st.pending = true;
                st.last_plan_call = Some(index);
                st.metrics.plans_made += 1;
                Ok(CallDecision {
                    triggered: true,
                    kv_len: s.kv_len,
                    kept_tokens: kept,
                })
            }
            PlanScope::LayerUniform => {
                if !uniform_last {
                    return Ok(not_triggered);
                }
                let u = &mut self.uniform;
                let index = u.calls;
                u.calls += 1;
                if !trigger(&self.config, s.kv_len, index, u.last_plan_call) {
                    return Ok(not_triggered);
                }
                let n_blocks = block_count(s.kv_len, self.config.block_tokens as usize);
                self.gather.clear();
                self.gather.resize(n_blocks, 0.0);
                for (i, l) in self.layers.iter().enumerate() {
                    if !self.config.manages(i) || l.n_groups == 0 {
                        continue;
                    }
                    for (b, chunk) in l.scores.chunks_exact(l.n_groups).enumerate() {
                        self.gather[b] += chunk.iter().sum::<f32>();
                    }
                }
                u.plan.clear(s.kv_len);
                let Some(kept) =
                    self.planner
                        .plan_group(&self.config, s.kv_len, &self.gather, &mut u.plan)
                else {
                    return Ok(not_triggered);
                };
                u.pending = true;
                u.last_plan_call = Some(index);
                u.plans_made += 1;
                Ok(CallDecision {
                    triggered: true,
                    kv_len: s.kv_len,
                    kept_tokens: kept,
                })
            }
        }
    }

    /// The plan the engine must apply to `layer` before its next call, if any (in the
    /// layer-uniform scope, the shared plan, for every layer).
    pub fn pending_plan(&self, layer: usize) -> Option<&ReservePlan> {
        match self.config.scope {
            PlanScope::PerLayer => self
                .layers
                .get(layer)
                .filter(|l| l.pending)
                .map(|l| &l.plan),
            PlanScope::LayerUniform => {
                (layer < self.layers.len() && self.uniform.pending).then_some(&self.uniform.plan)
            }
        }
    }

    /// The layer's EMA scores, `[n_blocks][n_groups]` (n_groups = 1 with per-layer
    /// scores); empty for an unmanaged layer or one never called.
    pub fn scores(&self, layer: usize) -> &[f32] {
        self.layers.get(layer).map_or(&[], |l| {
            let n = block_count(l.known_tokens, self.config.block_tokens as usize) * l.n_groups;
            &l.scores[..n.min(l.scores.len())]
        })
    }

    /// One layer's counters (default values for an out-of-range layer).
    pub fn layer_metrics(&self, layer: usize) -> LayerMetrics {
        self.layers
            .get(layer)
            .map_or_else(LayerMetrics::default, |l| l.metrics)
    }

    /// Whole-model counters.
    pub fn metrics(&self) -> H2oMetrics {
        let mut m = H2oMetrics {
            plans_made: self.uniform.plans_made,
            plans_applied: self.uniform.plans_applied,
            plans_dropped: self.uniform.plans_dropped,
            ..H2oMetrics::default()
        };
        for l in self.layers.iter().filter(|l| l.metrics.managed) {
            let lm = &l.metrics;
            m.managed_layers += 1;
            m.cached_tokens += lm.cached_tokens;
            m.logical_tokens += lm.logical_tokens;
            m.plans_made += lm.plans_made;
            m.plans_applied += lm.plans_applied;
            m.plans_dropped += lm.plans_dropped;
            m.resets += lm.resets;
        }
        m
    }
}

fn validate_shape(s: &CallShape) -> Result<()> {
    if s.kv_len == 0 || s.kv_len > MAX_KV_LEN {
        return Err(shape_err(
            "kv_len",
            format!("must be in 1..={MAX_KV_LEN}, found {}", s.kv_len),
        ));
    }
    if s.n_queries == 0 || s.n_queries > s.kv_len {
        return Err(shape_err(
            "n_queries",
            format!(
                "must be in 1..=kv_len ({}), found {}",
                s.kv_len, s.n_queries
            ),
        ));
    }
    if s.n_heads == 0 {
        return Err(shape_err("n_heads", "must be at least 1, found 0".into()));
    }
    // The EMA divides by heads * queries: that product must exist.
    if s.n_heads.checked_mul(s.n_queries).is_none() {
        return Err(shape_err(
            "n_heads",
            format!(
                "n_heads ({}) * n_queries ({}) overflows usize",
                s.n_heads, s.n_queries
            ),
        ));
    }
    if s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) {
        return Err(shape_err(
            "n_kv_heads",
            format!(
                "must divide n_heads ({}), found {}",
                s.n_heads, s.n_kv_heads
            ),
        ));
    }
    Ok(())
}

/// `kv_len >= trigger_min` and (never planned, or at least `update_interval` calls since
/// the call that made the last plan).
fn trigger(cfg: &H2oConfig, kv_len: usize, index: u64, last: Option<u64>) -> bool {
    kv_len >= cfg.trigger_min_tokens as usize
        && last.is_none_or(|l| index - l >= u64::from(cfg.update_interval))
}

fn resolve_layer(st: &mut LayerState, shape: &CallShape, block: usize) -> PlanResolution {
    if !st.pending {
        return PlanResolution::NoPlan;
    }
    st.pending = false;
    if Some(shape.kv_len) != st.plan.kept_tokens().checked_add(shape.n_queries)
        || st.known_tokens != st.plan.kv_len()
    {
        st.metrics.plans_dropped += 1;
        return PlanResolution::Dropped;
    }
    st.metrics.plans_applied += 1;
    let plan = std::mem::take(&mut st.plan);
    compact(st, &plan, block);
    st.plan = plan;
    PlanResolution::Applied
}

/// Moves the scores of kept blocks to their compacted positions: compacted block `i` is
/// the `i`-th kept block (every kept block but the last is whole). With one plan group and
/// several score groups, every score group follows the one plan.
fn compact(st: &mut LayerState, plan: &ReservePlan, block: usize) {
    let groups = st.n_groups.max(1);
    for g in 0..groups {
        let pairs = if plan.n_groups() == 1 {
            plan.pairs()
        } else {
            plan.group_pairs(g)
        };
        let mut dst = 0;
        for p in pairs {
            let first = p.offset as usize / block;
            let end = (p.offset as usize + p.length as usize).div_ceil(block);
            for src in first..end {
                st.scores[dst * groups + g] = st.scores[src * groups + g];
                dst += 1;
            }
        }
    }
    st.scores
        .truncate(block_count(plan.kept_tokens(), block) * groups);
    st.evicted_total += plan.evicted_tokens() as u64;
    st.known_tokens = plan.kept_tokens();
}

fn add_dense(
    st: &mut LayerState,
    layer: usize,
    kernel: Kernel,
    block: usize,
    rows: Rows<'_>,
) -> Result<()> {
    let Some(open) = st.open.as_mut() else {
        return Ok(());
    };
    let groups = open.groups;
    if !open.lanes_used {
        st.lanes.clear();
        st.lanes
            .try_reserve(st.acc.len())
            .map_err(|_| Error::OutOfMemory {
                layer,
                elements: st.acc.len() * LANES,
            })?;
        st.lanes.resize(st.acc.len(), [0.0; LANES]);
        open.lanes_used = true;
    }
    let mut target = Target {
        lanes: &mut st.lanes[..st.acc.len()],
        n_groups: groups,
        block,
    };
    add_rows(kernel, rows, &mut target);
    Ok(())
}
