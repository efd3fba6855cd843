//! Training one layer's K and V MLPs with Adam on random windows of the training dumps.

use crate::error::{Error, Result};
use crate::mlp::MlpParams;
use crate::objective::{
    window_loss, window_norm, Compression, Geometry, Grads, LayerData, LossParts, Scratch, Window,
};
use crate::rng::Rng;

/// Training options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    /// Sink, recent span, group size.
    pub geometry: Geometry,
    /// Smallest number of groups a training window compresses.
    pub min_groups: usize,
    /// Query positions sampled per window (all `recent` if larger).
    pub queries: usize,
    /// Windows per optimiser step.
    pub batch: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Adam's peak learning rate (cosine decay to a tenth of it, after a 5 % warm-up).
    pub lr: f64,
    /// The seed; layer `l` uses `seed ^ l`-derived streams, so a layer's result does not depend
    /// on which other layers are trained or on the thread count.
    pub seed: u64,
    /// Windows per dump in the evaluation (fixed lengths evenly spaced, every recent query).
    pub eval_windows: usize,
    /// Where training starts.
    pub init: Init,
}

/// The starting point of training.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// Exactly mean pooling on the training data ([`MlpParams::mean_pool`], shifts from the
    /// per-channel minimum of the scaled training rows plus a margin of 1).
    MeanPool,
    /// He-normal random weights ([`MlpParams::init`]).
    Random,
}

impl Init {
    /// `mean-pool` or `random`.
    pub fn name(self) -> &'static str {
        match self {
            Init::MeanPool => "mean-pool",
            Init::Random => "random",
        }
    }
}

impl TrainConfig {
    /// Checks the options against the data's shortest dump.
    pub fn check(&self, min_tokens: usize) -> Result<()> {
        let g = self.geometry;
        if g.factor == 0 || g.recent == 0 {
            return Err(Error::invalid("factor/recent", "must be at least 1"));
        }
        if self.min_groups == 0 || self.queries == 0 || self.batch == 0 || self.eval_windows == 0 {
            return Err(Error::invalid(
                "min_groups/queries/batch/eval_windows",
                "must be at least 1",
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(Error::invalid(
                "lr",
                format!("{} is not a positive number", self.lr),
            ));
        }
        if self.min_len() > min_tokens {
            return Err(Error::invalid(
                "sink/recent/factor",
                format!(
                    "a window needs sink {} + {} groups of {} + recent {} = {} tokens, the \
                     shortest dump has {min_tokens}",
                    g.sink,
                    self.min_groups,
                    g.factor,
                    g.recent,
                    self.min_len()
                ),
            ));
        }
        Ok(())
    }

    /// The shortest window.
    pub fn min_len(&self) -> usize {
        let g = self.geometry;
        g.sink + self.min_groups * g.factor + g.recent
    }
}

/// The result of one layer.
#[derive(Debug, Clone)]
pub struct LayerResult {
    /// The trained keys' MLP (on inputs divided by `k_scale`).
    pub k: MlpParams<f32>,
    /// The trained values' MLP (on inputs divided by `v_scale`).
    pub v: MlpParams<f32>,
    /// RMS of the training keys.
    pub k_scale: f32,
    /// RMS of the training values.
    pub v_scale: f32,
    /// Relative error on the training dumps' evaluation windows, before training.
    pub train_init: f64,
    /// ... after training.
    pub train: f64,
    /// ... of mean pooling.
    pub train_mean_pool: f64,
    /// Relative error on the validation dumps' evaluation windows after training (NaN
    /// without validation data).
    pub val: f64,
    /// ... of mean pooling.
    pub val_mean_pool: f64,
    /// The mean training loss of each tenth of the run.
    pub curve: Vec<f64>,
}

/// The fixed evaluation windows: per dump, `n` lengths evenly spaced from the shortest
/// window to the dump's length, every recent position a query.
pub fn eval_windows<T>(data: &[LayerData<T>], cfg: &TrainConfig) -> Vec<Window> {
    let min = cfg.min_len();
    let mut out = Vec::new();
    for (i, d) in data.iter().enumerate() {
        for j in 0..cfg.eval_windows {
            let len = if cfg.eval_windows == 1 {
                d.tokens
            } else {
                min + (d.tokens - min) * j / (cfg.eval_windows - 1)
            };
            out.push(Window {
                data: i,
                len,
                queries: (len - cfg.geometry.recent..len).collect(),
            });
        }
    }
    out
}

/// The relative error of `comp` over `windows`.
pub fn evaluate(
    data: &[LayerData<f32>],
    windows: &[Window],
    geo: Geometry,
    comp: Compression<'_, f32>,
) -> f64 {
    let mut sc = Scratch::default();
    let mut parts = LossParts::default();
    for w in windows {
        parts += window_loss(&data[w.data], geo, w, comp, None, &mut sc);
    }
    parts.relative()
}

fn random_window(data: &[LayerData<f32>], cfg: &TrainConfig, rng: &mut Rng) -> Window {
    let i = rng.below(data.len());
    let min = cfg.min_len();
    let len = min + rng.below(data[i].tokens - min + 1);
    let r = cfg.geometry.recent;
    let mut queries: Vec<usize> = (len - r..len).collect();
    // Partial Fisher-Yates: the first `queries` of a random permutation.
    let n = cfg.queries.min(r);
    for j in 0..n {
        let s = j + rng.below(r - j);
        queries.swap(j, s);
    }
    queries.truncate(n);
    queries.sort_unstable();
    Window {
        data: i,
        len,
        queries,
    }
}

struct Adam {
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    t: i32,
}

impl Adam {
    fn new(p: &[&MlpParams<f32>]) -> Self {
        let shapes: Vec<usize> = p.iter().flat_map(|m| m.tensors().map(Vec::len)).collect();
        Adam {
            m: shapes.iter().map(|&n| vec![0.0; n]).collect(),
            v: shapes.iter().map(|&n| vec![0.0; n]).collect(),
            t: 0,
        }
    }

    fn step(&mut self, params: [&mut MlpParams<f32>; 2], grads: [&MlpParams<f32>; 2], lr: f64) {
        let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
        self.t += 1;
        let c1 = 1.0 - b1.powi(self.t);
        let c2 = 1.0 - b2.powi(self.t);
        let mut i = 0;
        for (p, g) in params.into_iter().zip(grads) {
            for (pt, gt) in p.tensors_mut().zip(g.tensors()) {
                for ((x, &gr), (m, v)) in pt
                    .iter_mut()
                    .zip(gt)
                    .zip(self.m[i].iter_mut().zip(self.v[i].iter_mut()))
                {
                    let gr = f64::from(gr);
                    let mm = b1 * f64::from(*m) + (1.0 - b1) * gr;
                    let vv = b2 * f64::from(*v) + (1.0 - b2) * gr * gr;
                    *m = mm as f32;
                    *v = vv as f32;
                    *x -= (lr * (mm / c1) / ((vv / c2).sqrt() + eps)) as f32;
                }
                i += 1;
            }
        }
    }
}

fn lr_at(cfg: &TrainConfig, step: usize) -> f64 {
    let warm = (cfg.steps / 20).max(1);
    if step < warm {
        return cfg.lr * (step + 1) as f64 / warm as f64;
    }
    let x = (step - warm) as f64 / (cfg.steps - warm).max(1) as f64;
    cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * x).cos()))
}

/// Trains one layer's K and V MLPs on `train`, reports errors on `train` and `val` (which may
/// be empty). `layer` seeds the layer's random streams; `progress(step, loss)` is called every
/// `steps / 10` steps with the mean loss since the last call.
pub fn train_layer(
    train: &[LayerData<f32>],
    val: &[LayerData<f32>],
    cfg: &TrainConfig,
    layer: usize,
    mut progress: impl FnMut(usize, f64),
) -> Result<LayerResult> {
    let first = train
        .first()
        .ok_or_else(|| Error::invalid("train", "no training dumps"))?;
    let d = first.head_dim;
    for x in train.iter().chain(val) {
        if (x.head_dim, x.kv_heads, x.q_heads) != (d, first.kv_heads, first.q_heads) {
            return Err(Error::invalid(
                "dumps",
                "the dumps have different head counts or head dimensions",
            ));
        }
    }
    let min_tokens = train.iter().chain(val).map(|x| x.tokens).min().unwrap_or(0);
    cfg.check(min_tokens)?;
    let geo = cfg.geometry;
    let mut rng = Rng::new(cfg.seed ^ (layer as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    // Scales: RMS of the training K and V.
    let (mut ks, mut vs, mut n) = (0f64, 0f64, 0f64);
    for x in train {
        let (k, v) = x.rms();
        let w = x.k.len() as f64;
        ks += k * k * w;
        vs += v * v * w;
        n += w;
    }
    let k_scale = ((ks / n).sqrt().max(1e-6)) as f32;
    let v_scale = ((vs / n).sqrt().max(1e-6)) as f32;
    let (mut k, mut v) = match cfg.init {
        Init::Random => (
            MlpParams::init(d, geo.factor, &mut rng),
            MlpParams::init(d, geo.factor, &mut rng),
        ),
        Init::MeanPool => {
            let shift = |pick: fn(&LayerData<f32>) -> &[f32], scale: f32| -> Vec<f32> {
                let mut min = vec![0f32; d];
                for x in train {
                    for row in pick(x).chunks_exact(d) {
                        for (m, &e) in min.iter_mut().zip(row) {
                            *m = m.min(e / scale);
                        }
                    }
                }
                min.iter().map(|m| 1.0 - m).collect()
            };
            (
                MlpParams::mean_pool(d, geo.factor, &shift(|x| &x.k, k_scale)),
                MlpParams::mean_pool(d, geo.factor, &shift(|x| &x.v, v_scale)),
            )
        }
    };
    let train_eval = eval_windows(train, cfg);
    let val_eval = eval_windows(val, cfg);
    fn comp<'a>(
        k: &'a MlpParams<f32>,
        v: &'a MlpParams<f32>,
        s: (f32, f32),
    ) -> Compression<'a, f32> {
        Compression::Mlp {
            k,
            v,
            k_scale: s.0,
            v_scale: s.1,
        }
    }
    let scales = (k_scale, v_scale);
    let train_init = evaluate(train, &train_eval, geo, comp(&k, &v, scales));
    let train_mean_pool = evaluate(train, &train_eval, geo, Compression::MeanPool);
    let val_mean_pool = if val.is_empty() {
        f64::NAN
    } else {
        evaluate(val, &val_eval, geo, Compression::MeanPool)
    };
    let mut adam = Adam::new(&[&k, &v]);
    let (mut gk, mut gv) = (
        MlpParams::zeros(d, geo.factor),
        MlpParams::zeros(d, geo.factor),
    );
    let mut sc = Scratch::default();
    let every = (cfg.steps / 10).max(1);
    let (mut acc, mut acc_n) = (0f64, 0usize);
    let mut curve = Vec::new();
    for step in 0..cfg.steps {
        let windows: Vec<Window> = (0..cfg.batch)
            .map(|_| random_window(train, cfg, &mut rng))
            .collect();
        let norm: f64 = windows.iter().map(|w| window_norm(&train[w.data], w)).sum();
        gk.clear();
        gv.clear();
        let mut parts = LossParts::default();
        for w in &windows {
            let g = Grads {
                k: &mut gk,
                v: &mut gv,
                inv_norm: 1.0 / norm,
            };
            parts += window_loss(
                &train[w.data],
                geo,
                w,
                comp(&k, &v, scales),
                Some(g),
                &mut sc,
            );
        }
        adam.step([&mut k, &mut v], [&gk, &gv], lr_at(cfg, step));
        acc += parts.relative();
        acc_n += 1;
        if (step + 1) % every == 0 || step + 1 == cfg.steps {
            let mean = acc / acc_n as f64;
            progress(step + 1, mean);
            curve.push(mean);
            acc = 0.0;
            acc_n = 0;
        }
    }
    for t in k.tensors().chain(v.tensors()) {
        if t.iter().any(|x| !x.is_finite()) {
            return Err(Error::invalid(
                "lr",
                format!("layer {layer}: training diverged (non-finite weights); lower --lr"),
            ));
        }
    }
    let train_err = evaluate(train, &train_eval, geo, comp(&k, &v, scales));
    let val_err = if val.is_empty() {
        f64::NAN
    } else {
        evaluate(val, &val_eval, geo, comp(&k, &v, scales))
    };
    Ok(LayerResult {
        k,
        v,
        k_scale,
        v_scale,
        train_init,
        train: train_err,
        train_mean_pool,
        val: val_err,
        val_mean_pool,
        curve,
    })
}
