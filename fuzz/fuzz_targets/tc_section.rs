//! Fuzz the transform coder's section decoder (`TransformCodec::decode_section`, what a
//! tc chunk's restore runs per layer and tensor) with the fixed calibration
//! (`golden::fixed_calibration(2, 2, 64, 2)`, loaded from its file bytes as a restoring
//! process does): any bytes give an error or exactly `n` rows whose hash is the one the
//! section records and that a second decode repeats bit for bit; never a panic.
//!
//! Input: a selector byte (bits 0-1: dtype f16 / bf16 / f32; bit 2: V; bit 3: layer 1;
//! bit 4: target tc-0.01 instead of tc-0.05), a token count byte (`n = byte % 16`), 4 bytes
//! LE of the first position (so positions in the sink, after it and past 2^20), then the
//! section. Seeds: with `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call writes sections
//! the encoder made of pseudo-random rows (every dtype, K and V, sink and not) there;
//! scripts/fuzz-all.sh does this.
#![no_main]

use std::sync::OnceLock;

use kvc_transform_coder::golden::fixed_calibration;
use kvc_transform_coder::TransformCodec;
use kvc_types::{Dtype, Tensor};
use libfuzzer_sys::fuzz_target;

const H: usize = 2;
const D: usize = 64;

fn codecs() -> &'static [TransformCodec; 2] {
    static C: OnceLock<[TransformCodec; 2]> = OnceLock::new();
    C.get_or_init(|| {
        let file = fixed_calibration(2, H, D, 2).to_bytes().unwrap();
        [
            TransformCodec::from_file(&file, "tc-0.05").unwrap(),
            TransformCodec::from_file(&file, "tc-0.01").unwrap(),
        ]
    })
}

struct Call {
    codec: &'static TransformCodec,
    dtype: Dtype,
    tensor: Tensor,
    layer: usize,
    n: usize,
    pos0: u64,
}

fn call(data: &[u8]) -> Option<(Call, &[u8])> {
    if data.len() < 6 {
        return None;
    }
    let s = data[0];
    let dtype = [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::F16][usize::from(s & 3)];
    let c = Call {
        codec: &codecs()[usize::from(s >> 4 & 1)],
        dtype,
        tensor: if s & 4 != 0 { Tensor::V } else { Tensor::K },
        layer: usize::from(s >> 3 & 1),
        n: usize::from(data[1] % 16),
        pos0: u64::from(u32::from_le_bytes(data[2..6].try_into().unwrap())),
    };
    Some((c, &data[6..]))
}

fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for (i, (s, n, pos0)) in [
        (0u8, 6u8, 0u32),
        (1, 4, 1),
        (2, 3, 256),
        (4, 8, 300),
        (0x0d, 5, 1 << 21),
        (0x16, 2, 0),
        (0x19, 15, 77),
    ]
    .into_iter()
    .enumerate()
    {
        let mut head = vec![s, n];
        head.extend_from_slice(&pos0.to_le_bytes());
        let (c, _) = call(&head).unwrap();
        let mut raw = Vec::new();
        for j in 0..c.n * H * D {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0 + (j % D) as f32 * 0.02;
            match c.dtype {
                Dtype::Bf16 => raw.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                Dtype::F32 => raw.extend_from_slice(&v.to_le_bytes()),
                _ => raw.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            }
        }
        let mut blob = head;
        c.codec
            .encode_section(c.layer, c.tensor, c.dtype, c.pos0, c.n, &raw, &mut blob)
            .unwrap();
        std::fs::write(dir.join(format!("sample-{i}")), blob).unwrap();
    }
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: std::sync::Once = std::sync::Once::new();
    SEEDS.call_once(|| {
        if let Some(dir) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&dir));
        }
    });
    let Some((c, blob)) = call(data) else {
        return;
    };
    let len = c.n * H * D * c.dtype.size();
    let mut out = vec![0u8; len];
    let r = c
        .codec
        .decode_section(c.layer, c.tensor, c.dtype, c.pos0, c.n, blob, &mut out);
    if r.is_ok() {
        assert_eq!(blob[..16], blake3::hash(&out).as_bytes()[..16]);
        let mut again = vec![0u8; len];
        c.codec
            .decode_section(c.layer, c.tensor, c.dtype, c.pos0, c.n, blob, &mut again)
            .expect("a second decode of the same bytes");
        assert!(again == out, "two decodes differ");
    }
});
