//! Best-of-N wall time of one llama-7B-like layer (32 KV heads, head_dim 128, factor 5,
//! 4096 tokens, f16 K and V) on one thread and on all threads. On a shared machine the best
//! of several runs is the closest to an unloaded one; compare it with an FMA peak probe run
//! alongside. `cargo run --release -p kvc-mlp --example layer_timing [runs]`

use std::time::Instant;

use kvc_mlp::{f16, Compressor, CompressorWeights, KvShape, LayerMlps, Linear, Mlp};

const H: usize = 32;
const D: usize = 128;
const F: usize = 5;
const S: usize = 4096;

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
        Linear::new(o, i, &w, Some(&noise(o, s + 1, 0.1))).unwrap()
    };
    Mlp::new([
        lin(D, D * F, seed),
        lin(D, D, seed + 2),
        lin(D, D, seed + 4),
    ])
    .unwrap()
}

fn main() {
    let runs: usize = std::env::args().nth(1).map_or(5, |a| a.parse().unwrap());
    let layer = LayerMlps {
        text_k: Some(mlp(1)),
        text_v: Some(mlp(2)),
        image_k: None,
        image_v: None,
    };
    let comp = Compressor::new(CompressorWeights::from_layers(D, F, 2, vec![layer]).unwrap());
    let params = comp.default_params();
    let k: Vec<f16> = noise(H * S * D, 7, 2.0)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let v: Vec<f16> = noise(H * S * D, 8, 2.0)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let shape = KvShape {
        heads: H,
        seq_len: S,
        head_dim: D,
    };
    let s_new = comp.plan(0, S, &params).unwrap().lengths().kv_len;
    let (mut ok, mut ov) = (
        vec![f16::ZERO; H * s_new * D],
        vec![f16::ZERO; H * s_new * D],
    );
    let flops = (2 * H * (S / F) * 2 * (D * F * D + 2 * D * D)) as f64;
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for (name, pool) in [("one thread", Some(&one)), ("all threads", None)] {
        let mut best = f64::MAX;
        for _ in 0..runs {
            let t = Instant::now();
            let mut go = || {
                comp.compress_layer(0, shape, &k, &v, &mut ok, &mut ov, &params)
                    .unwrap()
            };
            match pool {
                Some(p) => p.install(go),
                None => go(),
            };
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{name:12} ({} rayon threads): best of {runs}: {:.1} ms per layer, {:.1} GFLOP/s",
            pool.map_or(rayon::current_num_threads(), |p| p.current_num_threads()),
            best * 1e3,
            flops / best / 1e9
        );
    }
}
