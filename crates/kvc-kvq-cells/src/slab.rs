//! Slot numbers with a free list: which sink or window slot a cell holds. Every tensor keeps
//! its rows of slot `s` at `s * row bytes` of its own storage ([`SlotRows`]).

/// Slot numbers, reused after release; the count ever handed out is the storage's length.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    next: u32,
    free: Vec<u32>,
    used: usize,
}

impl Slots {
    pub(crate) fn alloc(&mut self) -> u32 {
        self.used += 1;
        if let Some(s) = self.free.pop() {
            return s;
        }
        self.next += 1;
        self.next - 1
    }

    pub(crate) fn release(&mut self, slot: u32) {
        self.used -= 1;
        self.free.push(slot);
    }

    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// Slot numbers handed out so far (the storage's length in rows).
    pub(crate) fn len(&self) -> usize {
        self.next as usize
    }

    /// Slots 0..n in use, none free.
    pub(crate) fn with_used(n: u32) -> Slots {
        Slots {
            next: n,
            free: Vec::new(),
            used: n as usize,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        4 * self.free.capacity()
    }
}

/// One tensor's rows by slot: `row` bytes per slot, grown on demand.
#[derive(Debug)]
pub(crate) struct SlotRows {
    row: usize,
    data: Vec<u8>,
}

impl SlotRows {
    pub(crate) fn new(row: usize) -> SlotRows {
        SlotRows {
            row,
            data: Vec::new(),
        }
    }

    pub(crate) fn get(&self, slot: u32) -> &[u8] {
        let o = slot as usize * self.row;
        &self.data[o..o + self.row]
    }

    /// Grows the storage to exactly `n` slots (never more: the bytes held are the slots
    /// handed out times the row size, which the engine counts).
    pub(crate) fn reserve_slots(&mut self, n: usize) {
        let need = n * self.row;
        if self.data.len() < need {
            self.data.reserve_exact(need - self.data.len());
            self.data.resize(need, 0);
        }
    }

    /// Slot `slot`'s bytes, growing the storage to hold it.
    pub(crate) fn get_mut(&mut self, slot: u32) -> &mut [u8] {
        let o = slot as usize * self.row;
        if self.data.len() < o + self.row {
            self.data.resize(o + self.row, 0);
        }
        &mut self.data[o..o + self.row]
    }

    pub(crate) fn copy(&mut self, from: u32, to: u32) {
        let f = from as usize * self.row;
        self.get_mut(to);
        let t = to as usize * self.row;
        self.data.copy_within(f..f + self.row, t);
    }

    pub(crate) fn bytes(&self) -> usize {
        self.data.capacity()
    }

    /// Every slot's bytes (slot `s` at `s * row`).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    pub(crate) fn clear(&mut self) {
        self.data = Vec::new();
    }

    /// Keeps the storage, drops the rows, and lays rows of `row` bytes from now on.
    pub(crate) fn retarget(&mut self, row: usize) {
        self.data.clear();
        self.row = row;
    }

    /// Keeps only the rows `(old, new)` of `moves`, at their new slots 0..moves.len().
    pub(crate) fn compact(&mut self, moves: &[(u32, u32)]) {
        let mut data = vec![0; moves.len() * self.row];
        for &(old, new) in moves {
            let (o, n) = (old as usize * self.row, new as usize * self.row);
            if o + self.row <= self.data.len() {
                data[n..n + self.row].copy_from_slice(&self.data[o..o + self.row]);
            }
        }
        self.data = data;
    }
}
