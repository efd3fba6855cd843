//! Shared helpers: a deterministic generator and fault-injecting codecs.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use kvc_store_async::{ChunkInfo, GearV1Codec, StoreCodec};
use kvc_store_codec::{Error, Result};

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A value below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Plausible f16 KV values: small magnitudes, so the codec has something to gain.
    pub fn f16_bytes(&mut self, n_values: usize) -> Vec<u8> {
        (0..n_values)
            .flat_map(|_| {
                let x = self.next();
                let v: u16 =
                    0x2c00 + (x % 0x1000) as u16 + if x & (1 << 40) != 0 { 0x8000 } else { 0 };
                v.to_le_bytes()
            })
            .collect()
    }
}

/// What a [`FaultyCodec`] does to a chunk, chosen from the raw bytes so that it is
/// deterministic per chunk content.
#[derive(Clone, Copy)]
pub struct Faults {
    /// Encoder returns an error when `hash % fail == 0` (0: never).
    pub fail: u64,
    /// Encoder returns a corrupted blob when `hash % corrupt == 0`.
    pub corrupt: u64,
    /// Encoder panics when `hash % panic == 0`.
    pub panic: u64,
}

/// gear-v1 with injected encoder failures, corrupted blobs and panics.
pub struct FaultyCodec {
    /// The real codec.
    pub inner: GearV1Codec,
    /// What to inject.
    pub faults: Faults,
    /// Faults injected so far.
    pub injected: AtomicU64,
}

impl FaultyCodec {
    /// gear-v1 with `faults`.
    pub fn new(faults: Faults) -> FaultyCodec {
        FaultyCodec {
            inner: GearV1Codec::new(Default::default()).unwrap(),
            faults,
            injected: AtomicU64::new(0),
        }
    }
}

fn hit(h: u64, m: u64) -> bool {
    m != 0 && h.is_multiple_of(m)
}

impl StoreCodec for FaultyCodec {
    fn name(&self) -> String {
        "faulty-gear-v1".into()
    }
    fn is_lossless(&self) -> bool {
        true
    }
    fn encode(&self, info: &ChunkInfo, raw: &[u8], blob: &mut Vec<u8>) -> Result<()> {
        let h = kvc_store_async::hash::fnv1a64(raw) >> 7;
        if hit(h, self.faults.panic) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            panic!("injected encoder panic");
        }
        if hit(h, self.faults.fail) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Failed {
                codec: self.name(),
                reason: "injected encoder failure".into(),
            });
        }
        self.inner.encode(info, raw, blob)?;
        if hit(h, self.faults.corrupt) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            // Flip a bit in the last payload byte: either the blob no longer decodes or
            // it decodes to different bytes; both must be caught before release.
            let i = blob.len() - 1;
            blob[i] ^= 0x01;
        }
        Ok(())
    }
    fn decode(&self, info: &ChunkInfo, blob: &[u8], out: &mut [u8]) -> Result<()> {
        self.inner.decode(info, blob, out)
    }
}

/// Installs a panic hook that stays quiet about injected panics.
pub fn quiet_injected_panics() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .unwrap_or_default();
        if !msg.contains("injected") {
            prev(info);
        }
    }));
}
