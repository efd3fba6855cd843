//! KV-cache quantization: the arithmetic that turns K and V values into fewer bits.
//!
//! `kvc-quant` holds every quantizer kvc has: int8 "C8" per-channel codes ([`c8`], the
//! parameters and element kernels; msmodelslim files, layouts and calibration stay in
//! `kvc-cache`), and kvq, near-lossless 2-8-bit codes for one (token, KV head) row at a
//! time: a seeded randomized Hadamard rotation per head, uniform or Lloyd-Max codes, a
//! packed row of fixed size, and decode attention that reads the packed rows directly;
//! and K per channel over groups of tokens (KIVI: [`kvq::channel_group`]), a block of
//! fixed size per group and KV head, with scores read from the codes; and rows coded
//! relative to a per-head center ([`kvq::center`]).
//! It works on `f32` slices and byte buffers the caller owns. It knows nothing about
//! engines, cache layouts, eviction or files, and it never codes losslessly (that is
//! `kvc-codec`).

pub mod c8;
pub mod error;
pub mod kvq;

pub use c8::Isa;
pub use error::{Error, ErrorKind, Result};
