//! The gear-v1 decoder: validate the blob's structure, decode each frame's payload, undo
//! its predictor and interleave the lanes back into elements.

use rayon::prelude::*;

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::gear_v1::frame::{Backend, BlobLayout};
use crate::gear_v1::rle;
use crate::zstd::ZstdDecompressor;

/// A reusable gear-v1 decoder. It keeps one stream-sized scratch buffer and a zstd context
/// between calls, so decoding blobs of the same size allocates nothing after the first.
pub struct GearV1Decoder {
    zstd: ZstdDecompressor,
    residuals: Vec<u8>,
}

impl GearV1Decoder {
    /// A decoder.
    pub fn new() -> Result<Self> {
        Ok(GearV1Decoder {
            zstd: ZstdDecompressor::new()?,
            residuals: Vec::new(),
        })
    }

    /// Decodes `blob` (elements of `dtype`) into the start of `out` and returns the number
    /// of bytes written. Fails with [`Error::OutputTooSmall`] when `out` is shorter than the
    /// blob's decoded length, and with a `CorruptData` error on any malformed blob; on an
    /// error the contents of `out` are unspecified.
    pub fn decode_into(&mut self, dtype: Dtype, blob: &[u8], out: &mut [u8]) -> Result<usize> {
        let layout = BlobLayout::parse(blob, dtype)?;
        let len = layout.decoded_len(dtype);
        if out.len() < len {
            return Err(Error::OutputTooSmall {
                needed: len,
                available: out.len(),
            });
        }
        self.decode_layout(dtype, blob, &layout, &mut out[..len])?;
        Ok(len)
    }

    /// Decodes `blob` into `out`, replacing its contents. `out` grows only to the decoded
    /// length, which was checked against the blob's size first.
    pub fn decode(&mut self, dtype: Dtype, blob: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let layout = BlobLayout::parse(blob, dtype)?;
        let len = layout.decoded_len(dtype);
        out.clear();
        out.resize(len, 0);
        let result = self.decode_layout(dtype, blob, &layout, out);
        if result.is_err() {
            out.clear();
        }
        result
    }

    /// Decodes `blob` into a new vector.
    pub fn decode_to_vec(&mut self, dtype: Dtype, blob: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.decode(dtype, blob, &mut out)?;
        Ok(out)
    }

    fn decode_layout(
        &mut self,
        dtype: Dtype,
        blob: &[u8],
        layout: &BlobLayout,
        out: &mut [u8],
    ) -> Result<()> {
        let width = dtype.size();
        let words = layout.word_count as usize;
        debug_assert_eq!(out.len(), words * width);
        self.residuals.resize(words, 0);
        for (lane, frame) in layout.frames().enumerate() {
            let h = frame.header;
            let payload =
                &blob[frame.payload_offset..frame.payload_offset + h.payload_len as usize];
            let residuals = &mut self.residuals[..words];
            match h.backend {
                Backend::Rle => rle::decode_into(payload, residuals, lane)?,
                Backend::Zstd => self.zstd.decompress_exact(payload, residuals)?,
            }
            h.predictor.inverse_interleave(residuals, out, width, lane);
        }
        Ok(())
    }
}

/// Decodes independent blobs (as written by
/// [`encode_chunks_parallel`](crate::gear_v1::encode_chunks_parallel)) in parallel on
/// rayon's pool, concatenating their outputs into `out`, whose length must equal the sum
/// of their decoded lengths.
pub fn decode_chunks_parallel<B: AsRef<[u8]> + Sync>(
    dtype: Dtype,
    blobs: &[B],
    out: &mut [u8],
) -> Result<()> {
    let mut lens = Vec::with_capacity(blobs.len());
    let mut total = 0usize;
    for blob in blobs {
        let len = BlobLayout::parse(blob.as_ref(), dtype)?.decoded_len(dtype);
        total = total.saturating_add(len);
        lens.push(len);
    }
    if total != out.len() {
        return Err(Error::ChunkSizesMismatch {
            decoded: total,
            output: out.len(),
        });
    }
    let mut parts = Vec::with_capacity(blobs.len());
    let mut rest = out;
    for &len in &lens {
        let (head, tail) = rest.split_at_mut(len);
        parts.push(head);
        rest = tail;
    }
    parts
        .into_par_iter()
        .zip(blobs.par_iter())
        .map_init(GearV1Decoder::new, |decoder, (part, blob)| match decoder {
            Ok(d) => d.decode_into(dtype, blob.as_ref(), part).map(|_| ()),
            Err(err) => Err(err.clone()),
        })
        .collect()
}
