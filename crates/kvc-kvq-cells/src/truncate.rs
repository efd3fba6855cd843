//! Taking a sequence back (an engine's `seq_rm` of its last positions: a chat server reusing
//! a cached prompt, a rollback): whether the cells that stay read exactly as those of a
//! sequence that only ever processed them, and making them so.
//!
//! A fresh sequence whose last position is `n` reads a window row at `n + 1` for every
//! position after `n + 1 - window`, has fixed its centers only if a main row was due (a position `window` or
//! more before `n`), and codes each main row from the window row minus the center. The
//! cells that stay after a truncation hold the same main rows where a fresh sequence has
//! them, so they read the same when they also hold those window rows (positions that left
//! the window keep them `rollback` positions longer, [`KvqCells::set_rollback`]) and, where
//! the truncation took back every position a fresh sequence would have coded a main row
//! for, forget their centers and main rows (coded again, against a center of the new
//! rows, when due).

use crate::{Cell, KvqCells, CODED, DETACHED, SCRATCH, SINK, UBATCH, WIN};

/// What truncating one sequence entry does, once it is known to be exact.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// The sequence's entry.
    seq: u32,
    /// Every cell the last ubatch wrote for the sequence goes: that part is undone first.
    undo_first: bool,
    /// The sequence keeps part of the last ubatch: the ubatch is committed first.
    commit: bool,
    /// The centers are forgotten and the staying cells' main rows uncoded.
    uncenter: bool,
}

impl KvqCells {
    /// The entries `seq` names: its own (none if it never wrote), or every sequence's for -1.
    fn entries_of(&self, seq: i32) -> Vec<u32> {
        (0..self.seqs.len() as u32)
            .filter(|&si| {
                let id = self.seqs[si as usize].id;
                id != DETACHED && (seq < 0 || id == seq)
            })
            .collect()
    }

    /// What truncating entry `si` at `p0` does, or `None` when the cells that stay cannot
    /// read as a fresh sequence's (a window row they would need was dropped).
    fn plan_truncate(&self, si: u32, p0: i32) -> Option<Plan> {
        let undo = self.ubatch.undo.iter().find(|u| u.seq == si);
        let ub_pos: Vec<i32> = self
            .ubatch
            .tokens
            .iter()
            .filter(|&&(_, s, c)| {
                let cell = &self.cells[c as usize];
                s == si && cell.seq == si && cell.flags & UBATCH != 0
            })
            .map(|&(p, _, _)| p)
            .collect();
        let undo_first = undo.is_some() && !ub_pos.is_empty() && ub_pos.iter().all(|&p| p >= p0);
        let commit = undo.is_some() && ub_pos.iter().any(|&p| p < p0);
        if commit
            && self
                .tensors
                .iter()
                .any(|t| t.written() != self.ubatch.serial)
        {
            // an incomplete ubatch can only be dropped whole
            return None;
        }
        if !self.cells.iter().any(|c| c.seq == si && c.pos >= p0) {
            // nothing taken back
            return Some(Plan {
                seq: si,
                undo_first: false,
                commit: false,
                uncenter: false,
            });
        }
        // the cells that stay, as they are once the ubatch's part is undone
        let as_before = |c: usize| -> Cell {
            if undo_first {
                if let Some(&(_, before)) = undo
                    .expect("undo_first has an undo")
                    .cells
                    .iter()
                    .find(|&&(x, _)| x as usize == c)
                {
                    return before;
                }
            }
            self.cells[c]
        };
        let stay: Vec<Cell> = (0..self.cells.len())
            .filter(|&c| {
                let cell = &self.cells[c];
                cell.seq == si && cell.pos >= 0 && cell.pos < p0
            })
            .map(as_before)
            .collect();
        let centered = match (undo_first, undo) {
            (true, Some(u)) => u.centered,
            _ => self.seqs[si as usize].centered,
        };
        let Some(last) = stay.iter().map(|c| i64::from(c.pos)).max() else {
            // nothing stays: a fresh sequence has no centers
            return Some(Plan {
                seq: si,
                undo_first,
                commit,
                uncenter: centered,
            });
        };
        let w = i64::from(self.cfg.window);
        if w == 0 {
            // every row is a main or sink row, as in a fresh sequence
            return Some(Plan {
                seq: si,
                undo_first,
                commit,
                uncenter: false,
            });
        }
        // a fresh sequence has fixed its centers once a main row was due
        let coded_fresh = stay
            .iter()
            .any(|c| c.flags & SINK == 0 && i64::from(c.pos) <= last - w);
        let uncenter = centered && !coded_fresh;
        for c in &stay {
            let held = c.flags & WIN != 0 && c.flags & SCRATCH == 0;
            // the next position (`last + 1`) reads the window rows after `last + 1 - w`; the
            // rest read main rows, the same ones unless they are coded again
            let needed = i64::from(c.pos) > last + 1 - w || uncenter;
            if c.flags & SINK == 0 && needed && !held {
                return None;
            }
        }
        Some(Plan {
            seq: si,
            undo_first,
            commit,
            uncenter,
        })
    }

    fn apply_truncate(&mut self, plan: Plan, p0: i32) {
        let si = plan.seq;
        if plan.undo_first {
            let ub: Vec<u32> = self
                .ubatch
                .tokens
                .iter()
                .filter(|&&(_, s, c)| {
                    let cell = &self.cells[c as usize];
                    s == si && cell.seq == si && cell.flags & UBATCH != 0
                })
                .map(|&(_, _, c)| c)
                .collect();
            for c in ub {
                self.release_written(c as usize);
            }
        } else if plan.commit {
            self.commit_ubatch();
        }
        if !plan.uncenter {
            return;
        }
        // cells at or after p0 (the engine's to free, or kept for other sequences that
        // share them) keep reading their main rows against the centers they were coded
        // with: they move to a detached entry that holds them
        let going: Vec<usize> = (0..self.cells.len())
            .filter(|&c| self.cells[c].seq == si && self.cells[c].pos >= p0)
            .collect();
        if !going.is_empty() {
            let d = self.fresh_seq(DETACHED, &[si]);
            for t in &mut self.tensors {
                let center = t.center(si).map(<[f32]>::to_vec);
                t.set_center(d, center);
            }
            for c in going {
                self.cells[c].seq = d;
            }
        }
        for cell in self.cells.iter_mut() {
            if cell.seq == si && cell.flags & SINK == 0 {
                cell.flags &= !CODED;
            }
        }
        self.seqs[si as usize].centered = false;
        for t in &mut self.tensors {
            t.set_center(si, None);
        }
    }

    /// Whether [`truncate`](Self::truncate) of sequence `seq` (-1: every sequence) at
    /// position `p0` would succeed. Changes nothing.
    pub fn can_truncate(&self, seq: i32, p0: i32) -> bool {
        let p0 = p0.max(0);
        self.entries_of(seq)
            .into_iter()
            .all(|si| self.plan_truncate(si, p0).is_some())
    }

    /// Takes sequence `seq` (-1: every sequence) back to its positions before `p0`, before
    /// the engine frees its cells at `p0` and after ([`release`](Self::release)); returns
    /// whether the cells that stay read exactly as those of a sequence that processed only
    /// them (true), or nothing changed because a window row they would need was dropped
    /// (false: the engine processes those positions again, or keeps them). Exact whenever
    /// every position taken back is within [`rollback`](Self::rollback) of the sequence's
    /// last, or `p0 <= sink` (every window row gone with them), and always without a window.
    ///
    /// Cells at `p0` and after that the engine keeps for other sequences read as before.
    /// The last ubatch: taken back whole, it is undone as by [`drop_ubatch`](Self::drop_ubatch);
    /// taken back in part, it is committed (and refused if it is incomplete).
    pub fn truncate(&mut self, seq: i32, p0: i32) -> bool {
        let p0 = p0.max(0);
        let mut plans = Vec::new();
        for si in self.entries_of(seq) {
            match self.plan_truncate(si, p0) {
                Some(plan) => plans.push(plan),
                None => return false,
            }
        }
        // undo before any commit (which ends every sequence's undo)
        plans.sort_by_key(|p| !p.undo_first);
        for plan in plans {
            self.apply_truncate(plan, p0);
        }
        true
    }
}
