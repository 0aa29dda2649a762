//! Giving freed memory back to the kernel at the moments a process drops
//! much of it at once: after a workspace or snapshot is opened (a stat
//! object of a million paths decoded and merged, then dropped), after a
//! checkpoint, after the kernel forgot most of a mount's inodes. The
//! allocator is the binary's choice, so the binary says how
//! ([`set_give_back`]); without it this does nothing.

use std::sync::OnceLock;

static GIVE_BACK: OnceLock<fn()> = OnceLock::new();
static TIDY: OnceLock<fn()> = OnceLock::new();

/// How often, at most, a thread tidies its own heap ([`tidy`]).
const TIDY_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Sets how this process gives freed memory back (once; later calls are
/// ignored).
pub fn set_give_back(f: fn()) {
    let _ = GIVE_BACK.set(f);
}

/// Sets how a thread gives back the memory it freed itself, cheaply
/// ([`tidy`]); once.
pub fn set_tidy(f: fn()) {
    let _ = TIDY.set(f);
}

/// Gives back what this thread freed, at most every [`TIDY_EVERY`]:
/// called by a mount's threads as they take a request or go idle. The
/// allocator keeps freed pages in the heap of the thread that freed them
/// until that thread collects, and [`give_back`] collects only its
/// caller's: a mount daemon that read 400 large files held 30-40 MiB of
/// them, freed, on its FUSE threads (heaptrack with the system allocator:
/// 3.5 MiB live). What a thread keeps now is what it freed in its last
/// 50 ms of work.
pub fn tidy() {
    let Some(f) = TIDY.get() else { return };
    thread_local!(static LAST: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) });
    LAST.with(|last| {
        let now = std::time::Instant::now();
        if last.get().is_none_or(|t| now.duration_since(t) >= TIDY_EVERY) {
            last.set(Some(now));
            f();
        }
    });
}

/// Gives freed memory back, if the binary said how, with the idle read
/// buffers kept for reuse ([`crate::bufpool`]).
pub fn give_back() {
    crate::bufpool::SHARED.drain();
    if let Some(f) = GIVE_BACK.get() {
        f()
    }
}
