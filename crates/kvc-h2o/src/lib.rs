//! The H2O ("heavy hitter oracle") token-eviction policy, with no tensors and no engine.
//!
//! `kvc-h2o` ingests attention statistics (softmax tiles, full probabilities or per-token
//! column sums), keeps exponentially averaged scores per block of tokens, and decides which
//! token ranges a layer keeps when its cache grows past a budget, as reserve pairs
//! `(offset, length)`. It does not move KV bytes, own a cache or know a memory layout: the
//! engine (or `kvc-cache`) applies the plan.
//!
//! It reproduces the MNN policy (`mnn-kv-compression-report.md`, sections 3 and 5.1):
//! blocks of 64 tokens, EMA with alpha 0.9 normalised by heads x queries, sink 32 and
//! recent 256 protection, target lossy ratio 3.5 with the protected floor and a
//! block-rounded target, greedy selection by score, merged reserve pairs and a
//! double-buffered plan, per layer, triggered from 512 tokens every 16 calls. Beyond MNN it
//! offers one score per KV head (GQA), StreamingLLM (sink + recent window) through the
//! same interface, and a layer-uniform scope for engines whose cache cells are shared by
//! all layers (llama.cpp).
//!
//! [`trace`] is the H2O trace format (a JSON config, a JSON-lines trace of attention calls, the
//! replay's output lines) that `kvc h2o replay` and the `h2o_replay` fuzz target run.
//!
//! A call of one layer:
//!
//! ```
//! use kvc_h2o::{CallShape, H2oConfig, H2oPolicy};
//! let mut policy = H2oPolicy::new(H2oConfig::default(), 1)?;
//! let shape = CallShape { kv_len: 2048, n_queries: 1, n_heads: 4, n_kv_heads: 2 };
//! policy.begin_call(0, shape)?; // applies or drops the plan made on the previous call
//! let probs = vec![1.0 / 2048.0; 4 * 2048];
//! policy.ingest_probabilities(0, &probs)?;
//! let decision = policy.end_call(0)?;
//! assert!(decision.triggered);
//! let plan = policy.pending_plan(0).unwrap(); // the engine compacts to these ranges
//! assert_eq!(plan.kept_tokens(), decision.kept_tokens);
//! # Ok::<(), kvc_h2o::Error>(())
//! ```

mod accumulate;
mod config;
mod error;
mod metrics;
mod plan;
mod policy;
pub mod trace;

pub use config::{H2oConfig, PlanScope, ScoreGranularity, Selection};
pub use error::{Error, ErrorKind, Result};
pub use metrics::{H2oMetrics, LayerMetrics};
pub use plan::{plan_reserve, ReservePair, ReservePlan, MAX_KV_LEN};
pub use policy::{CallDecision, CallShape, H2oPolicy, PlanResolution, SoftmaxTile};

#[cfg(test)]
mod tests;
