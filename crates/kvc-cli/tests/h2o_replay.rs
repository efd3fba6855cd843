//! `kvc h2o replay` end to end: output lines, and bad input => exit 2 with the line.

use std::path::PathBuf;
use std::process::{Command, Output};

fn temp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvc-h2o-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn replay(config: &str, trace: &str, tag: &str) -> Output {
    let cfg = temp(&format!("{tag}.json"), config);
    let tr = temp(&format!("{tag}.jsonl"), trace);
    Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(["h2o", "replay", "--config"])
        .arg(&cfg)
        .arg(&tr)
        .output()
        .unwrap()
}

const SMALL: &str = r#"{"h2o_block_tokens": 4, "h2o_sink_tokens": 4, "h2o_recent_tokens": 4,
  "h2o_target_lossy_ratio": 2, "h2o_trigger_min_tokens": 8, "h2o_update_interval": 16,
  "h2o_layer_start": 0, "h2o_layer_end": 0}"#;

fn lines(o: &Output) -> Vec<serde_json::Value> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn replays_a_trace() {
    let trace = "\
{\"layer\": 0, \"kv_len\": 24, \"n_heads\": 1, \"n_queries\": 24, \"block_acc\": [0, 24, 48, 0, 0, 0]}
{\"layer\": 1, \"kv_len\": 24, \"n_heads\": 1, \"n_queries\": 24, \"block_acc\": [0, 1, 2, 3, 4, 5]}

{\"layer\": 0, \"kv_len\": 13, \"n_heads\": 2, \"n_queries\": 1, \"block_acc\": [0, 0, 0, 2]}
";
    let out = lines(&replay(SMALL, trace, "ok"));
    assert_eq!(out.len(), 3);
    // Layer 0: protected blocks 0 and 5 (8 tokens), target 12: block 2 (EMA 0.2) wins.
    assert_eq!(out[0]["layer"], 0);
    assert_eq!(out[0]["triggered"], true);
    assert_eq!(out[0]["keep_tokens"], 12);
    assert_eq!(
        out[0]["reserve"],
        serde_json::json!([[0, 4], [8, 4], [20, 4]])
    );
    let s: Vec<f64> = serde_json::from_value(out[0]["scores"].clone()).unwrap();
    let want = [0.0, 0.1, 0.2, 0.0, 0.0, 0.0];
    for (a, b) in s.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{s:?}");
    }
    // Layer 1 is outside [0, 0]: passes through.
    assert_eq!(
        out[1],
        serde_json::json!({"layer": 1, "triggered": false, "keep_tokens": 24,
                           "reserve": [[0, 24]], "scores": []})
    );
    // The plan was applied (13 = 12 + 1): the scores moved with their blocks.
    assert_eq!(out[2]["triggered"], false);
    assert_eq!(out[2]["reserve"], serde_json::json!([[0, 13]]));
    let s: Vec<f64> = serde_json::from_value(out[2]["scores"].clone()).unwrap();
    assert_eq!(s.len(), 4);
    assert!(
        (s[1] - 0.9 * 0.2).abs() < 1e-6 && (s[3] - 0.1).abs() < 1e-6,
        "{s:?}"
    );
}

#[test]
fn default_config_when_keys_missing() {
    let acc = vec!["1"; 16].join(",");
    let trace = format!(
        "{{\"layer\": 0, \"kv_len\": 1024, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [{acc}]}}\n"
    );
    let out = lines(&replay("{}", &trace, "defaults"));
    // 1024 tokens: protected 64 + 256 = 320 >= ceil(1024 / 3.5) = 293: no plan.
    assert_eq!(out[0]["triggered"], false);
    assert_eq!(out[0]["keep_tokens"], 1024);
}

fn fails(config: &str, trace: &str, tag: &str, needle: &str) {
    let o = replay(config, trace, tag);
    assert_eq!(o.status.code(), Some(2), "{tag}");
    assert!(o.stdout.is_empty(), "{tag}: partial output");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{tag}: {err}");
    assert!(err.contains(needle), "{tag}: {err} lacks {needle}");
}

#[test]
fn bad_input_exits_2_with_line_and_reason() {
    let good =
        "{\"layer\": 0, \"kv_len\": 8, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [0, 1]}\n";
    fails(
        SMALL,
        &format!("{good}{{\"layer\": 0, \"kv_len\": 9"),
        "trunc",
        ".jsonl:2:",
    );
    fails(SMALL, &format!("{good}not json\n"), "garbage", ".jsonl:2:");
    fails(
        SMALL,
        "{\"layer\": 0, \"kv_len\": 9, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [0, 1]}\n",
        "blocks",
        ":1: block_acc has 2 entries, expected",
    );
    fails(
        SMALL,
        &format!("{good}{good}{{\"layer\": 0, \"kv_len\": -8, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": []}}\n"),
        "negative",
        ".jsonl:3:",
    );
    fails(
        SMALL,
        "{\"layer\": -1, \"kv_len\": 8, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [0, 1]}\n",
        "neglayer",
        ":1:",
    );
    fails(
        SMALL,
        "{\"layer\": 0, \"kv_len\": 8, \"n_heads\": 0, \"n_queries\": 1, \"block_acc\": [0, 1]}\n",
        "heads",
        ":1: invalid n_heads",
    );
    fails(
        SMALL,
        "{\"layer\": 0, \"kv_len\": 8, \"n_heads\": 1, \"n_queries\": 9, \"block_acc\": [0, 1]}\n",
        "queries",
        ":1: invalid n_queries",
    );
    fails(
        SMALL,
        &format!("{good}{{\"layer\": 0, \"kv_len\": 8, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [0, -1]}}\n"),
        "negsum",
        ":2: layer 0: accumulated attention sum -1",
    );
    fails(
        SMALL,
        "{\"layer\": 0, \"kv_len\": 8, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [0, 1e300]}\n",
        "inf",
        ":1: layer 0: accumulated attention sum inf",
    );
    fails(
        SMALL,
        "{\"layer\": 99999999, \"kv_len\": 8, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [0, 1]}\n",
        "hugelayer",
        ":1: layer 99999999 exceeds",
    );
    fails(
        SMALL,
        "{\"layer\": 0, \"kv_len\": 8, \"n_heads\": 1, \"n_queries\": 1, \"block_acc\": [0, 1], \"x\": 1}\n",
        "unknown",
        "unknown field",
    );
    fails(
        r#"{"h2o_block_tokens": 0}"#,
        good,
        "cfgzero",
        "h2o_block_tokens",
    );
    fails(r#"{"h2o_ema_alpha": 2}"#, good, "cfgalpha", "h2o_ema_alpha");
    fails(
        r#"{"h2o_blok_tokens": 4}"#,
        good,
        "cfgtypo",
        "unknown field",
    );
    fails(
        r#"{"h2o_sink_tokens": -3}"#,
        good,
        "cfgneg",
        "invalid value",
    );
    fails("[1, 2", good, "cfgtrunc", ".json");
}

#[test]
fn missing_file_is_an_io_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(["h2o", "replay", "/nonexistent/kvc/trace.jsonl"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
}
