//! `kvc_get_api`: the whole C API as one table of function pointers, so that a program
//! that loads kvc with `dlopen` needs a single `dlsym`.

use std::ffi::{c_char, c_int, c_void};

use crate::boundary::value_boundary;
use crate::convert::{kvc_convert, kvc_dtype_size, KvcDtype};
use crate::last_error::{kvc_last_error_message, set_last_error};
use crate::status::{kvc_status_name, KvcStatus};
use crate::version::{kvc_abi_version, kvc_version, KVC_ABI_VERSION, KVC_ABI_VERSION_MAJOR};

/// The C API as function pointers; each field behaves exactly as the function of the
/// same name with the `kvc_` prefix (see there for ownership and threads).
///
/// The table is append-only within an ABI major version: fields are never removed or
/// reordered, new ones are added at the end and bump the ABI minor version. A table
/// returned for a requested version has at least the fields of that version;
/// `struct_size` says how many bytes the library's table really has.
#[repr(C)]
pub struct KvcApi {
    /// `sizeof(kvc_api)` in the library that returned the table.
    pub struct_size: usize,
    /// The library's ABI version, as `kvc_abi_version()` returns it.
    pub abi_version: u32,
    /// See `kvc_version`.
    pub version: extern "C" fn() -> *const c_char,
    /// See `kvc_status_name`.
    pub status_name: extern "C" fn(status: c_int) -> *const c_char,
    /// See `kvc_last_error_message`.
    pub last_error_message:
        unsafe extern "C" fn(buf: *mut c_char, capacity: usize, needed: *mut usize) -> KvcStatus,
    /// See `kvc_dtype_size`.
    pub dtype_size: extern "C" fn(dtype: KvcDtype) -> usize,
    /// See `kvc_convert`.
    pub convert: unsafe extern "C" fn(
        src_dtype: KvcDtype,
        src: *const c_void,
        count: usize,
        dst_dtype: KvcDtype,
        dst: *mut c_void,
        dst_capacity: usize,
        dst_len: *mut usize,
    ) -> KvcStatus,
}

static API: KvcApi = KvcApi {
    struct_size: std::mem::size_of::<KvcApi>(),
    abi_version: KVC_ABI_VERSION,
    version: kvc_version,
    status_name: kvc_status_name,
    last_error_message: kvc_last_error_message,
    dtype_size: kvc_dtype_size,
    convert: kvc_convert,
};

/// Whether a program built against ABI version `requested` can use this library.
pub fn abi_compatible(requested: u32) -> bool {
    requested >> 16 == KVC_ABI_VERSION_MAJOR && requested & 0xffff <= KVC_ABI_VERSION & 0xffff
}

/// The function table of this library, for a program built against ABI version
/// `abi_version` (pass `KVC_ABI_VERSION`).
///
/// Returns NULL when the library cannot serve that version: a different ABI major, or a
/// newer minor than the library has. Then `kvc_last_error_message` explains (the one
/// function besides status-returning ones that sets the last error).
///
/// Ownership: the table is static and immutable; never free it; it stays valid while
/// the library is loaded.
/// Threads: safe from any thread.
///
/// Typical use: `dlopen("libkvc.so.0")`, one `dlsym(lib, "kvc_get_api")`, call it with
/// `KVC_ABI_VERSION`, then call everything through the table.
#[no_mangle]
pub extern "C" fn kvc_get_api(abi_version: u32) -> *const KvcApi {
    value_boundary(std::ptr::null(), || {
        if abi_compatible(abi_version) {
            &API
        } else {
            set_last_error(
                "kvc_get_api",
                &format_args!(
                    "the program needs ABI {}.{} but this library provides {}.{} (same major \
                     and a minor at least as new are required)",
                    abi_version >> 16,
                    abi_version & 0xffff,
                    kvc_abi_version() >> 16,
                    kvc_abi_version() & 0xffff
                ),
            );
            std::ptr::null()
        }
    })
}
