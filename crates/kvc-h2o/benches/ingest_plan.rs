//! One decode step of one layer (32 query heads, 8192 tokens): ingest the step's attention
//! statistics and make a plan, through each ingestion path; and, for scale, a plain f32
//! QK^T + softmax of the same size (32 heads x 1 query x 8192 keys x head_dim 128).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use kvc_h2o::{CallShape, H2oConfig, H2oPolicy, SoftmaxTile};

const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const TOKENS: usize = 8192;
const HEAD_DIM: usize = 128;
const TILE: usize = 256;

fn rand_vec(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32) / 16777216.0
        })
        .collect()
}

fn policy() -> H2oPolicy {
    // Plan on every call (interval 0): the worst case, ingestion + plan each step.
    let config = H2oConfig {
        update_interval: 0,
        ..H2oConfig::default()
    };
    H2oPolicy::new(config, 1).unwrap()
}

fn shape() -> CallShape {
    CallShape {
        kv_len: TOKENS,
        n_queries: 1,
        n_heads: HEADS,
        n_kv_heads: KV_HEADS,
    }
}

fn softmax_rows(probs: &mut [f32]) {
    for row in probs.chunks_exact_mut(TOKENS) {
        let sum: f32 = row.iter().sum();
        row.iter_mut().for_each(|p| *p /= sum);
    }
}

/// Plain f32 attention scores: per head, q . k for every key, then a softmax.
fn qk_softmax(q: &[f32], k: &[f32], out: &mut [f32]) {
    for h in 0..HEADS {
        let qh = &q[h * HEAD_DIM..][..HEAD_DIM];
        let row = &mut out[h * TOKENS..][..TOKENS];
        let kh = &k[h * TOKENS * HEAD_DIM..][..TOKENS * HEAD_DIM];
        for (o, key) in row.iter_mut().zip(kh.chunks_exact(HEAD_DIM)) {
            let mut acc = [0.0f32; 16];
            for (qc, kc) in qh.chunks_exact(16).zip(key.chunks_exact(16)) {
                for i in 0..16 {
                    acc[i] += qc[i] * kc[i];
                }
            }
            *o = acc.iter().sum::<f32>() * (1.0 / (HEAD_DIM as f32).sqrt());
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for x in row.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|x| *x *= inv);
    }
}

fn bench(c: &mut Criterion) {
    let mut seed = 1;
    let mut probs = rand_vec(HEADS * TOKENS, &mut seed);
    softmax_rows(&mut probs);
    let mut cols = vec![0.0f32; TOKENS];
    for row in probs.chunks_exact(TOKENS) {
        for (c, p) in cols.iter_mut().zip(row) {
            *c += p;
        }
    }
    let blocks: Vec<f32> = cols.chunks(64).map(|b| b.iter().sum()).collect();

    let mut g = c.benchmark_group("h2o_decode_step_32h_8192t");
    g.sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    let mut p = policy();
    g.bench_function("probabilities_ingest_plan", |b| {
        b.iter(|| {
            p.begin_call(0, shape()).unwrap();
            p.ingest_probabilities(0, black_box(&probs)).unwrap();
            black_box(p.end_call(0).unwrap())
        })
    });
    let mut p = policy();
    g.bench_function("tiles256_ingest_plan", |b| {
        b.iter(|| {
            p.begin_call(0, shape()).unwrap();
            for h in 0..HEADS {
                for first in (0..TOKENS).step_by(TILE) {
                    let tile = SoftmaxTile {
                        head: h,
                        first_key: first,
                        n_keys: TILE,
                        rows: black_box(&probs[h * TOKENS + first..][..TILE]),
                        n_rows: 1,
                        row_stride: TILE,
                    };
                    p.ingest_softmax_tile(0, tile).unwrap();
                }
            }
            black_box(p.end_call(0).unwrap())
        })
    });
    let mut p = policy();
    g.bench_function("column_sums_ingest_plan", |b| {
        b.iter(|| {
            p.begin_call(0, shape()).unwrap();
            p.ingest_column_sums(0, black_box(&cols)).unwrap();
            black_box(p.end_call(0).unwrap())
        })
    });
    let mut p = policy();
    g.bench_function("block_sums_ingest_plan", |b| {
        b.iter(|| {
            p.begin_call(0, shape()).unwrap();
            p.ingest_block_sums(0, black_box(&blocks)).unwrap();
            black_box(p.end_call(0).unwrap())
        })
    });

    let q = rand_vec(HEADS * HEAD_DIM, &mut seed);
    let k = rand_vec(HEADS * TOKENS * HEAD_DIM, &mut seed);
    let mut out = vec![0.0f32; HEADS * TOKENS];
    g.bench_function("reference_f32_qk_softmax", |b| {
        b.iter(|| {
            qk_softmax(black_box(&q), black_box(&k), &mut out);
            black_box(out[0])
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
