//! Saved cells: what [`KvqCells`] holds for some cells beside the engine's tensors (each
//! cell's position, writer and format, its f16 sink rows or window rows, and the writers'
//! centers) in the versioned, checksummed `KVCQCELS` format of `docs/formats/kvq.md`
//! ("Saved cells"). An engine writes it beside its own saved state (the cells' positions and
//! main rows) and loads it back into the cells it restores them to.

use half::f16;

use crate::{check_cells, Cell, Error, KvqCells, Result, CODED, DETACHED, SCRATCH, SINK, WIN};

/// The first bytes of saved cells.
pub const STATE_MAGIC: [u8; 8] = *b"KVCQCELS";
/// The version [`KvqCells::save`] writes and [`KvqCells::load`] reads.
pub const STATE_VERSION: u32 = 1;
/// Bytes of the trailing BLAKE3 checksum (of every byte before it).
const CHECKSUM: usize = 32;

/// A cell's format in saved cells.
const F_MAIN: u8 = 0;
const F_SINK: u8 = 1;
const F_WINDOW: u8 = 2;
const F_WINDOW_CODED: u8 = 3;

struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

struct In<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> In<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.b.len() - self.at < n {
            return Err(Error::corrupt(format!(
                "{what}: {n} bytes needed at offset {}, {} left",
                self.at,
                self.b.len() - self.at
            )));
        }
        self.at += n;
        Ok(&self.b[self.at - n..self.at])
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
}

/// One saved writer: its id (-1: a writer no sequence id names any more), whether its
/// centers are fixed, and the centers of the tensors that have them.
struct SavedWriter {
    id: i32,
    centered: bool,
    centers: Vec<Vec<f32>>,
}

impl KvqCells {
    /// Saves cells `cells` (in the engine's order) of sequence `seq` (-1: the engine saves
    /// every sequence): each cell's position, writer and format, its sink or window rows in
    /// every tensor, and its writers' centers, in the `KVCQCELS` format. The engine saves
    /// the cells' main rows itself. Between ubatches only. Errors: a cell out of range,
    /// given twice or never written; a call within a ubatch.
    pub fn save(&self, cells: &[u32], seq: i32) -> Result<Vec<u8>> {
        self.check_between_ubatches("save")?;
        if seq < -1 {
            return Err(Error::invalid(
                "seq",
                format!("{seq} (a sequence, or -1 for all)"),
            ));
        }
        self.check_written_cells(cells)?;
        let mut writers: Vec<u32> = Vec::new();
        let mut meta = Vec::with_capacity(cells.len());
        for &c in cells {
            let cell = self.cells[c as usize];
            let w = match writers.iter().position(|&s| s == cell.seq) {
                Some(w) => w,
                None => {
                    writers.push(cell.seq);
                    writers.len() - 1
                }
            };
            let format = if cell.flags & SINK != 0 {
                F_SINK
            } else if cell.flags & WIN != 0 && cell.flags & SCRATCH == 0 {
                if cell.flags & CODED != 0 {
                    F_WINDOW_CODED
                } else {
                    F_WINDOW
                }
            } else {
                // coded (a scratch row is coded in its own ubatch and read as main after it)
                F_MAIN
            };
            meta.push((cell, w as u32, format));
        }
        let mut out = Out(Vec::new());
        out.0.extend_from_slice(&STATE_MAGIC);
        out.u32(STATE_VERSION);
        out.u32(self.cfg.sink);
        out.u32(self.cfg.window);
        out.u8(self.cfg.window_bits);
        out.u32(self.tensors.len() as u32);
        for t in &self.tensors {
            let s = t.spec();
            out.u32(s.head_dim);
            out.u32(s.n_kv_head);
            out.u8(s.bits);
            out.u8(u8::from(s.center));
        }
        out.i32(seq);
        out.u32(writers.len() as u32);
        for &si in &writers {
            let s = &self.seqs[si as usize];
            out.i32(s.id);
            out.u8(u8::from(s.centered));
            if !s.centered {
                continue;
            }
            for (ti, t) in self.tensors.iter().enumerate() {
                if !t.spec().center {
                    continue;
                }
                let c = t.center(si).ok_or_else(|| Error::State {
                    why: format!(
                        "tensor {ti}: sequence {} is centered but has no center",
                        s.id
                    ),
                })?;
                for &v in c {
                    out.0.extend_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
        }
        out.u32(cells.len() as u32);
        for &(cell, w, format) in &meta {
            out.i32(cell.pos);
            out.u32(w);
            out.u8(format);
        }
        for t in &self.tensors {
            for &(cell, _, format) in &meta {
                match format {
                    F_SINK => out.0.extend_from_slice(t.sink_bytes(cell.slot)),
                    F_WINDOW | F_WINDOW_CODED => {
                        out.0.extend_from_slice(t.window_bytes((cell.slot, false))?)
                    }
                    _ => {}
                }
            }
        }
        let sum = blake3::hash(&out.0);
        out.0.extend_from_slice(sum.as_bytes());
        Ok(out.0)
    }

    /// Loads saved cells ([`save`](Self::save)) into cells `cells` (the engine's cells for
    /// the saved ones, in the saved order), whose positions the engine restored as `pos`.
    /// With `dest_seq >= 0` the saved sequence's cells become `dest_seq`'s (which takes its
    /// centers; cells of other writers keep theirs); with -1 every writer keeps its id (an
    /// engine that restores its whole cache, after [`clear`](Self::clear)). The engine
    /// loads the main rows itself. Between ubatches only. Errors (nothing changes): bytes
    /// that are not saved cells (corrupt), saved by cells of another configuration, or
    /// whose cells or positions are not the engine's.
    pub fn load(&mut self, bytes: &[u8], cells: &[u32], pos: &[i32], dest_seq: i32) -> Result<()> {
        self.check_between_ubatches("load")?;
        if dest_seq < -1 {
            return Err(Error::invalid(
                "dest_seq",
                format!("{dest_seq} (a sequence, or -1 for the saved ids)"),
            ));
        }
        if cells.len() != pos.len() {
            return Err(Error::invalid(
                "cells",
                format!("{} cells and {} positions", cells.len(), pos.len()),
            ));
        }
        check_cells(cells, self.cfg.n_cells)?;
        if bytes.len() < STATE_MAGIC.len() + 4 + CHECKSUM {
            return Err(Error::corrupt(format!(
                "{} bytes is shorter than any saved cells",
                bytes.len()
            )));
        }
        if bytes[..8] != STATE_MAGIC {
            return Err(Error::corrupt("the magic is not KVCQCELS"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        if version != STATE_VERSION {
            return Err(Error::corrupt(format!(
                "version {version}; this build reads version {STATE_VERSION}"
            )));
        }
        let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM);
        if blake3::hash(body).as_bytes() != sum {
            return Err(Error::corrupt("the checksum does not match"));
        }
        let mut r = In { b: body, at: 12 };
        let (sink, window, window_bits) = (r.u32("sink")?, r.u32("window")?, r.u8("window bits")?);
        let n_tensors = r.u32("tensors")?;
        let mut same = sink == self.cfg.sink
            && window == self.cfg.window
            && (window == 0 || window_bits == self.cfg.window_bits)
            && n_tensors as usize == self.tensors.len();
        if same {
            for t in &self.tensors {
                let s = t.spec();
                same &= r.u32("head_dim")? == s.head_dim
                    && r.u32("n_kv_head")? == s.n_kv_head
                    && r.u8("bits")? == s.bits
                    && r.u8("center")? == u8::from(s.center);
            }
        }
        if !same {
            return Err(Error::invalid(
                "state",
                format!(
                    "saved by cells with sink {sink}, window {window} at {window_bits} bits and {n_tensors} \
                     tensors (or other tensors); these have sink {}, window {} at {} bits and {} tensors",
                    self.cfg.sink,
                    self.cfg.window,
                    self.cfg.window_bits,
                    self.tensors.len()
                ),
            ));
        }
        let saved_seq = r.i32("sequence")?;
        if saved_seq < -1 {
            return Err(Error::corrupt(format!("saved sequence {saved_seq}")));
        }
        let n_writers = r.u32("writers")? as usize;
        if n_writers > cells.len() {
            return Err(Error::corrupt(format!(
                "{n_writers} writers for {} cells",
                cells.len()
            )));
        }
        let centered_tensors: Vec<usize> = (0..self.tensors.len())
            .filter(|&t| self.tensors[t].spec().center)
            .collect();
        let mut writers = Vec::with_capacity(n_writers);
        for w in 0..n_writers {
            let id = r.i32("writer id")?;
            let centered = match r.u8("writer centered")? {
                0 => false,
                1 => true,
                v => return Err(Error::corrupt(format!("writer {w}: centered is {v}"))),
            };
            if id < -1 || writers.iter().any(|x: &SavedWriter| id >= 0 && x.id == id) {
                return Err(Error::corrupt(format!("writer {w}: id {id}")));
            }
            let mut centers = Vec::new();
            if centered {
                for &t in &centered_tensors {
                    let width = self.tensors[t].width();
                    let raw = r.take(2 * width, "center")?;
                    centers.push(
                        raw.chunks_exact(2)
                            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                            .collect(),
                    );
                }
            }
            writers.push(SavedWriter {
                id,
                centered,
                centers,
            });
        }
        let n = r.u32("cells")? as usize;
        if n != cells.len() {
            return Err(Error::invalid(
                "cells",
                format!(
                    "the saved cells are {n}, the engine restores {}",
                    cells.len()
                ),
            ));
        }
        let mut meta = Vec::with_capacity(n);
        for (i, &engine_pos) in pos.iter().enumerate() {
            let (p, w, format) = (r.i32("position")?, r.u32("writer")?, r.u8("format")?);
            if p != engine_pos {
                return Err(Error::invalid(
                    "pos",
                    format!(
                        "saved cell {i} is at position {p}, the engine restores it at {engine_pos}"
                    ),
                ));
            }
            let writer = writers
                .get(w as usize)
                .ok_or_else(|| Error::corrupt(format!("cell {i}: writer {w} of {n_writers}")))?;
            let is_sink = i64::from(p) < i64::from(sink);
            let ok = match format {
                F_SINK => is_sink,
                F_WINDOW | F_WINDOW_CODED => !is_sink && window > 0,
                F_MAIN => !is_sink,
                _ => false,
            };
            if !ok {
                return Err(Error::corrupt(format!(
                    "cell {i}: format {format} at position {p} (sink {sink}, window {window})"
                )));
            }
            let coded = format == F_MAIN || format == F_WINDOW_CODED;
            if coded && window > 0 && !centered_tensors.is_empty() && !writer.centered {
                return Err(Error::corrupt(format!(
                    "cell {i}: a coded centered row whose writer {w} has no center"
                )));
            }
            meta.push((p, w, format));
        }
        let mut rows: Vec<Vec<&[u8]>> = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let (sink_bytes, win_bytes) = t.side_cell_bytes();
            let mut tr = Vec::new();
            for &(_, _, format) in &meta {
                match format {
                    F_SINK => tr.push(r.take(sink_bytes, "sink rows")?),
                    F_WINDOW | F_WINDOW_CODED => tr.push(r.take(win_bytes, "window rows")?),
                    _ => {}
                }
            }
            rows.push(tr);
        }
        if r.left() != 0 {
            return Err(Error::corrupt(format!(
                "{} bytes after the last row",
                r.left()
            )));
        }
        // everything checked: nothing below fails
        self.commit_ubatch();
        let mut created: Vec<u32> = Vec::with_capacity(writers.len());
        for wr in &writers {
            let id = if dest_seq < 0 {
                wr.id
            } else if wr.id == saved_seq || (saved_seq == -1 && writers.len() == 1) {
                dest_seq
            } else {
                DETACHED
            };
            if id >= 0 {
                self.detach_seq(id);
            }
            let si = self.fresh_seq(id, &created);
            self.seqs[si as usize].centered = wr.centered;
            for (k, &t) in centered_tensors.iter().enumerate() {
                self.tensors[t].set_center(si, wr.centers.get(k).cloned());
            }
            created.push(si);
        }
        let mut side = Vec::with_capacity(n);
        for (&c, &(p, w, format)) in cells.iter().zip(&meta) {
            self.release_cell(c as usize);
            let si = created[w as usize];
            let mut cell = Cell {
                pos: p,
                seq: si,
                ..Cell::EMPTY
            };
            match format {
                F_SINK => {
                    cell.flags = SINK;
                    cell.slot = self.sink_slots.alloc();
                }
                F_WINDOW | F_WINDOW_CODED => {
                    cell.flags = if format == F_WINDOW { WIN } else { WIN | CODED };
                    cell.slot = self.win_slots.alloc();
                    self.seqs[si as usize].held.push(c);
                }
                _ => cell.flags = CODED,
            }
            self.cells[c as usize] = cell;
            if format != F_MAIN {
                side.push((format, cell.slot));
            }
        }
        let (n_sink, n_win) = (self.sink_slots.len(), self.win_slots.len());
        for (t, tr) in self.tensors.iter_mut().zip(&rows) {
            t.reserve(n_sink, n_win, 0);
            for (&(format, slot), bytes) in side.iter().zip(tr) {
                if format == F_SINK {
                    t.put_sink(slot, bytes);
                } else {
                    t.put_window(slot, bytes);
                }
            }
        }
        Ok(())
    }
}
