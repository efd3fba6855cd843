//! Fuzz the gear-v1 decoder: any bytes, any dtype. Decoding must return a typed error or
//! an output of exactly `word_count * width` bytes; a decoded output must re-encode to a
//! blob that decodes to the same bytes. Never a panic, never an out-of-bounds access.
#![no_main]

use kvc_codec::gear_v1::{decoded_len, EncodeOptions, GearV1Decoder, GearV1Encoder};
use kvc_codec::Dtype;
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;

thread_local! {
    // Reused across inputs, as an engine would: also exercises scratch-buffer reuse.
    static CODEC: RefCell<(GearV1Encoder, GearV1Decoder)> = RefCell::new((
        GearV1Encoder::new(EncodeOptions::default()).expect("encoder"),
        GearV1Decoder::new().expect("decoder"),
    ));
}

fuzz_target!(|input: &[u8]| {
    let Some((&selector, blob)) = input.split_first() else {
        return;
    };
    let dtype = Dtype::ALL[(selector & 3) as usize];
    CODEC.with(|codec| check(&mut codec.borrow_mut(), dtype, blob));
});

fn check((encoder, decoder): &mut (GearV1Encoder, GearV1Decoder), dtype: Dtype, blob: &[u8]) {
    let len = decoded_len(dtype, blob);
    match decoder.decode_to_vec(dtype, blob) {
        Ok(out) => {
            assert_eq!(len.ok(), Some(out.len()));
            let word_count = u32::from_le_bytes(blob[..4].try_into().unwrap()) as usize;
            assert_eq!(out.len(), word_count * dtype.size());
            // decode_into with a buffer one byte short must fail cleanly.
            if !out.is_empty() {
                let mut short = vec![0u8; out.len() - 1];
                assert!(decoder.decode_into(dtype, blob, &mut short).is_err());
            }
            // Re-encode small outputs (zstd frames can expand 4 KiB into megabytes).
            if out.len() <= 64 * 1024 {
                let again = encoder.encode_to_vec(dtype, &out).expect("re-encode");
                assert_eq!(decoder.decode_to_vec(dtype, &again).expect("re-decode"), out);
            }
        }
        // Payload errors show only when decoding; structural ones make decoded_len fail
        // too (checked above: a successful decode has a matching decoded_len).
        Err(_) => {}
    }
}
