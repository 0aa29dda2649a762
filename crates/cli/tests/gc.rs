//! `mado gc`: what no ref reaches goes, packs never keep anything alive,
//! and what a ref reaches still checks out from a fresh cache.

mod common;

use common::*;

fn count(dir: &std::path::Path) -> usize {
    if !dir.exists() {
        return 0;
    }
    walk(dir)
}

fn walk(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk(&e.path())
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn gc_sweeps_unreachable_snapshots_objects_and_packs() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    let a = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "keep"]);
    std::fs::write(repo.join("only-in-b.txt"), "unique to b\n").unwrap();
    commit_all(&repo, "b");
    let b = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "drop"]);
    // Packs-first: content lives in packs (a new ref has no base, so b's
    // import packs its whole tree); nothing is stored alone.
    let n = |v: &serde_json::Value| v["packs"][0]["packs"].as_u64().unwrap() as usize;
    assert_eq!(count(&m.store_dir().join("packs")), n(&a) + n(&b) + 2, "the packs and two indexes");
    assert!(!m.store_dir().join("objects").exists() || count(&m.store_dir().join("objects")) == 0);

    // Nothing is unreachable yet.
    let r = m.json(&["gc", "--grace", "0"]);
    assert_eq!(r["deleted_objects"], 0, "{r}");
    assert_eq!(r["deleted_packs"], 0);

    // Drop the ref: b's snapshot, its index and the packs only it names go.
    std::fs::remove_file(m.store_dir().join("refs/drop")).unwrap();
    let dry = m.json(&["gc", "--grace", "0", "--dry-run"]);
    assert_eq!(dry["deleted_snapshots"], 1, "{dry}");
    assert_eq!(count(&m.store_dir().join("snapshots")), 2, "a dry run deletes nothing");
    // Everything is younger than an hour: the default grace spares it.
    let spared = m.json(&["gc"]);
    assert_eq!(spared["deleted_packs"], 0, "{spared}");
    assert!(
        spared["spared_young"].as_u64().unwrap() >= 2,
        "the snapshot and the index (which keeps its packs): {spared}"
    );

    let r = m.json(&["gc", "--grace", "0"]);
    assert_eq!(r["deleted_snapshots"], 1, "{r}");
    assert_eq!(r["deleted_indexes"], 1, "{r}");
    assert!(r["deleted_packs"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(count(&m.store_dir().join("packs")), n(&a) + 1, "exactly keep's packs and index stay");

    // What `keep` reaches is whole: a fresh-cache checkout equals git's.
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let co = m.dir.path().join("co");
    let out = m.json(&["checkout", a["imported"][0]["snapshot"].as_str().unwrap(), co.to_str().unwrap()]);
    assert_eq!(out["remote"]["ranged_gets"], 1, "still read through its pack: {out}");
    let clone = m.dir.path().join("clone");
    git(m.dir.path(), &["clone", "-q", repo.to_str().unwrap(), clone.to_str().unwrap()]);
    git(&clone, &["checkout", "-q", "HEAD~1"]);
    assert_same_tree(&clone, &co);
}

/// A reachable tree that cannot be decoded stops gc before it deletes
/// anything: what sits below it is unknown, so nothing may be swept.
#[test]
fn gc_fails_closed_on_an_undecodable_reachable_tree() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap(), "--ref", "keep", "--no-packs"]);
    std::fs::write(repo.join("only-in-b.txt"), "unique to b\n").unwrap();
    commit_all(&repo, "b");
    m.ok(&["import-git", repo.to_str().unwrap(), "--ref", "drop", "--no-packs"]);
    std::fs::remove_file(m.store_dir().join("refs/drop")).unwrap();

    // Rot the tree of `src/` (reachable from `keep`) in the store, and
    // start from an empty cache so gc has to read it.
    let objects = store_objects(&m.store_dir());
    let src = objects
        .iter()
        .find_map(|(id, b)| {
            let t = mado_core::object::Tree::decode(b).ok()?;
            t.entries.iter().any(|e| e.name == b"lib.rs").then_some(*id)
        })
        .expect("the tree of src/");
    let hex = src.to_hex();
    std::fs::write(m.store_dir().join("objects").join(&hex[..2]).join(&hex), b"rotten").unwrap();
    std::fs::remove_dir_all(m.cache_dir()).unwrap();

    let before = count(&m.store_dir());
    let err = m.fails(&["gc", "--grace", "0"], 2);
    assert!(err.contains(&hex), "the error names the tree: {err}");
    assert!(err.contains("deleted nothing"), "{err}");
    assert_eq!(count(&m.store_dir()), before, "gc deleted something although it could not mark");
}

/// gc racing a writer that reuses an old, unreachable object: the import
/// found the blob present (so did not upload it) and is about to move its
/// ref; a gc in that window must not delete the blob. gc gives way to the
/// writer; a writer gives way to a sweeping gc.
#[test]
fn gc_never_deletes_what_a_writer_in_flight_reuses() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    std::fs::write(repo.join("reused.txt"), "old content, reused later\n").unwrap();
    commit_all(&repo, "with X");
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    std::fs::remove_file(repo.join("reused.txt")).unwrap();
    commit_all(&repo, "without X");
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    // X is in the store, and only the history reaches it: drop the history
    // by moving a fresh ref (main is re-created pointing at "without X").
    let x = mado_core::Hash::of(b"old content, reused later\n").to_hex();
    let x_path = m.store_dir().join("objects").join(&x[..2]).join(&x);
    assert!(x_path.is_file());
    let head = m.json(&["import-git", repo.to_str().unwrap(), "--no-packs", "--ref", "solo"]);
    assert!(head["imported"][0]["snapshot"].is_string());
    std::fs::remove_file(m.store_dir().join("refs/main")).unwrap();
    // Bring X back in a new commit: the import will find it present.
    std::fs::write(repo.join("reused.txt"), "old content, reused later\n").unwrap();
    commit_all(&repo, "X again");
    let fifo = m.dir.path().join("pause");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut writer = m
        .cmd(&["import-git", repo.to_str().unwrap(), "--no-packs", "--ref", "solo"])
        .env("MADO_PAUSE", "import-before-ref")
        .env("MADO_PAUSE_FIFO", &fifo)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let marker = m.dir.path().join("pause.paused");
    for _ in 0..300 {
        if marker.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(marker.exists(), "the import did not reach its pause point");
    // Inside the window: gc refuses and deletes nothing.
    let err = m.fails(&["gc", "--grace", "0"], 2);
    assert!(err.contains("an import or a checkpoint is at work") && err.contains("deleted nothing"), "{err}");
    assert!(x_path.is_file(), "gc deleted the object the writer relies on");
    std::fs::write(&fifo, b"go").unwrap();
    let o = writer.wait().unwrap();
    assert!(o.success());
    assert_refs_whole(&m.store_dir());
    // Now nothing is in flight: gc runs, and what the refs reach stays whole.
    m.ok(&["gc", "--grace", "0"]);
    assert_refs_whole(&m.store_dir());
    assert!(x_path.is_file());
    // A sweeping gc (its lock planted as it would be) holds a writer back
    // before it decides anything: it waits, and gives up (exit 2, kind
    // "busy") when the sweep outlasts its wait.
    let locks = m.store_dir().join("locks/gc");
    std::fs::create_dir_all(&locks).unwrap();
    let far = SystemTimeExt::now_secs() + 600;
    let planted = locks.join(format!("gc.{far}.00000000000000aa"));
    std::fs::write(&planted, b"").unwrap();
    let import = |wait: &str| {
        m.cmd(&["import-git", repo.to_str().unwrap(), "--no-packs", "--ref", "other", "--json"])
            .env("MADO_GC_WAIT_SECS", wait)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let o = import("1").wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("a gc is sweeping") && err.contains("\"kind\":\"busy\""), "{err}");
    assert!(!m.store_dir().join("refs/other").exists());
    // A sweep that ends while the writer waits: it goes on and lands.
    let writer = import("60");
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(!m.store_dir().join("refs/other").exists(), "the writer waited");
    std::fs::remove_file(&planted).unwrap();
    let o = writer.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("waiting for it to finish"), "{err}");
    assert!(m.store_dir().join("refs/other").exists());
    assert_refs_whole(&m.store_dir());
}

struct SystemTimeExt;
impl SystemTimeExt {
    fn now_secs() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    }
}
