//! [`RowCodec`]: one (token, KV head) row of `head_dim` values to a packed row of fixed
//! size and back, and the dot product of a rotated query with a packed row.
//!
//! Packed row, format version 1 (`docs/formats/kvq.md`): `n_scales` little-endian f16
//! scales, then the codes as one little-endian bit stream, code `i` in bits
//! `i*bits .. (i+1)*bits` (least significant bit first). `n_scales` is 1 for Lloyd-Max and
//! `head_dim / group` for uniform codes; `head_dim * bits` is a multiple of 8, so the row
//! is `2 * n_scales + head_dim * bits / 8` bytes with no padding.

use half::f16;

use super::codebook::{boundaries, lloyd_max};
use super::config::{check_bits, Method};
use super::rotation::{check_head_dim, Rotation, MAX_HEAD_DIM};
use crate::error::{Error, Result};
use crate::isa::{Isa, IsaKind};

/// Buckets of the Lloyd-Max coding start table (6-8 bits).
const BUCKETS: usize = 2048;

/// The packed format version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The largest magnitude of an input value that kvq accepts (`2^32`). A larger finite
/// value can never be coded: its row's norm, and so every method's f16 scale, would exceed
/// 65504 at every head_dim and bit width (a Lloyd-Max scale is at least `|x|_max /
/// sqrt(head_dim)` up to the level factor, a uniform group scale at least that divided by
/// `(2^bits - 1) / 2`). Refusing it up front, naming the element, also keeps every f32 sum
/// of the coder finite: `256 * (2^32)^2 = 2^72`, where a square of a value near `2^64`
/// would overflow f32 and used to turn the row into scale 0.
pub const MAX_ABS_VALUE: f32 = 4_294_967_296.0;

/// Bytes of the longest packed row (uniform 8-bit at head_dim 256 with a scale per 8
/// values: 64 + 256), the size of the stack scratch of a validating pass.
const MAX_ROW_BYTES: usize = 2 * (MAX_HEAD_DIM / 8) + MAX_HEAD_DIM;

/// Whether some `|v|` of `x` is above `limit` (a finite, non-negative float); NaN and the
/// infinities are above every such limit. For non-negative floats the bit patterns order
/// as the values do, so `limit_bits - |v|_bits` is negative (its sign bit set) exactly for
/// a value above: one subtraction and one OR per value, which vectorize with baseline
/// SSE2 (an `f32::max` or a 32-bit integer maximum does not).
#[inline(always)]
pub(crate) fn any_above(x: &[f32], limit: f32) -> bool {
    let l = limit.to_bits();
    let signs = x.iter().fold(0u32, |acc, v| {
        acc | l.wrapping_sub(v.to_bits() & 0x7fff_ffff)
    });
    signs >> 31 != 0
}

/// Finds the first value of `x` that kvq refuses (not finite, or beyond
/// [`MAX_ABS_VALUE`]). One branch-free pass ([`any_above`]); the index is looked up only
/// on error. `row` names the row in the error.
#[inline(always)]
pub(crate) fn check_values(what: &'static str, x: &[f32], row: usize) -> Result<()> {
    if !any_above(x, MAX_ABS_VALUE) {
        return Ok(());
    }
    let i = x
        .iter()
        .position(|v| v.is_nan() || v.abs() > MAX_ABS_VALUE)
        .unwrap_or(0);
    let v = x[i];
    Err(Error::BadValue {
        what,
        row,
        element: i,
        value: v,
        reason: if v.is_finite() {
            "is beyond kvq's input range (|value| <= 2^32; no f16 scale can code it)"
        } else {
            "is not finite"
        },
    })
}

/// The error of a row whose (or whose group's) scale does not fit in f16: names the
/// element of largest magnitude.
fn scale_error(x: &[f32], row: usize, reason: &'static str) -> Error {
    let (i, v) = x
        .iter()
        .copied()
        .enumerate()
        .fold((0, 0f32), |(bi, bv), (i, v)| {
            if v.abs() > bv.abs() {
                (i, v)
            } else {
                (bi, bv)
            }
        });
    Error::BadValue {
        what: "kvq row",
        row,
        element: i,
        value: v,
        reason,
    }
}

/// Scales in one row.
fn n_scales(method: Method, d: usize) -> Result<usize> {
    match method {
        Method::LloydMax => Ok(1),
        Method::Uniform { group } => {
            let g = group as usize;
            if g == 0 || g > d || !d.is_multiple_of(g) {
                return Err(Error::InvalidValue {
                    what: "uniform group",
                    value: i64::from(group),
                    reason: "must divide head_dim",
                });
            }
            Ok(d / g)
        }
    }
}

/// Writes a **poisoned** row: an f16 NaN scale and zero codes. An engine that must store
/// something for a row kvq cannot code (a non-finite value, a scale beyond f16) stores this,
/// so that every read of the row gives NaN, as an f16 cache would hold inf or NaN, never a
/// plausible wrong number. `row` must hold at least the 2-byte scale.
pub fn poison_row(row: &mut [u8]) {
    row.fill(0);
    row[..2].copy_from_slice(&0x7e00u16.to_le_bytes());
}

/// Whether a packed row's (first) f16 scale is finite: false for a poisoned or corrupt row.
#[inline(always)]
pub fn row_scale_is_finite(row: &[u8]) -> bool {
    half::f16::from_le_bytes([row[0], row[1]]).is_finite()
}

/// Bytes of one packed row.
pub fn row_bytes(method: Method, bits: u8, d: usize) -> Result<usize> {
    check_head_dim(d)?;
    check_bits("bits", bits)?;
    Ok(2 * n_scales(method, d)? + d * bits as usize / 8)
}

/// Bits per value of a packed row, scales included: `8 * row_bytes / head_dim`.
pub fn row_bits_per_value(method: Method, bits: u8, d: usize) -> Result<f64> {
    Ok(8.0 * row_bytes(method, bits, d)? as f64 / d as f64)
}

/// Quantizer of rows of one head size, method and bit width (K and V each have one).
#[derive(Debug, Clone)]
pub struct RowCodec {
    method: Method,
    bits: u8,
    dim: usize,
    group: usize,
    scales: usize,
    row_bytes: usize,
    rot: Rotation,
    /// Lloyd-Max levels (`2^bits`), in units of `norm / sqrt(d)`; empty for uniform.
    levels: Vec<f32>,
    /// Midpoints between levels.
    bounds: Vec<f32>,
    /// Value of each code before the scale, for the table kernels (lm: the level; uniform:
    /// `code - (2^bits - 1) / 2`), zero-padded to 16.
    table: [f32; 16],
    /// The same values for every code (`2^bits` entries), for the gather kernels.
    full_table: Vec<f32>,
    /// Lloyd-Max coding of 6-8 bits: `buckets[b]` = boundaries below the start of bucket
    /// `b` of [`BUCKETS`] equal buckets over `[-bucket_range, bucket_range]`.
    buckets: Vec<u8>,
    bucket_range: f32,
    bucket_scale: f32,
    /// Which compiled row loops to run (bytes are identical either way).
    isa: Isa,
    /// Lloyd-Max: the tables of the AVX2 quantizer.
    #[cfg(target_arch = "x86_64")]
    lm_tables: Option<super::simd::quant::LmTables>,
}

/// Writes codes `codes[..n]` of `bits` bits into `out` as an LSB-first bit stream.
#[inline(always)]
pub(crate) fn pack(codes: &[u8], bits: u32, out: &mut [u8]) {
    match bits {
        8 => {
            out[..codes.len()].copy_from_slice(codes);
            return;
        }
        4 => {
            for (o, p) in out.iter_mut().zip(codes.chunks_exact(2)) {
                *o = p[0] | (p[1] << 4);
            }
            return;
        }
        2 => {
            for (o, p) in out.iter_mut().zip(codes.chunks_exact(4)) {
                *o = p[0] | (p[1] << 2) | (p[2] << 4) | (p[3] << 6);
            }
            return;
        }
        _ => {}
    }
    match bits {
        3 => pack_octets::<3>(codes, out),
        5 => pack_octets::<5>(codes, out),
        6 => pack_octets::<6>(codes, out),
        _ => pack_octets::<7>(codes, out),
    }
}

/// [`pack`] for `B` (3, 5, 6, 7) bits: eight codes are exactly `B` bytes, built in a u64
/// (a constant width, so the copy is a fixed-size store, not a call).
#[inline(always)]
fn pack_octets<const B: usize>(codes: &[u8], out: &mut [u8]) {
    for (oct, chunk) in codes.chunks_exact(8).zip(out.chunks_exact_mut(B)) {
        let mut w = 0u64;
        for (j, &c) in oct.iter().enumerate() {
            w |= u64::from(c) << (B * j);
        }
        chunk.copy_from_slice(&w.to_le_bytes()[..B]);
    }
}

/// Reads `out.len()` codes of `bits` bits from an LSB-first bit stream.
#[inline(always)]
pub(crate) fn unpack(src: &[u8], bits: u32, out: &mut [u8]) {
    match bits {
        8 => out.copy_from_slice(&src[..out.len()]),
        4 => {
            for (pair, &b) in out.chunks_exact_mut(2).zip(src) {
                pair[0] = b & 15;
                pair[1] = b >> 4;
            }
        }
        2 => {
            for (quad, &b) in out.chunks_exact_mut(4).zip(src) {
                quad[0] = b & 3;
                quad[1] = (b >> 2) & 3;
                quad[2] = (b >> 4) & 3;
                quad[3] = b >> 6;
            }
        }
        _ => {
            // Eight codes are exactly `bits` bytes.
            let mask = (1u64 << bits) - 1;
            let nbytes = bits as usize;
            for (oct, chunk) in out.chunks_exact_mut(8).zip(src.chunks_exact(nbytes)) {
                let mut w = 0u64;
                for (i, &b) in chunk.iter().enumerate() {
                    w |= u64::from(b) << (8 * i);
                }
                for (j, c) in oct.iter_mut().enumerate() {
                    *c = ((w >> (bits as usize * j)) & mask) as u8;
                }
            }
        }
    }
}

impl RowCodec {
    /// A codec for rows of `dim` values (64, 128, 256), `bits` 2..=8, rotation `seed`.
    pub fn new(method: Method, bits: u8, dim: usize, seed: u64) -> Result<RowCodec> {
        let row_bytes = row_bytes(method, bits, dim)?;
        let scales = n_scales(method, dim)?;
        let rot = Rotation::new(dim, seed)?;
        let (levels, bounds) = match method {
            Method::LloydMax => {
                let l = lloyd_max(bits, dim)?;
                let b = boundaries(&l);
                (l, b)
            }
            Method::Uniform { .. } => (Vec::new(), Vec::new()),
        };
        let mut table = [0f32; 16];
        let half = 0.5 * ((1u32 << bits) - 1) as f32;
        for (k, t) in table.iter_mut().enumerate().take(1 << bits.min(4)) {
            *t = match method {
                Method::LloydMax => levels[k],
                Method::Uniform { .. } => k as f32 - half,
            };
        }
        let full_table: Vec<f32> = (0..1usize << bits)
            .map(|k| match method {
                Method::LloydMax => levels[k],
                Method::Uniform { .. } => k as f32 - half,
            })
            .collect();
        // Buckets cover the boundaries; values beyond clamp into the end buckets, whose
        // forward scan then runs to the right count.
        let bucket_range = bounds.last().map_or(1.0, |b| 2.0 * b.abs()).max(1e-3);
        let bucket_scale = BUCKETS as f32 / (2.0 * bucket_range);
        let buckets: Vec<u8> = (0..BUCKETS)
            .map(|b| {
                let lo = b as f32 / bucket_scale - bucket_range;
                bounds.partition_point(|&x| x < lo) as u8
            })
            .collect();
        Ok(RowCodec {
            buckets,
            bucket_range,
            bucket_scale,
            full_table,
            method,
            bits,
            dim,
            group: dim / scales,
            scales,
            row_bytes,
            rot,
            table,
            isa: Isa::detect(),
            #[cfg(target_arch = "x86_64")]
            lm_tables: if matches!(method, Method::LloydMax) {
                super::simd::quant::LmTables::new(&levels, &bounds)
            } else {
                None
            },
            levels,
            bounds,
        })
    }

    /// The method.
    pub fn method(&self) -> Method {
        self.method
    }
    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }
    /// Values per row (head_dim).
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Bytes per packed row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    /// Bits per value, scales included.
    pub fn bits_per_value(&self) -> f64 {
        8.0 * self.row_bytes as f64 / self.dim as f64
    }
    /// The rotation.
    pub fn rotation(&self) -> &Rotation {
        &self.rot
    }
    /// Lloyd-Max levels (empty for uniform codes).
    pub fn levels(&self) -> &[f32] {
        &self.levels
    }

    /// The rows at `bytes` (row `t` at `t * stride`) as the block kernels read them, when
    /// this codec's rows suit them (2-4 bits).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) fn block_rows<'a>(
        &self,
        bytes: &'a [u8],
        stride: usize,
    ) -> Option<super::simd::block::Rows<'a>> {
        if !(2..=4).contains(&self.bits) || self.group < 8 {
            return None;
        }
        Some(super::simd::block::Rows {
            bytes,
            stride,
            n_scales: self.scales,
            group: self.group,
        })
    }

    /// The compiled loops this codec runs.
    #[inline(always)]
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// f16 scales at the start of a row.
    #[inline(always)]
    pub(crate) fn n_scales(&self) -> usize {
        self.scales
    }

    /// Value of each code before the scale (zero-padded to 16 entries).
    #[inline(always)]
    pub(crate) fn table(&self) -> &[f32; 16] {
        &self.table
    }

    #[inline(always)]
    fn check_row_in(&self, x: &[f32]) -> Result<()> {
        if x.len() != self.dim {
            return Err(Error::LayoutMismatch {
                what: "row values (head_dim)",
                expected: self.dim,
                found: x.len(),
            });
        }
        Ok(())
    }

    #[inline(always)]
    fn check_packed(&self, what: &'static str, len: usize) -> Result<()> {
        if len < self.row_bytes {
            return Err(Error::BufferTooSmall {
                what,
                needed: self.row_bytes,
                found: len,
            });
        }
        Ok(())
    }

    /// Quantizes one row of `head_dim` values into `out[..row_bytes]` (`out` may be
    /// longer; nothing past `row_bytes` is written). No allocation.
    ///
    /// Errors: a row of another length, a short `out`, a value that is not finite or beyond
    /// [`MAX_ABS_VALUE`] (`Error::BadValue`, naming the element), or a scale beyond the f16
    /// range (a row norm above about `65504 * sqrt(head_dim)`; `Error::BadValue` naming the
    /// element of largest magnitude); nothing is written on error.
    pub fn quantize_row(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        self.check_row_in(x)?;
        check_values("kvq row", x, 0)?;
        self.code_checked_row(x, out)
    }

    /// Codes one row whose values were checked ([`check_values`]): the coders below do
    /// not scan them again.
    pub(crate) fn code_checked_row(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        match self.isa.0 {
            IsaKind::Portable => self.quantize_body(x, out),
            // SAFETY: `IsaKind::Avx2`/`Avx512` are only made by `Isa::detect` after the CPU reported
            // AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 | IsaKind::Avx512 => unsafe { self.quantize_avx2(x, out) },
        }
    }

    /// [`quantize_body`](Self::quantize_body) compiled for AVX2 (wider vectors; Rust
    /// does not contract or reorder float operations, so the bytes are identical).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn quantize_avx2(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        if let Some(t) = &self.lm_tables {
            if x.len() == self.dim && out.len() >= self.row_bytes {
                let mut codes = [0u8; MAX_HEAD_DIM];
                // SAFETY: AVX2 is enabled here (callers hold an AVX2 `Isa`); `x` and the
                // signs hold `dim` values (64, 128 or 256), `codes` 256 bytes; `t` is this
                // codec's Lloyd-Max table.
                let s = unsafe {
                    super::simd::quant::quantize_lm(
                        x,
                        self.rot.signs(),
                        self.rot.inv_sqrt(),
                        t,
                        u32::from(self.bits),
                        &mut codes,
                    )
                };
                if let Some(s) = s.map(f16::from_f32).filter(|s| s.is_finite()) {
                    out[..2].copy_from_slice(&s.to_le_bytes());
                    pack(
                        &codes[..self.dim],
                        u32::from(self.bits),
                        &mut out[2..self.row_bytes],
                    );
                    return Ok(());
                }
            }
        }
        if matches!(self.method, Method::Uniform { .. })
            && x.len() == self.dim
            && out.len() >= self.row_bytes
            && self.group.is_multiple_of(8)
        {
            let mut codes = [0u8; MAX_HEAD_DIM];
            let mut sc = [f16::ZERO; MAX_HEAD_DIM / 8];
            // SAFETY: AVX2 is enabled here (callers hold an AVX2 `Isa`); `x` and the signs
            // hold `dim` values (64, 128 or 256), `group` divides `dim` and is a multiple
            // of 8 (checked), `codes` holds 256 bytes and `sc` 32 >= dim / group scales.
            let done = unsafe {
                super::simd::uniform::quantize(
                    x,
                    self.rot.signs(),
                    self.rot.inv_sqrt(),
                    self.group,
                    u32::from(self.bits),
                    &mut codes,
                    &mut sc,
                )
            };
            if done.is_some() {
                let (head, body) = out[..self.row_bytes].split_at_mut(2 * self.scales);
                for (h, s) in head.chunks_exact_mut(2).zip(sc.iter()) {
                    h.copy_from_slice(&s.to_le_bytes());
                }
                pack(&codes[..self.dim], u32::from(self.bits), body);
                return Ok(());
            }
        }
        // Other methods and widths, and the rows that are errors or all zeros.
        self.quantize_body(x, out)
    }

    /// [`dequantize_body`](Self::dequantize_body) compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dequantize_avx2(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        self.check_row_in(out)?;
        self.check_packed("packed row", row.len())?;
        let mut acc = [0f32; MAX_HEAD_DIM];
        let acc = &mut acc[..self.dim];
        // SAFETY: AVX2 and FMA are enabled here; `acc` holds `dim` values, `row` at least
        // `row_bytes` (checked).
        unsafe { self.accumulate_rotated_avx2(row, 1.0, acc, 0)? };
        // SAFETY: AVX2 is enabled here; `acc` and the signs hold `dim` values.
        unsafe { super::simd::quant::unrotate(acc, self.rot.signs(), self.rot.inv_sqrt()) };
        out.copy_from_slice(acc);
        Ok(())
    }

    /// The same codec running the loops `isa` selects (an [`Isa`] is only ever made for
    /// the CPU it runs on, so any value is safe here): for tests and comparisons, e.g.
    /// `Isa::detect().without_avx512()`.
    pub fn with_isa(&self, isa: Isa) -> RowCodec {
        RowCodec {
            isa,
            ..self.clone()
        }
    }

    /// The same codec running the portable loops only (for tests and comparisons).
    pub fn portable(&self) -> RowCodec {
        RowCodec {
            isa: Isa::PORTABLE,
            ..self.clone()
        }
    }

    #[inline(always)]
    fn quantize_body(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        self.check_row_in(x)?;
        self.check_packed("packed row", out.len())?;
        let d = self.dim;
        let mut y = [0f32; MAX_HEAD_DIM];
        let y = &mut y[..d];
        y.copy_from_slice(x);
        self.rot.rotate(y);
        let mut codes = [0u8; MAX_HEAD_DIM];
        let codes = &mut codes[..d];
        let mut sc = [f16::ZERO; MAX_HEAD_DIM / 8];
        let sc = &mut sc[..self.scales];
        match self.method {
            Method::LloydMax => {
                sc[0] = self.code_lloyd(y, codes).ok_or_else(|| {
                    scale_error(
                        x,
                        0,
                        "makes the row's scale exceed f16 (row norm too large)",
                    )
                })?
            }
            Method::Uniform { .. } => {
                for ((s, yg), cg) in sc
                    .iter_mut()
                    .zip(y.chunks_exact(self.group))
                    .zip(codes.chunks_exact_mut(self.group))
                {
                    *s = self.code_uniform(yg, cg).ok_or_else(|| {
                        scale_error(x, 0, "makes a group's scale exceed f16 (group too large)")
                    })?;
                }
            }
        }
        let (head, body) = out[..self.row_bytes].split_at_mut(2 * self.scales);
        for (h, s) in head.chunks_exact_mut(2).zip(sc.iter()) {
            h.copy_from_slice(&s.to_le_bytes());
        }
        pack(codes, u32::from(self.bits), body);
        Ok(())
    }

    /// Lloyd-Max codes of rotated `y`; returns the least-squares scale
    /// `sum(y_i c_i) / sum(c_i^2)` as f16, or `None` when it does not fit in f16 (or the
    /// row's squared norm does not fit in f32: never a scale 0 for a row that is not 0).
    #[inline(always)]
    fn code_lloyd(&self, y: &[f32], codes: &mut [u8]) -> Option<f16> {
        let norm2 = lane_sum(y, |_, v| v * v);
        if !norm2.is_finite() {
            // Unreachable after `check_values` (|y| <= 2^40), kept so that no caller can
            // ever get the scale-0 row of an overflowed norm.
            return None;
        }
        if norm2 == 0.0 {
            // Every value is 0: scale 0 (the codes do not matter; the middle one is used).
            codes.fill((self.levels.len() / 2) as u8);
            return Some(f16::ZERO);
        }
        let inv = (self.dim as f32).sqrt() / norm2.sqrt();
        if self.bits <= 5 {
            // Code = how many boundaries lie below the value: one compare per boundary and
            // value, in loops over the values that vectorize (no search, no branches).
            let mut u = [0f32; MAX_HEAD_DIM];
            let u = &mut u[..y.len()];
            for (a, &v) in u.iter_mut().zip(y) {
                *a = v * inv;
            }
            // 32-bit counters: the compares and adds stay in one lane width.
            let mut cnt = [0u32; MAX_HEAD_DIM];
            let cnt = &mut cnt[..y.len()];
            for &b in &self.bounds {
                for (c, &a) in cnt.iter_mut().zip(u.iter()) {
                    *c += u32::from(b < a);
                }
            }
            for (c, &n) in codes.iter_mut().zip(cnt.iter()) {
                *c = n as u8;
            }
        } else {
            // A start from the bucket table, then forward over the few boundaries in the
            // bucket: exactly `#{boundaries < s}`, as the binary search would give.
            let (r, scale) = (self.bucket_range, self.bucket_scale);
            for (c, &v) in codes.iter_mut().zip(y) {
                let s = v * inv;
                let b = ((s.clamp(-r, r) + r) * scale) as usize;
                // The bucket before: its start is a whole bucket below `s`, so rounding in
                // the bucket index can never start the scan past a boundary above `s`.
                let mut k = self.buckets[b.min(BUCKETS - 1).saturating_sub(1)] as usize;
                while k < self.bounds.len() && self.bounds[k] < s {
                    k += 1;
                }
                *c = k as u8;
            }
        }
        let mut lv = [0f32; MAX_HEAD_DIM];
        let lv = &mut lv[..y.len()];
        for (l, &c) in lv.iter_mut().zip(codes.iter()) {
            *l = self.levels[c as usize];
        }
        let num = lane_sum(y, |i, v| v * lv[i]);
        let den = lane_sum(lv, |_, l| l * l);
        let s = f16::from_f32(num / den);
        s.is_finite().then_some(s)
    }

    /// Uniform codes of one group: scale `absmax / ((2^bits - 1) / 2)` as f16, codes
    /// `clamp(round_ties_even(y / scale + (2^bits - 1) / 2), 0, 2^bits - 1)`.
    #[inline(always)]
    fn code_uniform(&self, y: &[f32], codes: &mut [u8]) -> Option<f16> {
        let top = ((1u32 << self.bits) - 1) as f32;
        let half = 0.5 * top;
        let m = y.iter().fold(0f32, |a, v| a.max(v.abs()));
        let s = f16::from_f32(m / half);
        if !s.is_finite() {
            return None;
        }
        let sf = s.to_f32();
        if sf == 0.0 {
            codes.fill((1u32 << (self.bits - 1)) as u8);
            return Some(s);
        }
        let inv = 1.0 / sf;
        for (c, &v) in codes.iter_mut().zip(y) {
            *c = (v * inv + half).round_ties_even().clamp(0.0, top) as u8;
        }
        Some(s)
    }

    /// Reads the scales of a packed row (`row` holds at least `row_bytes`); `row_index`
    /// only names the row in the error.
    #[inline(always)]
    fn read_scales(&self, row: &[u8], sc: &mut [f32], row_index: usize) -> Result<()> {
        for (s, b) in sc.iter_mut().zip(row.chunks_exact(2)) {
            let v = f16::from_le_bytes([b[0], b[1]]).to_f32();
            if !v.is_finite() {
                return Err(Error::CorruptRow {
                    what: "f16 scale",
                    row: row_index,
                });
            }
            *s = v;
        }
        Ok(())
    }

    /// The rotated-domain values of a packed row, times `w`, added to `acc` (`acc.len()
    /// == dim`, `row.len() >= row_bytes`).
    #[inline(always)]
    pub(crate) fn accumulate_rotated(
        &self,
        row: &[u8],
        w: f32,
        acc: &mut [f32],
        row_index: usize,
    ) -> Result<()> {
        let mut sc = [0f32; MAX_HEAD_DIM / 8];
        let sc = &mut sc[..self.scales];
        self.read_scales(row, sc, row_index)?;
        self.accumulate_scaled(row, w, sc, acc);
        Ok(())
    }

    /// [`accumulate_rotated`](Self::accumulate_rotated) with the table kernels (2-4 bits).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn accumulate_rotated_avx2(
        &self,
        row: &[u8],
        w: f32,
        acc: &mut [f32],
        row_index: usize,
    ) -> Result<()> {
        use super::simd::dot as avx2;
        let mut sc = [0f32; MAX_HEAD_DIM / 8];
        let sc = &mut sc[..self.scales];
        self.read_scales(row, sc, row_index)?;
        let bits = u32::from(self.bits);
        if !avx2::handles(bits) {
            let area = &row[2 * self.scales..self.row_bytes];
            let Some(pad) = avx2::WideCodes::new(area, bits) else {
                return Err(Error::BufferTooSmall {
                    what: "packed row codes",
                    needed: 32,
                    found: area.len(),
                });
            };
            let gchunks = self.group / 8;
            for (g, (ag, &s)) in acc.chunks_exact_mut(self.group).zip(sc.iter()).enumerate() {
                // SAFETY: the caller guarantees AVX2 and FMA; `ag` holds `group` values (a
                // multiple of 8), codes `g * group ..` of the area; codes have `bits`
                // (5..=8) bits, so they index the `2^bits`-entry `full_table`.
                unsafe { avx2::axpy_gather(ag, &pad, g * gchunks, bits, &self.full_table, w * s) };
            }
            return Ok(());
        }
        let codes = &row[2 * self.scales..self.row_bytes];
        let gchunks = self.group / 8;
        for (g, (ag, &s)) in acc.chunks_exact_mut(self.group).zip(sc.iter()).enumerate() {
            // SAFETY: the caller guarantees AVX2 and FMA; `bits` is 2..=4; `ag` holds
            // `group` values (a multiple of 8), codes `g * group ..` of `codes`.
            unsafe { avx2::axpy_lut(ag, codes, g * gchunks, bits, &self.table, w * s) };
        }
        Ok(())
    }

    #[inline(always)]
    fn accumulate_scaled(&self, row: &[u8], w: f32, sc: &[f32], acc: &mut [f32]) {
        let mut codes = [0u8; MAX_HEAD_DIM];
        let codes = &mut codes[..self.dim];
        unpack(&row[2 * self.scales..], u32::from(self.bits), codes);
        match self.method {
            Method::LloydMax => {
                let ws = w * sc[0];
                for (a, &c) in acc.iter_mut().zip(codes.iter()) {
                    *a += ws * self.levels[c as usize];
                }
            }
            Method::Uniform { .. } => {
                let half = 0.5 * ((1u32 << self.bits) - 1) as f32;
                for ((ag, cg), &s) in acc
                    .chunks_exact_mut(self.group)
                    .zip(codes.chunks_exact(self.group))
                    .zip(sc.iter())
                {
                    let ws = w * s;
                    for (a, &c) in ag.iter_mut().zip(cg) {
                        *a += ws * (f32::from(c) - half);
                    }
                }
            }
        }
    }

    /// [`dot_rotated`](Self::dot_rotated) with the table kernels (2-4 bits).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn dot_rotated_avx2(
        &self,
        q_rot: &[f32],
        row: &[u8],
        row_index: usize,
    ) -> Result<f32> {
        use super::simd::dot as avx2;
        let bits = u32::from(self.bits);
        let mut sc = [0f32; MAX_HEAD_DIM / 8];
        let sc = &mut sc[..self.scales];
        self.read_scales(row, sc, row_index)?;
        if !avx2::handles(bits) {
            let area = &row[2 * self.scales..self.row_bytes];
            let Some(pad) = avx2::WideCodes::new(area, bits) else {
                return Err(Error::BufferTooSmall {
                    what: "packed row codes",
                    needed: 32,
                    found: area.len(),
                });
            };
            let gchunks = self.group / 8;
            let mut s = 0f32;
            for (gi, (qg, &g)) in q_rot.chunks_exact(self.group).zip(sc.iter()).enumerate() {
                // SAFETY: the caller guarantees AVX2 and FMA; `qg` holds `group` values (a
                // multiple of 8), codes `gi * group ..` of the area; codes have `bits`
                // (5..=8) bits, so they index the `2^bits`-entry `full_table`.
                s +=
                    g * unsafe { avx2::dot_gather(qg, &pad, gi * gchunks, bits, &self.full_table) };
            }
            return Ok(s);
        }
        let codes = &row[2 * self.scales..self.row_bytes];
        let gchunks = self.group / 8;
        let mut s = 0f32;
        for (gi, (qg, &g)) in q_rot.chunks_exact(self.group).zip(sc.iter()).enumerate() {
            // SAFETY: the caller guarantees AVX2 and FMA; `bits` is 2..=4; `qg` holds
            // `group` values (a multiple of 8), codes `gi * group ..` of `codes`.
            s += g * unsafe { avx2::dot_lut(qg, codes, gi * gchunks, bits, &self.table) };
        }
        Ok(s)
    }

    /// `q_rot . (rotated row)`: the dot product of a query already rotated by this
    /// codec's rotation ([`rotation`](Self::rotation)`().rotate(q)`) with one packed row,
    /// equal to `q . dequantize_row(row)` up to rounding (`q.k = (Rq).(Rk)`).
    ///
    /// The per-cell entry point of an engine's score loop: rotate the query once, then call
    /// this once per cached row. Per call it checks the two lengths and the row's scales
    /// (`row_index` only names the row in [`Error::CorruptRow`]) and runs the kernel chosen
    /// when the codec was made; nothing is allocated or derived again. On AVX2 the sum is
    /// in another order than the portable path's (eight lanes, FMA): the two agree to
    /// rounding (tests: within `1e-5` of `|q| |row|`).
    ///
    /// Errors: `q_rot.len() != head_dim`, `row.len() < row_bytes`, a non-finite scale.
    #[inline]
    pub fn dot_rotated(&self, q_rot: &[f32], row: &[u8], row_index: usize) -> Result<f32> {
        self.check_row_in(q_rot)?;
        self.check_packed("packed row", row.len())?;
        match self.isa.0 {
            IsaKind::Portable => self.dot_rotated_portable(q_rot, row, row_index),
            // SAFETY: `IsaKind::Avx2`/`Avx512` are only made by `Isa::detect` after the CPU reported
            // AVX2, FMA and F16C; the lengths were checked above.
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 | IsaKind::Avx512 => unsafe {
                self.dot_rotated_avx2_entry(q_rot, row, row_index)
            },
        }
    }

    /// [`dot_rotated_avx2`](Self::dot_rotated_avx2) compiled as one AVX2 function.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `q_rot.len() == dim`, `row.len() >= row_bytes`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_rotated_avx2_entry(
        &self,
        q_rot: &[f32],
        row: &[u8],
        row_index: usize,
    ) -> Result<f32> {
        // SAFETY: AVX2 and FMA are enabled here; the caller checked the lengths.
        unsafe { self.dot_rotated_avx2(q_rot, row, row_index) }
    }

    /// The rotated-basis values of one packed row: `out[i] = scale * level(code_i)`, no
    /// un-rotation (`dequantize_row` is this followed by `rotation().unrotate`, bit for
    /// bit). For an engine that accumulates V in the rotated basis and un-rotates the sum
    /// once. The values are exact products, the same on every path. No allocation.
    ///
    /// Errors: `out.len() != head_dim`, `row.len() < row_bytes`, a non-finite scale.
    #[inline]
    pub fn dequantize_row_rotated(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        self.check_row_in(out)?;
        self.check_packed("packed row", row.len())?;
        out.fill(0.0);
        match self.isa.0 {
            IsaKind::Portable => self.accumulate_rotated(row, 1.0, out, 0),
            // SAFETY: `IsaKind::Avx2`/`Avx512` are only made by `Isa::detect` after the CPU reported
            // AVX2, FMA and F16C; the lengths were checked above.
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 | IsaKind::Avx512 => unsafe { self.rotated_values_avx2(row, out) },
        }
    }

    /// `out += 1 * (rotated row)` with the AVX2 kernels (`out` zeroed by the caller: the
    /// sums are then exact products, as on the portable path).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `out.len() == dim`, `row.len() >= row_bytes`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rotated_values_avx2(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        // SAFETY: AVX2 and FMA are enabled here; the caller checked the lengths.
        unsafe { self.accumulate_rotated_avx2(row, 1.0, out, 0) }
    }

    /// The portable [`dot_rotated`](Self::dot_rotated) (lengths already checked).
    #[inline(always)]
    pub(crate) fn dot_rotated_portable(
        &self,
        q_rot: &[f32],
        row: &[u8],
        row_index: usize,
    ) -> Result<f32> {
        let mut sc = [0f32; MAX_HEAD_DIM / 8];
        let sc = &mut sc[..self.scales];
        self.read_scales(row, sc, row_index)?;
        let mut codes = [0u8; MAX_HEAD_DIM];
        let codes = &mut codes[..self.dim];
        unpack(&row[2 * self.scales..], u32::from(self.bits), codes);
        let mut vals = [0f32; MAX_HEAD_DIM];
        let vals = &mut vals[..self.dim];
        match self.method {
            Method::LloydMax => {
                for (v, &c) in vals.iter_mut().zip(codes.iter()) {
                    *v = self.levels[c as usize];
                }
                Ok(sc[0] * dot8(q_rot, vals))
            }
            Method::Uniform { .. } => {
                let half = 0.5 * ((1u32 << self.bits) - 1) as f32;
                for (v, &c) in vals.iter_mut().zip(codes.iter()) {
                    *v = f32::from(c) - half;
                }
                let mut s = 0f32;
                for ((qg, vg), &g) in q_rot
                    .chunks_exact(self.group)
                    .zip(vals.chunks_exact(self.group))
                    .zip(sc.iter())
                {
                    s += g * dot8(qg, vg);
                }
                Ok(s)
            }
        }
    }

    /// Dequantizes one packed row (`row.len() >= row_bytes`) into `out` (`head_dim`
    /// values). No allocation. A short row, a wrong `out` length or a non-finite scale is
    /// an error.
    pub fn dequantize_row(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        match self.isa.0 {
            IsaKind::Portable => self.dequantize_body(row, out),
            // SAFETY: `IsaKind::Avx2`/`Avx512` are only made by `Isa::detect` after the CPU reported
            // AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 | IsaKind::Avx512 => unsafe { self.dequantize_avx2(row, out) },
        }
    }

    #[inline(always)]
    fn dequantize_body(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        self.check_row_in(out)?;
        self.check_packed("packed row", row.len())?;
        let mut acc = [0f32; MAX_HEAD_DIM];
        let acc = &mut acc[..self.dim];
        self.accumulate_rotated(row, 1.0, acc, 0)?;
        self.rot.unrotate(acc);
        out.copy_from_slice(acc);
        Ok(())
    }

    /// `q . dequantize_row(row)` for one query of `head_dim` values (rotates `q` on the
    /// stack; the attention kernel rotates once per query instead).
    pub fn dot_row(&self, q: &[f32], row: &[u8]) -> Result<f32> {
        self.check_row_in(q)?;
        self.check_packed("packed row", row.len())?;
        let mut qr = [0f32; MAX_HEAD_DIM];
        let qr = &mut qr[..self.dim];
        qr.copy_from_slice(q);
        self.rot.rotate(qr);
        self.dot_rotated(qr, row, 0)
    }

    /// The largest input magnitude below which no row can have a scale beyond f16, so
    /// that [`check_rows_codable`](Self::check_rows_codable) need not code such a row to
    /// know it codes. Lloyd-Max: the scale `<y, l> / <l, l>` is at most `|y| / |l| <=
    /// sqrt(d) m / (sqrt(d) l_min) = m / l_min` for rows of largest magnitude `m`;
    /// uniform: a group scale is at most `|y| / half <= sqrt(d) m / half`. 60000 leaves
    /// room below 65504 for f32 rounding.
    fn always_codable_below(&self) -> f32 {
        match self.method {
            Method::LloydMax => {
                let l_min = self
                    .levels
                    .iter()
                    .fold(f32::INFINITY, |a, l| a.min(l.abs()));
                60000.0 * l_min
            }
            Method::Uniform { .. } => {
                let half = 0.5 * ((1u32 << self.bits) - 1) as f32;
                60000.0 * half / (self.dim as f32).sqrt()
            }
        }
    }

    /// Checks that every row of `x` (whole rows of `head_dim`) would code: each value
    /// finite and within [`MAX_ABS_VALUE`], each scale within f16 (coded into stack
    /// scratch for the rare rows large enough to need it). Writes nothing; the error names
    /// the row and the element.
    pub fn check_rows_codable(&self, x: &[f32]) -> Result<()> {
        match self.isa.0 {
            IsaKind::Portable => self.check_rows_body(x),
            // SAFETY: `IsaKind::Avx2`/`Avx512` are only made by `Isa::detect` after the CPU
            // reported AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 | IsaKind::Avx512 => unsafe { self.check_rows_avx2(x) },
        }
    }

    /// [`check_rows_body`](Self::check_rows_body) compiled for AVX2 (the scans in wider
    /// vectors).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn check_rows_avx2(&self, x: &[f32]) -> Result<()> {
        self.check_rows_body(x)
    }

    #[inline(always)]
    fn check_rows_body(&self, x: &[f32]) -> Result<()> {
        // `|v| >= safe` for some v, as `|v| > ` the float just below `safe`.
        let below_safe = f32::from_bits(self.always_codable_below().to_bits() - 1);
        let mut scratch = [0u8; MAX_ROW_BYTES];
        for (r, xr) in x.chunks_exact(self.dim).enumerate() {
            check_values("kvq row", xr, r)?;
            if any_above(xr, below_safe) {
                self.quantize_row(xr, &mut scratch)
                    .map_err(|e| e.at_row(r))?;
            }
        }
        Ok(())
    }

    /// Checks every packed row's scales (whole rows of `row_bytes`): finite, else
    /// `Error::CorruptRow` naming the row. Writes nothing.
    pub fn check_packed_rows(&self, packed: &[u8]) -> Result<()> {
        let mut sc = [0f32; MAX_HEAD_DIM / 8];
        let sc = &mut sc[..self.scales];
        for (r, row) in packed.chunks_exact(self.row_bytes).enumerate() {
            self.read_scales(row, sc, r)?;
        }
        Ok(())
    }

    /// Quantizes `x.len() / head_dim` rows into `out` (exactly that many rows' bytes).
    /// All or nothing: every row is checked first (as
    /// [`quantize_row`](Self::quantize_row) would refuse it, the error naming the row and
    /// the element), and `out` is written only when every row codes.
    pub fn quantize_rows(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let n = self.rows_of(x.len(), out.len())?;
        self.check_rows_codable(x)?;
        for (r, (xr, o)) in x
            .chunks_exact(self.dim)
            .zip(out.chunks_exact_mut(self.row_bytes))
            .take(n)
            .enumerate()
        {
            // Values checked by `check_rows_codable`.
            self.code_checked_row(xr, o).map_err(|e| e.at_row(r))?;
        }
        Ok(())
    }

    /// Dequantizes `out.len() / head_dim` rows from `packed` (exactly that many rows).
    /// All or nothing: every row's scales are checked first (a non-finite one is
    /// `Error::CorruptRow` naming the row), and `out` is written only when all are
    /// finite.
    pub fn dequantize_rows(&self, packed: &[u8], out: &mut [f32]) -> Result<()> {
        let n = self.rows_of(out.len(), packed.len())?;
        self.check_packed_rows(packed)?;
        for (i, (r, o)) in packed
            .chunks_exact(self.row_bytes)
            .zip(out.chunks_exact_mut(self.dim))
            .take(n)
            .enumerate()
        {
            self.dequantize_row(r, o).map_err(|e| e.at_row(i))?;
        }
        Ok(())
    }

    /// Rows in `values` values, checked against `bytes` packed bytes.
    pub(crate) fn rows_of(&self, values: usize, bytes: usize) -> Result<usize> {
        if !values.is_multiple_of(self.dim) {
            return Err(Error::LayoutMismatch {
                what: "values (a multiple of head_dim)",
                expected: values / self.dim * self.dim,
                found: values,
            });
        }
        let n = values / self.dim;
        let need = n.checked_mul(self.row_bytes).ok_or(Error::SizeOverflow {
            what: "packed rows bytes",
        })?;
        if bytes != need {
            return Err(Error::LayoutMismatch {
                what: "packed bytes (rows x row_bytes)",
                expected: need,
                found: bytes,
            });
        }
        Ok(n)
    }
}

/// `sum f(i, x[i])` in eight lanes, as the format specifies (docs/formats/kvq.md): lane
/// `j` adds the terms of `i = j, j + 8, ...` in order, then the lanes combine as
/// `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`. `x.len()` is a multiple of 8.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(usize, f32) -> f32) -> f32 {
    let mut l = [0f32; 8];
    for (k, c) in x.chunks_exact(8).enumerate() {
        for j in 0..8 {
            l[j] += f(8 * k + j, c[j]);
        }
    }
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

/// Dot product in eight independent lanes (so the loop vectorizes without reassociating
/// a single sum), lanes added pairwise at the end.
#[inline(always)]
pub(crate) fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut l = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            l[j] += x[j] * y[j];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7])) + tail
}
