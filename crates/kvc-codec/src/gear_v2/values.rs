//! Element access shared by the encoder and decoder, monomorphised per dtype.

use crate::dtype::Dtype;

/// Loads element `j` (little-endian, `BPV` bytes) as a `u32`.
#[inline(always)]
pub fn load<const BPV: usize>(s: &[u8], j: usize) -> u32 {
    let mut a = [0u8; 4];
    a[..BPV].copy_from_slice(&s[j * BPV..j * BPV + BPV]);
    u32::from_le_bytes(a)
}

/// Calls `$f::<BPV, REST, SYM>(args)` for the field split of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            $crate::dtype::Dtype::F16 => $f::<2, 8, 8>($($arg),*),
            $crate::dtype::Dtype::Bf16 => $f::<2, 7, 9>($($arg),*),
            $crate::dtype::Dtype::F32 => $f::<4, 23, 9>($($arg),*),
            $crate::dtype::Dtype::I8 => $f::<1, 0, 8>($($arg),*),
        }
    };
}
pub(crate) use dispatch;

/// Bytes of packed low bits for `values` elements of `dtype`.
pub fn rest_bytes(dtype: Dtype, values: usize) -> usize {
    let rest = super::format::FieldSplit::of(dtype).rest_bits as usize;
    (values * rest).div_ceil(8)
}
