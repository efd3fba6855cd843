//! Deciding which blocks a layer keeps: protection, target, floor, block rounding, greedy
//! selection, merged reserve pairs (MNN report, section 3.4).

use crate::config::{H2oConfig, Selection};
use crate::error::{Error, Result};

/// One kept token range `[offset, offset + length)`, in tokens of the cache before
/// compaction. Plain `repr(C)` so that `kvc-cache` and C engines can read it directly.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ReservePair {
    /// First kept token.
    pub offset: u32,
    /// Number of kept tokens from `offset` on.
    pub length: u32,
}

/// What a layer keeps when the plan is applied: reserve pairs, sorted, merged (no two touch)
/// and inside `kv_len`. With one score per KV head there is one list of pairs per KV head
/// ("group"), all keeping the same number of tokens; otherwise there is one group.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReservePlan {
    kv_len: usize,
    kept_tokens: usize,
    pairs: Vec<ReservePair>,
    /// `group_starts[g]..group_starts[g + 1]` are group g's pairs.
    group_starts: Vec<usize>,
}

impl ReservePlan {
    /// The cache length the plan was made for.
    pub fn kv_len(&self) -> usize {
        self.kv_len
    }

    /// Tokens kept (per group; every group keeps the same count).
    pub fn kept_tokens(&self) -> usize {
        self.kept_tokens
    }

    /// Tokens evicted (per group).
    pub fn evicted_tokens(&self) -> usize {
        self.kv_len - self.kept_tokens
    }

    /// Number of groups: 1, or the KV head count with per-KV-head scores.
    pub fn n_groups(&self) -> usize {
        self.group_starts.len().saturating_sub(1)
    }

    /// The pairs of group 0: the whole plan unless scores are per KV head.
    pub fn pairs(&self) -> &[ReservePair] {
        self.group_pairs(0)
    }

    /// The pairs of group `group` (empty when out of range).
    pub fn group_pairs(&self, group: usize) -> &[ReservePair] {
        match (
            self.group_starts.get(group),
            self.group_starts.get(group + 1),
        ) {
            (Some(&s), Some(&e)) => &self.pairs[s..e],
            _ => &[],
        }
    }

    pub(crate) fn clear(&mut self, kv_len: usize) {
        self.kv_len = kv_len;
        self.kept_tokens = 0;
        self.pairs.clear();
        self.group_starts.clear();
        self.group_starts.push(0);
    }

    pub(crate) fn push_group(&mut self, pairs: impl Iterator<Item = ReservePair>, kept: usize) {
        self.pairs.extend(pairs);
        self.group_starts.push(self.pairs.len());
        self.kept_tokens = kept;
    }
}

/// Reusable scratch for planning, so that planning in steady state does not allocate.
#[derive(Clone, Debug, Default)]
pub(crate) struct Planner {
    keep: Vec<bool>,
    order: Vec<(f32, u32)>,
}

/// The budget of one plan, before any block is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Tokens in protected (sink and recent) blocks.
    pub protected: usize,
    /// `ceil(kv_len / ratio)`.
    pub target: usize,
}

/// Number of blocks of `block` tokens covering `kv_len` tokens.
pub(crate) fn block_count(kv_len: usize, block: usize) -> usize {
    kv_len.div_ceil(block)
}

/// Tokens in block `i` of a `kv_len`-token cache.
fn block_len(i: usize, block: usize, kv_len: usize) -> usize {
    block.min(kv_len - i * block)
}

/// `ceil(kv_len / ratio)`, computed in f64 from the f32 ratio (exact for the integer part
/// of any `kv_len` below 2^52). MNN computes `ceil((1 / ratio) * kv_len)` in f32, which
/// rounds up one token more in rare cases; kvc follows the exact formula.
pub(crate) fn target_tokens(kv_len: usize, ratio: f32) -> usize {
    let t = (kv_len as f64 / f64::from(ratio)).ceil();
    (t as usize).min(kv_len)
}

impl Planner {
    /// Marks protected blocks in `self.keep` and returns the budget.
    fn protect(&mut self, cfg: &H2oConfig, kv_len: usize) -> Budget {
        let block = cfg.block_tokens as usize;
        let n_blocks = block_count(kv_len, block);
        self.keep.clear();
        self.keep.resize(n_blocks, false);
        let sink_end = (cfg.sink_tokens as usize).min(kv_len);
        for k in &mut self.keep[..block_count(sink_end, block)] {
            *k = true;
        }
        let recent = (cfg.recent_tokens as usize).min(kv_len);
        if recent > 0 {
            let first = (kv_len - recent) / block;
            for k in &mut self.keep[first..] {
                *k = true;
            }
        }
        let protected = (0..n_blocks)
            .filter(|&i| self.keep[i])
            .map(|i| block_len(i, block, kv_len))
            .sum();
        Budget {
            protected,
            target: target_tokens(kv_len, cfg.target_lossy_ratio),
        }
    }

    /// Plans one group from its per-block scores (`scores.len()` = block count). Appends
    /// the group's merged pairs to `out` and returns the kept token count, or `None` when
    /// the floor dominates (protected >= target) and there is no plan.
    pub(crate) fn plan_group(
        &mut self,
        cfg: &H2oConfig,
        kv_len: usize,
        scores: &[f32],
        out: &mut ReservePlan,
    ) -> Option<usize> {
        let block = cfg.block_tokens as usize;
        let n_blocks = block_count(kv_len, block);
        debug_assert_eq!(scores.len(), n_blocks);
        let budget = self.protect(cfg, kv_len);
        if budget.protected >= budget.target {
            return None;
        }
        let need_blocks = (budget.target - budget.protected).div_ceil(block);
        let quantized = (budget.protected + need_blocks * block).min(kv_len);
        self.order.clear();
        self.order.extend(
            (0..n_blocks)
                .filter(|&i| !self.keep[i])
                .map(|i| (scores[i], i as u32)),
        );
        // At most `need_blocks + 1` candidates are taken (one may be the partial last
        // block), so only those are selected and sorted.
        let take = (need_blocks + 1).min(self.order.len());
        match cfg.selection {
            // Descending score; equal scores: lower block index first. `total_cmp` makes the
            // order total, so the result never depends on the sort algorithm.
            Selection::HeavyHitters => {
                let by_score =
                    |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
                if take > 0 && take < self.order.len() {
                    self.order.select_nth_unstable_by(take - 1, by_score);
                }
                self.order[..take].sort_unstable_by(by_score);
            }
            Selection::StreamingLlm => self.order.sort_unstable_by_key(|b| std::cmp::Reverse(b.1)),
        }
        self.order.truncate(take);
        let mut kept = budget.protected;
        for &(_, i) in &self.order {
            if kept >= quantized {
                break;
            }
            self.keep[i as usize] = true;
            kept += block_len(i as usize, block, kv_len);
        }
        let keep = &self.keep;
        out.push_group(merged_runs(keep, block, kv_len), kept);
        Some(kept)
    }
}

/// The runs of kept blocks as token ranges, in order.
fn merged_runs(
    keep: &[bool],
    block: usize,
    kv_len: usize,
) -> impl Iterator<Item = ReservePair> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < keep.len() && !keep[i] {
            i += 1;
        }
        if i == keep.len() {
            return None;
        }
        let start = i;
        while i < keep.len() && keep[i] {
            i += 1;
        }
        let offset = start * block;
        let end = (i * block).min(kv_len);
        // kv_len <= u32::MAX is checked when a call begins or a plan is requested.
        Some(ReservePair {
            offset: offset as u32,
            length: (end - offset) as u32,
        })
    })
}

/// The largest `kv_len` a plan can describe (pairs are `u32`).
pub const MAX_KV_LEN: usize = u32::MAX as usize;

/// Plans one layer from its per-block EMA scores, without any state: what the policy does
/// when a layer triggers. Returns `None` when the protected tokens already reach the
/// target (no plan).
///
/// `block_scores.len()` must be `ceil(kv_len / block_tokens)`.
pub fn plan_reserve(
    config: &H2oConfig,
    kv_len: usize,
    block_scores: &[f32],
) -> Result<Option<ReservePlan>> {
    config.validate()?;
    if kv_len == 0 || kv_len > MAX_KV_LEN {
        return Err(Error::InvalidShape {
            field: "kv_len",
            reason: format!("must be in 1..={MAX_KV_LEN}, found {kv_len}"),
        });
    }
    let n_blocks = block_count(kv_len, config.block_tokens as usize);
    if block_scores.len() != n_blocks {
        return Err(Error::WrongLength {
            what: "block_scores",
            expected: n_blocks,
            found: block_scores.len(),
        });
    }
    let mut planner = Planner::default();
    let mut plan = ReservePlan::default();
    plan.clear(kv_len);
    Ok(planner
        .plan_group(config, kv_len, block_scores, &mut plan)
        .map(|_| plan))
}
