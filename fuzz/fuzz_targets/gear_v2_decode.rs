//! Fuzz gear-v2 decoding: any input must give a typed error or a tensor of the size the
//! header promises, never a panic, an out-of-bounds access or an unbounded allocation.
#![no_main]

use kvc_codec::gear_v2::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dec = Decoder::new();
    let Ok(open) = dec.open(data) else { return };
    let total = open.header().decoded_len();
    // The chunk index check bounds the output by the input (every value costs >= 1 bit).
    assert!(total <= data.len() * 8 * 4);
    let mut out = vec![0u8; total];
    let whole = open.decode_into(&mut out).is_ok();
    let mut par = vec![0u8; total];
    let parallel = open.decode_into_parallel(&mut par);
    assert_eq!(whole, parallel.is_ok());
    if whole {
        assert_eq!(out, par);
    }
});
