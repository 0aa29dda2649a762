//! Crashes at every step of a write: whatever point a writer dies at, the
//! store keeps the closure rule (a present tree proves its subtree), a
//! rerun succeeds, and what the refs reach checks out whole.

mod common;

use common::*;

/// A repository where one subtree (`s`, holding a directory of its own)
/// appears at depth 1 and again at depth 4: height, not depth, decides
/// when its tree may go up.
fn shared_subtree_repo(parent: &std::path::Path) -> std::path::PathBuf {
    let repo = parent.join("repo");
    init_repo(&repo);
    for base in ["s", "a/b/c/s"] {
        let d = repo.join(base).join("x");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("y.txt"), b"shared\n").unwrap();
    }
    std::fs::write(repo.join("a/b/c/own.txt"), b"own\n").unwrap();
    std::fs::write(repo.join("top.txt"), b"top\n").unwrap();
    commit_all(&repo, "shared subtree at two depths");
    repo
}

#[test]
fn import_killed_between_tree_batches_keeps_the_closure_rule() {
    let mut aborted = 0;
    for nth in 1..=6 {
        let m = Mado::local();
        let repo = shared_subtree_repo(m.dir.path());
        let o = m
            .cmd(&["import-git", repo.to_str().unwrap(), "--no-packs"])
            .env("MADO_FAILPOINT", format!("upload-between-tree-batches#{nth}"))
            .output()
            .unwrap();
        if o.status.success() {
            // Fewer batches than `nth`: the import ran through.
            assert_store_closed(&m.store_dir());
            continue;
        }
        aborted += 1;
        assert!(!m.store_dir().join("refs/main").exists(), "the ref moved although the import died");
        assert_store_closed(&m.store_dir());
        // A rerun prunes at whatever is present, so a present tree with a
        // missing child would stay missing: the checkout proves it is not.
        m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
        assert_store_closed(&m.store_dir());
        assert_cold_checkout_equals_clone(&m, &repo);
    }
    // x; s; c; b; a; root: six heights, so five boundaries to die at.
    assert_eq!(aborted, 5, "the import must cross five batch boundaries");
}

/// A repository of `n` small files over many directories (and one chunked
/// file), so an import or checkpoint takes long enough to be killed at
/// many different points.
fn many_files_repo(parent: &std::path::Path, n: usize) -> std::path::PathBuf {
    let repo = parent.join("many");
    for i in 0..n {
        let d = repo.join(format!("d{}/e{}", i % 37, i % 11));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.txt")), format!("file {i}\n").repeat(1 + i % 7)).unwrap();
    }
    std::fs::write(repo.join("big.bin"), pseudo_random(3 << 20, 11)).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "many");
    repo
}

/// Runs `cmd` with the process dying (abort: no unwinding, nothing
/// flushed) at its `nth` store write; returns whether it ran through
/// because it made fewer writes than that.
fn die_at_put(mut cmd: std::process::Command, nth: u64) -> bool {
    let o = cmd.env("MADO_FAILPOINT", format!("store-put#{nth}")).output().unwrap();
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("failpoint store-put"), "failed, but not at the failpoint: {err}");
    }
    o.status.success()
}

/// Kill points over a whole run: the 1st, 2nd, 3rd, ... store write (a
/// packs-first run makes a handful), until a run makes fewer writes than
/// the point (it then ran through, and the loop ends). Each run after a
/// death writes into the same store, as a retry would. Returns how many
/// runs died.
fn die_at_every_put(m: &Mado, mut cmd: impl FnMut() -> std::process::Command, mut between: impl FnMut()) -> usize {
    let mut nth = 1u64;
    let mut died = 0;
    loop {
        between();
        if die_at_put(cmd(), nth) {
            return died;
        }
        died += 1;
        assert_consistent(m);
        nth += 1;
        assert!(died < 40, "a run never ran through");
    }
}

/// The store after a kill: closed, every ref whole; then `mado cache
/// verify` finds nothing wrong.
fn assert_consistent(m: &Mado) {
    assert_store_closed(&m.store_dir());
    assert_refs_whole(&m.store_dir());
    let v = m.json(&["cache", "verify"]);
    assert_eq!(v["bad"].as_array().map(|b| b.len()), Some(0), "{v}");
}

#[test]
fn import_and_checkpoint_killed_at_many_points_stay_whole() {
    let m = Mado::local();
    let repo = many_files_repo(m.dir.path(), 1500);
    let import = || m.cmd(&["import-git", repo.to_str().unwrap()]);
    let died = die_at_every_put(&m, import, || {});
    eprintln!("import died at {died} points");
    // Packs-first: lock, pack, index, snapshot, ref: a handful of writes.
    assert!(died >= 4, "an import of 1,500 files dies at 4 points or more: {died}");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    assert_consistent(&m);
    assert_cold_checkout_equals_clone(&m, &repo);

    // Checkpoints of a plain working copy, killed at as many points, with
    // the working copy edited again before each run.
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "k", "--dir", w.to_str().unwrap()]);
    let mut round = 0;
    let edit_round = || {
        round += 1;
        for i in (0..1500).step_by(3) {
            let p = w.join(format!("d{}/e{}/f{i}.txt", i % 37, i % 11));
            std::fs::write(p, format!("round {round} file {i}\n")).unwrap();
        }
    };
    let checkpoint = || m.cmd(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    let died = die_at_every_put(&m, checkpoint, edit_round);
    eprintln!("checkpoint died at {died} points");
    // Lease, lock, stat object and packs, index, snapshot, ref.
    assert!(died >= 5, "a checkpoint of 500 changed files dies at 5 points or more: {died}");
    assert_consistent(&m);
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let r = m.dir.path().join("r");
    m.ok(&["ws", "resume", "k", r.to_str().unwrap(), "--read-only"]);
    assert_same_state(&w, &r);
}
