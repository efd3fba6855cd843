//! Property tests of the plan and of the double-buffered policy.

use kvc_h2o::{plan_reserve, CallShape, H2oConfig, H2oPolicy, PlanResolution, Selection};
use proptest::prelude::*;

fn config() -> impl Strategy<Value = H2oConfig> {
    (
        1u32..100,
        0u32..300,
        1u32..600,
        1.0f32..8.0,
        prop::bool::ANY,
    )
        .prop_map(|(block, sink, recent, ratio, streaming)| H2oConfig {
            block_tokens: block,
            sink_tokens: sink,
            recent_tokens: recent,
            target_lossy_ratio: ratio,
            selection: if streaming {
                Selection::StreamingLlm
            } else {
                Selection::HeavyHitters
            },
            ..H2oConfig::default()
        })
}

/// Protected token count, computed token by token: a block is protected iff it holds a
/// sink token or one of the last `recent` tokens.
fn protected_tokens(c: &H2oConfig, kv_len: usize) -> (Vec<bool>, usize) {
    let b = c.block_tokens as usize;
    let n_blocks = kv_len.div_ceil(b);
    let mut prot = vec![false; n_blocks];
    for t in 0..kv_len {
        if t < c.sink_tokens as usize || t + (c.recent_tokens as usize) >= kv_len {
            prot[t / b] = true;
        }
    }
    let tokens = (0..n_blocks)
        .filter(|&i| prot[i])
        .map(|i| b.min(kv_len - i * b))
        .sum();
    (prot, tokens)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn plan_properties(
        c in config(),
        kv_len in 1usize..6000,
        seed in any::<u64>(),
        ties in prop::bool::ANY,
    ) {
        let b = c.block_tokens as usize;
        let n_blocks = kv_len.div_ceil(b);
        let mut s = seed;
        let scores: Vec<f32> = (0..n_blocks)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                // Few distinct values when `ties`, so equal scores are common.
                if ties { ((s >> 60) % 3) as f32 } else { (s >> 40) as f32 / 16777216.0 }
            })
            .collect();
        let plan = plan_reserve(&c, kv_len, &scores).unwrap();
        // Deterministic.
        prop_assert_eq!(&plan, &plan_reserve(&c, kv_len, &scores).unwrap());
        let (prot, protected) = protected_tokens(&c, kv_len);
        let target = (kv_len as f64 / f64::from(c.target_lossy_ratio)).ceil() as usize;
        let Some(plan) = plan else {
            prop_assert!(protected >= target, "no plan but {} < {}", protected, target);
            return Ok(());
        };
        prop_assert!(protected < target);
        let quantized = (protected + (target - protected).div_ceil(b) * b).min(kv_len);
        prop_assert_eq!(plan.kept_tokens(), quantized);
        prop_assert_eq!(plan.kv_len(), kv_len);
        // Pairs: non-empty, sorted, merged (never touching), inside kv_len, block aligned.
        let pairs = plan.pairs();
        let mut kept = vec![false; kv_len];
        let mut prev_end: Option<usize> = None;
        let mut sum = 0;
        for p in pairs {
            let (o, l) = (p.offset as usize, p.length as usize);
            prop_assert!(l > 0);
            prop_assert!(o + l <= kv_len);
            prop_assert!(prev_end.is_none_or(|e| o > e), "pairs not sorted/merged: {:?}", pairs);
            prop_assert_eq!(o % b, 0);
            prop_assert!((o + l) % b == 0 || o + l == kv_len);
            kept[o..o + l].iter_mut().for_each(|k| *k = true);
            prev_end = Some(o + l);
            sum += l;
        }
        prop_assert_eq!(sum, plan.kept_tokens());
        // Sink and recent tokens always kept.
        let sink_end = (c.sink_tokens as usize).min(kv_len);
        prop_assert!(kept[..sink_end].iter().all(|&k| k), "a sink token was evicted");
        let recent_start = kv_len.saturating_sub(c.recent_tokens as usize);
        prop_assert!(kept[recent_start..].iter().all(|&k| k), "a recent token was evicted");
        // Selection: no evicted block beats a kept unprotected one.
        let kept_block = |i: usize| kept[i * b];
        for i in (0..n_blocks).filter(|&i| !prot[i] && kept_block(i)) {
            for j in (0..n_blocks).filter(|&j| !kept_block(j)) {
                match c.selection {
                    Selection::HeavyHitters => prop_assert!(
                        scores[i] > scores[j] || (scores[i] == scores[j] && i < j),
                        "kept block {} ({}) vs evicted {} ({})", i, scores[i], j, scores[j]
                    ),
                    _ => prop_assert!(i > j),
                }
            }
        }
    }

    /// A random run of one layer against a reference model written out here: the EMA with
    /// the same f32 operations, the plan from `plan_reserve`, and score compaction only for
    /// plans whose next call has `kv_len == kept + n_queries`.
    #[test]
    fn double_buffer_matches_reference(
        steps in prop::collection::vec((prop::bool::ANY, 1usize..40, any::<u32>()), 1..60),
        interval in 0u32..5,
    ) {
        let c = H2oConfig {
            block_tokens: 8,
            sink_tokens: 4,
            recent_tokens: 16,
            target_lossy_ratio: 2.5,
            trigger_min_tokens: 64,
            update_interval: interval,
            ..H2oConfig::default()
        };
        let mut policy = H2oPolicy::new(c.clone(), 1).unwrap();
        let mut ref_scores: Vec<f32> = Vec::new();
        let mut ref_pending: Option<kvc_h2o::ReservePlan> = None;
        let mut ref_last: Option<u64> = None;
        let (mut applied, mut dropped, mut made) = (0u64, 0u64, 0u64);
        let mut kv_len = 0usize;
        for (call, &(apply, n_q, salt)) in steps.iter().enumerate() {
            // Apply the pending plan when asked to, else grow the cache without compacting.
            let base = match (&ref_pending, apply) {
                (Some(p), true) => p.kept_tokens(),
                _ => kv_len,
            };
            kv_len = base + n_q;
            let shape = CallShape { kv_len, n_queries: n_q, n_heads: 2, n_kv_heads: 1 };
            let res = policy.begin_call(0, shape).unwrap();
            // Reference resolution.
            let want = match ref_pending.take() {
                None => PlanResolution::NoPlan,
                Some(p) if kv_len == p.kept_tokens() + n_q => {
                    let mut moved = Vec::new();
                    for pair in p.pairs() {
                        let first = pair.offset as usize / 8;
                        let end = (pair.offset + pair.length) as usize;
                        moved.extend_from_slice(&ref_scores[first..end.div_ceil(8)]);
                    }
                    ref_scores = moved;
                    applied += 1;
                    PlanResolution::Applied
                }
                Some(_) => {
                    dropped += 1;
                    PlanResolution::Dropped
                }
            };
            prop_assert_eq!(res, want);
            let n_blocks = kv_len.div_ceil(8);
            ref_scores.resize(n_blocks, 0.0);
            let sums: Vec<f32> = (0..n_blocks)
                .map(|i| ((salt as usize).wrapping_mul(i + 7) % 97) as f32 / 13.0)
                .collect();
            policy.ingest_block_sums(0, &sums).unwrap();
            let d = policy.end_call(0).unwrap();
            let norm = (2 * n_q) as f32;
            for (s, a) in ref_scores.iter_mut().zip(&sums) {
                *s = 0.9 * *s + (1.0 - 0.9) * (a / norm);
            }
            prop_assert_eq!(policy.scores(0), &ref_scores[..]);
            let call = call as u64;
            let due = kv_len >= 64 && ref_last.is_none_or(|l| call - l >= u64::from(interval));
            let plan = if due { plan_reserve(&c, kv_len, &ref_scores).unwrap() } else { None };
            prop_assert_eq!(d.triggered, plan.is_some());
            if let Some(p) = plan {
                prop_assert_eq!(policy.pending_plan(0), Some(&p));
                prop_assert_eq!(d.kept_tokens, p.kept_tokens());
                ref_last = Some(call);
                made += 1;
                ref_pending = Some(p);
            } else {
                prop_assert!(policy.pending_plan(0).is_none());
                prop_assert_eq!(d.kept_tokens, kv_len);
            }
        }
        let m = policy.metrics();
        prop_assert_eq!((m.plans_made, m.plans_applied, m.plans_dropped), (made, applied, dropped));
    }
}
