//! The learned KV-cache compressor: `.bin` v1 weight files and grouped MLP compression.
//!
//! `kvc-mlp` loads the per-layer MLP weights of InfiniLM's compressor and shortens a layer's
//! K and V by a factor, pushing each group of consecutive tokens through a small
//! Linear-ReLU-Linear-ReLU-Linear network on the CPU. It works on contiguous `[H, S, D]`
//! tensors; it does not know engine layouts, eviction policies or how a cache is stored.
