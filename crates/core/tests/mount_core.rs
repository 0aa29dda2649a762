//! The mount's filesystem logic (`mado_core::mount::SnapshotFs`) without
//! FUSE: a real git repository imported through the core API, then
//! lookup, readdir, getattr, readlink and reads (whole and chunked, at
//! odd offsets) compared with the repository's own files; and the
//! metadata of a packed snapshot answered with no request at all.

use std::process::Command;
use std::sync::Arc;

use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::mount::{NodeKind, OpenFile, SnapshotFs, ROOT_INO};
use mado_core::store::{OpenOptions, Remote};

fn git(dir: &std::path::Path, args: &[&str]) {
    let o = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("GIT_AUTHOR_NAME", "a")
        .env("GIT_AUTHOR_EMAIL", "a@a")
        .env("GIT_COMMITTER_NAME", "a")
        .env("GIT_COMMITTER_EMAIL", "a@a")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

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
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "x"]);

    let remote =
        Arc::new(Remote::open(&format!("file://{}/store", t.path().display()), &OpenOptions::default()).unwrap());
    let cache = Arc::new(DiskCache::open(t.path().join("cache"), None).unwrap());
    let opts = mado_core::publish::PackOptions {
        mode: mado_core::pack::Mode::Recursive,
        cap: mado_core::pack::DEFAULT_MAX_PACK_BYTES,
        index_check: mado_core::publish::IndexCheck::KnownAbsent,
        base: None,
    };
    let rep =
        mado_core::import::import_git(&remote, cache, &repo, vec!["HEAD".into()], "main", Some(opts), Arc::new(|_| {}))
            .await
            .unwrap();
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
    assert!(matches!(fs.open(src.ino).await, Err(mado_core::Error::User(_))));
}
