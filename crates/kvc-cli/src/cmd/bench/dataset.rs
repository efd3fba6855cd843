//! The KV dumps a bench runs on: a directory of raw `.bin` tensors with JSON sidecars in
//! the format of `../shared/data/realkv`, or the sample embedded in the binary.

use std::path::Path;

use kvc_codec::Dtype;
use serde::Deserialize;

use crate::cli_error::CliError;

/// The layout every dump must have.
pub const LAYOUT: &str = "[n_layer][n_tokens][n_kv_head][head_dim]";

/// One dumped tensor: all layers of K or V in one dtype.
pub struct Dump {
    /// `K` or `V`.
    pub tensor: String,
    /// Element type.
    pub dtype: Dtype,
    /// Layers.
    pub n_layer: usize,
    /// Tokens per layer.
    pub n_tokens: usize,
    /// KV heads.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// `[n_layer][n_tokens][n_kv_head][head_dim]` little-endian values.
    pub bytes: Vec<u8>,
}

impl Dump {
    /// Bytes of one layer.
    pub fn layer_bytes(&self) -> usize {
        self.n_tokens * self.token_bytes()
    }

    /// Bytes of one token of one layer.
    pub fn token_bytes(&self) -> usize {
        self.n_kv_head * self.head_dim * self.dtype.size()
    }

    /// Layer `i`.
    pub fn layer(&self, i: usize) -> &[u8] {
        let n = self.layer_bytes();
        &self.bytes[i * n..(i + 1) * n]
    }
}

/// A set of dumps and where they came from.
pub struct Dataset {
    /// A directory, or `embedded sample (data/sample)`.
    pub source: String,
    /// The dumps, K before V, f16 before bf16.
    pub dumps: Vec<Dump>,
}

#[derive(Deserialize)]
struct Sidecar {
    file: String,
    tensor: String,
    dtype: String,
    layout: String,
    shape: Vec<usize>,
}

fn dtype_of(desc: &str, file: &str) -> Option<Dtype> {
    let d = desc.to_ascii_lowercase();
    if d.starts_with("bfloat16") || d.starts_with("bf16") {
        return Some(Dtype::Bf16);
    }
    if d.starts_with("float16") || d.starts_with("f16") || d.starts_with("fp16") {
        return Some(Dtype::F16);
    }
    if d.starts_with("float32") || d.starts_with("f32") || d.starts_with("fp32") {
        return Some(Dtype::F32);
    }
    if d.starts_with("int8") || d.starts_with("i8") {
        return Some(Dtype::I8);
    }
    // Fall back to the `.f16.bin` style suffix of the file name.
    let stem = file.strip_suffix(".bin")?;
    stem.rsplit('.').next()?.parse().ok()
}

fn dump_from(name: &str, json: &str, bytes: Vec<u8>) -> Result<Dump, CliError> {
    let meta: Sidecar = serde_json::from_str(json)
        .map_err(|e| CliError::input(format!("{name}: bad JSON sidecar: {e}")))?;
    let dtype = dtype_of(&meta.dtype, &meta.file)
        .ok_or_else(|| CliError::input(format!("{name}: unknown dtype {:?}", meta.dtype)))?;
    if meta.layout != LAYOUT {
        return Err(CliError::input(format!(
            "{name}: layout {:?}, expected {LAYOUT:?}",
            meta.layout
        )));
    }
    let [n_layer, n_tokens, n_kv_head, head_dim] = meta.shape[..] else {
        return Err(CliError::input(format!(
            "{name}: shape {:?} does not have 4 dimensions",
            meta.shape
        )));
    };
    let expected = meta
        .shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
    if expected != Some(bytes.len()) || bytes.is_empty() {
        return Err(CliError::input(format!(
            "{name}: shape {:?} of {dtype} needs {} bytes, file has {}",
            meta.shape,
            expected.map_or("too many".to_string(), |n| n.to_string()),
            bytes.len()
        )));
    }
    if meta.tensor != "K" && meta.tensor != "V" {
        return Err(CliError::input(format!(
            "{name}: tensor {:?} is neither K nor V",
            meta.tensor
        )));
    }
    Ok(Dump {
        tensor: meta.tensor,
        dtype,
        n_layer,
        n_tokens,
        n_kv_head,
        head_dim,
        bytes,
    })
}

fn sort(dumps: &mut [Dump]) {
    dumps.sort_by_key(|d| {
        (
            d.tensor.clone(),
            Dtype::ALL.iter().position(|&x| x == d.dtype),
        )
    });
}

/// Every `*.json` sidecar in `dir` with the `.bin` it names.
pub fn load_dir(dir: &Path) -> Result<Dataset, CliError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CliError::io(dir, e))?;
    let mut dumps = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| CliError::io(dir, e))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let json = std::fs::read_to_string(&path).map_err(|e| CliError::io(&path, e))?;
        let meta: Sidecar = serde_json::from_str(&json)
            .map_err(|e| CliError::input(format!("{}: bad JSON sidecar: {e}", path.display())))?;
        if meta.file.contains('/') || meta.file.contains('\\') {
            return Err(CliError::input(format!(
                "{}: file {:?} must be a name in the same directory",
                path.display(),
                meta.file
            )));
        }
        let bin = dir.join(&meta.file);
        let bytes = std::fs::read(&bin).map_err(|e| CliError::io(&bin, e))?;
        dumps.push(dump_from(&bin.display().to_string(), &json, bytes)?);
    }
    if dumps.is_empty() {
        return Err(CliError::input(format!(
            "{}: no KV dumps (*.json sidecars) found",
            dir.display()
        )));
    }
    sort(&mut dumps);
    Ok(Dataset {
        source: dir.display().to_string(),
        dumps,
    })
}

macro_rules! embedded {
    ($stem:literal) => {
        (
            $stem,
            include_str!(concat!("../../../../../data/sample/", $stem, ".json")),
            include_bytes!(concat!("../../../../../data/sample/", $stem, ".bin")).as_slice(),
        )
    };
}

/// The sample embedded from `data/sample/` (layers 0-3, tokens 0-511 of the real dump).
pub fn embedded() -> Result<Dataset, CliError> {
    let files = [
        embedded!("textA.K.f16"),
        embedded!("textA.K.bf16"),
        embedded!("textA.V.f16"),
        embedded!("textA.V.bf16"),
    ];
    let mut dumps = Vec::new();
    for (name, json, bin) in files {
        dumps.push(dump_from(name, json, bin.to_vec())?);
    }
    sort(&mut dumps);
    Ok(Dataset {
        source: "embedded sample (data/sample)".to_string(),
        dumps,
    })
}
