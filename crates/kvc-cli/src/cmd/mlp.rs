//! `kvc mlp`: inspect learned-compressor weight files and compress raw K/V tensors with them.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use kvc_codec::Dtype;
use kvc_mlp::{
    bf16, f16, CompressParams, Compressor, CompressorWeights, ErrorKind, KvElement, KvShape,
};

use crate::cli_error::CliError;

/// `kvc mlp ...`
#[derive(Args)]
pub struct MlpArgs {
    #[command(subcommand)]
    command: MlpCommand,
}

#[derive(Subcommand)]
enum MlpCommand {
    /// Print a .bin v1 weight file's header and every weight block's shape.
    Inspect {
        /// The weight file.
        file: PathBuf,
    },
    /// Compress one layer's K and V (raw little-endian [H, S, D]) and print the new length.
    Compress(CompressArgs),
    /// Train the compressor of every layer on K/V/Q dumps and write a .bin v1 file and a
    /// JSON sidecar (FILE.json).
    Train(Box<super::mlp_train::TrainArgs>),
}

#[derive(Args)]
struct CompressArgs {
    /// The .bin v1 weight file.
    #[arg(long)]
    weights: PathBuf,
    /// Layer index into the weights.
    #[arg(long)]
    layer: usize,
    /// Element type of K, V and the outputs.
    #[arg(long, value_parser = super::codec::float_dtype())]
    dtype: Dtype,
    /// Number of KV heads H.
    #[arg(long)]
    heads: usize,
    /// Sequence length S.
    #[arg(long)]
    seq: usize,
    /// Head dimension D.
    #[arg(long)]
    head_dim: usize,
    /// Length of the image prefix (compressed with the image MLPs).
    #[arg(long, default_value_t = 0)]
    image_kv_len: usize,
    /// Tokens per group (default: the file's compression_factor).
    #[arg(long)]
    factor: Option<usize>,
    /// Minimum number of groups to compress a segment (default: the file's min_seq_len).
    #[arg(long)]
    min_seq_len: Option<usize>,
    /// Input keys, raw [H, S, D].
    #[arg(long)]
    k: PathBuf,
    /// Input values, raw [H, S, D].
    #[arg(long)]
    v: PathBuf,
    /// Output keys, raw [H, S_new, D].
    #[arg(long)]
    out_k: PathBuf,
    /// Output values, raw [H, S_new, D].
    #[arg(long)]
    out_v: PathBuf,
}

fn mlp_error(path: Option<&Path>, e: kvc_mlp::Error) -> CliError {
    match (e.kind(), path) {
        (ErrorKind::Io, _) => CliError::Io(e.to_string()),
        (_, Some(p)) => CliError::input(format!("{}: {e}", p.display())),
        (_, None) => CliError::input(e),
    }
}

/// Runs `kvc mlp`.
pub fn run(args: MlpArgs) -> Result<(), CliError> {
    match args.command {
        MlpCommand::Inspect { file } => inspect(&file),
        MlpCommand::Train(a) => super::mlp_train::run(*a),
        MlpCommand::Compress(a) => match a.dtype {
            Dtype::F16 => compress::<f16>(&a),
            Dtype::Bf16 => compress::<bf16>(&a),
            Dtype::F32 => compress::<f32>(&a),
            d => Err(CliError::input(format!(
                "--dtype {d}: K and V must be f16, bf16 or f32"
            ))),
        },
    }
}

fn inspect(file: &Path) -> Result<(), CliError> {
    let w = CompressorWeights::load(file).map_err(|e| mlp_error(Some(file), e))?;
    let Some(h) = w.header() else {
        return Err(CliError::input("no header"));
    };
    println!("file                   {}", file.display());
    println!("magic                  0x{:08x}", kvc_mlp::MAGIC);
    println!("version                {}", kvc_mlp::VERSION);
    println!(
        "dtype                  {} (code {})",
        h.dtype.name(),
        h.dtype.code()
    );
    println!("num_layers             {}", h.num_layers);
    println!("num_heads              {}", h.num_heads);
    println!(
        "head_dim               {} (used: {})",
        h.head_dim,
        w.head_dim()
    );
    println!("hidden_size            {}", h.hidden_size);
    println!("compression_factor     {}", h.compression_factor);
    println!("min_seq_len            {}", h.min_seq_len);
    println!("weight_count_per_layer {}", h.weight_count_per_layer);
    println!("metadata_size_bytes    {}", h.metadata_size_bytes);
    println!("layer index prefix       slot rows  cols  bias offset");
    for r in w.records() {
        println!(
            "{:5} {:5} {:12} {:4} {:5} {:5} {:4} {}",
            r.layer,
            r.index,
            r.prefix(),
            r.slot(),
            r.rows,
            r.cols,
            if r.has_bias { "yes" } else { "no" },
            r.offset
        );
    }
    let side = super::mlp_train::sidecar_path(file);
    match std::fs::read_to_string(&side) {
        Ok(text) => {
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| CliError::input(format!("{}: not JSON: {e}", side.display())))?;
            println!("sidecar {}:", side.display());
            print_sidecar_summary(&json);
            println!(
                "{}",
                serde_json::to_string_pretty(&json).map_err(CliError::input)?
            );
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!(
                "sidecar                none ({} does not exist)",
                side.display()
            );
        }
        Err(e) => return Err(CliError::io(&side, e)),
    }
    Ok(())
}

/// The sidecar's key facts on a few lines (the whole JSON follows them).
fn print_sidecar_summary(j: &serde_json::Value) {
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::String(x) => x.clone(),
        serde_json::Value::Null => "-".into(),
        x => x.to_string(),
    };
    let e = |v: &serde_json::Value| v.as_f64().map_or("-".into(), |x| format!("{x:.4}"));
    let texts = |v: &serde_json::Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|t| s(&t["text_source"]))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default()
    };
    println!(
        "  model                {} ({})",
        s(&j["model"]["file"]),
        s(&j["model"]["desc"])
    );
    println!(
        "  objective            {} (sink {}, recent {})",
        s(&j["objective"]["name"]),
        s(&j["objective"]["sink"]),
        s(&j["objective"]["recent"])
    );
    println!(
        "  training             {} steps x {} windows, lr {}, seed {}, start {}",
        s(&j["training"]["steps"]),
        s(&j["training"]["batch"]),
        s(&j["training"]["lr"]),
        s(&j["training"]["seed"]),
        s(&j["training"]["init"])
    );
    println!("  train texts          {}", texts(&j["texts"]["train"]));
    println!(
        "  validation texts     {}",
        texts(&j["texts"]["validation"])
    );
    let m = &j["summary"];
    println!(
        "  train error          {} (mean pooling {})",
        e(&m["train_rel_err"]),
        e(&m["train_rel_err_mean_pool"])
    );
    println!(
        "  validation error     {} (mean pooling {})",
        e(&m["val_rel_err"]),
        e(&m["val_rel_err_mean_pool"])
    );
}

fn read_tensor<T: KvElement>(path: &Path, elems: usize) -> Result<Vec<T>, CliError> {
    let bytes = std::fs::read(path).map_err(|e| CliError::io(path, e))?;
    let size = std::mem::size_of::<T>();
    if Some(bytes.len()) != elems.checked_mul(size) {
        return Err(CliError::input(format!(
            "{}: {} bytes, expected {elems} {} elements ({} bytes) for the given shape",
            path.display(),
            bytes.len(),
            T::NAME,
            elems.saturating_mul(size)
        )));
    }
    let mut v = vec![<T as bytemuck::Zeroable>::zeroed(); elems];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(&bytes);
    Ok(v)
}

fn compress<T: KvElement>(a: &CompressArgs) -> Result<(), CliError> {
    let weights =
        CompressorWeights::load(&a.weights).map_err(|e| mlp_error(Some(&a.weights), e))?;
    let comp = Compressor::new(weights);
    let defaults = comp.default_params();
    let params = CompressParams {
        factor: a.factor.unwrap_or(defaults.factor),
        min_seq_len: a.min_seq_len.unwrap_or(defaults.min_seq_len),
        image_kv_len: a.image_kv_len,
    };
    let shape = KvShape {
        heads: a.heads,
        seq_len: a.seq,
        head_dim: a.head_dim,
    };
    // Check the shape and options before reading the tensors.
    let plan = comp
        .plan(a.layer, a.seq, &params)
        .map_err(|e| mlp_error(None, e))?;
    if a.head_dim != comp.weights().head_dim() {
        return Err(CliError::input(format!(
            "--head-dim {} does not match the weights' head_dim {}",
            a.head_dim,
            comp.weights().head_dim()
        )));
    }
    let elems = a
        .heads
        .checked_mul(a.seq)
        .and_then(|x| x.checked_mul(a.head_dim))
        .ok_or_else(|| CliError::input("--heads x --seq x --head-dim overflows"))?;
    let k = read_tensor::<T>(&a.k, elems)?;
    let v = read_tensor::<T>(&a.v, elems)?;
    let n_out = a.heads * plan.lengths().kv_len * a.head_dim;
    let zero = <T as bytemuck::Zeroable>::zeroed();
    let (mut ok, mut ov) = (vec![zero; n_out], vec![zero; n_out]);
    let lens = comp
        .compress_layer(a.layer, shape, &k, &v, &mut ok, &mut ov, &params)
        .map_err(|e| mlp_error(None, e))?;
    for (path, data) in [(&a.out_k, &ok), (&a.out_v, &ov)] {
        std::fs::write(path, bytemuck::cast_slice::<T, u8>(data))
            .map_err(|e| CliError::io(path, e))?;
    }
    println!(
        "kv_len {} rope_position {} (layer {}, {} -> {} tokens, factor {}, min_seq_len {}, image_kv_len {})",
        lens.kv_len,
        lens.rope_position,
        a.layer,
        a.seq,
        lens.kv_len,
        params.factor,
        params.min_seq_len,
        params.image_kv_len
    );
    Ok(())
}
