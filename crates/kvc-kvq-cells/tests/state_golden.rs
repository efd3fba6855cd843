//! Golden files of saved cells (`KVCQCELS`), v1, pcodec style: saving the fixed cells gives
//! the checked-in bytes, and loading them back reads and saves exactly as the fixed cells
//! do. Files in `tests/golden/kvq-cells-state-v1/`. A new version gets a new directory;
//! these files never change. `KVC_WRITE_GOLDEN=1` writes missing files, never overwrites.

use std::path::PathBuf;

use kvc_kvq_cells::{CellsConfig, KvqCells, TensorSpec, STATE_VERSION};

const D: usize = 64;
const H: usize = 2;
const N_CELLS: u32 = 32;

fn golden(name: &str, fresh: &[u8]) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/kvq-cells-state-v1")
        .join(name);
    if std::env::var_os("KVC_WRITE_GOLDEN").is_some() && !path.exists() {
        std::fs::write(&path, fresh).unwrap();
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn config() -> (CellsConfig, [TensorSpec; 2]) {
    let k = TensorSpec {
        head_dim: D as u32,
        n_kv_head: H as u32,
        bits: 3,
        center: true,
    };
    let cfg = CellsConfig {
        n_cells: N_CELLS,
        sink: 2,
        window: 4,
        window_bits: 8,
    };
    (cfg, [k, TensorSpec { center: false, ..k }])
}

/// A row of token `t` in tensor `k`: a per-channel offset and a smooth token part.
fn rows(t: usize, k: usize) -> Vec<f32> {
    (0..H * D)
        .map(|e| {
            ((e * 7 + t * 13 + k * 5) as f32 * 0.37).sin() + if e % 5 == 0 { 3.0 } else { 0.2 }
        })
        .collect()
}

fn cell(p: usize) -> i64 {
    ((p * 7 + 3) % N_CELLS as usize) as i64
}

/// Sequence 1: a 10-token prefill, then 3 decode steps (positions 10..13).
fn fixed() -> (KvqCells, Vec<Vec<u8>>) {
    let (cfg, specs) = config();
    let mut c = KvqCells::new(cfg, &specs).unwrap();
    let mut mains: Vec<Vec<u8>> = (0..2)
        .map(|t| vec![0u8; N_CELLS as usize * c.main_cell_bytes(t).unwrap()])
        .collect();
    for (first, n) in [(0usize, 10usize), (10, 1), (11, 1), (12, 1)] {
        let pos: Vec<i32> = (first..first + n).map(|p| p as i32).collect();
        let idx: Vec<i64> = (first..first + n).map(cell).collect();
        c.begin_ubatch(&pos, &vec![1; n], &idx).unwrap();
        for (t, main) in mains.iter_mut().enumerate() {
            let x: Vec<f32> = (first..first + n).flat_map(|p| rows(p, t)).collect();
            c.write(t as u32, &x, &idx, main).unwrap();
        }
    }
    (c, mains)
}

/// Scores and values of every cell for ubatch token 0 (position 12), both heads.
fn reads(c: &KvqCells, mains: &[Vec<u8>]) -> Vec<f32> {
    let q: Vec<f32> = (0..D).map(|e| (e as f32 * 0.11).cos()).collect();
    let mut out = Vec::new();
    for head in 0..H as u32 {
        for p in 0..13 {
            let mut s = [0f32];
            c.scores(0, &mains[0], head, cell(p) as u32, 1, 0, &q, &mut s)
                .unwrap();
            let mut acc = vec![0f32; D];
            c.accumulate(1, &mains[1], head, cell(p) as u32, 1, 0, &[1.0], &mut acc)
                .unwrap();
            out.push(s[0]);
            out.extend(acc);
        }
    }
    out
}

#[test]
fn saved_cells_v1_are_the_golden_bytes_and_load_back() {
    assert_eq!(STATE_VERSION, 1);
    let (c, mains) = fixed();
    let cells: Vec<u32> = (0..13).map(|p| cell(p) as u32).collect();
    let pos: Vec<i32> = (0..13).collect();
    let saved = c.save(&cells, 1).unwrap();
    let gold = golden("seq1-13cells.kvcqcells", &saved);
    assert_eq!(
        saved, gold,
        "saving the fixed cells no longer gives the v1 bytes"
    );
    // load the golden bytes into fresh cells beside the same main rows
    let (cfg, specs) = config();
    let mut back = KvqCells::new(cfg, &specs).unwrap();
    // a ubatch for the reads' query position (12); its cells are rewritten by the load
    back.begin_ubatch(&[12], &[1], &[cell(12)]).unwrap();
    let mut scratch = mains.clone();
    for (t, main) in scratch.iter_mut().enumerate() {
        back.write(t as u32, &rows(12, t), &[cell(12)], main)
            .unwrap();
    }
    back.load(&gold, &cells, &pos, 1).unwrap();
    assert_eq!(reads(&back, &mains), reads(&c, &mains));
    assert_eq!(back.save(&cells, 1).unwrap(), gold);
    assert_eq!(back.center_of(0, 1), c.center_of(0, 1));
    assert!(back.center_of(0, 1).is_some());
}
