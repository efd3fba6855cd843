//! The gear-v2 decoder: validates the header, model and chunk index once, then decodes any
//! chunk alone.

use super::bits::peek;
use super::encode::{CHUNK_CODED, CHUNK_STORED, CODED_CHUNK_HEADER, LANES};
use super::format::{BlobHeader, ChunkIndex, FieldSplit, HEADER_LEN};
use super::huffman::{self, DECODE_ENTRIES, MAX_LEN};
use super::values::{dispatch, load, rest_bytes, store};
use crate::error::{Error, Result};

/// A reusable gear-v2 decoder. [`Decoder::open`] validates a blob and builds its decode
/// tables into buffers kept between calls.
#[derive(Debug, Default)]
pub struct Decoder {
    tables: Vec<u16>,
    lens: Vec<u8>,
    codes: Vec<u32>,
    index: ChunkIndex,
}

/// A validated blob, ready to decode whole or chunk by chunk.
#[derive(Debug, Clone, Copy)]
pub struct OpenBlob<'d, 'b> {
    header: BlobHeader,
    tables: &'d [u16],
    offsets: &'d [usize],
    blob: &'b [u8],
}

impl Decoder {
    /// A new decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates `blob`'s header, model section and chunk index and builds its tables.
    pub fn open<'d, 'b>(&'d mut self, blob: &'b [u8]) -> Result<OpenBlob<'d, 'b>> {
        let header = BlobHeader::parse(blob)?;
        let model_end = HEADER_LEN as u64 + header.model_len as u64;
        if (blob.len() as u64) < model_end {
            return Err(Error::V2Truncated {
                what: "model section",
                needed: model_end as usize,
                available: blob.len(),
            });
        }
        let model = &blob[HEADER_LEN..model_end as usize];
        let tables = header.table_count();
        // Every table takes at least one byte, which bounds the table memory by the input.
        if tables > model.len() {
            return Err(Error::V2Truncated {
                what: "model section",
                needed: HEADER_LEN + tables,
                available: HEADER_LEN + model.len(),
            });
        }
        let alphabet = FieldSplit::of(header.dtype).alphabet();
        self.lens.resize(alphabet, 0);
        self.codes.resize(alphabet, 0);
        self.tables.clear();
        self.tables.resize(tables * DECODE_ENTRIES, 0);
        let mut pos = 0;
        for t in 0..tables {
            if huffman::read_table(model, &mut pos, &mut self.lens, t)? {
                huffman::build_decode_table(
                    &self.lens,
                    &mut self.codes,
                    &mut self.tables[t * DECODE_ENTRIES..(t + 1) * DECODE_ENTRIES],
                );
            }
        }
        if pos != model.len() {
            return Err(Error::V2BadField {
                field: "model_len",
                offset: 24,
                found: header.model_len as u64,
            });
        }
        self.index.read(&header, blob)?;
        Ok(OpenBlob {
            header,
            tables: &self.tables,
            offsets: &self.index.offsets,
            blob,
        })
    }

    /// Decodes a whole blob into `out`; returns the bytes written.
    pub fn decode_into(&mut self, blob: &[u8], out: &mut [u8]) -> Result<usize> {
        self.open(blob)?.decode_into(out)
    }

    /// Decodes a whole blob into a new vector.
    pub fn decode(&mut self, blob: &[u8]) -> Result<Vec<u8>> {
        let open = self.open(blob)?;
        let mut out = vec![0u8; open.header().decoded_len()];
        open.decode_into(&mut out)?;
        Ok(out)
    }
}

impl<'d, 'b> OpenBlob<'d, 'b> {
    /// The blob's header.
    pub fn header(&self) -> &BlobHeader {
        &self.header
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.header.chunk_count()
    }

    /// Decoded bytes of chunk `i` (whole tokens).
    pub fn chunk_len(&self, i: usize) -> usize {
        self.header.chunk_tokens_of(i) * self.header.channels as usize * self.header.dtype.size()
    }

    /// Decodes the whole tensor into `out` (at least `decoded_len` bytes); returns bytes written.
    pub fn decode_into(&self, out: &mut [u8]) -> Result<usize> {
        let total = self.header.decoded_len();
        if out.len() < total {
            return Err(Error::OutputTooSmall {
                needed: total,
                available: out.len(),
            });
        }
        let mut at = 0;
        for i in 0..self.chunk_count() {
            let n = self.chunk_len(i);
            self.decode_chunk_into(i, &mut out[at..at + n])?;
            at += n;
        }
        Ok(total)
    }

    /// Decodes chunk `i` alone into `out`; returns the bytes written.
    pub fn decode_chunk_into(&self, i: usize, out: &mut [u8]) -> Result<usize> {
        let chunks = self.chunk_count();
        if i >= chunks {
            return Err(Error::V2ChunkOutOfRange { chunk: i, chunks });
        }
        let n = self.chunk_len(i);
        if out.len() < n {
            return Err(Error::OutputTooSmall {
                needed: n,
                available: out.len(),
            });
        }
        let out = &mut out[..n];
        let data = &self.blob[self.offsets[i]..self.offsets[i + 1]];
        let bad = |reason| Error::V2BadChunk { chunk: i, reason };
        match data[0] {
            CHUNK_STORED => {
                if data.len() != 1 + n {
                    return Err(bad("stored chunk length differs from its tokens"));
                }
                out.copy_from_slice(&data[1..]);
            }
            CHUNK_CODED => {
                let ch = self.header.channels as usize;
                let values = self.header.chunk_tokens_of(i) * ch;
                if data.len() < CODED_CHUNK_HEADER {
                    return Err(bad("coded chunk shorter than its header"));
                }
                let mut lanes = [&data[..0]; LANES];
                let mut at = CODED_CHUNK_HEADER;
                for (k, lane) in lanes.iter_mut().enumerate() {
                    let o = 1 + 4 * k;
                    let len = u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]])
                        as usize;
                    *lane = data
                        .get(at..at + len)
                        .ok_or(bad("lane runs past the chunk"))?;
                    at += len;
                }
                let rest = &data[at..];
                if rest.len() != rest_bytes(self.header.dtype, values) {
                    return Err(bad("packed low bits have the wrong length"));
                }
                let ctx = Ctx {
                    tables: self.tables,
                    channels: ch,
                    group: self.header.group_size as usize,
                    nctx: self.header.contexts(),
                    chunk: i,
                };
                dispatch!(self.header.dtype, decode_coded(&ctx, &lanes, rest, out))?;
            }
            m => {
                return Err(Error::V2BadField {
                    field: "chunk mode",
                    offset: self.offsets[i],
                    found: m as u64,
                })
            }
        }
        Ok(n)
    }
}

struct Ctx<'a> {
    tables: &'a [u16],
    channels: usize,
    group: usize,
    nctx: usize,
    chunk: usize,
}

fn decode_coded<const BPV: usize, const REST: u32, const SYM: u32>(
    cx: &Ctx<'_>,
    lanes: &[&[u8]; LANES],
    rest: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let ch = cx.channels;
    let values = out.len() / BPV;
    let tokens = values / ch;
    // 1. Low bits, token-major.
    if REST == 8 && BPV == 2 {
        for (pair, &lo) in out.chunks_exact_mut(2).zip(rest) {
            pair[0] = lo;
            pair[1] = 0;
        }
    } else if REST == 0 {
        out.fill(0);
    } else {
        let mask = (1u64 << REST) - 1;
        let mut pos = 0usize;
        for j in 0..values {
            store::<BPV>(out, j, (peek(rest, pos) & mask) as u32);
            pos += REST as usize;
        }
    }
    // 2. Top fields, channel-major per lane.
    let bad = |reason| Error::V2BadChunk {
        chunk: cx.chunk,
        reason,
    };
    let mut pos = [0usize; LANES];
    let ctx_mask = (cx.nctx - 1) as u32;
    let table_mask = (DECODE_ENTRIES - 1) as u64;
    let mut base = 0;
    while base < ch {
        let active = (ch - base).min(LANES);
        if active == LANES {
            let mut tb = [0usize; LANES];
            for (k, t) in tb.iter_mut().enumerate() {
                *t = ((base + k) / cx.group) * cx.nctx * DECODE_ENTRIES;
            }
            let mut cur = tb;
            let mut p = pos;
            let mut invalid = false;
            for t in 0..tokens {
                let row = t * ch + base;
                for k in 0..LANES {
                    let e = cx.tables[cur[k] + (peek(lanes[k], p[k]) & table_mask) as usize];
                    let len = (e & 15) as usize;
                    invalid |= len == 0;
                    p[k] += len;
                    let sym = (e >> 4) as u32;
                    let j = row + k;
                    let v = load::<BPV>(out, j) | (sym << REST);
                    store::<BPV>(out, j, v);
                    cur[k] = tb[k] + (((sym >> (SYM - 1)) & ctx_mask) as usize) * DECODE_ENTRIES;
                }
            }
            if invalid {
                return Err(bad("invalid Huffman code"));
            }
            pos = p;
        } else {
            for k in 0..active {
                let c = base + k;
                let tb = (c / cx.group) * cx.nctx * DECODE_ENTRIES;
                let mut cur = tb;
                for t in 0..tokens {
                    let e = cx.tables[cur + (peek(lanes[k], pos[k]) & table_mask) as usize];
                    let len = (e & 15) as usize;
                    if len == 0 {
                        return Err(bad("invalid Huffman code"));
                    }
                    pos[k] += len;
                    let sym = (e >> 4) as u32;
                    let j = t * ch + c;
                    let v = load::<BPV>(out, j) | (sym << REST);
                    store::<BPV>(out, j, v);
                    cur = tb + (((sym >> (SYM - 1)) & ctx_mask) as usize) * DECODE_ENTRIES;
                }
            }
        }
        base += LANES;
    }
    for k in 0..LANES {
        if pos[k].div_ceil(8) != lanes[k].len() {
            return Err(bad(if pos[k] > lanes[k].len() * 8 {
                "Huffman lane truncated"
            } else {
                "Huffman lane has trailing bytes"
            }));
        }
    }
    let _ = MAX_LEN;
    Ok(())
}
