//! Serving a mount over `/dev/fuse`: the mount itself (as root, with the
//! type `fuse.mado`; else through fusermount3), the session and its
//! threads, and a workspace's session served again after a handover that
//! failed.

use std::path::Path;

use mado_core::{Error, Result};

use crate::daemon::{source_name, Served};
use crate::fs::MadoFs;
/// A FUSE session's request threads.
pub(crate) const FUSE_THREADS: u32 = 4;

/// Serves a workspace's session until the mount goes, through handovers
/// that failed (served again, on the descriptor kept); a handover that
/// succeeded ends this process here, the mount left to the new daemon.
pub(crate) fn serve_until_unmounted(
    mut session: fuser::BackgroundSession,
    seat: &crate::handover::Seat,
    again: impl Fn(std::os::fd::OwnedFd) -> Result<Serving>,
) -> std::io::Result<()> {
    loop {
        seat.ended.wait();
        match seat.after_end() {
            crate::handover::After::Unmounted => return session.join(),
            crate::handover::After::Exit => {
                // The session's end must not unmount (fusermount3's mount
                // would): the mount is the new daemon's now.
                std::mem::forget(session);
                loop {
                    std::thread::park();
                }
            }
            crate::handover::After::Serve(fd) => {
                std::mem::forget(session);
                // The old session's filesystem is gone: the next one's end
                // is waited for afresh.
                seat.ended.reset();
                match again(fd) {
                    Ok(Serving { served: Served::Fuse(s), at: Some(at), .. }) => {
                        seat.serving_on(at);
                        session = s;
                    }
                    Ok(_) => return Err(std::io::Error::other("serving the mount again gave no FUSE session")),
                    Err(e) => return Err(std::io::Error::other(format!("serving the mount again: {e}"))),
                }
            }
        }
    }
}

/// A mount taken over rather than made: a descriptor of its kernel
/// connection to serve on, or (`from_keeper`) the keeper's, after a
/// daemon died (crate::keeper).
pub(crate) struct Taken {
    pub fd: std::os::fd::OwnedFd,
    pub from_keeper: bool,
}

/// A session serving.
pub(crate) struct Serving {
    pub served: Served,
    /// The descriptor number the session uses, when this process opened
    /// the connection itself (root).
    pub at: Option<std::os::fd::RawFd>,
    /// A workspace mount this process made: the descriptor the mount was
    /// made with, for its keeper (the session serves on another).
    pub original: Option<std::os::fd::OwnedFd>,
}

/// Mounts `fs` at `mp`, or with `taken` serves the mount another daemon
/// handed over (or a keeper kept) on that kernel connection.
pub(crate) fn serve_fuse(
    fs: MadoFs,
    spec: &str,
    mp: &Path,
    workspace: bool,
    allow_other: bool,
    taken: Option<Taken>,
) -> Result<Serving> {
    let mut c = fuser::Config::default();
    c.mount_options = vec![
        // The source findmnt and df show: what is mounted.
        fuser::MountOption::FSName(source_name(spec, workspace)),
        fuser::MountOption::Subtype("mado".into()),
        fuser::MountOption::NoAtime,
        // Device nodes made in a workspace are names, never devices.
        fuser::MountOption::NoDev,
    ];
    if kernel_checks_permissions(allow_other) {
        c.mount_options.push(fuser::MountOption::DefaultPermissions);
    }
    if !workspace {
        c.mount_options.push(fuser::MountOption::RO);
    }
    if allow_other {
        c.acl = fuser::SessionACL::All;
    }
    c.n_threads = Some(FUSE_THREADS as usize);
    let mut at = None;
    let mut original = None;
    let spawned = if let Some(Taken { fd, from_keeper }) = taken {
        let fd = if from_keeper {
            crate::keeper::serving_descriptor(&fd)
                .map_err(|e| Error::User(format!("a descriptor of the FUSE connection of {}: {e}", mp.display())))?
        } else {
            fd
        };
        crate::handover::session_on(fs, fd, c).and_then(|(s, fd)| {
            at = Some(fd);
            let s = s.spawn()?;
            if from_keeper && crate::keeper::kernel_resends() {
                // The dead daemon's unanswered requests, once this session
                // reads.
                crate::keeper::ask_resend(fd)?;
            }
            Ok(s)
        })
    } else {
        // As root, mount(2) here with the type `fuse.mado`; fuser's own
        // direct mount says only `fuse`. Others go through fusermount3,
        // which passes the subtype on.
        match mount_as_fuse_mado(&source_name(spec, workspace), mp, !workspace, allow_other) {
            Ok(Some(made)) => {
                // A workspace serves on a descriptor made from the mount's
                // own, which is kept for its keeper (crate::keeper).
                let fd = match workspace.then(|| crate::keeper::serving_descriptor(&made)) {
                    Some(Ok(serving)) => {
                        original = Some(made);
                        serving
                    }
                    Some(Err(e)) => {
                        tracing::warn!("a second descriptor of the FUSE connection: {e}; this mount has no keeper");
                        made
                    }
                    None => made,
                };
                at = Some(std::os::fd::AsRawFd::as_raw_fd(&fd));
                fuser::Session::from_fd(fs, fd, c.acl, c).and_then(|s| s.spawn()).inspect_err(|_| {
                    let _ = rustix::mount::unmount(mp, rustix::mount::UnmountFlags::DETACH);
                })
            }
            Ok(None) => fuser::spawn_mount(fs, mp, &c),
            Err(e) => Err(e),
        }
    };
    match spawned {
        Ok(s) => {
            tracing::info!(pid = std::process::id(), "serving {spec} at {}", mp.display());
            Ok(Serving { served: Served::Fuse(s), at, original })
        }
        Err(e) => Err(Error::User(format!("mounting at {}: {e} ({})", mp.display(), why_no_mount(allow_other)))),
    }
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
