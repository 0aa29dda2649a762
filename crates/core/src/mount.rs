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

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use rustix::io::Errno;

use crate::cache::DiskCache;
use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::hash::Hash;
use crate::import::Staged;
use crate::object::{check_name, ChunkManifest, Entry, Kind, Tree};
use crate::store::Space;
use crate::workspace::StatObject;

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
}

/// An open file: its content source.
pub enum OpenFile {
    /// A whole blob, with the cache file holding it (for passthrough).
    /// `ino` is set on a read-write mount, where the file may be copied up
    /// and written through another handle while this one is open.
    Whole { data: Bytes, cache_path: Option<PathBuf>, ino: Option<u64> },
    /// A chunked file: chunks are read as ranges are asked for.
    Chunked { entry: Entry, manifest: ChunkManifest, starts: Vec<u64>, ino: Option<u64> },
    /// A file of the upper layer, read (and written) in place.
    Upper { file: std::fs::File, ino: u64, writable: bool },
}

/// What a node holds.
#[derive(Clone, Debug)]
enum Body {
    /// A directory. `clean` is its tree id while nothing below changed;
    /// `children` is `None` until something looks into it (then `clean`
    /// is always set). `origin` is its path in the base snapshot, where
    /// the mtimes of an unexpanded subtree are found.
    Dir { clean: Option<Hash>, origin: Option<Vec<u8>>, children: Option<BTreeMap<Vec<u8>, u64>> },
    /// A file, symlink or gitlink of the lower layer, untouched.
    Lower(Entry),
    /// A file of the upper layer (`upper/<blob>`); `clean` is its id and
    /// chunking while its content is known.
    Upper { blob: u64, size: u64, clean: Option<(Hash, bool)> },
    /// A symlink made here.
    Link(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Node {
    /// 0 once unlinked.
    parent: u64,
    name: Vec<u8>,
    perm: u16,
    mtime: (i64, u32),
    /// Bumped on every content change (a checkpoint hashing a file keeps
    /// its id only if nothing wrote meanwhile).
    version: u64,
    /// References the kernel holds (entries it was given and has not
    /// forgotten): a node is dropped only when nothing but the kernel knew
    /// it and the kernel let go.
    lookups: u64,
    /// Open handles: an unlinked file's upper blob stays until the last one
    /// closes.
    opens: u32,
    /// Mode or mtime set by the user (kept in memory, so never collapsed).
    touched: bool,
    body: Body,
}

impl Node {
    fn new(parent: u64, name: Vec<u8>, perm: u16, mtime: (i64, u32), body: Body) -> Node {
        Node { parent, name, perm, mtime, version: 0, lookups: 0, opens: 0, touched: false, body }
    }
}

struct State {
    /// By inode number. Numbers are never reused within a mount, so a
    /// number the kernel still holds can never name another node.
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    next_blob: u64,
}

impl State {
    fn with_root(root: Node) -> State {
        State { nodes: HashMap::from([(ROOT_INO, root)]), next_ino: ROOT_INO + 1, next_blob: 1 }
    }

    fn get(&self, ino: u64) -> Result<&Node> {
        self.nodes.get(&ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
    }

    fn get_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
    }

    fn push(&mut self, n: Node) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, n);
        ino
    }

    /// The children of a loaded directory; `Ok(None)` if not loaded yet.
    fn children(&self, ino: u64) -> Result<Option<&BTreeMap<Vec<u8>, u64>>> {
        static EMPTY: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        match &self.get(ino)?.body {
            Body::Dir { children, .. } => Ok(children.as_ref()),
            Body::Lower(e) if e.kind == Kind::Gitlink => Ok(Some(&EMPTY)),
            _ => Err(Error::fs(Errno::NOTDIR, "not a directory")),
        }
    }

    fn child(&self, parent: u64, name: &[u8]) -> Result<u64> {
        let ch = self.children(parent)?.ok_or_else(|| Error::NotFound("directory not loaded".into()))?;
        ch.get(name).copied().ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))
    }

    fn children_mut(&mut self, ino: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>> {
        match &mut self.get_mut(ino)?.body {
            Body::Dir { children: Some(c), .. } => Ok(c),
            Body::Lower(e) if e.kind == Kind::Gitlink => {
                Err(Error::fs(Errno::PERM, "a submodule's directory cannot be changed"))
            }
            _ => Err(Error::fs(Errno::NOTDIR, "not a directory")),
        }
    }

    /// Marks `ino` and every directory above it as changed. Clean
    /// directories only ever sit below clean ones, so this stops at the
    /// first directory already changed.
    fn dirty(&mut self, mut ino: u64) {
        loop {
            let Ok(n) = self.get_mut(ino) else { return };
            n.version += 1;
            if let Body::Dir { clean, .. } = &mut n.body {
                if clean.is_none() && ino != ROOT_INO {
                    // Already changed: its ancestors are too.
                    return;
                }
                *clean = None;
            }
            if ino == ROOT_INO || n.parent == 0 {
                return;
            }
            ino = n.parent;
        }
    }

    /// A directory whose entries changed: new mtime, changed tree.
    fn touch_dir(&mut self, ino: u64) {
        if let Ok(n) = self.get_mut(ino) {
            n.mtime = now();
        }
        self.dirty(ino);
    }

    fn is_ancestor(&self, a: u64, mut b: u64) -> bool {
        loop {
            if a == b {
                return true;
            }
            match self.get(b) {
                Ok(n) if b != ROOT_INO && n.parent != 0 => b = n.parent,
                _ => return false,
            }
        }
    }
}

/// The upper layer of a read-write mount.
struct Upper {
    dir: PathBuf,
    /// Mtimes of the base snapshot by path (origins refer to it).
    base_stat: BTreeMap<Vec<u8>, (i64, u32)>,
    base_stat_id: Option<Hash>,
    /// Woken on every change (the daemon saves the state when woken).
    changed: Arc<tokio::sync::Notify>,
    changes: AtomicU64,
}

pub struct SnapshotFs {
    fetcher: Arc<Fetcher>,
    root: Hash,
    time: i64,
    state: RwLock<State>,
    trees: RwLock<HashMap<Hash, Arc<Tree>>>,
    upper: Option<RwLock<Upper>>,
    /// Bound on one read's wait for the network, in milliseconds.
    read_timeout_ms: AtomicU64,
    /// Reads served (for stats).
    reads: AtomicU64,
}

/// What a checkpoint of a read-write mount staged.
#[derive(Debug)]
pub struct Built {
    pub root: Hash,
    pub stat: StatObject,
    /// Files hashed because they were written since the last checkpoint.
    pub files_read: u64,
    /// Files of the upper layer whose id was already known.
    pub files_unchanged: u64,
    /// Directories re-encoded.
    pub trees_built: u64,
}

/// Attributes a caller may set (`None`: leave as is).
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub mtime: Option<(i64, u32)>,
}

fn timeout_err(what: &str, t: Duration) -> Error {
    Error::Io {
        context: format!("{what}: the store did not answer within {} s", t.as_secs()),
        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
    }
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

impl SnapshotFs {
    /// The read-only filesystem of tree `root`.
    pub fn new(fetcher: Arc<Fetcher>, root: Hash, time: i64) -> SnapshotFs {
        Self::with_state(fetcher, root, time, None, Self::fresh(root, (time, 0), 0o555))
    }

    /// A read-write filesystem over tree `root`, with its upper layer in
    /// `upper_dir` and the mtimes of `base_stat` (the snapshot's stat object).
    pub fn writable(
        fetcher: Arc<Fetcher>,
        root: Hash,
        time: i64,
        upper_dir: PathBuf,
        base_stat: Option<(Hash, StatObject)>,
    ) -> Result<SnapshotFs> {
        std::fs::create_dir_all(&upper_dir).map_err(Error::io(format!("creating {}", upper_dir.display())))?;
        let (id, map) = match base_stat {
            Some((id, s)) => (Some(id), s.entries.into_iter().map(|(p, s, n)| (p, (s, n))).collect()),
            None => (None, BTreeMap::new()),
        };
        let mtime = map.get(&Vec::new()).copied().unwrap_or((time, 0));
        let upper = Upper {
            dir: upper_dir,
            base_stat: map,
            base_stat_id: id,
            changed: Arc::new(tokio::sync::Notify::new()),
            changes: AtomicU64::new(0),
        };
        Ok(Self::with_state(fetcher, root, time, Some(upper), Self::fresh(root, mtime, 0o755)))
    }

    fn fresh(root: Hash, mtime: (i64, u32), perm: u16) -> State {
        let body = Body::Dir { clean: Some(root), origin: Some(Vec::new()), children: None };
        State::with_root(Node::new(ROOT_INO, Vec::new(), perm, mtime, body))
    }

    fn with_state(fetcher: Arc<Fetcher>, root: Hash, time: i64, upper: Option<Upper>, st: State) -> SnapshotFs {
        SnapshotFs {
            fetcher,
            root,
            time,
            state: RwLock::new(st),
            trees: RwLock::new(HashMap::new()),
            upper: upper.map(RwLock::new),
            read_timeout_ms: AtomicU64::new(DEFAULT_READ_TIMEOUT.as_millis() as u64),
            reads: AtomicU64::new(0),
        }
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

    pub fn is_writable(&self) -> bool {
        self.upper.is_some()
    }

    pub fn reads(&self) -> u64 {
        self.reads.load(Relaxed)
    }

    /// Woken on every change of a read-write mount.
    pub fn change_notifier(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.upper.as_ref().map(|u| u.read().expect("upper lock").changed.clone())
    }

    /// Changes since the mount started (0 when read-only).
    pub fn changes(&self) -> u64 {
        self.upper.as_ref().map(|u| u.read().expect("upper lock").changes.load(Relaxed)).unwrap_or(0)
    }

    fn changed(&self) {
        if let Some(u) = &self.upper {
            let u = u.read().expect("upper lock");
            u.changes.fetch_add(1, Relaxed);
            u.changed.notify_one();
        }
    }

    fn upper_dir(&self) -> Result<PathBuf> {
        Ok(self.upper.as_ref().ok_or_else(read_only)?.read().expect("upper lock").dir.clone())
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

    fn attr_of(&self, ino: u64, n: &Node) -> Attr {
        let (kind, size, nlink) = match &n.body {
            Body::Dir { .. } => (NodeKind::Dir, 0, 2),
            Body::Lower(e) => match e.kind {
                Kind::Directory | Kind::Gitlink => (NodeKind::Dir, 0, 2),
                Kind::Symlink => (NodeKind::Symlink, e.size, 1),
                Kind::File | Kind::Executable => (NodeKind::File, e.size, 1),
            },
            Body::Upper { size, .. } => (NodeKind::File, *size, 1),
            Body::Link(t) => (NodeKind::Symlink, t.len() as u64, 1),
        };
        let perm = if kind == NodeKind::Symlink { 0o777 } else { n.perm };
        Attr { ino, kind, size, perm, nlink, mtime: n.mtime.0, mtime_ns: n.mtime.1 }
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
        self.upper
            .as_ref()
            .and_then(|u| u.read().expect("upper lock").base_stat.get(origin).copied())
            .unwrap_or((self.time, 0))
    }

    /// The tree of a directory, if already in memory.
    fn tree_now(&self, id: &Hash) -> Option<Arc<Tree>> {
        self.trees.read().expect("trees lock").get(id).cloned()
    }

    async fn tree_by_id(&self, id: Hash, name: &str) -> Result<Arc<Tree>> {
        if let Some(t) = self.tree_now(&id) {
            return Ok(t);
        }
        let t = self.timed("reading a directory", self.fetcher.tree(id, name)).await?;
        let t = Arc::new(t);
        self.trees.write().expect("trees lock").insert(id, t.clone());
        Ok(t)
    }

    /// Fills in the children of directory `ino` from `tree`.
    fn expand(&self, st: &mut State, ino: u64, tree: &Tree) {
        let Ok(n) = st.get(ino) else { return };
        let Body::Dir { children: None, origin, .. } = &n.body else { return };
        let origin = origin.clone();
        let mut kids = BTreeMap::new();
        for e in &tree.entries {
            let o = origin.as_ref().map(|o| join(o, &e.name));
            let mtime = o.as_deref().map(|o| self.base_mtime(o)).unwrap_or((self.time, 0));
            let body = match e.kind {
                Kind::Directory => Body::Dir { clean: Some(e.id), origin: o, children: None },
                _ => Body::Lower(e.clone()),
            };
            let node = Node::new(ino, e.name.clone(), self.perm_of(e.kind), mtime, body);
            kids.insert(e.name.clone(), st.push(node));
        }
        if let Ok(Node { body: Body::Dir { children, .. }, .. }) = st.get_mut(ino) {
            *children = Some(kids);
        }
    }

    /// Under the write lock: makes sure directory `ino`'s children are
    /// loaded. A directory whose children were folded away (or never
    /// loaded) has its tree in memory by then (`load` fetched it; folding
    /// requires it), so this never waits; a request that raced a fold
    /// sees the same children again.
    fn loaded(&self, st: &mut State, ino: u64) -> Result<()> {
        if let Body::Dir { children: None, clean: Some(id), .. } = &st.get(ino)?.body {
            let id = *id;
            let t = self
                .tree_now(&id)
                .ok_or_else(|| Error::fs(Errno::IO, format!("the tree of inode {ino} left memory")))?;
            self.expand(st, ino, &t);
        }
        Ok(())
    }

    /// Loads directory `ino`'s children if its tree is in memory:
    /// `None` when it must be fetched first.
    fn load_now(&self, ino: u64) -> Option<Result<()>> {
        let id = {
            let st = self.st();
            match st.children(ino) {
                Err(e) => return Some(Err(e)),
                Ok(Some(_)) => return Some(Ok(())),
                Ok(None) => match &st.get(ino).map(|n| &n.body) {
                    Ok(Body::Dir { clean: Some(id), .. }) => *id,
                    _ => return Some(Err(Error::NotFound(format!("inode {ino}")))),
                },
            }
        };
        let t = self.tree_now(&id)?;
        let mut st = self.st_mut();
        self.expand(&mut st, ino, &t);
        Some(Ok(()))
    }

    /// Loads directory `ino`'s children, fetching its tree if needed.
    async fn load(&self, ino: u64) -> Result<()> {
        loop {
            if let Some(r) = self.load_now(ino) {
                return r;
            }
            let (id, name) = {
                let st = self.st();
                let n = st.get(ino)?;
                match &n.body {
                    Body::Dir { clean: Some(id), .. } => (*id, String::from_utf8_lossy(&n.name).into_owned()),
                    _ => return Err(Error::NotFound(format!("inode {ino}"))),
                }
            };
            self.tree_by_id(id, &name).await?;
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let st = self.st();
        Ok(self.attr_of(ino, st.get(ino)?))
    }

    /// The child's attributes; with `count`, the kernel's reference to it
    /// is counted under the same lock (so no fold can drop it between the
    /// answer and the count).
    fn lookup_loaded(&self, parent: u64, name: &[u8], count: bool) -> Result<Attr> {
        let mut st = self.st_mut();
        self.loaded(&mut st, parent)?;
        let ino = st.child(parent, name)?;
        let n = st.get_mut(ino)?;
        if count {
            n.lookups += 1;
        }
        Ok(self.attr_of(ino, n))
    }

    /// Lookup without waiting: `None` when the parent's tree is not in memory.
    pub fn lookup_now(&self, parent: u64, name: &[u8]) -> Option<Result<Attr>> {
        Some(self.load_now(parent)?.and_then(|_| self.lookup_loaded(parent, name, false)))
    }

    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.load(parent).await?;
        self.lookup_loaded(parent, name, false)
    }

    /// [`SnapshotFs::lookup_now`] for the kernel: the answer is a reference
    /// it holds until FORGET.
    pub fn lookup_now_counted(&self, parent: u64, name: &[u8]) -> Option<Result<Attr>> {
        Some(self.load_now(parent)?.and_then(|_| self.lookup_loaded(parent, name, true)))
    }

    /// [`SnapshotFs::lookup`] for the kernel (see `lookup_now_counted`).
    pub async fn lookup_counted(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.load(parent).await?;
        self.lookup_loaded(parent, name, true)
    }

    /// The children with their attributes; those from index `count_from`
    /// on are counted as references the kernel takes.
    fn list(&self, ino: u64, count_from: Option<usize>) -> Result<DirList> {
        let mut st = self.st_mut();
        self.loaded(&mut st, ino)?;
        let kids: Vec<(Vec<u8>, u64)> = st
            .children(ino)?
            .ok_or_else(|| Error::NotFound("directory not loaded".into()))?
            .iter()
            .map(|(n, c)| (n.clone(), *c))
            .collect();
        kids.into_iter()
            .enumerate()
            .map(|(i, (name, c))| {
                let n = st.get_mut(c)?;
                if count_from.is_some_and(|from| i >= from) {
                    n.lookups += 1;
                }
                Ok((name, self.attr_of(c, n)))
            })
            .collect()
    }

    /// Entries of a directory with their attributes.
    pub fn readdir_now(&self, ino: u64) -> Option<Result<DirList>> {
        Some(self.load_now(ino)?.and_then(|_| self.list(ino, None)))
    }

    pub async fn readdir(&self, ino: u64) -> Result<DirList> {
        self.load(ino).await?;
        self.list(ino, None)
    }

    /// Entries for READDIRPLUS: those from index `from` on are references
    /// the kernel may take, counted under the listing's lock; the caller
    /// gives back ([`SnapshotFs::uncount`]) the ones that did not fit.
    pub fn readdir_now_counted(&self, ino: u64, from: usize) -> Option<Result<DirList>> {
        Some(self.load_now(ino)?.and_then(|_| self.list(ino, Some(from))))
    }

    /// [`SnapshotFs::readdir_now_counted`], fetching the tree if needed.
    pub async fn readdir_counted(&self, ino: u64, from: usize) -> Result<DirList> {
        self.load(ino).await?;
        self.list(ino, Some(from))
    }

    /// Takes back references counted for entries the kernel never got.
    /// Unlike FORGET it tries no folding: a READDIRPLUS of a large
    /// directory gives most of its entries back on every call, and
    /// folding is judged on the next real FORGET.
    pub fn uncount(&self, inos: &[u64]) {
        let mut st = self.st_mut();
        for ino in inos {
            if let Ok(n) = st.get_mut(*ino) {
                n.lookups = n.lookups.saturating_sub(1);
            }
            self.reap(&mut st, *ino);
        }
    }

    /// The parent inode of a directory (for `..`).
    pub fn parent_of(&self, ino: u64) -> u64 {
        self.st().get(ino).map(|n| n.parent).ok().filter(|p| *p != 0).unwrap_or(ROOT_INO)
    }

    async fn timed<T>(&self, what: &str, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let t = self.read_timeout();
        tokio::time::timeout(t, fut).await.map_err(|_| timeout_err(what, t))?
    }

    pub async fn readlink(&self, ino: u64) -> Result<Bytes> {
        let body = self.st().get(ino)?.body.clone();
        match body {
            Body::Link(t) => Ok(Bytes::from(t)),
            Body::Lower(e) if e.kind == Kind::Symlink => {
                self.timed("reading a symlink", self.fetcher.content(&e, "")).await
            }
            _ => Err(Error::fs(Errno::INVAL, "not a symlink")),
        }
    }

    /// Opens a file for reading: brings its content in (through its pack
    /// on a cold read), so reads of a whole blob need no further request.
    pub async fn open(&self, ino: u64) -> Result<OpenFile> {
        let body = self.st().get(ino)?.body.clone();
        let e = match body {
            Body::Upper { .. } => {
                let file = self.open_upper(ino, false)?;
                return Ok(OpenFile::Upper { file, ino, writable: false });
            }
            Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable) => e,
            Body::Dir { .. } | Body::Lower(_) => return Err(Error::fs(Errno::ISDIR, "not a regular file")),
            Body::Link(_) => return Err(Error::fs(Errno::LOOP, "a symlink")),
        };
        let path = String::from_utf8_lossy(&e.name).into_owned();
        if e.chunked {
            let manifest = self.timed("opening a file", self.fetcher.manifest(&e, &path)).await?;
            let mut starts = Vec::with_capacity(manifest.chunks.len());
            let mut at = 0;
            for (len, _) in &manifest.chunks {
                starts.push(at);
                at += len;
            }
            let ino = self.is_writable().then_some(ino);
            return Ok(OpenFile::Chunked { entry: e, manifest, starts, ino });
        }
        let data = self.timed("opening a file", self.fetcher.content(&e, &path)).await?;
        let p = self.fetcher.cache.entry_path(&e.id);
        let cache_path = p.exists().then_some(p);
        self.count_open(ino)?;
        Ok(OpenFile::Whole { data, cache_path, ino: self.is_writable().then_some(ino) })
    }

    /// Counts a new handle of `ino`. A node that was unlinked while no
    /// handle held it is gone (its upper blob may be deleted already).
    fn count_open(&self, ino: u64) -> Result<()> {
        let mut st = self.st_mut();
        let n = st.get_mut(ino)?;
        if ino != ROOT_INO && n.parent == 0 && n.opens == 0 {
            return Err(Error::NotFound(format!("inode {ino} was removed")));
        }
        n.opens += 1;
        Ok(())
    }

    /// Opens the upper file of `ino` and counts the handle, under the lock
    /// that unlink takes: the blob cannot go between the check and the open.
    fn open_upper(&self, ino: u64, write: bool) -> Result<std::fs::File> {
        let mut st = self.st_mut();
        let n = st.get_mut(ino)?;
        if ino != ROOT_INO && n.parent == 0 && n.opens == 0 {
            return Err(Error::NotFound(format!("inode {ino} was removed")));
        }
        let Body::Upper { blob, .. } = n.body else {
            return Err(Error::fs(Errno::NOENT, "the file changed while it was being opened"));
        };
        let p = self.blob_path(blob)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(&p)
            .map_err(Error::io(format!("opening {}", p.display())))?;
        n.opens += 1;
        Ok(file)
    }

    /// A handle of `ino` was closed. The last close of an unlinked file
    /// deletes its upper blob; a node neither open nor known to the kernel
    /// any more is dropped.
    pub fn release(&self, ino: u64) {
        let mut st = self.st_mut();
        let Ok(n) = st.get_mut(ino) else { return };
        n.opens = n.opens.saturating_sub(1);
        self.reap(&mut st, ino);
    }

    /// The kernel took `n` more references to `ino` (an entry reply, or an
    /// entry of a READDIRPLUS reply).
    pub fn note_lookup(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Ok(node) = self.st_mut().get_mut(ino) {
            node.lookups += n;
        }
    }

    /// The kernel dropped `n` references to `ino` (FORGET).
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut st = self.st_mut();
        let Ok(node) = st.get_mut(ino) else { return };
        node.lookups = node.lookups.saturating_sub(n);
        if node.parent == 0 {
            self.reap(&mut st, ino);
        } else {
            let parent = node.parent;
            self.collapse(&mut st, parent);
        }
    }

    /// Drops a detached node nothing holds (and its blob, once no handle
    /// has it open). Returns whether `ino` is gone.
    fn reap(&self, st: &mut State, ino: u64) -> bool {
        let Ok(n) = st.get(ino) else { return true };
        if ino == ROOT_INO || n.parent != 0 || n.opens > 0 {
            return false;
        }
        if let Body::Upper { blob, .. } = n.body {
            if let Ok(p) = self.blob_path(blob) {
                let _ = std::fs::remove_file(p);
            }
        }
        if n.lookups == 0 {
            st.nodes.remove(&ino);
            return true;
        }
        false
    }

    /// Folds the children of clean directory `dir` back into its tree id
    /// when none of them is changed, open or known to the kernel: memory
    /// follows what is changed or in use, not what was ever walked.
    fn collapse(&self, st: &mut State, mut dir: u64) {
        // Folding a directory makes it an idle leaf of its parent: go up
        // while that folds too (`collapse_one` judges every child, the
        // directory just folded included).
        while dir != ROOT_INO && self.collapse_one(st, dir) {
            // Only an attached directory folds, so it has a parent.
            dir = match st.get(dir) {
                Ok(n) => n.parent,
                Err(_) => return,
            };
        }
        if dir == ROOT_INO {
            self.collapse_one(st, dir);
        }
    }

    fn collapse_one(&self, st: &mut State, dir: u64) -> bool {
        let Ok(Node { body: Body::Dir { clean: Some(id), children: Some(kids), .. }, .. }) = st.get(dir) else {
            return false;
        };
        // Only a tree in memory can be unfolded again without waiting.
        if self.tree_now(id).is_none() {
            return false;
        }
        let idle = |c: &u64| {
            st.get(*c).is_ok_and(|n| {
                n.lookups == 0
                    && n.opens == 0
                    && !n.touched
                    && matches!(n.body, Body::Lower(_) | Body::Dir { clean: Some(_), children: None, .. })
            })
        };
        if !kids.values().all(idle) {
            return false;
        }
        let kids: Vec<u64> = kids.values().copied().collect();
        for k in kids {
            st.nodes.remove(&k);
        }
        if let Ok(Node { body: Body::Dir { children, .. }, .. }) = st.get_mut(dir) {
            *children = None;
        }
        true
    }

    /// How many nodes are in memory (for stats and memory tests).
    pub fn node_count(&self) -> usize {
        self.st().nodes.len()
    }

    /// Opens a file for writing (copying it up first).
    pub async fn open_for_write(&self, ino: u64) -> Result<OpenFile> {
        self.copy_up(ino).await?;
        let file = self.open_upper(ino, true)?;
        Ok(OpenFile::Upper { file, ino, writable: true })
    }

    /// Makes `ino` a file of the upper layer; returns its blob number.
    async fn copy_up(&self, ino: u64) -> Result<u64> {
        if self.upper.is_none() {
            return Err(read_only());
        }
        let e = match self.st().get(ino)?.body.clone() {
            Body::Upper { blob, .. } => return Ok(blob),
            Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable) => e,
            Body::Dir { .. } | Body::Lower(_) => return Err(Error::fs(Errno::ISDIR, "not a regular file")),
            Body::Link(_) => return Err(Error::fs(Errno::LOOP, "a symlink")),
        };
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let data = self.timed("copying a file up", self.fetcher.content(&e, &name)).await?;
        let blob = self.new_blob()?;
        let p = self.blob_path(blob)?;
        let perm = self.st().get(ino)?.perm;
        write_upper(&p, &data, perm)?;
        let mut st = self.st_mut();
        let n = st.get_mut(ino)?;
        match &n.body {
            Body::Lower(cur) if cur.id == e.id => {
                n.body = Body::Upper { blob, size: data.len() as u64, clean: Some((e.id, e.chunked)) };
                drop(st);
                self.changed();
                Ok(blob)
            }
            Body::Upper { blob: b, .. } => {
                // Another open copied it up first.
                let b = *b;
                drop(st);
                let _ = std::fs::remove_file(&p);
                Ok(b)
            }
            _ => Err(Error::fs(Errno::NOENT, "the file changed while it was being copied up")),
        }
    }

    fn new_blob(&self) -> Result<u64> {
        let mut st = self.st_mut();
        st.next_blob += 1;
        Ok(st.next_blob - 1)
    }

    /// `size` bytes at `offset` of an open file (fewer at the end).
    pub async fn read(&self, f: &OpenFile, offset: u64, size: u32) -> Result<Bytes> {
        self.reads.fetch_add(1, Relaxed);
        if let OpenFile::Whole { ino: Some(ino), .. } | OpenFile::Chunked { ino: Some(ino), .. } = f {
            // Opened from the lower layer: once another handle copied the
            // file up, its bytes are the upper file's (a reader sees every
            // completed write).
            let blob = match &self.st().get(*ino)?.body {
                Body::Upper { blob, .. } => Some(*blob),
                _ => None,
            };
            if let Some(blob) = blob {
                let p = self.blob_path(blob)?;
                let file = std::fs::File::open(&p).map_err(Error::io(format!("opening {}", p.display())))?;
                return read_upper(&file, offset, size);
            }
        }
        match f {
            OpenFile::Whole { data, .. } => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                Ok(data.slice(start..end))
            }
            OpenFile::Upper { file, .. } => read_upper(file, offset, size),
            OpenFile::Chunked { entry, manifest, starts, .. } => {
                let end = (offset + size as u64).min(manifest.size);
                if offset >= end {
                    return Ok(Bytes::new());
                }
                let first = starts.partition_point(|s| *s <= offset) - 1;
                let last = starts.partition_point(|s| *s < end) - 1;
                let me = self.fetcher.clone();
                let name = String::from_utf8_lossy(&entry.name).into_owned();
                let parts: Vec<Bytes> = self
                    .timed(
                        "reading a file",
                        futures::stream::iter((first..=last).map(|i| {
                            let me = me.clone();
                            let id = manifest.chunks[i].1;
                            let name = name.clone();
                            async move { me.get(Space::Objects, id, "chunk").await.map_err(|e| e.at_path(&name)) }
                        }))
                        .buffered(8)
                        .try_collect(),
                    )
                    .await?;
                let mut out = Vec::with_capacity((end - offset) as usize);
                for (k, p) in parts.iter().enumerate() {
                    let cs = starts[first + k];
                    let from = offset.saturating_sub(cs) as usize;
                    let to = ((end - cs) as usize).min(p.len());
                    out.extend_from_slice(&p[from.min(to)..to]);
                }
                Ok(Bytes::from(out))
            }
        }
    }

    /// Writes `data` at `offset` of a file opened for writing.
    pub fn write(&self, f: &OpenFile, offset: u64, data: &[u8]) -> Result<u32> {
        let OpenFile::Upper { file, ino, writable: true } = f else {
            return Err(Error::fs(Errno::BADF, "the file is not open for writing"));
        };
        file.write_all_at(data, offset).map_err(Error::io("writing to the upper layer"))?;
        let mut st = self.st_mut();
        let n = st.get_mut(*ino)?;
        if let Body::Upper { size, clean, .. } = &mut n.body {
            *size = (*size).max(offset + data.len() as u64);
            *clean = None;
        }
        n.mtime = now();
        st.dirty(*ino);
        drop(st);
        self.changed();
        Ok(data.len() as u32)
    }

    /// chmod, truncate and utimes.
    pub async fn setattr(&self, ino: u64, a: SetAttr) -> Result<Attr> {
        if self.upper.is_none() {
            return Err(read_only());
        }
        if let Some(size) = a.size {
            let blob = self.copy_up(ino).await?;
            let p = self.blob_path(blob)?;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .map_err(Error::io(format!("opening {}", p.display())))?;
            f.set_len(size).map_err(Error::io(format!("truncating {}", p.display())))?;
            let mut st = self.st_mut();
            let n = st.get_mut(ino)?;
            if let Body::Upper { size: s, clean, .. } = &mut n.body {
                *s = size;
                *clean = None;
            }
            n.mtime = now();
            st.dirty(ino);
        }
        {
            let mut st = self.st_mut();
            let n = st.get_mut(ino)?;
            if a.mode.is_some() || a.mtime.is_some() {
                n.touched = true;
            }
            if let Some(mode) = a.mode {
                let before = n.perm & 0o111 != 0;
                n.perm = (mode & 0o7777) as u16;
                if let Body::Upper { blob, .. } = n.body {
                    // The upper copy follows (best effort: the node is what counts).
                    if let Ok(p) = self.blob_path(blob) {
                        use std::os::unix::fs::PermissionsExt;
                        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(upper_mode(n.perm)));
                    }
                }
                let is_file = matches!(&n.body, Body::Upper { .. })
                    || matches!(&n.body, Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable));
                if is_file && before != (n.perm & 0o111 != 0) {
                    // The exec bit is in the tree entry.
                    st.dirty(ino);
                }
            }
            if let Some(t) = a.mtime {
                st.get_mut(ino)?.mtime = t;
            }
        }
        self.changed();
        self.getattr(ino)
    }

    /// Adds node `n` named `name` to directory `parent`.
    async fn insert(&self, parent: u64, name: &[u8], n: impl FnOnce(u64) -> Node) -> Result<Attr> {
        if self.upper.is_none() {
            return Err(read_only());
        }
        check_name(name).map_err(|m| Error::fs(Errno::INVAL, m))?;
        self.load(parent).await?;
        let mut st = self.st_mut();
        self.loaded(&mut st, parent)?;
        if st.children_mut(parent)?.contains_key(name) {
            return Err(Error::fs(Errno::EXIST, String::from_utf8_lossy(name).into_owned()));
        }
        let ino = st.push(n(parent));
        st.children_mut(parent)?.insert(name.to_vec(), ino);
        st.touch_dir(parent);
        let a = self.attr_of(ino, st.get(ino)?);
        drop(st);
        self.changed();
        Ok(a)
    }

    /// Creates an empty file and opens it for writing.
    pub async fn create(&self, parent: u64, name: &[u8], mode: u32) -> Result<(Attr, OpenFile)> {
        let blob = self.new_blob()?;
        let p = self.blob_path(blob)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(upper_mode(mode as u16))
            .open(&p)
            .map_err(Error::io(format!("creating {}", p.display())))?;
        let node = |parent| {
            let mut n = Node::new(
                parent,
                name.to_vec(),
                (mode & 0o7777) as u16,
                now(),
                Body::Upper { blob, size: 0, clean: None },
            );
            // Created open: the handle is released like any other.
            n.opens = 1;
            n
        };
        match self.insert(parent, name, node).await {
            Ok(a) => Ok((a, OpenFile::Upper { file, ino: a.ino, writable: true })),
            Err(e) => {
                let _ = std::fs::remove_file(&p);
                Err(e)
            }
        }
    }

    pub async fn mkdir(&self, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        let body = Body::Dir { clean: None, origin: None, children: Some(BTreeMap::new()) };
        self.insert(parent, name, |parent| Node::new(parent, name.to_vec(), (mode & 0o7777) as u16, now(), body)).await
    }

    pub async fn symlink(&self, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::fs(Errno::INVAL, "empty symlink target"));
        }
        let body = Body::Link(target.to_vec());
        self.insert(parent, name, |parent| Node::new(parent, name.to_vec(), 0o777, now(), body)).await
    }

    /// Detaches `ino` (already removed from its parent's children); its
    /// upper blob goes now, or with the last handle still open on it.
    fn detach(&self, st: &mut State, ino: u64) {
        if let Ok(n) = st.get_mut(ino) {
            n.parent = 0;
        }
        self.reap(st, ino);
    }

    fn is_dir_body(b: &Body) -> bool {
        matches!(b, Body::Dir { .. }) || matches!(b, Body::Lower(e) if e.kind == Kind::Gitlink)
    }

    /// Whether `ino` may go as a directory (`as_dir`: rmdir, or replaced by
    /// a directory) or as a non-directory (unlink, or replaced by a file):
    /// the kinds must agree and a directory must be empty (and loaded).
    fn may_remove(st: &State, ino: u64, as_dir: bool) -> Result<()> {
        match (as_dir, Self::is_dir_body(&st.get(ino)?.body)) {
            (true, false) => Err(Error::fs(Errno::NOTDIR, "not a directory")),
            (false, true) => Err(Error::fs(Errno::ISDIR, "a directory")),
            (true, true) if st.children(ino)?.is_some_and(|c| !c.is_empty()) => {
                Err(Error::fs(Errno::NOTEMPTY, "directory not empty"))
            }
            _ => Ok(()),
        }
    }

    pub async fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false).await
    }

    pub async fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true).await
    }

    async fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        if self.upper.is_none() {
            return Err(read_only());
        }
        self.load(parent).await?;
        let ino = self.st().child(parent, name)?;
        if dir && matches!(self.st().get(ino)?.body, Body::Dir { .. }) {
            self.load(ino).await?;
        }
        let mut st = self.st_mut();
        self.loaded(&mut st, parent)?;
        let ino = st.child(parent, name)?;
        if dir && matches!(st.get(ino)?.body, Body::Dir { .. }) {
            // Its emptiness is judged on its loaded children, never on a
            // folded directory.
            self.loaded(&mut st, ino)?;
        }
        Self::may_remove(&st, ino, dir)?;
        st.children_mut(parent)?.remove(name);
        self.detach(&mut st, ino);
        st.touch_dir(parent);
        drop(st);
        self.changed();
        Ok(())
    }

    /// Moves `parent/name` to `new_parent/new_name`, replacing a file or an
    /// empty directory there (unless `no_replace`).
    pub async fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        no_replace: bool,
    ) -> Result<()> {
        if self.upper.is_none() {
            return Err(read_only());
        }
        check_name(new_name).map_err(|m| Error::fs(Errno::INVAL, m))?;
        self.load(parent).await?;
        self.load(new_parent).await?;
        let target = self.st().child(new_parent, new_name).ok();
        if let Some(t) = target {
            if matches!(self.st().get(t)?.body, Body::Dir { .. }) {
                self.load(t).await?;
            }
        }
        let mut st = self.st_mut();
        self.loaded(&mut st, parent)?;
        self.loaded(&mut st, new_parent)?;
        if let Ok(t) = st.child(new_parent, new_name) {
            if matches!(st.get(t)?.body, Body::Dir { .. }) {
                self.loaded(&mut st, t)?;
            }
        }
        let src = st.child(parent, name)?;
        let src_dir = Self::is_dir_body(&st.get(src)?.body);
        if src_dir && st.is_ancestor(src, new_parent) {
            return Err(Error::fs(Errno::INVAL, "cannot move a directory into itself"));
        }
        if let Ok(t) = st.child(new_parent, new_name) {
            if t == src {
                return Ok(());
            }
            if no_replace {
                return Err(Error::fs(Errno::EXIST, String::from_utf8_lossy(new_name).into_owned()));
            }
            Self::may_remove(&st, t, src_dir)?;
            st.children_mut(new_parent)?.remove(new_name);
            self.detach(&mut st, t);
        }
        st.children_mut(parent)?.remove(name);
        st.children_mut(new_parent)?.insert(new_name.to_vec(), src);
        let n = st.get_mut(src)?;
        n.parent = new_parent;
        n.name = new_name.to_vec();
        st.touch_dir(parent);
        st.touch_dir(new_parent);
        drop(st);
        self.changed();
        Ok(())
    }

    /// Loads every tree of the snapshot into memory (from the attached
    /// index, or fetched level by level), so metadata needs no network.
    pub async fn preload_trees(&self) -> Result<usize> {
        let mut level = vec![self.root];
        let mut n = 0;
        while !level.is_empty() {
            let trees: Vec<Arc<Tree>> = futures::stream::iter(level.iter().map(|id| self.tree_by_id(*id, "")))
                .buffered(crate::store::CONCURRENCY)
                .try_collect()
                .await?;
            n += trees.len();
            level = trees
                .iter()
                .flat_map(|t| t.entries.iter().filter(|c| c.kind == Kind::Directory).map(|c| c.id))
                .filter(|id| self.tree_now(id).is_none())
                .collect();
            level.sort();
            level.dedup();
        }
        Ok(n)
    }

    /// Whether a checkpoint needs every tree in memory first: when the
    /// base snapshot had no stat object, unexpanded subtrees' paths are
    /// listed from their trees (once; later checkpoints have one).
    pub fn needs_trees_for_build(&self) -> bool {
        self.upper.as_ref().is_some_and(|u| u.read().expect("upper lock").base_stat_id.is_none())
    }

    /// Stages a checkpoint of a read-write mount: hashes the files written
    /// since the last one, re-encodes the directories above them, and lists
    /// every path's mtime. Blocking (reads upper files): call it from a
    /// blocking thread.
    pub fn build(&self, cache: &DiskCache, staged: &mut Staged) -> Result<Built> {
        self.build_with(cache, staged, || {}, || {})
    }

    /// [`SnapshotFs::build`], running `listed` once the changed files are
    /// listed (before they are read) and `between` after they were hashed
    /// and before the tree is encoded: where other requests may change the
    /// tree (tests put those changes there).
    fn build_with(
        &self,
        cache: &DiskCache,
        staged: &mut Staged,
        listed: impl FnOnce(),
        between: impl FnOnce(),
    ) -> Result<Built> {
        let upper_dir = self.upper_dir()?;
        // Hash changed files without holding the lock.
        let dirty: Vec<(u64, u64, u64)> = {
            let st = self.st();
            let mut out = Vec::new();
            let mut stack = vec![ROOT_INO];
            while let Some(ino) = stack.pop() {
                let n = st.get(ino)?;
                match &n.body {
                    Body::Dir { children: Some(c), clean: None, .. } => stack.extend(c.values()),
                    Body::Upper { blob, clean: None, .. } => out.push((ino, *blob, n.version)),
                    _ => {}
                }
            }
            out
        };
        listed();
        let mut hashed = Vec::with_capacity(dirty.len());
        for (ino, blob, version) in &dirty {
            let p = upper_dir.join(blob.to_string());
            let data = match std::fs::read(&p) {
                Ok(d) => d,
                // Unlinked (or replaced) since it was listed. A file still
                // in the tree is read again by the walk below, which fails
                // if its blob is truly gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("reading {}", p.display()))(e)),
            };
            hashed.push((*ino, *version, staged.content(cache, &data)?));
        }
        let hashed_count = hashed.len() as u64;
        between();
        let mut st = self.st_mut();
        // Files hashed here are counted as read, not as unchanged, when the
        // tree walk below meets them (if it still does: they may have been
        // unlinked or renamed away meanwhile).
        let mut fresh = std::collections::HashSet::new();
        for (ino, version, id) in hashed {
            let n = st.get_mut(ino)?;
            if n.version == version {
                if let Body::Upper { clean, .. } = &mut n.body {
                    *clean = Some(id);
                    fresh.insert(ino);
                }
            }
        }
        let mut b = Built {
            root: self.root,
            stat: StatObject::default(),
            files_read: hashed_count,
            files_unchanged: 0,
            trees_built: 0,
        };
        let root = self.build_tree(&mut st, cache, staged, &upper_dir, &fresh, &mut b)?;
        b.root = root.id;
        b.stat.entries.sort();
        Ok(b)
    }

    /// Encodes the loaded part of the tree bottom-up (an explicit stack, so
    /// no depth of directories can overflow the thread's stack): changed
    /// directories become new trees, clean ones keep their id.
    #[allow(clippy::too_many_arguments)]
    fn build_tree(
        &self,
        st: &mut State,
        cache: &DiskCache,
        staged: &mut Staged,
        upper_dir: &Path,
        fresh: &std::collections::HashSet<u64>,
        b: &mut Built,
    ) -> Result<Entry> {
        enum Step {
            Enter(u64, Vec<u8>),
            /// Every child's entry is in `out[from..]`.
            Exit {
                ino: u64,
                path: Vec<u8>,
                from: usize,
            },
        }
        let mut out: Vec<Entry> = Vec::new();
        let mut stack = vec![Step::Enter(ROOT_INO, Vec::new())];
        while let Some(step) = stack.pop() {
            match step {
                Step::Enter(ino, path) => {
                    let n = st.get(ino)?;
                    if let Body::Dir { children: Some(ch), .. } = &n.body {
                        b.stat.entries.push((path.clone(), n.mtime.0, n.mtime.1));
                        let kids: Vec<(Vec<u8>, u64)> = ch.iter().map(|(k, v)| (k.clone(), *v)).collect();
                        stack.push(Step::Exit { ino, path: path.clone(), from: out.len() });
                        stack.extend(kids.into_iter().rev().map(|(name, c)| Step::Enter(c, join(&path, &name))));
                    } else {
                        let e = self.build_leaf(st, ino, &path, cache, staged, upper_dir, fresh, b)?;
                        out.push(e);
                    }
                }
                Step::Exit { ino, path, from } => {
                    let entries = out.split_off(from);
                    let n = st.get(ino)?;
                    let (name, clean) = match &n.body {
                        Body::Dir { clean, .. } => (n.name.clone(), *clean),
                        _ => return Err(Error::User("internal: a directory changed kind during a checkpoint".into())),
                    };
                    let id = match clean {
                        Some(id) => id,
                        None => {
                            let tree = Tree::normalized(entries).map_err(|e| Error::UnsafePath {
                                path: String::from_utf8_lossy(&path).into_owned(),
                                reason: e.to_string(),
                            })?;
                            b.trees_built += 1;
                            let id = staged.tree(cache, &tree)?;
                            if let Body::Dir { clean, .. } = &mut st.get_mut(ino)?.body {
                                *clean = Some(id);
                            }
                            id
                        }
                    };
                    out.push(Entry { name, kind: Kind::Directory, chunked: false, size: 0, id });
                }
            }
        }
        out.pop().ok_or_else(|| Error::User("internal: no root entry".into()))
    }

    /// The entry of one node that is not a loaded directory.
    #[allow(clippy::too_many_arguments)]
    fn build_leaf(
        &self,
        st: &mut State,
        ino: u64,
        path: &[u8],
        cache: &DiskCache,
        staged: &mut Staged,
        upper_dir: &Path,
        fresh: &std::collections::HashSet<u64>,
        b: &mut Built,
    ) -> Result<Entry> {
        let n = st.get(ino)?.clone();
        b.stat.entries.push((path.to_vec(), n.mtime.0, n.mtime.1));
        let entry = |kind, chunked, size, id| Entry { name: n.name.clone(), kind, chunked, size, id };
        Ok(match &n.body {
            Body::Dir { clean, origin, children: None } => {
                let id = clean.ok_or_else(|| Error::User("an unloaded directory without a tree".into()))?;
                self.carry_stat(origin.as_deref(), id, path, &mut b.stat)?;
                entry(Kind::Directory, false, 0, id)
            }
            Body::Dir { children: Some(_), .. } => {
                return Err(Error::User("internal: a loaded directory reached build_leaf".into()));
            }
            Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable) => {
                entry(file_kind(n.perm), e.chunked, e.size, e.id)
            }
            Body::Lower(e) => entry(e.kind, e.chunked, e.size, e.id),
            Body::Upper { clean: Some((id, chunked)), size, .. } => {
                if !fresh.contains(&ino) {
                    b.files_unchanged += 1;
                }
                entry(file_kind(n.perm), *chunked, *size, *id)
            }
            Body::Upper { blob, clean: None, .. } => {
                // Written while the checkpoint was hashing: hash it now.
                let p = upper_dir.join(blob.to_string());
                let data = std::fs::read(&p).map_err(Error::io(format!("reading {}", p.display())))?;
                b.files_read += 1;
                let (id, chunked) = staged.content(cache, &data)?;
                if let Body::Upper { clean, .. } = &mut st.get_mut(ino)?.body {
                    *clean = Some((id, chunked));
                }
                entry(file_kind(n.perm), chunked, data.len() as u64, id)
            }
            Body::Link(t) => {
                let (id, _) = staged.content(cache, t)?;
                entry(Kind::Symlink, false, t.len() as u64, id)
            }
        })
    }

    /// The mtimes of an unexpanded subtree now at `path`: from the base
    /// stat object under its origin, or the snapshot's time for each path
    /// of its trees when the base had none.
    fn carry_stat(&self, origin: Option<&[u8]>, tree: Hash, path: &[u8], out: &mut StatObject) -> Result<()> {
        let u = self.upper.as_ref().ok_or_else(read_only)?.read().expect("upper lock");
        if let (Some(_), Some(o)) = (u.base_stat_id, origin) {
            let prefix = if o.is_empty() { Vec::new() } else { [o, b"/"].concat() };
            for (k, (s, ns)) in u.base_stat.range(prefix.clone()..) {
                if !k.starts_with(&prefix) {
                    break;
                }
                if k.is_empty() {
                    continue;
                }
                out.entries.push((join(path, &k[prefix.len()..]), *s, *ns));
            }
            return Ok(());
        }
        list_tree_paths(self, tree, path, out)
    }

    /// After a checkpoint: the new snapshot becomes the base, so origins
    /// are the paths of now and the stat object is the one just written.
    pub fn rebase(&self, stat_id: Hash, stat: &StatObject) {
        let Some(u) = &self.upper else { return };
        let mut st = self.st_mut();
        let mut stack = vec![(ROOT_INO, Vec::new())];
        while let Some((ino, path)) = stack.pop() {
            let Ok(n) = st.get_mut(ino) else { continue };
            if let Body::Dir { origin, children, .. } = &mut n.body {
                *origin = Some(path.clone());
                if let Some(c) = children {
                    stack.extend(c.iter().map(|(name, c)| (*c, join(&path, name))));
                }
            }
        }
        let mut u = u.write().expect("upper lock");
        u.base_stat = stat.entries.iter().map(|(p, s, n)| (p.clone(), (*s, *n))).collect();
        u.base_stat_id = Some(stat_id);
    }
}

/// Lists the paths of tree `id` (already in memory) with the snapshot time.
fn list_tree_paths(fs: &SnapshotFs, id: Hash, path: &[u8], out: &mut StatObject) -> Result<()> {
    let mut stack = vec![(id, path.to_vec())];
    while let Some((id, path)) = stack.pop() {
        let t = fs.tree_now(&id).ok_or_else(|| Error::User(format!("tree {id} is not loaded")))?;
        for e in &t.entries {
            let p = join(&path, &e.name);
            out.entries.push((p.clone(), fs.time, 0));
            if e.kind == Kind::Directory {
                stack.push((e.id, p));
            }
        }
    }
    Ok(())
}

/// The mode of a file's upper copy: the file's own permission bits (a
/// 0600 file stays 0600 on the disk too), plus what the daemon needs to
/// read and write it.
fn upper_mode(perm: u16) -> u32 {
    (perm as u32 & 0o777) | 0o600
}

fn write_upper(p: &Path, data: &[u8], perm: u16) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(upper_mode(perm))
        .open(p)
        .map_err(Error::io(format!("writing {}", p.display())))?;
    f.write_all(data).map_err(Error::io(format!("writing {}", p.display())))
}

fn read_upper(file: &std::fs::File, offset: u64, size: u32) -> Result<Bytes> {
    let mut buf = vec![0u8; size as usize];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("reading the upper layer")(e)),
        }
    }
    buf.truncate(got);
    Ok(Bytes::from(buf))
}

// ---- The saved state of a read-write mount (`overlay.state`) ----
//
// Flat and checksummed (docs/FORMAT.md, "Overlay state"): one record per
// node in memory, parents before children, each naming its parent by
// record index, so no depth of directories can make it unreadable, and a
// torn or rotten file reads as corrupt, never as an empty overlay.

const OVERLAY_MAGIC: &[u8; 4] = b"MADV";
const OVERLAY_VERSION: u8 = 2;

/// Node bodies in the saved state.
const REC_DIR: u8 = 0;
const REC_LOWER: u8 = 1;
const REC_UPPER: u8 = 2;
const REC_LINK: u8 = 3;

fn put_opt_hash(out: &mut Vec<u8>, h: Option<Hash>) {
    match h {
        None => out.push(0),
        Some(h) => {
            out.push(1);
            out.extend_from_slice(h.as_bytes());
        }
    }
}

fn opt_hash(r: &mut crate::codec::Reader) -> std::result::Result<Option<Hash>, crate::codec::DecodeError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.hash()?)),
        f => Err(crate::codec::DecodeError::Invalid(format!("bad flag {f}"))),
    }
}

fn state_err(e: impl std::fmt::Display) -> Error {
    Error::User(format!(
        "the saved state of this workspace mount is unreadable ({e}); its upper files are kept; \
         checkpoint from a backup of the state folder or remove it to start from the last checkpoint"
    ))
}

/// The header of a saved state: what must be fetched before loading it.
struct SavedHeader {
    root: Hash,
    time: i64,
    base_stat: Option<Hash>,
    next_blob: u64,
}

impl SnapshotFs {
    /// The state of a read-write mount, for [`SnapshotFs::load_state`].
    pub fn save_state(&self) -> Result<Vec<u8>> {
        use crate::codec::{put_bytes, put_varint};
        let u = self.upper.as_ref().ok_or_else(read_only)?.read().expect("upper lock");
        let st = self.st();
        let mut out = Vec::with_capacity(64 + st.nodes.len() * 64);
        out.extend_from_slice(OVERLAY_MAGIC);
        out.push(OVERLAY_VERSION);
        out.extend_from_slice(self.root.as_bytes());
        out.extend_from_slice(&self.time.to_le_bytes());
        put_opt_hash(&mut out, u.base_stat_id);
        put_varint(&mut out, st.next_blob);
        // Pre-order, iteratively: (ino, index of its parent's record).
        let mut records: Vec<(u64, u64)> = Vec::new();
        let mut stack = vec![(ROOT_INO, 0u64)];
        while let Some((ino, parent)) = stack.pop() {
            let me = records.len() as u64;
            records.push((ino, parent));
            if let Body::Dir { children: Some(c), .. } = &st.get(ino)?.body {
                stack.extend(c.values().rev().map(|k| (*k, me)));
            }
        }
        put_varint(&mut out, records.len() as u64);
        for (ino, parent) in records {
            let n = st.get(ino)?;
            put_varint(&mut out, parent);
            put_bytes(&mut out, &n.name);
            put_varint(&mut out, n.perm as u64);
            out.extend_from_slice(&n.mtime.0.to_le_bytes());
            put_varint(&mut out, n.mtime.1 as u64);
            match &n.body {
                Body::Dir { clean, origin, children } => {
                    out.push(REC_DIR);
                    put_opt_hash(&mut out, *clean);
                    match origin {
                        None => out.push(0),
                        Some(o) => {
                            out.push(1);
                            put_bytes(&mut out, o);
                        }
                    }
                    out.push(children.is_some() as u8);
                }
                Body::Lower(e) => {
                    out.push(REC_LOWER);
                    out.push(e.kind as u8);
                    out.push(e.chunked as u8);
                    put_varint(&mut out, e.size);
                    out.extend_from_slice(e.id.as_bytes());
                }
                Body::Upper { blob, size, .. } => {
                    out.push(REC_UPPER);
                    put_varint(&mut out, *blob);
                    put_varint(&mut out, *size);
                }
                Body::Link(t) => {
                    out.push(REC_LINK);
                    put_bytes(&mut out, t);
                }
            }
        }
        let sum = Hash::of(&out);
        out.extend_from_slice(sum.as_bytes());
        Ok(out)
    }

    fn saved_header(bytes: &[u8]) -> Result<(SavedHeader, crate::codec::Reader<'_>)> {
        if bytes.len() < 4 + 32 || !bytes.starts_with(OVERLAY_MAGIC) {
            return Err(state_err("not an overlay state"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if Hash::of(body).as_bytes() != sum {
            return Err(state_err("checksum mismatch: the file is torn or corrupt"));
        }
        let mut r = crate::codec::Reader::new(body);
        let h = (|| {
            r.magic(OVERLAY_MAGIC)?;
            r.version("overlay state", OVERLAY_VERSION)?;
            let root = r.hash()?;
            let time = r.i64_le()?;
            let base_stat = opt_hash(&mut r)?;
            let next_blob = r.varint()?;
            Ok::<_, crate::codec::DecodeError>(SavedHeader { root, time, base_stat, next_blob })
        })()
        .map_err(state_err)?;
        Ok((h, r))
    }

    /// The base stat object id a saved state refers to (to fetch it
    /// before [`SnapshotFs::load_state`]).
    pub fn saved_base_stat(bytes: &[u8]) -> Result<Option<Hash>> {
        Ok(Self::saved_header(bytes)?.0.base_stat)
    }

    /// Restores a read-write mount from its saved state. Files of the
    /// upper layer are re-hashed at the next checkpoint (a crash may have
    /// come between a write and the last save).
    pub fn load_state(
        fetcher: Arc<Fetcher>,
        bytes: &[u8],
        upper_dir: PathBuf,
        base_stat: Option<(Hash, StatObject)>,
    ) -> Result<SnapshotFs> {
        use crate::codec::DecodeError;
        let (h, mut r) = Self::saved_header(bytes)?;
        let fs = SnapshotFs::writable(fetcher, h.root, h.time, upper_dir, base_stat)?;
        let mut st = State { nodes: HashMap::new(), next_ino: ROOT_INO, next_blob: h.next_blob };
        let n = r.count(16).map_err(state_err)?;
        // Record index -> inode (records are numbered 0.., inodes 1..).
        let mut inos: Vec<u64> = Vec::with_capacity(n);
        let mut holders = Vec::new();
        for i in 0..n {
            let rec = (|| {
                let parent = r.varint()?;
                let name = r.bytes()?.to_vec();
                let perm = r.varint()? as u16;
                let mtime = (r.i64_le()?, r.varint()? as u32);
                let body = match r.u8()? {
                    REC_DIR => {
                        let clean = opt_hash(&mut r)?;
                        let origin = match r.u8()? {
                            0 => None,
                            1 => Some(r.bytes()?.to_vec()),
                            f => return Err(DecodeError::Invalid(format!("bad origin flag {f}"))),
                        };
                        let loaded = r.u8()? != 0;
                        if !loaded && clean.is_none() {
                            return Err(DecodeError::Invalid("an unloaded directory without a tree".into()));
                        }
                        Body::Dir { clean, origin, children: loaded.then(BTreeMap::new) }
                    }
                    REC_LOWER => {
                        let k = r.u8()?;
                        let kind = [Kind::File, Kind::Executable, Kind::Symlink, Kind::Directory, Kind::Gitlink]
                            .into_iter()
                            .find(|x| *x as u8 == k)
                            .ok_or_else(|| DecodeError::Invalid(format!("unknown kind {k}")))?;
                        let chunked = r.u8()? != 0;
                        let size = r.varint()?;
                        let id = r.hash()?;
                        Body::Lower(Entry { name: name.clone(), kind, chunked, size, id })
                    }
                    REC_UPPER => Body::Upper { blob: r.varint()?, size: r.varint()?, clean: None },
                    REC_LINK => Body::Link(r.bytes()?.to_vec()),
                    t => return Err(DecodeError::Invalid(format!("unknown record type {t}"))),
                };
                Ok((parent, name, perm, mtime, body))
            })()
            .map_err(state_err)?;
            let (parent, name, perm, mtime, body) = rec;
            let is_upper = matches!(body, Body::Upper { .. });
            let ino = if i == 0 {
                st.next_ino = ROOT_INO;
                st.push(Node::new(ROOT_INO, name, perm, mtime, body))
            } else {
                let p = *inos
                    .get(parent as usize)
                    .filter(|_| (parent as usize) < i)
                    .ok_or_else(|| state_err(format!("record {i} names parent {parent}, not an earlier record")))?;
                check_name(&name).map_err(state_err)?;
                let ino = st.push(Node::new(p, name.clone(), perm, mtime, body));
                match &mut st.get_mut(p)?.body {
                    Body::Dir { children: Some(c), .. } => {
                        if c.insert(name, ino).is_some() {
                            return Err(state_err(format!("record {i}: a name appears twice in one directory")));
                        }
                    }
                    _ => return Err(state_err(format!("record {i}: its parent is not a loaded directory"))),
                }
                if is_upper {
                    holders.push(p);
                }
                ino
            };
            inos.push(ino);
        }
        r.finish().map_err(state_err)?;
        if n == 0 {
            return Err(state_err("no root record"));
        }
        // Every directory above an upper file is rebuilt at the next
        // checkpoint. The saved state keeps "changed directories only
        // below changed ones", so `dirty` may stop early here too.
        for h in holders {
            st.dirty(h);
        }
        *fs.state.write().expect("state lock") = st;
        Ok(fs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{OpenOptions, Remote};

    /// A read-write filesystem over an empty tree, in `dir`.
    fn empty_workspace(dir: &Path) -> (SnapshotFs, Arc<DiskCache>) {
        let remote =
            Arc::new(Remote::open(&format!("file://{}/store", dir.display()), &OpenOptions::default()).unwrap());
        let cache = Arc::new(DiskCache::open(dir.join("cache"), None).unwrap());
        let empty = Tree::normalized(Vec::new()).unwrap().encode();
        let root = Hash::of(&empty);
        cache.put(&root, &empty).unwrap();
        let f = Fetcher::new(remote, cache.clone());
        (SnapshotFs::writable(f, root, 0, dir.join("upper"), None).unwrap(), cache)
    }

    #[tokio::test]
    async fn a_file_unlinked_while_a_checkpoint_hashes_it_is_counted_once() {
        let d = tempfile::tempdir().unwrap();
        let (fs, cache) = empty_workspace(d.path());
        let (a, f) = fs.create(ROOT_INO, b"gone", 0o644).await.unwrap();
        fs.write(&f, 0, b"hashed, then unlinked").unwrap();
        let (_, g) = fs.create(ROOT_INO, b"kept", 0o644).await.unwrap();
        fs.write(&g, 0, b"stays").unwrap();
        let mut staged = Staged::default();
        let unlink = || {
            futures::executor::block_on(fs.unlink(ROOT_INO, b"gone")).unwrap();
        };
        let b = fs.build_with(&cache, &mut staged, || {}, unlink).unwrap();
        assert!(fs.getattr(a.ino).is_ok());
        assert_eq!(b.files_read, 2, "{b:?}");
        assert_eq!(b.files_unchanged, 0, "{b:?}");
        // Nothing changed since: the next build reads nothing and knows one file.
        let b = fs.build(&cache, &mut Staged::default()).unwrap();
        assert_eq!((b.files_read, b.files_unchanged, b.trees_built), (0, 1, 0), "{b:?}");
    }

    #[tokio::test]
    async fn an_unlinked_open_file_keeps_its_bytes_until_the_last_close_and_forget() {
        let d = tempfile::tempdir().unwrap();
        let (fs, _cache) = empty_workspace(d.path());
        let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
        fs.note_lookup(a.ino, 1);
        fs.write(&f, 0, b"still here").unwrap();
        let reader = fs.open(a.ino).await.unwrap();
        fs.unlink(ROOT_INO, b"f").await.unwrap();
        let blob = d.path().join("upper").join("1");
        assert!(blob.exists(), "the blob went while handles were open");
        assert_eq!(&fs.read(&reader, 0, 64).await.unwrap()[..], b"still here");
        assert!(fs.getattr(a.ino).is_ok(), "an open file answers getattr (fstat)");
        fs.release(a.ino);
        assert!(blob.exists(), "one handle is still open");
        fs.release(a.ino);
        assert!(!blob.exists(), "the last close deletes the blob");
        assert!(fs.getattr(a.ino).is_ok(), "the kernel still holds a reference");
        fs.forget(a.ino, 1);
        assert!(fs.getattr(a.ino).is_err(), "forgotten and unlinked: dropped");
    }

    #[tokio::test]
    async fn opening_a_file_unlinked_before_the_open_is_enoent_not_eio() {
        let d = tempfile::tempdir().unwrap();
        let (fs, _cache) = empty_workspace(d.path());
        let (a, f) = fs.create(ROOT_INO, b"f", 0o644).await.unwrap();
        fs.note_lookup(a.ino, 1);
        fs.write(&f, 0, b"x").unwrap();
        fs.release(a.ino);
        fs.unlink(ROOT_INO, b"f").await.unwrap();
        match fs.open(a.ino).await {
            Err(Error::NotFound(_)) => {}
            Err(e) => panic!("expected NotFound, got {e}"),
            Ok(_) => panic!("opened a removed file"),
        }
    }

    #[tokio::test]
    async fn deep_directories_save_and_load_without_recursion() {
        let d = tempfile::tempdir().unwrap();
        let (fs, cache) = empty_workspace(d.path());
        let mut dir = ROOT_INO;
        for _ in 0..5000 {
            dir = fs.mkdir(dir, b"d", 0o755).await.unwrap().ino;
        }
        let (_, f) = fs.create(dir, b"leaf", 0o644).await.unwrap();
        fs.write(&f, 0, b"deep").unwrap();
        let saved = fs.save_state().unwrap();
        let f2 = fs.fetcher().clone();
        let back = SnapshotFs::load_state(f2, &saved, d.path().join("upper"), None).unwrap();
        let mut ino = ROOT_INO;
        for _ in 0..5000 {
            ino = back.lookup(ino, b"d").await.unwrap().ino;
        }
        let leaf = back.lookup(ino, b"leaf").await.unwrap();
        let h = back.open(leaf.ino).await.unwrap();
        assert_eq!(&back.read(&h, 0, 16).await.unwrap()[..], b"deep");
        // Both build the same tree.
        let (x, y) =
            (fs.build(&cache, &mut Staged::default()).unwrap(), back.build(&cache, &mut Staged::default()).unwrap());
        assert_eq!(x.root, y.root);
        // Any flipped byte or cut reads as corrupt, never as an empty overlay.
        for at in [0, 5, saved.len() / 2, saved.len() - 1] {
            let mut bad = saved.clone();
            bad[at] ^= 0x40;
            let e = SnapshotFs::load_state(fs.fetcher().clone(), &bad, d.path().join("upper"), None).err().unwrap();
            assert!(e.to_string().contains("unreadable"), "{e}");
        }
        assert!(SnapshotFs::load_state(fs.fetcher().clone(), &saved[..saved.len() - 3], d.path().join("upper"), None)
            .is_err());
    }

    #[tokio::test]
    async fn forgotten_clean_nodes_fold_back_into_their_tree() {
        let d = tempfile::tempdir().unwrap();
        let remote =
            Arc::new(Remote::open(&format!("file://{}/store", d.path().display()), &OpenOptions::default()).unwrap());
        let cache = Arc::new(DiskCache::open(d.path().join("cache"), None).unwrap());
        // A tree of 100 files in one directory, below the root.
        let file = Hash::of(b"content");
        cache.put(&file, b"content").unwrap();
        let entries: Vec<Entry> = (0..100)
            .map(|i| Entry { name: format!("f{i}").into_bytes(), kind: Kind::File, chunked: false, size: 7, id: file })
            .collect();
        let sub = Tree::normalized(entries).unwrap().encode();
        let sub_id = Hash::of(&sub);
        cache.put(&sub_id, &sub).unwrap();
        let root = Tree::normalized(vec![Entry {
            name: b"dir".to_vec(),
            kind: Kind::Directory,
            chunked: false,
            size: 0,
            id: sub_id,
        }])
        .unwrap()
        .encode();
        let root_id = Hash::of(&root);
        cache.put(&root_id, &root).unwrap();
        let fs = SnapshotFs::writable(Fetcher::new(remote, cache), root_id, 0, d.path().join("upper"), None).unwrap();
        let dir = fs.lookup(ROOT_INO, b"dir").await.unwrap().ino;
        fs.note_lookup(dir, 1);
        let list = fs.readdir(dir).await.unwrap();
        for (_, a) in &list {
            fs.note_lookup(a.ino, 1);
        }
        assert_eq!(fs.node_count(), 102);
        // One file still held by the kernel: nothing folds.
        for (_, a) in &list[1..] {
            fs.forget(a.ino, 1);
        }
        assert_eq!(fs.node_count(), 102);
        fs.forget(list[0].1.ino, 1);
        assert_eq!(fs.node_count(), 2, "the directory's children fold back into its tree id");
        // A folded directory is never taken for empty.
        match fs.rmdir(ROOT_INO, b"dir").await {
            Err(Error::Fs { errno, .. }) if errno == Errno::NOTEMPTY.raw_os_error() => {}
            r => panic!("rmdir of a folded, non-empty directory: {r:?}"),
        }
        // A counted lookup holds its node against folding.
        let held = fs.lookup_counted(dir, b"f7").await.unwrap();
        let others = fs.readdir(dir).await.unwrap();
        fs.forget(others[0].1.ino, 0);
        assert!(fs.getattr(held.ino).is_ok(), "a node the kernel holds was folded away");
        fs.forget(held.ino, 1);
        assert_eq!(fs.node_count(), 2);
        // A lower file unlinked while nobody has it open is gone for an
        // open by inode; one unlinked while open can be opened again
        // through that handle's inode (`/proc/self/fd/N`).
        // (The kernel still holds its inode: the node is there, detached.)
        let gone = fs.lookup_counted(dir, b"f3").await.unwrap();
        fs.unlink(dir, b"f3").await.unwrap();
        assert!(fs.getattr(gone.ino).is_ok());
        assert!(matches!(fs.open(gone.ino).await, Err(Error::NotFound(_))));
        fs.forget(gone.ino, 1);
        let kept = fs.lookup(dir, b"f4").await.unwrap();
        let h = fs.open(kept.ino).await.unwrap();
        fs.unlink(dir, b"f4").await.unwrap();
        let again = fs.open(kept.ino).await.expect("reopened through an open handle");
        assert_eq!(&fs.read(&again, 0, 16).await.unwrap()[..], b"content");
        drop((h, again));
        fs.release(kept.ino);
        fs.release(kept.ino);
        assert!(fs.getattr(kept.ino).is_err(), "closed, unlinked and never held by the kernel: dropped");
        // And come back on the next look, with new inode numbers.
        let again = fs.readdir(dir).await.unwrap();
        assert_eq!(again.len(), 98);
        assert!(again.iter().all(|(_, a)| a.ino > list.iter().map(|(_, b)| b.ino).max().unwrap()));
    }

    #[tokio::test]
    async fn folding_goes_up_while_whole_directories_are_idle() {
        let d = tempfile::tempdir().unwrap();
        let remote =
            Arc::new(Remote::open(&format!("file://{}/store", d.path().display()), &OpenOptions::default()).unwrap());
        let cache = Arc::new(DiskCache::open(d.path().join("cache"), None).unwrap());
        let put_tree = |entries: Vec<Entry>| {
            let t = Tree::normalized(entries).unwrap().encode();
            let id = Hash::of(&t);
            cache.put(&id, &t).unwrap();
            id
        };
        let file = Hash::of(b"x");
        cache.put(&file, b"x").unwrap();
        let f = |n: &str| Entry { name: n.into(), kind: Kind::File, chunked: false, size: 1, id: file };
        let dirent = |n: &str, id| Entry { name: n.into(), kind: Kind::Directory, chunked: false, size: 0, id };
        let b = put_tree(vec![f("x"), f("y")]);
        let a = put_tree(vec![dirent("b", b)]);
        let root = put_tree(vec![dirent("a", a)]);
        let fs =
            SnapshotFs::writable(Fetcher::new(remote, cache.clone()), root, 0, d.path().join("upper"), None).unwrap();
        let a = fs.lookup_counted(ROOT_INO, b"a").await.unwrap().ino;
        let b = fs.lookup_counted(a, b"b").await.unwrap().ino;
        let x = fs.lookup_counted(b, b"x").await.unwrap().ino;
        let y = fs.lookup_counted(b, b"y").await.unwrap().ino;
        assert_eq!(fs.node_count(), 5);
        fs.forget(a, 1);
        fs.forget(b, 1);
        fs.forget(x, 1);
        assert_eq!(fs.node_count(), 5, "y is still held");
        fs.forget(y, 1);
        assert_eq!(fs.node_count(), 1, "b's files, then b, then a fold away");
        assert_eq!(fs.readdir(ROOT_INO).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_checkpoint_skips_a_file_unlinked_under_it_but_not_a_lost_blob() {
        let d = tempfile::tempdir().unwrap();
        let (fs, cache) = empty_workspace(d.path());
        for name in [&b"gone"[..], b"kept"] {
            let (a, f) = fs.create(ROOT_INO, name, 0o644).await.unwrap();
            fs.write(&f, 0, name).unwrap();
            fs.release(a.ino);
        }
        // Unlinked after the listing, before its read: skipped.
        let unlink = || futures::executor::block_on(fs.unlink(ROOT_INO, b"gone")).unwrap();
        let b = fs.build_with(&cache, &mut Staged::default(), unlink, || {}).unwrap();
        assert_eq!(b.files_read, 1, "{b:?}");
        // A blob that vanished under a file still in the tree is an error,
        // never a tree that silently lacks the file.
        let (a, f) = fs.create(ROOT_INO, b"lost", 0o644).await.unwrap();
        fs.write(&f, 0, b"lost").unwrap();
        fs.release(a.ino);
        let blob = match &fs.st().get(a.ino).unwrap().body {
            Body::Upper { blob, .. } => *blob,
            _ => unreachable!(),
        };
        let remove = || std::fs::remove_file(d.path().join("upper").join(blob.to_string())).unwrap();
        let e = fs.build_with(&cache, &mut Staged::default(), remove, || {}).unwrap_err();
        assert!(e.to_string().contains(&blob.to_string()), "{e}");
    }
}
