//! Hand-computed cases and cross-checks that need the crate's internals (kernels).

use crate::accumulate::Kernel;
use crate::*;

fn shape(kv_len: usize, n_queries: usize, n_heads: usize, n_kv_heads: usize) -> CallShape {
    CallShape {
        kv_len,
        n_queries,
        n_heads,
        n_kv_heads,
    }
}

fn small_cfg() -> H2oConfig {
    H2oConfig {
        block_tokens: 4,
        sink_tokens: 4,
        recent_tokens: 4,
        target_lossy_ratio: 2.0,
        trigger_min_tokens: 1_000_000,
        ..H2oConfig::default()
    }
}

fn call_blocks(p: &mut H2oPolicy, layer: usize, s: CallShape, sums: &[f32]) -> CallDecision {
    p.begin_call(layer, s).unwrap();
    p.ingest_block_sums(layer, sums).unwrap();
    p.end_call(layer).unwrap()
}

fn pairs(plan: &ReservePlan) -> Vec<(u32, u32)> {
    plan.pairs().iter().map(|p| (p.offset, p.length)).collect()
}

#[test]
fn defaults_are_the_spec() {
    let c = H2oConfig::default();
    assert_eq!(
        (c.block_tokens, c.sink_tokens, c.recent_tokens),
        (64, 32, 256)
    );
    assert_eq!((c.target_lossy_ratio, c.ema_alpha), (3.5, 0.9));
    assert_eq!((c.trigger_min_tokens, c.update_interval), (512, 16));
    assert_eq!((c.layer_start, c.layer_end), (0, None));
}

#[test]
fn ema_hand_computed() {
    let mut p = H2oPolicy::new(small_cfg(), 1).unwrap();
    // 2 heads x 1 query: norm 2. current = [0.5, 1.5]; s = 0.1 * current.
    call_blocks(&mut p, 0, shape(8, 1, 2, 1), &[1.0, 3.0]);
    let s = p.scores(0).to_vec();
    assert!(
        (s[0] - 0.05).abs() < 1e-7 && (s[1] - 0.15).abs() < 1e-7,
        "{s:?}"
    );
    // New block 2 starts at 0. current = [1, 0, 1].
    call_blocks(&mut p, 0, shape(9, 1, 2, 1), &[2.0, 0.0, 2.0]);
    let s = p.scores(0).to_vec();
    let want = [0.9 * 0.05 + 0.1, 0.9 * 0.15, 0.1];
    for (a, b) in s.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{s:?} vs {want:?}");
    }
    // 2 queries x 2 heads: norm 4.
    call_blocks(&mut p, 0, shape(10, 2, 2, 1), &[4.0, 0.0, 0.0]);
    assert!((p.scores(0)[0] - (0.9 * want[0] + 0.1)).abs() < 1e-6);
}

#[test]
fn tie_rule_lower_block_first() {
    let c = small_cfg();
    // 24 tokens, 6 blocks; protected: block 0 (sink) and block 5 (recent) = 8 tokens;
    // target ceil(24 / 2) = 12 -> one more block.
    let plan = plan_reserve(&c, 24, &[0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
        .unwrap()
        .unwrap();
    assert_eq!(pairs(&plan), vec![(0, 8), (20, 4)]);
    assert_eq!((plan.kept_tokens(), plan.evicted_tokens()), (12, 12));
    let plan = plan_reserve(&c, 24, &[0.0, 1.0, 2.0, 2.0, 1.0, 0.0])
        .unwrap()
        .unwrap();
    assert_eq!(pairs(&plan), vec![(0, 4), (8, 4), (20, 4)]);
}

#[test]
fn block_rounded_target_and_partial_last_block() {
    let c = H2oConfig {
        target_lossy_ratio: 3.0,
        ..small_cfg()
    };
    // 30 tokens: 8 blocks, the last has 2 tokens. Recent = tokens 26..30 = blocks 6, 7
    // (4 + 2); sink block 0: protected 10. target ceil(30 / 3) = 10 -> floor dominates.
    assert_eq!(plan_reserve(&c, 30, &[0.0; 8]).unwrap(), None);
    // 50 tokens, 13 blocks: protected = 4 + (4 + 2) = 10 (recent 46..50 = blocks 11, 12);
    // target 17 -> 10 + ceil(7 / 4) * 4 = 18: two best blocks (7 and 3).
    let mut s = [0.0; 13];
    s[7] = 5.0;
    s[3] = 4.0;
    s[9] = 3.0;
    let plan = plan_reserve(&c, 50, &s).unwrap().unwrap();
    assert_eq!(plan.kept_tokens(), 18);
    assert_eq!(pairs(&plan), vec![(0, 4), (12, 4), (28, 4), (44, 6)]);
}

#[test]
fn floor_dominates_no_plan_and_counter_not_reset() {
    let c = H2oConfig {
        recent_tokens: 8,
        trigger_min_tokens: 8,
        update_interval: 2,
        ..small_cfg()
    };
    let mut p = H2oPolicy::new(c, 1).unwrap();
    // Call 0, 40 tokens (10 blocks): protected 4 + 8, target 20 -> plan of 20.
    let d = call_blocks(&mut p, 0, shape(40, 40, 1, 1), &[1.0; 10]);
    assert!(d.triggered);
    assert_eq!(d.kept_tokens, 20);
    // Call 1: applied (21 = 20 + 1); 1 call since the plan < 2: no trigger.
    assert_eq!(
        p.begin_call(0, shape(21, 1, 1, 1)).unwrap(),
        PlanResolution::Applied
    );
    p.ingest_block_sums(0, &[0.0; 6]).unwrap();
    assert!(!p.end_call(0).unwrap().triggered);
    // Call 2, 22 tokens: trigger due, but protected = 4 + (4 + 4 + 2) = 14 >= 11.
    let d = call_blocks(&mut p, 0, shape(22, 1, 1, 1), &[0.0; 6]);
    assert!(!d.triggered);
    assert_eq!(d.kept_tokens, 22);
    assert!(p.pending_plan(0).is_none());
    // Call 3: 3 - 0 >= 2, the counter was not reset by call 2, so it triggers.
    let d = call_blocks(&mut p, 0, shape(40, 18, 1, 1), &[1.0; 10]);
    assert!(d.triggered);
    assert_eq!(p.metrics().plans_made, 2);
}

#[test]
fn interval_counts_this_layers_calls() {
    let c = H2oConfig {
        trigger_min_tokens: 8,
        update_interval: 3,
        ..small_cfg()
    };
    let mut p = H2oPolicy::new(c, 2).unwrap();
    let mut triggered = vec![];
    for i in 0..7 {
        // Layer 1 is called twice as often; its calls must not advance layer 0's count.
        call_blocks(&mut p, 1, shape(40, 1, 1, 1), &[1.0; 10]);
        call_blocks(&mut p, 1, shape(40, 1, 1, 1), &[1.0; 10]);
        if call_blocks(&mut p, 0, shape(40, 1, 1, 1), &[1.0; 10]).triggered {
            triggered.push(i);
        }
    }
    assert_eq!(triggered, vec![0, 3, 6]);
}

#[test]
fn dropped_plan_keeps_scores_and_counts() {
    let c = H2oConfig {
        trigger_min_tokens: 8,
        ..small_cfg()
    };
    let mut p = H2oPolicy::new(c, 1).unwrap();
    let sums: Vec<f32> = (0..6).map(|i| i as f32).collect();
    assert!(call_blocks(&mut p, 0, shape(24, 1, 1, 1), &sums).triggered);
    let before = p.scores(0).to_vec();
    // The engine did not compact: 25 != 12 + 1.
    assert_eq!(
        p.begin_call(0, shape(25, 1, 1, 1)).unwrap(),
        PlanResolution::Dropped
    );
    p.ingest_block_sums(0, &[0.0; 7]).unwrap();
    p.end_call(0).unwrap();
    let after = p.scores(0);
    for (a, b) in after.iter().zip(&before) {
        assert!((a - 0.9 * b).abs() < 1e-6);
    }
    assert_eq!(after.len(), 7);
    let m = p.metrics();
    assert_eq!((m.plans_made, m.plans_applied, m.plans_dropped), (1, 0, 1));
    assert_eq!(m.lossy_ratio(), 1.0);
}

#[test]
fn applied_plan_moves_scores_with_blocks() {
    let c = H2oConfig {
        trigger_min_tokens: 8,
        ..small_cfg()
    };
    let mut p = H2oPolicy::new(c, 1).unwrap();
    // 26 tokens: 7 blocks, last partial (2). Protected: block 0, blocks 5 (22..24) and 6.
    let sums = [1.0, 2.0, 9.0, 3.0, 8.0, 4.0, 5.0];
    let d = call_blocks(&mut p, 0, shape(26, 1, 1, 1), &sums);
    // protected 4 + 4 + 2 = 10, target 13 -> 14: block 2 (score 0.9).
    assert_eq!(d.kept_tokens, 14);
    assert_eq!(
        pairs(p.pending_plan(0).unwrap()),
        vec![(0, 4), (8, 4), (20, 6)]
    );
    let old = p.scores(0).to_vec();
    assert_eq!(
        p.begin_call(0, shape(15, 1, 1, 1)).unwrap(),
        PlanResolution::Applied
    );
    p.ingest_block_sums(0, &[0.0; 4]).unwrap();
    p.end_call(0).unwrap();
    let new = p.scores(0);
    let kept = [0, 2, 5, 6];
    assert_eq!(new.len(), 4);
    for (n, &k) in new.iter().zip(&kept) {
        assert!((n - 0.9 * old[k]).abs() < 1e-7);
    }
    let m = p.layer_metrics(0);
    assert_eq!((m.cached_tokens, m.logical_tokens), (15, 27));
    assert!((p.metrics().lossy_ratio() - 27.0 / 15.0).abs() < 1e-12);
}

#[test]
fn streaming_llm_keeps_sink_and_recent_window() {
    let c = H2oConfig {
        selection: Selection::StreamingLlm,
        ..small_cfg()
    };
    // Scores would pick block 1; StreamingLLM takes the newest unprotected block (4).
    let plan = plan_reserve(&c, 24, &[0.0, 9.0, 1.0, 1.0, 0.0, 0.0])
        .unwrap()
        .unwrap();
    assert_eq!(pairs(&plan), vec![(0, 4), (16, 8)]);
}

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32) / (1u64 << 24) as f32
}

/// Block sums of `[n_heads][n_queries][kv_len]` per (block, group), in f64.
fn reference_sums(probs: &[f32], s: CallShape, block: usize, groups: usize) -> Vec<f64> {
    let nb = s.kv_len.div_ceil(block);
    let mut out = vec![0.0; nb * groups];
    let hpg = s.n_heads / groups;
    for h in 0..s.n_heads {
        for q in 0..s.n_queries {
            for t in 0..s.kv_len {
                out[(t / block) * groups + h / hpg] +=
                    f64::from(probs[(h * s.n_queries + q) * s.kv_len + t]);
            }
        }
    }
    out
}

#[test]
fn ingestion_paths_agree_and_kernels_are_bit_identical() {
    for granularity in [ScoreGranularity::PerLayer, ScoreGranularity::PerKvHead] {
        let c = H2oConfig {
            block_tokens: 37,
            granularity,
            trigger_min_tokens: u32::MAX,
            ..H2oConfig::default()
        };
        let s = shape(1000, 3, 6, 2);
        let groups = if granularity == ScoreGranularity::PerLayer {
            1
        } else {
            2
        };
        let mut seed = 7;
        let probs: Vec<f32> = (0..6 * 3 * 1000).map(|_| lcg(&mut seed)).collect();
        let reference = reference_sums(&probs, s, 37, groups);
        let norm = (6 / groups * 3) as f64;
        let check = |p: &H2oPolicy, what: &str| {
            for (a, r) in p.scores(0).iter().zip(&reference) {
                let want = 0.1 * r / norm;
                assert!(
                    (f64::from(*a) - want).abs() <= 1e-5 * want.max(1.0),
                    "{what}: {a} vs {want}"
                );
            }
        };
        let mut by_kernel = vec![];
        for kernel in Kernel::all_available() {
            // (b) full probabilities.
            let mut p = H2oPolicy::new(c.clone(), 1).unwrap();
            p.set_kernel(kernel);
            p.begin_call(0, s).unwrap();
            p.ingest_probabilities(0, &probs).unwrap();
            p.end_call(0).unwrap();
            check(&p, "probabilities");
            by_kernel.push(p.scores(0).to_vec());
            // (a) tiles of uneven widths, one head at a time, with padded rows.
            let mut p = H2oPolicy::new(c.clone(), 1).unwrap();
            p.set_kernel(kernel);
            p.begin_call(0, s).unwrap();
            let mut first = 0;
            for width in [5usize, 64, 200, 1, 300, 430] {
                let stride = width + 3;
                for h in 0..6 {
                    let mut tile = vec![0.0f32; 3 * stride];
                    for q in 0..3 {
                        tile[q * stride..q * stride + width]
                            .copy_from_slice(&probs[(h * 3 + q) * 1000 + first..][..width]);
                    }
                    let t = SoftmaxTile {
                        head: h,
                        first_key: first,
                        n_keys: width,
                        rows: &tile,
                        n_rows: 3,
                        row_stride: stride,
                    };
                    p.ingest_softmax_tile(0, t).unwrap();
                }
                first += width;
            }
            assert_eq!(first, 1000);
            p.end_call(0).unwrap();
            check(&p, "tiles");
        }
        for k in &by_kernel[1..] {
            assert_eq!(k, &by_kernel[0], "kernels differ");
        }
        // (c) column sums per KV head, and per layer where allowed.
        let mut cols = vec![0.0f32; 2 * 1000];
        for h in 0..6 {
            for q in 0..3 {
                for t in 0..1000 {
                    cols[(h / 3) * 1000 + t] += probs[(h * 3 + q) * 1000 + t];
                }
            }
        }
        let mut p = H2oPolicy::new(c.clone(), 1).unwrap();
        p.begin_call(0, s).unwrap();
        p.ingest_column_sums(0, &cols).unwrap();
        p.end_call(0).unwrap();
        check(&p, "column sums per KV head");
        let layer_cols: Vec<f32> = (0..1000).map(|t| cols[t] + cols[1000 + t]).collect();
        let mut p = H2oPolicy::new(c.clone(), 1).unwrap();
        p.begin_call(0, s).unwrap();
        let r = p.ingest_column_sums(0, &layer_cols);
        if groups == 1 {
            r.unwrap();
            p.end_call(0).unwrap();
            check(&p, "column sums");
        } else {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::Unsupported);
        }
    }
}

#[test]
fn per_kv_head_plans_keep_the_same_count() {
    let c = H2oConfig {
        granularity: ScoreGranularity::PerKvHead,
        trigger_min_tokens: 8,
        ..small_cfg()
    };
    let mut p = H2oPolicy::new(c, 1).unwrap();
    // [n_blocks][2]: head 0 prefers block 1, head 1 block 4.
    let mut sums = [0.0f32; 12];
    sums[2] = 5.0;
    sums[4 * 2 + 1] = 5.0;
    let d = call_blocks(&mut p, 0, shape(24, 1, 4, 2), &sums);
    assert!(d.triggered);
    let plan = p.pending_plan(0).unwrap();
    assert_eq!(plan.n_groups(), 2);
    let g = |i| -> Vec<(u32, u32)> {
        plan.group_pairs(i)
            .iter()
            .map(|p| (p.offset, p.length))
            .collect()
    };
    assert_eq!(g(0), vec![(0, 8), (20, 4)]);
    assert_eq!(g(1), vec![(0, 4), (16, 8)]);
    // Apply: each head's scores follow its own blocks.
    assert_eq!(
        p.begin_call(0, shape(13, 1, 4, 2)).unwrap(),
        PlanResolution::Applied
    );
    p.ingest_block_sums(0, &[0.0; 8]).unwrap();
    p.end_call(0).unwrap();
    let s = p.scores(0);
    assert!((s[2] - 0.9 * 0.1 * 5.0 / 2.0).abs() < 1e-6, "{s:?}");
    assert!((s[3] - 0.9 * 0.1 * 5.0 / 2.0).abs() < 1e-6, "{s:?}");
    // A changed KV head count is an error.
    let e = p.begin_call(0, shape(14, 1, 4, 4)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn layer_uniform_one_plan_from_the_sum() {
    let c = H2oConfig {
        scope: PlanScope::LayerUniform,
        trigger_min_tokens: 8,
        layer_start: 1,
        ..small_cfg()
    };
    let mut p = H2oPolicy::new(c, 3).unwrap();
    // Layer 0 unmanaged; layer 1 likes block 1, layer 2 likes block 3 more.
    let s = shape(24, 1, 1, 1);
    call_blocks(&mut p, 0, s, &[0.0, 0.0, 0.0, 100.0, 0.0, 0.0]);
    assert!(!call_blocks(&mut p, 1, s, &[0.0, 2.0, 0.0, 0.0, 0.0, 0.0]).triggered);
    let d = call_blocks(&mut p, 2, s, &[0.0, 0.0, 0.0, 3.0, 0.0, 0.0]);
    assert!(d.triggered);
    for layer in 0..3 {
        assert_eq!(
            pairs(p.pending_plan(layer).unwrap()),
            vec![(0, 4), (12, 4), (20, 4)]
        );
    }
    let s = shape(13, 1, 1, 1);
    call_blocks(&mut p, 0, s, &[0.0; 4]);
    assert_eq!(p.begin_call(1, s).unwrap(), PlanResolution::Applied);
    p.ingest_block_sums(1, &[0.0; 4]).unwrap();
    p.end_call(1).unwrap();
    assert!(p.pending_plan(2).is_none());
    call_blocks(&mut p, 2, s, &[0.0; 4]);
    // Layer 2's block 3 score moved to block 1.
    assert!((p.scores(2)[1] - 0.9 * 0.3).abs() < 1e-6);
    let m = p.metrics();
    assert_eq!((m.plans_made, m.plans_applied, m.managed_layers), (1, 1, 2));
    assert!((m.lossy_ratio() - 50.0 / 26.0).abs() < 1e-12);
    // Layers disagreeing on kv_len are reported.
    let mut p = H2oPolicy::new(
        H2oConfig {
            scope: PlanScope::LayerUniform,
            ..small_cfg()
        },
        2,
    )
    .unwrap();
    call_blocks(&mut p, 0, shape(8, 1, 1, 1), &[0.0; 2]);
    p.begin_call(1, shape(12, 1, 1, 1)).unwrap();
    p.ingest_block_sums(1, &[0.0; 3]).unwrap();
    assert_eq!(
        p.end_call(1).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn unmanaged_layers_pass_through() {
    let c = H2oConfig {
        layer_start: 1,
        layer_end: Some(1),
        trigger_min_tokens: 8,
        ..small_cfg()
    };
    let mut p = H2oPolicy::new(c, 3).unwrap();
    for layer in [0, 2] {
        let d = call_blocks(&mut p, layer, shape(24, 1, 1, 1), &[1.0; 6]);
        assert_eq!((d.triggered, d.kept_tokens), (false, 24));
        assert!(p.scores(layer).is_empty());
        assert!(!p.layer_metrics(layer).managed);
    }
    assert!(call_blocks(&mut p, 1, shape(24, 1, 1, 1), &[1.0; 6]).triggered);
    assert_eq!(p.metrics().managed_layers, 1);
}

#[test]
fn reset_when_the_cache_shrinks_without_a_plan() {
    let mut p = H2oPolicy::new(small_cfg(), 1).unwrap();
    call_blocks(&mut p, 0, shape(24, 1, 1, 1), &[1.0; 6]);
    call_blocks(&mut p, 0, shape(5, 5, 1, 1), &[1.0; 2]);
    assert_eq!(p.layer_metrics(0).resets, 1);
    assert!((p.scores(0)[1] - 0.1 * 1.0 / 5.0).abs() < 1e-7);
}

#[test]
fn bad_input_is_a_typed_error() {
    assert!(H2oPolicy::new(H2oConfig::default(), 0).is_err());
    for c in [
        H2oConfig {
            block_tokens: 0,
            ..H2oConfig::default()
        },
        H2oConfig {
            target_lossy_ratio: 0.5,
            ..H2oConfig::default()
        },
        H2oConfig {
            target_lossy_ratio: f32::NAN,
            ..H2oConfig::default()
        },
        H2oConfig {
            ema_alpha: 1.5,
            ..H2oConfig::default()
        },
        H2oConfig {
            layer_start: 3,
            layer_end: Some(2),
            ..H2oConfig::default()
        },
    ] {
        let e = H2oPolicy::new(c, 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(!e.to_string().is_empty());
    }
    let mut p = H2oPolicy::new(small_cfg(), 2).unwrap();
    let kind = |r: Result<()>| r.unwrap_err().kind();
    assert_eq!(
        p.begin_call(2, shape(8, 1, 1, 1)).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    for bad in [
        shape(0, 1, 1, 1),
        shape(8, 0, 1, 1),
        shape(8, 9, 1, 1),
        shape(8, 1, 0, 1),
        shape(8, 1, 4, 3),
        shape(8, 1, 4, 0),
        shape(MAX_KV_LEN + 1, 1, 1, 1),
    ] {
        assert!(p.begin_call(0, bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        kind(p.ingest_block_sums(0, &[0.0; 2])),
        ErrorKind::InvalidState
    );
    assert_eq!(p.end_call(0).unwrap_err().kind(), ErrorKind::InvalidState);
    p.begin_call(0, shape(8, 2, 2, 1)).unwrap();
    assert_eq!(
        p.begin_call(0, shape(8, 1, 1, 1)).unwrap_err().kind(),
        ErrorKind::InvalidState
    );
    assert!(p.ingest_block_sums(0, &[0.0; 3]).is_err());
    assert!(p.ingest_probabilities(0, &[0.0; 31]).is_err());
    assert!(p.ingest_column_sums(0, &[0.0; 7]).is_err());
    let buf = [0.0f32; 16];
    assert!(p.ingest_softmax_tile(0, tile(2, 0, 4, &buf, 1, 4)).is_err());
    assert!(p.ingest_softmax_tile(0, tile(0, 6, 4, &buf, 1, 4)).is_err());
    assert!(p
        .ingest_softmax_tile(0, tile(0, usize::MAX, 4, &buf, 1, 4))
        .is_err());
    assert!(p.ingest_softmax_tile(0, tile(0, 0, 4, &buf, 3, 4)).is_err());
    assert!(p.ingest_softmax_tile(0, tile(0, 0, 8, &buf, 2, 4)).is_err());
    assert!(p
        .ingest_softmax_tile(0, tile(0, 0, 8, &buf[..15], 2, 8))
        .is_err());
    p.ingest_softmax_tile(0, tile(0, 0, 8, &buf, 2, 8)).unwrap();
    // Non-finite or negative sums: the call is discarded, the scores are unchanged.
    p.ingest_block_sums(0, &[f32::NAN, 0.0]).unwrap();
    let e = p.end_call(0).unwrap_err();
    assert!(matches!(e, Error::InvalidScore { index: 0, .. }), "{e}");
    p.begin_call(0, shape(8, 1, 1, 1)).unwrap();
    p.ingest_block_sums(0, &[0.0, -1.0]).unwrap();
    assert!(matches!(
        p.end_call(0),
        Err(Error::InvalidScore { index: 1, .. })
    ));
    assert!(p.scores(0).is_empty());
    // Overflowing shape products are errors, not wraps.
    let mut p = H2oPolicy::new(small_cfg(), 1).unwrap();
    assert!(p
        .begin_call(0, shape(1 << 20, 1 << 20, 1 << 44, 1))
        .is_err());
    p.begin_call(0, shape(1 << 20, 1 << 20, 1 << 30, 1))
        .unwrap();
    assert!(p.ingest_probabilities(0, &[0.0; 4]).is_err());
    // plan_reserve checks its arguments.
    assert!(plan_reserve(&small_cfg(), 8, &[0.0; 3]).is_err());
    assert!(plan_reserve(&small_cfg(), 0, &[]).is_err());
}

fn tile(
    head: usize,
    first_key: usize,
    n_keys: usize,
    rows: &[f32],
    n_rows: usize,
    row_stride: usize,
) -> SoftmaxTile<'_> {
    SoftmaxTile {
        head,
        first_key,
        n_keys,
        rows,
        n_rows,
        row_stride,
    }
}

/// Found by the h2o_replay fuzz target's allocation test (issue 25): a call whose
/// `n_heads * n_queries` overflows made `end_call`'s normaliser overflow (a panic with
/// overflow checks, a wrong EMA without). It is now refused when the call opens.
#[test]
fn heads_times_queries_overflow_is_refused() {
    for (n_heads, n_kv_heads) in [(usize::MAX, 1), (usize::MAX, usize::MAX), (1 << 60, 1 << 8)] {
        let mut p = H2oPolicy::new(small_cfg(), 1).unwrap();
        let e = p
            .begin_call(0, shape(64, 64, n_heads, n_kv_heads))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("overflows"), "{e}");
        // The policy still works afterwards.
        let d = call_blocks(&mut p, 0, shape(8, 1, 2, 1), &[1.0, 2.0]);
        assert!(!d.triggered);
    }
}
