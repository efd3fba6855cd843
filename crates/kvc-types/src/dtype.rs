//! The element types a KV-cache tensor may hold.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor: what a cache, a codec or a converter is handed.
///
/// Every value is little-endian in kvc's own files. The numeric [`Dtype::code`] is the C
/// API's `kvc_dtype` value and the `dtype_code` of the compressor weight file (`.bin` v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary16, 2 bytes (code 0).
    F16,
    /// bfloat16, the upper half of an IEEE binary32, 2 bytes (code 1).
    Bf16,
    /// IEEE binary32, 4 bytes (code 2).
    F32,
    /// Signed 8-bit integers (int8 C8-quantized caches), 1 byte (code 3).
    I8,
}

impl Dtype {
    /// Every dtype, in code order.
    pub const ALL: [Dtype; 4] = [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8];

    /// Bytes per element (for a byte-plane codec, also the number of byte streams an
    /// element splits into).
    pub const fn size(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::I8 => 1,
        }
    }

    /// Whether this is a floating-point type (what C8 quantizes from).
    pub const fn is_float(self) -> bool {
        self.float().is_some()
    }

    /// This type as a member of the float subset, `None` for [`Dtype::I8`].
    pub const fn float(self) -> Option<FloatDtype> {
        match self {
            Dtype::F16 => Some(FloatDtype::F16),
            Dtype::Bf16 => Some(FloatDtype::Bf16),
            Dtype::F32 => Some(FloatDtype::F32),
            Dtype::I8 => None,
        }
    }

    /// The short name used on command lines and in file names: `f16`, `bf16`, `f32`, `i8`.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::I8 => "i8",
        }
    }

    /// The dtype whose [`Dtype::name`] is `name`.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The C API's `kvc_dtype` value (`KVC_DTYPE_F16` = 0, `_BF16` = 1, `_F32` = 2,
    /// `_I8` = 3), also the `.bin` v1 weight file's `dtype_code`.
    pub const fn code(self) -> u32 {
        match self {
            Dtype::F16 => 0,
            Dtype::Bf16 => 1,
            Dtype::F32 => 2,
            Dtype::I8 => 3,
        }
    }

    /// The dtype whose [`Dtype::code`] is `code`.
    pub fn from_code(code: u32) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.code() == code)
    }
}

/// The float subset of [`Dtype`] (every value but `I8`): what converts to and from `f32`
/// without a scale, so what a float-only place takes (`kvc_convert`, the `.bin` v1 weight
/// file, a raw cache the CLI reads). Its names and codes are [`Dtype`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// IEEE binary16 ([`Dtype::F16`]).
    F16,
    /// bfloat16 ([`Dtype::Bf16`]).
    Bf16,
    /// IEEE binary32 ([`Dtype::F32`]).
    F32,
}

impl FloatDtype {
    /// Every float dtype, in code order.
    pub const ALL: [FloatDtype; 3] = [FloatDtype::F16, FloatDtype::Bf16, FloatDtype::F32];

    /// The same type as a [`Dtype`].
    pub const fn dtype(self) -> Dtype {
        match self {
            FloatDtype::F16 => Dtype::F16,
            FloatDtype::Bf16 => Dtype::Bf16,
            FloatDtype::F32 => Dtype::F32,
        }
    }

    /// Bytes per element ([`Dtype::size`]).
    pub const fn size(self) -> usize {
        self.dtype().size()
    }

    /// `f16`, `bf16` or `f32` ([`Dtype::name`]).
    pub const fn name(self) -> &'static str {
        self.dtype().name()
    }

    /// [`Dtype::code`].
    pub const fn code(self) -> u32 {
        self.dtype().code()
    }

    /// The float dtype whose [`Dtype::code`] is `code`; `None` for an unknown code and
    /// for `i8`'s.
    pub const fn from_code(code: u32) -> Option<FloatDtype> {
        match code {
            0 => Some(FloatDtype::F16),
            1 => Some(FloatDtype::Bf16),
            2 => Some(FloatDtype::F32),
            _ => None,
        }
    }
}

impl From<FloatDtype> for Dtype {
    fn from(d: FloatDtype) -> Dtype {
        d.dtype()
    }
}

impl fmt::Display for FloatDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is none of `f16`, `bf16`, `f32`, `i8`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDtype {
    /// The name given.
    pub name: String,
}

impl fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown dtype {:?} (expected f16, bf16, f32 or i8)",
            self.name
        )
    }
}

impl std::error::Error for UnknownDtype {}

impl FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Self, UnknownDtype> {
        Dtype::from_name(s).ok_or_else(|| UnknownDtype {
            name: s.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip_and_unknown_is_an_error() {
        for (i, d) in Dtype::ALL.into_iter().enumerate() {
            assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
            assert_eq!(Dtype::from_code(d.code()), Some(d));
            assert_eq!(d.code() as usize, i);
        }
        assert_eq!(Dtype::from_code(4), None);
        let err = "fp16".parse::<Dtype>().unwrap_err();
        assert_eq!(err.name, "fp16");
        assert_eq!(
            [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8].map(Dtype::size),
            [2, 2, 4, 1]
        );
        assert!(Dtype::Bf16.is_float() && !Dtype::I8.is_float());
        for code in 0..5 {
            let float = Dtype::from_code(code).and_then(Dtype::float);
            assert_eq!(FloatDtype::from_code(code), float, "code {code}");
        }
        for f in FloatDtype::ALL {
            assert_eq!(f.dtype().float(), Some(f));
            assert_eq!((f.name(), f.size(), f.code()), {
                let d = Dtype::from(f);
                (d.name(), d.size(), d.code())
            });
        }
    }
}
