//! Round trips on random and adversarial inputs, buffer-size contracts, reuse.

use kvc_codec::gear_v1::{
    decode_chunks_parallel, decoded_len, encode_chunks_parallel, max_encoded_len, EncodeOptions,
    GearV1Decoder, GearV1Encoder, Predictor, PredictorSet,
};
use kvc_codec::{Dtype, Error, ErrorKind};
use proptest::prelude::*;

fn all_sets() -> Vec<PredictorSet> {
    (1u8..8)
        .map(|bits| {
            let ps: Vec<Predictor> = Predictor::ALL
                .into_iter()
                .filter(|p| bits & (1 << p.mode()) != 0)
                .collect();
            PredictorSet::new(&ps).unwrap()
        })
        .collect()
}

fn round_trip(dtype: Dtype, data: &[u8], predictors: PredictorSet) -> Vec<u8> {
    let mut e = GearV1Encoder::new(EncodeOptions {
        predictors,
        zstd_level: 3,
    })
    .unwrap();
    let blob = e.encode_to_vec(dtype, data).unwrap();
    assert!(blob.len() <= max_encoded_len(dtype, data.len()).unwrap());
    assert_eq!(decoded_len(dtype, &blob).unwrap(), data.len());
    let mut d = GearV1Decoder::new().unwrap();
    assert_eq!(d.decode_to_vec(dtype, &blob).unwrap(), data);
    blob
}

fn xorshift(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

#[test]
fn adversarial_inputs_all_dtypes_all_predictor_sets() {
    let n = 4 * 3 * 5 * 7; // a multiple of every width, odd element counts for some
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0; n],
        vec![0xff; n],
        (0..n)
            .map(|i| if i % 2 == 0 { 0x55 } else { 0xaa })
            .collect(),
        (0..n).map(|i| i as u8).collect(),
        (0..n).map(|i| (i / 131) as u8).collect(),
        (0..n).map(|i| (i / 132) as u8).collect(),
        xorshift(7, n),
        xorshift(8, 4 * 1000 + 4),
    ];
    for dtype in Dtype::ALL {
        for set in all_sets() {
            for case in &cases {
                let len = case.len() / dtype.size() * dtype.size();
                round_trip(dtype, &case[..len], set);
            }
            // One element, and an odd number of elements.
            round_trip(dtype, &xorshift(3, dtype.size()), set);
            round_trip(dtype, &xorshift(4, dtype.size() * 333), set);
        }
    }
}

#[test]
fn misaligned_input_is_an_error() {
    let mut e = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    for (dtype, len) in [(Dtype::F16, 1), (Dtype::Bf16, 3), (Dtype::F32, 6)] {
        let err = e.encode_to_vec(dtype, &vec![0; len]).unwrap_err();
        assert_eq!(err, Error::InputNotWholeElements { dtype, len });
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(max_encoded_len(dtype, len).is_err());
    }
}

#[test]
fn bad_zstd_level_is_an_error() {
    let err = GearV1Encoder::new(EncodeOptions {
        predictors: PredictorSet::ALL,
        zstd_level: 1000,
    })
    .err()
    .unwrap();
    assert!(matches!(
        err,
        Error::ZstdLevelOutOfRange { level: 1000, .. }
    ));
}

#[test]
fn encode_into_and_decode_into_respect_buffer_sizes() {
    let data = xorshift(11, 2 * 500);
    let mut e = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    let blob = e.encode_to_vec(Dtype::F16, &data).unwrap();

    // Exactly the blob's size works, one less fails with a typed error.
    let mut out = vec![0u8; blob.len()];
    assert_eq!(
        e.encode_into(Dtype::F16, &data, &mut out).unwrap(),
        blob.len()
    );
    assert_eq!(out, blob);
    let mut short = vec![0u8; blob.len() - 1];
    let err = e.encode_into(Dtype::F16, &data, &mut short).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BufferTooSmall);
    for len in [0, 3, 4, 13, 14] {
        let mut tiny = vec![0u8; len];
        assert!(matches!(
            e.encode_into(Dtype::F16, &data, &mut tiny),
            Err(Error::OutputTooSmall { .. })
        ));
    }

    let mut d = GearV1Decoder::new().unwrap();
    let mut back = vec![0u8; data.len() + 7];
    assert_eq!(
        d.decode_into(Dtype::F16, &blob, &mut back).unwrap(),
        data.len()
    );
    assert_eq!(&back[..data.len()], &data[..]);
    let mut small = vec![0u8; data.len() - 1];
    assert_eq!(
        d.decode_into(Dtype::F16, &blob, &mut small).unwrap_err(),
        Error::OutputTooSmall {
            needed: data.len(),
            available: data.len() - 1
        }
    );
}

#[test]
fn reused_encoder_and_decoder_give_identical_results() {
    let mut e = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    let mut d = GearV1Decoder::new().unwrap();
    let inputs = [xorshift(1, 4000), vec![9; 10], xorshift(2, 4000), vec![]];
    let mut fresh = Vec::new();
    for data in &inputs {
        let mut e2 = GearV1Encoder::new(EncodeOptions::default()).unwrap();
        fresh.push(e2.encode_to_vec(Dtype::Bf16, data).unwrap());
    }
    for _ in 0..2 {
        let mut blob = Vec::new();
        let mut back = Vec::new();
        for (data, want) in inputs.iter().zip(&fresh) {
            e.encode(Dtype::Bf16, data, &mut blob).unwrap();
            assert_eq!(&blob, want);
            d.decode(Dtype::Bf16, &blob, &mut back).unwrap();
            assert_eq!(&back, data);
        }
    }
}

#[test]
fn parallel_chunks_match_serial_encoding() {
    let data = xorshift(5, 2 * 3000 + 2);
    let chunk = 2 * 384;
    let blobs = encode_chunks_parallel(EncodeOptions::default(), Dtype::F16, &data, chunk).unwrap();
    assert_eq!(blobs.len(), data.len().div_ceil(chunk));
    let mut e = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    for (blob, part) in blobs.iter().zip(data.chunks(chunk)) {
        assert_eq!(blob, &e.encode_to_vec(Dtype::F16, part).unwrap());
    }
    let mut out = vec![0u8; data.len()];
    decode_chunks_parallel(Dtype::F16, &blobs, &mut out).unwrap();
    assert_eq!(out, data);

    let mut wrong = vec![0u8; data.len() + 2];
    assert!(matches!(
        decode_chunks_parallel(Dtype::F16, &blobs, &mut wrong),
        Err(Error::ChunkSizesMismatch { .. })
    ));
    for bad in [0, 3] {
        assert!(matches!(
            encode_chunks_parallel(EncodeOptions::default(), Dtype::F16, &data, bad),
            Err(Error::InvalidChunkSize { .. })
        ));
    }
    let mut corrupt = blobs.clone();
    let n = corrupt[2].len();
    corrupt[2].truncate(n - 1);
    assert!(decode_chunks_parallel(Dtype::F16, &corrupt, &mut out).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_round_trips(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
        dtype_i in 0usize..4,
        set_i in 0usize..7,
    ) {
        let dtype = Dtype::ALL[dtype_i];
        let len = data.len() / dtype.size() * dtype.size();
        round_trip(dtype, &data[..len], all_sets()[set_i]);
    }

    #[test]
    fn runny_round_trips(
        runs in proptest::collection::vec((any::<u8>(), 1usize..300), 0..40),
    ) {
        let data: Vec<u8> = runs.iter().flat_map(|&(b, n)| std::iter::repeat_n(b, n)).collect();
        round_trip(Dtype::I8, &data, PredictorSet::ALL);
        let len = data.len() / 2 * 2;
        round_trip(Dtype::F16, &data[..len], PredictorSet::ALL);
    }
}
