//! Fuzz the `.bin` v1 compressor weight loader through the C entry point an engine calls,
//! `kvc_mlp_new_from_memory`: any bytes give a typed status, never a panic (libFuzzer's
//! panic hook aborts even inside kvc's panic boundary), an out-of-bounds access or an
//! allocation the file's length does not justify. A file that loads is then used: its
//! info must match what it can compress, and one small compression must run cleanly.
#![no_main]

use std::ffi::c_void;
use std::ptr;

use kvc::convert::KVC_DTYPE_F32;
use kvc::mlp::{
    kvc_mlp_compress_inplace, kvc_mlp_free, kvc_mlp_get_info, kvc_mlp_new_from_memory, KvcMlpInfo,
};
use kvc::KvcStatus;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut mlp = ptr::null_mut();
    // SAFETY: `data` is readable for its length; `mlp` is writable.
    let st = unsafe { kvc_mlp_new_from_memory(data.as_ptr().cast(), data.len(), &mut mlp) };
    assert_ne!(st, KvcStatus::KVC_PANIC);
    if st != KvcStatus::KVC_OK {
        assert!(mlp.is_null(), "a failed load must not store a handle");
        return;
    }
    let mut info = KvcMlpInfo::default();
    // SAFETY: `mlp` is the live handle just made; `info` is writable.
    assert_eq!(
        unsafe { kvc_mlp_get_info(mlp, &mut info) },
        KvcStatus::KVC_OK
    );
    // One compression of a small cache (bounded so that a large valid file stays fast):
    // one head, as many tokens as the smallest segment that is compressed.
    let d = info.head_dim as usize;
    let factor = info.compression_factor as usize;
    let seq = factor.saturating_mul((info.min_seq_len as usize).max(1));
    if info.num_layers > 0 && d > 0 && d <= 512 && seq > 0 && seq <= 512 {
        let n = seq * d;
        let mut k: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
        let mut v = k.clone();
        let (mut new_len, mut rope) = (0usize, 0usize);
        // SAFETY: `k` and `v` hold 1 * seq * d f32 each and do not overlap; the outputs
        // are writable.
        let st = unsafe {
            kvc_mlp_compress_inplace(
                mlp,
                0,
                KVC_DTYPE_F32,
                k.as_mut_ptr().cast::<c_void>(),
                v.as_mut_ptr().cast::<c_void>(),
                1,
                seq,
                seq,
                d,
                0,
                &mut new_len,
                &mut rope,
            )
        };
        assert_ne!(st, KvcStatus::KVC_PANIC);
        if st == KvcStatus::KVC_OK {
            assert!(new_len <= seq, "compressed {seq} tokens into {new_len}");
            assert_eq!(rope, seq);
        }
    }
    // SAFETY: `mlp` is live and freed once.
    unsafe { kvc_mlp_free(mlp) };
});
