//! Workspaces as read-write FUSE mounts, through the `mado` binary: the
//! edits of the issue (and more) through the mount, a checkpoint that
//! shares every tree with a plain directory making the same edits, a resume
//! elsewhere that is byte-, mode- and mtime-identical to the mount, a
//! checkpoint cost that follows the changes, and changes that survive an
//! unmount and a killed daemon.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

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
}

fn create<'a>(m: &'a Mado, name: &str) -> WsMount<'a> {
    let dir = m.dir.path().join(format!("mnt-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
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

fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
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
    assert!(p["upload"]["trees_uploaded"].as_u64().unwrap() >= 1, "{p}");
    let cp = mnt.checkpoint("through the mount");
    assert_eq!(cp["unchanged"], false, "{cp}");
    // Same content, so every file and tree already exists: only the stat
    // object (the mount's own mtimes) is new.
    assert_eq!(cp["upload"]["trees_uploaded"], 0, "{cp}");
    assert!(cp["upload"]["objects_uploaded"].as_u64().unwrap() <= 1, "{cp}");
    assert_eq!(cp["packs_uploaded"], 0, "{cp}");

    // Elsewhere, from an empty cache: identical to the mount, mtimes too.
    let other_cache = m.dir.path().join("other-cache");
    let w2 = m.dir.path().join("w2");
    let o =
        m.cmd(&["ws", "resume", "mounted", w2.to_str().unwrap()]).env("MADO_CACHE_DIR", &other_cache).output().unwrap();
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
    assert!(one["upload"]["objects_uploaded"].as_u64().unwrap() <= 5, "{one}");
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
    let pid = m.json(&["stats", mnt.path()])["pid"].as_u64().expect("the daemon reports its pid");
    std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    m.ok(&["ws", "resume", "keep", mnt.path(), "--mount"]);
    assert_eq!(std::fs::read(mnt.dir.join("b.txt")).unwrap(), b"b\n");

    // What a mount refuses: hard links, FIFOs, non-empty rmdir, a
    // directory into itself.
    let d = &mnt.dir;
    assert_eq!(errno_of(std::fs::hard_link(d.join("a.txt"), d.join("h"))), Some(1), "EPERM");
    assert_eq!(errno_of(std::fs::remove_dir(d.join("src2"))), Some(39), "ENOTEMPTY");
    assert_eq!(errno_of(std::fs::rename(d.join("src2"), d.join("src2/in"))), Some(22), "EINVAL");

    // Another working copy can read, but not checkpoint, while the mount
    // holds the lease.
    let other = m.dir.path().join("other");
    let r = m.json(&["ws", "resume", "keep", other.to_str().unwrap()]);
    assert!(r["lease_warning"].as_str().unwrap().contains("mnt-keep"), "{r}");
    std::fs::write(other.join("c.txt"), "c\n").unwrap();
    let err = m.fails(&["ws", "checkpoint", "--dir", other.to_str().unwrap()], 1);
    assert!(err.contains("leased by"), "{err}");

    // Another workspace's name is refused before anything is uploaded.
    let err = m.fails(&["ws", "checkpoint", "nope", "--dir", mnt.path()], 1);
    assert!(err.contains("is a mount of workspace keep, not nope"), "{err}");
    let cp = mnt.checkpoint("kept");
    assert_eq!(cp["unchanged"], false, "{cp}");
    assert!(m.ok(&["ls", "ws/keep", "vendor2"]).contains("gitlink"), "the gitlink is kept");
    let w = m.dir.path().join("w");
    let o = m
        .cmd(&["ws", "resume", "keep", w.to_str().unwrap()])
        .env("MADO_CACHE_DIR", m.dir.path().join("c2"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_state(&mnt.dir, &w);
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
