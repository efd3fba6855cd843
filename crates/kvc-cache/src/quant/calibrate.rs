//! Calibration: per-channel min / max over a cache, then msmodelslim's
//! `int8_per_channel_sym` / `int8_per_channel_asym` parameters.
//!
//! As msmodelslim's INT8 `calculate_qparam`: `min = min(min, 0)`, `max = max(max, 0)`;
//! symmetric: `scale = max(max(-min, max) / 127, eps)`, `offset = 0`; asymmetric:
//! `scale = max((max - min) / 255, eps)`, `offset = round(-min / scale) - 128`;
//! `eps = f32::EPSILON`.

use std::ops::Range;

use super::kernel::observe;
use super::ChannelQuant;
use crate::error::Result;
use crate::layout::TensorLayout;

/// Running per-channel min / max (calibration may see a cache in several pieces).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelStats {
    min: Vec<f32>,
    max: Vec<f32>,
}

impl ChannelStats {
    /// Nothing observed yet, `channels` channels.
    pub fn new(channels: usize) -> ChannelStats {
        ChannelStats {
            min: vec![f32::INFINITY; channels],
            max: vec![f32::NEG_INFINITY; channels],
        }
    }

    /// Observes tokens `tokens` of `src`. Fails on NaN / infinity.
    pub fn observe(
        &mut self,
        src: &[u8],
        layout: &TensorLayout,
        tokens: Range<usize>,
    ) -> Result<()> {
        if layout.channels() != self.min.len() {
            return Err(crate::Error::LayoutMismatch {
                what: "calibration channels",
                expected: self.min.len(),
                found: layout.channels(),
            });
        }
        observe(layout, src, tokens, &mut self.min, &mut self.max)
    }

    /// Per-channel minimum seen (`+inf` if nothing).
    pub fn min(&self) -> &[f32] {
        &self.min
    }
    /// Per-channel maximum seen.
    pub fn max(&self) -> &[f32] {
        &self.max
    }

    /// The C8 parameters, symmetric or asymmetric.
    pub fn finish(&self, symmetric: bool) -> Result<ChannelQuant> {
        let eps = f32::EPSILON;
        let mut scale = Vec::with_capacity(self.min.len());
        let mut offset = Vec::with_capacity(self.min.len());
        for (&lo, &hi) in self.min.iter().zip(&self.max) {
            // An unobserved channel has lo = +inf, hi = -inf: both clamp to 0.
            let lo = lo.min(0.0);
            let hi = hi.max(0.0);
            if symmetric {
                scale.push(((-lo).max(hi) / 127.0).max(eps));
                offset.push(0.0);
            } else {
                let s = ((hi - lo) / 255.0).max(eps);
                scale.push(s);
                offset.push((-lo / s).round_ties_even() - 128.0);
            }
        }
        ChannelQuant::new(scale, offset)
    }
}

/// Calibrates one tensor over `tokens`.
pub fn calibrate(
    src: &[u8],
    layout: &TensorLayout,
    tokens: Range<usize>,
    symmetric: bool,
) -> Result<ChannelQuant> {
    let mut st = ChannelStats::new(layout.channels());
    st.observe(src, layout, tokens)?;
    st.finish(symmetric)
}
