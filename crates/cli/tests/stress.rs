//! A workspace mount under stress: random file operations from several
//! writers, checkpoints taken back to back beside them, and kill -9 of the
//! daemon at random points. After each round, every file of the mount
//! reads, a checkpoint lands, and a cold resume on another machine is the
//! mount byte for byte; every checkpoint taken reads back whole; no stat
//! of the mount waits 10 s (issues #44 and #48).

mod common;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// A small deterministic generator (xorshift), one per writer.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One random operation of writer `w` in `dir` (its own folder of the
/// mount). Errors are ignored: a killed daemon fails them all.
fn random_op(dir: &Path, r: &mut Rng) {
    let name = |r: &mut Rng| dir.join(format!("f{}", r.below(12)));
    let bytes = |r: &mut Rng, n: u64| pseudo_random(n as usize, r.next());
    let size = |r: &mut Rng, n: u64| r.below(n);
    let _ = (|| -> std::io::Result<()> {
        match r.below(9) {
            // Create or rewrite, fsynced; sometimes over 64 KiB.
            0 | 1 => {
                let n = if r.below(4) == 0 { 70_000 + r.below(100_000) } else { r.below(9000) };
                let mut f = std::fs::File::create(name(r))?;
                f.write_all(&bytes(r, n))?;
                f.sync_all()?;
            }
            // Append without fsync.
            2 => {
                let mut f = std::fs::OpenOptions::new().append(true).open(name(r))?;
                let n = 1 + size(r, 5000);
                f.write_all(&bytes(r, n))?;
            }
            // ftruncate to a random size, then pwrite.
            3 => {
                let f = std::fs::OpenOptions::new().write(true).open(name(r))?;
                f.set_len(r.below(120_000))?;
                let (n, at) = (1 + size(r, 3000), size(r, 120_000));
                f.write_all_at(&bytes(r, n), at)?;
            }
            // As `sed -i` does: a new file renamed over the old one.
            4 => {
                let tmp = dir.join(format!("tmp{}", r.below(1000)));
                let mut f = std::fs::File::create(&tmp)?;
                let n = size(r, 80_000);
                f.write_all(&bytes(r, n))?;
                f.sync_all()?;
                std::fs::rename(&tmp, name(r))?;
            }
            5 => std::fs::remove_file(name(r))?,
            6 => std::fs::rename(name(r), name(r))?,
            // Delete a whole folder of small fsynced files.
            7 => {
                let sub = dir.join("many");
                std::fs::create_dir_all(&sub)?;
                for i in 0..40 {
                    let mut f = std::fs::File::create(sub.join(i.to_string()))?;
                    f.write_all(&bytes(r, 100))?;
                    f.sync_all()?;
                }
                std::fs::remove_dir_all(&sub)?;
            }
            _ => {
                let p = name(r);
                let f = std::fs::File::open(&p)?;
                f.sync_all()?;
            }
        }
        Ok(())
    })();
}

/// Starts `n` writers, each in its own folder of `mnt`, until `stop`.
fn writers(mnt: &Path, n: u64, seed: u64, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<u64>> {
    (0..n)
        .map(|w| {
            let dir = mnt.join(format!("w{w}"));
            let stop = stop.clone();
            std::thread::spawn(move || {
                let _ = std::fs::create_dir_all(&dir);
                let mut r = Rng(seed * 1000 + w + 1);
                let mut ops = 0;
                while !stop.load(Relaxed) {
                    random_op(&dir, &mut r);
                    ops += 1;
                }
                ops
            })
        })
        .collect()
}

/// Checkpoints `dir` back to back until `stop`; returns the snapshot ids
/// of those that landed (one may fail when the daemon is killed under it).
fn checkpointer(m: &Mado, dir: &Path, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<String>> {
    let (remote, home, dir, stop) = (m.remote.clone(), m.home(), dir.to_path_buf(), stop.clone());
    std::thread::spawn(move || {
        let mut ids = Vec::new();
        while !stop.load(Relaxed) {
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_mado"))
                .args(["ws", "checkpoint", "--dir", dir.to_str().unwrap(), "-m", "stress", "--json"])
                .env("HOME", &home)
                .env("MADO_REMOTE_ADDR", &remote)
                .env_remove("MADO_CACHE_DIR")
                .output()
                .unwrap();
            if o.status.success() {
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                if let Some(id) = v["snapshot"].as_str() {
                    ids.push(id.to_string());
                }
            }
        }
        ids
    })
}

/// Stats `dir` in a loop; `check` fails if one stat has waited 10 s.
struct Watchdog {
    started: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(dir: &Path) -> Watchdog {
        let started = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, dir) = (started.clone(), stop.clone(), dir.to_path_buf());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !st.load(Relaxed) {
                *s.lock().unwrap() = Some(Instant::now());
                // A name never made: the kernel cached no answer for it,
                // so the daemon is asked every time.
                i += 1;
                let _ = std::fs::metadata(dir.join(format!("never-{i}")));
                *s.lock().unwrap() = None;
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Watchdog { started, stop }
    }

    /// How long the stat in flight has waited.
    fn waiting(&self) -> Duration {
        self.started.lock().unwrap().map(|t| t.elapsed()).unwrap_or_default()
    }

    /// Fails the test (after killing daemon `pid` and unmounting `dir`, so
    /// that nothing stays blocked on the mount) when a stat has waited 10 s.
    fn check(&self, pid: u64, dir: &Path) {
        let w = self.waiting();
        if w > Duration::from_secs(10) {
            kill_9(pid);
            unmount(dir);
            panic!("a stat of the mount has waited {w:?}: the daemon hung");
        }
    }

    /// Joins `t`, checking for a hang meanwhile.
    fn join<T>(&self, t: std::thread::JoinHandle<T>, pid: u64, dir: &Path) -> T {
        while !t.is_finished() {
            self.check(pid, dir);
            std::thread::sleep(Duration::from_millis(100));
        }
        t.join().unwrap()
    }
}

/// Unmounts at the end of a test, whatever happened.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        unmount(&self.0);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

fn daemon_pid(m: &Mado, dir: &Path) -> u64 {
    m.json(&["stats", dir.to_str().unwrap()])["pid"].as_u64().expect("the daemon reports its pid")
}

/// SIGKILL of mount daemon `pid` and of its keeper: a whole crash.
fn kill_9(pid: u64) {
    kill_keeper_of(pid);
    std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    for _ in 0..200 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unmount(dir: &Path) {
    let _ = std::process::Command::new("fusermount3").arg("-uz").arg(dir).output();
}

/// Every regular file under `dir` reads whole (a name without its bytes
/// gives EIO).
fn assert_every_file_reads(dir: &Path) {
    for p in files_under(dir) {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_file() {
            let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{} does not read: {e}", p.display()));
            assert_eq!(got.len() as u64, m.len(), "{}", p.display());
        }
    }
}

/// A checkpoint of the mount, then a cold read-only resume of it on
/// another machine (its own cache), compared with the mount.
fn assert_resume_elsewhere_is_the_mount(m: &Mado, name: &str, mnt: &Path) -> String {
    let cp = m.json(&["ws", "checkpoint", "--dir", mnt.to_str().unwrap(), "-m", "after the round"]);
    let other = Mado { dir: tempfile::tempdir().unwrap(), remote: m.remote.clone() };
    let copy = other.dir.path().join("copy");
    other.ok(&["ws", "resume", name, copy.to_str().unwrap(), "--read-only"]);
    assert_same_state(mnt, &copy);
    cp["snapshot"].as_str().unwrap().to_string()
}

/// Every snapshot in `ids` checks out whole, cold, on another machine.
fn assert_snapshots_read_back(m: &Mado, ids: &[String]) {
    let other = Mado { dir: tempfile::tempdir().unwrap(), remote: m.remote.clone() };
    for (i, id) in ids.iter().enumerate() {
        let to = other.dir.path().join(format!("c{i}"));
        other.ok(&["checkout", id, to.to_str().unwrap()]);
    }
}

/// Writers (create, write, fsync, rename, unlink, truncate and rewrite)
/// beside back-to-back checkpoints for a minute: no stat of the mount may
/// wait 10 s (a checkpoint's rebase and a state save deadlocked, and every
/// process on the mount hung), and every checkpoint taken reads back
/// whole (a size recorded apart from the bytes hashed made snapshots that
/// could never be read).
#[test]
fn writers_beside_back_to_back_checkpoints_never_hang_and_every_checkpoint_reads_back() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = m.dir.path().join("mnt");
    m.ok(&["ws", "create", "busy", "--from", "main", "--mount", mnt.to_str().unwrap()]);
    let _unmount = Unmount(mnt.clone());
    let pid = daemon_pid(&m, &mnt);
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&mnt, 4, 1, &stop);
    let cps = checkpointer(&m, &mnt, &stop);
    let dog = Watchdog::start(&mnt);
    let secs = std::env::var("MADO_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(250));
        dog.check(pid, &mnt);
    }
    stop.store(true, Relaxed);
    let ops: u64 = ws.into_iter().map(|w| dog.join(w, pid, &mnt)).sum();
    let mut ids = dog.join(cps, pid, &mnt);
    drop(dog);
    assert!(ops > 100 && ids.len() > 5, "{ops} operations, {} checkpoints", ids.len());
    ids.push(assert_resume_elsewhere_is_the_mount(&m, "busy", &mnt));
    assert_snapshots_read_back(&m, &ids);
    m.ok(&["umount", mnt.to_str().unwrap()]);
}

/// Rounds of writers and checkpoints ended by kill -9 of the daemon at a
/// random point, then a remount: every file reads (a file freed just
/// before the kill came back as a name with no bytes), the mount's files
/// are what a checkpoint records and a cold resume elsewhere shows (an
/// unsynced append made the two differ), and every checkpoint taken reads
/// back whole.
#[test]
fn kill_9_at_random_points_never_leaves_a_name_without_its_bytes() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = m.dir.path().join("mnt");
    let mp = mnt.to_str().unwrap();
    m.ok(&["ws", "create", "crash", "--from", "main", "--mount", mp]);
    let _unmount = Unmount(mnt.clone());
    let mut r = Rng(42);
    let mut all = Vec::new();
    for round in 0..4 {
        let pid = daemon_pid(&m, &mnt);
        let stop = Arc::new(AtomicBool::new(false));
        let ws = writers(&mnt, 3, round + 7, &stop);
        let cps = checkpointer(&m, &mnt, &stop);
        std::thread::sleep(Duration::from_millis(1500 + r.below(2500)));
        kill_9(pid);
        stop.store(true, Relaxed);
        for w in ws {
            w.join().unwrap();
        }
        all.extend(cps.join().unwrap());
        m.ok(&["umount", mp]);
        m.ok(&["ws", "resume", "crash", mp, "--mount"]);
        assert_every_file_reads(&mnt);
        all.push(assert_resume_elsewhere_is_the_mount(&m, "crash", &mnt));
    }
    assert_snapshots_read_back(&m, &all);
    m.ok(&["umount", mp]);
}

/// The three ways a fsynced file over 64 KiB is freed (rm, a rename over
/// it, `sed -i`), each followed at once by kill -9: after the remount the
/// file is the old one or the new one, whole, never a name with no bytes;
/// and 1,500 small fsynced files removed with `rm -rf` come back whole or
/// not at all.
#[test]
fn kill_9_right_after_a_delete_brings_back_the_old_file_or_none() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    let mnt = m.dir.path().join("mnt");
    let mp = mnt.to_str().unwrap();
    m.ok(&["ws", "create", "del", "--from", "main", "--mount", mp]);
    let _unmount = Unmount(mnt.clone());
    let old = pseudo_random(200_000, 1);
    let new = pseudo_random(90_000, 2);
    let write_synced = |p: &PathBuf, b: &[u8]| {
        let mut f = std::fs::File::create(p).unwrap();
        f.write_all(b).unwrap();
        f.sync_all().unwrap();
    };
    for mode in ["rm", "rename over", "sed -i"] {
        let big = mnt.join("big.bin");
        write_synced(&big, &old);
        // Let the saver's state name it.
        std::thread::sleep(Duration::from_millis(1500));
        let pid = daemon_pid(&m, &mnt);
        match mode {
            "rm" => std::fs::remove_file(&big).unwrap(),
            _ => {
                let tmp = mnt.join("big.tmp");
                write_synced(&tmp, &new);
                std::fs::rename(&tmp, &big).unwrap();
            }
        }
        kill_9(pid);
        m.ok(&["umount", mp]);
        m.ok(&["ws", "resume", "del", mp, "--mount"]);
        match std::fs::read(&big) {
            Ok(b) => assert!(b == old || b == new, "{mode}: big.bin came back with {} other bytes", b.len()),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{mode}: {e}"),
        }
        assert_every_file_reads(&mnt);
        let _ = std::fs::remove_file(&big);
    }
    let many = mnt.join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..1500 {
        write_synced(&many.join(i.to_string()), format!("file {i}\n").as_bytes());
    }
    std::thread::sleep(Duration::from_millis(1500));
    let pid = daemon_pid(&m, &mnt);
    std::fs::remove_dir_all(&many).unwrap();
    kill_9(pid);
    m.ok(&["umount", mp]);
    m.ok(&["ws", "resume", "del", mp, "--mount"]);
    assert_every_file_reads(&mnt);
    assert_resume_elsewhere_is_the_mount(&m, "del", &mnt);
    m.ok(&["umount", mp]);
}
