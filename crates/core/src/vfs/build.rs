//! Checkpoint build: hashes the files written since the last checkpoint,
//! re-encodes the directories above them and notes how the paths' mtimes
//! differ from the base's (the stat object's change); its cost follows the
//! directories in memory, not the tree.

use std::os::unix::ffi::OsStrExt;

use super::inode::{Body, Name, State};
use super::{file_kind, join, SnapshotFs, ROOT_INO};
use crate::cache::DiskCache;
use crate::error::{Error, Result};
use crate::hash::{Hash, TreeId};
use crate::object::StatObject;
use crate::object::{Entry, Kind, Tree};
use crate::upload::Staged;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// What a checkpoint of a read-write mount staged.
#[derive(Debug)]
pub struct Built {
    pub root: TreeId,
    /// How the stat object of this tree differs from the base's.
    pub stat: StatChange,
    /// Files hashed because they were written since the last checkpoint.
    pub files_read: u64,
    /// Files of the upper layer whose id was already known.
    pub files_unchanged: u64,
    /// Directories re-encoded.
    pub trees_built: u64,
    /// What is left out: `.git` directories (a checkout's own repository
    /// is not the workspace's content), FIFOs and sockets, and new paths
    /// ignore rules name ([`SnapshotFs::ignored_new_entries`]).
    pub ignored: u64,
}

/// How a build's stat object differs from the stat object its mount is
/// based on (`over`): paths whose mtime is new or changed, and paths gone,
/// both sorted. With no base stat object (`over` is `None`), `set` is
/// every path of the tree. [`SnapshotFs::stat_view`] makes the whole
/// object; the base's chain takes it as a layer
/// ([`StatObject::layer_of_change`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatChange {
    pub over: Option<Hash>,
    pub set: Vec<(Vec<u8>, i64, u32)>,
    pub removed: Vec<Vec<u8>>,
    /// Paths in the whole object.
    pub len: usize,
}

impl StatChange {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.removed.is_empty()
    }
}

/// Notes, as a build walks the directories in memory, how each path's
/// mtime differs from the base's.
struct StatDiff<'a> {
    /// Off for a dry build (`ws status`): nothing is noted.
    on: bool,
    base: &'a super::times::PathTimes,
    set: Vec<(Vec<u8>, i64, u32)>,
    removed: Vec<Vec<u8>>,
    /// Paths carried from the base to a new place with the mtime already
    /// there: not to be removed by a removal of what was there before.
    kept: Vec<Vec<u8>>,
    /// Paths set that the base lacks.
    added: usize,
}

impl StatDiff<'_> {
    fn note(&mut self, path: &[u8], secs: i64, nanos: u32) {
        if !self.on {
            return;
        }
        match self.base.get(path) {
            Some(t) if t == (secs, nanos) => {}
            Some(_) => self.set.push((path.to_vec(), secs, nanos)),
            None => {
                self.added += 1;
                self.set.push((path.to_vec(), secs, nanos));
            }
        }
    }

    /// A path carried from elsewhere: noted, and kept if unchanged.
    fn carry(&mut self, path: Vec<u8>, secs: i64, nanos: u32) {
        if self.base.get(&path) == Some((secs, nanos)) {
            self.kept.push(path);
        } else {
            self.note(&path, secs, nanos);
        }
    }

    /// Every base path below `dir` is gone (what is there now is noted or
    /// carried apart).
    fn gone_below(&mut self, dir: &[u8]) {
        if !self.on {
            return;
        }
        let prefix = [dir, b"/"].concat();
        self.removed.extend(self.base.with_prefix(&prefix).map(|(p, _, _)| p.to_vec()));
    }

    /// Directory `dir` now holds only `names` (sorted): every other child
    /// the base lists there, and what is below it, is gone.
    fn only_children(&mut self, dir: &[u8], names: &[&[u8]]) {
        if !self.on {
            return;
        }
        for c in self.base.children(dir) {
            if names.binary_search(&&c[..]).is_err() {
                let p = join(dir, &c);
                self.gone_below(&p);
                self.removed.push(p);
            }
        }
    }

    fn finish(mut self, over: Option<Hash>) -> StatChange {
        self.set.sort_unstable();
        self.set.dedup_by(|a, b| a.0 == b.0);
        let mut keep: Vec<&[u8]> = self.set.iter().map(|e| &e.0[..]).chain(self.kept.iter().map(|k| &k[..])).collect();
        keep.sort_unstable();
        self.removed.sort_unstable();
        self.removed.dedup();
        self.removed.retain(|p| keep.binary_search(&&p[..]).is_err());
        let len = self.base.len() + self.added - self.removed.len();
        StatChange { over, set: self.set, removed: self.removed, len }
    }
}

/// What a checkpoint leaves out by the ignore rules: new entries (`skip`),
/// and the directories above them, which stay unclean after the build so
/// that every checkpoint judges those entries again (the rules may change).
#[derive(Debug, Default)]
pub struct Skips {
    pub skip: std::collections::HashSet<u64>,
    pub keep_dirty: std::collections::HashSet<u64>,
    /// Change nothing in the tree (`ws status`): no file's or directory's
    /// id is recorded, so the next checkpoint stages everything again. (An
    /// id recorded by a build whose objects go nowhere would let the next
    /// checkpoint name objects it never uploads.)
    pub dry: bool,
    /// Keep `.git` directories (`--no-ignore`: keep everything), which a
    /// build leaves out by default.
    pub keep_git: bool,
}

/// How often a build starts over when a file is being written as the
/// tree walk reaches it (see [`SnapshotFs::build_with`]).
const BUILD_TRIES: u32 = 20;

/// A file hashed by a build: which upper file, as of which version, and
/// the id, chunking and length of the bytes read.
struct Hashing {
    blob: u64,
    version: u32,
    id: Hash,
    chunked: bool,
    size: u64,
}

type Hashed = HashMap<u64, Hashing>;

/// What the tree walk of one build reads.
struct Walk<'a> {
    cache: &'a DiskCache,
    upper_dir: &'a Path,
    fresh: &'a std::collections::HashSet<u64>,
    skips: &'a Skips,
    hashed: &'a Hashed,
    /// The base has a stat object: an unexpanded directory still where it
    /// was has its paths there already.
    listed: bool,
}

/// A changed directory as the ignore pass sees it.
struct DirtyDir {
    ino: u64,
    parent: u64,
    path: Vec<u8>,
    origin: Option<Vec<u8>>,
    /// (name, node, is a directory, is a lower entry)
    kids: Vec<(Vec<u8>, u64, bool, bool)>,
    /// Rule files here: (name, a lower entry's content or an upper blob).
    rules: Vec<(String, Result<Entry, u64>)>,
}

/// Lists the paths of tree `id` (already in memory) with the snapshot time.
fn list_tree_paths(fs: &SnapshotFs, id: Hash, path: &[u8], out: &mut StatObject) -> Result<()> {
    let mut stack = vec![(id, path.to_vec())];
    while let Some((id, path)) = stack.pop() {
        let t = fs.tree_now(&id).ok_or_else(|| Error::Internal(format!("tree {id} is not loaded")))?;
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

impl SnapshotFs {
    /// The new entries of a read-write mount (paths not in the snapshot it
    /// is based on) that `.gitignore` and `.madoignore` files on their way
    /// down ignore, with git's syntax and precedence, as a plain working
    /// copy's checkpoint judges them. Only changed directories can hold new
    /// entries, so only they are looked at; rule files in the lower layer
    /// are read through the fetcher.
    pub async fn ignored_new_entries(&self) -> Result<Skips> {
        let upper_dir = self.upper_dir()?;
        let dirs: Vec<DirtyDir> = {
            let st = self.st();
            let mut out = Vec::new();
            let mut stack = vec![(ROOT_INO, 0u64, Vec::new())];
            while let Some((ino, parent, path)) = stack.pop() {
                let n = st.get(ino)?;
                let Body::Dir { clean: None, origin, children: Some(ch) } = &n.body else { continue };
                let mut d = DirtyDir {
                    ino,
                    parent,
                    path: path.clone(),
                    origin: origin.as_deref().map(<[u8]>::to_vec),
                    kids: vec![],
                    rules: vec![],
                };
                for (name, c) in ch.iter() {
                    let Ok(k) = st.get(*c) else { continue };
                    let is_dir = matches!(k.body, Body::Dir { .. });
                    let lower = matches!(k.body, Body::Lower(_));
                    d.kids.push((name.to_vec(), *c, is_dir, lower));
                    if let Some(f) = crate::ignore_rules::RULE_FILES.iter().find(|f| f.as_bytes() == &name[..]) {
                        match &k.body {
                            Body::Lower(e) if e.kind.has_content() => d.rules.push((f.to_string(), Ok(e.entry(name)))),
                            Body::Upper { blob, .. } => d.rules.push((f.to_string(), Err(*blob))),
                            _ => {}
                        }
                    }
                    if is_dir {
                        stack.push((*c, ino, join(&path, name)));
                    }
                }
                out.push(d);
            }
            out
        };
        let root = self.root().hash();
        let mut skips = Skips::default();
        // Parents come before their children in `dirs` (depth first).
        let mut stacks: std::collections::HashMap<u64, Arc<Vec<ignore::gitignore::Gitignore>>> = Default::default();
        let mut gone: std::collections::HashSet<u64> = Default::default();
        for d in &dirs {
            if d.ino != ROOT_INO && (gone.contains(&d.parent) || skips.skip.contains(&d.ino)) {
                gone.insert(d.ino);
                continue;
            }
            let abs = std::path::Path::new("/").join(std::ffi::OsStr::from_bytes(&d.path));
            let mut texts = Vec::new();
            // .gitignore before .madoignore: the later one wins.
            for f in crate::ignore_rules::RULE_FILES {
                let Some((_, src)) = d.rules.iter().find(|(n, _)| n == f) else { continue };
                let bytes = match src {
                    Ok(e) => {
                        self.fetcher.content(e, &String::from_utf8_lossy(&join(&d.path, f.as_bytes()))).await?.to_vec()
                    }
                    Err(blob) => std::fs::read(upper_dir.join(blob.to_string())).map_err(Error::io(format!(
                        "reading the upper copy of {}",
                        String::from_utf8_lossy(&d.path)
                    )))?,
                };
                texts.push((f.to_string(), String::from_utf8_lossy(&bytes).into_owned()));
            }
            let parent_stack = stacks.get(&d.parent).cloned().unwrap_or_default();
            let stack = match crate::ignore_rules::matcher_from_texts(&abs, &texts)? {
                Some(gi) => {
                    let mut v = parent_stack.as_ref().clone();
                    v.push(gi);
                    Arc::new(v)
                }
                None => parent_stack,
            };
            stacks.insert(d.ino, stack.clone());
            if stack.is_empty() {
                continue;
            }
            // The names this directory had in the base snapshot: tracked.
            let base: std::collections::HashSet<Vec<u8>> = match &d.origin {
                None => Default::default(),
                Some(o) => {
                    let tree = if o.is_empty() {
                        Some(root)
                    } else {
                        match self.fetcher.lookup(root, &String::from_utf8_lossy(o)).await {
                            Ok(Some(e)) if e.kind == Kind::Directory => Some(e.id),
                            Ok(_) | Err(Error::NotFound(_)) => None,
                            Err(e) => return Err(e),
                        }
                    };
                    match tree {
                        Some(id) => self
                            .fetcher
                            .tree(id, &String::from_utf8_lossy(o))
                            .await?
                            .entries
                            .iter()
                            .map(|e| e.name.clone())
                            .collect(),
                        None => Default::default(),
                    }
                }
            };
            for (name, ino, is_dir, lower) in &d.kids {
                if *lower || base.contains(name) || name == b".git" {
                    continue;
                }
                let p = abs.join(std::ffi::OsStr::from_bytes(name));
                if crate::ignore_rules::ignored(&stack, &p, *is_dir) {
                    skips.skip.insert(*ino);
                }
            }
        }
        // The directories above each skipped entry stay unclean.
        if !skips.skip.is_empty() {
            let parent_of: std::collections::HashMap<u64, u64> = dirs.iter().map(|d| (d.ino, d.parent)).collect();
            for d in &dirs {
                if d.kids.iter().any(|(_, k, _, _)| skips.skip.contains(k)) {
                    let mut at = d.ino;
                    while skips.keep_dirty.insert(at) && at != ROOT_INO {
                        match parent_of.get(&at) {
                            Some(p) => at = *p,
                            None => break,
                        }
                    }
                }
            }
        }
        Ok(skips)
    }

    /// Whether a checkpoint needs every tree in memory first: when the
    /// base snapshot had no stat object, unexpanded subtrees' paths are
    /// listed from their trees (once; later checkpoints have one).
    pub fn needs_trees_for_build(&self) -> bool {
        self.upper.as_ref().is_some_and(|u| u.base.read().expect("base stat lock").id.is_none())
    }

    /// Stages a checkpoint of a read-write mount: hashes the files written
    /// since the last one, re-encodes the directories above them, and lists
    /// every path's mtime. Blocking (reads upper files): call it from a
    /// blocking thread.
    pub fn build(&self, cache: &DiskCache, staged: &mut Staged) -> Result<Built> {
        self.build_with(cache, staged, &Skips::default(), || {}, || {})
    }

    /// [`SnapshotFs::build`] leaving out what `skips` names.
    pub fn build_skipping(&self, cache: &DiskCache, staged: &mut Staged, skips: &Skips) -> Result<Built> {
        self.build_with(cache, staged, skips, || {}, || {})
    }

    /// [`SnapshotFs::build`], running `listed` once the changed files are
    /// listed (before they are read) and `between` after they were hashed
    /// and before the tree is encoded: where other requests may change the
    /// tree (tests put those changes there).
    ///
    /// Each file is hashed under its content lock (see `Upper::content`),
    /// so its entry is the node's bytes at one moment and its size is the
    /// length of those bytes. A file written after the listing is hashed
    /// during the tree walk if its lock is free at once; if a writer holds
    /// it (and waits for the state lock the walk holds), the build starts
    /// over, which lists that file with the others.
    pub(super) fn build_with(
        &self,
        cache: &DiskCache,
        staged: &mut Staged,
        skips: &Skips,
        listed: impl FnOnce(),
        between: impl FnOnce(),
    ) -> Result<Built> {
        let mut r = self.build_once(cache, staged, skips, listed, between);
        for _ in 0..BUILD_TRIES {
            match r {
                Err(Error::Busy(_)) => r = self.build_once(cache, staged, skips, || {}, || {}),
                _ => break,
            }
        }
        r
    }

    fn build_once(
        &self,
        cache: &DiskCache,
        staged: &mut Staged,
        skips: &Skips,
        listed: impl FnOnce(),
        between: impl FnOnce(),
    ) -> Result<Built> {
        let upper_dir = self.upper_dir()?;
        // Hash changed files without holding the state lock.
        let dirty: Vec<(u64, u64)> = {
            let st = self.st();
            let mut out = Vec::new();
            let mut stack = vec![ROOT_INO];
            while let Some(ino) = stack.pop() {
                if skips.skip.contains(&ino) {
                    continue;
                }
                let n = st.get(ino)?;
                match &n.body {
                    Body::Dir { children: Some(c), clean: None, .. } => stack.extend(c.values()),
                    Body::Upper { blob, clean: None, .. } => out.push((ino, *blob)),
                    _ => {}
                }
            }
            out
        };
        listed();
        let mut hashed = Hashed::new();
        for (ino, blob) in &dirty {
            let _content = self.content_lock(*ino)?.write().unwrap_or_else(|e| e.into_inner());
            // The version as of the bytes about to be read: no write can
            // come between (the content lock), so this is their version.
            let version = match self.st().get(*ino) {
                Ok(n) if matches!(n.body, Body::Upper { blob: b, .. } if b == *blob) => n.version,
                // Gone or replaced since it was listed.
                _ => continue,
            };
            let p = upper_dir.join(blob.to_string());
            let file = match crate::fsutil::open_regular(&p) {
                Ok(f) => f,
                // Unlinked since it was listed. A file still in the tree is
                // read again by the walk below, which fails if its blob is
                // truly gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("reading {}", p.display()))(e)),
            };
            let (id, chunked, size) = staged.content_of_file(cache, &file, &p.display().to_string())?;
            hashed.insert(*ino, Hashing { blob: *blob, version, id, chunked, size });
        }
        between();
        let mut st = self.st_mut();
        // Files hashed here are counted as read, not as unchanged, when the
        // tree walk below meets them (if it still does: they may have been
        // unlinked or renamed away meanwhile). A node gone since it was
        // listed is not counted: its upper file, kept for reuse, was read
        // for nothing (and may hold another file's bytes by now).
        let mut fresh = std::collections::HashSet::new();
        let mut hashed_count = 0;
        for (ino, h) in &hashed {
            let Ok(n) = st.get_mut(*ino) else { continue };
            hashed_count += 1;
            if n.version != h.version || skips.dry {
                continue;
            }
            if let Body::Upper { clean, size, blob } = &mut n.body {
                if *blob == h.blob && *size == h.size {
                    *clean = Some((h.id, h.chunked));
                    fresh.insert(*ino);
                }
            }
        }
        let mut b = Built {
            root: self.root(),
            stat: StatChange::default(),
            files_read: hashed_count,
            files_unchanged: 0,
            trees_built: 0,
            ignored: 0,
        };
        // After the state lock (the order rebase takes them in).
        let base = self.overlay()?.base.read().expect("base stat lock");
        let mut diff = StatDiff {
            on: !skips.dry,
            base: &base.mtimes,
            set: Vec::new(),
            removed: Vec::new(),
            kept: Vec::new(),
            added: 0,
        };
        let ctx =
            Walk { cache, upper_dir: &upper_dir, fresh: &fresh, skips, hashed: &hashed, listed: base.id.is_some() };
        let root = self.build_tree(&mut st, staged, &ctx, &mut b, &mut diff)?;
        b.root = TreeId::from_hash(root.id);
        b.stat = diff.finish(base.id);
        Ok(b)
    }

    /// Encodes the loaded part of the tree bottom-up (an explicit stack, so
    /// no depth of directories can overflow the thread's stack): changed
    /// directories become new trees, clean ones keep their id. Directories
    /// are marked clean only once the whole tree is built: a build that
    /// fails half way leaves no clean id naming a tree no upload carried.
    fn build_tree(
        &self,
        st: &mut State,
        staged: &mut Staged,
        ctx: &Walk<'_>,
        b: &mut Built,
        diff: &mut StatDiff<'_>,
    ) -> Result<Entry> {
        enum Step {
            /// A node, its path, its parent directory.
            Enter(u64, Vec<u8>, u64),
            /// Every child's entry is in `out[from..]`.
            Exit { ino: u64, path: Vec<u8>, from: usize, parent: u64 },
        }
        let skips = ctx.skips;
        // Directories that left a `.git` out, and those above them: not
        // marked clean, so a later `--no-ignore` build looks again (a clean
        // directory's tree is reused as it is).
        let mut held: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut now_clean: Vec<(u64, Hash)> = Vec::new();
        let mut out: Vec<Entry> = Vec::new();
        let mut stack = vec![Step::Enter(ROOT_INO, Vec::new(), 0)];
        while let Some(step) = stack.pop() {
            match step {
                Step::Enter(ino, path, parent) => {
                    if skips.skip.contains(&ino) {
                        b.ignored += 1;
                        continue;
                    }
                    let n = st.get(ino)?;
                    if let Body::Special(..) = &n.body {
                        // FIFOs, sockets and devices are not source: not
                        // kept (counted with what is left out).
                        b.ignored += 1;
                        continue;
                    }
                    // Named by the entry it was reached through (a hard-linked
                    // file has several names; the node keeps one).
                    if !skips.keep_git && ino != ROOT_INO && last_name(&path) == b".git" {
                        b.ignored += 1;
                        held.insert(parent);
                        continue;
                    }
                    if let Body::Dir { children: Some(ch), .. } = &n.body {
                        let (secs, nanos) = n.mtime();
                        diff.note(&path, secs, nanos);
                        let kids: Vec<(Name, u64)> = ch.iter().map(|(k, v)| (k.clone(), *v)).collect();
                        stack.push(Step::Exit { ino, path: path.clone(), from: out.len(), parent });
                        stack.extend(kids.into_iter().rev().map(|(name, c)| Step::Enter(c, join(&path, &name), ino)));
                    } else {
                        let e = self.build_leaf(st, ino, &path, staged, ctx, b, diff)?;
                        // An entry that is not the file's content now (the
                        // bytes hashed before a later write): the
                        // directories above stay unclean, or the next
                        // build would reuse their trees and never look at
                        // the file again.
                        if matches!(st.get(ino)?.body, Body::Upper { clean: None, .. }) {
                            held.insert(parent);
                        }
                        out.push(e);
                    }
                }
                Step::Exit { ino, path, from, parent } => {
                    if held.contains(&ino) {
                        held.insert(parent);
                    }
                    let entries = out.split_off(from);
                    // Children the base lists here that are not here now
                    // (names are unique and sorted: `Tree::normalized`
                    // refuses repeats below).
                    let mut names: Vec<&[u8]> = entries.iter().map(|e| &e.name[..]).collect();
                    names.sort_unstable();
                    diff.only_children(&path, &names);
                    let n = st.get(ino)?;
                    let (name, clean) = match &n.body {
                        Body::Dir { clean, .. } => (n.name.clone(), *clean),
                        _ => return Err(Error::Internal("a directory changed kind during a checkpoint".into())),
                    };
                    let id = match clean {
                        Some(id) => id,
                        None => {
                            let tree = Tree::normalized(entries).map_err(|e| Error::UnsafePath {
                                path: String::from_utf8_lossy(&path).into_owned(),
                                reason: e.to_string(),
                            })?;
                            b.trees_built += 1;
                            let id = staged.tree(ctx.cache, &tree)?;
                            if !skips.dry && !skips.keep_dirty.contains(&ino) && !held.contains(&ino) {
                                now_clean.push((ino, id));
                            }
                            id
                        }
                    };
                    out.push(Entry { name: name.to_vec(), kind: Kind::Directory, chunked: false, size: 0, id });
                }
            }
        }
        let root = out.pop().ok_or_else(|| Error::Internal("a checkpoint built no root entry".into()))?;
        for (ino, id) in now_clean {
            if let Body::Dir { clean, .. } = &mut st.get_mut(ino)?.body {
                *clean = Some(id);
            }
        }
        Ok(root)
    }

    /// The entry of one node that is not a loaded directory.
    #[allow(clippy::too_many_arguments)]
    fn build_leaf(
        &self,
        st: &mut State,
        ino: u64,
        path: &[u8],
        staged: &mut Staged,
        ctx: &Walk<'_>,
        b: &mut Built,
        diff: &mut StatDiff<'_>,
    ) -> Result<Entry> {
        let n = st.get(ino)?.clone();
        let (secs, nanos) = n.mtime();
        diff.note(path, secs, nanos);
        if !matches!(n.body, Body::Dir { .. }) {
            // Where the base may have had a directory: nothing is below
            // a file or a link.
            diff.gone_below(path);
        }
        let name = last_name(path).to_vec();
        let entry = |kind, chunked, size, id| Entry { name: name.clone(), kind, chunked, size, id };
        Ok(match &n.body {
            Body::Dir { clean, origin, children: None } => {
                let id = clean.ok_or_else(|| Error::Internal("an unloaded directory without a tree".into()))?;
                // Still where the base has it: its paths are there with
                // their times. Moved (or no base stat object): carried.
                if diff.on && (!ctx.listed || origin.as_deref() != Some(path)) {
                    diff.gone_below(path);
                    self.carry_stat(origin.as_deref(), id, path, diff)?;
                }
                entry(Kind::Directory, false, 0, id)
            }
            Body::Dir { children: Some(_), .. } => {
                return Err(Error::Internal("a loaded directory reached build_leaf".into()));
            }

            Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable) => {
                entry(file_kind(n.perm), e.chunked, e.size, e.id)
            }
            Body::Lower(e) => entry(e.kind, e.chunked, e.size, e.id),
            Body::Upper { clean: Some((id, chunked)), size, .. } => {
                if !ctx.fresh.contains(&ino) {
                    b.files_unchanged += 1;
                }
                entry(file_kind(n.perm), *chunked, *size, *id)
            }
            // Hashed above and written since: the bytes as they were then
            // (one moment of the file, with their own length). The next
            // checkpoint hashes it again.
            Body::Upper { blob, clean: None, .. } if ctx.hashed.get(&ino).is_some_and(|h| h.blob == *blob) => {
                let h = &ctx.hashed[&ino];
                entry(file_kind(n.perm), h.chunked, h.size, h.id)
            }
            Body::Upper { blob, clean: None, .. } => {
                // Written after the listing: hashed now, if no writer is
                // between its write and its node's update (it would be
                // waiting for the state lock held here).
                let Ok(_content) = self.content_lock(ino)?.try_write() else {
                    return Err(Error::Busy(format!("{} is being written", String::from_utf8_lossy(path))));
                };
                let p = ctx.upper_dir.join(blob.to_string());
                let (id, chunked, size) = staged.file(ctx.cache, &p)?;
                b.files_read += 1;
                if !ctx.skips.dry {
                    if let Body::Upper { clean, size: s, .. } = &mut st.get_mut(ino)?.body {
                        if *s == size {
                            *clean = Some((id, chunked));
                        }
                    }
                }
                entry(file_kind(n.perm), chunked, size, id)
            }
            Body::Special(..) => return Err(Error::Internal("a special file reached build_leaf".into())),
            Body::Link(t) => {
                let (id, _) = staged.content(ctx.cache, t)?;
                entry(Kind::Symlink, false, t.len() as u64, id)
            }
        })
    }

    /// The mtimes of an unexpanded subtree now at `path`: from the base
    /// stat object under its origin, or the snapshot's time for each path
    /// of its trees when the base had none.
    fn carry_stat(&self, origin: Option<&[u8]>, tree: Hash, path: &[u8], diff: &mut StatDiff<'_>) -> Result<()> {
        let base = diff.base;
        if let (true, Some(o)) = (base.len() > 0, origin) {
            let prefix = if o.is_empty() { Vec::new() } else { [o, b"/"].concat() };
            for (k, s, ns) in base.with_prefix(&prefix) {
                if k.is_empty() {
                    continue;
                }
                diff.carry(join(path, &k[prefix.len()..]), s, ns);
            }
            return Ok(());
        }
        let mut listed = StatObject::default();
        list_tree_paths(self, tree, path, &mut listed)?;
        for (p, s, ns) in listed.entries {
            diff.carry(p, s, ns);
        }
        Ok(())
    }

    /// After a checkpoint: the new snapshot (root tree `root`) becomes the
    /// base, so origins are the paths of now, the stat object is the one
    /// just written, and the saved state names the new root (a reopened
    /// mount loads its trees from it: the old root's trees need not be in
    /// any index of the new view once its layer was absorbed).
    pub fn rebase(&self, root: TreeId, stat_id: Hash, stat: &StatChange) {
        let root = root.hash();
        let Some(u) = &self.upper else { return };
        // The new base's times, made and written before any lock a request
        // waits on is taken (the base moves only here, and checkpoints of a
        // mount take turns: [`SnapshotFs::checkpoint_turn`]). A checkpoint
        // that changed nothing keeps the base it has (the same object, and
        // perhaps a file other mounts share).
        let times = {
            let base = u.base.read().expect("base stat lock");
            // A change is noted against the base of its build.
            debug_assert_eq!(base.id, stat.over, "a stat change applied over another base");
            (base.id != Some(stat_id)).then(|| {
                // With no base stat object the times are empty and `set` is
                // every path.
                let at = self.fetcher.cache.flat_times_path(&stat_id);
                base.mtimes.apply(&stat.set, &stat.removed).kept_at(&at, &stat_id)
            })
        };
        // All of the rest under the state lock, which a save holds while it
        // serializes: no save sees the new root with the old origins.
        let mut st = self.st_mut();
        *self.root.lock().expect("root lock") = root;
        let mut stack = vec![(ROOT_INO, Vec::new())];
        while let Some((ino, path)) = stack.pop() {
            let Ok(n) = st.get_mut(ino) else { continue };
            if let Body::Dir { origin, children, .. } = &mut n.body {
                *origin = Some(path.as_slice().into());
                if let Some(c) = children {
                    stack.extend(c.iter().map(|(name, c)| (*c, join(&path, name))));
                }
            }
        }
        let Some(times) = times else { return };
        let mut base = u.base.write().expect("base stat lock");
        base.mtimes = times;
        // The file an earlier rebase of this mount wrote is its own
        // (another mount's base is the file it opened with): it goes, so
        // that a workspace keeps one such file, its newest. (A mount that
        // maps it keeps its pages; its next open makes the file again.)
        if let Some(old) = base.id.filter(|_| base.own_file) {
            let _ = std::fs::remove_file(self.fetcher.cache.flat_times_path(&old));
        }
        base.own_file = true;
        base.id = Some(stat_id);
    }

    /// The whole stat object of a build: the base's with `change` applied.
    pub fn stat_view(&self, change: &StatChange) -> Result<StatObject> {
        let base = self.overlay()?.base.read().expect("base stat lock");
        if base.id != change.over {
            return Err(Error::Internal("the mount's base moved since its build".into()));
        }
        let t = base.mtimes.apply(&change.set, &change.removed);
        Ok(StatObject::whole(t.with_prefix(b"").map(|(p, s, n)| (p.to_vec(), s, n)).collect()))
    }

    /// Whether the base has a stat object (without one, a checkpoint's
    /// change lists every path).
    pub fn has_base_stat(&self) -> bool {
        self.upper.as_ref().is_some_and(|u| u.base.read().expect("base stat lock").id.is_some())
    }

    /// A path's mtime in the base's stat object.
    pub fn base_stat_of(&self, path: &[u8]) -> Option<(i64, u32)> {
        self.upper.as_ref()?.base.read().expect("base stat lock").mtimes.get(path)
    }
}

/// The last name of a `/`-joined path (the whole path at the top).
fn last_name(path: &[u8]) -> &[u8] {
    path.rsplit(|b| *b == b'/').next().unwrap_or(path)
}
