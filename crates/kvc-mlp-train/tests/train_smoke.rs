//! A few seconds of training on small synthetic data with a fixed seed: the loss must fall
//! by a real margin, and a second run must give the same weights bit for bit.

use kvc_mlp_train::{train_layer, Geometry, Init, LayerData, Rng, TrainConfig};

/// Keys and values that drift slowly over the tokens (a random walk plus noise), queries
/// random: grouped tokens are alike, so a compressor can learn something.
fn synthetic(seed: u64, tokens: usize) -> LayerData<f32> {
    let (hk, hq, d) = (2, 4, 8);
    let mut rng = Rng::new(seed);
    let mut walk = |heads: usize, scale: f64| -> Vec<f32> {
        let mut state = vec![0f64; heads * d];
        let mut out = Vec::with_capacity(tokens * heads * d);
        for _ in 0..tokens {
            for s in state.iter_mut() {
                *s = 0.9 * *s + 0.3 * rng.normal();
                out.push((scale * (*s + 0.2 * rng.normal())) as f32);
            }
        }
        out
    };
    let k = walk(hk, 2.0);
    let v = walk(hk, 1.0);
    let q = walk(hq, 2.0);
    LayerData::new(tokens, hk, hq, d, &k, &v, &q)
}

fn config() -> TrainConfig {
    TrainConfig {
        geometry: Geometry {
            sink: 2,
            recent: 8,
            factor: 2,
        },
        min_groups: 4,
        queries: 8,
        batch: 2,
        steps: 300,
        lr: 3e-3,
        seed: 5,
        eval_windows: 4,
        init: Init::Random,
    }
}

#[test]
fn loss_falls_and_a_rerun_is_identical() {
    let train = vec![synthetic(1, 96), synthetic(2, 96)];
    let val = vec![synthetic(3, 96)];
    let mut curve = Vec::new();
    let r = train_layer(&train, &val, &config(), 0, |step, loss| {
        curve.push((step, loss))
    })
    .unwrap();
    eprintln!(
        "train {:.4} (init {:.4}, mean-pool {:.4}), val {:.4} (mean-pool {:.4}), curve {curve:?}",
        r.train, r.train_init, r.train_mean_pool, r.val, r.val_mean_pool
    );
    assert_eq!(curve.len(), 10);
    assert!(
        r.train < 0.5 * r.train_init,
        "training error {} is not half the initial {}",
        r.train,
        r.train_init
    );
    assert!(curve[9].1 < 0.6 * curve[0].1, "{curve:?}");
    assert!(r.val.is_finite() && r.val < r.train_init);
    let again = train_layer(&train, &val, &config(), 0, |_, _| {}).unwrap();
    assert_eq!(again.k, r.k);
    assert_eq!(again.v, r.v);
    assert_eq!(again.train.to_bits(), r.train.to_bits());
    // Another layer index draws other random streams.
    let other = train_layer(&train, &val, &config(), 1, |_, _| {}).unwrap();
    assert_ne!(other.k, r.k);
}

#[test]
fn from_mean_pooling_the_loss_falls_below_it() {
    let train = vec![synthetic(1, 96), synthetic(2, 96)];
    let val = vec![synthetic(3, 96)];
    let mut c = config();
    c.init = Init::MeanPool;
    let r = train_layer(&train, &val, &c, 0, |_, _| {}).unwrap();
    eprintln!(
        "mean-pool start: train {:.4} (init {:.4}, mean-pool {:.4}), val {:.4} (mean-pool {:.4})",
        r.train, r.train_init, r.train_mean_pool, r.val, r.val_mean_pool
    );
    // The start is mean pooling (up to f32 rounding of the same sums).
    assert!((r.train_init - r.train_mean_pool).abs() <= 1e-4 * r.train_mean_pool);
    assert!(
        r.train < 0.8 * r.train_mean_pool,
        "{} vs {}",
        r.train,
        r.train_mean_pool
    );
    // 192 training tokens: validation is only checked to be of the same order (the real
    // dumps' validation numbers are in docs/mlp-training.md).
    assert!(
        r.val < 2.0 * r.val_mean_pool,
        "{} vs {}",
        r.val,
        r.val_mean_pool
    );
}

#[test]
fn bad_options_are_refused() {
    let train = vec![synthetic(1, 40)];
    let mut c = config();
    c.min_groups = 20; // 2 + 40 + 8 > 40 tokens
    let e = train_layer(&train, &[], &c, 0, |_, _| {}).unwrap_err();
    assert_eq!(e.kind(), kvc_mlp_train::ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("shortest dump has 40"), "{e}");
    let mut c = config();
    c.lr = f64::NAN;
    assert!(train_layer(&train, &[], &c, 0, |_, _| {}).is_err());
    assert!(train_layer(&[], &[], &config(), 0, |_, _| {}).is_err());
}
