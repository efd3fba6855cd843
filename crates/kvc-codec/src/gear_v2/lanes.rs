//! The hot loops: coding and decoding the four interleaved Huffman lanes of a chunk, and
//! packing and merging the raw low bits.
//!
//! Channel `c` is coded in lane `c % 4`; a chunk's channels are walked four at a time (one
//! per lane), each for all its tokens, so every lane uses one table (two with the sign
//! context) for a whole run of tokens. Both directions keep a 64-bit bit buffer per lane:
//! the encoder adds up to [`SYMS_PER_WORD`] codes and then stores 8 bytes and advances by the
//! whole bytes written (no branch); the decoder loads 8 unaligned bytes per lane (the only
//! bounds check of the refill, with a zero-padded slow path at the end of the chunk) and
//! decodes [`SYMS_PER_WORD`] symbols from it with one table lookup each.

// The lane loops index several per-lane arrays with one `k`; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use super::encode::LANES;
use super::huffman::{DECODE_ENTRIES, INVALID_ENTRY, MAX_LEN};
use super::values::load;

/// Codes that fit a 64-bit buffer holding up to 7 leftover bits (or read after a refill that
/// shifted out up to 7 bits): `(64 - 7) / MAX_LEN`.
pub(crate) const SYMS_PER_WORD: usize = (64 - 7) / MAX_LEN as usize;
/// Entries of one encode table (the largest alphabet, so that a masked symbol always
/// indexes inside it).
pub(crate) const CODE_ENTRIES: usize = 512;

/// A channel's decode tables as one array: with the sign context, the table for context 1
/// follows the one for context 0, so `ctx << MAX_LEN | bits` indexes both without a branch
/// or a bounds check (the decoder keeps one padding table after the last).
type DecodeTables = [u16; 2 * DECODE_ENTRIES];
type CodeTable = [u16; CODE_ENTRIES];

/// What the lane decoder needs from the blob's model.
pub(crate) struct LaneModel<'a> {
    /// All decode tables, `DECODE_ENTRIES` each, table `group * contexts + ctx`.
    pub tables: &'a [u16],
    /// Channels per token.
    pub channels: usize,
    /// Channels per table group.
    pub group: usize,
    /// Whether the previous token's sign selects the table.
    pub sign_context: bool,
}

/// A coded chunk's bytes and where its four lanes lie in them.
pub(crate) struct Lanes<'a> {
    /// The whole chunk (lanes may read past their end into it; the lengths are checked after).
    pub data: &'a [u8],
    /// Byte offset of each lane in `data`.
    pub starts: [usize; LANES],
    /// Byte length of each lane.
    pub lens: [usize; LANES],
}

impl LaneModel<'_> {
    fn table(&self, channel: usize) -> Option<&DecodeTables> {
        let nctx = if self.sign_context { 2 } else { 1 };
        let t = (channel / self.group) * nctx;
        self.tables
            .get(t * DECODE_ENTRIES..(t + 2) * DECODE_ENTRIES)?
            .try_into()
            .ok()
    }
}

/// Reads 64 bits at bit offset `bit` of `data` (LSB-first) shifted so that bit `bit` is bit
/// 0: at least 57 valid bits. Bytes past the end read as zero.
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

/// Writes the top field `sym` of element `k` of `cell`. When the low bits fill whole bytes
/// (f16, i8) only the top byte is stored (the low bytes were merged before); otherwise the
/// whole element is written with zero low bits, merged after.
#[inline(always)]
fn put<const BPV: usize, const REST: u32>(cell: &mut [u8], k: usize, sym: u32) {
    if REST % 8 == 0 {
        cell[k * BPV + REST as usize / 8] = sym as u8;
    } else {
        let v = (sym << REST).to_le_bytes();
        cell[k * BPV..k * BPV + BPV].copy_from_slice(&v[..BPV]);
    }
}

/// Decodes the lanes of a coded chunk and merges the low bits `rest` into `out` (whole
/// tokens). Errors are the reason of a `V2BadChunk`.
pub(crate) fn decode_coded<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneModel<'_>,
    lanes: &Lanes<'_>,
    rest: &[u8],
    out: &mut [u8],
) -> Result<(), &'static str> {
    if REST % 8 == 0 {
        merge_low_bytes::<BPV, REST>(rest, out);
    }
    let bits = if model.sign_context {
        decode_lanes::<BPV, REST, SYM, true>(model, lanes, out)?
    } else {
        decode_lanes::<BPV, REST, SYM, false>(model, lanes, out)?
    };
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
    if REST % 8 != 0 {
        merge_low_bits::<BPV, REST>(rest, out);
    }
    Ok(())
}

fn decode_lanes<const BPV: usize, const REST: u32, const SYM: u32, const CTX: bool>(
    model: &LaneModel<'_>,
    lanes: &Lanes<'_>,
    out: &mut [u8],
) -> Result<[usize; LANES], &'static str> {
    const MISSING: &str = "table missing for a channel";
    let ch = model.channels;
    let row = ch * BPV;
    let tokens = out.len() / row;
    let data = lanes.data;
    let mut bit = lanes.starts.map(|s| s * 8);
    let mut flags = 0u16;
    let mut base = 0;
    while base + LANES <= ch {
        let mut tb = [model.table(base).ok_or(MISSING)?; LANES];
        for k in 0..LANES {
            tb[k] = model.table(base + k).ok_or(MISSING)?;
        }
        let mut ctx = [0usize; LANES];
        let mut t = 0;
        while t < tokens {
            let n = SYMS_PER_WORD.min(tokens - t);
            let mut w = [0u64; LANES];
            for k in 0..LANES {
                w[k] = read_bits(data, bit[k]);
            }
            let mut used = [0u32; LANES];
            for s in 0..n {
                let at = (t + s) * row + base * BPV;
                let Some(cell) = out.get_mut(at..at + LANES * BPV) else {
                    return Err("output shape");
                };
                for k in 0..LANES {
                    let e = tb[k][ctx[k] | (w[k] as usize & (DECODE_ENTRIES - 1))];
                    let len = (e & 15) as u32;
                    w[k] >>= len;
                    used[k] += len;
                    flags |= e;
                    let sym = (e >> 4) as u32;
                    put::<BPV, REST>(cell, k, sym);
                    if CTX {
                        ctx[k] = (((sym >> (SYM - 1)) & 1) as usize) << MAX_LEN;
                    }
                }
            }
            for k in 0..LANES {
                bit[k] += used[k] as usize;
            }
            t += n;
        }
        base += LANES;
    }
    // The last `channels % 4` channels, one per lane.
    for c in base..ch {
        let k = c - base;
        let tb = model.table(c).ok_or(MISSING)?;
        let mut ctx = 0usize;
        let mut t = 0;
        while t < tokens {
            let n = SYMS_PER_WORD.min(tokens - t);
            let mut w = read_bits(data, bit[k]);
            for s in 0..n {
                let at = (t + s) * row + c * BPV;
                let Some(cell) = out.get_mut(at..at + BPV) else {
                    return Err("output shape");
                };
                let e = tb[ctx | (w as usize & (DECODE_ENTRIES - 1))];
                let len = (e & 15) as u32;
                w >>= len;
                bit[k] += len as usize;
                flags |= e;
                let sym = (e >> 4) as u32;
                put::<BPV, REST>(cell, 0, sym);
                if CTX {
                    ctx = (((sym >> (SYM - 1)) & 1) as usize) << MAX_LEN;
                }
            }
            t += n;
        }
    }
    if flags & INVALID_ENTRY != 0 {
        return Err("invalid Huffman code");
    }
    Ok(bit)
}

/// Low bits that are whole bytes (f16: the low byte) go first; the top byte follows.
fn merge_low_bytes<const BPV: usize, const REST: u32>(rest: &[u8], out: &mut [u8]) {
    if REST == 8 && BPV == 2 {
        for (o, &l) in out.chunks_exact_mut(2).zip(rest) {
            o[0] = l;
            o[1] = 0;
        }
    }
}

/// ORs the packed low bits (`REST` bits per element, LSB-first) into the elements of `out`.
fn merge_low_bits<const BPV: usize, const REST: u32>(rest: &[u8], out: &mut [u8]) {
    let mask = (1u64 << REST) - 1;
    let mut done = 0;
    if BPV == 2 && REST == 7 {
        // bf16: eight elements per 7 bytes.
        for (o, r) in out.chunks_exact_mut(16).zip(rest.chunks_exact(7)) {
            let mut a = [0u8; 8];
            a[..7].copy_from_slice(r);
            let w = u64::from_le_bytes(a);
            for i in 0..8 {
                let v =
                    u16::from_le_bytes([o[2 * i], o[2 * i + 1]]) | ((w >> (7 * i)) & 0x7f) as u16;
                o[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        done = (out.len() / 16).min(rest.len() / 7) * 8;
    }
    let values = out.len() / BPV;
    for j in done..values {
        let v = load::<BPV>(out, j) as u64 | (read_bits(rest, j * REST as usize) & mask);
        out[j * BPV..j * BPV + BPV].copy_from_slice(&(v as u32).to_le_bytes()[..BPV]);
    }
}

/// Appends the coded lanes of a chunk to `out` (after the mode byte and the lane lengths,
/// which are filled in): `codes` holds `CODE_ENTRIES` codes (`rev | len << 12`) per table.
pub(crate) fn encode_lanes<const BPV: usize, const REST: u32, const SYM: u32>(
    codes: &[u16],
    group: usize,
    sign_context: bool,
    channels: usize,
    raw: &[u8],
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    if sign_context {
        encode_lanes_ctx::<BPV, REST, SYM, true>(codes, group, channels, raw, out, lens_at)
    } else {
        encode_lanes_ctx::<BPV, REST, SYM, false>(codes, group, channels, raw, out, lens_at)
    }
}

fn code_table(codes: &[u16], group: usize, nctx: usize, channel: usize, ctx: usize) -> &CodeTable {
    let t = (channel / group) * nctx + ctx.min(nctx - 1);
    codes[t * CODE_ENTRIES..(t + 1) * CODE_ENTRIES]
        .try_into()
        .expect("the model has a table for every channel")
}

struct LaneWriter {
    pos: [usize; LANES],
    acc: [u64; LANES],
    n: [u32; LANES],
}

impl LaneWriter {
    #[inline(always)]
    fn add(&mut self, k: usize, code: u16) {
        self.acc[k] |= ((code & 0xfff) as u64) << self.n[k];
        self.n[k] += (code >> 12) as u32;
    }
    #[inline(always)]
    fn flush(&mut self, k: usize, out: &mut [u8]) {
        out[self.pos[k]..self.pos[k] + 8].copy_from_slice(&self.acc[k].to_le_bytes());
        self.pos[k] += (self.n[k] >> 3) as usize;
        self.acc[k] >>= self.n[k] & !7;
        self.n[k] &= 7;
    }
}

fn encode_lanes_ctx<const BPV: usize, const REST: u32, const SYM: u32, const CTX: bool>(
    codes: &[u16],
    group: usize,
    channels: usize,
    raw: &[u8],
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    let nctx = if CTX { 2 } else { 1 };
    let row = channels * BPV;
    let tokens = raw.len() / row;
    // Each lane gets a region big enough for its worst case plus the 8-byte flush slack.
    let mut starts = [0usize; LANES];
    let mut at = out.len();
    for (k, s) in starts.iter_mut().enumerate() {
        *s = at;
        let lane_channels = (channels + LANES - 1 - k) / LANES;
        at += (lane_channels * tokens * MAX_LEN as usize).div_ceil(8) + 8;
    }
    out.resize(at, 0);
    let mut w = LaneWriter {
        pos: starts,
        acc: [0; LANES],
        n: [0; LANES],
    };
    let sym_mask = (CODE_ENTRIES - 1) as u32;
    let mut base = 0;
    while base + LANES <= channels {
        let mut t0 = [code_table(codes, group, nctx, base, 0); LANES];
        let mut t1 = t0;
        for k in 0..LANES {
            t0[k] = code_table(codes, group, nctx, base + k, 0);
            t1[k] = code_table(codes, group, nctx, base + k, 1);
        }
        let mut cur = t0;
        let mut t = 0;
        while t < tokens {
            let n = SYMS_PER_WORD.min(tokens - t);
            for s in 0..n {
                let at = (t + s) * row + base * BPV;
                let cell = &raw[at..at + LANES * BPV];
                for k in 0..LANES {
                    let sym = (load::<BPV>(cell, k) >> REST) & sym_mask;
                    w.add(k, cur[k][sym as usize]);
                    if CTX {
                        cur[k] = if (sym >> (SYM - 1)) & 1 != 0 {
                            t1[k]
                        } else {
                            t0[k]
                        };
                    }
                }
            }
            for k in 0..LANES {
                w.flush(k, out);
            }
            t += n;
        }
        base += LANES;
    }
    for c in base..channels {
        let k = c - base;
        let (t0, t1) = (
            code_table(codes, group, nctx, c, 0),
            code_table(codes, group, nctx, c, 1),
        );
        let mut cur = t0;
        let mut t = 0;
        while t < tokens {
            let n = SYMS_PER_WORD.min(tokens - t);
            for s in 0..n {
                let sym = (load::<BPV>(raw, (t + s) * channels + c) >> REST) & sym_mask;
                w.add(k, cur[sym as usize]);
                if CTX {
                    cur = if (sym >> (SYM - 1)) & 1 != 0 { t1 } else { t0 };
                }
            }
            w.flush(k, out);
            t += n;
        }
    }
    // Final partial bytes, then the lanes moved together.
    let mut end = lens_at + 4 * LANES;
    for k in 0..LANES {
        w.flush(k, out);
        if w.n[k] > 0 {
            w.pos[k] += 1;
        }
        let len = w.pos[k] - starts[k];
        out.copy_within(starts[k]..w.pos[k], end);
        out[lens_at + 4 * k..lens_at + 4 * k + 4].copy_from_slice(&(len as u32).to_le_bytes());
        end += len;
    }
    out.truncate(end);
}

/// Appends the low `REST` bits of every element of `raw`, packed LSB-first.
pub(crate) fn pack_low_bits<const BPV: usize, const REST: u32>(raw: &[u8], out: &mut Vec<u8>) {
    if REST == 0 {
        return;
    }
    let values = raw.len() / BPV;
    let at = out.len();
    let total = (values * REST as usize).div_ceil(8);
    if REST == 8 && BPV == 2 {
        out.resize(at + values, 0);
        for (d, s) in out[at..].iter_mut().zip(raw.chunks_exact(2)) {
            *d = s[0];
        }
        return;
    }
    // Generic: a 64-bit buffer, 8 bytes stored per flush (slack trimmed at the end).
    out.resize(at + total + 8, 0);
    let mask = (1u64 << REST) - 1;
    let (mut pos, mut acc, mut n) = (at, 0u64, 0u32);
    let per_flush = ((64 - 7) / REST).max(1) as usize;
    let mut j = 0;
    while j < values {
        let m = per_flush.min(values - j);
        for i in j..j + m {
            acc |= (load::<BPV>(raw, i) as u64 & mask) << n;
            n += REST;
        }
        out[pos..pos + 8].copy_from_slice(&acc.to_le_bytes());
        pos += (n >> 3) as usize;
        acc = if n >= 64 { 0 } else { acc >> (n & !7) };
        n &= 7;
        j += m;
    }
    out[pos..pos + 8].copy_from_slice(&acc.to_le_bytes());
    out.truncate(at + total);
}
