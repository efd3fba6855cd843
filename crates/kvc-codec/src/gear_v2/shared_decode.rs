//! Decoding the shared-shape model (flag bit 1): reading its model section, building
//! two-symbol decode tables, the lane loop and the pass that moves the decoded relative
//! symbols into the output.
//!
//! Every cluster has two 2048-entry tables (one per sign context; the second is unused
//! without the context) of `u32` entries, indexed by the next 11 stream bits: each entry
//! decodes one or two symbols. Layout of an entry:
//!
//! ```text
//! bits 0-3   total code length (bits 4-5 are zero: a 64-bit shift by the entry shifts by it)
//! bits 6-9   length of the first code
//! bit  10    two symbols
//! bit  11    context after the entry (the last symbol's relative sign), as a table offset
//! bit  12    invalid code word
//! bits 32 - 2 * SYM ..  first symbol, then the second (SYM = 8 or 9 bits each)
//! ```
//!
//! The lanes decode four channels at a time (channel `base + k` in lane `k`) into a
//! channel-major scratch buffer of relative symbols (one byte each for 8-bit fields, two
//! for 9-bit ones), storing both symbols of an entry at once and advancing by one or two.
//! A second pass maps every channel's relative symbols back (`shared::from_rel`, a
//! per-channel constant) and writes them token-major into the output with the low bits.

// The lane loops index several per-lane arrays with one `k`; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use super::encode::LANES;
use super::format::BlobHeader;
use super::huffman::{self, INVALID_ENTRY, SYM_SHIFT};
use super::lane_decode::Lanes;
use super::low_bits;
use super::shared::{from_rel, MAX_CLUSTERS, SHARED_MAX_LEN};
use crate::error::{Error, Result};
use std::cell::RefCell;

/// Index bits of a two-symbol table.
const BITS: u32 = SHARED_MAX_LEN;
/// Entries per table.
const ENTRIES: usize = 1 << BITS;
/// Entries per cluster (two contexts).
const CLUSTER_ENTRIES: usize = 2 * ENTRIES;
const LEN1_SHIFT: u32 = 6;
const TWO: u32 = 1 << 10;
const CTX_BIT: u32 = 1 << 11;
const INVALID: u32 = 1 << 12;
/// Symbols a lane decodes per refill: 5 lookups of at most 2 symbols.
const LOOKUPS: usize = 5;
/// Bit position of a fast-path window's sentinel: 57 valid bits below it.
const SENTINEL: u64 = 1 << 57;

/// The decode side of a shared-shape model, built by [`SharedTables::read`].
#[derive(Debug, Default)]
pub(crate) struct SharedTables {
    /// Two-symbol tables, `CLUSTER_ENTRIES` per cluster.
    pairs: Vec<u32>,
    single: Vec<u16>,
    used: Vec<u16>,
    /// Cluster of every channel.
    cluster: Vec<u8>,
    /// Usual top field of every channel.
    locs: Vec<u16>,
}

thread_local! {
    /// Relative symbols of one chunk, channel-major (kept per thread between chunks).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl SharedTables {
    /// Reads and validates the model section `model` of a blob with `header`, and builds
    /// the tables.
    pub(crate) fn read(&mut self, header: &BlobHeader, model: &[u8]) -> Result<()> {
        let sym_bits = super::format::FieldSplit::of(header.dtype).sym_bits;
        let alphabet = 1usize << sym_bits;
        let channels = header.channels as usize;
        let bad_field = |found: u64| Error::V2BadField {
            field: "clusters",
            offset: super::format::HEADER_LEN,
            found,
        };
        let k = *model.first().ok_or(Error::V2Truncated {
            what: "model section",
            needed: super::format::HEADER_LEN + 1,
            available: super::format::HEADER_LEN,
        })? as usize;
        if k == 0 || k > MAX_CLUSTERS {
            return Err(bad_field(k as u64));
        }
        let per_channel = model.get(1..1 + 3 * channels).ok_or(Error::V2Truncated {
            what: "model section",
            needed: super::format::HEADER_LEN + 1 + 3 * channels,
            available: super::format::HEADER_LEN + model.len(),
        })?;
        self.cluster.clear();
        self.locs.clear();
        for (c, b) in per_channel.chunks_exact(3).enumerate() {
            let loc = u16::from_le_bytes([b[1], b[2]]);
            if b[0] as usize >= k || loc as usize >= alphabet {
                return Err(Error::V2BadTable {
                    table: c,
                    reason: "channel cluster or location out of range",
                });
            }
            self.cluster.push(b[0]);
            self.locs.push(loc);
        }
        let nctx = header.contexts();
        let mut pos = 1 + 3 * channels;
        self.used.clear();
        self.used.reserve(alphabet);
        self.single.clear();
        self.single.resize(k * CLUSTER_ENTRIES, INVALID_ENTRY);
        for g in 0..k {
            for x in 0..nctx {
                huffman::read_table_limited(
                    model,
                    &mut pos,
                    alphabet,
                    &mut self.used,
                    g * nctx + x,
                    SHARED_MAX_LEN,
                )?;
                if !self.used.is_empty() {
                    let at = g * CLUSTER_ENTRIES + x * ENTRIES;
                    huffman::build_decode_table_bits(
                        &self.used,
                        &mut self.single[at..at + ENTRIES],
                        BITS,
                    );
                }
            }
        }
        if pos != model.len() {
            return Err(Error::V2BadField {
                field: "model_len",
                offset: 24,
                found: header.model_len as u64,
            });
        }
        self.pairs.clear();
        self.pairs.resize(k * CLUSTER_ENTRIES, INVALID);
        let sh1 = 32 - 2 * sym_bits;
        let sh2 = 32 - sym_bits;
        let top = sym_bits - 1;
        let ctx_on = header.sign_context as u32;
        for g in 0..k {
            let single = &self.single[g * CLUSTER_ENTRIES..(g + 1) * CLUSTER_ENTRIES];
            let pairs = &mut self.pairs[g * CLUSTER_ENTRIES..(g + 1) * CLUSTER_ENTRIES];
            for x in 0..nctx {
                for i in 0..ENTRIES {
                    let e1 = single[x * ENTRIES + i] as u32;
                    if e1 & INVALID_ENTRY as u32 != 0 {
                        continue;
                    }
                    let l1 = e1 & 15;
                    let s1 = e1 >> SYM_SHIFT;
                    let x1 = (s1 >> top) & ctx_on;
                    let e2 = single[x1 as usize * ENTRIES + (i >> l1)] as u32;
                    let l2 = e2 & 15;
                    pairs[x * ENTRIES + i] = if e2 & INVALID_ENTRY as u32 == 0 && l1 + l2 <= BITS {
                        let s2 = e2 >> SYM_SHIFT;
                        let x2 = (s2 >> top) & ctx_on;
                        (l1 + l2) | l1 << LEN1_SHIFT | TWO | x2 << 11 | s1 << sh1 | s2 << sh2
                    } else {
                        l1 | l1 << LEN1_SHIFT | x1 << 11 | s1 << sh1
                    };
                }
            }
        }
        Ok(())
    }
}

/// Reads 64 bits at bit offset `bit` of `data` (LSB-first); bytes past the end read as zero.
#[inline(always)]
fn read_bits(data: &[u8], bit: usize) -> u64 {
    let b = bit >> 3;
    let mut a = [0u8; 8];
    match data.get(b..b + 8) {
        Some(s) => a.copy_from_slice(s),
        None => {
            let tail = data.get(b..).unwrap_or(&[]);
            a[..tail.len()].copy_from_slice(tail);
        }
    }
    u64::from_le_bytes(a) >> (bit & 7)
}

/// Decodes a coded chunk of a shared-shape blob into `out` (whole tokens), merging the low
/// bits `rest`. Errors are the reason of a `V2BadChunk`.
pub(crate) fn decode_shared<const BPV: usize, const REST: u32, const SYM: u32>(
    tables: &SharedTables,
    sign_context: bool,
    lanes: &Lanes<'_>,
    rest: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), &'static str> {
    let channels = tables.cluster.len();
    let tokens = out.len() / (channels * BPV);
    let es = if SYM > 8 { 2 } else { 1 };
    let stride = tokens + 2;
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let need = channels * stride * es;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let scratch = &mut scratch[..need];
        let bits = decode_lanes_best::<SYM>(tables, sign_context, lanes, tokens, scratch)?;
        for k in 0..LANES {
            let used = bits[k] - lanes.starts[k] * 8;
            if used.div_ceil(8) != lanes.lens[k] {
                return Err(if used > lanes.lens[k] * 8 {
                    "Huffman lane truncated"
                } else {
                    "Huffman lane has trailing bytes"
                });
            }
        }
        emit::<BPV, REST, SYM>(tables, scratch, stride, rest, out);
        Ok(())
    })
}

fn decode_lanes_best<const SYM: u32>(
    tables: &SharedTables,
    sign_context: bool,
    lanes: &Lanes<'_>,
    tokens: usize,
    scratch: &mut [u8],
) -> std::result::Result<[usize; LANES], &'static str> {
    #[cfg(test)]
    if super::lane_decode::force_portable() {
        return decode_lanes_ctx::<SYM>(tables, sign_context, lanes, tokens, scratch);
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("bmi2") && std::is_x86_feature_detected!("lzcnt") {
        // SAFETY: the CPU supports BMI2 and LZCNT, checked just above; the function is
        // otherwise safe.
        return unsafe { decode_lanes_bmi2::<SYM>(tables, sign_context, lanes, tokens, scratch) };
    }
    decode_lanes_ctx::<SYM>(tables, sign_context, lanes, tokens, scratch)
}

/// [`decode_lanes`] compiled with BMI2 and LZCNT.
///
/// # Safety
/// The CPU must support BMI2 and LZCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,lzcnt")]
unsafe fn decode_lanes_bmi2<const SYM: u32>(
    tables: &SharedTables,
    sign_context: bool,
    lanes: &Lanes<'_>,
    tokens: usize,
    scratch: &mut [u8],
) -> std::result::Result<[usize; LANES], &'static str> {
    decode_lanes_ctx::<SYM>(tables, sign_context, lanes, tokens, scratch)
}

#[inline(always)]
fn decode_lanes_ctx<const SYM: u32>(
    tables: &SharedTables,
    sign_context: bool,
    lanes: &Lanes<'_>,
    tokens: usize,
    scratch: &mut [u8],
) -> std::result::Result<[usize; LANES], &'static str> {
    if sign_context {
        decode_lanes::<SYM, true>(tables, lanes, tokens, scratch)
    } else {
        decode_lanes::<SYM, false>(tables, lanes, tokens, scratch)
    }
}

/// Stores the symbols of entry `e` at element `p` of `run` (both; the second is
/// overwritten later when the entry held one).
#[inline(always)]
fn put_pair<const SYM: u32>(run: &mut [u8], p: usize, e: u32) {
    if SYM == 8 {
        run[p..p + 2].copy_from_slice(&((e >> 16) as u16).to_le_bytes());
    } else {
        let sh1 = 32 - 2 * SYM;
        let mask = (1u32 << SYM) - 1;
        let v = ((e >> sh1) & mask) | (e >> (32 - SYM)) << 16;
        run[2 * p..2 * p + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// Stores the first symbol of entry `e` at element `p` of `run`; returns it.
#[inline(always)]
fn put_first<const SYM: u32>(run: &mut [u8], p: usize, e: u32) -> u32 {
    let s = (e >> (32 - 2 * SYM)) & ((1u32 << SYM) - 1);
    if SYM == 8 {
        run[p] = s as u8;
    } else {
        run[2 * p..2 * p + 2].copy_from_slice(&(s as u16).to_le_bytes());
    }
    s
}

/// Decodes every lane into `scratch` (channel `c`'s relative symbols at elements
/// `c * (tokens + 2)..`); returns the bit position each lane stopped at.
#[inline(always)]
fn decode_lanes<const SYM: u32, const CTX: bool>(
    tables: &SharedTables,
    lanes: &Lanes<'_>,
    tokens: usize,
    scratch: &mut [u8],
) -> std::result::Result<[usize; LANES], &'static str> {
    const MISSING: &str = "table missing for a channel";
    let es = if SYM > 8 { 2 } else { 1 };
    let stride = (tokens + 2) * es;
    let ch = tables.cluster.len();
    let data = lanes.data;
    let fast_end = data.len().checked_sub(8);
    let table = |c: usize| -> Option<&[u32; CLUSTER_ENTRIES]> {
        let g = *tables.cluster.get(c)? as usize;
        tables
            .pairs
            .get(g * CLUSTER_ENTRIES..(g + 1) * CLUSTER_ENTRIES)?
            .try_into()
            .ok()
    };
    let mut bit = lanes.starts.map(|s| s * 8);
    let mut flags = 0u32;
    let mask = ENTRIES - 1;
    let mut base = 0;
    while base < ch {
        let n = (ch - base).min(LANES);
        let mut tb = [table(base).ok_or(MISSING)?; LANES];
        for k in 1..n {
            tb[k] = table(base + k).ok_or(MISSING)?;
        }
        let Some(runs) = scratch.get_mut(base * stride..(base + n) * stride) else {
            return Err("output shape");
        };
        let mut p = [0usize; LANES];
        let mut ctx = [0usize; LANES];
        if let (Some(fast_end), LANES) = (fast_end, n) {
            let (r0, r) = runs.split_at_mut(stride);
            let (r1, r) = r.split_at_mut(stride);
            let (r2, r3) = r.split_at_mut(stride);
            let rs: [&mut [u8]; LANES] = [r0, r1, r2, r3];
            while p.iter().all(|&q| q + 2 * LOOKUPS <= tokens)
                && bit.iter().all(|&b| b >> 3 <= fast_end)
            {
                let mut w = [0u64; LANES];
                for k in 0..LANES {
                    let b = bit[k] >> 3;
                    let bytes: [u8; 8] = data[b..b + 8].try_into().unwrap_or([0; 8]);
                    let v = u64::from_le_bytes(bytes) >> (bit[k] & 7);
                    w[k] = (v & (SENTINEL - 1)) | SENTINEL;
                }
                for _ in 0..LOOKUPS {
                    for k in 0..LANES {
                        let e = tb[k][ctx[k] | (w[k] as usize & mask)];
                        w[k] = w[k].wrapping_shr(e);
                        flags |= e;
                        put_pair::<SYM>(rs[k], p[k], e);
                        p[k] += 1 + ((e >> 10) & 1) as usize;
                        if CTX {
                            ctx[k] = (e & CTX_BIT) as usize;
                        }
                    }
                }
                for k in 0..LANES {
                    bit[k] += w[k].leading_zeros() as usize - 6;
                }
            }
        }
        // Tails (and channels past the last group of four): one symbol per lookup.
        for k in 0..n {
            let run = &mut runs[k * stride..(k + 1) * stride];
            while p[k] < tokens {
                let e = tb[k][ctx[k] | (read_bits(data, bit[k]) as usize & mask)];
                flags |= e;
                let s = put_first::<SYM>(run, p[k], e);
                p[k] += 1;
                bit[k] += ((e >> LEN1_SHIFT) & 15) as usize;
                if CTX {
                    ctx[k] = (((s >> (SYM - 1)) & 1) as usize) << 11;
                }
            }
        }
        base += n;
    }
    if flags & INVALID != 0 {
        return Err("invalid Huffman code");
    }
    Ok(bit)
}

/// Maps the relative symbols back and writes every value token-major into `out`, with the
/// low bits `rest`.
fn emit<const BPV: usize, const REST: u32, const SYM: u32>(
    tables: &SharedTables,
    scratch: &mut [u8],
    stride: usize,
    rest: &[u8],
    out: &mut [u8],
) {
    let channels = tables.cluster.len();
    let tokens = out.len() / (channels * BPV);
    let es = if SYM > 8 { 2 } else { 1 };
    // Relative symbols back to top fields: a per-channel constant, so a simple loop.
    for (c, run) in scratch.chunks_exact_mut(stride * es).enumerate() {
        let loc = tables.locs[c] as u32;
        if SYM == 8 {
            for v in &mut run[..tokens] {
                *v = from_rel(*v as u32, loc, 8) as u8;
            }
        } else {
            for v in run[..2 * tokens].chunks_exact_mut(2) {
                let r = u16::from_le_bytes([v[0], v[1]]) as u32;
                v.copy_from_slice(&(from_rel(r, loc, SYM) as u16).to_le_bytes());
            }
        }
    }
    if BPV == 2 && REST == 8 {
        low_bits::interleave_f16(scratch, stride, rest, channels, tokens, out);
        return;
    }
    if BPV == 2 && SYM > 8 {
        low_bits::transpose_u16(scratch, stride, REST, channels, tokens, out);
        low_bits::merge_low_bits::<BPV, REST>(rest, out);
        return;
    }
    // Tokens per block: the block's scratch columns stay in L1 while its rows are written.
    const BLOCK: usize = 16;
    let mut t0 = 0;
    while t0 < tokens {
        let t1 = (t0 + BLOCK).min(tokens);
        for c in 0..channels {
            let run = &scratch[c * stride * es..];
            for t in t0..t1 {
                let s = if SYM == 8 {
                    run[t] as u32
                } else {
                    u16::from_le_bytes([run[2 * t], run[2 * t + 1]]) as u32
                };
                let v = (s << REST).to_le_bytes();
                let at = (t * channels + c) * BPV;
                out[at..at + BPV].copy_from_slice(&v[..BPV]);
            }
        }
        t0 = t1;
    }
    if REST % 8 != 0 {
        low_bits::merge_low_bits::<BPV, REST>(rest, out);
    }
}
