//! What the policy achieved: lossy ratio (tokens before eviction / tokens kept) and plan
//! counters, per layer and for the whole model.

/// One layer's counters. Token counts describe the cache as of the layer's last call,
/// with every plan that was applied before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LayerMetrics {
    /// Whether the layer is in the managed range.
    pub managed: bool,
    /// Tokens the cache holds (the `kv_len` of the layer's last call).
    pub cached_tokens: u64,
    /// Tokens it would hold without eviction: cached plus every token evicted by an applied
    /// plan since the sequence began (a reset starts a new sequence).
    pub logical_tokens: u64,
    /// Plans made for this layer (per-layer scope).
    pub plans_made: u64,
    /// Plans the engine applied (the next call's `kv_len` was `kept + n_queries`).
    pub plans_applied: u64,
    /// Plans dropped because the next call's `kv_len` did not match.
    pub plans_dropped: u64,
    /// Calls whose `kv_len` was below what the layer held, with no plan explaining it: the
    /// engine restarted or rewrote the sequence, so the layer's scores were cleared.
    pub resets: u64,
}

impl LayerMetrics {
    /// `logical / cached`; 1 for an empty or unmanaged layer.
    pub fn lossy_ratio(&self) -> f64 {
        ratio(self.logical_tokens, self.cached_tokens)
    }
}

/// Whole-model counters: token counts summed over all managed layers (not the best
/// layer), plan counters summed over layers (or counted once per shared plan in the
/// layer-uniform scope).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct H2oMetrics {
    /// Managed layers.
    pub managed_layers: u64,
    /// Sum over managed layers of [`LayerMetrics::cached_tokens`].
    pub cached_tokens: u64,
    /// Sum over managed layers of [`LayerMetrics::logical_tokens`].
    pub logical_tokens: u64,
    /// Plans made.
    pub plans_made: u64,
    /// Plans applied.
    pub plans_applied: u64,
    /// Plans dropped.
    pub plans_dropped: u64,
    /// Layer resets.
    pub resets: u64,
}

impl H2oMetrics {
    /// Whole-model lossy ratio: `sum(logical) / sum(cached)` over managed layers.
    pub fn lossy_ratio(&self) -> f64 {
        ratio(self.logical_tokens, self.cached_tokens)
    }
}

fn ratio(logical: u64, cached: u64) -> f64 {
    if cached == 0 {
        1.0
    } else {
        logical as f64 / cached as f64
    }
}
