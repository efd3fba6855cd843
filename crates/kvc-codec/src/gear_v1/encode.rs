//! The gear-v1 encoder: split into byte streams, try every enabled predictor with both
//! backends, keep the strictly smallest payload, write the frames.

use rayon::prelude::*;

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::gear_v1::frame::{
    element_count, max_encoded_len, Backend, FrameHeader, BLOB_HEADER_LEN,
};
use crate::gear_v1::predictor::{Predictor, PredictorSet};
use crate::gear_v1::rle;
use crate::zstd::{self, ZstdCompressor};

/// What an encoder tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EncodeOptions {
    /// The predictors tried on every stream.
    pub predictors: PredictorSet,
    /// The zstd level of the zstd candidates (gear-v1's default: 3).
    pub zstd_level: i32,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            predictors: PredictorSet::ALL,
            zstd_level: zstd::DEFAULT_LEVEL,
        }
    }
}

/// The choice made for one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Choice {
    predictor: Predictor,
    backend: Backend,
    payload_len: usize,
}

/// A reusable gear-v1 encoder. It keeps its scratch buffers and zstd context between calls,
/// so encoding tensors of the same size allocates nothing after the first call.
pub struct GearV1Encoder {
    options: EncodeOptions,
    zstd: ZstdCompressor,
    /// The current lane's bytes.
    lane: Vec<u8>,
    /// The current predictor's residuals.
    residuals: Vec<u8>,
    /// zstd output of the candidate being tried.
    zstd_try: Vec<u8>,
    /// zstd output of the best zstd candidate so far.
    zstd_best: Vec<u8>,
}

impl GearV1Encoder {
    /// An encoder with the given options; fails on a zstd level the library rejects.
    pub fn new(options: EncodeOptions) -> Result<Self> {
        zstd::check_level(options.zstd_level)?;
        Ok(GearV1Encoder {
            options,
            zstd: ZstdCompressor::new()?,
            lane: Vec::new(),
            residuals: Vec::new(),
            zstd_try: Vec::new(),
            zstd_best: Vec::new(),
        })
    }

    /// The options this encoder uses.
    pub fn options(&self) -> EncodeOptions {
        self.options
    }

    /// Encodes `data` (elements of `dtype`) as one blob at the start of `out` and returns
    /// the blob's length. `out` of [`max_encoded_len`] bytes always suffices; a smaller one
    /// works when the blob fits and fails with [`Error::OutputTooSmall`] otherwise.
    pub fn encode_into(&mut self, dtype: Dtype, data: &[u8], out: &mut [u8]) -> Result<usize> {
        let words = element_count(dtype, data.len())?;
        let width = dtype.size();
        put(out, 0, &(words as u32).to_le_bytes())?;
        let mut off = BLOB_HEADER_LEN;
        for lane in 0..width {
            off = self.encode_lane(data, width, lane, words, out, off)?;
        }
        Ok(off)
    }

    /// Encodes `data` as one blob into `out`, replacing its contents.
    pub fn encode(&mut self, dtype: Dtype, data: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let bound = max_encoded_len(dtype, data.len())?;
        out.clear();
        out.resize(bound, 0);
        let n = self.encode_into(dtype, data, out)?;
        out.truncate(n);
        Ok(())
    }

    /// Encodes `data` as one new blob.
    pub fn encode_to_vec(&mut self, dtype: Dtype, data: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode(dtype, data, &mut out)?;
        Ok(out)
    }

    /// Encodes byte `lane` of every `width`-byte element as one frame at `out[off..]` and
    /// returns the offset after it.
    fn encode_lane(
        &mut self,
        data: &[u8],
        width: usize,
        lane: usize,
        words: usize,
        out: &mut [u8],
        off: usize,
    ) -> Result<usize> {
        if words == 0 {
            let header = FrameHeader {
                predictor: Predictor::Raw,
                backend: Backend::Rle,
                raw_len: 0,
                payload_len: 0,
            };
            return put(out, off, &header.to_bytes());
        }
        self.lane.clear();
        self.lane
            .extend(data[lane..].iter().step_by(width).take(words).copied());
        self.residuals.resize(words, 0);
        let bound = zstd::compress_bound(words).ok_or(Error::GearV1TooManyElements {
            elements: words,
            max: crate::gear_v1::frame::MAX_ELEMENTS,
        })?;
        self.zstd_try.resize(bound, 0);
        self.zstd_best.resize(bound, 0);

        let mut best: Option<Choice> = None;
        let mut residuals_hold: Option<Predictor> = None;
        for predictor in self.options.predictors.iter() {
            let stream: &[u8] = if predictor == Predictor::Raw {
                &self.lane
            } else {
                predictor.forward(&self.lane, &mut self.residuals);
                residuals_hold = Some(predictor);
                &self.residuals
            };
            let rle_len = rle::encoded_len(stream);
            if best.is_none_or(|b| rle_len < b.payload_len) {
                best = Some(Choice {
                    predictor,
                    backend: Backend::Rle,
                    payload_len: rle_len,
                });
            }
            let z_len =
                self.zstd
                    .compress_into(stream, self.options.zstd_level, &mut self.zstd_try)?;
            if best.is_none_or(|b| z_len < b.payload_len) {
                best = Some(Choice {
                    predictor,
                    backend: Backend::Zstd,
                    payload_len: z_len,
                });
                std::mem::swap(&mut self.zstd_try, &mut self.zstd_best);
            }
        }
        let best = best.ok_or(Error::GearV1EmptyPredictorSet)?;
        let header = FrameHeader {
            predictor: best.predictor,
            backend: best.backend,
            raw_len: words as u32,
            payload_len: u32::try_from(best.payload_len).map_err(|_| {
                Error::GearV1TooManyElements {
                    elements: words,
                    max: crate::gear_v1::frame::MAX_ELEMENTS,
                }
            })?,
        };
        let payload_off = put(out, off, &header.to_bytes())?;
        let end = payload_off + best.payload_len;
        if out.len() < end {
            return Err(Error::OutputTooSmall {
                needed: end,
                available: out.len(),
            });
        }
        match best.backend {
            Backend::Zstd => {
                out[payload_off..end].copy_from_slice(&self.zstd_best[..best.payload_len])
            }
            Backend::Rle => {
                let stream: &[u8] = if best.predictor == Predictor::Raw {
                    &self.lane
                } else {
                    if residuals_hold != Some(best.predictor) {
                        best.predictor.forward(&self.lane, &mut self.residuals);
                    }
                    &self.residuals
                };
                rle::encode_into(stream, &mut out[payload_off..end])?;
            }
        }
        Ok(end)
    }
}

/// Writes `bytes` at `out[off..]`, returning the offset after them.
fn put(out: &mut [u8], off: usize, bytes: &[u8]) -> Result<usize> {
    let end = off + bytes.len();
    match out.get_mut(off..end) {
        Some(dst) => {
            dst.copy_from_slice(bytes);
            Ok(end)
        }
        None => Err(Error::OutputTooSmall {
            needed: end,
            available: out.len(),
        }),
    }
}

/// Encodes `data` as independent blobs of `chunk_bytes` each (the last may be shorter),
/// in parallel on rayon's pool, one encoder per worker. Blob `i` holds bytes
/// `i * chunk_bytes ..` of `data`.
pub fn encode_chunks_parallel(
    options: EncodeOptions,
    dtype: Dtype,
    data: &[u8],
    chunk_bytes: usize,
) -> Result<Vec<Vec<u8>>> {
    if chunk_bytes == 0 || !chunk_bytes.is_multiple_of(dtype.size()) {
        return Err(Error::InvalidChunkSize { dtype, chunk_bytes });
    }
    element_count(dtype, data.len())?;
    zstd::check_level(options.zstd_level)?;
    data.par_chunks(chunk_bytes)
        .map_init(
            || GearV1Encoder::new(options),
            |encoder, chunk| match encoder {
                Ok(e) => e.encode_to_vec(dtype, chunk),
                Err(err) => Err(err.clone()),
            },
        )
        .collect()
}
