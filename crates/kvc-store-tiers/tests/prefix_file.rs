//! The kv-prefix file (`KVCPRFIX`, docs/formats/kv-prefix.md) through `Tiers`: export and
//! import for every codec, a restore after an import equal to the original tiers' restore
//! byte for byte, the golden files of v1 (both directions), every bit flip and truncation
//! of a small file refused, a foreign file its own error, files on disk written atomically.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use half::f16;
use kvc_store_tiers::prefix_file::{self, PrefixFile, CHECKSUM_LEN, HEADER_LEN, MAGIC, VERSION};
use kvc_store_tiers::{
    ChunkCodec, ChunkShape, Error, ErrorKind, MemoryTier, Tier, Tiers, TiersConfig, TransformCodec,
};
use kvc_transform_coder::golden::fixed_calibration;
use kvc_types::Dtype;

/// The transform coder of the golden files: `kvc_transform_coder::golden`'s fixed
/// calibration for `shape`'s layout (sink of 2 tokens), target `tc-0.05`.
fn fixed_transform(shape: &ChunkShape) -> Arc<TransformCodec> {
    let cal = fixed_calibration(shape.n_layer, shape.n_kv_head, shape.head_dim, 2);
    Arc::new(TransformCodec::from_file(&cal.to_bytes().unwrap(), "tc-0.05").unwrap())
}

/// A front over one memory tier with `codec` (tc: the fixed calibration), `shape` and
/// `model_hash`; the tier too.
fn front(codec: ChunkCodec, shape: ChunkShape, model_hash: [u8; 32]) -> (Tiers, Arc<MemoryTier>) {
    let mem = Arc::new(MemoryTier::new(256 << 20));
    let cfg = TiersConfig {
        shape,
        codec,
        model_hash,
    };
    let tiers: Vec<Box<dyn Tier>> = vec![Box::new(mem.clone())];
    let t = match codec {
        ChunkCodec::Transform => Tiers::with_transform(cfg, fixed_transform(&shape), tiers),
        _ => Tiers::new(cfg, tiers),
    }
    .unwrap();
    (t, mem)
}

/// The sample's tokens of `seed` with 30 more after its 512 (a partial chunk that has KV
/// in no tier).
fn long_tokens(seed: u32) -> Vec<u32> {
    let mut t = tokens(seed);
    t.extend((0..30).map(|i| 7_000_000 + i));
    t
}

#[test]
fn every_codec_round_trips_and_restores_what_the_original_tiers_restore() {
    for codec in ChunkCodec::ALL {
        let (a, _) = front(codec, shape(), [0x5a; 32]);
        let toks = long_tokens(11);
        let r = a.store(&toks, SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS).unwrap();
        assert_eq!(r.chunks_encoded, 8, "{codec:?}");
        let export = a.export_prefix(&toks).unwrap();
        assert_eq!(
            (export.chunks, export.tokens_covered),
            (8, 512),
            "{codec:?}"
        );
        let file = PrefixFile::read(&export.bytes).unwrap();
        assert_eq!(file.tokens(), &toks[..]);
        assert_eq!(
            (file.n_chunks(), file.chunk_tokens(), file.fingerprint()),
            (8, 64, a.fingerprint())
        );

        // A fresh process: an empty memory tier of the same model, codec and layout.
        let (b, mem_b) = front(codec, shape(), [0x5a; 32]);
        assert_eq!(b.lookup(&toks), 0);
        let imp = b.import_prefix(&export.bytes).unwrap();
        assert_eq!(imp.tokens, toks);
        assert_eq!((imp.chunks, imp.tokens_covered), (8, 512));
        assert_eq!(mem_b.stats().entries, 8);
        assert_eq!(b.lookup(&imp.tokens), 512);
        let want = a.restore(&toks);
        let got = b.restore(&imp.tokens);
        assert_eq!(got.tokens, 512, "{codec:?}");
        assert!(
            got == want,
            "{codec:?}: the restore after the import differs"
        );
        if codec.lossless() {
            assert_exact(&got);
        }
        // restore_into too, into an engine's buffers of 542 tokens.
        let row = shape().row_bytes();
        let (mut k, mut v) = (vec![0u8; 4 * 542 * row], vec![0u8; 4 * 542 * row]);
        assert_eq!(
            b.restore_into(&imp.tokens, 542, &mut k, &mut v).unwrap(),
            512
        );
        for l in 0..4 {
            assert_eq!(
                &k[l * 542 * row..(l * 542 + 512) * row],
                &want.k[l * 512 * row..(l + 1) * 512 * row]
            );
        }
        // The imported tiers export the same file.
        assert!(
            b.export_prefix(&toks).unwrap().bytes == export.bytes,
            "{codec:?}"
        );
        let m = b.metrics();
        assert_eq!((m.tiers[0].chunks_written, m.fallbacks), (8, 0));
    }
}

#[test]
fn export_falls_through_the_tiers_and_stops_at_the_first_bad_chunk() {
    let dir = TempDir(temp_dir("prefix-export"));
    let disk = Arc::new(kvc_store_tiers::DiskTier::open(&dir.0, 64 << 20).unwrap());
    let a = new_tiers(
        ChunkCodec::GearV2,
        vec![Box::new(MemoryTier::new(64 << 20)), Box::new(disk.clone())],
    );
    a.store(&tokens(12), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let whole = a.export_prefix(&tokens(12)).unwrap();
    // Another instance: fresh memory, the chunks on disk only.
    let mem = Arc::new(MemoryTier::new(64 << 20));
    let b = new_tiers(
        ChunkCodec::GearV2,
        vec![Box::new(mem.clone()), Box::new(disk.clone())],
    );
    let e = b.export_prefix(&tokens(12)).unwrap();
    assert!(e == whole);
    let m = b.metrics();
    assert_eq!((m.tiers[1].hits, m.promotions), (8, 8));
    // Chunk 3 damaged in memory and gone from disk: the file ends before it.
    let keys = b.keys(&tokens(12));
    mem.put(&[(keys[3], Arc::new(b"not a blob".to_vec()))])
        .unwrap();
    disk.remove(&keys[3]).unwrap();
    let e = b.export_prefix(&tokens(12)).unwrap();
    assert_eq!((e.chunks, e.tokens_covered), (3, 192));
    assert_eq!(b.metrics().tiers[0].corrupt, 1);
    let f = PrefixFile::read(&e.bytes).unwrap();
    assert_eq!((f.n_chunks(), f.tokens()), (3, &tokens(12)[..]));
    // Imported elsewhere, it restores those three chunks exactly.
    let (c, _) = front(ChunkCodec::GearV2, shape(), [0x5a; 32]);
    let imp = c.import_prefix(&e.bytes).unwrap();
    assert_eq!(imp.tokens_covered, 192);
    let r = c.restore(&imp.tokens);
    assert_eq!(r.tokens, 192);
    assert_exact(&r);
}

#[test]
fn a_prefix_without_a_whole_chunk_is_a_valid_file_of_no_chunks() {
    let (a, _) = front(ChunkCodec::GearV2, shape(), [0x5a; 32]);
    a.store(&tokens(13), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    for toks in [&tokens(13)[..10], &[][..], &tokens(14)[..]] {
        let e = a.export_prefix(toks).unwrap();
        assert_eq!((e.chunks, e.tokens_covered), (0, 0));
        assert_eq!(e.bytes.len(), HEADER_LEN + 4 * toks.len() + CHECKSUM_LEN);
        let f = PrefixFile::read(&e.bytes).unwrap();
        assert_eq!((f.n_chunks(), f.tokens()), (0, toks));
        let (b, mem) = front(ChunkCodec::GearV2, shape(), [0x5a; 32]);
        let imp = b.import_prefix(&e.bytes).unwrap();
        assert_eq!(
            (&imp.tokens[..], imp.chunks, imp.tokens_covered),
            (toks, 0, 0)
        );
        assert_eq!(mem.stats().entries, 0);
    }
}

#[test]
fn a_file_of_another_model_codec_or_layout_is_foreign_and_imports_nothing() {
    let (a, _) = front(ChunkCodec::GearV2, shape(), [0x5a; 32]);
    a.store(&tokens(15), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let file = a.export_prefix(&tokens(15)).unwrap().bytes;
    let empty = a.export_prefix(&tokens(15)[..3]).unwrap().bytes;
    for (codec, sh, hash) in [
        (ChunkCodec::GearV2, shape(), [1; 32]),
        (ChunkCodec::GearV1, shape(), [0x5a; 32]),
        (ChunkCodec::KvqK4V4, shape(), [0x5a; 32]),
        (ChunkCodec::Transform, shape(), [0x5a; 32]),
        (
            ChunkCodec::GearV2,
            ChunkShape {
                chunk_tokens: 32,
                ..shape()
            },
            [0x5a; 32],
        ),
        (
            ChunkCodec::GearV2,
            ChunkShape {
                dtype: Dtype::Bf16,
                ..shape()
            },
            [0x5a; 32],
        ),
    ] {
        let (b, mem) = front(codec, sh, hash);
        for f in [&file, &empty] {
            let e = b.import_prefix(f).unwrap_err();
            assert!(
                matches!(e, Error::ForeignPrefixFile { .. }),
                "{codec:?}: {e}"
            );
            assert_eq!(e.kind(), ErrorKind::Foreign);
            assert!(e.to_string().contains("foreign"), "{e}");
        }
        assert_eq!(mem.stats().entries, 0);
        assert_eq!(b.restore(&tokens(15)).tokens, 0);
    }
    // A damaged foreign file is damaged.
    let (b, _) = front(ChunkCodec::GearV2, shape(), [1; 32]);
    let mut bad = file.clone();
    bad[100] ^= 1;
    assert_eq!(
        b.import_prefix(&bad).unwrap_err().kind(),
        ErrorKind::CorruptData
    );
}

/// 1 layer, 1 KV head of 4 values, chunks of 2 tokens, raw: a small file (two chunks and a
/// tail token, 500 bytes) whose every bit can be flipped.
const SMALL: ChunkShape = ChunkShape {
    n_layer: 1,
    n_kv_head: 1,
    head_dim: 4,
    dtype: Dtype::F16,
    chunk_tokens: 2,
};

fn small_file() -> (Vec<u8>, Vec<u32>) {
    let (t, _) = front(ChunkCodec::Raw, SMALL, [9; 32]);
    let toks = vec![5, 6, 7, 8, 9];
    let k: Vec<u8> = (0..5 * 8).map(|i| i as u8).collect();
    let v: Vec<u8> = (0..5 * 8).map(|i| 200 - i as u8).collect();
    t.store(&toks, &k, &v, 5).unwrap();
    let e = t.export_prefix(&toks).unwrap();
    assert_eq!(e.chunks, 2);
    (e.bytes, toks)
}

fn reseal(f: &mut [u8]) {
    let n = f.len() - CHECKSUM_LEN;
    let sum = *blake3::hash(&f[..n]).as_bytes();
    f[n..].copy_from_slice(&sum);
}

#[test]
fn every_flipped_bit_and_every_truncation_of_a_small_file_is_refused() {
    let (file, toks) = small_file();
    assert_eq!(
        file.len(),
        HEADER_LEN + 4 * 5 + 2 * (8 + 112 + 8 + 2 * 16 + 32) + CHECKSUM_LEN
    );
    let (t, mem) = front(ChunkCodec::Raw, SMALL, [9; 32]);
    let refused = |f: &[u8], what: &str| {
        let e = t.import_prefix(f).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptData, "{what}: {e}");
        assert!(PrefixFile::read(f).is_err() || matches!(e, Error::BadPrefixChunk { .. }));
        assert_eq!(mem.stats().entries, 0, "{what}: something was imported");
    };
    for bit in 0..8 * file.len() {
        let mut f = file.clone();
        f[bit / 8] ^= 1 << (bit % 8);
        refused(&f, &format!("bit {bit}"));
    }
    for len in 0..file.len() {
        refused(&file[..len], &format!("length {len}"));
    }
    let mut longer = file.clone();
    longer.push(0);
    refused(&longer, "a byte more");
    // Behind a recomputed checksum, every byte of the header, of the covered token ids
    // and of the blobs still fails a check of its own (a field, a blob's checksum, a key).
    let tail = HEADER_LEN + 4 * 4..HEADER_LEN + 4 * 5;
    for at in (0..file.len() - CHECKSUM_LEN).filter(|a| !tail.contains(a)) {
        for flip in [0x01, 0x80] {
            let mut f = file.clone();
            f[at] ^= flip;
            reseal(&mut f);
            refused(&f, &format!("resealed byte {at}"));
        }
    }
    // The tail token (past the last whole chunk) has no key: a changed one is a valid file
    // of other tokens, whose chunks are still those of the first four.
    let mut f = file.clone();
    f[tail.start] ^= 1;
    reseal(&mut f);
    let imp = t.import_prefix(&f).unwrap();
    assert_eq!(imp.tokens[..4], toks[..4]);
    assert_ne!(imp.tokens[4], toks[4]);
    assert_eq!(imp.tokens_covered, 4);
    // A blob of the right file moved to the other position, resealed: a key mismatch.
    let (t2, _) = front(ChunkCodec::Raw, SMALL, [9; 32]);
    let parsed = PrefixFile::read(&file).unwrap();
    let blobs: Vec<&[u8]> = parsed.chunks().map(|(_, b)| b).collect();
    let swapped =
        prefix_file::write(parsed.fingerprint(), 2, &toks, &[blobs[1], blobs[0]]).unwrap();
    match t2.import_prefix(&swapped).unwrap_err() {
        Error::BadPrefixChunk {
            chunk: 0, source, ..
        } => {
            assert!(matches!(*source, Error::ForeignBlob { what: "key" }))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn files_on_disk_are_written_atomically_and_read_back() {
    let dir = TempDir(temp_dir("prefix-file"));
    let (a, _) = front(ChunkCodec::GearV2, shape(), [0x5a; 32]);
    a.store(&tokens(16), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let path = dir.0.join("slot0.kvcprfix");
    std::fs::write(&path, b"an older file").unwrap();
    let e = a.export_prefix_file(&tokens(16), &path).unwrap();
    assert_eq!(e.tokens_covered, 512);
    assert_eq!(std::fs::read(&path).unwrap(), e.bytes);
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["slot0.kvcprfix"],
        "a temporary file was left behind"
    );
    let (b, _) = front(ChunkCodec::GearV2, shape(), [0x5a; 32]);
    let imp = b.import_prefix_file(&path).unwrap();
    assert_eq!(imp.tokens_covered, 512);
    assert_exact(&b.restore(&imp.tokens));
    // Unreadable, unwritable: I/O errors.
    let e = b.import_prefix_file(&dir.0.join("missing")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    let e = a
        .export_prefix_file(&tokens(16), &dir.0.join("no-such-dir/slot"))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    // More token ids than a file carries: refused before anything is fetched.
    let huge = vec![0u32; prefix_file::MAX_TOKENS + 1];
    assert_eq!(
        a.export_prefix(&huge).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

// --- golden files ---

/// The golden files' chunk shape, that of the kv-chunk golden files: 2 layers, 2 KV heads
/// of 64 values, f16, chunks of 4 tokens.
const GOLDEN: ChunkShape = ChunkShape {
    n_layer: 2,
    n_kv_head: 2,
    head_dim: 64,
    dtype: Dtype::F16,
    chunk_tokens: 4,
};
/// 10 tokens: two whole chunks and two more.
const GOLDEN_TOKENS: [u32; 10] = [1, 15043, 29892, 920, 526, 366, 29973, 13, 7, 100000];

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/kv-prefix-v1")
}

/// `KVC_WRITE_GOLDEN=1` writes a missing file; a golden file is never overwritten.
fn golden(name: &str, fresh: &[u8]) -> Vec<u8> {
    let path = golden_dir().join(name);
    if std::env::var_os("KVC_WRITE_GOLDEN").is_some() && !path.exists() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, fresh).unwrap();
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// K (`tensor` 0) or V (1) of the golden prefix, `[2][10][2][64]` f16: smooth values with
/// an outlier channel, no two tokens equal.
fn golden_values(tensor: usize) -> Vec<u8> {
    let n = GOLDEN.n_layer * GOLDEN_TOKENS.len() * GOLDEN.n_kv_head * GOLDEN.head_dim;
    (0..n)
        .flat_map(|i| {
            let c = i % GOLDEN.head_dim;
            let row = i / GOLDEN.head_dim;
            let x = ((i * 29 + tensor * 13) as f32 * 0.137).sin() * (1.0 + (row % 5) as f32)
                + c as f32 * 0.04
                - 1.2
                + if c == 11 { 9.0 } else { 0.0 };
            f16::from_f32(x).to_le_bytes()
        })
        .collect()
}

/// The golden prefix stored into a fresh front of `codec`, and the front's memory tier.
fn golden_front(codec: ChunkCodec) -> (Tiers, Arc<MemoryTier>) {
    let (t, mem) = front(codec, GOLDEN, [0x5a; 32]);
    let n = GOLDEN_TOKENS.len();
    t.store(&GOLDEN_TOKENS, &golden_values(0), &golden_values(1), n)
        .unwrap();
    (t, mem)
}

/// The golden files: `<codec>.kvcprfix` (the 10 tokens, their two whole chunks), and
/// `no-chunks.kvcprfix` (3 tokens of the gear-v2 front: no whole chunk).
const GOLDEN_CODECS: [ChunkCodec; 2] = [ChunkCodec::Raw, ChunkCodec::GearV2];

#[test]
fn v1_writing_the_golden_prefix_gives_the_golden_bytes() {
    for codec in GOLDEN_CODECS {
        let (t, _) = golden_front(codec);
        let fresh = t.export_prefix(&GOLDEN_TOKENS).unwrap().bytes;
        let want = golden(&format!("{}.kvcprfix", codec.name()), &fresh);
        assert!(
            fresh == want,
            "{}: the writer no longer writes the v1 golden bytes",
            codec.name()
        );
    }
    let (t, _) = golden_front(ChunkCodec::GearV2);
    let fresh = t.export_prefix(&GOLDEN_TOKENS[..3]).unwrap().bytes;
    assert!(fresh == golden("no-chunks.kvcprfix", &fresh));
}

#[test]
fn v1_golden_files_read_as_the_golden_prefix() {
    for codec in GOLDEN_CODECS {
        let (t, mem) = golden_front(codec);
        let bytes = golden(
            &format!("{}.kvcprfix", codec.name()),
            &t.export_prefix(&GOLDEN_TOKENS).unwrap().bytes,
        );
        assert_eq!(&bytes[..8], &MAGIC);
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), VERSION);
        let f = PrefixFile::read(&bytes).unwrap();
        assert_eq!(f.tokens(), &GOLDEN_TOKENS[..]);
        assert_eq!((f.chunk_tokens(), f.n_chunks()), (4, 2));
        assert_eq!(f.fingerprint(), t.fingerprint());
        // The blobs are the chunks' blobs, under the chunks' keys.
        let keys = t.keys(&GOLDEN_TOKENS);
        let held = mem.get(&keys).unwrap();
        for ((key, blob), (want_key, want)) in f.chunks().zip(keys.iter().zip(&held)) {
            assert_eq!(key, *want_key);
            assert_eq!(blob, want.as_deref().unwrap().as_slice());
        }
        // Imported by a fresh front, they restore the golden KV exactly (lossless codecs).
        let (b, _) = front(codec, GOLDEN, [0x5a; 32]);
        let imp = b.import_prefix(&bytes).unwrap();
        assert_eq!((imp.chunks, imp.tokens_covered), (2, 8));
        let r = b.restore(&imp.tokens);
        assert_eq!(r.tokens, 8);
        let sec = 8 * GOLDEN.row_bytes();
        let stride = GOLDEN_TOKENS.len() * GOLDEN.row_bytes();
        for (got, want) in [(&r.k, golden_values(0)), (&r.v, golden_values(1))] {
            for l in 0..2 {
                assert_eq!(
                    &got[l * sec..(l + 1) * sec],
                    &want[l * stride..l * stride + sec]
                );
            }
        }
    }
    let (t, _) = golden_front(ChunkCodec::GearV2);
    let bytes = golden(
        "no-chunks.kvcprfix",
        &t.export_prefix(&GOLDEN_TOKENS[..3]).unwrap().bytes,
    );
    let f = PrefixFile::read(&bytes).unwrap();
    assert_eq!(
        (f.tokens(), f.chunk_tokens(), f.n_chunks()),
        (&GOLDEN_TOKENS[..3], 4, 0)
    );
    assert_eq!(bytes.len(), HEADER_LEN + 12 + CHECKSUM_LEN);
}
