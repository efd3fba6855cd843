//! Which compiled kernels run: portable, AVX2 (+FMA, F16C) or AVX-512F, detected once per
//! process, and `dispatch!`, the one place that turns an [`Isa`] into a kernel call.

use std::sync::atomic::{AtomicU8, Ordering};

/// Which kvq kernels to run: the portable loops, the AVX2 ones when the CPU has AVX2, FMA
/// and F16C, and also the AVX-512F block kernels when it has AVX-512F (and rustc had the
/// intrinsics: `build.rs`). Only [`Isa::detect`] can select AVX2 or AVX-512, so holding an
/// `Isa` proves the CPU runs its kernels; tests force [`Isa::PORTABLE`] and
/// [`Isa::without_avx512`] too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa(pub(crate) IsaKind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IsaKind {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 and AVX-512F: every AVX2 kernel, plus the 512-bit block kernels.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// [`Isa::detect`]'s answer: 0 not yet detected, else `1 + ` the kind's index.
static DETECTED: AtomicU8 = AtomicU8::new(0);

impl IsaKind {
    fn code(self) -> u8 {
        match self {
            IsaKind::Portable => 1,
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => 2,
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx512 => 3,
        }
    }

    fn from_code(code: u8) -> Option<IsaKind> {
        match code {
            1 => Some(IsaKind::Portable),
            #[cfg(target_arch = "x86_64")]
            2 => Some(IsaKind::Avx2),
            #[cfg(target_arch = "x86_64")]
            3 => Some(IsaKind::Avx512),
            _ => None,
        }
    }
}

impl Isa {
    /// The portable loops.
    pub const PORTABLE: Isa = Isa(IsaKind::Portable);

    /// The best kernels this CPU runs: AVX2 when it has AVX2, FMA and F16C (the AVX2
    /// kernels use FMA and read f16 scales with F16C; every AVX2 CPU kvc targets has all
    /// three), AVX-512 when it also has AVX-512F. Detected on the first call, then read
    /// from a cache (one atomic load).
    pub fn detect() -> Isa {
        if let Some(kind) = IsaKind::from_code(DETECTED.load(Ordering::Relaxed)) {
            return Isa(kind);
        }
        let kind = Self::probe();
        DETECTED.store(kind.code(), Ordering::Relaxed);
        Isa(kind)
    }

    fn probe() -> IsaKind {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return IsaKind::Avx512;
            }
            return IsaKind::Avx2;
        }
        IsaKind::Portable
    }

    /// Whether this selects the AVX2 kernels.
    pub fn is_avx2(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if matches!(self.0, IsaKind::Avx2 | IsaKind::Avx512) {
            return true;
        }
        false
    }

    /// Whether this also selects the AVX-512 block kernels.
    pub fn is_avx512(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.0 == IsaKind::Avx512 {
            return true;
        }
        false
    }

    /// The same kernels without the AVX-512 ones (AVX2 stays AVX2, portable portable), for
    /// tests and comparisons on an AVX-512 CPU.
    pub fn without_avx512(self) -> Isa {
        #[cfg(target_arch = "x86_64")]
        if self.0 == IsaKind::Avx512 {
            return Isa(IsaKind::Avx2);
        }
        self
    }
}

/// Runs the kernel an [`Isa`] selects: `dispatch!(isa, portable => a, avx2 => b, avx512 =>
/// c)`, or without the `avx512` arm where AVX-512 runs the AVX2 kernel. It expands to one
/// `match` on the kind, as a hand-written one would (no cost): `b` runs in an `unsafe`
/// block on `Avx2` (and on `Avx512` when `c` is absent), `c` in one on `Avx512`.
///
/// The caller's part of the safety contract: `b` and `c` are calls of `#[target_feature]`
/// kernels whose only requirements beyond the CPU's features are what the caller checked
/// before (shapes, lengths), stated in a comment at the call. The features are the
/// macro's part: `Avx2` / `Avx512` are only made by [`Isa::detect`] after the CPU reported
/// AVX2, FMA and F16C (and AVX-512F).
macro_rules! dispatch {
    ($isa:expr, portable => $p:expr, avx2 => $a2:expr, avx512 => $a5:expr $(,)?) => {
        match $isa.0 {
            $crate::isa::IsaKind::Portable => $p,
            // SAFETY: `Avx2` is only made by `Isa::detect` after the CPU reported AVX2, FMA
            // and F16C; the caller checked what else the kernel needs.
            #[cfg(target_arch = "x86_64")]
            $crate::isa::IsaKind::Avx2 => unsafe { $a2 },
            // SAFETY: `Avx512` is only made by `Isa::detect` after the CPU reported AVX2, FMA,
            // F16C and AVX-512F; the caller checked what else the kernel needs.
            #[cfg(target_arch = "x86_64")]
            $crate::isa::IsaKind::Avx512 => unsafe { $a5 },
        }
    };
    ($isa:expr, portable => $p:expr, avx2 => $a2:expr $(,)?) => {
        match $isa.0 {
            $crate::isa::IsaKind::Portable => $p,
            // SAFETY: `Avx2` / `Avx512` are only made by `Isa::detect` after the CPU reported
            // AVX2, FMA and F16C; the caller checked what else the kernel needs.
            #[cfg(target_arch = "x86_64")]
            $crate::isa::IsaKind::Avx2 | $crate::isa::IsaKind::Avx512 => unsafe { $a2 },
        }
    };
}
pub(crate) use dispatch;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_cached_and_stable() {
        let first = Isa::detect();
        assert_eq!(
            IsaKind::from_code(DETECTED.load(Ordering::Relaxed)),
            Some(first.0)
        );
        assert_eq!(Isa::detect(), first);
        assert!(!Isa::detect().without_avx512().is_avx512());
        assert!(!Isa::PORTABLE.is_avx2());
        // Every kind survives the cache's encoding.
        assert_eq!(
            IsaKind::from_code(IsaKind::Portable.code()),
            Some(IsaKind::Portable)
        );
        #[cfg(target_arch = "x86_64")]
        for k in [IsaKind::Avx2, IsaKind::Avx512] {
            assert_eq!(IsaKind::from_code(k.code()), Some(k));
        }
        assert_eq!(IsaKind::from_code(0), None);
    }
}
