//! A calibration: what the store and the restoring engine must share to code a model's
//! chunks (per-head means and bases, RoPE, steps and symbol tables per target), and its
//! file format, `KVCTCCAL` version 1 (docs/formats/kv-chunk-tc.md).

use kvc_types::Tensor;

use crate::error::{Error, Result};
use crate::rans::{SymbolTable, NSYM, SCALE_BITS};
use crate::rope::{Rope, RopeKind};

/// The file's magic bytes.
pub const MAGIC: &[u8; 8] = b"KVCTCCAL";
/// The file format version this crate reads and writes.
pub const VERSION: u16 = 1;
const HEADER_LEN: usize = 64;
const CHECKSUM_LEN: usize = 32;

/// Largest layouts a file may declare (far above any model; they bound what a damaged
/// header can make a reader compute).
const MAX_LAYERS: usize = 1024;
const MAX_HEADS: usize = 256;
const MAX_HEAD_DIM: usize = 1024;
const MAX_CLASSES: usize = 256;
const MAX_TARGETS: usize = 64;
const MAX_SINK: usize = 1 << 20;

/// One KV head's transform: `y = basis · (x − mean)`, rows of `basis` orthonormal.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadBasis {
    /// `head_dim` values.
    pub mean: Vec<f32>,
    /// `head_dim × head_dim`, row `i` the direction of component `i` (largest variance
    /// first).
    pub basis: Vec<f32>,
}

/// The quantizer of one target: a step and a symbol table class per component.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The bound on the attention-output error (`Σ‖o′−o‖² / Σ‖o‖²` per layer, averaged over
    /// layers) measured at calibration; the codec is named `tc-<bound>`.
    pub bound: f32,
    /// `[layer][K, V][head][component]` quantizer steps, all finite and positive.
    pub steps: Vec<f32>,
    /// `[layer][K, V][head][component]` indexes into the calibration's tables.
    pub classes: Vec<u8>,
}

/// Everything a coder of one model's chunks needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// Layers.
    pub n_layer: usize,
    /// KV heads per layer.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// The first positions of a sequence, stored raw.
    pub n_sink: usize,
    /// The model's rotation of K.
    pub rope: Rope,
    /// Symbol tables, indexed by [`Target::classes`].
    pub tables: Vec<SymbolTable>,
    /// `[layer][K, V][head]` transforms.
    pub bases: Vec<HeadBasis>,
    /// The calibrated targets, bounds ascending.
    pub targets: Vec<Target>,
}

/// Index of `(layer, tensor, head)` in [`Calibration::bases`] (and, times `head_dim`, in a
/// target's steps).
pub fn slot(n_kv_head: usize, layer: usize, tensor: Tensor, head: usize) -> usize {
    let t = match tensor {
        Tensor::K => 0,
        Tensor::V => 1,
    };
    (layer * 2 + t) * n_kv_head + head
}

fn le_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn le_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Sizes of the payload's parts.
struct Sizes {
    theta: usize,
    tables: usize,
    bounds: usize,
    bases: usize,
    steps: usize,
    classes: usize,
}

impl Sizes {
    fn new(l: usize, h: usize, d: usize, n_rot: usize, n_class: usize, n_target: usize) -> Sizes {
        // Bounded by the MAX_ limits: at most ~2^41, no overflow on 64-bit.
        let heads = l * 2 * h;
        Sizes {
            theta: n_rot / 2 * 8,
            tables: n_class * NSYM * 2,
            bounds: n_target * 4,
            bases: heads * (d + d * d) * 4,
            steps: n_target * heads * d * 4,
            classes: n_target * heads * d,
        }
    }
    fn total(&self) -> usize {
        self.theta + self.tables + self.bounds + self.bases + self.steps + self.classes
    }
}

fn f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
}

impl Calibration {
    /// Checks every field against the others (what [`Calibration::from_bytes`] checks of
    /// a file, and what [`Calibration::to_bytes`] needs).
    pub fn validate(&self) -> Result<()> {
        let (l, h, d) = (self.n_layer, self.n_kv_head, self.head_dim);
        let bad = |what: &'static str, reason: String| Err(Error::corrupt(what, reason));
        if !(1..=MAX_LAYERS).contains(&l)
            || !(1..=MAX_HEADS).contains(&h)
            || !(2..=MAX_HEAD_DIM).contains(&d)
            || d % 2 != 0
        {
            return bad(
                "calibration",
                format!("layout {l} layers × {h} heads × {d}"),
            );
        }
        if self.n_sink > MAX_SINK {
            return bad("calibration", format!("sink of {} tokens", self.n_sink));
        }
        let rope = Rope::from_theta(self.rope.kind(), d, self.rope.theta().to_vec())
            .map_err(|e| Error::corrupt("calibration rope", e.to_string()))?;
        // A rope made for rows of another length (what the file cannot hold).
        if rope != self.rope {
            return bad(
                "calibration rope",
                format!("made for rows other than head_dim {d}"),
            );
        }
        if self.tables.is_empty() || self.tables.len() > MAX_CLASSES {
            return bad("calibration", format!("{} tables", self.tables.len()));
        }
        let heads = l * 2 * h;
        if self.bases.len() != heads {
            return bad(
                "calibration",
                format!("{} bases for {heads}", self.bases.len()),
            );
        }
        for (i, b) in self.bases.iter().enumerate() {
            if b.mean.len() != d || b.basis.len() != d * d {
                return bad("calibration basis", format!("{i}: wrong size"));
            }
            if b.mean.iter().chain(&b.basis).any(|x| !x.is_finite()) {
                return bad("calibration basis", format!("{i}: a non-finite value"));
            }
        }
        if self.targets.is_empty() || self.targets.len() > MAX_TARGETS {
            return bad("calibration", format!("{} targets", self.targets.len()));
        }
        let mut prev = 0f32;
        for t in &self.targets {
            if !(t.bound.is_finite() && t.bound > prev) {
                return bad(
                    "calibration target",
                    format!(
                        "bound {}: bounds must be positive, finite, ascending",
                        t.bound
                    ),
                );
            }
            prev = t.bound;
            if t.steps.len() != heads * d || t.classes.len() != heads * d {
                return bad(
                    "calibration target",
                    format!("bound {}: wrong size", t.bound),
                );
            }
            if let Some(s) = t.steps.iter().find(|s| !(s.is_finite() && **s >= 1e-20)) {
                return bad(
                    "calibration target",
                    format!("step {s}: must be finite, ≥ 1e-20"),
                );
            }
            if let Some(c) = t.classes.iter().find(|&&c| c as usize >= self.tables.len()) {
                return bad(
                    "calibration target",
                    format!("class {c} of {} tables", self.tables.len()),
                );
            }
        }
        Ok(())
    }

    /// The target whose bound is `bound` exactly (as parsed from a codec name).
    pub fn target(&self, bound: f32) -> Result<&Target> {
        Ok(&self.targets[self.target_index(bound)?])
    }

    /// The index in [`Calibration::targets`] of the target whose bound is `bound`.
    pub fn target_index(&self, bound: f32) -> Result<usize> {
        self.targets
            .iter()
            .position(|t| t.bound == bound)
            .ok_or_else(|| {
                Error::invalid(
                    "tc target",
                    format!(
                        "tc-{bound} is not in this calibration; it has {}",
                        self.target_names().join(", ")
                    ),
                )
            })
    }

    /// `tc-<bound>` of every target.
    pub fn target_names(&self) -> Vec<String> {
        self.targets
            .iter()
            .map(|t| format!("tc-{}", t.bound))
            .collect()
    }

    /// The file's bytes (header, payload, BLAKE3 checksum).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.validate()
            .map_err(|e| Error::invalid("calibration", e.to_string()))?;
        let (l, h, d) = (self.n_layer, self.n_kv_head, self.head_dim);
        let sz = Sizes::new(
            l,
            h,
            d,
            self.rope.n_rot(),
            self.tables.len(),
            self.targets.len(),
        );
        let mut b = Vec::with_capacity(HEADER_LEN + sz.total() + CHECKSUM_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        for v in [HEADER_LEN, l, h, d, self.n_sink] {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        b.extend_from_slice(&[self.rope.kind().code(), SCALE_BITS as u8, NSYM as u8, 0]);
        for v in [self.rope.n_rot(), self.tables.len(), self.targets.len()] {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        b.extend_from_slice(&(sz.total() as u64).to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        debug_assert_eq!(b.len(), HEADER_LEN);
        for t in self.rope.theta() {
            b.extend_from_slice(&t.to_le_bytes());
        }
        for t in &self.tables {
            for f in t.freqs() {
                b.extend_from_slice(&f.to_le_bytes());
            }
        }
        for t in &self.targets {
            b.extend_from_slice(&t.bound.to_le_bytes());
        }
        for x in &self.bases {
            for v in x.mean.iter().chain(&x.basis) {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        for t in &self.targets {
            for s in &t.steps {
                b.extend_from_slice(&s.to_le_bytes());
            }
        }
        for t in &self.targets {
            b.extend_from_slice(&t.classes);
        }
        let sum = blake3::hash(&b);
        b.extend_from_slice(sum.as_bytes());
        Ok(b)
    }

    /// The BLAKE3 of a file's bytes before its checksum: what a chunk's fingerprint names.
    pub fn fingerprint_of(bytes: &[u8]) -> Option<[u8; 32]> {
        let n = bytes.len().checked_sub(CHECKSUM_LEN)?;
        Some(*blake3::hash(&bytes[..n]).as_bytes())
    }

    /// Reads and checks a file: every header field, the exact length, the checksum, then
    /// every value. Any failure is an error, never a panic or an allocation beyond the
    /// input's own size.
    pub fn from_bytes(bytes: &[u8]) -> Result<Calibration> {
        let c = |r: String| Error::corrupt("calibration file", r);
        if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
            return Err(c(format!(
                "{} bytes: shorter than header and checksum",
                bytes.len()
            )));
        }
        if &bytes[..8] != MAGIC {
            return Err(c("bad magic (not a KVCTCCAL file)".into()));
        }
        let version = le_u16(bytes, 8);
        if version != VERSION {
            return Err(c(format!("version {version}; this reader knows {VERSION}")));
        }
        if le_u16(bytes, 10) != 0 || le_u64(bytes, 56) != 0 || bytes[35] != 0 {
            return Err(c("reserved field not zero".into()));
        }
        if le_u32(bytes, 12) as usize != HEADER_LEN {
            return Err(c(format!("header_len {}", le_u32(bytes, 12))));
        }
        let field = |o| le_u32(bytes, o) as usize;
        let (l, h, d, n_sink) = (field(16), field(20), field(24), field(28));
        let (kind, scale, nsym) = (bytes[32], bytes[33], bytes[34]);
        let (n_rot, n_class, n_target) = (field(36), field(40), field(44));
        if u32::from(scale) != SCALE_BITS || nsym as usize != NSYM {
            return Err(c(format!("tables of {nsym} symbols at {scale} bits")));
        }
        let kind = RopeKind::from_code(kind).ok_or_else(|| c(format!("rope kind {kind}")))?;
        if !(1..=MAX_LAYERS).contains(&l)
            || !(1..=MAX_HEADS).contains(&h)
            || !(2..=MAX_HEAD_DIM).contains(&d)
            || n_rot > d
            || n_rot % 2 != 0
            || !(1..=MAX_CLASSES).contains(&n_class)
            || !(1..=MAX_TARGETS).contains(&n_target)
        {
            return Err(c(format!(
                "layout {l}×{h}×{d}, {n_rot} rotated, {n_class} tables, {n_target} targets"
            )));
        }
        let sz = Sizes::new(l, h, d, n_rot, n_class, n_target);
        let payload = le_u64(bytes, 48);
        if payload != sz.total() as u64
            || bytes.len() as u64 != (HEADER_LEN + CHECKSUM_LEN) as u64 + payload
        {
            return Err(c(format!(
                "{} bytes with payload_len {payload}; the layout needs payload {}",
                bytes.len(),
                sz.total()
            )));
        }
        let end = bytes.len() - CHECKSUM_LEN;
        if blake3::hash(&bytes[..end]).as_bytes() != &bytes[end..] {
            return Err(c("checksum mismatch".into()));
        }
        let mut o = HEADER_LEN;
        let mut take = |n: usize| {
            let s = &bytes[o..o + n];
            o += n;
            s
        };
        let theta: Vec<f64> = take(sz.theta)
            .chunks_exact(8)
            .map(|x| f64::from_le_bytes(x.try_into().expect("8 bytes")))
            .collect();
        let rope = Rope::from_theta(kind, d, theta).map_err(|e| c(e.to_string()))?;
        let tables = take(sz.tables)
            .chunks_exact(NSYM * 2)
            .map(|t| {
                let f: Vec<u16> = t.chunks_exact(2).map(|x| le_u16(x, 0)).collect();
                SymbolTable::from_freqs(&f)
            })
            .collect::<Result<Vec<_>>>()?;
        let bounds: Vec<f32> = f32s(take(sz.bounds)).collect();
        let bases = take(sz.bases)
            .chunks_exact((d + d * d) * 4)
            .map(|x| {
                let v: Vec<f32> = f32s(x).collect();
                HeadBasis {
                    mean: v[..d].to_vec(),
                    basis: v[d..].to_vec(),
                }
            })
            .collect();
        let steps = take(sz.steps);
        let classes = take(sz.classes);
        let per = l * 2 * h * d;
        let targets = bounds
            .iter()
            .enumerate()
            .map(|(i, &bound)| Target {
                bound,
                steps: f32s(&steps[i * per * 4..(i + 1) * per * 4]).collect(),
                classes: classes[i * per..(i + 1) * per].to_vec(),
            })
            .collect();
        let cal = Calibration {
            n_layer: l,
            n_kv_head: h,
            head_dim: d,
            n_sink,
            rope,
            tables,
            bases,
            targets,
        };
        cal.validate()?;
        Ok(cal)
    }
}
