//! Malformed weight files: every truncation, every bad header field, inconsistent shapes,
//! overflowing sizes, random corruption. Each gives a typed error, never a panic.

use kvc_mlp::{
    CompressParams, Compressor, CompressorWeights, Error, ErrorKind, KvShape, LayerMlps, Linear,
    Mlp, WeightsHeader, HEADER_SIZE,
};
use kvc_types::FloatDtype;
use proptest::prelude::*;

const D: u32 = 2;
const F: u32 = 2;

fn header(dtype: FloatDtype, layers: u32, count: u32) -> WeightsHeader {
    WeightsHeader {
        dtype,
        num_layers: layers,
        num_heads: 0,
        head_dim: D,
        hidden_size: D * F,
        compression_factor: F,
        min_seq_len: 2,
        weight_count_per_layer: count,
        metadata_size_bytes: 0,
    }
}

fn push_elems(out: &mut Vec<u8>, dtype: FloatDtype, vals: impl Iterator<Item = f32>) {
    for v in vals {
        match dtype {
            FloatDtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
            FloatDtype::F16 => {
                out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes())
            }
            FloatDtype::Bf16 => {
                out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes())
            }
        }
    }
}

/// A small valid file: `layers` layers of `count` blocks, bias on every other block.
fn file(h: WeightsHeader, metadata: &[u8]) -> Vec<u8> {
    let mut b = h.to_bytes().to_vec();
    b.extend_from_slice(metadata);
    for layer in 0..h.num_layers {
        for i in 0..h.weight_count_per_layer {
            let cols = if i % 3 == 0 { D * F } else { D };
            let has_bias = i % 2;
            for v in [D, cols, has_bias] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            let seed = (layer * 100 + i) as f32;
            push_elems(
                &mut b,
                h.dtype,
                (0..D * cols).map(|j| (seed + j as f32) * 0.125),
            );
            if has_bias == 1 {
                push_elems(&mut b, h.dtype, (0..D).map(|j| -(j as f32) * 0.5));
            }
        }
    }
    b
}

fn valid() -> Vec<u8> {
    file(header(FloatDtype::F32, 1, 6), &[])
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn err(bytes: &[u8]) -> Error {
    CompressorWeights::from_bytes(bytes).expect_err("must be rejected")
}

#[test]
fn valid_files_load_in_every_dtype_and_count() {
    for dtype in [FloatDtype::F16, FloatDtype::Bf16, FloatDtype::F32] {
        for count in [6, 12] {
            let w = CompressorWeights::from_bytes(&file(header(dtype, 3, count), &[])).unwrap();
            assert_eq!(w.num_layers(), 3);
            assert_eq!((w.head_dim(), w.factor(), w.min_seq_len()), (2, 2, 2));
            assert_eq!(w.records().len(), 3 * count as usize);
            let l = w.layer(2).unwrap();
            assert!(l.text().is_some());
            assert_eq!(l.image().is_some(), count == 12);
            // Weights are stored transposed: W[o][i] = (seed + o*cols + i) / 8.
            let lin = &l.text_k.as_ref().unwrap().layers()[0];
            assert_eq!(lin.weight_t()[2], (200.0 + 1.0) * 0.125); // W[0][1]
            assert_eq!(lin.bias(), None);
            assert_eq!(
                l.text_k.as_ref().unwrap().layers()[1].bias(),
                Some(&[0.0, -0.5][..])
            );
        }
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    let mut with_meta = header(FloatDtype::F16, 2, 12);
    with_meta.metadata_size_bytes = 3;
    for bytes in [valid(), file(with_meta, &[7, 7, 7])] {
        CompressorWeights::from_bytes(&bytes).unwrap();
        for n in 0..bytes.len() {
            let e = err(&bytes[..n]);
            assert_eq!(e.kind(), ErrorKind::CorruptData, "len {n}: {e}");
            assert!(matches!(e, Error::Truncated { .. }), "len {n}: {e}");
        }
    }
}

#[test]
fn truncation_names_field_and_offset() {
    let b = valid();
    match err(&b[..HEADER_SIZE + 5]) {
        Error::Truncated {
            field,
            offset,
            needed,
            available,
        } => {
            assert_eq!((field, offset, needed, available), ("cols", 48, 4, 1));
        }
        e => panic!("{e}"),
    }
    let msg = err(&b[..HEADER_SIZE + 13]).to_string();
    assert!(
        msg.contains("weight_data") && msg.contains("byte 56"),
        "{msg}"
    );
}

#[test]
fn bad_header_fields() {
    let cases: &[(usize, u32, &str)] = &[
        (12, 0, "num_layers"),
        (28, 0, "compression_factor"),
        (36, 7, "weight_count_per_layer"),
        (36, 0, "weight_count_per_layer"),
        (24, 5, "hidden_size"),
    ];
    for &(off, val, name) in cases {
        let mut b = valid();
        put_u32(&mut b, off, val);
        match err(&b) {
            Error::BadHeaderField { field, offset, .. } => {
                assert_eq!((field, offset), (name, off as u64))
            }
            e => panic!("{name}: {e}"),
        }
    }
    let mut b = valid();
    put_u32(&mut b, 0, 0x4B56_434E);
    assert!(matches!(err(&b), Error::BadMagic { found: 0x4B56_434E }));
    let mut b = valid();
    put_u32(&mut b, 4, 2);
    let e = err(&b);
    assert!(matches!(e, Error::UnsupportedVersion { found: 2 }));
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    let mut b = valid();
    b[8] = 3;
    assert!(matches!(
        err(&b),
        Error::BadHeaderField {
            field: "dtype_code",
            offset: 8,
            found: 3,
            ..
        }
    ));
    let mut b = valid();
    b[10] = 1;
    assert!(matches!(
        err(&b),
        Error::BadHeaderField {
            field: "reserved",
            offset: 10,
            ..
        }
    ));
}

#[test]
fn bad_block_shapes() {
    // Block 0 at byte 44: rows, cols, has_bias.
    for (off, val, name) in [(44, 3, "rows"), (48, 2, "cols"), (52, 2, "has_bias")] {
        let mut b = valid();
        put_u32(&mut b, off, val);
        match err(&b) {
            Error::BadWeightField {
                layer,
                index,
                field,
                offset,
                ..
            } => assert_eq!((layer, index, field, offset), (0, 0, name, off as u64)),
            e => panic!("{name}: {e}"),
        }
    }
    // Block 1 (a D x D block) given D x D*F columns.
    let mut b = valid();
    let block1 = HEADER_SIZE + 12 + 4 * (D * D * F) as usize;
    put_u32(&mut b, block1 + 4, D * F);
    assert!(matches!(
        err(&b),
        Error::BadWeightField {
            index: 1,
            field: "cols",
            ..
        }
    ));
}

#[test]
fn trailing_bytes_and_metadata() {
    let mut b = valid();
    let n = b.len();
    b.push(0);
    assert!(matches!(
        err(&b),
        Error::TrailingBytes { offset, count: 1 } if offset == n as u64
    ));
    // Metadata is skipped; the weights are the same.
    let mut h = header(FloatDtype::F32, 1, 6);
    h.metadata_size_bytes = 9;
    let with_meta = CompressorWeights::from_bytes(&file(h, b"{\"a\": 1}\n")).unwrap();
    let plain = CompressorWeights::from_bytes(&valid()).unwrap();
    assert_eq!(with_meta.layer(0).unwrap(), plain.layer(0).unwrap());
    // Metadata larger than the file.
    let mut b = valid();
    put_u32(&mut b, 40, u32::MAX);
    assert!(matches!(
        err(&b),
        Error::Truncated {
            field: "metadata",
            offset: 44,
            ..
        }
    ));
}

#[test]
fn zero_head_dim_and_hidden_are_inferred() {
    let mut b = valid();
    put_u32(&mut b, 20, 0);
    put_u32(&mut b, 24, 0);
    let w = CompressorWeights::from_bytes(&b).unwrap();
    assert_eq!((w.head_dim(), w.factor()), (2, 2));
    // ...but must still agree with the blocks.
    put_u32(&mut b, 24, 6);
    assert!(matches!(
        err(&b),
        Error::BadHeaderField {
            field: "hidden_size",
            ..
        }
    ));
}

#[test]
fn overflowing_sizes_do_not_allocate_or_panic() {
    // A header claiming u32::MAX layers of 12 blocks in a tiny file.
    let mut b = valid();
    put_u32(&mut b, 12, u32::MAX);
    put_u32(&mut b, 36, 12);
    assert!(matches!(err(&b), Error::Truncated { .. }));
    // head_dim = rows = cols = u32::MAX, factor 1: rows * cols * 4 overflows u64.
    let mut h = header(FloatDtype::F32, 1, 6);
    h.head_dim = u32::MAX;
    h.hidden_size = u32::MAX;
    h.compression_factor = 1;
    let mut b = h.to_bytes().to_vec();
    for v in [u32::MAX, u32::MAX, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.resize(b.len() + 64, 0);
    assert!(matches!(
        err(&b),
        Error::SizeOverflow {
            field: "weight_data",
            offset: 44
        }
    ));
    // A huge but non-overflowing block: Truncated, no allocation of its size.
    let mut h = header(FloatDtype::F16, 1, 6);
    h.head_dim = 1 << 20;
    h.hidden_size = 1 << 21;
    let mut b = h.to_bytes().to_vec();
    for v in [1u32 << 20, 1 << 21, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    assert!(matches!(
        err(&b),
        Error::Truncated {
            field: "weight_data",
            ..
        }
    ));
    // head_dim * factor beyond u32 in the header: no hidden_size can match.
    let mut h = header(FloatDtype::F32, 1, 6);
    h.head_dim = u32::MAX;
    h.compression_factor = u32::MAX;
    h.hidden_size = 1;
    assert!(matches!(
        err(&h.to_bytes()),
        Error::BadHeaderField {
            field: "hidden_size",
            ..
        }
    ));
}

#[test]
fn io_error_names_the_file() {
    let e = CompressorWeights::load("/nonexistent/kvc-mlp.bin").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("/nonexistent/kvc-mlp.bin"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_corruption_never_panics(
        edits in proptest::collection::vec((0usize..400, any::<u8>()), 1..6),
        cut in 0usize..400,
    ) {
        let mut b = file(header(FloatDtype::Bf16, 2, 6), &[]);
        for (pos, val) in edits {
            let n = b.len();
            b[pos % n] = val;
        }
        let n = b.len();
        b.truncate(n - cut.min(n) / 4);
        let _ = CompressorWeights::from_bytes(&b);
    }
}

// ---------------------------------------------------------------- compressor arguments

fn tiny_mlp() -> Mlp {
    let l0 = Linear::new(2, 4, &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0], None).unwrap();
    let id = || Linear::new(2, 2, &[1.0, 0.0, 0.0, 1.0], None).unwrap();
    Mlp::new([l0, id(), id()]).unwrap()
}

fn comp(text: bool, image: bool) -> Compressor {
    let m = || Some(tiny_mlp());
    let layer = LayerMlps {
        text_k: if text { m() } else { None },
        text_v: if text { m() } else { None },
        image_k: if image { m() } else { None },
        image_v: if image { m() } else { None },
    };
    Compressor::new(CompressorWeights::from_layers(2, 2, 1, vec![layer]).unwrap())
}

#[test]
fn bad_arguments_are_typed_errors() {
    let c = comp(true, true);
    let p = c.default_params();
    let shape = KvShape {
        heads: 1,
        seq_len: 6,
        head_dim: 2,
    };
    let x = [1f32; 12];
    let mut o = [0f32; 12];
    let mut o2 = [0f32; 12];
    let mut call = |layer, shape, p: &CompressParams, n_in: usize, n_out: usize| {
        c.compress_layer(
            layer,
            shape,
            &x[..n_in],
            &x[..n_in],
            &mut o[..n_out],
            &mut o2[..n_out],
            p,
        )
    };
    assert!(matches!(
        call(1, shape, &p, 12, 12),
        Err(Error::LayerOutOfRange {
            layer: 1,
            num_layers: 1
        })
    ));
    let bad_d = KvShape {
        head_dim: 3,
        ..shape
    };
    assert_eq!(
        call(0, bad_d, &p, 12, 12).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let bad_f = CompressParams { factor: 3, ..p };
    assert!(matches!(
        call(0, shape, &bad_f, 12, 12),
        Err(Error::InvalidArgument { name: "factor", .. })
    ));
    let bad_img = CompressParams {
        image_kv_len: 7,
        ..p
    };
    assert!(matches!(
        call(0, shape, &bad_img, 12, 12),
        Err(Error::InvalidArgument {
            name: "image_kv_len",
            ..
        })
    ));
    assert!(matches!(
        call(0, shape, &p, 11, 12),
        Err(Error::InvalidArgument { name: "k", .. })
    ));
    // S = 6, factor 2 -> 3 groups -> 6 output elements needed.
    assert!(matches!(
        call(0, shape, &p, 12, 5),
        Err(Error::BufferTooSmall {
            name: "out_k",
            needed: 6,
            found: 5
        })
    ));
    let huge = KvShape {
        heads: usize::MAX,
        seq_len: 2,
        head_dim: 2,
    };
    assert_eq!(
        call(0, huge, &p, 12, 12).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert!(call(0, shape, &p, 12, 6).is_ok());
}

#[test]
fn missing_mlps_follow_the_reference_rules() {
    let k: Vec<f32> = (0..12).map(|x| x as f32).collect();
    let shape = KvShape {
        heads: 1,
        seq_len: 6,
        head_dim: 2,
    };
    let run = |c: &Compressor, image_kv_len| {
        let p = CompressParams {
            image_kv_len,
            ..c.default_params()
        };
        let (mut ok, mut ov) = (vec![-1f32; 12], vec![-1f32; 12]);
        let lens = c
            .compress_layer(0, shape, &k, &k, &mut ok, &mut ov, &p)
            .unwrap();
        ok.truncate(lens.kv_len * 2);
        (lens.rope_position, ok)
    };
    // Both present: the MLP keeps the first token of each pair.
    assert_eq!(run(&comp(true, true), 2), (6, vec![0., 1., 4., 5., 8., 9.]));
    // No image MLPs: the 2-token image prefix is copied, the text part compressed.
    assert_eq!(
        run(&comp(true, false), 2),
        (6, vec![0., 1., 2., 3., 4., 5., 8., 9.])
    );
    // No text MLPs: nothing is compressed.
    assert_eq!(run(&comp(false, true), 2), (6, k.clone()));
    // Odd image prefix: 3 tokens -> 1 group + 1 remainder; text 3 tokens likewise.
    assert_eq!(
        run(&comp(true, true), 3),
        (6, vec![0., 1., 4., 5., 6., 7., 10., 11.])
    );
}

#[test]
fn a_bad_layer_changes_no_layer() {
    use kvc_mlp::{CacheShape, LayerKv};
    let c = comp(true, true);
    let p = c.default_params();
    let shape = CacheShape {
        heads: 1,
        capacity: 6,
        seq_len: 6,
        head_dim: 2,
    };
    let orig: Vec<f32> = (0..12).map(|x| x as f32).collect();
    let (mut k0, mut v0, mut k1, mut v1) = (orig.clone(), orig.clone(), orig.clone(), orig.clone());
    let mut layers = [
        LayerKv {
            layer: 0,
            k: &mut k0,
            v: &mut v0,
        },
        LayerKv {
            layer: 5,
            k: &mut k1,
            v: &mut v1,
        },
    ];
    assert!(c.compress_layers_inplace(&mut layers, shape, &p).is_err());
    assert_eq!(k0, orig);
    let bad = CacheShape {
        seq_len: 7,
        ..shape
    };
    let mut layers = [LayerKv {
        layer: 0,
        k: &mut k0,
        v: &mut v0,
    }];
    assert!(matches!(
        c.compress_layers_inplace(&mut layers, bad, &p),
        Err(Error::InvalidArgument {
            name: "seq_len",
            ..
        })
    ));
    let lens = c.compress_layers_inplace(&mut layers, shape, &p).unwrap();
    assert_eq!((lens.rope_position, lens.kv_len), (6, 3));
    assert_eq!(&k0[..6], &[0., 1., 4., 5., 8., 9.]);
}

#[test]
fn to_bytes_writes_back_the_file_it_read() {
    for dtype in [FloatDtype::F16, FloatDtype::Bf16, FloatDtype::F32] {
        for count in [6, 12] {
            let bytes = file(header(dtype, 3, count), &[]);
            let w = CompressorWeights::from_bytes(&bytes).unwrap();
            let h = w.header().unwrap();
            assert_eq!(w.to_bytes(dtype, h.num_heads).unwrap(), bytes);
        }
    }
    for name in ["f16_text", "bf16_image_mixed_bias", "f32_text_bias"] {
        let path = format!("{}/tests/fixtures/{name}.bin", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(path).unwrap();
        let w = CompressorWeights::from_bytes(&bytes).unwrap();
        let h = *w.header().unwrap();
        let again = w.to_bytes(h.dtype, h.num_heads).unwrap();
        let w2 = CompressorWeights::from_bytes(&again).unwrap();
        assert_eq!(w2.num_layers(), w.num_layers());
        for l in 0..w.num_layers() {
            assert_eq!(
                w2.layer(l).unwrap(),
                w.layer(l).unwrap(),
                "{name} layer {l}"
            );
        }
    }
}

#[test]
fn to_bytes_refuses_what_the_format_cannot_hold() {
    let m = || Some(tiny_mlp());
    let text_only = LayerMlps {
        text_k: m(),
        text_v: m(),
        ..Default::default()
    };
    let with_image = LayerMlps {
        text_k: m(),
        text_v: m(),
        image_k: m(),
        image_v: m(),
    };
    let no_text = LayerMlps {
        image_k: m(),
        image_v: m(),
        ..Default::default()
    };
    for layers in [
        vec![text_only.clone(), with_image.clone()],
        vec![with_image, text_only.clone()],
        vec![text_only, no_text],
    ] {
        let w = CompressorWeights::from_layers(2, 2, 1, layers).unwrap();
        let e = w.to_bytes(FloatDtype::F32, 0).expect_err("must be refused");
        assert_eq!(e.kind(), kvc_mlp::ErrorKind::InvalidArgument);
    }
}
