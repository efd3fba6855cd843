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
use super::values::load;

/// Codes that fit a 64-bit buffer holding up to 7 leftover bits (or read after a refill that
/// shifted out up to 7 bits): `(64 - 7) / MAX_LEN`.
pub(crate) const SYMS_PER_WORD: usize = (64 - 7) / MAX_LEN as usize;
/// Entries of one encode table (the largest alphabet, so that a masked symbol always
/// indexes inside it).
pub(crate) const CODE_ENTRIES: usize = 512;

/// What the lane encoder needs from the model.
pub(crate) struct LaneCodes<'a> {
    /// `CODE_ENTRIES` code words (bit-reversed, so LSB-first) per table.
    pub bits: &'a [u16],
    /// The code lengths, indexed as `bits`.
    pub lens: &'a [u8],
    /// Table (for context 0; context 1 is the next one) of every channel.
    pub chan_table: &'a [u32],
    /// Channels in lane order (position `i` in lane `i % 4`); empty: channel order.
    pub order: &'a [u16],
    /// Whether the previous token's (relative) sign selects the table.
    pub sign_context: bool,
    /// The longest code length (9 or 11).
    pub max_len: u32,
}

/// Appends the coded lanes of a chunk to `out` (after the mode byte and the lane lengths,
/// which are filled in), from the code index of every value (`code_index`, channel-major:
/// channel `c`'s at `c * tokens..`). The lanes are coded into `scratch` first (kept by the
/// caller: grown, and so zeroed, only when a chunk needs more room than any before).
pub(crate) fn encode_lanes(
    model: &LaneCodes<'_>,
    channels: usize,
    idx: &[u16],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("bmi2") {
        // SAFETY: the CPU supports BMI2, checked just above; the function is otherwise safe.
        unsafe { encode_lanes_bmi2(model, channels, idx, scratch, out, lens_at) };
        return;
    }
    encode_lanes_any(model, channels, idx, scratch, out, lens_at)
}

/// [`encode_lanes`] compiled with BMI2 (shifts by a register without `cl`).
///
/// # Safety
/// The CPU must support BMI2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2")]
unsafe fn encode_lanes_bmi2(
    model: &LaneCodes<'_>,
    channels: usize,
    idx: &[u16],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    encode_lanes_any(model, channels, idx, scratch, out, lens_at)
}

#[inline(always)]
fn encode_lanes_any(
    model: &LaneCodes<'_>,
    channels: usize,
    idx: &[u16],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    const PAIR: usize = 2 * CODE_ENTRIES;
    match (model.sign_context, model.max_len > MAX_LEN) {
        (true, false) => {
            encode_lanes_with::<PAIR, SYMS_PER_WORD>(model, channels, idx, scratch, out, lens_at)
        }
        (false, false) => encode_lanes_with::<CODE_ENTRIES, SYMS_PER_WORD>(
            model, channels, idx, scratch, out, lens_at,
        ),
        (true, true) => encode_lanes_with::<PAIR, SYMS_PER_WORD_LONG>(
            model, channels, idx, scratch, out, lens_at,
        ),
        (false, true) => encode_lanes_with::<CODE_ENTRIES, SYMS_PER_WORD_LONG>(
            model, channels, idx, scratch, out, lens_at,
        ),
    }
}

/// Codes of up to `MAX_LEN_ANY` (11) bits per 64-bit buffer: `(64 - 7) / 11`.
pub(crate) const SYMS_PER_WORD_LONG: usize = (64 - 7) / MAX_LEN_ANY as usize;

/// The `N` code words and lengths from channel `channel`'s context-0 table: the table, and
/// with the sign context (`N = 2 * CODE_ENTRIES`) its context-1 table after it.
fn code_tables<'a, const N: usize>(
    model: &LaneCodes<'a>,
    channel: usize,
) -> (&'a [u16; N], &'a [u8; N]) {
    let t = model.chan_table[channel] as usize * CODE_ENTRIES;
    let table = "the model has a table for every channel and context";
    (
        model.bits[t..t + N].try_into().expect(table),
        model.lens[t..t + N].try_into().expect(table),
    )
}

/// One lane's output: its write position and 64-bit bit buffer.
struct LaneWriter {
    pos: usize,
    acc: u64,
    n: u32,
}

impl LaneWriter {
    #[inline(always)]
    fn add(&mut self, bits: u16, len: u8) {
        self.acc |= (bits as u64) << self.n;
        self.n += len as u32;
    }
    #[inline(always)]
    fn flush(&mut self, out: &mut [u8]) {
        out[self.pos..self.pos + 8].copy_from_slice(&self.acc.to_le_bytes());
        self.pos += (self.n >> 3) as usize;
        self.acc >>= self.n & !7;
        self.n &= 7;
    }
}

/// The lane loop with tables of `N` codes per channel (one or two contexts) and `SPW` codes
/// per 64-bit buffer.
#[inline(always)]
fn encode_lanes_with<const N: usize, const SPW: usize>(
    model: &LaneCodes<'_>,
    channels: usize,
    idx: &[u16],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
    lens_at: usize,
) {
    let tokens = idx.len() / channels;
    let max_len = model.max_len as usize;
    // Each lane gets a region of `scratch` big enough for its worst case plus the 8-byte
    // flush slack. Every flush stores whole 8-byte words from the bit buffer, so what the
    // regions held before does not matter: they are not cleared.
    let mut starts = [0usize; LANES];
    let mut at = 0;
    for (k, s) in starts.iter_mut().enumerate() {
        *s = at;
        let lane_channels = (channels + LANES - 1 - k) / LANES;
        at += (lane_channels * tokens * max_len).div_ceil(8) + 8;
    }
    if scratch.len() < at {
        scratch.resize(at, 0);
    }
    let buf = &mut scratch[..];
    let chan = |i: usize| model.order.get(i).map_or(i, |&c| c as usize);
    // One lane at a time (each has its own region and bit buffer, so the order of the lanes
    // does not change the bytes): the writer stays in registers, and the bit appending is a
    // one-cycle dependency chain per code, not latency-bound.
    debug_assert_eq!(out.len(), lens_at + 4 * LANES);
    for (k, &start) in starts.iter().enumerate() {
        let mut w = LaneWriter {
            pos: start,
            acc: 0,
            n: 0,
        };
        for i in (k..channels).step_by(LANES) {
            let c = chan(i);
            let (bits, lens) = code_tables::<N>(model, c);
            let add = |w: &mut LaneWriter, x: u16| {
                let x = x as usize & (N - 1);
                w.add(bits[x], lens[x]);
            };
            // Whole runs of `SPW` codes without a test per code, then the rest.
            let mut runs = idx[c * tokens..(c + 1) * tokens].chunks_exact(SPW);
            for run in &mut runs {
                for &x in run {
                    add(&mut w, x);
                }
                w.flush(buf);
            }
            for &x in runs.remainder() {
                add(&mut w, x);
            }
            w.flush(buf);
        }
        // The final partial byte, then the lane moved after the previous ones.
        w.flush(buf);
        if w.n > 0 {
            w.pos += 1;
        }
        let len = w.pos - start;
        out.extend_from_slice(&buf[start..w.pos]);
        out[lens_at + 4 * k..lens_at + 4 * k + 4].copy_from_slice(&(len as u32).to_le_bytes());
    }
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
    out.resize(at + total + 8, 0);
    // Whole groups of eight values of up to 8 bits fill whole bytes: one 64-bit store each
    // (bf16's 7 bits: 8 values in 7 bytes).
    let mut j = 0;
    let mut pos = at;
    if REST <= 8 {
        let group = REST as usize;
        for (g, vals) in raw.chunks_exact(8 * BPV).enumerate() {
            let mut acc = 0u64;
            for i in 0..8 {
                acc |= (load::<BPV>(vals, i) as u64 & ((1 << REST) - 1)) << (REST as usize * i);
            }
            let p = at + g * group;
            out[p..p + 8].copy_from_slice(&acc.to_le_bytes());
        }
        j = values / 8 * 8;
        pos = at + values / 8 * group;
    }
    // The rest: a 64-bit buffer, 8 bytes stored per flush (slack trimmed at the end).
    let mask = (1u64 << REST) - 1;
    let (mut acc, mut n) = (0u64, 0u32);
    let per_flush = ((64 - 7) / REST).max(1) as usize;
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
