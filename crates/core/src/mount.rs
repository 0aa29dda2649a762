//! A snapshot as a read-only filesystem, with no FUSE in it: inodes,
//! attributes, directory listings and reads, answered from trees held in
//! memory and content read through the fetcher (so through packs). The
//! FUSE adapter (crates/mount) only translates.
//!
//! Trees come inline with the pack index when one is attached, so lookup,
//! getattr and readdir need no network after the mount is up. Content is
//! immutable: attributes can be cached by the kernel for a long time.
//! A read that cannot finish within `read_timeout` fails (EIO) rather than
//! hanging its caller; other files keep being served.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;

use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::hash::Hash;
use crate::object::{ChunkManifest, Entry, Kind, Tree};
use crate::store::Space;

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
    /// Seconds since the epoch: the snapshot's time for every node.
    pub mtime: i64,
}

/// An open file: its content source.
pub enum OpenFile {
    /// A whole blob, with the cache file holding it (for passthrough).
    Whole { data: Bytes, cache_path: Option<PathBuf> },
    /// A chunked file: chunks are read as ranges are asked for.
    Chunked { entry: Entry, manifest: ChunkManifest, starts: Vec<u64> },
}

struct Inodes {
    /// Index `ino - 1`: the entry (the root is a synthetic directory).
    nodes: Vec<Entry>,
    by_name: HashMap<(u64, Vec<u8>), u64>,
}

pub struct SnapshotFs {
    fetcher: Arc<Fetcher>,
    time: i64,
    inodes: RwLock<Inodes>,
    trees: RwLock<HashMap<Hash, Arc<Tree>>>,
    pub read_timeout: Duration,
    /// Reads served (for stats).
    reads: Mutex<u64>,
}

fn timeout_err(what: &str, t: Duration) -> Error {
    Error::Io {
        context: format!("{what}: the store did not answer within {} s", t.as_secs()),
        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
    }
}

impl SnapshotFs {
    pub fn new(fetcher: Arc<Fetcher>, root: Hash, time: i64) -> SnapshotFs {
        let root_entry = Entry { name: Vec::new(), kind: Kind::Directory, chunked: false, size: 0, id: root };
        SnapshotFs {
            fetcher,
            time,
            inodes: RwLock::new(Inodes { nodes: vec![root_entry], by_name: HashMap::new() }),
            trees: RwLock::new(HashMap::new()),
            read_timeout: DEFAULT_READ_TIMEOUT,
            reads: Mutex::new(0),
        }
    }

    pub fn fetcher(&self) -> &Arc<Fetcher> {
        &self.fetcher
    }

    pub fn reads(&self) -> u64 {
        *self.reads.lock().expect("reads lock")
    }

    fn entry(&self, ino: u64) -> Result<Entry> {
        let i = self.inodes.read().expect("inodes lock");
        ino.checked_sub(1)
            .and_then(|i2| i.nodes.get(i2 as usize))
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("inode {ino}")))
    }

    fn attr(&self, ino: u64, e: &Entry) -> Attr {
        let (kind, perm, size, nlink) = match e.kind {
            Kind::Directory | Kind::Gitlink => (NodeKind::Dir, 0o555, 0, 2),
            Kind::File => (NodeKind::File, 0o444, e.size, 1),
            Kind::Executable => (NodeKind::File, 0o555, e.size, 1),
            Kind::Symlink => (NodeKind::Symlink, 0o777, e.size, 1),
        };
        Attr { ino, kind, size, perm, nlink, mtime: self.time }
    }

    fn ino_for(&self, parent: u64, e: &Entry) -> u64 {
        let key = (parent, e.name.clone());
        if let Some(ino) = self.inodes.read().expect("inodes lock").by_name.get(&key) {
            return *ino;
        }
        let mut i = self.inodes.write().expect("inodes lock");
        if let Some(ino) = i.by_name.get(&key) {
            return *ino;
        }
        i.nodes.push(e.clone());
        let ino = i.nodes.len() as u64;
        i.by_name.insert(key, ino);
        ino
    }

    /// The tree of a directory entry, if already in memory.
    fn tree_now(&self, e: &Entry) -> Option<Arc<Tree>> {
        match e.kind {
            Kind::Gitlink => Some(Arc::new(Tree::default())),
            _ => self.trees.read().expect("trees lock").get(&e.id).cloned(),
        }
    }

    async fn tree_of(&self, e: &Entry) -> Result<Arc<Tree>> {
        if let Some(t) = self.tree_now(e) {
            return Ok(t);
        }
        if e.kind != Kind::Directory {
            return Err(Error::User("not a directory".into()));
        }
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let fut = self.fetcher.tree(e.id, &name);
        let t = tokio::time::timeout(self.read_timeout, fut)
            .await
            .map_err(|_| timeout_err("reading a directory", self.read_timeout))??;
        let t = Arc::new(t);
        self.trees.write().expect("trees lock").insert(e.id, t.clone());
        Ok(t)
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.attr(ino, &self.entry(ino)?))
    }

    /// Lookup without waiting: `None` when the parent's tree is not in memory.
    pub fn lookup_now(&self, parent: u64, name: &[u8]) -> Option<Result<Attr>> {
        let pe = match self.entry(parent) {
            Ok(e) => e,
            Err(e) => return Some(Err(e)),
        };
        if !matches!(pe.kind, Kind::Directory | Kind::Gitlink) {
            return Some(Err(Error::User("not a directory".into())));
        }
        let t = self.tree_now(&pe)?;
        Some(self.lookup_in(parent, &t, name))
    }

    fn lookup_in(&self, parent: u64, t: &Tree, name: &[u8]) -> Result<Attr> {
        let e = t.get(name).ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let ino = self.ino_for(parent, e);
        Ok(self.attr(ino, e))
    }

    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let pe = self.entry(parent)?;
        let t = self.tree_of(&pe).await?;
        self.lookup_in(parent, &t, name)
    }

    /// Entries of a directory with their attributes (for READDIRPLUS).
    pub fn readdir_now(&self, ino: u64) -> Option<Result<DirList>> {
        let e = match self.entry(ino) {
            Ok(e) => e,
            Err(e) => return Some(Err(e)),
        };
        let t = self.tree_now(&e)?;
        Some(Ok(self.list(ino, &t)))
    }

    fn list(&self, ino: u64, t: &Tree) -> DirList {
        t.entries.iter().map(|c| (c.name.clone(), self.attr(self.ino_for(ino, c), c))).collect()
    }

    pub async fn readdir(&self, ino: u64) -> Result<DirList> {
        let e = self.entry(ino)?;
        let t = self.tree_of(&e).await?;
        Ok(self.list(ino, &t))
    }

    /// The parent inode of a directory (for `..`).
    pub fn parent_of(&self, ino: u64) -> u64 {
        let i = self.inodes.read().expect("inodes lock");
        i.by_name.iter().find(|(_, v)| **v == ino).map(|((p, _), _)| *p).unwrap_or(ROOT_INO)
    }

    async fn timed<T>(&self, what: &str, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.read_timeout, fut).await.map_err(|_| timeout_err(what, self.read_timeout))?
    }

    pub async fn readlink(&self, ino: u64) -> Result<Bytes> {
        let e = self.entry(ino)?;
        if e.kind != Kind::Symlink {
            return Err(Error::User("not a symlink".into()));
        }
        self.timed("reading a symlink", self.fetcher.content(&e, "")).await
    }

    /// Opens a file: brings its content in (through its pack on a cold
    /// read), so reads of a whole blob need no further request.
    pub async fn open(&self, ino: u64) -> Result<OpenFile> {
        let e = self.entry(ino)?;
        if !matches!(e.kind, Kind::File | Kind::Executable) {
            return Err(Error::User("not a regular file".into()));
        }
        let path = String::from_utf8_lossy(&e.name).into_owned();
        if e.chunked {
            let manifest = self.timed("opening a file", self.fetcher.manifest(&e, &path)).await?;
            let mut starts = Vec::with_capacity(manifest.chunks.len());
            let mut at = 0;
            for (len, _) in &manifest.chunks {
                starts.push(at);
                at += len;
            }
            return Ok(OpenFile::Chunked { entry: e, manifest, starts });
        }
        let data = self.timed("opening a file", self.fetcher.content(&e, &path)).await?;
        let p = self.fetcher.cache.entry_path(&e.id);
        let cache_path = p.exists().then_some(p);
        Ok(OpenFile::Whole { data, cache_path })
    }

    /// `size` bytes at `offset` of an open file (fewer at the end).
    pub async fn read(&self, f: &OpenFile, offset: u64, size: u32) -> Result<Bytes> {
        *self.reads.lock().expect("reads lock") += 1;
        match f {
            OpenFile::Whole { data, .. } => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                Ok(data.slice(start..end))
            }
            OpenFile::Chunked { entry, manifest, starts } => {
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

    /// Loads every tree of the snapshot into memory (from the attached
    /// index, or fetched level by level), so metadata needs no network.
    pub async fn preload_trees(&self) -> Result<usize> {
        let root = self.entry(ROOT_INO)?;
        let mut level = vec![root];
        let mut n = 0;
        while !level.is_empty() {
            let trees: Vec<Arc<Tree>> = futures::stream::iter(level.iter().map(|e| self.tree_of(e)))
                .buffered(crate::store::CONCURRENCY)
                .try_collect()
                .await?;
            n += trees.len();
            level = trees
                .iter()
                .flat_map(|t| t.entries.iter().filter(|c| c.kind == Kind::Directory).cloned())
                .filter(|c| self.tree_now(c).is_none())
                .collect();
            level.sort_by_key(|e| e.id);
            level.dedup_by(|a, b| a.id == b.id);
        }
        Ok(n)
    }
}

use futures::StreamExt;
