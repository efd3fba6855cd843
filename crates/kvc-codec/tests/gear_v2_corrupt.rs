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
    small_blob_with(Coder::Grouped, dtype, Rows::Distinct)
}

/// Which rows a small test blob repeats.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rows {
    /// Every row distinct: the first chunk is coded (mode 1).
    Distinct,
    /// Rows repeated inside the first chunk only (mode 2, no row dictionary).
    InChunk,
    /// A row repeated in both chunks: a row dictionary (version 3) and a first chunk of
    /// mode 2; the second chunk refers to the dictionary only.
    AcrossChunks,
}

/// A blob of 8 tokens of 5 channels in two chunks of 6 and 2 tokens whose rows repeat as
/// `rows` says.
fn small_blob_with(coder: Coder, dtype: Dtype, rows: Rows) -> (Vec<u8>, Vec<u8>) {
    // Few distinct values with shared low bits so that the chunks are Huffman-coded.
    let pool = sample(dtype, 1, 3, 11);
    let size = dtype.size();
    let ids: [usize; 8] = match rows {
        Rows::Distinct => [5, 7, 9, 11, 15, 17, 19, 13],
        Rows::InChunk => [5, 7, 5, 11, 7, 7, 9, 13],
        Rows::AcrossChunks => [5, 7, 5, 11, 7, 7, 5, 5],
    };
    let mut data = Vec::new();
    for row in ids {
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
    let dict_rows = u32::from_le_bytes(blob[28..32].try_into().unwrap());
    let modes = chunk_modes(&blob);
    let expected = match rows {
        Rows::Distinct => (0, 1),
        Rows::InChunk => (0, 2),
        Rows::AcrossChunks => (1, 2),
    };
    assert_eq!((dict_rows, modes[0]), expected, "{dtype} {rows:?}");
    // f32 rows are long enough for the second chunk to be all references (no coded token).
    if rows == Rows::AcrossChunks && dtype == Dtype::F32 {
        assert_eq!(modes[1], 2);
    }
    (blob, data)
}

/// The mode byte of every chunk of a blob (not of its row dictionary).
fn chunk_modes(blob: &[u8]) -> Vec<u8> {
    let u = |o: usize| u32::from_le_bytes(blob[o..o + 4].try_into().unwrap()) as usize;
    let (tokens, chunk_tokens, model_len, dict_rows) = (u(8), u(16), u(24), u(28));
    let entries = tokens.div_ceil(chunk_tokens) + (dict_rows > 0) as usize;
    let index = 32 + model_len;
    let mut at = index + 4 * entries;
    let mut modes = Vec::new();
    for e in 0..entries {
        if e > 0 || dict_rows == 0 {
            modes.push(blob[at]);
        }
        at += u(index + 4 * e);
    }
    modes
}

#[test]
fn every_bit_flip_and_truncation() {
    let mut dec = Decoder::new();
    for (coder, dtype, rows) in [Coder::Grouped, Coder::SharedShape]
        .into_iter()
        .flat_map(|c| DTYPES.map(|d| (c, d)))
        .flat_map(|(c, d)| [Rows::Distinct, Rows::InChunk, Rows::AcrossChunks].map(|r| (c, d, r)))
    {
        let (blob, data) = small_blob_with(coder, dtype, rows);
        assert_eq!(blob[7] & 2 != 0, coder == Coder::SharedShape);
        flip_and_truncate(&mut dec, &blob, &data);
    }
    let (blob, data) = low_byte_blob();
    flip_and_truncate(&mut dec, &blob, &data);
}

/// Decodes `blob` to `data`; every truncation is corrupt data and no bit flip panics.
fn flip_and_truncate(dec: &mut Decoder, blob: &[u8], data: &[u8]) {
    let dtype = dec.open(blob).unwrap().header().dtype;
    assert_eq!(dec.decode(blob).unwrap(), data);
    for n in 0..blob.len() {
        let e = dec.decode(&blob[..n]).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::CorruptData),
            "{dtype} truncated to {n}: {e:?}"
        );
    }
    let mut m = blob.to_vec();
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

/// An f32 blob whose low bytes are coded (flag bit 3): 48 tokens of 6 channels, low bytes
/// from a few values, in two chunks.
fn low_byte_blob() -> (Vec<u8>, Vec<u8>) {
    let mut data = Vec::new();
    for i in 0..48 * 6u32 {
        let h = i.wrapping_mul(2654435761);
        let low = [0u32, 0x80, 0x40, 0xc0][(h >> 7) as usize % 4];
        let x = (h >> 31) << 31 | (124 + i % 6) << 23 | (h >> 9) & 0x7fff00 | low;
        data.extend_from_slice(&x.to_le_bytes());
    }
    let mut p = EncodeParams::new(Dtype::F32, 6);
    p.chunk_tokens = 32;
    let blob = Encoder::new().encode(&p, &data).unwrap();
    assert_eq!(blob[7] & 8, 8, "low bytes not coded");
    assert_eq!(chunk_modes(&blob), [1, 1]);
    (blob, data)
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
    assert_eq!(blob[4], 3, "format version written");
    for v in [0, 4, 255] {
        assert!(matches!(
            e(header_with(&blob, 4, &[v])),
            Error::V2UnsupportedVersion { found } if found == v
        ));
    }
    // Chunk mode 2 (repeated tokens) came with version 2: a version-1 blob cannot have it.
    let (repeats, data) = small_blob_with(Coder::Grouped, Dtype::F16, Rows::InChunk);
    assert_eq!(dec.decode(&repeats).unwrap(), data);
    assert_eq!(
        e(header_with(&repeats, 4, &[1])).kind(),
        ErrorKind::CorruptData
    );
    // Without a row dictionary the blobs read the same as versions 1 (mode 1 only) and 2.
    for (b, oldest) in [(&blob, 1), (&repeats, 2)] {
        for v in oldest..3 {
            assert_eq!(
                dec.decode(&header_with(b, 4, &[v])).unwrap(),
                dec.decode(b).unwrap()
            );
        }
    }
    // The row dictionary came with version 3: earlier versions call its field reserved.
    let (dictionary, data) = small_blob_with(Coder::Grouped, Dtype::F16, Rows::AcrossChunks);
    assert_eq!(dec.decode(&dictionary).unwrap(), data);
    for v in [1, 2] {
        assert!(matches!(
            e(header_with(&dictionary, 4, &[v])),
            Error::V2BadField {
                field: "reserved",
                offset: 28,
                found: 1
            }
        ));
    }
    // Flag bit 2 (the wrapping map) came with version 3, for int8 with the shared-shape
    // model only.
    let (wrapping, data) = small_blob_with(Coder::SharedShape, Dtype::I8, Rows::Distinct);
    assert_eq!(
        wrapping[7] & 6,
        6,
        "int8 shared-shape blob without the wrapping map"
    );
    assert_eq!(dec.decode(&wrapping).unwrap(), data);
    let (shared_f16, _) = small_blob_with(Coder::SharedShape, Dtype::F16, Rows::Distinct);
    let flags_err = |m: Vec<u8>| {
        matches!(
            Decoder::new().decode(&m).unwrap_err(),
            Error::V2BadField { field: "flags", .. }
        )
    };
    assert!(flags_err(header_with(&wrapping, 4, &[2])));
    assert!(flags_err(header_with(&wrapping, 7, &[wrapping[7] & !2])));
    assert!(flags_err(header_with(&shared_f16, 7, &[shared_f16[7] | 4])));
    // Flag bit 3 (coded f32 low bytes): version 3, f32, shared-shape only.
    let (low_byte, data) = low_byte_blob();
    assert_eq!(dec.decode(&low_byte).unwrap(), data);
    assert!(flags_err(header_with(&low_byte, 4, &[2])));
    assert!(flags_err(header_with(&low_byte, 7, &[low_byte[7] & !2])));
    assert!(flags_err(header_with(&shared_f16, 7, &[shared_f16[7] | 8])));
    assert!(flags_err(header_with(&wrapping, 7, &[wrapping[7] | 8])));
    // Without the flag the model section has a table too many.
    assert!(matches!(
        e(header_with(&low_byte, 7, &[low_byte[7] & !8])),
        Error::V2BadField {
            field: "model_len",
            ..
        }
    ));
    // More dictionary rows than tokens, or rows the index does not hold.
    assert!(matches!(
        e(header_with(&dictionary, 28, &9u32.to_le_bytes())),
        Error::V2BadField {
            field: "dict_rows",
            ..
        }
    ));
    assert_eq!(
        e(header_with(&dictionary, 28, &8u32.to_le_bytes())).kind(),
        ErrorKind::CorruptData
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
                let row = 12 * dtype.size();
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
            let modes = chunk_modes(&blob);
            assert!(
                modes.contains(&2),
                "{name}: no chunk of repeated tokens ({modes:?})"
            );
            assert_eq!(dec.decode(&blob).unwrap(), raw, "{name}");
        }
    }
}

/// Golden blobs of format version 3 (KVC_WRITE_GOLDEN=3): both coders (the shared-shape
/// int8 one with the wrapping map), a row dictionary, chunks that start with a dictionary
/// reference, chunk-local references and coded rows; and an f32 blob with coded low bytes.
#[test]
fn golden_v2_version3_blobs_decode() {
    let dir = golden_dir();
    let write = write_golden(3);
    let mut dec = Decoder::new();
    for (coder, tag) in [(Coder::Grouped, "grouped"), (Coder::SharedShape, "shared")] {
        for dtype in DTYPES {
            let name = format!("gear-v2.version3.{tag}.{}", dtype.name());
            let blob_path = dir.join(format!("{name}.kvg2"));
            let raw_path = dir.join(format!("{name}.raw"));
            if write {
                // 48 tokens in 16-token chunks. Chunk 0 is 16 distinct rows; chunks 1 and 2
                // mix rows 0..4 of chunk 0 (the dictionary; chunk 2 starts with one), rows of
                // their own repeated, and new rows.
                let fresh = sample(dtype, 16 + 2 * 8, 12, 9);
                let row = 12 * dtype.size();
                let mut data = fresh[..16 * row].to_vec();
                for (chunk, fresh_at) in [(1, 16), (2, 24)] {
                    for t in 0..16usize {
                        let src = match (t * 7 + chunk * 2) % 4 {
                            0 => (t + chunk) % 4,
                            1 if t > 0 => fresh_at,
                            _ => fresh_at + t % 8,
                        };
                        data.extend_from_slice(&fresh[src * row..(src + 1) * row]);
                    }
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
            assert_eq!(blob[4], 3, "{name}: format version");
            assert_ne!(&blob[28..32], &[0; 4], "{name}: no row dictionary");
            let wrapping = coder == Coder::SharedShape && dtype == Dtype::I8;
            assert_eq!(blob[7] & 4 != 0, wrapping, "{name}: flag bit 2");
            let modes = chunk_modes(&blob);
            assert_eq!(modes[1..], [2, 2], "{name}: chunk modes");
            assert_eq!(dec.decode(&blob).unwrap(), raw, "{name}");
        }
    }
    // Coded f32 low bytes (flag bit 3).
    let name = "gear-v2.version3.shared-low-byte.f32";
    let blob_path = dir.join(format!("{name}.kvg2"));
    let raw_path = dir.join(format!("{name}.raw"));
    if write {
        let (blob, data) = low_byte_blob();
        std::fs::write(&blob_path, blob).unwrap();
        std::fs::write(&raw_path, data).unwrap();
    }
    let blob = std::fs::read(&blob_path).unwrap();
    assert_eq!(
        (blob[4], blob[7] & 8),
        (3, 8),
        "{name}: version and flag bit 3"
    );
    assert_eq!(
        dec.decode(&blob).unwrap(),
        std::fs::read(&raw_path).unwrap()
    );
}
