//! Shared test data: a fixed xorshift64 generator and near-Gaussian vectors.
#![allow(dead_code)]

/// xorshift64 state.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Approximately N(0, 1): sum of 12 uniforms minus 6.
    pub fn gauss(&mut self) -> f32 {
        ((0..12).map(|_| self.unit()).sum::<f64>() - 6.0) as f32
    }
    /// `n` values shaped like KV rows: Gaussian, a few large outlier channels, a bias.
    pub fn kv_like(&mut self, n: usize, d: usize) -> Vec<f32> {
        let mut v = Vec::with_capacity(n * d);
        for _ in 0..n {
            for c in 0..d {
                let outlier = if c % 17 == 3 { 6.0 } else { 1.0 };
                v.push(self.gauss() * outlier + if c % 5 == 0 { 0.7 } else { 0.0 });
            }
        }
        v
    }
}
