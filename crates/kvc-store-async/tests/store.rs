//! Store behaviour: release and bit-exact restore, modes, fallbacks, errors.

mod common;

use std::sync::Arc;

use common::{quiet_injected_panics, Faults, FaultyCodec, Rng};
use kvc_cache::{KvLayout, ReservePlan};
use kvc_store_async::{
    C8Codec, ChunkStatus, ErrorKind, GearV1Codec, Mode, Scope, Store, StoreCodec, StoreConfig,
};
use kvc_types::Dtype;

const HEADS: usize = 3;
const DIM: usize = 64;
const ROW: usize = HEADS * DIM * 2;

fn gear() -> Arc<dyn StoreCodec> {
    Arc::new(GearV1Codec::new(Default::default()).unwrap())
}

fn fill(store: &Store, layer: usize, tokens: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let k = rng.f16_bytes(tokens * HEADS * DIM);
    let v = rng.f16_bytes(tokens * HEADS * DIM);
    for t in 0..tokens {
        store
            .append_tokens(
                layer,
                &k[t * ROW..(t + 1) * ROW],
                &v[t * ROW..(t + 1) * ROW],
            )
            .unwrap();
        store.schedule(layer).unwrap();
        store.poll().unwrap();
    }
    (k, v)
}

fn layout(v_trans: bool) -> KvLayout {
    KvLayout::llama(Dtype::F16, HEADS, DIM, DIM, 2048, v_trans).unwrap()
}

#[test]
fn store_mode_releases_pages_and_restores_bit_exact() {
    // MNN's decode cache: restored chunks stay resident between reads.
    let cfg = StoreConfig {
        evict_after_attention: false,
        ..StoreConfig::default()
    };
    for v_trans in [false, true] {
        let l = layout(v_trans);
        let store = Store::new(cfg, &[l, l], gear()).unwrap();
        let mut rng = Rng(7);
        let data: Vec<_> = (0..2).map(|i| fill(&store, i, 1500, &mut rng)).collect();
        let before = store.resident_bytes().unwrap();
        store.wait_idle().unwrap();
        let m = store.metrics().unwrap();
        // 1500 tokens: cold range 16..1244: bootstrap + 3 groups per layer.
        assert_eq!(m.chunks_held, 8, "{m:?}");
        assert_eq!(m.fallbacks, 0);
        assert!(m.lossless_ratio > 1.0, "{m:?}");
        assert_eq!(
            m.stored_raw_bytes,
            2 * (16 + 3 * 384) as u64 * 2 * ROW as u64
        );
        let after = store.resident_bytes().unwrap();
        assert!(before >= after);
        // What a cache without the store would hold resident, and what the store
        // returned: they add up exactly (mincore against madvise counts).
        let k_pages = (1500 * ROW).div_ceil(4096) * 4096;
        let v_pages = if v_trans { 2048 * ROW } else { k_pages };
        let full = 2 * (k_pages + v_pages);
        assert_eq!(after + m.released_bytes_total as usize, full, "{m:?}");
        // Row layouts release all but a partial page at each end of each tensor's range;
        // transposed V (one 4 KiB page per channel here) can release nothing.
        let chunked = (16 + 3 * 384) * ROW;
        let per_tensor = chunked - 2 * 4096;
        let tensors = if v_trans { 2 } else { 4 };
        assert!(
            m.released_bytes_total as usize >= tensors * per_tensor,
            "{m:?}"
        );
        for (i, (k, v)) in data.iter().enumerate() {
            let chunks = store.chunks(i).unwrap();
            assert!(chunks.iter().all(|c| c.status == ChunkStatus::Stored));
            let (rk, rv) = store.read_tokens(i, 0, 1500).unwrap();
            assert!(rk == *k && rv == *v, "layer {i} v_trans {v_trans}");
            assert!(store
                .chunks(i)
                .unwrap()
                .iter()
                .all(|c| c.status == ChunkStatus::Resident));
        }
        let m = store.metrics().unwrap();
        assert_eq!(
            (m.restores, m.decode_cache_misses, m.decode_cache_hits),
            (8, 8, 0)
        );
        // Second read: all hits, nothing decoded.
        let (rk, _) = store.read_tokens(0, 0, 1500).unwrap();
        assert!(rk == data[0].0);
        let m = store.metrics().unwrap();
        assert_eq!((m.restores, m.decode_cache_hits), (8, 4));
        // Evicting the decode cache releases the pages again; the next read decodes.
        assert_eq!(store.evict_decoded(None).unwrap(), 8);
        assert_eq!(store.resident_bytes().unwrap(), after);
        let (rk, rv) = store.read_tokens(1, 0, 1500).unwrap();
        assert!(rk == data[1].0 && rv == data[1].1);
        assert_eq!(store.metrics().unwrap().restores, 12);
    }
}

#[test]
fn lru_capacities_bound_resident_chunks() {
    let l = layout(false);
    let cfg = StoreConfig {
        layer_cache_capacity: 2,
        global_cache_capacity: 5,
        evict_after_attention: false,
        ..StoreConfig::default()
    };
    let store = Store::new(cfg, &[l, l, l], gear()).unwrap();
    let mut rng = Rng(3);
    let data: Vec<_> = (0..3).map(|i| fill(&store, i, 1500, &mut rng)).collect();
    store.wait_idle().unwrap();
    for round in 0..2 {
        for (i, (k, v)) in data.iter().enumerate() {
            let (rk, rv) = store.read_tokens(i, 0, 1500).unwrap();
            assert!(rk == *k && rv == *v, "round {round} layer {i}");
            let m = store.metrics().unwrap();
            assert!(m.decode_cache_resident <= 5, "{m:?}");
            for j in 0..3 {
                let res = store
                    .chunks(j)
                    .unwrap()
                    .iter()
                    .filter(|c| c.status == ChunkStatus::Resident)
                    .count();
                // A layer being read keeps all its chunks until the read ends, then its LRU
                // trims to 2 at the next restore.
                assert!(res <= 4, "{res}");
            }
        }
    }
}

#[test]
fn injected_failures_and_corrupt_blobs_are_counted_fallbacks_with_data_intact() {
    quiet_injected_panics();
    let codec = Arc::new(FaultyCodec::new(Faults {
        fail: 3,
        corrupt: 4,
        panic: 5,
    }));
    let l = layout(false);
    let cfg = StoreConfig {
        group_tokens: 32,
        ..StoreConfig::default()
    };
    let store = Store::new(cfg, &[l], codec.clone()).unwrap();
    let mut rng = Rng(11);
    let (k, v) = fill(&store, 0, 2000, &mut rng);
    store.wait_idle().unwrap();
    // Offer again what backpressure skipped, until nothing is left to offer: fallback
    // chunks are never offered again.
    while store.schedule(0).unwrap() > 0 {
        store.wait_idle().unwrap();
    }
    let m = store.metrics().unwrap();
    assert!(m.fallback_encode_errors > 0, "{m:?}");
    assert!(m.fallback_verify_mismatches > 0, "{m:?}");
    assert!(m.fallback_panics > 0, "{m:?}");
    assert!(m.chunks_held > 0, "{m:?}");
    assert_eq!(
        m.fallbacks,
        m.fallback_encode_errors + m.fallback_verify_mismatches + m.fallback_panics
    );
    assert!(m.fallbacks <= codec.injected.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(m.chunks_submitted, m.chunks_stored + m.fallbacks);
    let raw = store
        .chunks(0)
        .unwrap()
        .iter()
        .filter(|c| c.status == ChunkStatus::Raw)
        .count();
    assert_eq!(raw as u64, m.fallbacks);
    let (rk, rv) = store.read_tokens(0, 0, 2000).unwrap();
    assert!(rk == k && rv == v);
}

#[test]
fn a_blob_corrupted_after_release_is_a_typed_restore_error() {
    let l = layout(false);
    let store = Store::new(StoreConfig::default(), &[l], gear()).unwrap();
    let mut rng = Rng(5);
    fill(&store, 0, 800, &mut rng);
    store.wait_idle().unwrap();
    let stored = store.resident_bytes().unwrap();
    assert!(store.corrupt_held_blob_for_test(0, 32).unwrap());
    for _ in 0..2 {
        let e = store.read_tokens(0, 0, 800).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptData, "{e}");
    }
    let m = store.metrics().unwrap();
    assert_eq!(m.restore_failures, 2);
    // The chunk decoded straight into the cache: its pages went back to the OS, and it
    // is still held (not resident, not lost).
    assert_eq!(store.resident_bytes().unwrap(), stored);
    assert_eq!(m.decode_cache_resident, 0);
    let chunks = store.chunks(0).unwrap();
    assert!(chunks
        .iter()
        .any(|c| c.start == 32 && c.status == ChunkStatus::Stored));
    // The layer cannot be attended, but the blob is still there for a diagnosis.
    assert!(store.decode_key(0, 32).unwrap().is_some());
}

#[test]
fn by_default_attention_releases_what_it_restored() {
    for v_trans in [false, true] {
        let l = layout(v_trans);
        let store = Store::new(StoreConfig::default(), &[l], gear()).unwrap();
        let mut rng = Rng(17);
        let (k, v) = fill(&store, 0, 1500, &mut rng);
        store.wait_idle().unwrap();
        let stored = store.resident_bytes().unwrap();
        for round in 1..=3u64 {
            let ((), stats) = store
                .with_layer(0, |kb, vb| {
                    let mut rk = Vec::new();
                    let mut rv = Vec::new();
                    for t in 0..1500 {
                        for (buf, tl, out) in [(kb, &l.k, &mut rk), (vb, &l.v, &mut rv)] {
                            for h in 0..HEADS {
                                for d in 0..DIM {
                                    let at = tl.offset(t, h, d) * 2;
                                    out.extend_from_slice(&buf[at..at + 2]);
                                }
                            }
                        }
                    }
                    assert!(rk == k && rv == v, "v_trans {v_trans}");
                })
                .unwrap();
            assert_eq!((stats.decoded, stats.hits), (4, 0));
            // Nothing stays resident: memory is back where the store left it.
            assert_eq!(store.resident_bytes().unwrap(), stored, "v_trans {v_trans}");
            let m = store.metrics().unwrap();
            assert_eq!((m.restores, m.decode_cache_resident), (4 * round, 0));
            assert!(store
                .chunks(0)
                .unwrap()
                .iter()
                .all(|c| c.status == ChunkStatus::Stored));
        }
        // A prefetch keeps its chunks until the layer's next attention, which hits.
        assert_eq!(store.restore_layer(0).unwrap().decoded, 4);
        assert!(store.resident_bytes().unwrap() > stored);
        let (rk, rv) = store.read_tokens(0, 0, 1500).unwrap();
        assert!(rk == k && rv == v);
        let m = store.metrics().unwrap();
        assert_eq!((m.restores, m.decode_cache_hits), (16, 4));
        assert_eq!(store.resident_bytes().unwrap(), stored);
    }
}

#[test]
fn backpressure_skips_chunks_and_keeps_them_raw() {
    let l = layout(false);
    let cfg = StoreConfig {
        async_threads: 1,
        queue_capacity: 1,
        group_tokens: 16,
        ..StoreConfig::default()
    };
    let store = Store::new(cfg, &[l], gear()).unwrap();
    let mut rng = Rng(9);
    let tokens = 1800;
    let k = rng.f16_bytes(tokens * HEADS * DIM);
    let v = rng.f16_bytes(tokens * HEADS * DIM);
    store.write_tokens(0, 0, &k, &v).unwrap();
    // One schedule call offers ~95 chunks at once to a queue of one.
    store.schedule(0).unwrap();
    let m = store.metrics().unwrap();
    assert!(m.backpressure_skips > 0, "{m:?}");
    assert!(m.queue_peak <= 1);
    store.wait_idle().unwrap();
    // Skipped chunks are offered again by later schedules.
    while store.metrics().unwrap().chunks_held < 95 {
        store.schedule(0).unwrap();
        store.wait_idle().unwrap();
    }
    let (rk, rv) = store.read_tokens(0, 0, tokens).unwrap();
    assert!(rk == k && rv == v);
}

#[test]
fn probe_and_full_modes_never_release() {
    let l = layout(false);
    for mode in [Mode::Probe, Mode::Full] {
        let cfg = StoreConfig {
            mode,
            scope: Scope::FrontN,
            front_n: 2,
            ..StoreConfig::default()
        };
        let store = Store::new(cfg, &[l, l, l], gear()).unwrap();
        let mut rng = Rng(1);
        let data: Vec<_> = (0..3).map(|i| fill(&store, i, 1000, &mut rng)).collect();
        let m = store.metrics().unwrap();
        // 1000 tokens: bootstrap + 1 group; probe samples layer 0 only, full does 0 and 1.
        let layers = if mode == Mode::Probe { 1 } else { 2 };
        assert_eq!(m.chunks_verified_sync, 2 * layers, "{mode:?} {m:?}");
        assert_eq!((m.chunks_held, m.released_bytes_total), (0, 0));
        assert!(m.compressed_ratio_total > 1.0);
        assert_eq!(
            m.cache_resident_bytes,
            store.resident_bytes().unwrap() as u64
        );
        for (i, (k, v)) in data.iter().enumerate() {
            let (rk, rv) = store.read_tokens(i, 0, 1000).unwrap();
            assert!(rk == *k && rv == *v);
        }
    }
}

#[test]
fn c8_codec_restores_the_dequantized_values() {
    use kvc_int8::{calibrate, C8Params, LayerQuant};
    let l = layout(false);
    let mut rng = Rng(21);
    let tokens = 1000;
    let k = rng.f16_bytes(tokens * HEADS * DIM);
    let v = rng.f16_bytes(tokens * HEADS * DIM);
    let cal = l.k.with_dtype(Dtype::F16).unwrap();
    let mut kb = vec![0u8; cal.byte_len()];
    kb[..k.len()].copy_from_slice(&k);
    let mut vb = vec![0u8; cal.byte_len()];
    vb[..v.len()].copy_from_slice(&v);
    let mut params = C8Params::new();
    params
        .insert(
            0,
            LayerQuant {
                k: calibrate(&kb, &cal, 0..tokens, false).unwrap(),
                v: calibrate(&vb, &cal, 0..tokens, false).unwrap(),
            },
        )
        .unwrap();
    let codec: Arc<dyn StoreCodec> =
        Arc::new(C8Codec::gear_v1(params, Default::default()).unwrap());
    let store = Store::new(StoreConfig::default(), &[l], codec.clone()).unwrap();
    store.write_tokens(0, 0, &k, &v).unwrap();
    store.schedule(0).unwrap();
    store.wait_idle().unwrap();
    let m = store.metrics().unwrap();
    assert_eq!((m.chunks_held, m.fallbacks), (2, 0));
    // int8 then lossless: more than 2:1 of f16.
    assert!(m.lossless_ratio > 2.0, "{m:?}");
    let (rk, _) = store.read_tokens(0, 0, tokens).unwrap();
    assert_eq!(rk[..16 * ROW], k[..16 * ROW]);
    let info = kvc_store_async::ChunkInfo {
        layer: 0,
        tensor: kvc_store_async::Tensor::K,
        dtype: Dtype::F16,
        n_heads: HEADS,
        head_dim: DIM,
        start: 32,
        count: 384,
    };
    let mut reference = Vec::new();
    codec
        .reference(&info, &k[32 * ROW..416 * ROW], &mut reference)
        .unwrap();
    assert_eq!(rk[32 * ROW..416 * ROW], reference[..]);
    assert_ne!(rk[32 * ROW..416 * ROW], k[32 * ROW..416 * ROW]);
}

#[test]
fn bad_input_is_a_typed_error() {
    let l = layout(false);
    assert!(Store::new(StoreConfig::default(), &[], gear()).is_err());
    assert!(Store::new(
        StoreConfig {
            group_tokens: 0,
            ..StoreConfig::default()
        },
        &[l],
        gear()
    )
    .is_err());
    let store = Store::new(StoreConfig::default(), &[l], gear()).unwrap();
    let row = vec![0u8; ROW];
    assert_eq!(
        store.append_tokens(1, &row, &row).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        store
            .append_tokens(0, &row[1..], &row[1..])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        store
            .append_tokens(0, &row, &row[..ROW / 2])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        store.write_tokens(0, 5, &row, &row).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert!(store.write_tokens(0, usize::MAX, &row, &row).is_err());
    let big = vec![0u8; ROW * 2049];
    assert!(store.write_tokens(0, 0, &big, &big).is_err());
    assert!(store.read_tokens(0, 0, 1).is_err());
    assert!(store.compress_chunk(0, 0, 1).is_err());
    let mut rng = Rng(2);
    fill(&store, 0, 700, &mut rng);
    store.wait_idle().unwrap();
    let e = store.write_tokens(0, 40, &row, &row).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    assert_eq!(
        store.compress_chunk(0, 30, 10).unwrap_err().kind(),
        ErrorKind::Busy
    );
    // Writes past the chunks are fine.
    store.write_tokens(0, 600, &row, &row).unwrap();
}

#[test]
fn compact_materializes_then_evicts() {
    let l = layout(false);
    let store = Store::new(StoreConfig::default(), &[l], gear()).unwrap();
    let mut rng = Rng(4);
    let (k, v) = fill(&store, 0, 900, &mut rng);
    store.wait_idle().unwrap();
    assert_eq!(store.metrics().unwrap().chunks_held, 2);
    // Keep tokens 0..100 and 500..900.
    let plan = ReservePlan::new(&[(0, 100), (500, 400)], 900).unwrap();
    assert_eq!(store.compact(0, &plan).unwrap(), 500);
    // The bootstrap chunk (16..32) is before the first token the plan moves (100): it
    // stays stored; the group at 32 was restored and dropped.
    let chunks = store.chunks(0).unwrap();
    assert_eq!(chunks.len(), 1, "{chunks:?}");
    assert_eq!(
        (chunks[0].start, chunks[0].count, chunks[0].status),
        (16, 16, ChunkStatus::Stored)
    );
    let (rk, rv) = store.read_tokens(0, 0, 500).unwrap();
    let want_k = [&k[..100 * ROW], &k[500 * ROW..900 * ROW]].concat();
    let want_v = [&v[..100 * ROW], &v[500 * ROW..900 * ROW]].concat();
    assert!(rk == want_k && rv == want_v);
    // A plan of the wrong length is refused.
    assert!(store
        .compact(0, &ReservePlan::new(&[(0, 10)], 20).unwrap())
        .is_err());
}
