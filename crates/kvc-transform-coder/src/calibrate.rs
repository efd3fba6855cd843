//! Making a calibration from a dump of the model's own K, V and Q (the llama.cpp client's
//! `--modes dump`, on texts that are not evaluated).
//!
//! For every layer, independently:
//! 1. K is rotated back to its pre-RoPE values at its positions (V as it is); per KV head,
//!    the mean and the covariance of the rows after the sink tokens give the transform (the
//!    covariance's eigenvectors, largest variance first: PCA).
//! 2. Steps: V's components share one step `b`; K's component `i` gets `a / sqrt(w_i)` with
//!    `w_i` the mean energy of the (pre-RoPE) queries of the head's group along it, relative
//!    to the mean over components, so that K components the queries look along are coded
//!    finer (equal score error per component is what minimizes rate for a score error).
//! 3. On a grid of `a` (V exact) and of `b` (K exact), the layer's attention-output error
//!    `Σ‖o′−o‖² / Σ‖o‖²` over sampled causal queries, with the coder's real reconstruction
//!    rounded to f16, and the coded rate (empirical entropy of each component's symbols plus
//!    extra bits).
//! 4. For each bound: over all layers at once, the grid points of least total rate whose
//!    K-only and V-only errors, summed per layer, average at most the bound over layers
//!    (a Lagrangian allocation: every layer and tensor at the same rate-per-error slope, so
//!    bits go where they buy the most error); then each layer is coded with K and V together
//!    and its joint error measured, and the slope raised until the mean of those joint errors
//!    is within the bound too. So the bound holds for the mean over layers on the
//!    calibration text (each layer's own error is in the report).
//! 5. Symbol tables: components are grouped by `σ_i / step_i` (quarter octaves), and each
//!    group's table is the symbol histogram of its components on the calibration text.

use rayon::prelude::*;

use half::f16;
use kvc_types::Tensor;

use crate::calibration::{slot, Calibration, HeadBasis, Target};
use crate::eigen::symmetric_eigen;
use crate::error::{Error, Result};
use crate::rans::{self, SymbolTable, MAX_MAGNITUDE, NSYM};
use crate::rope::Rope;

/// A dump: `[n_layer][n_tokens][n_kv_head][head_dim]` K and V as the cache holds them
/// (after RoPE), and `[n_layer][n_tokens][n_head][head_dim]` Q (after RoPE).
#[derive(Debug, Clone, Copy)]
pub struct Dump<'a> {
    /// Layers.
    pub n_layer: usize,
    /// Tokens, from position 0.
    pub n_tokens: usize,
    /// KV heads.
    pub n_kv_head: usize,
    /// Query heads (a multiple of `n_kv_head`).
    pub n_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// K.
    pub k: &'a [f32],
    /// V.
    pub v: &'a [f32],
    /// Q.
    pub q: &'a [f32],
}

/// What a calibration is made for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The model's RoPE (from its metadata).
    pub rope: Rope,
    /// Positions stored raw.
    pub n_sink: usize,
    /// Attention-output error bounds, one target each.
    pub bounds: Vec<f32>,
    /// First sampled query position.
    pub query_from: usize,
    /// Every `query_stride`-th position from `query_from` is a query.
    pub query_stride: usize,
    /// Each layer's weight in the bound: how much the model's output moves per unit of the
    /// layer's attention-output error (measured in the engine, `kvc tc sensitivity`). The
    /// bound then holds for the weighted mean `Σ w_l·e_l / Σ w_l`, so bits move from layers
    /// the output barely feels to those it feels most. Empty: every layer weighs the same.
    pub layer_weights: Vec<f64>,
}

/// What a target reached on one layer of the calibration text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerResult {
    /// Joint attention-output error of the layer (the bound holds for their mean).
    pub error: f64,
    /// Coded bits per K value (sink tokens excluded).
    pub k_bits: f64,
    /// Coded bits per V value.
    pub v_bits: f64,
}

/// Per target (as [`Options::bounds`]), per layer.
pub type Report = Vec<Vec<LayerResult>>;

const GRID: usize = 44;
const GRID_FROM: f64 = -9.0; // octaves below the tensor's RMS component
const N_CLASS: usize = 96;
const CLASS_ZERO: f64 = 40.0; // class of σ/step = 1

fn grid_scale(m: usize) -> f64 {
    (GRID_FROM + m as f64 / 4.0).exp2()
}

/// One layer's tensors, pre-RoPE K, the bases and the exact attention.
struct Layer<'a> {
    dump: &'a Dump<'a>,
    opts: &'a Options,
    k_post: &'a [f32],
    v: &'a [f32],
    q: &'a [f32],
    k_pre: Vec<f32>,
    bases: Vec<HeadBasis>, // [K, V][head]
    sigma: Vec<f64>,       // [K, V][head][component]
    k_weight: Vec<f64>,    // [head][component]
    queries: Vec<usize>,
    exact_o: Vec<f32>,
    exact_p: Vec<Vec<f32>>,
    norm: f64,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl<'a> Layer<'a> {
    fn d(&self) -> usize {
        self.dump.head_dim
    }
    fn hk(&self) -> usize {
        self.dump.n_kv_head
    }

    fn new(dump: &'a Dump<'a>, opts: &'a Options, layer: usize) -> Layer<'a> {
        let (t_n, hk, hq, d) = (dump.n_tokens, dump.n_kv_head, dump.n_head, dump.head_dim);
        let kv = t_n * hk * d;
        let k_post = &dump.k[layer * kv..(layer + 1) * kv];
        let v = &dump.v[layer * kv..(layer + 1) * kv];
        let q = &dump.q[layer * t_n * hq * d..(layer + 1) * t_n * hq * d];
        let mut k_pre = k_post.to_vec();
        let mut q_pre = q.to_vec();
        let mut cs = vec![0f64; d];
        for t in 0..t_n {
            opts.rope.angles(t as u64, &mut cs);
            for row in k_pre[t * hk * d..(t + 1) * hk * d].chunks_exact_mut(d) {
                opts.rope.rotate(&cs, row, true);
            }
            for row in q_pre[t * hq * d..(t + 1) * hq * d].chunks_exact_mut(d) {
                opts.rope.rotate(&cs, row, true);
            }
        }
        let from = opts.n_sink.min(t_n - 1);
        let mut bases = Vec::with_capacity(2 * hk);
        let mut sigma = Vec::with_capacity(2 * hk * d);
        for x in [&k_pre[..], v] {
            for h in 0..hk {
                let rows = (from..t_n).map(|t| &x[(t * hk + h) * d..(t * hk + h + 1) * d]);
                let cnt = (t_n - from) as f64;
                let mut mean = vec![0f64; d];
                for r in rows.clone() {
                    for (m, &v) in mean.iter_mut().zip(r) {
                        *m += v as f64;
                    }
                }
                mean.iter_mut().for_each(|m| *m /= cnt);
                let mut cov = vec![0f64; d * d];
                for r in rows {
                    let c: Vec<f64> = r.iter().zip(&mean).map(|(&v, m)| v as f64 - m).collect();
                    for i in 0..d {
                        for j in i..d {
                            cov[i * d + j] += c[i] * c[j];
                        }
                    }
                }
                for i in 0..d {
                    for j in i..d {
                        cov[i * d + j] /= cnt;
                        cov[j * d + i] = cov[i * d + j];
                    }
                }
                let (vals, vecs) = symmetric_eigen(&cov, d);
                sigma.extend(vals.iter().map(|v| v.max(0.0).sqrt()));
                bases.push(HeadBasis {
                    mean: mean.iter().map(|&m| m as f32).collect(),
                    basis: vecs.iter().map(|&u| u as f32).collect(),
                });
            }
        }
        // K weights: mean squared pre-RoPE query projection on each K component.
        let group = hq / hk;
        let mut k_weight = vec![0f64; hk * d];
        for h in 0..hk {
            let b = &bases[h];
            let w = &mut k_weight[h * d..(h + 1) * d];
            for t in from..t_n {
                for g in 0..group {
                    let qr = &q_pre[(t * hq + h * group + g) * d..][..d];
                    for (i, wi) in w.iter_mut().enumerate() {
                        let p = dot(&b.basis[i * d..(i + 1) * d], qr) as f64;
                        *wi += p * p;
                    }
                }
            }
            let mean = w.iter().sum::<f64>() / d as f64;
            for wi in w.iter_mut() {
                *wi = if mean > 0.0 {
                    (*wi / mean).clamp(1e-4, 1e4)
                } else {
                    1.0
                };
            }
        }
        let queries: Vec<usize> = (opts.query_from.max(1)..t_n)
            .step_by(opts.query_stride.max(1))
            .collect();
        let mut l = Layer {
            dump,
            opts,
            k_post,
            v,
            q,
            k_pre,
            bases,
            sigma,
            k_weight,
            queries,
            exact_o: Vec::new(),
            exact_p: Vec::new(),
            norm: 0.0,
        };
        let (o, p) = l.attention(l.k_post, l.v, true);
        l.norm = o.iter().map(|&x| (x as f64) * (x as f64)).sum();
        l.exact_o = o;
        l.exact_p = p;
        l
    }

    /// Causal attention of the sampled queries over `k` / `v` (post-RoPE, f32): outputs and
    /// (if `keep`) the weights.
    fn attention(&self, k: &[f32], v: &[f32], keep: bool) -> (Vec<f32>, Vec<Vec<f32>>) {
        let (hk, hq, d) = (self.hk(), self.dump.n_head, self.d());
        let group = hq / hk;
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; self.queries.len() * hq * d];
        let mut ps = Vec::new();
        let mut p = Vec::new();
        for (n, &t) in self.queries.iter().enumerate() {
            for i in 0..hq {
                let h = i / group;
                let qr = &self.q[(t * hq + i) * d..][..d];
                p.clear();
                p.extend((0..=t).map(|j| dot(qr, &k[(j * hk + h) * d..][..d]) * scale));
                let mx = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0f32;
                for x in p.iter_mut() {
                    *x = (*x - mx).exp();
                    s += *x;
                }
                let o = &mut out[(n * hq + i) * d..][..d];
                for (j, x) in p.iter_mut().enumerate() {
                    *x /= s;
                    for (a, b) in o.iter_mut().zip(&v[(j * hk + h) * d..][..d]) {
                        *a += *x * b;
                    }
                }
                if keep {
                    ps.push(p.clone());
                }
            }
        }
        (out, ps)
    }

    /// V-only output with the exact weights.
    fn v_output(&self, v: &[f32]) -> Vec<f32> {
        let (hk, hq, d) = (self.hk(), self.dump.n_head, self.d());
        let group = hq / hk;
        let mut out = vec![0f32; self.queries.len() * hq * d];
        for (n, _) in self.queries.iter().enumerate() {
            for i in 0..hq {
                let h = i / group;
                let o = &mut out[(n * hq + i) * d..][..d];
                for (j, &x) in self.exact_p[n * hq + i].iter().enumerate() {
                    for (a, b) in o.iter_mut().zip(&v[(j * hk + h) * d..][..d]) {
                        *a += x * b;
                    }
                }
            }
        }
        out
    }

    fn error(&self, o: &[f32]) -> f64 {
        let e: f64 = o
            .iter()
            .zip(&self.exact_o)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        if self.norm > 0.0 {
            e / self.norm
        } else {
            0.0
        }
    }

    /// Steps of `tensor` at grid scale `s` (relative to its RMS component).
    fn steps(&self, tensor: Tensor, s: f64) -> Vec<f32> {
        let (hk, d) = (self.hk(), self.d());
        let t = usize::from(tensor == Tensor::V);
        let sig = &self.sigma[t * hk * d..(t + 1) * hk * d];
        let rms = (sig.iter().map(|x| x * x).sum::<f64>() / sig.len() as f64).sqrt();
        let a = (s * rms).max(1e-12);
        (0..hk * d)
            .map(|i| match tensor {
                Tensor::K => (a / self.k_weight[i].sqrt()) as f32,
                Tensor::V => a as f32,
            })
            .collect()
    }

    /// Codes `tensor` with `steps` as the coder does: the reconstruction (post-RoPE, f16
    /// rounded; sink tokens exact), per-component symbol counts and the rate in bits per
    /// value.
    fn code(&self, tensor: Tensor, steps: &[f32]) -> (Vec<f32>, Vec<[u64; NSYM]>, f64) {
        let (t_n, hk, d) = (self.dump.n_tokens, self.hk(), self.d());
        let src = match tensor {
            Tensor::K => &self.k_pre,
            Tensor::V => self.v,
        };
        let t = usize::from(tensor == Tensor::V);
        let mut out = match tensor {
            Tensor::K => self.k_post.to_vec(),
            Tensor::V => self.v.to_vec(),
        };
        let mut counts = vec![[0u64; NSYM]; hk * d];
        let mut extra = 0u64;
        let (mut y, mut acc) = (vec![0f32; d], vec![0f32; d]);
        let mut cs = vec![0f64; d];
        let from = self.opts.n_sink.min(t_n);
        for tok in from..t_n {
            if tensor == Tensor::K {
                self.opts.rope.angles(tok as u64, &mut cs);
            }
            for h in 0..hk {
                let b = &self.bases[t * hk + h];
                let x = &src[(tok * hk + h) * d..][..d];
                let c: Vec<f32> = x.iter().zip(&b.mean).map(|(a, m)| a - m).collect();
                for (i, yi) in y.iter_mut().enumerate() {
                    *yi = dot(&b.basis[i * d..(i + 1) * d], &c);
                }
                acc.copy_from_slice(&b.mean);
                for i in 0..d {
                    let st = steps[h * d + i];
                    let q = crate::section::quantize(y[i], st)
                        .clamp(-(MAX_MAGNITUDE as f32), MAX_MAGNITUDE as f32)
                        as i32;
                    let (sym, nb, _) = rans::split(q);
                    counts[h * d + i][sym as usize] += 1;
                    extra += u64::from(nb);
                    if q != 0 {
                        let cq = q as f32 * st;
                        for (a, u) in acc.iter_mut().zip(&b.basis[i * d..(i + 1) * d]) {
                            *a += cq * u;
                        }
                    }
                }
                if tensor == Tensor::K {
                    self.opts.rope.rotate(&cs, &mut acc, false);
                }
                let o = &mut out[(tok * hk + h) * d..][..d];
                for (dst, &a) in o.iter_mut().zip(&acc) {
                    *dst = f16::from_f32(a).to_f32();
                }
            }
        }
        let n = ((t_n - from) * hk * d).max(1) as f64;
        let mut bits = extra as f64;
        for c in &counts {
            let tot: u64 = c.iter().sum();
            for &k in c.iter().filter(|&&k| k > 0) {
                bits -= k as f64 * (k as f64 / tot as f64).log2();
            }
        }
        (out, counts, bits / n)
    }

    fn classes(&self, tensor: Tensor, steps: &[f32]) -> Vec<u8> {
        let (hk, d) = (self.hk(), self.d());
        let t = usize::from(tensor == Tensor::V);
        (0..hk * d)
            .map(|i| {
                let r = self.sigma[t * hk * d + i].max(1e-30) / steps[i] as f64;
                (4.0 * r.log2() + CLASS_ZERO)
                    .round()
                    .clamp(0.0, (N_CLASS - 1) as f64) as u8
            })
            .collect()
    }
}

/// One target's choice on one layer.
struct Choice {
    steps: [Vec<f32>; 2],
    classes: [Vec<u8>; 2],
    counts: [Vec<[u64; NSYM]>; 2],
    result: LayerResult,
}

/// One layer with its K-only and V-only (error, rate) curves over the step grid.
struct Curves<'a> {
    layer: Layer<'a>,
    /// The layer's weight in the bound (mean 1 over layers).
    weight: f64,
    k: Vec<(f64, f64)>,
    v: Vec<(f64, f64)>,
}

fn curves<'a>(dump: &'a Dump<'a>, opts: &'a Options, layer: usize, weight: f64) -> Curves<'a> {
    let l = Layer::new(dump, opts, layer);
    let k = (0..GRID)
        .map(|m| {
            let (kq, _, r) = l.code(Tensor::K, &l.steps(Tensor::K, grid_scale(m)));
            (l.error(&l.attention(&kq, l.v, false).0), r)
        })
        .collect();
    let v = (0..GRID)
        .map(|m| {
            let (vq, _, r) = l.code(Tensor::V, &l.steps(Tensor::V, grid_scale(m)));
            (l.error(&l.v_output(&vq)), r)
        })
        .collect();
    Curves {
        layer: l,
        weight,
        k,
        v,
    }
}

/// The grid point of least `rate + lambda·error` (`lambda` includes the layer's weight).
fn best_point(curve: &[(f64, f64)], lambda: f64) -> usize {
    (0..curve.len())
        .min_by(|&a, &b| {
            let f = |m: usize| curve[m].1 + lambda * curve[m].0;
            f(a).total_cmp(&f(b)).then(b.cmp(&a))
        })
        .unwrap_or(0)
}

/// Per layer, the K and V grid points at `lambda` (separable: K and V errors add).
fn points(all: &[Curves<'_>], lambda: f64) -> Vec<(usize, usize)> {
    all.iter()
        .map(|c| {
            let l = lambda * c.weight;
            (best_point(&c.k, l), best_point(&c.v, l))
        })
        .collect()
}

fn predicted_mean_error(all: &[Curves<'_>], pts: &[(usize, usize)]) -> f64 {
    all.iter()
        .zip(pts)
        .map(|(c, &(mk, mv))| c.weight * (c.k[mk].0 + c.v[mv].0))
        .sum::<f64>()
        / all.len() as f64
}

/// The `lambda` (rate per unit of error) at which the predicted mean error just meets
/// `bound`: bisection in log space (the error falls as `lambda` grows).
fn lambda_for(all: &[Curves<'_>], bound: f64) -> f64 {
    let (mut lo, mut hi) = (-10.0f64, 40.0f64); // log2 lambda
    for _ in 0..80 {
        let mid = 0.5 * (lo + hi);
        if predicted_mean_error(all, &points(all, mid.exp2())) <= bound {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi.exp2()
}

/// Codes layer `c` at grid points `(mk, mv)` as the coder does: the choice and its real
/// joint error.
fn choose(c: &Curves<'_>, mk: usize, mv: usize) -> Choice {
    let l = &c.layer;
    let ks = l.steps(Tensor::K, grid_scale(mk));
    let vs = l.steps(Tensor::V, grid_scale(mv));
    let (kq, kc, kr) = l.code(Tensor::K, &ks);
    let (vq, vc, vr) = l.code(Tensor::V, &vs);
    let e = l.error(&l.attention(&kq, &vq, false).0);
    Choice {
        classes: [l.classes(Tensor::K, &ks), l.classes(Tensor::V, &vs)],
        steps: [ks, vs],
        counts: [kc, vc],
        result: LayerResult {
            error: e,
            k_bits: kr,
            v_bits: vr,
        },
    }
}

/// One target's choices for every layer: the least total rate whose mean joint error over
/// layers is within `bound` (Lagrangian allocation over layers, K and V; the joint errors
/// are then measured, and `lambda` raised until their mean is within the bound too).
fn allocate(all: &[Curves<'_>], bound: f64) -> Vec<Choice> {
    let mut lambda = lambda_for(all, bound);
    let mut last = Vec::new();
    for _ in 0..40 {
        let pts = points(all, lambda);
        let choices: Vec<Choice> = all
            .par_iter()
            .zip(pts.par_iter())
            .map(|(c, &(mk, mv))| choose(c, mk, mv))
            .collect();
        let mean = choices
            .iter()
            .zip(all)
            .map(|(ch, c)| c.weight * ch.result.error)
            .sum::<f64>()
            / all.len() as f64;
        if mean <= bound {
            return choices;
        }
        last = choices;
        lambda *= 1.08;
    }
    last
}

/// Makes a calibration (and what each target reached on each layer) from `dump`.
pub fn calibrate(dump: &Dump<'_>, opts: &Options) -> Result<(Calibration, Report)> {
    let (l_n, t_n, hk, hq, d) = (
        dump.n_layer,
        dump.n_tokens,
        dump.n_kv_head,
        dump.n_head,
        dump.head_dim,
    );
    let inv = |r: String| Err(Error::invalid("calibration dump", r));
    if l_n == 0 || hk == 0 || hq == 0 || hq % hk != 0 || d < 2 || d % 2 != 0 {
        return inv(format!(
            "{l_n} layers, {hk} KV heads, {hq} query heads, head_dim {d}"
        ));
    }
    if t_n < opts.n_sink + 2 * d || t_n <= opts.query_from {
        return inv(format!(
            "{t_n} tokens: need at least {} (the sink plus 2·head_dim) and more than the first query {}",
            opts.n_sink + 2 * d,
            opts.query_from
        ));
    }
    let kv = l_n * t_n * hk * d;
    if dump.k.len() != kv || dump.v.len() != kv || dump.q.len() != l_n * t_n * hq * d {
        return inv("K, V or Q length does not match the layout".into());
    }
    if let Some(i) = dump
        .k
        .iter()
        .chain(dump.v)
        .chain(dump.q)
        .position(|x| !x.is_finite())
    {
        return inv(format!("a non-finite value (element {i} of K, V, Q)"));
    }
    if opts.rope.n_rot() > d {
        return inv(format!(
            "RoPE rotates {} channels of {d}",
            opts.rope.n_rot()
        ));
    }
    if Rope::from_theta(opts.rope.kind(), d, opts.rope.theta().to_vec()).as_ref() != Ok(&opts.rope)
    {
        return inv(format!("RoPE made for rows other than head_dim {d}"));
    }
    let mut bounds = opts.bounds.clone();
    bounds.sort_by(f32::total_cmp);
    bounds.dedup();
    if bounds.is_empty() || bounds.iter().any(|b| !(b.is_finite() && *b > 0.0)) {
        return inv(format!("bounds {:?}: need positive numbers", opts.bounds));
    }
    let weights = match opts.layer_weights.len() {
        0 => vec![1.0; l_n],
        n if n == l_n => {
            if let Some(w) = opts
                .layer_weights
                .iter()
                .find(|w| !(w.is_finite() && **w > 0.0))
            {
                return inv(format!("layer weight {w}: need positive numbers"));
            }
            let mean = opts.layer_weights.iter().sum::<f64>() / l_n as f64;
            opts.layer_weights.iter().map(|w| w / mean).collect()
        }
        n => return inv(format!("{n} layer weights for {l_n} layers")),
    };
    let all: Vec<Curves<'_>> = (0..l_n)
        .into_par_iter()
        .map(|layer| curves(dump, opts, layer, weights[layer]))
        .collect();
    // [target][layer] -> [layer][target]
    let mut by_target: Vec<std::vec::IntoIter<Choice>> = bounds
        .iter()
        .map(|&b| allocate(&all, f64::from(b)).into_iter())
        .collect();
    let per_layer: Vec<(Vec<HeadBasis>, Vec<Choice>)> = all
        .into_iter()
        .map(|c| {
            let ch = by_target
                .iter_mut()
                .map(|t| t.next().expect("one choice per layer"))
                .collect();
            (c.layer.bases, ch)
        })
        .collect();
    let mut class_counts = vec![[0u64; NSYM]; N_CLASS];
    let mut targets: Vec<Target> = bounds
        .iter()
        .map(|&bound| Target {
            bound,
            steps: vec![0f32; l_n * 2 * hk * d],
            classes: vec![0u8; l_n * 2 * hk * d],
        })
        .collect();
    let mut bases = Vec::with_capacity(l_n * 2 * hk);
    let mut report: Report = vec![Vec::with_capacity(l_n); bounds.len()];
    for (layer, (lb, choices)) in per_layer.into_iter().enumerate() {
        bases.extend(lb);
        for (ti, c) in choices.into_iter().enumerate() {
            report[ti].push(c.result);
            for (t, tensor) in Tensor::ALL.into_iter().enumerate() {
                let o = slot(hk, layer, tensor, 0) * d;
                targets[ti].steps[o..o + hk * d].copy_from_slice(&c.steps[t]);
                targets[ti].classes[o..o + hk * d].copy_from_slice(&c.classes[t]);
                for (&class, counts) in c.classes[t].iter().zip(&c.counts[t]) {
                    for (a, b) in class_counts[class as usize].iter_mut().zip(counts) {
                        *a += b;
                    }
                }
            }
        }
    }
    let tables = class_counts.iter().map(SymbolTable::from_counts).collect();
    let cal = Calibration {
        n_layer: l_n,
        n_kv_head: hk,
        head_dim: d,
        n_sink: opts.n_sink,
        rope: opts.rope.clone(),
        tables,
        bases,
        targets,
    };
    cal.validate()?;
    Ok((cal, report))
}
