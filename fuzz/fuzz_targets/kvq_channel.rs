//! Fuzz K per channel over token groups (KIVI): kvc-kvq's `ChannelGroupCodec`
//! (`block_bytes`, `dequantize_block`, `dequantize_row`, `dot_block`, `quantize_block`) and
//! the C calls over it, `kvc_kvq_channel_*` (docs/formats/kvq.md, "Channel groups").
//!
//! Input: byte 0 picks bits (2..=8, `(b0 & 0x3f) % 7`); with its top bit set, bytes 4..16 are
//! instead three arbitrary u32 (bits, head_dim, group) for `kvc_kvq_channel_block_bytes`
//! and `ChannelGroupCodec::new` alone; unless bit 6 is set, the block's steps and minimums
//! are first made valid (sign of a step cleared, an infinite or NaN exponent lowered), since
//! random bytes almost never give `head_dim` valid channels. Byte 1 picks head_dim (64, 128, 256) and group (16..256);
//! byte 2 the row for `dequantize_row` (top bit: also ask for a row past the block); byte 3
//! bit 0 truncates the block by `1 + (b3 >> 2)` bytes, bit 1 plants a non-finite or
//! out-of-range value at a position derived from bytes 2 and 3 in the rows to quantize.
//! Then `block_bytes` bytes of block (arbitrary: a step or minimum may be NaN, infinite or
//! negative; missing bytes are zeros), then the bytes the rows to quantize are made of
//! (f16 bit patterns, cycled, non-finite ones made finite, each channel scaled by a factor
//! in [1, 2) so the values are not all f16; the block's bytes when nothing follows).
//!
//! Checked, for any bytes:
//! - nothing panics; the C calls and the Rust codec agree on which shapes are valid and on
//!   `block_bytes = 4 d + g d b / 8`;
//! - decoding fails exactly when the block is short (`BufferTooSmall`) or a step is
//!   negative or not finite or a minimum not finite (`CorruptData`); then nothing is
//!   written. When it succeeds every value is finite, `dequantize_row` equals the block
//!   decode bit for bit, the C calls equal the Rust ones bit for bit, and each score of
//!   `dot_block` is finite and within f32 rounding of `q . row` (f64);
//! - quantizing finite rows within f16's range succeeds, the C call writes the same bytes,
//!   and decoding is within half a step per channel plus f32 rounding, with the stored
//!   minimum the largest f16 not above the channel's minimum and the step the range over
//!   `2^b - 1` rounded up to an f16; a planted non-finite or out-of-range value is
//!   `InvalidArgument` (a caller's value) and nothing is written. With bit 0 of byte 3 the
//!   rows are the bytes read as f32 (the whole f32 range: past f16, past the point where a
//!   square overflows, NaN, infinities): any value outside f16's range is refused the
//!   same way.
//!
//! Seeds: with `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call writes there, for every bits
//! and group at head_dim 64, inputs whose block is real K of the embedded sample
//! (data/sample) quantized by the codec, followed by those K rows as f16; scripts/fuzz-all.sh
//! does this.
#![no_main]

use std::sync::OnceLock;

use kvc::kvq_channel::{
    kvc_kvq_channel_block_bytes, kvc_kvq_channel_dequantize, kvc_kvq_channel_dot,
    kvc_kvq_channel_quantize,
};
use kvc::KvcStatus;
use kvc_kvq::channel_group::GROUPS;
use kvc_kvq::ChannelGroupCodec;
use kvc_kvq::ErrorKind;
use libfuzzer_sys::fuzz_target;

const OK: KvcStatus = KvcStatus::KVC_OK;
const DIMS: [usize; 3] = [64, 128, 256];
/// Marks an output float nothing may write.
const UNTOUCHED: u32 = 0x7fc0_dead;
/// f32's unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The embedded sample: `[4][512][3][64]` f16.
const SAMPLE_K: &[u8] = include_bytes!("../../data/sample/textA.K.f16.bin");

fn f16_to_f32(h: u16) -> f32 {
    let (neg, exp, man) = (
        h & 0x8000 != 0,
        ((h >> 10) & 0x1f) as i32,
        (h & 0x3ff) as u32,
    );
    let mag = match exp {
        0 => man as f32 * 2f32.powi(-24),
        0x1f if man == 0 => f32::INFINITY,
        0x1f => f32::NAN,
        e => (1.0 + man as f32 / 1024.0) * 2f32.powi(e - 15),
    };
    if neg {
        -mag
    } else {
        mag
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Code `i` of row `t` of a block, read from the LSB-first stream (a code of at most 8 bits
/// spans at most two bytes).
fn code(block: &[u8], d: usize, bits: u32, t: usize, i: usize) -> u32 {
    let start = 8 * 4 * d + (t * d + i) * bits as usize;
    let lo = u32::from(block[start / 8]);
    let hi = u32::from(block.get(start / 8 + 1).copied().unwrap_or(0));
    ((lo | hi << 8) >> (start % 8)) & ((1 << bits) - 1)
}

fn untouched(x: &[f32]) -> bool {
    x.iter().all(|v| v.to_bits() == UNTOUCHED)
}

fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let d = 64usize;
    for bits in 2u8..=8 {
        for (gi, &g) in GROUPS.iter().enumerate() {
            // head 1 of layer 2, tokens 40.. (rows of one head are 3 * 64 values apart)
            let mut raw = Vec::with_capacity(2 * g * d);
            let mut x = Vec::with_capacity(g * d);
            for t in 0..g {
                let o = 2 * (((2 * 512 + 40 + t) * 3 + 1) * 64);
                raw.extend_from_slice(&SAMPLE_K[o..o + 2 * d]);
                x.extend((0..d).map(|c| f16_at(SAMPLE_K, o + 2 * c)));
            }
            let c = ChannelGroupCodec::new(bits, d, g).unwrap();
            let mut block = vec![0u8; c.block_bytes()];
            c.quantize_block(&x, &mut block).unwrap();
            let mut out = vec![bits - 2, (gi as u8) << 2, (g / 2) as u8, 0];
            out.extend_from_slice(&block);
            out.extend_from_slice(&raw);
            std::fs::write(dir.join(format!("sample-b{bits}-g{g}")), out).unwrap();
        }
    }
}

/// Whether the block's steps and minimums are valid (docs/formats/kvq.md).
fn ranges_valid(block: &[u8], d: usize) -> bool {
    (0..d).all(|c| {
        let s = f16_at(block, 2 * c);
        let m = f16_at(block, 2 * d + 2 * c);
        s.is_finite() && s >= 0.0 && m.is_finite()
    })
}

fn check_shape(raw: &[u8]) {
    let word = |i: usize| {
        let mut w = [0u8; 4];
        for (j, v) in w.iter_mut().enumerate() {
            *v = raw.get(4 + 4 * i + j).copied().unwrap_or(0);
        }
        u32::from_le_bytes(w)
    };
    let (bits, dim, group) = (word(0), word(1), word(2));
    let mut n = usize::MAX;
    // SAFETY: `n` is writable.
    let st = unsafe { kvc_kvq_channel_block_bytes(bits, dim, group, &mut n) };
    let rust = u8::try_from(bits)
        .ok()
        .and_then(|b| ChannelGroupCodec::new(b, dim as usize, group as usize).ok());
    match rust {
        Some(c) => {
            assert_eq!(st, OK);
            assert_eq!(n, c.block_bytes());
            assert_eq!(n, 4 * c.dim() + c.group() * c.dim() * bits as usize / 8);
        }
        None => {
            assert_ne!(st, OK);
            assert_eq!(n, usize::MAX, "block_bytes wrote on failure");
        }
    }
}

fn check_decode(c: &ChannelGroupCodec, head: &[u8], src: &[u8]) {
    let (d, g) = (c.dim(), c.group());
    let (bits, dim, group) = (u32::from(c.bits()), d as u32, g as u32);
    let short = src.len() < c.block_bytes();
    let valid = !short && ranges_valid(src, d);
    let mut y = vec![f32::from_bits(UNTOUCHED); g * d];
    let r = c.dequantize_block(src, &mut y);
    let mut yc = vec![f32::from_bits(UNTOUCHED); g * d];
    // SAFETY: `src` is readable for its length, `yc` writable for g * d floats; disjoint.
    let st = unsafe {
        kvc_kvq_channel_dequantize(bits, dim, group, src.as_ptr(), src.len(), yc.as_mut_ptr())
    };
    let q: Vec<f32> = (0..d)
        .map(|i| (f32::from(head[(i * 7 + 3) % 4]) - 128.0 + i as f32) / 64.0)
        .collect();
    let mut s = vec![f32::from_bits(UNTOUCHED); g];
    let rd = c.dot_block(&q, src, &mut s);
    let mut sc = vec![f32::from_bits(UNTOUCHED); g];
    // SAFETY: `q` readable for d floats, `src` for its length, `sc` writable for g floats;
    // all disjoint.
    let stc = unsafe {
        kvc_kvq_channel_dot(
            bits,
            dim,
            group,
            q.as_ptr(),
            src.as_ptr(),
            src.len(),
            sc.as_mut_ptr(),
        )
    };
    let row = usize::from(head[2] & 0x7f) % g;
    let mut yr = vec![f32::from_bits(UNTOUCHED); d];
    let rr = c.dequantize_row(src, row, &mut yr);
    if head[2] & 0x80 != 0 {
        let mut z = vec![f32::from_bits(UNTOUCHED); d];
        let past = g + usize::from(head[2] & 0x7f);
        assert!(c.dequantize_row(src, past, &mut z).is_err());
        assert!(untouched(&z));
    }
    if !valid {
        let want = if short {
            ErrorKind::BufferTooSmall
        } else {
            ErrorKind::CorruptData
        };
        let wantc = if short {
            KvcStatus::KVC_BUFFER_TOO_SMALL
        } else {
            KvcStatus::KVC_CORRUPT_DATA
        };
        assert_eq!(r.unwrap_err().kind(), want);
        assert_eq!(rd.unwrap_err().kind(), want);
        assert_eq!(rr.unwrap_err().kind(), want);
        assert_eq!(st, wantc);
        assert_eq!(stc, wantc);
        assert!(
            untouched(&y) && untouched(&yc) && untouched(&s) && untouched(&sc) && untouched(&yr)
        );
        return;
    }
    r.unwrap();
    rd.unwrap();
    rr.unwrap();
    assert_eq!(st, OK);
    assert_eq!(stc, OK);
    assert!(
        y.iter().all(|v| v.is_finite()),
        "decoded a non-finite value"
    );
    assert!(
        y.iter().zip(&yc).all(|(a, b)| a.to_bits() == b.to_bits()),
        "C decode differs"
    );
    assert!(
        s.iter().zip(&sc).all(|(a, b)| a.to_bits() == b.to_bits()),
        "C dot differs"
    );
    assert!(yr
        .iter()
        .zip(&y[row * d..(row + 1) * d])
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // scores against the decoded rows in f64; the bound is the f32 rounding of the sums
    // taken (d terms of q.min, lanes of q*step*code) over the magnitude of their terms,
    // which may cancel
    let step: Vec<f64> = (0..d).map(|i| f64::from(f16_at(src, 2 * i))).collect();
    let lo: Vec<f64> = (0..d)
        .map(|i| f64::from(f16_at(src, 2 * d + 2 * i)))
        .collect();
    for t in 0..g {
        assert!(s[t].is_finite(), "score {t} not finite");
        let yt = &y[t * d..(t + 1) * d];
        let want: f64 = (0..d).map(|i| f64::from(q[i]) * f64::from(yt[i])).sum();
        let mag: f64 = (0..d)
            .map(|i| {
                let k = f64::from(code(src, d, bits, t, i));
                f64::from(q[i].abs()) * (lo[i].abs() + k * step[i])
            })
            .sum();
        let e = (f64::from(s[t]) - want).abs();
        assert!(
            e <= (d as f64 + 16.0) * U * mag + 1e-30,
            "row {t}: score {} vs {want}",
            s[t]
        );
    }
}

fn check_quantize(c: &ChannelGroupCodec, head: &[u8], bytes: &[u8]) {
    let (d, g) = (c.dim(), c.group());
    let n = g * d;
    let levels = f64::from((1u32 << c.bits()) - 1);
    let mut x: Vec<f32> = (0..n)
        .map(|i| {
            let o = (2 * i) % (bytes.len() & !1);
            let mut h = u16::from_le_bytes([bytes[o], bytes[o + 1]]);
            if h & 0x7c00 == 0x7c00 {
                h &= !0x4000; // a finite f16 of the same sign
            }
            // a per-channel factor in [1, 2) so that values are not all f16s
            let f = 1.0 + f32::from(bytes[(i % d) % bytes.len()]) / 256.0;
            (f16_to_f32(h) * f).clamp(-65504.0, 65504.0)
        })
        .collect();
    // Values over the whole f32 range: the head's bit 0 of byte 3 reads the bytes as f32
    // (any pattern: past f16, past a square's overflow, NaN, infinities) instead.
    let wide = head[3] & 1 != 0 && bytes.len() >= 4 * n;
    if wide {
        for (v, c) in x.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    let mut block = vec![0xa5u8; c.block_bytes()];
    if head[3] & 2 != 0 {
        let at = (usize::from(head[2]) * 257 + usize::from(head[3])) % n;
        x[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 65520.0, -1e30]
            [usize::from(head[3] >> 2) % 5];
        let e = c.quantize_block(&x, &mut block).unwrap_err();
        // A caller's bad value: an invalid argument (bad bytes are corrupt data).
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        // SAFETY: `x` readable for n floats, `block` writable for its length; disjoint.
        let st = unsafe {
            kvc_kvq_channel_quantize(
                u32::from(c.bits()),
                d as u32,
                g as u32,
                x.as_ptr(),
                block.as_mut_ptr(),
                block.len(),
            )
        };
        assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
        assert!(
            block.iter().all(|&b| b == 0xa5),
            "quantize wrote on failure"
        );
        return;
    }
    if wide && x.iter().any(|v| v.is_nan() || v.abs() > 65504.0) {
        let e = c.quantize_block(&x, &mut block).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            block.iter().all(|&b| b == 0xa5),
            "quantize wrote on failure"
        );
        return;
    }
    c.quantize_block(&x, &mut block).unwrap();
    let mut bc = vec![0x5au8; c.block_bytes()];
    // SAFETY: as above.
    let st = unsafe {
        kvc_kvq_channel_quantize(
            u32::from(c.bits()),
            d as u32,
            g as u32,
            x.as_ptr(),
            bc.as_mut_ptr(),
            bc.len(),
        )
    };
    assert_eq!(st, OK);
    assert_eq!(block, bc, "C quantize differs");
    let mut y = vec![0f32; n];
    c.dequantize_block(&block, &mut y).unwrap();
    for ch in 0..d {
        let step = f64::from(f16_at(&block, 2 * ch));
        let lo = f64::from(f16_at(&block, 2 * d + 2 * ch));
        let col = (0..g).map(|t| f64::from(x[t * d + ch]));
        let a = col.clone().fold(f64::INFINITY, f64::min);
        let b = col.fold(f64::NEG_INFINITY, f64::max);
        // the minimum: an f16 not above the channel's minimum, less than one f16 spacing
        // (2^-10 relative, 2^-24 among subnormals) below it
        assert!(
            lo <= a && a - lo <= (a.abs() / 1024.0).max(1.0 / (1u64 << 24) as f64),
            "ch {ch}: min {lo} for {a}"
        );
        // the step: the range over the levels, rounded up to an f16 (2^-10 relative or
        // 2^-24), the range computed in f32
        let r = (b - lo) / levels;
        assert!(
            step >= r * (1.0 - 4.0 * U),
            "ch {ch}: step {step} below {r}"
        );
        assert!(
            step <= r * (1.0 + 1.0 / 1024.0) * (1.0 + 4.0 * U) + 1.0 / (1u64 << 24) as f64,
            "ch {ch}: step {step} above {r}"
        );
        for t in 0..g {
            let (xv, yv) = (f64::from(x[t * d + ch]), f64::from(y[t * d + ch]));
            let slack = 4.0 * U * (xv.abs() + lo.abs() + levels * step);
            assert!(
                (xv - yv).abs() <= 0.5 * step + slack,
                "ch {ch} row {t}: {xv} -> {yv}, step {step}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: OnceLock<()> = OnceLock::new();
    SEEDS.get_or_init(|| {
        if let Some(d) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&d));
        }
    });
    if data.len() < 4 {
        return;
    }
    if data[0] & 0x80 != 0 {
        check_shape(data);
        return;
    }
    let (head, rest) = data.split_at(4);
    let bits = 2 + (head[0] & 0x3f) % 7;
    let d = DIMS[usize::from(head[1] & 3) % 3];
    let g = GROUPS[usize::from(head[1] >> 2) % GROUPS.len()];
    let c = ChannelGroupCodec::new(bits, d, g).unwrap();
    let nb = c.block_bytes();
    let mut src = rest[..rest.len().min(nb)].to_vec();
    src.resize(nb, 0);
    if head[0] & 0x40 == 0 {
        for c in 0..d {
            for (at, clear) in [(2 * c, 0x8000u16), (2 * d + 2 * c, 0)] {
                let mut h = u16::from_le_bytes([src[at], src[at + 1]]) & !clear;
                if h & 0x7c00 == 0x7c00 {
                    h &= !0x4000;
                }
                src[at..at + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
    }
    if head[3] & 1 != 0 {
        src.truncate(nb.saturating_sub(1 + usize::from(head[3] >> 2)));
    }
    // an exactly sized copy, so that AddressSanitizer sees any read past it
    let src = src.into_boxed_slice();
    check_decode(&c, head, &src);
    let tail = if rest.len() > nb + 1 {
        &rest[nb..]
    } else {
        rest
    };
    if tail.len() >= 2 {
        check_quantize(&c, head, tail);
    }
});
