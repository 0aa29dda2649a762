//! Checkpoint build: hashes the files written since the last checkpoint,
//! re-encodes the directories above them and lists every path's mtime
//! for the stat object; its cost follows the changes, not the tree.

use super::*;

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
    /// What is left out: `.git` directories (a checkout's own repository
    /// is not the workspace's content), FIFOs and sockets.
    pub ignored: u64,
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
    pub(super) fn build_with(
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
            let file = match crate::fsutil::open_regular(&p) {
                Ok(f) => f,
                // Unlinked (or replaced) since it was listed. A file still
                // in the tree is read again by the walk below, which fails
                // if its blob is truly gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("reading {}", p.display()))(e)),
            };
            let (id, chunked, _) = staged.content_from(cache, file, &p.display().to_string())?;
            hashed.push((*ino, *version, (id, chunked)));
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
        for (ino, version, id) in hashed {
            let Ok(n) = st.get_mut(ino) else { continue };
            hashed_count += 1;
            if n.version == version {
                if let Body::Upper { clean, .. } = &mut n.body {
                    *clean = Some(id);
                    fresh.insert(ino);
                }
            }
        }
        let mut b = Built {
            root: self.root(),
            stat: StatObject::default(),
            files_read: hashed_count,
            files_unchanged: 0,
            trees_built: 0,
            ignored: 0,
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
                    if let Body::Special(_) = &n.body {
                        // FIFOs and sockets are not source: not kept
                        // (counted with what is left out).
                        b.ignored += 1;
                        continue;
                    }
                    // Named by the entry it was reached through (a hard-linked
                    // file has several names; the node keeps one).
                    if ino != ROOT_INO && last_name(&path) == b".git" {
                        b.ignored += 1;
                        continue;
                    }
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
        out.pop().ok_or_else(|| Error::Internal("a checkpoint built no root entry".into()))
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
        let name = last_name(path).to_vec();
        let entry = |kind, chunked, size, id| Entry { name: name.clone(), kind, chunked, size, id };
        Ok(match &n.body {
            Body::Dir { clean, origin, children: None } => {
                let id = clean.ok_or_else(|| Error::Internal("an unloaded directory without a tree".into()))?;
                self.carry_stat(origin.as_deref(), id, path, &mut b.stat)?;
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
                if !fresh.contains(&ino) {
                    b.files_unchanged += 1;
                }
                entry(file_kind(n.perm), *chunked, *size, *id)
            }
            Body::Upper { blob, clean: None, .. } => {
                // Written while the checkpoint was hashing: hash it now.
                let p = upper_dir.join(blob.to_string());
                let (id, chunked, size) = staged.file(cache, &p)?;
                b.files_read += 1;
                if let Body::Upper { clean, .. } = &mut st.get_mut(ino)?.body {
                    *clean = Some((id, chunked));
                }
                entry(file_kind(n.perm), chunked, size, id)
            }
            Body::Special(_) => return Err(Error::Internal("a FIFO or socket reached build_leaf".into())),
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
        let u = self.overlay()?;
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

    /// After a checkpoint: the new snapshot (root tree `root`) becomes the
    /// base, so origins are the paths of now, the stat object is the one
    /// just written, and the saved state names the new root (a reopened
    /// mount loads its trees from it: the old root's trees need not be in
    /// any index of the new view once its layer was absorbed).
    pub fn rebase(&self, root: Hash, stat_id: Hash, stat: &StatObject) {
        let Some(u) = &self.upper else { return };
        *self.root.lock().expect("root lock") = root;
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

/// The last name of a `/`-joined path (the whole path at the top).
fn last_name(path: &[u8]) -> &[u8] {
    path.rsplit(|b| *b == b'/').next().unwrap_or(path)
}
