//! Large files (#19): a file far larger than mado's memory bound goes
//! through import, checkout (warm and cold), `cat`, a workspace checkpoint
//! and a FUSE mount; each process's peak memory is measured (the kernel's
//! `ru_maxrss` from wait4, or the daemon's VmHWM) and every byte compared.
//! Large blobs in each git layout (loose, packed whole, packed as a delta)
//! import to the same ids, and a corrupt one is refused by name.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

/// The file: 1.5× the bound, so holding it whole once fails the test.
const FILE: usize = 384 << 20;
/// Peak resident memory any mado process may reach with it (issue #19).
const BOUND_KIB: i64 = 256 << 10;

/// Writes `n` pseudo-random bytes (fast: a word at a time).
fn write_random(p: &Path, n: usize, seed: u64) {
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(p).unwrap());
    let mut x = seed | 1;
    let mut left = n;
    while left > 0 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        let k = left.min(8);
        f.write_all(&b[..k]).unwrap();
        left -= k;
    }
    f.flush().unwrap();
}

/// Whether two files hold the same bytes (read a block at a time).
fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (std::fs::File::open(a).unwrap(), std::fs::File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
        if n == 0 {
            return true;
        }
    }
}

/// Runs `c` (a mado command) to its end under `--verbose`; returns the
/// peak resident memory it reports (its VmHWM) in KiB, and panics with
/// its stderr if it failed.
fn peak_kib(mut c: Command, what: &str, stdout: Stdio) -> i64 {
    let o = c.arg("--verbose").stdout(stdout).stderr(Stdio::piped()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what} failed: {err}");
    let line = err.lines().find_map(|l| l.split("memory: peak ").nth(1)).unwrap_or_else(|| panic!("{what}: {err}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// A repository holding one large file, stored the way git stores big
/// files (streamed into a pack as a whole entry).
fn big_repo(parent: &Path) -> PathBuf {
    let repo = parent.join("repo");
    init_repo(&repo);
    git(&repo, &["config", "core.bigFileThreshold", "1m"]);
    write_random(&repo.join("big.bin"), FILE, 19);
    std::fs::write(repo.join("small.txt"), b"small\n").unwrap();
    commit_all(&repo, "big");
    repo
}

/// The pid of the mount daemon serving `dir`.
fn daemon_of(dir: &Path) -> u32 {
    let want = dir.to_str().unwrap();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.contains(&&b"mount"[..]) && args.contains(&want.as_bytes()) {
            return pid;
        }
    }
    panic!("no mount daemon for {want}");
}

fn vm_hwm_kib(pid: u32) -> i64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_file_larger_than_the_memory_bound_streams_through_every_path() {
    let m = Mado::local();
    let repo = big_repo(m.dir.path());
    let src = repo.join("big.bin");
    let bound = |kib: i64, what: &str| {
        eprintln!("{what}: peak {} MiB", kib >> 10);
        assert!(kib < BOUND_KIB, "{what} peaked at {} MiB with a {} MiB file", kib >> 10, FILE >> 20);
    };

    bound(peak_kib(m.cmd(&["import-git", repo.to_str().unwrap()]), "import-git", Stdio::null()), "import-git");
    let ls = m.json(&["ls", "main"]);
    let big = ls.as_array().unwrap().iter().find(|e| e["name"] == "big.bin").unwrap().clone();
    assert_eq!(big["chunked"], true, "{big}");

    // Checkout with the cache warm (the import filled it), then cold.
    let co = m.dir.path().join("co");
    bound(peak_kib(m.cmd(&["checkout", "main", co.to_str().unwrap()]), "checkout", Stdio::null()), "warm checkout");
    assert!(same_bytes(&co.join("big.bin"), &src), "warm checkout content");
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let co2 = m.dir.path().join("co2");
    bound(peak_kib(m.cmd(&["checkout", "main", co2.to_str().unwrap()]), "checkout", Stdio::null()), "cold checkout");
    assert!(same_bytes(&co2.join("big.bin"), &src), "cold checkout content");
    // No temp file is left beside it.
    let names: Vec<_> = std::fs::read_dir(&co2).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // Materialize from a cold cache: the chunks go to the cache, none is
    // held once it is there (it kept every chunk of a file until the
    // file's last arrived).
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    bound(peak_kib(m.cmd(&["materialize"]), "materialize", Stdio::null()), "materialize");

    let out = m.dir.path().join("cat.out");
    let f = std::fs::File::create(&out).unwrap();
    bound(peak_kib(m.cmd(&["cat", "main", "big.bin"]), "cat", Stdio::from(f)), "cat");
    assert!(same_bytes(&out, &src), "cat content");
    std::fs::remove_file(&out).unwrap();

    // A checkpoint after a small append uploads the changed end only.
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "big", "--from", "main", "--dir", w.to_str().unwrap()]);
    std::fs::OpenOptions::new().append(true).open(w.join("big.bin")).unwrap().write_all(&[7u8; 100]).unwrap();
    let c = m.cmd(&["ws", "checkpoint", "--dir", w.to_str().unwrap(), "--json", "-m", "append"]);
    let json = m.dir.path().join("cp.json");
    bound(peak_kib(c, "ws checkpoint", Stdio::from(std::fs::File::create(&json).unwrap())), "checkpoint");
    let cp: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let up = cp["upload"]["bytes_uploaded"].as_u64().unwrap();
    assert!(up < 16 << 20, "a 100-byte append uploaded {up} bytes: {cp}");
    std::fs::remove_dir_all(&w).unwrap();
    std::fs::remove_dir_all(&co).unwrap();
    std::fs::remove_dir_all(&co2).unwrap();

    // Through a read-only mount, from a cold cache: every byte, and the
    // daemon's peak memory.
    if !fuse_usable() {
        return;
    }
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let mnt = m.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    m.ok(&["mount", "main", mnt.to_str().unwrap()]);
    let pid = daemon_of(&mnt);
    // A random 4 KiB read fetches its chunk and nothing else (the manifest
    // came inline with the pack index): one round trip.
    let gets =
        |s: &serde_json::Value| s["remote"]["gets"].as_u64().unwrap() + s["remote"]["ranged_gets"].as_u64().unwrap();
    let s0 = m.json(&["stats", mnt.to_str().unwrap()]);
    let (before, before_bytes) = (gets(&s0), s0["remote"]["bytes_down"].as_u64().unwrap());
    let f = std::fs::File::open(mnt.join("big.bin")).unwrap();
    let mut buf = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 200 << 20).unwrap();
    let mut want = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(&src).unwrap(), &mut want, 200 << 20).unwrap();
    assert_eq!(buf, want);
    let s = m.json(&["stats", mnt.to_str().unwrap()]);
    assert_eq!(gets(&s) - before, 1, "a 4 KiB read made {} GETs: {s}", gets(&s) - before);
    // Its chunk's bytes (at most 4 MiB), not the rest of its run pack.
    let down = s["remote"]["bytes_down"].as_u64().unwrap() - before_bytes;
    assert!(down <= 4 << 20, "a 4 KiB read brought {down} bytes: {s}");
    assert_eq!(s["chunks_read_ahead"], 0, "a random read reads nothing ahead: {s}");
    drop(f);
    let read_ok = same_bytes(&mnt.join("big.bin"), &src);
    let hwm = vm_hwm_kib(pid);
    let stats = m.json(&["stats", mnt.to_str().unwrap()]);
    let _ = m.run(&["umount", mnt.to_str().unwrap()]);
    let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).output();
    assert!(read_ok, "content through the mount");
    bound(hwm, "the mount daemon");
    // The file lives in run packs of 16 MiB: a sequential reader fetches
    // them a pack (or the rest of one) per GET, not a chunk per GET (the
    // file has ~384 chunks), and read-ahead fetches nothing twice.
    let n = gets(&stats);
    let packs = FILE as u64 >> 24;
    assert!(n <= 2 * packs + 4, "{n} GETs for a {} MiB file in {packs} packs: {stats}", FILE >> 20);
    let down = stats["remote"]["bytes_down"].as_u64().unwrap();
    assert!(down < FILE as u64 + (FILE as u64 >> 3), "{down} bytes down for a {} MiB file: {stats}", FILE >> 20);
    assert!(stats["chunks_read_ahead"].as_u64().unwrap() > 100, "a sequential reader gets read-ahead: {stats}");
}

/// A repository where the same 6 MiB file has two versions, stored loose,
/// then repacked (one version becomes a delta of the other).
fn two_versions(parent: &Path) -> PathBuf {
    let repo = parent.join("repo");
    init_repo(&repo);
    let mut data = pseudo_random(6 << 20, 3);
    std::fs::write(repo.join("big.bin"), &data).unwrap();
    commit_all(&repo, "one");
    data[3 << 20..(3 << 20) + 100].fill(9);
    std::fs::write(repo.join("big.bin"), &data).unwrap();
    git(&repo, &["commit", "-q", "-am", "two"]);
    repo
}

fn roots(m: &Mado) -> Vec<String> {
    let log = m.json(&["log", "main"]);
    log.as_array().unwrap().iter().map(|s| s["root"].as_str().unwrap().to_string()).collect()
}

#[test]
fn large_blobs_import_to_the_same_ids_in_every_git_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = two_versions(tmp.path());
    let import = |repo: &Path| {
        let m = Mado::local();
        m.ok(&["import-git", repo.to_str().unwrap(), "--rev", "main~1", "--rev", "main"]);
        let r = roots(&m);
        let co = m.dir.path().join("co");
        m.ok(&["checkout", "main", co.to_str().unwrap()]);
        assert_eq!(std::fs::read(co.join("big.bin")).unwrap(), std::fs::read(repo.join("big.bin")).unwrap());
        r
    };
    let loose = import(&repo);
    assert_eq!(loose.len(), 2);
    // Repacked: one version is stored as a delta of the other (read whole),
    // the other as a whole entry (streamed).
    git(&repo, &["repack", "-adf", "-q", "--window=10"]);
    let verify = git(&repo, &["verify-pack", "-v", &pack_idx(&repo)]);
    assert!(verify.lines().any(|l| l.contains(" blob ") && l.split_whitespace().count() >= 7), "a delta: {verify}");
    assert_eq!(import(&repo), loose, "packed and delta blobs import to the ids loose ones do");
}

fn pack_idx(repo: &Path) -> String {
    let dir = repo.join(".git/objects/pack");
    let idx =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "idx"));
    idx.unwrap().to_str().unwrap().to_string()
}

#[test]
fn a_corrupt_large_blob_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    init_repo(&repo);
    std::fs::write(repo.join("big.bin"), pseudo_random(5 << 20, 4)).unwrap();
    commit_all(&repo, "one");
    let id = git(&repo, &["rev-parse", "HEAD:big.bin"]);
    let loose = repo.join(".git/objects").join(&id[..2]).join(&id[2..]);
    // A valid loose object of other bytes of the same size, under this id:
    // only the SHA-1 check can tell.
    let other = tmp.path().join("other.bin");
    std::fs::write(&other, pseudo_random(5 << 20, 6)).unwrap();
    let other_id = git(&repo, &["hash-object", "-w", other.to_str().unwrap()]);
    let other_loose = repo.join(".git/objects").join(&other_id[..2]).join(&other_id[2..]);
    let mut perm = std::fs::metadata(&loose).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o644);
    std::fs::set_permissions(&loose, perm).unwrap();
    std::fs::copy(&other_loose, &loose).unwrap();
    let m = Mado::local();
    let o = m.run(&["import-git", repo.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a corrupt blob was imported");
    assert!(err.contains(&id) && err.contains("big.bin") && err.contains("corrupt"), "{err}");
    assert!(err.contains("hash to"), "the SHA-1 check names the mismatch: {err}");
    // Truncated: the stream ends early.
    let bytes = std::fs::read(&other_loose).unwrap();
    std::fs::write(&loose, &bytes[..bytes.len() / 2]).unwrap();
    let o = m.run(&["import-git", repo.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("big.bin"), "{err}");
    assert!(m.run(&["ls", "main"]).status.code() != Some(0), "no ref was made");
}

/// A store holding a 24 MiB file of random bytes (`big.bin`, from `seed`)
/// and a small one, imported, and an empty cache: where the repository's
/// file is, where the cache would keep its whole copy, and the cache's
/// build folder.
struct WholeCopy {
    m: Mado,
    src: PathBuf,
    copy: PathBuf,
    builds: PathBuf,
}

fn whole_copy_store(seed: u64) -> WholeCopy {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    init_repo(&repo);
    let src = repo.join("big.bin");
    write_random(&src, 24 << 20, seed);
    std::fs::write(repo.join("small.txt"), b"small\n").unwrap();
    commit_all(&repo, "big");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let content = mado_core::Hash::of(&std::fs::read(&src).unwrap()).to_hex();
    let copy = m.cache_dir().join("objects").join(&content[..2]).join(&content);
    let builds = m.cache_dir().join("tmp");
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    WholeCopy { m, src, copy, builds }
}

/// Flips a byte in the middle of every file under `dir` whose name ends
/// with `suffix`; how many it damaged.
fn damage_all(dir: &Path, suffix: &str) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            n += damage_all(&p, suffix);
        } else if p.to_string_lossy().ends_with(suffix) {
            let mut b = std::fs::read(&p).unwrap();
            let mid = b.len() / 2;
            b[mid] ^= 0x40;
            std::fs::write(&p, b).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn a_warm_checkout_of_a_large_file_refetches_rotten_cached_chunks() {
    let WholeCopy { m, src, .. } = whole_copy_store(7);
    let co = |name: &str| {
        let out = m.dir.path().join(name);
        (m.json(&["checkout", "main", out.to_str().unwrap()]), out.join("big.bin"))
    };
    let (cold, first) = co("cold");
    assert!(same_bytes(&first, &src));
    assert!(cold["remote"]["bytes_down"].as_u64().unwrap() > 24 << 20, "{cold}");
    // Every cached pack of the file's chunks rotten in its middle: the
    // warm checkout reads the cache side by side, and must still write
    // only good bytes, fetching the damaged chunks again.
    assert!(damage_all(&m.cache_dir().join("packs"), ".pack") > 0, "the chunks are cached in packs");
    let (warm, second) = co("warm");
    assert!(same_bytes(&second, &src), "a rotten chunk was written");
    let down = warm["remote"]["bytes_down"].as_u64().unwrap();
    assert!(down > 0 && down < 24 << 20, "only the damaged chunks come again: {warm}");
    // Healed: a third checkout reads nothing from the store but the ref.
    let (third, _) = co("third");
    assert_eq!(third["remote"]["gets"], 1, "{third}");
    assert_eq!(m.json(&["cache", "verify"])["bad"].as_array().unwrap().len(), 0);
}

/// Entries in `dir` (0 when it is not there).
fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_large_file_read_whole_is_kept_whole_and_later_opens_pass_through() {
    if !fuse_usable() {
        return;
    }
    let WholeCopy { m, src, copy, builds } = whole_copy_store(5);
    let want = std::fs::read(&src).unwrap();
    let building = || files_in(&builds);

    let mnt = m.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    m.ok(&["mount", "main", mnt.to_str().unwrap()]);
    let stats = || m.json(&["stats", mnt.to_str().unwrap()]);
    let s = stats();
    if s["passthrough"] != true {
        // A kernel without FUSE passthrough: nothing to pass through to.
        let _ = m.run(&["umount", mnt.to_str().unwrap()]);
        return;
    }
    // A packed snapshot with a large file keeps OPEN (no-open mode could
    // not pass anything through).
    assert_eq!(s["packs"]["warmed_packs"], 0);
    assert_eq!(std::fs::read(mnt.join("small.txt")).unwrap(), b"small\n");
    assert!(stats()["opens"].as_u64().unwrap() >= 1, "{}", stats());

    // A reader that stops after its first MiB leaves no copy, whole or torn.
    let mut head = vec![0u8; 1 << 20];
    std::fs::File::open(mnt.join("big.bin")).unwrap().read_exact(&mut head).unwrap();
    assert_eq!(head, want[..1 << 20]);
    eventually("the partial copy to go", || building() == 0);
    assert!(!copy.exists());
    assert_eq!(stats()["files_assembled"], 0);

    // Read whole: every byte, then the whole copy is kept under the
    // content's hash (and verifies as a cache entry).
    assert!(same_bytes(&mnt.join("big.bin"), &src), "first whole read");
    eventually("the whole copy", || stats()["files_assembled"] == 1);
    assert_eq!(std::fs::read(&copy).unwrap(), want);
    assert_eq!(building(), 0, "the build folder is empty once the copy is kept");

    // A later open passes through to it: the bytes are right and no READ
    // reaches the daemon.
    let reads = stats()["reads"].as_u64().unwrap();
    assert!(same_bytes(&mnt.join("big.bin"), &src), "read through the whole copy");
    assert_eq!(stats()["reads"].as_u64().unwrap(), reads, "passthrough: the daemon served no READ: {}", stats());

    // A copy cut short is not passed through: reads go through the daemon
    // and its verified chunks again (on a new mount: the kernel keeps a
    // passthrough inode's backing file while the inode lives).
    let _ = m.run(&["umount", mnt.to_str().unwrap()]);
    std::fs::OpenOptions::new().write(true).open(&copy).unwrap().set_len(1 << 20).unwrap();
    m.ok(&["mount", "main", mnt.to_str().unwrap()]);
    let reads = stats()["reads"].as_u64().unwrap();
    let mut buf = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(mnt.join("big.bin")).unwrap(), &mut buf, 20 << 20)
        .unwrap();
    assert_eq!(buf, want[20 << 20..(20 << 20) + 4096]);
    assert!(stats()["reads"].as_u64().unwrap() > reads, "{}", stats());
    let _ = m.run(&["umount", mnt.to_str().unwrap()]);
    let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).output();
}

/// A kept whole copy damaged later (a bit flipped on disk, a stray write)
/// is never passed through: the next mount's open finds it changed since
/// its check, serves the file through the daemon's verified chunks, and
/// hashes the copy aside, which removes it. An unchanged copy with no
/// record of its check (one kept by an older mado) is checked the same
/// way, and passed through from then on.
#[test]
fn a_whole_copy_damaged_after_it_was_kept_is_not_passed_through() {
    if !fuse_usable() {
        return;
    }
    let WholeCopy { m, src, copy, .. } = whole_copy_store(11);
    let mnt = m.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let stats = || m.json(&["stats", mnt.to_str().unwrap()]);
    let mount = || m.ok(&["mount", "main", mnt.to_str().unwrap()]);
    let umount = || {
        let _ = m.run(&["umount", mnt.to_str().unwrap()]);
    };
    mount();
    if stats()["passthrough"] != true {
        umount();
        return;
    }
    assert!(same_bytes(&mnt.join("big.bin"), &src));
    eventually("the whole copy", || stats()["files_assembled"] == 1);
    umount();
    let record = copy.with_file_name(format!(".whole-{}", copy.file_name().unwrap().to_string_lossy()));
    assert!(record.exists(), "the copy's check is recorded");

    // Three bytes flipped in place: same size, same name.
    let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\x00\x01\x02", 1_000_000).unwrap();
    drop(f);
    mount();
    let reads = stats()["reads"].as_u64().unwrap();
    assert!(same_bytes(&mnt.join("big.bin"), &src), "the damaged copy was served");
    assert!(stats()["reads"].as_u64().unwrap() > reads, "served by the daemon: {}", stats());
    // The check removes it (and this mount's whole read may have built a
    // good one again, if it started after the removal).
    eventually("the damaged copy to go", || !copy.exists() || same_bytes(&copy, &src));
    umount();
    assert!(!copy.exists() || same_bytes(&copy, &src), "the damaged copy stayed");

    // Built again by a whole read, then its record lost: the next mount's
    // first open is served by the daemon while the copy is checked; the
    // open after that passes through.
    mount();
    assert!(same_bytes(&mnt.join("big.bin"), &src));
    umount();
    assert!(same_bytes(&copy, &src) && record.exists(), "a good copy, recorded");
    std::fs::remove_file(&record).unwrap();
    mount();
    let reads = stats()["reads"].as_u64().unwrap();
    assert!(same_bytes(&mnt.join("big.bin"), &src));
    assert!(stats()["reads"].as_u64().unwrap() > reads, "not passed through before its check: {}", stats());
    eventually("the copy's check", || record.exists());
    umount();
    mount();
    let reads = stats()["reads"].as_u64().unwrap();
    assert!(same_bytes(&mnt.join("big.bin"), &src));
    assert_eq!(stats()["reads"].as_u64().unwrap(), reads, "checked, then passed through: {}", stats());
    umount();
    let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).output();
}

/// A whole copy changed between its last chunk's write and its hash (a
/// stray writer into the cache's build folder) is not kept: the hash over
/// the whole file decides, not the checks of the chunks that went in, and
/// the build is removed. The reader got the right bytes all along.
#[test]
fn a_whole_copy_changed_before_its_hash_is_not_kept() {
    if !fuse_usable() {
        return;
    }
    let WholeCopy { m, src, copy, builds } = whole_copy_store(9);
    let building = || files_in(&builds);

    let fifo = m.dir.path().join("pause");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mnt = m.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let o = m
        .cmd(&["mount", "main", mnt.to_str().unwrap()])
        .env("MADO_PAUSE", "assembly-before-hash")
        .env("MADO_PAUSE_FIFO", &fifo)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stats = || m.json(&["stats", mnt.to_str().unwrap()]);
    if stats()["passthrough"] != true {
        let _ = m.run(&["umount", mnt.to_str().unwrap()]);
        return;
    }
    assert!(same_bytes(&mnt.join("big.bin"), &src), "the read that builds the copy");
    let marker = m.dir.path().join("pause.paused");
    eventually("the copy to reach its hash", || marker.exists());
    let built: Vec<_> = std::fs::read_dir(&builds).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(built.len(), 1, "{built:?}");
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&built[0]).unwrap(),
        &[0u8; 4096],
        8 << 20,
    )
    .unwrap();
    std::fs::write(&fifo, b"go").unwrap();
    eventually("the changed copy to go", || building() == 0);
    assert!(!copy.exists(), "a copy that is not the file was kept");
    assert_eq!(stats()["files_assembled"], 0);
    let _ = m.run(&["umount", mnt.to_str().unwrap()]);
}

/// `mado checkout main OUT`, returned once it waits at its pause point
/// `content-write` (a large file's temp file made, its bytes not written).
fn paused_checkout(m: &Mado, out: &Path, fifo: &Path) -> std::process::Child {
    let paused = fifo.with_extension("paused");
    let _ = std::fs::remove_file(&paused);
    let child = m
        .cmd(&["checkout", "main", out.to_str().unwrap()])
        .env("MADO_PAUSE", "content-write")
        .env("MADO_PAUSE_FIFO", fifo)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the checkout reaches its pause point", || paused.exists());
    child
}

/// Ctrl-C during a checkout, a large file half written under its temp
/// name: the checkout ends with 130 and removes the temp file. It stayed
/// (`.mado-tmp-*`, tens of MB), and `checkout --force` kept it.
#[test]
fn an_interrupted_checkout_leaves_no_temp_file() {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    write_random(&repo.join("big.bin"), 6 << 20, 77);
    std::fs::write(repo.join("small.txt"), "small\n").unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "big");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let fifo = m.dir.path().join("pause");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let out = m.dir.path().join("out");
    let child = paused_checkout(&m, &out, &fifo);
    let temps = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".mado-tmp-"))
            .collect()
    };
    assert_eq!(temps(&out).len(), 1, "no temp file while the large file is written");
    assert!(out.join(".mado-checkout-partial").is_file(), "marked while under way");
    assert!(Command::new("kill").arg("-INT").arg(child.id().to_string()).status().unwrap().success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", String::from_utf8_lossy(&o.stderr));
    // The directory it made is gone again (it left the temp file, then
    // every directory it had made).
    assert!(!out.exists(), "the interrupted checkout left {:?}", std::fs::read_dir(&out).map(|d| d.count()));
    // Into a directory that was there and empty: emptied again, its
    // mtime as it was.
    std::fs::create_dir(&out).unwrap();
    let y2k = std::time::UNIX_EPOCH + std::time::Duration::from_secs(946_684_800);
    std::fs::File::open(&out).unwrap().set_modified(y2k).unwrap();
    let child = paused_checkout(&m, &out, &fifo);
    assert!(Command::new("kill").arg("-INT").arg(child.id().to_string()).status().unwrap().success());
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(130));
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "emptied again");
    assert_eq!(std::fs::metadata(&out).unwrap().modified().unwrap(), y2k);
    m.ok(&["checkout", "main", out.to_str().unwrap()]);
    assert!(temps(&out).is_empty());
    assert!(!out.join(".mado-checkout-partial").exists(), "the mark goes once every file is written");
    assert!(same_bytes(&repo.join("big.bin"), &out.join("big.bin")));
}

/// A checkout killed (kill -9) partway leaves its mark beside what it
/// wrote; the same checkout run again removes all of it and finishes
/// (it was refused as "not empty", and a file could be left short under
/// its real name). A checkout that fails (a pack the store lost) leaves
/// no directory behind.
#[test]
fn a_killed_checkout_is_finished_by_running_it_again() {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    std::fs::create_dir_all(repo.join("d")).unwrap();
    write_random(&repo.join("big.bin"), 6 << 20, 78);
    for i in 0..50 {
        std::fs::write(repo.join(format!("d/f{i}")), format!("file {i}\n")).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "files");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let fifo = m.dir.path().join("pause");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let out = m.dir.path().join("out");
    let mut child = paused_checkout(&m, &out, &fifo);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(out.join(".mado-checkout-partial").is_file());
    // --force writes over it, and the mark goes once every file is there.
    let forced = m.dir.path().join("forced");
    assert!(Command::new("cp").arg("-a").arg(&out).arg(&forced).status().unwrap().success());
    let temp = |d: &Path| {
        std::fs::read_dir(d).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".mado-tmp-"))
    };
    assert!(temp(&forced), "the killed checkout left its temp file");
    m.ok(&["checkout", "--force", "main", forced.to_str().unwrap()]);
    assert!(!forced.join(".mado-checkout-partial").exists());
    assert!(!temp(&forced), "--force over a killed checkout kept its temp file");
    assert!(same_bytes(&repo.join("big.bin"), &forced.join("big.bin")));
    // Something the tree does not have, put there since, is someone's: it
    // stops the clean-up, and stays (a different revision is judged by
    // its own tree).
    std::fs::create_dir(out.join("mine")).unwrap();
    std::fs::write(out.join("mine/notes.txt"), "precious\n").unwrap();
    let err = m.fails(&["checkout", "main", out.to_str().unwrap()], 1);
    assert!(err.contains("mine") && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(out.join("mine/notes.txt")).unwrap(), b"precious\n");
    std::fs::remove_dir_all(out.join("mine")).unwrap();
    let o = m.run(&["checkout", "main", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("interrupted checkout"), "{err}");
    assert_same_tree(&repo, &out);
    assert!(!out.join(".mado-checkout-partial").exists());
    // Done, the directory is the user's: not removed by another checkout.
    let err = m.fails(&["checkout", "main", out.to_str().unwrap()], 1);
    assert!(err.contains("not empty"), "{err}");

    // A failure partway (the pack is gone from the store, the cache
    // emptied) leaves no directory.
    for p in files_under(&m.store_dir().join("packs")) {
        if p.parent().unwrap().file_name().unwrap().len() == 2 {
            std::fs::remove_file(&p).unwrap();
        }
    }
    empty_cache(&m);
    let failed = m.dir.path().join("failed");
    let o = m.run(&["checkout", "main", failed.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not found in the store"), "failed partway, on the missing pack: {err}");
    assert!(!failed.exists(), "a failed checkout left {:?}", std::fs::read_dir(&failed).map(|d| d.count()));
}
