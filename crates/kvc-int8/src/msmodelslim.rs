//! msmodelslim checkpoints: `quant_model_description.json` + `quant_model_weight.safetensors`,
//! the C8 part (`<attn>.k_proj.kv_cache_scale`, `.k_proj.kv_cache_offset`, and `v_proj`).
//!
//! Reading: the description must declare `kv_cache_type` (or `kv_quant_type`) `"C8"`;
//! tensors are found by their suffix and the layer number is the first all-digit
//! component of the name (`model.layers.3.self_attn.k_proj.kv_cache_scale`,
//! `transformer.encoder.layers.3.self_attention.query_key_value.k_proj.kv_cache_scale`).
//! Scales and offsets may be fp16, bf16 or fp32. Other tensors are ignored.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use kvc_types::{extend_f32, FloatDtype};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::error::{Error, Result};
use crate::{C8Params, ChannelQuant, LayerQuant};

/// The description file's name.
pub const DESCRIPTION_FILE: &str = "quant_model_description.json";
/// The weight file's name.
pub const WEIGHT_FILE: &str = "quant_model_weight.safetensors";

/// The safetensors element type that stores scales and offsets of `dtype`.
fn safetensors_dtype(dtype: FloatDtype) -> Dtype {
    match dtype {
        FloatDtype::F16 => Dtype::F16,
        FloatDtype::Bf16 => Dtype::BF16,
        FloatDtype::F32 => Dtype::F32,
    }
}

const SUFFIXES: [&str; 4] = [
    "k_proj.kv_cache_scale",
    "k_proj.kv_cache_offset",
    "v_proj.kv_cache_scale",
    "v_proj.kv_cache_offset",
];

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Checks a description: a JSON object whose `kv_cache_type` or `kv_quant_type` is "C8".
pub fn check_description(bytes: &[u8], path: &str) -> Result<()> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| Error::BadDescription {
            path: path.into(),
            reason: e.to_string(),
        })?;
    let obj = v.as_object().ok_or_else(|| Error::BadDescription {
        path: path.into(),
        reason: "not a JSON object".into(),
    })?;
    let found = obj
        .get("kv_cache_type")
        .or_else(|| obj.get("kv_quant_type"));
    match found {
        Some(serde_json::Value::String(s)) if s == "C8" => Ok(()),
        Some(other) => Err(Error::NotC8 {
            path: path.into(),
            found: other.to_string(),
        }),
        None => Err(Error::NotC8 {
            path: path.into(),
            found: "missing".into(),
        }),
    }
}

/// The layer number of a tensor name: its first all-digit dotted component.
pub fn layer_number(name: &str) -> Option<usize> {
    name.split('.')
        .find(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()
}

fn which_suffix(name: &str) -> Option<usize> {
    SUFFIXES.iter().position(|s| {
        name.strip_suffix(s)
            .is_some_and(|head| head.is_empty() || head.ends_with('.'))
    })
}

fn tensor_values(name: &str, t: &TensorView<'_>) -> Result<Vec<f32>> {
    let bad = |reason: String| Error::BadTensor {
        name: name.into(),
        reason,
    };
    let n: usize = t.shape().iter().product();
    if n == 0 || t.shape().iter().filter(|&&d| d != 1).count() > 1 {
        return Err(bad(format!(
            "shape {:?} is not a vector of channels",
            t.shape()
        )));
    }
    let data = t.data();
    let vals: Vec<f32> = match t.dtype() {
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        other => return Err(bad(format!("dtype {other:?} (expected F16, BF16 or F32)"))),
    };
    if vals.len() != n {
        return Err(bad(format!(
            "{} values for shape {:?}",
            vals.len(),
            t.shape()
        )));
    }
    Ok(vals)
}

type Partial = BTreeMap<usize, [Option<(String, Vec<f32>)>; 4]>;

fn collect(bytes: &[u8], path: &str, acc: &mut Partial) -> Result<()> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::BadSafetensors {
        path: path.into(),
        reason: format!("{e}"),
    })?;
    for (name, view) in st.iter() {
        let Some(w) = which_suffix(name) else {
            continue;
        };
        let layer = layer_number(name).ok_or_else(|| Error::BadTensor {
            name: name.into(),
            reason: "no layer number in the name".into(),
        })?;
        let vals = tensor_values(name, &view)?;
        let slot = &mut acc.entry(layer).or_default()[w];
        if let Some((prev, _)) = slot {
            return Err(Error::BadTensor {
                name: name.into(),
                reason: format!("duplicate of {prev}"),
            });
        }
        *slot = Some((name.to_string(), vals));
    }
    Ok(())
}

fn assemble(acc: Partial) -> Result<C8Params> {
    let mut params = C8Params::new();
    for (layer, slots) in acc {
        let [ks, ko, vs, vo] = slots.map(|s| s);
        let take = |s: Option<(String, Vec<f32>)>, w: usize| {
            s.ok_or(Error::MissingTensor {
                layer,
                which: SUFFIXES[w],
            })
        };
        let (ksn, ks) = take(ks, 0)?;
        let (_, ko) = take(ko, 1)?;
        let (vsn, vs) = take(vs, 2)?;
        let (_, vo) = take(vo, 3)?;
        let wrap = |name: &str, r: crate::Result<ChannelQuant>| {
            r.map_err(|e| Error::BadTensor {
                name: name.into(),
                reason: e.to_string(),
            })
        };
        let k = wrap(&ksn, ChannelQuant::new(ks, ko))?;
        let v = wrap(&vsn, ChannelQuant::new(vs, vo))?;
        params
            .insert(layer, LayerQuant { k, v })
            .map_err(|e| Error::BadTensor {
                name: ksn.clone(),
                reason: e.to_string(),
            })?;
    }
    if params.is_empty() {
        return Err(Error::MissingTensor {
            layer: 0,
            which: "k_proj.kv_cache_scale (no C8 tensors found)",
        });
    }
    Ok(params)
}

/// Reads the C8 parameters of one safetensors image.
pub fn parse_weights(bytes: &[u8], path: &str) -> Result<C8Params> {
    let mut acc = Partial::new();
    collect(bytes, path, &mut acc)?;
    assemble(acc)
}

fn find(dir: &Path, exact: &str, prefix: &str, ext: &str) -> Result<Vec<PathBuf>> {
    let p = dir.join(exact);
    if p.is_file() {
        return Ok(vec![p]);
    }
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(ext))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(io(
            &p,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        ));
    }
    Ok(v)
}

/// Reads an msmodelslim checkpoint directory: `quant_model_description.json` (or the one
/// `quant_model_description*.json`) and `quant_model_weight.safetensors` (or every
/// `quant_model_weight*.safetensors` shard).
pub fn read_checkpoint(dir: &Path) -> Result<C8Params> {
    let desc = find(dir, DESCRIPTION_FILE, "quant_model_description", ".json")?;
    if desc.len() > 1 {
        return Err(Error::BadDescription {
            path: dir.display().to_string(),
            reason: format!("{} description files, expected one", desc.len()),
        });
    }
    let bytes = fs::read(&desc[0]).map_err(|e| io(&desc[0], e))?;
    check_description(&bytes, &desc[0].display().to_string())?;
    let mut acc = Partial::new();
    for w in find(dir, WEIGHT_FILE, "quant_model_weight", ".safetensors")? {
        let bytes = fs::read(&w).map_err(|e| io(&w, e))?;
        collect(&bytes, &w.display().to_string(), &mut acc)?;
    }
    assemble(acc)
}

/// The tensor-name prefix kvc writes for layer `i` (Llama / Qwen naming).
pub fn layer_prefix(i: usize) -> String {
    format!("model.layers.{i}.self_attn.")
}

/// The description JSON for `params` (KV-only quantization: the model stays float).
pub fn description_json(params: &C8Params) -> String {
    let mut m = serde_json::Map::new();
    m.insert("model_quant_type".into(), "FLOAT".into());
    m.insert("kv_cache_type".into(), "C8".into());
    for (i, _) in params.layers() {
        for s in SUFFIXES {
            m.insert(format!("{}{s}", layer_prefix(i)), "FLOAT".into());
        }
    }
    let mut s = serde_json::to_string_pretty(&serde_json::Value::Object(m)).unwrap_or_default();
    s.push('\n');
    s
}

/// The safetensors image for `params`, scales and offsets stored as `dtype`.
pub fn weights_bytes(params: &C8Params, dtype: FloatDtype) -> Result<Vec<u8>> {
    let mut bufs: Vec<(String, Vec<u8>, usize)> = Vec::new();
    for (i, l) in params.layers() {
        for (s, q, sc) in [
            (0, &l.k, true),
            (1, &l.k, false),
            (2, &l.v, true),
            (3, &l.v, false),
        ] {
            let vals = if sc { q.scale() } else { q.offset() };
            let mut bytes = Vec::with_capacity(vals.len() * dtype.size());
            extend_f32(dtype.dtype(), vals, &mut bytes);
            bufs.push((
                format!("{}{}", layer_prefix(i), SUFFIXES[s]),
                bytes,
                vals.len(),
            ));
        }
    }
    let views = bufs
        .iter()
        .map(|(n, b, len)| {
            TensorView::new(safetensors_dtype(dtype), vec![*len], b).map(|v| (n.as_str(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::BadSafetensors {
            path: "(writing)".into(),
            reason: format!("{e}"),
        })?;
    safetensors::serialize(views, None).map_err(|e| Error::BadSafetensors {
        path: "(writing)".into(),
        reason: format!("{e}"),
    })
}

/// Writes `DIR/quant_model_description.json` and `DIR/quant_model_weight.safetensors`.
pub fn write_checkpoint(dir: &Path, params: &C8Params, dtype: FloatDtype) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let w = weights_bytes(params, dtype)?;
    let d = dir.join(DESCRIPTION_FILE);
    fs::write(&d, description_json(params)).map_err(|e| io(&d, e))?;
    let p = dir.join(WEIGHT_FILE);
    fs::write(&p, w).map_err(|e| io(&p, e))
}
