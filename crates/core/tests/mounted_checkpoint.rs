//! A mounted workspace's checkpoints when the disk cache loses what the
//! last one put there (wiped by hand, capped, healed): the trees of the
//! base a checkpoint moved the mount to came inline with its index layer,
//! and the next status and checkpoint must find them there, not in the
//! cache alone. A test binary of its own: it sets the process's
//! per-machine state folder.

mod common;

use std::sync::Arc;

use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::vfs::ROOT_INO;
use mado_core::workspace::{checkpoint_mount, mount_status, CheckpointLease};

/// Writes a new file `name` holding `body` in directory `parent`.
async fn new_file(fs: &mado_core::vfs::SnapshotFs, parent: u64, name: &[u8], body: &[u8]) {
    let (_, h) = fs.create(parent, name, 0o644).await.unwrap();
    fs.write(&h, 0, body).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_checkpoints_again_after_its_cache_lost_the_last_checkpoints_trees() {
    let t = tempfile::tempdir().unwrap();
    let (remote, f, ws) = common::small_workspace(t.path()).await;
    let cache_dir = t.path().join("cache");
    let m = ws.open_mount(&t.path().join("mnt"), false, true).await.unwrap();

    // A checkpoint that changes a directory below the root: new trees.
    let src = m.fs.lookup(ROOT_INO, b"src").await.unwrap().ino;
    new_file(&m.fs, src, b"one.rs", b"one\n").await;
    // A rule file written in the mount leaves out the new paths it names.
    new_file(&m.fs, ROOT_INO, b".madoignore", b"*.tmp\n").await;
    new_file(&m.fs, src, b"scratch.tmp", b"scratch\n").await;
    // Another file, however much it reads like rules, is not rules.
    new_file(&m.fs, src, b"notes.txt", b"*.rs\n").await;
    let st = mount_status(&f, &m.fs, &m.state_dir, false).await.unwrap();
    let added = vec![".madoignore".to_string(), "src/notes.txt".into(), "src/one.rs".into()];
    assert_eq!((st.added.clone(), st.paths_ignored), (added, 1), "{st:?}");
    let first = checkpoint_mount(&f, &m.fs, &m.state_dir, "one", CheckpointLease::default()).await.unwrap();
    assert!(!first.unchanged);

    // The cache loses everything the checkpoint put there.
    for d in std::fs::read_dir(&cache_dir).unwrap() {
        let p = d.unwrap().path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
    f.cache.shed();

    // Another change in that directory: its tree (and the root's) from the
    // last checkpoint are read to build the next.
    new_file(&m.fs, src, b"two.rs", b"two\n").await;
    let st = mount_status(&f, &m.fs, &m.state_dir, false).await.unwrap();
    assert_eq!(st.added, vec!["src/two.rs".to_string()], "{st:?}");
    let second = checkpoint_mount(&f, &m.fs, &m.state_dir, "two", CheckpointLease::default()).await.unwrap();
    assert!(!second.unchanged);
    assert_eq!(second.parent, first.snapshot);

    // Read back through a fresh fetcher and cache: both files are there.
    let g = Fetcher::new(remote, Arc::new(DiskCache::open(t.path().join("cache2"), None).unwrap()));
    let tree = mado_core::resolve::open_tree(&g, "ws/w").await.unwrap();
    for (name, body) in [("src/one.rs", &b"one\n"[..]), ("src/two.rs", b"two\n")] {
        let entry = g.lookup(*tree.root, name).await.unwrap().unwrap();
        assert_eq!(&g.content(&entry, name).await.unwrap()[..], body, "{name}");
    }
}
