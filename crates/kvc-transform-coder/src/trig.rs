//! Sine and cosine from `+`, `-`, `*` and rounding only, so that every host computes the
//! same bits: a decoded chunk must be identical wherever it is restored, and the platform
//! `sin`/`cos` (libm) is not specified to the last bit.

/// π/2 split in three parts (fdlibm's `pio2_1`, `pio2_2`, `pio2_3`): `k·P1` is exact for
/// `|k| < 2^20`, so the reduction keeps its accuracy far beyond any position times a RoPE
/// frequency that a cache holds.
const P1: f64 = 1.570_796_326_734_125_6;
const P2: f64 = 6.077_100_506_303_966e-11;
const P3: f64 = 2.022_266_248_711_166_5e-21;
const TWO_OVER_PI: f64 = std::f64::consts::FRAC_2_PI;

/// `sin(r)` for `|r| <= π/4`: Taylor series to `r^17` (truncation below 1e-19).
fn sin_kernel(r: f64) -> f64 {
    let r2 = r * r;
    let mut p = 1.0 / 355_687_428_096_000.0; // 1/17!
    for d in [
        -1.0 / 1_307_674_368_000.0, // 1/15!
        1.0 / 6_227_020_800.0,
        -1.0 / 39_916_800.0,
        1.0 / 362_880.0,
        -1.0 / 5_040.0,
        1.0 / 120.0,
        -1.0 / 6.0,
        1.0,
    ] {
        p = p * r2 + d;
    }
    p * r
}

/// `cos(r)` for `|r| <= π/4`: Taylor series to `r^18`.
fn cos_kernel(r: f64) -> f64 {
    let r2 = r * r;
    let mut p = 1.0 / 6_402_373_705_728_000.0; // 1/18!
    for d in [
        -1.0 / 20_922_789_888_000.0, // 1/16!
        1.0 / 87_178_291_200.0,
        -1.0 / 479_001_600.0,
        1.0 / 3_628_800.0,
        -1.0 / 40_320.0,
        1.0 / 720.0,
        -1.0 / 24.0,
        1.0 / 2.0,
    ] {
        p = p * r2 + d;
    }
    // p = 1/2 - r²/24 + ... - r^16/18!: cos r = 1 - r²·p.
    1.0 - r2 * p
}

/// `(sin x, cos x)`, finite `x`; deterministic on every IEEE-754 host.
pub fn sin_cos(x: f64) -> (f64, f64) {
    let k = (x * TWO_OVER_PI).round();
    let r = ((x - k * P1) - k * P2) - k * P3;
    let (s, c) = (sin_kernel(r), cos_kernel(r));
    match (k as i64).rem_euclid(4) {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

#[cfg(test)]
mod tests {
    use super::sin_cos;

    #[test]
    fn matches_libm_closely_over_cache_angles() {
        let mut worst = 0f64;
        for i in 0..200_000u32 {
            let x = i as f64 * 0.737 - 3_000.0;
            let (s, c) = sin_cos(x);
            worst = worst.max((s - x.sin()).abs()).max((c - x.cos()).abs());
        }
        assert!(worst < 1e-12, "worst {worst}");
        // A large position times the highest RoPE frequency.
        let x = 1_048_575.0;
        let (s, c) = sin_cos(x);
        assert!((s - x.sin()).abs() < 1e-9 && (c - x.cos()).abs() < 1e-9);
    }

    #[test]
    fn exact_at_zero_and_quadrants() {
        assert_eq!(sin_cos(0.0), (0.0, 1.0));
        let (s, c) = sin_cos(std::f64::consts::FRAC_PI_2);
        assert!((s - 1.0).abs() < 1e-15 && c.abs() < 1e-15);
        let (s, c) = sin_cos(-std::f64::consts::PI);
        assert!(s.abs() < 1e-15 && (c + 1.0).abs() < 1e-15);
    }
}
