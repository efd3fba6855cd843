//! Statistics and the choice of model: which channels share a table (group size) and whether
//! the previous token's sign selects between two tables, decided by measured size.

use super::code_index::channel_major_indices;
use super::format::FieldSplit;
use super::huffman::{self, LengthBuilder};
use super::lanes::CODE_ENTRIES;
use super::low_byte::LowByteCodes;
use super::shared::{RelMap, SharedFit};
use super::values::{dispatch, load};
use crate::dtype::Dtype;
use std::sync::OnceLock;

/// Group sizes the encoder tries.
const GROUP_CANDIDATES: [u32; 4] = [1, 2, 4, 8];

/// The model an encoder chose, with its serialised tables and encode codes.
#[derive(Debug, Default)]
pub struct EncoderModel {
    /// Per (channel, context) symbol counts: `counts[(c * 2 + ctx) * alphabet + sym]`.
    /// Between fits it is zero outside `ranges` (laid out with `counts_alphabet`).
    counts: Vec<u32>,
    /// The alphabet of the last fit's `counts` and `ranges`.
    counts_alphabet: usize,
    /// Used symbol range per (channel, context): `[lo, hi)`.
    ranges: Vec<(u32, u32)>,
    merged: Vec<u32>,
    lens: Vec<u8>,
    builder: LengthBuilder,
    /// Encode codes, `codes[table * CODE_ENTRIES + sym] = rev | len << 12`.
    pub codes: Vec<u16>,
    /// `codes` split for the lane loop: the code words (`rev`)...
    pub code_bits: Vec<u16>,
    /// ... and their lengths.
    pub code_lens: Vec<u8>,
    /// The serialised model section.
    pub section: Vec<u8>,
    /// Channels per table group.
    pub group_size: u32,
    /// Whether the sign context is on.
    pub sign_context: bool,
    /// Whether the model is the shared-shape one (relative symbols, clustered tables).
    pub shared: bool,
    /// Encode table (for context 0) of every channel.
    pub chan_table: Vec<u32>,
    /// Usual top field of every channel (0 in the grouped model: symbols are not moved).
    pub chan_loc: Vec<u16>,
    /// Whether the relative symbols are wrapping differences (flag bit 2, int8 shared-shape).
    pub wrapping: bool,
    /// Locations of the histogram pass, per channel: all 0 for the raw top fields, then the
    /// wrapping map's (the medians) for int8.
    gather_locs: Vec<u16>,
    /// The f32 low-byte codes (flag bit 3; `on` only for f32 with the shared-shape model).
    pub low_byte: LowByteCodes,
    /// Channels in lane order (empty: channel order).
    pub chan_order: Vec<u16>,
    fit_shared: SharedFit,
    /// Scratch rows of code indices, and a chunk's channel-major code indices.
    block: Vec<u16>,
    cm: Vec<u16>,
}

/// The top fields of channel `c` at the first token of every chunk (chunks of
/// `chunk_tokens[i]` tokens, back to back in `input`).
fn first_tops<const BPV: usize, const REST: u32, const SYM: u32>(
    input: &[u8],
    channels: usize,
    chunk_tokens: &[u32],
    c: usize,
    out: &mut Vec<u32>,
) {
    let mask = (1u32 << SYM) - 1;
    let mut t = 0;
    for &n in chunk_tokens {
        if n > 0 {
            out.push((load::<BPV>(input, t * channels + c) >> REST) & mask);
        }
        t += n as usize;
    }
}

fn xlog2x_table() -> &'static [f32] {
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| {
        (0..65536u32)
            .map(|c| {
                if c == 0 {
                    0.0
                } else {
                    c as f32 * (c as f32).log2()
                }
            })
            .collect()
    })
}

#[inline]
fn xlog2x(c: u32, t: &[f32]) -> f64 {
    match t.get(c as usize) {
        Some(&v) => v as f64,
        None => c as f64 * (c as f64).log2(),
    }
}

/// Counts the relative symbols (`map`, the channels' locations `locs`) per (channel, context)
/// into `counts[(c * 2 + ctx) * alphabet + r]`, `ctx` the top bit of the previous token's
/// relative symbol in the same channel, 0 at the first token of a chunk (chunks of
/// `chunk_tokens[i]` tokens, back to back in `input`). The code indices (`code_index`, with the
/// alphabet as the context step) are these positions; they are made channel-major per chunk
/// (`block` and `cm` are scratch) and counted four channels at a time, so that the four
/// histograms stay in L1 (a row's histograms span up to 768 KiB).
#[allow(clippy::too_many_arguments)]
fn gather<const BPV: usize, const REST: u32, const SYM: u32>(
    input: &[u8],
    channels: usize,
    chunk_tokens: &[u32],
    locs: &[u16],
    map: RelMap,
    block: &mut Vec<u16>,
    cm: &mut Vec<u16>,
    counts: &mut [u32],
) {
    let hist = 2usize << SYM;
    let row = channels * BPV;
    let mut t0 = 0;
    for &n in chunk_tokens {
        let tokens = n as usize;
        if tokens == 0 {
            // Every row of the chunk is a reference: nothing coded.
            continue;
        }
        let t1 = t0 + tokens;
        if cm.len() < tokens * channels {
            cm.resize(tokens * channels, 0);
        }
        let cm = &mut cm[..tokens * channels];
        let rows = &input[t0 * row..t1 * row];
        channel_major_indices::<BPV, REST, SYM>(rows, locs, map, 1 << SYM, block, cm);
        for (h, col) in counts
            .chunks_exact_mut(4 * hist)
            .zip(cm.chunks_exact(4 * tokens))
        {
            let (h01, h23) = h.split_at_mut(2 * hist);
            let (h0, h1) = h01.split_at_mut(hist);
            let (h2, h3) = h23.split_at_mut(hist);
            let (c01, c23) = col.split_at(2 * tokens);
            let (c0, c1) = c01.split_at(tokens);
            let (c2, c3) = c23.split_at(tokens);
            for t in 0..tokens {
                h0[c0[t] as usize & (hist - 1)] += 1;
                h1[c1[t] as usize & (hist - 1)] += 1;
                h2[c2[t] as usize & (hist - 1)] += 1;
                h3[c3[t] as usize & (hist - 1)] += 1;
            }
        }
        let done = channels / 4 * 4;
        for (h, col) in counts[done * hist..]
            .chunks_exact_mut(hist)
            .zip(cm[done * tokens..].chunks_exact(tokens))
        {
            for &i in col {
                h[i as usize & (hist - 1)] += 1;
            }
        }
        t0 = t1;
    }
}

/// The used range `[lo, hi)` of a histogram (`(0, 0)` when empty), skipping empty blocks of
/// 16 counts at a time (most of a channel's histogram is empty).
fn used_range(h: &[u32]) -> (u32, u32) {
    const B: usize = 16;
    let empty = |b: &[u32]| b.iter().fold(0, |a, &m| a | m) == 0;
    let Some(first) = h.chunks(B).position(|b| !empty(b)) else {
        return (0, 0);
    };
    let last = h.len().div_ceil(B) - 1 - h.chunks(B).rev().position(|b| !empty(b)).unwrap_or(0);
    let lo = first * B + h[first * B..].iter().position(|&c| c > 0).unwrap_or(0);
    let block = &h[last * B..(last * B + B).min(h.len())];
    let hi = last * B + block.iter().rposition(|&c| c > 0).map_or(0, |p| p + 1);
    (lo as u32, hi.max(lo) as u32)
}

/// The median of each channel's int8 codes, in two's-complement order, from the counts of
/// `gather` (both contexts): the location of the wrapping map (on C8-quantized real KV it
/// codes ~0.5 % smaller than the most frequent code).
fn median_locs(counts: &[u32], channels: usize, locs: &mut Vec<u16>) {
    locs.clear();
    for c in 0..channels {
        let h = &counts[c * 512..(c + 1) * 512];
        let n = |s: usize| h[s] as u64 + h[256 + s] as u64;
        let total: u64 = (0..256).map(n).sum();
        let mut seen = 0u64;
        let mut loc = 0u16;
        // -128..=127 as bytes: 0x80..=0xff, then 0x00..=0x7f.
        for v in 0..256usize {
            let s = (v + 128) & 255;
            seen += n(s);
            if 2 * seen >= total && total > 0 {
                loc = s as u16;
                break;
            }
        }
        locs.push(loc);
    }
}

impl EncoderModel {
    /// Measures `input`, the rows the chunks code (`chunk_tokens[i]` tokens for chunk `i`,
    /// back to back), and fits the model (the shared-shape one when `shared`); fills
    /// `section`, `codes` and the per-channel tables.
    pub fn fit(
        &mut self,
        dtype: Dtype,
        channels: usize,
        chunk_tokens: &[u32],
        input: &[u8],
        shared: bool,
    ) {
        let split = FieldSplit::of(dtype);
        let alphabet = split.alphabet();
        self.clear_counts();
        self.counts.resize(channels * 2 * alphabet, 0);
        self.counts_alphabet = alphabet;
        // The raw top fields first (location 0, sign-magnitude map: the field itself).
        self.gather_locs.clear();
        self.gather_locs.resize(channels, 0);
        let map = RelMap::sign_magnitude(split.sym_bits);
        dispatch!(
            dtype,
            gather(
                input,
                channels,
                chunk_tokens,
                &self.gather_locs,
                map,
                &mut self.block,
                &mut self.cm,
                &mut self.counts
            )
        );
        // int8 codes are two's complement around a zero point: the shared-shape model codes
        // their wrapping difference from the channel's median (a second pass).
        self.wrapping = shared && dtype == Dtype::I8;
        if self.wrapping {
            median_locs(&self.counts, channels, &mut self.gather_locs);
            self.counts.fill(0);
            gather::<1, 0, 8>(
                input,
                channels,
                chunk_tokens,
                &self.gather_locs,
                RelMap::wrapping(8),
                &mut self.block,
                &mut self.cm,
                &mut self.counts,
            );
        }
        self.ranges.clear();
        self.ranges
            .extend(self.counts.chunks_exact(alphabet).map(used_range));
        self.shared = shared;
        self.low_byte.on = false;
        self.chan_table.clear();
        self.chan_loc.clear();
        self.chan_order.clear();
        if shared {
            self.fit_shared.fit(
                &self.counts,
                &self.ranges,
                channels,
                split.sym_bits,
                self.wrapping.then_some(&self.gather_locs[..]),
                &mut |c, out| dispatch!(dtype, first_tops(input, channels, chunk_tokens, c, out)),
                &mut self.codes,
                &mut self.section,
            );
            self.group_size = 1;
            self.sign_context = self.fit_shared.sign_context;
            let nctx = 1 + self.sign_context as u32;
            self.chan_table
                .extend(self.fit_shared.cluster.iter().map(|&g| g as u32 * nctx));
            self.chan_loc.extend_from_slice(&self.fit_shared.locs);
            super::shared::cluster_order(&self.fit_shared.cluster, &mut self.chan_order);
            if dtype == Dtype::F32 {
                self.low_byte.fit(input, &mut self.section);
            }
            self.split_codes();
            return;
        }
        let t = xlog2x_table();
        // The sign context is decided on per-channel tables, then the group size grows
        // while it pays (the estimated size is unimodal in the group size on KV data):
        // 3-5 estimates instead of all 8 combinations.
        let off = self.estimate(channels, alphabet, 1, false, t);
        let on = self.estimate(channels, alphabet, 1, true, t);
        let ctx = on < off;
        let mut best = (off.min(on), 1u32, ctx);
        for &g in GROUP_CANDIDATES[1..]
            .iter()
            .filter(|&&g| g as usize <= channels)
        {
            let bits = self.estimate(channels, alphabet, g as usize, ctx, t);
            if bits >= best.0 {
                break;
            }
            best = (bits, g, ctx);
        }
        self.group_size = best.1;
        self.sign_context = best.2;
        self.build(channels, alphabet);
        let nctx = 1 + self.sign_context as u32;
        self.chan_table
            .extend((0..channels as u32).map(|c| c / self.group_size * nctx));
        self.chan_loc.resize(channels, 0);
        self.split_codes();
    }

    /// Zeroes `counts` where the last fit left counts (its used ranges) instead of all of it:
    /// a 384-token f16 blob has 768 KiB of counts and 144 KiB of values.
    fn clear_counts(&mut self) {
        let a = self.counts_alphabet;
        for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
            if let Some(h) = self
                .counts
                .get_mut(i * a + lo as usize..i * a + hi as usize)
            {
                h.fill(0);
            }
        }
        self.ranges.clear();
    }

    /// Fills `code_bits` and `code_lens` from `codes`: the lane loop then takes a code with
    /// two loads and no field extraction.
    /// Both keep `codes`' capacity, so they grow only when it does.
    fn split_codes(&mut self) {
        self.code_bits.clear();
        self.code_bits.reserve(self.codes.capacity());
        self.code_bits.extend(self.codes.iter().map(|&c| c & 0xfff));
        self.code_lens.clear();
        self.code_lens.reserve(self.codes.capacity());
        self.code_lens
            .extend(self.codes.iter().map(|&c| (c >> 12) as u8));
    }

    /// Merges the counts of table `(group, ctx)` into `self.merged`; returns the used range.
    fn merge(
        &mut self,
        channels: usize,
        alphabet: usize,
        g: usize,
        nctx: usize,
        table: usize,
    ) -> (usize, usize) {
        let group = table / nctx;
        let ctx = table % nctx;
        let (mut lo, mut hi) = (alphabet, 0usize);
        let c0 = group * g;
        let c1 = (c0 + g).min(channels);
        for c in c0..c1 {
            for k in 0..2 {
                if nctx == 2 && k != ctx {
                    continue;
                }
                let (a, b) = self.ranges[c * 2 + k];
                if a < b {
                    lo = lo.min(a as usize);
                    hi = hi.max(b as usize);
                }
            }
        }
        if lo >= hi {
            return (0, 0);
        }
        self.merged[lo..hi].fill(0);
        for c in c0..c1 {
            for k in 0..2 {
                if nctx == 2 && k != ctx {
                    continue;
                }
                let (a, b) = self.ranges[c * 2 + k];
                let base = (c * 2 + k) * alphabet;
                for s in a as usize..b as usize {
                    self.merged[s] += self.counts[base + s];
                }
            }
        }
        (lo, hi)
    }

    fn estimate(
        &mut self,
        channels: usize,
        alphabet: usize,
        g: usize,
        ctx: bool,
        t: &[f32],
    ) -> f64 {
        self.merged.resize(alphabet, 0);
        let nctx = if ctx { 2 } else { 1 };
        let tables = channels.div_ceil(g) * nctx;
        let mut bits = 0.0;
        for table in 0..tables {
            let (lo, hi) = self.merge(channels, alphabet, g, nctx, table);
            let mut n = 0u64;
            let mut sum = 0.0;
            let mut used = 0u32;
            for &c in &self.merged[lo..hi] {
                if c > 0 {
                    n += c as u64;
                    sum += xlog2x(c, t);
                    used += 1;
                }
            }
            if n > 0 {
                bits += n as f64 * (n as f64).log2() - sum;
                // Huffman codes cost a little over the entropy on skewed alphabets.
                bits += 0.02 * n as f64;
            }
            // Table: about one nibble per used symbol plus a few run bytes.
            bits += used as f64 * 4.0 + 24.0;
        }
        bits
    }

    fn build(&mut self, channels: usize, alphabet: usize) {
        let g = self.group_size as usize;
        let nctx = if self.sign_context { 2 } else { 1 };
        let tables = channels.div_ceil(g) * nctx;
        self.merged.resize(alphabet, 0);
        self.lens.resize(alphabet, 0);
        self.codes.clear();
        self.codes.resize(tables * CODE_ENTRIES, 0);
        self.section.clear();
        for table in 0..tables {
            let (lo, hi) = self.merge(channels, alphabet, g, nctx, table);
            // Only the used range [lo, hi) is nonzero; canonical codes only depend on it.
            self.lens.fill(0);
            self.builder
                .build_lengths(&self.merged[lo..hi], &mut self.lens[lo..hi]);
            huffman::write_table(&self.lens, &mut self.section);
            let at = table * CODE_ENTRIES;
            huffman::build_codes(&self.lens[lo..hi], &mut self.codes[at + lo..at + hi]);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn used_range_matches_a_plain_scan() {
        let plain = |h: &[u32]| {
            let lo = h.iter().position(|&c| c > 0).unwrap_or(0);
            let hi = h.iter().rposition(|&c| c > 0).map_or(0, |p| p + 1);
            (lo as u32, hi.max(lo) as u32)
        };
        for len in [1usize, 15, 16, 17, 256, 512] {
            let mut h = vec![0u32; len];
            assert_eq!(super::used_range(&h), plain(&h));
            for a in [0, len / 3, len - 1] {
                for b in [a, len / 2, len - 1] {
                    h.fill(0);
                    h[a] = 1;
                    h[b.max(a)] = 2;
                    assert_eq!(super::used_range(&h), plain(&h), "{len} {a} {b}");
                }
            }
        }
    }

    use super::*;

    #[test]
    fn median_locs_in_twos_complement_order() {
        // Channel 0: codes -3, -1, -1, 2 (bytes 0xfd, 0xff, 0xff, 0x02): median -1 (0xff),
        // where unsigned order would say 0xfd. Channel 1: 5 x 7 and 4 x -100 split over both
        // contexts: median 7. Channel 2: no counts, location 0.
        let mut counts = vec![0u32; 3 * 512];
        counts[0xfd] = 1;
        counts[0xff] = 1;
        counts[256 + 0xff] = 1;
        counts[0x02] = 1;
        counts[512 + 7] = 3;
        counts[512 + 256 + 7] = 2;
        counts[512 + 256 + (156)] = 4;
        let mut locs = Vec::new();
        median_locs(&counts, 3, &mut locs);
        assert_eq!(locs, [0xff, 7, 0]);
    }
}
