//! `mado serve-virtiofs` to a real guest: QEMU with KVM boots a Debian
//! kernel (`scripts/vm-run.sh`), the guest mounts the share with
//! `mount -t virtiofs` and runs a command. Skipped where /dev/kvm is
//! missing, unless MADO_REQUIRE_VM=1 (set by `make test`).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

fn vm_usable() -> bool {
    let ok = Path::new("/dev/kvm").exists();
    if !ok && std::env::var("MADO_REQUIRE_VM").as_deref() == Ok("1") {
        panic!("MADO_REQUIRE_VM=1 but /dev/kvm is missing");
    }
    if !ok {
        eprintln!("skipping: no /dev/kvm for a guest");
    }
    ok
}

fn vm_run_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/vm-run.sh")
}

/// A `mado serve-virtiofs` process, killed at the end.
struct Serve {
    child: Child,
    socket: PathBuf,
    /// What it printed on stderr up to its readiness line.
    said: String,
    /// What it printed on stderr after that, so far.
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn sock(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    /// Stops it as a VMM's supervisor would (SIGTERM) and waits.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.child.wait().unwrap()
    }

    /// Runs `script` in a fresh guest that mounts this share at
    /// /mnt/mado; returns its status and stdout.
    fn guest(&self, script: &str) -> (i32, Vec<u8>) {
        self.guest_argv(&[script])
    }

    /// Runs a command and its arguments (each passed whole) in a fresh
    /// guest, as [`Serve::guest`] runs a script.
    fn guest_argv(&self, argv: &[&str]) -> (i32, Vec<u8>) {
        let o = Command::new(vm_run_script())
            .args(["--virtiofs-socket", self.sock(), "--"])
            .args(argv)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        (o.status.code().unwrap_or(-1), o.stdout)
    }

    fn guest_ok(&self, script: &str) -> Vec<u8> {
        let (code, out) = self.guest(script);
        assert_eq!(code, 0, "guest command {script:?} failed; stdout: {}", String::from_utf8_lossy(&out));
        out
    }
}

/// Starts `mado serve-virtiofs` with `args` and waits for its readiness
/// line (it is listening once that is printed).
fn serve(m: &Mado, name: &str, args: &[&str]) -> Serve {
    let socket = m.dir.path().join(format!("{name}.sock"));
    let mut a = vec!["serve-virtiofs"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--socket", socket.to_str().unwrap()]);
    let mut child = m.cmd(&a).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let mut r = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            let _ = child.wait();
            panic!("mado serve-virtiofs exited before it was ready:\n{said}");
        }
        said.push_str(&line);
        if line.starts_with("serving ") {
            break;
        }
    }
    // Keep draining its stderr so it never blocks on a full pipe.
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let keep = log.clone();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while r.read_line(&mut sink).is_ok_and(|n| n > 0) {
            eprint!("serve-virtiofs: {sink}");
            keep.lock().unwrap().push_str(&sink);
            sink.clear();
        }
    });
    Serve { child, socket, said, log }
}

/// The guest's view of the share as a tar stream, unpacked on the host.
fn guest_tree(s: &Serve, into: &Path) {
    let tar = s.guest_ok("tar -cf - -C /mnt/mado .");
    std::fs::create_dir_all(into).unwrap();
    let mut c =
        Command::new("tar").args(["-xf", "-", "-C", into.to_str().unwrap()]).stdin(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(c.stdin.as_mut().unwrap(), &tar).unwrap();
    drop(c.stdin.take());
    assert!(c.wait().unwrap().success());
}

#[test]
fn a_guest_sees_the_snapshot_as_git_clone_does_and_cannot_write_it() {
    if !vm_usable() {
        return;
    }
    let m = Mado::local();
    let repo = setup(&m);
    let s = serve(&m, "ro", &["main"]);
    assert!(s.said.contains("serving main"), "{}", s.said);
    let seen = m.dir.path().join("seen");
    guest_tree(&s, &seen);
    let clone = m.dir.path().join("clone");
    git(m.dir.path(), &["clone", "-q", repo.to_str().unwrap(), clone.to_str().unwrap()]);
    std::fs::remove_dir_all(clone.join(".git")).unwrap();
    // Every path, kind, byte and symlink target; the modes are git's with
    // the write bits off (a snapshot is read-only, as through `mado mount`).
    let (a, b) = (snapshot_dir(&seen), snapshot_dir(&clone));
    let names = |m: &std::collections::BTreeMap<Vec<u8>, _>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b), "different paths");
    assert!(a.len() > 10);
    for (k, (kind, mode, data)) in &a {
        let (kind2, mode2, data2) = &b[k];
        let name = String::from_utf8_lossy(k);
        assert_eq!(kind, kind2, "{name}: kind");
        assert!(data == data2, "{name}: content or target");
        if *kind != 'l' {
            assert_eq!(*mode, mode2 & !0o222, "{name}: mode {mode:o} against git's {mode2:o}");
        }
    }
    // A snapshot is read-only: the guest's write fails, the share stays.
    let (code, _) = s.guest("echo x > /mnt/mado/new.txt");
    assert_ne!(code, 0, "a write into a read-only snapshot succeeded");
    // The server is still there for a second guest (a new connection and
    // a new FUSE session), and answers the control socket by its path.
    assert_eq!(s.guest_ok("cat /mnt/mado/src/deep/er/still.txt"), b"deep\n");
    // A second server on the same socket is refused; the first keeps it.
    // (Under `timeout`: one that took the socket would serve on, not exit.)
    let c = m.cmd(&["serve-virtiofs", "main", "--socket", s.sock()]);
    let mut t = Command::new("timeout");
    t.arg("30").arg(c.get_program()).args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => t.env(k, v),
            None => t.env_remove(k),
        };
    }
    let o = t.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("already served by mado"), "{err}");
    let st = m.json(&["stats", s.sock()]);
    assert!(st["reads"].as_u64().unwrap() > 0 || st["remote"]["gets"].as_u64().unwrap() > 0, "{st}");
    // No-open mode: a guest's session answers its first OPEN with ENOSYS
    // and then gets reads by inode, with no OPEN, RELEASE or FLUSH per file.
    let ops = &st["virtiofs"]["by_op"];
    assert!(ops["read"].as_u64().unwrap() > 10, "{st}");
    assert!(ops["open"].as_u64().unwrap_or(0) <= 3, "one OPEN per guest session at most: {st}");
    assert!(ops["release"].is_null() && ops["flush"].as_u64().unwrap_or(0) <= 3, "{st}");
    assert!(s.stop().success());
}

#[test]
fn a_guests_writes_to_a_served_workspace_survive_a_checkpoint_by_name_and_a_resume() {
    if !vm_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    m.ok(&["ws", "create", "vmws", "--from", "main", "--no-checkout"]);
    let s = serve(&m, "rw", &["vmws", "--workspace"]);
    s.guest_ok(
        "cd /mnt/mado && echo from-the-guest > guest.txt && mkdir -p d/e && printf 'x%.0s' $(seq 1 3000) > d/e/big.txt \
         && rm empty && mv src/lib.rs src/moved.rs && chmod +x README.md && ln -s guest.txt glink",
    );
    // By name: no directory of this machine holds the workspace.
    let cp = m.json(&["ws", "checkpoint", "vmws", "-m", "from a guest"]);
    assert_eq!(cp["workspace"], "vmws", "{cp}");
    // The lease is held while serving: a resume elsewhere is refused...
    let back = m.dir.path().join("back");
    let err = m.fails(&["ws", "resume", "vmws", back.to_str().unwrap()], 1);
    assert!(err.contains("lease") || err.contains("held"), "{err}");
    // ... and given back after the final save on SIGTERM.
    assert!(s.stop().success());
    let _ = std::fs::remove_dir_all(&back);
    m.ok(&["ws", "resume", "vmws", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(back.join("guest.txt")).unwrap(), "from-the-guest\n");
    assert_eq!(std::fs::read(back.join("d/e/big.txt")).unwrap(), vec![b'x'; 3000]);
    assert!(!back.join("empty").exists());
    assert!(back.join("src/moved.rs").exists() && !back.join("src/lib.rs").exists());
    assert_eq!(std::fs::read_link(back.join("glink")).unwrap(), Path::new("guest.txt"));
    use std::os::unix::fs::PermissionsExt;
    assert_ne!(std::fs::metadata(back.join("README.md")).unwrap().permissions().mode() & 0o100, 0);
}

#[test]
fn a_killed_server_loses_nothing_the_guest_synced() {
    if !vm_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    m.ok(&["ws", "create", "k9", "--from", "main", "--no-checkout"]);
    let mut s = serve(&m, "k9", &["k9", "--workspace"]);
    s.guest_ok("cd /mnt/mado && echo kept > kept.txt && sync");
    // SIGKILL: no final save, no lease release.
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    drop(s);
    let s = serve(&m, "k9b", &["k9", "--workspace"]);
    assert_eq!(s.guest_ok("cat /mnt/mado/kept.txt"), b"kept\n");
    let cp = m.json(&["ws", "checkpoint", "k9", "-m", "after a kill"]);
    assert_eq!(cp["workspace"], "k9", "{cp}");
    assert!(s.stop().success());
    let back = m.dir.path().join("back");
    m.ok(&["ws", "resume", "k9", back.to_str().unwrap(), "--read-only"]);
    assert_eq!(std::fs::read_to_string(back.join("kept.txt")).unwrap(), "kept\n");
}

fn gets(s: &serde_json::Value) -> u64 {
    s["remote"]["gets"].as_u64().unwrap() + s["remote"]["ranged_gets"].as_u64().unwrap()
}

#[test]
fn a_guests_cold_walk_of_a_packed_subtree_costs_the_gets_a_mount_does() {
    if !vm_usable() || !fuse_usable() {
        return;
    }
    let m = Mado::local();
    let repo = dense_repo(m.dir.path());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(m.cache_dir());
    let s = serve(&m, "dense", &["main"]);
    let before = gets(&m.json(&["stats", s.sock()]));
    let sum = s.guest_ok("cat dense/* | md5sum");
    let st = m.json(&["stats", s.sock()]);
    let guest_gets = gets(&st) - before;
    assert!(s.stop().success());

    // The same walk through a FUSE mount on the host, from a cold cache.
    let _ = std::fs::remove_dir_all(m.cache_dir());
    let mnt = m.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    m.ok(&["mount", "main", mnt.to_str().unwrap()]);
    let before = gets(&m.json(&["stats", mnt.to_str().unwrap()]));
    let out = Command::new("sh").arg("-c").arg("cat dense/* | md5sum").current_dir(&mnt).output().unwrap();
    let host_gets = gets(&m.json(&["stats", mnt.to_str().unwrap()])) - before;
    m.ok(&["umount", mnt.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&sum), String::from_utf8_lossy(&out.stdout), "the same bytes");
    assert_eq!(guest_gets, host_gets, "the guest's walk and the mount's cost the same GETs");
    assert_eq!(guest_gets, 1, "one ranged GET for the packed subtree");
}

/// A workspace served to a guest is one writer on this machine too: a
/// mount of it here is refused naming the server (not `mado umount`,
/// which cannot stop a server). No guest needed.
#[test]
fn a_served_workspace_cannot_also_be_mounted_here() {
    if !fuse_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    m.ok(&["ws", "create", "served", "--no-checkout"]);
    let s = serve(&m, "served", &["served", "--workspace"]);
    let mnt = m.dir.path().join("mnt");
    let err = m.fails(&["ws", "resume", "served", mnt.to_str().unwrap(), "--mount"], 1);
    assert!(err.contains("serve-virtiofs") && err.contains(s.sock()), "{err}");
    assert!(s.stop().success());
}

/// Every write path of a guest, in files named `P*`, then the files read
/// back: create by redirection and by dd, overwrite of a file of the
/// snapshot, append, an O_TRUNC rewrite, truncate (dd's), rename over.
/// (busybox has no tool that writes through mmap.)
fn write_paths(p: &str) -> String {
    format!(
        "echo from-guest > {p}1.txt; \
         dd if=/dev/zero bs=1000 count=3 2>/dev/null | tr '\\000' y > {p}dd.bin; \
         dd if={p}1.txt of={p}dd2.txt 2>/dev/null; \
         echo {p}-over > {p}README.md; \
         echo more >> {p}1.txt; \
         printf 'a long first version' > {p}rewrite.txt; printf short > {p}rewrite.txt; \
         printf abcdefgh > {p}trunc.txt; dd if=/dev/null of={p}trunc.txt bs=1 seek=3 2>/dev/null; \
         echo old > {p}over.txt; echo new > {p}tmp.txt; mv {p}tmp.txt {p}over.txt; \
         sync; cat {p}1.txt {p}dd2.txt {p}README.md {p}rewrite.txt {p}trunc.txt {p}over.txt; wc -c < {p}dd.bin"
    )
}

/// What [`write_paths`] leaves, path and bytes.
fn written(p: &str) -> Vec<(String, Vec<u8>)> {
    vec![
        (format!("{p}1.txt"), b"from-guest\nmore\n".to_vec()),
        (format!("{p}dd.bin"), vec![b'y'; 3000]),
        (format!("{p}dd2.txt"), b"from-guest\n".to_vec()),
        (format!("{p}README.md"), format!("{p}-over\n").into_bytes()),
        (format!("{p}rewrite.txt"), b"short".to_vec()),
        (format!("{p}trunc.txt"), b"abc".to_vec()),
        (format!("{p}over.txt"), b"new\n".to_vec()),
    ]
}

/// What [`write_paths`]' guest prints.
fn printed(p: &str) -> String {
    format!("from-guest\nmore\nfrom-guest\n{p}-over\nshortabcnew\n3000\n")
}

/// The first writes of a guest's session are kept byte for byte, by every
/// write path, as its later ones are; a checkpoint by name and a resume on
/// the host have them; a guest powering off is no error in the log. (The
/// lost first file of issue #49 was `vm-run.sh -- sh -c '...'` joining its
/// words: the guest ran `sh -c echo from-guest > t1.txt`, an echo with no
/// arguments. Several words now run as a command and its arguments.)
#[test]
fn a_guests_first_writes_of_a_session_are_kept_by_every_write_path() {
    if !vm_usable() {
        return;
    }
    let m = Mado::local();
    setup(&m);
    m.ok(&["ws", "create", "first", "--from", "main", "--no-checkout"]);
    let s = serve(&m, "first", &["first", "--workspace"]);
    // The guest's very first operations, given as `sh -c SCRIPT`.
    let (code, out) = s.guest_argv(&["sh", "-c", &write_paths("a")]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out));
    assert_eq!(String::from_utf8_lossy(&out), printed("a"));
    // Later ones, in the same session and in a new one (a script).
    // The first an overwrite of a file of the snapshot.
    let (code, out) = s.guest(&format!("echo b-over > README.md; {}; {}", write_paths("b"), write_paths("c")));
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out));
    assert_eq!(String::from_utf8_lossy(&out), printed("b") + &printed("c"));
    let cp = m.json(&["ws", "checkpoint", "first", "-m", "a guest's writes"]);
    assert_eq!(cp["workspace"], "first", "{cp}");
    let log = s.log.lock().unwrap().clone();
    assert!(s.stop().success());
    assert!(!log.contains("ERROR"), "a guest's power-off was logged as an error:\n{log}");
    assert!(log.contains("session ended"), "{log}");
    let back = m.dir.path().join("back");
    m.ok(&["ws", "resume", "first", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(back.join("README.md")).unwrap(), b"b-over\n");
    for p in ["a", "b", "c"] {
        for (name, bytes) in written(p) {
            assert_eq!(std::fs::read(back.join(&name)).unwrap(), bytes, "{name}");
        }
    }
}

/// `--socket PATH` never removes what is not a stale socket: a regular
/// file there is refused and kept (it was unlinked), and so is the socket
/// of a server that is running; a stale socket is replaced.
#[test]
fn serve_virtiofs_takes_only_a_free_path_or_a_stale_socket() {
    let m = Mado::local();
    setup(&m);
    let file = m.dir.path().join("precious.txt");
    std::fs::write(&file, "keep me\n").unwrap();
    let err = m.fails(&["serve-virtiofs", "main", "--socket", file.to_str().unwrap()], 1);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me\n");
    let stale = m.dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let s = serve(&m, "stale", &["main"]);
    assert_eq!(s.socket, stale);
    let err = m.fails(&["serve-virtiofs", "main", "--socket", stale.to_str().unwrap()], 1);
    assert!(err.contains("already served") || err.contains("server that is running"), "{err}");
    assert!(s.stop().success());
}
