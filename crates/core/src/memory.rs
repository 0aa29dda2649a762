//! Giving freed memory back to the kernel at the moments a process drops
//! much of it at once: after a workspace or snapshot is opened (a stat
//! object of a million paths decoded and merged, then dropped), after a
//! checkpoint, after the kernel forgot most of a mount's inodes. The
//! allocator is the binary's choice, so the binary says how
//! ([`set_give_back`]); without it this does nothing.

use std::sync::OnceLock;

static GIVE_BACK: OnceLock<fn()> = OnceLock::new();

/// Sets how this process gives freed memory back (once; later calls are
/// ignored).
pub fn set_give_back(f: fn()) {
    let _ = GIVE_BACK.set(f);
}

/// Gives freed memory back, if the binary said how, with the idle read
/// buffers kept for reuse ([`crate::bufpool`]).
pub fn give_back() {
    crate::bufpool::SHARED.drain();
    if let Some(f) = GIVE_BACK.get() {
        f()
    }
}
