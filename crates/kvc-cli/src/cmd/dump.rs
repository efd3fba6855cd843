//! Reading a dump of a model's K, V and Q (the llama.cpp client's `--modes dump`: per tensor
//! `<tag>.<K|V|Q>.f32.bin` and a `.json` sidecar with its shape), for the commands that
//! calibrate on one (`kvc kvq plan`, `kvc tc calibrate`).

use std::path::Path;

use crate::cli_error::CliError;

/// One tensor of the dump: its sidecar's shape and its values.
pub struct Tensor {
    pub shape: [usize; 4],
    pub data: Vec<f32>,
}

pub fn read_tensor(dir: &Path, tag: &str, name: &str) -> Result<Tensor, CliError> {
    let side = dir.join(format!("{tag}.{name}.f32.json"));
    let bin = dir.join(format!("{tag}.{name}.f32.bin"));
    let text = std::fs::read_to_string(&side).map_err(|e| CliError::io(&side, e))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CliError::input(format!("{}: {e}", side.display())))?;
    let bad = |why: &str| CliError::input(format!("{}: {why}", side.display()));
    let dims = j["shape"]
        .as_array()
        .ok_or_else(|| bad("no \"shape\" array"))?;
    if dims.len() != 4 {
        return Err(bad("\"shape\" must have 4 dimensions"));
    }
    let mut shape = [0usize; 4];
    for (s, d) in shape.iter_mut().zip(dims) {
        *s = d
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .filter(|&x| x > 0)
            .ok_or_else(|| bad("\"shape\" entries must be positive integers"))?;
    }
    let n = shape
        .iter()
        .try_fold(4usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| bad("\"shape\" too large"))?;
    let len = std::fs::metadata(&bin)
        .map_err(|e| CliError::io(&bin, e))?
        .len();
    if len != n as u64 {
        return Err(CliError::input(format!(
            "{}: {len} bytes, but its sidecar's shape {shape:?} of f32 needs {n}",
            bin.display()
        )));
    }
    let bytes = std::fs::read(&bin).map_err(|e| CliError::io(&bin, e))?;
    if bytes.len() != n {
        return Err(CliError::input(format!(
            "{}: changed size while read",
            bin.display()
        )));
    }
    let data = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Tensor { shape, data })
}

/// K, V and Q of one dump, their shapes checked against each other.
pub struct KvqDump {
    /// `[n_layer][n_tokens][n_kv_head][head_dim]`.
    pub k: Tensor,
    /// As K.
    pub v: Tensor,
    /// `[n_layer][n_tokens][n_head][head_dim]`.
    pub q: Tensor,
}

impl KvqDump {
    /// Reads `<tag>.{K,V,Q}.f32.bin` of `dir`: K and V of one shape, Q of the same layers,
    /// tokens and head_dim.
    pub fn read(dir: &Path, tag: &str) -> Result<KvqDump, CliError> {
        let (k, v, q) = (
            read_tensor(dir, tag, "K")?,
            read_tensor(dir, tag, "V")?,
            read_tensor(dir, tag, "Q")?,
        );
        if k.shape != v.shape {
            return Err(CliError::input(format!(
                "K shape {:?} and V shape {:?} differ",
                k.shape, v.shape
            )));
        }
        let [n_layer, n_tokens, _, head_dim] = k.shape;
        let [ql, qt, _, qd] = q.shape;
        if (ql, qt, qd) != (n_layer, n_tokens, head_dim) {
            return Err(CliError::input(format!(
                "Q shape {:?} does not match K shape {:?} in layers, tokens or head_dim",
                q.shape, k.shape
            )));
        }
        Ok(KvqDump { k, v, q })
    }
}
