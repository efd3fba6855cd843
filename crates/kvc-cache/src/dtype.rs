//! Element types of a KV cache (the shared [`DType`]) and their conversion to and from `f32`.

/// The element type of a cache tensor: kvc's shared [`kvc_types::Dtype`], under the name
/// this crate has always used.
pub use kvc_types::Dtype as DType;

/// Converts `src` (little-endian elements of `dtype`) to `f32` into `dst`.
///
/// `dst.len()` elements are converted; `src` must hold at least that many.
pub(crate) fn load_f32(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F16 => {
            use half::slice::HalfFloatSliceExt;
            let n = dst.len();
            // The vectorised (F16C when detected) slice conversion needs aligned f16s.
            match bytemuck::try_cast_slice::<u8, half::f16>(&src[..n * 2]) {
                Ok(h) if cfg!(target_endian = "little") => h.convert_to_f32_slice(dst),
                _ => {
                    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                        *d = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                    }
                }
            }
        }
        DType::Bf16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::I8 => {
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = f32::from(b as i8);
            }
        }
    }
}

/// Converts `src` to `dtype` (round to nearest even) into the little-endian bytes `dst`.
pub(crate) fn store_f32(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::F16 => {
            use half::slice::HalfFloatSliceExt;
            let n = src.len();
            match bytemuck::try_cast_slice_mut::<u8, half::f16>(&mut dst[..n * 2]) {
                Ok(h) if cfg!(target_endian = "little") => h.convert_from_f32_slice(src),
                Ok(_) | Err(_) => {
                    for (c, &x) in dst.chunks_exact_mut(2).zip(src) {
                        c.copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
                    }
                }
            }
        }
        DType::Bf16 => {
            for (c, &x) in dst.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes());
            }
        }
        DType::F32 => {
            for (c, &x) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        DType::I8 => {
            for (c, &x) in dst.iter_mut().zip(src) {
                *c = (x.round_ties_even().clamp(-128.0, 127.0) as i8) as u8;
            }
        }
    }
}
