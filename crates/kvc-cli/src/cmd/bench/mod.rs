//! `kvc bench`: benchmarks on real KV data. Plain `kvc bench` is one summary screen
//! (`summary.rs`: lossless codecs, kvq against f16, speed); each area has its own
//! subcommand with the full tables (`kvc bench codec`, `kvc bench quant`, `kvc bench store`,
//! ...) as a sibling module here.

pub mod cache;
pub mod codec;
pub mod dataset;
pub mod qjl;
pub mod quant;
pub mod store;
pub mod summary;
pub mod tiers;

use clap::{Args, Subcommand};

use crate::cli_error::CliError;

/// Arguments of `kvc bench`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    /// Plain `kvc bench` (the summary screen) takes the codec bench's arguments.
    #[command(flatten)]
    codec: codec::CodecBenchArgs,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// gear-v1 and gear-v2 against plain zstd on KV dumps, per layer and tensor.
    Codec(codec::CodecBenchArgs),
    /// kvc-cache's compaction and kvc-int8's C8 quantize/dequantize GB/s, C8 error per layer.
    Cache(cache::BenchCacheArgs),
    /// kvc-store-async: simulated decode, bytes released, restore latency, C8 option.
    Store(store::BenchStoreArgs),
    /// kvq (kvc-kvq): bits/value, SNR per layer, attention error, GB/s, packed attention time.
    Quant(quant::BenchQuantArgs),
    /// kvc-store-tiers: store/restore GB/s per tier and codec against raw Redis.
    Tiers(tiers::BenchTiersArgs),
}

/// Runs `kvc bench`.
pub fn run(args: BenchArgs) -> Result<(), CliError> {
    match args.command {
        Some(BenchCommand::Codec(a)) => codec::run(a),
        Some(BenchCommand::Cache(a)) => cache::run(&a),
        Some(BenchCommand::Store(a)) => store::run(&a),
        Some(BenchCommand::Quant(a)) => quant::run(&a),
        Some(BenchCommand::Tiers(a)) => tiers::run(&a),
        None => summary::run(args.codec),
    }
}
