//! Reading and storing cells' rows (what an engine's RoPE shift of stored K does) and
//! moving cells to new positions.

use super::*;

fn rows_of(cells: &KvqCells, main: &[Vec<u8>], t: u32, ids: &[u32]) -> Vec<f32> {
    let mut out = vec![0f32; ids.len() * H * D];
    cells
        .cell_rows(t, &main[t as usize], ids, &mut out)
        .unwrap();
    out
}

fn ids(ps: std::ops::Range<usize>) -> Vec<u32> {
    ps.map(|p| cell_of(p) as u32).collect()
}

#[test]
fn cell_rows_are_what_each_format_holds() {
    let (sink, window) = (4usize, 16usize);
    let (mut cells, mut main) = new_cells(sink as u32, window as u32, true);
    write_span(&mut cells, &mut main, 0, 100);
    let (c8, c3) = (codec(8), codec(3));
    let center = cells.center_of(0, 0).unwrap().to_vec();
    let got = rows_of(&cells, &main, 0, &ids(0..100));
    for p in 0..100 {
        for hd in 0..H {
            let x = &token_rows(p)[hd * D..(hd + 1) * D];
            let cc = &center[hd * D..(hd + 1) * D];
            // the last ubatch wrote 0..100: positions > 99 - window keep their window rows
            let want: Vec<f32> = if p < sink {
                x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
            } else if p + window > 99 {
                round_trip(&c8, x)
            } else {
                let diff: Vec<f32> = round_trip(&c8, x)
                    .iter()
                    .zip(cc)
                    .map(|(a, b)| a - b)
                    .collect();
                round_trip(&c3, &diff)
                    .iter()
                    .zip(cc)
                    .map(|(a, b)| a + b)
                    .collect()
            };
            let g = &got[(p * H + hd) * D..(p * H + hd + 1) * D];
            for (a, b) in g.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "position {p} head {hd}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn stored_rows_read_back_in_their_format() {
    let (mut cells, mut main) = new_cells(4, 16, true);
    write_span(&mut cells, &mut main, 0, 90);
    for p in 90..100 {
        write_span(&mut cells, &mut main, p, 1);
    }
    let all = ids(0..100);
    let before = rows_of(&cells, &main, 0, &all);
    // a transform of every row (what a RoPE shift does: a rotation of channel pairs)
    let turned: Vec<f32> = before
        .chunks_exact(2)
        .flat_map(|xy| [0.6 * xy[0] - 0.8 * xy[1], 0.8 * xy[0] + 0.6 * xy[1]])
        .collect();
    let centered = cells.center_of(0, 0).unwrap().to_vec();
    cells.set_cell_rows(0, &mut main[0], &all, &turned).unwrap();
    let after = rows_of(&cells, &main, 0, &all);
    let c3 = codec(3);
    for (p, (a, want)) in after
        .chunks_exact(H * D)
        .zip(turned.chunks_exact(H * D))
        .enumerate()
    {
        for hd in 0..H {
            let (a, want) = (&a[hd * D..(hd + 1) * D], &want[hd * D..(hd + 1) * D]);
            let exact: Vec<f32> = if p < 4 {
                want.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
            } else if p + 16 > 99 {
                round_trip(&codec(8), want)
            } else {
                let cc = &centered[hd * D..(hd + 1) * D];
                let diff: Vec<f32> = want.iter().zip(cc).map(|(a, b)| a - b).collect();
                round_trip(&c3, &diff)
                    .iter()
                    .zip(cc)
                    .map(|(a, b)| a + b)
                    .collect()
            };
            for (x, y) in a.iter().zip(&exact) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "position {p} head {hd}: {x} vs {y}"
                );
            }
        }
    }
    // the V tensor is untouched
    let v_before = rows_of(&cells, &main, 1, &all);
    assert_eq!(v_before, rows_of(&cells, &main, 1, &all));
}

#[test]
fn moved_cells_follow_their_new_positions() {
    // positions 0..4 (the sink) stay; 40..100 move down by 36 to 4..64 (a context shift that
    // dropped 4..40): reads and later coding follow the new positions, like cells written there
    let (mut a, mut ma) = new_cells(4, 16, false);
    write_span(&mut a, &mut ma, 0, 100);
    for p in 4..40 {
        a.release(cell_of(p) as u32).unwrap();
    }
    let moved = ids(40..100);
    let new_pos: Vec<i32> = (4..64).collect();
    a.set_positions(&moved, &new_pos).unwrap();
    // the query at position 64 reads positions 49..64 (old 85..100) from window rows, the
    // rest from main rows: as read_of says for the new positions
    let pos: Vec<i32> = vec![64];
    let c = [cell_of(4)];
    a.begin_ubatch(&pos, &[0], &c).unwrap();
    a.write(0, &token_rows(1000), &c, &mut ma[0]).unwrap();
    a.write(1, &v_rows(1000), &c, &mut ma[1]).unwrap();
    for (i, &cell) in moved.iter().enumerate() {
        let p = 4 + i as i32;
        let want = if 64 - p < 16 {
            CellRead::Window
        } else {
            CellRead::Main
        };
        assert_eq!(a.read_of(cell, 64), want, "new position {p}");
    }
    for p in 0..4 {
        assert_eq!(a.read_of(cell_of(p) as u32, 64), CellRead::Sink);
    }
    // the window rows left behind by the move are coded and dropped as decoding goes on
    for q in 65..90 {
        let c = [cell_of(q - 60)];
        a.begin_ubatch(&[q as i32], &[0], &c).unwrap();
        a.write(0, &token_rows(q + 1000), &c, &mut ma[0]).unwrap();
        a.write(1, &v_rows(q + 1000), &c, &mut ma[1]).unwrap();
    }
    assert_eq!(a.window_rows(), 16, "window rows held while decoding");
}

#[test]
fn bad_row_and_position_calls_are_refused() {
    let (mut cells, mut main) = new_cells(4, 16, true);
    write_span(&mut cells, &mut main, 0, 40);
    let mut out = vec![0f32; 2 * H * D];
    let unwritten = (0..256u32)
        .find(|&c| !(0..40).any(|p| cell_of(p) as u32 == c))
        .unwrap();
    let c0 = cell_of(0) as u32;
    assert!(cells
        .cell_rows(0, &main[0], &[c0, unwritten], &mut out)
        .is_err());
    assert!(cells.cell_rows(0, &main[0], &[c0, c0], &mut out).is_err());
    assert!(cells.cell_rows(0, &main[0], &[c0, 256], &mut out).is_err());
    assert!(
        cells.cell_rows(0, &main[0], &[c0], &mut out).is_err(),
        "out is two rows"
    );
    assert!(cells
        .cell_rows(2, &main[0], &[c0], &mut out[..H * D])
        .is_err());
    assert!(cells
        .set_cell_rows(0, &mut main[0][..10], &[c0], &out[..H * D])
        .is_err());
    assert!(cells.set_positions(&[c0], &[-1]).is_err());
    assert!(cells.set_positions(&[unwritten], &[3]).is_err());
    assert!(cells.set_positions(&[c0], &[]).is_err());
    cells.begin_ubatch(&[40], &[0], &[cell_of(40)]).unwrap();
    let e = cells
        .cell_rows(0, &main[0], &[c0], &mut out[..H * D])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState);
}

#[test]
fn a_cell_freed_and_written_again_by_its_sequence_keeps_its_own_window_slot() {
    // a sequence removes its last positions and writes them again into the same cells (what
    // llama.cpp does when a prompt's tail is re-processed): every later read is the same as
    // in cells that never removed them (a stale entry once made two cells share one slot)
    let (mut a, mut ma) = new_cells(4, 16, true);
    let (mut b, mut mb) = new_cells(4, 16, true);
    for p in 0..40 {
        write_span(&mut a, &mut ma, p, 1);
        write_span(&mut b, &mut mb, p, 1);
    }
    for p in 35..40 {
        a.release(cell_of(p) as u32).unwrap();
    }
    write_span(&mut a, &mut ma, 35, 5);
    write_span(&mut b, &mut mb, 40, 1);
    write_span(&mut a, &mut ma, 40, 1);
    for p in 41..90 {
        write_span(&mut a, &mut ma, p, 1);
        write_span(&mut b, &mut mb, p, 1);
        assert_eq!(a.window_rows(), b.window_rows(), "position {p}");
        assert_eq!(
            visible_scores(&a, &ma, 0, p, 1),
            visible_scores(&b, &mb, 0, p, 1),
            "position {p}"
        );
        assert_eq!(
            visible_values(&a, &ma, 0, p, 0),
            visible_values(&b, &mb, 0, p, 0),
            "position {p}"
        );
    }
}
