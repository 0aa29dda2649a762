//! Unit tests of the filesystem core that need its private parts (hooks
//! between the steps of a checkpoint, node counts).

use super::*;
use crate::cache::DiskCache;
use crate::testutil::local_store;
use crate::upload::Staged;
use std::path::Path;

/// A read-write filesystem over an empty tree, in `dir`.
fn empty_workspace(dir: &Path) -> (SnapshotFs, Arc<DiskCache>) {
    let (remote, cache) = local_store(dir);
    let empty = Tree::normalized(Vec::new()).unwrap().encode();
    let root = Hash::of(&empty);
    cache.put(&root, &empty).unwrap();
    let f = Fetcher::new(remote, cache.clone());
    (SnapshotFs::writable(f, TreeId::from_hash(root), 0, dir.join("upper"), None).unwrap(), cache)
}

#[tokio::test]
async fn a_file_unlinked_while_a_checkpoint_hashes_it_is_counted_once() {
    let d = tempfile::tempdir().unwrap();
    let (fs, cache) = empty_workspace(d.path());
    let (a, f) = fs.create(ROOT_INO, b"gone", 0o644).await.unwrap();
    fs.write(&f, 0, b"hashed, then unlinked").unwrap();
    let (_, g) = fs.create(ROOT_INO, b"kept", 0o644).await.unwrap();
    fs.write(&g, 0, b"stays").unwrap();
    let mut staged = Staged::default();
    let unlink = || {
        futures::executor::block_on(fs.unlink(ROOT_INO, b"gone")).unwrap();
    };
    let b = fs.build_with(&cache, &mut staged, &Skips::default(), || {}, unlink).unwrap();
    assert!(fs.getattr(a.ino).is_ok());
    assert_eq!(b.files_read, 2, "{b:?}");
    assert_eq!(b.files_unchanged, 0, "{b:?}");
    // Nothing changed since: the next build reads nothing and knows one file.
    let b = fs.build(&cache, &mut Staged::default()).unwrap();
    assert_eq!((b.files_read, b.files_unchanged, b.trees_built), (0, 1, 0), "{b:?}");
}

#[tokio::test]
async fn an_unlinked_open_file_keeps_its_bytes_until_the_last_close_and_forget() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    fs.note_lookup(a.ino, 1);
    fs.write(&f, 0, b"still here").unwrap();
    let reader = fs.open(a.ino).await.unwrap();
    fs.unlink(ROOT_INO, b"f").await.unwrap();
    let blob = d.path().join("upper").join("1");
    assert!(blob.exists(), "the blob went while handles were open");
    assert_eq!(&fs.read(&reader, 0, 64).await.unwrap()[..], b"still here");
    assert!(fs.getattr(a.ino).is_ok(), "an open file answers getattr (fstat)");
    fs.release(a.ino);
    assert!(blob.exists(), "one handle is still open");
    fs.release(a.ino);
    assert!(fs.getattr(a.ino).is_ok(), "the kernel still holds a reference");
    fs.forget(a.ino, 1);
    assert!(fs.getattr(a.ino).is_err(), "forgotten and unlinked: dropped");
    // Its blob goes once a durable save no longer names it (here: at unmount).
    assert!(blob.exists());
    fs.drop_spares();
    assert!(!blob.exists(), "the unmount deletes the blob");
}

/// FUSE's no-open mode: the kernel opens and closes files without a word,
/// so a reference it holds is all that says a process may still read an
/// unlinked file. Its bytes stay until the kernel forgets the inode.
#[tokio::test]
async fn without_opens_an_unlinked_file_the_kernel_holds_stays_readable_until_forgotten() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    fs.untrack_opens();
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    fs.note_lookup(a.ino, 2);
    fs.write(&f, 0, b"read after unlink").unwrap();
    drop(f);
    fs.release(a.ino);
    fs.unlink(ROOT_INO, b"f").await.unwrap();
    let blob = d.path().join("upper").join("1");
    assert!(blob.exists(), "the blob went while the kernel held the inode");
    // The first this process hears of the reader is its READ.
    let reader = fs.open(a.ino).await.unwrap();
    assert_eq!(&fs.read(&reader, 0, 64).await.unwrap()[..], b"read after unlink");
    fs.sync_upper(a.ino, false).unwrap();
    fs.release(a.ino);
    fs.forget(a.ino, 1);
    assert!(blob.exists(), "one reference is still held");
    assert!(fs.open(a.ino).await.is_ok(), "still held: still opens");
    fs.release(a.ino);
    fs.forget(a.ino, 1);
    assert!(fs.getattr(a.ino).is_err(), "forgotten and unlinked: the node goes");
    // And its upper file is free: kept for reuse until the unmount.
    assert!(blob.exists());
    fs.drop_spares();
    assert!(!blob.exists(), "forgotten and unlinked: the blob goes");
}

/// A removed file's upper file is kept for a later file instead of being
/// unlinked, whole until then, and reused only once a durable save no
/// longer names it (a crash before that brings back a state that may).
#[tokio::test]
async fn a_freed_upper_file_is_reused_only_after_a_save_that_no_longer_names_it() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let upper = |n: u32| d.path().join("upper").join(n.to_string());
    let (a, f) = fs.create(ROOT_INO, b"old", 0o644).await.unwrap();
    fs.write(&f, 0, b"old bytes").unwrap();
    drop(f);
    fs.release(a.ino);
    fs.unlink(ROOT_INO, b"old").await.unwrap();
    assert_eq!(std::fs::read(upper(1)).unwrap(), b"old bytes", "a freed file keeps its bytes until reused");
    // No save since: a new file gets a new one.
    let (b, g) = fs.create(ROOT_INO, b"new", 0o600).await.unwrap();
    assert!(upper(2).exists());
    fs.write(&g, 0, b"second").unwrap();
    drop(g);
    fs.release(b.ino);
    // Saved since the free: the next file reuses it, emptied, with its own mode.
    fs.note_saved(fs.changes());
    let (c, h) = fs.create(ROOT_INO, b"third", 0o640).await.unwrap();
    assert!(!upper(3).exists(), "a new upper file was made while a spare one was free");
    assert_eq!(std::fs::read(upper(1)).unwrap(), b"", "the reused file starts empty");
    assert_eq!(std::fs::metadata(upper(1)).unwrap().permissions().mode() & 0o777, 0o640);
    fs.write(&h, 0, b"3").unwrap();
    let r = fs.open(c.ino).await.unwrap();
    assert_eq!(&fs.read(&r, 0, 64).await.unwrap()[..], b"3");
    assert_eq!(std::fs::read(upper(2)).unwrap(), b"second", "another file's bytes are untouched");
    // At unmount the spare files go.
    fs.unlink(ROOT_INO, b"new").await.unwrap();
    assert!(upper(2).exists());
    fs.drop_spares();
    assert!(!upper(2).exists());
    assert!(upper(1).exists());
}

/// A daemon killed after making upper files but before saving leaves them
/// behind under numbers its saved state hands out again: the next files
/// (created or copied up) take them over.
#[tokio::test]
async fn upper_files_a_killed_daemon_left_behind_are_taken_over() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    std::fs::write(d.path().join("upper/1"), b"left behind by a killed daemon").unwrap();
    std::fs::set_permissions(d.path().join("upper/1"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let (a, f) = fs.create(ROOT_INO, b"new", 0o600).await.unwrap();
    fs.write(&f, 0, b"mine").unwrap();
    let r = fs.open(a.ino).await.unwrap();
    assert_eq!(&fs.read(&r, 0, 64).await.unwrap()[..], b"mine");
    assert_eq!(std::fs::metadata(d.path().join("upper/1")).unwrap().permissions().mode() & 0o777, 0o600);
}

#[tokio::test]
async fn opening_a_file_unlinked_before_the_open_is_enoent_not_eio() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    fs.note_lookup(a.ino, 1);
    fs.write(&f, 0, b"x").unwrap();
    fs.release(a.ino);
    fs.unlink(ROOT_INO, b"f").await.unwrap();
    match fs.open(a.ino).await {
        Err(Error::NotFound(_)) => {}
        Err(e) => panic!("expected NotFound, got {e}"),
        Ok(_) => panic!("opened a removed file"),
    }
}

/// A mount handed to another process keeps every number the kernel
/// holds: each node comes back under its inode number with its lookups,
/// and new nodes take numbers never handed out before (a plain load
/// numbers the nodes afresh: the kernel's numbers would name others).
#[tokio::test]
async fn a_handed_over_state_keeps_the_kernels_inode_numbers() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let a = fs.mkdir(ROOT_INO, b"a", 0o755).await.unwrap();
    fs.note_lookup(a.ino, 2);
    // A gap in the numbers: a file made and removed between the others.
    let (gone, _) = fs.create(ROOT_INO, b"gone", 0o644).await.unwrap();
    fs.unlink(ROOT_INO, b"gone").await.unwrap();
    let (f, h) = fs.create(a.ino, b"f", 0o644).await.unwrap();
    fs.note_lookup(f.ino, 1);
    fs.write(&h, 0, b"kept").unwrap();
    let (saved, image) = fs.save_state_and_inodes().unwrap();
    assert_eq!(saved, fs.save_state().unwrap(), "the state saved is the same either way");
    assert_eq!(InodeImage::decode(&image.encode()).unwrap(), image);
    assert!(image.nodes.contains(&(a.ino, 2)) && image.nodes.contains(&(f.ino, 1)), "{image:?}");
    let upper = d.path().join("upper");
    let plain = SnapshotFs::load_state(fs.fetcher().clone(), &saved, upper.clone(), None).unwrap();
    let moved = plain.lookup(a.ino, b"f").await.map(|x| x.ino).ok();
    assert_ne!(moved, Some(f.ino), "a plain load kept the numbers: this test shows nothing");

    let back = SnapshotFs::load_handed_over(fs.fetcher().clone(), &saved, upper.clone(), None, &image).unwrap();
    assert_eq!(back.lookup(ROOT_INO, b"a").await.unwrap().ino, a.ino);
    // By number alone, as the kernel asks.
    assert_eq!(back.getattr(f.ino).unwrap().size, 4);
    let r = back.open(f.ino).await.unwrap();
    assert_eq!(&back.read(&r, 0, 16).await.unwrap()[..], b"kept");
    let n = back.mkdir(ROOT_INO, b"new", 0o755).await.unwrap();
    assert!(n.ino >= image.next_ino && n.ino > gone.ino && n.ino > f.ino, "{} reused", n.ino);
    // And the kernel's references to them: a's two, f's one.
    assert_eq!(back.st().get(a.ino).unwrap().lookups.get(), 2);
    assert_eq!(back.st().get(f.ino).unwrap().lookups.get(), 1);

    // Numbers that do not fit the state are refused, never half loaded.
    let load = |im: &InodeImage| SnapshotFs::load_handed_over(fs.fetcher().clone(), &saved, upper.clone(), None, im);
    let mut short = image.clone();
    short.nodes.pop();
    let mut twice = image.clone();
    twice.nodes[2].0 = twice.nodes[1].0;
    let mut beyond = image.clone();
    beyond.next_ino = 2;
    for bad in [short, twice, beyond] {
        let e = load(&bad).err().unwrap();
        assert!(e.to_string().contains("handed over"), "{e}");
    }
    assert!(InodeImage::decode(&image.encode()[..5]).is_err());
}

/// New entries a `.gitignore` names are skipped, an ignored directory
/// whole: what is inside it is not looked at again (nor named).
#[tokio::test]
async fn an_ignored_new_directory_is_skipped_whole_and_not_looked_into() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let (_, rules) = fs.create(ROOT_INO, b".gitignore", 0o644).await.unwrap();
    fs.write(&rules, 0, b"target/\n*.log\n").unwrap();
    let target = fs.mkdir(ROOT_INO, b"target", 0o755).await.unwrap();
    let debug = fs.mkdir(target.ino, b"debug", 0o755).await.unwrap();
    fs.create(debug.ino, b"x.o", 0o644).await.unwrap();
    fs.create(debug.ino, b"y.log", 0o644).await.unwrap();
    let (log, _) = fs.create(ROOT_INO, b"run.log", 0o644).await.unwrap();
    fs.create(ROOT_INO, b"kept.txt", 0o644).await.unwrap();
    let src = fs.mkdir(ROOT_INO, b"src", 0o755).await.unwrap();
    let (nested_log, _) = fs.create(src.ino, b"trace.log", 0o644).await.unwrap();
    let skips = fs.ignored_new_entries().await.unwrap();
    let want: std::collections::HashSet<u64> = [target.ino, log.ino, nested_log.ino].into();
    assert_eq!(skips.skip, want);
}

#[tokio::test]
async fn deep_directories_save_and_load_without_recursion() {
    let d = tempfile::tempdir().unwrap();
    let (fs, cache) = empty_workspace(d.path());
    let mut dir = ROOT_INO;
    for _ in 0..5000 {
        dir = fs.mkdir(dir, b"d", 0o755).await.unwrap().ino;
    }
    let (_, f) = fs.create(dir, b"leaf", 0o644).await.unwrap();
    fs.write(&f, 0, b"deep").unwrap();
    let saved = fs.save_state().unwrap();
    let f2 = fs.fetcher().clone();
    let back = SnapshotFs::load_state(f2, &saved, d.path().join("upper"), None).unwrap();
    let mut ino = ROOT_INO;
    for _ in 0..5000 {
        ino = back.lookup(ino, b"d").await.unwrap().ino;
    }
    let leaf = back.lookup(ino, b"leaf").await.unwrap();
    let h = back.open(leaf.ino).await.unwrap();
    assert_eq!(&back.read(&h, 0, 16).await.unwrap()[..], b"deep");
    // Both build the same tree.
    let (x, y) =
        (fs.build(&cache, &mut Staged::default()).unwrap(), back.build(&cache, &mut Staged::default()).unwrap());
    assert_eq!(x.root, y.root);
    // Any flipped byte or cut reads as corrupt, never as an empty overlay.
    for at in [0, 5, saved.len() / 2, saved.len() - 1] {
        let mut bad = saved.clone();
        bad[at] ^= 0x40;
        let e = SnapshotFs::load_state(fs.fetcher().clone(), &bad, d.path().join("upper"), None).err().unwrap();
        assert!(e.to_string().contains("unreadable"), "{e}");
    }
    assert!(
        SnapshotFs::load_state(fs.fetcher().clone(), &saved[..saved.len() - 3], d.path().join("upper"), None).is_err()
    );
}

/// A read-write filesystem over a root holding `dir`, a directory of 100
/// files (`f0`..`f99`, 7 bytes each), in `d`.
pub(super) fn hundred_files(d: &Path) -> SnapshotFs {
    let (remote, cache) = local_store(d);
    // A tree of 100 files in one directory, below the root.
    let file = Hash::of(b"content");
    cache.put(&file, b"content").unwrap();
    let entries: Vec<Entry> = (0..100)
        .map(|i| Entry { name: format!("f{i}").into_bytes(), kind: Kind::File, chunked: false, size: 7, id: file })
        .collect();
    let sub = Tree::normalized(entries).unwrap().encode();
    let sub_id = Hash::of(&sub);
    cache.put(&sub_id, &sub).unwrap();
    let root = Tree::normalized(vec![Entry {
        name: b"dir".to_vec(),
        kind: Kind::Directory,
        chunked: false,
        size: 0,
        id: sub_id,
    }])
    .unwrap()
    .encode();
    let root_id = Hash::of(&root);
    cache.put(&root_id, &root).unwrap();
    SnapshotFs::writable(Fetcher::new(remote, cache), TreeId::from_hash(root_id), 0, d.join("upper"), None).unwrap()
}

#[tokio::test]
async fn forgotten_clean_nodes_fold_back_into_their_tree() {
    let d = tempfile::tempdir().unwrap();
    let fs = hundred_files(d.path());
    let dir = fs.lookup(ROOT_INO, b"dir").await.unwrap().ino;
    fs.note_lookup(dir, 1);
    let list = fs.readdir(dir).await.unwrap();
    for (_, a) in &list {
        fs.note_lookup(a.ino, 1);
    }
    assert_eq!(fs.node_count(), 102);
    // One file still held by the kernel: nothing folds.
    for (_, a) in &list[1..] {
        fs.forget(a.ino, 1);
    }
    assert_eq!(fs.node_count(), 102);
    fs.forget(list[0].1.ino, 1);
    assert_eq!(fs.node_count(), 2, "the directory's children fold back into its tree id");
    // A folded directory is never taken for empty.
    match fs.rmdir(ROOT_INO, b"dir").await {
        Err(Error::Fs { errno, .. }) if errno == Errno::NOTEMPTY.raw_os_error() => {}
        r => panic!("rmdir of a folded, non-empty directory: {r:?}"),
    }
    // A counted lookup holds its node against folding.
    let held = fs.lookup_counted(dir, b"f7").await.unwrap();
    let others = fs.readdir(dir).await.unwrap();
    fs.forget(others[0].1.ino, 0);
    assert!(fs.getattr(held.ino).is_ok(), "a node the kernel holds was folded away");
    fs.forget(held.ino, 1);
    assert_eq!(fs.node_count(), 2);
    // A lower file unlinked while nobody has it open is gone for an
    // open by inode; one unlinked while open can be opened again
    // through that handle's inode (`/proc/self/fd/N`).
    // (The kernel still holds its inode: the node is there, detached.)
    let gone = fs.lookup_counted(dir, b"f3").await.unwrap();
    fs.unlink(dir, b"f3").await.unwrap();
    assert!(fs.getattr(gone.ino).is_ok());
    assert!(matches!(fs.open(gone.ino).await, Err(Error::NotFound(_))));
    fs.forget(gone.ino, 1);
    let kept = fs.lookup(dir, b"f4").await.unwrap();
    let h = fs.open(kept.ino).await.unwrap();
    fs.unlink(dir, b"f4").await.unwrap();
    let again = fs.open(kept.ino).await.expect("reopened through an open handle");
    assert_eq!(&fs.read(&again, 0, 16).await.unwrap()[..], b"content");
    drop((h, again));
    fs.release(kept.ino);
    fs.release(kept.ino);
    assert!(fs.getattr(kept.ino).is_err(), "closed, unlinked and never held by the kernel: dropped");
    // And come back on the next look, with new inode numbers.
    let again = fs.readdir(dir).await.unwrap();
    assert_eq!(again.len(), 98);
    assert!(again.iter().all(|(_, a)| a.ino > list.iter().map(|(_, b)| b.ino).max().unwrap()));
}

#[tokio::test]
async fn folding_goes_up_while_whole_directories_are_idle() {
    let d = tempfile::tempdir().unwrap();
    let (remote, cache) = local_store(d.path());
    let put_tree = |entries: Vec<Entry>| {
        let t = Tree::normalized(entries).unwrap().encode();
        let id = Hash::of(&t);
        cache.put(&id, &t).unwrap();
        id
    };
    let file = Hash::of(b"x");
    cache.put(&file, b"x").unwrap();
    let f = |n: &str| Entry { name: n.into(), kind: Kind::File, chunked: false, size: 1, id: file };
    let dirent = |n: &str, id| Entry { name: n.into(), kind: Kind::Directory, chunked: false, size: 0, id };
    let b = put_tree(vec![f("x"), f("y")]);
    let a = put_tree(vec![dirent("b", b)]);
    let root = put_tree(vec![dirent("a", a)]);
    let fs = SnapshotFs::writable(
        Fetcher::new(remote, cache.clone()),
        TreeId::from_hash(root),
        0,
        d.path().join("upper"),
        None,
    )
    .unwrap();
    let a = fs.lookup_counted(ROOT_INO, b"a").await.unwrap().ino;
    let b = fs.lookup_counted(a, b"b").await.unwrap().ino;
    let x = fs.lookup_counted(b, b"x").await.unwrap().ino;
    let y = fs.lookup_counted(b, b"y").await.unwrap().ino;
    assert_eq!(fs.node_count(), 5);
    fs.forget(a, 1);
    fs.forget(b, 1);
    fs.forget(x, 1);
    assert_eq!(fs.node_count(), 5, "y is still held");
    fs.forget(y, 1);
    assert_eq!(fs.node_count(), 1, "b's files, then b, then a fold away");
    assert_eq!(fs.readdir(ROOT_INO).await.unwrap().len(), 1);
}

/// Decoded trees are bounded: past the bound the cache starts over, and a
/// directory whose tree left memory is listed, looked up, folded and
/// unfolded again from its local copy (no request), with the same answers.
#[tokio::test]
async fn trees_leave_memory_past_the_bound_and_come_back_from_the_disk() {
    let d = tempfile::tempdir().unwrap();
    let (remote, cache) = local_store(d.path());
    let put = |bytes: Vec<u8>| {
        let id = Hash::of(&bytes);
        cache.put(&id, &bytes).unwrap();
        id
    };
    let mut dirs = Vec::new();
    for i in 0..6 {
        let files = (0..3)
            .map(|j| {
                let body = format!("file {i}/{j}").into_bytes();
                Entry {
                    name: format!("f{j}").into(),
                    kind: Kind::File,
                    chunked: false,
                    size: body.len() as u64,
                    id: put(body),
                }
            })
            .collect();
        let id = put(Tree::normalized(files).unwrap().encode());
        dirs.push(Entry { name: format!("d{i}").into(), kind: Kind::Directory, chunked: false, size: 0, id });
    }
    let root = put(Tree::normalized(dirs).unwrap().encode());
    let fs = SnapshotFs::new(Fetcher::new(remote.clone(), cache.clone()), TreeId::from_hash(root), 0);
    fs.trees.write().unwrap().set_cap(4);
    let before = remote.stats();
    for round in 0..2 {
        let mut held = Vec::new();
        for i in 0..6 {
            let dir = fs.lookup_counted(ROOT_INO, format!("d{i}").as_bytes()).await.unwrap().ino;
            held.push(dir);
            assert_eq!(fs.readdir(dir).await.unwrap().len(), 3, "round {round}");
            for j in 0..3 {
                let f = fs.lookup_counted(dir, format!("f{j}").as_bytes()).await.unwrap().ino;
                held.push(f);
                let h = fs.open(f).await.unwrap();
                assert_eq!(&fs.read(&h, 0, 100).await.unwrap()[..], format!("file {i}/{j}").as_bytes());
                fs.release(f);
            }
            let (entries, cap) = fs.trees.read().unwrap().held();
            assert!(entries <= cap.max(6), "{entries} entries held");
        }
        // The kernel forgets everything: it all folds into tree ids, the
        // trees no longer in memory notwithstanding.
        for ino in held.into_iter().rev() {
            fs.forget(ino, 1);
        }
        assert_eq!(fs.node_count(), 1, "round {round}");
    }
    assert_eq!(remote.stats().since(&before).gets, 0, "all of it from the disk cache");
}

/// Preloading visits every tree once, whether or not it is already local:
/// a directory in the disk cache may hold one that is only in the store
/// (a checkpoint's build needs every tree local when the base has no stat
/// object).
#[tokio::test]
async fn preloading_reaches_a_tree_below_one_already_in_the_cache() {
    let d = tempfile::tempdir().unwrap();
    let (remote, cache) = local_store(d.path());
    let dir = |name: &str, id| Entry { name: name.into(), kind: Kind::Directory, chunked: false, size: 0, id };
    let deep = Tree::normalized(Vec::new()).unwrap().encode();
    let deep_id = Hash::of(&deep);
    remote.put_object(crate::store::Space::Objects, &deep_id, deep.into()).await.unwrap();
    let mid = Tree::normalized(vec![dir("deep", deep_id)]).unwrap().encode();
    let mid_id = Hash::of(&mid);
    cache.put(&mid_id, &mid).unwrap();
    let root = Tree::normalized(vec![dir("mid", mid_id)]).unwrap().encode();
    let root_id = Hash::of(&root);
    cache.put(&root_id, &root).unwrap();
    let f = Fetcher::new(remote, cache);
    let fs = SnapshotFs::new(f.clone(), TreeId::from_hash(root_id), 0);
    assert!(!f.is_local(&deep_id));
    assert_eq!(fs.preload_trees().await.unwrap(), 3);
    assert!(f.is_local(&deep_id), "the tree only the store had is local now");
}

#[tokio::test]
async fn a_checkpoint_skips_a_file_unlinked_under_it_but_not_a_lost_blob() {
    let d = tempfile::tempdir().unwrap();
    let (fs, cache) = empty_workspace(d.path());
    for name in [&b"gone"[..], b"kept"] {
        let (a, f) = fs.create(ROOT_INO, name, 0o644).await.unwrap();
        fs.write(&f, 0, name).unwrap();
        fs.release(a.ino);
    }
    // Unlinked after the listing, before its read: skipped.
    let unlink = || futures::executor::block_on(fs.unlink(ROOT_INO, b"gone")).unwrap();
    let b = fs.build_with(&cache, &mut Staged::default(), &Skips::default(), unlink, || {}).unwrap();
    assert_eq!(b.files_read, 1, "{b:?}");
    // A blob that vanished under a file still in the tree is an error,
    // never a tree that silently lacks the file.
    let (a, f) = fs.create(ROOT_INO, b"lost", 0o644).await.unwrap();
    fs.write(&f, 0, b"lost").unwrap();
    fs.release(a.ino);
    let blob = match &fs.st().get(a.ino).unwrap().body {
        Body::Upper { blob, .. } => *blob,
        _ => unreachable!(),
    };
    let remove = || std::fs::remove_file(d.path().join("upper").join(blob.to_string())).unwrap();
    let e = fs.build_with(&cache, &mut Staged::default(), &Skips::default(), remove, || {}).unwrap_err();
    assert!(e.to_string().contains(&blob.to_string()), "{e}");
}

/// Times and owners as a local filesystem keeps them: a write moves the
/// mtime and the ctime with it; chmod and chown move only the ctime; an
/// atime set apart stays apart; names added or removed move the
/// directory's mtime; a node whose extra times and owner are all undone
/// sheds them. All of it survives a save and reload.
#[tokio::test]
async fn writes_chmod_chown_and_utimes_move_the_times_a_local_filesystem_would() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    let long_ago = (1_000, 1);
    let set = |mtime, atime| SetAttr { mtime, atime, ..Default::default() };
    let b = fs.setattr(a.ino, set(Some(long_ago), Some((500, 2)))).await.unwrap();
    assert_eq!(((b.mtime, b.mtime_ns), b.atime), (long_ago, (500, 2)));
    assert!(b.ctime.0 > 1_000_000_000, "utimes moves the ctime: {b:?}");
    // A write: a new mtime, and the ctime with it; the atime stays.
    fs.write(&f, 0, b"new bytes").unwrap();
    let w = fs.getattr(a.ino).unwrap();
    assert!(w.mtime > 1_000_000_000, "{w:?}");
    assert_eq!(w.ctime, (w.mtime, w.mtime_ns));
    assert_eq!(w.atime, (500, 2));
    // chmod: the ctime moves, the mtime does not.
    fs.setattr(a.ino, set(Some(long_ago), None)).await.unwrap();
    let c = fs.setattr(a.ino, SetAttr { mode: Some(0o600), ..Default::default() }).await.unwrap();
    assert_eq!((c.mtime, c.mtime_ns), long_ago);
    assert!(c.ctime.0 > 1_000_000_000, "{c:?}");
    // chown to someone else, then back to the mount's owner.
    let me = mount_owner();
    let o = fs.setattr(a.ino, SetAttr { uid: Some(4242), ..Default::default() }).await.unwrap();
    assert_eq!(o.owner, Some((4242, me.1)));
    // A directory gains a name: its mtime moves.
    fs.setattr(ROOT_INO, set(Some(long_ago), None)).await.unwrap();
    fs.mkdir(ROOT_INO, b"sub", 0o755).await.unwrap();
    let r = fs.getattr(ROOT_INO).unwrap();
    assert!(r.mtime > 1_000_000_000 && r.ctime == (r.mtime, r.mtime_ns), "{r:?}");
    // Saved and loaded: owner and times as they were.
    let saved = fs.save_state().unwrap();
    let back = SnapshotFs::load_state(fs.fetcher().clone(), &saved, d.path().join("upper"), None).unwrap();
    let a2 = back.lookup(ROOT_INO, b"f").await.unwrap();
    assert_eq!((a2.owner, a2.atime, a2.ctime), (o.owner, o.atime, o.ctime));
    // Back to the mount's owner, times with the mtime: nothing extra kept.
    let n = fs.setattr(a.ino, SetAttr { uid: Some(me.0), ..Default::default() }).await.unwrap();
    assert_eq!(n.owner, None);
    fs.write(&f, 0, b"again").unwrap();
    let st = fs.st();
    let node = st.get(a.ino).unwrap();
    assert!(node.meta.as_ref().is_some_and(|m| m.owner.is_none() && m.ctime.is_none()), "{:?}", node.meta);
}

/// A saved state lists what it holds beyond its snapshot without that
/// snapshot (gc may have deleted it): upper files at their paths (a hard
/// link's other name too), symlinks and new directories, parents first.
#[tokio::test]
async fn a_saved_state_lists_its_changes_without_its_snapshot() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let src = fs.mkdir(ROOT_INO, b"src", 0o755).await.unwrap().ino;
    let (a, f) = fs.create(src, b"main.rs", 0o755).await.unwrap();
    fs.write(&f, 0, b"fn main() {}\n").unwrap();
    fs.link(a.ino, ROOT_INO, b"main-again.rs").await.unwrap();
    fs.symlink(ROOT_INO, b"link", b"src/main.rs").await.unwrap();
    fs.mkdir(src, b"empty", 0o700).await.unwrap();
    let saved = fs.save_state().unwrap();
    let got = SnapshotFs::saved_changes(&saved).unwrap();
    let blob = got
        .iter()
        .find_map(|c| match c {
            SavedChange::File { path, blob, .. } if path == b"src/main.rs" => Some(*blob),
            _ => None,
        })
        .expect("the upper file");
    assert_eq!(std::fs::read(d.path().join("upper").join(blob.to_string())).unwrap(), b"fn main() {}\n");
    let shown: Vec<String> = got
        .iter()
        .map(|c| match c {
            SavedChange::File { path, blob: b, perm, .. } => {
                assert_eq!(*b, blob);
                format!("file {} {:o}", String::from_utf8_lossy(path), perm & 0o777)
            }
            SavedChange::Symlink { path, target } => {
                format!("link {} {}", String::from_utf8_lossy(path), String::from_utf8_lossy(target))
            }
            SavedChange::Dir { path, perm } => format!("dir {} {:o}", String::from_utf8_lossy(path), perm & 0o777),
        })
        .collect();
    assert_eq!(
        shown,
        ["link link src/main.rs", "file main-again.rs 755", "dir src 755", "dir src/empty 700", "file src/main.rs 755"]
    );
    // A torn state is refused, never read as fewer changes.
    assert!(SnapshotFs::saved_changes(&saved[..saved.len() - 1]).is_err());
}

/// A deleted file larger than a spare gives its space back at once (its
/// node's size said 0, as made, so every deleted file was kept whole
/// until reused); a state loaded after a kill sweeps the upper files it
/// does not name below its `next_blob` (a killed daemon's spare or
/// unlinked files, which stayed for ever).
#[tokio::test]
async fn deleted_files_give_their_space_back() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let upper = |n: u32| d.path().join("upper").join(n.to_string());
    let (a, f) = fs.create(ROOT_INO, b"big", 0o644).await.unwrap();
    fs.write(&f, 0, &vec![7u8; 1 << 20]).unwrap();
    drop(f);
    fs.release(a.ino);
    fs.unlink(ROOT_INO, b"big").await.unwrap();
    // Not before a durable save that no longer names it: a kill -9 now
    // would bring back a name with no bytes (issue #44).
    assert!(upper(1).exists(), "a deleted file went before a save that no longer names it");
    fs.note_saved(fs.changes());
    assert!(!upper(1).exists(), "a deleted 1 MiB file kept its space after a save");
    // Small ones are kept for reuse; a kill then leaves them, and the
    // next load removes them (and keeps what its state names).
    let (b, g) = fs.create(ROOT_INO, b"small", 0o644).await.unwrap();
    fs.write(&g, 0, b"small").unwrap();
    drop(g);
    fs.release(b.ino);
    let (c, h) = fs.create(ROOT_INO, b"kept", 0o644).await.unwrap();
    fs.write(&h, 0, b"kept").unwrap();
    drop(h);
    fs.release(c.ino);
    fs.unlink(ROOT_INO, b"small").await.unwrap();
    assert!(upper(2).exists(), "a small freed file is a spare");
    let saved = fs.save_state().unwrap();
    let back = SnapshotFs::load_state(fs.fetcher().clone(), &saved, d.path().join("upper"), None).unwrap();
    assert!(!upper(2).exists(), "the spare a killed daemon left was not swept");
    let kept = back.lookup(ROOT_INO, b"kept").await.unwrap();
    let r = back.open(kept.ino).await.unwrap();
    assert_eq!(&back.read(&r, 0, 16).await.unwrap()[..], b"kept");
}

/// The size a checkpoint records for a file is the length of the bytes it
/// hashed, and those bytes are the file at one moment, whatever a writer
/// does meanwhile: a writer truncating to random sizes and rewriting runs
/// beside back-to-back builds, and every entry of every build is checked
/// against the blob it names (issue #44: entries said 388377 bytes for a
/// blob of 388386, and the snapshot could never be read back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_beside_a_rewriting_writer_records_each_file_as_its_bytes() {
    let d = tempfile::tempdir().unwrap();
    let (fs, cache) = empty_workspace(d.path());
    let fs = Arc::new(fs);
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    fs.write(&f, 0, &[1u8; 5000]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let writer = {
        let (fs, stop, ops) = (fs.clone(), stop.clone(), ops.clone());
        std::thread::spawn(move || {
            let mut x = 12345u64;
            while !stop.load(Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let len = (x >> 33) % 20_000;
                futures::executor::block_on(fs.setattr(a.ino, SetAttr { size: Some(len), ..Default::default() }))
                    .unwrap();
                let at = (x >> 20) % 20_000;
                fs.write(&f, at, &vec![(x >> 8) as u8; 1 + (x % 3000) as usize]).unwrap();
                ops.fetch_add(1, Relaxed);
            }
        })
    };
    // At least 200 builds, and on until the writer has rewritten the file
    // a thousand times (a loaded machine may start it late).
    let mut builds = 0;
    let t = std::time::Instant::now();
    while builds < 200 || (ops.load(Relaxed) < 1000 && t.elapsed() < Duration::from_secs(60)) {
        let mut staged = Staged::default();
        let b = fs.build(&cache, &mut staged).unwrap();
        let root = Tree::decode(&cache.get(&b.root).unwrap()).unwrap();
        let e = root.entries.iter().find(|e| e.name == b"f").unwrap();
        let blob = cache.get(&e.id).unwrap();
        assert_eq!(blob.len() as u64, e.size, "the entry's size is not its blob's length");
        builds += 1;
    }
    stop.store(true, Relaxed);
    writer.join().unwrap();
    assert!(ops.load(Relaxed) >= 1000, "the writer made {} rewrites", ops.load(Relaxed));
}

/// kill -9 after an unsynced append: the saved state is older than the
/// upper file. Loaded, the node takes the file's length, so the mount and
/// the checkpoint show the same bytes.
#[tokio::test]
async fn a_loaded_state_takes_each_upper_files_length() {
    let d = tempfile::tempdir().unwrap();
    let (fs, cache) = empty_workspace(d.path());
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    fs.write(&f, 0, b"synced").unwrap();
    let saved = fs.save_state().unwrap();
    fs.write(&f, 6, b" and appended").unwrap();
    drop(f);
    fs.release(a.ino);
    let back = SnapshotFs::load_state(fs.fetcher().clone(), &saved, d.path().join("upper"), None).unwrap();
    let at = back.lookup(ROOT_INO, b"f").await.unwrap();
    assert_eq!(at.size, 19);
    let r = back.open(at.ino).await.unwrap();
    assert_eq!(&back.read(&r, 0, 64).await.unwrap()[..], b"synced and appended");
    let b = back.build(&cache, &mut Staged::default()).unwrap();
    let root = Tree::decode(&cache.get(&b.root).unwrap()).unwrap();
    assert_eq!(root.entries[0].size, 19);
    assert_eq!(&cache.get(&root.entries[0].id).unwrap()[..], b"synced and appended");
}

/// A saved state naming an upper file that is gone loads without that
/// name, which is reported, instead of a file no read or checkpoint can
/// get past.
#[tokio::test]
async fn a_state_naming_a_missing_upper_file_loads_without_it_and_says_so() {
    let d = tempfile::tempdir().unwrap();
    let (fs, cache) = empty_workspace(d.path());
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755).await.unwrap();
    for name in [&b"lost"[..], b"kept"] {
        let (a, f) = fs.create(dir.ino, name, 0o644).await.unwrap();
        fs.write(&f, 0, name).unwrap();
        fs.release(a.ino);
    }
    let lost = fs.lookup(dir.ino, b"lost").await.unwrap();
    fs.link(lost.ino, ROOT_INO, b"alias").await.unwrap();
    let saved = fs.save_state().unwrap();
    let blob = match &fs.st().get(lost.ino).unwrap().body {
        Body::Upper { blob, .. } => *blob,
        _ => unreachable!(),
    };
    std::fs::remove_file(d.path().join("upper").join(blob.to_string())).unwrap();
    let back = SnapshotFs::load_state(fs.fetcher().clone(), &saved, d.path().join("upper"), None).unwrap();
    assert_eq!(back.lost_on_load(), &[b"alias".to_vec(), b"d/lost".to_vec()]);
    let names: Vec<Vec<u8>> = back.readdir(ROOT_INO).await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec![b"d".to_vec()]);
    let b = back.build(&cache, &mut Staged::default()).unwrap();
    assert_eq!(b.files_read, 1, "{b:?}");
}

/// A staged content's length is checked against every tree entry naming
/// it: no tree is encoded that could not be read back.
#[test]
fn a_tree_entry_whose_size_is_not_its_contents_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(d.path().join("cache"), None).unwrap();
    let mut staged = Staged::default();
    let (id, _) = staged.content(&cache, b"nine byte").unwrap();
    let entry = |size| Entry { name: b"f".to_vec(), kind: Kind::File, chunked: false, size, id };
    assert!(staged.tree(&cache, &Tree::normalized(vec![entry(9)]).unwrap()).is_ok());
    let e = staged.tree(&cache, &Tree::normalized(vec![entry(8)]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("\"f\" as 8 bytes"), "{e}");
}

/// fallocate: mode 0 grows a file (zeros read back), KEEP_SIZE leaves its
/// size, PUNCH_HOLE|KEEP_SIZE makes zeros of a range; another mode is
/// EOPNOTSUPP; a checkpoint records what reads back (issue #48).
#[tokio::test]
async fn fallocate_preallocates_keeps_size_and_punches_holes() {
    use rustix::fs::FallocateFlags as F;
    let d = tempfile::tempdir().unwrap();
    let (fs, cache) = empty_workspace(d.path());
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    fs.write(&f, 0, b"0123456789").unwrap();
    fs.fallocate(a.ino, 0, 20, 0).await.unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().size, 20);
    fs.fallocate(a.ino, 0, 4096, F::KEEP_SIZE.bits() as i32).await.unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().size, 20);
    fs.fallocate(a.ino, 2, 3, (F::PUNCH_HOLE | F::KEEP_SIZE).bits() as i32).await.unwrap();
    let r = fs.open(a.ino).await.unwrap();
    let want = [&b"01"[..], &[0u8; 3], b"56789", &[0u8; 10]].concat();
    assert_eq!(&fs.read(&r, 0, 64).await.unwrap()[..], &want[..]);
    let e = fs.fallocate(a.ino, 0, 4, F::COLLAPSE_RANGE.bits() as i32).await.unwrap_err();
    assert!(matches!(e, Error::Fs { errno, .. } if errno == libc::EOPNOTSUPP), "{e}");
    let b = fs.build(&cache, &mut Staged::default()).unwrap();
    let root = Tree::decode(&cache.get(&b.root).unwrap()).unwrap();
    assert_eq!(root.entries[0].size, 20);
    assert_eq!(cache.get(&root.entries[0].id).unwrap(), want);
}

/// The watchdog's probe: false while the inode table's lock is held past
/// its wait, true once it is free (never blocking past the wait).
#[test]
fn the_state_lock_probe_sees_a_held_lock_and_never_waits_past_its_bound() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    assert!(fs.state_lock_free_within(Duration::from_millis(10)));
    let held = fs.st_mut();
    let t = std::time::Instant::now();
    std::thread::scope(|s| {
        let probe = s.spawn(|| fs.state_lock_free_within(Duration::from_millis(200)));
        assert!(!probe.join().unwrap());
    });
    assert!(t.elapsed() < Duration::from_secs(5));
    drop(held);
    assert!(fs.state_lock_free_within(Duration::from_millis(10)));
}

/// A tree `dir/{g, sub/{f0..f3}}, other.txt` of one file's bytes, in the
/// cache, and a stat object for it (each path its own time).
fn nested_tree(cache: &DiskCache) -> (Hash, StatObject) {
    let file = Hash::of(b"x");
    cache.put(&file, b"x").unwrap();
    let f = |name: &str| Entry { name: name.as_bytes().to_vec(), kind: Kind::File, chunked: false, size: 1, id: file };
    let put = |t: Tree| {
        let b = t.encode();
        let id = Hash::of(&b);
        cache.put(&id, &b).unwrap();
        Entry { name: Vec::new(), kind: Kind::Directory, chunked: false, size: 0, id }
    };
    let sub = put(Tree::normalized((0..4).map(|i| f(&format!("f{i}"))).collect()).unwrap());
    let dir = put(Tree::normalized(vec![f("g"), Entry { name: b"sub".to_vec(), ..sub }]).unwrap());
    let root = put(Tree::normalized(vec![Entry { name: b"dir".to_vec(), ..dir }, f("other.txt")]).unwrap());
    let paths = ["", "dir", "dir/g", "dir/sub", "dir/sub/f0", "dir/sub/f1", "dir/sub/f2", "dir/sub/f3", "other.txt"];
    let stat = StatObject::whole(paths.iter().zip(1..).map(|(p, t)| (p.as_bytes().to_vec(), t, 0)).collect());
    (root.id, stat)
}

fn paths_of(s: &StatObject) -> Vec<String> {
    s.entries.iter().map(|(p, ..)| String::from_utf8_lossy(p).into_owned()).collect()
}

/// A checkpoint's stat change follows what moved: a directory renamed
/// while nothing below it was ever looked at carries its paths and times
/// to its new place (read from the base's times, not its trees), the old
/// ones go, and a file put where a directory was leaves nothing below it.
#[tokio::test]
async fn the_stat_change_carries_a_moved_unread_directory_and_drops_what_went() {
    let d = tempfile::tempdir().unwrap();
    let (remote, cache) = local_store(d.path());
    let (root, stat) = nested_tree(&cache);
    let sid = Hash::of(&stat.encode());
    let fs = SnapshotFs::writable(
        Fetcher::new(remote, cache.clone()),
        TreeId::from_hash(root),
        0,
        d.path().join("upper"),
        Some((sid, stat.into())),
    )
    .unwrap();
    // Nothing changed: an empty change over the base.
    let b = fs.build(&cache, &mut Staged::default()).unwrap();
    assert_eq!((b.stat.over, b.stat.is_empty(), b.stat.len), (Some(sid), true, 9), "{:?}", b.stat);
    fs.rename(ROOT_INO, b"dir", ROOT_INO, b"moved", false).await.unwrap();
    let moved = fs.lookup(ROOT_INO, b"moved").await.unwrap().ino;
    assert!(matches!(fs.st().get(moved).unwrap().body, Body::Dir { children: None, .. }), "read below");
    let b = fs.build(&cache, &mut Staged::default()).unwrap();
    let whole = fs.stat_view(&b.stat).unwrap();
    assert_eq!(
        paths_of(&whole),
        [
            "",
            "moved",
            "moved/g",
            "moved/sub",
            "moved/sub/f0",
            "moved/sub/f1",
            "moved/sub/f2",
            "moved/sub/f3",
            "other.txt"
        ]
    );
    let times: Vec<i64> = whole.entries.iter().map(|e| e.1).collect();
    // The root's time is the rename's; the rest keep theirs.
    assert_eq!(&times[2..], [3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(b.stat.removed.len(), 7, "{:?}", b.stat);
    assert_eq!(b.stat.len, 9);
    fs.rebase(b.root, Hash::of(&whole.encode()), &b.stat);
    assert_eq!(fs.base_stat_of(b"moved/sub/f2"), Some((7, 0)));
    assert_eq!(fs.base_stat_of(b"dir/sub/f2"), None);

    // moved/sub emptied, removed, and made a file.
    let sub = fs.lookup(moved, b"sub").await.unwrap().ino;
    for i in 0..4 {
        fs.unlink(sub, format!("f{i}").as_bytes()).await.unwrap();
    }
    fs.rmdir(moved, b"sub").await.unwrap();
    fs.create(moved, b"sub", 0o644).await.unwrap();
    let b = fs.build(&cache, &mut Staged::default()).unwrap();
    let whole = fs.stat_view(&b.stat).unwrap();
    assert_eq!(paths_of(&whole), ["", "moved", "moved/g", "moved/sub", "other.txt"]);
    assert_eq!(b.stat.len, 5);
    let mut gone: Vec<String> = b.stat.removed.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    gone.sort();
    assert_eq!(gone, ["moved/sub/f0", "moved/sub/f1", "moved/sub/f2", "moved/sub/f3"]);
}

/// A mount's base times live in the disk cache, mapped: the first mount of
/// a base writes them, the next maps that file (shared, not decoded again),
/// and each rebase writes its new base's while dropping the file an
/// earlier rebase of the same mount wrote, never the base it opened with.
#[tokio::test]
async fn base_times_are_kept_in_the_cache_and_a_workspace_keeps_one_file_of_its_own() {
    let d = tempfile::tempdir().unwrap();
    let (remote, cache) = local_store(d.path());
    let (root, stat) = nested_tree(&cache);
    let sid = Hash::of(&stat.encode());
    let open = |s: StatObject, upper: &str| {
        let f = Fetcher::new(remote.clone(), cache.clone());
        SnapshotFs::writable(f, TreeId::from_hash(root), 0, d.path().join(upper), Some((sid, s.into()))).unwrap()
    };
    let fs = open(stat.clone(), "upper");
    let base_file = cache.flat_times_path(&sid);
    assert!(base_file.is_file(), "the first mount of a base keeps its times");
    assert_eq!(fs.base_stat_of(b"dir/g"), Some((3, 0)));
    // Another mount of the base reads the kept file, not the object it is
    // handed (here one with other times, to tell them apart).
    let other = StatObject::whole(stat.entries.iter().map(|(p, ..)| (p.clone(), 99, 0)).collect());
    let second = open(other, "upper2");
    assert_eq!(second.base_stat_of(b"dir/g"), Some((3, 0)));

    let rebase = |fs: &SnapshotFs| {
        let b = fs.build(&cache, &mut Staged::default()).unwrap();
        let whole = fs.stat_view(&b.stat).unwrap();
        let id = Hash::of(&whole.encode());
        fs.rebase(b.root, id, &b.stat);
        id
    };
    let (_, f) = fs.create(ROOT_INO, b"new", 0o644).await.unwrap();
    fs.write(&f, 0, b"one").unwrap();
    let first = rebase(&fs);
    assert!(cache.flat_times_path(&first).is_file() && base_file.is_file());
    assert!(fs.base_stat_of(b"new").is_some(), "the new base's times are the mount's");
    fs.write(&f, 0, b"two").unwrap();
    fs.setattr(
        fs.lookup(ROOT_INO, b"new").await.unwrap().ino,
        super::SetAttr { mtime: Some((12345, 6)), ..Default::default() },
    )
    .await
    .unwrap();
    let next = rebase(&fs);
    assert_ne!(next, first);
    assert!(!cache.flat_times_path(&first).exists(), "the mount's earlier file goes");
    assert!(cache.flat_times_path(&next).is_file() && base_file.is_file(), "the shared base's stays");
    assert_eq!(fs.base_stat_of(b"new"), Some((12345, 6)));
    assert_eq!(second.base_stat_of(b"dir/g"), Some((3, 0)), "the other mount still reads its base");
    // A checkpoint that changed nothing rebases onto the base it has: the
    // shared file is not taken as the mount's own, so a later rebase
    // leaves it.
    second.rebase(second.root(), sid, &StatChange { over: Some(sid), ..Default::default() });
    let (_, g) = second.create(ROOT_INO, b"mine", 0o644).await.unwrap();
    second.write(&g, 0, b"x").unwrap();
    let mine = rebase(&second);
    assert!(base_file.is_file(), "a shared base's file went with a rebase of a mount over it");
    second.write(&g, 0, b"two").unwrap();
    let after = rebase(&second);
    assert_ne!(after, mine);
    assert!(!cache.flat_times_path(&mine).exists() && base_file.is_file());
}

/// Lookups and listings of a directory whose children are in the table
/// take the inode table's read lock: one goes on while another request
/// holds it (they took its write lock, and waited), and the kernel's
/// references they count are all there after.
#[tokio::test]
async fn lookups_of_a_loaded_directory_go_on_beside_a_reader_of_the_table() {
    let d = tempfile::tempdir().unwrap();
    let (fs, _cache) = empty_workspace(d.path());
    let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
    drop(f);
    fs.release(a.ino);
    let held = fs.st();
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            for _ in 0..3 {
                assert_eq!(fs.lookup_loaded(ROOT_INO, b"f", true).unwrap().ino, a.ino);
            }
            let counted: &super::lower::NamePicker<'_> = &|n: &[u8]| n == b"f";
            assert_eq!(fs.readdir_now_counted(ROOT_INO, counted).unwrap().unwrap().len(), 1);
            assert!(fs.lookup_loaded(ROOT_INO, b"absent", true).is_err());
        });
        let start = std::time::Instant::now();
        while !t.is_finished() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let done = t.is_finished();
        drop(held);
        t.join().unwrap();
        assert!(done, "a lookup waited for the read lock's holder");
    });
    assert_eq!(fs.st().get(a.ino).unwrap().lookups.get(), 4);
    // A name of 255 bytes is one a directory may hold (absent here); one
    // byte more is too long to look up.
    let e = fs.lookup_loaded(ROOT_INO, &[b'n'; 255], true).unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    let e = fs.lookup_loaded(ROOT_INO, &[b'n'; 256], true).unwrap_err();
    assert!(matches!(e, Error::Fs { errno, .. } if errno == libc::ENAMETOOLONG), "{e}");
    // Forgotten as many times, the node is dropped once unlinked.
    fs.unlink(ROOT_INO, b"f").await.unwrap();
    fs.forget(a.ino, 4);
    assert!(fs.getattr(a.ino).is_err());
}
