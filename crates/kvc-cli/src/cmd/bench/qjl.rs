//! [`QjlResidual`]: the 1-bit QJL sketch of a K row's quantization residual
//! (TurboQuant-prod), for measuring whether it pays. It is a measurement, not yet a packed
//! row format: nothing in `docs/formats/kvq.md` stores a sketch, no plan or C call makes
//! one, and the bytes below may change.
//!
//! TurboQuant-prod codes a K row `k` with a `(b-1)`-bit MSE code `k_mse` (here: a kvq
//! [`RowCodec`](kvc_kvq::RowCodec) row) and adds a 1-bit Quantized Johnson-Lindenstrauss
//! sketch of the residual `r = k - k_mse`: the `d` signs of `S r` for a seeded Gaussian
//! `d x d` matrix `S`, and the f16 norm `||r||`. For a query `q`,
//!
//! `<q, r> ~ ||r|| * sqrt(pi/2) / d * <S q, sign(S r)>`,
//!
//! which is unbiased over the draw of `S` (each row `s` of `S` gives
//! `E[(s.q) sign(s.r)] = sqrt(2/pi) <q, r> / ||r||`), with variance
//! `(pi/2 ||q||^2 ||r||^2 - <q, r>^2) / d` (at most `pi / (2d) ||q||^2 ||r||^2`; with `q`
//! parallel to `r`, `(pi/2 - 1) / d ||q||^2 ||r||^2`). The score of a K row is then
//! `<q, k_mse> + estimate`. [`QjlResidual::project_query`] forms `S q` once per query;
//! [`QjlResidual::estimate`] is the correction per row; [`QjlResidual::reconstruct`] is the
//! unbiased vector `||r|| sqrt(pi/2) / d * S^T sign(S r)`, for an engine that fake-quantizes
//! K (its dot product with `q` equals the estimate up to rounding).
//!
//! Sketch bytes (`d / 8 + 2`): the `d` signs as an LSB-first bit stream, bit `i` set when
//! `(S r)_i >= 0` (sign `+1`), clear for `-1`; then `f16(||r||)` little-endian. The f16
//! norm makes the estimate's expectation `<q, r> * f16(||r||) / ||r||`, a relative bias
//! below `2^-11`.
//!
//! `S`: entry `(i, j)` (row-major, `i` the sign index) is the `(i d + j)`-th standard
//! normal of a Box-Muller stream over splitmix64 ([`splitmix64`]) with the state starting
//! at `seed ^ 0x514a_4c5f_534b_4554` (so that the same seed as a kvq rotation gives an
//! unrelated stream): two outputs `a`, `b` give `u1 = ((a >> 11) + 1) * 2^-53` in `(0, 1]`,
//! `u2 = (b >> 11) * 2^-53`, and the normals `sqrt(-2 ln u1) cos(2 pi u2)` then
//! `sqrt(-2 ln u1) sin(2 pi u2)`, in f64, rounded to f32. `ln`, `cos` and `sin` come from
//! the platform's libm, so `S` may differ in the last bit between platforms: one more
//! reason this is not a stored format. No dependency: splitmix64 is already the rotation's
//! generator and Box-Muller is a few lines.

use half::f16;

use kvc_kvq::rotation::{check_head_dim, splitmix64};
use kvc_kvq::{Error, Result};

/// Domain separation of the sketch matrix's stream from the rotation's (`"QJL_SKET"`).
const STREAM_TAG: u64 = 0x514a_4c5f_534b_4554;

/// `sqrt(pi / 2)`.
const SQRT_HALF_PI: f64 = 1.253_314_137_315_500_3;

/// The QJL residual sketch of one head size and seed.
#[derive(Debug, Clone)]
pub struct QjlResidual {
    dim: usize,
    /// `S`, row-major, `dim * dim`.
    s: Vec<f32>,
}

impl QjlResidual {
    /// The sketch of head size `dim` (64, 128 or 256) with `S` drawn from `seed`.
    pub fn new(dim: usize, seed: u64) -> Result<QjlResidual> {
        check_head_dim(dim)?;
        let n = dim * dim;
        let mut s = Vec::with_capacity(n);
        let mut st = seed ^ STREAM_TAG;
        while s.len() < n {
            let a = splitmix64(&mut st);
            let b = splitmix64(&mut st);
            let u1 = ((a >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
            let u2 = (b >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let r = (-2.0 * u1.ln()).sqrt();
            let t = 2.0 * std::f64::consts::PI * u2;
            s.push((r * t.cos()) as f32);
            s.push((r * t.sin()) as f32);
        }
        Ok(QjlResidual { dim, s })
    }

    /// Bytes of one sketch: `dim / 8` sign bytes and an f16 norm.
    pub fn sketch_bytes(&self) -> usize {
        self.dim / 8 + 2
    }

    /// Bits per K value the sketch adds: `8 * sketch_bytes / dim` (1.25 at 64).
    pub fn bits_per_value(&self) -> f64 {
        8.0 * self.sketch_bytes() as f64 / self.dim as f64
    }

    /// The matrix `S` (row-major, `dim * dim`); the tests check its law.
    #[cfg(test)]
    pub fn matrix(&self) -> &[f32] {
        &self.s
    }

    fn check_vector(&self, what: &'static str, x: &[f32]) -> Result<()> {
        if x.len() != self.dim {
            return Err(Error::LayoutMismatch {
                what,
                expected: self.dim,
                found: x.len(),
            });
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(Error::NonFinite { what, index: i });
        }
        Ok(())
    }

    /// `out <- S x` (f32, each row's sum in order).
    fn project(&self, x: &[f32], out: &mut [f32]) {
        for (o, row) in out.iter_mut().zip(self.s.chunks_exact(self.dim)) {
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    /// Sketches `residual` (`dim` finite values) into `out[..sketch_bytes]`. A norm beyond
    /// the f16 range is refused; nothing is written on error.
    pub fn sketch(&self, residual: &[f32], out: &mut [u8]) -> Result<()> {
        self.check_vector("qjl residual", residual)?;
        let nb = self.sketch_bytes();
        if out.len() < nb {
            return Err(Error::BufferTooSmall {
                what: "qjl sketch output",
                needed: nb,
                found: out.len(),
            });
        }
        let norm = residual
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt();
        let n16 = f16::from_f64(norm);
        if !n16.is_finite() {
            return Err(Error::InvalidValue {
                what: "qjl residual norm",
                value: norm.min(i64::MAX as f64) as i64,
                reason: "exceeds the f16 range",
            });
        }
        let mut p = [0f32; kvc_kvq::rotation::MAX_HEAD_DIM];
        let p = &mut p[..self.dim];
        self.project(residual, p);
        let (signs, tail) = out[..nb].split_at_mut(self.dim / 8);
        for (byte, chunk) in signs.iter_mut().zip(p.chunks_exact(8)) {
            *byte = chunk
                .iter()
                .enumerate()
                .fold(0u8, |acc, (i, &v)| acc | (u8::from(v >= 0.0) << i));
        }
        tail.copy_from_slice(&n16.to_le_bytes());
        Ok(())
    }

    /// `out <- S q` for a query `q` (`dim` finite values), once per query.
    pub fn project_query(&self, q: &[f32], out: &mut [f32]) -> Result<()> {
        self.check_vector("qjl query", q)?;
        if out.len() != self.dim {
            return Err(Error::LayoutMismatch {
                what: "qjl projected query output",
                expected: self.dim,
                found: out.len(),
            });
        }
        self.project(q, out);
        Ok(())
    }

    /// The sketch's norm, checked: a truncated sketch is `BufferTooSmall`, a norm that is
    /// negative or not finite `CorruptRow`.
    fn norm(&self, sketch: &[u8]) -> Result<f32> {
        let nb = self.sketch_bytes();
        if sketch.len() < nb {
            return Err(Error::BufferTooSmall {
                what: "qjl sketch",
                needed: nb,
                found: sketch.len(),
            });
        }
        let n = f16::from_le_bytes([sketch[nb - 2], sketch[nb - 1]]).to_f32();
        if !n.is_finite() || n.is_sign_negative() {
            return Err(Error::CorruptRow {
                what: "qjl residual norm",
                row: 0,
            });
        }
        Ok(n)
    }

    /// The correction `||r|| sqrt(pi/2) / d * <S q, sign(S r)>` from `sq` (=
    /// [`project_query`](Self::project_query) of `q`) and a sketch of `r` (its first
    /// `sketch_bytes` bytes are read).
    pub fn estimate(&self, sq: &[f32], sketch: &[u8]) -> Result<f32> {
        if sq.len() != self.dim {
            return Err(Error::LayoutMismatch {
                what: "qjl projected query",
                expected: self.dim,
                found: sq.len(),
            });
        }
        let norm = self.norm(sketch)?;
        let mut acc = 0f32;
        for (byte, chunk) in sketch.iter().zip(sq.chunks_exact(8)) {
            for (i, &v) in chunk.iter().enumerate() {
                if (byte >> i) & 1 == 1 {
                    acc += v;
                } else {
                    acc -= v;
                }
            }
        }
        Ok((f64::from(norm) * SQRT_HALF_PI / self.dim as f64 * f64::from(acc)) as f32)
    }

    /// `out <- ||r|| sqrt(pi/2) / d * S^T sign(S r)`, the unbiased estimate of `r` from its
    /// sketch, for an engine that adds it to the decoded K row. Nothing is written on error.
    pub fn reconstruct(&self, sketch: &[u8], out: &mut [f32]) -> Result<()> {
        if out.len() != self.dim {
            return Err(Error::LayoutMismatch {
                what: "qjl reconstruction output",
                expected: self.dim,
                found: out.len(),
            });
        }
        let norm = self.norm(sketch)?;
        let c = (f64::from(norm) * SQRT_HALF_PI / self.dim as f64) as f32;
        out.fill(0.0);
        for (i, row) in self.s.chunks_exact(self.dim).enumerate() {
            let sign = if (sketch[i / 8] >> (i % 8)) & 1 == 1 {
                c
            } else {
                -c
            };
            for (o, &a) in out.iter_mut().zip(row) {
                *o += sign * a;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvc_kvq::rotation::HEAD_DIMS;
    use kvc_kvq::ErrorKind;

    /// Deterministic test vectors (splitmix64 mapped to [-1, 1)).
    fn vector(d: usize, seed: u64) -> Vec<f32> {
        let mut st = seed;
        (0..d)
            .map(|_| (splitmix64(&mut st) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    }

    /// Estimates of `<q, r>` for each of `qs` over `n` seeds (one matrix per seed for all
    /// of them), each with the estimator's exact expectation (`<q, r>` times the f16
    /// norm's rounding).
    fn estimates(d: usize, qs: &[Vec<f32>], r: &[f32], n: u64) -> Vec<(Vec<f64>, f64)> {
        let norm = dot(r, r).sqrt();
        let round = f64::from(f16::from_f64(norm).to_f32()) / norm;
        let mut out: Vec<(Vec<f64>, f64)> =
            qs.iter().map(|q| (Vec::new(), dot(q, r) * round)).collect();
        let mut sk = vec![0u8; d / 8 + 2];
        let mut sq = vec![0f32; d];
        for seed in 0..n {
            let s = QjlResidual::new(d, seed * 7919 + 1).unwrap();
            s.sketch(r, &mut sk).unwrap();
            for (q, (e, _)) in qs.iter().zip(out.iter_mut()) {
                s.project_query(q, &mut sq).unwrap();
                e.push(f64::from(s.estimate(&sq, &sk).unwrap()));
            }
        }
        out
    }

    fn mean_var(x: &[f64]) -> (f64, f64) {
        let n = x.len() as f64;
        let m = x.iter().sum::<f64>() / n;
        (
            m,
            x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0),
        )
    }

    /// Over 2000 matrices the mean estimate is within 4 standard errors of its
    /// expectation, and the sample variance within 20 % of
    /// `(pi/2 ||q||^2 ||r||^2 - <q, r>^2) / d`, for a random pair and a parallel pair
    /// (where the variance is `(pi/2 - 1) / d ||q||^2 ||r||^2`).
    #[test]
    fn estimate_is_unbiased_with_the_theoretical_variance() {
        for d in HEAD_DIMS {
            let r: Vec<f32> = vector(d, 11).iter().map(|v| v * 0.05).collect();
            let random = vector(d, 12);
            let parallel: Vec<f32> = r.iter().map(|v| v * -30.0).collect();
            let qs = [random, parallel];
            for (q, (e, want)) in qs.iter().zip(estimates(d, &qs, &r, 2000)) {
                let (m, var) = mean_var(&e);
                let se = (var / e.len() as f64).sqrt();
                assert!(
                    (m - want).abs() < 4.0 * se,
                    "d {d}: mean {m} vs {want}, se {se}"
                );
                let (qq, rr, qr) = (dot(q, q), dot(&r, &r), dot(q, &r));
                let theory = (std::f64::consts::FRAC_PI_2 * qq * rr - qr * qr) / d as f64;
                assert!(
                    (var / theory - 1.0).abs() < 0.2,
                    "d {d}: variance {var} vs theory {theory}"
                );
            }
        }
    }

    /// The reconstruction's dot product with `q` is the estimate, and its mean over many
    /// matrices approaches `r`.
    #[test]
    fn reconstruction_matches_the_estimate_and_is_unbiased() {
        let d = 64;
        let r = vector(d, 3);
        let q = vector(d, 4);
        let mut sk = vec![0u8; 10];
        let (mut sq, mut rec) = (vec![0f32; d], vec![0f32; d]);
        let mut mean = vec![0f64; d];
        let n = 2000;
        for seed in 0..n {
            let s = QjlResidual::new(d, seed).unwrap();
            s.sketch(&r, &mut sk).unwrap();
            s.project_query(&q, &mut sq).unwrap();
            s.reconstruct(&sk, &mut rec).unwrap();
            let e = f64::from(s.estimate(&sq, &sk).unwrap());
            let via = dot(&q, &rec);
            assert!((e - via).abs() < 1e-4 * (1.0 + e.abs()), "{e} vs {via}");
            for (m, v) in mean.iter_mut().zip(&rec) {
                *m += f64::from(*v) / n as f64;
            }
        }
        // per coordinate the reconstruction's variance is about pi/2 ||r||^2 / d
        let se = (std::f64::consts::FRAC_PI_2 * dot(&r, &r) / d as f64 / n as f64).sqrt();
        for (i, (m, want)) in mean.iter().zip(&r).enumerate() {
            assert!(
                (m - f64::from(*want)).abs() < 5.0 * se,
                "coordinate {i}: {m} vs {want} (se {se})"
            );
        }
    }

    #[test]
    fn sketch_layout_and_matrix_moments() {
        let s = QjlResidual::new(128, 5).unwrap();
        assert_eq!(s.sketch_bytes(), 18);
        assert_eq!(s.bits_per_value(), 1.125);
        assert_eq!(QjlResidual::new(64, 5).unwrap().bits_per_value(), 1.25);
        // same seed, same matrix; another seed, another
        assert_eq!(s.matrix(), QjlResidual::new(128, 5).unwrap().matrix());
        assert_ne!(s.matrix(), QjlResidual::new(128, 6).unwrap().matrix());
        let m = s.matrix();
        let n = m.len() as f64;
        let mean = m.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = m.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 4.0 / n.sqrt(), "{mean}");
        assert!((var - 1.0).abs() < 4.0 * (2.0 / n).sqrt(), "{var}");
        // bit i is the sign of (S r)_i, the norm is the f16 of ||r||
        let r = vector(128, 9);
        let mut sk = vec![0u8; 18];
        s.sketch(&r, &mut sk).unwrap();
        for i in 0..128 {
            let p = dot(&m[i * 128..(i + 1) * 128], &r);
            assert_eq!((sk[i / 8] >> (i % 8)) & 1 == 1, p >= 0.0, "bit {i}");
        }
        let norm = f16::from_le_bytes([sk[16], sk[17]]).to_f64();
        assert!((norm - dot(&r, &r).sqrt()).abs() < 1e-3 * norm);
        // a zero residual: norm 0, zero correction
        s.sketch(&[0.0; 128], &mut sk).unwrap();
        let mut sq = vec![0f32; 128];
        s.project_query(&r, &mut sq).unwrap();
        assert_eq!(s.estimate(&sq, &sk).unwrap(), 0.0);
    }

    #[test]
    fn bad_sizes_non_finite_and_truncated_sketches_are_errors() {
        for d in [0, 32, 96, 512] {
            assert_eq!(
                QjlResidual::new(d, 1).unwrap_err().kind(),
                ErrorKind::Unsupported
            );
        }
        let s = QjlResidual::new(64, 1).unwrap();
        let mut sk = vec![0xAAu8; 10];
        let mut sq = vec![0f32; 64];
        let mut out = vec![0f32; 64];
        let r = vector(64, 2);
        let kind = |e: Error| e.kind();
        // wrong lengths
        assert_eq!(
            kind(s.sketch(&r[..63], &mut sk).unwrap_err()),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind(s.sketch(&r, &mut sk[..9]).unwrap_err()),
            ErrorKind::BufferTooSmall
        );
        assert_eq!(sk, vec![0xAAu8; 10], "nothing written on error");
        assert_eq!(
            kind(s.project_query(&r, &mut sq[..32]).unwrap_err()),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind(s.estimate(&sq[..63], &sk).unwrap_err()),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind(s.reconstruct(&sk, &mut out[..1]).unwrap_err()),
            ErrorKind::InvalidArgument
        );
        // non-finite input
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = r.clone();
            x[17] = bad;
            assert_eq!(
                s.sketch(&x, &mut sk).unwrap_err(),
                Error::NonFinite {
                    what: "qjl residual",
                    index: 17
                }
            );
            assert_eq!(
                kind(s.project_query(&x, &mut sq).unwrap_err()),
                ErrorKind::CorruptData
            );
        }
        // a norm beyond f16
        let big: Vec<f32> = r.iter().map(|v| v * 1e6).collect();
        assert_eq!(
            kind(s.sketch(&big, &mut sk).unwrap_err()),
            ErrorKind::InvalidArgument
        );
        // truncated sketch; a corrupt norm (NaN, infinite, negative)
        s.sketch(&r, &mut sk).unwrap();
        s.project_query(&r, &mut sq).unwrap();
        for n in [0, 8, 9] {
            assert_eq!(
                kind(s.estimate(&sq, &sk[..n]).unwrap_err()),
                ErrorKind::BufferTooSmall
            );
            assert_eq!(
                kind(s.reconstruct(&sk[..n], &mut out).unwrap_err()),
                ErrorKind::BufferTooSmall
            );
        }
        for bits in [0x7E00u16, 0x7C00, 0xBC00] {
            let mut bad = sk.clone();
            bad[8..10].copy_from_slice(&bits.to_le_bytes());
            assert_eq!(
                kind(s.estimate(&sq, &bad).unwrap_err()),
                ErrorKind::CorruptData
            );
            out.fill(7.0);
            assert_eq!(
                kind(s.reconstruct(&bad, &mut out).unwrap_err()),
                ErrorKind::CorruptData
            );
            assert!(out.iter().all(|&v| v == 7.0), "nothing written on error");
        }
    }
}
