//! Engine KV-cache layouts and the operations that move KV bytes.
//!
//! `kvc-cache` describes how llama.cpp, InfiniLM and MNN lay out a layer's K and V, and
//! works in place on that memory: compaction by reserve pairs, zeroing and releasing token
//! ranges, and MLP compression of a cache. It decides nothing (policies live in
//! `kvc-h2o`), codes nothing losslessly (that is `kvc-codec`) and quantizes nothing (int8
//! C8, which walks these layouts, is `kvc-int8`; kvq is `kvc-kvq`).
//!
//! - [`layout`]: [`TensorLayout`] / [`KvLayout`] value types for each engine, and
//!   [`LayerMut`], a layer borrowed from whoever owns the memory.
//! - [`plan`]: [`ReservePlan`] (validated reserve pairs) and the old -> new [`IndexMap`].
//! - [`compact`]: in-place compaction per layer or across layers with shared cells,
//!   zeroing of token ranges.
//! - [`cells`]: a llama.cpp-style cell table kvc keeps beside the engine's.
//! - [`mlp`]: `kvc-mlp` compression of an InfiniLM cache in place, and of one sequence of
//!   a llama.cpp cache through the cell table.
//! - [`paged`]: kvc-owned storage whose released token ranges return their pages to the
//!   operating system.

pub mod cells;
pub mod compact;
pub mod error;
pub mod layout;
pub mod mlp;
pub mod paged;
pub mod plan;

pub use cells::{Cell, CellTable};
pub use compact::{
    compact_heads, compact_layer, compact_layers, compact_shared, compact_tensor, move_head_tokens,
    move_tokens, zero_layer_tokens, zero_tokens,
};
pub use error::{Error, ErrorKind, Result};
pub use layout::{Addressing, KvLayout, LayerMut, TensorLayout};
pub use mlp::{mlp_compress_infinilm, mlp_compress_llama, SeqCompression};
pub use paged::{OwnedCache, PagedBuffer};
pub use plan::{IndexMap, ReservePlan};
