//! Workspaces through the `mado` binary: checkpoint and resume byte for
//! byte (mtimes included), dedup across workspaces, single-writer leases,
//! and crash safety at every step of a checkpoint.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;

fn checkpoint_resume_round_trip(m: &Mado) {
    setup(m);
    let w1 = m.dir.path().join("w1");
    m.ok(&["ws", "create", "agent", "--from", "main", "--dir", w1.to_str().unwrap()]);
    edit(&w1);
    let cp = m.json(&["ws", "checkpoint", "--dir", w1.to_str().unwrap(), "-m", "edits"]);
    assert_eq!(cp["unchanged"], false, "{cp}");
    assert_eq!(cp["upload"]["snapshots_uploaded"], 1, "the new snapshot is counted: {cp}");
    // The submodule's empty directory goes back as the gitlink it was.
    assert!(m.ok(&["ls", "ws/agent", "vendor"]).contains("gitlink"), "the gitlink is kept");
    // Elsewhere, from an empty cache.
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let w2 = m.dir.path().join("w2");
    // A non-empty target is refused before anything is taken.
    let busy = m.dir.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("x"), "x").unwrap();
    assert!(m.fails(&["ws", "resume", "agent", busy.to_str().unwrap()], 1).contains("not empty"));
    // w1 holds the lease: a resume is refused (exit 1, naming the holder
    // and what to do) and leaves the target empty. The lease is read in
    // the ref's round trip, so nothing else was fetched: the cache holds
    // no snapshot, index or pack.
    let err = m.fails(&["ws", "resume", "agent", w2.to_str().unwrap()], 1);
    assert!(err.contains("leased by") && err.contains("w1") && err.contains("ws release"), "{err}");
    assert!(!w2.exists() || std::fs::read_dir(&w2).unwrap().next().is_none(), "a refused resume left files");
    let cached = m.json(&["cache", "stats"]);
    assert_eq!((cached["entries"].as_u64(), cached["packs"].as_u64()), (Some(0), Some(0)), "{cached}");
    // Released on w1, it is free at once (no --steal).
    let rel = m.json(&["ws", "release", "--dir", w1.to_str().unwrap()]);
    assert_eq!(rel["released"], true, "{rel}");
    m.ok(&["ws", "resume", "agent", w2.to_str().unwrap()]);
    assert_same_state(&w1, &w2);
    // Now w2 holds it: w1 cannot checkpoint until w2 lets go.
    let err = m.fails(&["ws", "checkpoint", "--dir", w1.to_str().unwrap()], 1);
    assert!(err.contains("leased by") && err.contains("w2"), "{err}");
    m.ok(&["ws", "release", "--dir", w2.to_str().unwrap()]);
    // Nothing changed: a checkpoint is a no-op that reads no file.
    let again = m.json(&["ws", "checkpoint", "--dir", w1.to_str().unwrap()]);
    assert_eq!(again["unchanged"], true, "{again}");
    assert_eq!(again["files_read"], 0, "the stat cache recognised every file: {again}");
    let log = m.json(&["ws", "log", "agent"]);
    assert_eq!(log.as_array().unwrap().len(), 2);
    assert_eq!(log[0]["message"], "edits");
    let list = m.json(&["ws", "list"]);
    assert_eq!(list[0]["name"], "agent");
    let text = m.ok(&["ws", "list"]);
    assert!(text.starts_with("WORKSPACE ") && text.lines().nth(1).unwrap().starts_with("agent "), "{text}");
}

#[test]
fn same_edits_in_two_workspaces_share_every_file_and_tree_minio() {
    let Some(base) = s3_base() else { return };
    let m = Mado::s3(&base);
    setup(&m);
    let (a, b) = (m.dir.path().join("a"), m.dir.path().join("b"));
    m.ok(&["ws", "create", "one", "--dir", a.to_str().unwrap()]);
    m.ok(&["ws", "create", "two", "--dir", b.to_str().unwrap()]);
    edit(&a);
    edit(&b);
    let first = m.json(&["ws", "checkpoint", "--dir", a.to_str().unwrap()]);
    assert!(first["packs_uploaded"].as_u64().unwrap() >= 1, "{first}");
    let second = m.json(&["ws", "checkpoint", "--dir", b.to_str().unwrap()]);
    // No file and no tree: the tree is indexed already, so only the stat
    // object (different mtimes) and the snapshot are new. (Its delta pack
    // may go up while the index is asked about, not waiting on it; the
    // index does wait, and is not written again.)
    assert_eq!(second["upload"]["trees_uploaded"], 0, "{second}");
    assert!(second["upload"]["objects_uploaded"].as_u64().unwrap() <= 1, "{second}");
    assert_eq!(second["index_bytes"], 0, "{second}");
}

#[test]
fn two_writers_one_wins_the_other_gets_the_lease_error_minio() {
    let Some(base) = s3_base() else { return };
    two_writers_race(&base);
}

/// The same race on Azure Blob (Azurite): its conditional PUTs
/// (If-None-Match / If-Match) must give the same single winner.
#[test]
fn two_writers_one_wins_the_other_gets_the_lease_error_azurite() {
    let Some(base) = azure_base() else { return };
    two_writers_race(&base);
}

fn two_writers_race(base: &str) {
    let m = Mado::s3(base);
    setup(&m);
    let (a, b) = (m.dir.path().join("a"), m.dir.path().join("b"));
    m.ok(&["ws", "create", "shared", "--dir", a.to_str().unwrap()]);
    // Both copies at the same head, the lease free: they race for it.
    m.ok(&["ws", "release", "--dir", a.to_str().unwrap()]);
    m.ok(&["ws", "resume", "shared", b.to_str().unwrap()]);
    m.ok(&["ws", "release", "--dir", b.to_str().unwrap()]);
    std::fs::write(a.join("from-a.txt"), "a\n").unwrap();
    std::fs::write(b.join("from-b.txt"), "b\n").unwrap();
    let run = |d: &Path| {
        m.cmd(&["ws", "checkpoint", "--dir", d.to_str().unwrap(), "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (pa, pb) = (run(&a), run(&b));
    let (oa, ob) = (pa.wait_with_output().unwrap(), pb.wait_with_output().unwrap());
    // Exactly one wins; the loser gets the lease error naming the winner.
    let (winner, wo, loser, lo, won_file) =
        if oa.status.success() { (&a, oa, &b, ob, "from-a.txt") } else { (&b, ob, &a, oa, "from-b.txt") };
    assert!(wo.status.success(), "{}", String::from_utf8_lossy(&wo.stderr));
    assert_eq!(lo.status.code(), Some(1));
    let err = String::from_utf8_lossy(&lo.stderr);
    assert!(err.contains("leased by") && err.contains(&winner.display().to_string()), "{err}");
    // Nothing lost: the winner's checkpoint resumes, the loser's edit is
    // still in its working copy.
    let c = m.dir.path().join("c");
    m.ok(&["ws", "resume", "shared", c.to_str().unwrap(), "--read-only"]);
    assert!(c.join(won_file).is_file());
    let lost_file = if won_file == "from-a.txt" { "from-b.txt" } else { "from-a.txt" };
    assert!(loser.join(lost_file).is_file());
}

#[test]
fn expired_leases_need_steal_and_live_ones_cannot_be_stolen() {
    let m = Mado::local();
    setup(&m);
    let a = m.dir.path().join("a");
    m.ok(&["ws", "create", "w", "--dir", a.to_str().unwrap()]);
    let lease = m.store_dir().join("leases/ws/w");
    let write_lease = |expires: i64| {
        let mut b = b"MADL\x01".to_vec();
        b.push(5);
        b.extend_from_slice(b"other");
        b.extend_from_slice(&expires.to_le_bytes());
        std::fs::write(&lease, b).unwrap();
    };
    std::fs::write(a.join("x"), "x").unwrap();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    write_lease(now + 600);
    let err = m.fails(&["ws", "checkpoint", "--dir", a.to_str().unwrap()], 1);
    assert!(err.contains("leased by other until"), "{err}");
    // The date is a local date a person reads, not seconds since 1970.
    let until = err.split(" until ").nth(1).unwrap_or_default();
    assert!(until.len() > 19 && until.as_bytes()[4] == b'-' && until.as_bytes()[13] == b':', "{err}");
    assert!(!err.contains(&(now + 600).to_string()), "{err}");
    // Under --json the lease is there as numbers for a script.
    let err = m.fails(&["ws", "checkpoint", "--dir", a.to_str().unwrap(), "--json"], 1);
    let e: serde_json::Value = serde_json::from_str(&err).unwrap();
    assert_eq!(e["lease"]["expires"], now + 600, "{e}");
    assert_eq!((e["lease"]["holder"].as_str(), e["lease"]["expired"].as_bool()), (Some("other"), Some(false)), "{e}");
    let err = m.fails(&["ws", "checkpoint", "--dir", a.to_str().unwrap(), "--steal"], 1);
    assert!(err.contains("leased by other until"), "a live lease is not stolen: {err}");
    write_lease(now - 10);
    let err = m.fails(&["ws", "checkpoint", "--dir", a.to_str().unwrap()], 1);
    assert!(err.contains("expired") && err.contains("--steal"), "{err}");
    m.ok(&["ws", "checkpoint", "--dir", a.to_str().unwrap(), "--steal"]);
}

#[test]
fn a_checkpoint_killed_at_any_step_leaves_a_whole_snapshot() {
    for point in
        ["checkpoint-after-objects", "checkpoint-after-packs", "checkpoint-after-snapshot", "checkpoint-after-ref"]
    {
        let m = Mado::local();
        setup(&m);
        let w = m.dir.path().join("w");
        m.ok(&["ws", "create", "crash", "--dir", w.to_str().unwrap()]);
        let before = m.dir.path().join("before");
        m.ok(&["ws", "resume", "crash", before.to_str().unwrap(), "--read-only"]);
        edit(&w);
        let o =
            m.cmd(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]).env("MADO_FAILPOINT", point).output().unwrap();
        assert!(!o.status.success(), "{point}: the failpoint must kill the checkpoint");
        // A fresh resume sees the old snapshot or the whole new one.
        std::fs::remove_dir_all(m.cache_dir()).unwrap();
        let r = m.dir.path().join("after");
        m.ok(&["ws", "resume", "crash", r.to_str().unwrap(), "--read-only"]);
        let moved = point == "checkpoint-after-ref";
        if moved {
            assert_same_state(&w, &r);
        } else {
            assert_eq!(
                full_state(&before).keys().collect::<Vec<_>>(),
                full_state(&r).keys().collect::<Vec<_>>(),
                "{point}"
            );
        }
        // The next checkpoint succeeds and resumes whole.
        std::fs::write(w.join("later.txt"), "later\n").unwrap();
        m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
        std::fs::remove_dir_all(m.cache_dir()).unwrap();
        let r2 = m.dir.path().join("after2");
        m.ok(&["ws", "resume", "crash", r2.to_str().unwrap(), "--read-only"]);
        assert_same_state(&w, &r2);
    }
}

#[test]
fn the_stat_cache_rereads_only_changed_files() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "sc", "--dir", w.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(w.join("README.md"), "# changed\n").unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_eq!(cp["files_read"], 1, "{cp}");
    assert!(cp["files_unchanged"].as_u64().unwrap() >= 8, "{cp}");
    // The upload follows the change: one small delta pack, not the 5 MiB
    // pack holding the rest of the tree.
    assert_eq!(cp["packs_uploaded"], 1, "{cp}");
    assert!(cp["remote"]["bytes_up"].as_u64().unwrap() < 50_000, "{cp}");
    // A cold resume reads through the base pack and the delta pack.
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let r = m.dir.path().join("r");
    let out = m.cmd(&["ws", "resume", "sc", r.to_str().unwrap(), "--verbose", "--read-only"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("2 exploded"), "{err}");
    assert_eq!(std::fs::read(r.join("README.md")).unwrap(), b"# changed\n");
}

/// Like a push that is not a fast-forward: a working copy whose base is
/// older than the workspace's head does not silently drop the newer
/// checkpoints (`--steal` takes a lease, it never discards work).
#[test]
fn a_stale_working_copy_does_not_overwrite_newer_checkpoints() {
    let m = Mado::local();
    setup(&m);
    let (a, b) = (m.dir.path().join("a"), m.dir.path().join("b"));
    m.ok(&["ws", "create", "st", "--dir", a.to_str().unwrap()]);
    std::fs::write(a.join("c1.txt"), "c1\n").unwrap();
    m.ok(&["ws", "checkpoint", "--dir", a.to_str().unwrap(), "-m", "c1"]);
    m.ok(&["ws", "release", "--dir", a.to_str().unwrap()]);
    m.ok(&["ws", "resume", "st", b.to_str().unwrap()]);
    std::fs::write(b.join("c2.txt"), "c2\n").unwrap();
    let c2 = m.json(&["ws", "checkpoint", "--dir", b.to_str().unwrap(), "-m", "c2"]);
    m.ok(&["ws", "release", "--dir", b.to_str().unwrap()]);
    // Back in A, still based on c1: its status says so before a
    // checkpoint is tried (and B's, up to date, says nothing of it).
    std::fs::write(a.join("c3.txt"), "c3\n").unwrap();
    let st = m.json(&["ws", "status", "--dir", a.to_str().unwrap()]);
    assert_eq!(st["moved_to"], c2["snapshot"], "{st}");
    let o = m.run(&["ws", "status", "--dir", a.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("moved on to") && err.contains("--force"), "{err}");
    assert_eq!(m.json(&["ws", "status", "--dir", b.to_str().unwrap()])["moved_to"], serde_json::Value::Null);
    for extra in [&[][..], &["--steal"][..]] {
        let mut args = vec!["ws", "checkpoint", "--dir", a.to_str().unwrap()];
        args.extend_from_slice(extra);
        let err = m.fails(&args, 1);
        let c2_short = &c2["snapshot"].as_str().unwrap()[..12];
        assert!(err.contains("moved to") && err.contains(c2_short) && err.contains("--force"), "{err}");
    }
    let head = m.json(&["ws", "list"])[0]["snapshot"].clone();
    assert_eq!(head, c2["snapshot"], "the refused checkpoint moved the head");
    // Nor did it keep the lease it took for nothing: B resumes at once.
    let b2 = m.dir.path().join("b2");
    m.ok(&["ws", "resume", "st", b2.to_str().unwrap()]);
    m.ok(&["ws", "release", "--dir", b2.to_str().unwrap()]);
    // --force replaces the head with A's tree (c2 stays in the log).
    m.ok(&["ws", "checkpoint", "--dir", a.to_str().unwrap(), "--force", "-m", "c3"]);
    let log = m.json(&["ws", "log", "st"]);
    assert_eq!(log[1]["message"], "c2", "{log}");
}

/// A checkpoint killed after its ref moved but before the working copy
/// recorded its new head: the next checkpoint knows the head is its own.
#[test]
fn a_checkpoint_killed_after_the_ref_moved_is_not_taken_for_a_stale_copy() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "k", "--dir", w.to_str().unwrap()]);
    std::fs::write(w.join("one.txt"), "1\n").unwrap();
    let o = m
        .cmd(&["ws", "checkpoint", "--dir", w.to_str().unwrap()])
        .env("MADO_FAILPOINT", "checkpoint-after-ref")
        .output()
        .unwrap();
    assert!(!o.status.success());
    std::fs::write(w.join("two.txt"), "2\n").unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false, "{cp}");
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.join(".mado/workspace.json")).unwrap()).unwrap();
    assert_eq!(st["head"], cp["snapshot"], "{st}");
    assert!(st.get("pending").is_none(), "{st}");
}

/// A working copy whose own state file is torn: exit 1 (the user's to
/// repair) naming the file, and nothing is uploaded.
#[test]
fn a_torn_workspace_state_is_a_local_state_error_naming_the_file() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "torn", "--dir", w.to_str().unwrap()]);
    let state = w.join(".mado/workspace.json");
    let text = std::fs::read_to_string(&state).unwrap();
    std::fs::write(&state, &text[..text.len() / 2]).unwrap();
    std::fs::write(w.join("new.txt"), "new\n").unwrap();
    let before = m.json(&["ws", "list"])[0]["snapshot"].clone();
    let err = m.fails(&["ws", "checkpoint", "--dir", w.to_str().unwrap()], 1);
    assert!(err.contains("workspace.json") && err.contains("unreadable"), "{err}");
    assert!(!err.contains("internal error"), "{err}");
    assert_eq!(m.json(&["ws", "list"])[0]["snapshot"], before);
}

#[test]
fn checkpoint_resume_round_trip_on_every_backend() {
    for (label, m) in Mado::every_backend() {
        eprintln!("backend: {label}");
        checkpoint_resume_round_trip(&m);
    }
}

/// A checkpoint uploads an index *layer* (what the parent's index lacks),
/// not the index of the whole tree; the ref names the layers, so a cold
/// resume fetches them all in the round trip of the top one; chains are
/// compacted, so after many checkpoints a cold resume still costs the same
/// round trips; gc keeps every layer a live index stands on.
#[test]
fn checkpoint_indexes_are_layers_and_cold_reads_keep_their_round_trips() {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    for d in 0..300 {
        for f in 0..4 {
            let p = repo.join(format!("d{d:03}/sub/f{f}.txt"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, format!("dir {d} file {f}\n")).unwrap();
        }
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "x");
    let imp = m.json(&["import-git", repo.to_str().unwrap()]);
    let whole = imp["packs"][0]["index_bytes"].as_u64().unwrap();
    assert!(whole > 20_000, "{imp}");
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "lay", "--dir", w.to_str().unwrap()]);
    let resume_cold = |n: usize| {
        let _ = std::fs::remove_dir_all(m.cache_dir());
        let r = m.dir.path().join(format!("r{n}"));
        // A delay per request, so what runs together is counted together.
        let o = m
            .cmd(&["ws", "resume", "lay", r.to_str().unwrap(), "--read-only", "--json"])
            .env("MADO_INJECT_RTT_MS", "30")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_same_state(&w, &r);
        v
    };
    let mut first = None;
    let (mut index_up, mut stat_up) = (0, 0);
    // 100 checkpoints: each adds a small delta pack, which a later
    // checkpoint's pack folds in (with the layers that named it), so a
    // cold read does not fetch 100 of them (without folding: 101 ranged
    // GETs and, past the fetcher's 32 in flight, 7 round trips).
    const CHECKPOINTS: u64 = 100;
    for i in 0..CHECKPOINTS {
        std::fs::write(w.join(format!("d{:03}/sub/f0.txt", i * 7 % 300)), format!("edit {i}\n")).unwrap();
        let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
        let up = cp["index_bytes"].as_u64().unwrap();
        let layers = cp["index_layers"].as_u64().unwrap();
        assert!((2..=mado_core::pack::MAX_INDEX_LAYERS as u64).contains(&layers), "never whole again: {cp}");
        assert!(up * 2 < whole, "checkpoint {i} uploads a layer, not {whole} index bytes: {cp}");
        // The stat object too: after the first (the import had none),
        // layers of the few changed times.
        let stat = cp["stat_bytes"].as_u64().unwrap();
        if i == 0 {
            // The root (300 entries, 12 KB whole) goes as a delta over the
            // root below (FORMAT.md, index version 3): a few hundred bytes.
            assert!(up < 1_000, "{up} index bytes up: {cp}");
            let versions: Vec<u8> = std::fs::read_dir(m.store_dir().join("packs/index"))
                .unwrap()
                .map(|e| std::fs::read(e.unwrap().path()).unwrap()[4])
                .collect();
            assert_eq!(versions.iter().filter(|v| **v == 3).count(), 1, "one layer with tree deltas: {versions:?}");
            first = Some(resume_cold(i as usize)["remote"].clone());
        } else {
            index_up += up;
            stat_up += stat;
        }
    }
    // Each checkpoint changes one file: one root entry (a delta over a
    // root below) and two small trees. Compaction keeps the chains
    // geometric, so over the checkpoints the uploads stay a few small
    // layers each: 151 KB in all when measured, 1.5 KB a checkpoint with
    // the packs and trees compactions carry (compacting over the bottom
    // each time the chain fills up would hold every change since the
    // bottom: about 3 MB of index and 150 KB of times here; whole roots,
    // 12 KB a checkpoint at least).
    assert!(index_up < (CHECKPOINTS - 1) * 2_500, "{index_up} index bytes up");
    assert!(stat_up < (CHECKPOINTS - 1) * 400, "{stat_up} stat bytes up");
    let last = resume_cold(999);
    let (first, last) = (first.unwrap(), &last["remote"]);
    // ref; snapshot ‖ every index layer; packs ‖ stat layers (the depth
    // count may see one more when a request starts just after another ends).
    let rts = |v: &serde_json::Value| v["round_trips"].as_u64().unwrap();
    assert!(rts(&first) <= 4 && rts(last) <= 4, "layers cost no extra round trip: {first} then {last}");
    // GETs: the ref, the snapshot, the index layers and the stat layers
    // (a chain is at most 8 of each), and the packs: the new pack of a
    // checkpoint folds in the small packs of the layers it absorbs, so a
    // cold read does not fetch one delta pack per checkpoint.
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    assert!(n(last, "ranged_gets") <= n(&first, "ranged_gets") + 2, "packs fetched: {first} then {last}");
    assert!(n(last, "gets") <= n(&first, "gets") + 8, "objects fetched: {first} then {last}");
    // A cold checkout and a cold materialize of a subtree of the same
    // snapshot keep the packed-subtree economy: 3 sequential round trips.
    let cold = |args: &[&str]| {
        let _ = std::fs::remove_dir_all(m.cache_dir());
        let o = m.cmd(args).arg("--json").env("MADO_INJECT_RTT_MS", "30").output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["remote"].clone()
    };
    let co = m.dir.path().join("co-sub");
    let sub = cold(&["checkout", "ws/lay", co.to_str().unwrap(), "d007"]);
    assert!(n(&sub, "round_trips") <= 3, "cold subtree checkout after {CHECKPOINTS} checkpoints: {sub}");
    assert_eq!(std::fs::read(co.join("d007/sub/f0.txt")).unwrap(), std::fs::read(w.join("d007/sub/f0.txt")).unwrap());
    let mat = cold(&["materialize", "-r", "ws/lay", "d014"]);
    assert!(n(&mat, "round_trips") <= 3, "cold materialize after {CHECKPOINTS} checkpoints: {mat}");
    // gc keeps the layers below a live index (their trees are older roots).
    m.ok(&["gc", "--grace", "0"]);
    resume_cold(100);
}

/// The stat cache keeps each directory's tree, reused while every entry is
/// as recorded and none came or went: each kind of change to a directory
/// that is otherwise untouched must still reach the checkpoint (a resume
/// elsewhere after each one is identical to the working copy).
#[test]
fn every_change_to_a_directory_reaches_the_checkpoint_despite_reused_trees() {
    use std::os::unix::fs::PermissionsExt;
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "dirs", "--dir", w.to_str().unwrap()]);
    let c = w.join("a/b/c");
    std::fs::create_dir_all(&c).unwrap();
    for f in ["x.txt", "z.txt", "w.txt", "v.txt", "t.txt"] {
        std::fs::write(c.join(f), format!("{f}\n")).unwrap();
    }
    std::os::unix::fs::symlink("x.txt", c.join("l")).unwrap();
    std::fs::write(w.join(".gitignore"), "*.log\n").unwrap();
    std::fs::write(c.join("y.log"), "log\n").unwrap();
    // Twice: the second checkpoint is the first with directory rows.
    for _ in 0..2 {
        m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    }
    type Edit<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let edits: Vec<Edit> = vec![
        // (Once tracked, it stays tracked, as in git.)
        ("an ignored file no longer ignored", Box::new(|| std::fs::write(w.join(".gitignore"), "*.tmp\n").unwrap())),
        ("a file removed", Box::new(|| std::fs::remove_file(c.join("x.txt")).unwrap())),
        (
            "a mode change",
            Box::new(|| std::fs::set_permissions(c.join("z.txt"), std::fs::Permissions::from_mode(0o755)).unwrap()),
        ),
        (
            "a file replaced by a directory",
            Box::new(|| {
                std::fs::remove_file(c.join("w.txt")).unwrap();
                std::fs::create_dir(c.join("w.txt")).unwrap();
                std::fs::write(c.join("w.txt/in"), "in\n").unwrap();
            }),
        ),
        ("a rename", Box::new(|| std::fs::rename(c.join("v.txt"), c.join("v2.txt")).unwrap())),
        (
            "a symlink retargeted",
            Box::new(|| {
                std::fs::remove_file(c.join("l")).unwrap();
                std::os::unix::fs::symlink("z.txt", c.join("l")).unwrap();
            }),
        ),
        (
            "new content under the old mtime",
            Box::new(|| {
                let old = std::fs::metadata(c.join("t.txt")).unwrap().modified().unwrap();
                std::fs::write(c.join("t.txt"), "T.TXT\n").unwrap();
                std::fs::File::options().write(true).open(c.join("t.txt")).unwrap().set_modified(old).unwrap();
            }),
        ),
        ("a directory emptied", Box::new(|| std::fs::remove_file(c.join("w.txt/in")).unwrap())),
    ];
    for (i, (what, edit)) in edits.iter().enumerate() {
        edit();
        let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
        assert_eq!(cp["unchanged"], false, "{what}: {cp}");
        let r = m.dir.path().join(format!("r{i}"));
        m.ok(&["ws", "resume", "dirs", r.to_str().unwrap(), "--read-only"]);
        assert_same_state(&w, &r);
        // Nothing left over: the next checkpoint finds nothing to do.
        let again = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
        assert_eq!(again["unchanged"], true, "{what}: {again}");
    }
    // Files whose times moved but not their content are read again, and
    // not written to the cache again (the base has them).
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    let touched = ["z.txt", "v2.txt", "t.txt", "y.log"];
    for f in touched {
        std::fs::File::options().write(true).open(c.join(f)).unwrap().set_modified(later).unwrap();
    }
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_eq!(cp["files_read"], 4, "{cp}");
    fn names(d: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                names(&e.path(), out);
            } else {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    let mut cached = Vec::new();
    names(&m.cache_dir(), &mut cached);
    for f in touched {
        let id = mado_core::Hash::of(&std::fs::read(c.join(f)).unwrap()).to_hex();
        assert!(!cached.iter().any(|n| n.contains(&id)), "{f} was written to the cache again");
    }
}

/// A checkpoint's new layer absorbs the small layers above the import's and
/// its pack folds in their packs' live members: members this machine never
/// fetched (its cache wiped between checkpoints) are read through those
/// packs from the store, not refused as missing.
#[test]
fn a_checkpoint_folds_in_packs_the_cache_never_held() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "fold", "--dir", w.to_str().unwrap()]);
    let checkpoint = |i: usize| {
        std::fs::write(w.join(format!("src/f{i}.txt")), format!("file {i}\n")).unwrap();
        let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
        assert_eq!(cp["unchanged"], false, "{cp}");
    };
    checkpoint(0);
    // The cache refilled by a resume elsewhere (the first layer's pack
    // only), then two checkpoints: the second folds in the first's pack,
    // whose members it holds only in a pack of its own it built.
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let r = m.dir.path().join("r");
    m.ok(&["ws", "resume", "fold", r.to_str().unwrap(), "--read-only"]);
    for i in 1..4 {
        checkpoint(i);
    }
    // Nothing in the cache at all.
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    for i in 4..6 {
        checkpoint(i);
    }
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let r = m.dir.path().join("r2");
    m.ok(&["ws", "resume", "fold", r.to_str().unwrap(), "--read-only"]);
    assert_same_state(&w, &r);
}

/// Round trips of a checkpoint (issue #18): the lease, the ref and the
/// store lock go while the working copy is walked; after the walk, two
/// sequential round trips (the stat object, the snapshot, the pack and its
/// index together; the ref), and no HEAD at all. Counted on MinIO (real
/// conditional PUTs) with a delay per request, from the request trace.
#[test]
fn a_checkpoint_waits_on_two_round_trips_after_its_walk_minio() {
    let Some(base) = s3_base() else { return };
    let m = Mado::s3(&base);
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "rt", "--dir", w.to_str().unwrap()]);
    edit(&w);
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    for round in 0..2 {
        std::fs::write(w.join("README.md"), format!("# round {round}\n")).unwrap();
        std::fs::write(w.join("src/deep/er/still.txt"), format!("deeper {round}\n")).unwrap();
        let o = m
            .cmd(&["ws", "checkpoint", "--dir", w.to_str().unwrap(), "--json"])
            .env("MADO_INJECT_RTT_MS", "30")
            .env("MADO_TRACE_REQUESTS", "1")
            .output()
            .unwrap();
        let trace = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{trace}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        // "[store] round trip   N: KIND key (+T ms)"
        let reqs: Vec<(u64, &str)> = trace
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("[store] round trip")?;
                let (d, what) = rest.split_once(':')?;
                let what = what.trim();
                Some((d.trim().parse().ok()?, what.rsplit_once(" (+").map_or(what, |(w, _)| w)))
            })
            .collect();
        let depth =
            |f: &dyn Fn(&str) -> bool| -> Vec<u64> { reqs.iter().filter(|(_, w)| f(w)).map(|(d, _)| *d).collect() };
        // The first request that needs the walk: the stat object or the
        // snapshot (both named by what the walk built).
        let after_walk = depth(&|w| w.contains("/snapshots/") || w.contains("/objects/"))
            .into_iter()
            .min()
            .expect("the snapshot went up");
        let moved =
            depth(&|w| w.starts_with("PUT") && w.ends_with("/refs/ws/rt")).into_iter().max().expect("the ref moved");
        assert!(moved + 1 - after_walk <= 2, "{} round trips after the walk:\n{trace}", moved + 1 - after_walk);
        let index = depth(&|w| w.starts_with("PUT") && w.contains("/packs/index/"));
        let pack = depth(&|w| w.starts_with("PUT") && w.contains("/packs/") && !w.contains("/packs/index/"));
        assert!(index.len() == 1 && pack.len() == 1, "{trace}");
        assert!(index[0] <= pack[0], "the index does not wait for the pack:\n{trace}");
        assert_eq!(v["remote"]["heads"], 0, "no HEAD: {v}");
        assert_eq!(v["upload"]["trees_uploaded"], 0, "trees travel in the index: {v}");
    }
    // Only an mtime moved: the stat object goes up alone, without a HEAD.
    set_mtime(&w.join("README.md"), 1_200_000_000);
    let v = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_eq!(v["unchanged"], false, "{v}");
    assert_eq!(v["remote"]["heads"], 0, "no HEAD: {v}");
    assert_eq!(v["upload"]["objects_uploaded"], 1, "the stat object: {v}");
    assert_eq!(v["packs_uploaded"], 0, "{v}");
}

/// A checkpoint's index goes up beside its packs, not after them (one round
/// trip fewer). One that failed between the two leaves an index naming a
/// pack the store lacks, which no ref reaches: a later checkpoint of the
/// same tree keeps it only if it is its own (the same bytes, whose pack it
/// has just put), replaces it when it differs, and a cold resume reads
/// every file. A sound index found there (the same edits elsewhere) stays.
#[test]
fn an_index_left_without_its_pack_is_replaced_not_trusted() {
    use mado_core::pack::PackIndex;
    let m = Mado::local();
    setup(&m);
    let index_dir = m.store_dir().join("packs/index");
    let indexes = || -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
        std::fs::read_dir(&index_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
            .collect()
    };
    let packs = || walk_files(&m.store_dir().join("packs")).into_iter().filter(|p| !p.starts_with(&index_dir)).count();
    let failed = |w: &Path, extra: &str| -> std::path::PathBuf {
        edit(w);
        std::fs::write(w.join("src/more.txt"), extra).unwrap();
        let before = indexes();
        let packs_before = packs();
        let o =
            m.cmd(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]).env("MADO_FAIL", "put-pack").output().unwrap();
        assert!(!o.status.success(), "the pack PUT failed: {}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(packs(), packs_before, "no pack went up");
        let new: Vec<_> = indexes().into_keys().filter(|k| !before.contains_key(k)).collect();
        assert_eq!(new.len(), 1, "the index went up beside the failed pack");
        new[0].clone()
    };
    let resumed_equal = |name: &str, w: &Path| {
        let r = m.dir.path().join(format!("resumed-{name}"));
        empty_cache(&m);
        m.ok(&["ws", "resume", name, r.to_str().unwrap(), "--read-only"]);
        assert_same_state(w, &r);
        assert_refs_whole(&m.store_dir());
    };

    // Its own index, retried: the same bytes, kept; the pack goes up.
    let a = m.dir.path().join("a");
    m.ok(&["ws", "create", "again", "--dir", a.to_str().unwrap()]);
    let left = failed(&a, "retried\n");
    let (packs_before, bytes_left) = (packs(), std::fs::read(&left).unwrap());
    let cp = m.json(&["ws", "checkpoint", "--dir", a.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false, "{cp}");
    assert_eq!(packs(), packs_before + 1, "the pack went up this time: {cp}");
    assert_eq!(std::fs::read(&left).unwrap(), bytes_left, "{cp}");
    resumed_equal("again", &a);

    // Another index of the tree naming a pack the store lacks (as one built
    // over another parent would): replaced.
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "torn", "--dir", w.to_str().unwrap()]);
    let left = failed(&w, "more content\n");
    let mut other = PackIndex::decode(&std::fs::read(&left).unwrap()).unwrap();
    let elsewhere = mado_core::Hash::of(b"a pack that never went up");
    other.packs[0].id = elsewhere;
    std::fs::write(&left, other.encode()).unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert!(cp["index_bytes"].as_u64().unwrap() > 0, "the unsound index was replaced: {cp}");
    let replaced = PackIndex::decode(&std::fs::read(&left).unwrap()).unwrap();
    assert!(replaced.packs.iter().all(|p| p.id != elsewhere), "{cp}");
    resumed_equal("torn", &w);

    // The same edits elsewhere: the index is sound now and stays.
    let v = m.dir.path().join("v");
    m.ok(&["ws", "create", "same", "--dir", v.to_str().unwrap()]);
    edit(&v);
    std::fs::write(v.join("src/more.txt"), "more content\n").unwrap();
    let before = indexes();
    let cp = m.json(&["ws", "checkpoint", "--dir", v.to_str().unwrap()]);
    assert_eq!(cp["index_bytes"], 0, "kept, not written again: {cp}");
    assert_eq!(indexes(), before, "{cp}");
    resumed_equal("same", &v);
}

/// Every regular file under `dir`.
fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type().unwrap().is_dir() {
                true => stack.push(e.path()),
                false => out.push(e.path()),
            }
        }
    }
    out
}

/// A working copy's checkpoint leaves out `.git` and the untracked paths
/// that `.gitignore` / `.madoignore` files ignore (nested files, `!`
/// re-includes), keeps what is tracked even when a rule matches it, and
/// keeps everything with `--no-ignore`. Without a stat cache to tell
/// tracked paths, no rule but `.git` applies (nothing tracked is dropped
/// because local state went missing).
#[test]
fn a_checkpoint_leaves_out_git_and_ignored_untracked_paths() {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    let w = |p: &str, data: &str| {
        let p = repo.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    w(".gitignore", "target/\n*.log\n!keep.log\n");
    w("src/a.rs", "a\n");
    w("src/.gitignore", "gen/\n");
    w("tracked.log", "tracked once\n");
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["add", "-f", "tracked.log"]);
    git(&repo, &["commit", "-qm", "x"]);
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let wc = m.dir.path().join("wc");
    m.ok(&["ws", "create", "ig", "--dir", wc.to_str().unwrap()]);
    let put = |p: &str, data: &str| {
        let p = wc.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    git(&wc, &["init", "-q"]);
    put("target/debug/app", "binary\n");
    put("new.log", "noise\n");
    put("keep.log", "kept\n");
    put("src/b.rs", "b\n");
    put("src/gen/x.rs", "generated\n");
    put("tracked.log", "tracked twice\n");
    put(".madoignore", "secret.txt\n");
    put("secret.txt", "do not upload\n");
    let cp = m.json(&["ws", "checkpoint", "--dir", wc.to_str().unwrap()]);
    assert_eq!(cp["paths_ignored"], 5, ".git, target, new.log, secret.txt, src/gen: {cp}");
    let names = |dir: &str| -> Vec<String> {
        let mut args = vec!["ls", "ws/ig"];
        if !dir.is_empty() {
            args.push(dir);
        }
        m.json(&args).as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect()
    };
    let top = names("");
    for want in [".gitignore", ".madoignore", "keep.log", "src", "tracked.log"] {
        assert!(top.contains(&want.to_string()), "{want} missing from {top:?}");
    }
    for gone in [".git", "target", "new.log", "secret.txt"] {
        assert!(!top.contains(&gone.to_string()), "{gone} uploaded: {top:?}");
    }
    assert_eq!(names("src"), vec![".gitignore", "a.rs", "b.rs"]);
    assert_eq!(m.ok(&["cat", "ws/ig", "tracked.log"]), "tracked twice\n", "a tracked path stays");

    // --no-ignore keeps everything.
    let cp = m.json(&["ws", "checkpoint", "--dir", wc.to_str().unwrap(), "--no-ignore"]);
    assert_eq!(cp["paths_ignored"], 0, "{cp}");
    let top = names("");
    assert!(top.contains(&".git".to_string()) && top.contains(&"target".to_string()), "{top:?}");

    // Without a stat cache, rules do not apply (everything was tracked
    // since the last checkpoint anyway); `.git` still goes.
    std::fs::remove_file(wc.join(".mado/statcache.bin")).unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", wc.to_str().unwrap()]);
    assert_eq!(cp["paths_ignored"], 1, "{cp}");
    assert!(names("").contains(&"target".to_string()));
}

/// A fork (`ws create --from ws/NAME`) checkpoints at the cost of its own
/// change too: its first checkpoint uploads an index layer and a stat
/// layer over the parent workspace's, not whole ones, and a cold resume of
/// the fork keeps the round trips of any resume.
#[test]
fn a_fork_checkpoints_layers_over_its_parent_workspace() {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    for d in 0..400 {
        let p = repo.join(format!("d{}/e{:02}/f.txt", d / 20, d % 20));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("dir {d}\n")).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "x");
    let imp = m.json(&["import-git", repo.to_str().unwrap()]);
    let whole = imp["packs"][0]["index_bytes"].as_u64().unwrap();
    let parent = m.dir.path().join("parent");
    m.ok(&["ws", "create", "parent", "--dir", parent.to_str().unwrap()]);
    std::fs::write(parent.join("d1/e01/f.txt"), "parent edit\n").unwrap();
    let p = m.json(&["ws", "checkpoint", "--dir", parent.to_str().unwrap()]);
    let parent_stat = p["stat_bytes"].as_u64().unwrap();

    let fork = m.dir.path().join("fork");
    m.ok(&["ws", "create", "fork", "--from", "ws/parent", "--dir", fork.to_str().unwrap()]);
    assert_eq!(std::fs::read(fork.join("d1/e01/f.txt")).unwrap(), b"parent edit\n");
    std::fs::write(fork.join("d2/e02/f.txt"), "fork edit\n").unwrap();
    let f = m.json(&["ws", "checkpoint", "--dir", fork.to_str().unwrap()]);
    let (idx, stat) = (f["index_bytes"].as_u64().unwrap(), f["stat_bytes"].as_u64().unwrap());
    assert!(idx > 0 && idx * 4 < whole, "an index layer, not the whole {whole} bytes: {f}");
    assert!(stat > 0 && stat * 4 < parent_stat.max(2_000), "a stat layer: {f}");
    assert!(f["index_layers"].as_u64().unwrap() >= 2, "{f}");

    // Cold, with a delay per request: a resume of the fork costs what any
    // resume costs (ref; snapshot ‖ every index layer; packs ‖ stat layers).
    let _ = std::fs::remove_dir_all(m.cache_dir());
    let r = m.dir.path().join("r");
    let o = m
        .cmd(&["ws", "resume", "fork", r.to_str().unwrap(), "--read-only", "--json"])
        .env("MADO_INJECT_RTT_MS", "30")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["remote"]["round_trips"].as_u64().unwrap() <= 4, "{v}");
    assert_same_state(&fork, &r);
}

/// `ws status` lists what a checkpoint would record against the working
/// copy's base: added, modified (content or exec bit) and deleted paths,
/// through renames and whole new or removed directories; an mtime alone is
/// no change; it uploads nothing, and is empty right after a checkpoint.
#[test]
fn ws_status_lists_what_a_checkpoint_would_record() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "st", "--dir", w.to_str().unwrap()]);
    let status = |extra: &[&str]| {
        let mut args = vec!["ws", "status", "--dir", w.to_str().unwrap()];
        args.extend_from_slice(extra);
        m.json(&args)
    };
    let s = status(&[]);
    assert_eq!((s["added"].as_array().unwrap().len(), s["modified"].as_array().unwrap().len()), (0, 0), "{s}");
    edit(&w);
    std::fs::remove_dir_all(w.join("src/deep")).unwrap();
    std::fs::create_dir_all(w.join("newdir/inner")).unwrap();
    std::fs::write(w.join("newdir/inner/x.txt"), "x\n").unwrap();
    // An empty directory: the checkpoint records it, so status shows it.
    std::fs::create_dir(w.join("hollow")).unwrap();
    let s = status(&[]);
    let list =
        |k: &str| -> Vec<String> { s[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect() };
    assert_eq!(list("added"), ["added.txt", "hollow/", "newdir/inner/x.txt", "newlink", "src/renamed.rs"]);
    assert_eq!(list("modified"), ["README.md", "win.bat"]);
    assert_eq!(list("deleted"), ["empty", "src/deep/er/still.txt", "src/lib.rs"]);
    let text = m.ok(&["ws", "status", "--dir", w.to_str().unwrap()]);
    assert!(text.lines().any(|l| l == "A added.txt") && text.lines().any(|l| l == "D src/lib.rs"), "{text}");
    // Nothing went up; after a checkpoint, nothing is left to show.
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false);
    let s = status(&[]);
    let total: usize = ["added", "modified", "deleted"].iter().map(|k| s[*k].as_array().unwrap().len()).sum();
    assert_eq!(total, 0, "{s}");
}

/// A FIFO in a plain working copy is left out of its checkpoint, counted
/// with the ignored paths (status says so too), and the checkpoint can be
/// resumed elsewhere. Its mtime was recorded while the FIFO was left out,
/// so every resume failed ("setting the mtime of p").
#[test]
fn a_fifo_in_a_working_copy_is_left_out_and_the_workspace_resumes() {
    let m = Mado::local();
    setup(&m);
    let w1 = m.dir.path().join("w1");
    m.ok(&["ws", "create", "f", "--dir", w1.to_str().unwrap()]);
    let fifo = w1.join("p");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let st = m.json(&["ws", "status", "--dir", w1.to_str().unwrap()]);
    assert_eq!(st["paths_ignored"], 1, "{st}");
    let cp = m.json(&["ws", "checkpoint", "--dir", w1.to_str().unwrap(), "-m", "with a fifo"]);
    assert_eq!(cp["paths_ignored"], 1, "{cp}");
    m.ok(&["ws", "release", "--dir", w1.to_str().unwrap()]);
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let w2 = m.dir.path().join("w2");
    m.ok(&["ws", "resume", "f", w2.to_str().unwrap()]);
    assert!(!w2.join("p").exists());
    // Without the FIFO (its removal moves the directory's mtime: put back),
    // the two copies are the same, mtimes included.
    let root_mtime = std::fs::metadata(&w1).unwrap().modified().unwrap();
    std::fs::remove_file(&fifo).unwrap();
    std::fs::File::open(&w1).unwrap().set_modified(root_mtime).unwrap();
    assert_same_state(&w1, &w2);
}

/// A working copy given as a relative path is recorded, as the lease's
/// holder, by its absolute path: a lease error elsewhere says where it is.
#[test]
fn a_relative_working_copy_is_named_by_its_absolute_path() {
    let m = Mado::local();
    setup(&m);
    let o = m.cmd(&["ws", "create", "rel", "--dir", "relcopy"]).current_dir(m.dir.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = m.fails(&["ws", "resume", "rel", m.dir.path().join("other").to_str().unwrap()], 1);
    let abs = m.dir.path().join("relcopy");
    assert!(err.contains(&format!("working copy {})", abs.display())), "{err}");
}

/// A working copy inside another: the outer one's checkpoint is refused
/// (a `.mado` inside would name another workspace), with a hint that says
/// how to leave the inner one out; following it, the checkpoint works.
#[test]
fn a_working_copy_inside_another_is_refused_with_the_ignore_line_to_add() {
    let m = Mado::local();
    setup(&m);
    let outer = m.dir.path().join("outer");
    m.ok(&["ws", "create", "outer", "--dir", outer.to_str().unwrap()]);
    m.ok(&["ws", "create", "inner", "--dir", outer.join("nested").to_str().unwrap()]);
    let err = m.fails(&["ws", "checkpoint", "--dir", outer.to_str().unwrap()], 1);
    assert!(
        err.contains("working copy of its own") && err.contains("/nested/") && err.contains(".madoignore"),
        "{err}"
    );
    std::fs::write(outer.join(".madoignore"), "/nested/\n").unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", outer.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false, "{cp}");
    assert!(!m.ok(&["ls", "ws/outer"]).contains("nested"));
}

/// A resume that fails partway (a pack gone from the store) leaves neither
/// half a copy nor a held lease: the directory is empty again, and once
/// the store is whole the same resume works, without --steal.
#[test]
fn a_resume_that_fails_partway_leaves_an_empty_directory_and_a_free_lease() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "half", "--dir", w.to_str().unwrap()]);
    std::fs::write(w.join("new.txt"), "new\n").unwrap();
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    m.ok(&["ws", "release", "--dir", w.to_str().unwrap()]);
    // Every pack moved away, and a fresh cache: the checkout cannot finish.
    let packs = m.store_dir().join("packs");
    let away = m.dir.path().join("packs-away");
    let mut moved = Vec::new();
    for e in std::fs::read_dir(&packs).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name.len() == 2 {
            std::fs::create_dir_all(&away).unwrap();
            std::fs::rename(&p, away.join(&name)).unwrap();
            moved.push(name);
        }
    }
    assert!(!moved.is_empty(), "no pack folder in {}", packs.display());
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let r = m.dir.path().join("r");
    let o = m.run(&["ws", "resume", "half", r.to_str().unwrap()]);
    assert!(!o.status.success(), "resumed without its packs");
    assert!(!r.exists(), "a failed resume left the directory it made");
    std::fs::create_dir(&r).unwrap();
    let o = m.run(&["ws", "resume", "half", r.to_str().unwrap()]);
    assert!(!o.status.success(), "resumed without its packs");
    assert!(std::fs::read_dir(&r).unwrap().next().is_none(), "a failed resume left files");
    // A `ws create --dir` that fails the same way takes its new
    // workspace back: the same command works once the cause is fixed.
    let c = m.dir.path().join("c");
    let args = ["ws", "create", "half2", "--from", "ws/half", "--dir", c.to_str().unwrap()];
    assert!(!m.run(&args).status.success(), "created without its packs");
    assert!(!c.exists());
    assert!(!m.ok(&["ws", "list"]).contains("half2"), "the failed create left its workspace");
    for name in moved {
        std::fs::rename(away.join(&name), packs.join(&name)).unwrap();
    }
    m.ok(&args);
    m.ok(&["ws", "release", "--dir", c.to_str().unwrap()]);
    m.ok(&["ws", "resume", "half", r.to_str().unwrap()]);
    assert_eq!(std::fs::read(r.join("new.txt")).unwrap(), b"new\n");
}

/// A resume into DIR killed before it finished leaves the lease held for
/// DIR on this machine (the lease is taken beside the checkout) and no
/// working copy there: a resume into the same, empty DIR takes it over at
/// once (it waited 15 minutes, then needed --steal). A resume into any
/// other directory is still refused.
#[test]
fn a_lease_left_by_a_killed_resume_into_the_same_directory_is_taken_over() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "ab", "--dir", w.to_str().unwrap()]);
    m.ok(&["ws", "release", "--dir", w.to_str().unwrap()]);
    // The lease as a resume into `r` takes it, its process then killed.
    let r = m.dir.path().join("r");
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let user = std::env::var("USER").unwrap_or_else(|_| "mado".into());
    let holder = format!("{user}@{host}:{}:{:08x}", r.display(), 0x5eed_1234u32);
    let expires = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 + 900;
    let lease = mado_core::object::Lease { holder, expires };
    std::fs::write(m.store_dir().join("leases/ws/ab"), lease.encode()).unwrap();
    std::fs::create_dir(&r).unwrap();
    let other = m.dir.path().join("other");
    let err = m.fails(&["ws", "resume", "ab", other.to_str().unwrap()], 1);
    assert!(err.contains("leased by"), "{err}");
    m.ok(&["ws", "resume", "ab", r.to_str().unwrap()]);
    std::fs::write(r.join("after.txt"), "x\n").unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", r.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false, "{cp}");
}

/// Workspace `ab` created (in `w`, its lease then released) and resumed
/// into `r` by a process killed after its files and before its state (the
/// failpoint `resume-before-state`, an abort as kill -9 would).
fn resume_killed_partway() -> (Mado, std::path::PathBuf) {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "ab", "--dir", w.to_str().unwrap()]);
    m.ok(&["ws", "release", "--dir", w.to_str().unwrap()]);
    let r = m.dir.path().join("r");
    let o = m
        .cmd(&["ws", "resume", "ab", r.to_str().unwrap()])
        .env("MADO_FAILPOINT", "resume-before-state")
        .output()
        .unwrap();
    assert!(!o.status.success(), "the failpoint did not stop the resume");
    (m, r)
}

/// A resume killed after writing files but before its state was saved
/// (Ctrl-C or kill -9 partway) left a partial copy that every later resume
/// into the same directory refused as "not empty". Its marker now shows
/// the files are its own: the next resume removes them and starts over.
#[test]
fn a_resume_killed_partway_is_cleaned_up_by_the_next_resume_into_its_directory() {
    let (m, r) = resume_killed_partway();
    assert!(r.join("src/lib.rs").is_file(), "the killed resume wrote no files");
    assert!(!r.join(".mado/workspace.json").exists());
    // Files someone put there since (the tree has no such path) are not
    // the resume's: they stop it, and stay.
    std::fs::write(r.join("src/notes.txt"), "mine\n").unwrap();
    let err = m.fails(&["ws", "resume", "ab", r.to_str().unwrap()], 1);
    assert!(err.contains("src/notes.txt") && err.contains("interrupted resume"), "{err}");
    assert_eq!(std::fs::read(r.join("src/notes.txt")).unwrap(), b"mine\n");
    assert!(r.join("src/lib.rs").is_file(), "the refused resume removed files");
    std::fs::remove_file(r.join("src/notes.txt")).unwrap();
    let o = m.run(&["ws", "resume", "ab", r.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("removed the partial copy"), "{err}");
    assert!(!r.join(".mado/resuming").exists());
    let mut copy = snapshot_dir(&r);
    copy.retain(|k, _| !k.starts_with(b".mado"));
    let plain = m.dir.path().join("plain");
    m.ok(&["checkout", "main", plain.to_str().unwrap()]);
    assert!(copy == snapshot_dir(&plain), "the resumed copy differs from a checkout of the same tree");
    // A finished working copy with a file of the user's is never emptied.
    std::fs::write(r.join("mine.txt"), "keep\n").unwrap();
    m.ok(&["ws", "release", "--dir", r.to_str().unwrap()]);
    let err = m.fails(&["ws", "resume", "ab", r.to_str().unwrap()], 1);
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(std::fs::read_to_string(r.join("mine.txt")).unwrap(), "keep\n");
    // Nor a directory whose marker has no state folder of its own: a
    // `.mado` symlink to another killed resume's folder.
    let s = m.dir.path().join("s");
    std::fs::create_dir_all(&s).unwrap();
    std::fs::write(s.join("theirs.txt"), "keep\n").unwrap();
    std::fs::create_dir_all(m.dir.path().join("elsewhere")).unwrap();
    std::fs::write(m.dir.path().join("elsewhere/resuming"), "ab\n").unwrap();
    std::os::unix::fs::symlink(m.dir.path().join("elsewhere"), s.join(".mado")).unwrap();
    let err = m.fails(&["ws", "resume", "ab", s.to_str().unwrap()], 1);
    assert!(err.contains("not empty"), "{err}");
    assert!(s.join("theirs.txt").is_file());
}

/// A large file a workspace added beside a few small ones: later
/// checkpoints of small edits anywhere send the edits, not the file. A
/// new layer folded in the packs of the layers it absorbed, small or not,
/// so every other checkpoint of a 2-byte edit uploaded the file again.
#[test]
fn small_checkpoints_after_a_large_addition_do_not_send_it_again() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "big", "--dir", w.to_str().unwrap()]);
    std::fs::create_dir_all(w.join("data")).unwrap();
    // A whole blob (under the chunking threshold) and a chunked file.
    std::fs::write(w.join("data/whole.bin"), pseudo_random(3 << 20, 11)).unwrap();
    std::fs::write(w.join("data/chunked.bin"), pseudo_random(6 << 20, 12)).unwrap();
    for i in 0..10 {
        std::fs::write(w.join(format!("data/m-{i}.txt")), format!("{i}\n")).unwrap();
    }
    let first = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert!(first["remote"]["bytes_up"].as_u64().unwrap() > 9 << 20, "{first}");
    for k in 0..8 {
        std::fs::write(w.join(format!("t{k}")), format!("{k}\n")).unwrap();
        let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
        let up = cp["remote"]["bytes_up"].as_u64().unwrap();
        assert!(up < 64 << 10, "checkpoint {k} of a 2-byte file sent {up} bytes: {cp}");
    }
    // Many small files (a pack under 1 MiB, which layers may fold): sent
    // again now and then as the chain compacts, not every other time.
    for i in 0..300 {
        std::fs::write(w.join(format!("data/s-{i}.txt")), pseudo_random(3000, 100 + i)).unwrap();
    }
    m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    let mut sent = 0;
    for k in 0..16 {
        std::fs::write(w.join(format!("u{k}")), format!("{k}\n")).unwrap();
        let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
        sent += cp["remote"]["bytes_up"].as_u64().unwrap();
    }
    // 900 KB of small files: every other checkpoint sending them was 7 MB.
    assert!(sent < 2 << 20, "16 checkpoints of 2-byte files sent {sent} bytes");
    // And it all comes back.
    let r = m.dir.path().join("r");
    empty_cache(&m);
    m.ok(&["ws", "release", "--dir", w.to_str().unwrap()]);
    m.ok(&["ws", "resume", "big", r.to_str().unwrap()]);
    let mut a = snapshot_dir(&w);
    let mut b = snapshot_dir(&r);
    a.retain(|k, _| !k.starts_with(b".mado"));
    b.retain(|k, _| !k.starts_with(b".mado"));
    assert!(a == b, "the resumed copy differs");
}

/// A resume killed partway holds the workspace's lease (for 15 minutes):
/// a resume elsewhere is refused naming the interrupted resume and both
/// ways out, and `ws release --dir` of its directory frees the lease (it
/// said "not inside a plain working copy; pass --dir", with --dir given),
/// unless it names another workspace. A `ws create` killed partway and run again says to resume instead.
#[test]
fn an_interrupted_resume_is_named_and_its_lease_released() {
    let (m, r) = resume_killed_partway();
    let other = m.dir.path().join("other");
    let err = m.fails(&["ws", "resume", "ab", other.to_str().unwrap()], 1);
    assert!(err.contains("interrupted") && err.contains("ws release --dir"), "{err}");
    // Another workspace's name is refused, and nothing is released.
    let err = m.fails(&["ws", "release", "zz", "--dir", r.to_str().unwrap()], 1);
    assert!(err.contains("resume of workspace ab, not zz"), "{err}");
    m.fails(&["ws", "resume", "ab", other.to_str().unwrap()], 1);
    let out = m.ok(&["ws", "release", "ab", "--dir", r.to_str().unwrap()]);
    assert!(out.contains("released"), "{out}");
    m.ok(&["ws", "resume", "ab", other.to_str().unwrap()]);

    let c = m.dir.path().join("c");
    let o = m
        .cmd(&["ws", "create", "cd", "--dir", c.to_str().unwrap()])
        .env("MADO_FAILPOINT", "resume-before-state")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = m.fails(&["ws", "create", "cd", "--dir", c.to_str().unwrap()], 1);
    assert!(err.contains(&format!("mado ws resume cd {}", c.display())), "{err}");
    m.ok(&["ws", "resume", "cd", c.to_str().unwrap()]);
    assert!(c.join(".mado/workspace.json").is_file());
}

/// A working copy whose workspace was removed (`ws rm --force`) cannot
/// checkpoint: the error says so and how to go on, and that way works.
#[test]
fn a_copy_of_a_removed_workspace_is_told_how_to_checkpoint_again() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "gone", "--dir", w.to_str().unwrap()]);
    m.ok(&["ws", "rm", "--force", "gone"]);
    std::fs::write(w.join("kept.txt"), "keep\n").unwrap();
    let err = m.fails(&["ws", "checkpoint", "--dir", w.to_str().unwrap()], 1);
    assert!(err.contains("no longer in the store"), "{err}");
    // The refused checkpoint holds no lease: another workspace of that
    // name is not locked out by a copy of the removed one.
    for l in files_under(&m.store_dir().join("leases")) {
        let lease = mado_core::object::Lease::decode(&std::fs::read(&l).unwrap()).unwrap();
        assert_eq!(lease.holder, "", "{}: {lease:?}", l.display());
    }
    let hint = err.lines().find_map(|l| l.split('`').nth(1).filter(|c| c.starts_with("mado ws create"))).unwrap();
    // Under --json the hint is a field of its own.
    let o = m.run(&["ws", "checkpoint", "--dir", w.to_str().unwrap(), "--json"]);
    let e: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    assert!(!e["error"].as_str().unwrap().contains("hint"), "{e}");
    assert!(e["hints"][0].as_str().unwrap().contains(hint), "{e}");
    let args: Vec<&str> = hint.split_whitespace().skip(1).collect();
    m.ok(&args);
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false, "{cp}");
    let r = m.dir.path().join("r");
    m.ok(&["ws", "release", "--dir", w.to_str().unwrap()]);
    m.ok(&["ws", "resume", "gone", r.to_str().unwrap()]);
    assert_eq!(std::fs::read(r.join("kept.txt")).unwrap(), b"keep\n");

    // Removed again, and gc sweeps the copy's last checkpoint: the hint
    // no longer names it (that command would fail), and what it says
    // instead works.
    m.ok(&["ws", "release", "--dir", r.to_str().unwrap()]);
    m.ok(&["ws", "rm", "--force", "gone"]);
    m.ok(&["gc", "--grace", "0"]);
    std::fs::write(r.join("later.txt"), "later\n").unwrap();
    let err = m.fails(&["ws", "checkpoint", "--dir", r.to_str().unwrap()], 1);
    assert!(err.contains("gone from the store too"), "{err}");
    let cmds: Vec<&str> = err
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|c| c.starts_with("mado ws create") || c.starts_with("mado ws checkpoint"))
        .collect();
    assert_eq!(cmds.len(), 2, "{err}");
    m.ok(&cmds[0].split_whitespace().skip(1).collect::<Vec<_>>());
    let mut force: Vec<&str> = cmds[1].split_whitespace().skip(1).collect();
    force.extend(["--dir", r.to_str().unwrap()]);
    m.ok(&force);
    m.ok(&["ws", "release", "--dir", r.to_str().unwrap()]);
    let r2 = m.dir.path().join("r2");
    m.ok(&["ws", "resume", "gone", r2.to_str().unwrap()]);
    assert_eq!(std::fs::read(r2.join("kept.txt")).unwrap(), b"keep\n");
    assert_eq!(std::fs::read(r2.join("later.txt")).unwrap(), b"later\n");
}

/// `checkout` of a workspace's snapshot shows the mtimes its checkpoint
/// recorded, as `ws resume` does (README: a path shows the mtime its
/// snapshot recorded); a subtree checkout too. They showed the time the
/// checkout wrote them.
#[test]
fn a_checkout_of_a_workspace_snapshot_restores_its_mtimes() {
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "times", "--dir", w.to_str().unwrap()]);
    set_mtime(&w.join("src/lib.rs"), 1_000_000_000);
    set_mtime(&w.join("README.md"), 1_100_000_000);
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    let mtime = |p: &Path| std::fs::symlink_metadata(p).unwrap().modified().unwrap();
    let out = m.dir.path().join("out");
    m.ok(&["checkout", "ws/times", out.to_str().unwrap()]);
    assert_eq!(mtime(&out.join("src/lib.rs")), mtime(&w.join("src/lib.rs")));
    assert_eq!(mtime(&out.join("README.md")), mtime(&w.join("README.md")));
    let sub = m.dir.path().join("sub");
    m.ok(&["checkout", "ws/times", sub.to_str().unwrap(), "src"]);
    assert_eq!(mtime(&sub.join("src/lib.rs")), mtime(&w.join("src/lib.rs")));
    assert!(!sub.join("README.md").exists());
    // An imported snapshot records none: files keep the time they were written.
    let fresh = m.dir.path().join("fresh");
    m.ok(&["checkout", "main", fresh.to_str().unwrap()]);
    let age = SystemTime::now().duration_since(mtime(&fresh.join("src/lib.rs"))).unwrap_or_default();
    assert!(age < Duration::from_secs(600), "{age:?}");
}

/// A workspace made from a snapshot imported `--no-packs` (no pack index
/// to build on): its first checkpoint packs and indexes the tree and puts
/// new content up once, and says what went up. It put every new object up
/// twice (alone and in a pack) and reported half (found by a review).
#[test]
fn a_checkpoint_over_an_unpacked_base_puts_new_content_up_once() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "np", "--dir", w.to_str().unwrap()]);
    let data = pseudo_random(3 << 20, 21);
    std::fs::write(w.join("big.bin"), &data).unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    let (up, said) = (cp["remote"]["bytes_up"].as_u64().unwrap(), cp["upload"]["bytes_uploaded"].as_u64().unwrap());
    assert!(up < (3 << 20) + (256 << 10), "3 MiB of new content, {up} bytes up: {cp}");
    assert!(said <= up && said * 10 >= up * 9, "the report says {said} of {up} bytes: {cp}");
    // The next checkpoint builds on the index the first one made.
    std::fs::write(w.join("README.md"), "changed\n").unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert!(cp["remote"]["bytes_up"].as_u64().unwrap() < 16 << 10, "{cp}");
    m.ok(&["ws", "release", "--dir", w.to_str().unwrap()]);
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let r = m.dir.path().join("r");
    m.ok(&["ws", "resume", "np", r.to_str().unwrap()]);
    assert_eq!(std::fs::read(r.join("big.bin")).unwrap(), data);
    assert_eq!(std::fs::read(r.join("README.md")).unwrap(), b"changed\n");
}

/// A damaged lease (one flipped bit, or garbage) is never read as free nor
/// as another holder's: a resume is refused naming it, and `--steal`
/// replaces it (issue #44).
#[test]
fn a_damaged_lease_is_refused_naming_it_and_steal_replaces_it() {
    let m = Mado::local();
    setup(&m);
    let a = m.dir.path().join("a");
    m.ok(&["ws", "create", "dmg", "--from", "main", "--dir", a.to_str().unwrap()]);
    let lease = m.store_dir().join("leases/ws/dmg");
    let mut b = std::fs::read(&lease).unwrap();
    b[6] ^= 0x20;
    std::fs::write(&lease, &b).unwrap();
    let to = m.dir.path().join("b");
    let err = m.fails(&["ws", "resume", "dmg", to.to_str().unwrap()], 1);
    assert!(err.contains("does not decode") && err.contains("--steal"), "{err}");
    std::fs::write(&lease, b"garbage").unwrap();
    let err = m.fails(&["ws", "checkpoint", "--dir", a.to_str().unwrap()], 1);
    assert!(err.contains("does not decode"), "{err}");
    m.ok(&["ws", "resume", "dmg", to.to_str().unwrap(), "--steal"]);
    assert!(to.join("README.md").exists());
}
