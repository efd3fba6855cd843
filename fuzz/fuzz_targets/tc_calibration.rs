//! Fuzz the transform coder's calibration file reader (`KVCTCCAL` v1,
//! `kvc_transform_coder::Calibration::from_bytes`, what `Tiers::with_transform`, the C API
//! and the CLI load): any bytes give an error or a calibration that validates and encodes
//! back to exactly the input bytes; never a panic.
//!
//! Input: the file. Seeds: with `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call writes
//! `golden::fixed_calibration` files of small layouts (RoPE norm, neox and none; with and
//! without sink tokens) there; scripts/fuzz-all.sh does this.
#![no_main]

use kvc_transform_coder::golden::fixed_calibration;
use kvc_transform_coder::{Calibration, Rope, RopeKind};
use libfuzzer_sys::fuzz_target;

fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, &(l, h, d, sink)) in [(1, 1, 2, 0), (1, 1, 8, 2), (2, 1, 8, 0), (1, 2, 16, 4)]
        .iter()
        .enumerate()
    {
        let mut cal = fixed_calibration(l, h, d, sink);
        std::fs::write(dir.join(format!("sample-{i}-norm")), cal.to_bytes().unwrap()).unwrap();
        let theta = cal.rope.theta()[..d / 4].to_vec();
        cal.rope = Rope::from_theta(RopeKind::Neox, d, theta).unwrap();
        std::fs::write(dir.join(format!("sample-{i}-neox")), cal.to_bytes().unwrap()).unwrap();
        cal.rope = Rope::none(d);
        std::fs::write(dir.join(format!("sample-{i}-none")), cal.to_bytes().unwrap()).unwrap();
    }
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: std::sync::Once = std::sync::Once::new();
    SEEDS.call_once(|| {
        if let Some(dir) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&dir));
        }
    });
    if let Ok(cal) = Calibration::from_bytes(data) {
        cal.validate().expect("a parsed calibration validates");
        let back = cal.to_bytes().expect("a parsed calibration encodes");
        assert!(back == data, "re-encoded bytes differ from the file");
        assert_eq!(
            Calibration::fingerprint_of(data).unwrap(),
            *blake3::hash(&data[..data.len() - 32]).as_bytes()
        );
    }
});
