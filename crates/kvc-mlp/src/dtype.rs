//! Element types: the weight file's dtype codes and the KV element types the compressor reads.

use half::{bf16, f16};
use kvc_types::Dtype;

/// The element type of a `.bin` v1 weight file (header field `dtype_code`): the float
/// subset of kvc's shared [`Dtype`], whose codes it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    /// Code 0: IEEE binary16.
    F16,
    /// Code 1: bfloat16 (the raw `uint16` payload of `torch.bfloat16`).
    Bf16,
    /// Code 2: IEEE binary32.
    F32,
}

impl WeightDtype {
    /// The dtype for a `dtype_code`, or `None` if the code is unknown or not a float
    /// (the file stores floats only).
    pub fn from_code(code: u16) -> Option<Self> {
        Dtype::from_code(code.into()).and_then(WeightDtype::from_dtype)
    }

    /// The weight dtype of a float [`Dtype`]; `None` for `i8`.
    pub fn from_dtype(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::F16 => Some(WeightDtype::F16),
            Dtype::Bf16 => Some(WeightDtype::Bf16),
            Dtype::F32 => Some(WeightDtype::F32),
            Dtype::I8 => None,
        }
    }

    /// kvc's shared element type of this weight dtype.
    pub fn dtype(self) -> Dtype {
        match self {
            WeightDtype::F16 => Dtype::F16,
            WeightDtype::Bf16 => Dtype::Bf16,
            WeightDtype::F32 => Dtype::F32,
        }
    }

    /// The `dtype_code` written in the header (kvc's shared [`Dtype::code`]).
    pub fn code(self) -> u16 {
        self.dtype().code() as u16
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.dtype().size()
    }

    /// The conventional short name (`fp16`, `bf16`, `fp32`).
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F16 => "fp16",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F32 => "fp32",
        }
    }

    /// Appends `vals` as little-endian elements of this dtype (f16 and bf16 round to nearest
    /// even, as `torch.Tensor.to` does).
    pub(crate) fn encode_into(self, vals: &[f32], out: &mut Vec<u8>) {
        match self {
            WeightDtype::F16 => {
                for &v in vals {
                    out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
                }
            }
            WeightDtype::Bf16 => {
                for &v in vals {
                    out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
                }
            }
            WeightDtype::F32 => {
                for &v in vals {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }

    /// Decodes little-endian elements of this dtype into `out` (`bytes.len() == out.len() * size`).
    pub(crate) fn decode_into(self, bytes: &[u8], out: &mut [f32]) {
        debug_assert_eq!(bytes.len(), out.len() * self.size());
        match self {
            WeightDtype::F16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
            WeightDtype::Bf16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
            WeightDtype::F32 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }
}

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
    fn dtype_codes_round_trip() {
        for d in [WeightDtype::F16, WeightDtype::Bf16, WeightDtype::F32] {
            assert_eq!(WeightDtype::from_code(d.code()), Some(d));
        }
        assert_eq!(WeightDtype::from_code(3), None); // i8: not a weight dtype
        assert_eq!(WeightDtype::from_code(4), None);
        assert_eq!(
            [WeightDtype::F16, WeightDtype::Bf16, WeightDtype::F32].map(WeightDtype::code),
            [0, 1, 2]
        );
    }

    #[test]
    fn decode_matches_half() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let mut bytes = Vec::new();
        for v in vals {
            bytes.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
        }
        let mut out = [0f32; 4];
        WeightDtype::F16.decode_into(&bytes, &mut out);
        assert_eq!(out, vals);
        bytes.clear();
        for v in vals {
            bytes.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
        }
        WeightDtype::Bf16.decode_into(&bytes, &mut out);
        assert_eq!(out[..3], vals[..3]);
        assert_eq!(out[3], bf16::from_f32(65504.0).to_f32());
    }

    #[test]
    fn narrow_rounds_to_nearest_even() {
        let src = [1.0f32 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0];
        let mut dst = [f16::ZERO; 2];
        f16::narrow(&src, &mut dst);
        assert_eq!(dst[0].to_f32(), 1.0);
        assert_eq!(dst[1].to_f32(), 1.0 + 2.0 / 1024.0);
    }
}
