//! The fuser adapter: translates kernel requests into calls on
//! [`SnapshotFs`] and its results into replies; errors become errnos here
//! and nowhere else. The same adapter serves read-only snapshots and
//! read-write workspaces (create, write, truncate, rename, unlink, mkdir,
//! rmdir, symlink, chmod and utimes go to the core's upper layer).
//!
//! Requests that can be answered from memory (lookup, getattr, readdir of a
//! loaded tree) are answered on the FUSE thread. Anything that may wait on
//! the network is moved, with its reply, to a tokio task, so a slow fetch
//! never blocks other requests; the task is woken when its fetch completes.
//! Content is immutable, so entries and attributes get long timeouts and
//! open files keep the page cache; on a read-only mount a file whose blob
//! is in the disk cache is opened in passthrough mode when the kernel
//! allows it, so reads go straight to the cache file. A workspace (and any
//! virtio-fs session) runs in no-open mode instead: no OPEN or RELEASE,
//! reads and writes by inode ([`MadoFs::with_no_open`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use mado_core::vfs::{Attr, NodeKind, OpenFile, SetAttr, SnapshotFs, ROOT_INO};
use mado_core::Error;

/// Kernel cache timeout for entries and attributes of a snapshot: content
/// never changes.
const TTL: Duration = Duration::from_secs(24 * 3600);
/// The same for a workspace. Every change comes through this mount, so
/// the kernel knows of it: it drops a file's cached attributes after each
/// write, link, unlink and rename it sends, and a directory's after each
/// entry it adds or removes; a setattr answers with the new ones. A
/// minute (at one second, every `grep -r` more than a second after the
/// last looked every name and attribute up again).
const RW_TTL: Duration = Duration::from_secs(60);

pub struct MadoFs {
    core: Arc<SnapshotFs>,
    rt: tokio::runtime::Handle,
    handles: Arc<Mutex<HashMap<u64, Arc<OpenFile>>>>,
    /// How each open inode is served. The kernel refuses (EIO) an inode
    /// open in passthrough and caching mode at once, and wants one backing
    /// file per inode, so every handle of an inode follows its first one.
    io_modes: Arc<Mutex<HashMap<u64, (IoMode, u32)>>>,
    next_fh: Arc<AtomicU64>,
    /// The offsets of directory listings.
    cookies: Cookies,
    /// With [`MadoFs::with_no_open`]: files opened on their first READ,
    /// by inode, the most recent few kept.
    lazy: Option<Arc<Mutex<LazyOpens>>>,
    want_passthrough: bool,
    passthrough: Arc<AtomicBool>,
    /// OPEN and LOOKUP requests received (for stats).
    opens: Arc<AtomicU64>,
    lookups: Arc<AtomicU64>,
    uid: u32,
    gid: u32,
    ttl: Duration,
    /// For a workspace: makes every change so far durable (fsync).
    durable: Option<DurableSave>,
    /// The largest read or write the kernel may send (a transport's
    /// limit; /dev/fuse has none below fuser's own).
    max_io: Option<u32>,
}

/// Requests of a few kinds a mount was sent (for `mado stats`).
#[derive(Clone)]
pub struct RequestCounters {
    pub opens: Arc<AtomicU64>,
    pub lookups: Arc<AtomicU64>,
}

/// Saves a workspace's state durably; called by fsync and fsyncdir.
pub type DurableSave = Arc<dyn Fn() -> mado_core::Result<()> + Send + Sync>;

/// The open-file tables, for tasks that outlive a request.
struct OpenFiles {
    handles: Arc<Mutex<HashMap<u64, Arc<OpenFile>>>>,
    io_modes: Arc<Mutex<HashMap<u64, (IoMode, u32)>>>,
}

impl OpenFiles {
    /// Keeps `f` as handle `fh` of inode `ino`, served through this
    /// process (counted, so `release` balances).
    fn keep(&self, fh: u64, ino: u64, f: OpenFile) {
        self.io_modes.lock().expect("io modes lock").entry(ino).or_insert((IoMode::Cached, 0)).1 += 1;
        self.handles.lock().expect("handles lock").insert(fh, Arc::new(f));
    }
}

/// Files opened by a READ in no-open mode, newest last; each one's open is
/// released (`SnapshotFs::release`) when it falls out.
#[derive(Default)]
struct LazyOpens {
    recent: std::collections::VecDeque<(u64, Arc<OpenFile>)>,
}

impl LazyOpens {
    /// Enough for a few readers' current files, not the tree's contents.
    const KEEP: usize = 64;

    fn get(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.recent.iter().rev().find(|(i, _)| *i == ino).map(|(_, f)| f.clone())
    }

    /// The inode's file if it is open for writing.
    fn writable(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.get(ino).filter(|f| is_writable(f))
    }

    /// Keeps `f` (or, if another request opened the inode meanwhile and
    /// that file serves as well, that one, releasing `f`'s open); returns
    /// the file to use. A file open for writing replaces one open for
    /// reading only.
    fn keep(&mut self, core: &SnapshotFs, ino: u64, f: Arc<OpenFile>) -> Arc<OpenFile> {
        if let Some(at) = self.recent.iter().rposition(|(i, _)| *i == ino) {
            if is_writable(&self.recent[at].1) || !is_writable(&f) {
                core.release(ino);
                return self.recent[at].1.clone();
            }
            self.recent.remove(at);
            core.release(ino);
        }
        self.recent.push_back((ino, f.clone()));
        while self.recent.len() > Self::KEEP {
            if let Some((old, _)) = self.recent.pop_front() {
                core.release(old);
            }
        }
        f
    }

    /// The kernel forgot `ino` (FORGET: it evicted the inode, so no
    /// process has it open): its kept files are released. An unlinked
    /// file's upper file then goes (it stayed until 64 other files had
    /// been opened since, or for ever: a deleted 100 MB file kept its
    /// space).
    fn forget(&mut self, core: &SnapshotFs, ino: u64) {
        self.recent.retain(|(i, _)| {
            if *i == ino {
                core.release(ino);
            }
            *i != ino
        });
    }
}

fn is_writable(f: &OpenFile) -> bool {
    matches!(f, OpenFile::Upper { writable: true, .. })
}

/// How an open inode's reads are served.
enum IoMode {
    /// Straight from the cache file, by the kernel.
    Passthrough(BackingId),
    /// Through this process (and the page cache).
    Cached,
}

/// The one place errors become errnos.
fn errno(e: &Error) -> Errno {
    match e {
        Error::Fs { errno, .. } => Errno::from_i32(*errno),
        // A full disk or quota under the upper folder is the writer's to
        // see as such (it was EIO: "Input/output error" for a full disk).
        Error::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)) =>
        {
            tracing::warn!("{e}");
            Errno::from_i32(source.raw_os_error().expect("matched"))
        }
        Error::NotFound(_) => Errno::ENOENT,
        Error::User(_) => Errno::EINVAL,
        e => {
            // The caller only sees EIO: the daemon's log says why.
            tracing::warn!("EIO: {e}");
            Errno::EIO
        }
    }
}

impl MadoFs {
    pub fn new(core: Arc<SnapshotFs>, rt: tokio::runtime::Handle, want_passthrough: bool) -> MadoFs {
        MadoFs {
            core: core.clone(),
            rt,
            handles: Default::default(),
            io_modes: Default::default(),
            next_fh: Arc::new(AtomicU64::new(1)),
            cookies: Cookies::default(),
            lazy: None,
            want_passthrough,
            passthrough: Arc::new(AtomicBool::new(false)),
            opens: Arc::default(),
            lookups: Arc::default(),
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            ttl: if core.is_writable() { RW_TTL } else { TTL },
            durable: None,
            max_io: None,
        }
    }

    /// Reads and writes of at most `n` bytes (the virtio-fs transport
    /// carries each request and reply whole in a socket buffer).
    /// No OPEN or RELEASE from the kernel: the first open is answered
    /// ENOSYS, after which the kernel sends neither (FUSE's no-open mode)
    /// and keeps every file's page cache across opens. Reads and writes
    /// come by inode; each file is opened here on its first READ (or
    /// copied up and opened for writing on its first WRITE) and the most
    /// recent few are kept. A warm read costs no request at all, a cold
    /// small file one instead of three (open, read, release). Where
    /// passthrough is not wanted (it needs an open): workspaces, whose
    /// later opens for writing could not join a passthrough inode, and
    /// the virtio-fs transport.
    pub fn with_no_open(mut self) -> MadoFs {
        self.core.untrack_opens();
        self.lazy = Some(Arc::default());
        self
    }

    pub fn with_max_io(mut self, n: u32) -> MadoFs {
        self.max_io = Some(n);
        self
    }

    /// fsync and fsyncdir return only once `save` has made the overlay
    /// state that reaches the synced file durable.
    pub fn with_durable_save(mut self, save: DurableSave) -> MadoFs {
        self.durable = Some(save);
        self
    }

    /// A READ in no-open mode: the inode's file from the recent ones, or
    /// opened now.
    fn read_lazily(&self, lazy: Arc<Mutex<LazyOpens>>, ino: u64, offset: u64, size: u32, reply: ReplyData) {
        let core = self.core.clone();
        self.drive(async move {
            let hit = lazy.lock().expect("lazy lock").get(ino);
            let f = match hit {
                Some(f) => f,
                None => match core.open(ino).await {
                    Ok(f) => lazy.lock().expect("lazy lock").keep(&core, ino, Arc::new(f)),
                    Err(e) => return reply.error(errno(&e)),
                },
            };
            match core.read(&f, offset, size).await {
                Ok(b) => reply.data(&b),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// A WRITE in no-open mode: to the inode's file open for writing, or
    /// copied up and opened now.
    fn write_lazily(&self, lazy: Arc<Mutex<LazyOpens>>, ino: u64, offset: u64, data: &[u8], reply: ReplyWrite) {
        let hit = lazy.lock().expect("lazy lock").writable(ino);
        if let Some(f) = hit {
            return match self.core.write(&f, offset, data) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let (core, data) = (self.core.clone(), data.to_vec());
        self.drive(async move {
            let f = match core.open_for_write(ino).await {
                Ok(f) => lazy.lock().expect("lazy lock").keep(&core, ino, Arc::new(f)),
                Err(e) => return reply.error(errno(&e)),
            };
            match core.write(&f, offset, &data) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// A directory's first listing (offset 0) starts the download of the
    /// pack its first file is in, when cold ([`SnapshotFs::warm_dir`]): a
    /// walk lists before it reads, so its first read waits less than a
    /// round trip. Nothing for an unpacked store or a cached pack.
    fn warm(&self, ino: u64, offset: u64) {
        if offset == 0 {
            let _rt = self.rt.enter();
            self.core.warm_dir_waiting(ino, std::time::Duration::from_millis(5));
        }
    }

    /// Runs `task`, which answers its request itself: here on the FUSE
    /// thread when it finishes without waiting (nothing to fetch: the
    /// common case in a warm tree or a workspace's own files), else on the
    /// runtime from where it stopped, so a slow fetch never holds this
    /// thread. A request answered here costs no hand-off between threads
    /// (two context switches and a wake-up, most of a small request's time
    /// on two cores).
    fn drive(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut task = Box::pin(task);
        let _in_runtime = self.rt.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if task.as_mut().poll(&mut cx).is_pending() {
            // Polled again there, with a waker that counts.
            self.rt.spawn(task);
        }
    }

    /// Answers an fsync: the upper file's bytes, then the state naming it.
    fn sync_later(&self, sync_file: impl FnOnce() -> mado_core::Result<()> + Send + 'static, reply: ReplyEmpty) {
        let durable = self.durable.clone();
        self.rt.spawn_blocking(move || {
            if let Err(e) = sync_file() {
                return reply.error(errno(&e));
            }
            if let Some(save) = durable {
                if let Err(e) = save() {
                    return reply.error(errno(&e));
                }
            }
            reply.ok();
        });
    }

    /// Whether the kernel accepted passthrough (known after init).
    pub fn passthrough_flag(&self) -> Arc<AtomicBool> {
        self.passthrough.clone()
    }

    /// How many OPEN and LOOKUP requests the kernel sent.
    pub fn request_counters(&self) -> RequestCounters {
        RequestCounters { opens: self.opens.clone(), lookups: self.lookups.clone() }
    }

    fn open_files(&self) -> OpenFiles {
        OpenFiles { handles: self.handles.clone(), io_modes: self.io_modes.clone() }
    }

    fn owner(&self) -> Owner {
        Owner { uid: self.uid, gid: self.gid }
    }

    /// Answers `reply` with the entry `fut` yields, from a tokio task.
    /// Who a node made for `req` in `parent` belongs to, when not the
    /// mount's owner: the caller's uid, and the caller's gid or, under a
    /// set-group-ID directory, the directory's (as a local filesystem).
    fn creator(&self, req: &Request) -> Creator {
        Creator { uid: req.uid(), gid: req.gid(), mount: (self.uid, self.gid) }
    }

    fn entry_later(
        &self,
        reply: ReplyEntry,
        fut: impl std::future::Future<Output = mado_core::Result<Attr>> + Send + 'static,
    ) {
        let (owner, ttl, core) = (self.owner(), self.ttl, self.core.clone());
        self.drive(async move {
            match fut.await {
                Ok(a) => {
                    core.note_lookup(a.ino, 1);
                    reply.entry(&ttl, &owner.attr(&a), Generation(0))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// Answers `reply` with success or the error `fut` yields.
    fn empty_later(
        &self,
        reply: ReplyEmpty,
        fut: impl std::future::Future<Output = mado_core::Result<()>> + Send + 'static,
    ) {
        self.drive(async move {
            match fut.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

/// A time as seconds and nanoseconds, as the kernel gives and takes it
/// (a time before 1970 has negative seconds and nanoseconds counted
/// forward: 1969-12-31 23:59:59.5 is (-1, 500000000)).
fn system_time((s, n): (i64, u32)) -> std::time::SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, n)
    } else {
        UNIX_EPOCH - Duration::new(s.unsigned_abs(), 0) + Duration::from_nanos(n as u64)
    }
}

fn time_of(t: TimeOrNow) -> (i64, u32) {
    let t = match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => std::time::SystemTime::now(),
    };
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            // fuser 0.18 (time.rs, `system_time_from_time`) makes the
            // kernel's (-s, n) into the epoch minus (s, n), where n counts
            // forward from -s: so the kernel's pair is read straight back
            // from that distance. (Counted as a true time, a touch to
            // 1960-01-01 00:00:00.5 was stored one second early.)
            let d = e.duration();
            (-(d.as_secs() as i64), d.subsec_nanos())
        }
    }
}

/// The caller that makes a node, and the mount's owner.
#[derive(Clone, Copy)]
struct Creator {
    uid: u32,
    gid: u32,
    mount: (u32, u32),
}

impl Creator {
    /// Gives node `a` (just made in `parent`) its owner, when that is not
    /// the mount's; a directory made under a set-group-ID one is one too.
    async fn own(self, core: &SnapshotFs, parent: u64, a: Attr) -> mado_core::Result<Attr> {
        let p = core.getattr(parent)?;
        let setgid = p.perm & 0o2000 != 0;
        let gid = match setgid {
            true => p.owner.map_or(self.mount.1, |o| o.1),
            false => self.gid,
        };
        let mode = (setgid && a.kind == NodeKind::Dir).then_some(u32::from(a.perm) | 0o2000);
        if (self.uid, gid) == self.mount && mode.is_none() {
            return Ok(a);
        }
        let owner = ((self.uid, gid) != self.mount).then_some((self.uid, gid));
        let set = SetAttr { mode, uid: owner.map(|o| o.0), gid: owner.map(|o| o.1), ..Default::default() };
        core.setattr(a.ino, set).await
    }
}

/// Who owns a node nobody chowned: the user running the daemon.
#[derive(Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
}

impl Owner {
    fn attr(self, a: &Attr) -> FileAttr {
        let at = system_time;
        let t = at((a.mtime, a.mtime_ns));
        let (uid, gid) = a.owner.unwrap_or((self.uid, self.gid));
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: at(a.atime),
            mtime: t,
            ctime: at(a.ctime),
            crtime: t,
            kind: match a.kind {
                NodeKind::Dir => FileType::Directory,
                NodeKind::File => FileType::RegularFile,
                NodeKind::Symlink => FileType::Symlink,
                NodeKind::Fifo => FileType::NamedPipe,
                NodeKind::Socket => FileType::Socket,
                NodeKind::BlockDev => FileType::BlockDevice,
                NodeKind::CharDev => FileType::CharDevice,
            },
            perm: a.perm,
            nlink: a.nlink,
            uid,
            gid,
            rdev: a.rdev,
            blksize: 4096,
            flags: 0,
        }
    }

    /// What a negative entry carries: inode 0, nothing else that counts.
    fn absent(self) -> FileAttr {
        let a = Attr {
            ino: 0,
            kind: NodeKind::File,
            size: 0,
            perm: 0,
            nlink: 0,
            mtime: 0,
            mtime_ns: 0,
            atime: (0, 0),
            ctime: (0, 0),
            owner: None,
            rdev: 0,
        };
        self.attr(&a)
    }

    /// `.`, `..` and the entries, with attributes.
    fn dir_entries(self, core: &SnapshotFs, ino: u64, list: mado_core::vfs::DirList) -> Vec<(Vec<u8>, FileAttr)> {
        let mut out = Vec::with_capacity(list.len() + 2);
        if let Ok(a) = core.getattr(ino) {
            out.push((b".".to_vec(), self.attr(&a)));
        }
        if let Ok(a) = core.getattr(if ino == ROOT_INO { ROOT_INO } else { core.parent_of(ino) }) {
            out.push((b"..".to_vec(), self.attr(&a)));
        }
        out.extend(list.into_iter().map(|(n, a)| (n, self.attr(&a))));
        out
    }
}

/// The offsets a listing gives the kernel, with no state per listing:
/// `.` is 1, `..` is 2, and a child's is 3 plus a keyed hash of its name
/// (62 bits; the key is this session's own, so no one can choose names
/// that collide). A directory is listed in that order and a READDIR at
/// offset `o` goes on with the entries whose cookie is above `o`. A name
/// removed or added never moves another, so a listing that unlinks as it
/// reads (`rm -rf`, Rust's `remove_dir_all`) sees every entry that stays
/// exactly once (POSIX), an offset past the end ends the listing, and the
/// kernel needs no OPENDIR or RELEASEDIR (no-opendir mode). Two names of
/// one directory with the same 62 bits could lose one of them in a listing
/// cut between the two; ext4's hashed directories take the same odds.
#[derive(Clone, Default)]
struct Cookies(std::hash::RandomState);

impl Cookies {
    /// At most this many entries are sorted for one reply (a reply holds
    /// fewer; the kernel asks again from the last one it took).
    const BATCH: usize = 1024;

    fn of(&self, name: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        match name {
            b"." => 1,
            b".." => 2,
            _ => 3 + (self.0.hash_one(name) >> 2),
        }
    }

    /// Whether the entry `name` comes after offset `offset`.
    fn after(&self, name: &[u8], offset: u64) -> bool {
        self.of(name) > offset
    }

    /// The entries (`.`, `..`, then the children) after `offset`, each with
    /// its cookie: the first [`Cookies::BATCH`] in listing order, the rest
    /// behind them in no order.
    fn after_offset(&self, entries: Vec<(Vec<u8>, FileAttr)>, offset: u64) -> Vec<(u64, Vec<u8>, FileAttr)> {
        let mut v: Vec<_> =
            entries.into_iter().map(|(n, a)| (self.of(&n), n, a)).filter(|(c, _, _)| *c > offset).collect();
        let order =
            |a: &(u64, Vec<u8>, FileAttr), b: &(u64, Vec<u8>, FileAttr)| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1));
        if v.len() > Self::BATCH {
            v.select_nth_unstable_by(Self::BATCH, order);
            v[..Self::BATCH].sort_unstable_by(order);
        } else {
            v.sort_unstable_by(order);
        }
        v
    }
}

/// Each entry the kernel takes from a READDIRPLUS reply (all but `.` and
/// `..`) is a reference it will FORGET, like a lookup's; the entries after
/// the offset were counted when listed, and those not sent are given back.
fn fill_plus(core: &SnapshotFs, mut reply: ReplyDirectoryPlus, entries: Vec<(u64, Vec<u8>, FileAttr)>, ttl: Duration) {
    let mut sent = entries.len().min(Cookies::BATCH);
    for (i, (cookie, name, attr)) in entries.iter().enumerate().take(Cookies::BATCH) {
        if reply.add(attr.ino, *cookie, OsStr::from_bytes(name), &ttl, attr, Generation(0)) {
            sent = i;
            break;
        }
    }
    reply.ok();
    let back: Vec<u64> =
        entries[sent..].iter().filter(|(_, name, _)| name != b"." && name != b"..").map(|(_, _, a)| a.ino.0).collect();
    core.uncount(&back);
}

fn fill(mut reply: ReplyDirectory, entries: Vec<(u64, Vec<u8>, FileAttr)>) {
    for (cookie, name, attr) in entries.iter().take(Cookies::BATCH) {
        if reply.add(attr.ino, *cookie, attr.kind, OsStr::from_bytes(name)) {
            break;
        }
    }
    reply.ok();
}

/// A read-only mount answers every change itself, before the core is
/// asked (the core refuses too: this keeps the errno in one place here).
macro_rules! writable_or_erofs {
    ($self:ident, $reply:ident) => {
        if !$self.core.is_writable() {
            return $reply.error(Errno::EROFS);
        }
    };
}

impl Filesystem for MadoFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_CACHE_SYMLINKS,
        );
        let _ = config.set_max_readahead(1 << 20);
        if let Some(n) = self.max_io {
            let _ = config.set_max_write(n);
            let _ = config.set_max_readahead(n.min(1 << 20));
        }
        if self.want_passthrough
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough.store(true, Relaxed);
            // Large files read whole keep a whole copy to pass through.
            self.core.set_assemble(true);
        }
        Ok(())
    }

    /// A name that is not there is answered as an entry with inode 0 and
    /// the entry timeout: the kernel keeps it as a negative entry and asks
    /// again only once it expires or the kernel itself makes the name
    /// (every change comes through the kernel). `git status` looks for a
    /// `.gitignore` in every directory; build tools probe many paths.
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.lookups.fetch_add(1, Relaxed);
        let core = self.core.clone();
        let name = name.as_bytes().to_vec();
        // Counted by the core: entry_later must not count it again.
        let (owner, ttl) = (self.owner(), self.ttl);
        self.drive(async move {
            match core.lookup_counted(parent.0, &name).await {
                Ok(a) => reply.entry(&ttl, &owner.attr(&a), Generation(0)),
                Err(e) => match errno(&e) {
                    Errno::ENOENT => reply.entry(&ttl, &owner.absent(), Generation(0)),
                    n => reply.error(n),
                },
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Some(lazy) = &self.lazy {
            lazy.lock().expect("lazy lock").forget(&self.core, ino.0);
        }
        self.core.forget(ino.0, nlookup);
    }

    // BATCH_FORGET: fuser's default calls `forget` for each node.

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl, &self.owner().attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let core = self.core.clone();
        self.drive(async move {
            match core.readlink(ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.opens.fetch_add(1, Relaxed);
        let accmode = flags.0 & libc::O_ACCMODE;
        if accmode != libc::O_RDONLY && !self.core.is_writable() {
            return reply.error(Errno::EROFS);
        }
        if self.lazy.is_some() {
            return reply.error(Errno::ENOSYS);
        }
        if accmode != libc::O_RDONLY {
            let (core, open, fh) = (self.core.clone(), self.open_files(), self.next_fh.fetch_add(1, Relaxed));
            let trunc = flags.0 & libc::O_TRUNC != 0;
            self.drive(async move {
                let r = async {
                    if trunc {
                        core.setattr(ino.0, SetAttr { size: Some(0), ..Default::default() }).await?;
                    }
                    core.open_for_write(ino.0).await
                };
                match r.await {
                    Ok(f) => {
                        open.keep(fh, ino.0, f);
                        reply.opened(FileHandle(fh), FopenFlags::empty());
                    }
                    Err(e) => reply.error(errno(&e)),
                }
            });
            return;
        }
        let core = self.core.clone();
        let handles = self.handles.clone();
        let io_modes = self.io_modes.clone();
        let fh = self.next_fh.fetch_add(1, Relaxed);
        // Not on a workspace: a later open for writing could not join a
        // passthrough inode.
        let passthrough = self.passthrough.load(Relaxed) && !core.is_writable();
        self.drive(async move {
            let f = match core.open(ino.0).await {
                Ok(f) => f,
                Err(e) => return reply.error(errno(&e)),
            };
            // The cache file to pass through, once checked (`backing_file`:
            // it reads a record, or a small file whole), before the modes'
            // lock is taken. An open that meanwhile set the inode's mode
            // decides it.
            let first = passthrough && !io_modes.lock().expect("io modes lock").contains_key(&ino.0);
            let backing = first.then(|| core.backing_file(&f)).flatten();
            let mut modes = io_modes.lock().expect("io modes lock");
            if let Some((mode, n)) = modes.get_mut(&ino.0) {
                *n += 1;
                return match mode {
                    IoMode::Passthrough(id) => reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), id),
                    IoMode::Cached => {
                        handles.lock().expect("handles lock").insert(fh, Arc::new(f));
                        reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE)
                    }
                };
            }
            if let Some(file) = backing {
                if let Ok(id) = reply.open_backing(&file) {
                    // No FOPEN_KEEP_CACHE here: with it, the kernel
                    // fails every read of a passthrough file (EIO).
                    reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                    modes.insert(ino.0, (IoMode::Passthrough(id), 1));
                    return;
                }
            }
            modes.insert(ino.0, (IoMode::Cached, 1));
            handles.lock().expect("handles lock").insert(fh, Arc::new(f));
            reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(f) = self.handles.lock().expect("handles lock").get(&fh.0).cloned() else {
            return match (&self.lazy, fh.0) {
                (Some(lazy), 0) => self.read_lazily(lazy.clone(), ino.0, offset, size, reply),
                _ => reply.error(Errno::EBADF),
            };
        };
        if let OpenFile::Whole { data, ino: None, .. } = &*f {
            let start = (offset as usize).min(data.len());
            let end = (start + size as usize).min(data.len());
            return reply.data(&data[start..end]);
        }
        if let OpenFile::Upper { .. } | OpenFile::Whole { .. } = &*f {
            // Local bytes: no reason to leave this thread.
            return match self.rt.block_on(self.core.read(&f, offset, size)) {
                Ok(b) => reply.data(&b),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let core = self.core.clone();
        self.drive(async move {
            match core.read(&f, offset, size).await {
                Ok(b) => reply.data(&b),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.lazy.is_some() && fh.0 == 0 {
            // A created file's, before the first OPEN turned RELEASE off:
            // its open is the recent table's, released as it falls out.
            return reply.ok();
        }
        let closed = self.handles.lock().expect("handles lock").remove(&fh.0);
        if let Some(f) = closed.filter(|f| matches!(**f, OpenFile::Chunked { .. })) {
            // A large file's whole copy, if this handle was building one.
            let core = self.core.clone();
            self.rt.spawn(async move { core.close_chunked(&f).await });
        }
        {
            let mut modes = self.io_modes.lock().expect("io modes lock");
            if let Some((_, n)) = modes.get_mut(&ino.0) {
                *n -= 1;
                if *n == 0 {
                    modes.remove(&ino.0);
                }
            }
        }
        self.core.release(ino.0);
        reply.ok();
    }

    /// ENOSYS: the kernel then sends no OPENDIR or RELEASEDIR again
    /// (no-opendir mode) and caches each directory's listing across opens
    /// (as FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR would), dropping it when it
    /// changes the directory itself. Listings need no handle ([`Cookies`]).
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        self.warm(ino.0, offset);
        let (owner, cookies) = (self.owner(), self.cookies.clone());
        if let Some(r) = self.core.readdir_now(ino.0) {
            return match r {
                Ok(list) => fill(reply, cookies.after_offset(owner.dir_entries(&self.core, ino.0, list), offset)),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let core = self.core.clone();
        self.drive(async move {
            match core.readdir(ino.0).await {
                Ok(list) => {
                    if offset == 0 {
                        core.warm_dir(ino.0);
                    }
                    fill(reply, cookies.after_offset(owner.dir_entries(&core, ino.0, list), offset))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        // Before the listing: the pack's round trip then overlaps it.
        self.warm(ino.0, offset);
        let (owner, ttl, cookies) = (self.owner(), self.ttl, self.cookies.clone());
        let counted = {
            let cookies = cookies.clone();
            move |name: &[u8]| cookies.after(name, offset)
        };
        if let Some(r) = self.core.readdir_now_counted(ino.0, &counted) {
            return match r {
                Ok(list) => {
                    let entries = cookies.after_offset(owner.dir_entries(&self.core, ino.0, list), offset);
                    fill_plus(&self.core, reply, entries, ttl)
                }
                Err(e) => reply.error(errno(&e)),
            };
        }
        let core = self.core.clone();
        self.drive(async move {
            match core.readdir_counted(ino.0, &counted).await {
                Ok(list) => {
                    if offset == 0 {
                        core.warm_dir(ino.0);
                    }
                    let entries = cookies.after_offset(owner.dir_entries(&core, ino.0, list), offset);
                    fill_plus(&core, reply, entries, ttl)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// Sent only where the kernel does not check permissions itself (a
    /// root daemon's mount that admits no other user: see the daemon's
    /// `kernel_checks_permissions`), so the caller is root, whom nothing
    /// refuses but executing a file with no execute bit.
    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match self.core.getattr(ino.0) {
            Ok(a) if mask.contains(fuser::AccessFlags::X_OK) && a.kind != NodeKind::Dir && a.perm & 0o111 == 0 => {
                reply.error(Errno::EACCES)
            }
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        writable_or_erofs!(self, reply);
        let Some(f) = self.handles.lock().expect("handles lock").get(&fh.0).cloned() else {
            return match (&self.lazy, fh.0) {
                (Some(lazy), 0) => self.write_lazily(lazy.clone(), ino.0, offset, data, reply),
                _ => reply.error(Errno::EBADF),
            };
        };
        match self.core.write(&f, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Nothing to do on close (writes reach the upper file as they come;
    /// fsync makes them durable): ENOSYS tells the kernel so once, and it
    /// sends no FLUSH again on this mount — one request fewer per close
    /// (a quarter of a cold `cat`'s: open, read, flush, release). The
    /// kernel still writes a file's dirty pages back on close first.
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let f = self.handles.lock().expect("handles lock").get(&fh.0).cloned();
        if f.is_none() && fh.0 == 0 && self.lazy.is_some() && self.core.is_writable() {
            // No handle in no-open mode: the inode's upper file.
            let core = self.core.clone();
            return self.sync_later(move || core.sync_upper(ino.0, datasync), reply);
        }
        self.sync_later(
            move || match f.as_deref() {
                Some(OpenFile::Upper { file, .. }) => {
                    let r = if datasync { file.sync_data() } else { file.sync_all() };
                    r.map_err(mado_core::Error::io("syncing an upper file"))
                }
                _ => Ok(()),
            },
            reply,
        );
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync_later(|| Ok(()), reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        writable_or_erofs!(self, reply);
        // The kernel has checked who may change what (default_permissions).
        let a = SetAttr { size, mode, mtime: mtime.map(time_of), atime: atime.map(time_of), uid, gid };
        let (core, owner, ttl) = (self.core.clone(), self.owner(), self.ttl);
        self.drive(async move {
            match core.setattr(ino.0, a).await {
                Ok(a) => reply.attr(&ttl, &owner.attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        writable_or_erofs!(self, reply);
        if mode & libc::S_IFMT != 0 && mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let (core, owner, ttl, open) = (self.core.clone(), self.owner(), self.ttl, self.open_files());
        // In no-open mode the kernel never sends RELEASE, even for a handle
        // CREATE gave: the new file joins the recent ones, by inode, and
        // the handle is 0 (its writes come as the others' do).
        let lazy = self.lazy.clone();
        let fh = if lazy.is_some() { 0 } else { self.next_fh.fetch_add(1, Relaxed) };
        let (name, who) = (name.as_bytes().to_vec(), self.creator(_req));
        self.drive(async move {
            let made = async {
                let (a, f) = core.create(parent.0, &name, mode & !umask).await?;
                match who.own(&core, parent.0, a).await {
                    Ok(a) => Ok((a, f)),
                    Err(e) => {
                        // Not left behind half-made.
                        let _ = core.unlink(parent.0, &name).await;
                        core.release(a.ino);
                        Err(e)
                    }
                }
            };
            match made.await {
                Ok((a, f)) => {
                    match &lazy {
                        Some(lazy) => {
                            lazy.lock().expect("lazy lock").keep(&core, a.ino, Arc::new(f));
                        }
                        None => open.keep(fh, a.ino, f),
                    }
                    core.note_lookup(a.ino, 1);
                    reply.created(&ttl, &owner.attr(&a), Generation(0), FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        writable_or_erofs!(self, reply);
        // FIFOs, sockets and device nodes live in the mount's state while
        // mounted (dev servers, language servers and test suites make
        // them); they are not source, so no checkpoint keeps them. A
        // device node is never opened as a device: the mount is nodev (and
        // the kernel checks that only a privileged caller makes one).
        // Regular files come through create.
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => NodeKind::Fifo,
            libc::S_IFSOCK => NodeKind::Socket,
            libc::S_IFBLK => NodeKind::BlockDev,
            libc::S_IFCHR => NodeKind::CharDev,
            _ => return reply.error(Errno::EINVAL),
        };
        let (core, name, who) = (self.core.clone(), name.as_bytes().to_vec(), self.creator(_req));
        let perm = (mode & !umask & 0o7777) as u16;
        self.entry_later(reply, async move {
            let a = core.mknod(parent.0, &name, kind, perm, rdev).await?;
            who.own(&core, parent.0, a).await
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        writable_or_erofs!(self, reply);
        let (core, name, who) = (self.core.clone(), name.as_bytes().to_vec(), self.creator(req));
        self.entry_later(reply, async move {
            let a = core.mkdir(parent.0, &name, mode & !umask).await?;
            who.own(&core, parent.0, a).await
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        writable_or_erofs!(self, reply);
        let (core, name, who) = (self.core.clone(), link_name.as_bytes().to_vec(), self.creator(req));
        let target = target.as_os_str().as_bytes().to_vec();
        self.entry_later(reply, async move {
            let a = core.symlink(parent.0, &name, &target).await?;
            who.own(&core, parent.0, a).await
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        writable_or_erofs!(self, reply);
        let (core, name) = (self.core.clone(), name.as_bytes().to_vec());
        self.empty_later(reply, async move { core.unlink(parent.0, &name).await });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        writable_or_erofs!(self, reply);
        let (core, name) = (self.core.clone(), name.as_bytes().to_vec());
        self.empty_later(reply, async move { core.rmdir(parent.0, &name).await });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        writable_or_erofs!(self, reply);
        // Neither exchange nor whiteout is kept here: EINVAL, as a
        // filesystem without them answers.
        if flags.contains(RenameFlags::RENAME_EXCHANGE) || flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let (core, name, newname) = (self.core.clone(), name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        self.empty_later(reply, async move { core.rename(parent.0, &name, newparent.0, &newname, no_replace).await });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        writable_or_erofs!(self, reply);
        let core = self.core.clone();
        self.empty_later(reply, async move { core.fallocate(ino.0, offset, length, mode).await });
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the kernel answers the other kinds of
    /// seek itself): a sparse file's holes show through the mount, so `cp`
    /// and `tar` of it keep them.
    fn lseek(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: fuser::ReplyLseek) {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else { return reply.error(Errno::ENXIO) };
        let core = self.core.clone();
        self.drive(async move {
            match core.seek_data_or_hole(ino.0, offset, data).await {
                Ok(at) => reply.offset(at as i64),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// The space of the filesystem under the upper layer (a workspace: what
    /// writes use) or the cache (a snapshot: nothing free, it is
    /// read-only); `df` and tools that check free space before writing read
    /// it. Every figure was 0, and such tools refused to write.
    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        let dir = self.core.local_dir();
        match rustix::fs::statvfs(&dir) {
            Ok(s) => {
                let (bfree, bavail, ffree) = match self.core.is_writable() {
                    true => (s.f_bfree, s.f_bavail, s.f_ffree),
                    false => (0, 0, 0),
                };
                let frsize = s.f_frsize.max(1);
                reply.statfs(s.f_blocks, bfree, bavail, s.f_files, ffree, s.f_bsize as u32, 255, frsize as u32);
            }
            Err(e) => {
                tracing::warn!("statfs of {}: {e}", dir.display());
                reply.error(Errno::from_i32(e.raw_os_error()));
            }
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        writable_or_erofs!(self, reply);
        // Both names show one node while mounted; a checkpoint records each
        // path as a file (trees have no hard links, as in git).
        let (core, name) = (self.core.clone(), newname.as_bytes().to_vec());
        self.entry_later(reply, async move { core.link(ino.0, newparent.0, &name).await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn entry(name: &str, ino: u64) -> (Vec<u8>, FileAttr) {
        let a = Attr {
            ino,
            size: 0,
            kind: NodeKind::File,
            perm: 0o644,
            mtime: 0,
            mtime_ns: 0,
            atime: (0, 0),
            ctime: (0, 0),
            nlink: 1,
            owner: None,
            rdev: 0,
        };
        (name.as_bytes().to_vec(), Owner { uid: 0, gid: 0 }.attr(&a))
    }

    /// What a directory holds now, as `dir_entries` gives it.
    fn listing(names: &BTreeMap<String, u64>) -> Vec<(Vec<u8>, FileAttr)> {
        let mut v = vec![entry(".", 1), entry("..", 1)];
        v.extend(names.iter().map(|(n, i)| entry(n, *i)));
        v
    }

    /// A listing read a few entries per READDIR while names are removed
    /// (some already listed, some not yet) and added between the calls:
    /// every name there from start to end comes exactly once, and nothing
    /// that was never there comes at all.
    #[test]
    fn a_listing_changed_between_its_pages_loses_and_repeats_nothing() {
        let c = Cookies::default();
        let mut names: BTreeMap<String, u64> = (0..3000).map(|i| (format!("f{i:05}"), 10 + i)).collect();
        let first = names.clone();
        let (mut offset, mut seen, mut next_new) = (0u64, Vec::<String>::new(), 0);
        let mut removed = BTreeSet::new();
        loop {
            let rest = c.after_offset(listing(&names), offset);
            // What READDIRPLUS counts as taken is what the listing holds.
            let picked: BTreeSet<Vec<u8>> =
                listing(&names).into_iter().map(|e| e.0).filter(|n| c.after(n, offset)).collect();
            assert_eq!(picked, rest.iter().map(|e| e.1.clone()).collect::<BTreeSet<_>>());
            let page: Vec<_> = rest.into_iter().take(37).collect();
            if page.is_empty() {
                break;
            }
            for (cookie, name, _) in &page {
                assert!(*cookie > offset, "cookies grow along a listing");
                offset = *cookie;
                seen.push(String::from_utf8(name.clone()).unwrap());
            }
            // Remove one listed name (not the last: the next page starts
            // after it) and one not yet listed; add one.
            let listed = seen.get(seen.len().saturating_sub(5)).cloned();
            for victim in [listed, names.keys().nth(names.len() / 2).cloned()].into_iter().flatten() {
                if names.remove(&victim).is_some() {
                    removed.insert(victim);
                }
            }
            names.insert(format!("new{next_new}"), 100_000 + next_new);
            next_new += 1;
        }
        assert_eq!(&seen[..2], [".", ".."]);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &seen[2..] {
            *counts.entry(n.as_str()).or_default() += 1;
        }
        assert!(counts.values().all(|n| *n == 1), "a name came twice");
        for n in first.keys().filter(|n| !removed.contains(*n)) {
            assert!(counts.contains_key(n.as_str()), "{n} stayed but was never listed");
        }
        for n in counts.keys() {
            assert!(first.contains_key(*n) || n.starts_with("new"), "{n} was never there");
        }
        // An offset past every cookie ends the listing.
        assert!(c.after_offset(listing(&names), u64::MAX >> 1).is_empty());
    }

    /// More entries than one batch: the batch is the first ones in listing
    /// order, and the rest follow it.
    #[test]
    fn a_large_directory_sorts_only_its_first_batch() {
        let c = Cookies::default();
        let names: BTreeMap<String, u64> = (0..5000).map(|i| (format!("n{i}"), 10 + i)).collect();
        let all = c.after_offset(listing(&names), 0);
        assert_eq!(all.len(), 5002);
        let mut sorted: Vec<u64> = all.iter().map(|e| e.0).collect();
        sorted.sort_unstable();
        let batch: Vec<u64> = all[..Cookies::BATCH].iter().map(|e| e.0).collect();
        assert_eq!(batch, sorted[..Cookies::BATCH], "the batch is the smallest cookies, in order");
        assert_eq!((all[0].1.as_slice(), all[1].1.as_slice()), (&b"."[..], &b".."[..]));
        // Exactly one batch (with `.` and `..`): all of it, in order.
        let names: BTreeMap<String, u64> = (0..Cookies::BATCH as u64 - 2).map(|i| (format!("m{i}"), 10 + i)).collect();
        let one = c.after_offset(listing(&names), 0);
        assert_eq!(one.len(), Cookies::BATCH);
        assert!(one.windows(2).all(|w| w[0].0 < w[1].0));
        // Two sessions' cookies differ (each has its own key) but each is
        // the same for a name every time.
        let d = Cookies::default();
        assert_eq!(c.of(b"n1"), c.of(b"n1"));
        assert_ne!((c.of(b"n1"), c.of(b"n2")), (d.of(b"n1"), d.of(b"n2")));
        assert!(c.of(b"n1") >= 3 && c.of(b"n1") < 1 << 63);
    }
}
