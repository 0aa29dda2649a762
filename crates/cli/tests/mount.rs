//! Real FUSE mounts through the `mado` binary. Skipped where FUSE is not
//! usable, unless MADO_REQUIRE_FUSE=1 (set by `make test`).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;

/// A mount that is always unmounted, even when the test fails.
struct Mounted<'a> {
    m: &'a Mado,
    dir: PathBuf,
    stderr: String,
}

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fusermount3").arg("-uz").arg(&self.dir).output();
    }
}

fn mount<'a>(m: &'a Mado, spec: &str, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Mounted<'a> {
    let dir = m.dir.path().join(name);
    // Fails harmlessly on a mount point whose daemon was killed.
    let _ = std::fs::create_dir_all(&dir);
    let mut args = vec!["mount", spec, dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut c = m.cmd(&args);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "mount failed: {stderr}");
    assert_eq!(mount_type(&dir).as_deref(), Some("fuse.mado"), "the type /proc/mounts shows");
    Mounted { m, dir, stderr }
}

/// The type /proc/mounts gives the mount at `dir`.
fn mount_type(dir: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let want = dir.to_str().unwrap().replace(' ', "\\040");
    mounts.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(1) == Some(&want.as_str())).then(|| f[2].to_string())
    })
}

/// Control sockets live in the runtime directory, logs in the state
/// directory: a cache at a long path (a socket's path must fit in 108
/// bytes) mounts, answers and unmounts.
#[test]
fn a_cache_at_a_long_path_still_mounts() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let long = m.dir.path().join("c".repeat(60)).join("d".repeat(60));
    let long = long.to_str().unwrap();
    let mnt = mount(&m, "main", "mnt", &[], &[("MADO_CACHE_DIR", long)]);
    assert_eq!(std::fs::read(mnt.dir.join("README.md")).unwrap(), b"# fixture\n");
    assert!(mnt.stats()["pid"].as_u64().is_some());
    let logs: Vec<_> = std::fs::read_dir(m.home().join(".local/state/mado/logs")).unwrap().collect();
    assert_eq!(logs.len(), 1, "the daemon's log is in the state directory");
    let log_file = logs[0].as_ref().unwrap().path();
    drop(mnt);
    // Timestamped, levelled lines (tracing): when it served, and when it ended.
    let log = std::fs::read_to_string(&log_file).unwrap();
    let serving = log.lines().find(|l| l.contains("serving main at")).unwrap_or_else(|| panic!("{log}"));
    assert!(serving.starts_with("20") && serving.contains("Z ") && serving.contains(" INFO "), "{serving}");
}

/// A mount that fails (no such ref) leaves no mount point it made behind;
/// one that was there stays.
#[test]
fn a_failed_mount_removes_the_mount_point_it_made() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let made = m.dir.path().join("new-mnt");
    let err = m.fails(&["mount", "nope", made.to_str().unwrap()], 1);
    assert!(err.contains("nope"), "{err}");
    assert!(!made.exists(), "the failed mount left {} behind", made.display());
    let there = m.dir.path().join("old-mnt");
    std::fs::create_dir(&there).unwrap();
    m.fails(&["mount", "nope", there.to_str().unwrap()], 1);
    assert!(there.is_dir());
}

/// mado called as `mount.fuse.mado` (what mount(8) runs for an fstab
/// line of type fuse.mado) takes mount(8)'s arguments and options.
#[test]
fn mado_as_mount_fuse_mado_takes_mount_8_arguments() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let helper = m.dir.path().join("mount.fuse.mado");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_mado"), &helper).unwrap();
    let dir = m.dir.path().join("fstab-mnt");
    std::fs::create_dir_all(&dir).unwrap();
    let opts = format!("rw,noauto,nofail,_netdev,x-systemd.automount,remote={},read_timeout=20", m.remote);
    let mut c = std::process::Command::new(&helper);
    c.args(["main", dir.to_str().unwrap(), "-n", "-o", &opts]).env("HOME", m.home()).env_remove("MADO_REMOTE_ADDR");
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mount_type(&dir).as_deref(), Some("fuse.mado"));
    // The source findmnt and df show is what is mounted.
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts.lines().find(|l| l.split(' ').nth(1) == dir.to_str()).unwrap();
    assert!(line.starts_with("main "), "{line}");
    assert_eq!(std::fs::read(dir.join("src/lib.rs")).unwrap(), std::fs::read(repo.join("src/lib.rs")).unwrap());
    m.ok(&["umount", dir.to_str().unwrap()]);
    assert_eq!(mount_type(&dir), None);
    assert!(m.fails(&["umount", dir.to_str().unwrap()], 1).contains("is not mounted"));
    // An option it does not know is refused before anything is mounted.
    let o = std::process::Command::new(&helper)
        .args(["main", dir.to_str().unwrap(), "-o", "colour=red"])
        .env("HOME", m.home())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown option \"colour=red\""));
    assert_eq!(mount_type(&dir), None);
}

impl Mounted<'_> {
    fn stats(&self) -> serde_json::Value {
        self.m.json(&["stats", self.dir.to_str().unwrap()])
    }
    fn gets(&self) -> u64 {
        let s = self.stats();
        s["remote"]["gets"].as_u64().unwrap() + s["remote"]["ranged_gets"].as_u64().unwrap()
    }
    fn status(&self) -> serde_json::Value {
        self.m.json(&["pack-status", self.dir.to_str().unwrap()])
    }
}

/// The store goes away while a mount reads, then comes back (MinIO
/// behind a relay that breaks every connection): a read during the outage
/// fails (EIO), and the same file, and the others, read right once the
/// store answers again. They failed for as long as the mount lived: the
/// pack whose GET failed was remembered as bad, and a packs-only store
/// has no object alone to fall back on.
#[test]
fn a_mount_reads_again_once_its_store_is_back() {
    if !fuse_usable() {
        return;
    }
    let Some(base) = s3_base() else { return };
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("MinIO's endpoint with MADO_TEST_S3_URL");
    let gate = Gate::new(endpoint.trim_start_matches("http://").trim_end_matches('/'));
    let m = Mado::s3(&base);
    let repo = dense_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    empty_cache(&m);
    let via_gate = format!("http://127.0.0.1:{}", gate.port);
    let mnt = mount(&m, "main", "mnt", &[], &[("AWS_ENDPOINT_URL", &via_gate)]);
    gate.close();
    let f = mnt.dir.join("dense/f007.txt");
    let e = std::fs::read(&f).expect_err("the store is away");
    assert_eq!(e.raw_os_error(), Some(5), "EIO: {e}");
    gate.open();
    assert_eq!(std::fs::read(&f).unwrap(), std::fs::read(repo.join("dense/f007.txt")).unwrap());
    assert_same_content(&mnt.dir.join("dense"), &repo.join("dense"));
}

/// Content, kind and exec bit of everything under `root` (a mount is
/// read-only, so its write bits differ from a checkout's by design).
fn assert_same_content(a: &Path, b: &Path) {
    let (x, y) = (snapshot_dir(a), snapshot_dir(b));
    assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "different paths");
    for (k, v) in &x {
        let w = &y[k];
        let name = String::from_utf8_lossy(k);
        assert_eq!(v.0, w.0, "{name}: kind");
        assert_eq!(v.1 & 0o100, w.1 & 0o100, "{name}: exec bit");
        assert!(v.2 == w.2, "{name}: content");
    }
}

fn walk_and_read(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            n += walk_and_read(&e.path());
        } else if t.is_file() {
            std::fs::read(e.path()).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn mounted_snapshot_equals_git_clone() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let clone = m.dir.path().join("clone");
    git(m.dir.path(), &["clone", "-q", repo.to_str().unwrap(), clone.to_str().unwrap()]);
    empty_cache(&m);
    let mnt = mount(&m, "main", "mnt", &[], &[]);
    assert_same_content(&clone, &mnt.dir);
    assert_eq!(std::fs::read_link(mnt.dir.join("src/escape")).unwrap(), Path::new("../../../../../etc/passwd"));
    assert!(std::fs::metadata(mnt.dir.join("run.sh")).unwrap().permissions().mode() & 0o111 != 0);
    // Read-only: every kind of change is EROFS, as on a read-only mount.
    let d = &mnt.dir;
    let erofs = Some(30);
    assert_eq!(errno_of(std::fs::write(d.join("new"), b"x")), erofs, "create");
    assert_eq!(errno_of(std::fs::OpenOptions::new().write(true).open(d.join("README.md"))), erofs, "open for write");
    assert_eq!(errno_of(std::fs::create_dir(d.join("dir"))), erofs, "mkdir");
    assert_eq!(errno_of(std::fs::remove_file(d.join("README.md"))), erofs, "unlink");
    assert_eq!(errno_of(std::fs::remove_dir(d.join("src"))), erofs, "rmdir");
    assert_eq!(errno_of(std::fs::rename(d.join("README.md"), d.join("R"))), erofs, "rename");
    assert_eq!(errno_of(std::os::unix::fs::symlink("x", d.join("l"))), erofs, "symlink");
    assert_eq!(errno_of(std::fs::hard_link(d.join("README.md"), d.join("h"))), erofs, "link");
    let perm = std::fs::Permissions::from_mode(0o600);
    assert_eq!(errno_of(std::fs::set_permissions(d.join("README.md"), perm)), erofs, "chmod");
    assert_eq!(std::fs::read(d.join("README.md")).unwrap(), b"# fixture\n", "nothing changed");
    // Warm: a second mount reads everything from the cache, no GET at all
    // after it is up (passthrough serves the cached blobs).
    drop(mnt);
    let mnt = mount(&m, "main", "mnt2", &[], &[]);
    let before = mnt.gets();
    assert_same_content(&clone, &mnt.dir);
    assert_eq!(mnt.gets(), before);
}

/// A local store holding `dense_repo`, imported with `flags`, and an empty
/// cache; `None` where FUSE cannot be used.
fn dense_store(flags: &[&str]) -> Option<Mado> {
    if !fuse_usable() {
        return None;
    }
    let m = Mado::local();
    let repo = dense_repo(m.dir.path());
    let mut args = vec!["import-git", repo.to_str().unwrap()];
    args.extend_from_slice(flags);
    m.ok(&args);
    let _ = std::fs::remove_dir_all(m.cache_dir());
    Some(m)
}

#[test]
fn cold_walk_of_a_packed_subtree_is_one_get() {
    let Some(m) = dense_store(&[]) else { return };
    let mnt = mount(&m, "main", "mnt", &[], &[]);
    assert_eq!(mnt.status()["status"]["via"], "derived-pointer");
    let before = mnt.gets();
    assert_eq!(walk_and_read(&mnt.dir.join("dense")), 300);
    let s = mnt.stats();
    assert_eq!(mnt.gets() - before, 1, "one ranged GET for the whole subtree: {s}");
    assert_eq!(s["remote"]["ranged_gets"], 1);
    // Read through packs, no file could be passthrough: no OPEN reaches
    // the daemon after the first (answered ENOSYS), so 300 files cost no
    // OPEN and RELEASE each.
    assert!(s["opens"].as_u64().unwrap() <= 1, "{s}");
}

/// A directory's first listing starts the download of its files' pack
/// before any read (so a walk's first read waits less than a round trip),
/// and the walk that follows reads through that same one GET. A listing
/// of a cached pack's directory, or of an unpacked store, fetches nothing.
#[test]
fn listing_a_cold_packed_directory_starts_its_pack() {
    let Some(m) = dense_store(&[]) else { return };
    let mnt = mount(&m, "main", "mnt", &[], &[]);
    let before = mnt.gets();
    assert_eq!(mnt.stats()["packs"]["warmed_packs"], 0);
    assert_eq!(std::fs::read_dir(mnt.dir.join("dense")).unwrap().count(), 300);
    // No file was opened: the GET is the listing's doing.
    let t = Instant::now();
    while mnt.gets() == before && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = mnt.stats();
    assert_eq!(mnt.gets() - before, 1, "the listing started the pack: {s}");
    assert_eq!(s["packs"]["warmed_packs"], 1, "{s}");
    assert_eq!(s["reads"], 0, "{s}");
    assert_eq!(walk_and_read(&mnt.dir.join("dense")), 300);
    assert_eq!(mnt.gets() - before, 1, "the walk read through the listing's GET: {}", mnt.stats());
    // (umount waits for the daemon, which finishes writing the pack first.)
    m.ok(&["umount", mnt.dir.to_str().unwrap()]);
    // Warm: a new mount lists and reads with no GET and starts nothing.
    let mnt = mount(&m, "main", "mnt2", &[], &[]);
    let before = mnt.gets();
    assert_eq!(walk_and_read(&mnt.dir.join("dense")), 300);
    assert_eq!((mnt.gets() - before, mnt.stats()["packs"]["warmed_packs"].as_u64()), (0, Some(0)));
}

/// A directory holding only directories starts the pack of the first file
/// a top-down walk reaches below it: the walk of `src/deep` (only `er/`,
/// which holds `still.txt`) gets its GET going on its first listing, not
/// on the listing of `er/`.
#[test]
fn listing_a_directory_of_directories_starts_the_pack_of_the_file_below() {
    let Some(m) = dense_store(&[]) else { return };
    let mnt = mount(&m, "main", "mnt", &[], &[]);
    let before = mnt.gets();
    let names: Vec<_> = std::fs::read_dir(mnt.dir.join("src/deep")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["er"]);
    let t = Instant::now();
    while mnt.gets() == before && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = mnt.stats();
    assert_eq!(
        (mnt.gets() - before, s["packs"]["warmed_packs"].as_u64(), s["reads"].as_u64()),
        (1, Some(1), Some(0)),
        "{s}"
    );
    assert_eq!(std::fs::read(mnt.dir.join("src/deep/er/still.txt")).unwrap(), b"deep\n");
    assert_eq!(mnt.gets() - before, 1, "the read came through the listing's GET: {}", mnt.stats());
}

/// Readers racing over the same files of a cold pack: some opens find the
/// content in memory before its cache file is written (cached mode), later
/// ones find the cache file (passthrough). The kernel fails with EIO an
/// inode open in both modes at once, so every handle of an inode must
/// follow its first one. (The benchmark's concurrent readers found this.)
#[test]
fn concurrent_readers_of_a_cold_pack_never_see_eio() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = dense_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    for round in 0..4 {
        let _ = std::fs::remove_dir_all(m.cache_dir());
        let mnt = mount(&m, "main", &format!("mnt{round}"), &[], &[]);
        let before = mnt.gets();
        let d = mnt.dir.join("dense");
        let mut names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        let errors = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for i in 0..4 {
                let (names, errors) = (&names, &errors);
                s.spawn(move || {
                    for j in 0..200 {
                        if let Err(e) = std::fs::read(&names[(i * 40 + j) % names.len()]) {
                            eprintln!("{e}");
                            errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(errors.into_inner(), 0, "round {round}: reads failed");
        // One flight for all readers: one ranged GET, or two when the
        // reader that started it wanted a member 512 KiB or more into the
        // pack (a split fetch, fetch/packs.rs; whichever thread reaches the
        // daemon first decides, so either happens; a clean-clone CI run saw
        // the second).
        let st = mnt.stats();
        let gets = mnt.gets() - before;
        assert!((1..=2).contains(&gets), "one flight for all readers, not a GET each: {gets} GETs; {st}");
        // The daemon must be gone before the next round wipes the cache it
        // may still be writing into.
        let pid = mnt.stats()["pid"].as_u64().unwrap();
        m.ok(&["umount", mnt.dir.to_str().unwrap()]);
        let t = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn cold_walk_of_an_unpacked_subtree_is_one_get_per_file() {
    let Some(m) = dense_store(&["--no-packs"]) else { return };
    let mnt = mount(&m, "main", "mnt", &[], &[]);
    assert!(mnt.stderr.contains("cold reads are per-file — run `mado pack -r main`"), "{}", mnt.stderr);
    assert_eq!(mnt.status()["status"]["state"], "no-index");
    let before = mnt.gets();
    // A listing fetches the directory's tree, and no file: nothing is packed.
    assert_eq!(std::fs::read_dir(mnt.dir.join("dense")).unwrap().count(), 300);
    assert_eq!(mnt.gets() - before, 1);
    assert_eq!(mnt.stats()["packs"]["warmed_packs"], 0);
    assert_eq!(walk_and_read(&mnt.dir.join("dense")), 300);
    // One per file, plus the directory's own tree.
    assert_eq!(mnt.gets() - before, 300 + 1);
    // Loose objects can back a passthrough open: every open reaches the daemon.
    assert!(mnt.stats()["opens"].as_u64().unwrap() >= 300);
}

fn index_files(m: &Mado) -> Vec<PathBuf> {
    std::fs::read_dir(m.store_dir().join("packs/index")).unwrap().map(|e| e.unwrap().path()).collect()
}

#[test]
fn pack_status_reports_each_reason() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    // Objects alone in the store, then packs: a mount without a usable
    // index reads them (a packs-first import keeps its trees only in the
    // index, and no longer stages them in this cache).
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    m.ok(&["pack", "--recursive"]);
    // The local copies of indexes: compressed (the local pointer) and flat.
    let local_copies = [m.cache_dir().join("packs/index"), m.cache_dir().join("packs/flat")];
    let forget_local = || {
        for d in &local_copies {
            let _ = std::fs::remove_dir_all(d);
        }
    };

    // Attached, via the local pointer (`mado pack` kept a copy).
    let s = mount(&m, "main", "a", &[], &[]).status();
    assert_eq!((s["attached"].clone(), s["status"]["via"].clone()), (true.into(), "local-pointer".into()), "{s}");
    assert_eq!(s["status"]["mode"], "recursive");
    assert_eq!(s["status"]["version"], 1);
    assert!(s["status"]["dirs"].as_u64().unwrap() >= 4);
    assert!(s["message"].as_str().unwrap().contains("local pointer"));

    // Attached, via the derived pointer.
    forget_local();
    let s = mount(&m, "main", "b", &[], &[]).status();
    assert_eq!(s["status"]["via"], "derived-pointer", "{s}");

    // Undecodable.
    forget_local();
    let idx = index_files(&m).pop().unwrap();
    let good = std::fs::read(&idx).unwrap();
    std::fs::write(&idx, b"MADI\x01not an index").unwrap();
    let s = mount(&m, "main", "c", &[], &[]).status();
    assert_eq!(s["status"]["state"], "undecodable", "{s}");

    // Index for another tree: a second commit's index under the first's key.
    std::fs::write(&idx, &good).unwrap();
    std::fs::write(repo.join("README.md"), "changed\n").unwrap();
    git(&repo, &["commit", "-qam", "second"]);
    m.ok(&["import-git", repo.to_str().unwrap(), "--ref", "second"]);
    forget_local();
    let other = index_files(&m).into_iter().find(|p| *p != idx).unwrap();
    std::fs::copy(&other, &idx).unwrap();
    let s = mount(&m, "main", "d", &[], &[]).status();
    assert_eq!(s["status"]["state"], "other-tree", "{s}");

    // No index built.
    std::fs::remove_file(&idx).unwrap();
    let s = mount(&m, "main", "e", &[], &[]).status();
    assert_eq!(s["status"]["state"], "no-index", "{s}");

    // Swept: the index is found (local pointer) but its packs are gone.
    std::fs::write(&idx, &good).unwrap();
    let _ = mount(&m, "main", "f", &[], &[]).status(); // brings the local pointer back
    for d in std::fs::read_dir(m.store_dir().join("packs")).unwrap() {
        let d = d.unwrap().path();
        if d.file_name().unwrap() != "index" {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
    empty_cache(&m);
    let mnt = mount(&m, "main", "g", &[], &[]);
    // Nothing asks the store about the packs before a read needs one: a
    // HEAD of every pack at each mount cost as many requests as the index
    // has packs.
    let st = mnt.stats();
    assert_eq!(st["remote"]["heads"], 0, "{st}");
    assert_eq!(mnt.status()["status"]["state"], "attached", "before a read: {}", mnt.status());
    // Reads still work, per object, and the first one found the packs gone.
    assert_eq!(std::fs::read(mnt.dir.join("src/lib.rs")).unwrap(), b"pub fn f() {}\n");
    let s = mnt.status();
    assert_eq!(s["status"]["state"], "swept", "{s}");
    assert!(s["message"].as_str().unwrap().contains("swept"), "{s}");

    // Outside any mount: a user error with a hint.
    let err = m.fails(&["pack-status", m.dir.path().to_str().unwrap()], 1);
    assert!(err.contains("no mado mount"), "{err}");
}

#[test]
fn a_stalled_store_gives_eio_in_bounded_time_and_other_files_still_serve() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap(), "--no-packs"]);
    let _ = std::fs::remove_dir_all(m.cache_dir());
    // The object behind src/lib.rs becomes a FIFO with no writer: reading
    // it from the store blocks forever, like a server that never answers.
    let id = mado_core::Hash::of(b"pub fn f() {}\n").to_hex();
    let obj = m.store_dir().join("objects").join(&id[..2]).join(&id);
    std::fs::remove_file(&obj).unwrap();
    let st = std::process::Command::new("mkfifo").arg(&obj).status().unwrap();
    assert!(st.success());
    let mnt = mount(&m, "main", "mnt", &["--read-timeout", "2"], &[]);
    let t = Instant::now();
    let err = std::fs::read(mnt.dir.join("src/lib.rs")).unwrap_err();
    let took = t.elapsed();
    assert_eq!(err.raw_os_error(), Some(5), "EIO: {err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(std::fs::read(mnt.dir.join("README.md")).unwrap(), b"# fixture\n");
}

#[test]
fn a_killed_daemon_leaves_a_mount_that_umount_and_mount_clean_up() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    for recover_with_mount in [false, true] {
        let mnt = mount(&m, "main", "mnt", &["--json"], &[]);
        let pid = std::process::Command::new("pgrep")
            .args(["-f", &format!("mount main {} --foreground", mnt.dir.display())])
            .output()
            .unwrap();
        let pid = String::from_utf8_lossy(&pid.stdout).lines().next().unwrap().trim().to_string();
        std::process::Command::new("kill").args(["-9", &pid]).status().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let err = std::fs::metadata(&mnt.dir).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(107), "ENOTCONN: {err}");
        if recover_with_mount {
            let again = mount(&m, "main", "mnt", &[], &[]);
            assert_eq!(std::fs::read(again.dir.join("README.md")).unwrap(), b"# fixture\n");
            m.ok(&["umount", again.dir.to_str().unwrap()]);
        } else {
            m.ok(&["umount", mnt.dir.to_str().unwrap()]);
            assert!(std::fs::read_dir(&mnt.dir).unwrap().next().is_none());
        }
    }
}

/// Paths of a checkout, for the property test.
fn all_paths(root: &Path) -> Vec<PathBuf> {
    let mut v = vec![PathBuf::new()];
    for (k, _) in snapshot_dir(root) {
        v.push(PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&k)));
    }
    v.push(PathBuf::from("no/such/path"));
    v.push(PathBuf::from("src/nothing"));
    v
}

#[derive(Debug, PartialEq)]
enum Answer {
    Meta { dir: bool, file: bool, link: bool, len: u64, exec: bool },
    Bytes(Vec<u8>),
    Names(Vec<String>),
    Err(Option<i32>),
}

fn ask(root: &Path, op: u8, rel: &Path, offset: u64, size: usize) -> Answer {
    use std::io::{Read, Seek, SeekFrom};
    let p = root.join(rel);
    let r = (|| -> std::io::Result<Answer> {
        Ok(match op % 3 {
            0 => {
                let m = std::fs::symlink_metadata(&p)?;
                Answer::Meta {
                    dir: m.is_dir(),
                    file: m.is_file(),
                    link: m.file_type().is_symlink(),
                    len: if m.is_dir() { 0 } else { m.len() },
                    exec: m.is_file() && m.permissions().mode() & 0o100 != 0,
                }
            }
            1 => {
                let mut f = std::fs::File::open(&p)?;
                f.seek(SeekFrom::Start(offset))?;
                let mut buf = vec![0; size];
                let mut got = 0;
                while got < size {
                    let n = f.read(&mut buf[got..])?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                buf.truncate(got);
                Answer::Bytes(buf)
            }
            _ => {
                let mut names: Vec<String> = std::fs::read_dir(&p)?
                    .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<Result<_, _>>()?;
                names.sort();
                Answer::Names(names)
            }
        })
    })();
    r.unwrap_or_else(|e| Answer::Err(e.raw_os_error()))
}

#[test]
fn mount_answers_like_a_plain_checkout() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let co = m.dir.path().join("co");
    m.ok(&["checkout", "main", co.to_str().unwrap()]);
    empty_cache(&m);
    let mnt = mount(&m, "main", "mnt", &["--no-passthrough"], &[]);
    let paths = all_paths(&co);
    let n = paths.len();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 400,
        failure_persistence: None,
        ..Default::default()
    });
    let big = 5u64 << 20;
    runner
        .run(&(0..n, any::<u8>(), 0..big + 100, 0usize..70_000), |(i, op, offset, size)| {
            let rel = &paths[i];
            let want = ask(&co, op, rel, offset, size);
            let got = ask(&mnt.dir, op, rel, offset, size);
            prop_assert_eq!(got, want, "{:?} op {} at {} size {}", rel, op % 3, offset, size);
            Ok(())
        })
        .unwrap();
}

/// Runs `args` as uid/gid 65534 (nobody); returns (exit code, stderr).
fn as_nobody(args: &[&str]) -> (Option<i32>, String) {
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `--allow-other` lets another uid in (a container mounted by root, the
/// agent running as another user), with the kernel checking modes
/// (`default_permissions`); without it, another uid is refused.
#[test]
fn allow_other_lets_another_user_read_as_the_modes_say() {
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        eprintln!("skipping: needs FUSE and root (to act as another user)");
        return;
    }
    let m = Mado::local();
    setup(&m);
    // The mount points' parent must be searchable by the other user.
    let base = tempfile::Builder::new().prefix("mado-allow-other").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (closed, open) = (base.path().join("closed"), base.path().join("open"));
    // `closed` is made by `mado mount` itself (a missing mount point is made).
    std::fs::create_dir(&open).unwrap();
    let _a = mount_at(&m, "main", &closed, &[]);
    let _b = mount_at(&m, "main", &open, &["--allow-other"]);
    let readme = |d: &Path| d.join("README.md").to_str().unwrap().to_string();
    let (code, err) = as_nobody(&["cat", &readme(&closed)]);
    assert_ne!(code, Some(0), "another user read a mount without --allow-other");
    assert!(err.contains("Permission denied"), "{err}");
    let (code, err) = as_nobody(&["cat", &readme(&open)]);
    assert_eq!(code, Some(0), "{err}");
    // The modes still hold: the snapshot is read-only for everyone.
    let (code, _) = as_nobody(&["touch", open.join("new").to_str().unwrap()]);
    assert_ne!(code, Some(0));

    // A workspace mount too: another user reads, and the owner's modes
    // (0644 files, 0755 directories, owned by the mounting user) keep it
    // from writing.
    let ws = base.path().join("ws");
    m.ok(&["ws", "create", "shared", "--mount", ws.to_str().unwrap(), "--allow-other"]);
    let _c = Mounted { m: &m, dir: ws.clone(), stderr: String::new() };
    let (code, err) = as_nobody(&["cat", &readme(&ws)]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = as_nobody(&["sh", "-c", &format!("echo x >> {}", readme(&ws))]);
    assert_ne!(code, Some(0), "another user wrote a 0644 file it does not own");
    assert!(err.contains("Permission denied"), "{err}");
}

fn mount_at<'a>(m: &'a Mado, spec: &str, dir: &Path, extra: &[&str]) -> Mounted<'a> {
    let mut args = vec!["mount", spec, dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = m.cmd(&args).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "mount failed: {stderr}");
    Mounted { m, dir: dir.to_path_buf(), stderr }
}

/// A user other than root mounts through fusermount3 where /dev/fuse lets
/// users in; where it does not (mode 0600, as on this project's machines),
/// the error says exactly that and what to do, not "is fuse3 installed?".
#[test]
fn a_mount_by_another_user_works_or_says_why_not() {
    if !fuse_usable() || !rustix::process::geteuid().is_root() {
        eprintln!("skipping: needs FUSE and root (to act as another user)");
        return;
    }
    // Everything the other user touches sits in a directory it may search:
    // the binary (the build's folder may be private), its HOME and store.
    let base = tempfile::Builder::new().prefix("mado-nobody").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = base.path().join("mado");
    std::fs::copy(env!("CARGO_BIN_EXE_mado"), &bin).unwrap();
    let (home, mp) = (base.path().join("home"), base.path().join("home/mp"));
    std::fs::create_dir(&home).unwrap();
    let repo = fixture_repo(base.path());
    let o = std::process::Command::new("chown").args(["-R", "65534:65534"]).arg(&home).arg(&repo).output().unwrap();
    assert!(o.status.success());
    let run = |args: &[&str]| {
        let mut all = vec![
            "env".to_string(),
            format!("HOME={}", home.display()),
            "XDG_RUNTIME_DIR=".into(),
            format!("MADO_REMOTE_ADDR=file://{}/store", home.display()),
            bin.to_str().unwrap().into(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        as_nobody(&all.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (code, err) = run(&["import-git", repo.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run(&["mount", "main", mp.to_str().unwrap()]);
    let mode = std::fs::metadata("/dev/fuse").unwrap().mode();
    if mode & 0o006 == 0o006 {
        assert_eq!(code, Some(0), "{err}");
        let (code, err) = as_nobody(&["cat", mp.join("README.md").to_str().unwrap()]);
        assert_eq!(code, Some(0), "{err}");
        let (code, err) = run(&["umount", mp.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{err}");
    } else {
        assert_ne!(code, Some(0), "a mount with /dev/fuse mode {mode:o} worked for another user");
        assert!(err.contains(&format!("/dev/fuse is mode {:o}", mode & 0o7777)), "{err}");
        assert!(err.contains("uid 65534 cannot open it") && err.contains("chmod 0666 /dev/fuse"), "{err}");
        assert!(!err.contains("is fuse3 installed"), "{err}");
        // Nothing is left mounted or running.
        assert!(mount_type(&mp).is_none(), "{err}");
    }
}

/// The largest run of resident pages in `pid`'s anonymous writable
/// mappings, in KiB (from /proc/PID/pagemap's present bit).
fn largest_resident_anon_run_kib(pid: &str) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut largest = 0u64;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Named mappings (the binary, the stack, files) are not the heap.
        if f.len() > 5 || !f[1].starts_with("rw") {
            continue;
        }
        let (a, b) = f[0].split_once('-').unwrap();
        let (a, b) = (u64::from_str_radix(a, 16).unwrap(), u64::from_str_radix(b, 16).unwrap());
        let pages = ((b - a) / 4096) as usize;
        let mut buf = vec![0u8; pages * 8];
        pagemap.seek(SeekFrom::Start(a / 4096 * 8)).unwrap();
        pagemap.read_exact(&mut buf).unwrap();
        let mut run = 0u64;
        for e in buf.chunks_exact(8) {
            let present = u64::from_le_bytes(e.try_into().unwrap()) >> 63 == 1;
            run = if present { run + 4 } else { 0 };
            largest = largest.max(run);
        }
    }
    largest
}

/// fuser gives each session thread a zeroed 16 MiB request buffer, of
/// which a request uses a few KiB. Served by mimalloc on memory it had
/// handed out before, a buffer was written whole: 17 MiB of an idle
/// daemon's 20 MiB of private memory. Such a block is now a fresh mapping
/// (cli/src/alloc.rs), whose pages cost nothing until used: no 8 MiB of
/// the daemon's heap is resident in one run, after a walk and reads too.
#[test]
fn a_mount_daemon_keeps_no_request_buffer_resident() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let mnt = mount(&m, "main", "idle", &[], &[]);
    walk_and_read(&mnt.dir);
    let pid = std::process::Command::new("pgrep")
        .args(["-f", &format!("mount main {} --foreground", mnt.dir.display())])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&pid.stdout).lines().next().expect("the daemon's pid").trim().to_string();
    let run = largest_resident_anon_run_kib(&pid);
    assert!(run < 8 << 10, "a resident run of {run} KiB in the daemon's heap");
    m.ok(&["umount", mnt.dir.to_str().unwrap()]);
}

/// `mado stats --all` asks every daemon of the user at once and says what
/// each holds, its private memory included; `--prometheus` serves the same
/// in Prometheus' text format, afresh on every scrape.
#[test]
fn stats_of_every_mount_and_a_prometheus_endpoint() {
    use std::io::{BufRead, Read, Write};
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    // A runtime directory of its own: other tests' mounts stay out of it.
    let run = m.dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let env = [("XDG_RUNTIME_DIR", run.to_str().unwrap())];
    let a = mount(&m, "main", "a", &[], &env);
    let b = mount(&m, "main", "b", &[], &env);
    assert_eq!(std::fs::read(a.dir.join("src/lib.rs")).unwrap(), b"pub fn f() {}\n");

    let o = m.cmd(&["stats", "--all", "--json"]).env(env[0].0, env[0].1).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mounts = v["mounts"].as_array().unwrap();
    let seen: Vec<&str> = mounts.iter().map(|x| x["mountpoint"].as_str().unwrap()).collect();
    assert_eq!(seen, [a.dir.to_str().unwrap(), b.dir.to_str().unwrap()], "{v}");
    for x in mounts {
        assert!(x["private_bytes"].as_u64().unwrap() > 1 << 20, "{x}");
        assert!(x["nodes_in_memory"].as_u64().unwrap() >= 1, "{x}");
    }
    let lookups = |x: &serde_json::Value| x["lookups"].as_u64().unwrap();
    assert!(lookups(&mounts[0]) > lookups(&mounts[1]), "a was read, b not: {v}");
    assert_eq!(v["not_answering"].as_array().unwrap().len(), 0);
    let text = m.cmd(&["stats", "--all"]).env(env[0].0, env[0].1).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(a.dir.to_str().unwrap()) && text.contains("2 daemons"), "{text}");

    let mut server = m
        .cmd(&["stats", "--prometheus", "127.0.0.1:0"])
        .env(env[0].0, env[0].1)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let addr = first.split("http://").nth(1).and_then(|r| r.split('/').next()).expect(&first).to_string();
    let ask = |req: &str| {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        reply
    };
    let reply = ask("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let refused = ask("POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let _ = server.kill();
    let _ = server.wait();
    assert!(refused.starts_with("HTTP/1.1 405"), "{refused}");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("Content-Type: text/plain; version=0.0.4"), "{reply}");
    for dir in [&a.dir, &b.dir] {
        let line = format!("mado_private_memory_bytes{{mount=\"{}\",what=\"main\"", dir.display());
        assert!(reply.contains(&line), "{line} in {reply}");
    }
    assert!(reply.contains("# TYPE mado_remote_gets_total counter"), "{reply}");
    assert!(reply.contains("mado_daemons_not_answering 0"), "{reply}");
    for dir in [&a.dir, &b.dir] {
        let o = m.cmd(&["umount", dir.to_str().unwrap()]).env(env[0].0, env[0].1).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}
