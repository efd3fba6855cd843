//! Every tensor of the real KV dump (f16 and bf16, K and V) round-trips bit-exactly, whole
//! layers and 384-token chunks. Looks in `KVC_REALKV_DIR`, then `../shared/data/realkv`
//! beside the checkout, then the embedded `data/sample/`.

use kvc_codec::gear_v1::{
    decode_chunks_parallel, encode_chunks_parallel, EncodeOptions, GearV1Decoder, GearV1Encoder,
};
use kvc_codec::Dtype;

// Shared with the examples, the bench and the gear-v2 round trips; this test uses the data
// directory only.
#[allow(dead_code)]
#[path = "../examples/common/realkv.rs"]
mod realkv;
use realkv::data_dir;

/// `(tensor, dtype, bytes, n_layer, n_tokens, row_bytes)` for every dump in the directory.
fn dumps() -> Vec<(String, Dtype, Vec<u8>, usize, usize)> {
    let dir = data_dir();
    let mut out = Vec::new();
    for tensor in ["K", "V"] {
        for dtype in [Dtype::F16, Dtype::Bf16] {
            let path = dir.join(format!("textA.{tensor}.{dtype}.bin"));
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // Shape from the sidecar without a JSON parser: "shape": [L, T, H, D].
            let json = std::fs::read_to_string(path.with_extension("json")).unwrap();
            let start = json.find("\"shape\"").unwrap();
            let open = start + json[start..].find('[').unwrap();
            let close = open + json[open..].find(']').unwrap();
            let dims: Vec<usize> = json[open + 1..close]
                .split(',')
                .map(|s| s.trim().parse().unwrap())
                .collect();
            assert_eq!(dims.iter().product::<usize>() * 2, bytes.len());
            out.push((tensor.to_string(), dtype, bytes, dims[0], dims[1]));
        }
    }
    out
}

#[test]
fn all_real_kv_round_trips_bit_exact() {
    let dir = data_dir();
    eprintln!("real KV data from {}", dir.display());
    let mut encoder = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    let mut decoder = GearV1Decoder::new().unwrap();
    let mut blob = Vec::new();
    let mut back = Vec::new();
    for (tensor, dtype, bytes, n_layer, n_tokens) in dumps() {
        let layer_bytes = bytes.len() / n_layer;
        let token_bytes = layer_bytes / n_tokens;
        let mut stored = 0usize;
        for layer in bytes.chunks(layer_bytes) {
            // 384-token chunks, in parallel.
            let blobs =
                encode_chunks_parallel(EncodeOptions::default(), dtype, layer, 384 * token_bytes)
                    .unwrap();
            stored += blobs.iter().map(Vec::len).sum::<usize>();
            let mut out = vec![0u8; layer.len()];
            decode_chunks_parallel(dtype, &blobs, &mut out).unwrap();
            assert!(out == layer, "{tensor} {dtype}: chunked round trip differs");
        }
        // Whole first layer through the serial encoder and decoder.
        let layer0 = &bytes[..layer_bytes];
        encoder.encode(dtype, layer0, &mut blob).unwrap();
        decoder.decode(dtype, &blob, &mut back).unwrap();
        assert!(
            back == layer0,
            "{tensor} {dtype}: whole-layer round trip differs"
        );
        let ratio = bytes.len() as f64 / stored as f64;
        eprintln!("{tensor} {dtype}: 384-token chunks ratio {ratio:.3}");
        assert!(ratio > 1.0, "{tensor} {dtype}: gear-v1 expanded real data");
    }
}
