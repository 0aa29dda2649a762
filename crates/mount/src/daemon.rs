//! The mount daemon: opens a snapshot (resolving the ref, reading the
//! snapshot and attaching its pack index together), loads its trees from
//! the index, serves the control socket, mounts the FUSE filesystem and
//! reports readiness; then waits, woken by the unmount or a signal.
//!
//! Recovery: a workspace mount made as root has a keeper that starts a
//! new daemon on the same mount when this one is killed (crate::keeper).
//! Without one (or with the keeper killed too) a killed daemon leaves its
//! mount point disconnected ("Transport endpoint is not connected"); `mado
//! umount DIR` and `mado mount` on the same DIR detect that and detach it
//! lazily (`fusermount3 -uz`); the stale socket file is replaced.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mado_core::fetch::{Attach, Fetcher};
use mado_core::vfs::SnapshotFs;
use mado_core::{Error, Result};

use crate::control;
use crate::fs::MadoFs;
use crate::fuse_mount::{serve_fuse, serve_until_unmounted, FUSE_THREADS};
use crate::handler::{ControlHandler, Ws};
use crate::protocol::{Op, Reply, Request};

pub struct MountOptions {
    /// A ref or snapshot id (read-only), or with `workspace` the workspace name.
    pub spec: String,
    /// How the filesystem reaches its users.
    pub serve: Serve,
    pub read_timeout: Duration,
    pub passthrough: bool,
    /// Mount workspace `spec` read-write.
    pub workspace: bool,
    /// With `workspace`: take its lease even though it expired under another holder.
    pub steal: bool,
    /// Take the mount over from the daemon at the other end of this
    /// inherited socket (`crate::handover`) rather than mount anew.
    pub handover_fd: Option<i32>,
}

/// The transport: the filesystem behind either is the same [`MadoFs`].
pub enum Serve {
    /// A FUSE mount at this directory.
    Fuse {
        mountpoint: PathBuf,
        /// Let other users (other uids) in, as `allow_other`; the kernel
        /// checks each access against the modes (`default_permissions`,
        /// always on).
        allow_other: bool,
    },
    /// A vhost-user-fs backend listening on this socket, for a VM guest
    /// (QEMU's `vhost-user-fs-pci`, Cloud Hypervisor's `--fs`); one VMM
    /// connection at a time, until SIGTERM or SIGINT.
    VirtioFs { socket: PathBuf },
}

impl Serve {
    /// The path that names this daemon: its control socket is found from
    /// it (`mado stats PATH`, `mado pack-status PATH`).
    fn path(&self) -> &Path {
        match self {
            Serve::Fuse { mountpoint, .. } => mountpoint,
            Serve::VirtioFs { socket } => socket,
        }
    }
}

/// What the daemon reports once the mount is up.
pub struct Ready {
    pub snapshot: String,
    pub attach: Attach,
    /// The advisory for a large tree served without packs.
    pub advisory: Option<String>,
    /// Warnings for the user (a workspace's lease, set-aside changes).
    pub warnings: Vec<mado_core::error::Warning>,
}

/// Is `p` a mount point whose daemon is gone?
pub fn is_disconnected(p: &Path) -> bool {
    // statfs always reaches the daemon (the kernel keeps no answer to it),
    // where a stat may be answered from attributes the kernel still holds
    // for a while after the daemon died.
    matches!(rustix::fs::statfs(p), Err(e) if e == rustix::io::Errno::NOTCONN)
}

/// Unmounts `p` and waits (at most `wait`) for its daemon to exit, so a
/// workspace's last state is saved before this returns and a new mount of
/// it starts from that state. Woken by the process's exit (a pidfd), not
/// by polling.
pub fn unmount_and_wait(p: &Path, wait: Duration) -> std::io::Result<()> {
    let pid = control::absolute(p)
        .and_then(|mp| control::socket_path(&mp))
        .ok()
        .and_then(|sock| control::request(&sock, &Request::new(Op::Stats), Duration::from_secs(10)).ok())
        .and_then(|r| match r {
            Reply::Stats(s) => rustix::process::Pid::from_raw(s.pid as i32),
            _ => None,
        });
    let pidfd = pid.and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok());
    unmount(p)?;
    if let Some(fd) = pidfd {
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        let t = rustix::event::Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: 0 };
        let _ = rustix::event::poll(&mut fds, Some(&t));
    }
    Ok(())
}

/// The mount's source as /proc/mounts, findmnt and df show it: the ref
/// or snapshot mounted (`ws/NAME` for a workspace), with no character that
/// would need escaping there.
pub(crate) fn source_name(spec: &str, workspace: bool) -> String {
    let s = if workspace { format!("ws/{spec}") } else { spec.to_string() };
    s.chars().map(|c| if c.is_ascii_graphic() && c != ',' { c } else { '_' }).collect()
}

/// Whether `p` is a mount point (its entry in /proc/self/mountinfo).
pub fn is_mount_point(p: &Path) -> bool {
    let Ok(abs) = std::fs::canonicalize(p).or_else(|_| control::absolute(p)) else { return false };
    let want = abs
        .to_string_lossy()
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str())))
}

/// Unmounts `p` (lazily if its daemon is gone).
pub fn unmount(p: &Path) -> std::io::Result<()> {
    let lazy = is_disconnected(p);
    if !lazy && !is_mount_point(p) {
        return Err(std::io::Error::other(format!("{} is not mounted", p.display())));
    }
    let mut c = std::process::Command::new("fusermount3");
    c.arg(if lazy { "-uz" } else { "-u" }).arg(p);
    let out = c.output()?;
    if out.status.success() {
        let _ = std::fs::remove_file(control::socket_path(&control::absolute(p)?)?);
        return Ok(());
    }
    Err(std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()))
}

/// A packed snapshot keeps FUSE's OPEN (for passthrough of large files'
/// whole copies) when at least one entry in this many is a large file.
const LARGE_FILES_SHARE: usize = 100;

/// Runs a mount until it is unmounted. `ready` is called once: with the
/// mount's description when it is up, or with the error that stopped it.
pub fn run(
    opts: MountOptions,
    fetcher: Arc<Fetcher>,
    rt: &tokio::runtime::Handle,
    ready: impl FnOnce(std::result::Result<Ready, &Error>),
) -> Result<()> {
    let (daemon, report) = match Daemon::start(opts, fetcher, rt) {
        Ok(v) => v,
        Err(e) => {
            ready(Err(&e));
            return Err(e);
        }
    };
    // Opening decoded and merged what is no longer needed (a stat object
    // of every path, index layers made flat): give it back before serving.
    mado_core::memory::give_back();
    ready(Ok(report));
    daemon.save_on_change();
    daemon.stop_on_signal();
    daemon.wait_and_tear_down()
}

/// A mount being served: what its end needs.
struct Daemon {
    spec: String,
    fuse: bool,
    rt: tokio::runtime::Handle,
    fetcher: Arc<Fetcher>,
    core: Arc<SnapshotFs>,
    mountpoint: PathBuf,
    /// The control socket, and its alias by workspace name (a workspace
    /// served to a VM has no directory here).
    sock: PathBuf,
    by_name: Option<PathBuf>,
    ws: Option<Arc<Ws>>,
    saver: Option<Arc<mado_core::workspace::StateSaver>>,
    save_error: Arc<Mutex<Option<String>>>,
    served: Served,
    /// A workspace's FUSE session, for a handover (`mado restart`), and
    /// how to serve again if the new daemon fails.
    seat: Option<Arc<crate::handover::Seat>>,
    make_fs: Arc<dyn Fn(bool) -> MadoFs + Send + Sync>,
    allow_other: bool,
}

/// What a daemon before this one passed, in the pieces `start` uses: the
/// workspace's lock and saved inode numbers, the kernel connection, the
/// channel to answer the old daemon on, and the keeper's link.
type Pieces = (
    Option<mado_core::workspace::HandedOver>,
    Option<crate::fuse_mount::Taken>,
    Option<std::os::fd::OwnedFd>,
    Option<std::os::fd::OwnedFd>,
);

fn split_handover(received: Option<crate::handover::Received>) -> Pieces {
    match received {
        Some(r) => {
            let lock = mado_core::workspace::MountLock::from_fd(r.lock);
            let taken = crate::fuse_mount::Taken { fd: r.fuse, from_keeper: r.image.is_none() };
            (Some(mado_core::workspace::HandedOver { lock, image: r.image }), Some(taken), Some(r.answer), r.keeper)
        }
        None => (None, None, None, None),
    }
}

/// A virtio-fs workspace's control socket, also reachable by the
/// workspace's name (the mount point is a vhost-user socket there).
fn link_by_name(fetcher: &Fetcher, w: &Ws, sock: &Path) -> Result<PathBuf> {
    let alias = control::workspace_socket_path(fetcher.remote.url(), w.handle.name())
        .map_err(Error::io("placing the control socket"))?;
    let _ = std::fs::remove_file(&alias);
    std::os::unix::fs::symlink(sock, &alias).map_err(Error::io(format!("linking {}", alias.display())))?;
    Ok(alias)
}

/// A snapshot or workspace opened for a mount.
struct Opened {
    id: mado_core::SnapshotId,
    core: Arc<SnapshotFs>,
    attach: Attach,
    ws: Option<Ws>,
    warnings: Vec<mado_core::error::Warning>,
}

impl Daemon {
    /// Everything up to the moment the mount serves: the target checked,
    /// the snapshot opened, the control socket answering, the transport up.
    fn start(opts: MountOptions, fetcher: Arc<Fetcher>, rt: &tokio::runtime::Handle) -> Result<(Daemon, Ready)> {
        let mp = control::absolute(opts.serve.path()).map_err(Error::io("resolving the mount point"))?;
        let fuse = matches!(opts.serve, Serve::Fuse { .. });
        // A mount handed over: what the daemon before this one passed.
        let received = opts.handover_fd.map(crate::handover::receive).transpose()?;
        if received.is_none() {
            check_target(&mp, fuse)?;
        }
        let (handed, taken, to_old, link) = split_handover(received);
        let started = Instant::now();
        // The daemon's code, mapped while the snapshot opens (see `resident`).
        let mapping = std::thread::Builder::new()
            .name("mado-map-code".into())
            .spawn(crate::resident::map_executable)
            .map_err(Error::io("starting a thread"))?;
        let Opened { id, core, attach, ws, warnings } = rt.block_on(open(&opts, &fetcher, &mp, handed))?;
        let stuck = watchdog(Arc::downgrade(&core));
        let sock = control::socket_path(&mp).map_err(Error::io("placing the control socket"))?;
        let listener = {
            let _g = rt.enter();
            control::bind(&sock).map_err(Error::io(format!("binding {}", sock.display())))?
        };
        let saver = ws.as_ref().map(|w| Arc::new(mado_core::workspace::StateSaver::new(w.state_dir.clone())));
        let make_fs = fs_maker(&core, rt, &saver, &attach);
        let seat =
            (fuse && ws.is_some()).then(|| Arc::new(crate::handover::Seat::new(mp.clone(), FUSE_THREADS as usize)));
        let fs = make_fs(opts.passthrough && fuse);
        let fs = match &seat {
            Some(seat) => fs.with_seat(seat),
            None => fs,
        };
        let ws = ws.map(Arc::new);
        let handler = Arc::new(ControlHandler {
            status: Arc::new(attach.clone()),
            core: core.clone(),
            fetcher: fetcher.clone(),
            spec: opts.spec.clone(),
            mountpoint: mp.clone(),
            snapshot: Mutex::new(id.to_hex()),
            started,
            passthrough: fs.passthrough_flag(),
            requests: fs.request_counters(),
            ws: ws.clone(),
            save_error: Arc::default(),
            virtiofs: (!fuse).then(|| Arc::new(crate::virtiofs::Counts::default())),
            stuck,
            seat: seat.clone(),
            busy: Default::default(),
        });
        let answer: control::Answer = {
            let handler = handler.clone();
            Arc::new(move |req: Request| handler.answer(req))
        };
        rt.spawn(control::serve(listener, answer));
        let allow_other = matches!(opts.serve, Serve::Fuse { allow_other: true, .. });
        let mut original = None;
        let served = match &opts.serve {
            Serve::Fuse { .. } => serve_fuse(fs, &opts.spec, &mp, ws.is_some(), allow_other, taken).map(|s| {
                if let (Some(seat), Some(at)) = (&seat, s.at) {
                    seat.serving_on(at);
                }
                original = s.original;
                s.served
            }),
            Serve::VirtioFs { socket } => {
                drop(fs);
                let counts = handler.virtiofs.clone().unwrap_or_default();
                serve_virtiofs(socket, make_fs.clone(), guest_sync(&ws, &saver, &core), counts)
            }
        };
        let served = served.inspect_err(|e| {
            let _ = std::fs::remove_file(&sock);
            if let Some(a) = &to_old {
                crate::handover::answer(a, Err(e));
            }
        })?;
        if let Some(a) = &to_old {
            tracing::info!(pid = std::process::id(), "took over {} from the daemon before", mp.display());
            crate::handover::answer(a, Ok(()));
        }
        // After the answer: a keeper that started this daemon waits for
        // it before it reads the link again.
        if let Some(w) = &ws {
            keep(w, original, link);
        }
        let by_name = match (&ws, fuse) {
            (Some(w), false) => Some(link_by_name(&fetcher, w, &sock)?),
            _ => None,
        };
        let advisory = advisory(&attach, &opts);
        match mapping.join() {
            Ok(Ok(n)) => tracing::debug!("mapped {} MiB of the daemon's code", n >> 20),
            Ok(Err(e)) => tracing::debug!("not mapping the daemon's code: {e}"),
            Err(_) => tracing::warn!("mapping the daemon's code stopped unexpectedly"),
        }
        let report = Ready { snapshot: id.to_hex(), attach, advisory, warnings };
        let daemon = Daemon {
            spec: opts.spec,
            fuse,
            rt: rt.clone(),
            fetcher,
            core,
            mountpoint: mp,
            sock,
            by_name,
            ws,
            saver,
            save_error: handler.save_error.clone(),
            served,
            seat,
            make_fs,
            allow_other,
        };
        Ok((daemon, report))
    }

    /// A workspace's state is saved soon after each change (woken by the
    /// change; the short sleep gathers a burst into one write), so a killed
    /// daemon loses at most the last moment's renames; file contents are
    /// already in the upper layer.
    fn save_on_change(&self) {
        let (Some(ws), Some(changed), Some(saver)) = (&self.ws, self.core.change_notifier(), &self.saver) else {
            return;
        };
        let (ws, core, save_error, saver) = (ws.clone(), self.core.clone(), self.save_error.clone(), saver.clone());
        self.rt.spawn(async move {
            loop {
                changed.notified().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
                let (saver, core) = (saver.clone(), core.clone());
                let r = tokio::task::spawn_blocking(move || saver.save(&core)).await;
                let failed = match r {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(e) => Some(format!("the save task failed: {e}")),
                };
                if let Some(msg) = &failed {
                    tracing::error!("saving the state of workspace {} failed: {msg}", ws.handle.name());
                }
                *save_error.lock().expect("save error lock") = failed;
            }
        });
    }

    /// SIGTERM or SIGINT unmounts (or stops serving the guest).
    fn stop_on_signal(&self) {
        let mp = self.mountpoint.clone();
        let stopper = match &self.served {
            Served::VirtioFs(_, s) => Some(s.clone()),
            Served::Fuse(_) => None,
        };
        self.rt.spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            if let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                match stopper {
                    Some(s) => s.stop(),
                    None => {
                        let _ = unmount(&mp);
                    }
                }
            }
        });
    }

    /// Waits for the unmount (or the guest server's end), then saves a
    /// workspace's state and gives its lease back.
    fn wait_and_tear_down(self) -> Result<()> {
        let Daemon {
            spec,
            fuse,
            rt,
            fetcher,
            core,
            mountpoint,
            sock,
            by_name,
            ws,
            served,
            seat,
            make_fs,
            allow_other,
            ..
        } = self;
        let r = match served {
            Served::Fuse(session) => {
                let r = match seat {
                    Some(seat) => {
                        let again = |fd| {
                            let fs = make_fs(false).with_seat(&seat);
                            let taken = crate::fuse_mount::Taken { fd, from_keeper: false };
                            serve_fuse(fs, &spec, &mountpoint, true, allow_other, Some(taken))
                        };
                        serve_until_unmounted(session, &seat, again)
                    }
                    None => session.join(),
                };
                tracing::info!("unmounted {} ({spec}): {}", mountpoint.display(), fetcher.remote.stats());
                // A large file's whole copy being finished (hashed) is kept,
                // not lost with the process; a partial one goes.
                let left = core.wait_assemblies(Duration::from_secs(30));
                if left > 0 {
                    tracing::warn!("{left} whole copies of large files were not finished; dropped");
                }
                r
            }
            Served::VirtioFs(h, _) => {
                h.join().unwrap_or_else(|_| Err(std::io::Error::other("the virtio-fs server panicked")))
            }
        };
        let _ = std::fs::remove_file(&sock);
        if let Some(alias) = &by_name {
            let _ = std::fs::remove_file(alias);
        }
        if let Some(ws) = &ws {
            // Unmounted: the keeper goes first (nothing to keep), and the
            // lock it shares is free once this process exits.
            if let Some(k) = ws.keeper.get() {
                k.bye();
            }
            end_workspace(&rt, &core, ws)?;
        }
        r.map_err(Error::io(if fuse { "FUSE session" } else { "virtio-fs server" }))
    }
}

/// A workspace's FUSE mount gets a keeper (crate::keeper): a new one for
/// the mount this process made (`original`), or the one it had, told of
/// this daemon (`link`, passed with the mount). Without either (a mount
/// made through fusermount3), none: a killed daemon's mount then needs a
/// remount, as before.
fn keep(ws: &Ws, original: Option<std::os::fd::OwnedFd>, link: Option<std::os::fd::OwnedFd>) {
    let exe = std::env::current_exe().map(|e| {
        // A binary replaced on disk (an upgrade) reads as "… (deleted)".
        let s = e.to_string_lossy();
        s.strip_suffix(" (deleted)").map(PathBuf::from).unwrap_or(e)
    });
    let Ok(exe) = exe else { return };
    let argv = crate::handover::successor_argv(&exe);
    let r = match (original, link) {
        (_, Some(l)) => crate::keeper::Link::adopt(l, &argv),
        (Some(fd), None) => crate::keeper::Link::start(fd, std::os::fd::AsFd::as_fd(&ws._lock), &argv),
        (None, None) => return,
    };
    match r {
        Ok(l) => {
            tracing::info!(keeper = l.keeper_pid, "the mount is kept through this daemon's death");
            let _ = ws.keeper.set(l);
        }
        Err(e) => tracing::warn!("this mount has no keeper ({e}): if this daemon dies, remount it"),
    }
}

/// The advisory for a snapshot served without packs.
fn advisory(attach: &Attach, opts: &MountOptions) -> Option<String> {
    match attach {
        Attach::Attached { .. } => None,
        // The snapshot mounted, not `main` (`mado pack`'s default).
        _ => Some(format!(
            "cold reads are per-file — run `mado pack -r {}` to pack this snapshot",
            if opts.workspace { format!("ws/{}", opts.spec) } else { opts.spec.clone() }
        )),
    }
}

/// Refuses a socket a live server holds; cleans up a dead mount.
fn check_target(mp: &Path, fuse: bool) -> Result<()> {
    if !fuse {
        // A live server on this socket keeps it: binding would take the
        // socket (and the control socket named after it) from under it.
        let live = control::socket_path(mp)
            .ok()
            .and_then(|sock| control::request(&sock, &Request::new(Op::Stats), Duration::from_secs(5)).ok());
        if let Some(Reply::Stats(s)) = live {
            return Err(Error::User(format!(
                "{} is already served by mado (pid {}); stop that one first",
                mp.display(),
                s.pid
            )));
        }
    }
    if fuse && is_disconnected(mp) {
        unmount(mp).map_err(Error::io(format!("cleaning up the dead mount at {}", mp.display())))?;
    }
    Ok(())
}

/// Opens the workspace (with its lease and saved state) or the snapshot,
/// and loads its trees: all of them from an attached index (no network),
/// else the root's, so the first `ls` needs no round trip.
async fn open(
    opts: &MountOptions,
    fetcher: &Arc<Fetcher>,
    mp: &Path,
    handed: Option<mado_core::workspace::HandedOver>,
) -> Result<Opened> {
    let opened = if opts.workspace {
        let handle = mado_core::workspace::Workspace::new(fetcher, &opts.spec)?;
        // Numbers are kept for a keeper: a FUSE mount this root process
        // makes itself (see `crate::keeper`).
        let keep_numbers = matches!(opts.serve, Serve::Fuse { .. }) && rustix::process::geteuid().is_root();
        let m = match handed {
            Some(h) => handle.open_handed_over(mp, h).await?,
            None => handle.open_mount(mp, opts.steal, keep_numbers).await?,
        };
        let ws = Ws {
            handle,
            state_dir: m.state_dir,
            reopened: m.reopened,
            holder: m.holder,
            _lock: m.lock,
            keeper: Default::default(),
        };
        Opened { id: m.snapshot, core: m.fs, attach: m.attach, ws: Some(ws), warnings: m.warnings }
    } else {
        let (id, snap, attach) = mado_core::resolve::open(fetcher, &opts.spec).await?;
        // A workspace checkpoint's mtimes (its stat object); an imported
        // snapshot has none and shows its own time.
        let fs = match fetcher.stat_of(&snap).await? {
            Some(stat) => SnapshotFs::with_mtimes(fetcher.clone(), snap.root, snap.time, stat),
            None => SnapshotFs::new(fetcher.clone(), snap.root, snap.time),
        };
        Opened { id, core: Arc::new(fs), attach, ws: None, warnings: Vec::new() }
    };
    opened.core.set_read_timeout(opts.read_timeout);
    // The root's listing before the mount answers anything: its tree is
    // the one read that may wait on the network. Every other tree comes
    // when its directory is first looked into (from the attached index,
    // read in place, with no request), so opening costs the same for ten
    // files or a million.
    opened.core.readdir(mado_core::vfs::ROOT_INO).await?;
    Ok(opened)
}

/// Makes the filesystem a session serves, with or without passthrough.
///
/// Read through packs, no small file has a whole-file backing in the cache
/// (a member is compressed, at an offset), so passthrough could serve
/// none: the mount then runs without OPEN and RELEASE, which saves a cold
/// walk two requests a file and a warm one all of them. A snapshot where at
/// least one entry in LARGE_FILES_SHARE is a large (chunked) file keeps
/// OPEN: a large file read whole leaves a whole copy in the cache, and
/// later opens pass through to it at the local disk's speed. The kernel's
/// no-open mode is all or nothing, so a source tree with a few large files
/// keeps it, and their warm reads go through the daemon.
fn fs_maker(
    core: &Arc<SnapshotFs>,
    rt: &tokio::runtime::Handle,
    saver: &Option<Arc<mado_core::workspace::StateSaver>>,
    attach: &Attach,
) -> Arc<dyn Fn(bool) -> MadoFs + Send + Sync> {
    let (chunked, entries) = core.chunked_share();
    let (attached, large) = (matches!(attach, Attach::Attached { .. }), chunked * LARGE_FILES_SHARE >= entries.max(1));
    let (core, rt, saver) = (core.clone(), rt.clone(), saver.clone());
    Arc::new(move |passthrough: bool| {
        // Without passthrough (not asked for, or a VM guest's session),
        // OPEN would serve nothing.
        let packed = attached && !(large && passthrough);
        let mut fs = MadoFs::new(core.clone(), rt.clone(), passthrough && !packed);
        if core.is_writable() || packed {
            // No passthrough for a workspace (see `with_no_open`).
            fs = fs.with_no_open();
        }
        match &saver {
            Some(saver) => {
                let (saver, core) = (saver.clone(), core.clone());
                fs.with_durable_save(Arc::new(move || saver.save(&core)))
            }
            None => fs,
        }
    })
}

/// A guest's `sync` of a workspace: every upper file's bytes, then the
/// state naming them.
fn guest_sync(
    ws: &Option<Arc<Ws>>,
    saver: &Option<Arc<mado_core::workspace::StateSaver>>,
    core: &Arc<SnapshotFs>,
) -> Option<crate::virtiofs::SyncAll> {
    let (Some(w), Some(saver)) = (ws, saver) else { return None };
    let (upper, saver, core) = (w.state_dir.join("upper"), saver.clone(), core.clone());
    Some(Arc::new(move || {
        let dir = std::fs::File::open(&upper)?;
        rustix::fs::syncfs(&dir)?;
        saver.save(&core).map_err(std::io::Error::other)
    }))
}

/// Serves a VM guest on `socket`, one session per connection.
fn serve_virtiofs(
    socket: &Path,
    make_fs: Arc<dyn Fn(bool) -> MadoFs + Send + Sync>,
    sync_all: Option<crate::virtiofs::SyncAll>,
    counts: Arc<crate::virtiofs::Counts>,
) -> Result<Served> {
    let make: crate::virtiofs::MakeFs<MadoFs> =
        Arc::new(move |max_io| make_fs(false).with_max_io(max_io).with_no_open());
    let (server, listener) = crate::virtiofs::Server::bind(socket, make, sync_all, counts)
        .map_err(|e| Error::User(format!("serving virtio-fs on {}: {e}", socket.display())))?;
    let server = Arc::new(server);
    let stopper = server.stopper();
    let h = std::thread::Builder::new()
        .name("virtiofs-accept".into())
        .spawn(move || server.run(listener))
        .map_err(Error::io("starting the virtio-fs server"))?;
    Ok(Served::VirtioFs(h, stopper))
}

/// A workspace mount's end: the final save, then the lease, so another
/// machine may resume the workspace at once (its uncheckpointed changes
/// stay here, picked up by the next mount of the same checkpoint on this
/// machine); its work set aside if the workspace was removed meanwhile.
fn end_workspace(rt: &tokio::runtime::Handle, core: &Arc<SnapshotFs>, ws: &Ws) -> Result<()> {
    mado_core::workspace::save_mount_state(core, &ws.state_dir)?;
    // The state just saved names no spare upper file.
    core.drop_spares();
    let uncheckpointed = core.tracker().uncheckpointed();
    if let Err(e) = mado_core::workspace::record_unmounted(&ws.state_dir, uncheckpointed) {
        tracing::warn!("recording whether workspace {} holds uncheckpointed changes: {e}", ws.handle.name());
    }
    if uncheckpointed {
        match rt.block_on(ws.handle.set_aside_if_removed(&ws.state_dir)) {
            Ok(Some(aside)) => tracing::warn!(
                "workspace {} was removed while mounted; its uncheckpointed work was set aside in {} \
                 (`mado ws recover` lists it)",
                ws.handle.name(),
                aside.display()
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!("checking whether workspace {} still exists: {e}", ws.handle.name()),
        }
    }
    if let Err(e) = rt.block_on(ws.handle.release_lease(&ws.holder)) {
        tracing::error!("releasing the lease of workspace {}: {e}", ws.handle.name());
    }
    Ok(())
}

/// A running transport.
pub(crate) enum Served {
    Fuse(fuser::BackgroundSession),
    VirtioFs(std::thread::JoinHandle<std::io::Result<()>>, crate::virtiofs::Stopper),
}

/// How long the watchdog waits for the inode table's lock before it calls
/// the mount stuck.
const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Watches that requests can get at the inode table: when its lock cannot
/// be taken for [`STUCK_AFTER`], the mount is stuck (a deadlock, or a
/// request that never returns while holding it). That is logged at once,
/// and shown by `mado stats` (`stuck_ms`) until it clears, so a user sees a
/// hang rather than a silent freeze. Returns when it became stuck.
fn watchdog(core: std::sync::Weak<SnapshotFs>) -> Arc<Mutex<Option<std::time::Instant>>> {
    let stuck: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
    let mark = stuck.clone();
    let _ = std::thread::Builder::new().name("watchdog".into()).spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_secs(2));
        let Some(core) = core.upgrade() else { return };
        let free = core.state_lock_free_within(STUCK_AFTER);
        drop(core);
        let mut s = mark.lock().expect("stuck lock");
        match (free, s.is_some()) {
            (false, false) => {
                *s = Some(std::time::Instant::now() - STUCK_AFTER);
                tracing::error!(
                    "requests to this mount have waited over {} s for its inode table (a stuck request holds it); \
                     `mado stats` shows how long; kill -9 of this daemon replaces it if the mount has a keeper, else \
                     `mado umount` after it ends the mount (fsynced work is kept either way)",
                    STUCK_AFTER.as_secs()
                );
            }
            (true, true) => {
                *s = None;
                tracing::warn!("requests to this mount move again");
            }
            _ => {}
        }
    });
    stuck
}
