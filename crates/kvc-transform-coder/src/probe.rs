//! Layer probes: calibrations that code one layer at a given target and every other layer
//! almost exactly. Decoded in the engine, a probe shows how much the model's output (its
//! KL against the uncompressed cache) moves per unit of that layer's attention-output
//! error: the layer weights [`crate::Options::layer_weights`] that let a calibration spend
//! its bits where the output feels them (`integrations/llama/tc-sensitivity.py` runs the
//! probes; `kvc tc probe` writes one). Not a calibration to store chunks with: its rate is
//! far above f16's.

use kvc_types::Tensor;

use crate::calibration::{slot, Calibration, Target};
use crate::error::{Error, Result};

/// The bound a probe's one target is labelled with: its codec name is `tc-1`.
pub const PROBE_BOUND: f32 = 1.0;

/// How much finer than the calibration's finest target the other layers are coded (their
/// attention-output error is about `1/64²` of that target's).
const FINE_DIVISOR: f32 = 64.0;
/// The symbol-table classes step in quarter octaves of `σ/step`: 64 times finer is 24 up.
const FINE_CLASS_SHIFT: usize = 24;

/// A calibration with `cal`'s bases and tables and one target, [`PROBE_BOUND`]: `layer`
/// (K and V) with the steps of `cal`'s target `coarse`, every other layer with the steps
/// of `cal`'s finest target divided by 64. `layer` `None`: every layer fine (the probes'
/// baseline).
pub fn layer_probe(cal: &Calibration, layer: Option<usize>, coarse: f32) -> Result<Calibration> {
    let (h, d) = (cal.n_kv_head, cal.head_dim);
    if let Some(l) = layer.filter(|&l| l >= cal.n_layer) {
        return Err(Error::invalid(
            "tc probe",
            format!("layer {l} of {}", cal.n_layer),
        ));
    }
    let co = cal.target(coarse)?;
    let fine = &cal.targets[0];
    let top = cal.tables.len() - 1;
    let mut t = Target {
        bound: PROBE_BOUND,
        steps: fine.steps.iter().map(|s| s / FINE_DIVISOR).collect(),
        classes: fine
            .classes
            .iter()
            .map(|&c| (c as usize + FINE_CLASS_SHIFT).min(top) as u8)
            .collect(),
    };
    if let Some(l) = layer {
        for tensor in Tensor::ALL {
            let o = slot(h, l, tensor, 0) * d;
            t.steps[o..o + h * d].copy_from_slice(&co.steps[o..o + h * d]);
            t.classes[o..o + h * d].copy_from_slice(&co.classes[o..o + h * d]);
        }
    }
    let mut p = cal.clone();
    p.targets = vec![t];
    p.validate()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::fixed_calibration;

    #[test]
    fn a_probe_codes_its_layer_at_the_target_and_the_rest_finer() {
        let cal = fixed_calibration(3, 2, 8, 2);
        let coarse = cal.targets[1].bound;
        let p = layer_probe(&cal, Some(1), coarse).unwrap();
        assert_eq!(p.targets.len(), 1);
        assert_eq!(p.targets[0].bound, PROBE_BOUND);
        let n = 2 * 2 * 8; // K and V, heads, components per layer
        let t = &p.targets[0];
        assert_eq!(t.steps[n..2 * n], cal.targets[1].steps[n..2 * n]);
        for i in (0..n).chain(2 * n..3 * n) {
            assert_eq!(t.steps[i], cal.targets[0].steps[i] / 64.0);
        }
        let base = layer_probe(&cal, None, coarse).unwrap();
        assert!(base.targets[0]
            .steps
            .iter()
            .zip(&cal.targets[0].steps)
            .all(|(a, b)| *a == b / 64.0));
        assert!(Calibration::from_bytes(&p.to_bytes().unwrap()).is_ok());
    }

    #[test]
    fn a_probe_of_a_layer_or_target_the_calibration_lacks_is_refused() {
        let cal = fixed_calibration(3, 2, 8, 2);
        assert!(layer_probe(&cal, Some(3), cal.targets[0].bound).is_err());
        assert!(layer_probe(&cal, Some(0), 0.123).is_err());
    }
}
