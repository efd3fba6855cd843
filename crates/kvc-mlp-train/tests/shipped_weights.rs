//! The weights shipped in `data/mlp-weights/` load with kvc-mlp, carry their sidecar, and
//! kvc-mlp's inference on real K/V (the embedded sample, `data/sample`, layers 0-3 of
//! SmolLM2-135M) matches the trainer's own forward pass.

use std::path::{Path, PathBuf};

use kvc_mlp::{f16, CompressParams, Compressor, CompressorWeights, KvShape};
use kvc_mlp_train::{MlpCache, MlpParams};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const FACTORS: [usize; 3] = [2, 4, 5];

/// `[L][T][H][D]` f16 of the sample as f32 `[H][T][D]` of one layer.
fn sample_layer(which: &str, layer: usize) -> (Vec<f32>, KvShape) {
    let dir = repo().join("data/sample");
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("textA.{which}.f16.json"))).unwrap(),
    )
    .unwrap();
    let s: Vec<usize> = meta["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let (t, h, d) = (s[1], s[2], s[3]);
    let bytes = std::fs::read(dir.join(format!("textA.{which}.f16.bin"))).unwrap();
    let base = layer * t * h * d;
    let mut out = vec![0f32; t * h * d];
    for tok in 0..t {
        for hh in 0..h {
            for c in 0..d {
                let i = 2 * (base + (tok * h + hh) * d + c);
                out[(hh * t + tok) * d + c] =
                    f16::from_bits(u16::from_le_bytes([bytes[i], bytes[i + 1]])).to_f32();
            }
        }
    }
    (
        out,
        KvShape {
            heads: h,
            seq_len: t,
            head_dim: d,
        },
    )
}

#[test]
fn shipped_weights_load_and_match_the_trainers_forward_pass() {
    for f in FACTORS {
        let bin = repo().join(format!("data/mlp-weights/smollm2-135m-f{f}.bin"));
        let w = CompressorWeights::load(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let side: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(bin.with_extension("json")).unwrap())
                .unwrap();
        assert_eq!((w.factor(), w.head_dim(), w.num_layers()), (f, 64, 30));
        assert_eq!(w.header().unwrap().dtype, kvc_types::FloatDtype::F16);
        assert_eq!(side["factor"], f);
        assert_eq!(side["model"]["n_layer"], 30);
        assert_eq!(side["layers"].as_array().unwrap().len(), 30);
        assert!(side["summary"]["val_rel_err"].as_f64().unwrap() > 0.0);
        let texts = side["texts"]["train"].as_array().unwrap();
        assert!(!texts.is_empty());
        for t in texts
            .iter()
            .chain(side["texts"]["validation"].as_array().unwrap())
        {
            let src = t["text_source"].as_str().unwrap();
            assert!(
                !src.starts_with("gpl-3") && !src.contains("onstitution"),
                "{src}"
            );
            assert!(t["licence"].is_string(), "{t}");
        }
        let comp = Compressor::new(w);
        let params = CompressParams {
            factor: f,
            min_seq_len: 1,
            image_kv_len: 0,
        };
        let mut worst = 0f32;
        for layer in 0..4 {
            let (k, shape) = sample_layer("K", layer);
            let (v, _) = sample_layer("V", layer);
            let (t, d) = (shape.seq_len, shape.head_dim);
            let groups = t / f;
            let mut ok = vec![0f32; k.len()];
            let mut ov = vec![0f32; v.len()];
            let lens = comp
                .compress_layer(layer, shape, &k, &v, &mut ok, &mut ov, &params)
                .unwrap();
            assert_eq!(lens.kv_len, groups + t % f);
            let mlps = comp.weights().layer(layer).unwrap();
            for (src, got, mlp) in [
                (&k, &ok, mlps.text_k.as_ref().unwrap()),
                (&v, &ov, mlps.text_v.as_ref().unwrap()),
            ] {
                let p = MlpParams::from_kvc(mlp);
                let mut cache = MlpCache::default();
                for h in 0..shape.heads {
                    let x = &src[h * t * d..(h * t + groups * f) * d];
                    let want = p.forward(x, groups, &mut cache);
                    let got = &got[h * lens.kv_len * d..(h * lens.kv_len + groups) * d];
                    let scale = want.iter().fold(1f32, |m, y| m.max(y.abs()));
                    for (a, b) in got.iter().zip(want) {
                        let e = (a - b).abs() / scale;
                        worst = worst.max(e);
                    }
                }
            }
        }
        // Two f32 GEMM orders of the same products: agreement to a few ulps of the largest
        // output.
        assert!(
            worst < 1e-5,
            "factor {f}: worst error {worst:e} of the largest output"
        );
        eprintln!("factor {f}: kvc-mlp vs trainer forward, worst |diff| / max|y| = {worst:.2e}");
    }
}

/// The logit-distilled files (`scripts/mlp-distill`) load with kvc-mlp, compress real K/V
/// to finite rows, and carry a sidecar that names their data and shows the validation KL
/// they were chosen by, below their start and below mean pooling.
#[test]
fn distilled_weights_load_and_their_sidecars_hold() {
    let texts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("data/mlp-weights/smollm2-135m-distill-texts.json"))
            .unwrap(),
    )
    .unwrap();
    for t in texts["texts"].as_array().unwrap() {
        let file = t["file"].as_str().unwrap();
        assert!(
            !file.ends_with("/GPL-3") && !file.contains("onstitution"),
            "{file}"
        );
        assert!(t["licence"].is_string(), "{t}");
    }
    for f in [4usize, 5] {
        let bin = repo().join(format!("data/mlp-weights/smollm2-135m-distill-f{f}.bin"));
        let w = CompressorWeights::load(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        assert_eq!((w.factor(), w.head_dim(), w.num_layers()), (f, 64, 30));
        assert_eq!(w.header().unwrap().dtype, kvc_types::FloatDtype::F16);
        let side: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(bin.with_extension("json")).unwrap())
                .unwrap();
        assert_eq!(side["kind"], "kvc-mlp-distill sidecar v1");
        assert_eq!(side["model"]["n_layer"], 30);
        let kl = &side["validation_kl"];
        let (start, mean_pool, end) = (
            kl["start"]["mean"].as_f64().unwrap(),
            kl["mean_pooling"]["mean"].as_f64().unwrap(),
            kl["end_stored"]["mean"].as_f64().unwrap(),
        );
        assert!(end > 0.0 && end < start && start < mean_pool, "{kl}");

        let comp = Compressor::new(w);
        let params = CompressParams {
            factor: f,
            min_seq_len: 1,
            image_kv_len: 0,
        };
        let (k, shape) = sample_layer("K", 0);
        let (v, _) = sample_layer("V", 0);
        let mut ok = vec![0f32; k.len()];
        let mut ov = vec![0f32; v.len()];
        let lens = comp
            .compress_layer(0, shape, &k, &v, &mut ok, &mut ov, &params)
            .unwrap();
        assert_eq!(lens.kv_len, shape.seq_len / f + shape.seq_len % f);
        let held = shape.heads * lens.kv_len * shape.head_dim;
        assert!(ok[..held].iter().chain(&ov[..held]).all(|x| x.is_finite()));
    }
}
