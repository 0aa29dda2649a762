//! What the core's integration tests share: a git repository made with
//! the system's git, and the embedded store in a folder.
#![allow(dead_code)]

use std::process::Command;
use std::sync::Arc;

use mado_core::cache::DiskCache;
use mado_core::store::{OpenOptions, Remote};

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
