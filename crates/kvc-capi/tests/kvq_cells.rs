//! `kvc_kvq_cells_*` and `kvc_kvq_get_protections` through the C ABI: a version-3 plan's
//! protections, a cache of two tensors written and read (a sink row reads back its f16
//! values), the sizes reported, and the refusals an engine's mistakes get (statuses, never a
//! panic).

use std::ptr;

use kvc::kvq::{kvc_kvq_free, kvc_kvq_get_protections, kvc_kvq_new_from_plan, KvcKvqProtections};
use kvc::kvq_block::kvc_kvq_block_rotate;
use kvc::kvq_cells::*;
use kvc::KvcStatus;

const D: usize = 64;
const H: usize = 2;

fn plan(extra: &str) -> String {
    format!(
        r#"{{"format": "kvc-kvq-plan", "version": 3, "method": "lm", "seed": 7743485870786113841,
            "head_dim": 64, "n_kv_head": 2, {extra}
            "layers": [{{"k_bits": 4, "v_bits": 3}}]}}"#
    )
}

#[test]
fn a_version_3_plan_gives_its_protections() {
    let json =
        plan(r#""sink_tokens": 4, "recent_tokens": 64, "recent_bits": 8, "k_center": true,"#);
    let mut kvq = ptr::null_mut();
    // SAFETY: valid pointers and lengths.
    unsafe {
        assert_eq!(
            kvc_kvq_new_from_plan(json.as_ptr().cast(), json.len(), &mut kvq),
            KvcStatus::KVC_OK
        );
        let mut p = KvcKvqProtections::default();
        assert_eq!(kvc_kvq_get_protections(kvq, &mut p), KvcStatus::KVC_OK);
        assert_eq!(
            p,
            KvcKvqProtections {
                sink: 4,
                window: 64,
                window_bits: 8,
                k_center: 1
            }
        );
        kvc_kvq_free(kvq);
    }
    // a center without a sink, recent_bits in version 2, bits out of range: refused plans
    for bad in [
        plan(r#""sink_tokens": 0, "recent_tokens": 64, "recent_bits": 8, "k_center": true,"#),
        plan(r#""recent_tokens": 64, "recent_bits": 9,"#),
        plan(r#""recent_bits": 8,"#),
        plan(r#""recent_tokens": 64, "recent_bits": 8,"#)
            .replace("\"version\": 3", "\"version\": 2"),
    ] {
        let mut kvq = ptr::null_mut();
        // SAFETY: valid pointers and lengths.
        let st = unsafe { kvc_kvq_new_from_plan(bad.as_ptr().cast(), bad.len(), &mut kvq) };
        assert_ne!(st, KvcStatus::KVC_OK, "{bad}");
        assert!(kvq.is_null());
    }
}

fn tensors() -> [KvcKvqCellsTensor; 2] {
    let k = KvcKvqCellsTensor {
        head_dim: D as u32,
        n_kv_head: H as u32,
        bits: 4,
        center: 1,
    };
    [
        k,
        KvcKvqCellsTensor {
            bits: 3,
            center: 0,
            ..k
        },
    ]
}

const CFG: KvcKvqCellsConfig = KvcKvqCellsConfig {
    n_cells: 32,
    sink: 2,
    window: 4,
    window_bits: 8,
};

#[test]
fn cells_write_and_read_through_the_c_abi() {
    let ts = tensors();
    let mut cells = ptr::null_mut();
    // SAFETY: every pointer below is valid for the lengths passed.
    unsafe {
        assert_eq!(
            kvc_kvq_cells_new(&CFG, ts.as_ptr(), 2, &mut cells),
            KvcStatus::KVC_OK
        );
        let mut cb = [0usize; 2];
        for (t, c) in cb.iter_mut().enumerate() {
            assert_eq!(
                kvc_kvq_cells_main_cell_bytes(cells, t as u32, c),
                KvcStatus::KVC_OK
            );
        }
        assert_eq!(cb, [H * (2 + D / 2), H * (2 + D * 3 / 8)]);
        let mut mains = [vec![0u8; 32 * cb[0]], vec![0u8; 32 * cb[1]]];
        let n = 12usize;
        let pos: Vec<i32> = (0..n as i32).collect();
        let seq = vec![0i32; n];
        let idx: Vec<i64> = (0..n as i64).map(|p| 31 - p).collect();
        let rows: Vec<f32> = (0..n * H * D)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        assert_eq!(
            kvc_kvq_cells_begin_ubatch(cells, pos.as_ptr(), seq.as_ptr(), idx.as_ptr(), n),
            KvcStatus::KVC_OK
        );
        for (t, m) in mains.iter_mut().enumerate() {
            assert_eq!(
                kvc_kvq_cells_write(
                    cells,
                    t as u32,
                    rows.as_ptr(),
                    rows.len(),
                    idx.as_ptr(),
                    n,
                    m.as_mut_ptr(),
                    m.len()
                ),
                KvcStatus::KVC_OK
            );
        }
        // position 0 (cell 31) is a sink row: its score is the f16 row's dot product
        let mut q: Vec<f32> = (0..D).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut q_rot = q.clone();
        assert_eq!(
            kvc_kvq_block_rotate(D as u32, q_rot.as_mut_ptr(), D),
            KvcStatus::KVC_OK
        );
        let mut s = [0f32; 1];
        assert_eq!(
            kvc_kvq_cells_scores(
                cells,
                0,
                mains[0].as_ptr(),
                mains[0].len(),
                1,
                31,
                1,
                11,
                q_rot.as_ptr(),
                1,
                s.as_mut_ptr(),
                1
            ),
            KvcStatus::KVC_OK
        );
        let want: f32 = q
            .iter_mut()
            .zip(&rows[D..2 * D])
            .map(|(a, &b)| *a * half::f16::from_f32(b).to_f32())
            .sum();
        assert!(
            (s[0] - want).abs() < 1e-3 * (1.0 + want.abs()),
            "{} vs {want}",
            s[0]
        );
        let mut acc = vec![0f32; D];
        let w = [1f32; 32];
        assert_eq!(
            kvc_kvq_cells_accumulate(
                cells,
                1,
                mains[1].as_ptr(),
                mains[1].len(),
                0,
                0,
                32,
                11,
                w.as_ptr(),
                32,
                1,
                acc.as_mut_ptr()
            ),
            KvcStatus::KVC_OK
        );
        // every written cell's V row of KV head 0 with weight 1, in the rotated basis, against
        // the exact rows rotated: positions 0-1 are f16 sinks and 8-11 8-bit window rows (both
        // near exact); 2-7 are 3-bit main rows, whose Lloyd-Max error (about -14.6 dB, 0.19
        // relative per row) over 6 of the 12 rows: the sum measures 0.172 relative L2 on these
        // fixed rows, bounded at 0.2 (an unrotated sum, or a main row read as another format,
        // is off by far more); the unwritten cells' zero rows add nothing
        let mut want = vec![0f32; D];
        for p in 0..n {
            for (w, &x) in want.iter_mut().zip(&rows[p * H * D..p * H * D + D]) {
                *w += x;
            }
        }
        assert_eq!(
            kvc_kvq_block_rotate(D as u32, want.as_mut_ptr(), D),
            KvcStatus::KVC_OK
        );
        let err: f32 = acc
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt();
        let norm: f32 = want.iter().map(|b| b * b).sum::<f32>().sqrt();
        let rel = err / norm;
        assert!(rel < 0.2, "accumulated V rows off by {rel} (relative L2)");
        let (mut k, mut v, mut shared) = (0usize, 0usize, 0usize);
        assert_eq!(
            kvc_kvq_cells_bytes_held(cells, 0, &mut k),
            KvcStatus::KVC_OK
        );
        assert_eq!(
            kvc_kvq_cells_bytes_held(cells, 1, &mut v),
            KvcStatus::KVC_OK
        );
        assert_eq!(
            kvc_kvq_cells_bytes_held(cells, KVC_KVQ_CELLS_SHARED, &mut shared),
            KvcStatus::KVC_OK
        );
        assert!(k > 0 && v > 0 && shared > 0);
        assert_eq!(
            kvc_kvq_cells_bytes_held(cells, 2, &mut k),
            KvcStatus::KVC_INVALID_ARGUMENT
        );

        // refusals: a write of another ubatch's cells, a second write, a missed write
        let one = [5i64];
        let one_pos = [12i32];
        assert_eq!(
            kvc_kvq_cells_begin_ubatch(cells, one_pos.as_ptr(), seq.as_ptr(), one.as_ptr(), 1),
            KvcStatus::KVC_OK
        );
        let other = [6i64];
        assert_eq!(
            kvc_kvq_cells_write(
                cells,
                0,
                rows.as_ptr(),
                H * D,
                other.as_ptr(),
                1,
                mains[0].as_mut_ptr(),
                mains[0].len()
            ),
            KvcStatus::KVC_INVALID_STATE
        );
        assert_eq!(
            kvc_kvq_cells_write(
                cells,
                0,
                rows.as_ptr(),
                H * D,
                one.as_ptr(),
                1,
                mains[0].as_mut_ptr(),
                mains[0].len()
            ),
            KvcStatus::KVC_OK
        );
        assert_eq!(
            kvc_kvq_cells_write(
                cells,
                0,
                rows.as_ptr(),
                H * D,
                one.as_ptr(),
                1,
                mains[0].as_mut_ptr(),
                mains[0].len()
            ),
            KvcStatus::KVC_INVALID_STATE
        );
        assert_eq!(
            kvc_kvq_cells_begin_ubatch(cells, one_pos.as_ptr(), seq.as_ptr(), one.as_ptr(), 1),
            KvcStatus::KVC_INVALID_STATE,
            "tensor 1 missed its write"
        );
        assert_eq!(
            kvc_kvq_cells_release(cells, 32),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert_eq!(
            kvc_kvq_cells_copy(cells, 0, 4, 8, 1),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert_eq!(kvc_kvq_cells_clear(cells), KvcStatus::KVC_OK);
        assert_eq!(
            kvc_kvq_cells_begin_ubatch(
                ptr::null_mut(),
                pos.as_ptr(),
                seq.as_ptr(),
                idx.as_ptr(),
                1
            ),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        kvc_kvq_cells_free(cells);
    }
}

#[test]
fn bad_configurations_are_refused() {
    let ts = tensors();
    let invalid = KvcStatus::KVC_INVALID_ARGUMENT;
    let dim96 = KvcKvqCellsTensor {
        head_dim: 96,
        ..ts[1]
    };
    let bits300 = KvcKvqCellsConfig {
        window_bits: 300,
        ..CFG
    };
    let cases = [
        (KvcKvqCellsConfig { sink: 0, ..CFG }, ts[0], invalid),
        (CFG, dim96, KvcStatus::KVC_UNSUPPORTED),
        (CFG, KvcKvqCellsTensor { center: 2, ..ts[1] }, invalid),
        (bits300, ts[1], invalid),
    ];
    for (cfg, t, want) in cases {
        let mut cells = ptr::null_mut();
        // SAFETY: valid pointers.
        let st = unsafe { kvc_kvq_cells_new(&cfg, &t, 1, &mut cells) };
        assert_eq!(st, want, "{cfg:?} {t:?}");
        assert!(cells.is_null());
    }
    let mut cells = ptr::null_mut();
    // SAFETY: no tensors.
    let st = unsafe { kvc_kvq_cells_new(&CFG, ts.as_ptr(), 0, &mut cells) };
    assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
}

/// Cells of sequence 0 at positions 0..12 in cells `31 - p`, one ubatch.
///
/// # Safety
/// None beyond the calls' own (every pointer is valid).
unsafe fn written_cells() -> (*mut KvcKvqCells, [Vec<u8>; 2]) {
    let ts = tensors();
    let mut cells = ptr::null_mut();
    // SAFETY: valid pointers and lengths.
    unsafe {
        assert_eq!(
            kvc_kvq_cells_new(&CFG, ts.as_ptr(), 2, &mut cells),
            KvcStatus::KVC_OK
        );
        let mut mains = [
            vec![0u8; 32 * H * (2 + D / 2)],
            vec![0u8; 32 * H * (2 + D * 3 / 8)],
        ];
        let n = 12usize;
        let pos: Vec<i32> = (0..n as i32).collect();
        let seq = vec![0i32; n];
        let idx: Vec<i64> = (0..n as i64).map(|p| 31 - p).collect();
        let rows: Vec<f32> = (0..n * H * D)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0 + (i % 7) as f32)
            .collect();
        assert_eq!(
            kvc_kvq_cells_begin_ubatch(cells, pos.as_ptr(), seq.as_ptr(), idx.as_ptr(), n),
            KvcStatus::KVC_OK
        );
        for (t, m) in mains.iter_mut().enumerate() {
            assert_eq!(
                kvc_kvq_cells_write(
                    cells,
                    t as u32,
                    rows.as_ptr(),
                    rows.len(),
                    idx.as_ptr(),
                    n,
                    m.as_mut_ptr(),
                    m.len()
                ),
                KvcStatus::KVC_OK
            );
        }
        (cells, mains)
    }
}

#[test]
fn cells_save_and_load_through_the_c_abi() {
    // SAFETY: every pointer below is valid for the lengths passed.
    unsafe {
        let (cells, mains) = written_cells();
        let ids: Vec<u32> = (0..12).map(|p| 31 - p).collect();
        let pos: Vec<i32> = (0..12).collect();
        let mut len = 0usize;
        assert_eq!(
            kvc_kvq_cells_save(cells, ids.as_ptr(), 12, 0, ptr::null_mut(), 0, &mut len),
            KvcStatus::KVC_OK
        );
        assert!(len > 0);
        let mut small = vec![0xAAu8; len - 1];
        let mut got = 0usize;
        assert_eq!(
            kvc_kvq_cells_save(
                cells,
                ids.as_ptr(),
                12,
                0,
                small.as_mut_ptr(),
                small.len(),
                &mut got
            ),
            KvcStatus::KVC_BUFFER_TOO_SMALL
        );
        assert_eq!(got, len);
        assert!(
            small.iter().all(|&b| b == 0xAA),
            "nothing written on an error"
        );
        let mut saved = vec![0u8; len];
        assert_eq!(
            kvc_kvq_cells_save(
                cells,
                ids.as_ptr(),
                12,
                0,
                saved.as_mut_ptr(),
                len,
                &mut got
            ),
            KvcStatus::KVC_OK
        );
        assert_eq!(&saved[..8], b"KVCQCELS");
        // load into fresh cells for sequence 5: the same scores for every cell
        let ts = tensors();
        let mut back = ptr::null_mut();
        assert_eq!(
            kvc_kvq_cells_new(&CFG, ts.as_ptr(), 2, &mut back),
            KvcStatus::KVC_OK
        );
        let mut bad = saved.clone();
        bad[40] ^= 1;
        assert_eq!(
            kvc_kvq_cells_load(
                back,
                bad.as_ptr(),
                bad.len(),
                ids.as_ptr(),
                pos.as_ptr(),
                12,
                5
            ),
            KvcStatus::KVC_CORRUPT_DATA
        );
        assert_eq!(
            kvc_kvq_cells_load(back, saved.as_ptr(), len, ids.as_ptr(), pos.as_ptr(), 11, 5),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert_eq!(
            kvc_kvq_cells_load(back, saved.as_ptr(), len, ids.as_ptr(), pos.as_ptr(), 12, 5),
            KvcStatus::KVC_OK
        );
        // a read needs a ubatch for its query position: write position 12 in both
        let q: Vec<f32> = (0..D).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut scores = Vec::new();
        for (h, seq) in [(cells, 0i32), (back, 5)] {
            let mut m = mains.clone();
            let row = vec![0.25f32; H * D];
            assert_eq!(
                kvc_kvq_cells_begin_ubatch(h, &12, &seq, &19i64, 1),
                KvcStatus::KVC_OK
            );
            for (t, mt) in m.iter_mut().enumerate() {
                assert_eq!(
                    kvc_kvq_cells_write(
                        h,
                        t as u32,
                        row.as_ptr(),
                        row.len(),
                        &19i64,
                        1,
                        mt.as_mut_ptr(),
                        mt.len()
                    ),
                    KvcStatus::KVC_OK
                );
            }
            let mut s = vec![0f32; 32];
            assert_eq!(
                kvc_kvq_cells_scores(
                    h,
                    0,
                    m[0].as_ptr(),
                    m[0].len(),
                    1,
                    0,
                    32,
                    0,
                    q.as_ptr(),
                    1,
                    s.as_mut_ptr(),
                    32
                ),
                KvcStatus::KVC_OK
            );
            scores.push(s);
        }
        assert_eq!(scores[0], scores[1]);
        kvc_kvq_cells_free(cells);
        kvc_kvq_cells_free(back);
    }
}
