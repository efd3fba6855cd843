//! The transform coder of stored KV chunks (`tc-<bound>`): what the shared tiers use to
//! park a prefix's K and V ten times smaller than f16.
//!
//! A stored chunk is decoded once per restore, not read at every decode step, so it can
//! afford what the in-memory cache (kvq) cannot: a per-layer, per-KV-head linear transform
//! (PCA of the model's own K with RoPE undone, and of V), a quantizer step per component
//! chosen so that each layer's attention-output error stays within a bound measured at
//! calibration, and an entropy coder (static rANS) over the quantized components.
//!
//! - [`calibrate()`] makes a [`Calibration`] from a dump of the model's K, V and Q.
//! - [`Calibration`] is that result and its file format (`KVCTCCAL` v1), which the storing
//!   and the restoring process both load; its BLAKE3 is part of every chunk's fingerprint.
//! - [`layer_probe()`] makes the calibrations that measure, in the engine, how much the
//!   model's output feels each layer's error: the weights of [`Options::layer_weights`].
//! - [`TransformCodec`] codes one section (one layer's K or V of a chunk) and decodes it
//!   with a hash check, bit-identically on every host: decoding uses only IEEE-754 `+ - *`
//!   in a fixed order and integer arithmetic (no FMA, no platform `sin`/`cos`); its one
//!   vectorized loop ([`combine`]) has portable, AVX2 and AVX-512 copies that compute the
//!   same bits.
//!
//! It is not the chunk blob format, the tiers or the key scheme (`kvc-store-tiers`), and it
//! does not read dump files (the CLI does). Formats: docs/formats/kv-chunk-tc.md.

pub mod calibrate;
pub mod calibration;
pub mod combine;
mod eigen;
pub mod error;
pub mod golden;
pub mod probe;
pub mod rans;
pub mod rope;
pub mod section;
mod trig;

pub use calibrate::{calibrate, Dump, LayerResult, Options, Report};
pub use calibration::{Calibration, HeadBasis, Target};
pub use error::{Error, ErrorKind, Result};
pub use probe::{layer_probe, PROBE_BOUND};
pub use rope::{Rope, RopeKind};
pub use section::{parse_name, TransformCodec};
