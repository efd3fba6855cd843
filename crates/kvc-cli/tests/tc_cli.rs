//! `kvc tc probe` and `kvc tc calibrate --layer-weights` as a user runs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kvc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
        .args(args)
        .output()
        .expect("run kvc")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvc-tc-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn calibration() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/tc-calibrations/smollm2-135m.kvctc")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Exit status 2, one line on stderr mentioning `mentions`, `out` not created.
fn assert_input_error(o: &Output, out: &Path, mentions: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(
        err.contains(mentions),
        "stderr {err:?} should mention {mentions:?}"
    );
    assert!(!out.exists(), "{} was created", out.display());
}

#[test]
fn a_probe_is_a_calibration_with_one_target() {
    let dir = tmp("probe");
    for layer in ["3", "base"] {
        let out = dir.join(format!("probe-{layer}.kvctc"));
        let o = kvc(&[
            "tc",
            "probe",
            s(&calibration()),
            "--layer",
            layer,
            "--target",
            "tc-0.128",
            "--out",
            s(&out),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let i = kvc(&["tc", "inspect", s(&out)]);
        assert!(i.status.success());
        let text = String::from_utf8_lossy(&i.stdout);
        assert!(text.contains("targets: tc-1\n"), "{text}");
        assert!(
            text.contains("30 layers × 3 KV heads × head_dim 64"),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_probe_of_a_layer_or_target_the_calibration_lacks_is_refused() {
    let dir = tmp("probe-bad");
    let out = dir.join("p.kvctc");
    let cal = calibration();
    let run = |layer: &str, target: &str| {
        kvc(&[
            "tc",
            "probe",
            s(&cal),
            "--layer",
            layer,
            "--target",
            target,
            "--out",
            s(&out),
        ])
    };
    assert_input_error(&run("30", "tc-0.128"), &out, "layer 30 of 30");
    assert_input_error(&run("x", "tc-0.128"), &out, "--layer \"x\"");
    assert_input_error(&run("0", "tc-0.5"), &out, "tc-0.5");
    assert_input_error(&run("0", "kvq-k4v4"), &out, "tc-<bound>");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_layer_weights_file_without_weights_is_refused_before_the_dump_is_read() {
    let dir = tmp("weights");
    let out = dir.join("c.kvctc");
    let w = dir.join("w.json");
    for (text, mentions) in [
        ("{\"weights\": [1, \"a\"]}", "one number per layer"),
        ("{}", "one number per layer"),
        ("not json", "w.json"),
    ] {
        std::fs::write(&w, text).unwrap();
        let o = kvc(&[
            "tc",
            "calibrate",
            "--dump",
            s(&dir.join("no-dump")),
            "--out",
            s(&out),
            "--layer-weights",
            s(&w),
        ]);
        assert_input_error(&o, &out, mentions);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
