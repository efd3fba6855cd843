//! Sections coded with the fixed calibration (`golden::fixed_calibration(2, 2, 64, 2)`,
//! through its file bytes and `TransformCodec::from_file`, as a restoring process loads
//! it): round trips in every dtype at positions inside the sink, after it and far beyond
//! 2^20; every bit flip and truncation of a section refused; the wrong position, layer or
//! tensor refused; bad input to the encoder refused with `out` unchanged; codec names.

use half::{bf16, f16};
use kvc_transform_coder::golden::fixed_calibration;
use kvc_transform_coder::section::HASH_LEN;
use kvc_transform_coder::{parse_name, Error, ErrorKind, TransformCodec};
use kvc_types::{Dtype, Tensor};

mod common;
use common::Rng;

const H: usize = 2;
const D: usize = 64;
const N_SINK: usize = 2;
const N_LAYER: usize = 2;
const DTYPES: [Dtype; 3] = [Dtype::F16, Dtype::Bf16, Dtype::F32];

fn codec() -> TransformCodec {
    let file = fixed_calibration(N_LAYER, H, D, N_SINK).to_bytes().unwrap();
    TransformCodec::from_file(&file, "tc-0.05").unwrap()
}

fn size(dtype: Dtype) -> usize {
    dtype.size()
}

fn store(dtype: Dtype, x: f32, out: &mut Vec<u8>) {
    match dtype {
        Dtype::F16 => out.extend_from_slice(&f16::from_f32(x).to_le_bytes()),
        Dtype::Bf16 => out.extend_from_slice(&bf16::from_f32(x).to_le_bytes()),
        _ => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn value(dtype: Dtype, raw: &[u8], i: usize) -> f32 {
    match dtype {
        Dtype::F16 => f16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]).to_f32(),
        Dtype::Bf16 => bf16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]).to_f32(),
        _ => f32::from_le_bytes(raw[4 * i..4 * i + 4].try_into().unwrap()),
    }
}

/// `n` tokens × `H` heads × `D` values in [-2, 2] (a smooth part per channel plus noise),
/// in `dtype`.
fn section_values(dtype: Dtype, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(n * H * D * size(dtype));
    for i in 0..n * H * D {
        let c = i % D;
        let x = (c as f32 * 0.3).sin() + rng.unit();
        store(dtype, x, &mut out);
    }
    out
}

fn encode(
    c: &TransformCodec,
    layer: usize,
    tensor: Tensor,
    dtype: Dtype,
    pos0: u64,
    n: usize,
    raw: &[u8],
) -> Vec<u8> {
    let mut blob = Vec::new();
    c.encode_section(layer, tensor, dtype, pos0, n, raw, &mut blob)
        .unwrap();
    blob
}

#[allow(clippy::too_many_arguments)]
fn decode(
    c: &TransformCodec,
    layer: usize,
    tensor: Tensor,
    dtype: Dtype,
    pos0: u64,
    n: usize,
    blob: &[u8],
) -> Result<Vec<u8>, Error> {
    let mut out = vec![0u8; n * H * D * size(dtype)];
    c.decode_section(layer, tensor, dtype, pos0, n, blob, &mut out)?;
    Ok(out)
}

const POSITIONS: [u64; 4] = [0, 1, 256, (1 << 20) + 12_345];

#[test]
fn sections_round_trip_to_the_encoders_reconstruction() {
    let c = codec();
    let n = 24;
    for dtype in DTYPES {
        for pos0 in POSITIONS {
            for (layer, tensor) in [(0, Tensor::K), (1, Tensor::V), (1, Tensor::K)] {
                let what = format!("{dtype:?} pos0 {pos0} layer {layer} {tensor:?}");
                let raw = section_values(dtype, n, pos0 ^ layer as u64);
                let blob = encode(&c, layer, tensor, dtype, pos0, n, &raw);
                let a = decode(&c, layer, tensor, dtype, pos0, n, &blob).unwrap();
                let b = decode(&c, layer, tensor, dtype, pos0, n, &blob).unwrap();
                assert_eq!(a, b, "{what}: two decodes differ");
                assert_eq!(&blob[..HASH_LEN], &blake3::hash(&a).as_bytes()[..HASH_LEN]);
                // Encoding again gives the same bytes.
                assert_eq!(
                    encode(&c, layer, tensor, dtype, pos0, n, &raw),
                    blob,
                    "{what}"
                );
                // Sink tokens (positions below n_sink) come back bit-exact and are
                // stored raw after the hash.
                let sink = (N_SINK as u64).saturating_sub(pos0) as usize;
                let sink_bytes = sink * H * D * size(dtype);
                assert_eq!(a[..sink_bytes], raw[..sink_bytes], "{what}");
                assert_eq!(blob[HASH_LEN..HASH_LEN + sink_bytes], raw[..sink_bytes]);
                // Every other value within the quantizer's half step (at most 0.2 per
                // component of tc-0.05, a signed permutation basis: per value; K's
                // rotation mixes two components: √2·0.2) plus the dtype's rounding.
                let ulp = match dtype {
                    Dtype::Bf16 => 2f32.powi(-7),
                    Dtype::F16 => 2f32.powi(-9),
                    _ => 1e-6,
                };
                let bound = if tensor == Tensor::K {
                    0.2 * 2f32.sqrt()
                } else {
                    0.2
                } + 4.0 * ulp;
                let mut max = 0f32;
                let mut changed = 0;
                for i in sink * H * D..n * H * D {
                    let (x, y) = (value(dtype, &raw, i), value(dtype, &a, i));
                    assert!(y.is_finite());
                    max = max.max((x - y).abs());
                    changed += usize::from(x != y);
                }
                assert!(max <= bound, "{what}: error {max} > {bound}");
                assert!(changed > 0, "{what}: nothing quantized");
                // Smaller than the raw values.
                assert!(blob.len() < HASH_LEN + raw.len(), "{what}");
            }
        }
    }
}

#[test]
fn an_all_sink_section_is_the_raw_values() {
    let c = codec();
    for dtype in DTYPES {
        let raw = section_values(dtype, N_SINK, 7);
        let blob = encode(&c, 0, Tensor::K, dtype, 0, N_SINK, &raw);
        assert_eq!(blob.len(), HASH_LEN + raw.len());
        assert_eq!(blob[HASH_LEN..], raw[..]);
        assert_eq!(
            decode(&c, 0, Tensor::K, dtype, 0, N_SINK, &blob).unwrap(),
            raw
        );
        // A byte more is refused.
        let mut longer = blob.clone();
        longer.push(0);
        assert!(decode(&c, 0, Tensor::K, dtype, 0, N_SINK, &longer).is_err());
    }
    // Zero tokens: only the hash.
    let blob = encode(&c, 1, Tensor::V, Dtype::F16, 300, 0, &[]);
    assert_eq!(blob.len(), HASH_LEN);
    assert_eq!(
        decode(&c, 1, Tensor::V, Dtype::F16, 300, 0, &blob).unwrap(),
        b""
    );
}

fn is_damage(e: &Error) -> bool {
    matches!(e, Error::Corrupt { .. } | Error::ReconstructionMismatch)
}

#[test]
fn every_bit_flip_and_truncation_of_a_section_is_an_error() {
    let c = codec();
    let n = 6;
    for (dtype, pos0, tensor) in [
        (Dtype::F16, 0, Tensor::K),
        (Dtype::Bf16, 256, Tensor::V),
        (Dtype::F32, 1 << 21, Tensor::K),
    ] {
        let raw = section_values(dtype, n, 99);
        let blob = encode(&c, 1, tensor, dtype, pos0, n, &raw);
        for bit in 0..blob.len() * 8 {
            let mut b = blob.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            match decode(&c, 1, tensor, dtype, pos0, n, &b) {
                Ok(_) => panic!("{dtype:?} pos0 {pos0}: bit {bit} flipped decodes"),
                Err(e) => assert!(is_damage(&e), "bit {bit}: {e}"),
            }
        }
        for cut in 0..blob.len() {
            match decode(&c, 1, tensor, dtype, pos0, n, &blob[..cut]) {
                Ok(_) => panic!("{dtype:?} pos0 {pos0}: cut at {cut} decodes"),
                Err(e) => assert!(is_damage(&e), "cut {cut}: {e}"),
            }
        }
        let mut longer = blob.clone();
        longer.push(0);
        let e = decode(&c, 1, tensor, dtype, pos0, n, &longer).unwrap_err();
        assert!(is_damage(&e), "{e}");
    }
}

/// K rows are rotated by their positions: decoding at another position (or as another
/// layer's, or as V) rebuilds other values, which the hash refuses. V at another
/// position (no sink involved) has nothing position-dependent and decodes the same.
#[test]
fn wrong_position_layer_or_tensor_is_refused() {
    let c = codec();
    let n = 8;
    let dtype = Dtype::F16;
    let raw = section_values(dtype, n, 5);
    let blob = encode(&c, 0, Tensor::K, dtype, 256, n, &raw);
    let good = decode(&c, 0, Tensor::K, dtype, 256, n, &blob).unwrap();
    // The wrong position: the same tables, the stream reads to its end, other values:
    // the hash refuses them. Another layer or V: other tables and steps per component
    // (the fixed calibration's classes run across slots), so the stream itself does not
    // end where it should. Position 0: the first two tokens are read as raw sink bytes.
    for (layer, tensor, pos0, mismatch) in [
        (0, Tensor::K, 257, true),
        (0, Tensor::K, 255, true),
        (0, Tensor::K, 1 << 30, true),
        (0, Tensor::K, 0, false),
        (1, Tensor::K, 256, false),
        (0, Tensor::V, 256, false),
    ] {
        let e = decode(&c, layer, tensor, dtype, pos0, n, &blob).unwrap_err();
        let what = format!("layer {layer} {tensor:?} pos0 {pos0}: {e}");
        if mismatch {
            assert_eq!(e, Error::ReconstructionMismatch, "{what}");
        } else {
            assert!(matches!(e, Error::Corrupt { .. }), "{what}");
        }
    }
    // V: the same bytes at another position past the sink decode to the same values.
    let blob_v = encode(&c, 0, Tensor::V, dtype, 256, n, &raw);
    let v = decode(&c, 0, Tensor::V, dtype, 256, n, &blob_v).unwrap();
    assert_eq!(decode(&c, 0, Tensor::V, dtype, 300, n, &blob_v).unwrap(), v);
    assert_ne!(good, v);
    // Another dtype: other row bytes, refused.
    assert!(decode(&c, 0, Tensor::K, Dtype::Bf16, 256, n, &blob).is_err());
}

#[test]
fn bad_input_to_encode_is_refused_and_writes_nothing() {
    let c = codec();
    let n = 4;
    for dtype in DTYPES {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for pos0 in [0u64, 256] {
                let mut raw = section_values(dtype, n, 3);
                // Token 3, head 1, element 10 (past the sink at pos0 0).
                let i = (3 * H + 1) * D + 10;
                let mut v = Vec::new();
                store(dtype, bad, &mut v);
                raw[i * size(dtype)..(i + 1) * size(dtype)].copy_from_slice(&v);
                let mut out = vec![1, 2, 3];
                let e = c
                    .encode_section(0, Tensor::K, dtype, pos0, n, &raw, &mut out)
                    .unwrap_err();
                assert_eq!(
                    e,
                    Error::NonFinite {
                        row: 3 * H + 1,
                        index: 10
                    },
                    "{dtype:?}"
                );
                assert_eq!(e.kind(), ErrorKind::CorruptData);
                assert_eq!(out, [1, 2, 3]);
            }
        }
        let raw = section_values(dtype, n, 3);
        let mut out = vec![9];
        for len in [0, raw.len() - 1, raw.len() + 1] {
            let mut r = raw.clone();
            r.resize(len, 0);
            let e = c
                .encode_section(0, Tensor::V, dtype, 256, n, &r, &mut out)
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{len}: {e}");
        }
        let e = c
            .encode_section(N_LAYER, Tensor::V, dtype, 256, n, &raw, &mut out)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(out, [9]);
    }
    let raw = vec![0u8; n * H * D];
    let mut out = Vec::new();
    let e = c
        .encode_section(0, Tensor::K, Dtype::I8, 256, n, &raw, &mut out)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(out.is_empty());
    // A value whose component is beyond the coded range: NonFinite too.
    let mut raw = Vec::new();
    for i in 0..n * H * D {
        store(Dtype::F32, if i == 70 { 3e38 } else { 0.5 }, &mut raw);
    }
    let e = c
        .encode_section(0, Tensor::V, Dtype::F32, 256, n, &raw, &mut out)
        .unwrap_err();
    assert!(matches!(e, Error::NonFinite { row: 1, .. }), "{e}");
    assert!(out.is_empty());
    // Decoding: wrong output length, layer out of range, i8.
    let blob = encode(
        &c,
        0,
        Tensor::V,
        Dtype::F16,
        256,
        n,
        &section_values(Dtype::F16, n, 1),
    );
    let mut small = vec![0u8; n * H * D * 2 - 1];
    assert!(c
        .decode_section(0, Tensor::V, Dtype::F16, 256, n, &blob, &mut small)
        .is_err());
    let mut o = vec![0u8; n * H * D * 2];
    assert!(c
        .decode_section(N_LAYER, Tensor::V, Dtype::F16, 256, n, &blob, &mut o)
        .is_err());
    let mut o = vec![0u8; n * H * D];
    assert!(c
        .decode_section(0, Tensor::V, Dtype::I8, 256, n, &blob, &mut o)
        .is_err());
}

#[test]
fn codec_names() {
    assert_eq!(parse_name("tc-0.05").unwrap(), 0.05);
    assert_eq!(parse_name("tc-1e-2").unwrap(), 0.01);
    for bad in [
        "tc-", "tc-abc", "tc-0", "tc--1", "tc-inf", "tc-nan", "tc-NaN", "kvq", "tc0.05", "",
        "tc-0.05 ", "TC-0.05",
    ] {
        let e = parse_name(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
    }
    let file = fixed_calibration(1, 1, 8, 0).to_bytes().unwrap();
    let c = TransformCodec::from_file(&file, "tc-0.01").unwrap();
    assert_eq!(c.name(), "tc-0.01");
    assert_eq!(c.bound(), 0.01);
    let e = TransformCodec::from_file(&file, "tc-0.02").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let msg = e.to_string();
    assert!(msg.contains("tc-0.01") && msg.contains("tc-0.05"), "{msg}");
    assert!(TransformCodec::from_file(&file, "kvq").is_err());
    assert!(TransformCodec::from_file(&file[..file.len() - 1], "tc-0.01").is_err());
    // The config string names the bound and the calibration file's fingerprint.
    let fp: String = blake3::hash(&file[..file.len() - 32])
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        c.config_string(),
        format!("tc/format=1/bound=0.01/calibration={fp}")
    );
    assert!(c.check_layout(1, 1, 8).is_ok());
    assert_eq!(
        c.check_layout(1, 2, 8).unwrap_err().kind(),
        ErrorKind::Foreign
    );
}
