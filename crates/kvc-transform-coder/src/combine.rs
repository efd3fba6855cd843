//! The decoder's inner loop: `acc += Σ (q_i·step_i)·basis_i` over the nonzero `q_i`, in
//! component order, each `acc[j]` updated by one f32 multiply then one f32 add.
//!
//! The same body is compiled three times (portable, AVX2, AVX-512F) and picked at run time.
//! Every lane performs exactly the scalar operations in the same order (the compiler only
//! vectorizes across `j`, never reorders a lane's sum, and never fuses a multiply and an add
//! into an FMA), so the three give the same bits; the tests check it.

use std::sync::OnceLock;

#[inline(always)]
fn body(acc: &mut [f32], q: &[i32], steps: &[f32], basis: &[f32]) {
    let d = acc.len();
    for (i, (&qi, &st)) in q.iter().zip(steps).enumerate() {
        if qi != 0 {
            let c = qi as f32 * st;
            for (a, u) in acc.iter_mut().zip(&basis[i * d..(i + 1) * d]) {
                *a += c * u;
            }
        }
    }
}

fn portable(acc: &mut [f32], q: &[i32], steps: &[f32], basis: &[f32]) {
    body(acc, q, steps, basis)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2(acc: &mut [f32], q: &[i32], steps: &[f32], basis: &[f32]) {
    body(acc, q, steps, basis)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn avx512(acc: &mut [f32], q: &[i32], steps: &[f32], basis: &[f32]) {
    body(acc, q, steps, basis)
}

/// Which compiled copy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Any host.
    Portable,
    /// x86-64 with AVX2.
    Avx2,
    /// x86-64 with AVX-512F.
    Avx512,
}

impl Path {
    /// The fastest path this host runs.
    pub fn detected() -> Path {
        static P: OnceLock<Path> = OnceLock::new();
        *P.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Path::Avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    return Path::Avx2;
                }
            }
            Path::Portable
        })
    }

    /// Whether this host can run the path.
    pub fn available(self) -> bool {
        match self {
            Path::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// `acc += Σ_i (q_i·steps_i)·basis[i]` (rows of `acc.len()`) on `path`, which must be
/// [`Path::available`] (else the portable copy runs).
pub fn accumulate(path: Path, acc: &mut [f32], q: &[i32], steps: &[f32], basis: &[f32]) {
    debug_assert!(basis.len() >= q.len() * acc.len() && steps.len() >= q.len());
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if path.available() => {
            // SAFETY: the host has AVX-512F (checked just above).
            unsafe { avx512(acc, q, steps, basis) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 if path.available() => {
            // SAFETY: the host has AVX2 (checked just above).
            unsafe { avx2(acc, q, steps, basis) }
        }
        _ => portable(acc, q, steps, basis),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_gives_the_same_bits() {
        for d in [2usize, 16, 64, 80, 128, 256] {
            let basis: Vec<f32> = (0..d * d)
                .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * 0.37)
                .collect();
            let steps: Vec<f32> = (0..d).map(|i| 0.011 + i as f32 * 0.0137).collect();
            let q: Vec<i32> = (0..d)
                .map(|i| ((i * 7919) % 23) as i32 - 11)
                .map(|v| if v.abs() < 4 { 0 } else { v })
                .collect();
            let mean: Vec<f32> = (0..d).map(|j| (j as f32 * 0.31).sin()).collect();
            let mut want = mean.clone();
            portable(&mut want, &q, &steps, &basis);
            for p in [Path::Avx2, Path::Avx512] {
                if !p.available() {
                    eprintln!("{p:?} not on this host: not compared");
                    continue;
                }
                let mut got = mean.clone();
                accumulate(p, &mut got, &q, &steps, &basis);
                let (a, b): (Vec<u32>, Vec<u32>) = (
                    got.iter().map(|x| x.to_bits()).collect(),
                    want.iter().map(|x| x.to_bits()).collect(),
                );
                assert_eq!(a, b, "{p:?} at d {d}");
            }
        }
    }
}
