//! `kvc mlp inspect` and `kvc mlp compress` on kvc-mlp's golden fixtures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kvc-mlp/tests/fixtures")
}

fn kvc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(args)
        .output()
        .unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvc-mlp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn assert_input_error(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "{err}");
}

#[test]
fn inspect_prints_header_and_shapes() {
    let out = kvc(&["mlp", "inspect", s(&fixtures().join("f32_text_bias.bin"))]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("compression_factor     3"), "{text}");
    assert!(text.contains("weight_count_per_layer 12"), "{text}");
    // 2 layers x 12 blocks, the first a 8 x 24 text-K block at byte 44.
    assert!(
        text.contains("    0     0 compress_tk     0     8    24 yes  44"),
        "{text}"
    );
    assert_eq!(text.lines().filter(|l| l.contains("compress_")).count(), 24);
}

fn compress_args<'a>(k: &'a str, ok: &'a str, ov: &'a str, seq: &'a str) -> Vec<&'a str> {
    vec![
        "mlp",
        "compress",
        "--layer",
        "1",
        "--dtype",
        "f32",
        "--heads",
        "2",
        "--seq",
        seq,
        "--head-dim",
        "8",
        "--k",
        k,
        "--v",
        k,
        "--out-k",
        ok,
        "--out-v",
        ov,
    ]
}

#[test]
fn compress_writes_outputs_and_prints_the_length() {
    let dir = fixtures();
    let w = dir.join("f32_text_bias.bin");
    let k = dir.join("f32_text_bias.k.raw");
    let (ok, ov) = (tmp("ok.raw"), tmp("ov.raw"));
    let mut args = compress_args(s(&k), s(&ok), s(&ov), "23");
    args.extend(["--weights", s(&w)]);
    let out = kvc(&args);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    // S = 23, factor 3: 7 groups + 2 remainder tokens.
    assert!(text.starts_with("kv_len 9 rope_position 23"), "{text}");
    let got = std::fs::read(&ok).unwrap();
    assert_eq!(got.len(), 2 * 9 * 8 * 4);
    let want: Vec<f64> = std::fs::read(dir.join("f32_text_bias.L1.k.f64"))
        .unwrap()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (g, w) in got.chunks_exact(4).zip(&want) {
        let g = f32::from_le_bytes(g.try_into().unwrap()) as f64;
        assert!((g - w).abs() <= 1e-4 * w.abs().max(1e-2), "{g} vs {w}");
    }
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let dir = fixtures();
    let w = dir.join("f32_text_bias.bin");
    let k = dir.join("f32_text_bias.k.raw");
    let (ok, ov) = (tmp("bad_ok.raw"), tmp("bad_ov.raw"));
    // The raw file does not hold 2 x 24 x 8 f32 values.
    let mut args = compress_args(s(&k), s(&ok), s(&ov), "24");
    args.extend(["--weights", s(&w)]);
    assert_input_error(&kvc(&args), "bytes, expected");
    // A factor the weights were not trained for.
    let mut args = compress_args(s(&k), s(&ok), s(&ov), "23");
    args.extend(["--weights", s(&w), "--factor", "4"]);
    assert_input_error(&kvc(&args), "factor");
    // A truncated weight file.
    let bytes = std::fs::read(&w).unwrap();
    let cut = tmp("cut.bin");
    std::fs::write(&cut, &bytes[..100]).unwrap();
    assert_input_error(&kvc(&["mlp", "inspect", s(&cut)]), "truncated");
    let mut args = compress_args(s(&k), s(&ok), s(&ov), "23");
    args.extend(["--weights", s(&cut)]);
    assert_input_error(&kvc(&args), "truncated");
    // Layer out of range, wrong head_dim.
    let mut args = compress_args(s(&k), s(&ok), s(&ov), "23");
    args.extend(["--weights", s(&w)]);
    args[3] = "9";
    assert_input_error(&kvc(&args), "layer 9 out of range");
    let mut args = compress_args(s(&k), s(&ok), s(&ov), "23");
    args.extend(["--weights", s(&w)]);
    args[11] = "16";
    assert_input_error(&kvc(&args), "head_dim");
    // Bad magic.
    let mut bad = bytes.clone();
    bad[0] ^= 1;
    std::fs::write(&cut, &bad).unwrap();
    assert_input_error(&kvc(&["mlp", "inspect", s(&cut)]), "magic");
}
