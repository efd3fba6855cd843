//! `kvc bench tiers` as a user runs it: a small run on the embedded sample, its JSON, and
//! bad arguments.

use std::process::{Command, Output};

fn kvc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(args)
        .output()
        .expect("run kvc")
}

fn have_redis() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn bench_tiers_small_run_reports_every_tier_and_codec() {
    let dir = std::env::temp_dir().join(format!("kvc-cli-tiers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("tiers.json");
    let o = kvc(&[
        "bench",
        "tiers",
        "--prompts",
        "2",
        "--reps",
        "1",
        "--chunk-tokens",
        "128",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let rows = v["rows"].as_array().unwrap();
    let redis = have_redis();
    assert_eq!(rows.len(), if redis { 12 } else { 8 });
    assert_eq!(v["baseline"].is_object(), redis);
    assert_eq!(v["note"].is_string(), !redis);
    let f16_per_token = (2 * 4 * 3 * 64 * 2) as f64;
    for r in rows {
        assert_eq!(r["fallbacks"], 0, "{r}");
        if r["codec"] == "kvq-k4v4" {
            // Lossy: not bit-exact, within the 4-bit error bound, under f16/3.5 on the wire.
            assert_eq!(
                (r["lossless"].clone(), r["bit_exact"].clone()),
                (false.into(), false.into()),
                "{r}"
            );
            for e in ["rel_rms_error_k", "rel_rms_error_v"] {
                let e = r[e].as_f64().unwrap();
                assert!(e > 0.0 && e < 0.1, "{r}");
            }
            assert!(
                r["bytes_per_token"].as_f64().unwrap() < f16_per_token / 3.5,
                "{r}"
            );
            continue;
        }
        assert_eq!(r["bit_exact"], true, "{r}");
        assert_eq!(r["rel_rms_error_k"], 0.0, "{r}");
        assert!(r["restore_gbs"].as_f64().unwrap() > 0.0, "{r}");
        let bpt = r["bytes_per_token"].as_f64().unwrap();
        if r["codec"] == "raw" {
            // Only the header, table and checksum on top of f16.
            assert!(bpt >= f16_per_token && bpt < f16_per_token * 1.01, "{r}");
        } else {
            assert!(bpt < f16_per_token / 1.15, "{r}");
        }
    }
}

#[test]
fn bench_tiers_rejects_bad_arguments() {
    let o = kvc(&["bench", "tiers", "--chunk-tokens", "4096"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--chunk-tokens"));
    let o = kvc(&["bench", "tiers", "--codec", "zstd"]);
    assert_eq!(o.status.code(), Some(2));
    // A Redis nobody listens on: a clear error, not a hang or a panic.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let o = kvc(&[
        "bench",
        "tiers",
        "--prompts",
        "1",
        "--reps",
        "1",
        "--redis",
        &url,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("redis"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
