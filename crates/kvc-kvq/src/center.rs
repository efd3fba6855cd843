//! Centers: one fixed vector per KV head that rows are coded relative to.
//!
//! An engine that fixes a center `c` for a layer's K (or V) of one KV head codes every
//! later row `x` of that head as `x - c` and never stores `x` itself. Attention needs no
//! correction for K and one addition for V:
//! - K: `q . (k - c) = q . k - q . c`, and `q . c` is the same for every cached token of
//!   the head, so the softmax over the scores is unchanged. Score the packed rows as they
//!   are.
//! - V: the softmax weights sum to 1, so `sum_i p_i (v_i - c) + c = sum_i p_i v_i`. Add `c`
//!   to the head's attention output once.
//!
//! What it buys: a row's scale follows its norm, and after the rotation every coordinate's
//! step grows with it. K rows of real models carry large per-channel offsets that change
//! slowly from token to token (SmolLM2-135M: the mean over tokens holds 40-60 % of K's
//! energy, 10-25 % of V's). Coding `k - c` spends the bits on what varies between tokens.
//!
//! Where `c` comes from is the engine's choice; it must be fixed before the head's first
//! coded row and stored with the cache (`n_kv_head * head_dim` values per layer and
//! tensor). [`mean_center`] is the one kvc's llama.cpp client uses: the mean of the rows an
//! engine still holds uncoded (its recent window) when the first of them is coded, rounded
//! to f16 as it is stored. This module is the arithmetic: it does not choose when.
//!
//! Not here: packed formats (a centered row is an ordinary kvq row) and attention kernels
//! (they run on centered rows unchanged).

use half::f16;

use super::rotation::MAX_HEAD_DIM;
use super::row::RowCodec;
use crate::error::{Error, Result};

/// Checks `center` against rows of `dim` values: a non-empty whole number of rows, at most
/// as many as there are rows to apply it to when `rows` is given, every value finite.
/// Returns the number of center rows (KV heads).
fn center_rows(center: &[f32], dim: usize) -> Result<usize> {
    if center.is_empty() || !center.len().is_multiple_of(dim) {
        return Err(Error::LayoutMismatch {
            what: "center (a non-empty multiple of head_dim values)",
            expected: (center.len() / dim).max(1) * dim,
            found: center.len(),
        });
    }
    if let Some(i) = center.iter().position(|v| !v.is_finite()) {
        return Err(Error::BadValue {
            what: "center",
            row: i / dim,
            element: i % dim,
            value: center[i],
            reason: "is not finite",
        });
    }
    Ok(center.len() / dim)
}

/// The mean over tokens of `rows` (`[token][n_kv_head][head_dim]`) per KV head and channel,
/// summed in f64 and rounded to f16 (the precision a center is stored in), into `out`
/// (`n_kv_head * head_dim` values). Errors: no rows, a length that is not whole tokens, a
/// wrong `out` length, a non-finite value; nothing is written on error.
pub fn mean_center(rows: &[f32], n_kv_head: usize, head_dim: usize, out: &mut [f32]) -> Result<()> {
    let width = n_kv_head
        .checked_mul(head_dim)
        .filter(|&w| w > 0)
        .ok_or(Error::InvalidValue {
            what: "n_kv_head * head_dim",
            value: 0,
            reason: "must be > 0 and fit in usize",
        })?;
    if rows.is_empty() || !rows.len().is_multiple_of(width) {
        return Err(Error::LayoutMismatch {
            what: "rows (a non-empty multiple of n_kv_head * head_dim)",
            expected: (rows.len() / width).max(1) * width,
            found: rows.len(),
        });
    }
    if out.len() != width {
        return Err(Error::LayoutMismatch {
            what: "center out (n_kv_head * head_dim)",
            expected: width,
            found: out.len(),
        });
    }
    if let Some(i) = rows.iter().position(|v| !v.is_finite()) {
        return Err(Error::BadValue {
            what: "rows",
            row: i / head_dim,
            element: i % head_dim,
            value: rows[i],
            reason: "is not finite",
        });
    }
    let n = (rows.len() / width) as f64;
    for (e, o) in out.iter_mut().enumerate() {
        let sum: f64 = rows
            .iter()
            .skip(e)
            .step_by(width)
            .map(|&v| f64::from(v))
            .sum();
        *o = f16::from_f64(sum / n).to_f32();
    }
    Ok(())
}

impl RowCodec {
    /// Quantizes rows as [`RowCodec::quantize_rows`] does, each coded as `row - center`:
    /// row `r` uses center row `r % (center.len() / head_dim)`, so rows laid out
    /// `[token][n_kv_head][head_dim]` take an `[n_kv_head][head_dim]` center. No
    /// allocation. Errors: those of `quantize_rows` for the differences (a difference
    /// that is not finite or beyond [`MAX_ABS_VALUE`](super::row::MAX_ABS_VALUE) names
    /// its row and element), a center that is not whole rows or has a non-finite value.
    /// All or nothing, as `quantize_rows`: every row is checked first and `out` is
    /// written only when every row codes.
    pub fn quantize_rows_centered(&self, x: &[f32], center: &[f32], out: &mut [u8]) -> Result<()> {
        let d = self.dim();
        let heads = center_rows(center, d)?;
        let n = self.rows_of(x.len(), out.len())?;
        let mut buf = [0f32; MAX_HEAD_DIM];
        let buf = &mut buf[..d];
        let diff = |r: usize, xr: &[f32], buf: &mut [f32]| {
            let c = &center[(r % heads) * d..][..d];
            for ((b, &v), &cv) in buf.iter_mut().zip(xr).zip(c) {
                *b = v - cv;
            }
        };
        for (r, xr) in x.chunks_exact(d).enumerate() {
            diff(r, xr, buf);
            if let Some(i) = xr.iter().position(|v| !v.is_finite()) {
                return Err(Error::BadValue {
                    what: "kvq row",
                    row: r,
                    element: i,
                    value: xr[i],
                    reason: "is not finite",
                });
            }
            self.check_rows_codable(buf).map_err(|e| match e {
                Error::BadValue {
                    element,
                    value,
                    reason,
                    ..
                } => Error::BadValue {
                    what: "kvq row - center",
                    row: r,
                    element,
                    value,
                    reason,
                },
                e => e,
            })?;
        }
        for (r, (xr, o)) in x
            .chunks_exact(d)
            .zip(out.chunks_exact_mut(self.row_bytes()))
            .take(n)
            .enumerate()
        {
            diff(r, xr, buf);
            // Values checked above (`check_rows_codable` of the same difference).
            self.code_checked_row(buf, o).map_err(|e| e.at_row(r))?;
        }
        Ok(())
    }

    /// Dequantizes rows as [`RowCodec::dequantize_rows`] does and adds the center back
    /// (row `r` center row `r % (center.len() / head_dim)`): the values an engine that
    /// decodes rows to floats holds. No allocation.
    pub fn dequantize_rows_centered(
        &self,
        packed: &[u8],
        center: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.dim();
        let heads = center_rows(center, d)?;
        // All or nothing: `dequantize_rows` checks every row before it writes.
        self.dequantize_rows(packed, out)?;
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            let c = &center[(r % heads) * d..][..d];
            for (v, &cv) in o.iter_mut().zip(c) {
                *v += cv;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Method;

    fn rows(n: usize, d: usize, offset: &[f32], seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n * d)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let noise = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                noise + offset[i % offset.len()]
            })
            .collect()
    }

    #[test]
    fn centered_rows_are_plain_rows_of_the_difference() {
        let d = 64;
        let codec = RowCodec::new(Method::LloydMax, 4, d, 9).unwrap();
        let heads = 3;
        let offset: Vec<f32> = (0..heads * d)
            .map(|i| if i % 7 == 0 { 12.0 } else { 0.1 })
            .collect();
        let x = rows(10 * heads, d, &offset, 1);
        let mut c = vec![0f32; heads * d];
        mean_center(&x, heads, d, &mut c).unwrap();
        // The same bytes as quantizing x - c by hand.
        let diff: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| v - c[i % (heads * d)])
            .collect();
        let rb = codec.row_bytes();
        let (mut a, mut b) = (vec![0u8; 10 * heads * rb], vec![0u8; 10 * heads * rb]);
        codec.quantize_rows_centered(&x, &c, &mut a).unwrap();
        codec.quantize_rows(&diff, &mut b).unwrap();
        assert_eq!(a, b);
        // Decoded + center is closer to x than plain coding when the offset dominates.
        let mut y = vec![0f32; x.len()];
        codec.dequantize_rows_centered(&a, &c, &mut y).unwrap();
        let mut plain = vec![0u8; a.len()];
        codec.quantize_rows(&x, &mut plain).unwrap();
        let mut z = vec![0f32; x.len()];
        codec.dequantize_rows(&plain, &mut z).unwrap();
        let err = |u: &[f32]| -> f64 {
            u.iter()
                .zip(&x)
                .map(|(p, q)| f64::from(p - q).powi(2))
                .sum()
        };
        assert!(err(&y) < 0.5 * err(&z), "{} vs {}", err(&y), err(&z));
    }

    #[test]
    fn mean_center_is_the_f16_mean() {
        // Two channels of three tokens: means 1.5 and 6.25 / 3 (not an f16).
        let x = [1.0f32, 2.0, 3.0, 4.0, 0.5, 0.25];
        let mut c = [0f32; 2];
        mean_center(&x, 1, 2, &mut c).unwrap();
        assert_eq!(c, [1.5, f16::from_f64(6.25 / 3.0).to_f32()]);
        assert_ne!(c[1], (6.25f64 / 3.0) as f32);
    }

    #[test]
    fn bad_centers_and_rows_are_errors() {
        let d = 64;
        let codec = RowCodec::new(Method::LloydMax, 3, d, 9).unwrap();
        let x = vec![0.5f32; 2 * d];
        let mut out = vec![0u8; 2 * codec.row_bytes()];
        for c in [vec![], vec![0.0; d - 1], vec![0.0; d + 1]] {
            assert!(codec.quantize_rows_centered(&x, &c, &mut out).is_err());
        }
        let mut nan = vec![0.0; d];
        nan[3] = f32::NAN;
        assert!(codec.quantize_rows_centered(&x, &nan, &mut out).is_err());
        // An overflow in row - center is named.
        let big = vec![f32::MAX; d];
        let neg = vec![-f32::MAX; 2 * d];
        let e = codec
            .quantize_rows_centered(&neg, &big, &mut out)
            .unwrap_err();
        assert!(format!("{e}").contains("row - center"), "{e}");
        let mut y = vec![0f32; 2 * d];
        assert!(codec
            .dequantize_rows_centered(&out, &[0.0; 3], &mut y)
            .is_err());
        let mut c = vec![0f32; d];
        assert!(mean_center(&[], 1, d, &mut c).is_err());
        assert!(mean_center(&x[..d + 1], 1, d, &mut c).is_err());
        assert!(mean_center(&x, 0, d, &mut c).is_err());
        assert!(mean_center(&x, 2, d, &mut c).is_err());
        let mut xn = x.clone();
        xn[5] = f32::INFINITY;
        assert!(mean_center(&xn, 1, d, &mut c).is_err());
    }
}
