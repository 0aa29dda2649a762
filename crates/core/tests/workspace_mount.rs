//! A workspace opened for a mount through the core API (no FUSE): the
//! lease holder it takes by place, and a mount that keeps its inode
//! numbers opened again after its daemon was killed, under those numbers.

use std::process::Command;
use std::sync::Arc;

use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::store::{OpenOptions, Remote};
use mado_core::vfs::ROOT_INO;
use mado_core::workspace::{save_mount_state, HandedOver, Workspace};

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
async fn a_mount_keeps_its_holder_in_place_and_its_numbers_after_a_kill() {
    let t = tempfile::tempdir().unwrap();
    // This test binary's only test: the variable is its own.
    std::env::set_var("MADO_WORKSPACES_DIR", t.path().join("workspaces"));
    let repo = t.path().join("repo");
    std::fs::create_dir_all(repo.join("src/deep")).unwrap();
    std::fs::write(repo.join("src/deep/a.rs"), b"fn a() {}\n").unwrap();
    std::fs::write(repo.join("README"), b"hello\n").unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "x"]);
    let remote =
        Arc::new(Remote::open(&format!("file://{}/store", t.path().display()), &OpenOptions::default()).unwrap());
    let cache = Arc::new(DiskCache::open(t.path().join("cache"), None).unwrap());
    mado_core::import::import_git(
        &remote,
        cache.clone(),
        &repo,
        vec!["HEAD".into()],
        "main",
        None,
        None,
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap();
    let f = Fetcher::new(remote, cache);
    let ws = Workspace::new(&f, "w").unwrap();
    ws.create_ref("main").await.unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));

    let m = ws.open_mount(&a, false, true).await.unwrap();
    let holder = m.holder.clone();
    let deep = m.fs.lookup(ROOT_INO, b"src").await.unwrap().ino;
    let made = m.fs.mkdir(deep, b"made", 0o755).await.unwrap().ino;
    save_mount_state(&m.fs, &m.state_dir).unwrap();
    // Looked into after the last save: numbered in the log only.
    let inner = m.fs.lookup(m.fs.lookup(deep, b"deep").await.unwrap().ino, b"a.rs").await.unwrap().ino;
    let names: Vec<String> =
        std::fs::read_dir(&m.state_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.iter().any(|n| n.starts_with("inodes-")) && names.iter().any(|n| n.starts_with("inodes.log.")));

    // The daemon killed (its fs gone, nothing more saved); a new one
    // started by the keeper, given the lock, reads the numbers from disk.
    let (lock, state_dir) = (m.lock, m.state_dir.clone());
    drop(m.fs);
    let back = ws.open_handed_over(&a, HandedOver { lock, image: None }).await.unwrap();
    assert!(back.reopened);
    assert_eq!(back.holder, holder, "the same mount keeps its lease holder");
    assert_eq!(back.fs.getattr(made).unwrap().kind, mado_core::vfs::NodeKind::Dir);
    assert_eq!(back.fs.getattr(inner).unwrap().size, 10, "a number from the log names its file");
    assert_eq!(back.fs.lookup(deep, b"made").await.unwrap().ino, made);
    drop(back);

    // Mounted again in place: the holder names the place and stays; at
    // another place it is a new one naming that place.
    let again = ws.open_mount(&a, false, false).await.unwrap();
    assert_eq!(again.holder, holder);
    assert_eq!(again.state_dir, state_dir);
    drop(again);
    let moved = ws.open_mount(&b, false, false).await.unwrap();
    assert_ne!(moved.holder, holder, "a mount elsewhere took the holder id of the old place");
    assert!(moved.holder.contains(&format!(":{}:", b.display())), "{}", moved.holder);
    assert!(moved.reopened, "the saved changes are picked up at the new place");
}
