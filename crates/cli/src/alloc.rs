//! The process's allocator: mimalloc, except that a large zeroed block
//! comes straight from the kernel.
//!
//! mimalloc zeroes a block it hands out again (memory freed before, and
//! not known to be zero), by writing it: every page then counts against
//! the process. fuser's session threads each take a 16 MiB zeroed buffer
//! for requests (`vec![0; MAX_WRITE + 4096]`, fuser 0.18 `read_buf.rs`),
//! of which a request touches a few KiB; one of those landing on reused
//! memory was 17 MiB of an idle mount daemon's 20 MiB of private memory
//! (pagemap of the daemon: one resident run of 17,408 KiB). A fresh
//! anonymous mapping is zero without being written, and its pages cost
//! nothing until used.
//!
//! Such blocks are remembered in a small table, so that `dealloc` and
//! `realloc` know them; when the table is full, mimalloc serves the block
//! as before.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Zeroed blocks of at least this many bytes are mapped.
pub const MAPPED_MIN: usize = 4 << 20;
/// Mapped blocks alive at once, at most (a mount has four session threads
/// and serve-virtiofs a few more; the rest fall back to mimalloc).
const SLOTS: usize = 64;
const PAGE: usize = 4096;

pub struct Alloc {
    inner: mimalloc::MiMalloc,
    mapped: [AtomicUsize; SLOTS],
}

impl Alloc {
    pub const fn new() -> Alloc {
        Alloc { inner: mimalloc::MiMalloc, mapped: [const { AtomicUsize::new(0) }; SLOTS] }
    }

    fn mappable(layout: Layout) -> bool {
        layout.size() >= MAPPED_MIN && layout.align() <= PAGE
    }

    /// Forgets `ptr` if it is a mapped block; whether it was.
    fn take(&self, ptr: *mut u8) -> bool {
        let addr = ptr as usize;
        self.mapped.iter().any(|s| s.compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok())
    }

    fn is_mapped(&self, ptr: *mut u8) -> bool {
        self.mapped.iter().any(|s| s.load(Ordering::Acquire) == ptr as usize)
    }

    /// How many mapped blocks are alive (for tests).
    #[cfg(test)]
    fn live(&self) -> usize {
        self.mapped.iter().filter(|s| s.load(Ordering::Relaxed) != 0).count()
    }
}

fn map_len(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

// SAFETY: every block is served by exactly one of mimalloc and mmap, and
// the table says which: a mapped block is in it from its mmap until its
// munmap, and mimalloc's blocks never are (their addresses are not in a
// live mapping of ours).
unsafe impl GlobalAlloc for Alloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        unsafe { self.inner.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::mappable(layout) {
            // SAFETY: a fresh private anonymous mapping; no address hint.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len(layout.size()),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                let addr = p as usize;
                if self.mapped.iter().any(|s| s.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok())
                {
                    return p.cast();
                }
                // SAFETY: the mapping made just above, not handed out.
                unsafe { libc::munmap(p, map_len(layout.size())) };
            }
        }
        // SAFETY: forwarded as given.
        unsafe { self.inner.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if Self::mappable(layout) && self.take(ptr) {
            // SAFETY: `ptr` was mapped by alloc_zeroed with this size, and
            // is given back once.
            unsafe { libc::munmap(ptr.cast(), map_len(layout.size())) };
            return;
        }
        // SAFETY: a mimalloc block, forwarded as given.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if Self::mappable(layout) && self.is_mapped(ptr) {
            // SAFETY: a block of the new size with the old alignment (the
            // caller guarantees the layout is valid).
            let new = unsafe { self.inner.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
            if new.is_null() {
                // The old block stays, as realloc must leave it on failure.
                return new;
            }
            // SAFETY: both blocks hold at least the bytes copied, and do
            // not overlap; the mapping is then given back once (only its
            // owner reallocates it, so it is still in the table).
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.take(ptr);
                libc::munmap(ptr.cast(), map_len(layout.size()));
            }
            return new;
        }
        // SAFETY: a mimalloc block, forwarded as given.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident_kib() -> u64 {
        crate::ctx::status_kib("self", "RssAnon").expect("RssAnon in /proc/self/status")
    }

    #[test]
    fn a_large_zeroed_block_costs_only_the_pages_used_and_is_zero() {
        let a = Alloc::new();
        let layout = Layout::from_size_align(16 << 20, 8).unwrap();
        // Memory mimalloc has handed out and taken back: a zeroed block
        // on it was written whole.
        unsafe {
            let warm = a.alloc(layout);
            std::ptr::write_bytes(warm, 0xaa, layout.size());
            a.dealloc(warm, layout);
        }
        // Other tests of this binary allocate on other threads meanwhile:
        // the least growth over a few tries is this block's.
        let mut grown = u64::MAX;
        let mut p: *mut u8 = std::ptr::null_mut();
        for _ in 0..5 {
            if !p.is_null() {
                unsafe { a.dealloc(p, layout) };
            }
            let before = resident_kib();
            p = unsafe { a.alloc_zeroed(layout) };
            assert!(!p.is_null());
            assert_eq!(a.live(), 1);
            grown = grown.min(resident_kib().saturating_sub(before));
        }
        assert!(grown < 2048, "a 16 MiB zeroed block made {grown} KiB resident");
        let s = unsafe { std::slice::from_raw_parts_mut(p, layout.size()) };
        assert!(s.iter().step_by(4096).all(|&b| b == 0) && s[layout.size() - 1] == 0);
        s[5] = 7;
        // Grown: the bytes move to mimalloc, the mapping goes.
        let q = unsafe { a.realloc(p, layout, 20 << 20) };
        assert_eq!(a.live(), 0);
        assert_eq!(unsafe { *q.add(5) }, 7);
        unsafe { a.dealloc(q, Layout::from_size_align(20 << 20, 8).unwrap()) };
        // A mapped block given back directly.
        let r = unsafe { a.alloc_zeroed(layout) };
        assert_eq!(a.live(), 1);
        unsafe { a.dealloc(r, layout) };
        assert_eq!(a.live(), 0);
    }

    #[test]
    fn small_or_unzeroed_or_overaligned_blocks_stay_with_mimalloc_and_a_full_table_falls_back() {
        let a = Alloc::new();
        let small = Layout::from_size_align(MAPPED_MIN - 1, 8).unwrap();
        let aligned = Layout::from_size_align(MAPPED_MIN, 2 * PAGE).unwrap();
        let big = Layout::from_size_align(MAPPED_MIN, 8).unwrap();
        unsafe {
            for l in [small, aligned] {
                let p = a.alloc_zeroed(l);
                assert_eq!(a.live(), 0);
                assert_eq!(p as usize % l.align(), 0);
                a.dealloc(p, l);
            }
            let p = a.alloc(big);
            assert_eq!(a.live(), 0, "only zeroed blocks are mapped");
            a.dealloc(p, big);
            let held: Vec<*mut u8> = (0..SLOTS + 2).map(|_| a.alloc_zeroed(big)).collect();
            assert_eq!(a.live(), SLOTS);
            assert!(held.iter().all(|p| !p.is_null() && *p.add(MAPPED_MIN - 1) == 0));
            for p in held {
                a.dealloc(p, big);
            }
            assert_eq!(a.live(), 0);
        }
    }
}
