//! The seed's compressor MLP, `Linear(D*F -> D), ReLU, Linear(D -> D), ReLU, Linear(D -> D)`,
//! with its forward pass, its backward pass, and conversion to and from kvc-mlp's weights.

use crate::error::Result;
use crate::real::{cols, gemm, rows, Real};
use crate::rng::Rng;

/// One MLP's parameters (or their gradients), weights row-major `[out, in]` as PyTorch and
/// `.bin` v1 store them.
#[derive(Debug, Clone, PartialEq)]
pub struct MlpParams<T> {
    /// Head dimension `D` (every layer's output width).
    pub head_dim: usize,
    /// Tokens per group `F` (the first layer takes `D * F`).
    pub factor: usize,
    /// Weights: `[D, D*F]`, `[D, D]`, `[D, D]`.
    pub w: [Vec<T>; 3],
    /// Biases, `D` each.
    pub b: [Vec<T>; 3],
}

/// The activations of one forward pass, kept for the backward pass.
#[derive(Debug, Default)]
pub struct MlpCache<T> {
    h1: Vec<T>,
    h2: Vec<T>,
    y: Vec<T>,
    dz: Vec<T>,
    dh: Vec<T>,
}

impl<T: Real> MlpParams<T> {
    /// All zeros (a gradient accumulator).
    pub fn zeros(head_dim: usize, factor: usize) -> Self {
        let d = head_dim;
        MlpParams {
            head_dim,
            factor,
            w: [
                vec![T::ZERO; d * d * factor],
                vec![T::ZERO; d * d],
                vec![T::ZERO; d * d],
            ],
            b: [vec![T::ZERO; d], vec![T::ZERO; d], vec![T::ZERO; d]],
        }
    }

    /// He-normal weights (`std = sqrt(2 / in)`, suited to ReLU) for the first two layers,
    /// `std = sqrt(1 / in)` for the last, zero biases.
    pub fn init(head_dim: usize, factor: usize, rng: &mut Rng) -> Self {
        let mut p = Self::zeros(head_dim, factor);
        for (i, w) in p.w.iter_mut().enumerate() {
            let fan_in = if i == 0 { head_dim * factor } else { head_dim };
            let std = ((if i == 2 { 1.0 } else { 2.0 }) / fan_in as f64).sqrt();
            for x in w.iter_mut() {
                *x = T::from_f64(std * rng.normal());
            }
        }
        p
    }

    /// The MLP that computes the mean of its `F` input tokens exactly wherever
    /// `mean + shift > 0` channel by channel: `W0 = [I/F ... I/F]`, `b0 = shift`, `W1 = W2 = I`,
    /// `b1 = 0`, `b2 = -shift`. Training starts from the mean-pooling baseline this way: with
    /// hidden width `D`, a random start has to find the signed identity through two ReLUs.
    pub fn mean_pool(head_dim: usize, factor: usize, shift: &[T]) -> Self {
        let d = head_dim;
        let mut p = Self::zeros(d, factor);
        let inv = T::from_f64(1.0 / factor as f64);
        assert_eq!(shift.len(), d, "one shift per channel");
        for (o, &s) in shift.iter().enumerate() {
            for j in 0..factor {
                p.w[0][o * d * factor + j * d + o] = inv;
            }
            p.w[1][o * d + o] = T::ONE;
            p.w[2][o * d + o] = T::ONE;
            p.b[0][o] = s;
            p.b[2][o] = -s;
        }
        p
    }

    /// Input width `D * F`.
    pub fn input_width(&self) -> usize {
        self.head_dim * self.factor
    }

    /// Every parameter tensor, weights then biases (for the optimiser).
    pub fn tensors_mut(&mut self) -> impl Iterator<Item = &mut Vec<T>> {
        self.w.iter_mut().chain(self.b.iter_mut())
    }

    /// Every parameter tensor, weights then biases.
    pub fn tensors(&self) -> impl Iterator<Item = &Vec<T>> {
        self.w.iter().chain(self.b.iter())
    }

    /// Sets every entry to zero.
    pub fn clear(&mut self) {
        for t in self.tensors_mut() {
            t.fill(T::ZERO);
        }
    }

    /// Runs the MLP on `n` rows of `x` (`n * D * F`) and returns the `n * D` outputs; `cache`
    /// keeps the activations for [`backward`](Self::backward).
    pub fn forward<'c>(&self, x: &[T], n: usize, cache: &'c mut MlpCache<T>) -> &'c [T] {
        let (d, inw) = (self.head_dim, self.input_width());
        for v in [&mut cache.h1, &mut cache.h2, &mut cache.y] {
            v.clear();
            v.resize(n * d, T::ZERO);
        }
        let layer = |input: &[T], in_w: usize, l: usize, out: &mut [T], relu: bool| {
            for row in out.chunks_exact_mut(d) {
                row.copy_from_slice(&self.b[l]);
            }
            // out[n, d] += input[n, in_w] @ W^T, W row-major [d, in_w].
            gemm(
                n,
                in_w,
                d,
                T::ONE,
                rows(input, in_w),
                cols(&self.w[l], in_w),
                T::ONE,
                out,
                d,
            );
            if relu {
                for v in out.iter_mut() {
                    if *v < T::ZERO {
                        *v = T::ZERO;
                    }
                }
            }
        };
        layer(&x[..n * inw], inw, 0, &mut cache.h1, true);
        layer(&cache.h1, d, 1, &mut cache.h2, true);
        layer(&cache.h2, d, 2, &mut cache.y, false);
        &cache.y
    }

    /// Adds the gradient of a loss to `grad`, given the forward pass's input `x`, its cache
    /// and `dy`, the loss's gradient with respect to the `n * D` outputs.
    pub fn backward(
        &self,
        x: &[T],
        n: usize,
        cache: &mut MlpCache<T>,
        dy: &[T],
        grad: &mut MlpParams<T>,
    ) {
        let (d, inw) = (self.head_dim, self.input_width());
        let MlpCache { h1, h2, dz, dh, .. } = cache;
        dz.clear();
        dz.extend_from_slice(&dy[..n * d]);
        // Layer 2 (no ReLU), then 1 and 0 (ReLU masks by the post-activation > 0).
        for l in (0..3).rev() {
            let (input, in_w): (&[T], usize) = match l {
                2 => (h2, d),
                1 => (h1, d),
                _ => (&x[..n * inw], inw),
            };
            for row in dz.chunks_exact(d) {
                for (g, &v) in grad.b[l].iter_mut().zip(row) {
                    *g += v;
                }
            }
            // dW[d, in_w] += dz^T[d, n] @ input[n, in_w]
            gemm(
                d,
                n,
                in_w,
                T::ONE,
                cols(dz, d),
                rows(input, in_w),
                T::ONE,
                &mut grad.w[l],
                in_w,
            );
            if l == 0 {
                break;
            }
            // dh[n, d] = dz[n, d] @ W[d, d]
            dh.clear();
            dh.resize(n * d, T::ZERO);
            gemm(
                n,
                d,
                d,
                T::ONE,
                rows(dz, d),
                rows(&self.w[l], d),
                T::ZERO,
                dh,
                d,
            );
            for (g, &a) in dh.iter_mut().zip(input.iter()) {
                if a <= T::ZERO {
                    *g = T::ZERO;
                }
            }
            std::mem::swap(dz, dh);
        }
    }
}

impl MlpParams<f32> {
    /// kvc-mlp's MLP computing `scale * mlp(x / scale)` (the trainer works on inputs divided
    /// by the layer's RMS; the scale is folded into the first and last Linear, exact in real
    /// arithmetic).
    pub fn to_kvc(&self, scale: f32) -> Result<kvc_mlp::Mlp> {
        let (d, inw) = (self.head_dim, self.input_width());
        let w0: Vec<f32> = self.w[0].iter().map(|w| w / scale).collect();
        let w2: Vec<f32> = self.w[2].iter().map(|w| w * scale).collect();
        let b2: Vec<f32> = self.b[2].iter().map(|b| b * scale).collect();
        Ok(kvc_mlp::Mlp::new([
            kvc_mlp::Linear::new(d, inw, &w0, Some(&self.b[0]))?,
            kvc_mlp::Linear::new(d, d, &self.w[1], Some(&self.b[1]))?,
            kvc_mlp::Linear::new(d, d, &w2, Some(&b2))?,
        ])?)
    }

    /// The trainer's parameters of a kvc-mlp MLP (absent biases become zeros).
    pub fn from_kvc(mlp: &kvc_mlp::Mlp) -> Self {
        let d = mlp.head_dim();
        let mut p = Self::zeros(d, mlp.input_width() / d);
        for (l, lin) in mlp.layers().iter().enumerate() {
            let (o, i) = (lin.out_features(), lin.in_features());
            for (ii, col) in lin.weight_t().chunks_exact(o).enumerate() {
                for (oo, &w) in col.iter().enumerate() {
                    p.w[l][oo * i + ii] = w;
                }
            }
            if let Some(b) = lin.bias() {
                p.b[l].copy_from_slice(b);
            }
        }
        p
    }
}
