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
    println!(
        "  whole model: {token_bytes} bytes per token (f16: {}), {bpv:.4} bits/value, ratio {:.3} vs f16 (quantized tokens only)",
        2 * 2 * d * plan.n_kv_head as usize * plan.layers.len(),
        16.0 / bpv
    );
    Ok(())
}
