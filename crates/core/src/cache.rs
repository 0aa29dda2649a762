//! The persistent, content-addressed disk cache: one per user, shared by
//! every mado process (CLI, mount daemon, restarts).
//!
//! - Location: `$MADO_CACHE_DIR`, else `$XDG_CACHE_HOME/mado`, else
//!   `~/.cache/mado`. Never per process or per run: a cache that is always
//!   cold is no cache (seed 001's lesson).
//! - Writes go to a temp file in the same folder and are renamed into
//!   place, with no fsync: a crash can leave a torn file, never a torn name.
//! - Every hit is verified (BLAKE3 of the value == key). A torn or rotten
//!   entry is deleted and reported as a miss, so the caller re-fetches a
//!   good copy (self-heal). This catches bit rot, which fsync never did.
//! - `MADO_DISK_CACHE_MAX_BYTES` caps the size: hits refresh an entry's
//!   mtime, and a write that takes the total over the cap evicts the least
//!   recently used entries. A single entry larger than the cap is kept.
//! - Layout (every path in the cache folder is built here):
//!   `objects/<2 hex>/<64 hex>` verified entries; `packs/index/<tree>`
//!   copies of pack indexes (the local pointer); `packs/locks/` one lock
//!   per pack being exploded; `workspaces/<key>/` a mounted workspace's
//!   state; `mounts/` control sockets and logs of running mounts.

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hash::Hash;

pub struct DiskCache {
    root: PathBuf,
    cap: Option<u64>,
    /// Bytes stored, tracked only when capped (seeded by a scan at open).
    size: AtomicU64,
    evict_lock: Mutex<()>,
    /// The "cache is full" warning was printed (once per process).
    full_warned: std::sync::atomic::AtomicBool,
    pub counters: CacheCounters,
}

#[derive(Default, Debug)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub healed: AtomicU64,
    pub writes: AtomicU64,
    pub evicted: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub healed: u64,
    pub writes: u64,
    pub evicted: u64,
}

/// The result of a full scan.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    pub path: String,
    pub entries: u64,
    pub bytes: u64,
    pub cap: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifyReport {
    pub checked: u64,
    pub bad: Vec<String>,
}

/// Parses `MADO_DISK_CACHE_MAX_BYTES`: 0, empty or unparseable means unbounded.
pub fn cap_from_env() -> Option<u64> {
    std::env::var("MADO_DISK_CACHE_MAX_BYTES").ok().and_then(|v| parse_cap(&v))
}

fn parse_cap(v: &str) -> Option<u64> {
    v.trim().parse::<u64>().ok().filter(|&n| n > 0)
}

/// Control sockets and logs of the running mounts.
pub fn mounts_dir() -> Result<PathBuf> {
    Ok(default_dir()?.join("mounts"))
}

/// The per-user cache directory.
pub fn default_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("MADO_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("mado"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("mado")),
        None => Err(Error::User("cannot place the disk cache: set HOME, XDG_CACHE_HOME or MADO_CACHE_DIR".into())),
    }
}

impl DiskCache {
    /// Opens the per-user cache with the cap from the environment.
    pub fn open_default() -> Result<DiskCache> {
        DiskCache::open(default_dir()?, cap_from_env())
    }

    pub fn open(root: PathBuf, cap: Option<u64>) -> Result<DiskCache> {
        crate::fsutil::create_private_dir(&root)?;
        fs::create_dir_all(root.join("objects")).map_err(Error::io(format!("creating cache {}", root.display())))?;
        let c = DiskCache {
            root,
            cap,
            size: AtomicU64::new(0),
            evict_lock: Mutex::new(()),
            full_warned: Default::default(),
            counters: Default::default(),
        };
        if cap.is_some() {
            c.size.store(c.usage().bytes, Relaxed);
        }
        Ok(c)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a copy of `tree`'s pack index is kept (the local pointer).
    pub fn index_path(&self, tree: &Hash) -> PathBuf {
        self.root.join("packs").join("index").join(tree.to_hex())
    }

    /// The lock one process holds while it explodes pack `id`.
    pub fn pack_lock_path(&self, id: &Hash) -> PathBuf {
        self.root.join("packs").join("locks").join(format!("{}.lock", id.to_hex()))
    }

    /// The folder holding the state of workspace `name` of remote `remote`
    /// while it is mounted (overlay state and upper layer).
    pub fn workspace_dir(&self, remote: &str, name: &str) -> PathBuf {
        let key = blake3::hash(format!("{remote}\n{name}").as_bytes()).to_hex();
        self.root.join("workspaces").join(&key[..24])
    }

    /// Where the entry for `id` lives (it may be absent).
    pub fn entry_path(&self, id: &Hash) -> PathBuf {
        self.path(id)
    }

    fn path(&self, id: &Hash) -> PathBuf {
        let hex = id.to_hex();
        self.root.join("objects").join(&hex[..2]).join(hex)
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            healed: c.healed.load(Relaxed),
            writes: c.writes.load(Relaxed),
            evicted: c.evicted.load(Relaxed),
        }
    }

    /// A verified hit, or `None`. A bad entry is removed (and counted).
    pub fn get(&self, id: &Hash) -> Option<Vec<u8>> {
        let p = self.path(id);
        match crate::fsutil::read_regular(&p) {
            Ok(bytes) if id.verifies(&bytes) => {
                self.counters.hits.fetch_add(1, Relaxed);
                if self.cap.is_some() {
                    touch(&p);
                }
                Some(bytes)
            }
            Ok(bytes) => {
                self.counters.healed.fetch_add(1, Relaxed);
                self.counters.misses.fetch_add(1, Relaxed);
                if fs::remove_file(&p).is_ok() && self.cap.is_some() {
                    self.size.fetch_sub(bytes.len() as u64, Relaxed);
                }
                None
            }
            Err(e) => {
                if e.kind() == ErrorKind::InvalidData {
                    // Not a regular file (a FIFO, a device): rotten, healed.
                    self.counters.healed.fetch_add(1, Relaxed);
                    let _ = fs::remove_file(&p);
                }
                self.counters.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Presence without reading (for skipping writes of known content).
    pub fn contains(&self, id: &Hash) -> bool {
        self.path(id).exists()
    }

    /// Stores `bytes` under `id` (the caller has verified the hash).
    pub fn put(&self, id: &Hash, bytes: &[u8]) -> Result<()> {
        let p = self.path(id);
        if p.exists() {
            return Ok(());
        }
        let dir = p.parent().expect("cache paths have a parent");
        let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), rand::random::<u64>()));
        let write = |tmp: &Path| -> std::io::Result<()> {
            let mut f = match fs::File::create(tmp) {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    fs::create_dir_all(dir)?;
                    fs::File::create(tmp)?
                }
                r => r?,
            };
            f.write_all(bytes)?;
            fs::rename(tmp, &p)
        };
        if let Err(e) = write(&tmp) {
            let _ = fs::remove_file(&tmp);
            if matches!(e.raw_os_error(), Some(n) if n == rustix::io::Errno::NOSPC.raw_os_error() || n == rustix::io::Errno::DQUOT.raw_os_error())
                && !self.full_warned.swap(true, Relaxed)
            {
                // Callers go on without the cache (a read still returns its
                // bytes): say so once, not once per object.
                eprintln!(
                    "warning: the disk cache at {} is full ({e}); reads go on, but nothing more is cached \
                     until space is freed (or set MADO_DISK_CACHE_MAX_BYTES to cap it)",
                    self.root.display()
                );
            }
            return Err(Error::Io { context: format!("writing cache entry {}", p.display()), source: e });
        }
        self.counters.writes.fetch_add(1, Relaxed);
        if let Some(cap) = self.cap {
            let total = self.size.fetch_add(bytes.len() as u64, Relaxed) + bytes.len() as u64;
            if total > cap {
                self.evict(cap, id);
            }
        }
        Ok(())
    }

    /// Evicts least-recently-used entries until the cache fits `cap`,
    /// never the entry just written.
    fn evict(&self, cap: u64, keep: &Hash) {
        let Ok(_g) = self.evict_lock.lock() else {
            return;
        };
        let mut entries = self.scan();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort_by_key(|e| e.2);
        let keep = self.path(keep);
        for (p, len, _) in entries {
            if total <= cap {
                break;
            }
            if p == keep {
                continue;
            }
            if fs::remove_file(&p).is_ok() {
                total -= len;
                self.counters.evicted.fetch_add(1, Relaxed);
            }
        }
        self.size.store(total, Relaxed);
    }

    fn scan(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let mut out = Vec::new();
        let Ok(dirs) = fs::read_dir(self.root.join("objects")) else {
            return out;
        };
        for d in dirs.flatten() {
            let Ok(files) = fs::read_dir(d.path()) else {
                continue;
            };
            for f in files.flatten() {
                if f.file_name().to_string_lossy().starts_with('.') {
                    continue;
                }
                if let Ok(m) = f.metadata() {
                    out.push((f.path(), m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
                }
            }
        }
        out
    }

    pub fn usage(&self) -> Usage {
        let entries = self.scan();
        Usage {
            path: self.root.display().to_string(),
            entries: entries.len() as u64,
            bytes: entries.iter().map(|e| e.1).sum(),
            cap: self.cap,
        }
    }

    /// Re-hashes every entry; removes and lists the bad ones.
    pub fn verify(&self, mut progress: impl FnMut(u64, u64)) -> VerifyReport {
        let entries = self.scan();
        let mut report = VerifyReport::default();
        let total = entries.len() as u64;
        for (p, _, _) in entries {
            report.checked += 1;
            progress(report.checked, total);
            let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            let ok = match (name.parse::<Hash>(), crate::fsutil::read_regular(&p)) {
                (Ok(id), Ok(bytes)) => id.verifies(&bytes),
                _ => false,
            };
            if !ok {
                let _ = fs::remove_file(&p);
                report.bad.push(name);
            }
        }
        report
    }
}

fn touch(p: &Path) {
    if let Ok(f) = fs::File::options().write(true).open(p) {
        let _ = f.set_modified(SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_and_self_heal() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), None).unwrap();
        let data = b"hello cache".to_vec();
        let id = Hash::of(&data);
        assert_eq!(c.get(&id), None);
        c.put(&id, &data).unwrap();
        assert_eq!(c.get(&id).as_deref(), Some(&data[..]));
        // Rot the entry: the next read deletes it and misses.
        fs::write(c.path(&id), b"hello cachE").unwrap();
        assert_eq!(c.get(&id), None);
        assert!(!c.contains(&id));
        assert_eq!(c.stats().healed, 1);
        // Torn (truncated) entry likewise.
        c.put(&id, &data).unwrap();
        fs::write(c.path(&id), &data[..3]).unwrap();
        assert_eq!(c.get(&id), None);
        assert_eq!(c.stats().healed, 2);
        let r = c.verify(|_, _| {});
        assert!(r.bad.is_empty());
    }

    #[test]
    fn verify_reports_and_removes_bad_entries() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), None).unwrap();
        let (a, b) = (b"aaa".to_vec(), b"bbb".to_vec());
        c.put(&Hash::of(&a), &a).unwrap();
        c.put(&Hash::of(&b), &b).unwrap();
        fs::write(c.path(&Hash::of(&b)), b"xxx").unwrap();
        let r = c.verify(|_, _| {});
        assert_eq!(r.checked, 2);
        assert_eq!(r.bad, vec![Hash::of(&b).to_hex()]);
        assert_eq!(c.usage().entries, 1);
    }

    #[test]
    fn cap_evicts_least_recently_used_but_keeps_oversized() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), Some(250)).unwrap();
        let blobs: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 100]).collect();
        let ids: Vec<Hash> = blobs.iter().map(|b| Hash::of(b)).collect();
        c.put(&ids[0], &blobs[0]).unwrap();
        c.put(&ids[1], &blobs[1]).unwrap();
        // Make entry 0 older than entry 1, then use entry 0 (refreshes it).
        let old = SystemTime::now() - std::time::Duration::from_secs(100);
        for id in &ids[..2] {
            fs::File::options().write(true).open(c.path(id)).unwrap().set_modified(old).unwrap();
        }
        fs::File::options()
            .write(true)
            .open(c.path(&ids[1]))
            .unwrap()
            .set_modified(old - std::time::Duration::from_secs(50))
            .unwrap();
        assert!(c.get(&ids[0]).is_some());
        c.put(&ids[2], &blobs[2]).unwrap();
        assert!(c.contains(&ids[0]) && c.contains(&ids[2]));
        assert!(!c.contains(&ids[1]), "the least recently used entry goes");
        assert!(c.usage().bytes <= 250);
        // A single blob over the cap is still stored.
        let big = vec![9u8; 1000];
        c.put(&Hash::of(&big), &big).unwrap();
        assert!(c.get(&Hash::of(&big)).is_some());
    }

    #[test]
    fn cap_env_parsing() {
        for (v, want) in [("", None), ("0", None), ("abc", None), ("-5", None), (" 1024 ", Some(1024))] {
            assert_eq!(parse_cap(v), want, "{v:?}");
        }
    }
}
