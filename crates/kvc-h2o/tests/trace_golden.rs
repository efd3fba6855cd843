//! Golden files of the H2O trace format, v1 (`kvc_h2o::trace`), pcodec style: a fixed input
//! encodes to the checked-in bytes, and the checked-in bytes decode to the fixed values.
//! Files in `tests/golden/trace-v1/`: `config.json` (read only), `trace.jsonl` (the calls)
//! and `replay.jsonl` (what `kvc h2o replay` writes for them). A new version gets a new
//! directory; these files never change. `KVC_WRITE_GOLDEN=1` writes missing files (only a
//! new version's), it never overwrites.

use std::path::PathBuf;

use kvc_h2o::trace::{self, ReplayLine, TraceCall};
use kvc_h2o::{H2oConfig, PlanScope, Selection};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/trace-v1")
}

/// The golden file `name`; with `KVC_WRITE_GOLDEN` set, a missing one is first written with
/// `fresh` (what the encoder gives now).
fn golden(name: &str, fresh: &str) -> String {
    let path = dir().join(name);
    if std::env::var_os("KVC_WRITE_GOLDEN").is_some() && !path.exists() {
        std::fs::write(&path, fresh).unwrap();
    }
    read(name)
}

fn read(name: &str) -> String {
    let path = dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fixed config: blocks of 4 tokens, 4 sink and 4 recent, ratio 2, from 8 tokens on.
fn config() -> H2oConfig {
    H2oConfig {
        block_tokens: 4,
        sink_tokens: 4,
        recent_tokens: 4,
        target_lossy_ratio: 2.0,
        trigger_min_tokens: 8,
        update_interval: 16,
        layer_start: 0,
        layer_end: None,
        selection: Selection::HeavyHitters,
        scope: PlanScope::PerLayer,
        ..H2oConfig::default()
    }
}

/// The fixed calls: two layers, a first call that triggers, a small second call.
fn calls() -> Vec<TraceCall> {
    let call = |layer, kv_len, n_heads, n_queries, block_acc: &[f32]| TraceCall {
        layer,
        kv_len,
        n_heads,
        n_queries,
        block_acc: block_acc.to_vec(),
    };
    vec![
        call(0, 24, 1, 24, &[0.0, 24.0, 48.0, 0.0, 0.0, 0.0]),
        call(1, 24, 1, 24, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
        call(0, 13, 2, 1, &[0.0, 0.0, 0.0, 2.0]),
        call(1, 30, 2, 2, &[0.5, 0.25, 0.125, 1.0, 0.0, 0.75, 0.0, 2.0]),
    ]
}

/// What the policy decided for the fixed calls: the decoded `replay.jsonl`.
fn replayed() -> Vec<ReplayLine> {
    let line = |layer, triggered, keep_tokens, reserve: &[[u32; 2]], scores: &[f32]| ReplayLine {
        layer,
        triggered,
        keep_tokens,
        reserve: reserve.to_vec(),
        scores: scores.to_vec(),
    };
    vec![
        line(
            0,
            true,
            12,
            &[[0, 4], [8, 4], [20, 4]],
            &[0.0, 0.1, 0.2, 0.0, 0.0, 0.0],
        ),
        line(
            1,
            true,
            12,
            &[[0, 4], [16, 8]],
            &[
                0.0,
                0.1 / 24.0,
                0.2 / 24.0,
                0.3 / 24.0,
                0.4 / 24.0,
                0.5 / 24.0,
            ],
        ),
        line(0, false, 13, &[[0, 13]], &[0.0, 0.18, 0.0, 0.1]),
        line(
            1,
            false,
            30,
            &[[0, 30]],
            &[0.0125, 0.01, 0.010625, 0.03625, 0.015, 0.0375, 0.0, 0.05],
        ),
    ]
}

fn trace_text(calls: &[TraceCall]) -> String {
    calls.iter().map(|c| c.to_line() + "\n").collect()
}

#[test]
fn v1_calls_encode_to_the_golden_trace() {
    let fresh = trace_text(&calls());
    assert_eq!(fresh, golden("trace.jsonl", &fresh));
}

#[test]
fn v1_golden_trace_and_config_decode_to_the_fixed_input() {
    let config_text = read("config.json");
    let parsed = trace::parse_config(Some(&config_text)).unwrap();
    assert_eq!(parsed, config());
    let text = read("trace.jsonl");
    let parsed = trace::parse_trace(&parsed, "trace.jsonl", &text).unwrap();
    let lines: Vec<usize> = parsed.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, [1, 2, 3, 4]);
    let parsed: Vec<TraceCall> = parsed.into_iter().map(|(_, c)| c).collect();
    assert_eq!(parsed, calls());
}

#[test]
fn v1_replay_of_the_fixed_input_encodes_to_the_golden_output() {
    let fresh = trace::replay(config(), "trace.jsonl", &trace_text(&calls())).unwrap();
    assert_eq!(fresh, golden("replay.jsonl", &fresh));
}

#[test]
fn v1_golden_output_decodes_to_the_fixed_decisions() {
    let text = read("replay.jsonl");
    let got = trace::parse_replay_output("replay.jsonl", &text).unwrap();
    let want = replayed();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            (g.layer, g.triggered, g.keep_tokens),
            (w.layer, w.triggered, w.keep_tokens)
        );
        assert_eq!(g.reserve, w.reserve, "{g:?}");
        assert_eq!(g.scores.len(), w.scores.len(), "{g:?}");
        for (a, b) in g.scores.iter().zip(&w.scores) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                "{g:?} against {w:?}"
            );
        }
    }
}

#[test]
fn damaged_golden_bytes_are_errors_naming_the_line() {
    let text = read("trace.jsonl").replacen("\"kv_len\":13", "\"kv_len\":130", 1);
    let err = trace::parse_trace(&config(), "t.jsonl", &text).unwrap_err();
    assert!(
        err.starts_with("t.jsonl:3: block_acc has 4 entries"),
        "{err}"
    );
    let text = read("replay.jsonl").replacen("\"layer\"", "\"layers\"", 1);
    let err = trace::parse_replay_output("r.jsonl", &text).unwrap_err();
    assert!(err.starts_with("r.jsonl:1: unknown field"), "{err}");
}
