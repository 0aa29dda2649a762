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
//! - Two kinds of entry: a loose object is one file; a pack fetched
//!   through its index is one file for the whole pack, with a record of
//!   the members it holds (`packfile`). Both are verified on every hit.
//! - A cap (the CLI's `cache.max_size` or `MADO_DISK_CACHE_MAX_BYTES`) bounds the size, with an eviction that
//!   resists scans (see [`DiskCache::evict`]): sizes are tracked as entries
//!   are written, and a write that takes the total over the cap evicts
//!   whole entries down to 90 % of it, so the scan that finds victims runs
//!   once per tenth of the cap written, not once per write. A single
//!   entry larger than the cap is kept.
//! - Layout (every path in the cache folder is built here):
//!   `objects/<2 hex>/<64 hex>` loose entries; `packs/data/<pack>.pack` and
//!   `.have` cached packs; `packs/index/<tree>` copies of pack indexes (the
//!   local pointer); `packs/locks/` one lock per pack being fetched;
//!   `workspaces/<key>/` a mounted workspace's state; `mounts/` control
//!   sockets and logs of running mounts.

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hash::Hash;

mod locks;
mod packfile;
mod slots;

pub use locks::PackLock;
pub use packfile::PackWriter;
pub use slots::Slot;

/// One write in this many enters the cache as recently used; the others
/// enter on probation (see [`DiskCache::evict`]).
const ADMIT_EVERY: u64 = 32;
/// Probation times count backwards from here (2020-01-01), so every
/// probation time is older than every use, and a newer insert is older
/// than an earlier one.
const PROBATION_BASE: u64 = 1_577_836_800;
/// Own probation writes kept in memory as the first eviction victims.
const RECENT_MAX: usize = 1 << 16;
/// A cached pack's file is marked used at most this often per process.
const PACK_TOUCH_EVERY: Duration = Duration::from_secs(30);

pub struct DiskCache {
    root: PathBuf,
    cap: Option<u64>,
    /// Bytes stored, tracked only when capped (seeded by a scan at open).
    size: AtomicU64,
    evict_state: Mutex<EvictState>,
    /// The "cache is full" warning was printed (once per process).
    full_warned: std::sync::atomic::AtomicBool,
    pub counters: CacheCounters,
    /// Cached packs this process has open (see `packfile`).
    open_packs: Mutex<packfile::OpenPacks>,
    /// Entries written by this process (for [`ADMIT_EVERY`]).
    inserts: AtomicU64,
    /// Full scans of the cache made (eviction, usage, verify).
    scans: AtomicU64,
    /// When this process last marked each cached pack used.
    pack_touched: Mutex<HashMap<Hash, Instant>>,
    /// The packs' locks (see `locks`).
    pack_locks: locks::PackLocks,
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
    /// Loose objects.
    pub entries: u64,
    /// Cached packs (each one file, whatever its member count).
    pub packs: u64,
    /// Bytes held on disk by both kinds.
    pub bytes: u64,
    pub cap: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifyReport {
    pub checked: u64,
    pub bad: Vec<String>,
    /// Packs another process was writing (downloading) at the time: not
    /// checked, left as they are.
    pub busy: Vec<String>,
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
    /// The per-user cache at its stable path, capped at `cap` bytes.
    pub fn open_default(cap: Option<u64>) -> Result<DiskCache> {
        DiskCache::open(default_dir()?, cap)
    }

    pub fn open(root: PathBuf, cap: Option<u64>) -> Result<DiskCache> {
        crate::fsutil::create_private_dir(&root)?;
        fs::create_dir_all(root.join("objects")).map_err(Error::io(format!("creating cache {}", root.display())))?;
        let pack_locks = locks::PackLocks::open(&root);
        let c = DiskCache {
            root,
            cap,
            size: AtomicU64::new(0),
            evict_state: Mutex::new(EvictState::default()),
            full_warned: Default::default(),
            counters: Default::default(),
            open_packs: Mutex::default(),
            inserts: AtomicU64::new(0),
            scans: AtomicU64::new(0),
            pack_touched: Mutex::new(HashMap::new()),
            pack_locks,
        };
        // A large file's whole copy left by a killed mount daemon.
        remove_dead_builds(&c.root.join("tmp"));
        if cap.is_some() {
            c.size.store(c.usage().bytes, Relaxed);
        }
        Ok(c)
    }

    /// A work slot (`slots`): waits while as many memory-heavy jobs as
    /// the machine has cores hold one, in this process or another using
    /// this cache. `None` when the cache cannot hold the slot files.
    pub async fn slot(&self) -> Option<Slot> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || slots::take(&root, slots::slots())).await.ok().flatten()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the snapshot this machine last read ref `name` of the store at
    /// `store` (its URL) as is noted: `refs-seen/<16 hex>/NAME`, the hex
    /// from the URL's hash (one cache serves every store), `/` in the name
    /// as `%2F`. What an error can name when the store cannot be reached.
    fn seen_ref_path(&self, store: &str, name: &str) -> PathBuf {
        let key = &Hash::of(store.as_bytes()).to_hex()[..16];
        self.root.join("refs-seen").join(key).join(name.replace('%', "%25").replace('/', "%2F"))
    }

    /// Notes that ref `name` of `store` was read (or moved) as `snapshot`
    /// (written only when it changed; a failure only loses the note).
    pub fn note_ref(&self, store: &str, name: &str, snapshot: &Hash) {
        let p = self.seen_ref_path(store, name);
        let line = format!("{}\n", snapshot.to_hex());
        if crate::fsutil::read_regular(&p).ok().as_deref() != Some(line.as_bytes()) {
            crate::fsutil::save_cache_file(&p, line.as_bytes());
        }
    }

    /// The snapshot ref `name` of `store` was last read as on this
    /// machine, and when it was first read so (the note's mtime).
    pub fn seen_ref(&self, store: &str, name: &str) -> Option<(Hash, std::time::SystemTime)> {
        let p = self.seen_ref_path(store, name);
        let b = crate::fsutil::read_regular(&p).ok()?;
        let id = std::str::from_utf8(&b).ok()?.trim().parse().ok()?;
        Some((id, std::fs::metadata(&p).ok()?.modified().ok()?))
    }

    /// Where a copy of `tree`'s pack index is kept (the local pointer).
    pub fn index_path(&self, tree: &Hash) -> PathBuf {
        self.root.join("packs").join("index").join(tree.to_hex())
    }

    /// Where the mtimes of stat object `stat`, whole, are kept flat
    /// (mapped by every workspace mount of a snapshot with that object).
    pub fn flat_times_path(&self, stat: &Hash) -> PathBuf {
        self.root.join("stat").join("flat").join(stat.to_hex())
    }

    /// Where the flat form of that index layer is kept (read in place).
    pub fn flat_index_path(&self, tree: &Hash) -> PathBuf {
        self.root.join("packs").join("flat").join(tree.to_hex())
    }

    /// The lock one process holds while it fetches pack `id` into the
    /// cache (or writes one it built), waited for off the async workers.
    pub async fn lock_pack(&self, id: &Hash) -> Result<PackLock> {
        if let Some(l) = self.pack_locks.try_lock(id)? {
            return Ok(l);
        }
        let (path, id) = (self.pack_locks.path().to_path_buf(), *id);
        tokio::task::spawn_blocking(move || locks::wait_for(&path, &id))
            .await
            .map_err(|e| Error::Io { context: "pack lock task".into(), source: std::io::Error::other(e) })?
    }

    /// [`DiskCache::lock_pack`], blocking the thread while another holds it.
    pub fn lock_pack_blocking(&self, id: &Hash) -> Result<PackLock> {
        self.pack_locks.lock_blocking(id)
    }

    /// Where an older mado kept the state of workspace `name` of remote
    /// `remote` while mounted (inside the cache, which a user may wipe; it
    /// now lives in the data directory: `workspace::mounted`).
    pub fn legacy_workspace_dir(&self, remote: &str, name: &str) -> PathBuf {
        self.root.join("workspaces").join(Self::workspace_key(remote, name))
    }

    /// The folder name of workspace `name` of remote `remote`'s mount state.
    pub fn workspace_key(remote: &str, name: &str) -> String {
        blake3::hash(format!("{remote}\n{name}").as_bytes()).to_hex()[..24].to_string()
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
                self.used(&p, None);
                Some(bytes)
            }
            Ok(bytes) => {
                self.heal_loose(&p, bytes.len() as u64);
                self.counters.misses.fetch_add(1, Relaxed);
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

    /// Copies loose entry `id` (its bytes are its content) into `to` at
    /// `at`, in the kernel where it can, if the entry is there and holds
    /// `len` bytes. Not verified: the caller checks what it builds.
    pub fn copy_loose(&self, id: &Hash, len: u64, to: &fs::File, at: u64) -> bool {
        let Ok(f) = crate::fsutil::open_regular(&self.path(id)) else { return false };
        f.metadata().is_ok_and(|m| m.len() == len) && crate::fsutil::copy_range(&f, 0, to, at, len).is_ok()
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
            let f = match fs::File::create(tmp) {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    fs::create_dir_all(dir)?;
                    fs::File::create(tmp)?
                }
                r => r?,
            };
            // A sparse file's blocks of zeros take no disk here either.
            crate::fsutil::write_sparse(&f, bytes, 0)?;
            fs::rename(tmp, &p)
        };
        if let Err(e) = write(&tmp) {
            let _ = fs::remove_file(&tmp);
            self.warn_if_full(&e);
            return Err(Error::Io { context: format!("writing cache entry {}", p.display()), source: e });
        }
        self.counters.writes.fetch_add(1, Relaxed);
        self.set_probation(&p, None);
        self.grew(bytes.len() as u64, &p);
        Ok(())
    }

    /// The cache's limit in bytes, if it has one.
    pub fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// A folder for files being built into entries (a large file being
    /// reassembled), on the cache's own filesystem so that
    /// [`DiskCache::adopt`] is a rename. Files of processes that are gone
    /// (killed mid-build) are removed here.
    pub fn build_dir(&self) -> Result<PathBuf> {
        let dir = self.root.join("tmp");
        fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        remove_dead_builds(&dir);
        Ok(dir)
    }

    /// Makes the file `built` (written and verified by the caller, in
    /// [`DiskCache::build_dir`]) the entry for `id`: one rename, counted
    /// and evictable like any entry.
    pub fn adopt(&self, id: &Hash, built: &Path) -> Result<()> {
        let p = self.path(id);
        let len = fs::symlink_metadata(built).map_err(Error::io(format!("reading {}", built.display())))?.len();
        let dir = p.parent().expect("cache paths have a parent");
        fs::create_dir_all(dir).and_then(|_| fs::rename(built, &p)).map_err(Error::io(format!(
            "moving {} to {}",
            built.display(),
            p.display()
        )))?;
        self.counters.writes.fetch_add(1, Relaxed);
        self.set_probation(&p, None);
        self.grew(len, &p);
        Ok(())
    }

    /// Marks the entry for `id` used now (for an entry read without
    /// [`DiskCache::get`], such as a file passed through to the kernel).
    pub fn touch(&self, id: &Hash) {
        self.used(&self.path(id), None);
    }

    /// Where the record of the last check of entry `id` as a whole copy
    /// (see [`DiskCache::whole_trusted`]) is kept: beside it, a dot file
    /// that scans, eviction and `cache verify` pass over.
    fn whole_record(&self, id: &Hash) -> PathBuf {
        let hex = id.to_hex();
        self.root.join("objects").join(&hex[..2]).join(format!(".whole-{hex}"))
    }

    /// Records that `file`, opened from entry `id`, was hashed and holds
    /// `id`'s content, as it is now: its inode, size, modification and
    /// change times, and this boot. Best effort (without a record, the
    /// next open hashes the file again).
    pub fn trust_whole(&self, id: &Hash, file: &fs::File) {
        let Ok(m) = file.metadata() else { return };
        crate::fsutil::save_cache_file(&self.whole_record(id), whole_identity(&m).as_bytes());
    }

    /// Whether `file` (opened from entry `id`) is as it was when it was
    /// last hashed and found to hold `id`'s content, so that it may be
    /// handed to the kernel to read without a check of each read (FUSE
    /// passthrough). Any write to it since changes its modification time,
    /// and any change of that its change time, which no process can set;
    /// a record of an earlier boot is not trusted (a crash may have lost
    /// bytes the record was made for). Marks the entry used, and records
    /// the times that marking gives it.
    pub fn whole_trusted(&self, id: &Hash, file: &fs::File) -> bool {
        let trusted = file
            .metadata()
            .is_ok_and(|m| fs::read(self.whole_record(id)).is_ok_and(|r| r == whole_identity(&m).as_bytes()));
        if trusted && self.cap.is_some() {
            self.touch(id);
            self.trust_whole(id, file);
        }
        trusted
    }

    /// Hashes entry `id` whole: if it holds `id`'s content, records it so
    /// (see [`DiskCache::whole_trusted`]) and answers true; if not, removes
    /// it (counted as healed) and answers false. An entry that cannot be
    /// read answers false and is left.
    pub fn check_whole(&self, id: &Hash) -> bool {
        let p = self.path(id);
        let Ok(f) = crate::fsutil::open_regular(&p) else { return false };
        match crate::fsutil::hash_file(&f) {
            Ok(h) if h == *id => {
                self.trust_whole(id, &f);
                true
            }
            Ok(_) => {
                self.heal_loose(&p, f.metadata().map(|m| m.len()).unwrap_or(0));
                let _ = fs::remove_file(self.whole_record(id));
                tracing::warn!("the cache's whole copy of {id} was damaged; removed");
                false
            }
            Err(_) => false,
        }
    }

    /// Loose entry `p` (`len` bytes) held the wrong bytes: removed, and
    /// counted as healed.
    fn heal_loose(&self, p: &Path, len: u64) {
        self.counters.healed.fetch_add(1, Relaxed);
        if fs::remove_file(p).is_ok() && self.cap.is_some() {
            self.size.fetch_sub(len, Relaxed);
        }
    }

    /// Pack `id`'s lock, unless another holds it (`Err`: a download or a
    /// build under way, whose files must be left alone). `Ok(None)`: the
    /// lock file cannot be used (the caller goes on unlocked, as a fetch
    /// does).
    fn lock_unless_busy(&self, id: &Hash) -> std::result::Result<Option<PackLock>, ()> {
        match self.pack_locks.try_lock(id) {
            Ok(None) => Err(()),
            Ok(Some(l)) => Ok(Some(l)),
            Err(_) => Ok(None),
        }
    }

    /// Says once per process that the disk is full: callers go on without
    /// the cache (a read still returns its bytes).
    fn warn_if_full(&self, e: &std::io::Error) {
        let full = [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT].map(|e| e.raw_os_error());
        if e.raw_os_error().is_some_and(|n| full.contains(&n)) && !self.full_warned.swap(true, Relaxed) {
            eprintln!(
                "warning: the disk cache at {} is full ({e}); reads go on, but nothing more is cached \
                 until space is freed (or the cache is capped: setting cache.max_size)",
                self.root.display()
            );
        }
    }

    /// A new entry's place in the eviction order: on probation (first to
    /// go, newest first), or one write in [`ADMIT_EVERY`] as recently used.
    fn set_probation(&self, p: &Path, pack: Option<Hash>) {
        if self.cap.is_none() {
            return;
        }
        let n = self.inserts.fetch_add(1, Relaxed);
        if n % ADMIT_EVERY == ADMIT_EVERY - 1 {
            return; // written just now: its mtime already says so
        }
        let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let back = since.saturating_sub(Duration::from_secs(PROBATION_BASE));
        let t = (SystemTime::UNIX_EPOCH + Duration::from_secs(PROBATION_BASE))
            .checked_sub(back)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        set_mtime(p, t);
        if let Ok(m) = fs::symlink_metadata(p) {
            let held = if pack.is_some() { held(&m) } else { m.len() };
            let e = Scanned { path: p.to_path_buf(), held, time: m.modified().unwrap_or(t), pack };
            if let Ok(mut st) = self.evict_state.lock() {
                if st.recent.len() >= RECENT_MAX {
                    // The older half is still found by the next scan.
                    st.recent.drain(..RECENT_MAX / 2);
                }
                st.recent.push(e);
            }
        }
    }

    /// A hit: the entry leaves probation, or is refreshed, as used now.
    fn used(&self, p: &Path, pack: Option<&Hash>) {
        if self.cap.is_none() {
            return;
        }
        if let Some(id) = pack {
            let mut t = self.pack_touched.lock().expect("pack touched lock");
            if t.get(id).is_some_and(|at| at.elapsed() < PACK_TOUCH_EVERY) {
                return;
            }
            t.insert(*id, Instant::now());
        }
        set_mtime(p, SystemTime::now());
    }

    /// `n` more bytes are held by `p`: evicts when over the cap.
    fn grew(&self, n: u64, p: &Path) {
        if let Some(cap) = self.cap {
            let total = self.size.fetch_add(n, Relaxed) + n;
            if total > cap {
                self.evict(cap, p);
            }
        }
    }

    /// Evicts whole entries (loose objects, cached packs) until the cache
    /// fits `cap`, never `keep` (the entry just written).
    ///
    /// The order is by mtime, oldest first, and a new entry's mtime puts it
    /// on probation: before every entry that was ever hit, and newest
    /// first among its kind (LRU insertion, as in Qureshi et al., "Adaptive
    /// Insertion Policies for High Performance Caching", ISCA 2007). A hit
    /// moves an entry to now, the most recently used end. A scan larger
    /// than the cap so evicts its own newest entries and keeps what was
    /// there (and its own first part): a second pass over a working set
    /// twice the cap hits about half of it, where LRU hits nothing. One
    /// write in [`ADMIT_EVERY`] enters as recently used instead, so a new
    /// working set still displaces an old one over a few passes. The order
    /// lives in the files' mtimes, so every process shares it.
    ///
    /// Victims come first from this process's own probation writes, then
    /// from the order the last scan found; each is stat'ed again before it
    /// goes (one used since is skipped), and the cache is scanned again only
    /// when that order runs out: no full scan per write.
    fn evict(&self, cap: u64, keep: &Path) {
        let Ok(mut st) = self.evict_state.lock() else {
            return;
        };
        let mut total = self.size.load(Relaxed);
        let mut rescanned = false;
        let mut kept = None;
        while total > cap {
            let victim = match st.recent.pop() {
                Some(v) => v,
                None => match st.scanned.pop_front() {
                    Some(v) => v,
                    None if !rescanned => {
                        rescanned = true;
                        let mut all = self.scan();
                        total = all.iter().map(|e| e.held).sum();
                        all.sort_by_key(|e| e.time);
                        st.scanned = all.into();
                        continue;
                    }
                    None => break,
                },
            };
            if victim.path == keep {
                // Still the first victim of the next write.
                kept = Some(victim);
                continue;
            }
            // Skipped when gone, or used since it was listed.
            let Ok(m) = fs::symlink_metadata(&victim.path) else { continue };
            if m.modified().ok() != Some(victim.time) {
                continue;
            }
            let freed = match victim.pack {
                Some(id) => {
                    // A pack being written (its lock held, by another
                    // process or this one) stays: dropped now, the rest of
                    // its download went into a new file full of holes,
                    // which its record then named, and reads "healed" it
                    // (seen with a 5 MB cap).
                    let Ok(_lock) = self.lock_unless_busy(&id) else { continue };
                    self.drop_pack(&id)
                }
                None => {
                    let freed = fs::remove_file(&victim.path).map(|_| m.len()).unwrap_or(0);
                    // A large file's whole copy: its check's record too.
                    let id = victim.path.file_name().and_then(|n| n.to_str()?.parse::<Hash>().ok());
                    if let Some(id) = id.filter(|_| freed >= 4 << 20) {
                        let _ = fs::remove_file(self.whole_record(&id));
                    }
                    freed
                }
            };
            if freed > 0 {
                total = total.saturating_sub(freed);
                self.counters.evicted.fetch_add(1, Relaxed);
            }
        }
        st.recent.extend(kept);
        self.size.store(total, Relaxed);
    }

    /// Every entry of both kinds.
    fn scan(&self) -> Vec<Scanned> {
        self.scans.fetch_add(1, Relaxed);
        let mut out = Vec::new();
        if let Ok(dirs) = fs::read_dir(self.root.join("objects")) {
            for d in dirs.flatten() {
                scan_loose(&d.path(), &mut out);
            }
        }
        // A mount's base times (`stat/flat/<stat id>`): evicted as loose
        // entries are (a mount that maps one keeps its pages; the next
        // open makes it again).
        scan_loose(&self.root.join("stat").join("flat"), &mut out);
        if let Ok(files) = fs::read_dir(self.root.join("packs").join("data")) {
            for f in files.flatten() {
                let name = f.file_name().to_string_lossy().to_string();
                let Some(id) = name.strip_suffix(".pack").and_then(|h| h.parse::<Hash>().ok()) else {
                    continue;
                };
                if let Ok(m) = f.metadata() {
                    let time = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    out.push(Scanned { path: f.path(), held: held(&m), time, pack: Some(id) });
                }
            }
        }
        out
    }

    pub fn usage(&self) -> Usage {
        let entries = self.scan();
        let packs = entries.iter().filter(|e| e.pack.is_some()).count() as u64;
        Usage {
            path: self.root.display().to_string(),
            entries: entries.len() as u64 - packs,
            packs,
            bytes: entries.iter().map(|e| e.held).sum(),
            cap: self.cap,
        }
    }

    /// Re-hashes every entry; removes and lists the bad ones.
    pub fn verify(&self, mut progress: impl FnMut(u64, u64)) -> VerifyReport {
        let scanned = self.scan();
        // Loose entries and packs together, as the report counts them.
        let total = scanned.len() as u64;
        let mut progress = move |done: u64, _: u64| progress(done, total.max(done));
        // Loose objects are named by their hash; a mount's base times
        // (`stat/flat`) are not, and check themselves as they are opened.
        let times = self.root.join("stat");
        let entries: Vec<PathBuf> =
            scanned.into_iter().filter(|e| e.pack.is_none() && !e.path.starts_with(&times)).map(|e| e.path).collect();
        let mut report = VerifyReport::default();
        for p in entries {
            report.checked += 1;
            progress(report.checked, total);
            let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            // Hashed as a stream: an entry may be a whole large file.
            let ok = match (name.parse::<Hash>(), crate::fsutil::hash_regular(&p)) {
                (Ok(id), Ok(h)) => h == id,
                _ => false,
            };
            if !ok {
                let _ = fs::remove_file(&p);
                report.bad.push(name);
            }
        }
        self.verify_packs(&mut report, &mut progress);
        report
    }
}

/// What a whole copy's record holds: the boot, and the file's inode,
/// size, and modification and change times in nanoseconds.
fn whole_identity(m: &fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    static BOOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let boot = BOOT.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|b| b.trim().to_string()).unwrap_or_default()
    });
    format!(
        "MADW 1 {boot} {} {} {}.{:09} {}.{:09}\n",
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// The files of folder `dir` evicted one by one (a loose object's, a
/// mount's base times), those being written (`.` names) left out.
fn scan_loose(dir: &Path, out: &mut Vec<Scanned>) {
    for f in fs::read_dir(dir).into_iter().flatten().flatten() {
        if f.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if let Ok(m) = f.metadata() {
            let time = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            out.push(Scanned { path: f.path(), held: m.len(), time, pack: None });
        }
    }
}

/// Removes the files in `dir` (a cache's build folder) of processes that
/// are gone. Their names are `KIND-PID-RANDOM`.
fn remove_dead_builds(dir: &Path) {
    for f in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = f.file_name().to_string_lossy().to_string();
        let pid = name.split('-').nth(1).and_then(|p| p.parse::<i32>().ok());
        let alive = pid
            .and_then(rustix::process::Pid::from_raw)
            .is_some_and(|p| !matches!(rustix::process::test_kill_process(p), Err(rustix::io::Errno::SRCH)));
        if !alive {
            let _ = fs::remove_file(f.path());
        }
    }
}

/// Eviction candidates, in the order they go.
#[derive(Default)]
struct EvictState {
    /// This process's own writes on probation, newest last (popped first).
    recent: Vec<Scanned>,
    /// The rest, oldest first, as the last scan found them.
    scanned: std::collections::VecDeque<Scanned>,
}

/// One entry found by a scan.
struct Scanned {
    path: PathBuf,
    held: u64,
    time: SystemTime,
    /// A cached pack (its two files go together).
    pack: Option<Hash>,
}

/// Bytes a cache file holds on disk: its length, or less for a sparse
/// pack file of which only a span was fetched.
fn held(m: &fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    m.len().min(m.blocks() * 512)
}

fn set_mtime(p: &Path, t: SystemTime) {
    if let Ok(f) = fs::File::options().write(true).custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32).open(p) {
        let _ = f.set_modified(t);
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
    fn a_noted_ref_is_read_back_by_its_store_and_name_and_rewritten_only_when_it_moved() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), None).unwrap();
        let (a, b) = (Hash::of(b"a"), Hash::of(b"b"));
        let (s, t) = ("s3://one/p", "s3://two/p");
        assert_eq!(c.seen_ref(s, "main"), None);
        c.note_ref(s, "main", &a);
        c.note_ref(s, "ws/x", &b);
        c.note_ref(s, "ws%2Fx", &a);
        assert_eq!(c.seen_ref(s, "main").map(|s| s.0), Some(a));
        // Another store's ref of the same name is not this one.
        assert_eq!(c.seen_ref(t, "main"), None);
        c.note_ref(t, "main", &b);
        assert_eq!(c.seen_ref(s, "main").map(|s| s.0), Some(a));
        assert_eq!(c.seen_ref(t, "main").map(|s| s.0), Some(b));
        // `/` and an escaped `/` in a name are two refs, not one file.
        assert_eq!(c.seen_ref(s, "ws/x").map(|s| s.0), Some(b));
        assert_eq!(c.seen_ref(s, "ws%2Fx").map(|s| s.0), Some(a));
        // The same value again keeps the note (its time is when the ref
        // was first read so); a new one replaces it.
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let p = c.seen_ref_path(s, "main");
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(old).unwrap();
        c.note_ref(s, "main", &a);
        assert_eq!(c.seen_ref(s, "main"), Some((a, old)));
        c.note_ref(s, "main", &b);
        let (now, when) = c.seen_ref(s, "main").unwrap();
        assert_eq!(now, b);
        assert!(when > old);
        // A note that is not an id is no note.
        std::fs::write(&p, b"garbage\n").unwrap();
        assert_eq!(c.seen_ref(s, "main"), None);
    }

    #[test]
    fn a_dead_process_build_goes_a_live_one_stays_and_adopt_makes_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), None).unwrap();
        let b = c.build_dir().unwrap();
        // pid 0x7ffffff0 is far above pid_max: not a live process.
        let (mine, dead) = (b.join(format!("assemble-{}-1", std::process::id())), b.join("assemble-2147483632-1"));
        fs::write(&mine, b"whole").unwrap();
        fs::write(&dead, b"torn").unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), None).unwrap();
        assert!(mine.exists());
        assert!(!dead.exists(), "a build of a process that is gone is removed when a cache opens");
        let id = Hash::of(b"whole");
        c.adopt(&id, &mine).unwrap();
        assert!(!mine.exists());
        assert_eq!(c.get(&id).unwrap(), b"whole");
        assert_eq!(c.verify(|_, _| {}).bad.len(), 0);
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

    /// A mount's base times count against the cap and are evicted like a
    /// loose entry; `verify` leaves them (they are not named by a hash of
    /// their bytes).
    #[test]
    fn kept_base_times_count_against_the_cap_and_verify_leaves_them() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), Some(250)).unwrap();
        let times = c.flat_times_path(&Hash::of(b"stat"));
        crate::fsutil::replace_cache_file(&times, &[7u8; 150]).unwrap();
        let old = SystemTime::now() - std::time::Duration::from_secs(100);
        fs::File::options().write(true).open(&times).unwrap().set_modified(old).unwrap();
        assert_eq!((c.usage().entries, c.usage().bytes), (1, 150));
        assert!(c.verify(|_, _| {}).bad.is_empty(), "verify called the kept times bad");
        assert!(times.is_file());
        // A process opening the cache later counts them.
        let c = DiskCache::open(dir.path().to_path_buf(), Some(250)).unwrap();
        let b = vec![1u8; 150];
        c.put(&Hash::of(&b), &b).unwrap();
        assert!(!times.exists(), "the older kept times went to make room");
        assert!(c.contains(&Hash::of(&b)));
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

    /// One pass over `set` as a reader does: a miss fetches and stores.
    /// Returns the misses.
    fn pass(c: &DiskCache, set: &[Vec<u8>]) -> usize {
        let mut misses = 0;
        for b in set {
            let id = Hash::of(b);
            if c.get(&id).is_none() {
                misses += 1;
                c.put(&id, b).unwrap();
            }
        }
        misses
    }

    fn blobs(tag: &str, n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("{tag} {i:06} ").repeat(20).as_bytes()[..100].to_vec()).collect()
    }

    #[test]
    fn a_second_pass_over_twice_the_cap_hits_about_half() {
        let dir = tempfile::tempdir().unwrap();
        let w = blobs("w", 400);
        let cap = 100 * w.len() as u64 / 2;
        let c = DiskCache::open(dir.path().to_path_buf(), Some(cap)).unwrap();
        assert_eq!(pass(&c, &w), w.len());
        // Each pass in a process of its own: the order lives on disk.
        for round in 2..=4 {
            let c = DiskCache::open(dir.path().to_path_buf(), Some(cap)).unwrap();
            let misses = pass(&c, &w);
            assert!(misses * 100 <= w.len() * 55, "pass {round}: {misses} misses of {} (LRU: all)", w.len());
            assert!(c.usage().bytes <= cap);
        }
    }

    /// The eviction order lives on disk, for every process: a new entry's
    /// mtime is a probation time before 2020, newer writes earlier; a hit
    /// moves it to now.
    #[test]
    fn probation_times_sort_newest_first_and_before_every_use() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), Some(1 << 20)).unwrap();
        let (a, b) = (b"first".to_vec(), b"second".to_vec());
        c.put(&Hash::of(&a), &a).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.put(&Hash::of(&b), &b).unwrap();
        let mtime = |d: &[u8]| fs::metadata(c.path(&Hash::of(d))).unwrap().modified().unwrap();
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(PROBATION_BASE);
        let floor = SystemTime::UNIX_EPOCH + Duration::from_secs(PROBATION_BASE / 2);
        assert!(mtime(&b) < mtime(&a), "the newer write sorts first");
        assert!(mtime(&a) < base && mtime(&b) > floor, "{:?} {:?}", mtime(&a), mtime(&b));
        assert!(c.get(&Hash::of(&b)).is_some());
        assert!(mtime(&b) > base, "a hit moves the entry to now");
    }

    /// Eviction starts only over the cap, and stops as soon as the cache
    /// fits it again.
    #[test]
    fn eviction_keeps_the_cache_at_the_cap_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), Some(300)).unwrap();
        let b = blobs("cap", 4);
        for x in &b[..3] {
            c.put(&Hash::of(x), x).unwrap();
        }
        assert_eq!((c.usage().entries, c.stats().evicted), (3, 0), "at the cap, nothing goes");
        c.put(&Hash::of(&b[3]), &b[3]).unwrap();
        assert_eq!((c.usage().entries, c.usage().bytes, c.stats().evicted), (3, 300, 1), "one goes, not two");
        assert!(c.contains(&Hash::of(&b[3])), "never the entry just written");
    }

    /// A cached pack of which only a span far into the pack was fetched
    /// counts the bytes it holds, not its length.
    #[test]
    fn a_sparse_pack_file_counts_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), None).unwrap();
        let id = Hash([5; 32]);
        let w = c.pack_writer(&id).unwrap();
        w.write_at(&c, 8 << 20, &vec![7u8; 64 << 10]).unwrap();
        w.commit(&c, &[]).unwrap();
        let u = c.usage();
        assert_eq!(u.packs, 1);
        assert!((64 << 10..=80 << 10).contains(&u.bytes), "{u:?}");
    }

    #[test]
    fn eviction_does_not_rescan_the_cache_per_write() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), Some(100 * 100)).unwrap();
        let w = blobs("s", 2000);
        pass(&c, &w);
        let scans = c.scans.load(Relaxed);
        assert!(scans <= 3, "{scans} full scans for {} writes over the cap", w.len());
        assert!(c.usage().bytes <= 100 * 100);
    }

    #[test]
    fn a_new_working_set_displaces_an_old_one_over_passes() {
        let dir = tempfile::tempdir().unwrap();
        let cap = 100 * 200;
        let c = DiskCache::open(dir.path().to_path_buf(), Some(cap)).unwrap();
        let old = blobs("old", 200);
        pass(&c, &old);
        assert_eq!(pass(&c, &old), 0, "the old set fits and is used twice");
        let new = blobs("new", 200);
        let first = pass(&c, &new);
        let mut last = first;
        for _ in 0..40 {
            last = pass(&c, &new);
        }
        assert!(last * 3 < first, "the new set gets in: {first} misses, then {last}");
    }

    #[test]
    fn cached_packs_are_evicted_whole() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path().to_path_buf(), Some(64 << 10)).unwrap();
        let mut packs = Vec::new();
        for p in 0..4u8 {
            let raws: Vec<Vec<u8>> = (0..8u8).map(|i| vec![p * 8 + i; 4096]).collect();
            let members: Vec<_> = raws.iter().map(|r| (Hash::of(r), crate::pack::MemberKind::Blob, &r[..])).collect();
            let (bytes, entry) = crate::pack::build_pack(&members);
            // Incompressible enough to take room: store raw bytes anyway.
            let w = c.pack_writer(&entry.id).unwrap();
            w.write_at(&c, 0, &bytes).unwrap();
            w.commit(&c, &entry.members).unwrap();
            packs.push(entry);
        }
        let u = c.usage();
        assert!(u.bytes <= 64 << 10, "{u:?}");
        let whole = |e: &crate::pack::PackEntry| e.members.iter().all(|m| c.pack_has(&e.id, &m.id));
        let none = |e: &crate::pack::PackEntry| e.members.iter().all(|m| !c.pack_has(&e.id, &m.id));
        assert!(packs.iter().all(|e| whole(e) || none(e)), "a pack goes whole or stays whole");
        assert!(whole(packs.last().unwrap()), "the pack just written stays");
    }
}
