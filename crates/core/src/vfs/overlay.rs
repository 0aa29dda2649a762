//! The overlay of a workspace: copy-up, writes, truncate and chmod,
//! create, mkdir, symlink, unlink, rmdir and rename. Only a read-write
//! filesystem has one; every entry point here refuses with EROFS
//! otherwise (`SnapshotFs::overlay` decides).

use super::inode::{Body, Name, Node, State};
use super::{mount_owner, new_name_ok, now, Attr, NodeKind, OpenFile, SetAttr, SnapshotFs, ROOT_INO};
use crate::error::{Error, Result};
use crate::object::Kind;
use bytes::Bytes;
use rustix::io::Errno;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

/// The mode of a file's upper copy: the file's own permission bits (a
/// 0600 file stays 0600 on the disk too), plus what the daemon needs to
/// read and write it.
fn upper_mode(perm: u16) -> u32 {
    (perm as u32 & 0o777) | 0o600
}

/// At most this many freed upper files wait to be reused, each of at
/// most `SPARE_BYTES` (a larger one is unlinked at once): their bytes stay
/// until reuse, at most 64 MiB.
const SPARE_MAX: usize = 1024;
const SPARE_BYTES: u64 = 64 << 10;

pub(super) fn read_upper(file: &std::fs::File, offset: u64, size: u32) -> Result<Bytes> {
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

impl SnapshotFs {
    /// Opens the upper file of `ino` and counts the handle, under the lock
    /// that unlink takes: the blob cannot go between the check and the open.
    pub(super) fn open_upper(&self, ino: u64, write: bool) -> Result<std::fs::File> {
        let mut st = self.st_mut();
        let n = st.get_mut(ino)?;
        if ino != ROOT_INO && n.parent == 0 && !self.held(n) {
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

    /// Makes the bytes of `ino`'s upper file durable (fsync or, with
    /// `datasync`, fdatasync), for an fsync that names no handle; a file
    /// still in the lower layer has nothing of this mount's to sync.
    pub fn sync_upper(&self, ino: u64, datasync: bool) -> Result<()> {
        let blob = match self.st().get(ino)?.body {
            Body::Upper { blob, .. } => blob,
            _ => return Ok(()),
        };
        let p = self.blob_path(blob)?;
        let file = match std::fs::File::open(&p) {
            Ok(f) => f,
            // Replaced meanwhile (its content went with its last name).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("opening {}", p.display()))(e)),
        };
        let r = if datasync { file.sync_data() } else { file.sync_all() };
        r.map_err(Error::io(format!("syncing {}", p.display())))
    }

    /// Opens a file for writing (copying it up first).
    pub async fn open_for_write(&self, ino: u64) -> Result<OpenFile> {
        self.copy_up(ino).await?;
        let file = self.open_upper(ino, true)?;
        Ok(OpenFile::Upper { file, ino, writable: true })
    }

    /// Makes `ino` a file of the upper layer; returns its blob number.
    async fn copy_up(&self, ino: u64) -> Result<u64> {
        self.writable_only()?;
        let (e, perm) = {
            let st = self.st();
            let n = st.get(ino)?;
            match &n.body {
                Body::Upper { blob, .. } => return Ok(*blob),
                Body::Lower(e) if matches!(e.kind, Kind::File | Kind::Executable) => (e.entry(&n.name), n.perm),
                Body::Dir { .. } | Body::Lower(_) => return Err(Error::fs(Errno::ISDIR, "not a regular file")),
                Body::Link(_) => return Err(Error::fs(Errno::LOOP, "a symlink")),
                Body::Special(..) => return Err(Error::fs(Errno::NXIO, "a FIFO, socket or device node")),
            }
        };
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let (blob, p, file) = self.new_upper_file(perm)?;
        // Streamed: a large file is copied up a window of chunks at a time.
        let file = Arc::new(file);
        let size = match self.timed("copying a file up", self.fetcher.write_content(&e, &name, file)).await {
            Ok(n) => n,
            Err(er) => {
                let _ = std::fs::remove_file(&p);
                return Err(er);
            }
        };
        let mut st = self.st_mut();
        let n = st.get_mut(ino)?;
        match &n.body {
            Body::Lower(cur) if cur.id == e.id => {
                n.body = Body::Upper { blob, size, clean: Some((e.id, e.chunked)) };
                st.log_copy_up(ino, blob);
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

    /// A new, empty upper file, open for reading and writing, with the
    /// mode `perm` asks: a spare one when a saved state no longer names
    /// it, else one made now. Its blob number, path and file.
    ///
    /// Reusing files instead of unlinking and creating them spares the
    /// filesystem an inode freed and another allocated per replaced file
    /// (a `sed -i` replaces every file it edits). On ext4 without a
    /// journal each allocation also steps over every inode freed in the
    /// last seconds to minutes, one inode-table lookup each: all of them
    /// in this one folder's block group.
    fn new_upper_file(&self, perm: u16) -> Result<(u64, PathBuf, std::fs::File)> {
        use std::os::unix::fs::PermissionsExt;
        let saved = self.tracker.saved();
        let (blob, reused) = {
            let mut st = self.st_mut();
            match st.spare.front() {
                // Freed before the newest durable save: no saved state a
                // crash could bring back names it.
                Some(&(b, freed)) if freed < saved => {
                    st.spare.pop_front();
                    (b, true)
                }
                _ => {
                    st.next_blob += 1;
                    (st.next_blob - 1, false)
                }
            }
        };
        let p = self.blob_path(blob)?;
        let mode = upper_mode(perm);
        // Over an existing file: a spare one, or one a killed daemon made
        // after its last save (numbers from the saved `next_blob` on are
        // named by nothing).
        let over = || {
            let f =
                std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(mode).open(&p)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            Ok(f)
        };
        let file = match reused {
            true => over(),
            false => match std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(mode).open(&p) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => over(),
                r => r,
            },
        };
        let file = file.map_err(Error::io(format!("creating {}", p.display())))?;
        Ok((blob, p, file))
    }

    /// Keeps the upper file of `blob` (`size` bytes), which no node names
    /// any more, for a later file instead of unlinking it (see
    /// `new_upper_file`); when it is large or enough are kept, it is
    /// unlinked once a durable save no longer names it (before that, a
    /// kill -9 would bring back a saved state whose node has no bytes).
    /// Its bytes stay as they are until then: a crash brings back a saved
    /// state that may still name it, whole.
    /// `freed`: the change count when the node lost its last name (read
    /// under the state lock it left under: a save whose count is above it
    /// serialized the state without it).
    pub(super) fn recycle(&self, st: &mut State, blob: u64, size: u64, freed: u64) {
        let Ok(p) = self.blob_path(blob) else { return };
        // The file's own length: a node's `size` is what it was made with
        // (0 for a new file), not what was written since. Judged by that,
        // every deleted file was kept, whole, until reused: a deleted
        // 100 MB file never gave its space back.
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            // Gone already (a damaged upper folder): nothing to keep.
            return;
        };
        if st.spare.len() >= SPARE_MAX || size.max(m.len()) > SPARE_BYTES {
            if freed < self.tracker.saved() {
                // A durable save names it no more already (the kernel
                // forgot the node after that save).
                let _ = std::fs::remove_file(p);
            } else if let Ok(u) = self.overlay() {
                u.doomed.lock().unwrap_or_else(|e| e.into_inner()).push((blob, freed));
            }
            return;
        }
        st.spare.push_back((blob, freed));
    }

    /// The state as of `changes` (a count read before it was serialized)
    /// is durably saved: spare files freed before it may be reused, and
    /// doomed ones are unlinked now.
    pub fn note_saved(&self, changes: u64) {
        let saved = self.tracker.note_saved(changes);
        self.unlink_doomed(saved);
    }

    /// Unlinks the doomed upper files now, before a save that no longer
    /// names them: when a save fails for want of space (a full disk), the
    /// space they hold is what lets it succeed. A crash before that save
    /// brings back names whose files are gone; loading drops such names
    /// and reports them (`lost_on_load`). Returns how many went.
    pub fn free_doomed_now(&self) -> usize {
        self.unlink_doomed(u64::MAX)
    }

    /// Unlinks the doomed upper files freed before change count `before`;
    /// returns how many went.
    fn unlink_doomed(&self, before: u64) -> usize {
        let Ok(u) = self.overlay() else { return 0 };
        let gone: Vec<u64> = {
            let mut d = u.doomed.lock().unwrap_or_else(|e| e.into_inner());
            let (go, keep): (Vec<_>, Vec<_>) = d.drain(..).partition(|(_, freed)| *freed < before);
            *d = keep;
            go.into_iter().map(|(b, _)| b).collect()
        };
        for b in &gone {
            let _ = std::fs::remove_file(u.dir.join(b.to_string()));
        }
        gone.len()
    }

    /// Unlinks every spare and doomed upper file (at unmount, after the
    /// last save: no state names them).
    pub fn drop_spares(&self) {
        let spare: Vec<u64> = self.st_mut().spare.drain(..).map(|(b, _)| b).collect();
        for b in spare {
            if let Ok(p) = self.blob_path(b) {
                let _ = std::fs::remove_file(p);
            }
        }
        self.unlink_doomed(u64::MAX);
    }

    /// Writes `data` at `offset` of a file opened for writing.
    pub fn write(&self, f: &OpenFile, offset: u64, data: &[u8]) -> Result<u32> {
        let OpenFile::Upper { file, ino, writable: true } = f else {
            return Err(Error::fs(Errno::BADF, "the file is not open for writing"));
        };
        // The write and the node's update under the file's content lock,
        // which a checkpoint hashing it takes exclusively.
        let _content = self.content_lock(*ino)?.read().unwrap_or_else(|e| e.into_inner());
        file.write_all_at(data, offset).map_err(Error::io("writing to the upper layer"))?;
        let mut st = self.st_mut();
        let n = st.get_mut(*ino)?;
        if let Body::Upper { size, clean, .. } = &mut n.body {
            *size = (*size).max(offset + data.len() as u64);
            *clean = None;
        }
        n.modified();
        st.dirty(*ino);
        drop(st);
        self.changed();
        Ok(data.len() as u32)
    }

    /// fallocate of a file (copied up first): preallocation (mode 0, which
    /// may grow the file), the same keeping the size (`FALLOC_FL_KEEP_SIZE`),
    /// and a hole punched (`PUNCH_HOLE | KEEP_SIZE`: zeros read back);
    /// any other mode is EOPNOTSUPP, as on a filesystem without it.
    pub async fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        use rustix::fs::FallocateFlags as F;
        self.writable_only()?;
        let unsupported = || Error::fs(Errno::OPNOTSUPP, "this fallocate mode is not supported here");
        let flags = u32::try_from(mode).ok().and_then(F::from_bits).ok_or_else(unsupported)?;
        if !(flags.is_empty() || flags == F::KEEP_SIZE || flags == F::PUNCH_HOLE | F::KEEP_SIZE) {
            return Err(unsupported());
        }
        let end = offset.checked_add(len).ok_or_else(|| Error::fs(Errno::FBIG, "offset and length overflow"))?;
        let blob = self.copy_up(ino).await?;
        let p = self.blob_path(blob)?;
        let f =
            std::fs::OpenOptions::new().write(true).open(&p).map_err(Error::io(format!("opening {}", p.display())))?;
        let _content = self.content_lock(ino)?.read().unwrap_or_else(|e| e.into_inner());
        rustix::fs::fallocate(&f, flags, offset, len).map_err(|e| Error::fs(e, "fallocate of the upper file"))?;
        let mut st = self.st_mut();
        let n = st.get_mut(ino)?;
        let mut changed = flags.contains(F::PUNCH_HOLE);
        if let Body::Upper { size, clean, .. } = &mut n.body {
            if !flags.contains(F::KEEP_SIZE) && end > *size {
                *size = end;
                changed = true;
            }
            if changed {
                *clean = None;
            }
        }
        if changed {
            n.modified();
            st.dirty(ino);
        }
        drop(st);
        self.changed();
        Ok(())
    }

    /// chmod, chown, truncate and utimes.
    pub async fn setattr(&self, ino: u64, a: SetAttr) -> Result<Attr> {
        self.writable_only()?;
        if let Some(size) = a.size {
            let blob = self.copy_up(ino).await?;
            let p = self.blob_path(blob)?;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .map_err(Error::io(format!("opening {}", p.display())))?;
            let _content = self.content_lock(ino)?.read().unwrap_or_else(|e| e.into_inner());
            f.set_len(size).map_err(Error::io(format!("truncating {}", p.display())))?;
            let mut st = self.st_mut();
            let n = st.get_mut(ino)?;
            if let Body::Upper { size: s, clean, .. } = &mut n.body {
                *s = size;
                *clean = None;
            }
            n.modified();
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
                st.get_mut(ino)?.set_mtime(t);
            }
            let n = st.get_mut(ino)?;
            if let Some(t) = a.atime {
                n.meta_mut().atime = Some(t);
            }
            if a.uid.is_some() || a.gid.is_some() {
                let (uid, gid) = n.meta.as_ref().and_then(|m| m.owner).unwrap_or_else(mount_owner);
                let owner = (a.uid.unwrap_or(uid), a.gid.unwrap_or(gid));
                n.meta_mut().owner = (owner != mount_owner()).then_some(owner);
            }
            if a.mode.is_some() || a.mtime.is_some() || a.uid.is_some() || a.gid.is_some() {
                n.changed_now();
            }
            n.tidy_meta();
            st.log_setattr(ino, &a);
        }
        self.changed();
        self.getattr(ino)
    }

    /// Adds node `n` named `name` to directory `parent`.
    async fn insert(&self, parent: u64, name: &[u8], n: impl FnOnce(u64, Name) -> Node) -> Result<Attr> {
        self.writable_only()?;
        new_name_ok(name)?;
        self.load(parent).await?;
        let mut st = self.st_mut();
        self.loaded(&mut st, parent)?;
        if st.children_mut(parent)?.contains_key(name) {
            return Err(Error::fs(Errno::EXIST, String::from_utf8_lossy(name).into_owned()));
        }
        let name: Name = name.into();
        let ino = st.push(n(parent, name.clone()));
        st.log_insert(ino, parent, &name);
        st.children_mut(parent)?.insert(name, ino);
        st.touch_dir(parent);
        let a = self.attr_of(&st, ino)?;
        drop(st);
        self.changed();
        Ok(a)
    }

    /// Creates an empty file and opens it for writing.
    pub async fn create(&self, parent: u64, name: &[u8], mode: u32) -> Result<(Attr, OpenFile)> {
        let (blob, p, file) = self.new_upper_file(mode as u16)?;
        let node = |parent, name| {
            let mut n =
                Node::new(parent, name, (mode & 0o7777) as u16, now(), Body::Upper { blob, size: 0, clean: None });
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
        let body = Body::Dir { clean: None, origin: None, children: Some(Box::default()) };
        self.insert(parent, name, |parent, name| Node::new(parent, name, (mode & 0o7777) as u16, now(), body)).await
    }

    pub async fn symlink(&self, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::fs(Errno::INVAL, "empty symlink target"));
        }
        let body = Body::Link(target.into());
        self.insert(parent, name, |parent, name| Node::new(parent, name, 0o777, now(), body)).await
    }

    /// Makes a FIFO, a unix socket or a block or character device node
    /// (`rdev`: its device number), as `mkfifo`, a socket's `bind` and
    /// `mknod` ask. A device node is a name with a number here: the mount
    /// is nodev, so the kernel never opens it as a device. Any other kind
    /// is refused (regular files come through `create`).
    pub async fn mknod(&self, parent: u64, name: &[u8], kind: NodeKind, perm: u16, rdev: u32) -> Result<Attr> {
        let rdev = match kind {
            NodeKind::Fifo | NodeKind::Socket => 0,
            NodeKind::BlockDev | NodeKind::CharDev => rdev,
            _ => return Err(Error::fs(Errno::INVAL, "mknod makes FIFOs, sockets and device nodes")),
        };
        let body = Body::Special(kind, rdev);
        self.insert(parent, name, |parent, name| Node::new(parent, name, perm & 0o7777, now(), body)).await
    }

    /// Removes the entry `name` of `parent`, which names `ino`. The node
    /// loses that name; with its last one it is detached, and its upper
    /// blob goes now or with the last handle still open on it; else its
    /// ctime moves (its link count did).
    fn remove_entry(&self, st: &mut State, parent: u64, name: &[u8], ino: u64) -> Result<()> {
        st.children_mut(parent)?.remove(name);
        let n = st.get_mut(ino)?;
        if n.drop_name(parent, name) {
            n.parent = 0;
            n.meta_mut().detached_at = Some(self.changes());
            self.reap(st, ino);
        } else {
            n.changed_now();
        }
        Ok(())
    }

    pub(super) fn is_dir_body(b: &Body) -> bool {
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
        self.writable_only()?;
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
        self.remove_entry(&mut st, parent, name, ino)?;
        st.log_remove(parent, name, dir);
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
        self.writable_only()?;
        new_name_ok(new_name)?;
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
            self.remove_entry(&mut st, new_parent, new_name, t)?;
        }
        st.children_mut(parent)?.remove(name);
        let new_name: Name = new_name.into();
        st.children_mut(new_parent)?.insert(new_name.clone(), src);
        let n = st.get_mut(src)?;
        n.move_name(parent, name, new_parent, &new_name);
        n.changed_now();
        st.log_rename(parent, name, new_parent, &new_name);
        st.touch_dir(parent);
        st.touch_dir(new_parent);
        drop(st);
        self.changed();
        Ok(())
    }

    /// A hard link: `new_parent/new_name` names node `ino` too (not a
    /// directory). Both names show every write; a checkpoint records each
    /// path as a file of its own (trees have no hard links, as in git).
    pub async fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr> {
        self.writable_only()?;
        new_name_ok(new_name)?;
        self.load(new_parent).await?;
        let mut st = self.st_mut();
        self.loaded(&mut st, new_parent)?;
        let n = st.get(ino)?;
        if Self::is_dir_body(&n.body) {
            return Err(Error::fs(Errno::PERM, "a directory cannot be hard-linked"));
        }
        if ino == ROOT_INO || n.parent == 0 {
            return Err(Error::fs(Errno::NOENT, "the file was removed"));
        }
        if n.links().len() >= u16::MAX as usize {
            return Err(Error::fs(Errno::MLINK, "too many links"));
        }
        if st.children_mut(new_parent)?.contains_key(new_name) {
            return Err(Error::fs(Errno::EXIST, String::from_utf8_lossy(new_name).into_owned()));
        }
        let new_name: Name = new_name.into();
        st.children_mut(new_parent)?.insert(new_name.clone(), ino);
        let n = st.get_mut(ino)?;
        n.meta_mut().links.push((new_parent, new_name.clone()));
        n.changed_now();
        st.log_link(ino, new_parent, &new_name);
        st.touch_dir(new_parent);
        let a = self.attr_of(&st, ino)?;
        drop(st);
        self.changed();
        Ok(a)
    }
}
