//! Reads of the snapshot (the lower layer): loading a directory's tree
//! into nodes, lookup, readdir, readlink, open and read, each bounded by
//! the read timeout. The same paths serve a snapshot and a workspace.

use super::chunked::Readahead;
use super::inode::{Body, Children, Lower, Name, Node, State};
use super::overlay::read_upper;
use super::{join, Attr, DirList, OpenFile, SnapshotFs, ROOT_INO};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{Kind, Tree};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use rustix::io::Errno;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Directories [`SnapshotFs::warm_dir`] looks into for a walk's first
/// file, at most (the search stays short, and a tree thousands of levels
/// deep cannot make it deep).
pub(super) const WARM_DIRS: usize = 64;

/// What [`SnapshotFs::warm_dir`]'s search found below a directory.
enum Below {
    /// The first small file a top-down walk reads.
    Found(Hash),
    /// No small file anywhere below: the walk goes on to the next sibling.
    Nothing,
    /// Unknown (a tree not in memory, or the budget spent): the search
    /// ends, rather than start a file the walk reads later.
    Stop,
}

/// A file whose read [`SnapshotFs::warm_dir`] may start: small (a large
/// file's chunks come down only when read).
fn warmable(e: &Lower) -> bool {
    matches!(e.kind, Kind::File | Kind::Executable) && !e.chunked
}

/// Whether a pack of small members may hold entry `e`'s content: a small
/// file's, or a symlink's target.
fn packed_small(e: &Lower) -> bool {
    warmable(e) || e.kind == Kind::Symlink
}

/// Picks names of a directory (those a READDIRPLUS reply may hold).
pub type NamePicker<'a> = dyn Fn(&[u8]) -> bool + 'a;

impl SnapshotFs {
    /// The tree of a directory, if it can be had without waiting: in
    /// memory, else read locally (inline in the attached index, which is
    /// mapped, or in the disk cache) and kept.
    pub(super) fn tree_now(&self, id: &Hash) -> Option<Arc<Tree>> {
        if let Some(t) = self.trees.read().expect("trees lock").get(id) {
            return Some(t.clone());
        }
        let t = Arc::new(Tree::decode(&self.fetcher.local(id)?).ok()?);
        self.trees.write().expect("trees lock").keep(*id, t.clone());
        Some(t)
    }

    pub(super) async fn tree_by_id(&self, id: Hash, name: &str) -> Result<Arc<Tree>> {
        if let Some(t) = self.tree_now(&id) {
            return Ok(t);
        }
        let t = self.timed("reading a directory", self.fetcher.tree(id, name)).await?;
        let t = Arc::new(t);
        self.trees.write().expect("trees lock").keep(id, t.clone());
        Ok(t)
    }

    /// Fills in the children of directory `ino` from `tree`.
    pub(super) fn expand(&self, st: &mut State, ino: u64, tree: &Tree) {
        let Ok(n) = st.get(ino) else { return };
        let Body::Dir { children: None, origin, .. } = &n.body else { return };
        let origin = origin.clone();
        let first = st.next_ino;
        // Built from the tree's sorted entries in one go: a map filled in
        // order is full, one inserted into one at a time half empty.
        let kids: Children = tree
            .entries
            .iter()
            .map(|e| {
                let o = origin.as_ref().map(|o| join(o, &e.name));
                let mtime = o.as_deref().map(|o| self.base_mtime(o)).unwrap_or((self.time, 0));
                let body = match e.kind {
                    Kind::Directory => {
                        Body::Dir { clean: Some(e.id), origin: o.map(Vec::into_boxed_slice), children: None }
                    }
                    _ => Body::Lower(Lower::of(e)),
                };
                let name: Name = e.name[..].into();
                let node = Node::new(ino, name.clone(), self.perm_of(e.kind), mtime, body);
                (name, st.push(node))
            })
            .collect();
        if let Ok(Node { body: Body::Dir { children, .. }, .. }) = st.get_mut(ino) {
            *children = Some(Box::new(kids));
        }
        st.log_expand(ino, first, tree.entries.len() as u64);
    }

    /// Under the write lock: makes sure directory `ino`'s children are
    /// loaded. A directory whose children were folded away (or never
    /// loaded) has its tree in memory by then (`load` fetched it; folding
    /// requires it), so this never waits; a request that raced a fold
    /// sees the same children again.
    pub(super) fn loaded(&self, st: &mut State, ino: u64) -> Result<()> {
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
    pub(super) async fn load(&self, ino: u64) -> Result<()> {
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
        self.attr_of(&self.st(), ino)
    }

    /// The child's attributes; with `count`, the kernel's reference to it
    /// is counted under the same lock (so no fold can drop it between the
    /// answer and the count).
    pub(super) fn lookup_loaded(&self, parent: u64, name: &[u8], count: bool) -> Result<Attr> {
        if name.len() > crate::object::MAX_NAME_BYTES {
            return Err(Error::fs(Errno::NAMETOOLONG, "a name longer than 255 bytes"));
        }
        self.with_children(parent, |st| self.child_attr(st, parent, name, count))
    }

    /// `f` over the table once directory `ino`'s children are in it: under
    /// the read lock when they are already (lookups and listings then run
    /// side by side; counts are atomic, and nothing drops a node while the
    /// lock is held), else under the write lock that loads them.
    fn with_children<T>(&self, ino: u64, f: impl Fn(&State) -> Result<T>) -> Result<T> {
        {
            let st = self.st();
            if let Ok(Some(_)) = st.children(ino) {
                return f(&st);
            }
        }
        let mut st = self.st_mut();
        self.loaded(&mut st, ino)?;
        f(&st)
    }

    fn child_attr(&self, st: &State, parent: u64, name: &[u8], count: bool) -> Result<Attr> {
        let ino = st.child(parent, name)?;
        if count {
            st.get(ino)?.lookups.add(1);
        }
        self.attr_of(st, ino)
    }

    /// Lookup without waiting: `None` when the parent's tree is not in memory.
    pub fn lookup_now(&self, parent: u64, name: &[u8]) -> Option<Result<Attr>> {
        Some(self.load_now(parent)?.and_then(|_| self.lookup_loaded(parent, name, false)))
    }

    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.load(parent).await?;
        self.lookup_loaded(parent, name, false)
    }

    /// [`SnapshotFs::lookup`] for the kernel: the answer is a reference it
    /// holds until FORGET.
    pub async fn lookup_counted(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.load(parent).await?;
        self.lookup_loaded(parent, name, true)
    }

    /// The entries of `ino`, in name order; with `count`, those it picks
    /// are counted as references the kernel takes, under the listing's lock.
    fn list(&self, ino: u64, count: Option<&NamePicker<'_>>) -> Result<DirList> {
        self.with_children(ino, |st| self.list_loaded(st, ino, count))
    }

    fn list_loaded(&self, st: &State, ino: u64, count: Option<&NamePicker<'_>>) -> Result<DirList> {
        st.children(ino)?
            .ok_or_else(|| Error::NotFound("directory not loaded".into()))?
            .iter()
            .map(|(name, c)| {
                if count.is_some_and(|counted| counted(name)) {
                    st.get(*c)?.lookups.add(1);
                }
                Ok((name.to_vec(), self.attr_of(st, *c)?))
            })
            .collect()
    }

    /// Starts the download of the pack that holds the first small file a
    /// walk from directory `ino` reads, without waiting: see
    /// [`Fetcher::warm`]. For a directory's first listing; a file already
    /// changed in the upper layer is passed over. Whether a download
    /// started. Must be called within a tokio runtime.
    ///
    /// The file is the one a top-down walk in name order reaches first:
    /// the directory's own first small file, or else the first one below
    /// its first subdirectory that has any (a tree of directories that hold
    /// only directories near the top, such as `src/a/b/file`, then starts
    /// its download on the first listing, not on the third). At most
    /// [`WARM_DIRS`] directories are looked into.
    ///
    /// Cheap enough to come before the listing itself: a directory not yet
    /// expanded is read from its tree in memory, with no node made, and a
    /// tree not in memory ends the search there.
    pub fn warm_dir(&self, ino: u64) -> bool {
        self.warm_first(ino).is_some()
    }

    /// [`Self::warm_dir`]'s work: the file whose pack it started, if any.
    ///
    /// The download ends with the directory's own subtree when its last
    /// member is in the same pack: a pack is in path order, so a
    /// directory's subtree is one stretch of it, and a walk of `sub/`
    /// reads nothing after it. (A walk of a 2,781-file subtree of the real
    /// tree in the benchmark brought 43.5 MB, to the pack's end, where its
    /// checkout brings 13.1.) Unknown (a tree not in memory, or the budget
    /// spent): to the pack's end, as a read would.
    fn warm_first(&self, ino: u64) -> Option<Hash> {
        let (first, last) = {
            let st = self.st();
            let mut budget = WARM_DIRS;
            let first = self.first_small_below(&st, ino, &mut budget);
            let mut budget = WARM_DIRS;
            let last = match first {
                Below::Found(_) => self.last_member_below(&st, ino, &mut budget),
                _ => Below::Stop,
            };
            (first, last)
        };
        let last = match last {
            Below::Found(id) => Some(id),
            _ => None,
        };
        match first {
            Below::Found(id) if self.fetcher.warm_until(&id, last.as_ref()) => Some(id),
            _ => None,
        }
    }

    /// The entry of node `ino`'s subtree whose content comes last in path
    /// order (the order of a pack): its last small file or symlink by
    /// name, looking into the last directories first. `budget` counts the
    /// directories looked into.
    fn last_member_below(&self, st: &State, ino: u64, budget: &mut usize) -> Below {
        let kids = match st.get(ino).map(|n| &n.body) {
            Ok(Body::Dir { children: Some(kids), .. }) => kids,
            Ok(Body::Dir { children: None, clean: Some(id), .. }) => return self.last_member_in(id, budget),
            Ok(_) => return Below::Nothing,
            Err(_) => return Below::Stop,
        };
        if *budget == 0 {
            return Below::Stop;
        }
        *budget -= 1;
        for c in kids.values().rev() {
            match st.get(*c).map(|n| &n.body) {
                Ok(Body::Lower(e)) if packed_small(e) => return Below::Found(e.id),
                Ok(Body::Dir { .. }) => match self.last_member_below(st, *c, budget) {
                    Below::Nothing => {}
                    found_or_stop => return found_or_stop,
                },
                // Changed here, or content kept elsewhere (a large file).
                _ => {}
            }
        }
        Below::Nothing
    }

    /// [`Self::last_member_below`] for a directory not expanded: its tree,
    /// when in memory.
    fn last_member_in(&self, tree: &Hash, budget: &mut usize) -> Below {
        if *budget == 0 {
            return Below::Stop;
        }
        *budget -= 1;
        let Some(t) = self.tree_now(tree) else { return Below::Stop };
        for e in t.entries.iter().rev() {
            if packed_small(&Lower::of(e)) {
                return Below::Found(e.id);
            }
            if e.kind == Kind::Directory {
                match self.last_member_in(&e.id, budget) {
                    Below::Nothing => {}
                    found_or_stop => return found_or_stop,
                }
            }
        }
        Below::Nothing
    }

    /// [`Self::warm_dir`], then waits (at most `limit`) until the pack's
    /// GET is on its way: on two cores the listing that follows took the
    /// CPU the flight needed to send it, and the GET left ~5 ms after the
    /// listing began (a cold directory of 1,000 files at RTT 50 ms). The
    /// listing's reply is not needed before that GET's answer anyway.
    /// Blocks the calling thread: for a FUSE thread, not an async worker.
    pub fn warm_dir_waiting(&self, ino: u64, limit: std::time::Duration) -> bool {
        let Some(id) = self.warm_first(ino) else { return false };
        self.fetcher.wait_requested(&id, limit);
        true
    }

    /// The first small file of a top-down walk of node `ino` (see
    /// [`Self::warm_dir`]); `budget` counts the directories looked into.
    fn first_small_below(&self, st: &State, ino: u64, budget: &mut usize) -> Below {
        let kids = match st.get(ino).map(|n| &n.body) {
            Ok(Body::Dir { children: Some(kids), .. }) => kids,
            Ok(Body::Dir { children: None, clean: Some(id), .. }) => return self.first_small_in(id, budget),
            Ok(_) => return Below::Nothing,
            Err(_) => return Below::Stop,
        };
        if *budget == 0 {
            return Below::Stop;
        }
        *budget -= 1;
        let body = |c: &u64| st.get(*c).map(|n| &n.body);
        if let Some(e) = kids.values().find_map(|c| match body(c) {
            Ok(Body::Lower(e)) if warmable(e) => Some(e),
            _ => None,
        }) {
            return Below::Found(e.id);
        }
        for c in kids.values().filter(|c| matches!(body(c), Ok(Body::Dir { .. }))) {
            match self.first_small_below(st, *c, budget) {
                Below::Nothing => {}
                found_or_stop => return found_or_stop,
            }
        }
        Below::Nothing
    }

    /// [`Self::first_small_below`] for a directory not expanded: its tree,
    /// when in memory (a tree that is not ends the search: the walk would
    /// read what is in it first).
    fn first_small_in(&self, tree: &Hash, budget: &mut usize) -> Below {
        if *budget == 0 {
            return Below::Stop;
        }
        *budget -= 1;
        let Some(t) = self.tree_now(tree) else { return Below::Stop };
        if let Some(e) = t.entries.iter().find(|e| warmable(&Lower::of(e))) {
            return Below::Found(e.id);
        }
        for e in t.entries.iter().filter(|e| e.kind == Kind::Directory) {
            match self.first_small_in(&e.id, budget) {
                Below::Nothing => {}
                found_or_stop => return found_or_stop,
            }
        }
        Below::Nothing
    }

    /// Entries of a directory with their attributes.
    pub fn readdir_now(&self, ino: u64) -> Option<Result<DirList>> {
        Some(self.load_now(ino)?.and_then(|_| self.list(ino, None)))
    }

    pub async fn readdir(&self, ino: u64) -> Result<DirList> {
        self.load(ino).await?;
        self.list(ino, None)
    }

    /// Entries for READDIRPLUS, in name order: those `counted` picks are
    /// references the kernel may take, counted under the listing's lock;
    /// the caller gives back ([`SnapshotFs::uncount`]) the ones it did not
    /// send.
    pub fn readdir_now_counted(&self, ino: u64, counted: &dyn Fn(&[u8]) -> bool) -> Option<Result<DirList>> {
        Some(self.load_now(ino)?.and_then(|_| self.list(ino, Some(counted))))
    }

    /// [`SnapshotFs::readdir_now_counted`], fetching the tree if needed.
    pub async fn readdir_counted(&self, ino: u64, counted: &(dyn Fn(&[u8]) -> bool + Sync)) -> Result<DirList> {
        self.load(ino).await?;
        self.list(ino, Some(counted))
    }

    /// The parent inode of a directory (for `..`).
    pub fn parent_of(&self, ino: u64) -> u64 {
        self.st().get(ino).map(|n| n.parent).ok().filter(|p| *p != 0).unwrap_or(ROOT_INO)
    }

    pub async fn readlink(&self, ino: u64) -> Result<Bytes> {
        let e = {
            let st = self.st();
            let n = st.get(ino)?;
            match &n.body {
                Body::Link(t) => return Ok(Bytes::copy_from_slice(t)),
                Body::Lower(e) if e.kind == Kind::Symlink => e.entry(&n.name),
                _ => return Err(Error::fs(Errno::INVAL, "not a symlink")),
            }
        };
        self.timed("reading a symlink", self.fetcher.content(&e, "")).await
    }

    /// Opens a file for reading: brings its content in (through its pack
    /// on a cold read), so reads of a whole blob need no further request.
    pub async fn open(&self, ino: u64) -> Result<OpenFile> {
        let lower = {
            let st = self.st();
            let n = st.get(ino)?;
            match &n.body {
                Body::Upper { .. } => None,
                Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable) => Some(e.entry(&n.name)),
                Body::Dir { .. } | Body::Lower(_) => return Err(Error::fs(Errno::ISDIR, "not a regular file")),
                Body::Link(_) => return Err(Error::fs(Errno::LOOP, "a symlink")),
                Body::Special(..) => return Err(Error::fs(Errno::NXIO, "a FIFO, socket or device node")),
            }
        };
        let Some(e) = lower else {
            let file = self.open_upper(ino, false)?;
            return Ok(OpenFile::Upper { file, ino, writable: false });
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
            // A whole copy in the cache (built by an earlier read) may back
            // a passthrough open, once checked (`backing_file`).
            let backing = match self.is_writable() {
                true => None,
                false => manifest
                    .content
                    .map(|c| self.fetcher.cache.entry_path(&c))
                    .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.len() == manifest.size)),
            };
            return Ok(OpenFile::Chunked { entry: e, manifest, starts, ino, ahead: Readahead::default(), backing });
        }
        let data = self.timed("opening a file", self.fetcher.content(&e, &path)).await?;
        // The cache file a read-only mount may pass through (a workspace
        // never does: a later open for writing could not join it).
        let cache_path = match self.is_writable() {
            true => None,
            false => Some(self.fetcher.cache.entry_path(&e.id)).filter(|p| p.exists()),
        };
        self.count_open(ino)?;
        Ok(OpenFile::Whole { data, cache_path, ino: self.is_writable().then_some(ino) })
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
            OpenFile::Chunked { entry, manifest, starts, ahead, .. } => {
                self.read_chunked(entry, manifest, starts, ahead, offset, size).await
            }
        }
    }

    /// How many of the snapshot's files are chunked (large), and of how
    /// many: from the attached index (distinct contents), else from the
    /// trees loaded so far (all of them after
    /// [`SnapshotFs::preload_trees`]; a tree shared by several paths
    /// counts once).
    pub fn chunked_share(&self) -> (usize, usize) {
        if let Some((chunked, small)) = self.fetcher.file_shape() {
            return (chunked as usize, (chunked + small) as usize);
        }
        let trees = self.trees.read().expect("trees lock");
        let all = trees.map.values().map(|t| t.entries.len()).sum();
        let chunked = trees.map.values().map(|t| t.entries.iter().filter(|e| e.chunked).count()).sum();
        (chunked, all)
    }

    /// Makes every tree of the snapshot local, each visited once (read
    /// from the attached index or the disk cache, else fetched, level by
    /// level), so that metadata and a checkpoint's build need no network;
    /// memory keeps only the latest ([`TreeCache`](super::TreeCache)).
    /// Returns how many trees it visited.
    pub async fn preload_trees(&self) -> Result<usize> {
        let mut level = vec![self.root().hash()];
        // What this walk reached (a tree in memory or local may still have
        // trees below it that are not).
        let mut seen: std::collections::HashSet<Hash> = level.iter().copied().collect();
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
                .filter(|id| seen.insert(*id))
                .collect();
        }
        Ok(n)
    }
}

/// `SEEK_DATA` (`data`) or `SEEK_HOLE` from `offset` in a file of `size`
/// bytes laid out as `spans` (offset, length, whether it holds data): the
/// first offset at or after `offset` in data (or in a hole; the end of the
/// file counts as one). ENXIO at or past the end, or with no data after.
pub(crate) fn seek_in(
    spans: impl Iterator<Item = (u64, u64, bool)>,
    size: u64,
    offset: u64,
    data: bool,
) -> Result<u64> {
    let past = || Error::fs(Errno::NXIO, "no data at or after that offset");
    if offset >= size {
        return Err(past());
    }
    for (at, len, has_data) in spans {
        if at + len > offset && has_data == data {
            return Ok(at.max(offset));
        }
    }
    match data {
        true => Err(past()),
        false => Ok(size),
    }
}

impl SnapshotFs {
    /// `lseek(SEEK_DATA)` (`data`) or `SEEK_HOLE` on a file: an upper file
    /// answers for itself; a lower chunked file from its manifest's holes;
    /// any other file is data to its end.
    pub async fn seek_data_or_hole(&self, ino: u64, offset: u64, data: bool) -> Result<u64> {
        let (body, name) = {
            let st = self.st();
            let n = st.get(ino)?;
            match &n.body {
                Body::Dir { .. } => return Err(Error::fs(Errno::ISDIR, "a directory")),
                b => (b.clone(), n.name.clone()),
            }
        };
        match body {
            Body::Upper { blob, .. } => {
                let p = self.blob_path(blob)?;
                let f = crate::fsutil::open_regular(&p).map_err(Error::io(format!("opening {}", p.display())))?;
                let whence = match data {
                    true => rustix::fs::SeekFrom::Data(offset),
                    false => rustix::fs::SeekFrom::Hole(offset),
                };
                rustix::fs::seek(&f, whence).map_err(|e| Error::fs(e, "seeking in the upper file"))
            }
            Body::Lower(e) if e.chunked && matches!(e.kind, Kind::File | Kind::Executable) => {
                let path = String::from_utf8_lossy(&name).into_owned();
                let m = self.timed("reading a manifest", self.fetcher.manifest(&e.entry(&name), &path)).await?;
                seek_in(m.spans().map(|(at, len, id)| (at, len, id.is_some())), m.size, offset, data)
            }
            Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable) => {
                seek_in(std::iter::once((0, e.size, true)), e.size, offset, data)
            }
            _ => Err(Error::fs(Errno::INVAL, "not a regular file")),
        }
    }
}

#[cfg(test)]
mod seek_tests {
    use super::seek_in;

    #[test]
    fn seek_data_and_hole_follow_the_spans() {
        // Data 0..10, a hole 10..30, data 30..40, a hole 40..50.
        let spans = || [(0, 10, true), (10, 20, false), (30, 10, true), (40, 10, false)].into_iter();
        let at = |offset, data| seek_in(spans(), 50, offset, data).ok();
        assert_eq!(
            (at(0, true), at(5, true), at(10, true), at(35, true), at(40, true)),
            (Some(0), Some(5), Some(30), Some(35), None)
        );
        assert_eq!(
            (at(0, false), at(15, false), at(30, false), at(45, false)),
            (Some(10), Some(15), Some(40), Some(45))
        );
        assert_eq!((at(50, true), at(50, false), at(99, false)), (None, None, None));
        // A file of data only has its one hole at the end.
        let dense = |offset, data| seek_in(std::iter::once((0, 8, true)), 8, offset, data).ok();
        assert_eq!((dense(3, true), dense(3, false), dense(8, false)), (Some(3), Some(8), None));
    }
}
