//! Repeated tokens (chunk mode 2, format version 2) and the row dictionary (version 3): a
//! token whose whole row equals an earlier row is stored as a reference.
//!
//! Layer 0's V of a decoder-only transformer is a function of the token id alone (no
//! position enters before the first attention), so every repeated word of the prompt
//! repeats a whole V row bit for bit: on the real data, 47 % of layer 0's V rows within a
//! 256-token chunk, 76 % within 4,096 tokens. Other layers and post-RoPE K never repeat a
//! row, and for them the scan finds nothing and the chunks stay mode 1.
//!
//! Chunk layout after the mode byte: a bitmap of `ceil(tokens / 8)` bytes (bit `t`
//! LSB-first: token `t` is a reference; the padding bits are 0, at least one bit is set), one
//! little-endian reference per set bit in token order, then a mode-1 chunk body (lane
//! lengths, lanes, low bits) of the other tokens in token order. A reference `r` below the
//! blob's `dict_rows` names row `r` of the row dictionary; otherwise it names token
//! `r - dict_rows` of the chunk, which must be earlier and not itself a reference (so
//! without a dictionary, as in version 2, the first token is never a reference). References
//! are u16 when `dict_rows` plus the chunk's tokens is at most 65,536, u32 otherwise.
//!
//! The row dictionary (version 3) holds, in order of first occurrence, every row that occurs
//! in two or more chunks; it is coded once per blob like a chunk, decoded when the blob is
//! opened, and every occurrence of its rows refers to it, so chunks still decode alone given
//! the blob's header, model and dictionary. On the real data's layer 0 V (4,096 tokens),
//! 384-token chunks alone find 52 % of the rows repeated, the dictionary all 76 %.

/// Chunk mode byte: repeated tokens as references, then a coded body of the others.
pub(crate) const CHUNK_REPEATS: u8 = 2;

/// Bytes of one source reference in a chunk of `tokens` tokens.
pub(crate) fn ref_width(tokens: usize) -> usize {
    if tokens <= 1 << 16 {
        2
    } else {
        4
    }
}

/// Finds a chunk's repeated rows; keeps its buffers between chunks (no allocation once
/// they have grown to a chunk's size).
#[derive(Debug, Default, Clone)]
pub(crate) struct RepeatScan {
    /// Open-addressing hash table of `token + 1` (0: empty), a power of two in size.
    slots: Vec<u32>,
    /// Per token: `u32::MAX` when unique, else the token it repeats.
    source: Vec<u32>,
    /// Number of repeated tokens found by the last [`RepeatScan::scan`].
    pub(crate) repeats: usize,
}

const UNIQUE: u32 = u32::MAX;

/// A 64-bit hash of a row: 32 bytes at a time into four independent multiply-rotate
/// accumulators (a single chain would be latency-bound at ~5 cycles per 8 bytes), then
/// mixed.
fn row_hash(row: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let mut h = [row.len() as u64, K, K.rotate_left(17), K.rotate_left(41)];
    let mut blocks = row.chunks_exact(32);
    for b in &mut blocks {
        for (j, acc) in h.iter_mut().enumerate() {
            *acc = (acc.rotate_left(23) ^ word(&b[8 * j..8 * j + 8])).wrapping_mul(K);
        }
    }
    let mut words = blocks.remainder().chunks_exact(8);
    for (j, w) in (&mut words).enumerate() {
        h[j] = (h[j].rotate_left(23) ^ word(w)).wrapping_mul(K);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut a = [0u8; 8];
        a[..tail.len()].copy_from_slice(tail);
        h[3] = (h[3].rotate_left(23) ^ u64::from_le_bytes(a)).wrapping_mul(K);
    }
    let x = (h[0] ^ h[1].rotate_left(16)).wrapping_mul(K) ^ (h[2] ^ h[3].rotate_left(32));
    x.wrapping_mul(K) ^ (x >> 29)
}

impl RepeatScan {
    /// Scans the chunk `raw` of rows of `row_bytes` bytes. Returns whether any row repeats;
    /// if so, [`RepeatScan::append_unique`] and [`RepeatScan::write_refs`] give the other
    /// rows and the references.
    pub(crate) fn scan(&mut self, raw: &[u8], row_bytes: usize) -> bool {
        let tokens = raw.len() / row_bytes;
        self.repeats = 0;
        if tokens < 2 || u32::try_from(tokens).is_err() {
            return false;
        }
        let size = (2 * tokens).next_power_of_two();
        let mask = size - 1;
        self.slots.clear();
        self.slots.resize(size, 0);
        self.source.clear();
        self.source.resize(tokens, UNIQUE);
        for (t, row) in raw.chunks_exact(row_bytes).enumerate() {
            let mut i = row_hash(row) as usize & mask;
            loop {
                let s = self.slots[i];
                if s == 0 {
                    self.slots[i] = t as u32 + 1;
                    break;
                }
                let src = (s - 1) as usize;
                if raw[src * row_bytes..(src + 1) * row_bytes] == *row {
                    self.source[t] = src as u32;
                    self.repeats += 1;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        self.repeats > 0
    }

    /// Appends the rows of the last scanned chunk `raw` that repeat no earlier row.
    pub(crate) fn append_unique(&self, raw: &[u8], row_bytes: usize, out: &mut Vec<u8>) {
        for (row, &s) in raw.chunks_exact(row_bytes).zip(&self.source) {
            if s == UNIQUE {
                out.extend_from_slice(row);
            }
        }
    }

    /// Appends the bitmap and the source references found by the last scan.
    pub(crate) fn write_refs(&self, out: &mut Vec<u8>) {
        let tokens = self.source.len();
        let at = out.len();
        out.resize(at + tokens.div_ceil(8), 0);
        for (t, &s) in self.source.iter().enumerate() {
            if s != UNIQUE {
                out[at + t / 8] |= 1 << (t % 8);
            }
        }
        let width = ref_width(tokens);
        for &s in self.source.iter().filter(|&&s| s != UNIQUE) {
            out.extend_from_slice(&s.to_le_bytes()[..width]);
        }
    }
}

/// What each chunk of a tensor codes, decided before the model is fitted (the model must see
/// exactly the token sequences the lanes code: dropping a repeated row makes new neighbours,
/// hence new sign contexts). Keeps its buffers between tensors.
#[derive(Debug, Default)]
pub(crate) struct RepeatPlan {
    scan: RepeatScan,
    /// Per token that first holds its row: its row-dictionary index, [`UNIQUE`] when the
    /// row is not in the dictionary.
    dict_of: Vec<u32>,
    /// The coded rows: the row dictionary's, then every chunk's unique rows, back to back;
    /// empty when no row repeats.
    rows: Vec<u8>,
    /// Per chunk: first coded row (in `rows`) and where its references lie in `refs`
    /// (empty: mode 1).
    chunks: Vec<(usize, std::ops::Range<usize>)>,
    /// Bitmaps and references of the chunks with repeated tokens, back to back.
    refs: Vec<u8>,
    /// Rows of the row dictionary (0: none).
    pub(crate) dict_rows: usize,
    /// Coded rows per segment (the model's chunk boundaries): the row dictionary's when
    /// there is one, then each chunk's.
    pub(crate) chunk_tokens: Vec<u32>,
    row_bytes: usize,
}

/// Marks a row bound for the dictionary before the dictionary is numbered.
const IN_DICTIONARY: u32 = u32::MAX - 1;

impl RepeatPlan {
    /// Plans every `chunk_tokens`-token chunk of `input` (rows of `row_bytes` bytes). With
    /// `dictionary` (format version 3), rows that occur in more than one chunk go to the row
    /// dictionary and every occurrence refers to it; without, each chunk refers only to its
    /// own earlier rows (version 2).
    pub(crate) fn plan(
        &mut self,
        input: &[u8],
        row_bytes: usize,
        chunk_tokens: usize,
        dictionary: bool,
    ) {
        self.rows.clear();
        self.chunks.clear();
        self.refs.clear();
        self.chunk_tokens.clear();
        self.dict_rows = 0;
        self.row_bytes = row_bytes;
        if dictionary {
            self.plan_blob(input, row_bytes, chunk_tokens);
        } else {
            self.plan_chunks(input, row_bytes, chunk_tokens);
        }
    }

    /// Version 2: one scan per chunk.
    fn plan_chunks(&mut self, input: &[u8], row_bytes: usize, chunk_tokens: usize) {
        let mut coded = 0usize;
        let mut any = false;
        for raw in input.chunks(chunk_tokens * row_bytes) {
            let tokens = raw.len() / row_bytes;
            let mut refs = 0..0;
            let mut n = tokens;
            if self.scan.scan(raw, row_bytes) {
                if !any {
                    // Every earlier chunk codes all its rows.
                    any = true;
                    self.rows.extend_from_slice(&input[..coded * row_bytes]);
                }
                let at = self.refs.len();
                self.scan.write_refs(&mut self.refs);
                self.scan.append_unique(raw, row_bytes, &mut self.rows);
                refs = at..self.refs.len();
                n = tokens - self.scan.repeats;
            } else if any {
                self.rows.extend_from_slice(raw);
            }
            self.chunks.push((coded, refs));
            self.chunk_tokens.push(n as u32);
            coded += n;
        }
    }

    /// Version 3: one scan of the whole blob; rows seen in two or more chunks form the row
    /// dictionary (in order of first occurrence), rows repeated inside one chunk only refer
    /// to their first occurrence there.
    fn plan_blob(&mut self, input: &[u8], row_bytes: usize, chunk_tokens: usize) {
        let tokens = input.len() / row_bytes;
        if !self.scan.scan(input, row_bytes) {
            // No row repeats in the blob, so none in a chunk: every chunk codes all its rows
            // (no second scan per chunk).
            for t0 in (0..tokens).step_by(chunk_tokens) {
                self.chunks.push((t0, 0..0));
                self.chunk_tokens
                    .push((tokens - t0).min(chunk_tokens) as u32);
            }
            return;
        }
        // The row's first token, for every token.
        let first = |t: usize| match self.scan.source[t] {
            UNIQUE => t,
            s => s as usize,
        };
        self.dict_of.clear();
        self.dict_of.resize(tokens, UNIQUE);
        for t in 0..tokens {
            let s = first(t);
            if s / chunk_tokens != t / chunk_tokens {
                self.dict_of[s] = IN_DICTIONARY;
            }
        }
        for (t, d) in self.dict_of.iter_mut().enumerate() {
            if *d == IN_DICTIONARY {
                *d = self.dict_rows as u32;
                self.dict_rows += 1;
                self.rows
                    .extend_from_slice(&input[t * row_bytes..(t + 1) * row_bytes]);
            }
        }
        if self.dict_rows > 0 {
            self.chunk_tokens.push(self.dict_rows as u32);
        }
        let mut coded = self.dict_rows;
        for t0 in (0..tokens).step_by(chunk_tokens) {
            let t1 = (t0 + chunk_tokens).min(tokens);
            let map_at = self.refs.len();
            let map_len = (t1 - t0).div_ceil(8);
            self.refs.resize(map_at + map_len, 0);
            let width = ref_width(self.dict_rows + t1 - t0);
            let mut n = 0;
            for t in t0..t1 {
                let s = first(t);
                let target = match self.dict_of[s] {
                    UNIQUE if s == t => {
                        n += 1;
                        self.rows
                            .extend_from_slice(&input[t * row_bytes..(t + 1) * row_bytes]);
                        continue;
                    }
                    // Not in the dictionary: its first occurrence is in this chunk.
                    UNIQUE => self.dict_rows + s - t0,
                    d => d as usize,
                };
                let bit = t - t0;
                self.refs[map_at + bit / 8] |= 1 << (bit % 8);
                self.refs
                    .extend_from_slice(&(target as u32).to_le_bytes()[..width]);
            }
            let refs = if n == t1 - t0 {
                self.refs.truncate(map_at);
                0..0
            } else {
                map_at..self.refs.len()
            };
            self.chunks.push((coded, refs));
            self.chunk_tokens.push(n as u32);
            coded += n;
        }
    }

    /// The rows the lanes code, the dictionary's and then every chunk's: `input` itself
    /// unless some row repeats.
    pub(crate) fn coded<'a>(&'a self, input: &'a [u8]) -> &'a [u8] {
        if self.rows.is_empty() {
            input
        } else {
            &self.rows
        }
    }

    /// The rows of the row dictionary (empty when there is none).
    pub(crate) fn dictionary(&self) -> &[u8] {
        &self.rows[..self.dict_rows * self.row_bytes]
    }

    /// Chunk `i`'s coded rows and, when it has repeated tokens, its bitmap and references.
    pub(crate) fn chunk<'a>(&'a self, input: &'a [u8], i: usize) -> (&'a [u8], Option<&'a [u8]>) {
        let (start, refs) = &self.chunks[i];
        let n = self.chunk_tokens[i + (self.dict_rows > 0) as usize] as usize;
        let rows = &self.coded(input)[start * self.row_bytes..(start + n) * self.row_bytes];
        (rows, (!refs.is_empty()).then(|| &self.refs[refs.clone()]))
    }
}

/// The parsed references of a mode-2 chunk.
#[derive(Debug)]
pub(crate) struct RepeatRefs<'a> {
    bitmap: &'a [u8],
    refs: &'a [u8],
    width: usize,
    tokens: usize,
    dict_rows: usize,
    /// Number of tokens coded in the body.
    pub(crate) unique: usize,
    /// Bytes of the chunk (after the mode byte) that the bitmap and references take.
    pub(crate) len: usize,
}

impl<'a> RepeatRefs<'a> {
    /// Parses and validates the references of a chunk of `tokens` tokens at the start of
    /// `data` (the chunk after its mode byte), in a blob with `dict_rows` dictionary rows.
    pub(crate) fn parse(
        data: &'a [u8],
        tokens: usize,
        dict_rows: usize,
    ) -> Result<Self, &'static str> {
        let map_len = tokens.div_ceil(8);
        if data.len() < map_len {
            return Err("repeated-token bitmap runs past the chunk");
        }
        let bitmap = &data[..map_len];
        let is_repeat = |t: usize| bitmap[t / 8] >> (t % 8) & 1 == 1;
        if !tokens.is_multiple_of(8) && bitmap[map_len - 1] >> (tokens % 8) != 0 {
            return Err("repeated-token bitmap has padding bits set");
        }
        if tokens == 0 || (dict_rows == 0 && is_repeat(0)) {
            return Err("first token of a chunk marked as repeated");
        }
        let repeats: usize = bitmap.iter().map(|b| b.count_ones() as usize).sum();
        if repeats == 0 {
            return Err("repeated-token chunk without repeated tokens");
        }
        let width = ref_width(dict_rows + tokens);
        let refs_len = repeats * width;
        if data.len() - map_len < refs_len {
            return Err("repeated-token references run past the chunk");
        }
        let refs = &data[map_len..map_len + refs_len];
        let mut k = 0;
        for t in 0..tokens {
            if !is_repeat(t) {
                continue;
            }
            let src = read_ref(refs, k, width);
            k += 1;
            if src < dict_rows {
                continue;
            }
            let src = src - dict_rows;
            if src >= t || is_repeat(src) {
                return Err("repeated token refers to a later or repeated token");
            }
        }
        Ok(RepeatRefs {
            bitmap,
            refs,
            width,
            tokens,
            dict_rows,
            unique: tokens - repeats,
            len: map_len + refs_len,
        })
    }

    /// Spreads the `unique` rows decoded at the front of `out` to their tokens and fills
    /// every repeated token from its source: a row of `dictionary` (the blob's decoded row
    /// dictionary, `dict_rows` rows) or an earlier token. `out` holds `tokens` rows of
    /// `row_bytes`.
    pub(crate) fn expand(&self, out: &mut [u8], row_bytes: usize, dictionary: &[u8]) {
        let is_repeat = |t: usize| self.bitmap[t / 8] >> (t % 8) & 1 == 1;
        // Backwards, unique row `u` moves to token `t >= u`: no row is overwritten before
        // it has moved.
        let mut u = self.unique;
        for t in (0..self.tokens).rev() {
            if is_repeat(t) {
                continue;
            }
            u -= 1;
            if u != t {
                out.copy_within(u * row_bytes..(u + 1) * row_bytes, t * row_bytes);
            }
        }
        let mut k = 0;
        for t in 0..self.tokens {
            if is_repeat(t) {
                let src = read_ref(self.refs, k, self.width);
                k += 1;
                let to = t * row_bytes..(t + 1) * row_bytes;
                if src < self.dict_rows {
                    out[to].copy_from_slice(&dictionary[src * row_bytes..(src + 1) * row_bytes]);
                } else {
                    let src = src - self.dict_rows;
                    out.copy_within(src * row_bytes..(src + 1) * row_bytes, to.start);
                }
            }
        }
    }
}

fn read_ref(refs: &[u8], k: usize, width: usize) -> usize {
    let mut a = [0u8; 4];
    a[..width].copy_from_slice(&refs[k * width..(k + 1) * width]);
    u32::from_le_bytes(a) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(ids: &[u8], row_bytes: usize) -> Vec<u8> {
        ids.iter()
            .flat_map(|&i| (0..row_bytes).map(move |j| i.wrapping_mul(31).wrapping_add(j as u8)))
            .collect()
    }

    #[test]
    fn scan_write_parse_expand_roundtrip() {
        for row_bytes in [1, 3, 8, 13, 384] {
            let raw = rows(&[1, 2, 1, 3, 2, 2, 4, 1, 5], row_bytes);
            let mut scan = RepeatScan::default();
            assert!(scan.scan(&raw, row_bytes));
            assert_eq!(scan.repeats, 4);
            let mut unique = Vec::new();
            scan.append_unique(&raw, row_bytes, &mut unique);
            assert_eq!(unique, rows(&[1, 2, 3, 4, 5], row_bytes));
            let mut refs = Vec::new();
            scan.write_refs(&mut refs);
            assert_eq!(refs[..2], [0b1011_0100, 0b0000_0000]);
            let parsed = RepeatRefs::parse(&refs, 9, 0).unwrap();
            assert_eq!(parsed.len, refs.len());
            assert_eq!(parsed.unique, 5);
            let mut out = vec![0u8; raw.len()];
            out[..unique.len()].copy_from_slice(&unique);
            parsed.expand(&mut out, row_bytes, &[]);
            assert_eq!(out, raw);
        }
    }

    #[test]
    fn plan_codes_each_chunk_once() {
        // Chunks of 4: [1 2 1 3] [4 5 6 7] [8 8 8 9] [1 2]
        let raw = rows(&[1, 2, 1, 3, 4, 5, 6, 7, 8, 8, 8, 9, 1, 2], 5);
        let mut plan = RepeatPlan::default();
        plan.plan(&raw, 5, 4, false);
        assert_eq!(plan.dict_rows, 0);
        assert_eq!(plan.chunk_tokens, [3, 4, 2, 2]);
        assert_eq!(
            plan.coded(&raw),
            rows(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], 5)
        );
        assert_eq!(plan.chunk(&raw, 1), (&raw[20..40], None));
        let (rows2, refs2) = plan.chunk(&raw, 2);
        assert_eq!(rows2, rows(&[8, 9], 5));
        assert_eq!(refs2.unwrap(), [0b0110, 0, 0, 0, 0]);
        // Without repeats the input itself is coded.
        for dictionary in [false, true] {
            plan.plan(&raw[20..40], 5, 2, dictionary);
            assert_eq!(plan.coded(&raw[20..40]).as_ptr(), raw[20..].as_ptr());
            assert_eq!(plan.chunk_tokens, [2, 2]);
        }
    }

    #[test]
    fn plan_puts_rows_of_several_chunks_in_the_dictionary() {
        // Chunks of 4: [1 2 1 3] [4 2 6 4] [8 8 3 9] [1 2]: rows 1, 2 and 3 occur in more
        // than one chunk (dictionary rows 0, 1, 2 by first occurrence); 4 and 8 repeat
        // inside their chunk only.
        let raw = rows(&[1, 2, 1, 3, 4, 2, 6, 4, 8, 8, 3, 9, 1, 2], 5);
        let mut plan = RepeatPlan::default();
        plan.plan(&raw, 5, 4, true);
        assert_eq!(plan.dict_rows, 3);
        assert_eq!(plan.dictionary(), rows(&[1, 2, 3], 5));
        assert_eq!(plan.chunk_tokens, [3, 0, 2, 2, 0]);
        assert_eq!(plan.coded(&raw), rows(&[1, 2, 3, 4, 6, 8, 9], 5));
        // Every token of chunk 0 refers to the dictionary; references are u16, local ones
        // offset by the dictionary's 3 rows.
        let (rows0, refs0) = plan.chunk(&raw, 0);
        assert!(rows0.is_empty());
        assert_eq!(refs0.unwrap(), [0b1111, 0, 0, 1, 0, 0, 0, 2, 0]);
        let (rows1, refs1) = plan.chunk(&raw, 1);
        assert_eq!(rows1, rows(&[4, 6], 5));
        assert_eq!(refs1.unwrap(), [0b1010, 1, 0, 3, 0]);
        let (rows2, refs2) = plan.chunk(&raw, 2);
        assert_eq!(rows2, rows(&[8, 9], 5));
        assert_eq!(refs2.unwrap(), [0b0110, 3, 0, 2, 0]);
        // Parsing and expanding gives the chunks back.
        for (i, t0) in [(0, 0), (1, 4), (2, 8), (3, 12)] {
            let (coded, refs) = plan.chunk(&raw, i);
            let n = (raw.len() / 5 - t0).min(4);
            let parsed = RepeatRefs::parse(refs.unwrap(), n, 3).unwrap();
            assert_eq!(parsed.unique * 5, coded.len());
            let mut out = vec![0u8; n * 5];
            out[..coded.len()].copy_from_slice(coded);
            parsed.expand(&mut out, 5, plan.dictionary());
            assert_eq!(out, raw[t0 * 5..(t0 + n) * 5], "chunk {i}");
        }
    }

    #[test]
    fn no_repeats_found_in_distinct_rows() {
        let raw = rows(&[1, 2, 3, 4], 6);
        let mut scan = RepeatScan::default();
        assert!(!scan.scan(&raw, 6));
        assert!(!scan.scan(&raw[..6], 6));
    }

    #[test]
    fn bad_references_are_refused() {
        let parse = RepeatRefs::parse;
        // token 1 repeats token 0: fine.
        assert!(parse(&[0b10, 0, 0], 2, 0).is_ok());
        // bitmap past the data, first token repeated, padding bit set, no repeats.
        assert!(parse(&[], 2, 0).is_err());
        assert!(parse(&[0b01, 0, 0], 2, 0).is_err());
        assert!(parse(&[0b110, 0, 0, 0, 0], 2, 0).is_err());
        assert!(parse(&[0b00], 2, 0).is_err());
        // reference missing, pointing forward, or at a repeated token.
        assert!(parse(&[0b10, 0], 2, 0).is_err());
        assert!(parse(&[0b10, 1, 0], 2, 0).is_err());
        assert!(parse(&[0b110, 0, 0, 1, 0], 3, 0).is_err());
        // With a dictionary of 2 rows: references 0 and 1 are dictionary rows, 2 is token 0;
        // the first token may refer to the dictionary, never to a token.
        assert!(parse(&[0b11, 1, 0, 0, 0], 2, 2).is_ok());
        assert!(parse(&[0b10, 2, 0], 2, 2).is_ok());
        assert!(parse(&[0b01, 2, 0], 2, 2).is_err());
        assert!(parse(&[0b10, 3, 0], 2, 2).is_err());
        // u32 references once dictionary and chunk exceed 65,536 rows together.
        assert!(parse(&[0b1, 0, 0, 0, 0], 1, 1 << 16).is_ok());
        assert!(parse(&[0b1, 0, 0], 1, 1 << 16).is_err());
    }
}
