//! The H2O trace format (v1) and its replay, behind `kvc h2o replay`: a JSON config and a
//! JSON-lines trace of attention calls in, one JSON line per call out. Every error is a
//! message naming the line.
//!
//! A trace line is one call of one layer ([`TraceCall`]):
//! `{"layer": 0, "kv_len": 24, "n_heads": 1, "n_queries": 24, "block_acc": [0, 24, 48, 0, 0, 0]}`
//! where `block_acc` holds the call's attention summed per block of `h2o_block_tokens` tokens
//! (`ceil(kv_len / block)` entries); blank lines are skipped. A replay line ([`ReplayLine`]) is
//! `{"layer":0,"triggered":true,"keep_tokens":12,"reserve":[[0,4],[8,4],[20,4]],"scores":[...]}`.
//! The config is the spec's `h2o_*` keys plus `selection` and `scope` ([`parse_config`]).
//! Golden files of v1: `crates/kvc-h2o/tests/golden/trace-v1/`.
//!
//! Not a recorder: engines write traces themselves; this module reads them, replays them
//! through [`H2oPolicy`], and writes what the policy decided.

use std::fmt::Write as _;

use crate::{CallShape, H2oConfig, H2oPolicy, PlanScope, Selection};
use serde::{Deserialize, Serialize};

/// The layer count a trace may address (layer indices below it).
pub const MAX_LAYERS: usize = 1 << 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    h2o_block_tokens: Option<u32>,
    h2o_sink_tokens: Option<u32>,
    h2o_recent_tokens: Option<u32>,
    h2o_target_lossy_ratio: Option<f32>,
    h2o_ema_alpha: Option<f32>,
    h2o_trigger_min_tokens: Option<u32>,
    h2o_update_interval: Option<u32>,
    h2o_layer_start: Option<u32>,
    h2o_layer_end: Option<u32>,
    /// kvc extension: "h2o" (default) or "streaming_llm".
    selection: Option<SelectionName>,
    /// kvc extension: "per_layer" (default) or "layer_uniform".
    scope: Option<ScopeName>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum SelectionName {
    H2o,
    StreamingLlm,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum ScopeName {
    PerLayer,
    LayerUniform,
}

impl ConfigFile {
    fn into_config(self) -> H2oConfig {
        let d = H2oConfig::default();
        H2oConfig {
            block_tokens: self.h2o_block_tokens.unwrap_or(d.block_tokens),
            sink_tokens: self.h2o_sink_tokens.unwrap_or(d.sink_tokens),
            recent_tokens: self.h2o_recent_tokens.unwrap_or(d.recent_tokens),
            target_lossy_ratio: self.h2o_target_lossy_ratio.unwrap_or(d.target_lossy_ratio),
            ema_alpha: self.h2o_ema_alpha.unwrap_or(d.ema_alpha),
            trigger_min_tokens: self.h2o_trigger_min_tokens.unwrap_or(d.trigger_min_tokens),
            update_interval: self.h2o_update_interval.unwrap_or(d.update_interval),
            layer_start: self.h2o_layer_start.unwrap_or(d.layer_start),
            layer_end: self.h2o_layer_end.or(d.layer_end),
            selection: match self.selection {
                None | Some(SelectionName::H2o) => Selection::HeavyHitters,
                Some(SelectionName::StreamingLlm) => Selection::StreamingLlm,
            },
            scope: match self.scope {
                None | Some(ScopeName::PerLayer) => PlanScope::PerLayer,
                Some(ScopeName::LayerUniform) => PlanScope::LayerUniform,
            },
            ..d
        }
    }
}

/// One attention call of a trace (one line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceCall {
    /// The layer called (below [`MAX_LAYERS`]).
    pub layer: usize,
    /// Tokens in the layer's cache at this call.
    pub kv_len: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Query tokens of the call.
    pub n_queries: usize,
    /// The attention of the call summed per block of tokens: `ceil(kv_len / block)` entries.
    pub block_acc: Vec<f32>,
}

impl TraceCall {
    /// The call as one trace line (JSON, no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a TraceCall always serializes")
    }
}

/// What the policy decided at one call (one output line of a replay).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayLine {
    /// The layer called.
    pub layer: usize,
    /// Whether the call made a plan.
    pub triggered: bool,
    /// Tokens the layer keeps.
    pub keep_tokens: usize,
    /// The kept token ranges `[offset, length]` (the whole cache when nothing triggered).
    pub reserve: Vec<[u32; 2]>,
    /// The layer's EMA score per block after the call.
    pub scores: Vec<f32>,
}

#[derive(Serialize)]
struct OutLine<'a> {
    layer: usize,
    triggered: bool,
    keep_tokens: usize,
    reserve: Vec<[u32; 2]>,
    scores: &'a [f32],
}

/// The policy settings of a config file's text (`None`: the defaults), validated.
pub fn parse_config(text: Option<&str>) -> Result<H2oConfig, String> {
    let config = match text {
        None => H2oConfig::default(),
        Some(text) => serde_json::from_str::<ConfigFile>(text)
            .map_err(|e| e.to_string())?
            .into_config(),
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

/// Parses and checks every line of the trace `text` (named `name` in messages) for blocks of
/// `config.block_tokens`: the calls with their 1-based line numbers, or the first bad line's
/// error (`name:line: why`).
pub fn parse_trace(
    config: &H2oConfig,
    name: &str,
    text: &str,
) -> Result<Vec<(usize, TraceCall)>, String> {
    let block = config.block_tokens as usize;
    let at = |line: usize, msg: &dyn std::fmt::Display| format!("{name}:{line}: {msg}");
    let mut calls = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let t: TraceCall = serde_json::from_str(raw).map_err(|e| at(line_no, &e))?;
        if t.layer >= MAX_LAYERS {
            return Err(at(
                line_no,
                &format!("layer {} exceeds the limit of {MAX_LAYERS} layers", t.layer),
            ));
        }
        let expected = t.kv_len.div_ceil(block);
        if t.block_acc.len() != expected {
            return Err(at(
                line_no,
                &format!(
                    "block_acc has {} entries, expected ceil(kv_len {} / block {block}) = {expected}",
                    t.block_acc.len(),
                    t.kv_len
                ),
            ));
        }
        calls.push((line_no, t));
    }
    Ok(calls)
}

/// Reads a replay's output (`name` in messages): one [`ReplayLine`] per non-blank line, or
/// the first bad line's error (`name:line: why`).
pub fn parse_replay_output(name: &str, text: &str) -> Result<Vec<ReplayLine>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, raw)| !raw.trim().is_empty())
        .map(|(i, raw)| serde_json::from_str(raw).map_err(|e| format!("{name}:{}: {e}", i + 1)))
        .collect()
}

/// Replays the trace `text` (named `name` in messages) through a policy with `config`;
/// the output lines, or the first bad line's error (`name:line: why`).
pub fn replay(config: H2oConfig, name: &str, text: &str) -> Result<String, String> {
    let at = |line: usize, msg: &dyn std::fmt::Display| format!("{name}:{line}: {msg}");

    // Pass 1: parse and check every line, so that the layer count is known.
    let calls = parse_trace(&config, name, text)?;
    let n_layers = calls.iter().map(|(_, t)| t.layer + 1).max().unwrap_or(1);
    let mut policy = H2oPolicy::new(config, n_layers).map_err(|e| e.to_string())?;

    // Pass 2: replay; output only when every line was good.
    let mut out = String::new();
    for (line_no, t) in &calls {
        let shape = CallShape {
            kv_len: t.kv_len,
            n_queries: t.n_queries,
            n_heads: t.n_heads,
            n_kv_heads: 1,
        };
        let step = |p: &mut H2oPolicy| {
            p.begin_call(t.layer, shape)?;
            p.ingest_block_sums(t.layer, &t.block_acc)?;
            p.end_call(t.layer)
        };
        let d = step(&mut policy).map_err(|e| at(*line_no, &e))?;
        let reserve = match policy.pending_plan(t.layer).filter(|_| d.triggered) {
            Some(plan) => plan.pairs().iter().map(|p| [p.offset, p.length]).collect(),
            None => vec![[0, t.kv_len as u32]],
        };
        let line = OutLine {
            layer: t.layer,
            triggered: d.triggered,
            keep_tokens: d.kept_tokens,
            reserve,
            scores: policy.scores(t.layer),
        };
        let json = serde_json::to_string(&line).map_err(|e| at(*line_no, &e))?;
        let _ = writeln!(out, "{json}");
    }
    Ok(out)
}
