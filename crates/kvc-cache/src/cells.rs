//! A llama.cpp-style cell table (position and sequence set per cell) that kvc keeps
//! beside the engine's, so that compaction of shared cells stays consistent.

use crate::error::{Error, Result};
use crate::plan::ReservePlan;

/// One cell: the token position it holds and the sequences that use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// Token position, or -1 when the cell is empty (llama.cpp's convention).
    pub pos: i32,
    /// Bit `s` set when sequence `s` uses the cell (sequence ids 0..63).
    pub seq_mask: u64,
}

impl Cell {
    /// An empty cell.
    pub const EMPTY: Cell = Cell {
        pos: -1,
        seq_mask: 0,
    };

    /// Whether the cell holds a token.
    pub fn is_used(&self) -> bool {
        self.pos >= 0 && self.seq_mask != 0
    }
}

/// `kv_size` cells shared by all layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellTable {
    cells: Vec<Cell>,
}

impl CellTable {
    /// The largest sequence id kvc's table tracks, plus one.
    pub const MAX_SEQ: i64 = 64;

    /// `kv_size` empty cells.
    pub fn new(kv_size: usize) -> CellTable {
        CellTable {
            cells: vec![Cell::EMPTY; kv_size],
        }
    }

    /// Cells.
    pub fn len(&self) -> usize {
        self.cells.len()
    }
    /// Whether there are no cells.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
    /// All cells.
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }
    /// Cell `i`.
    pub fn get(&self, i: usize) -> Option<Cell> {
        self.cells.get(i).copied()
    }

    fn check_cell(&self, i: usize) -> Result<()> {
        if i >= self.cells.len() {
            return Err(Error::InvalidCell {
                what: "cell index",
                value: i as i64,
                limit: self.cells.len() as i64,
            });
        }
        Ok(())
    }

    /// Records that cell `i` holds position `pos` of sequence `seq` (as `set_rows` writes
    /// the row and llama.cpp's `cells.pos_set` / `seq_add` record it).
    pub fn set(&mut self, i: usize, pos: i32, seq: i32) -> Result<()> {
        self.check_cell(i)?;
        if pos < 0 {
            return Err(Error::InvalidCell {
                what: "position",
                value: pos.into(),
                limit: i32::MAX.into(),
            });
        }
        if !(0..Self::MAX_SEQ).contains(&i64::from(seq)) {
            return Err(Error::InvalidCell {
                what: "sequence id",
                value: seq.into(),
                limit: Self::MAX_SEQ,
            });
        }
        let c = &mut self.cells[i];
        if c.pos != pos {
            *c = Cell { pos, seq_mask: 0 };
        }
        c.seq_mask |= 1u64 << seq;
        Ok(())
    }

    /// Empties cell `i`.
    pub fn clear(&mut self, i: usize) -> Result<()> {
        self.check_cell(i)?;
        self.cells[i] = Cell::EMPTY;
        Ok(())
    }

    /// A plan that keeps every used cell among the first `n` (llama.cpp defrag).
    pub fn keep_used_plan(&self, n: usize) -> Result<ReservePlan> {
        if n > self.cells.len() {
            return Err(Error::InvalidRange {
                start: 0,
                end: n,
                limit: self.cells.len(),
            });
        }
        let mask: Vec<bool> = self.cells[..n].iter().map(Cell::is_used).collect();
        Ok(ReservePlan::from_mask(&mask))
    }

    /// Applies `plan` to the table: kept cells move down in order, the rest become empty.
    pub fn compact(&mut self, plan: &ReservePlan) -> Result<()> {
        if plan.len() > self.cells.len() {
            return Err(Error::InvalidRange {
                start: 0,
                end: plan.len(),
                limit: self.cells.len(),
            });
        }
        for (src, dst, n) in plan.moves() {
            self.cells.copy_within(src..src + n, dst);
        }
        for c in &mut self.cells[plan.kept()..plan.len()] {
            *c = Cell::EMPTY;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_compact_and_errors() {
        let mut t = CellTable::new(6);
        for i in 0..5 {
            t.set(i, i as i32 * 10, 0).unwrap();
        }
        t.set(2, 20, 3).unwrap();
        t.clear(1).unwrap();
        t.clear(3).unwrap();
        let p = t.keep_used_plan(5).unwrap();
        assert_eq!(p.spans(), &[(0, 1), (2, 1), (4, 1)]);
        t.compact(&p).unwrap();
        let pos: Vec<i32> = t.cells().iter().map(|c| c.pos).collect();
        assert_eq!(pos, vec![0, 20, 40, -1, -1, -1]);
        assert_eq!(t.get(1).unwrap().seq_mask, 0b1001);
        assert!(t.set(6, 0, 0).is_err());
        assert!(t.set(0, -1, 0).is_err());
        assert!(t.set(0, 0, 64).is_err());
        assert!(t.keep_used_plan(7).is_err());
    }
}
