//! kvc-h2o plans drive kvc-cache compaction directly: a real policy run (ingest scores,
//! get a plan, compact a cache) keeps exactly the plan's tokens, in order.

use kvc_cache::{
    compact_heads, compact_layer, compact_shared, Addressing, Error, KvLayout, LayerMut,
    ReservePlan, TensorLayout,
};
use kvc_h2o::{CallShape, H2oConfig, H2oPolicy, ReservePair, ScoreGranularity};
use kvc_types::Dtype;

const KV_LEN: usize = 1500;
const CAP: usize = 1536;

/// Probabilities `[n_heads][1][kv_len]` that make a few scattered tokens (different ones
/// per KV head) heavy hitters.
fn probs(n_heads: usize, heads_per_kv: usize) -> Vec<f32> {
    let mut p = vec![0f32; n_heads * KV_LEN];
    for h in 0..n_heads {
        let row = &mut p[h * KV_LEN..(h + 1) * KV_LEN];
        let g = h / heads_per_kv;
        let mut x = 0x2545_F491_4F6C_DD1Du64.wrapping_add(g as u64 * 7919);
        for (t, r) in row.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let heavy = (t * 31 + g * 17) % 97 < 9;
            *r = (x >> 40) as f32 / (1u64 << 24) as f32 + if heavy { 40.0 } else { 0.0 };
        }
        let s: f32 = row.iter().sum();
        row.iter_mut().for_each(|r| *r /= s);
    }
    p
}

fn run_policy(granularity: ScoreGranularity) -> kvc_h2o::ReservePlan {
    let config = H2oConfig {
        granularity,
        ..H2oConfig::default()
    };
    let mut policy = H2oPolicy::new(config, 1).unwrap();
    let shape = CallShape {
        kv_len: KV_LEN,
        n_queries: 1,
        n_heads: 4,
        n_kv_heads: 2,
    };
    policy.begin_call(0, shape).unwrap();
    policy.ingest_probabilities(0, &probs(4, 2)).unwrap();
    let decision = policy.end_call(0).unwrap();
    assert!(decision.triggered);
    let plan = policy.pending_plan(0).unwrap().clone();
    assert_eq!(plan.kept_tokens(), decision.kept_tokens);
    assert!(plan.kept_tokens() < KV_LEN);
    plan
}

/// Kept token indices of a list of pairs, in order.
fn tokens(pairs: &[ReservePair]) -> Vec<usize> {
    pairs
        .iter()
        .flat_map(|p| p.offset as usize..(p.offset + p.length) as usize)
        .collect()
}

/// An f32 tensor whose element (t, c) is `t * 1000 + c`.
fn tagged(l: &TensorLayout) -> Vec<u8> {
    let mut v = vec![0f32; l.elem_count()];
    for t in 0..l.capacity() {
        for c in 0..l.channels() {
            v[l.token_offset(t) + l.channel_offset(c)] = (t * 1000 + c) as f32;
        }
    }
    bytemuck::cast_slice(&v).to_vec()
}

fn tag(buf: &[u8], l: &TensorLayout, t: usize, c: usize) -> usize {
    let o = (l.token_offset(t) + l.channel_offset(c)) * 4;
    f32::from_le_bytes(buf[o..o + 4].try_into().unwrap()) as usize
}

fn layouts() -> Vec<KvLayout> {
    vec![
        KvLayout::llama(Dtype::F32, 2, 4, 4, CAP, true).unwrap(),
        KvLayout::infinilm(Dtype::F32, 2, 4, CAP).unwrap(),
        KvLayout::mnn(Dtype::F32, 2, 4, CAP, 8, 2, Some(128)).unwrap(),
    ]
}

#[test]
fn policy_plan_compacts_to_exactly_its_tokens() {
    let h2o = run_policy(ScoreGranularity::PerLayer);
    assert_eq!(h2o.n_groups(), 1);
    let plan = ReservePlan::try_from(&h2o).unwrap();
    assert_eq!(plan.len(), KV_LEN);
    assert_eq!(plan.kept(), h2o.kept_tokens());
    let want = tokens(h2o.pairs());
    assert_eq!(want.len(), h2o.kept_tokens());
    for layout in layouts() {
        let (mut k, mut v) = (tagged(&layout.k), tagged(&layout.v));
        let mut layer = LayerMut::new(layout, &mut k, &mut v).unwrap();
        assert_eq!(compact_layer(&mut layer, &plan).unwrap(), want.len());
        for (new, &old) in want.iter().enumerate() {
            for c in 0..8 {
                assert_eq!(tag(&k, &layout.k, new, c), old * 1000 + c, "{layout:?}");
                assert_eq!(tag(&v, &layout.v, new, c), old * 1000 + c, "{layout:?}");
            }
        }
    }
    // The same plan through shared cells, with the index map.
    let layout = layouts()[0];
    let (mut k, mut v) = (tagged(&layout.k), tagged(&layout.v));
    let mut layers = vec![LayerMut::new(layout, &mut k, &mut v).unwrap()];
    let map = compact_shared(&mut layers, &plan, None).unwrap();
    for (new, &old) in want.iter().enumerate() {
        assert_eq!(map.get(old), Some(new));
    }
}

#[test]
fn per_kv_head_plans_compact_each_head() {
    let h2o = run_policy(ScoreGranularity::PerKvHead);
    assert_eq!(h2o.n_groups(), 2);
    assert!(matches!(
        ReservePlan::try_from(&h2o),
        Err(Error::GroupedPlan { groups: 2 })
    ));
    assert!(ReservePlan::from_h2o_group(&h2o, 2).is_err());
    assert!(ReservePlan::from_h2o_group(&h2o, usize::MAX).is_err());
    let plans = ReservePlan::from_h2o_groups(&h2o).unwrap();
    let want: Vec<Vec<usize>> = (0..2).map(|g| tokens(h2o.group_pairs(g))).collect();
    assert_ne!(
        want[0], want[1],
        "the two KV heads should keep different tokens"
    );
    for layout in layouts() {
        for t in [layout.k, layout.v] {
            let mut buf = tagged(&t);
            assert_eq!(
                compact_heads(&mut buf, &t, &plans).unwrap(),
                h2o.kept_tokens()
            );
            for (h, w) in want.iter().enumerate() {
                for (new, &old) in w.iter().enumerate() {
                    for d in 0..4 {
                        let c = h * 4 + d;
                        assert_eq!(tag(&buf, &t, new, c), old * 1000 + c, "{t:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn bad_h2o_pairs_and_head_plans_are_refused() {
    let p = |o, l| ReservePair {
        offset: o,
        length: l,
    };
    assert!(ReservePlan::from_h2o_pairs(&[p(0, 4), p(4, 2)], 10).is_ok());
    for (pairs, len) in [
        (vec![p(0, 0)], 10),
        (vec![p(8, 4)], 10),
        (vec![p(4, 2), p(0, 2)], 10),
        (vec![p(u32::MAX, u32::MAX)], 10),
    ] {
        assert!(matches!(
            ReservePlan::from_h2o_pairs(&pairs, len),
            Err(Error::InvalidPlan { .. })
        ));
    }
    let t = TensorLayout::new(Addressing::HeadMajor, Dtype::F16, 2, 4, 16).unwrap();
    let mut buf = vec![0u8; t.byte_len()];
    let a = ReservePlan::new(&[(0, 4)], 16).unwrap();
    let b = ReservePlan::new(&[(2, 3)], 16).unwrap();
    let long = ReservePlan::new(&[(0, 4)], 17).unwrap();
    assert!(matches!(
        compact_heads(&mut buf, &t, std::slice::from_ref(&a)),
        Err(Error::LayoutMismatch { .. })
    ));
    assert!(matches!(
        compact_heads(&mut buf, &t, &[a.clone(), b]),
        Err(Error::LayoutMismatch { .. })
    ));
    assert!(matches!(
        compact_heads(&mut buf, &t, &[a.clone(), long]),
        Err(Error::InvalidRange { .. })
    ));
    assert!(matches!(
        compact_heads(&mut buf[1..], &t, &[a.clone(), a]),
        Err(Error::BufferTooSmall { .. })
    ));
}
