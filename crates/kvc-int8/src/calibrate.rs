//! Calibration: per-channel min / max over a cache, then msmodelslim's
//! `int8_per_channel_sym` / `int8_per_channel_asym` parameters.
//!
//! As msmodelslim's INT8 `calculate_qparam`: `min = min(min, 0)`, `max = max(max, 0)`;
//! symmetric: `scale = max(max(-min, max) / 127, eps)`, `offset = 0`; asymmetric:
//! `scale = max((max - min) / 255, eps)`, `offset = round(-min / scale) - 128`;
//! `eps = f32::EPSILON`.

use std::ops::Range;

use crate::error::Result;
use crate::kernel::observe;
use crate::rows::{check_observe_rows, min_max_rows, BLOCK};
use crate::ChannelQuant;
use kvc_cache::TensorLayout;
use kvc_types::{load_f32, Dtype};

/// Running per-channel min / max (calibration may see a cache in several pieces, or an
/// engine's rows batch by batch).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelStats {
    min: Vec<f32>,
    max: Vec<f32>,
    tokens: u64,
}

impl ChannelStats {
    /// Nothing observed yet, `channels` channels.
    pub fn new(channels: usize) -> ChannelStats {
        ChannelStats {
            min: vec![f32::INFINITY; channels],
            max: vec![f32::NEG_INFINITY; channels],
            tokens: 0,
        }
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.min.len()
    }

    /// Tokens (rows) observed so far by successful calls.
    pub fn tokens_observed(&self) -> u64 {
        self.tokens
    }

    /// Observes tokens `tokens` of `src`. Fails on NaN / infinity.
    pub fn observe(
        &mut self,
        src: &[u8],
        layout: &TensorLayout,
        tokens: Range<usize>,
    ) -> Result<()> {
        if layout.channels() != self.min.len() {
            return Err(crate::Error::LayoutMismatch {
                what: "calibration channels",
                expected: self.min.len(),
                found: layout.channels(),
            });
        }
        let n = tokens.len() as u64;
        observe(layout, src, tokens, &mut self.min, &mut self.max)?;
        self.tokens += n;
        Ok(())
    }

    /// Observes `rows` rows of `src`: each row `channels()` contiguous elements of
    /// `dtype` (f16 / bf16 / f32), exactly `rows * channels()` elements (the engine's
    /// rows as it writes them). All or nothing: a NaN or infinity anywhere
    /// ([`Error::NonFinite`](crate::Error::NonFinite), with its element index), a wrong
    /// length or an int8 dtype leave the statistics unchanged. Allocates nothing.
    pub fn observe_rows(&mut self, src: &[u8], dtype: Dtype, rows: usize) -> Result<()> {
        check_observe_rows(src, dtype, rows, self.min.len())?;
        min_max_rows(src, dtype, rows, &mut self.min, &mut self.max);
        self.tokens += rows as u64;
        Ok(())
    }

    /// Per-channel minimum seen (`+inf` if nothing).
    pub fn min(&self) -> &[f32] {
        &self.min
    }
    /// Per-channel maximum seen.
    pub fn max(&self) -> &[f32] {
        &self.max
    }

    /// The C8 parameters, symmetric or asymmetric.
    pub fn finish(&self, symmetric: bool) -> Result<ChannelQuant> {
        let eps = f32::EPSILON;
        let mut scale = Vec::with_capacity(self.min.len());
        let mut offset = Vec::with_capacity(self.min.len());
        for (&lo, &hi) in self.min.iter().zip(&self.max) {
            // An unobserved channel has lo = +inf, hi = -inf: both clamp to 0.
            let lo = lo.min(0.0);
            let hi = hi.max(0.0);
            if symmetric {
                scale.push(((-lo).max(hi) / 127.0).max(eps));
                offset.push(0.0);
            } else {
                let s = ((hi - lo) / 255.0).max(eps);
                scale.push(s);
                offset.push((-lo / s).round_ties_even() - 128.0);
            }
        }
        ChannelQuant::new(scale, offset)
    }
}

/// Calibrates one tensor over `tokens`.
pub fn calibrate(
    src: &[u8],
    layout: &TensorLayout,
    tokens: Range<usize>,
    symmetric: bool,
) -> Result<ChannelQuant> {
    let mut st = ChannelStats::new(layout.channels());
    st.observe(src, layout, tokens)?;
    st.finish(symmetric)
}

/// How a rotary position embedding pairs the channels of a head (llama.cpp's rope types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// `LLAMA_ROPE_TYPE_NORM`: dims `(2i, 2i + 1)` of each head rotate together.
    Norm,
    /// `LLAMA_ROPE_TYPE_NEOX`: dims `(i, i + head_dim / 2)` of each head rotate together.
    Neox,
}

/// Running per-pair maximum radius of rotary K, for calibration that holds at every
/// position.
///
/// RoPE rotates each pair of channels `(x, y)` by a position-dependent angle, so at a
/// later position a pair stays within the radius `sqrt(x^2 + y^2)` it had, while each
/// channel's own min / max does not. [`finish`](RopeStats::finish) gives both channels
/// of a pair the symmetric scale `max_radius / 127` (offset 0): a rotated pair never
/// clips. Rows are token-major, `channels = kv_heads * head_dim`, as [`ChannelStats`].
#[derive(Debug, Clone, PartialEq)]
pub struct RopeStats {
    head_dim: usize,
    style: RopeStyle,
    /// Maximum squared radius by pair, in pair order (see [`RopeStats::pair`]).
    radius2: Vec<f32>,
    tokens: u64,
}

impl RopeStats {
    /// Nothing observed yet. `head_dim` must be even, non-zero, and divide `channels`
    /// (else [`Error::InvalidShape`](crate::Error::InvalidShape)).
    pub fn new(channels: usize, head_dim: usize, style: RopeStyle) -> Result<RopeStats> {
        let bad = |reason| {
            Err(crate::Error::InvalidShape {
                field: "rope head_dim",
                value: head_dim,
                reason,
            })
        };
        if channels == 0 {
            return Err(crate::Error::InvalidShape {
                field: "rope channels",
                value: channels,
                reason: "must be non-zero",
            });
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return bad("must be even and non-zero (RoPE rotates channel pairs)");
        }
        if !channels.is_multiple_of(head_dim) {
            return bad("must divide the channel count (kv_heads * head_dim)");
        }
        Ok(RopeStats {
            head_dim,
            style,
            radius2: vec![0.0; channels / 2],
            tokens: 0,
        })
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.radius2.len() * 2
    }
    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Pairing.
    pub fn style(&self) -> RopeStyle {
        self.style
    }
    /// Tokens (rows) observed so far by successful calls.
    pub fn tokens_observed(&self) -> u64 {
        self.tokens
    }

    /// The two channels of pair `p` (`p < channels() / 2`).
    pub fn pair(&self, p: usize) -> (usize, usize) {
        let half = self.head_dim / 2;
        let (h, i) = (p / half, p % half);
        let base = h * self.head_dim;
        match self.style {
            RopeStyle::Norm => (base + 2 * i, base + 2 * i + 1),
            RopeStyle::Neox => (base + i, base + i + half),
        }
    }

    /// Maximum radius seen by pair (0 if nothing observed).
    pub fn max_radius(&self) -> Vec<f32> {
        self.radius2.iter().map(|r| r.sqrt()).collect()
    }

    fn observe_row(&mut self, row: &[f32]) {
        let half = self.head_dim / 2;
        for (h, head) in row.chunks_exact(self.head_dim).enumerate() {
            let r2 = &mut self.radius2[h * half..(h + 1) * half];
            match self.style {
                RopeStyle::Norm => {
                    for (m, xy) in r2.iter_mut().zip(head.chunks_exact(2)) {
                        *m = m.max(xy[0] * xy[0] + xy[1] * xy[1]);
                    }
                }
                RopeStyle::Neox => {
                    let (lo, hi) = head.split_at(half);
                    for ((m, &x), &y) in r2.iter_mut().zip(lo).zip(hi) {
                        *m = m.max(x * x + y * y);
                    }
                }
            }
        }
    }

    /// Observes `rows` rows of `src` (f16 / bf16 / f32, exactly `rows * channels()`
    /// elements). All or nothing, with the errors of [`ChannelStats::observe_rows`].
    /// Allocates nothing.
    pub fn observe_rows(&mut self, src: &[u8], dtype: Dtype, rows: usize) -> Result<()> {
        let channels = self.channels();
        check_observe_rows(src, dtype, rows, channels)?;
        let es = dtype.size();
        let (hd, half) = (self.head_dim, self.head_dim / 2);
        let mut x = [0f32; BLOCK];
        let mut y = [0f32; BLOCK];
        let mut xy = [0f32; 2 * BLOCK];
        for h in 0..rows * (channels / hd) {
            // Head `h` of the batch; its pairs are `radius2[(h % heads) * half ..]`.
            let e0 = h * hd;
            let p0 = (h % (channels / hd)) * half;
            let mut i0 = 0;
            while i0 < half {
                let n = BLOCK.min(half - i0);
                let r2 = &mut self.radius2[p0 + i0..p0 + i0 + n];
                match self.style {
                    RopeStyle::Norm => {
                        let a = (e0 + 2 * i0) * es;
                        load_f32(dtype, &src[a..a + 2 * n * es], &mut xy[..2 * n]);
                        for (m, p) in r2.iter_mut().zip(xy.chunks_exact(2)) {
                            *m = m.max(p[0] * p[0] + p[1] * p[1]);
                        }
                    }
                    RopeStyle::Neox => {
                        let a = (e0 + i0) * es;
                        let b = (e0 + half + i0) * es;
                        load_f32(dtype, &src[a..a + n * es], &mut x[..n]);
                        load_f32(dtype, &src[b..b + n * es], &mut y[..n]);
                        for ((m, &u), &v) in r2.iter_mut().zip(&x[..n]).zip(&y[..n]) {
                            *m = m.max(u * u + v * v);
                        }
                    }
                }
                i0 += n;
            }
        }
        self.tokens += rows as u64;
        Ok(())
    }

    /// Observes tokens `tokens` of `src` laid out as `layout` (any addressing). All or
    /// nothing: a channel count other than `channels()`
    /// ([`Error::LayoutMismatch`](crate::Error::LayoutMismatch)), a short buffer, a range
    /// past the capacity, an int8 layout or a NaN / infinity leave the statistics
    /// unchanged.
    pub fn observe(
        &mut self,
        src: &[u8],
        layout: &TensorLayout,
        tokens: Range<usize>,
    ) -> Result<()> {
        let channels = self.channels();
        if layout.channels() != channels {
            return Err(crate::Error::LayoutMismatch {
                what: "calibration channels",
                expected: channels,
                found: layout.channels(),
            });
        }
        // Per-channel statistics first: they check the buffer, dtype, range and values.
        ChannelStats::new(channels).observe(src, layout, tokens.clone())?;
        let dtype = layout.dtype();
        let es = dtype.size();
        let offs: Vec<usize> = (0..channels).map(|c| layout.channel_offset(c)).collect();
        let mut row = vec![0f32; channels];
        for t in tokens.clone() {
            let base = layout.token_offset(t);
            for (x, &co) in row.iter_mut().zip(&offs) {
                let e = (base + co) * es;
                load_f32(dtype, &src[e..e + es], std::slice::from_mut(x));
            }
            self.observe_row(&row);
        }
        self.tokens += tokens.len() as u64;
        Ok(())
    }

    /// Symmetric C8 parameters: both channels of a pair get `max(max_radius / 127, eps)`,
    /// offsets 0.
    pub fn finish(&self) -> Result<ChannelQuant> {
        let channels = self.channels();
        let mut scale = vec![0f32; channels];
        for (p, &r2) in self.radius2.iter().enumerate() {
            let s = (r2.sqrt() / 127.0).max(f32::EPSILON);
            let (a, b) = self.pair(p);
            scale[a] = s;
            scale[b] = s;
        }
        ChannelQuant::new(scale, vec![0.0; channels])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize_rows, quantize_rows};
    use kvc_cache::Addressing;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 20) as f32 - 8.0
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Rotates every pair of `row` by `angle * (pair index in head + 1)`.
    fn rotate(st: &RopeStats, row: &[f32], angle: f32) -> Vec<f32> {
        let mut out = row.to_vec();
        for p in 0..st.channels() / 2 {
            let (a, b) = st.pair(p);
            let th = angle * ((p % (st.head_dim() / 2)) as f32 + 1.0);
            let (s, c) = th.sin_cos();
            out[a] = row[a] * c - row[b] * s;
            out[b] = row[a] * s + row[b] * c;
        }
        out
    }

    /// Calibrated on one row, the same row rotated by any angle never clips: every
    /// quantized value stays within ±127 and dequantizes within one step.
    #[test]
    fn rotated_rows_never_clip() {
        let mut r = rng(3);
        for style in [RopeStyle::Norm, RopeStyle::Neox] {
            let (heads, hd) = (3, 8);
            let row: Vec<f32> = (0..heads * hd).map(|_| r()).collect();
            let mut st = RopeStats::new(heads * hd, hd, style).unwrap();
            st.observe_rows(&f32_bytes(&row), Dtype::F32, 1).unwrap();
            let q = st.finish().unwrap();
            assert!(q.is_symmetric());
            // Per-channel calibration on the same row clips the rotated rows.
            let mut cs = ChannelStats::new(heads * hd);
            cs.observe_rows(&f32_bytes(&row), Dtype::F32, 1).unwrap();
            let qc = cs.finish(true).unwrap();
            let mut channel_max_err = 0f32;
            for k in 0..64 {
                let angle = k as f32 * 0.1;
                let rot = rotate(&st, &row, angle);
                let rt = |q: &ChannelQuant| {
                    let mut i8s = vec![0u8; rot.len()];
                    quantize_rows(&f32_bytes(&rot), Dtype::F32, 1, q, &mut i8s).unwrap();
                    let mut back = vec![0u8; rot.len() * 4];
                    dequantize_rows(&i8s, 1, q, &mut back, Dtype::F32).unwrap();
                    let back: Vec<f32> = back
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                        .collect();
                    (i8s, back)
                };
                let (i8s, back) = rt(&q);
                for c in 0..rot.len() {
                    let (x, y) = (rot[c], back[c]);
                    assert!(
                        (x - y).abs() <= q.scale()[c] * 0.5 + 1e-6,
                        "{style:?} angle {angle} channel {c}: {x} -> {y}"
                    );
                    assert_ne!(i8s[c] as i8, -128);
                }
                let (_, back) = rt(&qc);
                for (x, y) in rot.iter().zip(&back) {
                    channel_max_err = channel_max_err.max((x - y).abs());
                }
            }
            assert!(
                channel_max_err > 0.5,
                "per-channel scales were expected to clip rotated rows ({channel_max_err})"
            );
        }
    }

    #[test]
    fn pairs_follow_the_style() {
        let st = RopeStats::new(8, 4, RopeStyle::Norm).unwrap();
        let p: Vec<_> = (0..4).map(|i| st.pair(i)).collect();
        assert_eq!(p, [(0, 1), (2, 3), (4, 5), (6, 7)]);
        let st = RopeStats::new(8, 4, RopeStyle::Neox).unwrap();
        let p: Vec<_> = (0..4).map(|i| st.pair(i)).collect();
        assert_eq!(p, [(0, 2), (1, 3), (4, 6), (5, 7)]);
        // Scales: the pair's radius / 127.
        let mut st = RopeStats::new(4, 4, RopeStyle::Neox).unwrap();
        st.observe_rows(&f32_bytes(&[3.0, 0.0, 4.0, -1.0]), Dtype::F32, 1)
            .unwrap();
        st.observe_rows(&f32_bytes(&[0.0, 2.0, 0.0, 0.0]), Dtype::F32, 1)
            .unwrap();
        let q = st.finish().unwrap();
        let s0 = 5.0 / 127.0;
        let s1 = 2.0f32.max(1.0) / 127.0;
        assert_eq!(q.scale(), &[s0, s1, s0, s1]);
        assert_eq!(q.offset(), &[0.0; 4]);
        assert_eq!(st.tokens_observed(), 2);
        // Nothing observed: eps scales, still valid.
        let q = RopeStats::new(4, 2, RopeStyle::Norm)
            .unwrap()
            .finish()
            .unwrap();
        assert_eq!(q.scale(), &[f32::EPSILON; 4]);
    }

    #[test]
    fn bad_geometry_is_a_typed_error() {
        for (channels, hd) in [(8, 3), (8, 0), (12, 8), (0, 2), (6, 4)] {
            for style in [RopeStyle::Norm, RopeStyle::Neox] {
                let e = RopeStats::new(channels, hd, style).unwrap_err();
                assert!(
                    matches!(e, crate::Error::InvalidShape { .. }),
                    "{channels}/{hd}: {e}"
                );
                assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
            }
        }
    }

    #[test]
    fn bad_rows_leave_the_stats_unchanged() {
        let mut st = RopeStats::new(4, 2, RopeStyle::Norm).unwrap();
        st.observe_rows(&f32_bytes(&[1.0, 1.0, 2.0, 0.0]), Dtype::F32, 1)
            .unwrap();
        let before = st.clone();
        let nan = f32_bytes(&[9.0, 9.0, 9.0, f32::NAN]);
        assert!(matches!(
            st.observe_rows(&nan, Dtype::F32, 1),
            Err(crate::Error::NonFinite { index: 3, .. })
        ));
        assert!(st.observe_rows(&nan[..12], Dtype::F32, 1).is_err());
        assert!(st.observe_rows(&[0u8; 4], Dtype::I8, 1).is_err());
        assert!(st.observe_rows(&[], Dtype::F32, usize::MAX).is_err());
        let l = TensorLayout::new(Addressing::CellRows, Dtype::F32, 1, 4, 1).unwrap();
        assert!(st.observe(&nan, &l, 0..1).is_err());
        assert!(st.observe(&nan[..8], &l, 0..1).is_err());
        let l6 = TensorLayout::new(Addressing::CellRows, Dtype::F32, 1, 6, 1).unwrap();
        assert!(st.observe(&[0u8; 24], &l6, 0..1).is_err());
        assert_eq!(st, before);
    }

    /// The layout API (any addressing) and the rows API agree exactly.
    #[test]
    fn layout_and_rows_agree() {
        let mut r = rng(11);
        // The second geometry has pairs across several row blocks.
        for ((heads, hd), style) in [(2, 8), (2, 1040)]
            .into_iter()
            .flat_map(|g| [(g, RopeStyle::Norm), (g, RopeStyle::Neox)])
        {
            let tokens = 5;
            let channels = heads * hd;
            let rows: Vec<f32> = (0..tokens * channels).map(|_| r()).collect();
            let mut a = RopeStats::new(channels, hd, style).unwrap();
            a.observe_rows(&f32_bytes(&rows), Dtype::F32, tokens)
                .unwrap();
            for addressing in [
                Addressing::CellRows,
                Addressing::CellColumns,
                Addressing::HeadMajor,
            ] {
                let l = TensorLayout::new(addressing, Dtype::F32, heads, hd, tokens).unwrap();
                let mut buf = vec![0f32; l.elem_count()];
                for t in 0..tokens {
                    for c in 0..channels {
                        buf[l.offset(t, c / hd, c % hd)] = rows[t * channels + c];
                    }
                }
                let mut b = RopeStats::new(channels, hd, style).unwrap();
                b.observe(&f32_bytes(&buf), &l, 0..tokens).unwrap();
                assert_eq!(a, b, "{style:?} {addressing:?}");
                assert_eq!(a.finish().unwrap(), b.finish().unwrap());
            }
        }
    }
}
