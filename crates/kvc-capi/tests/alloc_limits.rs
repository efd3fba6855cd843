//! What a small input can make the loaders allocate (issue 25): a 100-byte `.bin` v1
//! weight file (`kvc_mlp_new_from_memory`) or msmodelslim checkpoint
//! (`kvc_quant_new_from_msmodelslim`), whatever sizes its header claims, makes kvc hold
//! at most [`MAX_BYTES_PER_INPUT_BYTE`] times its size at once, plus [`FIXED_BYTES`] for
//! the paths, error messages and parser tables any call needs. Headers claiming huge
//! sizes are refused before anything of that size is allocated.

use std::ffi::CString;
use std::ptr;

use kvc::mlp::{kvc_mlp_free, kvc_mlp_new_from_memory};
use kvc::quant::{kvc_quant_free, kvc_quant_new_from_msmodelslim};
use kvc::KvcStatus;
use kvc_test_alloc::{measure, random_bytes};

/// The stated bound: bytes held at once per input byte...
const MAX_BYTES_PER_INPUT_BYTE: usize = 16;
/// ...plus this much for any call (paths, messages, the JSON parser's tables).
const FIXED_BYTES: usize = 4 * 1024;

#[global_allocator]
static GLOBAL: kvc_test_alloc::Counting = kvc_test_alloc::Counting;

fn check_bound(what: &str, input: &[u8], peak: usize, largest: usize) {
    let bound = MAX_BYTES_PER_INPUT_BYTE * input.len() + FIXED_BYTES;
    assert!(
        peak <= bound && largest <= bound,
        "{what}: a {}-byte input held {peak} bytes at once (largest allocation {largest}), \
         bound {bound}; input {input:02x?}",
        input.len()
    );
}

/// A 44-byte `.bin` v1 header followed by zeros up to 100 bytes.
fn mlp_file(fields: [u32; 8], dtype: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(100);
    b.extend_from_slice(&0x4B56_434Du32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&dtype.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    for f in fields {
        b.extend_from_slice(&f.to_le_bytes());
    }
    b.resize(100, 0);
    b
}

fn load_mlp(bytes: &[u8]) -> (KvcStatus, usize, usize) {
    let mut st = KvcStatus::KVC_OK;
    let (peak, largest) = measure(|| {
        let mut mlp = ptr::null_mut();
        // SAFETY: `bytes` is readable for its length; `mlp` is writable.
        st = unsafe { kvc_mlp_new_from_memory(bytes.as_ptr().cast(), bytes.len(), &mut mlp) };
        // SAFETY: NULL or the live handle just made, freed once.
        unsafe { kvc_mlp_free(mlp) };
    });
    (st, peak, largest)
}

#[test]
fn a_100_byte_weight_file_allocates_little() {
    const M: u32 = u32::MAX;
    // [num_layers, num_heads, head_dim, hidden_size, factor, min_seq_len, weights/layer, metadata]
    let claims: &[[u32; 8]] = &[
        [M, M, 0, 0, 1, 0, 12, 0], // 4 billion layers, head_dim from the first block
        [M, M, 0, 0, 1, 0, 6, 0],  // text only
        [1, 1, 65535, 0, 65535, 0, 6, 0], // 65535 x (65535 * 65535) weights
        [1, 1, M, 0, M, 0, 6, 0],  // head_dim * factor overflows 32 bits
        [1, 1, 4, 16, 4, 0, 6, M], // 4 GiB of metadata
        [M, M, 1, 1, 1, M, 12, 0], // tiny MLPs, endless layers
    ];
    let mut files: Vec<Vec<u8>> = Vec::new();
    for c in claims {
        for dtype in 0..3u16 {
            let mut f = mlp_file(*c, dtype);
            // Block 0 claims the rows head_dim wants (or M when head_dim comes from it).
            let rows = if c[2] == 0 { M } else { c[2] };
            f[44..48].copy_from_slice(&rows.to_le_bytes());
            f[48..52].copy_from_slice(&rows.wrapping_mul(c[4]).to_le_bytes());
            files.push(f.clone());
            // The same header with a 1 x 1 first block: valid blocks until the bytes run out.
            f[44..48].copy_from_slice(&1u32.to_le_bytes());
            f[48..52].copy_from_slice(&c[4].to_le_bytes());
            files.push(f);
        }
    }
    // Random bodies behind a valid magic and version.
    for seed in 0..500u64 {
        let mut f = vec![0u8; 100];
        random_bytes(seed, &mut f);
        f[..8].copy_from_slice(&mlp_file([1; 8], 0)[..8]);
        f[8] %= 3;
        f[9..12].fill(0);
        files.push(f);
    }
    let mut worst = 0;
    for f in &files {
        let (st, peak, largest) = load_mlp(f);
        worst = worst.max(peak);
        assert_ne!(
            st,
            KvcStatus::KVC_OK,
            "a 100-byte file cannot hold a whole model"
        );
        assert_ne!(st, KvcStatus::KVC_PANIC);
        check_bound("kvc_mlp_new_from_memory", f, peak, largest);
    }
    // The counter sees the loader's allocations (its error messages at least).
    assert!(worst > 0);
    eprintln!("kvc_mlp_new_from_memory: at most {worst} bytes held for a 100-byte file");
}

/// A safetensors image: the 8-byte header length, the JSON header, then `data`; padded
/// with zeros to `total` bytes.
fn safetensors(claimed_len: u64, json: &str, total: usize) -> Vec<u8> {
    let mut b = claimed_len.to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    b.resize(total.max(b.len()), 0);
    b
}

fn load_c8(dir: &std::path::Path, desc: &[u8], weights: &[u8]) -> (KvcStatus, usize, usize) {
    std::fs::write(dir.join("quant_model_description.json"), desc).unwrap();
    std::fs::write(dir.join("quant_model_weight.safetensors"), weights).unwrap();
    let c = CString::new(dir.to_str().unwrap()).unwrap();
    let mut st = KvcStatus::KVC_OK;
    let (peak, largest) = measure(|| {
        let mut q = ptr::null_mut();
        // SAFETY: `c` is a NUL-terminated path; `q` is writable.
        st = unsafe { kvc_quant_new_from_msmodelslim(c.as_ptr(), &mut q) };
        // SAFETY: NULL or the live handle just made, freed once.
        unsafe { kvc_quant_free(q) };
    });
    (st, peak, largest)
}

#[test]
fn a_100_byte_c8_checkpoint_allocates_little() {
    let dir = std::env::temp_dir().join(format!("kvc-alloc-limits-c8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let desc = br#"{"kv_cache_type": "C8", "model_quant_type": "W8A8"}"#;
    let name = "model.layers.9999999.self_attn.k_proj.kv_cache_scale";
    let weights: Vec<Vec<u8>> = vec![
        safetensors(u64::MAX, "", 100), // an 18-EB header
        safetensors(1 << 40, "{", 100), // a 1-TB header
        safetensors(
            92,
            &format!(
                r#"{{"{name}":{{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,4]}}}}"#
            ),
            100,
        ),
        safetensors(
            92,
            &format!(
                r#"{{"{name}":{{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}}}"#
            ),
            100,
        ),
        safetensors(
            80,
            &format!(
                r#"{{"{name}":{{"dtype":"F16","shape":[2],"data_offsets":[0,18446744073709551615]}}}}"#
            ),
            100,
        ),
    ];
    // Every weight file beside a valid description, and the description alone made huge
    // in what it claims (deep nesting, a long number).
    let mut cases: Vec<(Vec<u8>, Vec<u8>)> =
        weights.into_iter().map(|w| (desc.to_vec(), w)).collect();
    cases.push((vec![b'['; 100], Vec::new()));
    cases.push((
        format!("{{\"kv_cache_type\": 1{}}}", "0".repeat(70)).into_bytes(),
        vec![],
    ));
    for seed in 0..200u64 {
        let mut w = vec![0u8; 100];
        random_bytes(seed, &mut w);
        w[..8].copy_from_slice(&((seed * 7) % 120).to_le_bytes());
        cases.push((desc.to_vec(), w));
    }
    let mut worst = 0;
    for (d, w) in &cases {
        let (st, peak, largest) = load_c8(&dir, d, w);
        worst = worst.max(peak);
        assert_ne!(st, KvcStatus::KVC_OK);
        assert_ne!(st, KvcStatus::KVC_PANIC);
        // Both files are input: the bound is on their total size.
        let input = [d.as_slice(), w.as_slice()].concat();
        check_bound("kvc_quant_new_from_msmodelslim", &input, peak, largest);
    }
    assert!(worst > 0);
    eprintln!("kvc_quant_new_from_msmodelslim: at most {worst} bytes held for ~100-byte files");
    let _ = std::fs::remove_dir_all(&dir);
}
