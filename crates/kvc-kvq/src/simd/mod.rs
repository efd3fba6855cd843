//! The x86-64 kernels of kvq, one file per idea; [`crate::isa`] picks them at run time.
//!
//! - [`dot`]: AVX2 per-row kernels: one packed row's dot product with a rotated query, or
//!   its weighted values added into an accumulator (2-8-bit codes through register tables
//!   or gathers).
//! - [`block`]: AVX2 block kernels for whole tiles of 2-4-bit rows (attention and the
//!   G-query tile calls), in a fixed lane order.
//! - [`block512`]: the same block kernels in 512-bit vectors (AVX-512F), built only where
//!   rustc has the intrinsics and run only where the CPU reports AVX-512F.
//! - [`quant`]: the AVX2 Lloyd-Max row quantizer and the rotation butterflies it and the
//!   un-rotation use, byte for byte the portable code.
//! - [`uniform`]: the AVX2 uniform row quantizer, byte for byte the portable code.

#[cfg(target_arch = "x86_64")]
pub(crate) mod block;
#[cfg(target_arch = "x86_64")]
pub(crate) mod block512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod dot;
#[cfg(target_arch = "x86_64")]
pub(crate) mod quant;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
#[cfg(target_arch = "x86_64")]
pub(crate) mod uniform;
