//! The `kvc` command: benchmarks, inspection, offline replay, and quantizing or coding
//! cache files.
//!
//! `kvc` runs kvc's codecs, policies and compressors on files and on the embedded sample of
//! real KV-cache data, and prints what they achieve (ratios, MB/s, errors) as a table and as
//! JSON. It is a thin layer over the library crates and holds no algorithm of its own.

mod cli_error;
mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cli_error::CliError;

/// kvc: KV-cache compression for LLM inference engines.
#[derive(Parser)]
#[command(name = "kvc", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// One variant per area; each area's arguments and code live in `cmd/<area>.rs`.
#[derive(Subcommand)]
enum Command {
    /// H2O eviction policy: offline replay of attention traces.
    H2o(cmd::h2o::H2oArgs),
    /// The learned MLP compressor: inspect weight files, compress raw K/V, train weights
    /// on a model's own K/V/Q.
    Mlp(cmd::mlp::MlpArgs),
    /// int8 C8 KV-cache quantization with msmodelslim scale files: calibrate, apply,
    /// dequant.
    Int8(cmd::quant::Int8Args),
    /// kvq KV-cache codes (2-8-bit rotated rows): packed cache files (apply, dequant),
    /// calibrated plans (plan), plans and configs (inspect).
    Kvq(cmd::quant::KvqArgs),
    /// Old spelling of `kvc int8` and `kvc kvq` (`quant apply --kvq`, `quant plan`, ...),
    /// kept for scripts.
    Quant(cmd::quant::QuantArgs),
    /// The transform coder of the shared tiers (`tc-<bound>`): calibrate on a model's own
    /// K/V/Q dump, inspect a calibration file.
    Tc(cmd::tc::TcArgs),
    /// Encode or decode one gear-v1 or gear-v2 blob of a raw tensor.
    Codec(cmd::codec::CodecArgs),
    /// Benchmarks on real KV data: a summary screen (plain `kvc bench`: lossless, kvq
    /// against f16, speed), the codecs, cache compaction and C8, the asynchronous store,
    /// kvq, the shared tiers.
    Bench(cmd::bench::BenchArgs),
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::H2o(args) => cmd::h2o::run(args),
        Command::Mlp(args) => cmd::mlp::run(args),
        Command::Int8(args) => cmd::quant::run_int8(args),
        Command::Kvq(args) => cmd::quant::run_kvq(args),
        Command::Quant(args) => cmd::quant::run(args),
        Command::Tc(args) => cmd::tc::run(args),
        Command::Codec(args) => cmd::codec::run(args),
        Command::Bench(args) => cmd::bench::run(args),
    }
}

/// Restores the default action of SIGPIPE, which the Rust runtime sets to "ignore": a
/// reader that closes its end early (`kvc bench | head`) then ends `kvc` quietly, as it
/// does any Unix filter, instead of making the next `println!` panic.
#[cfg(unix)]
fn end_quietly_on_closed_pipe() {
    // SAFETY: called first thing in `main`, before any other thread exists; setting a
    // signal's disposition to SIG_DFL installs no handler code and touches no memory.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn end_quietly_on_closed_pipe() {}

fn main() -> ExitCode {
    end_quietly_on_closed_pipe();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kvc: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}
