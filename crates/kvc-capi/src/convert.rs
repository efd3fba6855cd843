//! Element type conversion between fp16, bf16 and fp32 rows (a capability engines need
//! to feed kvc from caches of any of these types); rounding is IEEE round-to-nearest-even.

use std::ffi::c_void;

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use kvc_types::FloatDtype;

use crate::boundary::{
    check_disjoint, in_slice, out_ref, out_slice, status_boundary, value_boundary,
};
use crate::error::Error;
use crate::status::KvcStatus;

/// An element type, passed from C as a plain integer (one of the `KVC_DTYPE_*` values;
/// any other value is rejected with `KVC_INVALID_ARGUMENT`). The values are the
/// `dtype_code`s of the kvc compressor weight file (`.bin` v1).
pub type KvcDtype = u32;

/// IEEE 754 binary16, stored as `uint16_t` bits in native byte order.
pub const KVC_DTYPE_F16: KvcDtype = 0;
/// bfloat16 (the upper half of an fp32), stored as `uint16_t` bits in native byte order.
pub const KVC_DTYPE_BF16: KvcDtype = 1;
/// IEEE 754 binary32 (`float`).
pub const KVC_DTYPE_F32: KvcDtype = 2;
/// Signed 8-bit integers (`int8_t`): C8-quantized caches. Accepted by the codec, the
/// cache view and the quantizer; `kvc_convert` rejects it. Added in ABI 0.2.
pub const KVC_DTYPE_I8: KvcDtype = 3;

// The values are kvc's shared dtype codes.
const _: () = {
    assert!(KVC_DTYPE_F16 == kvc_types::Dtype::F16.code());
    assert!(KVC_DTYPE_BF16 == kvc_types::Dtype::Bf16.code());
    assert!(KVC_DTYPE_F32 == kvc_types::Dtype::F32.code());
    assert!(KVC_DTYPE_I8 == kvc_types::Dtype::I8.code());
};

/// The float dtype of a C `kvc_dtype` value for `argument`: `KVC_INVALID_ARGUMENT` for
/// `KVC_DTYPE_I8` (nothing here converts int8) and for a value that is no dtype.
fn float_dtype(code: KvcDtype, argument: &'static str) -> Result<FloatDtype, Error> {
    FloatDtype::from_code(code).ok_or_else(|| {
        Error::invalid(
            argument,
            format!(
                "{code} is not a kvc_dtype (KVC_DTYPE_F16 = 0, KVC_DTYPE_BF16 = 1, \
                 KVC_DTYPE_F32 = 2)"
            ),
        )
    })
}

/// A row of elements to convert from.
#[derive(Clone, Copy, Debug)]
pub enum Row<'a> {
    /// fp16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    Bf16(&'a [bf16]),
    /// fp32 elements.
    F32(&'a [f32]),
}

/// A row of elements to convert into.
#[derive(Debug)]
pub enum RowMut<'a> {
    /// fp16 elements.
    F16(&'a mut [f16]),
    /// bf16 elements.
    Bf16(&'a mut [bf16]),
    /// fp32 elements.
    F32(&'a mut [f32]),
}

impl Row<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Row::F16(s) => s.len(),
            Row::Bf16(s) => s.len(),
            Row::F32(s) => s.len(),
        }
    }

    /// Whether the row is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RowMut<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            RowMut::F16(s) => s.len(),
            RowMut::Bf16(s) => s.len(),
            RowMut::F32(s) => s.len(),
        }
    }

    /// Whether the row is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Converts `src` into `dst` element by element (round-to-nearest-even when narrowing;
/// NaN stays NaN, infinities stay infinite, values beyond the target's range become
/// infinities). Fails when the lengths differ.
pub fn convert_row(src: Row<'_>, dst: RowMut<'_>) -> Result<(), Error> {
    if src.len() != dst.len() {
        return Err(Error::invalid(
            "dst",
            format!("holds {} elements, src has {}", dst.len(), src.len()),
        ));
    }
    match (src, dst) {
        (Row::F16(s), RowMut::F16(d)) => d.copy_from_slice(s),
        (Row::Bf16(s), RowMut::Bf16(d)) => d.copy_from_slice(s),
        (Row::F32(s), RowMut::F32(d)) => d.copy_from_slice(s),
        (Row::F16(s), RowMut::F32(d)) => s.convert_to_f32_slice(d),
        (Row::Bf16(s), RowMut::F32(d)) => s.convert_to_f32_slice(d),
        (Row::F32(s), RowMut::F16(d)) => d.convert_from_f32_slice(s),
        (Row::F32(s), RowMut::Bf16(d)) => d.convert_from_f32_slice(s),
        (Row::F16(s), RowMut::Bf16(d)) => {
            for (d, s) in d.iter_mut().zip(s) {
                *d = bf16::from_f32(s.to_f32());
            }
        }
        (Row::Bf16(s), RowMut::F16(d)) => {
            for (d, s) in d.iter_mut().zip(s) {
                *d = f16::from_f32(s.to_f32());
            }
        }
    }
    Ok(())
}

/// Size in bytes of one element of `dtype`, or 0 when `dtype` is not a `KVC_DTYPE_*`.
///
/// Threads: safe from any thread. Does not touch the last error.
#[no_mangle]
pub extern "C" fn kvc_dtype_size(dtype: KvcDtype) -> usize {
    value_boundary(0, || {
        kvc_types::Dtype::from_code(dtype).map_or(0, kvc_types::Dtype::size)
    })
}

/// Forms the typed input row for `count` elements of `dtype` at `src`.
///
/// # Safety
/// `src` must point to `count` readable elements of `dtype` (when non-NULL and aligned).
unsafe fn input_row<'a>(
    dtype: FloatDtype,
    src: *const c_void,
    count: usize,
) -> Result<Row<'a>, Error> {
    Ok(match dtype {
        FloatDtype::F16 | FloatDtype::Bf16 => {
            // SAFETY: forwarded contract; `in_slice` checks NULL, alignment and size.
            let bits = unsafe { in_slice(src.cast::<u16>(), count, "src") }?;
            if dtype == FloatDtype::F16 {
                Row::F16(bits.reinterpret_cast())
            } else {
                Row::Bf16(bits.reinterpret_cast())
            }
        }
        FloatDtype::F32 => {
            // SAFETY: forwarded contract; `in_slice` checks NULL, alignment and size.
            Row::F32(unsafe { in_slice(src.cast::<f32>(), count, "src") }?)
        }
    })
}

/// Forms the typed output row for `count` elements of `dtype` at `dst`.
///
/// # Safety
/// `dst` must point to `count` writable elements of `dtype` (when non-NULL and aligned).
unsafe fn output_row<'a>(
    dtype: FloatDtype,
    dst: *mut c_void,
    count: usize,
) -> Result<RowMut<'a>, Error> {
    Ok(match dtype {
        FloatDtype::F16 | FloatDtype::Bf16 => {
            // SAFETY: forwarded contract; `out_slice` checks NULL, alignment and size.
            let bits = unsafe { out_slice(dst.cast::<u16>(), count, "dst") }?;
            if dtype == FloatDtype::F16 {
                RowMut::F16(bits.reinterpret_cast_mut())
            } else {
                RowMut::Bf16(bits.reinterpret_cast_mut())
            }
        }
        FloatDtype::F32 => {
            // SAFETY: forwarded contract; `out_slice` checks NULL, alignment and size.
            RowMut::F32(unsafe { out_slice(dst.cast::<f32>(), count, "dst") }?)
        }
    })
}

/// Converts `count` elements of `src_dtype` at `src` into `dst_dtype` at `dst`.
///
/// Narrowing rounds to nearest, ties to even; NaN stays NaN; values beyond the target's
/// range become infinities. Same-type calls copy.
///
/// Buffers (caller-owned output with a size query, the pattern of every kvc output):
/// - `src`: `count` elements, aligned for `src_dtype`; may be NULL only if `count` is 0.
/// - `dst`, `dst_capacity`: the output and its capacity in elements of `dst_dtype`.
///   `dst == NULL && dst_capacity == 0` is a size query: `*dst_len` receives the number
///   of elements needed and `KVC_OK` is returned.
/// - `dst_len` (required): receives the number of elements written (`count`).
/// - `dst` must not overlap `src` (`KVC_INVALID_ARGUMENT`).
///
/// Returns `KVC_OK`; `KVC_NULL_ARGUMENT` (`dst_len` NULL, or `src`/`dst` NULL with a
/// nonzero count/capacity); `KVC_INVALID_ARGUMENT` (unknown dtype, misaligned pointer,
/// overlap, a size that cannot exist); `KVC_BUFFER_TOO_SMALL` (`dst_capacity < count`:
/// `*dst_len` receives `count`, `dst` is untouched). On any other failure nothing is
/// written.
///
/// Ownership: borrows `src` and `dst` for the duration of the call only.
/// Threads: safe from any number of threads at once (no shared state).
///
/// # Safety
/// `src` must be valid for reading `count` elements and `dst` for writing `dst_capacity`
/// elements of their dtypes; `dst_len` must be valid for writing.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_convert(
    src_dtype: KvcDtype,
    src: *const c_void,
    count: usize,
    dst_dtype: KvcDtype,
    dst: *mut c_void,
    dst_capacity: usize,
    dst_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_convert", || {
        // SAFETY: `dst_len` is valid for writing (contract); `out_ref` checks NULL.
        let dst_len = unsafe { out_ref(dst_len, "dst_len") }?;
        let src_type = float_dtype(src_dtype, "src_dtype")?;
        let dst_type = float_dtype(dst_dtype, "dst_dtype")?;
        // SAFETY: `src` is readable for `count` elements (contract).
        let src_row = unsafe { input_row(src_type, src, count) }?;
        if dst.is_null() && dst_capacity == 0 {
            *dst_len = count;
            return Ok(());
        }
        if dst.is_null() {
            return Err(Error::NullArgument { argument: "dst" });
        }
        if dst_capacity < count {
            *dst_len = count;
            return Err(Error::BufferTooSmall {
                argument: "dst",
                needed: count,
                capacity: dst_capacity,
            });
        }
        let src_bytes = count * src_type.size(); // cannot overflow: `input_row` checked it
        let dst_bytes = count
            .checked_mul(dst_type.size())
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid(
                    "count",
                    format!("{count} elements of dst_dtype cannot exist"),
                )
            })?;
        // Only `count` elements are written; only they need to be disjoint from `src`.
        check_disjoint(
            src.cast(),
            src_bytes,
            dst.cast_const().cast(),
            dst_bytes,
            "dst",
        )?;
        // SAFETY: `dst` is writable for `dst_capacity >= count` elements (contract) and
        // does not overlap `src` (checked).
        let dst_row = unsafe { output_row(dst_type, dst, count) }?;
        convert_row(src_row, dst_row)?;
        *dst_len = count;
        Ok(())
    })
}
