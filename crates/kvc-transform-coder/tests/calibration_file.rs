//! The calibration file format, `KVCTCCAL` version 1 (docs/formats/kv-chunk-tc.md):
//! a golden file checked both ways, and every bit flip and every truncation of it refused
//! with an error (the BLAKE3 checksum covers the header and the payload).
//!
//! `tests/golden/kvctccal-v1/fixed.kvctc` is `golden::fixed_calibration(2, 2, 64, 2)`'s
//! bytes. A new version gets a new directory; these files never change.
//! `KVC_WRITE_GOLDEN=1` writes missing files, it never overwrites.

use std::path::PathBuf;

use kvc_transform_coder::calibration::{MAGIC, VERSION};
use kvc_transform_coder::golden::fixed_calibration;
use kvc_transform_coder::{Calibration, ErrorKind};
use rayon::prelude::*;

const HEADER_LEN: usize = 64;
const CHECKSUM_LEN: usize = 32;

fn golden(name: &str, fresh: &[u8]) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/kvctccal-v1")
        .join(name);
    if std::env::var_os("KVC_WRITE_GOLDEN").is_some() && !path.exists() {
        std::fs::write(&path, fresh).unwrap();
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixed_file() -> (Calibration, Vec<u8>) {
    let cal = fixed_calibration(2, 2, 64, 2);
    let fresh = cal.to_bytes().unwrap();
    (cal, golden("fixed.kvctc", &fresh))
}

#[test]
fn golden_file_encodes_and_decodes_both_ways() {
    let (cal, file) = fixed_file();
    assert_eq!(
        cal.to_bytes().unwrap(),
        file,
        "the fixed calibration no longer encodes to the golden file"
    );
    let back = Calibration::from_bytes(&file).unwrap();
    assert_eq!(back, cal);
    // What the header says, read independently of the reader.
    assert_eq!(&file[..8], MAGIC);
    assert_eq!(u16::from_le_bytes([file[8], file[9]]), VERSION);
    let u32_at = |o: usize| u32::from_le_bytes(file[o..o + 4].try_into().unwrap());
    assert_eq!(
        [u32_at(12), u32_at(16), u32_at(20), u32_at(24), u32_at(28)],
        [64, 2, 2, 64, 2]
    );
    assert_eq!(&file[32..36], &[1, 14, 63, 0]); // norm RoPE, 14-bit tables of 63 symbols
    assert_eq!([u32_at(36), u32_at(40), u32_at(44)], [64, 3, 2]);
    let payload = u64::from_le_bytes(file[48..56].try_into().unwrap()) as usize;
    assert_eq!(file.len(), HEADER_LEN + payload + CHECKSUM_LEN);
    let end = file.len() - CHECKSUM_LEN;
    assert_eq!(blake3::hash(&file[..end]).as_bytes(), &file[end..]);
    assert_eq!(
        Calibration::fingerprint_of(&file).unwrap(),
        *blake3::hash(&file[..end]).as_bytes()
    );
    assert_eq!(back.target_names(), ["tc-0.01", "tc-0.05"]);
}

#[test]
fn every_truncation_is_an_error() {
    let (_, file) = fixed_file();
    (0..file.len()).into_par_iter().for_each(|n| {
        let e = Calibration::from_bytes(&file[..n]).expect_err("a truncated file parsed");
        assert_eq!(e.kind(), ErrorKind::CorruptData, "length {n}: {e}");
    });
    // And one byte too many.
    let mut longer = file.clone();
    longer.push(0);
    assert!(Calibration::from_bytes(&longer).is_err());
}

fn flip_is_refused(file: &[u8], bit: usize) {
    let mut f = file.to_vec();
    f[bit / 8] ^= 1 << (bit % 8);
    match Calibration::from_bytes(&f) {
        Ok(_) => panic!("bit {bit} (byte {}) flipped: parsed", bit / 8),
        Err(e) => assert_eq!(e.kind(), ErrorKind::CorruptData, "bit {bit}: {e}"),
    }
}

/// Every bit of the header and of the checksum, and of the first and last 4 KiB of the
/// payload (the small parts: RoPE frequencies, symbol tables, bounds, the first bases;
/// the last steps and the classes), and one bit of every second byte between (bit
/// `byte / 2 % 8`), to stay within a few seconds.
/// `every_bit_flip_is_an_error_exhaustive` (ignored) flips them all.
#[test]
fn bit_flips_are_errors() {
    let (_, file) = fixed_file();
    let n = file.len();
    let all_bits = |b: usize| (0..8).map(move |i| 8 * b + i);
    let bits: Vec<usize> = (0..n)
        .flat_map(|b| {
            let dense = b < HEADER_LEN + 4096 || b >= n - CHECKSUM_LEN - 4096;
            let v: Vec<usize> = if dense {
                all_bits(b).collect()
            } else if b % 2 == 0 {
                vec![8 * b + (b / 2) % 8]
            } else {
                vec![]
            };
            v
        })
        .collect();
    bits.par_iter().for_each(|&bit| flip_is_refused(&file, bit));
}

#[test]
#[ignore = "every bit of the file: 1.1 million parses, about 15 s on 2 cores"]
fn every_bit_flip_is_an_error_exhaustive() {
    let (_, file) = fixed_file();
    (0..file.len() * 8)
        .into_par_iter()
        .for_each(|bit| flip_is_refused(&file, bit));
}

/// A flip that keeps the checksum right (recomputed) reaches the field checks: a header
/// field (but the sink length) or a value out of range is still refused; a value within range parses to a
/// different calibration that encodes back to the same bytes.
#[test]
fn flips_behind_a_recomputed_checksum_are_refused_or_round_trip() {
    let (_, file) = fixed_file();
    let end = file.len() - CHECKSUM_LEN;
    let mut refused = 0;
    for bit in (0..end * 8).step_by(251).chain(0..HEADER_LEN * 8) {
        let mut f = file.clone();
        f[bit / 8] ^= 1 << (bit % 8);
        let sum = *blake3::hash(&f[..end]).as_bytes();
        f[end..].copy_from_slice(&sum);
        match Calibration::from_bytes(&f) {
            Ok(c) => {
                // In the header only n_sink (bytes 28..32, up to 2^20) is a free value.
                assert!(
                    bit >= HEADER_LEN * 8 || (28 * 8..28 * 8 + 20).contains(&bit),
                    "header bit {bit} flipped: parsed"
                );
                // The parsed values hold the flipped bit (a value, not a field: -0.0 and
                // 0.0 compare equal, so compare bytes).
                assert!(
                    c.to_bytes().unwrap() == f,
                    "bit {bit}: re-encodes differently"
                );
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::CorruptData, "bit {bit}: {e}");
                refused += 1;
            }
        }
    }
    assert!(refused >= HEADER_LEN * 8 - 20, "{refused}");
}
