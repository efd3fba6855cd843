//! `kvc mlp train`: trains the grouped MLP compressor of every layer on K/V/Q dumps
//! (kvc-mlp-train), writes a `.bin` v1 file and a JSON sidecar beside it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use kvc_mlp_train::{
    evaluate, train_layer, Compression, Dump, Geometry, Init, LayerData, LayerResult, MlpParams,
    TrainConfig,
};
use kvc_types::FloatDtype;
use rayon::prelude::*;
use serde_json::{json, Value};

use crate::cli_error::CliError;

/// Where training starts.
#[derive(Clone, Copy, ValueEnum)]
pub enum InitArg {
    /// Exactly mean pooling of each group.
    MeanPool,
    /// He-normal random weights.
    Random,
}

/// `kvc mlp train` arguments.
#[derive(Args)]
pub struct TrainArgs {
    /// Directory of the training dumps (`kvc_llama_eval --modes dump --dump-dir`).
    #[arg(long)]
    dump: PathBuf,
    /// Tags of the training dumps in --dump, comma separated (textA,textB,...).
    #[arg(long, value_delimiter = ',', required = true)]
    tag: Vec<String>,
    /// Directory of the validation dumps.
    #[arg(long)]
    val_dump: Option<PathBuf>,
    /// Tags of the validation dumps, comma separated.
    #[arg(long, value_delimiter = ',')]
    val_tag: Vec<String>,
    /// Tokens per group.
    #[arg(long)]
    factor: usize,
    /// Layers to train, `a..b` (half-open) or one index; the others get a mean-pooling MLP
    /// (channel means above -1024) so that the file still covers the whole model.
    #[arg(long)]
    layers: Option<String>,
    /// Optimiser steps per layer.
    #[arg(long, default_value_t = 400)]
    steps: usize,
    /// Seed of the run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Leading tokens never compressed in a training window.
    #[arg(long, default_value_t = 16)]
    sink: usize,
    /// Trailing tokens never compressed; the queries come from them.
    #[arg(long, default_value_t = 64)]
    recent: usize,
    /// Query positions sampled per window.
    #[arg(long, default_value_t = 32)]
    queries: usize,
    /// Windows per step.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Smallest number of groups a window compresses.
    #[arg(long, default_value_t = 8)]
    min_groups: usize,
    /// Adam's peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Evaluation windows per dump.
    #[arg(long, default_value_t = 4)]
    eval_windows: usize,
    /// Where training starts.
    #[arg(long, value_enum, default_value = "mean-pool")]
    init: InitArg,
    /// min_seq_len written in the file (the default minimum number of groups).
    #[arg(long, default_value_t = 1)]
    min_seq_len: usize,
    /// Element type of the written weights.
    #[arg(long, value_parser = super::codec::float_dtype(), default_value = "f16")]
    dtype: kvc_codec::Dtype,
    /// The weight file to write; the sidecar goes to the same path with `.json`.
    #[arg(long)]
    out: PathBuf,
}

fn parse_layers(s: Option<&str>, n: usize) -> Result<std::ops::Range<usize>, CliError> {
    let bad = || {
        CliError::input(format!(
            "--layers {s:?}: expected a..b or one index below {n}"
        ))
    };
    let r = match s {
        None => 0..n,
        Some(s) => match s.split_once("..") {
            Some((a, b)) => {
                a.trim().parse().map_err(|_| bad())?..b.trim().parse().map_err(|_| bad())?
            }
            None => {
                let a: usize = s.trim().parse().map_err(|_| bad())?;
                a..a + 1
            }
        },
    };
    if r.start >= r.end || r.end > n {
        return Err(bad());
    }
    Ok(r)
}

fn train_error(e: kvc_mlp_train::Error) -> CliError {
    match e.kind() {
        kvc_mlp_train::ErrorKind::Io => CliError::Io(e.to_string()),
        _ => CliError::input(e),
    }
}

fn open_dumps(dir: &Path, tags: &[String]) -> Result<Vec<Dump>, CliError> {
    tags.iter()
        .map(|t| Dump::open(dir, t).map_err(train_error))
        .collect()
}

fn texts_info(dir: &Path, dumps: &[Dump]) -> Value {
    let info: Value = std::fs::read_to_string(dir.join("texts.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    Value::Array(
        dumps
            .iter()
            .map(|d| {
                let mut o = json!({
                    "dump": format!("{}/{}", dir.display(), d.tag),
                    "text_source": d.text_source(),
                    "tokens": d.n_tokens,
                });
                if let Some(i) = info.get(&d.tag) {
                    o["file"] = i.get("file").cloned().unwrap_or(Value::Null);
                    o["licence"] = i.get("licence").cloned().unwrap_or(Value::Null);
                }
                o
            })
            .collect(),
    )
}

fn round_to(dtype: FloatDtype, x: f32) -> f32 {
    match dtype {
        FloatDtype::F16 => half::f16::from_f32(x).to_f32(),
        FloatDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// The MLP as the file stores it: scale folded in, every weight rounded to `dtype`.
fn as_stored(
    p: &MlpParams<f32>,
    scale: f32,
    dtype: FloatDtype,
) -> Result<MlpParams<f32>, CliError> {
    let mut m = MlpParams::from_kvc(&p.to_kvc(scale).map_err(train_error)?);
    for t in m.tensors_mut() {
        for x in t.iter_mut() {
            *x = round_to(dtype, *x);
        }
    }
    Ok(m)
}

struct LayerOut {
    layer: usize,
    result: Option<LayerResult>,
    report: Value,
}

/// Runs `kvc mlp train`.
pub fn run(a: TrainArgs) -> Result<(), CliError> {
    let t0 = Instant::now();
    let train = open_dumps(&a.dump, &a.tag)?;
    let val = match &a.val_dump {
        Some(dir) if !a.val_tag.is_empty() => open_dumps(dir, &a.val_tag)?,
        Some(_) => return Err(CliError::input("--val-dump needs --val-tag")),
        None if !a.val_tag.is_empty() => return Err(CliError::input("--val-tag needs --val-dump")),
        None => Vec::new(),
    };
    let first = &train[0];
    for d in train.iter().chain(&val) {
        if (d.n_layer, d.n_kv_head, d.n_head, d.head_dim, d.model())
            != (
                first.n_layer,
                first.n_kv_head,
                first.n_head,
                first.head_dim,
                first.model(),
            )
        {
            return Err(CliError::input(format!(
                "dump {}/{} is of another model or shape than {}/{}",
                d.dir.display(),
                d.tag,
                first.dir.display(),
                first.tag
            )));
        }
    }
    let layers = parse_layers(a.layers.as_deref(), first.n_layer)?;
    let dtype = a.dtype.float().ok_or_else(|| {
        CliError::input(format!(
            "--dtype {}: weights are stored as f16, bf16 or f32",
            a.dtype
        ))
    })?;
    let cfg = TrainConfig {
        geometry: Geometry {
            sink: a.sink,
            recent: a.recent,
            factor: a.factor,
        },
        min_groups: a.min_groups,
        queries: a.queries,
        batch: a.batch,
        steps: a.steps,
        lr: a.lr,
        seed: a.seed,
        eval_windows: a.eval_windows,
        init: match a.init {
            InitArg::MeanPool => Init::MeanPool,
            InitArg::Random => Init::Random,
        },
    };
    let min_tokens = train
        .iter()
        .chain(&val)
        .map(|d| d.n_tokens)
        .min()
        .unwrap_or(0);
    cfg.check(min_tokens).map_err(train_error)?;
    eprintln!(
        "kvc mlp train: {} ({}), factor {}, layers {}..{} of {}, {} training and {} validation dumps, {} steps, seed {}, {} threads",
        first.model(),
        first.head_dim,
        a.factor,
        layers.start,
        layers.end,
        first.n_layer,
        train.len(),
        val.len(),
        a.steps,
        a.seed,
        rayon::current_num_threads()
    );
    let load = |dumps: &[Dump], l: usize| -> Result<Vec<LayerData<f32>>, CliError> {
        dumps
            .iter()
            .map(|d| d.layer(l).map_err(train_error))
            .collect()
    };
    let outs: Vec<Result<LayerOut, CliError>> = (0..first.n_layer)
        .into_par_iter()
        .map(|l| {
            if !layers.contains(&l) {
                return Ok(LayerOut {
                    layer: l,
                    result: None,
                    report: json!({"layer": l, "trained": false, "mlp": "mean pooling (shift 1024)"}),
                });
            }
            let lt = Instant::now();
            let tr = load(&train, l)?;
            let va = load(&val, l)?;
            let r = train_layer(&tr, &va, &cfg, l, |step, loss| {
                eprintln!("layer {l:2} step {step:5}/{} loss {loss:.5}", cfg.steps);
            })
            .map_err(train_error)?;
            // The errors of the weights as stored (scales folded, rounded to the file dtype).
            let (k, v) = (
                as_stored(&r.k, r.k_scale, dtype)?,
                as_stored(&r.v, r.v_scale, dtype)?,
            );
            let comp = Compression::Mlp {
                k: &k,
                v: &v,
                k_scale: 1.0,
                v_scale: 1.0,
            };
            let geo = cfg.geometry;
            let tw = kvc_mlp_train::eval_windows(&tr, &cfg);
            let train_stored = evaluate(&tr, &tw, geo, comp);
            let val_stored = if va.is_empty() {
                f64::NAN
            } else {
                evaluate(&va, &kvc_mlp_train::eval_windows(&va, &cfg), geo, comp)
            };
            eprintln!(
                "layer {l:2} done in {:.1} s: relative attention-output error train {:.5} (mean pooling {:.5}, start {:.5}), validation {:.5} (mean pooling {:.5}); as stored: train {:.5}, validation {:.5}",
                lt.elapsed().as_secs_f64(),
                r.train,
                r.train_mean_pool,
                r.train_init,
                r.val,
                r.val_mean_pool,
                train_stored,
                val_stored
            );
            let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
            let report = json!({
                "layer": l,
                "trained": true,
                "train_rel_err": num(train_stored),
                "val_rel_err": num(val_stored),
                "train_rel_err_f32": num(r.train),
                "val_rel_err_f32": num(r.val),
                "train_rel_err_mean_pool": num(r.train_mean_pool),
                "val_rel_err_mean_pool": num(r.val_mean_pool),
                "train_rel_err_start": num(r.train_init),
                "k_scale": r.k_scale,
                "v_scale": r.v_scale,
                "loss_curve": r.curve.iter().map(|&x| num(x)).collect::<Vec<_>>(),
            });
            Ok(LayerOut {
                layer: l,
                result: Some(r),
                report,
            })
        })
        .collect();
    let mut outs: Vec<LayerOut> = outs.into_iter().collect::<Result<_, _>>()?;
    outs.sort_by_key(|o| o.layer);
    let d = first.head_dim;
    let mut mlps = Vec::with_capacity(outs.len());
    for o in &outs {
        mlps.push(match &o.result {
            Some(r) => kvc_mlp::LayerMlps {
                text_k: Some(r.k.to_kvc(r.k_scale).map_err(train_error)?),
                text_v: Some(r.v.to_kvc(r.v_scale).map_err(train_error)?),
                ..Default::default()
            },
            None => {
                // Mean pooling wherever a channel's mean is above -1024 (f16 holds the shift
                // exactly; the f32 sums round to about 1e-4 at that offset).
                let p = MlpParams::mean_pool(d, a.factor, &vec![1024f32; d]);
                kvc_mlp::LayerMlps {
                    text_k: Some(p.to_kvc(1.0).map_err(train_error)?),
                    text_v: Some(p.to_kvc(1.0).map_err(train_error)?),
                    ..Default::default()
                }
            }
        });
    }
    let weights = kvc_mlp::CompressorWeights::from_layers(d, a.factor, a.min_seq_len, mlps)
        .map_err(|e| CliError::input(format!("kvc-mlp: {e}")))?;
    let bytes = weights
        .to_bytes(dtype, first.n_kv_head as u32)
        .map_err(|e| CliError::input(format!("kvc-mlp: {e}")))?;
    // The file must load back as written.
    kvc_mlp::CompressorWeights::from_bytes(&bytes)
        .map_err(|e| CliError::input(format!("the written weights do not load: {e}")))?;
    std::fs::write(&a.out, &bytes).map_err(|e| CliError::io(&a.out, e))?;
    let trained: Vec<&Value> = outs
        .iter()
        .filter(|o| o.result.is_some())
        .map(|o| &o.report)
        .collect();
    let mean = |key: &str| -> Value {
        let v: Vec<f64> = trained.iter().filter_map(|r| r[key].as_f64()).collect();
        if v.is_empty() {
            Value::Null
        } else {
            json!(v.iter().sum::<f64>() / v.len() as f64)
        }
    };
    let sc = &first.sidecar;
    let sidecar = json!({
        "kind": "kvc-mlp-train sidecar v1",
        "weights": a.out.file_name().map(|s| s.to_string_lossy().into_owned()),
        "weights_bytes": bytes.len(),
        "dtype": dtype.name(),
        "factor": a.factor,
        "min_seq_len": a.min_seq_len,
        "model": {
            "file": sc.get("model"),
            "desc": sc.get("model_desc"),
            "runtime": sc.get("runtime"),
            "n_layer": first.n_layer,
            "n_head": first.n_head,
            "n_kv_head": first.n_kv_head,
            "head_dim": first.head_dim,
        },
        "objective": {
            "name": "layer-local attention-output matching",
            "loss": "sum |o' - o|^2 / sum |o|^2 over queries, query heads and channels (relative error)",
            "window": "first S tokens of a dump, S uniform in [sink + min_groups*factor + recent, n_tokens]",
            "compressed": "groups of factor tokens from sink to the last whole group before the recent span; the rest uncompressed",
            "queries": "positions in the recent span, causal, GQA query head g reads KV head g / (n_head / n_kv_head)",
            "positions": "RoPE-decoupled (kvc-mlp): compressed rows are MLPs of post-RoPE keys, never re-rotated; later tokens keep their true positions, so the dump's post-RoPE queries are used as they are",
            "sink": a.sink,
            "recent": a.recent,
            "min_groups": a.min_groups,
            "queries_per_window": a.queries,
        },
        "training": {
            "trainer": "kvc-mlp-train (Rust, hand-written backward pass, Adam)",
            "steps": a.steps,
            "batch": a.batch,
            "lr": a.lr,
            "lr_schedule": "5 % linear warm-up, cosine decay to lr/10",
            "seed": a.seed,
            "init": cfg.init.name(),
            "layers_trained": format!("{}..{}", layers.start, layers.end),
            "eval_windows_per_dump": a.eval_windows,
            "seconds": t0.elapsed().as_secs_f64(),
        },
        "texts": {
            "train": texts_info(&a.dump, &train),
            "validation": a.val_dump.as_deref().map(|d| texts_info(d, &val)).unwrap_or(json!([])),
        },
        "summary": {
            "note": "means over the trained layers; *_rel_err: the weights as stored in the file",
            "train_rel_err": mean("train_rel_err"),
            "val_rel_err": mean("val_rel_err"),
            "train_rel_err_mean_pool": mean("train_rel_err_mean_pool"),
            "val_rel_err_mean_pool": mean("val_rel_err_mean_pool"),
        },
        "layers": outs.iter().map(|o| o.report.clone()).collect::<Vec<_>>(),
    });
    let side = sidecar_path(&a.out);
    let text = serde_json::to_string_pretty(&sidecar).map_err(CliError::input)? + "\n";
    std::fs::write(&side, text).map_err(|e| CliError::io(&side, e))?;
    println!(
        "wrote {} ({} bytes, {}) and {}: mean relative attention-output error over {} layers: train {} (mean pooling {}), validation {} (mean pooling {}); {:.1} s",
        a.out.display(),
        bytes.len(),
        dtype.name(),
        side.display(),
        trained.len(),
        fmt(&sidecar["summary"]["train_rel_err"]),
        fmt(&sidecar["summary"]["train_rel_err_mean_pool"]),
        fmt(&sidecar["summary"]["val_rel_err"]),
        fmt(&sidecar["summary"]["val_rel_err_mean_pool"]),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn fmt(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.5}"))
}

/// `FILE.bin` -> `FILE.json`.
pub fn sidecar_path(bin: &Path) -> PathBuf {
    bin.with_extension("json")
}
