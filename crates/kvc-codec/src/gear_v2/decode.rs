//! The gear-v2 decoder: validates the header, model and chunk index once, then decodes any
//! chunk alone.

use super::encode::{CHUNK_CODED, CHUNK_STORED, CODED_CHUNK_HEADER, LANES};
use super::format::{BlobHeader, ChunkIndex, FieldSplit, HEADER_LEN};
use super::huffman::{self, DECODE_ENTRIES, INVALID_ENTRY};
use super::lane_decode::{decode_coded, LaneModel, Lanes};
use super::values::{dispatch, rest_bytes};
use crate::error::{Error, Result};

/// A reusable gear-v2 decoder. [`Decoder::open`] validates a blob and builds its decode
/// tables into buffers kept between calls.
#[derive(Debug, Default)]
pub struct Decoder {
    tables: Vec<u16>,
    used: Vec<u16>,
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
        // Every entry is written below; resizing without clearing keeps old tables' memory.
        // One padding table follows, so that any table and the next form one array.
        self.tables.resize((tables + 1) * DECODE_ENTRIES, 0);
        let mut pos = 0;
        let (real, pad) = self.tables.split_at_mut(tables * DECODE_ENTRIES);
        pad.fill(INVALID_ENTRY);
        for (t, table) in real.chunks_exact_mut(DECODE_ENTRIES).enumerate() {
            huffman::read_table(model, &mut pos, alphabet, &mut self.used, t)?;
            if self.used.is_empty() {
                table.fill(INVALID_ENTRY);
            } else {
                huffman::build_decode_table(&self.used, table);
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
        self.header.chunk_tokens_of(i) * self.header.channels as usize * self.header.dtype.width()
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
                let mut starts = [0usize; LANES];
                let mut lens = [0usize; LANES];
                let mut at = CODED_CHUNK_HEADER;
                for k in 0..LANES {
                    let o = 1 + 4 * k;
                    let len = u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]])
                        as usize;
                    if len > data.len() - at {
                        return Err(bad("lane runs past the chunk"));
                    }
                    starts[k] = at;
                    lens[k] = len;
                    at += len;
                }
                let rest = &data[at..];
                if rest.len() != rest_bytes(self.header.dtype, values) {
                    return Err(bad("packed low bits have the wrong length"));
                }
                let lanes = Lanes { data, starts, lens };
                let model = LaneModel {
                    tables: self.tables,
                    channels: ch,
                    group: self.header.group_size as usize,
                    sign_context: self.header.sign_context,
                };
                dispatch!(self.header.dtype, decode_coded(&model, &lanes, rest, out))
                    .map_err(bad)?;
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
