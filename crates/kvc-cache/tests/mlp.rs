//! MLP compression of caches in place equals kvc-mlp's own out-of-place result, bit for bit.

use kvc_cache::{mlp_compress_infinilm, mlp_compress_llama, CellTable, Error, KvLayout, LayerMut};
use kvc_mlp::{
    CompressParams, Compressor, CompressorWeights, KvElement, KvShape, LayerMlps, Linear, Mlp,
};
use kvc_types::Dtype;

const D: usize = 8;
const FACTOR: usize = 4;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn mlp(rng: &mut Rng) -> Mlp {
    let lin = |rng: &mut Rng, out: usize, inp: usize| {
        let w: Vec<f32> = rng.vec(out * inp).iter().map(|x| x * 0.5).collect();
        Linear::new(out, inp, &w, Some(&rng.vec(out))).unwrap()
    };
    Mlp::new([lin(rng, D, D * FACTOR), lin(rng, D, D), lin(rng, D, D)]).unwrap()
}

/// `n_layers` layers with text and image MLPs; layer `no_text` (if any) has none.
fn compressor(n_layers: usize, min_seq_len: usize, no_text: Option<usize>) -> Compressor {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let layers = (0..n_layers)
        .map(|i| {
            let text = no_text != Some(i);
            LayerMlps {
                text_k: text.then(|| mlp(&mut rng)),
                text_v: text.then(|| mlp(&mut rng)),
                image_k: Some(mlp(&mut rng)),
                image_v: Some(mlp(&mut rng)),
            }
        })
        .collect();
    Compressor::new(CompressorWeights::from_layers(D, FACTOR, min_seq_len, layers).unwrap())
}

fn params(image_kv_len: usize) -> CompressParams {
    CompressParams {
        factor: FACTOR,
        min_seq_len: 2,
        image_kv_len,
    }
}

fn random<T: KvElement>(rng: &mut Rng, n: usize) -> Vec<T> {
    let f = rng.vec(n);
    let mut out = vec![<T as bytemuck::Zeroable>::zeroed(); n];
    T::narrow(&f, &mut out);
    out
}

fn bits<T: KvElement>(x: &[T]) -> &[u8] {
    bytemuck::cast_slice(x)
}

fn infinilm_case<T: KvElement>(dtype: Dtype, image_kv_len: usize) {
    let (h, cap, seq_len, n_layers) = (3usize, 45usize, 42usize, 3usize);
    let comp = compressor(n_layers, 2, None);
    let layout = KvLayout::infinilm(dtype, h, D, cap).unwrap();
    let mut rng = Rng(7 + image_kv_len as u64);
    let mut data: Vec<(Vec<T>, Vec<T>)> = (0..n_layers)
        .map(|_| (random(&mut rng, h * cap * D), random(&mut rng, h * cap * D)))
        .collect();
    let before = data.clone();
    let mut layers: Vec<LayerMut<'_>> = data
        .iter_mut()
        .map(|(k, v)| {
            LayerMut::new(
                layout,
                bytemuck::cast_slice_mut(k),
                bytemuck::cast_slice_mut(v),
            )
            .unwrap()
        })
        .collect();
    let p = params(image_kv_len);
    let lens = mlp_compress_infinilm(&comp, &mut layers, 1, seq_len, &p);
    // first_layer 1 + 3 layers needs weights layer 3: refused before anything changes.
    assert!(matches!(lens, Err(Error::Mlp(_))), "{lens:?}");
    drop(layers);
    for ((k1, v1), (k0, v0)) in data.iter().zip(&before) {
        assert!(bits(k1) == bits(k0) && bits(v1) == bits(v0));
    }
    let mut layers: Vec<LayerMut<'_>> = data
        .iter_mut()
        .map(|(k, v)| {
            LayerMut::new(
                layout,
                bytemuck::cast_slice_mut(k),
                bytemuck::cast_slice_mut(v),
            )
            .unwrap()
        })
        .collect();
    let lens = mlp_compress_infinilm(&comp, &mut layers, 0, seq_len, &p).unwrap();
    drop(layers);
    assert_eq!(lens.rope_position, seq_len);
    assert!(lens.kv_len < seq_len);
    let shape = KvShape {
        heads: h,
        seq_len,
        head_dim: D,
    };
    for (li, ((k0, v0), (k1, v1))) in before.iter().zip(&data).enumerate() {
        let take = |x: &[T]| -> Vec<T> {
            (0..h)
                .flat_map(|hh| x[hh * cap * D..hh * cap * D + seq_len * D].to_vec())
                .collect()
        };
        let (ki, vi) = (take(k0), take(v0));
        let (mut ko, mut vo) = (ki.clone(), vi.clone());
        let r = comp
            .compress_layer(li, shape, &ki, &vi, &mut ko, &mut vo, &p)
            .unwrap();
        assert_eq!(r, lens);
        for hh in 0..h {
            let n = lens.kv_len * D;
            let got = hh * cap * D;
            assert_eq!(
                bits(&k1[got..got + n]),
                bits(&ko[hh * n..(hh + 1) * n]),
                "{dtype} layer {li} head {hh} K"
            );
            assert_eq!(
                bits(&v1[got..got + n]),
                bits(&vo[hh * n..(hh + 1) * n]),
                "{dtype} layer {li} head {hh} V"
            );
            // Tokens past the old length are untouched.
            let tail = got + seq_len * D..(hh + 1) * cap * D;
            assert_eq!(bits(&k1[tail.clone()]), bits(&k0[tail]));
        }
    }
}

#[test]
fn infinilm_in_place_equals_out_of_place() {
    infinilm_case::<half::f16>(Dtype::F16, 0);
    infinilm_case::<half::bf16>(Dtype::Bf16, 9);
    infinilm_case::<f32>(Dtype::F32, 0);
    infinilm_case::<f32>(Dtype::F32, 13);
}

#[test]
fn infinilm_errors() {
    let comp = compressor(2, 2, None);
    let p = params(0);
    // Misaligned f16 buffers.
    let layout = KvLayout::infinilm(Dtype::F16, 2, D, 16).unwrap();
    let n = layout.k.byte_len();
    let (mut k, mut v) = (vec![0u16; n / 2 + 1], vec![0u16; n / 2 + 1]);
    let kb: &mut [u8] = bytemuck::cast_slice_mut(&mut k);
    let vb: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    let mut layers = vec![LayerMut::new(layout, &mut kb[1..n + 1], &mut vb[..n]).unwrap()];
    let e = mlp_compress_infinilm(&comp, &mut layers, 0, 16, &p).unwrap_err();
    assert!(matches!(e, Error::Misaligned { align: 2, .. }), "{e}");
    // Wrong layout, int8, wrong head_dim, seq_len past the capacity.
    for (layout, seq_len) in [
        (KvLayout::llama(Dtype::F32, 2, D, D, 16, false).unwrap(), 16),
        (KvLayout::infinilm(Dtype::I8, 2, D, 16).unwrap(), 16),
        (KvLayout::infinilm(Dtype::F32, 2, D / 2, 16).unwrap(), 16),
        (KvLayout::infinilm(Dtype::F32, 2, D, 16).unwrap(), 17),
    ] {
        let (mut k, mut v) = (
            vec![0f32; layout.k.byte_len() / 4 + 1],
            vec![0f32; layout.v.byte_len() / 4 + 1],
        );
        let mut layers = vec![LayerMut::new(
            layout,
            bytemuck::cast_slice_mut(&mut k),
            bytemuck::cast_slice_mut(&mut v),
        )
        .unwrap()];
        let e = mlp_compress_infinilm(&comp, &mut layers, 0, seq_len, &p).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidShape { .. }
                    | Error::UnsupportedDType { .. }
                    | Error::LayoutMismatch { .. }
                    | Error::Mlp(_)
            ),
            "{e}"
        );
    }
}

/// A llama.cpp cache of 2 layers and 64 cells: sequence 0 (30 tokens, positions 100..130)
/// on shuffled cells, sequence 1 (10 tokens) on others, the rest empty.
fn llama_cells() -> CellTable {
    let mut cells = CellTable::new(64);
    let mut order: Vec<usize> = (0..64).collect();
    let mut rng = Rng(99);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    for (p, &c) in order[..30].iter().enumerate() {
        cells.set(c, 100 + p as i32, 0).unwrap();
    }
    for (p, &c) in order[30..40].iter().enumerate() {
        cells.set(c, p as i32, 1).unwrap();
    }
    cells
}

fn llama_case<T: KvElement>(dtype: Dtype, v_trans: bool, image_kv_len: usize) {
    let h = 2usize;
    let comp = compressor(2, 2, None);
    let layout = KvLayout::llama(dtype, h, D, D, 64, v_trans).unwrap();
    let mut rng = Rng(5);
    let mut data: Vec<(Vec<T>, Vec<T>)> = (0..2)
        .map(|_| {
            (
                random(&mut rng, layout.k.elem_count()),
                random(&mut rng, layout.v.elem_count()),
            )
        })
        .collect();
    let before = data.clone();
    let mut cells = llama_cells();
    let cells_before = cells.clone();
    let p = params(image_kv_len);
    let mut layers: Vec<LayerMut<'_>> = data
        .iter_mut()
        .map(|(k, v)| {
            LayerMut::new(
                layout,
                bytemuck::cast_slice_mut(k),
                bytemuck::cast_slice_mut(v),
            )
            .unwrap()
        })
        .collect();
    let r = mlp_compress_llama(&comp, &mut layers, 0, &mut cells, 0, &p).unwrap();
    drop(layers);

    // The reference: sequence 0's tokens in position order, compressed out of place.
    let mut seq0: Vec<(i32, usize)> = cells_before
        .cells()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.seq_mask == 1)
        .map(|(i, c)| (c.pos, i))
        .collect();
    seq0.sort_unstable();
    let s = seq0.len();
    assert_eq!(r.lens.rope_position, 130);
    let shape = KvShape {
        heads: h,
        seq_len: s,
        head_dim: D,
    };
    let mut want_cells: Vec<usize> = seq0.iter().map(|x| x.1).collect();
    want_cells.sort_unstable();
    let kv_len = r.lens.kv_len;
    assert_eq!(
        r.kept.iter().map(|x| x.0).collect::<Vec<_>>(),
        want_cells[..kv_len]
    );
    assert_eq!(r.freed, want_cells[kv_len..]);
    for (li, ((k0, v0), (k1, v1))) in before.iter().zip(&data).enumerate() {
        for (which, t, x0, x1) in [("K", &layout.k, k0, k1), ("V", &layout.v, v0, v1)] {
            let mut inp = Vec::with_capacity(h * s * D);
            for hh in 0..h {
                for &(_, c) in &seq0 {
                    inp.extend((0..D).map(|d| x0[t.offset(c, hh, d)]));
                }
            }
            let mut out = inp.clone();
            let mut out2 = inp.clone();
            let lens = comp
                .compress_layer(li, shape, &inp, &inp, &mut out, &mut out2, &p)
                .unwrap();
            assert_eq!(lens.kv_len, kv_len);
            // compress_layer uses the K MLP for its first tensor and the V MLP for its
            // second: take the matching one.
            let want = if which == "K" { &out } else { &out2 };
            for (j, &(c, _)) in r.kept.iter().enumerate() {
                for hh in 0..h {
                    for d in 0..D {
                        let got = x1[t.offset(c, hh, d)];
                        let exp = want[(hh * kv_len + j) * D + d];
                        assert_eq!(
                            bits(&[got]),
                            bits(&[exp]),
                            "{dtype} trans {v_trans} layer {li} {which} row {j} h {hh} d {d}"
                        );
                    }
                }
            }
            // Sequence 1's cells are untouched.
            for (c, cell) in cells_before.cells().iter().enumerate() {
                if cell.seq_mask == 2 {
                    for hh in 0..h {
                        for d in 0..D {
                            let o = t.offset(c, hh, d);
                            assert_eq!(bits(&[x1[o]]), bits(&[x0[o]]));
                        }
                    }
                }
            }
        }
    }
    // The cell table: kept cells hold sequence 0 at the positions of each row's last
    // token; freed cells are empty; sequence 1 is as it was.
    let rows: Vec<usize> = {
        let plan = comp.plan(0, s, &p).unwrap();
        let mut rows = Vec::new();
        for seg in [plan.image, plan.text] {
            for g in 0..seg.groups {
                rows.push(seg.start + (g + 1) * FACTOR - 1);
            }
            rows.extend(seg.start + seg.groups * FACTOR..seg.start + seg.len);
        }
        rows
    };
    assert_eq!(rows.len(), kv_len);
    for (j, &(c, pos)) in r.kept.iter().enumerate() {
        assert_eq!(pos, seq0[rows[j]].0);
        assert_eq!(cells.get(c).unwrap().pos, pos);
        assert_eq!(cells.get(c).unwrap().seq_mask, 1);
    }
    for &c in &r.freed {
        assert!(!cells.get(c).unwrap().is_used());
    }
    for (c, cell) in cells_before.cells().iter().enumerate() {
        if cell.seq_mask != 1 {
            assert_eq!(cells.get(c).unwrap(), *cell);
        }
    }
}

#[test]
fn llama_sequence_in_place_equals_out_of_place() {
    llama_case::<half::f16>(Dtype::F16, false, 0);
    llama_case::<half::f16>(Dtype::F16, true, 0);
    llama_case::<half::bf16>(Dtype::Bf16, true, 6);
    llama_case::<f32>(Dtype::F32, false, 9);
}

#[test]
fn llama_short_sequence_is_unchanged() {
    let comp = compressor(1, 100, None);
    let layout = KvLayout::llama(Dtype::F32, 2, D, D, 64, true).unwrap();
    let (mut k, mut v) = (
        vec![1f32; layout.k.elem_count()],
        vec![2f32; layout.v.elem_count()],
    );
    let mut layers = vec![LayerMut::new(
        layout,
        bytemuck::cast_slice_mut(&mut k),
        bytemuck::cast_slice_mut(&mut v),
    )
    .unwrap()];
    let mut cells = llama_cells();
    let before = cells.clone();
    let mut p = params(0);
    p.min_seq_len = 100;
    let r = mlp_compress_llama(&comp, &mut layers, 0, &mut cells, 0, &p).unwrap();
    assert_eq!((r.lens.kv_len, r.lens.rope_position), (30, 130));
    assert!(r.freed.is_empty());
    assert_eq!(cells, before);
    // An empty sequence.
    let r = mlp_compress_llama(&comp, &mut layers, 0, &mut cells, 5, &p).unwrap();
    assert_eq!((r.lens.kv_len, r.lens.rope_position), (0, 0));
}

#[test]
fn llama_errors_change_nothing() {
    let layout = KvLayout::llama(Dtype::F16, 2, D, D, 64, false).unwrap();
    let mut rng = Rng(3);
    let mut a: (Vec<half::f16>, Vec<half::f16>) = (
        random(&mut rng, layout.k.elem_count()),
        random(&mut rng, layout.v.elem_count()),
    );
    let mut b = a.clone();
    let snapshot = (a.clone(), b.clone());
    let p = params(0);
    let run = |comp: &Compressor,
               cells: &mut CellTable,
               seq: i32,
               a: &mut (Vec<half::f16>, Vec<half::f16>),
               b: &mut (Vec<half::f16>, Vec<half::f16>)| {
        let mut layers = vec![
            LayerMut::new(
                layout,
                bytemuck::cast_slice_mut(&mut a.0),
                bytemuck::cast_slice_mut(&mut a.1),
            )
            .unwrap(),
            LayerMut::new(
                layout,
                bytemuck::cast_slice_mut(&mut b.0),
                bytemuck::cast_slice_mut(&mut b.1),
            )
            .unwrap(),
        ];
        mlp_compress_llama(comp, &mut layers, 0, cells, seq, &p)
    };
    let comp = compressor(2, 2, None);

    // A cell shared with sequence 1.
    let mut cells = llama_cells();
    let shared = (0..64)
        .find(|&c| cells.get(c).unwrap().seq_mask == 1)
        .unwrap();
    let pos = cells.get(shared).unwrap().pos;
    cells.set(shared, pos, 1).unwrap();
    let before = cells.clone();
    let e = run(&comp, &mut cells, 0, &mut a, &mut b).unwrap_err();
    assert!(matches!(e, Error::SharedCell { .. }), "{e}");
    assert_eq!(cells, before);

    // Two cells at one position.
    let mut cells = llama_cells();
    let free = (0..64).find(|&c| !cells.get(c).unwrap().is_used()).unwrap();
    cells.set(free, 105, 0).unwrap();
    let before = cells.clone();
    let e = run(&comp, &mut cells, 0, &mut a, &mut b).unwrap_err();
    assert!(
        matches!(e, Error::DuplicatePosition { pos: 105, .. }),
        "{e}"
    );
    assert_eq!(cells, before);

    // Layers that would compress to different lengths (layer 1 has no text MLPs).
    let mut cells = llama_cells();
    let before = cells.clone();
    let e = run(&compressor(2, 2, Some(1)), &mut cells, 0, &mut a, &mut b).unwrap_err();
    assert!(matches!(e, Error::LayoutMismatch { .. }), "{e}");
    assert_eq!(cells, before);

    // Weights with one layer for two cache layers.
    let e = run(&compressor(1, 2, None), &mut cells, 0, &mut a, &mut b).unwrap_err();
    assert!(matches!(e, Error::Mlp(_)), "{e}");

    // Bad sequence id, cell table of another size.
    assert!(matches!(
        run(&comp, &mut cells, 64, &mut a, &mut b),
        Err(Error::InvalidCell { .. })
    ));
    let mut small = CellTable::new(32);
    assert!(matches!(
        run(&comp, &mut small, 0, &mut a, &mut b),
        Err(Error::LayoutMismatch { .. })
    ));
    assert_eq!(cells, before);
    for (x, y) in [
        (&a.0, &snapshot.0 .0),
        (&a.1, &snapshot.0 .1),
        (&b.0, &snapshot.1 .0),
    ] {
        assert!(bits(x) == bits(y));
    }
    assert!(bits(&b.1) == bits(&snapshot.1 .1));
}
