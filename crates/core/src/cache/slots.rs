//! Work slots: at most as many memory-heavy jobs at once, among every
//! process sharing a cache, as the machine has cores.
//!
//! A workspace's first checkpoint over an imported base (no stat object)
//! lists every path: at a million files it holds some 180 MiB while it
//! runs. Twenty agents checkpointing at once held 3.8 GiB between them on
//! a 2-core machine, where no more than two of them can be running anyway.
//! Each slot is a file, `locks/slot-<n>`, held with `flock` (released when
//! its descriptor closes, so a killed process holds none).

use std::fs::File;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _file: File,
}

/// Slots under `root`: one a core, at most 16.
pub(super) fn slots() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).min(16)
}

fn slot_path(root: &Path, n: usize) -> PathBuf {
    root.join("locks").join(format!("slot-{n}"))
}

fn open(root: &Path, n: usize) -> Option<File> {
    let p = slot_path(root, n);
    std::fs::create_dir_all(p.parent()?).ok()?;
    std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).ok()
}

/// Takes a free slot of `count`, else waits for one (blocking: call it
/// off the async workers). `None` when the cache cannot hold the files:
/// the work then goes ahead unbounded, as before.
pub(super) fn take(root: &Path, count: usize) -> Option<Slot> {
    for n in 0..count {
        let f = open(root, n)?;
        if rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Some(Slot { _file: f });
        }
    }
    // Every slot busy: wait on one, spread over them by process.
    let f = open(root, std::process::id() as usize % count.max(1))?;
    rustix::fs::flock(&f, FlockOperation::LockExclusive).ok()?;
    Some(Slot { _file: f })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_free_again_once_dropped_and_waiting_ends_then() {
        let d = tempfile::tempdir().unwrap();
        let a = take(d.path(), 2).unwrap();
        let b = take(d.path(), 2).unwrap();
        // Both busy: a third waits until one is dropped.
        let root = d.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let s = take(&root, 2).unwrap();
            tx.send(()).unwrap();
            s
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "took a slot while both were held");
        drop(a);
        drop(b);
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("a freed slot was not taken");
        let c = waiter.join().unwrap();
        // One slot is held again; the other is free.
        let d2 = take(d.path(), 2).unwrap();
        drop((c, d2));
        assert!(take(Path::new("/proc/no-such-cache"), 2).is_none(), "no files: no slot, and no wait");
    }
}
