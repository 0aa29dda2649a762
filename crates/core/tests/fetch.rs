//! The fetcher over a real local store with an injected delay: concurrent
//! reads of one object collapse into one GET, and later reads are cache hits.

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
