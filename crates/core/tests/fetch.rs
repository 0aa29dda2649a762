//! The fetcher over a real local store with an injected delay: concurrent
//! reads of one object collapse into one GET, and later reads are cache hits.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::store::{OpenOptions, Remote, Space};
use mado_core::Hash;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reads_of_one_object_make_one_get() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(50)) }).unwrap());
    let data = Bytes::from_static(b"shared by many readers");
    let id = Hash::of(&data);
    remote.put_object(Space::Objects, &id, data.clone()).await.unwrap();
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    let before = remote.stats();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move { f.get(Space::Objects, id, "blob").await.unwrap() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), data);
    }
    assert_eq!(remote.stats().since(&before).gets, 1);
    // Now cached: no request at all.
    f.get(Space::Objects, id, "blob").await.unwrap();
    assert_eq!(remote.stats().since(&before).gets, 1);
}

#[tokio::test]
async fn a_missing_object_is_reported_to_every_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(20)) }).unwrap());
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote, cache);
    let id = Hash([3; 32]);
    let (a, b) = tokio::join!(f.get(Space::Objects, id, "blob"), f.get(Space::Objects, id, "blob"));
    for r in [a, b] {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(&id.to_hex()) && e.contains("not found"), "{e}");
    }
}

/// A server that answers with garbage once: the read fails naming the
/// object, nothing bad is cached, and the next read gets the real bytes.
#[tokio::test]
async fn garbage_from_the_server_is_refused_and_never_cached() {
    use mado_core::store::fault::{Failure, Fault, FaultStore, Op};
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultStore::new(Arc::new(object_store::memory::InMemory::new())));
    let remote = Arc::new(Remote::from_store("memory://garbage", faults.clone()));
    let data = Bytes::from_static(b"the real content");
    let id = Hash::of(&data);
    remote.put_object(Space::Objects, &id, data.clone()).await.unwrap();
    faults.add(Fault {
        op: Op::Get,
        key_contains: id.to_hex(),
        times: 1,
        failure: Failure::Garbage(b"<html>502 Bad Gateway</html>".to_vec()),
    });
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote, cache.clone());
    let e = f.get(Space::Objects, id, "blob").await.unwrap_err();
    assert!(matches!(e, mado_core::Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains(&id.to_hex()), "{e}");
    assert!(!cache.contains(&id), "garbage reached the cache");
    assert_eq!(faults.pending(), 0);
    assert_eq!(f.get(Space::Objects, id, "blob").await.unwrap(), data);
    assert!(cache.contains(&id));
}

/// A connection that breaks on a GET: an error naming the key and the
/// store, and a retry that works.
#[tokio::test]
async fn a_broken_connection_is_an_error_naming_the_object_and_a_retry_works() {
    use mado_core::store::fault::{Failure, Fault, FaultStore, Op};
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultStore::new(Arc::new(object_store::memory::InMemory::new())));
    let remote = Arc::new(Remote::from_store("memory://broken", faults.clone()));
    let data = Bytes::from_static(b"content behind a flaky link");
    let id = Hash::of(&data);
    remote.put_object(Space::Objects, &id, data.clone()).await.unwrap();
    faults.add(Fault { op: Op::Get, key_contains: String::new(), times: 1, failure: Failure::Error });
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote, cache);
    let e = f.get(Space::Objects, id, "blob").await.unwrap_err().to_string();
    assert!(e.contains(&id.to_hex()) && e.contains("memory://broken"), "{e}");
    assert_eq!(f.get(Space::Objects, id, "blob").await.unwrap(), data);
}

/// A pack whose GET fails as the store goes away (a broken connection, not
/// a missing or corrupt pack) is not given up on: once the store answers
/// again, the next read of a member gets it from the pack. (A mount kept
/// answering EIO for every file read during an outage: the pack was
/// remembered as bad, and a packs-only store has no object alone to read.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_that_failed_while_the_store_was_away_is_read_once_it_is_back() {
    use mado_core::pack::{build_pack, MemberKind, Mode, PackIndex};
    use mado_core::store::fault::{Failure, Fault, FaultStore, Op};
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultStore::new(Arc::new(object_store::memory::InMemory::new())));
    let remote = Arc::new(Remote::from_store("memory://outage", faults.clone()));
    let raws = noise(0x9e37_79b9_7f4a_7c15, 8, 4 << 10);
    let members: Vec<(Hash, MemberKind, &[u8])> =
        raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
    let (bytes, entry) = build_pack(&members);
    let pack = entry.id;
    remote.put_pack(&pack, Bytes::from(bytes)).await.unwrap();
    let tree = Hash([9; 32]);
    let idx = PackIndex {
        tree,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![entry],
        trees: vec![],
        base: vec![],
        deltas: vec![],
    };
    remote.put_index(&tree, Bytes::from(idx.encode())).await.unwrap();
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    f.attach(tree).await.unwrap();
    // Every GET fails while the store is away: the pack's, then the
    // member's alone (which a packs-only store does not have anyway).
    faults.add(Fault { op: Op::Get, key_contains: String::new(), times: 2, failure: Failure::Error });
    let id = Hash::of(&raws[3]);
    assert!(f.get(Space::Objects, id, "blob").await.is_err());
    f.drain().await;
    assert_eq!(faults.pending(), 0, "both GETs were tried");
    // Back: the pack is read again.
    assert_eq!(f.get(Space::Objects, id, "blob").await.unwrap(), raws[3]);
    assert_eq!(f.get(Space::Objects, Hash::of(&raws[5]), "blob").await.unwrap(), raws[5]);
    assert_eq!(f.stats().packs_missing, 0, "not taken for a swept pack");
}

/// A reader whose member sits far into a cold pack starts the pack's ranged
/// GET at its own member (it does not wait for the bytes before it); the
/// members before it come in a flight of their own when asked for, and
/// every member is then in the cache: another reader makes no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_read_far_into_a_pack_is_fetched_from_its_own_offset() {
    use mado_core::pack::{build_pack, MemberKind, Mode, PackIndex};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(40)) }).unwrap());
    let raws = noise(0x2545_f491_4f6c_dd1d, 64, 128 << 10);
    let members: Vec<(Hash, MemberKind, &[u8])> =
        raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
    let (bytes, entry) = build_pack(&members);
    let size = bytes.len() as u64;
    remote.put_pack(&entry.id, Bytes::from(bytes)).await.unwrap();
    let tree = Hash([7; 32]);
    let idx = PackIndex {
        tree,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![entry],
        trees: vec![],
        base: vec![],
        deltas: vec![],
    };
    remote.put_index(&tree, Bytes::from(idx.encode())).await.unwrap();

    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    f.attach(tree).await.unwrap();
    let before = remote.stats();
    assert_eq!(f.get(Space::Objects, Hash::of(&raws[60]), "blob").await.unwrap(), raws[60]);
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets, 1, "{d:?}");
    assert!(d.bytes_down * 4 < size, "from (about) member 60 on, not the whole pack: {d:?}");
    assert_eq!(f.stats().split_fetches, 1);
    // The rest, when asked for, in one more ranged GET.
    for r in &raws {
        assert_eq!(&f.get(Space::Objects, Hash::of(r), "blob").await.unwrap()[..], &r[..]);
    }
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets, 2, "{d:?}");
    assert!(d.bytes_down < size + size / 8, "no byte twice: {d:?}");
    // All of it is in the cache: another reader makes no request.
    let g = Fetcher::new(remote.clone(), cache);
    g.attach(tree).await.unwrap();
    let before = remote.stats();
    for r in &raws {
        assert_eq!(&g.get(Space::Objects, Hash::of(r), "blob").await.unwrap()[..], &r[..]);
    }
    assert_eq!(remote.stats().since(&before).gets + remote.stats().since(&before).ranged_gets, 0);
}

/// `n` buffers of `len` pseudo-random (incompressible) bytes: one stream
/// from `seed`, cut in pieces.
fn noise(seed: u64, n: usize, len: usize) -> Vec<Vec<u8>> {
    common::noise_bytes(seed, n * len).chunks(len).map(<[u8]>::to_vec).collect()
}

/// A pack of `n` members of pseudo-random bytes (incompressible), stored
/// with the index of tree `tree`; a byte of member `spoil` flipped if given.
async fn stored_pack(
    remote: &Remote,
    n: usize,
    tree: Hash,
    spoil: Option<usize>,
) -> (Vec<Vec<u8>>, mado_core::pack::PackEntry) {
    use mado_core::pack::{build_pack, MemberKind};
    let raws = noise(0x9e37_79b9_7f4a_7c15, n, 32 << 10);
    let members: Vec<(Hash, MemberKind, &[u8])> =
        raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
    let (mut bytes, entry) = build_pack(&members);
    if let Some(i) = spoil {
        bytes[entry.members[i].offset as usize + 100] ^= 1;
    }
    remote.put_pack(&entry.id, Bytes::from(bytes)).await.unwrap();
    index_of_one_pack(remote, tree, &entry).await;
    (raws, entry)
}

/// Stores the index of tree `tree` as one pack, `entry`.
async fn index_of_one_pack(remote: &Remote, tree: Hash, entry: &mado_core::pack::PackEntry) {
    use mado_core::pack::{Mode, PackIndex};
    let idx = PackIndex {
        tree,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![entry.clone()],
        trees: vec![],
        base: vec![],
        deltas: vec![],
    };
    remote.put_index(&tree, Bytes::from(idx.encode())).await.unwrap();
}

/// A large file's pack: `n` chunks of `len` pseudo-random bytes (from
/// `seed`), stored with the index of tree `tree`.
async fn stored_chunks(
    remote: &Remote,
    seed: u64,
    n: usize,
    len: usize,
    tree: Hash,
) -> (Vec<Vec<u8>>, mado_core::pack::PackEntry) {
    use mado_core::pack::{build_pack, MemberKind};
    let raws = noise(seed, n, len);
    let members: Vec<(Hash, MemberKind, &[u8])> =
        raws.iter().map(|r| (Hash::of(r), MemberKind::Chunk, &r[..])).collect();
    let (bytes, entry) = build_pack(&members);
    remote.put_pack(&entry.id, Bytes::from(bytes)).await.unwrap();
    index_of_one_pack(remote, tree, &entry).await;
    (raws, entry)
}

type Got = Arc<std::sync::Mutex<Vec<(usize, Option<Bytes>)>>>;

fn collecting(got: &Got) -> impl FnMut(usize, Option<Bytes>) -> Option<futures::future::BoxFuture<'static, ()>> + Send {
    let got = got.clone();
    move |i, b| {
        got.lock().unwrap().push((i, b));
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_span_hands_each_member_once_in_order_and_fills_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(20)) }).unwrap());
    let tree = Hash([9; 32]);
    let (raws, _) = stored_pack(&remote, 200, tree, None).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    f.attach(tree).await.unwrap();
    let wanted: std::collections::HashSet<Hash> = raws[20..150].iter().map(|r| Hash::of(r)).collect();
    let spans = f.pack_spans(&wanted);
    assert_eq!(spans.len(), 1);
    let (pack, lo, hi) = spans[0].clone();
    assert_eq!((lo, hi), (20, 149), "from the first wanted member to the last");
    let before = remote.stats();
    let got: Got = Default::default();
    let mut sink = collecting(&got);
    // A reader of a member in the span meanwhile waits for the stream and
    // is served from the cache: no request of its own.
    let (ran, other) = tokio::join!(f.stream_members(&pack, lo, hi, &mut sink), async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        f.get(Space::Objects, Hash::of(&raws[100]), "blob").await.unwrap()
    });
    assert!(ran);
    assert_eq!(other, raws[100]);
    let got = std::mem::take(&mut *got.lock().unwrap());
    assert_eq!(got.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (20..150).collect::<Vec<_>>());
    for (i, b) in &got {
        assert_eq!(b.as_deref(), Some(&raws[*i][..]), "member {i}");
    }
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 1, "one ranged GET for the span: {d:?}");
    assert!(d.bytes_down < 131 * (32 << 10), "the span only: {d:?}");
    // Recorded in the cache: a pack with a record is not streamed again,
    // and another fetcher reads the span with no request.
    assert!(f.pack_spans(&wanted).is_empty());
    let g = Fetcher::new(remote.clone(), cache);
    g.attach(tree).await.unwrap();
    let before = remote.stats();
    for r in &raws[20..150] {
        assert_eq!(&g.get(Space::Objects, Hash::of(r), "blob").await.unwrap()[..], &r[..]);
    }
    let d = remote.stats().since(&before);
    assert_eq!(d.gets + d.ranged_gets, 0, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_member_in_a_streamed_span_is_named_and_its_pack_is_not_trusted_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: None }).unwrap());
    let tree = Hash([8; 32]);
    let (raws, entry) = stored_pack(&remote, 40, tree, Some(17)).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    f.attach(tree).await.unwrap();
    let all: std::collections::HashSet<Hash> = raws.iter().map(|r| Hash::of(r)).collect();
    let (pack, lo, hi) = f.pack_spans(&all)[0].clone();
    let got: Got = Default::default();
    let mut sink = collecting(&got);
    assert!(f.stream_members(&pack, lo, hi, &mut sink).await);
    let got = std::mem::take(&mut *got.lock().unwrap());
    assert_eq!(got.len(), 40, "every member handed over once");
    for (i, b) in &got {
        match i {
            17 => assert!(b.is_none(), "the bad member is never handed over"),
            _ => assert_eq!(b.as_deref(), Some(&raws[*i][..])),
        }
    }
    let warnings = f.take_warnings().join("\n");
    assert!(warnings.contains(&entry.members[17].id.to_string()), "{warnings}");
    assert_eq!(f.stats().pack_failures, 1);
    // Not streamed again, and nothing of it was recorded in the cache: the
    // bad member's bytes can only come from elsewhere (here, nowhere).
    assert!(f.pack_spans(&all).is_empty());
    assert!(!cache.pack_recorded(&entry.id));
    assert!(f.get(Space::Objects, Hash::of(&raws[17]), "blob").await.is_err());
}

#[tokio::test]
async fn a_pack_mostly_cached_loose_is_not_streamed_and_a_span_skips_what_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: None }).unwrap());
    let tree = Hash([6; 32]);
    let (raws, _) = stored_pack(&remote, 40, tree, None).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    // Members 0..30 are in the cache loose (as an import staging there, or
    // per-member fetches, leave them).
    for r in &raws[..30] {
        cache.put(&Hash::of(r), r).unwrap();
    }
    let f = Fetcher::new(remote.clone(), cache);
    f.attach(tree).await.unwrap();
    let ids = |rs: &[Vec<u8>]| rs.iter().map(|r| Hash::of(r)).collect::<std::collections::HashSet<Hash>>();
    // 10 missing against 30 cached: read member by member, not streamed.
    assert!(f.pack_spans(&ids(&raws)).is_empty());
    // 10 missing against 5 cached: streamed, over the missing ones only.
    let spans = f.pack_spans(&ids(&raws[25..]));
    assert_eq!(spans.iter().map(|(_, lo, hi)| (*lo, *hi)).collect::<Vec<_>>(), vec![(30, 39)]);
    // Nothing missing: nothing to stream.
    assert!(f.pack_spans(&ids(&raws[..5])).is_empty());
}

#[tokio::test]
async fn stream_members_refuses_a_span_outside_its_pack_or_of_a_failed_pack_and_takes_one_member() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: None }).unwrap());
    let (good_tree, bad_tree) = (Hash([5; 32]), Hash([4; 32]));
    let (raws, _) = stored_pack(&remote, 8, good_tree, None).await;
    let f = Fetcher::new(remote.clone(), Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap()));
    f.attach(good_tree).await.unwrap();
    let all: std::collections::HashSet<Hash> = raws.iter().map(|r| Hash::of(r)).collect();
    let (pack, _, _) = f.pack_spans(&all)[0].clone();
    let got: Got = Default::default();
    let mut sink = collecting(&got);
    assert!(!f.stream_members(&pack, 5, 4, &mut sink).await, "lo after hi");
    assert!(!f.stream_members(&pack, 0, 8, &mut sink).await, "hi past the last member");
    assert!(got.lock().unwrap().is_empty());
    // One member alone is a span.
    assert!(f.stream_members(&pack, 3, 3, &mut sink).await);
    assert_eq!(got.lock().unwrap().iter().map(|(i, b)| (*i, b.is_some())).collect::<Vec<_>>(), vec![(3, true)]);
    // A pack that failed is not streamed again.
    let (bad_raws, _) = stored_pack(&remote, 8, bad_tree, Some(2)).await;
    let g = Fetcher::new(remote.clone(), Arc::new(DiskCache::open(dir.path().join("cache2"), None).unwrap()));
    g.attach(bad_tree).await.unwrap();
    let bad_ids: std::collections::HashSet<Hash> = bad_raws.iter().map(|r| Hash::of(r)).collect();
    let (bad, lo, hi) = g.pack_spans(&bad_ids)[0].clone();
    assert!(g.stream_members(&bad, lo, hi, &mut sink).await);
    assert!(!g.stream_members(&bad, 0, 0, &mut sink).await, "a failed pack");
}

/// A large file's pack (chunks only): a random reader of a chunk fetches
/// that member's bytes alone; a reader in order (`get_in_order`) fetches
/// from its chunk to the end of the pack in one ranged GET, and the chunks
/// after it come with no request of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chunk_read_at_random_fetches_itself_and_one_in_order_the_rest_of_its_pack() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(10)) }).unwrap());
    let len = 64 << 10;
    let tree = Hash([5; 32]);
    let (raws, _) = stored_chunks(&remote, 0x1234_5678_9abc_def1, 16, len, tree).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    f.attach(tree).await.unwrap();

    // At random: chunk 3, then chunk 9, each its own bytes only.
    for (k, i) in [3usize, 9].into_iter().enumerate() {
        let before = remote.stats();
        assert_eq!(f.get(Space::Objects, Hash::of(&raws[i]), "chunk").await.unwrap(), raws[i]);
        f.drain().await;
        let d = remote.stats().since(&before);
        assert_eq!(d.ranged_gets + d.gets, 1, "random read {k}: {d:?}");
        assert_eq!(d.bytes_down, len as u64, "random read {k}: one member's bytes: {d:?}");
    }
    // In order from chunk 5: one GET from 5 to the end (less what the
    // cache holds at that end: nothing here), and 6.. come with it.
    let before = remote.stats();
    for (i, r) in raws.iter().enumerate().skip(5) {
        assert_eq!(f.get_in_order(Hash::of(r), "chunk").await.unwrap(), r[..], "chunk {i}");
    }
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 1, "{d:?}");
    assert_eq!(d.bytes_down, 11 * len as u64, "chunks 5 to 15: {d:?}");
    // What came is in the cache: another fetcher reads it with no request.
    let g = Fetcher::new(remote.clone(), cache);
    g.attach(tree).await.unwrap();
    let before = remote.stats();
    for i in [3usize, 5, 9, 12, 15] {
        assert_eq!(g.get(Space::Objects, Hash::of(&raws[i]), "chunk").await.unwrap(), raws[i]);
    }
    let d = remote.stats().since(&before);
    assert_eq!(d.gets + d.ranged_gets, 0, "{d:?}");
}

/// Readers in order of a pack's chunks 7 and 2 asking at once, 7 first
/// (a read-ahead's later chunk reaching the fetcher before the reader's
/// own): the one download starts at chunk 2 and brings both, in one GET.
/// Started at chunk 7 it left chunk 2's reader waiting for the whole
/// download, then a second GET for chunks 2 to 6.
#[tokio::test(flavor = "current_thread")]
async fn a_later_chunk_asked_first_does_not_leave_the_earlier_one_a_second_get() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(10)) }).unwrap());
    let len = 64 << 10;
    let tree = Hash([8; 32]);
    let (raws, _) = stored_chunks(&remote, 0x5eed_0f0a_0b0c_0d0e, 12, len, tree).await;
    let f = Fetcher::new(remote.clone(), Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap()));
    f.attach(tree).await.unwrap();
    let before = remote.stats();
    // One thread: both reach the fetcher before its download task runs.
    let (late, early) =
        tokio::join!(f.get_in_order(Hash::of(&raws[7]), "chunk"), f.get_in_order(Hash::of(&raws[2]), "chunk"));
    assert_eq!((late.unwrap(), early.unwrap()), (Bytes::from(raws[7].clone()), Bytes::from(raws[2].clone())));
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 1, "{d:?}");
    assert_eq!(d.bytes_down, 10 * len as u64, "chunks 2 to 11: {d:?}");
}

/// Many random readers of different chunks of one pack at once (a pack's
/// flights run one at a time, each bringing one chunk): every reader gets
/// its chunk through the pack, however many flights ran before its own.
/// The chunks are not stored alone (packs-first), so a reader that gave
/// up on the pack would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_random_readers_of_one_pack_all_get_their_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(5)) }).unwrap());
    let tree = Hash([6; 32]);
    let (raws, _) = stored_chunks(&remote, 0x0bad_cafe_f00d_1234, 24, 16 << 10, tree).await;
    // Rounds with a fresh cache each: the races are between flights.
    for round in 0..12 {
        let cache = Arc::new(DiskCache::open(dir.path().join(format!("cache{round}")), None).unwrap());
        let f = Fetcher::new(remote.clone(), cache);
        f.attach(tree).await.unwrap();
        let before = remote.stats();
        let reads = raws.iter().map(|r| {
            let f = f.clone();
            async move { f.get(Space::Objects, Hash::of(r), "chunk").await }
        });
        let got = futures::future::join_all(reads).await;
        f.drain().await;
        // The first reader's flight brings its chunk; the next one, every
        // chunk the first left its readers waiting for (a stray reader
        // that came after may need a third): not a GET per reader.
        let d = remote.stats().since(&before);
        assert!(d.ranged_gets + d.gets <= 3, "round {round}: {d:?}");
        let warnings = f.take_warnings();
        for (i, (g, r)) in got.iter().zip(&raws).enumerate() {
            let g = g.as_ref().map(|b| &b[..]).map_err(|e| e.to_string());
            assert!(g == Ok(&r[..]), "round {round}, chunk {i}: {:?}; {warnings:?}", g.err());
        }
        assert!(warnings.is_empty(), "{warnings:?}");
    }
}

/// A pack the cache holds mostly loose (no record of the pack itself): a
/// read of a member it lacks fetches that member's bytes alone, not the
/// pack. A pack the cache holds nothing of: the read starts the pack's
/// flight (from near the member on).
#[tokio::test]
async fn a_member_missing_from_a_pack_cached_loose_is_read_alone() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    let tree = Hash([8; 32]);
    let (raws, _) = stored_pack(&remote, 64, tree, None).await;
    let len = raws[0].len() as u64;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    for (i, r) in raws.iter().enumerate() {
        if i % 10 != 3 {
            cache.put(&Hash::of(r), r).unwrap();
        }
    }
    let f = Fetcher::new(remote.clone(), cache);
    f.attach(tree).await.unwrap();
    let before = remote.stats();
    assert_eq!(f.get(Space::Objects, Hash::of(&raws[33]), "blob").await.unwrap(), raws[33]);
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 1, "{d:?}");
    assert_eq!(d.bytes_down, len, "one member's bytes: {d:?}");

    let cold = Arc::new(DiskCache::open(dir.path().join("cold"), None).unwrap());
    let g = Fetcher::new(remote.clone(), cold);
    g.attach(tree).await.unwrap();
    let before = remote.stats();
    assert_eq!(g.get(Space::Objects, Hash::of(&raws[33]), "blob").await.unwrap(), raws[33]);
    g.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 1, "{d:?}");
    // Member 33 sits over 512 KiB into the pack: the flight starts near
    // it and runs to the pack's end.
    assert!(d.bytes_down >= (64 - 33) * len && d.bytes_down < 60 * len, "the pack's flight, from near 33: {d:?}");
    assert_eq!(g.stats().split_fetches, 1);
}

/// The members a split flight left out come in one flight more, however
/// much of the pack the split flight brought: once it brought most of it,
/// the pack read as "mostly cached", and each member before the split was
/// fetched by a ranged GET of its own (four readers of a mount at spread
/// offsets of a 1,000-file directory made 85 GETs, one round trip each,
/// where one pack flight had served them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_a_split_flight_left_out_comes_in_one_more_flight_however_much_it_brought() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    let tree = Hash([6; 32]);
    let (raws, _) = stored_pack(&remote, 64, tree, None).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    f.attach(tree).await.unwrap();
    let before = remote.stats();
    // Member 20 sits over 512 KiB in: the flight starts near it and brings
    // the rest of the pack, most of it.
    assert_eq!(f.get(Space::Objects, Hash::of(&raws[20]), "blob").await.unwrap(), raws[20]);
    f.drain().await;
    assert_eq!(f.stats().split_fetches, 1);
    // The members before it, one reader after another, no flight running.
    for r in &raws[..20] {
        assert_eq!(&f.get(Space::Objects, Hash::of(r), "blob").await.unwrap()[..], &r[..]);
        f.drain().await;
    }
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 2, "the split flight and one for what it left out: {d:?}");
}

/// A member the split flight did not leave out, gone from the cache since
/// (the pack's copy healed away): its reader starts a flight of its own,
/// not first the one over what the split left out.
#[tokio::test]
async fn a_reader_past_the_split_point_does_not_fetch_what_the_split_left_out_first() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    let tree = Hash([7; 32]);
    let (raws, entry) = stored_pack(&remote, 64, tree, None).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    f.attach(tree).await.unwrap();
    assert_eq!(f.get(Space::Objects, Hash::of(&raws[20]), "blob").await.unwrap(), raws[20]);
    f.drain().await;
    assert_eq!(f.stats().split_fetches, 1);
    std::fs::remove_file(cache.pack_have_path(&entry.id)).unwrap();
    std::fs::remove_file(cache.pack_data_path(&entry.id)).unwrap();
    cache.shed();
    let before = remote.stats();
    assert_eq!(f.get(Space::Objects, Hash::of(&raws[40]), "blob").await.unwrap(), raws[40]);
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 1, "member 40's own flight only: {d:?}");
    assert!(d.bytes_down < 30 * (32 << 10), "not the members before the split point: {d:?}");
}

/// A pack the cache holds most of, with holes (flights that each covered
/// a directory's files, as a `find` over a mount starts them): the
/// readers of a hole's files, one after another, cost one GET per hole,
/// not one per file (a new user's `find` then `cat` of every file of a
/// 10k-file tree made 1,958 ranged GETs, 23 s on loopback).
#[tokio::test]
async fn the_readers_of_a_hole_in_a_mostly_cached_pack_cost_one_get_for_the_hole() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    let tree = Hash([9; 32]);
    let (raws, _) = stored_pack(&remote, 64, tree, None).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    f.attach(tree).await.unwrap();
    let all: std::collections::HashSet<Hash> = raws.iter().map(|r| Hash::of(r)).collect();
    let (pack, _, _) = f.pack_spans(&all)[0].clone();
    // The cache's copy of the pack as three flights would have left it.
    let w = f.cache.pack_writer(&pack.id).unwrap();
    for (lo, hi) in [(0, 19), (24, 43), (48, 63)] {
        let (a, b) = (pack.members[lo].offset, pack.members[hi].offset + pack.members[hi].stored_len);
        w.write_at(&f.cache, a, &remote.pack_range(&pack.id, a..b).await.unwrap()).unwrap();
        w.commit(&f.cache, &pack.members[lo..=hi]).unwrap();
    }
    let before = remote.stats();
    for r in raws[20..24].iter().chain(&raws[44..48]) {
        assert_eq!(&f.get(Space::Objects, Hash::of(r), "blob").await.unwrap()[..], &r[..]);
        f.drain().await;
    }
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 2, "a GET for each hole: {d:?}");
    assert_eq!(d.bytes_down, 8 * pack.members[20].stored_len, "the holes' members only: {d:?}");
}

/// A walk that wants part of a pack brings only that part when it is
/// under half of the pack's member bytes (its header not counted), and the
/// whole pack (one GET either way) when it is at least half: here the
/// wanted member is a little over half, by less than the header's length.
#[tokio::test]
async fn a_wanted_span_of_half_the_packs_members_brings_the_whole_pack() {
    use mado_core::pack::{build_pack, MemberKind};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    let build = |extra: usize| {
        let raws = vec![common::noise_bytes(0x1111, (64 << 10) + extra), common::noise_bytes(0x2222, 64 << 10)];
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        let (bytes, entry) = build_pack(&members);
        (raws, bytes, entry)
    };
    let header = build(0).2.header_len as usize;
    let (raws, bytes, entry) = build(header / 2);
    let (a, b) = (entry.members[0].stored_len, entry.members[1].stored_len);
    assert!(a >= b && a < b + entry.header_len && entry.size - entry.header_len == a + b, "{entry:?}");
    remote.put_pack(&entry.id, Bytes::from(bytes)).await.unwrap();
    let tree = Hash([3; 32]);
    index_of_one_pack(&remote, tree, &entry).await;
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    f.attach(tree).await.unwrap();
    let before = remote.stats();
    f.want(Some([Hash::of(&raws[0])].into_iter().collect()));
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!((d.ranged_gets + d.gets, d.bytes_down), (1, a + b), "{d:?}");
    assert!(cache.pack_has(&entry.id, &Hash::of(&raws[1])));
}

/// Run packs (a large file's) download a few at a time: ten large files
/// read at once start ten flights, but their GETs go out four by four
/// (three round trips, not one), so the members a flight keeps until its
/// pack has arrived stay bounded however many large files are read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_packs_download_a_few_at_a_time() {
    use mado_core::pack::{build_pack, is_run_pack, MemberKind, Mode, PackIndex};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(10)) }).unwrap());
    let mut packs = Vec::new();
    let mut firsts = Vec::new();
    for p in 0..10u64 {
        let raws = noise(0x5151_0000 + p, 4, 32 << 10);
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Chunk, &r[..])).collect();
        let (bytes, entry) = build_pack(&members);
        assert!(is_run_pack(&entry));
        remote.put_pack(&entry.id, Bytes::from(bytes)).await.unwrap();
        packs.push(entry);
        firsts.push(raws[0].clone());
    }
    let tree = Hash([4; 32]);
    let idx = PackIndex { tree, mode: Mode::Recursive, dirs: 1, packs, trees: vec![], base: vec![], deltas: vec![] };
    remote.put_index(&tree, Bytes::from(idx.encode())).await.unwrap();
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    f.attach(tree).await.unwrap();
    let before = remote.stats();
    let reads = firsts.iter().map(|r| {
        let f = f.clone();
        async move { f.get_in_order(Hash::of(r), "chunk").await }
    });
    let got = futures::future::join_all(reads).await;
    for (g, r) in got.iter().zip(&firsts) {
        assert_eq!(g.as_ref().unwrap()[..], r[..]);
    }
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 10, "{d:?}");
    assert_eq!(d.round_trips, 3, "four at a time: {d:?}");
}

/// `member_of` (a delta build folding in a pack this fetcher never
/// attached): a member by id, `None` for an id the pack lacks, and a
/// large file's chunks read one after the other cost one GET: the first
/// chunk's flight runs to the end of the pack.
#[tokio::test]
async fn member_of_reads_a_packs_chunks_in_one_get() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    // Its index is stored too, but this fetcher never attaches it.
    let (raws, entry) = stored_chunks(&remote, 0x7777_1234_abcd_0001, 12, 32 << 10, Hash([2; 32])).await;
    let pack = Arc::new(entry);
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    assert!(f.member_of(pack.clone(), &Hash([3; 32])).await.is_none(), "not in the pack");
    let before = remote.stats();
    for r in &raws[2..] {
        assert_eq!(f.member_of(pack.clone(), &Hash::of(r)).await.as_deref(), Some(&r[..]));
    }
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!(d.ranged_gets + d.gets, 1, "{d:?}");
    assert_eq!(d.bytes_down, 10 * (32 << 10), "chunks 2 to 11: {d:?}");
}

/// `Fetcher::warm` (a mount's directory listing) starts the pack a cold
/// read of a small file would fetch, one pack at a time (a flight holds
/// its members in memory), and never for a cached member, an object in no
/// pack, or a large file's chunk; what it brought is read with no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn warm_starts_one_small_files_pack_at_a_time() {
    use mado_core::pack::{build_pack, MemberKind, Mode, PackIndex};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(50)) }).unwrap());
    let mut packs = Vec::new();
    let mut raws = Vec::new();
    for (seed, kind) in [(11u64, MemberKind::Blob), (12, MemberKind::Blob), (13, MemberKind::Chunk)] {
        let r = noise(seed, 8, 4 << 10);
        let members: Vec<(Hash, MemberKind, &[u8])> = r.iter().map(|b| (Hash::of(b), kind, &b[..])).collect();
        let (bytes, entry) = build_pack(&members);
        remote.put_pack(&entry.id, Bytes::from(bytes)).await.unwrap();
        packs.push(entry);
        raws.push(r);
    }
    let tree = Hash([9; 32]);
    let idx = PackIndex { tree, mode: Mode::Recursive, dirs: 1, packs, trees: vec![], base: vec![], deltas: vec![] };
    remote.put_index(&tree, Bytes::from(idx.encode())).await.unwrap();
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    f.attach(tree).await.unwrap();
    let id = |p: usize, i: usize| Hash::of(&raws[p][i]);
    let before = remote.stats();
    assert!(!f.warm(&Hash([1; 32])), "an object in no pack");
    // One member of the second pack cached loose (the pack is not).
    cache.put(&id(1, 2), &raws[1][2]).unwrap();
    assert!(!f.warm(&id(1, 2)), "a member the cache holds");
    assert!(!f.warm(&id(2, 0)), "a large file's chunk");
    assert!(f.warm(&id(0, 3)));
    assert!(!f.warm(&id(1, 0)), "a second pack while the first downloads");
    assert!(!f.warm(&id(0, 4)), "the same pack again");
    f.drain().await;
    assert_eq!(remote.stats().since(&before).ranged_gets, 1);
    assert!(!f.warm(&id(0, 5)), "a cached pack");
    assert!(f.warm(&id(1, 0)), "once the first has arrived");
    f.drain().await;
    let d = remote.stats().since(&before);
    assert_eq!((d.ranged_gets, d.gets), (2, 0), "{d:?}");
    assert_eq!(f.stats().warmed_packs, 2);
    for (p, i) in [(0, 0), (0, 7), (1, 3)] {
        assert_eq!(f.get(Space::Objects, id(p, i), "blob").await.unwrap(), raws[p][i]);
    }
    assert_eq!(remote.stats().since(&before).ranged_gets, 2, "read with no request");
}

/// A large file from two packs, the first pack's GET held (a slow server,
/// or a request queued behind a connection's handshake): `write_content`
/// writes the second pack's chunks at their offsets meanwhile. It used to
/// take the chunks in file order only, so a chunk that came early waited
/// behind the ones before it, and the window of chunks asked for stood
/// still while it waited (issue #19). Once the first pack is let go the
/// file is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_file_is_written_as_its_chunks_arrive_whatever_their_order() {
    use mado_core::object::{ChunkManifest, Entry, Kind};
    use mado_core::pack::{build_pack, MemberKind, Mode, PackIndex};
    use mado_core::store::fault::{Failure, Fault, FaultStore, Op};
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultStore::new(Arc::new(object_store::memory::InMemory::new())));
    let remote = Arc::new(Remote::from_store("memory://held", faults.clone()));
    let len = 64 << 10;
    let raws = noise(0x7777_1234_abcd_0001, 16, len);
    let whole = raws.concat();
    let manifest = ChunkManifest {
        size: whole.len() as u64,
        content: Some(Hash::of(&whole)),
        chunks: raws.iter().map(|r| (len as u64, Some(Hash::of(r)))).collect(),
    }
    .encode();
    let mid = Hash::of(&manifest);
    remote.put_object(Space::Objects, &mid, Bytes::from(manifest)).await.unwrap();
    let mut packs = Vec::new();
    for half in [&raws[..8], &raws[8..]] {
        let members: Vec<(Hash, MemberKind, &[u8])> =
            half.iter().map(|r| (Hash::of(r), MemberKind::Chunk, &r[..])).collect();
        let (bytes, entry) = build_pack(&members);
        remote.put_pack(&entry.id, Bytes::from(bytes)).await.unwrap();
        packs.push(entry);
    }
    let tree = Hash([7; 32]);
    let idx = PackIndex {
        tree,
        mode: Mode::Recursive,
        dirs: 1,
        packs: packs.clone(),
        trees: vec![],
        base: vec![],
        deltas: vec![],
    };
    remote.put_index(&tree, Bytes::from(idx.encode())).await.unwrap();
    faults.add(Fault { op: Op::Get, key_contains: packs[0].id.to_hex(), times: 1, failure: Failure::Hold });
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    f.attach(tree).await.unwrap();

    let e = Entry { name: b"big".to_vec(), kind: Kind::File, chunked: true, size: whole.len() as u64, id: mid };
    let out = dir.path().join("big");
    let file = Arc::new(std::fs::File::create(&out).unwrap());
    let writing = tokio::spawn({
        let f = f.clone();
        async move { f.write_content(&e, "big", file).await }
    });
    // No event says a write landed: the file is looked at until the second
    // pack's bytes are in it (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = std::fs::read(&out).unwrap();
        if got.len() == whole.len() && got[8 * len..] == whole[8 * len..] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the second pack's chunks waited for the first pack's GET");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!writing.is_finished(), "the file was finished with its first pack held");
    faults.release();
    assert_eq!(writing.await.unwrap().unwrap(), whole.len() as u64);
    assert!(std::fs::read(&out).unwrap() == whole, "the file's bytes differ");
    assert_eq!(faults.pending(), 0);
}

/// A hostile store's manifests with holes: a file of 2^40 bytes that is
/// all hole is refused in memory (no allocation of its size), and chunks
/// shorter than their manifest says are corrupt, not bytes shifted across
/// a hole, in every path that reads them.
#[tokio::test]
async fn hostile_manifests_with_holes_are_refused_by_every_reader() {
    use futures::StreamExt;
    use mado_core::object::{ChunkManifest, Entry, Kind};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    let put = |b: Vec<u8>| {
        let remote = remote.clone();
        async move {
            let id = Hash::of(&b);
            remote.put_object(Space::Objects, &id, Bytes::from(b)).await.unwrap();
            id
        }
    };
    let huge = 1u64 << 40;
    let m = ChunkManifest { size: huge, content: None, chunks: vec![(huge, None)] };
    let e =
        Entry { name: b".gitignore".to_vec(), kind: Kind::File, chunked: true, size: huge, id: put(m.encode()).await };
    let err = f.content(&e, ".gitignore").await.unwrap_err().to_string();
    assert!(err.contains("too large to hold in memory"), "{err}");

    let (a, b) = (put(vec![1u8; 20]).await, put(vec![2u8; 20]).await);
    let m =
        ChunkManifest { size: 30 + 100 + 10, content: None, chunks: vec![(30, Some(a)), (100, None), (10, Some(b))] };
    let e = Entry { name: b"f".to_vec(), kind: Kind::File, chunked: true, size: 140, id: put(m.encode()).await };
    let err = f.content(&e, "f").await.unwrap_err().to_string();
    assert!(err.contains("20 bytes, its manifest says 30"), "{err}");
    let mut pieces = f.pieces(&e, "f").await.unwrap();
    let mut failed = None;
    while let Some(p) = pieces.next().await {
        if let Err(e) = p {
            failed = Some(e.to_string());
            break;
        }
    }
    assert!(failed.is_some_and(|e| e.contains("its manifest says 30")));
}

/// An attached index is read in place from its flat copy in the cache
/// (one per layer, made on the first attach or by the layer's writer): a
/// warm attach reads no index at all, not even the local copy; a flat copy
/// that is damaged or of another tree is made again, and reads stay right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_is_read_in_place_from_its_flat_copy_and_a_bad_copy_is_made_again() {
    use mado_core::fetch::Attach;
    use mado_core::pack::{build_pack, MemberKind, Mode, PackIndex};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(20)) }).unwrap());
    let raws = noise(0x1234_5678_9abc_def1, 12, 2 << 10);
    let pack_of = |rs: &[Vec<u8>]| {
        let members: Vec<(Hash, MemberKind, &[u8])> =
            rs.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        build_pack(&members)
    };
    let ((bytes_a, pack_a), (bytes_b, pack_b)) = (pack_of(&raws[..8]), pack_of(&raws[8..]));
    remote.put_pack(&pack_a.id, Bytes::from(bytes_a)).await.unwrap();
    remote.put_pack(&pack_b.id, Bytes::from(bytes_b)).await.unwrap();
    let (tree_a, tree_b) = (b"MADT the bottom's tree".to_vec(), b"MADT the top's tree".to_vec());
    let (a, b) = (Hash([0xa; 32]), Hash([0xb; 32]));
    let bottom = PackIndex {
        tree: a,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![pack_a],
        trees: vec![(Hash::of(&tree_a), tree_a.clone())],
        base: vec![],
        deltas: Vec::new(),
    };
    let top = PackIndex {
        tree: b,
        mode: Mode::Recursive,
        dirs: 2,
        packs: vec![pack_b],
        trees: vec![(Hash::of(&tree_b), tree_b.clone())],
        base: vec![a],
        deltas: Vec::new(),
    };
    remote.put_index(&a, Bytes::from(bottom.encode())).await.unwrap();
    remote.put_index(&b, Bytes::from(top.encode())).await.unwrap();
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());

    async fn check(f: Arc<Fetcher>, raws: &[Vec<u8>], inline: &[&Vec<u8>]) {
        for r in raws {
            assert_eq!(&f.get(Space::Objects, Hash::of(r), "blob").await.unwrap()[..], &r[..]);
        }
        for t in inline {
            assert_eq!(f.inline_tree(&Hash::of(t)).as_ref(), Some(*t));
        }
        assert_eq!(f.inline_tree(&Hash([0xc; 32])), None);
    }
    let inline = [&tree_a, &tree_b];
    // Cold: both layers in one round trip, each kept flat.
    let f = Fetcher::new(remote.clone(), cache.clone());
    let before = remote.stats();
    let got = f.attach_hinted(b, &[a]).await.unwrap();
    let d = remote.stats().since(&before);
    assert!(matches!(got, Attach::Attached { layers: 2, packs: 2, members: 12, dirs: 2, .. }), "{got:?}");
    assert_eq!((d.gets, d.round_trips), (2, 1), "{d:?}");
    let flat_len = |t: &Hash| std::fs::metadata(cache.flat_index_path(t)).unwrap().len();
    let (len_a, len_b) = (flat_len(&a), flat_len(&b));
    check(f, &raws, &inline).await;

    // Warm, with the compressed local copies gone: nothing is read but
    // the flat copies.
    std::fs::remove_file(cache.index_path(&a)).unwrap();
    std::fs::remove_file(cache.index_path(&b)).unwrap();
    let g = Fetcher::new(remote.clone(), cache.clone());
    let before = remote.stats();
    assert!(matches!(g.attach(b).await.unwrap(), Attach::Attached { layers: 2, .. }));
    assert_eq!(remote.stats().since(&before).gets, 0);
    check(g, &raws, &inline).await;

    // A cut copy of the bottom, and in the top's place a sound flat
    // layer of another tree (the bottom's): both made again.
    let flat_a = cache.flat_index_path(&a);
    let whole = std::fs::read(&flat_a).unwrap();
    std::fs::write(&flat_a, &whole[..whole.len() / 2]).unwrap();
    std::fs::write(cache.flat_index_path(&b), &whole).unwrap();
    let h = Fetcher::new(remote.clone(), cache.clone());
    assert!(matches!(h.attach(b).await.unwrap(), Attach::Attached { layers: 2, .. }));
    assert_eq!((flat_len(&a), flat_len(&b)), (len_a, len_b), "both made again");
    check(h, &raws, &inline).await;
}

/// A layer fetched while the store held a damaged copy of it (naming a
/// layer below that is not there) is not kept as the truth: once the store
/// holds the right one again, the next load, flat or not, reads it.
#[tokio::test]
async fn a_cached_layer_naming_a_missing_layer_is_fetched_again_once_the_store_is_repaired() {
    use mado_core::fetch::{load_flat_layers, load_index_layers, Attach};
    use mado_core::pack::{Mode, PackIndex};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/store", dir.path().display());
    let remote = Arc::new(Remote::open(&url, &OpenOptions::default()).unwrap());
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let (a, b, gone) = (Hash([0xa; 32]), Hash([0xb; 32]), Hash([0xc; 32]));
    let index = |tree: Hash, base: Vec<Hash>| PackIndex {
        tree,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![],
        trees: vec![],
        base,
        deltas: Vec::new(),
    };
    remote.put_index(&a, Bytes::from(index(a, vec![]).encode())).await.unwrap();
    for flat in [false, true] {
        remote.put_index(&b, Bytes::from(index(b, vec![gone]).encode())).await.unwrap();
        let load = || async {
            match flat {
                false => load_index_layers(&remote, &cache, b, &[]).await.unwrap().map(|(l, _)| l.len()),
                true => load_flat_layers(&remote, &cache, b, &[]).await.unwrap().map(|(l, _)| l.len()),
            }
        };
        assert!(matches!(load().await, Err(Attach::Undecodable { .. })), "flat: {flat}");
        remote.put_index(&b, Bytes::from(index(b, vec![a]).encode())).await.unwrap();
        assert_eq!(load().await.ok(), Some(2), "flat: {flat}: the repaired layer and the one below");
        let _ = std::fs::remove_file(cache.index_path(&b));
        let _ = std::fs::remove_file(cache.flat_index_path(&b));
    }
}
