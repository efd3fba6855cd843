//! Memory and disk tiers, the blob's validation and the front's fallthrough, promotion
//! and fault counting, on the embedded sample.

mod common;

use std::sync::Arc;

use common::*;
use kvc_store_tiers::{
    verify, Blob, ChunkCodec, ChunkShape, DiskTier, Error, ErrorKind, MemoryTier, Tier, Tiers,
    TransformCodec,
};

fn store_sample(t: &Tiers, seed: u32) {
    let r = t
        .store(&tokens(seed), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    assert_eq!(r.chunks, 8);
}

#[test]
fn every_codec_round_trips_through_memory_and_disk() {
    for codec in ChunkCodec::ALL {
        let dir = TempDir(temp_dir("rt"));
        let mem = Arc::new(MemoryTier::new(64 << 20));
        let disk = Arc::new(DiskTier::open(&dir.0, 64 << 20).unwrap());
        let t = new_tiers(codec, vec![Box::new(mem.clone()), Box::new(disk.clone())]);
        assert_eq!(t.lookup(&tokens(1)), 0);
        assert_eq!(t.restore(&tokens(1)).tokens, 0);
        let r = t
            .store(&tokens(1), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
            .unwrap();
        assert_eq!((r.chunks, r.chunks_encoded, r.failures), (8, 8, 0));
        if codec != ChunkCodec::Raw {
            assert!(
                r.bytes_stored < r.bytes_raw,
                "{codec:?}: {} >= {}",
                r.bytes_stored,
                r.bytes_raw
            );
        }
        // Storing again encodes nothing.
        assert_eq!(
            t.store(&tokens(1), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
                .unwrap()
                .chunks_encoded,
            0
        );
        assert_eq!(t.lookup(&tokens(1)), 512);
        // A longer prompt with the same start: the cached prefix; another start: nothing.
        let mut longer = tokens(1);
        longer.extend(0..100);
        assert_eq!(t.lookup(&longer), 512);
        let mut diverge = tokens(1);
        diverge[200] ^= 1;
        assert_eq!(t.lookup(&diverge), 192);
        assert_restored(&t.restore(&diverge), codec);
        let first = t.restore(&tokens(1));
        assert_eq!(first.tokens, 512);
        let (ek, ev) = assert_restored(&first, codec);
        eprintln!("{}: relative RMS error K {ek:.4} V {ev:.4}", codec.name());
        // Another instance over the same disk directory (fresh memory) finds it on disk
        // and promotes it into its memory.
        let mem2 = Arc::new(MemoryTier::new(64 << 20));
        let t2 = new_tiers(
            codec,
            vec![
                Box::new(mem2.clone()),
                Box::new(DiskTier::open(&dir.0, 64 << 20).unwrap()),
            ],
        );
        // A lossy restore is still deterministic: every instance gets the same bytes.
        assert_eq!(t2.restore(&tokens(1)), first);
        let m = t2.metrics();
        assert_eq!((m.tiers[0].hits, m.tiers[1].hits, m.promotions), (0, 8, 8));
        assert_eq!(mem2.stats().entries, 8);
        assert_eq!(t2.restore(&tokens(1)), first);
        assert_eq!(t2.metrics().tiers[0].hits, 8);
        assert_eq!(t2.metrics().fallbacks, 0);
        // Another codec (kvq with other bits included) is another fingerprint: nothing
        // shared, nothing restored.
        for other in ChunkCodec::ALL.into_iter().filter(|&c| c != codec) {
            let t3 = new_tiers(other, vec![Box::new(disk.clone())]);
            assert_eq!(t3.lookup(&tokens(1)), 0, "{codec:?} found by {other:?}");
            assert_eq!(t3.restore(&tokens(1)).tokens, 0);
        }
    }
}

/// Puts `blob` under the key of chunk `i` of `seed`'s tokens directly into a tier.
fn plant(t: &Tiers, tier: &dyn Tier, seed: u32, i: usize, blob: Vec<u8>) {
    let key = t.keys(&tokens(seed))[i];
    tier.put(&[(key, Arc::new(blob))]).unwrap();
}

#[test]
fn corrupt_and_foreign_blobs_are_counted_misses_never_restores() {
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(mem.clone())]).unwrap();
    store_sample(&t, 2);
    let keys = t.keys(&tokens(2));
    let good: Blob = mem.get(&keys[..1]).unwrap()[0].clone().unwrap();
    assert!(verify(&good).is_ok());
    // Another model's valid blob for the same tokens.
    let other = Tiers::new(
        kvc_store_tiers::TiersConfig {
            model_hash: [1; 32],
            ..config(ChunkCodec::GearV2)
        },
        vec![Box::new(MemoryTier::new(64 << 20))],
    )
    .unwrap();
    store_sample(&other, 2);
    // Chunk 5: a flipped payload byte; chunk 3: another model's blob; chunk 6: garbage.
    let mut flipped = mem.get(&keys[5..6]).unwrap()[0].as_deref().unwrap().clone();
    let n = flipped.len();
    flipped[n / 2] ^= 0x10;
    plant(&t, &*mem, 2, 5, flipped);
    plant(&t, &*mem, 2, 6, b"not a blob at all".to_vec());
    let foreign_key = other.keys(&tokens(2))[3];
    let foreign = Arc::new(MemoryTier::new(1 << 30));
    let o2 = Tiers::new(
        kvc_store_tiers::TiersConfig {
            model_hash: [1; 32],
            ..config(ChunkCodec::GearV2)
        },
        vec![Box::new(foreign.clone())],
    )
    .unwrap();
    store_sample(&o2, 2);
    let fb = foreign.get(&[foreign_key]).unwrap()[0]
        .as_deref()
        .unwrap()
        .clone();
    plant(&t, &*mem, 2, 3, fb);
    let r = t.restore(&tokens(2));
    assert_eq!(r.tokens, 3 * 64);
    assert_exact(&r);
    let m = t.metrics();
    assert_eq!(m.tiers[0].corrupt, 2);
    assert_eq!(m.tiers[0].foreign, 1);
    assert_eq!(m.fallbacks, 3);
    // The bad values were removed; a store writes them again and all restores.
    assert_eq!(
        mem.contains(&keys).unwrap(),
        [true, true, true, false, true, false, false, true]
    );
    assert_eq!(
        t.store(&tokens(2), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
            .unwrap()
            .chunks_encoded,
        3
    );
    assert_exact(&t.restore(&tokens(2)));
    assert_eq!(t.restore(&tokens(2)).tokens, 512);
}

#[test]
fn the_decoder_rejects_every_damaged_blob_with_a_typed_error() {
    for codec in [ChunkCodec::GearV1, ChunkCodec::KvqK4V4] {
        damaged_blobs_are_typed_errors(codec);
    }
}

fn damaged_blobs_are_typed_errors(codec: ChunkCodec) {
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = Tiers::new(config(codec), vec![Box::new(mem.clone())]).unwrap();
    store_sample(&t, 3);
    let keys = t.keys(&tokens(3));
    let good = mem.get(&keys[..1]).unwrap()[0].as_deref().unwrap().clone();
    let h = verify(&good).unwrap();
    assert_eq!(
        (h.n_layer, h.n_kv_head, h.head_dim, h.n_tokens, h.codec),
        (4, 3, 64, 64, codec.id())
    );
    assert_eq!(h.key, keys[0]);
    // Every truncation (every length for kvq's smaller blobs).
    let step = if codec.lossless() { 97 } else { 1 };
    for len in (0..good.len()).step_by(step).chain([good.len() - 1]) {
        let e = verify(&good[..len]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptData, "len {len}: {e}");
    }
    // Bit flips all over (header fields included): always an error, often the checksum.
    let step = if codec.lossless() { 131 } else { 37 };
    for pos in (0..good.len()).step_by(step).chain(0..112) {
        let mut b = good.clone();
        b[pos] ^= 0x04;
        let e = verify(&b).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptData, "byte {pos}: {e}");
        // And through the front: a counted miss.
        plant(&t, &*mem, 3, 0, b);
        assert_eq!(t.restore(&tokens(3)).tokens, 0);
        plant(&t, &*mem, 3, 0, good.clone());
    }
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(verify(&b), Err(Error::BadMagic { .. })));
    let mut b = good.clone();
    b[8] = 2;
    assert!(matches!(verify(&b), Err(Error::BadVersion { found: 2 })));
    let mut b = good.clone();
    b.push(0);
    assert!(matches!(verify(&b), Err(Error::BadLength { .. })));
    // A blob moved to another key of the same model: valid, but foreign.
    plant(&t, &*mem, 3, 1, good.clone());
    let r = t.restore(&tokens(3));
    assert_eq!(r.tokens, 64);
    assert_restored(&r, codec);
    assert_eq!(t.metrics().tiers[0].foreign, 1);
}

#[test]
fn disk_index_survives_a_restart_and_drops_bad_files() {
    let dir = TempDir(temp_dir("restart"));
    {
        let t = Tiers::new(
            config(ChunkCodec::GearV2),
            vec![Box::new(DiskTier::open(&dir.0, 64 << 20).unwrap())],
        )
        .unwrap();
        store_sample(&t, 4);
    }
    let files = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };
    assert_eq!(files().len(), 8);
    // Damage: truncate one file, write a stray file with a key name, flip a payload byte
    // of another (only the checksum at read time can see that one).
    let t0 = Tiers::new(
        config(ChunkCodec::GearV2),
        vec![Box::new(MemoryTier::new(1))],
    )
    .unwrap();
    let keys = t0.keys(&tokens(4));
    let path = |i: usize| dir.0.join(format!("{}.kvc", keys[i].to_hex()));
    let b = std::fs::read(path(6)).unwrap();
    std::fs::write(path(6), &b[..b.len() / 2]).unwrap();
    std::fs::write(dir.0.join(format!("{}.kvc", "ab".repeat(32))), b"junk").unwrap();
    let mut b = std::fs::read(path(4)).unwrap();
    let n = b.len();
    b[n - 100] ^= 1;
    std::fs::write(path(4), &b).unwrap();
    let disk = Arc::new(DiskTier::open(&dir.0, 64 << 20).unwrap());
    let s = disk.stats();
    assert_eq!((s.entries, s.corrupt_removed), (7, 2));
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(disk.clone())]).unwrap();
    assert_eq!(t.lookup(&tokens(4)), 6 * 64);
    let r = t.restore(&tokens(4));
    assert_eq!(r.tokens, 4 * 64);
    assert_exact(&r);
    assert_eq!(t.metrics().tiers[0].corrupt, 1);
    assert!(!path(4).exists());
    assert_eq!(files().len(), 6);
}

#[test]
fn disk_budget_evicts_lru_and_full_or_broken_disks_are_fallbacks() {
    let dir = TempDir(temp_dir("budget"));
    let probe = Arc::new(MemoryTier::new(1 << 30));
    let tp = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(probe.clone())]).unwrap();
    store_sample(&tp, 5);
    let per = probe.stats().bytes / 8;
    // Room for about three chunks.
    let budget = per * 3 + per / 2;
    let disk = Arc::new(DiskTier::open(&dir.0, budget).unwrap());
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(disk.clone())]).unwrap();
    store_sample(&t, 5);
    let s = disk.stats();
    assert!(s.bytes <= budget, "{} > {budget}", s.bytes);
    assert!(s.evictions >= 4, "{s:?}");
    let on_disk: u64 = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(on_disk, s.bytes);
    // The oldest (first) chunks went: the prefix is gone, and restore says so correctly.
    assert_exact(&t.restore(&tokens(5)));
    // A budget smaller than one blob: refused, counted, never an error.
    let tiny = Arc::new(DiskTier::open(dir.0.join("tiny"), 10).unwrap());
    let tt = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(tiny.clone())]).unwrap();
    store_sample(&tt, 5);
    assert_eq!(tiny.stats().over_budget, 8);
    assert_eq!(tt.restore(&tokens(5)).tokens, 0);
    // A disk that fails (its directory replaced by a file): writes fail, counted; the
    // memory tier above still serves.
    let bdir = dir.0.join("broken");
    let broken = Arc::new(DiskTier::open(&bdir, 64 << 20).unwrap());
    std::fs::remove_dir_all(&bdir).unwrap();
    std::fs::write(&bdir, b"a file").unwrap();
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let tb = Tiers::new(
        config(ChunkCodec::GearV2),
        vec![Box::new(mem), Box::new(broken)],
    )
    .unwrap();
    let r = tb
        .store(&tokens(5), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    assert_eq!(r.failures, 1);
    assert_exact(&tb.restore(&tokens(5)));
    assert_eq!(tb.restore(&tokens(5)).tokens, 512);
    assert!(tb.metrics().tiers[1].errors >= 1);
}

#[test]
fn concurrent_writers_of_the_same_chunks_leave_valid_files() {
    let dir = TempDir(temp_dir("race"));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let d = dir.0.clone();
            std::thread::spawn(move || {
                // Each thread is its own instance over the shared directory.
                let t = Tiers::new(
                    config(ChunkCodec::GearV1),
                    vec![Box::new(DiskTier::open(&d, 64 << 20).unwrap())],
                )
                .unwrap();
                for _ in 0..3 {
                    t.store(&tokens(6), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
                        .unwrap();
                    assert_exact(&t.restore(&tokens(6)));
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let t = Tiers::new(
        config(ChunkCodec::GearV1),
        vec![Box::new(DiskTier::open(&dir.0, 64 << 20).unwrap())],
    )
    .unwrap();
    let r = t.restore(&tokens(6));
    assert_eq!(r.tokens, 512);
    assert_exact(&r);
    assert_eq!(t.metrics().fallbacks, 0);
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        8,
        "temporary files left"
    );
}

#[test]
fn bad_arguments_are_errors() {
    let mk = |shape| {
        Tiers::new(
            kvc_store_tiers::TiersConfig {
                shape,
                ..config(ChunkCodec::Raw)
            },
            vec![Box::new(MemoryTier::new(1))],
        )
    };
    assert!(mk(kvc_store_tiers::ChunkShape {
        chunk_tokens: 0,
        ..shape()
    })
    .is_err());
    assert!(mk(kvc_store_tiers::ChunkShape {
        n_layer: 1 << 21,
        ..shape()
    })
    .is_err());
    assert!(mk(kvc_store_tiers::ChunkShape {
        dtype: kvc_types::Dtype::I8,
        ..shape()
    })
    .is_err());
    assert!(Tiers::new(config(ChunkCodec::Raw), vec![]).is_err());
    let t = mk(shape()).unwrap();
    let e = t
        .store(&tokens(7), &SAMPLE_K[1..], SAMPLE_V, SAMPLE_TOKENS)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(ChunkCodec::from_name("zstd").is_err());
    assert_eq!(
        ChunkCodec::from_name("gear-v2").unwrap(),
        ChunkCodec::GearV2
    );
}

#[test]
fn prefetch_promotes_into_memory_in_the_background() {
    let dir = TempDir(temp_dir("prefetch"));
    let a = Tiers::new(
        config(ChunkCodec::GearV2),
        vec![Box::new(DiskTier::open(&dir.0, 64 << 20).unwrap())],
    )
    .unwrap();
    store_sample(&a, 8);
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let b = Arc::new(
        Tiers::new(
            config(ChunkCodec::GearV2),
            vec![
                Box::new(mem.clone()),
                Box::new(DiskTier::open(&dir.0, 64 << 20).unwrap()),
            ],
        )
        .unwrap(),
    );
    let mut half = tokens(8);
    half[300] ^= 1; // chunks 0..4 are cached for this prompt
    assert_eq!(b.prefetch(half).join().unwrap(), 4);
    assert_eq!(mem.stats().entries, 4);
    let r = b.restore_async(tokens(8)).join().unwrap();
    assert_eq!(r.tokens, 512);
    assert_exact(&r);
    let m = b.metrics();
    assert_eq!((m.tiers[0].hits, m.tiers[1].hits), (4, 8));
}

#[test]
fn a_blob_with_a_valid_checksum_but_a_broken_section_ends_the_prefix() {
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(mem.clone())]).unwrap();
    store_sample(&t, 9);
    let keys = t.keys(&tokens(9));
    // Chunk 2: layer 1's K section zeroed (its length kept), the checksum recomputed, as
    // a writer with a codec bug would leave it. Only the section decode can see it.
    let mut b = mem.get(&keys[2..3]).unwrap()[0].as_deref().unwrap().clone();
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    let (l0k, l0v, l1k) = (u32_at(&b, 112), u32_at(&b, 116), u32_at(&b, 120));
    let start = 112 + 8 * 4 + l0k + l0v;
    b[start..start + l1k].fill(0);
    let n = b.len();
    let sum = *blake3::hash(&b[..n - 32]).as_bytes();
    b[n - 32..].copy_from_slice(&sum);
    assert!(verify(&b).is_ok());
    plant(&t, &*mem, 9, 2, b);
    let r = t.restore(&tokens(9));
    assert_eq!(r.tokens, 128);
    assert_exact(&r);
    let m = t.metrics();
    assert_eq!(
        (m.tiers[0].corrupt, m.fallbacks, m.chunks_restored),
        (1, 1, 2)
    );
    assert!(!mem.contains(&keys[2..3]).unwrap()[0]);
}

#[test]
fn kvq_wire_bytes_per_token_are_under_f16_over_3_5() {
    // Every byte of every blob (header, section table, sections, checksum) against the
    // f16 bytes of the same tokens, on the sample's shape (4 layers, chunks of 64) and on
    // SmolLM2-135M's (30 layers, 3 KV heads of 64, chunks of 256, the default).
    let mem = Arc::new(MemoryTier::new(256 << 20));
    let t = Tiers::new(config(ChunkCodec::KvqK4V4), vec![Box::new(mem.clone())]).unwrap();
    let r = t
        .store(&tokens(40), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let blobs: u64 = mem
        .get(&t.keys(&tokens(40)))
        .unwrap()
        .iter()
        .map(|b| b.as_ref().unwrap().len() as u64)
        .sum();
    assert_eq!(blobs, r.bytes_stored);
    let per_tok = blobs as f64 / SAMPLE_TOKENS as f64;
    let f16_tok = r.bytes_raw as f64 / SAMPLE_TOKENS as f64;
    eprintln!(
        "sample shape: kvq-k4v4 {per_tok:.2} B/token, f16 {f16_tok:.0}: f16/{:.3}",
        f16_tok / per_tok
    );
    assert!(f16_tok / per_tok > 3.5);
    let smol = ChunkShape {
        n_layer: 30,
        n_kv_head: 3,
        head_dim: 64,
        dtype: kvc_types::Dtype::F16,
        chunk_tokens: 256,
    };
    // Synthetic finite f16 KV (the size of a kvq blob does not depend on the values).
    let n = 512;
    let vals = smol.n_layer * n * 3 * 64;
    let kv: Vec<u8> = (0..vals)
        .flat_map(|i| half::f16::from_f32(((i * 7919) % 2001) as f32 / 1000.0 - 1.0).to_le_bytes())
        .collect();
    for (codec, min_ratio) in [
        (ChunkCodec::KvqK4V4, 3.5),
        (ChunkCodec::KvqK4V2, 4.5),
        (ChunkCodec::KvqK8V4, 2.5),
    ] {
        let t = Tiers::new(
            kvc_store_tiers::TiersConfig {
                shape: smol,
                codec,
                model_hash: [3; 32],
            },
            vec![Box::new(MemoryTier::new(256 << 20))],
        )
        .unwrap();
        let toks: Vec<u32> = (0..n as u32).collect();
        let r = t.store(&toks, &kv, &kv, n).unwrap();
        assert_eq!(r.chunks_encoded, 2);
        let ratio = r.bytes_raw as f64 / r.bytes_stored as f64;
        eprintln!(
            "SmolLM2 shape: {} {:.1} B/token, f16 {:.0}: f16/{ratio:.3}",
            codec.name(),
            r.bytes_stored as f64 / n as f64,
            r.bytes_raw as f64 / n as f64
        );
        assert!(ratio > min_ratio, "{codec:?}: f16/{ratio}");
    }
}

#[test]
fn kvq_refuses_chunks_with_non_finite_values_and_counts_them() {
    let row = shape().row_bytes();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        // One non-finite K value in chunk 2 (tokens 128..192) of layer 1, and one in V of
        // chunk 5 layer 3.
        let mut k = SAMPLE_K.to_vec();
        let mut v = SAMPLE_V.to_vec();
        let at = (SAMPLE_TOKENS + 130) * row + 2 * 37;
        k[at..at + 2].copy_from_slice(&half::f16::from_f32(bad).to_le_bytes());
        let at = (3 * SAMPLE_TOKENS + 5 * 64 + 3) * row;
        v[at..at + 2].copy_from_slice(&half::f16::from_f32(bad).to_le_bytes());
        let mem = Arc::new(MemoryTier::new(64 << 20));
        let t = Tiers::new(config(ChunkCodec::KvqK4V4), vec![Box::new(mem.clone())]).unwrap();
        let r = t.store(&tokens(41), &k, &v, SAMPLE_TOKENS).unwrap();
        assert_eq!((r.chunks, r.chunks_encoded, r.chunks_refused), (8, 6, 2));
        assert_eq!(t.metrics().chunks_refused, 2);
        let keys = t.keys(&tokens(41));
        assert_eq!(
            mem.contains(&keys).unwrap(),
            [true, true, false, true, true, false, true, true]
        );
        // Only the prefix before the refused chunk is found and restored.
        assert_eq!(t.lookup(&tokens(41)), 128);
        let got = t.restore(&tokens(41));
        assert_eq!(got.tokens, 128);
        assert_restored(&got, ChunkCodec::KvqK4V4);
        // A lossless codec stores the same KV as it is.
        let g = Tiers::new(
            config(ChunkCodec::GearV2),
            vec![Box::new(MemoryTier::new(64 << 20))],
        )
        .unwrap();
        let r = g.store(&tokens(41), &k, &v, SAMPLE_TOKENS).unwrap();
        assert_eq!((r.chunks_encoded, r.chunks_refused), (8, 0));
        let got = g.restore(&tokens(41));
        assert_eq!((got.tokens, got.k == k, got.v == v), (512, true, true));
    }
}

#[test]
fn kvq_needs_a_head_dim_it_codes() {
    for head_dim in [48, 80, 96] {
        let cfg = kvc_store_tiers::TiersConfig {
            shape: ChunkShape {
                head_dim,
                ..shape()
            },
            ..config(ChunkCodec::KvqK4V4)
        };
        let e = Tiers::new(cfg, vec![Box::new(MemoryTier::new(1 << 20))])
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    assert_eq!(ChunkCodec::from_name("kvq").unwrap(), ChunkCodec::KvqK4V4);
    for c in ChunkCodec::ALL {
        assert_eq!(ChunkCodec::from_name(c.name()).unwrap(), c);
        assert_eq!(ChunkCodec::from_id(c.id()), Some(c));
        assert_eq!(
            c.lossless(),
            c.kvq_bits().is_none() && c != ChunkCodec::Transform
        );
    }
    assert_eq!(ChunkCodec::from_id(7), None);
}

/// Layer `l`'s tokens `[from, to)` of a `[4][kv_tokens][row]` buffer.
fn tokens_of(buf: &[u8], kv_tokens: usize, l: usize, from: usize, to: usize) -> &[u8] {
    let row = shape().row_bytes();
    &buf[(l * kv_tokens + from) * row..(l * kv_tokens + to) * row]
}

#[test]
fn restore_into_writes_the_prefix_in_place_and_leaves_the_rest() {
    for codec in [ChunkCodec::Raw, ChunkCodec::GearV2] {
        let t = Tiers::new(config(codec), vec![Box::new(MemoryTier::new(64 << 20))]).unwrap();
        store_sample(&t, 11);
        let row = shape().row_bytes();
        // A cache with room for 100 more tokens than the prompt; 5.5 chunks asked for.
        let kv = SAMPLE_TOKENS + 100;
        let (mut k, mut v) = (vec![0xa5u8; 4 * kv * row], vec![0x5au8; 4 * kv * row]);
        let asked = &tokens(11)[..352];
        assert_eq!(t.restore_into(asked, kv, &mut k, &mut v).unwrap(), 320);
        let r = t.restore(asked);
        assert_eq!(r.tokens, 320);
        for l in 0..4 {
            assert_eq!(
                tokens_of(&k, kv, l, 0, 320),
                &r.k[l * 320 * row..(l + 1) * 320 * row]
            );
            assert_eq!(
                tokens_of(&v, kv, l, 0, 320),
                &r.v[l * 320 * row..(l + 1) * 320 * row]
            );
            assert!(tokens_of(&k, kv, l, 320, kv).iter().all(|&b| b == 0xa5));
            assert!(tokens_of(&v, kv, l, 320, kv).iter().all(|&b| b == 0x5a));
        }
        assert_eq!(prefix(SAMPLE_K, 320), r.k, "{codec:?}");
        // kv_tokens bounds the restore; buffers shorter than n_layer * kv_tokens * row are
        // refused before anything is written.
        let (mut k2, mut v2) = (vec![7u8; 4 * 200 * row], vec![7u8; 4 * 200 * row]);
        assert_eq!(
            t.restore_into(&tokens(11), 200, &mut k2, &mut v2).unwrap(),
            192
        );
        assert_eq!(tokens_of(&k2, 200, 3, 0, 192), tokens_of(&k, kv, 3, 0, 192));
        let e = t
            .restore_into(&tokens(11), 201, &mut k2, &mut v2)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(
            t.restore_into(&tokens(12), 200, &mut k2, &mut v2).unwrap(),
            0
        );
    }
}

#[test]
fn restore_into_a_broken_chunk_ends_the_prefix_and_leaves_bytes_past_the_asked_chunks() {
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(mem.clone())]).unwrap();
    store_sample(&t, 13);
    let keys = t.keys(&tokens(13));
    // Chunk 2: layer 3's V section zeroed with a valid checksum (as in
    // a_blob_with_a_valid_checksum_but_a_broken_section_ends_the_prefix): its earlier
    // sections decode into the caller's buffer before the broken one fails.
    let mut b = mem.get(&keys[2..3]).unwrap()[0].as_deref().unwrap().clone();
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    let lens: Vec<usize> = (0..8).map(|i| u32_at(&b, 112 + 4 * i)).collect();
    let start = 112 + 8 * 4 + lens[..7].iter().sum::<usize>();
    b[start..start + lens[7]].fill(0);
    let n = b.len();
    let sum = *blake3::hash(&b[..n - 32]).as_bytes();
    b[n - 32..].copy_from_slice(&sum);
    plant(&t, &*mem, 13, 2, b);
    let row = shape().row_bytes();
    let kv = SAMPLE_TOKENS;
    let (mut k, mut v) = (vec![0xeeu8; 4 * kv * row], vec![0xeeu8; 4 * kv * row]);
    // Four chunks asked for: 0 and 1 restored, 2 broken, 3 fetched and decoded (unspecified).
    assert_eq!(
        t.restore_into(&tokens(13)[..256], kv, &mut k, &mut v)
            .unwrap(),
        128
    );
    for l in 0..4 {
        let want = |src: &[u8]| src[l * kv * row..(l * kv + 128) * row].to_vec();
        assert_eq!(tokens_of(&k, kv, l, 0, 128), want(SAMPLE_K));
        assert_eq!(tokens_of(&v, kv, l, 0, 128), want(SAMPLE_V));
        // Past the chunks asked for: untouched.
        assert!(tokens_of(&k, kv, l, 256, kv).iter().all(|&b| b == 0xee));
        assert!(tokens_of(&v, kv, l, 256, kv).iter().all(|&b| b == 0xee));
    }
    let m = t.metrics();
    assert_eq!(
        (m.tiers[0].corrupt, m.fallbacks, m.chunks_restored),
        (1, 1, 2)
    );
    assert!(!mem.contains(&keys[2..3]).unwrap()[0]);
}

#[test]
fn restore_into_stops_at_a_missing_chunk_even_when_later_ones_decoded() {
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(mem.clone())]).unwrap();
    store_sample(&t, 14);
    let keys = t.keys(&tokens(14));
    mem.remove(&keys[3]).unwrap();
    let row = shape().row_bytes();
    let kv = SAMPLE_TOKENS;
    let (mut k, mut v) = (vec![0u8; 4 * kv * row], vec![0u8; 4 * kv * row]);
    assert_eq!(
        t.restore_into(&tokens(14), kv, &mut k, &mut v).unwrap(),
        192
    );
    for l in 0..4 {
        assert_eq!(
            tokens_of(&k, kv, l, 0, 192),
            &SAMPLE_K[l * kv * row..(l * kv + 192) * row]
        );
        assert_eq!(
            tokens_of(&v, kv, l, 0, 192),
            &SAMPLE_V[l * kv * row..(l * kv + 192) * row]
        );
    }
    let m = t.metrics();
    assert_eq!(
        (m.tiers[0].misses, m.chunks_restored, m.fallbacks),
        (1, 3, 0)
    );
    // The allocating restore gives the same prefix at its own layer stride.
    let r = t.restore(&tokens(14));
    assert_eq!((r.tokens, r.k.clone()), (192, prefix(SAMPLE_K, 192)));
    assert_eq!(r.v, prefix(SAMPLE_V, 192));
}

#[test]
fn tc_restores_only_with_its_own_calibration_and_target() {
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = new_tiers(ChunkCodec::Transform, vec![Box::new(mem.clone())]);
    store_sample(&t, 61);
    assert_eq!(t.lookup(&tokens(61)), 512);
    let first = t.restore(&tokens(61));
    assert_restored(&first, ChunkCodec::Transform);
    // Another target of the same file, or another calibration of the same layout, is
    // another fingerprint: a miss, never a restore with the wrong transform.
    let other_target = Tiers::with_transform(
        config(ChunkCodec::Transform),
        transform_at("tc-0.04"),
        vec![Box::new(mem.clone())],
    )
    .unwrap();
    assert_eq!(other_target.lookup(&tokens(61)), 0);
    assert_eq!(other_target.restore(&tokens(61)).tokens, 0);
    let foreign_cal = kvc_transform_coder::golden::fixed_calibration(4, 3, 64, 4)
        .to_bytes()
        .unwrap();
    let foreign = Arc::new(TransformCodec::from_file(&foreign_cal, "tc-0.01").unwrap());
    let f = Tiers::with_transform(
        config(ChunkCodec::Transform),
        foreign,
        vec![Box::new(mem.clone())],
    )
    .unwrap();
    assert_eq!(f.lookup(&tokens(61)), 0);
    assert_eq!(f.restore(&tokens(61)).tokens, 0);
    assert_eq!(f.metrics().fallbacks, 0);
    // The same calibration in another instance restores the same bytes.
    let again = new_tiers(ChunkCodec::Transform, vec![Box::new(mem.clone())]);
    assert_eq!(again.restore(&tokens(61)), first);
    // No calibration, a calibration for another layout, a calibration with another codec:
    // refused when the tiers are made.
    let e = Tiers::new(
        config(ChunkCodec::Transform),
        vec![Box::new(MemoryTier::new(1 << 20))],
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let small = kvc_transform_coder::golden::fixed_calibration(2, 3, 64, 4)
        .to_bytes()
        .unwrap();
    let small = Arc::new(TransformCodec::from_file(&small, "tc-0.01").unwrap());
    let e = Tiers::with_transform(
        config(ChunkCodec::Transform),
        small,
        vec![Box::new(MemoryTier::new(1 << 20))],
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = Tiers::with_transform(
        config(ChunkCodec::GearV2),
        transform(),
        vec![Box::new(MemoryTier::new(1 << 20))],
    )
    .err()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

#[test]
fn tc_section_altered_under_a_valid_checksum_is_a_counted_fallback() {
    // Every bit of one section flipped in turn (its length kept, the blob checksum made
    // valid again, as a writer with a codec bug or another host's decoder would leave it):
    // either the rANS stream or the reconstruction hash catches it; the prefix ends before
    // the chunk and nothing wrong is restored.
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = new_tiers(ChunkCodec::Transform, vec![Box::new(mem.clone())]);
    store_sample(&t, 62);
    let good = t.restore(&tokens(62));
    let keys = t.keys(&tokens(62));
    let orig = mem.get(&keys[2..3]).unwrap()[0].as_deref().unwrap().clone();
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    // Layer 1's V section of chunk 2.
    let (l0k, l0v, l1k, l1v) = (
        u32_at(&orig, 112),
        u32_at(&orig, 116),
        u32_at(&orig, 120),
        u32_at(&orig, 124),
    );
    let start = 112 + 8 * 4 + l0k + l0v + l1k;
    let mut fallbacks = 0;
    // Every 97th bit (some 400 of them, spread over the whole section).
    for bit in (0..l1v * 8).step_by(97) {
        let mut b = orig.clone();
        b[start + bit / 8] ^= 1 << (bit % 8);
        let n = b.len();
        let sum = *blake3::hash(&b[..n - 32]).as_bytes();
        b[n - 32..].copy_from_slice(&sum);
        assert!(verify(&b).is_ok());
        plant(&t, &*mem, 62, 2, b);
        let r = t.restore(&tokens(62)[..192]);
        assert_eq!(r.tokens, 128, "bit {bit}");
        assert_eq!((&r.k, &r.v), (&prefix(&good.k, 128), &prefix(&good.v, 128)));
        fallbacks += 1;
        assert_eq!(t.metrics().fallbacks, fallbacks);
        assert!(!mem.contains(&keys[2..3]).unwrap()[0]);
    }
}

#[test]
fn tc_refuses_chunks_with_non_finite_values_and_counts_them() {
    let row = shape().row_bytes();
    let mut k = SAMPLE_K.to_vec();
    let at = (SAMPLE_TOKENS + 130) * row + 2 * 37;
    k[at..at + 2].copy_from_slice(&half::f16::from_f32(f32::NAN).to_le_bytes());
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let t = new_tiers(ChunkCodec::Transform, vec![Box::new(mem.clone())]);
    let r = t.store(&tokens(63), &k, SAMPLE_V, SAMPLE_TOKENS).unwrap();
    assert_eq!((r.chunks, r.chunks_encoded, r.chunks_refused), (8, 7, 1));
    assert_eq!(t.lookup(&tokens(63)), 128);
}
