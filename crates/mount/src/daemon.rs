//! The mount daemon: opens a snapshot (resolving the ref, reading the
//! snapshot and attaching its pack index together), loads its trees from
//! the index, serves the control socket, mounts the FUSE filesystem and
//! reports readiness; then waits, woken by the unmount or a signal.
//!
//! Recovery: a daemon killed with SIGKILL leaves its mount point
//! disconnected ("Transport endpoint is not connected"). `mado umount DIR`
//! and `mado mount` on the same DIR detect that and detach it lazily
//! (`fusermount3 -uz`); the stale socket file is replaced.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mado_core::fetch::{Attach, Fetcher};
use mado_core::vfs::SnapshotFs;
use mado_core::{Error, Result};

use crate::control;
use crate::fs::MadoFs;
use crate::protocol::{MountStats, Op, PackStatus, Reply, Request, WorkspaceStats};

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
    pub warnings: Vec<String>,
}

/// A workspace being served read-write.
struct Ws {
    name: String,
    state_dir: PathBuf,
    reopened: bool,
    /// The lease holder id; the lease is released when the mount ends.
    holder: String,
    /// This machine's one mount of the workspace, held to the end.
    _lock: mado_core::workspace::MountLock,
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
fn source_name(spec: &str, workspace: bool) -> String {
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

fn reason_text(a: &Attach) -> String {
    match a {
        Attach::Attached { mode, version, layers, dirs, packs, members, via } => format!(
            "prefetcher attached: {mode} packs (index v{version}, {layers} layer{}), {dirs} directories, {packs} packs, {members} objects; discovered via {}",
            if *layers == 1 { "" } else { "s" },
            match via {
                mado_core::fetch::Discovery::LocalPointer => "local pointer",
                mado_core::fetch::Discovery::DerivedPointer => "derived pointer",
            }
        ),
        Attach::NoIndex => "no prefetcher: no pack index was built for this tree (run `mado pack --recursive`)".into(),
        Attach::OtherTree { found } => {
            format!("no prefetcher: the index found covers another tree ({}); run `mado pack --recursive`", &found[..12])
        }
        Attach::Undecodable { detail } => {
            format!("no prefetcher: the pack index is undecodable ({detail}); run `mado pack --recursive`")
        }
        Attach::Swept { missing, packs } => format!(
            "the index's packs were swept: {missing} of its {packs} found missing so far (their files are read one by one); run `mado pack --recursive`"
        ),
    }
}

/// The index's state, or `Swept` once a read found packs it names gone
/// from the store. Found by the reads themselves (a GET that finds no pack
/// marks it bad, and its objects are read one by one): a HEAD of every
/// pack at each mount cost as many requests as the index has packs, all
/// at once beside the first reads, to spare one failed GET in the rare
/// case of a gc that swept them.
fn swept_or(attach: &Attach, fetcher: &Fetcher) -> Attach {
    let missing = fetcher.stats().packs_missing as usize;
    match attach {
        Attach::Attached { packs, .. } if missing > 0 => Attach::Swept { missing, packs: *packs },
        a => a.clone(),
    }
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
    let mp = control::absolute(opts.serve.path()).map_err(Error::io("resolving the mount point"))?;
    let fuse = matches!(opts.serve, Serve::Fuse { .. });
    if !fuse {
        // A live server on this socket keeps it: binding would take the
        // socket (and the control socket named after it) from under it.
        let live = control::socket_path(&mp)
            .ok()
            .and_then(|sock| control::request(&sock, &Request::new(Op::Stats), Duration::from_secs(5)).ok());
        if let Some(Reply::Stats(s)) = live {
            let e =
                Error::User(format!("{} is already served by mado (pid {}); stop that one first", mp.display(), s.pid));
            ready(Err(&e));
            return Err(e);
        }
    }
    if fuse && is_disconnected(&mp) {
        unmount(&mp).map_err(Error::io(format!("cleaning up the dead mount at {}", mp.display())))?;
    }
    let started = Instant::now();
    // The daemon's code, mapped while the snapshot opens (see `resident`).
    let mapping = std::thread::Builder::new()
        .name("mado-map-code".into())
        .spawn(crate::resident::map_executable)
        .map_err(Error::io("starting a thread"))?;
    let opened = rt.block_on(async {
        let (id, core, attach, ws, warnings) = if opts.workspace {
            let m = mado_core::workspace::open_mount(&fetcher, &opts.spec, &mp, opts.steal).await?;
            let warnings = m.warnings;
            let ws = Ws {
                name: opts.spec.clone(),
                state_dir: m.state_dir,
                reopened: m.reopened,
                holder: m.holder,
                _lock: m.lock,
            };
            (m.snapshot, m.fs, m.attach, Some(ws), warnings)
        } else {
            let (id, snap, attach) = mado_core::resolve::open(&fetcher, &opts.spec).await?;
            // A workspace checkpoint's mtimes (its stat object); an
            // imported snapshot has none and shows its own time.
            let fs = match fetcher.stat_of(&snap).await? {
                Some(stat) => SnapshotFs::with_mtimes(fetcher.clone(), snap.root, snap.time, stat),
                None => SnapshotFs::new(fetcher.clone(), snap.root, snap.time),
            };
            (id, Arc::new(fs), attach, None, Vec::new())
        };
        core.set_read_timeout(opts.read_timeout);
        if matches!(attach, Attach::Attached { .. }) {
            // Inline trees: no network.
            core.preload_trees().await?;
        } else {
            // At least the root, so the first `ls` needs no round trip.
            core.readdir(mado_core::vfs::ROOT_INO).await?;
        }
        Ok::<_, Error>((id, core, attach, ws, warnings))
    });
    let (id, core, attach, ws, warnings) = match opened {
        Ok(v) => v,
        Err(e) => {
            ready(Err(&e));
            return Err(e);
        }
    };
    let status = Arc::new(attach.clone());
    // The last failed save of a workspace's state (cleared by a good one).
    let save_error: Arc<Mutex<Option<String>>> = Arc::default();
    let stuck = watchdog(Arc::downgrade(&core));
    let sock = control::socket_path(&mp).map_err(Error::io("placing the control socket"))?;
    let listener = {
        let _g = rt.enter();
        control::bind(&sock).map_err(Error::io(format!("binding {}", sock.display())))?
    };
    let saver = ws.as_ref().map(|w| Arc::new(mado_core::workspace::StateSaver::new(w.state_dir.clone())));
    // Read through packs, no small file has a whole-file backing in the
    // cache (a member is compressed, at an offset), so passthrough could
    // serve none: the mount then runs without OPEN and RELEASE, which saves
    // a cold walk two requests a file and a warm one all of them. A
    // snapshot where at least one entry in LARGE_FILES_SHARE is a large
    // (chunked) file keeps OPEN: a large file read whole leaves a whole
    // copy in the cache, and later opens pass through to it at the local
    // disk's speed. The kernel's no-open mode is all or nothing, so a
    // source tree with a few large files keeps it, and their warm reads go
    // through the daemon.
    let (chunked, entries) = core.chunked_share();
    let (attached, large) = (matches!(attach, Attach::Attached { .. }), chunked * LARGE_FILES_SHARE >= entries.max(1));
    let make_fs = {
        let (core, rt, saver) = (core.clone(), rt.clone(), saver.clone());
        move |passthrough: bool| {
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
        }
    };
    let fs = make_fs(opts.passthrough && fuse);
    let passthrough = fs.passthrough_flag();
    let requests = fs.request_counters();
    let ws = ws.map(Arc::new);
    let vfs_counts = (!fuse).then(|| Arc::new(crate::virtiofs::Counts::default()));
    let answer: control::Answer = {
        let (status, core, fetcher, spec) = (status.clone(), core.clone(), fetcher.clone(), opts.spec.clone());
        let mp = mp.clone();
        let snapshot = id.to_hex();
        let passthrough = passthrough.clone();
        let requests = requests.clone();
        let ws = ws.clone();
        let save_error = save_error.clone();
        let vfs_counts = vfs_counts.clone();
        Arc::new(move |req: Request| {
            let (message, steal, force, name, no_ignore) = match req.op {
                Op::Checkpoint { message, steal, force, name, no_ignore } => (message, steal, force, name, no_ignore),
                Op::PackStatus => {
                    let s = swept_or(&status, &fetcher);
                    let reply = Reply::PackStatus(PackStatus {
                        mountpoint: mp.clone(),
                        spec: spec.clone(),
                        snapshot: snapshot.clone(),
                        attached: matches!(s, Attach::Attached { .. }),
                        message: reason_text(&s),
                        status: s,
                    });
                    return Box::pin(async move { reply });
                }
                Op::Stats => {
                    let reply = Reply::Stats(Box::new(MountStats {
                        mountpoint: mp.clone(),
                        spec: spec.clone(),
                        snapshot: snapshot.clone(),
                        uptime_ms: started.elapsed().as_millis() as u64,
                        pid: std::process::id(),
                        remote: fetcher.remote.stats(),
                        packs: fetcher.stats(),
                        cache: fetcher.cache.stats(),
                        reads: core.reads(),
                        // Not counted while requests are stuck: this
                        // answer would wait behind them too.
                        nodes_in_memory: if stuck.lock().expect("stuck lock").is_some() {
                            0
                        } else {
                            core.node_count()
                        },
                        stuck_ms: stuck.lock().expect("stuck lock").map(|t| t.elapsed().as_millis() as u64),
                        chunks_read_ahead: core.chunks_read_ahead(),
                        files_assembled: core.files_assembled(),
                        passthrough: passthrough.load(Relaxed),
                        opens: requests.opens.load(Relaxed),
                        lookups: requests.lookups.load(Relaxed),
                        workspace: ws.as_ref().map(|w| WorkspaceStats {
                            name: w.name.clone(),
                            state_dir: w.state_dir.clone(),
                            reopened: w.reopened,
                            changes: core.changes(),
                            last_save_error: save_error.lock().expect("save error lock").clone(),
                        }),
                        virtiofs: vfs_counts.as_ref().map(|c| c.snapshot()),
                    }));
                    return Box::pin(async move { reply });
                }
                Op::Status { no_ignore } => {
                    let (fetcher, core, ws) = (fetcher.clone(), core.clone(), ws.clone());
                    return Box::pin(async move {
                        let Some(ws) = ws else {
                            return Reply::Error {
                                message: "this mount is a read-only snapshot, not a workspace: nothing changes".into(),
                                user_error: true,
                            };
                        };
                        let h = tokio::runtime::Handle::current();
                        let r = tokio::task::spawn_blocking(move || {
                            h.block_on(mado_core::workspace::mount_status(&fetcher, &core, &ws.state_dir, no_ignore))
                        })
                        .await;
                        match r {
                            Ok(Ok(status)) => Reply::Status { status },
                            Ok(Err(e)) => Reply::Error { message: e.to_string(), user_error: e.is_user_error() },
                            Err(e) => Reply::Error { message: format!("status task failed: {e}"), user_error: false },
                        }
                    });
                }
            };
            let (fetcher, core, ws, mp) = (fetcher.clone(), core.clone(), ws.clone(), mp.clone());
            let save_error = save_error.clone();
            Box::pin(async move {
                let Some(ws) = ws else {
                    return Reply::Error {
                        message: "this mount is a read-only snapshot, not a workspace".into(),
                        user_error: true,
                    };
                };
                // Refused before anything is done: a checkpoint asked for
                // by name must be of this mount's workspace.
                if let Some(n) = name.filter(|n| *n != ws.name) {
                    return Reply::Error {
                        message: format!("{} is a mount of workspace {}, not {n}", mp.display(), ws.name),
                        user_error: true,
                    };
                }
                let lease = mado_core::workspace::CheckpointLease { steal, force, no_ignore };
                // On a thread of its own: the checkpoint's future is not
                // Send (it borrows across its upload streams).
                let h = tokio::runtime::Handle::current();
                let before = fetcher.remote.stats();
                let f2 = fetcher.clone();
                let r = tokio::task::spawn_blocking(move || {
                    h.block_on(mado_core::workspace::checkpoint_mount(&fetcher, &core, &ws.state_dir, &message, lease))
                })
                .await;
                match r {
                    Ok(Ok(report)) => {
                        // The checkpoint saved the state itself.
                        *save_error.lock().expect("save error lock") = None;
                        Reply::Checkpoint { report, remote: f2.remote.stats().since(&before) }
                    }
                    Ok(Err(e)) => Reply::Error { message: e.to_string(), user_error: e.is_user_error() },
                    Err(e) => Reply::Error { message: format!("checkpoint task failed: {e}"), user_error: false },
                }
            })
        })
    };
    rt.spawn(control::serve(listener, answer));
    let served = match &opts.serve {
        Serve::Fuse { allow_other, .. } => {
            let config = {
                let mut c = fuser::Config::default();
                c.mount_options = vec![
                    // The source findmnt and df show: what is mounted.
                    fuser::MountOption::FSName(source_name(&opts.spec, ws.is_some())),
                    fuser::MountOption::Subtype("mado".into()),
                    fuser::MountOption::NoAtime,
                    // Device nodes made in a workspace are names, never
                    // devices.
                    fuser::MountOption::NoDev,
                ];
                if kernel_checks_permissions(*allow_other) {
                    c.mount_options.push(fuser::MountOption::DefaultPermissions);
                }
                if ws.is_none() {
                    c.mount_options.push(fuser::MountOption::RO);
                }
                if *allow_other {
                    c.acl = fuser::SessionACL::All;
                }
                c.n_threads = Some(4);
                c
            };
            // As root, mount(2) here with the type `fuse.mado`; fuser's own
            // direct mount says only `fuse`. Others go through fusermount3,
            // which passes the subtype on.
            let spawned =
                match mount_as_fuse_mado(&source_name(&opts.spec, ws.is_some()), &mp, ws.is_none(), *allow_other) {
                    Ok(Some(fd)) => {
                        fuser::Session::from_fd(fs, fd, config.acl, config).and_then(|s| s.spawn()).inspect_err(|_| {
                            let _ = rustix::mount::unmount(&mp, rustix::mount::UnmountFlags::DETACH);
                        })
                    }
                    Ok(None) => fuser::spawn_mount(fs, &mp, &config),
                    Err(e) => Err(e),
                };
            match spawned {
                Ok(s) => {
                    tracing::info!(pid = std::process::id(), "serving {} at {}", opts.spec, mp.display());
                    Served::Fuse(s)
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&sock);
                    let e = Error::User(format!("mounting at {}: {e} ({})", mp.display(), why_no_mount(*allow_other)));
                    ready(Err(&e));
                    return Err(e);
                }
            }
        }
        Serve::VirtioFs { socket } => {
            drop(fs);
            let make: crate::virtiofs::MakeFs<MadoFs> =
                Arc::new(move |max_io| make_fs(false).with_max_io(max_io).with_no_open());
            // A guest's `sync`: every upper file's bytes, then the state
            // naming them.
            let sync_all: Option<crate::virtiofs::SyncAll> = match (&ws, &saver) {
                (Some(w), Some(saver)) => {
                    let (upper, saver, core) = (w.state_dir.join("upper"), saver.clone(), core.clone());
                    Some(Arc::new(move || {
                        let dir = std::fs::File::open(&upper)?;
                        rustix::fs::syncfs(&dir)?;
                        saver.save(&core).map_err(std::io::Error::other)
                    }))
                }
                _ => None,
            };
            let counts = vfs_counts.clone().unwrap_or_default();
            match crate::virtiofs::Server::bind(socket, make, sync_all, counts) {
                Ok((server, listener)) => {
                    let server = Arc::new(server);
                    let stopper = server.stopper();
                    let s2 = server.clone();
                    let h = std::thread::Builder::new()
                        .name("virtiofs-accept".into())
                        .spawn(move || s2.run(listener))
                        .map_err(Error::io("starting the virtio-fs server"))?;
                    Served::VirtioFs(h, stopper)
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&sock);
                    let e = Error::User(format!("serving virtio-fs on {}: {e}", socket.display()));
                    ready(Err(&e));
                    return Err(e);
                }
            }
        }
    };
    // A workspace served to a VM has no directory on this machine: once
    // it is served, its control socket is also found by the workspace's
    // name.
    let by_name = match (&ws, fuse) {
        (Some(w), false) => {
            let alias = control::workspace_socket_path(fetcher.remote.url(), &w.name)
                .map_err(Error::io("placing the control socket"))?;
            let _ = std::fs::remove_file(&alias);
            std::os::unix::fs::symlink(&sock, &alias).map_err(Error::io(format!("linking {}", alias.display())))?;
            Some(alias)
        }
        _ => None,
    };
    let advisory = match &attach {
        Attach::Attached { .. } => None,
        // The snapshot mounted, not `main` (`mado pack`'s default).
        _ => Some(format!(
            "cold reads are per-file — run `mado pack -r {}` to pack this snapshot",
            if opts.workspace { format!("ws/{}", opts.spec) } else { opts.spec.clone() }
        )),
    };

    match mapping.join() {
        Ok(Ok(n)) => tracing::debug!("mapped {} MiB of the daemon's code", n >> 20),
        Ok(Err(e)) => tracing::debug!("not mapping the daemon's code: {e}"),
        Err(_) => tracing::warn!("mapping the daemon's code stopped unexpectedly"),
    }
    ready(Ok(Ready { snapshot: id.to_hex(), attach: attach.clone(), advisory, warnings }));
    // A workspace's state is saved soon after each change (woken by the
    // change; the short sleep gathers a burst into one write), so a killed
    // daemon loses at most the last moment's renames; file contents are
    // already in the upper layer.
    if let (Some(ws), Some(changed), Some(saver)) = (&ws, core.change_notifier(), &saver) {
        let (ws, core, save_error, saver) = (ws.clone(), core.clone(), save_error.clone(), saver.clone());
        rt.spawn(async move {
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
                    tracing::error!("saving the state of workspace {} failed: {msg}", ws.name);
                }
                *save_error.lock().expect("save error lock") = failed;
            }
        });
    }
    // Wait for the unmount, or a signal asking us to unmount (or to stop
    // serving the guest).
    let mp2 = mp.clone();
    let stopper = match &served {
        Served::VirtioFs(_, s) => Some(s.clone()),
        Served::Fuse(_) => None,
    };
    rt.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            match stopper {
                Some(s) => s.stop(),
                None => {
                    let _ = unmount(&mp2);
                }
            }
        }
    });
    let r = match served {
        Served::Fuse(session) => {
            let r = session.join();
            tracing::info!("unmounted {}: {}", mp.display(), fetcher.remote.stats());
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
        // The final save, then the lease: another machine may resume the
        // workspace at once (its uncheckpointed changes stay here, picked
        // up by the next mount of the same checkpoint on this machine).
        mado_core::workspace::save_mount_state(&core, &ws.state_dir)?;
        // The state just saved names no spare upper file.
        core.drop_spares();
        let uncheckpointed = core.uncheckpointed();
        if let Err(e) = mado_core::workspace::record_unmounted(&ws.state_dir, uncheckpointed) {
            tracing::warn!("recording whether workspace {} holds uncheckpointed changes: {e}", ws.name);
        }
        if uncheckpointed {
            match rt.block_on(mado_core::workspace::set_aside_if_removed(&fetcher, &ws.name, &ws.state_dir)) {
                Ok(Some(aside)) => tracing::warn!(
                    "workspace {} was removed while mounted; its uncheckpointed work was set aside in {} \
                     (`mado ws recover` lists it)",
                    ws.name,
                    aside.display()
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!("checking whether workspace {} still exists: {e}", ws.name),
            }
        }
        match rt.block_on(mado_core::workspace::release_lease(&fetcher.remote, &ws.name, &ws.holder)) {
            Ok(_) => {}
            Err(e) => tracing::error!("releasing the lease of workspace {}: {e}", ws.name),
        }
    }
    r.map_err(Error::io(if fuse { "FUSE session" } else { "virtio-fs server" }))
}

/// A running transport.
enum Served {
    Fuse(fuser::BackgroundSession),
    VirtioFs(std::thread::JoinHandle<std::io::Result<()>>, crate::virtiofs::Stopper),
}

/// Whether the kernel checks modes and owners itself (`default_permissions`).
/// It must whenever users other than the daemon's may come in
/// (`--allow-other`) or the daemon's user is not root. Without
/// `--allow-other` a root daemon's mount admits only root, whom those checks
/// never refuse (but to execute a file with no execute bit, which the
/// kernel checks anyway, and `access(X_OK)`, which `MadoFs::access`
/// answers): then they only cost a GETATTR of a directory after each change
/// in it, as the kernel forgets a changed directory's attributes and needs
/// them for the next path walk through it (two of every three requests of
/// an `rm -rf`).
fn kernel_checks_permissions(allow_other: bool) -> bool {
    allow_other || !rustix::process::geteuid().is_root()
}

/// What most likely kept a FUSE mount from starting, and what to do: the
/// device missing, the device closed to this user (fusermount3 opens it as
/// the calling user too, so its setuid bit does not help), fusermount3
/// missing, or `--allow-other` refused.
fn why_no_mount(allow_other: bool) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = Path::new("/dev/fuse");
    let Ok(meta) = std::fs::metadata(dev) else {
        return "/dev/fuse does not exist: load the module (`modprobe fuse`), or in a container pass the device in \
                (`--device /dev/fuse`)"
            .into();
    };
    let root = rustix::process::geteuid().is_root();
    if !root && rustix::fs::access(dev, rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK).is_err() {
        return format!(
            "/dev/fuse is mode {:o} owned by uid {}, so uid {} cannot open it, and fusermount3 opens it as the \
             calling user too; mount as root, or make the device usable by users (`chmod 0666 /dev/fuse`, the \
             usual default, or a udev rule)",
            meta.mode() & 0o7777,
            meta.uid(),
            rustix::process::getuid().as_raw()
        );
    }
    if !root && !on_path("fusermount3") {
        return "a mount by a user other than root needs fusermount3, which is not on PATH (Debian: \
                `apt install fuse3`)"
            .into();
    }
    if allow_other {
        return "--allow-other needs root, or `user_allow_other` in /etc/fuse.conf".into();
    }
    "is fuse3 installed, and is the mount point an empty directory of yours?".into()
}

/// Whether an executable named `name` is in a directory of `$PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Mounts `/dev/fuse` at `mp` with the type `fuse.mado` (what
/// `/proc/mounts`, `findmnt -t fuse.mado` and `umount -t` see) and returns
/// the device for the session, when this process is root and may mount.
/// `None` otherwise: fusermount3 mounts then, and sets the subtype itself.
fn mount_as_fuse_mado(
    source: &str,
    mp: &Path,
    read_only: bool,
    allow_other: bool,
) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    use rustix::mount::MountFlags;
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    // No /dev/fuse here: fuser's own attempt says so, with the hint.
    let Ok(dev) = rustix::fs::open(
        "/dev/fuse",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return Ok(None);
    };
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={}",
        std::os::fd::AsRawFd::as_raw_fd(&dev),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw()
    );
    if kernel_checks_permissions(allow_other) {
        data.push_str(",default_permissions");
    }
    if allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME;
    if read_only {
        flags |= MountFlags::RDONLY;
    }
    let data = std::ffi::CString::new(data).map_err(std::io::Error::other)?;
    match rustix::mount::mount(source, mp, "fuse.mado", flags, data.as_c_str()) {
        Ok(()) => Ok(Some(dev)),
        // Root without the right to mount (a container, a user namespace):
        // fusermount3, as for any user.
        Err(rustix::io::Errno::PERM | rustix::io::Errno::ACCESS) => Ok(None),
        Err(e) => Err(e.into()),
    }
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
                     `mado stats` shows how long; kill -9 of this daemon and `mado umount` end it (fsynced work is kept)",
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
