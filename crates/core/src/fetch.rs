//! The fetcher: every read of committed content goes through here.
//!
//! 1. A verified disk-cache hit costs no network.
//! 2. An object covered by an attached pack index is read through its
//!    pack: the first request starts one ranged GET of the pack body, and
//!    the members are exploded into the cache as the bytes stream in. Every
//!    waiter is woken as soon as *its* member has arrived and verified, not
//!    when the whole pack has. Concurrent requests for members of one pack
//!    share that GET; across processes, an flock on the pack makes the
//!    second process wait for the first and then read the cache.
//! 3. Anything else is fetched alone (many in flight), and concurrent
//!    requests for one id collapse into one GET.
//!
//! A pack that is missing, truncated or holds a bad member produces a
//! warning naming it, and the reads fall back to per-object fetches;
//! nothing unverified enters the cache. Every wait is woken by an event
//! (a future completing, a watch channel changing, a lock being released),
//! never by a timer.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::cache::DiskCache;
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{ChunkManifest, Entry, Kind, Snapshot, Tree};
use crate::pack::{decode_member, PackEntry, PackIndex};
use crate::store::{Remote, Space, CONCURRENCY};

type Flight = Shared<BoxFuture<'static, Result<Bytes, Arc<Error>>>>;

/// A batch of exploded members goes to the disk cache once it holds this
/// many bytes or members (or the pack ends).
const WRITE_BATCH_BYTES: usize = 1 << 20;
const WRITE_BATCH_MEMBERS: usize = 256;

/// How the index of an attached tree was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Discovery {
    /// The local pointer (a copy of the index in the disk cache).
    LocalPointer,
    /// The derived pointer in the store (`packs/index/<tree id>`).
    DerivedPointer,
}

/// The result of looking for a tree's pack index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Attach {
    Attached {
        mode: String,
        version: u8,
        dirs: u64,
        packs: usize,
        members: usize,
        via: Discovery,
    },
    /// No index was ever built for this tree.
    NoIndex,
    /// The index found names another tree.
    OtherTree {
        found: String,
    },
    /// The index does not decode.
    Undecodable {
        detail: String,
    },
    /// The index is there but its packs were deleted (`mado gc`).
    Swept {
        missing: usize,
        packs: usize,
    },
}

#[derive(Default, Debug)]
pub struct FetchCounters {
    pub packs_exploded: AtomicU64,
    pub members_from_packs: AtomicU64,
    /// Members handed to a waiter before their pack finished arriving.
    pub members_early: AtomicU64,
    pub pack_failures: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct FetchStats {
    pub packs_exploded: u64,
    pub members_from_packs: u64,
    pub members_early: u64,
    pub pack_failures: u64,
}

#[derive(Default)]
struct PackSet {
    /// Member id -> (pack, index of the member in it).
    members: HashMap<Hash, (Arc<PackEntry>, usize)>,
    trees: HashMap<Hash, Arc<Vec<u8>>>,
}

/// One pack being downloaded. Each waiter parks on its own member: the
/// arrival of member `i` wakes only the readers of member `i` (a shared
/// broadcast would wake every reader on every member, O(n²) for a pack).
#[derive(Default)]
struct PackFlight {
    state: Mutex<FlightState>,
}

#[derive(Default)]
struct FlightState {
    finished: bool,
    data: HashMap<usize, Bytes>,
    waiters: HashMap<usize, Vec<tokio::sync::oneshot::Sender<()>>>,
}

impl PackFlight {
    fn arrived(&self, i: usize, b: Option<Bytes>) {
        let mut s = self.state.lock().expect("flight lock");
        if let Some(b) = b {
            s.data.insert(i, b);
        }
        for w in s.waiters.remove(&i).unwrap_or_default() {
            let _ = w.send(());
        }
    }

    fn finish(&self) {
        let mut s = self.state.lock().expect("flight lock");
        s.finished = true;
        for (_, ws) in s.waiters.drain() {
            for w in ws {
                let _ = w.send(());
            }
        }
    }
}

pub struct Fetcher {
    pub remote: Arc<Remote>,
    pub cache: Arc<DiskCache>,
    inflight: Mutex<HashMap<(Space, Hash), Flight>>,
    packs: RwLock<PackSet>,
    pack_flights: Mutex<HashMap<Hash, Arc<PackFlight>>>,
    bad_packs: Mutex<HashSet<Hash>>,
    /// Pack downloads in progress (their cache writes may outlive the
    /// reads they served): awaited by [`Fetcher::drain`].
    pack_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Bounds concurrent cache-write batches from pack explodes: unbounded,
    /// dozens of packs writing at once thrash the disk.
    write_permits: Arc<tokio::sync::Semaphore>,
    warnings: Mutex<Vec<String>>,
    /// What the current walk will read (see [`Fetcher::want`]).
    wanted: RwLock<Option<Arc<HashSet<Hash>>>>,
    pub counters: FetchCounters,
}

/// A pack whose wanted members span less than this share of its body is
/// fetched in that span only.
const PARTIAL_PACK_SHARE: f64 = 0.5;

/// Re-creates an error shared between waiters of one flight.
fn unshare(e: Arc<Error>) -> Error {
    match Arc::try_unwrap(e) {
        Ok(e) => e,
        Err(e) => match &*e {
            Error::ObjectMissing { id, what, path } => Error::ObjectMissing { id: *id, what, path: path.clone() },
            Error::Corrupt { id, what, path, detail } => {
                Error::Corrupt { id: *id, what, path: path.clone(), detail: detail.clone() }
            }
            other => Error::Io { context: other.to_string(), source: std::io::Error::other("shared fetch failed") },
        },
    }
}

impl Fetcher {
    pub fn new(remote: Arc<Remote>, cache: Arc<DiskCache>) -> Arc<Fetcher> {
        Arc::new(Fetcher {
            remote,
            cache,
            inflight: Mutex::new(HashMap::new()),
            packs: RwLock::new(PackSet::default()),
            pack_flights: Mutex::new(HashMap::new()),
            bad_packs: Mutex::new(HashSet::new()),
            pack_tasks: Mutex::new(Vec::new()),
            write_permits: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            )),
            warnings: Mutex::new(Vec::new()),
            wanted: RwLock::new(None),
            counters: FetchCounters::default(),
        })
    }

    /// Declares the objects a walk is about to read (`None`: no hint). A
    /// pack started meanwhile is fetched only over the span of its members
    /// that are wanted when that span is under half the pack, still in one
    /// ranged GET: members are in path order, so a subtree is one span, and
    /// a subtree walk does not pull the rest of a whole-tree (v2) pack.
    pub fn want(&self, ids: Option<HashSet<Hash>>) {
        *self.wanted.write().expect("wanted lock") = ids.map(Arc::new);
    }

    /// The member span of `pack` to fetch: all of it, or the wanted span.
    fn span(&self, pack: &PackEntry) -> (usize, usize) {
        let all = (0, pack.members.len().saturating_sub(1));
        let Some(w) = self.wanted.read().expect("wanted lock").clone() else { return all };
        let mut idx = pack.members.iter().enumerate().filter(|(_, m)| w.contains(&m.id)).map(|(i, _)| i);
        let Some(lo) = idx.next() else { return all };
        let hi = idx.next_back().unwrap_or(lo);
        let (a, b) = (&pack.members[lo], &pack.members[hi]);
        let span = (b.offset + b.stored_len - a.offset) as f64;
        if span < PARTIAL_PACK_SHARE * (pack.size - pack.header_len) as f64 {
            (lo, hi)
        } else {
            all
        }
    }

    pub fn stats(&self) -> FetchStats {
        let c = &self.counters;
        FetchStats {
            packs_exploded: c.packs_exploded.load(Relaxed),
            members_from_packs: c.members_from_packs.load(Relaxed),
            members_early: c.members_early.load(Relaxed),
            pack_failures: c.pack_failures.load(Relaxed),
        }
    }

    /// Waits until every pack download started so far has finished writing
    /// its members to the cache (call before the process exits).
    pub async fn drain(&self) {
        loop {
            let tasks = std::mem::take(&mut *self.pack_tasks.lock().expect("pack tasks lock"));
            if tasks.is_empty() {
                return;
            }
            for t in tasks {
                let _ = t.await;
            }
        }
    }

    /// Warnings gathered so far (each names a pack), drained.
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.lock().expect("warnings lock"))
    }

    fn warn(&self, w: String) {
        self.warnings.lock().expect("warnings lock").push(w);
    }

    /// The local pointer: where a copy of `tree`'s index is kept.
    pub fn local_pointer(&self, tree: &Hash) -> PathBuf {
        self.cache.index_path(tree)
    }

    /// HEADs every attached pack (one round trip); those missing are marked
    /// bad, so reads go per object without trying them. Returns (missing, total).
    pub async fn check_packs(&self) -> Result<(usize, usize)> {
        let packs: Vec<Hash> = {
            let set = self.packs.read().expect("packs lock");
            let mut v: Vec<Hash> = set.members.values().map(|(p, _)| p.id).collect();
            v.sort();
            v.dedup();
            v
        };
        let heads = packs.iter().map(|id| async move {
            let present = self.remote.has_pack(id).await?;
            Ok::<_, Error>((!present).then_some(*id))
        });
        let mut missing = 0;
        for r in futures::future::join_all(heads).await {
            if let Some(id) = r? {
                missing += 1;
                self.bad_packs.lock().expect("bad packs lock").insert(id);
            }
        }
        Ok((missing, packs.len()))
    }

    /// A tree that came inline with an attached index, if any.
    pub fn inline_tree(&self, id: &Hash) -> Option<Arc<Vec<u8>>> {
        self.packs.read().expect("packs lock").trees.get(id).cloned()
    }

    /// Finds and attaches the pack index of `tree`: the local pointer
    /// first, else the derived pointer in the store (one GET), which is
    /// then kept as the local pointer.
    pub async fn attach(&self, tree: Hash) -> Result<Attach> {
        Ok(match self.locate(tree).await? {
            Ok((idx, via)) => self.install(idx, via),
            Err(reason) => reason,
        })
    }

    /// Finds the index of `tree` without attaching it (the local pointer,
    /// else the derived one); `Err` holds why there is none.
    pub async fn locate(&self, tree: Hash) -> Result<std::result::Result<(PackIndex, Discovery), Attach>> {
        let local = self.local_pointer(&tree);
        if let Ok(bytes) = std::fs::read(&local) {
            if let Ok(idx) = PackIndex::decode(&bytes) {
                if idx.tree == tree {
                    return Ok(Ok((idx, Discovery::LocalPointer)));
                }
            }
            // A bad local copy: drop it and ask the store.
            let _ = std::fs::remove_file(&local);
        }
        let Some(bytes) = self.remote.get_index(&tree).await? else {
            return Ok(Err(Attach::NoIndex));
        };
        let idx = match PackIndex::decode(&bytes) {
            Ok(i) => i,
            Err(e) => return Ok(Err(Attach::Undecodable { detail: e.to_string() })),
        };
        if idx.tree != tree {
            return Ok(Err(Attach::OtherTree { found: idx.tree.to_hex() }));
        }
        crate::fsutil::save_cache_file(&local, &bytes);
        Ok(Ok((idx, Discovery::DerivedPointer)))
    }

    fn install(&self, idx: PackIndex, via: Discovery) -> Attach {
        let mut set = self.packs.write().expect("packs lock");
        let status = Attach::Attached {
            mode: idx.mode.label().to_string(),
            version: crate::pack::PACK_VERSION,
            dirs: idx.dirs,
            packs: idx.packs.len(),
            members: idx.member_count(),
            via,
        };
        for p in idx.packs {
            let p = Arc::new(p);
            for (i, m) in p.members.iter().enumerate() {
                set.members.entry(m.id).or_insert_with(|| (p.clone(), i));
            }
        }
        for (id, t) in idx.trees {
            set.trees.insert(id, Arc::new(t));
        }
        status
    }

    /// The bytes of object `id`, from the cache, a pack, or the remote.
    pub async fn get(self: &Arc<Self>, space: Space, id: Hash, what: &'static str) -> Result<Bytes> {
        if let Some(b) = self.cache.get(&id) {
            return Ok(Bytes::from(b));
        }
        if space == Space::Objects {
            let hit = self.packs.read().expect("packs lock").members.get(&id).cloned();
            if let Some((pack, i)) = hit {
                if let Some(b) = self.from_pack(pack, i).await {
                    return Ok(b);
                }
            }
        }
        self.get_alone(space, id, what).await
    }

    async fn get_alone(self: &Arc<Self>, space: Space, id: Hash, what: &'static str) -> Result<Bytes> {
        let flight = {
            let mut map = self.inflight.lock().expect("inflight lock");
            map.entry((space, id))
                .or_insert_with(|| {
                    let me = self.clone();
                    async move {
                        let r = me.remote.get_object(space, &id, what).await;
                        if let Ok(b) = &r {
                            // A failed cache write costs only a later re-fetch.
                            let _ = me.cache.put(&id, b);
                        }
                        me.inflight.lock().expect("inflight lock").remove(&(space, id));
                        r.map_err(Arc::new)
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        flight.await.map_err(unshare)
    }

    /// Member `i` of `pack`, through the pack's shared flight; `None` if the
    /// pack failed for it (the caller falls back to a plain GET).
    async fn from_pack(self: &Arc<Self>, pack: Arc<PackEntry>, i: usize) -> Option<Bytes> {
        if self.bad_packs.lock().expect("bad packs lock").contains(&pack.id) {
            return None;
        }
        let running = self.pack_flights.lock().expect("pack flights lock").contains_key(&pack.id);
        if !running && self.mostly_cached(&pack) {
            // A warm pack missing a few members (evicted, healed): read just
            // this member's byte range rather than the whole pack.
            return self.fetch_member(&pack, i).await;
        }
        let flight = {
            let mut map = self.pack_flights.lock().expect("pack flights lock");
            map.entry(pack.id)
                .or_insert_with(|| {
                    let f = Arc::new(PackFlight::default());
                    let me = self.clone();
                    let (pack, f2) = (pack.clone(), f.clone());
                    let task = tokio::spawn(async move { me.run_pack(pack, f2).await });
                    self.pack_tasks.lock().expect("pack tasks lock").push(task);
                    f
                })
                .clone()
        };
        let parked = {
            let mut s = flight.state.lock().expect("flight lock");
            if s.data.contains_key(&i) || s.finished {
                None
            } else {
                let (tx, rx) = tokio::sync::oneshot::channel();
                s.waiters.entry(i).or_default().push(tx);
                Some(rx)
            }
        };
        if let Some(rx) = parked {
            let _ = rx.await;
        }
        let (got, finished) = {
            let s = flight.state.lock().expect("flight lock");
            (s.data.get(&i).cloned(), s.finished)
        };
        match got {
            Some(b) => {
                self.counters.members_from_packs.fetch_add(1, Relaxed);
                if !finished {
                    self.counters.members_early.fetch_add(1, Relaxed);
                }
                Some(b)
            }
            // Another process exploded the pack into the cache.
            None => self.cache.get(&pack.members[i].id).map(Bytes::from),
        }
    }

    /// True when at least half the pack's members are in the cache.
    fn mostly_cached(&self, pack: &PackEntry) -> bool {
        let have = pack.members.iter().filter(|m| self.cache.contains(&m.id)).count();
        have * 2 >= pack.members.len() && !pack.members.is_empty()
    }

    /// One member by its own byte range; `None` on any failure.
    async fn fetch_member(&self, pack: &PackEntry, i: usize) -> Option<Bytes> {
        let m = &pack.members[i];
        let got = self.remote.pack_range(&pack.id, m.offset..m.offset + m.stored_len).await.map_err(|e| e.to_string());
        match got.and_then(|b| decode_member(m, &b)) {
            Ok(raw) => {
                let _ = self.cache.put(&m.id, &raw);
                self.counters.members_from_packs.fetch_add(1, Relaxed);
                Some(Bytes::from(raw))
            }
            Err(e) => {
                self.warn(format!("pack {}: member {}: {e}; reading it alone", pack.id, m.id));
                None
            }
        }
    }

    /// Downloads and explodes one pack (one ranged GET of its body).
    async fn run_pack(self: Arc<Self>, pack: Arc<PackEntry>, flight: Arc<PackFlight>) {
        let finish = |flight: &PackFlight| flight.finish();
        // One process at a time per pack; the loser then finds the cache full.
        let lock_path = self.cache.pack_lock_path(&pack.id);
        // Without the lock (an unwritable cache) we may fetch twice: still correct.
        let _lock = crate::fsutil::lock_file(lock_path).await.ok();
        let (lo, hi) = self.span(&pack);
        if pack.members.is_empty() || pack.members[lo..=hi].iter().all(|m| self.cache.contains(&m.id)) {
            finish(&flight);
            self.pack_flights.lock().expect("pack flights lock").remove(&pack.id);
            return;
        }
        if let Err(e) = self.stream_pack(&pack, &flight, lo, hi).await {
            self.counters.pack_failures.fetch_add(1, Relaxed);
            self.bad_packs.lock().expect("bad packs lock").insert(pack.id);
            self.warn(format!("pack {}: {e}; reading its objects one by one", pack.id));
        } else {
            self.counters.packs_exploded.fetch_add(1, Relaxed);
        }
        finish(&flight);
        self.pack_flights.lock().expect("pack flights lock").remove(&pack.id);
    }

    /// Streams members `lo..=hi` of `pack` (one ranged GET) into the cache.
    async fn stream_pack(
        &self,
        pack: &PackEntry,
        flight: &PackFlight,
        lo: usize,
        hi: usize,
    ) -> std::result::Result<(), String> {
        let (first, last) = (&pack.members[lo], &pack.members[hi]);
        let (base, end) = (first.offset, last.offset + last.stored_len);
        let mut stream = self.remote.pack_stream(&pack.id, base..end).await.map_err(|e| match e {
            Error::NotFound(_) => "missing from the store (swept?)".to_string(),
            e => format!("GET failed: {e}"),
        })?;
        let mut buf: Vec<u8> = Vec::new();
        let mut next = lo;
        let stop = hi + 1;
        let mut bad = 0usize;
        // Cache writes run on the blocking pool, off this task: waiters are
        // handed their member from memory the moment it has verified.
        let mut writes = Vec::new();
        let mut batch: Vec<(Hash, Bytes)> = Vec::new();
        let mut batch_bytes = 0usize;
        while next < stop {
            let chunk = match stream.next().await {
                Some(Ok(c)) => c,
                Some(Err(e)) => return Err(format!("read failed after {} bytes: {e}", buf.len())),
                None => return Err(format!("truncated: {} of {} body bytes", buf.len(), end - base)),
            };
            buf.extend_from_slice(&chunk);
            while next < stop {
                let m = &pack.members[next];
                let (start, end) = ((m.offset - base) as usize, (m.offset - base + m.stored_len) as usize);
                if end > buf.len() {
                    break;
                }
                match decode_member(m, &buf[start..end]) {
                    Ok(raw) => {
                        let b = Bytes::from(raw);
                        flight.arrived(next, Some(b.clone()));
                        batch_bytes += b.len();
                        batch.push((m.id, b));
                    }
                    Err(e) => {
                        bad += 1;
                        self.warn(format!("pack {}: member {} is bad ({e}); skipped", pack.id, m.id));
                        flight.arrived(next, None);
                    }
                }
                next += 1;
            }
            // Writes go in batches (the store streams in small chunks; a
            // blocking task per chunk costs more than the writes).
            let last = next == stop;
            if !batch.is_empty() && (last || batch_bytes >= WRITE_BATCH_BYTES || batch.len() >= WRITE_BATCH_MEMBERS) {
                let batch = std::mem::take(&mut batch);
                batch_bytes = 0;
                let cache = self.cache.clone();
                // Readers were already handed their members; waiting here
                // only slows the download, never a reader.
                let permit = self.write_permits.clone().acquire_owned().await.ok();
                writes.push(tokio::task::spawn_blocking(move || {
                    for (id, b) in batch {
                        let _ = cache.put(&id, &b);
                    }
                    drop(permit);
                }));
            }
            // Let the readers just woken run now: a task woken from this
            // worker waits in its LIFO slot until this task yields.
            tokio::task::yield_now().await;
        }
        // The pack's flock is held until every member is in the cache.
        for w in writes {
            let _ = w.await;
        }
        if bad > 0 {
            return Err(format!("{bad} bad members"));
        }
        Ok(())
    }

    pub async fn tree(self: &Arc<Self>, id: Hash, path: &str) -> Result<Tree> {
        let inline = self.packs.read().expect("packs lock").trees.get(&id).cloned();
        let b = match inline {
            Some(t) => Bytes::from((*t).clone()),
            None => self.get(Space::Objects, id, "tree").await.map_err(|e| e.at_path(path))?,
        };
        Tree::decode(&b).map_err(|e| Error::corrupt(id, "tree", path, e))
    }

    pub async fn snapshot(self: &Arc<Self>, id: Hash) -> Result<Snapshot> {
        let b = self.get(Space::Snapshots, id, "snapshot").await?;
        Snapshot::decode(&b).map_err(|e| Error::corrupt(id, "snapshot", "", e))
    }

    /// The chunk manifest of a chunked entry.
    pub async fn manifest(self: &Arc<Self>, e: &Entry, path: &str) -> Result<ChunkManifest> {
        let mb = self.get(Space::Objects, e.id, "chunk manifest").await.map_err(|er| er.at_path(path))?;
        let m = ChunkManifest::decode(&mb).map_err(|er| Error::corrupt(e.id, "chunk manifest", path, er))?;
        if m.size != e.size {
            return Err(Error::Corrupt {
                id: e.id,
                what: "chunk manifest",
                path: path.to_string(),
                detail: format!("manifest size {} != tree size {}", m.size, e.size),
            });
        }
        Ok(m)
    }

    /// The whole content of a file or symlink entry, reassembling chunks
    /// (fetched concurrently) when the entry is chunked.
    pub async fn content(self: &Arc<Self>, e: &Entry, path: &str) -> Result<Bytes> {
        if !e.kind.has_content() {
            return Err(Error::User(format!("{path} is a {}, not a file", e.kind.label())));
        }
        if !e.chunked {
            let b = self.get(Space::Objects, e.id, "blob").await.map_err(|er| er.at_path(path))?;
            if b.len() as u64 != e.size {
                return Err(Error::Corrupt {
                    id: e.id,
                    what: "blob",
                    path: path.to_string(),
                    detail: format!("{} bytes, tree says {}", b.len(), e.size),
                });
            }
            return Ok(b);
        }
        let m = self.manifest(e, path).await?;
        // Owned ids and path: futures that borrow across a stream trip up
        // the compiler's Send checks when spawned.
        let ids: Vec<Hash> = m.chunks.iter().map(|(_, id)| *id).collect();
        let parts: Vec<Bytes> = futures::stream::iter(ids.into_iter().map(|id| {
            let me = self.clone();
            let path = path.to_string();
            async move { me.get(Space::Objects, id, "chunk").await.map_err(|er| er.at_path(&path)) }
        }))
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
        let mut out = Vec::with_capacity(m.size as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        if !m.content.verifies(&out) {
            return Err(Error::Corrupt {
                id: e.id,
                what: "chunk manifest",
                path: path.to_string(),
                detail: "reassembled content does not match the manifest's content hash".into(),
            });
        }
        Ok(Bytes::from(out))
    }

    /// Resolves a `/`-separated path below `root` to its entry
    /// (`None` for the root itself).
    pub async fn lookup(self: &Arc<Self>, root: Hash, path: &str) -> Result<Option<Entry>> {
        let mut tree_id = root;
        let mut found: Option<Entry> = None;
        let mut walked = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if let Some(e) = &found {
                if e.kind != Kind::Directory {
                    return Err(Error::NotFound(format!("{walked} is a {}, not a directory", e.kind.label())));
                }
                tree_id = e.id;
            }
            let t = self.tree(tree_id, &walked).await?;
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(part);
            found = Some(
                t.get(part.as_bytes()).cloned().ok_or_else(|| Error::NotFound(format!("no such path: {walked}")))?,
            );
        }
        Ok(found)
    }
}
