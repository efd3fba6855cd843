//! How engines lay out one layer's K and V in memory.
//!
//! Every layout kvc knows is *separable*: the element index of token `t`, channel
//! `c = head * head_dim + dim` is `token_offset(t) + channel_offset(c)`. The operations in
//! this crate rely on that, and on a layout's elements for distinct `(t, c)` being
//! distinct and below [`TensorLayout::elem_count`].

use crate::error::{Error, Result};
use kvc_types::Dtype;

/// How token and channel indices map to element indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Addressing {
    /// One row of `channels` elements per cell: llama.cpp K, and V when not transposed
    /// (ggml `[n_embd_gqa, kv_size]`, `ne0` = channels). Element `t * C + c`.
    CellRows,
    /// llama.cpp V stored transposed (flash attention off): the same tensor read as
    /// `[kv_size, n_embd_v_gqa]`. Element `c * capacity + t`.
    CellColumns,
    /// InfiniLM StaticKVCache `[H, S_max, D]`, contiguous. Element
    /// `h * capacity * D + t * D + d`.
    HeadMajor,
    /// MNN CPUKVCacheManager packed key (float path), per head
    /// `[ceil(cap/hP), ceil(D/lP), hP, lP]`; see `keyIndex` in MNN.
    MnnKey {
        /// MNN's `hP` pack.
        hp: usize,
        /// MNN's `lP` pack.
        lp: usize,
    },
    /// MNN CPUKVCacheManager packed value (float path), per head
    /// `[ceil(cap/B), ceil(D/hP), ceil(B/lP), hP, lP]` with `B` the flash-attention block
    /// (`mFlashAttentionUpperKv`; equal to the capacity when flash attention is off).
    MnnValue {
        /// MNN's `hP` pack.
        hp: usize,
        /// MNN's `lP` pack.
        lp: usize,
        /// `mFlashAttentionUpperKv`.
        block: usize,
    },
}

/// One tensor (K or V) of one layer: shape, addressing and dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    addressing: Addressing,
    dtype: Dtype,
    n_heads: usize,
    head_dim: usize,
    capacity: usize,
    elem_count: usize,
    /// Elements per head for the MNN layouts (0 otherwise).
    head_stride: usize,
}

fn mul(a: usize, b: usize, what: &'static str) -> Result<usize> {
    a.checked_mul(b).ok_or(Error::SizeOverflow { what })
}

fn round_up(a: usize, m: usize, what: &'static str) -> Result<usize> {
    mul(a.div_ceil(m), m, what)
}

fn nonzero(field: &'static str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(Error::InvalidShape {
            field,
            value,
            reason: "must be at least 1",
        });
    }
    Ok(())
}

impl TensorLayout {
    /// A layout of `n_heads x head_dim` channels and `capacity` token slots.
    ///
    /// Rejects zero dimensions and sizes (in bytes) that overflow `usize` or `isize`.
    pub fn new(
        addressing: Addressing,
        dtype: Dtype,
        n_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<TensorLayout> {
        nonzero("n_heads", n_heads)?;
        nonzero("head_dim", head_dim)?;
        nonzero("capacity", capacity)?;
        let channels = mul(n_heads, head_dim, "channels")?;
        let (elem_count, head_stride) = match addressing {
            Addressing::CellRows | Addressing::CellColumns | Addressing::HeadMajor => {
                (mul(channels, capacity, "elements")?, 0)
            }
            Addressing::MnnKey { hp, lp } => {
                nonzero("hp", hp)?;
                nonzero("lp", lp)?;
                let per_head = mul(
                    round_up(capacity, hp, "key rows")?,
                    round_up(head_dim, lp, "key dims")?,
                    "key size per head",
                )?;
                (mul(per_head, n_heads, "elements")?, per_head)
            }
            Addressing::MnnValue { hp, lp, block } => {
                nonzero("hp", hp)?;
                nonzero("lp", lp)?;
                nonzero("block", block)?;
                let per_block = mul(
                    round_up(head_dim, hp, "value dims")?,
                    round_up(block, lp, "value block")?,
                    "value block size",
                )?;
                let per_head = mul(capacity.div_ceil(block), per_block, "value size per head")?;
                (mul(per_head, n_heads, "elements")?, per_head)
            }
        };
        let bytes = mul(elem_count, dtype.size(), "bytes")?;
        if bytes > isize::MAX as usize {
            return Err(Error::SizeOverflow { what: "bytes" });
        }
        Ok(TensorLayout {
            addressing,
            dtype,
            n_heads,
            head_dim,
            capacity,
            elem_count,
            head_stride,
        })
    }

    /// The addressing scheme.
    pub fn addressing(&self) -> Addressing {
        self.addressing
    }
    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// KV heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }
    /// Elements per head and token.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Channels per token (`n_heads * head_dim`), llama.cpp's `n_embd_k_gqa`.
    pub fn channels(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Token slots (llama.cpp `kv_size`, InfiniLM `S_max`, MNN `mMaxLength`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Elements the buffer must hold (padding included).
    pub fn elem_count(&self) -> usize {
        self.elem_count
    }
    /// Bytes the buffer must hold.
    pub fn byte_len(&self) -> usize {
        self.elem_count * self.dtype.size()
    }
    /// For MNN layouts, bytes between heads (`mCurrentKeySizePerHead` /
    /// `mCurrentValueSizePerHead`); 0 for the others.
    pub fn mnn_head_bytes(&self) -> usize {
        self.head_stride * self.dtype.size()
    }

    /// The same layout with another element type (e.g. `I8` for the quantized copy).
    pub fn with_dtype(&self, dtype: Dtype) -> Result<TensorLayout> {
        TensorLayout::new(
            self.addressing,
            dtype,
            self.n_heads,
            self.head_dim,
            self.capacity,
        )
    }

    /// The part of the element index that depends on the token only. `t < capacity`.
    #[inline]
    pub fn token_offset(&self, t: usize) -> usize {
        match self.addressing {
            Addressing::CellRows => t * self.channels(),
            Addressing::CellColumns => t,
            Addressing::HeadMajor => t * self.head_dim,
            Addressing::MnnKey { hp, lp } => {
                (t / hp) * self.head_dim.div_ceil(lp) * lp * hp + (t % hp) * lp
            }
            Addressing::MnnValue { hp, lp, block } => {
                let stride1 = block.div_ceil(lp) * hp * lp;
                let stride0 = stride1 * self.head_dim.div_ceil(hp);
                let sib = t % block;
                (t / block) * stride0 + (sib / lp) * hp * lp + sib % lp
            }
        }
    }

    /// The part of the element index that depends on the channel only.
    /// `c < channels()`.
    #[inline]
    pub fn channel_offset(&self, c: usize) -> usize {
        let (h, d) = (c / self.head_dim, c % self.head_dim);
        match self.addressing {
            Addressing::CellRows => c,
            Addressing::CellColumns => c * self.capacity,
            Addressing::HeadMajor => h * self.capacity * self.head_dim + d,
            Addressing::MnnKey { hp, lp } => h * self.head_stride + (d / lp) * hp * lp + d % lp,
            Addressing::MnnValue { hp, lp, block } => {
                let stride1 = block.div_ceil(lp) * hp * lp;
                h * self.head_stride + (d / hp) * stride1 + (d % hp) * lp
            }
        }
    }

    /// Element index of token `t`, head `h`, dim `d`.
    #[inline]
    pub fn offset(&self, t: usize, h: usize, d: usize) -> usize {
        self.token_offset(t) + self.channel_offset(h * self.head_dim + d)
    }

    /// Maximal runs of channels with consecutive element offsets:
    /// `(first channel, channel offset of it, run length)`.
    pub fn channel_runs(&self) -> Vec<(usize, usize, usize)> {
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for c in 0..self.channels() {
            let off = self.channel_offset(c);
            match runs.last_mut() {
                Some((_, start, len)) if *start + *len == off => *len += 1,
                _ => runs.push((c, off, 1)),
            }
        }
        runs
    }

    /// Checks that `buf` is long enough for this layout.
    pub fn check_buffer(&self, what: &'static str, len: usize) -> Result<()> {
        if len < self.byte_len() {
            return Err(Error::BufferTooSmall {
                what,
                needed: self.byte_len(),
                found: len,
            });
        }
        Ok(())
    }
}

/// A layer's K and V layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// The K tensor.
    pub k: TensorLayout,
    /// The V tensor.
    pub v: TensorLayout,
}

impl KvLayout {
    /// K and V; they must have the same capacity (tokens are shared).
    pub fn new(k: TensorLayout, v: TensorLayout) -> Result<KvLayout> {
        if k.capacity() != v.capacity() {
            return Err(Error::LayoutMismatch {
                what: "K/V capacity",
                expected: k.capacity(),
                found: v.capacity(),
            });
        }
        Ok(KvLayout { k, v })
    }

    /// llama.cpp: K `[n_embd_k_gqa, kv_size]`, V `[n_embd_v_gqa, kv_size]`, or V
    /// transposed when `v_trans` (llama.cpp does so when flash attention is off). For a
    /// cache with `n_stream > 1`, stream `s` starts `s * n_embd * kv_size` elements into
    /// each tensor: pass that sub-slice.
    pub fn llama(
        dtype: Dtype,
        n_head_kv: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_size: usize,
        v_trans: bool,
    ) -> Result<KvLayout> {
        let k = TensorLayout::new(Addressing::CellRows, dtype, n_head_kv, head_dim_k, kv_size)?;
        let va = if v_trans {
            Addressing::CellColumns
        } else {
            Addressing::CellRows
        };
        let v = TensorLayout::new(va, dtype, n_head_kv, head_dim_v, kv_size)?;
        KvLayout::new(k, v)
    }

    /// InfiniLM StaticKVCache: K and V each `[H, S_max, D]`, contiguous.
    pub fn infinilm(
        dtype: Dtype,
        n_heads: usize,
        head_dim: usize,
        s_max: usize,
    ) -> Result<KvLayout> {
        let k = TensorLayout::new(Addressing::HeadMajor, dtype, n_heads, head_dim, s_max)?;
        KvLayout::new(k, k)
    }

    /// MNN CPU backend, float (non-quantized) KV: `hp`/`lp` are the backend's matmul
    /// pack (`MNNGetMatMulPackMode`), `max_length` is `mMaxLength`, `flash_block` is
    /// `mFlashAttentionUpperKv` (`None` when flash attention is off, meaning the whole
    /// `max_length`).
    pub fn mnn(
        dtype: Dtype,
        kv_num_head: usize,
        head_dim: usize,
        max_length: usize,
        hp: usize,
        lp: usize,
        flash_block: Option<usize>,
    ) -> Result<KvLayout> {
        let k = TensorLayout::new(
            Addressing::MnnKey { hp, lp },
            dtype,
            kv_num_head,
            head_dim,
            max_length,
        )?;
        let block = flash_block.unwrap_or(max_length);
        let v = TensorLayout::new(
            Addressing::MnnValue { hp, lp, block },
            dtype,
            kv_num_head,
            head_dim,
            max_length,
        )?;
        KvLayout::new(k, v)
    }

    /// Token slots.
    pub fn capacity(&self) -> usize {
        self.k.capacity()
    }

    /// Both tensors with another element type.
    pub fn with_dtype(&self, dtype: Dtype) -> Result<KvLayout> {
        KvLayout::new(self.k.with_dtype(dtype)?, self.v.with_dtype(dtype)?)
    }
}

/// A layer's K and V in memory someone else owns (an engine, or kvc's paged storage).
#[derive(Debug)]
pub struct LayerMut<'a> {
    layout: KvLayout,
    k: &'a mut [u8],
    v: &'a mut [u8],
}

impl<'a> LayerMut<'a> {
    /// Borrows K and V; each buffer must be at least its layout's `byte_len`.
    pub fn new(layout: KvLayout, k: &'a mut [u8], v: &'a mut [u8]) -> Result<LayerMut<'a>> {
        layout.k.check_buffer("K", k.len())?;
        layout.v.check_buffer("V", v.len())?;
        Ok(LayerMut { layout, k, v })
    }
    /// The layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }
    /// K bytes.
    pub fn k(&self) -> &[u8] {
        self.k
    }
    /// V bytes.
    pub fn v(&self) -> &[u8] {
        self.v
    }
    /// K and V bytes, mutably.
    pub fn kv_mut(&mut self) -> (&mut [u8], &mut [u8]) {
        (self.k, self.v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injective(l: &TensorLayout) {
        let mut seen = vec![false; l.elem_count()];
        for t in 0..l.capacity() {
            for c in 0..l.channels() {
                let o = l.token_offset(t) + l.channel_offset(c);
                assert!(o < l.elem_count(), "{l:?} t={t} c={c} o={o}");
                assert!(!seen[o], "{l:?} collides at t={t} c={c}");
                seen[o] = true;
            }
        }
    }

    #[test]
    fn all_layouts_are_in_bounds_and_injective() {
        let addrs = [
            Addressing::CellRows,
            Addressing::CellColumns,
            Addressing::HeadMajor,
            Addressing::MnnKey { hp: 4, lp: 1 },
            Addressing::MnnKey { hp: 8, lp: 2 },
            Addressing::MnnKey { hp: 16, lp: 4 },
            Addressing::MnnValue {
                hp: 4,
                lp: 1,
                block: 8,
            },
            Addressing::MnnValue {
                hp: 8,
                lp: 2,
                block: 6,
            },
            Addressing::MnnValue {
                hp: 16,
                lp: 4,
                block: 37,
            },
        ];
        for a in addrs {
            for (h, d, cap) in [(1, 1, 1), (3, 5, 13), (2, 8, 37), (3, 64, 20)] {
                injective(&TensorLayout::new(a, Dtype::F16, h, d, cap).unwrap());
            }
        }
    }

    #[test]
    fn mnn_matches_the_manager_formulas() {
        // keyIndex(seq, dim) and valueIndex(seq, dim) from MNN's CPUKVCacheManager.cpp.
        let (hp, lp, d_, b) = (8usize, 2usize, 10usize, 6usize);
        let k = TensorLayout::new(Addressing::MnnKey { hp, lp }, Dtype::F32, 2, d_, 19).unwrap();
        let v = TensorLayout::new(
            Addressing::MnnValue { hp, lp, block: b },
            Dtype::F32,
            2,
            d_,
            19,
        )
        .unwrap();
        for seq in 0..19 {
            for dim in 0..d_ {
                let key = (seq / hp) * d_.div_ceil(lp) * lp * hp
                    + (dim / lp) * hp * lp
                    + (seq % hp) * lp
                    + dim % lp;
                assert_eq!(k.offset(seq, 0, dim), key);
                assert_eq!(
                    k.offset(seq, 1, dim),
                    key + 19usize.div_ceil(hp) * hp * d_.div_ceil(lp) * lp
                );
                let s1 = b.div_ceil(lp) * hp * lp;
                let s0 = s1 * d_.div_ceil(hp);
                let sib = seq % b;
                let val = (seq / b) * s0
                    + (dim / hp) * s1
                    + (sib / lp) * hp * lp
                    + (dim % hp) * lp
                    + sib % lp;
                assert_eq!(v.offset(seq, 0, dim), val);
            }
        }
        // mCurrentValueSizePerHead = UP_DIV(max, B) * ROUND_UP(D, hP) * ROUND_UP(B, lP) * bytes.
        assert_eq!(v.mnn_head_bytes(), 19usize.div_ceil(b) * 16 * 6 * 4);
        assert_eq!(k.mnn_head_bytes(), 24 * 10 * 4);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(TensorLayout::new(Addressing::CellRows, Dtype::F16, 0, 4, 4).is_err());
        assert!(
            TensorLayout::new(Addressing::MnnKey { hp: 0, lp: 1 }, Dtype::F16, 1, 4, 4).is_err()
        );
        let e =
            TensorLayout::new(Addressing::CellRows, Dtype::F32, usize::MAX / 2, 4, 4).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow { .. }));
        let e = KvLayout::new(
            TensorLayout::new(Addressing::CellRows, Dtype::F16, 1, 4, 4).unwrap(),
            TensorLayout::new(Addressing::CellRows, Dtype::F16, 1, 4, 5).unwrap(),
        )
        .unwrap_err();
        assert!(matches!(e, Error::LayoutMismatch { .. }));
        let l = KvLayout::infinilm(Dtype::F16, 2, 4, 8).unwrap();
        let (mut k, mut v) = (vec![0u8; l.k.byte_len() - 1], vec![0u8; l.v.byte_len()]);
        assert!(matches!(
            LayerMut::new(l, &mut k, &mut v),
            Err(Error::BufferTooSmall { .. })
        ));
    }
}
