//! Small filesystem helpers every layer shares: atomic, durable file
//! replacement and advisory file locks.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Replaces `path` with `bytes` atomically and durably: written to a temp
/// file in the same directory, fsynced, renamed over `path`, and the
/// directory fsynced, so a crash leaves either the old or the new content
/// and a successful return means the new content survives one. On error
/// the temp file is removed and the old content is untouched.
pub fn save_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, true)
}

/// Replaces a file that is only a cache of something kept elsewhere (a
/// pack index pointer, the stat cache): atomic but not fsynced, and a
/// failure only costs speed, so it is ignored (no temp file is left).
pub fn save_cache_file(path: &Path, bytes: &[u8]) {
    let _ = replace(path, bytes, false);
}

/// Like [`save_cache_file`], but says when it failed.
pub fn replace_cache_file(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, false)
}

/// [`replace_cache_file`] of what `write` writes, through a buffer, as it
/// goes (the whole never held in memory).
pub fn replace_cache_file_with(
    path: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<()> {
    replace_with(path, false, |f| {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        write(&mut w)?;
        w.flush()
    })
}

fn replace(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    replace_with(path, durable, |f| f.write_all(bytes))
}

fn replace_with(
    path: &Path,
    durable: bool,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let tmp = dir.join(format!(".tmp-{}-{:016x}", std::process::id(), rand::random::<u64>()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        write(&mut f)?;
        if durable {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durable {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io { context: format!("saving {}", path.display()), source: e }
    })
}

/// The filesystem block whose zeros [`write_sparse`] leaves unwritten.
const SPARSE_BLOCK: usize = 4096;

/// Writes `bytes` at `at` in `f`, a file that holds nothing (a hole or
/// past its end) in that range, leaving each whole block of zeros (4 KiB,
/// aligned in the file) unwritten: the file reads the same, and its zeros
/// take no disk. The length is set when the last block was left out.
pub fn write_sparse(f: &std::fs::File, bytes: &[u8], at: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    static ZEROS: [u8; SPARSE_BLOCK] = [0; SPARSE_BLOCK];
    if bytes.len() < 2 * SPARSE_BLOCK {
        return f.write_all_at(bytes, at);
    }
    let end = at + bytes.len() as u64;
    // Cut points: the file's block boundaries within the range.
    let first = SPARSE_BLOCK - (at % SPARSE_BLOCK as u64) as usize;
    let mut run: Option<usize> = None;
    let mut i = 0;
    let mut zero_tail = false;
    while i < bytes.len() {
        let next = if i == 0 { first.min(bytes.len()) } else { (i + SPARSE_BLOCK).min(bytes.len()) };
        let block = &bytes[i..next];
        let zero = block.len() == SPARSE_BLOCK && block == &ZEROS[..];
        match (zero, run) {
            (true, Some(from)) => {
                f.write_all_at(&bytes[from..i], at + from as u64)?;
                run = None;
            }
            (false, None) => run = Some(i),
            _ => {}
        }
        zero_tail = zero;
        i = next;
    }
    if let Some(from) = run {
        f.write_all_at(&bytes[from..], at + from as u64)?;
    }
    if zero_tail && f.metadata()?.len() < end {
        f.set_len(end)?;
    }
    Ok(())
}

/// Reads a file that must be a regular file: opened without following a
/// symlink and without blocking (a FIFO or device planted where a cache
/// entry or a store object should be would otherwise hang the open), then
/// checked with fstat. Anything but a regular file is `InvalidData`.
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = open_regular(path)?;
    let mut out = crate::bufpool::take(f.metadata()?.len() as usize);
    f.read_to_end(&mut out)?;
    Ok(out)
}

/// Copies `len` bytes of `from` at `from_at` into `to` at `to_at`, in the
/// kernel (`copy_file_range`: no pass through this process's memory), or
/// through a buffer where the kernel or the filesystems refuse. An error if
/// `from` ends before `len` bytes.
pub fn copy_range(from: &std::fs::File, from_at: u64, to: &std::fs::File, to_at: u64, len: u64) -> std::io::Result<()> {
    let short = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the source ended early");
    let (mut src, mut dst, mut left) = (from_at, to_at, len);
    while left > 0 {
        let want = left.min(1 << 30) as usize;
        match rustix::fs::copy_file_range(from, Some(&mut src), to, Some(&mut dst), want) {
            Ok(0) => return Err(short()),
            Ok(n) => left -= n as u64,
            Err(e)
                if left == len
                    && matches!(
                        e,
                        rustix::io::Errno::XDEV
                            | rustix::io::Errno::NOSYS
                            | rustix::io::Errno::INVAL
                            | rustix::io::Errno::OPNOTSUPP
                    ) =>
            {
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if left == 0 {
        return Ok(());
    }
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; (left as usize).min(1 << 20)];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        // A short source is an UnexpectedEof here too.
        from.read_exact_at(&mut buf[..n], src)?;
        to.write_all_at(&buf[..n], dst)?;
        (src, dst, left) = (src + n as u64, dst + n as u64, left - n as u64);
    }
    Ok(())
}

/// The BLAKE3 hash of a regular file's bytes (as [`read_regular`] opens
/// it), read in blocks: memory does not grow with the file.
pub fn hash_regular(path: &Path) -> std::io::Result<crate::Hash> {
    hash_file(&open_regular(path)?)
}

/// BLAKE3 of an open file's bytes, read a MiB at a time.
pub fn hash_file(f: &std::fs::File) -> std::io::Result<crate::Hash> {
    let mut h = blake3::Hasher::new();
    let mut buf = crate::bufpool::take(1 << 20);
    let mut at = 0u64;
    loop {
        let (got, _) = rustix::io::pread(f, &mut buf.spare_capacity_mut()[..1 << 20], at)?;
        if got.is_empty() {
            break;
        }
        h.update(got);
        at += got.len() as u64;
    }
    crate::bufpool::SHARED.give(buf);
    Ok(crate::Hash(*h.finalize().as_bytes()))
}

/// Opens for reading a file that must be a regular file, as
/// [`read_regular`] does (no symlink followed, no blocking on a FIFO).
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(f)
}

/// Removes everything inside `dir` (not following symlinks).
pub fn empty_dir(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// Undoes a write into directory `dir` that failed: empties it again, and
/// removes it when the write made it (`made`).
pub fn undo_dir(dir: &Path, made: bool) {
    let _ = empty_dir(dir);
    if made {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Creates `dir` (and its parents) with the final folder private to the
/// user (0700) whatever the umask, as ssh and gpg do for theirs: mado's
/// cache, store and config hold copies of files other users must not read.
/// An existing folder is left as it is (a shared store is a deliberate
/// choice of whoever made it).
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(Error::io(format!("making {} private", dir.display())))
}

/// `p` for an error message: as it is up to 160 bytes, else its first and
/// last 64 bytes around its length (a path 4,000 levels deep is 8,000
/// bytes, and would bury the sentence it is in).
pub fn show_path(p: &[u8]) -> String {
    const MAX: usize = 160;
    const KEEP: usize = 64;
    if p.len() <= MAX {
        return String::from_utf8_lossy(p).into_owned();
    }
    format!(
        "{}[… {} bytes …]{}",
        String::from_utf8_lossy(&p[..KEEP]),
        p.len(),
        String::from_utf8_lossy(&p[p.len() - KEEP..])
    )
}

/// Threads for work bound by the CPU that splits freely (compressing a
/// pack's members, staging an import's subtrees): one per core, at most 8.
pub fn cpu_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8)
}

/// How deep a tree may be: git's own limit (`core.maxTreeDepth`, 4096).
pub const MAX_TREE_DEPTH: usize = 4096;

/// Runs `f` on a thread with a stack big enough for walks that recurse
/// once per tree level down to [`MAX_TREE_DEPTH`] (the default 2 MiB of a
/// worker thread overflows at a few thousand levels). The stack is
/// reserved, not committed: only what the walk touches costs memory.
pub fn on_deep_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("mado-deep-walk".into())
            .stack_size(1 << 30)
            .spawn_scoped(s, f)
            .expect("spawning a walk thread")
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Takes an exclusive flock on `path` (created if missing), off the async
/// threads; released when the returned file is dropped.
pub async fn lock_file(path: PathBuf) -> Result<std::fs::File> {
    tokio::task::spawn_blocking(move || {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(Error::io(format!("opening lock {}", path.display())))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Error::Io { context: format!("locking {}", path.display()), source: e.into() })?;
        Ok(f)
    })
    .await
    .map_err(|e| Error::Io { context: "lock task".into(), source: std::io::Error::other(e) })?
}

/// A cache file's bytes read in place through a memory map, or the same
/// bytes held in memory (a cache that could not take the file).
pub enum CacheBuf {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl CacheBuf {
    /// Maps the cache file `file`.
    pub fn map(file: &std::fs::File) -> std::io::Result<CacheBuf> {
        // SAFETY: the file is mado's own, in the user's private cache, and
        // only ever replaced by a rename, never written or truncated in
        // place; every reader checks the length before it reads a table.
        Ok(CacheBuf::Map(unsafe { memmap2::Mmap::map(file)? }))
    }
}

impl std::ops::Deref for CacheBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            CacheBuf::Map(m) => m,
            CacheBuf::Owned(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn write_sparse_reads_back_the_same_and_leaves_zero_blocks_unwritten() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let dir = tempfile::tempdir().unwrap();
        for (at, tail_zero) in [(0u64, false), (123, true), (4096, true), (5000, false)] {
            let mut bytes = vec![0u8; 64 << 10];
            bytes[..10].fill(7);
            bytes[20_000..20_010].fill(9);
            if !tail_zero {
                *bytes.last_mut().unwrap() = 1;
            }
            let p = dir.path().join(format!("f{at}"));
            let f = std::fs::File::options().create(true).truncate(true).read(true).write(true).open(&p).unwrap();
            write_sparse(&f, &bytes, at).unwrap();
            assert_eq!(f.metadata().unwrap().len(), at + bytes.len() as u64);
            let mut back = vec![1u8; bytes.len()];
            f.read_exact_at(&mut back, at).unwrap();
            assert!(back == bytes, "at {at}");
            // Three or four blocks of data, not sixteen.
            assert!(
                f.metadata().unwrap().blocks() * 512 <= 5 * 4096,
                "at {at}: {} blocks",
                f.metadata().unwrap().blocks()
            );
        }
    }

    use super::*;

    #[test]
    fn a_long_path_is_shown_by_its_ends_and_length() {
        let short = b"a/b/c.txt";
        assert_eq!(show_path(short), "a/b/c.txt");
        let at_limit = vec![b'x'; 160];
        assert_eq!(show_path(&at_limit), "x".repeat(160));
        let mut long = b"head/".repeat(40);
        long.extend_from_slice(b"tail.rs");
        let shown = show_path(&long);
        assert!(shown.starts_with("head/head/") && shown.ends_with("/tail.rs"), "{shown}");
        assert!(shown.contains("[… 207 bytes …]"), "{shown}");
        assert_eq!(shown.len(), 64 + 64 + "[… 207 bytes …]".len());
    }

    /// `copy_range` copies a span at any offsets, within one filesystem and
    /// across two (tmpfs to the test's disk, where the kernel may refuse and
    /// the buffer copies), and fails when the source ends early.
    #[test]
    fn copy_range_copies_a_span_and_refuses_a_short_source() {
        let t = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut froms = vec![t.path().join("from")];
        if std::path::Path::new("/dev/shm").is_dir() {
            froms.push(tempfile::tempdir_in("/dev/shm").unwrap().keep().join("from"));
        }
        for from in froms {
            std::fs::create_dir_all(from.parent().unwrap()).unwrap();
            std::fs::write(&from, &bytes).unwrap();
            let src = std::fs::File::open(&from).unwrap();
            let to = t.path().join("to");
            let dst = std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&to).unwrap();
            copy_range(&src, 1000, &dst, 7, 2_000_000).unwrap();
            let got = std::fs::read(&to).unwrap();
            assert_eq!(got.len(), 2_000_007, "{}", from.display());
            assert!(got[..7].iter().all(|b| *b == 0));
            assert!(got[7..] == bytes[1000..2_001_000], "{}", from.display());
            let e = copy_range(&src, 2_000_000, &dst, 0, 1_000_001).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{}", from.display());
            if from.starts_with("/dev/shm") {
                std::fs::remove_dir_all(from.parent().unwrap()).unwrap();
            }
        }
    }

    #[test]
    fn save_atomic_replaces_and_reports_failures_without_leaving_temp_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        save_atomic(&p, b"one").unwrap();
        save_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // A directory where the file should go: the rename fails.
        let blocked = d.path().join("blocked");
        std::fs::create_dir_all(blocked.join("inside")).unwrap();
        let e = save_atomic(&blocked, b"x").unwrap_err();
        assert!(e.to_string().contains("saving"), "{e}");
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "only state.json and blocked remain: {left:?}");
    }
}
