//! What the store does: mode, scope, hot zones, chunking, pool and cache sizes.
//!
//! Defaults are MNN's (`h2o_lossless_*` in the spec, sections 4 and 5).

use serde::Serialize;

use crate::error::{Error, Result};

/// How the store treats a cold chunk (spec 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Measure only: one representative layer per scope is compressed, decoded and
    /// verified synchronously; the cache is never written or released.
    Probe,
    /// Every eligible layer: compress, decompress, verify and write back synchronously
    /// in the calling thread; nothing is released.
    Full,
    /// Compress on the worker pool, release the raw range once verified, restore on
    /// demand before attention.
    Store,
}

impl Mode {
    /// `probe`, `full` or `store`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Probe => "probe",
            Mode::Full => "full",
            Mode::Store => "store",
        }
    }
}

/// Which layers are eligible (`h2o_lossless_scope`, spec 4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// 1: the first `front_n` layers, all their tokens.
    FrontN,
    /// 2: the H2O layers (`h2o_layer_start..=h2o_layer_end`), their kept tokens.
    H2oKept,
    /// 3: both.
    Both,
}

impl Scope {
    /// MNN's numeric value (1, 2, 3).
    pub fn value(self) -> u8 {
        match self {
            Scope::FrontN => 1,
            Scope::H2oKept => 2,
            Scope::Both => 3,
        }
    }

    /// The scope of MNN's numeric value, `None` for anything but 1, 2, 3.
    pub fn from_value(v: u8) -> Option<Scope> {
        match v {
            1 => Some(Scope::FrontN),
            2 => Some(Scope::H2oKept),
            3 => Some(Scope::Both),
            _ => None,
        }
    }
}

/// The store's configuration. [`StoreConfig::default`] is MNN's recommended setting,
/// except that restored chunks are released after attention
/// ([`StoreConfig::evict_after_attention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct StoreConfig {
    /// probe / full / store.
    pub mode: Mode,
    /// Which layers are eligible.
    pub scope: Scope,
    /// Layers `< front_n` are the front scope (default 2).
    pub front_n: usize,
    /// First H2O layer (default 2).
    pub h2o_layer_start: usize,
    /// Last H2O layer, inclusive [`usize::MAX`: to the last layer].
    pub h2o_layer_end: usize,
    /// Leading tokens never compressed (default 16).
    pub hot_sink_tokens: usize,
    /// Trailing tokens never compressed (default 256).
    pub hot_recent_tokens: usize,
    /// Tokens of the first (bootstrap) chunk of the cold range (default 16); 0 disables it.
    pub bootstrap_tokens: usize,
    /// Tokens of every later chunk (default 384).
    pub group_tokens: usize,
    /// Worker threads (default 2).
    pub async_threads: usize,
    /// Tasks the queue holds before submissions are skipped (backpressure) (default 16).
    pub queue_capacity: usize,
    /// Restored chunks one layer keeps resident (per-layer LRU) (default 64).
    pub layer_cache_capacity: usize,
    /// Restored chunks the whole model keeps resident (global LRU) (default 64).
    pub global_cache_capacity: usize,
    /// Check a restored chunk against the hash taken at compression (default true).
    pub verify_restore: bool,
    /// Release what a layer restored once its attention ([`Store::with_layer`],
    /// [`Store::read_tokens`]) returns (default true). Stored chunks then never stay resident
    /// between attention calls, so the memory saved is the codec's whole saving, and each
    /// attention decodes its layer's cold chunks (several in parallel). `false` is MNN's
    /// decode cache: restored chunks stay resident in the per-layer and global LRUs above
    /// and repeated attention calls hit, but a resident chunk holds its raw bytes and its
    /// blob, so a full decode cache makes the store cost memory instead of saving it.
    /// [`Store::restore_layer`] (a prefetch) keeps its chunks resident either way, until
    /// the layer's next attention or [`Store::evict_decoded`].
    ///
    /// [`Store::with_layer`]: crate::Store::with_layer
    /// [`Store::read_tokens`]: crate::Store::read_tokens
    /// [`Store::restore_layer`]: crate::Store::restore_layer
    /// [`Store::evict_decoded`]: crate::Store::evict_decoded
    pub evict_after_attention: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            mode: Mode::Store,
            scope: Scope::Both,
            front_n: 2,
            h2o_layer_start: 2,
            h2o_layer_end: usize::MAX,
            hot_sink_tokens: 16,
            hot_recent_tokens: 256,
            bootstrap_tokens: 16,
            group_tokens: 384,
            async_threads: 2,
            queue_capacity: 16,
            layer_cache_capacity: 64,
            global_cache_capacity: 64,
            verify_restore: true,
            evict_after_attention: true,
        }
    }
}

impl StoreConfig {
    /// Rejects values the store cannot work with.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, value, reason| {
            Err(Error::InvalidConfig {
                field,
                value,
                reason,
            })
        };
        if self.group_tokens == 0 {
            return bad("group_tokens", 0, "must be at least 1");
        }
        if self.async_threads == 0 && self.mode == Mode::Store {
            return bad("async_threads", 0, "store mode needs at least one worker");
        }
        if self.async_threads > 256 {
            return bad("async_threads", self.async_threads, "at most 256");
        }
        if self.queue_capacity == 0 && self.mode == Mode::Store {
            return bad(
                "queue_capacity",
                0,
                "store mode needs a queue of at least 1",
            );
        }
        if self.h2o_layer_start > self.h2o_layer_end {
            return bad(
                "h2o_layer_start",
                self.h2o_layer_start,
                "is after h2o_layer_end",
            );
        }
        Ok(())
    }

    /// The H2O layer range of a kvc-h2o policy's config (`layer_start..=layer_end`), so
    /// that the store's h2o_kept scope covers exactly the layers that policy manages.
    pub fn with_h2o_layers(self, h2o: &kvc_h2o::H2oConfig) -> StoreConfig {
        StoreConfig {
            h2o_layer_start: h2o.layer_start as usize,
            h2o_layer_end: h2o.layer_end.map_or(usize::MAX, |e| e as usize),
            ..self
        }
    }

    /// Whether `layer` is in the configured scope.
    pub fn in_scope(&self, layer: usize) -> bool {
        let front = layer < self.front_n;
        let h2o = layer >= self.h2o_layer_start && layer <= self.h2o_layer_end;
        match self.scope {
            Scope::FrontN => front,
            Scope::H2oKept => h2o,
            Scope::Both => front || h2o,
        }
    }

    /// The cold token range `[begin, end)` of a layer holding `budget` tokens (spec 4.2):
    /// `begin = min(budget, sink)`, `end = max(begin, budget - recent)`.
    pub fn cold_range(&self, budget: usize) -> (usize, usize) {
        let begin = budget.min(self.hot_sink_tokens);
        let end = begin.max(budget.saturating_sub(self.hot_recent_tokens));
        (begin, end)
    }

    /// The chunk grid: the chunk that starts at or covers token `t >= hot_sink` is
    /// `(start, count)`; the bootstrap chunk first, then groups.
    pub fn chunk_at(&self, t: usize) -> (usize, usize) {
        let s = self.hot_sink_tokens;
        let b = self.bootstrap_tokens;
        if t < s + b {
            return (s, b);
        }
        let i = (t - s - b) / self.group_tokens;
        (s + b + i * self.group_tokens, self.group_tokens)
    }

    /// The full chunks of the grid inside the cold range of `budget` tokens.
    pub fn cold_chunks(&self, budget: usize) -> Vec<(usize, usize)> {
        let (begin, end) = self.cold_range(budget);
        let mut out = Vec::new();
        let mut t = begin.max(self.hot_sink_tokens);
        while t < end {
            let (s, n) = self.chunk_at(t);
            if n == 0 {
                t = s + self.bootstrap_tokens;
                continue;
            }
            if s + n > end {
                break;
            }
            out.push((s, n));
            t = s + n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_mnn() {
        let c = StoreConfig::default();
        assert_eq!((c.hot_sink_tokens, c.hot_recent_tokens), (16, 256));
        assert_eq!((c.bootstrap_tokens, c.group_tokens), (16, 384));
        assert_eq!((c.layer_cache_capacity, c.global_cache_capacity), (64, 64));
        c.validate().unwrap();
    }

    #[test]
    fn cold_range_follows_mnn() {
        let c = StoreConfig::default();
        assert_eq!(c.cold_range(0), (0, 0));
        assert_eq!(c.cold_range(10), (10, 10));
        assert_eq!(c.cold_range(200), (16, 16));
        assert_eq!(c.cold_range(1000), (16, 744));
    }

    #[test]
    fn chunks_bootstrap_then_groups() {
        let c = StoreConfig::default();
        assert!(c.cold_chunks(287).is_empty());
        assert_eq!(c.cold_chunks(288), vec![(16, 16)]);
        assert_eq!(c.cold_chunks(16 + 16 + 384 + 255), vec![(16, 16)]);
        assert_eq!(
            c.cold_chunks(16 + 16 + 384 + 256),
            vec![(16, 16), (32, 384)]
        );
        assert_eq!(
            c.cold_chunks(2048),
            vec![(16, 16), (32, 384), (416, 384), (800, 384), (1184, 384)]
        );
        let nb = StoreConfig {
            bootstrap_tokens: 0,
            ..c
        };
        assert_eq!(nb.cold_chunks(16 + 384 + 256), vec![(16, 384)]);
    }

    #[test]
    fn scope_and_validation() {
        let c = StoreConfig {
            front_n: 2,
            h2o_layer_start: 4,
            h2o_layer_end: 5,
            ..StoreConfig::default()
        };
        let on = |s| {
            (0..8)
                .filter(|&l| StoreConfig { scope: s, ..c }.in_scope(l))
                .collect::<Vec<_>>()
        };
        assert_eq!(on(Scope::FrontN), vec![0, 1]);
        assert_eq!(on(Scope::H2oKept), vec![4, 5]);
        assert_eq!(on(Scope::Both), vec![0, 1, 4, 5]);
        assert_eq!(Scope::from_value(3), Some(Scope::Both));
        assert_eq!(Scope::from_value(0), None);
        for bad in [
            StoreConfig {
                group_tokens: 0,
                ..c
            },
            StoreConfig {
                async_threads: 0,
                ..c
            },
            StoreConfig {
                queue_capacity: 0,
                ..c
            },
            StoreConfig {
                h2o_layer_start: 6,
                ..c
            },
        ] {
            assert!(bad.validate().is_err());
        }
    }
}
