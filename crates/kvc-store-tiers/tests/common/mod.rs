//! Shared test helpers: the sample KV data and redis-server processes on loopback.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvc_types::Dtype;
use std::sync::{Arc, OnceLock};

use kvc_store_tiers::{ChunkCodec, ChunkShape, Tier, Tiers, TiersConfig, TransformCodec};
use kvc_transform_coder::{calibrate, Dump, Options, Rope, RopeKind};

/// The embedded sample: K and V, `[4][512][3][64]` f16, real llama.cpp values.
pub const SAMPLE_K: &[u8] = include_bytes!("../../../../data/sample/textA.K.f16.bin");
/// See [`SAMPLE_K`].
pub const SAMPLE_V: &[u8] = include_bytes!("../../../../data/sample/textA.V.f16.bin");
/// Tokens in the sample.
pub const SAMPLE_TOKENS: usize = 512;

/// 4 layers, 3 KV heads of 64, f16, chunks of 64 tokens: 8 chunks in the sample.
pub fn shape() -> ChunkShape {
    ChunkShape {
        n_layer: 4,
        n_kv_head: 3,
        head_dim: 64,
        dtype: Dtype::F16,
        chunk_tokens: 64,
    }
}

/// The config of the sample's model with `codec`.
pub fn config(codec: ChunkCodec) -> TiersConfig {
    TiersConfig {
        shape: shape(),
        codec,
        model_hash: [0x5a; 32],
    }
}

/// Token ids of the sample prompt, made distinct per `seed` so tests do not share keys.
pub fn tokens(seed: u32) -> Vec<u32> {
    (0..SAMPLE_TOKENS as u32)
        .map(|i| i.wrapping_mul(2654435761) ^ seed)
        .collect()
}

/// The first `tokens` tokens of each layer of `src` (`[4][512][row]`), layer-major.
pub fn prefix(src: &[u8], tokens: usize) -> Vec<u8> {
    let row = shape().row_bytes();
    let mut out = Vec::new();
    for l in 0..4 {
        let base = l * SAMPLE_TOKENS * row;
        out.extend_from_slice(&src[base..base + tokens * row]);
    }
    out
}

/// A fresh empty directory under the target dir's tmp.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "kvc-tiers-{name}-{}-{:?}",
        std::process::id(),
        Instant::now()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes a directory when dropped.
pub struct TempDir(pub PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether redis-server is installed; without it Redis tests are skipped with a note,
/// except under CI, where scripts/install-deps.sh installs it and its absence fails.
pub fn have_redis() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "redis-server is not installed (scripts/install-deps.sh installs it)"
        );
        eprintln!("SKIPPED: redis-server is not installed (scripts/install-deps.sh installs it)");
    }
    ok
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One redis-server on 127.0.0.1, killed (and its directory removed) when dropped, also
/// when the test fails.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a standalone server (or a cluster-enabled node) and waits until it answers.
    pub fn start(cluster: bool) -> RedisServer {
        Self::start_at(cluster, None)
    }

    /// Starts a standalone server on `port` (a restart after a kill).
    pub fn restart_on(port: u16) -> RedisServer {
        Self::start_at(false, Some(port))
    }

    fn start_at(cluster: bool, fixed: Option<u16>) -> RedisServer {
        let dir = temp_dir("redis");
        for _ in 0..5 {
            let port = fixed.unwrap_or_else(free_port);
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "yes",
                ])
                .arg("--dir")
                .arg(&dir)
                .args(["--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"]);
            if cluster {
                cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                    .args(["--cluster-config-file", &format!("nodes-{port}.conf")]);
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut s = RedisServer {
                port,
                child: Some(child),
                dir: dir.clone(),
            };
            if s.wait_ready() {
                return s;
            }
            s.kill();
        }
        panic!("redis-server did not start");
    }

    fn wait_ready(&mut self) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Some(c) = &mut self.child {
                if let Ok(Some(_)) = c.try_wait() {
                    return false; // exited: port taken
                }
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && cli(self.port, &["PING"]).trim() == "PONG"
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs redis-cli against a port; its stdout.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A 3-master cluster made with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 3 nodes and joins them; waits until every node says `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start(true)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let t = Instant::now();
        loop {
            let ok = nodes
                .iter()
                .all(|n| cli(n.port, &["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "cluster did not become ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    /// `redis+cluster://` with every node.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", addrs.join(","))
    }
}

/// Checks a restore against the sample: the tokens restored are a chunk multiple and
/// every byte equals the original. Panics on any wrong byte (a wrong restore).
pub fn assert_exact(r: &kvc_store_tiers::Restored) {
    assert_eq!(r.tokens % shape().chunk_tokens, 0);
    assert_eq!(r.k, prefix(SAMPLE_K, r.tokens), "wrong K restored");
    assert_eq!(r.v, prefix(SAMPLE_V, r.tokens), "wrong V restored");
}

/// Relative RMS error of f16 `got` against f16 `want`: `sqrt(Σ(g-w)² / Σw²)`.
pub fn rel_rms_f16(got: &[u8], want: &[u8]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut err, mut ref2) = (0f64, 0f64);
    for (g, w) in got.chunks_exact(2).zip(want.chunks_exact(2)) {
        let g = f64::from(half::f16::from_le_bytes([g[0], g[1]]).to_f32());
        let w = f64::from(half::f16::from_le_bytes([w[0], w[1]]).to_f32());
        err += (g - w) * (g - w);
        ref2 += w * w;
    }
    (err / ref2).sqrt()
}

/// The relative RMS error bound of a kvq restore at `bits` per value (Lloyd-Max, head_dim
/// 64, the sample's real K and V). Measured on the sample: 0.092 (K) and 0.093 (V) at 4
/// bits, 0.0061 at 8, 0.33 at 2 (docs/formats/kv-chunk.md).
pub fn kvq_error_bound(bits: u8) -> f64 {
    match bits {
        2 => 0.40,
        4 => 0.10,
        8 => 0.01,
        _ => panic!("no bound for {bits} bits"),
    }
}

/// Checks a restore: byte-exact for a lossless codec; for kvq, every value finite and the
/// relative RMS error of K and V within [`kvq_error_bound`] of their bits. Returns the
/// K and V errors (0 for lossless).
pub fn assert_restored(r: &kvc_store_tiers::Restored, codec: ChunkCodec) -> (f64, f64) {
    assert_eq!(r.tokens % shape().chunk_tokens, 0);
    if codec == ChunkCodec::Transform {
        // Its bound is on attention outputs; per value, a sanity bound of what tc-0.01
        // measured on the sample (K about 0.1, V about 0.2).
        let (wk, wv) = (prefix(SAMPLE_K, r.tokens), prefix(SAMPLE_V, r.tokens));
        let (ek, ev) = (rel_rms_f16(&r.k, &wk), rel_rms_f16(&r.v, &wv));
        assert!(ek < 0.3 && ev < 0.4, "tc: K error {ek:.4}, V error {ev:.4}");
        if r.tokens > 0 {
            assert!(ek > 0.0 && ev > 0.0, "tc: restore is bit-exact");
        }
        return (ek, ev);
    }
    let Some((kb, vb)) = codec.kvq_bits() else {
        assert_exact(r);
        return (0.0, 0.0);
    };
    assert!(!codec.lossless());
    let (wk, wv) = (prefix(SAMPLE_K, r.tokens), prefix(SAMPLE_V, r.tokens));
    assert_eq!((r.k.len(), r.v.len()), (wk.len(), wv.len()));
    let ek = rel_rms_f16(&r.k, &wk);
    let ev = rel_rms_f16(&r.v, &wv);
    assert!(ek.is_finite() && ev.is_finite());
    assert!(
        ek < kvq_error_bound(kb) && ev < kvq_error_bound(vb),
        "{codec:?}: K error {ek:.4} (bound {}), V error {ev:.4} (bound {})",
        kvq_error_bound(kb),
        kvq_error_bound(vb)
    );
    // Lossy but not a no-op: a restore that returned the original bytes would mean the
    // codec was not applied.
    if r.tokens > 0 {
        assert!(ek > 0.0 && ev > 0.0, "{codec:?}: restore is bit-exact");
    }
    (ek, ev)
}

/// The sample as f32 `[4][512][3][64]`.
fn sample_f32(src: &[u8]) -> Vec<f32> {
    src.chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// A transform coder calibrated on the sample itself (its K rows standing in for the
/// queries, which the sample lacks; RoPE as SmolLM2's: norm, base 100000), targets
/// `tc-0.01` and `tc-0.04`; `bound` picks one. Made once per test binary.
pub fn transform_at(bound: &str) -> Arc<TransformCodec> {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    let bytes = BYTES.get_or_init(|| {
        let (k, v) = (sample_f32(SAMPLE_K), sample_f32(SAMPLE_V));
        let dump = Dump {
            n_layer: 4,
            n_tokens: SAMPLE_TOKENS,
            n_kv_head: 3,
            n_head: 3,
            head_dim: 64,
            k: &k,
            v: &v,
            q: &k,
        };
        let opts = Options {
            rope: Rope::from_base(RopeKind::Norm, 64, 64, 100_000.0, 1.0).unwrap(),
            n_sink: 4,
            bounds: vec![0.01, 0.04],
            query_from: 64,
            query_stride: 16,
            layer_weights: Vec::new(),
        };
        calibrate(&dump, &opts).unwrap().0.to_bytes().unwrap()
    });
    Arc::new(TransformCodec::from_file(bytes, bound).unwrap())
}

/// [`transform_at`] `tc-0.01`.
pub fn transform() -> Arc<TransformCodec> {
    transform_at("tc-0.01")
}

/// Tiers over `tiers` with `codec` on the sample's shape; the transform coder gets
/// [`transform`].
pub fn new_tiers(codec: ChunkCodec, tiers: Vec<Box<dyn Tier>>) -> Tiers {
    match codec {
        ChunkCodec::Transform => Tiers::with_transform(config(codec), transform(), tiers),
        _ => Tiers::new(config(codec), tiers),
    }
    .unwrap()
}
