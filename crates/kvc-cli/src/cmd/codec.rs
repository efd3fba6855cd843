//! `kvc codec encode|decode`: one gear-v1 blob of a whole raw file, and back.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use kvc_codec::gear_v1::{EncodeOptions, GearV1Decoder, GearV1Encoder, PredictorSet};
use kvc_codec::Dtype;

use crate::cli_error::CliError;

/// Arguments of `kvc codec`.
#[derive(Args)]
pub struct CodecArgs {
    #[command(subcommand)]
    command: CodecCommand,
}

#[derive(Subcommand)]
enum CodecCommand {
    /// Write one gear-v1 blob of the whole raw file IN to OUT.
    Encode {
        /// Element type of IN: f16, bf16, f32 or i8.
        #[arg(long, value_parser = parse_dtype)]
        dtype: Dtype,
        /// Predictors to try, comma-separated: raw, delta_seq, xor_seq.
        #[arg(long, default_value = "raw,delta_seq,xor_seq", value_parser = parse_predictors)]
        predictors: PredictorSet,
        /// zstd level of the zstd candidates.
        #[arg(long, default_value_t = kvc_codec::zstd::DEFAULT_LEVEL, allow_negative_numbers = true)]
        zstd_level: i32,
        /// Raw little-endian tensor bytes.
        input: PathBuf,
        /// Where to write the blob.
        output: PathBuf,
    },
    /// Decode the gear-v1 blob IN and write the raw bytes to OUT.
    Decode {
        /// Element type the blob holds: f16, bf16, f32 or i8.
        #[arg(long, value_parser = parse_dtype)]
        dtype: Dtype,
        /// A gear-v1 blob.
        input: PathBuf,
        /// Where to write the raw bytes (not created when IN is not a valid blob).
        output: PathBuf,
    },
}

/// clap parser for `--dtype`.
pub fn parse_dtype(s: &str) -> Result<Dtype, String> {
    s.parse().map_err(|e: kvc_codec::Error| e.to_string())
}

/// clap parser for predictor lists.
pub fn parse_predictors(s: &str) -> Result<PredictorSet, String> {
    s.parse().map_err(|e: kvc_codec::Error| e.to_string())
}

fn read(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::io(path, e))
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    std::fs::write(path, bytes).map_err(|e| CliError::io(path, e))
}

/// Runs `kvc codec`.
pub fn run(args: CodecArgs) -> Result<(), CliError> {
    match args.command {
        CodecCommand::Encode {
            dtype,
            predictors,
            zstd_level,
            input,
            output,
        } => {
            let data = read(&input)?;
            let mut encoder = GearV1Encoder::new(EncodeOptions {
                predictors,
                zstd_level,
            })
            .map_err(CliError::input)?;
            let blob = encoder
                .encode_to_vec(dtype, &data)
                .map_err(|e| CliError::input(format!("{}: {e}", input.display())))?;
            write(&output, &blob)
        }
        CodecCommand::Decode {
            dtype,
            input,
            output,
        } => {
            let blob = read(&input)?;
            let mut decoder = GearV1Decoder::new().map_err(CliError::input)?;
            let data = decoder
                .decode_to_vec(dtype, &blob)
                .map_err(|e| CliError::input(format!("{}: {e}", input.display())))?;
            write(&output, &data)
        }
    }
}
