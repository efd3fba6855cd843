//! Criterion benches of kvc-int8: C8 quantize / dequantize throughput on one layer of an
//! 8k-token cache (Llama-3-8B KV shape: 8 heads x 128), and the C8 error per layer on the
//! embedded real-KV sample (printed once, not timed).

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvc_cache::{Addressing, TensorLayout};
use kvc_int8::{calibrate, dequantize, quant_error, quantize};
use kvc_types::Dtype;

const TOKENS: usize = 8192;
const HEADS: usize = 8;
const DIM: usize = 128;

fn quant(c: &mut Criterion) {
    let mut g = c.benchmark_group("c8_one_layer_8k");
    for dt in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
        let l = TensorLayout::new(Addressing::CellRows, dt, HEADS, DIM, TOKENS).unwrap();
        let li = l.with_dtype(Dtype::I8).unwrap();
        let src: Vec<u8> = (0..l.byte_len()).map(|i| (i * 7 % 61) as u8).collect();
        let q = calibrate(&src, &l, 0..TOKENS, false).unwrap();
        let mut i8b = vec![0u8; li.byte_len()];
        let mut back = vec![0u8; l.byte_len()];
        g.throughput(Throughput::Bytes(l.byte_len() as u64));
        g.bench_function(format!("quantize_{dt}"), |b| {
            b.iter(|| quantize(&src, &l, &mut i8b, &li, 0..TOKENS, &q).unwrap())
        });
        g.bench_function(format!("dequantize_{dt}"), |b| {
            b.iter(|| dequantize(&i8b, &li, &mut back, &l, 0..TOKENS, &q).unwrap())
        });
    }
    g.finish();
}

fn c8_error_report(_: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample");
    for t in ["K", "V"] {
        let raw = std::fs::read(dir.join(format!("textA.{t}.f16.bin"))).unwrap();
        let l = TensorLayout::new(Addressing::CellRows, Dtype::F16, 3, 64, 512).unwrap();
        for layer in 0..4 {
            let s = &raw[layer * l.byte_len()..(layer + 1) * l.byte_len()];
            for sym in [true, false] {
                let q = calibrate(s, &l, 0..512, sym).unwrap();
                let e = quant_error(s, &l, 0..512, &q).unwrap();
                eprintln!(
                    "c8 {t} layer {layer} {}: rms {:.3e} snr {:.2} dB max_abs {:.3e}",
                    if sym { "sym " } else { "asym" },
                    e.rms(),
                    e.snr_db(),
                    e.max_abs
                );
            }
        }
    }
}

criterion_group!(benches, c8_error_report, quant);
criterion_main!(benches);
