//! The h2o_kept scope with a real kvc-h2o policy: the policy decides which tokens a layer
//! keeps, the store applies that plan to its own cache and compresses what is kept.

mod common;

use std::sync::Arc;

use common::Rng;
use kvc_cache::KvLayout;
use kvc_h2o::{CallShape, H2oConfig, H2oPolicy, ReservePlan, ScoreGranularity};
use kvc_store_async::{ChunkStatus, GearV1Codec, Scope, Store, StoreConfig};
use kvc_types::Dtype;

const HEADS: usize = 3;
const DIM: usize = 64;
const ROW: usize = HEADS * DIM * 2;
const HEAD_BYTES: usize = DIM * 2;
const LAYERS: usize = 3;
const STEPS: usize = 1300;

/// Attention that favours blocks 0, 3, 6, ... of 64 tokens: the policy keeps those.
fn probs(kv_len: usize) -> Vec<f32> {
    let w: Vec<f32> = (0..kv_len)
        .map(|t| if (t / 64) % 3 == 0 { 8.0 } else { 1.0 })
        .collect();
    let z: f32 = w.iter().sum();
    (0..HEADS)
        .flat_map(|_| w.iter().map(move |x| x / z))
        .collect()
}

/// The kvc-h2o plan applied to reference token-major rows, head by head, from the plan's
/// own reserve pairs (group `h` for head `h` when scores are per KV head).
fn apply_reference(rows: &mut Vec<u8>, plan: &ReservePlan) {
    let groups = plan.n_groups().max(1);
    let kept = plan.kept_tokens();
    let mut out = vec![0u8; kept * ROW];
    for h in 0..HEADS {
        let pairs = plan.group_pairs(if groups == 1 { 0 } else { h });
        let mut dst = 0;
        for p in pairs {
            for t in p.offset as usize..(p.offset + p.length) as usize {
                let (a, b) = (dst * ROW + h * HEAD_BYTES, t * ROW + h * HEAD_BYTES);
                out[a..a + HEAD_BYTES].copy_from_slice(&rows[b..b + HEAD_BYTES]);
                dst += 1;
            }
        }
        assert_eq!(dst, kept);
    }
    *rows = out;
}

fn run(scope: Scope, granularity: ScoreGranularity) {
    // Short windows, so that plans come every few hundred tokens.
    let h2o_cfg = H2oConfig {
        layer_start: 1,
        granularity,
        block_tokens: 32,
        recent_tokens: 64,
        trigger_min_tokens: 256,
        ..H2oConfig::default()
    };
    let mut policy = H2oPolicy::new(h2o_cfg.clone(), LAYERS).unwrap();
    let cfg = StoreConfig {
        scope,
        front_n: 1,
        hot_recent_tokens: 64,
        group_tokens: 64,
        ..StoreConfig::default()
    }
    .with_h2o_layers(&h2o_cfg);
    let layout = KvLayout::llama(Dtype::F16, HEADS, DIM, DIM, 2048, false).unwrap();
    let codec = Arc::new(GearV1Codec::new(Default::default()).unwrap());
    let store = Store::new(cfg, &[layout; LAYERS], codec).unwrap();
    let mut rng = Rng(31);
    let mut reference = vec![(Vec::new(), Vec::new()); LAYERS];
    let mut plans_applied = [0usize; LAYERS];
    let mut kept_across_plans = 0;
    for _ in 0..STEPS {
        for (l, r) in reference.iter_mut().enumerate() {
            let k = rng.f16_bytes(HEADS * DIM);
            let v = rng.f16_bytes(HEADS * DIM);
            let kv_len = store.append_tokens(l, &k, &v).unwrap();
            r.0.extend_from_slice(&k);
            r.1.extend_from_slice(&v);
            store.schedule(l).unwrap();
            store.poll().unwrap();
            let shape = CallShape {
                kv_len,
                n_queries: 1,
                n_heads: HEADS,
                n_kv_heads: HEADS,
            };
            policy.begin_call(l, shape).unwrap();
            policy.ingest_probabilities(l, &probs(kv_len)).unwrap();
            let d = policy.end_call(l).unwrap();
            if !d.triggered {
                continue;
            }
            // The engine applies the policy's plan before the layer's next call.
            let plan = policy.pending_plan(l).unwrap().clone();
            let before: Vec<_> = store.chunks(l).unwrap();
            let n = store.apply_h2o_plan(l, &plan).unwrap();
            assert_eq!(n, plan.kept_tokens());
            assert_eq!(n, d.kept_tokens);
            apply_reference(&mut r.0, &plan);
            apply_reference(&mut r.1, &plan);
            plans_applied[l] += 1;
            // Chunks before the first token the plan moves stay as they were.
            let after = store.chunks(l).unwrap();
            for c in &after {
                assert!(before.contains(c), "{c:?} appeared in a compaction");
            }
            kept_across_plans += after
                .iter()
                .filter(|c| c.status == ChunkStatus::Stored)
                .count();
        }
    }
    store.wait_idle().unwrap();
    let m = store.metrics().unwrap();
    assert_eq!((m.fallbacks, m.restore_failures), (0, 0), "{m:?}");
    // Layer 0 is not H2O's: it keeps every token. Layers 1 and 2 follow the policy.
    assert_eq!(plans_applied[0], 0);
    assert!(
        plans_applied[1] > 3 && plans_applied[2] > 3,
        "{plans_applied:?}"
    );
    assert_eq!(store.len(0).unwrap(), STEPS);
    assert!(store.len(1).unwrap() < STEPS / 2);
    assert!(
        kept_across_plans > 0,
        "no stored chunk survived a compaction"
    );
    for (l, r) in reference.iter().enumerate() {
        let len = store.len(l).unwrap();
        assert_eq!(len * ROW, r.0.len());
        let (k, v) = store.read_tokens(l, 0, len).unwrap();
        assert!(
            k == r.0 && v == r.1,
            "layer {l} differs from kvc-h2o's plan"
        );
        let held = store
            .chunks(l)
            .unwrap()
            .iter()
            .filter(|c| c.status == ChunkStatus::Stored)
            .count();
        let in_scope = match scope {
            Scope::FrontN => l == 0,
            Scope::H2oKept => l >= 1,
            Scope::Both => true,
        };
        assert_eq!(
            held > 0,
            in_scope,
            "layer {l} scope {scope:?}: {held} chunks"
        );
    }
}

#[test]
fn h2o_kept_scope_compresses_what_the_policy_keeps() {
    run(Scope::H2oKept, ScoreGranularity::PerLayer);
}

#[test]
fn both_scopes_with_per_kv_head_plans() {
    run(Scope::Both, ScoreGranularity::PerKvHead);
}

#[test]
fn a_plan_for_another_length_is_refused_and_changes_nothing() {
    let h2o_cfg = H2oConfig {
        block_tokens: 32,
        recent_tokens: 64,
        trigger_min_tokens: 256,
        ..H2oConfig::default()
    };
    let mut policy = H2oPolicy::new(h2o_cfg.clone(), 1).unwrap();
    let layout = KvLayout::llama(Dtype::F16, HEADS, DIM, DIM, 2048, false).unwrap();
    let codec = Arc::new(GearV1Codec::new(Default::default()).unwrap());
    let store = Store::new(StoreConfig::default(), &[layout], codec).unwrap();
    let row = vec![0x3cu8; ROW];
    for _ in 0..600 {
        store.append_tokens(0, &row, &row).unwrap();
    }
    let shape = CallShape {
        kv_len: 600,
        n_queries: 1,
        n_heads: HEADS,
        n_kv_heads: HEADS,
    };
    policy.begin_call(0, shape).unwrap();
    policy.ingest_probabilities(0, &probs(600)).unwrap();
    assert!(policy.end_call(0).unwrap().triggered);
    let plan = policy.pending_plan(0).unwrap().clone();
    store.append_tokens(0, &row, &row).unwrap();
    let e = store.apply_h2o_plan(0, &plan).unwrap_err();
    assert_eq!(e.kind(), kvc_store_async::ErrorKind::InvalidArgument, "{e}");
    assert_eq!(store.len(0).unwrap(), 601);
    assert!(store.apply_h2o_plan(5, &plan).is_err());
}
