//! `kvc mlp train` end to end on small synthetic dumps in the dump mode's format, and
//! `kvc mlp inspect` showing the sidecar it writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kvc(args: &[&str]) -> Output {
    kvc_threads(args, 2)
}

fn kvc_threads(args: &[&str], threads: usize) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(args)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .output()
        .unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvc-mlp-train-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const L: usize = 2;
const T: usize = 80;
const HK: usize = 1;
const HQ: usize = 2;
const D: usize = 8;

/// Writes `{tag}.{K,V,Q}.f32.{bin,json}` as the dump mode does (slowly drifting rows).
fn write_dump(dir: &Path, tag: &str, seed: u32) {
    for (t, heads) in [("K", HK), ("V", HK), ("Q", HQ)] {
        let n = L * T * heads * D;
        let vals: Vec<f32> = (0..n)
            .map(|i| {
                let (tok, c) = ((i / (heads * D)) % T, i % D);
                ((tok as f32 * 0.05 + c as f32 + seed as f32).sin() * 2.0)
                    + 0.3 * ((i as f32 * 12.9898 + seed as f32).sin() * 43758.55).fract()
            })
            .collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.join(format!("{tag}.{t}.f32.bin")), bytes).unwrap();
        let json = format!(
            r#"{{"file": "{tag}.{t}.f32.bin", "tensor": "{t}", "shape": [{L}, {T}, {heads}, {D}],
"n_layer": {L}, "n_tokens": {T}, "n_kv_head": {HK}, "n_head": {HQ}, "head_dim": {D},
"model": "synthetic.gguf", "text_source": "synthetic {tag}", "post_rope": true}}"#
        );
        std::fs::write(dir.join(format!("{tag}.{t}.f32.json")), json).unwrap();
    }
}

fn train_args<'a>(d: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "mlp",
        "train",
        "--dump",
        d,
        "--tag",
        "textA,textB",
        "--val-dump",
        d,
        "--val-tag",
        "textC",
        "--factor",
        "2",
        "--steps",
        "30",
        "--sink",
        "2",
        "--recent",
        "8",
        "--min-groups",
        "4",
        "--batch",
        "2",
        "--lr",
        "3e-3",
        "--out",
        out,
    ]
}

#[test]
fn train_writes_weights_and_sidecar_that_inspect_shows() {
    let d = dir("ok");
    for (i, tag) in ["textA", "textB", "textC"].iter().enumerate() {
        write_dump(&d, tag, i as u32);
    }
    std::fs::write(
        d.join("texts.json"),
        r#"{"textA": {"file": "/a", "licence": "licence A"}}"#,
    )
    .unwrap();
    let out = d.join("w.bin");
    let mut args = train_args(s(&d), s(&out));
    args.extend(["--layers", "1"]);
    let o = kvc(&args);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("layer  1 step    30/30 loss"), "{err}");
    assert!(err.contains("layer  1 done"), "{err}");
    let side: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("w.json")).unwrap()).unwrap();
    assert_eq!(side["factor"], 2);
    assert_eq!(side["model"]["file"], "synthetic.gguf");
    assert_eq!(side["texts"]["train"][0]["licence"], "licence A");
    assert_eq!(
        side["texts"]["validation"][0]["text_source"],
        "synthetic textC"
    );
    assert_eq!(side["layers"][0]["trained"], false);
    assert!(side["layers"][1]["train_rel_err"].as_f64().unwrap() > 0.0);
    assert!(side["layers"][1]["val_rel_err"].as_f64().unwrap() > 0.0);
    let w = kvc_mlp::CompressorWeights::load(&out).unwrap();
    assert_eq!((w.num_layers(), w.factor(), w.head_dim()), (2, 2, D));
    assert_eq!(w.header().unwrap().dtype, kvc_types::FloatDtype::F16);
    let o = kvc(&["mlp", "inspect", s(&out)]);
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains(&format!("sidecar {}:", s(&d.join("w.json")))),
        "{text}"
    );
    assert!(
        text.contains("layer-local attention-output matching"),
        "{text}"
    );
    // A rerun on another number of threads gives the same file bit for bit.
    let all = d.join("all2.bin");
    assert!(kvc_threads(&train_args(s(&d), s(&all)), 2).status.success());
    let again = d.join("all1.bin");
    assert!(kvc_threads(&train_args(s(&d), s(&again)), 1)
        .status
        .success());
    assert_eq!(std::fs::read(&all).unwrap(), std::fs::read(&again).unwrap());
}

#[test]
fn bad_dumps_and_options_are_one_line_errors() {
    let d = dir("bad");
    write_dump(&d, "textA", 0);
    write_dump(&d, "textB", 1);
    write_dump(&d, "textC", 2);
    let out = d.join("w.bin");
    let one_line = |o: &Output, code: i32, needle: &str| {
        assert_eq!(o.status.code(), Some(code), "{o:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        assert!(e.contains(needle), "{e}");
    };
    let mut a = train_args(s(&d), s(&out));
    a.extend(["--layers", "2..3"]);
    one_line(&kvc(&a), 2, "--layers");
    let mut a = train_args(s(&d), s(&out));
    let r = a.iter().position(|x| *x == "--recent").unwrap();
    a[r + 1] = "75"; // 2 + 4 groups of 2 + 75 > 80 tokens
    one_line(&kvc(&a), 2, "shortest dump has 80");
    // A truncated K file, then a sidecar whose shape disagrees.
    let k = d.join("textB.K.f32.bin");
    let bytes = std::fs::read(&k).unwrap();
    std::fs::write(&k, &bytes[..bytes.len() - 4]).unwrap();
    one_line(
        &kvc(&train_args(s(&d), s(&out))),
        2,
        "bytes, the sidecar's shape",
    );
    std::fs::write(&k, &bytes).unwrap();
    let j = d.join("textC.Q.f32.json");
    let text = std::fs::read_to_string(&j).unwrap();
    std::fs::write(&j, text.replace("[2, 80, 2, 8]", "[2, 80, 1, 8]")).unwrap();
    one_line(&kvc(&train_args(s(&d), s(&out))), 2, "`shape`");
    std::fs::write(&j, text).unwrap();
    std::fs::remove_file(d.join("textA.Q.f32.json")).unwrap();
    one_line(&kvc(&train_args(s(&d), s(&out))), 1, "textA.Q.f32.json");
    assert!(!out.exists());
}
