//! `kvc bench quant` and `kvc quant inspect` as a user runs them, on the sample.

use std::path::Path;
use std::process::Command;

fn kvc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
}

#[test]
fn bench_quant_reports_bits_snr_and_attention_error() {
    let dir = std::env::temp_dir().join(format!("kvc-kvq-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("q.json");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample");
    let o = kvc()
        .args([
            "bench",
            "quant",
            "--configs",
            "k8v8,k4v2:u32",
            "--queries",
            "3",
        ])
        .args(["--tokens", "300", "--reps", "1", "--data"])
        .arg(&data)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let q = r["quality"].as_array().unwrap();
    assert_eq!(q.len(), 2);
    // Exact byte accounting: 8 bits + one f16 per 64 values; 4/2 bits + one f16 per 32.
    assert_eq!(q[0]["bits_per_value"].as_f64(), Some(8.25));
    assert_eq!(q[1]["bits_per_value"].as_f64(), Some(3.5));
    let f = |c: &serde_json::Value, k: &str| c[k].as_f64().unwrap();
    // 8-bit Lloyd-Max is ~44 dB on rotated data; 4-bit uniform K ~21 dB, 2-bit V ~10 dB.
    assert!(f(&q[0], "k_snr_db_mean") > 40.0);
    assert!(f(&q[1], "k_snr_db_mean") > 18.0 && f(&q[1], "k_snr_db_mean") < 30.0);
    assert!(f(&q[1], "v_snr_db_mean") > 7.0 && f(&q[1], "v_snr_db_mean") < 15.0);
    let e8 = f(&q[0], "attn_rel_err_mean");
    let e4 = f(&q[1], "attn_rel_err_mean");
    assert!(e8.is_finite() && e8 > 0.0 && e8 < e4, "{e8} {e4}");
    assert_eq!(q[0]["layers"].as_array().unwrap().len(), 4);
    assert_eq!(r["attention_speed"].as_array().unwrap().len(), 2);
    // Per-row entry points: every width, row bytes as the format says, positive times.
    let rs = r["row_speed"].as_array().unwrap();
    assert_eq!(rs.len(), 6);
    for (c, bits) in rs.iter().zip([2u64, 3, 4, 5, 6, 8]) {
        assert_eq!(c["bits"].as_u64(), Some(bits));
        assert_eq!(c["row_bytes"].as_u64(), Some(2 + 8 * bits));
        for k in [
            "dot_rotated_ns",
            "f16_dot_ns",
            "dequantize_row_rotated_ns",
            "f16_to_f32_ns",
        ] {
            assert!(f(c, k).is_finite() && f(c, k) > 0.0, "{k}: {c}");
        }
    }
    // Bad config: one line, status 2.
    let o = kvc()
        .args(["bench", "quant", "--configs", "k4v4:zz", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_quant_measures_k_channel_groups_against_rows() {
    let dir = std::env::temp_dir().join(format!("kvc-kvq-cli-kc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("q.json");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample");
    let o = kvc()
        .args([
            "bench",
            "quant",
            "--configs",
            "k4v4,kc32:k4v4",
            "--queries",
            "4",
        ])
        .args(["--tokens", "300", "--reps", "1", "--data"])
        .arg(&data)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let q = r["quality"].as_array().unwrap();
    let f = |c: &serde_json::Value, k: &str| c[k].as_f64().unwrap();
    assert_eq!(q[1]["config"].as_str(), Some("kc32:k4v4:lm"));
    // 4-bit codes plus an f16 step and minimum per channel per 32 tokens: 5 bits per K value
    assert_eq!(f(&q[1], "k_bits_per_value"), 5.0);
    assert_eq!(f(&q[1], "v_bits_per_value"), 4.25);
    // the same V rows in both; K per channel follows the outlier channels the rotated rows
    // spread over every coordinate
    assert_eq!(f(&q[0], "v_snr_db_mean"), f(&q[1], "v_snr_db_mean"));
    assert!(
        f(&q[1], "k_snr_db_mean") > f(&q[0], "k_snr_db_mean") + 2.0,
        "{} {}",
        q[0],
        q[1]
    );
    let e = f(&q[1], "attn_rel_err_mean");
    assert!(e.is_finite() && e > 0.0 && e < 1.0, "{e}");
    // packed attention timed for the row config only; K per channel per row, by block
    assert_eq!(r["attention_speed"].as_array().unwrap().len(), 1);
    let cs = r["channel_speed"].as_array().unwrap();
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0]["block_bytes"].as_u64(), Some(4 * 64 + 32 * 32));
    for k in [
        "dot_block_ns_per_row",
        "f16_dot_ns",
        "dequantize_block_ns_per_row",
        "f16_to_f32_ns",
    ] {
        assert!(
            f(&cs[0], k).is_finite() && f(&cs[0], k) > 0.0,
            "{k}: {}",
            cs[0]
        );
    }
    // a group the codec does not take: one line, status 2
    let o = kvc()
        .args(["bench", "quant", "--configs", "kc48:k4v4", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("group 48"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_quant_measures_the_qjl_residual_sketch_against_rows() {
    let dir = std::env::temp_dir().join(format!("kvc-kvq-cli-qjl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("q.json");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample");
    let o = kvc()
        .args([
            "bench",
            "quant",
            "--configs",
            "k3v4,qjl:k3v4",
            "--queries",
            "4",
        ])
        .args(["--no-speed", "--reps", "1", "--data"])
        .arg(&data)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let q = r["quality"].as_array().unwrap();
    let f = |c: &serde_json::Value, k: &str| c[k].as_f64().unwrap();
    assert_eq!(q[1]["config"].as_str(), Some("qjl:k3v4:lm"));
    // 3-bit rows (3.25 bits at d = 64) plus 64 sign bits and an f16 norm per row (1.25)
    assert_eq!(f(&q[1], "k_bits_per_value"), 4.5);
    assert_eq!(f(&q[1], "k_rows_bits_per_value"), 3.25);
    assert_eq!(f(&q[1], "bits_per_value"), 4.375);
    // the same K rows and V rows underneath
    assert_eq!(f(&q[0], "k_snr_db_mean"), f(&q[1], "k_rows_snr_db_mean"));
    assert_eq!(f(&q[0], "v_snr_db_mean"), f(&q[1], "v_snr_db_mean"));
    let rows_only = f(&q[1], "attn_rel_err_mean_rows_only");
    assert!(
        (rows_only - f(&q[0], "attn_rel_err_mean")).abs() < 1e-4,
        "{rows_only} {}",
        q[0]
    );
    for k in ["attn_rel_err_mean", "attn_rel_err_max", "k_snr_db_mean"] {
        assert!(
            f(&q[1], k).is_finite() && f(&q[1], k) > 0.0,
            "{k}: {}",
            q[1]
        );
    }
    // the estimator is unbiased: scores keep their scale, the Lloyd-Max rows shrink them
    assert!(
        (f(&q[1], "score_slope_mean") - 1.0).abs() < 0.01,
        "{}",
        q[1]
    );
    assert!(f(&q[1], "score_slope_mean_rows_only") < 0.99, "{}", q[1]);
    // bad entries: one line, status 2
    for bad in ["qjl:k9v4", "qjl:", "qjl:k3v4:zz"] {
        let o = kvc()
            .args(["bench", "quant", "--no-speed", "--configs", bad, "--data"])
            .arg(&data)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn quant_inspect_shows_bytes_and_refuses_bad_plans() {
    let o = kvc()
        .args(["quant", "inspect", "k4v3", "--layers", "2"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("360 bytes per token"), "{out}");
    assert!(out.contains("ratio 4.267"), "{out}");
    for bad in ["k1v4", "k4v4:u7", "nonsense"] {
        let o = kvc().args(["quant", "inspect", bad]).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad}");
    }
}
