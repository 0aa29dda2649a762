//! `workspace::list` over many workspaces: the refs in one listing, read
//! together, then every snapshot at once, in name order with numbers by
//! value.

mod common;

use std::sync::Arc;
use std::time::Duration;

use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::store::{OpenOptions, Remote};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_workspaces_are_listed_in_four_round_trips() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("a.txt"), b"a\n").unwrap();
    common::commit_all(&repo, "one");
    let remote = common::store_in(t.path());
    common::import_main(&remote, Arc::new(DiskCache::open(t.path().join("c0"), None).unwrap()), &repo).await;
    let f = Fetcher::new(remote, Arc::new(DiskCache::open(t.path().join("c1"), None).unwrap()));
    for i in 1..=100 {
        let ws = mado_core::workspace::Workspace::new(&f, &format!("agent-{i}")).unwrap();
        ws.create_ref("main").await.unwrap();
    }
    // A fresh cache, and a round trip that takes time, so that requests
    // sent together are seen together.
    let url = format!("file://{}/store", t.path().display());
    let slow = Arc::new(Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(20)) }).unwrap());
    let g = Fetcher::new(slow.clone(), Arc::new(DiskCache::open(t.path().join("c2"), None).unwrap()));
    let before = slow.stats();
    let listed = mado_core::workspace::list(&g).await.unwrap();
    let d = slow.stats().since(&before);
    let names: Vec<String> = listed.iter().map(|w| w.name.clone()).collect();
    let want: Vec<String> = (1..=100).map(|i| format!("agent-{i}")).collect();
    assert_eq!(names, want);
    // The LIST, the refs 64 at a time (two), the snapshots (here one, as
    // every workspace was made from main); it was one per ref (103).
    assert_eq!((d.lists, d.round_trips), (1, 4), "{d:?}");
}
