//! Reading through packs: one ranged GET per pack (or span of it), its
//! bytes kept in the cache as one file as they stream in, each waiter woken
//! when its own member has verified; a member read alone when its pack fails.

use super::stream::Taker;
use super::Fetcher;
use crate::hash::Hash;
use crate::pack::{decode_member_owned, PackEntry};
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

/// Fetched pack bytes are decoded, and go to the disk cache, in segments
/// of at least this many bytes while the decoders are busy.
pub(super) const DECODE_BATCH_BYTES: usize = 256 << 10;
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
    pub(super) fn arrived(&self, i: usize, b: Option<Bytes>) -> bool {
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
    pub(super) fn waited(&self, range: std::ops::Range<usize>) -> Vec<usize> {
        let s = self.state.lock().expect("flight lock");
        s.waiters.keys().copied().filter(|i| range.contains(i)).collect()
    }

    pub(super) fn requested(&self) {
        self.state.lock().expect("flight lock").requested = true;
        self.moved.notify_all();
    }

    /// Waits, at most `limit`, until the GET is on its way or the flight
    /// ended. Blocks the thread: not for an async worker.
    pub(super) fn wait_requested(&self, limit: std::time::Duration) {
        let s = self.state.lock().expect("flight lock");
        let _ = self.moved.wait_timeout_while(s, limit, |s| !s.requested && !s.finished).expect("flight lock");
    }

    pub(super) fn finish(&self) {
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
    /// A reader of member `i` (the middle) in a pack the cache holds part
    /// of: the stretch from `a` to `b` it lacks around `i`, split as
    /// `Reader(i)`'s span is.
    Around(usize, usize, usize),
}

/// A stretch of cached members this short (in bytes) between two missing
/// ones is fetched again with them, so that one flight brings both: at
/// RTT 50 ms and ~100 MB/s a round trip costs as much as 5 MB.
const JOIN_CACHED_BYTES: u64 = 256 << 10;
/// How many members on each side of a reader's the search for the
/// stretch the cache lacks looks at, at most.
const MISSING_RUN_WINDOW: usize = 4096;

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
        // Left out by a split flight: the rest of that stretch comes in one
        // flight, however much of the pack the split one brought.
        let start = match self.left_out(pack, i) {
            Some((lo, hi)) => Start::Span(lo, hi),
            // A pack the cache holds part of (flights that covered some of
            // it, members evicted or healed): the stretch it lacks around
            // this member in one flight, not a GET per member; a member
            // missing alone, by its own byte range. (A large file's chunks
            // keep their own starts: one, or on to the end.)
            _ if !running && !retry => {
                match matches!(start, Start::Reader(_)).then(|| self.missing_run(pack, i)).flatten() {
                    Some((a, b)) if a < b => Start::Around(a, i, b),
                    // Missing alone, or (no record of the pack) loose copies of
                    // most members.
                    run if run.is_some() || self.mostly_cached(pack) => {
                        return self.fetch_member(pack, i).await.map_or(Attempt::Failed, Attempt::Got)
                    }
                    _ => start,
                }
            }
            _ => start,
        };
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
            set.members(ids.iter()).into_iter().filter(|(p, _)| seen.insert(p.id)).map(|(p, _)| p).collect()
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
    /// warm pack's misses are read member by member, unless a split flight
    /// left them out: those come as one flight); nor while any pack is
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
        // A cached file needs no download: known without building its
        // pack's table (a stat walk lists every directory, and each
        // listing asks this of its first file).
        match self.pack_of(id) {
            None => return false,
            Some(pack) if self.cache.pack_has(&pack, id) || self.cache.contains(id) => return false,
            Some(_) => {}
        }
        let (pack, i, end) = {
            let set = self.packs.read().expect("packs lock");
            let Some((pack, i)) = set.member(id) else {
                return false;
            };
            let end = last.and_then(|l| set.member(l)).filter(|(p, j)| p.id == pack.id && *j >= i).map(|(_, j)| j);
            (pack, i, end)
        };
        let m = &pack.members[i];
        let rest = self.left_out(&pack, i);
        if m.kind == crate::pack::MemberKind::Chunk
            || !self.pack_flights.lock().expect("pack flights lock").is_empty()
            || self.bad_packs.lock().expect("bad packs lock").contains(&pack.id)
            || self.in_cache(&pack, m)
            || (rest.is_none() && self.mostly_cached(&pack))
        {
            return false;
        }
        let start = match rest {
            // What a split flight left out, as a reader of it would fetch it.
            Some((lo, hi)) => Start::Span(lo, hi),
            None => end.map_or(Start::Reader(i), |j| Start::Walk(i, j)),
        };
        self.flight(&pack, start);
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
        self.packs.read().expect("packs lock").pack_id_of(id)
    }

    /// The packs a reader of every object in `ids` can stream with
    /// [`Fetcher::stream_members`]: each pack holding some of them that the
    /// cache has no copy of (not even part), that has not failed, and most
    /// of whose members in `ids` are not cached loose either; with the
    /// span from the first to the last of those missing.
    pub fn pack_spans(&self, ids: &HashSet<Hash>) -> Vec<(Arc<PackEntry>, usize, usize)> {
        let found: Vec<(Arc<PackEntry>, usize)> = {
            let set = self.packs.read().expect("packs lock");
            set.members(ids.iter())
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

    /// The stretch of `pack`'s members around member `i` that the cache's
    /// record of the pack lacks, within the span this fetcher wants, joined
    /// across cached stretches of at most [`JOIN_CACHED_BYTES`]; `None`
    /// when the cache has no record of the pack. One look-up of the record
    /// for the whole window, not one per member.
    fn missing_run(&self, pack: &PackEntry, i: usize) -> Option<(usize, usize)> {
        if !self.cache.pack_recorded(&pack.id) {
            return None;
        }
        let (slo, shi) = self.span(pack);
        let (slo, shi) = if (slo..=shi).contains(&i) { (slo, shi) } else { (0, pack.members.len() - 1) };
        let (wlo, whi) = (i.saturating_sub(MISSING_RUN_WINDOW).max(slo), (i + MISSING_RUN_WINDOW).min(shi));
        let window = &pack.members[wlo..=whi];
        let listed: HashSet<Hash> =
            self.cache.pack_listed(&pack.id, window.iter().map(|m| &m.id)).into_iter().collect();
        let missing = |j: usize| !listed.contains(&pack.members[j].id);
        let end = |j: usize| pack.members[j].offset + pack.members[j].stored_len;
        let mut b = i;
        for j in i + 1..=whi {
            if missing(j) {
                b = j;
            } else if end(j) - end(b) > JOIN_CACHED_BYTES {
                break;
            }
        }
        let mut a = i;
        for j in (wlo..i).rev() {
            if missing(j) {
                a = j;
            } else if pack.members[a].offset - pack.members[j].offset > JOIN_CACHED_BYTES {
                break;
            }
        }
        Some((a, b))
    }

    /// The members a split flight of `pack` left out, when member `i` is
    /// one of them.
    fn left_out(&self, pack: &PackEntry, i: usize) -> Option<(usize, usize)> {
        let rest = self.split_rest.lock().expect("split rest lock").get(&pack.id).copied();
        rest.filter(|&(lo, hi)| (lo..=hi).contains(&i))
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
            Start::Span(a, b) | Start::Around(a, _, b) => (a, b),
            // A reader's own member is always in its flight (the wanted
            // span may leave it out).
            Start::Reader(i) => (lo.min(i), hi.max(i)),
            Start::Walk(i, j) => (lo.min(i), hi.min(j).max(i)),
            Start::Whole => (lo, hi),
        };
        // A flight over what a split one left out: that is done with.
        {
            let mut rest = self.split_rest.lock().expect("split rest lock");
            if rest.get(&pack.id).is_some_and(|&(a, b)| lo <= a && b <= hi) {
                rest.remove(&pack.id);
            }
        }
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
            Start::Reader(i) | Start::Walk(i, _) | Start::Around(_, i, _) => Some(i),
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
            if start > lo {
                self.split_rest.lock().expect("split rest lock").insert(pack.id, (lo, start - 1));
                lo = start;
                self.counters.split_fetches.fetch_add(1, Relaxed);
            }
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
}

#[cfg(test)]
mod flight_tests {
    use super::*;
    use crate::pack::{build_pack, MemberKind};
    use futures::StreamExt;
    use std::sync::atomic::AtomicUsize;

    /// A pack mostly in the cache: a member missing from it is read by
    /// its own byte range, and is the right bytes, kept in the cache.
    #[tokio::test]
    async fn a_member_missing_from_a_mostly_cached_pack_is_read_by_its_range() {
        let dir = tempfile::tempdir().unwrap();
        let (remote, cache) = crate::testutil::local_store(dir.path());
        let raws: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 200 + i as usize]).collect();
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        let (bytes, pack) = build_pack(&members);
        remote.put_pack(&pack.id, Bytes::from(bytes)).await.unwrap();
        for r in raws.iter().enumerate().filter(|(i, _)| *i != 7).map(|(_, r)| r) {
            cache.put(&Hash::of(r), r).unwrap();
        }
        let f = Fetcher::new(remote.clone(), cache.clone());
        let before = remote.stats();
        let got = f.member_of(Arc::new(pack), &Hash::of(&raws[7])).await;
        assert_eq!(got.as_deref(), Some(&raws[7][..]));
        let d = remote.stats().since(&before);
        assert_eq!(d.ranged_gets + d.gets, 1, "{d:?}");
        assert_eq!(f.counters.members_from_packs.load(Relaxed), 1);
        assert!(cache.contains(&Hash::of(&raws[7])));
    }

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
        let (remote, cache) = crate::testutil::local_store(dir.path());
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
