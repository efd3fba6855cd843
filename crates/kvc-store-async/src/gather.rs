//! Copying a token range between an engine layout and the canonical token-major order
//! the codecs see (`count` rows of `channels` values).

use kvc_cache::{Addressing, TensorLayout};

/// Appends tokens `[start, start + count)` of `buf` (laid out by `layout`) to `out` in
/// canonical order. The caller has checked the range against the capacity and `buf`
/// against the layout.
pub(crate) fn gather(
    buf: &[u8],
    layout: &TensorLayout,
    start: usize,
    count: usize,
    out: &mut Vec<u8>,
) {
    let row = layout.channels() * layout.dtype().size();
    let base = out.len();
    out.resize(base + count * row, 0);
    gather_into(buf, layout, start, count, &mut out[base..]);
}

/// Writes tokens `[start, start + count)` of `buf` into `out` (exactly `count` rows) in
/// canonical order; checked as [`gather`].
pub(crate) fn gather_into(
    buf: &[u8],
    layout: &TensorLayout,
    start: usize,
    count: usize,
    out: &mut [u8],
) {
    let es = layout.dtype().size();
    let row = layout.channels() * es;
    if layout.addressing() == Addressing::CellRows {
        out.copy_from_slice(&buf[start * row..(start + count) * row]);
        return;
    }
    let runs = layout.channel_runs();
    for i in 0..count {
        let to = layout.token_offset(start + i);
        for &(c0, coff, n) in &runs {
            let src = (to + coff) * es;
            let dst = i * row + c0 * es;
            out[dst..dst + n * es].copy_from_slice(&buf[src..src + n * es]);
        }
    }
}

/// Writes canonical `src` (`count` rows) into tokens `[start, start + count)` of `buf`.
pub(crate) fn scatter(
    buf: &mut [u8],
    layout: &TensorLayout,
    start: usize,
    count: usize,
    src: &[u8],
) {
    let es = layout.dtype().size();
    let row = layout.channels() * es;
    if layout.addressing() == Addressing::CellRows {
        buf[start * row..(start + count) * row].copy_from_slice(&src[..count * row]);
        return;
    }
    let runs = layout.channel_runs();
    for i in 0..count {
        let to = layout.token_offset(start + i);
        for &(c0, coff, n) in &runs {
            let dst = (to + coff) * es;
            let s = i * row + c0 * es;
            buf[dst..dst + n * es].copy_from_slice(&src[s..s + n * es]);
        }
    }
}

/// Whether tokens `[start, start + count)` of `buf` equal canonical `expect`.
pub(crate) fn equals(
    buf: &[u8],
    layout: &TensorLayout,
    start: usize,
    count: usize,
    expect: &[u8],
) -> bool {
    let es = layout.dtype().size();
    let row = layout.channels() * es;
    if expect.len() != count * row {
        return false;
    }
    if layout.addressing() == Addressing::CellRows {
        return buf[start * row..(start + count) * row] == *expect;
    }
    let mut tmp = Vec::with_capacity(count * row);
    gather(buf, layout, start, count, &mut tmp);
    tmp == expect
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvc_types::Dtype;

    #[test]
    fn gather_scatter_round_trip_every_addressing() {
        for a in [
            Addressing::CellRows,
            Addressing::CellColumns,
            Addressing::HeadMajor,
            Addressing::MnnKey { hp: 4, lp: 2 },
            Addressing::MnnValue {
                hp: 4,
                lp: 2,
                block: 16,
            },
        ] {
            let l = TensorLayout::new(a, Dtype::F16, 3, 8, 40).unwrap();
            let mut buf = vec![0u8; l.byte_len()];
            let src: Vec<u8> = (0..10 * 24 * 2).map(|i| (i * 7 % 251) as u8).collect();
            scatter(&mut buf, &l, 13, 10, &src);
            let mut back = Vec::new();
            gather(&buf, &l, 13, 10, &mut back);
            assert_eq!(back, src, "{a:?}");
            assert!(equals(&buf, &l, 13, 10, &src));
            // Element (t, h, d) lands where the layout says.
            let (t, h, d) = (15, 2, 5);
            let canon = ((t - 13) * 24 + h * 8 + d) * 2;
            let at = l.offset(t, h, d) * 2;
            assert_eq!(buf[at..at + 2], src[canon..canon + 2], "{a:?}");
            // Nothing outside the range was written.
            let mut outside = Vec::new();
            gather(&buf, &l, 0, 13, &mut outside);
            assert!(outside.iter().all(|&b| b == 0));
        }
    }
}
