//! Engine KV-cache layouts and the operations that move KV bytes.
//!
//! `kvc-cache` describes how llama.cpp, InfiniLM and MNN lay out a layer's K and V, and
//! works in place on that memory: compaction by reserve pairs, zeroing and releasing token
//! ranges, MLP compression of a cache, and int8 "C8" per-channel quantization with
//! msmodelslim scale files. It decides nothing (policies live in `kvc-h2o`) and codes
//! nothing losslessly (that is `kvc-codec`).
