//! A counting wrapper for any [`ObjectStore`]: requests by kind, bytes each
//! way, and the number of *sequential* round trips.
//!
//! Sequential round trips are measured as the depth of a causal chain: a
//! request that starts after another has completed may depend on it, so its
//! depth is one more than the deepest request completed so far. Requests
//! issued together share a depth. Under any real latency, wall time is about
//! `round_trips × RTT`, which is what the brief's targets are written in.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};
use serde::{Deserialize, Serialize};

#[derive(Default, Debug)]
pub struct Counters {
    gets: AtomicU64,
    ranged_gets: AtomicU64,
    heads: AtomicU64,
    puts: AtomicU64,
    lists: AtomicU64,
    deletes: AtomicU64,
    copies: AtomicU64,
    bytes_down: AtomicU64,
    bytes_up: AtomicU64,
    max_done_depth: AtomicU64,
}

/// A point-in-time copy of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Whole-object GETs.
    pub gets: u64,
    /// GETs with a byte range.
    pub ranged_gets: u64,
    pub heads: u64,
    pub puts: u64,
    pub lists: u64,
    pub deletes: u64,
    pub copies: u64,
    pub bytes_down: u64,
    pub bytes_up: u64,
    /// Length of the longest chain of dependent requests.
    pub round_trips: u64,
}

impl Stats {
    /// All GETs, ranged or not.
    pub fn all_gets(&self) -> u64 {
        self.gets + self.ranged_gets
    }
    pub fn requests(&self) -> u64 {
        self.gets + self.ranged_gets + self.heads + self.puts + self.lists + self.deletes + self.copies
    }
    /// The requests made between `earlier` and `self`.
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            gets: self.gets - earlier.gets,
            ranged_gets: self.ranged_gets - earlier.ranged_gets,
            heads: self.heads - earlier.heads,
            puts: self.puts - earlier.puts,
            lists: self.lists - earlier.lists,
            deletes: self.deletes - earlier.deletes,
            copies: self.copies - earlier.copies,
            bytes_down: self.bytes_down - earlier.bytes_down,
            bytes_up: self.bytes_up - earlier.bytes_up,
            round_trips: self.round_trips - earlier.round_trips,
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} GETs ({} ranged), {} HEADs, {} PUTs, {} LISTs, {} B down, {} B up, {} sequential round trips",
            self.all_gets(),
            self.ranged_gets,
            self.heads,
            self.puts,
            self.lists,
            self.bytes_down,
            self.bytes_up,
            self.round_trips
        )
    }
}

impl Counters {
    pub fn stats(&self) -> Stats {
        Stats {
            gets: self.gets.load(Relaxed),
            ranged_gets: self.ranged_gets.load(Relaxed),
            heads: self.heads.load(Relaxed),
            puts: self.puts.load(Relaxed),
            lists: self.lists.load(Relaxed),
            deletes: self.deletes.load(Relaxed),
            copies: self.copies.load(Relaxed),
            bytes_down: self.bytes_down.load(Relaxed),
            bytes_up: self.bytes_up.load(Relaxed),
            round_trips: self.max_done_depth.load(Relaxed),
        }
    }

    fn start(self: &Arc<Self>) -> InFlight {
        InFlight { depth: self.max_done_depth.load(Relaxed) + 1, c: self.clone() }
    }

    /// [`Counters::start`], and under `MADO_TRACE_REQUESTS=1` a line on
    /// stderr naming the request and its round trip: how to see which
    /// requests an operation chains.
    fn start_traced(self: &Arc<Self>, kind: &str, location: &Path) -> InFlight {
        let f = self.start();
        tracing::debug!(round_trip = f.depth, "{kind} {location}");
        if *TRACE {
            let ms = TRACE_START.elapsed().as_millis();
            eprintln!("[store] round trip {:>3}: {kind} {location} (+{ms} ms)", f.depth);
        }
        f
    }
}

/// When the first traced request started (the trace's times count from it).
static TRACE_START: std::sync::LazyLock<std::time::Instant> = std::sync::LazyLock::new(std::time::Instant::now);

static TRACE: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var("MADO_TRACE_REQUESTS").as_deref() == Ok("1"));

impl Counters {}

/// One request in flight; its completion (drop) raises the finished depth.
struct InFlight {
    depth: u64,
    c: Arc<Counters>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.c.max_done_depth.fetch_max(self.depth, Relaxed);
    }
}

#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn ObjectStore>,
    counters: Arc<Counters>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn ObjectStore>, counters: Arc<Counters>) -> Self {
        CountingStore { inner, counters }
    }
}

impl fmt::Display for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CountingStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        crate::failpoint::hit("store-put");
        let _rt = self.counters.start_traced("PUT", location);
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters.bytes_up.fetch_add(payload.content_length() as u64, Relaxed);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        crate::failpoint::hit("store-put");
        let _rt = self.counters.start_traced("PUT (multipart)", location);
        self.counters.puts.fetch_add(1, Relaxed);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let kind = match (options.head, &options.range) {
            (true, _) => "HEAD",
            (false, Some(_)) => "GET (ranged)",
            (false, None) => "GET",
        };
        let _rt = self.counters.start_traced(kind, location);
        let counter = if options.head {
            &self.counters.heads
        } else if options.range.is_some() {
            &self.counters.ranged_gets
        } else {
            &self.counters.gets
        };
        counter.fetch_add(1, Relaxed);
        let head = options.head;
        let r = self.inner.get_opts(location, options).await?;
        if !head {
            self.counters.bytes_down.fetch_add(r.range.end - r.range.start, Relaxed);
        }
        Ok(r)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        // Each range is one ranged GET through `get_opts` above.
        let mut out = Vec::with_capacity(ranges.len());
        let futs = ranges.iter().map(|r| {
            let opts = GetOptions { range: Some(r.clone().into()), ..Default::default() };
            async move { self.get_opts(location, opts).await?.bytes().await }
        });
        for b in futures::future::join_all(futs).await {
            out.push(b?);
        }
        Ok(out)
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let c = self.counters.clone();
        let rt = self.counters.start();
        self.inner
            .delete_stream(locations)
            .inspect(move |r| {
                let _ = &rt;
                if r.is_ok() {
                    c.deletes.fetch_add(1, Relaxed);
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counted_list(self.inner.list(prefix), prefix)
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counted_list(self.inner.list_with_offset(prefix, offset), prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let _rt = self.counters.start_traced("LIST", prefix.unwrap_or(&Path::default()));
        self.counters.lists.fetch_add(1, Relaxed);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let _rt = self.counters.start();
        self.counters.copies.fetch_add(1, Relaxed);
        self.inner.copy_opts(from, to, options).await
    }
}

use bytes::Bytes;

/// Number of keys a LIST page returns on S3; one more LIST per page.
const LIST_PAGE: u64 = 1000;

impl CountingStore {
    fn counted_list(
        &self,
        s: BoxStream<'static, Result<ObjectMeta>>,
        prefix: Option<&Path>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let c = self.counters.clone();
        c.lists.fetch_add(1, Relaxed);
        let mut rt = Some(c.start_traced("LIST", prefix.unwrap_or(&Path::default())));
        let mut seen = 0u64;
        s.inspect(move |_| {
            seen += 1;
            if seen.is_multiple_of(LIST_PAGE) {
                // The next page is a new request that depends on this one.
                drop(rt.take());
                c.lists.fetch_add(1, Relaxed);
                rt = Some(c.start());
            }
        })
        .boxed()
    }
}
