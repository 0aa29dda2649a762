//! Pack locks: one process at a time downloads a pack into the cache (or
//! writes one it built), so two processes that want the same pack make one
//! GET between them; the second finds the members cached.
//!
//! Each pack's lock is one byte of one file, `packs/pack-locks`, at an
//! offset taken from the pack's hash, held with an open file description
//! lock (`fcntl(F_OFD_SETLK)`): it conflicts with every other open of the
//! file, in this process or another, and goes when its descriptor closes
//! (a killed process holds none). The cache keeps the file open from the
//! start, which keeps the path's directory entries in memory, so taking a
//! lock costs an `open` and an `fcntl` with no disk read even after the page
//! cache was dropped. (A lock file per pack, created on the first fetch of
//! each, cost a cold first read ~1.7 ms: the median of 16 paired runs of a
//! first file at RTT 50 ms.)
//!
//! Two packs whose offsets meet only wait for each other: 2^62 offsets.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::hash::Hash;

/// The lock file of a cache, kept open.
pub(super) struct PackLocks {
    path: PathBuf,
    _held: Option<File>,
}

/// A held pack lock; dropping it frees the pack.
#[derive(Debug)]
pub struct PackLock {
    _file: File,
}

impl PackLocks {
    /// Opens (creating) `packs/pack-locks` under `root` and keeps it open.
    /// An unwritable cache gets none: locking then fails, and callers go on
    /// unlocked (at worst a pack is fetched twice).
    pub(super) fn open(root: &Path) -> PackLocks {
        let path = root.join("packs").join("pack-locks");
        let held = std::fs::create_dir_all(root.join("packs")).and_then(|_| open_lock_file(&path)).ok();
        PackLocks { path, _held: held }
    }

    /// Pack `id`'s lock if it is free now; `None` if another holds it.
    pub(super) fn try_lock(&self, id: &Hash) -> Result<Option<PackLock>> {
        lock(&self.path, id, false)
    }

    /// Pack `id`'s lock, waiting for it (blocks the thread).
    pub(super) fn lock_blocking(&self, id: &Hash) -> Result<PackLock> {
        wait_for(&self.path, id)
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// Pack `id`'s lock in the lock file at `path`, waiting for it.
pub(super) fn wait_for(path: &Path, id: &Hash) -> Result<PackLock> {
    lock(path, id, true).map(|l| l.expect("a waiting lock is taken or fails"))
}

fn open_lock_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // A symlink planted there is not followed. A FIFO opened for reading
    // and writing does not wait for a peer; its inode then serves as the
    // lock (it holds no data either way).
    OpenOptions::new().read(true).write(true).create(true).truncate(false).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// The byte of the lock file that stands for pack `id`.
fn offset(id: &Hash) -> i64 {
    let b = id.as_bytes();
    (u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) >> 2) as i64
}

fn lock(path: &Path, id: &Hash, wait: bool) -> Result<Option<PackLock>> {
    let what = || format!("locking pack {} in {}", id.short(), path.display());
    let file = open_lock_file(path).map_err(Error::io(what()))?;
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset(id);
    fl.l_len = 1;
    let cmd = if wait { libc::F_OFD_SETLKW } else { libc::F_OFD_SETLK };
    loop {
        // SAFETY: `fl` is a valid flock for the fd's lifetime of this call.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) } == 0 {
            return Ok(Some(PackLock { _file: file }));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::EACCES) if !wait => return Ok(None),
            _ => return Err(Error::Io { context: what(), source: e }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pack's lock excludes every other taker of it, in this process as
    /// in another (each lock is its own open of the file), until dropped;
    /// other packs' locks are free meanwhile; a waiting taker gets it once
    /// freed.
    #[test]
    fn a_pack_lock_excludes_other_takers_of_that_pack_only() {
        let t = tempfile::tempdir().unwrap();
        let locks = PackLocks::open(t.path());
        assert!(locks.path().is_file());
        let (a, b) = (Hash::of(b"a"), Hash::of(b"b"));
        assert_ne!(offset(&a), offset(&b));
        // Every offset is a byte the kernel takes (0..=i64::MAX - 1).
        for i in 0..256u32 {
            let o = offset(&Hash::of(&i.to_le_bytes()));
            assert!((0..i64::MAX).contains(&o), "{o}");
        }
        let held = locks.try_lock(&a).unwrap().expect("free");
        assert!(locks.try_lock(&a).unwrap().is_none(), "taken twice");
        let other = locks.try_lock(&b).unwrap().expect("another pack is free");
        drop(other);
        let (tx, rx) = std::sync::mpsc::channel();
        let path = t.path().to_path_buf();
        let waiter = std::thread::spawn(move || {
            let locks = PackLocks::open(&path);
            let l = locks.lock_blocking(&a).unwrap();
            tx.send(()).unwrap();
            l
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "got it while held");
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("not woken when freed");
        let l = waiter.join().unwrap();
        assert!(locks.try_lock(&a).unwrap().is_none());
        drop(l);
        assert!(locks.try_lock(&a).unwrap().is_some());
    }

    /// A FIFO or a symlink planted where the lock file goes: opening the
    /// cache and locking do not hang or follow it; a lock either works on
    /// that inode (it holds no data) or fails with the path in its message
    /// (callers then go on unlocked).
    #[test]
    fn a_fifo_or_symlink_for_the_lock_file_does_not_hang_or_follow() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("packs")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            t.path().join("packs").join("pack-locks"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let locks = PackLocks::open(t.path());
        match locks.try_lock(&Hash::of(b"a")) {
            Ok(l) => assert!(l.is_some()),
            Err(e) => assert!(e.to_string().contains("pack-locks"), "{e}"),
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("packs")).unwrap();
        let target = t.path().join("elsewhere");
        std::os::unix::fs::symlink(&target, t.path().join("packs").join("pack-locks")).unwrap();
        let locks = PackLocks::open(t.path());
        let e = locks.try_lock(&Hash::of(b"a")).unwrap_err().to_string();
        assert!(e.contains("pack-locks"), "{e}");
        assert!(!target.exists(), "followed the symlink");
    }
}
