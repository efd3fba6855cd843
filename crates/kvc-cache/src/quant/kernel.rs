//! Quantize / dequantize kernels over any layout, and error statistics.

use std::ops::Range;

use super::ChannelQuant;
use crate::dtype::{load_f32, store_f32, DType};
use crate::error::{Error, Result};
use crate::layout::{Addressing, TensorLayout};

/// A contiguous run of elements: first element, count, first channel, channel step
/// (1: the run walks channels of one token; 0: it walks tokens of one channel).
type Segment = (usize, usize, usize, usize);

fn segments(
    layout: &TensorLayout,
    tokens: Range<usize>,
    mut f: impl FnMut(Segment) -> Result<()>,
) -> Result<()> {
    if tokens.start > tokens.end || tokens.end > layout.capacity() {
        return Err(Error::InvalidRange {
            start: tokens.start,
            end: tokens.end,
            limit: layout.capacity(),
        });
    }
    if tokens.is_empty() {
        return Ok(());
    }
    if layout.addressing() == Addressing::CellColumns {
        for c in 0..layout.channels() {
            f((c * layout.capacity() + tokens.start, tokens.len(), c, 0))?;
        }
    } else {
        let runs = layout.channel_runs();
        for t in tokens {
            let to = layout.token_offset(t);
            for &(c0, coff, len) in &runs {
                f((to + coff, len, c0, 1))?;
            }
        }
    }
    Ok(())
}

fn check_pair(
    what: &'static str,
    float: &TensorLayout,
    int8: &TensorLayout,
    q: &ChannelQuant,
) -> Result<()> {
    if !float.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            what,
            dtype: float.dtype().to_string(),
        });
    }
    if int8.dtype() != DType::I8 {
        return Err(Error::UnsupportedDType {
            what,
            dtype: int8.dtype().to_string(),
        });
    }
    if float.with_dtype(DType::I8)? != *int8 {
        return Err(Error::LayoutMismatch {
            what: "float and int8 layouts (shape/addressing)",
            expected: float.elem_count(),
            found: int8.elem_count(),
        });
    }
    if q.channels() != float.channels() {
        return Err(Error::LayoutMismatch {
            what: "C8 channels",
            expected: float.channels(),
            found: q.channels(),
        });
    }
    Ok(())
}

/// Round half to even of a value already clamped to [-128, 127]: adding and removing
/// 1.5 * 2^23 leaves an integer, rounded in the default (nearest-even) mode. Clamping to
/// integer bounds commutes with rounding, so this equals
/// `round_ties_even(v).clamp(-128, 127)` (NaN stays NaN and casts to 0 either way), and it
/// vectorizes where `round_ties_even` is a library call.
#[inline]
fn q1(x: f32, scale: f32, offset: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    let v = (x / scale + offset).clamp(-128.0, 127.0);
    ((v + MAGIC) - MAGIC) as i8
}

/// Quantizes tokens `tokens` of `src` (f16/bf16/f32) into `dst` (the same layout in
/// `I8`).
pub fn quantize(
    src: &[u8],
    src_layout: &TensorLayout,
    dst: &mut [u8],
    dst_layout: &TensorLayout,
    tokens: Range<usize>,
    q: &ChannelQuant,
) -> Result<()> {
    check_pair("quantize source", src_layout, dst_layout, q)?;
    src_layout.check_buffer("source", src.len())?;
    dst_layout.check_buffer("destination", dst.len())?;
    let es = src_layout.dtype().size();
    let mut scratch = Vec::new();
    let (scale, offset) = (q.scale(), q.offset());
    segments(src_layout, tokens, |(o, n, c0, step)| {
        scratch.resize(n, 0.0);
        load_f32(src_layout.dtype(), &src[o * es..(o + n) * es], &mut scratch);
        let out = &mut dst[o..o + n];
        if step == 1 {
            let (s, f) = (&scale[c0..c0 + n], &offset[c0..c0 + n]);
            for (((d, &x), &s), &f) in out.iter_mut().zip(&scratch).zip(s).zip(f) {
                *d = q1(x, s, f) as u8;
            }
        } else {
            let (s, f) = (scale[c0], offset[c0]);
            for (d, &x) in out.iter_mut().zip(&scratch) {
                *d = q1(x, s, f) as u8;
            }
        }
        Ok(())
    })
}

/// Dequantizes tokens `tokens` of `src` (`I8`) into `dst` (the same layout in
/// f16/bf16/f32, rounded to nearest even).
pub fn dequantize(
    src: &[u8],
    src_layout: &TensorLayout,
    dst: &mut [u8],
    dst_layout: &TensorLayout,
    tokens: Range<usize>,
    q: &ChannelQuant,
) -> Result<()> {
    check_pair("dequantize destination", dst_layout, src_layout, q)?;
    src_layout.check_buffer("source", src.len())?;
    dst_layout.check_buffer("destination", dst.len())?;
    let es = dst_layout.dtype().size();
    let mut scratch = Vec::new();
    let (scale, offset) = (q.scale(), q.offset());
    segments(src_layout, tokens, |(o, n, c0, step)| {
        scratch.resize(n, 0.0);
        let inp = &src[o..o + n];
        if step == 1 {
            let (s, f) = (&scale[c0..c0 + n], &offset[c0..c0 + n]);
            for (((x, &b), &s), &f) in scratch.iter_mut().zip(inp).zip(s).zip(f) {
                *x = (f32::from(b as i8) - f) * s;
            }
        } else {
            let (s, f) = (scale[c0], offset[c0]);
            for (x, &b) in scratch.iter_mut().zip(inp) {
                *x = (f32::from(b as i8) - f) * s;
            }
        }
        store_f32(dst_layout.dtype(), &scratch, &mut dst[o * es..(o + n) * es]);
        Ok(())
    })
}

/// Error of a quantize -> dequantize round trip, in `f32` (before rounding back to the
/// cache dtype).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ErrorStats {
    /// Elements measured.
    pub count: u64,
    /// Largest absolute error.
    pub max_abs: f64,
    /// Sum of squared errors.
    pub sum_sq_err: f64,
    /// Sum of squared original values.
    pub sum_sq_signal: f64,
}

impl ErrorStats {
    /// Root mean square error.
    pub fn rms(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            (self.sum_sq_err / self.count as f64).sqrt()
        }
    }
    /// Signal-to-noise ratio in dB (`inf` when there is no error).
    pub fn snr_db(&self) -> f64 {
        10.0 * (self.sum_sq_signal / self.sum_sq_err).log10()
    }
    /// Combines two measurements.
    pub fn merge(&mut self, o: &ErrorStats) {
        self.count += o.count;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.sum_sq_err += o.sum_sq_err;
        self.sum_sq_signal += o.sum_sq_signal;
    }
}

/// Measures the C8 round-trip error of tokens `tokens` of `src` without writing.
pub fn quant_error(
    src: &[u8],
    layout: &TensorLayout,
    tokens: Range<usize>,
    q: &ChannelQuant,
) -> Result<ErrorStats> {
    check_pair(
        "quant_error source",
        layout,
        &layout.with_dtype(DType::I8)?,
        q,
    )?;
    layout.check_buffer("source", src.len())?;
    let es = layout.dtype().size();
    let mut scratch = Vec::new();
    let mut st = ErrorStats::default();
    let (scale, offset) = (q.scale(), q.offset());
    segments(layout, tokens, |(o, n, c0, step)| {
        scratch.resize(n, 0.0);
        load_f32(layout.dtype(), &src[o * es..(o + n) * es], &mut scratch);
        for (i, &x) in scratch.iter().enumerate() {
            let c = c0 + i * step;
            let y = (f32::from(q1(x, scale[c], offset[c])) - offset[c]) * scale[c];
            let e = f64::from(y - x);
            st.max_abs = st.max_abs.max(e.abs());
            st.sum_sq_err += e * e;
            st.sum_sq_signal += f64::from(x) * f64::from(x);
        }
        st.count += n as u64;
        Ok(())
    })?;
    Ok(st)
}

pub(crate) fn observe(
    layout: &TensorLayout,
    src: &[u8],
    tokens: Range<usize>,
    min: &mut [f32],
    max: &mut [f32],
) -> Result<()> {
    layout.check_buffer("source", src.len())?;
    if !layout.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            what: "calibration source",
            dtype: layout.dtype().to_string(),
        });
    }
    let es = layout.dtype().size();
    let mut scratch = Vec::new();
    segments(layout, tokens, |(o, n, c0, step)| {
        scratch.resize(n, 0.0);
        load_f32(layout.dtype(), &src[o * es..(o + n) * es], &mut scratch);
        for (i, &x) in scratch.iter().enumerate() {
            if !x.is_finite() {
                return Err(Error::NonFinite {
                    what: "calibration source",
                    index: o + i,
                });
            }
            let c = c0 + i * step;
            min[c] = min[c].min(x);
            max[c] = max[c].max(x);
        }
        Ok(())
    })
}
