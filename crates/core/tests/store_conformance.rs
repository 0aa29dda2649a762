//! One conformance suite for the remote store, run against every backend:
//! the local directory store, and a real MinIO server when the test command
//! started one (`MADO_TEST_S3_URL` plus the AWS_* variables; with
//! `MADO_REQUIRE_S3=1` a missing server fails instead of skipping). Each
//! run uses its own random prefix.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mado_core::object::RefValue;
use mado_core::store::{OpenOptions, Remote, Space};
use mado_core::{Error, Hash, SnapshotId, TreeId};

fn s3_base() -> Option<String> {
    match std::env::var("MADO_TEST_S3_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("MADO_REQUIRE_S3").as_deref() == Ok("1") => {
            panic!("MADO_REQUIRE_S3=1 but MADO_TEST_S3_URL is not set: start MinIO with scripts/minio.sh")
        }
        _ => {
            eprintln!("skipping S3 conformance: MADO_TEST_S3_URL not set (make test starts MinIO)");
            None
        }
    }
}

fn random_prefix() -> String {
    format!("t-{:016x}", rand::random::<u64>())
}

/// Remotes to test: (label, url, keep-alive for a temp dir).
fn backends() -> Vec<(String, String, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let mut v = vec![
        ("local".to_string(), format!("file://{}", dir.path().display()), Some(dir)),
        ("memory".to_string(), format!("memory://{}", random_prefix()), None),
    ];
    if let Some(base) = s3_base() {
        v.push(("s3".to_string(), format!("{}/{}", base.trim_end_matches('/'), random_prefix()), None));
    }
    v
}

fn open(url: &str) -> Arc<Remote> {
    Arc::new(Remote::open(url, &OpenOptions::default()).unwrap())
}

async fn objects_round_trip_and_verify(r: &Remote) {
    let data = Bytes::from_static(b"some file content");
    let id = Hash::of(&data);
    assert!(!r.has_object(Space::Objects, &id).await.unwrap());
    match r.get_object(Space::Objects, &id, "blob").await {
        Err(Error::ObjectMissing { id: got, .. }) => assert_eq!(got, id),
        other => panic!("expected ObjectMissing, got {other:?}"),
    }
    r.put_object(Space::Objects, &id, data.clone()).await.unwrap();
    assert!(r.has_object(Space::Objects, &id).await.unwrap());
    assert_eq!(r.get_object(Space::Objects, &id, "blob").await.unwrap(), data);
    // Writing the same content again is harmless.
    r.put_object(Space::Objects, &id, data.clone()).await.unwrap();
    let other = Hash::of(b"other");
    assert_eq!(r.have_objects(Space::Objects, &[id, other]).await.unwrap(), vec![true, false]);
}

async fn corrupt_objects_are_reported_with_their_id(r: &Remote) {
    let id = Hash::of(b"the real bytes");
    // put_object trusts its caller: a rotten copy, as a disk would make it.
    r.put_object(Space::Objects, &id, Bytes::from_static(b"the rotten bytes")).await.unwrap();
    match r.get_object(Space::Objects, &id, "blob").await {
        Err(e @ Error::Corrupt { .. }) => assert!(e.to_string().contains(&id.to_hex()), "{e}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

async fn packs_indexes_listings_and_deletes(r: &Remote) {
    use futures::TryStreamExt;
    let id = Hash::of(b"a pack");
    let body = Bytes::from_static(b"0123456789abcdef");
    assert!(!r.has_pack(&id).await.unwrap());
    match r.pack_range(&id, 0..4).await {
        Err(Error::NotFound(m)) => assert!(m.contains(&id.to_hex()), "{m}"),
        other => panic!("a missing pack is NotFound: {other:?}"),
    }
    r.put_pack(&id, body.clone()).await.unwrap();
    assert!(r.has_pack(&id).await.unwrap());
    assert_eq!(r.pack_range(&id, 2..6).await.unwrap(), Bytes::from_static(b"2345"));
    let streamed: Vec<Bytes> = r.pack_stream(&id, 4..16).await.unwrap().try_collect().await.unwrap();
    assert_eq!(streamed.concat(), b"456789abcdef");

    let tree = Hash::of(b"a tree");
    assert!(!r.has_index(&tree).await.unwrap());
    assert_eq!(r.get_index(&tree).await.unwrap(), None);
    r.put_index(&tree, Bytes::from_static(b"MADI...")).await.unwrap();
    assert!(r.has_index(&tree).await.unwrap());
    assert_eq!(r.get_index(&tree).await.unwrap(), Some(Bytes::from_static(b"MADI...")));

    // The listing of packs holds the pack and the index (under packs/index).
    let listed = r.list(mado_core::store::layout::PACKS).await.unwrap();
    let keys: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
    assert!(keys.iter().any(|k| k.ends_with(&id.to_hex())), "{keys:?}");
    assert!(keys.iter().any(|k| k.ends_with(&tree.to_hex())), "{keys:?}");
    let index_key = listed.iter().find(|m| m.location.as_ref().ends_with(&tree.to_hex())).unwrap().location.clone();
    assert_eq!(r.head_bytes(&index_key, 4).await.unwrap(), Bytes::from_static(b"MADI"));
    assert!(r.get_if_present(&index_key).await.unwrap().is_some());
    r.delete_keys(listed.into_iter().map(|m| m.location).collect()).await.unwrap();
    assert!(!r.has_pack(&id).await.unwrap() && !r.has_index(&tree).await.unwrap());
    assert_eq!(r.get_if_present(&index_key).await.unwrap(), None);
    assert!(r.list(mado_core::store::layout::PACKS).await.unwrap().is_empty());
}

/// An index goes up with a conditional PUT (a checkpoint writes it beside
/// its packs); one found at the key is sound only when every pack and
/// lower layer it names is in the store.
async fn conditional_indexes_and_their_soundness(r: &Remote) {
    use mado_core::pack::{Mode, PackEntry, PackIndex};
    use mado_core::publish::index_is_sound;
    let (tree, below) = (Hash::of(b"a layered tree"), Hash::of(b"the layer below"));
    let pack = Hash::of(b"its pack");
    let layer = PackIndex {
        tree,
        mode: Mode::Recursive,
        dirs: 1,
        packs: vec![PackEntry { id: pack, size: 10, header_len: 4, members: Vec::new() }],
        trees: Vec::new(),
        base: vec![below],
        deltas: Vec::new(),
    };
    let bytes = Bytes::from(layer.encode());
    assert!(!index_is_sound(r, &tree).await.unwrap(), "absent");
    assert!(r.create_index(&tree, bytes.clone()).await.unwrap(), "created");
    assert!(!r.create_index(&tree, Bytes::from_static(b"other")).await.unwrap(), "not over one that is there");
    assert_eq!(r.get_index(&tree).await.unwrap(), Some(bytes.clone()));
    assert!(!index_is_sound(r, &tree).await.unwrap(), "its pack and the layer below are missing");
    r.put_pack(&pack, Bytes::from_static(b"0123456789")).await.unwrap();
    assert!(!index_is_sound(r, &tree).await.unwrap(), "the layer below is missing");
    let whole = PackIndex { tree: below, base: Vec::new(), packs: Vec::new(), ..layer.clone() };
    r.put_index(&below, Bytes::from(whole.encode())).await.unwrap();
    assert!(index_is_sound(r, &tree).await.unwrap(), "everything it names is there");
    r.put_index(&tree, Bytes::from_static(b"not an index")).await.unwrap();
    assert!(!index_is_sound(r, &tree).await.unwrap(), "undecodable");
    r.put_index(&tree, Bytes::from(whole.encode())).await.unwrap();
    assert!(!index_is_sound(r, &tree).await.unwrap(), "an index of another tree at this key");
}

async fn snapshot_prefixes_resolve(r: &Remote) {
    let a = Bytes::from_static(b"snapshot a");
    let id = Hash::of(&a);
    r.put_object(Space::Snapshots, &id, a.clone()).await.unwrap();
    let hex = id.to_hex();
    assert_eq!(r.snapshots_with_prefix(&hex[..6]).await.unwrap(), vec![id]);
    let other_prefix = if hex.starts_with('0') { "1111" } else { "0000" };
    assert!(r.snapshots_with_prefix(other_prefix).await.unwrap().is_empty());
}

/// A ref whose snapshot and root are both `n` repeated.
fn ref_of(n: u8) -> RefValue {
    RefValue::new(SnapshotId::from_hash(Hash([n; 32])), TreeId::from_hash(Hash([n; 32])))
}

async fn refs_move_by_compare_and_swap(r: &Remote) {
    let (a, b, c) = (ref_of(1), ref_of(2), ref_of(3));
    assert!(r.read_ref("main").await.unwrap().is_none());
    let v1 = r.cas_ref("main", None, a.clone()).await.unwrap();
    // Creating again must fail: the ref exists.
    assert!(matches!(r.cas_ref("main", None, b.clone()).await, Err(Error::RefMoved { .. })));
    let (got, ver) = r.read_ref("main").await.unwrap().unwrap();
    assert_eq!(got, a);
    assert_eq!(ver, v1);
    let v2 = r.cas_ref("main", Some(&v1), b.clone()).await.unwrap();
    // A writer holding the old version loses.
    assert!(matches!(r.cas_ref("main", Some(&v1), c.clone()).await, Err(Error::RefMoved { .. })));
    assert_eq!(r.read_ref("main").await.unwrap().unwrap().0, b);
    r.cas_ref("main", Some(&v2), c.clone()).await.unwrap();
    r.cas_ref("ws/one", None, a.clone()).await.unwrap();
    let refs = r.list_refs().await.unwrap();
    assert_eq!(refs, vec![("main".to_string(), c), ("ws/one".to_string(), a)]);
    assert!(matches!(r.read_ref("../escape").await, Err(Error::User(_))));
    r.delete_ref("ws/one").await.unwrap();
    assert!(r.read_ref("ws/one").await.unwrap().is_none());
}

/// Many writers (separate `Remote`s, so separate connections and locks)
/// race from the same version: exactly one wins.
async fn concurrent_cas_has_one_winner(url: &str) {
    let r = open(url);
    let v0 = r.cas_ref("race", None, ref_of(0)).await.unwrap();
    let tasks: Vec<_> = (1..=8u8)
        .map(|i| {
            let r = open(url);
            let v0 = v0.clone();
            tokio::spawn(async move { r.cas_ref("race", Some(&v0), ref_of(i)).await })
        })
        .collect();
    let mut wins = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(_) => wins.push(i as u8 + 1),
            Err(Error::RefMoved { .. }) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!(wins.len(), 1, "winners: {wins:?}");
    assert_eq!(r.read_ref("race").await.unwrap().unwrap().0, ref_of(wins[0]));
}

async fn counting_wrapper_counts(r: &Remote) {
    let before = r.stats();
    let data = Bytes::from_static(b"counted");
    let id = Hash::of(&data);
    r.put_object(Space::Objects, &id, data.clone()).await.unwrap();
    r.get_object(Space::Objects, &id, "blob").await.unwrap();
    r.has_object(Space::Objects, &id).await.unwrap();
    let d = r.stats().since(&before);
    assert_eq!((d.puts, d.gets, d.heads), (1, 1, 1));
    assert_eq!(d.bytes_up, data.len() as u64);
    assert_eq!(d.bytes_down, data.len() as u64);
    assert_eq!(d.round_trips, 3, "three dependent requests");
}

async fn run_all(label: &str, url: &str) {
    eprintln!("conformance: {label} at {url}");
    let r = open(url);
    objects_round_trip_and_verify(&r).await;
    corrupt_objects_are_reported_with_their_id(&r).await;
    snapshot_prefixes_resolve(&r).await;
    packs_indexes_listings_and_deletes(&r).await;
    conditional_indexes_and_their_soundness(&r).await;
    refs_move_by_compare_and_swap(&r).await;
    concurrent_cas_has_one_winner(url).await;
    counting_wrapper_counts(&open(url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_every_backend() {
    for (label, url, _keep) in backends() {
        run_all(&label, &url).await;
    }
}

/// Requests issued together share one round trip; a dependent request is
/// one more. Measured under an injected delay, as the depth counter intends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn round_trips_count_dependency_depth() {
    for (label, url, _keep) in backends() {
        let r = Remote::open(&url, &OpenOptions { inject_rtt: Some(Duration::from_millis(30)) }).unwrap();
        let ids: Vec<Hash> = (0..20u8).map(|i| Hash([i; 32])).collect();
        let before = r.stats();
        r.have_objects(Space::Objects, &ids).await.unwrap();
        let d = r.stats().since(&before);
        assert_eq!(d.heads, 20, "{label}");
        assert_eq!(d.round_trips, 1, "{label}: 20 HEADs in flight together are one round trip");
        r.has_object(Space::Objects, &ids[0]).await.unwrap();
        assert_eq!(r.stats().since(&before).round_trips, 2, "{label}");
    }
}
