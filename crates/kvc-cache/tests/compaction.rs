//! Compaction and zeroing equal a naive reference, for every layout and dtype.

use kvc_cache::{
    compact_layers, compact_shared, compact_tensor, zero_tokens, Addressing, CellTable, IndexMap,
    KvLayout, LayerMut, ReservePlan, TensorLayout,
};
use kvc_types::Dtype;
use proptest::prelude::*;

const DTYPES: [Dtype; 4] = [Dtype::F16, Dtype::Bf16, Dtype::F32, Dtype::I8];

fn addressing(i: usize, cap: usize) -> Addressing {
    match i {
        0 => Addressing::CellRows,
        1 => Addressing::CellColumns,
        2 => Addressing::HeadMajor,
        3 => Addressing::MnnKey { hp: 4, lp: 1 },
        4 => Addressing::MnnKey { hp: 8, lp: 2 },
        5 => Addressing::MnnValue {
            hp: 4,
            lp: 1,
            block: cap,
        },
        _ => Addressing::MnnValue {
            hp: 8,
            lp: 2,
            block: 5,
        },
    }
}

/// Every (token, channel) element's bytes, token-major, read through the layout.
fn logical(buf: &[u8], l: &TensorLayout) -> Vec<Vec<u8>> {
    let es = l.dtype().size();
    (0..l.capacity())
        .map(|t| {
            (0..l.channels())
                .flat_map(|c| {
                    let o = (l.token_offset(t) + l.channel_offset(c)) * es;
                    buf[o..o + es].to_vec()
                })
                .collect()
        })
        .collect()
}

/// Bytes no (token, channel) addresses (padding).
fn padding(buf: &[u8], l: &TensorLayout) -> Vec<u8> {
    let es = l.dtype().size();
    let mut used = vec![false; l.elem_count()];
    for t in 0..l.capacity() {
        for c in 0..l.channels() {
            used[l.token_offset(t) + l.channel_offset(c)] = true;
        }
    }
    used.iter()
        .enumerate()
        .filter(|(_, u)| !**u)
        .flat_map(|(i, _)| buf[i * es..(i + 1) * es].to_vec())
        .collect()
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn compaction_equals_reference(
        a in 0usize..7, d in 0usize..4, heads in 1usize..4, dim in 1usize..7, cap in 1usize..40,
        len_frac in 0.0f64..=1.0, mask_seed in any::<u64>(), seed in any::<u64>(),
    ) {
        let l = TensorLayout::new(addressing(a, cap), DTYPES[d], heads, dim, cap).unwrap();
        let len = ((cap as f64) * len_frac) as usize;
        let mask: Vec<bool> = bytes(len, mask_seed).iter().map(|b| b % 3 != 0).collect();
        let plan = ReservePlan::from_mask(&mask);
        let mut buf = bytes(l.byte_len(), seed);
        let before = logical(&buf, &l);
        let pad = padding(&buf, &l);
        let kept: Vec<usize> = (0..len).filter(|&t| mask[t]).collect();

        let n = compact_tensor(&mut buf, &l, &plan).unwrap();
        prop_assert_eq!(n, kept.len());
        let after = logical(&buf, &l);
        for (new, &old) in kept.iter().enumerate() {
            prop_assert_eq!(&after[new], &before[old], "token {} <- {}", new, old);
        }
        for t in len..cap {
            prop_assert_eq!(&after[t], &before[t], "token {} past the length moved", t);
        }
        prop_assert_eq!(padding(&buf, &l), pad);
    }

    /// Plans made of whole packed units (hP / lP / flash blocks), so that MNN's
    /// whole-unit fast path runs, including head dims with and without padding.
    #[test]
    fn unit_aligned_mnn_compaction_equals_reference(
        key in any::<bool>(), hp in prop::sample::select(vec![2usize, 4, 8]),
        lp in prop::sample::select(vec![1usize, 2, 4]), bmul in 1usize..5, boff in 0usize..2,
        d in 0usize..4, heads in 1usize..3, dim in 1usize..10, unit_sel in 0usize..3,
        units in 1usize..24, mask_seed in any::<u64>(), seed in any::<u64>(),
    ) {
        let block = bmul * lp + boff;
        let unit = [hp, lp, block][unit_sel];
        let cap = unit * units + (seed % 5) as usize;
        let a = if key {
            Addressing::MnnKey { hp, lp }
        } else {
            Addressing::MnnValue { hp, lp, block }
        };
        let l = TensorLayout::new(a, DTYPES[d], heads, dim, cap).unwrap();
        // Keep whole units, mostly in long runs, plus a few stray tokens.
        let um: Vec<u8> = bytes(units, mask_seed);
        let mut mask: Vec<bool> = (0..unit * units).map(|t| !um[t / unit].is_multiple_of(4)).collect();
        for (t, b) in bytes(mask.len(), mask_seed ^ 1).iter().enumerate() {
            if b % 29 == 0 {
                mask[t] = !mask[t];
            }
        }
        let len = mask.len();
        let plan = ReservePlan::from_mask(&mask);
        let mut buf = bytes(l.byte_len(), seed);
        let before = logical(&buf, &l);
        let pad = padding(&buf, &l);
        let kept: Vec<usize> = (0..len).filter(|&t| mask[t]).collect();
        let n = compact_tensor(&mut buf, &l, &plan).unwrap();
        prop_assert_eq!(n, kept.len());
        let after = logical(&buf, &l);
        for (new, &old) in kept.iter().enumerate() {
            prop_assert_eq!(&after[new], &before[old], "token {} <- {}", new, old);
        }
        for t in len..cap {
            prop_assert_eq!(&after[t], &before[t], "token {} past the length moved", t);
        }
        prop_assert_eq!(padding(&buf, &l), pad);
    }

    #[test]
    fn zeroing_equals_reference(
        a in 0usize..7, d in 0usize..4, heads in 1usize..4, dim in 1usize..7, cap in 1usize..40,
        s in 0usize..40, e in 0usize..40, seed in any::<u64>(),
    ) {
        let l = TensorLayout::new(addressing(a, cap), DTYPES[d], heads, dim, cap).unwrap();
        let (s, e) = (s.min(cap), e.min(cap));
        let (s, e) = (s.min(e), s.max(e));
        let mut buf = bytes(l.byte_len(), seed);
        let before = logical(&buf, &l);
        let pad = padding(&buf, &l);
        zero_tokens(&mut buf, &l, s, e).unwrap();
        let after = logical(&buf, &l);
        for t in 0..cap {
            if (s..e).contains(&t) {
                prop_assert!(after[t].iter().all(|&b| b == 0));
            } else {
                prop_assert_eq!(&after[t], &before[t]);
            }
        }
        prop_assert_eq!(padding(&buf, &l), pad);
    }
}

#[test]
fn shared_cells_move_every_layer_and_the_table() {
    let layout = KvLayout::llama(Dtype::F16, 2, 4, 4, 16, true).unwrap();
    let mut data: Vec<(Vec<u8>, Vec<u8>)> = (0..3)
        .map(|i| {
            (
                bytes(layout.k.byte_len(), i),
                bytes(layout.v.byte_len(), i + 10),
            )
        })
        .collect();
    let before: Vec<_> = data
        .iter()
        .map(|(k, v)| (logical(k, &layout.k), logical(v, &layout.v)))
        .collect();
    let mut cells = CellTable::new(16);
    for i in 0..12 {
        cells.set(i, 100 + i as i32, 0).unwrap();
    }
    let plan = ReservePlan::new(&[(0, 2), (5, 3), (10, 2)], 12).unwrap();
    let mut layers: Vec<LayerMut<'_>> = data
        .iter_mut()
        .map(|(k, v)| LayerMut::new(layout, k, v).unwrap())
        .collect();
    let map = compact_shared(&mut layers, &plan, Some(&mut cells)).unwrap();
    drop(layers);
    assert_eq!(map.new_len(), 7);
    assert_eq!(map.as_slice()[2], IndexMap::DROPPED);
    for old in 0..12 {
        if let Some(new) = map.get(old) {
            assert_eq!(cells.get(new).unwrap().pos, 100 + old as i32);
            for (li, (k, v)) in data.iter().enumerate() {
                assert_eq!(logical(k, &layout.k)[new], before[li].0[old]);
                assert_eq!(logical(v, &layout.v)[new], before[li].1[old]);
            }
        }
    }
    assert!(cells.cells()[7..].iter().all(|c| !c.is_used()));
}

#[test]
fn per_layer_plans_and_errors() {
    let layout = KvLayout::infinilm(Dtype::Bf16, 2, 8, 10).unwrap();
    let mut a = (bytes(layout.k.byte_len(), 1), bytes(layout.v.byte_len(), 2));
    let mut b = (bytes(layout.k.byte_len(), 3), bytes(layout.v.byte_len(), 4));
    let mut layers = vec![
        LayerMut::new(layout, &mut a.0, &mut a.1).unwrap(),
        LayerMut::new(layout, &mut b.0, &mut b.1).unwrap(),
    ];
    let plans = [
        ReservePlan::new(&[(1, 3)], 10).unwrap(),
        ReservePlan::new(&[(0, 1), (9, 1)], 10).unwrap(),
    ];
    assert_eq!(compact_layers(&mut layers, &plans).unwrap(), vec![3, 2]);
    // A plan longer than the capacity is refused before anything moves.
    let too_long = [
        ReservePlan::new(&[(0, 1)], 11).unwrap(),
        ReservePlan::new(&[(0, 1)], 5).unwrap(),
    ];
    assert!(compact_layers(&mut layers, &too_long).is_err());
    assert!(compact_layers(&mut layers, &plans[..1]).is_err());
    let mut small = vec![0u8; 3];
    assert!(compact_tensor(&mut small, &layout.k, &plans[0]).is_err());
}
