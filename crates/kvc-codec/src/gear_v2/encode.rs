//! The gear-v2 encoder.

use super::code_index::{channel_major_indices, CTX_STEP};
use super::format::{BlobHeader, TensorKind, HEADER_LEN, MAX_CHANNELS, VERSION};
use super::huffman;
use super::lanes;
use super::low_byte;
use super::model::EncoderModel;
use super::repeats::{RepeatPlan, CHUNK_REPEATS};
use super::shared::{RelMap, SHARED_MAX_LEN};
use super::values::dispatch;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use std::cell::RefCell;

/// Default tokens per chunk: the random-access granularity.
pub const DEFAULT_CHUNK_TOKENS: u32 = 256;

/// Chunk mode byte: the values follow raw, as in the input.
pub(crate) const CHUNK_STORED: u8 = 0;
/// Chunk mode byte: four Huffman lanes and the packed low bits follow.
pub(crate) const CHUNK_CODED: u8 = 1;
/// Interleaved Huffman lanes per chunk (channel `c` is in lane `c % LANES`).
pub(crate) const LANES: usize = 4;

/// What to encode: the tensor's element type and shape, and the chunking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeParams {
    /// Element type.
    pub dtype: Dtype,
    /// Channels per token (`kv_heads * head_dim`).
    pub channels: u32,
    /// Tensor kind, recorded in the header.
    pub kind: TensorKind,
    /// Tokens per independently decodable chunk.
    pub chunk_tokens: u32,
}

impl EncodeParams {
    /// Parameters with the default chunking and no recorded kind.
    pub fn new(dtype: Dtype, channels: u32) -> Self {
        EncodeParams {
            dtype,
            channels,
            kind: TensorKind::Unspecified,
            chunk_tokens: DEFAULT_CHUNK_TOKENS,
        }
    }

    /// Checks the parameters against an input of `len` bytes; returns the token count.
    pub fn tokens_for(&self, len: usize) -> Result<u32> {
        if self.channels == 0 {
            return Err(Error::V2ZeroChannels);
        }
        if self.channels > MAX_CHANNELS {
            return Err(Error::V2TooLarge { what: "channels" });
        }
        if self.chunk_tokens == 0 {
            return Err(Error::V2ZeroChunkTokens);
        }
        let token_bytes = self.channels as usize * self.dtype.size();
        if !len.is_multiple_of(token_bytes) {
            return Err(Error::V2InputNotWholeTokens { len, token_bytes });
        }
        u32::try_from(len / token_bytes).map_err(|_| Error::V2TooLarge { what: "tokens" })
    }
}

/// The largest blob [`Encoder::encode_into`] can produce for `input_len` bytes.
pub fn max_encoded_len(params: &EncodeParams, input_len: usize) -> Result<usize> {
    let tokens = params.tokens_for(input_len)? as usize;
    let chunks = tokens.div_ceil(params.chunk_tokens as usize);
    let tables = params.channels as usize * 2;
    // A table is at most 2 run bytes per 128 symbols plus a nibble per symbol.
    let table_max = params.dtype.size().max(2) * 256 / 2 + 8 + 512 / 2;
    // The shared-shape model adds a cluster count and three bytes per channel.
    let shared = 1 + 3 * params.channels as usize;
    Ok(HEADER_LEN + shared + tables * table_max + chunks * (4 + 1) + input_len)
}

/// Which model (and coder) the encoder writes; the decoder reads both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Coder {
    /// One table per group of channels (and previous sign), codes up to 9 bits, one symbol
    /// per lookup: the first gear-v2 coder.
    Grouped,
    /// Relative symbols, a few tables shared by clusters of channels, codes up to 11 bits
    /// decoded up to two symbols per lookup (flag bit 1): smaller than [`Coder::Grouped`] on
    /// every real f16, bf16, f32 and int8 KV tensor, and about as fast to decode.
    SharedShape,
    /// The default, the coder measured smallest on real KV: [`Coder::SharedShape`] for every
    /// dtype (on int8 it codes wrapping differences from each channel's median, flag bit 2,
    /// and was smaller than [`Coder::Grouped`] on all 60 C8-quantized whole-layer tensors of
    /// the 30-layer data).
    #[default]
    Auto,
}

/// A reusable gear-v2 encoder: its buffers are kept between calls, so encoding tensors of
/// a steady shape allocates nothing after the first call.
#[derive(Debug, Default)]
pub struct Encoder {
    model: EncoderModel,
    coder: Coder,
    plan: RepeatPlan,
    pub(crate) chunk_bufs: Vec<Vec<u8>>,
}

/// One way of encoding a whole planned blob: serial or parallel over chunks.
type EncodePass = fn(&mut Encoder, &EncodeParams, &[u8], &mut Vec<u8>) -> Result<()>;

impl Encoder {
    /// A new encoder with the default coder, [`Coder::Auto`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A new encoder that writes `coder`'s model.
    pub fn with_coder(coder: Coder) -> Self {
        Encoder {
            coder,
            ..Self::default()
        }
    }

    /// Encodes `input` (whole tokens, token-major) into a fresh vector.
    pub fn encode(&mut self, params: &EncodeParams, input: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode_into(params, input, &mut out)?;
        Ok(out)
    }

    /// Encodes `input` into `out` (cleared first; its capacity is reused).
    pub fn encode_into(
        &mut self,
        params: &EncodeParams,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        self.plan_and_encode(params, input, out, Self::encode_serial)
    }

    /// Plans the repeated tokens, then runs `pass`.
    pub(crate) fn plan_and_encode(
        &mut self,
        params: &EncodeParams,
        input: &[u8],
        out: &mut Vec<u8>,
        pass: EncodePass,
    ) -> Result<()> {
        params.tokens_for(input.len())?;
        let row_bytes = params.channels as usize * params.dtype.size();
        let ct = params.chunk_tokens as usize;
        self.plan.plan(input, row_bytes, ct, true);
        pass(self, params, input, out)?;
        // A row dictionary whose references do not pay (rows too short for a reference to
        // save bytes, chunks stored anyway) could in theory cost more than the format's
        // bound promises; then the blob is written without it.
        if self.plan.dict_rows > 0 && out.len() > max_encoded_len(params, input.len())? {
            self.plan.plan(input, row_bytes, ct, false);
            pass(self, params, input, out)?;
        }
        Ok(())
    }

    fn encode_serial(
        &mut self,
        params: &EncodeParams,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let entries = self.prepare(params, input, out)?;
        let index_at = out.len();
        out.resize(index_at + 4 * entries, 0);
        for e in 0..entries {
            let start = out.len();
            self.encode_entry(params, input, e, out);
            let len = (out.len() - start) as u32;
            out[index_at + 4 * e..index_at + 4 * e + 4].copy_from_slice(&len.to_le_bytes());
        }
        Ok(())
    }

    /// Fits the model on the rows [`Encoder::plan_and_encode`] planned and writes header and model
    /// section; returns the entries of the chunk index (the chunks, and the row dictionary
    /// first when there is one).
    pub(crate) fn prepare(
        &mut self,
        params: &EncodeParams,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize> {
        let tokens = params.tokens_for(input.len())?;
        let channels = params.channels as usize;
        self.model.fit(
            params.dtype,
            channels,
            &self.plan.chunk_tokens,
            self.plan.coded(input),
            self.coder != Coder::Grouped,
        );
        let model_len = u32::try_from(self.model.section.len()).map_err(|_| Error::V2TooLarge {
            what: "model section",
        })?;
        let header = BlobHeader {
            version: VERSION,
            dtype: params.dtype,
            kind: params.kind,
            tokens,
            channels: params.channels,
            chunk_tokens: params.chunk_tokens,
            group_size: self.model.group_size,
            sign_context: self.model.sign_context,
            shared: self.model.shared,
            wrapping: self.model.wrapping,
            low_byte: self.model.low_byte.on,
            model_len,
            dict_rows: self.plan.dict_rows as u32,
        };
        out.clear();
        header.write(out);
        out.extend_from_slice(&self.model.section);
        Ok(header.index_entries())
    }

    /// Appends entry `e` of the chunk index: the row dictionary when the blob has one and
    /// `e` is 0, else a chunk.
    pub(crate) fn encode_entry(
        &self,
        params: &EncodeParams,
        input: &[u8],
        e: usize,
        out: &mut Vec<u8>,
    ) {
        match e.checked_sub((self.plan.dict_rows > 0) as usize) {
            Some(i) => self.encode_chunk(params, input, i, out),
            None => {
                // The dictionary's rows are distinct: coded, or stored if that is smaller.
                let rows = self.plan.dictionary();
                let start = out.len();
                out.push(CHUNK_CODED);
                self.encode_body(params, rows, out);
                store_if_larger(out, start, rows);
            }
        }
    }

    /// Appends chunk `i` of `input` to `out` as planned by [`Encoder::prepare`]: coded (with
    /// its repeated tokens as references when it has any), or stored when coding would not
    /// be smaller.
    pub(crate) fn encode_chunk(
        &self,
        params: &EncodeParams,
        input: &[u8],
        i: usize,
        out: &mut Vec<u8>,
    ) {
        let start = out.len();
        let c = params.channels as usize;
        let row_bytes = c * params.dtype.size();
        let ct = params.chunk_tokens as usize;
        let t0 = i * ct;
        let t1 = (t0 + ct).min(input.len() / row_bytes);
        let raw = &input[t0 * row_bytes..t1 * row_bytes];
        let (rows, refs) = self.plan.chunk(input, i);
        match refs {
            Some(refs) => {
                out.push(CHUNK_REPEATS);
                out.extend_from_slice(refs);
            }
            None => out.push(CHUNK_CODED),
        }
        self.encode_body(params, rows, out);
        store_if_larger(out, start, raw);
    }

    fn encode_body(&self, params: &EncodeParams, rows: &[u8], out: &mut Vec<u8>) {
        let c = params.channels as usize;
        dispatch!(params.dtype, encode_body(&self.model, c, rows, out));
    }
}

/// Replaces the chunk written to `out` from `start` by a stored chunk of `raw` when the
/// coded one is longer than `raw`.
fn store_if_larger(out: &mut Vec<u8>, start: usize, raw: &[u8]) {
    if out.len() - start > raw.len() {
        out.truncate(start);
        out.push(CHUNK_STORED);
        out.extend_from_slice(raw);
    }
}

thread_local! {
    /// A block of token-major code indices, the chunk's channel-major ones and the lanes'
    /// scratch regions (kept per thread between chunks: no allocation in steady state).
    static CHUNK_SCRATCH: RefCell<(Vec<u16>, Vec<u16>, Vec<u8>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Appends a coded chunk's body (lane lengths, lanes, packed low bits) for the rows `raw`.
fn encode_body<const BPV: usize, const REST: u32, const SYM: u32>(
    model: &EncoderModel,
    channels: usize,
    raw: &[u8],
    out: &mut Vec<u8>,
) {
    let lens_at = out.len();
    out.resize(lens_at + 4 * LANES, 0);
    let codes = lanes::LaneCodes {
        bits: &model.code_bits,
        lens: &model.code_lens,
        chan_table: &model.chan_table,
        order: &model.chan_order,
        sign_context: model.sign_context,
        max_len: if model.shared {
            SHARED_MAX_LEN
        } else {
            huffman::MAX_LEN
        },
    };
    let map = if model.wrapping {
        RelMap::wrapping(SYM)
    } else {
        RelMap::sign_magnitude(SYM)
    };
    CHUNK_SCRATCH.with(|buf| {
        let (block, cm, lane_scratch) = &mut *buf.borrow_mut();
        let values = raw.len() / BPV;
        if cm.len() < values {
            cm.resize(values, 0);
        }
        let cm = &mut cm[..values];
        let step = if model.sign_context { CTX_STEP } else { 0 };
        channel_major_indices::<BPV, REST, SYM>(raw, &model.chan_loc, map, step, block, cm);
        lanes::encode_lanes(&codes, channels, cm, lane_scratch, out, lens_at);
    });
    if BPV == 4 && model.low_byte.on {
        model.low_byte.encode(raw, out);
        low_byte::pack_mid_bits(raw, out);
        return;
    }
    lanes::pack_low_bits::<BPV, REST>(raw, out);
}
