//! Row batches: C8 on the rows an engine writes, one token per row.
//!
//! A row is `channels` contiguous elements (`channel = kv_head * head_dim + dim`), a
//! batch is `rows` rows back to back: llama.cpp's `Kcur` / `Vcur` rows of one layer, as
//! they go into the cache. Nothing here allocates: each row is converted in blocks of
//! [`BLOCK`] channels through stack scratch, by the same kernels as the layout-based
//! [`quantize`](crate::quantize) / [`dequantize`](crate::dequantize), so the results are
//! bit-identical to those on a `CellRows` layout.
//!
//! Lengths are checked exactly: a source must hold `rows * channels` elements, a
//! destination at least that many (only those are written).

use crate::Isa;

use crate::error::{Error, Result};
use crate::ChannelQuant;
use kvc_types::{load_f32, store_f32, Dtype};

/// Channels converted per step (the stack scratch holds this many `f32` and `i8`).
pub const BLOCK: usize = 256;

/// Elements in `rows` rows of `channels`, and their bytes as `dtype`.
fn batch_size(rows: usize, channels: usize, dtype: Dtype) -> Result<(usize, usize)> {
    let elems = rows.checked_mul(channels).ok_or(Error::SizeOverflow {
        what: "rows x channels",
    })?;
    let bytes = elems
        .checked_mul(dtype.size())
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or(Error::SizeOverflow {
            what: "row batch bytes",
        })?;
    Ok((elems, bytes))
}

fn float_dtype(what: &'static str, dtype: Dtype) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            what,
            dtype: dtype.to_string(),
        })
    }
}

/// Checks that the input holds exactly `bytes`.
fn exact(what: &'static str, bytes: usize, len: usize) -> Result<()> {
    if len != bytes {
        return Err(Error::LayoutMismatch {
            what,
            expected: bytes,
            found: len,
        });
    }
    Ok(())
}

/// Checks that the output holds at least `bytes`.
fn at_least(what: &'static str, bytes: usize, len: usize) -> Result<()> {
    if len < bytes {
        return Err(Error::BufferTooSmall {
            what,
            needed: bytes,
            found: len,
        });
    }
    Ok(())
}

/// Calls `f(element, channel, n)` for each block of at most [`BLOCK`] channels of each
/// of `rows` rows: elements `element .. element + n` are channels `channel .. channel + n`.
#[inline]
fn blocks(rows: usize, channels: usize, mut f: impl FnMut(usize, usize, usize)) {
    for r in 0..rows {
        let base = r * channels;
        let mut c0 = 0;
        while c0 < channels {
            let n = BLOCK.min(channels - c0);
            f(base + c0, c0, n);
            c0 += n;
        }
    }
}

/// Quantizes `rows` rows of `src` (f16 / bf16 / f32, `rows * q.channels()` elements) to
/// int8 in `dst` (at least `rows * q.channels()` bytes; only those are written).
///
/// Errors: an int8 source is [`Error::UnsupportedDType`]; a source of another length is
/// [`Error::LayoutMismatch`]; a short `dst` is [`Error::BufferTooSmall`]; sizes that
/// overflow are [`Error::SizeOverflow`]. Nothing is written on error.
pub fn quantize_rows(
    src: &[u8],
    src_dtype: Dtype,
    rows: usize,
    q: &ChannelQuant,
    dst: &mut [u8],
) -> Result<()> {
    quantize_rows_with(Isa::detect(), src, src_dtype, rows, q, dst)
}

pub(crate) fn quantize_rows_with(
    isa: Isa,
    src: &[u8],
    src_dtype: Dtype,
    rows: usize,
    q: &ChannelQuant,
    dst: &mut [u8],
) -> Result<()> {
    float_dtype("row quantization source", src_dtype)?;
    let channels = q.channels();
    let (elems, bytes) = batch_size(rows, channels, src_dtype)?;
    exact(
        "source bytes (rows x channels x element size)",
        bytes,
        src.len(),
    )?;
    at_least("int8 destination", elems, dst.len())?;
    let es = src_dtype.size();
    let (scale, offset) = (q.scale(), q.offset());
    let mut x = [0f32; BLOCK];
    blocks(rows, channels, |e, c0, n| {
        let x = &mut x[..n];
        load_f32(src_dtype, &src[e * es..(e + n) * es], x);
        isa.quant_run(
            x,
            &scale[c0..c0 + n],
            &offset[c0..c0 + n],
            &mut dst[e..e + n],
        );
    });
    Ok(())
}

/// Dequantizes `rows` int8 rows of `src` (`rows * q.channels()` bytes) into `dst` as
/// `dst_dtype` (f16 / bf16 / f32, rounded to nearest even; at least
/// `rows * q.channels()` elements, only those are written).
///
/// Errors as [`quantize_rows`].
pub fn dequantize_rows(
    src: &[u8],
    rows: usize,
    q: &ChannelQuant,
    dst: &mut [u8],
    dst_dtype: Dtype,
) -> Result<()> {
    dequantize_rows_with(Isa::detect(), src, rows, q, dst, dst_dtype)
}

pub(crate) fn dequantize_rows_with(
    isa: Isa,
    src: &[u8],
    rows: usize,
    q: &ChannelQuant,
    dst: &mut [u8],
    dst_dtype: Dtype,
) -> Result<()> {
    float_dtype("row dequantization destination", dst_dtype)?;
    let channels = q.channels();
    let (elems, bytes) = batch_size(rows, channels, dst_dtype)?;
    exact("int8 source bytes (rows x channels)", elems, src.len())?;
    at_least("destination", bytes, dst.len())?;
    let es = dst_dtype.size();
    let (scale, offset) = (q.scale(), q.offset());
    let mut y = [0f32; BLOCK];
    blocks(rows, channels, |e, c0, n| {
        let y = &mut y[..n];
        isa.dequant_run(&src[e..e + n], &scale[c0..c0 + n], &offset[c0..c0 + n], y);
        store_f32(dst_dtype, y, &mut dst[e * es..(e + n) * es]);
    });
    Ok(())
}

/// Quantizes `rows` rows of `data` (f16 / bf16 / f32, exactly `rows * q.channels()`
/// elements) and writes them back dequantized, in place: what a cache holding C8 would
/// give attention, kept in the engine's own dtype (to measure C8's quality inside an
/// engine). Equal to [`quantize_rows`] followed by [`dequantize_rows`].
///
/// Errors as [`quantize_rows`]; nothing is written on error.
pub fn roundtrip_rows(data: &mut [u8], dtype: Dtype, rows: usize, q: &ChannelQuant) -> Result<()> {
    roundtrip_rows_with(Isa::detect(), data, dtype, rows, q)
}

pub(crate) fn roundtrip_rows_with(
    isa: Isa,
    data: &mut [u8],
    dtype: Dtype,
    rows: usize,
    q: &ChannelQuant,
) -> Result<()> {
    float_dtype("row round trip data", dtype)?;
    let channels = q.channels();
    let (_, bytes) = batch_size(rows, channels, dtype)?;
    exact(
        "data bytes (rows x channels x element size)",
        bytes,
        data.len(),
    )?;
    let es = dtype.size();
    let (scale, offset) = (q.scale(), q.offset());
    let mut x = [0f32; BLOCK];
    let mut i8s = [0u8; BLOCK];
    blocks(rows, channels, |e, c0, n| {
        let (x, i8s) = (&mut x[..n], &mut i8s[..n]);
        let (s, f) = (&scale[c0..c0 + n], &offset[c0..c0 + n]);
        let bytes = &mut data[e * es..(e + n) * es];
        load_f32(dtype, bytes, x);
        isa.quant_run(x, s, f, i8s);
        isa.dequant_run(i8s, s, f, x);
        store_f32(dtype, x, bytes);
    });
    Ok(())
}

/// Checks that every element of `rows` rows of `src` is finite; the index of the first
/// that is not.
pub(crate) fn first_non_finite(
    src: &[u8],
    dtype: Dtype,
    rows: usize,
    channels: usize,
) -> Option<usize> {
    let es = dtype.size();
    let mut x = [0f32; BLOCK];
    let mut found = None;
    blocks(rows, channels, |e, _, n| {
        if found.is_some() {
            return;
        }
        let x = &mut x[..n];
        load_f32(dtype, &src[e * es..(e + n) * es], x);
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            found = Some(e + i);
        }
    });
    found
}

/// Folds `rows` rows of `src` into per-channel `min` / `max` (all elements finite:
/// checked before by [`first_non_finite`]).
pub(crate) fn min_max_rows(
    src: &[u8],
    dtype: Dtype,
    rows: usize,
    min: &mut [f32],
    max: &mut [f32],
) {
    let channels = min.len();
    let es = dtype.size();
    let mut x = [0f32; BLOCK];
    blocks(rows, channels, |e, c0, n| {
        let x = &mut x[..n];
        load_f32(dtype, &src[e * es..(e + n) * es], x);
        for ((lo, hi), &v) in min[c0..c0 + n]
            .iter_mut()
            .zip(&mut max[c0..c0 + n])
            .zip(x.iter())
        {
            *lo = lo.min(v);
            *hi = hi.max(v);
        }
    });
}

/// Validates a float row batch for calibration: dtype, exact length, finite values.
pub(crate) fn check_observe_rows(
    src: &[u8],
    dtype: Dtype,
    rows: usize,
    channels: usize,
) -> Result<()> {
    float_dtype("calibration source", dtype)?;
    let (_, bytes) = batch_size(rows, channels, dtype)?;
    exact(
        "source bytes (rows x channels x element size)",
        bytes,
        src.len(),
    )?;
    if let Some(index) = first_non_finite(src, dtype, rows, channels) {
        return Err(Error::NonFinite {
            what: "calibration source",
            index,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{dequantize_with, quantize_with};
    use kvc_cache::{Addressing, TensorLayout};

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 20) as f32 - 8.0
        }
    }

    fn params(channels: usize, r: &mut impl FnMut() -> f32) -> ChannelQuant {
        let scale = (0..channels).map(|_| r().abs() * 0.01 + 1e-3).collect();
        let offset = (0..channels).map(|_| (r() * 8.0).round()).collect();
        ChannelQuant::new(scale, offset).unwrap()
    }

    /// Row batches equal the layout kernels on a `CellRows` layout of the same rows, for
    /// channel counts below, at and across the block size, every float dtype, both ISAs.
    #[test]
    fn rows_are_bit_identical_to_the_layout_kernels() {
        let mut r = rng(9);
        for channels in [1usize, 7, 64, 192, BLOCK, BLOCK + 1, 576, 1000] {
            let rows = 5;
            let q = params(channels, &mut r);
            for dt in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
                let l = TensorLayout::new(Addressing::CellRows, dt, 1, channels, rows).unwrap();
                let li = l.with_dtype(Dtype::I8).unwrap();
                let xs: Vec<f32> = (0..l.elem_count()).map(|_| r()).collect();
                let mut src = vec![0u8; l.byte_len()];
                store_f32(dt, &xs, &mut src);
                for isa in [Isa::PORTABLE, Isa::detect()] {
                    let mut want_q = vec![0u8; li.byte_len()];
                    quantize_with(isa, &src, &l, &mut want_q, &li, 0..rows, &q).unwrap();
                    let mut want_back = vec![0u8; l.byte_len()];
                    dequantize_with(isa, &want_q, &li, &mut want_back, &l, 0..rows, &q).unwrap();

                    let mut got_q = vec![0u8; li.byte_len()];
                    quantize_rows_with(isa, &src, dt, rows, &q, &mut got_q).unwrap();
                    assert_eq!(got_q, want_q, "quantize {channels} {dt} {isa:?}");
                    let mut got_back = vec![0u8; l.byte_len()];
                    dequantize_rows_with(isa, &got_q, rows, &q, &mut got_back, dt).unwrap();
                    assert_eq!(got_back, want_back, "dequantize {channels} {dt} {isa:?}");
                    let mut inplace = src.clone();
                    roundtrip_rows_with(isa, &mut inplace, dt, rows, &q).unwrap();
                    assert_eq!(inplace, want_back, "roundtrip {channels} {dt} {isa:?}");
                }
            }
        }
    }
}
