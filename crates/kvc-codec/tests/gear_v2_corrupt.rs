//! gear-v2 validation: every bit flip and every truncation of small blobs, bad header
//! fields, and the committed golden blobs.

use kvc_codec::gear_v2::{Coder, Decoder, EncodeParams, Encoder, TensorKind};
use kvc_codec::{Dtype, Error, ErrorKind};
use std::path::PathBuf;

fn sample(dtype: Dtype, tokens: usize, channels: usize, seed: u64) -> Vec<u8> {
    // Small values of mixed sign, like a KV cache: coded chunks, several tables.
    let mut s = seed;
    let mut out = Vec::new();
    for i in 0..tokens * channels {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let x = ((s % 1000) as f32 / 250.0 - 2.0) * (1.0 + (i % channels) as f32);
        match dtype {
            Dtype::F16 => out.extend_from_slice(&half_bits(x).to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes()),
            Dtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            Dtype::I8 => out.push((x * 8.0).clamp(-128.0, 127.0) as i8 as u8),
        }
    }
    out
}

/// f32 -> f16 bits by truncation (enough for test data).
fn half_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if e <= 0 {
        return sign;
    }
    sign | ((e.min(30) as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

const DTYPES: [Dtype; 4] = [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8];

fn small_blob(dtype: Dtype) -> (Vec<u8>, Vec<u8>) {
    small_blob_with(Coder::Grouped, dtype)
}

fn small_blob_with(coder: Coder, dtype: Dtype) -> (Vec<u8>, Vec<u8>) {
    // Few distinct values with shared low bits so that the chunks are Huffman-coded.
    let pool = sample(dtype, 1, 3, 11);
    let size = dtype.width();
    let mut data = Vec::new();
    for i in 0..40usize {
        let k = (i * 7 + i / 5) % 3;
        data.extend_from_slice(&pool[k * size..(k + 1) * size]);
    }
    let mut p = EncodeParams::new(dtype, 5);
    p.chunk_tokens = 5;
    p.kind = TensorKind::V;
    let blob = Encoder::with_coder(coder).encode(&p, &data).unwrap();
    // The first chunk must be coded (mode byte 1) for the flips to reach the Huffman lanes.
    let model_len = u32::from_le_bytes(blob[24..28].try_into().unwrap()) as usize;
    let first_chunk = 32 + model_len + 4 * 2;
    assert_eq!(blob[first_chunk], 1, "{dtype}: first chunk stored");
    (blob, data)
}

#[test]
fn every_bit_flip_and_truncation() {
    let mut dec = Decoder::new();
    for (coder, dtype) in [Coder::Grouped, Coder::SharedShape]
        .into_iter()
        .flat_map(|c| DTYPES.map(|d| (c, d)))
    {
        let (blob, data) = small_blob_with(coder, dtype);
        assert_eq!(blob[7] & 2 != 0, coder == Coder::SharedShape);
        assert_eq!(dec.decode(&blob).unwrap(), data);
        for n in 0..blob.len() {
            let e = dec.decode(&blob[..n]).unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::CorruptData),
                "{dtype} truncated to {n}: {e:?}"
            );
        }
        let mut m = blob.clone();
        for byte in 0..blob.len() {
            for bit in 0..8 {
                m[byte] ^= 1 << bit;
                // Never a panic; either an error or some other valid tensor.
                if let Ok(out) = dec.decode(&m) {
                    assert!(out.len() <= 16 * m.len());
                }
                m[byte] ^= 1 << bit;
            }
        }
    }
}

fn header_with(blob: &[u8], offset: usize, bytes: &[u8]) -> Vec<u8> {
    let mut m = blob.to_vec();
    m[offset..offset + bytes.len()].copy_from_slice(bytes);
    m
}

#[test]
fn bad_header_fields_are_named() {
    let (blob, _) = small_blob(Dtype::F16);
    let mut dec = Decoder::new();
    let e = |m: Vec<u8>| Decoder::new().decode(&m).unwrap_err();
    assert!(matches!(
        e(header_with(&blob, 0, b"KVG1")),
        Error::V2BadMagic { .. }
    ));
    assert!(matches!(
        e(header_with(&blob, 4, &[2])),
        Error::V2UnsupportedVersion { found: 2 }
    ));
    assert!(matches!(
        e(header_with(&blob, 5, &[9])),
        Error::V2BadField { field: "dtype", .. }
    ));
    assert!(matches!(
        e(header_with(&blob, 6, &[3])),
        Error::V2BadField { field: "kind", .. }
    ));
    assert!(matches!(
        e(header_with(&blob, 7, &[0x80])),
        Error::V2BadField { field: "flags", .. }
    ));
    assert!(matches!(
        e(header_with(&blob, 12, &0u32.to_le_bytes())),
        Error::V2BadField {
            field: "channels",
            ..
        }
    ));
    assert!(matches!(
        e(header_with(&blob, 16, &0u32.to_le_bytes())),
        Error::V2BadField {
            field: "chunk_tokens",
            ..
        }
    ));
    assert!(matches!(
        e(header_with(&blob, 20, &6u32.to_le_bytes())),
        Error::V2BadField {
            field: "group_size",
            ..
        }
    ));
    assert!(matches!(
        e(header_with(&blob, 28, &1u32.to_le_bytes())),
        Error::V2BadField {
            field: "reserved",
            ..
        }
    ));
    // Huge shapes are refused against the input, not allocated.
    let huge = header_with(&blob, 8, &u32::MAX.to_le_bytes());
    assert_eq!(e(huge).kind(), ErrorKind::CorruptData);
    let open = dec.open(&blob).unwrap();
    let chunks = open.chunk_count();
    assert!(matches!(
        open.decode_chunk_into(chunks, &mut [0u8; 64]),
        Err(Error::V2ChunkOutOfRange { .. })
    ));
    assert!(matches!(
        open.decode_chunk_into(0, &mut [0u8; 1]),
        Err(Error::OutputTooSmall { .. })
    ));
}

#[test]
fn encoder_rejects_bad_arguments() {
    let mut enc = Encoder::new();
    let mut p = EncodeParams::new(Dtype::F16, 0);
    assert_eq!(enc.encode(&p, &[]).unwrap_err(), Error::V2ZeroChannels);
    p.channels = 3;
    assert!(matches!(
        enc.encode(&p, &[0u8; 5]).unwrap_err(),
        Error::V2InputNotWholeTokens {
            len: 5,
            token_bytes: 6
        }
    ));
    p.chunk_tokens = 0;
    assert_eq!(
        enc.encode(&p, &[0u8; 6]).unwrap_err(),
        Error::V2ZeroChunkTokens
    );
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The golden blobs were written by this version (set KVC_WRITE_GOLDEN=1 to write them
/// once); every later version must still decode them to the committed raw bytes.
#[test]
fn golden_v2_blobs_decode() {
    let dir = golden_dir();
    let write = std::env::var_os("KVC_WRITE_GOLDEN").is_some();
    let mut dec = Decoder::new();
    for dtype in DTYPES {
        let name = format!("gear-v2.{}", dtype.name());
        let blob_path = dir.join(format!("{name}.kvg2"));
        let raw_path = dir.join(format!("{name}.raw"));
        if write {
            let data = sample(dtype, 40, 12, 5);
            let mut p = EncodeParams::new(dtype, 12);
            p.chunk_tokens = 16;
            p.kind = TensorKind::K;
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&blob_path, Encoder::new().encode(&p, &data).unwrap()).unwrap();
            std::fs::write(&raw_path, &data).unwrap();
        }
        let blob = std::fs::read(&blob_path).unwrap();
        let raw = std::fs::read(&raw_path).unwrap();
        let open = dec.open(&blob).unwrap();
        assert_eq!(open.header().dtype, dtype);
        assert_eq!(open.header().channels, 12);
        assert_eq!(open.header().tokens, 40);
        assert_eq!(dec.decode(&blob).unwrap(), raw, "{name}");
    }
}

/// Golden blobs of the shared-shape coder (flag bit 1), written like the ones above.
#[test]
fn golden_v2_shared_blobs_decode() {
    let dir = golden_dir();
    let write = std::env::var_os("KVC_WRITE_GOLDEN").is_some();
    let mut dec = Decoder::new();
    for dtype in DTYPES {
        let name = format!("gear-v2-shared.{}", dtype.name());
        let blob_path = dir.join(format!("{name}.kvg2"));
        let raw_path = dir.join(format!("{name}.raw"));
        if write {
            let data = sample(dtype, 40, 12, 5);
            let mut p = EncodeParams::new(dtype, 12);
            p.chunk_tokens = 16;
            p.kind = TensorKind::K;
            std::fs::create_dir_all(&dir).unwrap();
            let blob = Encoder::with_coder(Coder::SharedShape)
                .encode(&p, &data)
                .unwrap();
            std::fs::write(&blob_path, blob).unwrap();
            std::fs::write(&raw_path, &data).unwrap();
        }
        let blob = std::fs::read(&blob_path).unwrap();
        let raw = std::fs::read(&raw_path).unwrap();
        assert_eq!(blob[7] & 2, 2, "{name}: not a shared-shape blob");
        assert_eq!(dec.decode(&blob).unwrap(), raw, "{name}");
    }
}
