//! Fuzz the handle-free kvq block tile kernels an attention loop calls on rows an engine's
//! cache holds (include/kvc.h, docs/c-api.md "kvq block notes"): `kvc_kvq_block_dot_rows`,
//! `_dot_rows_multi`, `_accumulate_rows`, `_accumulate_rows_multi` (the AVX2 / AVX-512 /
//! portable kernels of crates/kvc-kvq/src/multi.rs and simd/) and
//! `kvc_kvq_block_dequantize` / `_dequantize_rotated`.
//!
//! Input: byte 0 picks head_dim (64, 128, 256) and bits (2..=8); byte 1 the number of
//! queries G (1, 2, 3, 4, 5, 8, 9, 12: the block kernels take 8 queries per pass) and the
//! stride's padding past a row (0..=15 bytes); byte 2 the number of rows n (1..=64); byte 3
//! a wrong-argument case; then min(G, 4) * head_dim query bytes (query g >= 4 reuses query
//! g % 4's bytes, changed) and G * n weight bytes (mapped to finite values: queries in
//! [-4, 4), weights in (0, 1] or, for one byte in eight, 0 or -0: a masked cell), then the packed
//! rows (arbitrary bytes, so a row's f16 scale may be NaN or infinite: a poisoned row;
//! missing bytes are zeros).
//!
//! Checked, for any bytes (the contract of the header):
//! - `_multi` with G queries equals G one-query calls bit for bit (NaN matches NaN);
//! - a poisoned row scores NaN for every query and every other row a finite score within
//!   `1e-5 * |q| * |v|` of `q . v`, `v` the row from `_dequantize_rotated` (the bound of
//!   crates/kvc-capi/tests/kvq_block.rs);
//! - a query's accumulated sum is NaN exactly when a poisoned row has a non-zero weight,
//!   else finite and within `1e-5 * (|acc0| + sum |w v|)` per element of the f64 sum;
//! - `_dequantize` gives NaN for exactly the poisoned rows, finite values elsewhere;
//! - wrong arguments (unsupported head_dim or bits, a stride shorter than a row, outputs
//!   overlapping the rows, a short `src`) give `KVC_INVALID_ARGUMENT` /
//!   `KVC_BUFFER_TOO_SMALL` and write nothing; no rows or no queries is `KVC_OK` and writes
//!   nothing.
//!
//! - `kvc_kvq_block_quantize` of the row bytes read as f32 (the whole f32 range, past f16
//!   and past the point where a square overflows): a value not finite or beyond 2^32 gives
//!   a poisoned row (NaNs when decoded), never a row of scale 0.
//!
//! Seeds: with `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call writes there, for every
//! head_dim and bits, inputs whose rows are rows of the embedded sample (data/sample, real
//! llama.cpp K and V) quantized with `kvc_kvq_block_quantize`; scripts/fuzz-all.sh does
//! this.
#![no_main]

use std::sync::OnceLock;

use kvc::kvq_block::{
    kvc_kvq_block_accumulate_rows, kvc_kvq_block_accumulate_rows_multi, kvc_kvq_block_bytes,
    kvc_kvq_block_dequantize, kvc_kvq_block_dequantize_rotated, kvc_kvq_block_dot_rows,
    kvc_kvq_block_dot_rows_multi, kvc_kvq_block_quantize,
};
use kvc::KvcStatus;
use libfuzzer_sys::fuzz_target;

const OK: KvcStatus = KvcStatus::KVC_OK;
const INVALID: KvcStatus = KvcStatus::KVC_INVALID_ARGUMENT;
const DIMS: [u32; 3] = [64, 128, 256];
/// G per value of byte 1's low 3 bits.
const GS: [usize; 8] = [1, 2, 3, 4, 5, 8, 9, 12];
const MAX_ROWS: usize = 64;
/// Marks an output float nothing may write.
const UNTOUCHED: u32 = 0x7fc0_dead;

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

fn row_bytes(d: u32, bits: u32) -> usize {
    let mut rb = 0usize;
    // SAFETY: `rb` is writable.
    assert_eq!(unsafe { kvc_kvq_block_bytes(d, bits, &mut rb) }, OK);
    assert_eq!(rb, 2 + d as usize * bits as usize / 8, "block bytes");
    rb
}

fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (di, &d) in DIMS.iter().enumerate() {
        for bits in 2u32..=8 {
            let rb = row_bytes(d, bits);
            // (tensor, index of G in GS, rows, stride padding)
            for (ti, (src, gi, n, pad)) in [(SAMPLE_K, 6u8, 16usize, 0u8), (SAMPLE_V, 1, 9, 5)]
                .into_iter()
                .enumerate()
            {
                // Tokens 100.. of layer 1 (head rows are contiguous, so a wider row spans
                // heads of one or two tokens).
                let start = (512 + 100) * 3 * 64;
                let x: Vec<f32> = (0..n * d as usize)
                    .map(|j| {
                        let o = 2 * (start + j);
                        f16_to_f32(u16::from_le_bytes([src[o], src[o + 1]]))
                    })
                    .collect();
                let mut packed = vec![0u8; n * rb];
                // SAFETY: `x` holds n * d floats; `packed` is writable for its length and
                // disjoint from `x`.
                let st = unsafe {
                    kvc_kvq_block_quantize(
                        d,
                        bits,
                        x.as_ptr(),
                        x.len(),
                        packed.as_mut_ptr(),
                        packed.len(),
                    )
                };
                assert_eq!(st, OK);
                let sel = (di * 7 + (bits - 2) as usize) as u8;
                // Byte 3 (the wrong-argument case) runs through the cases over the seeds.
                let g = GS[gi as usize];
                let mut out = vec![sel, gi | (pad << 3), (n - 1) as u8, sel];
                // Queries: bytes 0..255 map to [-4, 4); a few values from the sample's Q-like
                // range, weights spread over [0, 1] with some zeros.
                out.extend((0..g.min(4) * d as usize).map(|j| (j * 37 % 251) as u8));
                out.extend((0..g * n).map(|j| (j * 53 % 256) as u8));
                for r in 0..n {
                    out.extend_from_slice(&packed[r * rb..(r + 1) * rb]);
                    out.extend(std::iter::repeat_n(0xa5u8, pad as usize));
                }
                std::fs::write(dir.join(format!("sample-{sel:02x}-{ti}")), out).unwrap();
            }
        }
    }
}

/// NaN matches NaN; every other value must be the same bits.
fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn untouched(x: &[f32]) -> bool {
    x.iter().all(|v| v.to_bits() == UNTOUCHED)
}

fn scale_finite(row: &[u8]) -> bool {
    u16::from_le_bytes([row[0], row[1]]) & 0x7c00 != 0x7c00
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: OnceLock<()> = OnceLock::new();
    SEEDS.get_or_init(|| {
        if let Some(d) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&d));
        }
    });
    if data.len() < 4 {
        return;
    }
    let (head, rest) = data.split_at(4);
    let sel = head[0] as usize % (DIMS.len() * 7);
    let d = DIMS[sel / 7];
    let du = d as usize;
    let bits = 2 + (sel % 7) as u32;
    let g = GS[(head[1] & 7) as usize];
    let pad = (head[1] >> 3) as usize & 15;
    let n = 1 + head[2] as usize % MAX_ROWS;
    let case = head[3];
    let rb = row_bytes(d, bits);
    let stride = rb + pad;

    // Queries in [-4, 4), weights in (0, 1] (0 or -0 for bytes below 32), acc from the query
    // bytes.
    let take = |k: usize, off: usize| -> Vec<u8> {
        (0..k)
            .map(|i| rest.get(off + i).copied().unwrap_or(0))
            .collect()
    };
    let ql = g.min(4) * du;
    let qb: Vec<u8> = {
        let b = take(ql, 0);
        (0..g * du)
            .map(|j| b[j % ql] ^ ((j / ql) as u8).wrapping_mul(0x5b))
            .collect()
    };
    let wb = take(g * n, ql);
    let q: Vec<f32> = qb.iter().map(|&b| (b as f32 - 128.0) / 32.0).collect();
    let w: Vec<f32> = wb
        .iter()
        .map(|&b| match b {
            0..16 => 0.0,
            16..32 => -0.0,
            _ => (b - 31) as f32 / 224.0,
        })
        .collect();
    let acc0: Vec<f32> = qb.iter().map(|&b| (b as f32 - 100.0) / 8.0).collect();
    let rows_at = (ql + g * n).min(rest.len());
    let body = &rest[rows_at..];
    // The rows: the remaining bytes as given, padded with zeros to n rows a stride apart
    // (the span the contract says is read: (n - 1) * stride + row bytes).
    let span = (n - 1) * stride + rb;
    let mut packed = body[..body.len().min(span)].to_vec();
    packed.resize(span, 0);
    let row = |i: usize| &packed[i * stride..i * stride + rb];
    let poisoned: Vec<bool> = (0..n).map(|i| !scale_finite(row(i))).collect();

    // Wrong arguments first: each must give its status and write nothing.
    let mut s = vec![f32::from_bits(UNTOUCHED); g * n];
    let mut a = vec![f32::from_bits(UNTOUCHED); g * du];
    let (bad_d, bad_bits, bad_stride) = match case % 8 {
        0 => (d + 1 + (case as u32 >> 3), bits, stride),
        1 => (d, [0, 1, 9, 16, 255][(case as usize >> 3) % 5], stride),
        2 => (d, bits, (case as usize >> 3) % rb),
        _ => (0, 0, 0),
    };
    if bad_d != 0 {
        // SAFETY: every pointer is valid for the lengths the (valid) arguments would read
        // and write; the wrong one is refused before any access.
        let st = unsafe {
            kvc_kvq_block_dot_rows_multi(
                bad_d,
                bad_bits,
                packed.as_ptr(),
                bad_stride,
                n,
                q.as_ptr(),
                g,
                s.as_mut_ptr(),
            )
        };
        assert_eq!(st, INVALID, "d {bad_d} bits {bad_bits} stride {bad_stride}");
        // SAFETY: as above.
        let st = unsafe {
            kvc_kvq_block_accumulate_rows(
                bad_d,
                bad_bits,
                packed.as_ptr(),
                bad_stride,
                n,
                w.as_ptr(),
                a.as_mut_ptr(),
            )
        };
        assert_eq!(st, INVALID);
        assert!(untouched(&s) && untouched(&a));
    }
    match case % 8 {
        3 => {
            // Scores overlapping the rows (the rows' bytes reused as the output).
            let mut buf = vec![0u32; span.div_ceil(4) + g * n];
            let p = buf.as_mut_ptr().cast::<u8>();
            // SAFETY: `p` is readable for `span` bytes and writable for g * n floats.
            let st = unsafe {
                std::ptr::copy_nonoverlapping(packed.as_ptr(), p, span);
                kvc_kvq_block_dot_rows_multi(d, bits, p, stride, n, q.as_ptr(), g, p.cast())
            };
            assert_eq!(st, INVALID);
        }
        4 => {
            // A src one byte short of the rows a dequantize names.
            let mut out = vec![f32::from_bits(UNTOUCHED); du];
            // SAFETY: `packed` is readable for rb - 1 bytes; `out` writable for d floats.
            let st = unsafe {
                kvc_kvq_block_dequantize(d, bits, packed.as_ptr(), rb - 1, out.as_mut_ptr(), du)
            };
            assert_eq!(st, KvcStatus::KVC_BUFFER_TOO_SMALL);
            assert!(untouched(&out));
        }
        5 => {
            // No queries, or no rows: OK, nothing read or written.
            // SAFETY: nothing is read or written with no queries / rows.
            let st = unsafe {
                kvc_kvq_block_dot_rows_multi(
                    d,
                    bits,
                    packed.as_ptr(),
                    stride,
                    n,
                    q.as_ptr(),
                    0,
                    s.as_mut_ptr(),
                )
            };
            assert_eq!(st, OK);
            // SAFETY: as above.
            let st = unsafe {
                kvc_kvq_block_accumulate_rows_multi(
                    d,
                    bits,
                    packed.as_ptr(),
                    0,
                    0,
                    w.as_ptr(),
                    g,
                    a.as_mut_ptr(),
                )
            };
            assert_eq!(st, OK);
            assert!(untouched(&s) && untouched(&a));
        }
        _ => {}
    }

    // The rows in the rotated basis, and dequantized: NaN exactly for the poisoned rows.
    let mut v = vec![0f32; n * du];
    let mut x = vec![0f32; n * du];
    for i in 0..n {
        for (rotated, out) in [(true, &mut v), (false, &mut x)] {
            let o = &mut out[i * du..(i + 1) * du];
            // SAFETY: `row(i)` is readable for rb bytes; `o` writable for d floats.
            let st = unsafe {
                if rotated {
                    kvc_kvq_block_dequantize_rotated(
                        d,
                        bits,
                        row(i).as_ptr(),
                        rb,
                        o.as_mut_ptr(),
                        du,
                    )
                } else {
                    kvc_kvq_block_dequantize(d, bits, row(i).as_ptr(), rb, o.as_mut_ptr(), du)
                }
            };
            assert_eq!(st, OK);
            if poisoned[i] {
                assert!(o.iter().all(|y| y.is_nan()), "row {i} poisoned");
            } else {
                assert!(o.iter().all(|y| y.is_finite()), "row {i}");
            }
        }
    }

    // Scores: G queries at once, then one at a time.
    let mut sm = vec![f32::from_bits(UNTOUCHED); g * n];
    // SAFETY: `packed` readable for (n - 1) * stride + rb bytes; `q` holds g * d floats;
    // `sm` writable for g * n floats and disjoint from both.
    let st = unsafe {
        kvc_kvq_block_dot_rows_multi(
            d,
            bits,
            packed.as_ptr(),
            stride,
            n,
            q.as_ptr(),
            g,
            sm.as_mut_ptr(),
        )
    };
    assert_eq!(st, OK);
    for gi in 0..g {
        let qg = &q[gi * du..(gi + 1) * du];
        let mut s1 = vec![f32::from_bits(UNTOUCHED); n];
        // SAFETY: as above with one query.
        let st = unsafe {
            kvc_kvq_block_dot_rows(
                d,
                bits,
                packed.as_ptr(),
                stride,
                n,
                qg.as_ptr(),
                s1.as_mut_ptr(),
            )
        };
        assert_eq!(st, OK);
        let qn = qg
            .iter()
            .map(|&a| f64::from(a) * f64::from(a))
            .sum::<f64>()
            .sqrt();
        for i in 0..n {
            let got = sm[gi * n + i];
            assert!(
                same(got, s1[i]),
                "query {gi} row {i}: multi {got} vs one {}",
                s1[i]
            );
            if poisoned[i] {
                assert!(
                    got.is_nan(),
                    "query {gi} row {i}: poisoned row scored {got}"
                );
                continue;
            }
            assert!(got.is_finite(), "query {gi} row {i}: {got}");
            let vi = &v[i * du..(i + 1) * du];
            let want: f64 = qg
                .iter()
                .zip(vi)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let vn = vi
                .iter()
                .map(|&a| f64::from(a) * f64::from(a))
                .sum::<f64>()
                .sqrt();
            assert!(
                (f64::from(got) - want).abs() <= 1e-5 * qn * vn,
                "d {d} bits {bits} query {gi} row {i}: {got} vs {want}"
            );
        }
    }

    // Weighted sums: G queries at once, then one at a time.
    let mut am = acc0.clone();
    // SAFETY: `w` holds g * n floats; `am` g * d floats, disjoint from the inputs.
    let st = unsafe {
        kvc_kvq_block_accumulate_rows_multi(
            d,
            bits,
            packed.as_ptr(),
            stride,
            n,
            w.as_ptr(),
            g,
            am.as_mut_ptr(),
        )
    };
    assert_eq!(st, OK);
    for gi in 0..g {
        let wg = &w[gi * n..(gi + 1) * n];
        let mut a1 = acc0[gi * du..(gi + 1) * du].to_vec();
        // SAFETY: as above with one query.
        let st = unsafe {
            kvc_kvq_block_accumulate_rows(
                d,
                bits,
                packed.as_ptr(),
                stride,
                n,
                wg.as_ptr(),
                a1.as_mut_ptr(),
            )
        };
        assert_eq!(st, OK);
        let nan = (0..n).any(|i| poisoned[i] && wg[i] != 0.0);
        for j in 0..du {
            let got = am[gi * du + j];
            assert!(
                same(got, a1[j]),
                "query {gi} value {j}: multi {got} vs one {}",
                a1[j]
            );
            if nan {
                assert!(
                    got.is_nan(),
                    "query {gi} value {j}: {got} with a poisoned row weighted"
                );
                continue;
            }
            assert!(got.is_finite(), "query {gi} value {j}: {got}");
            let a0 = f64::from(acc0[gi * du + j]);
            let (mut want, mut mag) = (a0, a0.abs());
            for i in (0..n).filter(|&i| wg[i] != 0.0) {
                let t = f64::from(wg[i]) * f64::from(v[i * du + j]);
                want += t;
                mag += t.abs();
            }
            assert!(
                (f64::from(got) - want).abs() <= 1e-5 * mag,
                "d {d} bits {bits} query {gi} value {j}: {got} vs {want}"
            );
        }
    }
    check_block_quantize(d, bits, body);
});

/// `kvc_kvq_block_quantize` of the row bytes read as f32 (any pattern: the whole f32
/// range, past f16 and past the point where a square overflows f32): a row holding a
/// value that is not finite or beyond 2^32 is written poisoned and decodes to NaNs; any
/// other row is poisoned only when its f16 scale would overflow (a value above 1000), and
/// otherwise decodes to finite values, never to a zero row when it is not tiny.
fn check_block_quantize(d: u32, bits: u32, bytes: &[u8]) {
    let du = d as usize;
    let x: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n = (x.len() / du).min(4);
    if n == 0 {
        return;
    }
    let x = &x[..n * du];
    let rb = row_bytes(d, bits);
    let mut packed = vec![0u8; n * rb];
    // SAFETY: `x` readable for n * d floats, `packed` writable for n rows; disjoint.
    let st = unsafe {
        kvc_kvq_block_quantize(
            d,
            bits,
            x.as_ptr(),
            x.len(),
            packed.as_mut_ptr(),
            packed.len(),
        )
    };
    assert_eq!(st, OK);
    let mut y = vec![0f32; n * du];
    // SAFETY: `packed` readable for its length, `y` writable for n * d floats.
    let st = unsafe {
        kvc_kvq_block_dequantize(
            d,
            bits,
            packed.as_ptr(),
            packed.len(),
            y.as_mut_ptr(),
            y.len(),
        )
    };
    assert_eq!(st, OK);
    for ((xr, yr), row) in x
        .chunks_exact(du)
        .zip(y.chunks_exact(du))
        .zip(packed.chunks_exact(rb))
    {
        let out_of_range = xr.iter().any(|v| v.is_nan() || v.abs() > 4_294_967_296.0);
        if out_of_range {
            assert!(
                !scale_finite(row),
                "a value past 2^32 or not finite was coded"
            );
        }
        if !scale_finite(row) {
            assert!(yr.iter().all(|v| v.is_nan()));
            assert!(out_of_range || xr.iter().any(|v| v.abs() > 1000.0));
        } else {
            assert!(yr.iter().all(|v| v.is_finite()));
            if xr.iter().any(|v| v.abs() >= 1e-3) {
                assert!(
                    yr.iter().any(|v| *v != 0.0),
                    "a row that is not zero decoded to zeros"
                );
            }
        }
    }
}
