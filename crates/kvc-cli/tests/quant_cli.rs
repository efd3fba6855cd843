//! `kvc quant`: calibrate -> apply -> dequant on the embedded sample, and exit status 2
//! with one line on bad files.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kvc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvc"))
}

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/sample")
        .join(name)
}

fn shape<'a>(c: &'a mut Command, layers: &str) -> &'a mut Command {
    c.args([
        "--dtype",
        "f16",
        "--layers",
        layers,
        "--kv-heads",
        "3",
        "--head-dim",
        "64",
    ])
}

#[test]
fn calibrate_apply_dequant_round_trip() {
    let dir = std::env::temp_dir().join(format!("kvc-quant-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (k, v) = (sample("textA.K.f16.bin"), sample("textA.V.f16.bin"));
    let ck = dir.join("ck");
    let st = shape(kvc().args(["quant", "calibrate"]), "4")
        .arg("--k")
        .arg(&k)
        .arg("--v")
        .arg(&v)
        .arg("--out")
        .arg(&ck)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(ck.join("quant_model_description.json").is_file());
    let out = shape(kvc().args(["quant", "apply", "--scales"]).arg(&ck), "4")
        .arg("--k")
        .arg(&k)
        .arg("--v")
        .arg(&v)
        .arg("--out-k")
        .arg(dir.join("k.i8"))
        .arg("--out-v")
        .arg(dir.join("v.i8"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::metadata(dir.join("k.i8")).unwrap().len() * 2,
        std::fs::metadata(&k).unwrap().len()
    );
    let st = shape(kvc().args(["quant", "dequant", "--scales"]).arg(&ck), "4")
        .arg("--k")
        .arg(dir.join("k.i8"))
        .arg("--v")
        .arg(dir.join("v.i8"))
        .arg("--out-k")
        .arg(dir.join("k.f16"))
        .arg("--out-v")
        .arg(dir.join("v.f16"))
        .status()
        .unwrap();
    assert!(st.success());
    let (a, b) = (
        std::fs::read(&k).unwrap(),
        std::fs::read(dir.join("k.f16")).unwrap(),
    );
    let (mut sig, mut err) = (0f64, 0f64);
    for (x, y) in a.chunks_exact(2).zip(b.chunks_exact(2)) {
        let x = f64::from(half::f16::from_le_bytes([x[0], x[1]]).to_f32());
        let y = f64::from(half::f16::from_le_bytes([y[0], y[1]]).to_f32());
        sig += x * x;
        err += (x - y) * (x - y);
    }
    assert!(10.0 * (sig / err).log10() > 40.0);

    // Bad files: exit 2, one line.
    std::fs::write(
        ck.join("quant_model_description.json"),
        "{\"kv_cache_type\": \"C4\"}",
    )
    .unwrap();
    let bad = |c: &mut Command| {
        let o = c.output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    };
    let apply = |layers: &str, kf: &Path| {
        let mut c = kvc();
        shape(c.args(["quant", "apply", "--scales"]).arg(&ck), layers)
            .arg("--k")
            .arg(kf)
            .arg("--v")
            .arg(&v)
            .arg("--out-k")
            .arg(dir.join("x"))
            .arg("--out-v")
            .arg(dir.join("y"));
        c
    };
    bad(&mut apply("4", &k));
    std::fs::write(
        ck.join("quant_model_description.json"),
        "{\"kv_cache_type\": \"C8\"}",
    )
    .unwrap();
    bad(&mut apply("3", &k)); // 3 layers do not divide the file
    std::fs::write(dir.join("short.bin"), [0u8; 7]).unwrap();
    bad(&mut apply("4", &dir.join("short.bin")));
    let w = ck.join("quant_model_weight.safetensors");
    let full = std::fs::read(&w).unwrap();
    std::fs::write(&w, &full[..full.len() / 2]).unwrap();
    bad(&mut apply("4", &k));
    std::fs::remove_dir_all(&dir).unwrap();
}
