//! The encoder's hot loops: coding the four interleaved Huffman lanes of a chunk and packing
//! the raw low bits (decoding is in `lane_decode` and `low_bits`).
//!
//! Channel `c` is coded in lane `c % 4` (shared-shape model: position `i` of the cluster
//! order in lane `i % 4`); a chunk's channels are walked four at a time (one
//! per lane), each for all its tokens, so every lane uses one table (two with the sign
//! context) for a whole run of tokens. Each lane keeps a 64-bit bit buffer: the encoder adds
//! up to [`SYMS_PER_WORD`] codes and then stores 8 bytes and advances by the whole bytes
//! written (no branch).

// The lane loops index several per-lane arrays with one `k`; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use super::encode::LANES;
use super::huffman::{MAX_LEN, MAX_LEN_ANY};
use super::shared::RelMap;
use super::values::load;

/// Codes that fit a 64-bit buffer holding up to 7 leftover bits (or read after a refill that
/// shifted out up to 7 bits): `(64 - 7) / MAX_LEN`.
pub(crate) const SYMS_PER_WORD: usize = (64 - 7) / MAX_LEN as usize;
/// Entries of one encode table (the largest alphabet, so that a masked symbol always
/// indexes inside it).
pub(crate) const CODE_ENTRIES: usize = 512;

type CodeTable = [u16; CODE_ENTRIES];

/// What the lane encoder needs from the model.
pub(crate) struct LaneCodes<'a> {
    /// `CODE_ENTRIES` codes (`rev | len << 12`) per table.
    pub codes: &'a [u16],
    /// Table (for context 0; context 1 is the next one) of every channel.
    pub chan_table: &'a [u32],
    /// Usual top field of every channel: symbols are coded relative to it with `map` (0
    /// with the sign-magnitude map leaves them unchanged).
    pub chan_loc: &'a [u16],
    /// How symbols are made relative to their channel's location.
    pub map: RelMap,
    /// Channels in lane order (position `i` in lane `i % 4`); empty: channel order.
    pub order: &'a [u16],
    /// Whether the previous token's (relative) sign selects the table.
    pub sign_context: bool,
    /// The longest code length (9 or 11).
    pub max_len: u32,
}

/// Appends the coded lanes of a chunk to `out` (after the mode byte and the lane lengths,
/// which are filled in).
pub(crate) fn encode_lanes<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneCodes<'_>,
    channels: usize,
    raw: &[u8],
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("bmi2") {
        // SAFETY: the CPU supports BMI2, checked just above; the function is otherwise safe.
        unsafe { encode_lanes_bmi2::<BPV, REST, SYM>(model, channels, raw, out, lens_at) };
        return;
    }
    encode_lanes_any::<BPV, REST, SYM>(model, channels, raw, out, lens_at)
}

/// [`encode_lanes`] compiled with BMI2 (shifts by a register without `cl`).
///
/// # Safety
/// The CPU must support BMI2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2")]
unsafe fn encode_lanes_bmi2<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneCodes<'_>,
    channels: usize,
    raw: &[u8],
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    encode_lanes_any::<BPV, REST, SYM>(model, channels, raw, out, lens_at)
}

#[inline(always)]
fn encode_lanes_any<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &LaneCodes<'_>,
    channels: usize,
    raw: &[u8],
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    match (model.sign_context, model.max_len > MAX_LEN) {
        (true, false) => encode_lanes_ctx::<BPV, REST, SYM, true, SYMS_PER_WORD>(
            model, channels, raw, out, lens_at,
        ),
        (false, false) => encode_lanes_ctx::<BPV, REST, SYM, false, SYMS_PER_WORD>(
            model, channels, raw, out, lens_at,
        ),
        (true, true) => encode_lanes_ctx::<BPV, REST, SYM, true, SYMS_PER_WORD_LONG>(
            model, channels, raw, out, lens_at,
        ),
        (false, true) => encode_lanes_ctx::<BPV, REST, SYM, false, SYMS_PER_WORD_LONG>(
            model, channels, raw, out, lens_at,
        ),
    }
}

/// Codes of up to `MAX_LEN_ANY` (11) bits per 64-bit buffer: `(64 - 7) / 11`.
pub(crate) const SYMS_PER_WORD_LONG: usize = (64 - 7) / MAX_LEN_ANY as usize;

fn code_table<'a>(model: &LaneCodes<'a>, channel: usize, ctx: usize) -> &'a CodeTable {
    let t = model.chan_table[channel] as usize + ctx;
    model.codes[t * CODE_ENTRIES..(t + 1) * CODE_ENTRIES]
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

#[inline(always)]
fn encode_lanes_ctx<
    const BPV: usize,
    const REST: u32,
    const SYM: u32,
    const CTX: bool,
    const SPW: usize,
>(
    model: &LaneCodes<'_>,
    channels: usize,
    raw: &[u8],
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    let row = channels * BPV;
    let tokens = raw.len() / row;
    let max_len = model.max_len as usize;
    // Each lane gets a region big enough for its worst case plus the 8-byte flush slack.
    let mut starts = [0usize; LANES];
    let mut at = out.len();
    for (k, s) in starts.iter_mut().enumerate() {
        *s = at;
        let lane_channels = (channels + LANES - 1 - k) / LANES;
        at += (lane_channels * tokens * max_len).div_ceil(8) + 8;
    }
    out.resize(at, 0);
    let mut w = LaneWriter {
        pos: starts,
        acc: [0; LANES],
        n: [0; LANES],
    };
    let sym_mask = (1u32 << SYM) - 1;
    let chan = |i: usize| model.order.get(i).map_or(i, |&c| c as usize);
    let mut base = 0;
    while base + LANES <= channels {
        let mut t0 = [code_table(model, chan(base), 0); LANES];
        let mut t1 = t0;
        let mut loc = [0u32; LANES];
        let mut ch = [0usize; LANES];
        for k in 0..LANES {
            ch[k] = chan(base + k);
            t0[k] = code_table(model, ch[k], 0);
            t1[k] = code_table(model, ch[k], CTX as usize);
            loc[k] = model.chan_loc[ch[k]] as u32;
        }
        let mut cur = t0;
        let mut t = 0;
        while t < tokens {
            let n = SPW.min(tokens - t);
            for s in 0..n {
                let cell = &raw[(t + s) * row..(t + s + 1) * row];
                for k in 0..LANES {
                    let top = (load::<BPV>(cell, ch[k]) >> REST) & sym_mask;
                    let sym = model.map.relative(top, loc[k]);
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
    for i in base..channels {
        let k = i - base;
        let c = chan(i);
        let (t0, t1) = (code_table(model, c, 0), code_table(model, c, CTX as usize));
        let loc = model.chan_loc[c] as u32;
        let mut cur = t0;
        let mut t = 0;
        while t < tokens {
            let n = SPW.min(tokens - t);
            for s in 0..n {
                let top = (load::<BPV>(raw, (t + s) * channels + c) >> REST) & sym_mask;
                let sym = model.map.relative(top, loc);
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
        super::low_bits::split_low_bytes(raw, &mut out[at..]);
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
