//! MLP compression (`kvc-mlp`) of a cache in place.
//!
//! - InfiniLM (`[H, S_max, D]` per layer, [`Addressing::HeadMajor`]): the buffers are handed
//!   to [`Compressor::compress_layers_inplace`] as they are; afterwards tokens
//!   `[0, kv_len)` of each head hold the result.
//! - llama.cpp (cells shared by all layers): the cells of one sequence are gathered in
//!   position order into `[H, S, D]`, compressed, and written back to the sequence's first
//!   `kv_len` cells (lowest cell indices first); the remaining cells of the sequence are
//!   freed in kvc's [`CellTable`].
//!
//! Both return the new cache length and the RoPE position of the next token separately
//! ([`CompressedLen`]), as `kvc-mlp` does.

use kvc_mlp::{
    CacheShape, CompressParams, CompressedLen, Compressor, KvElement, KvShape, LayerKv,
    SequencePlan,
};

use crate::cells::{Cell, CellTable};
use crate::error::{Error, Result};
use crate::layout::{Addressing, LayerMut, TensorLayout};
use kvc_types::Dtype;

fn typed<'a, T: KvElement>(what: &'static str, buf: &'a mut [u8]) -> Result<&'a mut [T]> {
    bytemuck::try_cast_slice_mut(buf).map_err(|_| Error::Misaligned {
        what,
        align: std::mem::align_of::<T>(),
    })
}

fn float_dtype(what: &'static str, dtype: Dtype) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            what,
            dtype: dtype.to_string(),
        })
    }
}

fn check_head_dim(compressor: &Compressor, head_dim: usize) -> Result<()> {
    let w = compressor.weights().head_dim();
    if head_dim != w {
        return Err(Error::LayoutMismatch {
            what: "head_dim of the cache vs the MLP weights",
            expected: w,
            found: head_dim,
        });
    }
    Ok(())
}

/// Weights layer of the `i`-th cache layer.
fn weights_layer(first_layer: usize, i: usize) -> Result<usize> {
    first_layer.checked_add(i).ok_or(Error::SizeOverflow {
        what: "first_layer + layer",
    })
}

/// Compresses InfiniLM StaticKVCache layers in place, all layers and heads in parallel.
///
/// `layers[i]` uses the MLPs of weights layer `first_layer + i`; every layer must have the
/// same [`KvLayout::infinilm`](crate::KvLayout::infinilm) layout (K and V
/// [`Addressing::HeadMajor`], equal shapes, a float dtype) and buffers aligned for the
/// dtype. The first `seq_len` tokens of each head hold data; afterwards tokens
/// `[0, kv_len)` of each head hold the result, and what lies in `[kv_len, seq_len)` is
/// unspecified (zero it with [`zero_layer_tokens`](crate::zero_layer_tokens) if needed).
/// Everything is checked before any layer changes. The result equals `kvc-mlp`'s
/// out-of-place [`Compressor::compress_layer`] bit for bit.
pub fn mlp_compress_infinilm(
    compressor: &Compressor,
    layers: &mut [LayerMut<'_>],
    first_layer: usize,
    seq_len: usize,
    params: &CompressParams,
) -> Result<CompressedLen> {
    let Some(first) = layers.first() else {
        return Ok(CompressedLen {
            rope_position: seq_len,
            kv_len: seq_len,
        });
    };
    let layout = *first.layout();
    for l in layers.iter() {
        let lay = l.layout();
        for t in [&lay.k, &lay.v] {
            if t.addressing() != Addressing::HeadMajor {
                return Err(Error::InvalidShape {
                    field: "addressing",
                    value: 0,
                    reason: "InfiniLM MLP compression needs [H, S_max, D] (HeadMajor) tensors",
                });
            }
        }
        if lay.k != lay.v {
            return Err(Error::LayoutMismatch {
                what: "K and V shapes (heads x head_dim)",
                expected: lay.k.channels(),
                found: lay.v.channels(),
            });
        }
        if *lay != layout {
            return Err(Error::LayoutMismatch {
                what: "layer layouts (elements per tensor)",
                expected: layout.k.elem_count(),
                found: lay.k.elem_count(),
            });
        }
    }
    float_dtype("MLP compression", layout.k.dtype())?;
    check_head_dim(compressor, layout.k.head_dim())?;
    let shape = CacheShape {
        heads: layout.k.n_heads(),
        capacity: layout.k.capacity(),
        seq_len,
        head_dim: layout.k.head_dim(),
    };
    match layout.k.dtype() {
        Dtype::F16 => infinilm_typed::<half::f16>(compressor, layers, first_layer, shape, params),
        Dtype::Bf16 => infinilm_typed::<half::bf16>(compressor, layers, first_layer, shape, params),
        Dtype::F32 => infinilm_typed::<f32>(compressor, layers, first_layer, shape, params),
        Dtype::I8 => unreachable!("checked by float_dtype"),
    }
}

fn infinilm_typed<T: KvElement>(
    compressor: &Compressor,
    layers: &mut [LayerMut<'_>],
    first_layer: usize,
    shape: CacheShape,
    params: &CompressParams,
) -> Result<CompressedLen> {
    let mut jobs: Vec<LayerKv<'_, T>> = Vec::with_capacity(layers.len());
    for (i, l) in layers.iter_mut().enumerate() {
        let layout = *l.layout();
        let (k, v) = l.kv_mut();
        jobs.push(LayerKv {
            layer: weights_layer(first_layer, i)?,
            k: typed("K", &mut k[..layout.k.byte_len()])?,
            v: typed("V", &mut v[..layout.v.byte_len()])?,
        });
    }
    Ok(compressor.compress_layers_inplace(&mut jobs, shape, params)?)
}

/// What [`mlp_compress_llama`] did to one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqCompression {
    /// `kv_len`: cells the sequence now uses; `rope_position`: the position of its next
    /// token (its last position + 1, or 0 for an empty sequence).
    pub lens: CompressedLen,
    /// The cells now holding the sequence, in position order, with their new positions
    /// (the position of the last original token each row stands for).
    pub kept: Vec<(usize, i32)>,
    /// The cells that were freed, ascending.
    pub freed: Vec<usize>,
}

/// For each output row of `plan`, the index (in position order) of the last input token
/// it stands for.
fn row_sources(plan: &SequencePlan, factor: usize) -> Vec<usize> {
    let mut rows = Vec::with_capacity(plan.lengths().kv_len);
    for seg in [plan.image, plan.text] {
        let mut t = seg.start;
        for _ in 0..seg.groups {
            t += factor;
            rows.push(t - 1);
        }
        rows.extend(t..seg.start + seg.len);
    }
    rows
}

/// Copies tokens `cells` (in that order) of one tensor into `[H, S, D]` (`out`, bytes).
fn gather(buf: &[u8], layout: &TensorLayout, cells: &[usize], out: &mut [u8]) {
    let (h_n, d_n, s_n, es) = (
        layout.n_heads(),
        layout.head_dim(),
        cells.len(),
        layout.dtype().size(),
    );
    for h in 0..h_n {
        let contiguous = (0..d_n)
            .all(|d| layout.channel_offset(h * d_n + d) == layout.channel_offset(h * d_n) + d);
        for (j, &cell) in cells.iter().enumerate() {
            let base = layout.token_offset(cell);
            let dst = &mut out[(h * s_n + j) * d_n * es..(h * s_n + j + 1) * d_n * es];
            if contiguous {
                let o = (base + layout.channel_offset(h * d_n)) * es;
                dst.copy_from_slice(&buf[o..o + d_n * es]);
            } else {
                for (d, e) in dst.chunks_exact_mut(es).enumerate() {
                    let o = (base + layout.channel_offset(h * d_n + d)) * es;
                    e.copy_from_slice(&buf[o..o + es]);
                }
            }
        }
    }
}

/// The reverse of [`gather`]: rows `[0, cells.len())` of `[H, rows, D]` (`src`) go to
/// `cells`.
fn scatter(buf: &mut [u8], layout: &TensorLayout, cells: &[usize], rows: usize, src: &[u8]) {
    let (h_n, d_n, es) = (layout.n_heads(), layout.head_dim(), layout.dtype().size());
    for h in 0..h_n {
        for (j, &cell) in cells.iter().enumerate() {
            let base = layout.token_offset(cell);
            let row = &src[(h * rows + j) * d_n * es..(h * rows + j + 1) * d_n * es];
            for (d, e) in row.chunks_exact(es).enumerate() {
                let o = (base + layout.channel_offset(h * d_n + d)) * es;
                buf[o..o + es].copy_from_slice(e);
            }
        }
    }
}

/// Compresses sequence `seq` of a llama.cpp cache in place, through the cell table.
///
/// `layers[i]` (a [`KvLayout::llama`](crate::KvLayout::llama) layout, V plain or
/// transposed, K and V of equal head_dim, a float dtype) uses the MLPs of weights layer
/// `first_layer + i`; `cells` is kvc's table of the cache's `kv_size` cells. The cells of
/// `seq` are taken in position order; they must not be shared with another sequence and
/// hold distinct positions. Every layer must compress to the same length (cells are
/// shared). Row `j` of the result goes to the `j`-th lowest cell index of the sequence and
/// gets the position of the last original token it stands for (a group's last token, or
/// the token itself for rows copied unchanged); the remaining cells of the sequence are
/// freed in `cells` (their bytes are left as they are). Other sequences are untouched.
/// Everything is checked before anything changes; the result equals `kvc-mlp`'s
/// out-of-place [`Compressor::compress_layer`] on the gathered tokens, bit for bit.
/// The engine mirrors [`SeqCompression::kept`] and [`SeqCompression::freed`] in its own
/// cell metadata.
pub fn mlp_compress_llama(
    compressor: &Compressor,
    layers: &mut [LayerMut<'_>],
    first_layer: usize,
    cells: &mut CellTable,
    seq: i32,
    params: &CompressParams,
) -> Result<SeqCompression> {
    if !(0..CellTable::MAX_SEQ).contains(&i64::from(seq)) {
        return Err(Error::InvalidCell {
            what: "sequence id",
            value: seq.into(),
            limit: CellTable::MAX_SEQ,
        });
    }
    for l in layers.iter() {
        let lay = l.layout();
        let llama = lay.k.addressing() == Addressing::CellRows
            && matches!(
                lay.v.addressing(),
                Addressing::CellRows | Addressing::CellColumns
            );
        if !llama {
            return Err(Error::InvalidShape {
                field: "addressing",
                value: 0,
                reason: "llama.cpp MLP compression needs cell-row K and cell-row or transposed V",
            });
        }
        if lay.capacity() != cells.len() {
            return Err(Error::LayoutMismatch {
                what: "kv_size vs cell table length",
                expected: cells.len(),
                found: lay.capacity(),
            });
        }
        if lay.k.n_heads() != lay.v.n_heads() || lay.k.head_dim() != lay.v.head_dim() {
            return Err(Error::LayoutMismatch {
                what: "K and V channels (the MLP needs equal head_dim)",
                expected: lay.k.channels(),
                found: lay.v.channels(),
            });
        }
        float_dtype("MLP compression", lay.k.dtype())?;
        float_dtype("MLP compression", lay.v.dtype())?;
        check_head_dim(compressor, lay.k.head_dim())?;
    }

    let bit = 1u64 << seq;
    let mut by_pos: Vec<(i32, usize)> = Vec::new();
    for (i, c) in cells.cells().iter().enumerate() {
        if c.is_used() && c.seq_mask & bit != 0 {
            if c.seq_mask != bit {
                return Err(Error::SharedCell {
                    cell: i,
                    seq,
                    seq_mask: c.seq_mask,
                });
            }
            by_pos.push((c.pos, i));
        }
    }
    by_pos.sort_unstable();
    if let Some(w) = by_pos.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::DuplicatePosition { seq, pos: w[0].0 });
    }
    let s_n = by_pos.len();
    let rope_position = by_pos.last().map_or(0, |&(p, _)| p as usize + 1);
    let unchanged = |by_pos: &[(i32, usize)]| SeqCompression {
        lens: CompressedLen {
            rope_position,
            kv_len: s_n,
        },
        kept: by_pos.iter().map(|&(p, c)| (c, p)).collect(),
        freed: Vec::new(),
    };

    // Plan every layer first: all must agree, since the cells are shared.
    let mut plan: Option<SequencePlan> = None;
    for i in 0..layers.len() {
        let p = compressor.plan(weights_layer(first_layer, i)?, s_n, params)?;
        if let Some(q) = plan {
            if q.lengths() != p.lengths() {
                return Err(Error::LayoutMismatch {
                    what: "compressed length across layers (cells are shared)",
                    expected: q.lengths().kv_len,
                    found: p.lengths().kv_len,
                });
            }
        }
        plan = Some(p);
    }
    let Some(plan) = plan.filter(|p| !p.is_identity()) else {
        return Ok(unchanged(&by_pos));
    };
    let kv_len = plan.lengths().kv_len;
    let src_cells: Vec<usize> = by_pos.iter().map(|&(_, c)| c).collect();
    let mut dst_cells = src_cells.clone();
    dst_cells.sort_unstable();
    let freed = dst_cells.split_off(kv_len);
    let new_pos: Vec<i32> = row_sources(&plan, params.factor)
        .into_iter()
        .map(|j| by_pos[j].0)
        .collect();

    for (i, l) in layers.iter_mut().enumerate() {
        let layer = weights_layer(first_layer, i)?;
        match l.layout().k.dtype() {
            Dtype::F16 => {
                llama_layer::<half::f16>(compressor, l, layer, &src_cells, &dst_cells, params)?
            }
            Dtype::Bf16 => {
                llama_layer::<half::bf16>(compressor, l, layer, &src_cells, &dst_cells, params)?
            }
            Dtype::F32 => llama_layer::<f32>(compressor, l, layer, &src_cells, &dst_cells, params)?,
            Dtype::I8 => unreachable!("checked by float_dtype"),
        }
    }

    for &c in &freed {
        cells.clear(c)?;
    }
    let mut kept = Vec::with_capacity(kv_len);
    for (&c, &p) in dst_cells.iter().zip(&new_pos) {
        cells.clear(c)?;
        cells.set(c, p, seq)?;
        kept.push((c, p));
    }
    debug_assert!(kept
        .iter()
        .all(|&(c, _)| cells.get(c).is_some_and(|x: Cell| x.is_used())));
    Ok(SeqCompression {
        lens: CompressedLen {
            rope_position,
            kv_len,
        },
        kept,
        freed,
    })
}

fn llama_layer<T: KvElement>(
    compressor: &Compressor,
    l: &mut LayerMut<'_>,
    layer: usize,
    src_cells: &[usize],
    dst_cells: &[usize],
    params: &CompressParams,
) -> Result<()> {
    let layout = *l.layout();
    let shape = KvShape {
        heads: layout.k.n_heads(),
        seq_len: src_cells.len(),
        head_dim: layout.k.head_dim(),
    };
    let n = shape.heads * shape.seq_len * shape.head_dim;
    let zero = <T as bytemuck::Zeroable>::zeroed();
    let (mut k_in, mut v_in) = (vec![zero; n], vec![zero; n]);
    let (k, v) = l.kv_mut();
    gather(k, &layout.k, src_cells, bytemuck::cast_slice_mut(&mut k_in));
    gather(v, &layout.v, src_cells, bytemuck::cast_slice_mut(&mut v_in));
    let (mut k_out, mut v_out) = (vec![zero; n], vec![zero; n]);
    let lens =
        compressor.compress_layer(layer, shape, &k_in, &v_in, &mut k_out, &mut v_out, params)?;
    debug_assert_eq!(lens.kv_len, dst_cells.len());
    let rows = lens.kv_len;
    let m = shape.heads * rows * shape.head_dim;
    scatter(
        k,
        &layout.k,
        dst_cells,
        rows,
        bytemuck::cast_slice(&k_out[..m]),
    );
    scatter(
        v,
        &layout.v,
        dst_cells,
        rows,
        bytemuck::cast_slice(&v_out[..m]),
    );
    Ok(())
}
