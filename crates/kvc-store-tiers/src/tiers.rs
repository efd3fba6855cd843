//! [`Tiers`]: the front over an ordered list of tiers (fastest first). Lookup walks the
//! chunk keys in order and stops at the first chunk no tier holds; restore fetches with
//! fallthrough (each tier is asked only for what the tiers above it lacked), validates
//! every blob, and promotes what a lower tier had into the tiers above it; store encodes
//! once and writes through to every tier that lacks the chunk. Every tier failure is
//! counted in [`TiersMetrics`] and treated as a miss: a restore returns only chunks whose
//! blob passed every check, so a fault costs recomputation, never a wrong restore.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use crate::blob::{check_chunk, decode_checked, encode_chunk};
use crate::codec::{ChunkCodec, SectionCoder};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{chain_keys, ChunkKey, ChunkShape, Fingerprint};
use crate::prefix_file::{self, PrefixFile};
use crate::tier::{Blob, Tier, TierStats};
use kvc_transform_coder::TransformCodec;

/// What a [`Tiers`] stores: the model's layout, the chunk size, the codec and the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiersConfig {
    /// Layout and chunk size.
    pub shape: ChunkShape,
    /// Codec of stored chunks.
    pub codec: ChunkCodec,
    /// BLAKE3 of the model file (see [`crate::hash_model_file`]).
    pub model_hash: [u8; 32],
}

/// Counters of one tier as seen by the front.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierMetrics {
    /// The tier's name.
    pub name: &'static str,
    /// Chunks read from it that passed validation.
    pub hits: u64,
    /// Chunks asked of it that it did not hold.
    pub misses: u64,
    /// Operations that failed (server down, timeout, I/O error): each one a fallback.
    pub errors: u64,
    /// Blobs read from it that failed the checksum or the format checks (removed).
    pub corrupt: u64,
    /// Valid blobs of another key or model found under a key (removed).
    pub foreign: u64,
    /// Chunks written to it (stores and promotions).
    pub chunks_written: u64,
    /// Blob bytes written to it.
    pub bytes_written: u64,
    /// Blob bytes read from it.
    pub bytes_read: u64,
    /// The tier's own counters (entries, bytes, evictions).
    pub stats: TierStats,
}

/// Counters of a [`Tiers`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TiersMetrics {
    /// `lookup` calls.
    pub lookups: u64,
    /// `restore` calls.
    pub restores: u64,
    /// Chunks returned by restores.
    pub chunks_restored: u64,
    /// Chunks encoded by stores.
    pub chunks_encoded: u64,
    /// Raw (uncompressed) bytes of the chunks encoded.
    pub raw_bytes_encoded: u64,
    /// Chunks a store refused because the codec cannot encode them (kvq and a NaN or an
    /// infinity in the KV): not written anywhere.
    pub chunks_refused: u64,
    /// Blob bytes of the chunks encoded.
    pub blob_bytes_encoded: u64,
    /// Chunks copied from a lower tier into the tiers above it.
    pub promotions: u64,
    /// Failures that made an operation fall back to a lower tier or to recomputation:
    /// the sum of every tier's `errors`, `corrupt` and `foreign`.
    pub fallbacks: u64,
    /// Per tier, in order.
    pub tiers: Vec<TierMetrics>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    corrupt: AtomicU64,
    foreign: AtomicU64,
    chunks_written: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

/// Splits the first `n` chunk sections (`sec` bytes each) of every one of the `nl` layers
/// of `buf` (layer `l` at `l * layer_stride`) into, per chunk, its piece of every layer.
fn pieces(
    buf: &mut [u8],
    n: usize,
    sec: usize,
    layer_stride: usize,
    nl: usize,
) -> Vec<Vec<&mut [u8]>> {
    let mut per: Vec<Vec<&mut [u8]>> = (0..n).map(|_| Vec::with_capacity(nl)).collect();
    if n == 0 {
        return per;
    }
    for layer in buf.chunks_mut(layer_stride).take(nl) {
        for (c, piece) in layer[..n * sec].chunks_exact_mut(sec).enumerate() {
            per[c].push(piece);
        }
    }
    per
}

/// A blob that passed every check, with the tier it came from and its section lengths.
struct Checked {
    tier: usize,
    blob: Blob,
    lens: Vec<[usize; 2]>,
}

/// What became of one chunk of a restore.
enum Restore {
    /// Fetched, checked and decoded into the output.
    Done,
    /// No tier had a valid blob.
    Missing,
    /// The blob from tier `.0` passed its checks but did not decode.
    Failed(usize, Error),
}

/// A restored prefix: `tokens` tokens of K and V, each `[n_layer][tokens][n_kv_head][head_dim]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Tokens restored (a multiple of the chunk size; 0 when nothing was found).
    pub tokens: usize,
    /// Keys, layer-major.
    pub k: Vec<u8>,
    /// Values, layer-major.
    pub v: Vec<u8>,
}

/// What a [`Tiers::store`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreReport {
    /// Full chunks the tokens and KV cover.
    pub chunks: usize,
    /// Chunks encoded (the others every tier already held).
    pub chunks_encoded: usize,
    /// Blob bytes of the encoded chunks.
    pub bytes_stored: u64,
    /// Their bytes in the cache's dtype.
    pub bytes_raw: u64,
    /// Tier writes that failed (counted in the metrics too).
    pub failures: usize,
    /// Chunks refused because the codec cannot encode them (kvq and a non-finite value):
    /// not written anywhere (counted in the metrics too).
    pub chunks_refused: usize,
}

/// What [`Tiers::export_prefix`] made: a kv-prefix file (docs/formats/kv-prefix.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixExport {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// Whole chunks in the file: the leading run of the prefix's chunks that some tier
    /// held valid.
    pub chunks: usize,
    /// Tokens those chunks cover (`chunks * chunk_tokens`).
    pub tokens_covered: usize,
}

/// What [`Tiers::import_prefix`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixImport {
    /// Every token id the file carries (the prefix its writer was given).
    pub tokens: Vec<u32>,
    /// Chunks the file holds.
    pub chunks: usize,
    /// Tokens of the leading run of the file's chunks that the first tier holds after the
    /// import (`chunks * chunk_tokens` unless its byte budget could not keep them all): what
    /// a restore of `tokens` right after the import gives.
    pub tokens_covered: usize,
}

/// A kv-prefix file that passed every check for one [`Tiers`]: [`Tiers::check_prefix`]
/// makes it, [`Tiers::import_checked`] puts its blobs into the first tier. Between the two
/// a caller can look at the file (its tokens) without importing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedPrefix<'a> {
    file: PrefixFile<'a>,
}

impl<'a> CheckedPrefix<'a> {
    /// The file.
    pub fn file(&self) -> &PrefixFile<'a> {
        &self.file
    }
}

/// The front over the tiers. Shared by threads.
pub struct Tiers {
    shape: ChunkShape,
    fp: Fingerprint,
    coder: SectionCoder,
    tiers: Vec<Box<dyn Tier>>,
    counters: Vec<Counters>,
    lookups: AtomicU64,
    restores: AtomicU64,
    chunks_restored: AtomicU64,
    chunks_encoded: AtomicU64,
    raw_bytes_encoded: AtomicU64,
    chunks_refused: AtomicU64,
    blob_bytes_encoded: AtomicU64,
    promotions: AtomicU64,
}

impl Tiers {
    /// A front over `tiers` (fastest first; at least one).
    pub fn new(cfg: TiersConfig, tiers: Vec<Box<dyn Tier>>) -> Result<Tiers> {
        Tiers::build(cfg, None, tiers)
    }

    /// A front whose chunks the transform codec `tc` codes (`cfg.codec` must be
    /// [`ChunkCodec::Transform`]); the calibration must be for `cfg.shape`'s layout, and its
    /// fingerprint and bound enter every key.
    pub fn with_transform(
        cfg: TiersConfig,
        tc: Arc<TransformCodec>,
        tiers: Vec<Box<dyn Tier>>,
    ) -> Result<Tiers> {
        tc.check_layout(cfg.shape.n_layer, cfg.shape.n_kv_head, cfg.shape.head_dim)
            .map_err(|e| Error::invalid("calibration", e.to_string()))?;
        Tiers::build(cfg, Some(tc), tiers)
    }

    fn build(
        cfg: TiersConfig,
        tc: Option<Arc<TransformCodec>>,
        tiers: Vec<Box<dyn Tier>>,
    ) -> Result<Tiers> {
        cfg.shape.validate()?;
        if tiers.is_empty() {
            return Err(Error::invalid("tiers", "at least one tier is needed"));
        }
        Ok(Tiers {
            shape: cfg.shape,
            fp: match &tc {
                None => Fingerprint::new(&cfg.model_hash, &cfg.shape, &cfg.codec),
                Some(t) => {
                    Fingerprint::with_config(&cfg.model_hash, &cfg.shape, &t.config_string())
                }
            },
            coder: SectionCoder::new(cfg.codec, cfg.shape.head_dim, tc)?,
            counters: tiers.iter().map(|_| Counters::default()).collect(),
            tiers,
            lookups: AtomicU64::new(0),
            restores: AtomicU64::new(0),
            chunks_restored: AtomicU64::new(0),
            chunks_encoded: AtomicU64::new(0),
            raw_bytes_encoded: AtomicU64::new(0),
            chunks_refused: AtomicU64::new(0),
            blob_bytes_encoded: AtomicU64::new(0),
            promotions: AtomicU64::new(0),
        })
    }

    /// The layout and chunk size.
    pub fn shape(&self) -> &ChunkShape {
        &self.shape
    }

    /// The codec of stored chunks (see [`ChunkCodec::lossless`]: a kvq restore is an
    /// approximation of what was stored).
    pub fn codec(&self) -> ChunkCodec {
        self.coder.codec
    }

    /// The fingerprint every key is made with.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fp
    }

    /// The keys of the full chunks of `tokens`.
    pub fn keys(&self, tokens: &[u32]) -> Vec<ChunkKey> {
        chain_keys(&self.fp, self.shape.chunk_tokens, tokens)
    }

    /// Tokens of the longest prefix of `tokens` whose chunks some tier holds (a multiple
    /// of the chunk size). A hint: a chunk may still fail validation on restore.
    pub fn lookup(&self, tokens: &[u32]) -> usize {
        add(&self.lookups, 1);
        let keys = self.keys(tokens);
        let mut found = vec![false; keys.len()];
        for (ti, tier) in self.tiers.iter().enumerate() {
            let bound = found.iter().position(|f| !f).unwrap_or(found.len());
            let ask: Vec<usize> = (bound..keys.len()).filter(|&i| !found[i]).collect();
            if ask.is_empty() {
                break;
            }
            let ks: Vec<ChunkKey> = ask.iter().map(|&i| keys[i]).collect();
            match tier.contains(&ks) {
                Ok(has) => {
                    for (&i, h) in ask.iter().zip(has) {
                        found[i] |= h;
                    }
                }
                Err(_) => add(&self.counters[ti].errors, 1),
            }
        }
        found.iter().take_while(|&&f| f).count() * self.shape.chunk_tokens
    }

    fn check(&self, key: &ChunkKey, blob: &[u8]) -> Result<Vec<[usize; 2]>> {
        check_chunk(&self.coder, &self.shape, key, &self.fp, blob)
    }

    fn count_bad(&self, ti: usize, key: &ChunkKey, e: &Error) {
        let c = &self.counters[ti];
        if e.kind() == ErrorKind::Foreign {
            add(&c.foreign, 1);
        } else {
            add(&c.corrupt, 1);
        }
        if self.tiers[ti].remove(key).is_err() {
            add(&c.errors, 1);
        }
    }

    /// Fetches and validates the chunks of `keys` through the tiers; `None` where no tier
    /// had a valid blob.
    fn fetch(&self, keys: &[ChunkKey]) -> Vec<Option<Checked>> {
        let mut out: Vec<Option<Checked>> = (0..keys.len()).map(|_| None).collect();
        for (ti, tier) in self.tiers.iter().enumerate() {
            let c = &self.counters[ti];
            let ask: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
            if ask.is_empty() {
                break;
            }
            let ks: Vec<ChunkKey> = ask.iter().map(|&i| keys[i]).collect();
            let blobs = match tier.get(&ks) {
                Ok(b) => b,
                Err(_) => {
                    add(&c.errors, 1);
                    continue;
                }
            };
            let checked: Vec<(usize, Option<Result<Checked>>)> = ask
                .par_iter()
                .zip(blobs.into_par_iter())
                .map(|(&i, b)| {
                    let r = b.map(|blob| {
                        self.check(&keys[i], &blob).map(|lens| Checked {
                            tier: ti,
                            blob,
                            lens,
                        })
                    });
                    (i, r)
                })
                .collect();
            for (i, r) in checked {
                match r {
                    Some(Ok(ch)) => {
                        add(&c.hits, 1);
                        add(&c.bytes_read, ch.blob.len() as u64);
                        out[i] = Some(ch);
                    }
                    Some(Err(e)) => self.count_bad(ti, &keys[i], &e),
                    None => add(&c.misses, 1),
                }
            }
        }
        // Promote what lower tiers had into the tiers above them.
        for up in 0..self.tiers.len() {
            let items: Vec<(ChunkKey, Blob)> = keys
                .iter()
                .zip(&out)
                .filter_map(|(k, f)| match f {
                    Some(ch) if ch.tier > up => Some((*k, ch.blob.clone())),
                    _ => None,
                })
                .collect();
            if items.is_empty() {
                continue;
            }
            self.write(up, &items);
            add(&self.promotions, items.len() as u64);
        }
        out
    }

    fn write(&self, ti: usize, items: &[(ChunkKey, Blob)]) -> bool {
        let c = &self.counters[ti];
        match self.tiers[ti].put(items) {
            Ok(()) => {
                add(&c.chunks_written, items.len() as u64);
                add(
                    &c.bytes_written,
                    items.iter().map(|(_, b)| b.len() as u64).sum(),
                );
                true
            }
            Err(_) => {
                add(&c.errors, 1);
                false
            }
        }
    }

    /// Restores the longest prefix of `tokens`'s full chunks that the tiers hold valid, into
    /// new buffers (layer stride: the tokens restored). [`Tiers::restore_into`] writes into
    /// the caller's buffers instead, without this allocation.
    pub fn restore(&self, tokens: &[u32]) -> Restored {
        let sec = self.shape.section_bytes();
        let nl = self.shape.n_layer;
        let asked = tokens.len() / self.shape.chunk_tokens;
        // Pages no chunk touches are never faulted in (a large zeroed allocation is lazily
        // mapped), so a short restore costs what it restores.
        let mut k = vec![0u8; nl * asked * sec];
        let mut v = vec![0u8; nl * asked * sec];
        let kv_tokens = asked * self.shape.chunk_tokens;
        let got = self.restore_chunks(tokens, kv_tokens, &mut k, &mut v);
        if got < asked {
            // Keep the leading chunks restored, at the layer stride of the shorter prefix.
            let keep = |buf: &[u8]| -> Vec<u8> {
                buf.chunks(asked * sec)
                    .flat_map(|layer| &layer[..got * sec])
                    .copied()
                    .collect()
            };
            (k, v) = (keep(&k), keep(&v));
        }
        Restored {
            tokens: got * self.shape.chunk_tokens,
            k,
            v,
        }
    }

    /// Restores the longest prefix of the full chunks of `tokens[..min(tokens.len(),
    /// kv_tokens)]` that the tiers hold valid straight into the caller's `k` and `v`, each
    /// `[n_layer][kv_tokens][n_kv_head][head_dim]` in the cache's dtype (at least `n_layer *
    /// kv_tokens * row` bytes); returns the tokens restored (a multiple of the chunk size):
    /// tokens `[0, returned)` of every layer hold the restored prefix.
    ///
    /// Each batch of chunks is decoded as soon as it has been fetched and checked, while
    /// other batches are still in flight, straight into its place in `k` and `v` (no buffer
    /// of its own, no copy). So chunks past the end of the valid prefix may have been
    /// written before the restore knows where it ends (a chunk after a miss, a chunk whose
    /// blob passed its checksum but failed to decode): the bytes of tokens from the
    /// returned count up to the last full chunk of `tokens[..min(tokens.len(), kv_tokens)]`
    /// are unspecified; bytes past that are untouched. The caller recomputes every token
    /// from the returned count on, which overwrites them.
    ///
    /// Errors (before anything is written): `k` or `v` shorter than `n_layer * kv_tokens *
    /// row` bytes.
    pub fn restore_into(
        &self,
        tokens: &[u32],
        kv_tokens: usize,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<usize> {
        let need = self
            .shape
            .n_layer
            .checked_mul(kv_tokens)
            .and_then(|x| x.checked_mul(self.shape.row_bytes()));
        for (name, t) in [("k", &*k), ("v", &*v)] {
            if need.is_none_or(|need| t.len() < need) {
                return Err(Error::invalid(
                    name,
                    format!(
                        "{} bytes, expected at least n_layer {} x kv_tokens {kv_tokens} x {}",
                        t.len(),
                        self.shape.n_layer,
                        self.shape.row_bytes()
                    ),
                ));
            }
        }
        let tokens = &tokens[..tokens.len().min(kv_tokens)];
        Ok(self.restore_chunks(tokens, kv_tokens, k, v) * self.shape.chunk_tokens)
    }

    /// Fetches, checks and decodes the full chunks of `tokens` (at most `kv_tokens`) into
    /// `k` and `v` (layer stride `kv_tokens` tokens, large enough); returns the leading
    /// chunks restored.
    fn restore_chunks(
        &self,
        tokens: &[u32],
        kv_tokens: usize,
        k: &mut [u8],
        v: &mut [u8],
    ) -> usize {
        add(&self.restores, 1);
        let keys = self.keys(tokens);
        let sec = self.shape.section_bytes();
        let nl = self.shape.n_layer;
        let stride = kv_tokens * self.shape.row_bytes();
        let mut kp = pieces(k, keys.len(), sec, stride, nl);
        let mut vp = pieces(v, keys.len(), sec, stride, nl);
        // Batches of chunks are fetched, checked (checksum, key, shape) and decoded
        // concurrently on the rayon pool, so one batch's transfer overlaps another's
        // checksum and decode. A batch past the first miss is wasted work, never a wrong
        // result: only the leading run of chunks that decoded is returned.
        let batch = keys
            .len()
            .div_ceil(2 * rayon::current_num_threads())
            .clamp(1, 8);
        let chunk_tokens = self.shape.chunk_tokens;
        let done: Vec<Restore> = keys
            .par_chunks(batch)
            .zip(kp.par_chunks_mut(batch))
            .zip(vp.par_chunks_mut(batch))
            .enumerate()
            .flat_map_iter(|(b, ((ks, kp), vp))| {
                let found = self.fetch(ks);
                found
                    .into_iter()
                    .zip(kp.iter_mut().zip(vp.iter_mut()))
                    .enumerate()
                    .map(move |(j, (ch, (kp, vp)))| match ch {
                        None => Restore::Missing,
                        Some(ch) => match decode_checked(
                            &self.coder,
                            &self.shape,
                            &ch.blob,
                            &ch.lens,
                            ((b * batch + j) * chunk_tokens) as u64,
                            kp,
                            vp,
                        ) {
                            Ok(()) => Restore::Done,
                            Err(e) => Restore::Failed(ch.tier, e),
                        },
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        // A blob whose checksum held but whose sections do not decode (a codec bug or a
        // crafted value): counted, removed, and the prefix ends before it.
        for (c, r) in done.iter().enumerate() {
            if let Restore::Failed(tier, e) = r {
                self.count_bad(*tier, &keys[c], e);
            }
        }
        let got = done
            .iter()
            .take_while(|r| matches!(r, Restore::Done))
            .count();
        add(&self.chunks_restored, got as u64);
        got
    }

    /// Starts [`Tiers::restore`] of `tokens` on a background thread (an engine prefetches
    /// while it tokenizes or schedules); join the handle for the result.
    pub fn restore_async(self: &Arc<Self>, tokens: Vec<u32>) -> std::thread::JoinHandle<Restored> {
        let me = Arc::clone(self);
        std::thread::spawn(move || me.restore(&tokens))
    }

    /// Prefetches the cached prefix of `tokens` into the faster tiers on a background
    /// thread: its chunks are fetched, validated and promoted (a later restore finds them
    /// in memory) without building a result. The handle gives the leading chunks found.
    pub fn prefetch(self: &Arc<Self>, tokens: Vec<u32>) -> std::thread::JoinHandle<usize> {
        let me = Arc::clone(self);
        std::thread::spawn(move || {
            let keys = me.keys(&tokens);
            me.fetch(&keys).iter().take_while(|c| c.is_some()).count()
        })
    }

    /// Stores every full chunk of the first `kv_tokens` tokens of `tokens`. `k` and `v` are
    /// `[n_layer][kv_tokens][n_kv_head][head_dim]` in the cache's dtype. Chunks every tier
    /// holds are skipped; the others are encoded once and written to every tier that
    /// lacks them. Tier failures are counted and reported, not returned: only bad
    /// arguments and codec failures are errors.
    pub fn store(
        &self,
        tokens: &[u32],
        k: &[u8],
        v: &[u8],
        kv_tokens: usize,
    ) -> Result<StoreReport> {
        let row = self.shape.row_bytes();
        let need = self
            .shape
            .n_layer
            .checked_mul(kv_tokens)
            .and_then(|x| x.checked_mul(row));
        for (name, t) in [("k", k), ("v", v)] {
            if need != Some(t.len()) {
                return Err(Error::invalid(
                    if name == "k" { "k" } else { "v" },
                    format!(
                        "{} bytes, expected n_layer {} x kv_tokens {kv_tokens} x {row}",
                        t.len(),
                        self.shape.n_layer
                    ),
                ));
            }
        }
        let n_tok = tokens.len().min(kv_tokens);
        let keys = self.keys(&tokens[..n_tok]);
        let mut report = StoreReport {
            chunks: keys.len(),
            ..StoreReport::default()
        };
        // Which tiers lack which chunk (a failing tier is treated as lacking all).
        let mut lacks: Vec<Vec<bool>> = Vec::with_capacity(self.tiers.len());
        for (ti, tier) in self.tiers.iter().enumerate() {
            lacks.push(match tier.contains(&keys) {
                Ok(h) => h.into_iter().map(|x| !x).collect(),
                Err(_) => {
                    add(&self.counters[ti].errors, 1);
                    vec![true; keys.len()]
                }
            });
        }
        let todo: Vec<usize> = (0..keys.len())
            .filter(|&i| lacks.iter().any(|l| l[i]))
            .collect();
        let stride = kv_tokens * row;
        let sec = self.shape.section_bytes();
        let blobs: Vec<Result<(usize, Blob)>> = todo
            .par_iter()
            .map(|&i| {
                encode_chunk(
                    &self.coder,
                    &self.shape,
                    &keys[i],
                    &self.fp,
                    k,
                    v,
                    stride,
                    i * sec,
                    (i * self.shape.chunk_tokens) as u64,
                )
                .map(|b| (i, Arc::new(b)))
            })
            .collect();
        // A chunk the codec cannot encode (kvq and a NaN or an infinity) is refused and
        // counted, never stored approximately; any other encode failure is an error.
        let mut ok = Vec::with_capacity(blobs.len());
        for b in blobs {
            match b {
                Ok(x) => ok.push(x),
                Err(Error::NonFinite { .. }) => report.chunks_refused += 1,
                Err(e) => return Err(e),
            }
        }
        add(&self.chunks_refused, report.chunks_refused as u64);
        let blobs = ok;
        report.chunks_encoded = blobs.len();
        report.bytes_stored = blobs.iter().map(|(_, b)| b.len() as u64).sum();
        report.bytes_raw = (blobs.len() * self.shape.chunk_raw_bytes()) as u64;
        add(&self.chunks_encoded, blobs.len() as u64);
        add(&self.raw_bytes_encoded, report.bytes_raw);
        add(&self.blob_bytes_encoded, report.bytes_stored);
        for (ti, lack) in lacks.iter().enumerate() {
            let items: Vec<(ChunkKey, Blob)> = blobs
                .iter()
                .filter(|(i, _)| lack[*i])
                .map(|(i, b)| (keys[*i], b.clone()))
                .collect();
            if !items.is_empty() && !self.write(ti, &items) {
                report.failures += 1;
            }
        }
        Ok(report)
    }

    /// Exports the prefix `tokens` as a kv-prefix file (docs/formats/kv-prefix.md): every
    /// token id of `tokens` (at most 2^26, else [`Error::InvalidArgument`]), and the blobs
    /// of the leading run of its whole chunks that the tiers hold valid, each fetched as a
    /// restore fetches it (fallthrough from the first tier, checked against its key and
    /// this front's fingerprint, promoted into the tiers above where it was found; a bad
    /// blob is counted and removed) and stopping at the first chunk no tier holds valid.
    /// The blobs are copied as they are (no decode, no re-encode). A prefix with no whole
    /// chunk, or none held, is a valid file of 0 chunks.
    pub fn export_prefix(&self, tokens: &[u32]) -> Result<PrefixExport> {
        prefix_file::check_token_count(tokens.len())?;
        let keys = self.keys(tokens);
        let blobs: Vec<Blob> = self
            .fetch(&keys)
            .into_iter()
            .map_while(|c| c.map(|c| c.blob))
            .collect();
        let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
        let bytes = prefix_file::write(&self.fp, self.shape.chunk_tokens, tokens, &refs)?;
        Ok(PrefixExport {
            bytes,
            chunks: blobs.len(),
            tokens_covered: blobs.len() * self.shape.chunk_tokens,
        })
    }

    /// [`Tiers::export_prefix`] into the file at `path`, written atomically: to a
    /// temporary file in the same directory (`.<name>.tmp-<pid>-<n>`), fsynced, renamed
    /// over `path`, the directory fsynced; a reader sees the old file or the whole new one,
    /// and a failure leaves no temporary file behind. Errors: as `export_prefix`, and
    /// [`Error::Io`].
    pub fn export_prefix_file(&self, tokens: &[u32], path: &Path) -> Result<PrefixExport> {
        let export = self.export_prefix(tokens)?;
        write_atomically(path, &export.bytes)?;
        Ok(export)
    }

    /// Checks the kv-prefix file `bytes` for these tiers without importing anything:
    /// [`PrefixFile::read`] (every field, the length, the checksum, each blob's own checks
    /// and key), then the file's fingerprint against this front's (another is
    /// [`Error::ForeignPrefixFile`], kind `Foreign`: a file of another model, layout,
    /// dtype, chunk size, codec or calibration, not a damaged one), then each blob as a
    /// restore checks it (codec, dtype, shape, section table; else
    /// [`Error::BadPrefixChunk`]). A damaged file is kind `CorruptData`.
    pub fn check_prefix<'a>(&self, bytes: &'a [u8]) -> Result<CheckedPrefix<'a>> {
        let file = PrefixFile::read(bytes)?;
        if *file.fingerprint() != self.fp {
            return Err(Error::ForeignPrefixFile {
                expected: self.fp,
                found: *file.fingerprint(),
            });
        }
        for (i, (key, blob)) in file.chunks().enumerate() {
            self.check(&key, blob).map_err(|e| Error::BadPrefixChunk {
                chunk: i,
                offset: file.blob_offset(i).unwrap_or(0) as u64,
                source: Box::new(e),
            })?;
        }
        Ok(CheckedPrefix { file })
    }

    /// Imports a file [`Tiers::check_prefix`] accepted: puts every blob, under its key,
    /// into this front's **first** tier only (the fastest; an engine loading a saved
    /// sequence imports into a front whose first tier is memory), then the caller restores
    /// `tokens` with [`Tiers::restore`] or [`Tiers::restore_into`] as usual, which decodes
    /// them (and promotes nothing: they are already in the first tier). Chunks already
    /// there are replaced by the same bytes. The first tier's byte budget applies: its
    /// eviction may keep fewer chunks, which `tokens_covered` reports. A file checked by a
    /// front of another fingerprint is [`Error::ForeignPrefixFile`]; a failing tier write is
    /// the tier's error (counted in its `errors`).
    pub fn import_checked(&self, checked: CheckedPrefix<'_>) -> Result<PrefixImport> {
        let file = checked.file;
        if *file.fingerprint() != self.fp {
            return Err(Error::ForeignPrefixFile {
                expected: self.fp,
                found: *file.fingerprint(),
            });
        }
        let items: Vec<(ChunkKey, Blob)> = file
            .chunks()
            .map(|(key, blob)| (key, Arc::new(blob.to_vec())))
            .collect();
        let keys: Vec<ChunkKey> = items.iter().map(|(k, _)| *k).collect();
        let c = &self.counters[0];
        if !items.is_empty() {
            if let Err(e) = self.tiers[0].put(&items) {
                add(&c.errors, 1);
                return Err(e);
            }
            add(&c.chunks_written, items.len() as u64);
            add(
                &c.bytes_written,
                items.iter().map(|(_, b)| b.len() as u64).sum(),
            );
        }
        drop(items);
        let held = match self.tiers[0].contains(&keys) {
            Ok(h) => h.iter().take_while(|&&h| h).count(),
            Err(e) => {
                add(&c.errors, 1);
                return Err(e);
            }
        };
        let chunks = file.n_chunks();
        let chunk_tokens = file.chunk_tokens();
        Ok(PrefixImport {
            tokens: file.into_tokens(),
            chunks,
            tokens_covered: held * chunk_tokens,
        })
    }

    /// Checks the kv-prefix file `bytes` and imports it into the first tier:
    /// [`Tiers::check_prefix`], then [`Tiers::import_checked`] (see both). Nothing is
    /// imported from a file that fails any check.
    pub fn import_prefix(&self, bytes: &[u8]) -> Result<PrefixImport> {
        self.import_checked(self.check_prefix(bytes)?)
    }

    /// [`Tiers::import_prefix`] of the file at `path` (unreadable: [`Error::Io`]).
    pub fn import_prefix_file(&self, path: &Path) -> Result<PrefixImport> {
        let bytes = read_file(path)?;
        self.import_prefix(&bytes)
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> TiersMetrics {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let tiers: Vec<TierMetrics> = self
            .tiers
            .iter()
            .zip(&self.counters)
            .map(|(t, c)| TierMetrics {
                name: t.name(),
                hits: ld(&c.hits),
                misses: ld(&c.misses),
                errors: ld(&c.errors),
                corrupt: ld(&c.corrupt),
                foreign: ld(&c.foreign),
                chunks_written: ld(&c.chunks_written),
                bytes_written: ld(&c.bytes_written),
                bytes_read: ld(&c.bytes_read),
                stats: t.stats(),
            })
            .collect();
        TiersMetrics {
            lookups: ld(&self.lookups),
            restores: ld(&self.restores),
            chunks_restored: ld(&self.chunks_restored),
            chunks_encoded: ld(&self.chunks_encoded),
            raw_bytes_encoded: ld(&self.raw_bytes_encoded),
            chunks_refused: ld(&self.chunks_refused),
            blob_bytes_encoded: ld(&self.blob_bytes_encoded),
            promotions: ld(&self.promotions),
            fallbacks: tiers.iter().map(|t| t.errors + t.corrupt + t.foreign).sum(),
            tiers,
        }
    }
}

/// The bytes of the file at `path` ([`Error::Io`] naming it when unreadable).
fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsynced,
/// renamed over `path`, then the directory fsynced (as the disk tier writes its chunks).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        Error::invalid("path", format!("{} does not name a file", path.display()))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("write {}", path.display()), e)
    })
}
