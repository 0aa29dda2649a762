//! The files a mount holds open: by handle, and (no-open mode) the few
//! most recently read or written, by inode.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fuser::BackingId;
use mado_core::vfs::{OpenFile, SnapshotFs};

/// The open-file tables, for tasks that outlive a request.
pub(super) struct OpenFiles {
    pub(super) handles: Arc<Mutex<HashMap<u64, Arc<OpenFile>>>>,
    pub(super) io_modes: Arc<Mutex<HashMap<u64, (IoMode, u32)>>>,
}

impl OpenFiles {
    /// Keeps `f` as handle `fh` of inode `ino`, served through this
    /// process (counted, so `release` balances).
    pub(super) fn keep(&self, fh: u64, ino: u64, f: OpenFile) {
        self.io_modes.lock().expect("io modes lock").entry(ino).or_insert((IoMode::Cached, 0)).1 += 1;
        self.handles.lock().expect("handles lock").insert(fh, Arc::new(f));
    }
}

/// Files opened by a READ in no-open mode, newest last; each one's open is
/// released (`SnapshotFs::release`) when it falls out.
#[derive(Default)]
pub(super) struct LazyOpens {
    recent: std::collections::VecDeque<(u64, Arc<OpenFile>)>,
}

impl LazyOpens {
    /// Enough for a few readers' current files, not the tree's contents.
    pub(super) const KEEP: usize = 64;

    pub(super) fn get(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.recent.iter().rev().find(|(i, _)| *i == ino).map(|(_, f)| f.clone())
    }

    /// The inode's file if it is open for writing.
    pub(super) fn writable(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.get(ino).filter(|f| is_writable(f))
    }

    /// Keeps `f` (or, if another request opened the inode meanwhile and
    /// that file serves as well, that one, releasing `f`'s open); returns
    /// the file to use. A file open for writing replaces one open for
    /// reading only.
    pub(super) fn keep(&mut self, core: &SnapshotFs, ino: u64, f: Arc<OpenFile>) -> Arc<OpenFile> {
        if let Some(at) = self.recent.iter().rposition(|(i, _)| *i == ino) {
            if is_writable(&self.recent[at].1) || !is_writable(&f) {
                core.release(ino);
                return self.recent[at].1.clone();
            }
            self.recent.remove(at);
            core.release(ino);
        }
        self.recent.push_back((ino, f.clone()));
        while self.recent.len() > Self::KEEP {
            if let Some((old, _)) = self.recent.pop_front() {
                core.release(old);
            }
        }
        f
    }

    /// The kernel forgot `ino` (FORGET: it evicted the inode, so no
    /// process has it open): its kept files are released. An unlinked
    /// file's upper file then goes (it stayed until 64 other files had
    /// been opened since, or for ever: a deleted 100 MB file kept its
    /// space).
    pub(super) fn forget(&mut self, core: &SnapshotFs, ino: u64) {
        self.recent.retain(|(i, _)| {
            if *i == ino {
                core.release(ino);
            }
            *i != ino
        });
    }
}

pub(super) fn is_writable(f: &OpenFile) -> bool {
    matches!(f, OpenFile::Upper { writable: true, .. })
}

/// How an open inode's reads are served.
pub(super) enum IoMode {
    /// Straight from the cache file, by the kernel.
    Passthrough(BackingId),
    /// Through this process (and the page cache).
    Cached,
}
