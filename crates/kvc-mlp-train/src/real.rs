//! The two float types the trainer computes in (f32 to train, f64 for gradient checks) and
//! the one GEMM both use.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// `f32` or `f64`.
pub trait Real:
    Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + Debug
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Rounds an f64 to this type.
    fn from_f64(x: f64) -> Self;
    /// Widens to f64.
    fn to_f64(self) -> f64;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Whether the value is finite.
    fn is_finite(self) -> bool;
    /// `C = alpha * A B + beta * C` with arbitrary non-negative strides, through
    /// `matrixmultiply`.
    ///
    /// # Safety
    /// `a`, `b` and `c` must be valid for the `m x k`, `k x n` and `m x n` index ranges their
    /// strides give, and `c` must not alias `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! real {
    ($t:ty, $gemm:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: the caller's contract (see the trait method) is matrixmultiply's.
                unsafe { $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
            }
        }
    };
}
real!(f32, matrixmultiply::sgemm);
real!(f64, matrixmultiply::dgemm);

/// A read-only strided matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// A view of `data` as row-major with `cols` columns.
pub(crate) fn rows<T>(data: &[T], cols: usize) -> View<'_, T> {
    View {
        data,
        rs: cols,
        cs: 1,
    }
}

/// The transpose of a row-major matrix with `cols` columns.
pub(crate) fn cols<T>(data: &[T], cols: usize) -> View<'_, T> {
    View {
        data,
        rs: 1,
        cs: cols,
    }
}

fn fits(len: usize, r: usize, c: usize, rs: usize, cs: usize) -> bool {
    r == 0
        || c == 0
        || (r - 1)
            .checked_mul(rs)
            .and_then(|x| (c - 1).checked_mul(cs).and_then(|y| x.checked_add(y)))
            .is_some_and(|last| {
                last < len && rs <= isize::MAX as usize && cs <= isize::MAX as usize
            })
}

/// `C[m x n] (row-major, row stride rsc) = alpha * A[m x k] B[k x n] + beta * C`.
///
/// Panics if a view does not hold its extent (an internal shape bug, never input-driven:
/// shapes are checked when data is loaded).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: View<'_, T>,
    b: View<'_, T>,
    beta: T,
    c: &mut [T],
    rsc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(fits(a.data.len(), m, k, a.rs, a.cs), "gemm: A extent");
    assert!(fits(b.data.len(), k, n, b.rs, b.cs), "gemm: B extent");
    assert!(rsc >= n && fits(c.len(), m, n, rsc, 1), "gemm: C extent");
    if k == 0 {
        for row in c.chunks_mut(rsc).take(m) {
            for x in &mut row[..n] {
                *x *= beta;
            }
        }
        return;
    }
    // SAFETY: the asserts above check that every index (i * rs + j * cs) of A (m x k), B
    // (k x n) and C (m x n, column stride 1, row stride rsc >= n so rows do not overlap) lies
    // inside its slice, and that the strides fit in isize; `c` is a distinct `&mut` slice, so
    // it aliases neither `a` nor `b`.
    unsafe {
        T::gemm_raw(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            rsc as isize,
            1,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_naive_with_transposes_and_beta() {
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.3).sin()).collect();
        let b: Vec<f64> = (0..n * k).map(|i| (i as f64 * 0.7).cos()).collect(); // [n, k]
        let mut c = vec![1.0f64; m * n];
        gemm(m, k, n, 2.0, rows(&a, k), cols(&b, k), 0.5, &mut c, n);
        for i in 0..m {
            for j in 0..n {
                let want: f64 =
                    0.5 + 2.0 * (0..k).map(|t| a[i * k + t] * b[j * k + t]).sum::<f64>();
                assert!((c[i * n + j] - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    #[should_panic(expected = "A extent")]
    fn gemm_refuses_a_short_view() {
        let a = [0f32; 5];
        let mut c = [0f32; 4];
        gemm(
            2,
            3,
            2,
            1.0,
            rows(&a, 3),
            rows(&[0f32; 6], 2),
            0.0,
            &mut c,
            2,
        );
    }
}
