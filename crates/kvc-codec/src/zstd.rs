//! A small safe wrapper over the statically linked zstd (`zstd-sys`).
//!
//! Compression has `ZSTD_compress` semantics (one frame, content size written, no
//! checksum) and reuses its context, so the bytes equal those of a one-shot
//! `ZSTD_compress` at the same level. Decompression accepts exactly one frame that spans
//! the whole input and declares the expected content size, and never writes past the
//! caller's buffer.

use std::ffi::CStr;
use std::ptr::NonNull;

use zstd_sys as sys;

use crate::error::{Error, Result};

/// The zstd level gear-v1 uses unless told otherwise.
pub const DEFAULT_LEVEL: i32 = 3;

/// The largest compressed size of `src_len` bytes (`ZSTD_compressBound`), or `None` when
/// `src_len` is beyond what zstd accepts.
pub fn compress_bound(src_len: usize) -> Option<usize> {
    // SAFETY: ZSTD_compressBound is a pure function of its argument.
    let bound = unsafe { sys::ZSTD_compressBound(src_len) };
    // SAFETY: ZSTD_isError is a pure function of its argument.
    if bound == 0 || unsafe { sys::ZSTD_isError(bound) } != 0 {
        None
    } else {
        Some(bound)
    }
}

/// The range of compression levels the linked zstd accepts.
pub fn level_range() -> (i32, i32) {
    // SAFETY: both are pure functions without arguments.
    unsafe { (sys::ZSTD_minCLevel(), sys::ZSTD_maxCLevel()) }
}

/// Checks that `level` is accepted by the linked zstd.
pub fn check_level(level: i32) -> Result<()> {
    let (min, max) = level_range();
    if (min..=max).contains(&level) {
        Ok(())
    } else {
        Err(Error::ZstdLevelOutOfRange { level, min, max })
    }
}

fn error_name(code: usize) -> &'static str {
    // SAFETY: ZSTD_getErrorName returns a pointer to a static NUL-terminated string for
    // any argument.
    let name = unsafe { CStr::from_ptr(sys::ZSTD_getErrorName(code)) };
    name.to_str().unwrap_or("unknown zstd error")
}

fn is_error(code: usize) -> bool {
    // SAFETY: ZSTD_isError is a pure function of its argument.
    unsafe { sys::ZSTD_isError(code) != 0 }
}

/// A reusable zstd compression context.
pub struct ZstdCompressor {
    cctx: NonNull<sys::ZSTD_CCtx>,
}

// SAFETY: a ZSTD_CCtx holds no thread-local state; it may move between threads as long as
// one thread uses it at a time, which `&mut self` on every use guarantees.
unsafe impl Send for ZstdCompressor {}

impl ZstdCompressor {
    /// Allocates a compression context.
    pub fn new() -> Result<Self> {
        // SAFETY: ZSTD_createCCtx has no preconditions; null means allocation failure.
        let cctx = unsafe { sys::ZSTD_createCCtx() };
        NonNull::new(cctx)
            .map(|cctx| ZstdCompressor { cctx })
            .ok_or(Error::ZstdContextAllocation)
    }

    /// Compresses `src` at `level` into `dst` as one frame and returns its length.
    ///
    /// Fails when `dst` is too small; a `dst` of [`compress_bound`]`(src.len())` bytes
    /// always suffices.
    pub fn compress_into(&mut self, src: &[u8], level: i32, dst: &mut [u8]) -> Result<usize> {
        check_level(level)?;
        // SAFETY: cctx is a live context owned by self (exclusive through &mut self); src
        // and dst are valid for their lengths and do not overlap (one is shared, the other
        // exclusive); zstd writes at most dst.len() bytes.
        let ret = unsafe {
            sys::ZSTD_compressCCtx(
                self.cctx.as_ptr(),
                dst.as_mut_ptr().cast(),
                dst.len(),
                src.as_ptr().cast(),
                src.len(),
                level,
            )
        };
        if is_error(ret) {
            if dst.len() < compress_bound(src.len()).unwrap_or(usize::MAX) {
                return Err(Error::OutputTooSmall {
                    needed: compress_bound(src.len()).unwrap_or(usize::MAX),
                    available: dst.len(),
                });
            }
            return Err(Error::ZstdCompress {
                reason: error_name(ret),
            });
        }
        Ok(ret)
    }
}

impl Drop for ZstdCompressor {
    fn drop(&mut self) {
        // SAFETY: cctx came from ZSTD_createCCtx and is freed exactly once, here.
        unsafe {
            sys::ZSTD_freeCCtx(self.cctx.as_ptr());
        }
    }
}

/// A reusable zstd decompression context.
pub struct ZstdDecompressor {
    dctx: NonNull<sys::ZSTD_DCtx>,
}

// SAFETY: as for ZstdCompressor: no thread-local state, exclusive use through &mut self.
unsafe impl Send for ZstdDecompressor {}

impl ZstdDecompressor {
    /// Allocates a decompression context.
    pub fn new() -> Result<Self> {
        // SAFETY: ZSTD_createDCtx has no preconditions; null means allocation failure.
        let dctx = unsafe { sys::ZSTD_createDCtx() };
        NonNull::new(dctx)
            .map(|dctx| ZstdDecompressor { dctx })
            .ok_or(Error::ZstdContextAllocation)
    }

    /// Decompresses `src`, which must be exactly one zstd frame declaring a content size of
    /// `dst.len()`, into `dst`, filling it completely.
    pub fn decompress_exact(&mut self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        // SAFETY: src is valid for src.len() bytes; the function only reads within it.
        let frame_len =
            unsafe { sys::ZSTD_findFrameCompressedSize(src.as_ptr().cast(), src.len()) };
        if is_error(frame_len) {
            return Err(Error::ZstdFrameInvalid {
                reason: error_name(frame_len),
            });
        }
        if frame_len != src.len() {
            return Err(Error::ZstdFrameLength {
                payload_len: src.len(),
                frame_len,
            });
        }
        // SAFETY: as above, a read-only look at src within its length.
        let declared = unsafe { sys::ZSTD_getFrameContentSize(src.as_ptr().cast(), src.len()) };
        // ZSTD_CONTENTSIZE_UNKNOWN is (0ULL - 1), ZSTD_CONTENTSIZE_ERROR is (0ULL - 2).
        const UNKNOWN: u64 = u64::MAX;
        const ERROR: u64 = u64::MAX - 1;
        match declared {
            ERROR => {
                return Err(Error::ZstdFrameInvalid {
                    reason: "unreadable frame header",
                })
            }
            UNKNOWN => {
                return Err(Error::ZstdContentSize {
                    expected: dst.len(),
                    declared: None,
                })
            }
            d if d != dst.len() as u64 => {
                return Err(Error::ZstdContentSize {
                    expected: dst.len(),
                    declared: Some(d),
                })
            }
            _ => {}
        }
        // SAFETY: dctx is a live context owned by self (exclusive through &mut self); src
        // and dst are valid for their lengths and do not overlap; zstd writes at most
        // dst.len() bytes and reads at most src.len() bytes.
        let ret = unsafe {
            sys::ZSTD_decompressDCtx(
                self.dctx.as_ptr(),
                dst.as_mut_ptr().cast(),
                dst.len(),
                src.as_ptr().cast(),
                src.len(),
            )
        };
        if is_error(ret) {
            return Err(Error::ZstdDecompress {
                reason: error_name(ret),
            });
        }
        if ret != dst.len() {
            return Err(Error::ZstdDecompress {
                reason: "frame produced fewer bytes than it declares",
            });
        }
        Ok(())
    }
}

impl Drop for ZstdDecompressor {
    fn drop(&mut self) {
        // SAFETY: dctx came from ZSTD_createDCtx and is freed exactly once, here.
        unsafe {
            sys::ZSTD_freeDCtx(self.dctx.as_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compress(src: &[u8], level: i32) -> Vec<u8> {
        let mut c = ZstdCompressor::new().unwrap();
        let mut out = vec![0u8; compress_bound(src.len()).unwrap()];
        let n = c.compress_into(src, level, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn round_trip_and_frame_shape() {
        let src: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let z = compress(&src, 3);
        assert_eq!(&z[..4], &[0x28, 0xb5, 0x2f, 0xfd], "zstd magic");
        let mut d = ZstdDecompressor::new().unwrap();
        let mut out = vec![0u8; src.len()];
        d.decompress_exact(&z, &mut out).unwrap();
        assert_eq!(out, src);
        // Context reuse gives the same bytes.
        assert_eq!(compress(&src, 3), z);
    }

    #[test]
    fn wrong_content_size_trailing_bytes_and_garbage_are_errors() {
        let src = vec![7u8; 1000];
        let z = compress(&src, 3);
        let mut d = ZstdDecompressor::new().unwrap();
        let mut small = vec![0u8; 999];
        assert!(matches!(
            d.decompress_exact(&z, &mut small),
            Err(Error::ZstdContentSize {
                expected: 999,
                declared: Some(1000)
            })
        ));
        let mut longer = z.clone();
        longer.push(0);
        let mut out = vec![0u8; 1000];
        assert!(matches!(
            d.decompress_exact(&longer, &mut out),
            Err(Error::ZstdFrameLength { .. } | Error::ZstdFrameInvalid { .. })
        ));
        assert!(matches!(
            d.decompress_exact(&z[..z.len() - 1], &mut out),
            Err(Error::ZstdFrameInvalid { .. })
        ));
        assert!(matches!(
            d.decompress_exact(b"not zstd at all", &mut out),
            Err(Error::ZstdFrameInvalid { .. })
        ));
    }

    #[test]
    fn level_and_buffer_checks() {
        let mut c = ZstdCompressor::new().unwrap();
        let (_, max) = level_range();
        let mut out = vec![0u8; 64];
        assert!(matches!(
            c.compress_into(b"abc", max + 1, &mut out),
            Err(Error::ZstdLevelOutOfRange { .. })
        ));
        let src: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761u32) >> 24) as u8)
            .collect();
        let mut tiny = vec![0u8; 8];
        assert!(matches!(
            c.compress_into(&src, 3, &mut tiny),
            Err(Error::OutputTooSmall { .. })
        ));
    }
}
