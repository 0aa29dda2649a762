//! What a mount's inode table costs per file the kernel holds. Issue #46
//! asks a running daemon for at most 300 bytes a file after a stat walk of
//! every file, and for memory back near where it started once the kernel
//! forgets them; the table alone is held here to 250 (it measured 675
//! before nodes were made compact, 208 after), leaving the rest for the
//! daemon's allocator and its pack tables.
//!
//! A snapshot of 228 × 10 × 100 files (as `bench/scale.sh` makes, 228,000
//! files in 2,509 directories) is walked as `find` walks a mount: every
//! directory listed and every entry looked up, each lookup a reference the
//! kernel holds. The heap is counted by this test binary's own allocator,
//! each block as glibc's malloc would size it (its request plus a header,
//! in 16-byte steps, at least 32 bytes), so the figure is what a process
//! would hold, not only what it asked for.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::sync::Arc;

use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::hash::{Hash, TreeId};
use mado_core::object::{Entry, Kind, Tree};
use mado_core::store::{OpenOptions, Remote};
use mado_core::vfs::{NodeKind, SnapshotFs, ROOT_INO};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The bytes a malloc block of `size` takes.
fn block(size: usize) -> isize {
    (size + 8).div_ceil(16).max(2) as isize * 16
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            LIVE.fetch_add(block(l.size()), Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            LIVE.fetch_add(block(l.size()), Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(block(l.size()), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_add(block(new) - block(l.size()), Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// 228 × 1,011 nodes is just past a power-of-two table size (229,376 = 7/8 of
/// 2^18), where a hash table holds the most room per node, as at 1M files.
const TOPS: usize = 228;

/// Puts the tree in the disk cache; its root's id.
fn put_tree(cache: &DiskCache, entries: Vec<Entry>) -> Hash {
    let bytes = Tree::normalized(entries).unwrap().encode();
    let id = Hash::of(&bytes);
    cache.put(&id, &bytes).unwrap();
    id
}

fn entry(name: String, kind: Kind, size: u64, id: Hash) -> Entry {
    Entry { name: name.into_bytes(), kind, chunked: false, size, id }
}

/// `pkgNNNN/modN/fNNN.rs`, TOPS × 10 × 100 files, every file's content
/// the same (its id is all a lookup needs).
fn monorepo(cache: &DiskCache) -> Hash {
    let blob = Hash::of(b"fn f() {}\n");
    let mut tops = Vec::new();
    for t in 0..TOPS {
        let mut mods = Vec::new();
        for m in 0..10 {
            let files = (0..100).map(|f| entry(format!("f{f:03}.rs"), Kind::File, 10, blob)).collect();
            mods.push(entry(format!("mod{m}"), Kind::Directory, 0, put_tree(cache, files)));
        }
        tops.push(entry(format!("pkg{t:04}"), Kind::Directory, 0, put_tree(cache, mods)));
    }
    put_tree(cache, tops)
}

/// Lists every directory below `ino` and looks up each entry as the
/// kernel does (each lookup a reference held); every inode looked up.
async fn walk(fs: &SnapshotFs, ino: u64, seen: &mut Vec<u64>) {
    let mut stack = vec![ino];
    while let Some(dir) = stack.pop() {
        for (name, _) in fs.readdir(dir).await.unwrap() {
            let a = fs.lookup_counted(dir, &name).await.unwrap();
            seen.push(a.ino);
            if a.kind == NodeKind::Dir {
                stack.push(a.ino);
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_stat_walk_costs_at_most_250_bytes_a_file_and_forgetting_gives_it_back() {
    let d = tempfile::tempdir().unwrap();
    let remote =
        Arc::new(Remote::open(&format!("file://{}/store", d.path().display()), &OpenOptions::default()).unwrap());
    let cache = Arc::new(DiskCache::open(d.path().join("cache"), None).unwrap());
    let root = monorepo(&cache);
    let fetcher = Fetcher::new(remote, cache);
    let fs =
        SnapshotFs::writable(fetcher, TreeId::from_hash(root), 1_700_000_000, d.path().join("upper"), None).unwrap();
    fs.getattr(ROOT_INO).unwrap();

    let mut seen = Vec::with_capacity(TOPS * 1011);
    let before = LIVE.load(Relaxed);
    walk(&fs, ROOT_INO, &mut seen).await;
    let held = LIVE.load(Relaxed) - before - (seen.capacity() * 8) as isize;
    let files = TOPS * 1000;
    assert_eq!(seen.len(), files + TOPS * 11, "every entry looked up");
    assert_eq!(fs.node_count(), seen.len() + 1);
    let per_file = held / files as isize;
    eprintln!("{held} bytes held for {} nodes: {per_file} bytes a file", seen.len());
    assert!(per_file <= 250, "a stat walk holds {per_file} bytes a file (at most 250)");

    // The kernel forgets them (drop_caches): the table folds back to the root.
    for ino in seen.iter().rev() {
        fs.forget(*ino, 1);
    }
    assert_eq!(fs.node_count(), 1, "every clean node folded away");
    let left = LIVE.load(Relaxed) - before;
    eprintln!("{left} bytes held after the kernel forgot them");
    assert!(left < held / 20, "{left} of {held} bytes still held once every node was forgotten");
}
