//! `kvc codec encode|decode`: one gear-v1 or gear-v2 blob of a whole raw file, and back.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use kvc_codec::gear_v1::{EncodeOptions, GearV1Decoder, GearV1Encoder, PredictorSet};
use kvc_codec::gear_v2::{self, EncodeParams, TensorKind};
use kvc_codec::Dtype;

use crate::cli_error::CliError;

/// Arguments of `kvc codec`.
#[derive(Args)]
pub struct CodecArgs {
    #[command(subcommand)]
    command: CodecCommand,
}

/// The blob format `kvc codec encode` writes.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// MNN's gear predictive format (byte planes, predictors, zstd).
    #[value(name = "gear-v1")]
    GearV1,
    /// kvc's KV-aware format (per-channel Huffman tables, chunked).
    #[value(name = "gear-v2")]
    GearV2,
}

/// Which gear-v2 coder writes the blob (the decoder reads both).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CoderArg {
    /// The library's default (currently shared for every dtype).
    Auto,
    /// Relative symbols, tables shared by clusters of channels.
    Shared,
    /// One table per group of channels, the first gear-v2 coder.
    Grouped,
}

/// Which cache tensor a gear-v2 blob holds (recorded in its header).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// Keys.
    K,
    /// Values.
    V,
}

#[derive(Subcommand)]
enum CodecCommand {
    /// Write one blob of the whole raw file IN to OUT.
    Encode {
        /// Blob format.
        #[arg(long, value_enum, default_value = "gear-v1")]
        format: Format,
        /// Element type of IN: f16, bf16, f32 or i8.
        #[arg(long, value_parser = parse_dtype)]
        dtype: Dtype,
        /// gear-v2: channels per token (kv_heads * head_dim); IN holds whole tokens,
        /// token-major.
        #[arg(long)]
        channels: Option<u32>,
        /// gear-v2: the tensor kind recorded in the header.
        #[arg(long, value_enum)]
        kind: Option<Kind>,
        /// gear-v2: tokens per independently decodable chunk.
        #[arg(long, default_value_t = gear_v2::DEFAULT_CHUNK_TOKENS)]
        chunk_tokens: u32,
        /// gear-v2: the coder.
        #[arg(long, value_enum, default_value = "auto")]
        coder: CoderArg,
        /// gear-v1: predictors to try, comma-separated: raw, delta_seq, xor_seq.
        #[arg(long, default_value = "raw,delta_seq,xor_seq", value_parser = parse_predictors)]
        predictors: PredictorSet,
        /// gear-v1: zstd level of the zstd candidates.
        #[arg(long, default_value_t = kvc_codec::zstd::DEFAULT_LEVEL, allow_negative_numbers = true)]
        zstd_level: i32,
        /// Raw little-endian tensor bytes.
        input: PathBuf,
        /// Where to write the blob.
        output: PathBuf,
    },
    /// Decode the blob IN and write the raw bytes to OUT. gear-v2 blobs are recognised by
    /// their magic and carry their dtype and shape; gear-v1 blobs need --dtype.
    Decode {
        /// Element type the blob holds: f16, bf16, f32 or i8 (needed for gear-v1; for
        /// gear-v2, checked against the blob).
        #[arg(long, value_parser = parse_dtype)]
        dtype: Option<Dtype>,
        /// A gear-v1 or gear-v2 blob.
        input: PathBuf,
        /// Where to write the raw bytes (not created when IN is not a valid blob).
        output: PathBuf,
    },
}

/// clap parser for a `--dtype` that must be a float type (`f16`, `bf16`, `f32`; the
/// help lists them).
pub fn float_dtype() -> impl clap::builder::TypedValueParser<Value = Dtype> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(
        Dtype::ALL
            .into_iter()
            .filter(|d| d.is_float())
            .map(Dtype::name),
    )
    .try_map(|s: String| s.parse::<Dtype>())
}

/// clap parser for `--dtype`.
pub fn parse_dtype(s: &str) -> Result<Dtype, String> {
    s.parse::<Dtype>().map_err(|e| e.to_string())
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

fn in_file(path: &Path) -> impl Fn(kvc_codec::Error) -> CliError + '_ {
    move |e| CliError::input(format!("{}: {e}", path.display()))
}

/// Runs `kvc codec`.
pub fn run(args: CodecArgs) -> Result<(), CliError> {
    match args.command {
        CodecCommand::Encode {
            format,
            dtype,
            channels,
            kind,
            chunk_tokens,
            coder,
            predictors,
            zstd_level,
            input,
            output,
        } => {
            let blob = match format {
                Format::GearV1 => {
                    if channels.is_some() || kind.is_some() {
                        return Err(CliError::input(
                            "--channels and --kind apply to --format gear-v2 only",
                        ));
                    }
                    let data = read(&input)?;
                    let mut encoder = GearV1Encoder::new(EncodeOptions {
                        predictors,
                        zstd_level,
                    })
                    .map_err(CliError::input)?;
                    encoder
                        .encode_to_vec(dtype, &data)
                        .map_err(in_file(&input))?
                }
                Format::GearV2 => {
                    let channels = channels
                        .ok_or_else(|| CliError::input("--format gear-v2 needs --channels"))?;
                    let data = read(&input)?;
                    let params = EncodeParams {
                        dtype,
                        channels,
                        kind: match kind {
                            None => TensorKind::Unspecified,
                            Some(Kind::K) => TensorKind::K,
                            Some(Kind::V) => TensorKind::V,
                        },
                        chunk_tokens,
                    };
                    let mut out = Vec::new();
                    gear_v2::Encoder::with_coder(match coder {
                        CoderArg::Auto => gear_v2::Coder::Auto,
                        CoderArg::Shared => gear_v2::Coder::SharedShape,
                        CoderArg::Grouped => gear_v2::Coder::Grouped,
                    })
                    .encode_into_parallel(&params, &data, &mut out)
                    .map_err(in_file(&input))?;
                    out
                }
            };
            write(&output, &blob)
        }
        CodecCommand::Decode {
            dtype,
            input,
            output,
        } => {
            let blob = read(&input)?;
            let data = if gear_v2::is_gear_v2(&blob) {
                let mut decoder = gear_v2::Decoder::new();
                let open = decoder.open(&blob).map_err(in_file(&input))?;
                let found = open.header().dtype;
                if let Some(d) = dtype.filter(|&d| d != found) {
                    return Err(CliError::input(format!(
                        "{}: --dtype {} given, the gear-v2 blob holds {}",
                        input.display(),
                        d.name(),
                        found.name()
                    )));
                }
                let mut out = vec![0u8; open.header().decoded_len()];
                open.decode_into_parallel(&mut out)
                    .map_err(in_file(&input))?;
                out
            } else {
                let dtype = dtype.ok_or_else(|| {
                    CliError::input(format!(
                        "{}: not a gear-v2 blob; decoding it as gear-v1 needs --dtype",
                        input.display()
                    ))
                })?;
                let mut decoder = GearV1Decoder::new().map_err(CliError::input)?;
                decoder
                    .decode_to_vec(dtype, &blob)
                    .map_err(in_file(&input))?
            };
            write(&output, &data)
        }
    }
}
