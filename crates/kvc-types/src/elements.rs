//! Slices of little-endian elements of a [`Dtype`] to `f32` and back, written once for
//! every crate that reads or writes cache bytes.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::Dtype;

/// Converts the first `dst.len()` elements of `src` (little-endian `dtype`) to `f32`.
///
/// Exact for every dtype (`i8` values become the integers they are). f16 goes through
/// `half`'s slice conversion (F16C where the CPU has it) when `src` is 2-byte aligned.
///
/// # Panics
/// When `src` is shorter than `dst.len() * dtype.size()` bytes.
pub fn load_f32(dtype: Dtype, src: &[u8], dst: &mut [f32]) {
    let src = &src[..dst.len() * dtype.size()];
    match dtype {
        Dtype::F16 => match bytemuck::try_cast_slice::<u8, f16>(src) {
            Ok(h) if cfg!(target_endian = "little") => h.convert_to_f32_slice(dst),
            _ => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        Dtype::Bf16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        Dtype::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::I8 => {
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = f32::from(b as i8);
            }
        }
    }
}

/// Converts `src` to `dtype` into the first `src.len() * dtype.size()` bytes of `dst`
/// (little-endian): f16 and bf16 round to nearest, ties to even (NaN stays NaN, values
/// past the range become infinities); `i8` rounds ties to even and saturates to
/// `[-128, 127]` (NaN to 0).
///
/// # Panics
/// When `dst` is shorter than `src.len() * dtype.size()` bytes.
pub fn store_f32(dtype: Dtype, src: &[f32], dst: &mut [u8]) {
    let dst = &mut dst[..src.len() * dtype.size()];
    match dtype {
        Dtype::F16 => match bytemuck::try_cast_slice_mut::<u8, f16>(dst) {
            Ok(h) if cfg!(target_endian = "little") => h.convert_from_f32_slice(src),
            Ok(_) | Err(_) => {
                for (c, &x) in dst.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&f16::from_f32(x).to_le_bytes());
                }
            }
        },
        Dtype::Bf16 => {
            for (c, &x) in dst.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&bf16::from_f32(x).to_le_bytes());
            }
        }
        Dtype::F32 => {
            for (c, &x) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        Dtype::I8 => {
            for (c, &x) in dst.iter_mut().zip(src) {
                *c = (x.round_ties_even().clamp(-128.0, 127.0) as i8) as u8;
            }
        }
    }
}

/// Appends `src` as little-endian elements of `dtype` to `out` ([`store_f32`]'s rounding).
pub fn extend_f32(dtype: Dtype, src: &[f32], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + src.len() * dtype.size(), 0);
    store_f32(dtype, src, &mut out[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_its_values_aligned_or_not() {
        let xs = [0.0f32, -0.0, 1.5, -2.25, 65504.0, 1e-3, -128.0, 127.0];
        for d in Dtype::ALL {
            for shift in [0usize, 1] {
                let mut bytes = vec![0u8; shift + xs.len() * d.size()];
                store_f32(d, &xs, &mut bytes[shift..]);
                let mut back = [0f32; 8];
                load_f32(d, &bytes[shift..], &mut back);
                for (&x, &y) in xs.iter().zip(&back) {
                    let want = match d {
                        Dtype::F16 => f16::from_f32(x).to_f32(),
                        Dtype::Bf16 => bf16::from_f32(x).to_f32(),
                        Dtype::F32 => x,
                        // int8 has no -0.
                        Dtype::I8 => x.round_ties_even().clamp(-128.0, 127.0) + 0.0,
                    };
                    assert_eq!(y.to_bits(), want.to_bits(), "{d} x {x} shift {shift}");
                }
                let mut appended = vec![7u8];
                extend_f32(d, &xs, &mut appended);
                assert_eq!(&appended[1..], &bytes[shift..], "{d}");
            }
        }
    }

    #[test]
    fn narrowing_rounds_to_even_and_saturates() {
        let mut b = [0u8; 4];
        store_f32(Dtype::I8, &[2.5, -300.0, f32::NAN, 126.5], &mut b);
        assert_eq!(b.map(|x| x as i8), [2, -128, 0, 126]);
        let mut h = [0u8; 2];
        store_f32(Dtype::F16, &[1e6], &mut h);
        assert_eq!(f16::from_le_bytes(h), f16::INFINITY);
    }
}
