//! Large read buffers, kept for reuse.
//!
//! A mount daemon serving a large file reads a chunk (~1 MiB) from the
//! disk cache for every chunk the reader passes, and joins chunks into one
//! reply where a read spans two. Each was a fresh allocation, and with
//! memory given back to the kernel at once (the daemon's allocator keeps
//! nothing, to bound its size), every one was new pages that the kernel
//! faulted in and zeroed: a quarter of the daemon's CPU on a warm 1 GiB
//! read (perf: `clear_page_erms`, `exc_page_fault`). Buffers taken here
//! come back when the last [`Bytes`] view of them drops, up to
//! [`KEEP_BYTES`] held idle, so a steady reader cycles through pages that
//! are already mapped.

use std::sync::Mutex;

use bytes::Bytes;

/// Idle bytes the pool may hold. Beyond this a returned buffer is freed.
pub const KEEP_BYTES: usize = 16 << 20;
/// Smaller buffers are not pooled: the allocator reuses small blocks well
/// by itself, and only large ones go back to the kernel.
pub const MIN_BYTES: usize = 64 << 10;
/// A buffer larger than this is never kept (it would take most of the pool).
pub const MAX_KEPT: usize = 8 << 20;

/// A pool of idle buffers holding at most `keep` bytes.
pub struct Pool {
    bufs: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

/// The process's pool.
pub static SHARED: Pool = Pool::new(KEEP_BYTES);

impl Pool {
    pub const fn new(keep: usize) -> Pool {
        Pool { bufs: Mutex::new(Vec::new()), keep }
    }

    /// An empty buffer with room for at least `len` bytes: a pooled one
    /// when one fits (the smallest that does, and at most twice `len`:
    /// a buffer a caller keeps, such as a whole small file held open,
    /// must not pin an idle chunk's memory many times its size), else a
    /// new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len >= MIN_BYTES {
            let mut bufs = self.bufs.lock().expect("buffer pool lock");
            let best = bufs
                .iter()
                .enumerate()
                .filter(|(_, b)| (len..=2 * len).contains(&b.capacity()))
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut b = bufs.swap_remove(i);
                b.clear();
                return b;
            }
        }
        Vec::with_capacity(len)
    }

    /// Gives `buf` back for reuse (or frees it, when the pool is full or
    /// the buffer is too small or too large to keep).
    pub fn give(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if !(MIN_BYTES..=MAX_KEPT).contains(&cap) {
            return;
        }
        let mut bufs = self.bufs.lock().expect("buffer pool lock");
        let held: usize = bufs.iter().map(Vec::capacity).sum();
        if held + cap <= self.keep {
            bufs.push(buf);
        }
    }

    /// Frees every idle buffer (the process is giving memory back:
    /// [`crate::memory::give_back`]).
    pub fn drain(&self) {
        self.bufs.lock().expect("buffer pool lock").clear();
    }

    /// Bytes idle in the pool.
    pub fn idle_bytes(&self) -> usize {
        self.bufs.lock().expect("buffer pool lock").iter().map(Vec::capacity).sum()
    }

    /// `buf` as [`Bytes`] whose memory returns to this pool once the last
    /// view of it drops.
    pub fn into_bytes(&'static self, buf: Vec<u8>) -> Bytes {
        if buf.capacity() < MIN_BYTES {
            return Bytes::from(buf);
        }
        Bytes::from_owner(Pooled(self, buf))
    }
}

/// [`Pool::take`] from the process's pool.
pub fn take(len: usize) -> Vec<u8> {
    SHARED.take(len)
}

/// [`Pool::into_bytes`] into the process's pool.
pub fn into_bytes(buf: Vec<u8>) -> Bytes {
    SHARED.into_bytes(buf)
}

struct Pooled(&'static Pool, Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.1
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.0.give(std::mem::take(&mut self.1));
    }
}

/// Reads exactly `len` bytes at `offset` of `file` into `buf` (emptied
/// first), without zeroing the buffer before the read.
pub fn read_exact_at(file: &std::fs::File, buf: &mut Vec<u8>, len: usize, offset: u64) -> std::io::Result<()> {
    buf.clear();
    buf.reserve(len);
    while buf.len() < len {
        let want = len - buf.len();
        let at = offset + buf.len() as u64;
        let spare = &mut buf.spare_capacity_mut()[..want];
        let (got, _) = rustix::io::pread(file, spare, at)?;
        let n = got.len();
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} bytes short at offset {}", len - buf.len(), at),
            ));
        }
        // SAFETY: pread initialised the first `n` bytes of the spare room.
        unsafe { buf.set_len(buf.len() + n) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_view_drops_and_the_pool_stays_bounded() {
        let pool: &'static Pool = Box::leak(Box::new(Pool::new(KEEP_BYTES)));
        let mut v = pool.take(1 << 20);
        assert!(v.capacity() >= 1 << 20);
        v.extend(std::iter::repeat_n(7u8, 1 << 20));
        let ptr = v.as_ptr();
        let b = pool.into_bytes(v);
        let view = b.slice(10..20);
        drop(b);
        assert_eq!(pool.idle_bytes(), 0, "a view still holds the buffer");
        assert_eq!(&view[..], &[7u8; 10]);
        drop(view);
        assert!(pool.idle_bytes() >= 1 << 20);
        // The same memory comes back for a request that fits, emptied; a
        // request larger than any idle buffer gets a new one.
        let larger = pool.take(2 << 20);
        assert!(larger.as_ptr() != ptr);
        drop(larger);
        let again = pool.take(1 << 20);
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.is_empty());
        assert_eq!(pool.idle_bytes(), 0);
        // The smallest buffer that fits is the one taken.
        pool.give(Vec::with_capacity(4 << 20));
        pool.give(again);
        pool.give(Vec::with_capacity(2 << 20));
        let fits = pool.take(1 << 20);
        assert_eq!(fits.as_ptr(), ptr);
        assert!(pool.take(3 << 20).capacity() >= 4 << 20);
        // Nor one more than twice the size asked for.
        pool.give(Vec::with_capacity(8 << 20));
        let (a, b) = (pool.take(1 << 20), pool.take(1 << 20));
        assert!(a.capacity() <= 2 << 20 && b.capacity() <= 2 << 20, "{} {}", a.capacity(), b.capacity());
        assert_eq!(pool.idle_bytes(), 8 << 20, "the 8 MiB buffer stays idle");
        drop(pool.take(8 << 20));
        // Small buffers are not pooled, nor too large ones; nor do small
        // ones come out of the pool.
        let idle = pool.idle_bytes();
        pool.give(Vec::with_capacity(MIN_BYTES - 1));
        pool.give(Vec::with_capacity(MAX_KEPT + 1));
        assert_eq!(pool.idle_bytes(), idle);
        assert!(pool.take(100).capacity() < MIN_BYTES);
        assert_eq!(pool.idle_bytes(), idle);
        assert_eq!(pool.into_bytes(vec![1, 2, 3]), Bytes::from_static(&[1, 2, 3]));
        // A buffer of exactly MIN_BYTES is pooled.
        let edge: &'static Pool = Box::leak(Box::new(Pool::new(KEEP_BYTES)));
        let v = Vec::with_capacity(MIN_BYTES);
        assert_eq!(v.capacity(), MIN_BYTES);
        drop(edge.into_bytes(v));
        assert_eq!(edge.idle_bytes(), MIN_BYTES);
        // The process's pool hands out room for what is asked.
        assert!(take(3 << 20).capacity() >= 3 << 20);
        // It holds at most its bound, and fills up to it.
        for _ in 0..3 * KEEP_BYTES / MAX_KEPT {
            pool.give(Vec::with_capacity(MAX_KEPT));
        }
        assert!(pool.idle_bytes() <= KEEP_BYTES);
        assert!(pool.idle_bytes() + MAX_KEPT > KEEP_BYTES, "the pool fills up to its bound");
    }

    #[test]
    fn read_exact_at_reads_the_span_and_names_a_short_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &content).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let mut buf = vec![1, 2, 3];
        read_exact_at(&f, &mut buf, 100_000, 50_000).unwrap();
        assert_eq!(buf, content[50_000..150_000]);
        let e = read_exact_at(&f, &mut buf, 100_000, 150_000).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
