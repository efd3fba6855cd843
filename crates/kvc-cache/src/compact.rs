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
            // Token by token, like MNN's moveKV, except that runs of whole packed units
            // move with one memmove each (`mnn_chunk`); direction chosen so that no source
            // token is overwritten before it is read.
            let runs = layout.channel_runs();
            let one = |buf: &mut [u8], i: usize| {
                let s = layout.token_offset(src + i);
                let d = layout.token_offset(dst + i);
                for &(_, coff, len) in &runs {
                    let a = (s + coff) * es;
                    buf.copy_within(a..a + len * es, (d + coff) * es);
                }
            };
            if dst < src {
                let mut i = 0;
                while i < n {
                    i += mnn_chunk(buf, layout, src + i, dst + i, n - i).unwrap_or_else(|| {
                        one(buf, i);
                        1
                    });
                }
            } else {
                (0..n).rev().for_each(|i| one(buf, i));
            }
        }
    }
    Ok(())
}

/// The MNN fast path of a forward move (`dst < src`): if tokens `src` and `dst` both start
/// a packed unit (`hP` tokens of a key block, `lP` tokens of a value block) that holds no
/// padding, moves as many whole units as `n` allows (and, for values, as fit in the current
/// flash-attention block of both) with one `memmove` per head (per head and `hP` dims for
/// values), and returns how many tokens moved; `None` when the token must move alone.
///
/// The moved regions hold exactly the moved tokens' elements (whole units, no padding), so
/// the result equals moving those tokens one by one in ascending order, which is how the
/// caller uses it.
fn mnn_chunk(
    buf: &mut [u8],
    layout: &TensorLayout,
    src: usize,
    dst: usize,
    n: usize,
) -> Option<usize> {
    let (es, hd) = (layout.dtype().size(), layout.head_dim());
    let head_bytes = layout.mnn_head_bytes();
    match layout.addressing() {
        Addressing::MnnKey { hp, lp } => {
            if hd % lp != 0 || !src.is_multiple_of(hp) || !dst.is_multiple_of(hp) || n < hp {
                return None;
            }
            let m = n / hp * hp;
            let (s, d) = (layout.token_offset(src) * es, layout.token_offset(dst) * es);
            for h in 0..layout.n_heads() {
                let base = h * head_bytes;
                buf.copy_within(base + s..base + s + m * hd * es, base + d);
            }
            Some(m)
        }
        Addressing::MnnValue { hp, lp, block } => {
            let (sb, db) = (src % block, dst % block);
            if hd % hp != 0 || sb % lp != 0 || db % lp != 0 {
                return None;
            }
            let (s, d) = (layout.token_offset(src) * es, layout.token_offset(dst) * es);
            if sb == 0 && db == 0 && block % lp == 0 && n >= block {
                // Whole flash blocks: `block * head_dim` elements each, contiguous per head.
                let m = n / block * block;
                for h in 0..layout.n_heads() {
                    let base = h * head_bytes;
                    buf.copy_within(base + s..base + s + m * hd * es, base + d);
                }
                return Some(m);
            }
            let units = (n / lp).min((block - sb) / lp).min((block - db) / lp);
            if units == 0 {
                return None;
            }
            let stride1 = block.div_ceil(lp) * hp * lp * es;
            let len = units * hp * lp * es;
            for h in 0..layout.n_heads() {
                for j in 0..hd / hp {
                    let base = h * head_bytes + j * stride1;
                    buf.copy_within(base + s..base + s + len, base + d);
                }
            }
            Some(units * lp)
        }
        _ => None,
    }
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

/// Moves tokens `[src, src + n)` to `[dst, dst + n)` of head `head` only (its `head_dim`
/// channels), as `memmove` would.
pub fn move_head_tokens(
    buf: &mut [u8],
    layout: &TensorLayout,
    head: usize,
    src: usize,
    dst: usize,
    n: usize,
) -> Result<()> {
    layout.check_buffer("tensor", buf.len())?;
    if head >= layout.n_heads() {
        return Err(Error::InvalidRange {
            start: head,
            end: head.saturating_add(1),
            limit: layout.n_heads(),
        });
    }
    let cap = layout.capacity();
    for s in [src, dst] {
        check_range(
            s,
            s.checked_add(n)
                .ok_or(Error::SizeOverflow { what: "token + n" })?,
            cap,
        )?;
    }
    if n == 0 || src == dst {
        return Ok(());
    }
    let es = layout.dtype().size();
    let hd = layout.head_dim();
    match layout.addressing() {
        Addressing::HeadMajor => {
            let base = layout.offset(0, head, 0) * es;
            buf.copy_within(
                base + src * hd * es..base + (src + n) * hd * es,
                base + dst * hd * es,
            );
        }
        Addressing::CellColumns => {
            for c in head * hd..(head + 1) * hd {
                let base = c * cap * es;
                buf.copy_within(base + src * es..base + (src + n) * es, base + dst * es);
            }
        }
        Addressing::CellRows | Addressing::MnnKey { .. } | Addressing::MnnValue { .. } => {
            let runs: Vec<(usize, usize, usize)> = layout
                .channel_runs()
                .into_iter()
                .filter_map(|(c0, off, len)| {
                    // Clip each run to the head's channels.
                    let (lo, hi) = (c0.max(head * hd), (c0 + len).min((head + 1) * hd));
                    (lo < hi).then(|| (lo, off + (lo - c0), hi - lo))
                })
                .collect();
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

/// Compacts each head of one tensor by its own plan (kvc-h2o with one score per KV head:
/// [`ReservePlan::from_h2o_groups`]), in place; every plan must keep the same number of
/// tokens, which is returned. All plans are checked before any byte moves.
pub fn compact_heads(
    buf: &mut [u8],
    layout: &TensorLayout,
    plans: &[ReservePlan],
) -> Result<usize> {
    layout.check_buffer("tensor", buf.len())?;
    if plans.len() != layout.n_heads() {
        return Err(Error::LayoutMismatch {
            what: "plans per head",
            expected: layout.n_heads(),
            found: plans.len(),
        });
    }
    let kept = plans.first().map_or(0, ReservePlan::kept);
    for p in plans {
        if p.len() > layout.capacity() {
            return Err(Error::InvalidRange {
                start: 0,
                end: p.len(),
                limit: layout.capacity(),
            });
        }
        if p.kept() != kept {
            return Err(Error::LayoutMismatch {
                what: "tokens kept per head",
                expected: kept,
                found: p.kept(),
            });
        }
    }
    for (h, p) in plans.iter().enumerate() {
        for (src, dst, n) in p.moves() {
            move_head_tokens(buf, layout, h, src, dst, n)?;
        }
    }
    Ok(kept)
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
