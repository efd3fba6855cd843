//! `kvc h2o`: the H2O eviction policy offline.
//!
//! `kvc h2o replay --config CFG.json TRACE.jsonl` feeds a recorded trace of attention
//! calls (one JSON object per line) through the policy and writes one JSON line per call:
//! whether the layer triggered, the tokens it keeps, its reserve pairs and its EMA scores.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use kvc_h2o::{CallShape, H2oConfig, H2oPolicy, PlanScope, Selection};
use serde::{Deserialize, Serialize};

use crate::cli_error::CliError;

/// Arguments of `kvc h2o`.
#[derive(Args)]
pub struct H2oArgs {
    #[command(subcommand)]
    command: H2oCommand,
}

#[derive(Subcommand)]
enum H2oCommand {
    /// Replay a trace of attention calls through the policy; one JSON line out per call.
    Replay(ReplayArgs),
}

#[derive(Args)]
struct ReplayArgs {
    /// JSON object with any of the h2o_* settings; missing keys take the defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// JSON lines: {"layer", "kv_len", "n_heads", "n_queries", "block_acc"} per call.
    trace: PathBuf,
}

/// The layer count a trace may address (layer indices below it).
const MAX_LAYERS: usize = 1 << 16;

/// Runs `kvc h2o`.
pub fn run(args: H2oArgs) -> Result<(), CliError> {
    match args.command {
        H2oCommand::Replay(a) => replay(&a),
    }
}

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    layer: usize,
    kv_len: usize,
    n_heads: usize,
    n_queries: usize,
    block_acc: Vec<f32>,
}

#[derive(Serialize)]
struct OutLine<'a> {
    layer: usize,
    triggered: bool,
    keep_tokens: usize,
    reserve: Vec<[u32; 2]>,
    scores: &'a [f32],
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError::io(path, e))
}

fn load_config(path: Option<&Path>) -> Result<H2oConfig, CliError> {
    let config = match path {
        None => H2oConfig::default(),
        Some(p) => {
            let text = read(p)?;
            let file: ConfigFile = serde_json::from_str(&text)
                .map_err(|e| CliError::input(format!("{}: {e}", p.display())))?;
            file.into_config()
        }
    };
    config.validate().map_err(|e| {
        CliError::input(format!(
            "{}: {e}",
            path.map_or("config".into(), |p| p.display().to_string())
        ))
    })?;
    Ok(config)
}

fn replay(args: &ReplayArgs) -> Result<(), CliError> {
    let config = load_config(args.config.as_deref())?;
    let block = config.block_tokens as usize;
    let text = read(&args.trace)?;
    let name = args.trace.display().to_string();
    let at =
        |line: usize, msg: &dyn std::fmt::Display| CliError::input(format!("{name}:{line}: {msg}"));

    // Pass 1: parse and check every line, so that the layer count is known.
    let mut calls = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let t: TraceLine = serde_json::from_str(raw).map_err(|e| at(line_no, &e))?;
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
    let n_layers = calls.iter().map(|(_, t)| t.layer + 1).max().unwrap_or(1);
    let mut policy = H2oPolicy::new(config, n_layers).map_err(CliError::input)?;

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
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::io(Path::new("<stdout>"), e))
}
