//! Building the shared-shape decoder's tables from a cluster's canonical codes: the
//! one-symbol tables ("halves") and the two-symbol tables the lane loop reads.
//!
//! Both are indexed by the next [`BITS`] stream bits (LSB-first) and hold `u32` entries in
//! the layout `shared_decode` documents. A half entry is laid out as the second symbol of a
//! pair entry: `len | ctx << 11 | sym << (SYM_AT + SYM) | 1 << COUNT_AT`, so that a pair is a
//! first symbol's fields plus a half. Halves are filled by doubling
//! (`huffman::fill_by_doubling`, as the grouped coder's one-symbol tables are). A pair table
//! is filled in index order: the entry at `i` decodes its first symbol from the context's
//! half at `i` and the second from the next context's half at `i >> l1`, when both codes fit
//! in `BITS` bits. That loop has an AVX2 version (eight entries per step, one gather of the second
//! halves), chosen at run time, and a portable one.
//!
//! Not here: reading and validating the tables' code lengths (`huffman`), the lane loop and
//! the model section (`shared_decode`).

use super::huffman::{self, Code};
use super::shared_decode::{BITS, COUNT_AT, CTX_BIT, ENTRIES, SYM_AT};

/// The half entry of symbol `sym` with code length `len`; `ctx_on` (0 or 1) says whether
/// the symbol's top bit selects the next context.
#[inline]
pub(crate) fn half_entry<const SYM: u32>(sym: u32, len: u32, ctx_on: u32) -> u32 {
    len | ((sym >> (SYM - 1)) & ctx_on) << 11 | sym << (SYM_AT + SYM) | 1 << COUNT_AT
}

/// Fills `halves` (one context's [`ENTRIES`]) with the half entries of `codes` (grouped by
/// length, shortest first, as `huffman::canonical_codes` orders them) by doubling. The codes must
/// be complete (Kraft sum 1) for every entry to be written; a table of one symbol of length
/// 1 names it as both code words.
pub(crate) fn fill_halves<const SYM: u32>(codes: &[Code], ctx_on: u32, halves: &mut [u32]) {
    huffman::fill_by_doubling(codes, &mut halves[..ENTRIES], |len, sym| {
        half_entry::<SYM>(sym, len, ctx_on)
    });
}

/// Fills the pair table `pairs` of context `x` from `halves` (both contexts' half tables,
/// context 1's at [`ENTRIES`]; the second is only read when the halves set context bits).
pub(crate) fn fill_pairs<const SYM: u32>(halves: &[u32], x: usize, pairs: &mut [u32]) {
    let halves: &[u32; 2 * ENTRIES] = halves[..2 * ENTRIES].try_into().expect("two contexts");
    let pairs: &mut [u32; ENTRIES] = (&mut pairs[..ENTRIES]).try_into().expect("one context");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && !super::low_bits::force_portable() {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { fill_pairs_avx2::<SYM>(halves, x, pairs) };
        return;
    }
    fill_pairs_portable::<SYM>(halves, x, pairs, 0);
}

/// The pair entry at index `i` whose first symbol is the half entry `f`, given the half
/// entry `s` that the index's remaining bits decode in the context `f` selects.
#[inline(always)]
fn pair_entry<const SYM: u32>(f: u32, s: u32) -> u32 {
    let l1 = f & 15;
    let sym1 = (f >> (SYM_AT + SYM)) & ((1 << SYM) - 1);
    let base = l1 | sym1 << SYM_AT | 1 << COUNT_AT;
    if l1 + (s & 15) <= BITS {
        base + s
    } else {
        base | (f & CTX_BIT)
    }
}

/// Portable [`fill_pairs`], from index `from` on.
pub(crate) fn fill_pairs_portable<const SYM: u32>(
    halves: &[u32; 2 * ENTRIES],
    x: usize,
    pairs: &mut [u32; ENTRIES],
    from: usize,
) {
    let first = &halves[x * ENTRIES..(x + 1) * ENTRIES];
    for i in from..ENTRIES {
        let f = first[i];
        let j = (f & CTX_BIT) as usize + (i >> (f & 15));
        pairs[i] = pair_entry::<SYM>(f, halves[j & (2 * ENTRIES - 1)]);
    }
}

/// AVX2 [`fill_pairs`]: eight entries per step, the second halves gathered.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_pairs_avx2<const SYM: u32>(
    halves: &[u32; 2 * ENTRIES],
    x: usize,
    pairs: &mut [u32; ENTRIES],
) {
    use std::arch::x86_64::*;
    let first = &halves[x * ENTRIES..(x + 1) * ENTRIES];
    let fifteen = _mm256_set1_epi32(15);
    let ctx = _mm256_set1_epi32(CTX_BIT as i32);
    let index_mask = _mm256_set1_epi32(2 * ENTRIES as i32 - 1);
    let sym_mask = _mm256_set1_epi32((1 << SYM) - 1);
    let sym_at = _mm_cvtsi32_si128((SYM_AT + SYM) as i32);
    let count1 = _mm256_set1_epi32(1 << COUNT_AT);
    let most = _mm256_set1_epi32(BITS as i32 + 1);
    let step = _mm256_set1_epi32(8);
    let mut index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for i in (0..ENTRIES).step_by(8) {
        // SAFETY: AVX2 is enabled on this function; `i + 8 <= ENTRIES` (ENTRIES is a
        // multiple of 8), so the load reads entries of `first` and the store writes entries
        // of `pairs`; every gathered index is masked below 2 * ENTRIES, inside `halves`.
        // Loads and stores are unaligned.
        unsafe {
            let f = _mm256_loadu_si256(first.as_ptr().add(i) as *const __m256i);
            let l1 = _mm256_and_si256(f, fifteen);
            let j = _mm256_add_epi32(_mm256_and_si256(f, ctx), _mm256_srlv_epi32(index, l1));
            let j = _mm256_and_si256(j, index_mask);
            let s = _mm256_i32gather_epi32::<4>(halves.as_ptr() as *const i32, j);
            let sym1 = _mm256_and_si256(_mm256_srl_epi32(f, sym_at), sym_mask);
            let base = _mm256_or_si256(
                _mm256_or_si256(l1, _mm256_slli_epi32::<{ SYM_AT as i32 }>(sym1)),
                count1,
            );
            let one = _mm256_or_si256(base, _mm256_and_si256(f, ctx));
            let fits = _mm256_cmpgt_epi32(most, _mm256_add_epi32(l1, _mm256_and_si256(s, fifteen)));
            let pair = _mm256_add_epi32(base, s);
            let r = _mm256_blendv_epi8(one, pair, fits);
            _mm256_storeu_si256(pairs.as_mut_ptr().add(i) as *mut __m256i, r);
            index = _mm256_add_epi32(index, step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gear_v2::huffman::{canonical_codes, SYM_SHIFT};

    /// Used-symbol lists (`sym << SYM_SHIFT | len`) of complete codes over 8-bit symbols.
    fn used(lens: &[(u32, u32)]) -> Vec<u16> {
        let mut u: Vec<u16> = lens
            .iter()
            .map(|&(s, l)| (s << SYM_SHIFT | l) as u16)
            .collect();
        u.sort_by_key(|&e| e >> SYM_SHIFT);
        u
    }

    fn halves_of(lists: [&[u16]; 2]) -> Vec<u32> {
        let mut halves = vec![0u32; 2 * ENTRIES];
        for (x, u) in lists.iter().enumerate() {
            let mut codes = [(0, 0, 0); 512];
            let n = canonical_codes(u, &mut codes);
            fill_halves::<8>(&codes[..n], 1, &mut halves[x * ENTRIES..]);
        }
        halves
    }

    #[test]
    fn halves_match_the_reference_decode_table() {
        let u = used(&[(0, 1), (1, 3), (0x80, 3), (0x81, 3), (2, 4), (0x82, 4)]);
        let mut reference = vec![0u16; ENTRIES];
        huffman::build_decode_table_bits(&u, &mut reference, BITS);
        let halves = halves_of([&u, &u]);
        for (i, &r) in reference.iter().enumerate() {
            let sym = r as u32 >> SYM_SHIFT;
            assert_eq!(
                halves[i],
                half_entry::<8>(sym, r as u32 & 15, 1),
                "index {i}"
            );
        }
    }

    #[test]
    fn pair_entries_match_two_half_lookups_in_both_versions() {
        let a = used(&[(0, 1), (1, 3), (0x80, 3), (0x81, 3), (2, 4), (0x82, 4)]);
        // A flatter code, with an 11-bit tail so that some pairs do not fit.
        let mut b = vec![(0, 2), (0x80, 2), (1, 2), (0x81, 3)];
        b.extend((0..4).map(|k| (0x10 + k, 6)));
        b.extend((0..4).map(|k| (0x20 + k, 7)));
        b.extend((0..64).map(|k| (0x30 + k, 11)));
        let b = used(&b);
        let halves = halves_of([&a, &b]);
        let halves: &[u32; 2 * ENTRIES] = halves[..].try_into().unwrap();
        let (mut short, mut long) = (0, 0);
        for x in 0..2 {
            let mut portable = [0u32; ENTRIES];
            fill_pairs_portable::<8>(halves, x, &mut portable, 0);
            let mut best = [0u32; ENTRIES];
            fill_pairs::<8>(halves, x, &mut best);
            assert_eq!(portable, best, "context {x}");
            for (i, &e) in portable.iter().enumerate() {
                let f = halves[x * ENTRIES + i];
                let (l1, s1) = (f & 15, (f >> (SYM_AT + 8)) & 0xff);
                assert_eq!((e >> SYM_AT) & 0xff, s1);
                let x1 = (s1 >> 7) as usize;
                let s = halves[x1 * ENTRIES + (i >> l1)];
                let (l2, s2) = (s & 15, (s >> (SYM_AT + 8)) & 0xff);
                if l1 + l2 <= BITS {
                    short += 1;
                    assert_eq!(e >> COUNT_AT, 2);
                    assert_eq!(e & 15, l1 + l2);
                    assert_eq!((e >> (SYM_AT + 8)) & 0xff, s2);
                    assert_eq!((e & CTX_BIT) >> 11, s2 >> 7);
                } else {
                    long += 1;
                    assert_eq!(e >> COUNT_AT, 1);
                    assert_eq!(e & 15, l1);
                    assert_eq!((e & CTX_BIT) >> 11, x1 as u32);
                }
            }
        }
        assert!(
            short > 0 && long > 0,
            "both kinds of entry: {short} / {long}"
        );
    }
}
