//! Where a read-write mount's changes stand against what is durable: how
//! many changes were made since it started, how many the newest durable
//! save of its state holds, and how many the last checkpoint that
//! succeeded began from. The filesystem counts changes into it; saving
//! and checkpointing (`workspace::mounted`) read and move its marks. It
//! knows nothing of inodes or files.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub struct Tracker {
    /// Changes since the mount started (0 on a read-only mount).
    changes: AtomicU64,
    /// `changes` as of the newest state saved durably: a spare upper file
    /// freed before it is named by no saved state.
    saved: AtomicU64,
    /// `changes` as of the start of the last checkpoint that succeeded.
    checkpointed: AtomicU64,
    /// Changes from before this mount (a saved state picked up) that no
    /// checkpoint holds yet.
    before: AtomicBool,
    /// Held while the state is serialized and written ([`Tracker::save_guard`]).
    save_lock: Mutex<()>,
}

impl Tracker {
    /// Changes since the mount started.
    pub fn changes(&self) -> u64 {
        self.changes.load(Relaxed)
    }

    pub(super) fn count_change(&self) {
        self.changes.fetch_add(1, Relaxed);
    }

    /// `changes()` as of the newest durable save.
    pub fn saved(&self) -> u64 {
        self.saved.load(Relaxed)
    }

    /// The state as of `changes` (read before it was serialized) is
    /// durably saved; the mark never moves back. Returns the mark.
    pub(super) fn note_saved(&self, changes: u64) -> u64 {
        self.saved.fetch_max(changes, Relaxed).max(changes)
    }

    /// One save of the state at a time, from its serialization to its
    /// file being in place: a save serialized earlier can never land after
    /// a later one (a checkpoint's save once overwrote the save an fsync
    /// had just made, and a kill -9 then lost the fsynced bytes). A save
    /// that panicked leaves nothing half-done behind the lock (the file is
    /// put in place by a rename), so a poisoned lock is taken as it is.
    pub fn save_guard(&self) -> MutexGuard<'_, ()> {
        self.save_lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state this mount started from held changes no checkpoint has
    /// (a saved state picked up, not known to be clean).
    pub fn set_uncheckpointed_before(&self, v: bool) {
        self.before.store(v, Relaxed);
    }

    /// A checkpoint that began when `changes()` was `at` succeeded.
    pub fn note_checkpointed(&self, at: u64) {
        self.checkpointed.fetch_max(at, Relaxed);
        self.before.store(false, Relaxed);
    }

    /// Whether the workspace may hold changes no checkpoint has: any change
    /// since the last checkpoint began, or from before this mount.
    pub fn uncheckpointed(&self) -> bool {
        self.before.load(Relaxed) || self.changes() > self.checkpointed.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::Tracker;

    #[test]
    fn a_checkpoint_covers_the_changes_made_before_it_began() {
        let t = Tracker::default();
        assert!(!t.uncheckpointed());
        t.count_change();
        t.count_change();
        assert_eq!(t.changes(), 2);
        assert!(t.uncheckpointed());
        // Began at 1: the second change is not in it.
        t.note_checkpointed(1);
        assert!(t.uncheckpointed());
        t.note_checkpointed(2);
        assert!(!t.uncheckpointed());
        // An older checkpoint finishing late does not move the mark back.
        t.note_checkpointed(1);
        assert!(!t.uncheckpointed());
        t.count_change();
        assert!(t.uncheckpointed());
    }

    #[test]
    fn changes_from_before_the_mount_stay_until_a_checkpoint() {
        let t = Tracker::default();
        t.set_uncheckpointed_before(true);
        assert!(t.uncheckpointed());
        t.note_checkpointed(0);
        assert!(!t.uncheckpointed());
    }

    #[test]
    fn the_saved_mark_only_moves_forward() {
        let t = Tracker::default();
        assert_eq!(t.note_saved(5), 5);
        assert_eq!(t.note_saved(3), 5);
        assert_eq!(t.saved(), 5);
        assert_eq!(t.note_saved(7), 7);
    }

    #[test]
    fn a_poisoned_save_lock_is_taken_as_it_is() {
        let t = std::sync::Arc::new(Tracker::default());
        let t2 = t.clone();
        let _ = std::thread::spawn(move || {
            let _g = t2.save_guard();
            panic!("a save that panicked");
        })
        .join();
        drop(t.save_guard());
    }
}
