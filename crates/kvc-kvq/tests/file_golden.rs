//! Golden files of the kvq packed cache file (`KVCKVQPK`), one set per format version
//! (`docs/formats/kvq.md`, "Packed cache files"): `tests/golden/kvq-file-v<version>-<case>.bin`
//! is the file `kvc_kvq::file::encode` writes for a fixed input made here, and
//! `tests/golden/kvq-file-v<version>-<case>.out.f32` its decoded values (little-endian f32,
//! `[layer][token][kv_head][head_dim]`). For each case:
//!
//! - encoding the fixed input gives the golden bytes exactly;
//! - decoding the golden bytes gives the checked-in output bit for bit, which is also what
//!   `RowCodec` / `ChannelGroupCodec` (and the f16 tail) give when called directly on the
//!   golden body, and what the writer reports as its decoded values;
//! - every bit of the header flipped, every truncation and one extra byte are refused with
//!   an error, never a panic.
//!
//! A change to the format must be a new version with its own golden files; the v1 files
//! stay and must still decode. To rewrite the golden files deliberately (only for a new
//! version or a new case, never to make a failing test pass):
//!
//! ```text
//! KVC_BLESS=1 cargo test -p kvc-kvq --test file_golden
//! ```
//!
//! then check the new files in, saying why in the commit.

use std::path::PathBuf;

use half::f16;
use kvc_kvq::file::{self, Header, Spec, Tensor};
use kvc_kvq::{ChannelGroupCodec, Error, ErrorKind, KvqConfig, KvqPlan, RowCodec};

const LAYERS: usize = 2;
const HEADS: usize = 2;
const DIM: usize = 64;

/// One golden file: its name, what it holds and the shape of its fixed input.
struct Case {
    name: &'static str,
    tensor: Tensor,
    spec: Spec,
    tokens: usize,
    group: Option<usize>,
}

fn cases() -> Vec<Case> {
    let mut plan = KvqPlan::uniform(&KvqConfig::parse("k5v3").unwrap(), DIM as u32, 2, LAYERS);
    plan.layers[1].v_bits = 2;
    vec![
        // Rows, uniform groups of 32, a config string.
        Case {
            name: "rows-k-config",
            tensor: Tensor::K,
            spec: Spec::Config(KvqConfig::parse("k4v2:u32").unwrap()),
            tokens: 5,
            group: None,
        },
        // Rows, Lloyd-Max, a plan with other bits per layer (3 then 2).
        Case {
            name: "rows-v-plan",
            tensor: Tensor::V,
            spec: Spec::Plan(Box::new(plan)),
            tokens: 5,
            group: None,
        },
        // K per channel over groups of 16 tokens: one block per head, then a 5-token f16 tail.
        Case {
            name: "group16-k-config",
            tensor: Tensor::K,
            spec: Spec::Config(KvqConfig::parse("k4v4").unwrap()),
            tokens: 21,
            group: Some(16),
        },
    ]
}

impl Case {
    fn header(&self) -> Header {
        Header::new(
            self.tensor,
            self.spec.clone(),
            LAYERS,
            HEADS,
            DIM,
            self.tokens,
            self.group,
        )
        .unwrap()
    }

    /// The fixed input, `[layer][token][kv_head][head_dim]`: a 64-bit LCG's values spread
    /// over about [-4, 4], a per-channel offset (as K has) and one outlier channel.
    fn input(&self) -> Vec<f32> {
        let mut s: u64 = 0x6b76_6366_696c_6531;
        (0..LAYERS * self.tokens * HEADS * DIM)
            .map(|i| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                let c = i % DIM;
                let offset = (c % 7) as f32 * 0.25 - 0.75;
                let outlier = if c == 5 { 6.0 } else { 0.0 };
                (u - 0.5) * 8.0 + offset + outlier
            })
            .collect()
    }

    fn path(&self, ext: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(format!("kvq-file-v{}-{}.{ext}", file::VERSION, self.name))
    }

    fn golden(&self) -> Vec<u8> {
        let p = self.path("bin");
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn expected_output(&self) -> Vec<f32> {
        let p = self.path("out.f32");
        let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// The least SNR (dB) of layer `layer`'s decoded values against the input in golden case
/// `case`, by the code that layer uses. The decoded output is fixed bit for bit, so these
/// state what each method and bit width gives, 1 dB under the measurement (2026-11-28):
/// Lloyd-Max rows at 3 and 2 bits (`rows-v-plan`'s layers) measured 14.63 and 9.41 dB,
/// the Gaussian Lloyd-Max distortion (14.62, 9.30: the rotation makes the coordinates near
/// Gaussian); uniform 4-bit rows in groups of 32 (`rows-k-config`) 20.67 and 21.03 dB,
/// about 6 dB a bit less the peak-to-RMS loading of a group; K per channel over groups of
/// 16 tokens at 4 bits plus the 5-token f16 tail (`group16-k-config`) 26.95 and 27.12 dB.
fn min_layer_snr_db(case: &str, layer: usize) -> f64 {
    match (case, layer) {
        ("rows-k-config", _) => 19.6,
        ("rows-v-plan", 0) => 13.6,
        ("rows-v-plan", _) => 8.4,
        ("group16-k-config", _) => 25.9,
        _ => panic!("no measured SNR for {case} layer {layer}"),
    }
}

fn blessing() -> bool {
    std::env::var_os("KVC_BLESS").is_some_and(|v| v == "1")
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// What the codecs give when called directly on the golden body, without `file`'s reader.
fn decode_directly(c: &Case, golden: &[u8]) -> Vec<f32> {
    let h = c.header();
    let header_len = h.encode().len();
    let mut body = &golden[header_len..];
    let (nt, d) = (c.tokens, DIM);
    let at = |t: usize, hd: usize| (t * HEADS + hd) * d;
    let mut out = Vec::new();
    for l in 0..LAYERS {
        let bits = h.bits(l);
        let mut back = vec![0f32; nt * HEADS * d];
        match c.group {
            None => {
                let codec = RowCodec::new(h.method(), bits, d, h.plan.seed).unwrap();
                for t in 0..nt {
                    for hd in 0..HEADS {
                        let (row, rest) = body.split_at(codec.row_bytes());
                        codec
                            .dequantize_row(row, &mut back[at(t, hd)..][..d])
                            .unwrap();
                        body = rest;
                    }
                }
            }
            Some(g) => {
                let codec = ChannelGroupCodec::new(bits, d, g).unwrap();
                let mut dec = vec![0f32; g * d];
                for hd in 0..HEADS {
                    for b in 0..nt / g {
                        let (block, rest) = body.split_at(codec.block_bytes());
                        codec.dequantize_block(block, &mut dec).unwrap();
                        for r in 0..g {
                            back[at(b * g + r, hd)..][..d].copy_from_slice(&dec[r * d..][..d]);
                        }
                        body = rest;
                    }
                }
                for v in back[nt / g * g * HEADS * d..].iter_mut() {
                    let (b, rest) = body.split_at(2);
                    *v = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    body = rest;
                }
            }
        }
        out.extend(back);
    }
    assert!(
        body.is_empty(),
        "{} bytes left after the last layer",
        body.len()
    );
    out
}

#[test]
fn encoding_the_fixed_input_gives_the_golden_bytes() {
    for c in cases() {
        let h = c.header();
        let x = c.input();
        let bytes = file::encode(&h, &x).unwrap();
        // The writer's own decoded values, layer by layer.
        let mut codecs = file::Codecs::new(&h);
        let mut again = h.encode();
        let mut written_back = Vec::new();
        for (i, layer) in x.chunks_exact(h.layer_values()).enumerate() {
            let mut back = vec![0f32; h.layer_values()];
            file::encode_layer(&h, i, &mut codecs, layer, &mut again, &mut back).unwrap();
            written_back.extend(back);
        }
        assert_eq!(again, bytes, "{}: encode and encode_layer differ", c.name);
        if blessing() {
            std::fs::write(c.path("bin"), &bytes).unwrap();
            let out: Vec<u8> = written_back.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(c.path("out.f32"), out).unwrap();
            eprintln!("blessed {}", c.path("bin").display());
            continue;
        }
        let golden = c.golden();
        assert_eq!(&golden[..8], b"KVCKVQPK", "{}", c.name);
        assert_eq!(golden[8..10], 1u16.to_le_bytes(), "{}", c.name);
        assert_eq!(bytes.len(), golden.len(), "{}: length", c.name);
        if let Some(i) = bytes.iter().zip(&golden).position(|(a, b)| a != b) {
            panic!(
                "{}: byte {i} is {:#04x}, the golden file has {:#04x}",
                c.name, bytes[i], golden[i]
            );
        }
        assert!(
            bits_equal(&written_back, &c.expected_output()),
            "{}: the writer's decoded values differ from the golden output",
            c.name
        );
    }
}

#[test]
fn decoding_the_golden_bytes_gives_the_fixed_output() {
    for c in cases() {
        let golden = c.golden();
        let expect = c.expected_output();
        assert_eq!(expect.len(), LAYERS * c.tokens * HEADS * DIM, "{}", c.name);
        let (h, out) = file::decode(&golden, c.tensor).unwrap();
        assert_eq!(h, c.header(), "{}", c.name);
        assert!(
            bits_equal(&out, &expect),
            "{}: decoded values differ from the golden output",
            c.name
        );
        assert!(
            bits_equal(&decode_directly(&c, &golden), &expect),
            "{}: the codecs called directly differ from the golden output",
            c.name
        );
        // Coding keeps the input: each layer's output is as near it as its code makes it.
        let x = c.input();
        let per_layer = x.len() / LAYERS;
        for l in 0..LAYERS {
            let r = l * per_layer..(l + 1) * per_layer;
            let noise: f64 = x[r.clone()]
                .iter()
                .zip(&out[r.clone()])
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            let signal: f64 = x[r].iter().map(|a| f64::from(*a).powi(2)).sum();
            let snr = 10.0 * (signal / noise).log10();
            let min = min_layer_snr_db(c.name, l);
            assert!(
                snr > min,
                "{} layer {l}: SNR {snr} dB, at least {min}",
                c.name
            );
        }
    }
}

#[test]
fn every_flipped_header_bit_of_the_golden_files_is_refused() {
    for c in cases() {
        let golden = c.golden();
        let (_, header_len) = file::parse(&golden, c.tensor).unwrap();
        for i in 0..header_len {
            for bit in 0..8 {
                let mut g = golden.clone();
                g[i] ^= 1 << bit;
                let e = file::decode(&g, c.tensor).unwrap_err();
                assert!(
                    matches!(e, Error::BadFile { .. }),
                    "{}: byte {i} bit {bit}: {e}",
                    c.name
                );
                assert_eq!(e.kind(), ErrorKind::CorruptData);
            }
        }
    }
}

#[test]
fn every_truncation_of_the_golden_files_is_refused() {
    for c in cases() {
        let golden = c.golden();
        for n in 0..golden.len() {
            let e = file::decode(&golden[..n], c.tensor).unwrap_err();
            assert!(
                matches!(e, Error::BadFile { .. }),
                "{}: cut to {n}: {e}",
                c.name
            );
            assert!(e.to_string().contains("truncated"), "{}: {n}: {e}", c.name);
        }
        let mut longer = golden.clone();
        longer.push(0);
        assert!(file::decode(&longer, c.tensor).is_err(), "{}", c.name);
        let other = match c.tensor {
            Tensor::K => Tensor::V,
            Tensor::V => Tensor::K,
        };
        let e = file::decode(&golden, other).unwrap_err();
        assert!(e.to_string().contains("holds"), "{}: {e}", c.name);
    }
}
