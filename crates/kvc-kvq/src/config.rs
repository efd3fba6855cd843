//! What to run: a [`KvqConfig`] (method, K bits, V bits, seed), parsed from a compact
//! string, and a [`KvqPlan`], per-layer K/V bits as a versioned JSON an engine loads.
//!
//! Config strings: `k<bits>v<bits>` then optional `:`-separated options:
//! `lm` (Lloyd-Max codes with one f16 scale per row, the default), `u<group>` (uniform
//! codes with one f16 scale per `group` values along head_dim: 8, 16, 32, 64, 128 or 256),
//! `s<seed>` (rotation seed, decimal; default [`DEFAULT_SEED`]). Examples: `k4v4`, `k4v2`,
//! `k3v3:lm`, `k4v4:u32`, `k8v4:u64:s7`.
//!
//! Protected tokens (attention sinks, a recent window held in f16) are the engine's
//! concern: it keeps those rows in its own f16 cache and sends only the others through
//! kvq; a plan records the sink and window sizes it was calibrated with so the engine can
//! apply the same, and byte accounting must count them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The rotation seed when none is given.
pub const DEFAULT_SEED: u64 = 0x6b76_635f_6b76_7131; // "kvc_kvq1"

/// The scalar code applied to rotated coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Lloyd-Max levels for the rotated-coordinate law, one f16 scale per row
    /// (TurboQuant-MSE with a least-squares norm).
    LloydMax,
    /// Uniform symmetric codes, one f16 scale (absmax) per `group` values.
    Uniform {
        /// Values per scale; divides head_dim.
        group: u16,
    },
}

impl Method {
    /// The short name used in config strings (`lm`, `u32`).
    pub fn tag(&self) -> String {
        match self {
            Method::LloydMax => "lm".into(),
            Method::Uniform { group } => format!("u{group}"),
        }
    }

    fn parse(tag: &str) -> Option<Method> {
        if tag == "lm" {
            return Some(Method::LloydMax);
        }
        let g: u16 = tag.strip_prefix('u')?.parse().ok()?;
        [8, 16, 32, 64, 128, 256]
            .contains(&g)
            .then_some(Method::Uniform { group: g })
    }
}

/// Bits for K and V, the method, and the rotation seed: everything a row codec needs
/// except head_dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvqConfig {
    /// The scalar code.
    pub method: Method,
    /// Bits per K value (2..=8).
    pub k_bits: u8,
    /// Bits per V value (2..=8).
    pub v_bits: u8,
    /// Rotation seed.
    pub seed: u64,
}

/// Checks a bit width.
pub fn check_bits(what: &'static str, bits: u8) -> Result<()> {
    if (2..=8).contains(&bits) {
        Ok(())
    } else {
        Err(Error::InvalidValue {
            what,
            value: i64::from(bits),
            reason: "kvq bits must be 2..=8",
        })
    }
}

impl KvqConfig {
    /// A validated config.
    pub fn new(method: Method, k_bits: u8, v_bits: u8, seed: u64) -> Result<KvqConfig> {
        check_bits("k_bits", k_bits)?;
        check_bits("v_bits", v_bits)?;
        Ok(KvqConfig {
            method,
            k_bits,
            v_bits,
            seed,
        })
    }

    /// Parses a config string (see the module docs).
    pub fn parse(s: &str) -> Result<KvqConfig> {
        let bad = |reason: &str| Error::BadConfig {
            input: s.chars().take(64).collect(),
            reason: reason.into(),
        };
        let mut parts = s.split(':');
        let head = parts.next().unwrap_or("");
        let rest = head
            .strip_prefix('k')
            .ok_or_else(|| bad("must start with k<bits>"))?;
        let (kb, vb) = rest
            .split_once('v')
            .ok_or_else(|| bad("expected k<bits>v<bits>"))?;
        let bits = |t: &str| -> Result<u8> {
            if t.len() != 1 {
                return Err(bad("bits must be one digit 2..8"));
            }
            let b: u8 = t.parse().map_err(|_| bad("bits must be a digit"))?;
            if !(2..=8).contains(&b) {
                return Err(bad("bits must be 2..8"));
            }
            Ok(b)
        };
        let (k_bits, v_bits) = (bits(kb)?, bits(vb)?);
        let mut method = None;
        let mut seed = None;
        for p in parts {
            if let Some(m) = Method::parse(p) {
                if method.replace(m).is_some() {
                    return Err(bad("method given twice"));
                }
            } else if let Some(n) = p.strip_prefix('s') {
                let v: u64 = n.parse().map_err(|_| bad("seed must be s<decimal u64>"))?;
                if seed.replace(v).is_some() {
                    return Err(bad("seed given twice"));
                }
            } else {
                return Err(bad(
                    "unknown option (expected lm, u8/u16/u32/u64/u128/u256 or s<seed>)",
                ));
            }
        }
        KvqConfig::new(
            method.unwrap_or(Method::LloydMax),
            k_bits,
            v_bits,
            seed.unwrap_or(DEFAULT_SEED),
        )
    }
}

impl fmt::Display for KvqConfig {
    /// The canonical string: always names the method, names the seed only when it is not
    /// the default. Parses back to the same config.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k{}v{}:{}", self.k_bits, self.v_bits, self.method.tag())?;
        if self.seed != DEFAULT_SEED {
            write!(f, ":s{}", self.seed)?;
        }
        Ok(())
    }
}

/// The plan format name and version this crate reads and writes.
pub const PLAN_FORMAT: &str = "kvc-kvq-plan";
/// The newest plan version this crate reads and writes (see [`PLAN_FORMAT`]). Version 2
/// adds the optional `calibration` record (how `kvc quant plan` made the plan); a plan
/// without one is written as version 1, which every reader of version 1 still loads.
/// Version 3 adds the protections an engine applies with the plan (`recent_bits`: the
/// recent window as kvq rows of those bits instead of f16; `k_center`: K coded relative
/// to a per-sequence center); a plan without them keeps its older version. Version 4 adds
/// the calibration's `layer_weights` (each layer's errors weighed by the model's measured
/// sensitivity to them); a plan made without weights keeps its older version.
pub const PLAN_VERSION: u32 = 4;
/// The oldest plan version this crate reads.
pub const PLAN_VERSION_MIN: u32 = 1;

/// Predicted attention-output errors of one layer at its planned bits (see
/// `kvc-kvq-calibrate`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerErrors {
    /// Relative attention-output error with only K quantized at the layer's K bits.
    pub k_err: f64,
    /// Relative attention-output error with only V quantized at the layer's V bits.
    pub v_err: f64,
}

/// How a plan was calibrated (plan version 2 and later): the data, the budget, what was
/// reached, and the per-layer errors the allocation predicted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanCalibration {
    /// Where the calibration K/V/Q came from (a dump directory).
    pub source: String,
    /// The dump's file tag (`<tag>.K.f32.bin`, ...).
    pub tag: String,
    /// Tokens in the calibration dump.
    pub n_tokens: u32,
    /// Query heads of the model.
    pub n_head: u32,
    /// First sampled query position.
    pub query_from: u32,
    /// Every `query_stride`-th position from `query_from` on was sampled.
    pub query_stride: u32,
    /// The requested ratio to f16 (`16 / bits per value` must reach it).
    pub budget_ratio: f64,
    /// The weight of K errors in the objective (1: K and V alike).
    pub k_weight: f64,
    /// `[min, max]` K bits the allocation was bounded to (`kvc quant plan --k-bits`);
    /// absent when both sides were free over 2..=8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k_bits_range: Option<[u8; 2]>,
    /// `[min, max]` V bits the allocation was bounded to; absent as `k_bits_range` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v_bits_range: Option<[u8; 2]>,
    /// `[first, end)` tokens whose K mean was each layer's K center in the calibration
    /// (`kvc quant plan --k-center-from/--k-center-tokens`, for engines that code K
    /// centered); absent when K was coded as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k_center_tokens: Option<[u32; 2]>,
    /// Version 4: each layer's weight in the objective (its errors were multiplied by it),
    /// the model's measured end-to-end sensitivity to that layer's error; absent when every
    /// layer weighed 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_weights: Option<Vec<f64>>,
    /// The ratio the plan reaches: 16 / mean bits per value, scales included.
    pub achieved_ratio: f64,
    /// The allocation's objective: sum over layers of the K errors times `k_weight` and
    /// the V errors (each layer's sum times its weight in `layer_weights`).
    pub total_error: f64,
    /// One entry per layer, in order.
    pub layer_errors: Vec<LayerErrors>,
}

/// Bits of one layer (optionally per KV head).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerBits {
    /// K bits of every head of the layer.
    pub k_bits: u8,
    /// V bits of every head of the layer.
    pub v_bits: u8,
}

/// A per-layer plan: versioned JSON (see `docs/formats/kvq.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvqPlan {
    /// Always [`PLAN_FORMAT`].
    pub format: String,
    /// [`PLAN_VERSION_MIN`]..=[`PLAN_VERSION`]: the oldest version that holds the plan's fields.
    pub version: u32,
    /// `lm` or `u<group>`.
    pub method: String,
    /// Rotation seed.
    pub seed: u64,
    /// Head size the plan was made for.
    pub head_dim: u32,
    /// KV heads per layer.
    pub n_kv_head: u32,
    /// Leading tokens the engine keeps in f16 (attention sinks).
    #[serde(default)]
    pub sink_tokens: u32,
    /// Newest tokens the engine keeps in f16 (or, from version 3, as `recent_bits` rows).
    #[serde(default)]
    pub recent_tokens: u32,
    /// Version 3: the recent window's rows are kvq rows of these bits (2..=8), each coded to
    /// its layer's bits when it leaves the window; absent: f16 rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_bits: Option<u8>,
    /// Version 3: K rows outside the sink and window are coded relative to a per-sequence
    /// center fixed when the window first fills (`docs/formats/kvq.md`, "Centers"); needs
    /// `sink_tokens >= 1` and `recent_tokens >= 1`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub k_center: bool,
    /// One entry per layer, in order.
    pub layers: Vec<LayerBits>,
    /// How the plan was calibrated (version 2 only; absent in hand-written plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<PlanCalibration>,
}

/// Limits a plan's layer count (a guard against absurd files; models have < 1000 layers).
pub const MAX_PLAN_LAYERS: usize = 4096;

impl KvqPlan {
    /// A uniform plan: `n_layer` layers of `cfg`.
    pub fn uniform(cfg: &KvqConfig, head_dim: u32, n_kv_head: u32, n_layer: usize) -> KvqPlan {
        KvqPlan {
            format: PLAN_FORMAT.into(),
            version: PLAN_VERSION_MIN,
            method: cfg.method.tag(),
            seed: cfg.seed,
            head_dim,
            n_kv_head,
            sink_tokens: 0,
            recent_tokens: 0,
            recent_bits: None,
            k_center: false,
            layers: vec![
                LayerBits {
                    k_bits: cfg.k_bits,
                    v_bits: cfg.v_bits,
                };
                n_layer
            ],
            calibration: None,
        }
    }

    /// Parses and validates a plan.
    pub fn from_json(text: &str) -> Result<KvqPlan> {
        let p: KvqPlan = serde_json::from_str(text).map_err(|e| Error::BadPlan {
            reason: e.to_string(),
        })?;
        p.validate()?;
        Ok(p)
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain fields cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks format, version, method, head_dim, and every layer's bits.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::BadPlan { reason });
        if self.format != PLAN_FORMAT {
            return bad(format!(
                "format is {:?}, expected {PLAN_FORMAT:?}",
                self.format
            ));
        }
        if !(PLAN_VERSION_MIN..=PLAN_VERSION).contains(&self.version) {
            return Err(Error::Unsupported {
                what: "kvq plan version",
                value: i64::from(self.version),
            });
        }
        let m = self.method()?;
        super::rotation::check_head_dim(self.head_dim as usize)?;
        if let Method::Uniform { group } = m {
            if group as u32 > self.head_dim {
                return bad(format!(
                    "group {group} is larger than head_dim {}",
                    self.head_dim
                ));
            }
        }
        if self.n_kv_head == 0 {
            return bad("n_kv_head is 0".into());
        }
        if self.layers.is_empty() || self.layers.len() > MAX_PLAN_LAYERS {
            return bad(format!(
                "{} layers (expected 1..={MAX_PLAN_LAYERS})",
                self.layers.len()
            ));
        }
        for (i, l) in self.layers.iter().enumerate() {
            for (what, b) in [("k_bits", l.k_bits), ("v_bits", l.v_bits)] {
                if !(2..=8).contains(&b) {
                    return bad(format!("layer {i}: {what} {b} not in 2..=8"));
                }
            }
        }
        if self.recent_bits.is_some() || self.k_center {
            if self.version < 3 {
                return bad("recent_bits and k_center need plan version 3".into());
            }
            if let Some(b) = self.recent_bits {
                if !(2..=8).contains(&b) {
                    return bad(format!("recent_bits {b} not in 2..=8"));
                }
                if self.recent_tokens == 0 {
                    return bad("recent_bits without recent_tokens".into());
                }
            }
            if self.k_center && (self.sink_tokens == 0 || self.recent_tokens == 0) {
                return bad(
                    "k_center needs sink_tokens >= 1 and recent_tokens >= 1 (the sink stays out of the \
                     centered rows; the center is the window's mean)"
                        .into(),
                );
            }
        }
        if let Some(c) = &self.calibration {
            if self.version < 2 {
                return bad("a calibration record needs plan version 2".into());
            }
            if c.layer_errors.len() != self.layers.len() {
                return bad(format!(
                    "calibration has {} layer errors for {} layers",
                    c.layer_errors.len(),
                    self.layers.len()
                ));
            }
            let ok = |x: f64| x.is_finite() && x >= 0.0;
            let pos = |x: f64| x.is_finite() && x > 0.0;
            if !pos(c.budget_ratio)
                || !pos(c.achieved_ratio)
                || !pos(c.k_weight)
                || !ok(c.total_error)
            {
                return bad(
                    "calibration ratios must be finite and > 0, the total error finite and >= 0"
                        .into(),
                );
            }
            for (i, e) in c.layer_errors.iter().enumerate() {
                if !ok(e.k_err) || !ok(e.v_err) {
                    return bad(format!(
                        "calibration layer {i}: errors must be finite and >= 0"
                    ));
                }
            }
            if let Some(w) = &c.layer_weights {
                if self.version < 4 {
                    return bad("calibration layer_weights need plan version 4".into());
                }
                if w.len() != self.layers.len() {
                    return bad(format!(
                        "calibration has {} layer weights for {} layers",
                        w.len(),
                        self.layers.len()
                    ));
                }
                if let Some(i) = w.iter().position(|&x| !pos(x)) {
                    return bad(format!(
                        "calibration layer {i}: weight {} must be finite and > 0",
                        w[i]
                    ));
                }
            }
            if let Some([a, b]) = c.k_center_tokens {
                if a >= b || b > c.n_tokens {
                    return bad(format!(
                        "calibration k_center_tokens [{a}, {b}): expected first < end <= n_tokens {}",
                        c.n_tokens
                    ));
                }
            }
            let sides = [
                ("k_bits_range", c.k_bits_range, true),
                ("v_bits_range", c.v_bits_range, false),
            ];
            for (what, range, is_k) in sides {
                let Some([lo, hi]) = range else { continue };
                if !(2 <= lo && lo <= hi && hi <= 8) {
                    return bad(format!(
                        "calibration {what} [{lo}, {hi}]: expected 2 <= min <= max <= 8"
                    ));
                }
                for (i, l) in self.layers.iter().enumerate() {
                    let b = if is_k { l.k_bits } else { l.v_bits };
                    if !(lo..=hi).contains(&b) {
                        return bad(format!(
                            "layer {i}: {b} bits outside calibration {what} [{lo}, {hi}]"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The method named by the plan.
    pub fn method(&self) -> Result<Method> {
        Method::parse(&self.method).ok_or_else(|| Error::BadPlan {
            reason: format!("unknown method {:?}", self.method),
        })
    }

    /// The config of layer `i`.
    pub fn layer_config(&self, i: usize) -> Result<KvqConfig> {
        let l = self.layers.get(i).ok_or(Error::MissingLayer {
            layer: i,
            which: "kvq plan entry",
        })?;
        KvqConfig::new(self.method()?, l.k_bits, l.v_bits, self.seed)
    }

    /// Mean bits per value over all layers, K and V, metadata included.
    pub fn bits_per_value(&self) -> Result<f64> {
        let m = self.method()?;
        let d = self.head_dim as usize;
        let mut sum = 0.0;
        for l in &self.layers {
            sum += super::row::row_bits_per_value(m, l.k_bits, d)?;
            sum += super::row::row_bits_per_value(m, l.v_bits, d)?;
        }
        Ok(sum / (2 * self.layers.len()) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_strings_parse_and_print_back() {
        for s in ["k4v4", "k4v2", "k3v3", "k4v4:lm", "k8v4:u64:s7", "k2v2:u32"] {
            let c = KvqConfig::parse(s).unwrap();
            assert_eq!(KvqConfig::parse(&c.to_string()).unwrap(), c, "{s}");
        }
        let c = KvqConfig::parse("k4v2").unwrap();
        assert_eq!((c.k_bits, c.v_bits, c.method), (4, 2, Method::LloydMax));
        assert_eq!(
            KvqConfig::parse("k3v5:u16:s9").unwrap().method,
            Method::Uniform { group: 16 }
        );
        for s in [
            "",
            "k",
            "k4",
            "v4",
            "k4v",
            "k1v4",
            "k4v9",
            "k44v4",
            "k4v4:",
            "k4v4:x",
            "k4v4:u7",
            "k4v4:lm:lm",
            "k4v4:s",
            "k4v4:s1:s2",
            "k4v4:sx",
            "K4V4",
            "k4v4 ",
        ] {
            let e = KvqConfig::parse(s).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{s:?}: {e}");
        }
    }

    #[test]
    fn plans_round_trip_and_bad_plans_are_refused() {
        let c = KvqConfig::parse("k4v3").unwrap();
        let p = KvqPlan::uniform(&c, 64, 3, 30);
        let back = KvqPlan::from_json(&p.to_json()).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.layer_config(29).unwrap(), c);
        assert!(back.layer_config(30).is_err());
        let bpv = back.bits_per_value().unwrap();
        assert!((bpv - (3.5 + 16.0 / 64.0)).abs() < 1e-12, "{bpv}");
        let j = p.to_json();
        for (from, to) in [
            ("\"kvc-kvq-plan\"", "\"other\""),
            ("\"version\": 1", "\"version\": 5"),
            ("\"version\": 1", "\"version\": 0"),
            // version 3's fields in an older plan, and out of range
            (
                "\"recent_tokens\": 0",
                "\"recent_tokens\": 8, \"recent_bits\": 8",
            ),
            (
                "\"recent_tokens\": 0",
                "\"recent_tokens\": 0, \"k_center\": true",
            ),
            ("\"lm\"", "\"u7\""),
            ("\"head_dim\": 64", "\"head_dim\": 96"),
            ("\"n_kv_head\": 3", "\"n_kv_head\": 0"),
            ("\"k_bits\": 4", "\"k_bits\": 9"),
            ("\"v_bits\": 3", "\"v_bits\": 1"),
            ("\"seed\"", "\"extra\": 1, \"seed\""),
        ] {
            let t = j.replacen(from, to, 1);
            assert_ne!(t, j, "{from}");
            assert!(KvqPlan::from_json(&t).is_err(), "{from} -> {to}");
        }
        for cut in 0..j.len() {
            assert!(KvqPlan::from_json(&j[..cut]).is_err());
        }
        // version 4: layer weights in the calibration record
        let cal = PlanCalibration {
            source: "dump".into(),
            tag: "textA".into(),
            n_tokens: 1024,
            n_head: 9,
            query_from: 64,
            query_stride: 8,
            budget_ratio: 4.0,
            k_weight: 1.0,
            k_bits_range: None,
            v_bits_range: None,
            k_center_tokens: None,
            // binary fractions: JSON round-trips them exactly
            layer_weights: Some((0..30).map(|i| 0.5 + f64::from(i) / 32.0).collect()),
            achieved_ratio: 4.27,
            total_error: 1.0,
            layer_errors: vec![
                LayerErrors {
                    k_err: 0.01,
                    v_err: 0.02
                };
                30
            ],
        };
        let mut p4 = p.clone();
        p4.version = 4;
        p4.calibration = Some(cal);
        let j4 = p4.to_json();
        assert_eq!(KvqPlan::from_json(&j4).unwrap(), p4);
        let mut w = p4.clone();
        w.version = 3;
        assert!(w.validate().is_err(), "layer weights in a version-3 plan");
        for bad_w in [
            vec![1.0; 29],
            vec![1.0; 31],
            {
                let mut v = vec![1.0; 30];
                v[7] = 0.0;
                v
            },
            {
                let mut v = vec![1.0; 30];
                v[0] = f64::NAN;
                v
            },
        ] {
            let mut w = p4.clone();
            if let Some(c) = w.calibration.as_mut() {
                c.layer_weights = Some(bad_w);
            }
            assert!(w.validate().is_err());
        }
        for cut in (0..j4.len()).step_by(7) {
            assert!(KvqPlan::from_json(&j4[..cut]).is_err());
        }
        // version 3: protections round-trip; each rule refuses its own breach
        let mut p3 = p.clone();
        p3.version = 3;
        p3.sink_tokens = 4;
        p3.recent_tokens = 64;
        p3.recent_bits = Some(8);
        p3.k_center = true;
        let j3 = p3.to_json();
        assert_eq!(KvqPlan::from_json(&j3).unwrap(), p3);
        for (from, to) in [
            ("\"recent_bits\": 8", "\"recent_bits\": 9"),
            ("\"recent_bits\": 8", "\"recent_bits\": 1"),
            ("\"sink_tokens\": 4", "\"sink_tokens\": 0"),
            ("\"recent_tokens\": 64", "\"recent_tokens\": 0"),
            ("\"k_center\": true", "\"k_center\": 1"),
        ] {
            let t = j3.replacen(from, to, 1);
            assert_ne!(t, j3, "{from}");
            assert!(KvqPlan::from_json(&t).is_err(), "{from} -> {to}");
        }
    }
}
