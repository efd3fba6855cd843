//! LSB-first bit streams for the Huffman coder.

/// Appends codes LSB-first to a byte vector.
pub struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    /// Starts writing at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, n: 0 }
    }

    /// Appends the low `len` bits of `code` (`len <= 24`).
    #[inline(always)]
    pub fn put(&mut self, code: u32, len: u32) {
        self.acc |= (code as u64) << self.n;
        self.n += len;
        if self.n >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.n -= 32;
        }
    }

    /// Flushes the last partial byte (zero-padded).
    pub fn finish(self) {
        let bytes = self.n.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..bytes]);
    }
}

/// Reads up to 57 bits at bit position `pos` of `s`, LSB-first; bytes past the end read as 0.
#[inline(always)]
pub fn peek(s: &[u8], pos: usize) -> u64 {
    let b = pos >> 3;
    let w = if let Some(bytes) = s.get(b..b + 8) {
        let mut a = [0u8; 8];
        a.copy_from_slice(bytes);
        u64::from_le_bytes(a)
    } else {
        let mut a = [0u8; 8];
        if b < s.len() {
            let tail = &s[b..];
            a[..tail.len()].copy_from_slice(tail);
        }
        u64::from_le_bytes(a)
    };
    w >> (pos & 7)
}
