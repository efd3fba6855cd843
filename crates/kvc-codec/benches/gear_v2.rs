//! gear-v2 on the real KV data: ratio (whole model, headers included) and MB/s of
//! uncompressed data, one core and all cores (rayon over chunks).
//!
//! Data: `KVC_REALKV_DIR`, else `../shared/data/realkv`, else `data/sample/`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvc_codec::gear_v2::{Decoder, EncodeParams, Encoder};
use kvc_codec::Dtype;

// Shared with the examples and the round-trip test; the bench uses the data directory and
// the tensor kind.
#[allow(dead_code)]
#[path = "../examples/common/realkv.rs"]
mod realkv;

/// Layers of one dump as `[tokens, 192]` tensors, read from the JSON sidecar's shape.
fn layers(dir: &std::path::Path, name: &str) -> Option<Vec<Vec<u8>>> {
    let data = std::fs::read(dir.join(format!("textA.{name}.bin"))).ok()?;
    let json = std::fs::read_to_string(dir.join(format!("textA.{name}.json"))).ok()?;
    let v: serde_json::Value = serde_json::from_str(&json).ok()?;
    let shape = v.get("shape")?.as_array()?;
    let n_layer = shape.first()?.as_u64()? as usize;
    let per = data.len() / n_layer;
    Some(data.chunks(per).map(<[u8]>::to_vec).collect())
}

fn bench(c: &mut Criterion) {
    let dir = realkv::data_dir();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for name in ["K.f16", "V.f16", "K.bf16", "V.bf16"] {
        let Some(layers) = layers(&dir, name) else {
            continue;
        };
        let dtype = if name.ends_with("bf16") {
            Dtype::Bf16
        } else {
            Dtype::F16
        };
        let mut params = EncodeParams::new(dtype, 192);
        params.kind = realkv::tensor_kind(name);
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        let blobs: Vec<Vec<u8>> = layers
            .iter()
            .map(|l| enc.encode(&params, l).unwrap())
            .collect();
        let raw: usize = layers.iter().map(Vec::len).sum();
        let stored: usize = blobs.iter().map(Vec::len).sum();
        for (l, b) in layers.iter().zip(&blobs) {
            assert_eq!(&dec.decode(b).unwrap(), l);
        }
        println!(
            "gear-v2 {name}: {} layers, {raw} -> {stored} bytes, ratio {:.4}",
            layers.len(),
            raw as f64 / stored as f64
        );
        let mut g = c.benchmark_group(format!("gear_v2/{name}"));
        g.throughput(Throughput::Bytes(raw as u64));
        g.sample_size(10);
        let mut out = Vec::new();
        let mut buf = vec![0u8; layers[0].len()];
        g.bench_function("compress_1core", |b| {
            b.iter(|| {
                for l in &layers {
                    enc.encode_into(&params, l, &mut out).unwrap();
                }
            })
        });
        g.bench_function("decompress_1core", |b| {
            b.iter(|| {
                for blob in &blobs {
                    dec.decode_into(blob, &mut buf).unwrap();
                }
            })
        });
        g.bench_function("compress_all_cores", |b| {
            b.iter(|| {
                for l in &layers {
                    enc.encode_into_parallel(&params, l, &mut out).unwrap();
                }
            })
        });
        g.bench_function("decompress_all_cores", |b| {
            b.iter(|| {
                for blob in &blobs {
                    dec.open(blob)
                        .unwrap()
                        .decode_into_parallel(&mut buf)
                        .unwrap();
                }
            })
        });
        g.bench_function("compress_1core_pool", |b| {
            one.install(|| {
                b.iter(|| {
                    for l in &layers {
                        enc.encode_into_parallel(&params, l, &mut out).unwrap();
                    }
                })
            })
        });
        g.finish();
    }
}

/// The restore path of `kvc-store-tiers`: one blob per layer and 256-token section (what a
/// tier chunk holds), each opened (header, model, tables) and decoded alone, one core.
/// `open` is the per-blob table build alone; `decompress_1core` is open plus decode.
fn bench_sections(c: &mut Criterion) {
    let dir = realkv::data_dir();
    for name in ["K.f16", "V.f16"] {
        let Some(layers) = layers(&dir, name) else {
            continue;
        };
        let mut params = EncodeParams::new(Dtype::F16, 192);
        params.kind = realkv::tensor_kind(name);
        let section = params.chunk_tokens as usize * 192 * 2;
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        let sections: Vec<&[u8]> = layers
            .iter()
            .flat_map(|l| l.chunks_exact(section))
            .collect();
        let blobs: Vec<Vec<u8>> = sections
            .iter()
            .map(|s| enc.encode(&params, s).unwrap())
            .collect();
        for (s, b) in sections.iter().zip(&blobs) {
            assert_eq!(&dec.decode(b).unwrap()[..], *s);
        }
        let raw = sections.len() * section;
        let mut g = c.benchmark_group(format!("gear_v2_sections/{name}"));
        g.throughput(Throughput::Bytes(raw as u64));
        g.sample_size(10);
        let mut buf = vec![0u8; section];
        g.bench_function("open", |b| {
            b.iter(|| {
                for blob in &blobs {
                    std::hint::black_box(dec.open(blob).unwrap().chunk_count());
                }
            })
        });
        g.bench_function("decompress_1core", |b| {
            b.iter(|| {
                for blob in &blobs {
                    dec.decode_into(blob, &mut buf).unwrap();
                }
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench, bench_sections);
criterion_main!(benches);
