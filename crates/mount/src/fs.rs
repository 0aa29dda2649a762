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
    /// Open directories' listing positions, by handle.
    dirs: Arc<Mutex<HashMap<u64, DirCursor>>>,
    /// With [`MadoFs::with_no_open`]: files opened on their first READ,
    /// by inode, the most recent few kept.
    lazy: Option<Arc<Mutex<LazyOpens>>>,
    want_passthrough: bool,
    passthrough: Arc<AtomicBool>,
    /// OPEN requests received (for stats).
    opens: Arc<AtomicU64>,
    uid: u32,
    gid: u32,
    ttl: Duration,
    /// For a workspace: makes every change so far durable (fsync).
    durable: Option<DurableSave>,
    /// The largest read or write the kernel may send (a transport's
    /// limit; /dev/fuse has none below fuser's own).
    max_io: Option<u32>,
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
        Error::NotFound(_) => Errno::ENOENT,
        Error::User(_) => Errno::EINVAL,
        e => {
            // The caller only sees EIO: the daemon's log says why.
            eprintln!("mado mount: EIO: {e}");
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
            dirs: Arc::default(),
            lazy: None,
            want_passthrough,
            passthrough: Arc::new(AtomicBool::new(false)),
            opens: Arc::default(),
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
        self.rt.spawn(async move {
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
        self.rt.spawn(async move {
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

    /// How many OPEN requests the kernel sent.
    pub fn opens_counter(&self) -> Arc<AtomicU64> {
        self.opens.clone()
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
        self.rt.spawn(async move {
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
        self.rt.spawn(async move {
            match fut.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
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
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                (-s, 0)
            } else {
                (-s - 1, 1_000_000_000 - n)
            }
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
        let at = |(s, n): (i64, u32)| UNIX_EPOCH + Duration::new(s.max(0) as u64, n);
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
            },
            perm: a.perm,
            nlink: a.nlink,
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
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

/// Where an open directory's listing stands. The offsets given to the
/// kernel are cookies naming the entry they follow, not indexes: a name
/// removed or added before the position never shifts it, so a listing
/// that unlinks as it reads (`rm -rf`, Rust's `remove_dir_all`) sees every
/// entry that stays exactly once (POSIX), and an offset past the end ends
/// the listing. 1 and 2 follow `.` and `..`; a child's are numbered from 3.
#[derive(Default)]
struct DirCursor {
    names: HashMap<u64, Vec<u8>>,
    next: u64,
}

/// Where a READDIR(PLUS) at `offset` starts.
#[derive(Clone)]
enum Resume {
    /// At entry `0` (`.`), `1` (`..`) or `2` (the first child).
    At(usize),
    /// At the first child named after this.
    After(Vec<u8>),
    /// Past the end (an offset this handle never gave).
    End,
}

impl Resume {
    fn of(dirs: &Mutex<HashMap<u64, DirCursor>>, fh: u64, offset: u64) -> Resume {
        match offset {
            0..=2 => Resume::At(offset as usize),
            n => {
                let mut dirs = dirs.lock().expect("dirs lock");
                match dirs.get_mut(&fh) {
                    Some(c) => {
                        // The kernel never goes back but to 0.
                        c.names.retain(|k, _| *k >= n);
                        c.names.get(&n).map_or(Resume::End, |name| Resume::After(name.clone()))
                    }
                    None => Resume::End,
                }
            }
        }
    }

    /// The name whose followers READDIRPLUS counts (`None`: all children).
    fn counted_after(&self) -> Option<&[u8]> {
        match self {
            Resume::After(n) => Some(n),
            _ => None,
        }
    }

    /// The index in `entries` (`.`, `..`, then the children by name).
    fn start(&self, entries: &[(Vec<u8>, FileAttr)]) -> usize {
        let first_child = entries.iter().take_while(|(n, _)| n == b"." || n == b"..").count();
        match self {
            Resume::At(0) => 0,
            Resume::At(1) => first_child.min(1),
            Resume::At(_) => first_child,
            Resume::After(after) => {
                first_child + entries[first_child..].partition_point(|(n, _)| n.as_slice() <= after.as_slice())
            }
            Resume::End => entries.len(),
        }
    }
}

/// The offset to give for `entries[i]`, recorded in the handle's cursor.
fn cookie(dirs: &Mutex<HashMap<u64, DirCursor>>, fh: u64, name: &[u8]) -> u64 {
    match name {
        b"." => 1,
        b".." => 2,
        _ => {
            let mut dirs = dirs.lock().expect("dirs lock");
            let c = dirs.entry(fh).or_insert_with(|| DirCursor { names: HashMap::new(), next: 3 });
            let k = c.next.max(3);
            c.next = k + 1;
            c.names.insert(k, name.to_vec());
            k
        }
    }
}

/// Each entry the kernel takes from a READDIRPLUS reply (all but `.` and
/// `..`) is a reference it will FORGET, like a lookup's.
fn fill_plus(
    core: &SnapshotFs,
    dirs: &Mutex<HashMap<u64, DirCursor>>,
    fh: u64,
    mut reply: ReplyDirectoryPlus,
    entries: Vec<(Vec<u8>, FileAttr)>,
    from: &Resume,
    ttl: Duration,
) {
    // The children after the position were counted when listed: those
    // past the end of the buffer are given back.
    let start = from.start(&entries);
    let mut sent = entries.len();
    for (i, (name, attr)) in entries.iter().enumerate().skip(start) {
        if reply.add(attr.ino, cookie(dirs, fh, name), OsStr::from_bytes(name), &ttl, attr, Generation(0)) {
            sent = i;
            break;
        }
    }
    reply.ok();
    let back: Vec<u64> = entries[sent.max(start)..]
        .iter()
        .filter(|(name, _)| name != b"." && name != b"..")
        .map(|(_, a)| a.ino.0)
        .collect();
    core.uncount(&back);
}

fn fill(
    dirs: &Mutex<HashMap<u64, DirCursor>>,
    fh: u64,
    mut reply: ReplyDirectory,
    entries: Vec<(Vec<u8>, FileAttr)>,
    from: &Resume,
) {
    let start = from.start(&entries);
    for (name, attr) in entries.iter().skip(start) {
        if reply.add(attr.ino, cookie(dirs, fh, name), attr.kind, OsStr::from_bytes(name)) {
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
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if let Some(r) = self.core.lookup_now_counted(parent.0, name.as_bytes()) {
            return match r {
                Ok(a) => reply.entry(&self.ttl, &self.owner().attr(&a), Generation(0)),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let core = self.core.clone();
        let name = name.as_bytes().to_vec();
        // Counted by the core: entry_later must not count it again.
        let (owner, ttl) = (self.owner(), self.ttl);
        self.rt.spawn(async move {
            match core.lookup_counted(parent.0, &name).await {
                Ok(a) => reply.entry(&ttl, &owner.attr(&a), Generation(0)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
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
        self.rt.spawn(async move {
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
            self.rt.spawn(async move {
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
        self.rt.spawn(async move {
            let f = match core.open(ino.0).await {
                Ok(f) => f,
                Err(e) => return reply.error(errno(&e)),
            };
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
            if passthrough {
                if let OpenFile::Whole { cache_path: Some(p), .. } = &f {
                    // The cache entry was verified as it was read in.
                    if let Ok(file) = std::fs::File::open(p) {
                        if let Ok(id) = reply.open_backing(&file) {
                            // No FOPEN_KEEP_CACHE here: with it, the kernel
                            // fails every read of a passthrough file (EIO).
                            reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                            modes.insert(ino.0, (IoMode::Passthrough(id), 1));
                            return;
                        }
                    }
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
        self.rt.spawn(async move {
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
        self.handles.lock().expect("handles lock").remove(&fh.0);
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

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.dirs.lock().expect("dirs lock").insert(fh, DirCursor { names: HashMap::new(), next: 3 });
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR);
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().expect("dirs lock").remove(&fh.0);
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let from = Resume::of(&self.dirs, fh.0, offset);
        if let Some(r) = self.core.readdir_now(ino.0) {
            return match r {
                Ok(list) => fill(&self.dirs, fh.0, reply, self.owner().dir_entries(&self.core, ino.0, list), &from),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let (core, owner, dirs) = (self.core.clone(), self.owner(), self.dirs.clone());
        self.rt.spawn(async move {
            match core.readdir(ino.0).await {
                Ok(list) => fill(&dirs, fh.0, reply, owner.dir_entries(&core, ino.0, list), &from),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        let from = Resume::of(&self.dirs, fh.0, offset);
        if matches!(from, Resume::End) {
            return reply.ok();
        }
        if let Some(r) = self.core.readdir_now_counted(ino.0, from.counted_after()) {
            return match r {
                Ok(list) => {
                    let entries = self.owner().dir_entries(&self.core, ino.0, list);
                    fill_plus(&self.core, &self.dirs, fh.0, reply, entries, &from, self.ttl)
                }
                Err(e) => reply.error(errno(&e)),
            };
        }
        let (core, owner, ttl, dirs) = (self.core.clone(), self.owner(), self.ttl, self.dirs.clone());
        self.rt.spawn(async move {
            match core.readdir_counted(ino.0, from.counted_after()).await {
                Ok(list) => {
                    let entries = owner.dir_entries(&core, ino.0, list);
                    fill_plus(&core, &dirs, fh.0, reply, entries, &from, ttl)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
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
        self.rt.spawn(async move {
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
        self.rt.spawn(async move {
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
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        writable_or_erofs!(self, reply);
        // FIFOs and sockets live in the upper layer while mounted (dev
        // servers, language servers and test suites make them); they are
        // not source, so no checkpoint keeps them. Devices: the mount is
        // nodev. Regular files come through create.
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => NodeKind::Fifo,
            libc::S_IFSOCK => NodeKind::Socket,
            _ => return reply.error(Errno::EPERM),
        };
        let (core, name, who) = (self.core.clone(), name.as_bytes().to_vec(), self.creator(_req));
        let perm = (mode & !umask & 0o7777) as u16;
        self.entry_later(reply, async move {
            let a = core.mknod(parent.0, &name, kind, perm).await?;
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
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let (core, name, newname) = (self.core.clone(), name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        self.empty_later(reply, async move { core.rename(parent.0, &name, newparent.0, &newname, no_replace).await });
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        writable_or_erofs!(self, reply);
        // Both names show one node while mounted; a checkpoint records each
        // path as a file (trees have no hard links, as in git).
        let (core, name) = (self.core.clone(), newname.as_bytes().to_vec());
        self.entry_later(reply, async move { core.link(ino.0, newparent.0, &name).await });
    }
}
