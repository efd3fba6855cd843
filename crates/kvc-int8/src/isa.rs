//! The element kernels on `f32` runs: the C8 formula ([`q1`]), its vectorizable twin
//! ([`q_fast`]), and quantize / dequantize loops compiled portable and for AVX2, picked by
//! [`Isa`].

/// `1.5 * 2^23`: adding it to a value in [-128, 127] leaves `round_ties_even(v)` in the low
/// mantissa bits (the default rounding mode is nearest-even, and every float in
/// `[2^23, 2^24)` is an integer).
const MAGIC: f32 = 12_582_912.0;

/// The C8 formula, as written: `clamp(round_ties_even(x / scale + offset), -128, 127)`
/// (rounded after clamping, which commutes with rounding to integer bounds; NaN casts to 0).
/// The reference the fast kernel is tested against.
pub fn q1(x: f32, scale: f32, offset: f32) -> i8 {
    let v = (x / scale + offset).clamp(-128.0, 127.0);
    ((v + MAGIC) - MAGIC) as i8
}

/// [`q1`] without a float-to-int conversion: the rounded integer is read from the bits of
/// `v + MAGIC` (its mantissa holds `round_ties_even(v)` offset by `MAGIC`), NaN mapped to 0
/// first as the saturating cast does. Only integer and compare/select operations after the
/// division, so loops of it vectorize (the saturating `as i8` does not). Equal to `q1` for
/// every input (tested).
#[inline(always)]
pub fn q_fast(x: f32, scale: f32, offset: f32) -> i8 {
    let v = (x / scale + offset).clamp(-128.0, 127.0);
    let v = if v.is_nan() { 0.0 } else { v };
    ((v + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32) as i8
}

#[inline(always)]
fn quant_run_body(x: &[f32], scale: &[f32], offset: &[f32], out: &mut [u8]) {
    for (((d, &x), &s), &f) in out.iter_mut().zip(x).zip(scale).zip(offset) {
        *d = q_fast(x, s, f) as u8;
    }
}

#[inline(always)]
fn quant_bcast_body(x: &[f32], scale: f32, offset: f32, out: &mut [u8]) {
    for (d, &x) in out.iter_mut().zip(x) {
        *d = q_fast(x, scale, offset) as u8;
    }
}

#[inline(always)]
fn dequant_run_body(q: &[u8], scale: &[f32], offset: &[f32], out: &mut [f32]) {
    for (((x, &b), &s), &f) in out.iter_mut().zip(q).zip(scale).zip(offset) {
        *x = (f32::from(b as i8) - f) * s;
    }
}

#[inline(always)]
fn dequant_bcast_body(q: &[u8], scale: f32, offset: f32, out: &mut [f32]) {
    for (x, &b) in out.iter_mut().zip(q) {
        *x = (f32::from(b as i8) - offset) * scale;
    }
}

/// The same loops compiled for AVX2 (wider vectors; no FMA, so results are identical:
/// Rust never contracts `a * b + c`).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quant_run(x: &[f32], scale: &[f32], offset: &[f32], out: &mut [u8]) {
        super::quant_run_body(x, scale, offset, out)
    }
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quant_bcast(x: &[f32], scale: f32, offset: f32, out: &mut [u8]) {
        super::quant_bcast_body(x, scale, offset, out)
    }
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequant_run(q: &[u8], scale: &[f32], offset: &[f32], out: &mut [f32]) {
        super::dequant_run_body(q, scale, offset, out)
    }
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dequant_bcast(q: &[u8], scale: f32, offset: f32, out: &mut [f32]) {
        super::dequant_bcast_body(q, scale, offset, out)
    }
}

/// Which compiled loops to run: AVX2 when the CPU has it, else portable. Only
/// [`Isa::detect`] can select AVX2, so holding an `Isa` proves the CPU runs its loops;
/// tests force [`Isa::PORTABLE`] too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa(IsaKind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IsaKind {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Isa {
    /// The portable loops.
    pub const PORTABLE: Isa = Isa(IsaKind::Portable);

    /// The best loops this CPU runs: AVX2 when it has AVX2, FMA and F16C (the same test as
    /// kvq's `Isa::detect`; every AVX2 CPU kvc targets has all three).
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Isa(IsaKind::Avx2);
        }
        Isa::PORTABLE
    }

    /// Whether this selects the AVX2 loops.
    pub fn is_avx2(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.0 == IsaKind::Avx2 {
            return true;
        }
        false
    }

    /// `out[i] = q(x[i], scale[i], offset[i])`.
    pub fn quant_run(self, x: &[f32], scale: &[f32], offset: &[f32], out: &mut [u8]) {
        match self.0 {
            IsaKind::Portable => quant_run_body(x, scale, offset, out),
            // SAFETY: `IsaKind::Avx2` is only made by `Isa::detect` after the CPU reported
            // AVX2 (and FMA).
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => unsafe { avx2::quant_run(x, scale, offset, out) },
        }
    }

    /// `out[i] = q(x[i], scale, offset)`.
    pub fn quant_bcast(self, x: &[f32], scale: f32, offset: f32, out: &mut [u8]) {
        match self.0 {
            IsaKind::Portable => quant_bcast_body(x, scale, offset, out),
            // SAFETY: `IsaKind::Avx2` is only made by `Isa::detect` after the CPU reported
            // AVX2 (and FMA).
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => unsafe { avx2::quant_bcast(x, scale, offset, out) },
        }
    }

    /// `out[i] = (q[i] - offset[i]) * scale[i]`.
    pub fn dequant_run(self, q: &[u8], scale: &[f32], offset: &[f32], out: &mut [f32]) {
        match self.0 {
            IsaKind::Portable => dequant_run_body(q, scale, offset, out),
            // SAFETY: `IsaKind::Avx2` is only made by `Isa::detect` after the CPU reported
            // AVX2 (and FMA).
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => unsafe { avx2::dequant_run(q, scale, offset, out) },
        }
    }

    /// `out[i] = (q[i] - offset) * scale`.
    pub fn dequant_bcast(self, q: &[u8], scale: f32, offset: f32, out: &mut [f32]) {
        match self.0 {
            IsaKind::Portable => dequant_bcast_body(q, scale, offset, out),
            // SAFETY: `IsaKind::Avx2` is only made by `Isa::detect` after the CPU reported
            // AVX2 (and FMA).
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => unsafe { avx2::dequant_bcast(q, scale, offset, out) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(x: f32, s: f32, f: f32) {
        assert_eq!(
            q_fast(x, s, f),
            q1(x, s, f),
            "x {x:e} ({:#x}) s {s} f {f}",
            x.to_bits()
        );
    }

    const PARAMS: [(f32, f32); 6] = [
        (1.0, 0.0),
        (0.5, 0.0),
        (0.0123, -37.0),
        (3.0e-5, 12.0),
        (7.5, 127.0),
        (f32::MIN_POSITIVE, -128.0),
    ];

    #[test]
    fn fast_rounding_equals_the_formula() {
        for (s, f) in PARAMS {
            // A stride through every bit pattern (NaNs, infinities, subnormals included).
            let mut b = 0u32;
            loop {
                check(f32::from_bits(b), s, f);
                match b.checked_add(1021) {
                    Some(n) => b = n,
                    None => break,
                }
            }
            for x in [
                0.0,
                -0.0,
                f32::NAN,
                -f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::MAX,
                f32::MIN,
                f32::EPSILON,
            ] {
                check(x, s, f);
            }
        }
        // Every tie and its neighbours in and around [-128, 127] (scale 1, offset 0 puts v
        // exactly there), and ties reached through the division and offset.
        for k in -140i32..=140 {
            let t = k as f32 + 0.5;
            for v in [
                t,
                f32::from_bits(t.to_bits() + 1),
                f32::from_bits(t.to_bits() - 1),
            ] {
                check(v, 1.0, 0.0);
                check(v * 0.25, 0.25, 0.0);
                check(v - 3.0, 1.0, 3.0);
            }
        }
    }
}
