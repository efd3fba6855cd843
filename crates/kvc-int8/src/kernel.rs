//! Quantize / dequantize kernels over any layout, and error statistics.

use std::ops::Range;

use crate::{q_fast, Isa};

use crate::error::{Error, Result};
use crate::ChannelQuant;
use kvc_cache::{Addressing, TensorLayout};
use kvc_types::{load_f32, store_f32, Dtype};

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
    if int8.dtype() != Dtype::I8 {
        return Err(Error::UnsupportedDType {
            what,
            dtype: int8.dtype().to_string(),
        });
    }
    if float.with_dtype(Dtype::I8)? != *int8 {
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
    quantize_with(Isa::detect(), src, src_layout, dst, dst_layout, tokens, q)
}

pub(crate) fn quantize_with(
    isa: Isa,
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
            isa.quant_run(&scratch, &scale[c0..c0 + n], &offset[c0..c0 + n], out);
        } else {
            isa.quant_bcast(&scratch, scale[c0], offset[c0], out);
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
    dequantize_with(Isa::detect(), src, src_layout, dst, dst_layout, tokens, q)
}

pub(crate) fn dequantize_with(
    isa: Isa,
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
            isa.dequant_run(inp, &scale[c0..c0 + n], &offset[c0..c0 + n], &mut scratch);
        } else {
            isa.dequant_bcast(inp, scale[c0], offset[c0], &mut scratch);
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
        &layout.with_dtype(Dtype::I8)?,
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
            let y = (f32::from(q_fast(x, scale[c], offset[c])) - offset[c]) * scale[c];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q1;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 20) as f32 - 8.0
        }
    }

    #[test]
    fn every_isa_quantizes_and_dequantizes_identically() {
        let mut r = rng(42);
        for a in [Addressing::CellRows, Addressing::CellColumns] {
            for dt in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
                let l = TensorLayout::new(a, dt, 3, 20, 37).unwrap();
                let li = l.with_dtype(Dtype::I8).unwrap();
                let xs: Vec<f32> = (0..l.elem_count()).map(|_| r()).collect();
                let mut src = vec![0u8; l.byte_len()];
                kvc_types::store_f32(dt, &xs, &mut src);
                let scale: Vec<f32> = (0..60).map(|_| r().abs() * 0.01 + 1e-3).collect();
                let offset: Vec<f32> = (0..60).map(|_| (r() * 8.0).round()).collect();
                let q = ChannelQuant::new(scale.clone(), offset.clone()).unwrap();
                let mut outs = Vec::new();
                for isa in [Isa::PORTABLE, Isa::detect()] {
                    let mut i8b = vec![0u8; li.byte_len()];
                    quantize_with(isa, &src, &l, &mut i8b, &li, 0..37, &q).unwrap();
                    let mut back = vec![0u8; l.byte_len()];
                    dequantize_with(isa, &i8b, &li, &mut back, &l, 0..37, &q).unwrap();
                    outs.push((i8b, back));
                }
                assert_eq!(outs[0], outs[1], "{a:?} {dt}");
                // And both equal the scalar formula, element by element.
                let mut x = vec![0f32; l.elem_count()];
                kvc_types::load_f32(dt, &src, &mut x);
                for t in 0..37 {
                    for c in 0..60 {
                        let o = l.token_offset(t) + l.channel_offset(c);
                        let want = q1(x[o], scale[c], offset[c]);
                        assert_eq!(outs[0].0[o] as i8, want);
                    }
                }
            }
        }
    }
}
