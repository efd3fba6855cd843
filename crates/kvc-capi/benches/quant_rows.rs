//! Cost per row of the C8 round trip an engine runs on every K / V row it writes
//! (`kvc_quant_roundtrip_rows`, called through `kvc_get_api` as a C program does), f16
//! rows of 576 channels (9 KV heads x 64) and 192 channels (SmolLM2-135M: 3 x 64), one
//! row per call (decode) and 512 rows per call (prefill); and the Rust kernel
//! (`kvc_int8::roundtrip_rows`) on the same rows for the boundary's share.
//! Throughput is in rows: ns per row = time per iteration / rows.
//!
//! `cargo bench -p kvc-capi --bench quant_rows`

use std::hint::black_box;
use std::ptr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::f16;
use kvc::codec::KVC_TENSOR_K;
use kvc::convert::KVC_DTYPE_F16;
use kvc::quant::{KvcQuant, KvcQuantConfig};
use kvc::{kvc_get_api, KvcStatus, KVC_ABI_VERSION};
use kvc_int8::{roundtrip_rows, ChannelStats};
use kvc_types::Dtype;

fn rows_f16(n: usize, channels: usize) -> Vec<f16> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n * channels)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f16::from_f32(((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0)
        })
        .collect()
}

fn roundtrip(c: &mut Criterion) {
    // SAFETY: a non-NULL table is static.
    let api = unsafe { &*kvc_get_api(KVC_ABI_VERSION) };
    let mut g = c.benchmark_group("quant_roundtrip_rows_f16");
    for channels in [576usize, 192] {
        let calib = rows_f16(256, channels);
        let config = KvcQuantConfig {
            n_layers: 1,
            k_channels: channels,
            v_channels: channels,
            symmetric: 0,
        };
        let mut q: *mut KvcQuant = ptr::null_mut();
        // SAFETY: valid pointers; `calib` holds 256 rows.
        unsafe {
            assert_eq!((api.quant_new)(&config, &mut q), KvcStatus::KVC_OK);
            let st = (api.quant_observe_rows)(
                q,
                0,
                KVC_TENSOR_K,
                KVC_DTYPE_F16,
                calib.as_ptr().cast(),
                256,
            );
            assert_eq!(st, KvcStatus::KVC_OK);
            assert_eq!((api.quant_finish)(q), KvcStatus::KVC_OK);
        }
        let mut stats = ChannelStats::new(channels);
        stats
            .observe_rows(f16_bytes(&calib), Dtype::F16, 256)
            .unwrap();
        let params = stats.finish(false).unwrap();
        let roundtrip_rows_c = black_box(api.quant_roundtrip_rows);
        for rows in [1usize, 512] {
            let mut data = rows_f16(rows, channels);
            g.throughput(Throughput::Elements(rows as u64));
            g.bench_function(format!("c_abi/{channels}ch/{rows}rows"), |b| {
                b.iter(|| {
                    // SAFETY: `data` holds `rows` rows of `channels` f16.
                    let st = unsafe {
                        roundtrip_rows_c(
                            q,
                            0,
                            KVC_TENSOR_K,
                            KVC_DTYPE_F16,
                            data.as_mut_ptr().cast(),
                            black_box(rows),
                        )
                    };
                    assert_eq!(st, KvcStatus::KVC_OK);
                })
            });
            g.bench_function(format!("rust/{channels}ch/{rows}rows"), |b| {
                b.iter(|| {
                    roundtrip_rows(f16_bytes_mut(&mut data), Dtype::F16, rows, &params).unwrap()
                })
            });
        }
        // SAFETY: freed once.
        unsafe { (api.quant_free)(q) };
    }
    g.finish();
}

fn f16_bytes(x: &[f16]) -> &[u8] {
    // SAFETY: f16 is two plain bytes; the length is in bounds.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len() * 2) }
}

fn f16_bytes_mut(x: &mut [f16]) -> &mut [u8] {
    // SAFETY: as above, exclusively borrowed.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len() * 2) }
}

criterion_group!(benches, roundtrip);
criterion_main!(benches);
