//! The store: a kvc-owned paged cache, the chunk table of every layer, the worker pool and
//! the two-level decode cache.
//!
//! Chunk life: *raw* (not in the table) -> *in flight* (a task holds a copy) -> *stored*
//! (blob verified, raw pages released) <-> *resident* (restored, in both LRUs). Any
//! failure on the way turns the chunk into *fallback*: its raw bytes stay and it is not
//! tried again until they are rewritten. Writes to in-flight or stored tokens are refused.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rayon::prelude::*;

use kvc_cache::{
    compact_heads, compact_layer, Addressing, KvLayout, OwnedCache, ReservePlan, TensorLayout,
};

use crate::codec::{ChunkInfo, StoreCodec, Tensor};
use crate::config::{Mode, StoreConfig};
use crate::error::{Error, Result};
use crate::gather::{equals, gather, gather_into, scatter};
use crate::hash::{check64, fnv1a64, fnv1a64_update, FNV_OFFSET};
use crate::metrics::{quantile, Counters, StoreMetrics};
use crate::pool::Pool;

/// The decode-cache key (spec 5.3.4): a restored chunk is reused only when all six match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeKey {
    /// First token.
    pub start: usize,
    /// Tokens.
    pub count: usize,
    /// FNV-1a 64 of the bytes a restore gives back (K then V, canonical order).
    pub raw_hash: u64,
    /// FNV-1a 64 of the blobs (K then V).
    pub blob_hash: u64,
    /// Raw bytes, K + V.
    pub raw_bytes: usize,
    /// Blob bytes, K + V.
    pub compressed_bytes: usize,
}

/// A chunk's state as [`Store::chunks`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkStatus {
    /// A task is compressing it; the raw bytes are in place.
    InFlight,
    /// Held compressed, raw pages released.
    Stored,
    /// Held compressed and restored (resident, in the decode cache).
    Resident,
    /// Compression failed or was not kept (probe/full): raw bytes in place.
    Raw,
}

/// One chunk of a layer's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkView {
    /// First token.
    pub start: usize,
    /// Tokens.
    pub count: usize,
    /// State.
    pub status: ChunkStatus,
}

/// A global-LRU entry pushed out: (layer, start, residency generation).
type Victim = (usize, usize, u64);

struct Held {
    k_blob: Vec<u8>,
    v_blob: Vec<u8>,
    key: DecodeKey,
    /// [`check64`] of the bytes a restore gives back, K and V.
    checks: [u64; 2],
    /// Non-zero while restored; the generation of that residency.
    resident_gen: u64,
}

enum State {
    InFlight {
        id: u64,
    },
    Held(Box<Held>),
    /// Raw bytes kept on purpose (fallback, or probe/full verified).
    Kept,
}

struct Chunk {
    count: usize,
    state: State,
}

struct LayerState {
    cache: OwnedCache,
    len: usize,
    chunks: BTreeMap<usize, Chunk>,
    /// Resident chunks, least recently used first: (start, generation).
    lru: VecDeque<(usize, u64)>,
}

struct Job {
    layer: usize,
    start: usize,
    count: usize,
    k: Vec<u8>,
    v: Vec<u8>,
}

enum JobOutcome {
    Ok {
        k_blob: Vec<u8>,
        v_blob: Vec<u8>,
        raw_hash: u64,
        checks: [u64; 2],
        us: u64,
    },
    EncodeError,
    Mismatch,
}

struct JobResult {
    layer: usize,
    start: usize,
    count: usize,
    k: Vec<u8>,
    v: Vec<u8>,
    outcome: JobOutcome,
}

/// What one restore did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreStats {
    /// Chunks decoded.
    pub decoded: usize,
    /// Chunks already resident.
    pub hits: usize,
}

/// The asynchronous compressed store over a kvc-owned cache. All methods take `&self`;
/// the store is `Sync` and may be driven from several threads.
pub struct Store {
    config: StoreConfig,
    codec: Arc<dyn StoreCodec>,
    layouts: Vec<KvLayout>,
    layers: Vec<Mutex<LayerState>>,
    /// Resident chunks of every layer, least recently used first: (layer, start, gen).
    global: Mutex<VecDeque<(usize, usize, u64)>>,
    pool: Option<Pool<Job, JobResult>>,
    /// Task id -> (layer, start, raw bytes) for tasks in flight.
    inflight: Mutex<HashMap<u64, (usize, usize, usize)>>,
    next_id: AtomicU64,
    next_gen: AtomicU64,
    counters: Arc<Counters>,
}

fn chunk_info(layout: &KvLayout, layer: usize, t: Tensor, start: usize, count: usize) -> ChunkInfo {
    let l = match t {
        Tensor::K => &layout.k,
        Tensor::V => &layout.v,
    };
    ChunkInfo {
        layer,
        tensor: t,
        dtype: l.dtype(),
        n_heads: l.n_heads(),
        head_dim: l.head_dim(),
        start,
        count,
    }
}

/// Compress, decode, compare: the work of one task, in a worker or synchronously.
fn compress_verify(
    codec: &dyn StoreCodec,
    layout: &KvLayout,
    layer: usize,
    start: usize,
    count: usize,
    k: &[u8],
    v: &[u8],
) -> JobOutcome {
    let t0 = Instant::now();
    let mut blobs = [Vec::new(), Vec::new()];
    let mut raw_hash = FNV_OFFSET;
    let mut checks = [0u64; 2];
    for (i, (t, raw)) in [(Tensor::K, k), (Tensor::V, v)].into_iter().enumerate() {
        let info = chunk_info(layout, layer, t, start, count);
        if codec.encode(&info, raw, &mut blobs[i]).is_err() {
            return JobOutcome::EncodeError;
        }
        let mut decoded = vec![0u8; raw.len()];
        if codec.decode(&info, &blobs[i], &mut decoded).is_err() {
            return JobOutcome::Mismatch;
        }
        let same = if codec.is_lossless() {
            decoded == raw
        } else {
            let mut r = Vec::new();
            if codec.reference(&info, raw, &mut r).is_err() {
                return JobOutcome::EncodeError;
            }
            decoded == r
        };
        if !same {
            return JobOutcome::Mismatch;
        }
        raw_hash = fnv1a64_update(raw_hash, &decoded);
        checks[i] = check64(&decoded);
        blobs[i].shrink_to_fit();
    }
    let [k_blob, v_blob] = blobs;
    JobOutcome::Ok {
        k_blob,
        v_blob,
        raw_hash,
        checks,
        us: t0.elapsed().as_micros() as u64,
    }
}

impl Store {
    /// A store over a new kvc-owned cache with one layer per layout.
    pub fn new(
        config: StoreConfig,
        layouts: &[KvLayout],
        codec: Arc<dyn StoreCodec>,
    ) -> Result<Store> {
        config.validate()?;
        if layouts.is_empty() {
            return Err(Error::InvalidConfig {
                field: "layers",
                value: 0,
                reason: "the store needs at least one layer",
            });
        }
        let layers = layouts
            .iter()
            .map(|l| {
                Ok(Mutex::new(LayerState {
                    cache: OwnedCache::new(std::slice::from_ref(l))?,
                    len: 0,
                    chunks: BTreeMap::new(),
                    lru: VecDeque::new(),
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let counters = Arc::new(Counters::default());
        let pool = if config.mode == Mode::Store {
            let (c, ls) = (codec.clone(), layouts.to_vec());
            let handler = Arc::new(move |j: Job| {
                let outcome = compress_verify(
                    c.as_ref(),
                    &ls[j.layer],
                    j.layer,
                    j.start,
                    j.count,
                    &j.k,
                    &j.v,
                );
                JobResult {
                    layer: j.layer,
                    start: j.start,
                    count: j.count,
                    k: j.k,
                    v: j.v,
                    outcome,
                }
            });
            Some(Pool::new(
                config.async_threads,
                config.queue_capacity,
                handler,
            )?)
        } else {
            None
        };
        Ok(Store {
            config,
            codec,
            layouts: layouts.to_vec(),
            layers,
            global: Mutex::new(VecDeque::new()),
            pool,
            inflight: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            next_gen: AtomicU64::new(1),
            counters,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The codec.
    pub fn codec(&self) -> &Arc<dyn StoreCodec> {
        &self.codec
    }

    /// Layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    fn layer(&self, layer: usize) -> Result<&Mutex<LayerState>> {
        self.layers.get(layer).ok_or(Error::LayerOutOfRange {
            layer,
            layers: self.layers.len(),
        })
    }

    /// Layer `layer`'s layout.
    pub fn layout(&self, layer: usize) -> Result<KvLayout> {
        self.layer(layer)?;
        Ok(self.layouts[layer])
    }

    /// Tokens written to layer `layer`.
    pub fn len(&self, layer: usize) -> Result<usize> {
        Ok(self.layer(layer)?.lock().len)
    }

    /// Writes `count` tokens at `start` (canonical order: token-major rows of channels),
    /// `start <= len`. Refused with [`Error::RangeBusy`] where the store holds tokens;
    /// a fallback chunk that is rewritten becomes eligible again.
    pub fn write_tokens(&self, layer: usize, start: usize, k: &[u8], v: &[u8]) -> Result<()> {
        let layout = self.layout(layer)?;
        let krow = layout.k.channels() * layout.k.dtype().size();
        let vrow = layout.v.channels() * layout.v.dtype().size();
        let count = k.len() / krow;
        if k.len() != count * krow {
            return Err(Error::WrongLength {
                tensor: "K",
                expected: count * krow,
                found: k.len(),
            });
        }
        if v.len() != count * vrow {
            return Err(Error::WrongLength {
                tensor: "V",
                expected: count * vrow,
                found: v.len(),
            });
        }
        let mut st = self.layer(layer)?.lock();
        let end = start.saturating_add(count);
        if start > st.len || end > layout.capacity() {
            return Err(Error::InvalidRange {
                layer,
                start,
                end,
                limit: st.len.min(layout.capacity()),
            });
        }
        let mut kept = Vec::new();
        for (&s, c) in overlapping(&st.chunks, start, end) {
            match c.state {
                State::Kept => kept.push(s),
                _ => {
                    return Err(Error::RangeBusy {
                        layer,
                        start: s,
                        count: c.count,
                    })
                }
            }
        }
        for s in kept {
            st.chunks.remove(&s);
        }
        let mut lm = st.cache.layer_mut(0)?;
        let (kb, vb) = lm.kv_mut();
        scatter(kb, &layout.k, start, count, k);
        scatter(vb, &layout.v, start, count, v);
        st.len = st.len.max(end);
        Ok(())
    }

    /// Writes `count` tokens at the end of layer `layer`; returns the new length.
    pub fn append_tokens(&self, layer: usize, k: &[u8], v: &[u8]) -> Result<usize> {
        let len = self.len(layer)?;
        self.write_tokens(layer, len, k, v)?;
        self.len(layer)
    }

    /// Compresses what the mode and scope call for in layer `layer`, given its length:
    /// store mode submits every new cold chunk to the pool (never blocking), probe and
    /// full modes process them synchronously. Returns the chunks handled. Safe to call
    /// from several threads at once: a chunk claimed concurrently is skipped.
    pub fn schedule(&self, layer: usize) -> Result<usize> {
        self.layer(layer)?;
        if !self.config.in_scope(layer) {
            return Ok(0);
        }
        if self.config.mode == Mode::Probe && !self.is_probe_layer(layer) {
            return Ok(0);
        }
        let len = self.len(layer)?;
        let mut n = 0;
        for (s, c) in self.config.cold_chunks(len) {
            let known = self.layer(layer)?.lock().chunks.contains_key(&s);
            if known {
                continue;
            }
            // Another thread may have claimed an overlapping range between the check
            // above and this call: that chunk is already handled, not an error.
            match self.compress_chunk(layer, s, c) {
                Ok(queued) => n += usize::from(queued),
                Err(Error::RangeBusy { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn is_probe_layer(&self, layer: usize) -> bool {
        let c = &self.config;
        let front = c.front_n > 0 && layer == 0;
        let h2o = layer == c.h2o_layer_start;
        match c.scope {
            crate::config::Scope::FrontN => front,
            crate::config::Scope::H2oKept => h2o,
            crate::config::Scope::Both => front || h2o,
        }
    }

    /// Compresses tokens `[start, start + count)` of layer `layer` as one chunk, whatever
    /// the scope: in store mode a task is queued (`false` when the queue is full: a
    /// backpressure skip); in probe/full modes it is done now. The range must be written
    /// and overlap no chunk.
    pub fn compress_chunk(&self, layer: usize, start: usize, count: usize) -> Result<bool> {
        let layout = self.layout(layer)?;
        let mut st = self.layer(layer)?.lock();
        let end = start.saturating_add(count);
        if count == 0 || end > st.len {
            return Err(Error::InvalidRange {
                layer,
                start,
                end,
                limit: st.len,
            });
        }
        if let Some((&s, c)) = overlapping(&st.chunks, start, end).next() {
            return Err(Error::RangeBusy {
                layer,
                start: s,
                count: c.count,
            });
        }
        let (kb, vb) = st
            .cache
            .layer(0)
            .ok_or(Error::LayerOutOfRange { layer, layers: 0 })?;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        gather(kb, &layout.k, start, count, &mut k);
        gather(vb, &layout.v, start, count, &mut v);
        let Some(pool) = &self.pool else {
            // probe / full: synchronously, in this thread.
            let out = compress_verify(self.codec.as_ref(), &layout, layer, start, count, &k, &v);
            Counters::add(&self.counters.verified_sync, 1);
            match out {
                JobOutcome::Ok {
                    k_blob,
                    v_blob,
                    raw_hash: _,
                    checks: _,
                    us,
                } => {
                    Counters::add(&self.counters.compress_us, us);
                    Counters::add(
                        &self.counters.compressed_raw_bytes,
                        (k.len() + v.len()) as u64,
                    );
                    Counters::add(
                        &self.counters.compressed_blob_bytes,
                        (k_blob.len() + v_blob.len()) as u64,
                    );
                    if self.config.mode == Mode::Full {
                        // Write back what decoding gives (identical bytes for a lossless
                        // codec; the dequantized values for a lossy one).
                        let (mut dk, mut dv) = (vec![0u8; k.len()], vec![0u8; v.len()]);
                        let ik = chunk_info(&layout, layer, Tensor::K, start, count);
                        let iv = chunk_info(&layout, layer, Tensor::V, start, count);
                        self.codec.decode(&ik, &k_blob, &mut dk)?;
                        self.codec.decode(&iv, &v_blob, &mut dv)?;
                        let mut lm = st.cache.layer_mut(0)?;
                        let (kb, vb) = lm.kv_mut();
                        scatter(kb, &layout.k, start, count, &dk);
                        scatter(vb, &layout.v, start, count, &dv);
                    }
                }
                JobOutcome::EncodeError => Counters::add(&self.counters.fallback_encode, 1),
                JobOutcome::Mismatch => Counters::add(&self.counters.fallback_verify, 1),
            }
            st.chunks.insert(
                start,
                Chunk {
                    count,
                    state: State::Kept,
                },
            );
            return Ok(true);
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let bytes = k.len() + v.len();
        // Register before submitting so that a fast worker's result finds its record.
        self.inflight.lock().insert(id, (layer, start, bytes));
        st.chunks.insert(
            start,
            Chunk {
                count,
                state: State::InFlight { id },
            },
        );
        let job = Job {
            layer,
            start,
            count,
            k,
            v,
        };
        match pool.try_submit(id, job) {
            Ok(Ok(())) => {
                Counters::add(&self.counters.submitted, 1);
                Ok(true)
            }
            other => {
                st.chunks.remove(&start);
                self.inflight.lock().remove(&id);
                other?.ok();
                Counters::add(&self.counters.backpressure_skips, 1);
                Ok(false)
            }
        }
    }

    /// Takes in every finished task without blocking: verified chunks release their raw
    /// pages, failed ones become counted fallbacks. Returns the results handled.
    pub fn poll(&self) -> Result<usize> {
        let Some(pool) = &self.pool else {
            return Ok(0);
        };
        let mut n = 0;
        while let Some(done) = pool.try_done() {
            self.finish(done)?;
            n += 1;
        }
        Ok(n)
    }

    /// Blocks until no task is in flight, taking in every result (the caller asked to
    /// wait). The time spent is counted as async wait.
    pub fn wait_idle(&self) -> Result<()> {
        let Some(pool) = &self.pool else {
            return Ok(());
        };
        let t0 = Instant::now();
        self.poll()?;
        while !self.inflight.lock().is_empty() {
            let done = pool.wait_done()?;
            self.finish(done)?;
        }
        Counters::add(
            &self.counters.async_wait_us,
            t0.elapsed().as_micros() as u64,
        );
        Ok(())
    }

    fn finish(&self, (id, out): (u64, std::result::Result<JobResult, String>)) -> Result<()> {
        let Some((layer, start, _)) = self.inflight.lock().remove(&id) else {
            // Abandoned by `materialize`, which counted it stale.
            return Ok(());
        };
        let layout = self.layouts[layer];
        let mut st = self.layers[layer].lock();
        let current = matches!(
            st.chunks.get(&start),
            Some(Chunk { state: State::InFlight { id: i }, .. }) if *i == id
        );
        if !current {
            Counters::add(&self.counters.stale, 1);
            return Ok(());
        }
        let r = match out {
            Ok(r) => r,
            Err(_) => {
                Counters::add(&self.counters.fallback_panic, 1);
                set_kept(&mut st, start);
                return Ok(());
            }
        };
        debug_assert_eq!((r.layer, r.start), (layer, start));
        match r.outcome {
            JobOutcome::EncodeError => {
                Counters::add(&self.counters.fallback_encode, 1);
                set_kept(&mut st, start);
            }
            JobOutcome::Mismatch => {
                Counters::add(&self.counters.fallback_verify, 1);
                set_kept(&mut st, start);
            }
            JobOutcome::Ok {
                k_blob,
                v_blob,
                raw_hash,
                checks,
                us,
            } => {
                Counters::add(&self.counters.compress_us, us);
                let (kb, vb) = st
                    .cache
                    .layer(0)
                    .ok_or(Error::LayerOutOfRange { layer, layers: 0 })?;
                let unchanged = equals(kb, &layout.k, start, r.count, &r.k)
                    && equals(vb, &layout.v, start, r.count, &r.v);
                if !unchanged {
                    Counters::add(&self.counters.fallback_raw_changed, 1);
                    set_kept(&mut st, start);
                    return Ok(());
                }
                let raw_bytes = r.k.len() + r.v.len();
                let compressed_bytes = k_blob.len() + v_blob.len();
                let key = DecodeKey {
                    start,
                    count: r.count,
                    raw_hash,
                    blob_hash: fnv1a64_update(fnv1a64(&k_blob), &v_blob),
                    raw_bytes,
                    compressed_bytes,
                };
                Counters::add(&self.counters.compressed_raw_bytes, raw_bytes as u64);
                Counters::add(
                    &self.counters.compressed_blob_bytes,
                    compressed_bytes as u64,
                );
                Counters::add(&self.counters.stored, 1);
                if let Some(c) = st.chunks.get_mut(&start) {
                    c.state = State::Held(Box::new(Held {
                        k_blob,
                        v_blob,
                        key,
                        checks,
                        resident_gen: 0,
                    }));
                }
                let freed = release_merged(&mut st, start)?;
                Counters::add(&self.counters.released_bytes, freed as u64);
            }
        }
        Ok(())
    }

    /// Makes every stored chunk of layer `layer` resident (decoding the misses in
    /// parallel, K and V of a chunk too), runs `f` on the layer's K and V bytes (engine
    /// layout) with nothing evicted meanwhile, then releases the layer's restored chunks
    /// ([`StoreConfig::evict_after_attention`]) or applies the global LRU. This is
    /// "restore before the layer's attention".
    pub fn with_layer<R>(
        &self,
        layer: usize,
        f: impl FnOnce(&[u8], &[u8]) -> R,
    ) -> Result<(R, RestoreStats)> {
        let layout = self.layout(layer)?;
        let (r, stats, victims) = {
            let mut st = self.layer(layer)?.lock();
            let restored = self.restore_locked(layer, &layout, &mut st, 0);
            let (stats, victims) = match restored {
                Ok(x) => x,
                Err(e) => {
                    drop(st);
                    if self.config.evict_after_attention {
                        // What did restore goes back too: the attention will not run.
                        self.evict_decoded(Some(layer))?;
                    }
                    return Err(e);
                }
            };
            let (kb, vb) = st
                .cache
                .layer(0)
                .ok_or(Error::LayerOutOfRange { layer, layers: 0 })?;
            (f(kb, vb), stats, victims)
        };
        self.evict_victims(victims)?;
        if self.config.evict_after_attention {
            self.evict_decoded(Some(layer))?;
        }
        Ok((r, stats))
    }

    /// Restores layer `layer` ahead of its attention (a prefetch, for example while the
    /// previous layer attends): its chunks stay resident, bounded by the LRUs, until the
    /// layer's next attention ([`Store::with_layer`]) or [`Store::evict_decoded`].
    pub fn restore_layer(&self, layer: usize) -> Result<RestoreStats> {
        let layout = self.layout(layer)?;
        let (stats, victims) = {
            let mut st = self.layer(layer)?.lock();
            self.restore_locked(layer, &layout, &mut st, 0)?
        };
        self.evict_victims(victims)?;
        Ok(stats)
    }

    /// Tokens `[start, end)` of layer `layer` in canonical order, restoring as needed.
    pub fn read_tokens(
        &self,
        layer: usize,
        start: usize,
        end: usize,
    ) -> Result<(Vec<u8>, Vec<u8>)> {
        let layout = self.layout(layer)?;
        let len = self.len(layer)?;
        if start > end || end > len {
            return Err(Error::InvalidRange {
                layer,
                start,
                end,
                limit: len,
            });
        }
        let (r, _) = self.with_layer(layer, |kb, vb| {
            let (mut k, mut v) = (Vec::new(), Vec::new());
            gather(kb, &layout.k, start, end - start, &mut k);
            gather(vb, &layout.v, start, end - start, &mut v);
            (k, v)
        })?;
        Ok(r)
    }

    /// Bytes of tokens `[start, end)` of layer `layer` in canonical order: (K, V).
    pub fn token_bytes(&self, layer: usize, start: usize, end: usize) -> Result<(usize, usize)> {
        let layout = self.layout(layer)?;
        let n = end.checked_sub(start).ok_or(Error::InvalidRange {
            layer,
            start,
            end,
            limit: layout.capacity(),
        })?;
        let bytes = |t: &TensorLayout| {
            n.checked_mul(t.channels() * t.dtype().size())
                .ok_or(Error::InvalidRange {
                    layer,
                    start,
                    end,
                    limit: layout.capacity(),
                })
        };
        Ok((bytes(&layout.k)?, bytes(&layout.v)?))
    }

    /// [`Store::read_tokens`] into caller buffers of exactly
    /// [`Store::token_bytes`] bytes each (no allocation besides restoring).
    pub fn read_tokens_into(
        &self,
        layer: usize,
        start: usize,
        end: usize,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<()> {
        let layout = self.layout(layer)?;
        let len = self.len(layer)?;
        if start > end || end > len {
            return Err(Error::InvalidRange {
                layer,
                start,
                end,
                limit: len,
            });
        }
        let (kn, vn) = self.token_bytes(layer, start, end)?;
        if k.len() != kn {
            return Err(Error::WrongLength {
                tensor: "K",
                expected: kn,
                found: k.len(),
            });
        }
        if v.len() != vn {
            return Err(Error::WrongLength {
                tensor: "V",
                expected: vn,
                found: v.len(),
            });
        }
        self.with_layer(layer, |kb, vb| {
            gather_into(kb, &layout.k, start, end - start, k);
            gather_into(vb, &layout.v, start, end - start, v);
        })?;
        Ok(())
    }

    /// Restores the held chunks of a locked layer that reach token `from` or beyond.
    fn restore_locked(
        &self,
        layer: usize,
        layout: &KvLayout,
        st: &mut LayerState,
        from: usize,
    ) -> Result<(RestoreStats, Vec<Victim>)> {
        let mut stats = RestoreStats::default();
        let mut touched = Vec::new();
        let LayerState { cache, chunks, .. } = &mut *st;
        let mut todo: Vec<(usize, usize, &Held)> = Vec::new();
        for (&s, c) in chunks.iter().filter(|(&s, c)| s + c.count > from) {
            if let State::Held(h) = &c.state {
                if h.resident_gen != 0 {
                    stats.hits += 1;
                    touched.push((s, h.resident_gen));
                } else {
                    todo.push((s, c.count, h.as_ref()));
                }
            }
        }
        Counters::add(&self.counters.hits, stats.hits as u64);
        Counters::add(&self.counters.misses, todo.len() as u64);
        let mut failed = Vec::new();
        let mut first_err = None;
        if !todo.is_empty() {
            let ranges: Vec<(usize, usize)> = todo.iter().map(|&(s, n, _)| (s, s + n)).collect();
            let mut lm = cache.layer_mut(0)?;
            let (kb, vb) = lm.kv_mut();
            let k_dest = destinations(kb, &layout.k, &ranges, layer)?;
            let v_dest = destinations(vb, &layout.v, &ranges, layer)?;
            // One task per tensor of each chunk, decoded straight into the cache where
            // the layout keeps a chunk contiguous.
            let mut tasks: Vec<RestoreTask<'_>> = Vec::with_capacity(2 * todo.len());
            for (i, (kd, vd)) in k_dest.into_iter().zip(v_dest).enumerate() {
                let (s, count, h) = todo[i];
                for (t, dest, blob, check) in [
                    (Tensor::K, kd, &h.k_blob, h.checks[0]),
                    (Tensor::V, vd, &h.v_blob, h.checks[1]),
                ] {
                    tasks.push(RestoreTask {
                        chunk: i,
                        info: chunk_info(layout, layer, t, s, count),
                        blob,
                        check,
                        dest,
                        outcome: None,
                        began: None,
                        ended: None,
                    });
                }
            }
            let codec = self.codec.as_ref();
            let verify = self.config.verify_restore;
            tasks.par_iter_mut().for_each(|t| t.run(codec, verify));
            // (chunk, scratch K, scratch V, microseconds from the first task's start to
            // the last one's end, microseconds of work) of every chunk decoded.
            let mut done = Vec::with_capacity(todo.len());
            for (i, pair) in tasks.chunks_exact_mut(2).enumerate() {
                let s = todo[i].0;
                let mut err = None;
                for t in pair.iter_mut() {
                    if let Some(Err(e)) = t.outcome.take() {
                        err.get_or_insert(e);
                    }
                }
                if let Some(e) = err {
                    Counters::add(&self.counters.restore_failures, 1);
                    failed.push(s);
                    first_err.get_or_insert(e);
                    continue;
                }
                let (mut began, mut ended, mut busy) = (None::<Instant>, None::<Instant>, 0u64);
                for t in pair.iter() {
                    if let (Some(b), Some(e)) = (t.began, t.ended) {
                        began = Some(began.map_or(b, |x| x.min(b)));
                        ended = Some(ended.map_or(e, |x| x.max(e)));
                        busy += e.duration_since(b).as_micros() as u64;
                    }
                }
                let wall = match (began, ended) {
                    (Some(b), Some(e)) => e.duration_since(b).as_micros() as u64,
                    _ => 0,
                };
                let mut scratch = pair.iter_mut().map(|t| match &mut t.dest {
                    Dest::Scratch(v) => Some(std::mem::take(v)),
                    Dest::Direct(_) => None,
                });
                let (sk, sv) = (scratch.next().flatten(), scratch.next().flatten());
                done.push((i, sk, sv, wall, busy));
            }
            drop(tasks);
            for (i, sk, sv, wall, busy) in done {
                let (s, count, _) = todo[i];
                let t0 = Instant::now();
                if let Some(k) = sk {
                    scatter(kb, &layout.k, s, count, &k);
                }
                if let Some(v) = sv {
                    scatter(vb, &layout.v, s, count, &v);
                }
                let wall = wall + t0.elapsed().as_micros() as u64;
                Counters::add(&self.counters.decomp_us, busy);
                Counters::add(&self.counters.restores, 1);
                self.counters.restore_sample(count, wall);
                stats.decoded += 1;
                touched.push((s, 0));
            }
        }
        // Generations are set after the borrows of the blobs end.
        for e in touched.iter_mut().filter(|e| e.1 == 0) {
            let gen = self.next_gen.fetch_add(1, Ordering::Relaxed);
            if let Some(Chunk {
                state: State::Held(h),
                ..
            }) = st.chunks.get_mut(&e.0)
            {
                h.resident_gen = gen;
            }
            e.1 = gen;
        }
        // A failed chunk may have been partly written: its pages go back to the OS.
        for s in failed {
            let freed = release_merged(st, s)?;
            Counters::add(&self.counters.released_bytes, freed as u64);
        }
        let mut victims = Vec::new();
        // Per-layer LRU: touched chunks move to the back; beyond capacity, the least
        // recently used are released (not the ones this restore needs).
        st.lru.retain(|e| !touched.iter().any(|t| t.0 == e.0));
        st.lru.extend(touched.iter().copied());
        let keep = self.config.layer_cache_capacity.max(touched.len());
        while st.lru.len() > keep {
            if let Some((s, gen)) = st.lru.pop_front() {
                let freed = evict_resident(st, s, gen)?;
                Counters::add(&self.counters.released_bytes, freed as u64);
            }
        }
        {
            let mut g = self.global.lock();
            g.retain(|e| !(e.0 == layer && touched.iter().any(|t| t.0 == e.1)));
            g.extend(touched.iter().map(|&(s, gen)| (layer, s, gen)));
            // After a failure nothing is popped: victims can only be released once this
            // layer's lock is dropped, and the caller gets no victims with an error. The
            // next restore trims the global LRU.
            while first_err.is_none() && g.len() > self.config.global_cache_capacity {
                if let Some(v) = g.pop_front() {
                    victims.push(v);
                }
            }
        }
        if let Some(e) = first_err {
            // The layer cannot be read whole; what was restored stays resident.
            return Err(e);
        }
        Ok((stats, victims))
    }

    fn evict_victims(&self, victims: Vec<(usize, usize, u64)>) -> Result<()> {
        for (layer, s, gen) in victims {
            let mut st = self.layers[layer].lock();
            st.lru.retain(|e| *e != (s, gen));
            let freed = evict_resident(&mut st, s, gen)?;
            Counters::add(&self.counters.released_bytes, freed as u64);
        }
        Ok(())
    }

    /// Releases every restored chunk of `layer` (or of every layer): the decode cache is
    /// emptied and the raw pages go back to the OS. Returns the chunks released.
    pub fn evict_decoded(&self, layer: Option<usize>) -> Result<usize> {
        let layers: Vec<usize> = match layer {
            Some(l) => {
                self.layer(l)?;
                vec![l]
            }
            None => (0..self.layers.len()).collect(),
        };
        let mut n = 0;
        for l in layers {
            let mut st = self.layers[l].lock();
            let entries: Vec<_> = st.lru.drain(..).collect();
            for (s, gen) in entries {
                let freed = evict_resident(&mut st, s, gen)?;
                n += usize::from(freed > 0 || gen != 0);
                Counters::add(&self.counters.released_bytes, freed as u64);
            }
            drop(st);
            self.global.lock().retain(|e| e.0 != l);
        }
        Ok(n)
    }

    /// Turns layer `layer` back into plain raw tokens: restores every stored chunk,
    /// drops the blobs, forgets fallbacks and abandons tasks in flight (their results
    /// are counted stale). Afterwards every token is writable.
    pub fn materialize(&self, layer: usize) -> Result<()> {
        let layout = self.layout(layer)?;
        let victims = {
            let mut st = self.layer(layer)?.lock();
            self.materialize_locked(layer, &layout, &mut st, 0)?
        };
        self.evict_victims(victims)
    }

    /// Materializes the chunks of a locked layer that reach token `from` or beyond;
    /// chunks wholly before `from` keep their state. Returns global-LRU victims to
    /// release once the lock is dropped.
    fn materialize_locked(
        &self,
        layer: usize,
        layout: &KvLayout,
        st: &mut LayerState,
        from: usize,
    ) -> Result<Vec<Victim>> {
        let (_, victims) = self.restore_locked(layer, layout, st, from)?;
        let gone: Vec<(usize, Option<u64>)> = st
            .chunks
            .range(..)
            .filter(|(&s, c)| s + c.count > from)
            .map(|(&s, c)| {
                let id = match c.state {
                    State::InFlight { id } => Some(id),
                    _ => None,
                };
                (s, id)
            })
            .collect();
        {
            let mut inf = self.inflight.lock();
            for id in gone.iter().filter_map(|g| g.1) {
                // A result already taken out by `finish` (waiting for this lock) is
                // counted stale there.
                if inf.remove(&id).is_some() {
                    Counters::add(&self.counters.stale, 1);
                }
            }
        }
        for (s, _) in &gone {
            st.chunks.remove(s);
        }
        st.lru
            .retain(|e| e.0 < from && st.chunks.contains_key(&e.0));
        let chunks = &st.chunks;
        self.global
            .lock()
            .retain(|e| e.0 != layer || chunks.contains_key(&e.1));
        Ok(victims)
    }

    /// H2O eviction on a stored layer: compacts it in place by `plan` (kvc-cache) and
    /// sets its length to the tokens kept; returns the new length. Chunks wholly before
    /// the first token the plan moves or drops stay stored (or in flight); the others are
    /// restored and dropped first, and the new cold range is compressed by the next
    /// [`Store::schedule`].
    pub fn compact(&self, layer: usize, plan: &ReservePlan) -> Result<usize> {
        self.compact_by(layer, std::slice::from_ref(plan), false)
    }

    /// Applies a kvc-h2o plan (the tokens an H2O policy keeps, from
    /// [`kvc_h2o::H2oPolicy::pending_plan`]) to layer `layer`, which must hold the plan's
    /// `kv_len` tokens: one plan for the layer, or one per KV head when the policy scores
    /// per KV head. This is how the h2o_kept scope learns its budget: what the layer
    /// keeps is what the store compresses. Returns the new length.
    pub fn apply_h2o_plan(&self, layer: usize, plan: &kvc_h2o::ReservePlan) -> Result<usize> {
        if plan.n_groups() <= 1 {
            self.compact(layer, &ReservePlan::try_from(plan)?)
        } else {
            self.compact_by(layer, &ReservePlan::from_h2o_groups(plan)?, true)
        }
    }

    fn compact_by(&self, layer: usize, plans: &[ReservePlan], per_head: bool) -> Result<usize> {
        let layout = self.layout(layer)?;
        let victims;
        let n = {
            let mut st = self.layer(layer)?.lock();
            let len = st.len;
            if let Some(p) = plans.iter().find(|p| p.len() != len) {
                return Err(Error::InvalidRange {
                    layer,
                    start: 0,
                    end: p.len(),
                    limit: len,
                });
            }
            if per_head && (plans.len() != layout.k.n_heads() || plans.len() != layout.v.n_heads())
            {
                return Err(Error::InvalidConfig {
                    field: "plans per KV head",
                    value: plans.len(),
                    reason: "must equal the layer's KV heads",
                });
            }
            // Tokens before the first one a plan moves or drops stay where they are.
            let from = plans
                .iter()
                .map(|p| match p.spans().first() {
                    Some(&(0, n)) => n,
                    _ => 0,
                })
                .min()
                .unwrap_or(0);
            victims = self.materialize_locked(layer, &layout, &mut st, from)?;
            let n = {
                let mut lm = st.cache.layer_mut(0)?;
                if per_head {
                    let (kb, vb) = lm.kv_mut();
                    let n = compact_heads(kb, &layout.k, plans)?;
                    compact_heads(vb, &layout.v, plans)?;
                    n
                } else {
                    compact_layer(&mut lm, &plans[0])?
                }
            };
            st.len = n;
            n
        };
        self.evict_victims(victims)?;
        Ok(n)
    }

    /// Layer `layer`'s chunk table, in token order.
    pub fn chunks(&self, layer: usize) -> Result<Vec<ChunkView>> {
        let st = self.layer(layer)?.lock();
        Ok(st
            .chunks
            .iter()
            .map(|(&start, c)| ChunkView {
                start,
                count: c.count,
                status: match &c.state {
                    State::InFlight { .. } => ChunkStatus::InFlight,
                    State::Held(h) if h.resident_gen != 0 => ChunkStatus::Resident,
                    State::Held(_) => ChunkStatus::Stored,
                    State::Kept => ChunkStatus::Raw,
                },
            })
            .collect())
    }

    /// The decode-cache key of the held chunk at `start`, if there is one.
    pub fn decode_key(&self, layer: usize, start: usize) -> Result<Option<DecodeKey>> {
        let st = self.layer(layer)?.lock();
        Ok(match st.chunks.get(&start) {
            Some(Chunk {
                state: State::Held(h),
                ..
            }) => Some(h.key),
            _ => None,
        })
    }

    /// Bytes of the store's cache resident in memory now (`mincore`), all layers.
    pub fn resident_bytes(&self) -> Result<usize> {
        let mut n = 0;
        for l in &self.layers {
            n += l.lock().cache.resident_bytes()?;
        }
        Ok(n)
    }

    /// Whole-model metrics now.
    pub fn metrics(&self) -> Result<StoreMetrics> {
        let c = &self.counters;
        let g = Counters::get;
        let (mut held, mut raw, mut blob, mut meta, mut resident_chunks) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut mapped, mut resident) = (0u64, 0u64);
        for l in &self.layers {
            let st = l.lock();
            mapped += st.cache.byte_len() as u64;
            resident += st.cache.resident_bytes()? as u64;
            // A BTreeMap entry: key, value and a share of its node.
            let entry = (std::mem::size_of::<usize>() + std::mem::size_of::<Chunk>() + 16) as u64;
            meta += st.chunks.len() as u64 * entry;
            meta += st.lru.len() as u64 * 16;
            for ch in st.chunks.values() {
                if let State::Held(h) = &ch.state {
                    held += 1;
                    raw += h.key.raw_bytes as u64;
                    blob += (h.k_blob.capacity() + h.v_blob.capacity()) as u64;
                    meta += std::mem::size_of::<Held>() as u64;
                    resident_chunks += u64::from(h.resident_gen != 0);
                }
            }
        }
        meta += self.global.lock().len() as u64 * 24;
        let in_flight_bytes: u64 = self.inflight.lock().values().map(|v| v.2 as u64).sum();
        let in_flight = self.inflight.lock().len() as u64;
        let samples = c.restore_us.lock().clone();
        let mut lat: Vec<u32> = samples.iter().map(|s| s.1).collect();
        let group = self.config.group_tokens.min(u32::MAX as usize) as u32;
        let mut glat: Vec<u32> = samples
            .iter()
            .filter(|s| s.0 == group)
            .map(|s| s.1)
            .collect();
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let fe = g(&c.fallback_encode);
        let fv = g(&c.fallback_verify);
        let fp = g(&c.fallback_panic);
        let fr = g(&c.fallback_raw_changed);
        Ok(StoreMetrics {
            codec: self.codec.name(),
            mode: self.config.mode.name(),
            chunks_submitted: g(&c.submitted),
            chunks_stored: g(&c.stored),
            chunks_held: held,
            chunks_verified_sync: g(&c.verified_sync),
            backpressure_skips: g(&c.backpressure_skips),
            fallbacks: fe + fv + fp + fr,
            fallback_encode_errors: fe,
            fallback_verify_mismatches: fv,
            fallback_panics: fp,
            fallback_raw_changed: fr,
            stale_results: g(&c.stale),
            in_flight,
            queue_peak: self.pool.as_ref().map_or(0, |p| p.peak() as u64),
            stored_raw_bytes: raw,
            blob_bytes: blob,
            metadata_bytes: meta,
            in_flight_bytes,
            lossless_ratio: ratio(raw, blob),
            compressed_ratio_total: ratio(g(&c.compressed_raw_bytes), g(&c.compressed_blob_bytes)),
            compress_us_total: g(&c.compress_us),
            restores: g(&c.restores),
            restore_failures: g(&c.restore_failures),
            decode_cache_hits: g(&c.hits),
            decode_cache_misses: g(&c.misses),
            decode_cache_resident: resident_chunks,
            decomp_us_total: g(&c.decomp_us),
            restore_us_p50: quantile(&mut lat, 0.5),
            restore_us_p99: quantile(&mut lat, 0.99),
            restore_us_max: quantile(&mut lat, 1.0),
            group_restores: glat.len() as u64,
            group_restore_us_p50: quantile(&mut glat, 0.5),
            group_restore_us_p99: quantile(&mut glat, 0.99),
            async_wait_us: g(&c.async_wait_us),
            released_bytes_total: g(&c.released_bytes),
            cache_mapped_bytes: mapped,
            cache_resident_bytes: resident,
        })
    }

    /// Test hook: flips one byte of the held K blob at `start`, simulating memory
    /// corruption after the store took the chunk. Returns whether a blob was there.
    #[doc(hidden)]
    pub fn corrupt_held_blob_for_test(&self, layer: usize, start: usize) -> Result<bool> {
        let mut st = self.layer(layer)?.lock();
        Ok(match st.chunks.get_mut(&start) {
            Some(Chunk {
                state: State::Held(h),
                ..
            }) if !h.k_blob.is_empty() => {
                let i = h.k_blob.len() - 1;
                h.k_blob[i] ^= 0x5a;
                true
            }
            _ => false,
        })
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Dropping the pool joins the workers; their queued results are discarded.
        self.pool = None;
    }
}

/// Chunks overlapping `[start, end)`.
fn overlapping(
    chunks: &BTreeMap<usize, Chunk>,
    start: usize,
    end: usize,
) -> impl Iterator<Item = (&usize, &Chunk)> {
    let before = chunks
        .range(..start)
        .next_back()
        .filter(move |(&s, c)| s + c.count > start);
    before.into_iter().chain(chunks.range(start..end))
}

fn set_kept(st: &mut LayerState, start: usize) {
    if let Some(c) = st.chunks.get_mut(&start) {
        c.state = State::Kept;
    }
}

fn is_released(c: &Chunk) -> bool {
    matches!(&c.state, State::Held(h) if h.resident_gen == 0)
}

/// Releases the chunk at `start` together with its released neighbours, so that pages
/// straddling two released chunks go back to the OS too. Returns the bytes that left
/// memory.
fn release_merged(st: &mut LayerState, start: usize) -> Result<usize> {
    let Some(c) = st.chunks.get(&start) else {
        return Ok(0);
    };
    let mut lo = start;
    let mut hi = start + c.count;
    while let Some((&s, p)) = st.chunks.range(..lo).next_back() {
        if s + p.count == lo && is_released(p) {
            lo = s;
        } else {
            break;
        }
    }
    while let Some(n) = st.chunks.get(&hi) {
        if is_released(n) {
            hi += n.count;
        } else {
            break;
        }
    }
    // Count what really left memory (mincore), not what madvise was asked for:
    // the merged range includes neighbours released before.
    let before = st.cache.resident_bytes()?;
    st.cache.release_tokens(0, lo, hi)?;
    Ok(before.saturating_sub(st.cache.resident_bytes()?))
}

/// Ends the residency `gen` of the chunk at `start` (if it is still that one) and
/// releases its pages. Returns bytes returned to the OS.
fn evict_resident(st: &mut LayerState, start: usize, gen: u64) -> Result<usize> {
    match st.chunks.get_mut(&start) {
        Some(Chunk {
            state: State::Held(h),
            ..
        }) if h.resident_gen == gen && gen != 0 => {
            h.resident_gen = 0;
        }
        _ => return Ok(0),
    }
    release_merged(st, start)
}

/// Where a restored tensor of a chunk is decoded to.
enum Dest<'a> {
    /// Its bytes in the cache (a row layout keeps a chunk contiguous).
    Direct(&'a mut [u8]),
    /// A buffer scattered into the cache afterwards.
    Scratch(Vec<u8>),
}

/// One tensor of one chunk to restore.
struct RestoreTask<'a> {
    chunk: usize,
    info: ChunkInfo,
    blob: &'a [u8],
    check: u64,
    dest: Dest<'a>,
    outcome: Option<Result<()>>,
    began: Option<Instant>,
    ended: Option<Instant>,
}

impl RestoreTask<'_> {
    fn run(&mut self, codec: &dyn StoreCodec, verify: bool) {
        self.began = Some(Instant::now());
        let out: &mut [u8] = match &mut self.dest {
            Dest::Direct(d) => d,
            Dest::Scratch(v) => v,
        };
        let r = codec
            .decode(&self.info, self.blob, out)
            .map_err(Error::from)
            .and_then(|()| {
                if verify && check64(out) != self.check {
                    return Err(Error::RestoreFailed {
                        layer: self.info.layer,
                        start: self.info.start,
                        reason: format!(
                        "decoded {} bytes (chunk {}) do not match the hash taken at compression",
                        self.info.tensor.name(),
                        self.chunk
                    ),
                    });
                }
                Ok(())
            });
        self.ended = Some(Instant::now());
        self.outcome = Some(r);
    }
}

/// Disjoint destinations for the ascending, disjoint token ranges `ranges` of one tensor:
/// slices of `buf` for a row layout, zeroed scratch buffers otherwise.
fn destinations<'a>(
    buf: &'a mut [u8],
    layout: &TensorLayout,
    ranges: &[(usize, usize)],
    layer: usize,
) -> Result<Vec<Dest<'a>>> {
    let row = layout.channels() * layout.dtype().size();
    let bad = |s: usize, e: usize| Error::InvalidRange {
        layer,
        start: s,
        end: e,
        limit: layout.capacity(),
    };
    if layout.addressing() != Addressing::CellRows {
        return ranges
            .iter()
            .map(|&(s, e)| {
                if s > e || e > layout.capacity() {
                    return Err(bad(s, e));
                }
                Ok(Dest::Scratch(vec![0u8; (e - s) * row]))
            })
            .collect();
    }
    let mut out = Vec::with_capacity(ranges.len());
    let mut rest = buf;
    let mut at = 0usize;
    for &(s, e) in ranges {
        let (a, b) = (s * row, e * row);
        if s > e || a < at || b - at > rest.len() {
            return Err(bad(s, e));
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(a - at);
        let (mid, tail) = tail.split_at_mut(b - a);
        out.push(Dest::Direct(mid));
        rest = tail;
        at = b;
    }
    Ok(out)
}
