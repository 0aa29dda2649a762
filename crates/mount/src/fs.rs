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
use std::time::Duration;

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use mado_core::vfs::{NodeKind, OpenFile, SetAttr, SnapshotFs};

mod later;
mod opens;
mod reply;
mod setup;

use opens::{IoMode, LazyOpens};
use reply::{errno, fill, fill_plus, time_of, Cookies};

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
    /// Requests of a few kinds received (for stats).
    requests: RequestCounters,
    uid: u32,
    gid: u32,
    ttl: Duration,
    /// For a workspace: makes every change so far durable (fsync).
    durable: Option<DurableSave>,
    /// The largest read or write the kernel may send (a transport's
    /// limit; /dev/fuse has none below fuser's own).
    max_io: Option<u32>,
    /// For a mount that may be handed over: its requests in flight, and
    /// the session's end (`crate::handover`).
    in_flight: Option<Arc<crate::handover::InFlight>>,
    ended: Option<Arc<crate::handover::Ended>>,
}

/// Requests of a few kinds a mount was sent (for `mado stats`).
#[derive(Clone, Default)]
pub struct RequestCounters {
    pub opens: Arc<AtomicU64>,
    pub lookups: Arc<AtomicU64>,
    pub ioctls: Arc<AtomicU64>,
    pub getattrs: Arc<AtomicU64>,
}

/// Saves a workspace's state durably; called by fsync and fsyncdir.
pub type DurableSave = Arc<dyn Fn() -> mado_core::Result<()> + Send + Sync>;

/// The session that served this filesystem has ended, however it ended
/// (an unmount, a handover, a request thread's panic): the last reference
/// goes with its last thread.
impl Drop for MadoFs {
    fn drop(&mut self) {
        if let Some(e) = &self.ended {
            e.set();
        }
    }
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
        let _span = tracing::debug_span!("fuse", op = "lookup", ino = parent.0).entered();
        self.requests.lookups.fetch_add(1, Relaxed);
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
        let _span = tracing::debug_span!("fuse", op = "forget", ino = ino.0).entered();
        if let Some(lazy) = &self.lazy {
            lazy.lock().expect("lazy lock").forget(&self.core, ino.0);
        }
        self.core.forget(ino.0, nlookup);
    }

    // BATCH_FORGET: fuser's default calls `forget` for each node.

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _span = tracing::debug_span!("fuse", op = "getattr", ino = ino.0).entered();
        self.requests.getattrs.fetch_add(1, Relaxed);
        match self.core.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl, &self.owner().attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _span = tracing::debug_span!("fuse", op = "readlink", ino = ino.0).entered();
        let core = self.core.clone();
        self.drive(async move {
            match core.readlink(ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _span = tracing::debug_span!("fuse", op = "open", ino = ino.0).entered();
        self.requests.opens.fetch_add(1, Relaxed);
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
        let _span = tracing::debug_span!("fuse", op = "read", ino = ino.0).entered();
        let Some(f) = self.handles.lock().expect("handles lock").get(&fh.0).cloned() else {
            return match (&self.lazy, fh.0) {
                // No handle (no-open mode), or one an earlier daemon of this
                // mount gave out (handed over): served by inode.
                (Some(lazy), _) => self.read_lazily(lazy.clone(), ino.0, offset, size, reply),
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
        let _span = tracing::debug_span!("fuse", op = "release", ino = ino.0).entered();
        if self.lazy.is_some() && fh.0 == 0 {
            // A created file's, before the first OPEN turned RELEASE off:
            // its open is the recent table's, released as it falls out.
            return reply.ok();
        }
        let closed = self.handles.lock().expect("handles lock").remove(&fh.0);
        if closed.is_none() && self.lazy.is_some() {
            // A handle an earlier daemon of this mount gave out (handed
            // over): its open was that process's.
            return reply.ok();
        }
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
        let _span = tracing::debug_span!("fuse", op = "opendir").entered();
        reply.error(Errno::ENOSYS);
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let _span = tracing::debug_span!("fuse", op = "readdir", ino = ino.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "readdirplus", ino = ino.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "access", ino = ino.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "write", ino = ino.0).entered();
        writable_or_erofs!(self, reply);
        let Some(f) = self.handles.lock().expect("handles lock").get(&fh.0).cloned() else {
            return match (&self.lazy, fh.0) {
                (Some(lazy), _) => self.write_lazily(lazy.clone(), ino.0, offset, data, reply),
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
        let _span = tracing::debug_span!("fuse", op = "flush").entered();
        reply.error(Errno::ENOSYS);
    }

    /// No ioctl is supported: ENOTTY at once, on the request's thread.
    /// The kernel asks every time (it keeps no refusal for ioctls, as it
    /// does for FLUSH), and programs ask often: Python's buffered `open()`
    /// asks isatty() (TCGETS) of every file it opens, one request each.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let _span = tracing::debug_span!("fuse", op = "ioctl", ino = ino.0, cmd).entered();
        self.requests.ioctls.fetch_add(1, Relaxed);
        reply.error(Errno::ENOTTY);
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _span = tracing::debug_span!("fuse", op = "fsync", ino = ino.0).entered();
        let f = self.handles.lock().expect("handles lock").get(&fh.0).cloned();
        if f.is_none() && self.lazy.is_some() && self.core.is_writable() {
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
        let _span = tracing::debug_span!("fuse", op = "fsyncdir").entered();
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
        let _span = tracing::debug_span!("fuse", op = "setattr", ino = ino.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "create", ino = parent.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "mknod", ino = parent.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "mkdir", ino = parent.0).entered();
        writable_or_erofs!(self, reply);
        let (core, name, who) = (self.core.clone(), name.as_bytes().to_vec(), self.creator(req));
        self.entry_later(reply, async move {
            let a = core.mkdir(parent.0, &name, mode & !umask).await?;
            who.own(&core, parent.0, a).await
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        let _span = tracing::debug_span!("fuse", op = "symlink", ino = parent.0).entered();
        writable_or_erofs!(self, reply);
        let (core, name, who) = (self.core.clone(), link_name.as_bytes().to_vec(), self.creator(req));
        let target = target.as_os_str().as_bytes().to_vec();
        self.entry_later(reply, async move {
            let a = core.symlink(parent.0, &name, &target).await?;
            who.own(&core, parent.0, a).await
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _span = tracing::debug_span!("fuse", op = "unlink", ino = parent.0).entered();
        writable_or_erofs!(self, reply);
        let (core, name) = (self.core.clone(), name.as_bytes().to_vec());
        self.empty_later(reply, async move { core.unlink(parent.0, &name).await });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _span = tracing::debug_span!("fuse", op = "rmdir", ino = parent.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "rename", ino = parent.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "fallocate", ino = ino.0).entered();
        writable_or_erofs!(self, reply);
        let core = self.core.clone();
        self.empty_later(reply, async move { core.fallocate(ino.0, offset, length, mode).await });
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the kernel answers the other kinds of
    /// seek itself): a sparse file's holes show through the mount, so `cp`
    /// and `tar` of it keep them.
    fn lseek(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: fuser::ReplyLseek) {
        let _span = tracing::debug_span!("fuse", op = "lseek", ino = ino.0).entered();
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
        let _span = tracing::debug_span!("fuse", op = "statfs").entered();
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
        let _span = tracing::debug_span!("fuse", op = "link", ino = ino.0).entered();
        writable_or_erofs!(self, reply);
        // Both names show one node while mounted; a checkpoint records each
        // path as a file (trees have no hard links, as in git).
        let (core, name) = (self.core.clone(), newname.as_bytes().to_vec());
        self.entry_later(reply, async move { core.link(ino.0, newparent.0, &name).await });
    }
}
