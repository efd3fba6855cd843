//! The K/V/Q dumps of `kvc_llama_eval --modes dump`: `{tag}.{K,V,Q}.f32.bin` with a JSON
//! sidecar each, `[n_layer][n_tokens][heads][head_dim]` little-endian f32, read one layer at
//! a time.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::objective::LayerData;

/// One dump: its shape and where its three tensors are.
#[derive(Debug, Clone)]
pub struct Dump {
    /// The directory.
    pub dir: PathBuf,
    /// The tag (`textA`, ...).
    pub tag: String,
    /// Layers.
    pub n_layer: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// KV heads.
    pub n_kv_head: usize,
    /// Query heads.
    pub n_head: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// The K sidecar as read (model, runtime, text source, ...).
    pub sidecar: Value,
}

fn read_json(path: &Path) -> Result<Value> {
    let s = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&s).map_err(|e| Error::bad_dump(path, format!("not JSON: {e}")))
}

fn field(j: &Value, path: &Path, name: &str) -> Result<usize> {
    j.get(name)
        .and_then(Value::as_u64)
        .and_then(|v| usize::try_from(v).ok())
        .filter(|&v| v > 0 && v <= 1 << 20)
        .ok_or_else(|| Error::bad_dump(path, format!("`{name}` is missing or not in 1..=2^20")))
}

impl Dump {
    /// Opens `dir/{tag}.{K,V,Q}.f32.bin` and checks that the three sidecars describe one
    /// model and text, that the shapes fit together and that every file has its size.
    pub fn open(dir: impl AsRef<Path>, tag: &str) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let mut shapes = Vec::new();
        let mut first = None;
        for t in ["K", "V", "Q"] {
            let jp = dir.join(format!("{tag}.{t}.f32.json"));
            let j = read_json(&jp)?;
            if j.get("tensor").and_then(Value::as_str) != Some(t) {
                return Err(Error::bad_dump(&jp, format!("`tensor` is not \"{t}\"")));
            }
            if t != "V" && j.get("post_rope").and_then(Value::as_bool) != Some(true) {
                return Err(Error::bad_dump(
                    &jp,
                    "`post_rope` is not true: the objective needs post-RoPE K and Q",
                ));
            }
            let dims = [
                field(&j, &jp, "n_layer")?,
                field(&j, &jp, "n_tokens")?,
                field(&j, &jp, "n_kv_head")?,
                field(&j, &jp, "n_head")?,
                field(&j, &jp, "head_dim")?,
            ];
            let heads = if t == "Q" { dims[3] } else { dims[2] };
            let want = [dims[0], dims[1], heads, dims[4]];
            let shape: Option<Vec<usize>> = j
                .get("shape")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0) as usize).collect());
            if shape.as_deref() != Some(&want[..]) {
                return Err(Error::bad_dump(
                    &jp,
                    format!("`shape` is {shape:?}, expected {want:?}"),
                ));
            }
            let bin = dir.join(format!("{tag}.{t}.f32.bin"));
            let len = std::fs::metadata(&bin)
                .map_err(|source| Error::Io {
                    path: bin.clone(),
                    source,
                })?
                .len();
            let need = want.iter().map(|&x| x as u64).product::<u64>() * 4;
            if len != need {
                return Err(Error::bad_dump(
                    &bin,
                    format!("{len} bytes, the sidecar's shape {want:?} of f32 needs {need}"),
                ));
            }
            shapes.push(dims);
            for key in ["model", "text_source"] {
                let v = j.get(key).cloned();
                if t == "K" {
                    continue;
                }
                let k0: &Value = first.as_ref().unwrap_or(&Value::Null);
                if v.as_ref() != k0.get(key) {
                    return Err(Error::bad_dump(
                        &jp,
                        format!("`{key}` differs from the K sidecar's"),
                    ));
                }
            }
            if t == "K" {
                first = Some(j);
            }
        }
        if shapes.iter().any(|s| *s != shapes[0]) {
            return Err(Error::bad_dump(
                &dir,
                format!("{tag}: the K, V and Q sidecars give different shapes"),
            ));
        }
        let [n_layer, n_tokens, n_kv_head, n_head, head_dim] = shapes[0];
        if n_head % n_kv_head != 0 {
            return Err(Error::bad_dump(
                &dir,
                format!("{tag}: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}"),
            ));
        }
        Ok(Dump {
            dir,
            tag: tag.to_string(),
            n_layer,
            n_tokens,
            n_kv_head,
            n_head,
            head_dim,
            sidecar: first.unwrap_or(Value::Null),
        })
    }

    /// The sidecar's `model` (the GGUF file name), or "".
    pub fn model(&self) -> &str {
        self.sidecar
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The sidecar's `text_source`, or "".
    pub fn text_source(&self) -> &str {
        self.sidecar
            .get("text_source")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn read_layer(&self, t: &str, layer: usize, heads: usize) -> Result<Vec<f32>> {
        let path = self.dir.join(format!("{}.{t}.f32.bin", self.tag));
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let n = self.n_tokens * heads * self.head_dim;
        let mut bytes = vec![0u8; n * 4];
        let mut f = File::open(&path).map_err(io)?;
        f.seek(SeekFrom::Start((layer * n * 4) as u64))
            .map_err(io)?;
        f.read_exact(&mut bytes).map_err(io)?;
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::bad_dump(
                &path,
                format!("layer {layer}: element {i} is not finite"),
            ));
        }
        Ok(v)
    }

    /// Reads one layer and computes its full-cache attention outputs.
    pub fn layer(&self, layer: usize) -> Result<LayerData<f32>> {
        if layer >= self.n_layer {
            return Err(Error::invalid(
                "layer",
                format!("{layer}, but {} has {} layers", self.tag, self.n_layer),
            ));
        }
        let k = self.read_layer("K", layer, self.n_kv_head)?;
        let v = self.read_layer("V", layer, self.n_kv_head)?;
        let q = self.read_layer("Q", layer, self.n_head)?;
        Ok(LayerData::new(
            self.n_tokens,
            self.n_kv_head,
            self.n_head,
            self.head_dim,
            &k,
            &v,
            &q,
        ))
    }
}
