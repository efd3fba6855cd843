//! gear-v1's byte layout: stream frames and the blob that holds them.
//!
//! ```text
//! blob   = [u32le word_count] frame{lanes}        lanes: f16/bf16 2 (lo, hi), f32 4, i8 1
//! frame  = [u8 mode][u8 codec][u32le raw_len][u32le payload_len][payload]
//! ```
//! Every frame's `raw_len` equals `word_count`; an empty stream is `0, 0, 0, 0` with no
//! payload.

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::gear_v1::predictor::Predictor;
use crate::gear_v1::rle;

/// Bytes of the blob header (`word_count`).
pub const BLOB_HEADER_LEN: usize = 4;
/// Bytes of a frame header.
pub const FRAME_HEADER_LEN: usize = 10;
/// The most elements one blob holds: `word_count` is a u32 and the worst-case RLE payload
/// of a stream must fit `payload_len`, a u32.
pub const MAX_ELEMENTS: usize = (u32::MAX as u64 * 128 / 129) as usize;
/// A zstd frame cannot expand more than this many times (a 4-byte RLE block gives at
/// most 128 KiB); used to reject impossible `raw_len`s before anything is allocated.
const ZSTD_MAX_EXPANSION: u64 = 32 * 1024;

/// The backend of a frame; its discriminant is the frame's `codec` byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Backend {
    /// gear-v1's run-length code ([`rle`]).
    Rle = 0,
    /// One zstd frame.
    Zstd = 1,
}

impl Backend {
    /// The backend of a codec byte, if it is one.
    pub const fn from_codec(codec: u8) -> Option<Backend> {
        match codec {
            0 => Some(Backend::Rle),
            1 => Some(Backend::Zstd),
            _ => None,
        }
    }

    /// `rle` or `zstd`.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Rle => "rle",
            Backend::Zstd => "zstd",
        }
    }
}

/// A decoded, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The predictor of the stream.
    pub predictor: Predictor,
    /// The backend of the payload.
    pub backend: Backend,
    /// Length of the stream in bytes.
    pub raw_len: u32,
    /// Length of the payload in bytes.
    pub payload_len: u32,
}

impl FrameHeader {
    /// The 10 header bytes.
    pub fn to_bytes(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0] = self.predictor.mode();
        b[1] = self.backend as u8;
        b[2..6].copy_from_slice(&self.raw_len.to_le_bytes());
        b[6..10].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }
}

/// One frame located inside a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRef {
    /// Its header.
    pub header: FrameHeader,
    /// Offset of its payload in the blob.
    pub payload_offset: usize,
}

/// The validated structure of a blob: `word_count` and one frame per lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobLayout {
    /// Elements in the tensor.
    pub word_count: u32,
    /// The frames, lane 0 first. Only the first `lanes` entries are used.
    frames: [Option<FrameRef>; 4],
    lanes: usize,
}

impl BlobLayout {
    /// The frames in lane order.
    pub fn frames(&self) -> impl Iterator<Item = &FrameRef> {
        self.frames[..self.lanes].iter().flatten()
    }

    /// Bytes the blob decodes to.
    pub fn decoded_len(&self, dtype: Dtype) -> usize {
        self.word_count as usize * dtype.size()
    }

    /// Reads and validates the structure of `blob` for `dtype`: every header, every
    /// `raw_len` against `word_count`, every payload inside the blob, no trailing bytes,
    /// and no `raw_len` larger than its payload could expand to. Payloads are not decoded.
    pub fn parse(blob: &[u8], dtype: Dtype) -> Result<BlobLayout> {
        let word_count = match blob.get(..BLOB_HEADER_LEN) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => {
                return Err(Error::GearV1Truncated {
                    what: "word_count",
                    stream: None,
                    offset: 0,
                    needed: BLOB_HEADER_LEN,
                    available: blob.len(),
                })
            }
        };
        let mut layout = BlobLayout {
            word_count,
            frames: [None; 4],
            lanes: dtype.size(),
        };
        let mut off = BLOB_HEADER_LEN;
        for stream in 0..dtype.size() {
            let h = blob
                .get(off..off + FRAME_HEADER_LEN)
                .ok_or(Error::GearV1Truncated {
                    what: "frame header",
                    stream: Some(stream),
                    offset: off,
                    needed: FRAME_HEADER_LEN,
                    available: blob.len() - off,
                })?;
            let predictor = Predictor::from_mode(h[0])
                .ok_or(Error::GearV1UnknownMode { stream, mode: h[0] })?;
            let backend = Backend::from_codec(h[1]).ok_or(Error::GearV1UnknownCodec {
                stream,
                codec: h[1],
            })?;
            let raw_len = u32::from_le_bytes([h[2], h[3], h[4], h[5]]);
            let payload_len = u32::from_le_bytes([h[6], h[7], h[8], h[9]]);
            if raw_len != word_count {
                return Err(Error::GearV1RawLenMismatch {
                    stream,
                    raw_len,
                    word_count,
                });
            }
            let payload_offset = off + FRAME_HEADER_LEN;
            let left = blob.len() - payload_offset;
            if payload_len as usize > left {
                return Err(Error::GearV1Truncated {
                    what: "payload",
                    stream: Some(stream),
                    offset: payload_offset,
                    needed: payload_len as usize,
                    available: left,
                });
            }
            let max_raw = match backend {
                Backend::Rle => (payload_len as u64 / 2) * rle::MAX_RUN as u64,
                Backend::Zstd => payload_len as u64 * ZSTD_MAX_EXPANSION,
            };
            if raw_len as u64 > max_raw {
                return Err(Error::GearV1ImplausibleRawLen {
                    stream,
                    raw_len,
                    payload_len,
                });
            }
            layout.frames[stream] = Some(FrameRef {
                header: FrameHeader {
                    predictor,
                    backend,
                    raw_len,
                    payload_len,
                },
                payload_offset,
            });
            off = payload_offset + payload_len as usize;
        }
        if off != blob.len() {
            return Err(Error::GearV1TrailingBytes {
                offset: off,
                count: blob.len() - off,
            });
        }
        Ok(layout)
    }
}

/// The largest gear-v1 blob for `input_len` bytes of `dtype`: the header plus, per lane,
/// a frame header and the worst-case RLE payload (no candidate chosen is ever larger).
pub fn max_encoded_len(dtype: Dtype, input_len: usize) -> Result<usize> {
    let words = element_count(dtype, input_len)?;
    Ok(BLOB_HEADER_LEN + dtype.size() * (FRAME_HEADER_LEN + rle::max_encoded_len(words)))
}

/// The number of elements in `input_len` bytes of `dtype`, checked against gear-v1's limits.
pub fn element_count(dtype: Dtype, input_len: usize) -> Result<usize> {
    if !input_len.is_multiple_of(dtype.size()) {
        return Err(Error::InputNotWholeElements {
            dtype,
            len: input_len,
        });
    }
    let words = input_len / dtype.size();
    if words > MAX_ELEMENTS {
        return Err(Error::GearV1TooManyElements {
            elements: words,
            max: MAX_ELEMENTS,
        });
    }
    Ok(words)
}

/// Bytes `blob` decodes to as `dtype`, after validating its structure.
pub fn decoded_len(dtype: Dtype, blob: &[u8]) -> Result<usize> {
    BlobLayout::parse(blob, dtype).map(|l| l.decoded_len(dtype))
}
