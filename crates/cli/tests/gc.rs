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
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "b"]);
    m.ok(&["import-git", repo.to_str().unwrap(), "--ref", "drop"]);
    let packs_before = count(&m.store_dir().join("packs"));
    assert_eq!(packs_before, 4, "two packs and two indexes");

    // Nothing is unreachable yet.
    let r = m.json(&["gc", "--grace", "0"]);
    assert_eq!(r["deleted_objects"], 0, "{r}");
    assert_eq!(r["deleted_packs"], 0);

    // Drop the ref: b's snapshot, its new objects, index and pack go.
    std::fs::remove_file(m.store_dir().join("refs/drop")).unwrap();
    let dry = m.json(&["gc", "--grace", "0", "--dry-run"]);
    assert_eq!(dry["deleted_snapshots"], 1, "{dry}");
    assert_eq!(count(&m.store_dir().join("snapshots")), 2, "a dry run deletes nothing");
    // Everything is younger than an hour: the default grace spares it.
    let spared = m.json(&["gc"]);
    assert_eq!(spared["deleted_objects"], 0, "{spared}");
    assert!(spared["spared_young"].as_u64().unwrap() >= 4);

    let r = m.json(&["gc", "--grace", "0"]);
    assert_eq!(r["deleted_snapshots"], 1, "{r}");
    // The new file, the new root tree: b's only objects.
    assert_eq!(r["deleted_objects"], 2, "{r}");
    assert_eq!(r["deleted_indexes"], 1);
    assert_eq!(r["deleted_packs"], 1);
    assert_eq!(count(&m.store_dir().join("packs")), 2);
    let b_blob = mado_core::Hash::of(b"unique to b\n").to_hex();
    assert!(!m.store_dir().join("objects").join(&b_blob[..2]).join(&b_blob).exists());

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
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "b"]);
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
