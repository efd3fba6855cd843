//! `kvc quant plan` as a user runs it, on a small synthetic dump written here in the
//! llama.cpp client's dump format; bad dumps give exit status 2 and a message that names
//! the file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvc_kvq::KvqPlan;

fn kvc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
}

const L: usize = 3;
const T: usize = 72;
const HQ: usize = 4;
const HK: usize = 2;
const D: usize = 64;

fn write_tensor(dir: &Path, name: &str, shape: [usize; 4], len: usize, seed: u64) {
    let mut s = seed;
    let mut bytes = Vec::with_capacity(len * 4);
    for i in 0..len {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Layers grow in scale so they differ in sensitivity.
        let x = (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * (1 + i % 3) as f32;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(dir.join(format!("t.{name}.f32.bin")), bytes).unwrap();
    let side = serde_json::json!({ "file": format!("t.{name}.f32.bin"), "shape": shape });
    std::fs::write(dir.join(format!("t.{name}.f32.json")), side.to_string()).unwrap();
}

fn dump(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvc-plan-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kv = [L, T, HK, D];
    write_tensor(&dir, "K", kv, L * T * HK * D, 1);
    write_tensor(&dir, "V", kv, L * T * HK * D, 2);
    write_tensor(&dir, "Q", [L, T, HQ, D], L * T * HQ * D, 3);
    dir
}

fn plan(dir: &Path, budget: &str, out: Option<&Path>) -> Output {
    plan_with(dir, budget, out, &[])
}

fn plan_with(dir: &Path, budget: &str, out: Option<&Path>, extra: &[&str]) -> Output {
    let mut c = kvc();
    c.args([
        "quant",
        "plan",
        "--budget",
        budget,
        "--text-tag",
        "t",
        "--query-from",
        "8",
    ])
    .arg("--dump")
    .arg(dir);
    if let Some(o) = out {
        c.arg("--out").arg(o);
    }
    c.args(extra).output().unwrap()
}

#[test]
fn bounded_plan_keeps_every_layer_in_bounds() {
    let dir = dump("bounds");
    let out = dir.join("plan.json");
    let bounds = [
        "--k-bits-min",
        "4",
        "--k-bits-max",
        "6",
        "--v-bits-min",
        "4",
    ];
    let o = plan_with(&dir, "3.6", Some(&out), &bounds);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("bounds: K 4..=6 bits, V 4..=8 bits"),
        "{text}"
    );
    let p = KvqPlan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(p
        .layers
        .iter()
        .all(|l| (4..=6).contains(&l.k_bits) && l.v_bits >= 4));
    let c = p.calibration.unwrap();
    assert_eq!(
        (c.k_bits_range, c.v_bits_range),
        (Some([4, 6]), Some([4, 8]))
    );
    let o = kvc().args(["quant", "inspect"]).arg(&out).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("K bits bounded to 4..=6"));
    // Minimums the budget cannot pay for name the ratio they reach (k4v4: 4.25 bits/value),
    // and bounds out of order or outside 2..=8 are refused.
    let err = |o: Output| {
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(err(plan_with(&dir, "3.9", None, &bounds)).contains("3.765"));
    let e = err(plan_with(
        &dir,
        "3.6",
        None,
        &["--k-bits-min", "7", "--k-bits-max", "5"],
    ));
    assert!(e.contains("--k-bits-min"), "{e}");
    assert!(err(plan_with(&dir, "3.6", None, &["--v-bits-max", "9"])).contains("<= 8"));
    // K calibrated centered on tokens 2..10: recorded, shown by inspect; past the dump refused.
    let center = ["--k-center-from", "2", "--k-center-tokens", "8"];
    let o = plan_with(&dir, "4", Some(&out), &center);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = KvqPlan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(p.calibration.unwrap().k_center_tokens, Some([2, 10]));
    let o = kvc().args(["quant", "inspect"]).arg(&out).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("mean of tokens 2..10"));
    let past = ["--k-center-from", "70", "--k-center-tokens", "8"];
    assert!(err(plan_with(&dir, "4", None, &past)).contains("K center tokens"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn layer_weights_make_a_version_4_plan() {
    let dir = dump("weights");
    let out = dir.join("plan.json");
    let weights = dir.join("weights.json");
    std::fs::write(&weights, r#"{"weights": [8.0, 0.25, 1.0]}"#).unwrap();
    let arg = ["--layer-weights", weights.to_str().unwrap()];
    let o = plan_with(&dir, "4", Some(&out), &arg);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("per layer x its weight"), "{text}");
    let weighted = KvqPlan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(weighted.version, 4);
    assert_eq!(
        weighted.calibration.as_ref().unwrap().layer_weights,
        Some(vec![8.0, 0.25, 1.0])
    );
    let o = kvc().args(["quant", "inspect"]).arg(&out).output().unwrap();
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains("layers weighed by measured sensitivity: 0.250 to 8.000"),
        "{shown}"
    );
    // the heavy layer gets at least the bits it gets unweighted, the light one at most
    let o = plan_with(&dir, "4", Some(&out), &[]);
    assert!(o.status.success());
    let plain = KvqPlan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(plain.version, 2);
    let bits = |p: &KvqPlan, l: usize| p.layers[l].k_bits + p.layers[l].v_bits;
    assert!(bits(&weighted, 0) >= bits(&plain, 0) && bits(&weighted, 1) <= bits(&plain, 1));
    // with protections the version is still 4
    let prot = [
        "--layer-weights",
        weights.to_str().unwrap(),
        "--sink",
        "4",
        "--recent",
        "16",
        "--recent-bits",
        "8",
        "--k-center",
    ];
    let o = plan_with(&dir, "4", Some(&out), &prot);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = KvqPlan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!((p.version, p.recent_bits), (4, Some(8)));
    // a file of the wrong length, a zero weight, no weights array, or no file: refused
    for (body, says) in [
        (r#"{"weights": [1.0, 1.0]}"#, "layer weights"),
        (r#"{"weights": [1.0, 0.0, 1.0]}"#, "finite and > 0"),
        (r#"{"w": [1.0, 1.0, 1.0]}"#, "\"weights\""),
        ("not json", "weights.json"),
    ] {
        std::fs::write(&weights, body).unwrap();
        let o = plan_with(&dir, "4", None, &arg);
        assert_eq!(o.status.code(), Some(2), "{body}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(says), "{body}: {e}");
    }
    std::fs::remove_file(&weights).unwrap();
    let o = plan_with(&dir, "4", None, &arg);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("weights.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_is_written_and_loads() {
    let dir = dump("ok");
    let out = dir.join("plan.json");
    let o = plan(&dir, "4", Some(&out));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("layer  bk  bv"), "{text}");
    assert!(text.contains("best uniform within budget"), "{text}");
    let p = KvqPlan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        (p.version, p.layers.len(), p.n_kv_head, p.head_dim),
        (2, L, 2, 64)
    );
    assert!(p.bits_per_value().unwrap() <= 4.0 + 1e-12);
    let c = p.calibration.unwrap();
    assert_eq!(
        (c.tag.as_str(), c.n_tokens, c.n_head),
        ("t", T as u32, HQ as u32)
    );
    assert!(c.achieved_ratio >= 4.0);
    let o = kvc().args(["quant", "inspect"]).arg(&out).output().unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("calibrated on") && text.contains("budget ratio 4"),
        "{text}"
    );
    // 8:1 is beyond 2 bits everywhere (2.25 bits/value with lm at head_dim 64).
    let o = plan(&dir, "8", None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("7.111"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_dumps_are_refused_with_the_file_named() {
    let dir = dump("bad");
    let err = |o: Output| {
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // A short K file.
    let k = dir.join("t.K.f32.bin");
    let full = std::fs::read(&k).unwrap();
    std::fs::write(&k, &full[..full.len() - 4]).unwrap();
    assert!(err(plan(&dir, "4", None)).contains("t.K.f32.bin"));
    std::fs::write(&k, &full).unwrap();
    // Q whose sidecar disagrees with K in head_dim (and its file with the sidecar).
    let qs = dir.join("t.Q.f32.json");
    let good = std::fs::read_to_string(&qs).unwrap();
    std::fs::write(&qs, good.replace("[3,72,4,64]", "[3,72,8,32]")).unwrap();
    assert!(err(plan(&dir, "4", None)).contains("does not match"));
    std::fs::write(&qs, good.replace("[3,72,4,64]", "[3,72,4]")).unwrap();
    assert!(err(plan(&dir, "4", None)).contains("4 dimensions"));
    std::fs::write(&qs, "{}").unwrap();
    assert!(err(plan(&dir, "4", None)).contains("shape"));
    std::fs::write(&qs, &good).unwrap();
    // V with another shape than K.
    let vs = dir.join("t.V.f32.json");
    let vgood = std::fs::read_to_string(&vs).unwrap();
    std::fs::write(&vs, vgood.replace("[3,72,2,64]", "[3,36,4,64]")).unwrap();
    assert!(err(plan(&dir, "4", None)).contains("differ"));
    std::fs::write(&vs, &vgood).unwrap();
    // No query sampled, bad method, bad budget.
    let mut c = kvc();
    c.args([
        "quant",
        "plan",
        "--budget",
        "4",
        "--text-tag",
        "t",
        "--query-from",
        "72",
    ])
    .arg("--dump")
    .arg(&dir);
    assert!(err(c.output().unwrap()).contains("first sampled query"));
    let mut c = kvc();
    c.args([
        "quant",
        "plan",
        "--budget",
        "4",
        "--text-tag",
        "t",
        "--method",
        "u7",
    ])
    .arg("--dump")
    .arg(&dir);
    assert!(err(c.output().unwrap()).contains("--method"));
    assert!(err(plan(&dir, "0", None)).contains("--budget 0"));
    // A missing sidecar is an I/O error (exit 1) naming it.
    std::fs::remove_file(&vs).unwrap();
    let o = plan(&dir, "4", None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("t.V.f32.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}
