//! FNV-1a 64 (kvc's shared checksum, from `kvc-types`), the hash MNN's store uses for its
//! decode-cache keys, and [`check64`], the
//! fast hash the store checks restored bytes with.
//!
//! FNV-1a works a byte at a time through one multiply chain (about 4 cycles a byte): on
//! a 384-token chunk of one layer that is as slow as decoding it. The decode-cache key
//! keeps FNV-1a (the spec's key, computed once by the worker); a restore is checked with
//! [`check64`], which the worker also computes and which reads 32 bytes per round in four
//! independent lanes.

pub use kvc_types::{fnv1a64, fnv1a64_update, FNV_OFFSET, FNV_PRIME};

const P1: u64 = 0x9e37_79b1_85eb_ca87;
const P2: u64 = 0xc2b2_ae3d_27d4_eb4f;
const P3: u64 = 0x1656_67b1_9e37_79f9;
const P4: u64 = 0x85eb_ca77_c2b2_ae63;
const P5: u64 = 0x27d4_eb2f_1656_67c5;

#[inline(always)]
fn round(acc: u64, w: u64) -> u64 {
    acc.wrapping_add(w.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

#[inline(always)]
fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

/// A 64-bit check hash of `bytes`: four lanes of multiply-rotate rounds over 8-byte
/// words (xxh64's round and constants), merged, then the tail and a final avalanche.
/// Every input bit reaches every output bit; it is not cryptographic and not
/// compatible with any published hash's values.
pub fn check64(bytes: &[u8]) -> u64 {
    let n = bytes.len() as u64;
    let mut blocks = bytes.chunks_exact(32);
    let mut h = if bytes.len() >= 32 {
        let mut a = [P1.wrapping_add(P2), P2, 0, 0u64.wrapping_sub(P1)];
        for b in &mut blocks {
            a[0] = round(a[0], word(&b[0..]));
            a[1] = round(a[1], word(&b[8..]));
            a[2] = round(a[2], word(&b[16..]));
            a[3] = round(a[3], word(&b[24..]));
        }
        let mut h = a[0]
            .rotate_left(1)
            .wrapping_add(a[1].rotate_left(7))
            .wrapping_add(a[2].rotate_left(12))
            .wrapping_add(a[3].rotate_left(18));
        for x in a {
            h = (h ^ round(0, x)).wrapping_mul(P1).wrapping_add(P4);
        }
        h
    } else {
        P5
    };
    h = h.wrapping_add(n);
    let mut tail = blocks.remainder();
    while tail.len() >= 8 {
        h = (h ^ round(0, word(tail)))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
        tail = &tail[8..];
    }
    for &b in tail {
        h = (h ^ u64::from(b).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check64_sees_every_bit_and_length() {
        let base: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let h0 = check64(&base);
        assert_eq!(h0, check64(&base.clone()));
        // Every single-bit flip changes the hash, at every offset (blocks and tail).
        for i in 0..base.len() {
            for bit in [0, 3, 7] {
                let mut b = base.clone();
                b[i] ^= 1 << bit;
                assert_ne!(check64(&b), h0, "byte {i} bit {bit}");
            }
        }
        // Two flips of the same bit in two words of one lane (they cancel in a plain
        // xor-multiply hash) are seen.
        let mut b = base.clone();
        b[7] ^= 0x80;
        b[39] ^= 0x80;
        assert_ne!(check64(&b), h0);
        // Lengths and zero prefixes differ.
        let z: Vec<u64> = (0..70).map(|n| check64(&vec![0u8; n])).collect();
        for i in 0..z.len() {
            for j in 0..i {
                assert_ne!(z[i], z[j], "{i} vs {j}");
            }
        }
    }
}
