//! `kvc int8 ...` and `kvc kvq ...` against their old spellings `kvc quant ...` (which
//! scripts use): the same inputs give the same output files, byte for byte, and the same
//! printed report.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kvc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
}

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/sample")
        .join(name)
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvc-spellings-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `[layers, tokens, kv_heads, head_dim]` from a sidecar.
fn shape_of(json: &str) -> [usize; 4] {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sample(json)).unwrap()).unwrap();
    let s: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    [s[0], s[1], s[2], s[3]]
}

/// Writes the first `tokens` tokens of each layer of the sample's K and V (f16) to `dir`.
fn inputs(dir: &Path, tokens: usize) -> ([usize; 4], PathBuf, PathBuf) {
    let full = shape_of("textA.K.f16.json");
    let per_tok = full[2] * full[3] * 2;
    let mut paths = Vec::new();
    for (name, out) in [("textA.K.f16.bin", "k.f16"), ("textA.V.f16.bin", "v.f16")] {
        let raw = std::fs::read(sample(name)).unwrap();
        let cut: Vec<u8> = (0..full[0])
            .flat_map(|l| raw[l * full[1] * per_tok..][..tokens * per_tok].to_vec())
            .collect();
        let p = dir.join(out);
        std::fs::write(&p, cut).unwrap();
        paths.push(p);
    }
    let v = paths.pop().unwrap();
    let k = paths.pop().unwrap();
    ([full[0], tokens, full[2], full[3]], k, v)
}

/// Runs `kvc ARGS`, fails the test on an error, returns stdout.
fn ok(args: &[&str]) -> String {
    let o = kvc().args(args).output().unwrap();
    assert!(
        o.status.success(),
        "kvc {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn same_files(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(!x.is_empty());
    assert!(x == y, "{} and {} differ", a.display(), b.display());
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn kvq_and_quant_kvq_write_the_same_files() {
    let dir = tmp("kvq");
    let (sh, k, v) = inputs(&dir, 40);
    let (l, h, d) = (sh[0].to_string(), sh[2].to_string(), sh[3].to_string());
    let shape = ["--layers", &l, "--kv-heads", &h, "--head-dim", &d];
    let out = |tag: &str| (dir.join(format!("{tag}.k")), dir.join(format!("{tag}.v")));
    let (nk, nv) = out("new");
    let (ok_, ov) = out("old");
    let io = |kk: &Path, vv: &Path| {
        vec![
            "--k".to_string(),
            s(&k).into(),
            "--v".into(),
            s(&v).into(),
            "--out-k".into(),
            s(kk).into(),
            "--out-v".into(),
            s(vv).into(),
        ]
    };
    let mut a: Vec<String> = ["kvq", "apply", "--spec", "k4v2:u32", "--dtype", "f16"]
        .map(String::from)
        .to_vec();
    a.extend(shape.map(String::from));
    a.extend(["--k-channel-group".into(), "16".into()]);
    a.extend(io(&nk, &nv));
    let new_report = ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let mut b: Vec<String> = ["quant", "apply", "--kvq", "k4v2:u32", "--dtype", "f16"]
        .map(String::from)
        .to_vec();
    b.extend(shape.map(String::from));
    b.extend(["--k-channel-group".into(), "16".into()]);
    b.extend(io(&ok_, &ov));
    let old_report = ok(&b.iter().map(String::as_str).collect::<Vec<_>>());
    same_files(&nk, &ok_);
    same_files(&nv, &ov);
    // The reports differ only in the output paths they name.
    assert_eq!(
        new_report.replace("/new.", "/X."),
        old_report.replace("/old.", "/X.")
    );

    let (dk, dv) = out("dnew");
    let (ek, ev) = out("dold");
    ok(&[
        "kvq",
        "dequant",
        "--dtype",
        "f32",
        "--k",
        s(&nk),
        "--v",
        s(&nv),
        "--out-k",
        s(&dk),
        "--out-v",
        s(&dv),
    ]);
    ok(&[
        "quant",
        "dequant",
        "--kvq",
        "--dtype",
        "f32",
        "--k",
        s(&nk),
        "--v",
        s(&nv),
        "--out-k",
        s(&ek),
        "--out-v",
        s(&ev),
    ]);
    same_files(&dk, &ek);
    same_files(&dv, &ev);

    assert_eq!(
        ok(&["kvq", "inspect", "k4v3"]),
        ok(&["quant", "inspect", "k4v3"])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn int8_and_quant_write_the_same_files() {
    let dir = tmp("int8");
    let (sh, k, v) = inputs(&dir, 24);
    let (l, h, d) = (sh[0].to_string(), sh[2].to_string(), sh[3].to_string());
    let shape = [
        "--dtype",
        "f16",
        "--layers",
        &l,
        "--kv-heads",
        &h,
        "--head-dim",
        &d,
    ];
    let (c_new, c_old) = (dir.join("ck-new"), dir.join("ck-old"));
    for (verb, ck) in [("int8", &c_new), ("quant", &c_old)] {
        let mut a = vec![verb, "calibrate"];
        a.extend(shape);
        a.extend(["--k", s(&k), "--v", s(&v), "--out", s(ck)]);
        ok(&a);
    }
    for f in [
        "quant_model_description.json",
        "quant_model_weight.safetensors",
    ] {
        same_files(&c_new.join(f), &c_old.join(f));
    }
    let (qk_new, qv_new, qk_old, qv_old) = (
        dir.join("qk-new"),
        dir.join("qv-new"),
        dir.join("qk-old"),
        dir.join("qv-old"),
    );
    let mut reports = Vec::new();
    for (verb, qk, qv) in [("int8", &qk_new, &qv_new), ("quant", &qk_old, &qv_old)] {
        let mut a = vec![verb, "apply", "--scales", s(&c_new)];
        a.extend(shape);
        a.extend([
            "--k",
            s(&k),
            "--v",
            s(&v),
            "--out-k",
            s(qk),
            "--out-v",
            s(qv),
        ]);
        reports.push(ok(&a));
    }
    same_files(&qk_new, &qk_old);
    same_files(&qv_new, &qv_old);
    assert_eq!(reports[0], reports[1]);
    let (dk_new, dv_new, dk_old, dv_old) = (
        dir.join("dk-new"),
        dir.join("dv-new"),
        dir.join("dk-old"),
        dir.join("dv-old"),
    );
    for (verb, dk, dv) in [("int8", &dk_new, &dv_new), ("quant", &dk_old, &dv_old)] {
        let mut a = vec![verb, "dequant", "--scales", s(&c_new)];
        a.extend(shape);
        a.extend([
            "--k",
            s(&qk_new),
            "--v",
            s(&qv_new),
            "--out-k",
            s(dk),
            "--out-v",
            s(dv),
        ]);
        ok(&a);
    }
    same_files(&dk_new, &dk_old);
    same_files(&dv_new, &dv_old);
    let _ = std::fs::remove_dir_all(&dir);
}
