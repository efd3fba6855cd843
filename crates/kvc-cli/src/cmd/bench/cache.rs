//! `kvc bench cache`: what kvc-cache costs and keeps. Compaction GB/s on a large cache
//! (default 32 layers x 8k tokens, Llama-3-8B's 8 KV heads x 128), C8 quantize /
//! dequantize GB/s, and C8 error (max abs, RMS, SNR) per layer on real KV data.
//!
//! [`measure`] returns the same numbers as JSON for a combined report.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use kvc_cache::{compact_shared, Addressing, KvLayout, OwnedCache, ReservePlan, TensorLayout};
use kvc_int8::{calibrate, dequantize, quant_error, quantize};
use kvc_types::Dtype;
use serde_json::{json, Value};

use crate::cli_error::CliError;

/// `kvc bench cache` arguments.
#[derive(Args, Clone, Debug)]
pub struct BenchCacheArgs {
    /// Real KV dumps (`textA.{K,V}.{f16,bf16}.bin` + `.json`); default `KVC_REALKV_DIR`,
    /// then `../shared/data/realkv`, then `data/sample`.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Layers of the synthetic cache for the speed measurements.
    #[arg(long, default_value_t = 32)]
    pub layers: usize,
    /// Tokens of the synthetic cache.
    #[arg(long, default_value_t = 8192)]
    pub tokens: usize,
    /// KV heads of the synthetic cache.
    #[arg(long = "kv-heads", default_value_t = 8)]
    pub kv_heads: usize,
    /// Head dim of the synthetic cache.
    #[arg(long = "head-dim", default_value_t = 128)]
    pub head_dim: usize,
    /// Repetitions per timing (the best is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A layout (`kvc-cache`) or C8 (`kvc-int8`) error as the bench reports it.
fn lib(e: impl std::fmt::Display) -> CliError {
    CliError::input(e)
}

/// The default real-KV directory.
pub fn default_data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("KVC_REALKV_DIR") {
        return PathBuf::from(d);
    }
    let shared = Path::new("../shared/data/realkv");
    if shared.join("textA.K.f16.bin").is_file() {
        return shared.to_path_buf();
    }
    PathBuf::from("data/sample")
}

/// An H2O-like keep mask: sink 32, recent 256, and about 1 in 3.5 of the 64-token
/// blocks between (deterministic).
fn h2o_like_plan(len: usize) -> ReservePlan {
    let mut keep = vec![false; len];
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for (b, blk) in keep.chunks_mut(64).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = x % 7 < 2 || b == 0;
        blk.iter_mut().for_each(|m| *m = k);
    }
    keep.iter_mut().take(32).for_each(|m| *m = true);
    let r = len.saturating_sub(256);
    keep[r..].iter_mut().for_each(|m| *m = true);
    ReservePlan::from_mask(&keep)
}

fn best<F: FnMut() -> Result<(), CliError>>(reps: usize, mut f: F) -> Result<f64, CliError> {
    let mut b = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        b = b.min(t.elapsed().as_secs_f64());
    }
    Ok(b)
}

fn compaction(a: &BenchCacheArgs) -> Result<Vec<Value>, CliError> {
    let (h, d, n) = (a.kv_heads, a.head_dim, a.tokens);
    let plan = h2o_like_plan(n);
    let cases: Vec<(&str, KvLayout, usize)> = vec![
        (
            "llama.cpp (V transposed)",
            KvLayout::llama(Dtype::F16, h, d, d, n, true).map_err(lib)?,
            a.layers,
        ),
        (
            "llama.cpp (V rows, flash attn)",
            KvLayout::llama(Dtype::F16, h, d, d, n, false).map_err(lib)?,
            a.layers,
        ),
        (
            "InfiniLM [H,S,D]",
            KvLayout::infinilm(Dtype::F16, h, d, n).map_err(lib)?,
            a.layers,
        ),
        // MNN's packed layout moves token by token (as MNN's moveKV): fewer layers.
        (
            "MNN packed (hP 16, lP 1, block 64)",
            KvLayout::mnn(Dtype::F16, h, d, n, 16, 1, Some(64)).map_err(lib)?,
            a.layers.min(2),
        ),
    ];
    let mut out = Vec::new();
    for (name, layout, layers) in cases {
        let mut cache = OwnedCache::uniform(layout, layers).map_err(lib)?;
        for mut l in cache.layers_mut().map_err(lib)? {
            let (k, v) = l.kv_mut();
            k.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            v.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i >> 3) as u8);
        }
        let secs = best(a.reps, || {
            let mut ls = cache.layers_mut().map_err(lib)?;
            compact_shared(&mut ls, &plan, None).map_err(lib)?;
            Ok(())
        })?;
        let tok_bytes = (layout.k.channels() + layout.v.channels()) * 2 * layers;
        let cache_bytes = tok_bytes * n;
        let moved: usize = plan.moves().map(|m| m.2).sum::<usize>() * tok_bytes;
        out.push(json!({
            "layout": name, "layers": layers, "tokens": n, "kept": plan.kept(),
            "cache_bytes": cache_bytes, "moved_bytes": moved, "seconds": secs,
            "cache_gb_per_s": cache_bytes as f64 / secs / 1e9,
            "moved_gb_per_s": moved as f64 / secs / 1e9,
        }));
    }
    Ok(out)
}

fn quant_speed(a: &BenchCacheArgs) -> Result<Vec<Value>, CliError> {
    let layers = a.layers.min(8);
    let mut out = Vec::new();
    for (name, addr) in [
        ("rows (llama.cpp K)", Addressing::CellRows),
        ("columns (llama V transposed)", Addressing::CellColumns),
    ] {
        for dt in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
            let l = TensorLayout::new(addr, dt, a.kv_heads, a.head_dim, a.tokens).map_err(lib)?;
            let li = l.with_dtype(Dtype::I8).map_err(lib)?;
            let mut src = vec![0u8; l.byte_len()];
            let mut x = 1u32;
            for c in src.chunks_exact_mut(dt.size()) {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let v = ((x >> 8) as f32 / (1 << 24) as f32 - 0.5) * 4.0;
                match dt {
                    Dtype::F16 => c.copy_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                    Dtype::Bf16 => c.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                    _ => c.copy_from_slice(&v.to_le_bytes()),
                }
            }
            let q = calibrate(&src, &l, 0..a.tokens, false).map_err(lib)?;
            let mut i8buf = vec![0u8; li.byte_len()];
            let mut back = vec![0u8; l.byte_len()];
            let qs = best(a.reps, || {
                for _ in 0..layers {
                    quantize(&src, &l, &mut i8buf, &li, 0..a.tokens, &q).map_err(lib)?;
                }
                Ok(())
            })?;
            let ds = best(a.reps, || {
                for _ in 0..layers {
                    dequantize(&i8buf, &li, &mut back, &l, 0..a.tokens, &q).map_err(lib)?;
                }
                Ok(())
            })?;
            let bytes = (l.byte_len() * layers) as f64;
            out.push(json!({
                "layout": name, "dtype": dt.name(), "float_bytes": bytes,
                "quantize_gb_per_s": bytes / qs / 1e9, "dequantize_gb_per_s": bytes / ds / 1e9,
            }));
        }
    }
    Ok(out)
}

/// A dump's bytes and its `[layer, token, head, dim]` shape.
type Dump = (Vec<u8>, [usize; 4]);

fn read_dump(dir: &Path, t: &str, dt: &str) -> Result<Option<Dump>, CliError> {
    let bin = dir.join(format!("textA.{t}.{dt}.bin"));
    let js = dir.join(format!("textA.{t}.{dt}.json"));
    if !bin.is_file() {
        return Ok(None);
    }
    let meta: Value =
        serde_json::from_slice(&std::fs::read(&js).map_err(|e| CliError::io(&js, e))?)
            .map_err(|e| CliError::input(format!("{}: {e}", js.display())))?;
    let s: Vec<usize> = meta["shape"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64().map(|x| x as usize))
                .collect()
        })
        .unwrap_or_default();
    if s.len() != 4 {
        return Err(CliError::input(format!(
            "{}: shape is not [layer, token, head, dim]",
            js.display()
        )));
    }
    let raw = std::fs::read(&bin).map_err(|e| CliError::io(&bin, e))?;
    let want = s.iter().try_fold(2usize, |a, &x| a.checked_mul(x));
    if want != Some(raw.len()) {
        return Err(CliError::input(format!(
            "{}: {} bytes, shape {:?} says {:?}",
            bin.display(),
            raw.len(),
            s,
            want
        )));
    }
    Ok(Some((raw, [s[0], s[1], s[2], s[3]])))
}

fn c8_error(dir: &Path) -> Result<Vec<Value>, CliError> {
    let mut out = Vec::new();
    for dtn in ["f16", "bf16"] {
        let dt = if dtn == "f16" {
            Dtype::F16
        } else {
            Dtype::Bf16
        };
        for t in ["K", "V"] {
            let Some((raw, [layers, tokens, heads, dim])) = read_dump(dir, t, dtn)? else {
                continue;
            };
            let l = TensorLayout::new(Addressing::CellRows, dt, heads, dim, tokens).map_err(lib)?;
            for layer in 0..layers {
                let s = &raw[layer * l.byte_len()..(layer + 1) * l.byte_len()];
                let mut row = json!({"tensor": t, "dtype": dtn, "layer": layer, "tokens": tokens});
                for (key, sym) in [("sym", true), ("asym", false)] {
                    let q = calibrate(s, &l, 0..tokens, sym).map_err(lib)?;
                    let e = quant_error(s, &l, 0..tokens, &q).map_err(lib)?;
                    row[key] = json!({"max_abs": e.max_abs, "rms": e.rms(), "snr_db": e.snr_db()});
                }
                out.push(row);
            }
        }
    }
    if out.is_empty() {
        return Err(CliError::input(format!(
            "{}: no textA.{{K,V}}.{{f16,bf16}}.bin dumps",
            dir.display()
        )));
    }
    Ok(out)
}

/// Measures everything and returns it as JSON.
pub fn measure(a: &BenchCacheArgs) -> Result<Value, CliError> {
    if a.layers == 0 || a.tokens < 512 || a.kv_heads == 0 || a.head_dim == 0 {
        return Err(CliError::input(
            "bench cache: need --layers >= 1, --tokens >= 512, --kv-heads/--head-dim >= 1",
        ));
    }
    let dir = a.data.clone().unwrap_or_else(default_data_dir);
    Ok(json!({
        "compaction": compaction(a)?,
        "quant_speed": quant_speed(a)?,
        "c8_error": c8_error(&dir)?,
        "data": dir.display().to_string(),
    }))
}

/// Runs `kvc bench cache`: prints tables, optionally writes JSON.
pub fn run(a: &BenchCacheArgs) -> Result<(), CliError> {
    let r = measure(a)?;
    println!(
        "compaction (H2O-like plan, all layers, shared cells; best of {}):",
        a.reps
    );
    println!(
        "  {:<36} {:>6} {:>6} {:>6} {:>10} {:>10}",
        "layout", "layers", "tokens", "kept", "cache GB/s", "moved GB/s"
    );
    for c in r["compaction"].as_array().into_iter().flatten() {
        println!(
            "  {:<36} {:>6} {:>6} {:>6} {:>10.2} {:>10.2}",
            c["layout"].as_str().unwrap_or(""),
            c["layers"],
            c["tokens"],
            c["kept"],
            c["cache_gb_per_s"].as_f64().unwrap_or(0.0),
            c["moved_gb_per_s"].as_f64().unwrap_or(0.0)
        );
    }
    println!("C8 quantize / dequantize (GB/s of float data):");
    for c in r["quant_speed"].as_array().into_iter().flatten() {
        println!(
            "  {:<30} {:<5} quantize {:>6.2}  dequantize {:>6.2}",
            c["layout"].as_str().unwrap_or(""),
            c["dtype"].as_str().unwrap_or(""),
            c["quantize_gb_per_s"].as_f64().unwrap_or(0.0),
            c["dequantize_gb_per_s"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "C8 error per layer on {} (calibrated on the same tokens):",
        r["data"].as_str().unwrap_or("")
    );
    println!(
        "  {:<3} {:<5} {:>5}  {:>10} {:>8}  {:>10} {:>8}",
        "t", "dtype", "layer", "sym RMS", "sym SNR", "asym RMS", "asym SNR"
    );
    for c in r["c8_error"].as_array().into_iter().flatten() {
        println!(
            "  {:<3} {:<5} {:>5}  {:>10.3e} {:>8.2}  {:>10.3e} {:>8.2}",
            c["tensor"].as_str().unwrap_or(""),
            c["dtype"].as_str().unwrap_or(""),
            c["layer"],
            c["sym"]["rms"].as_f64().unwrap_or(0.0),
            c["sym"]["snr_db"].as_f64().unwrap_or(0.0),
            c["asym"]["rms"].as_f64().unwrap_or(0.0),
            c["asym"]["snr_db"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(p) = &a.json {
        let s = serde_json::to_string_pretty(&r).map_err(CliError::input)?;
        std::fs::write(p, s).map_err(|e| CliError::io(p, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_small_cache_and_the_sample() {
        let a = BenchCacheArgs {
            data: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample")),
            layers: 2,
            tokens: 512,
            kv_heads: 2,
            head_dim: 16,
            reps: 1,
            json: None,
        };
        let r = measure(&a).unwrap();
        assert_eq!(r["compaction"].as_array().unwrap().len(), 4);
        assert_eq!(r["quant_speed"].as_array().unwrap().len(), 6);
        // 4 layers x K/V x f16/bf16 in the sample.
        let e = r["c8_error"].as_array().unwrap();
        assert_eq!(e.len(), 16);
        assert!(e
            .iter()
            .all(|x| x["asym"]["snr_db"].as_f64().unwrap() > 25.0));
        let bad = BenchCacheArgs {
            tokens: 10,
            ..a.clone()
        };
        assert!(measure(&bad).is_err());
        let nodata = BenchCacheArgs {
            data: Some(PathBuf::from("/nonexistent")),
            ..a
        };
        assert!(measure(&nodata).is_err());
    }
}
