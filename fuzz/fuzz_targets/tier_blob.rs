//! Fuzz the kv-chunk blob reader (docs/formats/kv-chunk.md) the way the restore path meets
//! a blob: planted in a tier under a chunk's key, then `Tiers::restore`, which validates
//! it (header, length, BLAKE3, fingerprint, key, codec, shape, section table) and decodes
//! its sections; `kvc_store_tiers::verify` (what the disk and Redis tiers vet values with)
//! runs on it too. Any bytes give a miss or the chunk, never a panic, an out-of-bounds
//! access or an allocation the blob's length does not justify.
//!
//! Input: one selector byte, then the blob. The selector's low bits pick the codec of the
//! `Tiers` (every codec id: raw, gear-v1, gear-v2, the three kvq presets and tc with the
//! golden files' fixed calibration; 2 layers, 3 KV heads of 64, f16, chunks of 4 tokens);
//! with bit 7 set the target first writes the expected key, fingerprint, payload length
//! and checksum into the blob (when it is long enough), so that mutations reach the
//! section table and the codecs behind the checksum.
//!
//! Seeds: with `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call writes the blobs of the
//! embedded sample's first chunk (data/sample, one per codec, with and without bit 7)
//! there; scripts/fuzz-all.sh does this.
#![no_main]

use std::sync::{Arc, OnceLock};

use kvc_types::Dtype;
use kvc_store_tiers::blob::{CHECKSUM_LEN, HEADER_LEN};
use kvc_store_tiers::{
    verify, ChunkCodec, ChunkKey, ChunkShape, MemoryTier, Tier, Tiers, TiersConfig,
};
use kvc_transform_coder::golden::fixed_calibration;
use kvc_transform_coder::TransformCodec;
use libfuzzer_sys::fuzz_target;

const SHAPE: ChunkShape = ChunkShape {
    n_layer: 2,
    n_kv_head: 3,
    head_dim: 64,
    dtype: Dtype::F16,
    chunk_tokens: 4,
};
const TOKENS: [u32; 4] = [17, 4242, 9, 31337];
/// The embedded sample: `[4][512][3][64]` f16.
const SAMPLE_K: &[u8] = include_bytes!("../../data/sample/textA.K.f16.bin");
const SAMPLE_V: &[u8] = include_bytes!("../../data/sample/textA.V.f16.bin");
const SAMPLE_TOKENS: usize = 512;

struct Front {
    mem: Arc<MemoryTier>,
    tiers: Tiers,
    key: ChunkKey,
}

fn fronts() -> &'static [Front] {
    static F: OnceLock<Vec<Front>> = OnceLock::new();
    F.get_or_init(|| {
        ChunkCodec::ALL
            .into_iter()
            .map(|codec| {
                let mem = Arc::new(MemoryTier::new(64 << 20));
                let cfg = TiersConfig {
                    shape: SHAPE,
                    codec,
                    model_hash: [0x5a; 32],
                };
                let tiers = match codec {
                    // tc codes with the fixed calibration of the golden files (exact
                    // arithmetic: the same on every host), sink of 2 tokens
                    ChunkCodec::Transform => {
                        let cal =
                            fixed_calibration(SHAPE.n_layer, SHAPE.n_kv_head, SHAPE.head_dim, 2);
                        let tc =
                            TransformCodec::from_file(&cal.to_bytes().unwrap(), "tc-0.05").unwrap();
                        Tiers::with_transform(cfg, Arc::new(tc), vec![Box::new(mem.clone())])
                    }
                    _ => Tiers::new(cfg, vec![Box::new(mem.clone())]),
                }
                .unwrap();
                let key = tiers.keys(&TOKENS)[0];
                Front { mem, tiers, key }
            })
            .collect()
    })
}

/// The first chunk of the sample's first two layers, layer-major, as `Tiers::store` takes.
fn sample(src: &[u8]) -> Vec<u8> {
    let row = SHAPE.row_bytes();
    let mut out = Vec::new();
    for l in 0..SHAPE.n_layer {
        let base = l * SAMPLE_TOKENS * row;
        out.extend_from_slice(&src[base..base + SHAPE.chunk_tokens * row]);
    }
    out
}

fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let (k, v) = (sample(SAMPLE_K), sample(SAMPLE_V));
    for (i, f) in fronts().iter().enumerate() {
        f.tiers.store(&TOKENS, &k, &v, SHAPE.chunk_tokens).unwrap();
        let blob = f.mem.get(&[f.key]).unwrap()[0].clone().unwrap();
        f.mem.remove(&f.key).unwrap();
        for sel in [i as u8, 0x80 | i as u8] {
            let mut s = vec![sel];
            s.extend_from_slice(&blob);
            std::fs::write(dir.join(format!("sample-{sel:02x}")), s).unwrap();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: OnceLock<()> = OnceLock::new();
    SEEDS.get_or_init(|| {
        if let Some(d) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&d));
        }
    });
    let Some((&sel, blob)) = data.split_first() else {
        return;
    };
    let f = &fronts()[(sel & 0x7f) as usize % fronts().len()];
    let mut blob = blob.to_vec();
    if sel & 0x80 != 0 && blob.len() >= HEADER_LEN + CHECKSUM_LEN {
        blob[32..64].copy_from_slice(&f.key.0);
        blob[64..96].copy_from_slice(&f.tiers.fingerprint().0);
        let payload = (blob.len() - HEADER_LEN - CHECKSUM_LEN) as u64;
        blob[96..104].copy_from_slice(&payload.to_le_bytes());
        let body = blob.len() - CHECKSUM_LEN;
        let sum = *blake3::hash(&blob[..body]).as_bytes();
        blob[body..].copy_from_slice(&sum);
    }
    let verified = verify(&blob);
    f.mem.put(&[(f.key, Arc::new(blob))]).unwrap();
    let r = f.tiers.restore(&TOKENS);
    let sec = SHAPE.section_bytes();
    if r.tokens == 0 {
        assert!(r.k.is_empty() && r.v.is_empty());
    } else {
        assert_eq!(r.tokens, SHAPE.chunk_tokens);
        assert_eq!(r.k.len(), SHAPE.n_layer * sec);
        assert_eq!(r.v.len(), SHAPE.n_layer * sec);
        assert!(verified.is_ok(), "restored a blob verify refuses");
    }
    // A refused blob was removed by the restore; a good one is removed here.
    let _ = f.mem.remove(&f.key);
});
