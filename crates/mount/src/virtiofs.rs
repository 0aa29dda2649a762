//! The virtio-fs transport: serves the same [`MadoFs`] that `mado mount`
//! serves, to a VM guest, over vhost-user (the protocol virtiofsd speaks;
//! QEMU, Cloud Hypervisor and Firecracker connect to it).
//!
//! A guest's FUSE requests arrive in virtqueue descriptor chains instead
//! of being read from /dev/fuse; the bytes are the same FUSE protocol. So
//! the filesystem is not implemented twice: each request is copied out of
//! guest memory and handed to a fuser session running on one end of a
//! `SOCK_SEQPACKET` socket pair (which, like /dev/fuse, delivers one whole
//! message per read), and each reply fuser writes is copied into the
//! chain's writable buffers and the chain returned to the guest.
//!
//! What the transport itself decides:
//! - A new session per guest FUSE_INIT (a guest may unmount and mount
//!   again); FUSE_DESTROY ends it.
//! - `unique` ids are the transport's own (the guest's are put back in the
//!   reply), so a guest reusing an id cannot make one reply complete two
//!   chains, and a reply matches exactly one waiting chain.
//! - FORGET and BATCH_FORGET get no reply: their chains are returned at
//!   once. INTERRUPT is not forwarded (fuser does not act on it).
//! - A malformed chain (too short, a length that disagrees with the
//!   header, larger than the largest request, no room for a reply header)
//!   gets an errno when there is room for one, and never reaches the
//!   session: a hostile guest can fail its own requests, not the server.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{DescriptorChain, QueueOwnedT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};

/// One high-priority queue (FORGET, INTERRUPT) and request queues.
const REQUEST_QUEUES: usize = 1;
const NUM_QUEUES: usize = 1 + REQUEST_QUEUES;
const QUEUE_SIZE: usize = 1024;

/// FUSE opcodes the transport acts on.
const FUSE_FORGET: u32 = 2;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;
const FUSE_SYNCFS: u32 = 50;
const FUSE_READ: u32 = 15;
const FUSE_READDIR: u32 = 28;
const FUSE_READDIRPLUS: u32 = 44;
/// Where `fuse_read_in.size` sits in a READ or READDIR request.
const READ_SIZE_AT: usize = IN_HEADER + 16;
/// `fuse_in_header` and `fuse_out_header` sizes.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// The threads of a guest's FUSE session.
const SESSION_THREADS: usize = 4;

/// The largest read or write a session is told to accept: bounded by the
/// socket pair's buffer (a message must fit in it whole).
const MAX_IO: u32 = 1 << 20;

type Mem = GuestMemoryAtomic<GuestMemoryMmap<()>>;
type Chain = DescriptorChain<GuestMemoryLoadGuard<GuestMemoryMmap<()>>>;

/// Makes the filesystem for a new session (one per guest mount), told the
/// largest read or write the session can carry (`MadoFs::with_max_io`).
pub type MakeFs<F> = Arc<dyn Fn(u32) -> F + Send + Sync>;

/// Makes every change so far durable: a guest's `sync` (FUSE_SYNCFS, which
/// the virtio-fs driver sends and fuser does not know).
pub type SyncAll = Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>;

/// A chain waiting for its reply.
struct Pending {
    vring: VringRwLock,
    chain: Chain,
    guest_unique: u64,
    /// FUSE_DESTROY: the session ends once it has answered.
    destroy: bool,
    /// The session it was sent to ([`session_id`]).
    session: usize,
}

/// A session's identity: its socket's address, which no later session can
/// share while the session's reply loop (holding the socket) runs.
fn session_id(sock: &Arc<OwnedFd>) -> usize {
    Arc::as_ptr(sock) as usize
}

/// One fuser session and the socket to it.
struct Session {
    sock: Arc<OwnedFd>,
    /// The largest read it was told it may be asked.
    max_io: u32,
}

struct Bridge<F> {
    make_fs: MakeFs<F>,
    sync_all: Option<SyncAll>,
    session: Mutex<Option<Session>>,
    pending: Arc<Mutex<HashMap<u64, Pending>>>,
    next_unique: AtomicU64,
    event_idx: Arc<AtomicBool>,
    counts: Arc<Counts>,
}

struct Backend<F> {
    mem: Mutex<Option<Mem>>,
    event_idx: Arc<AtomicBool>,
    bridge: Arc<Bridge<F>>,
}

/// What the transport counts, for `mado stats`: chains taken, chains
/// refused, and well-formed requests by opcode.
pub struct Counts {
    requests: AtomicU64,
    refused: AtomicU64,
    by_opcode: [AtomicU64; 64],
}

impl Default for Counts {
    fn default() -> Counts {
        Counts {
            requests: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            by_opcode: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Counts {
    pub fn snapshot(&self) -> crate::protocol::VirtioFsStats {
        let by_op = self
            .by_opcode
            .iter()
            .enumerate()
            .filter_map(|(op, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then(|| (opcode_name(op as u32), n))
            })
            .collect();
        crate::protocol::VirtioFsStats {
            requests: self.requests.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            by_op,
        }
    }
}

/// A FUSE opcode's name (`fuse_opcode` in the kernel's fuse.h, lower case).
fn opcode_name(op: u32) -> String {
    const NAMES: [&str; 53] = [
        "unknown",
        "lookup",
        "forget",
        "getattr",
        "setattr",
        "readlink",
        "symlink",
        "",
        "mknod",
        "mkdir",
        "unlink",
        "rmdir",
        "rename",
        "link",
        "open",
        "read",
        "write",
        "statfs",
        "release",
        "",
        "fsync",
        "setxattr",
        "getxattr",
        "listxattr",
        "removexattr",
        "flush",
        "init",
        "opendir",
        "readdir",
        "releasedir",
        "fsyncdir",
        "getlk",
        "setlk",
        "setlkw",
        "access",
        "create",
        "interrupt",
        "bmap",
        "destroy",
        "ioctl",
        "poll",
        "notify_reply",
        "batch_forget",
        "fallocate",
        "readdirplus",
        "rename2",
        "lseek",
        "copy_file_range",
        "setupmapping",
        "removemapping",
        "syncfs",
        "tmpfile",
        "statx",
    ];
    match NAMES.get(op as usize) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => format!("op{op}"),
    }
}

/// A running virtio-fs server: accepts one VMM connection at a time, and
/// another after it ends, until [`Server::shutdown`].
pub struct Server<F> {
    bridge: Arc<Bridge<F>>,
    stop: Arc<AtomicBool>,
    current: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
    socket: std::path::PathBuf,
}

impl<F: fuser::Filesystem + Send + 'static> Server<F> {
    /// Binds the vhost-user socket at `path` (replacing a stale one).
    /// Serving starts with [`Server::run`].
    pub fn bind(
        path: &Path,
        make_fs: MakeFs<F>,
        sync_all: Option<SyncAll>,
        counts: Arc<Counts>,
    ) -> std::io::Result<(Server<F>, Listener)> {
        clear_socket_path(path)?;
        let listener =
            Listener::new(path, true).map_err(|e| std::io::Error::other(format!("binding {}: {e}", path.display())))?;
        let bridge = Arc::new(Bridge {
            make_fs,
            sync_all,
            session: Mutex::new(None),
            pending: Arc::default(),
            next_unique: AtomicU64::new(1),
            event_idx: Arc::default(),
            counts,
        });
        let server = Server { bridge, stop: Arc::default(), current: Arc::default(), socket: path.to_path_buf() };
        Ok((server, listener))
    }

    /// A handle that stops the server from another thread.
    pub fn stopper(&self) -> Stopper {
        Stopper { stop: self.stop.clone(), current: self.current.clone(), socket: self.socket.clone() }
    }

    /// Serves connections one after another until stopped. Returns once
    /// the last connection is closed and its session has ended.
    pub fn run(&self, mut listener: Listener) -> std::io::Result<()> {
        while !self.stop.load(Ordering::Acquire) {
            let backend = Arc::new(Backend {
                mem: Mutex::new(None),
                event_idx: self.bridge.event_idx.clone(),
                bridge: self.bridge.clone(),
            });
            let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
            let mut daemon = VhostUserDaemon::new("mado-virtiofs".into(), backend, mem)
                .map_err(|e| std::io::Error::other(format!("vhost-user: {e}")))?;
            daemon.start(&mut listener).map_err(|e| std::io::Error::other(format!("vhost-user accept: {e}")))?;
            *self.current.lock().expect("current lock") = daemon.shutdown_handle();
            if self.stop.load(Ordering::Acquire) {
                daemon.request_shutdown();
            }
            let r = daemon.wait();
            *self.current.lock().expect("current lock") = None;
            for h in daemon.get_epoll_handlers() {
                h.send_exit_event();
            }
            drop(daemon);
            self.bridge.end_session();
            match r {
                // The VMM went away (the guest powered off): the usual end.
                Ok(())
                | Err(vhost_user_backend::Error::HandleRequest(
                    vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
                )) => {}
                Err(e) if !self.stop.load(Ordering::Acquire) => {
                    tracing::error!("the connection ended with an error: {e}");
                }
                Err(_) => {}
            }
        }
        Ok(())
    }
}

/// Makes way for the socket at `path`: nothing there, or a stale socket (no
/// one accepts on it), which goes. Anything else is refused: a file that
/// is not a socket (it was unlinked, whatever it was), or a socket a live
/// server listens on.
fn clear_socket_path(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let m = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) => m,
    };
    if !m.file_type().is_socket() {
        return Err(std::io::Error::other(format!(
            "{} exists and is not a socket; give --socket a path that is free (nothing was removed)",
            path.display()
        )));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::other(format!(
            "{} is the socket of a server that is running; stop it first or give --socket another path",
            path.display()
        )));
    }
    std::fs::remove_file(path)
}

/// Stops a [`Server`]: ends the current connection and the accept loop.
#[derive(Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    current: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
    socket: std::path::PathBuf,
}

impl Stopper {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.current.lock().expect("current lock").as_ref() {
            h.shutdown();
        }
        // Wake an accept that waits for a VMM: connect once ourselves.
        let _ = std::os::unix::net::UnixStream::connect(&self.socket);
    }
}

impl<F> Bridge<F> {
    /// Ends the current session: its socket closes, its threads read the
    /// end and exit; chains still waiting are returned empty.
    fn end_session(&self) {
        let s = self.session.lock().expect("session lock").take();
        if let Some(s) = s {
            close_session(&s.sock);
            tracing::info!("the guest's session ended");
        }
        let waiting: Vec<Pending> = self.pending.lock().expect("pending lock").drain().map(|(_, p)| p).collect();
        for p in waiting {
            let _ = p.vring.add_used(p.chain.head_index(), 0);
            let _ = p.vring.signal_used_queue();
        }
    }
}

impl<F: fuser::Filesystem + Send + 'static> Bridge<F> {
    /// Starts a session for a guest's FUSE_INIT, ending any earlier one.
    fn new_session(&self, max_io: u32) -> std::io::Result<Arc<OwnedFd>> {
        self.end_session();
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let max_io = max_io.min(size_buffers(ours.as_fd())).min(size_buffers(theirs.as_fd()));
        if max_io < 4096 {
            return Err(std::io::Error::other("the session's socket buffers hold less than a page"));
        }
        let fs = (self.make_fs)(max_io);
        let mut config = fuser::Config::default();
        config.acl = fuser::SessionACL::All;
        config.n_threads = Some(SESSION_THREADS);
        std::thread::Builder::new().name("virtiofs-session".into()).spawn(move || {
            match fuser::Session::from_fd(fs, theirs, fuser::SessionACL::All, config) {
                Ok(s) => {
                    let _ = s.run();
                }
                Err(e) => tracing::error!("the guest's FUSE session did not start: {e}"),
            }
        })?;
        let ours = Arc::new(ours);
        let (sock, pending) = (ours.clone(), self.pending.clone());
        std::thread::Builder::new().name("virtiofs-replies".into()).spawn(move || reply_loop(&sock, &pending))?;
        *self.session.lock().expect("session lock") = Some(Session { sock: ours.clone(), max_io });
        Ok(ours)
    }

    /// Takes one chain off `vring`: forwards its request, or answers it
    /// here when it is malformed or needs no reply.
    fn handle(&self, vring: &VringRwLock, chain: Chain, max_msg: usize) {
        self.counts.requests.fetch_add(1, Ordering::Relaxed);
        let head = chain.head_index();
        let mem = chain.memory().clone();
        let req = match read_request(&chain, &mem, max_msg) {
            Ok(r) => r,
            Err(errno) => {
                self.counts.refused.fetch_add(1, Ordering::Relaxed);
                return answer(vring, chain, &mem, 0, errno);
            }
        };
        let opcode = u32::from_ne_bytes(req[4..8].try_into().expect("4 bytes"));
        let guest_unique = u64::from_ne_bytes(req[8..16].try_into().expect("8 bytes"));
        // Opcodes past the table (no FUSE version has them) count as 0.
        let slot = if (opcode as usize) < self.counts.by_opcode.len() { opcode as usize } else { 0 };
        self.counts.by_opcode[slot].fetch_add(1, Ordering::Relaxed);
        match opcode {
            FUSE_INTERRUPT => return complete(vring, head, 0),
            FUSE_SYNCFS => {
                // Answered here, off this thread: a save may take a while.
                let Some(sync) = self.sync_all.clone() else {
                    return answer(vring, chain, &mem, guest_unique, 0);
                };
                let vring = vring.clone();
                let _ = std::thread::Builder::new().name("virtiofs-syncfs".into()).spawn(move || {
                    let errno = match sync() {
                        Ok(()) => 0,
                        Err(e) => {
                            tracing::error!("the guest's sync failed: {e}");
                            e.raw_os_error().unwrap_or(libc::EIO)
                        }
                    };
                    let mem = chain.memory().clone();
                    answer(&vring, chain, &mem, guest_unique, errno);
                });
                return;
            }
            FUSE_INIT => {
                if let Err(e) = self.new_session(MAX_IO) {
                    tracing::error!("starting a FUSE session: {e}");
                    return answer(vring, chain, &mem, guest_unique, libc::EIO);
                }
            }
            _ => {}
        }
        let (sock, max_io) = match self.session.lock().expect("session lock").as_ref() {
            Some(s) => (s.sock.clone(), s.max_io),
            // No FUSE_INIT yet (or the guest unmounted): nothing to serve.
            None => return answer(vring, chain, &mem, guest_unique, libc::EIO),
        };
        let no_reply = matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET);
        let unique = self.next_unique.fetch_add(1, Ordering::Relaxed);
        let mut req = req;
        req[8..16].copy_from_slice(&unique.to_ne_bytes());
        if matches!(opcode, FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS) && req.len() >= READ_SIZE_AT + 4 {
            // Never ask for more than the chain can carry back (a guest's
            // 4 GiB read would otherwise be a 4 GiB buffer): a short read.
            let room = chain.clone().writer(&mem).map(|w| w.available_bytes()).unwrap_or(0);
            let cap = room.saturating_sub(OUT_HEADER).min(max_io as usize) as u32;
            let size = u32::from_ne_bytes(req[READ_SIZE_AT..READ_SIZE_AT + 4].try_into().expect("4 bytes"));
            if size > cap {
                req[READ_SIZE_AT..READ_SIZE_AT + 4].copy_from_slice(&cap.to_ne_bytes());
            }
        }
        if no_reply {
            complete(vring, head, 0);
        } else {
            let session = session_id(&sock);
            let p = Pending { vring: vring.clone(), chain, guest_unique, destroy: opcode == FUSE_DESTROY, session };
            self.pending.lock().expect("pending lock").insert(unique, p);
        }
        if rustix::io::write(&*sock, &req).is_err() && !no_reply {
            // The session is gone: the chain gets its errno.
            if let Some(p) = self.pending.lock().expect("pending lock").remove(&unique) {
                let mem = p.chain.memory().clone();
                answer(&p.vring, p.chain, &mem, guest_unique, libc::EIO);
            }
        }
    }
}

/// Sizes one end of a session's socket pair to hold the largest message
/// whole (past `net.core.wmem_max` only with CAP_NET_ADMIN); returns the
/// largest read or write that then fits in one message.
fn size_buffers(fd: std::os::fd::BorrowedFd<'_>) -> u32 {
    let want = 4 * MAX_IO as usize;
    if rustix::net::sockopt::set_socket_send_buffer_size_force(fd, want).is_err() {
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(fd, want);
    }
    // A datagram must fit in the send buffer, less the kernel's overhead;
    // a message carries a page of header and arguments besides the data.
    let have = rustix::net::sockopt::socket_send_buffer_size(fd).unwrap_or(0);
    let room = have.saturating_sub(64 + 4096 + IN_HEADER) / 4096 * 4096;
    room.min(MAX_IO as usize) as u32
}

/// The request bytes of a chain, checked: a whole `fuse_in_header` whose
/// length is the chain's readable length, at most `max_msg` bytes.
fn read_request(chain: &Chain, mem: &GuestMemoryMmap<()>, max_msg: usize) -> Result<Vec<u8>, i32> {
    let mut r = chain.clone().reader(mem).map_err(|_| libc::EFAULT)?;
    let n = r.available_bytes();
    if !(IN_HEADER..=max_msg).contains(&n) {
        return Err(if n < IN_HEADER { libc::EINVAL } else { libc::E2BIG });
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf).map_err(|_| libc::EFAULT)?;
    let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    if len != n {
        return Err(libc::EINVAL);
    }
    Ok(buf)
}

/// Returns a chain with no bytes written.
fn complete(vring: &VringRwLock, head: u16, len: u32) {
    let _ = vring.add_used(head, len);
    let _ = signal(vring);
}

fn signal(vring: &VringRwLock) -> std::io::Result<()> {
    if vring.needs_notification().unwrap_or(true) {
        vring.signal_used_queue()?;
    }
    Ok(())
}

/// Answers a chain with a reply of only a header: `errno`, or success if
/// 0 (or nothing, if it has no room).
fn answer(vring: &VringRwLock, chain: Chain, mem: &GuestMemoryMmap<()>, unique: u64, errno: i32) {
    let head = chain.head_index();
    let mut out = [0u8; OUT_HEADER];
    out[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    let written = write_reply(chain, mem, &out);
    complete(vring, head, written);
}

/// Writes `reply` into the chain's writable part; the bytes written (0
/// when it does not fit whole: a reply is never cut short).
fn write_reply(chain: Chain, mem: &GuestMemoryMmap<()>, reply: &[u8]) -> u32 {
    let Ok(mut w) = chain.writer(mem) else { return 0 };
    if w.available_bytes() < reply.len() || w.write_all(reply).is_err() {
        return 0;
    }
    reply.len() as u32
}

/// Reads the session's replies and returns each to the chain waiting for
/// it, with the guest's `unique` put back. When the session ends (its
/// DESTROY answered, or the socket closed), every chain it still owes is
/// returned empty: the session's threads may answer a DESTROY before a
/// slower request, whose reply then never comes.
fn reply_loop(sock: &Arc<OwnedFd>, pending: &Mutex<HashMap<u64, Pending>>) {
    read_replies(sock, pending);
    let me = session_id(sock);
    let owed: Vec<Pending> = {
        let mut map = pending.lock().expect("pending lock");
        let ids: Vec<u64> = map.iter().filter(|(_, p)| p.session == me).map(|(u, _)| *u).collect();
        ids.into_iter().filter_map(|u| map.remove(&u)).collect()
    };
    for p in owed {
        complete(&p.vring, p.chain.head_index(), 0);
    }
}

/// Ends a session's threads quietly: each one ends at a FUSE_DESTROY, so
/// one is sent per thread before our side stops writing (queued messages
/// are read before the end, and their replies still have somewhere to
/// go: the reply loop reads on until the session closes its end). Shut
/// alone, every thread read a zero-length request and fuser logged it as
/// an error at each guest's power-off.
fn close_session(sock: &OwnedFd) {
    let mut destroy = [0u8; IN_HEADER];
    destroy[0..4].copy_from_slice(&(IN_HEADER as u32).to_ne_bytes());
    destroy[4..8].copy_from_slice(&FUSE_DESTROY.to_ne_bytes());
    for _ in 0..SESSION_THREADS {
        if rustix::io::write(sock, &destroy).is_err() {
            break;
        }
    }
    let _ = rustix::net::shutdown(sock, rustix::net::Shutdown::Write);
}

fn read_replies(sock: &OwnedFd, pending: &Mutex<HashMap<u64, Pending>>) {
    let mut buf = vec![0u8; MAX_IO as usize + 64 * 1024];
    loop {
        let n = match rustix::io::read(sock, &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if n < OUT_HEADER {
            continue;
        }
        let unique = u64::from_ne_bytes(buf[8..16].try_into().expect("8 bytes"));
        // unique 0: a notification; virtio-fs has no queue for them here.
        let Some(p) = pending.lock().expect("pending lock").remove(&unique) else { continue };
        let reply = &mut buf[..n];
        reply[8..16].copy_from_slice(&p.guest_unique.to_ne_bytes());
        let head = p.chain.head_index();
        let mem = p.chain.memory().clone();
        let mut written = write_reply(p.chain.clone(), &mem, reply);
        if written == 0 {
            // No room for the whole reply: say so rather than cut it.
            let mut out = [0u8; OUT_HEADER];
            out[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            out[4..8].copy_from_slice(&(-libc::ERANGE).to_ne_bytes());
            out[8..16].copy_from_slice(&p.guest_unique.to_ne_bytes());
            written = write_reply(p.chain, &mem, &out);
        }
        complete(&p.vring, head, written);
        if p.destroy {
            // Read on: the session's threads answer their DESTROYs and
            // close their end, which ends this loop.
            close_session(sock);
        }
    }
}

impl<F: fuser::Filesystem + Send + 'static> Backend<F> {
    fn process(&self, vring: &VringRwLock) -> std::io::Result<()> {
        let Some(atomic) = self.mem.lock().expect("mem lock").clone() else {
            return Ok(());
        };
        let max_msg = IN_HEADER + 4096 + MAX_IO as usize;
        loop {
            let chains: Vec<Chain> = {
                let mut state = vring.get_mut();
                let q = state.get_queue_mut();
                match q.iter(atomic.memory()) {
                    Ok(it) => it.collect(),
                    Err(e) => return Err(std::io::Error::other(format!("virtqueue: {e}"))),
                }
            };
            for c in chains {
                self.bridge.handle(vring, c, max_msg);
            }
            if !self.event_idx.load(Ordering::Relaxed) {
                return Ok(());
            }
            // With EVENT_IDX: look again after re-enabling notifications,
            // so a chain added meanwhile is not left waiting for a kick.
            match vring.enable_notification() {
                Ok(true) => {
                    let _ = vring.disable_notification();
                }
                _ => return Ok(()),
            }
        }
    }
}

impl<F: fuser::Filesystem + Send + 'static> VhostUserBackend for Backend<F> {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: Mem) -> std::io::Result<()> {
        *self.mem.lock().expect("mem lock") = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread: usize,
    ) -> std::io::Result<()> {
        if evset != EventSet::IN {
            return Err(std::io::Error::other("virtio-fs: an unexpected event"));
        }
        let Some(vring) = vrings.get(device_event as usize) else {
            return Err(std::io::Error::other(format!("virtio-fs: event for queue {device_event}")));
        };
        if self.event_idx.load(Ordering::Relaxed) {
            let _ = vring.disable_notification();
        }
        self.process(vring)
    }
}

#[cfg(test)]
mod tests {
    //! The transport against a guest's hostile or careless chains, on a
    //! virtqueue in memory (virtio-queue's mock), with a small filesystem
    //! behind a real fuser session: every chain comes back, malformed ones
    //! with an errno, and the session keeps serving.

    use std::time::{Duration, UNIX_EPOCH};

    use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, LockOwner, OpenFlags, ReplyAttr, ReplyData, Request};
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    use super::*;

    /// Answers getattr of the root, and a read with as many bytes as asked;
    /// everything else is fuser's ENOSYS.
    struct OneDir;

    impl fuser::Filesystem for OneDir {
        fn read(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            _offset: u64,
            size: u32,
            _flags: OpenFlags,
            _lock: Option<LockOwner>,
            reply: ReplyData,
        ) {
            reply.data(&vec![7u8; size as usize]);
        }

        /// EEXIST for exactly the name `LONG_NAME` (it reached us whole),
        /// ENOENT for any other.
        fn lookup(&self, _req: &Request, _parent: INodeNo, name: &std::ffi::OsStr, reply: fuser::ReplyEntry) {
            use std::os::unix::ffi::OsStrExt;
            reply.error(if name.as_bytes() == LONG_NAME { Errno::EEXIST } else { Errno::ENOENT });
        }

        fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
            if ino.0 == SLOW_INO {
                // Answered after the session has had time to end.
                std::thread::sleep(Duration::from_millis(500));
                return reply.error(Errno::EIO);
            }
            if ino.0 != 1 {
                return reply.error(Errno::ENOENT);
            }
            let t = UNIX_EPOCH;
            let a = FileAttr {
                ino,
                size: 0,
                blocks: 0,
                atime: t,
                mtime: t,
                ctime: t,
                crtime: t,
                kind: FileType::Directory,
                perm: 0o755,
                nlink: 2,
                uid: 0,
                gid: 0,
                rdev: 0,
                blksize: 4096,
                flags: 0,
            };
            reply.attr(&Duration::from_secs(1), &a);
        }
    }

    const LONG_NAME: &[u8] = b"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz";
    /// An inode whose GETATTR answers only after half a second.
    const SLOW_INO: u64 = 99;
    const QLEN: u16 = 64;
    const IN_BASE: u64 = 0x10_0000;
    const OUT_BASE: u64 = 0x80_0000;
    const SLOT: u64 = 0x1_0000;

    fn header(len: usize, opcode: u32, unique: u64, nodeid: u64) -> Vec<u8> {
        let mut h = Vec::with_capacity(len);
        h.extend_from_slice(&(len as u32).to_ne_bytes());
        h.extend_from_slice(&opcode.to_ne_bytes());
        h.extend_from_slice(&unique.to_ne_bytes());
        h.extend_from_slice(&nodeid.to_ne_bytes());
        h.extend_from_slice(&[0u8; 16]); // uid, gid, pid, extlen, padding
        h
    }

    fn init(unique: u64) -> Vec<u8> {
        let mut r = header(IN_HEADER + 64, FUSE_INIT, unique, 0);
        for v in [7u32, 38, 1 << 20, 0, 0] {
            r.extend_from_slice(&v.to_ne_bytes());
        }
        r.resize(IN_HEADER + 64, 0);
        r
    }

    fn getattr(unique: u64, nodeid: u64) -> Vec<u8> {
        let mut r = header(IN_HEADER + 16, 3, unique, nodeid);
        r.resize(IN_HEADER + 16, 0);
        r
    }

    fn lookup(unique: u64, name: &[u8]) -> Vec<u8> {
        let mut r = header(IN_HEADER + name.len() + 1, 1, unique, 1);
        r.extend_from_slice(name);
        r.push(0);
        r
    }

    fn read(unique: u64, size: u32) -> Vec<u8> {
        let mut r = header(IN_HEADER + 40, FUSE_READ, unique, 1);
        r.resize(IN_HEADER + 40, 0);
        r[READ_SIZE_AT..READ_SIZE_AT + 4].copy_from_slice(&size.to_ne_bytes());
        r
    }

    /// A chain to put on the queue: readable bytes (at `in_addr`, or the
    /// slot's), and a writable buffer of `out_len` bytes (none if 0).
    struct Req {
        bytes: Vec<u8>,
        in_addr: Option<u64>,
        out_len: u32,
    }

    fn req(bytes: Vec<u8>, out_len: u32) -> Req {
        Req { bytes, in_addr: None, out_len }
    }

    /// Puts `reqs` on a queue, runs the transport over it, and returns
    /// each chain's (used length, reply bytes).
    fn serve(reqs: &[Req], sync_all: Option<SyncAll>) -> (Vec<(u32, Vec<u8>)>, crate::protocol::VirtioFsStats) {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap();
        let q = MockSplitQueue::create(&mem, GuestAddress(0), QLEN);
        let mut descs = Vec::new();
        let mut heads = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let i = i as u64;
            let at = r.in_addr.unwrap_or(IN_BASE + i * SLOT);
            if r.in_addr.is_none() {
                mem.write_slice(&r.bytes, GuestAddress(at)).unwrap();
            }
            let first = descs.len() as u16;
            heads.push(first);
            if r.out_len > 0 {
                descs.push(RawDescriptor::from(SplitDescriptor::new(
                    at,
                    r.bytes.len() as u32,
                    VRING_DESC_F_NEXT as u16,
                    first + 1,
                )));
                descs.push(RawDescriptor::from(SplitDescriptor::new(
                    OUT_BASE + i * SLOT,
                    r.out_len,
                    VRING_DESC_F_WRITE as u16,
                    0,
                )));
            } else {
                descs.push(RawDescriptor::from(SplitDescriptor::new(at, r.bytes.len() as u32, 0, 0)));
            }
        }
        q.add_desc_chains(&descs, 0).unwrap();

        let atomic = GuestMemoryAtomic::new(mem.clone());
        let vring = VringRwLock::new(atomic.clone(), QLEN).unwrap();
        vring.set_queue_size(QLEN);
        vring.set_queue_info(q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0).unwrap();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        let call = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        vring.set_call(Some(std::fs::File::from(rustix::io::fcntl_dupfd_cloexec(&call, 0).unwrap())));

        let counts = Arc::new(Counts::default());
        let bridge = Arc::new(Bridge {
            make_fs: Arc::new(|_| OneDir) as MakeFs<OneDir>,
            sync_all,
            session: Mutex::new(None),
            pending: Arc::default(),
            next_unique: AtomicU64::new(1),
            event_idx: Arc::default(),
            counts: counts.clone(),
        });
        let backend = Backend { mem: Mutex::new(None), event_idx: bridge.event_idx.clone(), bridge: bridge.clone() };
        backend.update_memory(atomic).unwrap();
        backend.process(&vring).unwrap();

        // Every chain comes back (woken by the used-queue signal).
        let used_idx = || mem.read_obj::<u16>(q.used_addr().unchecked_add(2)).unwrap();
        while (used_idx() as usize) < reqs.len() {
            let mut fds = [rustix::event::PollFd::new(&call, rustix::event::PollFlags::IN)];
            let t = rustix::event::Timespec { tv_sec: 10, tv_nsec: 0 };
            let n = rustix::event::poll(&mut fds, Some(&t)).unwrap();
            assert!(n > 0, "only {} of {} chains came back", used_idx(), reqs.len());
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&call, &mut b);
        }
        assert_eq!(used_idx() as usize, reqs.len(), "a chain came back twice");
        let mut by_head = HashMap::new();
        for k in 0..reqs.len() as u64 {
            let e = q.used_addr().unchecked_add(4 + 8 * k);
            let id = mem.read_obj::<u32>(e).unwrap();
            let len = mem.read_obj::<u32>(e.unchecked_add(4)).unwrap();
            assert!(by_head.insert(id as u16, len).is_none(), "chain {id} came back twice");
        }
        bridge.end_session();
        let replies = heads
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let len = by_head[h];
                let mut out = vec![0u8; len as usize];
                mem.read_slice(&mut out, GuestAddress(OUT_BASE + i as u64 * SLOT)).unwrap();
                (len, out)
            })
            .collect();
        (replies, counts.snapshot())
    }

    /// (error, unique) of a reply.
    fn status(reply: &[u8]) -> (i32, u64) {
        assert!(reply.len() >= OUT_HEADER, "no reply header: {reply:?}");
        assert_eq!(u32::from_ne_bytes(reply[0..4].try_into().unwrap()) as usize, reply.len());
        (i32::from_ne_bytes(reply[4..8].try_into().unwrap()), u64::from_ne_bytes(reply[8..16].try_into().unwrap()))
    }

    #[test]
    fn malformed_chains_get_an_errno_and_the_session_keeps_serving() {
        let mut wrong_len = getattr(5, 1);
        wrong_len[0..4].copy_from_slice(&80u32.to_ne_bytes());
        let mut huge = header(IN_HEADER, 3, 6, 1);
        huge[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        let (replies, counts) = serve(
            &[
                // 0: before any FUSE_INIT: nothing to serve yet.
                req(getattr(1, 1), 4096),
                // 1: the guest's mount.
                req(init(2), 4096),
                // 2: shorter than a request header.
                req(vec![0u8; 20], 4096),
                // 3: a header whose length disagrees with the chain.
                req(wrong_len, 4096),
                // 4: a readable buffer outside guest memory.
                Req { bytes: getattr(7, 1), in_addr: Some(0xffff_0000_0000), out_len: 4096 },
                // 5: an opcode no FUSE version has.
                req(header(IN_HEADER, 7777, 8, 1), 4096),
                // 6: no room for any reply.
                req(getattr(9, 1), 0),
                // 7: room for a header but not the whole reply.
                req(getattr(10, 1), 20),
                // 8, 9: the same unique twice; each gets its own reply.
                req(getattr(42, 1), 4096),
                req(getattr(42, 2), 4096),
                // 10: a length field claiming 4 GiB.
                req(huge, 4096),
                // 11: a read of 4 GiB into a page: a short read.
                req(read(12, u32::MAX), 4096),
                // 12: an INTERRUPT: returned at once, not forwarded.
                req(header(IN_HEADER + 8, FUSE_INTERRUPT, 13, 0).into_iter().chain([0u8; 8]).collect(), 4096),
                // 13: the first opcode past the counts' table.
                req(header(IN_HEADER, 64, 14, 1), 4096),
                // 14: a READ too short for its arguments (fuser refuses it).
                req(header(IN_HEADER + 16, FUSE_READ, 15, 1).into_iter().chain([0xffu8; 16]).collect(), 4096),
                // 15: a request as long as a READ's size field: untouched.
                req(lookup(16, LONG_NAME), 4096),
                // 16: still serving.
                req(getattr(11, 1), 4096),
            ],
            None,
        );
        assert_eq!(status(&replies[0].1), (-libc::EIO, 1));
        let (err, unique) = status(&replies[1].1);
        assert_eq!((err, unique), (0, 2), "FUSE_INIT");
        assert_eq!(status(&replies[2].1).0, -libc::EINVAL);
        assert_eq!(status(&replies[3].1), (-libc::EINVAL, 0), "the guest's unique is not trusted from a bad chain");
        assert_eq!(status(&replies[4].1).0, -libc::EFAULT);
        assert_eq!(status(&replies[5].1), (-libc::ENOSYS, 8));
        assert_eq!(replies[6].0, 0, "a chain with no writable buffer comes back empty");
        assert_eq!(status(&replies[7].1), (-libc::ERANGE, 10), "a reply that does not fit is refused, not cut");
        assert_eq!(status(&replies[8].1), (0, 42));
        assert_eq!(replies[8].0 as usize, OUT_HEADER + 104, "the root's attributes");
        assert_eq!(status(&replies[9].1), (-libc::ENOENT, 42));
        assert_eq!(status(&replies[10].1).0, -libc::EINVAL);
        assert_eq!(status(&replies[11].1), (0, 12));
        assert_eq!(replies[11].1.len(), 4096, "the read was cut to the chain's room");
        assert!(replies[11].1[OUT_HEADER..].iter().all(|b| *b == 7));
        assert_eq!(replies[12].0, 0, "an INTERRUPT gets no reply");
        assert_eq!(status(&replies[13].1), (-libc::ENOSYS, 14));
        assert_eq!(status(&replies[14].1).1, 15);
        assert_ne!(status(&replies[14].1).0, 0);
        assert_eq!(status(&replies[15].1), (-libc::EEXIST, 16), "a lookup's name is not a READ's size");
        assert_eq!(status(&replies[16].1), (0, 11));
        assert_eq!((counts.requests, counts.refused), (17, 4), "{counts:?}");
        assert_eq!(counts.by_op["getattr"], 6, "{counts:?}");
        assert_eq!(counts.by_op["unknown"], 2, "{counts:?}");
    }

    #[test]
    fn forgets_come_back_at_once_a_sync_reaches_the_saver_and_a_destroy_ends_the_session() {
        let mut forget = header(IN_HEADER + 8, FUSE_FORGET, 3, 1);
        forget.extend_from_slice(&1u64.to_ne_bytes());
        let mut syncfs = header(IN_HEADER + 8, FUSE_SYNCFS, 5, 1);
        syncfs.resize(IN_HEADER + 8, 0);
        let mut failing = syncfs.clone();
        failing[8..16].copy_from_slice(&6u64.to_ne_bytes());
        let synced = Arc::new(AtomicU64::new(0));
        let s2 = synced.clone();
        let sync_all: SyncAll = Arc::new(move || match s2.fetch_add(1, Ordering::SeqCst) {
            0 => Ok(()),
            _ => Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
        });
        let (replies, _) = serve(
            &[
                req(init(1), 4096),
                req(getattr(2, 1), 4096),
                Req { bytes: forget, in_addr: None, out_len: 0 },
                req(syncfs, 4096),
                req(failing, 4096),
                req(header(IN_HEADER, FUSE_DESTROY, 4, 0), 4096),
            ],
            Some(sync_all),
        );
        assert_eq!(status(&replies[1].1).0, 0);
        assert_eq!(replies[2].0, 0);
        // The two syncs ran (in either order); one failed, with its errno.
        assert_eq!(synced.load(Ordering::SeqCst), 2);
        let mut errs = [status(&replies[3].1).0, status(&replies[4].1).0];
        errs.sort();
        assert_eq!(errs, [-libc::ENOSPC, 0]);
        assert_eq!(status(&replies[5].1), (0, 4));
    }

    #[test]
    fn a_destroy_answered_before_a_slower_request_still_returns_every_chain() {
        // The session's threads answer the DESTROY first; the GETATTR of
        // the slow inode comes after the session ended. Its chain must
        // still come back (empty), or the guest waits on it for ever.
        let (replies, _) = serve(
            &[req(init(1), 4096), req(getattr(2, SLOW_INO), 4096), req(header(IN_HEADER, FUSE_DESTROY, 3, 0), 4096)],
            None,
        );
        assert_eq!(status(&replies[2].1), (0, 3));
        assert!(replies[1].0 == 0 || status(&replies[1].1) == (-libc::EIO, 2), "{:?}", replies[1]);
    }
}
