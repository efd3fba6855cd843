//! `kvc bench store`: a simulated decode over real KV dumps with and without
//! kvc-store-async. Each step appends one token to every layer, lets the store compress
//! what became cold, restores each layer before a stand-in attention (one query per KV
//! head: scores, softmax, weighted V) and times the step. A plain kvc-owned cache (the
//! baseline) runs in lockstep with one store per codec (`--codec`: gear-v1, gear-v2,
//! c8-gear-v1, c8-gear-v2), each with the default configuration (restored chunks released
//! after each attention), and with the first codec once more under MNN's decode cache
//! (`--decode-cache N`, 0 skips it). At the end of the run (the steady state: every step
//! ends the same way) and again after evicting every restored chunk it measures resident
//! memory with `mincore` and reports bytes released gross and net, the codec's ideal
//! saving, restore latency per chunk, async headroom, cache hits and fallbacks; the lossy
//! C8 codecs also report their error.
//!
//! Dumps shorter than `--steps` tokens are read cyclically (token `s % n_tokens`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use kvc_cache::{KvLayout, OwnedCache};
use kvc_codec::gear_v1::EncodeOptions;
use kvc_int8::{calibrate, C8Params, LayerQuant};
use kvc_store_async::{
    C8Codec, ChunkStatus, GearV1Codec, GearV2Codec, Store, StoreCodec, StoreConfig, StoreMetrics,
};
use kvc_types::Dtype;
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
    /// Store codecs to run, comma-separated: gear-v1, gear-v2, c8-gear-v1, c8-gear-v2.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gear-v1,gear-v2,c8-gear-v1,c8-gear-v2"
    )]
    pub codec: Vec<String>,
    /// Also run the first codec with MNN's decode cache of this many chunks (both LRUs),
    /// restored chunks kept resident between steps; 0 skips that run.
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

fn to_f32(dtype: Dtype, b: &[u8]) -> f32 {
    let bits = u16::from_le_bytes([b[0], b[1]]);
    match dtype {
        Dtype::Bf16 => half::bf16::from_bits(bits).to_f32(),
        _ => half::f16::from_bits(bits).to_f32(),
    }
}

/// The stand-in attention over `len` tokens of a row-major layer; returns a checksum.
fn attend(
    dtype: Dtype,
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
    name: String,
    lossy: bool,
    keeps_decoded: bool,
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
        Dtype::Bf16
    } else {
        Dtype::F16
    };
    let layout = KvLayout::llama(cdt, heads, dim, dim, a.steps, false).map_err(lib)?;
    let layouts = vec![layout; layers];
    let cfg = StoreConfig {
        async_threads: a.threads,
        ..StoreConfig::default()
    };
    let cached = StoreConfig {
        layer_cache_capacity: a.decode_cache,
        global_cache_capacity: a.decode_cache,
        evict_after_attention: false,
        ..cfg
    };
    if a.codec.is_empty() {
        return Err(CliError::input("--codec: name at least one codec"));
    }
    let mut c8: Option<C8Params> = None;
    let mut codecs: Vec<Arc<dyn StoreCodec>> = Vec::new();
    for name in &a.codec {
        let mut params = || -> Result<C8Params, CliError> {
            if c8.is_none() {
                c8 = Some(c8_params(kd, vd, &layout)?);
            }
            Ok(c8.clone().unwrap_or_default())
        };
        codecs.push(match name.as_str() {
            "gear-v1" => Arc::new(GearV1Codec::new(EncodeOptions::default()).map_err(lib)?),
            "gear-v2" => Arc::new(GearV2Codec::default()),
            "c8-gear-v1" => {
                Arc::new(C8Codec::gear_v1(params()?, EncodeOptions::default()).map_err(lib)?)
            }
            "c8-gear-v2" => Arc::new(C8Codec::gear_v2(params()?)),
            other => {
                return Err(CliError::input(format!(
                    "--codec {other:?}: expected gear-v1, gear-v2, c8-gear-v1 or c8-gear-v2"
                )))
            }
        });
    }
    let mut base = OwnedCache::new(&layouts).map_err(lib)?;
    let mut runs: Vec<(Arc<dyn StoreCodec>, StoreConfig)> =
        codecs.iter().map(|c| (c.clone(), cfg)).collect();
    if a.decode_cache > 0 {
        runs.push((codecs[0].clone(), cached));
    }
    let mut variants = Vec::new();
    for (codec, c) in runs {
        let keeps_decoded = !c.evict_after_attention;
        let name = if keeps_decoded {
            format!("{} dc{}", codec.name(), a.decode_cache)
        } else {
            codec.name()
        };
        variants.push(Variant {
            name,
            lossy: !codec.is_lossless(),
            keeps_decoded,
            store: Store::new(c, &layouts, codec).map_err(lib)?,
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
            // Bit-exactness against the baseline, outside the timed part: every 64th
            // step, every layer holding chunks is restored and its chunks compared.
            if step % 64 != 0 && step + 1 != a.steps {
                continue;
            }
            for l in 0..layers {
                let held: Vec<_> = var
                    .store
                    .chunks(l)
                    .map_err(lib)?
                    .into_iter()
                    .filter(|c| matches!(c.status, ChunkStatus::Stored | ChunkStatus::Resident))
                    .collect();
                if held.is_empty() {
                    continue;
                }
                let (bk, bv) = base.layer(l).ok_or_else(|| lib("layer"))?;
                let ((), _) = var
                    .store
                    .with_layer(l, |kb, vb| {
                        for c in &held {
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
    let (cb, ce) = cfg.cold_range(a.steps);
    let in_scope = (0..layers).filter(|&l| cfg.in_scope(l)).count();
    // Every in-scope layer holds all steps' tokens: the same cold range each.
    let cold = (in_scope * (ce - cb) * row * 2) as u64;
    let mut reports = serde_json::Map::new();
    for var in &variants {
        // The steady state: the end of the last step, as every step ends.
        let steady: StoreMetrics = var.store.metrics().map_err(lib)?;
        let t0 = Instant::now();
        var.store.wait_idle().map_err(lib)?;
        let wait_us = t0.elapsed().as_micros() as u64;
        var.store.evict_decoded(None).map_err(lib)?;
        let m: StoreMetrics = var.store.metrics().map_err(lib)?;
        let ideal = m.stored_raw_bytes.saturating_sub(m.blob_bytes);
        let released = |x: &StoreMetrics| {
            let held = x.blob_bytes + x.metadata_bytes + x.in_flight_bytes;
            let gross = base_resident.saturating_sub(x.cache_resident_bytes);
            let net = gross as i64 - held as i64;
            json!({
                "decode_cache_resident_chunks": x.decode_cache_resident,
                "cache_resident_bytes": x.cache_resident_bytes,
                "held_bytes": held,
                "gross_released_bytes": gross,
                "net_released_bytes": net,
                "net_released_pct_of_cold": 100.0 * net as f64 / cold.max(1) as f64,
                "net_pct_of_ideal": 100.0 * net as f64 / ideal.max(1) as f64,
            })
        };
        let (steady_v, evicted_v) = (released(&steady), released(&m));
        let mut err = (0u64, 0f64, 0f64, 0f64);
        if var.lossy {
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
        // Worker time left over while decoding: positive means compression never held
        // the decode back (the spec's async wait headroom).
        let capacity_us = var.step_s * 1e6 * a.threads as f64;
        let headroom_us = capacity_us - steady.compress_us_total as f64;
        let pick = |k: &str| evicted_v[k].clone();
        let mut v = json!({
            "codec": m.codec,
            "decode_cache": if var.keeps_decoded { json!(a.decode_cache) } else { json!("evict after attention") },
            "cold_bytes": cold,
            "stored_raw_bytes": m.stored_raw_bytes,
            "blob_bytes": m.blob_bytes,
            "metadata_bytes": m.metadata_bytes,
            "gross_released_bytes": pick("gross_released_bytes"),
            "net_released_bytes": pick("net_released_bytes"),
            "net_released_pct_of_cold": pick("net_released_pct_of_cold"),
            "net_pct_of_ideal": pick("net_pct_of_ideal"),
            "codec_ratio": m.lossless_ratio,
            "ideal_saving_bytes": ideal,
            "ideal_saving_pct": 100.0 * ideal as f64 / m.stored_raw_bytes.max(1) as f64,
            "steady_state": steady_v,
            "decode_cache_evicted": evicted_v,
            "restore_us_p50": m.group_restore_us_p50,
            "restore_us_p99": m.group_restore_us_p99,
            "restore_chunk_tokens": cfg.group_tokens,
            "group_restores": m.group_restores,
            "restore_us_p50_all_chunks": m.restore_us_p50,
            "restore_us_p99_all_chunks": m.restore_us_p99,
            "restore_us_max_all_chunks": m.restore_us_max,
            "async_headroom_us": headroom_us,
            "async_headroom_ratio": headroom_us / capacity_us.max(1.0),
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
        reports.insert(var.name.clone(), v);
    }
    let first = variants.first().map(|v| v.name.clone()).unwrap_or_default();
    out["store"] = reports.get(&first).cloned().unwrap_or(Value::Null);
    out["order"] = json!(variants.iter().map(|v| v.name.clone()).collect::<Vec<_>>());
    out["variants"] = Value::Object(reports);
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
        "  {:<17} {:>9} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8}",
        "codec",
        "cold B",
        "ratio",
        "ideal%",
        "gross%",
        "net%",
        "net%idl",
        "evct%",
        "evct%i",
        "rest p50",
        "rest p99",
        "headrm",
        "step ms",
        "base ms"
    );
    let empty = Vec::new();
    for name in r["order"].as_array().unwrap_or(&empty) {
        let s = &r["variants"][name.as_str().unwrap_or("")];
        let f = |v: &Value| v.as_f64().unwrap_or(0.0);
        let cold = f(&s["cold_bytes"]).max(1.0);
        let (st, ev) = (&s["steady_state"], &s["decode_cache_evicted"]);
        println!(
            "  {:<17} {:>9} {:>6.3} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>8.0} {:>8.0} {:>7.2} {:>8.3} {:>8.3}",
            name.as_str().unwrap_or(""),
            s["cold_bytes"],
            f(&s["codec_ratio"]),
            f(&s["ideal_saving_pct"]),
            100.0 * f(&st["gross_released_bytes"]) / cold,
            f(&st["net_released_pct_of_cold"]),
            f(&st["net_pct_of_ideal"]),
            f(&ev["net_released_pct_of_cold"]),
            f(&ev["net_pct_of_ideal"]),
            f(&s["restore_us_p50"]),
            f(&s["restore_us_p99"]),
            f(&s["async_headroom_ratio"]),
            f(&s["step_ms"]),
            f(&s["step_ms_baseline"]),
        );
        println!(
            "  {:<17} restores {} ({} of {}-token chunks), bit-exact {}/{} compared, decode cache hits {} misses {}, fallbacks {}, skips {}, queue peak {}",
            "",
            s["restores"],
            s["group_restores"],
            s["restore_chunk_tokens"],
            s["restores_bit_exact"],
            s["restores_compared"],
            s["decode_cache_hits"],
            s["decode_cache_misses"],
            s["fallbacks"],
            s["backpressure_skips"],
            s["queue_peak"]
        );
        if let Some(e) = s.get("c8_error") {
            println!(
                "  {:<17} C8 error on stored tokens: max abs {:.4}, RMS {:.4e}, SNR {:.2} dB",
                "",
                f(&e["max_abs"]),
                f(&e["rms"]),
                f(&e["snr_db"])
            );
        }
    }
    println!(
        "  ideal% = 1 - 1/ratio; gross%/net% = released / cold bytes in the steady state (end of a step); net%idl = net / ideal; evct = after evicting every restored chunk; rest = restore of one {}-token chunk (K+V) in us; headrm = worker time left over",
        r["store"]["restore_chunk_tokens"]
    );
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
            codec: vec!["gear-v1".into(), "c8-gear-v2".into()],
            decode_cache: 4,
            json: None,
        };
        let r = measure(&a).unwrap();
        let s = &r["store"];
        assert_eq!(s["codec"], "gear-v1");
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
        // Released after attention: the steady state holds no restored chunk.
        assert_eq!(s["steady_state"]["decode_cache_resident_chunks"], 0);
        assert_eq!(
            s["steady_state"]["net_released_bytes"],
            s["net_released_bytes"]
        );
        assert!(s["group_restores"].as_u64().unwrap() > 0);
        let c8 = &r["variants"]["c8+gear-v2"];
        assert!(c8["c8_error"]["snr_db"].as_f64().unwrap() > 20.0);
        assert!(c8["codec_ratio"].as_f64().unwrap() > 1.5);
        // MNN's decode cache keeps what it restored.
        let dc = &r["variants"]["gear-v1 dc4"];
        assert!(
            dc["steady_state"]["decode_cache_resident_chunks"]
                .as_u64()
                .unwrap()
                > 0
        );
        assert!(dc["decode_cache_hits"].as_u64().unwrap() > 0);
        let unknown = BenchStoreArgs {
            codec: vec!["zstd".into()],
            ..a.clone()
        };
        assert!(measure(&unknown).is_err());
        let bad = BenchStoreArgs {
            dtype: "f32".into(),
            ..a
        };
        assert!(measure(&bad).is_err());
    }
}
