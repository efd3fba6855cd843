//! `kvc_kvq_cells` (ABI 0.14): the protected cells of an engine's own kvq KV cache
//! (`kvc-kvq-cells`): an f16 sink, a recent window of kvq rows re-coded to each tensor's
//! bits as they leave it, and per-sequence K centers, each cell's format decided from its
//! position and sequence. The engine keeps its tensors (block rows, `kvc_kvq_block_*`) and
//! routes the cache writes and attention's reads through here; one object serves every
//! tensor of a cache (a layer's K and V are two tensors), so the per-cell bookkeeping is
//! held once.

use std::ffi::c_int;

use kvc_kvq_cells::{CellsConfig, KvqCells, TensorSpec};

use crate::boundary::{check_disjoint, in_ref, in_slice, out_ref, out_slice, status_boundary};
use crate::error::Error;
use crate::handle::{free_handle, handle_mut, handle_ref, store_handle};
use crate::status::KvcStatus;

/// The protected cells of one kvq cache: opaque; create with `kvc_kvq_cells_new`,
/// free with `kvc_kvq_cells_free`. Calls that take `const kvc_kvq_cells*`
/// (`kvc_kvq_cells_scores`, `kvc_kvq_cells_accumulate`, the queries) may run concurrently;
/// the others need the handle to themselves.
pub struct KvcKvqCells(KvqCells);

/// What a `kvc_kvq_cells` protects, the same for every tensor (see `kvc_kvq_cells_new`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvcKvqCellsConfig {
    /// Cells of each tensor, every stream's.
    pub n_cells: u32,
    /// Positions `< sink` of each sequence are held as f16 rows.
    pub sink: u32,
    /// A query reads the positions less than `window` before it from `window_bits` rows.
    pub window: u32,
    /// Bits of the window rows (2..=8; ignored when `window` is 0).
    pub window_bits: u32,
}

/// One tensor of the cache (a layer's K or V; see `kvc_kvq_cells_new`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvcKvqCellsTensor {
    /// Values per row: 64, 128 or 256.
    pub head_dim: u32,
    /// Rows per cell (KV heads).
    pub n_kv_head: u32,
    /// Bits of the tensor's block rows (2..=8).
    pub bits: u32,
    /// 1: code main rows relative to a per-sequence center (needs sink and window >= 1;
    /// for K); 0: as they are.
    pub center: u32,
}

/// `tensor` of `kvc_kvq_cells_bytes_held`: the bookkeeping every tensor shares.
pub const KVC_KVQ_CELLS_SHARED: u32 = u32::MAX;

fn bits8(what: &'static str, b: u32) -> Result<u8, Error> {
    u8::try_from(b).map_err(|_| Error::invalid(what, format!("{b} is not in 2..=8")))
}

/// Creates empty cells for `config` and the `n_tensors` tensors at `tensors` (tensor `t`
/// is named by its index in every later call) and stores the handle in `*out` (only on
/// `KVC_OK`). `KVC_INVALID_ARGUMENT` for no tensors or cells, bits outside 2..=8, no KV
/// heads, a center without a sink and a window; `KVC_UNSUPPORTED` for a head_dim other than
/// 64, 128 or 256.
///
/// Semantics (`docs/formats/kvq.md`, "Cells"): the query at position `q` reads a cell of
/// its sequence at position `p` from its f16 sink row if `p < sink`, from its window row if
/// `q - p < window`, else from the engine's tensor; a cell's main rows are coded from its
/// window rows (minus the center) when its sequence first writes a position `window` or more
/// after it. Batched and one-token writes read the same rows. Per ubatch:
/// `kvc_kvq_cells_begin_ubatch`, one `kvc_kvq_cells_write` per tensor, then reads.
///
/// # Safety
/// `config` readable; `tensors` readable for `n_tensors` entries; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_new(
    config: *const KvcKvqCellsConfig,
    tensors: *const KvcKvqCellsTensor,
    n_tensors: usize,
    out: *mut *mut KvcKvqCells,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_new", || {
        // SAFETY: caller contract.
        let c = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        let ts = unsafe { in_slice(tensors, n_tensors, "tensors") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let window_bits = if c.window == 0 {
            8
        } else {
            bits8("window_bits", c.window_bits)?
        };
        let specs = ts
            .iter()
            .map(|t| {
                Ok(TensorSpec {
                    head_dim: t.head_dim,
                    n_kv_head: t.n_kv_head,
                    bits: bits8("bits", t.bits)?,
                    center: match t.center {
                        0 => false,
                        1 => true,
                        v => return Err(Error::invalid("center", format!("{v} is not 0 or 1"))),
                    },
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let cells = KvqCells::new(
            CellsConfig {
                n_cells: c.n_cells,
                sink: c.sink,
                window: c.window,
                window_bits,
            },
            &specs,
        )
        .map_err(Error::from)?;
        // SAFETY: caller contract.
        unsafe { store_handle(out, KvcKvqCells(cells)) }
    })
}

/// Bytes of one cell of tensor `tensor` (`n_kv_head` block rows of its bits), written to
/// `*out`: the engine's tensor holds `n_cells` of them, cell `c` at `c * *out`.
///
/// # Safety
/// `cells` a live handle; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_main_cell_bytes(
    cells: *const KvcKvqCells,
    tensor: u32,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_main_cell_bytes", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        let v = h.0.main_cell_bytes(tensor)?;
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = v;
        Ok(())
    })
}

/// Bytes held beside the engine's tensors, written to `*out`: tensor `tensor`'s sink and
/// window rows (at their storage's capacity) and centers, or, for `KVC_KVQ_CELLS_SHARED`,
/// the bookkeeping every tensor shares (per cell, per sequence, the ubatch). The sum over
/// every tensor and the shared part is every byte the cells hold.
///
/// # Safety
/// `cells` a live handle; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_bytes_held(
    cells: *const KvcKvqCells,
    tensor: u32,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_bytes_held", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        let v = if tensor == KVC_KVQ_CELLS_SHARED {
            h.0.shared_bytes()
        } else {
            h.0.tensor_bytes(tensor)?
        };
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = v;
        Ok(())
    })
}

/// Bytes the cells hold beside the engine's tensors with `n_seqs` sequences whose sinks and
/// windows are full (every tensor's rows and centers), after ubatches of up to `n_ubatch`
/// tokens (the per-cell and per-token bookkeeping), written to `*out`: what an engine states
/// as its cache's size when it makes the cache (ABI 0.17). Not counted: a prefill's scratch
/// (this ubatch's window rows that leave the window within it), held from that ubatch until
/// the next one that needs none. Errors: `KVC_INVALID_ARGUMENT` when the size overflows.
///
/// # Safety
/// `cells` a live handle; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_capacity_bytes(
    cells: *const KvcKvqCells,
    n_seqs: u32,
    n_ubatch: u32,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_capacity_bytes", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        let v = h.0.capacity_bytes(n_seqs, n_ubatch)?;
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = v;
        Ok(())
    })
}

/// `kvc_kvq_cells_scores` for the queries of `n_tokens` ubatch tokens at once (a prefill's
/// block of query positions): `q_rot` holds token `tokens[k]`'s `n_queries` rotated queries
/// in turn (`n_tokens * n_queries * head_dim` floats), and its scores go to `scores[(k *
/// n_queries + j) * n + i]` (`scores_len` = `n_tokens * n_queries * n`). At most 64
/// queries in all. Each token's scores are what `kvc_kvq_cells_scores` gives it, bit for
/// bit; a tile of main rows only is decoded once for every query. No allocation. (ABI 0.19)
///
/// # Safety
/// `cells` a live handle; `main` readable for `main_len` bytes, `tokens` for `n_tokens`
/// values, `q_rot` for `n_tokens * n_queries * head_dim` floats; `scores` writable for
/// `scores_len` floats, overlapping nothing else.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_cells_scores_tokens(
    cells: *const KvcKvqCells,
    tensor: u32,
    main: *const u8,
    main_len: usize,
    kv_head: u32,
    cell0: u32,
    n: usize,
    tokens: *const u32,
    n_tokens: usize,
    q_rot: *const f32,
    n_queries: usize,
    scores: *mut f32,
    scores_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_scores_tokens", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        let d = h.0.head_dim(tensor)?;
        let nq = n_tokens
            .checked_mul(n_queries)
            .and_then(|v| v.checked_mul(d))
            .ok_or_else(|| Error::invalid("n_queries", "overflows"))?;
        check_disjoint(
            q_rot.cast(),
            nq.saturating_mul(4),
            scores.cast_const().cast(),
            scores_len.saturating_mul(4),
            "scores",
        )?;
        check_disjoint(
            main,
            main_len,
            scores.cast_const().cast(),
            scores_len.saturating_mul(4),
            "scores",
        )?;
        check_disjoint(
            tokens.cast(),
            n_tokens.saturating_mul(4),
            scores.cast_const().cast(),
            scores_len.saturating_mul(4),
            "scores",
        )?;
        // SAFETY: caller contract.
        let m = unsafe { in_slice(main, main_len, "main") }?;
        // SAFETY: caller contract.
        let tk = unsafe { in_slice(tokens, n_tokens, "tokens") }?;
        // SAFETY: caller contract.
        let q = unsafe { in_slice(q_rot, nq, "q_rot") }?;
        // SAFETY: caller contract; disjoint (checked).
        let s = unsafe { out_slice(scores, scores_len, "scores") }?;
        h.0.scores_tokens(tensor, m, kv_head, cell0, n, tk, q, s)
            .map_err(Error::from)
    })
}

/// `kvc_kvq_cells_accumulate` for the queries of `n_tokens` ubatch tokens at once: `w`
/// holds token `tokens[k]`'s `n_queries * n` weights in turn (`w_len` in all), `acc` its
/// `n_queries x head_dim` sums in turn (`n_tokens * n_queries * head_dim` floats). At most
/// 64 queries in all. Each token's sums are what `kvc_kvq_cells_accumulate` gives it, bit
/// for bit. No allocation. (ABI 0.19)
///
/// # Safety
/// `cells` a live handle; `main` readable for `main_len` bytes, `tokens` for `n_tokens`
/// values, `w` for `w_len` floats; `acc` readable and writable for `n_tokens * n_queries *
/// head_dim` floats, overlapping nothing else.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_cells_accumulate_tokens(
    cells: *const KvcKvqCells,
    tensor: u32,
    main: *const u8,
    main_len: usize,
    kv_head: u32,
    cell0: u32,
    n: usize,
    tokens: *const u32,
    n_tokens: usize,
    w: *const f32,
    w_len: usize,
    n_queries: usize,
    acc: *mut f32,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_accumulate_tokens", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        let d = h.0.head_dim(tensor)?;
        let na = n_tokens
            .checked_mul(n_queries)
            .and_then(|v| v.checked_mul(d))
            .ok_or_else(|| Error::invalid("n_queries", "overflows"))?;
        check_disjoint(
            w.cast(),
            w_len.saturating_mul(4),
            acc.cast_const().cast(),
            na.saturating_mul(4),
            "acc",
        )?;
        check_disjoint(
            main,
            main_len,
            acc.cast_const().cast(),
            na.saturating_mul(4),
            "acc",
        )?;
        check_disjoint(
            tokens.cast(),
            n_tokens.saturating_mul(4),
            acc.cast_const().cast(),
            na.saturating_mul(4),
            "acc",
        )?;
        // SAFETY: caller contract.
        let m = unsafe { in_slice(main, main_len, "main") }?;
        // SAFETY: caller contract.
        let tk = unsafe { in_slice(tokens, n_tokens, "tokens") }?;
        // SAFETY: caller contract.
        let wv = unsafe { in_slice(w, w_len, "w") }?;
        // SAFETY: caller contract; disjoint (checked).
        let a = unsafe { out_slice(acc, na, "acc") }?;
        h.0.accumulate_tokens(tensor, m, kv_head, cell0, n, tk, wv, a)
            .map_err(Error::from)
    })
}

/// Keeps each window row `n` positions longer than the window reads it (default 0), so
/// that a sequence taken back by up to `n + 1` positions (`kvc_kvq_cells_truncate`) still
/// holds every window row a fresh sequence would. Costs `n` window rows per sequence and
/// tensor, which `kvc_kvq_cells_capacity_bytes` counts; reads are the same for every `n`.
/// Takes effect from the next ubatch. Errors: `KVC_INVALID_ARGUMENT` when `n >= 2^31`.
/// (ABI 0.18)
///
/// # Safety
/// `cells` a live handle used by no other call.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_set_rollback(cells: *mut KvcKvqCells, n: u32) -> KvcStatus {
    status_boundary("kvc_kvq_cells_set_rollback", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        h.0.set_rollback(n).map_err(Error::from)
    })
}

/// Takes sequence `seq` (-1: every sequence) back to its positions before `p0`, before the
/// engine frees its cells at `p0` and after (`kvc_kvq_cells_release`; an engine's `seq_rm`
/// of a sequence's last positions, a chat server reusing a cached prompt). `*exact` is 1
/// when the cells that stay now read exactly as those of a sequence that processed only
/// them (main rows it would not have coded are uncoded, centers it would not have fixed are
/// forgotten), or 0 when nothing changed because a window row they need was dropped: the
/// engine then keeps the positions or processes the sequence again. Exact when the
/// positions taken back are at most the rollback (`kvc_kvq_cells_set_rollback`) plus one
/// (plus the last ubatch, which is undone when taken back whole), when `p0` is at most the
/// sink, and always without a window. A last ubatch taken back in part is committed, and
/// refused (0) when it is incomplete. (ABI 0.18)
///
/// # Safety
/// `cells` a live handle used by no other call; `exact` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_truncate(
    cells: *mut KvcKvqCells,
    seq: i32,
    p0: i32,
    exact: *mut c_int,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_truncate", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(exact, "exact") }?;
        *out = c_int::from(h.0.truncate(seq, p0));
        Ok(())
    })
}

/// Whether `kvc_kvq_cells_truncate(cells, seq, p0)` would be exact, in `*exact` (1 or 0);
/// changes nothing. (ABI 0.18)
///
/// # Safety
/// `cells` a live handle; `exact` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_can_truncate(
    cells: *const KvcKvqCells,
    seq: i32,
    p0: i32,
    exact: *mut c_int,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_can_truncate", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(exact, "exact") }?;
        *out = c_int::from(h.0.can_truncate(seq, p0));
        Ok(())
    })
}

/// Starts a ubatch of `n` tokens: token `i` is at position `pos[i]` (>= 0) of sequence
/// `seq[i]` (>= 0) and goes to cell `cell_idx[i]`, in the order of every tensor's rows
/// (reads name a query by this index). Decides what the ubatch's writes do. Errors
/// (nothing changes): a negative position or sequence, a cell out of range or given twice,
/// `KVC_INVALID_STATE` when a tensor missed the previous ubatch's write. Copied.
///
/// # Safety
/// `cells` a live handle used by no other call; `pos`, `seq` and `cell_idx` readable for
/// `n` values.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_begin_ubatch(
    cells: *mut KvcKvqCells,
    pos: *const i32,
    seq: *const i32,
    cell_idx: *const i64,
    n: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_begin_ubatch", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        // SAFETY: caller contract.
        let p = unsafe { in_slice(pos, n, "pos") }?;
        // SAFETY: caller contract.
        let s = unsafe { in_slice(seq, n, "seq") }?;
        // SAFETY: caller contract.
        let c = unsafe { in_slice(cell_idx, n, "cell_idx") }?;
        h.0.begin_ubatch(p, s, c).map_err(Error::from)
    })
}

/// Writes tensor `tensor`'s rows of the current ubatch: `rows` (`n_values` = `n_rows *
/// n_kv_head * head_dim` floats), row `i` for cell `cell_idx[i]` (`n_rows` indices, which
/// must repeat `kvc_kvq_cells_begin_ubatch`'s). Sink positions keep an f16 row and others a
/// window row; due centers are fixed and due main rows coded into `main` (the engine's
/// whole tensor, `main_len` bytes, at least `n_cells * main_cell_bytes`). A row with a
/// non-finite value is stored poisoned (it reads NaN). `KVC_INVALID_STATE` for a tensor
/// written twice in one ubatch or cells other than the ubatch's; on error nothing is
/// written.
///
/// # Safety
/// `cells` a live handle used by no other call; `rows` readable for `n_values` floats,
/// `cell_idx` for `n_rows` values; `main` writable for `main_len` bytes, overlapping
/// neither.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_cells_write(
    cells: *mut KvcKvqCells,
    tensor: u32,
    rows: *const f32,
    n_values: usize,
    cell_idx: *const i64,
    n_rows: usize,
    main: *mut u8,
    main_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_write", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        check_disjoint(
            rows.cast(),
            n_values.saturating_mul(4),
            main.cast_const(),
            main_len,
            "main",
        )?;
        check_disjoint(
            cell_idx.cast(),
            n_rows.saturating_mul(8),
            main.cast_const(),
            main_len,
            "main",
        )?;
        // SAFETY: caller contract.
        let r = unsafe { in_slice(rows, n_values, "rows") }?;
        // SAFETY: caller contract.
        let c = unsafe { in_slice(cell_idx, n_rows, "cell_idx") }?;
        // SAFETY: caller contract; disjoint from the inputs (checked).
        let m = unsafe { out_slice(main, main_len, "main") }?;
        h.0.write(tensor, r, c, m).map_err(Error::from)
    })
}

/// Raw dot products (no scale), in tensor `tensor`, of `n_queries` rotated queries (`q_rot`: `n_queries x
/// head_dim`, rotated with `kvc_kvq_block_rotate`; the query heads of KV head `kv_head` at
/// ubatch token `token`) with cells `cell0 .. cell0 + n`, each read from its sink, window
/// or main row as the query's position says (a main row coded centered gets `q . c`
/// added). Query `j`'s score of cell `cell0 + i` goes to `scores[j * n + i]`
/// (`scores_len` = `n_queries * n`). `main` is the engine's whole tensor. A cell the
/// engine masks may score anything. At most 64 queries. No allocation.
///
/// # Safety
/// `cells` a live handle; `main` readable for `main_len` bytes, `q_rot` for `n_queries *
/// head_dim` floats; `scores` writable for `scores_len` floats, overlapping nothing else.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_cells_scores(
    cells: *const KvcKvqCells,
    tensor: u32,
    main: *const u8,
    main_len: usize,
    kv_head: u32,
    cell0: u32,
    n: usize,
    token: u32,
    q_rot: *const f32,
    n_queries: usize,
    scores: *mut f32,
    scores_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_scores", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        let d = h.0.head_dim(tensor)?;
        let nq = n_queries
            .checked_mul(d)
            .ok_or_else(|| Error::invalid("n_queries", "overflows"))?;
        check_disjoint(
            q_rot.cast(),
            nq.saturating_mul(4),
            scores.cast_const().cast(),
            scores_len.saturating_mul(4),
            "scores",
        )?;
        check_disjoint(
            main,
            main_len,
            scores.cast_const().cast(),
            scores_len.saturating_mul(4),
            "scores",
        )?;
        // SAFETY: caller contract.
        let m = unsafe { in_slice(main, main_len, "main") }?;
        // SAFETY: caller contract.
        let q = unsafe { in_slice(q_rot, nq, "q_rot") }?;
        // SAFETY: caller contract; disjoint (checked).
        let s = unsafe { out_slice(scores, scores_len, "scores") }?;
        h.0.scores(tensor, m, kv_head, cell0, n, token, q, s)
            .map_err(Error::from)
    })
}

/// `acc[j] += sum_i w[j * n + i] * row(cell0 + i)` over tensor `tensor`'s cells, in the
/// rotated basis, for `n_queries` queries (`w`: `n_queries * n` weights, `w_len`; `acc`: `n_queries x head_dim`), each
/// cell read as `kvc_kvq_cells_scores` reads it for the query at ubatch token `token`; a
/// weight of 0 skips the cell. Un-rotate each sum once (`kvc_kvq_block_unrotate`). No
/// allocation.
///
/// # Safety
/// `cells` a live handle; `main` readable for `main_len` bytes, `w` for `w_len` floats;
/// `acc` readable and writable for `n_queries * head_dim` floats, overlapping nothing
/// else.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kvc_kvq_cells_accumulate(
    cells: *const KvcKvqCells,
    tensor: u32,
    main: *const u8,
    main_len: usize,
    kv_head: u32,
    cell0: u32,
    n: usize,
    token: u32,
    w: *const f32,
    w_len: usize,
    n_queries: usize,
    acc: *mut f32,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_accumulate", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        let d = h.0.head_dim(tensor)?;
        let na = n_queries
            .checked_mul(d)
            .ok_or_else(|| Error::invalid("n_queries", "overflows"))?;
        check_disjoint(
            w.cast(),
            w_len.saturating_mul(4),
            acc.cast_const().cast(),
            na.saturating_mul(4),
            "acc",
        )?;
        check_disjoint(
            main,
            main_len,
            acc.cast_const().cast(),
            na.saturating_mul(4),
            "acc",
        )?;
        // SAFETY: caller contract.
        let m = unsafe { in_slice(main, main_len, "main") }?;
        // SAFETY: caller contract.
        let wv = unsafe { in_slice(w, w_len, "w") }?;
        // SAFETY: caller contract; disjoint (checked).
        let a = unsafe { out_slice(acc, na, "acc") }?;
        h.0.accumulate(tensor, m, kv_head, cell0, n, token, wv, a)
            .map_err(Error::from)
    })
}

/// Forgets cell `cell` in every tensor (the engine freed it): its sink or window rows are
/// released. Between ubatches.
///
/// # Safety
/// `cells` a live handle used by no other call.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_release(cells: *mut KvcKvqCells, cell: u32) -> KvcStatus {
    status_boundary("kvc_kvq_cells_release", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        h.0.release(cell).map_err(Error::from)
    })
}

/// Drops the last ubatch, complete or not (the engine's compute for it was aborted or
/// failed, or it took the ubatch's tokens back): every cell the ubatch wrote is released
/// and every other cell reads as before its `kvc_kvq_cells_begin_ubatch` (main rows it
/// coded, window rows it dropped and centers it fixed are undone), so the next ubatch
/// starts clean. `*dropped` (when not NULL) is 1, or 0 when there was none to drop: after
/// another call changed the cells (a later begin_ubatch, clear, copy, load, a shift) the
/// ubatch is committed. Releasing every cell the ubatch wrote for a sequence
/// (`kvc_kvq_cells_release`, an engine's own rollback) undoes the ubatch for that sequence
/// in the same way. (ABI 0.16)
///
/// # Safety
/// `cells` a live handle used by no other call; `dropped` NULL or writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_drop_ubatch(
    cells: *mut KvcKvqCells,
    dropped: *mut c_int,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_drop_ubatch", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        let out = if dropped.is_null() {
            None
        } else {
            // SAFETY: caller contract.
            Some(unsafe { out_ref(dropped, "dropped") }?)
        };
        let d = h.0.drop_ubatch();
        if let Some(o) = out {
            *o = c_int::from(d);
        }
        Ok(())
    })
}

/// Forgets every cell, sequence and center (the engine cleared its cache).
///
/// # Safety
/// `cells` a live handle used by no other call.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_clear(cells: *mut KvcKvqCells) -> KvcStatus {
    status_boundary("kvc_kvq_cells_clear", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        h.0.clear();
        Ok(())
    })
}

/// Copies cells `src0 .. src0 + n` onto `dst0 .. dst0 + n` in every tensor (after the
/// engine copied those cells' main rows, one stream onto another), the copies belonging to
/// sequence `dst_seq`, which takes the writers' centers. Between ubatches. Ranges out of
/// bounds or overlapping are `KVC_INVALID_ARGUMENT`.
///
/// # Safety
/// `cells` a live handle used by no other call.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_copy(
    cells: *mut KvcKvqCells,
    src0: u32,
    dst0: u32,
    n: u32,
    dst_seq: i32,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_copy", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        h.0.copy_cells(src0, dst0, n, dst_seq).map_err(Error::from)
    })
}

/// Frees cells made by `kvc_kvq_cells_new`. NULL is a no-op.
///
/// # Safety
/// `cells` NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kvc_kvq_cells_free(cells: *mut KvcKvqCells) {
    // SAFETY: caller contract.
    unsafe { free_handle(cells) }
}

/// Saves what `cells` holds beside the engine's tensors for the `n` cells at `cell_ids`
/// (in the engine's order) of sequence `seq` (-1: every sequence): each cell's position,
/// writer and format, its sink or window rows in every tensor, and the writers' centers,
/// in the versioned, checksummed `KVCQCELS` format (`docs/formats/kvq.md`, "Saved cells").
/// The engine saves the cells' positions and main rows itself.
///
/// Size query: `dst == NULL && dst_capacity == 0` stores the exact size in `*dst_len`.
/// Too small a `dst_capacity` is `KVC_BUFFER_TOO_SMALL` with the size in `*dst_len` and
/// `dst` untouched; on `KVC_OK`, `*dst_len` is the length written. Between ubatches
/// (`KVC_INVALID_STATE` otherwise); a cell out of range, given twice or never written is
/// `KVC_INVALID_ARGUMENT`.
///
/// # Safety
/// `cells` a live handle; `cell_ids` readable for `n` (or NULL with `n == 0`); `dst`
/// writable for `dst_capacity`; `dst_len` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_save(
    cells: *const KvcKvqCells,
    cell_ids: *const u32,
    n: usize,
    seq: i32,
    dst: *mut u8,
    dst_capacity: usize,
    dst_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_save", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        // SAFETY: caller contract.
        let dst_len = unsafe { out_ref(dst_len, "dst_len") }?;
        // SAFETY: caller contract.
        let ids = unsafe { in_slice(cell_ids, n, "cell_ids") }?;
        let bytes = h.0.save(ids, seq)?;
        if dst.is_null() && dst_capacity == 0 {
            *dst_len = bytes.len();
            return Ok(());
        }
        if dst_capacity < bytes.len() {
            *dst_len = bytes.len();
            return Err(Error::BufferTooSmall {
                argument: "dst",
                needed: bytes.len(),
                capacity: dst_capacity,
            });
        }
        // SAFETY: caller contract; NULL is checked.
        let out = unsafe { out_slice(dst, bytes.len(), "dst") }?;
        out.copy_from_slice(&bytes);
        *dst_len = bytes.len();
        Ok(())
    })
}

/// Loads saved cells (`kvc_kvq_cells_save`, `src_len` bytes at `src`) into the `n` cells
/// at `cell_ids`, the engine's cells for the saved ones in the saved order, whose positions
/// it restored as `pos`. With `dest_seq >= 0` the saved sequence's cells become
/// `dest_seq`'s (which takes its centers; cells other sequences wrote keep theirs); with
/// -1 every writer keeps its saved id (restoring a whole cache after `kvc_kvq_cells_clear`).
/// The engine loads the main rows itself. Between ubatches (`KVC_INVALID_STATE`
/// otherwise). Nothing changes on an error: `KVC_CORRUPT_DATA` for bytes that are not
/// saved cells (magic, version, checksum, length, a field), `KVC_INVALID_ARGUMENT` for
/// cells saved with another configuration or whose count or positions are not the
/// engine's.
///
/// # Safety
/// `cells` a live handle used by no other call; `src` readable for `src_len`; `cell_ids`
/// and `pos` readable for `n` (or NULL with `n == 0`).
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_load(
    cells: *mut KvcKvqCells,
    src: *const u8,
    src_len: usize,
    cell_ids: *const u32,
    pos: *const i32,
    n: usize,
    dest_seq: i32,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_load", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        // SAFETY: caller contract.
        let bytes = unsafe { in_slice(src, src_len, "src") }?;
        // SAFETY: caller contract.
        let ids = unsafe { in_slice(cell_ids, n, "cell_ids") }?;
        // SAFETY: caller contract.
        let p = unsafe { in_slice(pos, n, "pos") }?;
        h.0.load(bytes, ids, p, dest_seq).map_err(Error::from)
    })
}

/// The values the `n` cells at `cell_ids` of tensor `tensor` hold now, `n x n_kv_head x
/// head_dim` f32 into `out` (`out_len` values): a sink cell's f16 row, a window cell's window
/// row, else its main row in `main` (the engine's whole tensor, `main_len` bytes) plus its
/// writer's center. With `kvc_kvq_cells_set_rows` an engine transforms stored rows in
/// place: its RoPE shift of K after moving positions (`kvc_kvq_cells_set_positions`).
/// Between ubatches (`KVC_INVALID_STATE` otherwise); a cell out of range, unwritten or
/// given twice, or lengths that do not fit, are `KVC_INVALID_ARGUMENT`, `out` untouched.
///
/// # Safety
/// `cells` a live handle; `main` readable for `main_len`; `cell_ids` readable for `n`;
/// `out` writable for `out_len` and not overlapping `main`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_get_rows(
    cells: *const KvcKvqCells,
    tensor: u32,
    main: *const u8,
    main_len: usize,
    cell_ids: *const u32,
    n: usize,
    out: *mut f32,
    out_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_get_rows", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_ref(cells, "cells") }?;
        check_disjoint(
            main,
            main_len,
            out.cast_const().cast(),
            out_len.saturating_mul(4),
            "out",
        )?;
        // SAFETY: caller contract.
        let m = unsafe { in_slice(main, main_len, "main") }?;
        // SAFETY: caller contract.
        let ids = unsafe { in_slice(cell_ids, n, "cell_ids") }?;
        let mut tmp = vec![0f32; out_len];
        h.0.cell_rows(tensor, m, ids, &mut tmp)?;
        // SAFETY: caller contract; disjoint (checked).
        let o = unsafe { out_slice(out, out_len, "out") }?;
        o.copy_from_slice(&tmp);
        Ok(())
    })
}

/// Stores new values (`rows`: `n x n_kv_head x head_dim` f32, `rows_len` values) for the
/// `n` cells at `cell_ids` of tensor `tensor`, each in the format it has: its f16 sink row;
/// its window row (and its main row in `main` again, coded from it, once it has one); or its
/// main row in `main` (relative to its writer's center when it was coded so). Formats,
/// positions and centers stay. Between ubatches; errors as `kvc_kvq_cells_get_rows`, with
/// nothing stored.
///
/// # Safety
/// `cells` a live handle used by no other call; `main` writable for `main_len`; `cell_ids`
/// readable for `n`; `rows` readable for `rows_len` and not overlapping `main`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_set_rows(
    cells: *mut KvcKvqCells,
    tensor: u32,
    main: *mut u8,
    main_len: usize,
    cell_ids: *const u32,
    n: usize,
    rows: *const f32,
    rows_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_set_rows", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        check_disjoint(
            rows.cast(),
            rows_len.saturating_mul(4),
            main.cast_const(),
            main_len,
            "main",
        )?;
        // SAFETY: caller contract.
        let r = unsafe { in_slice(rows, rows_len, "rows") }?;
        // SAFETY: caller contract.
        let ids = unsafe { in_slice(cell_ids, n, "cell_ids") }?;
        // SAFETY: caller contract; disjoint (checked).
        let m = unsafe { out_slice(main, main_len, "main") }?;
        h.0.set_cell_rows(tensor, m, ids, r).map_err(Error::from)
    })
}

/// Moves the `n` cells at `cell_ids` to positions `pos` in every tensor (the engine shifted
/// them: llama.cpp's `seq_add` / `seq_div`); later reads and re-coding follow the new
/// positions, and each cell keeps its format. Between ubatches. A cell out of range or
/// unwritten or a negative position is `KVC_INVALID_ARGUMENT`, nothing moved.
///
/// # Safety
/// `cells` a live handle used by no other call; `cell_ids` and `pos` readable for `n`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_cells_set_positions(
    cells: *mut KvcKvqCells,
    cell_ids: *const u32,
    pos: *const i32,
    n: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_cells_set_positions", || {
        // SAFETY: caller contract.
        let h = unsafe { handle_mut(cells, "cells") }?;
        // SAFETY: caller contract.
        let ids = unsafe { in_slice(cell_ids, n, "cell_ids") }?;
        // SAFETY: caller contract.
        let p = unsafe { in_slice(pos, n, "pos") }?;
        h.0.set_positions(ids, p).map_err(Error::from)
    })
}
