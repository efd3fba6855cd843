//! The [`Tier`] trait every storage level implements, and the in-process memory tier.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::key::ChunkKey;

/// A stored blob, shared without copying between tiers and the caller.
pub type Blob = Arc<Vec<u8>>;

/// Counters a tier keeps about its own medium.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blobs held (as far as this process knows; 0 where the tier cannot tell, as Redis).
    pub entries: u64,
    /// Bytes held (same caveat).
    pub bytes: u64,
    /// Blobs evicted to stay within the byte budget.
    pub evictions: u64,
    /// Blobs refused because one alone is larger than the budget.
    pub over_budget: u64,
    /// Files found invalid when the index was rebuilt, and removed.
    pub corrupt_removed: u64,
}

/// One storage level. Implementations are shared by threads. A tier stores opaque bytes
/// under a key; it never interprets them ([`crate::Tiers`] validates every blob it reads).
/// Every method may fail (a dead server, a full disk): the caller counts that and moves
/// on, so a failure must never leave a partial value readable under a key.
pub trait Tier: Send + Sync {
    /// A short name for metrics (`memory`, `disk`, `redis`).
    fn name(&self) -> &'static str;
    /// For each key, whether the tier holds a value (it may still fail validation).
    fn contains(&self, keys: &[ChunkKey]) -> Result<Vec<bool>>;
    /// For each key, its value if held.
    fn get(&self, keys: &[ChunkKey]) -> Result<Vec<Option<Blob>>>;
    /// Stores each value under its key, replacing any value there; all or a prefix of
    /// the items may be stored when it fails.
    fn put(&self, items: &[(ChunkKey, Blob)]) -> Result<()>;
    /// Removes a key's value (one that failed validation).
    fn remove(&self, key: &ChunkKey) -> Result<()>;
    /// The tier's own counters.
    fn stats(&self) -> TierStats {
        TierStats::default()
    }
}

/// A shared tier is a tier: the caller can keep a handle (for its stats, or to inspect it)
/// while a [`crate::Tiers`] uses it.
impl<T: Tier + ?Sized> Tier for Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn contains(&self, keys: &[ChunkKey]) -> Result<Vec<bool>> {
        (**self).contains(keys)
    }
    fn get(&self, keys: &[ChunkKey]) -> Result<Vec<Option<Blob>>> {
        (**self).get(keys)
    }
    fn put(&self, items: &[(ChunkKey, Blob)]) -> Result<()> {
        (**self).put(items)
    }
    fn remove(&self, key: &ChunkKey) -> Result<()> {
        (**self).remove(key)
    }
    fn stats(&self) -> TierStats {
        (**self).stats()
    }
}

/// Least-recently-used bookkeeping under a byte budget, shared by the memory and disk
/// tiers: keys with their sizes, ordered by last use.
#[derive(Default)]
pub(crate) struct LruIndex {
    entries: HashMap<ChunkKey, (u64, u64)>,
    order: BTreeMap<u64, ChunkKey>,
    tick: u64,
    pub(crate) bytes: u64,
}

impl LruIndex {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn contains(&self, key: &ChunkKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Marks `key` used now; false if absent.
    pub(crate) fn touch(&mut self, key: &ChunkKey) -> bool {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(key) {
            Some(e) => {
                self.order.remove(&e.1);
                e.1 = tick;
                self.order.insert(tick, *key);
                true
            }
            None => false,
        }
    }

    /// Inserts or replaces `key` with `size` bytes, most recently used.
    pub(crate) fn insert(&mut self, key: ChunkKey, size: u64) {
        self.remove(&key);
        self.tick += 1;
        self.entries.insert(key, (size, self.tick));
        self.order.insert(self.tick, key);
        self.bytes += size;
    }

    /// Removes `key`; its size if it was there.
    pub(crate) fn remove(&mut self, key: &ChunkKey) -> Option<u64> {
        let (size, tick) = self.entries.remove(key)?;
        self.order.remove(&tick);
        self.bytes -= size;
        Some(size)
    }

    /// The least recently used key.
    pub(crate) fn oldest(&self) -> Option<ChunkKey> {
        self.order.values().next().copied()
    }
}

/// The memory tier: an in-process LRU of blobs under a byte budget.
pub struct MemoryTier {
    budget: u64,
    inner: Mutex<MemoryInner>,
}

#[derive(Default)]
struct MemoryInner {
    index: LruIndex,
    values: HashMap<ChunkKey, Blob>,
    evictions: u64,
    over_budget: u64,
}

impl MemoryTier {
    /// A memory tier that holds at most `budget_bytes` of blobs.
    pub fn new(budget_bytes: u64) -> MemoryTier {
        MemoryTier {
            budget: budget_bytes,
            inner: Mutex::new(MemoryInner::default()),
        }
    }
}

impl Tier for MemoryTier {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn contains(&self, keys: &[ChunkKey]) -> Result<Vec<bool>> {
        let g = self.inner.lock();
        Ok(keys.iter().map(|k| g.index.contains(k)).collect())
    }

    fn get(&self, keys: &[ChunkKey]) -> Result<Vec<Option<Blob>>> {
        let mut g = self.inner.lock();
        Ok(keys
            .iter()
            .map(|k| {
                g.index.touch(k);
                g.values.get(k).cloned()
            })
            .collect())
    }

    fn put(&self, items: &[(ChunkKey, Blob)]) -> Result<()> {
        let mut g = self.inner.lock();
        for (key, blob) in items {
            let size = blob.len() as u64;
            if size > self.budget {
                g.over_budget += 1;
                continue;
            }
            if g.index.remove(key).is_some() {
                g.values.remove(key);
            }
            while g.index.bytes + size > self.budget {
                let Some(old) = g.index.oldest() else { break };
                g.index.remove(&old);
                g.values.remove(&old);
                g.evictions += 1;
            }
            g.index.insert(*key, size);
            g.values.insert(*key, blob.clone());
        }
        Ok(())
    }

    fn remove(&self, key: &ChunkKey) -> Result<()> {
        let mut g = self.inner.lock();
        g.index.remove(key);
        g.values.remove(key);
        Ok(())
    }

    fn stats(&self) -> TierStats {
        let g = self.inner.lock();
        TierStats {
            entries: g.index.len() as u64,
            bytes: g.index.bytes,
            evictions: g.evictions,
            over_budget: g.over_budget,
            corrupt_removed: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> ChunkKey {
        ChunkKey([i; 32])
    }

    #[test]
    fn memory_lru_keeps_the_budget_and_recent_keys() {
        let t = MemoryTier::new(300);
        let b = |n: usize, v: u8| Arc::new(vec![v; n]);
        t.put(&[
            (key(1), b(100, 1)),
            (key(2), b(100, 2)),
            (key(3), b(100, 3)),
        ])
        .unwrap();
        // Use 1, then add 4: 2 is the least recently used and goes.
        assert!(t.get(&[key(1)]).unwrap()[0].is_some());
        t.put(&[(key(4), b(100, 4))]).unwrap();
        assert_eq!(
            t.contains(&[key(1), key(2), key(3), key(4)]).unwrap(),
            [true, false, true, true]
        );
        let s = t.stats();
        assert_eq!((s.entries, s.bytes, s.evictions), (3, 300, 1));
        // Larger than the whole budget: refused, nothing evicted.
        t.put(&[(key(5), b(301, 5))]).unwrap();
        assert_eq!(t.stats().over_budget, 1);
        assert_eq!(t.stats().entries, 3);
        assert_eq!(
            t.get(&[key(4)]).unwrap()[0].as_deref(),
            Some(&vec![4u8; 100])
        );
        t.remove(&key(4)).unwrap();
        assert_eq!(t.get(&[key(4)]).unwrap()[0], None);
        assert_eq!(t.stats().bytes, 200);
    }
}
