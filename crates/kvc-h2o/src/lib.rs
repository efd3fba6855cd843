//! The H2O ("heavy hitter oracle") token-eviction policy, with no tensors and no engine.
//!
//! `kvc-h2o` ingests attention statistics (softmax tiles, full probabilities or per-token
//! column sums), keeps exponentially averaged scores per block of tokens, and decides which
//! token ranges a layer keeps when its cache grows past a budget, as reserve pairs
//! `(offset, length)`. It does not move KV bytes, own a cache or know a memory layout: the
//! engine (or `kvc-cache`) applies the plan.
