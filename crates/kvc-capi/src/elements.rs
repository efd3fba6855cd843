//! Engine element buffers for `kvc-cache`: a `kvc_dtype` as kvc-cache's [`Dtype`], and a C
//! pointer plus an element count as a checked byte slice (NULL, alignment to the element
//! type, a size that can exist). Used by the cache view and the quantizer.

use std::ffi::c_void;

use kvc_types::Dtype;

use crate::boundary::{in_slice, out_slice};
use crate::convert::KvcDtype;
use crate::error::Error;

/// The kvc-cache element type of a C `kvc_dtype` (all four are accepted; operations that
/// need a float type say so themselves).
pub(crate) fn cache_dtype(code: KvcDtype, argument: &'static str) -> Result<Dtype, Error> {
    Dtype::from_code(code).ok_or_else(|| {
        Error::invalid(
            argument,
            format!(
                "{code} is not a kvc_dtype (KVC_DTYPE_F16 = 0, KVC_DTYPE_BF16 = 1, \
                 KVC_DTYPE_F32 = 2, KVC_DTYPE_I8 = 3)"
            ),
        )
    })
}

/// The C `kvc_dtype` of a kvc-cache element type.
pub(crate) fn c_dtype(dtype: Dtype) -> KvcDtype {
    dtype.code()
}

/// `a * b`, or `KVC_INVALID_ARGUMENT` naming `argument` when it overflows `size_t`.
pub(crate) fn mul(a: usize, b: usize, argument: &'static str) -> Result<usize, Error> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(argument, format!("{a} x {b} overflows size_t")))
}

fn check_aligned(
    ptr: *const c_void,
    elems: usize,
    dtype: Dtype,
    argument: &'static str,
) -> Result<(), Error> {
    if elems > 0 && !ptr.is_null() && !(ptr as usize).is_multiple_of(dtype.size()) {
        return Err(Error::invalid(
            argument,
            format!(
                "pointer {ptr:p} is not aligned to {} bytes ({} elements)",
                dtype.size(),
                dtype
            ),
        ));
    }
    Ok(())
}

/// The `elems` elements of `dtype` at `ptr` as bytes. NULL is accepted when `elems` is 0.
///
/// # Safety
/// If `ptr` is non-NULL and aligned it must point to `elems` readable elements that
/// nothing mutates for `'a`.
pub(crate) unsafe fn in_bytes<'a>(
    ptr: *const c_void,
    elems: usize,
    dtype: Dtype,
    argument: &'static str,
) -> Result<&'a [u8], Error> {
    let bytes = mul(elems, dtype.size(), argument)?;
    check_aligned(ptr, elems, dtype, argument)?;
    // SAFETY: forwarded contract; `in_slice` checks NULL and the size.
    unsafe { in_slice(ptr.cast::<u8>(), bytes, argument) }
}

/// The `elems` elements of `dtype` at `ptr` as writable bytes. NULL is accepted when
/// `elems` is 0.
///
/// # Safety
/// If `ptr` is non-NULL and aligned it must point to `elems` writable elements that
/// nothing else accesses for `'a`.
pub(crate) unsafe fn out_bytes<'a>(
    ptr: *mut c_void,
    elems: usize,
    dtype: Dtype,
    argument: &'static str,
) -> Result<&'a mut [u8], Error> {
    let bytes = mul(elems, dtype.size(), argument)?;
    check_aligned(ptr.cast_const(), elems, dtype, argument)?;
    // SAFETY: forwarded contract; `out_slice` checks NULL and the size.
    unsafe { out_slice(ptr.cast::<u8>(), bytes, argument) }
}
