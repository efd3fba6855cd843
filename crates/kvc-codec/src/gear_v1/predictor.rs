//! gear-v1's per-stream predictors and the sets of them an encoder may try.
//!
//! Each predictor maps a byte stream `s` to a residual stream `r` of the same length,
//! with `prev` starting at 0:
//! - raw (mode 0): `r[i] = s[i]`;
//! - delta_seq (mode 1): `r[i] = s[i] - s[i-1]` (wrapping, mod 256);
//! - xor_seq (mode 2): `r[i] = s[i] ^ s[i-1]`.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// One predictor; its discriminant is the frame's `mode` byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Predictor {
    /// No transform.
    Raw = 0,
    /// Difference from the previous byte, mod 256.
    DeltaSeq = 1,
    /// XOR with the previous byte.
    XorSeq = 2,
}

impl Predictor {
    /// All predictors in gear-v1's candidate order.
    pub const ALL: [Predictor; 3] = [Predictor::Raw, Predictor::DeltaSeq, Predictor::XorSeq];

    /// The frame's mode byte.
    pub const fn mode(self) -> u8 {
        self as u8
    }

    /// The predictor of a mode byte, if it is one.
    pub const fn from_mode(mode: u8) -> Option<Predictor> {
        match mode {
            0 => Some(Predictor::Raw),
            1 => Some(Predictor::DeltaSeq),
            2 => Some(Predictor::XorSeq),
            _ => None,
        }
    }

    /// The name used in predictor lists: `raw`, `delta_seq`, `xor_seq`.
    pub const fn name(self) -> &'static str {
        match self {
            Predictor::Raw => "raw",
            Predictor::DeltaSeq => "delta_seq",
            Predictor::XorSeq => "xor_seq",
        }
    }

    /// Writes the residuals of `src` into `dst` (same length).
    ///
    /// # Panics
    /// If the lengths differ (a bug in the caller, never input-dependent).
    pub fn forward(self, src: &[u8], dst: &mut [u8]) {
        assert_eq!(src.len(), dst.len(), "predictor buffers differ in length");
        match self {
            Predictor::Raw => dst.copy_from_slice(src),
            Predictor::DeltaSeq => {
                let mut prev = 0u8;
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s.wrapping_sub(prev);
                    prev = s;
                }
            }
            Predictor::XorSeq => {
                let mut prev = 0u8;
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s ^ prev;
                    prev = s;
                }
            }
        }
    }

    /// Undoes the predictor on `residuals` and writes byte `i` of the stream to
    /// `out[i * stride + lane]`, interleaving lanes back into elements.
    ///
    /// # Panics
    /// If `out` is too short for `residuals.len()` elements of `stride` bytes or
    /// `lane >= stride` (a bug in the caller, never input-dependent).
    pub fn inverse_interleave(self, residuals: &[u8], out: &mut [u8], stride: usize, lane: usize) {
        assert!(lane < stride && out.len() >= residuals.len() * stride);
        if residuals.is_empty() {
            return;
        }
        let dst = out[lane..].iter_mut().step_by(stride);
        match self {
            Predictor::Raw => {
                for (d, &r) in dst.zip(residuals) {
                    *d = r;
                }
            }
            Predictor::DeltaSeq => {
                let mut prev = 0u8;
                for (d, &r) in dst.zip(residuals) {
                    prev = prev.wrapping_add(r);
                    *d = prev;
                }
            }
            Predictor::XorSeq => {
                let mut prev = 0u8;
                for (d, &r) in dst.zip(residuals) {
                    prev ^= r;
                    *d = prev;
                }
            }
        }
    }
}

impl fmt::Display for Predictor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The predictors an encoder tries, always in the order raw, delta_seq, xor_seq.
/// Never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PredictorSet {
    bits: u8,
}

impl PredictorSet {
    /// raw only (MNN's behaviour when no predictor list is configured).
    pub const RAW: PredictorSet = PredictorSet { bits: 1 };
    /// raw, delta_seq and xor_seq: kvc's default for K and V.
    pub const ALL: PredictorSet = PredictorSet { bits: 0b111 };

    /// A set of the given predictors; fails when empty.
    pub fn new(predictors: &[Predictor]) -> Result<Self> {
        let bits = predictors.iter().fold(0u8, |b, p| b | (1 << p.mode()));
        if bits == 0 {
            return Err(Error::GearV1EmptyPredictorSet);
        }
        Ok(PredictorSet { bits })
    }

    /// Whether `p` is in the set.
    pub const fn contains(self, p: Predictor) -> bool {
        self.bits & (1 << p as u8) != 0
    }

    /// The predictors of the set in candidate order.
    pub fn iter(self) -> impl Iterator<Item = Predictor> {
        Predictor::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }
}

impl Default for PredictorSet {
    fn default() -> Self {
        PredictorSet::ALL
    }
}

impl fmt::Display for PredictorSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(p.name())?;
        }
        Ok(())
    }
}

/// Parses MNN's predictor list syntax: comma-separated names with optional spaces or tabs,
/// e.g. `"raw, delta_seq,xor_seq"`. Unlike MNN, which ignores unknown names, an unknown
/// name or an empty list is an error.
impl FromStr for PredictorSet {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut list = Vec::new();
        for token in s.split(',') {
            let token = token.trim_matches([' ', '\t']);
            let p = Predictor::ALL
                .into_iter()
                .find(|p| p.name() == token)
                .ok_or_else(|| Error::GearV1UnknownPredictorName {
                    name: token.to_string(),
                })?;
            list.push(p);
        }
        PredictorSet::new(&list)
    }
}

/// Predictor sets chosen separately for K and for V tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvPredictorSets {
    /// The set tried on K tensors.
    pub k: PredictorSet,
    /// The set tried on V tensors.
    pub v: PredictorSet,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_forward() {
        let s = [0x10, 0x12, 0x11, 0xff, 0x00];
        let mut r = [0u8; 5];
        Predictor::Raw.forward(&s, &mut r);
        assert_eq!(r, s);
        Predictor::DeltaSeq.forward(&s, &mut r);
        assert_eq!(r, [0x10, 0x02, 0xff, 0xee, 0x01]);
        Predictor::XorSeq.forward(&s, &mut r);
        assert_eq!(r, [0x10, 0x02, 0x03, 0xee, 0xff]);
    }

    #[test]
    fn inverse_interleave_undoes_forward() {
        let s: Vec<u8> = (0..300u32).map(|i| (i * i % 257) as u8).collect();
        for p in Predictor::ALL {
            let mut r = vec![0u8; s.len()];
            p.forward(&s, &mut r);
            let mut out = vec![0u8; s.len() * 3];
            p.inverse_interleave(&r, &mut out, 3, 1);
            let lane: Vec<u8> = out.iter().skip(1).step_by(3).copied().collect();
            assert_eq!(lane, s, "{p}");
        }
    }

    #[test]
    fn sets_parse_and_order() {
        let set: PredictorSet = " xor_seq ,\traw".parse().unwrap();
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            vec![Predictor::Raw, Predictor::XorSeq]
        );
        assert_eq!(set.to_string(), "raw,xor_seq");
        assert_eq!(
            "raw,delta_seq,xor_seq".parse::<PredictorSet>().unwrap(),
            PredictorSet::ALL
        );
        assert!(matches!(
            "raw,delta".parse::<PredictorSet>(),
            Err(Error::GearV1UnknownPredictorName { ref name }) if name == "delta"
        ));
        assert!(matches!(
            "".parse::<PredictorSet>(),
            Err(Error::GearV1UnknownPredictorName { .. })
        ));
        assert!(matches!(
            PredictorSet::new(&[]),
            Err(Error::GearV1EmptyPredictorSet)
        ));
        for m in 0..=255u8 {
            assert_eq!(Predictor::from_mode(m).is_some(), m < 3);
        }
    }
}
