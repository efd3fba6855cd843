//! `kvc bench tiers`: kvc-store-tiers on real KV dumps (the embedded sample by default).
//! For each tier (memory, disk, Redis) and codec (raw, gear-v1, gear-v2, kvq-k4v4 by
//! default; kvq-k8v4 and kvq-k4v2 on request) it stores
//! `--prompts` distinct prompts of the dump's K and V through a fresh [`Tiers`] over that
//! one tier and restores them `--reps` times (`Tiers::restore_into`, into K and V buffers
//! allocated once, as `kvc_tiers_restore` writes an engine's cache): store and restore GB/s (uncompressed bytes),
//! p50/p99 latency of a one-chunk restore, and bytes per token stored against f16. Every
//! restore must be complete; a lossless codec's is checked bit for bit, a kvq (lossy)
//! one's relative RMS error of K and V is reported and must be finite and below 0.5. The baseline,
//! measured in the same run on the same server, is Redis itself with raw values: the same
//! bytes per chunk SET in pipelines and read with one MGET per prompt, no blob format,
//! checksum or codec. `--redis URL` uses a server (or `redis+cluster://` nodes); without
//! it a temporary `redis-server` on 127.0.0.1 is started if the binary exists, else the
//! Redis rows are skipped with a note. Keys carry a per-run salt and a 10-minute TTL.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use kvc_store_tiers::{
    load_transform, Blob, ChunkCodec, ChunkKey, ChunkShape, DiskTier, MemoryTier, RedisConfig,
    RedisTier, Tier, Tiers, TiersConfig, TransformCodec,
};
use kvc_types::Dtype;
use serde_json::{json, Value};

use super::dataset::{self, Dataset, Dump};
use crate::cli_error::CliError;

/// `kvc bench tiers` arguments.
#[derive(Args, Clone, Debug)]
pub struct BenchTiersArgs {
    /// KV dumps (a directory in the realkv format); default the embedded sample.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Redis to use: `redis://host:port` or `redis+cluster://host:port,host:port,...`;
    /// default a temporary redis-server on 127.0.0.1 when the binary exists.
    #[arg(long)]
    pub redis: Option<String>,
    /// Tokens per chunk.
    #[arg(long = "chunk-tokens", default_value_t = 256)]
    pub chunk_tokens: usize,
    /// Distinct prompts stored (each the dump's tokens under other token ids).
    #[arg(long, default_value_t = 16)]
    pub prompts: usize,
    /// Restores of every prompt.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Codecs, comma-separated: raw, gear-v1, gear-v2 (lossless), kvq-k4v4 (or kvq),
    /// kvq-k8v4, kvq-k4v2, tc-<bound> (lossy; tc needs --tc-calibration).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,gear-v1,gear-v2,kvq-k4v4"
    )]
    pub codec: Vec<String>,
    /// The transform coder's calibration file (`kvc tc calibrate`) for `tc-<bound>` codecs;
    /// it must be for the dump's layout (a full-model dump, `--data`).
    #[arg(long = "tc-calibration")]
    pub tc_calibration: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn lib(e: impl std::fmt::Display) -> CliError {
    CliError::input(e)
}

/// A redis-server this bench started; killed when dropped.
struct TempRedis {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Drop for TempRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_redis() -> Option<TempRedis> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let dir = std::env::temp_dir().join(format!("kvc-bench-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--maxmemory", "2gb"])
        .args(["--maxmemory-policy", "allkeys-lru"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let r = TempRedis {
        child,
        dir,
        url: format!("redis://127.0.0.1:{port}"),
    };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let probe = RedisTier::new(RedisConfig::new(r.url.clone())).ok()?;
            if probe.contains(&[ChunkKey::ROOT]).is_ok() {
                return Some(r);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn find<'a>(ds: &'a Dataset, tensor: &str) -> Result<&'a Dump, CliError> {
    ds.dumps
        .iter()
        .find(|d| d.tensor == tensor && d.dtype == Dtype::F16)
        .ok_or_else(|| CliError::input(format!("{}: no f16 {tensor} dump", ds.source)))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn salt() -> [u8; 32] {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut s = [0u8; 32];
    s[..16].copy_from_slice(&n.to_le_bytes());
    s[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    s
}

struct Setup<'a> {
    shape: ChunkShape,
    k: &'a [u8],
    v: &'a [u8],
    n_tok: usize,
    chunks: usize,
    prompts: usize,
    reps: usize,
    salt: [u8; 32],
}

impl Setup<'_> {
    fn tokens(&self, p: usize) -> Vec<u32> {
        (0..self.n_tok as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ (p as u32).wrapping_mul(0x9e37_79b9))
            .collect()
    }
    /// Uncompressed bytes of one prompt's full chunks.
    fn prompt_bytes(&self) -> usize {
        self.chunks * self.shape.chunk_raw_bytes()
    }
    /// The first `tokens` tokens of each layer of `src`.
    fn prefix(&self, src: &[u8], tokens: usize) -> Vec<u8> {
        let row = self.shape.row_bytes();
        let mut out = Vec::with_capacity(self.shape.n_layer * tokens * row);
        for l in 0..self.shape.n_layer {
            let b = l * self.n_tok * row;
            out.extend_from_slice(&src[b..b + tokens * row]);
        }
        out
    }
}

/// CPU seconds (user + system, every thread) this process has used, from
/// `/proc/self/stat` (in USER_HZ = 100 ticks per second, Linux's fixed ABI value); `None`
/// where it cannot be read. A Redis server's own CPU is not in it.
fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) close with ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// CPU seconds per GB of `bytes` between two [`process_cpu_s`] readings.
fn cpu_per_gb(before: Option<f64>, after: Option<f64>, bytes: f64) -> Option<f64> {
    Some((after? - before?) / (bytes / 1e9))
}

fn gbs(bytes: f64, s: f64) -> f64 {
    if s > 0.0 {
        bytes / s / 1e9
    } else {
        0.0
    }
}

/// Redis alone: raw chunk values (K then V of every layer), SET in one pipeline per prompt,
/// read back with one MGET per prompt, and one-chunk GET latency.
fn baseline(s: &Setup, url: &str) -> Result<Value, CliError> {
    let mut cfg = RedisConfig::new(url);
    cfg.ttl = Some(Duration::from_secs(600));
    cfg.key_prefix = "kvc-bench-raw:".to_string();
    let tier = RedisTier::new(cfg).map_err(lib)?;
    let sec = s.shape.section_bytes();
    let row = s.shape.row_bytes();
    let values: Vec<Blob> = (0..s.chunks)
        .map(|c| {
            let mut v = Vec::with_capacity(s.shape.chunk_raw_bytes());
            for src in [s.k, s.v] {
                for l in 0..s.shape.n_layer {
                    let b = l * s.n_tok * row + c * sec;
                    v.extend_from_slice(&src[b..b + sec]);
                }
            }
            Arc::new(v)
        })
        .collect();
    let key = |p: usize, c: usize| {
        let mut k = s.salt;
        k[20..28].copy_from_slice(&(p as u64).to_le_bytes());
        k[28..32].copy_from_slice(&(c as u32).to_le_bytes());
        ChunkKey(k)
    };
    // Connect outside the timing, as the tiers' rows do.
    tier.contains(&[key(0, 0)]).map_err(lib)?;
    let t = Instant::now();
    for p in 0..s.prompts {
        let items: Vec<(ChunkKey, Blob)> = (0..s.chunks)
            .map(|c| (key(p, c), values[c].clone()))
            .collect();
        tier.put(&items).map_err(lib)?;
    }
    let store_s = t.elapsed().as_secs_f64();
    let cpu0 = process_cpu_s();
    let t = Instant::now();
    for _ in 0..s.reps {
        for p in 0..s.prompts {
            let keys: Vec<ChunkKey> = (0..s.chunks).map(|c| key(p, c)).collect();
            let got = tier.get(&keys).map_err(lib)?;
            if got.iter().any(|g| g.is_none()) {
                return Err(CliError::input(
                    "redis baseline: a raw value was not read back",
                ));
            }
        }
    }
    let restore_s = t.elapsed().as_secs_f64();
    let cpu1 = process_cpu_s();
    let mut lat = Vec::new();
    for _ in 0..s.reps {
        for p in 0..s.prompts {
            let t = Instant::now();
            let g = tier.get(&[key(p, 0)]).map_err(lib)?;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            if g[0].as_deref() != Some(&*values[0]) {
                return Err(CliError::input(
                    "redis baseline: a raw value came back different",
                ));
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    let bytes = (s.prompts * s.prompt_bytes()) as f64;
    Ok(json!({
        "tier": "redis-raw-baseline",
        "codec": "none (raw f16 values, no blob format)",
        "store_gbs": gbs(bytes, store_s),
        "restore_gbs": gbs(bytes * s.reps as f64, restore_s),
        "restore_cpu_s_per_gb": cpu_per_gb(cpu0, cpu1, bytes * s.reps as f64),
        "chunk_restore_p50_ms": percentile(&lat, 0.5),
        "chunk_restore_p99_ms": percentile(&lat, 0.99),
        "bytes_per_token": s.shape.chunk_raw_bytes() as f64 / s.shape.chunk_tokens as f64,
    }))
}

/// One codec of the run: its id, its name, and the transform codec of `tc-<bound>`.
struct CodecChoice {
    codec: ChunkCodec,
    name: String,
    tc: Option<Arc<TransformCodec>>,
}

fn run_one(
    s: &Setup,
    tier_name: &str,
    tier: Box<dyn Tier>,
    choice: &CodecChoice,
) -> Result<Value, CliError> {
    let codec = choice.codec;
    let mut model_hash = s.salt;
    model_hash[31] ^= codec.id().wrapping_add(1);
    let cfg = TiersConfig {
        shape: s.shape,
        codec,
        model_hash,
    };
    let t = match &choice.tc {
        None => Tiers::new(cfg, vec![tier]),
        Some(tc) => Tiers::with_transform(cfg, tc.clone(), vec![tier]),
    }
    .map_err(lib)?;
    // Connect (Redis) outside the timing.
    t.lookup(&s.tokens(0));
    let t0 = Instant::now();
    for p in 0..s.prompts {
        let r = t.store(&s.tokens(p), s.k, s.v, s.n_tok).map_err(lib)?;
        if r.failures > 0 || r.chunks_encoded != s.chunks {
            return Err(CliError::input(format!(
                "{tier_name}/{}: store of prompt {p} wrote {} of {} chunks with {} failures",
                choice.name, r.chunks_encoded, s.chunks, r.failures
            )));
        }
    }
    let store_s = t0.elapsed().as_secs_f64();
    let full = s.chunks * s.shape.chunk_tokens;
    let store_s_per_1k_tokens = store_s / (s.prompts * full) as f64 * 1000.0;
    // Restores go straight into buffers allocated once, as an engine's KV cache is
    // (`Tiers::restore_into`, what `kvc_tiers_restore` does); every prompt holds the same KV.
    let (mut rk, mut rv) = (vec![0u8; s.k.len()], vec![0u8; s.v.len()]);
    let cpu0 = process_cpu_s();
    let t0 = Instant::now();
    for _ in 0..s.reps {
        for p in 0..s.prompts {
            let got = t
                .restore_into(&s.tokens(p), full, &mut rk, &mut rv)
                .map_err(lib)?;
            if got != full {
                return Err(CliError::input(format!(
                    "{tier_name}/{}: restore of prompt {p} gave {got} of {full} tokens",
                    choice.name,
                )));
            }
        }
    }
    let restore_s = t0.elapsed().as_secs_f64();
    let cpu1 = process_cpu_s();
    // Outside the timing: bit-exact for a lossless codec; for kvq the relative RMS error
    // of K and V (a sanity bound only: the tests hold the per-bits bounds).
    let (want_k, want_v) = (s.prefix(s.k, full), s.prefix(s.v, full));
    let (rk, rv) = (&mut rk[..want_k.len()], &mut rv[..want_v.len()]);
    let exact = *rk == want_k && *rv == want_v;
    let (err_k, err_v) = (rel_rms_f16(rk, &want_k), rel_rms_f16(rv, &want_v));
    if codec.lossless() && !exact {
        return Err(CliError::input(format!(
            "{tier_name}/{}: a restore is not bit-exact",
            codec.name()
        )));
    }
    if !(codec.lossless() || (err_k < 0.5 && err_v < 0.5)) {
        return Err(CliError::input(format!(
            "{tier_name}/{}: restore error K {err_k} V {err_v} (relative RMS) is not below 0.5",
            codec.name()
        )));
    }
    let mut lat = Vec::new();
    for _ in 0..s.reps {
        for p in 0..s.prompts {
            let toks = s.tokens(p);
            let t1 = Instant::now();
            let got = t
                .restore_into(&toks[..s.shape.chunk_tokens], full, rk, rv)
                .map_err(lib)?;
            lat.push(t1.elapsed().as_secs_f64() * 1e3);
            if got != s.shape.chunk_tokens {
                return Err(CliError::input("a one-chunk restore missed"));
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    let m = t.metrics();
    let bytes = (s.prompts * s.prompt_bytes()) as f64;
    let tokens_stored = (s.prompts * full) as f64;
    let per_token = m.blob_bytes_encoded as f64 / tokens_stored;
    let f16_per_token = (2 * s.shape.n_layer * s.shape.n_kv_head * s.shape.head_dim * 2) as f64;
    Ok(json!({
        "tier": tier_name,
        "codec": choice.name,
        "store_gbs": gbs(bytes, store_s),
        "store_s_per_1k_tokens": store_s_per_1k_tokens,
        "restore_gbs": gbs(bytes * s.reps as f64, restore_s),
        "restore_cpu_s_per_gb": cpu_per_gb(cpu0, cpu1, bytes * s.reps as f64),
        "chunk_restore_p50_ms": percentile(&lat, 0.5),
        "chunk_restore_p99_ms": percentile(&lat, 0.99),
        "bytes_per_token": per_token,
        "f16_over_stored": f16_per_token / per_token,
        "lossless": codec.lossless(),
        "bit_exact": exact,
        "rel_rms_error_k": err_k,
        "rel_rms_error_v": err_v,
        "fallbacks": m.fallbacks,
    }))
}

/// Relative RMS error of f16 `got` against f16 `want`: `sqrt(Σ(g-w)² / Σw²)`.
fn rel_rms_f16(got: &[u8], want: &[u8]) -> f64 {
    let (mut err, mut ref2) = (0f64, 0f64);
    for (g, w) in got.chunks_exact(2).zip(want.chunks_exact(2)) {
        let g = f64::from(half::f16::from_le_bytes([g[0], g[1]]).to_f32());
        let w = f64::from(half::f16::from_le_bytes([w[0], w[1]]).to_f32());
        err += (g - w) * (g - w);
        ref2 += w * w;
    }
    if ref2 > 0.0 {
        (err / ref2).sqrt()
    } else {
        0.0
    }
}

/// Runs `kvc bench tiers`.
pub fn run(a: &BenchTiersArgs) -> Result<(), CliError> {
    let ds = match &a.data {
        Some(d) => dataset::load_dir(d)?,
        None => dataset::embedded()?,
    };
    let (kd, vd) = (find(&ds, "K")?, find(&ds, "V")?);
    if (kd.n_layer, kd.n_tokens, kd.n_kv_head, kd.head_dim)
        != (vd.n_layer, vd.n_tokens, vd.n_kv_head, vd.head_dim)
    {
        return Err(CliError::input("K and V dumps differ in shape"));
    }
    if a.prompts == 0 || a.reps == 0 {
        return Err(CliError::input("--prompts and --reps must be at least 1"));
    }
    let shape = ChunkShape {
        n_layer: kd.n_layer,
        n_kv_head: kd.n_kv_head,
        head_dim: kd.head_dim,
        dtype: Dtype::F16,
        chunk_tokens: a.chunk_tokens,
    };
    shape.validate().map_err(lib)?;
    let chunks = kd.n_tokens / a.chunk_tokens;
    if chunks == 0 {
        return Err(CliError::input(format!(
            "--chunk-tokens {} is more than the dump's {} tokens",
            a.chunk_tokens, kd.n_tokens
        )));
    }
    let codecs: Vec<CodecChoice> = a
        .codec
        .iter()
        .map(|name| {
            let codec = ChunkCodec::from_name(name).map_err(lib)?;
            let tc = match codec {
                ChunkCodec::Transform => {
                    let path = a.tc_calibration.as_ref().ok_or_else(|| {
                        CliError::input(format!("--codec {name} needs --tc-calibration FILE"))
                    })?;
                    Some(load_transform(path, name).map_err(lib)?)
                }
                _ => None,
            };
            Ok(CodecChoice {
                codec,
                name: name.clone(),
                tc,
            })
        })
        .collect::<Result<_, CliError>>()?;
    let s = Setup {
        shape,
        k: &kd.bytes,
        v: &vd.bytes,
        n_tok: kd.n_tokens,
        chunks,
        prompts: a.prompts,
        reps: a.reps,
        salt: salt(),
    };
    let mut temp = None;
    let mut note = None;
    let redis_url = match &a.redis {
        Some(u) => Some(u.clone()),
        None => match start_redis() {
            Some(r) => {
                let u = r.url.clone();
                temp = Some(r);
                Some(u)
            }
            None => {
                note = Some("no --redis and no redis-server to start: Redis rows skipped");
                None
            }
        },
    };
    println!(
        "kvc bench tiers: {} (f16, {} layers x {} tokens x {} KV heads x {}), {} prompts x {} chunks of {} tokens, {} restores each",
        ds.source, shape.n_layer, kd.n_tokens, shape.n_kv_head, shape.head_dim, s.prompts, chunks,
        a.chunk_tokens, s.reps
    );
    let mut rows = Vec::new();
    let disk_root = std::env::temp_dir().join(format!("kvc-bench-tiers-{}", std::process::id()));
    let mut base = None;
    if let Some(url) = &redis_url {
        base = Some(baseline(&s, url)?);
    }
    for codec in &codecs {
        rows.push(run_one(
            &s,
            "memory",
            Box::new(MemoryTier::new(u64::MAX)),
            codec,
        )?);
        let dir = disk_root.join(&codec.name);
        let disk = DiskTier::open(&dir, u64::MAX).map_err(lib)?;
        let r = run_one(&s, "disk", Box::new(disk), codec);
        let _ = std::fs::remove_dir_all(&dir);
        rows.push(r?);
        if let Some(url) = &redis_url {
            let mut cfg = RedisConfig::new(url.clone());
            cfg.ttl = Some(Duration::from_secs(600));
            cfg.io_timeout = Duration::from_secs(10);
            let tier = RedisTier::new(cfg).map_err(lib)?;
            rows.push(run_one(&s, "redis", Box::new(tier), codec)?);
        }
    }
    let _ = std::fs::remove_dir_all(&disk_root);
    drop(temp);
    let base_restore = base
        .as_ref()
        .and_then(|b| b["restore_gbs"].as_f64())
        .unwrap_or(0.0);
    for r in rows.iter_mut() {
        if r["tier"] == "redis" && base_restore > 0.0 {
            r["restore_vs_raw_redis"] =
                json!(r["restore_gbs"].as_f64().unwrap_or(0.0) / base_restore);
        }
    }
    println!(
        "{:<20} {:<8} {:>10} {:>12} {:>9} {:>9} {:>9} {:>9} {:>10} {:>13}",
        "tier",
        "codec",
        "store GB/s",
        "restore GB/s",
        "CPU s/GB",
        "p50 ms",
        "p99 ms",
        "B/token",
        "f16/stored",
        "rel err K/V"
    );
    for r in base.iter().chain(rows.iter()) {
        println!(
            "{:<20} {:<8} {:>10.3} {:>12.3} {:>9.3} {:>9.3} {:>9.3} {:>9.0} {:>10} {:>13}",
            r["tier"].as_str().unwrap_or(""),
            r["codec"]
                .as_str()
                .unwrap_or("")
                .split(' ')
                .next()
                .unwrap_or(""),
            r["store_gbs"].as_f64().unwrap_or(0.0),
            r["restore_gbs"].as_f64().unwrap_or(0.0),
            r["restore_cpu_s_per_gb"].as_f64().unwrap_or(f64::NAN),
            r["chunk_restore_p50_ms"].as_f64().unwrap_or(0.0),
            r["chunk_restore_p99_ms"].as_f64().unwrap_or(0.0),
            r["bytes_per_token"].as_f64().unwrap_or(0.0),
            r["f16_over_stored"]
                .as_f64()
                .map_or("1 (raw)".to_string(), |x| format!("{x:.3}")),
            match r["lossless"].as_bool() {
                Some(false) => format!(
                    "{:.4}/{:.4}",
                    r["rel_rms_error_k"].as_f64().unwrap_or(f64::NAN),
                    r["rel_rms_error_v"].as_f64().unwrap_or(f64::NAN)
                ),
                Some(true) => "0 (exact)".to_string(),
                None => String::new(),
            },
        );
    }
    if let Some(n) = note {
        println!("note: {n}");
    }
    println!("GB/s are of uncompressed f16 K+V; the disk tier reads through the page cache.");
    println!(
        "CPU s/GB: this process's CPU (all threads) per GB restored, without the Redis server's."
    );
    let out = json!({
        "source": ds.source,
        "shape": {"n_layer": shape.n_layer, "n_kv_head": shape.n_kv_head, "head_dim": shape.head_dim,
                  "dtype": "f16", "chunk_tokens": a.chunk_tokens, "tokens_per_prompt": kd.n_tokens},
        "prompts": s.prompts,
        "reps": s.reps,
        "redis": redis_url.as_ref().map(|u| json!({"url": u, "started_by_bench": a.redis.is_none()})),
        "note": note,
        "baseline": base,
        "rows": rows,
    });
    if let Some(p) = &a.json {
        let txt = serde_json::to_string_pretty(&out).map_err(CliError::input)?;
        std::fs::write(p, txt).map_err(|e| CliError::io(p, e))?;
    }
    Ok(())
}
