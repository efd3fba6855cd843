//! The C ABI of kvc: opaque handles, one status enum, caller-owned output buffers.
//!
//! `kvc-capi` is the only crate that knows C. It wraps the Rust crates behind opaque
//! handles with declared ownership, turns every error into one `repr(C)` status plus a
//! thread-local message, and keeps panics from crossing the boundary. It adds no behaviour
//! of its own; the generated header `include/kvc.h` is its contract.
