//! Fuzz the saved-cells reader (`KVCQCELS`, docs/formats/kvq.md "Saved cells") the way an
//! engine meets it: `kvc_kvq_cells_load` through the C ABI, into cells of the fixed
//! configuration (32 cells; sink 2, window 4 at 8 bits; a centered 4-bit K and a 3-bit V
//! of 2 heads of 64). Any bytes give `KVC_CORRUPT_DATA` / `KVC_INVALID_ARGUMENT` with
//! nothing changed, or a load after which every cell reads (scores and values, finite or
//! NaN) and saves again, and the save loads into fresh cells: never a panic, an
//! out-of-bounds access or an allocation the input's length does not justify.
//!
//! Input: one selector byte, then the saved cells. The selector's low 4 bits are the
//! number of engine cells (cells `31 - p` at positions `p`), bit 4 picks `dest_seq` 3 or
//! -1; with bit 7 set the target first rewrites the trailing BLAKE3 checksum, so that
//! mutations reach the fields behind it.
//!
//! Seeds: with `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call writes saves of the fixed
//! cells after 1 to 14 tokens (with and without bit 7) there; scripts/fuzz-all.sh does
//! this.
#![no_main]

use std::ptr;
use std::sync::OnceLock;

use kvc::kvq_cells::*;
use kvc::KvcStatus;
use libfuzzer_sys::fuzz_target;

const D: usize = 64;
const H: usize = 2;
const N_CELLS: u32 = 32;
const CFG: KvcKvqCellsConfig = KvcKvqCellsConfig {
    n_cells: N_CELLS,
    sink: 2,
    window: 4,
    window_bits: 8,
};
const TENSORS: [KvcKvqCellsTensor; 2] = [
    KvcKvqCellsTensor {
        head_dim: D as u32,
        n_kv_head: H as u32,
        bits: 4,
        center: 1,
    },
    KvcKvqCellsTensor {
        head_dim: D as u32,
        n_kv_head: H as u32,
        bits: 3,
        center: 0,
    },
];
const MAIN_BYTES: [usize; 2] = [H * (2 + D / 2), H * (2 + D * 3 / 8)];

fn new_cells() -> *mut KvcKvqCells {
    let mut c = ptr::null_mut();
    // SAFETY: valid pointers.
    let st = unsafe { kvc_kvq_cells_new(&CFG, TENSORS.as_ptr(), 2, &mut c) };
    assert_eq!(st, KvcStatus::KVC_OK);
    c
}

/// One ubatch of tokens at positions `first..first + n` of `seq` into cells `31 - p`.
fn write(c: *mut KvcKvqCells, mains: &mut [Vec<u8>; 2], first: usize, n: usize, seq: i32) {
    let pos: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
    let seqs = vec![seq; n];
    let idx: Vec<i64> = (first..first + n).map(|p| 31 - p as i64).collect();
    let rows: Vec<f32> = (0..n * H * D)
        .map(|i| ((i * 37 + first * 11) % 101) as f32 / 25.0 - 2.0 + (i % 5) as f32)
        .collect();
    // SAFETY: valid pointers and lengths.
    unsafe {
        let st = kvc_kvq_cells_begin_ubatch(c, pos.as_ptr(), seqs.as_ptr(), idx.as_ptr(), n);
        assert_eq!(st, KvcStatus::KVC_OK);
        for (t, m) in mains.iter_mut().enumerate() {
            let st = kvc_kvq_cells_write(
                c,
                t as u32,
                rows.as_ptr(),
                rows.len(),
                idx.as_ptr(),
                n,
                m.as_mut_ptr(),
                m.len(),
            );
            assert_eq!(st, KvcStatus::KVC_OK);
        }
    }
}

fn save(c: *const KvcKvqCells, n: usize, seq: i32) -> Vec<u8> {
    let ids: Vec<u32> = (0..n as u32).map(|p| 31 - p).collect();
    let mut len = 0usize;
    // SAFETY: valid pointers and lengths.
    unsafe {
        let st = kvc_kvq_cells_save(c, ids.as_ptr(), n, seq, ptr::null_mut(), 0, &mut len);
        assert_eq!(st, KvcStatus::KVC_OK);
        let mut out = vec![0u8; len];
        let st = kvc_kvq_cells_save(c, ids.as_ptr(), n, seq, out.as_mut_ptr(), len, &mut len);
        assert_eq!(st, KvcStatus::KVC_OK);
        out
    }
}

fn load(c: *mut KvcKvqCells, bytes: &[u8], n: usize, dest: i32) -> KvcStatus {
    let ids: Vec<u32> = (0..n as u32).map(|p| 31 - p).collect();
    let pos: Vec<i32> = (0..n as i32).collect();
    // SAFETY: valid pointers and lengths.
    unsafe { kvc_kvq_cells_load(c, bytes.as_ptr(), bytes.len(), ids.as_ptr(), pos.as_ptr(), n, dest) }
}

fn mains() -> [Vec<u8>; 2] {
    [
        vec![0u8; N_CELLS as usize * MAIN_BYTES[0]],
        vec![0u8; N_CELLS as usize * MAIN_BYTES[1]],
    ]
}

fn write_seeds(dir: &std::path::Path) {
    for n in 1..=14usize {
        let c = new_cells();
        let mut m = mains();
        let first = n.min(10);
        write(c, &mut m, 0, first, 0);
        for p in first..n {
            write(c, &mut m, p, 1, 0);
        }
        let saved = save(c, n, 0);
        for sel in [n as u8, n as u8 | 0x10, n as u8 | 0x80] {
            let mut input = vec![sel];
            input.extend_from_slice(&saved);
            std::fs::write(dir.join(format!("sample-{n}-{sel:02x}")), input).unwrap();
        }
        // SAFETY: a live handle.
        unsafe { kvc_kvq_cells_free(c) };
    }
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: OnceLock<()> = OnceLock::new();
    SEEDS.get_or_init(|| {
        if let Some(d) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&d));
        }
    });
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let n = (sel & 0x0f) as usize;
    let dest = if sel & 0x10 != 0 { -1 } else { 3 };
    let mut bytes = bytes.to_vec();
    if sel & 0x80 != 0 && bytes.len() >= 32 {
        let body = bytes.len() - 32;
        let sum = blake3::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(sum.as_bytes());
    }
    let c = new_cells();
    let mut m = mains();
    // the cells already serve sequence 1 elsewhere (cells 0..8)
    {
        let pos: Vec<i32> = (0..8).collect();
        let seqs = vec![1i32; 8];
        let idx: Vec<i64> = (0..8).collect();
        let rows = vec![0.5f32; 8 * H * D];
        // SAFETY: valid pointers and lengths.
        unsafe {
            assert_eq!(
                kvc_kvq_cells_begin_ubatch(c, pos.as_ptr(), seqs.as_ptr(), idx.as_ptr(), 8),
                KvcStatus::KVC_OK
            );
            for (t, mt) in m.iter_mut().enumerate() {
                let st = kvc_kvq_cells_write(
                    c,
                    t as u32,
                    rows.as_ptr(),
                    rows.len(),
                    idx.as_ptr(),
                    8,
                    mt.as_mut_ptr(),
                    mt.len(),
                );
                assert_eq!(st, KvcStatus::KVC_OK);
            }
        }
    }
    let st = load(c, &bytes, n, dest);
    match st {
        KvcStatus::KVC_OK => {
            // every cell reads, for a query past the loaded ones
            let seq = if dest < 0 { 3 } else { dest };
            write(c, &mut m, 16, 1, seq);
            let q = [0.5f32; D];
            let mut s = [0f32; N_CELLS as usize];
            let w = [1f32; N_CELLS as usize];
            let mut acc = [0f32; D];
            // SAFETY: valid pointers and lengths.
            unsafe {
                for head in 0..H as u32 {
                    let st = kvc_kvq_cells_scores(
                        c, 0, m[0].as_ptr(), m[0].len(), head, 0, N_CELLS as usize, 0,
                        q.as_ptr(), 1, s.as_mut_ptr(), s.len(),
                    );
                    assert_eq!(st, KvcStatus::KVC_OK);
                    let st = kvc_kvq_cells_accumulate(
                        c, 1, m[1].as_ptr(), m[1].len(), head, 0, N_CELLS as usize, 0,
                        w.as_ptr(), w.len(), 1, acc.as_mut_ptr(),
                    );
                    assert_eq!(st, KvcStatus::KVC_OK);
                }
            }
            // and saves again into bytes that load into fresh cells
            let again = save(c, n, seq);
            let fresh = new_cells();
            assert_eq!(load(fresh, &again, n, 3), KvcStatus::KVC_OK);
            // SAFETY: a live handle.
            unsafe { kvc_kvq_cells_free(fresh) };
        }
        KvcStatus::KVC_CORRUPT_DATA | KvcStatus::KVC_INVALID_ARGUMENT => {}
        other => panic!("load gave {other:?}"),
    }
    // SAFETY: a live handle.
    unsafe { kvc_kvq_cells_free(c) };
});
