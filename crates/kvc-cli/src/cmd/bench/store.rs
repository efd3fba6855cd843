//! `kvc bench store`: a simulated decode over real KV dumps with and without
//! kvc-store-async. Each step appends one token to every layer, lets the store compress
//! what became cold, restores each layer before a stand-in attention (one query per KV
//! head: scores, softmax, weighted V) and times the step. Three caches run in lockstep:
//! a plain kvc-owned cache (the baseline), the store with gear-v1, and the store with
//! C8 + gear-v1. At the end it measures resident memory with `mincore` and reports bytes
//! released gross and net, the codec ratio, restore latency, cache hits and fallbacks.
//!
//! Dumps shorter than `--steps` tokens are read cyclically (token `s % n_tokens`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use kvc_cache::quant::{calibrate, C8Params, LayerQuant};
use kvc_cache::{DType, KvLayout, OwnedCache};
use kvc_codec::gear_v1::EncodeOptions;
use kvc_codec::Dtype;
use kvc_store_async::{
    C8GearV1Codec, ChunkStatus, GearV1Codec, Store, StoreCodec, StoreConfig, StoreMetrics,
};
use serde_json::{json, Value};

use super::dataset::{self, Dataset, Dump};
use crate::cli_error::CliError;

/// `kvc bench store` arguments.
#[derive(Args, Clone, Debug)]
pub struct BenchStoreArgs {
    /// KV dumps; default `KVC_REALKV_DIR`, then `../shared/data/realkv`, then the
    /// embedded sample.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Decode steps.
    #[arg(long, default_value_t = 2048)]
    pub steps: usize,
    /// Element type of the dumps to use: f16 or bf16.
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// Worker threads of the store.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Capacity of both decode-cache LRUs (restored chunks kept resident).
    #[arg(long = "decode-cache", default_value_t = 64)]
    pub decode_cache: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn lib(e: impl std::fmt::Display) -> CliError {
    CliError::input(e)
}

fn load(a: &BenchStoreArgs) -> Result<Dataset, CliError> {
    match &a.data {
        Some(d) => dataset::load_dir(d),
        None => {
            let d = super::cache::default_data_dir();
            if d.join("textA.K.f16.json").is_file() && d != std::path::Path::new("data/sample") {
                dataset::load_dir(&d)
            } else {
                dataset::embedded()
            }
        }
    }
}

fn to_f32(dtype: DType, b: &[u8]) -> f32 {
    let bits = u16::from_le_bytes([b[0], b[1]]);
    match dtype {
        DType::BF16 => half::bf16::from_bits(bits).to_f32(),
        _ => half::f16::from_bits(bits).to_f32(),
    }
}

/// The stand-in attention over `len` tokens of a row-major layer; returns a checksum.
fn attend(
    dtype: DType,
    heads: usize,
    dim: usize,
    k: &[u8],
    v: &[u8],
    len: usize,
    q: &[f32],
) -> f64 {
    let es = 2;
    let row = heads * dim * es;
    let mut sum = 0.0f64;
    let mut scores = vec![0f32; len];
    let mut kf = vec![0f32; dim];
    for h in 0..heads {
        let qh = &q[h * dim..(h + 1) * dim];
        let mut max = f32::NEG_INFINITY;
        for (t, s) in scores.iter_mut().enumerate() {
            let base = t * row + h * dim * es;
            for (d, x) in kf.iter_mut().enumerate() {
                *x = to_f32(dtype, &k[base + d * es..]);
            }
            *s = kf.iter().zip(qh).map(|(a, b)| a * b).sum::<f32>() * 0.125;
            max = max.max(*s);
        }
        let mut z = 0.0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            z += *s;
        }
        let mut out = vec![0f32; dim];
        for (t, &p) in scores.iter().enumerate() {
            let base = t * row + h * dim * es;
            for (d, o) in out.iter_mut().enumerate() {
                *o += p / z * to_f32(dtype, &v[base + d * es..]);
            }
        }
        sum += out.iter().map(|&x| f64::from(x)).sum::<f64>();
    }
    sum
}

struct Variant {
    name: &'static str,
    store: Store,
    step_s: f64,
    restore_calls: u64,
    bit_exact: u64,
    compared: u64,
    checksum: f64,
}

fn c8_params(k: &Dump, v: &Dump, layout: &KvLayout) -> Result<C8Params, CliError> {
    let mut p = C8Params::new();
    let cal = layout.k.with_dtype(layout.k.dtype()).map_err(lib)?;
    let n = k.n_tokens.min(cal.capacity());
    for l in 0..k.n_layer {
        let mut kb = vec![0u8; cal.byte_len()];
        kb[..n * k.token_bytes()].copy_from_slice(&k.layer(l)[..n * k.token_bytes()]);
        let mut vb = vec![0u8; cal.byte_len()];
        vb[..n * v.token_bytes()].copy_from_slice(&v.layer(l)[..n * v.token_bytes()]);
        p.insert(
            l,
            LayerQuant {
                k: calibrate(&kb, &cal, 0..n, false).map_err(lib)?,
                v: calibrate(&vb, &layout.v, 0..n, false).map_err(lib)?,
            },
        )
        .map_err(lib)?;
    }
    Ok(p)
}

/// Runs the bench and returns its report.
pub fn measure(a: &BenchStoreArgs) -> Result<Value, CliError> {
    let dtype = match a.dtype.as_str() {
        "f16" => Dtype::F16,
        "bf16" => Dtype::Bf16,
        other => {
            return Err(CliError::input(format!(
                "--dtype {other:?}: expected f16 or bf16"
            )))
        }
    };
    if a.steps == 0 {
        return Err(CliError::input("--steps must be at least 1"));
    }
    let ds = load(a)?;
    let find = |t: &str| {
        ds.dumps
            .iter()
            .find(|d| d.tensor == t && d.dtype == dtype)
            .ok_or_else(|| CliError::input(format!("{}: no {t} dump in {dtype}", ds.source)))
    };
    let (kd, vd) = (find("K")?, find("V")?);
    if (kd.n_layer, kd.n_tokens, kd.n_kv_head, kd.head_dim)
        != (vd.n_layer, vd.n_tokens, vd.n_kv_head, vd.head_dim)
    {
        return Err(CliError::input("K and V dumps differ in shape"));
    }
    let (layers, heads, dim) = (kd.n_layer, kd.n_kv_head, kd.head_dim);
    let cdt = if dtype == Dtype::Bf16 {
        DType::BF16
    } else {
        DType::F16
    };
    let layout = KvLayout::llama(cdt, heads, dim, dim, a.steps, false).map_err(lib)?;
    let layouts = vec![layout; layers];
    let cfg = StoreConfig {
        async_threads: a.threads,
        layer_cache_capacity: a.decode_cache,
        global_cache_capacity: a.decode_cache,
        ..StoreConfig::default()
    };
    let gear: Arc<dyn StoreCodec> =
        Arc::new(GearV1Codec::new(EncodeOptions::default()).map_err(lib)?);
    let c8: Arc<dyn StoreCodec> = Arc::new(
        C8GearV1Codec::new(c8_params(kd, vd, &layout)?, EncodeOptions::default()).map_err(lib)?,
    );
    let mut base = OwnedCache::new(&layouts).map_err(lib)?;
    let mut variants = Vec::new();
    for (name, codec) in [("store", gear), ("store_c8", c8)] {
        variants.push(Variant {
            name,
            store: Store::new(cfg, &layouts, codec).map_err(lib)?,
            step_s: 0.0,
            restore_calls: 0,
            bit_exact: 0,
            compared: 0,
            checksum: 0.0,
        });
    }
    let q: Vec<Vec<f32>> = (0..layers)
        .map(|l| {
            (0..heads * dim)
                .map(|i| (((i * 37 + l * 11) % 23) as f32 - 11.0) / 11.0)
                .collect()
        })
        .collect();
    let row = kd.token_bytes();
    let mut base_s = 0.0f64;
    let mut checksum_base = 0.0f64;
    for step in 0..a.steps {
        let src = step % kd.n_tokens;
        let len = step + 1;
        // Baseline: append and attend on a plain kvc-owned cache.
        let t0 = Instant::now();
        for (l, ql) in q.iter().enumerate() {
            let krow = &kd.layer(l)[src * row..(src + 1) * row];
            let vrow = &vd.layer(l)[src * row..(src + 1) * row];
            let mut lm = base.layer_mut(l).map_err(lib)?;
            let (kb, vb) = lm.kv_mut();
            kb[step * row..len * row].copy_from_slice(krow);
            vb[step * row..len * row].copy_from_slice(vrow);
            let (kb, vb) = base.layer(l).ok_or_else(|| lib("layer"))?;
            checksum_base += attend(cdt, heads, dim, kb, vb, len, ql);
        }
        base_s += t0.elapsed().as_secs_f64();
        for var in &mut variants {
            let t0 = Instant::now();
            var.store.poll().map_err(lib)?;
            for (l, ql) in q.iter().enumerate() {
                let krow = &kd.layer(l)[src * row..(src + 1) * row];
                let vrow = &vd.layer(l)[src * row..(src + 1) * row];
                var.store.append_tokens(l, krow, vrow).map_err(lib)?;
                var.store.schedule(l).map_err(lib)?;
                let (c, st) = var
                    .store
                    .with_layer(l, |kb, vb| attend(cdt, heads, dim, kb, vb, len, ql))
                    .map_err(lib)?;
                var.checksum += c;
                if st.decoded > 0 {
                    var.restore_calls += 1;
                }
            }
            var.step_s += t0.elapsed().as_secs_f64();
            // Bit-exactness against the baseline, outside the timed part: every layer
            // whose chunks were restored this step.
            for l in 0..layers {
                let chunks = var.store.chunks(l).map_err(lib)?;
                let restored: Vec<_> = chunks
                    .iter()
                    .filter(|c| c.status == ChunkStatus::Resident)
                    .collect();
                if restored.is_empty() || step % 64 != 0 && step + 1 != a.steps {
                    continue;
                }
                let (bk, bv) = base.layer(l).ok_or_else(|| lib("layer"))?;
                let ((), _) = var
                    .store
                    .with_layer(l, |kb, vb| {
                        for c in &restored {
                            var.compared += 1;
                            let r = c.start * row..(c.start + c.count) * row;
                            if kb[r.clone()] == bk[r.clone()] && vb[r.clone()] == bv[r] {
                                var.bit_exact += 1;
                            }
                        }
                    })
                    .map_err(lib)?;
            }
        }
    }
    let base_resident = base.resident_bytes().map_err(lib)? as u64;
    let mut out = json!({
        "bench": "store",
        "data": ds.source,
        "dtype": dtype.name(),
        "steps": a.steps,
        "layers": layers,
        "kv_heads": heads,
        "head_dim": dim,
        "config": cfg,
        "baseline": {
            "step_ms": base_s * 1e3 / a.steps as f64,
            "resident_bytes": base_resident,
            "checksum": checksum_base,
        },
    });
    for var in &variants {
        let t0 = Instant::now();
        var.store.wait_idle().map_err(lib)?;
        let wait_us = t0.elapsed().as_micros() as u64;
        let working: StoreMetrics = var.store.metrics().map_err(lib)?;
        var.store.evict_decoded(None).map_err(lib)?;
        let m: StoreMetrics = var.store.metrics().map_err(lib)?;
        // Every in-scope layer holds all steps' tokens: the same cold range each.
        let (cb, ce) = cfg.cold_range(a.steps);
        let in_scope = (0..layers).filter(|&l| cfg.in_scope(l)).count();
        let cold = (in_scope * (ce - cb) * row * 2) as u64;
        let held = m.blob_bytes + m.metadata_bytes + m.in_flight_bytes;
        let gross = base_resident.saturating_sub(m.cache_resident_bytes);
        let net = gross as i64 - held as i64;
        let gross_w = base_resident.saturating_sub(working.cache_resident_bytes);
        let net_w = gross_w as i64 - held as i64;
        let ideal = m.stored_raw_bytes.saturating_sub(m.blob_bytes);
        let mut err = (0u64, 0f64, 0f64, 0f64);
        if var.name == "store_c8" {
            for l in 0..layers {
                let (bk, bv) = base.layer(l).ok_or_else(|| lib("layer"))?;
                let (rk, rv) = var.store.read_tokens(l, 0, a.steps).map_err(lib)?;
                for c in var.store.chunks(l).map_err(lib)? {
                    let r = c.start * row..(c.start + c.count) * row;
                    for (x, y) in [(&bk[r.clone()], &rk[r.clone()]), (&bv[r.clone()], &rv[r])] {
                        for (a2, b2) in x.chunks_exact(2).zip(y.chunks_exact(2)) {
                            let (a2, b2) = (to_f32(cdt, a2), to_f32(cdt, b2));
                            let e = f64::from(b2 - a2);
                            err.0 += 1;
                            err.1 = err.1.max(e.abs());
                            err.2 += e * e;
                            err.3 += f64::from(a2) * f64::from(a2);
                        }
                    }
                }
            }
            var.store.evict_decoded(None).map_err(lib)?;
        }
        let mut v = json!({
            "codec": m.codec,
            "cold_bytes": cold,
            "stored_raw_bytes": m.stored_raw_bytes,
            "blob_bytes": m.blob_bytes,
            "metadata_bytes": m.metadata_bytes,
            "gross_released_bytes": gross,
            "net_released_bytes": net,
            "net_released_pct_of_cold": 100.0 * net as f64 / cold.max(1) as f64,
            "codec_ratio": m.lossless_ratio,
            "ideal_saving_bytes": ideal,
            "net_pct_of_ideal": 100.0 * net as f64 / ideal.max(1) as f64,
            "working_set": {
                "decode_cache_resident_chunks": working.decode_cache_resident,
                "cache_resident_bytes": working.cache_resident_bytes,
                "gross_released_bytes": gross_w,
                "net_released_bytes": net_w,
            },
            "restore_us_p50": m.restore_us_p50,
            "restore_us_p99": m.restore_us_p99,
            "restore_us_max": m.restore_us_max,
            "restore_chunk_tokens": cfg.group_tokens,
            "fallbacks": m.fallbacks,
            "backpressure_skips": m.backpressure_skips,
            "decode_cache_hits": m.decode_cache_hits,
            "decode_cache_misses": m.decode_cache_misses,
            "restores": m.restores,
            "restores_compared": var.compared,
            "restores_bit_exact": var.bit_exact,
            "queue_peak": m.queue_peak,
            "final_wait_us": wait_us,
            "step_ms": var.step_s * 1e3 / a.steps as f64,
            "step_ms_baseline": base_s * 1e3 / a.steps as f64,
            "checksum": var.checksum,
            "metrics": m,
        });
        if err.0 > 0 {
            v["c8_error"] = json!({
                "values": err.0,
                "max_abs": err.1,
                "rms": (err.2 / err.0 as f64).sqrt(),
                "snr_db": 10.0 * (err.3 / err.2).log10(),
            });
        }
        out[var.name] = v;
    }
    Ok(out)
}

/// Runs `kvc bench store`.
pub fn run(a: &BenchStoreArgs) -> Result<(), CliError> {
    let r = measure(a)?;
    println!(
        "store bench: {} ({}), {} steps, {} layers; baseline step {:.3} ms, resident {} B",
        r["data"].as_str().unwrap_or(""),
        r["dtype"].as_str().unwrap_or(""),
        r["steps"],
        r["layers"],
        r["baseline"]["step_ms"].as_f64().unwrap_or(0.0),
        r["baseline"]["resident_bytes"]
    );
    println!(
        "  {:<12} {:>10} {:>7} {:>11} {:>11} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6} {:>9}",
        "codec",
        "cold B",
        "ratio",
        "gross B",
        "net B",
        "net%cold",
        "net%idl",
        "rest p50",
        "rest p99",
        "fallbk",
        "skips",
        "step ms"
    );
    for k in ["store", "store_c8"] {
        let s = &r[k];
        println!(
            "  {:<12} {:>10} {:>7.3} {:>11} {:>11} {:>8.1} {:>8.1} {:>9.0} {:>9.0} {:>6} {:>6} {:>9.3}",
            s["codec"].as_str().unwrap_or(""),
            s["cold_bytes"],
            s["codec_ratio"].as_f64().unwrap_or(0.0),
            s["gross_released_bytes"],
            s["net_released_bytes"],
            s["net_released_pct_of_cold"].as_f64().unwrap_or(0.0),
            s["net_pct_of_ideal"].as_f64().unwrap_or(0.0),
            s["restore_us_p50"].as_f64().unwrap_or(0.0),
            s["restore_us_p99"].as_f64().unwrap_or(0.0),
            s["fallbacks"],
            s["backpressure_skips"],
            s["step_ms"].as_f64().unwrap_or(0.0)
        );
        println!(
            "  {:<12} restores {} (bit-exact {}/{} compared), decode cache hits {} misses {}; while decoding: {} chunks resident, net {} B",
            "",
            s["restores"],
            s["restores_bit_exact"],
            s["restores_compared"],
            s["decode_cache_hits"],
            s["decode_cache_misses"],
            s["working_set"]["decode_cache_resident_chunks"],
            s["working_set"]["net_released_bytes"]
        );
        if let Some(e) = s.get("c8_error") {
            println!(
                "  {:<12} C8 error on stored tokens: max abs {:.4}, RMS {:.4e}, SNR {:.2} dB",
                "",
                e["max_abs"].as_f64().unwrap_or(0.0),
                e["rms"].as_f64().unwrap_or(0.0),
                e["snr_db"].as_f64().unwrap_or(0.0)
            );
        }
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
    fn sample_run_reports_every_field_and_restores_bit_exact() {
        // 680 steps: the bootstrap chunk and one group of 384 become cold (a bootstrap
        // chunk alone frees fewer pages than its blob holds).
        let a = BenchStoreArgs {
            data: None,
            steps: 680,
            dtype: "f16".into(),
            threads: 2,
            decode_cache: 4,
            json: None,
        };
        let r = measure(&a).unwrap();
        let s = &r["store"];
        for k in [
            "cold_bytes",
            "gross_released_bytes",
            "net_released_bytes",
            "codec_ratio",
            "restore_us_p50",
            "restore_us_p99",
            "fallbacks",
            "backpressure_skips",
            "decode_cache_hits",
            "decode_cache_misses",
            "restores",
            "restores_bit_exact",
        ] {
            assert!(s.get(k).is_some(), "missing {k}");
        }
        assert_eq!(s["fallbacks"], 0);
        assert!(s["restores"].as_u64().unwrap() > 0);
        assert!(s["restores_compared"].as_u64().unwrap() > 0);
        assert_eq!(s["restores_bit_exact"], s["restores_compared"]);
        assert!(s["net_released_bytes"].as_i64().unwrap() > 0);
        assert!(r["store_c8"]["c8_error"]["snr_db"].as_f64().unwrap() > 20.0);
        let bad = BenchStoreArgs {
            dtype: "f32".into(),
            ..a
        };
        assert!(measure(&bad).is_err());
    }
}
