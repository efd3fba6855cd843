//! gear-v2 round trips: random, adversarial and real KV data, serial and parallel.

use kvc_codec::gear_v2::{max_encoded_len, Coder, Decoder, EncodeParams, Encoder, TensorKind};
use kvc_codec::Dtype;

// Shared with the examples and the bench; this test uses the data directory only.
#[allow(dead_code)]
#[path = "../examples/common/realkv.rs"]
mod realkv;

const DTYPES: [Dtype; 4] = [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Round trip with both coders; returns the shared-shape blob's size.
fn roundtrip(params: &EncodeParams, data: &[u8]) -> usize {
    roundtrip_with(Coder::Grouped, params, data);
    roundtrip_with(Coder::SharedShape, params, data)
}

fn roundtrip_with(coder: Coder, params: &EncodeParams, data: &[u8]) -> usize {
    let mut enc = Encoder::with_coder(coder);
    let blob = enc.encode(params, data).unwrap();
    assert!(blob.len() <= max_encoded_len(params, data.len()).unwrap());
    let mut par = Vec::new();
    enc.encode_into_parallel(params, data, &mut par).unwrap();
    assert_eq!(par, blob, "parallel encoding differs");
    let mut dec = Decoder::new();
    assert_eq!(dec.decode(&blob).unwrap(), data);
    let open = dec.open(&blob).unwrap();
    let mut out = vec![0u8; data.len()];
    open.decode_into_parallel(&mut out).unwrap();
    assert_eq!(out, data);
    // Every chunk alone.
    let mut at = 0;
    for i in 0..open.chunk_count() {
        let n = open.chunk_len(i);
        let mut o = vec![0u8; n];
        assert_eq!(open.decode_chunk_into(i, &mut o).unwrap(), n);
        assert_eq!(o, &data[at..at + n]);
        at += n;
    }
    blob.len()
}

#[test]
fn random_and_adversarial_shapes() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for dtype in DTYPES {
        for &(tokens, channels, chunk) in &[
            (0usize, 1u32, 1u32),
            (1, 1, 1),
            (3, 5, 2),
            (17, 7, 4),
            (64, 12, 16),
            (33, 192, 8),
        ] {
            let n = tokens * channels as usize * dtype.size();
            let mut params = EncodeParams::new(dtype, channels);
            params.chunk_tokens = chunk;
            params.kind = TensorKind::K;
            // Uniform random bytes (the stored-chunk path).
            let data: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            roundtrip(&params, &data);
            // All zeros, all ones, one value repeated (single-symbol tables).
            roundtrip(&params, &vec![0u8; n]);
            roundtrip(&params, &vec![0xffu8; n]);
            // Skewed: small values with random signs (coded path, both sign contexts).
            let skew: Vec<u8> = (0..n)
                .map(|i| {
                    let r = rng.next();
                    if i % dtype.size() == dtype.size() - 1 {
                        (r as u8 & 0x80) | 0x3c | (r >> 8) as u8 & 1
                    } else {
                        (r >> 16) as u8
                    }
                })
                .collect();
            roundtrip(&params, &skew);
        }
    }
}

#[test]
fn wide_alphabet_forces_length_limit() {
    // Geometric symbol frequencies over the whole 9-bit alphabet push Huffman past 11 bits.
    let mut rng = Rng(7);
    let mut data = Vec::new();
    for i in 0..40000u32 {
        let mut k = 0u32;
        while k < 511 && rng.next() & 1 == 0 {
            k += 1;
        }
        let v: u16 = ((k as u16) << 7) | (i as u16 & 0x7f);
        data.extend_from_slice(&v.to_le_bytes());
    }
    let params = EncodeParams::new(Dtype::Bf16, 8);
    roundtrip(&params, &data);
}

#[test]
fn real_kv_bit_exact() {
    let dir = realkv::data_dir();
    for name in ["K.f16", "V.f16", "K.bf16", "V.bf16"] {
        let data = std::fs::read(dir.join(format!("textA.{name}.bin"))).unwrap();
        let dtype = if name.ends_with("bf16") {
            Dtype::Bf16
        } else {
            Dtype::F16
        };
        // One layer-sized tensor in CI cost: [2048 or 512 tokens, 192 channels].
        let layer = data.len() / 8;
        let layer = if dir.ends_with("sample") {
            data.len() / 4
        } else {
            layer
        };
        let mut total = 0;
        let mut stored = 0;
        for l in [0usize, 3] {
            let t = &data[l * layer..(l + 1) * layer];
            stored += roundtrip(&EncodeParams::new(dtype, 192), t);
            total += t.len();
        }
        let ratio = total as f64 / stored as f64;
        eprintln!("{name}: ratio {ratio:.4}");
        assert!(ratio > 1.1, "{name}: ratio {ratio}");
    }
}

/// Rare symbols (on a few tokens, in either sign context, and at chunk starts, in channels
/// whose usual sign is either) must all get codes; a model fitted on a sample of the tokens
/// (tried in the sixth pass) failed this.
#[test]
fn rare_symbols_all_get_codes() {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let (tokens, channels) = (1100usize, 64usize);
    for (dtype, chunk) in DTYPES.into_iter().flat_map(|d| [(d, 256usize), (d, 37)]) {
        let w = dtype.size();
        let mut data = vec![0u8; tokens * channels * w];
        for t in 0..tokens {
            for c in 0..channels {
                let r = rng.next();
                // Mostly two tops per channel; a rare one on a few unsampled tokens.
                let mut top = 0x3c + (c % 3) as u8 + (r >> 63) as u8;
                if t % 4 != 0 && r.is_multiple_of(97) {
                    top = 0x10 + (r >> 40) as u8 % 0x60;
                }
                if c % 2 == 1 {
                    top |= 0x80; // channels whose usual sign is negative
                }
                if t % 50 == 7 {
                    top ^= 0x80; // a sign flip: the other context follows
                }
                // A symbol that starts chunks and otherwise occurs only unsampled, after a
                // sign flip.
                if t % chunk == 0 || (t % 50 == 8 && t % 4 != 0) {
                    top = 0xa0 + (c % 5) as u8;
                }
                let at = (t * channels + c) * w;
                for b in 0..w {
                    data[at + b] = (r >> (8 * b)) as u8;
                }
                data[at + w - 1] = top;
            }
        }
        let mut p = EncodeParams::new(dtype, channels as u32);
        p.chunk_tokens = chunk as u32;
        p.kind = TensorKind::K;
        roundtrip(&p, &data);
    }
}

/// Tokens drawn from a small pool of rows, as layer 0's V repeats the rows of repeated words:
/// chunks code their first occurrences and refer to them (mode 2). Dropping the repeats gives
/// the coded rows neighbours they never had in the input, hence sign contexts the input never
/// shows; the model must be fitted on the coded rows for every symbol to have a code.
#[test]
fn repeated_rows_roundtrip() {
    let mut rng = Rng(0x51ed_270b_a5e1_9d3f);
    for dtype in DTYPES {
        for seed in 0..12u64 {
            let channels = 8 + (seed as usize * 5) % 24;
            let row = channels * dtype.size();
            let pool_rows = 2 + seed as usize % 7;
            let pool: Vec<u8> = (0..pool_rows * row)
                .map(|j| {
                    let r = rng.next();
                    // Mixed signs (the sign bit is the top bit of each value's last byte).
                    if (j + 1) % dtype.size() == 0 {
                        (r as u8 & 0x83) | (r >> 8) as u8 & 0x0c
                    } else {
                        r as u8
                    }
                })
                .collect();
            let tokens = 40 + (seed as usize * 37) % 200;
            let mut data = Vec::with_capacity(tokens * row);
            for _ in 0..tokens {
                let p = if rng.next().is_multiple_of(4) {
                    rng.next() as usize % pool_rows
                } else {
                    (rng.next() % 2) as usize
                };
                data.extend_from_slice(&pool[p * row..(p + 1) * row]);
            }
            let mut params = EncodeParams::new(dtype, channels as u32);
            params.chunk_tokens = [7u32, 16, 64, 1000][seed as usize % 4];
            let blob = Encoder::with_coder(Coder::SharedShape)
                .encode(&params, &data)
                .unwrap();
            if dtype.size() >= 2 {
                assert!(
                    blob.len() < data.len(),
                    "{dtype} seed {seed}: repeats not used"
                );
            }
            roundtrip(&params, &data);
        }
    }
}

/// The smallest case of the above: every 6-token chunk is `U N N M U V` (+1, -3, -3, -5,
/// +1, +2 in every channel). The chunk codes `U N M V`, where `V` follows a negative value;
/// in the input `V` only ever follows a positive one. The sign context pays on this data,
/// so a model fitted on the input would have no code for `V` after a negative sign. (The
/// low bits differ from chunk to chunk, so that the rows repeat inside their chunk only and
/// the row dictionary takes none of them.)
#[test]
fn repeats_make_new_sign_contexts() {
    let row = |v: f32, chunk: u16| -> Vec<u8> {
        let h = match v {
            1.0 => 0x3c00u16,
            2.0 => 0x4000,
            -3.0 => 0xc200,
            _ => 0xc500, // -5.0
        };
        (0..8)
            .flat_map(|c| (h | chunk << 3 | c).to_le_bytes())
            .collect()
    };
    let data: Vec<u8> = (0..32)
        .flat_map(|k| [1.0, -3.0, -3.0, -5.0, 1.0, 2.0].map(|v| row(v, k)))
        .flatten()
        .collect();
    let mut params = EncodeParams::new(Dtype::F16, 8);
    params.chunk_tokens = 6;
    for coder in [Coder::Grouped, Coder::SharedShape] {
        let blob = Encoder::with_coder(coder).encode(&params, &data).unwrap();
        assert_eq!(
            blob[7] & 1,
            1,
            "{coder:?}: sign context off, the case tests nothing"
        );
        assert_eq!(&blob[28..32], &[0; 4], "{coder:?}: rows in the dictionary");
        roundtrip_with(coder, &params, &data);
    }
}

/// Rows of a global pool in every chunk (the row dictionary, format version 3), rows repeated
/// inside one chunk only (chunk-local references) and unique rows, in chunks of several sizes:
/// the dictionary holds exactly the pool rows seen in two or more chunks.
#[test]
fn row_dictionary_roundtrip() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for dtype in DTYPES {
        for seed in 0..8u64 {
            let channels = 16 + (seed as usize * 7) % 40;
            let row = channels * dtype.size();
            let random_row =
                |rng: &mut Rng| -> Vec<u8> { (0..row).map(|_| rng.next() as u8).collect() };
            let pool: Vec<Vec<u8>> = (0..6).map(|_| random_row(&mut rng)).collect();
            let chunk_tokens = [5usize, 8, 16, 33][seed as usize % 4];
            let chunks = 3 + seed as usize % 5;
            let mut data = Vec::new();
            let mut pool_chunks = vec![std::collections::BTreeSet::new(); pool.len()];
            for c in 0..chunks {
                let local = random_row(&mut rng);
                for t in 0..chunk_tokens {
                    let pick = rng.next() % 4;
                    if pick == 0 {
                        let p = rng.next() as usize % pool.len();
                        pool_chunks[p].insert(c);
                        data.extend_from_slice(&pool[p]);
                    } else if pick == 1 && t > 0 {
                        data.extend_from_slice(&local);
                    } else {
                        data.extend_from_slice(&random_row(&mut rng));
                    }
                }
            }
            let in_dictionary = pool_chunks.iter().filter(|s| s.len() >= 2).count();
            let mut params = EncodeParams::new(dtype, channels as u32);
            params.chunk_tokens = chunk_tokens as u32;
            for coder in [Coder::Grouped, Coder::SharedShape] {
                let blob = Encoder::with_coder(coder).encode(&params, &data).unwrap();
                assert_eq!(blob[4], 3);
                let dict_rows = u32::from_le_bytes(blob[28..32].try_into().unwrap());
                assert_eq!(dict_rows as usize, in_dictionary, "{dtype} seed {seed}");
                roundtrip_with(coder, &params, &data);
            }
        }
    }
}

/// A dictionary that does not pay: one-channel f16 rows drawn from 2,000 values, so every
/// value repeats across chunks, but a two-byte reference saves nothing over a two-byte row
/// and the chunks end up stored. The encoder drops the dictionary rather than exceed
/// `max_encoded_len`.
#[test]
fn row_dictionary_dropped_when_it_does_not_pay() {
    let mut rng = Rng(99);
    let data: Vec<u8> = (0..8000)
        .flat_map(|_| (0x3000u16 + (rng.next() % 2000) as u16).to_le_bytes())
        .collect();
    let mut params = EncodeParams::new(Dtype::F16, 1);
    params.chunk_tokens = 256;
    for coder in [Coder::Grouped, Coder::SharedShape] {
        let blob = Encoder::with_coder(coder).encode(&params, &data).unwrap();
        assert_eq!(&blob[28..32], &[0; 4], "{coder:?}: dictionary kept");
        roundtrip_with(coder, &params, &data);
    }
}

/// int8 codes with the shared-shape coder: wrapping differences from each channel's median
/// (flag bit 2), with the relative sign context on (the previous code's side of the median
/// predicts the next one's). Channels have different zero points, including ones near the
/// ends of the range, where the wrapping difference crosses -128/127.
#[test]
fn int8_wrapping_map_with_sign_context() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let channels = 24;
    let mut data = Vec::new();
    let mut side = vec![1i32; channels];
    for _ in 0..600 {
        for (c, s) in side.iter_mut().enumerate() {
            if rng.next().is_multiple_of(8) {
                *s = -*s;
            }
            let zero = [0i32, 100, -120, 127, -128, 37][c % 6];
            let v = zero + *s * (1 + (rng.next() % 6) as i32);
            data.push(v as i8 as u8);
        }
    }
    let mut params = EncodeParams::new(Dtype::I8, channels as u32);
    params.chunk_tokens = 128;
    let blob = Encoder::with_coder(Coder::SharedShape)
        .encode(&params, &data)
        .unwrap();
    assert_eq!(
        blob[7],
        1 | 2 | 4,
        "sign context, shared-shape, wrapping map"
    );
    roundtrip(&params, &data);
}

/// f32 values whose lowest byte takes few values, as V from a quantized model's integer dot
/// products: the shared-shape coder codes the low bytes (flag bit 3) and stays lossless;
/// noise low bytes stay raw.
#[test]
fn f32_coded_low_bytes() {
    let mut rng = Rng(0xdead_beef_1234_5677);
    for (tokens, channels, chunk) in [(300usize, 24usize, 64u32), (77, 5, 16), (1000, 1, 1000)] {
        for structured in [true, false] {
            let mut data = Vec::new();
            for t in 0..tokens {
                for c in 0..channels {
                    let r = rng.next();
                    let sign = (r >> 63) as u32;
                    let exp = 120 + (c as u32 + t as u32 % 3) % 8;
                    let mid = (r >> 8) as u32 & 0x7fff;
                    let low = if structured {
                        [0u32, 0x80, 0x40, 0xc0, 0x20, r as u32 & 0xff][(r >> 20) as usize % 6]
                    } else {
                        r as u32 & 0xff
                    };
                    let x = sign << 31 | exp << 23 | mid << 8 | low;
                    data.extend_from_slice(&x.to_le_bytes());
                }
            }
            let mut params = EncodeParams::new(Dtype::F32, channels as u32);
            params.chunk_tokens = chunk;
            let blob = Encoder::new().encode(&params, &data).unwrap();
            assert_eq!(
                blob[7] & 8 != 0,
                structured,
                "{tokens}x{channels}: flag bit 3"
            );
            roundtrip(&params, &data);
        }
    }
}

/// The encoder's per-thread scratch (code indices, lane regions) is reused without being
/// cleared: a blob must not depend on what the thread encoded before. A small tensor is
/// encoded on a fresh thread, then on a thread that has just encoded a large random one
/// (whose lanes leave every scratch byte nonzero), and the blobs compared.
/// One encoder object reused across shapes and dtypes (as the store reuses its encoders)
/// writes the blobs a fresh one writes: the per-encoder statistics it keeps between blobs
/// (only the last fit's used counts are cleared, not the whole table) never leak into the
/// next model. The int8 tensor's counts have the f16 tensor's length with half the alphabet.
#[test]
fn a_reused_encoder_writes_a_fresh_encoders_blobs() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    // KV-like values: each channel's top field near its own usual value, both signs.
    let kv_like = |rng: &mut Rng, tokens: usize, channels: usize, width: usize| -> Vec<u8> {
        let mut v = vec![0u8; tokens * channels * width];
        for (i, x) in v.chunks_exact_mut(width).enumerate() {
            let r = rng.next();
            let c = (i % channels) as u8;
            for b in x.iter_mut() {
                *b = (r >> 24) as u8;
            }
            x[width - 1] = (c / 8 + (r >> 8) as u8 % 5 + 0x18) | ((r >> 16) as u8 & 0x80);
        }
        v
    };
    let tensors = [
        (Dtype::F16, 192, kv_like(&mut rng, 700, 192, 2)),
        (Dtype::I8, 384, kv_like(&mut rng, 500, 384, 1)),
        (Dtype::Bf16, 64, kv_like(&mut rng, 300, 64, 2)),
        (Dtype::F16, 64, kv_like(&mut rng, 300, 64, 2)),
        (Dtype::F32, 48, kv_like(&mut rng, 200, 48, 4)),
    ];
    for coder in [Coder::Grouped, Coder::SharedShape] {
        let mut reused = Encoder::with_coder(coder);
        for round in 0..2 {
            for (dtype, channels, data) in &tensors {
                let params = EncodeParams::new(*dtype, *channels);
                let fresh = Encoder::with_coder(coder).encode(&params, data).unwrap();
                let again = reused.encode(&params, data).unwrap();
                assert_eq!(again, fresh, "{coder:?} {dtype:?} round {round}");
                assert_eq!(&Decoder::new().decode(&again).unwrap(), data);
            }
        }
    }
}

#[test]
fn blobs_do_not_depend_on_earlier_encodes() {
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let big: Vec<u8> = (0..4096 * 192 * 2).map(|_| rng.next() as u8).collect();
    let mut small = vec![0u8; 300 * 64 * 2];
    // KV-like f16: each channel's top byte (sign and exponent) near its own usual value.
    for (i, v) in small.chunks_exact_mut(2).enumerate() {
        let r = rng.next();
        v[0] = r as u8;
        v[1] = (0x20 + (i % 64) as u8 / 4 + (r >> 8) as u8 % 3) | ((r >> 16) as u8 & 0x80);
    }
    let big_params = EncodeParams::new(Dtype::F16, 192);
    let params = EncodeParams::new(Dtype::F16, 64);
    for coder in [Coder::Grouped, Coder::SharedShape] {
        let fresh = {
            let small = small.clone();
            std::thread::spawn(move || Encoder::with_coder(coder).encode(&params, &small).unwrap())
                .join()
                .unwrap()
        };
        Encoder::with_coder(coder)
            .encode(&big_params, &big)
            .unwrap();
        let after = Encoder::with_coder(coder).encode(&params, &small).unwrap();
        assert_eq!(after, fresh, "{coder:?}");
        assert_eq!(Decoder::new().decode(&after).unwrap(), small);
    }
}
