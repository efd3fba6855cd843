//! The gear-v2 decoder: validates the header, model and chunk index once, then decodes any
//! chunk alone.

use super::encode::{CHUNK_CODED, CHUNK_STORED, LANES};
use super::format::{BlobHeader, ChunkIndex, FieldSplit, HEADER_LEN};
use super::huffman::{self, DECODE_ENTRIES, INVALID_ENTRY};
use super::lane_decode::{decode_coded, LaneModel, Lanes};
use super::low_byte::{MID_BITS, STREAM_LEN_BYTES};
use super::repeats::{RepeatRefs, CHUNK_REPEATS};
use super::shared_decode::{decode_shared, SharedTables};
use super::values::{dispatch, rest_bytes};
use crate::error::{Error, Result};

/// Bytes of a coded chunk body's header: one u32 length per lane.
const BODY_HEADER: usize = 4 * LANES;

/// A reusable gear-v2 decoder. [`Decoder::open`] validates a blob and builds its decode
/// tables into buffers kept between calls.
#[derive(Debug, Default)]
pub struct Decoder {
    tables: Vec<u16>,
    used: Vec<u16>,
    shared: SharedTables,
    index: ChunkIndex,
    /// The open blob's decoded row dictionary.
    dictionary: Vec<u8>,
}

/// A validated blob, ready to decode whole or chunk by chunk.
#[derive(Debug, Clone, Copy)]
pub struct OpenBlob<'d, 'b> {
    header: BlobHeader,
    tables: &'d [u16],
    shared: &'d SharedTables,
    index: &'d ChunkIndex,
    dictionary: &'d [u8],
    blob: &'b [u8],
}

impl Decoder {
    /// A new decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates `blob`'s header, model section and chunk index, builds its tables and
    /// decodes its row dictionary, if any.
    pub fn open<'d, 'b>(&'d mut self, blob: &'b [u8]) -> Result<OpenBlob<'d, 'b>> {
        let header = self.read_model(blob)?;
        let mut dictionary = std::mem::take(&mut self.dictionary);
        let r = self
            .blob(header, &[], blob)
            .decode_dictionary(&mut dictionary);
        self.dictionary = dictionary;
        r?;
        Ok(self.blob(header, &self.dictionary, blob))
    }

    fn blob<'d, 'b>(
        &'d self,
        header: BlobHeader,
        dictionary: &'d [u8],
        blob: &'b [u8],
    ) -> OpenBlob<'d, 'b> {
        OpenBlob {
            header,
            tables: &self.tables,
            shared: &self.shared,
            index: &self.index,
            dictionary,
            blob,
        }
    }

    /// Validates the header, model section and chunk index and builds the tables.
    fn read_model(&mut self, blob: &[u8]) -> Result<BlobHeader> {
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
        if header.shared {
            self.shared.read(&header, model)?;
            self.index.read(&header, blob)?;
            return Ok(header);
        }
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
        Ok(header)
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
        let data = &self.blob[self.index.offsets[i]..self.index.offsets[i + 1]];
        let bad = |reason| Error::V2BadChunk { chunk: i, reason };
        match data[0] {
            CHUNK_STORED | CHUNK_CODED => self.decode_plain(data, out).map_err(bad)?,
            CHUNK_REPEATS if self.header.version >= 2 => {
                let tokens = self.header.chunk_tokens_of(i);
                let dict_rows = self.header.dict_rows as usize;
                let refs = RepeatRefs::parse(&data[1..], tokens, dict_rows).map_err(bad)?;
                let row = n / tokens;
                let body = &data[1 + refs.len..];
                let used = self
                    .decode_body(body, &mut out[..refs.unique * row])
                    .map_err(bad)?;
                if used != body.len() {
                    return Err(bad("coded chunk has trailing bytes"));
                }
                refs.expand(out, row, self.dictionary);
            }
            m => {
                return Err(Error::V2BadField {
                    field: "chunk mode",
                    offset: self.index.offsets[i],
                    found: m as u64,
                })
            }
        }
        Ok(n)
    }

    /// Decodes the blob's row dictionary (format version 3) into `dictionary`, a stored or
    /// coded chunk of `dict_rows` rows; leaves it empty when the blob has none.
    fn decode_dictionary(&self, dictionary: &mut Vec<u8>) -> Result<()> {
        let row = self.header.channels as usize * self.header.dtype.size();
        let len = self.header.dict_rows as usize * row;
        dictionary.clear();
        if len == 0 {
            return Ok(());
        }
        dictionary.resize(len, 0);
        let data = &self.blob[self.index.dictionary.clone()];
        match data[0] {
            CHUNK_STORED | CHUNK_CODED => self
                .decode_plain(data, dictionary)
                .map_err(|reason| Error::V2BadDictionary { reason }),
            m => Err(Error::V2BadField {
                field: "dictionary mode",
                offset: self.index.dictionary.start,
                found: m as u64,
            }),
        }
    }

    /// Decodes a stored (mode 0) or coded (mode 1) chunk `data`, mode byte first, into all
    /// of `out`.
    fn decode_plain(&self, data: &[u8], out: &mut [u8]) -> std::result::Result<(), &'static str> {
        if data[0] == CHUNK_STORED {
            if data.len() != 1 + out.len() {
                return Err("stored chunk length differs from its tokens");
            }
            out.copy_from_slice(&data[1..]);
            return Ok(());
        }
        let used = self.decode_body(&data[1..], out)?;
        if 1 + used != data.len() {
            return Err("coded chunk has trailing bytes");
        }
        Ok(())
    }

    /// Decodes one body (lane lengths, lanes, packed low bits) at the start of `body` into
    /// `out`, whose length gives the number of tokens; returns the bytes used.
    fn decode_body(&self, body: &[u8], out: &mut [u8]) -> std::result::Result<usize, &'static str> {
        let values = out.len() / self.header.dtype.size();
        if body.len() < BODY_HEADER {
            return Err("coded chunk shorter than its header");
        }
        let mut starts = [0usize; LANES];
        let mut lens = [0usize; LANES];
        let mut at = BODY_HEADER;
        for k in 0..LANES {
            let o = 4 * k;
            let len = u32::from_le_bytes([body[o], body[o + 1], body[o + 2], body[o + 3]]) as usize;
            if len > body.len() - at {
                return Err("lane runs past the chunk");
            }
            starts[k] = at;
            lens[k] = len;
            at += len;
        }
        // With coded f32 low bytes (flag bit 3): their stream, then 15 packed bits a value.
        let mut low = 0..0;
        let rest_len = if self.header.low_byte {
            let len = body
                .get(at..at + STREAM_LEN_BYTES)
                .ok_or("low-byte stream length runs past the chunk")?;
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            at += STREAM_LEN_BYTES;
            if len > body.len() - at {
                return Err("low-byte stream runs past the chunk");
            }
            low = at..at + len;
            at += len;
            (values * MID_BITS as usize).div_ceil(8)
        } else {
            rest_bytes(self.header.dtype, values)
        };
        let end = at + rest_len;
        if end > body.len() {
            return Err("packed low bits run past the chunk");
        }
        let rest = &body[at..end];
        let low = &body[low];
        let lanes = Lanes {
            data: &body[..end],
            starts,
            lens,
        };
        if self.header.shared {
            let ctx = self.header.sign_context;
            dispatch!(
                self.header.dtype,
                decode_shared(self.shared, ctx, &lanes, rest, out)
            )?;
            if self.header.low_byte {
                self.shared.low_byte().decode(low, out)?;
            }
            return Ok(end);
        }
        let model = LaneModel {
            tables: self.tables,
            channels: self.header.channels as usize,
            group: self.header.group_size as usize,
            sign_context: self.header.sign_context,
        };
        dispatch!(self.header.dtype, decode_coded(&model, &lanes, rest, out))?;
        Ok(end)
    }
}
