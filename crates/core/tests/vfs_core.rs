//! The mount's filesystem logic (`mado_core::vfs::SnapshotFs`) without
//! FUSE: a real git repository imported through the core API, then
//! lookup, readdir, getattr, readlink and reads (whole and chunked, at
//! odd offsets) compared with the repository's own files; and the
//! metadata of a packed snapshot answered with no request at all; a
//! workspace opened for a mount, and opened again after its daemon was
//! killed.

mod common;

use common::{commit_all, git, store_in};
use std::sync::Arc;

use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::store::{OpenOptions, Remote};
use mado_core::vfs::{NodeKind, OpenFile, SnapshotFs, ROOT_INO};
use mado_core::TreeId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_fs_answers_like_the_files() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(repo.join("src/sub")).unwrap();
    std::fs::write(repo.join("README"), b"hello\n").unwrap();
    std::fs::write(repo.join("src/sub/a.rs"), b"fn a() {}\n").unwrap();
    let big: Vec<u8> = (0..(9u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(repo.join("big.bin"), &big).unwrap();
    std::os::unix::fs::symlink("README", repo.join("link")).unwrap();
    commit_all(&repo, "x");

    let remote = store_in(t.path());
    let rep = import_packed_in(&remote, &repo, t.path().join("cache"), mado_core::pack::DEFAULT_MAX_PACK_BYTES).await;
    // A fresh cache, as on another machine.
    let cache = Arc::new(DiskCache::open(t.path().join("cache2"), None).unwrap());
    let f = Fetcher::new(remote.clone(), cache);
    let (_, snap, attach) = mado_core::resolve::open(&f, "main").await.unwrap();
    assert!(matches!(attach, mado_core::fetch::Attach::Attached { .. }), "{attach:?}");
    assert_eq!(snap.root.to_hex(), rep.imported[0].root);
    let fs = SnapshotFs::new(f.clone(), snap.root, snap.time);
    fs.preload_trees().await.unwrap();

    // Metadata: no request once the trees are loaded.
    let before = remote.stats();
    let names: Vec<String> = fs
        .readdir_now(ROOT_INO)
        .unwrap()
        .unwrap()
        .iter()
        .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
        .collect();
    assert_eq!(names, ["README", "big.bin", "link", "src"]);
    let src = fs.lookup_now(ROOT_INO, b"src").unwrap().unwrap();
    assert_eq!(src.kind, NodeKind::Dir);
    let sub = fs.lookup_now(src.ino, b"sub").unwrap().unwrap();
    let a = fs.lookup_now(sub.ino, b"a.rs").unwrap().unwrap();
    assert_eq!((a.kind, a.size, a.perm), (NodeKind::File, 10, 0o444));
    assert_eq!(fs.getattr(a.ino).unwrap(), a);
    assert!(matches!(fs.lookup_now(ROOT_INO, b"nope"), Some(Err(mado_core::Error::NotFound(_)))));
    assert_eq!(remote.stats().since(&before).requests(), 0, "metadata made a request");

    // Reads.
    let link = fs.lookup_now(ROOT_INO, b"link").unwrap().unwrap();
    assert_eq!(link.kind, NodeKind::Symlink);
    assert_eq!(&fs.readlink(link.ino).await.unwrap()[..], b"README");
    let h = fs.open(a.ino).await.unwrap();
    assert_eq!(&fs.read(&h, 3, 100).await.unwrap()[..], b"a() {}\n");
    assert!(fs.read(&h, 50, 10).await.unwrap().is_empty());
    let b = fs.lookup_now(ROOT_INO, b"big.bin").unwrap().unwrap();
    let h = fs.open(b.ino).await.unwrap();
    assert!(matches!(h, OpenFile::Chunked { .. }));
    for (off, len) in [(0u64, 4096u32), (1 << 20, 70_000), ((4 << 20) - 5, 10), ((9 << 20) - 3, 100)] {
        let got = fs.read(&h, off, len).await.unwrap();
        let end = ((off + len as u64) as usize).min(big.len());
        assert!(got[..] == big[off as usize..end], "chunked read at {off}+{len}");
    }
    assert!(
        matches!(fs.open(src.ino).await, Err(mado_core::Error::Fs { errno, .. }) if errno == rustix::io::Errno::ISDIR.raw_os_error())
    );
    // Read-only: every change is refused.
    assert!(
        matches!(fs.mkdir(ROOT_INO, b"x", 0o755).await, Err(mado_core::Error::Fs { errno, .. }) if errno == rustix::io::Errno::ROFS.raw_os_error())
    );
}

/// Imports the repository's HEAD without packs; returns its root tree.
async fn import_head(remote: &Arc<Remote>, cache: &Arc<DiskCache>, repo: &std::path::Path) -> mado_core::Hash {
    let rep = mado_core::import::import_git(
        remote,
        cache.clone(),
        repo,
        vec!["HEAD".into()],
        "main",
        None,
        None,
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap();
    rep.imported[0].root.parse().unwrap()
}

/// The read-write filesystem without FUSE: edits through the core API give
/// exactly the tree git gives for the same edits (imported from a commit),
/// a checkpoint re-hashes only what was written and re-encodes only the
/// directories above it, and the saved state reloads to the same tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writable_fs_edits_build_the_tree_git_builds() {
    use mado_core::upload::Staged;
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(repo.join("src/sub")).unwrap();
    std::fs::write(repo.join("README"), b"hello\n").unwrap();
    std::fs::write(repo.join("src/sub/a.rs"), b"fn a() {}\n").unwrap();
    std::fs::write(repo.join("src/b.txt"), b"b\n").unwrap();
    std::os::unix::fs::symlink("README", repo.join("link")).unwrap();
    commit_all(&repo, "base");
    let remote = store_in(t.path());
    let cache = Arc::new(DiskCache::open(t.path().join("cache"), None).unwrap());
    let base = import_head(&remote, &cache, &repo).await;

    let f = Fetcher::new(remote.clone(), cache.clone());
    let upper = t.path().join("upper");
    let fs = Arc::new(SnapshotFs::writable(f.clone(), TreeId::from_hash(base), 0, upper.clone(), None).unwrap());
    let src = fs.lookup(ROOT_INO, b"src").await.unwrap();
    // Modify (copy-up, then write past the end), create, mkdir + create,
    // rename a directory, unlink, chmod, symlink, truncate.
    let readme = fs.lookup(ROOT_INO, b"README").await.unwrap();
    let h = fs.open_for_write(readme.ino).await.unwrap();
    assert_eq!(fs.write(&h, 6, b"world\n").unwrap(), 6);
    assert_eq!(&fs.read(&h, 0, 100).await.unwrap()[..], b"hello\nworld\n");
    let (_, h) = fs.create(ROOT_INO, b"new.txt", 0o644).await.unwrap();
    fs.write(&h, 0, b"new\n").unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755).await.unwrap();
    let (_, h) = fs.create(d.ino, b"in.txt", 0o644).await.unwrap();
    fs.write(&h, 0, b"in\n").unwrap();
    fs.rename(src.ino, b"sub", ROOT_INO, b"moved", false).await.unwrap();
    fs.unlink(ROOT_INO, b"link").await.unwrap();
    let b = fs.lookup(src.ino, b"b.txt").await.unwrap();
    fs.setattr(b.ino, mado_core::vfs::SetAttr { mode: Some(0o755), ..Default::default() }).await.unwrap();
    fs.symlink(d.ino, b"up", b"../README").await.unwrap();
    let gone = fs.mkdir(ROOT_INO, b"gone", 0o755).await.unwrap();
    fs.create(gone.ino, b"x", 0o644).await.unwrap();
    let e = fs.rmdir(ROOT_INO, b"gone").await.unwrap_err();
    assert!(matches!(e, mado_core::Error::Fs { errno, .. } if errno == rustix::io::Errno::NOTEMPTY.raw_os_error()));
    fs.unlink(gone.ino, b"x").await.unwrap();
    fs.rmdir(ROOT_INO, b"gone").await.unwrap();
    let e = fs.rename(ROOT_INO, b"d", d.ino, b"self", false).await.unwrap_err();
    assert!(matches!(e, mado_core::Error::Fs { errno, .. } if errno == rustix::io::Errno::INVAL.raw_os_error()));
    let a = fs.lookup(fs.lookup(ROOT_INO, b"moved").await.unwrap().ino, b"a.rs").await.unwrap();
    fs.setattr(a.ino, mado_core::vfs::SetAttr { size: Some(2), ..Default::default() }).await.unwrap();

    // The same edits in git.
    std::fs::write(repo.join("README"), b"hello\nworld\n").unwrap();
    std::fs::write(repo.join("new.txt"), b"new\n").unwrap();
    std::fs::create_dir_all(repo.join("d")).unwrap();
    std::fs::write(repo.join("d/in.txt"), b"in\n").unwrap();
    std::fs::rename(repo.join("src/sub"), repo.join("moved")).unwrap();
    std::fs::remove_file(repo.join("link")).unwrap();
    std::fs::set_permissions(repo.join("src/b.txt"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("../README", repo.join("d/up")).unwrap();
    std::fs::write(repo.join("moved/a.rs"), b"fn").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "edits"]);
    let want = import_head(&remote, &cache, &repo).await;

    fs.preload_trees().await.unwrap();
    let mut staged = Staged::default();
    let built = fs.build(&cache, &mut staged).unwrap();
    assert_eq!(*built.root, want, "the mount's tree differs from git's");
    // Written files: README, new.txt, d/in.txt, moved/a.rs.
    assert_eq!(built.files_read, 4, "{built:?}");
    // Every path has an mtime in the stat object, unexpanded ones too.
    let whole = fs.stat_view(&built.stat).unwrap();
    let paths: Vec<String> = whole.entries.iter().map(|(p, ..)| String::from_utf8_lossy(p).into_owned()).collect();
    assert_eq!(paths, ["", "README", "d", "d/in.txt", "d/up", "moved", "moved/a.rs", "new.txt", "src", "src/b.txt"]);

    // Nothing written since: nothing re-hashed, nothing re-encoded.
    let again = fs.build(&cache, &mut Staged::default()).unwrap();
    assert_eq!((*again.root, again.files_read, again.trees_built), (want, 0, 0), "{again:?}");
    // One write deep down: one file hashed, its two directories re-encoded.
    let h = fs.open_for_write(a.ino).await.unwrap();
    fs.write(&h, 2, b"!").unwrap();
    let one = fs.build(&cache, &mut Staged::default()).unwrap();
    assert_eq!((one.files_read, one.trees_built), (1, 2), "{one:?}");

    // Saved and reloaded (as after a restart): the same tree.
    let saved = fs.save_state().unwrap();
    let back = SnapshotFs::load_state(f.clone(), &saved, upper, None).unwrap();
    let reb = back.build(&cache, &mut Staged::default()).unwrap();
    assert_eq!(reb.root, one.root);
    assert_eq!(back.stat_view(&reb.stat).unwrap(), fs.stat_view(&one.stat).unwrap());
}

/// `repo` imported into `remote` as `main`, packs-first (recursive, 4 MiB
/// packs: a larger file's chunks go into packs of their own, run packs),
/// through a cache at `cache`.
async fn import_packed(remote: &Arc<Remote>, repo: &std::path::Path, cache: std::path::PathBuf) {
    import_packed_in(remote, repo, cache, 4 << 20).await;
}

/// `repo` imported into `remote` as `main`, packs-first (recursive, packs
/// of at most `cap` bytes), through a cache at `cache`.
async fn import_packed_in(
    remote: &Arc<Remote>,
    repo: &std::path::Path,
    cache: std::path::PathBuf,
    cap: u64,
) -> mado_core::import::ImportReport {
    let opts = mado_core::publish::PackOptions {
        mode: mado_core::pack::Mode::Recursive,
        cap,
        index_check: mado_core::publish::IndexCheck::KnownAbsent,
        base: None,
        layers: None,
        flat: None,
        primary: true,
    };
    let cache = Arc::new(DiskCache::open(cache, None).unwrap());
    mado_core::import::import_git(
        remote,
        cache,
        repo,
        vec!["HEAD".into()],
        "main",
        Some(opts),
        None,
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap()
}

/// `main` of `remote` opened as on another machine: a fresh cache at
/// `cache`, its trees loaded.
async fn fresh_fs(remote: &Arc<Remote>, cache: std::path::PathBuf) -> (Arc<Fetcher>, SnapshotFs, Arc<DiskCache>) {
    let cache = Arc::new(DiskCache::open(cache, None).unwrap());
    let f = Fetcher::new(remote.clone(), cache.clone());
    let (_, snap, _) = mado_core::resolve::open(&f, "main").await.unwrap();
    let fs = SnapshotFs::new(f.clone(), snap.root, snap.time);
    fs.preload_trees().await.unwrap();
    (f, fs, cache)
}

/// `SnapshotFs::warm_dir` (a mount's first listing of a directory) starts
/// the pack of the directory's first small file in name order, passing
/// over a large file (its manifest leads to its own run packs), whether
/// the directory is expanded yet or not; a directory with no file of its
/// own, that of the first file below it; a file starts nothing; and what
/// it brought is then read with no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_dir_starts_the_pack_of_a_directorys_first_small_file() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    for d in ["d", "e", "only/sub"] {
        std::fs::create_dir_all(repo.join(d)).unwrap();
    }
    let big: Vec<u8> = (0..(9u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for d in ["d", "e"] {
        // Chunked, and first in name order: passed over.
        std::fs::write(repo.join(d).join("a-big.bin"), &big).unwrap();
        std::fs::write(repo.join(d).join("b.txt"), format!("{d} b\n")).unwrap();
        std::fs::write(repo.join(d).join("c.txt"), format!("{d} c\n")).unwrap();
    }
    std::fs::write(repo.join("only/sub/x"), b"x\n").unwrap();
    // A file 10 and 70 directories down: the search looks into at most 64.
    for (top, depth) in [("shallow", 10), ("deep", 70)] {
        let dir = (0..depth).fold(repo.join(top), |p, _| p.join("d"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x"), top).unwrap();
    }
    // Nothing small anywhere below.
    std::fs::create_dir_all(repo.join("bigonly/sub")).unwrap();
    std::fs::write(repo.join("bigonly/sub/a-big.bin"), &big).unwrap();
    commit_all(&repo, "x");
    let remote = store_in(t.path());
    // Packs of 4 MiB, under the large file's size: its chunks go into
    // packs of their own (run packs), which a listing must not start.
    import_packed(&remote, &repo, t.path().join("cache")).await;
    // A fresh cache each time, as on another machine.
    let fresh = |name: &str| {
        let f = fresh_fs(&remote, t.path().join(name));
        async move {
            let (f, fs, _) = f.await;
            (f, fs)
        }
    };

    // A directory with no file of its own: the first file below it (what
    // a top-down walk reads first), from trees in memory.
    let (f, fs) = fresh("c0").await;
    let only = fs.lookup_now(ROOT_INO, b"only").unwrap().unwrap();
    let before = remote.stats();
    assert!(fs.warm_dir(only.ino), "a directory of directories");
    f.drain().await;
    assert_eq!(remote.stats().since(&before).ranged_gets, 1);
    let sub = fs.lookup(only.ino, b"sub").await.unwrap();
    let x = fs.lookup(sub.ino, b"x").await.unwrap();
    let h = fs.open(x.ino).await.unwrap();
    assert_eq!(&fs.read(&h, 0, 100).await.unwrap()[..], b"x\n");
    assert_eq!(remote.stats().since(&before).requests(), 1, "the file came with the warm");
    // The same with the directories expanded (their nodes, not their trees).
    let (f, fs) = fresh("c0b").await;
    let only = fs.lookup_now(ROOT_INO, b"only").unwrap().unwrap();
    fs.lookup(fs.lookup(only.ino, b"sub").await.unwrap().ino, b"x").await.unwrap();
    let before = remote.stats();
    assert!(fs.warm_dir(only.ino), "a directory of directories, expanded");
    f.drain().await;
    assert_eq!(remote.stats().since(&before).ranged_gets, 1);
    // Only a large file below: nothing to start, expanded or not.
    let (_, fs) = fresh("c0c").await;
    let bigonly = fs.lookup_now(ROOT_INO, b"bigonly").unwrap().unwrap();
    let before = remote.stats();
    assert!(!fs.warm_dir(bigonly.ino), "no small file below");
    fs.lookup(fs.lookup(bigonly.ino, b"sub").await.unwrap().ino, b"a-big.bin").await.unwrap();
    assert!(!fs.warm_dir(bigonly.ino), "no small file below, expanded");
    assert_eq!(remote.stats().since(&before).requests(), 0);

    // A walk's first file 10 directories down is started; 70 down, the
    // search gives up (a tree thousands of levels deep costs no more).
    let (f, fs) = fresh("c0d").await;
    let deep = fs.lookup_now(ROOT_INO, b"deep").unwrap().unwrap();
    assert!(!fs.warm_dir(deep.ino), "70 directories down");
    let shallow = fs.lookup_now(ROOT_INO, b"shallow").unwrap().unwrap();
    assert!(fs.warm_dir(shallow.ino), "10 directories down");
    // Its GET ends here, not inside the next case's count.
    f.drain().await;
    // The same with every directory down the chain expanded (its nodes).
    let (_, fs) = fresh("c0e").await;
    let deep = fs.lookup_now(ROOT_INO, b"deep").unwrap().unwrap();
    let mut at = deep.ino;
    for _ in 0..70 {
        at = fs.lookup(at, b"d").await.unwrap().ino;
    }
    fs.lookup(at, b"x").await.unwrap();
    assert!(!fs.warm_dir(deep.ino), "70 directories down, expanded");

    // Not expanded: read from its tree.
    let (f, fs) = fresh("c1").await;
    let d = fs.lookup_now(ROOT_INO, b"d").unwrap().unwrap();
    let before = remote.stats();
    let file = fs.lookup_now(d.ino, b"b.txt").unwrap().unwrap();
    assert!(!fs.warm_dir(file.ino), "a file");
    let e = fs.lookup_now(ROOT_INO, b"e").unwrap().unwrap();
    assert!(fs.warm_dir(e.ino));
    f.drain().await;
    let s = remote.stats().since(&before);
    assert_eq!((s.ranged_gets, s.gets), (1, 0), "{s:?}");
    assert!(!fs.warm_dir(e.ino), "its pack is cached now");
    let b = fs.lookup_now(e.ino, b"b.txt").unwrap().unwrap();
    let h = fs.open(b.ino).await.unwrap();
    assert_eq!(&fs.read(&h, 0, 100).await.unwrap()[..], b"e b\n");
    assert_eq!(remote.stats().since(&before).requests(), 1, "the file came with the warm");

    // Expanded (listed, then warmed): from its nodes.
    let (f, fs) = fresh("c2").await;
    let d = fs.lookup_now(ROOT_INO, b"d").unwrap().unwrap();
    assert_eq!(fs.readdir_now(d.ino).unwrap().unwrap().len(), 3);
    let before = remote.stats();
    assert!(fs.warm_dir(d.ino));
    f.drain().await;
    assert_eq!(remote.stats().since(&before).ranged_gets, 1);
    assert_eq!(f.stats().warmed_packs, 1);
    let b = fs.lookup_now(d.ino, b"b.txt").unwrap().unwrap();
    let h = fs.open(b.ino).await.unwrap();
    assert_eq!(&fs.read(&h, 0, 100).await.unwrap()[..], b"d b\n");
    assert_eq!(remote.stats().since(&before).requests(), 1, "the small files' pack, not the large file's");
}

/// `warm_dir_waiting` (a FUSE thread's listing) returns once the pack's
/// GET is with the store's client: the request is counted by then. When
/// the GET cannot leave (another process holds the pack's lock), it
/// returns after its limit, and the listing goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_waits_until_its_packs_get_is_on_the_way() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(repo.join("d")).unwrap();
    for i in 0..20 {
        std::fs::write(repo.join("d").join(format!("f{i:02}")), format!("d {i}\n").repeat(50)).unwrap();
    }
    commit_all(&repo, "x");
    let remote = store_in(t.path());
    import_packed(&remote, &repo, t.path().join("cache")).await;
    let rt = tokio::runtime::Handle::current();
    // As a FUSE thread calls it: a thread of its own, in the runtime's context.
    let waiting = |fs: &Arc<SnapshotFs>, ino: u64, limit: std::time::Duration| {
        let (fs, rt) = (fs.clone(), rt.clone());
        std::thread::spawn(move || {
            let _rt = rt.enter();
            let t0 = std::time::Instant::now();
            (fs.warm_dir_waiting(ino, limit), t0.elapsed())
        })
        .join()
        .unwrap()
    };

    // The same store 500 ms away: the listing goes on once the GET is
    // sent, long before its answer.
    let rtt = std::time::Duration::from_millis(500);
    let slow = Arc::new(
        Remote::open(&format!("file://{}/store", t.path().display()), &OpenOptions { inject_rtt: Some(rtt) }).unwrap(),
    );
    let (f, fs, _) = fresh_fs(&slow, t.path().join("c1")).await;
    let fs = Arc::new(fs);
    let d = fs.lookup_now(ROOT_INO, b"d").unwrap().unwrap();
    let before = slow.stats();
    let (started, took) = waiting(&fs, d.ino, std::time::Duration::from_secs(30));
    assert!(started);
    assert_eq!(slow.stats().since(&before).ranged_gets, 1, "the GET left before the listing went on");
    assert!(took < rtt / 2, "the listing waited {took:?}, as if for the pack's answer");
    f.drain().await;
    let (started, took) = waiting(&fs, d.ino, std::time::Duration::from_secs(30));
    assert!(!started && took < std::time::Duration::from_secs(5), "a cached pack: nothing to wait for");

    // Another process holds the pack's lock: no GET can leave, and the
    // listing waits its limit only.
    let (f, fs, cache) = fresh_fs(&remote, t.path().join("c2")).await;
    let fs = Arc::new(fs);
    let d = fs.lookup_now(ROOT_INO, b"d").unwrap().unwrap();
    let f00 = fs.lookup_now(d.ino, b"f00").unwrap().unwrap();
    let pack = f.pack_of(&mado_core::Hash::of("d 0\n".repeat(50).as_bytes())).expect("d/f00 is packed");
    let lock = cache.lock_pack_blocking(&pack).unwrap();
    let before = remote.stats();
    let limit = std::time::Duration::from_millis(300);
    let (started, took) = waiting(&fs, d.ino, limit);
    assert!(started);
    assert!(took >= limit && took < limit * 10, "waited {took:?} for a limit of {limit:?}");
    assert_eq!(remote.stats().since(&before).requests(), 0);
    drop(lock);
    let h = fs.open(f00.ino).await.unwrap();
    assert_eq!(&fs.read(&h, 0, 10).await.unwrap()[..], b"d 0\nd 0\nd ");
    assert_eq!(remote.stats().since(&before).ranged_gets, 1, "the flight went on once the lock was free");
}

/// A first listing of a subdirectory starts the download of its own
/// stretch of the pack only (a pack is in path order): a walk of `a/` in a
/// tree where `b/` comes after it brings `a/`'s bytes, not `b/`'s. A walk
/// of the root still brings the whole pack. Random content, so the bytes
/// down follow the files' sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_listing_brings_its_own_subtree_not_the_pack_after_it() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for (dir, n) in [("a/x", 40), ("a/y", 40), ("b", 400)] {
        std::fs::create_dir_all(repo.join(dir)).unwrap();
        for i in 0..n {
            let data: Vec<u8> = (0..4096)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            std::fs::write(repo.join(dir).join(format!("f{i:03}")), data).unwrap();
        }
    }
    commit_all(&repo, "x");
    let remote = store_in(t.path());
    import_packed(&remote, &repo, t.path().join("cache")).await;

    let (f, fs, _) = fresh_fs(&remote, t.path().join("c1")).await;
    let a = fs.lookup_now(ROOT_INO, b"a").unwrap().unwrap();
    let before = remote.stats();
    assert!(fs.warm_dir(a.ino));
    f.drain().await;
    let got = remote.stats().since(&before);
    assert_eq!(got.ranged_gets, 1, "{got:?}");
    // a/ holds 80 × 4 KiB; the pack after it 400 × 4 KiB more.
    assert!(got.bytes_down < 100 * 4096, "a walk of a/ brought {} bytes", got.bytes_down);
    assert!(got.bytes_down >= 80 * 4096, "a walk of a/ brought {} bytes", got.bytes_down);
    // Every file of a/ is then read with no request; b/ is not cached.
    let before = remote.stats();
    for sub in [&b"x"[..], b"y"] {
        let d = fs.lookup_now(a.ino, sub).unwrap().unwrap();
        let last = fs.lookup_now(d.ino, b"f039").unwrap().unwrap();
        let h = fs.open(last.ino).await.unwrap();
        assert_eq!(fs.read(&h, 0, 8192).await.unwrap().len(), 4096);
    }
    assert_eq!(remote.stats().since(&before).requests(), 0, "a/ was not all there");

    // From the root, the whole pack.
    let (f, fs, _) = fresh_fs(&remote, t.path().join("c2")).await;
    let before = remote.stats();
    assert!(fs.warm_dir(ROOT_INO));
    f.drain().await;
    assert!(remote.stats().since(&before).bytes_down >= 480 * 4096);
}

/// A large file read from start to end as the kernel reads it (several
/// 128 KiB reads in flight, each growing the read-ahead): one ranged GET
/// per pack of its chunks, each from the pack's first chunk. A read-ahead
/// that asked for a pack's later chunk first had that pack downloaded from
/// there, and its first chunks in a second GET after the first ended.
/// Closed, its whole copy is built from the cache alone, and not kept when
/// a cached pack rotted in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_read_in_order_costs_one_get_per_pack() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let big = common::noise_bytes(0x9e37_79b9_7f4a_7c15, 40 << 20);
    std::fs::write(repo.join("big.bin"), &big).unwrap();
    commit_all(&repo, "x");
    import_packed(&store_in(t.path()), &repo, t.path().join("c0")).await;
    let url = format!("file://{}/store", t.path().display());
    let opts = OpenOptions { inject_rtt: Some(std::time::Duration::from_millis(5)) };
    for round in 0..4 {
        let remote = Arc::new(Remote::open(&url, &opts).unwrap());
        let (f, fs, cache) = fresh_fs(&remote, t.path().join(format!("cache{round}"))).await;
        fs.set_assemble(true);
        let ino = fs.lookup(ROOT_INO, b"big.bin").await.unwrap().ino;
        let h = fs.open(ino).await.unwrap();
        let before = remote.stats();
        let step = 128usize << 10;
        use futures::StreamExt;
        let reads = futures::stream::iter((0..big.len()).step_by(step))
            .map(|off| {
                let (fs, h) = (&fs, &h);
                async move { (off, fs.read(h, off as u64, step as u32).await.unwrap()) }
            })
            .buffered(4);
        let got: Vec<(usize, bytes::Bytes)> = reads.collect().await;
        for (off, b) in got {
            assert!(b[..] == big[off..(off + step).min(big.len())], "round {round}: read at {off}");
        }
        f.drain().await;
        let d = remote.stats().since(&before);
        let OpenFile::Chunked { manifest, .. } = &h else { panic!("not chunked") };
        let packs: std::collections::HashSet<_> = manifest.data_chunks().map(|id| f.pack_of(&id).unwrap()).collect();
        assert!(packs.len() >= 2, "{} packs", packs.len());
        assert_eq!((d.ranged_gets, d.gets), (packs.len() as u64, 0), "round {round}: {d:?}");
        // Read in order: the chunks after each read were started ahead.
        let ahead = fs.chunks_read_ahead();
        assert!(ahead > 1 && ahead < manifest.data_chunks().count() as u64 * 2, "round {round}: {ahead}");
        // Closed, the handle's whole copy is built from the cached packs
        // (their raw members copied by the kernel): no request more.
        fs.close_chunked(&h).await;
        assert_eq!(fs.wait_assemblies(std::time::Duration::from_secs(20)), 0);
        assert_eq!(fs.files_assembled(), 1, "round {round}");
        assert!(std::fs::read(cache.entry_path(&mado_core::Hash::of(&big))).unwrap() == big, "round {round}");
        assert_eq!(remote.stats().since(&before).requests(), d.requests(), "round {round}");
    }
    // A byte of a cached pack rots before the copy is built: the kernel
    // copies it unchecked, the whole file's hash refuses the copy, and
    // no entry or build file is left.
    let remote = Arc::new(Remote::open(&url, &opts).unwrap());
    let (f, fs, cache) = fresh_fs(&remote, t.path().join("cache-rot")).await;
    fs.set_assemble(true);
    let ino = fs.lookup(ROOT_INO, b"big.bin").await.unwrap().ino;
    let h = fs.open(ino).await.unwrap();
    let step = 128u64 << 10;
    for off in (0..big.len() as u64).step_by(step as usize) {
        fs.read(&h, off, step as u32).await.unwrap();
    }
    f.drain().await;
    let OpenFile::Chunked { manifest, .. } = &h else { panic!("not chunked") };
    let chunk3 = manifest.chunks[3].1.unwrap();
    let data = cache.pack_data_path(&f.pack_of(&chunk3).unwrap());
    let mut bytes = std::fs::read(&data).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&data, &bytes).unwrap();
    fs.close_chunked(&h).await;
    assert_eq!(fs.wait_assemblies(std::time::Duration::from_secs(20)), 0);
    assert_eq!(fs.files_assembled(), 0, "a copy with a rotten byte was kept");
    assert!(!cache.entry_path(&mado_core::Hash::of(&big)).exists());
    assert_eq!(std::fs::read_dir(cache.build_dir().unwrap()).unwrap().count(), 0, "a build left behind");
    // The rotten pack was found and healed (its files are gone, the
    // others kept): the chunk is fetched again when next read.
    assert!(!data.exists(), "the rotten pack is still in the cache");
    assert_eq!(cache.stats().healed, 1);
    assert!(!f.is_cached(&chunk3));
    let rotten = f.pack_of(&chunk3);
    for id in manifest.data_chunks().filter(|id| f.pack_of(id) != rotten) {
        assert!(f.is_cached(&id), "a sound pack was dropped");
    }
    let OpenFile::Chunked { starts, .. } = &h else { panic!("not chunked") };
    let at = starts[3];
    let got = fs.read(&h, at, step as u32).await.unwrap();
    assert!(got[..] == big[at as usize..at as usize + got.len()]);
}

/// A large file read in order through a mount that asked for whole copies
/// (`set_assemble`): a read of its first MiB keeps nothing and leaves no
/// file behind; reads in order past half the file keep a copy, built at
/// close (the rest filled in), as does a whole read, under the file's content
/// hash, byte for byte the file; a later open gets it as its backing and
/// builds no other. A mount that did not ask keeps none, nor a workspace's
/// mount, nor a capped cache the file takes over a quarter of. (Only the
/// chunks the reads covered count, not those read ahead of them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_read_in_order_is_kept_whole_past_half_of_it() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let big: Vec<u8> = (0..(12u32 << 20)).map(|i| (i.wrapping_mul(2246822519) >> 11) as u8).collect();
    std::fs::write(repo.join("big.bin"), &big).unwrap();
    commit_all(&repo, "x");
    let remote = store_in(t.path());
    let cache = Arc::new(DiskCache::open(t.path().join("cache"), None).unwrap());
    let root = import_head(&remote, &cache, &repo).await;
    let content = mado_core::Hash::of(&big);

    // Reads `part` of the file in order, 128 KiB at a time, then closes.
    async fn read_in_order(fs: &SnapshotFs, ino: u64, part: usize, big: &[u8]) -> OpenFile {
        let h = fs.open(ino).await.unwrap();
        let mut off = 0;
        while off < part {
            let got = fs.read(&h, off as u64, 128 << 10).await.unwrap();
            assert!(got[..] == big[off..(off + got.len())], "read at {off}");
            off += got.len();
        }
        fs.close_chunked(&h).await;
        h
    }
    let builds = |cache: &DiskCache| std::fs::read_dir(cache.build_dir().unwrap()).unwrap().count();

    // (writable mount, asked for copies, bytes read in order, cache cap, kept)
    let all = big.len();
    let len = all as u64;
    let cases = [
        (false, true, 1 << 20, None, false),
        (false, false, all, None, false),
        (false, true, 7 << 20, None, true),
        (false, true, all, None, true),
        // A workspace's mount keeps none (its files are the upper layer's).
        (true, true, all, None, false),
        // A capped cache: only a file of at most a quarter of the cap.
        (false, true, all, Some(4 * len), true),
        (false, true, all, Some(4 * len - 4), false),
    ];
    for (n, (writable, assemble, part, cap, kept)) in cases.into_iter().enumerate() {
        let case = format!("case {n}: writable {writable}, assemble {assemble}, {part} bytes read, cap {cap:?}");
        let cache = Arc::new(DiskCache::open(t.path().join(format!("c{n}")), cap).unwrap());
        let f = Fetcher::new(remote.clone(), cache.clone());
        let fs = match writable {
            true => {
                SnapshotFs::writable(f, TreeId::from_hash(root), 0, t.path().join(format!("upper{n}")), None).unwrap()
            }
            false => SnapshotFs::new(f, TreeId::from_hash(root), 0),
        };
        fs.set_assemble(assemble);
        let ino = fs.lookup(ROOT_INO, b"big.bin").await.unwrap().ino;
        let h = read_in_order(&fs, ino, part, &big).await;
        assert!(matches!(h, OpenFile::Chunked { backing: None, .. }), "{case}");
        assert_eq!(fs.wait_assemblies(std::time::Duration::from_secs(20)), 0);
        assert_eq!(fs.files_assembled(), kept as u64, "{case}");
        assert_eq!(cache.entry_path(&content).exists(), kept, "{case}");
        assert_eq!(builds(&cache), 0, "{case}: a build left behind");
        if kept {
            assert!(std::fs::read(cache.entry_path(&content)).unwrap() == big, "{case}: the copy differs");
            // A later open reads through the copy, and builds no other.
            let again = read_in_order(&fs, ino, all, &big).await;
            assert!(
                matches!(&again, OpenFile::Chunked { backing: Some(p), .. } if *p == cache.entry_path(&content)),
                "{case}"
            );
            assert_eq!(fs.wait_assemblies(std::time::Duration::from_secs(20)), 0);
            assert_eq!(fs.files_assembled(), 1, "{case}: built twice");
        }
    }
}

/// A workspace opened for a mount through the core API: the lease holder
/// it takes by place, and a mount that keeps its inode numbers opened
/// again after its daemon was killed, under those numbers.
/// Opens workspace `ws` at `at` once the lock of the mount dropped before
/// it is free. A flock belongs to the open file, not the descriptor: a
/// child another test spawns holds a copy of every descriptor from its
/// fork to its exec (where close-on-exec closes it), so the lock can
/// outlive its drop by that moment (this test failed so, once in many
/// runs: "already mounted on this machine").
async fn open_when_free(
    ws: &mado_core::workspace::Workspace,
    at: &std::path::Path,
) -> mado_core::workspace::MountedWorkspace {
    for _ in 0..100 {
        match ws.open_mount(at, false, false).await {
            Err(e) if format!("{e:?}").contains("already mounted") => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            r => return r.unwrap(),
        }
    }
    panic!("{} stayed locked for 5 s after its mount was dropped", at.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_keeps_its_holder_in_place_and_its_numbers_after_a_kill() {
    let t = tempfile::tempdir().unwrap();
    // No other test here opens a workspace: the variable it sets is this one's.
    let (_, _f, ws) = common::small_workspace(t.path()).await;
    let (a, b) = (t.path().join("a"), t.path().join("b"));

    let m = ws.open_mount(&a, false, true).await.unwrap();
    let holder = m.holder.clone();
    let deep = m.fs.lookup(ROOT_INO, b"src").await.unwrap().ino;
    let made = m.fs.mkdir(deep, b"made", 0o755).await.unwrap().ino;
    mado_core::workspace::save_mount_state(&m.fs, &m.state_dir).unwrap();
    // Looked into after the last save: numbered in the log only.
    let inner = m.fs.lookup(m.fs.lookup(deep, b"deep").await.unwrap().ino, b"a.rs").await.unwrap().ino;
    let names: Vec<String> =
        std::fs::read_dir(&m.state_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.iter().any(|n| n.starts_with("inodes-")) && names.iter().any(|n| n.starts_with("inodes.log.")));

    // The daemon killed (its fs gone, nothing more saved); a new one
    // started by the keeper, given the lock, reads the numbers from disk.
    let (lock, state_dir) = (m.lock, m.state_dir.clone());
    drop(m.fs);
    let back = ws.open_handed_over(&a, mado_core::workspace::HandedOver { lock, image: None }).await.unwrap();
    assert!(back.reopened);
    assert_eq!(back.holder, holder, "the same mount keeps its lease holder");
    assert_eq!(back.fs.getattr(made).unwrap().kind, mado_core::vfs::NodeKind::Dir);
    assert_eq!(back.fs.getattr(inner).unwrap().size, 10, "a number from the log names its file");
    assert_eq!(back.fs.lookup(deep, b"made").await.unwrap().ino, made);
    drop(back);

    // Mounted again in place: the holder names the place and stays; at
    // another place it is a new one naming that place.
    let again = open_when_free(&ws, &a).await;
    assert_eq!(again.holder, holder);
    assert_eq!(again.state_dir, state_dir);
    drop(again);
    let moved = open_when_free(&ws, &b).await;
    assert_ne!(moved.holder, holder, "a mount elsewhere took the holder id of the old place");
    assert!(moved.holder.contains(&format!(":{}:", b.display())), "{}", moved.holder);
    assert!(moved.reopened, "the saved changes are picked up at the new place");
}
