//! A snapshot as a filesystem, with no FUSE in it: inodes, attributes,
//! directory listings, reads and, for a workspace, writes. The FUSE
//! adapter (crates/mount) only translates.
//!
//! **Read-only** ([`SnapshotFs::new`]): trees come inline with the pack
//! index when one is attached, so lookup, getattr and readdir need no
//! network after the mount is up; content is read through the fetcher (so
//! through packs) and is immutable.
//!
//! **Read-write** ([`SnapshotFs::writable`]), for a workspace: the snapshot
//! is the lazy lower layer and a local folder is the upper layer. Nodes
//! live in memory; a directory stays a bare tree id until something looks
//! into it. A file is copied up (its content written to `upper/<n>`) on the
//! first open for writing or truncate; created files live there from the
//! start. Every change clears the "clean" tree id of the directories above
//! it, so a checkpoint ([`SnapshotFs::build`]) re-hashes only files written
//! since the last one and re-encodes only the directories on their paths:
//! its cost follows the changes, not the tree. Mtimes are kept per node
//! and go to the snapshot's stat object, never into trees.
//!
//! A read that cannot finish within `read_timeout` fails (EIO) rather than
//! hanging its caller; other files keep being served.
//!
//! Parts: `inode` (the table, references, folding), `lower` (snapshot
//! reads), `overlay` (writes and copy-up, workspace only), `build`
//! (checkpoint) and `saved` (the state file).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::hash::{Hash, TreeId};
use crate::object::StatObject;
use crate::object::{check_name, ChunkManifest, Entry, Kind, Tree};

mod build;
mod chunked;
mod inode;
mod lower;
mod numbers;
mod overlay;
mod saved;
mod table;
#[cfg(test)]
mod tests;
mod times;
mod tracker;

pub use build::{Built, Skips, StatChange};
pub use numbers::LogPos;
pub(crate) use numbers::{drop_older_numbers, write_image};
pub use saved::{InodeImage, SavedChange};

pub use chunked::Readahead;
use inode::{Body, Name, Node, State};
pub use tracker::Tracker;

pub const ROOT_INO: u64 = 1;

/// A directory listing: names with attributes.
pub type DirList = Vec<(Vec<u8>, Attr)>;
/// Default bound on one read's wait for the network.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    File,
    Symlink,
    /// A FIFO, a unix socket or a device node made in a workspace: the
    /// kernel does its I/O (a device's only elsewhere: the mount is nodev);
    /// it lives in the mount's state and is never checkpointed.
    Fifo,
    Socket,
    BlockDev,
    CharDev,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: NodeKind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    /// Seconds since the epoch and nanoseconds.
    pub mtime: i64,
    pub mtime_ns: u32,
    /// Access and change times (the mtime unless set apart while mounted).
    pub atime: (i64, u32),
    pub ctime: (i64, u32),
    /// The owner, when not the mount's (a mount only: no checkpoint keeps it).
    pub owner: Option<(u32, u32)>,
    /// A device node's device number (0 for anything else).
    pub rdev: u32,
}

/// An open file: its content source.
pub enum OpenFile {
    /// A whole blob, with the cache file holding it (for passthrough).
    /// `ino` is set on a read-write mount, where the file may be copied up
    /// and written through another handle while this one is open.
    Whole { data: Bytes, cache_path: Option<PathBuf>, ino: Option<u64> },
    /// A chunked file: chunks are read as ranges are asked for.
    /// `backing`: the cache's whole copy of it (see `chunked::Assembly`),
    /// for passthrough, when a read-only mount has one.
    Chunked {
        entry: Entry,
        manifest: ChunkManifest,
        starts: Vec<u64>,
        ino: Option<u64>,
        ahead: Readahead,
        backing: Option<PathBuf>,
    },
    /// A file of the upper layer, read (and written) in place.
    Upper { file: std::fs::File, ino: u64, writable: bool },
}

/// The upper layer of a read-write mount. Only `base` changes after it is
/// made (a checkpoint's rebase), under a lock of its own that is a leaf
/// of the lock order (docs/DESIGN.md, "Lock order").
struct Upper {
    dir: PathBuf,
    base: RwLock<BaseStat>,
    /// Woken on every change (the daemon saves the state when woken).
    changed: Arc<tokio::sync::Notify>,
    /// Per-file content locks, striped by inode: a writer of an upper
    /// file holds its stripe shared from the write to the node's update,
    /// and a checkpoint hashing the file holds it exclusively, so the
    /// bytes hashed are always the node's bytes at one moment and their
    /// length is its size.
    content: [RwLock<()>; CONTENT_STRIPES],
    /// Upper files freed while a saved state may still name them: unlinked
    /// once a durable save no longer does ([`SnapshotFs::note_saved`]).
    /// Each blob number with the change count when it was freed.
    doomed: std::sync::Mutex<Vec<(u64, u64)>>,
    /// Held through a checkpoint, from its build to its rebase: a build
    /// notes its stat change against the base, which only a rebase moves.
    checkpointing: tokio::sync::Mutex<()>,
}

const CONTENT_STRIPES: usize = 64;

/// The base snapshot's stat object, which origins refer to.
#[derive(Default)]
struct BaseStat {
    /// Mtimes by path (mapped from the disk cache's `stat/flat/<id>`).
    mtimes: times::PathTimes,
    id: Option<Hash>,
    /// This mount's rebase wrote that file (not shared with other mounts).
    own_file: bool,
}

/// Decoded trees, bounded: a directory's tree is decoded again from its
/// local copy (the mapped index, or the disk cache) once it left, so memory
/// follows the directories in use, not the size of the snapshot.
pub(crate) struct TreeCache {
    pub(crate) map: HashMap<Hash, Arc<Tree>>,
    entries: usize,
    cap: usize,
}

impl Default for TreeCache {
    fn default() -> TreeCache {
        TreeCache { map: HashMap::new(), entries: 0, cap: TREE_ENTRIES_IN_MEMORY }
    }
}

/// Entries of decoded trees [`TreeCache`] holds before it starts over.
const TREE_ENTRIES_IN_MEMORY: usize = 1 << 16;

impl TreeCache {
    /// Entries held now, and the bound.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        (self.entries, self.cap)
    }

    #[cfg(test)]
    pub(crate) fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
    }

    pub(crate) fn get(&self, id: &Hash) -> Option<&Arc<Tree>> {
        self.map.get(id)
    }

    pub(crate) fn clear(&mut self) {
        self.map = HashMap::new();
        self.entries = 0;
    }

    pub(crate) fn keep(&mut self, id: Hash, t: Arc<Tree>) {
        if self.entries + t.entries.len() > self.cap {
            self.map.clear();
            self.entries = 0;
        }
        self.entries += t.entries.len();
        if let Some(old) = self.map.insert(id, t) {
            self.entries -= old.entries.len();
        }
    }
}

pub struct SnapshotFs {
    fetcher: Arc<Fetcher>,
    /// The root tree of the snapshot the lower layer is (a checkpoint of a
    /// read-write mount moves it: [`SnapshotFs::rebase`]).
    root: std::sync::Mutex<Hash>,
    time: i64,
    state: RwLock<State>,
    trees: RwLock<TreeCache>,
    upper: Option<Upper>,
    /// A read-only mount's mtimes by path (its snapshot's stat object).
    ro_mtimes: times::PathTimes,
    /// Bound on one read's wait for the network, in milliseconds.
    read_timeout_ms: AtomicU64,
    /// Reads served (for stats).
    reads: AtomicU64,
    /// Whether the kernel opens files without telling this process (FUSE's
    /// no-open mode): then every reference the kernel holds may be an open
    /// file, and an unlinked node's upper blob stays until it forgets it.
    untracked_opens: AtomicBool,
    /// The changes made, and what the newest save and checkpoint hold.
    tracker: Tracker,
    /// Large files: recent chunks and read-ahead.
    chunks: chunked::Chunks,
    /// Paths a loaded saved state named without their upper files.
    lost_on_load: Vec<Vec<u8>>,
}

/// Attributes a caller may set (`None`: leave as is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub mtime: Option<(i64, u32)>,
    pub atime: Option<(i64, u32)>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

fn timeout_err(what: &str, t: Duration) -> Error {
    Error::Io {
        context: format!("{what}: the store did not answer within {} s", t.as_secs()),
        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
    }
}

/// The user running this process (a mount's daemon runs as the user who
/// mounted): who owns every node no one chowned.
fn mount_owner() -> (u32, u32) {
    (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw())
}

/// A name a new entry may have: ENAMETOOLONG past 255 bytes, EINVAL for
/// what no tree may hold.
fn new_name_ok(name: &[u8]) -> Result<()> {
    if name.len() > crate::object::MAX_NAME_BYTES {
        return Err(Error::fs(Errno::NAMETOOLONG, "a name longer than 255 bytes"));
    }
    check_name(name).map_err(|m| Error::fs(Errno::INVAL, m))
}

fn now() -> (i64, u32) {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

fn read_only() -> Error {
    Error::fs(Errno::ROFS, "the snapshot is mounted read-only")
}

fn file_kind(perm: u16) -> Kind {
    if perm & 0o111 != 0 {
        Kind::Executable
    } else {
        Kind::File
    }
}

/// A stat object's mtimes by path (the root's under the empty path).
fn mtimes_by_path(stat: StatObject) -> times::PathTimes {
    times::PathTimes::new(&stat.entries)
}

/// A base stat object's mtimes as a read-write filesystem opens with them:
/// the object, or its flat copy the cache keeps (which needs no object:
/// at a million files decoding the object is most of a mount's start).
pub struct BaseTimes(Times);

enum Times {
    Object(StatObject),
    Kept(times::PathTimes),
}

impl From<StatObject> for BaseTimes {
    fn from(s: StatObject) -> BaseTimes {
        BaseTimes(Times::Object(s))
    }
}

impl BaseTimes {
    /// Stat object `id`'s flat copy in the cache, when it is there and
    /// sound.
    pub fn kept(fetcher: &Fetcher, id: &Hash) -> Option<BaseTimes> {
        times::PathTimes::open(&fetcher.cache.flat_times_path(id), id).map(|t| BaseTimes(Times::Kept(t)))
    }
}

impl SnapshotFs {
    /// The read-only filesystem of tree `root`.
    pub fn new(fetcher: Arc<Fetcher>, root: TreeId, time: i64) -> SnapshotFs {
        let root = root.hash();
        Self::with_state(fetcher, root, time, None, Self::fresh(root, (time, 0), 0o555))
    }

    /// The read-only filesystem of tree `root`, showing the mtimes of `stat`
    /// (its snapshot's stat object: a workspace checkpoint's).
    pub fn with_mtimes(fetcher: Arc<Fetcher>, root: TreeId, time: i64, stat: StatObject) -> SnapshotFs {
        let root = root.hash();
        let map = mtimes_by_path(stat);
        let mtime = map.get(b"").unwrap_or((time, 0));
        let mut fs = Self::with_state(fetcher, root, time, None, Self::fresh(root, mtime, 0o555));
        fs.ro_mtimes = map;
        fs
    }

    /// A read-write filesystem over tree `root`, with its upper layer in
    /// `upper_dir` and the mtimes of `base_stat` (the snapshot's stat object).
    pub fn writable(
        fetcher: Arc<Fetcher>,
        root: TreeId,
        time: i64,
        upper_dir: PathBuf,
        base_stat: Option<(Hash, BaseTimes)>,
    ) -> Result<SnapshotFs> {
        let root = root.hash();
        std::fs::create_dir_all(&upper_dir).map_err(Error::io(format!("creating {}", upper_dir.display())))?;
        let (id, map) = match base_stat {
            Some((id, BaseTimes(Times::Kept(map)))) => (Some(id), map),
            Some((id, BaseTimes(Times::Object(s)))) => {
                let at = fetcher.cache.flat_times_path(&id);
                let map = times::PathTimes::open(&at, &id).unwrap_or_else(|| mtimes_by_path(s).kept_at(&at, &id));
                (Some(id), map)
            }
            None => (None, times::PathTimes::default()),
        };
        let mtime = map.get(b"").unwrap_or((time, 0));
        let upper = Upper {
            dir: upper_dir,
            base: RwLock::new(BaseStat { mtimes: map, id, own_file: false }),
            changed: Arc::new(tokio::sync::Notify::new()),
            content: std::array::from_fn(|_| RwLock::new(())),
            doomed: Default::default(),
            checkpointing: Default::default(),
        };
        Ok(Self::with_state(fetcher, root, time, Some(upper), Self::fresh(root, mtime, 0o755)))
    }

    fn fresh(root: Hash, mtime: (i64, u32), perm: u16) -> State {
        let body = Body::Dir { clean: Some(root), origin: Some(Box::default()), children: None };
        State::with_root(Node::new(ROOT_INO, Name::from(&b""[..]), perm, mtime, body))
    }

    fn with_state(fetcher: Arc<Fetcher>, root: Hash, time: i64, upper: Option<Upper>, st: State) -> SnapshotFs {
        SnapshotFs {
            fetcher,
            root: std::sync::Mutex::new(root),
            time,
            state: RwLock::new(st),
            trees: RwLock::new(TreeCache::default()),
            upper,
            ro_mtimes: times::PathTimes::default(),
            read_timeout_ms: AtomicU64::new(DEFAULT_READ_TIMEOUT.as_millis() as u64),
            reads: AtomicU64::new(0),
            untracked_opens: AtomicBool::new(false),
            tracker: Tracker::default(),
            chunks: chunked::Chunks::default(),
            lost_on_load: Vec::new(),
        }
    }

    /// The root tree of the base snapshot.
    pub fn root(&self) -> TreeId {
        TreeId::from_hash(*self.root.lock().expect("root lock"))
    }

    pub fn fetcher(&self) -> &Arc<Fetcher> {
        &self.fetcher
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.read_timeout_ms.store(t.as_millis() as u64, Relaxed);
    }

    fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.read_timeout_ms.load(Relaxed))
    }

    /// Whether a file read in order is also written whole into the disk
    /// cache, for later opens to pass through (a mount whose kernel
    /// takes passthrough opens asks for it).
    pub fn set_assemble(&self, on: bool) {
        self.chunks.assemble.store(on, Relaxed);
    }

    /// The local folder whose filesystem holds what this mount writes (a
    /// workspace's upper layer) or reads (a snapshot's disk cache): what
    /// statfs reports on.
    pub fn local_dir(&self) -> PathBuf {
        match &self.upper {
            Some(u) => u.dir.clone(),
            None => self.fetcher.cache.root().to_path_buf(),
        }
    }

    pub fn is_writable(&self) -> bool {
        self.upper.is_some()
    }

    pub fn reads(&self) -> u64 {
        self.reads.load(Relaxed)
    }

    /// Woken on every change of a read-write mount.
    pub fn change_notifier(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.upper.as_ref().map(|u| u.changed.clone())
    }

    /// The mount's changes against its durable saves and checkpoints.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// Changes since the mount started (0 when read-only).
    pub fn changes(&self) -> u64 {
        self.tracker.changes()
    }

    fn changed(&self) {
        if let Some(u) = &self.upper {
            self.tracker.count_change();
            u.changed.notify_one();
        }
    }

    /// The one place that decides read-only: every change goes through
    /// here and is refused (EROFS) when there is no overlay.
    /// A checkpoint's turn: one at a time per mount (see `Upper::checkpointing`).
    pub async fn checkpoint_turn(&self) -> Result<tokio::sync::MutexGuard<'_, ()>> {
        Ok(self.overlay()?.checkpointing.lock().await)
    }

    fn overlay(&self) -> Result<&Upper> {
        self.upper.as_ref().ok_or_else(read_only)
    }

    /// The content lock of `ino`'s upper file (see [`Upper::content`]).
    fn content_lock(&self, ino: u64) -> Result<&RwLock<()>> {
        Ok(&self.overlay()?.content[(ino % CONTENT_STRIPES as u64) as usize])
    }

    fn writable_only(&self) -> Result<()> {
        self.overlay().map(drop)
    }

    fn upper_dir(&self) -> Result<PathBuf> {
        Ok(self.overlay()?.dir.clone())
    }

    fn blob_path(&self, blob: u64) -> Result<PathBuf> {
        Ok(self.upper_dir()?.join(blob.to_string()))
    }

    fn st(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().expect("state lock")
    }

    fn st_mut(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().expect("state lock")
    }

    fn attr_of(&self, st: &State, ino: u64) -> Result<Attr> {
        let n = st.get(ino)?;
        // A file's names (0 once unlinked, while a handle keeps it).
        let names = if ino == ROOT_INO { 1 } else { n.nlink() };
        let rdev = match n.body {
            Body::Special(_, rdev) => rdev,
            _ => 0,
        };
        let (kind, size, nlink) = match &n.body {
            Body::Dir { .. } => (NodeKind::Dir, 0, self.dir_links(st, &n.body)),
            Body::Lower(e) => match e.kind {
                Kind::Directory | Kind::Gitlink => (NodeKind::Dir, 0, self.dir_links(st, &n.body)),
                Kind::Symlink => (NodeKind::Symlink, e.size, names),
                Kind::File | Kind::Executable => (NodeKind::File, e.size, names),
            },
            Body::Upper { size, .. } => (NodeKind::File, *size, names),
            Body::Link(t) => (NodeKind::Symlink, t.len() as u64, names),
            Body::Special(k, _) => (*k, 0, names),
        };
        let perm = if kind == NodeKind::Symlink { 0o777 } else { n.perm };
        let meta = n.meta.as_deref();
        Ok(Attr {
            ino,
            kind,
            size,
            perm,
            nlink,
            mtime: n.mtime().0,
            mtime_ns: n.mtime().1,
            atime: meta.and_then(|m| m.atime).unwrap_or(n.mtime()),
            ctime: meta.and_then(|m| m.ctime).unwrap_or(n.mtime()),
            owner: meta.and_then(|m| m.owner),
            rdev,
        })
    }

    /// A directory's `nlink`, as a local filesystem counts it: 2 (its name
    /// and its `.`) plus one `..` per subdirectory. 1 ("not counted", as
    /// btrfs reports) for a directory whose tree is not in memory: never a
    /// count that would tell a walker it has no subdirectories.
    fn dir_links(&self, st: &State, body: &Body) -> u32 {
        let is_dir = |k: Kind| matches!(k, Kind::Directory | Kind::Gitlink);
        let from_tree =
            |id: &Hash| self.tree_now(id).map_or(1, |t| 2 + t.entries.iter().filter(|e| is_dir(e.kind)).count() as u32);
        match body {
            Body::Dir { children: Some(c), .. } => {
                2 + c.values().filter(|k| st.get(**k).is_ok_and(|n| Self::is_dir_body(&n.body))).count() as u32
            }
            Body::Dir { clean: Some(id), .. } => from_tree(id),
            Body::Lower(e) if e.kind == Kind::Directory => from_tree(&e.id),
            // A gitlink is an empty directory here.
            Body::Lower(_) => 2,
            Body::Dir { .. } | Body::Upper { .. } | Body::Link(_) | Body::Special(..) => 1,
        }
    }

    /// The permission bits a lower entry shows.
    fn perm_of(&self, k: Kind) -> u16 {
        let ro = self.upper.is_none();
        match (k, ro) {
            (Kind::File, true) => 0o444,
            (Kind::File, false) => 0o644,
            (Kind::Symlink, _) => 0o777,
            (_, true) => 0o555,
            (_, false) => 0o755,
        }
    }

    fn base_mtime(&self, origin: &[u8]) -> (i64, u32) {
        match &self.upper {
            Some(u) => u.base.read().expect("base stat lock").mtimes.get(origin),
            None => self.ro_mtimes.get(origin),
        }
        .unwrap_or((self.time, 0))
    }

    async fn timed<T>(&self, what: &str, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let t = self.read_timeout();
        tokio::time::timeout(t, fut).await.map_err(|_| timeout_err(what, t))?
    }
}
