//! Element types of the tensors the codecs handle.

/// The element type of a KV-cache tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the top half of an f32).
    Bf16,
    /// IEEE 754 binary32.
    F32,
    /// Signed 8-bit integers (quantized caches).
    I8,
}

impl Dtype {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::I8 => 1,
        }
    }

    /// The lower-case name used on command lines and in docs (`f16`, `bf16`, `f32`, `i8`).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::I8 => "i8",
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
