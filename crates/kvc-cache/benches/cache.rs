//! Criterion benches of kvc-cache: compaction on a 32-layer 8k-token cache (Llama-3-8B
//! KV shape: 8 heads x 128, f16). (C8's are kvc-int8's `benches/c8.rs`.)

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvc_cache::{compact_shared, KvLayout, OwnedCache, ReservePlan};
use kvc_types::Dtype;

const LAYERS: usize = 32;
const TOKENS: usize = 8192;
const HEADS: usize = 8;
const DIM: usize = 128;

fn plan() -> ReservePlan {
    // Sink 32, recent 256, every 7th block of 64 twice: about 1 in 3.5 kept.
    let keep: Vec<bool> = (0..TOKENS)
        .map(|t| !(32..TOKENS - 256).contains(&t) || (t / 64) % 7 < 2)
        .collect();
    ReservePlan::from_mask(&keep)
}

fn compaction(c: &mut Criterion) {
    let plan = plan();
    let mut g = c.benchmark_group("compaction_32x8k");
    g.sample_size(10);
    for (name, layout) in [
        (
            "llama_vtrans",
            KvLayout::llama(Dtype::F16, HEADS, DIM, DIM, TOKENS, true).unwrap(),
        ),
        (
            "llama_vrows",
            KvLayout::llama(Dtype::F16, HEADS, DIM, DIM, TOKENS, false).unwrap(),
        ),
        (
            "infinilm",
            KvLayout::infinilm(Dtype::F16, HEADS, DIM, TOKENS).unwrap(),
        ),
        (
            // An MNN packed cache (hP 8, lP 2), flash-attention block 64.
            "mnn_hp8_lp2_flash64",
            KvLayout::mnn(Dtype::F16, HEADS, DIM, TOKENS, 8, 2, Some(64)).unwrap(),
        ),
    ] {
        let mut cache = OwnedCache::uniform(layout, LAYERS).unwrap();
        for mut l in cache.layers_mut().unwrap() {
            let (k, v) = l.kv_mut();
            k.fill(1);
            v.fill(2);
        }
        g.throughput(Throughput::Bytes(cache.byte_len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut ls = cache.layers_mut().unwrap();
                black_box(compact_shared(&mut ls, &plan, None).unwrap());
            })
        });
    }
    g.finish();
}

criterion_group!(benches, compaction);
criterion_main!(benches);
