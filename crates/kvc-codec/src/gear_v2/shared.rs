//! The shared-shape model (flag bit 1): every channel's top field is moved to a channel-free
//! "relative" symbol, and a few tables shared by clusters of channels code the relative
//! symbols.
//!
//! A channel's top fields differ from its neighbours' mostly by location (which exponent is
//! typical, which sign), much less by shape. With `loc` the channel's most frequent top field
//! and `H` half the alphabet (the sign bit), the relative symbol of `s` is
//! `((s ^ loc) & H) | ((s - loc) & (H - 1))`: the sign relative to the usual sign, and the
//! magnitude field's distance from the usual one (mod `H`). Channels are clustered (at most
//! [`MAX_CLUSTERS`]) by the shape of their relative histograms, and each cluster has one
//! table (two with the sign context: the top bit of the previous token's relative symbol,
//! i.e. whether it had the channel's usual sign). A model costs three bytes per channel plus
//! a few tables, instead of one or two tables per channel; few tables make two-symbol
//! decode tables (`shared_decode`) cheap to build.

use super::huffman::{self, LengthBuilder, MAX_LEN_ANY};
use super::lanes::CODE_ENTRIES;
use std::sync::OnceLock;

/// Longest code length of the shared-shape mode (decode tables have `1 << 11` entries).
pub const SHARED_MAX_LEN: u32 = MAX_LEN_ANY;
/// The most clusters (tables per context) a shared-shape model may have.
pub const MAX_CLUSTERS: usize = 16;
/// Cluster counts the encoder tries (fewer when there are fewer channels).
const CLUSTER_CANDIDATES: [usize; 2] = [8, 12];
/// The most clusters the encoder tries: the stride of its cost vectors.
const CLUSTERS: usize = 12;
/// Refinement passes of the cluster assignment after the initial split.
const REFINE_PASSES: usize = 2;
/// Top fields per block of a channel's used-field scan; blocks with no count are skipped.
const SCAN_BLOCK: usize = 16;

/// How a channel's top fields become relative symbols: `r = ((s ^ loc) & sign) | ((s - loc)
/// & diff)`, inverted by `s = ((r ^ loc) & sign) | ((r + loc) & diff)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelMap {
    sign: u32,
    diff: u32,
}

impl RelMap {
    /// Sign relative to the usual sign, magnitude field minus the usual one mod half the
    /// alphabet ([`to_rel`]): the map of float fields.
    pub const fn sign_magnitude(sym_bits: u32) -> Self {
        let half = 1u32 << (sym_bits - 1);
        RelMap {
            sign: half,
            diff: half - 1,
        }
    }

    /// The wrapping difference `(s - loc) mod alphabet` (flag bit 2): the map of int8
    /// codes, two's complement around a zero point.
    pub const fn wrapping(sym_bits: u32) -> Self {
        RelMap {
            sign: 0,
            diff: (1u32 << sym_bits) - 1,
        }
    }

    /// The bits of a relative symbol that come from `s ^ loc` (the sign).
    pub const fn sign(self) -> u32 {
        self.sign
    }

    /// The bits of a relative symbol that come from `s - loc`.
    pub const fn diff(self) -> u32 {
        self.diff
    }

    /// The relative symbol of top field `s` in a channel whose location is `loc`.
    #[inline(always)]
    pub fn relative(self, s: u32, loc: u32) -> u32 {
        ((s ^ loc) & self.sign) | (s.wrapping_sub(loc) & self.diff)
    }

    /// The inverse of [`RelMap::relative`].
    #[inline(always)]
    pub fn absolute(self, r: u32, loc: u32) -> u32 {
        ((r ^ loc) & self.sign) | (r.wrapping_add(loc) & self.diff)
    }
}

/// The relative symbol of top field `s` in a channel whose usual top field is `loc`, with
/// the sign-magnitude map of float fields.
#[inline(always)]
pub fn to_rel(s: u32, loc: u32, sym_bits: u32) -> u32 {
    RelMap::sign_magnitude(sym_bits).relative(s, loc)
}

/// The inverse of [`to_rel`].
#[inline(always)]
pub fn from_rel(r: u32, loc: u32, sym_bits: u32) -> u32 {
    RelMap::sign_magnitude(sym_bits).absolute(r, loc)
}

/// The order in which the lanes code a shared-shape chunk's channels: by cluster, then by
/// channel (a stable counting sort), so that the four lanes mostly share one cluster's tables.
/// Lane `k` codes positions `k, k + 4, ...` of this order.
pub fn cluster_order(cluster: &[u8], order: &mut Vec<u16>) {
    order.clear();
    order.reserve(cluster.len());
    let mut count = [0usize; 256];
    for &g in cluster {
        count[g as usize] += 1;
    }
    let mut at = [0usize; 256];
    for g in 1..256 {
        at[g] = at[g - 1] + count[g - 1];
    }
    order.resize(cluster.len(), 0);
    for (c, &g) in cluster.iter().enumerate() {
        order[at[g as usize]] = c as u16;
        at[g as usize] += 1;
    }
}

/// A fitted shared-shape model: per-channel cluster and location, and the tables.
#[derive(Debug, Default)]
pub struct SharedFit {
    /// Cluster of each channel.
    pub cluster: Vec<u8>,
    /// Usual top field of each channel.
    pub locs: Vec<u16>,
    /// Clusters.
    pub clusters: usize,
    /// Whether the relative sign context is on.
    pub sign_context: bool,
    /// Nonzero relative counts of every channel: `(rel << 1 | ctx, count)`.
    entries: Vec<(u32, u32)>,
    /// Where each channel's entries start in `entries` (one more than channels).
    starts: Vec<usize>,
    dense: Vec<u32>,
    hist: Vec<u64>,
    cost: Vec<f32>,
    order: Vec<(f32, u32)>,
    lens: Vec<u8>,
    merged: Vec<u32>,
    /// The entry keys (`rel << 1 | ctx`) some channel uses, ascending: the only rows of the
    /// cost matrix that are read.
    rows: Vec<u32>,
    /// The relative symbols some channel uses (in either context), ascending.
    rels: Vec<u32>,
    /// Which entry keys are used (scratch for `rows`, `2 * alphabet`).
    seen: Vec<bool>,
    firsts: Vec<u32>,
    /// The used top fields of one channel (the first of `alphabet` slots).
    used: Vec<u16>,
    /// One channel's entries before they are appended to `entries` (`2 * alphabet` slots).
    row: Vec<(u32, u32)>,
    best_cluster: Vec<u8>,
    builder: LengthBuilder,
}

/// Base-2 logarithm of a count (`f32`, enough for costs), from `table` ([`log2_table`]) for
/// the counts it holds.
#[inline]
fn log2(c: u64, table: &[f32]) -> f32 {
    match table.get(c as usize) {
        Some(&l) => l,
        None => (c as f32).log2(),
    }
}

/// `(c as f32).log2()` for every count below 65,536: the costs take one load per entry
/// instead of a `log2f` call, with the same values.
fn log2_table() -> &'static [f32] {
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| (0..65536u32).map(|c| (c as f32).log2()).collect())
}

/// The entropies in bits (and used symbols) of a cluster's three histograms that decide the
/// sign context: context 0 (`h[r]`), context 1 (`h[alphabet + r]`) and both merged, over the
/// relative symbols `rels` (the histograms are zero elsewhere).
///
/// One pass with three independent sums (each a chain of dependent `f64` adds, so three
/// chains overlap where three passes would wait on one at a time). Each sum adds its nonzero
/// counts' `c log2 c` in the order of `rels`; a zero count adds `+0.0`, which leaves a sum
/// of nonnegative terms unchanged, so the results are bit for bit those of summing each
/// histogram's nonzero terms alone.
fn context_entropies(h: &[u64], alphabet: usize, rels: &[u32]) -> [(f64, usize); 3] {
    let t = xlog2x_f64_table();
    let xlog2x = |c: u64| -> f64 {
        if c == 0 {
            return 0.0;
        }
        match t.get(c as usize) {
            Some(&v) => v,
            None => c as f64 * (c as f64).log2(),
        }
    };
    let (h0, h1) = h.split_at(alphabet);
    let mut n = [0u64; 3];
    let mut s = [0.0f64; 3];
    let mut used = [0usize; 3];
    for &r in rels {
        let r = r as usize;
        let (Some(&a), Some(&b)) = (h0.get(r), h1.get(r)) else {
            continue;
        };
        for (i, c) in [a, b, a + b].into_iter().enumerate() {
            n[i] += c;
            s[i] += xlog2x(c);
            used[i] += (c > 0) as usize;
        }
    }
    std::array::from_fn(|i| {
        if n[i] == 0 {
            (0.0, 0)
        } else {
            let m = n[i] as f64;
            (m * m.log2() - s[i], used[i])
        }
    })
}

/// `c as f64 * (c as f64).log2()` for the counts below 4096 (32 KiB): the same values as the
/// expression, without a `log2` call for most counts of a small blob's clusters.
fn xlog2x_f64_table() -> &'static [f64] {
    static T: OnceLock<Vec<f64>> = OnceLock::new();
    T.get_or_init(|| (0..4096u32).map(|c| c as f64 * (c as f64).log2()).collect())
}

/// The estimated bits of a channel's entries `(rel << 1 | ctx, count)` under the first `G`
/// clusters (8, or all [`CLUSTERS`]), from the transposed costs `cost[(rel << 1 | ctx) *
/// CLUSTERS + g]`; the rest of the result is left at 0. Each cluster's sum is the same
/// whatever `G` is.
fn channel_bits<const G: usize>(entries: &[(u32, u32)], cost: &[f32]) -> [f32; CLUSTERS] {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX, checked just above; the function is otherwise safe.
        return unsafe { channel_bits_avx::<G>(entries, cost) };
    }
    channel_bits_any::<G>(entries, cost)
}

/// [`channel_bits`] compiled with AVX (eight clusters in one 8-wide multiply and add per
/// entry, twelve in one 8-wide and one 4-wide; no fused multiply-add, so the sums are the
/// portable ones).
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn channel_bits_avx<const G: usize>(
    entries: &[(u32, u32)],
    cost: &[f32],
) -> [f32; CLUSTERS] {
    channel_bits_any::<G>(entries, cost)
}

#[inline(always)]
fn channel_bits_any<const G: usize>(entries: &[(u32, u32)], cost: &[f32]) -> [f32; CLUSTERS] {
    let mut bits = [0.0f32; CLUSTERS];
    for &(i, n) in entries {
        let i = i as usize * CLUSTERS;
        let Some(cost) = cost.get(i..i + G) else {
            continue;
        };
        for g in 0..G {
            bits[g] += n as f32 * cost[g];
        }
    }
    bits
}

impl SharedFit {
    /// Fits the model from per-(channel, previous raw sign) counts `counts[(c * 2 + ctx) *
    /// alphabet + s]` (the first token of a chunk counted under sign 0) with used ranges
    /// `ranges`, and the first token of every chunk (`chunk_starts(c)` yields their top
    /// fields for channel `c`) to move them to context 0 of the relative model. Writes the
    /// model section to `section` and the encode codes, `CODE_ENTRIES` per table, to `codes`.
    ///
    /// With `wrapped` (the wrapping map, int8), the counts are already relative: indexed by
    /// `(c * 2 + ctx) * alphabet + r`, with `ctx` the top bit of the previous token's `r`,
    /// and `wrapped` holds each channel's location; `chunk_starts` is not called.
    #[allow(clippy::too_many_arguments)]
    pub fn fit(
        &mut self,
        counts: &[u32],
        ranges: &[(u32, u32)],
        channels: usize,
        sym_bits: u32,
        wrapped: Option<&[u16]>,
        chunk_starts: &mut dyn FnMut(usize, &mut Vec<u32>),
        codes: &mut Vec<u16>,
        section: &mut Vec<u8>,
    ) {
        let alphabet = 1usize << sym_bits;
        let half = alphabet / 2;
        self.cluster.clear();
        self.locs.clear();
        self.entries.clear();
        // Capacity for the most entries this shape can have, so that tensors of a steady
        // shape never grow it (no allocation in steady state).
        let values: u64 = counts.iter().take(2 * alphabet).map(|&n| n as u64).sum();
        let most = (channels * 2 * alphabet).min(values as usize * channels);
        self.entries.reserve(most);
        self.starts.clear();
        self.dense.clear();
        self.dense.resize(2 * alphabet, 0);
        let mut firsts = std::mem::take(&mut self.firsts);
        for c in 0..channels {
            let (a0, b0) = ranges[c * 2];
            let (a1, b1) = ranges[c * 2 + 1];
            let lo = a0.min(a1) as usize;
            let hi = (b0.max(b1) as usize).max(lo);
            let h0 = &counts[c * 2 * alphabet..(c * 2 + 1) * alphabet];
            let h1 = &counts[(c * 2 + 1) * alphabet..(c * 2 + 2) * alphabet];
            if let Some(locs) = wrapped {
                self.starts.push(self.entries.len());
                for r in lo..hi {
                    for x in 0..2 {
                        let n = counts[(c * 2 + x) * alphabet + r];
                        if n > 0 {
                            self.entries.push(((r as u32) << 1 | x as u32, n));
                        }
                    }
                }
                self.locs.push(locs[c]);
                continue;
            }
            // The used top fields in order, and the most frequent one, the channel's
            // location. Blocks of `SCAN_BLOCK` fields that neither context uses are skipped
            // (the span between a channel's two signs is mostly such blocks). Within a block,
            // branch-free: every field is written at the next slot, which only advances past
            // a used one (whether a field is used follows no pattern a branch predicts).
            self.used.resize(alphabet, 0);
            let mut used_len = 0;
            let mut loc = lo;
            let mut best = 0u32;
            for (b, (b0, b1)) in h0[lo..hi]
                .chunks(SCAN_BLOCK)
                .zip(h1[lo..hi].chunks(SCAN_BLOCK))
                .enumerate()
            {
                if b0.iter().chain(b1).fold(0, |a, &n| a | n) == 0 {
                    continue;
                }
                let first = lo + b * SCAN_BLOCK;
                for (s, (&n0, &n1)) in (first..).zip(b0.iter().zip(b1)) {
                    let n = n0 + n1;
                    self.used[used_len] = s as u16;
                    used_len += (n > 0) as usize;
                    if n > best {
                        best = n;
                        loc = s;
                    }
                }
            }
            let used = &self.used[..used_len];
            let loc = loc as u32;
            let lsign = ((loc as usize) & half != 0) as usize;
            for &s in used {
                let s = s as usize;
                let r = to_rel(s as u32, loc, sym_bits) as usize;
                self.dense[lsign * alphabet + r] += h0[s];
                self.dense[(1 - lsign) * alphabet + r] += h1[s];
            }
            if lsign == 1 {
                // A chunk's first token has context 0 in the relative model; the counts
                // had it under raw sign 0, i.e. relative context 1 here.
                firsts.clear();
                chunk_starts(c, &mut firsts);
                for &s in &firsts {
                    let r = to_rel(s, loc, sym_bits) as usize;
                    self.dense[alphabet + r] -= 1;
                    self.dense[r] += 1;
                }
            }
            self.starts.push(self.entries.len());
            // The channel's nonzero entries, branch-free into `row`, then appended.
            self.row.resize(2 * alphabet, (0, 0));
            let mut row_len = 0;
            for &s in used {
                let r = to_rel(s as u32, loc, sym_bits) as usize;
                for x in 0..2 {
                    let n = std::mem::take(&mut self.dense[x * alphabet + r]);
                    self.row[row_len] = ((r as u32) << 1 | x as u32, n);
                    row_len += (n > 0) as usize;
                }
            }
            self.entries.extend_from_slice(&self.row[..row_len]);
            self.locs.push(loc as u16);
        }
        self.firsts = firsts;
        self.starts.push(self.entries.len());
        self.seen.clear();
        self.seen.resize(2 * alphabet, false);
        for &(i, _) in &self.entries {
            self.seen[i as usize] = true;
        }
        // Room for every key: no allocation when a later blob uses more of them.
        self.rows.clear();
        self.rows.reserve(2 * alphabet);
        self.rels.clear();
        self.rels.reserve(alphabet);
        for (r, pair) in self.seen.chunks_exact(2).enumerate() {
            for (x, &on) in pair.iter().enumerate() {
                if on {
                    self.rows.push((r << 1 | x) as u32);
                }
            }
            if pair[0] || pair[1] {
                self.rels.push(r as u32);
            }
        }
        // Channels ordered by their entropy per symbol: every cluster count's initial split.
        let l2 = log2_table();
        self.order.clear();
        for c in 0..channels {
            let e = &self.entries[self.starts[c]..self.starts[c + 1]];
            let n: u64 = e.iter().map(|&(_, n)| n as u64).sum();
            let mut s = 0.0f32;
            for &(_, m) in e {
                s += m as f32 * log2(m as u64, l2);
            }
            let h = if n > 0 {
                log2(n, l2) - s / n as f32
            } else {
                0.0
            };
            self.order.push((h, c as u32));
        }
        self.order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        // Cluster counts tried, the smallest estimated size wins: K (RoPE pairs, sign
        // context) gains from more clusters than V, whose extra tables cost more than they
        // save. Only tensors whose first fit takes the sign context (K-like) try the others.
        let mut best: Option<(f64, usize, bool)> = None;
        // The cluster count whose histograms `hist` holds.
        let mut last = 0;
        for &want in &CLUSTER_CANDIDATES {
            let k = want.min(channels).max(1);
            if best.is_some_and(|b| b.1 == k || !b.2) {
                continue;
            }
            let (bits, ctx) = self.cluster_into(k, channels, alphabet);
            last = k;
            if best.is_none_or(|b| bits < b.0) {
                best = Some((bits, k, ctx));
                self.best_cluster.clear();
                self.best_cluster.extend_from_slice(&self.cluster);
            }
        }
        let (_, k, ctx) = best.expect("at least one cluster count");
        self.cluster.clear();
        self.cluster.extend_from_slice(&self.best_cluster);
        self.clusters = k;
        if k != last {
            self.cluster_hists(k, alphabet);
        }
        self.sign_context = ctx;
        let tab = 2 * alphabet;
        let nctx = if self.sign_context { 2 } else { 1 };
        // The model section: clusters, per channel (cluster, loc), then the tables.
        section.clear();
        // The largest section of this shape (a table is at most one run byte per symbol
        // and a nibble per symbol), so that a steady shape never grows it.
        section.reserve(1 + 3 * channels + 2 * k * (alphabet + alphabet / 2 + 2));
        section.push(k as u8);
        for c in 0..channels {
            section.push(self.cluster[c]);
            section.extend_from_slice(&self.locs[c].to_le_bytes());
        }
        codes.clear();
        codes.reserve(k * 2 * CODE_ENTRIES);
        codes.resize(k * nctx * CODE_ENTRIES, 0);
        self.lens.resize(alphabet, 0);
        // The tables' counts, lengths and codes are visited at the used relative symbols
        // only (`merged` and the new `codes` are zero elsewhere, and stay so: each table's
        // counts are taken back out after it).
        self.merged.clear();
        self.merged.resize(alphabet, 0);
        for g in 0..k {
            let h = &self.hist[g * tab..(g + 1) * tab];
            for x in 0..nctx {
                let mut any = false;
                for &r in &self.rels {
                    let r = r as usize;
                    let n = if nctx == 2 {
                        h[x * alphabet + r]
                    } else {
                        h[r] + h[alphabet + r]
                    };
                    self.merged[r] = n.min(u32::MAX as u64) as u32;
                    any |= n > 0;
                }
                // The decoder wants a complete code (or one symbol) in every table.
                let syms: &[u32] = if any {
                    &self.rels
                } else {
                    self.merged[0] = 1;
                    &[0]
                };
                self.builder
                    .build_lengths_of(&self.merged, syms, &mut self.lens, SHARED_MAX_LEN);
                huffman::write_table(&self.lens, section);
                let at = (g * nctx + x) * CODE_ENTRIES;
                huffman::build_codes_of(&self.lens, syms, &mut codes[at..at + alphabet]);
                for &s in syms {
                    self.merged[s as usize] = 0;
                }
            }
        }
    }

    /// Clusters the channels into `k` clusters (initial split by entropy, then refinement
    /// passes) and sums the cluster histograms; returns the estimated size in bits (entropy
    /// plus about a nibble per used symbol of every table) and whether the sign context pays.
    fn cluster_into(&mut self, k: usize, channels: usize, alphabet: usize) -> (f64, bool) {
        // Initial split: the channels in order of entropy (`fit` sorted them), cut into k runs.
        let l2 = log2_table();
        self.cluster.resize(channels, 0);
        for (i, &(_, c)) in self.order.iter().enumerate() {
            self.cluster[c as usize] = (i * k / channels) as u8;
        }
        // Refinement: each channel moves to the cluster whose (smoothed) tables code it
        // in the fewest bits.
        let tab = 2 * alphabet;
        self.cluster_hists(k, alphabet);
        for _ in 0..REFINE_PASSES {
            // Costs transposed, `cost[(rel << 1 | ctx) * CLUSTERS + g]`, so that one entry's
            // costs under every cluster are one vector; clusters past `k` never win.
            // Only the rows of used entry keys are filled (no other row is read): per
            // cluster and context, the table's total (the histogram is zero elsewhere).
            let mut ln_miss = [[(0.0f32, 0.0f32); 2]; CLUSTERS];
            for (g, lm) in ln_miss.iter_mut().enumerate().take(k) {
                let mut n = [0u64; 2];
                for &i in &self.rows {
                    let x = (i & 1) as usize;
                    n[x] += self.hist[g * tab + x * alphabet + (i >> 1) as usize];
                }
                for x in 0..2 {
                    let ln = log2(n[x] + 1, l2);
                    // Unseen symbols cost about a code of the table's longest lengths.
                    lm[x] = (ln, ln + 2.0);
                }
            }
            self.cost.resize(tab * CLUSTERS, 0.0);
            for &i in &self.rows {
                let (x, r) = ((i & 1) as usize, (i >> 1) as usize);
                let row = &mut self.cost[i as usize * CLUSTERS..(i as usize + 1) * CLUSTERS];
                for (g, cost) in row.iter_mut().enumerate() {
                    *cost = if g < k {
                        let m = self.hist[g * tab + x * alphabet + r];
                        let (ln, miss) = ln_miss[g][x];
                        if m > 0 {
                            ln - log2(m, l2)
                        } else {
                            miss
                        }
                    } else {
                        f32::MAX / 4.0
                    };
                }
            }
            for c in 0..channels {
                let e = &self.entries[self.starts[c]..self.starts[c + 1]];
                let bits = if k <= 8 {
                    channel_bits::<8>(e, &self.cost)
                } else {
                    channel_bits::<CLUSTERS>(e, &self.cost)
                };
                let mut best = (f32::INFINITY, 0u8);
                for (g, &b) in bits.iter().enumerate().take(k) {
                    if b < best.0 {
                        best = (b, g as u8);
                    }
                }
                // The histograms follow the channel (the costs of this pass are already
                // taken): the next pass and the caller see the new assignment's sums.
                let from = std::mem::replace(&mut self.cluster[c], best.1) as usize;
                let to = best.1 as usize;
                if from != to {
                    for &(i, n) in &self.entries[self.starts[c]..self.starts[c + 1]] {
                        let at = (i & 1) as usize * alphabet + (i >> 1) as usize;
                        self.hist[from * tab + at] -= n as u64;
                        self.hist[to * tab + at] += n as u64;
                    }
                }
            }
        }
        // The sign context pays when splitting the tables saves more than the extra tables
        // cost (about a nibble per used symbol).
        let (mut with, mut without) = (0.0, 0.0);
        // The histograms are zero outside the used relative symbols.
        for g in 0..k {
            let h = &self.hist[g * tab..(g + 1) * tab];
            let [(bits0, used0), (bits1, used1), (bitsm, usedm)] =
                context_entropies(h, alphabet, &self.rels);
            // (The sums in the order they always had: the blobs stay byte-identical.)
            with += bits0 + bits1;
            without += bitsm;
            with += 4.0 * (used0 + used1) as f64;
            without += 4.0 * usedm as f64;
        }
        (with.min(without), with < without)
    }

    /// Sums the relative counts of each cluster into `hist[g * 2 * alphabet + ctx *
    /// alphabet + rel]`.
    fn cluster_hists(&mut self, k: usize, alphabet: usize) {
        let tab = 2 * alphabet;
        self.hist.clear();
        self.hist.resize(k * tab, 0);
        for (c, &g) in self.cluster.iter().enumerate() {
            let h = &mut self.hist[g as usize * tab..(g as usize + 1) * tab];
            for &(i, n) in &self.entries[self.starts[c]..self.starts[c + 1]] {
                let (r, x) = ((i >> 1) as usize, (i & 1) as usize);
                h[x * alphabet + r] += n as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_map_inverts_and_centres_on_loc() {
        let m = RelMap::wrapping(8);
        for loc in 0..256 {
            for s in 0..256 {
                let r = m.relative(s, loc);
                assert!(r < 256);
                assert_eq!(m.absolute(r, loc), s);
            }
            // One below the location is the largest relative symbol (top bit set: context 1).
            assert_eq!(m.relative(loc, loc), 0);
            assert_eq!(m.relative((loc + 255) % 256, loc), 255);
        }
        // The sign-magnitude map as a RelMap is `to_rel`.
        let sm = RelMap::sign_magnitude(9);
        for (s, loc) in [(0u32, 0u32), (300, 17), (511, 256), (5, 400)] {
            assert_eq!(sm.relative(s, loc), to_rel(s, loc, 9));
            assert_eq!(sm.absolute(to_rel(s, loc, 9), loc), s);
        }
    }

    /// The one-pass entropies are bit for bit those of each histogram's nonzero terms summed
    /// alone, in symbol order.
    #[test]
    fn context_entropies_match_separate_sums() {
        let plain = |h: &mut dyn Iterator<Item = u64>| -> (f64, usize) {
            let (mut n, mut s, mut used) = (0u64, 0.0f64, 0usize);
            for c in h.filter(|&c| c > 0) {
                n += c;
                s += c as f64 * (c as f64).log2();
                used += 1;
            }
            if n == 0 {
                return (0.0, 0);
            }
            (n as f64 * (n as f64).log2() - s, used)
        };
        let mut rng = crate::gear_v2::test_rng::XorShift64(0x13198a2e03707344);
        for round in 0..100 {
            let alphabet = 512;
            let mut h = vec![0u64; 2 * alphabet];
            let mut rels = Vec::new();
            for r in 0..alphabet {
                let x = rng.next();
                if !x.is_multiple_of(3) || round == 0 {
                    continue;
                }
                // Counts below and above the 4096-entry table, and zeros in one context.
                h[r] = (x >> 8) % 5 * ((x >> 16) % 3000);
                h[alphabet + r] = (x >> 24) % 4 * ((x >> 32) % 9000);
                rels.push(r as u32);
            }
            let got = context_entropies(&h, alphabet, &rels);
            let want = [
                plain(&mut rels.iter().map(|&r| h[r as usize])),
                plain(&mut rels.iter().map(|&r| h[alphabet + r as usize])),
                plain(
                    &mut rels
                        .iter()
                        .map(|&r| h[r as usize] + h[alphabet + r as usize]),
                ),
            ];
            for (g, w) in got.iter().zip(&want) {
                assert_eq!((g.0.to_bits(), g.1), (w.0.to_bits(), w.1), "round {round}");
            }
        }
    }

    #[test]
    fn relative_symbols_invert() {
        for bits in [8u32, 9] {
            let a = 1u32 << bits;
            for loc in 0..a {
                let mut seen = vec![false; a as usize];
                for s in 0..a {
                    let r = to_rel(s, loc, bits);
                    assert!(r < a);
                    assert!(!seen[r as usize]);
                    seen[r as usize] = true;
                    assert_eq!(from_rel(r, loc, bits), s);
                }
                assert_eq!(to_rel(loc, loc, bits), 0);
            }
        }
    }
}
