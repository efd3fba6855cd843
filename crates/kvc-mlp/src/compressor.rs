//! The compressor: one layer's (or all layers') K and V, heads in parallel.

use parking_lot::Mutex;
use rayon::prelude::*;

use crate::dtype::KvElement;
use crate::error::{Error, Result};
use crate::forward::{run_mlp, HeadScratch};
use crate::plan::{CompressParams, CompressedLen, SegmentPlan, SequencePlan};
use crate::weights::{CompressorWeights, Mlp};

/// The shape of a contiguous `[heads, seq_len, head_dim]` tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Number of KV heads `H`.
    pub heads: usize,
    /// Tokens `S`.
    pub seq_len: usize,
    /// Head dimension `D`.
    pub head_dim: usize,
}

/// The shape of a cache buffer `[heads, capacity, head_dim]` whose first `seq_len` tokens of
/// each head hold data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    /// Number of KV heads `H`.
    pub heads: usize,
    /// Tokens each head's buffer holds.
    pub capacity: usize,
    /// Tokens in use, `<= capacity`.
    pub seq_len: usize,
    /// Head dimension `D`.
    pub head_dim: usize,
}

/// One layer's K and V cache buffers for [`Compressor::compress_layers_inplace`].
#[derive(Debug)]
pub struct LayerKv<'a, T> {
    /// Layer index into the weights.
    pub layer: usize,
    /// Keys, `[heads, capacity, head_dim]`.
    pub k: &'a mut [T],
    /// Values, `[heads, capacity, head_dim]`.
    pub v: &'a mut [T],
}

/// Runs the learned compressor. Holds the weights and a pool of scratch buffers so that, once
/// warm, calls allocate nothing of their own (the GEMM crate allocates its packing buffer per
/// product).
#[derive(Debug)]
pub struct Compressor {
    weights: CompressorWeights,
    pool: Mutex<Vec<HeadScratch>>,
}

fn checked_len(name: &'static str, a: usize, b: usize, c: usize) -> Result<usize> {
    a.checked_mul(b)
        .and_then(|x| x.checked_mul(c))
        .ok_or_else(|| Error::invalid(name, format!("{a} x {b} x {c} elements overflow")))
}

/// The MLPs a tensor uses: (image, text).
type MlpPair<'a> = (Option<&'a Mlp>, Option<&'a Mlp>);

impl Compressor {
    /// A compressor over `weights`.
    pub fn new(weights: CompressorWeights) -> Self {
        Compressor {
            weights,
            pool: Mutex::new(Vec::new()),
        }
    }

    /// The weights.
    pub fn weights(&self) -> &CompressorWeights {
        &self.weights
    }

    /// The file's defaults: its factor and min_seq_len, no image prefix.
    pub fn default_params(&self) -> CompressParams {
        CompressParams {
            factor: self.weights.factor(),
            min_seq_len: self.weights.min_seq_len(),
            image_kv_len: 0,
        }
    }

    /// What compressing `seq_len` tokens of `layer` does, without touching data.
    pub fn plan(
        &self,
        layer: usize,
        seq_len: usize,
        params: &CompressParams,
    ) -> Result<SequencePlan> {
        let mlps = self.weights.layer(layer)?;
        if params.factor != self.weights.factor() {
            return Err(Error::invalid(
                "factor",
                format!(
                    "{} does not match the weights, whose first Linear takes head_dim * {}",
                    params.factor,
                    self.weights.factor()
                ),
            ));
        }
        SequencePlan::new(
            seq_len,
            params,
            mlps.text().is_some(),
            mlps.image().is_some(),
        )
    }

    fn check_head_dim(&self, head_dim: usize) -> Result<()> {
        if head_dim != self.weights.head_dim() {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "{head_dim}, but the weights have {}",
                    self.weights.head_dim()
                ),
            ));
        }
        Ok(())
    }

    /// The (image, text) MLPs for K and for V of `layer`, given the plan.
    fn mlps(&self, layer: usize) -> Result<(MlpPair<'_>, MlpPair<'_>)> {
        let l = self.weights.layer(layer)?;
        Ok((
            (l.image_k.as_ref(), l.text_k.as_ref()),
            (l.image_v.as_ref(), l.text_v.as_ref()),
        ))
    }

    fn with_scratch<R>(&self, f: impl FnOnce(&mut HeadScratch) -> R) -> R {
        let mut s = self.pool.lock().pop().unwrap_or_default();
        let r = f(&mut s);
        self.pool.lock().push(s);
        r
    }

    /// Compresses one layer's K and V, each a contiguous `[H, S, D]` tensor, into `out_k` and
    /// `out_v` as `[H, S_new, D]`. Returns the lengths; `out_*[H * S_new * D..]` is untouched.
    #[allow(clippy::too_many_arguments)]
    pub fn compress_layer<T: KvElement>(
        &self,
        layer: usize,
        shape: KvShape,
        k: &[T],
        v: &[T],
        out_k: &mut [T],
        out_v: &mut [T],
        params: &CompressParams,
    ) -> Result<CompressedLen> {
        self.check_head_dim(shape.head_dim)?;
        let plan = self.plan(layer, shape.seq_len, params)?;
        let (kmlp, vmlp) = self.mlps(layer)?;
        let n_in = checked_len("shape", shape.heads, shape.seq_len, shape.head_dim)?;
        let lens = plan.lengths();
        let n_out = shape.heads * lens.kv_len * shape.head_dim;
        for (name, len) in [("k", k.len()), ("v", v.len())] {
            if len != n_in {
                return Err(Error::invalid(
                    name,
                    format!(
                        "{len} elements, expected {} x {} x {} = {n_in}",
                        shape.heads, shape.seq_len, shape.head_dim
                    ),
                ));
            }
        }
        for (name, len) in [("out_k", out_k.len()), ("out_v", out_v.len())] {
            if len < n_out {
                return Err(Error::BufferTooSmall {
                    name,
                    needed: n_out,
                    found: len,
                });
            }
        }
        if n_out == 0 {
            return Ok(lens);
        }
        let d = shape.head_dim;
        let (in_stride, out_stride) = (shape.seq_len * d, lens.kv_len * d);
        let run = |src: &[T], dst: &mut [T], mlps: MlpPair<'_>| {
            dst[..n_out]
                .par_chunks_mut(out_stride)
                .zip(src.par_chunks(in_stride))
                .for_each(|(dst, src)| {
                    self.with_scratch(|s| compress_head(src, dst, &plan, mlps, d, s))
                });
        };
        rayon::join(|| run(k, out_k, kmlp), || run(v, out_v, vmlp));
        Ok(lens)
    }

    /// Compresses one layer's K and V in place: each is a `[H, capacity, D]` buffer whose
    /// first `seq_len` tokens per head hold data; afterwards tokens `[0, S_new)` of each head
    /// hold the result (what lies beyond is unspecified). This is InfiniLM's
    /// `StaticKVCache::compress_inplace` contract. Returns the lengths.
    pub fn compress_layer_inplace<T: KvElement>(
        &self,
        layer: usize,
        shape: CacheShape,
        k: &mut [T],
        v: &mut [T],
        params: &CompressParams,
    ) -> Result<CompressedLen> {
        let (plan, mlps) = self.check_inplace(layer, shape, k.len(), v.len(), params)?;
        self.run_inplace(shape, k, v, &plan, mlps);
        Ok(plan.lengths())
    }

    /// [`compress_layer_inplace`](Self::compress_layer_inplace) for several layers at once,
    /// all layers and heads in parallel. Every layer is checked before any is changed.
    pub fn compress_layers_inplace<T: KvElement>(
        &self,
        layers: &mut [LayerKv<'_, T>],
        shape: CacheShape,
        params: &CompressParams,
    ) -> Result<CompressedLen> {
        let mut lens = None;
        let mut jobs = Vec::with_capacity(layers.len());
        for l in layers.iter() {
            let (plan, mlps) = self.check_inplace(l.layer, shape, l.k.len(), l.v.len(), params)?;
            if lens.is_some_and(|x| x != plan.lengths()) {
                return Err(Error::invalid(
                    "layers",
                    "layers have different MLP sets, so their lengths would differ",
                ));
            }
            lens = Some(plan.lengths());
            jobs.push((plan, mlps));
        }
        layers
            .par_iter_mut()
            .zip(jobs.into_par_iter())
            .for_each(|(l, (plan, mlps))| self.run_inplace(shape, l.k, l.v, &plan, mlps));
        Ok(lens.unwrap_or(CompressedLen {
            rope_position: shape.seq_len,
            kv_len: shape.seq_len,
        }))
    }

    #[allow(clippy::type_complexity)]
    fn check_inplace(
        &self,
        layer: usize,
        shape: CacheShape,
        k_len: usize,
        v_len: usize,
        params: &CompressParams,
    ) -> Result<(SequencePlan, (MlpPair<'_>, MlpPair<'_>))> {
        self.check_head_dim(shape.head_dim)?;
        if shape.seq_len > shape.capacity {
            return Err(Error::invalid(
                "seq_len",
                format!("{} exceeds the capacity {}", shape.seq_len, shape.capacity),
            ));
        }
        let plan = self.plan(layer, shape.seq_len, params)?;
        let n = checked_len("shape", shape.heads, shape.capacity, shape.head_dim)?;
        for (name, len) in [("k", k_len), ("v", v_len)] {
            if len != n {
                return Err(Error::invalid(
                    name,
                    format!(
                        "{len} elements, expected {} x {} x {} = {n}",
                        shape.heads, shape.capacity, shape.head_dim
                    ),
                ));
            }
        }
        Ok((plan, self.mlps(layer)?))
    }

    fn run_inplace<T: KvElement>(
        &self,
        shape: CacheShape,
        k: &mut [T],
        v: &mut [T],
        plan: &SequencePlan,
        (kmlp, vmlp): (MlpPair<'_>, MlpPair<'_>),
    ) {
        if plan.is_identity() || k.is_empty() {
            return;
        }
        let d = shape.head_dim;
        let stride = shape.capacity * d;
        let run = |buf: &mut [T], mlps: MlpPair<'_>| {
            buf.par_chunks_mut(stride).for_each(|head| {
                self.with_scratch(|s| compress_head_inplace(head, plan, mlps, d, s))
            });
        };
        rayon::join(|| run(k, kmlp), || run(v, vmlp));
    }
}

fn segments<'a>(plan: &SequencePlan, mlps: MlpPair<'a>) -> [(SegmentPlan, Option<&'a Mlp>); 2] {
    [(plan.image, mlps.0), (plan.text, mlps.1)]
}

/// One head: `src` is `[S, D]`, `dst` is `[S_new, D]`.
fn compress_head<T: KvElement>(
    src: &[T],
    dst: &mut [T],
    plan: &SequencePlan,
    mlps: MlpPair<'_>,
    d: usize,
    scratch: &mut HeadScratch,
) {
    let mut w = 0;
    for (seg, mlp) in segments(plan, mlps) {
        let seg_src = &src[seg.start * d..(seg.start + seg.len) * d];
        let (done, rest) = match mlp {
            Some(mlp) if seg.groups > 0 => {
                let f = mlp.input_width() / d;
                let out = run_mlp(mlp, seg_src, seg.groups, scratch);
                T::narrow(out, &mut dst[w * d..(w + seg.groups) * d]);
                (seg.groups, &seg_src[seg.groups * f * d..])
            }
            _ => (0, seg_src),
        };
        w += done;
        dst[w * d..w * d + rest.len()].copy_from_slice(rest);
        w += rest.len() / d;
    }
}

/// One head in place: `head` is `[capacity, D]`, the result goes to its first `S_new` rows.
///
/// Writes never overtake reads: a segment's output starts at or before its input, the MLP
/// result is complete (in scratch) before it is written, and `S' <= S' * factor`.
fn compress_head_inplace<T: KvElement>(
    head: &mut [T],
    plan: &SequencePlan,
    mlps: MlpPair<'_>,
    d: usize,
    scratch: &mut HeadScratch,
) {
    let mut w = 0;
    for (seg, mlp) in segments(plan, mlps) {
        let mut rest_start = seg.start;
        if let Some(mlp) = mlp.filter(|_| seg.groups > 0) {
            let f = mlp.input_width() / d;
            let input = &head[seg.start * d..(seg.start + seg.groups * f) * d];
            let out = run_mlp(mlp, input, seg.groups, scratch);
            T::narrow(out, &mut head[w * d..(w + seg.groups) * d]);
            w += seg.groups;
            rest_start += seg.groups * f;
        }
        let end = seg.start + seg.len;
        head.copy_within(rest_start * d..end * d, w * d);
        w += end - rest_start;
    }
}
