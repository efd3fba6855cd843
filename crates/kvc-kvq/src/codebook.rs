//! Lloyd-Max codebooks for rotated coordinates.
//!
//! After the rotation, the coordinates of a head vector divided by its norm and multiplied
//! by `sqrt(d)` follow the scaled Beta law of one coordinate of a uniform point on the unit
//! sphere: density `(1 - s^2/d)^((d-3)/2)` on `|s| < sqrt(d)`, close to N(0, 1). The
//! codebook for `b` bits is the `2^b` MSE-optimal levels for that density, found by Lloyd
//! iteration on a fixed grid, in `f64`, with only `+ - * / sqrt` (correctly rounded
//! everywhere), so every platform computes the same levels, then rounded to `f32`.

use std::sync::OnceLock;

use super::rotation::check_head_dim;
use crate::error::{Error, Result};

/// Grid points over `(-smax, smax)`.
const GRID: usize = 1 << 15;
/// Lloyd iterations (fixed, so the result does not depend on a tolerance test).
const ITERS: usize = 300;

/// `(1 - s^2/d)^((d-3)/2)` for even `d` (half-integer power: integer power times a root).
fn density(s: f64, d: usize) -> f64 {
    let u = 1.0 - s * s / d as f64;
    if u <= 0.0 {
        return 0.0;
    }
    let mut p = 1.0;
    for _ in 0..(d - 3) / 2 {
        p *= u;
    }
    p * u.sqrt()
}

/// Codebooks already computed, by head size (64, 128, 256) and bits (1..=8): a model's
/// layers share a handful, and one takes tens of milliseconds to compute.
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: OnceLock<Vec<f32>> = OnceLock::new();
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_ROW: [OnceLock<Vec<f32>>; 8] = [EMPTY; 8];
static BOOKS: [[OnceLock<Vec<f32>>; 8]; 3] = [EMPTY_ROW; 3];

/// The `2^bits` Lloyd-Max levels (sorted ascending, symmetric) for head size `d`,
/// computed once per process and then copied.
pub fn lloyd_max(bits: u8, d: usize) -> Result<Vec<f32>> {
    check_head_dim(d)?;
    if !(1..=8).contains(&bits) {
        return Err(Error::InvalidValue {
            what: "codebook bits",
            value: i64::from(bits),
            reason: "must be 1..=8",
        });
    }
    let di = match d {
        64 => 0,
        128 => 1,
        _ => 2,
    };
    Ok(BOOKS[di][bits as usize - 1]
        .get_or_init(|| compute(bits, d))
        .clone())
}

/// The Lloyd iteration itself (arguments already checked).
fn compute(bits: u8, d: usize) -> Vec<f32> {
    let levels = 1usize << bits;
    // The density beyond 9 is below 1e-17 of its peak for every d here.
    let smax = (d as f64).sqrt().min(9.0);
    let step = 2.0 * smax / GRID as f64;
    let xs: Vec<f64> = (0..GRID).map(|i| -smax + (i as f64 + 0.5) * step).collect();
    let ws: Vec<f64> = xs.iter().map(|&s| density(s, d)).collect();
    // Start at the quantile midpoints of density^(1/3), the high-rate optimal level
    // density (Newton's cube root: only + - * /).
    let cube_root = |a: f64| {
        if a <= 0.0 {
            return 0.0;
        }
        let mut r = 1.0;
        for _ in 0..80 {
            r = (2.0 * r + a / (r * r)) / 3.0;
        }
        r
    };
    let ws3: Vec<f64> = ws.iter().map(|&w| cube_root(w)).collect();
    let total: f64 = ws3.iter().sum();
    let mut c = vec![0f64; levels];
    let mut acc = 0.0;
    let mut k = 0;
    for (&s, &w) in xs.iter().zip(&ws3) {
        acc += w;
        while k < levels && acc >= (k as f64 + 0.5) / levels as f64 * total {
            c[k] = s;
            k += 1;
        }
    }
    for v in c.iter_mut().skip(k) {
        *v = xs[GRID - 1];
    }
    let mut sw = vec![0f64; levels];
    let mut sx = vec![0f64; levels];
    for _ in 0..ITERS {
        sw.iter_mut().for_each(|v| *v = 0.0);
        sx.iter_mut().for_each(|v| *v = 0.0);
        let mut j = 0;
        for (&s, &w) in xs.iter().zip(&ws) {
            while j + 1 < levels && s > 0.5 * (c[j] + c[j + 1]) {
                j += 1;
            }
            sw[j] += w;
            sx[j] += w * s;
        }
        for j in 0..levels {
            if sw[j] > 0.0 {
                c[j] = sx[j] / sw[j];
            }
        }
    }
    // Exact symmetry (the grid is symmetric; this removes rounding drift).
    for j in 0..levels / 2 {
        let m = 0.5 * (c[levels - 1 - j] - c[j]);
        c[j] = -m;
        c[levels - 1 - j] = m;
    }
    c.iter().map(|&v| v as f32).collect()
}

/// Decision boundaries: the midpoints between neighbouring levels (`levels - 1` values).
pub fn boundaries(levels: &[f32]) -> Vec<f32> {
    levels.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gaussian_levels_are_approached() {
        // Lloyd-Max for N(0,1): 1 bit +-0.7979, 2 bits +-0.4528 +-1.510. The sphere law
        // for d = 256 is within 1% of N(0, 1) here.
        let c = lloyd_max(1, 256).unwrap();
        assert!((c[1] - 0.7979).abs() < 0.01, "{c:?}");
        let c = lloyd_max(2, 256).unwrap();
        assert!(
            (c[2] - 0.4528).abs() < 0.01 && (c[3] - 1.510).abs() < 0.02,
            "{c:?}"
        );
    }

    #[test]
    fn levels_are_sorted_symmetric_and_deterministic() {
        for d in [64, 128, 256] {
            for b in 2..=8u8 {
                let c = lloyd_max(b, d).unwrap();
                assert_eq!(c.len(), 1 << b);
                assert!(c.windows(2).all(|w| w[0] < w[1]), "d {d} b {b}");
                for j in 0..c.len() {
                    assert_eq!(c[j], -c[c.len() - 1 - j]);
                }
                assert_eq!(c, lloyd_max(b, d).unwrap());
            }
        }
        assert!(lloyd_max(0, 64).is_err());
        assert!(lloyd_max(9, 64).is_err());
        assert!(lloyd_max(4, 63).is_err());
    }
}
