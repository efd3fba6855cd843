//! Fuzz the kvq plan reader (`kvc-kvq-plan` JSON, versions 1 and 2, docs/formats/kvq.md)
//! through the C entry point an engine calls, `kvc_kvq_new_from_plan`. Any bytes give a
//! typed status, never a panic (libFuzzer's panic hook aborts even inside kvc's panic
//! boundary), an out-of-bounds access or an allocation the plan's length does not
//! justify. A plan that loads is then used as an engine would: `kvc_kvq_row_bytes` of K
//! and V in every layer (both present for the same layers, within the format's bounds),
//! and a quantize / dequantize of a few rows in the first and last layers, which must
//! succeed and give finite values.
#![no_main]

use std::ptr;

use kvc::codec::{KVC_TENSOR_K, KVC_TENSOR_V};
use kvc::kvq::{
    kvc_kvq_dequantize_rows, kvc_kvq_free, kvc_kvq_new_from_plan, kvc_kvq_quantize_rows,
    kvc_kvq_row_bytes,
};
use kvc::KvcStatus;
use libfuzzer_sys::fuzz_target;

/// The largest head_dim kvq accepts (64, 128 or 256).
const MAX_D: usize = 256;
/// The largest row: one f16 scale per 8 values plus 8 bits per value.
const MAX_ROW: usize = 2 * MAX_D / 8 + MAX_D;
/// Rows quantized per tested layer.
const ROWS: usize = 3;

fuzz_target!(|data: &[u8]| {
    let mut kvq = ptr::null_mut();
    // SAFETY: `data` is readable for its length; `kvq` is writable.
    let st = unsafe { kvc_kvq_new_from_plan(data.as_ptr().cast(), data.len(), &mut kvq) };
    assert_ne!(st, KvcStatus::KVC_PANIC);
    if st != KvcStatus::KVC_OK {
        assert!(kvq.is_null(), "a failed load must not store a handle");
        return;
    }
    // Every layer's row sizes; a layer of a plan takes at least a few bytes of JSON, so
    // the count is bounded by the input length.
    let mut rows = Vec::new();
    loop {
        let layer = rows.len() as u32;
        let (mut kb, mut vb) = (0usize, 0usize);
        // SAFETY: `kvq` is live; the outputs are writable.
        let (sk, sv) = unsafe {
            (
                kvc_kvq_row_bytes(kvq, layer, KVC_TENSOR_K, &mut kb),
                kvc_kvq_row_bytes(kvq, layer, KVC_TENSOR_V, &mut vb),
            )
        };
        assert_eq!(
            sk, sv,
            "K and V of layer {layer} disagree on whether it exists"
        );
        if sk != KvcStatus::KVC_OK {
            assert_eq!(sk, KvcStatus::KVC_INVALID_ARGUMENT);
            break;
        }
        for b in [kb, vb] {
            assert!(
                (18..=MAX_ROW).contains(&b),
                "layer {layer}: row of {b} bytes"
            );
        }
        rows.push((kb, vb));
        assert!(rows.len() <= data.len(), "more layers than plan bytes");
    }
    assert!(!rows.is_empty(), "a plan that loads has a layer");
    // A bad tensor id is an error, not a panic.
    let mut b = 0usize;
    // SAFETY: as above.
    let st = unsafe { kvc_kvq_row_bytes(kvq, 0, 7, &mut b) };
    assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);

    // Rows of up to MAX_D values: the handle reads head_dim of each (buffers sized for the
    // largest head_dim, as the API takes no length for them).
    let src: Vec<f32> = (0..ROWS * MAX_D)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.03)
        .collect();
    let last = rows.len() - 1;
    for layer in [0, last] {
        for (tensor, rb) in [(KVC_TENSOR_K, rows[layer].0), (KVC_TENSOR_V, rows[layer].1)] {
            let mut packed = vec![0u8; ROWS * rb];
            // SAFETY: `src` holds ROWS * MAX_D >= ROWS * head_dim floats; `packed` is
            // writable for its length and disjoint from `src`.
            let st = unsafe {
                kvc_kvq_quantize_rows(
                    kvq,
                    layer as u32,
                    tensor,
                    src.as_ptr(),
                    ROWS,
                    packed.as_mut_ptr(),
                    packed.len(),
                )
            };
            assert_eq!(st, KvcStatus::KVC_OK, "quantize, layer {layer}");
            let mut out = vec![f32::NAN; ROWS * MAX_D];
            // SAFETY: `packed` is readable for its length; `out` holds ROWS * MAX_D floats.
            let st = unsafe {
                kvc_kvq_dequantize_rows(
                    kvq,
                    layer as u32,
                    tensor,
                    packed.as_ptr(),
                    packed.len(),
                    out.as_mut_ptr(),
                    ROWS,
                )
            };
            assert_eq!(st, KvcStatus::KVC_OK, "dequantize, layer {layer}");
            // head_dim is 64, 128 or 256: at least the first ROWS * 64 values are written.
            assert!(out[..ROWS * 64].iter().all(|x| x.is_finite()));
        }
    }
    // SAFETY: `kvq` is live and freed once.
    unsafe { kvc_kvq_free(kvq) };
});
