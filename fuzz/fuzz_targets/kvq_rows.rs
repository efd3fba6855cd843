//! Fuzz the kvq packed-row reader (docs/formats/kvq.md: f16 scales, then a bit stream of
//! codes) through the C entry point an engine calls, `kvc_kvq_dequantize_rows`, for a few
//! fixed configurations. The first input byte picks the configuration, head_dim and
//! tensor; the rest are the packed rows. Any bytes give `KVC_OK` with finite values, or
//! `KVC_CORRUPT_DATA` exactly when some row's scale is not finite — never a panic or an
//! out-of-bounds access. The centered reader (`kvc_kvq_dequantize_rows_centered`, ABI 0.11)
//! with a zero center must agree with it bit for bit and status for status. On an error
//! the output is untouched (all or nothing).
//!
//! The same bytes, read as little-endian f32 rows over the whole f32 range (past f16, and
//! past the point where a square overflows f32), are quantized with
//! `kvc_kvq_quantize_rows`: a value that is not finite or beyond 2^32 is
//! `KVC_INVALID_ARGUMENT` with `dst` untouched; otherwise either `KVC_OK`, and every row
//! that is not tiny decodes to a row that is not zero (never the scale-0 row of an
//! overflowed norm), or `KVC_INVALID_ARGUMENT` for a row too large for an f16 scale, with
//! `dst` untouched.
//!
//! Seeds: with `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call writes there, for every
//! configuration and tensor, 8 rows of the embedded sample (data/sample, real llama.cpp
//! K and V) quantized with `kvc_kvq_quantize_rows`; scripts/fuzz-all.sh does this.
#![no_main]

use std::ffi::CStr;
use std::ptr;
use std::sync::OnceLock;

use kvc::codec::{KVC_TENSOR_K, KVC_TENSOR_V};
use kvc::kvq::{
    kvc_kvq_dequantize_rows, kvc_kvq_new, kvc_kvq_quantize_rows, kvc_kvq_row_bytes, KvcKvq,
};
use kvc::kvq_center::kvc_kvq_dequantize_rows_centered;
use kvc::KvcStatus;
use libfuzzer_sys::fuzz_target;

/// Config string, K bits, V bits, values per scale (0: one scale per row, `lm`).
const CONFIGS: [(&CStr, usize, usize, usize); 4] = [
    (c"k4v4", 4, 4, 0),
    (c"k2v2:u32", 2, 2, 32),
    (c"k8v4", 8, 4, 0),
    (c"k3v3", 3, 3, 0),
];
const DIMS: [u32; 2] = [64, 128];
/// Rows decoded at most per input.
const MAX_ROWS: usize = 64;

struct Handles(Vec<*mut KvcKvq>);
// SAFETY: kvq handles are read-only after creation and may be used from any thread
// (include/kvc.h); these are never freed.
unsafe impl Send for Handles {}
// SAFETY: as above.
unsafe impl Sync for Handles {}

fn handles() -> &'static Handles {
    static H: OnceLock<Handles> = OnceLock::new();
    H.get_or_init(|| {
        let mut v = Vec::new();
        for (c, ..) in CONFIGS {
            for d in DIMS {
                let mut h = ptr::null_mut();
                // SAFETY: `c` is NUL-terminated; `h` is writable.
                let st = unsafe { kvc_kvq_new(c.as_ptr(), d, 1, 1, &mut h) };
                assert_eq!(st, KvcStatus::KVC_OK, "{c:?} at {d}");
                v.push(h);
            }
        }
        Handles(v)
    })
}

/// The embedded sample: `[4][512][3][64]` f16.
const SAMPLE_K: &[u8] = include_bytes!("../../data/sample/textA.K.f16.bin");
const SAMPLE_V: &[u8] = include_bytes!("../../data/sample/textA.V.f16.bin");

fn f16_to_f32(h: u16) -> f32 {
    let (sign, exp, man) = (
        (h >> 15) as u32,
        ((h >> 10) & 0x1f) as i32,
        (h & 0x3ff) as u32,
    );
    let mag = match exp {
        0 => man as f32 * 2f32.powi(-24),
        0x1f => f32::INFINITY,
        e => (1.0 + man as f32 / 1024.0) * 2f32.powi(e - 15),
    };
    if sign == 1 {
        -mag
    } else {
        mag
    }
}

fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    const ROWS: usize = 8;
    for (i, &kvq) in handles().0.iter().enumerate() {
        let d = DIMS[i % DIMS.len()] as usize;
        for (sel, tensor, src) in [
            (i as u8, KVC_TENSOR_K, SAMPLE_K),
            (0x80 | i as u8, KVC_TENSOR_V, SAMPLE_V),
        ] {
            // Tokens 100.. of layer 1 (head rows are contiguous, so a 128-value row is two
            // heads of one token, or the last head of one and the first of the next).
            let start = (512 + 100) * 3 * 64;
            let x: Vec<f32> = (0..ROWS * d)
                .map(|j| {
                    let o = 2 * (start + j);
                    f16_to_f32(u16::from_le_bytes([src[o], src[o + 1]]))
                })
                .collect();
            let mut rb = 0usize;
            // SAFETY: `kvq` is live; `rb` is writable.
            let st = unsafe { kvc_kvq_row_bytes(kvq, 0, tensor, &mut rb) };
            assert_eq!(st, KvcStatus::KVC_OK);
            let mut out = vec![sel; 1 + ROWS * rb];
            // SAFETY: `x` holds ROWS * head_dim floats; `out[1..]` is writable for its
            // length and disjoint from `x`.
            let st = unsafe {
                kvc_kvq_quantize_rows(
                    kvq,
                    0,
                    tensor,
                    x.as_ptr(),
                    ROWS,
                    out[1..].as_mut_ptr(),
                    ROWS * rb,
                )
            };
            assert_eq!(st, KvcStatus::KVC_OK);
            std::fs::write(dir.join(format!("sample-{sel:02x}")), out).unwrap();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: OnceLock<()> = OnceLock::new();
    SEEDS.get_or_init(|| {
        if let Some(d) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&d));
        }
    });
    let Some((&sel, rows)) = data.split_first() else {
        return;
    };
    let hs = &handles().0;
    let which = sel as usize % hs.len();
    let kvq = hs[which];
    let d = DIMS[which % DIMS.len()] as usize;
    let (_, kb, vb, group) = CONFIGS[which / DIMS.len()];
    let (tensor, bits) = if sel & 0x80 != 0 {
        (KVC_TENSOR_V, vb)
    } else {
        (KVC_TENSOR_K, kb)
    };
    let ns = if group == 0 { 1 } else { d / group };
    let mut rb = 0usize;
    // SAFETY: `kvq` is live; `rb` is writable.
    assert_eq!(
        unsafe { kvc_kvq_row_bytes(kvq, 0, tensor, &mut rb) },
        KvcStatus::KVC_OK
    );
    assert_eq!(rb, 2 * ns + d * bits / 8, "row_bytes of the format");
    let n = (rows.len() / rb).min(MAX_ROWS);
    // One row more than the bytes hold must be refused, not read past.
    let mut out = vec![f32::NAN; (n + 1) * d];
    // SAFETY: `rows` is readable for its length; `out` holds (n + 1) * d floats.
    let st = unsafe {
        kvc_kvq_dequantize_rows(
            kvq,
            0,
            tensor,
            rows.as_ptr(),
            rows.len(),
            out.as_mut_ptr(),
            n + 1,
        )
    };
    if rows.len() < (n + 1) * rb {
        assert_eq!(st, KvcStatus::KVC_BUFFER_TOO_SMALL);
    }
    out.fill(f32::NAN);
    // SAFETY: as above; n rows fit in `rows`.
    let st = unsafe {
        kvc_kvq_dequantize_rows(
            kvq,
            0,
            tensor,
            rows.as_ptr(),
            rows.len(),
            out.as_mut_ptr(),
            n,
        )
    };
    // Which rows have a non-finite f16 scale (exponent bits all ones); scales lead a row.
    let bad = (0..n).any(|r| {
        let row = &rows[r * rb..(r + 1) * rb];
        (0..ns).any(|s| {
            let h = u16::from_le_bytes([row[2 * s], row[2 * s + 1]]);
            h & 0x7c00 == 0x7c00
        })
    });
    if bad {
        assert_eq!(st, KvcStatus::KVC_CORRUPT_DATA);
        assert!(
            out.iter().all(|x| x.is_nan()),
            "dequantize wrote on failure"
        );
    } else {
        assert_eq!(st, KvcStatus::KVC_OK);
        assert!(out[..n * d].iter().all(|x| x.is_finite()));
    }
    // The centered reader with a zero center (two KV heads of it): the same status and,
    // on success, the same values (x + 0 == x for finite x).
    let zero = vec![0f32; 2 * d];
    let mut centered = vec![f32::NAN; n * d];
    // SAFETY: as above; `zero` holds 2 * d floats, `centered` n * d.
    let sc = unsafe {
        kvc_kvq_dequantize_rows_centered(
            kvq,
            0,
            tensor,
            rows.as_ptr(),
            rows.len(),
            zero.as_ptr(),
            zero.len(),
            centered.as_mut_ptr(),
            n,
        )
    };
    assert_eq!(sc, st);
    if st == KvcStatus::KVC_OK {
        assert!(out[..n * d]
            .iter()
            .zip(&centered)
            .all(|(a, b)| a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0)));
    }
    check_quantize(kvq, tensor, d, rb, rows);
});

/// Quantizes the bytes read as f32 rows (any bit pattern: the whole f32 range).
fn check_quantize(kvq: *mut KvcKvq, tensor: u32, d: usize, rb: usize, bytes: &[u8]) {
    let x: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n = (x.len() / d).min(MAX_ROWS);
    if n == 0 {
        return;
    }
    let x = &x[..n * d];
    let mut dst = vec![0xa5u8; n * rb];
    // SAFETY: `x` readable for n * d floats, `dst` writable for n * rb bytes; disjoint.
    let st = unsafe {
        kvc_kvq_quantize_rows(kvq, 0, tensor, x.as_ptr(), n, dst.as_mut_ptr(), dst.len())
    };
    let out_of_range = x.iter().any(|v| v.is_nan() || v.abs() > 4_294_967_296.0);
    if st != KvcStatus::KVC_OK {
        assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
        assert!(dst.iter().all(|&b| b == 0xa5), "quantize wrote on failure");
        // Finite in-range rows are refused only when a scale cannot fit in f16.
        assert!(out_of_range || x.iter().any(|v| v.abs() > 1000.0));
        return;
    }
    assert!(!out_of_range, "a value past 2^32 or not finite was coded");
    let mut y = vec![0f32; n * d];
    // SAFETY: `dst` readable for its length; `y` holds n * d floats.
    let st = unsafe {
        kvc_kvq_dequantize_rows(kvq, 0, tensor, dst.as_ptr(), dst.len(), y.as_mut_ptr(), n)
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact(d)) {
        if xr.iter().any(|v| v.abs() >= 1e-3) {
            assert!(
                yr.iter().any(|v| *v != 0.0),
                "a row that is not zero decoded to zeros"
            );
        }
    }
}
