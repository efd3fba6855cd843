//! kvq on inputs over the whole f32 range (issue 38): a finite value whose square
//! overflows f32 (about 1.8e19 and up) is refused, never coded as a row of scale 0, by
//! every method, bit width and entry point (rows, centered rows, channel groups); and the
//! batch calls are all or nothing: a bad row anywhere leaves the output byte-identical,
//! the error naming the row and the element.

use kvc_kvq::row::MAX_ABS_VALUE;
use kvc_kvq::{ChannelGroupCodec, Method, RowCodec};
use kvc_kvq::{Error, ErrorKind};
use proptest::prelude::*;

const METHODS: [Method; 4] = [
    Method::LloydMax,
    Method::Uniform { group: 8 },
    Method::Uniform { group: 32 },
    Method::Uniform { group: 64 },
];

/// A row of `d` values of magnitude around `10^exp` (signs and mantissas from `seed`),
/// with `planted` at `at` when given: rows over the whole f32 range, past f16 and past
/// the point where a square overflows.
fn row(d: usize, exp: i32, seed: u64, planted: Option<(usize, f32)>) -> Vec<f32> {
    let mut s = seed | 1;
    let scale = 10f64.powi(exp);
    let mut x: Vec<f32> = (0..d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            (u * scale) as f32
        })
        .collect();
    if let Some((i, v)) = planted {
        x[i % d] = v;
    }
    x
}

fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |a, v| a.max(v.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// One row: either it codes and decodes close to the input (never to zeros for a
    /// row that is not tiny), or it is refused as an invalid argument naming an element
    /// that explains why, with `out` untouched.
    #[test]
    fn a_row_codes_faithfully_or_is_refused(
        m in 0usize..4, bits in 2u8..=8, dsel in 0usize..3, exp in -40i32..=38,
        seed in any::<u64>(), plant in proptest::option::of((0usize..256, any::<u32>())),
    ) {
        let d = [64, 128, 256][dsel];
        let c = RowCodec::new(METHODS[m], bits, d, 7).unwrap();
        let x = row(d, exp, seed, plant.map(|(i, b)| (i, f32::from_bits(b))));
        let mut out = vec![0xA5u8; c.row_bytes()];
        match c.quantize_row(&x, &mut out) {
            Ok(()) => {
                prop_assert!(x.iter().all(|v| v.is_finite() && v.abs() <= MAX_ABS_VALUE));
                let mut y = vec![0f32; d];
                c.dequantize_row(&out, &mut y).unwrap();
                let n: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
                let e: f64 = x.iter().zip(&y).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum::<f64>().sqrt();
                // 2-bit codes lose at most ~0.75 of the norm; tiny rows (f16 subnormal
                // scales) may lose all of it, but only that little.
                prop_assert!(e <= 0.75 * n + 1e-3 * (d as f64).sqrt(), "error {e} norm {n}");
            }
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::InvalidArgument);
                prop_assert!(out.iter().all(|&b| b == 0xA5), "out written on error");
                match err {
                    Error::BadValue { row, element, value, .. } => {
                        prop_assert_eq!(row, 0);
                        prop_assert!(element < d);
                        prop_assert_eq!(value.to_bits(), x[element].to_bits());
                        // Refused: the element itself, or a row too large for an f16
                        // scale (then the named element is the largest).
                        prop_assert!((value.is_nan() || value.abs() > MAX_ABS_VALUE)
                            || (value.abs() == max_abs(&x) && value.abs() > 1000.0),
                            "refused {value:e} in a row of max {:e}", max_abs(&x));
                    }
                    e => prop_assert!(false, "unexpected error {e:?}"),
                }
            }
        }
    }

    /// A batch of rows with one bad row (not finite, or a square that overflows): the
    /// call fails naming that row and element, and the output is byte-identical.
    #[test]
    fn a_bad_row_leaves_the_batch_output_untouched(
        m in 0usize..4, bits in 2u8..=8, n in 1usize..17, bad in 0usize..16,
        element in 0usize..64, kind in 0usize..4, seed in any::<u64>(),
    ) {
        let d = 64;
        let bad = bad % n;
        let c = RowCodec::new(METHODS[m], bits, d, 7).unwrap();
        let mut x = Vec::new();
        for r in 0..n {
            x.extend(row(d, 0, seed.wrapping_add(r as u64), None));
        }
        let v = [f32::NAN, f32::INFINITY, 1e30, 2e19][kind];
        x[bad * d + element] = v;
        let before: Vec<u8> = (0..n * c.row_bytes()).map(|i| (i * 7 + 3) as u8).collect();
        let mut out = before.clone();
        let err = c.quantize_rows(&x, &mut out).unwrap_err();
        prop_assert_eq!(&out, &before);
        prop_assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        let text = err.to_string();
        prop_assert!(text.contains(&format!("row {bad}, element {element}")), "{}", text);
        // Centered: the same, with the difference named.
        let center = vec![0.5f32; d];
        let err = c.quantize_rows_centered(&x, &center, &mut out).unwrap_err();
        prop_assert_eq!(&out, &before);
        prop_assert!(err.to_string().contains(&format!("row {bad}, element {element}")), "{}", err);

        // Dequantize: a corrupt scale in row `bad` of good rows.
        x[bad * d + element] = 1.0;
        let mut packed = vec![0u8; n * c.row_bytes()];
        c.quantize_rows(&x, &mut packed).unwrap();
        packed[bad * c.row_bytes() + 1] = 0x7c | (packed[bad * c.row_bytes() + 1] & 0x80);
        packed[bad * c.row_bytes()] = kind as u8; // inf (0) or NaN (1..3)
        let before_y: Vec<f32> = (0..n * d).map(|i| i as f32).collect();
        let mut y = before_y.clone();
        let err = c.dequantize_rows(&packed, &mut y).unwrap_err();
        prop_assert_eq!(err.kind(), ErrorKind::CorruptData);
        prop_assert_eq!(y, before_y);
        prop_assert!(err.to_string().contains(&format!("packed row {bad}")), "{}", err);
    }

    /// K channel groups: values past f16 (and past a square's overflow) are refused as
    /// invalid arguments naming the token row and channel, the block untouched.
    #[test]
    fn channel_groups_refuse_values_past_f16(
        bits in 2u8..=8, exp in -10i32..=38, seed in any::<u64>(), at in 0usize..(16 * 64),
        planted in any::<u32>(),
    ) {
        let c = ChannelGroupCodec::new(bits, 64, 16).unwrap();
        let mut x = Vec::new();
        for t in 0..16u64 {
            x.extend(row(64, exp.min(4), seed.wrapping_add(t), None));
        }
        let v = if exp > 4 { 10f32.powi(exp) } else { f32::from_bits(planted) };
        x[at] = v;
        let mut out = vec![0x5Au8; c.block_bytes()];
        match c.quantize_block(&x, &mut out) {
            Ok(()) => prop_assert!(v.abs() <= 65504.0),
            Err(e) => {
                prop_assert!(v.is_nan() || v.abs() > 65504.0 || max_abs(&x) > 65504.0);
                prop_assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                prop_assert!(out.iter().all(|&b| b == 0x5A));
                if v.is_nan() || v.abs() > 65504.0 {
                    let t = e.to_string();
                    prop_assert!(t.contains(&format!("row {}, element {}", at / 64, at % 64)), "{}", t);
                }
            }
        }
    }
}

/// The two values of the issue, through every method and bit width: a row holding 1e30
/// (or 2e19, whose square overflows f32) is refused, not stored with scale 0.
#[test]
fn rows_with_overflowing_squares_are_refused() {
    for m in METHODS {
        for bits in 2..=8u8 {
            for d in [64, 128, 256] {
                let c = RowCodec::new(m, bits, d, 7).unwrap();
                for v in [1e30f32, 2e19, -3.4e38, f32::MAX] {
                    let mut x = vec![0.25f32; d];
                    x[d / 2] = v;
                    let mut out = vec![0u8; c.row_bytes()];
                    let e = c.quantize_row(&x, &mut out).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{m:?} {bits} {d} {v}");
                    assert!(e.to_string().contains(&format!("element {}", d / 2)), "{e}");
                    assert!(out.iter().all(|&b| b == 0));
                    // The portable path agrees.
                    assert!(c.portable().quantize_row(&x, &mut out).is_err());
                }
            }
        }
    }
}
