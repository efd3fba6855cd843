//! `kvc_tiers_export_prefix` / `kvc_tiers_import_prefix` (ABI 0.20) called from Rust exactly
//! as C calls them: a prefix stored in one handle's memory tier, exported to a file,
//! imported by a fresh handle and restored byte for byte; the size query and a short
//! buffer; a damaged file (`KVC_CORRUPT_DATA`), a foreign one (`KVC_INVALID_ARGUMENT`,
//! "foreign"), a missing one (`KVC_IO`), each importing nothing and leaving the handle
//! usable; outputs untouched on failure; the `kvc_api` table's entries.

use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;
use std::ptr;

use kvc::tiers::{
    kvc_tiers_config_default, kvc_tiers_export_prefix, kvc_tiers_free, kvc_tiers_get_metrics,
    kvc_tiers_import_prefix, kvc_tiers_lookup, kvc_tiers_new, kvc_tiers_restore, kvc_tiers_store,
    KvcTiers, KvcTiersConfig, KvcTiersMetrics, KVC_TIERS_CODEC_GEAR_V2, KVC_TIERS_CODEC_KVQ_K4V4,
    KVC_TIERS_MEMORY,
};
use kvc::{kvc_get_api, kvc_last_error_message, KvcStatus, KVC_ABI_VERSION};

const LAYERS: usize = 2;
const HEADS: usize = 2;
const DIM: usize = 64;
const ROW: usize = HEADS * DIM * 2;
const CHUNK: usize = 16;
const TOKENS: usize = 70; // 4 whole chunks and 6 tokens more

fn last_error() -> String {
    let mut needed = 0usize;
    // SAFETY: size query; `needed` is valid.
    let st = unsafe { kvc_last_error_message(ptr::null_mut(), 0, &mut needed) };
    assert_eq!(st, KvcStatus::KVC_OK);
    let mut buf = vec![0 as c_char; needed.max(1)];
    // SAFETY: `buf` holds `needed` bytes.
    let st = unsafe { kvc_last_error_message(buf.as_mut_ptr(), buf.len(), ptr::null_mut()) };
    assert_eq!(st, KvcStatus::KVC_OK);
    // SAFETY: NUL-terminated within `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// A memory-only handle of `codec` and `model_hash`.
fn new_tiers(codec: u32, model_hash: u8) -> *mut KvcTiers {
    let mut c = KvcTiersConfig::default();
    // SAFETY: `c` is writable.
    let st = unsafe { kvc_tiers_config_default(&mut c) };
    assert_eq!(st, KvcStatus::KVC_OK);
    c.n_layer = LAYERS;
    c.n_kv_head = HEADS;
    c.head_dim = DIM;
    c.chunk_tokens = CHUNK;
    c.codec = codec;
    c.model_hash = [model_hash; 32];
    let mut t = ptr::null_mut();
    // SAFETY: valid config and out pointer.
    assert_eq!(unsafe { kvc_tiers_new(&c, &mut t) }, KvcStatus::KVC_OK);
    t
}

struct Handle(*mut KvcTiers);
impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a live handle, freed once.
        unsafe { kvc_tiers_free(self.0) }
    }
}

fn kv(seed: u16) -> Vec<u8> {
    (0..LAYERS * TOKENS * ROW / 2)
        .flat_map(|i| {
            // f16 values in [1, 2): finite for every codec.
            (0x3c00u16 + ((i as u16).wrapping_mul(seed) % 1024)).to_le_bytes()
        })
        .collect()
}

fn tokens() -> Vec<u32> {
    (0..TOKENS as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect()
}

fn temp_path(name: &str) -> (PathBuf, CString) {
    let dir = std::env::temp_dir().join(format!("kvc-capi-prefix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let c = CString::new(p.to_str().unwrap()).unwrap();
    (p, c)
}

fn store(t: *mut KvcTiers, k: &[u8], v: &[u8]) {
    let toks = tokens();
    // SAFETY: buffers of the stated lengths.
    let st = unsafe {
        kvc_tiers_store(
            t,
            toks.as_ptr(),
            TOKENS,
            TOKENS,
            k.as_ptr().cast(),
            k.len(),
            v.as_ptr().cast(),
            v.len(),
            ptr::null_mut(),
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
}

fn export(t: *mut KvcTiers, path: &CString) -> (KvcStatus, usize) {
    let toks = tokens();
    let mut n = 12345;
    // SAFETY: valid pointers.
    let st = unsafe { kvc_tiers_export_prefix(t, toks.as_ptr(), TOKENS, path.as_ptr(), &mut n) };
    (st, n)
}

/// Imports with a buffer of `cap` tokens (NULL when `cap` is `None`); the status, the token
/// buffer and both outputs (initialised to sentinels).
fn import(
    t: *mut KvcTiers,
    path: &CString,
    cap: Option<usize>,
) -> (KvcStatus, Vec<u32>, usize, usize) {
    let mut buf = vec![0xdead_beefu32; cap.unwrap_or(0)];
    let (mut n, mut imported) = (777usize, 888usize);
    let p = if cap.is_some() {
        buf.as_mut_ptr()
    } else {
        ptr::null_mut()
    };
    // SAFETY: `p` NULL or writable for `buf.len()` tokens; outputs valid.
    let st =
        unsafe { kvc_tiers_import_prefix(t, path.as_ptr(), p, buf.len(), &mut n, &mut imported) };
    (st, buf, n, imported)
}

fn restore(t: *mut KvcTiers) -> (usize, Vec<u8>, Vec<u8>) {
    let toks = tokens();
    let (mut k, mut v) = (
        vec![0u8; LAYERS * TOKENS * ROW],
        vec![0u8; LAYERS * TOKENS * ROW],
    );
    let mut n = 0;
    // SAFETY: buffers of the stated lengths.
    let st = unsafe {
        kvc_tiers_restore(
            t,
            toks.as_ptr(),
            TOKENS,
            TOKENS,
            k.as_mut_ptr().cast(),
            k.len(),
            v.as_mut_ptr().cast(),
            v.len(),
            &mut n,
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    (n, k, v)
}

fn metrics(t: *mut KvcTiers) -> KvcTiersMetrics {
    let mut m = KvcTiersMetrics::default();
    // SAFETY: valid pointers.
    let st = unsafe { kvc_tiers_get_metrics(t, &mut m) };
    assert_eq!(st, KvcStatus::KVC_OK);
    m
}

#[test]
fn a_prefix_exported_to_a_file_restores_in_a_fresh_handle_byte_for_byte() {
    for codec in [KVC_TIERS_CODEC_GEAR_V2, KVC_TIERS_CODEC_KVQ_K4V4] {
        let (path, cpath) = temp_path(&format!("rt-{codec}.kvcprfix"));
        let (k, v) = (kv(37), kv(91));
        let a = Handle(new_tiers(codec, 7));
        store(a.0, &k, &v);
        assert_eq!(export(a.0, &cpath), (KvcStatus::KVC_OK, 4 * CHUNK));
        assert!(path.is_file());

        let b = Handle(new_tiers(codec, 7));
        // Size query: the count, nothing imported.
        let (st, _, n, imported) = import(b.0, &cpath, None);
        assert_eq!((st, n, imported), (KvcStatus::KVC_OK, TOKENS, 888));
        assert_eq!(metrics(b.0).tiers[KVC_TIERS_MEMORY].entries, 0);
        // Too small: the count, nothing written, nothing imported.
        let (st, buf, n, imported) = import(b.0, &cpath, Some(TOKENS - 1));
        assert_eq!(
            (st, n, imported),
            (KvcStatus::KVC_BUFFER_TOO_SMALL, TOKENS, 888)
        );
        assert!(buf.iter().all(|&t| t == 0xdead_beef));
        assert_eq!(metrics(b.0).tiers[KVC_TIERS_MEMORY].entries, 0);
        // The import.
        let (st, buf, n, imported) = import(b.0, &cpath, Some(TOKENS + 3));
        assert_eq!((st, n, imported), (KvcStatus::KVC_OK, TOKENS, 4 * CHUNK));
        assert_eq!(&buf[..TOKENS], &tokens()[..]);
        assert_eq!(buf[TOKENS], 0xdead_beef);
        let mut found = 0;
        // SAFETY: valid pointers.
        let st = unsafe { kvc_tiers_lookup(b.0, buf.as_ptr(), TOKENS, &mut found) };
        assert_eq!((st, found), (KvcStatus::KVC_OK, 4 * CHUNK));
        let (got, want) = (restore(b.0), restore(a.0));
        assert_eq!(got.0, 4 * CHUNK);
        assert!(
            got == want,
            "codec {codec}: the restore after the import differs"
        );
        if codec == KVC_TIERS_CODEC_GEAR_V2 {
            for l in 0..LAYERS {
                let r = l * TOKENS * ROW..(l * TOKENS + 4 * CHUNK) * ROW;
                assert_eq!(got.1[r.clone()], k[r.clone()]);
                assert_eq!(got.2[r.clone()], v[r]);
            }
        }
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn damaged_foreign_and_missing_files_import_nothing_and_leave_the_handle_usable() {
    let (path, cpath) = temp_path("bad.kvcprfix");
    let (k, v) = (kv(5), kv(11));
    let a = Handle(new_tiers(KVC_TIERS_CODEC_GEAR_V2, 7));
    store(a.0, &k, &v);
    assert_eq!(export(a.0, &cpath).0, KvcStatus::KVC_OK);
    let good = std::fs::read(&path).unwrap();

    let b = Handle(new_tiers(KVC_TIERS_CODEC_GEAR_V2, 7));
    for at in [0, 17, 70, good.len() / 2, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x20;
        std::fs::write(&path, &bad).unwrap();
        let (st, buf, n, imported) = import(b.0, &cpath, Some(TOKENS));
        assert_eq!(st, KvcStatus::KVC_CORRUPT_DATA, "byte {at}");
        assert_eq!((n, imported), (777, 888));
        assert!(buf.iter().all(|&t| t == 0xdead_beef));
        assert!(last_error().contains("kv-prefix"), "{}", last_error());
    }
    std::fs::write(&path, &good[..good.len() - 1]).unwrap();
    assert_eq!(
        import(b.0, &cpath, Some(TOKENS)).0,
        KvcStatus::KVC_CORRUPT_DATA
    );
    assert_eq!(import(b.0, &cpath, None).0, KvcStatus::KVC_CORRUPT_DATA);
    assert_eq!(metrics(b.0).tiers[KVC_TIERS_MEMORY].entries, 0);

    // Another model's file, and another codec's: foreign.
    std::fs::write(&path, &good).unwrap();
    for (codec, hash) in [(KVC_TIERS_CODEC_GEAR_V2, 8), (KVC_TIERS_CODEC_KVQ_K4V4, 7)] {
        let c = Handle(new_tiers(codec, hash));
        let (st, _, n, imported) = import(c.0, &cpath, Some(TOKENS));
        assert_eq!(
            (st, n, imported),
            (KvcStatus::KVC_INVALID_ARGUMENT, 777, 888)
        );
        let msg = last_error();
        assert!(
            msg.starts_with("kvc_tiers_import_prefix: foreign kv-prefix file"),
            "{msg}"
        );
        assert_eq!(metrics(c.0).tiers[KVC_TIERS_MEMORY].entries, 0);
    }

    // Missing, and arguments.
    let (_, missing) = temp_path("missing.kvcprfix");
    assert_eq!(import(b.0, &missing, Some(TOKENS)).0, KvcStatus::KVC_IO);
    let (mut n, mut imported) = (0, 0);
    // SAFETY: NULL arguments are reported, never dereferenced.
    unsafe {
        assert_eq!(
            kvc_tiers_import_prefix(b.0, ptr::null(), ptr::null_mut(), 0, &mut n, &mut imported),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert_eq!(
            kvc_tiers_import_prefix(
                ptr::null(),
                cpath.as_ptr(),
                ptr::null_mut(),
                0,
                &mut n,
                &mut imported
            ),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert_eq!(
            kvc_tiers_import_prefix(
                b.0,
                cpath.as_ptr(),
                ptr::null_mut(),
                0,
                ptr::null_mut(),
                &mut imported
            ),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert_eq!(
            kvc_tiers_import_prefix(
                b.0,
                cpath.as_ptr(),
                ptr::null_mut(),
                5,
                &mut n,
                &mut imported
            ),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert_eq!(
            kvc_tiers_export_prefix(b.0, ptr::null(), 3, cpath.as_ptr(), &mut n),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert_eq!(
            kvc_tiers_export_prefix(b.0, tokens().as_ptr(), 3, ptr::null(), &mut n),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert_eq!(
            kvc_tiers_export_prefix(b.0, tokens().as_ptr(), 3, c"".as_ptr(), &mut n),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert_eq!(
            kvc_tiers_export_prefix(
                b.0,
                tokens().as_ptr(),
                3,
                c"/nonexistent-dir/x".as_ptr(),
                &mut n
            ),
            KvcStatus::KVC_IO
        );
    }
    assert_eq!(n, 0);

    // The handle is still usable: the good file imports and restores.
    let (st, _, n, imported) = import(b.0, &cpath, Some(TOKENS));
    assert_eq!((st, n, imported), (KvcStatus::KVC_OK, TOKENS, 4 * CHUNK));
    assert_eq!(restore(b.0), restore(a.0));
    // No whole chunk: a valid file of 0 chunks.
    let toks = tokens();
    let mut n = 99;
    // SAFETY: valid pointers.
    let st =
        unsafe { kvc_tiers_export_prefix(a.0, toks.as_ptr(), CHUNK - 1, cpath.as_ptr(), &mut n) };
    assert_eq!((st, n), (KvcStatus::KVC_OK, 0));
    let (st, buf, n, imported) = import(b.0, &cpath, Some(CHUNK - 1));
    assert_eq!((st, n, imported), (KvcStatus::KVC_OK, CHUNK - 1, 0));
    assert_eq!(buf, toks[..CHUNK - 1]);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_function_table_has_both_entries() {
    let api = kvc_get_api(KVC_ABI_VERSION);
    assert!(!api.is_null());
    // SAFETY: a static table.
    let api = unsafe { &*api };
    assert_eq!(
        api.tiers_export_prefix as usize,
        kvc_tiers_export_prefix as *const () as usize
    );
    assert_eq!(
        api.tiers_import_prefix as usize,
        kvc_tiers_import_prefix as *const () as usize
    );
}
