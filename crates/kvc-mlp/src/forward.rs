//! The MLP forward pass for one head's groups, through `matrixmultiply`'s f32 GEMM.

use crate::dtype::KvElement;
use crate::weights::{Linear, Mlp};

/// Reusable f32 buffers for one head at a time; they only grow.
#[derive(Debug, Default)]
pub(crate) struct HeadScratch {
    input: Vec<f32>,
    hidden: Vec<f32>,
    out: Vec<f32>,
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// `out[..rows*out_f] = x[..rows*in_f] @ W^T (+ bias)`, then ReLU if asked.
fn linear(x: &[f32], rows: usize, lin: &Linear, out: &mut [f32], relu: bool) {
    let (k, n) = (lin.in_features(), lin.out_features());
    let x = &x[..rows * k];
    let out = &mut out[..rows * n];
    let w = lin.weight_t();
    assert_eq!(w.len(), k * n, "weight shape");
    let beta = match lin.bias() {
        Some(b) => {
            for row in out.chunks_exact_mut(n) {
                row.copy_from_slice(b);
            }
            1.0
        }
        None => 0.0,
    };
    // SAFETY: A = x is rows x k row-major (row stride k, column stride 1) and x holds exactly
    // rows * k elements; B = W^T is k x n row-major (stride n, 1) with k * n elements (checked
    // above); C = out is rows x n row-major with rows * n elements and does not alias A or B
    // (it is a distinct &mut). All strides fit in isize because the slices exist. With beta = 0
    // C is not read; with beta = 1 it holds the bias rows written above.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            n as isize,
            1,
            beta,
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    if relu {
        for v in out.iter_mut() {
            // Keeps NaN as NaN, like torch.relu.
            if *v < 0.0 {
                *v = 0.0;
            }
        }
    }
}

/// Runs `mlp` on `groups` rows of `input` (`groups * mlp.input_width()` elements, each row
/// `factor` consecutive tokens) and returns the `groups * head_dim` results.
pub(crate) fn run_mlp<'s, T: KvElement>(
    mlp: &Mlp,
    input: &[T],
    groups: usize,
    scratch: &'s mut HeadScratch,
) -> &'s [f32] {
    let width = mlp.input_width();
    let d = mlp.head_dim();
    let input = &input[..groups * width];
    grow(&mut scratch.hidden, groups * d);
    grow(&mut scratch.out, groups * d);
    let x: &[f32] = match T::as_f32(input) {
        Some(x) => x,
        None => {
            grow(&mut scratch.input, groups * width);
            T::widen(input, &mut scratch.input[..groups * width]);
            &scratch.input
        }
    };
    let [l0, l1, l2] = mlp.layers();
    linear(x, groups, l0, &mut scratch.out, true);
    linear(&scratch.out, groups, l1, &mut scratch.hidden, true);
    linear(&scratch.hidden, groups, l2, &mut scratch.out, false);
    &scratch.out[..groups * d]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], rows: usize, w: &[f32], b: Option<&[f32]>, out_f: usize) -> Vec<f32> {
        let in_f = w.len() / out_f;
        let mut y = vec![0f32; rows * out_f];
        for r in 0..rows {
            for o in 0..out_f {
                let mut acc = b.map_or(0.0, |b| b[o]);
                for i in 0..in_f {
                    acc += x[r * in_f + i] * w[o * in_f + i];
                }
                y[r * out_f + o] = acc;
            }
        }
        y
    }

    #[test]
    fn linear_matches_naive_with_and_without_bias() {
        let (rows, in_f, out_f) = (5, 6, 3);
        let x: Vec<f32> = (0..rows * in_f).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..out_f * in_f).map(|i| (i as f32 * 0.71).cos()).collect();
        let b = [0.5f32, -1.0, 2.0];
        for bias in [None, Some(&b[..])] {
            let lin = Linear::new(out_f, in_f, &w, bias).unwrap();
            let mut out = vec![f32::NAN; rows * out_f];
            linear(&x, rows, &lin, &mut out, false);
            let want = naive(&x, rows, &w, bias, out_f);
            for (a, e) in out.iter().zip(&want) {
                assert!((a - e).abs() < 1e-5, "{a} vs {e}");
            }
            linear(&x, rows, &lin, &mut out, true);
            for (a, e) in out.iter().zip(&want) {
                assert!((a - e.max(0.0)).abs() < 1e-5);
            }
        }
    }
}
