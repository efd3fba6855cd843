//! Every store codec through the store: gear-v1, gear-v2, C8 before either.

mod common;

use std::sync::Arc;

use common::Rng;
use kvc_cache::KvLayout;
use kvc_int8::{calibrate, C8Params, LayerQuant};
use kvc_store_async::{
    C8Codec, ChunkInfo, ErrorKind, GearV1Codec, GearV2Codec, Store, StoreCodec, StoreConfig, Tensor,
};
use kvc_types::Dtype;

const HEADS: usize = 3;
const DIM: usize = 64;
const ROW: usize = HEADS * DIM * 2;
const TOKENS: usize = 1100;

fn data(seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed);
    (
        rng.f16_bytes(TOKENS * HEADS * DIM),
        rng.f16_bytes(TOKENS * HEADS * DIM),
    )
}

fn c8(l: &KvLayout, k: &[u8], v: &[u8]) -> C8Params {
    let cal = l.k;
    let mut kb = vec![0u8; cal.byte_len()];
    kb[..k.len()].copy_from_slice(k);
    let mut vb = vec![0u8; cal.byte_len()];
    vb[..v.len()].copy_from_slice(v);
    let mut p = C8Params::new();
    p.insert(
        0,
        LayerQuant {
            k: calibrate(&kb, &cal, 0..TOKENS, false).unwrap(),
            v: calibrate(&vb, &cal, 0..TOKENS, false).unwrap(),
        },
    )
    .unwrap();
    p
}

fn run(codec: Arc<dyn StoreCodec>, l: KvLayout, k: &[u8], v: &[u8]) -> (Vec<u8>, Vec<u8>, f64) {
    let store = Store::new(StoreConfig::default(), &[l], codec).unwrap();
    store.write_tokens(0, 0, k, v).unwrap();
    store.schedule(0).unwrap();
    store.wait_idle().unwrap();
    let m = store.metrics().unwrap();
    // 1100 tokens: cold 16..844: bootstrap and two groups.
    assert_eq!((m.chunks_held, m.fallbacks), (3, 0), "{m:?}");
    assert!(m.released_bytes_total > 0);
    let (rk, rv) = store.read_tokens(0, 0, TOKENS).unwrap();
    (rk, rv, m.lossless_ratio)
}

#[test]
fn gear_v2_restores_bit_exact_in_every_layout() {
    let (k, v) = data(21);
    for v_trans in [false, true] {
        let l = KvLayout::llama(Dtype::F16, HEADS, DIM, DIM, 2048, v_trans).unwrap();
        let (rk, rv, ratio) = run(Arc::new(GearV2Codec::default()), l, &k, &v);
        assert!(rk == k && rv == v, "v_trans {v_trans}");
        assert!(ratio > 1.0, "{ratio}");
        // Small random-access chunks inside each blob work the same.
        let (rk, rv, _) = run(Arc::new(GearV2Codec::new(50).unwrap()), l, &k, &v);
        assert!(rk == k && rv == v);
    }
    assert!(GearV2Codec::new(0).is_err());
}

#[test]
fn c8_before_either_codec_gives_the_dequantized_values() {
    let (k, v) = data(22);
    let l = KvLayout::llama(Dtype::F16, HEADS, DIM, DIM, 2048, false).unwrap();
    let p = c8(&l, &k, &v);
    let v1: Arc<dyn StoreCodec> =
        Arc::new(C8Codec::gear_v1(p.clone(), Default::default()).unwrap());
    let v2: Arc<dyn StoreCodec> = Arc::new(C8Codec::gear_v2(p));
    assert_eq!(
        (v1.name().as_str(), v2.name().as_str()),
        ("c8+gear-v1", "c8+gear-v2")
    );
    let (k1, v1r, r1) = run(v1.clone(), l, &k, &v);
    let (k2, v2r, r2) = run(v2.clone(), l, &k, &v);
    // Both restore exactly what C8 gives back; only the lossless stage differs.
    assert!(k1 == k2 && v1r == v2r);
    // int8 of f16 halves the bytes; tables and headers cost a little on random data.
    assert!(r1 > 1.9 && r2 > 1.9, "{r1} {r2}");
    // Hot tokens are untouched; stored tokens are the codec's reference.
    assert_eq!(k1[..16 * ROW], k[..16 * ROW]);
    let info = ChunkInfo {
        layer: 0,
        tensor: Tensor::K,
        dtype: Dtype::F16,
        n_heads: HEADS,
        head_dim: DIM,
        start: 32,
        count: 384,
    };
    let mut want = Vec::new();
    v2.reference(&info, &k[32 * ROW..416 * ROW], &mut want)
        .unwrap();
    assert!(k2[32 * ROW..416 * ROW] == want[..]);
    assert!(k2[32 * ROW..416 * ROW] != k[32 * ROW..416 * ROW]);
}

#[test]
fn a_blob_decoded_for_another_chunk_is_refused() {
    let (k, _) = data(23);
    let info = ChunkInfo {
        layer: 0,
        tensor: Tensor::K,
        dtype: Dtype::F16,
        n_heads: HEADS,
        head_dim: DIM,
        start: 0,
        count: 100,
    };
    let raw = &k[..100 * ROW];
    for codec in [
        Arc::new(GearV2Codec::default()) as Arc<dyn StoreCodec>,
        Arc::new(GearV1Codec::new(Default::default()).unwrap()),
    ] {
        let mut blob = Vec::new();
        codec.encode(&info, raw, &mut blob).unwrap();
        let mut out = vec![0u8; raw.len()];
        codec.decode(&info, &blob, &mut out).unwrap();
        assert!(out == raw);
        // Fewer tokens, other channels, another dtype, a truncated or garbled blob.
        let fewer = ChunkInfo { count: 99, ..info };
        let mut small = vec![0u8; fewer.raw_len()];
        let e = codec.decode(&fewer, &blob, &mut small).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptData, "{} {e}", codec.name());
        if codec.name() == "gear-v2" {
            let other = ChunkInfo {
                n_heads: 2,
                count: 150,
                ..info
            };
            let e = codec.decode(&other, &blob, &mut out).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::CorruptData, "{e}");
            let bf = ChunkInfo {
                dtype: Dtype::Bf16,
                ..info
            };
            assert!(codec.decode(&bf, &blob, &mut out).is_err());
        }
        for cut in [0, 10, blob.len() / 2, blob.len() - 1] {
            assert!(
                codec.decode(&info, &blob[..cut], &mut out).is_err(),
                "cut {cut}"
            );
        }
        let mut bad = blob.clone();
        for b in bad.iter_mut().skip(3).step_by(7) {
            *b ^= 0xa5;
        }
        if let Ok(()) = codec.decode(&info, &bad, &mut out) {
            // A garbled blob that still parses must not be mistaken for the data.
            assert!(out != raw);
        }
    }
}
