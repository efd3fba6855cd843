//! The nouns every kvc crate shares, defined once: the element type of a tensor
//! ([`Dtype`], and its float subset [`FloatDtype`]) with the conversion of its slices to
//! `f32` and back ([`load_f32`], [`store_f32`]), which tensor of the cache ([`Tensor`], K
//! or V), the coarse class of an error ([`ErrorKind`], which `kvc-capi` maps to one C
//! status) and the FNV-1a 64 checksum ([`fnv1a64`]) that kvc's formats and caches use.
//!
//! It holds small `Copy` types and pure functions only (plus the error of parsing a
//! dtype name): no format, no codec, no kvc dependency (only `half` for the conversions).
//! A type that only one crate needs stays in that crate. Nothing else defines an element
//! type: a place that takes floats only uses [`FloatDtype`], whose names and codes are
//! [`Dtype`]'s.

mod checksum;
mod dtype;
mod elements;
mod error_kind;
mod tensor;

pub use checksum::{fnv1a64, fnv1a64_update, FNV_OFFSET, FNV_PRIME};
pub use dtype::{Dtype, FloatDtype, UnknownDtype};
pub use elements::{extend_f32, load_f32, store_f32};
pub use error_kind::ErrorKind;
pub use tensor::Tensor;
