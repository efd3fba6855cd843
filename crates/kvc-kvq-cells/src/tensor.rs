//! One tensor's side of the cells: its codecs, its sink and window rows by slot, its centers
//! by sequence, and the row arithmetic of writes and reads.

use half::f16;
use kvc_kvq::attention::HeadRows;
use kvc_kvq::config::DEFAULT_SEED;
use kvc_kvq::row::{poison_row as poison, row_scale_is_finite as scale_finite};
use kvc_kvq::{Method, RowCodec};

use crate::slab::SlotRows;
use crate::{CellsConfig, Error, Result, TensorSpec, MAX_QUERIES};

/// The largest head_dim.
const MAX_DIM: usize = 256;

/// `a . b` in f64 (eight running sums, vector lanes once compiled), rounded once. A center's
/// `q . c` is large beside the scores of rows coded against it, and every main row of the
/// query gets it: an f32 sum's rounding (about 1e-6 of it) would move those rows' logits
/// against the sink's and the window's. Measured in llama.cpp (50-llama's decode run): mean KL
/// 0.0090 with eight f32 sums, 0.0081 with one, 0.0076-0.0083 in f64; that run's 383 positions
/// move by up to about 15 % with arithmetic alone (docs/results/kvq-protected.md, "The
/// exponentials, understood"), so the reason for f64 is the rounding, not those numbers.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    for (xa, xb) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(xa).zip(xb) {
            *s += f64::from(x) * f64::from(y);
        }
    }
    (acc.iter().sum::<f64>() + tail) as f32
}

/// Scratch of `$need` f32 values for one tile call: on the stack in the smallest of three sizes
/// that holds them (only that one is cleared: a call per tile and KV head, so clearing a large
/// buffer each time shows in decode speed), else on the heap. The three names are the
/// caller's deferred locals.
macro_rules! scratch_f32 {
    ($need:expr, $s64:ident, $s256:ident, $s1024:ident, $large:ident) => {{
        let need: usize = $need;
        if need <= 64 {
            $s64 = [0f32; 64];
            &mut $s64[..need]
        } else if need <= 256 {
            $s256 = [0f32; 256];
            &mut $s256[..need]
        } else if need <= 1024 {
            $s1024 = [0f32; 1024];
            &mut $s1024[..need]
        } else {
            $large = vec![0f32; need];
            &mut $large[..]
        }
    }};
}

/// Weights per main-row kernel call (chunks of a tile when G x cells exceed it).
const RUN_SCRATCH: usize = 1024;

/// `q . c` of the last sequence's center seen in one tile (most tiles have one writer).
pub(crate) struct CenterDots {
    seq: Option<u32>,
    dots: [f32; MAX_QUERIES],
}

impl Default for CenterDots {
    fn default() -> CenterDots {
        CenterDots {
            seq: None,
            dots: [0.0; MAX_QUERIES],
        }
    }
}

/// Where a cell's values are held (for reading them back and storing new ones).
#[derive(Clone, Copy, Debug)]
pub(crate) enum StoredAs {
    /// The f16 sink row of this slot.
    Sink(u32),
    /// The window row of this lasting slot; whether the main row is coded too.
    Window(u32, bool),
    /// The main row; whether it is coded relative to the writer's center.
    Main(bool),
}

/// A center: its values (f16-exact) and the same rotated into the codes' basis.
type Center = (Vec<f32>, Vec<f32>);

#[derive(Debug)]
pub(crate) struct TensorRows {
    spec: TensorSpec,
    d: usize,
    h: usize,
    main: RowCodec,
    win: Option<RowCodec>,
    main_row: usize,
    win_row: usize,
    sink_rows: SlotRows,
    win_rows: SlotRows,
    /// The current ubatch's window rows that leave the window within it (by token), while this
    /// tensor holds one of the cache's two scratch buffers (K-side and V-side tensors take
    /// turns: the buffer moves to the next tensor of its side at its write).
    scratch_rows: SlotRows,
    /// `scratch_rows` decoded (`decode_row_for_multi`, slot-major: slot, head, value) when the
    /// window codec's multi-query kernels decode rows one at a time (8-bit windows): a
    /// prefill reads each scratch row once per query of the ubatch, so it is decoded once
    /// here, at its write, and the reads give the same sums bit for bit.
    scratch_vals: Vec<f32>,
    /// Whether the scratch keeps `scratch_vals`.
    mirror: bool,
    /// Whether `scratch_rows` holds this ubatch's rows (false once the buffer moved on).
    scratch_valid: bool,
    /// The sink rows rotated into the codes' basis (slot-major: slot, head, value), made at a
    /// prefill's write (every query of the ubatch reads every sink row) and dropped with the
    /// scratch or at any change of a sink row; empty when not made.
    sink_vals: Vec<f32>,
    centers: Vec<Option<Center>>,
    written: u64,
}

impl TensorRows {
    pub(crate) fn new(spec: TensorSpec, cfg: &CellsConfig) -> Result<TensorRows> {
        let d = spec.head_dim as usize;
        let h = spec.n_kv_head as usize;
        if h == 0 {
            return Err(Error::invalid("n_kv_head", "0 KV heads"));
        }
        let main = RowCodec::new(Method::LloydMax, spec.bits, d, DEFAULT_SEED)?;
        let win = if cfg.window > 0 {
            Some(RowCodec::new(
                Method::LloydMax,
                cfg.window_bits,
                d,
                DEFAULT_SEED,
            )?)
        } else {
            None
        };
        let main_row = main.row_bytes();
        let win_row = win.as_ref().map_or(0, RowCodec::row_bytes);
        let mirror = win.as_ref().is_some_and(RowCodec::multi_decodes_rows);
        (cfg.n_cells as usize)
            .checked_mul(h)
            .and_then(|r| r.checked_mul(main_row))
            .ok_or_else(|| Error::invalid("n_cells", "the main tensor's size overflows"))?;
        Ok(TensorRows {
            spec,
            d,
            h,
            main,
            win,
            main_row,
            win_row,
            sink_rows: SlotRows::new(h * d * 2),
            win_rows: SlotRows::new(h * win_row),
            scratch_rows: SlotRows::new(h * win_row),
            scratch_vals: Vec::new(),
            mirror,
            scratch_valid: false,
            sink_vals: Vec::new(),
            centers: Vec::new(),
            written: 0,
        })
    }

    pub(crate) fn spec(&self) -> &TensorSpec {
        &self.spec
    }

    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    pub(crate) fn set_written(&mut self, serial: u64) {
        self.written = serial;
    }

    pub(crate) fn main_cell_bytes(&self) -> usize {
        self.h * self.main_row
    }

    /// Values per cell (`n_kv_head * head_dim`).
    pub(crate) fn width(&self) -> usize {
        self.h * self.d
    }

    pub(crate) fn bytes(&self) -> usize {
        self.sink_rows.bytes()
            + self.win_rows.bytes()
            + self.scratch_rows.bytes()
            + 4 * self.scratch_vals.capacity()
            + 4 * self.sink_vals.capacity()
            + self
                .centers
                .iter()
                .map(|c| {
                    std::mem::size_of::<Option<Center>>()
                        + c.as_ref()
                            .map_or(0, |(a, b)| 4 * (a.capacity() + b.capacity()))
                })
                .sum::<usize>()
    }

    /// Bytes one sequence's full sink (`sink` f16 rows) and window (`window` rows) and its
    /// center hold in this tensor (see `KvqCells::seq_bytes`).
    pub(crate) fn seq_bytes(&self, sink: usize, window: usize) -> usize {
        let rows = sink * self.h * self.d * 2
            + if self.win.is_some() {
                window * self.h * self.win_row
            } else {
                0
            };
        let center = std::mem::size_of::<Option<Center>>()
            + if self.spec.center {
                4 * 2 * self.h * self.d
            } else {
                0
            };
        rows + center
    }

    /// Forgets every row and center; keeps the write count (the next ubatch follows).
    pub(crate) fn clear(&mut self) {
        self.sink_rows.clear();
        self.win_rows.clear();
        self.scratch_rows.clear();
        self.scratch_vals = Vec::new();
        self.scratch_valid = false;
        self.sink_vals = Vec::new();
        self.centers.clear();
    }

    pub(crate) fn check_main(&self, len: usize, n_cells: u32) -> Result<()> {
        let need = n_cells as usize * self.main_cell_bytes();
        if len < need {
            return Err(Error::invalid(
                "main",
                format!("{len} bytes; n_cells * main_cell_bytes is {need}"),
            ));
        }
        Ok(())
    }

    pub(crate) fn check_rows(&self, len: usize, n_tokens: usize) -> Result<()> {
        if len != n_tokens * self.width() {
            return Err(Error::invalid(
                "rows",
                format!(
                    "{len} values for {n_tokens} tokens of {} (n_kv_head x head_dim)",
                    self.width()
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn store_sink(&mut self, slot: u32, x: &[f32]) {
        self.sink_vals.clear();
        let out = self.sink_rows.get_mut(slot);
        for (o, &v) in out.chunks_exact_mut(2).zip(x) {
            o.copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }

    /// Sizes the storage exactly for the slots handed out (sink, window) and the ubatch's
    /// scratch rows, before a write stores into them.
    pub(crate) fn reserve(&mut self, sink_slots: usize, win_slots: usize, scratch: usize) {
        self.sink_rows.reserve_slots(sink_slots);
        if self.win.is_some() {
            self.win_rows.reserve_slots(win_slots);
            if scratch > 0 {
                self.scratch_rows.reserve_slots(scratch);
                if self.mirror {
                    let need = scratch * self.h * self.d;
                    if self.scratch_vals.len() < need {
                        self.scratch_vals
                            .reserve_exact(need - self.scratch_vals.len());
                        self.scratch_vals.resize(need, 0.0);
                    }
                }
                self.scratch_valid = true;
            }
        }
    }

    /// Gives up the scratch buffer (to the next tensor of its side, or to be freed).
    pub(crate) fn take_scratch(&mut self) -> (SlotRows, Vec<f32>) {
        self.scratch_valid = false;
        let row = self.h * self.win_row;
        (
            std::mem::replace(&mut self.scratch_rows, SlotRows::new(row)),
            std::mem::take(&mut self.scratch_vals),
        )
    }

    /// Takes a scratch buffer for this ubatch's rows (its storage reused, rows re-laid).
    pub(crate) fn give_scratch(&mut self, (mut buf, mut vals): (SlotRows, Vec<f32>)) {
        buf.retarget(self.h * self.win_row);
        vals.clear();
        self.scratch_rows = buf;
        self.scratch_vals = vals;
        self.scratch_valid = false;
    }

    /// Frees the scratch (a ubatch that needs none: decoding), and the rotated sink rows.
    pub(crate) fn free_scratch(&mut self) {
        self.scratch_rows.clear();
        self.scratch_vals = Vec::new();
        self.scratch_valid = false;
        self.sink_vals = Vec::new();
    }

    /// Rotates the sink rows of slots `0..n_slots` once for a prefill's reads (`sink_vals`).
    pub(crate) fn rotate_sinks(&mut self, n_slots: usize) {
        let width = self.h * self.d;
        let mut vals = std::mem::take(&mut self.sink_vals);
        vals.clear();
        vals.resize(n_slots * width, 0.0);
        for (slot, v) in vals.chunks_exact_mut(width).enumerate() {
            for (hd, out) in v.chunks_exact_mut(self.d).enumerate() {
                self.sink_rotated(slot as u32, hd as u32, out);
            }
        }
        self.sink_vals = vals;
    }

    /// Sink row `slot`, head `kv_head`, rotated: from `sink_vals` when made, else computed.
    fn sink_row<'a>(&'a self, slot: u32, kv_head: u32, buf: &'a mut [f32; MAX_DIM]) -> &'a [f32] {
        let start = (slot as usize * self.h + kv_head as usize) * self.d;
        match self.sink_vals.get(start..start + self.d) {
            Some(v) => v,
            None => {
                self.sink_rotated(slot, kv_head, &mut buf[..self.d]);
                &buf[..self.d]
            }
        }
    }

    pub(crate) fn compact_window(&mut self, moves: &[(u32, u32)]) {
        self.win_rows.compact(moves);
    }

    pub(crate) fn window_bytes(&self, (slot, scratch): (u32, bool)) -> Result<&[u8]> {
        if scratch {
            if !self.scratch_valid {
                return Err(Error::State {
                    why: "a window row of this ubatch's scratch was read after the scratch moved to the next \
                          tensor's write: read each tensor before writing the next one of its side (K or V)"
                        .into(),
                });
            }
            Ok(self.scratch_rows.get(slot))
        } else {
            Ok(self.win_rows.get(slot))
        }
    }

    pub(crate) fn store_window(&mut self, slot: u32, scratch: bool, x: &[f32]) {
        let win = self.win.as_ref().expect("a window codec with a window");
        let out = if scratch {
            self.scratch_rows.get_mut(slot)
        } else {
            self.win_rows.get_mut(slot)
        };
        for (xr, o) in x
            .chunks_exact(self.d)
            .zip(out.chunks_exact_mut(self.win_row))
        {
            if win.quantize_row(xr, o).is_err() {
                poison(o);
            }
        }
        if scratch && self.mirror {
            let width = self.h * self.d;
            let vals = &mut self.scratch_vals[slot as usize * width..(slot as usize + 1) * width];
            for (o, v) in out
                .chunks_exact(self.win_row)
                .zip(vals.chunks_exact_mut(self.d))
            {
                if win.decode_row_for_multi(o, v).is_err() {
                    v.fill(f32::NAN);
                }
            }
        }
    }

    /// The decoded scratch rows of slots `slot ..`, head `kv_head` (stride `h * d`), when the
    /// scratch keeps them.
    fn scratch_decoded(&self, slot: u32, kv_head: u32) -> Option<&[f32]> {
        if !self.mirror || !self.scratch_valid {
            return None;
        }
        let start = (slot as usize * self.h + kv_head as usize) * self.d;
        self.scratch_vals.get(start..)
    }

    pub(crate) fn store_main(&self, cell: u32, x: &[f32], main: &mut [u8]) {
        let off = cell as usize * self.main_cell_bytes();
        let out = &mut main[off..off + self.main_cell_bytes()];
        for (xr, o) in x
            .chunks_exact(self.d)
            .zip(out.chunks_exact_mut(self.main_row))
        {
            if self.main.quantize_row(xr, o).is_err() {
                poison(o);
            }
        }
    }

    pub(crate) fn center(&self, seq: u32) -> Option<&[f32]> {
        self.centers
            .get(seq as usize)
            .and_then(|c| c.as_ref())
            .map(|(c, _)| c.as_slice())
    }

    fn center_rotated(&self, seq: u32) -> Result<&[f32]> {
        self.centers
            .get(seq as usize)
            .and_then(|c| c.as_ref())
            .map(|(_, r)| r.as_slice())
            .ok_or_else(|| Error::State {
                why: format!("sequence index {seq} has centered rows but no center"),
            })
    }

    /// Fixes sequence `seq`'s center from the window rows of `slots`: per KV head and
    /// channel, the mean (f64, rounded to f16) of the finite decoded values (zero if none).
    pub(crate) fn fix_center(&mut self, seq: u32, slots: &[(u32, bool)]) -> Result<()> {
        let win = self.win.as_ref().expect("a window codec with a center");
        let width = self.width();
        let mut sum = vec![0f64; width];
        let mut count = vec![0u32; width];
        let mut buf = [0f32; MAX_DIM];
        for &s in slots {
            for (hd, wr) in self.window_bytes(s)?.chunks_exact(self.win_row).enumerate() {
                if !scale_finite(wr) {
                    continue;
                }
                win.dequantize_row(wr, &mut buf[..self.d])?;
                for (e, &v) in buf[..self.d].iter().enumerate() {
                    if v.is_finite() {
                        sum[hd * self.d + e] += f64::from(v);
                        count[hd * self.d + e] += 1;
                    }
                }
            }
        }
        let center: Vec<f32> = sum
            .iter()
            .zip(&count)
            .map(|(&s, &n)| {
                if n == 0 {
                    0.0
                } else {
                    f16::from_f64(s / f64::from(n)).to_f32()
                }
            })
            .collect();
        self.set_center(seq, Some(center));
        Ok(())
    }

    /// Codes cell `cell`'s main rows from window slot `slot` (minus sequence `seq`'s center
    /// when this tensor has centers).
    pub(crate) fn code_main(
        &self,
        cell: u32,
        slot: (u32, bool),
        seq: u32,
        main: &mut [u8],
    ) -> Result<()> {
        let win = self.win.as_ref().expect("a window codec with a window");
        let center = if self.spec.center {
            Some(self.center(seq).ok_or_else(|| Error::State {
                why: format!("sequence index {seq} codes a centered row before its center"),
            })?)
        } else {
            None
        };
        let off = cell as usize * self.main_cell_bytes();
        let mut buf = [0f32; MAX_DIM];
        let src = self.window_bytes(slot)?;
        for (hd, (wr, o)) in src
            .chunks_exact(self.win_row)
            .zip(main[off..off + self.main_cell_bytes()].chunks_exact_mut(self.main_row))
            .enumerate()
        {
            if !scale_finite(wr) {
                poison(o);
                continue;
            }
            let b = &mut buf[..self.d];
            win.dequantize_row(wr, b)?;
            if let Some(c) = center {
                for (v, &m) in b.iter_mut().zip(&c[hd * self.d..(hd + 1) * self.d]) {
                    *v -= m;
                }
            }
            if self.main.quantize_row(b, o).is_err() {
                poison(o);
            }
        }
        Ok(())
    }

    fn main_rows<'a>(&self, main: &'a [u8], kv_head: u32, cell0: u32) -> HeadRows<'a> {
        let off = cell0 as usize * self.main_cell_bytes() + kv_head as usize * self.main_row;
        HeadRows {
            bytes: &main[off..],
            stride: self.main_cell_bytes(),
        }
    }

    pub(crate) fn main_scores(
        &self,
        main: &[u8],
        kv_head: u32,
        cell0: u32,
        n: usize,
        q_rot: &[f32],
        scores: &mut [f32],
    ) -> Result<()> {
        Ok(self
            .main
            .dot_rows_multi(q_rot, self.main_rows(main, kv_head, cell0), n, scores)?)
    }

    /// `q . c` of sequence `seq`'s center for each of the `g` queries (cached in `qc`).
    pub(crate) fn center_dots<'q>(
        &self,
        qc: &'q mut CenterDots,
        seq: u32,
        kv_head: u32,
        q_rot: &[f32],
        g: usize,
    ) -> Result<&'q [f32]> {
        if qc.seq != Some(seq) {
            let hd = kv_head as usize;
            let cr = &self.center_rotated(seq)?[hd * self.d..(hd + 1) * self.d];
            for (j, v) in qc.dots[..g].iter_mut().enumerate() {
                *v = dot(&q_rot[j * self.d..(j + 1) * self.d], cr);
            }
            qc.seq = Some(seq);
        }
        Ok(&qc.dots[..g])
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_center_scores(
        &self,
        qc: &mut CenterDots,
        seq: u32,
        kv_head: u32,
        q_rot: &[f32],
        g: usize,
        scores: &mut [f32],
        n: usize,
        i: usize,
    ) -> Result<()> {
        let dots = self.center_dots(qc, seq, kv_head, q_rot, g)?;
        for (j, &dj) in dots.iter().enumerate() {
            scores[j * n + i] += dj;
        }
        Ok(())
    }

    /// Window rows of slots `slot.0 .. slot.0 + len` (all lasting or all in the scratch),
    /// head `kv_head`, as the kernels' strided rows: one call for a run of window cells.
    fn window_run(
        &self,
        (slot, scratch): (u32, bool),
        kv_head: u32,
        len: usize,
    ) -> Result<HeadRows<'_>> {
        let stride = self.h * self.win_row;
        let store = if scratch {
            if !self.scratch_valid {
                return Err(Error::State {
                    why: "a window row of this ubatch's scratch was read after the scratch moved to the next \
                          tensor's write: read each tensor before writing the next one of its side (K or V)"
                        .into(),
                });
            }
            &self.scratch_rows
        } else {
            &self.win_rows
        };
        let start = slot as usize * stride + kv_head as usize * self.win_row;
        let bytes = store
            .as_bytes()
            .get(start..start + (len - 1) * stride + self.win_row)
            .ok_or_else(|| Error::State {
                why: format!(
                    "window slots {slot}..{} are beyond their store",
                    slot as usize + len
                ),
            })?;
        Ok(HeadRows { bytes, stride })
    }

    /// Scores of a run of `len` window cells at tile positions `i .. i + len` whose rows are
    /// consecutive slots from `slot` (decoding lays the window's rows out so: one kernel call).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window_scores_run(
        &self,
        slot: (u32, bool),
        kv_head: u32,
        q_rot: &[f32],
        g: usize,
        scores: &mut [f32],
        n: usize,
        i: usize,
        len: usize,
    ) -> Result<()> {
        let win = self.win.as_ref().expect("a window codec with window rows");
        let (mut s64, mut s256, mut s1024, mut large): (
            [f32; 64],
            [f32; 256],
            [f32; 1024],
            Vec<f32>,
        );
        let tmp = scratch_f32!(g * len, s64, s256, s1024, large);
        match self.scratch_decoded(slot.0, kv_head).filter(|_| slot.1) {
            Some(vals) => win.dot_decoded_multi(q_rot, vals, self.h * self.d, len, tmp)?,
            None => win.dot_rows_multi(q_rot, self.window_run(slot, kv_head, len)?, len, tmp)?,
        }
        for j in 0..g {
            scores[j * n + i..j * n + i + len].copy_from_slice(&tmp[j * len..(j + 1) * len]);
        }
        Ok(())
    }

    /// Adds window cell `i`'s row (slot `slot`) weighted by its `g` weights to the sums: one
    /// row per call, in cell order (see `KvqCells::accumulate`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window_accumulate(
        &self,
        slot: (u32, bool),
        kv_head: u32,
        w: &[f32],
        g: usize,
        acc: &mut [f32],
        n: usize,
        i: usize,
    ) -> Result<()> {
        let win = self.win.as_ref().expect("a window codec with window rows");
        let mut wi = [0f32; MAX_QUERIES];
        for (j, v) in wi[..g].iter_mut().enumerate() {
            *v = w[j * n + i];
        }
        match self.scratch_decoded(slot.0, kv_head).filter(|_| slot.1) {
            Some(vals) => win.accumulate_decoded_multi(&wi[..g], vals, self.h * self.d, 1, acc)?,
            None => {
                win.accumulate_rows_multi(&wi[..g], self.window_run(slot, kv_head, 1)?, 1, acc)?
            }
        }
        Ok(())
    }

    /// Sink row of `slot`, head `kv_head`, rotated into the codes' basis.
    fn sink_rotated(&self, slot: u32, kv_head: u32, out: &mut [f32]) {
        let hd = kv_head as usize;
        let bytes = &self.sink_rows.get(slot)[hd * self.d * 2..(hd + 1) * self.d * 2];
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
        self.main.rotation().rotate(out);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sink_scores(
        &self,
        slot: u32,
        kv_head: u32,
        q_rot: &[f32],
        g: usize,
        scores: &mut [f32],
        n: usize,
        i: usize,
    ) {
        let mut buf = [0f32; MAX_DIM];
        let row = self.sink_row(slot, kv_head, &mut buf);
        for j in 0..g {
            scores[j * n + i] = dot(&q_rot[j * self.d..(j + 1) * self.d], row);
        }
    }

    /// The main rows' weighted sum, cells for which `side(i)` holds weighted 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn main_accumulate(
        &self,
        main: &[u8],
        kv_head: u32,
        cell0: u32,
        n: usize,
        w: &[f32],
        g: usize,
        acc: &mut [f32],
        side: impl Fn(usize) -> bool,
    ) -> Result<()> {
        if !(0..n).any(&side) {
            // main rows only (most tiles): the weights as they are
            return Ok(self.main.accumulate_rows_multi(
                &w[..g * n],
                self.main_rows(main, kv_head, cell0),
                n,
                acc,
            )?);
        }
        // weights in chunks of RUN_SCRATCH values (a tile of an engine's attention fits in
        // one; the buffer is not cleared per call: every value used is written first)
        let per = (RUN_SCRATCH / g).max(1);
        let (mut s64, mut s256, mut s1024, mut large): (
            [f32; 64],
            [f32; 256],
            [f32; 1024],
            Vec<f32>,
        );
        let wm = scratch_f32!(g * per.min(n), s64, s256, s1024, large);
        let mut i0 = 0;
        while i0 < n {
            let m = per.min(n - i0);
            for i in 0..m {
                let s = side(i0 + i);
                for j in 0..g {
                    wm[j * m + i] = if s { 0.0 } else { w[j * n + i0 + i] };
                }
            }
            self.main.accumulate_rows_multi(
                &wm[..g * m],
                self.main_rows(main, kv_head, cell0 + i0 as u32),
                m,
                acc,
            )?;
            i0 += m;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_center_values(
        &self,
        seq: u32,
        kv_head: u32,
        w: &[f32],
        g: usize,
        acc: &mut [f32],
        n: usize,
        i: usize,
    ) -> Result<()> {
        let hd = kv_head as usize;
        let cr = &self.center_rotated(seq)?[hd * self.d..(hd + 1) * self.d];
        for j in 0..g {
            let wj = w[j * n + i];
            for (a, &v) in acc[j * self.d..(j + 1) * self.d].iter_mut().zip(cr) {
                *a += wj * v;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sink_accumulate(
        &self,
        slot: u32,
        kv_head: u32,
        w: &[f32],
        g: usize,
        acc: &mut [f32],
        n: usize,
        i: usize,
    ) {
        let mut buf = [0f32; MAX_DIM];
        let row = self.sink_row(slot, kv_head, &mut buf);
        for j in 0..g {
            let wj = w[j * n + i];
            if wj == 0.0 {
                continue;
            }
            for (a, &v) in acc[j * self.d..(j + 1) * self.d].iter_mut().zip(row) {
                *a += wj * v;
            }
        }
    }

    /// A cell's values (`width` f32) as its format holds them: its f16 sink row, its window
    /// row, or its main row plus the writer's center (`centered`: the main row was coded
    /// relative to it).
    pub(crate) fn cell_values(
        &self,
        cell: u32,
        fmt: StoredAs,
        seq: u32,
        main: &[u8],
        out: &mut [f32],
    ) -> Result<()> {
        match fmt {
            StoredAs::Sink(slot) => {
                for (o, b) in out.iter_mut().zip(self.sink_rows.get(slot).chunks_exact(2)) {
                    *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            StoredAs::Window(slot, _) => {
                let win = self.win.as_ref().expect("a window codec with a window");
                for (wr, o) in self
                    .win_rows
                    .get(slot)
                    .chunks_exact(self.win_row)
                    .zip(out.chunks_exact_mut(self.d))
                {
                    win.dequantize_row(wr, o)?;
                }
            }
            StoredAs::Main(centered) => {
                let off = cell as usize * self.main_cell_bytes();
                for (mr, o) in main[off..off + self.main_cell_bytes()]
                    .chunks_exact(self.main_row)
                    .zip(out.chunks_exact_mut(self.d))
                {
                    self.main.dequantize_row(mr, o)?;
                }
                if centered && self.spec.center {
                    let c = self.center_of_seq(seq)?;
                    for (v, &m) in out.iter_mut().zip(c) {
                        *v += m;
                    }
                }
            }
        }
        Ok(())
    }

    /// Stores new values of a cell in the format it has: the f16 sink row; the window row
    /// (and, once the main row is coded, the main row again from it); or the main row
    /// (relative to the writer's center when `centered`).
    pub(crate) fn store_cell_values(
        &mut self,
        cell: u32,
        fmt: StoredAs,
        seq: u32,
        main: &mut [u8],
        x: &[f32],
    ) -> Result<()> {
        match fmt {
            StoredAs::Sink(slot) => self.store_sink(slot, x),
            StoredAs::Window(slot, coded) => {
                self.store_window(slot, false, x);
                if coded {
                    self.code_main(cell, (slot, false), seq, main)?;
                }
            }
            StoredAs::Main(centered) => {
                if centered && self.spec.center {
                    let c = self.center_of_seq(seq)?.to_vec();
                    let y: Vec<f32> = x.iter().zip(&c).map(|(v, m)| v - m).collect();
                    self.store_main(cell, &y, main);
                } else {
                    self.store_main(cell, x, main);
                }
            }
        }
        Ok(())
    }

    fn center_of_seq(&self, seq: u32) -> Result<&[f32]> {
        self.center(seq).ok_or_else(|| Error::State {
            why: format!("sequence index {seq} has centered rows but no center"),
        })
    }

    /// Bytes of one cell's sink rows (f16) and of its window rows.
    pub(crate) fn side_cell_bytes(&self) -> (usize, usize) {
        (self.h * self.d * 2, self.h * self.win_row)
    }

    pub(crate) fn sink_bytes(&self, slot: u32) -> &[u8] {
        self.sink_rows.get(slot)
    }

    /// Stores a cell's sink rows as saved (f16 bytes).
    pub(crate) fn put_sink(&mut self, slot: u32, bytes: &[u8]) {
        self.sink_vals.clear();
        self.sink_rows.get_mut(slot).copy_from_slice(bytes);
    }

    /// Stores a cell's window rows as saved (window-format bytes).
    pub(crate) fn put_window(&mut self, slot: u32, bytes: &[u8]) {
        if self.win.is_some() {
            self.win_rows.get_mut(slot).copy_from_slice(bytes);
        }
    }

    /// Sets (or with `None` forgets) sequence `seq`'s center (f16-exact values).
    pub(crate) fn set_center(&mut self, seq: u32, center: Option<Vec<f32>>) {
        if self.centers.len() <= seq as usize {
            if center.is_none() {
                return;
            }
            self.centers.resize(seq as usize + 1, None);
        }
        self.centers[seq as usize] = center.map(|c| {
            let mut rotated = c.clone();
            for r in rotated.chunks_exact_mut(self.d) {
                self.main.rotation().rotate(r);
            }
            (c, rotated)
        });
    }

    pub(crate) fn copy_sink(&mut self, from: u32, to: u32) {
        self.sink_vals.clear();
        self.sink_rows.copy(from, to);
    }

    pub(crate) fn copy_window(&mut self, from: u32, to: u32) {
        if self.win.is_some() {
            self.win_rows.copy(from, to);
        }
    }

    pub(crate) fn copy_center(&mut self, from: u32, to: u32) {
        let c = self.centers.get(from as usize).cloned().flatten();
        if c.is_some() {
            if self.centers.len() <= to as usize {
                self.centers.resize(to as usize + 1, None);
            }
            self.centers[to as usize] = c;
        }
    }
}
