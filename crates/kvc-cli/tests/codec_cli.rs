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
    assert!(stdout.contains("gear-v2"), "{stdout}");
    assert!(v_has_k_and_v_v2(&json));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 4);
    for t in tensors {
        assert_eq!(t["layers"].as_array().unwrap().len(), 4);
        let v2 = &t["total"]["gear_v2"];
        assert!(v2["ratio_whole"].as_f64().unwrap() > 1.0);
        assert!(v2["ratio_chunks"].as_f64().unwrap() > 1.0);
        assert!(v2["compress_mb_s_all_cores"].as_f64().unwrap() > 0.0);
        assert!(v2["decompress_mb_s_1core"].as_f64().unwrap() > 0.0);
        assert!(t["layers"][0]["gear_v2"]["ratio_chunks"].as_f64().unwrap() > 1.0);
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

fn v_has_k_and_v_v2(json: &Path) -> bool {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    v["k_and_v"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["gear_v2_ratio_chunks"].as_f64().unwrap() > 1.0)
}

/// `kvc codec encode --format gear-v2` then `decode` without --dtype: bit-exact for every
/// dtype and both coders, and smaller than the input on real K data.
#[test]
fn gear_v2_encode_decode_round_trip_every_dtype() {
    let dir = tmp("v2rt");
    let raw = std::fs::read(sample("textA.K.f16.bin")).unwrap();
    // 96 whole tokens of 192 f16 channels; other dtypes reinterpret the same bytes.
    let n = 96 * 192 * 2;
    let input = dir.join("in.bin");
    std::fs::write(&input, &raw[..n]).unwrap();
    for (dtype, channels, coder) in [
        ("f16", "192", "auto"),
        ("bf16", "192", "shared"),
        ("f32", "96", "auto"),
        ("i8", "384", "auto"),
        ("i8", "384", "shared"),
        ("f16", "192", "grouped"),
        ("bf16", "192", "grouped"),
    ] {
        let blob = dir.join(format!("{dtype}.kvg2"));
        let back = dir.join(format!("{dtype}.raw"));
        let o = kvc(&[
            "codec",
            "encode",
            "--format",
            "gear-v2",
            "--dtype",
            dtype,
            "--channels",
            channels,
            "--kind",
            "k",
            "--chunk-tokens",
            "40",
            "--coder",
            coder,
            s(&input),
            s(&blob),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let bytes = std::fs::read(&blob).unwrap();
        assert_eq!(&bytes[..4], b"KVG2");
        assert_eq!(bytes[6], 1, "kind K recorded");
        // auto on int8 may pick either coder.
        if coder != "auto" || dtype != "i8" {
            let shared = coder != "grouped";
            assert_eq!(bytes[7] & 2 != 0, shared, "{coder} coder's flag bit");
        }
        let o = kvc(&["codec", "decode", s(&blob), s(&back)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(std::fs::read(&back).unwrap(), &raw[..n], "{dtype}");
        if dtype == "f16" {
            assert!(bytes.len() < n, "f16 K compresses");
        }
        // A matching --dtype is accepted too.
        let o = kvc(&["codec", "decode", "--dtype", dtype, s(&blob), s(&back)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn gear_v2_bad_input_exits_2_with_one_line_and_no_output() {
    let dir = tmp("v2bad");
    let raw = std::fs::read(sample("textA.V.f16.bin")).unwrap();
    let input = dir.join("in.bin");
    std::fs::write(&input, &raw[..64 * 64 * 2]).unwrap();
    let blob = dir.join("v.kvg2");
    let o = kvc(&[
        "codec",
        "encode",
        "--format",
        "gear-v2",
        "--dtype",
        "f16",
        "--channels",
        "64",
        "--kind",
        "v",
        s(&input),
        s(&blob),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let good = std::fs::read(&blob).unwrap();
    let out = dir.join("never.raw");
    let bad = dir.join("bad.kvg2");
    let dec = |p: &Path| kvc(&["codec", "decode", s(p), s(&out)]);

    std::fs::write(&bad, &good[..good.len() - 1]).unwrap();
    assert_input_error(&dec(&bad), &out, "bad.kvg2");
    std::fs::write(&bad, &good[..20]).unwrap();
    assert_input_error(&dec(&bad), &out, "bad.kvg2");
    let mut b = good.clone();
    b[4] = 77; // a newer version
    std::fs::write(&bad, &b).unwrap();
    assert_input_error(&dec(&bad), &out, "version");
    let mut b = good.clone();
    b[5] = 9; // unknown dtype
    std::fs::write(&bad, &b).unwrap();
    assert_input_error(&dec(&bad), &out, "dtype");
    let mut b = good.clone();
    b.push(0);
    std::fs::write(&bad, &b).unwrap();
    assert_input_error(&dec(&bad), &out, "bad.kvg2");
    // Every single-byte flip past the header is refused cleanly or decodes to some
    // output; it never crashes.
    for i in (32..good.len()).step_by(good.len() / 97 + 1) {
        let mut b = good.clone();
        b[i] ^= 0x5a;
        std::fs::write(&bad, &b).unwrap();
        let o = dec(&bad);
        match o.status.code() {
            Some(0) => std::fs::remove_file(&out).unwrap(),
            _ => assert_input_error(&o, &out, "bad.kvg2"),
        }
    }
    // A v2 blob with the wrong --dtype.
    assert_input_error(
        &kvc(&["codec", "decode", "--dtype", "bf16", s(&blob), s(&out)]),
        &out,
        "holds f16",
    );
    // Not v2 and no --dtype.
    std::fs::write(&bad, b"not a blob at all").unwrap();
    assert_input_error(&dec(&bad), &out, "needs --dtype");

    // Encoder arguments.
    let enc = |extra: &[&str]| {
        let mut a = vec!["codec", "encode", "--format", "gear-v2", "--dtype", "f16"];
        a.extend_from_slice(extra);
        a.push(s(&input));
        a.push(s(&blob));
        a.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    };
    let blob_out = dir.join("never.kvg2");
    let run = |args: Vec<String>| {
        let mut args = args;
        let n = args.len();
        args[n - 1] = s(&blob_out).to_string();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        kvc(&refs)
    };
    assert_input_error(&run(enc(&[])), &blob_out, "--channels");
    assert_input_error(&run(enc(&["--channels", "0"])), &blob_out, "channel");
    assert_input_error(&run(enc(&["--channels", "100"])), &blob_out, "whole");
    assert_input_error(&run(enc(&["--channels", "70000"])), &blob_out, "channels");
    assert_input_error(
        &run(enc(&["--channels", "64", "--chunk-tokens", "0"])),
        &blob_out,
        "chunk",
    );
    let o = kvc(&[
        "codec",
        "encode",
        "--dtype",
        "f16",
        "--channels",
        "64",
        s(&input),
        s(&blob_out),
    ]);
    assert_input_error(&o, &blob_out, "gear-v2 only");
}
