//! Eigen-decomposition of a small symmetric matrix (a head's covariance, `head_dim²`), by
//! cyclic Jacobi rotations in f64: simple, accurate to rounding for the sizes a head has, and
//! used only at calibration.

/// Eigenvalues (descending) and the matching unit eigenvectors (row `i` of the second
/// result, `n` values each) of the symmetric `n × n` row-major `a`.
pub fn symmetric_eigen(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut m = a.to_vec();
    let mut v = vec![0f64; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    let total: f64 = m.iter().map(|x| x * x).sum();
    for _sweep in 0..100 {
        let mut off = 0f64;
        for p in 0..n {
            for q in p + 1..n {
                off += m[p * n + q] * m[p * n + q];
            }
        }
        if off <= 1e-30 * total.max(f64::MIN_POSITIVE) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = m[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let (app, aqq) = (m[p * n + p], m[q * n + q]);
                let theta = (aqq - app) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                m[p * n + p] = app - t * apq;
                m[q * n + q] = aqq + t * apq;
                m[p * n + q] = 0.0;
                m[q * n + p] = 0.0;
                for k in 0..n {
                    if k != p && k != q {
                        let (akp, akq) = (m[k * n + p], m[k * n + q]);
                        let (np, nq) = (c * akp - s * akq, s * akp + c * akq);
                        m[k * n + p] = np;
                        m[p * n + k] = np;
                        m[k * n + q] = nq;
                        m[q * n + k] = nq;
                    }
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| m[b * n + b].total_cmp(&m[a * n + a]).then(a.cmp(&b)));
    let vals = order.iter().map(|&i| m[i * n + i]).collect();
    let mut vecs = vec![0f64; n * n];
    for (r, &i) in order.iter().enumerate() {
        // Column i of v, signed so that its largest entry is positive (a stable file).
        let col: Vec<f64> = (0..n).map(|k| v[k * n + i]).collect();
        let big = col
            .iter()
            .copied()
            .fold(0f64, |a, x| if x.abs() > a.abs() { x } else { a });
        let sign = if big < 0.0 { -1.0 } else { 1.0 };
        for k in 0..n {
            vecs[r * n + k] = sign * col[k];
        }
    }
    (vals, vecs)
}

#[cfg(test)]
mod tests {
    use super::symmetric_eigen;

    #[test]
    fn decomposes_a_covariance() {
        let n = 16;
        // A = B Bᵀ for a fixed B: symmetric positive semi-definite.
        let b: Vec<f64> = (0..n * n)
            .map(|i| ((i * 7919 % 101) as f64 - 50.0) / 50.0)
            .collect();
        let mut a = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (0..n).map(|k| b[i * n + k] * b[j * n + k]).sum();
            }
        }
        let (vals, vecs) = symmetric_eigen(&a, n);
        assert!(vals.windows(2).all(|w| w[0] >= w[1]));
        for r in 0..n {
            let u = &vecs[r * n..(r + 1) * n];
            // A u = λ u, |u| = 1, orthogonal to the others.
            for i in 0..n {
                let au: f64 = (0..n).map(|k| a[i * n + k] * u[k]).sum();
                assert!((au - vals[r] * u[i]).abs() < 1e-9 * vals[0], "{r} {i}");
            }
            for s in 0..n {
                let dot: f64 = (0..n).map(|k| u[k] * vecs[s * n + k]).sum();
                let want = if s == r { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-12);
            }
        }
    }
}
