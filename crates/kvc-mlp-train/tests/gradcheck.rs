//! The hand-written backward pass against central finite differences (f64), and the forward
//! pass against a plain loop-by-loop reference of the objective.

use kvc_mlp_train::{
    window_loss, window_norm, Compression, Geometry, Grads, LayerData, LossParts, MlpParams, Rng,
    Scratch, Window,
};

const D: usize = 4;
const F: usize = 3;
const HK: usize = 2;
const HQ: usize = 4;
const T: usize = 29;

fn data(rng: &mut Rng) -> LayerData<f64> {
    let mut r = |n: usize, s: f64| -> Vec<f64> { (0..n).map(|_| s * rng.normal()).collect() };
    let k = r(T * HK * D, 1.5);
    let v = r(T * HK * D, 1.0);
    let q = r(T * HQ * D, 1.5);
    LayerData::new(T, HK, HQ, D, &k, &v, &q)
}

const GEO: Geometry = Geometry {
    sink: 2,
    recent: 5,
    factor: F,
};

fn windows() -> Vec<Window> {
    vec![
        // 29 tokens: groups [2, 23), remainder 23 (c_end 23), tail 23..29, queries in 24..29.
        Window {
            data: 0,
            len: 29,
            queries: vec![24, 26, 28],
        },
        // 20 tokens: middle [2, 15) -> 4 groups, c_end 14, one remainder token.
        Window {
            data: 0,
            len: 20,
            queries: vec![15, 16, 17, 18, 19],
        },
    ]
}

fn loss(
    d: &LayerData<f64>,
    k: &MlpParams<f64>,
    v: &MlpParams<f64>,
    grads: Option<(&mut MlpParams<f64>, &mut MlpParams<f64>)>,
) -> f64 {
    let ws = windows();
    let norm: f64 = ws.iter().map(|w| window_norm(d, w)).sum();
    let comp = Compression::Mlp {
        k,
        v,
        k_scale: 1.3,
        v_scale: 0.7,
    };
    let mut sc = Scratch::default();
    let mut parts = LossParts::default();
    let mut grads = grads;
    for w in &ws {
        let g = grads.as_mut().map(|(gk, gv)| Grads {
            k: &mut **gk,
            v: &mut **gv,
            inv_norm: 1.0 / norm,
        });
        parts += window_loss(d, GEO, w, comp, g, &mut sc);
    }
    assert!((parts.norm - norm).abs() <= 1e-12 * norm);
    parts.relative()
}

#[test]
fn backward_matches_finite_differences() {
    let mut rng = Rng::new(7);
    let d = data(&mut rng);
    let mut k = MlpParams::<f64>::init(D, F, &mut rng);
    let mut v = MlpParams::<f64>::init(D, F, &mut rng);
    // Non-zero biases so their gradients are tested away from the initial point.
    for b in k.b.iter_mut().chain(v.b.iter_mut()) {
        for x in b.iter_mut() {
            *x = 0.1 * rng.normal();
        }
    }
    let (mut gk, mut gv) = (MlpParams::zeros(D, F), MlpParams::zeros(D, F));
    let base = loss(&d, &k, &v, Some((&mut gk, &mut gv)));
    assert!(base > 0.0 && base.is_finite());
    let eps = 1e-6;
    let (mut worst, mut checked) = (0f64, 0usize);
    for which in 0..2 {
        for t in 0..6 {
            let n = if which == 0 { &k } else { &v }
                .tensors()
                .nth(t)
                .unwrap()
                .len();
            for i in 0..n {
                let bump = |p: &mut MlpParams<f64>, delta: f64| {
                    p.tensors_mut().nth(t).unwrap()[i] += delta;
                };
                let (mut kp, mut vp) = (k.clone(), v.clone());
                bump(if which == 0 { &mut kp } else { &mut vp }, eps);
                let plus = loss(&d, &kp, &vp, None);
                let (mut km, mut vm) = (k.clone(), v.clone());
                bump(if which == 0 { &mut km } else { &mut vm }, -eps);
                let minus = loss(&d, &km, &vm, None);
                let numeric = (plus - minus) / (2.0 * eps);
                let g = if which == 0 { &gk } else { &gv };
                let analytic = g.tensors().nth(t).unwrap()[i];
                let err = (numeric - analytic).abs() / (numeric.abs() + analytic.abs() + 1e-6);
                assert!(
                    err < 1e-5,
                    "mlp {which} tensor {t} index {i}: analytic {analytic} numeric {numeric}"
                );
                worst = worst.max(err);
                checked += 1;
            }
        }
    }
    // Every parameter of both MLPs: 2 x (4*12 + 16 + 16 + 3*4).
    assert_eq!(checked, 2 * (D * D * F + 2 * D * D + 3 * D));
    eprintln!("gradient check: {checked} parameters, worst relative error {worst:.2e}");
}

fn mlp_ref(p: &MlpParams<f64>, x: &[f64]) -> Vec<f64> {
    let mut h = x.to_vec();
    for l in 0..3 {
        let inw = h.len();
        let mut o = p.b[l].clone();
        for (r, o) in o.iter_mut().enumerate() {
            for (i, &xi) in h.iter().enumerate() {
                *o += p.w[l][r * inw + i] * xi;
            }
            if l < 2 {
                *o = o.max(0.0);
            }
        }
        h = o;
    }
    h
}

/// The objective written loop by loop from its definition (module docs of `objective`).
fn reference_err(d: &LayerData<f64>, k: &MlpParams<f64>, v: &MlpParams<f64>, w: &Window) -> f64 {
    let (ks, vs) = (1.3, 0.7);
    let m = (w.len - GEO.recent - GEO.sink) / F;
    let c_end = GEO.sink + m * F;
    let row = |x: &[f64], h: usize, t: usize| x[(h * T + t) * D..(h * T + t + 1) * D].to_vec();
    let mut err = 0.0;
    for qh in 0..HQ {
        let h = qh / (HQ / HK);
        // (key, value, position) of the compressed cache
        let mut cache: Vec<(Vec<f64>, Vec<f64>, usize)> = Vec::new();
        for t in 0..GEO.sink {
            cache.push((row(&d.k, h, t), row(&d.v, h, t), t));
        }
        for g in 0..m {
            let grp = |x: &[f64], s: f64| -> Vec<f64> {
                (0..F)
                    .flat_map(|j| row(x, h, GEO.sink + g * F + j))
                    .map(|e| e / s)
                    .collect()
            };
            let kk: Vec<f64> = mlp_ref(k, &grp(&d.k, ks)).iter().map(|e| e * ks).collect();
            let vv: Vec<f64> = mlp_ref(v, &grp(&d.v, vs)).iter().map(|e| e * vs).collect();
            cache.push((kk, vv, 0));
        }
        for t in c_end..w.len {
            cache.push((row(&d.k, h, t), row(&d.v, h, t), t));
        }
        for &p in &w.queries {
            let q = row(&d.q, qh, p);
            let attend = |keys: &[(Vec<f64>, Vec<f64>, usize)]| -> Vec<f64> {
                let s: Vec<f64> = keys
                    .iter()
                    .map(|(kk, _, _)| {
                        q.iter().zip(kk).map(|(a, b)| a * b).sum::<f64>() / (D as f64).sqrt()
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                let mut o = vec![0.0; D];
                for (ei, (_, vv, _)) in e.iter().zip(keys) {
                    for (oo, x) in o.iter_mut().zip(vv) {
                        *oo += ei / z * x;
                    }
                }
                o
            };
            let comp: Vec<_> = cache.iter().filter(|c| c.2 <= p).cloned().collect();
            let full: Vec<_> = (0..=p)
                .map(|t| (row(&d.k, h, t), row(&d.v, h, t), t))
                .collect();
            let (a, b) = (attend(&comp), attend(&full));
            err += a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum::<f64>();
        }
    }
    err
}

#[test]
fn forward_matches_a_loop_by_loop_reference() {
    let mut rng = Rng::new(11);
    let d = data(&mut rng);
    let k = MlpParams::<f64>::init(D, F, &mut rng);
    let v = MlpParams::<f64>::init(D, F, &mut rng);
    let comp = Compression::Mlp {
        k: &k,
        v: &v,
        k_scale: 1.3,
        v_scale: 0.7,
    };
    let mut sc = Scratch::default();
    for w in windows() {
        let got = window_loss(&d, GEO, &w, comp, None, &mut sc).err;
        let want = reference_err(&d, &k, &v, &w);
        assert!(
            (got - want).abs() <= 1e-10 * want,
            "window {}: {got} vs {want}",
            w.len
        );
    }
}
