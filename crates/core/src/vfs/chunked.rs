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

use super::{OpenFile, SnapshotFs};
use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::fetch::CHUNK_WINDOW;
use crate::hash::Hash;
use crate::object::{ChunkManifest, Entry};
use crate::store::Space;
use bytes::Bytes;
use futures::FutureExt;
use futures::{StreamExt, TryStreamExt};
use std::sync::Arc;

/// Bytes of decoded chunks kept in memory.
pub const RECENT_BYTES: u64 = 64 << 20;
/// The largest read-ahead window of one reader, in bytes (at a 20 ms round
/// trip, 64 MiB in flight is ~3 GB/s; at 32 MiB a cold `cat` of a 300 MB
/// file over MinIO at RTT 20 ms took ~10 % longer, medians of 8).
pub const READ_AHEAD_BYTES: u64 = 64 << 20;
/// Read-ahead fetches in flight across every open file (~32 MiB of chunks
/// of the average size; with the recent set, at most 192 MiB even if every
/// chunk were 4 MiB, the chunker's largest).
const AHEAD_IN_FLIGHT: usize = 32;

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
    /// Fires once the last load the read-ahead asked for has started.
    started: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
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
    /// Whole copies (by content) being hashed before any open passes
    /// through to them (see [`SnapshotFs::backing_file`]).
    checking: Arc<Mutex<std::collections::HashSet<Hash>>>,
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
            checking: Default::default(),
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
///
/// Whether the cache has it is asked here, on the async worker (a record
/// lookup or a `stat`), so that a miss goes on to the fetcher before this
/// task ever yields: loads then reach the fetcher in the order they were
/// first polled, which decides where a pack's download starts.
async fn load(fetcher: &Arc<Fetcher>, id: Hash, in_order: bool) -> Result<Bytes> {
    if fetcher.is_cached(&id) {
        let f = fetcher.clone();
        if let Ok(Some(b)) = tokio::task::spawn_blocking(move || f.cached(&id)).await {
            return Ok(crate::bufpool::into_bytes(b));
        }
    }
    match in_order {
        true => fetcher.get_in_order(id, "chunk").await,
        false => fetcher.get(Space::Objects, id, "chunk").await,
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
    /// A file with holes has no whole-content hash to name or check a copy
    /// by, and is read through this process.
    fn start_assembly(&self, manifest: &ChunkManifest, ahead: &Readahead) {
        if !self.chunks.assemble.load(Relaxed) || ahead.tried.swap(true, Relaxed) || self.is_writable() {
            return;
        }
        let Some(content) = manifest.content else { return };
        let cache = &self.fetcher.cache;
        if cache.cap().is_some_and(|cap| manifest.size > cap / 4) || cache.entry_path(&content).exists() {
            return;
        }
        if !self.chunks.assembling.set.lock().expect("assembling lock").insert(content) {
            return;
        }
        match Assembly::new(
            cache.clone(),
            content,
            manifest,
            self.chunks.assembling.clone(),
            self.chunks.assembled.clone(),
        ) {
            Ok(a) => *ahead.assembly.lock().expect("assembly lock") = Some(Arc::new(a)),
            Err(e) => {
                self.chunks.assembling.set.lock().expect("assembling lock").remove(&content);
                tracing::debug!("not keeping a whole copy of a large file: {e}");
            }
        }
    }

    /// The cache file an open of `f` may hand the kernel to read from
    /// (FUSE passthrough), opened, when it is known to hold the file's
    /// bytes; the kernel's reads of it are not checked.
    ///
    /// A small file's entry is compared with the bytes the open read and
    /// verified. A large file's whole copy must be as it was when last
    /// hashed (its record: [`crate::cache::DiskCache::whole_trusted`]);
    /// otherwise this open is served through this process, chunk by
    /// verified chunk, while the copy is hashed off the open's path: if
    /// good, later opens pass through; if not, it is removed. Before, a
    /// copy was hashed only when built, and a bit flipped in it later
    /// reached every reader of every later mount.
    pub fn backing_file(&self, f: &OpenFile) -> Option<std::fs::File> {
        // Opened as `open_regular` does (no symlink followed, no wait on
        // a FIFO), then without O_NONBLOCK: the kernel reads a passed
        // through file with its flags, and non-blocking reads of a cold
        // file went several times slower (a warm `cat` of 300 MB with the
        // page cache dropped: 0.53 s, against ~0.1 s).
        let open = |p: &std::path::Path| {
            let f = crate::fsutil::open_regular(p).ok()?;
            let flags = rustix::fs::fcntl_getfl(&f).ok()?;
            rustix::fs::fcntl_setfl(&f, flags - rustix::fs::OFlags::NONBLOCK).ok()?;
            Some(f)
        };
        match f {
            OpenFile::Whole { data, cache_path: Some(p), .. } => {
                let mut file = open(p)?;
                if file.metadata().ok()?.len() != data.len() as u64 {
                    return None;
                }
                let mut held = Vec::with_capacity(data.len());
                std::io::Read::read_to_end(&mut file, &mut held).ok()?;
                (held == data[..]).then_some(file)
            }
            OpenFile::Chunked { manifest, backing: Some(p), .. } => {
                let id = manifest.content?;
                let file = open(p)?;
                if file.metadata().ok()?.len() != manifest.size {
                    return None;
                }
                let cache = &self.fetcher.cache;
                if cache.whole_trusted(&id, &file) {
                    return Some(file);
                }
                if self.chunks.checking.lock().expect("checking lock").insert(id) {
                    let (cache, checking) = (cache.clone(), self.chunks.checking.clone());
                    tokio::task::spawn_blocking(move || {
                        cache.check_whole(&id);
                        checking.lock().expect("checking lock").remove(&id);
                    });
                }
                None
            }
            _ => None,
        }
    }

    /// A handle of a chunked file closes. If it read at least half of the
    /// file's chunks in order, the whole copy is built now, after the
    /// reads (see [`Assembly`]); otherwise nothing is kept. Run off the
    /// FUSE threads: the close does not wait for it.
    pub async fn close_chunked(&self, f: &OpenFile) {
        let OpenFile::Chunked { manifest, starts, ahead, .. } = f else { return };
        let Some(a) = ahead.assembly.lock().expect("assembly lock").take() else { return };
        {
            let seen = a.seen.lock().expect("assembly lock");
            if seen.iter().filter(|g| **g).count() * 2 < seen.len() {
                return;
            }
        }
        // Each chunk the cache holds as its bytes is copied by the kernel
        // (no pass through this process); the others are loaded (decoded,
        // verified, fetched if evicted) and written. Then the whole file
        // is hashed (`finish`).
        // (An assembly is only made for a file without holes.)
        let m: Arc<Vec<(u64, Hash)>> =
            Arc::new(manifest.chunks.iter().filter_map(|(n, id)| Some((*n, (*id)?))).collect());
        if m.len() != manifest.chunks.len() {
            return;
        }
        let (fetcher, m2, at) = (self.fetcher.clone(), m.clone(), starts.clone());
        let a2 = a.clone();
        let Ok((copied, missing)) = tokio::task::spawn_blocking(move || {
            (0..m2.len()).partition::<Vec<usize>, _>(|&i| fetcher.copy_cached(&m2[i].1, m2[i].0, &a2.file, at[i]))
        })
        .await
        else {
            return;
        };
        for i in missing {
            let Ok(b) = self.chunks.load(&self.fetcher, m[i].1, true).await else { return };
            let (a, at) = (a.clone(), starts[i]);
            // One write at a time: this loop runs at the disk's pace.
            match tokio::task::spawn_blocking(move || a.write(at, &b)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
        let fetcher = self.fetcher.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if !a.finish() {
                // The kernel copied those chunks unchecked, and the whole
                // hash cannot say which one rotted: a verified read of
                // each finds it and heals its pack (the next read
                // fetches it again).
                for i in copied {
                    let _ = fetcher.cached(&m[i].1);
                }
            }
        })
        .await;
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
        let ahead_to = self.sequential(manifest, ahead, offset, end, last);
        let in_order = ahead_to.is_some();
        if in_order {
            self.start_assembly(manifest, ahead);
        }
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        let own = self.timed(
            "reading a file",
            futures::stream::iter((first..=last).map(|i| {
                let (len, id) = manifest.chunks[i];
                let name = name.clone();
                let (cs, offset) = (starts[i], offset);
                async move {
                    let Some(id) = id else {
                        // A hole: the zeros this read covers of it.
                        let from = offset.saturating_sub(cs);
                        let to = (end - cs).min(len);
                        return Ok(Bytes::from(vec![0u8; to.saturating_sub(from) as usize]));
                    };
                    let b = match self.chunks.recent(&id) {
                        Some(b) => b,
                        None => self
                            .chunks
                            .load(&self.fetcher, id, in_order)
                            .await
                            .map_err(|e| unshare(e).at_path(&name))?,
                    };
                    // A chunk of another length than its manifest says would
                    // shift every byte after it.
                    if b.len() as u64 != len {
                        return Err(Error::Corrupt {
                            id,
                            what: "chunk",
                            path: name,
                            detail: format!("{} bytes, its manifest says {len}", b.len()),
                        });
                    }
                    Ok(b)
                }
            }))
            .buffered(CHUNK_WINDOW)
            .try_collect::<Vec<Bytes>>(),
        );
        let mut own = std::pin::pin!(own);
        // This read's own chunks are asked for before the read-ahead's: the
        // first chunk asked for of a pack decides where its download starts,
        // and a download started at a later chunk leaves the earlier ones
        // waiting for it to end before their own GET goes out.
        let polled = futures::poll!(own.as_mut());
        if let Some(upto) = ahead_to {
            self.read_ahead(manifest, ahead, last, upto);
        }
        let parts = match polled {
            std::task::Poll::Ready(r) => r?,
            std::task::Poll::Pending => own.await?,
        };
        if let Some(a) = ahead.assembly.lock().expect("assembly lock").as_ref() {
            a.seen(first..=last);
        }
        let hole_at = |k: usize| manifest.chunks[first + k].1.is_none();
        if let ([p], false) = (&parts[..], hole_at(0)) {
            // Within one chunk (the usual case): a view, no copy.
            let from = (offset - starts[first]) as usize;
            let to = ((end - starts[first]) as usize).min(p.len());
            return Ok(p.slice(from.min(to)..to));
        }
        let mut out = crate::bufpool::take((end - offset) as usize);
        for (k, p) in parts.iter().enumerate() {
            if hole_at(k) {
                // Already just the zeros this read covers.
                out.extend_from_slice(p);
                continue;
            }
            let cs = starts[first + k];
            let from = offset.saturating_sub(cs) as usize;
            let to = ((end - cs) as usize).min(p.len());
            out.extend_from_slice(&p[from.min(to)..to]);
        }
        Ok(crate::bufpool::into_bytes(out))
    }

    /// Whether a read of `offset..end` (its last chunk `last`) follows the
    /// one before: if so, the last chunk the read-ahead should reach, by a
    /// window of 1 MiB after the first read, growing by 1 MiB every two
    /// sequential reads up to [`READ_AHEAD_BYTES`] (at least one chunk).
    fn sequential(
        &self,
        manifest: &ChunkManifest,
        ahead: &Readahead,
        offset: u64,
        end: u64,
        last: usize,
    ) -> Option<usize> {
        let sequential = ahead.next.swap(end, Relaxed) == offset;
        if !sequential {
            ahead.streak.store(0, Relaxed);
            return None;
        }
        let streak = ahead.streak.fetch_add(1, Relaxed) as u64;
        let window = ((1 + streak / 2) << 20).min(READ_AHEAD_BYTES);
        let mut upto = last;
        let mut bytes = 0;
        while upto + 1 < manifest.chunks.len() && (upto == last || bytes < window) {
            upto += 1;
            bytes += manifest.chunks[upto].0;
        }
        Some(upto)
    }

    /// Starts fetching the chunks after `last` up to `upto` that no read
    /// or read-ahead has asked for yet, in file order (tasks started
    /// together run in any order: a later chunk asked first had its pack's
    /// download start there, and the chunks before it waited for that
    /// download to end before their own GET).
    fn read_ahead(&self, manifest: &ChunkManifest, ahead: &Readahead, last: usize, upto: usize) {
        if upto == last {
            return;
        }
        let from = ahead.ahead_to.fetch_max(upto + 1, Relaxed).max(last + 1);
        let mut loads = Vec::new();
        for j in from..=upto {
            let Some(id) = manifest.chunks[j].1 else { continue };
            if self.chunks.recent(&id).is_some() {
                continue;
            }
            self.chunks.ahead_started.fetch_add(1, Relaxed);
            // Registered now, so a read that reaches this chunk first
            // drives the same load; the permit only bounds how many the
            // read-ahead itself drives.
            loads.push(self.chunks.load(&self.fetcher, id, true));
        }
        if loads.is_empty() {
            return;
        }
        // A task per chunk, each starting its load only once the one before
        // it (of this handle, across reads) has started: loads of one pack's
        // chunks reach the fetcher in file order (its first decides where
        // the download starts), and permits are taken in that order (the
        // semaphore is fair).
        let mut chain = ahead.started.lock().expect("read-ahead lock");
        let mut before = chain.take();
        for load in loads {
            let (started, next) = tokio::sync::oneshot::channel::<()>();
            let (permits, prev) = (self.chunks.ahead.clone(), before.replace(next));
            tokio::spawn(async move {
                if let Some(prev) = prev {
                    let _ = prev.await;
                }
                let Ok(_permit) = permits.acquire_owned().await else { return };
                let mut load = std::pin::pin!(load);
                let first = futures::poll!(load.as_mut());
                // Dropped, the sender wakes the next task.
                drop(started);
                if first.is_pending() {
                    // A failure is met again (and reported) by the read
                    // that needs the chunk.
                    let _ = load.await;
                }
            });
        }
        *chain = before;
    }
}

/// Files (by content) whose whole copy is being built, and a wake-up for
/// each that ends.
#[derive(Default)]
pub(super) struct Building {
    set: Mutex<std::collections::HashSet<Hash>>,
    ended: std::sync::Condvar,
}

/// A whole copy of a chunked file, built in the disk cache for later opens
/// of the file to be passed through to the kernel (reads at the local
/// disk's speed, no daemon in the way): the "reassembled file kept for hot
/// large files" of issue #19.
///
/// While a handle reads the file in order, the copy only notes which
/// chunks were read: building it during the reads cost the first read a
/// tenth of its time on two cores (one more write of every byte and a
/// hash of them, beside the download, the checks and the reader's copies).
/// When the handle closes having read at least half of the chunks, the
/// copy is built from the disk cache (where the reads left the chunks):
/// each chunk stored as its bytes is copied in the kernel
/// (`copy_file_range`), any other is loaded (decoded and verified, or
/// fetched again if evicted) and written. The file is then hashed whole and
/// kept as the cache entry named by the manifest's content hash only if
/// that hash matches (a manifest whose chunks do not make its content is
/// not trusted to name a cache entry), then counted and evicted like any
/// entry. A handle that read less drops the file (a reader that stopped
/// early or went elsewhere; see [`SnapshotFs::close_chunked`]). Its cost:
/// one copy and one hash of the file's bytes after it is first read, and
/// the file's size again in the cache.
pub(super) struct Assembly {
    cache: Arc<crate::cache::DiskCache>,
    content: Hash,
    size: u64,
    path: std::path::PathBuf,
    file: std::fs::File,
    /// Chunks the handle's reads covered (not those only read ahead).
    seen: Mutex<Vec<bool>>,
    kept: std::sync::atomic::AtomicBool,
    assembling: Arc<Building>,
    assembled: Arc<AtomicU64>,
}

impl Assembly {
    fn new(
        cache: Arc<crate::cache::DiskCache>,
        content: Hash,
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
            content,
            size: manifest.size,
            path,
            file,
            seen: Mutex::new(vec![false; manifest.chunks.len()]),
            kept: Default::default(),
            assembling,
            assembled,
        })
    }

    /// Chunks `range` were read.
    fn seen(&self, range: std::ops::RangeInclusive<usize>) {
        let mut seen = self.seen.lock().expect("assembly lock");
        for i in range {
            if let Some(s) = seen.get_mut(i) {
                *s = true;
            }
        }
    }

    /// Writes a chunk's bytes (verified) at `at`.
    fn write(&self, at: u64, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(bytes, at)
            .inspect_err(|e| tracing::debug!("whole copy of a large file: writing at {at}: {e}"))
    }

    /// Every chunk is in the file: hash it whole and keep it if it is the
    /// content the manifest names. `false` when its bytes are not that
    /// content (not when the hash could not be read or the copy not kept).
    fn finish(&self) -> bool {
        // A test changes the file here, as a stray writer into the cache's
        // build folder would: the hash, not the chunks' checks, decides.
        crate::failpoint::pause("assembly-before-hash");
        match crate::fsutil::hash_regular(&self.path) {
            Ok(h) if h == self.content && self.file.metadata().is_ok_and(|m| m.len() == self.size) => {
                if self.cache.adopt(&self.content, &self.path).is_ok() {
                    // Hashed just now: later opens may pass through to it.
                    self.cache.trust_whole(&self.content, &self.file);
                    self.kept.store(true, Relaxed);
                    self.assembled.fetch_add(1, Relaxed);
                }
                true
            }
            Ok(h) => {
                tracing::warn!(
                    "a large file's chunks make {h}, not the content {} its manifest names; not kept",
                    self.content
                );
                false
            }
            Err(e) => {
                tracing::debug!("whole copy of a large file: hashing {}: {e}", self.path.display());
                true
            }
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
