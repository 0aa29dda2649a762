//! Reading through packs: one ranged GET per pack (or span of it), its
//! bytes kept in the cache as one file as they stream in, each waiter woken
//! when its own member has verified; a member read alone when its pack fails.

use super::Fetcher;
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::pack::{decode_member_owned, PackEntry};
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use futures::StreamExt;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

/// Fetched pack bytes are decoded, and go to the disk cache, in segments
/// of at least this many bytes while the decoders are busy.
pub(super) const DECODE_BATCH_BYTES: usize = 256 << 10;
/// Fetched bytes go to the cache file in writes of at least this many
/// bytes (or when the span ends).
const WRITE_BATCH_BYTES: usize = 1 << 20;
/// Segments being decoded at once, beyond which the download waits.
const DECODES_IN_FLIGHT: usize = 4;

/// A segment's members, decoded: (index, row, raw bytes or why not).
type Decoded = Vec<(usize, crate::pack::Member, std::result::Result<Bytes, String>)>;

/// What one try at reading a member through its pack's flight gave.
enum Attempt {
    Got(Bytes),
    /// The pack failed: read the object alone.
    Failed,
    /// The flight did not cover this member: start the next one, over
    /// the members every reader it left out waits for (if known).
    Outside(Option<(usize, usize)>),
}

/// One pack being downloaded. Each waiter parks on its own member: the
/// arrival of member `i` wakes only the readers of member `i` (a shared
/// broadcast would wake every reader on every member, O(n²) for a pack).
#[derive(Default)]
pub(super) struct PackFlight {
    pub(super) state: Mutex<FlightState>,
    /// Signalled when the flight's GET is on its way, or it ended.
    moved: std::sync::Condvar,
}

#[derive(Default)]
pub(super) struct FlightState {
    pub(super) finished: bool,
    /// The members this flight fetches (set before it starts).
    pub(super) covered: Option<(usize, usize)>,
    /// Set at the end: the first and last member readers waited for that
    /// the flight did not cover (the next flight's span).
    pub(super) left_out: Option<(usize, usize)>,
    pub(super) data: HashMap<usize, Bytes>,
    pub(super) waiters: HashMap<usize, Vec<tokio::sync::oneshot::Sender<()>>>,
    /// The GET was handed to the HTTP client.
    requested: bool,
}

impl PackFlight {
    /// Member `i` is here (`None`: it failed). Returns whether a reader
    /// was waiting for it.
    fn arrived(&self, i: usize, b: Option<Bytes>) -> bool {
        let mut s = self.state.lock().expect("flight lock");
        if let Some(b) = b {
            s.data.insert(i, b);
        }
        let waiters = s.waiters.remove(&i).unwrap_or_default();
        let woke = !waiters.is_empty();
        for w in waiters {
            let _ = w.send(());
        }
        woke
    }

    /// The members in `range` a reader waits for now.
    fn waited(&self, range: std::ops::Range<usize>) -> Vec<usize> {
        let s = self.state.lock().expect("flight lock");
        s.waiters.keys().copied().filter(|i| range.contains(i)).collect()
    }

    fn requested(&self) {
        self.state.lock().expect("flight lock").requested = true;
        self.moved.notify_all();
    }

    /// Waits, at most `limit`, until the GET is on its way or the flight
    /// ended. Blocks the thread: not for an async worker.
    fn wait_requested(&self, limit: std::time::Duration) {
        let s = self.state.lock().expect("flight lock");
        let _ = self.moved.wait_timeout_while(s, limit, |s| !s.requested && !s.finished).expect("flight lock");
    }

    fn finish(&self) {
        let mut s = self.state.lock().expect("flight lock");
        s.finished = true;
        let covered = s.covered;
        let outside = s.waiters.keys().copied().filter(|i| covered.is_none_or(|(lo, hi)| *i < lo || *i > hi));
        s.left_out = outside.fold(None, |acc, i| match acc {
            None => Some((i, i)),
            Some((lo, hi)) => Some((lo.min(i), hi.max(i))),
        });
        for (_, ws) in s.waiters.drain() {
            for w in ws {
                let _ = w.send(());
            }
        }
        drop(s);
        self.moved.notify_all();
    }
}

/// Who takes the members of a span as they arrive.
#[derive(Clone, Copy)]
enum Taker<'a> {
    /// A consumer of every member once, in pack order (a checkout):
    /// decoded in batches on blocking threads.
    Bulk,
    /// Readers, through their flight: each member decoded here as its
    /// bytes come in, the ones a reader waits for first.
    Readers(&'a PackFlight),
}

/// Where [`Fetcher::stream_members`] hands each member (its index in the
/// pack, its bytes or `None` if it failed): `Some(wait)` makes the download
/// wait for `wait` before it goes on.
pub type Sink<'a> = &'a mut (dyn FnMut(usize, Option<Bytes>) -> Option<BoxFuture<'static, ()>> + Send);

/// Where a pack's flight starts, and what it covers.
#[derive(Clone, Copy, Debug)]
pub(super) enum Start {
    /// The span of the pack this fetcher wants (a prefetch).
    Whole,
    /// A reader of member `i`: the span, from `i` on when `i` is far into
    /// it (see [`SPLIT_AHEAD_BYTES`]).
    Reader(usize),
    /// A walk of a directory whose first file is member `i` and whose
    /// subtree ends with member `j`: as `Reader(i)`, ending at `j`.
    Walk(usize, usize),
    /// A random reader of a large file's chunk `i`: that member alone.
    One(usize),
    /// A sequential reader of a large file from chunk `i`: from `i` to the
    /// end of the span.
    From(usize),
    /// Readers a flight left out: these members (all of them, in one
    /// ranged GET).
    Span(usize, usize),
}

/// A flight whose first reader's member starts this far into the span
/// starts there (see `run_pack`).
/// Below it, one GET from the span's start serves every reader, and the
/// first one's wait for the bytes ahead of it is short: 512 KiB is ~1 ms
/// through one connection at 600 MB/s, against a first file's budget of
/// 60 ms at RTT 50 ms of which the round trip and the store's time to its
/// first byte take ~57 (issue #12). At 4 MiB, a walk of a directory a
/// few MiB into its pack waited ~7 ms more for bytes it never read.
pub(super) const SPLIT_AHEAD_BYTES: u64 = 512 << 10;
/// How far before the first reader's member such a flight starts, so that
/// readers of the files just before it share the flight (a walk's first
/// read is its directory's first file, which needs none).
pub(super) const SPLIT_BACK_BYTES: u64 = 128 << 10;

/// Run packs (a large file's, [`crate::pack::is_run_pack`]) one fetcher
/// downloads at once. A flight keeps every member it brought until its
/// pack has arrived, and each large file being read starts one: without
/// a bound, a checkout of 12 files of 80 MiB held 12 packs of 16 MiB in
/// memory at once (a 477 MiB peak, over issue #19's 256 MiB). Four keep a
/// reader's 32-chunk window busy; the others wait for a permit before
/// their GET, and a flight never waits on its readers, so permits always
/// come back.
pub(super) const RUN_FLIGHTS: usize = 4;

/// Members of a pack the cache has no record of that
/// [`Fetcher::mostly_cached`] looks up, at most.
const MOSTLY_CACHED_SAMPLE: usize = 16;

/// A pack whose wanted members span less than this share of its body is
/// fetched in that span only.
pub(super) const PARTIAL_PACK_SHARE: f64 = 0.5;

impl Fetcher {
    /// The member span of `pack` to fetch: all of it, or the wanted span.
    fn span(&self, pack: &PackEntry) -> (usize, usize) {
        let all = (0, pack.members.len().saturating_sub(1));
        let Some(w) = self.wanted.read().expect("wanted lock").clone() else { return all };
        let mut idx = pack.members.iter().enumerate().filter(|(_, m)| w.contains(&m.id)).map(|(i, _)| i);
        let Some(lo) = idx.next() else { return all };
        let hi = idx.next_back().unwrap_or(lo);
        let r = pack.members_range(lo, hi);
        let span = (r.end - r.start) as f64;
        if span < PARTIAL_PACK_SHARE * (pack.size - pack.header_len) as f64 {
            (lo, hi)
        } else {
            all
        }
    }

    /// Member `i` of `pack`, through the pack's shared flight; `None` if the
    /// pack failed for it (the caller falls back to a plain GET). A reader
    /// that waited on a flight whose span left its member out starts the
    /// next flight, over every member that flight left readers waiting
    /// for: many random readers of one pack cost two flights, not one
    /// each. Each flight brings at least one member, so the tries are
    /// bounded by the pack's size; a reader never gives up on a pack that
    /// works (its members may be stored nowhere else).
    ///
    /// `in_order`: the reader goes on to the members after this one (a
    /// large file read from start to end), so a flight it starts runs to
    /// the end of the pack; otherwise a flight it starts for a chunk brings
    /// that chunk alone (a random read fetches only what it touches).
    pub(super) async fn from_pack(self: &Arc<Self>, pack: Arc<PackEntry>, i: usize, in_order: bool) -> Option<Bytes> {
        let chunk = pack.members[i].kind == crate::pack::MemberKind::Chunk;
        let mut hint: Option<(usize, usize)> = None;
        for attempt in 0..pack.members.len() + 2 {
            let start = match (hint, in_order, chunk) {
                (Some((lo, hi)), _, _) => Start::Span(lo.min(i), hi.max(i)),
                (None, true, _) => Start::From(i),
                (None, false, true) => Start::One(i),
                (None, false, false) => Start::Reader(i),
            };
            match self.from_pack_once(&pack, i, attempt > 0, start).await {
                Attempt::Got(b) => return Some(b),
                Attempt::Failed => return None,
                Attempt::Outside(left_out) => hint = left_out,
            }
        }
        None
    }

    /// Member `id` of `pack` (a pack of an index this fetcher need not have
    /// attached), from the cache or the pack's flight; `None` if the pack
    /// does not hold it or fetching failed. The caller (a delta build
    /// folding a pack in) goes on to the members after it: a chunk's
    /// flight runs to the pack's end, not one GET per chunk.
    pub async fn member_of(self: &Arc<Self>, pack: Arc<PackEntry>, id: &Hash) -> Option<Bytes> {
        let i = pack.members.iter().position(|m| m.id == *id)?;
        let in_order = pack.members[i].kind == crate::pack::MemberKind::Chunk;
        self.from_pack(pack, i, in_order).await
    }

    /// `retry`: a flight before this one left member `i` out, so the next
    /// flight covers the rest (not a GET per member).
    async fn from_pack_once(self: &Arc<Self>, pack: &Arc<PackEntry>, i: usize, retry: bool, start: Start) -> Attempt {
        if self.bad_packs.lock().expect("bad packs lock").contains(&pack.id) {
            return Attempt::Failed;
        }
        let running = self.pack_flights.lock().expect("pack flights lock").contains_key(&pack.id);
        if !running {
            // A flight may have ended since the caller missed the cache:
            // what it fetched is recorded before it ends.
            let id = &pack.members[i].id;
            if let Some(b) = self.cache.pack_get(&pack.id, id).or_else(|| self.cache.get(id)) {
                return Attempt::Got(Bytes::from(b));
            }
        }
        if !running && !retry && self.mostly_cached(pack) {
            // A warm pack missing a few members (evicted, healed): read just
            // this member's byte range rather than the whole pack.
            return self.fetch_member(pack, i).await.map_or(Attempt::Failed, Attempt::Got);
        }
        let flight = self.flight(pack, start);
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
        let (got, finished, covered, left_out) = {
            let s = flight.state.lock().expect("flight lock");
            (s.data.get(&i).cloned(), s.finished, s.covered, s.left_out)
        };
        if let Some(b) = got {
            self.counters.members_from_packs.fetch_add(1, Relaxed);
            if !finished {
                self.counters.members_early.fetch_add(1, Relaxed);
            }
            return Attempt::Got(b);
        }
        // Another process fetched the pack into the cache.
        let id = &pack.members[i].id;
        if let Some(b) = self.cache.pack_get(&pack.id, id).or_else(|| self.cache.get(id)) {
            return Attempt::Got(Bytes::from(b));
        }
        match covered {
            Some((lo, hi)) if i < lo || i > hi => Attempt::Outside(left_out),
            _ => Attempt::Failed,
        }
    }

    /// Ends `flight` of pack `id`: out of the map, then its waiters woken,
    /// under the map's lock. So a reader never finds a finished flight
    /// there (it would try it again and again, never parking, until its
    /// tries ran out), and a flight never removes a newer one.
    fn end_flight(&self, id: &Hash, flight: &Arc<PackFlight>) {
        let mut map = self.pack_flights.lock().expect("pack flights lock");
        if map.get(id).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            map.remove(id);
        }
        flight.finish();
    }

    /// The running flight of `pack`, started if there is none.
    fn flight(self: &Arc<Self>, pack: &Arc<PackEntry>, start: Start) -> Arc<PackFlight> {
        let mut map = self.pack_flights.lock().expect("pack flights lock");
        map.entry(pack.id)
            .or_insert_with(|| {
                let f = Arc::new(PackFlight::default());
                let me = self.clone();
                let (pack, f2) = (pack.clone(), f.clone());
                let task = tokio::spawn(async move { me.run_pack(pack, f2, start).await });
                self.pack_tasks.lock().expect("pack tasks lock").push(task);
                f
            })
            .clone()
    }

    /// Starts, all at once, the flight of every pack holding a member of
    /// `ids` that the cache lacks (unless mostly cached: those are read
    /// member by member). A walk over many packs then waits one round trip
    /// for all of them, not one per pack as its readers reach each.
    pub fn prefetch(self: &Arc<Self>, ids: &HashSet<Hash>) {
        let packs: Vec<Arc<PackEntry>> = {
            let set = self.packs.read().expect("packs lock");
            let mut seen = HashSet::new();
            ids.iter()
                .filter_map(|id| set.members.get(id))
                .filter(|(p, _)| seen.insert(p.id))
                .map(|(p, _)| p.clone())
                .collect()
        };
        for pack in packs {
            let bad = self.bad_packs.lock().expect("bad packs lock").contains(&pack.id);
            let wanted_missing = pack.members.iter().any(|m| ids.contains(&m.id) && !self.in_cache(&pack, m));
            if !bad && wanted_missing && !self.mostly_cached(&pack) {
                self.flight(&pack, Start::Whole);
            }
        }
    }

    /// Starts, without waiting for it, the flight a cold read of small file
    /// `id` would start (its pack's span, from near the member when it sits
    /// far into the pack), so that the read, when it comes, finds the bytes
    /// on their way. A mount calls it on a directory's first listing: a
    /// walk lists before it reads, and the listing's time then overlaps the
    /// round trip instead of coming before it. Nothing (false) when `id` is
    /// in no attached pack, is a chunk (a large file's packs come down only
    /// when read), is cached, or its pack failed or is mostly cached (a
    /// warm pack's misses are read member by member); nor while any pack is
    /// downloading: a flight holds its members in memory until it ends, so
    /// a `find` over a large tree (listings, no reads) brings one pack at a
    /// time, never every pack of the tree at once.
    pub fn warm(self: &Arc<Self>, id: &Hash) -> bool {
        self.warm_until(id, None)
    }

    /// [`Fetcher::warm`], with the download ending at member `last` when
    /// that is in the same pack, after `id` (a directory's listing: its
    /// subtree is one stretch of a pack, and a walk of it reads nothing
    /// past its end). Otherwise, to the end of the span, as `warm`.
    pub fn warm_until(self: &Arc<Self>, id: &Hash, last: Option<&Hash>) -> bool {
        let (pack, i, end) = {
            let set = self.packs.read().expect("packs lock");
            let Some((pack, i)) = set.members.get(id).cloned() else {
                return false;
            };
            let end =
                last.and_then(|l| set.members.get(l)).filter(|(p, j)| p.id == pack.id && *j >= i).map(|(_, j)| *j);
            (pack, i, end)
        };
        let m = &pack.members[i];
        if m.kind == crate::pack::MemberKind::Chunk
            || !self.pack_flights.lock().expect("pack flights lock").is_empty()
            || self.bad_packs.lock().expect("bad packs lock").contains(&pack.id)
            || self.in_cache(&pack, m)
            || self.mostly_cached(&pack)
        {
            return false;
        }
        self.flight(&pack, end.map_or(Start::Reader(i), |j| Start::Walk(i, j)));
        self.counters.warmed_packs.fetch_add(1, Relaxed);
        true
    }

    /// Waits, at most `limit`, until the flight of the pack holding `id`
    /// (one [`Fetcher::warm`] started) has its GET on the way, or ended.
    /// Blocks the calling thread: for a FUSE thread, not an async worker.
    pub fn wait_requested(&self, id: &Hash, limit: std::time::Duration) {
        let Some(pack) = self.pack_of(id) else { return };
        let flight = self.pack_flights.lock().expect("pack flights lock").get(&pack).cloned();
        if let Some(f) = flight {
            f.wait_requested(limit);
        }
    }

    /// The pack an attached index places object `id` in.
    pub fn pack_of(&self, id: &Hash) -> Option<Hash> {
        self.packs.read().expect("packs lock").members.get(id).map(|(p, _)| p.id)
    }

    /// The packs a reader of every object in `ids` can stream with
    /// [`Fetcher::stream_members`]: each pack holding some of them that the
    /// cache has no copy of (not even part), that has not failed, and most
    /// of whose members in `ids` are not cached loose either; with the
    /// span from the first to the last of those missing.
    pub fn pack_spans(&self, ids: &HashSet<Hash>) -> Vec<(Arc<PackEntry>, usize, usize)> {
        let found: Vec<(Arc<PackEntry>, usize)> = {
            let set = self.packs.read().expect("packs lock");
            ids.iter().filter_map(|id| set.members.get(id)).map(|(p, i)| (p.clone(), *i)).collect()
        };
        let bad = self.bad_packs.lock().expect("bad packs lock").clone();
        let mut skip: HashMap<Hash, bool> = HashMap::new();
        // pack -> (pack, first and last missing member, missing, cached loose)
        let mut spans: HashMap<Hash, (Arc<PackEntry>, usize, usize, usize, usize)> = HashMap::new();
        for (pack, i) in found {
            if *skip.entry(pack.id).or_insert_with(|| bad.contains(&pack.id) || self.cache.pack_recorded(&pack.id)) {
                continue;
            }
            let s = spans.entry(pack.id).or_insert_with(|| (pack.clone(), usize::MAX, 0, 0, 0));
            if self.cache.contains(&pack.members[i].id) {
                s.4 += 1;
            } else {
                (s.1, s.2, s.3) = (s.1.min(i), s.2.max(i), s.3 + 1);
            }
        }
        let mut out: Vec<_> = spans
            .into_values()
            .filter(|(_, _, _, missing, cached)| *missing > 0 && missing >= cached)
            .map(|(p, lo, hi, _, _)| (p, lo, hi))
            .collect();
        out.sort_by_key(|(p, lo, _)| (p.id, *lo));
        out
    }

    /// True when at least half the pack's members are in the cache. With
    /// no record of the pack in the cache, only loose copies could count,
    /// and a sample of [`MOSTLY_CACHED_SAMPLE`] members spread over the
    /// pack tells: a cold read of a big pack's first member must not wait
    /// on a lookup of every member (1,300 members were ~4,000 syscalls
    /// before the GET went out).
    fn mostly_cached(&self, pack: &PackEntry) -> bool {
        let n = pack.members.len();
        if n == 0 {
            return false;
        }
        let recorded = self.cache.pack_recorded(&pack.id);
        let step = if recorded { 1 } else { n.div_ceil(MOSTLY_CACHED_SAMPLE) };
        // Without a record of the pack, only loose copies can count: its
        // record is not looked for again per member (a `stat` each, of a
        // directory a cold cache reads from the disk, before a first
        // listing's GET went out).
        let cached = |m: &crate::pack::Member| match recorded {
            true => self.in_cache(pack, m),
            false => self.cache.contains(&m.id),
        };
        let sample = pack.members.iter().step_by(step);
        let (seen, have) = sample.fold((0, 0), |(s, h), m| (s + 1, h + usize::from(cached(m))));
        have * 2 >= seen
    }

    fn in_cache(&self, pack: &PackEntry, m: &crate::pack::Member) -> bool {
        self.cache.pack_has(&pack.id, &m.id) || self.cache.contains(&m.id)
    }

    /// One member by its own byte range (kept as a loose entry); `None` on
    /// any failure.
    async fn fetch_member(&self, pack: &PackEntry, i: usize) -> Option<Bytes> {
        let m = &pack.members[i];
        let got = self.remote.pack_range(&pack.id, m.offset..m.offset + m.stored_len).await.map_err(|e| e.to_string());
        match got.and_then(|b| decode_member_owned(m, b)) {
            Ok(raw) => {
                let _ = self.cache.put(&m.id, &raw);
                self.counters.members_from_packs.fetch_add(1, Relaxed);
                Some(raw)
            }
            Err(e) => {
                self.warn(format!("pack {}: member {}: {e}; reading it alone", pack.id, m.id));
                None
            }
        }
    }

    /// Downloads and explodes one pack (one ranged GET of its body), or
    /// the part of it `start` says. For [`Start::Reader`], when the member
    /// of the reader that started the flight sits far into the span, the
    /// flight starts there (the members before it come when asked for, in
    /// a flight of their own), so that reader waits for its own member's
    /// bytes only, wherever it is in the pack.
    async fn run_pack(self: Arc<Self>, pack: Arc<PackEntry>, flight: Arc<PackFlight>, start: Start) {
        // One process at a time per pack; the loser then finds the cache full.
        // Without the lock (an unwritable cache) we may fetch twice: still correct.
        let _lock = self.cache.lock_pack(&pack.id).await.ok();
        if pack.members.is_empty() {
            self.end_flight(&pack.id, &flight);
            return;
        }
        let (lo, hi) = self.span(&pack);
        let (mut lo, mut hi) = match start {
            Start::One(i) => (i, i),
            // Readers in order of earlier members that joined while the
            // lock was taken (a file's chunks asked for at once, the later
            // one first) are in this flight too: left out, they would wait
            // for it to end before their own GET went out.
            Start::From(i) => {
                let waited = flight.state.lock().expect("flight lock").waiters.keys().copied().min();
                (waited.map_or(i, |w| w.min(i)).max(lo.min(i)), hi.max(i))
            }
            Start::Span(a, b) => (a, b),
            // A reader's own member is always in its flight (the wanted
            // span may leave it out).
            Start::Reader(i) => (lo.min(i), hi.max(i)),
            Start::Walk(i, j) => (lo.min(i), hi.min(j).max(i)),
            Start::Whole => (lo, hi),
        };
        // The ends the cache holds already are not fetched again.
        while lo < hi && self.in_cache(&pack, &pack.members[lo]) {
            lo += 1;
        }
        while hi > lo && self.in_cache(&pack, &pack.members[hi]) {
            hi -= 1;
        }
        // A first reader far into the span: the fetch starts at its member,
        // so it waits for its own bytes only.
        let first = match start {
            Start::Reader(i) | Start::Walk(i, _) => Some(i),
            _ => None,
        };
        if let Some(f) = first
            .filter(|&f| f > lo && f <= hi && pack.members[f].offset - pack.members[lo].offset >= SPLIT_AHEAD_BYTES)
        {
            // Backed up by a little, so readers of the neighbouring files
            // (a walk of the same directory) share this flight.
            let at = pack.members[f].offset;
            let mut start = f;
            while start > lo && at - pack.members[start - 1].offset <= SPLIT_BACK_BYTES {
                start -= 1;
            }
            lo = start;
            self.counters.split_fetches.fetch_add(1, Relaxed);
        }
        flight.state.lock().expect("flight lock").covered = Some((lo, hi));
        if pack.members[lo..=hi].iter().all(|m| self.in_cache(&pack, m)) {
            self.end_flight(&pack.id, &flight);
            return;
        }
        let fl = flight.clone();
        // A reader woken here waits in this worker's LIFO slot until the
        // flight's task yields: it yields then, so the reader's reply goes
        // out before the members after it are decoded.
        let mut sink = move |i: usize, b: Option<Bytes>| fl.arrived(i, b).then(|| tokio::task::yield_now().boxed());
        // A permit bounds downloads only: a flight that finds its span
        // cached ended above without one. Taken under the pack's lock, so
        // a permit's holder waits on nothing but its download.
        let _permit = match crate::pack::is_run_pack(&pack) {
            true => self.run_flights.clone().acquire_owned().await.ok(),
            false => None,
        };
        self.fetch_span(&pack, lo, hi, &mut sink, Taker::Readers(&flight)).await;
        self.end_flight(&pack.id, &flight);
    }

    /// Members `lo..=hi` of `pack` (one ranged GET), each handed to `sink`
    /// once, in pack order, as it arrives and verifies (`None` for a bad
    /// one), and dropped then: for a reader that consumes every member once
    /// (a checkout writing files), so nothing is held for later readers and
    /// nothing is read back from the cache. The pack's bytes still go to
    /// the cache. A flight is registered meanwhile, so any other reader of
    /// the pack in this process waits for it and then reads the cache.
    ///
    /// `false` when it did not run: a flight of the pack was already
    /// running, the pack failed before, or another process had meanwhile
    /// fetched part of the span into the cache (the caller reads those
    /// members the usual way). A pack that fails partway is marked bad and
    /// warned about, as [`Fetcher::get`] does; members the sink never got
    /// must then be read the usual way (alone).
    pub async fn stream_members(self: &Arc<Self>, pack: &Arc<PackEntry>, lo: usize, hi: usize, sink: Sink<'_>) -> bool {
        if lo > hi || hi >= pack.members.len() || self.bad_packs.lock().expect("bad packs lock").contains(&pack.id) {
            return false;
        }
        let flight = {
            let mut map = self.pack_flights.lock().expect("pack flights lock");
            if map.contains_key(&pack.id) {
                return false;
            }
            let f = Arc::new(PackFlight::default());
            f.state.lock().expect("flight lock").covered = Some((lo, hi));
            map.insert(pack.id, f.clone());
            f
        };
        let lock = self.cache.lock_pack(&pack.id).await.ok();
        let ran = !self.cache.pack_recorded(&pack.id);
        if ran {
            let n = self.fetch_span(pack, lo, hi, sink, Taker::Bulk).await;
            self.counters.members_streamed.fetch_add(n as u64, Relaxed);
        }
        drop(lock);
        self.end_flight(&pack.id, &flight);
        ran
    }

    /// Fetches members `lo..=hi` of `pack` into the cache's copy of it,
    /// handing each to `sink`; a failure marks the pack bad (warned). The
    /// caller holds the pack's lock.
    /// Returns how many members verified and were handed over.
    async fn fetch_span(&self, pack: &PackEntry, lo: usize, hi: usize, sink: Sink<'_>, taker: Taker<'_>) -> usize {
        // The GET goes out first; the cache file is made on a blocking
        // thread while it is on its way (a cold cache's directories cost
        // disk reads: a first read waited for them before its round trip
        // began). Made on this task instead, it would still hold the GET
        // back: the HTTP client's connection task, woken from here, runs
        // only when this worker is free. Without a cache file (an
        // unwritable cache) readers are still served.
        let (cache, id) = (self.cache.clone(), pack.id);
        let making = tokio::task::spawn_blocking(move || cache.pack_writer(&id).ok().map(Arc::new));
        let mut requesting = std::pin::pin!(async {
            tokio::join!(self.remote.pack_stream(&pack.id, pack.members_range(lo, hi)), making)
        });
        let (stream, writer) = std::future::poll_fn(|cx| {
            let polled = std::future::Future::poll(requesting.as_mut(), cx);
            // Polled once, the request is with the HTTP client.
            if let Taker::Readers(f) = taker {
                f.requested();
            }
            polled
        })
        .await;
        let writer = writer.ok().flatten();
        let mut handed = 0;
        let mut counting = |i: usize, b: Option<Bytes>| {
            handed += usize::from(b.is_some());
            sink(i, b)
        };
        let streamed = match stream {
            Ok(stream) => self.stream_pack(pack, stream, &mut counting, (lo, hi), writer.clone(), taker).await,
            Err(Error::NotFound(_)) => {
                self.counters.packs_missing.fetch_add(1, Relaxed);
                Err(Failed::Lasting("missing from the store (swept?)".to_string()))
            }
            Err(e) => Err(Failed::Passing(format!("GET failed: {e}"))),
        };
        if let (Some(w), Ok(good)) = (&writer, &streamed) {
            if !good.is_empty() {
                let _ = w.commit(&self.cache, good);
            }
        }
        if let Err(e) = streamed {
            self.cache.discard_unrecorded(&pack.id);
            self.counters.pack_failures.fetch_add(1, Relaxed);
            match e {
                // A pack the store lost or holds corrupt: its objects are
                // read one by one from now on (a store with loose copies
                // still serves them).
                Failed::Lasting(e) => {
                    self.bad_packs.lock().expect("bad packs lock").insert(pack.id);
                    self.warn(format!("pack {}: {e}; reading its objects one by one", pack.id));
                }
                // The store or the network failed: the next read asks for
                // the pack again (remembered as bad, a packs-only store
                // would answer every later read with a missing object).
                Failed::Passing(e) => {
                    self.warn(format!("pack {}: {e}; this read goes on object by object, the next asks again", pack.id))
                }
            }
        } else {
            self.counters.packs_exploded.fetch_add(1, Relaxed);
        }
        handed
    }

    /// Streams members `lo..=hi` of `pack` (the body of one ranged GET,
    /// `stream`, over exactly their bytes) into the cache's copy of the
    /// pack: the bytes go to one file at their own
    /// offsets, in batches written off this task, and the members are
    /// recorded as present once every batch is on disk.
    ///
    /// Returns the members that verified and are on disk (none when a
    /// write failed), or why the part failed.
    async fn stream_pack(
        &self,
        pack: &PackEntry,
        mut stream: futures::stream::BoxStream<'static, Result<Bytes>>,
        sink: Sink<'_>,
        (lo, hi): (usize, usize),
        writer: Option<Arc<crate::cache::PackWriter>>,
        taker: Taker<'_>,
    ) -> std::result::Result<Vec<crate::pack::Member>, Failed> {
        let bulk = matches!(taker, Taker::Bulk);
        let std::ops::Range { start: base, end } = pack.members_range(lo, hi);
        // `pending` holds the pack's bytes from offset `at`, as the network
        // delivered them. Complete members leave it as one segment, decoded
        // and verified on a blocking thread (a few segments at once, so
        // decoding keeps up with the download on every core) and handed to
        // `sink` in pack order; the same segment goes to the cache file.
        let mut pending = Pending::default();
        let mut at = base;
        let mut next = lo;
        let stop = hi + 1;
        let mut bad = 0usize;
        let mut good: Vec<crate::pack::Member> = Vec::with_capacity(stop - lo);
        let mut writes = Vec::new();
        let mut decoding: std::collections::VecDeque<tokio::task::JoinHandle<Decoded>> = Default::default();
        let (mut unwritten, mut unwritten_len, mut unwritten_at): (Vec<Bytes>, usize, u64) = (Vec::new(), 0, base);
        let mut deliver = |d: Decoded, good: &mut Vec<crate::pack::Member>, bad: &mut usize| {
            let mut waits = Vec::new();
            for (i, m, r) in d {
                let handed = match r {
                    Ok(raw) => {
                        good.push(m);
                        sink(i, Some(raw))
                    }
                    Err(e) => {
                        *bad += 1;
                        self.warn(format!("pack {}: member {} is bad ({e}); skipped", pack.id, m.id));
                        sink(i, None)
                    }
                };
                waits.extend(handed);
            }
            waits
        };
        while next < stop {
            let chunk = match stream.next().await {
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    return Err(Failed::Passing(format!(
                        "read failed after {} bytes: {e}",
                        at + pending.len as u64 - base
                    )))
                }
                None => {
                    return Err(Failed::Passing(format!(
                        "truncated: {} of {} body bytes",
                        at + pending.len as u64 - base,
                        end - base
                    )))
                }
            };
            pending.push(chunk);
            let first = next;
            let mut done_to = at;
            while next < stop {
                let m = &pack.members[next];
                if m.offset + m.stored_len > at + pending.len as u64 {
                    break;
                }
                done_to = m.offset + m.stored_len;
                next += 1;
            }
            let ready = (done_to - at) as usize;
            // Bulk: segments of DECODE_BATCH_BYTES decoded on blocking
            // threads. Otherwise each member is decoded here as soon as
            // its bytes are in (a reader waits for it, and a hand-off per
            // few members, as a network stream delivers them, costs more
            // than it saves: a cold mount walk over MinIO took 1.8x as long).
            if ready > 0 && (next == stop || ready >= DECODE_BATCH_BYTES || !bulk) {
                let seg = pending.take(ready);
                let members: Vec<(usize, crate::pack::Member)> = (first..next).map(|i| (i, pack.members[i])).collect();
                match taker {
                    Taker::Bulk => {
                        let (seg, seg_at) = (seg.clone(), at);
                        decoding.push_back(tokio::task::spawn_blocking(move || decode_batch(members, &seg, seg_at)));
                    }
                    Taker::Readers(flight) => {
                        // Each member is handed over as soon as it decodes,
                        // the ones readers wait for first: one network read
                        // can bring a thousand small files, and a walk's
                        // first file sat behind hundreds of other
                        // directories' members.
                        let waited = flight.waited(first..next);
                        let (now, later): (Vec<_>, Vec<_>) = members.into_iter().partition(|(i, _)| waited.contains(i));
                        for (i, m) in now.into_iter().chain(later) {
                            for w in deliver(vec![decode_in(i, m, &seg, at)], &mut good, &mut bad) {
                                w.await;
                            }
                        }
                    }
                }
                if let Some(w) = &writer {
                    // To the cache file in batches of at least
                    // WRITE_BATCH_BYTES (a blocking task per small segment
                    // costs more than its write).
                    if unwritten.is_empty() {
                        unwritten_at = at;
                    }
                    unwritten_len += seg.len();
                    unwritten.push(seg);
                    if unwritten_len >= WRITE_BATCH_BYTES || next == stop {
                        let (w, cache, off) = (w.clone(), self.cache.clone(), unwritten_at);
                        let segs = std::mem::take(&mut unwritten);
                        unwritten_len = 0;
                        let permit = self.write_permits.clone().acquire_owned().await.ok();
                        writes.push(tokio::task::spawn_blocking(move || {
                            let mut off = off;
                            for seg in segs {
                                w.write_at(&cache, off, &seg)?;
                                off += seg.len() as u64;
                            }
                            drop(permit);
                            Ok::<(), Error>(())
                        }));
                    }
                }
                at += ready as u64;
            } else if ready > 0 {
                // Not cut yet: the members stay in `pending` for the next round.
                next = first;
            }
            // Hand over what is decoded; wait for the oldest when too many
            // are queued (which bounds the memory ahead of the readers).
            while decoding.front().is_some_and(|t| t.is_finished()) || decoding.len() > DECODES_IN_FLIGHT {
                let d = decoding
                    .pop_front()
                    .expect("checked")
                    .await
                    .map_err(|e| Failed::Lasting(format!("decoding: {e}")))?;
                for w in deliver(d, &mut good, &mut bad) {
                    w.await;
                }
            }
            // Let the readers just woken run now: a task woken from this
            // worker waits in its LIFO slot until this task yields.
            tokio::task::yield_now().await;
        }
        while let Some(t) = decoding.pop_front() {
            let d = t.await.map_err(|e| Failed::Lasting(format!("decoding: {e}")))?;
            for w in deliver(d, &mut good, &mut bad) {
                w.await;
            }
        }
        // The pack's lock is held until the copy is recorded.
        let mut written = writer.is_some();
        for w in writes {
            written &= matches!(w.await, Ok(Ok(())));
        }
        if bad > 0 {
            return Err(Failed::Lasting(format!("{bad} bad members")));
        }
        Ok(if written { good } else { Vec::new() })
    }
}

/// Why a pack's part could not be read.
#[derive(Debug)]
enum Failed {
    /// The store lost the pack, or its bytes are wrong: asking again
    /// would not help.
    Lasting(String),
    /// The request or its body failed on the way (the store away, a
    /// connection broken): a later read asks again.
    Passing(String),
}

/// Member `i` (`m`) decoded and verified from `seg`, the pack's bytes
/// from offset `seg_at`.
fn decode_in(
    i: usize,
    m: crate::pack::Member,
    seg: &Bytes,
    seg_at: u64,
) -> (usize, crate::pack::Member, std::result::Result<Bytes, String>) {
    let from = (m.offset - seg_at) as usize;
    (i, m, decode_member_owned(&m, seg.slice(from..from + m.stored_len as usize)))
}

/// Compressed members of at most this many raw bytes share a bulk
/// batch's one buffer (a larger one is decoded into its own).
const SHARED_MEMBER_MAX: u64 = 1 << 20;

/// Members `members` of `seg` (the pack's bytes from offset `seg_at`),
/// decoded for a bulk taker, which writes each out and drops it: the
/// compressed ones of up to [`SHARED_MEMBER_MAX`] raw bytes into one
/// pooled buffer, each handed over as a view of it, the buffer going back
/// to the pool when the last view drops. Decoded into buffers of their
/// own, every member of a cold checkout was fresh memory, pages the
/// kernel faulted in and zeroed: 70 % of the page faults of a checkout of
/// a 2,781-file subtree (perf), and on this VM a zeroed page can cost a
/// trip to the host as well (`clear_page_erms` was 14 % of a slow run's
/// samples, 1 % of a fast one's). Raw members stay views of `seg`.
fn decode_batch(members: Vec<(usize, crate::pack::Member)>, seg: &Bytes, seg_at: u64) -> Decoded {
    use crate::pack::Codec;
    let shared = |m: &crate::pack::Member| m.codec == Codec::Zstd && m.raw_len <= SHARED_MEMBER_MAX;
    // Bounded by the pool's largest kept buffer: a table whose rows claim
    // more than that (hostile, or a batch of very compressible members)
    // decodes the rest one by one.
    let mut room = 0usize;
    let into_buf: Vec<bool> = members
        .iter()
        .map(|(_, m)| {
            let fits = shared(m) && room + m.raw_len as usize <= crate::bufpool::MAX_KEPT;
            room += if fits { m.raw_len as usize } else { 0 };
            fits
        })
        .collect();
    if room < crate::bufpool::MIN_BYTES {
        return members.into_iter().map(|(i, m)| decode_in(i, m, seg, seg_at)).collect();
    }
    // In steps of 256 KiB, so that a buffer given back serves the
    // batches after it (the pool hands out one of up to twice the size).
    let mut buf = crate::bufpool::take(room.next_multiple_of(256 << 10));
    let mut spans = Vec::with_capacity(members.len());
    for ((_, m), &mine) in members.iter().zip(&into_buf) {
        spans.push(mine.then(|| {
            let from = (m.offset - seg_at) as usize;
            let start = buf.len();
            crate::pack::decode_member_append(m, &seg[from..from + m.stored_len as usize], &mut buf)
                .map(|()| start..buf.len())
        }));
    }
    let all = crate::bufpool::into_bytes(buf);
    members
        .into_iter()
        .zip(spans)
        .map(|((i, m), span)| match span {
            Some(r) => (i, m, r.map(|r| all.slice(r))),
            None => decode_in(i, m, seg, seg_at),
        })
        .collect()
}

/// A pack's bytes as the network delivered them, not yet cut into
/// segments of whole members.
#[derive(Default)]
struct Pending {
    parts: std::collections::VecDeque<Bytes>,
    len: usize,
}

impl Pending {
    fn push(&mut self, b: Bytes) {
        self.len += b.len();
        self.parts.push_back(b);
    }

    /// The first `n` bytes (`n` ≤ `self.len`) as one segment: a view of
    /// the first part when it holds them all, else one copy into a pooled
    /// buffer. Growing one buffer as parts arrive (a `BytesMut`) moved its
    /// bytes on every regrowth, and every new buffer was pages the kernel
    /// faulted in and zeroed: a fifth of a mount daemon's CPU on a cold
    /// large read.
    fn take(&mut self, n: usize) -> Bytes {
        debug_assert!(n <= self.len);
        self.len -= n;
        let front = self.parts.front_mut().expect("pending holds n bytes");
        if front.len() >= n {
            let seg = front.split_to(n);
            if front.is_empty() {
                self.parts.pop_front();
            }
            return seg;
        }
        let mut v = crate::bufpool::take(n);
        while v.len() < n {
            let part = self.parts.front_mut().expect("pending holds n bytes");
            let want = (n - v.len()).min(part.len());
            v.extend_from_slice(&part[..want]);
            if want == part.len() {
                self.parts.pop_front();
            } else {
                bytes::Buf::advance(part, want);
            }
        }
        crate::bufpool::into_bytes(v)
    }
}

#[cfg(test)]
mod pending_tests {
    use super::*;

    #[test]
    fn segments_come_out_whole_in_order_across_and_within_parts() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut p = Pending::default();
        // Parts of uneven sizes, as a network delivers them.
        let mut off = 0;
        for n in [10, 70_000, 5, 100_000, 129_985] {
            p.push(Bytes::copy_from_slice(&data[off..off + n]));
            off += n;
        }
        assert_eq!(off, data.len());
        assert_eq!(p.len, data.len());
        let mut at = 0;
        // Within the first part, across several, the rest of one, across two.
        for n in [3, 69_000, 1_007, 120_000, 110_000 - 10] {
            let seg = p.take(n);
            assert_eq!(&seg[..], &data[at..at + n], "segment at {at} of {n} bytes");
            at += n;
            assert_eq!(p.len, data.len() - at);
        }
        assert_eq!(at, data.len());
        assert!(p.parts.is_empty());
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use crate::pack::{build_pack, Codec, MemberKind};

    fn text(i: usize, len: usize) -> Vec<u8> {
        format!("member {i}: ").bytes().chain((0..len).map(|k| b"abcdefgh"[(k / 7 + i) % 8])).take(len).collect()
    }

    /// Decodes `raws` packed together, as one bulk batch over their whole
    /// span; `tamper` may change the pack's bytes first.
    fn batch(
        raws: &[Vec<u8>],
        tamper: impl FnOnce(&mut Vec<u8>, &crate::pack::PackEntry),
    ) -> (crate::pack::PackEntry, Decoded) {
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        let (mut bytes, pack) = build_pack(&members);
        tamper(&mut bytes, &pack);
        let span = pack.members_range(0, raws.len() - 1);
        let seg = Bytes::from(bytes).slice(span.start as usize..span.end as usize);
        let rows = pack.members.iter().copied().enumerate().collect();
        let d = decode_batch(rows, &seg, span.start);
        (pack, d)
    }

    #[test]
    fn members_decode_into_one_shared_buffer_each_whole_and_in_order() {
        // Compressible members (sharing the buffer), one large one (its
        // own), and random ones (stored raw: views of the segment).
        let mut raws: Vec<Vec<u8>> = (0..60).map(|i| text(i, 3_000 + 97 * i)).collect();
        raws.push(text(99, (SHARED_MEMBER_MAX + 1) as usize));
        raws.extend((1..4u64).map(|i| {
            let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (0..5_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 32) as u8
                })
                .collect()
        }));
        let (pack, d) = batch(&raws, |_, _| {});
        assert!(pack.members.iter().filter(|m| m.codec == Codec::Zstd).count() > 60, "the text is compressed");
        assert!(pack.members.iter().any(|m| m.codec == Codec::Raw), "the noise is not");
        assert_eq!(d.len(), raws.len());
        for (k, (i, m, r)) in d.iter().enumerate() {
            assert_eq!((*i, m.id), (k, Hash::of(&raws[k])));
            assert_eq!(&r.as_ref().expect("a good member")[..], &raws[k][..], "member {k}");
        }
        // The small compressed ones are views of one buffer, end to end;
        // the large one is not in it, and the raw ones are views of the
        // segment itself (no copy).
        let ptr = |k: usize| d[k].2.as_ref().unwrap().as_ptr() as usize;
        for k in 1..60 {
            assert_eq!(ptr(k), ptr(k - 1) + raws[k - 1].len(), "member {k} follows member {}", k - 1);
        }
        assert_ne!(ptr(60), ptr(59) + raws[59].len(), "the large member has a buffer of its own");
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        let (bytes, pack) = build_pack(&members);
        let span = pack.members_range(0, raws.len() - 1);
        let seg = Bytes::from(bytes).slice(span.start as usize..span.end as usize);
        let d = decode_batch(pack.members.iter().copied().enumerate().collect(), &seg, span.start);
        let inside = |k: usize| {
            let p = d[k].2.as_ref().unwrap().as_ptr() as usize;
            (seg.as_ptr() as usize..seg.as_ptr() as usize + seg.len()).contains(&p)
        };
        for k in 61..64 {
            assert_eq!(pack.members[k].codec, Codec::Raw);
            assert!(inside(k), "raw member {k} is a view of the segment");
        }
        assert!(!inside(0), "a compressed member is decoded elsewhere");
    }

    /// A batch whose compressed members come to less than the pool's
    /// smallest buffer decodes each into its own; from that size on, into
    /// one shared buffer.
    #[test]
    fn a_small_batch_is_not_pooled_and_one_of_the_pools_smallest_size_is() {
        for (total, pooled) in [(crate::bufpool::MIN_BYTES - 1, false), (crate::bufpool::MIN_BYTES, true)] {
            let mut raws: Vec<Vec<u8>> = (0..3).map(|i| text(i, 8_000)).collect();
            raws.push(text(3, total - 24_000));
            let (pack, d) = batch(&raws, |_, _| {});
            assert!(pack.members.iter().all(|m| m.codec == Codec::Zstd));
            let ptr = |k: usize| d[k].2.as_ref().unwrap().as_ptr() as usize;
            let adjacent = (1..4).all(|k| ptr(k) == ptr(k - 1) + raws[k - 1].len());
            assert_eq!(adjacent, pooled, "{total} bytes");
            for (k, (_, _, r)) in d.iter().enumerate() {
                assert_eq!(&r.as_ref().unwrap()[..], &raws[k][..]);
            }
        }
    }

    #[test]
    fn a_bad_member_is_named_and_its_neighbours_in_the_buffer_stay_whole() {
        let raws: Vec<Vec<u8>> = (0..40).map(|i| text(i, 4_000)).collect();
        // Member 7's stored bytes damaged, and member 20's row claiming
        // fewer bytes than its frame holds (it must not spill into 21's).
        let (_, d) = batch(&raws, |bytes, pack| {
            let m = pack.members[7];
            bytes[(m.offset + m.stored_len / 2) as usize] ^= 0x55;
        });
        for (k, (_, _, r)) in d.iter().enumerate() {
            match k {
                7 => assert!(r.is_err(), "member 7 is damaged"),
                _ => assert_eq!(&r.as_ref().unwrap()[..], &raws[k][..], "member {k}"),
            }
        }
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        let (bytes, mut pack) = build_pack(&members);
        pack.members[20].raw_len -= 100;
        let span = pack.members_range(0, raws.len() - 1);
        let seg = Bytes::from(bytes).slice(span.start as usize..span.end as usize);
        let d = decode_batch(pack.members.iter().copied().enumerate().collect(), &seg, span.start);
        for (k, (_, _, r)) in d.iter().enumerate() {
            match k {
                20 => assert!(r.is_err(), "member 20's row lies about its length"),
                _ => assert_eq!(&r.as_ref().unwrap()[..], &raws[k][..], "member {k}"),
            }
        }
    }

    #[test]
    fn rows_claiming_more_than_the_pool_keeps_are_decoded_one_by_one() {
        // 40 members of 300 KiB (12 MiB in all, over MAX_KEPT): the
        // buffer takes as many as fit, the rest get their own.
        let raws: Vec<Vec<u8>> = (0..40).map(|i| text(i, 300 << 10)).collect();
        let (_, d) = batch(&raws, |_, _| {});
        let shared = crate::bufpool::MAX_KEPT / (300 << 10);
        let ptr = |k: usize| d[k].2.as_ref().unwrap().as_ptr() as usize;
        for (k, (_, _, r)) in d.iter().enumerate() {
            assert_eq!(&r.as_ref().unwrap()[..], &raws[k][..], "member {k}");
            if (1..shared).contains(&k) {
                assert_eq!(ptr(k), ptr(k - 1) + (300 << 10), "member {k} shares the buffer");
            }
        }
        assert_ne!(ptr(shared), ptr(shared - 1) + (300 << 10), "member {shared} is past the buffer's room");
    }
}

#[cfg(test)]
mod flight_tests {
    use super::*;
    use crate::pack::{build_pack, MemberKind};
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn an_arrival_says_whether_a_reader_waited_for_it() {
        let f = PackFlight::default();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        f.state.lock().unwrap().waiters.entry(3).or_default().push(tx);
        assert!(!f.arrived(2, Some(Bytes::from_static(b"x"))), "nobody waits for member 2");
        assert!(rx.try_recv().is_err(), "member 3's reader is still waiting");
        assert!(f.arrived(3, Some(Bytes::from_static(b"y"))));
        assert!(rx.try_recv().is_ok(), "member 3's reader is woken");
        assert!(!f.arrived(3, None), "its waiters went with the first arrival");
        assert_eq!(f.state.lock().unwrap().data.len(), 2);
    }

    /// A reader's members arrive in one network read of the whole span
    /// (as a small pack does): each is handed over, and the wait its
    /// hand-over asks for is run, before the next one is decoded.
    #[tokio::test]
    async fn a_reader_gets_each_member_before_the_next_one_decodes() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/store", dir.path().display());
        let remote = Arc::new(crate::store::Remote::open(&url, &Default::default()).unwrap());
        let cache = Arc::new(crate::cache::DiskCache::open(dir.path().join("cache"), None).unwrap());
        let f = Fetcher::new(remote, cache);
        let raws: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 300 + i as usize]).collect();
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        let (bytes, pack) = build_pack(&members);
        let (lo, hi) = (0, raws.len() - 1);
        let span = pack.members_range(lo, hi);
        let body = Bytes::from(bytes).slice(span.start as usize..span.end as usize);
        let stream = futures::stream::iter([Ok(body)]).boxed();
        let handed = Arc::new(AtomicUsize::new(0));
        let at_wait: Arc<Mutex<Vec<usize>>> = Arc::default();
        let got: Arc<Mutex<Vec<(usize, Bytes)>>> = Arc::default();
        let mut sink = {
            let (handed, at_wait, got) = (handed.clone(), at_wait.clone(), got.clone());
            move |i: usize, b: Option<Bytes>| -> Option<BoxFuture<'static, ()>> {
                got.lock().unwrap().push((i, b.expect("a good member")));
                handed.fetch_add(1, Relaxed);
                let (handed, at_wait) = (handed.clone(), at_wait.clone());
                Some(async move { at_wait.lock().unwrap().push(handed.load(Relaxed)) }.boxed())
            }
        };
        let flight = PackFlight::default();
        let r = f.stream_pack(&pack, stream, &mut sink, (lo, hi), None, Taker::Readers(&flight)).await;
        assert!(r.is_ok(), "{r:?}");
        {
            let got = got.lock().unwrap();
            assert_eq!(got.len(), raws.len());
            for (k, (i, b)) in got.iter().enumerate() {
                assert_eq!((*i, &b[..]), (k, &raws[k][..]), "member {k}, in order, whole");
            }
        }
        // Member k's wait ran when k + 1 members had been handed over.
        assert_eq!(*at_wait.lock().unwrap(), (1..=raws.len()).collect::<Vec<_>>());

        // Readers waiting for members 25 and 7 get theirs first (in pack
        // order), then the rest come in order.
        let flight = PackFlight::default();
        let mut parked = Vec::new();
        for i in [25, 7] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            flight.state.lock().unwrap().waiters.entry(i).or_default().push(tx);
            parked.push(rx);
        }
        let order: Arc<Mutex<Vec<usize>>> = Arc::default();
        let mut sink = {
            let (order, raws) = (order.clone(), raws.clone());
            move |i: usize, b: Option<Bytes>| -> Option<BoxFuture<'static, ()>> {
                assert_eq!(&b.expect("a good member")[..], &raws[i][..]);
                order.lock().unwrap().push(i);
                None
            }
        };
        let body = Bytes::from(build_pack(&members).0).slice(span.start as usize..span.end as usize);
        let stream = futures::stream::iter([Ok(body)]).boxed();
        let r = f.stream_pack(&pack, stream, &mut sink, (lo, hi), None, Taker::Readers(&flight)).await;
        assert!(r.is_ok(), "{r:?}");
        let want: Vec<usize> = [7, 25].into_iter().chain((0..raws.len()).filter(|i| ![7, 25].contains(i))).collect();
        assert_eq!(*order.lock().unwrap(), want);
    }
}
