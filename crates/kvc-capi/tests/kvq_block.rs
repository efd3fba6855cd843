//! The handle-free block API (`kvc_kvq_block_*`, what ggml's type traits call) against
//! the handle API: the same bytes, the same values, the rotated basis consistent with
//! the plain one, poisoned rows instead of errors for non-finite input, and refusals of
//! bad arguments and of plans that are not block formats.

use std::ptr;

use kvc::codec::{KVC_TENSOR_K, KVC_TENSOR_V};
use kvc::kvq::{
    kvc_kvq_block_bits, kvc_kvq_dequantize_rows, kvc_kvq_free, kvc_kvq_new, kvc_kvq_new_from_plan,
    kvc_kvq_quantize_rows, kvc_kvq_row_bytes, kvc_kvq_shape, KvcKvq,
};
use kvc::kvq_block::{
    kvc_kvq_block_bytes, kvc_kvq_block_dequantize, kvc_kvq_block_dequantize_rotated,
    kvc_kvq_block_dot, kvc_kvq_block_quantize, kvc_kvq_block_rotate, kvc_kvq_block_unrotate,
};
use kvc::KvcStatus;

const OK: KvcStatus = KvcStatus::KVC_OK;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            // an outlier channel, as real K has
            if i % 64 == 5 {
                8.0 * u
            } else {
                u
            }
        })
        .collect()
}

fn handle(config: &str, head_dim: u32) -> *mut KvcKvq {
    let c = std::ffi::CString::new(config).unwrap();
    let mut h = ptr::null_mut();
    assert_eq!(
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_new(c.as_ptr(), head_dim, 2, 3, &mut h) },
        OK
    );
    h
}

#[test]
fn block_bytes_and_values_equal_the_handle_api() {
    for d in [64u32, 128, 256] {
        for bits in 2u32..=8 {
            let h = handle(&format!("k{bits}v{bits}:lm"), d);
            let mut rb = 0usize;
            assert_eq!(
                // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
                unsafe { kvc_kvq_row_bytes(h, 1, KVC_TENSOR_V, &mut rb) },
                OK
            );
            let mut bb = 0usize;
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            assert_eq!(unsafe { kvc_kvq_block_bytes(d, bits, &mut bb) }, OK);
            assert_eq!(bb, rb, "d {d} bits {bits}");
            let rows = 5usize;
            let x = values(rows * d as usize, u64::from(d * 31 + bits));
            let mut a = vec![0u8; rows * rb];
            let mut b = vec![0u8; rows * rb];
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            let st = unsafe {
                kvc_kvq_quantize_rows(
                    h,
                    1,
                    KVC_TENSOR_K,
                    x.as_ptr(),
                    rows,
                    a.as_mut_ptr(),
                    a.len(),
                )
            };
            assert_eq!(st, OK);
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            let st = unsafe {
                kvc_kvq_block_quantize(d, bits, x.as_ptr(), x.len(), b.as_mut_ptr(), b.len())
            };
            assert_eq!(st, OK);
            assert_eq!(
                a, b,
                "d {d} bits {bits}: block bytes differ from the handle's"
            );
            let mut ya = vec![0f32; x.len()];
            let mut yb = vec![0f32; x.len()];
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            let st = unsafe {
                kvc_kvq_dequantize_rows(
                    h,
                    1,
                    KVC_TENSOR_K,
                    a.as_ptr(),
                    a.len(),
                    ya.as_mut_ptr(),
                    rows,
                )
            };
            assert_eq!(st, OK);
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            let st = unsafe {
                kvc_kvq_block_dequantize(d, bits, b.as_ptr(), b.len(), yb.as_mut_ptr(), yb.len())
            };
            assert_eq!(st, OK);
            assert_eq!(ya, yb);
            // rotated rows, un-rotated, are the plain rows
            let mut yr = vec![0f32; x.len()];
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            let st = unsafe {
                kvc_kvq_block_dequantize_rotated(
                    d,
                    bits,
                    b.as_ptr(),
                    b.len(),
                    yr.as_mut_ptr(),
                    yr.len(),
                )
            };
            assert_eq!(st, OK);
            assert_ne!(yr, yb, "the rotated basis is another basis");
            assert_eq!(
                // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
                unsafe { kvc_kvq_block_unrotate(d, yr.as_mut_ptr(), yr.len()) },
                OK
            );
            for (p, q) in yr.iter().zip(&yb) {
                assert!((p - q).abs() <= 1e-5 * (1.0 + q.abs()), "{p} vs {q}");
            }
            // the dot of a rotated query with packed rows is the dot with the values
            let q = values(d as usize, 99);
            let mut qr = q.clone();
            assert_eq!(
                // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
                unsafe { kvc_kvq_block_rotate(d, qr.as_mut_ptr(), qr.len()) },
                OK
            );
            let rbz = rb;
            for r in 0..rows {
                let mut s = f32::NAN;
                // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
                let st = unsafe {
                    kvc_kvq_block_dot(
                        d,
                        bits,
                        b[r * rbz..].as_ptr(),
                        rbz,
                        qr.as_ptr(),
                        qr.len(),
                        &mut s,
                    )
                };
                assert_eq!(st, OK);
                let want: f64 = q
                    .iter()
                    .zip(&yb[r * d as usize..(r + 1) * d as usize])
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let mag: f64 = q
                    .iter()
                    .zip(&yb[r * d as usize..(r + 1) * d as usize])
                    .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                    .sum();
                assert!(
                    (f64::from(s) - want).abs() <= 1e-5 * (1.0 + mag),
                    "d {d} bits {bits} row {r}: {s} vs {want}"
                );
            }
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            unsafe { kvc_kvq_free(h) };
        }
    }
}

#[test]
fn non_finite_rows_are_poisoned_not_errors() {
    let (d, bits) = (64u32, 4u32);
    let mut x = values(3 * 64, 5);
    x[64 + 7] = f32::INFINITY; // row 1
    x[2 * 64 + 1] = f32::NAN; // row 2
    let mut bb = 0usize;
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    assert_eq!(unsafe { kvc_kvq_block_bytes(d, bits, &mut bb) }, OK);
    let mut p = vec![0xAAu8; 3 * bb];
    let st =
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_block_quantize(d, bits, x.as_ptr(), x.len(), p.as_mut_ptr(), p.len()) };
    assert_eq!(st, OK);
    let mut y = vec![0f32; x.len()];
    let st =
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_block_dequantize(d, bits, p.as_ptr(), p.len(), y.as_mut_ptr(), y.len()) };
    assert_eq!(st, OK);
    assert!(y[..64].iter().all(|v| v.is_finite()));
    assert!(
        y[64..].iter().all(|v| v.is_nan()),
        "poisoned rows read as NaN"
    );
    let mut q = values(64, 1);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    assert_eq!(unsafe { kvc_kvq_block_rotate(d, q.as_mut_ptr(), 64) }, OK);
    let mut s = 0f32;
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_dot(d, bits, p[bb..].as_ptr(), bb, q.as_ptr(), 64, &mut s) };
    assert_eq!(st, OK);
    assert!(s.is_nan());
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_dot(d, bits, p.as_ptr(), bb, q.as_ptr(), 64, &mut s) };
    assert_eq!(st, OK);
    assert!(s.is_finite());
}

#[test]
fn bad_arguments_are_refused() {
    let x = values(128, 3);
    let mut p = vec![0u8; 4 * 34];
    let mut n = 0usize;
    let inv = KvcStatus::KVC_INVALID_ARGUMENT;
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    assert_eq!(unsafe { kvc_kvq_block_bytes(96, 4, &mut n) }, inv);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    assert_eq!(unsafe { kvc_kvq_block_bytes(64, 1, &mut n) }, inv);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    assert_eq!(unsafe { kvc_kvq_block_bytes(64, 9, &mut n) }, inv);
    assert_eq!(
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_block_bytes(64, 4, ptr::null_mut()) },
        KvcStatus::KVC_NULL_ARGUMENT
    );
    // not a whole number of rows
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_quantize(64, 4, x.as_ptr(), 100, p.as_mut_ptr(), p.len()) };
    assert_eq!(st, inv);
    // a short destination
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_quantize(64, 4, x.as_ptr(), 128, p.as_mut_ptr(), 67) };
    assert_eq!(st, KvcStatus::KVC_BUFFER_TOO_SMALL);
    let mut y = vec![0f32; 128];
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_dequantize(64, 4, p.as_ptr(), 67, y.as_mut_ptr(), 128) };
    assert_eq!(st, KvcStatus::KVC_BUFFER_TOO_SMALL);
    let mut s = 0f32;
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_dot(64, 4, p.as_ptr(), 33, y.as_ptr(), 64, &mut s) };
    assert_eq!(st, KvcStatus::KVC_BUFFER_TOO_SMALL);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_rotate(64, y.as_mut_ptr(), 65) };
    assert_eq!(st, inv);
}

fn plan_handle(json: &str) -> *mut KvcKvq {
    let mut h = ptr::null_mut();
    assert_eq!(
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_new_from_plan(json.as_ptr().cast(), json.len(), &mut h) },
        OK
    );
    h
}

#[test]
fn plans_map_to_block_bits_or_are_refused() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/kvq-plans");
    let json = std::fs::read_to_string(format!("{dir}/smollm2-135m-r3.5-kw3.json")).unwrap();
    let plan = kvc_kvq::KvqPlan::from_json(&json).unwrap();
    let h = plan_handle(&json);
    let (mut l, mut k, mut d) = (0u32, 0u32, 0u32);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    assert_eq!(unsafe { kvc_kvq_shape(h, &mut l, &mut k, &mut d) }, OK);
    assert_eq!((l, k, d), (30, 3, 64));
    for (i, lb) in plan.layers.iter().enumerate() {
        let (mut kb, mut vb) = (0u32, 0u32);
        assert_eq!(
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            unsafe { kvc_kvq_block_bits(h, i as u32, KVC_TENSOR_K, &mut kb) },
            OK
        );
        assert_eq!(
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            unsafe { kvc_kvq_block_bits(h, i as u32, KVC_TENSOR_V, &mut vb) },
            OK
        );
        assert_eq!((kb, vb), (u32::from(lb.k_bits), u32::from(lb.v_bits)));
    }
    let mut b = 0u32;
    assert_eq!(
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_block_bits(h, 30, KVC_TENSOR_K, &mut b) },
        KvcStatus::KVC_INVALID_ARGUMENT
    );
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    unsafe { kvc_kvq_free(h) };
    // uniform codes, another seed: not block formats
    for (config, why) in [("k4v4:u32", "method"), ("k4v4:s7", "seed")] {
        let h = handle(config, 64);
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        let st = unsafe { kvc_kvq_block_bits(h, 0, KVC_TENSOR_K, &mut b) };
        assert_eq!(st, KvcStatus::KVC_UNSUPPORTED, "{why}");
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_free(h) };
    }
    // an f16 sink is a protection kvq cells apply beside block rows (ABI 0.14); a window of
    // f16 rows (recent tokens without recent_bits) is not a block format
    let sinks = json.replacen("\"sink_tokens\": 0", "\"sink_tokens\": 4", 1);
    assert_ne!(sinks, json, "the plan file spells sink_tokens as expected");
    let h = plan_handle(&sinks);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_bits(h, 0, KVC_TENSOR_K, &mut b) };
    assert_eq!(st, KvcStatus::KVC_OK);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    unsafe { kvc_kvq_free(h) };
    let recent = json.replacen("\"recent_tokens\": 0", "\"recent_tokens\": 64", 1);
    assert_ne!(
        recent, json,
        "the plan file spells recent_tokens as expected"
    );
    let h = plan_handle(&recent);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe { kvc_kvq_block_bits(h, 0, KVC_TENSOR_K, &mut b) };
    assert_eq!(st, KvcStatus::KVC_UNSUPPORTED);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    unsafe { kvc_kvq_free(h) };
}

#[test]
fn strided_rows_equal_the_row_by_row_calls() {
    use kvc::kvq_block::{kvc_kvq_block_accumulate_rows, kvc_kvq_block_dot_rows};
    let (d, bits, heads, rows) = (64u32, 3u32, 3usize, 7usize);
    let mut bb = 0usize;
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    assert_eq!(unsafe { kvc_kvq_block_bytes(d, bits, &mut bb) }, OK);
    // llama.cpp's layout: a token's row holds every KV head; head 1's rows are `stride` apart
    let stride = heads * bb;
    let mut x = values(rows * heads * d as usize, 17);
    x[(4 * heads + 1) * d as usize + 2] = f32::NAN; // token 4, head 1: poisoned
    let mut p = vec![0u8; rows * stride];
    let st =
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_block_quantize(d, bits, x.as_ptr(), x.len(), p.as_mut_ptr(), p.len()) };
    assert_eq!(st, OK);
    let mut q = values(d as usize, 3);
    assert_eq!(
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_block_rotate(d, q.as_mut_ptr(), q.len()) },
        OK
    );
    let head1 = &p[bb..];
    let mut scores = vec![0f32; rows];
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe {
        kvc_kvq_block_dot_rows(
            d,
            bits,
            head1.as_ptr(),
            stride,
            rows,
            q.as_ptr(),
            scores.as_mut_ptr(),
        )
    };
    assert_eq!(st, OK);
    let w: Vec<f32> = (0..rows)
        .map(|i| if i == 4 { 0.0 } else { 0.1 * (i as f32 + 1.0) })
        .collect();
    let mut acc = vec![0.5f32; d as usize];
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe {
        kvc_kvq_block_accumulate_rows(
            d,
            bits,
            head1.as_ptr(),
            stride,
            rows,
            w.as_ptr(),
            acc.as_mut_ptr(),
        )
    };
    assert_eq!(st, OK);
    let mut want = vec![0.5f64; d as usize];
    for t in 0..rows {
        let row = &head1[t * stride..t * stride + bb];
        let mut s = 0f32;
        let st =
            // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
            unsafe { kvc_kvq_block_dot(d, bits, row.as_ptr(), bb, q.as_ptr(), q.len(), &mut s) };
        assert_eq!(st, OK);
        if t == 4 {
            assert!(scores[t].is_nan() && s.is_nan());
            continue;
        }
        let mut v = vec![0f32; d as usize];
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        let st = unsafe {
            kvc_kvq_block_dequantize_rotated(d, bits, row.as_ptr(), bb, v.as_mut_ptr(), v.len())
        };
        assert_eq!(st, OK);
        // the tile runs the block kernels, `_dot` the per-row one: equal to rounding
        let norm = |x: &[f32]| x.iter().map(|a| a * a).sum::<f32>().sqrt();
        let bound = 1e-5 * norm(&q) * norm(&v);
        assert!(
            (scores[t] - s).abs() <= bound,
            "token {t}: {} vs {s}",
            scores[t]
        );
        for (a, b) in want.iter_mut().zip(&v) {
            *a += f64::from(w[t]) * f64::from(*b);
        }
    }
    for (a, b) in acc.iter().zip(&want) {
        assert!((f64::from(*a) - b).abs() < 1e-5, "{a} vs {b}");
    }
    // a poisoned row of non-zero weight makes the sum NaN
    let w1 = vec![1.0f32; rows];
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe {
        kvc_kvq_block_accumulate_rows(
            d,
            bits,
            head1.as_ptr(),
            stride,
            rows,
            w1.as_ptr(),
            acc.as_mut_ptr(),
        )
    };
    assert_eq!(st, OK);
    assert!(acc.iter().all(|v| v.is_nan()));
    // a stride shorter than a row, or a span past the buffer's end (checked by the caller's
    // length only through the pointer contract, so here: a zero stride), are refused
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe {
        kvc_kvq_block_dot_rows(
            d,
            bits,
            head1.as_ptr(),
            bb - 1,
            rows,
            q.as_ptr(),
            scores.as_mut_ptr(),
        )
    };
    assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
    // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
    let st = unsafe {
        kvc_kvq_block_dot_rows(
            d,
            bits,
            head1.as_ptr(),
            usize::MAX / 2,
            rows,
            q.as_ptr(),
            scores.as_mut_ptr(),
        )
    };
    assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
    // no rows: nothing read or written
    let st =
        // SAFETY: pointers to live locals of the lengths passed; handles live until freed.
        unsafe { kvc_kvq_block_dot_rows(d, bits, ptr::null(), 0, 0, q.as_ptr(), ptr::null_mut()) };
    assert_eq!(st, OK);
}

#[test]
fn multi_query_tiles_equal_one_call_per_query() {
    use kvc::kvq_block::{
        kvc_kvq_block_accumulate_rows, kvc_kvq_block_accumulate_rows_multi, kvc_kvq_block_dot_rows,
        kvc_kvq_block_dot_rows_multi,
    };
    let (heads, rows) = (3usize, 70usize);
    for d in [64u32, 128, 256] {
        for bits in 2u32..=8 {
            let du = d as usize;
            let mut bb = 0usize;
            // SAFETY: pointers to live locals of the lengths passed.
            assert_eq!(unsafe { kvc_kvq_block_bytes(d, bits, &mut bb) }, OK);
            let stride = heads * bb;
            let mut x = values(rows * heads * du, 17 + u64::from(bits));
            x[(9 * heads + 1) * du + 2] = f32::INFINITY; // token 9, head 1: poisoned
            let mut p = vec![0u8; rows * stride];
            // SAFETY: pointers to live locals of the lengths passed.
            let st = unsafe {
                kvc_kvq_block_quantize(d, bits, x.as_ptr(), x.len(), p.as_mut_ptr(), p.len())
            };
            assert_eq!(st, OK);
            let head1 = &p[bb..];
            for g in [1usize, 3, 9] {
                let mut q = values(g * du, 3 + g as u64);
                // SAFETY: pointers to live locals of the lengths passed.
                let st = unsafe { kvc_kvq_block_rotate(d, q.as_mut_ptr(), q.len()) };
                assert_eq!(st, OK);
                let mut w = values(g * rows, 5);
                for (i, wi) in w.iter_mut().enumerate() {
                    // masked cells; the poisoned row is weighted by query 0 only
                    if i % 7 == 0 || (i % rows == 9 && i / rows != 0) {
                        *wi = 0.0;
                    }
                }
                let mut scores = vec![0f32; g * rows];
                let mut acc = values(g * du, 8);
                // SAFETY: pointers to live locals of the lengths passed.
                let st = unsafe {
                    kvc_kvq_block_dot_rows_multi(
                        d,
                        bits,
                        head1.as_ptr(),
                        stride,
                        rows,
                        q.as_ptr(),
                        g,
                        scores.as_mut_ptr(),
                    )
                };
                assert_eq!(st, OK);
                // SAFETY: pointers to live locals of the lengths passed.
                let st = unsafe {
                    kvc_kvq_block_accumulate_rows_multi(
                        d,
                        bits,
                        head1.as_ptr(),
                        stride,
                        rows,
                        w.as_ptr(),
                        g,
                        acc.as_mut_ptr(),
                    )
                };
                assert_eq!(st, OK);
                let acc0 = values(g * du, 8);
                for gi in 0..g {
                    let mut s1 = vec![0f32; rows];
                    let mut a1 = acc0[gi * du..(gi + 1) * du].to_vec();
                    // SAFETY: pointers to live locals of the lengths passed.
                    let st = unsafe {
                        kvc_kvq_block_dot_rows(
                            d,
                            bits,
                            head1.as_ptr(),
                            stride,
                            rows,
                            q[gi * du..].as_ptr(),
                            s1.as_mut_ptr(),
                        )
                    };
                    assert_eq!(st, OK);
                    // SAFETY: pointers to live locals of the lengths passed.
                    let st = unsafe {
                        kvc_kvq_block_accumulate_rows(
                            d,
                            bits,
                            head1.as_ptr(),
                            stride,
                            rows,
                            w[gi * rows..].as_ptr(),
                            a1.as_mut_ptr(),
                        )
                    };
                    assert_eq!(st, OK);
                    let tag = format!("d{d} b{bits} g{g}/{gi}");
                    for (t, (a, b)) in scores[gi * rows..(gi + 1) * rows]
                        .iter()
                        .zip(&s1)
                        .enumerate()
                    {
                        assert_eq!(a.to_bits(), b.to_bits(), "{tag} t{t}: {a} {b}");
                        assert_eq!(a.is_nan(), t == 9, "{tag} t{t}");
                    }
                    for (a, b) in acc[gi * du..(gi + 1) * du].iter().zip(&a1) {
                        assert_eq!(a.to_bits(), b.to_bits(), "{tag}: {a} {b}");
                        assert_eq!(a.is_nan(), gi == 0, "{tag}");
                    }
                }
            }
        }
    }
    // refusals: overlapping output, sizes that overflow; no queries: nothing read or written
    let (d, bits) = (64u32, 4u32);
    let mut bb = 0usize;
    // SAFETY: pointers to live locals of the lengths passed.
    assert_eq!(unsafe { kvc_kvq_block_bytes(d, bits, &mut bb) }, OK);
    let p = vec![0u8; 4 * bb];
    let mut buf = vec![0f32; 2 * 64 + 8];
    // SAFETY: `buf` holds the 64 query floats and 8 scores; they overlap on purpose.
    let st = unsafe {
        kvc_kvq_block_dot_rows_multi(
            d,
            bits,
            p.as_ptr(),
            bb,
            4,
            buf.as_ptr(),
            2,
            buf.as_mut_ptr().add(60),
        )
    };
    assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
    // SAFETY: no query is read; the rows are live.
    let st = unsafe {
        kvc_kvq_block_dot_rows_multi(
            d,
            bits,
            p.as_ptr(),
            bb,
            4,
            ptr::null(),
            usize::MAX / 8,
            ptr::null_mut(),
        )
    };
    assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
    // SAFETY: with no queries nothing is read or written.
    let st = unsafe {
        kvc_kvq_block_accumulate_rows_multi(
            d,
            bits,
            p.as_ptr(),
            bb,
            4,
            ptr::null(),
            0,
            ptr::null_mut(),
        )
    };
    assert_eq!(st, OK);
    // SAFETY: NULL outputs with queries are refused before anything is written.
    let st = unsafe {
        kvc_kvq_block_accumulate_rows_multi(
            d,
            bits,
            p.as_ptr(),
            bb,
            4,
            buf.as_ptr(),
            1,
            ptr::null_mut(),
        )
    };
    assert_eq!(st, KvcStatus::KVC_NULL_ARGUMENT);
}
