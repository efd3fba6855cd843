//! Fuzz the parser and replay loop behind `kvc h2o replay` (`kvc_h2o::trace`, what the
//! command calls). The input is a config JSON and a
//! JSON-lines trace separated by the first NUL byte (no NUL: the default config and the
//! whole input as the trace). Any input gives an error message or output lines, never a
//! panic, an out-of-bounds access or an allocation the trace does not justify.
#![no_main]

use kvc_h2o::trace;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (config, trace_bytes) = match data.iter().position(|&b| b == 0) {
        Some(i) => (Some(&data[..i]), &data[i + 1..]),
        None => (None, data),
    };
    let config = match config.map(std::str::from_utf8) {
        Some(Err(_)) => return,
        Some(Ok(text)) => Some(text),
        None => None,
    };
    let Ok(text) = std::str::from_utf8(trace_bytes) else {
        return;
    };
    let Ok(config) = trace::parse_config(config) else {
        return;
    };
    if let Ok(out) = trace::replay(config, "fuzz.jsonl", text) {
        // One output line per non-blank input line.
        let calls = text.lines().filter(|l| !l.trim().is_empty()).count();
        assert_eq!(out.lines().count(), calls);
    }
});
