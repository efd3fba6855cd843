//! Quick one-core speed and ratio check of gear-v2 on the real KV data (no criterion):
//! `KVC_REALKV_DIR=/path cargo run --release -p kvc-codec --example gear_v2_speed [reps]`.
//! Prints the ratio (whole blobs, headers included) and the best-of-`reps` MB/s (10^6 bytes
//! of uncompressed data per second of this thread's CPU time) of compress and decompress,
//! one blob per layer tensor. Each timed repetition runs [`PASSES`] passes over the data
//! (about 0.1 s): the thread's CPU time is only updated at scheduler ticks, so shorter
//! intervals would be quantised.
//!
//! Environment: `KVC_CODER=grouped` (else the default coder), `KVC_CHUNK_TOKENS=N`,
//! `KVC_BLOB_TOKENS=N` to encode every N tokens of a layer as a blob of their own (as the
//! store and `kvc bench` do) instead of one blob per layer, and
//! `KVC_DUMP_BLOBS=DIR` to write every blob (`DIR/K.f16.<layer>.kvg2`, ...) so that two
//! encoder versions can be compared byte for byte.

use kvc_codec::gear_v2::{Coder, Decoder, EncodeParams, Encoder};
use kvc_codec::Dtype;
#[path = "common/realkv.rs"]
mod realkv;
use realkv::{data_dir, sidecar_shape, tensor_kind, Clock};

/// Passes over the whole data per timed repetition.
const PASSES: usize = 16;

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    // "enc" or "dec" times only that direction (handy under `perf stat`).
    let only = std::env::args().nth(2).unwrap_or_default();
    let dir = data_dir();
    println!("data: {}", dir.display());
    for name in [
        "K.f16", "V.f16", "K.bf16", "V.bf16", "K.f32", "V.f32", "K.i8", "V.i8",
    ] {
        let Ok(data) = std::fs::read(dir.join(format!("textA.{name}.bin"))) else {
            continue;
        };
        let (tokens, channels) = sidecar_shape(&dir.join(format!("textA.{name}.json")));
        let dtype: Dtype = name[2..].parse().expect("a dtype name");
        let layer_bytes = tokens * channels * dtype.size();
        let blob_bytes = std::env::var("KVC_BLOB_TOKENS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(layer_bytes, |t| t * channels * dtype.size());
        let layers: Vec<&[u8]> = data
            .chunks(layer_bytes)
            .flat_map(|l| l.chunks(blob_bytes))
            .collect();
        let mut params = EncodeParams::new(dtype, channels as u32);
        if let Some(ct) = std::env::var("KVC_CHUNK_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            params.chunk_tokens = ct;
        }
        params.kind = tensor_kind(name);
        // KVC_CODER=grouped times the first gear-v2 coder (for comparisons); default: the
        // default coder (Auto: shared-shape on these float dumps).
        let coder = match std::env::var("KVC_CODER").as_deref() {
            Ok("grouped") => Coder::Grouped,
            _ => Coder::Auto,
        };
        let mut enc = Encoder::with_coder(coder);
        let mut dec = Decoder::new();
        let blobs: Vec<Vec<u8>> = layers
            .iter()
            .map(|l| enc.encode(&params, l).unwrap())
            .collect();
        let stored: usize = blobs.iter().map(Vec::len).sum();
        if let Ok(dir) = std::env::var("KVC_DUMP_BLOBS") {
            for (l, b) in blobs.iter().enumerate() {
                std::fs::write(format!("{dir}/{name}.{l}.kvg2"), b).unwrap();
            }
        }
        let mut buf = vec![0u8; layer_bytes.min(blob_bytes)];
        for (l, b) in layers.iter().zip(&blobs) {
            let n = dec.decode_into(b, &mut buf).unwrap();
            assert_eq!(&buf[..n], *l);
        }
        let mut out = Vec::new();
        let (mut ce, mut cd) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..reps {
            if only != "dec" {
                let t = Clock::start();
                for _ in 0..PASSES {
                    for l in &layers {
                        enc.encode_into(&params, l, &mut out).unwrap();
                    }
                }
                ce = ce.min(t.secs() / PASSES as f64);
            }
            if only != "enc" {
                let t = Clock::start();
                for _ in 0..PASSES {
                    for b in &blobs {
                        dec.decode_into(b, &mut buf).unwrap();
                    }
                }
                cd = cd.min(t.secs() / PASSES as f64);
            }
        }
        let mb = data.len() as f64 / 1e6;
        println!(
            "{name}: {} blobs, ratio {:.4}, compress {:.0} MB/s, decompress {:.0} MB/s",
            layers.len(),
            data.len() as f64 / stored as f64,
            mb / ce,
            mb / cd
        );
    }
}
