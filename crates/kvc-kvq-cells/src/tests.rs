//! Reads checked against an independent model of the semantics, batch independence, the
//! rows held, and refusals.

use super::*;
use half::f16;
use kvc_kvq::config::DEFAULT_SEED;
use kvc_kvq::{Method, RowCodec};

const D: usize = 64;
const H: usize = 2;

fn cfg(sink: u32, window: u32) -> CellsConfig {
    CellsConfig {
        n_cells: 256,
        sink,
        window,
        window_bits: 8,
    }
}

/// Tensor 0 (K, 3 bits, centered when asked) and tensor 1 (V, 3 bits).
fn specs(center: bool) -> [TensorSpec; 2] {
    let t = TensorSpec {
        head_dim: D as u32,
        n_kv_head: H as u32,
        bits: 3,
        center,
    };
    [t, TensorSpec { center: false, ..t }]
}

fn new_cells(sink: u32, window: u32, center: bool) -> (KvqCells, Vec<Vec<u8>>) {
    let c = KvqCells::new(cfg(sink, window), &specs(center)).unwrap();
    let mains = (0..2)
        .map(|t| vec![0u8; 256 * c.main_cell_bytes(t).unwrap()])
        .collect();
    (c, mains)
}

/// V rows: K rows of another token.
fn v_rows(t: usize) -> Vec<f32> {
    token_rows(t + 5000)
}

/// One ubatch: positions, sequences and cells, then both tensors' rows.
fn ubatch(
    cells: &mut KvqCells,
    mains: &mut [Vec<u8>],
    pos: &[i32],
    seq: &[i32],
    idx: &[i64],
    k: &[f32],
    v: &[f32],
) {
    cells.begin_ubatch(pos, seq, idx).unwrap();
    cells.write(0, k, idx, &mut mains[0]).unwrap();
    cells.write(1, v, idx, &mut mains[1]).unwrap();
}

/// Rows with a large per-channel offset (what centers are for) and a token-dependent part.
fn token_rows(t: usize) -> Vec<f32> {
    let mut s = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..H * D)
        .map(|e| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let noise = (s >> 11) as f32 / (1u64 << 53) as f32 - 0.5;
            let offset = if e % 7 == 0 {
                4.0
            } else {
                0.3 * ((e % 5) as f32 - 2.0)
            };
            offset + noise * 2.0 + if t < 4 { 3.0 } else { 0.0 }
        })
        .collect()
}

/// Cell of position `p`: scattered, so that decisions come from positions, not indices.
fn cell_of(p: usize) -> i64 {
    ((p * 97 + 13) % 256) as i64
}

fn codec(bits: u8) -> RowCodec {
    RowCodec::new(Method::LloydMax, bits, D, DEFAULT_SEED).unwrap()
}

fn round_trip(c: &RowCodec, x: &[f32]) -> Vec<f32> {
    let mut packed = vec![0u8; c.row_bytes()];
    c.quantize_row(x, &mut packed).unwrap();
    let mut out = vec![0f32; D];
    c.dequantize_row(&packed, &mut out).unwrap();
    out
}

/// Writes positions `first..first + n` of sequence 0 as one ubatch.
fn write_span(cells: &mut KvqCells, mains: &mut [Vec<u8>], first: usize, n: usize) {
    let pos: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
    let seq = vec![0; n];
    let idx: Vec<i64> = (first..first + n).map(cell_of).collect();
    let k: Vec<f32> = (first..first + n).flat_map(token_rows).collect();
    let v: Vec<f32> = (first..first + n).flat_map(v_rows).collect();
    ubatch(cells, mains, &pos, &seq, &idx, &k, &v);
}

fn query(t: usize, g: usize) -> Vec<f32> {
    let mut q: Vec<f32> = (0..g * D)
        .map(|e| ((e * 31 + t * 7) % 17) as f32 / 8.0 - 1.0)
        .collect();
    for r in q.chunks_exact_mut(D) {
        codec(3).rotation().rotate(r);
    }
    q
}

/// The score of each visible cell for the query of ubatch token `token` at position `qp`.
fn visible_scores(
    cells: &KvqCells,
    mains: &[Vec<u8>],
    token: u32,
    qp: usize,
    head: u32,
) -> Vec<f32> {
    let q = query(qp, 1);
    (0..=qp)
        .map(|p| {
            let mut s = [0f32; 1];
            cells
                .scores(0, &mains[0], head, cell_of(p) as u32, 1, token, &q, &mut s)
                .unwrap();
            s[0]
        })
        .collect()
}

/// The weighted V sum of every visible cell (weights from the position) for the query.
fn visible_values(
    cells: &KvqCells,
    mains: &[Vec<u8>],
    token: u32,
    qp: usize,
    head: u32,
) -> Vec<f32> {
    let mut w = vec![0f32; 256];
    for p in 0..=qp {
        w[cell_of(p) as usize] = 1.0 / (1.0 + p as f32);
    }
    let mut acc = vec![0f32; D];
    cells
        .accumulate(1, &mains[1], head, 0, 256, token, &w, &mut acc)
        .unwrap();
    acc
}

#[test]
fn batched_and_one_token_writes_read_the_same() {
    for &(sink, window, center) in &[(4, 16, true), (0, 16, false), (2, 1, false), (4, 0, false)] {
        let (mut one, mut main_one) = new_cells(sink, window, center);
        let (mut batched, mut main_b) = new_cells(sink, window, center);
        let mut expected = Vec::new();
        for p in 0..150 {
            write_span(&mut one, &mut main_one, p, 1);
            expected.push((
                visible_scores(&one, &main_one, 0, p, 1),
                visible_values(&one, &main_one, 0, p, 1),
            ));
        }
        let mut p = 0;
        for n in [37, 1, 64, 48] {
            write_span(&mut batched, &mut main_b, p, n);
            for t in 0..n {
                let got = (
                    visible_scores(&batched, &main_b, t as u32, p + t, 1),
                    visible_values(&batched, &main_b, t as u32, p + t, 1),
                );
                assert_eq!(
                    got,
                    expected[p + t],
                    "position {} (sink {sink} window {window})",
                    p + t
                );
            }
            p += n;
        }
    }
}

#[test]
fn reads_match_an_independent_model() {
    let (sink, window) = (4usize, 16usize);
    let (mut cells, mut main) = new_cells(sink as u32, window as u32, true);
    write_span(&mut cells, &mut main, 0, 100);
    let (c8, c3) = (codec(8), codec(3));
    // the center: mean over positions sink ..= sink + window of the 8-bit rows, f16
    let mut center = vec![0f32; H * D];
    for (e, cv) in center.iter_mut().enumerate() {
        let (hd, i) = (e / D, e % D);
        let s: f64 = (sink..=sink + window)
            .map(|p| f64::from(round_trip(&c8, &token_rows(p)[hd * D..(hd + 1) * D])[i]))
            .sum();
        *cv = f16::from_f64(s / (window + 1) as f64).to_f32();
    }
    assert_eq!(cells.center_of(0, 0).unwrap(), &center[..]);
    assert!(cells.center_of(1, 0).is_none(), "V has no center");
    let qp = 99usize;
    for hd in 0..H {
        let mut q = query(qp, 1);
        let got = visible_scores(&cells, &main, 99, qp, hd as u32);
        codec(3).rotation().unrotate(&mut q);
        for (p, &got_p) in got.iter().enumerate() {
            let x = &token_rows(p)[hd * D..(hd + 1) * D];
            let cc = &center[hd * D..(hd + 1) * D];
            let k: Vec<f32> = if p < sink {
                x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
            } else if qp - p < window {
                round_trip(&c8, x)
            } else {
                let w8 = round_trip(&c8, x);
                let diff: Vec<f32> = w8.iter().zip(cc).map(|(a, b)| a - b).collect();
                round_trip(&c3, &diff)
                    .iter()
                    .zip(cc)
                    .map(|(a, b)| a + b)
                    .collect()
            };
            let want: f32 = q.iter().zip(&k).map(|(a, b)| a * b).sum();
            let tol = 1e-4
                * q.iter().map(|v| v.abs()).sum::<f32>()
                * k.iter().map(|v| v.abs()).fold(0.0, f32::max);
            assert!(
                (got_p - want).abs() <= tol,
                "head {hd} position {p}: {} vs {want}",
                got_p
            );
        }
    }
}

#[test]
fn accumulate_matches_an_independent_model() {
    let (sink, window) = (2usize, 8usize);
    let (mut cells, mut main) = new_cells(sink as u32, window as u32, false);
    write_span(&mut cells, &mut main, 0, 40);
    let (c8, c3) = (codec(8), codec(3));
    let qp = 39usize;
    let g = 2;
    // weights for every cell 0..256 (cells of positions 0..=39 and others with weight 0)
    let n = 256usize;
    let mut w = vec![0f32; g * n];
    for p in 0..=qp {
        for j in 0..g {
            w[j * n + cell_of(p) as usize] = 1.0 + (p as f32 + j as f32) / 10.0;
        }
    }
    let mut acc = vec![0f32; g * D];
    cells
        .accumulate(1, &main[1], 1, 0, n, 39, &w, &mut acc)
        .unwrap();
    for a in acc.chunks_exact_mut(D) {
        c3.rotation().unrotate(a);
    }
    for j in 0..g {
        let mut want = vec![0f32; D];
        for p in 0..=qp {
            let x = &v_rows(p)[D..2 * D];
            let v: Vec<f32> = if p < sink {
                x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
            } else if qp - p < window {
                round_trip(&c8, x)
            } else {
                round_trip(&c3, &round_trip(&c8, x))
            };
            let wj = w[j * n + cell_of(p) as usize];
            for (a, b) in want.iter_mut().zip(&v) {
                *a += wj * b;
            }
        }
        for (a, b) in acc[j * D..(j + 1) * D].iter().zip(&want) {
            assert!(
                (a - b).abs() < 1e-3 * (1.0 + b.abs()),
                "query {j}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn rows_held_follow_the_window() {
    let (mut cells, mut main) = new_cells(4, 16, true);
    let base = cells.bytes_held();
    write_span(&mut cells, &mut main, 0, 64);
    assert_eq!(cells.sink_rows(), 4);
    // positions 48..=63 stay in the window; 4..=47 leave it within the ubatch (scratch)
    assert_eq!((cells.window_rows(), cells.scratch_rows()), (16, 44));
    let after_prefill = cells.bytes_held();
    write_span(&mut cells, &mut main, 64, 1);
    // positions > 64 - 16 = 48: 49..=64
    assert_eq!((cells.window_rows(), cells.scratch_rows()), (16, 0));
    for p in 65..120 {
        write_span(&mut cells, &mut main, p, 1);
        assert_eq!(cells.window_rows(), 16);
    }
    let decoding = cells.bytes_held();
    assert!(
        base < decoding && decoding < after_prefill,
        "{base} {decoding} {after_prefill}"
    );
    // releasing an older cell gives its window row back; releasing the last ubatch's cell
    // undoes that ubatch: position 103's window row, which it dropped, is read again
    cells.release(cell_of(110) as u32).unwrap();
    assert_eq!(cells.window_rows(), 15);
    cells.release(cell_of(119) as u32).unwrap();
    assert_eq!(cells.window_rows(), 15);
    assert_eq!(cells.read_of(cell_of(103) as u32, 119), CellRead::Window);
    cells.clear();
    assert_eq!((cells.window_rows(), cells.sink_rows()), (0, 0));
    assert!(cells.center_of(0, 0).is_none());
}

#[test]
fn window_storage_shrinks_after_sequences_leave() {
    // sequence 0 alone, and sequence 0 beside five others that are then released: the
    // window slots are renumbered and the reads are the same
    let (mut alone, mut main_a) = new_cells(2, 8, true);
    let (mut crowd, mut main_c) = new_cells(2, 8, true);
    let cell = |s: usize, p: usize| (s * 40 + p) as i64;
    for p in 0..30usize {
        let k = token_rows(p);
        let v = v_rows(p);
        ubatch(
            &mut alone,
            &mut main_a,
            &[p as i32],
            &[0],
            &[cell(0, p)],
            &k,
            &v,
        );
        let pos = vec![p as i32; 6];
        let seq: Vec<i32> = (0..6).collect();
        let idx: Vec<i64> = (0..6).map(|s| cell(s, p)).collect();
        let kk: Vec<f32> = (0..6).flat_map(|_| k.clone()).collect();
        let vv: Vec<f32> = (0..6).flat_map(|_| v.clone()).collect();
        ubatch(&mut crowd, &mut main_c, &pos, &seq, &idx, &kk, &vv);
    }
    let before = crowd.bytes_held();
    for s in 1..6 {
        for p in 0..30 {
            crowd.release(cell(s, p) as u32).unwrap();
        }
    }
    let (k, v) = (token_rows(30), v_rows(30));
    ubatch(&mut alone, &mut main_a, &[30], &[0], &[cell(0, 30)], &k, &v);
    ubatch(&mut crowd, &mut main_c, &[30], &[0], &[cell(0, 30)], &k, &v);
    assert!(
        crowd.bytes_held() < before,
        "{} < {before}",
        crowd.bytes_held()
    );
    let q = query(30, 1);
    let mut a = vec![0f32; 31];
    let mut b = vec![0f32; 31];
    alone
        .scores(0, &main_a[0], 1, 0, 31, 0, &q, &mut a)
        .unwrap();
    crowd
        .scores(0, &main_c[0], 1, 0, 31, 0, &q, &mut b)
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn sequences_keep_their_own_sink_window_and_center() {
    let (mut cells, mut main) = new_cells(2, 8, true);
    // two sequences interleaved in one ubatch, cells 0..40 and 100..140
    let pos: Vec<i32> = (0..40).flat_map(|p| [p, p]).collect();
    let seq: Vec<i32> = (0..40).flat_map(|_| [3, 7]).collect();
    let idx: Vec<i64> = (0..40).flat_map(|p| [p as i64, 100 + p as i64]).collect();
    let rows: Vec<f32> = (0..40)
        .flat_map(|p| {
            let mut a = token_rows(p);
            a.extend(token_rows(p + 1000));
            a
        })
        .collect();
    ubatch(&mut cells, &mut main, &pos, &seq, &idx, &rows, &rows);
    assert_eq!(cells.sink_rows(), 4);
    assert_ne!(cells.center_of(0, 3), cells.center_of(0, 7));
    assert!(cells.center_of(0, 3).is_some() && cells.center_of(0, 7).is_some());
    // the last token of sequence 7 (ubatch token 79) reads its own position 39 from the
    // window and position 1 from the sink
    assert_eq!(cells.read_of(139, 39), CellRead::Window);
    assert_eq!(cells.read_of(101, 39), CellRead::Sink);
    assert_eq!(cells.read_of(110, 39), CellRead::Main);
}

#[test]
fn copied_cells_read_the_same() {
    let (mut cells, mut main) = new_cells(4, 16, true);
    let pos: Vec<i32> = (0..60).collect();
    let idx: Vec<i64> = (0..60).collect();
    let rows: Vec<f32> = (0..60).flat_map(token_rows).collect();
    ubatch(&mut cells, &mut main, &pos, &[0; 60], &idx, &rows, &rows);
    for (t, m) in main.iter_mut().enumerate() {
        let cb = cells.main_cell_bytes(t as u32).unwrap();
        m.copy_within(0..60 * cb, 128 * cb);
    }
    cells.copy_cells(0, 128, 60, 5).unwrap();
    let q = query(59, 1);
    let mut a = vec![0f32; 60];
    let mut b = vec![0f32; 60];
    cells.scores(0, &main[0], 0, 0, 60, 59, &q, &mut a).unwrap();
    cells
        .scores(0, &main[0], 0, 128, 60, 59, &q, &mut b)
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(cells.center_of(0, 5), cells.center_of(0, 0));
    assert!(
        cells.copy_cells(0, 30, 60, 5).is_err(),
        "overlapping ranges are refused"
    );
}

#[test]
fn non_finite_rows_read_nan() {
    let (mut cells, mut main) = new_cells(1, 4, false);
    let mut rows: Vec<f32> = (0..10).flat_map(token_rows).collect();
    rows[0] = f32::INFINITY; // the sink row of head 0
    rows[3 * H * D + 5] = f32::NAN; // position 3, head 0: a window row, later a main row
    let pos: Vec<i32> = (0..10).collect();
    let idx: Vec<i64> = (0..10).collect();
    ubatch(&mut cells, &mut main, &pos, &[0; 10], &idx, &rows, &rows);
    let q = query(9, 1);
    let mut s = vec![0f32; 10];
    cells.scores(0, &main[0], 0, 0, 10, 9, &q, &mut s).unwrap();
    assert!(!s[0].is_finite());
    assert!(
        s[3].is_nan(),
        "position 3 is read from its poisoned main row"
    );
    assert!(s[1..3].iter().chain(&s[4..]).all(|v| v.is_finite()));
    // the query at position 4 reads position 3 from the ubatch's scratch (decoded once)
    let q = query(4, 1);
    let mut s = vec![0f32; 5];
    cells.scores(0, &main[0], 0, 0, 5, 4, &q, &mut s).unwrap();
    assert!(
        s[3].is_nan(),
        "position 3 is read from its poisoned window row"
    );
    assert!(s[1..3].iter().chain(&s[4..]).all(|v| v.is_finite()));
    let w = [0.0, 0.25, 0.25, 0.25, 0.25];
    let mut acc = vec![0f32; D];
    cells
        .accumulate(0, &main[0], 0, 0, 5, 4, &w, &mut acc)
        .unwrap();
    assert!(
        acc.iter().any(|v| v.is_nan()),
        "a poisoned window row of non-zero weight"
    );
    let w = [0.0, 0.5, 0.5, 0.0, 0.0];
    let mut acc = vec![0f32; D];
    cells
        .accumulate(0, &main[0], 0, 0, 5, 4, &w, &mut acc)
        .unwrap();
    assert!(
        acc.iter().all(|v| v.is_finite()),
        "weight 0 skips the poisoned row"
    );
}

#[test]
fn bad_calls_are_refused() {
    let t = specs(true);
    assert!(
        KvqCells::new(cfg(0, 16), &t).is_err(),
        "a center without a sink"
    );
    assert!(
        KvqCells::new(cfg(4, 0), &t).is_err(),
        "a center without a window"
    );
    assert!(KvqCells::new(cfg(4, 16), &[]).is_err(), "no tensors");
    let bad_dim = TensorSpec {
        head_dim: 96,
        ..t[1]
    };
    assert!(KvqCells::new(cfg(4, 16), &[bad_dim]).is_err());
    assert!(KvqCells::new(
        CellsConfig {
            window_bits: 9,
            ..cfg(4, 16)
        },
        &t
    )
    .is_err());
    assert!(KvqCells::new(
        CellsConfig {
            n_cells: 0,
            ..cfg(4, 16)
        },
        &t
    )
    .is_err());
    let (mut cells, mut main) = new_cells(4, 16, false);
    let rows = token_rows(0);
    assert!(
        matches!(
            cells.write(0, &rows, &[0], &mut main[0]),
            Err(Error::State { .. })
        ),
        "a write before its ubatch"
    );
    assert!(cells.begin_ubatch(&[0, 1], &[0], &[0, 1]).is_err());
    assert!(cells.begin_ubatch(&[-1], &[0], &[0]).is_err());
    assert!(cells.begin_ubatch(&[0], &[0], &[256]).is_err());
    assert!(
        cells.begin_ubatch(&[0, 1], &[0, 0], &[3, 3]).is_err(),
        "a cell twice"
    );
    cells.begin_ubatch(&[0], &[0], &[0]).unwrap();
    assert!(
        cells.write(0, &rows, &[1], &mut main[0]).is_err(),
        "cells other than the ubatch's"
    );
    assert!(cells.write(0, &rows[1..], &[0], &mut main[0]).is_err());
    assert!(cells.write(0, &rows, &[0], &mut main[0][1..]).is_err());
    assert!(
        cells.write(2, &rows, &[0], &mut main[0]).is_err(),
        "no tensor 2"
    );
    cells.write(0, &rows, &[0], &mut main[0]).unwrap();
    assert!(
        cells.write(0, &rows, &[0], &mut main[0]).is_err(),
        "written twice"
    );
    let q = query(0, 1);
    let mut s = [0f32; 2];
    assert!(
        cells
            .scores(0, &main[0], 2, 0, 1, 0, &q, &mut s[..1])
            .is_err(),
        "kv_head"
    );
    assert!(
        cells.scores(0, &main[0], 0, 255, 2, 0, &q, &mut s).is_err(),
        "cells beyond n_cells"
    );
    assert!(
        cells
            .scores(0, &main[0], 0, 0, 1, 1, &q, &mut s[..1])
            .is_err(),
        "token beyond the ubatch"
    );
    assert!(
        cells
            .scores(0, &main[0], 0, 0, 2, 0, &q, &mut s[..1])
            .is_err(),
        "short scores"
    );
    assert!(
        matches!(
            cells.begin_ubatch(&[1], &[0], &[1]),
            Err(Error::State { .. })
        ),
        "tensor 1 missed its write"
    );
    cells.write(1, &rows, &[0], &mut main[1]).unwrap();
    cells.begin_ubatch(&[1], &[0], &[1]).unwrap();
    assert!(cells.release(256).is_err());
}

#[test]
fn two_scratch_buffers_serve_every_layer_in_order() {
    // two layers (K0 V0 K1 V1): a prefill written and read layer by layer reads what a cache of
    // one layer reads; reading layer 0 after layer 1 was written is refused, never wrong
    let t = specs(true);
    let four = [t[0], t[1], t[0], t[1]];
    let mut cells = KvqCells::new(cfg(4, 16), &four).unwrap();
    let mut mains: Vec<Vec<u8>> = (0..4)
        .map(|i| vec![0u8; 256 * cells.main_cell_bytes(i).unwrap()])
        .collect();
    let (mut one, mut one_main) = new_cells(4, 16, true);
    let n = 64usize;
    let pos: Vec<i32> = (0..n as i32).collect();
    let idx: Vec<i64> = (0..n).map(cell_of).collect();
    let k: Vec<f32> = (0..n).flat_map(token_rows).collect();
    let v: Vec<f32> = (0..n).flat_map(v_rows).collect();
    ubatch(&mut one, &mut one_main, &pos, &vec![0; n], &idx, &k, &v);
    let want = visible_scores(&one, &one_main, 10, 10, 0);
    cells.begin_ubatch(&pos, &vec![0; n], &idx).unwrap();
    let q = query(10, 1);
    let score = |cells: &KvqCells, mains: &[Vec<u8>], t: u32| -> Result<Vec<f32>> {
        (0..=10)
            .map(|p| {
                let mut s = [0f32; 1];
                cells.scores(
                    t,
                    &mains[t as usize],
                    0,
                    cell_of(p) as u32,
                    1,
                    10,
                    &q,
                    &mut s,
                )?;
                Ok(s[0])
            })
            .collect()
    };
    for layer in 0..2u32 {
        let (kt, vt) = (2 * layer, 2 * layer + 1);
        let (a, b) = mains.split_at_mut(vt as usize);
        cells.write(kt, &k, &idx, &mut a[kt as usize]).unwrap();
        cells.write(vt, &v, &idx, &mut b[0]).unwrap();
        assert_eq!(score(&cells, &mains, kt).unwrap(), want, "layer {layer}");
    }
    assert!(
        matches!(score(&cells, &mains, 0), Err(Error::State { .. })),
        "layer 0's scratch moved on"
    );
    // decoding frees both buffers
    let before = cells.bytes_held();
    cells.begin_ubatch(&[64], &[0], &[cell_of(64)]).unwrap();
    for t in 0..4u32 {
        cells
            .write(t, &token_rows(64), &[cell_of(64)], &mut mains[t as usize])
            .unwrap();
    }
    assert!(cells.bytes_held() < before);
}

mod state;

mod shift;

/// Begins a ubatch of positions `first..first + n` of sequence 0 whose rows are another
/// text's (`salt`), and writes only the first `written` tensors (an engine that stopped).
fn begin_span_partly(
    cells: &mut KvqCells,
    mains: &mut [Vec<u8>],
    first: usize,
    n: usize,
    written: u32,
) {
    let pos: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
    let seq = vec![0; n];
    let idx: Vec<i64> = (first..first + n).map(cell_of).collect();
    let k: Vec<f32> = (first..first + n)
        .flat_map(|p| token_rows(p + 777))
        .collect();
    let v: Vec<f32> = (first..first + n).flat_map(|p| v_rows(p + 777)).collect();
    cells.begin_ubatch(&pos, &seq, &idx).unwrap();
    for t in 0..written {
        let rows = if t == 0 { &k } else { &v };
        cells.write(t, rows, &idx, &mut mains[t as usize]).unwrap();
    }
}

/// Every read of a run of one-token writes after `p0`, and of one batched write first.
fn reads_from(
    cells: &mut KvqCells,
    mains: &mut [Vec<u8>],
    p0: usize,
    batch: usize,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut out = Vec::new();
    write_span(cells, mains, p0, batch);
    for t in 0..batch {
        out.push((
            visible_scores(cells, mains, t as u32, p0 + t, 1),
            visible_values(cells, mains, t as u32, p0 + t, 1),
        ));
    }
    for p in p0 + batch..140 {
        write_span(cells, mains, p, 1);
        out.push((
            visible_scores(cells, mains, 0, p, 0),
            visible_values(cells, mains, 0, p, 1),
        ));
    }
    out
}

#[test]
fn a_dropped_ubatch_reads_as_never_begun() {
    // (tensors written before the stop, how it is dropped: drop_ubatch or the engine
    // releasing the ubatch's cells, the dropped ubatch's first position and length)
    let cases: &[(u32, bool, usize, usize)] = &[
        (0, true, 38, 64),
        (1, true, 38, 64),
        (2, false, 38, 64),
        (1, false, 60, 1),
        (2, true, 90, 1),
        (2, false, 90, 30),
    ];
    for &(sink, window, center) in &[(4, 16, true), (0, 16, false), (2, 1, false), (4, 0, false)] {
        for &(written, explicit, first, n) in cases {
            let what = format!("sink {sink} window {window} center {center}: {written} tensors written, ubatch {first}+{n}, drop_ubatch {explicit}");
            let (mut fresh, mut main_f) = new_cells(sink, window, center);
            let (mut cells, mut mains) = new_cells(sink, window, center);
            for (c, m) in [(&mut fresh, &mut main_f), (&mut cells, &mut mains)] {
                write_span(c, m, 0, 37);
                for p in 37..first {
                    write_span(c, m, p, 1);
                }
            }
            begin_span_partly(&mut cells, &mut mains, first, n, written);
            if explicit {
                assert!(cells.drop_ubatch(), "{what}");
                assert!(!cells.drop_ubatch(), "{what}: dropped twice");
            } else {
                // the engine's rollback: it frees every cell of the ubatch (any order)
                for p in (first..first + n).rev() {
                    cells.release(cell_of(p) as u32).unwrap();
                }
            }
            assert_eq!(cells.ubatch_len(), 0, "{what}");
            // another batch shape after the drop than the one dropped
            let batch = if n > 1 { 5 } else { 1 };
            let want = reads_from(&mut fresh, &mut main_f, first, batch);
            let got = reads_from(&mut cells, &mut mains, first, batch);
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{what}: read {i}");
            }
            // the same rows held (storage the dropped ubatch grew may stay reserved)
            assert_eq!(
                (cells.window_rows(), cells.sink_rows()),
                (fresh.window_rows(), fresh.sink_rows()),
                "{what}"
            );
        }
    }
}

#[test]
fn a_committed_ubatch_is_not_undone() {
    let (mut cells, mut mains) = new_cells(4, 16, true);
    write_span(&mut cells, &mut mains, 0, 40);
    write_span(&mut cells, &mut mains, 40, 1);
    // a later ubatch commits the one before: only the last can be dropped
    assert!(cells.drop_ubatch());
    assert!(!cells.drop_ubatch());
    // a rollback that releases an older ubatch's cells releases them, nothing more
    write_span(&mut cells, &mut mains, 40, 1);
    write_span(&mut cells, &mut mains, 41, 1);
    cells.release(cell_of(40) as u32).unwrap();
    assert_eq!(cells.read_of(cell_of(41) as u32, 41), CellRead::Window);
    // clear starts afresh, even in the middle of a ubatch
    begin_span_partly(&mut cells, &mut mains, 42, 3, 1);
    cells.clear();
    write_span(&mut cells, &mut mains, 0, 3);
    // a write after a drop is refused, and the next ubatch begins
    begin_span_partly(&mut cells, &mut mains, 3, 2, 1);
    assert!(cells.drop_ubatch());
    let idx: Vec<i64> = (3..5).map(cell_of).collect();
    let v: Vec<f32> = (3..5).flat_map(v_rows).collect();
    assert!(matches!(
        cells.write(1, &v, &idx, &mut mains[1]),
        Err(Error::State { .. })
    ));
    write_span(&mut cells, &mut mains, 3, 2);
}

#[test]
fn seq_bytes_is_what_a_full_sequence_adds() {
    for &(sink, window, center) in &[(4, 16, true), (0, 16, false), (4, 0, false), (2, 64, true)] {
        let (mut cells, mut main) = new_cells(sink, window, center);
        let fresh = cells.bytes_held();
        // one token at a time (no scratch), well past the sink and the window
        for p in 0..200 {
            write_span(&mut cells, &mut main, p, 1);
        }
        let grown = (cells.bytes_held() - fresh) as f64;
        let stated = cells.seq_bytes() as f64;
        // the whole: one sequence after one-token ubatches
        let whole = cells.capacity_bytes(1, 1).unwrap() as f64;
        let held = cells.bytes_held() as f64;
        assert!(
            (whole - held).abs() <= 0.05 * held,
            "capacity {whole}, held {held}"
        );
        // the rows and centers exactly, the lists' capacities within a few percent (here two
        // 64-value heads: the rows are small beside the lists)
        assert!(
            (grown - stated).abs() <= 0.05 * stated,
            "sink {sink} window {window}: grown {grown}, stated {stated}"
        );
    }
}

/// Positions `first..first + n` of sequence 0 as one ubatch, rows of tokens `first + salt..`.
fn write_span_salted(
    cells: &mut KvqCells,
    mains: &mut [Vec<u8>],
    first: usize,
    n: usize,
    salt: usize,
) {
    let pos: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
    let seq = vec![0; n];
    let idx: Vec<i64> = (first..first + n).map(cell_of).collect();
    let k: Vec<f32> = (first..first + n)
        .flat_map(|p| token_rows(p + salt))
        .collect();
    let v: Vec<f32> = (first..first + n).flat_map(|p| v_rows(p + salt)).collect();
    ubatch(cells, mains, &pos, &seq, &idx, &k, &v);
}

/// A prompt of 60 positions in one ubatch, then one position at a time up to `end`.
fn prompt_then_decode(cells: &mut KvqCells, mains: &mut [Vec<u8>], end: usize) {
    write_span(cells, mains, 0, 60.min(end));
    for p in 60..end {
        write_span(cells, mains, p, 1);
    }
}

/// Every read of a continuation from `p0` (one ubatch of 5, then one at a time up to 150),
/// rows other than the first run's.
fn continuation(
    cells: &mut KvqCells,
    mains: &mut [Vec<u8>],
    p0: usize,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut out = Vec::new();
    write_span_salted(cells, mains, p0, 5, 911);
    for t in 0..5 {
        out.push((
            visible_scores(cells, mains, t as u32, p0 + t, 1),
            visible_values(cells, mains, t as u32, p0 + t, 1),
        ));
    }
    for p in p0 + 5..150 {
        write_span_salted(cells, mains, p, 1, 911);
        out.push((
            visible_scores(cells, mains, 0, p, 0),
            visible_values(cells, mains, 0, p, 1),
        ));
    }
    out
}

#[test]
fn a_truncated_sequence_reads_as_a_fresh_one() {
    const END: usize = 100;
    for &(sink, window, center) in &[(4, 16, true), (0, 16, false), (2, 1, false), (4, 0, false)] {
        for rollback in [0u32, 16, 100] {
            for back in [1usize, 2, 3, 15, 16, 17, 18, 19, 40, 60, 85, 97, END] {
                let p0 = END - back;
                let what = format!("sink {sink} window {window} center {center} rollback {rollback}: {back} back to {p0}");
                // the next position reads `window - 1` rows back, and taking back the last ubatch (one
                // position) undoes its drop: exact up to rollback + 2 (a window of 1 needs no row)
                let exact = window <= 1 || back <= rollback as usize + 2 || p0 <= sink as usize;
                let (mut cells, mut mains) = new_cells(sink, window, center);
                cells.set_rollback(rollback).unwrap();
                prompt_then_decode(&mut cells, &mut mains, END);
                assert_eq!(cells.can_truncate(0, p0 as i32), exact, "{what}");
                assert_eq!(cells.truncate(0, p0 as i32), exact, "{what}");
                if !exact {
                    // refused: nothing changed, the sequence goes on as if never asked
                    let (mut twin, mut main_t) = new_cells(sink, window, center);
                    twin.set_rollback(rollback).unwrap();
                    prompt_then_decode(&mut twin, &mut main_t, END);
                    assert_eq!(
                        continuation(&mut cells, &mut mains, END),
                        continuation(&mut twin, &mut main_t, END),
                        "{what}: refused"
                    );
                    continue;
                }
                for p in (p0..END).rev() {
                    cells.release(cell_of(p) as u32).unwrap();
                }
                let (mut fresh, mut main_f) = new_cells(sink, window, center);
                fresh.set_rollback(rollback).unwrap();
                prompt_then_decode(&mut fresh, &mut main_f, p0);
                let got = continuation(&mut cells, &mut mains, p0);
                let want = continuation(&mut fresh, &mut main_f, p0);
                assert_eq!(got.len(), want.len(), "{what}");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g, w, "{what}: read {i}");
                }
                for t in 0..2 {
                    assert_eq!(
                        cells.center_of(t, 0),
                        fresh.center_of(t, 0),
                        "{what}: center"
                    );
                }
            }
        }
    }
}

#[test]
fn rollback_rows_are_held_and_counted() {
    let (mut plain, mut main_p) = new_cells(4, 16, true);
    let (mut kept, mut main_k) = new_cells(4, 16, true);
    kept.set_rollback(24).unwrap();
    assert_eq!(kept.rollback(), 24);
    prompt_then_decode(&mut plain, &mut main_p, 120);
    prompt_then_decode(&mut kept, &mut main_k, 120);
    assert_eq!(kept.window_rows() - plain.window_rows(), 24);
    let row = kept.seq_bytes() - plain.seq_bytes();
    // 24 more window rows per tensor (two tensors of two 64-value 8-bit heads) and their
    // list entries
    assert!(
        (24 * 2 * 2 * 64..=24 * 2 * 2 * 80 + 24 * 16).contains(&row),
        "{row}"
    );
    assert!(kept.set_rollback(1 << 31).is_err());
}

#[test]
fn truncating_the_last_ubatch_undoes_it() {
    for &(sink, window, center) in &[(4, 16, true), (0, 16, false)] {
        let (mut fresh, mut main_f) = new_cells(sink, window, center);
        let (mut cells, mut mains) = new_cells(sink, window, center);
        prompt_then_decode(&mut fresh, &mut main_f, 70);
        prompt_then_decode(&mut cells, &mut mains, 70);
        // a ubatch of 30 whose compute failed after one tensor: the engine takes it back
        begin_span_partly(&mut cells, &mut mains, 70, 30, 1);
        assert!(cells.truncate(0, 70));
        for p in 70..100 {
            cells.release(cell_of(p) as u32).unwrap();
        }
        assert_eq!(
            continuation(&mut cells, &mut mains, 70),
            continuation(&mut fresh, &mut main_f, 70)
        );
    }
}

#[test]
fn a_sequence_taken_back_whole_starts_afresh() {
    let (mut cells, mut mains) = new_cells(4, 16, true);
    prompt_then_decode(&mut cells, &mut mains, 100);
    assert!(cells.center_of(0, 0).is_some());
    assert!(cells.truncate(0, 0));
    for p in 0..100 {
        cells.release(cell_of(p) as u32).unwrap();
    }
    assert!(cells.center_of(0, 0).is_none());
    let (mut fresh, mut main_f) = new_cells(4, 16, true);
    assert_eq!(
        continuation(&mut cells, &mut mains, 0),
        continuation(&mut fresh, &mut main_f, 0)
    );
}

#[test]
fn a_block_of_tokens_reads_as_each_token_alone() {
    for &(sink, window, center) in &[(4, 16, true), (0, 16, false), (4, 0, false)] {
        let (mut cells, mut mains) = new_cells(sink, window, center);
        // 100 positions, then a prefill of 12: tiles of main rows, of sinks and mains, of
        // window rows
        prompt_then_decode(&mut cells, &mut mains, 100);
        write_span(&mut cells, &mut mains, 100, 12);
        let tokens: Vec<u32> = (0..12).collect();
        let g = 2;
        let q: Vec<f32> = (0..12).flat_map(|t| query(100 + t, g)).collect();
        for (cell0, n) in [(0u32, 256usize), (0, 32), (32, 64), (96, 64), (200, 56)] {
            let mut block = vec![0f32; 12 * g * n];
            cells
                .scores_tokens(0, &mains[0], 1, cell0, n, &tokens, &q, &mut block)
                .unwrap();
            let w: Vec<f32> = (0..12 * g * n)
                .map(|i| ((i % 7) as f32 + 1.0) / 8.0)
                .collect();
            let mut acc = vec![0f32; 12 * g * D];
            cells
                .accumulate_tokens(1, &mains[1], 1, cell0, n, &tokens, &w, &mut acc)
                .unwrap();
            for (i, &tok) in tokens.iter().enumerate() {
                let mut one = vec![0f32; g * n];
                cells
                    .scores(
                        0,
                        &mains[0],
                        1,
                        cell0,
                        n,
                        tok,
                        &q[i * g * D..(i + 1) * g * D],
                        &mut one,
                    )
                    .unwrap();
                assert_eq!(
                    one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    block[i * g * n..(i + 1) * g * n]
                        .iter()
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>(),
                    "scores: sink {sink} window {window}, cells {cell0}+{n}, token {tok}"
                );
                let mut a1 = vec![0f32; g * D];
                cells
                    .accumulate(
                        1,
                        &mains[1],
                        1,
                        cell0,
                        n,
                        tok,
                        &w[i * g * n..(i + 1) * g * n],
                        &mut a1,
                    )
                    .unwrap();
                assert_eq!(
                    a1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    acc[i * g * D..(i + 1) * g * D]
                        .iter()
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>(),
                    "sums: sink {sink} window {window}, cells {cell0}+{n}, token {tok}"
                );
            }
        }
        // refusals: no tokens, a token past the ubatch, values that do not split
        let mut out = vec![0f32; 2 * 8];
        assert!(cells
            .scores_tokens(0, &mains[0], 1, 0, 8, &[], &q[..D], &mut out)
            .is_err());
        assert!(cells
            .scores_tokens(0, &mains[0], 1, 0, 8, &[0, 12], &q[..2 * D], &mut out)
            .is_err());
        assert!(cells
            .scores_tokens(0, &mains[0], 1, 0, 8, &[0, 1], &q[..3 * D], &mut out)
            .is_err());
        let many: Vec<u32> = (0..12).collect();
        let mut big = vec![0f32; 12 * 6 * 8];
        let q6: Vec<f32> = (0..12).flat_map(|t| query(t, 6)).collect();
        assert!(cells
            .scores_tokens(0, &mains[0], 1, 0, 8, &many, &q6, &mut big)
            .is_err());
    }
}
