//! One-core kvq row speed on synthetic Gaussian rows: quantize and dequantize GB/s (of
//! f16-equivalent bytes, 2 per value) for a few configs, with the f32 -> f16 conversion of
//! the same rows (`half`) measured in the same run as a baseline.
//! `cargo run --release -p kvc-kvq --example kvq_speed`

use std::time::Instant;

use kvc_kvq::{KvqConfig, LayerCodec};

fn main() {
    let d = 64;
    let rows = 1 << 15;
    let mut x = vec![0f32; rows * d];
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for v in x.iter_mut() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0;
    }
    let bytes = (rows * d * 2) as f64;
    let mut h = vec![half::f16::ZERO; rows * d];
    let best = |f: &mut dyn FnMut()| {
        let mut b = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            f();
            b = b.min(t.elapsed().as_secs_f64());
        }
        b
    };
    let t = best(&mut || {
        for (o, v) in h.iter_mut().zip(&x) {
            *o = half::f16::from_f32(*v);
        }
    });
    println!("baseline f32->f16 convert: {:.2} GB/s", bytes / t / 1e9);
    for cfg in ["k8v8", "k4v4", "k3v3", "k2v2", "k4v4:u32"] {
        let c = LayerCodec::new(&KvqConfig::parse(cfg).unwrap(), d).unwrap();
        let mut p = vec![0u8; rows * c.k.row_bytes()];
        let tq = best(&mut || c.k.quantize_rows(&x, &mut p).unwrap());
        let mut y = vec![0f32; rows * d];
        let td = best(&mut || c.k.dequantize_rows(&p, &mut y).unwrap());
        println!(
            "{cfg:<10} quantize {:.2} GB/s  dequantize {:.2} GB/s",
            bytes / tq / 1e9,
            bytes / td / 1e9
        );
    }
}
