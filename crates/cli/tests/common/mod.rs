//! Test harness for the `mado` binary: a hermetic HOME per test, a remote
//! (local directory or the MinIO server the test command started), and a
//! git repository fixture built with the real `git`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

pub fn s3_base() -> Option<String> {
    match std::env::var("MADO_TEST_S3_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("MADO_REQUIRE_S3").as_deref() == Ok("1") => {
            panic!("MADO_REQUIRE_S3=1 but MADO_TEST_S3_URL is not set: start MinIO with scripts/minio.sh")
        }
        _ => {
            eprintln!("skipping the S3 case: MADO_TEST_S3_URL not set (make test starts MinIO)");
            None
        }
    }
}

/// The Azurite container the suite started (`scripts/azurite.sh`), as
/// `az://container`; required when MADO_REQUIRE_EMULATORS=1.
pub fn azure_base() -> Option<String> {
    emulator_base("MADO_TEST_AZURE_URL", "scripts/azurite.sh")
}

/// The fake-gcs-server bucket the suite started (`scripts/gcs.sh`).
pub fn gcs_base() -> Option<String> {
    emulator_base("MADO_TEST_GCS_URL", "scripts/gcs.sh")
}

fn emulator_base(var: &str, script: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("MADO_REQUIRE_EMULATORS").as_deref() == Ok("1") => {
            panic!("MADO_REQUIRE_EMULATORS=1 but {var} is not set: start the emulator with {script}")
        }
        _ => {
            eprintln!("skipping a case: {var} not set (make test starts the emulator with {script})");
            None
        }
    }
}

pub struct Mado {
    pub dir: tempfile::TempDir,
    pub remote: String,
}

impl Mado {
    pub fn local() -> Mado {
        let dir = tempfile::tempdir().unwrap();
        let remote = format!("file://{}/store", dir.path().display());
        Mado { dir, remote }
    }

    /// One of each backend the tests have: the local store, and MinIO
    /// when the suite runs with one (`make test` always does).
    pub fn every_backend() -> Vec<(&'static str, Mado)> {
        let mut v = vec![("local", Mado::local())];
        if let Some(base) = s3_base() {
            v.push(("minio", Mado::s3(&base)));
        }
        if let Some(base) = azure_base() {
            v.push(("azurite", Mado::s3(&base)));
        }
        v
    }

    /// A fresh prefix under a cloud store's `base` URL (`s3://bucket`,
    /// `az://container`, `gs://bucket`).
    pub fn s3(base: &str) -> Mado {
        let dir = tempfile::tempdir().unwrap();
        let remote = format!("{}/e2e-{:016x}", base.trim_end_matches('/'), rand::random::<u64>());
        Mado { dir, remote }
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    pub fn cache_dir(&self) -> PathBuf {
        self.home().join(".cache").join("mado")
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mado"));
        c.args(args)
            .env("HOME", self.home())
            .env("MADO_REMOTE_ADDR", &self.remote)
            .env_remove("XDG_CACHE_HOME")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("XDG_DATA_HOME")
            .env_remove("MADO_CACHE_DIR")
            .env_remove("MADO_CONFIG")
            .env_remove("MADO_DISK_CACHE_MAX_BYTES")
            .env_remove("MADO_LOG")
            .env_remove("RUST_LOG");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs and asserts success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "mado {args:?} failed ({:?}):\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Runs with --json and parses stdout.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    /// [`Mado::json`] of a command that may fail: `None` then.
    pub fn try_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut a = args.to_vec();
        a.push("--json");
        let o = self.run(&a);
        o.status.success().then(|| serde_json::from_slice(&o.stdout).ok()).flatten()
    }

    /// Runs, expects failure with `code`; returns stderr.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let o = self.run(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "mado {args:?}: stderr:\n{err}");
        err
    }
}

/// Makes `repo` (and its parents) and a git repository in it, on `main`.
pub fn init_repo(repo: &Path) {
    std::fs::create_dir_all(repo).unwrap();
    git(repo, &["init", "-q", "-b", "main"]);
}

/// Commits everything in the work tree of `repo` (`git add -A`) as `msg`.
pub fn commit_all(repo: &Path, msg: &str) {
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", msg]);
}

pub fn git(repo: &Path, args: &[&str]) -> String {
    let o = git_cmd(repo).args(args).output().unwrap();
    assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

pub fn git_cmd(repo: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(repo)
        .env("HOME", repo.parent().unwrap())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Test Author")
        .env("GIT_AUTHOR_EMAIL", "author@example.com")
        .env("GIT_AUTHOR_DATE", "2026-01-02T03:04:05Z")
        .env("GIT_COMMITTER_NAME", "Test Author")
        .env("GIT_COMMITTER_EMAIL", "author@example.com")
        .env("GIT_COMMITTER_DATE", "2026-01-02T03:04:05Z");
    c
}

pub fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A repository with every shape the import must get right.
pub fn fixture_repo(parent: &Path) -> PathBuf {
    let repo = parent.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    let w = |p: &str, data: &[u8]| {
        let p = repo.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    w("README.md", b"# fixture\n");
    w("empty", b"");
    w("src/lib.rs", b"pub fn f() {}\n");
    w("src/deep/er/still.txt", b"deep\n");
    w("run.sh", b"#!/bin/sh\necho hi\n");
    std::fs::set_permissions(repo.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    w(".gitattributes", b"*.bat text eol=crlf\n");
    w("win.bat", b"echo one\necho two\n");
    w("big.bin", &pseudo_random(5 << 20 | 12345, 7));
    std::fs::write(repo.join(OsStr::from_bytes(b"caf\xe9.txt")), b"latin-1 name\n").unwrap();
    std::os::unix::fs::symlink("README.md", repo.join("link")).unwrap();
    std::os::unix::fs::symlink("../../../../../etc/passwd", repo.join("src/escape")).unwrap();
    git(&repo, &["add", "-A"]);
    // A gitlink (submodule commit) with no submodule checked out.
    git(&repo, &["update-index", "--add", "--cacheinfo", "160000,1111111111111111111111111111111111111111,vendor/sub"]);
    git(&repo, &["commit", "-q", "-m", "fixture"]);
    repo
}

/// The fixture with 300 small files in one directory, `dense/` (one pack):
/// the repository of the cold-walk counts (`mount.rs`, `virtiofs.rs`).
pub fn dense_repo(parent: &Path) -> PathBuf {
    let repo = fixture_repo(parent);
    std::fs::create_dir_all(repo.join("dense")).unwrap();
    for i in 0..300 {
        std::fs::write(repo.join(format!("dense/f{i:03}.txt")), format!("file {i}\n").repeat(i % 7 + 1)).unwrap();
    }
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "dense"]);
    repo
}

/// What a directory holds: path -> (kind, permission bits, content or target).
pub fn snapshot_dir(root: &Path) -> BTreeMap<Vec<u8>, (char, u32, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, (char, u32, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
            if rel == b".git" {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.mode() & 0o777;
            if m.file_type().is_symlink() {
                out.insert(rel, ('l', 0, std::fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec()));
            } else if m.is_dir() {
                out.insert(rel, ('d', mode, Vec::new()));
                walk(root, &p, out);
            } else {
                out.insert(rel, ('f', mode, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Asserts two directories are equal in every byte, mode bit and target.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let (x, y) = (snapshot_dir(a), snapshot_dir(b));
    let names =
        |m: &BTreeMap<Vec<u8>, _>| m.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect::<Vec<_>>();
    assert_eq!(names(&x), names(&y), "different paths");
    for (k, v) in &x {
        let w = &y[k];
        let name = String::from_utf8_lossy(k);
        assert_eq!(v.0, w.0, "{name}: kind");
        assert_eq!(v.1, w.1, "{name}: mode {:o} vs {:o}", v.1, w.1);
        assert!(v.2 == w.2, "{name}: content differs ({} vs {} bytes)", v.2.len(), w.2.len());
    }
}

// ---- Workspaces ----

/// Everything a resume must restore: kind, mode, content or target, mtime.
pub fn full_state(root: &Path) -> BTreeMap<Vec<u8>, (char, u32, Vec<u8>, SystemTime)> {
    snapshot_dir(root)
        .into_iter()
        .filter(|(k, _)| !k.starts_with(b".mado"))
        .map(|(k, (kind, mode, data))| {
            let p = root.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&k));
            let mtime = std::fs::symlink_metadata(&p).unwrap().modified().unwrap();
            (k, (kind, mode & 0o100, data, mtime))
        })
        .collect()
}

pub fn assert_same_state(a: &Path, b: &Path) {
    let (x, y) = (full_state(a), full_state(b));
    let names =
        |m: &BTreeMap<Vec<u8>, _>| m.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect::<Vec<_>>();
    assert_eq!(names(&x), names(&y));
    for (k, v) in &x {
        let w = &y[k];
        let n = String::from_utf8_lossy(k);
        assert_eq!((v.0, v.1), (w.0, w.1), "{n}: kind or exec bit");
        assert!(v.2 == w.2, "{n}: content");
        assert_eq!(v.3, w.3, "{n}: mtime");
    }
    // The root directory's own mtime too.
    assert_eq!(std::fs::metadata(a).unwrap().modified().unwrap(), std::fs::metadata(b).unwrap().modified().unwrap());
}

pub fn set_mtime(p: &Path, secs: u64) {
    let f = std::fs::File::options().write(true).open(p).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)).unwrap();
}

/// The edits of the issue: add, modify, delete, rename, chmod, symlink,
/// an old mtime.
pub fn edit(dir: &Path) {
    std::fs::write(dir.join("added.txt"), "new file\n").unwrap();
    std::fs::write(dir.join("README.md"), "# modified\n").unwrap();
    std::fs::remove_file(dir.join("empty")).unwrap();
    std::fs::rename(dir.join("src/lib.rs"), dir.join("src/renamed.rs")).unwrap();
    std::fs::set_permissions(dir.join("win.bat"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("src/renamed.rs", dir.join("newlink")).unwrap();
    set_mtime(&dir.join("src/deep/er/still.txt"), 1_000_000_000);
}

pub fn setup(m: &Mado) -> PathBuf {
    let repo = fixture_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    repo
}

/// Whether FUSE mounts can run here (a panic under MADO_REQUIRE_FUSE=1 if not).
pub fn fuse_usable() -> bool {
    let ok = Path::new("/dev/fuse").exists()
        && std::process::Command::new("fusermount3").arg("-V").output().is_ok_and(|o| o.status.success());
    if !ok && std::env::var("MADO_REQUIRE_FUSE").as_deref() == Ok("1") {
        panic!("MADO_REQUIRE_FUSE=1 but FUSE is not usable (need /dev/fuse and fusermount3 from Debian's fuse3)");
    }
    if !ok {
        eprintln!("skipping: FUSE is not usable here");
    }
    ok
}

/// Every object of a local store, id -> bytes: those stored alone, the
/// trees that pack indexes carry inline, and the members of the packs the
/// indexes name (each verified: a member whose bytes do not hash to its id
/// counts as absent).
pub fn store_objects(store: &Path) -> BTreeMap<mado_core::Hash, Vec<u8>> {
    let mut out = BTreeMap::new();
    if let Ok(dirs) = std::fs::read_dir(store.join("objects")) {
        for d in dirs {
            for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
                let f = f.unwrap();
                if let Ok(id) = f.file_name().to_string_lossy().parse::<mado_core::Hash>() {
                    out.insert(id, std::fs::read(f.path()).unwrap());
                }
            }
        }
    }
    let Ok(indexes) = std::fs::read_dir(store.join("packs/index")) else { return out };
    let mut deltas = Vec::new();
    for i in indexes {
        let Ok(idx) = mado_core::pack::PackIndex::decode(&std::fs::read(i.unwrap().path()).unwrap()) else { continue };
        deltas.extend(idx.deltas);
        for (id, t) in idx.trees {
            out.insert(id, t);
        }
        for p in &idx.packs {
            let hex = p.id.to_hex();
            let Ok(body) = std::fs::read(store.join("packs").join(&hex[..2]).join(&hex)) else { continue };
            for m in &p.members {
                let Some(stored) = body.get(m.offset as usize..(m.offset + m.stored_len) as usize) else { continue };
                if let Ok(raw) = mado_core::pack::decode_member(m, stored) {
                    if mado_core::Hash::of(&raw) == m.id {
                        out.insert(m.id, raw);
                    }
                }
            }
        }
    }
    // A layer's trees written as deltas, each rebuilt over its base once
    // that is at hand (a base may be a delta of a layer below).
    while !deltas.is_empty() {
        let before = deltas.len();
        deltas.retain(|d| {
            let made = out.get(&d.base).map(|b| d.apply(b));
            let Some(Ok(t)) = made else { return true };
            out.insert(d.id, t);
            false
        });
        if deltas.len() == before {
            break;
        }
    }
    out
}

/// The closure rule on a local store: every tree present has every
/// object it names present too (and every chunk manifest its chunks).
pub fn assert_store_closed(store: &Path) {
    use mado_core::object::{ChunkManifest, Kind, Tree};
    let objects = store_objects(store);
    let mut trees = 0;
    for (id, bytes) in &objects {
        if let Ok(t) = Tree::decode(bytes) {
            trees += 1;
            for e in &t.entries {
                if e.kind != Kind::Gitlink {
                    assert!(
                        objects.contains_key(&e.id),
                        "tree {id} is in the store but its entry {:?} ({}) is not",
                        String::from_utf8_lossy(&e.name),
                        e.id
                    );
                }
            }
        } else if let Ok(m) = ChunkManifest::decode(bytes) {
            for c in m.data_chunks() {
                assert!(objects.contains_key(&c), "manifest {id} is in the store but its chunk {c} is not");
            }
        }
    }
    let _ = trees;
}

/// Every ref of a local store reaches only objects that exist and decode:
/// its snapshot (and their parents), the root tree and every tree, file,
/// chunk manifest and chunk below it, and the stat object. Returns the
/// number of refs checked.
/// The files below `dir` (none if it does not exist), names starting
/// with `.` (a store's temp files) left out.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if !e.file_name().to_string_lossy().starts_with('.') {
                out.push(e.path());
            }
        }
    }
    out
}

pub fn assert_refs_whole(store: &Path) -> usize {
    use mado_core::object::{ChunkManifest, Kind, RefValue, Snapshot, Tree};
    use mado_core::Hash;
    let objects = store_objects(store);
    let snapshot = |id: &Hash| -> Snapshot {
        let hex = id.to_hex();
        let b = std::fs::read(store.join("snapshots").join(&hex[..2]).join(&hex))
            .unwrap_or_else(|e| panic!("snapshot {id} a ref reaches is missing: {e}"));
        assert_eq!(Hash::of(&b), *id, "snapshot {id} is corrupt");
        Snapshot::decode(&b).unwrap_or_else(|e| panic!("snapshot {id} does not decode: {e}"))
    };
    let object = |id: &Hash, what: &str| -> &Vec<u8> {
        let b = objects.get(id).unwrap_or_else(|| panic!("{what} {id} a ref reaches is missing"));
        assert_eq!(Hash::of(b), *id, "{what} {id} is corrupt");
        b
    };
    let refs = files_under(&store.join("refs"));
    let mut seen = std::collections::HashSet::new();
    for r in &refs {
        let v = RefValue::decode(&std::fs::read(r).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", r.display()));
        let mut snaps = vec![v.snapshot];
        while let Some(s) = snaps.pop() {
            if !seen.insert(*s) {
                continue;
            }
            let snap = snapshot(&s);
            snaps.extend(snap.parents.iter().copied());
            if let Some(st) = snap.stat {
                object(&st, "stat object");
            }
            let mut trees = vec![*snap.root];
            while let Some(t) = trees.pop() {
                if !seen.insert(t) {
                    continue;
                }
                let tree = Tree::decode(object(&t, "tree")).unwrap_or_else(|e| panic!("tree {t}: {e}"));
                for e in &tree.entries {
                    match e.kind {
                        Kind::Directory => trees.push(e.id),
                        Kind::Gitlink => {}
                        _ if e.chunked => {
                            let m = ChunkManifest::decode(object(&e.id, "chunk manifest")).unwrap();
                            for c in m.data_chunks() {
                                object(&c, "chunk");
                            }
                        }
                        _ => {
                            object(&e.id, "file");
                        }
                    }
                }
            }
        }
    }
    refs.len()
}

/// A checkout of `main` from an empty cache equals `git clone` of `repo`
/// in every byte, mode and symlink target.
pub fn assert_cold_checkout_equals_clone(m: &Mado, repo: &Path) {
    assert_cold_checkout_of_equals_clone(m, repo, "main");
}

/// [`assert_cold_checkout_equals_clone`] of ref `name` (which holds what
/// `repo`'s HEAD holds).
pub fn assert_cold_checkout_of_equals_clone(m: &Mado, repo: &Path, name: &str) {
    std::fs::remove_dir_all(m.cache_dir()).unwrap();
    let co = m.dir.path().join("co");
    m.ok(&["checkout", name, co.to_str().unwrap()]);
    let clone = m.dir.path().join("clone");
    git(m.dir.path(), &["clone", "-q", repo.to_str().unwrap(), clone.to_str().unwrap()]);
    assert_same_tree(&clone, &co);
}

pub fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Empties the disk cache of content (loose objects and cached packs),
/// keeping pack index pointers and workspace state.
#[allow(dead_code)]
pub fn empty_cache(m: &Mado) {
    let _ = std::fs::remove_dir_all(m.cache_dir().join("objects"));
    let _ = std::fs::remove_dir_all(m.cache_dir().join("packs").join("data"));
}

/// A TCP relay on loopback in front of a server (MinIO): `close` breaks
/// every connection through it and refuses new ones (the store goes
/// away); `open` lets them through again, on the same port.
pub struct Gate {
    pub port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Gate {
    pub fn new(upstream: &str) -> Gate {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>> = Default::default();
        let (o, c, up) = (open.clone(), conns.clone(), upstream.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !o.load(SeqCst) {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(&up) else { continue };
                let mut list = c.lock().unwrap();
                list.push(client.try_clone().unwrap());
                list.push(server.try_clone().unwrap());
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Gate { port, open, conns }
    }

    pub fn close(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits (bounded: 30 s) until `f` holds: what a daemon finishes off the
/// caller's path (a whole copy built, a FORGET handled).
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills (SIGKILL) the keeper of mount daemon `pid` (crates/mount's
/// keeper: the daemon's parent or child running `__keep-mount`), so that a
/// kill of the daemon after it is a whole crash: the mount disconnected,
/// as with no keeper.
pub fn kill_keeper_of(pid: u64) {
    let keeper = |p: u64| {
        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.windows(13).any(|w| w == b"__keep-mount\0"))
    };
    let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").and_then(|(_, r)| r.split(' ').nth(1)?.parse::<u64>().ok()));
    let children: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u64>>())
        .collect();
    for k in ppid.into_iter().chain(children).filter(|p| keeper(*p)) {
        let _ = Command::new("kill").arg("-9").arg(k.to_string()).status();
        for _ in 0..100 {
            if !Path::new(&format!("/proc/{k}")).exists()
                || std::fs::read_to_string(format!("/proc/{k}/stat")).is_ok_and(|s| s.contains(") Z "))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
