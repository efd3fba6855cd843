//! The llama-7B-like case: 32 KV heads, head_dim 128, factor 5, 4096 tokens, f16 cache.
//!
//! Criterion's throughput is in FLOP ("elements" = floating-point operations of the three
//! GEMMs, 2 per multiply-add), so `thrpt` reads as FLOP/s. One layer is timed on one core
//! (a one-thread rayon pool) and on all cores; four layers at once show the all-layers path
//! (the full 32-layer model is 32x the per-layer time and 2 GiB of cache).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvc_mlp::{
    f16, CacheShape, Compressor, CompressorWeights, KvShape, LayerKv, LayerMlps, Linear, Mlp,
};

const H: usize = 32;
const D: usize = 128;
const F: usize = 5;
const S: usize = 4096;

/// Deterministic pseudo-random values in [-scale, scale).
fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn mlp(seed: u64) -> Mlp {
    let lin = |o: usize, i: usize, s: u64| {
        let w = noise(o * i, s, 1.0 / (i as f32).sqrt());
        let b = noise(o, s + 1, 0.1);
        Linear::new(o, i, &w, Some(&b)).unwrap()
    };
    Mlp::new([
        lin(D, D * F, seed),
        lin(D, D, seed + 2),
        lin(D, D, seed + 4),
    ])
    .unwrap()
}

fn compressor(layers: usize) -> Compressor {
    let layers = (0..layers as u64)
        .map(|l| LayerMlps {
            text_k: Some(mlp(l * 100)),
            text_v: Some(mlp(l * 100 + 10)),
            image_k: None,
            image_v: None,
        })
        .collect();
    Compressor::new(CompressorWeights::from_layers(D, F, 2, layers).unwrap())
}

fn kv(seed: u64) -> Vec<f16> {
    noise(H * S * D, seed, 2.0)
        .into_iter()
        .map(f16::from_f32)
        .collect()
}

/// FLOPs of one layer: K and V, H heads, S/F groups, D*F*D + 2*D*D multiply-adds each.
fn layer_flops() -> u64 {
    (2 * H * (S / F) * 2 * (D * F * D + 2 * D * D)) as u64
}

fn bench(c: &mut Criterion) {
    let comp = compressor(4);
    let params = comp.default_params();
    let (k, v) = (kv(1), kv(2));
    let shape = KvShape {
        heads: H,
        seq_len: S,
        head_dim: D,
    };
    let s_new = comp.plan(0, S, &params).unwrap().lengths().kv_len;
    let mut ok = vec![f16::ZERO; H * s_new * D];
    let mut ov = ok.clone();

    let mut g = c.benchmark_group("mlp_llama7b_layer");
    g.sample_size(10);
    g.measurement_time(std::time::Duration::from_secs(12));
    g.throughput(Throughput::Elements(layer_flops()));
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    g.bench_function("one_core", |b| {
        b.iter(|| {
            one.install(|| {
                comp.compress_layer(0, shape, &k, &v, &mut ok, &mut ov, &params)
                    .unwrap()
            })
        })
    });
    g.bench_function(format!("all_cores_{}", rayon::current_num_threads()), |b| {
        b.iter(|| {
            comp.compress_layer(0, shape, &k, &v, &mut ok, &mut ov, &params)
                .unwrap()
        })
    });
    g.finish();

    // Four layers in place, all layers and heads in parallel.
    let mut bufs: Vec<(Vec<f16>, Vec<f16>)> = (0..4).map(|l| (kv(10 + l), kv(20 + l))).collect();
    let cache = CacheShape {
        heads: H,
        capacity: S,
        seq_len: S,
        head_dim: D,
    };
    let mut g = c.benchmark_group("mlp_llama7b_4_layers_inplace");
    g.sample_size(10);
    g.measurement_time(std::time::Duration::from_secs(20));
    g.throughput(Throughput::Elements(4 * layer_flops()));
    g.bench_function(format!("all_cores_{}", rayon::current_num_threads()), |b| {
        b.iter(|| {
            let mut layers: Vec<LayerKv<'_, f16>> = bufs
                .iter_mut()
                .enumerate()
                .map(|(layer, (k, v))| LayerKv { layer, k, v })
                .collect();
            // Each pass compresses the first S rows again; the data changes, the work does not.
            comp.compress_layers_inplace(&mut layers, cache, &params)
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
