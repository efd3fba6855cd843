//! `kvc quant apply --kvq` then `kvc quant dequant --kvq` on the embedded sample
//! (`data/sample/textA.{K,V}.f16.bin`, shape from the JSON sidecar): for a config, a plan
//! and a K channel group, the packed bodies and the decoded caches are bit for bit what
//! `RowCodec` / `ChannelGroupCodec` give when called directly, the reported errors are the
//! ones those give, and the reported bytes are the files' sizes. Bad files: exit status 2
//! and one line.

use std::path::{Path, PathBuf};
use std::process::Command;

use half::f16;
use kvc_kvq::{ChannelGroupCodec, KvqConfig, KvqPlan, RowCodec};
use serde_json::Value;

fn kvc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
}

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/sample")
        .join(name)
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvc-kvq-apply-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `[layers, tokens, kv_heads, head_dim]` from a sidecar.
fn shape_of(json: &str) -> [usize; 4] {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(sample(json)).unwrap()).unwrap();
    let s: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    [s[0], s[1], s[2], s[3]]
}

fn f16_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

fn f32_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The first `tokens` tokens of each layer of a raw f16 cache.
fn cut(raw: &[u8], s: [usize; 4], tokens: usize) -> Vec<u8> {
    let per_tok = s[2] * s[3] * 2;
    (0..s[0])
        .flat_map(|l| raw[l * s[1] * per_tok..][..tokens * per_tok].to_vec())
        .collect()
}

/// What the library gives, called directly: the packed body and the decoded values.
fn reference(
    x: &[f32],
    s: [usize; 4],
    bits: &[u8],
    cfg: &KvqConfig,
    group: Option<usize>,
) -> (Vec<u8>, Vec<f32>, Vec<(f64, f64)>) {
    let [nl, nt, nh, d] = s;
    let mut body = Vec::new();
    let mut back = vec![0f32; x.len()];
    let mut err = Vec::new();
    for (l, &b) in bits.iter().enumerate().take(nl) {
        let at = |t: usize, h: usize| ((l * nt + t) * nh + h) * d;
        match group {
            None => {
                let c = RowCodec::new(cfg.method, b, d, cfg.seed).unwrap();
                let mut row = vec![0u8; c.row_bytes()];
                for t in 0..nt {
                    for h in 0..nh {
                        let o = at(t, h);
                        c.quantize_row(&x[o..o + d], &mut row).unwrap();
                        c.dequantize_row(&row, &mut back[o..o + d]).unwrap();
                        body.extend_from_slice(&row);
                    }
                }
            }
            Some(g) => {
                let c = ChannelGroupCodec::new(b, d, g).unwrap();
                let mut blk = vec![0u8; c.block_bytes()];
                let mut dec = vec![0f32; g * d];
                for h in 0..nh {
                    for b in 0..nt / g {
                        let rows: Vec<f32> = (0..g)
                            .flat_map(|r| x[at(b * g + r, h)..][..d].to_vec())
                            .collect();
                        c.quantize_block(&rows, &mut blk).unwrap();
                        c.dequantize_block(&blk, &mut dec).unwrap();
                        for r in 0..g {
                            back[at(b * g + r, h)..][..d].copy_from_slice(&dec[r * d..][..d]);
                        }
                        body.extend_from_slice(&blk);
                    }
                }
                for t in nt / g * g..nt {
                    for h in 0..nh {
                        for j in 0..d {
                            let v = f16::from_f32(x[at(t, h) + j]);
                            body.extend_from_slice(&v.to_le_bytes());
                            back[at(t, h) + j] = v.to_f32();
                        }
                    }
                }
            }
        }
        let (mut sig, mut noise) = (0f64, 0f64);
        for i in at(0, 0)..at(0, 0) + nt * nh * d {
            let (a, b) = (f64::from(x[i]), f64::from(back[i]));
            sig += a * a;
            noise += (a - b) * (a - b);
        }
        err.push((10.0 * (sig / noise).log10(), (noise / sig).sqrt()));
    }
    (body, back, err)
}

struct Case<'a> {
    tag: &'a str,
    spec: String,
    cfg: KvqConfig,
    k_bits: Vec<u8>,
    v_bits: Vec<u8>,
    group: Option<usize>,
    tokens: usize,
}

fn run_case(c: Case<'_>) {
    let dir = tmp(c.tag);
    let full = shape_of("textA.K.f16.json");
    assert_eq!(full, shape_of("textA.V.f16.json"));
    let s = [full[0], c.tokens, full[2], full[3]];
    let (k, v) = (
        cut(
            &std::fs::read(sample("textA.K.f16.bin")).unwrap(),
            full,
            c.tokens,
        ),
        cut(
            &std::fs::read(sample("textA.V.f16.bin")).unwrap(),
            full,
            c.tokens,
        ),
    );
    let (rk, rv) = (dir.join("k.f16"), dir.join("v.f16"));
    std::fs::write(&rk, &k).unwrap();
    std::fs::write(&rv, &v).unwrap();
    let (pk, pv, json) = (dir.join("k.kvq"), dir.join("v.kvq"), dir.join("r.json"));
    let mut cmd = kvc();
    cmd.args(["quant", "apply", "--kvq", &c.spec, "--dtype", "f16"])
        .args([
            "--layers",
            &s[0].to_string(),
            "--kv-heads",
            &s[2].to_string(),
        ])
        .args(["--head-dim", &s[3].to_string()])
        .arg("--k")
        .arg(&rk)
        .arg("--v")
        .arg(&rv)
        .arg("--out-k")
        .arg(&pk)
        .arg("--out-v")
        .arg(&pv)
        .arg("--json")
        .arg(&json);
    if let Some(g) = c.group {
        cmd.args(["--k-channel-group", &g.to_string()]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(table.contains("ratio"), "{table}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["tokens"].as_u64(), Some(c.tokens as u64));

    let (xk, xv) = (f16_values(&k), f16_values(&v));
    let (bk, dk, ek) = reference(&xk, s, &c.k_bits, &c.cfg, c.group);
    let (bv, dv, ev) = reference(&xv, s, &c.v_bits, &c.cfg, None);

    // Bytes: the report's are the files' sizes; bodies are the library's bytes.
    let mut file_bytes = 0;
    for (name, path, body, side) in [("k_file", &pk, &bk, "k"), ("v_file", &pv, &bv, "v")] {
        let f = &r[name];
        let file = std::fs::read(path).unwrap();
        let n = |k: &str| f[k].as_u64().unwrap() as usize;
        assert_eq!(n("file_bytes"), file.len());
        assert_eq!(n("header_bytes") + n("body_bytes"), file.len());
        let layer_sum: u64 = r["per_layer"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l[side]["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(layer_sum as usize, n("body_bytes"));
        assert!(file[n("header_bytes")..] == body[..], "{name} body");
        file_bytes += file.len();
    }
    let f16_bytes = 2 * k.len();
    assert_eq!(r["f16_bytes"].as_u64(), Some(f16_bytes as u64));
    assert_eq!(
        r["ratio_vs_f16"].as_f64(),
        Some(f16_bytes as f64 / file_bytes as f64)
    );
    // Errors: the library's.
    for (l, row) in r["per_layer"].as_array().unwrap().iter().enumerate() {
        for (side, e, bits) in [("k", &ek, &c.k_bits), ("v", &ev, &c.v_bits)] {
            assert_eq!(row[side]["bits"].as_u64(), Some(u64::from(bits[l])));
            let snr = row[side]["snr_db"].as_f64().unwrap();
            let rel = row[side]["rel_rms"].as_f64().unwrap();
            assert!(
                (snr - e[l].0).abs() < 1e-9,
                "layer {l} {side}: {snr} {}",
                e[l].0
            );
            assert!(
                (rel - e[l].1).abs() < 1e-12,
                "layer {l} {side}: {rel} {}",
                e[l].1
            );
            assert!(snr > 5.0 && snr < 60.0, "{snr}");
        }
    }

    // Dequant to f32: bit for bit the library's decoded values.
    let (ok, ov) = (dir.join("k.f32"), dir.join("v.f32"));
    let o = kvc()
        .args(["quant", "dequant", "--kvq", "--dtype", "f32"])
        .args(["--layers", &s[0].to_string()])
        .arg("--k")
        .arg(&pk)
        .arg("--v")
        .arg(&pv)
        .arg("--out-k")
        .arg(&ok)
        .arg("--out-v")
        .arg(&ov)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (gk, gv) = (
        f32_values(&std::fs::read(&ok).unwrap()),
        f32_values(&std::fs::read(&ov).unwrap()),
    );
    assert_eq!(gk.len(), dk.len());
    assert!(gk.iter().zip(&dk).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(gv.iter().zip(&dv).all(|(a, b)| a.to_bits() == b.to_bits()));
    // And to f16: the same values rounded.
    let o = kvc()
        .args(["quant", "dequant", "--kvq", "--dtype", "f16"])
        .arg("--k")
        .arg(&pk)
        .arg("--v")
        .arg(&pv)
        .arg("--out-k")
        .arg(&ok)
        .arg("--out-v")
        .arg(&ov)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let hk = std::fs::read(&ok).unwrap();
    assert_eq!(hk.len(), k.len());
    assert!(f16_values(&hk)
        .iter()
        .zip(&dk)
        .all(|(a, b)| a.to_bits() == f16::from_f32(*b).to_f32().to_bits()));

    bad_files(&dir, &pk, &pv, s[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Truncated, swapped and mismatched files: exit status 2, one line naming the problem.
fn bad_files(dir: &Path, pk: &Path, pv: &Path, layers: usize) {
    let deq = |k: &Path, v: &Path, extra: &[&str]| {
        let o = kvc()
            .args(["quant", "dequant", "--kvq", "--dtype", "f16"])
            .args(extra)
            .arg("--k")
            .arg(k)
            .arg("--v")
            .arg(v)
            .arg("--out-k")
            .arg(dir.join("bad.k"))
            .arg("--out-v")
            .arg(dir.join("bad.v"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        e
    };
    let file = std::fs::read(pk).unwrap();
    let short = dir.join("short.kvq");
    for n in [0, 7, 20, file.len() / 2, file.len() - 1] {
        std::fs::write(&short, &file[..n]).unwrap();
        let e = deq(&short, pv, &[]);
        assert!(e.contains("not a valid kvq packed file"), "{e}");
    }
    assert!(deq(pv, pk, &[]).contains("holds V, expected K"));
    let wrong = (layers + 1).to_string();
    assert!(deq(pk, pv, &["--layers", &wrong]).contains("--layers"));
}

#[test]
fn config_round_trip_is_the_row_codecs() {
    let cfg = KvqConfig::parse("k4v2:u32").unwrap();
    let n = shape_of("textA.K.f16.json")[0];
    run_case(Case {
        tag: "cfg",
        spec: "k4v2:u32".into(),
        cfg,
        k_bits: vec![4; n],
        v_bits: vec![2; n],
        group: None,
        tokens: 512,
    });
}

/// A real calibrated plan (SmolLM2-135M, ratio 5), cut to the sample's layers: mixed bits.
fn sample_plan(dir: &Path, layers: usize) -> (PathBuf, KvqPlan) {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/kvq-plans/smollm2-135m-r5.json"),
    )
    .unwrap();
    let mut p = KvqPlan::from_json(&text).unwrap();
    p.layers.truncate(layers);
    p.calibration = None;
    p.version = 1;
    let path = dir.join("plan.json");
    std::fs::write(&path, p.to_json()).unwrap();
    (path, p)
}

#[test]
fn plan_round_trip_is_the_row_codecs() {
    let n = shape_of("textA.K.f16.json")[0];
    let (path, p) = sample_plan(&tmp("planfile"), n);
    let bits: Vec<(u8, u8)> = p.layers.iter().map(|l| (l.k_bits, l.v_bits)).collect();
    assert!(
        bits.windows(2).any(|w| w[0] != w[1]),
        "the plan's first layers should differ: {bits:?}"
    );
    run_case(Case {
        tag: "plan",
        spec: path.display().to_string(),
        cfg: p.layer_config(0).unwrap(),
        k_bits: bits.iter().map(|b| b.0).collect(),
        v_bits: bits.iter().map(|b| b.1).collect(),
        group: None,
        tokens: 512,
    });
}

#[test]
fn channel_group_round_trip_is_the_channel_codec_with_an_f16_tail() {
    let cfg = KvqConfig::parse("k4v4").unwrap();
    let n = shape_of("textA.K.f16.json")[0];
    // 500 tokens in groups of 32: 15 blocks per head and a 20-token f16 tail.
    run_case(Case {
        tag: "group",
        spec: "k4v4".into(),
        cfg,
        k_bits: vec![4; n],
        v_bits: vec![4; n],
        group: Some(32),
        tokens: 500,
    });
}

#[test]
fn bad_specs_and_shapes_are_one_line_errors() {
    let dir = tmp("bad");
    let (k, v) = (sample("textA.K.f16.bin"), sample("textA.V.f16.bin"));
    let apply = |extra: &[&str]| {
        let o = kvc()
            .args(["quant", "apply", "--dtype", "f16", "--kv-heads", "3"])
            .args(["--head-dim", "64"])
            .args(extra)
            .arg("--k")
            .arg(&k)
            .arg("--v")
            .arg(&v)
            .arg("--out-k")
            .arg(dir.join("k"))
            .arg("--out-v")
            .arg(dir.join("v"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let plan =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/kvq-plans/smollm2-135m-r5.json");
    let e = apply(&["--layers", "4", "--kvq", plan.to_str().unwrap()]);
    assert!(e.contains("the plan has 30 layers, the cache has 4"), "{e}");
    let e = apply(&["--layers", "4", "--kvq", "k9v4"]);
    assert!(e.contains("neither a plan file nor a config string"), "{e}");
    let e = apply(&["--layers", "4", "--kvq", "k4v4", "--k-channel-group", "24"]);
    assert!(e.contains("channel group"), "{e}");
    let e = apply(&["--layers", "5", "--kvq", "k4v4"]);
    assert!(e.contains("not a whole number of tokens"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
