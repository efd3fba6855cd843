//! The Redis tier: standalone Redis or Redis Cluster through the `redis` crate.
//!
//! Values are stored with `SET key value [EX ttl]` (atomic: a reader sees the old or the
//! new value, never a mix, so two writers of the same chunk both leave a valid value) in
//! one pipeline per batch, and read with one `MGET` (standalone) or one pipeline of `GET`s
//! routed per slot (Cluster, where keys of one batch live on different nodes). Eviction is
//! Redis's own: run it with `maxmemory` and `maxmemory-policy allkeys-lru`. Connections
//! have connect and I/O timeouts; a failed command drops its connection and the tier
//! answers errors without trying the network for `retry_after`, so a dead server costs
//! one timeout, not one per request. Connections are pooled for concurrent callers.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::cluster::{ClusterClient, ClusterConnection};

use crate::error::{Error, Result};
use crate::key::ChunkKey;
use crate::tier::{Blob, Tier};

/// How to reach Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://host:port[/db]` for a standalone server, or
    /// `redis+cluster://host:port[,host:port...]` for the seed nodes of a cluster.
    pub url: String,
    /// Expiry of stored values; `None` keeps them until Redis evicts them.
    pub ttl: Option<Duration>,
    /// Limit on establishing a connection.
    pub connect_timeout: Duration,
    /// Limit on one command's reply (reads and writes).
    pub io_timeout: Duration,
    /// After a failure, how long the tier reports errors without trying the network.
    pub retry_after: Duration,
    /// Prefix of every key (`kvc:` by default): one Redis can serve other data too.
    pub key_prefix: String,
}

impl RedisConfig {
    /// Defaults for `url`: no TTL, 1 s connect timeout, 2 s I/O timeout, 1 s retry pause,
    /// prefix `kvc:`.
    pub fn new(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            url: url.into(),
            ttl: None,
            connect_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(2),
            retry_after: Duration::from_secs(1),
            key_prefix: "kvc:".to_string(),
        }
    }
}

enum Client {
    Single(redis::Client),
    Cluster(ClusterClient),
}

enum Conn {
    Single(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

/// The Redis tier.
pub struct RedisTier {
    cfg: RedisConfig,
    client: Client,
    pool: Mutex<Vec<Conn>>,
    down_until: Mutex<Option<Instant>>,
}

fn rerr(op: &'static str) -> impl Fn(redis::RedisError) -> Error {
    move |e| Error::Redis {
        op,
        reason: e.to_string(),
    }
}

impl RedisTier {
    /// A tier for `cfg`. Checks the URL; connects lazily (a server that is down now is
    /// a miss now and used once it is up).
    pub fn new(cfg: RedisConfig) -> Result<RedisTier> {
        let client = if let Some(nodes) = cfg.url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = nodes
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(Error::invalid(
                    "redis url",
                    format!("{}: no cluster nodes", cfg.url),
                ));
            }
            let c = ClusterClient::builder(nodes)
                .connection_timeout(cfg.connect_timeout)
                .response_timeout(cfg.io_timeout)
                .retries(1)
                .min_retry_wait(10)
                .max_retry_wait(100)
                .build()
                .map_err(|e| Error::invalid("redis url", format!("{}: {e}", cfg.url)))?;
            Client::Cluster(c)
        } else {
            let c = redis::Client::open(cfg.url.as_str())
                .map_err(|e| Error::invalid("redis url", format!("{}: {e}", cfg.url)))?;
            Client::Single(c)
        };
        if cfg.io_timeout.is_zero() || cfg.connect_timeout.is_zero() {
            return Err(Error::invalid("redis timeouts", "must be more than zero"));
        }
        Ok(RedisTier {
            cfg,
            client,
            pool: Mutex::new(Vec::new()),
            down_until: Mutex::new(None),
        })
    }

    /// Whether the tier talks to a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.client, Client::Cluster(_))
    }

    fn rkey(&self, key: &ChunkKey) -> String {
        format!("{}{}", self.cfg.key_prefix, key.to_hex())
    }

    fn connect(&self) -> Result<Conn> {
        match &self.client {
            Client::Single(c) => {
                let con = c
                    .get_connection_with_timeout(self.cfg.connect_timeout)
                    .map_err(rerr("connect"))?;
                con.set_read_timeout(Some(self.cfg.io_timeout))
                    .map_err(rerr("connect"))?;
                con.set_write_timeout(Some(self.cfg.io_timeout))
                    .map_err(rerr("connect"))?;
                Ok(Conn::Single(con))
            }
            Client::Cluster(c) => {
                let con = c.get_connection().map_err(rerr("connect"))?;
                con.set_read_timeout(Some(self.cfg.io_timeout))
                    .map_err(rerr("connect"))?;
                con.set_write_timeout(Some(self.cfg.io_timeout))
                    .map_err(rerr("connect"))?;
                Ok(Conn::Cluster(Box::new(con)))
            }
        }
    }

    /// Runs `f` on a pooled connection; on failure the connection is dropped and the
    /// tier pauses for `retry_after`.
    fn with_conn<T>(&self, op: &'static str, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        if let Some(t) = *self.down_until.lock() {
            if Instant::now() < t {
                return Err(Error::Redis {
                    op,
                    reason: "skipped: the server failed moments ago".to_string(),
                });
            }
        }
        let pooled = self.pool.lock().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => match self.connect() {
                Ok(c) => c,
                Err(e) => {
                    *self.down_until.lock() = Some(Instant::now() + self.cfg.retry_after);
                    return Err(e);
                }
            },
        };
        match f(&mut conn) {
            Ok(v) => {
                self.pool.lock().push(conn);
                Ok(v)
            }
            Err(e) => {
                // Every pooled connection to a server that failed is suspect (a killed
                // server leaves them all broken): reconnect after the pause.
                self.pool.lock().clear();
                *self.down_until.lock() = Some(Instant::now() + self.cfg.retry_after);
                Err(e)
            }
        }
    }
}

impl Tier for RedisTier {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn contains(&self, keys: &[ChunkKey]) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let rkeys: Vec<String> = keys.iter().map(|k| self.rkey(k)).collect();
        self.with_conn("EXISTS", |c| {
            let r: Vec<bool> = match c {
                Conn::Single(c) => {
                    let mut p = redis::pipe();
                    for k in &rkeys {
                        p.cmd("EXISTS").arg(k);
                    }
                    p.query(c)
                }
                Conn::Cluster(c) => {
                    let mut p = redis::cluster::cluster_pipe();
                    for k in &rkeys {
                        p.cmd("EXISTS").arg(k);
                    }
                    p.query(c)
                }
            }
            .map_err(rerr("EXISTS"))?;
            if r.len() != keys.len() {
                return Err(Error::Redis {
                    op: "EXISTS",
                    reason: format!("{} replies for {} keys", r.len(), keys.len()),
                });
            }
            Ok(r)
        })
    }

    fn get(&self, keys: &[ChunkKey]) -> Result<Vec<Option<Blob>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let rkeys: Vec<String> = keys.iter().map(|k| self.rkey(k)).collect();
        self.with_conn("MGET", |c| {
            let r: Vec<Option<Vec<u8>>> = match c {
                Conn::Single(c) => redis::cmd("MGET").arg(&rkeys).query(c),
                Conn::Cluster(c) => {
                    let mut p = redis::cluster::cluster_pipe();
                    for k in &rkeys {
                        p.cmd("GET").arg(k);
                    }
                    p.query(c)
                }
            }
            .map_err(rerr("MGET"))?;
            if r.len() != keys.len() {
                return Err(Error::Redis {
                    op: "MGET",
                    reason: format!("{} replies for {} keys", r.len(), keys.len()),
                });
            }
            Ok(r.into_iter().map(|v| v.map(Blob::new)).collect())
        })
    }

    fn put(&self, items: &[(ChunkKey, Blob)]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let ttl = self.cfg.ttl.map(|t| t.as_secs().max(1));
        self.with_conn("SET", |c| {
            macro_rules! fill {
                ($p:expr) => {
                    for (k, v) in items {
                        let cmd = $p.cmd("SET").arg(self.rkey(k)).arg(v.as_slice());
                        if let Some(t) = ttl {
                            cmd.arg("EX").arg(t);
                        }
                        cmd.ignore();
                    }
                };
            }
            match c {
                Conn::Single(c) => {
                    let mut p = redis::pipe();
                    fill!(p);
                    p.query::<()>(c)
                }
                Conn::Cluster(c) => {
                    let mut p = redis::cluster::cluster_pipe();
                    fill!(p);
                    p.query::<()>(c)
                }
            }
            .map_err(rerr("SET"))
        })
    }

    fn remove(&self, key: &ChunkKey) -> Result<()> {
        let k = self.rkey(key);
        self.with_conn("DEL", |c| {
            match c {
                Conn::Single(c) => redis::cmd("DEL").arg(&k).query::<i64>(c),
                Conn::Cluster(c) => redis::cmd("DEL").arg(&k).query::<i64>(c.as_mut()),
            }
            .map(|_| ())
            .map_err(rerr("DEL"))
        })
    }
}
