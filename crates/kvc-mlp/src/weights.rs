//! The `.bin` v1 weight file: header, per-layer weight blocks, and the MLPs they hold.
//!
//! Layout (little-endian): a 44-byte header, `metadata_size_bytes` of metadata (skipped),
//! then for each layer `weight_count_per_layer` blocks of `rows, cols, has_bias` (3 x u32),
//! `rows * cols` weights and, if `has_bias == 1`, `rows` biases. Blocks come in the order
//! prefix -> slot: `compress_tk, compress_tv, compress_ik, compress_iv`, each with its three
//! Linear layers; a text-only file holds the first two prefixes (6 blocks per layer).

use std::path::Path;

use crate::error::{Error, Result};
use kvc_types::{extend_f32, load_f32, FloatDtype};

/// The magic number at byte 0 (`"MCVK"` read as a little-endian u32).
pub const MAGIC: u32 = 0x4B56_434D;
/// The only format version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_SIZE: usize = 44;
/// Size of one weight block's `rows, cols, has_bias` prefix.
pub const WEIGHT_META_SIZE: usize = 12;
/// The four MLP prefixes in file order.
pub const PREFIXES: [&str; 4] = ["compress_tk", "compress_tv", "compress_ik", "compress_iv"];

/// The 44-byte header of a `.bin` v1 file, exactly as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightsHeader {
    /// Element type of every weight and bias.
    pub dtype: FloatDtype,
    /// Number of layers.
    pub num_layers: u32,
    /// Number of heads (optional, often 0).
    pub num_heads: u32,
    /// Head dimension as stored (0 means "not given"; see [`CompressorWeights::head_dim`]).
    pub head_dim: u32,
    /// Input width of the first Linear (`head_dim * factor`) as stored (0 means "not given").
    pub hidden_size: u32,
    /// Tokens per group.
    pub compression_factor: u32,
    /// Minimum number of groups for a segment to be compressed.
    pub min_seq_len: u32,
    /// Weight blocks per layer: 12 (text and image) or 6 (text only).
    pub weight_count_per_layer: u32,
    /// Bytes of metadata between the header and the first block.
    pub metadata_size_bytes: u32,
}

impl WeightsHeader {
    /// Serialises the header (44 bytes, reserved field 0).
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        b[8..10].copy_from_slice(&(self.dtype.code() as u16).to_le_bytes());
        let fields = [
            self.num_layers,
            self.num_heads,
            self.head_dim,
            self.hidden_size,
            self.compression_factor,
            self.min_seq_len,
            self.weight_count_per_layer,
            self.metadata_size_bytes,
        ];
        for (i, v) in fields.iter().enumerate() {
            b[12 + 4 * i..16 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// Where one weight block sits in the file and what it holds (for inspection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightRecord {
    /// Layer index.
    pub layer: u32,
    /// Block index in the layer (`prefix * 3 + slot`).
    pub index: u32,
    /// Output features (`rows`).
    pub rows: u32,
    /// Input features (`cols`).
    pub cols: u32,
    /// Whether a bias follows the weights.
    pub has_bias: bool,
    /// Byte offset of the block's `rows` field.
    pub offset: u64,
}

impl WeightRecord {
    /// The MLP prefix this block belongs to (`compress_tk`, ...).
    pub fn prefix(&self) -> &'static str {
        PREFIXES[(self.index / 3) as usize % 4]
    }

    /// The Linear layer inside the MLP: 0, 1 or 2.
    pub fn slot(&self) -> u32 {
        self.index % 3
    }
}

/// One `Linear(in -> out)` layer in f32, with its weight stored transposed (`[in, out]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    in_features: usize,
    out_features: usize,
    weight_t: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// A Linear layer from a row-major `[out, in]` weight (PyTorch's layout) and an optional
    /// bias of `out` elements.
    pub fn new(
        out_features: usize,
        in_features: usize,
        weight: &[f32],
        bias: Option<&[f32]>,
    ) -> Result<Self> {
        let n = out_features
            .checked_mul(in_features)
            .ok_or_else(|| Error::invalid("weight", "out_features * in_features overflows"))?;
        if n == 0 {
            return Err(Error::invalid(
                "weight",
                "a Linear layer needs in, out >= 1",
            ));
        }
        if weight.len() != n {
            return Err(Error::invalid(
                "weight",
                format!(
                    "{} elements for a [{out_features}, {in_features}] matrix",
                    weight.len()
                ),
            ));
        }
        if let Some(b) = bias {
            if b.len() != out_features {
                return Err(Error::invalid(
                    "bias",
                    format!("{} elements, expected {out_features}", b.len()),
                ));
            }
        }
        let mut weight_t = vec![0f32; n];
        for (o, row) in weight.chunks_exact(in_features).enumerate() {
            for (i, &w) in row.iter().enumerate() {
                weight_t[i * out_features + o] = w;
            }
        }
        Ok(Linear {
            in_features,
            out_features,
            weight_t,
            bias: bias.map(<[f32]>::to_vec),
        })
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The weight transposed, row-major `[in, out]`.
    pub fn weight_t(&self) -> &[f32] {
        &self.weight_t
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }
}

/// `Linear(D*factor -> D), ReLU, Linear(D -> D), ReLU, Linear(D -> D)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    layers: [Linear; 3],
}

impl Mlp {
    /// An MLP from its three Linear layers; their widths must chain and end where they began
    /// divided by a whole factor (`l0: in -> D`, `l1: D -> D`, `l2: D -> D`, `in % D == 0`).
    pub fn new(layers: [Linear; 3]) -> Result<Self> {
        let d = layers[0].out_features;
        let ok = layers[0].in_features.is_multiple_of(d)
            && layers[1].in_features == d
            && layers[1].out_features == d
            && layers[2].in_features == d
            && layers[2].out_features == d;
        if !ok {
            return Err(Error::invalid(
                "mlp",
                format!(
                    "layer widths {}->{}, {}->{}, {}->{} are not D*factor->D, D->D, D->D",
                    layers[0].in_features,
                    layers[0].out_features,
                    layers[1].in_features,
                    layers[1].out_features,
                    layers[2].in_features,
                    layers[2].out_features
                ),
            ));
        }
        Ok(Mlp { layers })
    }

    /// The three Linear layers.
    pub fn layers(&self) -> &[Linear; 3] {
        &self.layers
    }

    /// Output width `D`.
    pub fn head_dim(&self) -> usize {
        self.layers[0].out_features
    }

    /// Input width `D * factor`.
    pub fn input_width(&self) -> usize {
        self.layers[0].in_features
    }
}

/// The four MLPs of one layer; any may be absent.
///
/// If the text MLPs are absent nothing is compressed; if the image MLPs are absent an image
/// prefix is kept unchanged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerMlps {
    /// `compress_tk`: text keys.
    pub text_k: Option<Mlp>,
    /// `compress_tv`: text values.
    pub text_v: Option<Mlp>,
    /// `compress_ik`: image keys.
    pub image_k: Option<Mlp>,
    /// `compress_iv`: image values.
    pub image_v: Option<Mlp>,
}

impl LayerMlps {
    fn iter(&self) -> impl Iterator<Item = &Mlp> {
        [&self.text_k, &self.text_v, &self.image_k, &self.image_v]
            .into_iter()
            .flatten()
    }

    /// The K and V MLPs of the text part, if both are present.
    pub fn text(&self) -> Option<(&Mlp, &Mlp)> {
        Some((self.text_k.as_ref()?, self.text_v.as_ref()?))
    }

    /// The K and V MLPs of the image part, if both are present.
    pub fn image(&self) -> Option<(&Mlp, &Mlp)> {
        Some((self.image_k.as_ref()?, self.image_v.as_ref()?))
    }
}

/// All layers' compressor MLPs in f32, with the defaults the file carries.
#[derive(Debug, Clone, PartialEq)]
pub struct CompressorWeights {
    header: Option<WeightsHeader>,
    head_dim: usize,
    factor: usize,
    min_seq_len: usize,
    layers: Vec<LayerMlps>,
    records: Vec<WeightRecord>,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, n: u64) -> Result<&'a [u8]> {
        let available = (self.bytes.len() - self.pos) as u64;
        if n > available {
            return Err(Error::Truncated {
                field,
                offset: self.pos as u64,
                needed: n,
                available,
            });
        }
        let n = n as usize; // n <= available, which fits in usize
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32> {
        let b = self.take(field, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u16(&mut self, field: &'static str) -> Result<u16> {
        let b = self.take(field, 2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
}

fn bad_header(field: &'static str, offset: u64, found: u64, expected: &'static str) -> Error {
    Error::BadHeaderField {
        field,
        offset,
        found,
        expected,
    }
}

/// Reads and checks the 44-byte header at the start of `bytes`.
pub fn parse_header(bytes: &[u8]) -> Result<WeightsHeader> {
    let mut r = Reader { bytes, pos: 0 };
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(Error::UnsupportedVersion { found: version });
    }
    let code = r.u16("dtype_code")?;
    let dtype = FloatDtype::from_code(code.into()).ok_or_else(|| {
        bad_header(
            "dtype_code",
            8,
            code.into(),
            "0 (fp16), 1 (bf16) or 2 (fp32)",
        )
    })?;
    let reserved = r.u16("reserved")?;
    if reserved != 0 {
        return Err(bad_header("reserved", 10, reserved.into(), "0"));
    }
    let header = WeightsHeader {
        dtype,
        num_layers: r.u32("num_layers")?,
        num_heads: r.u32("num_heads")?,
        head_dim: r.u32("head_dim")?,
        hidden_size: r.u32("hidden_size")?,
        compression_factor: r.u32("compression_factor")?,
        min_seq_len: r.u32("min_seq_len")?,
        weight_count_per_layer: r.u32("weight_count_per_layer")?,
        metadata_size_bytes: r.u32("metadata_size_bytes")?,
    };
    if header.num_layers == 0 {
        return Err(bad_header("num_layers", 12, 0, "at least 1"));
    }
    if header.compression_factor == 0 {
        return Err(bad_header("compression_factor", 28, 0, "at least 1"));
    }
    if !matches!(header.weight_count_per_layer, 6 | 12) {
        return Err(bad_header(
            "weight_count_per_layer",
            36,
            header.weight_count_per_layer.into(),
            "12 (text and image) or 6 (text only)",
        ));
    }
    if header.head_dim != 0 && header.hidden_size != 0 {
        let want = u64::from(header.head_dim) * u64::from(header.compression_factor);
        if u64::from(header.hidden_size) != want {
            return Err(bad_header(
                "hidden_size",
                24,
                header.hidden_size.into(),
                "head_dim * compression_factor",
            ));
        }
    }
    Ok(header)
}

impl CompressorWeights {
    /// Reads a `.bin` v1 file with one read and parses it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Parses a complete `.bin` v1 file held in memory, checking every field.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let header = parse_header(bytes)?;
        let mut r = Reader {
            bytes,
            pos: HEADER_SIZE,
        };
        r.take("metadata", header.metadata_size_bytes.into())?;
        let esize = header.dtype.size() as u64;
        let factor = u64::from(header.compression_factor);
        let mut head_dim = u64::from(header.head_dim);
        let nl = header.num_layers as usize;
        let wc = header.weight_count_per_layer;
        // Every block takes at least 12 bytes, so the file bounds what is worth reserving;
        // a header claiming more layers than that fails as truncated when the blocks run out.
        let max_blocks = (bytes.len() - r.pos) / WEIGHT_META_SIZE;
        let blocks = (nl as u64 * u64::from(wc)).min(max_blocks as u64) as usize;
        let mut layers = Vec::with_capacity(blocks / wc as usize);
        let mut records = Vec::with_capacity(blocks);
        let mut scratch: Vec<f32> = Vec::new();
        for layer in 0..header.num_layers {
            let mut mlps: Vec<Mlp> = Vec::with_capacity(4);
            let mut linears: Vec<Linear> = Vec::with_capacity(3);
            for index in 0..wc {
                let offset = r.pos as u64;
                let rows = r.u32("rows")?;
                let cols = r.u32("cols")?;
                let has_bias = r.u32("has_bias")?;
                if head_dim == 0 {
                    // head_dim "not given": the first block's rows define it.
                    if rows == 0 {
                        return Err(bad_header(
                            "head_dim",
                            20,
                            0,
                            "non-zero (or rows of block 0)",
                        ));
                    }
                    head_dim = rows.into();
                    if header.hidden_size != 0 && u64::from(header.hidden_size) != head_dim * factor
                    {
                        return Err(bad_header(
                            "hidden_size",
                            24,
                            header.hidden_size.into(),
                            "head_dim * compression_factor",
                        ));
                    }
                }
                let want_cols = if index % 3 == 0 {
                    head_dim.checked_mul(factor).ok_or(Error::SizeOverflow {
                        field: "head_dim * compression_factor",
                        offset: 20,
                    })?
                } else {
                    head_dim
                };
                let bad = |field, off: u64, found: u32, expected| Error::BadWeightField {
                    layer,
                    index,
                    field,
                    offset: off,
                    found: found.into(),
                    expected,
                };
                if u64::from(rows) != head_dim {
                    return Err(bad("rows", offset, rows, head_dim));
                }
                if u64::from(cols) != want_cols {
                    return Err(bad("cols", offset + 4, cols, want_cols));
                }
                if has_bias > 1 {
                    return Err(bad("has_bias", offset + 8, has_bias, 1));
                }
                let n = u64::from(rows)
                    .checked_mul(cols.into())
                    .and_then(|n| n.checked_mul(esize))
                    .ok_or(Error::SizeOverflow {
                        field: "weight_data",
                        offset,
                    })?;
                let data = r.take("weight_data", n)?;
                let bias = if has_bias == 1 {
                    Some(r.take("bias_data", u64::from(rows) * esize)?)
                } else {
                    None
                };
                records.push(WeightRecord {
                    layer,
                    index,
                    rows,
                    cols,
                    has_bias: has_bias == 1,
                    offset,
                });
                let (rows, cols) = (rows as usize, cols as usize);
                scratch.resize(rows * cols, 0.0);
                load_f32(header.dtype.dtype(), data, &mut scratch);
                let bias = bias.map(|b| {
                    let mut v = vec![0f32; rows];
                    load_f32(header.dtype.dtype(), b, &mut v);
                    v
                });
                linears.push(Linear::new(rows, cols, &scratch, bias.as_deref())?);
                if linears.len() == 3 {
                    let [a, b, c]: [Linear; 3] = std::mem::take(&mut linears)
                        .try_into()
                        .map_err(|_| Error::invalid("mlp", "internal: 3 layers expected"))?;
                    mlps.push(Mlp::new([a, b, c])?);
                }
            }
            let mut it = mlps.into_iter();
            layers.push(LayerMlps {
                text_k: it.next(),
                text_v: it.next(),
                image_k: it.next(),
                image_v: it.next(),
            });
        }
        if r.pos != bytes.len() {
            return Err(Error::TrailingBytes {
                offset: r.pos as u64,
                count: (bytes.len() - r.pos) as u64,
            });
        }
        Ok(CompressorWeights {
            header: Some(header),
            head_dim: head_dim as usize,
            factor: factor as usize,
            min_seq_len: header.min_seq_len as usize,
            layers,
            records,
        })
    }

    /// Weights built in memory (for engines that hold them already, and for tests).
    ///
    /// Every present MLP must map `head_dim * factor -> head_dim`.
    pub fn from_layers(
        head_dim: usize,
        factor: usize,
        min_seq_len: usize,
        layers: Vec<LayerMlps>,
    ) -> Result<Self> {
        if head_dim == 0 || factor == 0 {
            return Err(Error::invalid("shape", "head_dim and factor must be >= 1"));
        }
        if layers.is_empty() {
            return Err(Error::invalid("layers", "at least one layer is needed"));
        }
        for (i, l) in layers.iter().enumerate() {
            for m in l.iter() {
                if m.head_dim() != head_dim || Some(m.input_width()) != head_dim.checked_mul(factor)
                {
                    return Err(Error::invalid(
                        "layers",
                        format!(
                            "layer {i}: an MLP maps {} -> {}, expected {} -> {head_dim}",
                            m.input_width(),
                            m.head_dim(),
                            head_dim.saturating_mul(factor)
                        ),
                    ));
                }
            }
        }
        Ok(CompressorWeights {
            header: None,
            head_dim,
            factor,
            min_seq_len,
            layers,
            records: Vec::new(),
        })
    }

    /// Serialises the weights as a `.bin` v1 file in `dtype` (the inverse of
    /// [`from_bytes`](Self::from_bytes); f16 and bf16 round to nearest even), with
    /// `num_heads` written as given (the format leaves it optional) and no metadata.
    ///
    /// The format holds a fixed number of blocks per layer, so every layer needs both text
    /// MLPs, and the image MLPs are either in every layer (12 blocks) or in none (6).
    pub fn to_bytes(&self, dtype: FloatDtype, num_heads: u32) -> Result<Vec<u8>> {
        let has_image = self.layers.first().is_some_and(|l| l.image().is_some());
        let mut blocks: Vec<&Mlp> = Vec::with_capacity(self.layers.len() * 4);
        for (i, l) in self.layers.iter().enumerate() {
            let Some((k, v)) = l.text() else {
                return Err(Error::invalid(
                    "layers",
                    format!("layer {i} has no text K and V MLPs; .bin v1 cannot leave them out"),
                ));
            };
            blocks.extend([k, v]);
            match (l.image(), has_image) {
                (Some((ik, iv)), true) => blocks.extend([ik, iv]),
                (None, false) => {}
                _ => {
                    return Err(Error::invalid(
                        "layers",
                        format!(
                            "layer {i}: image MLPs must be in every layer or in none (.bin v1 \
                             has one block count for all layers)"
                        ),
                    ))
                }
            }
            if l.image_k.is_some() != l.image_v.is_some() {
                return Err(Error::invalid(
                    "layers",
                    format!("layer {i} has only one of the image K and V MLPs"),
                ));
            }
        }
        let to_u32 = |name: &'static str, v: usize| {
            u32::try_from(v).map_err(|_| Error::invalid(name, format!("{v} does not fit in u32")))
        };
        let header = WeightsHeader {
            dtype,
            num_layers: to_u32("num_layers", self.layers.len())?,
            num_heads,
            head_dim: to_u32("head_dim", self.head_dim)?,
            hidden_size: to_u32("hidden_size", self.head_dim * self.factor)?,
            compression_factor: to_u32("factor", self.factor)?,
            min_seq_len: to_u32("min_seq_len", self.min_seq_len)?,
            weight_count_per_layer: if has_image { 12 } else { 6 },
            metadata_size_bytes: 0,
        };
        let mut out = header.to_bytes().to_vec();
        let mut row_major = Vec::new();
        for mlp in blocks {
            for lin in mlp.layers() {
                let (rows, cols) = (lin.out_features(), lin.in_features());
                out.extend_from_slice(&to_u32("rows", rows)?.to_le_bytes());
                out.extend_from_slice(&to_u32("cols", cols)?.to_le_bytes());
                out.extend_from_slice(&u32::from(lin.bias().is_some()).to_le_bytes());
                // weight_t is [in, out]; the file holds PyTorch's [out, in].
                row_major.clear();
                row_major.resize(rows * cols, 0.0);
                for (i, col) in lin.weight_t().chunks_exact(rows).enumerate() {
                    for (o, &w) in col.iter().enumerate() {
                        row_major[o * cols + i] = w;
                    }
                }
                extend_f32(dtype.dtype(), &row_major, &mut out);
                if let Some(b) = lin.bias() {
                    extend_f32(dtype.dtype(), b, &mut out);
                }
            }
        }
        Ok(out)
    }

    /// The file header, if these weights came from a file.
    pub fn header(&self) -> Option<&WeightsHeader> {
        self.header.as_ref()
    }

    /// Head dimension `D` every MLP maps to.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Tokens per group the MLPs were trained for.
    pub fn factor(&self) -> usize {
        self.factor
    }

    /// The default minimum number of groups for a segment to be compressed.
    pub fn min_seq_len(&self) -> usize {
        self.min_seq_len
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The MLPs of `layer`.
    pub fn layer(&self, layer: usize) -> Result<&LayerMlps> {
        self.layers.get(layer).ok_or(Error::LayerOutOfRange {
            layer,
            num_layers: self.layers.len(),
        })
    }

    /// Every weight block of the file in order, with its shape and offset.
    pub fn records(&self) -> &[WeightRecord] {
        &self.records
    }
}
