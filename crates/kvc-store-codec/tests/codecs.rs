//! The store codecs on their own, as both stores call them: gear-v1 and gear-v2 give every
//! chunk back bit for bit in every dtype, C8 before either gives back exactly its
//! `reference` (each value within half a quantization step of the input), and damaged or
//! mismatched blobs, bad configurations and missing C8 layers are errors, never a panic or
//! a wrong chunk.

use std::sync::Arc;

use kvc_codec::gear_v1::EncodeOptions;
use kvc_int8::{C8Params, ChannelQuant, LayerQuant};
use kvc_store_codec::{
    C8Codec, ChunkInfo, Error, ErrorKind, GearV1Codec, GearV2Codec, StoreCodec, Tensor,
};
use kvc_types::{load_f32, store_f32, Dtype};

const HEADS: usize = 3;
const DIM: usize = 64;

fn info(dtype: Dtype, tensor: Tensor, layer: usize, count: usize) -> ChunkInfo {
    ChunkInfo {
        layer,
        tensor,
        dtype,
        n_heads: HEADS,
        head_dim: DIM,
        start: 7,
        count,
    }
}

/// KV-like values: a per-channel offset and scale, smooth over tokens, plus noise from a
/// 64-bit LCG, stored in `info.dtype` (int8 as the rounded values).
fn chunk(info: &ChunkInfo, seed: u64) -> Vec<u8> {
    let channels = info.n_heads * info.head_dim;
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
    let vals: Vec<f32> = (0..info.count * channels)
        .map(|i| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let noise = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let (t, c) = (i / channels, i % channels);
            let offset = (c % 7) as f32 * 0.3 - 1.0;
            let wave = (t as f32 * 0.05 + c as f32).sin() * (1.0 + (c % 5) as f32);
            match info.dtype {
                Dtype::I8 => (wave * 20.0 + noise * 30.0).round(),
                _ => offset + wave + noise,
            }
        })
        .collect();
    let mut raw = vec![0u8; info.raw_len()];
    store_f32(info.dtype, &vals, &mut raw);
    raw
}

fn lossless() -> Vec<Arc<dyn StoreCodec>> {
    vec![
        Arc::new(GearV1Codec::new(EncodeOptions::default()).unwrap()),
        Arc::new(GearV2Codec::default()),
        Arc::new(GearV2Codec::new(5).unwrap()),
    ]
}

/// Per-channel parameters covering [-4.5, 4.5] for K, an asymmetric range for V, for
/// layers 0 and 1.
fn c8_params() -> C8Params {
    let channels = HEADS * DIM;
    let mut p = C8Params::new();
    for layer in 0..2 {
        let k = ChannelQuant::new(vec![4.5 / 127.0; channels], vec![0.0; channels]).unwrap();
        let v = ChannelQuant::new(
            (0..channels)
                .map(|c| (3.0 + (c % 5) as f32) / 255.0)
                .collect(),
            (0..channels).map(|c| (c % 9) as f32 - 4.0).collect(),
        )
        .unwrap();
        p.insert(layer, LayerQuant { k, v }).unwrap();
    }
    p
}

fn c8_codecs() -> Vec<C8Codec> {
    vec![
        C8Codec::gear_v1(c8_params(), EncodeOptions::default()).unwrap(),
        C8Codec::gear_v2(c8_params()),
    ]
}

#[test]
fn lossless_codecs_give_every_chunk_back_bit_for_bit() {
    for codec in lossless() {
        assert!(codec.is_lossless(), "{}", codec.name());
        for dtype in Dtype::ALL {
            for tensor in [Tensor::K, Tensor::V] {
                for count in [1, 2, 17, 64] {
                    let i = info(dtype, tensor, 1, count);
                    let raw = chunk(&i, count as u64);
                    let mut blob = vec![0xAB; 3]; // replaced, not appended to
                    codec.encode(&i, &raw, &mut blob).unwrap();
                    let mut out = vec![0u8; i.raw_len()];
                    codec.decode(&i, &blob, &mut out).unwrap();
                    assert!(
                        out == raw,
                        "{} {dtype} {tensor:?} {count} tokens",
                        codec.name()
                    );
                    let mut reference = Vec::new();
                    codec.reference(&i, &raw, &mut reference).unwrap();
                    assert_eq!(reference, raw);
                }
            }
        }
    }
}

#[test]
fn c8_gives_back_its_reference_within_half_a_step() {
    let params = c8_params();
    for codec in c8_codecs() {
        assert!(!codec.is_lossless());
        assert!(codec.name().starts_with("c8+gear-v"), "{}", codec.name());
        for dtype in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
            for tensor in [Tensor::K, Tensor::V] {
                let i = info(dtype, tensor, 1, 33);
                let raw = chunk(&i, 9);
                let mut blob = Vec::new();
                codec.encode(&i, &raw, &mut blob).unwrap();
                // One byte a value, then a lossless coder (which may grow noisy bytes a
                // little): still fewer bytes than the 2- or 4-byte values themselves.
                assert!(blob.len() < raw.len(), "{} of {}", blob.len(), raw.len());
                let mut out = vec![0u8; i.raw_len()];
                codec.decode(&i, &blob, &mut out).unwrap();
                let mut reference = Vec::new();
                codec.reference(&i, &raw, &mut reference).unwrap();
                assert!(out == reference, "{} {dtype} {tensor:?}", codec.name());

                let n = i.count * HEADS * DIM;
                let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
                load_f32(dtype, &raw, &mut x);
                load_f32(dtype, &out, &mut y);
                let layer = params.layer(1).unwrap();
                let q = match tensor {
                    Tensor::K => &layer.k,
                    Tensor::V => &layer.v,
                };
                for (e, (a, b)) in x.iter().zip(&y).enumerate() {
                    let c = e % (HEADS * DIM);
                    let (scale, offset) = (q.scale()[c], q.offset()[c]);
                    let (lo, hi) = ((-128.0 - offset) * scale, (127.0 - offset) * scale);
                    // Half a step inside the range (plus the dtype's rounding of the
                    // result); a value outside is clamped to the range's end.
                    let rounding = b.abs() * if dtype == Dtype::F32 { 1e-6 } else { 8e-3 };
                    let want = a.clamp(lo, hi);
                    assert!(
                        (b - want).abs() <= 0.5 * scale * 1.0001 + rounding,
                        "{dtype} {tensor:?} element {e}: {a} came back {b} (step {scale})"
                    );
                }
            }
        }
    }
}

#[test]
fn an_empty_chunk_codes_to_an_empty_chunk() {
    for codec in lossless() {
        let i = info(Dtype::F16, Tensor::K, 0, 0);
        let mut blob = Vec::new();
        codec.encode(&i, &[], &mut blob).unwrap();
        codec.decode(&i, &blob, &mut []).unwrap();
    }
}

#[test]
fn every_truncation_of_a_blob_is_an_error() {
    let mut codecs: Vec<Arc<dyn StoreCodec>> = lossless();
    codecs.extend(
        c8_codecs()
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn StoreCodec>),
    );
    for codec in codecs {
        let i = info(Dtype::F16, Tensor::V, 0, 9);
        let raw = chunk(&i, 3);
        let mut blob = Vec::new();
        codec.encode(&i, &raw, &mut blob).unwrap();
        let mut out = vec![0u8; i.raw_len()];
        for len in 0..blob.len() {
            let e = codec
                .decode(&i, &blob[..len], &mut out)
                .expect_err(&format!("{}: {len} of {} bytes", codec.name(), blob.len()));
            assert_eq!(
                e.kind(),
                ErrorKind::CorruptData,
                "{}: {len} bytes: {e}",
                codec.name()
            );
        }
    }
}

#[test]
fn a_blob_of_another_chunk_shape_is_refused() {
    for codec in lossless() {
        let i = info(Dtype::F16, Tensor::K, 0, 8);
        let mut blob = Vec::new();
        codec.encode(&i, &chunk(&i, 1), &mut blob).unwrap();
        // Read as f32, as more tokens, as other heads: the blob does not describe the chunk.
        for other in [
            info(Dtype::F32, Tensor::K, 0, 8),
            info(Dtype::F16, Tensor::K, 0, 9),
            ChunkInfo {
                n_heads: HEADS + 1,
                ..i
            },
        ] {
            let mut out = vec![0u8; other.raw_len()];
            let e = codec
                .decode(&other, &blob, &mut out)
                .expect_err(&format!("{}: {other:?}", codec.name()));
            assert!(
                matches!(e, Error::BlobMismatch { .. }) || e.kind() == ErrorKind::CorruptData,
                "{}: {other:?}: {e}",
                codec.name()
            );
        }
    }
}

#[test]
fn bad_configurations_and_missing_layers_are_errors() {
    let e = GearV2Codec::new(0).err().expect("0 tokens per chunk");
    assert!(matches!(
        e,
        Error::InvalidConfig {
            field: "gear_v2_chunk_tokens",
            ..
        }
    ));
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    for codec in c8_codecs() {
        // Parameters exist for layers 0 and 1 only.
        let i = info(Dtype::F16, Tensor::K, 5, 4);
        let raw = chunk(&i, 2);
        let e = codec.encode(&i, &raw, &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("layer 5"), "{e}");
        let mut out = Vec::new();
        assert!(codec.reference(&i, &raw, &mut out).is_err());
    }
}
