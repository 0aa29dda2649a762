//! `import_git` of a ref's next commit builds on the index of what the
//! ref holds: only what its packs lack goes up; `checkout` of it with
//! `force` over a folder that holds other files.

mod common;

use std::sync::Arc;

use mado_core::cache::DiskCache;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_commits_import_sends_only_what_the_refs_packs_lack() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    // 256 KiB that do not compress, and a small file that changes.
    let big = common::noise_bytes(0x2545_f491_4f6c_dd1d, 256 << 10);
    std::fs::write(repo.join("big.bin"), &big).unwrap();
    std::fs::write(repo.join("small.txt"), b"one\n").unwrap();
    common::commit_all(&repo, "one");
    let remote = common::store_in(t.path());
    // A fresh cache for each import: what the first left in the cache is
    // not what the second finds the ref's content by.
    let import = |cache: &str| {
        let (remote, cache, repo) =
            (remote.clone(), Arc::new(DiskCache::open(t.path().join(cache), None).unwrap()), repo.clone());
        async move {
            let before = remote.stats();
            common::import_main(&remote, cache, &repo).await;
            remote.stats().since(&before).bytes_up
        }
    };
    let first = import("c1").await;
    assert!(first > 256 << 10, "the first import sends the big file: {first}");
    std::fs::write(repo.join("small.txt"), b"two\n").unwrap();
    common::git(&repo, &["commit", "-qam", "two"]);
    let second = import("c2").await;
    assert!(second < 64 << 10, "the second sends the small file, its trees and index, not the big file: {second}");
    // The new snapshot's index names the pack the big file is in.
    let f =
        mado_core::fetch::Fetcher::new(remote.clone(), Arc::new(DiskCache::open(t.path().join("c3"), None).unwrap()));
    let tree = mado_core::resolve::open_tree(&f, "main").await.unwrap();
    for (name, body) in [("big.bin", &big[..]), ("small.txt", b"two\n")] {
        let entry = f.lookup(*tree.root, name).await.unwrap().unwrap();
        assert_eq!(&f.content(&entry, name).await.unwrap()[..], body, "{name}");
    }
}

/// `checkout` with `force` into a folder that holds a file of its own
/// (no mark of an interrupted checkout): the tree is written beside it,
/// and no mark is made or looked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_checkout_over_a_folder_of_other_files_writes_the_tree_beside_them() {
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("src/a.rs"), b"fn a() {}\n").unwrap();
    common::commit_all(&repo, "one");
    let remote = common::store_in(t.path());
    let cache = Arc::new(DiskCache::open(t.path().join("cache"), None).unwrap());
    common::import_main(&remote, cache.clone(), &repo).await;
    let f = mado_core::fetch::Fetcher::new(remote, cache);
    let tree = mado_core::resolve::open_tree(&f, "main").await.unwrap();
    let out = t.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("mine.txt"), b"mine\n").unwrap();
    let opts =
        |force| mado_core::checkout::CheckoutOptions { force, allow_name: None, paths: &[], progress: &|_, _| {} };
    assert!(mado_core::checkout::checkout(&f, *tree.root, &out, opts(false)).await.is_err(), "not empty, not forced");
    let r = mado_core::checkout::checkout(&f, *tree.root, &out, opts(true)).await.unwrap();
    assert_eq!(r.files, 1);
    assert_eq!(std::fs::read(out.join("src/a.rs")).unwrap(), b"fn a() {}\n");
    assert_eq!(std::fs::read(out.join("mine.txt")).unwrap(), b"mine\n");
    assert!(!out.join(mado_core::checkout::PARTIAL_MARK).exists());
}
