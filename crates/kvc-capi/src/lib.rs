//! The C ABI of kvc: opaque handles, one status enum, caller-owned output buffers.
//!
//! `kvc-capi` is the only crate that knows C. It wraps the Rust crates behind opaque
//! handles with declared ownership, turns every error into one `repr(C)` status plus a
//! thread-local message, and keeps panics from crossing the boundary. It adds no behaviour
//! of its own beyond what the boundary needs (status names, versions, element-type
//! conversion); the generated header `include/kvc.h` is its contract and
//! `docs/c-api.md` explains it.
//!
//! How an entry point is written (every one follows this):
//! - `#[no_mangle] pub [unsafe] extern "C" fn kvc_<area>_<verb>(...)`, documented with
//!   its ownership and thread-safety (the docs become the header's comments);
//! - its body runs in [`boundary::status_boundary`] (or [`boundary::value_boundary`] for
//!   functions that return a value): panics are caught, errors become a [`KvcStatus`] plus
//!   the thread's last-error message;
//! - every pointer is checked first ([`boundary::in_ref`], [`boundary::out_ref`],
//!   [`boundary::in_slice`], [`boundary::out_slice`], [`handle`]); outputs are written
//!   last, only on success (the one exception: a `*_len` output receives the size
//!   needed on `KVC_BUFFER_TOO_SMALL`);
//! - objects are opaque handles ([`handle`]); outputs of variable size go to caller-owned
//!   buffers with a size query (see [`convert::kvc_convert`]);
//! - the function is appended to [`api::KvcApi`], and the ABI minor version is bumped.
//!
//! This crate is not where algorithms live: it validates C arguments, calls the Rust
//! crates and maps their errors.

pub mod api;
pub mod boundary;
pub mod cache;
pub mod codec;
pub mod convert;
mod elements;
pub mod error;
pub mod h2o;
pub mod handle;
pub mod kvq;
pub mod kvq_block;
pub mod kvq_cells;
pub mod kvq_center;
pub mod kvq_channel;
pub mod kvq_rows;
pub mod last_error;
pub mod mlp;
pub mod quant;
pub mod status;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
pub mod version;

pub use api::{kvc_get_api, KvcApi};
pub use convert::{convert_row, kvc_convert, kvc_dtype_size, KvcDtype, Row, RowMut};
pub use error::Error;
pub use last_error::kvc_last_error_message;
pub use status::{kvc_status_name, KvcStatus};
pub use version::{kvc_abi_version, kvc_version, KVC_ABI_VERSION};

// kvc_store (ABI 0.3): the asynchronous compressed store.
pub mod store;

// kvc_tiers (ABI 0.7): shared KV tiers (memory, disk, Redis).
pub mod tiers;
