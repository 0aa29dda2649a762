//! End to end through the `mado` binary: import a real git repository,
//! check it out from a fresh cache, and compare with `git clone` of the
//! same commit; on the local store and on MinIO. Round trips are asserted
//! through the counting wrapper's numbers in `--json` output.

mod common;

use common::*;

fn clone_equivalence(m: &Mado) {
    let repo = fixture_repo(m.dir.path());
    let clone = m.dir.path().join("clone");
    git(m.dir.path(), &["clone", "-q", repo.to_str().unwrap(), clone.to_str().unwrap()]);

    let imp = m.json(&["import-git", repo.to_str().unwrap()]);
    assert_eq!(imp["imported"][0]["new_snapshot"], true);
    let snap = imp["imported"][0]["snapshot"].as_str().unwrap().to_string();
    assert!(imp["remote"]["puts"].as_u64().unwrap() > 0);
    // No content is read back: only the ref (the local store re-reads it
    // under its lock to compare-and-swap; S3 uses a conditional PUT).
    let ref_reads = if m.remote.starts_with("file:") { 2 } else { 1 };
    assert_eq!(
        imp["remote"]["gets"].as_u64().unwrap() + imp["remote"]["ranged_gets"].as_u64().unwrap(),
        ref_reads,
        "{imp}"
    );

    // Importing the same commit again uploads nothing, in one round trip
    // (measured under an injected delay, as on a real network).
    let out =
        m.cmd(&["import-git", repo.to_str().unwrap(), "--json"]).env("MADO_INJECT_RTT_MS", "25").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["imported"][0]["snapshot"], snap.as_str());
    assert_eq!(again["imported"][0]["new_snapshot"], false);
    assert_eq!(again["remote"]["puts"], 0, "{again}");
    assert_eq!(again["upload"]["objects_uploaded"], 0);
    assert_eq!(again["remote"]["round_trips"], 1, "ref read and root HEAD go together: {again}");

    // Cold checkout: fresh cache.
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let out = m.dir.path().join("co");
    let co = m.json(&["checkout", "main", out.to_str().unwrap()]);
    // Through the pack the import published: ref, snapshot and index, then
    // one ranged GET for every file (the 5 MiB file's chunks included).
    assert_eq!(co["remote"]["gets"], 3, "{co}");
    assert_eq!(co["remote"]["ranged_gets"], 1, "{co}");
    assert_same_tree(&clone, &out);
    // The CRLF rule was applied, and the big file really was chunked.
    assert_eq!(std::fs::read(out.join("win.bat")).unwrap(), b"echo one\r\necho two\r\n");
    let ls = m.json(&["ls", "main"]);
    let big = ls.as_array().unwrap().iter().find(|e| e["name"] == "big.bin").unwrap();
    assert_eq!(big["chunked"], true);
    let sub = m.json(&["ls", "main", "vendor"]);
    assert_eq!(sub[0]["kind"], "gitlink");

    // Warm: by snapshot id, no request at all; by ref, one GET (the ref).
    let warm = m.json(&["checkout", &snap, m.dir.path().join("warm1").to_str().unwrap()]);
    assert_eq!(warm["remote"]["gets"], 0, "{warm}");
    assert_eq!(warm["remote"]["heads"], 0);
    let warm = m.json(&["checkout", "main", m.dir.path().join("warm2").to_str().unwrap()]);
    assert_eq!(warm["remote"]["gets"], 1, "{warm}");
    assert_same_tree(&clone, &m.dir.path().join("warm2"));

    // cat and short ids.
    assert_eq!(m.ok(&["cat", &snap[..10], "src/lib.rs"]), "pub fn f() {}\n");
    assert_eq!(m.ok(&["cat", "main", "link"]), "README.md");
}

#[test]
fn log_chains_imports_on_the_ref() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    let first = m.json(&["import-git", repo.to_str().unwrap()]);
    std::fs::write(repo.join("README.md"), "changed\n").unwrap();
    git(&repo, &["commit", "-qam", "second"]);
    let second = m.json(&["import-git", repo.to_str().unwrap()]);
    // Packs-first: only the changed file goes up, in one new pack on top
    // of the first import's index; nothing is HEADed or stored alone (the
    // index goes up beside the pack, with a conditional PUT).
    let p = &second["packs"][0];
    assert_eq!(p["packs_uploaded"], 1, "{second}");
    assert!(p["bytes_uploaded"].as_u64().unwrap() < 2_000, "{second}");
    assert_eq!(second["upload"]["objects_uploaded"], 0, "{second}");
    assert_eq!(second["remote"]["heads"], 0, "no HEAD: {second}");
    assert_eq!(second["remote"]["puts"], 5, "lock, pack, index, snapshot, ref: {second}");
    let log = m.json(&["log", "main"]);
    let log = log.as_array().unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0]["snapshot"], second["imported"][0]["snapshot"]);
    assert_eq!(log[1]["snapshot"], first["imported"][0]["snapshot"]);
    assert_eq!(log[0]["message"], "second\n");
    assert!(log[1]["source"].as_str().unwrap().starts_with("git:"));
}

/// git's ancestry steps after a name: `main~1`, `main^`, a short id with
/// `~`, in every command that takes a REF; a step past the first snapshot
/// and a malformed step are refused, naming what went wrong.
#[test]
fn refs_take_git_ancestry_steps() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let before = std::fs::read_to_string(repo.join("README.md")).unwrap();
    std::fs::write(repo.join("README.md"), "changed\n").unwrap();
    git(&repo, &["commit", "-qam", "second"]);
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let log = m.json(&["log", "main"]);
    let (second, first) = (log[0]["snapshot"].as_str().unwrap(), log[1]["snapshot"].as_str().unwrap());
    for spec in ["main~1", "main~", "main^", "main^1", "main~1^0", &format!("{}~1", &second[..8])] {
        assert_eq!(m.ok(&["cat", spec, "README.md"]), before, "{spec}");
        assert_eq!(m.json(&["log", spec, "-n", "1"])[0]["snapshot"], first, "{spec}");
    }
    assert_eq!(m.ok(&["cat", "main~0", "README.md"]), "changed\n");
    let out = m.dir.path().join("old");
    m.ok(&["checkout", "main~1", out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(out.join("README.md")).unwrap(), before);
    let d = m.ok(&["diff", "--stat", "main~1", "main"]);
    assert!(d.contains("README.md"), "{d}");
    m.ok(&["ws", "create", "old", "--from", "main^", "--no-checkout"]);
    assert_eq!(m.json(&["log", "ws/old", "-n", "1"])[0]["snapshot"], first);
    // A command that takes a workspace's name says where a step goes.
    let err = m.fails(&["ws", "resume", "old~1", m.dir.path().join("r").to_str().unwrap()], 1);
    assert!(err.contains("not a workspace name") && err.contains("mado checkout ws/old~1"), "{err}");

    let err = m.fails(&["cat", "main~2", "README.md"], 1);
    assert!(err.contains("main~2") && err.contains("1 step back from main") && err.contains("no parent"), "{err}");
    let err = m.fails(&["cat", "main^2", "README.md"], 1);
    assert!(err.contains("only one parent"), "{err}");
    let err = m.fails(&["cat", &second[..3], "README.md"], 1);
    assert!(err.contains("at least 4 hex digits"), "{err}");
    for bad in ["main~x", "main^^x", "~1", "main~1~-1"] {
        let err = m.fails(&["cat", bad, "README.md"], 1);
        assert!(err.contains("ancestry steps"), "{bad}: {err}");
    }
}

#[test]
fn import_checkout_matches_git_clone_on_every_backend() {
    for (label, m) in Mado::every_backend() {
        eprintln!("backend: {label}");
        clone_equivalence(&m);
    }
}

/// The tree a ref already holds, imported under another ref from the same
/// machine (its cache keeps the tree's index): no pack is built or sent,
/// only the snapshot and the new ref go up (it sent the whole pack again,
/// for gc to reclaim). The new ref then checks out as git has it.
#[test]
fn the_same_tree_under_another_ref_sends_no_pack_on_every_backend() {
    for (label, m) in Mado::every_backend() {
        let repo = source_repo(&m, 20, 10, &"let y = 2;\n".repeat(40));
        let first = m.json(&["import-git", repo.to_str().unwrap()]);
        let first_up = first["remote"]["bytes_up"].as_u64().unwrap();
        let v = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "release"]);
        assert_eq!(v["packs"].as_array().map(Vec::len), Some(0), "{label}: a pack was built: {v}");
        let up = v["remote"]["bytes_up"].as_u64().unwrap();
        assert!(up * 20 < first_up, "{label}: {up} bytes up for a known tree, the tree took {first_up}: {v}");
        assert!(v["remote"]["puts"].as_u64().unwrap() <= 3, "{label}: the lock, the snapshot, the ref: {v}");
        // Once more: what the ref holds now, one round trip and no probe.
        let again = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "release"]);
        let r = &again["remote"];
        assert_eq!(
            (r["round_trips"].as_u64(), r["heads"].as_u64(), r["puts"].as_u64()),
            (Some(1), Some(0), Some(0)),
            "{label}: {again}"
        );
        assert_cold_checkout_of_equals_clone(&m, &repo, "release");
    }
}

/// A new ref whose tree shares most of its content with `main` (a release
/// branch, another commit of the same repository): its packs are built on
/// main's index, so what the store holds under main is not sent again (it
/// sent the whole tree, a large file's every chunk included). The new ref
/// checks out as git has it, before and after main moves on and gc sweeps
/// main's old snapshot (the new ref's index keeps the packs it uses).
#[test]
fn a_new_ref_sends_only_what_main_lacks_on_every_backend() {
    for (label, m) in Mado::every_backend() {
        let repo = source_repo(&m, 10, 10, &"let y = 2;\n".repeat(40));
        std::fs::write(repo.join("big.bin"), pseudo_random(6 << 20, 7)).unwrap();
        commit_all(&repo, "with a large file");
        let first = m.json(&["import-git", repo.to_str().unwrap()]);
        let first_up = first["remote"]["bytes_up"].as_u64().unwrap();
        assert!(first_up > 6 << 20, "{label}: {first}");
        // Another commit: one source file changed, 1,000 bytes appended.
        std::fs::write(repo.join("src/m03/f04.rs"), "changed\n").unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(repo.join("big.bin")).unwrap();
        std::io::Write::write_all(&mut f, &pseudo_random(1000, 8)).unwrap();
        drop(f);
        commit_all(&repo, "release");
        let v = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "release"]);
        assert_eq!(v["built_on"], "main", "{label}: {v}");
        assert!(first.get("built_on").is_none(), "{label}: main is no new ref: {first}");
        let up = v["remote"]["bytes_up"].as_u64().unwrap();
        // The appended chunk (up to 4 MiB by the chunker's rule) and the
        // trees, index, snapshot and ref; not the 6 MiB file again.
        assert!(up < first_up / 2, "{label}: {up} bytes up, the first import took {first_up}: {v}");
        assert_cold_checkout_of_equals_clone(&m, &repo, "release");

        if label != "local" {
            continue;
        }
        // main goes away and gc sweeps what only main kept: release still
        // reads whole (its index keeps the layer below it, and its packs).
        std::fs::remove_file(m.store_dir().join("refs/main")).unwrap();
        let r = m.json(&["gc", "--grace", "0"]);
        assert_eq!(r["deleted_snapshots"], 1, "main's snapshot: {r}");
        std::fs::remove_dir_all(m.dir.path().join("co")).unwrap();
        std::fs::remove_dir_all(m.dir.path().join("clone")).unwrap();
        assert_cold_checkout_of_equals_clone(&m, &repo, "release");

        // A `main` that does not decode is no base: a new ref's import
        // still succeeds (sending its whole tree).
        std::fs::write(m.store_dir().join("refs/main"), b"not a ref").unwrap();
        std::fs::write(repo.join("README.md"), "one more\n").unwrap();
        commit_all(&repo, "one more");
        let other = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "other"]);
        assert_eq!(other["imported"][0]["new_snapshot"], true, "{other}");
        assert!(other.get("built_on").is_none(), "{other}");
    }
}

/// `--base REF` names the ref a new ref builds on, for a store without
/// `main`; a base that is not there is refused before any work.
#[test]
fn a_new_ref_builds_on_the_base_it_is_given() {
    let m = Mado::local();
    let repo = source_repo(&m, 4, 5, "x\n");
    std::fs::write(repo.join("big.bin"), pseudo_random(3 << 20, 9)).unwrap();
    commit_all(&repo, "one");
    let first = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "develop"]);
    std::fs::write(repo.join("src/m01/f02.rs"), "changed\n").unwrap();
    commit_all(&repo, "two");
    let err = m.fails(&["import-git", repo.to_str().unwrap(), "--ref", "feature", "--base", "nosuch"], 1);
    assert!(err.contains("--base nosuch"), "{err}");
    let v = m.json(&["import-git", repo.to_str().unwrap(), "--ref", "feature", "--base", "develop"]);
    assert_eq!(v["built_on"], "develop", "{v}");
    let (up, first_up) = (v["remote"]["bytes_up"].as_u64().unwrap(), first["remote"]["bytes_up"].as_u64().unwrap());
    assert!(up * 20 < first_up, "{up} bytes up against {first_up}: {v}");
    assert_cold_checkout_of_equals_clone(&m, &repo, "feature");
}

/// A git repository `repo` in `m`'s folder: `dirs` folders `src/mNN` of
/// `files` files each (a line naming the file, then `body`), committed once.
fn source_repo(m: &Mado, dirs: usize, files: usize, body: &str) -> std::path::PathBuf {
    let repo = m.dir.path().join("repo");
    for d in 0..dirs {
        let dir = repo.join(format!("src/m{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..files {
            std::fs::write(dir.join(format!("f{f}.rs")), format!("// {d}/{f}\n{body}")).unwrap();
        }
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "one");
    repo
}

/// The next commit (issue #13): importing a commit that changes a few files
/// of an imported one makes at most 6 sequential round trips (the ref ‖
/// the writer's lock PUT; its LIST ‖ the ref's snapshot and index when not
/// cached; the new pack ‖ a HEAD of the new tree's index; the index ‖ the
/// snapshot; the ref; the lock's DELETE), and uploads about the change,
/// not the tree. Counted under an injected delay per request, on every
/// backend, from a cache that knows the first import and from an empty one.
#[test]
fn the_next_commit_imports_in_six_round_trips_on_every_backend() {
    for (label, m) in Mado::every_backend() {
        let repo = source_repo(&m, 50, 20, &"let x = 1;\n".repeat(50));
        let first = m.json(&["import-git", repo.to_str().unwrap()]);
        let first_up = first["remote"]["bytes_up"].as_u64().unwrap();
        for (round, wipe) in [(1, false), (2, true)] {
            for d in [3, 17, 41] {
                std::fs::write(repo.join(format!("src/m{d:02}/f{round}.rs")), format!("changed {round}\n")).unwrap();
            }
            git(&repo, &["commit", "-qam", "next"]);
            if wipe {
                std::fs::remove_dir_all(m.cache_dir()).unwrap();
            }
            let out = m
                .cmd(&["import-git", repo.to_str().unwrap(), "--json"])
                .env("MADO_INJECT_RTT_MS", "25")
                .output()
                .unwrap();
            assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["imported"][0]["new_snapshot"], true, "{label}: {v}");
            let rts = v["remote"]["round_trips"].as_u64().unwrap();
            // The local store's compare-and-swap reads the ref again under its
            // lock (S3's is one conditional PUT): one more there.
            let most = if label == "local" { 7 } else { 6 };
            assert!(rts <= most, "{label}, round {round} (cache wiped: {wipe}): {rts} round trips: {v}");
            let up = v["remote"]["bytes_up"].as_u64().unwrap();
            assert!(up * 5 < first_up, "{label}: {up} bytes up for 3 files, the tree took {first_up}: {v}");
        }
        // And what was imported reads back as git has it.
        assert_cold_checkout_equals_clone(&m, &repo);
    }
}
