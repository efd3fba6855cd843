//! The element types a KV-cache tensor may hold, and how many byte streams each splits into.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The element type of a tensor handed to a codec.
///
/// The codecs never interpret values: a dtype only fixes the element width, which is the
/// number of byte streams (lanes) a tensor is split into. fp16 and bf16 are treated alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary16, 2 bytes, little-endian.
    F16,
    /// bfloat16, 2 bytes, little-endian.
    Bf16,
    /// IEEE binary32, 4 bytes, little-endian.
    F32,
    /// Signed 8-bit integers (int8 quantized caches), 1 byte.
    I8,
}

impl Dtype {
    /// Every dtype, in a fixed order.
    pub const ALL: [Dtype; 4] = [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8];

    /// Bytes per element, which is also the number of byte streams the element splits into.
    pub const fn width(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::I8 => 1,
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
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| Error::UnknownDtype {
                name: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for d in Dtype::ALL {
            assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
        }
        let err = "fp16".parse::<Dtype>().unwrap_err();
        assert!(matches!(err, Error::UnknownDtype { ref name } if name == "fp16"));
    }
}
