//! K per channel over token groups (KIVI): `group` consecutive tokens of one KV head are
//! coded together, each of the `head_dim` channels with its own f16 minimum and step over
//! those tokens, so an outlier channel gets its own range instead of stretching every
//! other channel's. No rotation: the point is to follow the channels as the model made
//! them.
//!
//! A block (`docs/formats/kvq.md`, "Channel groups") is `head_dim` f16 steps, then
//! `head_dim` f16 minimums, then `group` rows of `head_dim` codes of `bits` bits, each row
//! an LSB-first bit stream as in kvq rows. Token `i` of a cache is row `i % group` of block
//! `i / group`; the engine holds the newest tokens of an unfilled group in f16 until it
//! fills (their bytes are the engine's to count). Value: `min + code * step`, codes
//! `0..2^bits`.

use half::f16;

use super::row::{pack, unpack};
use crate::error::{Error, Result};

/// Tokens per group that a codec accepts.
pub const GROUPS: [usize; 5] = [16, 32, 64, 128, 256];

/// Codes `group` rows of `head_dim` values per block, each channel with its own range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelGroupCodec {
    bits: u8,
    dim: usize,
    group: usize,
}

impl ChannelGroupCodec {
    /// A codec for `bits` (2..=8) bits per value, rows of `dim` values (64, 128, 256) and
    /// `group` tokens per block (16, 32, 64, 128, 256).
    pub fn new(bits: u8, dim: usize, group: usize) -> Result<ChannelGroupCodec> {
        super::config::check_bits("bits", bits)?;
        if ![64, 128, 256].contains(&dim) {
            return Err(Error::Unsupported {
                what: "head_dim",
                value: dim as i64,
            });
        }
        if !GROUPS.contains(&group) {
            return Err(Error::InvalidValue {
                what: "group",
                value: group as i64,
                reason: "tokens per channel group must be 16, 32, 64, 128 or 256",
            });
        }
        Ok(ChannelGroupCodec { bits, dim, group })
    }

    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Rows (tokens) per block.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Bytes of one row's codes.
    pub fn row_code_bytes(&self) -> usize {
        self.dim * usize::from(self.bits) / 8
    }

    /// Bytes of one block: the f16 steps and minimums, then the codes.
    pub fn block_bytes(&self) -> usize {
        4 * self.dim + self.group * self.row_code_bytes()
    }

    /// Bits per value, the steps and minimums counted.
    pub fn bits_per_value(&self) -> f64 {
        8.0 * self.block_bytes() as f64 / (self.group * self.dim) as f64
    }

    fn check_rows(&self, what: &'static str, len: usize) -> Result<()> {
        let n = self.group * self.dim;
        if len != n {
            return Err(Error::LayoutMismatch {
                what,
                expected: n,
                found: len,
            });
        }
        Ok(())
    }

    fn check_block(&self, what: &'static str, len: usize) -> Result<()> {
        if len < self.block_bytes() {
            return Err(Error::BufferTooSmall {
                what,
                needed: self.block_bytes(),
                found: len,
            });
        }
        Ok(())
    }

    /// Codes `rows` (`group * head_dim` values, token-major: row `t` is
    /// `rows[t * head_dim..]`) into the first `block_bytes` bytes of `out`. A non-finite
    /// value, or one outside f16's range, is an error and leaves `out` unwritten. No
    /// allocation.
    pub fn quantize_block(&self, rows: &[f32], out: &mut [u8]) -> Result<()> {
        self.check_rows("rows (group * head_dim)", rows.len())?;
        self.check_block("block", out.len())?;
        if let Some(i) = rows
            .iter()
            .position(|x| x.is_nan() || x.abs() > f16::MAX.to_f32())
        {
            let v = rows[i];
            return Err(Error::BadValue {
                what: "channel group rows",
                row: i / self.dim,
                element: i % self.dim,
                value: v,
                reason: if v.is_finite() {
                    "is outside f16's range (|value| <= 65504)"
                } else {
                    "is not finite"
                },
            });
        }
        let d = self.dim;
        let levels = ((1u32 << self.bits) - 1) as f32;
        let (head, codes) = out[..self.block_bytes()].split_at_mut(4 * d);
        let (steps, mins) = head.split_at_mut(2 * d);
        let mut step = [0f32; 256];
        let mut lo = [0f32; 256];
        for c in 0..d {
            let (mut a, mut b) = (f32::INFINITY, f32::NEG_INFINITY);
            for t in 0..self.group {
                let x = rows[t * d + c];
                a = a.min(x);
                b = b.max(x);
            }
            // The minimum is rounded down to an f16 so that no value falls below it; the
            // step is rounded up so that `min + levels * step` still reaches the maximum.
            let m = f16_down(a);
            let s = f16_up((b - m.to_f32()) / levels);
            lo[c] = m.to_f32();
            step[c] = s.to_f32();
            steps[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
            mins[2 * c..2 * c + 2].copy_from_slice(&m.to_le_bytes());
        }
        let rb = self.row_code_bytes();
        let mut q = [0u8; 256];
        for (t, o) in codes.chunks_exact_mut(rb).enumerate() {
            let x = &rows[t * d..(t + 1) * d];
            for c in 0..d {
                q[c] = if step[c] > 0.0 {
                    ((x[c] - lo[c]) / step[c]).round().clamp(0.0, levels) as u8
                } else {
                    0
                };
            }
            pack(&q[..d], u32::from(self.bits), o);
        }
        Ok(())
    }

    /// Decodes a block (`block.len() >= block_bytes`) into `out` (`group * head_dim`
    /// values, token-major). A non-finite step or minimum is an error. No allocation.
    pub fn dequantize_block(&self, block: &[u8], out: &mut [f32]) -> Result<()> {
        self.check_rows("out (group * head_dim)", out.len())?;
        self.check_block("block", block.len())?;
        let (step, lo) = self.ranges(block)?;
        let d = self.dim;
        let rb = self.row_code_bytes();
        let codes = &block[4 * d..self.block_bytes()];
        let mut q = [0u8; 256];
        for (r, o) in codes.chunks_exact(rb).zip(out.chunks_exact_mut(d)) {
            unpack(r, u32::from(self.bits), &mut q[..d]);
            for c in 0..d {
                o[c] = lo[c] + f32::from(q[c]) * step[c];
            }
        }
        Ok(())
    }

    /// Decodes row `row` (`< group`) of a block into `out` (`head_dim` values).
    pub fn dequantize_row(&self, block: &[u8], row: usize, out: &mut [f32]) -> Result<()> {
        self.check_block("block", block.len())?;
        if out.len() != self.dim {
            return Err(Error::LayoutMismatch {
                what: "out (head_dim)",
                expected: self.dim,
                found: out.len(),
            });
        }
        if row >= self.group {
            return Err(Error::InvalidValue {
                what: "row",
                value: row as i64,
                reason: "a block holds `group` rows",
            });
        }
        let (step, lo) = self.ranges(block)?;
        let d = self.dim;
        let rb = self.row_code_bytes();
        let at = 4 * d + row * rb;
        let mut q = [0u8; 256];
        unpack(&block[at..at + rb], u32::from(self.bits), &mut q[..d]);
        for c in 0..d {
            out[c] = lo[c] + f32::from(q[c]) * step[c];
        }
        Ok(())
    }

    /// Scores `q . row` for every row of a block into `scores` (`group` values), read from
    /// the codes: `q . min + sum_c (q_c step_c) code_c`, so the per-channel ranges are
    /// applied once per block, not once per row. No allocation.
    pub fn dot_block(&self, q: &[f32], block: &[u8], scores: &mut [f32]) -> Result<()> {
        self.check_block("block", block.len())?;
        if q.len() != self.dim {
            return Err(Error::LayoutMismatch {
                what: "q (head_dim)",
                expected: self.dim,
                found: q.len(),
            });
        }
        if scores.len() != self.group {
            return Err(Error::LayoutMismatch {
                what: "scores (group)",
                expected: self.group,
                found: scores.len(),
            });
        }
        let (step, lo) = self.ranges(block)?;
        let d = self.dim;
        let mut qs = [0f32; 256];
        let mut base = 0f32;
        for c in 0..d {
            qs[c] = q[c] * step[c];
            base += q[c] * lo[c];
        }
        let rb = self.row_code_bytes();
        let mut codes = [0u8; 256];
        for (r, s) in block[4 * d..self.block_bytes()]
            .chunks_exact(rb)
            .zip(scores.iter_mut())
        {
            unpack(r, u32::from(self.bits), &mut codes[..d]);
            let mut acc = [0f32; 8];
            for (cq, cc) in qs[..d].chunks_exact(8).zip(codes[..d].chunks_exact(8)) {
                for j in 0..8 {
                    acc[j] += cq[j] * f32::from(cc[j]);
                }
            }
            *s = base + acc.iter().sum::<f32>();
        }
        Ok(())
    }

    /// The block's steps and minimums as f32; a non-finite one is an error.
    fn ranges(&self, block: &[u8]) -> Result<([f32; 256], [f32; 256])> {
        let d = self.dim;
        let mut step = [0f32; 256];
        let mut lo = [0f32; 256];
        for c in 0..d {
            let s = f16::from_le_bytes([block[2 * c], block[2 * c + 1]]).to_f32();
            let m = f16::from_le_bytes([block[2 * d + 2 * c], block[2 * d + 2 * c + 1]]).to_f32();
            if !s.is_finite() || s < 0.0 {
                return Err(Error::CorruptRow {
                    what: "a channel step (negative or not finite)",
                    row: c,
                });
            }
            if !m.is_finite() {
                return Err(Error::CorruptRow {
                    what: "a channel minimum",
                    row: c,
                });
            }
            step[c] = s;
            lo[c] = m;
        }
        Ok((step, lo))
    }
}

/// The largest f16 not above `x` (finite `x` within f16's range).
fn f16_down(x: f32) -> f16 {
    let h = f16::from_f32(x);
    if h.to_f32() > x {
        prev_f16(h)
    } else {
        h
    }
}

/// The smallest f16 not below `x` (finite `x >= 0`); may be infinite only if `x` exceeds
/// f16's largest finite value, which `quantize_block`'s range check rules out for steps.
fn f16_up(x: f32) -> f16 {
    let h = f16::from_f32(x);
    if h.to_f32() < x {
        next_f16(h)
    } else {
        h
    }
}

/// The f16 after `h` towards +infinity.
fn next_f16(h: f16) -> f16 {
    let b = h.to_bits();
    if b == 0x8000 {
        return f16::from_bits(0x0001);
    }
    if b & 0x8000 == 0 {
        f16::from_bits(b + 1)
    } else {
        f16::from_bits(b - 1)
    }
}

/// The f16 before `h` towards -infinity.
fn prev_f16(h: f16) -> f16 {
    let b = h.to_bits();
    if b == 0x0000 {
        return f16::from_bits(0x8001);
    }
    if b & 0x8000 == 0 {
        f16::from_bits(b - 1)
    } else {
        f16::from_bits(b + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Rows with outlier channels, as post-RoPE K has.
    fn rows(c: &ChannelGroupCodec, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let d = c.dim();
        (0..c.group() * d)
            .map(|i| {
                let ch = i % d;
                let gain = if ch % 17 == 3 {
                    40.0
                } else {
                    1.0 + (ch % 5) as f32
                };
                gain * lcg(&mut s)
            })
            .collect()
    }

    #[test]
    fn round_trip_within_half_a_step_per_channel() {
        for bits in 2..=8u8 {
            for &dim in &[64usize, 128, 256] {
                for &group in &GROUPS {
                    let c = ChannelGroupCodec::new(bits, dim, group).unwrap();
                    let x = rows(&c, u64::from(bits) * 1000 + dim as u64 + group as u64);
                    let mut b = vec![0u8; c.block_bytes()];
                    c.quantize_block(&x, &mut b).unwrap();
                    let mut y = vec![0f32; x.len()];
                    c.dequantize_block(&b, &mut y).unwrap();
                    let levels = ((1u32 << bits) - 1) as f32;
                    for ch in 0..dim {
                        let col = (0..group).map(|t| x[t * dim + ch]);
                        let lo = col.clone().fold(f32::INFINITY, f32::min);
                        let hi = col.fold(f32::NEG_INFINITY, f32::max);
                        // the step is the range over the levels, rounded up to an f16 with
                        // a range widened by the minimum's rounding down
                        let bound = 0.5 * (hi - lo) / levels * (1.0 + 2.0f32.powi(-9))
                            + lo.abs() * 2.0f32.powi(-10)
                            + 1e-6;
                        for t in 0..group {
                            let e = (x[t * dim + ch] - y[t * dim + ch]).abs();
                            assert!(
                                e <= bound,
                                "bits {bits} dim {dim} group {group} ch {ch}: {e} > {bound}"
                            );
                        }
                    }
                    // rows one at a time and the block decode agree bit for bit
                    let mut r = vec![0f32; dim];
                    for t in [0, group / 2, group - 1] {
                        c.dequantize_row(&b, t, &mut r).unwrap();
                        assert_eq!(r, y[t * dim..(t + 1) * dim]);
                    }
                }
            }
        }
    }

    #[test]
    fn dot_block_matches_the_decoded_rows() {
        for bits in [2u8, 3, 4, 8] {
            let c = ChannelGroupCodec::new(bits, 64, 32).unwrap();
            let x = rows(&c, 9);
            let mut b = vec![0u8; c.block_bytes()];
            c.quantize_block(&x, &mut b).unwrap();
            let mut y = vec![0f32; x.len()];
            c.dequantize_block(&b, &mut y).unwrap();
            let mut s = 5u64;
            let q: Vec<f32> = (0..64).map(|_| lcg(&mut s)).collect();
            let mut scores = vec![0f32; 32];
            c.dot_block(&q, &b, &mut scores).unwrap();
            for t in 0..32 {
                let want: f64 = (0..64)
                    .map(|i| f64::from(q[i]) * f64::from(y[t * 64 + i]))
                    .sum();
                let scale: f64 = (0..64)
                    .map(|i| f64::from(q[i].abs() * y[t * 64 + i].abs()))
                    .sum();
                assert!((f64::from(scores[t]) - want).abs() <= 1e-5 * scale + 1e-6);
            }
        }
    }

    #[test]
    fn constant_channels_and_edges_are_exact() {
        let c = ChannelGroupCodec::new(4, 64, 16).unwrap();
        let mut x = vec![0.25f32; 16 * 64];
        x[5] = -65504.0;
        x[64 + 5] = 65504.0;
        let mut b = vec![0u8; c.block_bytes()];
        c.quantize_block(&x, &mut b).unwrap();
        let mut y = vec![0f32; x.len()];
        c.dequantize_block(&b, &mut y).unwrap();
        assert_eq!(y[0], 0.25);
        assert_eq!(y[5], -65504.0);
        assert!(y.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn bad_input_is_an_error_and_writes_nothing() {
        assert!(ChannelGroupCodec::new(1, 64, 32).is_err());
        assert!(ChannelGroupCodec::new(9, 64, 32).is_err());
        assert!(ChannelGroupCodec::new(4, 96, 32).is_err());
        assert!(ChannelGroupCodec::new(4, 64, 48).is_err());
        let c = ChannelGroupCodec::new(3, 64, 16).unwrap();
        let mut x = rows(&c, 1);
        let mut b = vec![0xa5u8; c.block_bytes()];
        assert!(c.quantize_block(&x[1..], &mut b).is_err());
        assert!(c.quantize_block(&x, &mut b[1..]).is_err());
        x[77] = f32::NAN;
        assert!(c.quantize_block(&x, &mut b).is_err());
        x[77] = 1e6;
        assert!(c.quantize_block(&x, &mut b).is_err());
        assert!(b.iter().all(|&v| v == 0xa5));
        // every truncation of a block is refused
        x[77] = 0.0;
        c.quantize_block(&x, &mut b).unwrap();
        let mut y = vec![0f32; x.len()];
        for n in 0..b.len() {
            assert!(c.dequantize_block(&b[..n], &mut y).is_err());
            assert!(c.dequantize_row(&b[..n], 0, &mut y[..64]).is_err());
        }
        assert!(c.dequantize_row(&b, 16, &mut y[..64]).is_err());
        // a step or minimum that is not finite is corrupt data
        for at in [0usize, 2 * 63, 128, 128 + 2 * 63] {
            let mut bad = b.clone();
            bad[at] = 0x00;
            bad[at + 1] = 0x7c; // +inf
            let e = c.dequantize_block(&bad, &mut y).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::CorruptData);
            let mut s = vec![0f32; 16];
            assert!(c.dot_block(&y[..64], &bad, &mut s).is_err());
        }
    }

    #[test]
    fn golden_block() {
        // 2-bit, 64 channels, 16 tokens: channel c of token t is (t - 8) * (c + 1) / 64.
        let c = ChannelGroupCodec::new(2, 64, 16).unwrap();
        let x: Vec<f32> = (0..16 * 64)
            .map(|i| ((i / 64) as f32 - 8.0) * ((i % 64) as f32 + 1.0) / 64.0)
            .collect();
        let mut b = vec![0u8; c.block_bytes()];
        c.quantize_block(&x, &mut b).unwrap();
        // channel 0: min -0.125 (f16 exact), range 0.234375 over 3 levels: step 0.078125
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 0.078125);
        assert_eq!(f16::from_le_bytes([b[128], b[129]]).to_f32(), -0.125);
        // token 0 is every channel's minimum (code 0), token 15 every maximum (code 3)
        assert!(b[256..256 + 16].iter().all(|&v| v == 0));
        assert!(b[256 + 15 * 16..256 + 16 * 16].iter().all(|&v| v == 0xff));
        // token 8 is 0: channel 0 code round(0.125 / 0.078125) = round(1.6) = 2
        assert_eq!(b[256 + 8 * 16] & 3, 2);
    }
}
