//! Decoding the shared-shape model (flag bit 1): reading its model section (the decode
//! tables themselves are built by `pair_tables`), the lane loop and the pass that moves the
//! decoded relative symbols into the output.
//!
//! Every cluster has two 2048-entry tables (one per sign context; the second is unused
//! without the context) of `u32` entries, indexed by the next 11 stream bits: each entry
//! decodes one or two symbols. Layout of an entry:
//!
//! ```text
//! bits 0-3    total code length (bits 4-5 are zero: a 64-bit shift by the entry shifts by it)
//! bit  11     context after the entry (the last symbol's relative sign), as a table offset
//! bits 12..   first symbol, then the second (SYM = 8 or 9 bits each)
//! bits 30-31  symbols in the entry (1 or 2)
//! ```
//!
//! The model's codes are complete (or a single symbol, which then owns every code word), so
//! every entry decodes something and the lane loop needs no invalid-code flag. The lanes
//! decode four channels at a time (positions `base + k` of the cluster order in lane `k`, so
//! that the lanes mostly share one cluster's tables, which stay in L1) into a channel-major
//! scratch buffer of relative symbols (one byte each for 8-bit fields, two for 9-bit ones),
//! storing both symbols of an entry at once and advancing by the entry's count. The bounds
//! of a run of refill groups are checked once before it (a lane consumes at most 55 bits
//! and 10 symbols per group). A second pass maps every channel's relative symbols back
//! (`shared::from_rel`, a per-channel constant, folded into the SIMD transposes) and writes
//! them token-major into the output with the low bits.

// The lane loops index several per-lane arrays with one `k`; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use super::encode::LANES;
use super::format::BlobHeader;
use super::huffman::{self, canonical_codes, Code, SYM_SHIFT};
use super::lane_decode::Lanes;
use super::low_bits;
use super::low_byte::{self, LowByteTable};
use super::pair_tables::{fill_halves, fill_pairs};
use super::shared::{cluster_order, from_rel, MAX_CLUSTERS, SHARED_MAX_LEN};
use crate::error::{Error, Result};
use std::cell::RefCell;

/// Index bits of a two-symbol table.
pub(super) const BITS: u32 = SHARED_MAX_LEN;
/// Entries per table.
pub(super) const ENTRIES: usize = 1 << BITS;
/// Entries per cluster (two contexts).
pub(super) const CLUSTER_ENTRIES: usize = 2 * ENTRIES;
pub(super) const CTX_BIT: u32 = 1 << 11;
pub(super) const SYM_AT: u32 = 12;
pub(super) const COUNT_AT: u32 = 30;
/// Lookups per lane and refill: 5 lookups of at most 11 bits and 2 symbols.
const LOOKUPS: usize = 5;
/// Most bits a lane consumes per refill group.
const GROUP_BITS: usize = LOOKUPS * BITS as usize;
/// Most symbols a lane decodes per refill group.
const GROUP_SYMS: usize = 2 * LOOKUPS;
/// Bit position of a fast-path window's sentinel: 57 valid bits below it.
const SENTINEL: u64 = 1 << 57;

/// The decode side of a shared-shape model, built by [`SharedTables::read`].
#[derive(Debug, Default)]
pub(crate) struct SharedTables {
    /// Two-symbol tables, `CLUSTER_ENTRIES` per cluster.
    pairs: Vec<u32>,
    /// One-symbol tables, `CLUSTER_ENTRIES` per cluster, laid out as the second halves of
    /// pair entries (`len | ctx << 11 | sym << (SYM_AT + SYM) | 1 << COUNT_AT`).
    halves: Vec<u32>,
    used: Vec<u16>,
    /// Cluster of every channel.
    cluster: Vec<u8>,
    /// Usual top field of every channel.
    locs: Vec<u16>,
    /// Whether the relative symbols are wrapping differences (int8 only).
    wrapping: bool,
    /// Whether f32 low bytes are coded (flag bit 3), and their table.
    low_byte: bool,
    low_table: LowByteTable,
    /// Channels in lane order (by cluster).
    order: Vec<u16>,
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
        cluster_order(&self.cluster, &mut self.order);
        self.wrapping = header.wrapping;
        self.low_byte = header.low_byte;
        let nctx = header.contexts();
        let mut pos = 1 + 3 * channels;
        self.used.clear();
        self.used.reserve(alphabet);
        // Every entry of a used table is written below (the codes are complete): no zeroing.
        self.halves.resize(k * CLUSTER_ENTRIES, 0);
        self.pairs.resize(k * CLUSTER_ENTRIES, 0);
        let ctx_on = header.sign_context as u32;
        let mut codes: [Code; 512] = [(0, 0, 0); 512];
        for g in 0..k {
            let at = g * CLUSTER_ENTRIES;
            for x in 0..nctx {
                let single_symbol = huffman::read_complete_table(
                    model,
                    &mut pos,
                    alphabet,
                    &mut self.used,
                    g * nctx + x,
                    SHARED_MAX_LEN,
                )?;
                let n = if single_symbol {
                    // The one symbol (length 1) owns both code words; the encoder writes code 0.
                    let sym = (self.used[0] >> SYM_SHIFT) as u32;
                    codes[0] = (0, 1, sym);
                    codes[1] = (1, 1, sym);
                    2
                } else {
                    canonical_codes(&self.used, &mut codes)
                };
                let halves = &mut self.halves[at + x * ENTRIES..at + (x + 1) * ENTRIES];
                if sym_bits == 8 {
                    fill_halves::<8>(&codes[..n], ctx_on, halves);
                } else {
                    fill_halves::<9>(&codes[..n], ctx_on, halves);
                }
            }
            // Without the context no half sets a context bit: only context 0 is read.
            let halves = &self.halves[at..at + CLUSTER_ENTRIES];
            for x in 0..nctx {
                let pairs = &mut self.pairs[at + x * ENTRIES..at + (x + 1) * ENTRIES];
                if sym_bits == 8 {
                    fill_pairs::<8>(halves, x, pairs);
                } else {
                    fill_pairs::<9>(halves, x, pairs);
                }
            }
        }
        if header.low_byte {
            self.low_table.read(model, &mut pos, k * nctx)?;
        }
        if pos != model.len() {
            return Err(Error::V2BadField {
                field: "model_len",
                offset: 24,
                found: header.model_len as u64,
            });
        }
        Ok(())
    }

    /// The f32 low-byte table (meaningful when the blob has flag bit 3).
    pub(crate) fn low_byte(&self) -> &LowByteTable {
        &self.low_table
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

/// The symbols of a pair entry `e` as they are stored: two bytes (8-bit fields) or two
/// little-endian u16 (9-bit fields) in one integer.
#[inline(always)]
fn pair_bits<const SYM: u32>(e: u32) -> u32 {
    let x = e >> SYM_AT;
    if SYM == 8 {
        x & 0xffff
    } else {
        (x & 0x1ff) | (x << 7) & 0x01ff_0000
    }
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
    let ch = tables.order.len();
    let data = lanes.data;
    // A lane refills from 8 loaded bytes while its bit position is at most this.
    let fast_end = (data.len() * 8).checked_sub(57);
    let pairs = |c: usize| -> Option<&[u32; CLUSTER_ENTRIES]> {
        let g = *tables.cluster.get(c)? as usize;
        tables
            .pairs
            .get(g * CLUSTER_ENTRIES..(g + 1) * CLUSTER_ENTRIES)?
            .try_into()
            .ok()
    };
    let halves = |c: usize| -> Option<&[u32; CLUSTER_ENTRIES]> {
        let g = *tables.cluster.get(c)? as usize;
        tables
            .halves
            .get(g * CLUSTER_ENTRIES..(g + 1) * CLUSTER_ENTRIES)?
            .try_into()
            .ok()
    };
    if scratch.len() < ch * stride {
        return Err("output shape");
    }
    let mut bit = lanes.starts.map(|s| s * 8);
    let mut base = 0;
    while base < ch {
        let n = (ch - base).min(LANES);
        let mut chan = [0usize; LANES];
        for k in 0..n {
            chan[k] = tables.order[base + k] as usize;
        }
        let mut p = [0usize; LANES];
        let mut ctx = [0usize; LANES];
        if let (Some(fast_end), LANES) = (fast_end, n) {
            let tb = chan.map(pairs);
            let tb = [
                tb[0].ok_or(MISSING)?,
                tb[1].ok_or(MISSING)?,
                tb[2].ok_or(MISSING)?,
                tb[3].ok_or(MISSING)?,
            ];
            let same = chan
                .iter()
                .all(|&c| tables.cluster[c] == tables.cluster[chan[0]]);
            let run = Run {
                data,
                fast_end,
                tokens,
                origin: scratch.as_mut_ptr(),
                rows: chan.map(|c| c * stride),
            };
            if same {
                run_groups::<SYM, CTX, true>(&run, &tb, &mut bit, &mut p, &mut ctx);
            } else {
                run_groups::<SYM, CTX, false>(&run, &tb, &mut bit, &mut p, &mut ctx);
            }
        }
        // Tails (and channels past the last group of four): two-symbol lookups while two
        // symbols are left, the last symbol with a one-symbol lookup.
        for k in 0..n {
            let c = chan[k];
            let run = &mut scratch[c * stride..(c + 1) * stride];
            if p[k] + 1 < tokens {
                let tb = pairs(c).ok_or(MISSING)?;
                while p[k] + 1 < tokens {
                    let mut w = match fast_end {
                        Some(end) if bit[k] <= end => {
                            let b = bit[k] >> 3;
                            let bytes: [u8; 8] = data[b..b + 8].try_into().unwrap_or([0; 8]);
                            u64::from_le_bytes(bytes) >> (bit[k] & 7)
                        }
                        _ => read_bits(data, bit[k]),
                    };
                    // 57 valid bits: five lookups of at most 11 bits.
                    let mut m = 0;
                    while m < LOOKUPS && p[k] + 1 < tokens {
                        let e = tb[ctx[k] | (w as usize & (ENTRIES - 1))];
                        let v = pair_bits::<SYM>(e);
                        if SYM == 8 {
                            run[p[k]..p[k] + 2].copy_from_slice(&(v as u16).to_le_bytes());
                        } else {
                            run[2 * p[k]..2 * p[k] + 4].copy_from_slice(&v.to_le_bytes());
                        }
                        let len = e & 15;
                        w >>= len;
                        bit[k] += len as usize;
                        p[k] += (e >> COUNT_AT) as usize;
                        if CTX {
                            ctx[k] = (e & CTX_BIT) as usize;
                        }
                        m += 1;
                    }
                }
            }
            if p[k] < tokens {
                let tb = halves(c).ok_or(MISSING)?;
                let e = tb[ctx[k] | (read_bits(data, bit[k]) as usize & (ENTRIES - 1))];
                let s = (e >> (SYM_AT + SYM)) & ((1 << SYM) - 1);
                if SYM == 8 {
                    run[p[k]] = s as u8;
                } else {
                    run[2 * p[k]..2 * p[k] + 2].copy_from_slice(&(s as u16).to_le_bytes());
                }
                p[k] += 1;
                bit[k] += (e & 15) as usize;
            }
        }
        base += n;
    }
    Ok(bit)
}

/// What the four-lane fast loop writes to and reads from.
struct Run<'a> {
    data: &'a [u8],
    /// The largest bit position from which 8 bytes can be loaded.
    fast_end: usize,
    tokens: usize,
    /// Start of the scratch buffer; `rows[k]` is the byte offset of lane `k`'s row, which
    /// holds `tokens + 2` elements inside the buffer.
    origin: *mut u8,
    rows: [usize; LANES],
}

/// The four-lane fast loop: whole refill groups while every lane has `GROUP_SYMS` symbols
/// left and 8 readable bytes, the bounds checked once per run of groups. `SAME`: the four
/// lanes use one cluster's tables (one table pointer).
#[inline(always)]
fn run_groups<const SYM: u32, const CTX: bool, const SAME: bool>(
    run: &Run<'_>,
    tb: &[&[u32; CLUSTER_ENTRIES]; LANES],
    bit: &mut [usize; LANES],
    p: &mut [usize; LANES],
    ctx: &mut [usize; LANES],
) {
    let es = if SYM > 8 { 2 } else { 1 };
    let data = run.data;
    loop {
        // Refill groups every lane can run without a bounds check: each consumes at most
        // GROUP_BITS bits and GROUP_SYMS symbols.
        let mut groups = usize::MAX;
        for k in 0..LANES {
            let by_bits = match run.fast_end.checked_sub(bit[k]) {
                Some(room) => room / GROUP_BITS + 1,
                None => 0,
            };
            groups = groups.min(by_bits).min((run.tokens - p[k]) / GROUP_SYMS);
        }
        if groups == 0 {
            return;
        }
        // Cursors into the four rows (element p[k] of row k).
        let mut at = [std::ptr::null_mut::<u8>(); LANES];
        for k in 0..LANES {
            at[k] = run.origin.wrapping_add(run.rows[k] + p[k] * es);
        }
        for _ in 0..groups {
            let mut w = [0u64; LANES];
            for k in 0..LANES {
                // SAFETY: bit[k] <= fast_end = data.len() * 8 - 57 (checked for every group of
                // this run: bit[k] grows by at most GROUP_BITS per group), so the 8 bytes at
                // bit[k] / 8 lie inside `data`.
                let v = unsafe {
                    std::ptr::read_unaligned(data.as_ptr().add(bit[k] >> 3) as *const u64)
                };
                let v = u64::from_le(v) >> (bit[k] & 7);
                w[k] = (v & (SENTINEL - 1)) | SENTINEL;
            }
            for _ in 0..LOOKUPS {
                for k in 0..LANES {
                    let t = if SAME { tb[0] } else { tb[k] };
                    let e = t[(ctx[k] | (w[k] as usize & (ENTRIES - 1))) & (CLUSTER_ENTRIES - 1)];
                    w[k] = w[k].wrapping_shr(e);
                    let v = pair_bits::<SYM>(e);
                    // SAFETY: at[k] is element p[k] of lane k's row, whose `tokens + 2`
                    // elements lie inside the scratch buffer (`Run::rows`); every group of
                    // this run starts with p[k] + GROUP_SYMS <= tokens and advances p[k] by at
                    // most 2 per lookup, so the two elements written are inside the row.
                    unsafe {
                        if SYM == 8 {
                            std::ptr::write_unaligned(at[k] as *mut u16, (v as u16).to_le());
                        } else {
                            std::ptr::write_unaligned(at[k] as *mut u32, v.to_le());
                        }
                    }
                    at[k] = at[k].wrapping_add((e >> COUNT_AT) as usize * es);
                    if CTX {
                        ctx[k] = (e & CTX_BIT) as usize;
                    }
                }
            }
            for k in 0..LANES {
                bit[k] += w[k].leading_zeros() as usize - 6;
            }
        }
        for k in 0..LANES {
            p[k] = (at[k] as usize - run.origin as usize - run.rows[k]) / es;
        }
    }
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
    let locs = &tables.locs;
    // The header allows the wrapping map on int8 only, which `transpose_u8` maps.
    debug_assert!(BPV == 1 || !tables.wrapping);
    if BPV == 2 && REST == 8 {
        low_bits::interleave_f16(scratch, stride, locs, rest, tokens, out);
        return;
    }
    if BPV == 2 && SYM > 8 {
        low_bits::transpose_u16(scratch, stride, locs, REST, tokens, out);
        low_bits::merge_low_bits::<BPV, REST>(rest, out);
        return;
    }
    if BPV == 1 {
        low_bits::transpose_u8(scratch, stride, locs, tables.wrapping, tokens, out);
        return;
    }
    // f32: 9-bit fields in 16-bit scratch elements.
    debug_assert!(BPV == 4 && SYM == 9);
    // Tokens per block: the block's scratch columns stay in L1 while its rows are written.
    const BLOCK: usize = 16;
    let mut t0 = 0;
    while t0 < tokens {
        let t1 = (t0 + BLOCK).min(tokens);
        for c in 0..channels {
            let run = &scratch[c * stride * 2..];
            let loc = locs[c] as u32;
            for t in t0..t1 {
                let r = u16::from_le_bytes([run[2 * t], run[2 * t + 1]]) as u32;
                let v = (from_rel(r, loc, SYM) << REST).to_le_bytes();
                let at = (t * channels + c) * BPV;
                out[at..at + BPV].copy_from_slice(&v[..BPV]);
            }
        }
        t0 = t1;
    }
    if tables.low_byte {
        // Bits 8..=22; the low bytes are ORed in from their stream after.
        low_byte::merge_mid_bits(rest, out);
    } else {
        low_bits::merge_low_bits::<BPV, REST>(rest, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;

    fn header(channels: u32) -> BlobHeader {
        BlobHeader {
            version: super::super::VERSION,
            dtype: Dtype::F16,
            kind: super::super::TensorKind::K,
            tokens: 4,
            channels,
            chunk_tokens: 4,
            group_size: 1,
            sign_context: false,
            shared: true,
            wrapping: false,
            low_byte: false,
            model_len: 0,
            dict_rows: 0,
        }
    }

    fn model(lens: &[u8]) -> Vec<u8> {
        let mut m = vec![1, 0, 0, 0];
        let mut all = vec![0u8; 256];
        all[..lens.len()].copy_from_slice(lens);
        huffman::write_table(&all, &mut m);
        m
    }

    #[test]
    fn incomplete_codes_are_refused_single_symbols_accepted() {
        let mut t = SharedTables::default();
        // Complete: 1, 2, 2.
        let m = model(&[1, 2, 2]);
        t.read(&header(1), &m).unwrap();
        // Incomplete: 2, 2, 2 (a quarter of the code words unowned).
        let m = model(&[2, 2, 2]);
        assert!(matches!(
            t.read(&header(1), &m),
            Err(Error::V2BadTable {
                reason: "code is not complete",
                ..
            })
        ));
        // No symbol at all.
        let m = model(&[]);
        assert!(t.read(&header(1), &m).is_err());
        // One symbol of length 1 owns every code word.
        let m = model(&[0, 0, 1]);
        t.read(&header(1), &m).unwrap();
        assert!(t.halves[..ENTRIES]
            .iter()
            .all(|&e| e == super::super::pair_tables::half_entry::<8>(2, 1, 0)));
        assert!(t.pairs[..ENTRIES].iter().all(|&e| e >> COUNT_AT == 2));
    }

    #[test]
    fn pair_entries_match_two_reference_lookups() {
        let mut t = SharedTables::default();
        let mut h = header(1);
        h.sign_context = true;
        // Context 0: lengths 1, 3, 3, 3, 4, 4 over symbols 0x00, 0x01, 0x80, 0x81, 0x02, 0x82;
        // context 1: a flatter code.
        let mut a = vec![0u8; 256];
        for (s, l) in [
            (0x00, 1),
            (0x01, 3),
            (0x80, 3),
            (0x81, 3),
            (0x02, 4),
            (0x82, 4),
        ] {
            a[s] = l;
        }
        let mut b = vec![0u8; 256];
        for (s, l) in [(0x00, 2), (0x80, 2), (0x01, 2), (0x81, 3), (0x7f, 3)] {
            b[s] = l;
        }
        let mut m = vec![1, 0, 0, 0];
        huffman::write_table(&a, &mut m);
        huffman::write_table(&b, &mut m);
        t.read(&h, &m).unwrap();
        // The one-symbol tables of the straightforward builder, as the reference.
        let mut single = vec![0u16; 2 * ENTRIES];
        for (x, lens) in [a, b].iter().enumerate() {
            let used: Vec<u16> = (0..256u16)
                .filter(|&s| lens[s as usize] > 0)
                .map(|s| s << SYM_SHIFT | lens[s as usize] as u16)
                .collect();
            huffman::build_decode_table_bits(&used, &mut single[x * ENTRIES..], BITS);
        }
        for x in 0..2usize {
            for i in 0..ENTRIES {
                let e = t.pairs[x * ENTRIES + i];
                let e1 = single[x * ENTRIES + i] as u32;
                let (l1, s1) = (e1 & 15, e1 >> SYM_SHIFT);
                assert_eq!((e >> SYM_AT) & 0xff, s1);
                let x1 = (s1 >> 7) as usize;
                if e >> COUNT_AT == 2 {
                    let e2 = single[x1 * ENTRIES + (i >> l1)] as u32;
                    let (l2, s2) = (e2 & 15, e2 >> SYM_SHIFT);
                    assert!(l1 + l2 <= BITS);
                    assert_eq!(e & 15, l1 + l2);
                    assert_eq!((e >> (SYM_AT + 8)) & 0xff, s2);
                    assert_eq!((e & CTX_BIT) >> 11, s2 >> 7);
                } else {
                    assert_eq!(e >> COUNT_AT, 1);
                    assert_eq!(e & 15, l1);
                    assert_eq!((e & CTX_BIT) >> 11, x1 as u32);
                    // No second code fits in the remaining bits.
                    let e2 = single[x1 * ENTRIES + (i >> l1)] as u32;
                    assert!(l1 + (e2 & 15) > BITS);
                }
            }
        }
    }
}
