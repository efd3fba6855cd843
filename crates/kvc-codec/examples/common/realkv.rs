//! What the examples, the gear-v2 bench and the round-trip tests that read the real KV dumps
//! share: where the dumps are, their shape and tensor kind, and a clock of this thread's CPU
//! time.

use kvc_codec::gear_v2::TensorKind;
use std::path::PathBuf;
use std::time::Instant;

/// Seconds this thread has run on a CPU (Linux `/proc/thread-self/schedstat`): on a shared
/// machine that excludes the time other processes held the core. Falls back to wall time.
pub struct Clock(Option<f64>, Instant);
impl Clock {
    fn cpu() -> Option<f64> {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        Some(s.split_whitespace().next()?.parse::<f64>().ok()? / 1e9)
    }
    pub fn start() -> Self {
        Clock(Self::cpu(), Instant::now())
    }
    pub fn secs(&self) -> f64 {
        match (self.0, Self::cpu()) {
            (Some(a), Some(b)) => b - a,
            _ => self.1.elapsed().as_secs_f64(),
        }
    }
}

/// `KVC_REALKV_DIR`, else the shared 8-layer dumps next to the checkout, else the embedded
/// sample.
pub fn data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("KVC_REALKV_DIR") {
        return PathBuf::from(d);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let shared = root.join("../shared/data/realkv");
    if shared.join("textA.K.f16.bin").exists() {
        shared
    } else {
        root.join("data/sample")
    }
}

/// Tokens and channels (`kv_heads * head_dim`) of a dump, from its JSON sidecar's
/// `"shape": [layers, tokens, kv_heads, head_dim]` (the 8-layer sample's shape without one).
pub fn sidecar_shape(path: &std::path::Path) -> (usize, usize) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (2048, 192);
    };
    let dims: Vec<usize> = text
        .split("\"shape\"")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .map(|r| {
            r.split(|c: char| !c.is_ascii_digit())
                .filter_map(|d| d.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    match dims[..] {
        [_, t, h, d] => (t, h * d),
        _ => (2048, 192),
    }
}

/// The tensor kind of a dump named `K.<dtype>` or `V.<dtype>` (anything not `K` is V).
pub fn tensor_kind(name: &str) -> TensorKind {
    if name.starts_with('K') {
        TensorKind::K
    } else {
        TensorKind::V
    }
}
