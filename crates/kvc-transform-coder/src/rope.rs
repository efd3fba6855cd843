//! Rotary position embedding, undone before the transform and redone after it.
//!
//! An engine's cache holds K after RoPE: each pair of channels of a token at position `p`
//! is rotated by `p·θ_i`. The rotation spreads every pair's energy over both of its
//! channels as positions advance, which hides K's low-rank structure from a linear
//! transform; undone, K's principal components carry far more of its energy (on
//! SmolLM2-135M, a third fewer bits at the same attention error). The chunk's positions are
//! known to both sides (a prefix chunk `i` of `n` tokens covers `i·n..(i+1)·n`), so the
//! decoder redoes exactly the rotation the encoder undid.
//!
//! Angles are `p·θ_i` in f64 with the `θ_i` stored in the calibration file and the sine and
//! cosine of `trig` (own code, not libm), so that a restore gives the same bits on every host.

use crate::error::{Error, Result};
use crate::trig::sin_cos;

/// How channels pair up, as llama.cpp's rope types name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeKind {
    /// No rotation (a model without RoPE, or V).
    None,
    /// Adjacent channels `(2i, 2i+1)` (llama.cpp `LLAMA_ROPE_TYPE_NORM`, the llama family).
    Norm,
    /// Halves `(i, i + n_rot/2)` (llama.cpp `LLAMA_ROPE_TYPE_NEOX`: qwen2, phi3, gemma, …).
    Neox,
}

impl RopeKind {
    /// The byte stored in the calibration file: 0 none, 1 norm, 2 neox.
    pub fn code(self) -> u8 {
        match self {
            RopeKind::None => 0,
            RopeKind::Norm => 1,
            RopeKind::Neox => 2,
        }
    }

    /// The kind of a stored byte.
    pub fn from_code(c: u8) -> Option<RopeKind> {
        match c {
            0 => Some(RopeKind::None),
            1 => Some(RopeKind::Norm),
            2 => Some(RopeKind::Neox),
            _ => None,
        }
    }

    /// `none`, `norm` or `neox`.
    pub fn name(self) -> &'static str {
        match self {
            RopeKind::None => "none",
            RopeKind::Norm => "norm",
            RopeKind::Neox => "neox",
        }
    }

    /// The kind named `none`, `norm` or `neox`.
    pub fn from_name(s: &str) -> Option<RopeKind> {
        [RopeKind::None, RopeKind::Norm, RopeKind::Neox]
            .into_iter()
            .find(|k| k.name() == s)
    }
}

/// The rotation of one model's K rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    kind: RopeKind,
    head_dim: usize,
    /// One angular frequency per rotated pair (`n_rot / 2` of them).
    theta: Vec<f64>,
}

impl Rope {
    /// No rotation for rows of `head_dim` values.
    pub fn none(head_dim: usize) -> Rope {
        Rope {
            kind: RopeKind::None,
            head_dim,
            theta: Vec::new(),
        }
    }

    /// The rotation llama.cpp applies with `freq_base` and `freq_scale` to the first
    /// `n_rot` channels of rows of `head_dim`: `θ_i = freq_scale · freq_base^(-2i/n_rot)`.
    pub fn from_base(
        kind: RopeKind,
        head_dim: usize,
        n_rot: usize,
        freq_base: f64,
        freq_scale: f64,
    ) -> Result<Rope> {
        if kind == RopeKind::None {
            return Ok(Rope::none(head_dim));
        }
        if !(freq_base.is_finite() && freq_base > 1.0 && freq_scale.is_finite() && freq_scale > 0.0)
        {
            return Err(Error::invalid(
                "rope",
                format!("freq_base {freq_base} and freq_scale {freq_scale}: need base > 1 and scale > 0"),
            ));
        }
        let theta = (0..n_rot / 2)
            .map(|i| freq_scale * freq_base.powf(-2.0 * i as f64 / n_rot as f64))
            .collect();
        Rope::from_theta(kind, head_dim, theta)
    }

    /// A rotation from its per-pair frequencies (as a calibration file stores them).
    pub fn from_theta(kind: RopeKind, head_dim: usize, theta: Vec<f64>) -> Result<Rope> {
        let n_rot = 2 * theta.len();
        if kind == RopeKind::None && !theta.is_empty() {
            return Err(Error::invalid("rope", "kind none with frequencies".into()));
        }
        if n_rot > head_dim || !head_dim.is_multiple_of(2) {
            return Err(Error::invalid(
                "rope",
                format!("{n_rot} rotated channels in rows of {head_dim}"),
            ));
        }
        if let Some(t) = theta
            .iter()
            .find(|t| !(t.is_finite() && **t >= 0.0 && **t <= 16.0))
        {
            return Err(Error::invalid(
                "rope",
                format!("frequency {t}: must be finite, in [0, 16]"),
            ));
        }
        Ok(Rope {
            kind,
            head_dim,
            theta,
        })
    }

    /// How channels pair up.
    pub fn kind(&self) -> RopeKind {
        self.kind
    }

    /// The per-pair frequencies.
    pub fn theta(&self) -> &[f64] {
        &self.theta
    }

    /// Channels rotated (`2 · theta().len()`).
    pub fn n_rot(&self) -> usize {
        2 * self.theta.len()
    }

    fn pair(&self, i: usize) -> (usize, usize) {
        match self.kind {
            RopeKind::Neox => (i, i + self.theta.len()),
            _ => (2 * i, 2 * i + 1),
        }
    }

    /// `(cos, sin)` of every pair at `pos`, into `cs` (`2 · theta().len()` values).
    pub fn angles(&self, pos: u64, cs: &mut [f64]) {
        for (i, &t) in self.theta.iter().enumerate() {
            let (s, c) = sin_cos(pos as f64 * t);
            cs[2 * i] = c;
            cs[2 * i + 1] = s;
        }
    }

    /// Rotates `row` (`head_dim` values) by the angles `cs` of [`Rope::angles`]: forward
    /// (what the engine did) or inverse (`undo`). Each pair is rotated in f64 and rounded
    /// to f32 once.
    pub fn rotate(&self, cs: &[f64], row: &mut [f32], undo: bool) {
        debug_assert_eq!(row.len(), self.head_dim);
        for i in 0..self.theta.len() {
            let (a, b) = self.pair(i);
            let (c, s) = (cs[2 * i], if undo { -cs[2 * i + 1] } else { cs[2 * i + 1] });
            let (x, y) = (row[a] as f64, row[b] as f64);
            row[a] = (x * c - y * s) as f32;
            row[b] = (x * s + y * c) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undo_inverts_the_rotation_for_both_pairings() {
        for kind in [RopeKind::Norm, RopeKind::Neox] {
            let r = Rope::from_base(kind, 64, 64, 100_000.0, 1.0).unwrap();
            let row: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let mut cs = vec![0f64; 64];
            for pos in [0u64, 1, 7, 255, 2047, 65_535] {
                r.angles(pos, &mut cs);
                let mut x = row.clone();
                r.rotate(&cs, &mut x, false);
                if pos > 0 {
                    assert_ne!(x, row);
                }
                r.rotate(&cs, &mut x, true);
                for (a, b) in x.iter().zip(&row) {
                    assert!((a - b).abs() < 1e-5, "{kind:?} pos {pos}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn pairs_follow_llama_cpp() {
        // Position 1 rotates pair 0 by theta_0 = 1 radian: norm mixes channels 0 and 1,
        // neox channels 0 and n_rot/2.
        for (kind, partner) in [(RopeKind::Norm, 1), (RopeKind::Neox, 4)] {
            let r = Rope::from_base(kind, 8, 8, 10_000.0, 1.0).unwrap();
            let mut cs = vec![0f64; 8];
            r.angles(1, &mut cs);
            let mut x = vec![0f32; 8];
            x[0] = 1.0;
            r.rotate(&cs, &mut x, false);
            assert!((x[0] - 1f32.cos()).abs() < 1e-6);
            assert!((x[partner] - 1f32.sin()).abs() < 1e-6, "{kind:?} {x:?}");
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(Rope::from_base(RopeKind::Norm, 64, 64, 0.5, 1.0).is_err());
        assert!(Rope::from_base(RopeKind::Norm, 64, 64, f64::NAN, 1.0).is_err());
        assert!(Rope::from_theta(RopeKind::Norm, 64, vec![1.0; 33]).is_err());
        assert!(Rope::from_theta(RopeKind::Norm, 64, vec![f64::INFINITY]).is_err());
        assert!(Rope::from_theta(RopeKind::None, 64, vec![1.0]).is_err());
    }
}
