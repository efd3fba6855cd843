//! The disk tier: one file per chunk under a directory, `<key hex>.kvc`.
//!
//! A value is written to a temporary name (`.tmp-<key>-<pid>-<n>`), fsynced, then renamed
//! over its final name and the directory fsynced: a reader, in this process or another,
//! sees either no file or a complete one, and two writers of the same chunk both end with
//! a valid file (the last rename wins; both wrote the same content). A byte budget is kept
//! with LRU eviction. After a restart the index is rebuilt from the files (LRU order from
//! their modification times, which reads refresh); files whose header or length is wrong
//! are counted and removed, and leftover temporary files older than ten minutes too.
//! Files another process added are found on a lookup miss of the index.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use crate::blob::{BlobHeader, HEADER_LEN};
use crate::error::{Error, Result};
use crate::key::ChunkKey;
use crate::tier::{Blob, LruIndex, Tier, TierStats};

const SUFFIX: &str = ".kvc";
const TMP_PREFIX: &str = ".tmp-";
const STALE_TMP: Duration = Duration::from_secs(600);

/// The disk tier.
pub struct DiskTier {
    dir: PathBuf,
    budget: u64,
    index: Mutex<LruIndex>,
    seq: AtomicU64,
    evictions: AtomicU64,
    over_budget: AtomicU64,
    corrupt_removed: AtomicU64,
}

fn file_key(name: &str) -> Option<ChunkKey> {
    ChunkKey::from_hex(name.strip_suffix(SUFFIX)?)
}

/// Whether the file's header is a blob stored under `key` and its size is the one the
/// header declares (the checksum is checked when the file is read).
fn plausible(path: &Path, key: &ChunkKey, size: u64) -> bool {
    let mut head = [0u8; HEADER_LEN];
    let ok = fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
    match (ok, BlobHeader::parse(&head)) {
        (Ok(()), Ok(h)) => h.key == *key && h.total_len() == size,
        _ => false,
    }
}

impl DiskTier {
    /// Opens (creating it if needed) a disk tier in `dir` holding at most `budget_bytes`,
    /// and rebuilds its index from the files there.
    pub fn open(dir: impl Into<PathBuf>, budget_bytes: u64) -> Result<DiskTier> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let tier = DiskTier {
            dir,
            budget: budget_bytes,
            index: Mutex::new(LruIndex::default()),
            seq: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            over_budget: AtomicU64::new(0),
            corrupt_removed: AtomicU64::new(0),
        };
        tier.rebuild()?;
        Ok(tier)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &ChunkKey) -> PathBuf {
        self.dir.join(format!("{}{SUFFIX}", key.to_hex()))
    }

    fn rebuild(&self) -> Result<()> {
        let rd = fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("list {}", self.dir.display()), e))?;
        let mut found = Vec::new();
        let now = SystemTime::now();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(format!("list {}", self.dir.display()), e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.starts_with(TMP_PREFIX) {
                if now.duration_since(mtime).unwrap_or_default() > STALE_TMP {
                    let _ = fs::remove_file(&path);
                }
                continue;
            }
            let Some(key) = file_key(name) else { continue };
            if plausible(&path, &key, meta.len()) {
                found.push((mtime, key, meta.len()));
            } else {
                let _ = fs::remove_file(&path);
                self.corrupt_removed.fetch_add(1, Ordering::Relaxed);
            }
        }
        found.sort();
        let mut idx = self.index.lock();
        for (_, key, size) in found {
            idx.insert(key, size);
        }
        while idx.bytes > self.budget {
            let Some(old) = idx.oldest() else { break };
            idx.remove(&old);
            let _ = fs::remove_file(self.path(&old));
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn write_one(&self, key: &ChunkKey, blob: &[u8]) -> Result<()> {
        let tmp = self.dir.join(format!(
            "{TMP_PREFIX}{}-{}-{}",
            key.to_hex(),
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(blob)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, self.path(key))
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(format!("write {}", self.path(key).display()), e)
        })
    }

    fn sync_dir(&self) -> Result<()> {
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("fsync {}", self.dir.display()), e))
    }
}

impl Tier for DiskTier {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn contains(&self, keys: &[ChunkKey]) -> Result<Vec<bool>> {
        let idx = self.index.lock();
        Ok(keys
            .iter()
            .map(|k| idx.contains(k) || self.path(k).is_file())
            .collect())
    }

    fn get(&self, keys: &[ChunkKey]) -> Result<Vec<Option<Blob>>> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let path = self.path(key);
            match fs::read(&path) {
                Ok(b) => {
                    let mut idx = self.index.lock();
                    if !idx.touch(key) {
                        // Written by another process: adopt it.
                        idx.insert(*key, b.len() as u64);
                    }
                    drop(idx);
                    if let Ok(f) = fs::File::options().write(true).open(&path) {
                        let _ = f.set_modified(SystemTime::now());
                    }
                    out.push(Some(Arc::new(b)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.index.lock().remove(key);
                    out.push(None);
                }
                Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
            }
        }
        Ok(out)
    }

    fn put(&self, items: &[(ChunkKey, Blob)]) -> Result<()> {
        let mut wrote = false;
        let mut result = Ok(());
        for (key, blob) in items {
            let size = blob.len() as u64;
            if size > self.budget {
                self.over_budget.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            {
                let mut idx = self.index.lock();
                idx.remove(key);
                while idx.bytes + size > self.budget {
                    let Some(old) = idx.oldest() else { break };
                    idx.remove(&old);
                    let _ = fs::remove_file(self.path(&old));
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                }
                // Reserve the space before writing so that concurrent puts keep the budget.
                idx.insert(*key, size);
            }
            if let Err(e) = self.write_one(key, blob) {
                self.index.lock().remove(key);
                result = Err(e);
                break;
            }
            wrote = true;
        }
        if wrote {
            self.sync_dir()?;
        }
        result
    }

    fn remove(&self, key: &ChunkKey) -> Result<()> {
        self.index.lock().remove(key);
        match fs::remove_file(self.path(key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("remove {}", self.path(key).display()), e)),
        }
    }

    fn stats(&self) -> TierStats {
        let idx = self.index.lock();
        TierStats {
            entries: idx.len() as u64,
            bytes: idx.bytes,
            evictions: self.evictions.load(Ordering::Relaxed),
            over_budget: self.over_budget.load(Ordering::Relaxed),
            corrupt_removed: self.corrupt_removed.load(Ordering::Relaxed),
        }
    }
}
