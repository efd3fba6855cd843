//! The seeded randomized Hadamard rotation `R = H D / sqrt(d)` of one head's vector.
//!
//! `D` is a diagonal of signs drawn from the seed (splitmix64, bit 63 of each draw), `H`
//! the Sylvester-order Walsh-Hadamard matrix of size `d` (64, 128 or 256), applied by the
//! fast transform in `d log2 d` additions. `R` is orthonormal, so `R^T = D H / sqrt(d)`
//! undoes it exactly up to float rounding and dot products are kept: `q.k = (Rq).(Rk)`.

use crate::error::{Error, Result};

/// The head sizes kvq handles.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// The largest head size (stack scratch is this long).
pub const MAX_HEAD_DIM: usize = 256;

/// Checks that `d` is one of [`HEAD_DIMS`].
pub fn check_head_dim(d: usize) -> Result<()> {
    if HEAD_DIMS.contains(&d) {
        Ok(())
    } else {
        Err(Error::Unsupported {
            what: "head_dim (kvq handles 64, 128, 256)",
            value: d as i64,
        })
    }
}

/// splitmix64: the sign generator (fixed so that packed rows are reproducible anywhere).
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One rotation: its signs and size.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    signs: [f32; MAX_HEAD_DIM],
    dim: usize,
    inv_sqrt: f32,
}

impl Rotation {
    /// The rotation of size `dim` drawn from `seed`: sign `i` is `-1` when bit 63 of the
    /// `i`-th splitmix64 output (state starting at `seed`) is set.
    pub fn new(dim: usize, seed: u64) -> Result<Rotation> {
        check_head_dim(dim)?;
        let mut signs = [0f32; MAX_HEAD_DIM];
        let mut st = seed;
        for s in signs.iter_mut().take(dim) {
            *s = if splitmix64(&mut st) >> 63 == 1 {
                -1.0
            } else {
                1.0
            };
        }
        Ok(Rotation {
            signs,
            dim,
            inv_sqrt: (1.0 / (dim as f64).sqrt()) as f32,
        })
    }

    /// The size.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// `f32(1 / sqrt(dim))`.
    pub(crate) fn inv_sqrt(&self) -> f32 {
        self.inv_sqrt
    }

    /// The signs of `D`.
    pub fn signs(&self) -> &[f32] {
        &self.signs[..self.dim]
    }

    /// `x <- R x`. `x.len()` must be [`dim`](Self::dim) (checked by the callers; a
    /// shorter slice is left unchanged).
    #[inline(always)]
    pub fn rotate(&self, x: &mut [f32]) {
        if x.len() != self.dim {
            return;
        }
        for (v, s) in x.iter_mut().zip(&self.signs) {
            *v *= s;
        }
        fwht(x);
        for v in x.iter_mut() {
            *v *= self.inv_sqrt;
        }
    }

    /// `x <- R^T x`, the inverse of [`rotate`](Self::rotate).
    #[inline(always)]
    pub fn unrotate(&self, x: &mut [f32]) {
        if x.len() != self.dim {
            return;
        }
        fwht(x);
        for (v, s) in x.iter_mut().zip(&self.signs) {
            *v *= s * self.inv_sqrt;
        }
    }
}

/// In-place unnormalized Walsh-Hadamard transform (Sylvester order) of a power-of-two
/// length: `x <- H x`.
#[inline(always)]
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*u, *v);
                *u = p + q;
                *v = p - q;
            }
        }
        h *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_is_orthonormal_and_inverts() {
        for d in HEAD_DIMS {
            let r = Rotation::new(d, 7).unwrap();
            let x: Vec<f32> = (0..d).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
            let mut y = x.clone();
            r.rotate(&mut y);
            let n0: f64 = x.iter().map(|v| f64::from(*v).powi(2)).sum();
            let n1: f64 = y.iter().map(|v| f64::from(*v).powi(2)).sum();
            assert!((n0 - n1).abs() < 1e-4 * n0, "{d}: norm {n0} -> {n1}");
            assert_ne!(x, y);
            r.unrotate(&mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5, "{d}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn seeds_give_different_signs_and_bad_dims_are_refused() {
        let a = Rotation::new(64, 1).unwrap();
        let b = Rotation::new(64, 2).unwrap();
        assert_ne!(a.signs(), b.signs());
        for d in [0, 1, 32, 96, 512] {
            assert_eq!(
                Rotation::new(d, 0).unwrap_err().kind(),
                crate::ErrorKind::Unsupported
            );
        }
    }
}
