//! Unit tests of the block lane order, the Lloyd-Max half-count and the AVX2 softmax.

use super::block::*;

#[test]
fn block_lane_order_is_a_permutation() {
    for bits in 2..=4 {
        let mut seen = [false; BLOCK];
        for n in 0..8 {
            for j in 0..8 {
                let c = block_code(bits, n, j);
                assert!(!seen[c], "bits {bits}: code {c} twice");
                seen[c] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}

/// The symmetric half-count gives `#{boundaries < u}` and its level exactly, ties
/// included: every boundary, its float neighbours, zeros, levels, extremes.
#[test]
fn lm_codes_equal_the_full_count_at_every_boundary() {
    use super::quant::{code_of, code_of_wide, LmTables};
    use std::arch::x86_64::*;
    if !crate::Isa::detect().is_avx2() {
        return;
    }
    for bits in 2..=8u8 {
        for d in [64, 128, 256] {
            let levels = crate::codebook::lloyd_max(bits, d).unwrap();
            let bounds = crate::codebook::boundaries(&levels);
            let t = LmTables::new(&levels, &bounds).expect("symmetric");
            let mut us = vec![0.0f32, -0.0, 1e-40, -1e-40, f32::MAX, f32::MIN, 1e30, -1e30];
            for &b in bounds.iter().chain(&levels) {
                for v in [
                    b,
                    f32::from_bits(b.to_bits() + 1),
                    f32::from_bits(b.to_bits().saturating_sub(1)),
                ] {
                    us.push(v);
                    us.push(-v);
                }
            }
            while us.len() % 8 != 0 {
                us.push(0.5);
            }
            for c in us.chunks_exact(8) {
                let (mut codes, mut lv) = ([0i32; 8], [0f32; 8]);
                // SAFETY: `Isa::detect` saw AVX2; the loads and stores cover 8 values.
                unsafe {
                    let u = _mm256_loadu_ps(c.as_ptr());
                    let (k, l) = match &t.wide {
                        None => code_of(u, &t, u32::from(bits)),
                        Some(w) => code_of_wide(u, w, u32::from(bits)).expect("complete"),
                    };
                    _mm256_storeu_si256(codes.as_mut_ptr().cast(), k);
                    _mm256_storeu_ps(lv.as_mut_ptr(), l);
                }
                for j in 0..8 {
                    let want = bounds.iter().filter(|&&b| b < c[j]).count();
                    assert_eq!(codes[j] as usize, want, "bits {bits} d {d} u {:e}", c[j]);
                    assert_eq!(
                        lv[j].to_bits(),
                        levels[want].to_bits(),
                        "bits {bits} u {:e}",
                        c[j]
                    );
                }
            }
        }
    }
}

#[test]
fn vector_exp_and_softmax_match_f64() {
    if !crate::Isa::detect().is_avx2() {
        return;
    }
    let xs: Vec<f32> = (0..2000).map(|i| -100.0 + i as f32 * 0.0537).collect();
    let mut s = xs.clone();
    // SAFETY: `Isa::detect` saw AVX2, FMA and F16C.
    let inv = unsafe { softmax(&mut s) };
    let m = xs.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let e: Vec<f64> = xs.iter().map(|&x| f64::from(x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    assert!(
        (f64::from(inv) * z - 1.0).abs() < 1e-5,
        "{inv} vs {}",
        1.0 / z
    );
    for (a, b) in s.iter().zip(&e) {
        let tol = 3e-7 * b + 1e-37;
        assert!((f64::from(*a) - b).abs() <= tol, "{a} vs {b}");
    }
}
