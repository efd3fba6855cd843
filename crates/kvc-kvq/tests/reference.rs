//! kvq against the NumPy float64 reference (`scripts/kvq_reference.py`, fixture
//! `tests/fixtures/kvq_reference.json`, regenerated and diffed by
//! `scripts/ci.d/45-kvq-reference.sh`).
//!
//! Tolerances: signs exact; codebook levels within 2e-6 absolute (float64 Lloyd in two
//! summation orders, both rounded to f32); rotation within 1e-5 of the row norm (f32
//! butterflies); dequantized rows within 1e-4 of the row norm (the reference picks codes
//! and scales in float64, Rust in f32: no code flips on this data, and the f16 scales
//! agree); attention on the dequantized cache within 1e-4 of the output norm.

use kvc_kvq::attention::{attend_head, HeadRows};
use kvc_kvq::config::DEFAULT_SEED;
use kvc_kvq::Isa;
use kvc_kvq::{LayerCodec, Method, RowCodec};
use serde_json::Value;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn matrix(v: &Value) -> Vec<Vec<f64>> {
    v.as_array().unwrap().iter().map(floats).collect()
}

fn norm(a: &[f64]) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn dist(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).powi(2))
        .sum::<f64>()
        .sqrt()
}

#[test]
fn kernels_match_the_numpy_reference() {
    let fx: Value =
        serde_json::from_str(include_str!("fixtures/kvq_reference.json")).expect("fixture");
    assert_eq!(fx["seed"].as_u64(), Some(DEFAULT_SEED));
    let best = Isa::detect();
    let mut isas = vec![Isa::PORTABLE];
    if best.is_avx2() {
        isas.push(best.without_avx512());
    }
    if best.is_avx512() {
        isas.push(best);
    }
    for case in fx["cases"].as_array().unwrap() {
        let d = case["head_dim"].as_u64().unwrap() as usize;
        // Rotation signs and the rotation itself.
        let c4 = RowCodec::new(Method::LloydMax, 4, d, DEFAULT_SEED).unwrap();
        let signs: Vec<f32> = floats(&case["signs"]).iter().map(|v| *v as f32).collect();
        assert_eq!(c4.rotation().signs(), &signs[..], "d {d}");
        let rows = matrix(&case["rows"]);
        for (x, want) in rows.iter().zip(matrix(&case["rotated"])) {
            let mut y: Vec<f32> = x.iter().map(|v| *v as f32).collect();
            c4.rotation().rotate(&mut y);
            assert!(dist(&y, &want) <= 1e-5 * norm(x), "d {d} rotation");
        }
        // Codebooks.
        for b in 2..=8u8 {
            let want = floats(&case["codebooks"][b.to_string()]);
            let got = RowCodec::new(Method::LloydMax, b, d, DEFAULT_SEED).unwrap();
            let e = got
                .levels()
                .iter()
                .zip(&want)
                .fold(0f64, |m, (a, b)| m.max((f64::from(*a) - b).abs()));
            assert!(e <= 2e-6, "d {d} bits {b}: codebook off by {e}");
        }
        // Row round trips and attention per config.
        let q: Vec<f32> = floats(&case["q"]).iter().map(|v| *v as f32).collect();
        let k: Vec<f32> = matrix(&case["k"])
            .concat()
            .iter()
            .map(|v| *v as f32)
            .collect();
        let v: Vec<f32> = matrix(&case["v"])
            .concat()
            .iter()
            .map(|v| *v as f32)
            .collect();
        let n = k.len() / d;
        for cfg in case["configs"].as_array().unwrap() {
            let bits = cfg["bits"].as_u64().unwrap() as u8;
            let m = match cfg["method"].as_str().unwrap() {
                "lm" => Method::LloydMax,
                u => Method::Uniform {
                    group: u[1..].parse().unwrap(),
                },
            };
            let c = RowCodec::new(m, bits, d, DEFAULT_SEED).unwrap();
            let mut p = vec![0u8; c.row_bytes()];
            let mut y = vec![0f32; d];
            for (x, want) in rows.iter().zip(matrix(&cfg["dequantized_rows"])) {
                let xf: Vec<f32> = x.iter().map(|v| *v as f32).collect();
                c.quantize_row(&xf, &mut p).unwrap();
                c.dequantize_row(&p, &mut y).unwrap();
                let e = dist(&y, &want) / norm(x);
                assert!(e <= 1e-4, "d {d} {m:?} {bits}: row off by {e}");
            }
            let layer = LayerCodec {
                k: c.clone(),
                v: c.clone(),
            };
            let mut pk = vec![0u8; n * c.row_bytes()];
            let mut pv = vec![0u8; n * c.row_bytes()];
            c.quantize_rows(&k, &mut pk).unwrap();
            c.quantize_rows(&v, &mut pv).unwrap();
            let want = floats(&cfg["attention_dequantized"]);
            for &isa in &isas {
                let mut sc = vec![0f32; n];
                let mut out = vec![0f32; d];
                let rows = |b| HeadRows {
                    bytes: b,
                    stride: c.row_bytes(),
                };
                attend_head(
                    isa,
                    &layer,
                    &q,
                    rows(&pk),
                    rows(&pv),
                    n,
                    1.0 / (d as f32).sqrt(),
                    &mut sc,
                    &mut out,
                )
                .unwrap();
                let e = dist(&out, &want) / norm(&want);
                assert!(e <= 1e-4, "d {d} {m:?} {bits}: attention off by {e}");
            }
        }
    }
}
