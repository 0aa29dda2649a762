//! Handing a workspace's FUSE mount to a new daemon process (`mado
//! restart DIR`, after an upgrade) without unmounting it: the processes
//! using the mount see a pause, never an error, and keep their open files
//! and working directories. docs/DESIGN.md ("Restarting a daemon in
//! place") gives the sequence; docs/FORMAT.md ("Mount handover") the bytes.
//!
//! The kernel's side of a mount lives as long as some process holds a
//! descriptor of its connection (`/dev/fuse`), so the old daemon passes
//! one over a socket (SCM_RIGHTS). What the kernel knows of the mount
//! (inode numbers and their lookup counts) comes with it
//! ([`mado_core::vfs::InodeImage`]); the rest is the workspace's saved
//! state, written just before.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use mado_core::{Error, Result};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

/// Set once a session's request threads have all returned (the
/// filesystem's `destroy`); reset when a new session starts.
#[derive(Default)]
pub struct Ended {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Ended {
    pub fn set(&self) {
        *self.done.lock().expect("ended lock") = true;
        self.cv.notify_all();
    }

    pub fn wait(&self) {
        let mut d = self.done.lock().expect("ended lock");
        while !*d {
            d = self.cv.wait(d).expect("ended lock");
        }
    }

    pub fn reset(&self) {
        *self.done.lock().expect("ended lock") = false;
    }
}

/// Requests read but not yet answered because their answer waits on a
/// task (the network, a blocking thread): a handover saves the state only
/// once none is left.
#[derive(Default)]
pub struct InFlight {
    n: Mutex<usize>,
    idle: Condvar,
}

/// One request in flight; dropped when its task ends.
pub struct Flying(Arc<InFlight>);

impl InFlight {
    pub fn start(self: &Arc<Self>) -> Flying {
        *self.n.lock().expect("in-flight lock") += 1;
        Flying(self.clone())
    }

    /// Waits until no request is in flight, at most `limit`; whether none is.
    fn wait_idle(&self, limit: Duration) -> bool {
        let n = self.n.lock().expect("in-flight lock");
        let (n, _) = self.idle.wait_timeout_while(n, limit, |n| *n > 0).expect("in-flight lock");
        *n == 0
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        let mut n = self.0.n.lock().expect("in-flight lock");
        *n -= 1;
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// Where a handover stands, for the daemon's main thread (which sees the
/// session end and must not tear the workspace down meanwhile).
enum Phase {
    Serving,
    HandingOver,
    /// The new daemon serves: this process only has to exit.
    Done,
    /// The new daemon failed: this process serves again, on this
    /// descriptor of the kernel's connection.
    Failed(OwnedFd),
}

/// The running FUSE session's parts a handover works on.
pub struct Seat {
    /// The descriptor number the session reads requests from and writes
    /// answers to; `None` while fusermount3 holds the connection (a mount
    /// not made by this process as root).
    fd: Mutex<Option<RawFd>>,
    mountpoint: PathBuf,
    threads: usize,
    pub ended: Arc<Ended>,
    pub in_flight: Arc<InFlight>,
    phase: Mutex<Phase>,
    changed: Condvar,
}

/// What the main thread does once the session ended.
pub enum After {
    /// An unmount: tear down as always.
    Unmounted,
    /// Handed over: exit without a teardown (the new daemon has the lease,
    /// the lock and the mount).
    Exit,
    /// Serve again on this descriptor (the new daemon failed).
    Serve(OwnedFd),
}

impl Seat {
    pub fn new(mountpoint: PathBuf, threads: usize) -> Seat {
        Seat {
            fd: Mutex::new(None),
            mountpoint,
            threads,
            ended: Arc::default(),
            in_flight: Arc::default(),
            phase: Mutex::new(Phase::Serving),
            changed: Condvar::new(),
        }
    }

    /// A session serves on descriptor number `fd`.
    pub fn serving_on(&self, fd: RawFd) {
        *self.fd.lock().expect("seat lock") = Some(fd);
    }

    /// Called by the main thread once the session's threads have ended.
    pub fn after_end(&self) -> After {
        let mut p = self.phase.lock().expect("phase lock");
        loop {
            match std::mem::replace(&mut *p, Phase::Serving) {
                Phase::Serving => return After::Unmounted,
                Phase::HandingOver => {
                    *p = Phase::HandingOver;
                    p = self.changed.wait(p).expect("phase lock");
                }
                Phase::Done => {
                    *p = Phase::Done;
                    return After::Exit;
                }
                Phase::Failed(fd) => return After::Serve(fd),
            }
        }
    }

    fn set_phase(&self, to: Phase) {
        *self.phase.lock().expect("phase lock") = to;
        self.changed.notify_all();
    }

    /// Hands the mount to a new daemon started from `argv` (its program
    /// first); `save` writes the workspace's state durably and returns the
    /// inode numbers taken with it, and the lock to pass on. The new
    /// daemon's pid, once it serves. On failure this process serves again.
    pub fn hand_over(
        &self,
        argv: &[std::ffi::OsString],
        save: impl FnOnce() -> Result<(mado_core::vfs::InodeImage, OwnedFd, Option<OwnedFd>)>,
    ) -> Result<u32> {
        let at = *self.fd.lock().expect("seat lock");
        let Some(at) = at.filter(|_| rustix::process::geteuid().is_root()) else {
            return Err(Error::User(
                "handing a mount over needs a mount this daemon made as root (the kernel connection is passed \
                 with its answers relayed); unmount and mount again instead"
                    .into(),
            ));
        };
        let io = |what: &'static str| move |e: rustix::io::Errno| Error::io(what)(e.into());
        let (ours, theirs) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::empty(), None)
                .map_err(io("making the handover socket"))?;
        rustix::io::fcntl_setfd(&ours, rustix::io::FdFlags::CLOEXEC).map_err(io("making the handover socket"))?;
        // A new daemon that hangs (its store unreachable) is given up on.
        rustix::net::sockopt::set_socket_timeout(&ours, rustix::net::sockopt::Timeout::Recv, Some(SUCCESSOR_WAIT))
            .map_err(io("making the handover socket"))?;
        {
            let mut p = self.phase.lock().expect("phase lock");
            if !matches!(*p, Phase::Serving) {
                return Err(Error::Busy("this mount is being handed over already".into()));
            }
            *p = Phase::HandingOver;
        }
        let child = start_successor(argv, theirs.as_raw_fd());
        drop(theirs);
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                self.set_phase(Phase::Serving);
                return Err(e);
            }
        };
        let fuse = match self.detach(at) {
            Ok(f) => f,
            Err(e) => {
                // Not detached: the session still serves.
                let _ = child.kill();
                let _ = child.wait();
                self.set_phase(Phase::Serving);
                return Err(e);
            }
        };
        // The session is ending from here on: any failure serves again.
        let answer = self
            .drain()
            .and_then(|()| save())
            .and_then(|(image, lock, keeper)| send(&ours, MAGIC, &fuse, &lock, keeper.as_ref(), &image.encode()))
            .and_then(|()| await_successor(&ours));
        match answer {
            Ok(()) => {
                tracing::info!("handed {} over to pid {}", self.mountpoint.display(), child.id());
                self.set_phase(Phase::Done);
                Ok(child.id())
            }
            Err(e) => {
                tracing::error!("handing {} over failed ({e}); serving it again", self.mountpoint.display());
                let _ = child.kill();
                let _ = child.wait();
                self.set_phase(Phase::Failed(fuse));
                Err(e)
            }
        }
    }

    /// Stops the session from reading more requests (every request it has
    /// read is still answered to the kernel: [`Seat::drain`] waits for
    /// that), and returns a descriptor of the kernel's connection. The
    /// session's descriptor number `at` is pointed at a socket: a request
    /// thread reading it next finds its end and returns; one asleep in a
    /// read of the connection is woken by a lookup sent here (of a name
    /// never used), answers it, and then finds the end too. Answers written
    /// meanwhile reach the socket and are relayed to the connection whole
    /// (a sequenced-packet socket keeps each write one message). An error
    /// leaves the session serving.
    fn detach(&self, at: RawFd) -> Result<OwnedFd> {
        let io = |what: &'static str| move |e: rustix::io::Errno| Error::io(what)(e.into());
        tracing::info!(
            "handing {} over: the session's request threads stop (fuser logs a short read as each one does)",
            self.mountpoint.display()
        );
        // SAFETY: `at` is the session's open descriptor, which lives as
        // long as the session (never dropped while it is serving).
        let session_fd = unsafe { BorrowedFd::borrow_raw(at) };
        let fuse = rustix::io::fcntl_dupfd_cloexec(session_fd, 0).map_err(io("copying the FUSE descriptor"))?;
        let (relay_end, session_end) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .map_err(io("making the relay socket"))?;
        for s in [&relay_end, &session_end] {
            force_buffer(s, RELAY_BUFFER).map_err(|e| Error::io("sizing the relay socket")(e))?;
        }
        rustix::net::shutdown(&relay_end, rustix::net::Shutdown::Write).map_err(io("closing the relay's way back"))?;
        let to_kernel = fuse.try_clone().map_err(Error::io("copying the FUSE descriptor"))?;
        std::thread::Builder::new()
            .name("mado-handover-relay".into())
            .spawn(move || relay(relay_end, to_kernel))
            .map_err(Error::io("starting the relay"))?;
        // SAFETY: replaces the session's descriptor number in place; the
        // OwnedFd is never dropped here (the session still owns `at`).
        let mut target = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(at) });
        rustix::io::dup3(&session_end, &mut target, rustix::io::DupFlags::CLOEXEC)
            .map_err(io("pointing the session at the relay"))?;
        drop(session_end);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        for k in 0..self.threads {
            let poke = self.mountpoint.join(format!(".mado-handover-{}-{nanos}-{k}", std::process::id()));
            let _ = std::thread::Builder::new()
                .name("mado-handover-poke".into())
                .spawn(move || std::fs::symlink_metadata(poke));
        }
        Ok(fuse)
    }

    /// Waits until the session's threads have all returned and no request
    /// it read waits on a task any more: then no node changes.
    fn drain(&self) -> Result<()> {
        self.ended.wait();
        if !self.in_flight.wait_idle(Duration::from_secs(60)) {
            return Err(Error::Busy("requests of this mount are still waiting after a minute".into()));
        }
        Ok(())
    }
}

/// How long the old daemon waits for the new one to say it serves.
const SUCCESSOR_WAIT: Duration = Duration::from_secs(120);

/// The largest answer the relay carries: a READ's data (at most 1 MiB
/// with fuser's settings) and its header, with room.
const RELAY_BUFFER: usize = 4 << 20;

/// SO_SNDBUFFORCE and SO_RCVBUFFORCE (root): a sequenced-packet socket
/// refuses a message larger than its send buffer.
fn force_buffer(s: &OwnedFd, bytes: usize) -> std::io::Result<()> {
    let v = bytes as libc::c_int;
    for opt in [libc::SO_SNDBUFFORCE, libc::SO_RCVBUFFORCE] {
        // SAFETY: a valid socket and a c_int option value of the size given.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Passes each answer the session writes to the kernel's connection, until
/// no one can write any more.
fn relay(from: OwnedFd, to: OwnedFd) {
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        match rustix::io::read(&from, &mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if let Err(e) = rustix::io::write(&to, &buf[..n]) {
                    // The kernel refuses an answer to a request it no
                    // longer waits for (interrupted): nothing is lost.
                    tracing::debug!("relaying an answer to the kernel: {e}");
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                tracing::warn!("the handover relay stopped: {e}");
                return;
            }
        }
    }
}

/// This daemon's own arguments with `exe` as the program, for the daemon
/// that takes the mount over (its readiness pipe and any handover socket
/// of its own left out).
pub fn successor_argv(exe: &Path) -> Vec<std::ffi::OsString> {
    let mut out = vec![exe.as_os_str().to_owned()];
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        if a == "--ready-fd" || a == "--handover-fd" {
            args.next();
            continue;
        }
        out.push(a);
    }
    out
}

/// Starts the new daemon with the handover socket as `fd` (the only
/// descriptor it inherits besides stdio).
fn start_successor(argv: &[std::ffi::OsString], fd: RawFd) -> Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let (prog, args) = argv.split_first().ok_or_else(|| Error::User("no program to hand the mount to".into()))?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).arg("--handover-fd").arg(fd.to_string());
    cmd.stdin(std::process::Stdio::null()).process_group(0);
    cmd.spawn().map_err(Error::io(format!("starting {}", Path::new(prog).display())))
}

/// A daemon handing its mount over: the inode image follows.
const MAGIC: &[u8; 4] = b"MADH";
/// A keeper whose daemon died: no image (the new daemon reads the numbers
/// saved on disk), and the descriptor is the connection's own, to clone.
const MAGIC_RECOVER: &[u8; 4] = b"MADR";

/// Sends the kernel connection, the mount lock and the keeper's link when
/// there is one (SCM_RIGHTS, with the header), then the inode numbers.
fn send(
    sock: &OwnedFd,
    magic: &[u8; 4],
    fuse: &OwnedFd,
    lock: &OwnedFd,
    keeper: Option<&OwnedFd>,
    image: &[u8],
) -> Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut header = magic.to_vec();
    header.extend_from_slice(&(image.len() as u64).to_le_bytes());
    let mut fds = vec![fuse.as_fd(), lock.as_fd()];
    fds.extend(keeper.map(|k| k.as_fd()));
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    anc.push(SendAncillaryMessage::ScmRights(&fds));
    let n = rustix::net::sendmsg(sock, &[std::io::IoSlice::new(&header)], &mut anc, SendFlags::NOSIGNAL)
        .map_err(|e| Error::io("handing the mount over")(e.into()))?;
    let mut w = std::fs::File::from(sock.try_clone().map_err(Error::io("handing the mount over"))?);
    w.write_all(&header[n..]).and_then(|()| w.write_all(image)).map_err(Error::io("handing the mount over"))
}

/// The new daemon's word: one byte `1` once it serves; anything else (or
/// its end) is its failure, with its reason after a `0`.
fn await_successor(sock: &OwnedFd) -> Result<()> {
    let mut r = std::fs::File::from(sock.try_clone().map_err(Error::io("waiting for the new daemon"))?);
    let mut first = [0u8; 1];
    match r.read(&mut first) {
        Ok(1) if first[0] == b'1' => Ok(()),
        Ok(1) => {
            let mut why = String::new();
            let _ = r.read_to_string(&mut why);
            Err(Error::User(format!("the new daemon could not take the mount over: {}", why.trim())))
        }
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            Err(Error::User(format!(
                "the new daemon did not take the mount over within {} s; see the mount's log",
                SUCCESSOR_WAIT.as_secs()
            )))
        }
        _ => Err(Error::User("the new daemon ended before taking the mount over; see the mount's log".into())),
    }
}

/// A keeper's side of a killed daemon's recovery: starts a daemon from
/// `argv` and hands it the mount as a restart would, with no image; the
/// keeper's new link and the daemon's pid once it serves.
pub(crate) fn start_recovery(argv: &[std::ffi::OsString], fuse: &OwnedFd, lock: &OwnedFd) -> Result<(OwnedFd, u32)> {
    let io = |what: &'static str| move |e: rustix::io::Errno| Error::io(what)(e.into());
    let (ours, theirs) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::empty(), None)
        .map_err(io("making the handover socket"))?;
    rustix::io::fcntl_setfd(&ours, rustix::io::FdFlags::CLOEXEC).map_err(io("making the handover socket"))?;
    rustix::net::sockopt::set_socket_timeout(&ours, rustix::net::sockopt::Timeout::Recv, Some(SUCCESSOR_WAIT))
        .map_err(io("making the handover socket"))?;
    let (keep, give) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(io("making the keeper's socket"))?;
    let mut child = start_successor(argv, theirs.as_raw_fd())?;
    drop(theirs);
    let r = send(&ours, MAGIC_RECOVER, fuse, lock, Some(&give), &[]).and_then(|()| await_successor(&ours));
    drop(give);
    match r {
        Ok(()) => Ok((keep, child.id())),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// What the new daemon receives.
pub struct Received {
    /// With `image`, a descriptor to serve on; without, the connection's
    /// own descriptor (a keeper's), to clone and serve on the clone.
    pub fuse: OwnedFd,
    pub lock: OwnedFd,
    /// The inode numbers; `None` from a keeper (read those saved on disk).
    pub image: Option<mado_core::vfs::InodeImage>,
    /// The link to the mount's keeper, when it has one.
    pub keeper: Option<OwnedFd>,
    /// Where it says whether it took the mount over.
    pub answer: OwnedFd,
}

/// The new daemon's side: reads what the old one sends on `fd`.
pub fn receive(fd: RawFd) -> Result<Received> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let io = |e: std::io::Error| Error::io("receiving the mount handed over")(e);
    // SAFETY: the old daemon passed this descriptor to this process alone,
    // by its number in the arguments; nothing else here uses it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&sock, rustix::io::FdFlags::CLOEXEC).map_err(|e| io(e.into()))?;
    let mut header = [0u8; 12];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let got =
        rustix::net::recvmsg(&sock, &mut [std::io::IoSliceMut::new(&mut header)], &mut anc, RecvFlags::CMSG_CLOEXEC)
            .map_err(|e| io(e.into()))?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = m {
            fds.extend(r);
        }
    }
    let mut r = std::fs::File::from(sock.try_clone().map_err(io)?);
    r.read_exact(&mut header[got.bytes..]).map_err(io)?;
    let recover = &header[..4] == MAGIC_RECOVER;
    if !(recover || &header[..4] == MAGIC) || !(2..=3).contains(&fds.len()) {
        return Err(Error::User(format!(
            "the handover socket carried no mount ({} descriptors, header {:?})",
            fds.len(),
            &header[..4]
        )));
    }
    let len = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
    let mut image = vec![0u8; usize::try_from(len).map_err(|_| Error::User("a handover image too large".into()))?];
    r.read_exact(&mut image).map_err(io)?;
    let image = if recover { None } else { Some(mado_core::vfs::InodeImage::decode(&image)?) };
    let keeper = if fds.len() == 3 { fds.pop() } else { None };
    let lock = fds.pop().expect("two descriptors");
    let fuse = fds.pop().expect("two descriptors");
    Ok(Received { fuse, lock, image, keeper, answer: sock })
}

/// Tells the old daemon whether this one serves the mount now.
pub fn answer(to: &OwnedFd, r: std::result::Result<(), &Error>) {
    let msg = match r {
        Ok(()) => b"1".to_vec(),
        Err(e) => format!("0{e}").into_bytes(),
    };
    let _ = rustix::io::write(to, &msg);
}

/// A session on a kernel connection that another process began: fuser's
/// session insists on an INIT first, which the kernel sent long ago, so it
/// reads one made here from a socket, and the connection then takes that
/// socket's descriptor number. The values in it only shape this session's
/// own answer to it (thrown away); the kernel keeps what it agreed to with
/// the first daemon.
pub fn session_on<FS: fuser::Filesystem>(
    fs: FS,
    fuse: OwnedFd,
    config: fuser::Config,
) -> std::io::Result<(fuser::Session<FS>, RawFd)> {
    let (session_end, feeder) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    rustix::io::write(&feeder, &fake_init())?;
    let at = session_end.as_raw_fd();
    let acl = config.acl;
    let session = fuser::Session::from_fd(fs, session_end, acl, config)?;
    // SAFETY: `at` is the descriptor the session now owns; replaced in
    // place, never dropped here.
    let mut target = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(at) });
    rustix::io::dup3(&fuse, &mut target, rustix::io::DupFlags::CLOEXEC)?;
    drop(feeder);
    Ok((session, at))
}

/// FUSE_INIT, protocol 7.31, offering every flag of that version.
fn fake_init() -> Vec<u8> {
    const FUSE_INIT: u32 = 26;
    let mut b = Vec::with_capacity(104);
    let body: [u32; 16] = [7, 31, 1 << 20, 0x3fff_ffff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let len = 40 + body.len() as u32 * 4;
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&FUSE_INIT.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // unique
    b.extend_from_slice(&0u64.to_le_bytes()); // nodeid
    for v in [0u32, 0, 0] {
        b.extend_from_slice(&v.to_le_bytes()); // uid, gid, pid
    }
    b.extend_from_slice(&0u32.to_le_bytes()); // total_extlen, padding
    for v in body {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}
