//! kvq cells: the protected rows of an engine's kvq KV cache. The engine allocates its
//! cache tensors (per layer a K and a V tensor, one row of the layer's kvq block format per
//! cell and KV head, `docs/formats/kvq.md`) and calls this crate to write them and to read
//! them in attention. One [`KvqCells`] serves every tensor of one cache and owns what the
//! near-lossless kvq frontier adds to it:
//! - which row a query reads for a cell: its **sink** row (f16, positions `< sink` of a
//!   sequence), its **window** row (a `window_bits` kvq row, positions less than `window`
//!   before the query) or its **main** row (the engine's tensor), decided from the cell's
//!   position and sequence, never its index;
//! - **re-coding**: a cell's main rows are coded from its window rows (minus the center)
//!   when its sequence first writes a position `window` or more after it, and the window
//!   rows are dropped once no query of a write reads them;
//! - the **centers** (tensors made with `center`): one f16 vector per KV head, tensor and
//!   sequence, the mean of the window rows of positions `sink ..= sink + window`, fixed when
//!   the sequence codes its first main row; [`KvqCells::scores`] adds `q . c` back;
//! - the bytes: the per-cell bookkeeping (positions, sequences, formats) is kept once for
//!   the whole cache, the rows per tensor ([`KvqCells::bytes_held`]).
//!
//! Semantics, batch-independent by construction: the query at position `q` reads a cell at
//! position `p` of its sequence from the sink if `p < sink`, from the window row if `q - p <
//! window` (or if its main row is not coded yet), else from the main row. A batched
//! prefill (`n_ubatch` 512) and one token at a time read the same rows. A prefill's window
//! rows that leave the window within it live in one of two scratch buffers the whole cache
//! shares (even and odd tensors: a layer's K and V), freed by the first ubatch that needs
//! none; one-token decoding holds `window + 1` lasting rows per sequence and tensor. While a
//! prefill's ubatch runs, its scratch window rows are also kept decoded and each tensor's sink
//! rows rotated, once at the write, since every query of the ubatch reads them (same sums).
//!
//! A prefill's block of query positions can be read at once
//! ([`scores_tokens`](KvqCells::scores_tokens), [`accumulate_tokens`](KvqCells::accumulate_tokens)):
//! a tile of main rows only, which every position reads alike, is decoded once for all of
//! their queries; the sums are those of one call per position, bit for bit.
//!
//! Order of calls per ubatch: [`begin_ubatch`](KvqCells::begin_ubatch) (positions,
//! sequences, cells), then one [`write`](KvqCells::write) per tensor, each tensor read
//! before the next tensor of its side (`t + 2`) is written.
//!
//! A ubatch that did not complete (an engine's compute aborted or failed, some tensors
//! written and some not) is dropped: [`drop_ubatch`](KvqCells::drop_ubatch), or the engine's
//! own rollback, [`release`](KvqCells::release) of every cell the ubatch wrote for a
//! sequence, before any other call that changes the cells. Either undoes what the ubatch
//! did to the sequence's other cells (main rows coded, window rows dropped, centers fixed):
//! the cells then read as if the ubatch had never begun, and the next ubatch starts clean.
//!
//! Taking a sequence back (an engine's `seq_rm` of its last positions):
//! [`truncate`](KvqCells::truncate) before the engine frees the cells. It succeeds when the
//! cells that stay can read exactly as a fresh sequence's that processed only them, which
//! needs the window rows of the positions that re-enter the window: rows are kept
//! [`rollback`](KvqCells::set_rollback) positions after they leave it. Otherwise nothing
//! changes and the engine processes the positions again.
//!
//! Saving: [`save`](KvqCells::save) writes what the cells hold beside the engine's tensors
//! for some cells (formats, sink and window rows, centers) in the versioned `KVCQCELS`
//! format, [`load`](KvqCells::load) puts it back into the cells an engine restores them to.
//!
//! Shifting: an engine that moves positions (a context shift) reads the cells' values with
//! [`cell_rows`](KvqCells::cell_rows), applies its RoPE, stores them back in each cell's
//! format with [`set_cell_rows`](KvqCells::set_cell_rows) and gives the new positions to
//! [`set_positions`](KvqCells::set_positions); formats and centers stay.
//!
//! Not here: the packed row formats and kernels and plans (`kvc-kvq`), the engine's cell
//! allocation, masks and positions, its own saved state (positions, main rows), RoPE itself
//! (the engine's), and C (`kvc-capi`, `kvc_kvq_cells_*`).

mod error;
mod slab;
mod state;
mod tensor;
mod tokens;
mod truncate;

pub use error::{Error, ErrorKind, Result};
pub use state::{STATE_MAGIC, STATE_VERSION};

use slab::Slots;
use tensor::{StoredAs, TensorRows};

/// The most queries one [`KvqCells::scores`] or [`KvqCells::accumulate`] call takes (the
/// query heads of one KV head under grouped-query attention).
pub const MAX_QUERIES: usize = 64;
/// No slot / no sequence.
const NONE: u32 = u32::MAX;
/// The id of a writer no sequence id names any more (its cells keep their centers).
const DETACHED: i32 = -1;

/// What a [`KvqCells`] protects (the same for every tensor of the cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellsConfig {
    /// Cells of each tensor (every stream's).
    pub n_cells: u32,
    /// Positions `< sink` of each sequence are held as f16 rows.
    pub sink: u32,
    /// Positions less than `window` before a query are read from `window_bits` rows.
    pub window: u32,
    /// Bits of the window rows (2..=8; ignored when `window` is 0).
    pub window_bits: u8,
}

/// One tensor of the cache (a layer's K or V).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Values per row: 64, 128 or 256.
    pub head_dim: u32,
    /// Rows per cell (KV heads).
    pub n_kv_head: u32,
    /// Bits of the tensor's main rows (2..=8): the engine's kvq block type.
    pub bits: u8,
    /// Main rows coded relative to a per-sequence center (needs `sink >= 1` and
    /// `window >= 1`; for K).
    pub center: bool,
}

/// How one query reads one cell ([`KvqCells::read_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellRead {
    /// The main row (plus the writer's center in a tensor with centers, once coded).
    Main,
    /// The cell's window row.
    Window,
    /// The cell's f16 sink row.
    Sink,
}

const SINK: u8 = 1;
const WIN: u8 = 2;
const CODED: u8 = 4;
/// The window row is in the ubatch's scratch (slot = token index): its position leaves the
/// window within the ubatch, so the row is coded and dropped by the next ubatch.
const SCRATCH: u8 = 8;
/// Written by the last ubatch, which can still be undone (never saved: formats are derived).
const UBATCH: u8 = 16;

/// The bookkeeping of one cell, shared by every tensor.
#[derive(Clone, Copy, Debug)]
struct Cell {
    /// Position, or -1 when nothing was written.
    pos: i32,
    /// The sequence that wrote it (index into `seqs`), or NONE.
    seq: u32,
    /// Its sink or window slot (by `flags`), or NONE.
    slot: u32,
    flags: u8,
}

impl Cell {
    const EMPTY: Cell = Cell {
        pos: -1,
        seq: NONE,
        slot: NONE,
        flags: 0,
    };
}

/// One sequence's state.
#[derive(Clone, Debug)]
struct Seq {
    id: i32,
    /// Whether its centers are fixed (each centered tensor holds its own).
    centered: bool,
    /// Cells holding a window row written by this sequence.
    held: Vec<u32>,
}

/// What the current ubatch's writes do, decided by `begin_ubatch`.
#[derive(Debug, Default)]
struct Ubatch {
    /// Increments with every ubatch; each tensor's write takes the next one.
    serial: u64,
    /// Per token: (position, sequence index, cell).
    tokens: Vec<(i32, u32, u32)>,
    /// Cells whose main rows the writes code (after storing the new rows).
    code: Vec<u32>,
    /// Sequences whose centers the writes fix first, with the cells they average.
    centers: Vec<(u32, Vec<u32>)>,
    /// Cells whose window rows are in the scratch.
    scratch: Vec<u32>,
    /// Per sequence of the ubatch, what undoes it, until the ubatch is committed (the next
    /// begin_ubatch or another call that changes the cells).
    undo: Vec<SeqUndo>,
    /// A sequence's part was undone: the ubatch takes no more writes.
    undone: bool,
}

/// What one sequence's part of the last ubatch changed outside its own cells.
#[derive(Debug, Default)]
struct SeqUndo {
    seq: u32,
    /// The sequence's held cells before the ubatch (its list, moved here once the ubatch
    /// has read it; empty without a window, where nothing is held).
    held: Vec<u32>,
    /// How many entries that list had before the ubatch appended its own cells.
    held_len: usize,
    /// Whether its centers were fixed before the ubatch.
    centered: bool,
    /// Earlier cells of the sequence whose formats the ubatch changed, as they were.
    cells: Vec<(u32, Cell)>,
    /// Cells the ubatch wrote for the sequence and the engine has not released yet.
    live: usize,
}

/// Window cells of a tile gathered into runs: consecutive tile positions whose rows are
/// consecutive slots of one store (decoding allocates them so), read by one kernel call.
#[derive(Default)]
struct WindowRun {
    /// (first slot and whether it is in the scratch, first tile position, length)
    cur: Option<((u32, bool), usize, usize)>,
}

impl WindowRun {
    /// Adds the window cell at tile position `i` with row `slot`; returns the run it ends,
    /// if it does not continue it.
    fn push(&mut self, i: usize, slot: (u32, bool)) -> Option<((u32, bool), usize, usize)> {
        if let Some((s0, i0, len)) = &mut self.cur {
            if *i0 + *len == i && s0.1 == slot.1 && s0.0 as usize + *len == slot.0 as usize {
                *len += 1;
                return None;
            }
        }
        self.cur.replace((slot, i, 1))
    }

    fn finish(&mut self) -> Option<((u32, bool), usize, usize)> {
        self.cur.take()
    }
}

/// The first value `xs` holds twice, if any.
fn first_repeat<T: Ord + Copy>(xs: &[T]) -> Option<T> {
    let mut seen = xs.to_vec();
    seen.sort_unstable();
    seen.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Cells in range, each given once.
fn check_cells(cells: &[u32], n_cells: u32) -> Result<()> {
    if let Some(&c) = cells.iter().find(|&&c| c >= n_cells) {
        return Err(Error::invalid(
            "cells",
            format!("cell {c} is not below n_cells {n_cells}"),
        ));
    }
    if let Some(c) = first_repeat(cells) {
        return Err(Error::invalid("cells", format!("cell {c} is given twice")));
    }
    Ok(())
}

/// The protected cells of one kvq cache. See the crate notes.
#[derive(Debug)]
pub struct KvqCells {
    cfg: CellsConfig,
    tensors: Vec<TensorRows>,
    cells: Vec<Cell>,
    seqs: Vec<Seq>,
    sink_slots: Slots,
    win_slots: Slots,
    /// Window slots dropped by the current ubatch, free from the next one on.
    dropped: Vec<u32>,
    /// Which tensor holds each of the two scratch buffers (even tensors' and odd tensors').
    scratch_owner: [Option<u32>; 2],
    ubatch: Ubatch,
    /// Positions past the window whose window rows are still held ([`set_rollback`]).
    ///
    /// [`set_rollback`]: KvqCells::set_rollback
    rollback: u32,
}

impl KvqCells {
    /// Empty cells for `cfg` and `tensors`. Errors: no tensors or cells, a tensor whose
    /// head_dim, bits or KV heads kvq cannot hold, a center without a sink and a window,
    /// sizes that overflow.
    pub fn new(cfg: CellsConfig, tensors: &[TensorSpec]) -> Result<KvqCells> {
        if tensors.is_empty() || tensors.len() > u32::MAX as usize {
            return Err(Error::invalid("tensors", "one or more (fewer than 2^32)"));
        }
        if cfg.n_cells == 0 || cfg.n_cells == u32::MAX {
            return Err(Error::invalid(
                "n_cells",
                format!("{} is not in 1..2^32 - 1", cfg.n_cells),
            ));
        }
        if cfg.sink > i32::MAX as u32 || cfg.window > i32::MAX as u32 {
            return Err(Error::invalid("sink/window", "must be < 2^31"));
        }
        let rows = tensors
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                if spec.center && (cfg.sink == 0 || cfg.window == 0) {
                    return Err(Error::invalid(
                        "center",
                        format!(
                            "tensor {i}: a center needs an f16 sink (coded against the window's mean the sink \
                             loses what makes it the sink) and a window (the center is its mean)"
                        ),
                    ));
                }
                TensorRows::new(*spec, &cfg).map_err(|e| match e {
                    Error::Invalid { what, why } => Error::Invalid {
                        what,
                        why: format!("tensor {i}: {why}"),
                    },
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvqCells {
            cfg,
            tensors: rows,
            cells: vec![Cell::EMPTY; cfg.n_cells as usize],
            seqs: Vec::new(),
            sink_slots: Slots::default(),
            win_slots: Slots::default(),
            dropped: Vec::new(),
            scratch_owner: [None, None],
            ubatch: Ubatch::default(),
            rollback: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CellsConfig {
        &self.cfg
    }

    /// The number of tensors.
    pub fn n_tensors(&self) -> usize {
        self.tensors.len()
    }

    fn tensor(&self, t: u32) -> Result<&TensorRows> {
        self.tensors.get(t as usize).ok_or_else(|| {
            Error::invalid(
                "tensor",
                format!("{t} is not below {} tensors", self.tensors.len()),
            )
        })
    }

    /// Values per row of tensor `t`.
    pub fn head_dim(&self, t: u32) -> Result<usize> {
        Ok(self.tensor(t)?.spec().head_dim as usize)
    }

    /// Bytes of one cell of tensor `t`'s main rows (`n_kv_head` rows of its block format):
    /// the engine's tensor holds `n_cells` of them, cell `c` at `c * main_cell_bytes(t)`.
    pub fn main_cell_bytes(&self, t: u32) -> Result<usize> {
        Ok(self.tensor(t)?.main_cell_bytes())
    }

    /// Bytes tensor `t`'s rows and centers hold beside the engine's tensor.
    pub fn tensor_bytes(&self, t: u32) -> Result<usize> {
        Ok(self.tensor(t)?.bytes())
    }

    /// Bytes of the bookkeeping shared by every tensor (cells, sequences, the ubatch).
    pub fn shared_bytes(&self) -> usize {
        self.cells.capacity() * std::mem::size_of::<Cell>()
            + self
                .seqs
                .iter()
                .map(|s| std::mem::size_of::<Seq>() + 4 * s.held.capacity())
                .sum::<usize>()
            + self.sink_slots.bytes()
            + self.win_slots.bytes()
            + 4 * self.dropped.capacity()
            + 12 * self.ubatch.tokens.capacity()
            + 4 * self.ubatch.code.capacity()
    }

    /// Bytes one sequence holds beside the engine's tensors once its sink and window are full
    /// and its centers fixed: every tensor's sink and window rows and center, and the
    /// sequence's share of the bookkeeping (its entry, its list of window cells, free slots),
    /// the lists at their lengths (their capacities may add a few percent of that share). The
    /// cells at capacity are `shared_bytes()` of a fresh cache plus one of these per sequence;
    /// a prefill's scratch comes on top while its ubatch runs.
    pub fn seq_bytes(&self) -> usize {
        let sink = self.cfg.sink as usize;
        // window rows held: the window's and the rollback's
        let held = if self.cfg.window > 0 {
            self.cfg.window as usize + self.rollback as usize
        } else {
            0
        };
        let tensors: usize = self.tensors.iter().map(|t| t.seq_bytes(sink, held)).sum();
        tensors + std::mem::size_of::<Seq>() + 4 * held + 4 * (sink + held)
    }

    /// Keeps each window row `n` positions longer than the window reads it (default 0), so
    /// that a sequence taken back by up to `n` positions still holds every window row a fresh
    /// sequence would ([`truncate`](Self::truncate)). Costs `n` window rows per sequence and
    /// tensor ([`seq_bytes`](Self::seq_bytes) counts them); reads are the same for every `n`.
    /// Takes effect from the next ubatch (rows already dropped stay dropped). Errors: `n >=
    /// 2^31`.
    pub fn set_rollback(&mut self, n: u32) -> Result<()> {
        if n > i32::MAX as u32 {
            return Err(Error::invalid("rollback", format!("{n} is not below 2^31")));
        }
        self.rollback = n;
        Ok(())
    }

    /// Positions past the window whose window rows are kept ([`set_rollback`](Self::set_rollback)).
    pub fn rollback(&self) -> u32 {
        self.rollback
    }

    /// Bytes the cells hold beside the engine's tensors with `n_seqs` sequences whose sinks and
    /// windows are full, after ubatches of up to `n_ubatch` tokens: the per-cell bookkeeping,
    /// the ubatch's per-token lists and `n_seqs` times [`seq_bytes`](Self::seq_bytes). What an
    /// engine states as its cache's size when the cache is made. Not counted: a prefill's
    /// scratch, held from its ubatch until the next ubatch that needs none (decoding).
    ///
    /// Errors: a size that overflows `usize`.
    pub fn capacity_bytes(&self, n_seqs: u32, n_ubatch: u32) -> Result<usize> {
        // per ubatch token, the lists `shared_bytes` counts: its entry in `tokens`, and at most
        // one cell to code and one slot dropped
        let per_token = std::mem::size_of::<(i32, u32, u32)>() + 2 * std::mem::size_of::<u32>();
        (n_ubatch as usize)
            .checked_mul(per_token)
            .and_then(|u| {
                (n_seqs as usize)
                    .checked_mul(self.seq_bytes())
                    .and_then(|s| s.checked_add(u))
            })
            .and_then(|v| v.checked_add(self.cells.len() * std::mem::size_of::<Cell>()))
            .ok_or_else(|| Error::invalid("n_seqs", "the cells' size at capacity overflows"))
    }

    /// Every byte held beside the engine's tensors: all tensors' plus the shared bookkeeping.
    pub fn bytes_held(&self) -> usize {
        self.tensors.iter().map(TensorRows::bytes).sum::<usize>() + self.shared_bytes()
    }

    /// Cells holding a window row now (slots dropped by the current ubatch, whose storage
    /// is reused from the next one on, not counted).
    pub fn window_rows(&self) -> usize {
        self.win_slots.used() - self.dropped.len()
    }

    /// Cells of the current ubatch whose window rows are in its scratch (they leave the
    /// window within the ubatch; the scratch is freed by the first ubatch that needs none).
    pub fn scratch_rows(&self) -> usize {
        self.ubatch.scratch.len()
    }

    /// Cells holding a sink row now.
    pub fn sink_rows(&self) -> usize {
        self.sink_slots.used()
    }

    fn seq_index(&mut self, id: i32) -> u32 {
        if let Some(i) = self.seqs.iter().position(|s| s.id == id) {
            return i as u32;
        }
        self.fresh_seq(id, &[])
    }

    /// A new entry for sequence `id` (or [`DETACHED`]): a detached entry no cell refers to
    /// any more (and not in `keep`) is reused, its centers forgotten.
    fn fresh_seq(&mut self, id: i32, keep: &[u32]) -> u32 {
        let fresh = Seq {
            id,
            centered: false,
            held: Vec::new(),
        };
        let free = (0..self.seqs.len() as u32).find(|&si| {
            self.seqs[si as usize].id == DETACHED
                && !keep.contains(&si)
                && !self.cells.iter().any(|c| c.seq == si)
        });
        match free {
            Some(si) => {
                self.seqs[si as usize] = fresh;
                for t in &mut self.tensors {
                    t.set_center(si, None);
                }
                si
            }
            None => {
                self.seqs.push(fresh);
                (self.seqs.len() - 1) as u32
            }
        }
    }

    /// Sequence `id`'s entry, if any, stops being `id`'s: the cells it wrote keep their
    /// centers, and `id` starts afresh (a load replaces it).
    fn detach_seq(&mut self, id: i32) {
        if let Some(s) = self.seqs.iter_mut().find(|s| s.id == id) {
            s.id = DETACHED;
            s.held.clear();
        }
    }

    fn release_cell(&mut self, c: usize) {
        let cell = self.cells[c];
        if cell.flags & SINK != 0 {
            self.sink_slots.release(cell.slot);
        } else if cell.flags & WIN != 0 && cell.flags & SCRATCH == 0 {
            self.win_slots.release(cell.slot);
        }
        self.cells[c] = Cell::EMPTY;
    }

    /// Starts a ubatch: token `i` is at position `pos[i]` of sequence `seq[i]` and goes to
    /// cell `cells[i]`, in the order of every tensor's rows. Decides what the ubatch's
    /// writes do (each tensor's [`write`](Self::write) follows, then reads). Errors
    /// (nothing changes): lengths that differ, a negative position or sequence, a cell out
    /// of range or given twice, a tensor that missed the previous ubatch's write.
    pub fn begin_ubatch(&mut self, pos: &[i32], seq: &[i32], cells: &[i64]) -> Result<()> {
        let n = pos.len();
        if seq.len() != n || cells.len() != n {
            return Err(Error::invalid(
                "ubatch",
                format!(
                    "{n} positions, {} sequences, {} cells",
                    seq.len(),
                    cells.len()
                ),
            ));
        }
        if let Some(i) = pos.iter().position(|&p| p < 0) {
            return Err(Error::invalid(
                "pos",
                format!("token {i} has position {}", pos[i]),
            ));
        }
        if let Some(i) = seq.iter().position(|&s| s < 0) {
            return Err(Error::invalid(
                "seq",
                format!("token {i} has sequence {}", seq[i]),
            ));
        }
        if let Some(i) = cells
            .iter()
            .position(|&c| c < 0 || c >= i64::from(self.cfg.n_cells))
        {
            return Err(Error::invalid(
                "cells",
                format!(
                    "token {i} goes to cell {} of {}",
                    cells[i], self.cfg.n_cells
                ),
            ));
        }
        if let Some(c) = first_repeat(cells) {
            return Err(Error::invalid("cells", format!("cell {c} is given twice")));
        }
        if let Some(t) = self
            .tensors
            .iter()
            .position(|t| t.written() != self.ubatch.serial)
        {
            return Err(Error::State {
                why: format!(
                    "tensor {t} was not written in ubatch {} (every tensor's write follows each begin_ubatch)",
                    self.ubatch.serial
                ),
            });
        }
        self.commit_ubatch();
        // the previous ubatch's scratch rows are coded and gone; its dropped window slots
        // are free from now on
        for c in std::mem::take(&mut self.ubatch.scratch) {
            let cell = &mut self.cells[c as usize];
            if cell.flags & SCRATCH != 0 {
                cell.flags &= !(WIN | SCRATCH);
                cell.slot = NONE;
            }
        }
        for s in std::mem::take(&mut self.dropped) {
            self.win_slots.release(s);
        }
        self.compact_window_slots();
        self.ubatch.serial += 1;
        self.ubatch.undone = false;
        self.ubatch.tokens.clear();
        self.ubatch.code.clear();
        self.ubatch.centers.clear();
        let (sink, w) = (i64::from(self.cfg.sink), i64::from(self.cfg.window));
        // window rows are held `rollback` positions longer than the window reads them
        let held_for = if w > 0 {
            w + i64::from(self.rollback)
        } else {
            0
        };
        // per sequence of the ubatch: its first and last positions
        let sis: Vec<u32> = seq.iter().map(|&s| self.seq_index(s)).collect();
        let mut spans: Vec<(u32, i64, i64)> = Vec::new();
        for (&p, &si) in pos.iter().zip(&sis) {
            let p = i64::from(p);
            match spans.iter_mut().find(|s| s.0 == si) {
                Some(s) => {
                    s.1 = s.1.min(p);
                    s.2 = s.2.max(p);
                }
                None => spans.push((si, p, p)),
            }
        }
        for i in 0..n {
            let c = cells[i] as usize;
            let si = sis[i];
            let p = i64::from(pos[i]);
            self.release_cell(c);
            let mut cell = Cell {
                pos: pos[i],
                seq: si,
                ..Cell::EMPTY
            };
            match self.ubatch.undo.iter_mut().find(|u| u.seq == si) {
                Some(u) => u.live += 1,
                None => {
                    let s = &self.seqs[si as usize];
                    self.ubatch.undo.push(SeqUndo {
                        seq: si,
                        held: Vec::new(),
                        held_len: s.held.len(),
                        centered: s.centered,
                        cells: Vec::new(),
                        live: 1,
                    });
                }
            }
            if p < sink {
                cell.slot = self.sink_slots.alloc();
                cell.flags = SINK;
            } else if w > 0 {
                let last = spans.iter().find(|s| s.0 == si).map_or(p, |s| s.2);
                if p > last - held_for {
                    // still held after this ubatch: a lasting slot
                    cell.slot = self.win_slots.alloc();
                    cell.flags = WIN;
                } else {
                    cell.slot = i as u32;
                    cell.flags = WIN | SCRATCH;
                    self.ubatch.scratch.push(c as u32);
                }
                self.seqs[si as usize].held.push(c as u32);
            } else {
                cell.flags = CODED;
            }
            cell.flags |= UBATCH;
            self.cells[c] = cell;
            self.ubatch.tokens.push((pos[i], si, c as u32));
        }
        if w == 0 {
            return Ok(());
        }
        let any_center = self.tensors.iter().any(|t| t.spec().center);
        for (si, first, last) in spans {
            let mut held = std::mem::take(&mut self.seqs[si as usize].held);
            // a held entry is live while its cell still holds a window row of this sequence;
            // a cell freed and written again by the sequence has a stale entry beside its new
            // one: each cell counts once (twice, its slot would be dropped twice)
            let mut live: Vec<u32> = held
                .iter()
                .copied()
                .filter(|&c| {
                    let cell = &self.cells[c as usize];
                    cell.seq == si && cell.flags & WIN != 0
                })
                .collect();
            // the list as it was before this ubatch appended its own cells goes to the undo
            let ui = self
                .ubatch
                .undo
                .iter()
                .position(|u| u.seq == si)
                .expect("every sequence of the ubatch has its undo");
            held.truncate(self.ubatch.undo[ui].held_len);
            self.ubatch.undo[ui].held = held;
            let mut seen = std::collections::HashSet::with_capacity(live.len());
            live.retain(|&c| seen.insert(c));
            let due = |c: &u32| {
                let cell = &self.cells[*c as usize];
                cell.flags & CODED == 0 && i64::from(cell.pos) <= last - w
            };
            if any_center && !self.seqs[si as usize].centered && live.iter().any(due) {
                let in_span: Vec<u32> = live
                    .iter()
                    .copied()
                    .filter(|&c| (sink..=sink + w).contains(&i64::from(self.cells[c as usize].pos)))
                    .collect();
                let from = if in_span.is_empty() {
                    live.clone()
                } else {
                    in_span
                };
                self.ubatch.centers.push((si, from));
                self.seqs[si as usize].centered = true;
            }
            let mut keep = Vec::with_capacity(live.len());
            let undo = &mut self.ubatch.undo[ui];
            for c in live {
                let cell = &mut self.cells[c as usize];
                let before = *cell;
                let p = i64::from(cell.pos);
                if cell.flags & CODED == 0 && p <= last - w {
                    cell.flags |= CODED;
                    self.ubatch.code.push(c);
                }
                if p <= first - held_for && cell.flags & SCRATCH == 0 {
                    // the slot keeps its rows (coded from them in this ubatch if due) and
                    // is freed at the next begin_ubatch
                    cell.flags &= !WIN;
                    self.dropped.push(cell.slot);
                } else {
                    keep.push(c);
                }
                if cell.flags != before.flags && before.flags & UBATCH == 0 {
                    undo.cells.push((c, before));
                }
            }
            self.seqs[si as usize].held = keep;
        }
        Ok(())
    }

    /// The last ubatch can no longer be undone: its cells are like any other.
    fn commit_ubatch(&mut self) {
        if self.ubatch.undo.is_empty() {
            return;
        }
        for &(_, _, c) in &self.ubatch.tokens {
            self.cells[c as usize].flags &= !UBATCH;
        }
        self.ubatch.undo.clear();
    }

    /// Undoes what the last ubatch did to sequence entry `u`'s earlier cells: formats,
    /// dropped window rows, held cells and centers as before it. Its own cells are released.
    fn undo_seq(&mut self, u: usize) {
        let undo = self.ubatch.undo.swap_remove(u);
        for (c, before) in undo.cells {
            let cell = &mut self.cells[c as usize];
            // released (or written again) since: nothing of the sequence's to restore there;
            // a window slot it dropped is still released by the next begin_ubatch
            if cell.pos != before.pos || cell.seq != before.seq || cell.flags & SINK != 0 {
                continue;
            }
            if before.flags & WIN != 0 && cell.flags & WIN == 0 {
                if let Some(i) = self.dropped.iter().position(|&s| s == before.slot) {
                    self.dropped.swap_remove(i);
                }
            }
            *cell = before;
        }
        let seq = &mut self.seqs[undo.seq as usize];
        seq.held = undo.held;
        if seq.centered && !undo.centered {
            seq.centered = false;
            for t in &mut self.tensors {
                t.set_center(undo.seq, None);
            }
        }
        self.ubatch.undone = true;
        if self.ubatch.undo.is_empty() {
            // every sequence undone: the ubatch is over, whatever its writes reached
            self.ubatch.tokens.clear();
            self.ubatch.code.clear();
            self.ubatch.centers.clear();
            self.ubatch.scratch.clear();
            let serial = self.ubatch.serial;
            for t in &mut self.tensors {
                t.set_written(serial);
            }
        }
    }

    /// Drops the last ubatch, complete or not (the engine's compute for it was aborted or
    /// failed, or the engine took its tokens back): every cell it wrote is released and the
    /// rest read as before its [`begin_ubatch`](Self::begin_ubatch); the next ubatch starts
    /// clean. Returns whether there was a ubatch to drop: none after another call changed
    /// the cells (a later begin_ubatch, clear, copy, load, shift), when it is committed.
    pub fn drop_ubatch(&mut self) -> bool {
        if self.ubatch.undo.is_empty() {
            return false;
        }
        let cells: Vec<u32> = self
            .ubatch
            .tokens
            .iter()
            .map(|&(_, _, c)| c)
            .filter(|&c| self.cells[c as usize].flags & UBATCH != 0)
            .collect();
        for c in cells {
            self.release_written(c as usize);
        }
        true
    }

    /// Releases cell `c`; the last of a sequence's cells of an undoable ubatch undoes the
    /// sequence's part of it.
    fn release_written(&mut self, c: usize) {
        let cell = self.cells[c];
        self.release_cell(c);
        if cell.flags & UBATCH == 0 {
            return;
        }
        if let Some(u) = self.ubatch.undo.iter().position(|u| u.seq == cell.seq) {
            self.ubatch.undo[u].live -= 1;
            if self.ubatch.undo[u].live == 0 {
                self.undo_seq(u);
            }
        }
    }

    /// Renumbers the lasting window slots 0..used and shrinks every tensor's window rows to
    /// them when most of the storage is free (after a prefill, whose window rows decoding no
    /// longer needs). Between ubatches, with no slot pending release.
    fn compact_window_slots(&mut self) {
        let used = self.win_slots.used();
        if self.win_slots.len() <= 2 * used + 8 {
            return;
        }
        let mut moves = Vec::with_capacity(used);
        for cell in self.cells.iter_mut() {
            if cell.flags & WIN != 0 && cell.flags & SCRATCH == 0 {
                moves.push((cell.slot, moves.len() as u32));
                cell.slot = moves.len() as u32 - 1;
            }
        }
        for t in &mut self.tensors {
            t.compact_window(&moves);
        }
        self.win_slots = Slots::with_used(moves.len() as u32);
    }

    /// The current ubatch's token count.
    pub fn ubatch_len(&self) -> usize {
        self.ubatch.tokens.len()
    }

    /// Writes tensor `t`'s rows of the current ubatch: `rows` is `n_tokens x n_kv_head x
    /// head_dim` (token `i`'s row for cell `cells[i]`, which must repeat
    /// [`begin_ubatch`](Self::begin_ubatch)'s). Sink positions keep an f16 row, others a
    /// window row; then the due centers are fixed and the due main rows coded into `main`
    /// (the engine's whole tensor). A row with a non-finite value is stored poisoned (it
    /// reads NaN). Errors (nothing written): a tensor written twice in one ubatch, rows or
    /// cells other than the ubatch's, a short `main`.
    pub fn write(&mut self, t: u32, rows: &[f32], cells: &[i64], main: &mut [u8]) -> Result<()> {
        self.tensor(t)?;
        let ub = &self.ubatch;
        if cells.len() != ub.tokens.len()
            || cells
                .iter()
                .zip(&ub.tokens)
                .any(|(&c, &(_, _, uc))| c != i64::from(uc))
        {
            return Err(Error::State {
                why: format!(
                    "tensor {t}: a write of {} rows whose cells are not the {} of begin_ubatch",
                    cells.len(),
                    ub.tokens.len()
                ),
            });
        }
        if ub.undone {
            return Err(Error::State {
                why: format!(
                    "tensor {t}: ubatch {} was dropped (its cells were released)",
                    ub.serial
                ),
            });
        }
        let tensor = &mut self.tensors[t as usize];
        if tensor.written() == ub.serial {
            return Err(Error::State {
                why: format!("tensor {t} was written twice in ubatch {}", ub.serial),
            });
        }
        tensor.check_main(main.len(), self.cfg.n_cells)?;
        tensor.check_rows(rows.len(), ub.tokens.len())?;
        // the scratch: two buffers for the whole cache, even tensors' and odd tensors' (a
        // layer's K and V in an engine's order), each passed on to the next tensor of its
        // side at its write; none while decoding
        let side = (t % 2) as usize;
        let scratch = if ub.scratch.is_empty() {
            0
        } else {
            ub.tokens.len()
        };
        if scratch > 0 {
            if let Some(u) = self.scratch_owner[side].filter(|&u| u != t) {
                let buf = self.tensors[u as usize].take_scratch();
                self.tensors[t as usize].give_scratch(buf);
            }
            self.scratch_owner[side] = Some(t);
        } else {
            if self.scratch_owner[side] == Some(t) {
                self.scratch_owner[side] = None;
            }
            self.tensors[t as usize].free_scratch();
        }
        let tensor = &mut self.tensors[t as usize];
        let ub = &self.ubatch;
        tensor.reserve(self.sink_slots.len(), self.win_slots.len(), scratch);
        let cells_meta = &self.cells;
        for (x, &(_, _, c)) in rows.chunks_exact(tensor.width()).zip(&ub.tokens) {
            let cell = &cells_meta[c as usize];
            if cell.flags & SINK != 0 {
                tensor.store_sink(cell.slot, x);
            } else if cell.flags & WIN != 0 {
                tensor.store_window(cell.slot, cell.flags & SCRATCH != 0, x);
            } else {
                tensor.store_main(c, x, main);
            }
        }
        for (si, from) in &ub.centers {
            if tensor.spec().center {
                let slots: Vec<(u32, bool)> = from
                    .iter()
                    .map(|&c| {
                        let cell = &cells_meta[c as usize];
                        (cell.slot, cell.flags & SCRATCH != 0)
                    })
                    .collect();
                tensor.fix_center(*si, &slots)?;
            }
        }
        for &c in &ub.code {
            // a cell dropped in this ubatch keeps its slot's rows until the next one
            let cell = &cells_meta[c as usize];
            tensor.code_main(c, (cell.slot, cell.flags & SCRATCH != 0), cell.seq, main)?;
        }
        if scratch > 0 && self.sink_slots.len() > 0 {
            // a prefill: each of its queries reads every sink row, rotated once here
            self.tensors[t as usize].rotate_sinks(self.sink_slots.len());
        }
        let serial = self.ubatch.serial;
        self.tensors[t as usize].set_written(serial);
        Ok(())
    }

    /// How the query at position `query_pos` reads cell `cell`.
    pub fn read_of(&self, cell: u32, query_pos: i32) -> CellRead {
        let Some(c) = self.cells.get(cell as usize) else {
            return CellRead::Main;
        };
        if c.flags & SINK != 0 {
            return CellRead::Sink;
        }
        if c.flags & WIN != 0
            && (c.flags & CODED == 0
                || i64::from(query_pos) - i64::from(c.pos) < i64::from(self.cfg.window))
        {
            return CellRead::Window;
        }
        CellRead::Main
    }

    /// Sequence `seq`'s center in tensor `t` (`n_kv_head * head_dim` values), once fixed.
    pub fn center_of(&self, t: u32, seq: i32) -> Option<&[f32]> {
        let si = self.seqs.iter().position(|s| s.id == seq)?;
        self.tensors.get(t as usize)?.center(si as u32)
    }

    fn query_pos(&self, token: u32) -> Result<i32> {
        self.ubatch
            .tokens
            .get(token as usize)
            .map(|&(p, _, _)| p)
            .ok_or_else(|| {
                Error::invalid(
                    "token",
                    format!(
                        "{token} is not below the ubatch's {} tokens",
                        self.ubatch.tokens.len()
                    ),
                )
            })
    }

    /// Checks a tile: tensor, KV head, cells, and `q_len` values of queries against a grid of
    /// `grid_len` values; returns the tensor and the number of queries.
    #[allow(clippy::too_many_arguments)]
    fn check_tile(
        &self,
        t: u32,
        main_len: usize,
        kv_head: u32,
        cell0: u32,
        n: usize,
        q_len: usize,
        grid_len: usize,
        grid: &'static str,
    ) -> Result<(&TensorRows, usize)> {
        let tensor = self.tensor(t)?;
        tensor.check_main(main_len, self.cfg.n_cells)?;
        let (d, h) = (tensor.spec().head_dim as usize, tensor.spec().n_kv_head);
        if kv_head >= h {
            return Err(Error::invalid(
                "kv_head",
                format!("{kv_head} is not below n_kv_head {h}"),
            ));
        }
        if u64::from(cell0) + n as u64 > u64::from(self.cfg.n_cells) {
            return Err(Error::invalid(
                "cells",
                format!("{cell0} + {n} is beyond n_cells {}", self.cfg.n_cells),
            ));
        }
        if q_len == 0 || !q_len.is_multiple_of(d) || q_len / d > MAX_QUERIES {
            return Err(Error::invalid(
                "queries",
                format!("{q_len} values: 1..={MAX_QUERIES} queries of head_dim {d}"),
            ));
        }
        let g = q_len / d;
        if grid_len != g * n {
            return Err(Error::invalid(
                grid,
                format!("{grid_len} values for {g} queries x {n} cells"),
            ));
        }
        Ok((tensor, g))
    }

    /// Raw dot products (before any scale) of `g` rotated queries (`q_rot`: `g x
    /// head_dim`, the query heads of KV head `kv_head` at ubatch token `token`) with tensor
    /// `t`'s cells `cell0 .. cell0 + n`, each read as [`read_of`](Self::read_of) says:
    /// query `j`'s score of cell `cell0 + i` goes to `scores[j * n + i]`. `main` is the
    /// engine's whole tensor. A cell the engine masks may score anything finite or NaN.
    #[allow(clippy::too_many_arguments)]
    pub fn scores(
        &self,
        t: u32,
        main: &[u8],
        kv_head: u32,
        cell0: u32,
        n: usize,
        token: u32,
        q_rot: &[f32],
        scores: &mut [f32],
    ) -> Result<()> {
        let (tensor, g) = self.check_tile(
            t,
            main.len(),
            kv_head,
            cell0,
            n,
            q_rot.len(),
            scores.len(),
            "scores",
        )?;
        if n == 0 {
            return Ok(());
        }
        let q = self.query_pos(token)?;
        tensor.main_scores(main, kv_head, cell0, n, q_rot, scores)?;
        let mut qc = tensor::CenterDots::default();
        let center = tensor.spec().center;
        let tile = &self.cells[cell0 as usize..cell0 as usize + n];
        // most tiles hold only coded main rows of one writer: their centers' q . c added in
        // one pass (the loop below gives the same sums, cell by cell)
        if center {
            if let Some(first) = tile.first().filter(|c| c.flags & !UBATCH == CODED) {
                if tile
                    .iter()
                    .all(|c| c.flags & !UBATCH == CODED && c.seq == first.seq)
                {
                    let dots = tensor.center_dots(&mut qc, first.seq, kv_head, q_rot, g)?;
                    for (j, &dj) in dots.iter().enumerate() {
                        for s in &mut scores[j * n..(j + 1) * n] {
                            *s += dj;
                        }
                    }
                    return Ok(());
                }
            }
        } else if tile.iter().all(|c| c.flags & (SINK | WIN) == 0) {
            return Ok(());
        }
        // window cells in runs of consecutive slots, one kernel call per run
        let mut run = WindowRun::default();
        for (i, c) in tile.iter().enumerate() {
            if c.flags & (SINK | WIN) == 0 {
                // a main row (or an empty cell): read_of says Main
                if c.flags & CODED != 0 && center {
                    tensor.add_center_scores(&mut qc, c.seq, kv_head, q_rot, g, scores, n, i)?;
                }
                continue;
            }
            match self.read_of(cell0 + i as u32, q) {
                CellRead::Main => {
                    if c.flags & CODED != 0 && tensor.spec().center {
                        tensor
                            .add_center_scores(&mut qc, c.seq, kv_head, q_rot, g, scores, n, i)?;
                    }
                }
                CellRead::Window => {
                    if let Some((slot, i0, len)) = run.push(i, (c.slot, c.flags & SCRATCH != 0)) {
                        tensor.window_scores_run(slot, kv_head, q_rot, g, scores, n, i0, len)?;
                    }
                }
                CellRead::Sink => tensor.sink_scores(c.slot, kv_head, q_rot, g, scores, n, i),
            }
        }
        if let Some((slot, i0, len)) = run.finish() {
            tensor.window_scores_run(slot, kv_head, q_rot, g, scores, n, i0, len)?;
        }
        Ok(())
    }

    /// `acc[j] += sum_i w[j * n + i] * row(cell0 + i)` in the rotated basis for `g` queries
    /// (`acc`: `g x head_dim`) over tensor `t`'s cells, each read as
    /// [`read_of`](Self::read_of) says for the query at ubatch token `token`; a weight of 0
    /// skips the cell. Un-rotate each sum once. `main` is the engine's whole tensor.
    #[allow(clippy::too_many_arguments)]
    pub fn accumulate(
        &self,
        t: u32,
        main: &[u8],
        kv_head: u32,
        cell0: u32,
        n: usize,
        token: u32,
        w: &[f32],
        acc: &mut [f32],
    ) -> Result<()> {
        let (tensor, g) = self.check_tile(
            t,
            main.len(),
            kv_head,
            cell0,
            n,
            acc.len(),
            w.len(),
            "weights",
        )?;
        if n == 0 {
            return Ok(());
        }
        let q = self.query_pos(token)?;
        let tile = &self.cells[cell0 as usize..cell0 as usize + n];
        let center = tensor.spec().center;
        let side = |i: usize| {
            tile[i].flags & (SINK | WIN) != 0
                && matches!(
                    self.read_of(cell0 + i as u32, q),
                    CellRead::Window | CellRead::Sink
                )
        };
        tensor.main_accumulate(main, kv_head, cell0, n, w, g, acc, side)?;
        for (i, c) in tile.iter().enumerate() {
            // a main row adds nothing more unless it was coded against a center
            if c.flags & (SINK | WIN) == 0 && !(center && c.flags & CODED != 0) {
                continue;
            }
            if (0..g).all(|j| w[j * n + i] == 0.0) {
                continue;
            }
            match self.read_of(cell0 + i as u32, q) {
                CellRead::Main => {
                    if c.flags & CODED != 0 && tensor.spec().center {
                        tensor.add_center_values(c.seq, kv_head, w, g, acc, n, i)?;
                    }
                }
                // one row per call, in cell order: the sums do not depend on how the window's
                // rows are laid out (a prefill's scratch or decoding's slots), so a batched
                // prefill sums bit for bit what one-token decoding sums
                CellRead::Window => tensor.window_accumulate(
                    (c.slot, c.flags & SCRATCH != 0),
                    kv_head,
                    w,
                    g,
                    acc,
                    n,
                    i,
                )?,
                CellRead::Sink => tensor.sink_accumulate(c.slot, kv_head, w, g, acc, n, i),
            }
        }
        Ok(())
    }

    fn stored_as(c: &Cell) -> StoredAs {
        if c.flags & SINK != 0 {
            StoredAs::Sink(c.slot)
        } else if c.flags & WIN != 0 && c.flags & SCRATCH == 0 {
            StoredAs::Window(c.slot, c.flags & CODED != 0)
        } else {
            // a coded main row is relative to the center when the tensor has one (centers
            // need a window: without one, main rows are stored as written, never centered)
            StoredAs::Main(c.flags & CODED != 0)
        }
    }

    /// Refuses a call `what` within a ubatch (a tensor not yet written since `begin_ubatch`).
    pub(crate) fn check_between_ubatches(&self, what: &str) -> Result<()> {
        match self
            .tensors
            .iter()
            .position(|t| t.written() != self.ubatch.serial)
        {
            Some(t) => Err(Error::State {
                why: format!(
                    "{what} between ubatches only: tensor {t} was not written in ubatch {}",
                    self.ubatch.serial
                ),
            }),
            None => Ok(()),
        }
    }

    /// Cells in range, each given once, each written by these cells.
    pub(crate) fn check_written_cells(&self, cells: &[u32]) -> Result<()> {
        check_cells(cells, self.cfg.n_cells)?;
        match cells
            .iter()
            .find(|&&c| self.cells[c as usize].pos < 0 || self.cells[c as usize].seq == NONE)
        {
            Some(c) => Err(Error::invalid(
                "cells",
                format!("cell {c} holds nothing these cells wrote"),
            )),
            None => Ok(()),
        }
    }

    /// Checks cells for reading or storing rows of tensor `t`: between ubatches, in range,
    /// written, each once; `main` and `values` long enough.
    fn check_cell_rows(&self, t: u32, main_len: usize, cells: &[u32], values: usize) -> Result<()> {
        let tensor = self.tensor(t)?;
        tensor.check_main(main_len, self.cfg.n_cells)?;
        tensor.check_rows(values, cells.len())?;
        self.check_between_ubatches("rows are read or stored")?;
        self.check_written_cells(cells)
    }

    /// The values cells `cells` of tensor `t` hold now (`cells.len() x n_kv_head x
    /// head_dim` f32, in order): a sink cell's f16 row, a window cell's window row, else its
    /// main row plus its writer's center. With [`set_cell_rows`](Self::set_cell_rows) an
    /// engine transforms stored rows in place (RoPE shifts of K after a position shift).
    /// Between ubatches. Errors: a cell out of range, unwritten or given twice; short
    /// `main` or `out`.
    pub fn cell_rows(&self, t: u32, main: &[u8], cells: &[u32], out: &mut [f32]) -> Result<()> {
        self.check_cell_rows(t, main.len(), cells, out.len())?;
        let tensor = &self.tensors[t as usize];
        for (&c, o) in cells.iter().zip(out.chunks_exact_mut(tensor.width())) {
            let cell = &self.cells[c as usize];
            tensor.cell_values(c, Self::stored_as(cell), cell.seq, main, o)?;
        }
        Ok(())
    }

    /// Stores new values (`cells.len() x n_kv_head x head_dim` f32) for cells `cells` of
    /// tensor `t`, each in the format it has: an f16 sink row; a window row (and its main row
    /// again, coded from it, once it has one); or a main row (relative to its writer's
    /// center when it was coded so). Formats, positions and centers do not change. Between
    /// ubatches. Errors as [`cell_rows`](Self::cell_rows); nothing is stored then.
    pub fn set_cell_rows(
        &mut self,
        t: u32,
        main: &mut [u8],
        cells: &[u32],
        rows: &[f32],
    ) -> Result<()> {
        self.check_cell_rows(t, main.len(), cells, rows.len())?;
        self.commit_ubatch();
        let width = self.tensors[t as usize].width();
        for (&c, x) in cells.iter().zip(rows.chunks_exact(width)) {
            let cell = self.cells[c as usize];
            self.tensors[t as usize].store_cell_values(
                c,
                Self::stored_as(&cell),
                cell.seq,
                main,
                x,
            )?;
        }
        Ok(())
    }

    /// Moves cells `cells` to positions `pos` (the engine shifted them, llama.cpp's
    /// `seq_add` / `seq_div`): later reads and re-coding follow the new positions; each
    /// cell keeps its format (a sink row stays f16, a main row stays main). Between ubatches.
    /// Errors (nothing moves): lengths that differ, a cell out of range or unwritten, a
    /// negative position.
    pub fn set_positions(&mut self, cells: &[u32], pos: &[i32]) -> Result<()> {
        if cells.len() != pos.len() {
            return Err(Error::invalid(
                "pos",
                format!("{} cells and {} positions", cells.len(), pos.len()),
            ));
        }
        if let Some(i) = pos.iter().position(|&p| p < 0) {
            return Err(Error::invalid(
                "pos",
                format!("cell {} to position {}", cells[i], pos[i]),
            ));
        }
        for &c in cells {
            match self.cells.get(c as usize) {
                None => {
                    return Err(Error::invalid(
                        "cells",
                        format!("cell {c} is not below n_cells {}", self.cfg.n_cells),
                    ))
                }
                Some(cell) if cell.pos < 0 => {
                    return Err(Error::invalid(
                        "cells",
                        format!("cell {c} holds nothing these cells wrote"),
                    ))
                }
                _ => {}
            }
        }
        self.commit_ubatch();
        for (&c, &p) in cells.iter().zip(pos) {
            self.cells[c as usize].pos = p;
        }
        Ok(())
    }

    /// Forgets cell `cell` (the engine freed it): its sink or window rows are released.
    /// Releasing the last cell the last ubatch wrote for a sequence, before any other call
    /// that changes the cells, also undoes what that ubatch did to the sequence's earlier
    /// cells (an engine's rollback of a failed or taken-back ubatch; see
    /// [`drop_ubatch`](Self::drop_ubatch)).
    pub fn release(&mut self, cell: u32) -> Result<()> {
        if cell >= self.cfg.n_cells {
            return Err(Error::invalid(
                "cell",
                format!("{cell} is not below n_cells {}", self.cfg.n_cells),
            ));
        }
        self.release_written(cell as usize);
        Ok(())
    }

    /// Forgets every cell, sequence and center (the engine cleared its cache). The next
    /// ubatch starts afresh, whether or not the last one was complete.
    pub fn clear(&mut self) {
        self.cells.fill(Cell::EMPTY);
        self.seqs.clear();
        self.sink_slots = Slots::default();
        self.win_slots = Slots::default();
        self.dropped.clear();
        self.ubatch.tokens.clear();
        self.ubatch.code.clear();
        self.ubatch.centers.clear();
        self.ubatch.scratch.clear();
        self.ubatch.undo.clear();
        self.ubatch.undone = false;
        self.scratch_owner = [None, None];
        let serial = self.ubatch.serial;
        for t in &mut self.tensors {
            t.clear();
            t.set_written(serial);
        }
    }

    /// Copies cells `src0 .. src0 + n` onto `dst0 .. dst0 + n` in every tensor (the engine
    /// copied those cells' main rows, one stream onto another), the copies belonging to
    /// sequence `dst_seq`, which takes the writers' centers. Between ubatches only. Errors:
    /// ranges out of bounds or overlapping, a negative sequence.
    pub fn copy_cells(&mut self, src0: u32, dst0: u32, n: u32, dst_seq: i32) -> Result<()> {
        let (s, d, n) = (u64::from(src0), u64::from(dst0), u64::from(n));
        let total = u64::from(self.cfg.n_cells);
        if s + n > total || d + n > total || (n > 0 && s < d + n && d < s + n) || dst_seq < 0 {
            return Err(Error::invalid(
                "copy",
                format!("cells {s}+{n} onto {d}+{n} of {total}, sequence {dst_seq}"),
            ));
        }
        self.commit_ubatch();
        let di = self.seq_index(dst_seq);
        let mut centers_from: Vec<u32> = Vec::new();
        for k in 0..n as usize {
            let src = self.cells[s as usize + k];
            let dc = d as usize + k;
            self.release_cell(dc);
            let mut cell = Cell {
                seq: if src.seq == NONE { NONE } else { di },
                ..src
            };
            if src.flags & SINK != 0 {
                cell.slot = self.sink_slots.alloc();
                for t in &mut self.tensors {
                    t.copy_sink(src.slot, cell.slot);
                }
            } else if src.flags & SCRATCH != 0 {
                // coded in the last ubatch and dropped by the next: the copy reads its main rows
                cell.flags &= !(WIN | SCRATCH);
                cell.slot = NONE;
            } else if src.flags & WIN != 0 {
                cell.slot = self.win_slots.alloc();
                for t in &mut self.tensors {
                    t.copy_window(src.slot, cell.slot);
                }
                self.seqs[di as usize].held.push(dc as u32);
            } else {
                cell.slot = NONE;
            }
            if src.seq != NONE && src.seq != di && !centers_from.contains(&src.seq) {
                centers_from.push(src.seq);
                let centered = self.seqs[src.seq as usize].centered;
                self.seqs[di as usize].centered |= centered;
                for t in &mut self.tensors {
                    t.copy_center(src.seq, di);
                }
            }
            self.cells[dc] = cell;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
