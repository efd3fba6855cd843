//! A fixed calibration built with exact arithmetic only (no libm, no eigen solver), so that
//! it is the same on every host: the input of the golden files of the calibration format and
//! of the chunks that code with it (kvc-store-tiers), and of tests.

use crate::calibration::{Calibration, HeadBasis, Target};
use crate::rans::{SymbolTable, NSYM};
use crate::rope::{Rope, RopeKind};

/// A valid calibration for `n_layer × n_kv_head × head_dim` (`head_dim` even): RoPE
/// `norm` with `θ_i = 1/(i+1)`, signed-permutation bases, means and steps from small
/// integers, three symbol tables, targets `tc-0.01` and `tc-0.05`.
pub fn fixed_calibration(
    n_layer: usize,
    n_kv_head: usize,
    head_dim: usize,
    n_sink: usize,
) -> Calibration {
    let d = head_dim;
    let theta = (0..d / 2).map(|i| 1.0 / (i as f64 + 1.0)).collect();
    let rope = Rope::from_theta(RopeKind::Norm, d, theta).expect("valid frequencies");
    let heads = n_layer * 2 * n_kv_head;
    let bases = (0..heads)
        .map(|s| {
            let mut basis = vec![0f32; d * d];
            for i in 0..d {
                let j = (i + s) % d;
                basis[i * d + j] = if (i + s) % 2 == 0 { 1.0 } else { -1.0 };
            }
            HeadBasis {
                mean: (0..d)
                    .map(|j| ((j * 7 + s) % 11) as f32 * 0.01 - 0.05)
                    .collect(),
                basis,
            }
        })
        .collect();
    let tables = (0..3u64)
        .map(|c| {
            let mut counts = [0u64; NSYM];
            for (s, n) in counts.iter_mut().enumerate() {
                *n = (1000 >> (s as u64 / (c + 1)).min(63)) + c;
            }
            SymbolTable::from_counts(&counts)
        })
        .collect();
    let targets = [0.01f32, 0.05]
        .iter()
        .enumerate()
        .map(|(t, &bound)| Target {
            bound,
            steps: (0..heads * d)
                .map(|i| 0.05 * (1 + i % 4) as f32 * (t + 1) as f32)
                .collect(),
            classes: (0..heads * d).map(|i| (i % 3) as u8).collect(),
        })
        .collect();
    Calibration {
        n_layer,
        n_kv_head,
        head_dim,
        n_sink,
        rope,
        tables,
        bases,
        targets,
    }
}
