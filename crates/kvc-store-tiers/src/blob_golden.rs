//! Golden files of the kv-chunk blob (`KVCCHUNK`), v1, pcodec style, one per codec id:
//! encoding the fixed chunk gives the checked-in bytes, and decoding the checked-in bytes
//! gives the fixed output (the chunk itself for the lossless codecs, the checked-in
//! `.decoded` bytes for kvq and tc). Files in `tests/golden/kv-chunk-v1/`: `<codec>.kvcchunk`
//! and, for the lossy codecs, `<codec>.decoded` (K then V, layer by layer). tc codes with
//! `kvc_transform_coder::golden`'s fixed calibration. A new version gets a new directory;
//! these files never change. `KVC_WRITE_GOLDEN=1` writes missing files (only a new
//! version's or a new codec's), it never overwrites.

use std::path::PathBuf;
use std::sync::Arc;

use half::f16;
use kvc_types::Dtype;

use crate::blob::{check_chunk, decode_checked, encode_chunk, verify, BlobHeader, VERSION};
use crate::codec::{ChunkCodec, SectionCoder};
use crate::key::{ChunkKey, ChunkShape, Fingerprint};
use kvc_transform_coder::golden::fixed_calibration;
use kvc_transform_coder::TransformCodec;

/// The fixed chunk: 2 layers, 2 KV heads of 64 values, 4 tokens, f16.
const SHAPE: ChunkShape = ChunkShape {
    n_layer: 2,
    n_kv_head: 2,
    head_dim: 64,
    dtype: Dtype::F16,
    chunk_tokens: 4,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/kv-chunk-v1")
}

fn golden(name: &str, fresh: &[u8]) -> Vec<u8> {
    let path = dir().join(name);
    if std::env::var_os("KVC_WRITE_GOLDEN").is_some() && !path.exists() {
        std::fs::write(&path, fresh).unwrap();
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One layer's K or V of the fixed chunk as f16 bytes: smooth values of a few units per
/// channel with one outlier channel per head (KV caches have them), no two tokens equal.
fn values(tensor: usize) -> Vec<u8> {
    let n = SHAPE.n_layer * SHAPE.chunk_tokens * SHAPE.n_kv_head * SHAPE.head_dim;
    let mut out = Vec::with_capacity(2 * n);
    for i in 0..n {
        let c = i % SHAPE.head_dim;
        let row = i / SHAPE.head_dim;
        let x = ((i * 37 + tensor * 11) as f32 * 0.173).sin() * (1.0 + (row % 3) as f32)
            + (c as f32 * 0.05 - 1.6)
            + if c == 7 { 12.0 } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(x).to_le_bytes());
    }
    out
}

fn key() -> ChunkKey {
    ChunkKey(std::array::from_fn(|i| i as u8 * 7 + 1))
}

/// The transform codec of the golden chunk: `kvc_transform_coder::golden`'s fixed
/// calibration (sink of 2 tokens), target `tc-0.05`.
fn transform() -> Arc<TransformCodec> {
    let cal = fixed_calibration(SHAPE.n_layer, SHAPE.n_kv_head, SHAPE.head_dim, 2);
    let bytes = cal.to_bytes().unwrap();
    Arc::new(TransformCodec::from_file(&bytes, "tc-0.05").unwrap())
}

fn coder(codec: ChunkCodec) -> SectionCoder {
    let tc = (codec == ChunkCodec::Transform).then(transform);
    SectionCoder::new(codec, SHAPE.head_dim, tc).unwrap()
}

fn fingerprint(codec: ChunkCodec) -> Fingerprint {
    match codec {
        ChunkCodec::Transform => {
            Fingerprint::with_config(&[0x5a; 32], &SHAPE, &transform().config_string())
        }
        _ => Fingerprint::new(&[0x5a; 32], &SHAPE, &codec),
    }
}

fn encode(codec: ChunkCodec) -> Vec<u8> {
    let coder = coder(codec);
    let layer = SHAPE.section_bytes();
    encode_chunk(
        &coder,
        &SHAPE,
        &key(),
        &fingerprint(codec),
        &values(0),
        &values(1),
        layer,
        0,
        0,
    )
    .unwrap()
}

/// K then V, layer by layer, as a decode writes them.
fn decode(codec: ChunkCodec, blob: &[u8]) -> Vec<u8> {
    let coder = coder(codec);
    let lens = check_chunk(&coder, &SHAPE, &key(), &fingerprint(codec), blob).unwrap();
    let sec = SHAPE.section_bytes();
    let (mut k, mut v) = (
        vec![0u8; sec * SHAPE.n_layer],
        vec![0u8; sec * SHAPE.n_layer],
    );
    let mut kp: Vec<&mut [u8]> = k.chunks_mut(sec).collect();
    let mut vp: Vec<&mut [u8]> = v.chunks_mut(sec).collect();
    decode_checked(&coder, &SHAPE, blob, &lens, 0, &mut kp, &mut vp).unwrap();
    [k, v].concat()
}

#[test]
fn v1_the_fixed_chunk_encodes_to_the_golden_bytes() {
    for codec in ChunkCodec::ALL {
        let fresh = encode(codec);
        let want = golden(&format!("{}.kvcchunk", codec.name()), &fresh);
        assert!(
            fresh == want,
            "{}: the encoder no longer writes the v1 golden bytes",
            codec.name()
        );
    }
}

#[test]
fn v1_golden_bytes_decode_to_the_fixed_output() {
    let input = [values(0), values(1)].concat();
    for codec in ChunkCodec::ALL {
        let blob = golden(&format!("{}.kvcchunk", codec.name()), &encode(codec));
        let h = verify(&blob).unwrap();
        let want_header = BlobHeader {
            codec: codec.id(),
            dtype: 1,
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 64,
            n_tokens: 4,
            key: key(),
            fingerprint: fingerprint(codec),
            payload_len: (blob.len() - 112 - 32) as u64,
        };
        assert!(h == want_header, "{}: header", codec.name());
        assert_eq!(&blob[..8], b"KVCCHUNK");
        assert_eq!(u16::from_le_bytes([blob[8], blob[9]]), VERSION);
        let out = decode(codec, &blob);
        if codec.lossless() {
            assert!(
                out == input,
                "{}: decoded bytes differ from the chunk",
                codec.name()
            );
        } else {
            let want = golden(&format!("{}.decoded", codec.name()), &out);
            assert!(
                out == want,
                "{}: decoded bytes differ from the golden output",
                codec.name()
            );
            // and that output is the chunk within kvq's error
            let err = rel_rms(&out, &input);
            assert!(
                err > 0.0 && err < 0.25,
                "{}: relative RMS error {err}",
                codec.name()
            );
        }
    }
}

fn rel_rms(a: &[u8], b: &[u8]) -> f64 {
    let f = |x: &[u8]| -> Vec<f64> {
        x.chunks_exact(2)
            .map(|p| f16::from_le_bytes([p[0], p[1]]).to_f64())
            .collect()
    };
    let (a, b) = (f(a), f(b));
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn a_flipped_golden_byte_is_refused() {
    let blob = golden("gear-v2.kvcchunk", &encode(ChunkCodec::GearV2));
    for at in [0, 9, 12, 40, 120, blob.len() / 2, blob.len() - 1] {
        let mut bad = blob.clone();
        bad[at] ^= 0x10;
        assert!(verify(&bad).is_err(), "byte {at}");
    }
}
