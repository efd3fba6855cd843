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
        !matches!(self, Dtype::I8)
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
    }
}
