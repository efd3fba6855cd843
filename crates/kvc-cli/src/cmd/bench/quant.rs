//! `kvc bench quant`: kvq configurations on real KV. Per configuration: bits/value with
//! metadata (and the ratio to f16), SNR of K and V per layer, attention-output error
//! against f64 attention on the unquantized cache, quantize / dequantize GB/s, and one-core
//! packed decode attention time against the same kernel on an f16 cache at 4k and 32k
//! tokens, all measured in the same run.
//!
//! The per-row entry points an engine calls once per KV cell (`RowCodec::dot_rotated`,
//! `RowCodec::dequantize_row_rotated`) are timed per row for Lloyd-Max at 2-8 bits against
//! an f16 row's dot product and f16-to-f32 conversion, in the same loop.
//!
//! `kc<G>:CONFIG` entries code K per channel over groups of G tokens (KIVI,
//! `ChannelGroupCodec`) at CONFIG's K bits, V as CONFIG's rows; at a query position the
//! tokens of the unfilled group are read as the f16 cache holds them, as an engine holds
//! them, and the scores of coded tokens come from `ChannelGroupCodec::dot_block`. Their bits
//! per value count the blocks (steps and minimums included), not the f16 tail. Their
//! timings are per row: a block's scores (`dot_block`) and decode over its rows, against
//! the f16 row ops in the same run (the packed attention timing is for rows only).
//!
//! `qjl:CONFIG` entries code K as CONFIG's K rows plus the 1-bit QJL sketch of each row's
//! residual (TurboQuant-prod, `bench/qjl.rs`; `d / 8 + 2` bytes a row), V as CONFIG's rows. The
//! scores are `<q, k_row> + ` the QJL correction (the estimator, not a reconstruction);
//! the K SNR is the reconstruction's (row plus `QjlResidual::reconstruct`), beside the
//! rows' own SNR and the attention error of the same rows without the correction, so
//! whether the extra bits pay is read in one run. Timings are for row configurations only.
//!
//! The dumps hold no queries: the attention error uses the layer's own K rows of sampled
//! positions as queries (each attending to every earlier token of its head, scale
//! `1/sqrt(head_dim)`), a stand-in that is reported as such.

use std::path::PathBuf;
use std::time::Instant;

use super::qjl::QjlResidual;
use clap::Args;
use half::f16;
use kvc_kvq::attention::{attend_head, attend_head_f16, dot_f16_row, f16_row_to_f32, HeadRows};
use kvc_kvq::Isa;
use kvc_kvq::{ChannelGroupCodec, KvqConfig, LayerCodec, Method, RowCodec};
use serde_json::{json, Value};

use super::cache::default_data_dir;
use super::dataset::{embedded, load_dir, Dataset, Dump};
use crate::cli_error::CliError;

/// The configurations measured when none are given: Lloyd-Max at every K/V mix that
/// lands near ratios 2, 3.5, 5 and 8, and uniform codes for comparison.
pub const DEFAULT_CONFIGS: &str = "k8v8,k8v4,k6v4,k5v4,k5v3,k4v4,k4v3,k4v2,k3v3,k3v2,k2v2,\
k8v4:u32,k4v4:u32,k4v4:u64,k4v2:u32,k3v3:u32,k3v3:u64,k2v2:u64,\
kc64:k4v4,kc128:k4v4,kc128:k3v4,kc64:k5v5";

/// One measured configuration.
#[derive(Clone, Debug)]
enum BenchConfig {
    /// kvq rows for K and V.
    Rows(KvqConfig),
    /// K per channel over groups of `group` tokens at `cfg`'s K bits, V as `cfg`'s rows.
    Channel {
        /// Tokens per group.
        group: usize,
        /// K bits and the V rows.
        cfg: KvqConfig,
    },
    /// K as `cfg`'s K rows plus a QJL sketch of each row's residual, V as `cfg`'s rows.
    Qjl(KvqConfig),
}

impl BenchConfig {
    fn parse(s: &str) -> Result<BenchConfig, CliError> {
        if let Some(rest) = s.strip_prefix("kc") {
            let (g, c) = rest.split_once(':').ok_or_else(|| {
                CliError::input(format!(
                    "{s:?}: kc<G>:CONFIG needs a config, e.g. kc64:k4v4"
                ))
            })?;
            let group: usize = g
                .parse()
                .map_err(|_| CliError::input(format!("{s:?}: bad group {g:?}")))?;
            let cfg = KvqConfig::parse(c).map_err(lib)?;
            // the group and bits are checked here, before any data is read
            ChannelGroupCodec::new(cfg.k_bits, 64, group).map_err(lib)?;
            return Ok(BenchConfig::Channel { group, cfg });
        }
        if let Some(c) = s.strip_prefix("qjl:") {
            return Ok(BenchConfig::Qjl(KvqConfig::parse(c).map_err(lib)?));
        }
        Ok(BenchConfig::Rows(KvqConfig::parse(s).map_err(lib)?))
    }
}

/// What the attention error's queries are (the dumps hold no Q).
pub(super) const QUERIES: &str =
    "K rows of sampled positions as queries (the dumps hold no Q), causal, scale 1/sqrt(head_dim)";

/// `kvc bench quant` arguments.
#[derive(Args, Clone, Debug)]
pub struct BenchQuantArgs {
    /// KV dumps (`*.{K,V}.f16.bin` + `.json`); default `KVC_REALKV_DIR`, then
    /// `../shared/data/realkv`, then the embedded sample.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Comma-separated kvq configs (`k4v4`, `k4v2:u32`, ...), `kc<G>:CONFIG` (K per
    /// channel over G tokens) and `qjl:CONFIG` (K rows plus the QJL residual sketch).
    #[arg(long, default_value = DEFAULT_CONFIGS)]
    pub configs: String,
    /// Query positions sampled per layer and head for the attention error.
    #[arg(long, default_value_t = 24)]
    pub queries: usize,
    /// Token counts for the attention timing (comma-separated).
    #[arg(long, default_value = "4096,32768")]
    pub tokens: String,
    /// Repetitions per timing (the best is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Skip the timings (quality only).
    #[arg(long)]
    pub no_speed: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn lib(e: kvc_kvq::Error) -> CliError {
    CliError::input(e)
}

/// f32 values of an f16 dump.
fn values(d: &Dump) -> Vec<f32> {
    d.bytes
        .chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// The f16 K and V of a dataset as f32, `[n_layer][n_tokens][n_kv_head][head_dim]`.
pub(super) struct Kv {
    pub(super) n_layer: usize,
    pub(super) n_tokens: usize,
    pub(super) n_kv_head: usize,
    pub(super) head_dim: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    source: String,
}

fn load(a: &BenchQuantArgs) -> Result<Kv, CliError> {
    let ds = match &a.data {
        Some(d) => load_dir(d)?,
        None => {
            let d = default_data_dir();
            if d.join("textA.K.f16.json").is_file() {
                load_dir(&d)?
            } else {
                embedded()?
            }
        }
    };
    Kv::from_dataset(&ds)
}

impl Kv {
    /// The f16 K and V dumps of `ds`; an error when either is missing or their shapes differ.
    pub(super) fn from_dataset(ds: &Dataset) -> Result<Kv, CliError> {
        let pick = |t: &str| {
            ds.dumps
                .iter()
                .find(|d| d.tensor == t && d.dtype == kvc_codec::Dtype::F16)
                .ok_or_else(|| CliError::input(format!("{}: no f16 {t} dump", ds.source)))
        };
        let (k, v) = (pick("K")?, pick("V")?);
        if (k.n_layer, k.n_tokens, k.n_kv_head, k.head_dim)
            != (v.n_layer, v.n_tokens, v.n_kv_head, v.head_dim)
        {
            return Err(CliError::input("K and V dumps have different shapes"));
        }
        Ok(Kv {
            n_layer: k.n_layer,
            n_tokens: k.n_tokens,
            n_kv_head: k.n_kv_head,
            head_dim: k.head_dim,
            k: values(k),
            v: values(v),
            source: ds.source.clone(),
        })
    }
}

fn snr_db(x: &[f32], y: &[f32]) -> f64 {
    let (mut s, mut e) = (0f64, 0f64);
    for (a, b) in x.iter().zip(y) {
        s += f64::from(*a) * f64::from(*a);
        e += (f64::from(*a) - f64::from(*b)).powi(2);
    }
    10.0 * (s / e).log10()
}

/// Rows `[t][h]` of head `h` of one layer, contiguous (`n_tokens * head_dim`).
fn head_rows(layer: &[f32], n_tokens: usize, n_kv: usize, h: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n_tokens * d);
    for t in 0..n_tokens {
        let o = (t * n_kv + h) * d;
        out.extend_from_slice(&layer[o..o + d]);
    }
    out
}

/// f64 attention of `q` over the first `n` rows of `k` / `v` (`d` values each).
fn attention_f64(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let s: Vec<f64> = (0..n)
        .map(|t| {
            scale
                * (0..d)
                    .map(|i| f64::from(q[i]) * f64::from(k[t * d + i]))
                    .sum::<f64>()
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = p.iter().sum();
    let mut o = vec![0f64; d];
    for t in 0..n {
        let w = p[t] / z;
        for i in 0..d {
            o[i] += w * f64::from(v[t * d + i]);
        }
    }
    o
}

/// Query positions: evenly spread over the second half of the tokens (at least 16).
pub(super) fn query_positions(n_tokens: usize, count: usize) -> Vec<usize> {
    let lo = (n_tokens / 2).max(16).min(n_tokens.saturating_sub(1));
    let span = n_tokens - lo;
    (0..count.max(1))
        .map(|i| lo + i * span / count.max(1))
        .filter(|&t| t >= 1 && t < n_tokens)
        .collect()
}

/// The f64 attention output for one query position.
type QueryRef = (usize, Vec<f64>);

/// The f64 attention outputs on the unquantized cache that the errors are measured against.
pub(super) struct Reference {
    /// Per layer, per head: the sampled queries.
    outs: Vec<Vec<Vec<QueryRef>>>,
}

/// f64 attention of every layer's and head's query at each of `positions`.
pub(super) fn reference(kv: &Kv, positions: &[usize]) -> Reference {
    let d = kv.head_dim;
    let ln = kv.n_tokens * kv.n_kv_head * d;
    let outs = (0..kv.n_layer)
        .map(|l| {
            let (kl, vl) = (&kv.k[l * ln..(l + 1) * ln], &kv.v[l * ln..(l + 1) * ln]);
            (0..kv.n_kv_head)
                .map(|h| {
                    let kh = head_rows(kl, kv.n_tokens, kv.n_kv_head, h, d);
                    let vh = head_rows(vl, kv.n_tokens, kv.n_kv_head, h, d);
                    positions
                        .iter()
                        .map(|&t| (t, attention_f64(&kh[t * d..(t + 1) * d], &kh, &vh, t, d)))
                        .collect()
                })
                .collect()
        })
        .collect();
    Reference { outs }
}

fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    let e: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).powi(2))
        .sum();
    let s: f64 = b.iter().map(|y| y * y).sum();
    (e / s).sqrt()
}

/// Quality of one config: SNR per layer, attention error per layer, GB/s.
pub(super) fn quality(
    kv: &Kv,
    cfg: &KvqConfig,
    refs: &Reference,
    reps: usize,
) -> Result<Value, CliError> {
    let d = kv.head_dim;
    let codec = LayerCodec::new(cfg, d).map_err(lib)?;
    let ln = kv.n_tokens * kv.n_kv_head * d;
    let rows = kv.n_tokens * kv.n_kv_head;
    let mut layers = Vec::new();
    let (mut qsecs, mut dsecs, mut bytes) = (0f64, 0f64, 0usize);
    let isa = Isa::detect();
    for l in 0..kv.n_layer {
        let (kl, vl) = (&kv.k[l * ln..(l + 1) * ln], &kv.v[l * ln..(l + 1) * ln]);
        let mut pk = vec![0u8; rows * codec.k.row_bytes()];
        let mut pv = vec![0u8; rows * codec.v.row_bytes()];
        let mut best_q = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            codec.k.quantize_rows(kl, &mut pk).map_err(lib)?;
            codec.v.quantize_rows(vl, &mut pv).map_err(lib)?;
            best_q = best_q.min(t.elapsed().as_secs_f64());
        }
        let mut dk = vec![0f32; ln];
        let mut dv = vec![0f32; ln];
        let mut best_d = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            codec.k.dequantize_rows(&pk, &mut dk).map_err(lib)?;
            codec.v.dequantize_rows(&pv, &mut dv).map_err(lib)?;
            best_d = best_d.min(t.elapsed().as_secs_f64());
        }
        qsecs += best_q;
        dsecs += best_d;
        bytes += 2 * ln * 2;
        // Attention error over the sampled queries of every head.
        let (mut err_sum, mut err_max, mut count) = (0f64, 0f64, 0usize);
        let (kb, vb) = (codec.k.row_bytes(), codec.v.row_bytes());
        for h in 0..kv.n_kv_head {
            for (t, want) in &refs.outs[l][h] {
                let o = (t * kv.n_kv_head + h) * d;
                let q = &kl[o..o + d];
                let mut sc = vec![0f32; *t];
                let mut out = vec![0f32; d];
                attend_head(
                    isa,
                    &codec,
                    q,
                    HeadRows {
                        bytes: &pk[h * kb..],
                        stride: kv.n_kv_head * kb,
                    },
                    HeadRows {
                        bytes: &pv[h * vb..],
                        stride: kv.n_kv_head * vb,
                    },
                    *t,
                    1.0 / (d as f32).sqrt(),
                    &mut sc,
                    &mut out,
                )
                .map_err(lib)?;
                let e = rel_l2(&out, want);
                err_sum += e;
                err_max = err_max.max(e);
                count += 1;
            }
        }
        layers.push(json!({
            "layer": l,
            "k_snr_db": snr_db(kl, &dk),
            "v_snr_db": snr_db(vl, &dv),
            "attn_rel_err_mean": err_sum / count.max(1) as f64,
            "attn_rel_err_max": err_max,
        }));
    }
    let mean = |key: &str| {
        layers.iter().filter_map(|l| l[key].as_f64()).sum::<f64>() / layers.len().max(1) as f64
    };
    let bpv = codec.bits_per_value();
    Ok(json!({
        "config": cfg.to_string(),
        "k_bits_per_value": codec.k.bits_per_value(),
        "v_bits_per_value": codec.v.bits_per_value(),
        "bits_per_value": bpv,
        "ratio_vs_f16": 16.0 / bpv,
        "k_snr_db_mean": mean("k_snr_db"),
        "v_snr_db_mean": mean("v_snr_db"),
        "k_snr_db_min": layers.iter().filter_map(|l| l["k_snr_db"].as_f64()).fold(f64::INFINITY, f64::min),
        "attn_rel_err_mean": mean("attn_rel_err_mean"),
        "attn_rel_err_max": layers.iter().filter_map(|l| l["attn_rel_err_max"].as_f64()).fold(0.0, f64::max),
        "quantize_gb_per_s": bytes as f64 / qsecs / 1e9,
        "dequantize_gb_per_s": bytes as f64 / dsecs / 1e9,
        "layers": layers,
    }))
}

/// Quality of a `kc<G>:CONFIG` configuration: K per channel over token groups, V rows.
fn quality_channel(
    kv: &Kv,
    group: usize,
    cfg: &KvqConfig,
    refs: &Reference,
    reps: usize,
) -> Result<Value, CliError> {
    let d = kv.head_dim;
    let kc = ChannelGroupCodec::new(cfg.k_bits, d, group).map_err(lib)?;
    let vc = LayerCodec::new(cfg, d).map_err(lib)?.v;
    let ln = kv.n_tokens * kv.n_kv_head * d;
    let rows = kv.n_tokens * kv.n_kv_head;
    let n_blocks = kv.n_tokens / group;
    let bb = kc.block_bytes();
    let mut layers = Vec::new();
    let (mut qsecs, mut dsecs, mut bytes) = (0f64, 0f64, 0usize);
    for l in 0..kv.n_layer {
        let (kl, vl) = (&kv.k[l * ln..(l + 1) * ln], &kv.v[l * ln..(l + 1) * ln]);
        let heads: Vec<Vec<f32>> = (0..kv.n_kv_head)
            .map(|h| head_rows(kl, kv.n_tokens, kv.n_kv_head, h, d))
            .collect();
        // blocks [head][block]; the f16 tail past the last whole group stays as it is
        let mut pk = vec![0u8; kv.n_kv_head * n_blocks * bb];
        let mut pv = vec![0u8; rows * vc.row_bytes()];
        let mut best_q = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            for (h, kh) in heads.iter().enumerate() {
                for b in 0..n_blocks {
                    let o = (h * n_blocks + b) * bb;
                    kc.quantize_block(&kh[b * group * d..(b + 1) * group * d], &mut pk[o..o + bb])
                        .map_err(lib)?;
                }
            }
            vc.quantize_rows(vl, &mut pv).map_err(lib)?;
            best_q = best_q.min(t.elapsed().as_secs_f64());
        }
        // decoded K per head (tail rows as given), V rows
        let mut dkh: Vec<Vec<f32>> = heads.clone();
        let mut dv = vec![0f32; ln];
        let mut best_d = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            for (h, out) in dkh.iter_mut().enumerate() {
                for b in 0..n_blocks {
                    let o = (h * n_blocks + b) * bb;
                    kc.dequantize_block(
                        &pk[o..o + bb],
                        &mut out[b * group * d..(b + 1) * group * d],
                    )
                    .map_err(lib)?;
                }
            }
            vc.dequantize_rows(&pv, &mut dv).map_err(lib)?;
            best_d = best_d.min(t.elapsed().as_secs_f64());
        }
        qsecs += best_q;
        dsecs += best_d;
        bytes += 2 * ln * 2;
        let mut dk = vec![0f32; ln];
        for (h, out) in dkh.iter().enumerate() {
            for t in 0..kv.n_tokens {
                let o = (t * kv.n_kv_head + h) * d;
                dk[o..o + d].copy_from_slice(&out[t * d..(t + 1) * d]);
            }
        }
        let (mut err_sum, mut err_max, mut count) = (0f64, 0f64, 0usize);
        let mut bscores = vec![0f32; group];
        for (h, kh) in heads.iter().enumerate() {
            let vh = head_rows(&dv, kv.n_tokens, kv.n_kv_head, h, d);
            for (t, want) in &refs.outs[l][h] {
                let q = &kh[t * d..(t + 1) * d];
                // at position t the groups filled before t are coded, the rest is f16
                let coded = (t / group) * group;
                let mut s = Vec::with_capacity(*t);
                for b in 0..coded / group {
                    let o = (h * n_blocks + b) * bb;
                    kc.dot_block(q, &pk[o..o + bb], &mut bscores).map_err(lib)?;
                    s.extend_from_slice(&bscores);
                }
                for r in coded..*t {
                    s.push(dot32(q, &kh[r * d..(r + 1) * d]));
                }
                let out = softmax_out(&s, &vh, d);
                let e = rel_l2(&out, want);
                err_sum += e;
                err_max = err_max.max(e);
                count += 1;
            }
        }
        layers.push(json!({
            "layer": l,
            "k_snr_db": snr_db(kl, &dk),
            "v_snr_db": snr_db(vl, &dv),
            "attn_rel_err_mean": err_sum / count.max(1) as f64,
            "attn_rel_err_max": err_max,
        }));
    }
    let mean = |key: &str| {
        layers.iter().filter_map(|l| l[key].as_f64()).sum::<f64>() / layers.len().max(1) as f64
    };
    let bpv = (kc.bits_per_value() + vc.bits_per_value()) / 2.0;
    Ok(json!({
        "config": format!("kc{group}:{cfg}"),
        "k_group": group,
        "k_bits_per_value": kc.bits_per_value(),
        "v_bits_per_value": vc.bits_per_value(),
        "bits_per_value": bpv,
        "ratio_vs_f16": 16.0 / bpv,
        "k_snr_db_mean": mean("k_snr_db"),
        "v_snr_db_mean": mean("v_snr_db"),
        "k_snr_db_min": layers.iter().filter_map(|l| l["k_snr_db"].as_f64()).fold(f64::INFINITY, f64::min),
        "attn_rel_err_mean": mean("attn_rel_err_mean"),
        "attn_rel_err_max": layers.iter().filter_map(|l| l["attn_rel_err_max"].as_f64()).fold(0.0, f64::max),
        "quantize_gb_per_s": bytes as f64 / qsecs / 1e9,
        "dequantize_gb_per_s": bytes as f64 / dsecs / 1e9,
        "layers": layers,
    }))
}

/// The attention output of `scores` (unscaled) over the first `scores.len()` rows of `vh`.
fn softmax_out(scores: &[f32], vh: &[f32], d: usize) -> Vec<f32> {
    let scale = 1.0 / (d as f64).sqrt();
    let m = scores
        .iter()
        .map(|&x| f64::from(x) * scale)
        .fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores
        .iter()
        .map(|&x| (f64::from(x) * scale - m).exp())
        .collect();
    let z: f64 = p.iter().sum();
    let mut out = vec![0f32; d];
    for (r, w) in p.iter().enumerate() {
        for i in 0..d {
            out[i] += (w / z) as f32 * vh[r * d + i];
        }
    }
    out
}

fn dot32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Quality of a `qjl:CONFIG` configuration: K rows plus the QJL residual sketch, V rows.
fn quality_qjl(kv: &Kv, cfg: &KvqConfig, refs: &Reference) -> Result<Value, CliError> {
    let d = kv.head_dim;
    let codec = LayerCodec::new(cfg, d).map_err(lib)?;
    let qjl = QjlResidual::new(d, cfg.seed).map_err(lib)?;
    let sb = qjl.sketch_bytes();
    let ln = kv.n_tokens * kv.n_kv_head * d;
    let rows = kv.n_tokens * kv.n_kv_head;
    let mut layers = Vec::new();
    let (mut qsecs, mut dsecs, mut bytes) = (0f64, 0f64, 0usize);
    let mut res = vec![0f32; d];
    for l in 0..kv.n_layer {
        let (kl, vl) = (&kv.k[l * ln..(l + 1) * ln], &kv.v[l * ln..(l + 1) * ln]);
        let mut pk = vec![0u8; rows * codec.k.row_bytes()];
        let mut pv = vec![0u8; rows * codec.v.row_bytes()];
        let mut sk = vec![0u8; rows * sb];
        let mut dk = vec![0f32; ln];
        let mut dv = vec![0f32; ln];
        // quantize: K rows, their decode (the residual needs it) and sketches, V rows
        let t0 = Instant::now();
        codec.k.quantize_rows(kl, &mut pk).map_err(lib)?;
        codec.k.dequantize_rows(&pk, &mut dk).map_err(lib)?;
        for i in 0..rows {
            for j in 0..d {
                res[j] = kl[i * d + j] - dk[i * d + j];
            }
            qjl.sketch(&res, &mut sk[i * sb..(i + 1) * sb])
                .map_err(lib)?;
        }
        codec.v.quantize_rows(vl, &mut pv).map_err(lib)?;
        qsecs += t0.elapsed().as_secs_f64();
        // dequantize: K rows plus the reconstructed residual, V rows
        let mut kr = vec![0f32; ln];
        let t0 = Instant::now();
        codec.k.dequantize_rows(&pk, &mut kr).map_err(lib)?;
        for i in 0..rows {
            qjl.reconstruct(&sk[i * sb..(i + 1) * sb], &mut res)
                .map_err(lib)?;
            for j in 0..d {
                kr[i * d + j] += res[j];
            }
        }
        codec.v.dequantize_rows(&pv, &mut dv).map_err(lib)?;
        dsecs += t0.elapsed().as_secs_f64();
        bytes += 2 * ln * 2;
        let (mut err_sum, mut err_max, mut count) = (0f64, 0f64, 0usize);
        let (mut plain_sum, mut plain_max) = (0f64, 0f64);
        // squared score errors against the f32 K row's score: with the correction, rows only
        let (mut se_qjl, mut se_rows, mut s_ref) = (0f64, 0f64, 0f64);
        // and their projections on the exact scores (slope: 1 when unbiased in scale)
        let (mut x_qjl, mut x_rows) = (0f64, 0f64);
        let mut sq = vec![0f32; d];
        for h in 0..kv.n_kv_head {
            let vh = head_rows(&dv, kv.n_tokens, kv.n_kv_head, h, d);
            for (t, want) in &refs.outs[l][h] {
                let o = (t * kv.n_kv_head + h) * d;
                let q = &kl[o..o + d];
                qjl.project_query(q, &mut sq).map_err(lib)?;
                let mut s = Vec::with_capacity(*t);
                let mut plain = Vec::with_capacity(*t);
                for r in 0..*t {
                    let i = r * kv.n_kv_head + h;
                    let base = dot32(q, &dk[i * d..(i + 1) * d]);
                    let corrected =
                        base + qjl.estimate(&sq, &sk[i * sb..(i + 1) * sb]).map_err(lib)?;
                    let exact = f64::from(dot32(q, &kl[i * d..(i + 1) * d]));
                    se_qjl += (f64::from(corrected) - exact).powi(2);
                    se_rows += (f64::from(base) - exact).powi(2);
                    s_ref += exact * exact;
                    x_qjl += f64::from(corrected) * exact;
                    x_rows += f64::from(base) * exact;
                    plain.push(base);
                    s.push(corrected);
                }
                let e = rel_l2(&softmax_out(&s, &vh, d), want);
                err_sum += e;
                err_max = err_max.max(e);
                let e = rel_l2(&softmax_out(&plain, &vh, d), want);
                plain_sum += e;
                plain_max = plain_max.max(e);
                count += 1;
            }
        }
        layers.push(json!({
            "layer": l,
            "k_snr_db": snr_db(kl, &kr),
            "k_rows_snr_db": snr_db(kl, &dk),
            "v_snr_db": snr_db(vl, &dv),
            "attn_rel_err_mean": err_sum / count.max(1) as f64,
            "attn_rel_err_max": err_max,
            "attn_rel_err_mean_rows_only": plain_sum / count.max(1) as f64,
            "attn_rel_err_max_rows_only": plain_max,
            "score_rel_rms_err": (se_qjl / s_ref).sqrt(),
            "score_rel_rms_err_rows_only": (se_rows / s_ref).sqrt(),
            "score_slope": x_qjl / s_ref,
            "score_slope_rows_only": x_rows / s_ref,
        }));
    }
    let mean = |key: &str| {
        layers.iter().filter_map(|l| l[key].as_f64()).sum::<f64>() / layers.len().max(1) as f64
    };
    let max = |key: &str| {
        layers
            .iter()
            .filter_map(|l| l[key].as_f64())
            .fold(0.0, f64::max)
    };
    let kbits = codec.k.bits_per_value() + qjl.bits_per_value();
    let bpv = (kbits + codec.v.bits_per_value()) / 2.0;
    Ok(json!({
        "config": format!("qjl:{cfg}"),
        "k_bits_per_value": kbits,
        "k_rows_bits_per_value": codec.k.bits_per_value(),
        "v_bits_per_value": codec.v.bits_per_value(),
        "bits_per_value": bpv,
        "ratio_vs_f16": 16.0 / bpv,
        "k_snr_db_mean": mean("k_snr_db"),
        "k_rows_snr_db_mean": mean("k_rows_snr_db"),
        "v_snr_db_mean": mean("v_snr_db"),
        "k_snr_db_min": layers.iter().filter_map(|l| l["k_snr_db"].as_f64()).fold(f64::INFINITY, f64::min),
        "attn_rel_err_mean": mean("attn_rel_err_mean"),
        "attn_rel_err_max": max("attn_rel_err_max"),
        "attn_rel_err_mean_rows_only": mean("attn_rel_err_mean_rows_only"),
        "attn_rel_err_max_rows_only": max("attn_rel_err_max_rows_only"),
        "score_rel_rms_err_mean": mean("score_rel_rms_err"),
        "score_rel_rms_err_mean_rows_only": mean("score_rel_rms_err_rows_only"),
        "score_slope_mean": mean("score_slope"),
        "score_slope_mean_rows_only": mean("score_slope_rows_only"),
        "scores": "<q, k_row> + QJL correction ||r|| sqrt(pi/2)/d <S q, sign(S r)>; k_snr_db is of k_row + reconstruct(sketch)",
        "quantize_gb_per_s": bytes as f64 / qsecs / 1e9,
        "dequantize_gb_per_s": bytes as f64 / dsecs / 1e9,
        "layers": layers,
    }))
}

/// One-core decode attention time for one head at `n` tokens, packed vs f16, on rows
/// tiled from layer 0 head 0 of the data.
pub(super) fn speed(kv: &Kv, cfg: &KvqConfig, n: usize, reps: usize) -> Result<Value, CliError> {
    let d = kv.head_dim;
    let codec = LayerCodec::new(cfg, d).map_err(lib)?;
    let ln = kv.n_tokens * kv.n_kv_head * d;
    let kh = head_rows(&kv.k[..ln], kv.n_tokens, kv.n_kv_head, 0, d);
    let vh = head_rows(&kv.v[..ln], kv.n_tokens, kv.n_kv_head, 0, d);
    let tile = |src: &[f32]| -> Vec<f32> { src.iter().cycle().take(n * d).copied().collect() };
    let (k, v) = (tile(&kh), tile(&vh));
    let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
    let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    let mut pk = vec![0u8; n * codec.k.row_bytes()];
    let mut pv = vec![0u8; n * codec.v.row_bytes()];
    codec.k.quantize_rows(&k, &mut pk).map_err(lib)?;
    codec.v.quantize_rows(&v, &mut pv).map_err(lib)?;
    let q: Vec<f32> = kh[(kv.n_tokens - 1) * d..kv.n_tokens * d].to_vec();
    let mut sc = vec![0f32; n];
    let mut out = vec![0f32; d];
    let isa = Isa::detect();
    let scale = 1.0 / (d as f32).sqrt();
    let (mut t_packed, mut t_f16, mut t_avx2) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    let packed = |isa: Isa, sc: &mut [f32], out: &mut [f32]| {
        attend_head(
            isa,
            &codec,
            &q,
            HeadRows {
                bytes: &pk,
                stride: codec.k.row_bytes(),
            },
            HeadRows {
                bytes: &pv,
                stride: codec.v.row_bytes(),
            },
            n,
            scale,
            sc,
            out,
        )
        .map_err(lib)
    };
    // Interleaved, so all see the same machine load, and each packed run right after an
    // f16 run (the f16 rows evict the packed ones from the caches, so no packed run starts
    // on rows another one just read).
    let mut f16_run = |sc: &mut [f32], out: &mut [f32]| -> Result<(), CliError> {
        let t = Instant::now();
        attend_head_f16(isa, &q, &k16, &v16, n, d, scale, sc, out).map_err(lib)?;
        t_f16 = t_f16.min(t.elapsed().as_secs_f64());
        Ok(())
    };
    for _ in 0..reps.max(1) {
        f16_run(&mut sc, &mut out)?;
        let t = Instant::now();
        packed(isa, &mut sc, &mut out)?;
        t_packed = t_packed.min(t.elapsed().as_secs_f64());
        if isa.is_avx512() {
            f16_run(&mut sc, &mut out)?;
            let t = Instant::now();
            packed(isa.without_avx512(), &mut sc, &mut out)?;
            t_avx2 = t_avx2.min(t.elapsed().as_secs_f64());
        }
    }
    let mut r = json!({
        "config": cfg.to_string(), "tokens": n, "head_dim": d, "isa": isa_name(isa),
        "packed_us": t_packed * 1e6, "f16_us": t_f16 * 1e6, "speedup_vs_f16": t_f16 / t_packed,
    });
    if isa.is_avx512() {
        r["packed_avx2_us"] = json!(t_avx2 * 1e6);
        r["avx2_speedup_vs_f16"] = json!(t_f16 / t_avx2);
    }
    Ok(r)
}

fn isa_name(isa: Isa) -> &'static str {
    if isa.is_avx512() {
        "avx512"
    } else if isa.is_avx2() {
        "avx2"
    } else {
        "portable"
    }
}

/// Bit widths of the per-row timings.
const ROW_BITS: [u8; 6] = [2, 3, 4, 5, 6, 8];

/// Nanoseconds per call of `f` over `n` rows, best of `reps` passes.
fn per_row_ns(
    n: usize,
    reps: usize,
    mut f: impl FnMut(usize) -> Result<f32, CliError>,
) -> Result<f64, CliError> {
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let mut acc = 0f32;
        for r in 0..n {
            acc += f(r)?;
        }
        std::hint::black_box(acc);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best / n as f64 * 1e9)
}

/// One-core time per row of the per-cell entry points (Lloyd-Max, every width of
/// [`ROW_BITS`]) against the f16 row operations, on 4096 rows tiled from layer 0 head 0,
/// each pair measured back to back.
fn row_speed(kv: &Kv, reps: usize) -> Result<Vec<Value>, CliError> {
    let d = kv.head_dim;
    let n = 4096;
    let ln = kv.n_tokens * kv.n_kv_head * d;
    let kh = head_rows(&kv.k[..ln], kv.n_tokens, kv.n_kv_head, 0, d);
    let x: Vec<f32> = kh.iter().cycle().take(n * d).copied().collect();
    let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let q: Vec<f32> = kh[(kv.n_tokens - 1) * d..kv.n_tokens * d].to_vec();
    let isa = Isa::detect();
    let mut buf = vec![0f32; d];
    let mut out = Vec::new();
    for bits in ROW_BITS {
        let c =
            RowCodec::new(Method::LloydMax, bits, d, kvc_kvq::config::DEFAULT_SEED).map_err(lib)?;
        let rb = c.row_bytes();
        let mut p = vec![0u8; n * rb];
        c.quantize_rows(&x, &mut p).map_err(lib)?;
        let mut qr = q.clone();
        c.rotation().rotate(&mut qr);
        let f16_dot = per_row_ns(n, reps, |r| {
            dot_f16_row(isa, &q, &x16[r * d..(r + 1) * d]).map_err(lib)
        })?;
        let dot = per_row_ns(n, reps, |r| {
            c.dot_rotated(&qr, &p[r * rb..(r + 1) * rb], r).map_err(lib)
        })?;
        let f16_cvt = per_row_ns(n, reps, |r| {
            f16_row_to_f32(&x16[r * d..(r + 1) * d], &mut buf).map_err(lib)?;
            Ok(buf[r % d])
        })?;
        let deq = per_row_ns(n, reps, |r| {
            c.dequantize_row_rotated(&p[r * rb..(r + 1) * rb], &mut buf)
                .map_err(lib)?;
            Ok(buf[r % d])
        })?;
        out.push(json!({
            "method": "lm", "bits": bits, "head_dim": d, "row_bytes": rb, "rows": n,
            "isa": isa_name(isa),
            "dot_rotated_ns": dot, "f16_dot_ns": f16_dot,
            "dequantize_row_rotated_ns": deq, "f16_to_f32_ns": f16_cvt,
        }));
    }
    Ok(out)
}

/// One-core time per row of K per channel: scores of a whole block (`dot_block`) and a
/// block's decode, divided by its rows, against the f16 row dot product and conversion, on
/// 4096 rows tiled from layer 0 head 0, each pair measured back to back.
fn channel_speed(kv: &Kv, group: usize, cfg: &KvqConfig, reps: usize) -> Result<Value, CliError> {
    let d = kv.head_dim;
    let n = 4096;
    let c = ChannelGroupCodec::new(cfg.k_bits, d, group).map_err(lib)?;
    let ln = kv.n_tokens * kv.n_kv_head * d;
    let kh = head_rows(&kv.k[..ln], kv.n_tokens, kv.n_kv_head, 0, d);
    let x: Vec<f32> = kh.iter().cycle().take(n * d).copied().collect();
    let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let q: Vec<f32> = kh[(kv.n_tokens - 1) * d..kv.n_tokens * d].to_vec();
    let bb = c.block_bytes();
    let nb = n / group;
    let mut p = vec![0u8; nb * bb];
    for (b, o) in p.chunks_exact_mut(bb).enumerate() {
        c.quantize_block(&x[b * group * d..(b + 1) * group * d], o)
            .map_err(lib)?;
    }
    let isa = Isa::detect();
    let mut scores = vec![0f32; group];
    let mut rows = vec![0f32; group * d];
    let mut buf = vec![0f32; d];
    let f16_dot = per_row_ns(n, reps, |r| {
        dot_f16_row(isa, &q, &x16[r * d..(r + 1) * d]).map_err(lib)
    })?;
    let dot = per_row_ns(nb, reps, |b| {
        c.dot_block(&q, &p[b * bb..(b + 1) * bb], &mut scores)
            .map_err(lib)?;
        Ok(scores[b % group])
    })? / group as f64;
    let f16_cvt = per_row_ns(n, reps, |r| {
        f16_row_to_f32(&x16[r * d..(r + 1) * d], &mut buf).map_err(lib)?;
        Ok(buf[r % d])
    })?;
    let deq = per_row_ns(nb, reps, |b| {
        c.dequantize_block(&p[b * bb..(b + 1) * bb], &mut rows)
            .map_err(lib)?;
        Ok(rows[b % (group * d)])
    })? / group as f64;
    Ok(json!({
        "config": format!("kc{group}:{cfg}"), "group": group, "bits": cfg.k_bits, "head_dim": d,
        "block_bytes": bb, "rows": n, "isa": "portable (no SIMD kernel yet)", "f16_isa": isa_name(isa),
        "dot_block_ns_per_row": dot, "f16_dot_ns": f16_dot,
        "dequantize_block_ns_per_row": deq, "f16_to_f32_ns": f16_cvt,
    }))
}

/// Everything as JSON.
pub fn measure(a: &BenchQuantArgs) -> Result<Value, CliError> {
    let kv = load(a)?;
    let configs = a
        .configs
        .split(',')
        .map(|s| BenchConfig::parse(s.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let positions = query_positions(kv.n_tokens, a.queries);
    let refs = reference(&kv, &positions);
    let mut q = Vec::new();
    for c in &configs {
        q.push(match c {
            BenchConfig::Rows(c) => quality(&kv, c, &refs, a.reps.min(2))?,
            BenchConfig::Channel { group, cfg } => {
                quality_channel(&kv, *group, cfg, &refs, a.reps.min(2))?
            }
            BenchConfig::Qjl(cfg) => quality_qjl(&kv, cfg, &refs)?,
        });
    }
    let mut s = Vec::new();
    let mut rs = Vec::new();
    let mut cs = Vec::new();
    if !a.no_speed {
        rs = row_speed(&kv, a.reps.max(3))?;
        for c in &configs {
            if let BenchConfig::Channel { group, cfg } = c {
                cs.push(channel_speed(&kv, *group, cfg, a.reps.max(3))?);
            }
        }
        let tokens = a
            .tokens
            .split(',')
            .map(|t| {
                t.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0 && n <= 1 << 22)
                    .ok_or_else(|| CliError::input(format!("bad --tokens entry {t:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for c in &configs {
            let BenchConfig::Rows(c) = c else { continue };
            for &n in &tokens {
                s.push(speed(&kv, c, n, a.reps)?);
            }
        }
    }
    Ok(json!({
        "data": kv.source,
        "shape": [kv.n_layer, kv.n_tokens, kv.n_kv_head, kv.head_dim],
        "queries": QUERIES,
        "query_positions": positions,
        "quality": q,
        "attention_speed": s,
        "row_speed": rs,
        "channel_speed": cs,
    }))
}

/// Runs `kvc bench quant`: prints tables, optionally writes JSON.
pub fn run(a: &BenchQuantArgs) -> Result<(), CliError> {
    let r = measure(a)?;
    println!(
        "kvq on {} (shape {}), attention error vs f64 on the f16 cache ({} queries/head/layer, K rows as queries):",
        r["data"].as_str().unwrap_or(""),
        r["shape"],
        r["query_positions"].as_array().map_or(0, |v| v.len())
    );
    println!(
        "  {:<14} {:>6} {:>6} {:>8} {:>8} {:>8} {:>10} {:>10} {:>7} {:>7}",
        "config",
        "bits",
        "ratio",
        "K SNR",
        "K min",
        "V SNR",
        "attn err",
        "attn max",
        "q GB/s",
        "dq GB/s"
    );
    for c in r["quality"].as_array().into_iter().flatten() {
        let f = |k: &str| c[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "  {:<14} {:>6.3} {:>6.2} {:>8.2} {:>8.2} {:>8.2} {:>10.3e} {:>10.3e} {:>7.2} {:>7.2}",
            c["config"].as_str().unwrap_or(""),
            f("bits_per_value"),
            f("ratio_vs_f16"),
            f("k_snr_db_mean"),
            f("k_snr_db_min"),
            f("v_snr_db_mean"),
            f("attn_rel_err_mean"),
            f("attn_rel_err_max"),
            f("quantize_gb_per_s"),
            f("dequantize_gb_per_s"),
        );
    }
    for c in r["quality"].as_array().into_iter().flatten() {
        if c["attn_rel_err_mean_rows_only"].is_null() {
            continue;
        }
        let f = |k: &str| c[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "  {:<14} K rows alone ({:.3} bits): K SNR {:.2} dB, attn err {:.3e}, max {:.3e}; score rel rms err {:.3e} with QJL, {:.3e} rows alone; score slope {:.4} / {:.4}",
            c["config"].as_str().unwrap_or(""),
            f("k_rows_bits_per_value"),
            f("k_rows_snr_db_mean"),
            f("attn_rel_err_mean_rows_only"),
            f("attn_rel_err_max_rows_only"),
            f("score_rel_rms_err_mean"),
            f("score_rel_rms_err_mean_rows_only"),
            f("score_slope_mean"),
            f("score_slope_mean_rows_only"),
        );
    }
    println!("  per layer (K SNR / V SNR dB):");
    for c in r["quality"].as_array().into_iter().flatten() {
        let per: Vec<String> = c["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                format!(
                    "{:.1}/{:.1}",
                    l["k_snr_db"].as_f64().unwrap_or(f64::NAN),
                    l["v_snr_db"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        println!(
            "  {:<14} {}",
            c["config"].as_str().unwrap_or(""),
            per.join(" ")
        );
    }
    if let Some(s) = r["attention_speed"].as_array().filter(|s| !s.is_empty()) {
        println!(
            "decode attention, one head, one core (best of {}; packed vs the same kernel on f16):",
            a.reps
        );
        println!(
            "  {:<14} {:>7} {:>7} {:>10} {:>10} {:>8} {:>14}",
            "config", "tokens", "isa", "packed us", "f16 us", "speedup", "avx2 us (x)"
        );
        for c in s {
            let avx2 = match c["packed_avx2_us"].as_f64() {
                Some(u) => format!(
                    "{u:.1} ({:.2})",
                    c["avx2_speedup_vs_f16"].as_f64().unwrap_or(f64::NAN)
                ),
                None => "-".into(),
            };
            println!(
                "  {:<14} {:>7} {:>7} {:>10.1} {:>10.1} {:>8.2} {:>14}",
                c["config"].as_str().unwrap_or(""),
                c["tokens"],
                c["isa"].as_str().unwrap_or(""),
                c["packed_us"].as_f64().unwrap_or(f64::NAN),
                c["f16_us"].as_f64().unwrap_or(f64::NAN),
                c["speedup_vs_f16"].as_f64().unwrap_or(f64::NAN),
                avx2
            );
        }
    }
    if let Some(s) = r["row_speed"].as_array().filter(|s| !s.is_empty()) {
        println!(
            "per-row entry points, one core, ns per row (best of {}; f16 row ops in the same run):",
            a.reps.max(3)
        );
        println!(
            "  {:<8} {:>4} {:>9} {:>10} {:>9} {:>11} {:>10}",
            "method", "bits", "row bytes", "dot_rot", "f16 dot", "deq_rot", "f16->f32"
        );
        for c in s {
            let f = |k: &str| c[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "  {:<8} {:>4} {:>9} {:>10.2} {:>9.2} {:>11.2} {:>10.2}",
                format!("lm d{}", c["head_dim"]),
                c["bits"],
                c["row_bytes"],
                f("dot_rotated_ns"),
                f("f16_dot_ns"),
                f("dequantize_row_rotated_ns"),
                f("f16_to_f32_ns")
            );
        }
    }
    if let Some(s) = r["channel_speed"].as_array().filter(|s| !s.is_empty()) {
        println!(
            "K per channel, one core, ns per row (best of {}; a block's scores or decode over its rows; f16 row ops in the same run):",
            a.reps.max(3)
        );
        println!(
            "  {:<14} {:>11} {:>9} {:>12} {:>10}",
            "config", "dot_block", "f16 dot", "deq_block", "f16->f32"
        );
        for c in s {
            let f = |k: &str| c[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "  {:<14} {:>11.2} {:>9.2} {:>12.2} {:>10.2}",
                c["config"].as_str().unwrap_or(""),
                f("dot_block_ns_per_row"),
                f("f16_dot_ns"),
                f("dequantize_block_ns_per_row"),
                f("f16_to_f32_ns")
            );
        }
    }
    if let Some(p) = &a.json {
        let s = serde_json::to_string_pretty(&r).map_err(CliError::input)?;
        std::fs::write(p, s).map_err(|e| CliError::io(p, e))?;
    }
    Ok(())
}
