//! Layer-local attention-output matching: what the trainer minimises, and its gradient.
//!
//! A window is the first `S` tokens of a dump. The first `sink` tokens stay as they are, the
//! middle `[sink, S - recent)` is cut into `M = (S - recent - sink) / F` groups of `F` tokens
//! from `sink` on, each group's K (and V) becomes one row through the K (and V) MLP, and the
//! tokens after the last group, `[sink + M F, S)` (the `recent` tokens and the remainder of the
//! middle), stay as they are, as kvc-mlp compresses a segment. Queries at positions in
//! `[S - recent, S)` attend causally over `sink + M + (S - sink - M F)` rows; their output
//! `softmax(q K'^T / sqrt(D)) V'` is compared with `softmax(q K^T / sqrt(D)) V` over the
//! full cache `[0, p]`. Query head `g` reads KV head `g / (n_head / n_kv_head)`, as llama.cpp
//! and the HF `repeat_kv` do.
//!
//! Positions follow kvc-mlp's RoPE-decoupled rule: a compressed row is the MLP of post-RoPE
//! keys, never re-rotated, and tokens after the compressed span keep their true positions, so
//! the queries are the dump's post-RoPE queries as they are and the uncompressed rows are
//! the dump's rows.
//!
//! The loss of a batch of windows is `sum |o' - o|^2 / sum |o|^2` over every query, head and
//! channel: the relative squared error of the attention outputs.

use crate::mlp::{MlpCache, MlpParams};
use crate::real::{cols, gemm, rows, Real};

/// Sink, recent span and group size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Leading tokens never compressed.
    pub sink: usize,
    /// Trailing tokens never compressed; queries come from them.
    pub recent: usize,
    /// Tokens per group.
    pub factor: usize,
}

impl Geometry {
    /// Number of groups a window of `s` tokens compresses (0 if it is too short).
    pub fn groups(&self, s: usize) -> usize {
        s.saturating_sub(self.recent + self.sink) / self.factor.max(1)
    }
}

/// One layer of one dump, head-major, with the full-cache attention outputs precomputed.
#[derive(Debug, Clone)]
pub struct LayerData<T> {
    /// Tokens `T`.
    pub tokens: usize,
    /// KV heads `H`.
    pub kv_heads: usize,
    /// Query heads (a multiple of `H`).
    pub q_heads: usize,
    /// Head dimension `D`.
    pub head_dim: usize,
    /// Keys, `[H][T][D]`, post-RoPE.
    pub k: Vec<T>,
    /// Values, `[H][T][D]`.
    pub v: Vec<T>,
    /// Queries, `[Hq][T][D]`, post-RoPE, before the `1/sqrt(D)` scale.
    pub q: Vec<T>,
    /// The full cache's attention output of every query, `[Hq][T][D]`.
    pub o_full: Vec<T>,
}

fn head_major<T: Copy>(src: &[T], tokens: usize, heads: usize, d: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(src.len());
    for h in 0..heads {
        for t in 0..tokens {
            out.extend_from_slice(&src[(t * heads + h) * d..(t * heads + h + 1) * d]);
        }
    }
    out
}

/// Softmax of each row of `s` (`cols` wide) in place, entries past `valid(row)` set to 0.
/// The sum is accumulated in f64.
fn softmax_rows<T: Real>(s: &mut [T], cols_: usize, valid: impl Fn(usize) -> usize) {
    for (r, row) in s.chunks_exact_mut(cols_).enumerate() {
        let n = valid(r);
        let mut max = row[0];
        for &x in &row[1..n] {
            if x > max {
                max = x;
            }
        }
        let mut sum = 0f64;
        for x in &mut row[..n] {
            *x = (*x - max).exp();
            sum += x.to_f64();
        }
        let inv = T::from_f64(1.0 / sum);
        for x in &mut row[..n] {
            *x *= inv;
        }
        row[n..].fill(T::ZERO);
    }
}

impl<T: Real> LayerData<T> {
    /// From token-major `[T][H][D]` K and V and `[T][Hq][D]` Q (the dump layout), computing
    /// the full-cache attention outputs. Shapes are checked by the caller.
    pub fn new(
        tokens: usize,
        kv_heads: usize,
        q_heads: usize,
        head_dim: usize,
        k: &[T],
        v: &[T],
        q: &[T],
    ) -> Self {
        let d = head_dim;
        let k = head_major(k, tokens, kv_heads, d);
        let v = head_major(v, tokens, kv_heads, d);
        let q = head_major(q, tokens, q_heads, d);
        let g = q_heads / kv_heads;
        let scale = T::from_f64(1.0 / (d as f64).sqrt());
        let mut o_full = vec![T::ZERO; q_heads * tokens * d];
        let mut s = vec![T::ZERO; tokens * tokens];
        for qh in 0..q_heads {
            let h = qh / g;
            let kh = &k[h * tokens * d..(h + 1) * tokens * d];
            let vh = &v[h * tokens * d..(h + 1) * tokens * d];
            let qq = &q[qh * tokens * d..(qh + 1) * tokens * d];
            gemm(
                tokens,
                d,
                tokens,
                scale,
                rows(qq, d),
                cols(kh, d),
                T::ZERO,
                &mut s,
                tokens,
            );
            softmax_rows(&mut s, tokens, |p| p + 1);
            gemm(
                tokens,
                tokens,
                d,
                T::ONE,
                rows(&s, tokens),
                rows(vh, d),
                T::ZERO,
                &mut o_full[qh * tokens * d..(qh + 1) * tokens * d],
                d,
            );
        }
        LayerData {
            tokens,
            kv_heads,
            q_heads,
            head_dim,
            k,
            v,
            q,
            o_full,
        }
    }

    /// Root mean square of every K and of every V entry (f64 sums).
    pub fn rms(&self) -> (f64, f64) {
        let ms = |x: &[T]| x.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / x.len() as f64;
        (ms(&self.k).sqrt(), ms(&self.v).sqrt())
    }
}

/// One window: its length and the query positions, ascending, in `[S - recent, S)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Index of the dump (into the data slice the caller passes).
    pub data: usize,
    /// Window length `S`.
    pub len: usize,
    /// Query positions.
    pub queries: Vec<usize>,
}

/// How the groups are compressed.
#[derive(Debug, Clone, Copy)]
pub enum Compression<'a, T> {
    /// The K and V MLPs, applied as `scale * mlp(x / scale)`.
    Mlp {
        /// Keys' MLP.
        k: &'a MlpParams<T>,
        /// Values' MLP.
        v: &'a MlpParams<T>,
        /// Keys' scale (their RMS).
        k_scale: T,
        /// Values' scale.
        v_scale: T,
    },
    /// The mean of each group's `F` rows: the trivial baseline.
    MeanPool,
}

/// Squared error and squared norm of the attention outputs of some windows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossParts {
    /// `sum |o' - o|^2`.
    pub err: f64,
    /// `sum |o|^2`.
    pub norm: f64,
}

impl LossParts {
    /// `err / norm`.
    pub fn relative(&self) -> f64 {
        self.err / self.norm
    }
}

impl std::ops::AddAssign for LossParts {
    fn add_assign(&mut self, o: Self) {
        self.err += o.err;
        self.norm += o.norm;
    }
}

/// `sum |o|^2` of a window's full-cache outputs.
pub fn window_norm<T: Real>(data: &LayerData<T>, w: &Window) -> f64 {
    let (t, d) = (data.tokens, data.head_dim);
    let mut n = 0f64;
    for qh in 0..data.q_heads {
        for &p in &w.queries {
            for &x in &data.o_full[(qh * t + p) * d..(qh * t + p + 1) * d] {
                n += x.to_f64().powi(2);
            }
        }
    }
    n
}

/// Scratch buffers of [`window_loss`], reused between calls.
#[derive(Debug, Default)]
pub struct Scratch<T> {
    xk: Vec<T>,
    xv: Vec<T>,
    yk: Vec<T>,
    yv: Vec<T>,
    dyk: Vec<T>,
    dyv: Vec<T>,
    kc: Vec<T>,
    vc: Vec<T>,
    qg: Vec<T>,
    s: Vec<T>,
    o: Vec<T>,
    da: Vec<T>,
    ck: MlpCache<T>,
    cv: MlpCache<T>,
}

/// Gradient accumulators for the K and V MLPs.
pub struct Grads<'a, T> {
    /// Keys' MLP gradient (added to).
    pub k: &'a mut MlpParams<T>,
    /// Values' MLP gradient (added to).
    pub v: &'a mut MlpParams<T>,
    /// `1 / sum |o|^2` of the whole batch: the loss is the batch's relative error.
    pub inv_norm: f64,
}

/// The squared error of one window under `comp`, and, with `grads`, the gradient of
/// `err * grads.inv_norm` added to them (MLP compression only).
///
/// The window must fit the data (`len <= tokens`, at least one group, queries in
/// `[len - recent, len)`); the trainer makes its windows so.
pub fn window_loss<T: Real>(
    data: &LayerData<T>,
    geo: Geometry,
    w: &Window,
    comp: Compression<'_, T>,
    grads: Option<Grads<'_, T>>,
    sc: &mut Scratch<T>,
) -> LossParts {
    let (t, d, f, hk) = (data.tokens, data.head_dim, geo.factor, data.kv_heads);
    let g = data.q_heads / hk;
    let m = geo.groups(w.len);
    let c_end = geo.sink + m * f;
    let tail = w.len - c_end;
    let nk = geo.sink + m + tail;
    let nq = w.queries.len();
    let scale = T::from_f64(1.0 / (d as f64).sqrt());
    assert!(m >= 1 && w.len <= t && nq >= 1, "window does not fit");
    assert!(w.queries.iter().all(|&p| p >= c_end && p < w.len));

    // Group rows [H * M, F * D] and their compressed rows [H * M, D].
    let gather = |src: &[T], x: &mut Vec<T>, inv: T| {
        x.clear();
        for h in 0..hk {
            let rows_ = &src[(h * t + geo.sink) * d..(h * t + c_end) * d];
            x.extend(rows_.iter().map(|&v| v * inv));
        }
    };
    let rows_n = hk * m;
    match comp {
        Compression::Mlp {
            k,
            v,
            k_scale,
            v_scale,
        } => {
            for (src, x, y, mlp, sc_, cache) in [
                (&data.k, &mut sc.xk, &mut sc.yk, k, k_scale, &mut sc.ck),
                (&data.v, &mut sc.xv, &mut sc.yv, v, v_scale, &mut sc.cv),
            ] {
                gather(src, x, T::ONE / sc_);
                let out = mlp.forward(x, rows_n, cache);
                y.clear();
                y.extend(out.iter().map(|&o| o * sc_));
            }
        }
        Compression::MeanPool => {
            let inv = T::from_f64(1.0 / f as f64);
            for (src, x, y) in [
                (&data.k, &mut sc.xk, &mut sc.yk),
                (&data.v, &mut sc.xv, &mut sc.yv),
            ] {
                gather(src, x, T::ONE);
                y.clear();
                y.resize(rows_n * d, T::ZERO);
                for (r, grp) in x.chunks_exact(f * d).enumerate() {
                    for tok in grp.chunks_exact(d) {
                        for (o, &v) in y[r * d..(r + 1) * d].iter_mut().zip(tok) {
                            *o += v * inv;
                        }
                    }
                }
            }
        }
    }
    let want_grad = grads.is_some() && matches!(comp, Compression::Mlp { .. });
    if want_grad {
        for dy in [&mut sc.dyk, &mut sc.dyv] {
            dy.clear();
            dy.resize(rows_n * d, T::ZERO);
        }
    }
    let inv_norm = grads.as_ref().map_or(0.0, |g| g.inv_norm);
    let mut parts = LossParts::default();
    // Keys visible to a query at p: all sink and compressed rows, tail rows up to p.
    let valid = |qi: usize| geo.sink + m + (w.queries[qi] + 1 - c_end);
    for h in 0..hk {
        for (src, y, dst) in [(&data.k, &sc.yk, &mut sc.kc), (&data.v, &sc.yv, &mut sc.vc)] {
            dst.clear();
            dst.extend_from_slice(&src[h * t * d..(h * t + geo.sink) * d]);
            dst.extend_from_slice(&y[h * m * d..(h + 1) * m * d]);
            dst.extend_from_slice(&src[(h * t + c_end) * d..(h * t + w.len) * d]);
        }
        for qh in h * g..(h + 1) * g {
            sc.qg.clear();
            for &p in &w.queries {
                sc.qg
                    .extend_from_slice(&data.q[(qh * t + p) * d..(qh * t + p + 1) * d]);
            }
            sc.s.clear();
            sc.s.resize(nq * nk, T::ZERO);
            gemm(
                nq,
                d,
                nk,
                scale,
                rows(&sc.qg, d),
                cols(&sc.kc, d),
                T::ZERO,
                &mut sc.s,
                nk,
            );
            softmax_rows(&mut sc.s, nk, valid);
            sc.o.clear();
            sc.o.resize(nq * d, T::ZERO);
            gemm(
                nq,
                nk,
                d,
                T::ONE,
                rows(&sc.s, nk),
                rows(&sc.vc, d),
                T::ZERO,
                &mut sc.o,
                d,
            );
            // o <- d(loss)/d(o) after the error is summed.
            let two = 2.0 * inv_norm;
            for (qi, &p) in w.queries.iter().enumerate() {
                let full = &data.o_full[(qh * t + p) * d..(qh * t + p + 1) * d];
                for (o, &r) in sc.o[qi * d..(qi + 1) * d].iter_mut().zip(full) {
                    let e = (*o - r).to_f64();
                    parts.err += e * e;
                    parts.norm += r.to_f64() * r.to_f64();
                    *o = T::from_f64(two * e);
                }
            }
            if !want_grad {
                continue;
            }
            // dA = dO Vc^T [nq, nk]; dS = A * (dA - rowsum(A * dA)) / sqrt(D).
            sc.da.clear();
            sc.da.resize(nq * nk, T::ZERO);
            gemm(
                nq,
                d,
                nk,
                T::ONE,
                rows(&sc.o, d),
                cols(&sc.vc, d),
                T::ZERO,
                &mut sc.da,
                nk,
            );
            for (a, da) in sc.s.chunks_exact(nk).zip(sc.da.chunks_exact_mut(nk)) {
                let dot: f64 = a
                    .iter()
                    .zip(da.iter())
                    .map(|(&x, &y)| x.to_f64() * y.to_f64())
                    .sum();
                let dot = T::from_f64(dot);
                for (x, &ai) in da.iter_mut().zip(a) {
                    *x = ai * (*x - dot) * scale;
                }
            }
            // Only the compressed rows [sink, sink + M) have trainable inputs.
            let dyk = &mut sc.dyk[h * m * d..(h + 1) * m * d];
            // dK_c[M, D] += dS[:, sink..sink+M]^T Qg
            gemm(
                m,
                nq,
                d,
                T::ONE,
                cols(&sc.da[geo.sink..], nk),
                rows(&sc.qg, d),
                T::ONE,
                dyk,
                d,
            );
            let dyv = &mut sc.dyv[h * m * d..(h + 1) * m * d];
            // dV_c[M, D] += A[:, sink..sink+M]^T dO
            gemm(
                m,
                nq,
                d,
                T::ONE,
                cols(&sc.s[geo.sink..], nk),
                rows(&sc.o, d),
                T::ONE,
                dyv,
                d,
            );
        }
    }
    if let (
        Some(gr),
        Compression::Mlp {
            k,
            v,
            k_scale,
            v_scale,
        },
    ) = (grads, comp)
    {
        // y = scale * mlp(x / scale): d/d(mlp output) = scale * dy.
        for (mlp, x, dy, sc_, cache, acc) in [
            (k, &sc.xk, &mut sc.dyk, k_scale, &mut sc.ck, gr.k),
            (v, &sc.xv, &mut sc.dyv, v_scale, &mut sc.cv, gr.v),
        ] {
            for x in dy.iter_mut() {
                *x *= sc_;
            }
            mlp.backward(x, rows_n, cache, dy, acc);
        }
    }
    parts
}
