//! Opening a ref for a command that needs its tree only
//! (`resolve::open_tree`): the index is waited for, the snapshot is not,
//! and the snapshot's read still finishes, checked, before the command
//! reports success. The store is a real in-memory one behind the fault
//! wrapper, which holds the snapshot's GET as a slow server would.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mado_core::cache::DiskCache;
use mado_core::fetch::{Attach, Fetcher};
use mado_core::object::{RefValue, Snapshot, Tree};
use mado_core::pack::{Mode, PackIndex};
use mado_core::store::fault::{Failure, Fault, FaultStore, Op};
use mado_core::store::{Remote, Space};
use mado_core::{Error, Hash, SnapshotId, TreeId};

/// A store holding an empty root tree (inline in its index) and a
/// snapshot of it; the ref `main` names both. Returns the snapshot's id
/// and the root's.
async fn store_with_a_ref(remote: &Remote) -> (SnapshotId, TreeId) {
    let tree = Tree { entries: vec![] }.encode();
    let root = Hash::of(&tree);
    let idx = PackIndex {
        tree: root,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![],
        trees: vec![(root, tree)],
        base: vec![],
        deltas: Vec::new(),
    };
    remote.put_index(&root, Bytes::from(idx.encode())).await.unwrap();
    let snap = Snapshot {
        root: TreeId::from_hash(root),
        parents: vec![],
        time: 1_700_000_000,
        author: "a".into(),
        message: "m".into(),
        source: String::new(),
        stat: None,
        stat_layers: vec![],
    }
    .encode();
    let (id, root) = (SnapshotId::from_hash(Hash::of(&snap)), TreeId::from_hash(root));
    remote.put_object(Space::Snapshots, &id, Bytes::from(snap)).await.unwrap();
    remote.cas_ref("main", None, RefValue { snapshot: id, root, layers: vec![] }).await.unwrap();
    (id, root)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_tree_goes_on_while_the_snapshot_is_still_on_its_way() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultStore::new(Arc::new(object_store::memory::InMemory::new())));
    let remote = Arc::new(Remote::from_store("memory://held", faults.clone()));
    let (snapshot, root) = store_with_a_ref(&remote).await;
    faults.add(Fault { op: Op::Get, key_contains: snapshot.to_hex(), times: 1, failure: Failure::Hold });
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    let before = remote.stats();

    // With the snapshot's GET held, the tree and its index are there.
    let open = tokio::time::timeout(Duration::from_secs(30), mado_core::resolve::open_tree(&f, "main"))
        .await
        .expect("open_tree waited for the snapshot's GET")
        .unwrap();
    assert_eq!((open.snapshot, open.root), (snapshot, root));
    assert!(matches!(open.attach, Attach::Attached { .. }), "{:?}", open.attach);
    // The check cannot finish while the GET is held.
    let mut check = open.check;
    assert!(tokio::time::timeout(Duration::from_millis(100), &mut check).await.is_err(), "the check did not wait");
    assert!(!cache.contains(&snapshot));

    // Released, the check finishes the read: the snapshot is cached, so
    // opening it by id later costs no request.
    faults.release();
    check.await.unwrap();
    assert_eq!(faults.pending(), 0);
    let s = remote.stats().since(&before);
    assert_eq!(s.all_gets(), 3, "the ref, the index, the snapshot: {s:?}");
    let by_id = mado_core::resolve::open_tree(&f, &snapshot.to_hex()).await.unwrap();
    by_id.check.await.unwrap();
    assert_eq!(by_id.root, root);
    assert_eq!(remote.stats().since(&before).all_gets(), 3, "opening by id asked the store again");
}

/// A ref whose root is not its snapshot's (a writer's bug, or a ref
/// rewritten by hand): the check fails, naming the snapshot.
#[tokio::test]
async fn a_ref_naming_another_root_than_its_snapshot_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let remote = Arc::new(Remote::from_store("memory://bad", Arc::new(object_store::memory::InMemory::new())));
    let (snapshot, _) = store_with_a_ref(&remote).await;
    // Another tree id, with an index of its own, named by a second ref.
    let other = Hash([9; 32]);
    let idx = PackIndex {
        tree: other,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![],
        trees: vec![],
        base: vec![],
        deltas: vec![],
    };
    remote.put_index(&other, Bytes::from(idx.encode())).await.unwrap();
    remote.cas_ref("bad", None, RefValue { snapshot, root: TreeId::from_hash(other), layers: vec![] }).await.unwrap();
    let cache = Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap());
    let f = Fetcher::new(remote, cache);
    let open = mado_core::resolve::open_tree(&f, "bad").await.unwrap();
    let e = open.check.await.unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains(&snapshot.to_hex()[..12]), "{e}");
}
