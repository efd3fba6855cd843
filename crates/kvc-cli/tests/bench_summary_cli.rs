//! Plain `kvc bench` as a user runs it on the embedded sample: one screen (lossless, kvq
//! against f16 with its attention error, attention speed, the pointer to the engine's
//! quality), and its JSON: the codec bench's keys plus `summary`. Timings are checked to be
//! measured (positive, finite), never against a speed.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvc-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn measured(x: f64, what: &str) {
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
}

#[test]
fn plain_bench_is_one_screen_of_ratios_errors_and_speed() {
    let dir = tmp("bench-summary");
    let json = dir.join("bench.json");
    let o = Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(["bench", "--repeat", "1", "--json", json.to_str().unwrap()])
        .output()
        .expect("run kvc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let screen = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = screen.lines().collect();

    // One screen, in this order: source, lossless, kvq, attention speed, the pointer.
    assert!(lines.len() <= 24, "{} lines:\n{screen}", lines.len());
    assert!(
        lines[0].starts_with("kvc bench: embedded sample (data/sample), 4 layers x 512 tokens"),
        "{screen}"
    );
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{screen}"))
    };
    let (lossless, kvq, speed, engine) = (
        at("lossless, bit-exact"),
        at("kvq, lossy"),
        at("decode attention"),
        at("docs/llama-cpp.md"),
    );
    assert!(lossless < kvq && kvq < speed && speed < engine, "{screen}");
    assert_eq!(engine, lines.len() - 1, "{screen}");
    assert!(lines[kvq + 1].contains("own K rows"), "{screen}");
    assert!(lines[kvq + 1].contains("no Q"), "{screen}");
    for c in ["gear-v2", "gear-v1", "zstd-3"] {
        assert!(
            lines[lossless..kvq]
                .iter()
                .any(|l| l.trim_start().starts_with(c)),
            "{c}: {screen}"
        );
    }
    for c in ["k8v8", "k4v4", "k4v2"] {
        assert_eq!(
            lines[kvq..engine].iter().filter(|l| l.contains(c)).count(),
            2,
            "{c} should have a quality row and a speed row:\n{screen}"
        );
    }

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // The codec bench's keys are still there for scripts.
    assert_eq!(v["bench"], "codec");
    assert_eq!(v["tensors"].as_array().unwrap().len(), 4);
    assert_eq!(v["k_and_v"].as_array().unwrap().len(), 2);
    let s = &v["summary"];
    assert_eq!(s["engine_quality"], "docs/llama-cpp.md");

    // Lossless: every codec shrinks the sample, gear-v2 and gear-v1 more than plain zstd, and
    // the rows agree with the codec bench's own K+V ratios.
    let lossless = s["lossless"].as_array().unwrap();
    assert_eq!(lossless.len(), 6, "3 codecs x f16, bf16");
    for dtype in ["f16", "bf16"] {
        let r = |codec: &str| {
            let row = lossless
                .iter()
                .find(|l| l["dtype"] == dtype && l["codec"] == codec)
                .unwrap();
            measured(num(row, "compress_mb_s_1core"), "compress MB/s");
            measured(num(row, "decompress_mb_s_1core"), "decompress MB/s");
            num(row, "ratio_chunks")
        };
        let (v2, v1, z) = (r("gear-v2"), r("gear-v1"), r("zstd-3"));
        assert!(z > 1.0 && v1 > z && v2 > z, "{dtype}: {v2} {v1} {z}");
        let kv = v["k_and_v"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["dtype"] == dtype)
            .unwrap();
        assert!((num(kv, "gear_v2_ratio_chunks") - v2).abs() < 1e-9);
    }

    // kvq: ratios near their targets and increasing, the attention error increasing with
    // the ratio and small against the output (relative L2), speeds measured.
    let configs = s["kvq"]["configs"].as_array().unwrap();
    let names: Vec<&str> = configs
        .iter()
        .map(|c| c["config"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["k8v8", "k4v4", "k4v2"]);
    let ratios: Vec<f64> = configs.iter().map(|c| num(c, "ratio_vs_f16")).collect();
    for (r, (lo, hi)) in ratios.iter().zip([(1.8, 2.2), (3.3, 4.0), (4.5, 5.5)]) {
        assert!((lo..hi).contains(r), "ratio {r} not in {lo}..{hi}");
    }
    let errs: Vec<f64> = configs
        .iter()
        .map(|c| num(c, "attn_rel_err_mean"))
        .collect();
    assert!(
        errs[0] > 0.0 && errs[0] < errs[1] && errs[1] < errs[2],
        "{errs:?}"
    );
    assert!(errs[2] < 0.5, "{errs:?}");
    for c in configs {
        assert!(num(c, "attn_rel_err_max") >= num(c, "attn_rel_err_mean"));
        measured(num(c, "quantize_gb_per_s"), "quantize GB/s");
        measured(num(c, "dequantize_gb_per_s"), "dequantize GB/s");
        let speed = c["attention_speed"].as_array().unwrap();
        let tokens: Vec<u64> = speed
            .iter()
            .map(|t| t["tokens"].as_u64().unwrap())
            .collect();
        assert_eq!(tokens, [4096, 32768]);
        for t in speed {
            measured(num(t, "packed_us"), "packed us");
            measured(num(t, "f16_us"), "f16 us");
        }
    }
    assert!(s["kvq"]["queries"].as_str().unwrap().contains("no Q"));
}

/// A directory without f16 dumps still gets the lossless part; kvq says why it is skipped.
#[test]
fn plain_bench_without_f16_dumps_skips_kvq_and_says_why() {
    let dir = tmp("bench-summary-bf16");
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/sample");
    for t in ["K", "V"] {
        for ext in ["bin", "json"] {
            let name = format!("textA.{t}.bf16.{ext}");
            std::fs::copy(sample.join(&name), dir.join(&name)).unwrap();
        }
    }
    let json = dir.join("out.json");
    let o = Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(["bench", "--repeat", "1", "--data"])
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run kvc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let screen = String::from_utf8_lossy(&o.stdout);
    assert!(screen.contains("kvq: skipped ("), "{screen}");
    assert!(screen.contains("no f16 K dump"), "{screen}");
    assert!(!screen.contains("decode attention"), "{screen}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["summary"]["kvq"].is_null());
    assert_eq!(v["summary"]["lossless"].as_array().unwrap().len(), 3);
}
