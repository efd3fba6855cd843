//! Static canonical Huffman codes: length-limited construction, the compact table encoding of
//! the model section, encode codes and single-lookup decode tables.

use crate::error::{Error, Result};

/// Longest code length; a decode table has `1 << MAX_LEN` entries.
pub const MAX_LEN: u32 = 9;
/// Entries in one decode table.
pub const DECODE_ENTRIES: usize = 1 << MAX_LEN;
/// The longest code length any coder mode uses (the shared-shape mode's limit).
pub const MAX_LEN_ANY: u32 = 11;

/// Reusable buffers for [`build_lengths`].
#[derive(Default, Debug)]
pub struct LengthBuilder {
    leaves: Vec<(u32, u16)>,
    weight: Vec<u64>,
    parent: Vec<u32>,
}

impl LengthBuilder {
    /// Writes Huffman code lengths (0 = unused symbol) for `counts` into `lens`, limited to
    /// [`MAX_LEN`] bits. A single used symbol gets length 1.
    pub fn build_lengths(&mut self, counts: &[u32], lens: &mut [u8]) {
        self.build_lengths_limited(counts, lens, MAX_LEN)
    }

    /// [`LengthBuilder::build_lengths`] with the limit `max_len` (1..=[`MAX_LEN_ANY`]).
    pub fn build_lengths_limited(&mut self, counts: &[u32], lens: &mut [u8], max_len: u32) {
        self.build_lengths_over(counts, 0..counts.len(), lens, max_len)
    }

    /// [`LengthBuilder::build_lengths_limited`] when every nonzero count is at one of the
    /// ascending symbols `syms`: only those are visited (the result is the same).
    pub fn build_lengths_of(
        &mut self,
        counts: &[u32],
        syms: &[u32],
        lens: &mut [u8],
        max_len: u32,
    ) {
        self.build_lengths_over(counts, syms.iter().map(|&s| s as usize), lens, max_len)
    }

    /// The lengths for the nonzero counts among the ascending symbols `syms` (zero for every
    /// other symbol).
    fn build_lengths_over(
        &mut self,
        counts: &[u32],
        syms: impl Iterator<Item = usize>,
        lens: &mut [u8],
        max_len: u32,
    ) {
        lens.fill(0);
        self.leaves.clear();
        // Room for every symbol of the alphabet: buffers never grow in steady state.
        self.leaves.reserve(counts.len());
        self.weight.reserve(2 * counts.len());
        self.parent.reserve(2 * counts.len());
        for s in syms {
            if let Some(&c) = counts.get(s).filter(|&&c| c > 0) {
                self.leaves.push((c, s as u16));
            }
        }
        let n = self.leaves.len();
        if n == 0 {
            return;
        }
        if n == 1 {
            lens[self.leaves[0].1 as usize] = 1;
            return;
        }
        self.leaves.sort_unstable();
        // Two-queue Huffman: nodes 0..n are leaves (ascending), n.. are internal nodes in
        // creation order (also ascending).
        self.weight.clear();
        self.weight
            .extend(self.leaves.iter().map(|&(c, _)| c as u64));
        self.parent.clear();
        self.parent.resize(2 * n - 1, 0);
        let (mut li, mut ii) = (0usize, n);
        for _ in 0..n - 1 {
            let mut pick = |weight: &Vec<u64>| {
                let total = weight.len();
                if li < n && (ii >= total || weight[li] <= weight[ii]) {
                    li += 1;
                    li - 1
                } else {
                    ii += 1;
                    ii - 1
                }
            };
            let a = pick(&self.weight);
            let b = pick(&self.weight);
            let id = self.weight.len();
            let w = self.weight[a] + self.weight[b];
            self.weight.push(w);
            self.parent[a] = id as u32;
            self.parent[b] = id as u32;
        }
        // Depths: the root is the last node; parents always have larger ids.
        let root = 2 * n - 2;
        let depth = vec_depth(&mut self.weight, 2 * n - 1);
        depth[root] = 0;
        for i in (0..root).rev() {
            depth[i] = depth[self.parent[i] as usize] + 1;
        }
        // Length limiting on the counts per length (no per-symbol search): clamp, then
        // while the code is over-full move one code from the longest length below the limit
        // one level down; then spend any slack shortening codes, shortest lengths first.
        // Lengths are finally dealt out by frequency (most frequent symbol, shortest code),
        // which for an unclamped Huffman tree gives back its own depths.
        let limit = 1u64 << max_len;
        let max = max_len as usize;
        let mut count = [0u64; MAX_LEN_ANY as usize + 1];
        for &d in &depth[..n] {
            count[(d as usize).min(max)] += 1;
        }
        let mut kraft: u64 = (1..=max).map(|l| count[l] << (max - l)).sum();
        while kraft > limit {
            let Some(l) = (1..max).rev().find(|&l| count[l] > 0) else {
                break;
            };
            count[l] -= 1;
            count[l + 1] += 1;
            kraft -= limit >> (l + 1);
        }
        for l in 2..=max {
            while count[l] > 0 && kraft + (limit >> l) <= limit {
                count[l] -= 1;
                count[l - 1] += 1;
                kraft += limit >> l;
            }
        }
        let mut l = 1;
        for &(_, s) in self.leaves.iter().rev() {
            while count[l] == 0 {
                l += 1;
            }
            count[l] -= 1;
            lens[s as usize] = l as u8;
        }
    }
}

fn vec_depth(buf: &mut Vec<u64>, n: usize) -> &mut [u64] {
    buf.clear();
    buf.resize(n, 0);
    &mut buf[..]
}

/// Appends the compact encoding of one table's code lengths: a sequence of run bytes; a byte
/// `b < 0x80` is a run of `b + 1` unused symbols; `b >= 0x80` announces `(b & 0x7f) + 1` code
/// lengths (1..=MAX_LEN) that follow as nibbles, low nibble first, the last byte zero-padded.
pub fn write_table(lens: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < lens.len() {
        let zero = lens[i] == 0;
        let mut j = i;
        while j < lens.len() && (lens[j] == 0) == zero && j - i < 128 {
            j += 1;
        }
        let run = j - i;
        if zero {
            out.push((run - 1) as u8);
        } else {
            out.push(0x80 | (run - 1) as u8);
            for pair in lens[i..j].chunks(2) {
                let hi = if pair.len() > 1 { pair[1] } else { 0 };
                out.push(pair[0] | (hi << 4));
            }
        }
        i = j;
    }
}

/// Entry of a decode table for a code word no symbol owns (an incomplete code): length 0
/// and bit 15 set, which the decoder ORs into a flag word and reports after the chunk.
pub const INVALID_ENTRY: u16 = 0x8000;
/// Where the symbol sits in a decode-table entry (`sym << SYM_SHIFT | len`): bits 4 and 5
/// stay zero, so a 64-bit shift by the whole entry (which the CPU masks to 6 bits) shifts by
/// the length, with no masking instruction.
pub const SYM_SHIFT: u32 = 6;

/// Reads one table written by [`write_table`] from `src[*pos..]` for an alphabet of
/// `alphabet` symbols, checking the runs cover the alphabet exactly and the code is a valid
/// prefix code. The used symbols are appended to `used` as `sym << SYM_SHIFT | len`, in symbol order.
pub fn read_table(
    src: &[u8],
    pos: &mut usize,
    alphabet: usize,
    used: &mut Vec<u16>,
    table: usize,
) -> Result<()> {
    read_table_limited(src, pos, alphabet, used, table, MAX_LEN)
}

/// [`read_table`] for codes limited to `max_len` (1..=[`MAX_LEN_ANY`]) bits.
pub fn read_table_limited(
    src: &[u8],
    pos: &mut usize,
    alphabet: usize,
    used: &mut Vec<u16>,
    table: usize,
    max_len: u32,
) -> Result<()> {
    read_runs(src, pos, alphabet, used, table, max_len).map(|_| ())
}

/// The body of [`read_table_limited`]; returns the code's Kraft sum in units of
/// `2^-max_len` (at most `1 << max_len`).
fn read_runs(
    src: &[u8],
    pos: &mut usize,
    alphabet: usize,
    used: &mut Vec<u16>,
    table: usize,
    max_len: u32,
) -> Result<u64> {
    let bad = |reason| Error::V2BadTable { table, reason };
    used.clear();
    let mut i = 0;
    let mut kraft: u64 = 0;
    let limit = 1u64 << max_len;
    while i < alphabet {
        let b = *src.get(*pos).ok_or(bad("truncated"))?;
        *pos += 1;
        let run = (b & 0x7f) as usize + 1;
        if i + run > alphabet {
            return Err(bad("runs exceed the alphabet"));
        }
        if b & 0x80 != 0 {
            let bytes = run.div_ceil(2);
            let packed = src.get(*pos..*pos + bytes).ok_or(bad("truncated"))?;
            *pos += bytes;
            let mut bad_len = false;
            for k in 0..run {
                let l = (packed[k / 2] >> (4 * (k % 2))) & 15;
                bad_len |= l == 0 || l as u32 > max_len;
                used.push(((i + k) as u16) << SYM_SHIFT | l as u16);
                kraft += limit >> (l & 15).min(63);
            }
            if bad_len {
                return Err(bad("code length out of range"));
            }
            if run % 2 == 1 && packed[bytes - 1] >> 4 != 0 {
                return Err(bad("nonzero padding nibble"));
            }
        }
        i += run;
    }
    if kraft > limit {
        return Err(bad("over-subscribed code"));
    }
    Ok(kraft)
}

/// [`read_table_limited`] for the shared-shape mode's tables, which must be complete codes
/// (Kraft sum exactly 1) or one symbol of length 1 that owns both code words; returns
/// whether the table is that one symbol.
pub fn read_complete_table(
    src: &[u8],
    pos: &mut usize,
    alphabet: usize,
    used: &mut Vec<u16>,
    table: usize,
    max_len: u32,
) -> Result<bool> {
    let kraft = read_runs(src, pos, alphabet, used, table, max_len)?;
    let full = 1u64 << max_len;
    let single_symbol = used.len() == 1 && used[0] & 15 == 1;
    if kraft != full && !single_symbol {
        return Err(Error::V2BadTable {
            table,
            reason: "code is not complete",
        });
    }
    Ok(single_symbol)
}

/// The first canonical code (not reversed) of every length 1..=15, given how many symbols
/// have each length (`count[0]`, the unused symbols, must be 0).
fn first_codes(count: &[u32; 16]) -> [u32; 16] {
    let mut first = [0u32; 16];
    let mut code = 0u32;
    for l in 1..16 {
        code = (code + count[l - 1]) << 1;
        first[l] = code;
    }
    first
}

/// Canonical codes for `lens`, bit-reversed for LSB-first streams: `codes[s] = rev | len << 12`.
pub fn build_codes(lens: &[u8], codes: &mut [u16]) {
    build_codes_over(lens, 0..lens.len(), codes)
}

/// [`build_codes`] when every used symbol is one of the ascending symbols `syms`: only their
/// codes are written (the caller's `codes` must be zero at every other symbol).
pub fn build_codes_of(lens: &[u8], syms: &[u32], codes: &mut [u16]) {
    build_codes_over(lens, syms.iter().map(|&s| s as usize), codes)
}

/// The codes of the ascending symbols `syms` (0 for those of length 0).
fn build_codes_over(lens: &[u8], syms: impl Iterator<Item = usize> + Clone, codes: &mut [u16]) {
    let mut count = [0u32; 16];
    for s in syms.clone() {
        count[lens[s] as usize & 15] += 1;
    }
    count[0] = 0;
    let mut next = first_codes(&count);
    for s in syms {
        let l = lens[s];
        if l == 0 {
            codes[s] = 0;
            continue;
        }
        let c = next[l as usize];
        next[l as usize] += 1;
        let rev = c.reverse_bits() >> (32 - l as u32);
        codes[s] = (rev | (l as u32) << 12) as u16;
    }
}

/// Fills a decode table (`DECODE_ENTRIES` entries indexed by the next `MAX_LEN` stream bits,
/// LSB-first; each `sym << SYM_SHIFT | len`, [`INVALID_ENTRY`] for unowned code words) from the used
/// symbols `read_table` gave (symbol order, valid lengths, Kraft sum checked).
///
/// Built by doubling ([`fill_by_doubling`]).
pub fn build_decode_table(used: &[u16], table: &mut [u16]) {
    build_decode_table_bits(used, table, MAX_LEN)
}

/// [`build_decode_table`] for a table of `1 << bits` entries (`bits` <= [`MAX_LEN_ANY`]; the
/// lengths in `used` are at most `bits`, as `read_table_limited` checked).
pub fn build_decode_table_bits(used: &[u16], table: &mut [u16], bits: u32) {
    let max = bits.min(MAX_LEN_ANY) as usize;
    let mut codes = [(0, 0, 0); 512];
    let n = canonical_codes(used, &mut codes);
    table[0] = INVALID_ENTRY;
    fill_by_doubling(&codes[..n], &mut table[..1 << max], |len, sym| {
        (sym << SYM_SHIFT | len) as u16
    });
}

/// A used symbol's canonical code: `(reversed code, length, symbol)`.
pub type Code = (u32, u32, u32);

/// Canonical codes of the used symbols `used` (`sym << SYM_SHIFT | len`, symbol order,
/// lengths 1..=15 as [`read_table`] leaves them) into `codes`, grouped by length (shortest
/// first) and in symbol order within a length (canonical order); returns how many.
pub fn canonical_codes(used: &[u16], codes: &mut [Code; 512]) -> usize {
    let mut count = [0u32; 16];
    for &u in used {
        count[(u & 15) as usize] += 1;
    }
    let mut next = first_codes(&count);
    // slot[l]: where codes of length l start in `codes`.
    let mut slot = [0usize; 17];
    for l in 1..16 {
        slot[l + 1] = slot[l] + count[l] as usize;
    }
    for &u in used {
        let l = (u & 15) as usize;
        let c = next[l];
        next[l] += 1;
        if let Some(at) = codes.get_mut(slot[l]) {
            *at = (
                c.reverse_bits() >> (32 - l as u32),
                l as u32,
                (u >> SYM_SHIFT) as u32,
            );
        }
        slot[l] += 1;
    }
    used.len().min(codes.len())
}

/// Fills a decode table (a power-of-two length, indexed by the next stream bits, LSB-first)
/// with `entry(len, sym)` for the `codes` ([`canonical_codes`]: grouped by length, shortest
/// first) by doubling, from the one entry the caller left in `table[0]` (what an index no
/// code owns decodes to). LSB-first, a code of length `l` owns every index whose low `l`
/// bits are its reversed code: the table for lengths `<= l + 1` is two copies of the one for
/// lengths `<= l` plus one entry per code of length `l + 1`, so building costs one copy of
/// the table and one store per symbol, with no pass over the whole alphabet. Codes longer
/// than the table's index bits (which the readers refuse) cannot index past it.
pub fn fill_by_doubling<T: Copy>(codes: &[Code], table: &mut [T], entry: impl Fn(u32, u32) -> T) {
    let mut size = 1usize;
    let mut width = 0u32;
    for &(rev, len, sym) in codes {
        while width < len && size < table.len() {
            table.copy_within(0..size, size);
            size *= 2;
            width += 1;
        }
        table[rev as usize & (size - 1)] = entry(len, sym);
    }
    while size < table.len() {
        table.copy_within(0..size, size);
        size *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_limited_and_valid() {
        let mut b = LengthBuilder::default();
        // Fibonacci counts force deep trees.
        let mut counts = vec![0u32; 64];
        let (mut x, mut y) = (1u32, 1u32);
        for c in counts.iter_mut().take(40) {
            *c = x;
            let z = x.saturating_add(y);
            x = y;
            y = z;
        }
        let mut lens = vec![0u8; 64];
        b.build_lengths(&counts, &mut lens);
        let mut kraft = 0u64;
        for (s, &l) in lens.iter().enumerate() {
            assert_eq!(l == 0, counts[s] == 0);
            assert!(l as u32 <= MAX_LEN);
            if l > 0 {
                kraft += 1 << (MAX_LEN - l as u32);
            }
        }
        assert!(kraft <= 1 << MAX_LEN);
        let mut buf = Vec::new();
        write_table(&lens, &mut buf);
        let mut used = Vec::new();
        let mut pos = 0;
        read_table(&buf, &mut pos, 64, &mut used, 0).unwrap();
        assert_eq!(pos, buf.len());
        let mut back = vec![0u8; 64];
        for &u in &used {
            back[(u >> SYM_SHIFT) as usize] = (u & 15) as u8;
        }
        assert_eq!(back, lens);
        // Every decode-table entry agrees with a straightforward canonical decode.
        let mut codes = vec![0u16; 64];
        build_codes(&lens, &mut codes);
        let mut table = vec![0u16; DECODE_ENTRIES];
        build_decode_table(&used, &mut table);
        for (i, &e) in table.iter().enumerate() {
            let owner = (0..64).find(|&s| {
                let l = lens[s] as u32;
                l > 0 && (i as u32) & ((1 << l) - 1) == (codes[s] & 0xfff) as u32
            });
            match owner {
                Some(s) => assert_eq!(e, (s as u16) << SYM_SHIFT | lens[s] as u16),
                None => assert_eq!(e, INVALID_ENTRY),
            }
        }
    }

    #[test]
    fn limited_lengths_follow_frequency_and_fill_kraft() {
        let mut b = LengthBuilder::default();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..200 {
            let n = 2 + case % 511;
            let counts: Vec<u32> = (0..n)
                .map(|i| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Geometric-ish skew (deep trees), some unused symbols.
                    let shift = (seed >> 59) as u32 + (i as u32 % 7);
                    if seed >> 40 & 7 == 0 {
                        0
                    } else {
                        (1u32 << 20 >> shift.min(20)).max(1)
                    }
                })
                .collect();
            let mut lens = vec![0u8; n];
            b.build_lengths(&counts, &mut lens);
            let used: Vec<usize> = (0..n).filter(|&s| counts[s] > 0).collect();
            let kraft: u64 = used.iter().map(|&s| (1u64 << MAX_LEN) >> lens[s]).sum();
            assert!(kraft <= 1 << MAX_LEN, "case {case}");
            if used.len() > 1 {
                // A complete code: no slack left where a shorter code would fit.
                assert_eq!(kraft, 1 << MAX_LEN, "case {case}");
            }
            for &s in &used {
                assert!((1..=MAX_LEN as u8).contains(&lens[s]), "case {case}");
                for &t in &used {
                    if counts[s] > counts[t] {
                        assert!(lens[s] <= lens[t], "case {case}: {s} vs {t}");
                    }
                }
            }
            for s in 0..n {
                assert_eq!(lens[s] == 0, counts[s] == 0);
            }
        }
    }

    #[test]
    fn oversubscribed_table_is_refused() {
        // Three symbols of length 1.
        let lens = [1u8, 1, 1, 0];
        let mut buf = Vec::new();
        write_table(&lens, &mut buf);
        let mut used = Vec::new();
        let mut pos = 0;
        assert!(matches!(
            read_table(&buf, &mut pos, 4, &mut used, 3),
            Err(Error::V2BadTable { table: 3, .. })
        ));
    }

    /// The builders that visit listed symbols only give what the whole-alphabet ones give,
    /// for lists that hold every used symbol and some unused ones.
    #[test]
    fn listed_symbols_build_the_same_lengths_and_codes() {
        let mut rng = crate::gear_v2::test_rng::XorShift64(0x243f6a8885a308d3);
        let mut b = LengthBuilder::default();
        for round in 0..200 {
            let alphabet = if round % 2 == 0 { 512 } else { 256 };
            let mut counts = vec![0u32; alphabet];
            let mut syms = Vec::new();
            for (s, c) in counts.iter_mut().enumerate() {
                let r = rng.next();
                if r.is_multiple_of(4) {
                    // Skewed counts, some large enough to force the length limit.
                    *c = (r >> 8) as u32 % 7 + ((r >> 40) as u32 % 3) * (1 << ((r >> 20) % 20));
                }
                if *c > 0 || r.is_multiple_of(9) {
                    syms.push(s as u32);
                }
            }
            let max_len = if round % 3 == 0 { MAX_LEN } else { MAX_LEN_ANY };
            let (mut full, mut listed) = (vec![0u8; alphabet], vec![7u8; alphabet]);
            b.build_lengths_limited(&counts, &mut full, max_len);
            b.build_lengths_of(&counts, &syms, &mut listed, max_len);
            assert_eq!(listed, full, "round {round}");
            let (mut all, mut some) = (vec![1u16; alphabet], vec![0u16; alphabet]);
            build_codes(&full, &mut all);
            build_codes_of(&full, &syms, &mut some);
            assert_eq!(some, all, "round {round}");
        }
    }
}
