//! Calibration: per-channel min / max over a cache, then msmodelslim's
//! `int8_per_channel_sym` / `int8_per_channel_asym` parameters.
//!
//! As msmodelslim's INT8 `calculate_qparam`: `min = min(min, 0)`, `max = max(max, 0)`;
//! symmetric: `scale = max(max(-min, max) / 127, eps)`, `offset = 0`; asymmetric:
//! `scale = max((max - min) / 255, eps)`, `offset = round(-min / scale) - 128`;
//! `eps = f32::EPSILON`.

use std::ops::Range;

use super::kernel::observe;
use super::rows::{check_observe_rows, min_max_rows};
use super::ChannelQuant;
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::TensorLayout;

/// Running per-channel min / max (calibration may see a cache in several pieces, or an
/// engine's rows batch by batch).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelStats {
    min: Vec<f32>,
    max: Vec<f32>,
    tokens: u64,
}

impl ChannelStats {
    /// Nothing observed yet, `channels` channels.
    pub fn new(channels: usize) -> ChannelStats {
        ChannelStats {
            min: vec![f32::INFINITY; channels],
            max: vec![f32::NEG_INFINITY; channels],
            tokens: 0,
        }
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.min.len()
    }

    /// Tokens (rows) observed so far by successful calls.
    pub fn tokens_observed(&self) -> u64 {
        self.tokens
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
        let n = tokens.len() as u64;
        observe(layout, src, tokens, &mut self.min, &mut self.max)?;
        self.tokens += n;
        Ok(())
    }

    /// Observes `rows` rows of `src`: each row `channels()` contiguous elements of
    /// `dtype` (f16 / bf16 / f32), exactly `rows * channels()` elements (the engine's
    /// rows as it writes them). All or nothing: a NaN or infinity anywhere
    /// ([`Error::NonFinite`](crate::Error::NonFinite), with its element index), a wrong
    /// length or an int8 dtype leave the statistics unchanged. Allocates nothing.
    pub fn observe_rows(&mut self, src: &[u8], dtype: DType, rows: usize) -> Result<()> {
        check_observe_rows(src, dtype, rows, self.min.len())?;
        min_max_rows(src, dtype, rows, &mut self.min, &mut self.max);
        self.tokens += rows as u64;
        Ok(())
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
