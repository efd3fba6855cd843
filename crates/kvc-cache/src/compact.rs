//! In-place token moves, compaction by reserve plans, and zeroing, for every layout.

use crate::cells::CellTable;
use crate::error::{Error, Result};
use crate::layout::{Addressing, LayerMut, TensorLayout};
use crate::plan::{IndexMap, ReservePlan};

fn check_range(start: usize, end: usize, limit: usize) -> Result<()> {
    if start > end || end > limit {
        return Err(Error::InvalidRange { start, end, limit });
    }
    Ok(())
}

/// Moves tokens `[src, src + n)` to `[dst, dst + n)` in `buf`, as `memmove` would
/// (overlap allowed, in either direction). Only those tokens' elements are written.
pub fn move_tokens(
    buf: &mut [u8],
    layout: &TensorLayout,
    src: usize,
    dst: usize,
    n: usize,
) -> Result<()> {
    layout.check_buffer("tensor", buf.len())?;
    let cap = layout.capacity();
    check_range(
        src,
        src.checked_add(n)
            .ok_or(Error::SizeOverflow { what: "src + n" })?,
        cap,
    )?;
    check_range(
        dst,
        dst.checked_add(n)
            .ok_or(Error::SizeOverflow { what: "dst + n" })?,
        cap,
    )?;
    if n == 0 || src == dst {
        return Ok(());
    }
    let es = layout.dtype().size();
    match layout.addressing() {
        Addressing::CellRows => {
            let row = layout.channels() * es;
            buf.copy_within(src * row..(src + n) * row, dst * row);
        }
        Addressing::HeadMajor => {
            let d = layout.head_dim() * es;
            let head = cap * d;
            for h in 0..layout.n_heads() {
                let base = h * head;
                buf.copy_within(base + src * d..base + (src + n) * d, base + dst * d);
            }
        }
        Addressing::CellColumns => {
            for c in 0..layout.channels() {
                let base = c * cap * es;
                buf.copy_within(base + src * es..base + (src + n) * es, base + dst * es);
            }
        }
        Addressing::MnnKey { .. } | Addressing::MnnValue { .. } => {
            // Token by token, like MNN's moveKV; direction chosen so that no source token
            // is overwritten before it is read.
            let runs = layout.channel_runs();
            let mut one = |i: usize| {
                let s = layout.token_offset(src + i);
                let d = layout.token_offset(dst + i);
                for &(_, coff, len) in &runs {
                    let a = (s + coff) * es;
                    buf.copy_within(a..a + len * es, (d + coff) * es);
                }
            };
            if dst < src {
                (0..n).for_each(&mut one);
            } else {
                (0..n).rev().for_each(&mut one);
            }
        }
    }
    Ok(())
}

/// Compacts one tensor by `plan`, in place; returns the new length.
pub fn compact_tensor(buf: &mut [u8], layout: &TensorLayout, plan: &ReservePlan) -> Result<usize> {
    layout.check_buffer("tensor", buf.len())?;
    if plan.len() > layout.capacity() {
        return Err(Error::InvalidRange {
            start: 0,
            end: plan.len(),
            limit: layout.capacity(),
        });
    }
    for (src, dst, n) in plan.moves() {
        move_tokens(buf, layout, src, dst, n)?;
    }
    Ok(plan.kept())
}

/// Compacts a layer's K and V by `plan`; returns the new length.
pub fn compact_layer(layer: &mut LayerMut<'_>, plan: &ReservePlan) -> Result<usize> {
    let layout = *layer.layout();
    let (k, v) = layer.kv_mut();
    // Validate both before moving either, so an error leaves the layer untouched.
    if plan.len() > layout.capacity() {
        return Err(Error::InvalidRange {
            start: 0,
            end: plan.len(),
            limit: layout.capacity(),
        });
    }
    compact_tensor(k, &layout.k, plan)?;
    compact_tensor(v, &layout.v, plan)
}

/// Per-layer compaction (MNN: each layer its own plan and length); returns the new
/// lengths. All plans are validated against their layer before any byte moves.
pub fn compact_layers(layers: &mut [LayerMut<'_>], plans: &[ReservePlan]) -> Result<Vec<usize>> {
    if layers.len() != plans.len() {
        return Err(Error::LayoutMismatch {
            what: "plans per layer",
            expected: layers.len(),
            found: plans.len(),
        });
    }
    for (l, p) in layers.iter().zip(plans) {
        if p.len() > l.layout().capacity() {
            return Err(Error::InvalidRange {
                start: 0,
                end: p.len(),
                limit: l.layout().capacity(),
            });
        }
    }
    layers
        .iter_mut()
        .zip(plans)
        .map(|(l, p)| compact_layer(l, p))
        .collect()
}

/// Compaction of all layers with shared cells (llama.cpp): one plan moves the same
/// tokens in every layer and, if given, in the cell table. Returns the old -> new map.
pub fn compact_shared(
    layers: &mut [LayerMut<'_>],
    plan: &ReservePlan,
    cells: Option<&mut CellTable>,
) -> Result<IndexMap> {
    for l in layers.iter() {
        if plan.len() > l.layout().capacity() {
            return Err(Error::InvalidRange {
                start: 0,
                end: plan.len(),
                limit: l.layout().capacity(),
            });
        }
    }
    if let Some(c) = &cells {
        if plan.len() > c.len() {
            return Err(Error::InvalidRange {
                start: 0,
                end: plan.len(),
                limit: c.len(),
            });
        }
    }
    for l in layers.iter_mut() {
        compact_layer(l, plan)?;
    }
    if let Some(c) = cells {
        c.compact(plan)?;
    }
    Ok(plan.index_map())
}

/// Element spans `(first element, count)` covering tokens `[start, end)`, sorted and
/// merged.
pub fn token_spans(layout: &TensorLayout, start: usize, end: usize) -> Result<Vec<(usize, usize)>> {
    check_range(start, end, layout.capacity())?;
    let n = end - start;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut spans = match layout.addressing() {
        Addressing::CellRows => vec![(start * layout.channels(), n * layout.channels())],
        Addressing::HeadMajor => (0..layout.n_heads())
            .map(|h| (layout.offset(start, h, 0), n * layout.head_dim()))
            .collect(),
        Addressing::CellColumns => (0..layout.channels())
            .map(|c| (c * layout.capacity() + start, n))
            .collect(),
        Addressing::MnnKey { .. } | Addressing::MnnValue { .. } => {
            let runs = layout.channel_runs();
            let mut v = Vec::with_capacity(n * runs.len());
            for t in start..end {
                let to = layout.token_offset(t);
                v.extend(runs.iter().map(|&(_, c, len)| (to + c, len)));
            }
            v
        }
    };
    spans.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (o, l) in spans {
        match merged.last_mut() {
            Some((mo, ml)) if *mo + *ml == o => *ml += l,
            _ => merged.push((o, l)),
        }
    }
    Ok(merged)
}

/// Zeroes tokens `[start, end)` of one tensor.
pub fn zero_tokens(buf: &mut [u8], layout: &TensorLayout, start: usize, end: usize) -> Result<()> {
    layout.check_buffer("tensor", buf.len())?;
    let es = layout.dtype().size();
    for (o, l) in token_spans(layout, start, end)? {
        buf[o * es..(o + l) * es].fill(0);
    }
    Ok(())
}

/// Zeroes tokens `[start, end)` of a layer's K and V.
pub fn zero_layer_tokens(layer: &mut LayerMut<'_>, start: usize, end: usize) -> Result<()> {
    let layout = *layer.layout();
    check_range(start, end, layout.capacity())?;
    let (k, v) = layer.kv_mut();
    zero_tokens(k, &layout.k, start, end)?;
    zero_tokens(v, &layout.v, start, end)
}
