//! gear-v1: the MNN "gear predictive" lossless format, byte-exact.
//!
//! A tensor of `word_count` elements is split into one byte stream per byte of the element
//! (fp16/bf16: lo, hi; fp32: lanes 0..3; int8: one stream). Each stream is coded with the
//! smallest of {enabled predictors} x {RLE, zstd}, tried in the order raw/RLE, raw/zstd,
//! delta/RLE, delta/zstd, xor/RLE, xor/zstd, a later candidate winning only when strictly
//! smaller. See `docs/formats/gear-v1.md` for the byte layout.
//!
//! ```
//! use kvc_codec::gear_v1::{EncodeOptions, GearV1Decoder, GearV1Encoder};
//! use kvc_codec::Dtype;
//!
//! let data: Vec<u8> = (0..512u32).flat_map(|i| ((i % 7) as u16 * 3).to_le_bytes()).collect();
//! let mut encoder = GearV1Encoder::new(EncodeOptions::default())?;
//! let blob = encoder.encode_to_vec(Dtype::F16, &data)?;
//! let mut decoder = GearV1Decoder::new()?;
//! assert_eq!(decoder.decode_to_vec(Dtype::F16, &blob)?, data);
//! # Ok::<(), kvc_codec::Error>(())
//! ```

mod decode;
mod encode;
pub mod frame;
pub mod predictor;
pub mod rle;

pub use decode::{decode_chunks_parallel, GearV1Decoder};
pub use encode::{encode_chunks_parallel, EncodeOptions, GearV1Encoder};
pub use frame::{decoded_len, max_encoded_len, Backend, BlobLayout, FrameHeader};
pub use predictor::{KvPredictorSets, Predictor, PredictorSet};
