//! `kvc codec` and `kvc bench` as a user runs them: exit statuses, stderr, files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kvc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(args)
        .output()
        .expect("run kvc")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvc-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/sample")
        .join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Exit status 2, exactly one line on stderr, and `out` not created.
fn assert_input_error(o: &Output, out: &Path, mentions: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(
        err.contains(mentions),
        "stderr {err:?} should mention {mentions:?}"
    );
    assert!(!out.exists(), "{} was created", out.display());
}

#[test]
fn encode_decode_round_trip_every_dtype() {
    let dir = tmp("rt");
    let raw = std::fs::read(sample("textA.K.f16.bin")).unwrap();
    let input = dir.join("in.bin");
    std::fs::write(&input, &raw[..64 * 1024]).unwrap();
    for dtype in ["f16", "bf16", "f32", "i8"] {
        let blob = dir.join(format!("{dtype}.gear"));
        let back = dir.join(format!("{dtype}.raw"));
        let o = kvc(&["codec", "encode", "--dtype", dtype, s(&input), s(&blob)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = kvc(&["codec", "decode", "--dtype", dtype, s(&blob), s(&back)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(std::fs::read(&back).unwrap(), &raw[..64 * 1024], "{dtype}");
        assert!(
            std::fs::metadata(&blob).unwrap().len() < 64 * 1024,
            "{dtype}"
        );
    }
    // Options: a predictor subset and a zstd level; the blob still decodes.
    let blob = dir.join("opts.gear");
    let back = dir.join("opts.raw");
    let o = kvc(&[
        "codec",
        "encode",
        "--dtype",
        "f16",
        "--predictors",
        "xor_seq",
        "--zstd-level",
        "1",
        s(&input),
        s(&blob),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&blob).unwrap();
    assert_eq!(bytes[4], 2, "xor_seq is the only predictor");
    let o = kvc(&["codec", "decode", "--dtype", "f16", s(&blob), s(&back)]);
    assert!(o.status.success());
    assert_eq!(std::fs::read(&back).unwrap(), &raw[..64 * 1024]);
}

#[test]
fn corrupt_blobs_exit_2_with_one_line_and_no_output() {
    let dir = tmp("corrupt");
    let input = dir.join("in.bin");
    std::fs::write(
        &input,
        (0..4000u32).map(|i| (i % 7) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    let blob = dir.join("b.gear");
    assert!(
        kvc(&["codec", "encode", "--dtype", "f16", s(&input), s(&blob)])
            .status
            .success()
    );
    let good = std::fs::read(&blob).unwrap();
    let out = dir.join("never.raw");

    let bad = dir.join("bad.gear");
    std::fs::write(&bad, &good[..good.len() - 1]).unwrap();
    assert_input_error(
        &kvc(&["codec", "decode", "--dtype", "f16", s(&bad), s(&out)]),
        &out,
        "truncated",
    );
    let mut b = good.clone();
    b[4] = 9;
    std::fs::write(&bad, &b).unwrap();
    assert_input_error(
        &kvc(&["codec", "decode", "--dtype", "f16", s(&bad), s(&out)]),
        &out,
        "unknown predictor mode 9",
    );
    let mut b = good.clone();
    b.push(0);
    std::fs::write(&bad, &b).unwrap();
    assert_input_error(
        &kvc(&["codec", "decode", "--dtype", "f16", s(&bad), s(&out)]),
        &out,
        "trailing",
    );
    std::fs::write(&bad, b"").unwrap();
    assert_input_error(
        &kvc(&["codec", "decode", "--dtype", "f16", s(&bad), s(&out)]),
        &out,
        "word_count",
    );
    // Right blob, wrong dtype.
    assert_input_error(
        &kvc(&["codec", "decode", "--dtype", "f32", s(&blob), s(&out)]),
        &out,
        "gear-v1",
    );
}

#[test]
fn bad_encode_input_exits_2_and_missing_files_exit_1() {
    let dir = tmp("badenc");
    let odd = dir.join("odd.bin");
    std::fs::write(&odd, [1u8, 2, 3]).unwrap();
    let out = dir.join("never.gear");
    assert_input_error(
        &kvc(&["codec", "encode", "--dtype", "f16", s(&odd), s(&out)]),
        &out,
        "not a whole number",
    );
    assert_input_error(
        &kvc(&[
            "codec",
            "encode",
            "--dtype",
            "i8",
            "--zstd-level",
            "99",
            s(&odd),
            s(&out),
        ]),
        &out,
        "zstd level 99",
    );
    let missing = dir.join("missing.bin");
    let o = kvc(&["codec", "decode", "--dtype", "f16", s(&missing), s(&out)]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    assert!(!out.exists());
    // An unknown predictor name is a usage error (clap: exit 2).
    let o = kvc(&[
        "codec",
        "encode",
        "--dtype",
        "f16",
        "--predictors",
        "delta",
        s(&odd),
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown gear-v1 predictor"));
}

#[test]
fn bench_on_the_embedded_sample_writes_json() {
    let dir = tmp("bench");
    let json = dir.join("bench.json");
    let o = kvc(&["bench", "--repeat", "1", "--json", s(&json)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("K+V"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 4);
    for t in tensors {
        assert_eq!(t["layers"].as_array().unwrap().len(), 4);
        let g = &t["total"]["gear_v1"];
        let z = &t["total"]["zstd"];
        // gear-v1 beats plain zstd on this data (it contains zstd as a candidate per stream).
        assert!(g["ratio_chunks"].as_f64().unwrap() > z["ratio_chunks"].as_f64().unwrap());
        assert!(g["decompress_mb_s_all_cores"].as_f64().unwrap() > 0.0);
    }
    // `kvc bench codec` is the same bench.
    let o = kvc(&["bench", "codec", "--repeat", "1", "--chunk-tokens", "512"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn bench_rejects_bad_data_dirs() {
    let dir = tmp("baddata");
    let out = dir.join("never.json");
    // A sidecar whose shape does not match its file.
    std::fs::write(dir.join("x.bin"), [0u8; 10]).unwrap();
    std::fs::write(
        dir.join("x.json"),
        r#"{"file":"x.bin","tensor":"K","dtype":"float16","layout":"[n_layer][n_tokens][n_kv_head][head_dim]","shape":[1,1,1,4]}"#,
    )
    .unwrap();
    assert_input_error(
        &kvc(&["bench", "--data", s(&dir), "--json", s(&out)]),
        &out,
        "needs 8 bytes, file has 10",
    );
    std::fs::write(dir.join("x.json"), "{not json").unwrap();
    assert_input_error(
        &kvc(&["bench", "--data", s(&dir), "--json", s(&out)]),
        &out,
        "JSON",
    );
    let empty = tmp("emptydata");
    assert_input_error(
        &kvc(&["bench", "--data", s(&empty), "--json", s(&out)]),
        &out,
        "no KV dumps",
    );
}
