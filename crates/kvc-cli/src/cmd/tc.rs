//! `kvc tc`: the transform coder of the shared tiers. `calibrate` makes a calibration file
//! from a dump of the model's own K, V and Q (the llama.cpp client's `--modes dump`, on a
//! text that is not evaluated); `inspect` prints one. The algorithm and the file format are
//! `kvc_transform_coder`'s; this file reads the dump and prints.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use kvc_transform_coder::{
    calibrate, layer_probe, parse_name, Calibration, Dump, Options, Rope, RopeKind,
};

use crate::cli_error::CliError;
use crate::cmd::dump::KvqDump;

/// `kvc tc` arguments.
#[derive(Args)]
pub struct TcArgs {
    #[command(subcommand)]
    command: TcCommand,
}

#[derive(Subcommand)]
enum TcCommand {
    /// Make a calibration file (`.kvctc`) from a K/V/Q dump.
    Calibrate(CalibrateArgs),
    /// Print a calibration file: layout, RoPE, targets and what they cost.
    Inspect(InspectArgs),
    /// Write a layer probe: one target, `tc-1`, coding one layer at a target of a
    /// calibration and every other layer almost exactly (what the engine decodes to measure
    /// the layer's weight for `calibrate --layer-weights`).
    Probe(ProbeArgs),
}

/// `kvc tc calibrate` arguments.
#[derive(Args)]
struct CalibrateArgs {
    /// Dump directory with `<tag>.{K,V,Q}.f32.bin` and their `.json` sidecars.
    #[arg(long)]
    dump: PathBuf,
    /// File tag of the dump.
    #[arg(long = "text-tag", default_value = "textA")]
    text_tag: String,
    /// Attention-output error bounds (`Σ‖o′−o‖²/Σ‖o‖²` per layer), one target `tc-<bound>`
    /// each, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.002,0.004,0.008,0.016,0.032"
    )]
    bounds: Vec<f32>,
    /// Positions stored raw (the attention sink).
    #[arg(long, default_value_t = 4)]
    sink: usize,
    /// The model's RoPE pairing: norm (llama family), neox (qwen2, phi3, gemma, ...) or
    /// none; default: the dump sidecar's `rope.type`.
    #[arg(long = "rope-type")]
    rope_type: Option<String>,
    /// RoPE frequency base; default: the dump sidecar's `rope.freq_base`.
    #[arg(long = "rope-base")]
    rope_base: Option<f64>,
    /// RoPE frequency scale; default: the sidecar's `rope.freq_scale`, else 1.
    #[arg(long = "rope-scale")]
    rope_scale: Option<f64>,
    /// Channels RoPE rotates; default: the sidecar's `rope.n_rot`, else head_dim.
    #[arg(long = "rope-dims")]
    rope_dims: Option<usize>,
    /// First sampled query position.
    #[arg(long = "query-from", default_value_t = 64)]
    query_from: usize,
    /// Sample every n-th query position.
    #[arg(long = "query-stride", default_value_t = 16)]
    query_stride: usize,
    /// Write the calibration here.
    #[arg(long)]
    out: PathBuf,
    /// Write what each target reached on each layer (error, K and V bits) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Weigh each layer's error in the bounds by its measured sensitivity: a JSON file
    /// with `"weights": [one positive number per layer]`
    /// (`integrations/llama/tc-sensitivity.py` writes it). Default: every layer 1.
    #[arg(long = "layer-weights")]
    layer_weights: Option<PathBuf>,
}

/// `kvc tc probe` arguments.
#[derive(Args)]
struct ProbeArgs {
    /// The calibration the probe is made from.
    calibration: PathBuf,
    /// The layer coded at `--target`; `base` for none (the probes' baseline).
    #[arg(long)]
    layer: String,
    /// The target whose steps the layer gets, e.g. `tc-0.128`.
    #[arg(long)]
    target: String,
    /// Write the probe calibration here.
    #[arg(long)]
    out: PathBuf,
}

/// `kvc tc inspect` arguments.
#[derive(Args)]
struct InspectArgs {
    /// A calibration file.
    file: PathBuf,
}

/// Runs `kvc tc`.
pub fn run(a: TcArgs) -> Result<(), CliError> {
    match a.command {
        TcCommand::Calibrate(c) => run_calibrate(c),
        TcCommand::Inspect(i) => run_inspect(i),
        TcCommand::Probe(p) => run_probe(p),
    }
}

/// The RoPE the dump's K sidecar records (`"rope": {"type", "freq_base", "freq_scale",
/// "n_rot"}`), overridden by flags.
fn rope_of(a: &CalibrateArgs, head_dim: usize) -> Result<Rope, CliError> {
    let side = a.dump.join(format!("{}.K.f32.json", a.text_tag));
    let j: serde_json::Value = std::fs::read_to_string(&side)
        .map_err(|e| CliError::io(&side, e))
        .and_then(|t| {
            serde_json::from_str(&t)
                .map_err(|e| CliError::input(format!("{}: {e}", side.display())))
        })?;
    let r = &j["rope"];
    let kind = match a.rope_type.as_deref().or(r["type"].as_str()) {
        Some(s) => RopeKind::from_name(s).ok_or_else(|| {
            CliError::input(format!("RoPE type {s:?}: expected norm, neox or none"))
        })?,
        None => {
            return Err(CliError::input(format!(
                "{} records no \"rope\" (a dump made before it did): re-dump, or give \
                 --rope-type and --rope-base from the model's metadata",
                side.display()
            )))
        }
    };
    if kind == RopeKind::None {
        return Ok(Rope::none(head_dim));
    }
    let base = a
        .rope_base
        .or(r["freq_base"].as_f64().filter(|&b| b > 0.0))
        .ok_or_else(|| {
            CliError::input("the dump records no RoPE frequency base: give --rope-base")
        })?;
    let scale = a.rope_scale.or(r["freq_scale"].as_f64()).unwrap_or(1.0);
    let n_rot = a
        .rope_dims
        .or(r["n_rot"]
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .filter(|&x| x > 0))
        .unwrap_or(head_dim);
    Rope::from_base(kind, head_dim, n_rot, base, scale).map_err(CliError::input)
}

fn run_calibrate(a: CalibrateArgs) -> Result<(), CliError> {
    let layer_weights = match &a.layer_weights {
        Some(path) => read_weights(path)?,
        None => Vec::new(),
    };
    let d = KvqDump::read(&a.dump, &a.text_tag)?;
    let (k, v, q) = (&d.k, &d.v, &d.q);
    let [n_layer, n_tokens, n_kv_head, head_dim] = k.shape;
    let n_head = q.shape[2];
    let rope = rope_of(&a, head_dim)?;
    let dump = Dump {
        n_layer,
        n_tokens,
        n_kv_head,
        n_head,
        head_dim,
        k: &k.data,
        v: &v.data,
        q: &q.data,
    };
    let opts = Options {
        rope,
        n_sink: a.sink,
        bounds: a.bounds.clone(),
        query_from: a.query_from,
        query_stride: a.query_stride,
        layer_weights: layer_weights.clone(),
    };
    let t0 = std::time::Instant::now();
    let (cal, report) = calibrate(&dump, &opts).map_err(CliError::input)?;
    let secs = t0.elapsed().as_secs_f64();
    let bytes = cal.to_bytes().map_err(CliError::input)?;
    std::fs::write(&a.out, &bytes).map_err(|e| CliError::io(&a.out, e))?;
    println!(
        "calibrated {n_layer} layers × {n_kv_head} KV heads × {head_dim} on {n_tokens} tokens \
         ({} RoPE, sink {}) in {secs:.1} s; {} bytes written to {}",
        cal.rope.kind().name(),
        cal.n_sink,
        bytes.len(),
        a.out.display()
    );
    if let Some(path) = &a.json {
        let targets: Vec<serde_json::Value> = cal
            .targets
            .iter()
            .zip(&report)
            .map(|(t, rows)| {
                serde_json::json!({
                    "name": format!("tc-{}", t.bound),
                    "bound": t.bound,
                    "layers": rows.iter().map(|r| serde_json::json!({
                        "error": r.error, "k_bits": r.k_bits, "v_bits": r.v_bits,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let j = serde_json::json!({
            "dump": a.dump.display().to_string(),
            "seconds": secs,
            "file_bytes": bytes.len(),
            "layer_weights": a.layer_weights.as_ref().map(|p| p.display().to_string()),
            "targets": targets,
        });
        let text = serde_json::to_string_pretty(&j).map_err(CliError::input)?;
        std::fs::write(path, text).map_err(|e| CliError::io(path, e))?;
    }
    println!(
        "| target | K bits/value | V bits/value | f16 / coded | mean layer error | weighted mean | worst layer |"
    );
    println!("|---|---|---|---|---|---|---|");
    let wsum: f64 = layer_weights.iter().sum();
    for (t, rows) in cal.targets.iter().zip(&report) {
        let n = rows.len() as f64;
        let kb = rows.iter().map(|r| r.k_bits).sum::<f64>() / n;
        let vb = rows.iter().map(|r| r.v_bits).sum::<f64>() / n;
        let worst = rows.iter().map(|r| r.error).fold(0f64, f64::max);
        let mean = rows.iter().map(|r| r.error).sum::<f64>() / n;
        let weighted = if layer_weights.is_empty() {
            mean
        } else {
            rows.iter()
                .zip(&layer_weights)
                .map(|(r, w)| r.error * w)
                .sum::<f64>()
                / wsum
        };
        println!(
            "| tc-{} | {kb:.3} | {vb:.3} | {:.2} | {mean:.5} | {weighted:.5} | {worst:.5} |",
            t.bound,
            32.0 / (kb + vb)
        );
    }
    Ok(())
}

fn run_inspect(a: InspectArgs) -> Result<(), CliError> {
    let bytes = std::fs::read(&a.file).map_err(|e| CliError::io(&a.file, e))?;
    let cal = Calibration::from_bytes(&bytes)
        .map_err(|e| CliError::input(format!("{}: {e}", a.file.display())))?;
    let fp = Calibration::fingerprint_of(&bytes).unwrap_or_default();
    println!("file: {} ({} bytes)", a.file.display(), bytes.len());
    println!(
        "fingerprint: {}",
        fp.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    println!(
        "layout: {} layers × {} KV heads × head_dim {}; sink {} tokens raw",
        cal.n_layer, cal.n_kv_head, cal.head_dim, cal.n_sink
    );
    println!(
        "rope: {}, {} channels rotated",
        cal.rope.kind().name(),
        cal.rope.n_rot()
    );
    println!("symbol tables: {}", cal.tables.len());
    println!("targets: {}", cal.target_names().join(", "));
    Ok(())
}

/// The `"weights"` array of a layer-weights file (`kvc tc calibrate` and `kvc quant plan`
/// read the same files).
pub(crate) fn read_weights(path: &std::path::Path) -> Result<Vec<f64>, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| CliError::io(path, e))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CliError::input(format!("{}: {e}", path.display())))?;
    j["weights"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(serde_json::Value::as_f64)
                .collect::<Option<Vec<f64>>>()
        })
        .ok_or_else(|| {
            CliError::input(format!(
                "{}: expected \"weights\": [one number per layer]",
                path.display()
            ))
        })
}

fn run_probe(a: ProbeArgs) -> Result<(), CliError> {
    let bytes = std::fs::read(&a.calibration).map_err(|e| CliError::io(&a.calibration, e))?;
    let cal = Calibration::from_bytes(&bytes)
        .map_err(|e| CliError::input(format!("{}: {e}", a.calibration.display())))?;
    let coarse = parse_name(&a.target).map_err(CliError::input)?;
    let layer = match a.layer.as_str() {
        "base" => None,
        l => Some(
            l.parse::<usize>()
                .map_err(|_| CliError::input(format!("--layer {l:?}: a layer number or base")))?,
        ),
    };
    let probe = layer_probe(&cal, layer, coarse).map_err(CliError::input)?;
    let out = probe.to_bytes().map_err(CliError::input)?;
    std::fs::write(&a.out, &out).map_err(|e| CliError::io(&a.out, e))?;
    println!(
        "probe {}: layer {} at {}, every other layer at {} / 64; {} bytes written to {}",
        kvc_transform_coder::probe::PROBE_BOUND,
        a.layer,
        a.target,
        cal.target_names()[0],
        out.len(),
        a.out.display()
    );
    Ok(())
}
