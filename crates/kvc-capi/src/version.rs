//! Library and ABI versions.

use std::ffi::c_char;

use crate::boundary::value_boundary;

/// ABI major version: bumped on any incompatible change to the C ABI; it is the number
/// in the shared library's soname (`libkvc.so.0`).
pub const KVC_ABI_VERSION_MAJOR: u32 = 0;

/// ABI minor version: bumped whenever functions, status codes, constants or `kvc_api`
/// fields are added (only ever appended). A program built against minor `m` runs on any
/// library with the same major and a minor `>= m`.
pub const KVC_ABI_VERSION_MINOR: u32 = 20;

/// The ABI version this header describes, `(major << 16) | minor`. Pass it to
/// `kvc_get_api`; compare it with `kvc_abi_version()`.
pub const KVC_ABI_VERSION: u32 = (KVC_ABI_VERSION_MAJOR << 16) | KVC_ABI_VERSION_MINOR;

/// The shared library's soname, set by build.rs; must name [`KVC_ABI_VERSION_MAJOR`].
pub const SONAME: &str = env!("KVC_SONAME");

const VERSION: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
) {
    Ok(v) => v,
    Err(_) => panic!("the package version contains a NUL byte"),
};

/// The library's version, `"major.minor.patch"` (semantic versioning of the package;
/// the ABI is versioned separately, see `kvc_abi_version`).
///
/// Ownership: static string; never free it. Never returns NULL.
/// Threads: safe from any thread. Does not touch the last error.
#[no_mangle]
pub extern "C" fn kvc_version() -> *const c_char {
    value_boundary(VERSION.as_ptr(), || VERSION.as_ptr())
}

/// The ABI version of the loaded library, `(major << 16) | minor`. A program built
/// against `KVC_ABI_VERSION` can use the library when the majors are equal and the
/// library's minor is at least the program's.
///
/// Threads: safe from any thread. Does not touch the last error.
#[no_mangle]
pub extern "C" fn kvc_abi_version() -> u32 {
    value_boundary(KVC_ABI_VERSION, || KVC_ABI_VERSION)
}

/// The library's version as a Rust string.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
