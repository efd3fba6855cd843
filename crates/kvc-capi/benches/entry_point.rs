//! Cost of crossing the C ABI: the same work called through `kvc_get_api`'s function
//! pointers (what a C program that links or dlopens libkvc does: an indirect call into
//! the boundary, pointer checks, catch_unwind, the thread-local error update) and called
//! directly through the Rust API.
//!
//! `cargo bench -p kvc-capi --bench entry_point`

use std::hint::black_box;
use std::ptr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::f16;
use kvc::convert::{KVC_DTYPE_F16, KVC_DTYPE_F32};
use kvc::{convert_row, kvc_get_api, Row, RowMut, KVC_ABI_VERSION};
use kvc_types::FloatDtype;

fn api() -> &'static kvc::KvcApi {
    let api = kvc_get_api(KVC_ABI_VERSION);
    assert!(!api.is_null());
    // SAFETY: a non-NULL table is static.
    unsafe { &*api }
}

fn trivial(c: &mut Criterion) {
    let api = api();
    let mut g = c.benchmark_group("trivial");
    // A value-returning entry point (value boundary only).
    let dtype_size = black_box(api.dtype_size);
    g.bench_function("c_abi/dtype_size", |b| {
        b.iter(|| dtype_size(black_box(KVC_DTYPE_F32)))
    });
    g.bench_function("rust/dtype_size", |b| {
        b.iter(|| FloatDtype::from_code(black_box(KVC_DTYPE_F32)).map_or(0, FloatDtype::size))
    });
    // A status-returning entry point doing no work: pointer checks, catch_unwind,
    // clearing the thread's last error.
    let convert = black_box(api.convert);
    g.bench_function("c_abi/convert_0_elements", |b| {
        let mut len = 0usize;
        b.iter(|| {
            // SAFETY: zero elements; `len` is a valid output.
            unsafe {
                convert(
                    KVC_DTYPE_F16,
                    black_box(ptr::null()),
                    0,
                    KVC_DTYPE_F32,
                    black_box(ptr::null_mut()),
                    0,
                    &mut len,
                )
            }
        })
    });
    g.bench_function("rust/convert_0_elements", |b| {
        b.iter(|| convert_row(Row::F16(black_box(&[])), RowMut::F32(black_box(&mut []))))
    });
    // The error path: a bad dtype, the message formatted into thread-local storage.
    g.bench_function("c_abi/convert_error", |b| {
        let mut len = 0usize;
        b.iter(|| {
            // SAFETY: rejected before any pointer but `len` is used.
            unsafe {
                convert(
                    black_box(7),
                    ptr::null(),
                    0,
                    KVC_DTYPE_F32,
                    ptr::null_mut(),
                    0,
                    &mut len,
                )
            }
        })
    });
    g.finish();
}

fn four_kib(c: &mut Criterion) {
    let api = api();
    let convert = black_box(api.convert);
    // 4 KiB of fp16 input: 2048 elements, real-looking values.
    let src: Vec<f16> = (0..2048)
        .map(|i| f16::from_f32(((i as f32) * 0.37).sin()))
        .collect();
    let mut dst = vec![0f32; src.len()];
    let mut g = c.benchmark_group("convert_4KiB_f16_to_f32");
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("c_abi", |b| {
        let mut len = 0usize;
        b.iter(|| {
            // SAFETY: `src` holds 2048 fp16, `dst` 2048 f32, disjoint.
            unsafe {
                convert(
                    KVC_DTYPE_F16,
                    black_box(src.as_ptr()).cast(),
                    src.len(),
                    KVC_DTYPE_F32,
                    black_box(dst.as_mut_ptr()).cast(),
                    dst.len(),
                    &mut len,
                )
            }
        })
    });
    g.bench_function("rust", |b| {
        b.iter(|| convert_row(Row::F16(black_box(&src)), RowMut::F32(black_box(&mut dst))))
    });
    g.finish();
}

/// Encoding 4 KiB of fp16 (2048 elements of a real-looking signal) as one gear-v1 blob:
/// through the C API (`kvc_codec_encode` via the table, into a worst-case-sized buffer)
/// and through `kvc-codec`'s `GearV1Encoder::encode_into` with the same options.
fn encode_4kib(c: &mut Criterion) {
    use kvc::codec::{KvcCodec, KvcCodecConfig, KVC_TENSOR_K};
    use kvc_codec::gear_v1::{max_encoded_len, EncodeOptions, GearV1Encoder};
    let api = api();
    let src: Vec<u8> = (0..2048)
        .flat_map(|i| f16::from_f32(((i as f32) * 0.37).sin() * 0.5).to_le_bytes())
        .collect();
    let bound = max_encoded_len(kvc_codec::Dtype::F16, src.len()).unwrap();
    let mut dst = vec![0u8; bound];
    let mut g = c.benchmark_group("encode_4KiB_f16_gear_v1");
    g.throughput(Throughput::Bytes(4096));
    let config = KvcCodecConfig::default();
    let mut codec: *mut KvcCodec = ptr::null_mut();
    // SAFETY: valid config and out pointer.
    let status = unsafe { (api.codec_new)(&config, &mut codec) };
    assert_eq!(status, kvc::KvcStatus::KVC_OK);
    let encode = black_box(api.codec_encode);
    g.bench_function("c_abi", |b| {
        let mut len = 0usize;
        b.iter(|| {
            // SAFETY: live codec; `src`/`dst` valid and disjoint.
            unsafe {
                encode(
                    codec,
                    KVC_TENSOR_K,
                    black_box(src.as_ptr()).cast(),
                    src.len(),
                    black_box(dst.as_mut_ptr()).cast(),
                    dst.len(),
                    &mut len,
                )
            }
        })
    });
    let mut enc = GearV1Encoder::new(EncodeOptions::default()).unwrap();
    g.bench_function("rust", |b| {
        b.iter(|| {
            enc.encode_into(kvc_codec::Dtype::F16, black_box(&src), black_box(&mut dst))
                .unwrap()
        })
    });
    g.finish();
    // SAFETY: freed once.
    unsafe { (api.codec_free)(codec) };
}

criterion_group!(benches, trivial, four_kib, encode_4kib);
criterion_main!(benches);
