//! Calibrated mixed precision for kvq: per-layer K and V bits from the model's own KV.
//!
//! This crate makes kvq plans; it is not the plan format (`kvc_kvq::config`, which
//! engines and `kvc-capi` load without this crate) nor the codec (`kvc-kvq`), and it reads
//! no files.
//!
//! [`sensitivity`] measures, for every layer and every bit width 2..=8, the layer-local
//! attention-output error when only K is quantized (V exact) and when only V is quantized
//! (K exact), with kvq's real packed rows ([`RowCodec`] quantize then dequantize, so the
//! numbers are those an engine gets). For a sample of query positions `t` (every
//! `stride`-th from `from` on) and every query head `i` (KV head `i / (n_head /
//! n_kv_head)`), causal attention over tokens `0..=t` with scale `1/sqrt(head_dim)` gives
//! `o` (exact rows) and `o'` (dequantized rows); a layer's error is
//! `sum ||o' - o||^2 / sum ||o||^2` over the sampled (query, head) pairs.
//!
//! [`allocate`] then picks per-layer `(k_bits, v_bits)` minimizing the sum of K and V
//! errors over layers (treated as additive) under a byte budget: mean bits per value,
//! scales included (`8 * row_bytes / head_dim` averaged over every layer's K and V row),
//! at most `16 / ratio`. It is an exact dynamic program over layers whose state is the
//! total bytes of one token (in units of the gcd of the row sizes), so it is never worse
//! than any uniform choice that fits the same budget.
//!
//! Reading dump files is the caller's business (`kvc quant plan` does it); this module
//! works on `f32` slices.

use rayon::prelude::*;

use kvc_kvq::config::{KvqPlan, LayerBits, LayerErrors, Method, PlanCalibration};
use kvc_kvq::row::{row_bytes, RowCodec};
use kvc_kvq::{Error, Result};

/// The bit widths a plan chooses from.
pub const BITS: std::ops::RangeInclusive<u8> = 2..=8;
const N_BITS: usize = 7;

/// The widths [`allocate`] may give K rows and V rows: each side within its own inclusive
/// `[min, max]` inside [`BITS`]. The default allows all of [`BITS`] on both sides; a floor
/// such as `v >= 4` keeps the allocation from paying for K bits with V bits the
/// layer-local errors undervalue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitBounds {
    /// Fewest and most K bits of a layer.
    pub k: (u8, u8),
    /// Fewest and most V bits of a layer.
    pub v: (u8, u8),
}

impl Default for BitBounds {
    fn default() -> Self {
        let all = (*BITS.start(), *BITS.end());
        BitBounds { k: all, v: all }
    }
}

impl BitBounds {
    /// Bounds `k_min..=k_max` for K and `v_min..=v_max` for V. Errors: a bound outside
    /// [`BITS`] or a minimum above its maximum.
    pub fn new(k: (u8, u8), v: (u8, u8)) -> Result<BitBounds> {
        for (side, (lo, hi)) in [("K", k), ("V", v)] {
            if !(BITS.contains(&lo) && BITS.contains(&hi) && lo <= hi) {
                return Err(Error::BadConfig {
                    input: format!("{side} bits {lo}..={hi}"),
                    reason: format!(
                        "bounds must satisfy {} <= min <= max <= {}",
                        BITS.start(),
                        BITS.end()
                    ),
                });
            }
        }
        Ok(BitBounds { k, v })
    }

    /// Whether these are the default bounds (every width on both sides).
    pub fn is_full(&self) -> bool {
        *self == BitBounds::default()
    }

    /// Whether a layer of `(k_bits, v_bits)` is within the bounds.
    pub fn allows(&self, k_bits: u8, v_bits: u8) -> bool {
        (self.k.0..=self.k.1).contains(&k_bits) && (self.v.0..=self.v.1).contains(&v_bits)
    }
}

/// The shape of a calibration dump. K and V are `[n_layer][n_tokens][n_kv_head][head_dim]`,
/// Q is `[n_layer][n_tokens][n_head][head_dim]` (post-RoPE, before the `1/sqrt(head_dim)`
/// scale), all `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalibShape {
    /// Layers.
    pub n_layer: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// Query heads (a multiple of `n_kv_head`).
    pub n_head: usize,
    /// KV heads.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl CalibShape {
    /// Elements of K (or V).
    pub fn kv_len(&self) -> Result<usize> {
        mul(
            &[self.n_layer, self.n_tokens, self.n_kv_head, self.head_dim],
            "K/V elements",
        )
    }

    /// Elements of Q.
    pub fn q_len(&self) -> Result<usize> {
        mul(
            &[self.n_layer, self.n_tokens, self.n_head, self.head_dim],
            "Q elements",
        )
    }

    fn check(&self) -> Result<()> {
        kvc_kvq::rotation::check_head_dim(self.head_dim)?;
        for (what, v) in [
            ("n_layer", self.n_layer),
            ("n_tokens", self.n_tokens),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
        ] {
            if v == 0 {
                return Err(Error::InvalidValue {
                    what,
                    value: 0,
                    reason: "must be > 0",
                });
            }
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err(Error::InvalidValue {
                what: "n_head",
                value: self.n_head as i64,
                reason: "must be a multiple of n_kv_head",
            });
        }
        Ok(())
    }
}

fn mul(xs: &[usize], what: &'static str) -> Result<usize> {
    xs.iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or(Error::SizeOverflow { what })
}

/// Which query positions are sampled: `from, from + stride, ...` below `n_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuerySample {
    /// First position.
    pub from: usize,
    /// Step (> 0).
    pub stride: usize,
}

impl Default for QuerySample {
    fn default() -> Self {
        QuerySample {
            from: 64,
            stride: 8,
        }
    }
}

/// Per-layer errors for every bit width: `k[l][b - 2]`, `v[l][b - 2]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sensitivity {
    /// K-only errors, one row per layer, bits 2..=8.
    pub k: Vec<[f64; N_BITS]>,
    /// V-only errors, one row per layer, bits 2..=8.
    pub v: Vec<[f64; N_BITS]>,
}

impl Sensitivity {
    /// The K error of `layer` at `bits`.
    pub fn k_err(&self, layer: usize, bits: u8) -> f64 {
        self.k[layer][(bits - 2) as usize]
    }
    /// The V error of `layer` at `bits`.
    pub fn v_err(&self, layer: usize, bits: u8) -> f64 {
        self.v[layer][(bits - 2) as usize]
    }
    /// The objective of uniform `k_bits`/`v_bits`: sum over layers of the K error times
    /// `k_weight` and the V error.
    pub fn uniform_error(&self, k_bits: u8, v_bits: u8, k_weight: f64) -> f64 {
        (0..self.k.len())
            .map(|l| k_weight * self.k_err(l, k_bits) + self.v_err(l, v_bits))
            .sum()
    }
}

/// Measures every layer's K-only and V-only attention-output error at bits 2..=8 (see
/// the module docs). `k`, `v`, `q` are laid out as [`CalibShape`] says. Layers run in
/// parallel (rayon).
pub fn sensitivity(
    shape: CalibShape,
    k: &[f32],
    v: &[f32],
    q: &[f32],
    method: Method,
    seed: u64,
    sample: QuerySample,
) -> Result<Sensitivity> {
    sensitivity_with(shape, k, v, q, method, seed, sample, None)
}

/// [`sensitivity`] for an engine that codes K centered ([`kvc_kvq::center`]): with
/// `k_center = Some(tokens)`, each layer's K center per KV head is the f16 mean of those
/// tokens' K rows ([`kvc_kvq::center::mean_center`]) and every K row is coded as `k - c`, as
/// the llama.cpp client's `--kvq-center` does with its recent window. Errors as
/// `sensitivity`, and an empty token range or one past the dump.
#[allow(clippy::too_many_arguments)]
pub fn sensitivity_with(
    shape: CalibShape,
    k: &[f32],
    v: &[f32],
    q: &[f32],
    method: Method,
    seed: u64,
    sample: QuerySample,
    k_center: Option<std::ops::Range<usize>>,
) -> Result<Sensitivity> {
    shape.check()?;
    if let Some(r) = &k_center {
        if r.is_empty() || r.end > shape.n_tokens {
            return Err(Error::InvalidValue {
                what: "K center tokens",
                value: r.end as i64,
                reason: "must be a non-empty range within the dump's tokens",
            });
        }
    }
    let kv_len = shape.kv_len()?;
    let q_len = shape.q_len()?;
    for (what, s, n) in [("K", k, kv_len), ("V", v, kv_len), ("Q", q, q_len)] {
        if s.len() != n {
            return Err(Error::LayoutMismatch {
                what,
                expected: n,
                found: s.len(),
            });
        }
    }
    if sample.stride == 0 {
        return Err(Error::InvalidValue {
            what: "query stride",
            value: 0,
            reason: "must be > 0",
        });
    }
    if sample.from >= shape.n_tokens {
        return Err(Error::InvalidValue {
            what: "first sampled query",
            value: sample.from as i64,
            reason: "must be below the dump's token count",
        });
    }
    if let Some(i) = q.iter().position(|x| !x.is_finite()) {
        return Err(Error::NonFinite {
            what: "Q",
            index: i,
        });
    }
    let d = shape.head_dim;
    let codecs = BITS
        .map(|b| RowCodec::new(method, b, d, seed))
        .collect::<Result<Vec<_>>>()?;
    let layer_kv = shape.n_tokens * shape.n_kv_head * d;
    let layer_q = shape.n_tokens * shape.n_head * d;
    let rows: Vec<(Vec<f64>, Vec<f64>)> = (0..shape.n_layer)
        .into_par_iter()
        .map(|l| {
            let r = l * layer_kv..(l + 1) * layer_kv;
            layer_errors(
                &shape,
                &k[r.clone()],
                &v[r],
                &q[l * layer_q..(l + 1) * layer_q],
                &codecs,
                sample,
                k_center.clone(),
            )
        })
        .collect::<Result<_>>()?;
    let to_arr = |x: &[f64]| {
        let mut a = [0.0; N_BITS];
        a.copy_from_slice(x);
        a
    };
    Ok(Sensitivity {
        k: rows.iter().map(|(k, _)| to_arr(k)).collect(),
        v: rows.iter().map(|(_, v)| to_arr(v)).collect(),
    })
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight lanes so the compiler vectorizes without reassociation.
    let mut acc = [0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let tail: f32 = a
        .chunks_exact(8)
        .remainder()
        .iter()
        .zip(b.chunks_exact(8).remainder())
        .map(|(x, y)| x * y)
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// KV heads, head_dim and score scale of a layer's rows.
struct Geom {
    n_kv_head: usize,
    d: usize,
    scale: f32,
}

/// Softmax of `q . k_j * scale` over tokens `0..=t` of KV head `h` into `p`.
fn attention_weights(qv: &[f32], keys: &[f32], t: usize, h: usize, g: &Geom, p: &mut Vec<f32>) {
    let (n_kv_head, d, scale) = (g.n_kv_head, g.d, g.scale);
    p.clear();
    let mut m = f32::NEG_INFINITY;
    for j in 0..=t {
        let kr = &keys[(j * n_kv_head + h) * d..][..d];
        let s = dot(qv, kr) * scale;
        m = m.max(s);
        p.push(s);
    }
    let mut z = 0f64;
    for x in p.iter_mut() {
        *x = (*x - m).exp();
        z += f64::from(*x);
    }
    let inv = (1.0 / z) as f32;
    for x in p.iter_mut() {
        *x *= inv;
    }
}

/// `o = sum_j p_j * values[j, h]`.
fn weighted_sum(p: &[f32], values: &[f32], h: usize, g: &Geom, o: &mut [f32]) {
    let (n_kv_head, d) = (g.n_kv_head, g.d);
    o.fill(0.0);
    for (j, &w) in p.iter().enumerate() {
        let vr = &values[(j * n_kv_head + h) * d..][..d];
        for (a, &b) in o.iter_mut().zip(vr) {
            *a += w * b;
        }
    }
}

fn sq_dist(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let e = f64::from(x) - f64::from(y);
            e * e
        })
        .sum()
}

fn quant_dequant(codec: &RowCodec, x: &[f32], packed: &mut [u8], out: &mut [f32]) -> Result<()> {
    codec.quantize_rows(x, packed)?;
    codec.dequantize_rows(packed, out)
}

/// One layer: K-only and V-only errors at every bit width.
fn layer_errors(
    s: &CalibShape,
    k: &[f32],
    v: &[f32],
    q: &[f32],
    codecs: &[RowCodec],
    sample: QuerySample,
    k_center: Option<std::ops::Range<usize>>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (d, hk, hq) = (s.head_dim, s.n_kv_head, s.n_head);
    let center = match k_center {
        Some(r) => {
            let mut c = vec![0f32; hk * d];
            kvc_kvq::center::mean_center(&k[r.start * hk * d..r.end * hk * d], hk, d, &mut c)?;
            Some(c)
        }
        None => None,
    };
    let group = hq / hk;
    let geo = Geom {
        n_kv_head: hk,
        d,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let queries: Vec<(usize, usize)> = (sample.from..s.n_tokens)
        .step_by(sample.stride)
        .flat_map(|t| (0..hq).map(move |i| (t, i)))
        .collect();
    // Exact attention: weights and outputs, kept for the V pass and the K reference.
    let mut exact_p: Vec<Vec<f32>> = Vec::with_capacity(queries.len());
    let mut exact_o = vec![0f32; queries.len() * d];
    let mut norm = 0f64;
    for (n, &(t, i)) in queries.iter().enumerate() {
        let qv = &q[(t * hq + i) * d..][..d];
        let mut p = Vec::with_capacity(t + 1);
        attention_weights(qv, k, t, i / group, &geo, &mut p);
        let o = &mut exact_o[n * d..][..d];
        weighted_sum(&p, v, i / group, &geo, o);
        norm += o.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
        exact_p.push(p);
    }
    let mut packed = vec![0u8; s.n_tokens * hk * codecs[N_BITS - 1].row_bytes()];
    let mut deq = vec![0f32; k.len()];
    let mut p = Vec::with_capacity(s.n_tokens);
    let mut o = vec![0f32; d];
    let mut k_errs = Vec::with_capacity(N_BITS);
    let mut v_errs = Vec::with_capacity(N_BITS);
    let rel = |e: f64| if norm > 0.0 { e / norm } else { 0.0 };
    for c in codecs {
        let pk = &mut packed[..s.n_tokens * hk * c.row_bytes()];
        // K only (centered: decoded + center; the softmax would ignore the center anyway).
        match &center {
            Some(cv) => {
                c.quantize_rows_centered(k, cv, pk)?;
                c.dequantize_rows_centered(pk, cv, &mut deq)?;
            }
            None => quant_dequant(c, k, pk, &mut deq)?,
        }
        let mut err = 0f64;
        for (n, &(t, i)) in queries.iter().enumerate() {
            let qv = &q[(t * hq + i) * d..][..d];
            attention_weights(qv, &deq, t, i / group, &geo, &mut p);
            weighted_sum(&p, v, i / group, &geo, &mut o);
            err += sq_dist(&o, &exact_o[n * d..][..d]);
        }
        k_errs.push(rel(err));
        // V only: o' - o = sum_j p_j (v'_j - v_j).
        quant_dequant(c, v, pk, &mut deq)?;
        for (a, &b) in deq.iter_mut().zip(v) {
            *a -= b;
        }
        let mut err = 0f64;
        for (n, &(_, i)) in queries.iter().enumerate() {
            weighted_sum(&exact_p[n], &deq, i / group, &geo, &mut o);
            err += o.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
        }
        v_errs.push(rel(err));
    }
    Ok((k_errs, v_errs))
}

/// What [`allocate`] minimizes: per layer `w_l * (k_weight * K_err + V_err)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objective<'a> {
    /// Weight of every K error against the V errors (1: alike).
    pub k_weight: f64,
    /// Each layer's weight `w_l` (one per layer); `None`: every layer 1.
    pub layer_weights: Option<&'a [f64]>,
}

impl Objective<'_> {
    /// K weight `k_weight`, every layer weighed 1.
    pub fn k_weight(k_weight: f64) -> Objective<'static> {
        Objective {
            k_weight,
            layer_weights: None,
        }
    }

    /// The objective of `layers` on `sens` (a plan's, or a uniform configuration's).
    pub fn error_of(&self, sens: &Sensitivity, layers: &[LayerBits]) -> f64 {
        layers
            .iter()
            .enumerate()
            .map(|(l, b)| {
                self.layer_weights.map_or(1.0, |w| w[l])
                    * (self.k_weight * sens.k_err(l, b.k_bits) + sens.v_err(l, b.v_bits))
            })
            .sum()
    }
}

/// The result of [`allocate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Bits per layer.
    pub layers: Vec<LayerBits>,
    /// Sum over layers of the chosen K errors (times the K weight) and V errors.
    pub total_error: f64,
    /// Mean bits per value over all layers' K and V rows, scales included.
    pub bits_per_value: f64,
}

impl Allocation {
    /// The ratio to f16: `16 / bits_per_value`.
    pub fn ratio(&self) -> f64 {
        16.0 / self.bits_per_value
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Largest DP table (layers x byte states, 2 bytes a cell) [`allocate`] builds: 128 MiB.
/// A 128-layer model at head_dim 128 needs about 2 M cells.
pub const MAX_DP_CELLS: usize = 1 << 26;

/// Mean bits per value of `layers` (K and V rows), scales included.
pub fn plan_bits_per_value(layers: &[LayerBits], method: Method, head_dim: usize) -> Result<f64> {
    let mut bytes = 0usize;
    for l in layers {
        bytes += row_bytes(method, l.k_bits, head_dim)? + row_bytes(method, l.v_bits, head_dim)?;
    }
    Ok(8.0 * bytes as f64 / (2 * layers.len() * head_dim) as f64)
}

/// Per-layer `(k_bits, v_bits)` minimizing the summed error with mean bits per value
/// (scales included) at most `16 / ratio`: an exact dynamic program over layers (see the
/// module docs). Errors: a ratio that is not finite and > 0, a budget below 2 bits
/// everywhere (it names the largest reachable ratio), non-finite or negative errors.
///
/// `k_weight` multiplies every K error in the objective (1 treats K and V alike; end to end,
/// K errors cost more than their layer-local size says, see `data/kvq-plans/README.md`).
/// `layer_weights` (one per layer, finite and > 0) multiplies each layer's K and V errors:
/// the model's measured sensitivity to that layer (`integrations/llama/kvq-calibrate.py`
/// measures it in llama.cpp); `None` weighs every layer 1.
/// Every layer's bits are within `bounds`; the budget check then names the largest ratio
/// the bounds' minimums reach.
pub fn allocate(
    sens: &Sensitivity,
    method: Method,
    head_dim: usize,
    ratio: f64,
    objective: Objective<'_>,
    bounds: BitBounds,
) -> Result<Allocation> {
    let Objective {
        k_weight,
        layer_weights,
    } = objective;
    let n_layer = sens.k.len();
    if n_layer == 0 || sens.v.len() != n_layer {
        return Err(Error::LayoutMismatch {
            what: "sensitivity layers (V vs K, > 0)",
            expected: n_layer.max(1),
            found: sens.v.len(),
        });
    }
    if let Some(w) = layer_weights {
        if w.len() != n_layer {
            return Err(Error::LayoutMismatch {
                what: "layer weights (one per layer)",
                expected: n_layer,
                found: w.len(),
            });
        }
        if let Some(i) = w.iter().position(|x| !(x.is_finite() && *x > 0.0)) {
            return Err(Error::BadConfig {
                input: format!("layer weight {i}: {}", w[i]),
                reason: "layer weights must be finite and > 0".into(),
            });
        }
    }
    let weight_of = |l: usize| layer_weights.map_or(1.0, |w| w[l]);
    if !(ratio.is_finite() && ratio > 0.0) {
        return Err(Error::BadConfig {
            input: format!("{ratio}"),
            reason: "budget ratio must be finite and > 0".into(),
        });
    }
    if !(k_weight.is_finite() && k_weight > 0.0) {
        return Err(Error::BadConfig {
            input: format!("{k_weight}"),
            reason: "K weight must be finite and > 0".into(),
        });
    }
    if sens
        .k
        .iter()
        .chain(&sens.v)
        .flatten()
        .any(|e| !(e.is_finite() && *e >= 0.0))
    {
        return Err(Error::BadConfig {
            input: "sensitivity".into(),
            reason: "errors must be finite and >= 0".into(),
        });
    }
    let rb: Vec<usize> = BITS
        .map(|b| row_bytes(method, b, head_dim))
        .collect::<Result<_>>()?;
    let g = rb.iter().fold(0, |a, &b| gcd(a, b));
    let units: Vec<usize> = rb.iter().map(|&b| b / g).collect();
    // Largest total bytes per token (all layers, one K and one V row) within budget:
    // 8 * bytes / (2 * n_layer * head_dim) <= 16 / ratio, checked the way it is reported.
    let bpv = |bytes: usize| 8.0 * bytes as f64 / (2 * n_layer * head_dim) as f64;
    let max_units_all = n_layer * 2 * units[N_BITS - 1];
    let mut budget = None;
    for u in (0..=max_units_all).rev() {
        if bpv(u * g) <= 16.0 / ratio {
            budget = Some(u);
            break;
        }
    }
    let unit_of = |b: u8| units[usize::from(b - BITS.start())];
    let min_units = n_layer * (unit_of(bounds.k.0) + unit_of(bounds.v.0));
    let budget = match budget {
        Some(u) if u >= min_units => u,
        _ => {
            return Err(Error::BadConfig {
                input: format!("{ratio}"),
                reason: format!(
                    "budget below {} K / {} V bits everywhere: the largest ratio {} reaches with them is {:.3}",
                    bounds.k.0,
                    bounds.v.0,
                    method.tag(),
                    16.0 / bpv(min_units * g)
                ),
            })
        }
    };
    let states = budget + 1;
    if n_layer.saturating_mul(states) > MAX_DP_CELLS {
        return Err(Error::SizeOverflow {
            what: "plan allocation table (too many layers)",
        });
    }
    // Per layer: for each per-token cost (units), the cheapest-error (bk, bv).
    let pair_max = 2 * units[N_BITS - 1];
    let mut choice = vec![u16::MAX; n_layer * states];
    let mut dp = vec![f64::INFINITY; states];
    dp[0] = 0.0;
    let mut next = vec![f64::INFINITY; states];
    for l in 0..n_layer {
        let mut best = vec![(f64::INFINITY, 0u8, 0u8); pair_max + 1];
        for bk in bounds.k.0..=bounds.k.1 {
            for bv in bounds.v.0..=bounds.v.1 {
                let c = unit_of(bk) + unit_of(bv);
                let e = weight_of(l) * (k_weight * sens.k_err(l, bk) + sens.v_err(l, bv));
                if e < best[c].0 {
                    best[c] = (e, bk, bv);
                }
            }
        }
        next.fill(f64::INFINITY);
        let row = &mut choice[l * states..(l + 1) * states];
        for (s, &base) in dp.iter().enumerate() {
            if !base.is_finite() {
                continue;
            }
            for (c, &(e, bk, bv)) in best.iter().enumerate() {
                if !e.is_finite() || s + c >= states {
                    continue;
                }
                let tot = base + e;
                if tot < next[s + c] {
                    next[s + c] = tot;
                    row[s + c] = u16::from(bk) << 8 | u16::from(bv);
                }
            }
        }
        std::mem::swap(&mut dp, &mut next);
    }
    // The best end state (ties: fewer bytes).
    let (mut s, total_error) = dp.iter().enumerate().filter(|(_, e)| e.is_finite()).fold(
        (0, f64::INFINITY),
        |a, (s, &e)| if e < a.1 { (s, e) } else { a },
    );
    let mut layers = vec![
        LayerBits {
            k_bits: 2,
            v_bits: 2
        };
        n_layer
    ];
    for l in (0..n_layer).rev() {
        let c = choice[l * states + s];
        let (bk, bv) = ((c >> 8) as u8, (c & 0xff) as u8);
        layers[l] = LayerBits {
            k_bits: bk,
            v_bits: bv,
        };
        s -= unit_of(bk) + unit_of(bv);
    }
    let bits_per_value = plan_bits_per_value(&layers, method, head_dim)?;
    Ok(Allocation {
        layers,
        total_error,
        bits_per_value,
    })
}

/// Where the calibration data came from, for the plan's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalibSource {
    /// Dump directory.
    pub source: String,
    /// File tag.
    pub tag: String,
}

/// A version-2 plan for `alloc`, with its calibration record.
#[allow(clippy::too_many_arguments)]
pub fn make_plan(
    shape: CalibShape,
    method: Method,
    seed: u64,
    sample: QuerySample,
    src: &CalibSource,
    ratio: f64,
    objective: Objective<'_>,
    bounds: BitBounds,
    sens: &Sensitivity,
    alloc: &Allocation,
) -> Result<KvqPlan> {
    let range = |full: bool, (lo, hi): (u8, u8)| (!full).then_some([lo, hi]);
    let u32_of =
        |what: &'static str, x: usize| u32::try_from(x).map_err(|_| Error::SizeOverflow { what });
    let plan = KvqPlan {
        format: kvc_kvq::config::PLAN_FORMAT.into(),
        // a calibration record is version 2, with layer weights 4; protections (version 3)
        // are added by the caller
        version: if objective.layer_weights.is_some() {
            4
        } else {
            2
        },
        method: method.tag(),
        seed,
        head_dim: u32_of("head_dim", shape.head_dim)?,
        n_kv_head: u32_of("n_kv_head", shape.n_kv_head)?,
        sink_tokens: 0,
        recent_tokens: 0,
        recent_bits: None,
        k_center: false,
        layers: alloc.layers.clone(),
        calibration: Some(PlanCalibration {
            source: src.source.clone(),
            tag: src.tag.clone(),
            n_tokens: u32_of("n_tokens", shape.n_tokens)?,
            n_head: u32_of("n_head", shape.n_head)?,
            query_from: u32_of("query_from", sample.from)?,
            query_stride: u32_of("query_stride", sample.stride)?,
            budget_ratio: ratio,
            k_weight: objective.k_weight,
            k_bits_range: range(bounds.is_full(), bounds.k),
            v_bits_range: range(bounds.is_full(), bounds.v),
            k_center_tokens: None,
            layer_weights: objective.layer_weights.map(<[f64]>::to_vec),
            achieved_ratio: alloc.ratio(),
            total_error: alloc.total_error,
            layer_errors: alloc
                .layers
                .iter()
                .enumerate()
                .map(|(l, b)| LayerErrors {
                    k_err: sens.k_err(l, b.k_bits),
                    v_err: sens.v_err(l, b.v_bits),
                })
                .collect(),
        }),
    };
    plan.validate()?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn synth(shape: CalibShape, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut s = seed;
        let kv = shape.kv_len().unwrap();
        let k = (0..kv).map(|_| 2.0 * lcg(&mut s)).collect();
        let v = (0..kv).map(|_| lcg(&mut s)).collect();
        let q = (0..shape.q_len().unwrap())
            .map(|_| 2.0 * lcg(&mut s))
            .collect();
        (k, v, q)
    }

    const SHAPE: CalibShape = CalibShape {
        n_layer: 3,
        n_tokens: 96,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
    };
    fn synthetic_src() -> CalibSource {
        CalibSource {
            source: "synthetic".into(),
            tag: "t".into(),
        }
    }

    const SAMPLE: QuerySample = QuerySample {
        from: 16,
        stride: 8,
    };

    #[test]
    fn errors_fall_with_bits_and_zero_k_layer_is_insensitive() {
        let (mut k, v, q) = synth(SHAPE, 1);
        let layer = SHAPE.n_tokens * SHAPE.n_kv_head * SHAPE.head_dim;
        k[layer..2 * layer].fill(0.0);
        let s = sensitivity(SHAPE, &k, &v, &q, Method::LloydMax, 7, SAMPLE).unwrap();
        for b in BITS {
            assert_eq!(s.k_err(1, b), 0.0, "zero K, bits {b}");
            assert!(s.v_err(1, b) > 0.0);
        }
        for l in [0, 2] {
            for b in 2..8u8 {
                assert!(s.k_err(l, b) > s.k_err(l, b + 1), "layer {l} K {b}: {s:?}");
                assert!(s.v_err(l, b) > s.v_err(l, b + 1), "layer {l} V {b}: {s:?}");
            }
            // 2-bit is a real loss, 8-bit nearly none.
            assert!(s.v_err(l, 2) > 0.01 && s.v_err(l, 8) < 1e-3, "{s:?}");
        }
    }

    #[test]
    fn sensitivity_matches_a_direct_f64_reference() {
        // One layer, one KV head, two query heads: recompute the 3-bit K error in f64.
        let shape = CalibShape {
            n_layer: 1,
            n_tokens: 40,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 64,
        };
        let (k, v, q) = synth(shape, 3);
        let sample = QuerySample { from: 5, stride: 7 };
        let s = sensitivity(shape, &k, &v, &q, Method::LloydMax, 9, sample).unwrap();
        let c = RowCodec::new(Method::LloydMax, 3, 64, 9).unwrap();
        let mut packed = vec![0u8; 40 * c.row_bytes()];
        let mut kd = vec![0f32; k.len()];
        c.quantize_rows(&k, &mut packed).unwrap();
        c.dequantize_rows(&packed, &mut kd).unwrap();
        let attn = |keys: &[f32], t: usize, i: usize| -> Vec<f64> {
            let qv = &q[(t * 2 + i) * 64..][..64];
            let sc: Vec<f64> = (0..=t)
                .map(|j| {
                    (0..64)
                        .map(|x| f64::from(qv[x]) * f64::from(keys[j * 64 + x]))
                        .sum::<f64>()
                        / 8.0
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            (0..64)
                .map(|x| {
                    (0..=t)
                        .map(|j| (sc[j] - m).exp() / z * f64::from(v[j * 64 + x]))
                        .sum()
                })
                .collect()
        };
        let (mut num, mut den) = (0.0, 0.0);
        for t in (5..40).step_by(7) {
            for i in 0..2 {
                let (o, o2) = (attn(&k, t, i), attn(&kd, t, i));
                num += o
                    .iter()
                    .zip(&o2)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f64>();
                den += o.iter().map(|a| a * a).sum::<f64>();
            }
        }
        let want = num / den;
        let got = s.k_err(0, 3);
        assert!((got - want).abs() <= 1e-3 * want, "{got} vs {want}");
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (k, v, q) = synth(SHAPE, 2);
        let m = Method::LloydMax;
        assert!(sensitivity(SHAPE, &k[1..], &v, &q, m, 1, SAMPLE).is_err());
        assert!(sensitivity(SHAPE, &k, &v, &q[..q.len() - 1], m, 1, SAMPLE).is_err());
        let mut bad = SHAPE;
        bad.n_head = 3;
        assert!(sensitivity(bad, &k, &v, &q, m, 1, SAMPLE).is_err());
        bad = SHAPE;
        bad.head_dim = 48;
        assert!(sensitivity(bad, &k, &v, &q, m, 1, SAMPLE).is_err());
        let far = QuerySample {
            from: 96,
            stride: 8,
        };
        assert!(sensitivity(SHAPE, &k, &v, &q, m, 1, far).is_err());
        let zero = QuerySample { from: 0, stride: 0 };
        assert!(sensitivity(SHAPE, &k, &v, &q, m, 1, zero).is_err());
        let mut kn = k.clone();
        kn[5] = f32::NAN;
        assert!(sensitivity(SHAPE, &kn, &v, &q, m, 1, SAMPLE).is_err());
        let s = Sensitivity {
            k: vec![[0.1; N_BITS]],
            v: vec![[0.1; N_BITS]],
        };
        let alloc = |s: &Sensitivity, ratio: f64, k_weight: f64| {
            allocate(
                s,
                m,
                64,
                ratio,
                Objective::k_weight(k_weight),
                BitBounds::default(),
            )
        };
        // 2 bits everywhere is 2.25 bits/value with lm at d = 64: ratio 7.11 at most.
        let e = alloc(&s, 8.0, 1.0).unwrap_err();
        assert!(e.to_string().contains("7.111"), "{e}");
        assert!(alloc(&s, 7.1, 1.0).is_ok());
        assert!(alloc(&s, f64::NAN, 1.0).is_err());
        assert!(alloc(&s, 0.0, 1.0).is_err());
        let mut nan = s.clone();
        nan.k[0][3] = f64::NAN;
        assert!(alloc(&nan, 4.0, 1.0).is_err());
        assert!(alloc(&s, 4.0, 0.0).is_err());
        assert!(alloc(&s, 4.0, f64::INFINITY).is_err());
    }

    #[test]
    fn plan_from_calibration_round_trips() {
        let (k, v, q) = synth(SHAPE, 4);
        let s = sensitivity(SHAPE, &k, &v, &q, Method::LloydMax, 5, SAMPLE).unwrap();
        let a = allocate(
            &s,
            Method::LloydMax,
            64,
            3.5,
            Objective::k_weight(1.0),
            BitBounds::default(),
        )
        .unwrap();
        assert!(a.ratio() >= 3.5);
        let src = synthetic_src();
        let p = make_plan(
            SHAPE,
            Method::LloydMax,
            5,
            SAMPLE,
            &src,
            3.5,
            Objective::k_weight(1.0),
            BitBounds::default(),
            &s,
            &a,
        )
        .unwrap();
        let back = KvqPlan::from_json(&p.to_json()).unwrap();
        assert_eq!((back.version, &back.layers), (2, &p.layers));
        // serde_json's default float parsing may differ from the written value in the
        // last bit.
        let (x, y) = (
            back.calibration.clone().unwrap(),
            p.calibration.clone().unwrap(),
        );
        assert_eq!(
            (&x.source, &x.tag, x.n_tokens),
            (&y.source, &y.tag, y.n_tokens)
        );
        assert!((x.total_error - y.total_error).abs() <= 1e-15 * y.total_error);
        assert!((back.bits_per_value().unwrap() - a.bits_per_value).abs() < 1e-12);
        // A calibration record in a version-1 plan, or of the wrong length, is refused.
        let mut v1 = p.clone();
        v1.version = 1;
        assert!(v1.validate().is_err());
        let mut short = p.clone();
        short.calibration.as_mut().unwrap().layer_errors.pop();
        assert!(short.validate().is_err());
        // Free bounds are not recorded, so plans made without bounds are unchanged.
        assert!(!p.to_json().contains("bits_range"));
    }

    #[test]
    fn layer_weights_steer_bits_and_make_a_version_4_plan() {
        let (k, v, q) = synth(SHAPE, 4);
        let s = sensitivity(SHAPE, &k, &v, &q, Method::LloydMax, 5, SAMPLE).unwrap();
        let n = SHAPE.n_layer;
        let plain = allocate(
            &s,
            Method::LloydMax,
            64,
            4.0,
            Objective::k_weight(1.0),
            BitBounds::default(),
        )
        .unwrap();
        // Layer 0 weighs 1000 times the others: it gets at least the bits it had.
        let mut w = vec![1.0; n];
        w[0] = 1000.0;
        let obj = Objective {
            k_weight: 1.0,
            layer_weights: Some(&w),
        };
        let a = allocate(&s, Method::LloydMax, 64, 4.0, obj, BitBounds::default()).unwrap();
        let bits = |l: &LayerBits| l.k_bits + l.v_bits;
        assert!(
            bits(&a.layers[0]) > bits(&plain.layers[0]),
            "{:?} vs {:?}",
            a.layers,
            plain.layers
        );
        assert!(a.ratio() >= 4.0);
        assert!((obj.error_of(&s, &a.layers) - a.total_error).abs() <= 1e-12);
        let src = synthetic_src();
        let p = make_plan(
            SHAPE,
            Method::LloydMax,
            5,
            SAMPLE,
            &src,
            4.0,
            obj,
            BitBounds::default(),
            &s,
            &a,
        )
        .unwrap();
        assert_eq!(p.version, 4);
        let back = KvqPlan::from_json(&p.to_json()).unwrap();
        assert_eq!(back.calibration.unwrap().layer_weights.unwrap(), w);
        // Wrong length, zero, negative or non-finite weights are refused.
        for bad in [
            vec![1.0; n - 1],
            vec![1.0; n + 1],
            vec![0.0; n],
            vec![-1.0; n],
            vec![f64::NAN; n],
        ] {
            let obj = Objective {
                k_weight: 1.0,
                layer_weights: Some(&bad),
            };
            assert!(allocate(&s, Method::LloydMax, 64, 4.0, obj, BitBounds::default()).is_err());
        }
    }

    #[test]
    fn centered_k_sensitivity_sees_the_offset_removed() {
        let (mut k, v, q) = synth(SHAPE, 8);
        // A large constant offset on every 5th channel, as this model's K has.
        for (i, x) in k.iter_mut().enumerate() {
            if (i % SHAPE.head_dim).is_multiple_of(5) {
                *x += 8.0;
            }
        }
        let m = Method::LloydMax;
        let plain = sensitivity(SHAPE, &k, &v, &q, m, 3, SAMPLE).unwrap();
        let centered = sensitivity_with(SHAPE, &k, &v, &q, m, 3, SAMPLE, Some(4..36)).unwrap();
        for l in 0..SHAPE.n_layer {
            assert!(
                centered.k_err(l, 4) < 0.5 * plain.k_err(l, 4),
                "layer {l}: {} vs {}",
                centered.k_err(l, 4),
                plain.k_err(l, 4)
            );
            // V is untouched.
            assert_eq!(centered.v[l], plain.v[l]);
        }
        for bad in [4..4, 90..97] {
            assert!(sensitivity_with(SHAPE, &k, &v, &q, m, 3, SAMPLE, Some(bad)).is_err());
        }
    }

    #[test]
    fn bounds_hold_and_are_recorded() {
        let (k, v, q) = synth(SHAPE, 6);
        let s = sensitivity(SHAPE, &k, &v, &q, Method::LloydMax, 5, SAMPLE).unwrap();
        let b = BitBounds::new((4, 6), (4, 8)).unwrap();
        let a = allocate(&s, Method::LloydMax, 64, 3.6, Objective::k_weight(1.0), b).unwrap();
        assert!(a.layers.iter().all(|l| b.allows(l.k_bits, l.v_bits)));
        let src = synthetic_src();
        let p = make_plan(
            SHAPE,
            Method::LloydMax,
            5,
            SAMPLE,
            &src,
            3.6,
            Objective::k_weight(1.0),
            b,
            &s,
            &a,
        )
        .unwrap();
        let back = KvqPlan::from_json(&p.to_json()).unwrap();
        let cal = back.calibration.clone().unwrap();
        assert_eq!(
            (cal.k_bits_range, cal.v_bits_range),
            (Some([4, 6]), Some([4, 8]))
        );
        // A layer outside its recorded range, or a range out of order, is refused.
        let mut out = back.clone();
        out.layers[0].k_bits = 7;
        assert!(out
            .validate()
            .unwrap_err()
            .to_string()
            .contains("k_bits_range"));
        let mut order = back.clone();
        order.calibration.as_mut().unwrap().v_bits_range = Some([6, 5]);
        assert!(order.validate().is_err());
        // K center tokens must be a non-empty range within the dump.
        for (range, ok) in [([4, 68], true), ([5, 5], false), ([0, 97], false)] {
            let mut c = back.clone();
            c.calibration.as_mut().unwrap().k_center_tokens = Some(range);
            assert_eq!(c.validate().is_ok(), ok, "{range:?}");
        }
        // Minimums above the budget name the ratio they reach: k4v4 rows are 4.25 bits.
        let e = allocate(&s, Method::LloydMax, 64, 3.9, Objective::k_weight(1.0), b).unwrap_err();
        assert!(e.to_string().contains("3.765"), "{e}");
        // Equal bounds are a uniform plan.
        let one = BitBounds::new((5, 5), (3, 3)).unwrap();
        let a = allocate(&s, Method::LloydMax, 64, 2.0, Objective::k_weight(1.0), one).unwrap();
        assert!(a.layers.iter().all(|l| (l.k_bits, l.v_bits) == (5, 3)));
        for bad in [
            ((1, 8), (2, 8)),
            ((2, 9), (2, 8)),
            ((5, 4), (2, 8)),
            ((2, 8), (0, 0)),
        ] {
            assert!(BitBounds::new(bad.0, bad.1).is_err(), "{bad:?}");
        }
    }

    fn table() -> impl Strategy<Value = (Vec<[f64; N_BITS]>, Vec<[f64; N_BITS]>)> {
        (1usize..12).prop_flat_map(|n| {
            let row = proptest::array::uniform7(0.0f64..1.0);
            (
                proptest::collection::vec(row.clone(), n),
                proptest::collection::vec(row, n),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn allocation_fits_budget_and_beats_every_uniform_choice(
            (k, v) in table(),
            ratio in 1.5f64..7.1,
            k_weight in prop_oneof![Just(1.0f64), 0.25f64..8.0],
            uniform_group in prop_oneof![Just(None), Just(Some(32u16))],
            (k_lo, k_hi, v_lo, v_hi) in (2u8..=8, 2u8..=8, 2u8..=8, 2u8..=8),
            weights in proptest::option::of(proptest::collection::vec(0.05f64..20.0, 12)),
        ) {
            let bounds = BitBounds::new(
                (k_lo.min(k_hi), k_lo.max(k_hi)),
                (v_lo.min(v_hi), v_lo.max(v_hi)),
            ).unwrap();
            let s = Sensitivity { k, v };
            let m = uniform_group.map_or(Method::LloydMax, |group| Method::Uniform { group });
            let d = 64;
            let min_bpv = 4.0 * (row_bytes(m, bounds.k.0, d).unwrap()
                + row_bytes(m, bounds.v.0, d).unwrap()) as f64 / d as f64;
            prop_assume!(16.0 / ratio >= min_bpv);
            let w = weights.as_ref().map(|w| &w[..s.k.len()]);
            let obj = Objective { k_weight, layer_weights: w };
            let a = allocate(&s, m, d, ratio, obj, bounds).unwrap();
            prop_assert!(a.layers.iter().all(|l| bounds.allows(l.k_bits, l.v_bits)));
            prop_assert!(a.bits_per_value <= 16.0 / ratio, "{} > {}", a.bits_per_value, 16.0 / ratio);
            let recomputed: f64 = a.layers.iter().enumerate()
                .map(|(l, b)| w.map_or(1.0, |w| w[l])
                    * (k_weight * s.k_err(l, b.k_bits) + s.v_err(l, b.v_bits))).sum();
            prop_assert!((recomputed - a.total_error).abs() <= 1e-9);
            prop_assert!((obj.error_of(&s, &a.layers) - a.total_error).abs() <= 1e-9);
            for bk in BITS {
                for bv in BITS {
                    let u = vec![LayerBits { k_bits: bk, v_bits: bv }; s.k.len()];
                    if bounds.allows(bk, bv) && plan_bits_per_value(&u, m, d).unwrap() <= 16.0 / ratio {
                        let ue = obj.error_of(&s, &u);
                        prop_assert!(a.total_error <= ue + 1e-9,
                            "k{bk}v{bv}: {} > {ue}", a.total_error);
                    }
                }
            }
        }
    }
}
