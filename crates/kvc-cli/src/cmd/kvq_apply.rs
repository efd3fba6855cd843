//! `kvc quant apply --kvq SPEC` and `kvc quant dequant --kvq`: raw K and V caches
//! `[layer][token][kv_head][head_dim]` to kvq packed cache files and back, with the
//! per-layer bits, errors and bytes of what was written. The file format (header, writer,
//! reader) is `kvc_kvq::file`; this is the arguments, the raw caches' element types, the
//! report and the I/O.

use std::path::Path;

use kvc_kvq::file::{self, Codecs, Header, Spec, Tensor};
use kvc_kvq::{KvqConfig, KvqPlan};
use kvc_types::{extend_f32, load_f32, FloatDtype};
use serde::Serialize;

use crate::cli_error::CliError;

/// The shape flags of `kvc quant`.
#[derive(Clone, Copy, Debug)]
pub struct CacheShape {
    /// Element type of the raw caches.
    pub elem: FloatDtype,
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
    let ctx = |e: kvc_kvq::Error| CliError::input(format!("--kvq {}: {e}", job.spec));
    let hk = Header::new(
        Tensor::K,
        spec.clone(),
        s.layers,
        s.kv_heads,
        s.head_dim,
        tk,
        job.k_channel_group,
    )
    .map_err(ctx)?;
    let hv =
        Header::new(Tensor::V, spec, s.layers, s.kv_heads, s.head_dim, tv, None).map_err(ctx)?;
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
            load_f32(
                s.elem.dtype(),
                &raw[i * layer_raw..(i + 1) * layer_raw],
                &mut x,
            );
            let before = out.len();
            file::encode_layer(h, i, &mut codecs, &x, &mut out, &mut back)
                .map_err(|e| CliError::input(format!("{what}: {e}")))?;
            let bytes = out.len() - before;
            if h.layer_bytes(i).ok() != Some(bytes) {
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
    pub elem: FloatDtype,
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
fn decode_file(
    bytes: &[u8],
    tensor: Tensor,
    path: &Path,
    elem: FloatDtype,
) -> Result<(Header, Vec<u8>), CliError> {
    let mut out = Vec::new();
    let h = file::decode_with(bytes, tensor, |_, back| {
        extend_f32(elem.dtype(), back, &mut out)
    })
    .map_err(|e| CliError::input(format!("{}: {e}", path.display())))?;
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
