//! `kvc quant inspect`: what a kvq plan or config string stores, layer by layer: bits,
//! bytes per packed row, bits per value with metadata and the ratio to f16.

use std::path::Path;

use clap::Args;
use kvc_kvq::{row_bytes, KvqConfig, KvqPlan};

use crate::cli_error::CliError;

/// `kvc quant inspect` arguments.
#[derive(Args)]
pub struct InspectArgs {
    /// A kvq plan (JSON file) or a config string (`k4v4`, `k4v2:u32`, ...).
    plan: String,
    /// For a config string: head_dim.
    #[arg(long = "head-dim", default_value_t = 64)]
    head_dim: u32,
    /// For a config string: KV heads per layer.
    #[arg(long = "kv-heads", default_value_t = 3)]
    kv_heads: u32,
    /// For a config string: layers.
    #[arg(long, default_value_t = 30)]
    layers: usize,
    /// Context length for the bytes per token and mean ratio of a plan with protections
    /// (sink, window, K center), as an engine using kvc's kvq cells holds them.
    #[arg(long, default_value_t = 2048)]
    context: usize,
}

fn lib(e: kvc_kvq::Error) -> CliError {
    CliError::input(e)
}

/// Runs `kvc quant inspect`.
pub fn run(a: InspectArgs) -> Result<(), CliError> {
    let path = Path::new(&a.plan);
    let plan = if path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|e| CliError::io(path, e))?;
        KvqPlan::from_json(&text).map_err(|e| CliError::input(format!("{}: {e}", a.plan)))?
    } else {
        let cfg = KvqConfig::parse(&a.plan).map_err(lib)?;
        let p = KvqPlan::uniform(&cfg, a.head_dim, a.kv_heads, a.layers);
        p.validate().map_err(lib)?;
        p
    };
    let m = plan.method().map_err(lib)?;
    let d = plan.head_dim as usize;
    println!(
        "kvq plan v{}: method {}, seed {}, head_dim {d}, {} KV heads, {} layers, sink {} (f16), recent {} ({}), K center {}",
        plan.version,
        plan.method,
        plan.seed,
        plan.n_kv_head,
        plan.layers.len(),
        plan.sink_tokens,
        plan.recent_tokens,
        plan.recent_bits
            .map_or_else(|| "f16".to_string(), |b| format!("{b}-bit kvq rows")),
        if plan.k_center { "on" } else { "off" }
    );
    if let Some(c) = &plan.calibration {
        println!(
            "  calibrated on {} {:?} ({} tokens, queries {}.. step {}): budget ratio {}, reached {:.3}, K weight {}, predicted error {:.4e}",
            c.source,
            c.tag,
            c.n_tokens,
            c.query_from,
            c.query_stride,
            c.budget_ratio,
            c.achieved_ratio,
            c.k_weight,
            c.total_error
        );
        if let Some([a, b]) = c.k_center_tokens {
            println!("  K calibrated centered on the mean of tokens {a}..{b}");
        }
        for (side, range) in [("K", c.k_bits_range), ("V", c.v_bits_range)] {
            if let Some([lo, hi]) = range {
                println!("  {side} bits bounded to {lo}..={hi}");
            }
        }
        if let Some(w) = &c.layer_weights {
            let (lo, hi) = w.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
            println!(
                "  layers weighed by measured sensitivity: {lo:.3} to {hi:.3} (mean 1): {}",
                w.iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
    println!(
        "  {:>5} {:>6} {:>6} {:>9} {:>9} {:>8}",
        "layer", "K bits", "V bits", "K B/row", "V B/row", "bits/val"
    );
    let mut token_bytes = 0usize;
    for (i, l) in plan.layers.iter().enumerate() {
        let kb = row_bytes(m, l.k_bits, d).map_err(lib)?;
        let vb = row_bytes(m, l.v_bits, d).map_err(lib)?;
        token_bytes += (kb + vb) * plan.n_kv_head as usize;
        println!(
            "  {i:>5} {:>6} {:>6} {kb:>9} {vb:>9} {:>8.4}",
            l.k_bits,
            l.v_bits,
            4.0 * (kb + vb) as f64 / d as f64
        );
    }
    let bpv = plan.bits_per_value().map_err(lib)?;
    let f16_token = 2 * 2 * d * plan.n_kv_head as usize * plan.layers.len();
    println!(
        "  whole model: {token_bytes} bytes per token (f16: {f16_token}), {bpv:.4} bits/value, ratio {:.3} vs f16 (quantized tokens only)",
        16.0 / bpv
    );
    if plan.recent_bits.is_some() || plan.sink_tokens > 0 || plan.k_center {
        let n = a.context.max(1);
        let side = protected_side_bytes(&plan, d).map_err(lib)?;
        let held = n * (token_bytes + 16) + side;
        println!(
            "  with the protections in an engine's cache (kvc's kvq cells, docs/formats/kvq.md \"Cells\"), at {n} tokens of one sequence, decoding: \
             {side} bytes beside the cells (sink and window rows, centers, 16 B/cell of bookkeeping), {:.1} bytes per token, ratio {:.3} vs f16",
            held as f64 / n as f64,
            (n * f16_token) as f64 / held as f64
        );
    }
    Ok(())
}

/// Bytes kvc's kvq cells hold beside an engine's cache for one sequence of `n` cells while it
/// decodes: per layer and tensor `sink_tokens` f16 rows and `recent_tokens + 1` window rows
/// (the one leaving is freed by the next ubatch), one K center per layer (values and their
/// rotation, f32 in memory, and its 48-byte slot), 16 bytes of bookkeeping per cell (added by
/// the caller per token: here, for the cells of `n` tokens, see the print).
fn protected_side_bytes(plan: &KvqPlan, d: usize) -> Result<usize, kvc_kvq::Error> {
    let h = plan.n_kv_head as usize;
    let window = match plan.recent_bits {
        Some(b) => (plan.recent_tokens as usize + 1) * h * row_bytes(plan.method()?, b, d)?,
        None => 0,
    };
    let per_tensor = plan.sink_tokens as usize * h * d * 2 + window;
    let centers = if plan.k_center { 48 + 4 * 2 * h * d } else { 0 };
    Ok(plan.layers.len() * (2 * per_tensor + centers))
}
