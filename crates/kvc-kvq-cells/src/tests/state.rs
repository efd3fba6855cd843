//! Saved cells: a load into other cells (and another sequence) reads and goes on exactly
//! like the cells it was saved from; damaged or foreign bytes are refused.

use super::*;

type Map = fn(usize) -> i64;

/// Another scatter of positions over cells (where a restoring engine puts them).
fn other_cell(p: usize) -> i64 {
    ((p * 53 + 7) % 256) as i64
}

fn write_at(
    cells: &mut KvqCells,
    mains: &mut [Vec<u8>],
    first: usize,
    n: usize,
    seq: i32,
    map: Map,
) {
    let pos: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
    let seqs = vec![seq; n];
    let idx: Vec<i64> = (first..first + n).map(map).collect();
    let k: Vec<f32> = (first..first + n).flat_map(token_rows).collect();
    let v: Vec<f32> = (first..first + n).flat_map(v_rows).collect();
    ubatch(cells, mains, &pos, &seqs, &idx, &k, &v);
}

/// Scores and weighted V sums of positions `0..=qp` for the query of ubatch token `token`,
/// both KV heads.
fn reads_at(cells: &KvqCells, mains: &[Vec<u8>], token: u32, qp: usize, map: Map) -> Vec<f32> {
    let q = query(qp, 2);
    let mut out = Vec::new();
    for head in 0..H as u32 {
        for p in 0..=qp {
            let mut s = [0f32; 2];
            cells
                .scores(0, &mains[0], head, map(p) as u32, 1, token, &q, &mut s)
                .unwrap();
            out.extend_from_slice(&s);
        }
        // one cell per call: each cell's weighted row exactly (a sum over cells in cell
        // order would differ in the last bits between two scatters)
        for p in 0..=qp {
            let w = [1.0 / (1.0 + p as f32), 0.5];
            let mut acc = vec![0f32; 2 * D];
            cells
                .accumulate(1, &mains[1], head, map(p) as u32, 1, token, &w, &mut acc)
                .unwrap();
            out.extend_from_slice(&acc);
        }
    }
    out
}

/// The `p`-th cell that no position below 90 of `cell_of` takes.
fn free_cell(p: usize) -> i64 {
    (0..256i64)
        .filter(|c| !(0..90).any(|q| cell_of(q) == *c))
        .nth(p)
        .unwrap()
}

/// The engine's part of a restore: main rows copied cell by cell.
fn copy_mains(
    cells: &KvqCells,
    from: &[Vec<u8>],
    to: &mut [Vec<u8>],
    n: usize,
    src: Map,
    dst: Map,
) {
    for t in 0..2 {
        let b = cells.main_cell_bytes(t as u32).unwrap();
        for p in 0..n {
            let (s, d) = (src(p) as usize * b, dst(p) as usize * b);
            to[t][d..d + b].copy_from_slice(&from[t][s..s + b]);
        }
    }
}

/// Cells of sequence 0 after a 100-token prefill in two ubatches and 20 decode steps.
fn saved_scenario(sink: u32, window: u32, center: bool) -> (KvqCells, Vec<Vec<u8>>) {
    let (mut c, mut m) = new_cells(sink, window, center);
    write_at(&mut c, &mut m, 0, 64, 0, cell_of);
    write_at(&mut c, &mut m, 64, 36, 0, cell_of);
    for p in 100..120 {
        write_at(&mut c, &mut m, p, 1, 0, cell_of);
    }
    (c, m)
}

fn cells_and_pos(n: usize, map: Map) -> (Vec<u32>, Vec<i32>) {
    (
        (0..n).map(|p| map(p) as u32).collect(),
        (0..n as i32).collect(),
    )
}

#[test]
fn a_load_reads_and_goes_on_like_the_saved_cells() {
    for &(sink, window, center) in &[
        (4, 16, true),
        (4, 16, false),
        (0, 8, false),
        (2, 0, false),
        (4, 1, true),
    ] {
        let (mut a, mut ma) = saved_scenario(sink, window, center);
        let (src, pos) = cells_and_pos(120, cell_of);
        let saved = a.save(&src, 0).unwrap();
        // a fresh cache that already served another sequence
        let (mut b, mut mb) = new_cells(sink, window, center);
        write_at(&mut b, &mut mb, 0, 30, 5, |p| (p + 200) as i64);
        let (dst, _) = cells_and_pos(120, other_cell);
        copy_mains(&a, &ma, &mut mb, 120, cell_of, other_cell);
        b.load(&saved, &dst, &pos, 3).unwrap();
        assert_eq!(
            b.center_of(0, 3),
            a.center_of(0, 0),
            "the center moves with the cells"
        );
        // decode on in both: same rows read, same codes written
        for p in 120..150 {
            write_at(&mut a, &mut ma, p, 1, 0, cell_of);
            write_at(&mut b, &mut mb, p, 1, 3, other_cell);
            assert_eq!(
                reads_at(&a, &ma, 0, p, cell_of),
                reads_at(&b, &mb, 0, p, other_cell),
                "position {p} (sink {sink} window {window} center {center})"
            );
        }
        // the other sequence is untouched
        assert!(b.center_of(0, 5).is_none() || center);
    }
}

#[test]
fn a_whole_restore_keeps_every_sequence() {
    let (mut a, mut ma) = new_cells(4, 16, true);
    write_at(&mut a, &mut ma, 0, 80, 0, cell_of);
    let map1: Map = free_cell;
    write_at(&mut a, &mut ma, 0, 40, 1, map1);
    let mut cells: Vec<u32> = (0..80).map(|p| cell_of(p) as u32).collect();
    cells.extend((0..40).map(|p| map1(p) as u32));
    let mut pos: Vec<i32> = (0..80).collect();
    pos.extend(0..40);
    let saved = a.save(&cells, -1).unwrap();
    let (mut b, mut mb) = new_cells(4, 16, true);
    mb.clone_from(&ma);
    b.load(&saved, &cells, &pos, -1).unwrap();
    assert_eq!(b.center_of(0, 0), a.center_of(0, 0));
    assert_eq!(b.center_of(0, 1), a.center_of(0, 1));
    for p in 80..90 {
        write_at(&mut a, &mut ma, p, 1, 0, cell_of);
        write_at(&mut b, &mut mb, p, 1, 0, cell_of);
        assert_eq!(
            reads_at(&a, &ma, 0, p, cell_of),
            reads_at(&b, &mb, 0, p, cell_of)
        );
    }
    for p in 40..60 {
        write_at(&mut a, &mut ma, p, 1, 1, map1);
        write_at(&mut b, &mut mb, p, 1, 1, map1);
        assert_eq!(reads_at(&a, &ma, 0, p, map1), reads_at(&b, &mb, 0, p, map1));
    }
}

#[test]
fn a_load_over_a_sequence_leaves_cells_it_shares_with_others_alone() {
    // sequence 0 wrote 60 cells that the engine keeps for another sequence (a shared
    // prefix) while it restores a saved state into sequence 0 on other cells: the kept
    // cells read as before (their writer keeps its center), the restored ones as saved
    let (mut a, mut ma) = new_cells(4, 16, true);
    write_at(&mut a, &mut ma, 0, 59, 0, cell_of);
    write_at(&mut a, &mut ma, 59, 1, 0, cell_of);
    let before = reads_at(&a, &ma, 0, 59, cell_of);
    let (b, mb) = saved_scenario(4, 16, true);
    let (src, pos) = cells_and_pos(40, cell_of);
    let saved = b.save(&src, 0).unwrap();
    let (dst, _) = cells_and_pos(40, free_cell);
    copy_mains(&b, &mb, &mut ma, 40, cell_of, free_cell);
    a.load(&saved, &dst, &pos, 0).unwrap();
    assert_eq!(reads_at(&a, &ma, 0, 59, cell_of), before);
    assert_eq!(a.center_of(0, 0), b.center_of(0, 0));
    assert_eq!(
        reads_at(&a, &ma, 0, 39, free_cell),
        reads_at(&b, &mb, 0, 39, cell_of)
    );
}

#[test]
fn damaged_bytes_are_refused_and_nothing_changes() {
    let (a, _) = saved_scenario(4, 16, true);
    let (src, pos) = cells_and_pos(120, cell_of);
    let saved = a.save(&src[..24], 0).unwrap();
    let pos = &pos[..24];
    let (mut b, _) = new_cells(4, 16, true);
    let dst: Vec<u32> = (0..24).map(|p| other_cell(p) as u32).collect();
    let held = b.bytes_held();
    for bit in 0..saved.len() * 8 {
        let mut bad = saved.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        let e = b.load(&bad, &dst, pos, 0).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::CorruptData), "bit {bit}: {e}");
    }
    for len in 0..saved.len() {
        let e = b.load(&saved[..len], &dst, pos, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptData, "length {len}: {e}");
    }
    assert_eq!(b.bytes_held(), held);
    assert_eq!(b.window_rows() + b.sink_rows(), 0);
    b.load(&saved, &dst, pos, 0).unwrap();
}

#[test]
fn foreign_states_and_bad_calls_are_refused() {
    let (a, _) = saved_scenario(4, 16, true);
    let (src, pos) = cells_and_pos(120, cell_of);
    let saved = a.save(&src, 0).unwrap();
    let (dst, _) = cells_and_pos(120, other_cell);
    for (sink, window, center) in [(2, 16, true), (4, 8, true), (4, 16, false)] {
        let (mut b, _) = new_cells(sink, window, center);
        let e = b.load(&saved, &dst, &pos, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("saved by cells with"), "{e}");
    }
    let (mut b, _) = new_cells(4, 16, true);
    let mut moved = pos.clone();
    moved[7] += 1;
    assert!(b
        .load(&saved, &dst, &moved, 0)
        .unwrap_err()
        .to_string()
        .contains("position"));
    assert!(b.load(&saved, &dst[..119], &pos[..119], 0).is_err());
    assert!(b.load(&saved, &dst, &pos, -2).is_err());
    let mut twice = dst.clone();
    twice[1] = twice[0];
    assert!(b.load(&saved, &twice, &pos, 0).is_err());
    // saving: unwritten or out-of-range cells, a sequence below -1, within a ubatch
    let unwritten = (0..256u32).find(|&c| !src.contains(&c)).unwrap();
    assert!(a.save(&[unwritten], 0).is_err());
    assert!(a.save(&[src[0], src[0]], 0).is_err());
    assert!(a.save(&[256], 0).is_err());
    assert!(a.save(&src, -2).is_err());
    let (mut c, _) = new_cells(4, 16, true);
    c.begin_ubatch(&[0], &[0], &[0]).unwrap();
    assert_eq!(c.save(&[], 0).unwrap_err().kind(), ErrorKind::InvalidState);
    assert_eq!(
        c.load(&saved, &dst, &pos, 0).unwrap_err().kind(),
        ErrorKind::InvalidState
    );
}
