//! KV-cache quantization: int8 C8 per-channel codes ([`c8`], the parameters and element
//! kernels; msmodelslim files, layouts and calibration stay in `kvc-cache`), and kvq, now
//! its own crate `kvc-kvq` (re-exported as [`kvq`]).
//! It works on `f32` slices and byte buffers the caller owns. It knows nothing about
//! engines, cache layouts, eviction or files, and it never codes losslessly (that is
//! `kvc-codec`).

pub mod c8;
pub mod error;
pub use kvc_kvq as kvq;

pub use c8::Isa;
pub use error::{Error, ErrorKind, Result};
