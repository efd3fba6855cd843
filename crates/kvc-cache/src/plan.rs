//! Reserve plans: which token spans survive a compaction, and where tokens go.

use crate::error::{Error, Result};

/// Validated reserve pairs: sorted, disjoint, non-empty `(offset, length)` token spans
/// within `[0, len)`. Tokens outside every span are dropped; kept tokens keep their order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservePlan {
    spans: Vec<(usize, usize)>,
    len: usize,
    kept: usize,
}

impl ReservePlan {
    /// Validates `spans` against a cache currently holding `len` tokens.
    pub fn new(spans: &[(usize, usize)], len: usize) -> Result<ReservePlan> {
        let mut prev_end = 0usize;
        let mut kept = 0usize;
        for (i, &(offset, length)) in spans.iter().enumerate() {
            let bad = |reason| Error::InvalidPlan {
                span: i,
                offset,
                length,
                reason,
            };
            if length == 0 {
                return Err(bad("empty span"));
            }
            let end = offset
                .checked_add(length)
                .ok_or_else(|| bad("offset + length overflows"))?;
            if end > len {
                return Err(bad("span ends past the current length"));
            }
            if i > 0 && offset < prev_end {
                return Err(bad("spans must be sorted and disjoint"));
            }
            prev_end = end;
            kept += length;
        }
        Ok(ReservePlan {
            spans: spans.to_vec(),
            len,
            kept,
        })
    }

    /// MNN's `onRealloc` contract: `start = past_len - remove` tokens stay, and
    /// `reserve = [begin0, size0, begin1, size1, ...]` (offsets relative to `start`)
    /// are kept out of the removed tail.
    pub fn from_mnn(past_len: usize, remove: usize, reserve: &[i32]) -> Result<ReservePlan> {
        let start = past_len.checked_sub(remove).ok_or(Error::InvalidRange {
            start: remove,
            end: past_len,
            limit: past_len,
        })?;
        if !reserve.len().is_multiple_of(2) {
            return Err(Error::InvalidPlan {
                span: reserve.len() / 2,
                offset: 0,
                length: 0,
                reason: "reserve has an odd number of ints",
            });
        }
        let mut spans = Vec::with_capacity(reserve.len() / 2 + 1);
        if start > 0 {
            spans.push((0, start));
        }
        for (i, p) in reserve.chunks_exact(2).enumerate() {
            let (b, s) = (p[0], p[1]);
            if b < 0 || s < 0 {
                return Err(Error::InvalidPlan {
                    span: i,
                    offset: b.max(0) as usize,
                    length: s.max(0) as usize,
                    reason: "negative begin or size",
                });
            }
            let off = start.checked_add(b as usize).ok_or(Error::SizeOverflow {
                what: "reserve offset",
            })?;
            spans.push((off, s as usize));
        }
        ReservePlan::new(&spans, past_len)
    }

    /// Keeps every token where `keep[t]` is true (`len = keep.len()`).
    pub fn from_mask(keep: &[bool]) -> ReservePlan {
        let mut spans = Vec::new();
        let mut t = 0;
        while t < keep.len() {
            if keep[t] {
                let s = t;
                while t < keep.len() && keep[t] {
                    t += 1;
                }
                spans.push((s, t - s));
            } else {
                t += 1;
            }
        }
        let kept = spans.iter().map(|s| s.1).sum();
        ReservePlan {
            spans,
            len: keep.len(),
            kept,
        }
    }

    /// kvc-h2o reserve pairs, validated against a cache of `len` tokens (the plan's
    /// `kv_len`).
    pub fn from_h2o_pairs(pairs: &[kvc_h2o::ReservePair], len: usize) -> Result<ReservePlan> {
        let spans: Vec<(usize, usize)> = pairs
            .iter()
            .map(|p| (p.offset as usize, p.length as usize))
            .collect();
        ReservePlan::new(&spans, len)
    }

    /// Group `group` (a KV head) of a kvc-h2o plan, as made with one score per KV head;
    /// compact each head by its own plan with [`compact_heads`](crate::compact_heads).
    pub fn from_h2o_group(plan: &kvc_h2o::ReservePlan, group: usize) -> Result<ReservePlan> {
        if group >= plan.n_groups() {
            return Err(Error::InvalidRange {
                start: group,
                end: group.saturating_add(1),
                limit: plan.n_groups(),
            });
        }
        ReservePlan::from_h2o_pairs(plan.group_pairs(group), plan.kv_len())
    }

    /// Every group of a kvc-h2o plan, one plan per KV head.
    pub fn from_h2o_groups(plan: &kvc_h2o::ReservePlan) -> Result<Vec<ReservePlan>> {
        (0..plan.n_groups())
            .map(|g| ReservePlan::from_h2o_group(plan, g))
            .collect()
    }

    /// The spans.
    pub fn spans(&self) -> &[(usize, usize)] {
        &self.spans
    }
    /// Tokens before compaction.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the plan applies to an empty cache.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Tokens after compaction.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// `(src, dst, n)` moves, in an order safe for in-place execution (`dst <= src`,
    /// ascending); moves with `src == dst` are skipped.
    pub fn moves(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let mut dst = 0usize;
        self.spans.iter().filter_map(move |&(off, n)| {
            let d = dst;
            dst += n;
            (off != d).then_some((off, d, n))
        })
    }

    /// The old -> new token index map of this plan.
    pub fn index_map(&self) -> IndexMap {
        let mut map = vec![IndexMap::DROPPED; self.len];
        let mut dst = 0u32;
        for &(off, n) in &self.spans {
            for m in &mut map[off..off + n] {
                *m = dst;
                dst += 1;
            }
        }
        IndexMap {
            map,
            new_len: self.kept,
        }
    }
}

/// A kvc-h2o plan of one group (scores per layer, the default): its pairs as a kvc-cache
/// plan for its `kv_len`. A plan with one group per KV head is refused with
/// [`Error::GroupedPlan`]; use [`ReservePlan::from_h2o_groups`] for those.
impl TryFrom<&kvc_h2o::ReservePlan> for ReservePlan {
    type Error = Error;

    fn try_from(plan: &kvc_h2o::ReservePlan) -> Result<ReservePlan> {
        match plan.n_groups() {
            0 => ReservePlan::new(&[], plan.kv_len()),
            1 => ReservePlan::from_h2o_pairs(plan.pairs(), plan.kv_len()),
            groups => Err(Error::GroupedPlan { groups }),
        }
    }
}

/// Where each old token index went: `map[old] = new`, or [`IndexMap::DROPPED`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexMap {
    map: Vec<u32>,
    new_len: usize,
}

impl IndexMap {
    /// The marker of a dropped token.
    pub const DROPPED: u32 = u32::MAX;

    /// The new index of old token `old`, if it was kept.
    pub fn get(&self, old: usize) -> Option<usize> {
        self.map
            .get(old)
            .and_then(|&m| (m != Self::DROPPED).then_some(m as usize))
    }
    /// The raw map (`DROPPED` for dropped tokens), one entry per old token.
    pub fn as_slice(&self) -> &[u32] {
        &self.map
    }
    /// Tokens before.
    pub fn old_len(&self) -> usize {
        self.map.len()
    }
    /// Tokens after.
    pub fn new_len(&self) -> usize {
        self.new_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(ReservePlan::new(&[(0, 2), (2, 3)], 5).is_ok());
        assert!(ReservePlan::new(&[], 5).unwrap().kept() == 0);
        for (spans, len) in [
            (vec![(0, 0)], 5),
            (vec![(3, 3)], 5),
            (vec![(2, 1), (1, 1)], 5),
            (vec![(0, 2), (1, 2)], 5),
            (vec![(usize::MAX, 2)], 5),
        ] {
            let e = ReservePlan::new(&spans, len).unwrap_err();
            assert!(matches!(e, Error::InvalidPlan { .. }), "{spans:?}");
        }
    }

    #[test]
    fn mnn_meta() {
        let p = ReservePlan::from_mnn(10, 6, &[1, 2, 4, 1]).unwrap();
        assert_eq!(p.spans(), &[(0, 4), (5, 2), (8, 1)]);
        assert_eq!(p.kept(), 7);
        assert!(ReservePlan::from_mnn(4, 6, &[]).is_err());
        assert!(ReservePlan::from_mnn(10, 6, &[1]).is_err());
        assert!(ReservePlan::from_mnn(10, 6, &[-1, 2]).is_err());
        assert!(ReservePlan::from_mnn(10, 6, &[5, 2]).is_err());
    }

    #[test]
    fn map_and_mask() {
        let p = ReservePlan::from_mask(&[false, true, true, false, true]);
        assert_eq!(p.spans(), &[(1, 2), (4, 1)]);
        let m = p.index_map();
        assert_eq!(
            m.as_slice(),
            &[IndexMap::DROPPED, 0, 1, IndexMap::DROPPED, 2]
        );
        assert_eq!(m.get(4), Some(2));
        assert_eq!(m.get(0), None);
        assert_eq!(m.new_len(), 3);
    }
}
