//! Deprecated: a re-export shim kept for one release. Use `kvc-int8` (int8 C8, here
//! [`c8`]) and `kvc-kvq` (kvq codes, here [`kvq`]) directly.
//!
//! `kvc-quant` used to hold both quantizers; each now has a crate named for it. This crate
//! only re-exports them under the old paths (`kvc_quant::c8::*`, `kvc_quant::kvq::*`,
//! and C8's `Isa`, `Error`, `ErrorKind`, `Result` at the root as before). Two things did
//! not stay: kvq's errors are `kvc_kvq::Error` (C8's are `kvc_int8::Error`), and kvq
//! calibration (`kvq::plan`) is now `kvc-kvq-calibrate`. It holds no code of its own and
//! will be removed in the next release.

pub use kvc_int8 as c8;
pub use kvc_int8::{error, Error, ErrorKind, Isa, Result};
pub use kvc_kvq as kvq;
