//! `calibrate` on a small synthetic dump (2 layers, 2 KV heads, 4 query heads, head_dim
//! 16, 200 tokens of low-rank K, V and Q with llama's RoPE applied to K and Q): the
//! calibration validates, round-trips through its file, meets every bound on every layer
//! and codes sections; bad dumps and options are refused.

use std::sync::Arc;

use kvc_transform_coder::{
    calibrate, Calibration, Dump, ErrorKind, Options, Rope, RopeKind, TransformCodec,
};
use kvc_types::{Dtype, Tensor};

mod common;
use common::Rng;

const L: usize = 2;
const HK: usize = 2;
const HQ: usize = 4;
const D: usize = 16;
const T: usize = 200;
const RANK: usize = 4;

fn rope() -> Rope {
    Rope::from_base(RopeKind::Norm, D, D, 10000.0, 1.0).unwrap()
}

/// `[L][T][heads][D]`: per (layer, head) `RANK` fixed directions with per-token weights,
/// a mean, and a little noise; rotated by RoPE at each token's position when `rotate`.
fn low_rank(rng: &mut Rng, heads: usize, rotate: bool) -> Vec<f32> {
    let r = rope();
    let dirs: Vec<f32> = (0..L * heads * RANK * D).map(|_| rng.unit()).collect();
    let mean: Vec<f32> = (0..L * heads * D).map(|_| 0.5 * rng.unit()).collect();
    let mut out = Vec::with_capacity(L * T * heads * D);
    let mut cs = vec![0f64; D];
    for l in 0..L {
        for t in 0..T {
            r.angles(t as u64, &mut cs);
            for h in 0..heads {
                let lh = l * heads + h;
                let mut row: Vec<f32> = mean[lh * D..(lh + 1) * D].to_vec();
                for k in 0..RANK {
                    let w = rng.unit() * (2.0 / (k + 1) as f32);
                    for (x, u) in row.iter_mut().zip(&dirs[(lh * RANK + k) * D..][..D]) {
                        *x += w * u;
                    }
                }
                for x in row.iter_mut() {
                    *x += 0.01 * rng.unit();
                }
                if rotate {
                    r.rotate(&cs, &mut row, false);
                }
                out.extend_from_slice(&row);
            }
        }
    }
    out
}

struct Data {
    k: Vec<f32>,
    v: Vec<f32>,
    q: Vec<f32>,
}

fn data() -> Data {
    let mut rng = Rng(2026);
    Data {
        k: low_rank(&mut rng, HK, true),
        v: low_rank(&mut rng, HK, false),
        q: low_rank(&mut rng, HQ, true),
    }
}

fn dump(d: &Data) -> Dump<'_> {
    Dump {
        n_layer: L,
        n_tokens: T,
        n_kv_head: HK,
        n_head: HQ,
        head_dim: D,
        k: &d.k,
        v: &d.v,
        q: &d.q,
    }
}

fn options(bounds: &[f32]) -> Options {
    Options {
        rope: rope(),
        n_sink: 4,
        bounds: bounds.to_vec(),
        query_from: 16,
        query_stride: 8,
        layer_weights: Vec::new(),
    }
}

#[test]
fn a_synthetic_dump_calibrates_within_its_bounds() {
    let data = data();
    let bounds = [0.05f32, 0.002, 0.01]; // unsorted on purpose: targets come out ascending
    let (cal, report) = calibrate(&dump(&data), &options(&bounds)).unwrap();
    cal.validate().unwrap();
    assert_eq!(
        (cal.n_layer, cal.n_kv_head, cal.head_dim, cal.n_sink),
        (L, HK, D, 4)
    );
    assert_eq!(cal.rope, rope());
    let sorted = [0.002f32, 0.01, 0.05];
    let got: Vec<f32> = cal.targets.iter().map(|t| t.bound).collect();
    assert_eq!(got, sorted);
    assert_eq!(cal.target_names(), ["tc-0.002", "tc-0.01", "tc-0.05"]);
    // The file round trip.
    let file = cal.to_bytes().unwrap();
    assert!(Calibration::from_bytes(&file).unwrap() == cal);
    // The report: per target, the mean of the layers' errors within the bound (what a
    // target promises); larger bounds never cost more.
    assert_eq!(report.len(), 3);
    for (ti, per_layer) in report.iter().enumerate() {
        assert_eq!(per_layer.len(), L);
        let mean = per_layer.iter().map(|r| r.error).sum::<f64>() / L as f64;
        assert!(
            mean <= f64::from(sorted[ti]),
            "target {}: mean error {mean}",
            sorted[ti]
        );
        for (l, r) in per_layer.iter().enumerate() {
            assert!(
                r.error.is_finite() && r.error >= 0.0,
                "target {} layer {l}: error {}",
                sorted[ti],
                r.error
            );
            assert!(r.k_bits > 0.0 && r.v_bits > 0.0, "{r:?}");
            if ti > 0 {
                let p = report[ti - 1][l];
                assert!(
                    r.k_bits + r.v_bits <= p.k_bits + p.v_bits,
                    "layer {l}: bound {} costs {} bits, bound {} {}",
                    sorted[ti],
                    r.k_bits + r.v_bits,
                    sorted[ti - 1],
                    p.k_bits + p.v_bits
                );
            }
        }
    }
    // Low-rank data: well under 16 bits per value at the loosest bound.
    let loose = report[2].iter().map(|r| r.k_bits + r.v_bits).sum::<f64>() / (2.0 * L as f64);
    assert!(loose < 6.0, "{loose} bits per value");
    // Bases orthonormal.
    for b in &cal.bases {
        for i in 0..D {
            for j in 0..D {
                let dot: f32 = (0..D)
                    .map(|c| b.basis[i * D + c] * b.basis[j * D + c])
                    .sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-4, "{i}·{j} = {dot}");
            }
        }
    }
    // The calibration codes the dump's own sections (f32, from position 0: its sink),
    // and the decoded K and V keep the attention-output error of the report (the same
    // sampled causal queries; the report rounds to f16, this decodes to f32).
    let fp = Calibration::fingerprint_of(&file).unwrap();
    let codec = TransformCodec::new(Arc::new(cal), fp, 0.01).unwrap();
    for l in 0..L {
        let mut dec = Vec::new();
        for src in [&data.k, &data.v] {
            let vals = &src[l * T * HK * D..(l + 1) * T * HK * D];
            let raw: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
            let tensor = if std::ptr::eq(src, &data.k) {
                Tensor::K
            } else {
                Tensor::V
            };
            let mut blob = Vec::new();
            codec
                .encode_section(l, tensor, Dtype::F32, 0, T, &raw, &mut blob)
                .unwrap();
            assert!(
                blob.len() < raw.len() / 3,
                "{tensor:?} layer {l}: {} bytes",
                blob.len()
            );
            let mut out = vec![0u8; raw.len()];
            codec
                .decode_section(l, tensor, Dtype::F32, 0, T, &blob, &mut out)
                .unwrap();
            assert_eq!(out[..4 * HK * D * 4], raw[..4 * HK * D * 4], "sink");
            let vals2: Vec<f32> = out
                .chunks_exact(4)
                .map(|a| f32::from_le_bytes(a.try_into().unwrap()))
                .collect();
            dec.push(vals2);
        }
        let kv = T * HK * D;
        let q = &data.q[l * T * HQ * D..(l + 1) * T * HQ * D];
        let exact = attention(
            q,
            &data.k[l * kv..(l + 1) * kv],
            &data.v[l * kv..(l + 1) * kv],
        );
        let coded = attention(q, &dec[0], &dec[1]);
        let e: f64 = exact
            .iter()
            .zip(&coded)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let s: f64 = exact.iter().map(|a| f64::from(*a).powi(2)).sum();
        let err = e / s;
        assert!(
            err <= 0.01 * 1.25,
            "layer {l}: attention error {err}, report {}",
            report[1][l].error
        );
    }
}

/// Causal attention of the queries at 16, 24, ... (as `options` samples them).
fn attention(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let mut out = Vec::new();
    let scale = 1.0 / (D as f32).sqrt();
    for t in (16..T).step_by(8) {
        for i in 0..HQ {
            let h = i / (HQ / HK);
            let qr = &q[(t * HQ + i) * D..][..D];
            let p: Vec<f32> = (0..=t)
                .map(|j| {
                    qr.iter()
                        .zip(&k[(j * HK + h) * D..][..D])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let mx = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = p.iter().map(|x| (x - mx).exp()).collect();
            let sum: f32 = w.iter().sum();
            let mut o = vec![0f32; D];
            for (j, x) in w.iter().enumerate() {
                for (a, b) in o.iter_mut().zip(&v[(j * HK + h) * D..][..D]) {
                    *a += x / sum * b;
                }
            }
            out.extend(o);
        }
    }
    out
}

#[test]
fn bad_dumps_and_options_are_refused() {
    let data = data();
    let good = dump(&data);
    let opts = options(&[0.01]);
    let refused = |d: &Dump<'_>, o: &Options, what: &str| {
        let e = calibrate(d, o).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
    };
    refused(
        &Dump {
            k: &data.k[1..],
            ..good
        },
        &opts,
        "short K",
    );
    refused(
        &Dump {
            v: &data.v[..data.v.len() - D],
            ..good
        },
        &opts,
        "short V",
    );
    refused(&Dump { q: &data.k, ..good }, &opts, "Q of KV heads");
    refused(
        &Dump {
            n_tokens: T + 1,
            ..good
        },
        &opts,
        "more tokens than data",
    );
    for (t, x) in [
        (0usize, f32::NAN),
        (1, f32::INFINITY),
        (2, f32::NEG_INFINITY),
    ] {
        let mut d2 = Data {
            k: data.k.clone(),
            v: data.v.clone(),
            q: data.q.clone(),
        };
        [&mut d2.k, &mut d2.v, &mut d2.q][t][123] = x;
        refused(&dump(&d2), &opts, "a non-finite value");
    }
    // Too few tokens: fewer than the sink plus 2·head_dim (4 + 32), or none after the
    // first query.
    let short = 4 + 2 * D - 1;
    refused(
        &Dump {
            n_tokens: short,
            k: &data.k[..L * short * HK * D],
            v: &data.v[..L * short * HK * D],
            q: &data.q[..L * short * HQ * D],
            ..good
        },
        &opts,
        "too few tokens",
    );
    refused(
        &good,
        &Options {
            query_from: T,
            ..opts.clone()
        },
        "no query",
    );
    // Query heads not a multiple of KV heads, zero heads or layers, odd head_dim.
    refused(&Dump { n_head: 3, ..good }, &opts, "hq 3 of hk 2");
    refused(
        &Dump {
            n_kv_head: 0,
            ..good
        },
        &opts,
        "no KV head",
    );
    refused(&Dump { n_layer: 0, ..good }, &opts, "no layer");
    refused(
        &Dump {
            head_dim: 15,
            ..good
        },
        &opts,
        "odd head_dim",
    );
    // Bounds: none, negative, zero, NaN, infinite.
    for b in [
        vec![],
        vec![-0.01],
        vec![0.0],
        vec![f32::NAN],
        vec![0.01, f32::INFINITY],
    ] {
        refused(
            &good,
            &Options {
                bounds: b.clone(),
                ..opts.clone()
            },
            &format!("{b:?}"),
        );
    }
    // Layer weights: one per layer, each positive and finite.
    for w in [
        vec![1.0; L + 1],
        vec![1.0; L - 1],
        vec![0.0; L],
        vec![-1.0; L],
        vec![f64::NAN; L],
    ] {
        refused(
            &good,
            &Options {
                layer_weights: w.clone(),
                ..opts.clone()
            },
            &format!("layer weights {w:?}"),
        );
    }
    // RoPE rotating more channels than a row has.
    let wide = Rope::from_base(RopeKind::Norm, 32, 32, 10000.0, 1.0).unwrap();
    refused(
        &good,
        &Options {
            rope: wide,
            ..opts.clone()
        },
        "n_rot 32 of 16",
    );
}

/// A RoPE made for another head_dim but rotating no more channels than the dump's rows
/// hold: refused (it would make a calibration whose RoPE is not the file's).
#[test]
fn a_rope_of_another_head_dim_is_refused() {
    let data = data();
    let other = Rope::from_base(RopeKind::Norm, 32, 16, 10000.0, 1.0).unwrap();
    let e = calibrate(
        &dump(&data),
        &Options {
            rope: other,
            ..options(&[0.01])
        },
    )
    .map(|_| ())
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

/// Layer weights move the error: the bound holds for the weighted mean, a layer that weighs
/// more gets no larger an error than the same calibration gives it unweighted, and the
/// layers that weigh less get larger errors for fewer bits.
#[test]
fn layer_weights_move_bits_to_the_layers_that_weigh_more() {
    let data = data();
    let bound = 0.01f32;
    let (_, flat) = calibrate(&dump(&data), &options(&[bound])).unwrap();
    let mut weights = vec![1.0; L];
    weights[0] = 8.0;
    let (_, heavy) = calibrate(
        &dump(&data),
        &Options {
            layer_weights: weights.clone(),
            ..options(&[bound])
        },
    )
    .unwrap();
    let (f, h) = (&flat[0], &heavy[0]);
    let wsum: f64 = weights.iter().sum();
    let weighted = h
        .iter()
        .zip(&weights)
        .map(|(r, w)| r.error * w)
        .sum::<f64>()
        / wsum;
    assert!(
        weighted <= f64::from(bound),
        "weighted mean error {weighted}"
    );
    assert!(
        h[0].error <= f[0].error,
        "the heavy layer: {:?} weighted, {:?} flat",
        h[0],
        f[0]
    );
    for l in 1..L {
        assert!(
            h[l].error > f[l].error && h[l].k_bits + h[l].v_bits < f[l].k_bits + f[l].v_bits,
            "layer {l}: {:?} weighted, {:?} flat",
            h[l],
            f[l]
        );
    }
}
