//! The KV element types the compressor reads and writes. (The weight file's element type is
//! kvc's shared [`kvc_types::FloatDtype`], whose codes are its `dtype_code`s.)

use half::{bf16, f16};

/// A KV-cache element type the compressor reads and writes: `f32`, [`f16`](struct@f16) or [`bf16`].
///
/// Computation is always in `f32`; results are rounded to nearest-even on the way back.
pub trait KvElement: Copy + Send + Sync + bytemuck::Pod + sealed::Sealed + 'static {
    /// A short name for messages (`f32`, `f16`, `bf16`).
    const NAME: &'static str;
    /// Widens `src` into `dst` (same length).
    fn widen(src: &[Self], dst: &mut [f32]);
    /// Rounds `src` into `dst` (same length).
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// `src` itself when `Self` is `f32`, so the compressor can skip the widening copy.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

impl KvElement for f32 {
    const NAME: &'static str = "f32";
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
    fn as_f32(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
}

impl KvElement for f16 {
    const NAME: &'static str = "f16";
    fn widen(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
}

impl KvElement for bf16 {
    const NAME: &'static str = "bf16";
    fn widen(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_rounds_to_nearest_even() {
        let src = [1.0f32 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0];
        let mut dst = [f16::ZERO; 2];
        f16::narrow(&src, &mut dst);
        assert_eq!(dst[0].to_f32(), 1.0);
        assert_eq!(dst[1].to_f32(), 1.0 + 2.0 / 1024.0);
    }
}
