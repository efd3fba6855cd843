//! How fast the fastest Huffman decoder we know runs on this machine, on the same symbols
//! gear-v2 codes, next to gear-v2 itself, in one run:
//! `KVC_REALKV_DIR=/path cargo run --release -p kvc-codec --example huff0_ceiling [reps]`.
//!
//! The reference is zstd's huff0 (`HUF_compress4X_repeat` / `HUF_decompress4X_hufOnly_wksp`,
//! four interleaved streams, two-symbol tables and hand-written x86-64 assembly in its
//! decoder), linked from the zstd that `zstd-sys` builds. It codes the top fields (the high
//! bytes) of each f16 layer tensor channel-major in 128 KiB blocks, one table per block,
//! order 0. That is a weaker model than gear-v2's (per-channel clusters, sign
//! context) but the cheapest decode a static Huffman code gets. gear-v2 is timed on the same
//! tensors, one blob per layer, and both are reported as millions of top fields (values) per
//! second of this thread's CPU time, best of `reps`: the rate at which the entropy-coded part
//! of a value comes out, before any low byte is written. 3 GB/s of f16 is 1,500 M values/s.
//!
//! These `HUF_*` functions are zstd's internal API (`lib/common/huf.h`), not part of its
//! stable interface: the declarations below are those of zstd 1.5.7, the version Cargo.lock
//! pins (`zstd-sys 2.1.2+zstd.1.5.7`). Check them against `huf.h` before moving that pin.

#[path = "common/realkv.rs"]
mod realkv;

use kvc_codec::gear_v2::{Decoder, EncodeParams, Encoder};
use kvc_codec::Dtype;
use realkv::{data_dir, sidecar_shape, tensor_kind, Clock};
use std::os::raw::{c_int, c_uint, c_void};

extern "C" {
    fn HUF_compress4X_repeat(
        dst: *mut c_void,
        dst_size: usize,
        src: *const c_void,
        src_size: usize,
        max_symbol_value: c_uint,
        table_log: c_uint,
        work_space: *mut c_void,
        wksp_size: usize,
        huf_table: *mut usize,
        repeat: *mut c_int,
        flags: c_int,
    ) -> usize;
    fn HUF_decompress4X_hufOnly_wksp(
        dtable: *mut u32,
        dst: *mut c_void,
        dst_size: usize,
        c_src: *const c_void,
        c_src_size: usize,
        work_space: *mut c_void,
        wksp_size: usize,
        flags: c_int,
    ) -> usize;
}

/// `HUF_BLOCKSIZE_MAX`: the most symbols one huff0 call codes.
const BLOCK: usize = 128 * 1024;
/// `HUF_repeat_none`: build a new table for every block.
const REPEAT_NONE: c_int = 0;
/// `HUF_flags_bmi2` and `HUF_flags_optimalDepth`.
const FLAG_BMI2: c_int = 1;
const FLAG_OPTIMAL_DEPTH: c_int = 2;
/// Table log of the decode table (`HUF_TABLELOG_MAX`), and of the codes (gear-v2's limit).
const DTABLE_LOG: u32 = 12;
const CODE_LOG: c_uint = 11;
/// Passes over the whole tensor per timed repetition.
const PASSES: usize = 4;

/// One tensor's top fields in huff0 blocks.
struct Huff0 {
    /// (start, len) of each block in the symbols, and (offset, len) in `packed`.
    blocks: Vec<(usize, usize, usize, usize)>,
    /// The coded blocks back to back (`used` bytes of it; the rest is room).
    packed: Vec<u8>,
    used: usize,
    flags: c_int,
    work: Vec<u64>,
    dtable: Vec<u32>,
}

impl Huff0 {
    fn compress(symbols: &[u8]) -> Self {
        let mut coded = Huff0 {
            blocks: Vec::new(),
            packed: Vec::new(),
            used: 0,
            flags: 0,
            work: vec![0u64; 1 << 13],
            dtable: vec![0u32; 1 + (1 << DTABLE_LOG)],
        };
        coded.recompress(symbols);
        coded
    }

    /// Codes `symbols` into this value's buffers (no allocation once they are large enough).
    fn recompress(&mut self, symbols: &[u8]) {
        let flags = if std::arch::is_x86_feature_detected!("bmi2") {
            FLAG_BMI2
        } else {
            0
        };
        self.flags = flags;
        let room = symbols.len() + symbols.len() / 8 + 4096;
        if self.packed.len() < room {
            self.packed.resize(room, 0);
        }
        self.blocks.clear();
        let mut table = [0usize; 257];
        let mut at = 0;
        for (i, block) in symbols.chunks(BLOCK).enumerate() {
            let mut repeat = REPEAT_NONE;
            // SAFETY: every pointer is valid for the size passed with it (`packed` has
            // room for the block plus huff0's bound, the workspace is 64 KiB of u64s, the
            // table the `HUF_CTABLE_SIZE_ST(255)` size_t's huf.h asks for).
            let n = unsafe {
                HUF_compress4X_repeat(
                    self.packed[at..].as_mut_ptr().cast(),
                    self.packed.len() - at,
                    block.as_ptr().cast(),
                    block.len(),
                    255,
                    CODE_LOG,
                    self.work.as_mut_ptr().cast(),
                    self.work.len() * 8,
                    table.as_mut_ptr(),
                    &mut repeat,
                    flags | FLAG_OPTIMAL_DEPTH,
                )
            };
            // SAFETY: a pure function of its argument.
            assert!(unsafe { zstd_sys::ZSTD_isError(n) } == 0, "huff0 compress");
            assert!(n > 1, "block {i} not Huffman-coded (RLE or incompressible)");
            self.blocks.push((i * BLOCK, block.len(), at, n));
            at += n;
        }
        self.used = at;
    }

    fn decompress(&mut self, out: &mut [u8]) {
        for &(start, len, at, n) in &self.blocks {
            self.dtable[0] = DTABLE_LOG * 0x0100_0001;
            let dst = &mut out[start..start + len];
            // SAFETY: `dtable` is a `HUF_CREATE_STATIC_DTABLEX2(.., 12)` table (its first
            // word says so), `dst` holds exactly the block's symbols, the source is the
            // block's bytes and the workspace 64 KiB.
            let r = unsafe {
                HUF_decompress4X_hufOnly_wksp(
                    self.dtable.as_mut_ptr(),
                    dst.as_mut_ptr().cast(),
                    len,
                    self.packed[at..at + n].as_ptr().cast(),
                    n,
                    self.work.as_mut_ptr().cast(),
                    self.work.len() * 8,
                    self.flags,
                )
            };
            // SAFETY: a pure function of its argument.
            let failed = unsafe { zstd_sys::ZSTD_isError(r) } != 0;
            assert!(!failed && r == len, "huff0 decode");
        }
    }
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let dir = data_dir();
    println!("data: {}", dir.display());
    println!(
        "{:<6} {:>6} | {:>14} {:>12} {:>12} | {:>14} {:>12} {:>12}",
        "tensor",
        "layers",
        "huff0 bits/top",
        "enc Mval/s",
        "dec Mval/s",
        "gear bits/top",
        "enc Mval/s",
        "dec Mval/s"
    );
    for name in ["K.f16", "V.f16"] {
        let Ok(data) = std::fs::read(dir.join(format!("textA.{name}.bin"))) else {
            continue;
        };
        let (tokens, channels) = sidecar_shape(&dir.join(format!("textA.{name}.json")));
        let (dtype, width) = (Dtype::F16, 2);
        let values = tokens * channels;
        let layers: Vec<&[u8]> = data.chunks_exact(values * width).collect();
        // Top fields (the high bytes) channel-major.
        let tops: Vec<Vec<u8>> = layers
            .iter()
            .map(|l| {
                let mut t = vec![0u8; values];
                for (i, row) in l.chunks_exact(channels * 2).enumerate() {
                    for c in 0..channels {
                        t[c * tokens + i] = row[c * 2 + 1];
                    }
                }
                t
            })
            .collect();
        let mut coded: Vec<Huff0> = tops.iter().map(|t| Huff0::compress(t)).collect();
        let huff_bytes: usize = coded.iter().map(|h| h.used).sum();
        let mut out = vec![0u8; values];
        for (h, t) in coded.iter_mut().zip(&tops) {
            h.decompress(&mut out);
            assert_eq!(&out, t, "huff0 round trip");
        }

        let mut params = EncodeParams::new(dtype, channels as u32);
        params.kind = tensor_kind(name);
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        let blobs: Vec<Vec<u8>> = layers
            .iter()
            .map(|l| enc.encode(&params, l).expect("gear-v2 encode"))
            .collect();
        // The low bytes are stored raw: what is left is the coded top fields, the model,
        // the headers.
        let gear_bytes: usize =
            blobs.iter().map(Vec::len).sum::<usize>() - layers.len() * values * (width - 1);
        let mut buf = vec![0u8; values * width];
        let mut packed = Vec::new();
        let mut scratch = Huff0::compress(&tops[0]);
        let (mut he, mut hd, mut ge, mut gd) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..reps {
            let t = Clock::start();
            for _ in 0..PASSES {
                for top in &tops {
                    scratch.recompress(top);
                    std::hint::black_box(&scratch.packed[..scratch.used]);
                }
            }
            he = he.min(t.secs());
            let t = Clock::start();
            for _ in 0..PASSES {
                for h in coded.iter_mut() {
                    h.decompress(&mut out);
                }
            }
            hd = hd.min(t.secs());
            let t = Clock::start();
            for _ in 0..PASSES {
                for l in &layers {
                    enc.encode_into(&params, l, &mut packed)
                        .expect("gear-v2 encode");
                }
            }
            ge = ge.min(t.secs());
            let t = Clock::start();
            for _ in 0..PASSES {
                for b in &blobs {
                    dec.decode_into(b, &mut buf).expect("gear-v2 decode");
                }
            }
            gd = gd.min(t.secs());
        }
        let all = (values * layers.len()) as f64;
        let rate = |secs: f64| all * PASSES as f64 / secs / 1e6;
        println!(
            "{:<6} {:>6} | {:>14.3} {:>12.0} {:>12.0} | {:>14.3} {:>12.0} {:>12.0}",
            name,
            layers.len(),
            huff_bytes as f64 * 8.0 / all,
            rate(he),
            rate(hd),
            gear_bytes as f64 * 8.0 / all,
            rate(ge),
            rate(gd)
        );
    }
    println!("(3 GB/s of f16 is 1500 M values/s, 1.5 GB/s 750 M values/s)");
}
