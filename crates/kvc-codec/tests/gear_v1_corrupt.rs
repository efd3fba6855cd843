//! Corrupt, truncated and oversized blobs: typed errors, never a panic or a huge allocation.

use kvc_codec::gear_v1::{decoded_len, EncodeOptions, GearV1Decoder, GearV1Encoder};
use kvc_codec::{Dtype, Error, ErrorKind};

/// A small f16 blob whose lo stream is zstd-coded and whose hi stream is RLE-coded.
fn sample() -> (Vec<u8>, Vec<u8>) {
    let data: Vec<u8> = (0..200u32)
        .flat_map(|i| [(i % 16 * 37) as u8, 0x3c + (i / 50) as u8])
        .collect();
    let mut e = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    let blob = e.encode_to_vec(Dtype::F16, &data).unwrap();
    (data, blob)
}

fn frame_codecs(blob: &[u8]) -> (u8, u8) {
    let lo_payload = u32::from_le_bytes(blob[10..14].try_into().unwrap()) as usize;
    (blob[5], blob[4 + 10 + lo_payload + 1])
}

#[test]
fn sample_has_both_backends() {
    let (_, blob) = sample();
    assert_eq!(frame_codecs(&blob), (1, 0), "lo zstd, hi RLE");
}

#[test]
fn every_bit_flip_is_an_error_or_a_different_output() {
    let (data, blob) = sample();
    let mut d = GearV1Decoder::new().unwrap();
    let (mut errors, mut different) = (0, 0);
    let mut same = Vec::new();
    for byte in 0..blob.len() {
        for bit in 0..8 {
            let mut b = blob.clone();
            b[byte] ^= 1 << bit;
            match d.decode_to_vec(Dtype::F16, &b) {
                Err(e) => {
                    assert!(
                        matches!(e.kind(), ErrorKind::CorruptData | ErrorKind::BufferTooSmall),
                        "byte {byte} bit {bit}: {e}"
                    );
                    errors += 1;
                }
                Ok(out) if out == data => same.push((byte, bit)),
                Ok(_) => different += 1,
            }
        }
    }
    // A flip that still decodes to the original data is not wrong data; it can only happen
    // inside the zstd payload (offset 14 on), whose format has bits a decoder ignores, e.g.
    // bit 4 ("unused") of the frame header descriptor right after the magic. Every flip in
    // gear-v1's own headers and in the RLE payload is caught or changes the output.
    let zstd_end = 14 + u32::from_le_bytes(blob[10..14].try_into().unwrap()) as usize;
    assert!(same.contains(&(18, 4)), "{same:?}");
    assert!(
        same.iter().all(|&(byte, _)| (14..zstd_end).contains(&byte)),
        "{same:?}"
    );
    assert_eq!(errors + different + same.len(), blob.len() * 8);
    assert!(errors > 0 && different > 0);
}

#[test]
fn every_truncation_and_extension_is_an_error() {
    let (_, blob) = sample();
    let mut d = GearV1Decoder::new().unwrap();
    for len in 0..blob.len() {
        let err = d.decode_to_vec(Dtype::F16, &blob[..len]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CorruptData, "len {len}: {err}");
    }
    let mut longer = blob.clone();
    longer.push(0);
    assert_eq!(
        d.decode_to_vec(Dtype::F16, &longer).unwrap_err(),
        Error::GearV1TrailingBytes {
            offset: blob.len(),
            count: 1
        }
    );
    // The same bytes read as another dtype are not a valid blob.
    for dtype in [Dtype::F32, Dtype::I8] {
        assert!(d.decode_to_vec(dtype, &blob).is_err());
    }
}

fn frame(mode: u8, codec: u8, raw_len: u32, payload_len: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![mode, codec];
    f.extend_from_slice(&raw_len.to_le_bytes());
    f.extend_from_slice(&payload_len.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fn i8_blob(word_count: u32, f: Vec<u8>) -> Vec<u8> {
    let mut b = word_count.to_le_bytes().to_vec();
    b.extend(f);
    b
}

#[test]
fn each_structural_error_is_named() {
    let mut d = GearV1Decoder::new().unwrap();
    let mut dec = |b: &[u8]| d.decode_to_vec(Dtype::I8, b).unwrap_err();
    assert!(matches!(
        dec(&[1, 0]),
        Error::GearV1Truncated {
            what: "word_count",
            ..
        }
    ));
    assert!(matches!(
        dec(&i8_blob(4, vec![0, 0, 4])),
        Error::GearV1Truncated {
            what: "frame header",
            stream: Some(0),
            ..
        }
    ));
    assert_eq!(
        dec(&i8_blob(4, frame(3, 0, 4, 2, &[0x80, 1]))),
        Error::GearV1UnknownMode { stream: 0, mode: 3 }
    );
    assert_eq!(
        dec(&i8_blob(4, frame(0, 2, 4, 2, &[0x80, 1]))),
        Error::GearV1UnknownCodec {
            stream: 0,
            codec: 2
        }
    );
    assert_eq!(
        dec(&i8_blob(4, frame(0, 0, 5, 2, &[0x80, 1]))),
        Error::GearV1RawLenMismatch {
            stream: 0,
            raw_len: 5,
            word_count: 4
        }
    );
    assert!(matches!(
        dec(&i8_blob(4, frame(0, 0, 4, 3, &[0x80, 1]))),
        Error::GearV1Truncated {
            what: "payload",
            needed: 3,
            available: 2,
            ..
        }
    ));
    assert_eq!(
        dec(&i8_blob(5, frame(0, 0, 5, 2, &[0x80, 1]))),
        Error::GearV1RleUnderrun {
            stream: 0,
            produced: 4,
            raw_len: 5
        }
    );
    assert_eq!(
        dec(&i8_blob(3, frame(0, 0, 3, 4, &[0x00, 1, 0x81, 1]))),
        Error::GearV1RleOverrun {
            stream: 0,
            offset: 2,
            raw_len: 3
        }
    );
    assert_eq!(
        dec(&i8_blob(4, frame(0, 0, 4, 3, &[0x03, 1, 2]))),
        Error::GearV1RleTruncated {
            stream: 0,
            offset: 0
        }
    );
    // A zstd payload that is not zstd, and an empty one.
    assert!(matches!(
        dec(&i8_blob(4, frame(0, 1, 4, 4, &[1, 2, 3, 4]))),
        Error::ZstdFrameInvalid { .. }
    ));
    assert!(matches!(
        dec(&i8_blob(0, frame(0, 1, 0, 0, &[]))),
        Error::ZstdFrameInvalid { .. }
    ));
}

#[test]
fn zstd_content_size_must_match_raw_len() {
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 16 * 37) as u8).collect();
    let mut e = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    let blob = e.encode_to_vec(Dtype::I8, &data).unwrap();
    assert_eq!(blob[5], 1, "zstd frame");
    // Claim one element fewer everywhere: the zstd frame still declares 4096.
    let mut b = blob.clone();
    b[0..4].copy_from_slice(&4095u32.to_le_bytes());
    b[6..10].copy_from_slice(&4095u32.to_le_bytes());
    let mut d = GearV1Decoder::new().unwrap();
    assert_eq!(
        d.decode_to_vec(Dtype::I8, &b).unwrap_err(),
        Error::ZstdContentSize {
            expected: 4095,
            declared: Some(4096)
        }
    );
    // A second frame appended inside the payload is rejected, not silently ignored.
    let payload = blob[14..].to_vec();
    let mut two = payload.clone();
    two.extend_from_slice(&payload);
    let b = i8_blob(4096, frame(0, 1, 4096, two.len() as u32, &two));
    assert!(matches!(
        d.decode_to_vec(Dtype::I8, &b).unwrap_err(),
        Error::ZstdFrameLength { .. }
    ));
}

#[test]
fn huge_declared_sizes_are_rejected_before_allocating() {
    let mut d = GearV1Decoder::new().unwrap();
    // 4 G elements from a 2-byte RLE payload.
    let b = i8_blob(u32::MAX, frame(0, 0, u32::MAX, 2, &[0xff, 0]));
    assert_eq!(
        d.decode_to_vec(Dtype::I8, &b).unwrap_err(),
        Error::GearV1ImplausibleRawLen {
            stream: 0,
            raw_len: u32::MAX,
            payload_len: 2
        }
    );
    assert!(decoded_len(Dtype::I8, &b).is_err());
    // ... or from a 10-byte zstd payload.
    let b = i8_blob(u32::MAX, frame(0, 1, u32::MAX, 10, &[0; 10]));
    assert!(matches!(
        d.decode_to_vec(Dtype::F32, &b).unwrap_err(),
        Error::GearV1ImplausibleRawLen { .. } | Error::GearV1Truncated { .. }
    ));
    assert!(matches!(
        d.decode_to_vec(Dtype::I8, &b).unwrap_err(),
        Error::GearV1ImplausibleRawLen { .. }
    ));
    // A payload_len past the end of the blob.
    let b = i8_blob(4, frame(0, 0, 4, u32::MAX, &[0x80, 1]));
    assert!(matches!(
        d.decode_to_vec(Dtype::I8, &b).unwrap_err(),
        Error::GearV1Truncated {
            what: "payload",
            ..
        }
    ));
}
