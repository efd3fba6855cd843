//! The kvq packed cache file that `kvc quant apply --kvq` writes and `kvc quant dequant
//! --kvq` reads: a versioned, self-describing header (the config string or plan, the
//! shape, the K channel group), then one tensor's packed rows (or, for K with a channel
//! group, blocks and an f16 tail). Format: `docs/formats/kvq.md`, "Packed cache files".
//!
//! The header is checked field by field and by its FNV-1a 64 checksum; the body length
//! must be exactly what the header implies. Parsing never allocates more than the header's
//! spec text and never indexes past the buffer.

use kvc_kvq::channel_group::GROUPS;
use kvc_kvq::config::MAX_PLAN_LAYERS;
use kvc_kvq::{row_bytes, ChannelGroupCodec, KvqConfig, KvqPlan, Method};

use crate::cli_error::CliError;

/// The first 8 bytes of every packed cache file.
pub const MAGIC: [u8; 8] = *b"KVCKVQPK";
/// The format version this `kvc` writes and reads.
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
    /// against that shape.
    pub fn plan(&self, layers: usize, kv_heads: usize, head_dim: usize) -> Result<KvqPlan, String> {
        let p = match self {
            Spec::Config(c) => {
                let (d, h) = (
                    u32::try_from(head_dim).map_err(|_| "head_dim too large".to_string())?,
                    u32::try_from(kv_heads).map_err(|_| "kv_heads too large".to_string())?,
                );
                KvqPlan::uniform(c, d, h, layers)
            }
            Spec::Plan(p) => (**p).clone(),
        };
        p.validate().map_err(|e| e.to_string())?;
        if p.head_dim as usize != head_dim || p.n_kv_head as usize != kv_heads {
            return Err(format!(
                "the plan is for head_dim {} and {} KV heads, the cache has head_dim {head_dim} and {kv_heads} KV heads",
                p.head_dim, p.n_kv_head
            ));
        }
        if p.layers.len() != layers {
            return Err(format!(
                "the plan has {} layers, the cache has {layers}",
                p.layers.len()
            ));
        }
        Ok(p)
    }
}

/// A parsed header and where each layer's bytes lie.
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

    /// Bytes of layer `i`'s section of the body.
    pub fn layer_bytes(&self, i: usize) -> Result<usize, String> {
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
) -> Result<usize, String> {
    let over = || "the shape overflows".to_string();
    match channel_group {
        None => {
            let rb = row_bytes(method, bits, head_dim).map_err(|e| e.to_string())?;
            kv_heads
                .checked_mul(tokens)
                .and_then(|n| n.checked_mul(rb))
                .ok_or_else(over)
        }
        Some(g) => {
            let c = ChannelGroupCodec::new(bits, head_dim, g).map_err(|e| e.to_string())?;
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

/// Makes a header, checking that the spec fits the shape and every field fits its u32.
pub fn new_header(
    tensor: Tensor,
    spec: Spec,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
    channel_group: Option<usize>,
) -> Result<Header, CliError> {
    for (what, x) in [
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("tokens", tokens),
    ] {
        if x == 0 || u32::try_from(x).is_err() {
            return Err(CliError::input(format!(
                "{what} {x} does not fit a kvq packed file (1..=2^32-1)"
            )));
        }
    }
    if layers > MAX_PLAN_LAYERS {
        return Err(CliError::input(format!(
            "{layers} layers (a kvq plan holds at most {MAX_PLAN_LAYERS})"
        )));
    }
    if let Some(g) = channel_group {
        if tensor != Tensor::K || !GROUPS.contains(&g) {
            return Err(CliError::input(format!(
                "a channel group ({g} tokens) is for K only, of 16, 32, 64, 128 or 256 tokens"
            )));
        }
    }
    let plan = spec
        .plan(layers, kv_heads, head_dim)
        .map_err(CliError::input)?;
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
        return Err(CliError::input("the plan's JSON is over 4 GiB"));
    }
    for i in 0..layers {
        h.layer_bytes(i).map_err(CliError::input)?;
    }
    Ok(h)
}

/// FNV-1a 64 of `b`.
pub fn fnv1a64(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Parses a whole file (`what` names it in errors): the header, checked field by field
/// and by its checksum, and the body's length, which must be exactly what the header
/// implies. Returns the header and the body's offset.
pub fn parse(what: &str, file: &[u8], tensor: Tensor) -> Result<(Header, usize), CliError> {
    let bad = |m: String| CliError::input(format!("{what}: not a valid kvq packed file: {m}"));
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
        .ok_or_else(|| bad("spec length overflows".into()))?;
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
    let h = new_header(
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
            .ok_or_else(|| bad("body size overflows".into()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensor: Tensor, spec: Spec, group: Option<usize>, tokens: usize) -> Vec<u8> {
        let h = new_header(tensor, spec, 2, 1, 64, tokens, group).unwrap();
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
            let (h, at) = parse("f", &f, t).unwrap();
            assert_eq!(h.encode().len(), at);
            assert_eq!(h.encode(), f[..at]);
            for n in 0..f.len() {
                let e = parse("f", &f[..n], t).unwrap_err();
                assert!(matches!(e, CliError::Input(_)), "{n}: {e}");
                assert!(e.to_string().contains("not a valid kvq packed file"), "{e}");
            }
            let mut longer = f.clone();
            longer.push(0);
            assert!(parse("f", &longer, t).is_err());
            let other = if t == Tensor::K { Tensor::V } else { Tensor::K };
            assert!(parse("f", &f, other)
                .unwrap_err()
                .to_string()
                .contains("holds"));
        }
    }

    #[test]
    fn every_flipped_header_bit_is_an_error() {
        for (t, f) in cases() {
            let (_, at) = parse("f", &f, t).unwrap();
            for i in 0..at {
                for bit in 0..8 {
                    let mut g = f.clone();
                    g[i] ^= 1 << bit;
                    assert!(parse("f", &g, t).is_err(), "byte {i} bit {bit}");
                }
                let mut g = f.clone();
                g[i] ^= 0xff;
                assert!(parse("f", &g, t).is_err(), "byte {i} ^ 0xff");
            }
        }
    }

    #[test]
    fn bad_fields_with_a_good_checksum_name_the_field() {
        let (_, f) = &cases()[0];
        let (_, at) = parse("f", f, Tensor::K).unwrap();
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
        let err = |g: Vec<u8>| parse("f", &g, Tensor::K).unwrap_err().to_string();
        assert!(err(edit(8, &2u16.to_le_bytes())).contains("version 2"));
        assert!(err(edit(10, &[7])).contains("tensor code 7"));
        assert!(err(edit(11, &[9])).contains("spec kind 9"));
        assert!(err(edit(12, &0u32.to_le_bytes())).contains("layers 0"));
        assert!(err(edit(20, &96u32.to_le_bytes())).contains("head_dim"));
        assert!(err(edit(24, &4u32.to_le_bytes())).contains("truncated"));
        assert!(err(edit(28, &17u32.to_le_bytes())).contains("channel group"));
        assert!(err(edit(FIXED, b"q")).contains("k<bits>"));
    }
}
