//! Plain `kvc bench`: one screen of what a user comes for, measured in the run on the
//! embedded sample (or `--data DIR`): the lossless codecs' whole-model ratio and MB/s
//! (gear-v2, gear-v1, plain zstd as the baseline), kvq at about 2, 3.5 and 5:1 against f16
//! with its attention-output error against f64 attention and its quantize / dequantize GB/s,
//! and decode attention on packed rows against the same kernel on an f16 cache.
//!
//! The numbers come from the code of `kvc bench codec` (`codec::measure`, the same chunks,
//! repeats and checks) and `kvc bench quant` (`quant::quality`, `quant::speed`, the same
//! references and queries); those commands print the full tables. `--json` writes the codec
//! bench's JSON with this screen's numbers added under `summary`.

use serde_json::{json, Value};

use super::codec::{self, CodecBenchArgs, LosslessSummary};
use super::dataset::Dataset;
use super::quant::{self, Kv};
use crate::cli_error::CliError;
use kvc_kvq::KvqConfig;

/// The kvq configurations of the screen, with the ratio each stands for: Lloyd-Max rows
/// whose ratio to f16 (scales counted) at head_dim 64 is nearest 2, 3.5 and 5 among those
/// llama.cpp runs measure (`docs/llama-cpp.md`) or, for 2:1, the nearest of all.
pub const CONFIGS: [(&str, &str); 3] = [("~2:1", "k8v8"), ("~3.5:1", "k4v4"), ("~5:1", "k4v2")];

/// Token counts of the decode attention timing.
const ATTENTION_TOKENS: [usize; 2] = [4096, 32768];

/// Query positions per layer and head for the attention error (as `kvc bench quant`).
const QUERIES_PER_HEAD: usize = 24;

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// The kvq part: quality and speed of every entry of [`CONFIGS`], as JSON.
fn measure_kvq(kv: &Kv, repeat: usize, attention_reps: usize) -> Result<Value, CliError> {
    let positions = quant::query_positions(kv.n_tokens, QUERIES_PER_HEAD);
    let refs = quant::reference(kv, &positions);
    let mut configs = Vec::new();
    for (target, name) in CONFIGS {
        let cfg = KvqConfig::parse(name).map_err(CliError::input)?;
        let mut q = quant::quality(kv, &cfg, &refs, repeat)?;
        q["target"] = json!(target);
        // the spelling a user types (`k4v4` is `k4v4:lm`)
        q["config"] = json!(name);
        // the per-layer rows are in `kvc bench quant --json`; the screen keeps the totals
        if let Some(o) = q.as_object_mut() {
            o.remove("layers");
        }
        let speed = ATTENTION_TOKENS
            .iter()
            .map(|&n| quant::speed(kv, &cfg, n, attention_reps))
            .collect::<Result<Vec<_>, _>>()?;
        q["attention_speed"] = json!(speed);
        configs.push(q);
    }
    Ok(json!({
        "shape": [kv.n_layer, kv.n_tokens, kv.n_kv_head, kv.head_dim],
        "queries": quant::QUERIES,
        "query_positions": positions,
        "attention_reps": attention_reps,
        "configs": configs,
    }))
}

fn print_lossless(lossless: &[LosslessSummary], chunk_tokens: usize, repeat: usize) {
    let mut dtypes: Vec<&str> = Vec::new();
    for l in lossless {
        if !dtypes.contains(&l.dtype.as_str()) {
            dtypes.push(&l.dtype);
        }
    }
    println!(
        "lossless, bit-exact: K+V, whole model, {chunk_tokens}-token chunks; MB/s of raw bytes, \
         one core, best of {repeat}"
    );
    let mut head = format!("  {:<8}", "codec");
    for d in &dtypes {
        head += &format!(
            " | {:>10} {:>8} {:>8}",
            format!("{d} ratio"),
            "enc MB/s",
            "dec MB/s"
        );
    }
    println!("{head}");
    let mut codecs: Vec<&str> = Vec::new();
    for l in lossless {
        if !codecs.contains(&l.codec.as_str()) {
            codecs.push(&l.codec);
        }
    }
    for c in codecs {
        let mut line = format!("  {c:<8}");
        for d in &dtypes {
            match lossless.iter().find(|l| l.codec == c && l.dtype == *d) {
                Some(l) => {
                    line += &format!(
                        " | {:>8.3}:1 {:>8.0} {:>8.0}",
                        l.ratio_chunks, l.compress_mb_s_1core, l.decompress_mb_s_1core
                    )
                }
                None => line += &format!(" | {:>10} {:>8} {:>8}", "-", "-", "-"),
            }
        }
        println!("{line}");
    }
}

/// A relative error as a percentage.
fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

fn print_kvq(k: &Value) {
    let configs = k["configs"].as_array().map_or(&[][..], |v| v.as_slice());
    let n_pos = k["query_positions"].as_array().map_or(0, |v| v.len());
    println!(
        "kvq, lossy: ratio vs f16, scales counted; attention-output error (relative L2) against f64"
    );
    println!(
        "  attention on the f16 cache, {n_pos} queries per layer and head: the layer's own K rows \
         (no Q in the dumps)"
    );
    println!(
        "  {:<7} {:<6} {:>10} {:>7} {:>14} {:>9} {:>11} {:>13}",
        "target",
        "config",
        "bits/value",
        "ratio",
        "attn err mean",
        "attn max",
        "quant GB/s",
        "dequant GB/s"
    );
    for c in configs {
        println!(
            "  {:<7} {:<6} {:>10.3} {:>5.2}:1 {:>14} {:>9} {:>11.2} {:>13.2}",
            c["target"].as_str().unwrap_or(""),
            c["config"].as_str().unwrap_or(""),
            f(c, "bits_per_value"),
            f(c, "ratio_vs_f16"),
            pct(f(c, "attn_rel_err_mean")),
            pct(f(c, "attn_rel_err_max")),
            f(c, "quantize_gb_per_s"),
            f(c, "dequantize_gb_per_s"),
        );
    }
    let isa = configs
        .first()
        .and_then(|c| c["attention_speed"][0]["isa"].as_str())
        .unwrap_or("");
    println!(
        "decode attention, 1 head, 1 core ({isa}), best of {}, data rows tiled: kvq vs the same \
         kernel on f16",
        k["attention_reps"]
    );
    let mut head = format!("  {:<6}", "config");
    for n in ATTENTION_TOKENS {
        head += &format!(
            " | {:>19} {:>7} {:>7}",
            format!("{n} tokens: kvq us"),
            "f16 us",
            "speedup"
        );
    }
    println!("{head}");
    for c in configs {
        let mut line = format!("  {:<6}", c["config"].as_str().unwrap_or(""));
        for s in c["attention_speed"].as_array().into_iter().flatten() {
            line += &format!(
                " | {:>19.1} {:>7.1} {:>6.2}x",
                f(s, "packed_us"),
                f(s, "f16_us"),
                f(s, "speedup_vs_f16")
            );
        }
        println!("{line}");
    }
}

/// `4 layers x 512 tokens x 3 KV heads x 64, K and V in f16, bf16` (the first dump's shape).
fn shape_line(data: &Dataset) -> String {
    let mut dtypes: Vec<&str> = Vec::new();
    for d in &data.dumps {
        if !dtypes.contains(&d.dtype.name()) {
            dtypes.push(d.dtype.name());
        }
    }
    match data.dumps.first() {
        Some(d) => format!(
            "{} layers x {} tokens x {} KV heads x {}, K and V in {}",
            d.n_layer,
            d.n_tokens,
            d.n_kv_head,
            d.head_dim,
            dtypes.join(", ")
        ),
        None => String::new(),
    }
}

/// Runs plain `kvc bench`.
pub fn run(args: CodecBenchArgs) -> Result<(), CliError> {
    let data = codec::load(&args)?;
    let (chunk_tokens, repeat, _) = codec::settings(&args);
    println!("kvc bench: {}, {}", data.source, shape_line(&data));
    let mut measured = codec::measure(&args, &data, false)?;
    let attention_reps = repeat.max(5);
    let kvq = match Kv::from_dataset(&data) {
        Ok(kv) => Some(measure_kvq(&kv, repeat, attention_reps)?),
        Err(e) => {
            println!("kvq: skipped ({e})");
            None
        }
    };
    print_lossless(&measured.lossless, chunk_tokens, repeat);
    if let Some(k) = &kvq {
        print_kvq(k);
    }
    println!(
        "every number above is measured in this run; full tables: kvc bench codec, kvc bench quant"
    );
    println!(
        "quality in the engine (perplexity and KL against f16 in llama.cpp): docs/llama-cpp.md"
    );
    if let Some(path) = codec::json_path(&args) {
        let summary = json!({
            "source": data.source,
            "lossless": measured.lossless,
            "kvq": kvq,
            "engine_quality": "docs/llama-cpp.md",
        });
        let path = path.to_path_buf();
        measured.write_json(&path, Some(summary))?;
    }
    Ok(())
}
