//! gear-v1's byte-oriented run-length code, byte-exact with MNN's encoder.
//!
//! A payload is a sequence of segments:
//! - literal: control byte `0..=127`, then `control + 1` bytes copied as they are;
//! - run: control byte `128..=255`, then one byte repeated `(control & 127) + 4` times.
//!
//! The encoder is greedy: at each position a run of at least [`MIN_RUN`] equal bytes
//! (capped at [`MAX_RUN`]) becomes a run segment; otherwise a literal segment grows until
//! the next position that starts such a run, or [`MAX_LITERAL`] bytes.

use crate::error::{Error, Result};

/// The shortest run the encoder turns into a run segment.
pub const MIN_RUN: usize = 4;
/// The longest run one segment holds: `127 + 4`.
pub const MAX_RUN: usize = 131;
/// The longest literal segment.
pub const MAX_LITERAL: usize = 128;

/// The largest RLE payload for `len` input bytes: all literals, one control byte per 128.
pub const fn max_encoded_len(len: usize) -> usize {
    len + len.div_ceil(MAX_LITERAL)
}

/// Length of the run of bytes equal to `data[pos]` starting at `pos`, capped at `MAX_RUN`.
#[inline]
fn run_len(data: &[u8], pos: usize) -> usize {
    let first = data[pos];
    let end = data.len().min(pos + MAX_RUN);
    data[pos..end]
        .iter()
        .position(|&b| b != first)
        .unwrap_or(end - pos)
}

/// Whether a run of at least `MIN_RUN` equal bytes starts at `pos`.
#[inline]
fn starts_run(data: &[u8], pos: usize) -> bool {
    match data.get(pos..pos + MIN_RUN) {
        Some(w) => w[0] == w[1] && w[1] == w[2] && w[2] == w[3],
        None => false,
    }
}

/// The first position `>= from` where a run of at least `MIN_RUN` equal bytes starts, or
/// `data.len()` when there is none.
///
/// Eight positions at a time: `load(j) ^ load(j + 1)` has a zero byte at `k` exactly when
/// `data[j + k] == data[j + k + 1]`, which every run start needs; blocks without one are
/// skipped whole. This is only a faster search: it finds the same position as testing
/// `starts_run` at `from`, `from + 1`, ...
#[inline]
fn next_run_start(data: &[u8], from: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let n = data.len();
    let mut j = from;
    while j + 9 <= n {
        let x = u64::from_le_bytes(data[j..j + 8].try_into().expect("8 bytes"));
        let y = u64::from_le_bytes(data[j + 1..j + 9].try_into().expect("8 bytes"));
        let d = x ^ y;
        if d.wrapping_sub(LO) & !d & HI == 0 {
            j += 8;
            continue;
        }
        for k in j..j + 8 {
            if starts_run(data, k) {
                return k;
            }
        }
        j += 8;
    }
    while j < n {
        if starts_run(data, j) {
            return j;
        }
        j += 1;
    }
    n
}

/// Receives the segments of an encoding.
trait Segments {
    fn literal(&mut self, bytes: &[u8]);
    fn run(&mut self, len: usize, byte: u8);
}

/// The greedy segmentation shared by the size count and the writer, so both agree: at a
/// run start a run (capped at `MAX_RUN`); otherwise literals up to the next run start, cut
/// into segments of at most `MAX_LITERAL` bytes.
#[inline]
fn segment(data: &[u8], sink: &mut impl Segments) {
    let n = data.len();
    let mut i = 0;
    while i < n {
        if starts_run(data, i) {
            let run = run_len(data, i);
            sink.run(run, data[i]);
            i += run;
            continue;
        }
        let end = next_run_start(data, i + 1);
        for lit in data[i..end].chunks(MAX_LITERAL) {
            sink.literal(lit);
        }
        i = end;
    }
}

struct Count(usize);

impl Segments for Count {
    #[inline]
    fn literal(&mut self, bytes: &[u8]) {
        self.0 += 1 + bytes.len();
    }
    #[inline]
    fn run(&mut self, _len: usize, _byte: u8) {
        self.0 += 2;
    }
}

struct Writer<'a> {
    out: &'a mut [u8],
    pos: usize,
}

impl Segments for Writer<'_> {
    #[inline]
    fn literal(&mut self, bytes: &[u8]) {
        self.out[self.pos] = (bytes.len() - 1) as u8;
        self.out[self.pos + 1..self.pos + 1 + bytes.len()].copy_from_slice(bytes);
        self.pos += 1 + bytes.len();
    }
    #[inline]
    fn run(&mut self, len: usize, byte: u8) {
        self.out[self.pos] = 0x80 | (len - MIN_RUN) as u8;
        self.out[self.pos + 1] = byte;
        self.pos += 2;
    }
}

/// The exact RLE payload length of `data`, without writing it.
pub fn encoded_len(data: &[u8]) -> usize {
    let mut count = Count(0);
    segment(data, &mut count);
    count.0
}

/// Writes the RLE payload of `data` to the start of `out` and returns its length.
///
/// Fails with [`Error::OutputTooSmall`] when `out` is shorter than [`encoded_len`]`(data)`.
pub fn encode_into(data: &[u8], out: &mut [u8]) -> Result<usize> {
    let needed = encoded_len(data);
    if out.len() < needed {
        return Err(Error::OutputTooSmall {
            needed,
            available: out.len(),
        });
    }
    let mut writer = Writer { out, pos: 0 };
    segment(data, &mut writer);
    debug_assert_eq!(writer.pos, needed);
    Ok(writer.pos)
}

/// Decodes the RLE `payload` of gear-v1 stream `stream`, which must fill `out` exactly.
pub fn decode_into(payload: &[u8], out: &mut [u8], stream: usize) -> Result<()> {
    let raw_len = out.len();
    let mut p = 0;
    let mut o = 0;
    while p < payload.len() {
        let ctrl = payload[p];
        if ctrl < 0x80 {
            let len = ctrl as usize + 1;
            let bytes = payload
                .get(p + 1..p + 1 + len)
                .ok_or(Error::GearV1RleTruncated { stream, offset: p })?;
            let dst = out.get_mut(o..o + len).ok_or(Error::GearV1RleOverrun {
                stream,
                offset: p,
                raw_len,
            })?;
            dst.copy_from_slice(bytes);
            p += 1 + len;
            o += len;
        } else {
            let len = (ctrl & 0x7f) as usize + MIN_RUN;
            let &byte = payload
                .get(p + 1)
                .ok_or(Error::GearV1RleTruncated { stream, offset: p })?;
            let dst = out.get_mut(o..o + len).ok_or(Error::GearV1RleOverrun {
                stream,
                offset: p,
                raw_len,
            })?;
            dst.fill(byte);
            p += 2;
            o += len;
        }
    }
    if o != raw_len {
        return Err(Error::GearV1RleUnderrun {
            stream,
            produced: o,
            raw_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; max_encoded_len(data.len())];
        let n = encode_into(data, &mut out).unwrap();
        assert_eq!(n, encoded_len(data));
        out.truncate(n);
        out
    }

    fn dec(payload: &[u8], len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        decode_into(payload, &mut out, 0).map(|()| out)
    }

    #[test]
    fn golden_runs() {
        // A run of 3 stays literal.
        assert_eq!(enc(&[9, 9, 9]), vec![0x02, 9, 9, 9]);
        // A run of 4 is the shortest run segment.
        assert_eq!(enc(&[9; 4]), vec![0x80, 9]);
        // 131 is the longest one segment holds.
        assert_eq!(enc(&[9; 131]), vec![0xff, 9]);
        // 132 = a full run then a 1-byte literal.
        assert_eq!(enc(&[9; 132]), vec![0xff, 9, 0x00, 9]);
        // 135 = two runs (131 + 4).
        assert_eq!(enc(&[9; 135]), vec![0xff, 9, 0x80, 9]);
        // Literal then run: the literal stops where the run starts.
        assert_eq!(enc(&[1, 2, 5, 5, 5, 5, 5]), vec![0x01, 1, 2, 0x81, 5]);
        // Run then 3 equal bytes then end: the tail is a literal.
        assert_eq!(enc(&[5, 5, 5, 5, 6, 6, 6]), vec![0x80, 5, 0x02, 6, 6, 6]);
        assert_eq!(enc(&[]), Vec::<u8>::new());
    }

    #[test]
    fn golden_literals() {
        let lit128: Vec<u8> = (0..128u32).map(|i| i as u8).collect();
        let mut want = vec![0x7f];
        want.extend_from_slice(&lit128);
        assert_eq!(enc(&lit128), want);

        let lit129: Vec<u8> = (0..129u32).map(|i| i as u8).collect();
        let mut want = vec![0x7f];
        want.extend_from_slice(&lit129[..128]);
        want.extend_from_slice(&[0x00, 128]);
        assert_eq!(enc(&lit129), want);
    }

    #[test]
    fn decode_errors() {
        // Truncated literal and run.
        assert!(matches!(
            dec(&[0x03, 1, 2], 4),
            Err(Error::GearV1RleTruncated { offset: 0, .. })
        ));
        assert!(matches!(
            dec(&[0x00, 1, 0x80], 5),
            Err(Error::GearV1RleTruncated { offset: 2, .. })
        ));
        // Over- and under-production.
        assert!(matches!(
            dec(&[0x80, 1], 3),
            Err(Error::GearV1RleOverrun { offset: 0, .. })
        ));
        assert!(matches!(
            dec(&[0x00, 1, 0x00, 2], 1),
            Err(Error::GearV1RleOverrun { offset: 2, .. })
        ));
        assert!(matches!(
            dec(&[0x80, 1], 5),
            Err(Error::GearV1RleUnderrun {
                produced: 4,
                raw_len: 5,
                ..
            })
        ));
        assert_eq!(dec(&[], 0).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn output_too_small() {
        let mut out = [0u8; 3];
        assert!(matches!(
            encode_into(&[1, 2, 3], &mut out),
            Err(Error::OutputTooSmall {
                needed: 4,
                available: 3
            })
        ));
    }

    /// The greedy rule written out position by position, as the format states it.
    fn reference_encode(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < data.len() {
            let run = data[i..]
                .iter()
                .take(MAX_RUN)
                .take_while(|&&b| b == data[i])
                .count();
            if run >= MIN_RUN {
                out.extend_from_slice(&[0x80 | (run - MIN_RUN) as u8, data[i]]);
                i += run;
                continue;
            }
            let start = i;
            while i < data.len() && i - start < MAX_LITERAL {
                let r = data[i..]
                    .iter()
                    .take(MIN_RUN)
                    .take_while(|&&b| b == data[i])
                    .count();
                if r >= MIN_RUN {
                    break;
                }
                i += 1;
            }
            out.push((i - start - 1) as u8);
            out.extend_from_slice(&data[start..i]);
        }
        out
    }

    #[test]
    fn fast_search_matches_the_reference_rule() {
        let mut x = 0x9e37_79b9u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for len in 0..300 {
            for alphabet in [2u32, 3, 16, 256] {
                let data: Vec<u8> = (0..len).map(|_| (next() % alphabet) as u8).collect();
                assert_eq!(
                    enc(&data),
                    reference_encode(&data),
                    "len {len} alphabet {alphabet}"
                );
            }
        }
        // Runs placed at every offset of an 8-byte block and at the end.
        for len in 4..40 {
            for at in 0..len - 3 {
                let mut data: Vec<u8> = (0..len as u32).map(|i| (i * 7 + 1) as u8).collect();
                data[at..at + 4].fill(0xaa);
                assert_eq!(enc(&data), reference_encode(&data), "len {len} at {at}");
            }
        }
    }

    #[test]
    fn round_trips_adversarial() {
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0; 1000],
            vec![0xff; 999],
            (0..1001).map(|i| (i % 2) as u8 * 0xff).collect(),
            (0..777).map(|i| (i / 3) as u8).collect(),
            (0..777).map(|i| (i / 4) as u8).collect(),
            (0..777).map(|i| (i / 5) as u8).collect(),
        ];
        let mut x = 0x1234_5678u32;
        cases.push(
            (0..5000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if x.is_multiple_of(3) {
                        0
                    } else {
                        x as u8
                    }
                })
                .collect(),
        );
        for c in cases {
            let p = enc(&c);
            assert!(p.len() <= max_encoded_len(c.len()));
            assert_eq!(dec(&p, c.len()).unwrap(), c);
        }
    }
}
