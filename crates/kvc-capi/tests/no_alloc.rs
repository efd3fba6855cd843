//! The per-token quantizer entry points allocate nothing: `kvc_quant_roundtrip_rows`,
//! `_quantize_rows` and `_dequantize_rows` run under a global allocator that counts this
//! thread's allocations, for every float dtype and row widths below, at and across the
//! kernels' block size.

use std::ptr;

use kvc::codec::{KVC_TENSOR_K, KVC_TENSOR_V};
use kvc::convert::{KVC_DTYPE_BF16, KVC_DTYPE_F16, KVC_DTYPE_F32};
use kvc::quant::{
    kvc_quant_dequantize_rows, kvc_quant_finish, kvc_quant_free, kvc_quant_new,
    kvc_quant_observe_rows, kvc_quant_quantize_rows, kvc_quant_roundtrip_rows, KvcQuant,
    KvcQuantConfig,
};
use kvc::KvcStatus;
use kvc_test_alloc::allocations;

#[global_allocator]
static GLOBAL: kvc_test_alloc::Counting = kvc_test_alloc::Counting;

fn bytes(dtype: u32, values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&x| match dtype {
            KVC_DTYPE_F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
            KVC_DTYPE_BF16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
            _ => x.to_le_bytes().to_vec(),
        })
        .collect()
}

/// A buffer of `n` bytes aligned for any dtype.
fn aligned(src: &[u8]) -> Vec<u32> {
    let mut v = vec![0u32; src.len().div_ceil(4)];
    // SAFETY: `v` holds at least `src.len()` bytes; u32 has no invalid bit patterns.
    unsafe { ptr::copy_nonoverlapping(src.as_ptr(), v.as_mut_ptr().cast::<u8>(), src.len()) };
    v
}

#[test]
fn row_entry_points_allocate_nothing() {
    for channels in [64usize, 192, 256, 576, 1000] {
        let rows = 7;
        let config = KvcQuantConfig {
            n_layers: 1,
            k_channels: channels,
            v_channels: channels,
            symmetric: 0,
        };
        let mut q: *mut KvcQuant = ptr::null_mut();
        // SAFETY: valid pointers.
        assert_eq!(unsafe { kvc_quant_new(&config, &mut q) }, KvcStatus::KVC_OK);
        let values: Vec<f32> = (0..rows * channels)
            .map(|i| ((i * 7919 % 1000) as f32 / 100.0) - 5.0)
            .collect();
        for dtype in [KVC_DTYPE_F16, KVC_DTYPE_BF16, KVC_DTYPE_F32] {
            let src = aligned(&bytes(dtype, &values));
            for tensor in [KVC_TENSOR_K, KVC_TENSOR_V] {
                // SAFETY: `src` holds `rows` rows of `dtype`.
                let st = unsafe {
                    kvc_quant_observe_rows(q, 0, tensor, dtype, src.as_ptr().cast(), rows)
                };
                assert_eq!(st, KvcStatus::KVC_OK);
            }
            // SAFETY: live handle.
            assert_eq!(unsafe { kvc_quant_finish(q) }, KvcStatus::KVC_OK);

            let mut data = src.clone();
            let mut i8s = vec![0i8; rows * channels];
            let mut back = vec![0u32; data.len()];
            let mut len = 0usize;
            // One warm-up call of each (the last-error thread-local registers its
            // destructor on first use), then count.
            for round in 0..2 {
                let before = allocations();
                // SAFETY: all buffers hold `rows` rows of their dtypes.
                unsafe {
                    assert_eq!(
                        kvc_quant_roundtrip_rows(
                            q,
                            0,
                            KVC_TENSOR_K,
                            dtype,
                            data.as_mut_ptr().cast(),
                            rows
                        ),
                        KvcStatus::KVC_OK
                    );
                    assert_eq!(
                        kvc_quant_quantize_rows(
                            q,
                            0,
                            KVC_TENSOR_V,
                            dtype,
                            src.as_ptr().cast(),
                            rows,
                            i8s.as_mut_ptr(),
                            i8s.len(),
                            &mut len
                        ),
                        KvcStatus::KVC_OK
                    );
                    assert_eq!(
                        kvc_quant_dequantize_rows(
                            q,
                            0,
                            KVC_TENSOR_V,
                            i8s.as_ptr(),
                            rows,
                            dtype,
                            back.as_mut_ptr().cast(),
                            rows * channels,
                            &mut len
                        ),
                        KvcStatus::KVC_OK
                    );
                }
                if round == 1 {
                    assert_eq!(
                        allocations(),
                        before,
                        "{channels} channels, dtype {dtype}: the row entry points allocated"
                    );
                }
            }
            // f32 keeps C8's error visible (bf16 may round it away on these few rows).
            if dtype == KVC_DTYPE_F32 {
                assert!(data != src, "the round trip changed nothing");
            }
        }
        // SAFETY: freed once.
        unsafe { kvc_quant_free(q) };
    }
}

/// The counter works: a failing call (which formats a message) is seen allocating.
#[test]
fn the_counter_sees_allocations() {
    let config = KvcQuantConfig {
        n_layers: 1,
        k_channels: 4,
        v_channels: 4,
        symmetric: 0,
    };
    let mut q: *mut KvcQuant = ptr::null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { kvc_quant_new(&config, &mut q) }, KvcStatus::KVC_OK);
    let mut data = [0f32; 4];
    let before = allocations();
    // SAFETY: `data` holds one row; the quantizer has no parameters yet.
    let st = unsafe {
        kvc_quant_roundtrip_rows(
            q,
            0,
            KVC_TENSOR_K,
            KVC_DTYPE_F32,
            data.as_mut_ptr().cast(),
            1,
        )
    };
    assert_eq!(st, KvcStatus::KVC_INVALID_STATE);
    assert!(allocations() > before);
    // SAFETY: freed once.
    unsafe { kvc_quant_free(q) };
}
