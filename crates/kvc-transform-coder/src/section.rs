//! Coding one section: one layer's K or V for the tokens of a chunk, `[n][n_kv_head]
//! [head_dim]` in the cache's dtype, at known absolute positions.
//!
//! Section bytes (docs/formats/kv-chunk-tc.md):
//!
//! | bytes | what |
//! |---|---|
//! | 16 | the first 16 bytes of BLAKE3 of the encoder's reconstruction (the section's decoded bytes) |
//! | `s·n_kv_head·head_dim·size` | the section's sink tokens (positions below the calibration's `n_sink`), raw |
//! | rest | the rANS stream of every other row's quantized components (empty when every token is a sink token) |
//!
//! A row (one token of one KV head) is read as f32, K rotated back by its position, then
//! `y = basis·(x − mean)` and `q_i = round(y_i / step_i)`; each `q_i` is one symbol of the
//! component's table plus raw extra bits. The decoder rebuilds `mean + Σ q_i·step_i·basis_i`
//! in f32 in component order, rotates K forward, and rounds to the dtype. The encoder
//! reconstructs with the very same function and hashes the result, so a decoder that
//! computes anything else (another host, a damaged stream) is caught.

use std::sync::Arc;

use kvc_types::{load_f32, store_f32, Dtype, Tensor};

use crate::calibration::{slot, Calibration, HeadBasis, Target};
use crate::combine;
use crate::error::{Error, Result};
use crate::rans::{self, SymbolTable, MAX_MAGNITUDE};

/// Bytes of the reconstruction hash at the start of a section.
pub const HASH_LEN: usize = 16;

/// A calibration with one of its targets chosen: codes sections, shared by threads.
#[derive(Debug, Clone)]
pub struct TransformCodec {
    cal: Arc<Calibration>,
    target: usize,
    fingerprint: [u8; 32],
}

/// The layout of one section call.
struct Geometry<'a> {
    cal: &'a Calibration,
    target: &'a Target,
    layer: usize,
    tensor: Tensor,
    dtype: Dtype,
    pos0: u64,
    sink: usize,
}

impl Geometry<'_> {
    fn heads(&self) -> usize {
        self.cal.n_kv_head
    }
    fn d(&self) -> usize {
        self.cal.head_dim
    }
    fn row_bytes(&self) -> usize {
        self.d() * self.dtype.size()
    }
    fn basis(&self, h: usize) -> &HeadBasis {
        &self.cal.bases[slot(self.heads(), self.layer, self.tensor, h)]
    }
    fn quantizer(&self, h: usize) -> (&[f32], &[u8]) {
        let o = slot(self.heads(), self.layer, self.tensor, h) * self.d();
        (
            &self.target.steps[o..o + self.d()],
            &self.target.classes[o..o + self.d()],
        )
    }
    fn table(&self, class: u8) -> &SymbolTable {
        &self.cal.tables[class as usize]
    }
    fn is_k(&self) -> bool {
        self.tensor == Tensor::K && self.cal.rope.n_rot() > 0
    }
    fn angles(&self, t: usize, cs: &mut [f64]) {
        if self.is_k() {
            self.cal.rope.angles(self.pos0 + t as u64, cs);
        }
    }

    /// `mean + Σ q_i·step_i·basis_i`, rotated forward for K, into `dst` in the dtype.
    fn reconstruct(&self, h: usize, q: &[i32], cs: &[f64], acc: &mut [f32], dst: &mut [u8]) {
        let (b, (steps, _)) = (self.basis(h), self.quantizer(h));
        let d = self.d();
        debug_assert_eq!(acc.len(), d);
        acc.copy_from_slice(&b.mean);
        combine::accumulate(combine::Path::detected(), acc, q, steps, &b.basis);
        if self.is_k() {
            self.cal.rope.rotate(cs, acc, false);
        }
        store_f32(self.dtype, acc, dst);
    }
}

impl TransformCodec {
    /// The codec of `cal`'s target `bound` (`fingerprint`: [`Calibration::fingerprint_of`]
    /// the file's bytes).
    pub fn new(cal: Arc<Calibration>, fingerprint: [u8; 32], bound: f32) -> Result<TransformCodec> {
        let target = cal.target_index(bound)?;
        Ok(TransformCodec {
            cal,
            target,
            fingerprint,
        })
    }

    /// The codec named `tc-<bound>` of the calibration file `bytes`.
    pub fn from_file(bytes: &[u8], name: &str) -> Result<TransformCodec> {
        let bound = parse_name(name)?;
        let cal = Calibration::from_bytes(bytes)?;
        let fp = Calibration::fingerprint_of(bytes).expect("a valid file has a checksum");
        TransformCodec::new(Arc::new(cal), fp, bound)
    }

    /// The calibration.
    pub fn calibration(&self) -> &Calibration {
        &self.cal
    }

    /// The chosen target's bound.
    pub fn bound(&self) -> f32 {
        self.cal.targets[self.target].bound
    }

    /// `tc-<bound>`.
    pub fn name(&self) -> String {
        format!("tc-{}", self.bound())
    }

    /// The calibration file's fingerprint.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// Everything that changes the coded bytes, for a chunk's fingerprint.
    pub fn config_string(&self) -> String {
        let hex: String = self
            .fingerprint
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "tc/format={}/bound={}/calibration={hex}",
            crate::calibration::VERSION,
            self.bound()
        )
    }

    /// Refuses a layout other than the calibration's.
    pub fn check_layout(&self, n_layer: usize, n_kv_head: usize, head_dim: usize) -> Result<()> {
        let c = &self.cal;
        if (n_layer, n_kv_head, head_dim) != (c.n_layer, c.n_kv_head, c.head_dim) {
            return Err(Error::Foreign {
                what: "layout",
                reason: format!(
                    "the calibration is for {} layers × {} KV heads × {}, the cache is {n_layer} × {n_kv_head} × {head_dim}",
                    c.n_layer, c.n_kv_head, c.head_dim
                ),
            });
        }
        Ok(())
    }

    fn geometry(
        &self,
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
        pos0: u64,
        n: usize,
        bytes: usize,
    ) -> Result<Geometry<'_>> {
        if layer >= self.cal.n_layer {
            return Err(Error::invalid(
                "layer",
                format!("{layer} of {}", self.cal.n_layer),
            ));
        }
        if dtype == Dtype::I8 {
            return Err(Error::invalid("dtype", "i8 rows are not coded".into()));
        }
        let want = n
            .checked_mul(self.cal.n_kv_head * self.cal.head_dim * dtype.size())
            .filter(|&w| w == bytes);
        if want.is_none() {
            return Err(Error::invalid(
                "section",
                format!(
                    "{bytes} bytes for {n} tokens × {} heads × {} values of {}",
                    self.cal.n_kv_head,
                    self.cal.head_dim,
                    dtype.name()
                ),
            ));
        }
        let sink = (self.cal.n_sink as u64).saturating_sub(pos0).min(n as u64) as usize;
        Ok(Geometry {
            cal: &self.cal,
            target: &self.cal.targets[self.target],
            layer,
            tensor,
            dtype,
            pos0,
            sink,
        })
    }

    /// Appends the coding of `raw` (`n` tokens of `layer`'s `tensor` from position `pos0`,
    /// in `dtype`) to `out`. A NaN, an infinity or a component beyond the coded range
    /// refuses the section ([`Error::NonFinite`]) and leaves `out` as it was.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_section(
        &self,
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
        pos0: u64,
        n: usize,
        raw: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let g = self.geometry(layer, tensor, dtype, pos0, n, raw.len())?;
        let (h_n, d, rb) = (g.heads(), g.d(), g.row_bytes());
        let mut recon = raw.to_vec();
        let mut ops = Vec::with_capacity((n - g.sink) * h_n * d * 5 / 4);
        let (mut x, mut y, mut q) = (vec![0f32; d], vec![0f32; d], vec![0i32; d]);
        let mut cs = vec![0f64; d];
        for t in g.sink..n {
            g.angles(t, &mut cs);
            for h in 0..h_n {
                let r = t * h_n + h;
                let src = &raw[r * rb..(r + 1) * rb];
                load_f32(dtype, src, &mut x);
                if let Some(j) = x.iter().position(|v| !v.is_finite()) {
                    return Err(Error::NonFinite { row: r, index: j });
                }
                if g.is_k() {
                    g.cal.rope.rotate(&cs, &mut x, true);
                }
                let b = g.basis(h);
                for (xj, m) in x.iter_mut().zip(&b.mean) {
                    *xj -= m;
                }
                for (i, yi) in y.iter_mut().enumerate() {
                    *yi = b.basis[i * d..(i + 1) * d]
                        .iter()
                        .zip(&x)
                        .map(|(u, v)| u * v)
                        .sum();
                }
                let (steps, classes) = g.quantizer(h);
                for i in 0..d {
                    let v = quantize(y[i], steps[i]);
                    if v.is_nan() || v.abs() > MAX_MAGNITUDE as f32 {
                        return Err(Error::NonFinite { row: r, index: i });
                    }
                    q[i] = v as i32;
                    rans::push_value(&mut ops, g.table(classes[i]), q[i]);
                }
                g.reconstruct(h, &q, &cs, &mut x, &mut recon[r * rb..(r + 1) * rb]);
            }
        }
        out.extend_from_slice(&blake3::hash(&recon).as_bytes()[..HASH_LEN]);
        out.extend_from_slice(&raw[..g.sink * h_n * rb]);
        if g.sink < n {
            rans::encode(&ops, out);
        }
        Ok(())
    }

    /// Decodes `blob` (from [`TransformCodec::encode_section`] with the same arguments)
    /// into exactly `out`. Any damage is an error: a stream that does not end where it
    /// should, or values whose hash is not the encoder's
    /// ([`Error::ReconstructionMismatch`]).
    #[allow(clippy::too_many_arguments)]
    pub fn decode_section(
        &self,
        layer: usize,
        tensor: Tensor,
        dtype: Dtype,
        pos0: u64,
        n: usize,
        blob: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        let g = self.geometry(layer, tensor, dtype, pos0, n, out.len())?;
        let (h_n, d, rb) = (g.heads(), g.d(), g.row_bytes());
        let sink_bytes = g.sink * h_n * rb;
        if blob.len() < HASH_LEN + sink_bytes {
            return Err(Error::corrupt(
                "tc section",
                format!(
                    "{} bytes, its hash and sink need {}",
                    blob.len(),
                    HASH_LEN + sink_bytes
                ),
            ));
        }
        let (hash, rest) = blob.split_at(HASH_LEN);
        let (sink, stream) = rest.split_at(sink_bytes);
        out[..sink_bytes].copy_from_slice(sink);
        if g.sink == n {
            if !stream.is_empty() {
                return Err(Error::corrupt(
                    "tc section",
                    "bytes after an all-sink section",
                ));
            }
        } else {
            let mut dec = rans::Decoder::new(stream)?;
            let (mut acc, mut q) = (vec![0f32; d], vec![0i32; d]);
            let mut cs = vec![0f64; d];
            for t in g.sink..n {
                g.angles(t, &mut cs);
                for h in 0..h_n {
                    let r = t * h_n + h;
                    let (_, classes) = g.quantizer(h);
                    for (qi, &c) in q.iter_mut().zip(classes) {
                        *qi = rans::read_value(&mut dec, g.table(c))?;
                    }
                    g.reconstruct(h, &q, &cs, &mut acc, &mut out[r * rb..(r + 1) * rb]);
                }
            }
            dec.finish()?;
        }
        if &blake3::hash(out).as_bytes()[..HASH_LEN] != hash {
            return Err(Error::ReconstructionMismatch);
        }
        Ok(())
    }
}

/// The quantized level of `y` with `step`: `round(y / step)`, ties away from zero; NaN
/// stays NaN. The encoder's choice, not part of the format (the decoder only sees the
/// level), shared with the calibration so that it measures what the encoder does.
///
/// Measured and dropped: thresholds moved toward each level's low end (a dead zone,
/// `floor(|y|/step + 0.1)`) cost 10-30 % fewer bits at the same mean squared error of the
/// PCA coefficients, but 25 % more bits at the same attention-output error on SmolLM2-135M
/// (tc-0.064: f16/7.42 against f16/9.94), because shrinking every coefficient toward zero is
/// a bias that attention does not average away.
#[inline]
pub fn quantize(y: f32, step: f32) -> f32 {
    (y / step).round()
}

/// The bound of a codec name `tc-<bound>` (a positive finite number).
pub fn parse_name(name: &str) -> Result<f32> {
    let bad = || {
        Error::invalid(
            "codec",
            format!("{name:?}: a transform codec is named tc-<bound>, e.g. tc-0.01"),
        )
    };
    let b: f32 = name
        .strip_prefix("tc-")
        .ok_or_else(bad)?
        .parse()
        .map_err(|_| bad())?;
    if !(b.is_finite() && b > 0.0) {
        return Err(bad());
    }
    Ok(b)
}
