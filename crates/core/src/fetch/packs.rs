//! Reading through packs: one ranged GET per pack (or span of it), members
//! exploded into the cache as the bytes stream in, each waiter woken when
//! its own member has verified; a member read alone when its pack fails.

use super::*;

/// A batch of exploded members goes to the disk cache once it holds this
/// many bytes or members (or the pack ends).
pub(super) const WRITE_BATCH_BYTES: usize = 1 << 20;

pub(super) const WRITE_BATCH_MEMBERS: usize = 256;

/// One pack being downloaded. Each waiter parks on its own member: the
/// arrival of member `i` wakes only the readers of member `i` (a shared
/// broadcast would wake every reader on every member, O(n²) for a pack).
#[derive(Default)]
pub(super) struct PackFlight {
    pub(super) state: Mutex<FlightState>,
}

#[derive(Default)]
pub(super) struct FlightState {
    pub(super) finished: bool,
    pub(super) data: HashMap<usize, Bytes>,
    pub(super) waiters: HashMap<usize, Vec<tokio::sync::oneshot::Sender<()>>>,
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
        let (a, b) = (&pack.members[lo], &pack.members[hi]);
        let span = (b.offset + b.stored_len - a.offset) as f64;
        if span < PARTIAL_PACK_SHARE * (pack.size - pack.header_len) as f64 {
            (lo, hi)
        } else {
            all
        }
    }

    /// Member `i` of `pack`, through the pack's shared flight; `None` if the
    /// pack failed for it (the caller falls back to a plain GET).
    pub(super) async fn from_pack(self: &Arc<Self>, pack: Arc<PackEntry>, i: usize) -> Option<Bytes> {
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
}
