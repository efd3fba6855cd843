//! The nouns every kvc crate shares, defined once: the element type of a tensor
//! ([`Dtype`]), which tensor of the cache ([`Tensor`], K or V), the coarse class of an
//! error ([`ErrorKind`], which `kvc-capi` maps to one C status) and the FNV-1a 64 checksum
//! ([`fnv1a64`]) that kvc's formats and caches use.
//!
//! It holds small `Copy` types and pure functions only (plus the error of parsing a
//! dtype name): no format, no codec, no dependency. A type that only one crate needs stays
//! in that crate, and so do conversions between values (f16 to f32 and back): they belong
//! to the crates that convert. A crate whose variants are a subset (a file format that only stores floats)
//! keeps a restricted type of its own and converts it to [`Dtype`].

mod checksum;
mod dtype;
mod error_kind;
mod tensor;

pub use checksum::{fnv1a64, fnv1a64_update, FNV_OFFSET, FNV_PRIME};
pub use dtype::{Dtype, UnknownDtype};
pub use error_kind::ErrorKind;
pub use tensor::Tensor;
