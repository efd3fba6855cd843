//! A reusable gear-v2 encoder and decoder allocate nothing in steady state: after a first
//! call has sized their buffers, encoding and decoding more tensors of the same shape makes
//! no heap allocation (counted per thread by `kvc-test-alloc`'s global allocator).

use kvc_codec::gear_v2::{Coder, Decoder, EncodeParams, Encoder, TensorKind};
use kvc_codec::Dtype;
use kvc_test_alloc::allocations as allocs;

#[global_allocator]
static GLOBAL: kvc_test_alloc::Counting = kvc_test_alloc::Counting;

/// Skewed KV-like data: small values with random signs, different per seed. With
/// `repeats`, every third token from token 70 on repeats the row 70 tokens earlier (the same
/// pattern for every seed): chunk-local references and a row dictionary.
fn tensor(dtype: Dtype, tokens: usize, channels: usize, seed: u64, repeats: bool) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(tokens * channels * dtype.size());
    for i in 0..tokens * channels * dtype.size() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let hi = i % dtype.size() == dtype.size() - 1;
        v.push(if hi {
            (x as u8 & 0x80) | 0x38 | (x >> 9) as u8 & 3
        } else {
            (x >> 20) as u8
        });
    }
    if repeats {
        let row = channels * dtype.size();
        for t in (72..tokens).step_by(3) {
            v.copy_within((t - 70) * row..(t - 69) * row, t * row);
        }
    }
    v
}

#[test]
fn steady_state_encode_and_decode_allocate_nothing() {
    let dtypes = [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8];
    for (coder, dtype, repeats) in [Coder::Grouped, Coder::SharedShape, Coder::Auto]
        .into_iter()
        .flat_map(|c| dtypes.map(|d| (c, d)))
        .flat_map(|(c, d)| [(c, d, false), (c, d, true)])
    {
        let (tokens, channels) = (300, 22);
        let mut params = EncodeParams::new(dtype, channels as u32);
        params.chunk_tokens = 64;
        params.kind = TensorKind::V;
        let mut enc = Encoder::with_coder(coder);
        let mut dec = Decoder::new();
        let mut blob = Vec::new();
        let mut out = vec![0u8; tokens * channels * dtype.size()];
        // Warm-up sizes every buffer.
        for seed in 1..3 {
            let data = tensor(dtype, tokens, channels, seed, repeats);
            enc.encode_into(&params, &data, &mut blob).unwrap();
            dec.decode_into(&blob, &mut out).unwrap();
        }
        for seed in 3..6 {
            let data = tensor(dtype, tokens, channels, seed, repeats);
            // Room for any blob of this shape, so `blob` never has to grow.
            blob.reserve(2 * data.len() + 65536);
            let before = allocs();
            enc.encode_into(&params, &data, &mut blob).unwrap();
            assert_eq!(blob[28..32] != [0; 4], repeats, "row dictionary");
            let n = dec.decode_into(&blob, &mut out).unwrap();
            let open = dec.open(&blob).unwrap();
            for i in 0..open.chunk_count() {
                let len = open.chunk_len(i);
                open.decode_chunk_into(i, &mut out[..len]).unwrap();
            }
            assert_eq!(
                allocs(),
                before,
                "{coder:?} {dtype:?} repeats {repeats}: allocation in steady state"
            );
            dec.decode_into(&blob, &mut out).unwrap();
            assert_eq!(n, data.len());
            assert_eq!(out, data);
        }
    }
}
