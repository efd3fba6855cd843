//! `kvc int8 calibrate | apply | dequant`: int8 C8 quantization of raw KV caches laid out
//! `[layer][token][kv_head][head_dim]`, with msmodelslim checkpoints. `kvc kvq apply |
//! dequant` do the same with kvq packed cache files ([`super::kvq_apply`]), `kvc kvq
//! inspect` shows a kvq plan or config, `kvc kvq plan` makes a plan from a calibration
//! dump. `kvc quant ...` is the old spelling of both (`quant apply --kvq`, `quant plan`,
//! ...), kept because scripts use it; all three run the same code.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use kvc_cache::{Addressing, TensorLayout};
use kvc_int8::msmodelslim::{read_checkpoint, write_checkpoint};
use kvc_int8::ErrorKind;
use kvc_int8::{dequantize, quant_error, quantize, C8Params, ChannelStats, ErrorStats, LayerQuant};
use kvc_types::{Dtype, FloatDtype};

use crate::cli_error::CliError;

/// `kvc int8` arguments.
#[derive(Args)]
pub struct Int8Args {
    #[command(subcommand)]
    cmd: Int8Cmd,
}

#[derive(Subcommand)]
enum Int8Cmd {
    /// Calibrate per-channel scales / offsets from raw K and V caches and write an
    /// msmodelslim checkpoint (quant_model_description.json + quant_model_weight.safetensors).
    Calibrate(CalibrateArgs),
    /// Quantize raw K and V caches to int8 with an msmodelslim C8 checkpoint.
    Apply(Int8ApplyArgs),
    /// Dequantize int8 K and V caches back to --dtype with an msmodelslim C8 checkpoint.
    Dequant(Int8DequantArgs),
}

#[derive(Args)]
struct Int8ApplyArgs {
    /// msmodelslim checkpoint directory.
    #[arg(long)]
    scales: PathBuf,
    #[command(flatten)]
    shape: Shape,
    /// Raw K cache.
    #[arg(long)]
    k: PathBuf,
    /// Raw V cache.
    #[arg(long)]
    v: PathBuf,
    /// int8 K output.
    #[arg(long = "out-k")]
    out_k: PathBuf,
    /// int8 V output.
    #[arg(long = "out-v")]
    out_v: PathBuf,
}

#[derive(Args)]
struct Int8DequantArgs {
    /// msmodelslim checkpoint directory.
    #[arg(long)]
    scales: PathBuf,
    #[command(flatten)]
    shape: Shape,
    /// int8 K cache.
    #[arg(long)]
    k: PathBuf,
    /// int8 V cache.
    #[arg(long)]
    v: PathBuf,
    /// K output in --dtype.
    #[arg(long = "out-k")]
    out_k: PathBuf,
    /// V output in --dtype.
    #[arg(long = "out-v")]
    out_v: PathBuf,
}

/// `kvc kvq` arguments.
#[derive(Args)]
pub struct KvqArgs {
    #[command(subcommand)]
    cmd: KvqCmd,
}

#[derive(Subcommand)]
enum KvqCmd {
    /// Code raw K and V caches into kvq packed cache files with a config string or plan.
    Apply(KvqApplyArgs),
    /// Decode kvq packed cache files back to raw caches (the shape is in their headers).
    Dequant(KvqDequantArgs),
    /// Per-layer K/V bits for a budget ratio, calibrated on a K/V/Q dump of the model
    /// (the llama.cpp client's `--modes dump`); prints the table, writes the plan JSON.
    Plan(super::kvq_plan::PlanArgs),
    /// Show a plan (JSON file) or config string: bits, bytes per row, ratio.
    Inspect(super::kvq_inspect::InspectArgs),
}

#[derive(Args)]
struct KvqApplyArgs {
    /// A config string (`k4v4`, `k4v2:u32`) or a plan JSON file (`data/kvq-plans/`);
    /// writes packed cache files (docs/formats/kvq.md).
    #[arg(long, visible_alias = "kvq")]
    spec: String,
    /// Code K per channel over groups of G tokens (16, 32, 64, 128, 256; K bits from the
    /// config or plan); a last partial group is stored as f16 rows.
    #[arg(long = "k-channel-group", value_name = "G")]
    k_channel_group: Option<usize>,
    /// Write the per-layer table and the file totals as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    shape: Shape,
    /// Raw K cache.
    #[arg(long)]
    k: PathBuf,
    /// Raw V cache.
    #[arg(long)]
    v: PathBuf,
    /// Packed K output.
    #[arg(long = "out-k")]
    out_k: PathBuf,
    /// Packed V output.
    #[arg(long = "out-v")]
    out_v: PathBuf,
}

#[derive(Args)]
struct KvqDequantArgs {
    /// Element type of the written caches.
    #[arg(long, value_parser = super::codec::float_dtype())]
    dtype: Dtype,
    /// Layers (checked against the headers when given).
    #[arg(long)]
    layers: Option<usize>,
    /// KV heads (checked against the headers when given).
    #[arg(long = "kv-heads")]
    kv_heads: Option<usize>,
    /// Elements per head (checked against the headers when given).
    #[arg(long = "head-dim")]
    head_dim: Option<usize>,
    /// Packed K cache file.
    #[arg(long)]
    k: PathBuf,
    /// Packed V cache file.
    #[arg(long)]
    v: PathBuf,
    /// K output in --dtype.
    #[arg(long = "out-k")]
    out_k: PathBuf,
    /// V output in --dtype.
    #[arg(long = "out-v")]
    out_v: PathBuf,
}

/// `kvc quant` arguments (the old spelling of `kvc int8` and `kvc kvq`).
#[derive(Args)]
pub struct QuantArgs {
    #[command(subcommand)]
    cmd: QuantCmd,
}

#[derive(Subcommand)]
enum QuantCmd {
    /// `kvc int8 calibrate`: calibrate per-channel scales / offsets from raw K and V caches and write an
    /// msmodelslim checkpoint (quant_model_description.json + quant_model_weight.safetensors).
    Calibrate(CalibrateArgs),
    /// `kvc int8 apply` (--scales) or `kvc kvq apply` (--kvq): quantize raw K and V caches
    /// to int8 with an msmodelslim C8 checkpoint, or to kvq packed cache files.
    Apply(ApplyArgs),
    /// `kvc int8 dequant` (--scales) or `kvc kvq dequant` (--kvq): int8 caches or kvq
    /// packed cache files back to --dtype.
    Dequant(DequantArgs),
    /// `kvc kvq inspect`: show a kvq plan (JSON file) or config string.
    Inspect(super::kvq_inspect::InspectArgs),
    /// `kvc kvq plan`: a calibrated kvq plan from a K/V/Q dump of the model.
    Plan(super::kvq_plan::PlanArgs),
}

/// The kvq file writer's element type of a float cache (`--dtype` only parses floats).
fn elem(dtype: Dtype) -> Result<FloatDtype, CliError> {
    dtype
        .float()
        .ok_or_else(|| CliError::input(format!("--dtype {dtype}: the caches are f16, bf16 or f32")))
}

#[derive(Args)]
struct Shape {
    /// Element type of the float caches.
    #[arg(long, value_parser = super::codec::float_dtype())]
    dtype: Dtype,
    /// Layers in each file.
    #[arg(long)]
    layers: usize,
    /// KV heads.
    #[arg(long = "kv-heads")]
    kv_heads: usize,
    /// Elements per head.
    #[arg(long = "head-dim")]
    head_dim: usize,
}

#[derive(Args)]
struct CalibrateArgs {
    #[command(flatten)]
    shape: Shape,
    /// Symmetric (offset 0, msmodelslim int8_per_channel_sym) instead of asymmetric.
    #[arg(long)]
    symmetric: bool,
    /// Raw K cache.
    #[arg(long)]
    k: PathBuf,
    /// Raw V cache.
    #[arg(long)]
    v: PathBuf,
    /// Output checkpoint directory.
    #[arg(long)]
    out: PathBuf,
    /// Element type of the written scales and offsets.
    #[arg(long = "scale-dtype", value_parser = super::codec::float_dtype(), default_value = "f32")]
    scale_dtype: Dtype,
}

#[derive(Args)]
struct ApplyArgs {
    /// msmodelslim checkpoint directory (int8 C8).
    #[arg(long, required_unless_present = "kvq", conflicts_with = "kvq")]
    scales: Option<PathBuf>,
    /// kvq instead of C8: a config string (`k4v4`, `k4v2:u32`) or a plan JSON file
    /// (`data/kvq-plans/`); writes packed cache files (docs/formats/kvq.md).
    #[arg(long)]
    kvq: Option<String>,
    /// With --kvq: code K per channel over groups of G tokens (16, 32, 64, 128, 256; K
    /// bits from the config or plan); a last partial group is stored as f16 rows.
    #[arg(long = "k-channel-group", value_name = "G", requires = "kvq")]
    k_channel_group: Option<usize>,
    /// With --kvq: write the per-layer table and the file totals as JSON.
    #[arg(long, requires = "kvq")]
    json: Option<PathBuf>,
    #[command(flatten)]
    shape: Shape,
    /// Raw K cache.
    #[arg(long)]
    k: PathBuf,
    /// Raw V cache.
    #[arg(long)]
    v: PathBuf,
    /// int8 (or kvq packed) K output.
    #[arg(long = "out-k")]
    out_k: PathBuf,
    /// int8 (or kvq packed) V output.
    #[arg(long = "out-v")]
    out_v: PathBuf,
}

#[derive(Args)]
struct DequantArgs {
    /// msmodelslim checkpoint directory (int8 C8).
    #[arg(long, required_unless_present = "kvq", conflicts_with = "kvq")]
    scales: Option<PathBuf>,
    /// --k and --v are kvq packed cache files (from `apply --kvq`): config, plan and shape
    /// come from their headers (--layers, --kv-heads, --head-dim, when given, are checked).
    #[arg(long)]
    kvq: bool,
    /// Element type of the written caches.
    #[arg(long, value_parser = super::codec::float_dtype())]
    dtype: Dtype,
    /// Layers in each file.
    #[arg(long, required_unless_present = "kvq")]
    layers: Option<usize>,
    /// KV heads.
    #[arg(long = "kv-heads", required_unless_present = "kvq")]
    kv_heads: Option<usize>,
    /// Elements per head.
    #[arg(long = "head-dim", required_unless_present = "kvq")]
    head_dim: Option<usize>,
    /// int8 (or kvq packed) K cache.
    #[arg(long)]
    k: PathBuf,
    /// int8 (or kvq packed) V cache.
    #[arg(long)]
    v: PathBuf,
    /// K output in --dtype.
    #[arg(long = "out-k")]
    out_k: PathBuf,
    /// V output in --dtype.
    #[arg(long = "out-v")]
    out_v: PathBuf,
}

/// A C8 error (or a layout error on the way there) as the command reports it.
fn lib_err(e: impl Into<kvc_int8::Error>) -> CliError {
    let e = e.into();
    match e.kind() {
        ErrorKind::Io => CliError::Io(e.to_string()),
        _ => CliError::input(e),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::io(path, e))
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    std::fs::write(path, bytes).map_err(|e| CliError::io(path, e))
}

/// The per-layer layout of a raw file of `len` bytes: `(layout, tokens)`.
fn layer_layout(
    shape: &Shape,
    dtype: Dtype,
    len: usize,
    path: &Path,
) -> Result<TensorLayout, CliError> {
    let bad = |m: String| CliError::input(format!("{}: {m}", path.display()));
    if shape.layers == 0 || shape.kv_heads == 0 || shape.head_dim == 0 {
        return Err(bad(
            "--layers, --kv-heads and --head-dim must be at least 1".into(),
        ));
    }
    let per_token = shape
        .layers
        .checked_mul(shape.kv_heads)
        .and_then(|x| x.checked_mul(shape.head_dim))
        .and_then(|x| x.checked_mul(dtype.size()))
        .ok_or_else(|| bad("shape overflows".into()))?;
    if len == 0 || !len.is_multiple_of(per_token) {
        return Err(bad(format!(
            "{len} bytes is not a whole number of tokens of {} layers x {} heads x {} dims x {} bytes",
            shape.layers,
            shape.kv_heads,
            shape.head_dim,
            dtype.size()
        )));
    }
    TensorLayout::new(
        Addressing::CellRows,
        dtype,
        shape.kv_heads,
        shape.head_dim,
        len / per_token,
    )
    .map_err(lib_err)
}

fn check_params(p: &C8Params, layers: usize, channels: usize) -> Result<(), CliError> {
    for i in 0..layers {
        let l = p.require(i).map_err(lib_err)?;
        if l.k.channels() != channels || l.v.channels() != channels {
            return Err(CliError::input(format!(
                "checkpoint layer {i} has {} K / {} V channels, the cache has {channels} (kv-heads x head-dim)",
                l.k.channels(),
                l.v.channels()
            )));
        }
    }
    Ok(())
}

/// Runs `kvc int8`.
pub fn run_int8(args: Int8Args) -> Result<(), CliError> {
    match args.cmd {
        Int8Cmd::Calibrate(a) => calibrate(a),
        Int8Cmd::Apply(a) => apply(ApplyArgs {
            scales: Some(a.scales),
            kvq: None,
            k_channel_group: None,
            json: None,
            shape: a.shape,
            k: a.k,
            v: a.v,
            out_k: a.out_k,
            out_v: a.out_v,
        }),
        Int8Cmd::Dequant(a) => dequant(DequantArgs {
            scales: Some(a.scales),
            kvq: false,
            dtype: a.shape.dtype,
            layers: Some(a.shape.layers),
            kv_heads: Some(a.shape.kv_heads),
            head_dim: Some(a.shape.head_dim),
            k: a.k,
            v: a.v,
            out_k: a.out_k,
            out_v: a.out_v,
        }),
    }
}

/// Runs `kvc kvq`.
pub fn run_kvq(args: KvqArgs) -> Result<(), CliError> {
    match args.cmd {
        KvqCmd::Apply(a) => apply(ApplyArgs {
            scales: None,
            kvq: Some(a.spec),
            k_channel_group: a.k_channel_group,
            json: a.json,
            shape: a.shape,
            k: a.k,
            v: a.v,
            out_k: a.out_k,
            out_v: a.out_v,
        }),
        KvqCmd::Dequant(a) => dequant(DequantArgs {
            scales: None,
            kvq: true,
            dtype: a.dtype,
            layers: a.layers,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            k: a.k,
            v: a.v,
            out_k: a.out_k,
            out_v: a.out_v,
        }),
        KvqCmd::Plan(a) => super::kvq_plan::run(a),
        KvqCmd::Inspect(a) => super::kvq_inspect::run(a),
    }
}

/// Runs `kvc quant` (the old spelling).
pub fn run(args: QuantArgs) -> Result<(), CliError> {
    match args.cmd {
        QuantCmd::Calibrate(a) => calibrate(a),
        QuantCmd::Apply(a) => apply(a),
        QuantCmd::Dequant(a) => dequant(a),
        QuantCmd::Inspect(a) => super::kvq_inspect::run(a),
        QuantCmd::Plan(a) => super::kvq_plan::run(a),
    }
}

fn calibrate(a: CalibrateArgs) -> Result<(), CliError> {
    let dt = a.shape.dtype;
    let (k, v) = (read(&a.k)?, read(&a.v)?);
    let lk = layer_layout(&a.shape, dt, k.len(), &a.k)?;
    let lv = layer_layout(&a.shape, dt, v.len(), &a.v)?;
    let mut params = C8Params::new();
    for i in 0..a.shape.layers {
        let mut q = Vec::new();
        for (buf, l) in [(&k, &lk), (&v, &lv)] {
            let n = l.byte_len();
            let mut st = ChannelStats::new(l.channels());
            st.observe(&buf[i * n..(i + 1) * n], l, 0..l.capacity())
                .map_err(lib_err)?;
            q.push(st.finish(a.symmetric).map_err(lib_err)?);
        }
        let v = q.pop().ok_or_else(|| CliError::input("internal: no V"))?;
        let k = q.pop().ok_or_else(|| CliError::input("internal: no K"))?;
        params.insert(i, LayerQuant { k, v }).map_err(lib_err)?;
    }
    let sd = a.scale_dtype.float().ok_or_else(|| {
        CliError::input(format!(
            "--scale-dtype {}: scales are f16, bf16 or f32",
            a.scale_dtype
        ))
    })?;
    write_checkpoint(&a.out, &params, sd).map_err(lib_err)?;
    println!(
        "calibrated {} layers ({}, {} tokens K, {} tokens V) -> {}",
        a.shape.layers,
        if a.symmetric {
            "symmetric"
        } else {
            "asymmetric"
        },
        lk.capacity(),
        lv.capacity(),
        a.out.display()
    );
    Ok(())
}

fn apply(a: ApplyArgs) -> Result<(), CliError> {
    let scales = match (&a.kvq, &a.scales) {
        (Some(spec), _) => {
            return super::kvq_apply::apply(super::kvq_apply::ApplyJob {
                spec,
                shape: super::kvq_apply::CacheShape {
                    elem: elem(a.shape.dtype)?,
                    layers: a.shape.layers,
                    kv_heads: a.shape.kv_heads,
                    head_dim: a.shape.head_dim,
                },
                k_channel_group: a.k_channel_group,
                k: &a.k,
                v: &a.v,
                out_k: &a.out_k,
                out_v: &a.out_v,
                json: a.json.as_deref(),
            })
        }
        (None, Some(s)) => s,
        (None, None) => return Err(CliError::input("give --scales DIR (C8) or --kvq SPEC")),
    };
    let dt = a.shape.dtype;
    let params = read_checkpoint(scales).map_err(lib_err)?;
    let (k, v) = (read(&a.k)?, read(&a.v)?);
    let lk = layer_layout(&a.shape, dt, k.len(), &a.k)?;
    let lv = layer_layout(&a.shape, dt, v.len(), &a.v)?;
    check_params(&params, a.shape.layers, lk.channels())?;
    let (ik, iv) = (
        lk.with_dtype(Dtype::I8).map_err(lib_err)?,
        lv.with_dtype(Dtype::I8).map_err(lib_err)?,
    );
    let mut out_k = vec![0u8; ik.byte_len() * a.shape.layers];
    let mut out_v = vec![0u8; iv.byte_len() * a.shape.layers];
    println!("layer  K max_abs   K rms       K SNR dB  V max_abs   V rms       V SNR dB");
    let (mut tk, mut tv) = (ErrorStats::default(), ErrorStats::default());
    for i in 0..a.shape.layers {
        let p = params.require(i).map_err(lib_err)?;
        let mut row = Vec::new();
        for (src, l, il, out, q, tot) in [
            (&k, &lk, &ik, &mut out_k, &p.k, &mut tk),
            (&v, &lv, &iv, &mut out_v, &p.v, &mut tv),
        ] {
            let (n, m) = (l.byte_len(), il.byte_len());
            let s = &src[i * n..(i + 1) * n];
            quantize(s, l, &mut out[i * m..(i + 1) * m], il, 0..l.capacity(), q)
                .map_err(lib_err)?;
            let st = quant_error(s, l, 0..l.capacity(), q).map_err(lib_err)?;
            tot.merge(&st);
            row.push(st);
        }
        println!(
            "{i:<5}  {:<10.4e} {:<10.4e} {:>8.2}  {:<10.4e} {:<10.4e} {:>8.2}",
            row[0].max_abs,
            row[0].rms(),
            row[0].snr_db(),
            row[1].max_abs,
            row[1].rms(),
            row[1].snr_db()
        );
    }
    println!(
        "all    {:<10.4e} {:<10.4e} {:>8.2}  {:<10.4e} {:<10.4e} {:>8.2}",
        tk.max_abs,
        tk.rms(),
        tk.snr_db(),
        tv.max_abs,
        tv.rms(),
        tv.snr_db()
    );
    write(&a.out_k, &out_k)?;
    write(&a.out_v, &out_v)
}

fn dequant(a: DequantArgs) -> Result<(), CliError> {
    if a.kvq {
        return super::kvq_apply::dequant(super::kvq_apply::DequantJob {
            elem: elem(a.dtype)?,
            layers: a.layers,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            k: &a.k,
            v: &a.v,
            out_k: &a.out_k,
            out_v: &a.out_v,
        });
    }
    let (Some(scales), Some(layers), Some(kv_heads), Some(head_dim)) =
        (&a.scales, a.layers, a.kv_heads, a.head_dim)
    else {
        return Err(CliError::input(
            "C8 dequant needs --scales, --layers, --kv-heads and --head-dim",
        ));
    };
    let shape = Shape {
        dtype: a.dtype,
        layers,
        kv_heads,
        head_dim,
    };
    let dt = shape.dtype;
    let params = read_checkpoint(scales).map_err(lib_err)?;
    let (k, v) = (read(&a.k)?, read(&a.v)?);
    let ik = layer_layout(&shape, Dtype::I8, k.len(), &a.k)?;
    let iv = layer_layout(&shape, Dtype::I8, v.len(), &a.v)?;
    check_params(&params, shape.layers, ik.channels())?;
    let (lk, lv) = (
        ik.with_dtype(dt).map_err(lib_err)?,
        iv.with_dtype(dt).map_err(lib_err)?,
    );
    let mut out_k = vec![0u8; lk.byte_len() * shape.layers];
    let mut out_v = vec![0u8; lv.byte_len() * shape.layers];
    for i in 0..shape.layers {
        let p = params.require(i).map_err(lib_err)?;
        for (src, il, l, out, q) in [
            (&k, &ik, &lk, &mut out_k, &p.k),
            (&v, &iv, &lv, &mut out_v, &p.v),
        ] {
            let (n, m) = (il.byte_len(), l.byte_len());
            dequantize(
                &src[i * n..(i + 1) * n],
                il,
                &mut out[i * m..(i + 1) * m],
                l,
                0..il.capacity(),
                q,
            )
            .map_err(lib_err)?;
        }
    }
    write(&a.out_k, &out_k)?;
    write(&a.out_v, &out_v)?;
    println!("dequantized {} layers to {dt}", shape.layers);
    Ok(())
}
