//! The fetcher: every read of committed content goes through here.
//!
//! 1. A verified disk-cache hit costs no network.
//! 2. An object covered by an attached pack index is read through its
//!    pack: the first request starts one ranged GET of the pack body, and
//!    the members are exploded into the cache as the bytes stream in. Every
//!    waiter is woken as soon as *its* member has arrived and verified, not
//!    when the whole pack has. Concurrent requests for members of one pack
//!    share that GET; across processes, the pack's lock (`cache::locks`) makes the
//!    second process wait for the first and then read the cache.
//! 3. Anything else is fetched alone (many in flight), and concurrent
//!    requests for one id collapse into one GET.
//!
//! A pack that is missing, truncated or holds a bad member produces a
//! warning naming it, and the reads fall back to per-object fetches;
//! nothing unverified enters the cache. Every wait is woken by an event
//! (a future completing, a watch channel changing, a lock being released),
//! never by a timer.
//!
//! Parts: this file (single-flight gets, counters, warnings), `attach`
//! (index discovery), `packs` (pack streaming), `typed` (typed readers).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use serde::{Deserialize, Serialize};

use crate::cache::DiskCache;
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::store::{Remote, Space};

mod attach;
mod packs;
mod stream;
mod typed;

use attach::PackSet;
pub use attach::{keep_flat, load_flat_layers, load_index, load_index_layers, Attach, Discovery};
use packs::PackFlight;
pub use packs::Sink;
pub use typed::{merge_stat_chain, piece_budget, Piece, CHUNK_WINDOW, PIECE_BYTES_IN_MEMORY};

type Flight = Shared<BoxFuture<'static, Result<Bytes, Arc<Error>>>>;

#[derive(Default, Debug)]
pub struct FetchCounters {
    pub packs_exploded: AtomicU64,
    pub members_from_packs: AtomicU64,
    /// Members handed to a waiter before their pack finished arriving.
    pub members_early: AtomicU64,
    pub pack_failures: AtomicU64,
    /// Packs the store no longer has (a GET of one found nothing: swept by
    /// a gc while an index still named them).
    pub packs_missing: AtomicU64,
    /// Pack spans fetched as two ranged GETs (a first reader far into one).
    pub split_fetches: AtomicU64,
    /// Members handed straight from a pack's stream to one consumer
    /// ([`Fetcher::stream_members`], a cold checkout).
    pub members_streamed: AtomicU64,
    /// Pack flights started by a listing, before any read ([`Fetcher::warm`]).
    pub warmed_packs: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct FetchStats {
    pub packs_exploded: u64,
    pub members_from_packs: u64,
    pub members_early: u64,
    pub pack_failures: u64,
    #[serde(default)]
    pub packs_missing: u64,
    pub split_fetches: u64,
    pub members_streamed: u64,
    #[serde(default)]
    pub warmed_packs: u64,
}

pub struct Fetcher {
    pub remote: Arc<Remote>,
    pub cache: Arc<DiskCache>,
    inflight: Mutex<HashMap<(Space, Hash), Flight>>,
    packs: RwLock<PackSet>,
    pack_flights: Mutex<HashMap<Hash, Arc<PackFlight>>>,
    /// Per pack, the members a split flight left out (see `run_pack`):
    /// the next reader of one starts a flight over all of them.
    split_rest: Mutex<HashMap<Hash, (usize, usize)>>,
    bad_packs: Mutex<HashSet<Hash>>,
    /// Pack downloads in progress (their cache writes may outlive the
    /// reads they served): awaited by [`Fetcher::drain`].
    pack_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Bounds concurrent cache-write batches from pack explodes: unbounded,
    /// dozens of packs writing at once thrash the disk.
    write_permits: Arc<tokio::sync::Semaphore>,
    /// Large-file pieces held in memory (see [`typed::PIECE_BYTES_IN_MEMORY`]).
    piece_permits: Arc<tokio::sync::Semaphore>,
    /// Run packs being downloaded at once (see [`packs::RUN_FLIGHTS`]).
    run_flights: Arc<tokio::sync::Semaphore>,
    warnings: Mutex<Vec<String>>,
    /// Pack indexes that could not be attached for a reason other than
    /// their absence (undecodable, of another tree, a layer or pack
    /// missing): (tree, why). A tree then missing from the store is named
    /// as that index's fault: trees travel inline in indexes.
    index_failures: Mutex<Vec<(Hash, String)>>,
    /// What the current walk will read (see [`Fetcher::want`]).
    wanted: RwLock<Option<Arc<HashSet<Hash>>>>,
    pub counters: FetchCounters,
}

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
            split_rest: Mutex::new(HashMap::new()),
            bad_packs: Mutex::new(HashSet::new()),
            pack_tasks: Mutex::new(Vec::new()),
            write_permits: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            )),
            piece_permits: Arc::new(tokio::sync::Semaphore::new(typed::PIECE_PERMITS)),
            run_flights: Arc::new(tokio::sync::Semaphore::new(packs::RUN_FLIGHTS)),
            warnings: Mutex::new(Vec::new()),
            index_failures: Mutex::new(Vec::new()),
            wanted: RwLock::new(None),
            counters: FetchCounters::default(),
        })
    }

    /// Declares the objects a walk is about to read (`None`: no hint). A
    /// pack started meanwhile is fetched only over the span of its members
    /// that are wanted when that span is under half the pack, still in one
    /// ranged GET: members are in path order, so a subtree is one span, and
    /// a subtree walk does not pull the rest of a whole-tree (v2) pack.
    /// The packs holding wanted members start downloading at once.
    pub fn want(self: &Arc<Self>, ids: Option<HashSet<Hash>>) {
        let ids = ids.map(Arc::new);
        *self.wanted.write().expect("wanted lock") = ids.clone();
        if let Some(ids) = ids {
            self.prefetch(&ids);
        }
    }

    pub fn stats(&self) -> FetchStats {
        let c = &self.counters;
        FetchStats {
            packs_exploded: c.packs_exploded.load(Relaxed),
            members_from_packs: c.members_from_packs.load(Relaxed),
            members_early: c.members_early.load(Relaxed),
            pack_failures: c.pack_failures.load(Relaxed),
            packs_missing: c.packs_missing.load(Relaxed),
            split_fetches: c.split_fetches.load(Relaxed),
            members_streamed: c.members_streamed.load(Relaxed),
            warmed_packs: c.warmed_packs.load(Relaxed),
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

    /// The bytes of object `id`, from the cache, a pack, or the remote.
    pub async fn get(self: &Arc<Self>, space: Space, id: Hash, what: &'static str) -> Result<Bytes> {
        self.get_as(space, id, what, false).await
    }

    /// [`Fetcher::get`] for a reader that goes on to the objects after this
    /// one in their pack (a large file's chunks, read from start to end):
    /// a pack download it starts runs from this member to the pack's end,
    /// where a random reader's would bring this chunk alone.
    pub async fn get_in_order(self: &Arc<Self>, id: Hash, what: &'static str) -> Result<Bytes> {
        self.get_as(Space::Objects, id, what, true).await
    }

    async fn get_as(self: &Arc<Self>, space: Space, id: Hash, what: &'static str, in_order: bool) -> Result<Bytes> {
        let hit = match space {
            Space::Objects => self.packs.read().expect("packs lock").member(&id),
            _ => None,
        };
        if let Some((pack, _)) = &hit {
            if let Some(b) = self.cache.pack_get(&pack.id, &id) {
                return Ok(Bytes::from(b));
            }
        }
        if let Some(b) = self.cache.get(&id) {
            return Ok(Bytes::from(b));
        }
        if let Some((pack, i)) = hit {
            if let Some(b) = self.from_pack(pack, i, in_order).await {
                return Ok(b);
            }
        }
        self.get_alone(space, id, what).await
    }

    /// Object `id` if the disk cache holds it, loose or in a cached pack
    /// this fetcher's indexes name (no network).
    pub fn cached(&self, id: &Hash) -> Option<Vec<u8>> {
        self.pack_of(id).and_then(|pack| self.cache.pack_get(&pack, id)).or_else(|| self.cache.get(id))
    }

    /// Whether the disk cache lists object `id` (loose, or in a cached pack
    /// this fetcher's indexes name), without reading or verifying it.
    pub fn is_cached(&self, id: &Hash) -> bool {
        self.pack_of(id).is_some_and(|pack| self.cache.pack_has(&pack, id)) || self.cache.contains(id)
    }

    /// Copies object `id` (`len` bytes) from the disk cache into `to` at
    /// `at` without reading it through this process where the kernel can
    /// (a raw member of a cached pack, or a loose entry). Not verified: the
    /// caller checks what it builds. `false` when it is not there as such.
    pub fn copy_cached(&self, id: &Hash, len: u64, to: &std::fs::File, at: u64) -> bool {
        self.pack_of(id).is_some_and(|pack| self.cache.pack_copy_raw(&pack, id, to, at))
            || self.cache.copy_loose(id, len, to, at)
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
                            // Off the async workers (a chunk is a few MiB),
                            // and done before the flight ends, so a next
                            // get finds it. A failed write costs only a
                            // later re-fetch.
                            let (cache, b) = (me.cache.clone(), b.clone());
                            let _ = tokio::task::spawn_blocking(move || cache.put(&id, &b)).await;
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
}
