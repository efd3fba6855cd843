//! `kvc_kvq_channel_*`: K per channel over token groups (KIVI), addressed by `(bits,
//! head_dim, group)` alone, with no handle (`kvc-kvq`'s `ChannelGroupCodec`,
//! `docs/formats/kvq.md`, "Channel groups"). A block codes `group` consecutive tokens of
//! one KV head; each channel has its own f16 step and minimum over those tokens. The
//! engine holds the tokens of the unfilled newest group in f16 and codes them once the
//! group is full; token `i` is row `i % group` of block `i / group`.
//!
//! Threads: every function is safe from any thread; none keeps state.

use kvc_kvq::ChannelGroupCodec;

use crate::boundary::{check_disjoint, in_slice, out_ref, out_slice, status_boundary};
use crate::error::Error;
use crate::status::KvcStatus;

fn codec(bits: u32, head_dim: u32, group: u32) -> Result<ChannelGroupCodec, Error> {
    let b = u8::try_from(bits)
        .map_err(|_| Error::invalid("bits", format!("{bits} is not in 2..=8")))?;
    Ok(ChannelGroupCodec::new(
        b,
        head_dim as usize,
        group as usize,
    )?)
}

/// `KVC_BUFFER_TOO_SMALL` for `what`, with the bytes (or values) needed and given.
pub(crate) fn short(what: &'static str, needed: usize, found: usize) -> Error {
    kvc_kvq::Error::BufferTooSmall {
        what,
        needed,
        found,
    }
    .into()
}

/// Bytes of one block of `group` tokens of `head_dim` values at `bits` bits, written to
/// `*out` (only on `KVC_OK`): `4 * head_dim + group * head_dim * bits / 8`.
/// `KVC_INVALID_ARGUMENT` for bits outside 2..=8 or a group other than 16, 32, 64, 128,
/// 256; `KVC_UNSUPPORTED` for a head_dim other than 64, 128, 256.
///
/// # Safety
/// `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_channel_block_bytes(
    bits: u32,
    head_dim: u32,
    group: u32,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_channel_block_bytes", || {
        let c = codec(bits, head_dim, group)?;
        // SAFETY: caller contract.
        let o = unsafe { out_ref(out, "out") }?;
        *o = c.block_bytes();
        Ok(())
    })
}

/// Codes `group` rows of `head_dim` floats at `rows` (token-major: row `t` starts at
/// `rows + t * head_dim`) into one block at `dst` (`dst_len` bytes, at least
/// `kvc_kvq_channel_block_bytes`). A non-finite value, or one outside f16's range, is
/// `KVC_INVALID_ARGUMENT` (a caller's value, named by token row and channel); a short
/// `dst` is `KVC_BUFFER_TOO_SMALL`. `dst` is written only on
/// `KVC_OK`.
///
/// Ownership: both buffers stay the caller's.
///
/// # Safety
/// `rows` readable for `group * head_dim` floats; `dst` writable for `dst_len` bytes and
/// not overlapping `rows`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_channel_quantize(
    bits: u32,
    head_dim: u32,
    group: u32,
    rows: *const f32,
    dst: *mut u8,
    dst_len: usize,
) -> KvcStatus {
    status_boundary("kvc_kvq_channel_quantize", || {
        let c = codec(bits, head_dim, group)?;
        let n = c.group() * c.dim();
        let need = c.block_bytes();
        if dst_len < need {
            return Err(short("dst (block_bytes)", need, dst_len));
        }
        check_disjoint(rows.cast(), n * 4, dst.cast_const(), need, "dst")?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let x = unsafe { in_slice(rows, n, "rows") }?;
        // SAFETY: as above; disjoint from `rows` (checked).
        let d = unsafe { out_slice(dst, need, "dst") }?;
        Ok(c.quantize_block(x, d)?)
    })
}

/// Decodes the block at `src` (`src_len` bytes, at least `kvc_kvq_channel_block_bytes`)
/// into `group * head_dim` floats at `dst`, token-major. A short `src` is
/// `KVC_BUFFER_TOO_SMALL`; a non-finite or negative step or a non-finite minimum is
/// `KVC_CORRUPT_DATA`. `dst` is written only on `KVC_OK`.
///
/// # Safety
/// `src` readable for `src_len` bytes; `dst` writable for `group * head_dim` floats and
/// not overlapping `src`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_channel_dequantize(
    bits: u32,
    head_dim: u32,
    group: u32,
    src: *const u8,
    src_len: usize,
    dst: *mut f32,
) -> KvcStatus {
    status_boundary("kvc_kvq_channel_dequantize", || {
        let c = codec(bits, head_dim, group)?;
        let n = c.group() * c.dim();
        let need = c.block_bytes();
        if src_len < need {
            return Err(short("src (block_bytes)", need, src_len));
        }
        check_disjoint(src, need, dst.cast_const().cast(), n * 4, "dst")?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let p = unsafe { in_slice(src, need, "src") }?;
        // SAFETY: as above; disjoint from `src` (checked).
        let y = unsafe { out_slice(dst, n, "dst") }?;
        // decode into a scratch first so that `dst` is written only on success
        let mut tmp = vec![0f32; n];
        c.dequantize_block(p, &mut tmp)?;
        y.copy_from_slice(&tmp);
        Ok(())
    })
}

/// Scores `q . row` for the `group` rows of the block at `src` into `scores` (`group`
/// floats), read from the codes without decoding the rows (`q . min + sum_c q_c step_c
/// code_c`). Errors as `kvc_kvq_channel_dequantize`; `scores` is written only on `KVC_OK`.
///
/// # Safety
/// `q` readable for `head_dim` floats; `src` readable for `src_len` bytes; `scores`
/// writable for `group` floats and overlapping neither.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_kvq_channel_dot(
    bits: u32,
    head_dim: u32,
    group: u32,
    q: *const f32,
    src: *const u8,
    src_len: usize,
    scores: *mut f32,
) -> KvcStatus {
    status_boundary("kvc_kvq_channel_dot", || {
        let c = codec(bits, head_dim, group)?;
        let need = c.block_bytes();
        if src_len < need {
            return Err(short("src (block_bytes)", need, src_len));
        }
        let g = c.group();
        check_disjoint(src, need, scores.cast_const().cast(), g * 4, "scores")?;
        check_disjoint(
            q.cast(),
            c.dim() * 4,
            scores.cast_const().cast(),
            g * 4,
            "scores",
        )?;
        // SAFETY: caller contract; NULL, alignment and size are checked.
        let qv = unsafe { in_slice(q, c.dim(), "q") }?;
        // SAFETY: as above.
        let p = unsafe { in_slice(src, need, "src") }?;
        // SAFETY: as above; disjoint from `q` and `src` (checked).
        let s = unsafe { out_slice(scores, g, "scores") }?;
        let mut tmp = [0f32; 256];
        c.dot_block(qv, p, &mut tmp[..g])?;
        s.copy_from_slice(&tmp[..g]);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::KvcStatus::{
        KVC_BUFFER_TOO_SMALL, KVC_CORRUPT_DATA, KVC_INVALID_ARGUMENT, KVC_OK, KVC_UNSUPPORTED,
    };

    #[test]
    fn round_trip_and_errors_through_the_c_calls() {
        let mut bytes = 0usize;
        // SAFETY: valid pointers throughout.
        unsafe {
            assert_eq!(kvc_kvq_channel_block_bytes(4, 64, 32, &mut bytes), KVC_OK);
            assert_eq!(bytes, 4 * 64 + 32 * 32);
            assert_eq!(
                kvc_kvq_channel_block_bytes(1, 64, 32, &mut bytes),
                KVC_INVALID_ARGUMENT
            );
            assert_eq!(
                kvc_kvq_channel_block_bytes(300, 64, 32, &mut bytes),
                KVC_INVALID_ARGUMENT
            );
            assert_eq!(
                kvc_kvq_channel_block_bytes(4, 96, 32, &mut bytes),
                KVC_UNSUPPORTED
            );
            assert_eq!(
                kvc_kvq_channel_block_bytes(4, 64, 33, &mut bytes),
                KVC_INVALID_ARGUMENT
            );
            let x: Vec<f32> = (0..32 * 64)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let mut b = vec![0u8; 4 * 64 + 32 * 32];
            assert_eq!(
                kvc_kvq_channel_quantize(4, 64, 32, x.as_ptr(), b.as_mut_ptr(), b.len() - 1),
                KVC_BUFFER_TOO_SMALL
            );
            assert_eq!(
                kvc_kvq_channel_quantize(4, 64, 32, x.as_ptr(), b.as_mut_ptr(), b.len()),
                KVC_OK
            );
            let mut y = vec![7f32; x.len()];
            assert_eq!(
                kvc_kvq_channel_dequantize(4, 64, 32, b.as_ptr(), b.len() - 1, y.as_mut_ptr()),
                KVC_BUFFER_TOO_SMALL
            );
            assert!(y.iter().all(|&v| v == 7.0));
            assert_eq!(
                kvc_kvq_channel_dequantize(4, 64, 32, b.as_ptr(), b.len(), y.as_mut_ptr()),
                KVC_OK
            );
            let step_max = 100.0 / 7.0 / 15.0;
            assert!(x
                .iter()
                .zip(&y)
                .all(|(a, b)| (a - b).abs() <= 0.51 * step_max));
            let mut s = vec![0f32; 32];
            assert_eq!(
                kvc_kvq_channel_dot(4, 64, 32, y.as_ptr(), b.as_ptr(), b.len(), s.as_mut_ptr()),
                KVC_OK
            );
            let want: f32 = y[..64].iter().zip(&y[..64]).map(|(a, b)| a * b).sum();
            assert!((s[0] - want).abs() <= 1e-4 * want.abs());
            b[1] = 0x7c;
            b[0] = 0x00;
            let mut z = vec![7f32; x.len()];
            assert_eq!(
                kvc_kvq_channel_dequantize(4, 64, 32, b.as_ptr(), b.len(), z.as_mut_ptr()),
                KVC_CORRUPT_DATA
            );
            assert!(z.iter().all(|&v| v == 7.0));
            let mut nan = x.clone();
            nan[3] = f32::NAN;
            assert_eq!(
                kvc_kvq_channel_quantize(4, 64, 32, nan.as_ptr(), b.as_mut_ptr(), b.len()),
                KVC_INVALID_ARGUMENT
            );
        }
    }
}
