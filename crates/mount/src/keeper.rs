//! Keeping a workspace's FUSE mount through its daemon's death (kill -9, a
//! crash): a small process, the keeper, holds a descriptor of the kernel's
//! connection and the workspace's lock, and starts a new daemon when the
//! one serving dies. docs/DESIGN.md ("A killed daemon") gives the sequence.
//!
//! The kernel keeps a FUSE connection while any descriptor of it is open.
//! Requests a daemon had read and not answered when it died: on a kernel
//! that resends (Linux 6.9), the daemon serves on a copy of the keeper's
//! descriptor, so they stay queued on that open file, and the next daemon
//! asks for them again (`FUSE_NOTIFY_RESEND`): their callers only see a
//! pause. On an older kernel it serves on a clone (`FUSE_DEV_IOC_CLONE`),
//! which the kernel closes with the daemon, failing those requests
//! (ECONNABORTED to their callers); a copy there would leave them waiting
//! for good. Requests sent after the death wait in the kernel for the new
//! daemon, which takes the mount as a restarted one does
//! (`crate::handover`), with the inode numbers saved on disk as the mount
//! ran (`SnapshotFs::load_recovered`).
//!
//! The keeper and the daemon talk over a socket pair (the link). The
//! daemon's end closing is how the keeper learns of its death; before an
//! unmount's teardown the daemon says goodbye, and waits for the keeper to
//! go (so the lock is free once the daemon has exited).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use mado_core::{Error, Result};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

/// The argument that makes `mado` a keeper (not a command: never parsed
/// as one, never shown).
pub const KEEPER_ARG: &str = "__keep-mount";

/// Messages on the link: a length (u32, little-endian), a tag, a payload.
const MSG_ANNOUNCE: u8 = b'A';
const MSG_BYE: u8 = b'B';

/// How often the keeper tries to start a daemon before it gives the mount
/// up, and the wait before each try after the first.
const TRIES: [Duration; 4] =
    [Duration::ZERO, Duration::from_millis(500), Duration::from_secs(2), Duration::from_secs(8)];

/// More daemon deaths than this within [`DEATHS_WITHIN`] end the keeping.
const MAX_DEATHS: usize = 5;
const DEATHS_WITHIN: Duration = Duration::from_secs(60);

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// Whether this kernel sends again, when asked, the requests a daemon had
/// read and not answered (`FUSE_NOTIFY_RESEND`, Linux 6.9).
pub fn kernel_resends() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    matches!((parts.next(), parts.next()), (Some(major), Some(minor)) if (major, minor) >= (6, 9))
}

/// The descriptor a daemon serves on, made from the keeper's `fuse`: the
/// same open file where the kernel resends (a dead daemon's unanswered
/// requests stay queued on it until the next daemon asks for them:
/// [`ask_resend`]), else a clone (the kernel then ends them).
pub fn serving_descriptor(fuse: &OwnedFd) -> std::io::Result<OwnedFd> {
    if kernel_resends() {
        Ok(rustix::io::fcntl_dupfd_cloexec(fuse, 0)?)
    } else {
        clone_connection(fuse.as_fd())
    }
}

/// Asks the kernel to send again every request read but not answered
/// (a killed daemon's): they come back, marked, to this daemon, and their
/// callers never see the death. A notification of no body: the header's
/// `error` field is the code, `FUSE_NOTIFY_RESEND` (7).
pub fn ask_resend(at: RawFd) -> std::io::Result<()> {
    let mut msg = Vec::with_capacity(16);
    msg.extend_from_slice(&16u32.to_le_bytes());
    msg.extend_from_slice(&7i32.to_le_bytes());
    msg.extend_from_slice(&0u64.to_le_bytes());
    // SAFETY: `at` is the session's descriptor, open while it serves.
    let fd = unsafe { BorrowedFd::borrow_raw(at) };
    rustix::io::write(fd, &msg)?;
    Ok(())
}

/// A new descriptor of `fuse`'s connection with its own queue of requests
/// in progress (see the module's comment).
pub fn clone_connection(fuse: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let dev = rustix::fs::open(
        "/dev/fuse",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let mut of = fuse.as_raw_fd() as u32;
    // SAFETY: both descriptors are open; the kernel reads one u32.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &mut of as *mut u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(dev)
}

/// Whether the kernel has ended the connection `fuse` is of (an unmount,
/// an abort): the device then polls as an error.
fn connection_gone(fuse: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(fuse, rustix::event::PollFlags::empty())];
    let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    match rustix::event::poll(&mut fds, Some(&t)) {
        Ok(_) => fds[0].revents().intersects(rustix::event::PollFlags::ERR | rustix::event::PollFlags::NVAL),
        Err(_) => false,
    }
}

/// The daemon's end of the link to its keeper.
pub struct Link {
    sock: OwnedFd,
    /// The keeper's pid, as it said.
    pub keeper_pid: u32,
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::io(what)(e)
}

fn put_msg(sock: BorrowedFd<'_>, tag: u8, payload: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut msg = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
    msg.push(tag);
    msg.extend_from_slice(payload);
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        anc.push(SendAncillaryMessage::ScmRights(fds));
    }
    let n = rustix::net::sendmsg(sock, &[std::io::IoSlice::new(&msg)], &mut anc, SendFlags::NOSIGNAL)?;
    let mut w = std::fs::File::from(sock.try_clone_to_owned()?);
    w.write_all(&msg[n..])
}

/// One message: its tag, payload and the descriptors it carried.
fn get_msg(sock: &OwnedFd) -> std::io::Result<(u8, Vec<u8>, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut len = [0u8; 4];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(sock, &mut [std::io::IoSliceMut::new(&mut len)], &mut anc, RecvFlags::CMSG_CLOEXEC)?;
    if got.bytes == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = m {
            fds.extend(r);
        }
    }
    let mut r = std::fs::File::from(sock.try_clone()?);
    r.read_exact(&mut len[got.bytes..])?;
    let n = u32::from_le_bytes(len) as usize;
    if n == 0 || n > 1 << 20 {
        return Err(std::io::Error::other(format!("a link message of {n} bytes")));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    let tag = body.remove(0);
    Ok((tag, body, fds))
}

fn encode_argv(argv: &[std::ffi::OsString]) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for a in argv {
        out.extend_from_slice(a.as_bytes());
        out.push(0);
    }
    out
}

fn decode_argv(b: &[u8]) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    b.split(|c| *c == 0).filter(|a| !a.is_empty()).map(|a| std::ffi::OsStr::from_bytes(a).to_owned()).collect()
}

impl Link {
    /// Starts a keeper for the mount whose connection is `fuse` (the
    /// descriptor the mount was made with) and whose lock is `lock`; a
    /// daemon it starts runs `argv` (its program first).
    pub fn start(fuse: OwnedFd, lock: BorrowedFd<'_>, argv: &[std::ffi::OsString]) -> Result<Link> {
        use std::os::unix::process::CommandExt;
        let (ours, theirs) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
                .map_err(|e| Error::io("making the keeper's socket")(e.into()))?;
        let exe = std::env::current_exe().map_err(io("finding this program"))?;
        let at = theirs.as_raw_fd();
        let mut cmd = std::process::Command::new(exe);
        cmd.arg(KEEPER_ARG).arg(at.to_string()).stdin(std::process::Stdio::null()).process_group(0);
        // SAFETY: between fork and exec only close_range and fcntl, which
        // are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // The keeper outlives the daemon: it must hold nothing the
                // daemon inherited (a readiness pipe kept open would keep
                // `mado mount` waiting), only the link.
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as libc::c_uint);
                let flags = libc::fcntl(at, libc::F_GETFD);
                if flags < 0 || libc::fcntl(at, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(io("starting the mount's keeper"))?;
        drop(theirs);
        put_msg(ours.as_fd(), MSG_ANNOUNCE, &encode_argv(argv), &[fuse.as_fd(), lock])
            .map_err(io("handing the mount to its keeper"))?;
        drop(fuse);
        let keeper_pid = read_pid(&ours).map_err(io("hearing from the mount's keeper"))?;
        debug_assert_eq!(keeper_pid, child.id());
        Ok(Link { sock: ours, keeper_pid })
    }

    /// A daemon that took the mount over (restarted, or started by the
    /// keeper) tells the keeper, on the link `sock` it was passed, what to
    /// run should it die too.
    pub fn adopt(sock: OwnedFd, argv: &[std::ffi::OsString]) -> Result<Link> {
        put_msg(sock.as_fd(), MSG_ANNOUNCE, &encode_argv(argv), &[]).map_err(io("telling the mount's keeper"))?;
        let keeper_pid = read_pid(&sock).map_err(io("hearing from the mount's keeper"))?;
        Ok(Link { sock, keeper_pid })
    }

    /// A copy of the link, to pass to the daemon taking the mount over.
    pub fn share(&self) -> Result<OwnedFd> {
        self.sock.try_clone().map_err(io("copying the keeper's socket"))
    }

    /// The mount ended (unmounted): the keeper goes, and is waited for (at
    /// most a few seconds), so the workspace's lock is free once this
    /// daemon exits.
    pub fn bye(&self) {
        if put_msg(self.sock.as_fd(), MSG_BYE, &[], &[]).is_ok() {
            let _ = rustix::net::sockopt::set_socket_timeout(
                &self.sock,
                rustix::net::sockopt::Timeout::Recv,
                Some(Duration::from_secs(5)),
            );
            let mut b = [0u8; 16];
            while matches!(rustix::io::read(&self.sock, &mut b), Ok(n) if n > 0) {}
        }
    }
}

fn read_pid(sock: &OwnedFd) -> std::io::Result<u32> {
    rustix::net::sockopt::set_socket_timeout(sock, rustix::net::sockopt::Timeout::Recv, Some(Duration::from_secs(10)))?;
    let mut b = [0u8; 4];
    std::fs::File::from(sock.try_clone()?).read_exact(&mut b)?;
    rustix::net::sockopt::set_socket_timeout(sock, rustix::net::sockopt::Timeout::Recv, None)?;
    Ok(u32::from_le_bytes(b))
}

/// The keeper process: `mado __keep-mount FD`. Never returns.
pub fn run(fd: RawFd) -> ! {
    // SAFETY: the daemon that started this process passed the descriptor
    // by its number; nothing else here uses it.
    let mut link = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = rustix::io::fcntl_setfd(&link, rustix::io::FdFlags::CLOEXEC);
    // The daemons this process starts are reaped by the kernel: a killed
    // one leaves no zombie behind.
    // SAFETY: setting a signal's disposition to "ignore" before any thread.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    }
    let (fuse, lock, mut argv) = match get_msg(&link) {
        Ok((MSG_ANNOUNCE, payload, fds)) if fds.len() == 2 => {
            let mut fds = fds.into_iter();
            let (f, l) = (fds.next().expect("two"), fds.next().expect("two"));
            (f, l, decode_argv(&payload))
        }
        other => {
            tracing::error!("the mount's keeper got no mount from its daemon: {:?}", other.map(|m| m.0));
            std::process::exit(2);
        }
    };
    let me = std::process::id().to_le_bytes();
    let _ = rustix::io::write(&link, &me);
    tracing::debug!("keeping the mount for daemon {}", argv.first().map(|a| a.to_string_lossy()).unwrap_or_default());
    // When daemons die: one that dies again and again (a request that
    // kills it, sent again to each new one) ends the keeping.
    let mut deaths: std::collections::VecDeque<std::time::Instant> = Default::default();
    loop {
        match get_msg(&link) {
            Ok((MSG_ANNOUNCE, payload, _)) => {
                argv = decode_argv(&payload);
                let _ = rustix::io::write(&link, &me);
            }
            Ok((MSG_BYE, ..)) => std::process::exit(0),
            Ok(_) => {}
            Err(e) => {
                if connection_gone(&fuse) {
                    std::process::exit(0);
                }
                let now = std::time::Instant::now();
                deaths.retain(|t| now.duration_since(*t) < DEATHS_WITHIN);
                deaths.push_back(now);
                if deaths.len() > MAX_DEATHS {
                    tracing::error!(
                        "the mount's daemon died {} times within {} s; giving the mount up (it reads as \
                         disconnected: see this log, then `mado umount` it and mount again)",
                        deaths.len(),
                        DEATHS_WITHIN.as_secs()
                    );
                    std::process::exit(1);
                }
                tracing::warn!("the mount's daemon is gone ({e}); starting a new one to serve it");
                match respawn(&argv, &fuse, &lock) {
                    Some(l) => link = l,
                    None => {
                        tracing::error!(
                            "no new daemon took the mount over; giving it up (it reads as disconnected: \
                             `mado umount` it and mount again)"
                        );
                        std::process::exit(1);
                    }
                }
            }
        }
    }
}

/// Starts a daemon with `argv` to take the mount over, trying a few
/// times; the new link once one serves.
fn respawn(argv: &[std::ffi::OsString], fuse: &OwnedFd, lock: &OwnedFd) -> Option<OwnedFd> {
    for wait in TRIES {
        std::thread::sleep(wait);
        if connection_gone(fuse) {
            return None;
        }
        match crate::handover::start_recovery(argv, fuse, lock) {
            Ok((link, pid)) => {
                tracing::info!("daemon {pid} serves the mount now");
                return Some(link);
            }
            Err(e) => tracing::error!("a new daemon could not take the mount over: {e}"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_messages_carry_their_payload_and_descriptors() {
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
            .expect("socketpair");
        let argv: Vec<std::ffi::OsString> = vec!["/bin/mado".into(), "mount".into(), "a b".into()];
        let f = std::fs::File::open("/dev/null").expect("/dev/null");
        put_msg(a.as_fd(), MSG_ANNOUNCE, &encode_argv(&argv), &[f.as_fd()]).expect("send");
        put_msg(a.as_fd(), MSG_BYE, &[], &[]).expect("send");
        let (tag, payload, fds) = get_msg(&b).expect("first");
        assert_eq!((tag, decode_argv(&payload), fds.len()), (MSG_ANNOUNCE, argv, 1));
        let (tag, payload, fds) = get_msg(&b).expect("second");
        assert_eq!((tag, payload.len(), fds.len()), (MSG_BYE, 0, 0));
        drop(a);
        assert_eq!(get_msg(&b).map(|m| m.0).unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
