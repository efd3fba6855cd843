//! A plan made by `kvc_kvq_calibrate` (as `kvc quant plan` makes it), written as JSON,
//! loads through `KvqPlan::from_json` and through `kvc_kvq_new_from_plan`, and the handle
//! has the planned bytes per row in every layer.

use std::ptr;

use kvc::codec::{KVC_TENSOR_K, KVC_TENSOR_V};
use kvc::kvq::{kvc_kvq_free, kvc_kvq_new_from_plan, kvc_kvq_row_bytes, KvcKvq};
use kvc::KvcStatus;
use kvc_kvq::{row_bytes, KvqPlan, Method};
use kvc_kvq_calibrate::{
    allocate, make_plan, sensitivity, BitBounds, CalibShape, CalibSource, Objective, QuerySample,
};

#[test]
fn calibrated_plan_loads_through_the_c_api() {
    let shape = CalibShape {
        n_layer: 4,
        n_tokens: 80,
        n_head: 6,
        n_kv_head: 2,
        head_dim: 64,
    };
    let mut s = 11u64;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let kv = shape.kv_len().unwrap();
    // Layers differ in scale so the plan is not uniform.
    let k: Vec<f32> = (0..kv).map(|i| next() * (1 + i * 4 / kv) as f32).collect();
    let v: Vec<f32> = (0..kv).map(|_| next()).collect();
    let q: Vec<f32> = (0..shape.q_len().unwrap()).map(|_| 2.0 * next()).collect();
    let sample = QuerySample { from: 8, stride: 8 };
    let m = Method::LloydMax;
    let sens = sensitivity(shape, &k, &v, &q, m, 3, sample).unwrap();
    let alloc = allocate(
        &sens,
        m,
        64,
        4.0,
        Objective::k_weight(1.0),
        BitBounds::default(),
    )
    .unwrap();
    let src = CalibSource {
        source: "synthetic".into(),
        tag: "t".into(),
    };
    let plan = make_plan(
        shape,
        m,
        3,
        sample,
        &src,
        4.0,
        Objective::k_weight(1.0),
        BitBounds::default(),
        &sens,
        &alloc,
    )
    .unwrap();
    let json = plan.to_json();
    let back = KvqPlan::from_json(&json).unwrap();
    assert_eq!((back.version, &back.layers), (2, &plan.layers));
    // serde_json's default float parsing may differ from the written value in the last bit.
    let (a, b) = (back.calibration.unwrap(), plan.calibration.clone().unwrap());
    for (x, y) in a.layer_errors.iter().zip(&b.layer_errors) {
        assert!((x.k_err - y.k_err).abs() <= 1e-15 * y.k_err.abs());
        assert!((x.v_err - y.v_err).abs() <= 1e-15 * y.v_err.abs());
    }

    let mut h: *mut KvcKvq = ptr::null_mut();
    // SAFETY: `json` is readable for its length; `h` is writable.
    let st = unsafe { kvc_kvq_new_from_plan(json.as_ptr().cast(), json.len(), &mut h) };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert!(!h.is_null());
    for (l, b) in plan.layers.iter().enumerate() {
        for (t, bits) in [(KVC_TENSOR_K, b.k_bits), (KVC_TENSOR_V, b.v_bits)] {
            let mut n = 0usize;
            // SAFETY: `h` is live; `n` writable.
            let st = unsafe { kvc_kvq_row_bytes(h, l as u32, t, &mut n) };
            assert_eq!(st, KvcStatus::KVC_OK);
            assert_eq!(n, row_bytes(m, bits, 64).unwrap(), "layer {l}");
        }
    }
    // SAFETY: `h` is live and used by nothing else.
    unsafe { kvc_kvq_free(h) };

    // The same plan with its calibration record but version 1 is refused.
    let v1 = json.replacen("\"version\": 2", "\"version\": 1", 1);
    assert_ne!(v1, json);
    let mut h: *mut KvcKvq = ptr::null_mut();
    // SAFETY: as above.
    let st = unsafe { kvc_kvq_new_from_plan(v1.as_ptr().cast(), v1.len(), &mut h) };
    assert_eq!(st, KvcStatus::KVC_CORRUPT_DATA);
    assert!(h.is_null());

    // With layer weights the plan is version 4; it loads, and as version 3 it is refused.
    let w = [4.0, 0.5, 1.0, 0.25];
    let obj = Objective {
        k_weight: 1.0,
        layer_weights: Some(&w),
    };
    let alloc = allocate(&sens, m, 64, 4.0, obj, BitBounds::default()).unwrap();
    let plan = make_plan(
        shape,
        m,
        3,
        sample,
        &src,
        4.0,
        obj,
        BitBounds::default(),
        &sens,
        &alloc,
    )
    .unwrap();
    let json = plan.to_json();
    assert!(json.contains("\"version\": 4") && json.contains("layer_weights"));
    for (text, want) in [
        (json.clone(), KvcStatus::KVC_OK),
        (
            json.replacen("\"version\": 4", "\"version\": 3", 1),
            KvcStatus::KVC_CORRUPT_DATA,
        ),
    ] {
        let mut h: *mut KvcKvq = ptr::null_mut();
        // SAFETY: as above.
        let st = unsafe { kvc_kvq_new_from_plan(text.as_ptr().cast(), text.len(), &mut h) };
        assert_eq!(st, want);
        assert_eq!(h.is_null(), want != KvcStatus::KVC_OK);
        // SAFETY: `h` is null or live and used by nothing else.
        unsafe { kvc_kvq_free(h) };
    }
}
