//! What a small trace can make `kvc h2o replay` allocate (issue 25): a config and trace of
//! about 100 bytes, whatever lengths and head counts they claim, make the parser and
//! replay hold at most [`MAX_BYTES_PER_INPUT_BYTE`] times their size at once, plus
//! [`FIXED_BYTES`], plus [`MAX_BYTES_PER_LAYER`] for each layer up to the highest one the
//! trace names: the policy keeps a state per layer, and layer indices are capped at
//! `trace::MAX_LAYERS` (65536), so a trace can make it hold at most 32 MiB. Calls the
//! command's own parser and replay (`kvc_h2o::trace`), as the fuzz target does.

use kvc_h2o::trace;
use kvc_test_alloc::{measure, random_bytes};

/// The stated bound: bytes held at once per input byte...
const MAX_BYTES_PER_INPUT_BYTE: usize = 16;
/// ...plus this much for any call (the policy's fixed state, messages).
const FIXED_BYTES: usize = 4 * 1024;
/// ...plus this much per layer up to the highest one named.
const MAX_BYTES_PER_LAYER: usize = 512;

#[global_allocator]
static GLOBAL: kvc_test_alloc::Counting = kvc_test_alloc::Counting;

#[test]
fn a_100_byte_trace_allocates_little() {
    let mut cases: Vec<(Option<String>, String)> = vec![
        (None, r#"{"layer": 65535, "kv_len": 1, "n_heads": 1, "n_queries": 1, "block_acc": [1]}"#.into()),
        (None, r#"{"layer": 0, "kv_len": 18446744073709551615, "n_heads": 1, "n_queries": 1, "block_acc": []}"#.into()),
        (None, r#"{"layer": 0, "kv_len": 64, "n_heads": 18446744073709551615, "n_queries": 18446744073709551615, "block_acc": [1]}"#.into()),
        (Some(r#"{"h2o_block_tokens": 1, "h2o_recent_tokens": 4294967295}"#.into()),
         r#"{"layer": 3, "kv_len": 3, "n_heads": 1, "n_queries": 9, "block_acc": [1, 2, 3]}"#.into()),
        (Some(r#"{"h2o_block_tokens": 4294967295, "h2o_layer_end": 4294967295}"#.into()),
         r#"{"layer": 9, "kv_len": 4294967295, "n_heads": 1, "n_queries": 1, "block_acc": [1]}"#.into()),
        (None, "[".repeat(100)),
        (None, format!(r#"{{"layer": 1{}}}"#, "0".repeat(80))),
    ];
    // Random lines made of the trace's own keys and numbers.
    for seed in 0..300u64 {
        let mut r = [0u8; 8];
        random_bytes(seed, &mut r);
        let n =
            |i: usize| [0u64, 1, 4, 63, 64, 65535, u32::MAX as u64, u64::MAX][r[i] as usize % 8];
        cases.push((
            None,
            format!(
                r#"{{"layer": {}, "kv_len": {}, "n_heads": {}, "n_queries": {}, "block_acc": [1]}}"#,
                n(0) % 65536,
                n(1),
                n(2),
                n(3)
            ),
        ));
    }
    let mut worst = 0;
    for (config, text) in &cases {
        let input = config.as_ref().map_or(0, String::len) + text.len();
        let (peak, largest) = measure(|| {
            if let Ok(c) = trace::parse_config(config.as_deref()) {
                let _ = trace::replay(c, "t.jsonl", text);
            }
        });
        worst = worst.max(peak);
        let layers = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v["layer"].as_u64())
            .filter(|&l| l < trace::MAX_LAYERS as u64)
            .map_or(0, |l| l as usize + 1);
        let bound = MAX_BYTES_PER_INPUT_BYTE * input + FIXED_BYTES + MAX_BYTES_PER_LAYER * layers;
        assert!(
            peak <= bound && largest <= bound,
            "{input} bytes of config and trace held {peak} bytes at once (largest \
             allocation {largest}), bound {bound}: {config:?} {text}"
        );
    }
    assert!(worst > 0);
    eprintln!("h2o replay: at most {worst} bytes held for ~100-byte traces");
}
