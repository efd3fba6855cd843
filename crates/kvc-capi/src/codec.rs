//! `kvc_codec`: the lossless gear-v1 codec (`kvc-codec`) behind an opaque handle.
//!
//! A handle holds one encoder per tensor kind (K and V may try different predictor sets),
//! one decoder, and a scratch buffer, so that encoding and decoding tensors of one size
//! allocates nothing after the first call.

use std::ffi::c_void;

use kvc_codec::gear_v1::{
    self, EncodeOptions, GearV1Decoder, GearV1Encoder, Predictor, PredictorSet,
};
use kvc_types::Dtype;

use crate::boundary::{
    check_disjoint, in_ref, in_slice, out_ref, out_slice, status_boundary, value_boundary,
};
use crate::convert::{KvcDtype, KVC_DTYPE_F16};
use crate::error::Error;
use crate::handle::{free_handle, handle_mut, handle_ref, store_handle};
use crate::status::KvcStatus;

/// Bit of the raw predictor (the bytes as they are) in a predictor mask.
pub const KVC_PREDICTOR_RAW: u32 = 1;
/// Bit of the delta_seq predictor (byte minus the previous byte of its stream).
pub const KVC_PREDICTOR_DELTA_SEQ: u32 = 2;
/// Bit of the xor_seq predictor (byte xor the previous byte of its stream).
pub const KVC_PREDICTOR_XOR_SEQ: u32 = 4;
/// Every predictor: kvc's default for K and V.
pub const KVC_PREDICTOR_ALL: u32 = 7;

/// Which tensor of a layer a call is about.
pub type KvcTensor = u32;
/// The keys (K) of a layer.
pub const KVC_TENSOR_K: KvcTensor = 0;
/// The values (V) of a layer.
pub const KVC_TENSOR_V: KvcTensor = 1;

/// Settings of a gear-v1 codec. Fill it with `kvc_codec_config_default`, then change
/// fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvcCodecConfig {
    /// Element type of the tensors: `KVC_DTYPE_F16`, `_BF16`, `_F32` or `_I8` (default F16). It
    /// fixes the number of byte streams; blobs must be decoded with the same dtype.
    pub dtype: KvcDtype,
    /// Predictors tried on K tensors, a mask of `KVC_PREDICTOR_*` bits, non-zero
    /// [`KVC_PREDICTOR_ALL`].
    pub k_predictors: u32,
    /// Predictors tried on V tensors [`KVC_PREDICTOR_ALL`].
    pub v_predictors: u32,
    /// zstd level of the zstd candidates (default 3); zstd's own range.
    pub zstd_level: i32,
}

impl Default for KvcCodecConfig {
    fn default() -> Self {
        KvcCodecConfig {
            dtype: KVC_DTYPE_F16,
            k_predictors: KVC_PREDICTOR_ALL,
            v_predictors: KVC_PREDICTOR_ALL,
            zstd_level: EncodeOptions::default().zstd_level,
        }
    }
}

/// A gear-v1 codec: opaque; create with `kvc_codec_new`, free with `kvc_codec_free`.
pub struct KvcCodec {
    dtype: Dtype,
    k: GearV1Encoder,
    v: GearV1Encoder,
    decoder: GearV1Decoder,
    scratch: Vec<u8>,
}

fn predictor_set(mask: u32, argument: &'static str) -> Result<PredictorSet, Error> {
    if mask == 0 || mask & !KVC_PREDICTOR_ALL != 0 {
        return Err(Error::invalid(
            argument,
            format!(
                "{mask:#x} is not a non-empty mask of KVC_PREDICTOR_RAW (1), \
                 KVC_PREDICTOR_DELTA_SEQ (2) and KVC_PREDICTOR_XOR_SEQ (4)"
            ),
        ));
    }
    let list: Vec<Predictor> = Predictor::ALL
        .into_iter()
        .filter(|p| mask & (1 << p.mode()) != 0)
        .collect();
    Ok(PredictorSet::new(&list)?)
}

impl KvcCodec {
    /// A codec for `config` (validated).
    pub fn new(config: &KvcCodecConfig) -> Result<KvcCodec, Error> {
        let dtype = crate::elements::cache_dtype(config.dtype, "config.dtype")?;
        let k = predictor_set(config.k_predictors, "config.k_predictors")?;
        let v = predictor_set(config.v_predictors, "config.v_predictors")?;
        let enc = |predictors| {
            GearV1Encoder::new(EncodeOptions {
                predictors,
                zstd_level: config.zstd_level,
            })
        };
        Ok(KvcCodec {
            dtype,
            k: enc(k)?,
            v: enc(v)?,
            decoder: GearV1Decoder::new()?,
            scratch: Vec::new(),
        })
    }

    /// The largest blob `input_bytes` bytes can encode to.
    pub fn max_encoded_len(&self, input_bytes: usize) -> Result<usize, Error> {
        Ok(gear_v1::max_encoded_len(self.dtype, input_bytes)?)
    }

    /// Encodes `src` into `dst` when the blob fits; otherwise returns `Ok(Err(needed))`
    /// and leaves `dst` untouched.
    pub fn encode(
        &mut self,
        tensor: KvcTensor,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<Result<usize, usize>, Error> {
        let bound = self.max_encoded_len(src.len())?;
        let encoder = match tensor {
            KVC_TENSOR_K => &mut self.k,
            KVC_TENSOR_V => &mut self.v,
            _ => return Err(bad_tensor(tensor)),
        };
        if dst.len() >= bound {
            return Ok(Ok(encoder.encode_into(self.dtype, src, dst)?));
        }
        // Too small for the worst case: encode aside, copy only when the blob fits.
        encoder.encode(self.dtype, src, &mut self.scratch)?;
        let n = self.scratch.len();
        Ok(match dst.get_mut(..n) {
            Some(d) => {
                d.copy_from_slice(&self.scratch);
                Ok(n)
            }
            None => Err(n),
        })
    }

    /// Bytes `blob` decodes to (after validating its structure).
    pub fn decoded_len(&self, blob: &[u8]) -> Result<usize, Error> {
        Ok(gear_v1::decoded_len(self.dtype, blob)?)
    }

    /// Decodes `blob` into `dst` when it fits (else `Ok(Err(needed))`); `dst` changes only
    /// on success (the blob is decoded aside first, as a corrupt payload is only found
    /// while decoding).
    pub fn decode(&mut self, blob: &[u8], dst: &mut [u8]) -> Result<Result<usize, usize>, Error> {
        let n = self.decoded_len(blob)?;
        let Some(d) = dst.get_mut(..n) else {
            return Ok(Err(n));
        };
        self.decoder.decode(self.dtype, blob, &mut self.scratch)?;
        d.copy_from_slice(&self.scratch);
        Ok(Ok(n))
    }
}

fn bad_tensor(tensor: KvcTensor) -> Error {
    Error::invalid(
        "tensor",
        format!("{tensor} is not KVC_TENSOR_K (0) or KVC_TENSOR_V (1)"),
    )
}

/// Writes the default codec settings (gear-v1 defaults: F16, every predictor for K and V,
/// zstd level 3) into `*out`.
///
/// Ownership: `out` is caller-owned. Threads: safe from any thread.
///
/// # Safety
/// `out` must be NULL or point to a writable `kvc_codec_config`.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_codec_config_default(out: *mut KvcCodecConfig) -> KvcStatus {
    status_boundary("kvc_codec_config_default", || {
        // SAFETY: caller contract.
        *unsafe { out_ref(out, "out") }? = KvcCodecConfig::default();
        Ok(())
    })
}

/// Creates a gear-v1 codec with `config` and stores it in `*out` (only on `KVC_OK`).
/// Errors: an unknown dtype, an empty or unknown predictor mask, a zstd level out of
/// range are `KVC_INVALID_ARGUMENT`.
///
/// Ownership: `config` is only read during the call; the caller owns the new handle and
/// frees it with `kvc_codec_free`. Threads: safe from any thread; the handle is not
/// shared with anything.
///
/// # Safety
/// `config` must point to a readable `kvc_codec_config`, `out` to a writable pointer.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_codec_new(
    config: *const KvcCodecConfig,
    out: *mut *mut KvcCodec,
) -> KvcStatus {
    status_boundary("kvc_codec_new", || {
        // SAFETY: caller contract.
        let config = unsafe { in_ref(config, "config") }?;
        // SAFETY: caller contract.
        unsafe { out_ref(out, "out") }?;
        let codec = KvcCodec::new(config)?;
        // SAFETY: checked above.
        unsafe { store_handle(out, codec) }
    })
}

/// The largest blob that `input_bytes` bytes of the codec's dtype can encode to, in
/// `*out`: a `dst` of this size never fails with `KVC_BUFFER_TOO_SMALL`.
/// `input_bytes` not a whole number of elements is `KVC_INVALID_ARGUMENT`; more elements
/// than gear-v1 can hold is `KVC_UNSUPPORTED`.
///
/// Threads: reads the handle only; may run concurrently with other `const` calls on it.
///
/// # Safety
/// `codec` must be a live handle; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_codec_max_encoded_size(
    codec: *const KvcCodec,
    input_bytes: usize,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_codec_max_encoded_size", || {
        // SAFETY: caller contract.
        let codec = unsafe { handle_ref(codec, "codec") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out, "out") }?;
        *out = codec.max_encoded_len(input_bytes)?;
        Ok(())
    })
}

/// Encodes `src_bytes` bytes of elements at `src` as one gear-v1 blob into `dst`, trying
/// the predictors configured for `tensor` (`KVC_TENSOR_K` or `KVC_TENSOR_V`).
///
/// Size query: `dst == NULL && dst_capacity == 0` stores the worst-case size
/// (`kvc_codec_max_encoded_size`) in `*dst_len`. A `dst_capacity` at least that size
/// always works; a smaller one works when the blob fits, else `KVC_BUFFER_TOO_SMALL` with
/// the blob's exact size in `*dst_len` and `dst` untouched. On `KVC_OK`, `*dst_len` is
/// the blob's length.
///
/// Ownership: `src` and `dst` are caller-owned and must not overlap; nothing is kept.
/// Threads: exclusive use of `codec` (it holds scratch state).
///
/// # Safety
/// `codec` live; `src` readable for `src_bytes`; `dst` writable for `dst_capacity`;
/// `dst_len` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_codec_encode(
    codec: *mut KvcCodec,
    tensor: KvcTensor,
    src: *const c_void,
    src_bytes: usize,
    dst: *mut c_void,
    dst_capacity: usize,
    dst_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_codec_encode", || {
        // SAFETY: caller contract.
        let codec = unsafe { handle_mut(codec, "codec") }?;
        // SAFETY: caller contract.
        let dst_len = unsafe { out_ref(dst_len, "dst_len") }?;
        if tensor > KVC_TENSOR_V {
            return Err(bad_tensor(tensor));
        }
        if dst.is_null() && dst_capacity == 0 {
            *dst_len = codec.max_encoded_len(src_bytes)?;
            return Ok(());
        }
        check_disjoint(
            src.cast(),
            src_bytes,
            dst.cast_const().cast(),
            dst_capacity,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, size and overlap are checked.
        let src = unsafe { in_slice(src.cast::<u8>(), src_bytes, "src") }?;
        // SAFETY: as above.
        let dst = unsafe { out_slice(dst.cast::<u8>(), dst_capacity, "dst") }?;
        match codec.encode(tensor, src, dst)? {
            Ok(n) => {
                *dst_len = n;
                Ok(())
            }
            Err(needed) => {
                *dst_len = needed;
                Err(Error::BufferTooSmall {
                    argument: "dst",
                    needed,
                    capacity: dst_capacity,
                })
            }
        }
    })
}

/// The number of bytes the gear-v1 blob at `blob` decodes to, read from the blob after
/// validating its structure, in `*out`. A malformed or truncated blob is
/// `KVC_CORRUPT_DATA`.
///
/// Threads: reads the handle only; may run concurrently with other `const` calls on it.
///
/// # Safety
/// `codec` live; `blob` readable for `blob_bytes`; `out` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_codec_decoded_size(
    codec: *const KvcCodec,
    blob: *const c_void,
    blob_bytes: usize,
    out: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_codec_decoded_size", || {
        // SAFETY: caller contract.
        let codec = unsafe { handle_ref(codec, "codec") }?;
        // SAFETY: caller contract.
        let out = unsafe { out_ref(out, "out") }?;
        // SAFETY: caller contract.
        let blob = unsafe { in_slice(blob.cast::<u8>(), blob_bytes, "blob") }?;
        *out = codec.decoded_len(blob)?;
        Ok(())
    })
}

/// Decodes the gear-v1 blob at `blob` into `dst`.
///
/// Size query: `dst == NULL && dst_capacity == 0` stores the decoded size in `*dst_len`
/// (as `kvc_codec_decoded_size`). Too small a `dst_capacity` is `KVC_BUFFER_TOO_SMALL`
/// with the size in `*dst_len`. A malformed, truncated or inconsistent blob is
/// `KVC_CORRUPT_DATA`; `dst` is written only on `KVC_OK`.
///
/// Ownership: `blob` and `dst` are caller-owned and must not overlap. Threads: exclusive
/// use of `codec`.
///
/// # Safety
/// `codec` live; `blob` readable for `blob_bytes`; `dst` writable for `dst_capacity`;
/// `dst_len` writable.
#[no_mangle]
#[must_use = "a kvc_status reports failure"]
pub unsafe extern "C" fn kvc_codec_decode(
    codec: *mut KvcCodec,
    blob: *const c_void,
    blob_bytes: usize,
    dst: *mut c_void,
    dst_capacity: usize,
    dst_len: *mut usize,
) -> KvcStatus {
    status_boundary("kvc_codec_decode", || {
        // SAFETY: caller contract.
        let codec = unsafe { handle_mut(codec, "codec") }?;
        // SAFETY: caller contract.
        let dst_len = unsafe { out_ref(dst_len, "dst_len") }?;
        // SAFETY: caller contract.
        let blob_s = unsafe { in_slice(blob.cast::<u8>(), blob_bytes, "blob") }?;
        if dst.is_null() && dst_capacity == 0 {
            *dst_len = codec.decoded_len(blob_s)?;
            return Ok(());
        }
        check_disjoint(
            blob.cast(),
            blob_bytes,
            dst.cast_const().cast(),
            dst_capacity,
            "dst",
        )?;
        // SAFETY: caller contract; NULL, size and overlap are checked.
        let dst = unsafe { out_slice(dst.cast::<u8>(), dst_capacity, "dst") }?;
        match codec.decode(blob_s, dst)? {
            Ok(n) => {
                *dst_len = n;
                Ok(())
            }
            Err(needed) => {
                *dst_len = needed;
                Err(Error::BufferTooSmall {
                    argument: "dst",
                    needed,
                    capacity: dst_capacity,
                })
            }
        }
    })
}

/// Frees a codec; NULL is a no-op.
///
/// Ownership: the handle is invalid afterwards. Threads: no other call may be using it.
///
/// # Safety
/// `codec` must be NULL or a live handle from `kvc_codec_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn kvc_codec_free(codec: *mut KvcCodec) {
    // SAFETY: forwarded contract.
    value_boundary((), || unsafe { free_handle(codec) })
}
