//! Workspaces as read-write FUSE mounts, through the `mado` binary: the
//! edits of the issue (and more) through the mount, a checkpoint that
//! shares every tree with a plain directory making the same edits, a resume
//! elsewhere that is byte-, mode- and mtime-identical to the mount, a
//! checkpoint cost that follows the changes, and changes that survive an
//! unmount and a killed daemon.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// A workspace mount, always unmounted at the end.
struct WsMount<'a> {
    m: &'a Mado,
    dir: PathBuf,
}

impl Drop for WsMount<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fusermount3").arg("-uz").arg(&self.dir).output();
    }
}

impl WsMount<'_> {
    fn path(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    fn checkpoint(&self, msg: &str) -> serde_json::Value {
        self.m.json(&["ws", "checkpoint", "--dir", self.path(), "-m", msg])
    }

    fn umount(&self) {
        self.m.ok(&["umount", self.path()]);
    }

    /// `kill -9` of its daemon and its keeper (a whole crash), returning
    /// once the process is gone.
    fn kill_daemon(&self) {
        let pid = self.m.json(&["stats", self.path()])["pid"].as_u64().expect("the daemon reports its pid");
        kill_keeper_of(pid);
        std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
        wait_gone(pid);
    }
}

/// `ws create --mount` into a directory that does not exist yet: it is
/// made, as `checkout` makes its target.
fn create<'a>(m: &'a Mado, name: &str) -> WsMount<'a> {
    let dir = m.dir.path().join(format!("mnt-{name}"));
    assert!(!dir.exists());
    let out = m.ok(&["ws", "create", name, "--from", "main", "--mount", dir.to_str().unwrap()]);
    assert!(out.contains("read-write"), "{out}");
    WsMount { m, dir }
}

/// More than `edit`: mkdir and rmdir, a renamed directory, a truncate, a
/// rename over a file.
fn more_edits(dir: &Path) {
    std::fs::create_dir_all(dir.join("newdir/inner")).unwrap();
    std::fs::write(dir.join("newdir/inner/f.txt"), "f\n").unwrap();
    std::fs::create_dir(dir.join("gone")).unwrap();
    std::fs::remove_dir(dir.join("gone")).unwrap();
    std::fs::rename(dir.join("src/deep"), dir.join("deep2")).unwrap();
    std::fs::OpenOptions::new().write(true).open(dir.join("run.sh")).unwrap().set_len(5).unwrap();
    std::fs::write(dir.join("tmp.txt"), "replaced\n").unwrap();
    std::fs::rename(dir.join("tmp.txt"), dir.join("empty2")).unwrap();
    std::fs::write(dir.join("empty2"), "replaced again\n").unwrap();
}

#[test]
fn a_mounted_workspace_checkpoints_what_a_plain_directory_would_and_resumes_identically_minio() {
    let Some(base) = s3_base() else { return };
    if !fuse_usable() {
        return;
    }
    let m = Mado::s3(&base);
    setup(&m);
    let mnt = create(&m, "mounted");
    let plain = m.dir.path().join("plain");
    m.ok(&["ws", "create", "plain", "--dir", plain.to_str().unwrap()]);
    // Lazy: the mount is up before any file's content was read.
    for d in [&mnt.dir, &plain] {
        edit(d);
        more_edits(d);
    }
    let p = m.json(&["ws", "checkpoint", "--dir", plain.to_str().unwrap()]);
    // Packs-first: the new content in one pack on top of the base's, plus
    // the stat object alone; no tree or file stored alone.
    assert_eq!(p["packs_uploaded"], 1, "{p}");
    assert_eq!(
        (p["upload"]["trees_uploaded"].as_u64(), p["upload"]["objects_uploaded"].as_u64()),
        (Some(0), Some(1)),
        "{p}"
    );
    let cp = mnt.checkpoint("through the mount");
    assert_eq!(cp["unchanged"], false, "{cp}");
    // Same content, so the tree is indexed already: only the stat object
    // (the mount's own mtimes) is new. (A delta pack may go up while the
    // index is asked about, not waiting on it; the index waits, and is not
    // written again.)
    assert_eq!(cp["upload"]["trees_uploaded"], 0, "{cp}");
    assert!(cp["upload"]["objects_uploaded"].as_u64().unwrap() <= 1, "{cp}");
    assert_eq!(cp["index_bytes"], 0, "{cp}");

    // Elsewhere, from an empty cache: identical to the mount, mtimes too.
    let other_cache = m.dir.path().join("other-cache");
    let w2 = m.dir.path().join("w2");
    // The mount holds the lease: a copy elsewhere is read-only.
    let o = m
        .cmd(&["ws", "resume", "mounted", w2.to_str().unwrap(), "--read-only"])
        .env("MADO_CACHE_DIR", &other_cache)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_state(&mnt.dir, &w2);

    // The cost follows the changes: nothing changed, nothing read.
    let again = mnt.checkpoint("again");
    assert_eq!(again["unchanged"], true, "{again}");
    assert_eq!(again["files_read"], 0, "{again}");
    assert_eq!(again["trees_built"], 0, "{again}");
    // One file deep down: one file hashed, its three directories re-encoded.
    std::fs::write(mnt.dir.join("deep2/er/still.txt"), "changed\n").unwrap();
    let one = mnt.checkpoint("one file");
    assert_eq!((one["files_read"].as_u64(), one["trees_built"].as_u64()), (Some(1), Some(3)), "{one}");
    assert!(one["upload"]["objects_uploaded"].as_u64().unwrap() <= 1, "only the stat object alone: {one}");
    assert_eq!(one["packs_uploaded"], 1, "the one file in one new pack: {one}");
}

#[test]
fn uncheckpointed_changes_survive_an_unmount_and_a_killed_daemon() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "keep");
    std::fs::write(mnt.dir.join("a.txt"), "a\n").unwrap();
    std::fs::rename(mnt.dir.join("src"), mnt.dir.join("src2")).unwrap();
    // A directory renamed before anything looked into it (its mtimes
    // come from the base under its old path), holding a gitlink.
    std::fs::rename(mnt.dir.join("vendor"), mnt.dir.join("vendor2")).unwrap();
    mnt.umount();
    m.ok(&["ws", "resume", "keep", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read(mnt.dir.join("a.txt")).unwrap(), b"a\n");
    assert!(mnt.dir.join("src2/lib.rs").is_file() && !mnt.dir.join("src").exists());

    // Killed: the state saved after the last change is picked up.
    std::fs::write(mnt.dir.join("b.txt"), "b\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    mnt.kill_daemon();
    m.ok(&["ws", "resume", "keep", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read(mnt.dir.join("b.txt")).unwrap(), b"b\n");

    // What a mount refuses: a hard link to a directory, non-empty rmdir,
    // a directory into itself.
    let d = &mnt.dir;
    assert_eq!(errno_of(std::fs::hard_link(d.join("src2"), d.join("h"))), Some(1), "EPERM");
    assert_eq!(errno_of(std::fs::remove_dir(d.join("src2"))), Some(39), "ENOTEMPTY");
    assert_eq!(errno_of(std::fs::rename(d.join("src2"), d.join("src2/in"))), Some(22), "EINVAL");

    // While the mount holds the lease, a resume elsewhere is refused,
    // naming the holder, and leaves nothing behind; a --read-only copy can
    // be made, but never checkpoints.
    let other = m.dir.path().join("other");
    let err = m.fails(&["ws", "resume", "keep", other.to_str().unwrap()], 1);
    assert!(err.contains("leased by") && err.contains("mnt-keep"), "{err}");
    assert!(!other.exists() || std::fs::read_dir(&other).unwrap().next().is_none(), "a refused resume left files");
    let r = m.json(&["ws", "resume", "keep", other.to_str().unwrap(), "--read-only"]);
    assert_eq!(r["read_only"], true, "{r}");
    std::fs::write(other.join("c.txt"), "c\n").unwrap();
    let err = m.fails(&["ws", "checkpoint", "--dir", other.to_str().unwrap()], 1);
    assert!(err.contains("read-only"), "{err}");

    // Another workspace's name is refused before anything is uploaded.
    let err = m.fails(&["ws", "checkpoint", "nope", "--dir", mnt.path()], 1);
    assert!(err.contains("is a mount of workspace keep, not nope"), "{err}");
    let cp = mnt.checkpoint("kept");
    assert_eq!(cp["unchanged"], false, "{cp}");
    assert!(m.ok(&["ls", "ws/keep", "vendor2"]).contains("gitlink"), "the gitlink is kept");
    let w = m.dir.path().join("w");
    let o = m
        .cmd(&["ws", "resume", "keep", w.to_str().unwrap(), "--read-only"])
        .env("MADO_CACHE_DIR", m.dir.path().join("c2"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_state(&mnt.dir, &w);
    // A clean unmount releases the lease: a resume elsewhere takes it at
    // once, with no --steal, and can checkpoint.
    mnt.umount();
    let w3 = m.dir.path().join("w3");
    m.ok(&["ws", "resume", "keep", w3.to_str().unwrap()]);
    std::fs::write(w3.join("after-umount.txt"), "x\n").unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", w3.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false, "{cp}");
}

/// Work a mount saved and never checkpointed is never dropped in silence:
/// a resume into a directory refuses (it would not have that work) unless
/// told to go on; a mount refused for the lease leaves the work where it
/// is (it used to set it aside, and say nothing); a mount of a workspace
/// that moved on sets it aside with a warning naming `ws recover`, which
/// makes it a workspace whose mount shows it.
#[test]
fn uncheckpointed_work_of_a_mount_is_named_set_aside_and_recovered() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let base = m.json(&["log", "main"])[0]["snapshot"].as_str().unwrap().to_string();
    let mnt = create(&m, "left");
    std::fs::write(mnt.dir.join("unsaved.txt"), "only in the mount\n").unwrap();
    mnt.umount();

    let w = m.dir.path().join("w");
    let err = m.fails(&["ws", "resume", "left", w.to_str().unwrap()], 1);
    assert!(err.contains("no checkpoint holds") && err.contains("--ignore-mount-changes"), "{err}");
    assert!(!w.exists() || std::fs::read_dir(&w).unwrap().next().is_none(), "a refused resume wrote files");
    let o = m.cmd(&["ws", "resume", "left", w.to_str().unwrap(), "--ignore-mount-changes"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("are not in"), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::write(w.join("elsewhere.txt"), "checkpointed from a directory\n").unwrap();
    let cp = m.json(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    assert_eq!(cp["unchanged"], false, "{cp}");

    // Refused for the lease (the directory holds it): nothing set aside.
    let err = m.fails(&["ws", "resume", "left", mnt.path(), "--mount"], 1);
    assert!(err.contains("leased by"), "{err}");
    assert_eq!(m.json(&["ws", "recover"]), serde_json::json!([]));

    m.ok(&["ws", "release", "--dir", w.to_str().unwrap()]);
    let o = m.cmd(&["ws", "resume", "left", mnt.path(), "--mount"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(err.contains("set aside") && err.contains("mado ws recover"), "{err}");
    assert!(mnt.dir.join("elsewhere.txt").is_file() && !mnt.dir.join("unsaved.txt").exists());
    mnt.umount();

    let aside = m.json(&["ws", "recover"]);
    let aside = aside.as_array().unwrap();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(aside[0]["workspace"], "left");
    assert_eq!(aside[0]["checkpoint"], base.as_str());
    let dir = aside[0]["dir"].as_str().unwrap();
    let err = m.fails(&["ws", "recover", dir, "--as", "left"], 1);
    assert!(err.contains("choose another name with --as"), "{err}");
    let r = m.json(&["ws", "recover", dir, "--as", "back"]);
    assert_eq!(r["workspace"], "back", "{r}");
    assert_eq!(m.json(&["ws", "recover"]), serde_json::json!([]));
    let back = WsMount { m: &m, dir: m.dir.path().join("mnt-back") };
    m.ok(&["ws", "resume", "back", back.path(), "--mount"]);
    assert_eq!(std::fs::read(back.dir.join("unsaved.txt")).unwrap(), b"only in the mount\n");
    assert!(!back.dir.join("elsewhere.txt").exists());
    back.checkpoint("recovered");
    back.umount();
    assert_eq!(m.ok(&["cat", "ws/back", "unsaved.txt"]), "only in the mount\n");
    // Checkpointed, then unmounted: nothing left to warn of.
    let w2 = m.dir.path().join("w2");
    m.ok(&["ws", "resume", "back", w2.to_str().unwrap()]);
    // ... nor once the workspace moved on from there: a mount whose every
    // change a checkpoint holds is not set aside (it was, and `ws recover`
    // listed a folder that held nothing to recover).
    std::fs::write(w2.join("later.txt"), "moved on\n").unwrap();
    m.ok(&["ws", "checkpoint", "--dir", w2.to_str().unwrap()]);
    m.ok(&["ws", "release", "--dir", w2.to_str().unwrap()]);
    let o = m.cmd(&["ws", "resume", "back", back.path(), "--mount"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success() && !err.contains("set aside"), "{err}");
    assert_eq!(std::fs::read(back.dir.join("later.txt")).unwrap(), b"moved on\n");
    back.umount();
    assert_eq!(m.json(&["ws", "recover"]), serde_json::json!([]));
    // The same name twice, or a folder that holds nothing, is refused.
    let err = m.fails(&["ws", "recover", dir, "--as", "again"], 1);
    assert!(err.contains("no set-aside changes"), "{err}");
}

/// One mount of a workspace per machine: a second one (which would share
/// the first's saved state and lease holder, each overwriting the other's
/// changes) is refused naming the first, until the first is unmounted or
/// its daemon dies. `ws recover` never takes a live state folder; `ws rm`
/// sets uncheckpointed work aside (so a new workspace of the same name
/// does not start from it); and work whose checkpoint gc deleted is
/// refused by `ws recover`, not made into a workspace the store cannot
/// serve.
#[test]
fn a_workspace_is_mounted_once_per_machine_and_rm_sets_its_work_aside() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let a = create(&m, "once");
    std::fs::write(a.dir.join("from-a.txt"), "a\n").unwrap();
    let b = WsMount { m: &m, dir: m.dir.path().join("mnt-b") };
    let err = m.fails(&["ws", "resume", "once", b.path(), "--mount"], 1);
    assert!(err.contains("already mounted on this machine") && err.contains("mnt-once"), "{err}");
    // The live state folder is not a set-aside one.
    let states = m.home().join(".local/share/mado/workspaces");
    let live = std::fs::read_dir(&states)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .expect("the mount's state folder");
    let err = m.fails(&["ws", "recover", live.to_str().unwrap(), "--as", "stolen"], 1);
    assert!(err.contains("not a folder of set-aside changes"), "{err}");
    // Its daemon killed, the lock goes with it: a remount here works and
    // has what was saved.
    std::thread::sleep(Duration::from_millis(1500));
    a.kill_daemon();
    m.ok(&["umount", a.path()]);
    // Its lease, still held in the store, is not what a plain resume here
    // is refused for: the dead mount's saved work is.
    let plain = m.dir.path().join("plain");
    let err = m.fails(&["ws", "resume", "once", plain.to_str().unwrap()], 1);
    assert!(err.contains("its daemon died") && !err.contains("leased by"), "{err}");
    m.ok(&["ws", "resume", "once", b.path(), "--mount"]);
    assert_eq!(std::fs::read(b.dir.join("from-a.txt")).unwrap(), b"a\n");
    // A checkpoint only this workspace reaches, then work on top of it.
    b.checkpoint("a's work");
    std::fs::write(b.dir.join("from-b.txt"), "b\n").unwrap();
    b.umount();

    let o = m.cmd(&["ws", "rm", "once"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(err.contains("set aside") && err.contains("ws recover"), "{err}");
    let aside = m.json(&["ws", "recover"]);
    assert_eq!(aside.as_array().unwrap().len(), 1, "{aside}");
    // A new workspace of the same name starts clean.
    let c = WsMount { m: &m, dir: m.dir.path().join("mnt-c") };
    m.ok(&["ws", "create", "once", "--from", "main", "--mount", c.path()]);
    assert!(!c.dir.join("from-b.txt").exists(), "a new workspace started from the removed one's work");
    c.umount();
    m.ok(&["ws", "rm", "once"]);
    assert_eq!(m.json(&["ws", "recover"]).as_array().unwrap().len(), 1, "a clean state is not set aside");
    // A gc on another machine (which knows nothing of the work set aside
    // here) deletes the checkpoint the work was made on: recover refuses.
    let elsewhere = m.dir.path().join("other-machine-workspaces");
    let o = m.cmd(&["gc", "--grace", "0"]).env("MADO_WORKSPACES_DIR", &elsewhere).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = aside[0]["dir"].as_str().unwrap();
    let err = m.fails(&["ws", "recover", dir, "--as", "late"], 1);
    assert!(err.contains("no longer in the store") && err.contains("--to DIR"), "{err}");
    assert!(Path::new(dir).join("overlay.state").is_file(), "the refused recover kept the work");
    assert!(m.json(&["ws", "list"]).as_array().unwrap().is_empty());
    // The files themselves still come out, without the store.
    let saved = m.dir.path().join("saved");
    let x = m.json(&["ws", "recover", dir, "--to", saved.to_str().unwrap()]);
    assert_eq!(x["workspace"], "once", "{x}");
    assert_eq!(std::fs::read(saved.join("from-b.txt")).unwrap(), b"b\n");
    let err = m.fails(&["ws", "recover", dir, "--to", saved.to_str().unwrap()], 1);
    assert!(err.contains("not empty"), "{err}");
}

/// A workspace removed on another machine while this one kept changes of
/// a mount of it that no checkpoint holds: mounting it again fails (there
/// is no workspace) and sets the changes aside, so `ws recover` lists them
/// (nothing did), and `--to` gets the files out once gc has deleted their
/// checkpoint.
#[test]
fn changes_of_a_workspace_removed_elsewhere_are_set_aside_and_can_be_written_out() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let a = create(&m, "gone");
    std::fs::create_dir(a.dir.join("new-dir")).unwrap();
    std::fs::write(a.dir.join("new-dir/unsaved.txt"), "never checkpointed\n").unwrap();
    std::os::unix::fs::symlink("new-dir/unsaved.txt", a.dir.join("to-unsaved")).unwrap();
    a.umount();
    let elsewhere = m.dir.path().join("other-machine-workspaces");
    for cmd in [&["ws", "rm", "gone"][..], &["gc", "--grace", "0"]] {
        let o = m.cmd(cmd).env("MADO_WORKSPACES_DIR", &elsewhere).output().unwrap();
        assert!(o.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(m.json(&["ws", "recover"]), serde_json::json!([]));
    let err = m.fails(&["ws", "resume", "gone", a.path(), "--mount"], 1);
    assert!(err.contains("no workspace named gone") && err.contains("set aside"), "{err}");
    let aside = m.json(&["ws", "recover"]);
    let dir = aside[0]["dir"].as_str().unwrap_or_else(|| panic!("listed: {aside}"));
    let out = m.dir.path().join("out");
    let x = m.json(&["ws", "recover", dir, "--to", out.to_str().unwrap()]);
    assert_eq!((x["files"].as_u64(), x["symlinks"].as_u64(), x["dirs"].as_u64()), (Some(1), Some(1), Some(1)), "{x}");
    assert_eq!(std::fs::read(out.join("new-dir/unsaved.txt")).unwrap(), b"never checkpointed\n");
    assert_eq!(std::fs::read_link(out.join("to-unsaved")).unwrap(), Path::new("new-dir/unsaved.txt"));
    // Nothing else: the snapshot's unchanged files are not written out.
    let mut names: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["new-dir", "to-unsaved"]);
    // A new workspace of the name starts clean.
    m.ok(&["ws", "create", "gone", "--from", "main", "--mount", a.path()]);
    assert!(!a.dir.join("new-dir").exists());
    // `ws release` inside a mount says how a mount gives its lease back.
    let o = m.cmd(&["ws", "release"]).current_dir(&a.dir).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("mado umount {}", a.path())), "{err}");
    // A read-only copy beside the live mount (which changed nothing) is
    // not told of changes that are not known to exist.
    let ro = m.dir.path().join("ro");
    let o = m.run(&["ws", "resume", "gone", ro.to_str().unwrap(), "--read-only"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("is mounted on this machine") && !err.contains("has changes"), "{err}");
}

/// A file deleted in a workspace mount gives its disk space back once no
/// process has it open (it stayed in the mount's upper folder for as long
/// as the mount lived, and after: an agent's `rm -rf target` freed
/// nothing); one still open stays readable until closed.
#[test]
fn deleted_files_in_a_mount_give_their_space_back() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let a = create(&m, "space");
    let upper_bytes = || -> u64 {
        let states = m.home().join(".local/share/mado/workspaces");
        files_under(&states)
            .iter()
            .filter(|p| p.parent().is_some_and(|d| d.ends_with("upper")))
            .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum()
    };
    let big = vec![7u8; 4 << 20];
    std::fs::write(a.dir.join("big.bin"), &big).unwrap();
    assert!(upper_bytes() >= 4 << 20);
    std::fs::remove_file(a.dir.join("big.bin")).unwrap();
    eventually("the deleted file's space is given back", || upper_bytes() < 1 << 20);
    // Open while deleted: readable to its end, then freed.
    std::fs::write(a.dir.join("held.bin"), &big).unwrap();
    let mut held = std::fs::File::open(a.dir.join("held.bin")).unwrap();
    std::fs::remove_file(a.dir.join("held.bin")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut back = Vec::new();
    std::io::Read::read_to_end(&mut held, &mut back).unwrap();
    assert!(back == big, "an open deleted file lost its bytes");
    drop(held);
    eventually("the closed file's space is given back", || upper_bytes() < 1 << 20);
}

/// A full disk under the mount's state folder is ENOSPC to the writer
/// (it was EIO), and deleting files there frees it again.
#[test]
fn a_full_state_disk_is_enospc_to_writers() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let small = m.dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&small)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (not root?)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _small = Unmount(small.clone());
    let states = small.join("ws");
    let dir = m.dir.path().join("mnt-full");
    let o = m
        .cmd(&["ws", "create", "full", "--from", "main", "--mount", dir.to_str().unwrap()])
        .env("MADO_WORKSPACES_DIR", &states)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mnt = WsMount { m: &m, dir };
    let e = std::fs::write(mnt.dir.join("big"), vec![1u8; 8 << 20]).expect_err("3 MiB of state disk");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    std::fs::remove_file(mnt.dir.join("big")).unwrap();
    eventually("the space is back", || std::fs::write(mnt.dir.join("small"), "fits\n").is_ok());
    let o = m.cmd(&["umount", mnt.path()]).env("MADO_WORKSPACES_DIR", &states).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `ws rm` of a workspace mounted here is refused naming the mount; with
/// --force it goes, and the mount's work is set aside when the mount ends
/// (nothing listed it before). The lease of a mount whose daemon died
/// does not refuse `ws rm` (no daemon holds it), and its work is set aside.
#[test]
fn ws_rm_of_a_mounted_or_dead_workspace_sets_its_work_aside() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let a = create(&m, "live");
    std::fs::write(a.dir.join("w.txt"), "live work\n").unwrap();
    let err = m.fails(&["ws", "rm", "live"], 1);
    assert!(err.contains("already mounted") && err.contains("--force"), "{err}");
    m.ok(&["ws", "rm", "--force", "live"]);
    a.umount();
    let aside = m.json(&["ws", "recover"]);
    assert_eq!(aside.as_array().unwrap().len(), 1, "{aside}");
    assert_eq!(aside[0]["workspace"], "live");

    let b = create(&m, "dead");
    std::fs::write(b.dir.join("w.txt"), "dead work\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    b.kill_daemon();
    // A resume into the dead mount's directory says to unmount it first.
    let err = m.fails(&["ws", "resume", "dead", b.path(), "--ignore-mount-changes"], 1);
    assert!(err.contains("daemon is gone") && err.contains("mado umount"), "{err}");
    m.ok(&["umount", b.path()]);
    let o = m.cmd(&["ws", "rm", "dead"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let aside = m.json(&["ws", "recover"]);
    let names: Vec<&str> = aside.as_array().unwrap().iter().map(|a| a["workspace"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "{aside}");
    assert!(names.contains(&"dead"), "{aside}");
    // And it comes back.
    let dir = aside.as_array().unwrap().iter().find(|a| a["workspace"] == "dead").unwrap()["dir"].as_str().unwrap();
    m.ok(&["ws", "recover", dir, "--as", "dead2"]);
    let c = WsMount { m: &m, dir: m.dir.path().join("mnt-dead2") };
    m.ok(&["ws", "resume", "dead2", c.path(), "--mount"]);
    assert_eq!(std::fs::read(c.dir.join("w.txt")).unwrap(), b"dead work\n");
    c.umount();
}

#[test]
fn a_read_only_snapshot_mount_refuses_writes_and_checkpoints() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let dir = m.dir.path().join("ro");
    std::fs::create_dir_all(&dir).unwrap();
    m.ok(&["mount", "main", dir.to_str().unwrap()]);
    let _g = WsMount { m: &m, dir: dir.clone() };
    assert_eq!(errno_of(std::fs::write(dir.join("x"), "x")), Some(30), "EROFS");
    let err = m.fails(&["ws", "checkpoint", "--dir", dir.to_str().unwrap()], 1);
    assert!(err.contains("read-only"), "{err}");
}

#[test]
fn a_second_mount_and_a_non_empty_directory_are_refused() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let dir = m.dir.path().join("ro");
    std::fs::create_dir_all(&dir).unwrap();
    m.ok(&["mount", "main", dir.to_str().unwrap()]);
    let _g = WsMount { m: &m, dir: dir.clone() };
    let err = m.fails(&["mount", "main", dir.to_str().unwrap()], 1);
    assert!(err.contains("already a mount point"), "{err}");
    // One umount leaves no mount behind (no second daemon was stacked).
    m.ok(&["umount", dir.to_str().unwrap()]);
    assert!(std::fs::read_dir(&dir).unwrap().next().is_none(), "still mounted after one umount");
    std::fs::write(dir.join("mine.txt"), "mine\n").unwrap();
    let err = m.fails(&["mount", "main", dir.to_str().unwrap()], 1);
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(std::fs::read(dir.join("mine.txt")).unwrap(), b"mine\n");
}

/// Two handles of one lower file: the reader opened it before the writer
/// copied it up; reads of ranges the reader never read before return the
/// written bytes, for a whole blob and for a chunked file.
#[test]
fn a_reader_sees_every_completed_write_through_another_handle() {
    use std::os::unix::fs::FileExt;
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "coherent");
    for (name, at) in [("README.md", 4u64), ("big.bin", 3 << 20)] {
        let p = mnt.dir.join(name);
        let reader = std::fs::File::open(&p).unwrap();
        let mut first = [0u8; 2];
        reader.read_exact_at(&mut first, 0).unwrap();
        let writer = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        writer.write_all_at(b"WRITTEN", at).unwrap();
        drop(writer);
        let mut got = [0u8; 7];
        reader.read_exact_at(&mut got, at).unwrap();
        assert_eq!(&got, b"WRITTEN", "{name}: the reader saw stale bytes");
    }
}

/// A state that cannot be saved is not silent: `mado stats` names the
/// failure and a checkpoint is refused until a save works again.
#[test]
fn a_failing_state_save_is_reported_and_blocks_checkpoints() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "nosave");
    let st = m.json(&["stats", mnt.path()]);
    let state_dir = std::path::PathBuf::from(st["workspace"]["state_dir"].as_str().unwrap());
    // A directory where overlay.json goes: every save's rename fails.
    let overlay = state_dir.join("overlay.state");
    std::fs::remove_file(&overlay).unwrap();
    std::fs::create_dir_all(overlay.join("blocker")).unwrap();
    std::fs::write(mnt.dir.join("new.txt"), "new\n").unwrap();
    let mut reported = serde_json::Value::Null;
    for _ in 0..50 {
        reported = m.json(&["stats", mnt.path()])["workspace"]["last_save_error"].clone();
        if reported.is_string() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(reported.as_str().is_some_and(|e| e.contains("overlay.state")), "{reported}");
    let err = m.fails(&["ws", "checkpoint", "--dir", mnt.path()], 1);
    assert!(err.contains("cannot be saved"), "{err}");
    // Fixed: the next change saves, and the checkpoint goes through.
    std::fs::remove_dir_all(&overlay).unwrap();
    std::fs::write(mnt.dir.join("new2.txt"), "new2\n").unwrap();
    let cp = mnt.checkpoint("after the fix");
    assert_eq!(cp["unchanged"], false, "{cp}");
    let st = m.json(&["stats", mnt.path()]);
    assert!(st["workspace"]["last_save_error"].is_null(), "{st}");
    assert_eq!(st["snapshot"], cp["snapshot"], "stats shows the snapshot the mount is now based on");
}

/// fsync is durable: a file written and fsynced, then the daemon killed
/// with SIGKILL at once (before any timed save), is there after a remount.
#[test]
fn an_fsynced_file_survives_a_kill_9_of_the_daemon() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "durable");
    std::fs::create_dir_all(mnt.dir.join("new/dir")).unwrap();
    let p = mnt.dir.join("new/dir/synced.txt");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(b"on disk before fsync returned\n").unwrap();
        f.sync_all().unwrap();
    }
    mnt.kill_daemon();
    m.ok(&["ws", "resume", "durable", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read(&p).unwrap(), b"on disk before fsync returned\n");
}

/// A workspace mount runs in FUSE's no-open mode: the kernel sends no
/// OPEN or RELEASE after the first OPEN, and reads, writes and fsyncs name
/// the inode. A snapshot file written in place (copied up on its first
/// WRITE) and one truncated by O_TRUNC keep their bytes through fsync and
/// a kill -9; a file unlinked while a process has it open reads to its
/// end; warm opens never reach the daemon.
#[test]
fn files_the_daemon_never_saw_opened_write_sync_and_outlive_unlink() {
    use std::io::Read;
    use std::os::unix::fs::FileExt;
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "noopen");
    let opens = || m.json(&["stats", mnt.path()])["opens"].as_u64().unwrap();
    let readme = mnt.dir.join("README.md");
    for _ in 0..3 {
        assert_eq!(std::fs::read(&readme).unwrap(), b"# fixture\n");
    }
    let before = opens();
    assert!(before <= 1, "the kernel kept sending OPEN: {before}");
    for p in ["README.md", "src/lib.rs", "win.bat", "run.sh"] {
        std::fs::read(mnt.dir.join(p)).unwrap();
    }
    assert_eq!(opens(), before, "a warm open reached the daemon");

    // As root with no --allow-other the kernel leaves permissions to the
    // daemon, which refuses only to execute a file with no execute bit.
    let access = |p: &str, mode: i32| {
        let c = std::ffi::CString::new(mnt.dir.join(p).into_os_string().into_encoded_bytes()).unwrap();
        unsafe { libc::access(c.as_ptr(), mode) == 0 }
    };
    let root = rustix::process::geteuid().is_root();
    assert!(access("run.sh", libc::X_OK));
    assert!(access("src", libc::X_OK));
    assert!(!access("README.md", libc::X_OK), "X_OK on a file with no execute bit");
    assert!(access("README.md", libc::W_OK));
    if root {
        std::fs::set_permissions(mnt.dir.join("win.bat"), std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
        assert!(access("win.bat", libc::R_OK | libc::W_OK), "root reads and writes a file of mode 000");
        assert!(std::fs::read(mnt.dir.join("win.bat")).unwrap().starts_with(b"echo one"));
    }

    // A name that is not there is asked for once, then known absent,
    // until the kernel makes it.
    let lookups = || m.json(&["stats", mnt.path()])["lookups"].as_u64().unwrap();
    let missing = mnt.dir.join("src/.gitignore");
    let at = lookups();
    for _ in 0..5 {
        assert!(!missing.exists());
    }
    assert_eq!(lookups(), at + 1, "each probe of a missing name reached the daemon");

    // isatty() of a file (Python's buffered open() asks it of every file)
    // is one IOCTL request, refused with ENOTTY.
    let ioctls = || m.json(&["stats", mnt.path()])["ioctls"].as_u64().unwrap();
    let at = ioctls();
    let tty = std::fs::File::open(&readme).unwrap();
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&tty), libc::TCGETS, &mut t) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENOTTY)));
    drop(tty);
    assert_eq!(ioctls(), at + 1, "isatty went to the daemon once");

    // A file's attributes come with its entry and are kept: stat and a
    // read to its end ask the daemon nothing, until a write changes them.
    let getattrs = || m.json(&["stats", mnt.path()])["getattrs"].as_u64().unwrap();
    let at = getattrs();
    for _ in 0..3 {
        std::fs::metadata(&readme).unwrap();
        std::fs::read(&readme).unwrap();
    }
    assert_eq!(getattrs(), at, "attributes the kernel holds were asked for again");
    std::fs::write(mnt.dir.join("win.bat"), "echo two\r\n").unwrap();
    std::fs::metadata(mnt.dir.join("win.bat")).unwrap();
    assert_eq!(getattrs(), at + 1, "a file's attributes after a write are asked for once");
    std::fs::write(&missing, "target\n").unwrap();
    assert_eq!(std::fs::read_to_string(&missing).unwrap(), "target\n");
    std::fs::remove_file(&missing).unwrap();
    assert!(!missing.exists());

    let f = std::fs::OpenOptions::new().write(true).open(&readme).unwrap();
    f.write_all_at(b"#-in", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.dir.join("run.sh")).unwrap();
        f.write_all(b"#!/bin/sh\necho truncated\n").unwrap();
        f.sync_data().unwrap();
    }
    // Opened, then unlinked before the daemon saw a single read of it.
    let mut kept = std::fs::File::open(mnt.dir.join("src/deep/er/still.txt")).unwrap();
    std::fs::remove_file(mnt.dir.join("src/deep/er/still.txt")).unwrap();
    let mut got = String::new();
    kept.read_to_string(&mut got).unwrap();
    assert_eq!(got, "deep\n");
    drop(kept);
    assert!(!mnt.dir.join("src/deep/er/still.txt").exists());
    std::fs::File::open(mnt.dir.join("src/deep/er")).unwrap().sync_all().unwrap();

    // No RELEASE comes for a created file either: what the daemon keeps
    // open must not grow with the files made (it ran out of descriptors
    // in a `cp -r` of 25,000 files when it did).
    let pid = m.json(&["stats", mnt.path()])["pid"].as_u64().unwrap();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let before = fds();
    std::fs::create_dir(mnt.dir.join("many")).unwrap();
    for i in 0..1500 {
        std::fs::write(mnt.dir.join(format!("many/{i}")), format!("{i}\n")).unwrap();
    }
    let after = fds();
    assert!(after <= before + 70, "the daemon holds {after} descriptors, {before} before 1,500 files were made");
    assert_eq!(std::fs::read_to_string(mnt.dir.join("many/7")).unwrap(), "7\n");
    // Listed in pages (more than one sorted batch), with no OPENDIR.
    let mut listed: Vec<String> = std::fs::read_dir(mnt.dir.join("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort_by_key(|n| n.parse::<u32>().unwrap());
    assert_eq!(listed, (0..1500).map(|i| i.to_string()).collect::<Vec<_>>());

    kill_keeper_of(pid);
    std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    wait_gone(pid);
    m.ok(&["ws", "resume", "noopen", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read(&readme).unwrap(), b"#-inxture\n");
    assert_eq!(std::fs::read(mnt.dir.join("run.sh")).unwrap(), b"#!/bin/sh\necho truncated\n");
    assert!(!mnt.dir.join("src/deep/er/still.txt").exists());
}

/// A checkpoint taken while a program still has a file open, written and
/// neither closed nor synced, has those bytes and the mtime the mount
/// shows. (Workspace mounts write through: each write(2) reaches the upper
/// file before it returns. The kernel's writeback cache would keep them in
/// the page cache until a close or sync, and lost fsynced files when the
/// daemon was killed under load: it is not used.) The writer is a process
/// of its own that neither forks nor closes: any close of a descriptor of
/// the file would write its pages back, and a fork and exec closes the
/// child's copies.
#[test]
fn a_checkpoint_has_what_an_open_unsynced_file_was_given() {
    use std::io::BufRead;
    use std::os::unix::fs::MetadataExt;
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "unsynced");
    // Python's os.write: one write(2), no descriptor duplicated or closed
    // (a shell's `>&3` dups and closes, and every close writes back).
    let script = "import os, sys, time\n\
        a = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n\
        b = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
        os.write(a, b'pub fn g() {}\\n')\n\
        os.write(b, b'new\\n')\n\
        print('ready', flush=True)\n\
        time.sleep(60)\n";
    let mut writer = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(mnt.dir.join("src/lib.rs"))
        .arg(mnt.dir.join("new.txt"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(writer.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let cp = mnt.checkpoint("with open files");
    let seen = |p: &str| {
        let md = std::fs::metadata(mnt.dir.join(p)).unwrap();
        (md.len(), md.mtime(), md.mtime_nsec())
    };
    let (lib, newf) = (seen("src/lib.rs"), seen("new.txt"));
    let _ = writer.kill();
    let _ = writer.wait();
    assert_eq!(cp["unchanged"], false, "{cp}");
    let back = m.dir.path().join("back");
    m.ok(&["ws", "resume", "unsynced", back.to_str().unwrap(), "--read-only"]);
    assert_eq!(std::fs::read(back.join("src/lib.rs")).unwrap(), b"pub fn f() {}\npub fn g() {}\n");
    assert_eq!(std::fs::read(back.join("new.txt")).unwrap(), b"new\n");
    for (p, at) in [("src/lib.rs", lib), ("new.txt", newf)] {
        let md = std::fs::metadata(back.join(p)).unwrap();
        assert_eq!((md.len(), md.mtime(), md.mtime_nsec()), at, "{p}: size and mtime as the mount showed them");
    }
}

fn wait_gone(pid: u64) {
    for _ in 0..100 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `mkdir -p` thousands of levels deep inside a mount: the daemon stays
/// up, the state saves and reloads, and a checkpoint and a resume keep it.
#[test]
fn thousands_of_nested_directories_in_a_mount_checkpoint_and_resume() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "deep");
    let depth = 1200;
    // PATH_MAX (4096) limits one path, so go down in steps with cd.
    let script = format!(
        "cd {} && for i in $(seq {depth}); do mkdir d && cd d || exit 1; done && echo bottom > leaf.txt",
        mnt.path()
    );
    let st = std::process::Command::new("sh").arg("-c").arg(&script).status().unwrap();
    assert!(st.success(), "mkdir chain");
    mnt.umount();
    m.ok(&["ws", "resume", "deep", mnt.path(), "--mount"]);
    let cp = mnt.checkpoint("deep");
    assert_eq!(cp["unchanged"], false, "{cp}");
    mnt.umount();
    let w = m.dir.path().join("w");
    m.ok(&["ws", "resume", "deep", w.to_str().unwrap()]);
    let check = format!("cd {} && for i in $(seq {depth}); do cd d || exit 1; done && cat leaf.txt", w.display());
    let o = std::process::Command::new("sh").arg("-c").arg(&check).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "bottom\n");
}

/// The issue's reproduction, on a generated tree of ~10k files: git writes
/// thousands of files into the mount, the kernel drops its dentries and
/// inodes three times (FORGET), and every listed file still opens, git
/// fsck is clean, and the checkpoint equals a plain copy of the tree.
#[test]
fn files_written_by_git_survive_kernel_forgets() {
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    let repo = m.dir.path().join("tree");
    for i in 0..10_000 {
        let d = repo.join(format!("m{}/s{}", i % 50, i % 7));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.c")), format!("int f{i}(void) {{ return {i}; }}\n")).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "tree");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let mnt = create(&m, "forget");
    // Auto gc off: a background `git gc --auto` deletes loose objects
    // while the checks below run, and a deleted file is rightly ENOENT.
    let g = |args: &[&str]| {
        let o = git_cmd(&mnt.dir).args(args).output().unwrap();
        assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    g(&["init", "-q"]);
    g(&["config", "gc.auto", "0"]);
    g(&["add", "-A"]);
    g(&["commit", "-qm", "in the mount"]);
    for _ in 0..3 {
        std::process::Command::new("sync").status().unwrap();
        std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        let o = std::process::Command::new("grep")
            .args(["-r", "no-such-text-anywhere", "."])
            .current_dir(&mnt.dir)
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&o.stderr).is_empty(), "grep: {}", String::from_utf8_lossy(&o.stderr));
    }
    let mut files = 0;
    let mut stack = vec![mnt.dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                std::fs::read(e.path())
                    .unwrap_or_else(|err| panic!("listed but unreadable: {}: {err}", e.path().display()));
                files += 1;
            }
        }
    }
    assert!(files > 20_000, "the tree and git's objects: {files}");
    g(&["fsck", "--no-dangling"]);
    let cp = mnt.checkpoint("after forgets");
    assert_eq!(cp["unchanged"], false, "{cp}");
}

/// The mount daemon killed with SIGKILL at many points of a stream of
/// writes, and inside checkpoints: every file whose fsync returned is
/// there, whole, after the remount; the workspace checkpoints; every ref
/// stays whole after every kill.
#[test]
fn a_mount_daemon_killed_at_many_points_keeps_everything_fsynced() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "kills");
    let log = m.dir.path().join("synced.log");
    let writer = r#"
import os, sys
mnt, log, round_ = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(os.path.join(mnt, "w" + round_), exist_ok=True)
with open(log, "a") as out:
    for i in range(100000):
        p = os.path.join(mnt, "w" + round_, "f%d" % i)
        with open(p, "w") as f:
            f.write("round %s file %d\n" % (round_, i) * (1 + i % 5))
            f.flush()
            os.fsync(f.fileno())
        out.write(p + "\n")
        out.flush()
"#;
    let mut synced = 0;
    for round in 0..6u64 {
        let mut w = std::process::Command::new("python3")
            .args(["-c", writer, mnt.path(), log.to_str().unwrap(), &round.to_string()])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill once this round's writer got a few fsyncs through (however
        // loaded the machine), at a different moment each round.
        let lines = || std::fs::read_to_string(&log).map(|t| t.lines().count()).unwrap_or(0);
        let (start, t) = (lines(), Instant::now());
        while lines() < start + 4 && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(30 * round));
        let pid = m.json(&["stats", mnt.path()])["pid"].as_u64().unwrap();
        // Every other round the daemon dies inside a checkpoint, at a
        // different moment each time.
        let cp = (round % 2 == 1).then(|| {
            let c = m
                .cmd(&["ws", "checkpoint", "--dir", mnt.path(), "-m", &format!("round {round}")])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(10 * round));
            c
        });
        kill_keeper_of(pid);
        std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
        if let Some(mut c) = cp {
            let _ = c.wait();
        }
        assert_refs_whole(&m.store_dir());
        let _ = w.wait();
        wait_gone(pid);
        m.ok(&["ws", "resume", "kills", mnt.path(), "--mount"]);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for p in text.lines() {
            let i: usize = p.rsplit_once("/f").unwrap().1.parse().unwrap();
            let r = p.rsplit_once("/w").unwrap().1.split('/').next().unwrap().to_string();
            let want = format!("round {r} file {i}\n").repeat(1 + i % 5);
            let got = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("fsynced {p} is gone after kill -9: {e}"));
            assert_eq!(got, want, "{p}");
        }
        synced = text.lines().count();
    }
    assert!(synced > 20, "the writers got some fsyncs through: {synced}");
    // The last round's checkpoint may have caught every file before the
    // kill (a loaded machine stalls the writer meanwhile), so one more
    // change makes sure there is something to checkpoint.
    std::fs::write(std::path::Path::new(mnt.path()).join("after-kills"), "whole\n").unwrap();
    let cp = mnt.checkpoint("after six kills");
    assert_eq!(cp["unchanged"], false, "{cp}");
    assert_eq!(m.ok(&["cat", "ws/kills", "after-kills"]), "whole\n");
    assert_refs_whole(&m.store_dir());
    let v = m.json(&["cache", "verify"]);
    assert_eq!(v["bad"].as_array().map(|b| b.len()), Some(0), "{v}");
}

/// A mount opened on a checkpoint whose index is a small layer, then
/// checkpointed again and again (each new layer absorbs the small ones
/// above the import's, dropping the trees no longer in the tree), then
/// unmounted and mounted again: the reopened mount loads the trees of the
/// snapshot its saved state was last rebased on, not those of the one it
/// was first opened on (which no index of the view carries any more).
#[test]
fn a_mount_reopened_after_many_checkpoints_finds_its_trees() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let plain = m.dir.path().join("plain");
    m.ok(&["ws", "create", "layers", "--dir", plain.to_str().unwrap()]);
    std::fs::write(plain.join("src/deep/er/still.txt"), "plain\n").unwrap();
    m.json(&["ws", "checkpoint", "--dir", plain.to_str().unwrap()]);
    m.ok(&["ws", "release", "layers", "--dir", plain.to_str().unwrap()]);
    let mnt = m.dir.path().join("mnt-layers");
    m.ok(&["ws", "resume", "layers", mnt.to_str().unwrap(), "--mount"]);
    let mnt = WsMount { m: &m, dir: mnt };
    for i in 0..6 {
        std::fs::write(mnt.dir.join("src/deep/er/still.txt"), format!("round {i}\n")).unwrap();
        std::fs::write(mnt.dir.join(format!("src/deep/n{i}.txt")), "n\n").unwrap();
        let cp = mnt.checkpoint(&format!("round {i}"));
        assert_eq!(cp["unchanged"], false, "{cp}");
    }
    std::fs::write(mnt.dir.join("src/deep/uncheckpointed.txt"), "u\n").unwrap();
    mnt.umount();
    // From an empty cache (the mount's state is kept outside it): what
    // the view carries is all there is.
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    m.ok(&["ws", "resume", "layers", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read_to_string(mnt.dir.join("src/deep/er/still.txt")).unwrap(), "round 5\n");
    assert_eq!(std::fs::read_to_string(mnt.dir.join("src/deep/uncheckpointed.txt")).unwrap(), "u\n");
    let cp = mnt.checkpoint("after the reopen");
    assert_eq!(cp["unchanged"], false, "{cp}");
    let w = m.dir.path().join("w");
    m.ok(&["ws", "resume", "layers", w.to_str().unwrap(), "--read-only"]);
    assert_same_state(&mnt.dir, &w);
}

/// The issue's longer session, as a developer would have it in a
/// workspace: grep, git init/add/commit/status, cp -r and rm -rf of a
/// subtree, sed -i on hundreds of files, a C build with make -j2, the
/// kernel forgetting in between; then every file reads, git is clean, and a
/// checkpoint resumes elsewhere identical to the mount.
#[test]
fn a_working_session_of_real_tools_loses_nothing() {
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    let repo = m.dir.path().join("tree");
    for i in 0..3000 {
        let d = repo.join(format!("lib/m{}/s{}", i % 40, i % 9));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.txt")), format!("line one of {i}\nneedle {i}\n")).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "tree");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let mnt = create(&m, "session");
    let sh = |script: &str| {
        let o = std::process::Command::new("sh").arg("-c").arg(script).current_dir(&mnt.dir).output().unwrap();
        assert!(o.status.success(), "{script}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let drop_caches = || {
        std::process::Command::new("sync").status().unwrap();
        std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    };
    assert_eq!(sh("grep -rl needle lib | wc -l").trim(), "3000");
    sh("git init -q && git config gc.auto 0 && git add -A && git -c user.email=a@b -c user.name=a commit -qm in-mount");
    drop_caches();
    sh("cp -r lib/m1 copy && rm -rf lib/m2 && grep -rl needle copy >/dev/null");
    sh("find lib/m3 lib/m4 lib/m5 -name '*.txt' | head -500 | xargs sed -i 's/needle/pin/'");
    drop_caches();
    let c = (0..40).map(|i| format!("int f{i}(void) {{ return {i}; }}\n")).collect::<String>();
    std::fs::create_dir_all(mnt.dir.join("src")).unwrap();
    for i in 0..20 {
        std::fs::write(mnt.dir.join(format!("src/u{i}.c")), c.replace("int f", &format!("int u{i}_f"))).unwrap();
    }
    std::fs::write(mnt.dir.join("src/main.c"), "int main(void) { return 0; }\n").unwrap();
    std::fs::write(
        mnt.dir.join("src/Makefile"),
        "OBJ := $(patsubst %.c,%.o,$(wildcard *.c))\nprog: $(OBJ)\n\t$(CC) -o $@ $^\n%.o: %.c\n\t$(CC) -c -o $@ $<\n",
    )
    .unwrap();
    sh("make -s -j2 -C src && ./src/prog");
    drop_caches();
    sh("git add -A && git -c user.email=a@b -c user.name=a commit -qm work && test -z \"$(git status --porcelain)\"");
    sh("git fsck --no-dangling");
    // Every listed file opens.
    let mut stack = vec![mnt.dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_type().unwrap().is_file() {
                std::fs::read(e.path())
                    .unwrap_or_else(|err| panic!("listed but unreadable: {}: {err}", e.path().display()));
            }
        }
    }
    let cp = mnt.checkpoint("session");
    assert_eq!(cp["unchanged"], false, "{cp}");
    let w = m.dir.path().join("resumed");
    m.ok(&["ws", "resume", "session", w.to_str().unwrap(), "--read-only"]);
    std::fs::remove_dir_all(w.join(".mado")).unwrap();
    assert_same_tree(&mnt.dir, &w);
}

/// A 0600 file written in a workspace: another local user can read no
/// copy of it anywhere under mado's folders (cache, upper layer, store),
/// and its upper copy keeps the file's mode.
#[test]
fn another_user_reads_no_copy_of_a_private_file() {
    use std::os::unix::fs::PermissionsExt;
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "private");
    let secret = mnt.dir.join("secret.txt");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&secret).unwrap();
        f.write_all(b"TOPSECRET\n").unwrap();
    }
    mnt.checkpoint("secret");
    let st = m.json(&["stats", mnt.path()]);
    let upper = std::path::PathBuf::from(st["workspace"]["state_dir"].as_str().unwrap()).join("upper");
    let blobs: Vec<_> = std::fs::read_dir(&upper).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(blobs.len(), 1);
    assert_eq!(std::fs::metadata(&blobs[0]).unwrap().permissions().mode() & 0o777, 0o600);
    // Let `nobody` walk up to mado's own folders, as on a shared machine.
    for d in [m.dir.path().to_path_buf(), m.home(), m.home().join(".cache")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut stack = vec![m.home().join(".cache/mado"), m.store_dir()];
    let mut tried = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                tried += 1;
                let o = std::process::Command::new("runuser")
                    .args(["-u", "nobody", "--", "cat"])
                    .arg(e.path())
                    .output()
                    .unwrap();
                assert!(
                    !String::from_utf8_lossy(&o.stdout).contains("TOPSECRET") && !o.status.success(),
                    "nobody read {}",
                    e.path().display()
                );
            }
        }
    }
    assert!(tried > 10, "{tried}");
}

/// Owners and times behave as on a local filesystem while mounted (#20):
/// root chowns; a file another user makes is theirs, and under a
/// set-group-ID directory gets its group (a directory made there is one
/// too); atime is kept apart from the mtime; the ctime moves on chmod. The
/// saved state keeps all of it across an unmount; a checkpoint keeps none
/// of it (mtimes and the exec bit only), so a resume elsewhere shows the
/// resuming user's. (scripts/pjdfstest.sh runs the whole POSIX suite.)
#[test]
fn owners_and_times_behave_as_on_a_local_filesystem_while_mounted() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let dir = m.dir.path().join("mnt-own");
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    m.ok(&["ws", "create", "own", "--from", "main", "--mount", dir.to_str().unwrap(), "--allow-other"]);
    let mnt = WsMount { m: &m, dir };
    let d = mnt.dir.clone();
    let md = |p: &str| std::fs::symlink_metadata(d.join(p)).unwrap();
    let as_nobody = |args: &[&str]| {
        let o = std::process::Command::new("runuser").args(["-u", "nobody", "--"]).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    std::os::unix::fs::chown(d.join("README.md"), Some(65534), Some(65534)).unwrap();
    assert_eq!((md("README.md").uid(), md("README.md").gid()), (65534, 65534));
    std::fs::create_dir(d.join("shared")).unwrap();
    std::fs::set_permissions(d.join("shared"), std::fs::Permissions::from_mode(0o777)).unwrap();
    as_nobody(&["touch", d.join("shared/mine").to_str().unwrap()]);
    assert_eq!(md("shared/mine").uid(), 65534);
    std::fs::create_dir(d.join("grp")).unwrap();
    std::os::unix::fs::chown(d.join("grp"), None, Some(1)).unwrap();
    std::fs::set_permissions(d.join("grp"), std::fs::Permissions::from_mode(0o2777)).unwrap();
    as_nobody(&["touch", d.join("grp/f").to_str().unwrap()]);
    as_nobody(&["mkdir", d.join("grp/sub").to_str().unwrap()]);
    assert_eq!((md("grp/f").uid(), md("grp/f").gid()), (65534, 1));
    assert_eq!(md("grp/sub").gid(), 1);
    assert_ne!(md("grp/sub").mode() & 0o2000, 0, "a directory made under a set-group-ID one is one too");
    // atime apart from mtime.
    let path = std::ffi::CString::new(d.join("src/lib.rs").as_os_str().as_bytes()).unwrap();
    let times = [libc::timespec { tv_sec: 1_000, tv_nsec: 5 }, libc::timespec { tv_sec: 2_000, tv_nsec: 7 }];
    // SAFETY: a valid NUL-terminated path and two timespecs.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) }, 0);
    assert_eq!((md("src/lib.rs").atime(), md("src/lib.rs").atime_nsec()), (1_000, 5));
    assert_eq!((md("src/lib.rs").mtime(), md("src/lib.rs").mtime_nsec()), (2_000, 7));
    // The ctime moves on chmod; the mtime does not.
    std::fs::set_permissions(d.join("src/lib.rs"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(md("src/lib.rs").ctime() > 1_000_000_000, "ctime {}", md("src/lib.rs").ctime());
    assert_eq!(md("src/lib.rs").mtime(), 2_000);

    mnt.umount();
    m.ok(&["ws", "resume", "own", mnt.path(), "--mount", "--allow-other"]);
    assert_eq!((md("README.md").uid(), md("shared/mine").uid(), md("grp/f").gid()), (65534, 65534, 1));
    assert_eq!((md("src/lib.rs").atime(), md("src/lib.rs").mtime()), (1_000, 2_000));

    mnt.checkpoint("owners");
    let r = m.dir.path().join("resumed");
    m.ok(&["ws", "resume", "own", r.to_str().unwrap(), "--read-only"]);
    let me = rustix::process::geteuid().as_raw();
    let rmd = std::fs::symlink_metadata(r.join("README.md")).unwrap();
    assert_eq!(rmd.uid(), me, "a checkpoint keeps no owner");
    assert_eq!(std::fs::symlink_metadata(r.join("src/lib.rs")).unwrap().mtime(), 2_000, "it keeps mtimes");
    mnt.umount();
}

/// FIFOs and unix sockets (dev servers, language servers and test suites
/// make them) work in a workspace mount: the kernel carries their data;
/// they live in the upper layer, survive an unmount, and no checkpoint
/// keeps them (trees hold files, symlinks and directories). So do block
/// and character device nodes (issue #50), never opened as devices.
#[test]
fn fifos_and_sockets_work_in_a_workspace_mount_and_are_not_checkpointed() {
    use std::io::{Read, Write};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "sp");
    let fifo = mnt.dir.join("pipe");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    let writer = {
        let f = fifo.clone();
        std::thread::spawn(move || std::fs::write(f, b"through the pipe\n").unwrap())
    };
    assert_eq!(std::fs::read(&fifo).unwrap(), b"through the pipe\n");
    writer.join().unwrap();

    let sock = mnt.dir.join("src/app.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"hello").unwrap();
    });
    let mut got = String::new();
    std::os::unix::net::UnixStream::connect(&sock).unwrap().read_to_string(&mut got).unwrap();
    server.join().unwrap();
    assert_eq!(got, "hello");
    assert!(std::fs::symlink_metadata(&sock).unwrap().file_type().is_socket());

    // Device nodes are made (as root: the kernel refuses others), keep
    // their numbers, and are never opened as devices: the mount is nodev.
    let mknod = |name: &str, kind: u32, dev: libc::dev_t| {
        let p = std::ffi::CString::new(mnt.dir.join(name).as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mknod only reads it.
        let r = unsafe { libc::mknod(p.as_ptr(), kind | 0o666, dev) };
        (r, std::io::Error::last_os_error().raw_os_error())
    };
    let devices = rustix::process::geteuid().is_root();
    if devices {
        assert_eq!(mknod("null", libc::S_IFCHR, libc::makedev(1, 3)).0, 0);
        assert_eq!(mknod("src/disk", libc::S_IFBLK, libc::makedev(8, 1)).0, 0);
        let md = std::fs::symlink_metadata(mnt.dir.join("null")).unwrap();
        assert!(md.file_type().is_char_device());
        assert_eq!(std::os::unix::fs::MetadataExt::rdev(&md), libc::makedev(1, 3));
        let e = std::fs::OpenOptions::new().write(true).open(mnt.dir.join("null")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "a device node opened as a device: {e}");
        std::os::unix::fs::chown(mnt.dir.join("null"), Some(65534), None).unwrap();
        std::fs::hard_link(mnt.dir.join("null"), mnt.dir.join("null2")).unwrap();
        std::fs::rename(mnt.dir.join("null2"), mnt.dir.join("src/null3")).unwrap();
        std::fs::remove_file(mnt.dir.join("src/null3")).unwrap();
    }

    // A checkpoint succeeds, keeps none of them, and counts each as left out.
    let cp = mnt.checkpoint("specials");
    assert_eq!(cp["paths_ignored"], if devices { 4 } else { 2 }, "{cp}");
    let names = |dir: &str| -> Vec<String> {
        let mut args = vec!["ls", "ws/sp"];
        if !dir.is_empty() {
            args.push(dir);
        }
        m.json(&args).as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect()
    };
    assert!(!names("").contains(&"pipe".to_string()), "{:?}", names(""));
    assert!(!names("src").contains(&"app.sock".to_string()), "{:?}", names("src"));
    assert!(names("src").contains(&"lib.rs".to_string()));

    // The saved state keeps them across an unmount.
    mnt.umount();
    m.ok(&["ws", "resume", "sp", mnt.path(), "--mount"]);
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(std::fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
    if devices {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(mnt.dir.join("null")).unwrap();
        assert!(md.file_type().is_char_device());
        assert_eq!((md.rdev(), md.uid()), (libc::makedev(1, 3), 65534));
        let md = std::fs::symlink_metadata(mnt.dir.join("src/disk")).unwrap();
        assert!(md.file_type().is_block_device());
        assert_eq!(md.rdev(), libc::makedev(8, 1));
        assert!(!names("").contains(&"null".to_string()), "{:?}", names(""));
    }
    std::fs::remove_file(&fifo).unwrap();
    std::fs::remove_file(&sock).unwrap();
    assert!(!fifo.exists() && !sock.exists());
}

/// A directory emptied while it is being listed (what `rm -rf` of a large
/// directory does: it reads a batch of names, unlinks them, reads on):
/// the next READDIRPLUS asks for an offset past the end, which ends the
/// listing. It once panicked every FUSE thread of the daemon, and the
/// mount was gone ("Transport endpoint is not connected").
#[test]
fn a_directory_emptied_while_listed_ends_the_listing_and_the_mount_lives() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "shrink");
    let big = mnt.dir.join("big");
    std::fs::create_dir(&big).unwrap();
    let long = "x".repeat(120);
    for i in 0..1500 {
        std::fs::write(big.join(format!("{long}-{i:05}")), b"").unwrap();
    }
    for round in 0..3 {
        let mut listing = std::fs::read_dir(&big).unwrap();
        listing.next().expect("an entry").unwrap();
        let all: Vec<_> = std::fs::read_dir(&big).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(all.len(), 1500);
        for p in all {
            std::fs::remove_file(p).unwrap();
        }
        // The rest of the first listing: whatever is left, then its end.
        let rest: Vec<_> = listing.map(|e| e.map(|e| e.file_name())).collect();
        assert!(rest.iter().all(|e| e.is_ok()), "{rest:?}");
        assert!(std::fs::read_dir(&big).unwrap().next().is_none(), "round {round}: emptied");
        for i in 0..1500 {
            std::fs::write(big.join(format!("{long}-{i:05}")), b"").unwrap();
        }
    }
    std::fs::remove_dir_all(&big).unwrap();
    assert!(mnt.dir.join("README.md").is_file(), "the mount is alive");
    mnt.checkpoint("after");
}

/// Hard links in a workspace mount (pnpm, ccache, `cp -al` and build tools
/// make them): one file under two names with `nlink` 2, a write through
/// either shows through both, in one directory and across two, of a file
/// written here and of one from the snapshot; the names survive an unmount
/// (the saved state keeps one node); a checkpoint records each path as a
/// file, and a resume writes them as separate files with the same bytes.
#[test]
fn hard_links_work_in_a_workspace_mount_and_checkpoint_as_files() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "hl");
    let d = &mnt.dir;
    std::fs::write(d.join("made.txt"), "made here\n").unwrap();
    std::fs::hard_link(d.join("made.txt"), d.join("src/made-link.txt")).unwrap();
    // A file of the snapshot, never written here.
    std::fs::hard_link(d.join("README.md"), d.join("readme-link")).unwrap();
    std::fs::hard_link(d.join("README.md"), d.join("src/readme-link2")).unwrap();
    let ino = |p: &str| std::fs::metadata(d.join(p)).unwrap().ino();
    let nlink = |p: &str| std::fs::metadata(d.join(p)).unwrap().nlink();
    assert_eq!(ino("made.txt"), ino("src/made-link.txt"));
    assert_eq!((nlink("made.txt"), nlink("README.md")), (2, 3));
    // A write through one name shows through the others.
    std::fs::OpenOptions::new().append(true).open(d.join("src/made-link.txt")).unwrap().write_all(b"more\n").unwrap();
    std::fs::write(d.join("readme-link"), "# rewritten through a link\n").unwrap();
    assert_eq!(std::fs::read_to_string(d.join("made.txt")).unwrap(), "made here\nmore\n");
    assert_eq!(std::fs::read_to_string(d.join("src/readme-link2")).unwrap(), "# rewritten through a link\n");
    // Linking a directory, or onto an existing name, is refused.
    let err = std::fs::hard_link(d.join("src"), d.join("src2")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    let err = std::fs::hard_link(d.join("made.txt"), d.join("README.md")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EEXIST), "{err}");
    // Removing one name leaves the others.
    std::fs::remove_file(d.join("README.md")).unwrap();
    assert_eq!(nlink("readme-link"), 2);
    mnt.umount();
    m.ok(&["ws", "resume", "hl", mnt.path(), "--mount"]);
    assert_eq!(ino("made.txt"), ino("src/made-link.txt"), "one node after a remount");
    assert_eq!((nlink("made.txt"), nlink("readme-link")), (2, 2));
    std::fs::write(d.join("made.txt"), "after the remount\n").unwrap();
    assert_eq!(std::fs::read_to_string(d.join("src/made-link.txt")).unwrap(), "after the remount\n");
    // Each path is a file of its own in the checkpoint.
    mnt.checkpoint("links");
    let r = m.dir.path().join("resumed");
    m.ok(&["ws", "resume", "hl", r.to_str().unwrap(), "--read-only"]);
    for (p, want) in [
        ("made.txt", "after the remount\n"),
        ("src/made-link.txt", "after the remount\n"),
        ("readme-link", "# rewritten through a link\n"),
        ("src/readme-link2", "# rewritten through a link\n"),
    ] {
        assert_eq!(std::fs::read_to_string(r.join(p)).unwrap(), want, "{p}");
        assert_eq!(std::fs::metadata(r.join(p)).unwrap().nlink(), 1, "{p}");
    }
    assert!(!r.join("README.md").exists());
    mnt.umount();
}

/// A mounted workspace's state (its upper layer: work no checkpoint has
/// saved) lives in the data directory, not the cache: wiping the cache
/// loses nothing, and a state an older mado left in the cache is moved out.
#[test]
fn a_mounted_workspace_keeps_its_state_outside_the_cache() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "st");
    std::fs::write(mnt.dir.join("unsaved.txt"), "not checkpointed\n").unwrap();
    let state = |m: &Mado| PathBuf::from(m.json(&["stats", mnt.path()])["workspace"]["state_dir"].as_str().unwrap());
    let sd = state(&m);
    let root = m.home().join(".local/share/mado/workspaces");
    assert!(sd.starts_with(&root) && !sd.starts_with(m.cache_dir()), "{}", sd.display());
    mnt.umount();
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    m.ok(&["ws", "resume", "st", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read(mnt.dir.join("unsaved.txt")).unwrap(), b"not checkpointed\n");

    // The layout of an older mado: the state inside the cache.
    mnt.umount();
    let old = m.cache_dir().join("workspaces").join(sd.file_name().unwrap());
    std::fs::create_dir_all(old.parent().unwrap()).unwrap();
    std::fs::rename(&sd, &old).unwrap();
    m.ok(&["ws", "resume", "st", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read(mnt.dir.join("unsaved.txt")).unwrap(), b"not checkpointed\n");
    assert_eq!(state(&m), sd, "moved to the data directory");
    assert!(!old.exists());
}

/// `ws create --mount` that cannot mount (here: a non-empty directory)
/// takes its new workspace ref back, so the same command works once the
/// cause is fixed.
#[test]
fn a_failed_ws_create_mount_leaves_no_workspace_behind() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let dir = m.dir.path().join("busy");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("x"), "in the way\n").unwrap();
    // A state folder with no work in it, as a daemon that failed after
    // opening the workspace leaves: taken back too.
    let states = m.home().join(".local/share/mado/workspaces");
    let state = states.join(mado_core::cache::DiskCache::workspace_key(&m.remote, "again"));
    std::fs::create_dir_all(state.join("upper")).unwrap();
    std::fs::write(state.join("workspace.json"), "{}").unwrap();
    let err = m.fails(&["ws", "create", "again", "--from", "main", "--mount", dir.to_str().unwrap()], 1);
    assert!(err.contains("not empty"), "{err}");
    assert!(!m.ok(&["refs"]).contains("ws/again"), "the ref was taken back");
    assert!(!state.exists(), "the unused state folder was taken back");
    // A mount point the command made for itself goes too when it fails.
    let made = m.dir.path().join("made/here");
    m.fails(&["ws", "create", "nofrom", "--from", "no-such-ref", "--mount", made.to_str().unwrap()], 1);
    assert!(!made.exists(), "a failed create left the directory it made");
    // One that holds work (an overlay) is never removed.
    let kept = states.join(mado_core::cache::DiskCache::workspace_key(&m.remote, "worked"));
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join(mado_core::workspace::OVERLAY_FILE), "work").unwrap();
    m.fails(&["ws", "create", "worked", "--from", "main", "--mount", dir.to_str().unwrap()], 1);
    assert!(kept.join(mado_core::workspace::OVERLAY_FILE).exists(), "work is kept");
    std::fs::remove_file(dir.join("x")).unwrap();
    let out = m.ok(&["ws", "create", "again", "--from", "main", "--mount", dir.to_str().unwrap()]);
    let _mounted = WsMount { m: &m, dir: dir.clone() };
    assert!(out.contains("read-write"), "{out}");
}

/// A mounted workspace's checkpoint leaves out the new paths that
/// `.gitignore` and `.madoignore` rules name, as a plain working copy's
/// does: rules from the snapshot and rules written in the mount, nested
/// rules, `!` re-includes; a tracked path stays whatever the rules say.
/// What is left out stays in the mount, a changed rule takes it in at the
/// next checkpoint, and `--no-ignore` keeps everything.
#[test]
fn a_mounted_checkpoint_leaves_out_what_ignore_rules_name() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join(".gitignore"), "target/\n*.log\n").unwrap();
    std::fs::write(repo.join("src/.gitignore"), "gen_*\n!gen_keep.rs\n").unwrap();
    std::fs::write(repo.join("src/lib.rs"), "fn f() {}\n").unwrap();
    std::fs::write(repo.join("tracked.log"), "tracked once\n").unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A", "-f"]);
    git(&repo, &["commit", "-qm", "one"]);
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let mnt = create(&m, "ig");
    let d = &mnt.dir;
    std::fs::create_dir_all(d.join("target/debug")).unwrap();
    std::fs::write(d.join("target/debug/out.o"), "object\n").unwrap();
    std::fs::write(d.join("build.log"), "noise\n").unwrap();
    std::fs::write(d.join("tracked.log"), "tracked twice\n").unwrap();
    std::fs::write(d.join("src/gen_a.rs"), "generated\n").unwrap();
    std::fs::write(d.join("src/gen_keep.rs"), "kept\n").unwrap();
    std::fs::write(d.join(".madoignore"), "secret.txt\n").unwrap();
    std::fs::write(d.join("secret.txt"), "s3cr3t\n").unwrap();
    std::fs::write(d.join("keep.txt"), "keep\n").unwrap();
    let cp = mnt.checkpoint("ignores");
    assert_eq!(cp["paths_ignored"], 4, "target, build.log, src/gen_a.rs, secret.txt: {cp}");
    let names = |dir: &str| -> Vec<String> {
        let mut args = vec!["ls", "ws/ig"];
        if !dir.is_empty() {
            args.push(dir);
        }
        m.json(&args).as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect()
    };
    let top = names("");
    for want in [".gitignore", ".madoignore", "keep.txt", "src", "tracked.log"] {
        assert!(top.contains(&want.to_string()), "{want} missing: {top:?}");
    }
    for gone in ["target", "build.log", "secret.txt"] {
        assert!(!top.contains(&gone.to_string()), "{gone} kept: {top:?}");
    }
    let src = names("src");
    assert!(src.contains(&"gen_keep.rs".to_string()) && !src.contains(&"gen_a.rs".to_string()), "{src:?}");
    assert_eq!(m.ok(&["cat", "ws/ig", "tracked.log"]), "tracked twice\n", "a tracked path stays");
    // Left out, not lost: still in the mount, and again left out.
    assert_eq!(std::fs::read_to_string(d.join("target/debug/out.o")).unwrap(), "object\n");
    std::fs::write(d.join("target/debug/more.o"), "more\n").unwrap();
    let cp = mnt.checkpoint("more output");
    assert_eq!(cp["paths_ignored"], 4, "{cp}");
    assert!(!names("").contains(&"target".to_string()));
    // The rule goes: the next checkpoint takes target in.
    std::fs::write(d.join(".gitignore"), "*.log\n").unwrap();
    mnt.checkpoint("rule changed");
    assert!(names("").contains(&"target".to_string()), "{:?}", names(""));
    assert_eq!(m.ok(&["cat", "ws/ig", "target/debug/more.o"]), "more\n");
    // A .git directory is left out by default...
    std::fs::create_dir_all(d.join("sub/.git")).unwrap();
    std::fs::write(d.join("sub/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(d.join("sub/kept.rs"), "kept\n").unwrap();
    let cp = mnt.checkpoint("a git repository inside");
    assert_eq!(cp["paths_ignored"], 4, "secret.txt, src/gen_a.rs, build.log and sub/.git: {cp}");
    assert_eq!(names("sub"), vec!["kept.rs".to_string()]);
    // ...and --no-ignore keeps everything, .git included (it was dropped).
    let cp = m.json(&["ws", "checkpoint", "--dir", mnt.path(), "-m", "all", "--no-ignore"]);
    assert_eq!(cp["paths_ignored"], 0, "{cp}");
    assert!(names("").contains(&"secret.txt".to_string()) && names("src").contains(&"gen_a.rs".to_string()));
    assert_eq!(m.ok(&["cat", "ws/ig", "sub/.git/HEAD"]), "ref: refs/heads/main\n");
}

/// `ws status` inside a workspace mount: what the next checkpoint would
/// record, with the same ignore rules, and nothing changed by asking. The
/// checkpoint after a status still uploads every changed file (a status
/// that recorded ids would let it name objects it never uploads).
#[test]
fn ws_status_in_a_mount_shows_the_next_checkpoint_and_changes_nothing() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "st");
    let d = &mnt.dir;
    std::fs::write(d.join("README.md"), "changed in the mount\n").unwrap();
    std::fs::write(d.join("new.txt"), "new\n").unwrap();
    std::fs::create_dir_all(d.join("newdir")).unwrap();
    std::fs::write(d.join("newdir/inner.txt"), "inner\n").unwrap();
    // Empty: the checkpoint records it, so status shows it.
    std::fs::create_dir(d.join("hollow")).unwrap();
    std::fs::remove_file(d.join("empty")).unwrap();
    std::fs::write(d.join(".madoignore"), "*.tmp\n").unwrap();
    std::fs::write(d.join("scratch.tmp"), "scratch\n").unwrap();
    let status = |m: &Mado| -> serde_json::Value {
        let o = m.cmd(&["ws", "status", "--json"]).current_dir(d.join("src")).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let s = status(&m);
    assert_eq!(s["added"], serde_json::json!([".madoignore", "hollow/", "new.txt", "newdir/inner.txt"]), "{s}");
    assert_eq!(s["modified"], serde_json::json!(["README.md"]), "{s}");
    assert_eq!(s["deleted"], serde_json::json!(["empty"]), "{s}");
    assert_eq!(s["paths_ignored"], 1, "{s}");
    assert_eq!(status(&m), s, "asking twice gives the same answer");
    // The checkpoint after it uploads everything: a copy resumed from the
    // store, with an empty cache, has every change.
    let cp = mnt.checkpoint("after status");
    assert_eq!(cp["files_read"].as_u64(), Some(4), "{cp}");
    let s = status(&m);
    assert!(s["added"].as_array().unwrap().is_empty() && s["modified"].as_array().unwrap().is_empty(), "{s}");
    empty_cache(&m);
    let copy = m.dir.path().join("copy");
    m.ok(&["ws", "resume", "st", copy.to_str().unwrap(), "--read-only"]);
    assert_eq!(std::fs::read_to_string(copy.join("README.md")).unwrap(), "changed in the mount\n");
    assert_eq!(std::fs::read_to_string(copy.join("newdir/inner.txt")).unwrap(), "inner\n");
    assert!(!copy.join("empty").exists() && !copy.join("scratch.tmp").exists());
    assert!(copy.join("hollow").is_dir(), "the empty directory status showed was checkpointed");
}

/// Work that `ws rm` set aside was made on a checkpoint only the removed
/// workspace named: a gc deleted it, and `ws recover` then refused the
/// work. gc on this machine keeps the checkpoints its set-aside work was
/// made on, and says so; the work comes back whole after it.
#[test]
fn gc_keeps_the_checkpoint_that_set_aside_work_was_made_on() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let a = create(&m, "gone");
    std::fs::write(a.dir.join("first.txt"), "checkpointed\n").unwrap();
    let cp = a.checkpoint("only this workspace names it");
    std::fs::write(a.dir.join("later.txt"), "not checkpointed\n").unwrap();
    m.ok(&["ws", "rm", "--force", "gone"]);
    a.umount();
    let aside = m.json(&["ws", "recover"]);
    assert_eq!(aside[0]["checkpoint"], cp["snapshot"], "{aside} {cp}");
    let r = m.json(&["gc", "--grace", "0"]);
    assert_eq!(r["kept_for_set_aside"], 1, "{r}");
    let dir = aside[0]["dir"].as_str().unwrap();
    m.ok(&["ws", "recover", dir, "--as", "back"]);
    let b = WsMount { m: &m, dir: m.dir.path().join("mnt-back") };
    m.ok(&["ws", "resume", "back", b.path(), "--mount"]);
    assert_eq!(std::fs::read(b.dir.join("first.txt")).unwrap(), b"checkpointed\n");
    assert_eq!(std::fs::read(b.dir.join("later.txt")).unwrap(), b"not checkpointed\n");
    // A checkpoint of it goes on from there, its base still in the store.
    let again = b.checkpoint("recovered");
    assert_eq!(again["unchanged"], false, "{again}");
    b.umount();
}

/// A workspace mounted again at another path, its old mount's lease still
/// held (its daemon killed): the lease now names the new mount point. It
/// named the old one, so errors pointed at a directory that was no longer
/// this copy, and a resume into that empty directory could pass for it.
#[test]
fn a_workspace_mounted_again_elsewhere_takes_its_lease_under_the_new_path() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let a = create(&m, "moved");
    std::fs::write(a.dir.join("w.txt"), "work\n").unwrap();
    a.checkpoint("before the move");
    a.kill_daemon();
    m.ok(&["umount", a.path()]);
    let b = WsMount { m: &m, dir: m.dir.path().join("mnt-moved-b") };
    m.ok(&["ws", "resume", "moved", b.path(), "--mount"]);
    assert_eq!(std::fs::read(b.dir.join("w.txt")).unwrap(), b"work\n");
    let lease = std::fs::read(m.store_dir().join("leases/ws/moved")).unwrap();
    let holder = mado_core::object::Lease::decode(&lease).unwrap().holder;
    assert!(holder.contains(&format!(":{}:", b.path())), "{holder}");
    // Elsewhere, and in the old mount point, a resume is refused naming
    // the new mount point.
    std::fs::create_dir_all(&a.dir).unwrap();
    for dir in [m.dir.path().join("plain"), a.dir.clone()] {
        let err = m.fails(&["ws", "resume", "moved", dir.to_str().unwrap(), "--ignore-mount-changes"], 1);
        assert!(err.contains(b.path()), "{err}");
    }
    let cp = b.checkpoint("after the move");
    assert_eq!(cp["unchanged"], true, "{cp}");
    b.umount();
}

/// `ws checkpoint NAME` from outside the mount (as the README shows for a
/// served workspace) checkpoints that workspace's mount on this machine;
/// it said the current directory was not inside a workspace.
#[test]
fn a_mount_is_checkpointed_by_its_workspace_name_from_anywhere() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let a = create(&m, "named");
    std::fs::write(a.dir.join("n.txt"), "by name\n").unwrap();
    let o = m
        .cmd(&["ws", "checkpoint", "named", "-m", "from outside", "--json"])
        .current_dir(m.dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cp: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(cp["unchanged"], false, "{cp}");
    // Another name is not this mount's.
    let o = m.cmd(&["ws", "checkpoint", "other"]).current_dir(m.dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    a.umount();
    // Unmounted, the name finds no mount: the usual error.
    let o = m.cmd(&["ws", "checkpoint", "named"]).current_dir(m.dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not inside a workspace"));
}

/// A read-only mount of a workspace's snapshot shows the mtimes its
/// checkpoint recorded (it showed the snapshot's time for every path).
#[test]
fn a_read_only_mount_of_a_workspace_snapshot_shows_its_mtimes() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "ro-times", "--dir", w.to_str().unwrap()]);
    set_mtime(&w.join("src/lib.rs"), 1_000_000_000);
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    let dir = m.dir.path().join("ro");
    std::fs::create_dir_all(&dir).unwrap();
    m.ok(&["mount", "ws/ro-times", dir.to_str().unwrap()]);
    let g = WsMount { m: &m, dir: dir.clone() };
    let mtime = |p: &Path| std::fs::symlink_metadata(p).unwrap().modified().unwrap();
    assert_eq!(mtime(&dir.join("src/lib.rs")), mtime(&w.join("src/lib.rs")));
    assert_eq!(mtime(&dir.join("README.md")), mtime(&w.join("README.md")));
    assert_eq!(mtime(&dir.join("src")), mtime(&w.join("src")));
    g.umount();
}

/// A sticky directory (mode 1777, as /tmp) with `--allow-other`: another
/// user can neither rename someone's file away nor rename over it, nor
/// remove it (EPERM, as on ext4); the file's owner, the directory's owner
/// and root can (issue #50). The kernel's may_delete decides, with the
/// owners this mount reports.
#[test]
fn a_sticky_directory_keeps_other_users_from_renaming_or_removing_a_file() {
    use std::os::unix::fs::PermissionsExt;
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let dir = m.dir.path().join("mnt-sticky");
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    m.ok(&["ws", "create", "sticky", "--from", "main", "--mount", dir.to_str().unwrap(), "--allow-other"]);
    let mnt = WsMount { m: &m, dir };
    let t = mnt.dir.join("tmp");
    std::fs::create_dir(&t).unwrap();
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // As a uid: status and stderr of a shell line.
    let as_uid = |uid: u32, line: &str| {
        let o = std::process::Command::new("setpriv")
            .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups", "sh", "-c", line])
            .current_dir(&t)
            .output()
            .unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    assert!(as_uid(65533, "echo theirs > theirs && echo also > also").0);
    assert!(as_uid(65534, "echo mine > mine").0);
    for (line, what) in [
        ("mv theirs stolen", "renamed another user's file away"),
        ("mv -f mine theirs", "renamed over another user's file"),
        ("rm -f theirs", "removed another user's file"),
        ("mv also ../also", "moved another user's file out"),
    ] {
        let (ok, err) = as_uid(65534, line);
        assert!(!ok, "{what}: {line}");
        assert!(err.contains("not permitted"), "{what}: {err}");
    }
    assert_eq!(std::fs::read(t.join("theirs")).unwrap(), b"theirs\n");
    assert_eq!(std::fs::read(t.join("mine")).unwrap(), b"mine\n");
    // The file's owner may; so may root, and the directory's owner.
    assert!(as_uid(65533, "mv theirs theirs2").0);
    assert!(as_uid(65534, "mv mine mine2").0);
    assert!(std::process::Command::new("mv").arg(t.join("theirs2")).arg(t.join("by-root")).status().unwrap().success());
    std::os::unix::fs::chown(&t, Some(65532), None).unwrap();
    assert!(as_uid(65532, "mv mine2 by-dir-owner && mv -f also by-dir-owner").0);
    assert_eq!(std::fs::read(t.join("by-dir-owner")).unwrap(), b"also\n");
    mnt.umount();
}

/// The control socket with umask 000 and a runtime folder others may read:
/// the folder is made 0700 again, the socket is 0600, and a process of
/// another user that reaches the socket anyway (a folder and socket opened
/// up by hand) is refused: only the mount's owner and root are answered
/// (issue #44: nobody made root's daemon checkpoint with `force`).
#[test]
fn the_control_socket_is_private_and_answers_only_its_owner_and_root() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let run = m.dir.path().join("run");
    std::fs::create_dir_all(run.join("mado")).unwrap();
    for d in [m.dir.path().to_path_buf(), run.clone(), run.join("mado")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mado = |args: &[&str]| {
        let mut c = m.cmd(args);
        c.env("XDG_RUNTIME_DIR", &run);
        // SAFETY: umask is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let dir = m.dir.path().join("mnt-ctl");
    mado(&["ws", "create", "ctl", "--from", "main", "--mount", dir.to_str().unwrap()]);
    let _mnt = WsMount { m: &m, dir: dir.clone() };
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&run.join("mado")), 0o700, "the runtime folder was left readable by others");
    let socks: Vec<PathBuf> = std::fs::read_dir(run.join("mado"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::symlink_metadata(p).unwrap().file_type().is_socket())
        .collect();
    assert!(!socks.is_empty());
    for s in &socks {
        assert_eq!(mode(s), 0o600, "{} follows the umask", s.display());
    }
    // Opened up by hand: the peer's uid is still checked.
    std::fs::set_permissions(run.join("mado"), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&socks[0], std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); print(s.makefile().readline())",
        socks[0].to_str().unwrap()
    );
    let o = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c", &script])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("only the mount's owner and root"), "{out} {}", String::from_utf8_lossy(&o.stderr));
    mado(&["umount", dir.to_str().unwrap()]);
}

/// What a local filesystem answers and the red team found wrong (issue
/// #44): a time before 1970 is kept to the nanosecond (every pre-1970
/// mtime showed as 1970-01-01, and one set through the mount was stored a
/// second early); statfs reports the upper filesystem's space (every
/// figure was 0, and tools that check free space refused to write);
/// RENAME_WHITEOUT is EINVAL; fallocate preallocates, keeps the size and
/// punches holes (issue #48; it was EOPNOTSUPP in every mode).
#[test]
fn old_times_statfs_whiteout_and_fallocate_answer_as_a_local_filesystem() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "posix");
    let d = mnt.dir.clone();
    let c = |p: &str| std::ffi::CString::new(d.join(p).as_os_str().as_bytes()).unwrap();
    // 1960-01-01 00:00:00.5 UTC.
    let t = libc::timespec { tv_sec: -315_619_200, tv_nsec: 500_000_000 };
    // SAFETY: a valid NUL-terminated path and two timespecs.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c("README.md").as_ptr(), [t, t].as_ptr(), 0) }, 0);
    let md = std::fs::metadata(d.join("README.md")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (-315_619_200, 500_000_000));
    mnt.umount();
    m.ok(&["ws", "resume", "posix", mnt.path(), "--mount"]);
    let md = std::fs::metadata(d.join("README.md")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (-315_619_200, 500_000_000), "after a remount");

    let s = rustix::fs::statvfs(&d).unwrap();
    assert!(s.f_blocks > 0 && s.f_bavail > 0 && s.f_bsize > 0, "statfs: {} blocks, {} free", s.f_blocks, s.f_bavail);

    std::fs::write(d.join("a"), "a").unwrap();
    // SAFETY: valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(libc::AT_FDCWD, c("a").as_ptr(), libc::AT_FDCWD, c("b").as_ptr(), libc::RENAME_WHITEOUT)
    };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EINVAL)));

    let f = std::fs::OpenOptions::new().write(true).open(d.join("a")).unwrap();
    use rustix::fs::FallocateFlags as F;
    rustix::fs::fallocate(&f, F::empty(), 0, 4096).unwrap();
    assert_eq!(std::fs::metadata(d.join("a")).unwrap().len(), 4096);
    rustix::fs::fallocate(&f, F::KEEP_SIZE, 0, 1 << 20).unwrap();
    assert_eq!(std::fs::metadata(d.join("a")).unwrap().len(), 4096);
    rustix::fs::fallocate(&f, F::PUNCH_HOLE | F::KEEP_SIZE, 0, 1).unwrap();
    assert_eq!(std::fs::read(d.join("a")).unwrap(), vec![0u8; 4096]);
    let e = rustix::fs::fallocate(&f, F::COLLAPSE_RANGE, 0, 4096).unwrap_err();
    assert_eq!(e, rustix::io::Errno::OPNOTSUPP);
    drop(f);
    mnt.umount();
}

/// Bytes the files under `dir` take on disk.
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    files_under(dir).iter().filter_map(|p| std::fs::symlink_metadata(p).ok()).map(|m| m.blocks() * 512).sum()
}

/// A 10 GiB file with 1 MiB of data, written in a workspace mount as a
/// sparse file: its checkpoint uploads and caches about the 1 MiB, a
/// resume writes it as a sparse file again, and a read-only mount of the
/// checkpoint reads its holes as zeros (issue #48.2).
#[test]
fn a_sparse_file_checkpoints_uploads_and_resumes_as_its_data() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "sparse");
    let (size, at) = (10u64 << 30, (3u64 << 30) + 12_345);
    let data = pseudo_random(1 << 20, 48);
    {
        let f = std::fs::File::create(mnt.dir.join("disk.img")).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(&data, at).unwrap();
        f.sync_all().unwrap();
    }
    // The upper file's holes show through the mount.
    let f = std::fs::File::open(mnt.dir.join("disk.img")).unwrap();
    let first = rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(0)).unwrap();
    assert!(first > 2 << 30 && first <= at, "data starts at {first}");
    drop(f);
    let (store0, cache0) = (disk_bytes(&m.store_dir()), disk_bytes(&m.cache_dir()));
    mnt.checkpoint("a sparse file");
    let (store1, cache1) = (disk_bytes(&m.store_dir()), disk_bytes(&m.cache_dir()));
    assert!(store1 - store0 < 4 << 20, "the store grew by {} bytes for 1 MiB of data", store1 - store0);
    assert!(cache1.saturating_sub(cache0) < 4 << 20, "the cache grew by {} bytes", cache1 - cache0);
    mnt.umount();

    // A resume writes the holes as holes.
    let w = m.dir.path().join("resumed");
    m.ok(&["ws", "resume", "sparse", w.to_str().unwrap()]);
    let img = w.join("disk.img");
    let md = std::fs::metadata(&img).unwrap();
    assert_eq!(md.len(), size);
    assert!(md.blocks() * 512 < 4 << 20, "the resumed file takes {} bytes on disk", md.blocks() * 512);
    let f = std::fs::File::open(&img).unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, at).unwrap();
    assert!(back == data, "the data came back changed");
    let mut hole = vec![1u8; 1 << 16];
    f.read_exact_at(&mut hole, 5 << 30).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    let first = rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(0)).unwrap();
    assert!(first > 2 << 30 && first <= at, "data starts at {first}");
    // Touched, so hashed again: the resumed copy is what was checkpointed.
    drop(f);
    set_mtime(&img, 1_000_000_000);
    let st = m.json(&["ws", "status", "--dir", w.to_str().unwrap()]);
    assert_eq!(st["modified"].as_array().map(Vec::len), Some(0), "{st}");

    // A read-only mount of the checkpoint reads holes as zeros and the
    // data as it was, fetching no hole.
    let ro = m.dir.path().join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    m.ok(&["mount", "ws/sparse", ro.to_str().unwrap()]);
    let g = WsMount { m: &m, dir: ro.clone() };
    let f = std::fs::File::open(ro.join("disk.img")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), size);
    let mut edge = vec![1u8; 3 << 20];
    f.read_exact_at(&mut edge, at - (1 << 20)).unwrap();
    assert!(
        edge[..1 << 20].iter().all(|&b| b == 0)
            && edge[1 << 20..2 << 20] == data[..]
            && edge[2 << 20..].iter().all(|&b| b == 0)
    );
    f.read_exact_at(&mut hole, size - (1 << 16)).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    // And the manifest's holes show through a mount of the checkpoint.
    let first = rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(0)).unwrap();
    assert!(first > 2 << 30 && first <= at, "data starts at {first}");
    let next_hole = rustix::fs::seek(&f, rustix::fs::SeekFrom::Hole(at)).unwrap();
    assert!(next_hole >= at + (1 << 20) && next_hole < at + (4 << 20), "the hole after the data starts at {next_hole}");
    assert_eq!(rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(next_hole)), Err(rustix::io::Errno::NXIO));
    drop(f);
    g.umount();
}

/// `mado restart DIR` hands a workspace mount to a new daemon while
/// processes use it: a writer appending all along, a file held open for
/// writing, one held open for reading (a lower file), a directory held
/// open, and a file made and kept open. None of them sees an error or a
/// lost byte; inode numbers stay; the new daemon checkpoints, unmounts and
/// gives the lease back like any other. A new daemon that cannot start
/// leaves the old one serving, and nothing is lost either.
#[test]
fn a_restart_hands_the_mount_to_a_new_daemon_and_nothing_using_it_notices() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "restarted");
    let d = mnt.dir.clone();
    let pid_of = || m.json(&["stats", mnt.path()])["pid"].as_u64().unwrap();
    let first = pid_of();
    let mut writing = std::fs::OpenOptions::new().create(true).append(true).open(d.join("held.txt")).unwrap();
    writing.write_all(b"before\n").unwrap();
    let mut reading = std::fs::File::open(d.join("src/deep/er/still.txt")).unwrap();
    let dir = std::fs::File::open(d.join("src")).unwrap();
    let mut made = std::fs::File::create(d.join("src/made.txt")).unwrap();
    let ino = std::fs::metadata(d.join("src/lib.rs")).unwrap().ino();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appender = {
        let (p, stop) = (d.join("log.txt"), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 200 {
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).unwrap();
                writeln!(f, "line {n}").unwrap();
                n += 1;
            }
            n
        })
    };
    for _ in 0..3 {
        let out = m.json(&["restart", mnt.path()]);
        assert_ne!(out["pid"].as_u64(), out["from_pid"].as_u64(), "{out}");
        assert_eq!(pid_of(), out["pid"].as_u64().unwrap(), "the new daemon answers for the mount");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let lines = appender.join().unwrap();
    let second = pid_of();
    assert_ne!(first, second);
    wait_gone(first);
    assert!(!Path::new(&format!("/proc/{first}")).exists(), "the old daemon exited");

    writing.write_all(b"after\n").unwrap();
    writing.sync_all().unwrap();
    let mut s = String::new();
    reading.read_to_string(&mut s).unwrap();
    assert_eq!(s, "deep\n");
    made.write_all(b"made, then written by the new daemon\n").unwrap();
    made.rewind().unwrap();
    let names: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&"made.txt".to_string()) && names.contains(&"lib.rs".to_string()), "{names:?}");
    assert_eq!(std::fs::metadata(d.join("src/lib.rs")).unwrap().ino(), ino);
    assert_eq!(std::fs::read_to_string(d.join("held.txt")).unwrap(), "before\nafter\n");
    let log = std::fs::read_to_string(d.join("log.txt")).unwrap();
    let want: String = (0..lines).map(|n| format!("line {n}\n")).collect();
    assert!(log == want, "{} lines of {lines} came through in order", log.lines().count());

    // A program that is not a daemon: the old one goes on serving.
    let sock = mado_mount::control::socket_path(&mado_mount::control::absolute(&d).unwrap()).unwrap();
    let op = mado_mount::protocol::Op::HandOver { exe: "/bin/false".into() };
    let r = mado_mount::control::request(&sock, &mado_mount::protocol::Request::new(op), Duration::from_secs(60));
    assert!(matches!(r, Ok(mado_mount::protocol::Reply::Error { .. })), "{r:?}");
    assert_eq!(pid_of(), second);
    writing.write_all(b"still\n").unwrap();
    assert_eq!(std::fs::read_to_string(d.join("held.txt")).unwrap(), "before\nafter\nstill\n");
    drop((writing, reading, dir, made));

    let c = mnt.checkpoint("after three restarts");
    assert!(c["files_read"].as_u64().unwrap() >= 3, "{c}");
    mnt.umount();
    wait_gone(second);
    let elsewhere = m.dir.path().join("elsewhere");
    m.ok(&["ws", "resume", "restarted", elsewhere.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(elsewhere.join("held.txt")).unwrap(), "before\nafter\nstill\n");
    assert_eq!(std::fs::read_to_string(elsewhere.join("log.txt")).unwrap(), want);
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("src/made.txt")).unwrap(),
        "made, then written by the new daemon\n"
    );
}

/// kill -9 of a workspace mount's daemon: its keeper starts a new daemon
/// on the same kernel connection, so the mount stays mounted and what uses
/// it goes on: a file held open for writing (its fsynced lines all there),
/// one held for reading, a held directory, inode numbers, and a directory
/// first looked into after the last save (its numbers come from the log).
/// A restart in between passes the keeper on. An unmount ends the keeper
/// too, and the workspace mounts again at once (its lock free).
#[test]
fn a_killed_daemon_is_replaced_by_its_keeper_and_nothing_using_the_mount_is_lost() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = create(&m, "kept");
    let d = mnt.dir.clone();
    let stats = || m.json(&["stats", mnt.path()]);
    let first = stats();
    let keeper = first["keeper_pid"].as_u64().expect("a workspace mount made as root has a keeper");
    let mut writing = std::fs::OpenOptions::new().create(true).append(true).open(d.join("held.txt")).unwrap();
    let mut want = String::new();
    let mut pid = first["pid"].as_u64().unwrap();
    // Requests in flight at each kill (this kernel sends a dead daemon's
    // unanswered requests again: none fails).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appender = {
        let (p, stop) = (d.join("log.txt"), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 200 {
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).unwrap();
                writeln!(f, "line {n}").unwrap();
                n += 1;
            }
            n
        })
    };
    for round in 0..4 {
        let line = format!("round {round}\n");
        writing.write_all(line.as_bytes()).unwrap();
        writing.sync_all().unwrap();
        want.push_str(&line);
        if round == 2 {
            let out = m.json(&["restart", mnt.path()]);
            pid = out["pid"].as_u64().unwrap();
        }
        // Looked into after the state's last save: numbered in the log.
        let mut reading = std::fs::File::open(d.join("src/deep/er/still.txt")).unwrap();
        let dir = std::fs::File::open(d.join("src/deep")).unwrap();
        let ino = std::fs::metadata(d.join("src/lib.rs")).unwrap().ino();
        // Made and renamed a moment before the kill (no save since): the
        // log brings them back.
        std::fs::create_dir(d.join(format!("new{round}"))).unwrap();
        std::fs::write(d.join(format!("new{round}/f.tmp")), format!("made {round}\n")).unwrap();
        std::fs::rename(d.join(format!("new{round}/f.tmp")), d.join(format!("new{round}/f"))).unwrap();
        // A file of the snapshot written for the first time (copied up).
        let lib = std::fs::read_to_string(d.join("src/lib.rs")).unwrap();
        std::fs::OpenOptions::new().append(true).open(d.join("src/lib.rs")).unwrap().write_all(b"// more\n").unwrap();
        std::fs::set_permissions(d.join("run.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o700 - round))
            .unwrap();
        std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
        wait_gone(pid);
        let mut now = None;
        eventually("a new daemon serves the mount", || {
            now = m.try_json(&["stats", mnt.path()]).and_then(|s| s["pid"].as_u64()).filter(|p| *p != pid);
            now.is_some()
        });
        pid = now.unwrap();
        assert_eq!(stats()["keeper_pid"].as_u64(), Some(keeper), "the same keeper keeps the mount");
        let mut s = String::new();
        reading.rewind().unwrap();
        reading.read_to_string(&mut s).unwrap();
        assert_eq!(s, "deep\n", "a file held open for reading");
        let names: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.contains(&"er".to_string()), "a held directory lists: {names:?}");
        assert_eq!(std::fs::metadata(d.join("src/lib.rs")).unwrap().ino(), ino);
        assert_eq!(std::fs::read_to_string(d.join(format!("new{round}/f"))).unwrap(), format!("made {round}\n"));
        assert!(!d.join(format!("new{round}/f.tmp")).exists(), "the rename was made again");
        assert_eq!(std::fs::read_to_string(d.join("src/lib.rs")).unwrap(), format!("{lib}// more\n"));
        let mode = std::fs::metadata(d.join("run.sh")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700 - round, "a chmod just before the kill");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let lines = appender.join().expect("no write failed across the kills");
    let log = std::fs::read_to_string(d.join("log.txt")).unwrap();
    let all: String = (0..lines).map(|n| format!("line {n}\n")).collect();
    assert!(log == all, "{} lines of {lines} came through in order", log.lines().count());
    writing.write_all(b"after\n").unwrap();
    writing.sync_all().unwrap();
    want.push_str("after\n");
    drop(writing);
    assert_eq!(std::fs::read_to_string(d.join("held.txt")).unwrap(), want);
    let c = mnt.checkpoint("after the kills");
    assert_eq!(c["unchanged"], false, "{c}");
    mnt.umount();
    wait_gone(pid);
    wait_gone(keeper);
    assert!(!Path::new(&format!("/proc/{keeper}")).exists(), "the keeper ended with the mount");
    m.ok(&["ws", "resume", "kept", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read_to_string(d.join("held.txt")).unwrap(), want);
    mnt.umount();
}

/// `ws rm` takes the flat copy of the workspace's last checkpoint's times
/// out of the disk cache (kept there for the next mount of that
/// checkpoint, which no one will make): a hundred agents' removed
/// workspaces left a hundred of them. Another workspace's stays.
#[test]
fn ws_rm_drops_the_kept_times_of_its_last_checkpoint() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let flat = || -> Vec<PathBuf> {
        let mut v = files_under(&m.cache_dir().join("stat").join("flat"));
        v.sort();
        v
    };
    let (a, b) = (create(&m, "gone"), create(&m, "stays"));
    std::fs::write(a.dir.join("a.txt"), "a\n").unwrap();
    a.checkpoint("a");
    std::fs::write(b.dir.join("b.txt"), "b\n").unwrap();
    b.checkpoint("b");
    a.umount();
    b.umount();
    let both = flat();
    assert_eq!(both.len(), 2, "{both:?}");
    m.ok(&["ws", "rm", "gone"]);
    let left = flat();
    assert_eq!(left.len(), 1, "{left:?}");
    // The one left is the other workspace's: it mounts with it.
    let b = WsMount { m: &m, dir: m.dir.path().join("mnt-stays-again") };
    m.ok(&["ws", "resume", "stays", b.path(), "--mount"]);
    assert_eq!(std::fs::read(b.dir.join("b.txt")).unwrap(), b"b\n");
    assert_eq!(flat(), left);
    b.umount();
}
