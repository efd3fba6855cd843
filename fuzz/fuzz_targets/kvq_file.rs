//! Fuzz the kvq packed cache file that `kvc quant apply --kvq` writes and `kvc quant
//! dequant --kvq` reads (docs/formats/kvq.md, "Packed cache files"), through the library
//! the command calls, `kvc_kvq::file` (the header: `parse`, `Header::new`,
//! `Header::encode`; the body: `decode`, `encode_layer`).
//!
//! Every input, as a whole file, read as K and as V:
//! - `parse` and `decode` never panic, agree (decoding succeeds only where the header
//!   parses) and fail only with a corrupt-data error;
//! - no allocation during the read is larger than `32 x input length + 1 MiB`, nor the
//!   bytes held at once above `64 x input length + 1 MiB` (the output is at most 16 f32
//!   bytes per body byte, 2..8-bit codes, and grows by doubling; codebooks and rotations
//!   are bounded by head_dim <= 256), so the reader sizes nothing from an unchecked field;
//! - a decoded file is exactly `layers x tokens x kv_heads x head_dim` f32 values, all
//!   finite, and its header re-encodes to the file's header bytes.
//!
//! An input that does not start with the magic also drives a round trip. Byte 0: bit 0
//! V (else K), bit 1 a plan (else a config string), bits 2-3 a K channel group (0: rows,
//! 1: 16, 2: 32, 3: rows), bits 4-6 the method (lm, u8, u16, u32, u64, u128, u256, lm;
//! a uniform group larger than head_dim becomes lm), bit 7 a seed from bytes 5..13 (else
//! the default). Byte 1: K bits `2 + (b & 7) % 7`, V bits `2 + (b >> 3 & 7) % 7`. Byte 2:
//! layers `1 + b % 3`, kv_heads `1 + (b >> 2) % 2`, head_dim 64/128/256 from `(b >> 4) % 3`.
//! Byte 3: tokens `1 + b % 48`. Byte 4: values are scaled by `1 + b / 64` (0: exact f16).
//! Byte 13: bit 0 plants a non-finite or out-of-range value at a place from its other
//! bits. For a plan, one byte per layer follows (its K and V bits, as byte 1). The rest
//! are the values, f16 bit patterns (non-finite ones made finite), cycled; none: real K of
//! the embedded sample (data/sample). The file the writer makes (`Header::new`, `encode`,
//! `encode_layer` per layer) must hold, after its header, exactly the bytes `RowCodec` /
//! `ChannelGroupCodec` give when called directly (and the f16 tail), fail exactly when
//! those fail, read back with `decode` to the codecs' decoded values bit for bit,
//! be refused as the other tensor, and be refused when truncated: at every length for a
//! file up to 4 KiB, else every header length, every layer boundary and its neighbours,
//! 256 lengths spread over the body and the last 64.
//!
//! Seeds: fuzz/seeds/kvq_file/, files written by `kvc quant apply --kvq` from the first
//! tokens of data/sample (see docs/DEVELOPING.md).
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering::Relaxed};

use half::f16;
use kvc_kvq::file::{decode, encode_layer, parse, Codecs, Header, Spec, Tensor, MAGIC};
use kvc_kvq::{ChannelGroupCodec, Error, ErrorKind, KvqConfig, KvqPlan, Method, RowCodec};
use libfuzzer_sys::fuzz_target;

/// Counts what is allocated while armed: bytes held now, their peak, the largest request.
struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn grew(by: isize, request: usize) {
    if ARMED.load(Relaxed) {
        let now = LIVE.fetch_add(by, Relaxed) + by;
        PEAK.fetch_max(now, Relaxed);
        LARGEST.fetch_max(request, Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` with the caller's layout and pointer
// unchanged; the counters are atomics and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize, layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize, layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        grew(-(layout.size() as isize), 0);
        // SAFETY: `ptr` was allocated by `System` (every allocation goes through here) with
        // `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as isize - layout.size() as isize, new_size);
        // SAFETY: as `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` with the counters armed; returns its result, the peak bytes held above what
/// was held before, and the largest single request.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    LARGEST.store(0, Relaxed);
    ARMED.store(true, Relaxed);
    let r = f();
    ARMED.store(false, Relaxed);
    (r, PEAK.load(Relaxed).max(0) as usize, LARGEST.load(Relaxed))
}

/// The embedded sample: `[4][512][3][64]` f16 K.
const SAMPLE_K: &[u8] = include_bytes!("../../data/sample/textA.K.f16.bin");
const SLACK: usize = 1 << 20;
/// Files whose body is at most this long have every truncation tried.
const ALL_CUTS: usize = 512;
/// Else the body's truncations tried besides those at layer boundaries and the last 16.
const SPREAD: usize = 32;

/// What a reader's refusal must be: corrupt data.
fn is_corrupt(e: &Error) -> bool {
    e.kind() == ErrorKind::CorruptData
}

/// What a writer's refusal of values must be: the values named, an invalid argument.
fn is_bad_values(e: &Error) -> bool {
    matches!(e, Error::FileValues { .. }) && e.kind() == ErrorKind::InvalidArgument
}

/// The whole input as a packed file of `tensor`.
fn read_as(data: &[u8], tensor: Tensor) {
    let parsed = parse(data, tensor);
    let (decoded, peak, largest) = counted(|| decode(data, tensor));
    let n = data.len();
    assert!(
        largest <= 32 * n + SLACK,
        "an allocation of {largest} bytes reading {n} bytes"
    );
    assert!(
        peak <= 64 * n + SLACK,
        "{peak} bytes held at once reading {n} bytes"
    );
    match (&parsed, &decoded) {
        (Err(e), Err(d)) => assert!(is_corrupt(e) && is_corrupt(d), "{e} / {d}"),
        (Ok(_), Err(d)) => assert!(is_corrupt(d), "{d}"),
        (Err(e), Ok(_)) => panic!("decoded a file whose header fails: {e}"),
        (Ok((h, at)), Ok((hd, out))) => {
            assert_eq!(h, hd);
            assert_eq!(h.tensor, tensor);
            assert_eq!(h.encode(), data[..*at]);
            let vals = h.layers * h.tokens * h.kv_heads * h.head_dim;
            assert_eq!(out.len(), vals);
            for (i, v) in out.iter().enumerate() {
                assert!(v.is_finite(), "value {i} of a decoded file is {v}");
            }
        }
    }
}

/// A config or plan, shape and values picked by the input, written, read back and
/// compared with the library's codecs.
struct Case {
    tensor: Tensor,
    spec: Spec,
    bits: Vec<u8>,
    method: Method,
    seed: u64,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
    group: Option<usize>,
    /// `[layer][token][kv_head][head_dim]`.
    x: Vec<f32>,
}

fn bits_of(b: u8) -> (u8, u8) {
    (2 + (b & 7) % 7, 2 + ((b >> 3) & 7) % 7)
}

fn case(data: &[u8]) -> Option<Case> {
    let head = data.get(..14)?;
    let tensor = if head[0] & 1 != 0 {
        Tensor::V
    } else {
        Tensor::K
    };
    let is_plan = head[0] & 2 != 0;
    let group = match (tensor, (head[0] >> 2) & 3) {
        (Tensor::K, 1) => Some(16),
        (Tensor::K, 2) => Some(32),
        _ => None,
    };
    let layers = 1 + head[2] as usize % 3;
    let kv_heads = 1 + (head[2] as usize >> 2) % 2;
    let head_dim = [64, 128, 256][(head[2] as usize >> 4) % 3];
    let tokens = 1 + head[3] as usize % 48;
    let method = match (head[0] >> 4) & 7 {
        g @ 1..=6 if 4usize << g <= head_dim => Method::Uniform { group: 4 << g },
        _ => Method::LloydMax,
    };
    let seed = if head[0] & 0x80 != 0 {
        u64::from_le_bytes(head[5..13].try_into().ok()?)
    } else {
        kvc_kvq::config::DEFAULT_SEED
    };
    let (kb, vb) = bits_of(head[1]);
    let cfg = KvqConfig::new(method, kb, vb, seed).ok()?;
    let mut rest = &data[14..];
    let (spec, bits) = if is_plan {
        let per = rest.get(..layers)?;
        rest = &rest[layers..];
        let mut p = KvqPlan::uniform(&cfg, head_dim as u32, kv_heads as u32, layers);
        for (l, &b) in p.layers.iter_mut().zip(per) {
            (l.k_bits, l.v_bits) = bits_of(b);
        }
        let bits = p
            .layers
            .iter()
            .map(|l| {
                if tensor == Tensor::K {
                    l.k_bits
                } else {
                    l.v_bits
                }
            })
            .collect();
        (Spec::Plan(Box::new(p)), bits)
    } else {
        let b = if tensor == Tensor::K { kb } else { vb };
        (Spec::Config(cfg), vec![b; layers])
    };
    let src = if rest.len() >= 2 { rest } else { SAMPLE_K };
    let scale = 1.0 + f32::from(head[4]) / 64.0;
    let n = layers * tokens * kv_heads * head_dim;
    let mut x: Vec<f32> = src
        .chunks_exact(2)
        .cycle()
        .take(n)
        .map(|c| {
            let mut h = u16::from_le_bytes([c[0], c[1]]);
            if h & 0x7c00 == 0x7c00 {
                h ^= 0x4000;
            }
            f16::from_bits(h).to_f32() * scale
        })
        .collect();
    if head[13] & 1 != 0 {
        let at = (head[13] as usize >> 3) * 977 % n;
        x[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30][(head[13] as usize >> 1) & 3];
    }
    Some(Case {
        tensor,
        spec,
        bits,
        method,
        seed,
        layers,
        kv_heads,
        head_dim,
        tokens,
        group,
        x,
    })
}

/// What the library gives for layer `l` called directly: its body bytes and decoded
/// values, or `None` where it refuses the values.
fn reference(
    c: &Case,
    l: usize,
    codecs: &mut HashMap<u8, RowCodec>,
) -> Option<(Vec<u8>, Vec<f32>)> {
    let (nt, nh, d) = (c.tokens, c.kv_heads, c.head_dim);
    let x = &c.x[l * nt * nh * d..(l + 1) * nt * nh * d];
    let at = |t: usize, h: usize| (t * nh + h) * d;
    let mut body = Vec::new();
    let mut back = vec![0f32; x.len()];
    match c.group {
        None => {
            let codec = codecs
                .entry(c.bits[l])
                .or_insert_with(|| RowCodec::new(c.method, c.bits[l], d, c.seed).unwrap());
            let mut row = vec![0u8; codec.row_bytes()];
            for t in 0..nt {
                for h in 0..nh {
                    let o = at(t, h);
                    codec.quantize_row(&x[o..o + d], &mut row).ok()?;
                    codec.dequantize_row(&row, &mut back[o..o + d]).unwrap();
                    body.extend_from_slice(&row);
                }
            }
        }
        Some(g) => {
            let codec = ChannelGroupCodec::new(c.bits[l], d, g).unwrap();
            let mut blk = vec![0u8; codec.block_bytes()];
            let mut dec = vec![0f32; g * d];
            for h in 0..nh {
                for b in 0..nt / g {
                    let rows: Vec<f32> = (0..g)
                        .flat_map(|r| x[at(b * g + r, h)..][..d].to_vec())
                        .collect();
                    codec.quantize_block(&rows, &mut blk).ok()?;
                    codec.dequantize_block(&blk, &mut dec).unwrap();
                    for r in 0..g {
                        back[at(b * g + r, h)..][..d].copy_from_slice(&dec[r * d..][..d]);
                    }
                    body.extend_from_slice(&blk);
                }
            }
            for t in nt / g * g..nt {
                for h in 0..nh {
                    for j in 0..d {
                        let v = f16::from_f32(x[at(t, h) + j]);
                        if !v.is_finite() {
                            return None;
                        }
                        body.extend_from_slice(&v.to_le_bytes());
                        back[at(t, h) + j] = v.to_f32();
                    }
                }
            }
        }
    }
    Some((body, back))
}

fn round_trip(c: &Case) {
    let h = Header::new(
        c.tensor,
        c.spec.clone(),
        c.layers,
        c.kv_heads,
        c.head_dim,
        c.tokens,
        c.group,
    )
    .unwrap_or_else(|e| panic!("a valid shape refused: {e}"));
    let mut file = h.encode();
    let header_len = file.len();
    let mut codecs = Codecs::new(&h);
    let mut ref_codecs = HashMap::new();
    let per_layer = c.tokens * c.kv_heads * c.head_dim;
    let mut expect = Vec::with_capacity(c.x.len());
    let mut bounds = vec![header_len];
    for l in 0..c.layers {
        let x = &c.x[l * per_layer..(l + 1) * per_layer];
        let mut back = vec![0f32; per_layer];
        let before = file.len();
        let wrote = encode_layer(&h, l, &mut codecs, x, &mut file, &mut back);
        match (wrote, reference(c, l, &mut ref_codecs)) {
            (Err(e), None) => {
                assert!(is_bad_values(&e), "{e}");
                return;
            }
            (Err(e), Some(_)) => panic!("layer {l}: the writer refused what the codecs take: {e}"),
            (Ok(()), None) => panic!("layer {l}: the writer took what the codecs refuse"),
            (Ok(()), Some((body, dec))) => {
                assert_eq!(file[before..], body[..], "layer {l}'s body");
                assert_eq!(Ok(body.len()), h.layer_bytes(l));
                assert!(back
                    .iter()
                    .zip(&dec)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                expect.extend(dec);
            }
        }
        bounds.push(file.len());
    }
    let (h2, at) = parse(&file, c.tensor).unwrap();
    assert_eq!((h2, at), (h.clone(), header_len));
    let (_, out) = decode(&file, c.tensor).unwrap();
    assert_eq!(out.len(), expect.len());
    for (i, (&v, e)) in out.iter().zip(&expect).enumerate() {
        assert_eq!(
            v.to_bits(),
            e.to_bits(),
            "value {i}: read {v}, the codec gives {e}"
        );
    }
    let other = if c.tensor == Tensor::K {
        Tensor::V
    } else {
        Tensor::K
    };
    assert!(decode(&file, other).is_err());

    // A cut inside the header is refused before the spec is parsed; one inside the body
    // costs a whole header parse (for a plan, its JSON), so long bodies get a sample.
    let len = file.len();
    let cuts: Vec<usize> = if len - header_len <= ALL_CUTS {
        (0..len).collect()
    } else {
        let mut v: Vec<usize> = (0..=header_len).collect();
        for &b in &bounds {
            v.extend([b - 1, b, b + 1]);
        }
        v.extend((0..SPREAD).map(|k| header_len + k * (len - header_len) / SPREAD));
        v.extend(len - 16..len);
        v.retain(|&n| n < len);
        v
    };
    for n in cuts {
        match decode(&file[..n], c.tensor) {
            Err(e) => assert!(is_corrupt(&e), "{e}"),
            Ok(_) => panic!("a file of {len} bytes cut to {n} was read"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    read_as(data, Tensor::K);
    read_as(data, Tensor::V);
    if !data.starts_with(&MAGIC) {
        if let Some(c) = case(data) {
            round_trip(&c);
        }
    }
});
