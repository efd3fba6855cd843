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
    small_blob_with(Coder::Grouped, dtype, false)
}

/// A blob of 8 tokens of 5 channels in two chunks whose first chunk is coded: mode 1 with
/// every row distinct, or mode 2 (repeated tokens) with `repeats`.
fn small_blob_with(coder: Coder, dtype: Dtype, repeats: bool) -> (Vec<u8>, Vec<u8>) {
    // Few distinct values with shared low bits so that the chunks are Huffman-coded.
    let pool = sample(dtype, 1, 3, 11);
    let size = dtype.width();
    let rows: [usize; 8] = if repeats {
        [5, 7, 5, 11, 7, 7, 5, 13]
    } else {
        [5, 7, 9, 11, 15, 17, 19, 13]
    };
    let mut data = Vec::new();
    for row in rows {
        // Channel c of a row holds pool value (row / 3^c) % 3: distinct rows differ.
        for c in 0..5u32 {
            let k = row / 3usize.pow(c) % 3;
            data.extend_from_slice(&pool[k * size..(k + 1) * size]);
        }
    }
    let mut p = EncodeParams::new(dtype, 5);
    p.chunk_tokens = 6;
    p.kind = TensorKind::V;
    let blob = Encoder::with_coder(coder).encode(&p, &data).unwrap();
    // The first chunk must be coded for the flips to reach the Huffman lanes.
    let model_len = u32::from_le_bytes(blob[24..28].try_into().unwrap()) as usize;
    let first_chunk = 32 + model_len + 4 * 2;
    let mode = if repeats { 2 } else { 1 };
    assert_eq!(blob[first_chunk], mode, "{dtype}: first chunk's mode");
    (blob, data)
}

#[test]
fn every_bit_flip_and_truncation() {
    let mut dec = Decoder::new();
    for (coder, dtype, repeats) in [Coder::Grouped, Coder::SharedShape]
        .into_iter()
        .flat_map(|c| DTYPES.map(|d| (c, d)))
        .flat_map(|(c, d)| [(c, d, false), (c, d, true)])
    {
        let (blob, data) = small_blob_with(coder, dtype, repeats);
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
    for v in [0, 3, 255] {
        assert!(matches!(
            e(header_with(&blob, 4, &[v])),
            Error::V2UnsupportedVersion { found } if found == v
        ));
    }
    // Chunk mode 2 (repeated tokens) came with version 2: a version-1 blob cannot have it.
    let (repeats, data) = small_blob_with(Coder::Grouped, Dtype::F16, true);
    assert_eq!(dec.decode(&repeats).unwrap(), data);
    assert_eq!(
        e(header_with(&repeats, 4, &[1])).kind(),
        ErrorKind::CorruptData
    );
    // The mode-1 blob reads the same as version 1.
    assert_eq!(
        dec.decode(&header_with(&blob, 4, &[1])).unwrap(),
        dec.decode(&blob).unwrap()
    );
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

/// Whether to (re)write the golden blobs of format version `version`: only when
/// `KVC_WRITE_GOLDEN` names that version, so that older versions' files stay as written.
fn write_golden(version: u8) -> bool {
    std::env::var("KVC_WRITE_GOLDEN").is_ok_and(|v| v == version.to_string())
}

/// Golden blobs of format version 1 (written once with KVC_WRITE_GOLDEN=1 by the first
/// gear-v2 build); every later version must still decode them to the committed raw bytes.
#[test]
fn golden_v2_blobs_decode() {
    let dir = golden_dir();
    let write = write_golden(1);
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
            std::fs::write(
                &blob_path,
                Encoder::with_coder(Coder::Grouped)
                    .encode(&p, &data)
                    .unwrap(),
            )
            .unwrap();
            std::fs::write(&raw_path, &data).unwrap();
        }
        let blob = std::fs::read(&blob_path).unwrap();
        let raw = std::fs::read(&raw_path).unwrap();
        let open = dec.open(&blob).unwrap();
        assert_eq!(open.header().dtype, dtype);
        assert_eq!(open.header().channels, 12);
        assert_eq!(open.header().tokens, 40);
        assert_eq!(blob[4], 1, "{name}: format version");
        assert_eq!(dec.decode(&blob).unwrap(), raw, "{name}");
    }
}

/// Golden blobs of the shared-shape coder (flag bit 1), format version 1, written like the
/// ones above.
#[test]
fn golden_v2_shared_blobs_decode() {
    let dir = golden_dir();
    let write = write_golden(1);
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
        assert_eq!(blob[4], 1, "{name}: format version");
        assert_eq!(dec.decode(&blob).unwrap(), raw, "{name}");
    }
}

/// Golden blobs of format version 2 (KVC_WRITE_GOLDEN=2): both coders, with chunks of
/// repeated tokens (mode 2) and chunks without (mode 1).
#[test]
fn golden_v2_version2_blobs_decode() {
    let dir = golden_dir();
    let write = write_golden(2);
    let mut dec = Decoder::new();
    for (coder, tag) in [(Coder::Grouped, "grouped"), (Coder::SharedShape, "shared")] {
        for dtype in DTYPES {
            let name = format!("gear-v2.version2.{tag}.{}", dtype.name());
            let blob_path = dir.join(format!("{name}.kvg2"));
            let raw_path = dir.join(format!("{name}.raw"));
            if write {
                // 40 tokens in 16-token chunks; tokens 16..40 repeat rows of their chunk.
                let mut data = sample(dtype, 24, 12, 7);
                let row = 12 * dtype.width();
                for t in 24..40 {
                    let src = 16 + (t * 5) % 8;
                    data.extend_from_within(src * row..(src + 1) * row);
                }
                let mut p = EncodeParams::new(dtype, 12);
                p.chunk_tokens = 16;
                p.kind = TensorKind::V;
                let blob = Encoder::with_coder(coder).encode(&p, &data).unwrap();
                std::fs::write(&blob_path, blob).unwrap();
                std::fs::write(&raw_path, &data).unwrap();
            }
            let blob = std::fs::read(&blob_path).unwrap();
            let raw = std::fs::read(&raw_path).unwrap();
            assert_eq!(blob[4], 2, "{name}: format version");
            let open = dec.open(&blob).unwrap();
            let modes: Vec<u8> = (0..open.chunk_count())
                .map(|i| blob[open_chunk_offset(&blob, i)])
                .collect();
            assert!(
                modes.contains(&2),
                "{name}: no chunk of repeated tokens ({modes:?})"
            );
            assert_eq!(dec.decode(&blob).unwrap(), raw, "{name}");
        }
    }
}

/// Byte offset of chunk `i` in a blob, from its header and chunk index.
fn open_chunk_offset(blob: &[u8], i: usize) -> usize {
    let u = |o: usize| u32::from_le_bytes(blob[o..o + 4].try_into().unwrap()) as usize;
    let (tokens, chunk_tokens, model_len) = (u(8), u(16), u(24));
    let chunks = tokens.div_ceil(chunk_tokens);
    let index = 32 + model_len;
    index + 4 * chunks + (0..i).map(|k| u(index + 4 * k)).sum::<usize>()
}
