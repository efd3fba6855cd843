//! `kvc quant apply --kvq SPEC` and `kvc quant dequant --kvq`: raw K and V caches
//! `[layer][token][kv_head][head_dim]` to kvq packed cache files ([`super::kvq_file`])
//! and back, with the per-layer bits, errors and bytes of what was written.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use kvc_kvq::{ChannelGroupCodec, KvqConfig, KvqPlan, RowCodec};
use serde::Serialize;

use super::kvq_file::{self, Header, Spec, Tensor};
use crate::cli_error::CliError;

/// Element type of a raw cache (as `kvc quant`'s `--dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// f32.
    F32,
}

impl Elem {
    /// `f16`, `bf16` or `f32`.
    pub fn name(self) -> &'static str {
        match self {
            Elem::F16 => "f16",
            Elem::Bf16 => "bf16",
            Elem::F32 => "f32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F16 | Elem::Bf16 => 2,
            Elem::F32 => 4,
        }
    }

    fn read(self, b: &[u8], out: &mut [f32]) {
        match self {
            Elem::F16 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Elem::Bf16 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Elem::F32 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }

    fn write(self, x: &[f32], out: &mut Vec<u8>) {
        for &v in x {
            match self {
                Elem::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
                Elem::Bf16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
                Elem::F32 => out.extend_from_slice(&v.to_le_bytes()),
            }
        }
    }
}

/// The shape flags of `kvc quant`.
#[derive(Clone, Copy, Debug)]
pub struct CacheShape {
    /// Element type of the raw caches.
    pub elem: Elem,
    /// Layers.
    pub layers: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

/// What `kvc quant apply --kvq` was asked to do.
pub struct ApplyJob<'a> {
    /// A config string or a plan JSON file.
    pub spec: &'a str,
    /// The raw caches' shape.
    pub shape: CacheShape,
    /// K per channel over groups of this many tokens.
    pub k_channel_group: Option<usize>,
    /// Raw K and V.
    pub k: &'a Path,
    /// Raw V.
    pub v: &'a Path,
    /// Packed K output.
    pub out_k: &'a Path,
    /// Packed V output.
    pub out_v: &'a Path,
    /// JSON report.
    pub json: Option<&'a Path>,
}

/// Error statistics of one tensor of one layer.
#[derive(Clone, Copy, Default)]
struct Err2 {
    signal: f64,
    noise: f64,
}

impl Err2 {
    fn add(&mut self, x: &[f32], y: &[f32]) {
        for (a, b) in x.iter().zip(y) {
            let (a, b) = (f64::from(*a), f64::from(*b));
            self.signal += a * a;
            self.noise += (a - b) * (a - b);
        }
    }

    fn merge(&mut self, o: &Err2) {
        self.signal += o.signal;
        self.noise += o.noise;
    }

    /// `10 log10(sum x^2 / sum (x - y)^2)`; infinite when exact.
    fn snr_db(&self) -> f64 {
        10.0 * (self.signal / self.noise).log10()
    }

    /// `sqrt(sum (x - y)^2 / sum x^2)`.
    fn rel_rms(&self) -> f64 {
        (self.noise / self.signal).sqrt()
    }
}

/// One tensor of one layer in the report.
#[derive(Serialize)]
struct TensorRow {
    bits: u8,
    /// Bits per value of what the layer's section holds (scales, steps, minimums and an
    /// f16 tail included).
    bits_per_value: f64,
    snr_db: Option<f64>,
    rel_rms: Option<f64>,
    bytes: usize,
}

#[derive(Serialize)]
struct LayerRow {
    layer: usize,
    k: TensorRow,
    v: TensorRow,
}

#[derive(Serialize)]
struct FileRow {
    path: String,
    header_bytes: usize,
    body_bytes: usize,
    file_bytes: usize,
    snr_db: Option<f64>,
    rel_rms: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    /// The --kvq argument.
    source: String,
    /// The spec as stored in the headers.
    spec: String,
    spec_kind: &'static str,
    k_channel_group: Option<usize>,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
    per_layer: Vec<LayerRow>,
    k_file: FileRow,
    v_file: FileRow,
    /// Bytes of K and V in f16.
    f16_bytes: usize,
    /// `f16_bytes / (k_file_bytes + v_file_bytes)`.
    ratio_vs_f16: f64,
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn read(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::io(path, e))
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    std::fs::write(path, bytes).map_err(|e| CliError::io(path, e))
}

/// A config string, or a plan JSON file when `spec` names a file.
fn load_spec(spec: &str) -> Result<Spec, CliError> {
    let path = Path::new(spec);
    if path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|e| CliError::io(path, e))?;
        let p = KvqPlan::from_json(&text).map_err(|e| CliError::input(format!("{spec}: {e}")))?;
        Ok(Spec::Plan(Box::new(p)))
    } else {
        KvqConfig::parse(spec).map(Spec::Config).map_err(|e| {
            CliError::input(format!(
                "--kvq {spec:?} (neither a plan file nor a config string): {e}"
            ))
        })
    }
}

/// Tokens in a raw cache of `len` bytes.
fn tokens_of(s: &CacheShape, len: usize, path: &Path) -> Result<usize, CliError> {
    let bad = |m: String| CliError::input(format!("{}: {m}", path.display()));
    if s.layers == 0 || s.kv_heads == 0 || s.head_dim == 0 {
        return Err(bad(
            "--layers, --kv-heads and --head-dim must be at least 1".into(),
        ));
    }
    let per_token = s
        .layers
        .checked_mul(s.kv_heads)
        .and_then(|x| x.checked_mul(s.head_dim))
        .and_then(|x| x.checked_mul(s.elem.size()))
        .ok_or_else(|| bad("shape overflows".into()))?;
    if len == 0 || !len.is_multiple_of(per_token) {
        return Err(bad(format!(
            "{len} bytes is not a whole number of tokens of {} layers x {} heads x {} dims x {} bytes",
            s.layers,
            s.kv_heads,
            s.head_dim,
            s.elem.size()
        )));
    }
    Ok(len / per_token)
}

/// Row codecs by bits (a codec's codebook is worth computing once).
pub(crate) struct Codecs {
    method: kvc_kvq::Method,
    seed: u64,
    head_dim: usize,
    rows: HashMap<u8, RowCodec>,
}

impl Codecs {
    /// No codec yet, for `h`'s method, seed and head_dim.
    pub(crate) fn new(h: &Header) -> Codecs {
        Codecs {
            method: h.method(),
            seed: h.plan.seed,
            head_dim: h.head_dim,
            rows: HashMap::new(),
        }
    }

    fn row(&mut self, bits: u8) -> Result<&RowCodec, CliError> {
        if !self.rows.contains_key(&bits) {
            let c = RowCodec::new(self.method, bits, self.head_dim, self.seed)
                .map_err(CliError::input)?;
            self.rows.insert(bits, c);
        }
        self.rows
            .get(&bits)
            .ok_or_else(|| CliError::input("internal: codec missing"))
    }
}

/// Codes one layer of a raw cache (`x`: `tokens * kv_heads * head_dim` values,
/// `[token][kv_head][head_dim]`) into `out` and returns the decoded values in `back`.
/// (`pub(crate)` for fuzz/fuzz_targets/kvq_file.rs, which compiles this file.)
pub(crate) fn encode_layer(
    h: &Header,
    i: usize,
    codecs: &mut Codecs,
    x: &[f32],
    out: &mut Vec<u8>,
    back: &mut [f32],
    what: &str,
) -> Result<(), CliError> {
    let (d, nh, nt) = (h.head_dim, h.kv_heads, h.tokens);
    let bits = h.bits(i);
    let at = |t: usize, hd: usize| (t * nh + hd) * d;
    let ctx = |e: kvc_kvq::Error, t: usize, hd: usize| {
        CliError::input(format!("{what}: layer {i} token {t} head {hd}: {e}"))
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
            let gctx = |e: kvc_kvq::Error, t: usize, hd: usize| {
                CliError::input(format!(
                    "{what}: layer {i} head {hd}, the channel group of tokens {t}..{}: {e}",
                    t + g
                ))
            };
            let c = ChannelGroupCodec::new(bits, d, g).map_err(CliError::input)?;
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
                            return Err(CliError::input(format!(
                                "{what}: layer {i} token {t} head {hd} value {j} ({v}) is outside f16's range (kept in f16 as the tail of an unfilled channel group)"
                            )));
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

/// Decodes one layer's section `sec` into `back` (`[token][kv_head][head_dim]`).
fn decode_layer(
    h: &Header,
    i: usize,
    codecs: &mut Codecs,
    sec: &[u8],
    back: &mut [f32],
    what: &str,
) -> Result<(), CliError> {
    let (d, nh, nt) = (h.head_dim, h.kv_heads, h.tokens);
    let bits = h.bits(i);
    let at = |t: usize, hd: usize| (t * nh + hd) * d;
    let ctx = |e: kvc_kvq::Error, t: usize, hd: usize| {
        CliError::input(format!("{what}: layer {i} token {t} head {hd}: {e}"))
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
            let gctx = |e: kvc_kvq::Error, t: usize, hd: usize| {
                CliError::input(format!(
                    "{what}: layer {i} head {hd}, the channel group of tokens {t}..{}: {e}",
                    t + g
                ))
            };
            let c = ChannelGroupCodec::new(bits, d, g).map_err(CliError::input)?;
            let mut dec = vec![0f32; g * d];
            let nb = nt / g;
            let mut blocks = sec.chunks_exact(c.block_bytes());
            for hd in 0..nh {
                for b in 0..nb {
                    let block = blocks
                        .next()
                        .ok_or_else(|| CliError::input(format!("{what}: layer {i} short")))?;
                    c.dequantize_block(block, &mut dec)
                        .map_err(|e| gctx(e, b * g, hd))?;
                    for r in 0..g {
                        let o = at(b * g + r, hd);
                        back[o..o + d].copy_from_slice(&dec[r * d..(r + 1) * d]);
                    }
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
                    return Err(CliError::input(format!(
                        "{what}: layer {i} token {t} head {hd} value {j} of the f16 tail (the unfilled channel group) is {} (corrupt data)",
                        hv.to_f32()
                    )));
                }
                *v = hv.to_f32();
            }
        }
    }
    Ok(())
}

/// Runs `kvc quant apply --kvq`.
pub fn apply(job: ApplyJob<'_>) -> Result<(), CliError> {
    let s = job.shape;
    let spec = load_spec(job.spec)?;
    let (k, v) = (read(job.k)?, read(job.v)?);
    let tk = tokens_of(&s, k.len(), job.k)?;
    let tv = tokens_of(&s, v.len(), job.v)?;
    if tk != tv {
        return Err(CliError::input(format!(
            "K holds {tk} tokens, V {tv}: they must match"
        )));
    }
    let ctx = |e: CliError| CliError::input(format!("--kvq {}: {e}", job.spec));
    let hk = kvq_file::new_header(
        Tensor::K,
        spec.clone(),
        s.layers,
        s.kv_heads,
        s.head_dim,
        tk,
        job.k_channel_group,
    )
    .map_err(ctx)?;
    let hv = kvq_file::new_header(Tensor::V, spec, s.layers, s.kv_heads, s.head_dim, tv, None)
        .map_err(ctx)?;
    let mut codecs = Codecs::new(&hk);
    let layer_vals = tk * s.kv_heads * s.head_dim;
    let layer_raw = layer_vals * s.elem.size();
    let mut x = vec![0f32; layer_vals];
    let mut back = vec![0f32; layer_vals];
    let mut files = Vec::new();
    let mut per_tensor = Vec::new();
    for (h, raw, path) in [(&hk, &k, job.k), (&hv, &v, job.v)] {
        let what = path.display().to_string();
        let mut out = h.encode();
        let header_bytes = out.len();
        let mut rows = Vec::new();
        let mut total = Err2::default();
        for i in 0..s.layers {
            s.elem
                .read(&raw[i * layer_raw..(i + 1) * layer_raw], &mut x);
            let before = out.len();
            encode_layer(h, i, &mut codecs, &x, &mut out, &mut back, &what)?;
            let bytes = out.len() - before;
            if Ok(bytes) != h.layer_bytes(i) {
                return Err(CliError::input(format!(
                    "internal: layer {i} coded to {bytes} bytes, the header implies {:?}",
                    h.layer_bytes(i)
                )));
            }
            let mut e = Err2::default();
            e.add(&x, &back);
            total.merge(&e);
            rows.push(TensorRow {
                bits: h.bits(i),
                bits_per_value: 8.0 * bytes as f64 / layer_vals as f64,
                snr_db: finite(e.snr_db()),
                rel_rms: finite(e.rel_rms()),
                bytes,
            });
        }
        files.push((out, header_bytes, total));
        per_tensor.push(rows);
    }
    let f16_bytes = 2 * 2 * layer_vals * s.layers;
    let (vr, kr) = (
        per_tensor.pop().unwrap_or_default(),
        per_tensor.pop().unwrap_or_default(),
    );
    let per_layer: Vec<LayerRow> = kr
        .into_iter()
        .zip(vr)
        .enumerate()
        .map(|(layer, (k, v))| LayerRow { layer, k, v })
        .collect();
    let file_row = |(out, header_bytes, total): &(Vec<u8>, usize, Err2), p: &Path| FileRow {
        path: p.display().to_string(),
        header_bytes: *header_bytes,
        body_bytes: out.len() - header_bytes,
        file_bytes: out.len(),
        snr_db: finite(total.snr_db()),
        rel_rms: finite(total.rel_rms()),
    };
    let report = Report {
        source: job.spec.to_string(),
        spec: hk.spec.text(),
        spec_kind: match hk.spec {
            Spec::Config(_) => "config",
            Spec::Plan(_) => "plan",
        },
        k_channel_group: job.k_channel_group,
        layers: s.layers,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        tokens: tk,
        per_layer,
        k_file: file_row(&files[0], job.out_k),
        v_file: file_row(&files[1], job.out_v),
        f16_bytes,
        ratio_vs_f16: f16_bytes as f64 / (files[0].0.len() + files[1].0.len()) as f64,
    };
    write(job.out_k, &files[0].0)?;
    write(job.out_v, &files[1].0)?;
    print_report(&report);
    if let Some(j) = job.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::input(format!("JSON: {e}")))?;
        write(j, text.as_bytes())?;
    }
    Ok(())
}

fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or_else(|| "exact".into(), |v| format!("{v:.prec$}"))
}

fn print_report(r: &Report) {
    println!(
        "kvq {} ({}), {} layers x {} tokens x {} KV heads x {} dims{}",
        r.source,
        r.spec_kind,
        r.layers,
        r.tokens,
        r.kv_heads,
        r.head_dim,
        r.k_channel_group
            .map(|g| format!(", K per channel over groups of {g} tokens"))
            .unwrap_or_default()
    );
    println!(
        "layer  K bits  K b/val  K SNR dB  K rel RMS  K bytes     V bits  V b/val  V SNR dB  V rel RMS  V bytes"
    );
    for l in &r.per_layer {
        println!(
            "{:<5}  {:<6}  {:<7.4}  {:>8}  {:<9}  {:<10}  {:<6}  {:<7.4}  {:>8}  {:<9}  {:<10}",
            l.layer,
            l.k.bits,
            l.k.bits_per_value,
            opt(l.k.snr_db, 2),
            opt(l.k.rel_rms, 5),
            l.k.bytes,
            l.v.bits,
            l.v.bits_per_value,
            opt(l.v.snr_db, 2),
            opt(l.v.rel_rms, 5),
            l.v.bytes
        );
    }
    for (name, f) in [("K", &r.k_file), ("V", &r.v_file)] {
        println!(
            "{name} file {}: {} bytes ({} header + {} body), SNR {} dB, rel RMS {}",
            f.path,
            f.file_bytes,
            f.header_bytes,
            f.body_bytes,
            opt(f.snr_db, 2),
            opt(f.rel_rms, 5)
        );
    }
    println!(
        "whole cache: {} bytes vs {} in f16, ratio {:.4} (headers, scales and f16 tails counted)",
        r.k_file.file_bytes + r.v_file.file_bytes,
        r.f16_bytes,
        r.ratio_vs_f16
    );
}

/// What `kvc quant dequant --kvq` was asked to do.
pub struct DequantJob<'a> {
    /// Output element type.
    pub elem: Elem,
    /// Shape flags given on the command line, each checked against the headers.
    pub layers: Option<usize>,
    /// KV heads flag.
    pub kv_heads: Option<usize>,
    /// head_dim flag.
    pub head_dim: Option<usize>,
    /// Packed K.
    pub k: &'a Path,
    /// Packed V.
    pub v: &'a Path,
    /// Raw K output.
    pub out_k: &'a Path,
    /// Raw V output.
    pub out_v: &'a Path,
}

/// Decodes a whole packed file to `[layer][token][kv_head][head_dim]` values of `elem`.
pub fn decode_file(
    file: &[u8],
    tensor: Tensor,
    path: &Path,
    elem: Elem,
) -> Result<(Header, Vec<u8>), CliError> {
    let what = path.display().to_string();
    let (h, mut at) = kvq_file::parse(&what, file, tensor)?;
    let mut codecs = Codecs::new(&h);
    let layer_vals = h.tokens * h.kv_heads * h.head_dim;
    let mut back = vec![0f32; layer_vals];
    let mut out = Vec::new();
    for i in 0..h.layers {
        let n = h.layer_bytes(i).map_err(CliError::input)?;
        let sec = file
            .get(at..at + n)
            .ok_or_else(|| CliError::input(format!("{what}: layer {i} is truncated")))?;
        decode_layer(&h, i, &mut codecs, sec, &mut back, &what)?;
        elem.write(&back, &mut out);
        at += n;
    }
    Ok((h, out))
}

/// Runs `kvc quant dequant --kvq`.
pub fn dequant(job: DequantJob<'_>) -> Result<(), CliError> {
    let (k, v) = (read(job.k)?, read(job.v)?);
    let (hk, ok) = decode_file(&k, Tensor::K, job.k, job.elem)?;
    let (hv, ov) = decode_file(&v, Tensor::V, job.v, job.elem)?;
    if hk.spec != hv.spec
        || (hk.layers, hk.kv_heads, hk.head_dim, hk.tokens)
            != (hv.layers, hv.kv_heads, hv.head_dim, hv.tokens)
    {
        return Err(CliError::input(format!(
            "{} and {} are not a K/V pair: their configs or shapes differ",
            job.k.display(),
            job.v.display()
        )));
    }
    for (flag, given, found) in [
        ("--layers", job.layers, hk.layers),
        ("--kv-heads", job.kv_heads, hk.kv_heads),
        ("--head-dim", job.head_dim, hk.head_dim),
    ] {
        if let Some(g) = given {
            if g != found {
                return Err(CliError::input(format!(
                    "{flag} {g}, the files' headers say {found}"
                )));
            }
        }
    }
    write(job.out_k, &ok)?;
    write(job.out_v, &ov)?;
    println!(
        "dequantized kvq {} layers x {} tokens x {} KV heads x {} dims{} to {}",
        hk.layers,
        hk.tokens,
        hk.kv_heads,
        hk.head_dim,
        hk.channel_group
            .map(|g| format!(" (K per channel over groups of {g} tokens)"))
            .unwrap_or_default(),
        job.elem.name()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole packed file of 2 layers x `tokens` tokens x 2 heads x 64 dims of
    /// deterministic data, as `apply` writes it.
    fn packed(tensor: Tensor, spec: &str, group: Option<usize>, tokens: usize) -> Vec<u8> {
        let spec = Spec::Config(KvqConfig::parse(spec).unwrap());
        let h = kvq_file::new_header(tensor, spec, 2, 2, 64, tokens, group).unwrap();
        let mut codecs = Codecs::new(&h);
        let n = tokens * 2 * 64;
        let mut out = h.encode();
        let mut back = vec![0f32; n];
        for i in 0..2 {
            let x: Vec<f32> = (0..n)
                .map(|j| ((j * 37 + i * 11) % 101) as f32 / 17.0 - 3.0)
                .collect();
            encode_layer(&h, i, &mut codecs, &x, &mut out, &mut back, "t").unwrap();
            let snr = {
                let mut e = Err2::default();
                e.add(&x, &back);
                e.snr_db()
            };
            assert!(snr > 5.0, "{snr}");
        }
        out
    }

    #[test]
    fn every_truncation_and_a_corrupt_scale_are_errors_not_panics() {
        let p = Path::new("t");
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
            let (h, at) = decode_file(&f, tensor, p, Elem::F32).unwrap();
            assert_eq!(at.len(), 2 * h.tokens * 2 * 64 * 4);
            for n in 0..f.len() {
                let e = decode_file(&f[..n], tensor, p, Elem::F16).unwrap_err();
                assert!(matches!(e, CliError::Input(_)), "{n}: {e}");
            }
            // An f16 NaN where the first row's scale (or the first block's 6th step) is.
            let (_, body) = kvq_file::parse("t", &f, tensor).unwrap();
            let mut g = f.clone();
            g[body + scale_at..body + scale_at + 2].copy_from_slice(&[0xff, 0x7f]);
            let e = decode_file(&g, tensor, p, Elem::F32).unwrap_err();
            assert!(e.to_string().contains(expect), "{e}");
        }
    }

    /// Found by fuzz/fuzz_targets/kvq_file.rs: a NaN or infinite f16 in the tail of an
    /// unfilled channel group was decoded as is (the writer never writes one).
    #[test]
    fn a_non_finite_f16_tail_value_is_an_error_naming_it() {
        let p = Path::new("t");
        // 2 layers x 21 tokens x 2 heads x 64: one group of 16 per head, then 5 tail tokens.
        let f = packed(Tensor::K, "k4v4", Some(16), 21);
        let (h, body) = kvq_file::parse("t", &f, Tensor::K).unwrap();
        let tail_at = body + h.layer_bytes(0).unwrap() - 5 * 2 * 64 * 2;
        // Layer 0, tail token 2 (token 18), head 1, value 7.
        let at = tail_at + ((2 * 2 + 1) * 64 + 7) * 2;
        for bad in [[0x00, 0x7e], [0x00, 0x7c], [0x00, 0xfc]] {
            let mut g = f.clone();
            g[at..at + 2].copy_from_slice(&bad);
            let e = decode_file(&g, Tensor::K, p, Elem::F32).unwrap_err();
            assert!(matches!(e, CliError::Input(_)), "{e}");
            assert!(
                e.to_string()
                    .contains("layer 0 token 18 head 1 value 7 of the f16 tail"),
                "{e}"
            );
        }
        // The largest finite f16 there is data.
        let mut g = f.clone();
        g[at..at + 2].copy_from_slice(&[0xff, 0x7b]);
        let (_, out) = decode_file(&g, Tensor::K, p, Elem::F32).unwrap();
        let v = (18 * 2 + 1) * 64 + 7;
        assert_eq!(out[4 * v..4 * v + 4], 65504f32.to_le_bytes());
    }
}
