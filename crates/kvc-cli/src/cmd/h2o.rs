//! `kvc h2o`: the H2O eviction policy offline.
//!
//! `kvc h2o replay --config CFG.json TRACE.jsonl` feeds a recorded trace of attention
//! calls (one JSON object per line) through the policy and writes one JSON line per call:
//! whether the layer triggered, the tokens it keeps, its reserve pairs and its EMA scores.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use kvc_h2o::H2oConfig;

use crate::cli_error::CliError;

use kvc_h2o::trace;

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

/// Runs `kvc h2o`.
pub fn run(args: H2oArgs) -> Result<(), CliError> {
    match args.command {
        H2oCommand::Replay(a) => replay(&a),
    }
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError::io(path, e))
}

fn load_config(path: Option<&Path>) -> Result<H2oConfig, CliError> {
    let text = path.map(read).transpose()?;
    trace::parse_config(text.as_deref()).map_err(|e| {
        CliError::input(format!(
            "{}: {e}",
            path.map_or("config".into(), |p| p.display().to_string())
        ))
    })
}

fn replay(args: &ReplayArgs) -> Result<(), CliError> {
    let config = load_config(args.config.as_deref())?;
    let text = read(&args.trace)?;
    let out =
        trace::replay(config, &args.trace.display().to_string(), &text).map_err(CliError::input)?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::io(Path::new("<stdout>"), e))
}
