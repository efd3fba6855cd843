//! The policy's settings, with the defaults of the MNN report (section 3.7).

use crate::error::{Error, Result};

/// How many EMA scores a layer keeps per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ScoreGranularity {
    /// One score per block for the whole layer: every query head adds into it (the spec's
    /// behaviour). Plans are per layer.
    #[default]
    PerLayer,
    /// One score per block and KV head: query heads add into their GQA group
    /// (`head / (n_heads / n_kv_heads)`). Each KV head gets its own plan; all keep the same
    /// number of tokens, so the layer's length stays one number.
    PerKvHead,
}

/// Which unprotected blocks a plan keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Selection {
    /// H2O: the heavy hitters, by descending EMA score (ties: lower block index first).
    #[default]
    HeavyHitters,
    /// StreamingLLM: sink plus a window of the most recent blocks, the same budget as H2O;
    /// scores are ignored.
    StreamingLlm,
}

/// Whether each layer plans alone or all layers share one plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PlanScope {
    /// Every managed layer has its own trigger and plan (MNN).
    #[default]
    PerLayer,
    /// One plan for every layer, made at the end of the last managed layer's call from the
    /// sum of all managed layers' scores; for engines whose cache cells are shared by all
    /// layers (llama.cpp). The trigger counts the last managed layer's calls.
    LayerUniform,
}

/// The H2O settings. Field `x` is the spec's `h2o_x`; [`H2oConfig::default`] gives the
/// spec's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct H2oConfig {
    /// `h2o_block_tokens`: tokens per scored block (default 64); at least 1.
    pub block_tokens: u32,
    /// `h2o_sink_tokens`: leading tokens never evicted (default 32).
    pub sink_tokens: u32,
    /// `h2o_recent_tokens`: trailing tokens never evicted (default 256).
    pub recent_tokens: u32,
    /// `h2o_target_lossy_ratio`: tokens before / tokens kept the plan aims at (default 3.5);
    /// finite and at least 1.
    pub target_lossy_ratio: f32,
    /// `h2o_ema_alpha`: weight of the history in the EMA (default 0.9); in `[0, 1]`.
    pub ema_alpha: f32,
    /// `h2o_trigger_min_tokens`: no plan below this `kv_len` (default 512).
    pub trigger_min_tokens: u32,
    /// `h2o_update_interval`: calls of a layer between two of its plans (default 16).
    pub update_interval: u32,
    /// `h2o_layer_start`: first managed layer (default 0).
    pub layer_start: u32,
    /// `h2o_layer_end`: last managed layer, inclusive [`None`: the last layer].
    pub layer_end: Option<u32>,
    /// One score per layer (spec) or per KV head [per layer].
    pub granularity: ScoreGranularity,
    /// H2O or StreamingLLM (default H2O).
    pub selection: Selection,
    /// Per-layer plans (MNN) or one plan for all layers (llama.cpp) [per layer].
    pub scope: PlanScope,
}

impl Default for H2oConfig {
    fn default() -> Self {
        H2oConfig {
            block_tokens: 64,
            sink_tokens: 32,
            recent_tokens: 256,
            target_lossy_ratio: 3.5,
            ema_alpha: 0.9,
            trigger_min_tokens: 512,
            update_interval: 16,
            layer_start: 0,
            layer_end: None,
            granularity: ScoreGranularity::PerLayer,
            selection: Selection::HeavyHitters,
            scope: PlanScope::PerLayer,
        }
    }
}

impl H2oConfig {
    /// Checks every field; the policy only accepts a valid config.
    ///
    /// Unlike MNN, which clamps `alpha` into `[0, 1]` and the ratio up to 1, out-of-range
    /// values are rejected: a config that asks for them is a mistake worth reporting.
    pub fn validate(&self) -> Result<()> {
        if self.block_tokens == 0 {
            return Err(invalid(
                "h2o_block_tokens",
                "must be at least 1, found 0".into(),
            ));
        }
        let r = self.target_lossy_ratio;
        if !r.is_finite() || r < 1.0 {
            return Err(invalid(
                "h2o_target_lossy_ratio",
                format!("must be finite and >= 1, found {r}"),
            ));
        }
        let a = self.ema_alpha;
        if !(0.0..=1.0).contains(&a) {
            return Err(invalid(
                "h2o_ema_alpha",
                format!("must be in [0, 1], found {a}"),
            ));
        }
        if let Some(end) = self.layer_end {
            if end < self.layer_start {
                return Err(invalid(
                    "h2o_layer_end",
                    format!(
                        "must be >= h2o_layer_start ({}), found {end}",
                        self.layer_start
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether `layer` is in `[layer_start, layer_end]`.
    pub fn manages(&self, layer: usize) -> bool {
        let start = self.layer_start as usize;
        layer >= start && self.layer_end.is_none_or(|end| layer <= end as usize)
    }
}

fn invalid(field: &'static str, reason: String) -> Error {
    Error::InvalidConfig { field, reason }
}
