//! Hand-built golden blobs: the exact bytes gear-v1 writes for small inputs.

use kvc_codec::gear_v1::{EncodeOptions, GearV1Decoder, GearV1Encoder, Predictor, PredictorSet};
use kvc_codec::Dtype;

fn encode(dtype: Dtype, data: &[u8], predictors: PredictorSet) -> Vec<u8> {
    let mut e = GearV1Encoder::new(EncodeOptions {
        predictors,
        zstd_level: 3,
    })
    .unwrap();
    let blob = e.encode_to_vec(dtype, data).unwrap();
    let mut d = GearV1Decoder::new().unwrap();
    assert_eq!(d.decode_to_vec(dtype, &blob).unwrap(), data, "round trip");
    blob
}

/// `[mode][codec][raw_len u32le][payload_len u32le][payload]`
fn frame(mode: u8, codec: u8, raw_len: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![mode, codec];
    f.extend_from_slice(&raw_len.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fn blob(word_count: u32, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut b = word_count.to_le_bytes().to_vec();
    for f in frames {
        b.extend_from_slice(f);
    }
    b
}

#[test]
fn empty_streams() {
    let empty = frame(0, 0, 0, &[]);
    assert_eq!(empty, [0u8; 10]);
    for (dtype, lanes) in [
        (Dtype::F16, 2),
        (Dtype::Bf16, 2),
        (Dtype::F32, 4),
        (Dtype::I8, 1),
    ] {
        let b = encode(dtype, &[], PredictorSet::ALL);
        assert_eq!(b, blob(0, &vec![empty.clone(); lanes]), "{dtype}");
        assert_eq!(b.len(), 4 + 10 * lanes);
    }
}

#[test]
fn f16_lo_hi_split() {
    // Four fp16 1.0 (0x3c00): lo = 00 00 00 00, hi = 3c 3c 3c 3c; both one RLE run.
    let data = [0x00, 0x3c].repeat(4);
    let want = blob(
        4,
        &[frame(0, 0, 4, &[0x80, 0x00]), frame(0, 0, 4, &[0x80, 0x3c])],
    );
    assert_eq!(encode(Dtype::F16, &data, PredictorSet::ALL), want);
    assert_eq!(encode(Dtype::Bf16, &data, PredictorSet::ALL), want);
}

#[test]
fn f32_four_lanes() {
    // Four fp32 1.0 (bytes 00 00 80 3f): each lane is a run of 4.
    let data = [0x00, 0x00, 0x80, 0x3f].repeat(4);
    let want = blob(
        4,
        &[
            frame(0, 0, 4, &[0x80, 0x00]),
            frame(0, 0, 4, &[0x80, 0x00]),
            frame(0, 0, 4, &[0x80, 0x80]),
            frame(0, 0, 4, &[0x80, 0x3f]),
        ],
    );
    assert_eq!(encode(Dtype::F32, &data, PredictorSet::ALL), want);
}

#[test]
fn f32_lanes_are_independent() {
    // Lane 1 counts up (delta wins), the others are constant (raw wins).
    let data: Vec<u8> = (0..8u8).flat_map(|i| [7, i, 0, 0x40]).collect();
    let want = blob(
        8,
        &[
            frame(0, 0, 8, &[0x84, 7]),
            frame(1, 0, 8, &[0x00, 0x00, 0x83, 0x01]),
            frame(0, 0, 8, &[0x84, 0]),
            frame(0, 0, 8, &[0x84, 0x40]),
        ],
    );
    assert_eq!(encode(Dtype::F32, &data, PredictorSet::ALL), want);
}

#[test]
fn i8_raw_rle_literal() {
    // Three equal bytes are not a run; one stream, raw, literal.
    let data = [5u8, 5, 5];
    assert_eq!(
        encode(Dtype::I8, &data, PredictorSet::ALL),
        blob(3, &[frame(0, 0, 3, &[0x02, 5, 5, 5])])
    );
}

#[test]
fn delta_seq_wins() {
    // 0, 1, ..., 19: raw is a 21-byte literal; delta is 0 then nineteen 1s.
    let data: Vec<u8> = (0..20).collect();
    assert_eq!(
        encode(Dtype::I8, &data, PredictorSet::ALL),
        blob(20, &[frame(1, 0, 20, &[0x00, 0x00, 0x8f, 0x01])])
    );
}

#[test]
fn xor_seq_wins() {
    // 10 11 10 11 ...: delta alternates 01 ff, xor is 10 then nineteen 01s.
    let data = [0x10, 0x11].repeat(10);
    assert_eq!(
        encode(Dtype::I8, &data, PredictorSet::ALL),
        blob(20, &[frame(2, 0, 20, &[0x00, 0x10, 0x8f, 0x01])])
    );
}

#[test]
fn ties_keep_the_earlier_candidate() {
    // Four zeros: raw, delta and xor all give [80 00]; raw comes first and stays.
    let data = [0u8; 4];
    assert_eq!(
        encode(Dtype::I8, &data, PredictorSet::ALL),
        blob(4, &[frame(0, 0, 4, &[0x80, 0x00])])
    );
    // Without raw the first enabled predictor wins the tie.
    let no_raw = PredictorSet::new(&[Predictor::XorSeq, Predictor::DeltaSeq]).unwrap();
    assert_eq!(
        encode(Dtype::I8, &data, no_raw),
        blob(4, &[frame(1, 0, 4, &[0x80, 0x00])])
    );
    let xor_only = PredictorSet::new(&[Predictor::XorSeq]).unwrap();
    assert_eq!(
        encode(Dtype::I8, &data, xor_only),
        blob(4, &[frame(2, 0, 4, &[0x80, 0x00])])
    );
}

#[test]
fn raw_only_set_never_predicts() {
    let data: Vec<u8> = (0..20).collect();
    let mut lit = vec![19u8];
    lit.extend_from_slice(&data);
    assert_eq!(
        encode(Dtype::I8, &data, PredictorSet::RAW),
        blob(20, &[frame(0, 0, 20, &lit)])
    );
}

#[test]
fn zstd_wins_on_long_repeating_patterns() {
    // A 16-byte pattern repeated: no runs for RLE, a long match for zstd.
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 16 * 37) as u8).collect();
    let b = encode(Dtype::I8, &data, PredictorSet::ALL);
    assert!(b[4] <= 2, "a predictor");
    assert_eq!(b[5], 1, "zstd codec");
    assert_eq!(&b[6..10], &4096u32.to_le_bytes());
    let payload_len = u32::from_le_bytes(b[10..14].try_into().unwrap()) as usize;
    assert_eq!(b.len(), 14 + payload_len);
    assert_eq!(&b[14..18], &[0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
    // Content size is in the frame header: the frame header descriptor has its FCS flag set.
    assert_ne!(b[18] >> 6, 0, "frame content size flag");
    assert_eq!(b[18] & 0x04, 0, "no checksum");
}

#[test]
fn doc_example_f16() {
    // docs/formats/gear-v1.md: 1.0 x4, 1.5, 2.0, 2.5, 3.0 as fp16.
    let data = [
        0x00, 0x3c, 0x00, 0x3c, 0x00, 0x3c, 0x00, 0x3c, 0x00, 0x3e, 0x00, 0x40, 0x00, 0x41, 0x00,
        0x42,
    ];
    let want = blob(
        8,
        &[
            frame(0, 0, 8, &[0x84, 0x00]),
            frame(0, 0, 8, &[0x80, 0x3c, 0x03, 0x3e, 0x40, 0x41, 0x42]),
        ],
    );
    assert_eq!(want.len(), 33);
    assert_eq!(encode(Dtype::F16, &data, PredictorSet::ALL), want);
}
