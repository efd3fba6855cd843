//! `kvc quant plan`: a per-layer kvq plan (K and V bits) for a budget ratio, calibrated on
//! a dump of the model's own K, V and Q (the llama.cpp client's `--modes dump`). This file
//! reads and checks the dump and prints; the algorithm is `kvc_kvq_calibrate`.

use std::path::PathBuf;

use clap::Args;
use kvc_kvq::config::DEFAULT_SEED;
use kvc_kvq::{KvqConfig, LayerBits, Method};
use kvc_kvq_calibrate::{
    allocate, make_plan, plan_bits_per_value, sensitivity_with, BitBounds, CalibShape, CalibSource,
    Objective, QuerySample, BITS,
};

use crate::cli_error::CliError;
use crate::cmd::dump::KvqDump;

/// `kvc quant plan` arguments.
#[derive(Args)]
pub struct PlanArgs {
    /// Target ratio to f16 (16 / mean bits per value, scales included), e.g. 3.5.
    #[arg(long)]
    budget: f64,
    /// Dump directory with `<tag>.{K,V,Q}.f32.bin` and their `.json` sidecars.
    #[arg(long)]
    dump: PathBuf,
    /// File tag of the dump.
    #[arg(long = "text-tag", default_value = "textA")]
    text_tag: String,
    /// Method: `lm` (Lloyd-Max) or `u<group>` (uniform).
    #[arg(long, default_value = "lm")]
    method: String,
    /// Rotation seed (default: kvq's).
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// First sampled query position.
    #[arg(long = "query-from", default_value_t = 64)]
    query_from: usize,
    /// Sample every n-th query position.
    #[arg(long = "query-stride", default_value_t = 8)]
    query_stride: usize,
    /// Weight of K errors against V errors in the objective.
    #[arg(long = "k-weight", default_value_t = 1.0)]
    k_weight: f64,
    /// Fewest K bits any layer gets (2..=8).
    #[arg(long = "k-bits-min", default_value_t = 2)]
    k_bits_min: u8,
    /// Most K bits any layer gets (2..=8).
    #[arg(long = "k-bits-max", default_value_t = 8)]
    k_bits_max: u8,
    /// Fewest V bits any layer gets (2..=8), e.g. 4 to keep V from paying for K.
    #[arg(long = "v-bits-min", default_value_t = 2)]
    v_bits_min: u8,
    /// Most V bits any layer gets (2..=8).
    #[arg(long = "v-bits-max", default_value_t = 8)]
    v_bits_max: u8,
    /// Code K centered in the calibration, the center each layer's K mean over
    /// `--k-center-tokens` tokens from this one (an engine's f16 sink count, e.g. 4).
    #[arg(long = "k-center-from", default_value_t = 0)]
    k_center_from: usize,
    /// Tokens whose K mean is the center (an engine's recent window, e.g. 64); 0: K is
    /// coded as is.
    #[arg(long = "k-center-tokens", default_value_t = 0)]
    k_center_tokens: usize,
    /// Engine protection written into the plan: leading positions of each sequence kept in
    /// f16 (the attention sink).
    #[arg(long = "sink", default_value_t = 0)]
    sink: u32,
    /// Engine protection: the newest positions of each sequence kept as `--recent-bits`
    /// rows (or f16 without it) and coded to the layer's bits when they leave.
    #[arg(long = "recent", default_value_t = 0)]
    recent: u32,
    /// Bits (2..=8) of the recent window's rows (plan version 3).
    #[arg(long = "recent-bits")]
    recent_bits: Option<u8>,
    /// Engine protection: K coded relative to a per-sequence center fixed when the window
    /// first fills (plan version 3; needs --sink and --recent).
    #[arg(long = "k-center")]
    k_center_engine: bool,
    /// Weigh each layer's errors by the model's measured sensitivity to them: a JSON file
    /// with `"weights": [one positive number per layer]`
    /// (`integrations/llama/kvq-calibrate.py` measures them in llama.cpp). The plan is then
    /// version 4 and records them. Default: every layer 1.
    #[arg(long = "layer-weights")]
    layer_weights: Option<PathBuf>,
    /// Write the plan (JSON) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the full sensitivity table and allocation as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn method_of(s: &str) -> Result<Method, CliError> {
    // The method parser lives with config strings: borrow one.
    KvqConfig::parse(&format!("k4v4:{s}"))
        .map(|c| c.method)
        .map_err(|_| CliError::input(format!("--method {s:?}: expected lm or u<group>")))
}

/// Runs `kvc quant plan`.
pub fn run(a: PlanArgs) -> Result<(), CliError> {
    let method = method_of(&a.method)?;
    let bounds = BitBounds::new((a.k_bits_min, a.k_bits_max), (a.v_bits_min, a.v_bits_max))
        .map_err(|e| CliError::input(format!("--k-bits-min/max, --v-bits-min/max: {e}")))?;
    let weights = match &a.layer_weights {
        Some(path) => Some(crate::cmd::tc::read_weights(path)?),
        None => None,
    };
    let dump = KvqDump::read(&a.dump, &a.text_tag)?;
    let (k, v, q) = (&dump.k, &dump.v, &dump.q);
    let [n_layer, n_tokens, n_kv_head, head_dim] = k.shape;
    let n_head = q.shape[2];
    let shape = CalibShape {
        n_layer,
        n_tokens,
        n_head,
        n_kv_head,
        head_dim,
    };
    let sample = QuerySample {
        from: a.query_from,
        stride: a.query_stride,
    };
    let lib = |e: kvc_kvq::Error| CliError::input(e);
    let t0 = std::time::Instant::now();
    let k_center = (a.k_center_tokens > 0)
        .then(|| a.k_center_from..a.k_center_from.saturating_add(a.k_center_tokens));
    let sens = sensitivity_with(
        shape,
        &k.data,
        &v.data,
        &q.data,
        method,
        a.seed,
        sample,
        k_center.clone(),
    )
    .map_err(|e| {
        CliError::input(format!(
            "--k-center-from/--k-center-tokens or the dump: {e}"
        ))
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let objective = Objective {
        k_weight: a.k_weight,
        layer_weights: weights.as_deref(),
    };
    let alloc = allocate(&sens, method, head_dim, a.budget, objective, bounds).map_err(|e| {
        CliError::input(format!(
            "--budget {} --k-weight {}{}: {e}",
            a.budget,
            a.k_weight,
            a.layer_weights
                .as_ref()
                .map(|p| format!(" --layer-weights {}", p.display()))
                .unwrap_or_default()
        ))
    })?;
    let src = CalibSource {
        source: a.dump.display().to_string(),
        tag: a.text_tag.clone(),
    };
    let mut plan = make_plan(
        shape, method, a.seed, sample, &src, a.budget, objective, bounds, &sens, &alloc,
    )
    .map_err(lib)?;
    if let (Some(r), Some(c)) = (&k_center, plan.calibration.as_mut()) {
        let u = |x: usize| u32::try_from(x).map_err(|_| CliError::input("--k-center-*: too large"));
        c.k_center_tokens = Some([u(r.start)?, u(r.end)?]);
        plan.validate().map_err(lib)?;
    }
    plan.sink_tokens = a.sink;
    plan.recent_tokens = a.recent;
    plan.recent_bits = a.recent_bits;
    plan.k_center = a.k_center_engine;
    if plan.recent_bits.is_some() || plan.k_center {
        plan.version = plan.version.max(3);
    }
    plan.validate()
        .map_err(|e| CliError::input(format!("--sink/--recent/--recent-bits/--k-center: {e}")))?;

    println!(
        "kvq plan for ratio {} ({:.4} bits/value max), method {}: calibrated on {} {:?}, {n_layer} layers x {n_tokens} tokens, {n_head} query / {n_kv_head} KV heads, head_dim {head_dim}; queries {}.. step {} ({secs:.1} s)",
        a.budget,
        16.0 / a.budget,
        method.tag(),
        a.dump.display(),
        a.text_tag,
        a.query_from,
        a.query_stride
    );
    println!(
        "  {:>5} {:>3} {:>3} {:>11} {:>11} {:>7}",
        "layer", "bk", "bv", "K err", "V err", "weight"
    );
    let cal = plan
        .calibration
        .as_ref()
        .ok_or_else(|| CliError::input("internal: the plan has no calibration record"))?;
    let (mut sk, mut sv) = (0.0, 0.0);
    for (i, (l, e)) in plan.layers.iter().zip(&cal.layer_errors).enumerate() {
        println!(
            "  {i:>5} {:>3} {:>3} {:>11.4e} {:>11.4e} {:>7.3}",
            l.k_bits,
            l.v_bits,
            e.k_err,
            e.v_err,
            weights.as_ref().map_or(1.0, |w| w[i])
        );
        sk += e.k_err;
        sv += e.v_err;
    }
    println!(
        "  total: {}K {sk:.4e} x {} + V {sv:.4e}{} = {:.4e}; {:.4} bits/value, ratio {:.3}",
        if weights.is_some() { "(" } else { "" },
        a.k_weight,
        if weights.is_some() {
            ") per layer x its weight"
        } else {
            ""
        },
        alloc.total_error,
        alloc.bits_per_value,
        alloc.ratio()
    );
    if let Some(r) = &k_center {
        println!(
            "  K coded centered: each layer's center the f16 K mean of tokens {}..{}",
            r.start, r.end
        );
    }
    if !bounds.is_full() {
        println!(
            "  bounds: K {}..={} bits, V {}..={} bits",
            bounds.k.0, bounds.k.1, bounds.v.0, bounds.v.1
        );
    }
    // Uniform configs for comparison: the best one within the same budget and bounds.
    let mut uniform = Vec::new();
    for bk in BITS {
        for bv in BITS {
            let u = vec![
                LayerBits {
                    k_bits: bk,
                    v_bits: bv
                };
                n_layer
            ];
            let bpv = plan_bits_per_value(&u, method, head_dim).map_err(lib)?;
            uniform.push((bk, bv, bpv, objective.error_of(&sens, &u)));
        }
    }
    let best = uniform
        .iter()
        .filter(|u| u.2 <= 16.0 / a.budget && bounds.allows(u.0, u.1))
        .min_by(|x, y| x.3.total_cmp(&y.3));
    match best {
        Some(&(bk, bv, bpv, e)) => println!(
            "  best uniform within budget: k{bk}v{bv} ({bpv:.4} bits/value, ratio {:.3}): total {e:.4e} ({:.2}x the plan's)",
            16.0 / bpv,
            e / alloc.total_error.max(f64::MIN_POSITIVE)
        ),
        None => println!("  no uniform config fits this budget and these bounds"),
    }
    if let Some(out) = &a.out {
        std::fs::write(out, plan.to_json() + "\n").map_err(|e| CliError::io(out, e))?;
        println!("  plan written to {}", out.display());
    }
    if let Some(out) = &a.json {
        let j = serde_json::json!({
            "plan": serde_json::from_str::<serde_json::Value>(&plan.to_json()).unwrap_or_default(),
            "sensitivity": {
                "bits": BITS.collect::<Vec<_>>(),
                "k": sens.k,
                "v": sens.v,
            },
            "uniform": uniform.iter().map(|&(bk, bv, bpv, e)| serde_json::json!({
                "k_bits": bk, "v_bits": bv, "bits_per_value": bpv, "ratio": 16.0 / bpv, "total_error": e
            })).collect::<Vec<_>>(),
            "seconds": secs,
        });
        let text = serde_json::to_string_pretty(&j).unwrap_or_default();
        std::fs::write(out, text + "\n").map_err(|e| CliError::io(out, e))?;
    }
    Ok(())
}
