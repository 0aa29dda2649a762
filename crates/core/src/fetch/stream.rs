//! A pack's part as it streams in: one ranged GET's body cut into whole
//! members, decoded and verified a few segments at a time off the async
//! workers, written to the cache's copy of the pack in large writes, and
//! handed to its taker (a checkout's bulk consumer or a flight's readers).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use super::packs::{PackFlight, Sink, DECODE_BATCH_BYTES};
use super::Fetcher;
use crate::error::{Error, Result};
use crate::pack::{decode_member_owned, PackEntry};

/// Fetched bytes go to the cache file in writes of at least this many
/// bytes (or when the span ends).
const WRITE_BATCH_BYTES: usize = 1 << 20;
/// Segments being decoded at once, beyond which the download waits.
const DECODES_IN_FLIGHT: usize = 4;

/// A segment's members, decoded: (index, row, raw bytes or why not).
type Decoded = Vec<(usize, crate::pack::Member, std::result::Result<Bytes, String>)>;

/// Who takes the members of a span as they arrive.
#[derive(Clone, Copy)]
pub(super) enum Taker<'a> {
    /// A consumer of every member once, in pack order (a checkout):
    /// decoded in batches on blocking threads.
    Bulk,
    /// Readers, through their flight: each member decoded here as its
    /// bytes come in, the ones a reader waits for first.
    Readers(&'a PackFlight),
}

impl Fetcher {
    /// Fetches members `lo..=hi` of `pack` into the cache's copy of it,
    /// handing each to `sink`; a failure marks the pack bad (warned). The
    /// caller holds the pack's lock.
    /// Returns how many members verified and were handed over.
    pub(super) async fn fetch_span(
        &self,
        pack: &PackEntry,
        lo: usize,
        hi: usize,
        sink: Sink<'_>,
        taker: Taker<'_>,
    ) -> usize {
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
    pub(super) async fn stream_pack(
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
pub(super) enum Failed {
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
    use crate::hash::Hash;
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
