//! The inode table: nodes by number (never reused within a mount), what
//! each holds, the kernel's references and open handles, and folding idle
//! directories back into their tree id so memory follows what is in use.

use super::{now, NodeKind, SnapshotFs, ROOT_INO};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{Entry, Kind};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// A name in a directory, shared by the node and its parent's children
/// (one allocation, not two).
pub(super) type Name = Arc<[u8]>;

/// A directory's children by name.
pub(super) type Children = BTreeMap<Name, u64>;

/// A file, symlink, directory or gitlink of the lower layer: its tree
/// entry without the name (the node has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Lower {
    pub(super) kind: Kind,
    pub(super) chunked: bool,
    pub(super) size: u64,
    pub(super) id: Hash,
}

impl Lower {
    pub(super) fn of(e: &Entry) -> Lower {
        Lower { kind: e.kind, chunked: e.chunked, size: e.size, id: e.id }
    }

    /// The tree entry `name` of this content.
    pub(super) fn entry(&self, name: &[u8]) -> Entry {
        Entry { name: name.to_vec(), kind: self.kind, chunked: self.chunked, size: self.size, id: self.id }
    }
}

/// What a node holds.
#[derive(Clone, Debug)]
pub(super) enum Body {
    /// A directory. `clean` is its tree id while nothing below changed;
    /// `children` is `None` until something looks into it (then `clean`
    /// is always set). `origin` is its path in the base snapshot, where
    /// the mtimes of an unexpanded subtree are found.
    Dir { clean: Option<Hash>, origin: Option<Box<[u8]>>, children: Option<Box<Children>> },
    /// A file, symlink or gitlink of the lower layer, untouched.
    Lower(Lower),
    /// A file of the upper layer (`upper/<blob>`); `clean` is its id and
    /// chunking while its content is known.
    Upper { blob: u64, size: u64, clean: Option<(Hash, bool)> },
    /// A symlink made here.
    Link(Box<[u8]>),
    /// A FIFO, socket or device node made here ([`NodeKind::Fifo`],
    /// [`NodeKind::Socket`], [`NodeKind::BlockDev`] or
    /// [`NodeKind::CharDev`], with its device number): kept while mounted,
    /// never checkpointed, never opened as a device (the mount is nodev).
    Special(NodeKind, u32),
}

/// A node, as small as a clean file can be: a walk of a million files
/// holds a million of these (issue #46 asks for at most 300 bytes a file,
/// table and names included). What few nodes have is boxed in [`Meta`].
#[derive(Clone, Debug)]
pub(super) struct Node {
    /// 0 once unlinked.
    pub(super) parent: u64,
    pub(super) name: Name,
    /// The mtime, seconds and nanoseconds apart (as a pair it would take
    /// 16 bytes where 12 do: see [`Node::mtime`]).
    secs: i64,
    nanos: u32,
    /// Bumped on every content change (a checkpoint hashing a file keeps
    /// its id only if nothing wrote meanwhile; wrapping: 2^32 writes within
    /// one file's hashing are beyond reach).
    pub(super) version: u32,
    /// References the kernel holds (entries it was given and has not
    /// forgotten): a node is dropped only when nothing but the kernel knew
    /// it and the kernel let go.
    pub(super) lookups: Refs,
    /// Open handles: an unlinked file's upper blob stays until the last one
    /// closes.
    pub(super) opens: u32,
    pub(super) perm: u16,
    /// Mode or mtime set by the user (kept in memory, so never collapsed).
    pub(super) touched: bool,
    /// What only some nodes have: hard links, an owner and times apart
    /// from the mtime, when the last name went. `None` for most nodes.
    pub(super) meta: Option<Box<Meta>>,
    pub(super) body: Body,
}

/// The kernel's references to a node. Counted up under the inode
/// table's read lock by lookups of a loaded directory, which run side by
/// side ([`Refs::add`] is atomic); counted down, and judged zero to drop
/// or fold the node, only under its write lock, which no lookup holds.
#[derive(Debug, Default)]
pub(super) struct Refs(AtomicU64);

impl Refs {
    pub(super) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }

    /// `n` more references (under the read lock or the write lock).
    pub(super) fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// `n` references dropped (FORGET), never below none.
    pub(super) fn forget(&mut self, n: u64) {
        let r = self.0.get_mut();
        *r = r.saturating_sub(n);
    }

    pub(super) fn set(&mut self, n: u64) {
        *self.0.get_mut() = n;
    }
}

impl Clone for Refs {
    fn clone(&self) -> Refs {
        Refs(AtomicU64::new(self.get()))
    }
}

/// What a node has beyond a clean file's fields, while mounted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Meta {
    /// (uid, gid); `None`: the mount's owner.
    pub(super) owner: Option<(u32, u32)>,
    /// `None`: the mtime.
    pub(super) atime: Option<(i64, u32)>,
    /// `None`: the mtime.
    pub(super) ctime: Option<(i64, u32)>,
    /// Hard links besides (`parent`, `name`): every other directory entry
    /// that names this node. Never for a directory. A node with links is
    /// never folded away (its names would come back as separate files).
    pub(super) links: Vec<(u64, Name)>,
    /// `changes()` when its last name went (a save counted past it no
    /// longer names its upper file); `None` while it has a name.
    pub(super) detached_at: Option<u64>,
}

impl Node {
    pub(super) fn new(parent: u64, name: Name, perm: u16, mtime: (i64, u32), body: Body) -> Node {
        let (secs, nanos) = mtime;
        let lookups = Refs::default();
        Node { parent, name, perm, secs, nanos, version: 0, lookups, opens: 0, touched: false, meta: None, body }
    }

    pub(super) fn with_meta(self, meta: Option<Box<Meta>>) -> Node {
        Node { meta, ..self }
    }

    pub(super) fn mtime(&self) -> (i64, u32) {
        (self.secs, self.nanos)
    }

    pub(super) fn set_mtime(&mut self, (secs, nanos): (i64, u32)) {
        (self.secs, self.nanos) = (secs, nanos);
    }

    pub(super) fn meta_mut(&mut self) -> &mut Meta {
        self.meta.get_or_insert_with(Default::default)
    }

    /// Hard links besides (`parent`, `name`).
    pub(super) fn links(&self) -> &[(u64, Name)] {
        self.meta.as_deref().map_or(&[], |m| &m.links[..])
    }

    /// `changes()` when its last name went.
    pub(super) fn detached_at(&self) -> Option<u64> {
        self.meta.as_deref().and_then(|m| m.detached_at)
    }

    /// Content or entries changed now: the mtime, and with it the ctime.
    pub(super) fn modified(&mut self) {
        self.set_mtime(now());
        if let Some(m) = &mut self.meta {
            m.ctime = None;
        }
        self.tidy_meta();
    }

    /// Its inode changed now (mode, owner, names, times): the ctime.
    pub(super) fn changed_now(&mut self) {
        self.meta_mut().ctime = Some(now());
    }

    /// Drops a [`Meta`] that holds nothing.
    pub(super) fn tidy_meta(&mut self) {
        if self.meta.as_deref().is_some_and(|m| *m == Meta::default()) {
            self.meta = None;
        }
    }

    /// Directory entries naming this node (0 once unlinked).
    pub(super) fn nlink(&self) -> u32 {
        match self.parent {
            0 => 0,
            _ => 1 + self.links().len() as u32,
        }
    }

    /// Drops the entry `name` in `parent` from this node's names. Returns
    /// whether that was its last name (the caller then detaches it).
    pub(super) fn drop_name(&mut self, parent: u64, name: &[u8]) -> bool {
        let Some(m) = self.meta.as_deref_mut() else { return true };
        if let Some(i) = m.links.iter().position(|(p, n)| *p == parent && &n[..] == name) {
            m.links.swap_remove(i);
            self.tidy_meta();
            return false;
        }
        match m.links.pop() {
            Some((p, n)) => {
                self.parent = p;
                self.name = n;
                self.tidy_meta();
                false
            }
            None => true,
        }
    }

    /// Renames the entry `name` in `parent` of this node.
    pub(super) fn move_name(&mut self, parent: u64, name: &[u8], to_parent: u64, to_name: &Name) {
        let link =
            self.meta.as_deref_mut().and_then(|m| m.links.iter_mut().find(|(p, n)| *p == parent && &n[..] == name));
        match link {
            Some(l) => *l = (to_parent, to_name.clone()),
            None => {
                self.parent = to_parent;
                self.name = to_name.clone();
            }
        }
    }
}

pub(super) struct State {
    /// By inode number. Numbers are never reused within a mount, so a
    /// number the kernel still holds can never name another node.
    pub(super) nodes: super::table::Nodes,
    pub(super) next_ino: u64,
    pub(super) next_blob: u64,
    /// Upper files no node names any more, emptied and kept for new files
    /// ([`SnapshotFs::recycle`]): each blob number with the change count
    /// when it was freed. Oldest first.
    pub(super) spare: std::collections::VecDeque<(u64, u64)>,
    /// The table shrank since the last FORGET looked.
    pub(super) shrunk: bool,
    /// Where numbers given and dropped are logged, when they are kept
    /// ([`SnapshotFs::keep_numbers`]).
    pub(super) log: Option<super::numbers::NumberLog>,
}

impl Node {
    /// Unchanged, unopened and with nothing below it in memory: a leaf a
    /// fold may drop (its tree gives it back).
    pub(super) fn is_plain_leaf(&self) -> bool {
        self.opens == 0
            && self.meta.is_none()
            && matches!(self.body, Body::Lower(_) | Body::Dir { clean: Some(_), children: None, .. })
    }
}

impl State {
    /// Drops directory `dir`'s children (judged idle by the caller): the
    /// directory is its tree id again.
    pub(super) fn fold(&mut self, dir: u64) {
        let kids: Vec<u64> = match self.get(dir) {
            Ok(Node { body: Body::Dir { children: Some(kids), .. }, .. }) => kids.values().copied().collect(),
            _ => return,
        };
        for k in kids {
            self.nodes.remove(k);
        }
        if let Ok(Node { body: Body::Dir { children, .. }, .. }) = self.get_mut(dir) {
            *children = None;
        }
    }

    pub(super) fn with_root(root: Node) -> State {
        State {
            nodes: {
                let mut t = super::table::Nodes::default();
                t.insert(ROOT_INO, root);
                t
            },
            next_ino: ROOT_INO + 1,
            next_blob: 1,
            spare: Default::default(),
            shrunk: false,
            log: None,
        }
    }

    /// Gives memory back once most nodes are gone (a table never shrinks
    /// by itself: after a walk of a million files and the kernel's
    /// forgetting them, it would keep room for a million). Notes that it
    /// did, for [`SnapshotFs::forget`] to give the freed memory back too.
    pub(super) fn shrink(&mut self) {
        if self.nodes.shrink() {
            self.shrunk = true;
        }
    }

    pub(super) fn get(&self, ino: u64) -> Result<&Node> {
        self.nodes.get(ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
    }

    pub(super) fn get_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes.get_mut(ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
    }

    pub(super) fn push(&mut self, n: Node) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, n);
        ino
    }

    /// The children of a loaded directory; `Ok(None)` if not loaded yet.
    pub(super) fn children(&self, ino: u64) -> Result<Option<&Children>> {
        static EMPTY: Children = BTreeMap::new();
        match &self.get(ino)?.body {
            Body::Dir { children, .. } => Ok(children.as_deref()),
            Body::Lower(e) if e.kind == Kind::Gitlink => Ok(Some(&EMPTY)),
            _ => Err(Error::fs(Errno::NOTDIR, "not a directory")),
        }
    }

    pub(super) fn child(&self, parent: u64, name: &[u8]) -> Result<u64> {
        let ch = self.children(parent)?.ok_or_else(|| Error::NotFound("directory not loaded".into()))?;
        ch.get(name).copied().ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))
    }

    pub(super) fn children_mut(&mut self, ino: u64) -> Result<&mut Children> {
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
    pub(super) fn dirty(&mut self, ino: u64) {
        // A node with hard links changes every directory that names it.
        let also: Vec<u64> = match self.get(ino) {
            Ok(n) => n.links().iter().map(|(p, _)| *p).collect(),
            Err(_) => return,
        };
        self.dirty_up(ino);
        for p in also {
            self.dirty_up(p);
        }
    }

    fn dirty_up(&mut self, mut ino: u64) {
        loop {
            let Ok(n) = self.get_mut(ino) else { return };
            n.version = n.version.wrapping_add(1);
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
    pub(super) fn touch_dir(&mut self, ino: u64) {
        if let Ok(n) = self.get_mut(ino) {
            n.modified();
        }
        self.dirty(ino);
    }

    pub(super) fn is_ancestor(&self, a: u64, mut b: u64) -> bool {
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

impl SnapshotFs {
    /// Takes back references counted for entries the kernel never got.
    /// Unlike FORGET it tries no folding: a READDIRPLUS of a large
    /// directory gives most of its entries back on every call, and
    /// folding is judged on the next real FORGET.
    pub fn uncount(&self, inos: &[u64]) {
        let mut st = self.st_mut();
        for ino in inos {
            if let Ok(n) = st.get_mut(*ino) {
                n.lookups.forget(1);
            }
            self.reap(&mut st, *ino);
        }
    }

    /// The kernel opens and closes files without telling this process
    /// (FUSE's no-open mode: reads and writes name the inode, not a
    /// handle). From now on a reference the kernel holds keeps an unlinked
    /// file's content as an open handle does: a process may still have it
    /// open, and the kernel forgets the inode only after its last close.
    pub fn untrack_opens(&self) {
        self.untracked_opens.store(true, Relaxed);
    }

    /// Whether something may still read `n`'s content: an open handle, or
    /// in no-open mode a reference of the kernel.
    pub(super) fn held(&self, n: &Node) -> bool {
        n.opens > 0 || (n.lookups.get() > 0 && self.untracked_opens.load(Relaxed))
    }

    /// Counts a new handle of `ino`. A node that was unlinked while nothing
    /// held it is gone (its upper blob may be deleted already).
    pub(super) fn count_open(&self, ino: u64) -> Result<()> {
        let mut st = self.st_mut();
        let n = st.get_mut(ino)?;
        if ino != ROOT_INO && n.parent == 0 && !self.held(n) {
            return Err(Error::NotFound(format!("inode {ino} was removed")));
        }
        n.opens += 1;
        Ok(())
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
        // Counted up: the read lock does (see `Refs`).
        if let Ok(node) = self.st().get(ino) {
            node.lookups.add(n);
        }
    }

    /// The kernel dropped `n` references to `ino` (FORGET).
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut st = self.st_mut();
        let Ok(node) = st.get_mut(ino) else { return };
        node.lookups.forget(n);
        if node.parent == 0 {
            self.reap(&mut st, ino);
        } else {
            let parent = node.parent;
            self.collapse(&mut st, parent);
        }
        if std::mem::take(&mut st.shrunk) {
            drop(st);
            // Most of what a walk loaded is forgotten: so are the tables it
            // built on the way (each is read again locally when needed).
            self.trees.write().expect("trees lock").clear();
            self.fetcher.shed();
            crate::memory::give_back();
        }
    }

    /// Drops a detached node nothing holds (and its blob, once no handle
    /// has it open). Returns whether `ino` is gone.
    pub(super) fn reap(&self, st: &mut State, ino: u64) -> bool {
        let Ok(n) = st.get(ino) else { return true };
        if ino == ROOT_INO || n.parent != 0 || self.held(n) {
            return false;
        }
        // The blob goes with the node, once the kernel forgets it too
        // (until then a later FORGET comes back here): never unlinked now,
        // while a saved state may still name it.
        if let Body::Upper { blob, size, .. } = n.body {
            if n.lookups.get() == 0 {
                let freed = n.detached_at().unwrap_or_else(|| self.changes());
                self.recycle(st, blob, size, freed);
            }
        }
        let Ok(n) = st.get(ino) else { return true };
        if n.lookups.get() == 0 {
            st.nodes.remove(ino);
            st.shrink();
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
        // Only a tree in memory, or read locally, can be unfolded again
        // without waiting.
        if self.trees.read().expect("trees lock").get(id).is_none() && !self.fetcher.is_local(id) {
            return false;
        }
        let idle = |c: &u64| st.get(*c).is_ok_and(|n| n.lookups.get() == 0 && !n.touched && n.is_plain_leaf());
        if !kids.values().all(idle) {
            return false;
        }
        st.fold(dir);
        st.shrink();
        st.log_fold(dir);
        true
    }

    /// How many nodes are in memory (for stats and memory tests).
    pub fn node_count(&self) -> usize {
        self.st().nodes.len()
    }

    /// Whether the inode table's lock could be taken within `wait` (a
    /// watchdog's probe: never blocks for longer). Every request takes it;
    /// held past a few seconds, requests are stuck behind it.
    pub fn state_lock_free_within(&self, wait: Duration) -> bool {
        let t = std::time::Instant::now();
        loop {
            match self.state.try_read() {
                Ok(_) | Err(std::sync::TryLockError::Poisoned(_)) => return true,
                Err(std::sync::TryLockError::WouldBlock) if t.elapsed() >= wait => return false,
                Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }
}
