//! `kvc bench` / `kvc bench codec`: gear-v1 and gear-v2 against plain zstd-3 on real KV
//! dumps.
//!
//! For every dump (K and V, each dtype), per layer and in total: the ratio (raw bytes /
//! stored bytes, headers included) of whole-layer blobs and of independent
//! `--chunk-tokens` chunks (gear-v2's whole-layer blobs use `--chunk-tokens` as their
//! internal chunking too), and compress / decompress MB/s (uncompressed bytes) of the
//! chunks on one core and, for the totals, on all cores. Every blob is decoded and checked
//! bit-exact against its input. Timings are the fastest of `--repeat` runs.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvc_codec::gear_v1::{EncodeOptions, GearV1Decoder, GearV1Encoder, PredictorSet};
use kvc_codec::gear_v2::{self, EncodeParams, TensorKind};
use kvc_codec::zstd::{compress_bound, ZstdCompressor, ZstdDecompressor};
use kvc_codec::Dtype;
use rayon::prelude::*;
use serde::Serialize;

use super::dataset::{self, Dataset, Dump};
use crate::cli_error::CliError;
use crate::cmd::codec::parse_predictors;

/// Arguments of the codec bench.
#[derive(Args, Clone)]
pub struct CodecBenchArgs {
    /// Directory of KV dumps (`.bin` + JSON sidecar, as ../shared/data/realkv); default:
    /// the embedded sample.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Tokens per independently coded chunk.
    #[arg(long, default_value_t = 384)]
    chunk_tokens: usize,
    /// Timed runs per measurement; the fastest counts.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// gear-v1 predictors tried on K.
    #[arg(long, default_value = "raw,delta_seq,xor_seq", value_parser = parse_predictors)]
    k_predictors: PredictorSet,
    /// gear-v1 predictors tried on V.
    #[arg(long, default_value = "raw,delta_seq,xor_seq", value_parser = parse_predictors)]
    v_predictors: PredictorSet,
    /// zstd level of gear-v1's zstd candidates and of the plain zstd baseline.
    #[arg(long, default_value_t = kvc_codec::zstd::DEFAULT_LEVEL, allow_negative_numbers = true)]
    zstd_level: i32,
}

/// One codec's numbers for a layer or a total.
#[derive(Serialize, Default, Clone)]
struct CodecStats {
    stored_bytes_whole: u64,
    stored_bytes_chunks: u64,
    ratio_whole: f64,
    ratio_chunks: f64,
    compress_mb_s_1core: f64,
    decompress_mb_s_1core: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    compress_mb_s_all_cores: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decompress_mb_s_all_cores: Option<f64>,
    #[serde(skip)]
    compress_time_1core: Duration,
    #[serde(skip)]
    decompress_time_1core: Duration,
}

impl CodecStats {
    fn finish(&mut self, raw: u64) {
        self.ratio_whole = raw as f64 / self.stored_bytes_whole as f64;
        self.ratio_chunks = raw as f64 / self.stored_bytes_chunks as f64;
        self.compress_mb_s_1core = mb_s(raw, self.compress_time_1core);
        self.decompress_mb_s_1core = mb_s(raw, self.decompress_time_1core);
    }

    fn add(&mut self, other: &CodecStats) {
        self.stored_bytes_whole += other.stored_bytes_whole;
        self.stored_bytes_chunks += other.stored_bytes_chunks;
        self.compress_time_1core += other.compress_time_1core;
        self.decompress_time_1core += other.decompress_time_1core;
    }
}

#[derive(Serialize)]
struct LayerReport {
    layer: usize,
    raw_bytes: u64,
    gear_v1: CodecStats,
    gear_v2: CodecStats,
    zstd: CodecStats,
}

#[derive(Serialize)]
struct TensorReport {
    tensor: String,
    dtype: String,
    shape: [usize; 4],
    predictors: String,
    layers: Vec<LayerReport>,
    total: TotalReport,
}

#[derive(Serialize)]
struct TotalReport {
    raw_bytes: u64,
    gear_v1: CodecStats,
    gear_v2: CodecStats,
    zstd: CodecStats,
}

#[derive(Serialize)]
struct DtypeSummary {
    dtype: String,
    raw_bytes: u64,
    gear_v1_ratio_chunks: f64,
    gear_v1_ratio_whole: f64,
    gear_v2_ratio_chunks: f64,
    gear_v2_ratio_whole: f64,
    zstd_ratio_chunks: f64,
    zstd_ratio_whole: f64,
}

#[derive(Serialize)]
struct BenchReport {
    bench: &'static str,
    source: String,
    chunk_tokens: usize,
    repeat: usize,
    threads: usize,
    zstd_level: i32,
    tensors: Vec<TensorReport>,
    /// K and V together, per dtype: the whole model's ratio.
    k_and_v: Vec<DtypeSummary>,
    /// Plain `kvc bench`'s summary screen (lossless, kvq, speed against f16).
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<serde_json::Value>,
}

fn mb_s(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64().max(1e-9)
}

/// The fastest of `repeat` runs of `f`.
fn fastest(
    repeat: usize,
    mut f: impl FnMut() -> Result<(), CliError>,
) -> Result<Duration, CliError> {
    let mut best = Duration::MAX;
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

fn codec_err(e: kvc_codec::Error) -> CliError {
    CliError::input(e)
}

fn mismatch(what: &str, dump: &Dump) -> CliError {
    CliError::input(format!(
        "{what} of {} {} did not decode to its input",
        dump.tensor, dump.dtype
    ))
}

/// A compressor and its decompressor, behind one interface for gear-v1 and plain zstd.
trait Codec: Send {
    fn encode(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CliError>;
    fn decode(&mut self, blob: &[u8], out: &mut [u8]) -> Result<(), CliError>;
}

struct Gear {
    dtype: Dtype,
    enc: GearV1Encoder,
    dec: GearV1Decoder,
}

impl Codec for Gear {
    fn encode(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CliError> {
        self.enc.encode(self.dtype, data, out).map_err(codec_err)
    }
    fn decode(&mut self, blob: &[u8], out: &mut [u8]) -> Result<(), CliError> {
        let n = self
            .dec
            .decode_into(self.dtype, blob, out)
            .map_err(codec_err)?;
        if n != out.len() {
            return Err(CliError::input(
                "gear-v1 blob decoded to a different length",
            ));
        }
        Ok(())
    }
}

struct GearV2 {
    params: EncodeParams,
    enc: gear_v2::Encoder,
    dec: gear_v2::Decoder,
}

impl Codec for GearV2 {
    fn encode(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CliError> {
        self.enc
            .encode_into(&self.params, data, out)
            .map_err(codec_err)
    }
    fn decode(&mut self, blob: &[u8], out: &mut [u8]) -> Result<(), CliError> {
        let n = self.dec.decode_into(blob, out).map_err(codec_err)?;
        if n != out.len() {
            return Err(CliError::input(
                "gear-v2 blob decoded to a different length",
            ));
        }
        Ok(())
    }
}

struct PlainZstd {
    level: i32,
    enc: ZstdCompressor,
    dec: ZstdDecompressor,
}

impl Codec for PlainZstd {
    fn encode(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CliError> {
        let bound = compress_bound(data.len())
            .ok_or_else(|| CliError::input("input too large for zstd"))?;
        out.resize(bound, 0);
        let n = self
            .enc
            .compress_into(data, self.level, out)
            .map_err(codec_err)?;
        out.truncate(n);
        Ok(())
    }
    fn decode(&mut self, blob: &[u8], out: &mut [u8]) -> Result<(), CliError> {
        self.dec.decompress_exact(blob, out).map_err(codec_err)
    }
}

#[derive(Clone, Copy)]
enum Which {
    Gear(Dtype, EncodeOptions),
    GearV2(EncodeParams),
    Zstd(i32),
}

impl Which {
    fn make(self) -> Result<Box<dyn Codec>, CliError> {
        Ok(match self {
            Which::Gear(dtype, options) => Box::new(Gear {
                dtype,
                enc: GearV1Encoder::new(options).map_err(codec_err)?,
                dec: GearV1Decoder::new().map_err(codec_err)?,
            }),
            Which::GearV2(params) => Box::new(GearV2 {
                params,
                enc: gear_v2::Encoder::new(),
                dec: gear_v2::Decoder::new(),
            }),
            Which::Zstd(level) => Box::new(PlainZstd {
                level,
                enc: ZstdCompressor::new().map_err(codec_err)?,
                dec: ZstdDecompressor::new().map_err(codec_err)?,
            }),
        })
    }
}

/// Measures one codec on one layer: whole-layer size, chunk sizes, one-core chunk timings.
fn bench_layer(
    codec: &mut dyn Codec,
    dump: &Dump,
    layer: &[u8],
    chunk_bytes: usize,
    repeat: usize,
) -> Result<CodecStats, CliError> {
    let mut stats = CodecStats::default();
    let mut blob = Vec::new();
    let mut back = vec![0u8; layer.len()];
    codec.encode(layer, &mut blob)?;
    stats.stored_bytes_whole = blob.len() as u64;
    codec.decode(&blob, &mut back)?;
    if back != layer {
        return Err(mismatch("a whole layer", dump));
    }

    let chunks: Vec<&[u8]> = layer.chunks(chunk_bytes).collect();
    let mut blobs: Vec<Vec<u8>> = vec![Vec::new(); chunks.len()];
    stats.compress_time_1core = fastest(repeat, || {
        for (chunk, blob) in chunks.iter().zip(blobs.iter_mut()) {
            codec.encode(std::hint::black_box(chunk), blob)?;
        }
        Ok(())
    })?;
    stats.stored_bytes_chunks = blobs.iter().map(|b| b.len() as u64).sum();
    back.fill(0);
    stats.decompress_time_1core = fastest(repeat, || {
        for (blob, out) in blobs.iter().zip(back.chunks_mut(chunk_bytes)) {
            codec.decode(std::hint::black_box(blob), out)?;
        }
        Ok(())
    })?;
    if back != layer {
        return Err(mismatch("a chunk", dump));
    }
    Ok(stats)
}

/// All-cores timings over every chunk of every layer of `dump`.
fn bench_all_cores(
    which: Which,
    dump: &Dump,
    chunk_bytes: usize,
    repeat: usize,
) -> Result<(Duration, Duration), CliError> {
    let chunks: Vec<&[u8]> = (0..dump.n_layer)
        .flat_map(|l| dump.layer(l).chunks(chunk_bytes))
        .collect();
    let mut blobs: Vec<Vec<u8>> = vec![Vec::new(); chunks.len()];
    let enc = fastest(repeat, || {
        blobs
            .par_iter_mut()
            .zip(chunks.par_iter())
            .map_init(
                || which.make(),
                |codec, (blob, chunk)| match codec {
                    Ok(c) => c.encode(chunk, blob),
                    Err(e) => Err(CliError::input(e.to_string())),
                },
            )
            .collect::<Result<(), CliError>>()
    })?;
    let mut back = vec![0u8; dump.bytes.len()];
    let dec = fastest(repeat, || {
        let mut outs: Vec<&mut [u8]> = Vec::with_capacity(chunks.len());
        let mut rest = back.as_mut_slice();
        for chunk in &chunks {
            let (head, tail) = rest.split_at_mut(chunk.len());
            outs.push(head);
            rest = tail;
        }
        outs.into_par_iter()
            .zip(blobs.par_iter())
            .map_init(
                || which.make(),
                |codec, (out, blob)| match codec {
                    Ok(c) => c.decode(blob, out),
                    Err(e) => Err(CliError::input(e.to_string())),
                },
            )
            .collect::<Result<(), CliError>>()
    })?;
    if back != dump.bytes {
        return Err(mismatch("an all-cores chunk", dump));
    }
    Ok((enc, dec))
}

fn progress(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} layers {msg} [{elapsed}]")
    {
        bar.set_style(style);
    }
    bar
}

fn bench_dump(
    args: &CodecBenchArgs,
    dump: &Dump,
    bar: &ProgressBar,
) -> Result<TensorReport, CliError> {
    let predictors = if dump.tensor == "K" {
        args.k_predictors
    } else {
        args.v_predictors
    };
    let gear = Which::Gear(
        dump.dtype,
        EncodeOptions {
            predictors,
            zstd_level: args.zstd_level,
        },
    );
    let zstd = Which::Zstd(args.zstd_level);
    let channels = u32::try_from(dump.n_kv_head * dump.head_dim)
        .map_err(|_| CliError::input("too many channels for gear-v2"))?;
    let v2 = Which::GearV2(EncodeParams {
        dtype: dump.dtype,
        channels,
        kind: if dump.tensor == "K" {
            TensorKind::K
        } else {
            TensorKind::V
        },
        chunk_tokens: u32::try_from(args.chunk_tokens)
            .map_err(|_| CliError::input("--chunk-tokens too large"))?,
    });
    let mut gear_codec = gear.make()?;
    let mut v2_codec = v2.make()?;
    let mut zstd_codec = zstd.make()?;
    let chunk_bytes = args
        .chunk_tokens
        .checked_mul(dump.token_bytes())
        .ok_or_else(|| CliError::input("--chunk-tokens too large"))?;

    let mut layers = Vec::with_capacity(dump.n_layer);
    let mut total = TotalReport {
        raw_bytes: 0,
        gear_v1: CodecStats::default(),
        gear_v2: CodecStats::default(),
        zstd: CodecStats::default(),
    };
    bar.set_message(format!("{} {}", dump.tensor, dump.dtype));
    for l in 0..dump.n_layer {
        let layer = dump.layer(l);
        let raw = layer.len() as u64;
        let mut g = bench_layer(gear_codec.as_mut(), dump, layer, chunk_bytes, args.repeat)?;
        let mut v = bench_layer(v2_codec.as_mut(), dump, layer, chunk_bytes, args.repeat)?;
        let mut z = bench_layer(zstd_codec.as_mut(), dump, layer, chunk_bytes, args.repeat)?;
        total.raw_bytes += raw;
        total.gear_v1.add(&g);
        total.gear_v2.add(&v);
        total.zstd.add(&z);
        g.finish(raw);
        v.finish(raw);
        z.finish(raw);
        layers.push(LayerReport {
            layer: l,
            raw_bytes: raw,
            gear_v1: g,
            gear_v2: v,
            zstd: z,
        });
        bar.inc(1);
    }
    total.gear_v1.finish(total.raw_bytes);
    total.gear_v2.finish(total.raw_bytes);
    total.zstd.finish(total.raw_bytes);
    for (stats, which) in [
        (&mut total.gear_v1, gear),
        (&mut total.gear_v2, v2),
        (&mut total.zstd, zstd),
    ] {
        let (enc, dec) = bench_all_cores(which, dump, chunk_bytes, args.repeat)?;
        stats.compress_mb_s_all_cores = Some(mb_s(total.raw_bytes, enc));
        stats.decompress_mb_s_all_cores = Some(mb_s(total.raw_bytes, dec));
    }
    Ok(TensorReport {
        tensor: dump.tensor.clone(),
        dtype: dump.dtype.name().to_string(),
        shape: [dump.n_layer, dump.n_tokens, dump.n_kv_head, dump.head_dim],
        predictors: predictors.to_string(),
        layers,
        total,
    })
}

fn print_tensor(t: &TensorReport, chunk_tokens: usize) {
    println!(
        "\n{} {}  shape {:?}  gear-v1 predictors {}",
        t.tensor, t.dtype, t.shape, t.predictors
    );
    let names = ["gear-v1", "gear-v2", "zstd"];
    let mut head1 = format!("{:>6}", "layer");
    let mut head2 = format!("{:>6}", "");
    for n in names {
        head1 += &format!(" | {:>8} {:>8} {:>9} {:>9}", n, n, "enc", "dec");
        head2 += &format!(
            " | {:>8} {:>8} {:>9} {:>9}",
            "whole",
            format!("{chunk_tokens}t"),
            "MB/s 1c",
            "MB/s 1c"
        );
    }
    println!("{head1}");
    println!("{head2}");
    let row = |name: String, stats: [&CodecStats; 3]| {
        let mut line = format!("{name:>6}");
        for s in stats {
            line += &format!(
                " | {:>8.3} {:>8.3} {:>9.0} {:>9.0}",
                s.ratio_whole, s.ratio_chunks, s.compress_mb_s_1core, s.decompress_mb_s_1core
            );
        }
        println!("{line}");
    };
    for l in &t.layers {
        row(l.layer.to_string(), [&l.gear_v1, &l.gear_v2, &l.zstd]);
    }
    let tot = &t.total;
    row("total".to_string(), [&tot.gear_v1, &tot.gear_v2, &tot.zstd]);
    let mut line = format!("{:>6} | all cores MB/s:", "");
    for (n, s) in names.iter().zip([&tot.gear_v1, &tot.gear_v2, &tot.zstd]) {
        line += &format!(
            " {n} enc {:.0} dec {:.0};",
            s.compress_mb_s_all_cores.unwrap_or(0.0),
            s.decompress_mb_s_all_cores.unwrap_or(0.0)
        );
    }
    println!("{}", line.trim_end_matches(';'));
}

/// The K+V numbers of one codec on one dtype, the whole model: what the summary screen of
/// plain `kvc bench` shows.
#[derive(Serialize, Clone)]
pub struct LosslessSummary {
    /// Element type.
    pub dtype: String,
    /// `gear-v2`, `gear-v1` or `zstd-<level>`.
    pub codec: String,
    /// K and V raw bytes.
    pub raw_bytes: u64,
    /// Raw / stored bytes, whole-layer blobs.
    pub ratio_whole: f64,
    /// Raw / stored bytes, independent `--chunk-tokens` chunks.
    pub ratio_chunks: f64,
    /// Compress MB/s of raw bytes over the chunks, one core.
    pub compress_mb_s_1core: f64,
    /// Decompress MB/s of raw bytes over the chunks, one core.
    pub decompress_mb_s_1core: f64,
}

/// What the codec bench measured.
pub struct Measured {
    report: BenchReport,
    /// Per dtype (in [`Dtype::ALL`] order), gear-v2, gear-v1 and zstd on K and V together.
    pub lossless: Vec<LosslessSummary>,
}

impl Measured {
    /// Writes the JSON of `kvc bench codec` to `path`, with `summary` under its own key when
    /// given (plain `kvc bench`).
    pub fn write_json(
        &mut self,
        path: &std::path::Path,
        summary: Option<serde_json::Value>,
    ) -> Result<(), CliError> {
        self.report.summary = summary;
        let json = serde_json::to_string_pretty(&self.report)
            .map_err(|e| CliError::input(format!("JSON: {e}")))?;
        std::fs::write(path, json + "\n").map_err(|e| CliError::io(path, e))
    }
}

/// Checks the arguments and loads the dataset they name (`--data`, or the embedded sample).
pub fn load(args: &CodecBenchArgs) -> Result<Dataset, CliError> {
    if args.chunk_tokens == 0 {
        return Err(CliError::input("--chunk-tokens must be at least 1"));
    }
    if args.repeat == 0 {
        return Err(CliError::input("--repeat must be at least 1"));
    }
    kvc_codec::zstd::check_level(args.zstd_level).map_err(codec_err)?;
    match &args.data {
        Some(dir) => dataset::load_dir(dir),
        None => dataset::embedded(),
    }
}

/// The arguments' JSON path (`--json`).
pub fn json_path(args: &CodecBenchArgs) -> Option<&std::path::Path> {
    args.json.as_deref()
}

/// The arguments' `--chunk-tokens`, `--repeat` and `--zstd-level`.
pub fn settings(args: &CodecBenchArgs) -> (usize, usize, i32) {
    (args.chunk_tokens, args.repeat, args.zstd_level)
}

/// Runs every codec on every dump of `data`; with `print_tables`, prints each tensor's
/// table and the K+V lines as `kvc bench codec` does.
pub fn measure(
    args: &CodecBenchArgs,
    data: &Dataset,
    print_tables: bool,
) -> Result<Measured, CliError> {
    let threads = rayon::current_num_threads();
    let bar = progress(data.dumps.iter().map(|d| d.n_layer as u64).sum());
    let mut tensors = Vec::new();
    for dump in &data.dumps {
        let t = bench_dump(args, dump, &bar)?;
        if print_tables {
            bar.suspend(|| print_tensor(&t, args.chunk_tokens));
        }
        tensors.push(t);
    }
    bar.finish_and_clear();

    let mut k_and_v = Vec::new();
    let mut lossless = Vec::new();
    for dtype in Dtype::ALL {
        let group: Vec<&TensorReport> =
            tensors.iter().filter(|t| t.dtype == dtype.name()).collect();
        if group.is_empty() {
            continue;
        }
        let raw: u64 = group.iter().map(|t| t.total.raw_bytes).sum();
        let sum =
            |f: &dyn Fn(&TotalReport) -> u64| group.iter().map(|t| f(&t.total)).sum::<u64>() as f64;
        let s = DtypeSummary {
            dtype: dtype.name().to_string(),
            raw_bytes: raw,
            gear_v1_ratio_chunks: raw as f64 / sum(&|t| t.gear_v1.stored_bytes_chunks),
            gear_v1_ratio_whole: raw as f64 / sum(&|t| t.gear_v1.stored_bytes_whole),
            gear_v2_ratio_chunks: raw as f64 / sum(&|t| t.gear_v2.stored_bytes_chunks),
            gear_v2_ratio_whole: raw as f64 / sum(&|t| t.gear_v2.stored_bytes_whole),
            zstd_ratio_chunks: raw as f64 / sum(&|t| t.zstd.stored_bytes_chunks),
            zstd_ratio_whole: raw as f64 / sum(&|t| t.zstd.stored_bytes_whole),
        };
        if print_tables {
            println!(
                "\n{} K+V: gear-v1 {:.3} ({}t chunks) {:.3} (whole layers) | gear-v2 {:.3} / {:.3} \
                 | zstd {:.3} / {:.3}",
                s.dtype,
                s.gear_v1_ratio_chunks,
                args.chunk_tokens,
                s.gear_v1_ratio_whole,
                s.gear_v2_ratio_chunks,
                s.gear_v2_ratio_whole,
                s.zstd_ratio_chunks,
                s.zstd_ratio_whole
            );
        }
        for (i, name) in [
            "gear-v2".to_string(),
            "gear-v1".to_string(),
            format!("zstd-{}", args.zstd_level),
        ]
        .into_iter()
        .enumerate()
        {
            let mut c = CodecStats::default();
            for t in &group {
                c.add([&t.total.gear_v2, &t.total.gear_v1, &t.total.zstd][i]);
            }
            c.finish(raw);
            lossless.push(LosslessSummary {
                dtype: dtype.name().to_string(),
                codec: name,
                raw_bytes: raw,
                ratio_whole: c.ratio_whole,
                ratio_chunks: c.ratio_chunks,
                compress_mb_s_1core: c.compress_mb_s_1core,
                decompress_mb_s_1core: c.decompress_mb_s_1core,
            });
        }
        k_and_v.push(s);
    }
    Ok(Measured {
        report: BenchReport {
            bench: "codec",
            source: data.source.clone(),
            chunk_tokens: args.chunk_tokens,
            repeat: args.repeat,
            threads,
            zstd_level: args.zstd_level,
            tensors,
            k_and_v,
            summary: None,
        },
        lossless,
    })
}

/// Runs the codec bench (`kvc bench codec`).
pub fn run(args: CodecBenchArgs) -> Result<(), CliError> {
    let data = load(&args)?;
    println!(
        "kvc bench codec: gear-v1 and gear-v2 vs plain zstd-{} on {}; ratio = raw / stored bytes \
         (headers included); MB/s of raw bytes, fastest of {} runs; {} threads for all cores",
        args.zstd_level,
        data.source,
        args.repeat,
        rayon::current_num_threads()
    );
    let mut m = measure(&args, &data, true)?;
    if let Some(path) = &args.json {
        m.write_json(path, None)?;
    }
    Ok(())
}
