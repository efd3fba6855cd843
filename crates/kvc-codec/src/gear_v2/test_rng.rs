//! The unit tests' pseudo-random numbers: xorshift64 (shifts 13, 7, 17), so that every test
//! module draws its data the same way from its own seed.

/// xorshift64 with the shifts 13, 7 and 17; the state must not be 0.
pub(crate) struct XorShift64(pub(crate) u64);

impl XorShift64 {
    /// The next state, which is also the number drawn.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
