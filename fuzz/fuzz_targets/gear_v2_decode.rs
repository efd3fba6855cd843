//! Fuzz gear-v2 decoding: any input must give a typed error or a tensor of the size the
//! header promises, never a panic, an out-of-bounds access or an unbounded allocation.
#![no_main]

use kvc_codec::gear_v2::Decoder;
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;

thread_local! {
    // One reusable decoder, as engines hold one: also exercises state left by bad inputs.
    static DEC: RefCell<(Decoder, Vec<u8>)> = RefCell::new((Decoder::new(), Vec::new()));
}

fuzz_target!(|data: &[u8]| {
    DEC.with(|d| {
        let (dec, out) = &mut *d.borrow_mut();
        let Ok(open) = dec.open(data) else { return };
        let total = open.header().decoded_len();
        // The chunk index check bounds the output by the input: every value costs >= 1 bit,
        // or (version 2, repeated tokens) every token >= 2 bytes.
        let h = open.header();
        let row = h.channels as usize * h.dtype.size();
        assert!(total <= data.len() * (8 * 4).max(row / 2));
        out.resize(total, 0);
        let whole = open.decode_into(out).map(|n| n == total);
        // Chunk by chunk must agree with the whole decode.
        if whole.is_ok() {
            let mut at = 0;
            let mut buf = vec![0u8; if open.chunk_count() > 0 { open.chunk_len(0) } else { 0 }];
            for i in 0..open.chunk_count() {
                let n = open.chunk_len(i);
                open.decode_chunk_into(i, &mut buf).unwrap();
                assert_eq!(&buf[..n], &out[at..at + n]);
                at += n;
            }
        }
    });
});
