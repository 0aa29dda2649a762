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
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    for base in ["s", "a/b/c/s"] {
        let d = repo.join(base).join("x");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("y.txt"), b"shared\n").unwrap();
    }
    std::fs::write(repo.join("a/b/c/own.txt"), b"own\n").unwrap();
    std::fs::write(repo.join("top.txt"), b"top\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "shared subtree at two depths"]);
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
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "many"]);
    repo
}

/// Runs `cmd`, kills it with SIGKILL after `after`; returns whether it
/// had already finished.
fn kill_after(mut cmd: std::process::Command, after: std::time::Duration) -> bool {
    let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    std::thread::sleep(after);
    let done = child.try_wait().unwrap().is_some();
    let _ = child.kill();
    let _ = child.wait();
    done
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
    // How long a whole import takes here, to spread the kill points over.
    let t0 = std::time::Instant::now();
    let probe = Mado::local();
    probe.ok(&["import-git", repo.to_str().unwrap()]);
    let full = t0.elapsed();
    let points = 12;
    let mut killed = 0;
    for k in 0..points {
        let after = full.mul_f64(k as f64 / points as f64);
        if !kill_after(m.cmd(&["import-git", repo.to_str().unwrap()]), after) {
            killed += 1;
        }
        assert_consistent(&m);
    }
    m.ok(&["import-git", repo.to_str().unwrap()]);
    assert_consistent(&m);
    assert_cold_checkout_equals_clone(&m, &repo);

    // Checkpoints of a plain working copy, killed at as many points.
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "k", "--dir", w.to_str().unwrap()]);
    let mut round = 0;
    let mut edit_round = |w: &std::path::Path| {
        round += 1;
        for i in (0..1500).step_by(3) {
            let p = w.join(format!("d{}/e{}/f{i}.txt", i % 37, i % 11));
            std::fs::write(p, format!("round {round} file {i}\n")).unwrap();
        }
    };
    edit_round(&w);
    let t0 = std::time::Instant::now();
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    let full = t0.elapsed();
    for k in 0..points {
        edit_round(&w);
        let after = full.mul_f64(k as f64 / points as f64);
        if !kill_after(m.cmd(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]), after) {
            killed += 1;
        }
        assert_consistent(&m);
    }
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_consistent(&m);
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let r = m.dir.path().join("r");
    m.ok(&["ws", "resume", "k", r.to_str().unwrap(), "--read-only"]);
    assert_same_state(&w, &r);
    eprintln!("kill points tried: {}, of which the process was killed mid-run: {killed}", 2 * points);
    assert!(killed >= points, "most kill points must land inside a run: {killed}");
}
