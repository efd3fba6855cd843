//! Golden kvq plans, one per plan version (`docs/formats/kvq.md`, "Plans"):
//! `tests/golden/plans/v<version>-<name>.json`, each a plan as `kvc quant plan` wrote it (v1: a
//! uniform plan as `KvqPlan::uniform` writes it). Every version stays readable:
//!
//! - each file loads, with its version and what that version added;
//! - written again and read back, it is the same plan (bits, protections, calibration record);
//! - the fields of a newer version in an older version's plan are refused, naming the version;
//! - every truncation is refused with an error, never a panic.
//!
//! A plan version is never changed in place: new fields make a new version, with its own file
//! here; the older files stay and must still load.

use kvc_kvq::config::PLAN_VERSION;
use kvc_kvq::KvqPlan;

fn golden(name: &str) -> String {
    let path = format!("{}/tests/golden/plans/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn round_trips(text: &str) -> KvqPlan {
    let p = KvqPlan::from_json(text).unwrap();
    let back = KvqPlan::from_json(&p.to_json()).unwrap();
    assert_eq!(
        (
            back.version,
            &back.layers,
            back.sink_tokens,
            back.recent_tokens,
            back.recent_bits,
            back.k_center
        ),
        (
            p.version,
            &p.layers,
            p.sink_tokens,
            p.recent_tokens,
            p.recent_bits,
            p.k_center
        )
    );
    match (&back.calibration, &p.calibration) {
        (None, None) => {}
        (Some(a), Some(b)) => {
            // serde_json's float parsing may move the last bit of a written value
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-14 * y.abs().max(1e-300);
            assert!(
                close(a.total_error, b.total_error) && close(a.achieved_ratio, b.achieved_ratio)
            );
            assert_eq!(
                a.layer_weights.as_ref().map(Vec::len),
                b.layer_weights.as_ref().map(Vec::len)
            );
            for (x, y) in a
                .layer_weights
                .iter()
                .flatten()
                .zip(b.layer_weights.iter().flatten())
            {
                assert!(close(*x, *y));
            }
        }
        _ => panic!("the calibration record was lost"),
    }
    for cut in 0..text.trim_end().len() {
        assert!(KvqPlan::from_json(&text[..cut]).is_err(), "cut at {cut}");
    }
    p
}

#[test]
fn every_plan_version_loads() {
    assert_eq!(
        PLAN_VERSION, 4,
        "a new plan version needs its golden file here"
    );
    let v1 = round_trips(&golden("v1-uniform-k4v3.json"));
    assert_eq!(
        (v1.version, v1.layers.len(), v1.calibration.is_none()),
        (1, 30, true)
    );

    let v2 = round_trips(&golden("v2-smollm2-135m-r3.5.json"));
    let c = v2.calibration.as_ref().unwrap();
    assert_eq!((v2.version, c.layer_weights.is_none()), (2, true));
    assert!(v2.recent_bits.is_none() && !v2.k_center);

    let v3 = round_trips(&golden("v3-smollm2-135m-k4v4-s4w64.json"));
    assert_eq!(
        (
            v3.version,
            v3.sink_tokens,
            v3.recent_tokens,
            v3.recent_bits,
            v3.k_center
        ),
        (3, 4, 64, Some(8), true)
    );

    let v4 = round_trips(&golden("v4-smollm2-135m-lw5-s4w64.json"));
    let c = v4.calibration.as_ref().unwrap();
    let w = c.layer_weights.as_ref().unwrap();
    assert_eq!((v4.version, w.len(), v4.layers.len()), (4, 30, 30));
    assert!(w.iter().all(|x| x.is_finite() && *x > 0.0));
    // the weights are the probes' sensitivities over their mean
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    assert!((mean - 1.0).abs() < 1e-9, "{mean}");
    assert_eq!(
        (
            v4.sink_tokens,
            v4.recent_tokens,
            v4.recent_bits,
            v4.k_center
        ),
        (4, 64, Some(8), true)
    );
}

#[test]
fn newer_fields_in_older_versions_are_refused() {
    for (file, from, to, says) in [
        (
            "v4-smollm2-135m-lw5-s4w64.json",
            "\"version\": 4",
            "\"version\": 3",
            "version 4",
        ),
        (
            "v3-smollm2-135m-k4v4-s4w64.json",
            "\"version\": 3",
            "\"version\": 2",
            "version 3",
        ),
        (
            "v2-smollm2-135m-r3.5.json",
            "\"version\": 2",
            "\"version\": 1",
            "version 2",
        ),
        (
            "v1-uniform-k4v3.json",
            "\"version\": 1",
            "\"version\": 5",
            "version",
        ),
    ] {
        let text = golden(file);
        let t = text.replacen(from, to, 1);
        assert_ne!(t, text, "{file}");
        let e = KvqPlan::from_json(&t).unwrap_err();
        assert!(e.to_string().contains(says), "{file}: {e}");
    }
}
