//! Writing a tree into a local directory, safely and in parallel.
//!
//! Safety: every write happens relative to a directory fd of the target.
//! Parent directories are opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, and files are created with `O_EXCL | O_NOFOLLOW`
//! (or written to a temp name and renamed over, with `--force`), so neither
//! a hostile tree nor a symlink already in the target can redirect a write
//! outside it. Tree names are validated on decode (no `.`, `..`, `/`, NUL,
//! duplicates), which rules out the rest.
//!
//! Speed: trees are fetched one level at a time (all of a level's trees in
//! flight together), then file contents with [`CONCURRENCY`] in flight;
//! whole files are written by a writer thread (one: parallel creates cost
//! more on ext4 than they gain), each directory's fd kept open while it
//! is written ([`Writers`]); a chunked file streams in
//! on blocking tasks.

use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use crate::error::{Error, Next, Result};
use crate::fetch::Fetcher;
use crate::hash::Hash;
use crate::object::{Entry, Kind, StatObject};
use crate::store::CONCURRENCY;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckoutReport {
    pub files: u64,
    pub symlinks: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// The directory held an interrupted checkout's files, removed first.
    pub removed_partial: bool,
    /// Every regular file written and every gitlink (checked out as an
    /// empty directory), with its tree entry (for stat caches).
    #[serde(skip)]
    pub written: Vec<(Vec<u8>, Entry)>,
}

pub struct CheckoutOptions<'a> {
    /// Write into a non-empty directory, replacing what is in the way.
    pub force: bool,
    /// The target may hold an entry of this name and nothing else (a
    /// working copy's state folder, made by the resume writing into it,
    /// which marks its own progress): the checkout leaves no mark of its
    /// own.
    pub allow_name: Option<&'a str>,
    /// Only these paths of the tree (directories or files), each written at
    /// its own path under the target; empty: the whole tree.
    pub paths: &'a [String],
    /// Called with (files done, files total).
    pub progress: &'a (dyn Fn(u64, u64) + Sync),
}

fn lossy(p: &[u8]) -> String {
    crate::fsutil::show_path(p)
}

fn io_at(path: &[u8], what: &str) -> impl FnOnce(rustix::io::Errno) -> Error {
    let context = format!("{what} {:?}", lossy(path));
    move |e| Error::Io { context, source: e.into() }
}

/// Opens directory `rel` (relative, `/`-separated) beneath `root`,
/// refusing any symlink on the way.
fn open_dir_beneath(root: &OwnedFd, rel: &[u8]) -> Result<OwnedFd> {
    let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
    rustix::fs::openat2(
        root,
        OsStr::from_bytes(rel),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        rustix::io::Errno::XDEV | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => Error::UnsafePath {
            path: lossy(rel),
            reason: "a symlink or non-directory is in the way of a directory".into(),
        },
        rustix::io::Errno::NAMETOOLONG => Error::User(format!(
            "cannot check out directory {:?}: its path ({} bytes) is longer than this system allows (PATH_MAX, 4096 bytes)",
            lossy(rel),
            rel.len()
        ))
        .then(Next::SubtreeOrMount),
        e => Error::Io { context: format!("opening directory {:?}", lossy(rel)), source: e.into() },
    })
}

/// Removes `name` in `dir`, recursively if it is a directory, without
/// following symlinks.
fn remove_at(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        let sub = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let names: Vec<Vec<u8>> = rustix::fs::Dir::read_from(&sub)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .collect();
        for n in names {
            remove_at(&sub, OsStr::from_bytes(&n))?;
        }
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&c| c == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&b""[..], path),
    }
}

/// Creates directory `path` beneath `root` (its parent exists).
fn make_dir(root: &OwnedFd, path: &[u8], force: bool) -> Result<()> {
    let (parent, name) = split_parent(path);
    let pfd = open_dir_beneath(root, parent)?;
    let name = OsStr::from_bytes(name);
    match rustix::fs::mkdirat(&pfd, name, Mode::from_raw_mode(0o777)) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::EXIST) if force => {
            let st = rustix::fs::statat(&pfd, name, AtFlags::SYMLINK_NOFOLLOW).map_err(io_at(path, "inspecting"))?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                return Ok(());
            }
            remove_at(&pfd, name)
                .map_err(|e| Error::Io { context: format!("replacing {:?}", lossy(path)), source: e })?;
            rustix::fs::mkdirat(&pfd, name, Mode::from_raw_mode(0o777)).map_err(io_at(path, "creating directory"))
        }
        Err(e) => Err(io_at(path, "creating directory")(e)),
    }
}

/// Where one entry is being written: its parent directory, the name it is
/// written under, and the name it must end up with.
struct Target {
    parent: Arc<OwnedFd>,
    name: std::ffi::OsString,
    final_name: std::ffi::OsString,
    /// Placed or discarded: nothing is left to remove when dropped.
    settled: bool,
}

/// A temp name neither placed nor discarded (the write's future dropped:
/// an interrupted checkout) is removed, so no partial file stays under a
/// name nothing will clean.
impl Drop for Target {
    fn drop(&mut self) {
        if !self.settled {
            self.discard();
        }
    }
}

impl Target {
    /// Opens the parent of `path` beneath `root`. A fresh small target is
    /// created in place (O_EXCL); with `force`, or when `temp` (a large
    /// file streamed in), under a temp name renamed into place at the end,
    /// so a failed or interrupted write never leaves a file that looks
    /// complete.
    fn open(root: &OwnedFd, path: &[u8], force: bool, temp: bool) -> Result<Target> {
        let parent = Arc::new(open_dir_beneath(root, split_parent(path).0)?);
        Ok(Target::in_dir(parent, path, force, temp))
    }

    /// [`Target::open`] in `parent`, the directory of `path`, opened already.
    fn in_dir(parent: Arc<OwnedFd>, path: &[u8], force: bool, temp: bool) -> Target {
        let name = split_parent(path).1;
        let final_name = OsStr::from_bytes(name).to_os_string();
        let name = if force || temp {
            format!("{TEMP_PREFIX}{}-{}", std::process::id(), rand::random::<u64>()).into()
        } else {
            final_name.clone()
        };
        Target { parent, name, final_name, settled: false }
    }

    fn create_file(&self, path: &[u8], kind: Kind) -> Result<std::fs::File> {
        let mode = if kind == Kind::Executable { 0o777 } else { 0o666 };
        let fd = rustix::fs::openat(
            &self.parent,
            &self.name,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(io_at(path, "creating file"))?;
        Ok(std::fs::File::from(fd))
    }

    /// Moves a temp name into place: over what is there with `force`,
    /// never over anything without it.
    fn place(mut self, path: &[u8], force: bool) -> Result<()> {
        self.settled = true;
        if self.name == self.final_name {
            return Ok(());
        }
        let (pfd, target, final_name) = (&self.parent, &self.name, &self.final_name);
        let r = if force {
            rustix::fs::renameat(pfd, target, pfd, final_name).or_else(|e| {
                // A directory is in the way: remove it and retry once.
                if matches!(e, rustix::io::Errno::ISDIR | rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST) {
                    remove_at(pfd, final_name).map_err(|_| e)?;
                    rustix::fs::renameat(pfd, target, pfd, final_name)
                } else {
                    Err(e)
                }
            })
        } else {
            rustix::fs::renameat_with(pfd, target, pfd, final_name, rustix::fs::RenameFlags::NOREPLACE).or_else(|e| {
                if e == rustix::io::Errno::INVAL {
                    // A filesystem without RENAME_NOREPLACE: a link fails
                    // the same way on an existing name.
                    rustix::fs::linkat(pfd, target, pfd, final_name, AtFlags::empty())?;
                    rustix::fs::unlinkat(pfd, target, AtFlags::empty())
                } else {
                    Err(e)
                }
            })
        };
        r.map_err(|e| {
            self.discard();
            io_at(path, "renaming into place")(e)
        })
    }

    /// Removes a temp name after a failed write (best effort).
    fn discard(&self) {
        if self.name != self.final_name {
            let _ = rustix::fs::unlinkat(&self.parent, &self.name, AtFlags::empty());
        }
    }
}

/// Writes one file or symlink at `path` in `parent` (its directory, opened
/// beneath the target's root).
fn write_entry(parent: Arc<OwnedFd>, path: &[u8], kind: Kind, data: &[u8], force: bool) -> Result<()> {
    let t = Target::in_dir(parent, path, force, false);
    let written = match kind {
        Kind::Symlink => {
            if data.is_empty() || data.contains(&0) {
                return Err(Error::UnsafePath {
                    path: lossy(path),
                    reason: "symlink target is empty or contains NUL".into(),
                });
            }
            rustix::fs::symlinkat(OsStr::from_bytes(data), &t.parent, &t.name).map_err(io_at(path, "creating symlink"))
        }
        _ => t.create_file(path, kind).and_then(|f| {
            crate::fsutil::write_sparse(&f, data, 0).map_err(Error::io(format!("writing {:?}", lossy(path))))
        }),
    };
    if let Err(e) = written {
        t.discard();
        return Err(e);
    }
    t.place(path, force)
}

/// [`write_entry`] at `path` beneath `root` (its directory opened first).
#[cfg(test)]
fn write_entry_beneath(root: &OwnedFd, path: &[u8], kind: Kind, data: &[u8], force: bool) -> Result<()> {
    let parent = Arc::new(open_dir_beneath(root, split_parent(path).0)?);
    write_entry(parent, path, kind, data, force)
}

/// Writer threads of a checkout. One: on this project's machine (ext4
/// without a journal, 2 cores) a whole-tree checkout of 15,017 files took
/// 1.04-1.08 s with one writer and 1.42-1.68 s with four, three runs
/// each, cold, alternated; with the freed inodes of an `rm -rf` of an
/// earlier tree nearby, 0.93-1.01 s against 1.40-1.98 s. perf put half of
/// the four writers' time in ext4's inode allocation (`find_inode_bit`,
/// `recently_deleted`), which parallel creates make dearer, not faster.
/// On tmpfs the count made no difference (0.79-1.04 s either way), nor on
/// a 1,054-file subtree. git's own checkout writes with one worker too
/// (`checkout.workers` is 1 by default). Decoding stays parallel: the
/// fetcher's tasks hand finished pieces to the writer.
const WRITER_THREADS: usize = 1;

/// Decoded members that may wait for the writer, in each of its two
/// queues (the streams' hand-over and the writer thread's own). The writer
/// is the slow end of a cold checkout, so what waits is memory and nothing
/// more; and a bulk stream decodes members into shared pooled buffers
/// (`fetch::packs::decode_batch`), which go back to the pool, to be used
/// again, only once their last member is written. With 256 and 64, a
/// checkout of a 2,781-file subtree held ~20 such buffers at once and
/// touched 50 MB of fresh memory (15,000 page faults); with 32 each, 9,000
/// page faults and no slower (10 interleaved pairs: 0.261 against 0.269 s).
const QUEUED_MEMBERS: usize = 32;

/// Threads that write whole files (and symlinks) into the target, each
/// keeping its recently used directories open: a file costs its create,
/// write and close, not a thread hand-off and a directory open as well.
/// A file goes to the thread of its directory (by hash), so one directory
/// is written by one thread (no contention on its lock) and its fd is
/// opened once. The first error stops the rest.
struct Writers {
    queues: Vec<tokio::sync::mpsc::Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    error: Arc<std::sync::Mutex<Option<Error>>>,
}

struct Job {
    path: Vec<u8>,
    kind: Kind,
    piece: crate::fetch::Piece,
}

impl Writers {
    fn start(root: Arc<OwnedFd>, force: bool) -> Writers {
        let n = WRITER_THREADS;
        let error: Arc<std::sync::Mutex<Option<Error>>> = Arc::default();
        let (mut queues, mut threads) = (Vec::new(), Vec::new());
        for i in 0..n {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Job>(QUEUED_MEMBERS);
            let (root, err) = (root.clone(), error.clone());
            let spawned = std::thread::Builder::new().name(format!("mado-write-{i}")).spawn(move || {
                let error = err;
                let mut dirs: std::collections::HashMap<Vec<u8>, Arc<OwnedFd>> = std::collections::HashMap::new();
                while let Some(job) = rx.blocking_recv() {
                    if error.lock().expect("error lock").is_some() {
                        continue;
                    }
                    let dir = split_parent(&job.path).0;
                    let parent = match dirs.get(dir) {
                        Some(fd) => Ok(fd.clone()),
                        None => open_dir_beneath(&root, dir).map(Arc::new).inspect(|fd| {
                            if dirs.len() >= 64 {
                                dirs.clear();
                            }
                            dirs.insert(dir.to_vec(), fd.clone());
                        }),
                    };
                    let r = parent.and_then(|p| write_entry(p, &job.path, job.kind, &job.piece.bytes, force));
                    if let Err(e) = r {
                        error.lock().expect("error lock").get_or_insert(e);
                    }
                }
            });
            match spawned {
                Ok(t) => {
                    queues.push(tx);
                    threads.push(t);
                }
                // Fewer threads than asked (a limit): the others share.
                Err(e) if queues.is_empty() => {
                    *error.lock().expect("error lock") =
                        Some(Error::Io { context: "starting a writer thread".into(), source: e })
                }
                Err(_) => {}
            }
        }
        Writers { queues, threads, error }
    }

    /// A copy of the first write error (the original is [`Writers::finish`]'s).
    fn failed(&self) -> Option<Error> {
        self.error.lock().expect("error lock").as_ref().map(|e| Error::Internal(format!("{e}")))
    }

    async fn write(&self, job: Job) -> Result<()> {
        use std::hash::{Hash as _, Hasher};
        if self.queues.is_empty() {
            return Err(self.failed().unwrap_or_else(|| Error::Internal("no writer thread".into())));
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        split_parent(&job.path).0.hash(&mut h);
        let q = &self.queues[h.finish() as usize % self.queues.len()];
        q.send(job).await.map_err(|_| Error::Internal("a writer thread stopped".into()))
    }

    /// Waits for every queued write; the first error, if any.
    async fn finish(self) -> Result<()> {
        let Writers { queues, threads, error } = self;
        drop(queues);
        let panicked =
            blocking(move || Ok(threads.into_iter().map(|t| t.join()).filter(|r| r.is_err()).count())).await?;
        let first = error.lock().expect("error lock").take();
        if first.is_none() && panicked > 0 {
            // Its files may be missing: never a checkout that looks whole.
            return Err(Error::Internal(format!("{panicked} checkout writer thread(s) stopped unexpectedly")));
        }
        first.map_or(Ok(()), Err)
    }
}

/// Writes a chunked file at `path` beneath `root` as its chunks arrive,
/// under a temp name renamed into place once every byte is written.
///
/// The temp file is made, and renamed into place, on this task, not on a
/// blocking thread: when the checkout fails elsewhere it drops this future,
/// and a blocking task it had started ran on by itself, making (or placing)
/// its file after the failed checkout had emptied and removed its target
/// (a fresh-clone test run found the directory left with one entry). Each
/// is a few system calls, for a large file.
async fn stream_entry(fetcher: &Arc<Fetcher>, root: &Arc<OwnedFd>, path: &[u8], e: &Entry, force: bool) -> Result<u64> {
    let t = Target::open(root, path, force, true)?;
    let file = t.create_file(path, e.kind)?;
    match fetcher.write_content(e, &lossy(path), Arc::new(file)).await {
        Ok(n) => t.place(path, force).map(|()| n),
        Err(er) => {
            t.discard();
            Err(er)
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|er| Error::Io { context: "write task".into(), source: std::io::Error::other(er) })?
}

/// Sets the modification time of each `(path, seconds, nanoseconds)`
/// beneath `dest` without following symlinks (a symlink's own time is
/// set). The empty path is `dest` itself.
pub fn set_mtimes(dest: &Path, items: &[(Vec<u8>, i64, u32)]) -> Result<()> {
    let root = rustix::fs::open(dest, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| Error::Io { context: format!("opening {}", dest.display()), source: e.into() })?;
    for (path, secs, nanos) in items {
        let (parent, name) = if path.is_empty() { (&b""[..], &b"."[..]) } else { split_parent(path) };
        let pfd = open_dir_beneath(&root, parent)?;
        let t = rustix::fs::Timespec { tv_sec: *secs, tv_nsec: *nanos as _ };
        let times = rustix::fs::Timestamps { last_access: t, last_modification: t };
        match rustix::fs::utimensat(&pfd, OsStr::from_bytes(name), &times, AtFlags::SYMLINK_NOFOLLOW) {
            // Named by the stat object but not in the tree: a FIFO or socket
            // an older mado recorded the mtime of while leaving it out.
            Err(rustix::io::Errno::NOENT) => {}
            r => r.map_err(io_at(path, "setting the mtime of"))?,
        }
    }
    Ok(())
}

/// Sets the mtimes `stat` (a snapshot's stat object) records for what a
/// checkout of `paths` (empty: the whole tree) wrote under `dest`; returns
/// how many were set.
pub fn restore_mtimes(dest: &Path, stat: StatObject, paths: &[String]) -> Result<usize> {
    let roots = roots_of(paths)?;
    let items: Vec<_> = stat
        .entries
        .into_iter()
        .filter(|(p, _, _)| roots.is_empty() || roots.iter().any(|r| p == r || is_below(p, r)))
        .collect();
    set_mtimes(dest, &items)?;
    Ok(items.len())
}

/// Whether tree path `p` lies below directory path `dir`.
fn is_below(p: &[u8], dir: &[u8]) -> bool {
    p.starts_with(dir) && p.get(dir.len()) == Some(&b'/')
}

pub fn is_empty_dir(p: &Path) -> Result<bool> {
    is_empty_dir_but(p, None)
}

/// Whether `p` is missing or an empty directory, or holds only an entry
/// named `but`.
fn is_empty_dir_but(p: &Path, but: Option<&str>) -> Result<bool> {
    match std::fs::read_dir(p) {
        Ok(mut it) => Ok(it.all(|e| e.is_ok_and(|e| but.is_some_and(|b| e.file_name() == b)))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        // A file where the directory should go (or under it): the user's
        // to fix, not an I/O failure.
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            Err(Error::User(format!("{} is not a directory; choose an empty or new directory", p.display())))
        }
        // A mount whose daemon died (kill -9): the mount is still there.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            Err(Error::User(format!("{} is a mount whose daemon is gone", p.display()))
                .then(Next::UnmountDead { at: p.display().to_string() }))
        }
        Err(e) => Err(Error::Io { context: format!("reading {}", p.display()), source: e }),
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

/// A path the user named inside a tree, as `/`-separated names: relative,
/// no `..`, no empty names (a trailing `/` is allowed, and `.` names, as in
/// `./src`, are dropped). Returned as the tree names it (`src`).
pub fn check_tree_path(p: &str) -> Result<Vec<u8>> {
    let bad = |reason: &str| Error::UnsafePath { path: p.to_string(), reason: reason.to_string() };
    if p.starts_with('/') {
        return Err(bad("an absolute path; name a path inside the snapshot, relative to its root"));
    }
    let names: Vec<&str> = p.trim_end_matches('/').split('/').filter(|n| *n != ".").collect();
    if names.is_empty() || names == [""] {
        return Err(bad("an empty path names no entry (omit it for the whole tree)"));
    }
    for name in &names {
        crate::object::check_name(name.as_bytes()).map_err(|reason| bad(&reason))?;
    }
    Ok(names.join("/").into_bytes())
}

/// The named paths, checked, with any path below another one dropped
/// (its ancestor brings it), sorted.
fn roots_of(paths: &[String]) -> Result<Vec<Vec<u8>>> {
    let mut v: Vec<Vec<u8>> = paths.iter().map(|p| check_tree_path(p)).collect::<Result<_>>()?;
    v.sort();
    v.dedup();
    let mut out: Vec<Vec<u8>> = Vec::new();
    for p in v {
        let covered = out.iter().any(|a| is_below(&p, a));
        if !covered {
            out.push(p);
        }
    }
    Ok(out)
}

/// One entry written: its kind, bytes, path and tree entry.
type Written = (Kind, u64, Vec<u8>, Entry);

/// Reads each of `files` (many in flight) and writes it: a whole file
/// through the writers, a chunked one streamed into place.
async fn read_and_write(
    fetcher: &Arc<Fetcher>,
    root_fd: &Arc<OwnedFd>,
    writers: &Writers,
    files: Vec<(Vec<u8>, Entry)>,
    opts: &CheckoutOptions<'_>,
    done: &AtomicU64,
    total: u64,
) -> Result<Vec<Written>> {
    futures::stream::iter(files.into_iter().map(|(p, e)| async move {
        if let Some(e) = writers.failed() {
            return Err(e);
        }
        let kind = e.kind;
        let n = if e.chunked && kind != Kind::Symlink {
            stream_entry(fetcher, root_fd, &p, &e, opts.force).await?
        } else {
            // Held in the fetcher's piece budget until written: many
            // files of a few MiB in flight stay under it too.
            let piece = fetcher.whole(&e, &lossy(&p)).await?;
            let n = piece.bytes.len() as u64;
            writers.write(Job { path: p.clone(), kind, piece }).await?;
            n
        };
        (opts.progress)(done.fetch_add(1, Relaxed) + 1, total);
        Ok::<_, Error>((kind, n, p, e))
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect()
    .await
}

/// Writes the tree `root` (or only `opts.paths` of it) into `dest`.
pub async fn checkout(
    fetcher: &Arc<Fetcher>,
    root: Hash,
    dest: &Path,
    opts: CheckoutOptions<'_>,
) -> Result<CheckoutReport> {
    let Dest { made, empty, partial_left, removed_partial } = dest_state(fetcher, root, dest, &opts).await?;
    let named = lookup_named(fetcher, root, opts.paths).await?;
    std::fs::create_dir_all(dest).map_err(Error::io(format!("creating {}", dest.display())))?;
    let root_fd = Arc::new(
        rustix::fs::open(dest, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| Error::Io { context: format!("opening {}", dest.display()), source: e.into() })?,
    );
    // Into an empty or new directory, marked until every file is written:
    // a checkout that fails or is dropped (Ctrl-C) leaves the directory as
    // it found it, and one killed leaves the mark, so the next checkout
    // there knows whose files they are. A tree that holds a file of the
    // mark's name at its top is not marked.
    let marks = opts.allow_name.is_none()
        && (empty || partial_left)
        && !fetcher.tree(root, "").await?.entries.iter().any(|e| e.name == PARTIAL_MARK.as_bytes());
    let partial = if marks && empty { Some(Partial::mark(&root_fd, dest, made)?) } else { None };
    // --force over what a killed checkout left: its mark goes at the end.
    let stale_mark = marks && !empty;
    let mut report = CheckoutReport { removed_partial, ..Default::default() };
    let files = walk(fetcher, &root_fd, root, named, &opts, &mut report).await?;
    let results = write_files(fetcher, &root_fd, files, &opts).await?;
    for (kind, n, p, e) in results {
        if kind == Kind::Symlink {
            report.symlinks += 1;
        } else {
            report.files += 1;
            report.bytes += n;
            report.written.push((p, e));
        }
    }
    if let Some(p) = partial {
        p.done(&root_fd)?;
    }
    if stale_mark {
        // The killed checkout's half-written temp files go too.
        remove_temps(dest);
        rustix::fs::unlinkat(&*root_fd, PARTIAL_MARK, AtFlags::empty())
            .map_err(io_at(PARTIAL_MARK.as_bytes(), "removing"))?;
    }
    Ok(report)
}

/// What [`dest_state`] found at the checkout's target directory.
struct Dest {
    /// It did not exist.
    made: bool,
    /// It is empty (but for `allow_name`), or was emptied of what an
    /// interrupted checkout left.
    empty: bool,
    /// It holds what an interrupted checkout left (its mark).
    partial_left: bool,
    removed_partial: bool,
}

/// Checks the target directory: empty, new, or written over with
/// `--force`; what an interrupted checkout (kill -9) left there is removed,
/// and the checkout done again, unless something else is there too.
async fn dest_state(fetcher: &Arc<Fetcher>, root: Hash, dest: &Path, opts: &CheckoutOptions<'_>) -> Result<Dest> {
    // A file where `dest` goes is refused here, with --force too.
    let made = std::fs::symlink_metadata(dest).is_err();
    let mut empty = is_empty_dir_but(dest, opts.allow_name)?;
    // What an interrupted checkout (kill -9) left is removed, and the
    // checkout done again; with --force, written over.
    let mut removed_partial = false;
    let partial_left = !empty && opts.allow_name.is_none() && is_partial_checkout(dest);
    if partial_left && !opts.force {
        // Only what that checkout could have written: anything else there
        // is someone's, and stops this.
        if let Some(p) = first_foreign(fetcher, root, dest, &[PARTIAL_MARK]).await? {
            return Err(Error::User(format!(
                "{} holds what an interrupted checkout left ({PARTIAL_MARK}), and {p}, which writing this \
                 tree there would not have made; move away what you put there and run this again (it then \
                 removes the rest and starts over), or pass --force to write this tree's files over it and \
                 keep everything else",
                dest.display()
            )));
        }
        crate::fsutil::empty_dir(dest)
            .map_err(Error::io(format!("removing the interrupted checkout in {}", dest.display())))?;
        (empty, removed_partial) = (true, true);
    }
    if !opts.force && !empty {
        return Err(Error::User(format!(
            "{} is not empty; choose an empty or new directory, or pass --force to write over it",
            dest.display()
        )));
    }
    Ok(Dest { made, empty, partial_left, removed_partial })
}

/// The entries of the named paths (each checked first): a missing one
/// stops the checkout before anything is written.
async fn lookup_named(fetcher: &Arc<Fetcher>, root: Hash, paths: &[String]) -> Result<Vec<(Vec<u8>, Entry)>> {
    let roots = roots_of(paths)?;
    let found: Vec<Option<Entry>> = futures::stream::iter(roots.iter().map(|p| {
        let f = fetcher.clone();
        async move {
            // A missing directory on the way names the whole path asked for.
            f.lookup(root, &lossy(p)).await.map_err(|e| match e {
                Error::NotFound(why) => Error::NotFound(format!("{} is not in the snapshot ({why})", lossy(p))),
                e => e,
            })
        }
    }))
    .buffered(CONCURRENCY)
    .try_collect()
    .await?;
    let named: Vec<(Vec<u8>, Entry)> = roots
        .into_iter()
        .zip(found)
        .map(|(p, e)| {
            e.map(|e| (p.clone(), e)).ok_or_else(|| Error::NotFound(format!("{} is not in the snapshot", lossy(&p))))
        })
        .collect::<Result<_>>()?;
    Ok(named)
}

/// Creates the directories of the tree (or of the named paths) under
/// `root_fd`, one level of trees at a time, and returns the files to
/// write.
async fn walk(
    fetcher: &Arc<Fetcher>,
    root_fd: &Arc<OwnedFd>,
    root: Hash,
    named: Vec<(Vec<u8>, Entry)>,
    opts: &CheckoutOptions<'_>,
    report: &mut CheckoutReport,
) -> Result<Vec<(Vec<u8>, Entry)>> {
    let mut files: Vec<(Vec<u8>, Entry)> = Vec::new();
    let mut level: Vec<(Vec<u8>, Hash)> = Vec::new();
    if opts.paths.is_empty() {
        level.push((Vec::new(), root));
    } else {
        // Each named path at its own place: its parents first (as plain
        // directories), then the entry itself.
        let mut made: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
        for (p, e) in named {
            let mut at = 0;
            while let Some(i) = p[at..].iter().position(|c| *c == b'/') {
                let parent = p[..at + i].to_vec();
                if made.insert(parent.clone()) {
                    make_dir(root_fd, &parent, opts.force)?;
                    report.dirs += 1;
                }
                at += i + 1;
            }
            match e.kind {
                Kind::Directory | Kind::Gitlink => {
                    make_dir(root_fd, &p, opts.force)?;
                    made.insert(p.clone());
                    report.dirs += 1;
                    if e.kind == Kind::Directory {
                        level.push((p, e.id));
                    } else {
                        report.written.push((p, e));
                    }
                }
                _ => files.push((p, e)),
            }
        }
    }
    // Trees, one level at a time; directories are created as found.
    while !level.is_empty() {
        let trees: Vec<_> = futures::stream::iter(level.iter().map(|(path, id)| {
            let f = fetcher.clone();
            async move { f.tree(*id, &lossy(path)).await }
        }))
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
        let mut next = Vec::new();
        for ((dir, _), tree) in level.iter().zip(trees) {
            for e in tree.entries {
                let p = join(dir, &e.name);
                match e.kind {
                    Kind::Directory | Kind::Gitlink => {
                        make_dir(root_fd, &p, opts.force)?;
                        report.dirs += 1;
                        if e.kind == Kind::Directory {
                            next.push((p, e.id));
                        } else {
                            // Kept so a working copy can write it back.
                            report.written.push((p, e));
                        }
                    }
                    _ => files.push((p, e)),
                }
            }
        }
        level = next;
    }
    Ok(files)
}

/// Writes `files`: those whose packs the cache lacks streamed from each
/// pack's span once, the rest read as usual, through one set of writers;
/// every write is done (or failed) before it returns.
async fn write_files(
    fetcher: &Arc<Fetcher>,
    root_fd: &Arc<OwnedFd>,
    files: Vec<(Vec<u8>, Entry)>,
    opts: &CheckoutOptions<'_>,
) -> Result<Vec<Written>> {
    // Whole files of packs the cache has no copy of: each pack's span is
    // streamed once and each member goes from the stream to the writers
    // (nothing held for later readers, nothing read back from the cache).
    let subset = !opts.paths.is_empty();
    let is_whole = |e: &Entry| !e.chunked || e.kind == Kind::Symlink;
    let whole_ids: std::collections::HashSet<Hash> =
        files.iter().filter(|(_, e)| is_whole(e)).map(|(_, e)| e.id).collect();
    // A pack that also holds a chunked file's members is read the usual
    // way (its flight serves the chunks too). Streaming it as well would
    // leave the chunked file's writer waiting for the stream and then
    // reading its chunks from the cache, which fails where the cache could
    // not be written (tried: a Linux-tree checkout on a full disk stopped
    // on a missing chunk).
    let with_chunks: std::collections::HashSet<Hash> =
        files.iter().filter(|(_, e)| !is_whole(e)).filter_map(|(_, e)| fetcher.pack_of(&e.id)).collect();
    let mut spans = fetcher.pack_spans(&whole_ids);
    spans.retain(|(p, _, _)| !with_chunks.contains(&p.id));
    let in_spans: std::collections::HashSet<Hash> = spans
        .iter()
        .flat_map(|(p, lo, hi)| p.members[*lo..=*hi].iter().map(|m| m.id))
        .filter(|id| whole_ids.contains(id))
        .collect();
    let mut by_id: std::collections::HashMap<Hash, Vec<(Vec<u8>, Entry)>> = std::collections::HashMap::new();
    let mut rest = Vec::new();
    for (p, e) in files {
        if is_whole(&e) && in_spans.contains(&e.id) {
            by_id.entry(e.id).or_default().push((p, e));
        } else {
            rest.push((p, e));
        }
    }
    // Only the named subtrees' span of a larger pack needs to come.
    // Every pack the other files need starts at once (one round trip for
    // all), but not one being streamed: its readers wait for the stream.
    let streaming: std::collections::HashSet<Hash> = spans.iter().map(|(p, _, _)| p.id).collect();
    let ids: std::collections::HashSet<_> = rest
        .iter()
        .map(|(_, e)| e.id)
        .filter(|id| !fetcher.pack_of(id).is_some_and(|p| streaming.contains(&p)))
        .collect();
    if subset {
        fetcher.want(Some(ids));
    } else {
        fetcher.prefetch(&ids);
    }
    let total = (rest.len() + by_id.values().map(Vec::len).sum::<usize>()) as u64;
    let done = AtomicU64::new(0);
    let writers = Writers::start(root_fd.clone(), opts.force);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Hash, Bytes)>(QUEUED_MEMBERS);
    // The streamed files' own budget: chunked files' readers may hold all
    // of the fetcher's while they wait for a stream to end.
    let budget = crate::fetch::piece_budget(crate::fetch::PIECE_BYTES_IN_MEMORY / 2);
    let streams = async {
        let tx = tx;
        futures::future::join_all(spans.iter().map(|(pack, lo, hi)| {
            let (tx, in_spans) = (tx.clone(), &in_spans);
            async move {
                let mut sink = move |i: usize, b: Option<Bytes>| -> Option<futures::future::BoxFuture<'static, ()>> {
                    let (b, id) = (b?, pack.members[i].id);
                    if !in_spans.contains(&id) {
                        return None;
                    }
                    match tx.try_send((id, b)) {
                        Err(tokio::sync::mpsc::error::TrySendError::Full(v)) => {
                            let tx = tx.clone();
                            Some(Box::pin(async move {
                                let _ = tx.send(v).await;
                            }))
                        }
                        Ok(()) | Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => None,
                    }
                };
                fetcher.stream_members(pack, *lo, *hi, &mut sink).await;
            }
        }))
        .await;
    };
    // The streamed members, written as they come. The channel is drained
    // to its end even after an error, so no stream waits on it for ever.
    let streamed = async {
        let (mut out, mut failed): (Vec<Written>, Option<Error>) = (Vec::new(), None);
        while let Some((id, bytes)) = rx.recv().await {
            if failed.is_some() {
                continue;
            }
            let Some(targets) = by_id.remove(&id) else { continue };
            for (p, e) in targets {
                if bytes.len() as u64 != e.size {
                    failed = Some(Error::Corrupt {
                        id,
                        what: "blob",
                        path: lossy(&p),
                        detail: format!("{} bytes, tree says {}", bytes.len(), e.size),
                    });
                    break;
                }
                let piece = Fetcher::piece_in(&budget, bytes.clone()).await;
                if let Err(er) = writers.write(Job { path: p.clone(), kind: e.kind, piece }).await {
                    failed = Some(er);
                    break;
                }
                (opts.progress)(done.fetch_add(1, Relaxed) + 1, total);
                out.push((e.kind, bytes.len() as u64, p, e));
            }
        }
        failed.map_or(Ok(out), Err)
    };
    let (from_packs, others) = futures::join!(
        async { futures::join!(streams, streamed).1 },
        read_and_write(fetcher, root_fd, &writers, rest, opts, &done, total)
    );
    // What the streams did not deliver (a pack that failed, or that
    // another reader was fetching) is read the usual way.
    let results = match (from_packs, others) {
        (Ok(mut a), Ok(b)) => {
            a.extend(b);
            let left: Vec<(Vec<u8>, Entry)> = by_id.into_values().flatten().collect();
            read_and_write(fetcher, root_fd, &writers, left, opts, &done, total).await.map(|c| {
                a.extend(c);
                a
            })
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    // Every write is done (or failed) before the checkout answers.
    let finished = writers.finish().await;
    if subset {
        fetcher.want(None);
    }
    // A writer's own error first (what a task stopped early on is a copy).
    finished?;
    results
}

/// How the names of files being written start, until they are moved into
/// place (with `--force`, and for large files).
const TEMP_PREFIX: &str = ".mado-tmp-";

/// The file a checkout into an empty or new directory keeps at its top
/// until every file is written (FORMAT.md).
pub const PARTIAL_MARK: &str = ".mado-checkout-partial";

/// Removes every `.mado-tmp-*` file below `dest` (symlinks not followed):
/// what a killed checkout was writing when it died.
fn remove_temps(dest: &Path) {
    let mut dirs = vec![dest.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(e.path()),
                Ok(t) if t.is_file() && e.file_name().as_bytes().starts_with(TEMP_PREFIX.as_bytes()) => {
                    let _ = std::fs::remove_file(e.path());
                }
                _ => {}
            }
        }
    }
}

/// `dest` holds what a checkout that did not finish wrote: its mark.
fn is_partial_checkout(dest: &Path) -> bool {
    std::fs::symlink_metadata(dest.join(PARTIAL_MARK)).is_ok_and(|m| m.is_file())
}

/// The first path in `dest` (shown relative to it) that writing tree
/// `root` there could not have made: a name the tree does not have, or a
/// directory where it has a file (or the other way round). mado's own
/// temp files, and the top-level names in `own`, do not count. `None`:
/// everything there may be an interrupted checkout's (or resume's) own
/// work, which a run again may remove; anything else is someone's, and it
/// must not (a user or an agent may have written into the directory).
pub async fn first_foreign(fetcher: &Arc<Fetcher>, root: Hash, dest: &Path, own: &[&str]) -> Result<Option<String>> {
    let mut dirs: Vec<(std::path::PathBuf, Vec<u8>, Hash)> = vec![(dest.to_path_buf(), Vec::new(), root)];
    while let Some((at, rel, tree)) = dirs.pop() {
        let tree = fetcher.tree(tree, &lossy(&rel)).await?;
        let rd = std::fs::read_dir(&at).map_err(Error::io(format!("reading {}", at.display())))?;
        for e in rd {
            let e = e.map_err(Error::io(format!("reading {}", at.display())))?;
            let name = e.file_name();
            let name = name.as_bytes();
            if name.starts_with(TEMP_PREFIX.as_bytes()) || (rel.is_empty() && own.iter().any(|o| o.as_bytes() == name))
            {
                continue;
            }
            let path = join(&rel, name);
            let is_dir = e.file_type().map_err(Error::io(format!("reading {}", at.display())))?.is_dir();
            match tree.entries.iter().find(|t| t.name == name) {
                Some(t) if t.kind == Kind::Directory && is_dir => dirs.push((e.path(), path, t.id)),
                Some(t) if t.kind == Kind::Gitlink && is_dir => {
                    if std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some()) {
                        return Ok(Some(lossy(&path)));
                    }
                }
                Some(t) if !matches!(t.kind, Kind::Directory | Kind::Gitlink) && !is_dir => {}
                _ => return Ok(Some(lossy(&path))),
            }
        }
    }
    Ok(None)
}

/// A checkout under way into a directory that was empty (or new): dropped
/// before [`Partial::done`] (an error, or the checkout's future dropped),
/// it empties the directory again, and removes it if the checkout made it.
struct Partial {
    dest: std::path::PathBuf,
    made: bool,
    finished: bool,
    /// An existing directory's times, put back once it is emptied again.
    times: Option<std::fs::FileTimes>,
}

impl Partial {
    fn mark(root_fd: &OwnedFd, dest: &Path, made: bool) -> Result<Partial> {
        // Read before the mark changes them.
        let times = std::fs::metadata(dest).ok().filter(|_| !made).and_then(|m| {
            Some(std::fs::FileTimes::new().set_accessed(m.accessed().ok()?).set_modified(m.modified().ok()?))
        });
        let fd = rustix::fs::openat(
            root_fd,
            PARTIAL_MARK,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(io_at(PARTIAL_MARK.as_bytes(), "creating"))?;
        let partial = Partial { dest: dest.to_path_buf(), made, finished: false, times };
        std::fs::File::from(fd)
            .write_all(
                b"A checkout (by mado) into this directory has not finished (or was killed): \
                  what is here may be incomplete. Run the same checkout again: it removes what it wrote \
                  and starts over (a file of a path its tree does not have stops it, and stays).\n",
            )
            .map_err(Error::io(format!("writing {}", dest.join(PARTIAL_MARK).display())))?;
        Ok(partial)
    }

    fn done(mut self, root_fd: &OwnedFd) -> Result<()> {
        self.finished = true;
        rustix::fs::unlinkat(root_fd, PARTIAL_MARK, AtFlags::empty())
            .map_err(io_at(PARTIAL_MARK.as_bytes(), "removing"))
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.finished {
            crate::fsutil::undo_dir(&self.dest, self.made);
            if let Some(t) = self.times {
                let _ = std::fs::File::open(&self.dest).and_then(|d| d.set_times(t));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_paths_are_checked_and_covered_ones_dropped() {
        let ok = |p: &str| check_tree_path(p).unwrap();
        assert_eq!(ok("a/b/"), b"a/b");
        assert_eq!(ok("a"), b"a");
        // `.` names go, as a shell's `./a` would.
        assert_eq!(ok("./a"), b"a");
        assert_eq!(ok("a/./b/."), b"a/b");
        for bad in ["", "/", "/etc", "a/../b", "..", "./..", ".", "./", "a//b"] {
            assert!(matches!(check_tree_path(bad), Err(Error::UnsafePath { .. })), "{bad:?}");
        }
        let paths = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let roots = roots_of(&paths(&["src/lib", "src", "README", "src2/x", "src/", "srcx"])).unwrap();
        assert_eq!(roots, vec![b"README".to_vec(), b"src".to_vec(), b"src2/x".to_vec(), b"srcx".to_vec()]);
    }

    /// The mark is made only where nothing is: a symlink in its place
    /// (O_EXCL never follows one) or a file left there is refused, and what
    /// a symlink points at is not written.
    #[test]
    fn the_partial_mark_is_never_written_through_a_symlink_or_over_a_file() {
        let base = tempfile::tempdir().unwrap();
        let dest = base.path().join("dest");
        std::fs::create_dir_all(&dest).unwrap();
        let outside = base.path().join("outside");
        std::fs::write(&outside, b"keep").unwrap();
        std::os::unix::fs::symlink(&outside, dest.join(PARTIAL_MARK)).unwrap();
        let root = rustix::fs::open(&dest, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(Partial::mark(&root, &dest, false).is_err());
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        std::fs::remove_file(dest.join(PARTIAL_MARK)).unwrap();
        std::fs::write(dest.join(PARTIAL_MARK), b"left").unwrap();
        assert!(Partial::mark(&root, &dest, false).is_err());
        assert_eq!(std::fs::read(dest.join(PARTIAL_MARK)).unwrap(), b"left");
        std::fs::remove_file(dest.join(PARTIAL_MARK)).unwrap();
        // Where nothing is, it is made (and the checkout it stands for,
        // dropped unfinished, takes it away again).
        let p = Partial::mark(&root, &dest, false).unwrap();
        assert!(dest.join(PARTIAL_MARK).is_file());
        drop(p);
        assert!(std::fs::read_dir(&dest).unwrap().next().is_none());
    }

    #[test]
    fn writes_refuse_to_pass_through_symlinks() {
        let base = tempfile::tempdir().unwrap();
        let dest = base.path().join("dest");
        let outside = base.path().join("outside");
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, dest.join("evil")).unwrap();
        let root = rustix::fs::open(&dest, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        // Through the symlink: refused, even with --force.
        for force in [false, true] {
            let err = write_entry_beneath(&root, b"evil/pwned", Kind::File, b"x", force).unwrap_err();
            assert!(matches!(err, Error::UnsafePath { .. }), "{err}");
        }
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
        // --force replaces the symlink itself with a real directory.
        make_dir(&root, b"evil", true).unwrap();
        write_entry_beneath(&root, b"evil/ok", Kind::File, b"x", true).unwrap();
        assert!(dest.join("evil").symlink_metadata().unwrap().is_dir());
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
        // Without --force an existing file is never overwritten.
        assert!(write_entry_beneath(&root, b"evil/ok", Kind::File, b"y", false).is_err());
        // A file symlink in the way is replaced, not written through.
        std::os::unix::fs::symlink(outside.join("target"), dest.join("f")).unwrap();
        write_entry_beneath(&root, b"f", Kind::File, b"data", true).unwrap();
        assert!(!outside.join("target").exists());
        assert_eq!(std::fs::read(dest.join("f")).unwrap(), b"data");
    }
}
