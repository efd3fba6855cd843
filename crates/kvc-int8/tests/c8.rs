//! C8: kernels against the formula, calibration, checkpoints (Python-written fixtures,
//! round trips, malformed files), and the error on real KV data.

use std::path::{Path, PathBuf};

use kvc_cache::{Addressing, TensorLayout};
use kvc_int8::msmodelslim::{
    check_description, parse_weights, read_checkpoint, weights_bytes, write_checkpoint,
};
use kvc_int8::{
    calibrate, dequantize, dequantize_rows, quant_error, quantize, quantize_rows, roundtrip_rows,
    C8Params, ChannelQuant, ChannelStats, Error, ErrorKind, LayerQuant,
};
use kvc_types::{Dtype, FloatDtype};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/c8")
}

fn to_f32(dt: Dtype, b: &[u8]) -> f32 {
    match dt {
        Dtype::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
        Dtype::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        Dtype::I8 => f32::from(b[0] as i8),
    }
}

fn from_f32(dt: Dtype, x: f32) -> Vec<u8> {
    match dt {
        Dtype::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
        Dtype::Bf16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
        Dtype::F32 => x.to_le_bytes().to_vec(),
        Dtype::I8 => vec![x as i8 as u8],
    }
}

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        })
        .collect()
}

fn layouts() -> Vec<Addressing> {
    vec![
        Addressing::CellRows,
        Addressing::CellColumns,
        Addressing::HeadMajor,
        Addressing::MnnKey { hp: 8, lp: 2 },
        Addressing::MnnValue {
            hp: 4,
            lp: 1,
            block: 6,
        },
    ]
}

#[test]
fn quantize_and_dequantize_follow_the_formula_in_every_layout_and_dtype() {
    let (heads, dim, cap) = (2, 6, 13);
    for a in layouts() {
        for dt in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
            let l = TensorLayout::new(a, dt, heads, dim, cap).unwrap();
            let li = l.with_dtype(Dtype::I8).unwrap();
            let vals = rand_f32(cap * l.channels(), 7);
            let mut src = vec![0u8; l.byte_len()];
            let es = dt.size();
            for t in 0..cap {
                for c in 0..l.channels() {
                    let o = (l.token_offset(t) + l.channel_offset(c)) * es;
                    src[o..o + es].copy_from_slice(&from_f32(dt, vals[t * l.channels() + c]));
                }
            }
            let q = calibrate(&src, &l, 0..cap, false).unwrap();
            let mut qi = vec![0xAAu8; li.byte_len()];
            quantize(&src, &l, &mut qi, &li, 2..11, &q).unwrap();
            let mut back = vec![0u8; l.byte_len()];
            dequantize(&qi, &li, &mut back, &l, 2..11, &q).unwrap();
            for t in 0..cap {
                for c in 0..l.channels() {
                    let e = l.token_offset(t) + l.channel_offset(c);
                    let x = to_f32(dt, &src[e * es..(e + 1) * es]);
                    let (s, f) = (q.scale()[c], q.offset()[c]);
                    let want = (x / s + f).round_ties_even().clamp(-128.0, 127.0) as i8;
                    if (2..11).contains(&t) {
                        assert_eq!(qi[e] as i8, want, "{a:?} {dt} t={t} c={c}");
                        let deq = (f32::from(want) - f) * s;
                        let got = to_f32(dt, &back[e * es..(e + 1) * es]);
                        assert_eq!(got.to_bits(), to_f32(dt, &from_f32(dt, deq)).to_bits());
                        assert!(
                            (got - x).abs() <= s * 0.5 + x.abs() * 0.01 + 1e-6,
                            "{a:?} {dt} {x} {got}"
                        );
                    } else {
                        assert_eq!(qi[e], 0xAA, "token outside the range written");
                    }
                }
            }
            let st = quant_error(&src, &l, 0..cap, &q).unwrap();
            assert_eq!(st.count as usize, cap * l.channels());
            assert!(st.snr_db() > 35.0, "{a:?} {dt} snr {}", st.snr_db());
        }
    }
}

#[test]
fn calibration_matches_msmodelslim() {
    // Two channels, values [-1, 3] and [0.5, 2].
    let l = TensorLayout::new(Addressing::CellRows, Dtype::F32, 1, 2, 2).unwrap();
    let src: Vec<u8> = [-1.0f32, 0.5, 3.0, 2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let s = calibrate(&src, &l, 0..2, true).unwrap();
    assert_eq!(s.scale(), &[3.0 / 127.0, 2.0 / 127.0]);
    assert!(s.is_symmetric());
    let a = calibrate(&src, &l, 0..2, false).unwrap();
    let s0 = 4.0f32 / 255.0;
    assert_eq!(a.scale(), &[s0, 2.0 / 255.0]);
    // offset = round(-min / scale) - 128; the channel with min > 0 clamps min to 0.
    assert_eq!(
        a.offset(),
        &[(1.0f32 / s0).round_ties_even() - 128.0, -128.0]
    );
    // Constant zero channels get scale eps, never 0.
    let z = calibrate(&[0u8; 16], &l, 0..2, false).unwrap();
    assert_eq!(z.scale(), &[f32::EPSILON; 2]);
    // NaN in the cache is an error, not a silent scale.
    let nan: Vec<u8> = [f32::NAN, 0.0, 1.0, 1.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert!(matches!(
        calibrate(&nan, &l, 0..2, false),
        Err(Error::NonFinite { .. })
    ));
}

#[test]
fn kernel_errors_are_typed() {
    let l = TensorLayout::new(Addressing::HeadMajor, Dtype::F16, 2, 4, 8).unwrap();
    let li = l.with_dtype(Dtype::I8).unwrap();
    let q = ChannelQuant::new(vec![0.1; 8], vec![0.0; 8]).unwrap();
    let src = vec![0u8; l.byte_len()];
    let mut dst = vec![0u8; li.byte_len()];
    assert!(quantize(&src, &l, &mut dst, &li, 0..9, &q).is_err());
    assert!(quantize(&src[1..], &l, &mut dst, &li, 0..8, &q).is_err());
    assert!(quantize(&src, &l, &mut dst, &l, 0..8, &q).is_err());
    let other = TensorLayout::new(Addressing::CellRows, Dtype::I8, 2, 4, 8).unwrap();
    assert!(quantize(&src, &l, &mut dst, &other, 0..8, &q).is_err());
    let q7 = ChannelQuant::new(vec![0.1; 7], vec![0.0; 7]).unwrap();
    assert!(quantize(&src, &l, &mut dst, &li, 0..8, &q7).is_err());
    assert!(ChannelQuant::new(vec![0.0], vec![0.0]).is_err());
    assert!(ChannelQuant::new(vec![1.0], vec![f32::NAN]).is_err());
    assert!(ChannelQuant::new(vec![1.0; 2], vec![0.0]).is_err());
}

fn expected_values(case: &str) -> serde_json::Value {
    let s = std::fs::read_to_string(fixtures().join(case).join("expected.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

#[test]
fn python_written_checkpoints_read_back_exactly() {
    for case in ["llama_f16_sym", "chatglm_bf16_asym", "qwen_f32_asym_2d"] {
        let p = read_checkpoint(&fixtures().join(case)).unwrap();
        let e = expected_values(case);
        let layers = e["layers"].as_object().unwrap();
        assert_eq!(p.len(), layers.len(), "{case}");
        assert_eq!(
            p.is_symmetric(),
            e["symmetric"].as_bool().unwrap(),
            "{case}"
        );
        for (i, lv) in layers {
            let lq = p.layer(i.parse().unwrap()).unwrap();
            for (key, q) in [("k_proj", &lq.k), ("v_proj", &lq.v)] {
                for (kind, got) in [
                    ("kv_cache_scale", q.scale()),
                    ("kv_cache_offset", q.offset()),
                ] {
                    let want: Vec<f32> = lv[format!("{key}.{kind}")]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect();
                    assert_eq!(got, &want[..], "{case} layer {i} {key}.{kind}");
                }
            }
        }
    }
}

fn sample_params(channels: usize, layers: usize, sym: bool) -> C8Params {
    let mut p = C8Params::new();
    for i in 0..layers {
        let s: Vec<f32> = (0..channels)
            .map(|c| 0.01 + (c + i) as f32 * 0.001)
            .collect();
        let o: Vec<f32> = (0..channels)
            .map(|c| if sym { 0.0 } else { (c % 7) as f32 - 3.0 })
            .collect();
        let q = ChannelQuant::new(s, o).unwrap();
        p.insert(i, LayerQuant { k: q.clone(), v: q }).unwrap();
    }
    p
}

#[test]
fn written_checkpoints_read_back() {
    let dir = std::env::temp_dir().join(format!("kvc-c8-rt-{}", std::process::id()));
    for dt in [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16] {
        let p = sample_params(24, 3, false);
        write_checkpoint(&dir, &p, dt).unwrap();
        let r = read_checkpoint(&dir).unwrap();
        assert_eq!(r.len(), 3);
        for (i, l) in p.layers() {
            let g = r.layer(i).unwrap();
            for (a, b) in l.k.scale().iter().zip(g.k.scale()) {
                let tol = if dt == FloatDtype::F32 { 0.0 } else { a * 4e-3 };
                assert!((a - b).abs() <= tol, "{dt:?} {a} {b}");
            }
            assert_eq!(l.v.offset(), g.v.offset());
        }
        let desc = std::fs::read(dir.join("quant_model_description.json")).unwrap();
        check_description(&desc, "x").unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tensor to serialize: name, dtype, shape, bytes.
type Spec<'a> = (&'a str, safetensors::Dtype, Vec<usize>, Vec<u8>);

#[test]
fn malformed_files_give_typed_errors() {
    // Descriptions.
    assert!(matches!(
        check_description(b"{", "d"),
        Err(Error::BadDescription { .. })
    ));
    assert!(matches!(
        check_description(b"[1]", "d"),
        Err(Error::BadDescription { .. })
    ));
    assert!(matches!(
        check_description(b"{\"kv_cache_type\": \"C4\"}", "d"),
        Err(Error::NotC8 { .. })
    ));
    assert!(matches!(
        check_description(b"{\"model_quant_type\": \"W8A8\"}", "d"),
        Err(Error::NotC8 { .. })
    ));
    assert!(check_description(b"{\"kv_quant_type\": \"C8\"}", "d").is_ok());

    let good = weights_bytes(&sample_params(8, 2, true), FloatDtype::F16).unwrap();
    assert!(parse_weights(&good, "w").is_ok());
    // Truncations at every length fail cleanly.
    for n in 0..good.len() {
        let e = parse_weights(&good[..n], "w").unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::CorruptData), "{n}: {e}");
    }
    // A header length pointing past the end, and garbage.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse_weights(&huge, "w"),
        Err(Error::BadSafetensors { .. })
    ));
    assert!(matches!(
        parse_weights(b"not a safetensors file", "w"),
        Err(Error::BadSafetensors { .. })
    ));

    let st = |tensors: Vec<(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)>| {
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, d, s, b)| {
                (
                    *n,
                    safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    };
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let full = |scale: Vec<u8>, dt, shape: Vec<usize>| {
        vec![
            (
                "model.layers.0.self_attn.k_proj.kv_cache_scale",
                dt,
                shape.clone(),
                scale.clone(),
            ),
            (
                "model.layers.0.self_attn.k_proj.kv_cache_offset",
                dt,
                shape.clone(),
                scale.clone(),
            ),
            (
                "model.layers.0.self_attn.v_proj.kv_cache_scale",
                dt,
                shape.clone(),
                scale.clone(),
            ),
            (
                "model.layers.0.self_attn.v_proj.kv_cache_offset",
                dt,
                shape,
                scale,
            ),
        ]
    };
    use safetensors::Dtype as D;
    // Unsupported dtype, 2-D shape, zero scale, missing offset, no layer number,
    // channel mismatch between layers.
    let cases: Vec<(Vec<Spec<'_>>, &str)> = vec![
        (full(vec![0; 16], D::I32, vec![4]), "dtype"),
        (full(f32s(&[1.0; 4]), D::F32, vec![2, 2]), "shape"),
        (full(f32s(&[0.0; 4]), D::F32, vec![4]), "scale"),
        (
            full(f32s(&[1.0; 4]), D::F32, vec![4])[..3].to_vec(),
            "missing",
        ),
        (
            vec![("k_proj.kv_cache_scale", D::F32, vec![1], f32s(&[1.0]))],
            "layer number",
        ),
        (
            {
                let mut v = full(f32s(&[1.0; 4]), D::F32, vec![4]);
                v.push((
                    "model.layers.1.self_attn.k_proj.kv_cache_scale",
                    D::F32,
                    vec![2],
                    f32s(&[1.0; 2]),
                ));
                v.push((
                    "model.layers.1.self_attn.k_proj.kv_cache_offset",
                    D::F32,
                    vec![2],
                    f32s(&[1.0; 2]),
                ));
                v.push((
                    "model.layers.1.self_attn.v_proj.kv_cache_scale",
                    D::F32,
                    vec![2],
                    f32s(&[1.0; 2]),
                ));
                v.push((
                    "model.layers.1.self_attn.v_proj.kv_cache_offset",
                    D::F32,
                    vec![2],
                    f32s(&[1.0; 2]),
                ));
                v
            },
            "channels",
        ),
        (
            vec![("model.layers.0.mlp.weight", D::F32, vec![1], f32s(&[1.0]))],
            "no C8",
        ),
    ];
    for (tensors, what) in cases {
        let bytes = st(tensors);
        let e = parse_weights(&bytes, "w").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptData, "{what}: {e}");
    }
    // A directory without the files.
    let e = read_checkpoint(Path::new("/nonexistent-kvc-dir")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
}

/// The real-KV directory: KVC_REALKV_DIR, ../shared/data/realkv, else data/sample.
fn realkv_dir() -> PathBuf {
    if let Ok(d) = std::env::var("KVC_REALKV_DIR") {
        return PathBuf::from(d);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let shared = root.join("../shared/data/realkv");
    if shared.join("textA.K.f16.bin").is_file() {
        shared
    } else {
        root.join("data/sample")
    }
}

#[test]
fn c8_on_real_kv_keeps_snr() {
    let dir = realkv_dir();
    for t in ["K", "V"] {
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("textA.{t}.f16.json"))).unwrap(),
        )
        .unwrap();
        let shape: Vec<usize> = json["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let (layers, tokens, heads, dim) = (shape[0], shape[1].min(512), shape[2], shape[3]);
        let raw = std::fs::read(dir.join(format!("textA.{t}.f16.bin"))).unwrap();
        let per_layer = shape[1] * heads * dim * 2;
        let l = TensorLayout::new(Addressing::CellRows, Dtype::F16, heads, dim, tokens).unwrap();
        for layer in 0..layers.min(4) {
            let src = &raw[layer * per_layer..layer * per_layer + l.byte_len()];
            for sym in [true, false] {
                let q = calibrate(src, &l, 0..tokens, sym).unwrap();
                let st = quant_error(src, &l, 0..tokens, &q).unwrap();
                // int8 per channel on real K/V: ~8 bits of the range, so well above 25 dB.
                assert!(
                    st.snr_db() > 25.0,
                    "{t} layer {layer} sym {sym}: snr {}",
                    st.snr_db()
                );
                assert!(
                    st.max_abs
                        <= f64::from(q.scale().iter().cloned().fold(0.0, f32::max)) * 0.5 + 1e-6
                );
            }
        }
    }
}

fn rows_bytes(dt: Dtype, vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|&x| from_f32(dt, x)).collect()
}

#[test]
fn row_batches_quantize_like_a_llama_layer() {
    // 3 KV heads x 64 (SmolLM2), 9 rows: the rows of tokens 4..13 of a llama.cpp K tensor.
    let (channels, cap, rows) = (192usize, 16usize, 9usize);
    for dt in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
        let l = TensorLayout::new(Addressing::CellRows, dt, 3, 64, cap).unwrap();
        let li = l.with_dtype(Dtype::I8).unwrap();
        let cache = rows_bytes(dt, &rand_f32(cap * channels, 11));
        let q = calibrate(&cache, &l, 0..cap, false).unwrap();
        let es = dt.size();
        let batch = &cache[4 * channels * es..(4 + rows) * channels * es];

        let mut want = vec![0u8; li.byte_len()];
        quantize(&cache, &l, &mut want, &li, 4..4 + rows, &q).unwrap();
        let mut got = vec![0x55u8; rows * channels + 3];
        quantize_rows(batch, dt, rows, &q, &mut got).unwrap();
        assert_eq!(
            &got[..rows * channels],
            &want[4 * channels..(4 + rows) * channels]
        );
        assert_eq!(
            &got[rows * channels..],
            &[0x55; 3],
            "only the rows are written"
        );

        let mut back = vec![0u8; rows * channels * es];
        dequantize_rows(&got[..rows * channels], rows, &q, &mut back, dt).unwrap();
        let mut inplace = batch.to_vec();
        roundtrip_rows(&mut inplace, dt, rows, &q).unwrap();
        assert_eq!(inplace, back);
        let mut full = vec![0u8; l.byte_len()];
        dequantize(&want, &li, &mut full, &l, 4..4 + rows, &q).unwrap();
        assert_eq!(back, &full[4 * channels * es..(4 + rows) * channels * es]);

        // Zero rows: nothing to do, nothing written.
        quantize_rows(&[], dt, 0, &q, &mut []).unwrap();
        roundtrip_rows(&mut [], dt, 0, &q).unwrap();
    }
}

#[test]
fn row_batch_errors_are_typed_and_write_nothing() {
    let q = ChannelQuant::new(vec![0.1; 8], vec![0.0; 8]).unwrap();
    let src = vec![0x3cu8; 2 * 8 * 2]; // 2 f16 rows of 8
    let mut dst = vec![7u8; 16];
    let kind = |e: Error| e.kind();
    // Source one byte short / long, one row more than it holds.
    for bad in [&src[1..], &[src.as_slice(), &[0]].concat()[..]] {
        let e = quantize_rows(bad, Dtype::F16, 2, &q, &mut dst).unwrap_err();
        assert!(matches!(e, Error::LayoutMismatch { .. }), "{e}");
        assert_eq!(kind(e), ErrorKind::InvalidArgument);
    }
    assert!(quantize_rows(&src, Dtype::F16, 3, &q, &mut dst).is_err());
    // Destination too small.
    let e = quantize_rows(&src, Dtype::F16, 2, &q, &mut dst[..15]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BufferTooSmall {
                needed: 16,
                found: 15,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(kind(e), ErrorKind::BufferTooSmall);
    // int8 is not a float source; overflowing row counts.
    let e = quantize_rows(&src, Dtype::I8, 2, &q, &mut dst).unwrap_err();
    assert_eq!(kind(e), ErrorKind::Unsupported);
    let e = quantize_rows(&src, Dtype::F16, usize::MAX / 4, &q, &mut dst).unwrap_err();
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
    let e = quantize_rows(&src, Dtype::F16, usize::MAX, &q, &mut dst).unwrap_err();
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
    assert_eq!(dst, vec![7u8; 16], "nothing written on error");

    let i8s = vec![1u8; 16];
    let mut out = vec![9u8; 32];
    assert!(matches!(
        dequantize_rows(&i8s[1..], 2, &q, &mut out, Dtype::F16),
        Err(Error::LayoutMismatch { .. })
    ));
    assert!(matches!(
        dequantize_rows(&i8s, 2, &q, &mut out[..31], Dtype::F16),
        Err(Error::BufferTooSmall { .. })
    ));
    assert!(matches!(
        dequantize_rows(&i8s, 2, &q, &mut out, Dtype::I8),
        Err(Error::UnsupportedDType { .. })
    ));
    assert_eq!(out, vec![9u8; 32]);

    let mut data = src.clone();
    assert!(roundtrip_rows(&mut data[..31], Dtype::F16, 2, &q).is_err());
    assert!(roundtrip_rows(&mut data, Dtype::F32, 2, &q).is_err()); // 32 bytes = 1 f32 row
    assert!(roundtrip_rows(&mut data, Dtype::I8, 4, &q).is_err());
    assert_eq!(data, src);
}

#[test]
fn row_calibration_equals_layout_calibration() {
    let (channels, cap) = (24usize, 20usize);
    for dt in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
        let l = TensorLayout::new(Addressing::CellRows, dt, 2, 12, cap).unwrap();
        let cache = rows_bytes(dt, &rand_f32(cap * channels, 5));
        let es = dt.size();
        let mut by_layout = ChannelStats::new(channels);
        by_layout.observe(&cache, &l, 0..cap).unwrap();
        // The same tokens in batches of 7, 1, 0 and 12 rows.
        let mut by_rows = ChannelStats::new(channels);
        let mut t = 0;
        for n in [7usize, 1, 0, 12] {
            by_rows
                .observe_rows(&cache[t * channels * es..(t + n) * channels * es], dt, n)
                .unwrap();
            t += n;
        }
        assert_eq!(by_rows.min(), by_layout.min());
        assert_eq!(by_rows.max(), by_layout.max());
        assert_eq!(by_rows.tokens_observed(), cap as u64);
        for sym in [false, true] {
            assert_eq!(by_rows.finish(sym).unwrap(), by_layout.finish(sym).unwrap());
        }

        // A NaN in the last row, a wrong length, int8: all or nothing.
        let before = by_rows.clone();
        let mut bad = cache[..2 * channels * es].to_vec();
        let nan = from_f32(dt, f32::NAN);
        let at = (2 * channels - 1) * es;
        bad[at..at + es].copy_from_slice(&nan);
        let e = by_rows.observe_rows(&bad, dt, 2).unwrap_err();
        assert!(
            matches!(e, Error::NonFinite { index, .. } if index == 2 * channels - 1),
            "{e}"
        );
        assert!(by_rows.observe_rows(&cache[..es], dt, 1).is_err());
        assert!(by_rows
            .observe_rows(&cache[..channels], Dtype::I8, 1)
            .is_err());
        assert_eq!(by_rows, before);
    }
}
