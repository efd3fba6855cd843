//! Fuzz the msmodelslim C8 checkpoint reader (description JSON + safetensors scales)
//! through the C entry point an engine calls, `kvc_quant_new_from_msmodelslim`. The input
//! is `desc_len: u16 LE`, then that many bytes of `quant_model_description.json`, then
//! `quant_model_weight.safetensors`; both are written into a private directory
//! (`$KVC_FUZZ_SCRATCH` when set, else tmpfs when there is one) before each call. Any
//! input gives a typed status, never a panic, an out-of-bounds access or an allocation the
//! files do not justify. A checkpoint that loads must report a shape within the
//! documented limits and quantize a row cleanly.
#![no_main]

use std::ffi::CString;
use std::path::PathBuf;
use std::ptr;
use std::sync::OnceLock;

use kvc::convert::KVC_DTYPE_F32;
use kvc::quant::{
    kvc_quant_free, kvc_quant_get_config, kvc_quant_new_from_msmodelslim, kvc_quant_roundtrip_rows,
    KvcQuantConfig, KVC_QUANT_MAX_CHANNELS, KVC_QUANT_MAX_LAYERS,
};
use kvc::KvcStatus;
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static (PathBuf, CString) {
    static DIR: OnceLock<(PathBuf, CString)> = OnceLock::new();
    DIR.get_or_init(|| {
        // scripts/fuzz-all.sh passes a directory it removes afterwards.
        let base = if let Some(d) = std::env::var_os("KVC_FUZZ_SCRATCH") {
            PathBuf::from(d)
        } else if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("kvc-fuzz-c8-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("fuzz scratch directory");
        let c = CString::new(d.to_str().expect("UTF-8 temp path")).expect("no NUL");
        (d, c)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let n = (u16::from_le_bytes(*len) as usize).min(rest.len());
    let (desc, weights) = rest.split_at(n);
    let (d, c) = dir();
    std::fs::write(d.join("quant_model_description.json"), desc).expect("write description");
    std::fs::write(d.join("quant_model_weight.safetensors"), weights).expect("write weights");

    let mut q = ptr::null_mut();
    // SAFETY: `c` is a NUL-terminated path; `q` is writable.
    let st = unsafe { kvc_quant_new_from_msmodelslim(c.as_ptr(), &mut q) };
    assert_ne!(st, KvcStatus::KVC_PANIC);
    if st != KvcStatus::KVC_OK {
        assert!(q.is_null(), "a failed load must not store a handle");
        return;
    }
    let mut cfg = KvcQuantConfig {
        n_layers: 0,
        k_channels: 0,
        v_channels: 0,
        symmetric: 0,
    };
    // SAFETY: `q` is live; `cfg` is writable.
    assert_eq!(
        unsafe { kvc_quant_get_config(q, &mut cfg) },
        KvcStatus::KVC_OK
    );
    assert!((1..=KVC_QUANT_MAX_LAYERS).contains(&cfg.n_layers));
    assert!((1..=KVC_QUANT_MAX_CHANNELS).contains(&cfg.k_channels));
    assert!((1..=KVC_QUANT_MAX_CHANNELS).contains(&cfg.v_channels));
    // The highest layer named always has parameters: a K and a V row round-trip there.
    for (tensor, channels) in [(0, cfg.k_channels), (1, cfg.v_channels)] {
        let mut row: Vec<f32> = (0..channels).map(|i| (i % 11) as f32 - 5.0).collect();
        // SAFETY: `row` holds one row of `channels` f32.
        let st = unsafe {
            kvc_quant_roundtrip_rows(
                q,
                cfg.n_layers - 1,
                tensor,
                KVC_DTYPE_F32,
                row.as_mut_ptr().cast(),
                1,
            )
        };
        assert_eq!(st, KvcStatus::KVC_OK, "round trip on the last layer");
    }
    // SAFETY: `q` is live and freed once.
    unsafe { kvc_quant_free(q) };
});
