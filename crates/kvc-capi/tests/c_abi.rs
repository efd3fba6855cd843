//! The C entry points called from Rust exactly as C calls them: happy paths, every
//! error path, outputs untouched on failure, the last-error contract.

use std::ffi::{c_char, CStr};
use std::ptr;

use half::{bf16, f16};
use kvc::convert::{KVC_DTYPE_BF16, KVC_DTYPE_F16, KVC_DTYPE_F32};
use kvc::version::{KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR, SONAME};
use kvc::{
    kvc_abi_version, kvc_convert, kvc_dtype_size, kvc_get_api, kvc_last_error_message,
    kvc_status_name, kvc_version, KvcStatus, KVC_ABI_VERSION,
};

fn last_error() -> String {
    let mut needed = 0usize;
    // SAFETY: size query; `needed` is valid.
    let st = unsafe { kvc_last_error_message(ptr::null_mut(), 0, &mut needed) };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert!(needed >= 1);
    let mut buf = vec![0 as c_char; needed];
    // SAFETY: `buf` holds `needed` bytes.
    let st = unsafe { kvc_last_error_message(buf.as_mut_ptr(), buf.len(), ptr::null_mut()) };
    assert_eq!(st, KvcStatus::KVC_OK);
    // SAFETY: the message is NUL-terminated within `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_owned()
}

fn name(code: i32) -> &'static str {
    // SAFETY: kvc_status_name returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(kvc_status_name(code)) }
        .to_str()
        .unwrap()
}

unsafe fn convert(
    src_dtype: u32,
    src: *const u8,
    count: usize,
    dst_dtype: u32,
    dst: *mut u8,
    cap: usize,
    len: *mut usize,
) -> KvcStatus {
    // SAFETY: forwarded.
    unsafe {
        kvc_convert(
            src_dtype,
            src.cast(),
            count,
            dst_dtype,
            dst.cast(),
            cap,
            len,
        )
    }
}

#[test]
fn versions_and_soname_agree() {
    // SAFETY: static string.
    let v = unsafe { CStr::from_ptr(kvc_version()) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
    assert_eq!(kvc_abi_version(), KVC_ABI_VERSION);
    assert_eq!(KVC_ABI_VERSION >> 16, KVC_ABI_VERSION_MAJOR);
    assert_eq!(KVC_ABI_VERSION & 0xffff, KVC_ABI_VERSION_MINOR);
    if cfg!(target_os = "linux") {
        assert_eq!(SONAME, format!("libkvc.so.{KVC_ABI_VERSION_MAJOR}"));
    }
}

#[test]
fn status_names_cover_every_code_and_reject_others() {
    for s in KvcStatus::all() {
        let n = name(s as i32);
        assert!(n.starts_with("KVC_"), "{n}");
        assert_eq!(n, s.name());
        assert_eq!(KvcStatus::from_code(s as i32), Some(s));
    }
    assert_eq!(name(0), "KVC_OK");
    assert_eq!(name(4), "KVC_BUFFER_TOO_SMALL");
    for bad in [-1, KvcStatus::all().len() as i32, 1000, i32::MIN, i32::MAX] {
        assert_eq!(name(bad), "KVC_UNKNOWN_STATUS");
    }
}

#[test]
fn f16_to_f32_exact_values() {
    let src: [u16; 6] = [0x3c00, 0xc000, 0x0001, 0x7c00, 0xfc00, 0x7e00];
    let mut dst = [0f32; 6];
    let mut len = 99usize;
    // SAFETY: valid buffers of the stated sizes.
    let st = unsafe {
        convert(
            KVC_DTYPE_F16,
            src.as_ptr().cast(),
            6,
            KVC_DTYPE_F32,
            dst.as_mut_ptr().cast(),
            6,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert_eq!(len, 6);
    assert_eq!(dst[0], 1.0);
    assert_eq!(dst[1], -2.0);
    assert_eq!(dst[2], 2f32.powi(-24)); // smallest subnormal
    assert_eq!(dst[3], f32::INFINITY);
    assert_eq!(dst[4], f32::NEG_INFINITY);
    assert!(dst[5].is_nan());
    assert_eq!(last_error(), "");
}

#[test]
fn f32_to_f16_and_bf16_round_to_nearest_even() {
    // 1 + 2^-11 is a tie between 1.0 and 1 + 2^-10 in f16: even is 1.0.
    // 1 + 3 * 2^-11 ties between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9.
    let src = [
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        70000.0,
        -0.0,
    ];
    let mut h = [0u16; 4];
    let mut len = 0;
    // SAFETY: valid buffers.
    let st = unsafe {
        convert(
            KVC_DTYPE_F32,
            src.as_ptr().cast(),
            4,
            KVC_DTYPE_F16,
            h.as_mut_ptr().cast(),
            4,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert_eq!(h, [0x3c00, 0x3c02, 0x7c00, 0x8000]);
    // bf16: 1 + 2^-8 ties between 1.0 and 1 + 2^-7: even is 1.0.
    let src = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), f32::NAN];
    let mut b = [0u16; 3];
    // SAFETY: valid buffers.
    let st = unsafe {
        convert(
            KVC_DTYPE_F32,
            src.as_ptr().cast(),
            3,
            KVC_DTYPE_BF16,
            b.as_mut_ptr().cast(),
            3,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert_eq!(&b[..2], &[0x3f80, 0x3f82]);
    assert!(bf16::from_bits(b[2]).is_nan());
}

#[test]
fn every_pair_of_dtypes_round_trips_representable_values() {
    // Values exactly representable in f16 and bf16 both (small integers, powers of two).
    let values: Vec<f32> = vec![0.0, 1.0, -1.5, 2.0, 0.25, -8.0, 96.0, 1024.0];
    let dtypes = [KVC_DTYPE_F16, KVC_DTYPE_BF16, KVC_DTYPE_F32];
    for &a in &dtypes {
        for &b in &dtypes {
            let n = values.len();
            // u32 storage: 4-byte aligned, large enough for n elements of any dtype.
            let mut a_buf = vec![0u32; n];
            let mut b_buf = vec![0u32; n];
            let mut out = vec![0f32; n];
            let mut len = 0;
            // SAFETY: every buffer holds n elements of the widest dtype, aligned to 4.
            unsafe {
                let st = convert(
                    KVC_DTYPE_F32,
                    values.as_ptr().cast(),
                    n,
                    a,
                    a_buf.as_mut_ptr().cast(),
                    n,
                    &mut len,
                );
                assert_eq!(st, KvcStatus::KVC_OK);
                let st = convert(
                    a,
                    a_buf.as_ptr().cast(),
                    n,
                    b,
                    b_buf.as_mut_ptr().cast(),
                    n,
                    &mut len,
                );
                assert_eq!(st, KvcStatus::KVC_OK);
                let st = convert(
                    b,
                    b_buf.as_ptr().cast(),
                    n,
                    KVC_DTYPE_F32,
                    out.as_mut_ptr().cast(),
                    n,
                    &mut len,
                );
                assert_eq!(st, KvcStatus::KVC_OK);
            }
            assert_eq!(out, values, "{a} -> {b}");
        }
    }
}

#[test]
fn size_query_then_call() {
    let src = [f16::ONE.to_bits(); 5];
    let mut len = 0usize;
    // SAFETY: size query; `src` holds 5.
    let st = unsafe {
        convert(
            KVC_DTYPE_F16,
            src.as_ptr().cast(),
            5,
            KVC_DTYPE_F32,
            ptr::null_mut(),
            0,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert_eq!(len, 5);
    // Zero elements with NULL pointers is valid.
    // SAFETY: nothing is read or written but `len`.
    let st = unsafe {
        convert(
            KVC_DTYPE_F16,
            ptr::null(),
            0,
            KVC_DTYPE_F32,
            ptr::null_mut(),
            0,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert_eq!(len, 0);
}

#[test]
fn too_small_buffer_reports_needed_and_leaves_dst_untouched() {
    let src = [f16::ONE.to_bits(); 5];
    let mut dst = [7.0f32; 4];
    let mut len = 0usize;
    // SAFETY: `dst` holds 4 (the capacity passed).
    let st = unsafe {
        convert(
            KVC_DTYPE_F16,
            src.as_ptr().cast(),
            5,
            KVC_DTYPE_F32,
            dst.as_mut_ptr().cast(),
            4,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_BUFFER_TOO_SMALL);
    assert_eq!(len, 5);
    assert_eq!(dst, [7.0; 4]);
    let msg = last_error();
    assert!(msg.starts_with("kvc_convert: "), "{msg}");
    assert!(msg.contains("`dst` holds 4 but 5"), "{msg}");
}

#[test]
fn null_and_bad_arguments_write_nothing() {
    let src = [0x3c00u16; 4];
    let mut dst = [7.0f32; 4];
    let mut len = 12345usize;
    let s = src.as_ptr().cast::<u8>();
    let d = dst.as_mut_ptr().cast::<u8>();
    // SAFETY: pointers are valid, or NULL / misaligned / overlapping on purpose: kvc
    // checks them before using them.
    unsafe {
        assert_eq!(
            convert(KVC_DTYPE_F16, s, 4, KVC_DTYPE_F32, d, 4, ptr::null_mut()),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert!(last_error().contains("`dst_len` is NULL"));
        assert_eq!(
            convert(KVC_DTYPE_F16, ptr::null(), 4, KVC_DTYPE_F32, d, 4, &mut len),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert!(last_error().contains("`src` is NULL"));
        assert_eq!(
            convert(
                KVC_DTYPE_F16,
                s,
                4,
                KVC_DTYPE_F32,
                ptr::null_mut(),
                4,
                &mut len
            ),
            KvcStatus::KVC_NULL_ARGUMENT
        );
        assert!(last_error().contains("`dst` is NULL"));
        assert_eq!(
            convert(7, s, 4, KVC_DTYPE_F32, d, 4, &mut len),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert!(last_error().contains("`src_dtype`: 7 is not a kvc_dtype"));
        assert_eq!(
            convert(KVC_DTYPE_F16, s, 4, u32::MAX, d, 4, &mut len),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert!(last_error().contains("`dst_dtype`"));
        // Misaligned f32 output and f16 input.
        assert_eq!(
            convert(KVC_DTYPE_F16, s, 1, KVC_DTYPE_F32, d.add(2), 1, &mut len),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert!(last_error().contains("not aligned to 4 bytes"));
        assert_eq!(
            convert(KVC_DTYPE_F16, s.add(1), 1, KVC_DTYPE_F32, d, 1, &mut len),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        // Sizes that cannot exist.
        assert_eq!(
            convert(
                KVC_DTYPE_F16,
                s,
                usize::MAX,
                KVC_DTYPE_F32,
                d,
                usize::MAX,
                &mut len
            ),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert_eq!(
            convert(
                KVC_DTYPE_F16,
                s,
                usize::MAX / 2,
                KVC_DTYPE_F32,
                d,
                usize::MAX,
                &mut len
            ),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert!(last_error().contains("cannot exist") || last_error().contains("exceed"));
        // Overlap: converting in place is refused.
        let mut buf = [0x3c00u16; 8];
        let p = buf.as_mut_ptr().cast::<u8>();
        assert_eq!(
            convert(KVC_DTYPE_F16, p, 4, KVC_DTYPE_F32, p.add(4), 2, &mut len),
            KvcStatus::KVC_BUFFER_TOO_SMALL
        );
        len = 12345;
        assert_eq!(
            convert(KVC_DTYPE_F16, p, 4, KVC_DTYPE_F16, p.add(2), 4, &mut len),
            KvcStatus::KVC_INVALID_ARGUMENT
        );
        assert!(last_error().contains("overlaps"));
        assert_eq!(buf, [0x3c00u16; 8]);
    }
    assert_eq!(
        len, 12345,
        "no failure except BUFFER_TOO_SMALL writes dst_len"
    );
    assert_eq!(dst, [7.0; 4]);
}

#[test]
fn last_error_copy_out_contract() {
    let mut len = 0;
    // SAFETY: provokes an error; `len` valid.
    let st = unsafe {
        convert(
            9,
            ptr::null(),
            0,
            KVC_DTYPE_F32,
            ptr::null_mut(),
            0,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_INVALID_ARGUMENT);
    let msg = last_error();
    let mut needed = 0usize;
    let mut small = [b'x' as c_char; 8];
    // SAFETY: `small` holds 8 bytes.
    let st = unsafe { kvc_last_error_message(small.as_mut_ptr(), small.len(), &mut needed) };
    assert_eq!(st, KvcStatus::KVC_BUFFER_TOO_SMALL);
    assert_eq!(needed, msg.len() + 1);
    assert_eq!(
        small, [b'x' as c_char; 8],
        "nothing copied on BUFFER_TOO_SMALL"
    );
    // NULL buffer with a capacity.
    // SAFETY: checked by kvc.
    let st = unsafe { kvc_last_error_message(ptr::null_mut(), 4, &mut needed) };
    assert_eq!(st, KvcStatus::KVC_NULL_ARGUMENT);
    // Reporting never clears the message; the exact size works.
    let mut exact = vec![0 as c_char; needed];
    // SAFETY: `exact` holds `needed` bytes.
    let st = unsafe { kvc_last_error_message(exact.as_mut_ptr(), exact.len(), ptr::null_mut()) };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert_eq!(last_error(), msg);
    // A successful call clears it.
    // SAFETY: zero elements.
    let st = unsafe {
        convert(
            KVC_DTYPE_F32,
            ptr::null(),
            0,
            KVC_DTYPE_F32,
            ptr::null_mut(),
            0,
            &mut len,
        )
    };
    assert_eq!(st, KvcStatus::KVC_OK);
    assert_eq!(last_error(), "");
    // Functions without a status leave it alone.
    // SAFETY: provokes an error.
    let _status = unsafe {
        convert(
            9,
            ptr::null(),
            0,
            KVC_DTYPE_F32,
            ptr::null_mut(),
            0,
            &mut len,
        )
    };
    let _ = kvc_status_name(3);
    let _ = kvc_version();
    assert_eq!(kvc_dtype_size(KVC_DTYPE_BF16), 2);
    assert_eq!(kvc_dtype_size(KVC_DTYPE_F32), 4);
    assert_eq!(kvc_dtype_size(kvc::convert::KVC_DTYPE_I8), 1);
    assert_eq!(kvc_dtype_size(4), 0);
    assert_eq!(last_error(), msg);
}

#[test]
fn last_error_is_per_thread() {
    let mut len = 0;
    // SAFETY: provokes an error.
    let _status = unsafe {
        convert(
            9,
            ptr::null(),
            0,
            KVC_DTYPE_F32,
            ptr::null_mut(),
            0,
            &mut len,
        )
    };
    let mine = last_error();
    std::thread::spawn(|| {
        assert_eq!(last_error(), "");
        let mut len = 0;
        // SAFETY: provokes a different error.
        let _status = unsafe {
            convert(
                KVC_DTYPE_F32,
                ptr::null(),
                3,
                KVC_DTYPE_F32,
                ptr::null_mut(),
                0,
                &mut len,
            )
        };
        assert!(last_error().contains("`src` is NULL"));
    })
    .join()
    .unwrap();
    assert_eq!(last_error(), mine);
}

#[test]
fn get_api_serves_compatible_versions_only() {
    let api = kvc_get_api(KVC_ABI_VERSION);
    assert!(!api.is_null());
    // SAFETY: static table.
    let api = unsafe { &*api };
    assert_eq!(api.abi_version, KVC_ABI_VERSION);
    assert_eq!(api.struct_size, std::mem::size_of::<kvc::KvcApi>());
    assert_eq!(
        api.dtype_size as usize,
        kvc_dtype_size as *const () as usize
    );
    // An older minor of the same major is served; a newer minor or another major is not.
    assert!(!kvc_get_api(KVC_ABI_VERSION_MAJOR << 16).is_null());
    assert!(kvc_get_api(KVC_ABI_VERSION + 1).is_null());
    let want = format!(
        "needs ABI {}.{}",
        KVC_ABI_VERSION_MAJOR,
        KVC_ABI_VERSION_MINOR + 1
    );
    assert!(last_error().contains(&want), "{}", last_error());
    // ABI 0.1 programs keep working on this library.
    assert!(!kvc_get_api(KVC_ABI_VERSION_MAJOR << 16 | 1).is_null());
    assert!(kvc_get_api((KVC_ABI_VERSION_MAJOR + 1) << 16 | KVC_ABI_VERSION_MINOR).is_null());
    assert!(kvc_get_api(u32::MAX).is_null());
}
