//! The Rust compressor against the float64 NumPy reference's golden fixtures
//! (`tests/reference/mlp_reference.py generate tests/fixtures`).

use std::path::{Path, PathBuf};

use kvc_mlp::{
    bf16, f16, CacheShape, CompressParams, Compressor, CompressorWeights, KvElement, KvShape,
    LayerKv,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

struct Case {
    name: String,
    heads: usize,
    seq_len: usize,
    head_dim: usize,
    params: CompressParams,
    kv_dtype: String,
    layers: usize,
    expected_len: usize,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(fixtures()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        let u = |k: &str| j[k].as_u64().unwrap() as usize;
        out.push(Case {
            name: p.file_stem().unwrap().to_str().unwrap().to_string(),
            heads: u("heads"),
            seq_len: u("seq_len"),
            head_dim: u("head_dim"),
            params: CompressParams {
                factor: u("factor"),
                min_seq_len: u("min_seq_len"),
                image_kv_len: u("image_kv_len"),
            },
            kv_dtype: j["kv_dtype"].as_str().unwrap().to_string(),
            layers: u("layers"),
            expected_len: u("expected_len"),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(out.len(), 10, "fixture cases");
    out
}

fn pod_vec<T: KvElement>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![<T as bytemuck::Zeroable>::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

fn read_f64(path: &Path) -> Vec<f64> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Allowed |got - want| for one element: f32 within 1e-4 relative (floored at 1e-3 of the
/// tensor's largest magnitude, so values near zero do not divide by ~0); f16/bf16 within one
/// unit in the last place of the dtype at `want`, i.e. the dtype's rounding of the same
/// computation.
trait Tolerance: KvElement {
    fn to_f64(self) -> f64;
    fn allowed(want: f64, scale: f64) -> f64;
}

impl Tolerance for f32 {
    fn to_f64(self) -> f64 {
        self.into()
    }
    fn allowed(want: f64, scale: f64) -> f64 {
        1e-4 * want.abs().max(1e-3 * scale)
    }
}

fn spacing(x: f64, mantissa_bits: i32, min_exp: i32) -> f64 {
    let e = if x == 0.0 {
        min_exp
    } else {
        (x.abs().log2().floor() as i32).max(min_exp)
    };
    2f64.powi(e - mantissa_bits)
}

impl Tolerance for f16 {
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn allowed(want: f64, _: f64) -> f64 {
        spacing(want, 10, -14)
    }
}

impl Tolerance for bf16 {
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn allowed(want: f64, _: f64) -> f64 {
        spacing(want, 7, -126)
    }
}

fn assert_close<T: Tolerance>(what: &str, got: &[T], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    let mut worst = 0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g.to_f64() - w).abs();
        let tol = T::allowed(*w, scale);
        assert!(
            err <= tol,
            "{what}[{i}]: got {} want {w} (err {err:e} > {tol:e})",
            g.to_f64()
        );
        worst = worst.max(err / tol);
    }
    worst
}

fn run_case<T: Tolerance>(c: &Case) {
    let dir = fixtures();
    let weights = CompressorWeights::load(dir.join(format!("{}.bin", c.name))).unwrap();
    assert_eq!(weights.num_layers(), c.layers);
    assert_eq!(weights.min_seq_len(), c.params.min_seq_len);
    let comp = Compressor::new(weights);
    let mut params = comp.default_params();
    params.image_kv_len = c.params.image_kv_len;
    assert_eq!(params, c.params, "{}: header defaults", c.name);
    let load = |t: &str| -> Vec<T> {
        pod_vec(&std::fs::read(dir.join(format!("{}.{t}.raw", c.name))).unwrap())
    };
    let (k, v) = (load("k"), load("v"));
    let (h, s, d) = (c.heads, c.seq_len, c.head_dim);
    assert_eq!(k.len(), h * s * d);
    let s_new = c.expected_len;
    let zero: T = bytemuck::Zeroable::zeroed();

    // Out of place, layer by layer.
    for layer in 0..c.layers {
        let want_k = read_f64(&dir.join(format!("{}.L{layer}.k.f64", c.name)));
        let want_v = read_f64(&dir.join(format!("{}.L{layer}.v.f64", c.name)));
        let mut ok = vec![zero; h * s_new * d + 3];
        let mut ov = vec![zero; h * s_new * d + 3];
        let shape = KvShape {
            heads: h,
            seq_len: s,
            head_dim: d,
        };
        let lens = comp
            .compress_layer(layer, shape, &k, &v, &mut ok, &mut ov, &params)
            .unwrap();
        assert_eq!((lens.rope_position, lens.kv_len), (s, s_new), "{}", c.name);
        let wk = assert_close(
            &format!("{} L{layer} k", c.name),
            &ok[..h * s_new * d],
            &want_k,
        );
        let wv = assert_close(
            &format!("{} L{layer} v", c.name),
            &ov[..h * s_new * d],
            &want_v,
        );
        assert!(ok[h * s_new * d..]
            .iter()
            .all(|x| bytemuck::bytes_of(x).iter().all(|&b| b == 0)));
        eprintln!(
            "{} L{layer}: worst err / tolerance k {wk:.3} v {wv:.3}",
            c.name
        );
    }

    // In place, all layers at once, in buffers with spare capacity full of garbage.
    let cap = s + 5;
    let garbage: T = bytemuck::cast_slice::<f32, T>(&[f32::NAN])[0];
    let fill = |src: &[T]| -> Vec<T> {
        let mut buf = vec![garbage; h * cap * d];
        for hh in 0..h {
            buf[hh * cap * d..hh * cap * d + s * d]
                .copy_from_slice(&src[hh * s * d..(hh + 1) * s * d]);
        }
        buf
    };
    let mut bufs: Vec<(Vec<T>, Vec<T>)> = (0..c.layers).map(|_| (fill(&k), fill(&v))).collect();
    let shape = CacheShape {
        heads: h,
        capacity: cap,
        seq_len: s,
        head_dim: d,
    };
    let mut layers: Vec<LayerKv<'_, T>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(layer, (k, v))| LayerKv { layer, k, v })
        .collect();
    let lens = comp
        .compress_layers_inplace(&mut layers, shape, &params)
        .unwrap();
    assert_eq!((lens.rope_position, lens.kv_len), (s, s_new));
    for (layer, (bk, bv)) in bufs.iter().enumerate() {
        for (buf, t) in [(bk, "k"), (bv, "v")] {
            let want = read_f64(&dir.join(format!("{}.L{layer}.{t}.f64", c.name)));
            let got: Vec<T> = (0..h)
                .flat_map(|hh| buf[hh * cap * d..hh * cap * d + s_new * d].iter().copied())
                .collect();
            assert_close(&format!("{} in-place L{layer} {t}", c.name), &got, &want);
        }
    }

    // In place, one layer, no spare capacity.
    let (mut bk, mut bv) = (k.clone(), v.clone());
    let shape = CacheShape {
        heads: h,
        capacity: s,
        seq_len: s,
        head_dim: d,
    };
    comp.compress_layer_inplace(0, shape, &mut bk, &mut bv, &params)
        .unwrap();
    let want = read_f64(&dir.join(format!("{}.L0.k.f64", c.name)));
    let got: Vec<T> = (0..h)
        .flat_map(|hh| bk[hh * s * d..hh * s * d + s_new * d].iter().copied())
        .collect();
    assert_close(&format!("{} in-place exact L0 k", c.name), &got, &want);
}

#[test]
fn golden_fixtures_match_the_float64_reference() {
    for c in cases() {
        match c.kv_dtype.as_str() {
            "f32" => run_case::<f32>(&c),
            "f16" => run_case::<f16>(&c),
            "bf16" => run_case::<bf16>(&c),
            other => panic!("unknown dtype {other}"),
        }
    }
}

#[test]
fn copied_tokens_are_bit_exact() {
    // f32_textonly_image_copied: the 6-weight file has no image MLPs, so the 10-token image
    // prefix must come back bit for bit, and the remainder tokens too.
    let c = cases()
        .into_iter()
        .find(|c| c.name == "f32_textonly_image_copied")
        .unwrap();
    let dir = fixtures();
    let comp =
        Compressor::new(CompressorWeights::load(dir.join(format!("{}.bin", c.name))).unwrap());
    let k: Vec<f32> = pod_vec(&std::fs::read(dir.join(format!("{}.k.raw", c.name))).unwrap());
    let v = k.clone();
    let (h, s, d) = (c.heads, c.seq_len, c.head_dim);
    let mut ok = vec![0f32; h * c.expected_len * d];
    let mut ov = ok.clone();
    comp.compress_layer(
        0,
        KvShape {
            heads: h,
            seq_len: s,
            head_dim: d,
        },
        &k,
        &v,
        &mut ok,
        &mut ov,
        &c.params,
    )
    .unwrap();
    let n_img = c.params.image_kv_len;
    let text = s - n_img;
    let groups = text / c.params.factor;
    let rem = text % c.params.factor;
    for hh in 0..h {
        let src = &k[hh * s * d..(hh + 1) * s * d];
        let dst = &ok[hh * c.expected_len * d..(hh + 1) * c.expected_len * d];
        assert_eq!(&dst[..n_img * d], &src[..n_img * d]);
        let tail = (n_img + groups) * d;
        assert_eq!(&dst[tail..tail + rem * d], &src[s * d - rem * d..]);
    }
}
