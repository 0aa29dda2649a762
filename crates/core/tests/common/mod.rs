//! What the core's integration tests share: a git repository made with
//! the system's git, and the embedded store in a folder.
#![allow(dead_code)]

use std::process::Command;
use std::sync::Arc;

use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::store::{OpenOptions, Remote};
use mado_core::workspace::Workspace;

pub fn git(dir: &std::path::Path, args: &[&str]) {
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

/// Makes `repo` a git repository whose one commit holds its files.
pub fn commit_all(repo: &std::path::Path, message: &str) {
    git(repo, &["init", "-q"]);
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", message]);
}

/// The embedded store at `dir/store`.
pub fn store_in(dir: &std::path::Path) -> Arc<Remote> {
    Arc::new(Remote::open(&format!("file://{}/store", dir.display()), &OpenOptions::default()).unwrap())
}

/// `len` pseudo-random bytes (xorshift from `seed`): content no codec
/// compresses.
pub fn noise_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Imports `repo`'s HEAD into `remote` as ref `main`.
pub async fn import_main(remote: &Arc<Remote>, cache: Arc<DiskCache>, repo: &std::path::Path) {
    let progress = Arc::new(|_, _| {});
    mado_core::import::import_git(remote, cache, repo, vec!["HEAD".into()], "main", None, None, progress)
        .await
        .unwrap();
}

/// Workspace `w`, made from `main`: a repository of `src/deep/a.rs` and
/// `README` imported into the embedded store under `dir`, through the
/// cache `dir/cache`. Sets this process's per-machine state folder to
/// `dir/workspaces` (so one such test per test binary).
pub async fn small_workspace(dir: &std::path::Path) -> (Arc<Remote>, Arc<Fetcher>, Workspace) {
    std::env::set_var("MADO_WORKSPACES_DIR", dir.join("workspaces"));
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("src/deep")).unwrap();
    std::fs::write(repo.join("src/deep/a.rs"), b"fn a() {}\n").unwrap();
    std::fs::write(repo.join("README"), b"hello\n").unwrap();
    commit_all(&repo, "x");
    let remote = store_in(dir);
    let cache = Arc::new(DiskCache::open(dir.join("cache"), None).unwrap());
    import_main(&remote, cache.clone(), &repo).await;
    let f = Fetcher::new(remote.clone(), cache);
    let ws = Workspace::new(&f, "w").unwrap();
    ws.create_ref("main").await.unwrap();
    (remote, f, ws)
}
