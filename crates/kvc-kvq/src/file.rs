//! The kvq packed cache file (`KVCKVQPK`, version 1): a whole K or V cache
//! `[layer][token][kv_head][head_dim]` in one file with a versioned, self-describing
//! header (the config string or plan, the shape, the K channel group), then the packed
//! rows of every layer (or, for K with a channel group, blocks and an f16 tail). `kvc
//! quant apply --kvq` writes it and `kvc quant dequant --kvq` reads it. Format:
//! `docs/formats/kvq.md`, "Packed cache files"; golden files per version:
//! `tests/golden/kvq-file-v1-*.bin` (`tests/file_golden.rs`).
//!
//! Writing: [`Header::new`] checks a shape and spec, [`Header::encode`] gives the header's
//! bytes, then [`encode_layer`] appends each layer (or [`encode`] does it all). Reading:
//! [`parse`] checks the header field by field and by its FNV-1a 64 checksum ([`fnv1a64`])
//! and the body's length, which must be exactly what the header implies; [`decode_with`]
//! (or [`decode`]) then decodes layer by layer. Parsing never allocates more than the
//! header's spec text and never indexes past the buffer. Errors: [`Error::FileShape`] and
//! [`Error::FileValues`] for what a writer is given, [`Error::BadFile`] and
//! [`Error::FileData`] for what a reader is given.

use std::collections::HashMap;

use half::f16;

use crate::channel_group::GROUPS;
use crate::config::MAX_PLAN_LAYERS;
use crate::{row_bytes, ChannelGroupCodec, Error, KvqConfig, KvqPlan, Method, Result, RowCodec};

fn shape_err(reason: impl Into<String>) -> Error {
    Error::FileShape {
        reason: reason.into(),
    }
}

fn bad(reason: impl Into<String>) -> Error {
    Error::BadFile {
        reason: reason.into(),
    }
}

/// The first 8 bytes of every packed cache file.
pub const MAGIC: [u8; 8] = *b"KVCKVQPK";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Bytes of the fixed part of the header, before the spec text.
pub const FIXED: usize = 36;
/// Bytes of the checksum after the spec text.
pub const CHECKSUM: usize = 8;

/// Which tensor a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tensor {
    /// Keys.
    K,
    /// Values.
    V,
}

impl Tensor {
    fn code(self) -> u8 {
        match self {
            Tensor::K => 0,
            Tensor::V => 1,
        }
    }

    /// `K` or `V`.
    pub fn name(self) -> &'static str {
        match self {
            Tensor::K => "K",
            Tensor::V => "V",
        }
    }
}

/// What the bits come from: a config string (every layer alike) or a plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// A config string, stored in its canonical form.
    Config(KvqConfig),
    /// A plan, stored as compact JSON.
    Plan(Box<KvqPlan>),
}

impl Spec {
    fn kind(&self) -> u8 {
        match self {
            Spec::Config(_) => 0,
            Spec::Plan(_) => 1,
        }
    }

    /// The text stored in the header.
    pub fn text(&self) -> String {
        match self {
            Spec::Config(c) => c.to_string(),
            // Serializing plain fields cannot fail.
            Spec::Plan(p) => serde_json::to_string(p).unwrap_or_default(),
        }
    }

    /// The spec as a plan for `layers` layers of `kv_heads` heads of `head_dim`, checked
    /// against that shape ([`Error::FileShape`], or the plan's own error).
    pub fn plan(&self, layers: usize, kv_heads: usize, head_dim: usize) -> Result<KvqPlan> {
        let p = match self {
            Spec::Config(c) => {
                let (d, h) = (
                    u32::try_from(head_dim).map_err(|_| shape_err("head_dim too large"))?,
                    u32::try_from(kv_heads).map_err(|_| shape_err("kv_heads too large"))?,
                );
                KvqPlan::uniform(c, d, h, layers)
            }
            Spec::Plan(p) => (**p).clone(),
        };
        p.validate()?;
        if p.head_dim as usize != head_dim || p.n_kv_head as usize != kv_heads {
            return Err(shape_err(format!(
                "the plan is for head_dim {} and {} KV heads, the cache has head_dim {head_dim} and {kv_heads} KV heads",
                p.head_dim, p.n_kv_head
            )));
        }
        if p.layers.len() != layers {
            return Err(shape_err(format!(
                "the plan has {} layers, the cache has {layers}",
                p.layers.len()
            )));
        }
        Ok(p)
    }
}

/// A checked header: what a file holds and where each layer's bytes lie.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// K or V.
    pub tensor: Tensor,
    /// The config or plan.
    pub spec: Spec,
    /// The spec as a plan for this shape (validated).
    pub plan: KvqPlan,
    /// Layers.
    pub layers: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Values per row.
    pub head_dim: usize,
    /// Tokens per layer.
    pub tokens: usize,
    /// K coded per channel over groups of this many tokens (K files only); `None`: rows.
    pub channel_group: Option<usize>,
}

impl Header {
    /// Makes a header, checking that the spec fits the shape and every field fits its
    /// u32 ([`Error::FileShape`], or the spec's own error).
    pub fn new(
        tensor: Tensor,
        spec: Spec,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        tokens: usize,
        channel_group: Option<usize>,
    ) -> Result<Header> {
        for (what, x) in [
            ("layers", layers),
            ("kv_heads", kv_heads),
            ("head_dim", head_dim),
            ("tokens", tokens),
        ] {
            if x == 0 || u32::try_from(x).is_err() {
                return Err(shape_err(format!(
                    "{what} {x} does not fit a kvq packed file (1..=2^32-1)"
                )));
            }
        }
        if layers > MAX_PLAN_LAYERS {
            return Err(shape_err(format!(
                "{layers} layers (a kvq plan holds at most {MAX_PLAN_LAYERS})"
            )));
        }
        if let Some(g) = channel_group {
            if tensor != Tensor::K || !GROUPS.contains(&g) {
                return Err(shape_err(format!(
                    "a channel group ({g} tokens) is for K only, of 16, 32, 64, 128 or 256 tokens"
                )));
            }
        }
        let plan = spec.plan(layers, kv_heads, head_dim)?;
        let h = Header {
            tensor,
            spec,
            plan,
            layers,
            kv_heads,
            head_dim,
            tokens,
            channel_group,
        };
        if u32::try_from(h.spec.text().len()).is_err() {
            return Err(shape_err("the plan's JSON is over 4 GiB"));
        }
        for i in 0..layers {
            h.layer_bytes(i)?;
        }
        Ok(h)
    }

    /// Bits of layer `i` for this tensor.
    pub fn bits(&self, i: usize) -> u8 {
        let l = &self.plan.layers[i];
        match self.tensor {
            Tensor::K => l.k_bits,
            Tensor::V => l.v_bits,
        }
    }

    /// The rotation method of every layer.
    pub fn method(&self) -> Method {
        // `plan` was validated when the header was made.
        self.plan.method().unwrap_or(Method::LloydMax)
    }

    /// Values in one layer: `tokens * kv_heads * head_dim` (checked when the header was
    /// made, as the layer's bytes are).
    pub fn layer_values(&self) -> usize {
        self.tokens * self.kv_heads * self.head_dim
    }

    /// Bytes of layer `i`'s section of the body.
    pub fn layer_bytes(&self, i: usize) -> Result<usize> {
        layer_bytes(
            self.method(),
            self.bits(i),
            self.kv_heads,
            self.head_dim,
            self.tokens,
            self.channel_group,
        )
    }

    /// The header's bytes (with its checksum).
    pub fn encode(&self) -> Vec<u8> {
        let text = self.spec.text();
        let mut h = Vec::with_capacity(FIXED + text.len() + CHECKSUM);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.push(self.tensor.code());
        h.push(self.spec.kind());
        for x in [
            self.layers,
            self.kv_heads,
            self.head_dim,
            self.tokens,
            self.channel_group.unwrap_or(0),
            text.len(),
        ] {
            // Shapes were checked to fit in u32 when the header was made.
            h.extend_from_slice(&(x as u32).to_le_bytes());
        }
        h.extend_from_slice(text.as_bytes());
        let sum = fnv1a64(&h);
        h.extend_from_slice(&sum.to_le_bytes());
        h
    }
}

/// Bytes of one layer's section: `kv_heads * tokens` rows, or with a channel group
/// `kv_heads * (tokens / G)` blocks then `(tokens % G) * kv_heads` f16 rows.
pub fn layer_bytes(
    method: Method,
    bits: u8,
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
    channel_group: Option<usize>,
) -> Result<usize> {
    let over = || shape_err("the shape overflows");
    match channel_group {
        None => {
            let rb = row_bytes(method, bits, head_dim)?;
            kv_heads
                .checked_mul(tokens)
                .and_then(|n| n.checked_mul(rb))
                .ok_or_else(over)
        }
        Some(g) => {
            let c = ChannelGroupCodec::new(bits, head_dim, g)?;
            let blocks = kv_heads
                .checked_mul(tokens / g)
                .and_then(|n| n.checked_mul(c.block_bytes()))
                .ok_or_else(over)?;
            let tail = (tokens % g)
                .checked_mul(kv_heads)
                .and_then(|n| n.checked_mul(head_dim))
                .and_then(|n| n.checked_mul(2))
                .ok_or_else(over)?;
            blocks.checked_add(tail).ok_or_else(over)
        }
    }
}

/// FNV-1a 64 (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`): the header's
/// checksum, kvc's one implementation in `kvc-types`.
pub use kvc_types::fnv1a64;

/// Parses a whole file expected to hold `tensor`: the header, checked field by field and
/// by its checksum, and the body's length, which must be exactly what the header implies.
/// Returns the header and the body's offset. Every refusal is [`Error::BadFile`].
pub fn parse(file: &[u8], tensor: Tensor) -> Result<(Header, usize)> {
    if file.len() < FIXED {
        return Err(bad(format!(
            "{} bytes, shorter than the {FIXED}-byte fixed header (truncated?)",
            file.len()
        )));
    }
    if file[..8] != MAGIC {
        return Err(bad(format!(
            "magic is {:?}, expected {:?}",
            String::from_utf8_lossy(&file[..8]),
            String::from_utf8_lossy(&MAGIC)
        )));
    }
    let u16_at = |o: usize| u16::from_le_bytes([file[o], file[o + 1]]);
    let u32_at =
        |o: usize| u32::from_le_bytes([file[o], file[o + 1], file[o + 2], file[o + 3]]) as usize;
    let version = u16_at(8);
    if version != VERSION {
        return Err(bad(format!(
            "format version {version}, this kvc reads version {VERSION}"
        )));
    }
    let spec_len = u32_at(32);
    let header_len = FIXED
        .checked_add(spec_len)
        .and_then(|n| n.checked_add(CHECKSUM))
        .ok_or_else(|| bad("spec length overflows"))?;
    if file.len() < header_len {
        return Err(bad(format!(
            "{} bytes, shorter than its {header_len}-byte header (truncated?)",
            file.len()
        )));
    }
    let text_end = FIXED + spec_len;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&file[text_end..header_len]);
    let (stored, computed) = (u64::from_le_bytes(sum), fnv1a64(&file[..text_end]));
    if stored != computed {
        return Err(bad(format!(
            "header checksum {stored:#018x}, the header's bytes give {computed:#018x} (corrupt header)"
        )));
    }
    let found = match file[10] {
        0 => Tensor::K,
        1 => Tensor::V,
        t => return Err(bad(format!("tensor code {t} (0: K, 1: V)"))),
    };
    if found != tensor {
        return Err(bad(format!(
            "holds {}, expected {}",
            found.name(),
            tensor.name()
        )));
    }
    let text = std::str::from_utf8(&file[FIXED..text_end])
        .map_err(|e| bad(format!("spec text is not UTF-8: {e}")))?;
    let spec = match file[11] {
        0 => Spec::Config(KvqConfig::parse(text).map_err(|e| bad(e.to_string()))?),
        1 => Spec::Plan(Box::new(
            KvqPlan::from_json(text).map_err(|e| bad(e.to_string()))?,
        )),
        k => return Err(bad(format!("spec kind {k} (0: config, 1: plan)"))),
    };
    let (layers, kv_heads, head_dim, tokens, group) =
        (u32_at(12), u32_at(16), u32_at(20), u32_at(24), u32_at(28));
    let channel_group = (group != 0).then_some(group);
    let h = Header::new(
        tensor,
        spec,
        layers,
        kv_heads,
        head_dim,
        tokens,
        channel_group,
    )
    .map_err(|e| bad(e.to_string()))?;
    let mut body = 0usize;
    for i in 0..layers {
        body = h
            .layer_bytes(i)
            .ok()
            .and_then(|n| body.checked_add(n))
            .ok_or_else(|| bad("body size overflows"))?;
    }
    let have = file.len() - header_len;
    if have != body {
        return Err(bad(format!(
            "the header says {body} body bytes ({layers} layers x {tokens} tokens x {kv_heads} heads), the file has {have}{}",
            if have < body { " (truncated)" } else { "" }
        )));
    }
    Ok((h, header_len))
}

/// The row codecs of one file by bits (a codec's codebook and rotation are worth making
/// once per file, not once per layer).
#[derive(Debug)]
pub struct Codecs {
    method: Method,
    seed: u64,
    head_dim: usize,
    rows: HashMap<u8, RowCodec>,
}

impl Codecs {
    /// No codec yet, for `h`'s method, seed and head_dim.
    pub fn new(h: &Header) -> Codecs {
        Codecs {
            method: h.method(),
            seed: h.plan.seed,
            head_dim: h.head_dim,
            rows: HashMap::new(),
        }
    }

    fn row(&mut self, bits: u8) -> Result<&RowCodec> {
        use std::collections::hash_map::Entry;
        Ok(match self.rows.entry(bits) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                e.insert(RowCodec::new(self.method, bits, self.head_dim, self.seed)?)
            }
        })
    }
}

/// Codes layer `i` of a cache (`x`: [`Header::layer_values`] values,
/// `[token][kv_head][head_dim]`), appending exactly [`Header::layer_bytes`] bytes to
/// `out`, and puts the decoded values in `back` (as long as `x`). A value the codec
/// refuses, or one outside f16's range in the f16 tail of an unfilled channel group, is
/// [`Error::FileValues`] naming its layer, token and head; wrong lengths are
/// [`Error::LayoutMismatch`].
pub fn encode_layer(
    h: &Header,
    i: usize,
    codecs: &mut Codecs,
    x: &[f32],
    out: &mut Vec<u8>,
    back: &mut [f32],
) -> Result<()> {
    let (d, nh, nt) = (h.head_dim, h.kv_heads, h.tokens);
    for (what, found) in [("layer values", x.len()), ("decoded values", back.len())] {
        if found != h.layer_values() {
            return Err(Error::LayoutMismatch {
                what,
                expected: h.layer_values(),
                found,
            });
        }
    }
    if i >= h.layers {
        return Err(Error::MissingLayer {
            layer: i,
            which: "kvq packed file layer",
        });
    }
    let bits = h.bits(i);
    let at = |t: usize, hd: usize| (t * nh + hd) * d;
    let ctx = |e: Error, t: usize, hd: usize| Error::FileValues {
        reason: format!("layer {i} token {t} head {hd}: {e}"),
    };
    match h.channel_group {
        None => {
            let c = codecs.row(bits)?;
            let rb = c.row_bytes();
            let mut row = vec![0u8; rb];
            for t in 0..nt {
                for hd in 0..nh {
                    let o = at(t, hd);
                    c.quantize_row(&x[o..o + d], &mut row)
                        .map_err(|e| ctx(e, t, hd))?;
                    c.dequantize_row(&row, &mut back[o..o + d])
                        .map_err(|e| ctx(e, t, hd))?;
                    out.extend_from_slice(&row);
                }
            }
        }
        Some(g) => {
            let gctx = |e: Error, t: usize, hd: usize| Error::FileValues {
                reason: format!(
                    "layer {i} head {hd}, the channel group of tokens {t}..{}: {e}",
                    t + g
                ),
            };
            let c = ChannelGroupCodec::new(bits, d, g)?;
            let mut rows = vec![0f32; g * d];
            let mut dec = vec![0f32; g * d];
            let mut block = vec![0u8; c.block_bytes()];
            for hd in 0..nh {
                for b in 0..nt / g {
                    for r in 0..g {
                        let o = at(b * g + r, hd);
                        rows[r * d..(r + 1) * d].copy_from_slice(&x[o..o + d]);
                    }
                    c.quantize_block(&rows, &mut block)
                        .map_err(|e| gctx(e, b * g, hd))?;
                    c.dequantize_block(&block, &mut dec)
                        .map_err(|e| gctx(e, b * g, hd))?;
                    for r in 0..g {
                        let o = at(b * g + r, hd);
                        back[o..o + d].copy_from_slice(&dec[r * d..(r + 1) * d]);
                    }
                    out.extend_from_slice(&block);
                }
            }
            // The last partial group: f16 rows, as an engine holds them until it fills.
            for t in nt / g * g..nt {
                for hd in 0..nh {
                    let o = at(t, hd);
                    for (j, &v) in x[o..o + d].iter().enumerate() {
                        let hv = f16::from_f32(v);
                        if !hv.is_finite() {
                            return Err(Error::FileValues {
                                reason: format!(
                                    "layer {i} token {t} head {hd} value {j} ({v}) is outside f16's range (kept in f16 as the tail of an unfilled channel group)"
                                ),
                            });
                        }
                        out.extend_from_slice(&hv.to_le_bytes());
                        back[o + j] = hv.to_f32();
                    }
                }
            }
        }
    }
    Ok(())
}

/// Decodes layer `i`'s section `sec` (exactly [`Header::layer_bytes`] bytes) into `back`
/// ([`Header::layer_values`] values, `[token][kv_head][head_dim]`). A row or block whose
/// scale, step or minimum is not finite, or a non-finite f16 tail value, is
/// [`Error::FileData`] naming its layer, token and head.
pub fn decode_layer(
    h: &Header,
    i: usize,
    codecs: &mut Codecs,
    sec: &[u8],
    back: &mut [f32],
) -> Result<()> {
    let (d, nh, nt) = (h.head_dim, h.kv_heads, h.tokens);
    if i >= h.layers {
        return Err(Error::MissingLayer {
            layer: i,
            which: "kvq packed file layer",
        });
    }
    for (what, expected, found) in [
        ("layer section bytes", h.layer_bytes(i)?, sec.len()),
        ("decoded values", h.layer_values(), back.len()),
    ] {
        if found != expected {
            return Err(Error::LayoutMismatch {
                what,
                expected,
                found,
            });
        }
    }
    let bits = h.bits(i);
    let at = |t: usize, hd: usize| (t * nh + hd) * d;
    let ctx = |e: Error, t: usize, hd: usize| Error::FileData {
        reason: format!("layer {i} token {t} head {hd}: {e}"),
    };
    match h.channel_group {
        None => {
            let c = codecs.row(bits)?;
            for (n, row) in sec.chunks_exact(c.row_bytes()).enumerate() {
                let (t, hd) = (n / nh, n % nh);
                let o = at(t, hd);
                c.dequantize_row(row, &mut back[o..o + d])
                    .map_err(|e| ctx(e, t, hd))?;
            }
        }
        Some(g) => {
            let gctx = |e: Error, t: usize, hd: usize| Error::FileData {
                reason: format!(
                    "layer {i} head {hd}, the channel group of tokens {t}..{}: {e}",
                    t + g
                ),
            };
            let c = ChannelGroupCodec::new(bits, d, g)?;
            let mut dec = vec![0f32; g * d];
            let nb = nt / g;
            // `sec` is exactly the layer's length (checked above), so every block is there.
            for (n, block) in sec.chunks_exact(c.block_bytes()).take(nh * nb).enumerate() {
                let (hd, b) = (n / nb, n % nb);
                c.dequantize_block(block, &mut dec)
                    .map_err(|e| gctx(e, b * g, hd))?;
                for r in 0..g {
                    let o = at(b * g + r, hd);
                    back[o..o + d].copy_from_slice(&dec[r * d..(r + 1) * d]);
                }
            }
            // The f16 tail: the writer refuses a value outside f16's range, so a non-finite
            // one is corruption, not data.
            let tail = &sec[nh * nb * c.block_bytes()..];
            let o = nb * g * nh * d;
            for (n, (v, b)) in back[o..].iter_mut().zip(tail.chunks_exact(2)).enumerate() {
                let hv = f16::from_le_bytes([b[0], b[1]]);
                if !hv.is_finite() {
                    let (t, hd, j) = (nb * g + n / (nh * d), n / d % nh, n % d);
                    return Err(Error::FileData {
                        reason: format!(
                            "layer {i} token {t} head {hd} value {j} of the f16 tail (the unfilled channel group) is {} (corrupt data)",
                            hv.to_f32()
                        ),
                    });
                }
                *v = hv.to_f32();
            }
        }
    }
    Ok(())
}

/// Codes a whole cache (`x`: `[layer][token][kv_head][head_dim]`, `h.layers` times
/// [`Header::layer_values`] values) to a whole file: the header, then every layer.
pub fn encode(h: &Header, x: &[f32]) -> Result<Vec<u8>> {
    let n = h.layer_values();
    let total = n.checked_mul(h.layers).ok_or(Error::SizeOverflow {
        what: "kvq packed file values",
    })?;
    if x.len() != total {
        return Err(Error::LayoutMismatch {
            what: "kvq packed file values",
            expected: total,
            found: x.len(),
        });
    }
    let mut codecs = Codecs::new(h);
    let mut out = h.encode();
    let mut back = vec![0f32; n];
    for (i, layer) in x.chunks_exact(n).enumerate() {
        encode_layer(h, i, &mut codecs, layer, &mut out, &mut back)?;
    }
    Ok(out)
}

/// Parses a whole file ([`parse`]) and decodes it layer by layer, giving `each` the layer
/// number and its [`Header::layer_values`] decoded values (`[token][kv_head][head_dim]`)
/// in order; one layer's values are held at a time. Returns the header.
pub fn decode_with(
    file: &[u8],
    tensor: Tensor,
    mut each: impl FnMut(usize, &[f32]),
) -> Result<Header> {
    let (h, mut at) = parse(file, tensor)?;
    let mut codecs = Codecs::new(&h);
    let mut back = vec![0f32; h.layer_values()];
    for i in 0..h.layers {
        let n = h.layer_bytes(i)?;
        // `parse` checked the body's length, so this is there.
        let sec = file.get(at..at + n).ok_or_else(|| Error::FileData {
            reason: format!("layer {i} is truncated"),
        })?;
        decode_layer(&h, i, &mut codecs, sec, &mut back)?;
        each(i, &back);
        at += n;
    }
    Ok(h)
}

/// Parses and decodes a whole file to its header and all its values,
/// `[layer][token][kv_head][head_dim]`.
pub fn decode(file: &[u8], tensor: Tensor) -> Result<(Header, Vec<f32>)> {
    let mut out = Vec::new();
    let h = decode_with(file, tensor, |_, v| out.extend_from_slice(v))?;
    Ok((h, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensor: Tensor, spec: Spec, group: Option<usize>, tokens: usize) -> Vec<u8> {
        let h = Header::new(tensor, spec, 2, 1, 64, tokens, group).unwrap();
        let mut f = h.encode();
        let body: usize = (0..2).map(|i| h.layer_bytes(i).unwrap()).sum();
        f.extend((0..body).map(|i| (i * 7 + 3) as u8));
        f
    }

    fn cases() -> Vec<(Tensor, Vec<u8>)> {
        let cfg = KvqConfig::parse("k4v2:u32").unwrap();
        let mut plan = KvqPlan::uniform(&KvqConfig::parse("k5v3").unwrap(), 64, 1, 2);
        plan.layers[1].k_bits = 3;
        vec![
            (Tensor::K, file(Tensor::K, Spec::Config(cfg), None, 3)),
            (Tensor::V, file(Tensor::V, Spec::Config(cfg), None, 3)),
            (
                Tensor::K,
                file(Tensor::K, Spec::Plan(Box::new(plan.clone())), None, 2),
            ),
            (
                Tensor::V,
                file(Tensor::V, Spec::Plan(Box::new(plan.clone())), None, 2),
            ),
            (
                Tensor::K,
                file(Tensor::K, Spec::Plan(Box::new(plan)), Some(16), 19),
            ),
        ]
    }

    #[test]
    fn whole_files_parse_and_every_truncation_is_an_error() {
        for (t, f) in cases() {
            let (h, at) = parse(&f, t).unwrap();
            assert_eq!(h.encode().len(), at);
            assert_eq!(h.encode(), f[..at]);
            for n in 0..f.len() {
                let e = parse(&f[..n], t).unwrap_err();
                assert_eq!(e.kind(), crate::ErrorKind::CorruptData, "{n}: {e}");
                assert!(e.to_string().contains("not a valid kvq packed file"), "{e}");
            }
            let mut longer = f.clone();
            longer.push(0);
            assert!(parse(&longer, t).is_err());
            let other = if t == Tensor::K { Tensor::V } else { Tensor::K };
            assert!(parse(&f, other).unwrap_err().to_string().contains("holds"));
        }
    }

    #[test]
    fn every_flipped_header_bit_is_an_error() {
        for (t, f) in cases() {
            let (_, at) = parse(&f, t).unwrap();
            for i in 0..at {
                for bit in 0..8 {
                    let mut g = f.clone();
                    g[i] ^= 1 << bit;
                    assert!(parse(&g, t).is_err(), "byte {i} bit {bit}");
                }
                let mut g = f.clone();
                g[i] ^= 0xff;
                assert!(parse(&g, t).is_err(), "byte {i} ^ 0xff");
            }
        }
    }

    #[test]
    fn bad_fields_with_a_good_checksum_name_the_field() {
        let (_, f) = &cases()[0];
        let (_, at) = parse(f, Tensor::K).unwrap();
        let text_end = at - CHECKSUM;
        let reseal = |mut g: Vec<u8>| {
            let s = fnv1a64(&g[..text_end]);
            g[text_end..at].copy_from_slice(&s.to_le_bytes());
            g
        };
        let edit = |o: usize, v: &[u8]| {
            let mut g = f.clone();
            g[o..o + v.len()].copy_from_slice(v);
            reseal(g)
        };
        let err = |g: Vec<u8>| parse(&g, Tensor::K).unwrap_err().to_string();
        assert!(err(edit(8, &2u16.to_le_bytes())).contains("version 2"));
        assert!(err(edit(10, &[7])).contains("tensor code 7"));
        assert!(err(edit(11, &[9])).contains("spec kind 9"));
        assert!(err(edit(12, &0u32.to_le_bytes())).contains("layers 0"));
        assert!(err(edit(20, &96u32.to_le_bytes())).contains("head_dim"));
        assert!(err(edit(24, &4u32.to_le_bytes())).contains("truncated"));
        assert!(err(edit(28, &17u32.to_le_bytes())).contains("channel group"));
        assert!(err(edit(FIXED, b"q")).contains("k<bits>"));
    }

    /// A whole packed file of 2 layers x `tokens` tokens x 2 heads x 64 dims of
    /// deterministic data, as `kvc quant apply --kvq` writes it.
    fn packed(tensor: Tensor, spec: &str, group: Option<usize>, tokens: usize) -> Vec<u8> {
        let spec = Spec::Config(KvqConfig::parse(spec).unwrap());
        let h = Header::new(tensor, spec, 2, 2, 64, tokens, group).unwrap();
        let mut codecs = Codecs::new(&h);
        let n = tokens * 2 * 64;
        let mut out = h.encode();
        let mut back = vec![0f32; n];
        for i in 0..2 {
            let x: Vec<f32> = (0..n)
                .map(|j| ((j * 37 + i * 11) % 101) as f32 / 17.0 - 3.0)
                .collect();
            encode_layer(&h, i, &mut codecs, &x, &mut out, &mut back).unwrap();
            let (mut sig, mut noise) = (0f64, 0f64);
            for (a, b) in x.iter().zip(&back) {
                sig += f64::from(*a).powi(2);
                noise += f64::from(a - b).powi(2);
            }
            let snr = 10.0 * (sig / noise).log10();
            assert!(snr > 5.0, "{snr}");
        }
        out
    }

    #[test]
    fn every_truncation_and_a_corrupt_scale_are_errors_not_panics() {
        let row0 = "layer 0 token 0 head 0";
        let group0 = "layer 0 head 0, the channel group of tokens 0..16";
        for (tensor, f, scale_at, expect) in [
            (Tensor::K, packed(Tensor::K, "k3v2:u32", None, 5), 0, row0),
            (Tensor::V, packed(Tensor::V, "k3v2", None, 5), 0, row0),
            (
                Tensor::K,
                packed(Tensor::K, "k4v4", Some(16), 21),
                2 * 5,
                group0,
            ),
        ] {
            let (h, vals) = decode(&f, tensor).unwrap();
            assert_eq!(vals.len(), 2 * h.tokens * 2 * 64);
            for n in 0..f.len() {
                let e = decode(&f[..n], tensor).unwrap_err();
                assert!(matches!(e, Error::BadFile { .. }), "{n}: {e}");
            }
            // An f16 NaN where the first row's scale (or the first block's 6th step) is.
            let (_, body) = parse(&f, tensor).unwrap();
            let mut g = f.clone();
            g[body + scale_at..body + scale_at + 2].copy_from_slice(&[0xff, 0x7f]);
            let e = decode(&g, tensor).unwrap_err();
            assert!(matches!(e, Error::FileData { .. }), "{e}");
            assert_eq!(e.kind(), crate::ErrorKind::CorruptData);
            assert!(e.to_string().contains(expect), "{e}");
        }
    }

    /// Found by fuzz/fuzz_targets/kvq_file.rs: a NaN or infinite f16 in the tail of an
    /// unfilled channel group was decoded as is (the writer never writes one).
    #[test]
    fn a_non_finite_f16_tail_value_is_an_error_naming_it() {
        // 2 layers x 21 tokens x 2 heads x 64: one group of 16 per head, then 5 tail tokens.
        let f = packed(Tensor::K, "k4v4", Some(16), 21);
        let (h, body) = parse(&f, Tensor::K).unwrap();
        let tail_at = body + h.layer_bytes(0).unwrap() - 5 * 2 * 64 * 2;
        // Layer 0, tail token 2 (token 18), head 1, value 7.
        let at = tail_at + ((2 * 2 + 1) * 64 + 7) * 2;
        for bad in [[0x00, 0x7e], [0x00, 0x7c], [0x00, 0xfc]] {
            let mut g = f.clone();
            g[at..at + 2].copy_from_slice(&bad);
            let e = decode(&g, Tensor::K).unwrap_err();
            assert!(matches!(e, Error::FileData { .. }), "{e}");
            assert!(
                e.to_string()
                    .contains("layer 0 token 18 head 1 value 7 of the f16 tail"),
                "{e}"
            );
        }
        // The largest finite f16 there is data.
        let mut g = f.clone();
        g[at..at + 2].copy_from_slice(&[0xff, 0x7b]);
        let (_, out) = decode(&g, Tensor::K).unwrap();
        assert_eq!(out[(18 * 2 + 1) * 64 + 7], 65504.0);
    }

    #[test]
    fn the_writer_refuses_values_it_cannot_hold_and_wrong_lengths() {
        let spec = Spec::Config(KvqConfig::parse("k4v4").unwrap());
        let h = Header::new(Tensor::K, spec, 2, 2, 64, 21, Some(16)).unwrap();
        let mut x = vec![0.5f32; 2 * h.layer_values()];
        // Layer 1, token 17 (the f16 tail), head 0, value 3.
        x[h.layer_values() + 17 * 2 * 64 + 3] = 1e6;
        let e = encode(&h, &x).unwrap_err();
        assert!(matches!(e, Error::FileValues { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("layer 1 token 17 head 0 value 3 (1000000) is outside f16's range"),
            "{e}"
        );
        x[h.layer_values() + 2 * 64 + 5] = f32::NAN;
        let e = encode(&h, &x).unwrap_err();
        assert!(
            e.to_string()
                .contains("layer 1 head 0, the channel group of tokens 0..16"),
            "{e}"
        );
        assert!(matches!(
            encode(&h, &x[1..]),
            Err(Error::LayoutMismatch { .. })
        ));
        let mut out = Vec::new();
        let mut back = vec![0f32; h.layer_values()];
        let mut codecs = Codecs::new(&h);
        let y = vec![0f32; h.layer_values()];
        assert!(matches!(
            encode_layer(&h, 2, &mut codecs, &y, &mut out, &mut back),
            Err(Error::MissingLayer { layer: 2, .. })
        ));
        assert!(matches!(
            decode_layer(&h, 0, &mut codecs, &[0u8; 3], &mut back),
            Err(Error::LayoutMismatch { .. })
        ));
        assert!(out.is_empty());
    }
}
