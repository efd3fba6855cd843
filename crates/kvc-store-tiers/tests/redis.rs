//! The Redis tier against real redis-server processes on 127.0.0.1 (free ports, torn down
//! by drop guards): a standalone server and a 3-node cluster made with
//! `redis-cli --cluster create`, with faults: kill -9 mid-run, corrupted values, a cluster
//! node down. Every fault must be a counted fallback and never a wrong restore.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvc_store_tiers::{ChunkCodec, MemoryTier, RedisConfig, RedisTier, Tier, Tiers, TiersConfig};

fn redis(url: &str) -> RedisTier {
    let mut cfg = RedisConfig::new(url);
    cfg.connect_timeout = Duration::from_millis(300);
    cfg.io_timeout = Duration::from_millis(500);
    cfg.retry_after = Duration::from_millis(200);
    RedisTier::new(cfg).unwrap()
}

#[test]
fn standalone_shares_chunks_between_instances() {
    if !have_redis() {
        return;
    }
    let server = RedisServer::start(false);
    // tc needs a calibration (Tiers::with_transform).
    for (n, codec) in ChunkCodec::ALL
        .into_iter()
        .filter(|&c| c != ChunkCodec::Transform)
        .enumerate()
    {
        let seed = 100 + n as u32;
        // Instance 1 stores through memory and Redis.
        let a = Tiers::new(
            config(codec),
            vec![
                Box::new(MemoryTier::new(64 << 20)),
                Box::new(redis(&server.url())),
            ],
        )
        .unwrap();
        let r = a
            .store(&tokens(seed), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
            .unwrap();
        assert_eq!((r.chunks_encoded, r.failures), (8, 0));
        // Instance 2: a fresh memory tier; finds everything in Redis and promotes it.
        let mem = Arc::new(MemoryTier::new(64 << 20));
        let b = Tiers::new(
            config(codec),
            vec![Box::new(mem.clone()), Box::new(redis(&server.url()))],
        )
        .unwrap();
        assert_eq!(b.lookup(&tokens(seed)), 512);
        let got = b.restore(&tokens(seed));
        assert_eq!(got.tokens, 512);
        assert_restored(&got, codec);
        let m = b.metrics();
        assert_eq!((m.tiers[1].hits, m.promotions, m.fallbacks), (8, 8, 0));
        assert_eq!(mem.stats().entries, 8);
    }
    // A TTL is set when configured.
    let mut cfg = RedisConfig::new(server.url());
    cfg.ttl = Some(Duration::from_secs(300));
    let t = Tiers::new(
        config(ChunkCodec::Raw),
        vec![Box::new(RedisTier::new(cfg).unwrap())],
    )
    .unwrap();
    t.store(&tokens(150), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let key = format!("kvc:{}", t.keys(&tokens(150))[0].to_hex());
    let ttl: i64 = cli(server.port, &["TTL", &key]).trim().parse().unwrap();
    assert!((1..=300).contains(&ttl), "ttl {ttl}");
}

#[test]
fn concurrent_writers_of_one_chunk_both_leave_a_valid_value() {
    if !have_redis() {
        return;
    }
    let server = RedisServer::start(false);
    let url = server.url();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                // Each thread is an instance that encodes the chunks itself and SETs every
                // one of them, several times, while the others do the same and read.
                let mem = Arc::new(MemoryTier::new(64 << 20));
                let local =
                    Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(mem.clone())]).unwrap();
                local
                    .store(&tokens(200), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
                    .unwrap();
                let keys = local.keys(&tokens(200));
                let items: Vec<_> = keys
                    .iter()
                    .zip(mem.get(&keys).unwrap())
                    .map(|(k, b)| (*k, b.unwrap()))
                    .collect();
                let tier = Arc::new(redis(&url));
                let t =
                    Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(tier.clone())]).unwrap();
                for _ in 0..5 {
                    tier.put(&items).unwrap();
                    assert_exact(&t.restore(&tokens(200)));
                }
                assert_eq!(t.metrics().fallbacks, 0);
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(redis(&url))]).unwrap();
    let r = t.restore(&tokens(200));
    assert_eq!(r.tokens, 512);
    assert_exact(&r);
    assert_eq!(t.metrics().fallbacks, 0);
}

#[test]
fn kill_9_mid_run_is_counted_fallbacks_and_no_wrong_restore() {
    if !have_redis() {
        return;
    }
    let mut server = RedisServer::start(false);
    let t = Tiers::new(
        config(ChunkCodec::GearV1),
        vec![Box::new(redis(&server.url()))],
    )
    .unwrap();
    t.store(&tokens(300), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let mut full = 0;
    let mut empty = 0;
    for i in 0..20 {
        if i == 5 {
            server.kill();
        }
        let r = t.restore(&tokens(300));
        assert_exact(&r);
        if r.tokens == 512 {
            full += 1;
        } else {
            assert_eq!(r.tokens, 0);
            empty += 1;
        }
        assert_eq!(t.lookup(&tokens(300)) == 512, i < 5);
        // Stores with the server down are counted failures, not errors.
        if i >= 5 {
            let s = t
                .store(&tokens(301), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
                .unwrap();
            assert_eq!(s.failures, 1);
        }
    }
    assert_eq!((full, empty), (5, 15));
    let m = t.metrics();
    assert!(m.tiers[0].errors >= 15, "{m:?}");
    assert_eq!(m.fallbacks, m.tiers[0].errors);
    // Redis comes back (empty: it kept nothing): after the retry pause the tier is used
    // again, a store writes everything and restores are complete.
    let port = server.port;
    drop(server);
    let _back = RedisServer::restart_on(port);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(t.restore(&tokens(300)).tokens, 0);
    let s = t
        .store(&tokens(300), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    assert_eq!((s.chunks_encoded, s.failures), (8, 0));
    let r = t.restore(&tokens(300));
    assert_eq!(r.tokens, 512);
    assert_exact(&r);
}

#[test]
fn corrupted_and_foreign_values_are_checksum_failures() {
    if !have_redis() {
        return;
    }
    let server = RedisServer::start(false);
    let tier = Arc::new(redis(&server.url()));
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(tier.clone())]).unwrap();
    t.store(&tokens(400), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let keys = t.keys(&tokens(400));
    // SET garbage under chunk 4, flip one byte of chunk 6's value with SETRANGE.
    let k4 = format!("kvc:{}", keys[4].to_hex());
    assert_eq!(cli(server.port, &["SET", &k4, "garbage"]).trim(), "OK");
    let k6 = format!("kvc:{}", keys[6].to_hex());
    cli(server.port, &["SETRANGE", &k6, "5000", "\u{1}"]);
    // Chunk 2: another model's blob for the same tokens.
    let other_cfg = TiersConfig {
        model_hash: [9; 32],
        ..config(ChunkCodec::GearV2)
    };
    let other_mem = Arc::new(MemoryTier::new(64 << 20));
    let other = Tiers::new(other_cfg, vec![Box::new(other_mem.clone())]).unwrap();
    other
        .store(&tokens(400), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    let foreign = other_mem.get(&other.keys(&tokens(400))[2..3]).unwrap()[0]
        .clone()
        .unwrap();
    tier.put(&[(keys[2], foreign)]).unwrap();
    let r = t.restore(&tokens(400));
    assert_eq!(r.tokens, 128);
    assert_exact(&r);
    let m = t.metrics();
    assert_eq!(
        (m.tiers[0].corrupt, m.tiers[0].foreign, m.fallbacks),
        (2, 1, 3)
    );
    // The bad values were deleted from Redis.
    assert_eq!(
        tier.contains(&keys)
            .unwrap()
            .iter()
            .filter(|&&x| !x)
            .count(),
        3
    );
}

#[test]
fn cluster_spreads_chunks_and_survives_a_node_down() {
    if !have_redis() {
        return;
    }
    let mut cluster = RedisCluster::start();
    let url = cluster.url();
    let t = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(redis(&url))]).unwrap();
    let mut stored = 0;
    for seed in 500..504 {
        let s = t
            .store(&tokens(seed), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
            .unwrap();
        assert_eq!(s.failures, 0);
        stored += s.chunks_encoded;
    }
    assert_eq!(stored, 32);
    let per_node: Vec<usize> = cluster
        .nodes
        .iter()
        .map(|n| cli(n.port, &["DBSIZE"]).trim().parse().unwrap())
        .collect();
    assert_eq!(per_node.iter().sum::<usize>(), 32);
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
    // A second instance restores through the cluster.
    let t2 = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(redis(&url))]).unwrap();
    for seed in 500..504 {
        let r = t2.restore(&tokens(seed));
        assert_eq!(r.tokens, 512);
        assert_exact(&r);
    }
    // One node down: restores stay correct (shorter or empty), failures are counted.
    cluster.nodes[1].kill();
    let t3 = Tiers::new(config(ChunkCodec::GearV2), vec![Box::new(redis(&url))]).unwrap();
    let mut shorter = 0;
    for seed in 500..504 {
        let r = t3.restore(&tokens(seed));
        assert_exact(&r);
        shorter += usize::from(r.tokens < 512);
    }
    // 32 chunks over three nodes: some prompts lose chunks (which ones depends on slots).
    assert!(shorter >= 1);
    let m = t3.metrics();
    assert!(m.fallbacks >= 1, "{m:?}");
    // Stores with a node down are counted failures, not errors.
    let s = t3
        .store(&tokens(510), SAMPLE_K, SAMPLE_V, SAMPLE_TOKENS)
        .unwrap();
    assert_eq!(s.chunks, 8);
}
