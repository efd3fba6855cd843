//! What a small blob can make the decoders allocate (issue 25). A gear-v1 or gear-v2 blob
//! of at most 100 bytes, whatever its header claims, makes `decode_into` (what engines
//! call, with their own output buffer) hold at most [`MAX_BYTES_PER_INPUT_BYTE`] times the
//! blob's size plus its decoded length (the scratch of one value per element; the
//! decoded length itself is checked against the blob first, see `decoded_len` and
//! `BlobHeader::decoded_len`), plus [`FIXED_BYTES`]. Decoders are made before measuring,
//! as engines reuse them. zstd's decompression context is allocated by C (not counted
//! here) once per decoder, at a fixed size: the one-shot `ZSTD_decompressDCtx` decodes
//! straight into the output, with no window buffer sized by the frame.

use kvc_codec::gear_v1::{decoded_len, GearV1Decoder};
use kvc_codec::gear_v2::Decoder;
use kvc_codec::Dtype;
use kvc_test_alloc::{measure, random_bytes};

/// The stated bound (for the real blobs that are longer than 100 bytes too): bytes held at once per blob byte...
const MAX_BYTES_PER_INPUT_BYTE: usize = 16;
/// ...plus this much for any call (error messages, tables sized by constants).
const FIXED_BYTES: usize = 16 * 1024;

#[global_allocator]
static GLOBAL: kvc_test_alloc::Counting = kvc_test_alloc::Counting;

fn blobs(dir: &str, skip: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut paths: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for p in paths {
        if dir.ends_with("golden") && p.extension().is_none_or(|e| e != "kvg2") {
            continue;
        }
        let b = std::fs::read(&p).unwrap();
        out.push(b[skip..].to_vec());
    }
    assert!(!out.is_empty(), "no blobs under {}", root.display());
    out
}

/// 100-byte variants of real blobs: cut, with the length and shape fields made huge, and
/// with random bytes after the header.
fn variants(real: &[Vec<u8>], header_words: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, b) in real.iter().enumerate() {
        let mut cut = b.clone();
        cut.resize(100, 0);
        out.push(cut.clone());
        for &w in header_words {
            for v in [u32::MAX, 1 << 24, 1 << 16, 0] {
                let mut m = cut.clone();
                m[w..w + 4].copy_from_slice(&v.to_le_bytes());
                out.push(m);
            }
        }
        for seed in 0..20u64 {
            let mut m = cut.clone();
            random_bytes(seed * 1000 + i as u64, &mut m[24..]);
            out.push(m);
        }
    }
    out
}

fn check(what: &str, blob: &[u8], decoded: usize, peak: usize, largest: usize) {
    let bound = MAX_BYTES_PER_INPUT_BYTE * blob.len() + decoded + FIXED_BYTES;
    assert!(
        peak <= bound && largest <= bound,
        "{what}: a {}-byte blob (decoded length {decoded}) held {peak} bytes at once \
         (largest allocation {largest}), bound {bound}: {blob:02x?}",
        blob.len()
    );
}

#[test]
fn a_100_byte_gear_v1_blob_allocates_little() {
    // fuzz/seeds/gear_v1_decode: a dtype selector byte, then a blob of the embedded sample.
    let real = blobs("../../fuzz/seeds/gear_v1_decode", 1);
    let mut dec = GearV1Decoder::new().unwrap();
    let mut out = vec![0u8; 1 << 20];
    let mut worst = 0;
    let mut whole = 0;
    for b in variants(&real, &[0, 4, 8]).into_iter().chain(real.clone()) {
        for dtype in Dtype::ALL {
            let decoded = decoded_len(dtype, &b).unwrap_or(0);
            let (peak, largest) = measure(|| {
                if dec.decode_into(dtype, &b, &mut out).is_ok() {
                    whole += 1;
                }
            });
            worst = worst.max(peak);
            check("gear-v1 decode_into", &b, decoded, peak, largest);
        }
    }
    // The real blobs decode whole (as their own dtype at least), under the same bound.
    assert!(whole >= real.len());
    // The scratch grew at least once (one byte per element), and was counted.
    assert!(worst > 0);
    eprintln!("gear-v1: at most {worst} bytes held for a blob ({whole} decoded whole)");
}

#[test]
fn a_100_byte_gear_v2_blob_allocates_little() {
    let real = blobs("tests/golden", 0);
    let mut dec = Decoder::new();
    let mut out = vec![0u8; 1 << 20];
    let mut worst = 0;
    let mut whole = 0;
    // tokens, channels, chunk_tokens and the words after them.
    for b in variants(&real, &[8, 12, 16, 20])
        .into_iter()
        .chain(real.clone())
    {
        let decoded = dec.open(&b).map_or(0, |o| o.header().decoded_len());
        let (peak, largest) = measure(|| {
            if let Ok(open) = dec.open(&b) {
                let n = open.header().decoded_len();
                if n <= out.len() && open.decode_into(&mut out[..n]).is_ok() {
                    whole += 1;
                }
            }
        });
        worst = worst.max(peak);
        check("gear-v2 open + decode_into", &b, decoded, peak, largest);
    }
    // The real blobs (600 to 1900 bytes) decode whole, under the same bound.
    assert!(whole >= real.len());
    eprintln!("gear-v2: at most {worst} bytes held for a blob ({whole} decoded whole)");
}
