//! kvq channel groups against the NumPy reference written from docs/formats/kvq.md
//! ("Channel groups"): `scripts/kvq_channel_reference.py`, fixture
//! `tests/fixtures/kvq_channel_reference.json`, regenerated and diffed by
//! `scripts/ci.d/45-kvq-reference.sh`.
//!
//! The document fixes every quantizer operation in f32, and the reference does them in
//! NumPy float32, so the blocks and the decoded rows must match bit for bit. The scores are
//! the reference's float64 dot products of the decoded rows; the codec reads them from the
//! codes in f32, so they agree within f32 rounding of the sums' terms (`(d + 16) * 2^-24`
//! of `sum_c |q_c| (|min_c| + code * step_c)`).

use kvc_kvq::ChannelGroupCodec;
use kvc_types::fnv1a64;
use serde_json::Value;

const FIXTURE: &str = include_str!("fixtures/kvq_channel_reference.json");

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        // 9 significant digits: the f64 parsed rounds back to the exact f32
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn f16_bits(b: &[u8], at: usize) -> f64 {
    f64::from(half_to_f32(u16::from_le_bytes([b[at], b[at + 1]])))
}

fn half_to_f32(h: u16) -> f32 {
    let (exp, man) = (i32::from((h >> 10) & 0x1f), f32::from(h & 0x3ff));
    let mag = match exp {
        0 => man * 2f32.powi(-24),
        0x1f => f32::INFINITY,
        e => (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    };
    if h & 0x8000 != 0 {
        -mag
    } else {
        mag
    }
}

#[test]
fn blocks_and_decoded_rows_match_the_reference_bit_for_bit() {
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    assert_eq!(fixture["format"], "kvq-channel-reference");
    assert_eq!(fixture["version"], 1);
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 10);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let bits = case["bits"].as_u64().unwrap() as u8;
        let d = case["head_dim"].as_u64().unwrap() as usize;
        let g = case["group"].as_u64().unwrap() as usize;
        let what = format!("{name}, {bits} bits, head_dim {d}, group {g}");
        let c = ChannelGroupCodec::new(bits, d, g).unwrap();
        let rows = floats(&case["rows"]);
        assert_eq!(rows.len(), g * d, "{what}");
        let want = unhex(case["block"].as_str().unwrap());
        let mut block = vec![0u8; c.block_bytes()];
        c.quantize_block(&rows, &mut block).unwrap();
        assert_eq!(block.len(), want.len(), "{what}");
        if let Some(i) = block.iter().zip(&want).position(|(a, b)| a != b) {
            panic!(
                "{what}: block byte {i} is {:#04x}, the reference has {:#04x}",
                block[i], want[i]
            );
        }

        let mut y = vec![0f32; g * d];
        c.dequantize_block(&block, &mut y).unwrap();
        let head = floats(&case["decoded_rows_0_1"]);
        for (i, (a, b)) in y.iter().zip(&head).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{what}: decoded value {i}: {a} vs {b}"
            );
        }
        let h = fnv1a64(&y.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        assert_eq!(
            format!("{h:016x}"),
            case["decoded_fnv1a64"].as_str().unwrap(),
            "{what}: decoded rows"
        );
        let mut r = vec![0f32; d];
        for t in 0..g {
            c.dequantize_row(&block, t, &mut r).unwrap();
            assert_eq!(r, y[t * d..(t + 1) * d], "{what}: row {t}");
        }

        let q = floats(&case["q"]);
        let want_scores: Vec<f64> = case["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let mut s = vec![0f32; g];
        c.dot_block(&q, &block, &mut s).unwrap();
        for t in 0..g {
            let mag: f64 = (0..d)
                .map(|i| {
                    let step = f16_bits(&block, 2 * i);
                    let lo = f16_bits(&block, 2 * d + 2 * i);
                    let code = if step > 0.0 {
                        ((f64::from(y[t * d + i]) - lo) / step).round()
                    } else {
                        0.0
                    };
                    f64::from(q[i].abs()) * (lo.abs() + code * step)
                })
                .sum();
            let bound = (d as f64 + 16.0) * 2f64.powi(-24) * mag + 1e-9 * want_scores[t].abs();
            let e = (f64::from(s[t]) - want_scores[t]).abs();
            assert!(
                e <= bound,
                "{what}: score {t}: {} vs {} ({e} > {bound})",
                s[t],
                want_scores[t]
            );
        }
    }
}
