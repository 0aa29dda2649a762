//! Reads of a chunked (large) file through the filesystem.
//!
//! - Chunks recently read stay decoded in memory ([`RECENT_BYTES`], shared
//!   by every open file), so the kernel's reads (128 KiB to 1 MiB) of one chunk
//!   read and verify it from the cache once, not eight times.
//! - A sequential reader gets read-ahead: once reads follow one another,
//!   the next chunks are fetched in the background, a window that grows
//!   from 1 MiB to [`READ_AHEAD_BYTES`] while the reader keeps up (as
//!   mountpoint-s3's prefetcher grows its window). A chunk read ahead
//!   lands in the disk cache and in the recent set (so a warm read overlaps
//!   the disk reads and checks of the next chunks with the reader's
//!   copies); the recent set is small and shared, so a reader that stops
//!   costs nothing but the fetches already started. A random read fetches
//!   only the chunks it touches.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use futures::FutureExt;

use super::*;
use crate::fetch::CHUNK_WINDOW;

/// Bytes of decoded chunks kept in memory.
pub const RECENT_BYTES: u64 = 64 << 20;
/// The largest read-ahead window of one reader, in bytes (at a 20 ms round
/// trip, 32 MiB in flight is ~1.6 GB/s).
pub const READ_AHEAD_BYTES: u64 = 32 << 20;
/// Read-ahead fetches in flight across every open file (with the recent
/// set, at most ~130 MiB of chunks even if every chunk were 4 MiB).
const AHEAD_IN_FLIGHT: usize = 16;

type Loading = futures::future::Shared<futures::future::BoxFuture<'static, std::result::Result<Bytes, Arc<Error>>>>;

/// The read pattern of one open chunked file.
#[derive(Default)]
pub struct Readahead {
    /// Where the next read starts if the reader is sequential.
    next: AtomicU64,
    /// Sequential reads in a row.
    streak: AtomicU32,
    /// Chunks below this index were already asked for.
    ahead_to: AtomicUsize,
    /// Whether this handle considered building a whole-file copy.
    tried: std::sync::atomic::AtomicBool,
    /// The whole-file copy this handle's reads are building, if any.
    assembly: Mutex<Option<Arc<Assembly>>>,
}

pub(super) struct Chunks {
    recent: Arc<Mutex<VecDeque<(Hash, Bytes)>>>,
    /// Chunks being loaded: the kernel's parallel reads of one chunk and
    /// the read-ahead share one load (one copy in memory, one check).
    loading: Arc<Mutex<std::collections::HashMap<Hash, Loading>>>,
    ahead: Arc<tokio::sync::Semaphore>,
    pub(super) ahead_started: AtomicU64,
    /// Whether a file read in order is also written whole into the disk
    /// cache (set by a mount whose kernel takes passthrough opens).
    pub(super) assemble: std::sync::atomic::AtomicBool,
    /// Files (by content) whose whole copy is being built.
    assembling: Arc<Building>,
    /// Whole copies built and kept.
    pub(super) assembled: Arc<AtomicU64>,
}

impl Default for Chunks {
    fn default() -> Self {
        Chunks {
            recent: Arc::new(Mutex::new(VecDeque::new())),
            loading: Arc::new(Mutex::new(std::collections::HashMap::new())),
            ahead: Arc::new(tokio::sync::Semaphore::new(AHEAD_IN_FLIGHT)),
            ahead_started: AtomicU64::new(0),
            assemble: Default::default(),
            assembling: Default::default(),
            assembled: Default::default(),
        }
    }
}

impl Chunks {
    fn recent(&self, id: &Hash) -> Option<Bytes> {
        self.recent.lock().expect("recent chunks").iter().find(|(h, _)| h == id).map(|(_, b)| b.clone())
    }

    /// Chunk `id`: from the recent set, or one shared load of it (from
    /// the disk cache or the store), remembered once loaded. `in_order`:
    /// the reader goes on to the next chunks (see [`Fetcher::get_in_order`]).
    fn load(&self, fetcher: &Arc<Fetcher>, id: Hash, in_order: bool) -> Loading {
        let mut loading = self.loading.lock().expect("loading chunks");
        if let Some(l) = loading.get(&id) {
            return l.clone();
        }
        let (recent, all, fetcher) = (self.recent.clone(), self.loading.clone(), fetcher.clone());
        let l = async move {
            let r = load(&fetcher, id, in_order).await;
            if let Ok(b) = &r {
                remember(&recent, id, b.clone());
            }
            all.lock().expect("loading chunks").remove(&id);
            r.map_err(Arc::new)
        }
        .boxed()
        .shared();
        loading.insert(id, l.clone());
        l
    }
}

/// A shared load's error, for one of its waiters.
fn unshare(e: Arc<Error>) -> Error {
    match Arc::try_unwrap(e) {
        Ok(e) => e,
        Err(e) => Error::Io { context: e.to_string(), source: std::io::Error::other("a shared chunk read failed") },
    }
}

/// A chunk from the disk cache, read and verified off the async workers
/// (they serve the other reads), or else fetched.
async fn load(fetcher: &Arc<Fetcher>, id: Hash, in_order: bool) -> Result<Bytes> {
    let f = fetcher.clone();
    match tokio::task::spawn_blocking(move || f.cached(&id)).await {
        Ok(Some(b)) => Ok(crate::bufpool::into_bytes(b)),
        _ if in_order => fetcher.get_in_order(id, "chunk").await,
        _ => fetcher.get(Space::Objects, id, "chunk").await,
    }
}

fn remember(recent: &Mutex<VecDeque<(Hash, Bytes)>>, id: Hash, b: Bytes) {
    let mut r = recent.lock().expect("recent chunks");
    if r.iter().any(|(h, _)| *h == id) {
        return;
    }
    let mut held: u64 = r.iter().map(|(_, b)| b.len() as u64).sum();
    while held + b.len() as u64 > RECENT_BYTES {
        let Some((_, old)) = r.pop_front() else { break };
        held -= old.len() as u64;
    }
    r.push_back((id, b));
}

impl SnapshotFs {
    /// Starts building the whole-file copy of a chunked file read in
    /// order, for later opens to pass through (see [`Assembly`]): once per
    /// handle, when the mount asked for it, the copy is not there yet and
    /// no other handle is building it, and the file takes at most a
    /// quarter of a capped cache.
    fn start_assembly(&self, manifest: &ChunkManifest, ahead: &Readahead) {
        if !self.chunks.assemble.load(Relaxed) || ahead.tried.swap(true, Relaxed) || self.is_writable() {
            return;
        }
        let cache = &self.fetcher.cache;
        if cache.cap().is_some_and(|cap| manifest.size > cap / 4) || cache.entry_path(&manifest.content).exists() {
            return;
        }
        if !self.chunks.assembling.set.lock().expect("assembling lock").insert(manifest.content) {
            return;
        }
        match Assembly::new(cache.clone(), manifest, self.chunks.assembling.clone(), self.chunks.assembled.clone()) {
            Ok(a) => *ahead.assembly.lock().expect("assembly lock") = Some(Arc::new(a)),
            Err(e) => {
                self.chunks.assembling.set.lock().expect("assembling lock").remove(&manifest.content);
                tracing::debug!("not keeping a whole copy of a large file: {e}");
            }
        }
    }

    /// A handle of a chunked file closes. The whole copy it was building is
    /// completed when at least half of it is written (the chunks it lacks
    /// are those the kernel still had in its page cache, or that a reader
    /// skipped: they are read from the disk cache, or fetched), and dropped
    /// otherwise. Run off the FUSE threads; the copy is kept once whole.
    pub async fn close_chunked(&self, f: &OpenFile) {
        let OpenFile::Chunked { manifest, starts, ahead, .. } = f else { return };
        let Some(a) = ahead.assembly.lock().expect("assembly lock").take() else { return };
        let missing: Vec<usize> = {
            let given = a.given.lock().expect("assembly lock");
            if a.failed.load(Relaxed) || given.iter().filter(|g| **g).count() * 2 < given.len() {
                return;
            }
            (0..given.len()).filter(|&i| !given[i]).collect()
        };
        for i in missing {
            let Ok(b) = self.chunks.load(&self.fetcher, manifest.chunks[i].1, true).await else { return };
            let (a, at) = (a.clone(), starts[i]);
            // One write at a time here: this loop runs at the disk's pace.
            if tokio::task::spawn_blocking(move || a.write(i, at, b)).await.is_err() {
                return;
            }
        }
    }

    /// Waits, at most `limit`, for the whole copies being built to be kept
    /// or dropped (a daemon about to exit: a copy whose last chunk was
    /// written is being hashed). Returns how many are still going.
    pub fn wait_assemblies(&self, limit: std::time::Duration) -> usize {
        let b = &self.chunks.assembling;
        let set = b.set.lock().expect("assembling lock");
        let (set, _) = b.ended.wait_timeout_while(set, limit, |s| !s.is_empty()).expect("assembling lock");
        set.len()
    }

    /// Whole copies of large files built so far.
    pub fn files_assembled(&self) -> u64 {
        self.chunks.assembled.load(Relaxed)
    }

    /// Chunks fetched or loaded ahead of sequential readers so far.
    pub fn chunks_read_ahead(&self) -> u64 {
        self.chunks.ahead_started.load(Relaxed)
    }

    /// `size` bytes at `offset` of a chunked file.
    pub(super) async fn read_chunked(
        &self,
        entry: &Entry,
        manifest: &ChunkManifest,
        starts: &[u64],
        ahead: &Readahead,
        offset: u64,
        size: u32,
    ) -> Result<Bytes> {
        let end = (offset + size as u64).min(manifest.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let first = starts.partition_point(|s| *s <= offset) - 1;
        let last = starts.partition_point(|s| *s < end) - 1;
        let in_order = self.read_ahead(manifest, starts, ahead, offset, end, last);
        if in_order {
            self.start_assembly(manifest, ahead);
        }
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        let parts: Vec<Bytes> = self
            .timed(
                "reading a file",
                futures::stream::iter((first..=last).map(|i| {
                    let id = manifest.chunks[i].1;
                    let name = name.clone();
                    async move {
                        if let Some(b) = self.chunks.recent(&id) {
                            return Ok(b);
                        }
                        self.chunks.load(&self.fetcher, id, in_order).await.map_err(|e| unshare(e).at_path(&name))
                    }
                }))
                .buffered(CHUNK_WINDOW)
                .try_collect(),
            )
            .await?;
        if let Some(a) = ahead.assembly.lock().expect("assembly lock").as_ref() {
            for (k, p) in parts.iter().enumerate() {
                a.put(first + k, starts[first + k], p.clone());
            }
        }
        if let [p] = &parts[..] {
            // Within one chunk (the usual case): a view, no copy.
            let from = (offset - starts[first]) as usize;
            let to = ((end - starts[first]) as usize).min(p.len());
            return Ok(p.slice(from.min(to)..to));
        }
        let mut out = crate::bufpool::take((end - offset) as usize);
        for (k, p) in parts.iter().enumerate() {
            let cs = starts[first + k];
            let from = offset.saturating_sub(cs) as usize;
            let to = ((end - cs) as usize).min(p.len());
            out.extend_from_slice(&p[from.min(to)..to]);
        }
        Ok(crate::bufpool::into_bytes(out))
    }

    /// Starts fetching the chunks after `last` when the reader is
    /// sequential: a window of 1 MiB after the first read, growing by
    /// 1 MiB every two sequential reads up to [`READ_AHEAD_BYTES`] (at
    /// least one chunk). Returns whether the reader is sequential.
    fn read_ahead(
        &self,
        manifest: &ChunkManifest,
        starts: &[u64],
        ahead: &Readahead,
        offset: u64,
        end: u64,
        last: usize,
    ) -> bool {
        let sequential = ahead.next.swap(end, Relaxed) == offset;
        if !sequential {
            ahead.streak.store(0, Relaxed);
            return false;
        }
        let streak = ahead.streak.fetch_add(1, Relaxed) as u64;
        let window = ((1 + streak / 2) << 20).min(READ_AHEAD_BYTES);
        let mut upto = last;
        let mut bytes = 0;
        while upto + 1 < manifest.chunks.len() && (upto == last || bytes < window) {
            upto += 1;
            bytes += manifest.chunks[upto].0;
        }
        if upto == last {
            return true;
        }
        let from = ahead.ahead_to.fetch_max(upto + 1, Relaxed).max(last + 1);
        for (j, &at) in starts.iter().enumerate().take(upto + 1).skip(from) {
            let id = manifest.chunks[j].1;
            if self.chunks.recent(&id).is_some() {
                continue;
            }
            let permits = self.chunks.ahead.clone();
            self.chunks.ahead_started.fetch_add(1, Relaxed);
            // Registered now, so a read that reaches this chunk first
            // drives the same load; the permit only bounds how many the
            // read-ahead itself drives.
            let load = self.chunks.load(&self.fetcher, id, true);
            let assembly = ahead.assembly.lock().expect("assembly lock").clone();
            tokio::spawn(async move {
                let Ok(_permit) = permits.acquire_owned().await else { return };
                // A failure is met again (and reported) by the read that
                // needs the chunk.
                if let (Ok(b), Some(a)) = (load.await, assembly) {
                    a.put(j, at, b);
                }
            });
        }
        true
    }
}

/// Files (by content) whose whole copy is being built, and a wake-up for
/// each that ends.
#[derive(Default)]
pub(super) struct Building {
    set: Mutex<std::collections::HashSet<Hash>>,
    ended: std::sync::Condvar,
}

/// Chunk writes of one whole copy in flight at most (~8 MiB held).
const ASSEMBLY_WRITES: usize = 8;

/// A whole copy of a chunked file, built in the disk cache from the chunks
/// its readers load, so that later opens of the file can be passed through
/// to the kernel (reads at the local disk's speed, no daemon in the way):
/// the "reassembled file kept for hot large files" of issue #19.
///
/// Each chunk arrives verified (it is read only through the fetcher) and is
/// written once at its offset in a file of the cache's build folder, off the
/// async workers. When every chunk is in, the file is hashed whole and kept
/// as the cache entry named by the manifest's content hash only if that
/// hash matches (a manifest whose chunks do not make its content is not
/// trusted to name a cache entry), then counted and evicted like any entry.
/// A handle closed before every chunk came has the rest filled in when at
/// least half is there, and drops the partial file otherwise (a reader
/// that stopped early or went elsewhere; see
/// [`SnapshotFs::close_chunked`]). Its cost: one more write of the
/// file's bytes while it is first read, one hash of it at the end, and the
/// file's size again in the cache.
pub(super) struct Assembly {
    cache: Arc<crate::cache::DiskCache>,
    content: Hash,
    size: u64,
    path: std::path::PathBuf,
    file: std::fs::File,
    /// Chunks written (or being written); `left` counts those not yet on disk.
    given: Mutex<Vec<bool>>,
    left: AtomicUsize,
    /// Writes handed off and not yet done (bounded: see [`ASSEMBLY_WRITES`]).
    writing: AtomicUsize,
    failed: std::sync::atomic::AtomicBool,
    kept: std::sync::atomic::AtomicBool,
    assembling: Arc<Building>,
    assembled: Arc<AtomicU64>,
}

impl Assembly {
    fn new(
        cache: Arc<crate::cache::DiskCache>,
        manifest: &ChunkManifest,
        assembling: Arc<Building>,
        assembled: Arc<AtomicU64>,
    ) -> Result<Assembly> {
        let dir = cache.build_dir()?;
        let path = dir.join(format!("assemble-{}-{}", std::process::id(), rand::random::<u64>()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        file.set_len(manifest.size).map_err(Error::io(format!("sizing {}", path.display())))?;
        Ok(Assembly {
            cache,
            content: manifest.content,
            size: manifest.size,
            path,
            file,
            given: Mutex::new(vec![false; manifest.chunks.len()]),
            left: AtomicUsize::new(manifest.chunks.len()),
            writing: AtomicUsize::new(0),
            failed: Default::default(),
            kept: Default::default(),
            assembling,
            assembled,
        })
    }

    /// Chunk `i` (verified), at `at` in the file: written once, off the
    /// async workers; the last one to land finishes the copy.
    fn put(self: &Arc<Self>, i: usize, at: u64, bytes: Bytes) {
        if !self.claim(i, true) {
            return;
        }
        let a = self.clone();
        tokio::task::spawn_blocking(move || {
            a.write_given(at, bytes);
            a.writing.fetch_sub(1, Relaxed);
        });
    }

    /// Writes chunk `i` now, on this (blocking) thread, unless it was given.
    fn write(&self, i: usize, at: u64, bytes: Bytes) {
        if self.claim(i, false) {
            self.write_given(at, bytes);
        }
    }

    /// Marks chunk `i` given, unless it was or the copy failed. `handed_off`:
    /// the write goes to another thread, counted in `writing`, and not when
    /// [`ASSEMBLY_WRITES`] are in flight (the disk falls behind the reader:
    /// the chunk is left for the fill at close rather than held in memory).
    fn claim(&self, i: usize, handed_off: bool) -> bool {
        let mut given = self.given.lock().expect("assembly lock");
        if self.failed.load(Relaxed) || given.get(i).copied().unwrap_or(true) {
            return false;
        }
        if handed_off {
            if self.writing.load(Relaxed) >= ASSEMBLY_WRITES {
                return false;
            }
            self.writing.fetch_add(1, Relaxed);
        }
        given[i] = true;
        true
    }

    /// Writes a chunk marked given; the last one finishes the copy.
    fn write_given(&self, at: u64, bytes: Bytes) {
        use std::os::unix::fs::FileExt;
        if let Err(e) = self.file.write_all_at(&bytes, at) {
            self.failed.store(true, Relaxed);
            tracing::debug!("whole copy of a large file: writing at {at}: {e}");
            return;
        }
        drop(bytes);
        if self.left.fetch_sub(1, Relaxed) == 1 {
            self.finish();
        }
    }

    /// Every chunk is on disk: hash the file whole and keep it if it is
    /// the content the manifest names.
    fn finish(&self) {
        if self.failed.load(Relaxed) {
            return;
        }
        // A test changes the file here, as a stray writer into the cache's
        // build folder would: the hash, not the chunks' checks, decides.
        crate::failpoint::pause("assembly-before-hash");
        match crate::fsutil::hash_regular(&self.path) {
            Ok(h) if h == self.content && self.file.metadata().is_ok_and(|m| m.len() == self.size) => {
                if self.cache.adopt(&self.content, &self.path).is_ok() {
                    self.kept.store(true, Relaxed);
                    self.assembled.fetch_add(1, Relaxed);
                }
            }
            Ok(h) => tracing::warn!(
                "a large file's chunks make {h}, not the content {} its manifest names; not kept",
                self.content
            ),
            Err(e) => tracing::debug!("whole copy of a large file: hashing {}: {e}", self.path.display()),
        }
    }
}

impl Drop for Assembly {
    fn drop(&mut self) {
        if !self.kept.load(Relaxed) {
            let _ = std::fs::remove_file(&self.path);
        }
        self.assembling.set.lock().expect("assembling lock").remove(&self.content);
        self.assembling.ended.notify_all();
    }
}
