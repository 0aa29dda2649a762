//! Locality packs end to end, on the local store and on MinIO: a real
//! ~1000-file subtree (the tokio and libc crate sources from cargo's
//! registry, pinned by Cargo.lock) committed to a git repository, imported
//! with packs, then read cold. GETs are asserted through the counting
//! wrapper's numbers in `--json` output.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// A registry crate's source directory (present: the build needed it).
fn registry_crate(prefix: &str) -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock")).unwrap();
    let version = lock
        .split("[[package]]")
        .find_map(|p| {
            let name = p.lines().find_map(|l| l.strip_prefix("name = "))?.trim_matches('"');
            (name == prefix)
                .then(|| p.lines().find_map(|l| l.strip_prefix("version = ")).unwrap().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("{prefix} not in Cargo.lock"));
    for index in std::fs::read_dir(home.join("registry/src")).unwrap() {
        let d = index.unwrap().path().join(format!("{prefix}-{version}"));
        if d.is_dir() {
            return d;
        }
    }
    panic!("{prefix}-{version} not in the cargo registry");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else if t.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A repository with `vendor/` = tokio + libc sources (~1000 files) and a
/// little else.
fn real_repo(parent: &Path) -> PathBuf {
    let repo = parent.join("realrepo");
    init_repo(&repo);
    copy_dir(&registry_crate("tokio"), &repo.join("vendor/tokio"));
    copy_dir(&registry_crate("libc"), &repo.join("vendor/libc"));
    std::fs::write(repo.join("README"), "real sources\n").unwrap();
    // cargo's registry marks crates with .cargo-ok and such; keep them.
    git(&repo, &["add", "-A", "-f"]);
    git(&repo, &["commit", "-q", "-m", "vendor"]);
    repo
}

fn count_files(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            n += count_files(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

fn wipe_cache(m: &Mado) {
    let _ = std::fs::remove_dir_all(m.cache_dir());
}

fn gets(v: &serde_json::Value) -> u64 {
    v["remote"]["gets"].as_u64().unwrap() + v["remote"]["ranged_gets"].as_u64().unwrap()
}

fn packed_subtree_costs_one_ranged_get(m: &Mado) {
    let repo = real_repo(m.dir.path());
    let files = count_files(&repo.join("vendor"));
    assert!((900..1500).contains(&files), "{files} files");

    // Import publishes packs, reading nothing back: the only GETs are of
    // the ref (twice on the local store, which re-reads it under its lock).
    let imp = m.json(&["import-git", repo.to_str().unwrap()]);
    let ref_reads = if m.remote.starts_with("file:") { 2 } else { 1 };
    assert_eq!(gets(&imp), ref_reads, "{imp}");
    assert_eq!(imp["remote"]["ranged_gets"], 0);
    let packs = &imp["packs"][0];
    assert!(packs["packs"].as_u64().unwrap() >= 1 && packs["index_uploaded"] == true, "{packs}");

    // Cold: a fresh cache and no local pointer.
    wipe_cache(m);
    let mat = m.json(&["materialize", "vendor"]);
    assert_eq!(mat["files"].as_u64().unwrap(), files);
    assert_eq!(mat["attach"]["via"], "derived-pointer", "{mat}");
    // ref + snapshot (resolving `main`), then the index and one ranged GET.
    assert_eq!(mat["remote"]["ranged_gets"], 1, "{mat}");
    assert_eq!(gets(&mat), 2 + 2, "{mat}");
    assert!(mat["packs"]["members_early"].as_u64().unwrap() > 0, "members were served while the pack streamed: {mat}");
    // Everything is now local: a checkout makes only the ref GET.
    let co = m.json(&["checkout", "main", m.dir.path().join("co").to_str().unwrap()]);
    assert_eq!(gets(&co), 1, "{co}");

    // A second run: the local pointer is found, nothing is fetched.
    let again = m.json(&["materialize", "vendor"]);
    assert_eq!(again["attach"]["via"], "local-pointer");
    assert_eq!(gets(&again), 1, "the ref only (the snapshot is cached): {again}");
}

#[test]
fn unpacked_subtree_costs_one_get_per_object_minio() {
    let Some(base) = s3_base() else { return };
    let m = Mado::s3(&base);
    let repo = real_repo(m.dir.path());
    let imp = m.json(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    assert!(imp["packs"].as_array().unwrap().is_empty());
    wipe_cache(&m);
    let mat = m.json(&["materialize", "vendor"]);
    assert_eq!(mat["attach"]["state"], "no-index");
    // ref + snapshot + the index probe (404), the root tree (to find
    // `vendor`), then one GET per distinct tree and distinct blob below it
    // (identical files and directories are fetched once: same id).
    let distinct = |args: &[&str]| {
        let out = git(&repo, args);
        let mut ids: Vec<&str> = out.lines().map(|l| l.split_whitespace().nth(2).unwrap()).collect();
        ids.sort();
        ids.dedup();
        ids.len() as u64
    };
    let vendor = git(&repo, &["rev-parse", "HEAD:vendor"]);
    let blobs = distinct(&["ls-tree", "-r", &vendor]);
    let trees = 1 + distinct(&["ls-tree", "-r", "-d", &vendor]);
    assert_eq!(gets(&mat), 3 + 1 + trees + blobs, "{mat}");
    assert_eq!(mat["remote"]["ranged_gets"], 0);
}

#[test]
fn second_pack_run_uploads_nothing() {
    let m = Mado::local();
    let repo = real_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    let first = m.json(&["pack", "--recursive"]);
    assert!(first["packs_uploaded"].as_u64().unwrap() >= 1);
    assert!(first["bytes_uploaded"].as_u64().unwrap() > 0);
    assert!(first["model_gets_packed"].as_u64().unwrap() * 20 < first["model_gets_unpacked"].as_u64().unwrap());
    let second = m.json(&["pack", "--recursive"]);
    assert_eq!(second["bytes_uploaded"], 0, "{second}");
    assert_eq!(second["remote"]["puts"], 0, "{second}");
    assert_eq!(second["index_uploaded"], false);
    // Per-directory packs are a different index, built and published too;
    // from a fresh cache, the trees come inline with the v2 index.
    wipe_cache(&m);
    let v1 = m.json(&["pack", "--per-dir"]);
    assert_eq!(v1["mode"], "per-dir");
    assert!(v1["packs"].as_u64().unwrap() > 1);
    wipe_cache(&m);
    let mat = m.json(&["materialize", "vendor"]);
    assert_eq!(mat["attach"]["mode"], "per-dir");
    // And back to v2, with the v1 index attached (its trees inline).
    wipe_cache(&m);
    let v2 = m.json(&["pack", "--recursive"]);
    assert_eq!(v2["mode"], "recursive");
    assert_eq!(v2["packs_uploaded"], 0, "the v2 packs are still there: {v2}");
}

/// The one pack file in the local store.
fn the_pack(m: &Mado) -> PathBuf {
    std::fs::read_dir(m.store_dir().join("packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "index")
        .flat_map(|d| std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()))
        .next()
        .unwrap()
}

/// A store of objects stored alone (from before packs-first) with packs
/// built as a cache of them (`mado pack`): corrupts the one pack with
/// `damage`, then reads cold and checks the fallback to the objects.
fn pack_fallback(damage: &dyn Fn(&Path)) {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    let packed = m.json(&["pack", "--recursive"]);
    assert_eq!(packed["packs"], 1, "{packed}");
    let pack = the_pack(&m);
    let pack_id = pack.file_name().unwrap().to_string_lossy().into_owned();
    damage(&pack);
    wipe_cache(&m);
    let o = m.run(&["checkout", "main", m.dir.path().join("co").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("warning: pack") && err.contains(&pack_id), "the warning names the pack: {err}");
    let clone = m.dir.path().join("clone");
    git(m.dir.path(), &["clone", "-q", repo.to_str().unwrap(), clone.to_str().unwrap()]);
    assert_same_tree(&clone, &m.dir.path().join("co"));
    // Nothing wrong entered the cache.
    let v = m.json(&["cache", "verify"]);
    assert_eq!(v["bad"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn corrupt_member_falls_back_per_object() {
    pack_fallback(&|p| {
        let mut b = std::fs::read(p).unwrap();
        let n = b.len();
        b[n - 3] ^= 0xff; // inside the last member
        std::fs::write(p, b).unwrap();
    });
}

#[test]
fn truncated_pack_falls_back_per_object() {
    pack_fallback(&|p| {
        let b = std::fs::read(p).unwrap();
        std::fs::write(p, &b[..b.len() / 2]).unwrap();
    });
}

#[test]
fn missing_pack_falls_back_per_object() {
    pack_fallback(&|p| std::fs::remove_file(p).unwrap());
}

#[test]
fn undecodable_index_falls_back_per_object() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    m.ok(&["pack", "--recursive"]);
    let idx_dir = m.store_dir().join("packs/index");
    for e in std::fs::read_dir(&idx_dir).unwrap() {
        std::fs::write(e.unwrap().path(), b"MADI\x01garbage").unwrap();
    }
    wipe_cache(&m);
    let mat = m.json(&["materialize"]);
    assert_eq!(mat["attach"]["state"], "undecodable", "{mat}");
    assert_eq!(mat["remote"]["ranged_gets"], 0);
    assert!(mat["files"].as_u64().unwrap() > 5);
}

#[test]
fn two_processes_fetch_a_pack_once() {
    let m = Mado::local();
    let repo = real_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    wipe_cache(&m);
    // A delay per request makes the two runs overlap.
    let spawn = || {
        m.cmd(&["materialize", "vendor", "--json"])
            .env("MADO_INJECT_RTT_MS", "100")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let mut ranged = 0;
    for o in &outs {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        ranged += v["remote"]["ranged_gets"].as_u64().unwrap();
    }
    assert_eq!(ranged, 1, "the second process waits for the first and reads the cache");
}

/// A subtree walk takes only its span of a whole-tree (v2) pack: members
/// are in path order, so the span is one ranged GET, and the rest of the
/// pack stays in the store until something asks for it.
#[test]
fn a_small_subtree_of_a_big_pack_fetches_only_its_span() {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    for i in 0..40 {
        let p = repo.join(format!("small/s{i:02}.txt"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, pseudo_random(2000, i)).unwrap();
    }
    for i in 0..400 {
        let p = repo.join(format!("zbig/d{}/b{i:03}.bin", i % 10));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, pseudo_random(8000, 1000 + i)).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "x");
    let imp = m.json(&["import-git", repo.to_str().unwrap()]);
    assert_eq!(imp["packs"][0]["packs"], 1, "one whole-tree pack: {imp}");
    wipe_cache(&m);
    let mat = m.json(&["materialize", "small"]);
    assert_eq!(mat["files"], 40);
    assert_eq!(mat["remote"]["ranged_gets"], 1, "{mat}");
    let down = mat["remote"]["bytes_down"].as_u64().unwrap();
    assert!(down < 200_000, "the small subtree's span only, not the 3.2 MB pack: {down} bytes");
    // The rest comes when asked for, again in one ranged GET.
    let big = m.json(&["materialize", "zbig"]);
    assert_eq!(big["files"], 400);
    assert_eq!(big["remote"]["ranged_gets"], 1, "{big}");
}

/// Packs-first: an import whose packs cannot be published fails and
/// leaves the ref where it was; a rerun publishes them.
#[test]
fn an_import_whose_packs_fail_leaves_the_ref_and_a_rerun_works() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    let o = m.cmd(&["import-git", repo.to_str().unwrap()]).env("MADO_FAIL", "publish-packs").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("publish-packs"), "{err}");
    assert!(!m.store_dir().join("refs/main").exists(), "the ref moved without its content");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    assert_cold_checkout_equals_clone(&m, &repo);
}

/// Packs-first: content lives only in packs, so a damaged pack is an error
/// naming the pack and the file, never a wrong byte and never a bad cache
/// entry; the rest of the store is untouched.
#[test]
fn a_damaged_pack_of_a_packs_first_store_is_named_and_nothing_bad_is_cached() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    let imp = m.json(&["import-git", repo.to_str().unwrap()]);
    assert_eq!(imp["packs"][0]["packs"], 1, "{imp}");
    assert!(!m.store_dir().join("objects").exists(), "nothing stored alone: {imp}");
    let pack = the_pack(&m);
    let pack_id = pack.file_name().unwrap().to_string_lossy().into_owned();
    let mut b = std::fs::read(&pack).unwrap();
    let n = b.len();
    b[n - 3] ^= 0xff; // inside the last member
    std::fs::write(&pack, b).unwrap();
    wipe_cache(&m);
    let o = m.run(&["checkout", "main", m.dir.path().join("co").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(&pack_id), "the pack is named: {err}");
    assert!(err.contains("not found in the store"), "the object read alone is missing: {err}");
    let v = m.json(&["cache", "verify"]);
    assert_eq!(v["bad"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn packed_subtree_costs_one_ranged_get_on_every_backend() {
    for (label, m) in Mado::every_backend() {
        eprintln!("backend: {label}");
        packed_subtree_costs_one_ranged_get(&m);
    }
}

/// `mado checkout REF DIR PATH...`: only the named paths, each at its own
/// place, equal to git's; from a cold cache only their span of the packs
/// comes down; hostile or missing paths are refused before anything is
/// written.
#[test]
fn subtree_checkout_writes_only_the_named_paths_and_downloads_their_span() {
    let m = Mado::local();
    let repo = real_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);

    wipe_cache(&m);
    let full = m.dir.path().join("full");
    let whole = m.json(&["checkout", "main", full.to_str().unwrap()]);
    // Cold: every member goes from its pack's stream to its file, none
    // through a shared flight (which would keep them all in memory).
    let streamed = whole["packs"]["members_streamed"].as_u64().unwrap();
    assert!(streamed >= count_files(&repo.join("vendor")) / 2, "{whole}");
    assert_eq!(whole["packs"]["members_from_packs"].as_u64().unwrap(), 0, "{whole}");
    assert_same_tree(&repo.join("vendor"), &full.join("vendor"));

    // Cold, one subtree (named twice over): its span of the pack only.
    wipe_cache(&m);
    let one = m.dir.path().join("one");
    let sync = "vendor/tokio/src/sync";
    let sub =
        m.json(&["checkout", "main", one.to_str().unwrap(), "vendor/tokio/src/sync/", "vendor/tokio/src/sync/mpsc"]);
    assert_same_tree(&repo.join(sync), &one.join(sync));
    let down = |v: &serde_json::Value| v["remote"]["bytes_down"].as_u64().unwrap();
    assert!(sub["remote"]["ranged_gets"].as_u64().unwrap() >= 1, "read through packs: {sub}");
    assert!(
        down(&sub) * 2 < down(&whole),
        "a subtree's span, not the whole packs: {} of {} bytes",
        down(&sub),
        down(&whole)
    );

    // Several paths, each at its own place, and nothing else.
    let co = m.dir.path().join("co");
    let two = m.json(&["checkout", "main", co.to_str().unwrap(), "README", "vendor/tokio/src"]);
    assert_eq!(two["paths"].as_array().unwrap().len(), 2, "{two}");
    assert_same_tree(&repo.join("vendor/tokio/src"), &co.join("vendor/tokio/src"));
    assert_eq!(std::fs::read(co.join("README")).unwrap(), b"real sources\n");
    let top: Vec<_> = std::fs::read_dir(co.join("vendor")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(top, vec![std::ffi::OsString::from("tokio")], "only the named paths");
    assert!(!co.join("vendor/tokio/Cargo.toml").exists());

    // Refused before anything is written, naming the path.
    let bad = m.dir.path().join("bad");
    for (path, says) in [
        ("../etc", ".."),
        ("/etc/passwd", "absolute"),
        ("vendor/../README", ".."),
        ("vendor/nope", "vendor/nope is not in the snapshot"),
        ("vendor/nope/deeper", "vendor/nope/deeper is not in the snapshot"),
        ("README/x", "README/x"),
        ("", "empty"),
    ] {
        let err = m.fails(&["checkout", "main", bad.to_str().unwrap(), path], 1);
        assert!(err.contains(says), "{path:?}: {err}");
        assert!(!bad.exists(), "{path:?}: the target was created");
    }
}

/// Packs-first: a file too large for a pack of the plan (here a 5 MB
/// chunked file with a 1 MB cap) goes up in packs of its own, its manifest
/// and chunks in file order, nothing alone, and reads back; the next import
/// finds them there and sends them no more.
#[test]
fn a_file_over_the_pack_cap_goes_up_in_packs_of_its_own_once() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    let imp = m.json(&["import-git", repo.to_str().unwrap(), "--max-pack-bytes", "1000000"]);
    let p = &imp["packs"][0];
    assert_eq!(p["loose_uploaded"], 0, "{imp}");
    assert_eq!(p["unpacked_objects"], 0, "{imp}");
    let packs = p["packs_uploaded"].as_u64().unwrap();
    assert!(packs >= 6, "5 MB in packs of at most 1 MB, and the rest: {imp}");
    assert_store_closed(&m.store_dir());
    assert_refs_whole(&m.store_dir());
    assert_cold_checkout_equals_clone(&m, &repo);

    std::fs::write(repo.join("README.md"), "changed\n").unwrap();
    git(&repo, &["commit", "-qam", "second"]);
    let next = m.json(&["import-git", repo.to_str().unwrap(), "--max-pack-bytes", "1000000"]);
    assert_eq!(next["packs"][0]["loose_uploaded"], 0, "{next}");
    assert_eq!(next["packs"][0]["packs_uploaded"], 1, "{next}");
    wipe_cache(&m);
    let co2 = m.dir.path().join("co2");
    m.ok(&["checkout", "main", co2.to_str().unwrap()]);
    assert_eq!(std::fs::read(co2.join("README.md")).unwrap(), b"changed\n");
    assert_eq!(std::fs::read(co2.join("big.bin")).unwrap(), std::fs::read(repo.join("big.bin")).unwrap());
}

/// A cold fetch keeps each pack as one cache file (not a file per member),
/// reads are served from it with no network, and a damaged pack file is
/// detected, never served, and fetched again.
#[test]
fn a_fetched_pack_is_one_cache_file_and_heals_when_damaged() {
    let m = Mado::local();
    let repo = real_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let files = count_files(&repo.join("vendor"));
    wipe_cache(&m);
    let mat = m.json(&["materialize", "vendor"]);
    assert_eq!(mat["files"].as_u64().unwrap(), files);
    let stats = m.json(&["cache", "stats"]);
    let packs = stats["packs"].as_u64().unwrap();
    assert!(packs >= 1, "{stats}");
    assert!(stats["entries"].as_u64().unwrap() < 10, "members are not exploded into loose files: {stats}");
    let co = m.dir.path().join("co");
    let warm = m.json(&["checkout", "main", co.to_str().unwrap()]);
    assert_eq!(gets(&warm), 1, "the ref only: {warm}");
    assert_same_tree(&repo.join("vendor"), &co.join("vendor"));

    // Flip a byte in the middle of every cached pack file.
    let data = m.cache_dir().join("packs/data");
    for e in std::fs::read_dir(&data).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "pack") {
            let mut b = std::fs::read(&p).unwrap();
            let mid = b.len() / 2;
            b[mid] ^= 0x55;
            std::fs::write(&p, b).unwrap();
        }
    }
    let co2 = m.dir.path().join("co2");
    let healed = m.json(&["checkout", "main", co2.to_str().unwrap()]);
    assert_same_tree(&repo.join("vendor"), &co2.join("vendor"));
    assert!(gets(&healed) > 1, "the damaged part was fetched again: {healed}");
    let v = m.json(&["cache", "verify"]);
    assert_eq!(v["bad"].as_array().unwrap().len(), 0, "nothing bad was kept: {v}");
}

/// An import stages small content in memory and keeps the packs it builds
/// in the cache whole: a handful of files, not one per object, and reads
/// right after it stay local. Content a built pack does not carry (the
/// ref's members, with the cache wiped in between) lands as loose objects.
#[test]
fn an_import_keeps_its_packs_whole_in_the_cache_not_a_file_per_object() {
    let m = Mado::local();
    let repo = real_repo(m.dir.path());
    let files = count_files(&repo.join("vendor"));
    let imp = m.json(&["import-git", repo.to_str().unwrap()]);
    let packs = imp["packs"][0]["packs"].as_u64().unwrap();
    let loose = count_files(&m.cache_dir().join("objects"));
    assert!(loose <= 2, "the snapshot, not {files} staged objects: {loose} loose files");
    let stats = m.json(&["cache", "stats"]);
    assert_eq!(stats["packs"].as_u64().unwrap(), packs, "every pack built is kept: {stats}");
    let co = m.dir.path().join("co");
    let warm = m.json(&["checkout", "main", co.to_str().unwrap()]);
    assert!(gets(&warm) <= 1, "the ref only: {warm}");
    assert_same_tree(&repo.join("vendor"), &co.join("vendor"));
    let v = m.json(&["cache", "verify"]);
    assert_eq!(v["bad"].as_array().unwrap().len(), 0, "{v}");
    assert!(v["checked"].as_u64().unwrap() >= packs, "{v}");

    // A next commit imported into a wiped cache packs only the new file;
    // the rest is cached loose, as staging in the cache left it.
    std::fs::write(repo.join("NEW"), "one more file\n").unwrap();
    git(&repo, &["add", "NEW"]);
    git(&repo, &["commit", "-q", "-m", "new"]);
    wipe_cache(&m);
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let co2 = m.dir.path().join("co2");
    let warm = m.json(&["checkout", "main", co2.to_str().unwrap()]);
    assert!(gets(&warm) <= 1, "the ref only: {warm}");
    assert_same_tree(&repo.join("vendor"), &co2.join("vendor"));
    let v = m.json(&["cache", "verify"]);
    assert_eq!(v["bad"].as_array().unwrap().len(), 0, "{v}");
}
