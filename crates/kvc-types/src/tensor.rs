//! Which tensor of a KV cache: keys or values.

/// K or V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tensor {
    /// Keys.
    K,
    /// Values.
    V,
}

impl Tensor {
    /// Both, keys first.
    pub const ALL: [Tensor; 2] = [Tensor::K, Tensor::V];

    /// `"K"` or `"V"`.
    pub const fn name(self) -> &'static str {
        match self {
            Tensor::K => "K",
            Tensor::V => "V",
        }
    }
}

impl std::fmt::Display for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Tensor;

    #[test]
    fn names() {
        assert_eq!(Tensor::ALL.map(Tensor::name), ["K", "V"]);
        assert_eq!(Tensor::V.to_string(), "V");
    }
}
