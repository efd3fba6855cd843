//! The C8 parameters: a scale and an offset per channel of one tensor ([`ChannelQuant`]),
//! K and V of one layer ([`LayerQuant`]), and a model's layers ([`C8Params`]).

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// Scale and offset of every channel of one tensor (K or V of one layer).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelQuant {
    scale: Vec<f32>,
    offset: Vec<f32>,
}

impl ChannelQuant {
    /// Validates: equal non-zero lengths, scales finite and > 0, offsets finite.
    pub fn new(scale: Vec<f32>, offset: Vec<f32>) -> Result<ChannelQuant> {
        if scale.is_empty() || scale.len() != offset.len() {
            return Err(Error::LayoutMismatch {
                what: "scale/offset length",
                expected: scale.len(),
                found: offset.len(),
            });
        }
        if let Some(i) = scale.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(Error::NonFinite {
                what: "scale (must be finite and > 0)",
                index: i,
            });
        }
        if let Some(i) = offset.iter().position(|o| !o.is_finite()) {
            return Err(Error::NonFinite {
                what: "offset",
                index: i,
            });
        }
        Ok(ChannelQuant { scale, offset })
    }
    /// Per-channel scales.
    pub fn scale(&self) -> &[f32] {
        &self.scale
    }
    /// Per-channel offsets.
    pub fn offset(&self) -> &[f32] {
        &self.offset
    }
    /// Channels.
    pub fn channels(&self) -> usize {
        self.scale.len()
    }
    /// Whether every offset is 0 (symmetric; some decode kernels ignore the offset).
    pub fn is_symmetric(&self) -> bool {
        self.offset.iter().all(|&o| o == 0.0)
    }
}

/// K and V parameters of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerQuant {
    /// K.
    pub k: ChannelQuant,
    /// V.
    pub v: ChannelQuant,
}

/// C8 parameters of a model, by layer number.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct C8Params {
    layers: BTreeMap<usize, LayerQuant>,
}

impl C8Params {
    /// No layers yet.
    pub fn new() -> C8Params {
        C8Params::default()
    }
    /// Adds layer `i`; all layers must have the same channel count for K and for V.
    pub fn insert(&mut self, i: usize, layer: LayerQuant) -> Result<()> {
        if let Some(first) = self.layers.values().next() {
            for (what, a, b) in [
                ("K channels", first.k.channels(), layer.k.channels()),
                ("V channels", first.v.channels(), layer.v.channels()),
            ] {
                if a != b {
                    return Err(Error::LayoutMismatch {
                        what,
                        expected: a,
                        found: b,
                    });
                }
            }
        }
        self.layers.insert(i, layer);
        Ok(())
    }
    /// Layer `i`.
    pub fn layer(&self, i: usize) -> Option<&LayerQuant> {
        self.layers.get(&i)
    }
    /// Layer `i`, or a typed error naming what is missing.
    pub fn require(&self, i: usize) -> Result<&LayerQuant> {
        self.layers.get(&i).ok_or(Error::MissingTensor {
            layer: i,
            which: "k_proj/v_proj kv_cache_scale",
        })
    }
    /// All layers in order.
    pub fn layers(&self) -> impl Iterator<Item = (usize, &LayerQuant)> {
        self.layers.iter().map(|(&i, l)| (i, l))
    }
    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }
    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
    /// Whether every layer's K and V offsets are all 0.
    pub fn is_symmetric(&self) -> bool {
        self.layers
            .values()
            .all(|l| l.k.is_symmetric() && l.v.is_symmetric())
    }
}
