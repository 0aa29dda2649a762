//! A snapshot's mtimes by path (its stat object), held compactly: one
//! buffer of fixed rows sorted by path, then the paths. A million paths
//! hold about their bytes plus 16 bytes each (a map of them took about
//! 300 bytes a path), and are looked up by binary search.
//!
//! The buffer is also a file's layout (docs/FORMAT.md, "Flat mtimes"): a
//! workspace mount keeps its base's times as `stat/flat/<stat id>` in the
//! disk cache and maps it, so every mount of one base shares one copy in
//! the page cache, and what a daemon holds of them is file pages the
//! kernel can drop, not its own memory (20 workspace mounts of a
//! million-file tree each held its 60 MiB before).

use std::path::Path;

use crate::fsutil::CacheBuf;
use crate::hash::Hash;

const MAGIC: &[u8; 8] = b"MADTIM\x00\x01";
/// Magic and version, the stat object's id, row count, paths' length.
const HEAD: usize = 8 + 32 + 8 + 8;
/// Start of its path (u32), nanoseconds (u32), seconds (i64).
const ROW: usize = 16;

/// Mtimes by path; see the module comment.
pub(super) struct PathTimes {
    buf: CacheBuf,
    n: usize,
}

impl Default for PathTimes {
    fn default() -> PathTimes {
        Builder::with_capacity(0, 0).finish()
    }
}

/// Rows and paths, appended in path order.
struct Builder {
    rows: Vec<u8>,
    paths: Vec<u8>,
}

impl Builder {
    fn with_capacity(rows: usize, path_bytes: usize) -> Builder {
        Builder { rows: Vec::with_capacity(rows * ROW), paths: Vec::with_capacity(path_bytes) }
    }

    fn push(&mut self, p: &[u8], secs: i64, nanos: u32) {
        // A stat object is at most 256 MiB: its paths fit.
        self.rows.extend_from_slice(&(self.paths.len() as u32).to_le_bytes());
        self.rows.extend_from_slice(&nanos.to_le_bytes());
        self.rows.extend_from_slice(&secs.to_le_bytes());
        self.paths.extend_from_slice(p);
    }

    fn finish(self) -> PathTimes {
        let n = self.rows.len() / ROW;
        let mut buf = Vec::with_capacity(HEAD + self.rows.len() + self.paths.len());
        buf.extend_from_slice(MAGIC);
        // The stat object's id: set when kept (`kept_at`).
        buf.extend_from_slice(&[0; 32]);
        buf.extend_from_slice(&(n as u64).to_le_bytes());
        buf.extend_from_slice(&(self.paths.len() as u64).to_le_bytes());
        buf.extend_from_slice(&self.rows);
        drop(self.rows);
        buf.extend_from_slice(&self.paths);
        PathTimes { buf: CacheBuf::Owned(buf), n }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl PathTimes {
    /// From a stat object's entries (sorted and unique as decoded; sorted
    /// here again if not, the first of equal paths kept).
    pub(super) fn new(entries: &[(Vec<u8>, i64, u32)]) -> PathTimes {
        let mut order: Vec<usize> = (0..entries.len()).collect();
        if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
            order.sort_by(|a, b| entries[*a].0.cmp(&entries[*b].0));
            order.dedup_by(|a, b| entries[*a].0 == entries[*b].0);
        }
        let mut b = Builder::with_capacity(order.len(), order.iter().map(|i| entries[*i].0.len()).sum());
        for i in order {
            let (p, secs, nanos) = &entries[i];
            b.push(p, *secs, *nanos);
        }
        b.finish()
    }

    /// The times of stat object `stat` kept at `path` (see the module
    /// comment), if that file is there and sound: it names `stat`, its
    /// rows fill it exactly, their paths start in order inside it and are
    /// sorted and unique, and every nanosecond count is under a second.
    /// Anything else is `None`, and the caller makes it again.
    pub(super) fn open(path: &Path, stat: &Hash) -> Option<PathTimes> {
        let file = crate::fsutil::open_regular(path).ok()?;
        PathTimes::parse(CacheBuf::map(&file).ok()?, stat)
    }

    fn parse(buf: CacheBuf, stat: &Hash) -> Option<PathTimes> {
        let b = &buf[..];
        if b.len() < HEAD || &b[..8] != MAGIC || &b[8..40] != stat.as_bytes() {
            return None;
        }
        let (n, paths) = (u64_at(b, 40), u64_at(b, 48));
        let want = n.checked_mul(ROW as u64)?.checked_add(paths)?.checked_add(HEAD as u64)?;
        if want != b.len() as u64 {
            return None;
        }
        let n = n as usize;
        let mut last = 0;
        for i in 0..n {
            let at = HEAD + i * ROW;
            let start = u32_at(b, at) as u64;
            if start < last || start > paths || u32_at(b, at + 4) >= 1_000_000_000 {
                return None;
            }
            last = start;
        }
        let t = PathTimes { buf, n };
        // Sorted and unique, or lookups and `children` would go astray.
        (1..n).all(|i| t.path(i - 1) < t.path(i)).then_some(t)
    }

    /// These times, those of stat object `stat`, written to `path` and
    /// read from there, mapped; as they are, in memory, if the file cannot
    /// be written or does not read back byte for byte (the bytes are the
    /// ones just checked by being made: compared, not parsed again).
    pub(super) fn kept_at(mut self, path: &Path, stat: &Hash) -> PathTimes {
        if let CacheBuf::Owned(b) = &mut self.buf {
            b[8..40].copy_from_slice(stat.as_bytes());
        }
        let written = crate::fsutil::replace_cache_file(path, &self.buf);
        let back = written.ok().and_then(|_| crate::fsutil::open_regular(path).ok());
        match back.and_then(|f| CacheBuf::map(&f).ok()) {
            Some(map) if map[..] == self.buf[..] => PathTimes { buf: map, n: self.n },
            _ => self,
        }
    }

    /// Row `i`: where its path starts, its seconds and nanoseconds.
    fn row(&self, i: usize) -> (usize, i64, u32) {
        let at = HEAD + i * ROW;
        let b = &self.buf[..];
        (u32_at(b, at) as usize, u64_at(b, at + 8) as i64, u32_at(b, at + 4))
    }

    fn paths(&self) -> &[u8] {
        &self.buf[HEAD + self.n * ROW..]
    }

    fn path(&self, i: usize) -> &[u8] {
        let paths = self.paths();
        let end = if i + 1 < self.n { self.row(i + 1).0 } else { paths.len() };
        &paths[self.row(i).0..end]
    }

    fn times(&self, i: usize) -> (i64, u32) {
        let (_, secs, nanos) = self.row(i);
        (secs, nanos)
    }

    pub(super) fn get(&self, path: &[u8]) -> Option<(i64, u32)> {
        let i = self.first_at_or_after(path);
        (i < self.n && self.path(i) == path).then(|| self.times(i))
    }

    fn first_at_or_after(&self, path: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.path(mid) < path {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub(super) fn len(&self) -> usize {
        self.n
    }

    /// The names directly below directory `dir` (`""`: the top), in order,
    /// each found by one search: a name's own paths below it are skipped
    /// over, not read.
    pub(super) fn children(&self, dir: &[u8]) -> Vec<Vec<u8>> {
        let prefix = if dir.is_empty() { Vec::new() } else { [dir, b"/"].concat() };
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut i = self.first_at_or_after(&prefix);
        while i < self.n {
            let p = self.path(i);
            let Some(rest) = p.strip_prefix(&prefix[..]) else { break };
            match rest.iter().position(|b| *b == b'/') {
                // The directory itself (the top's own path is "").
                _ if rest.is_empty() => i += 1,
                None => {
                    out.push(rest.to_vec());
                    i += 1;
                }
                Some(slash) => {
                    // A path below a child: everything under `child/` sorts
                    // together, before `child0` ('0' follows '/').
                    // Listed already when its own path is there (it sorts
                    // first, though not always just before: `a.txt` comes
                    // between `a` and `a/b`).
                    let name = &rest[..slash];
                    if self.get(&[&prefix[..], name].concat()).is_none() {
                        out.push(name.to_vec());
                    }
                    // Always forward, whatever the rows hold.
                    i = self.first_at_or_after(&[&prefix[..], name, b"0"].concat()).max(i + 1);
                }
            }
        }
        out
    }

    /// These times with a change applied: `removed` paths gone, then
    /// `entries` set (both sorted by path, as a stat layer holds them).
    pub(super) fn apply(&self, entries: &[(Vec<u8>, i64, u32)], removed: &[Vec<u8>]) -> PathTimes {
        let mut b = Builder::with_capacity(
            self.n + entries.len(),
            self.paths().len() + entries.iter().map(|e| e.0.len()).sum::<usize>(),
        );
        let (mut i, mut e, mut r) = (0, 0, 0);
        while i < self.n || e < entries.len() {
            let old = (i < self.n).then(|| self.path(i));
            match (old, entries.get(e)) {
                (Some(o), n) if n.is_none_or(|n| o < &n.0[..]) => {
                    while removed.get(r).is_some_and(|x| &x[..] < o) {
                        r += 1;
                    }
                    if removed.get(r).is_none_or(|x| &x[..] != o) {
                        let (secs, nanos) = self.times(i);
                        b.push(o, secs, nanos);
                    }
                    i += 1;
                }
                (o, Some(n)) => {
                    if o == Some(&n.0[..]) {
                        i += 1;
                    }
                    b.push(&n.0, n.1, n.2);
                    e += 1;
                }
                (Some(_) | None, None) => unreachable!("the loop runs while either has a path"),
            }
        }
        b.finish()
    }

    /// Every (path, secs, nanos) whose path starts with `prefix`, in order.
    pub(super) fn with_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = (&'a [u8], i64, u32)> + 'a {
        (self.first_at_or_after(prefix)..self.n)
            .map(|i| {
                let (secs, nanos) = self.times(i);
                (self.path(i), secs, nanos)
            })
            .take_while(move |(p, _, _)| p.starts_with(prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_found_by_exact_path_and_by_prefix() {
        let e = |p: &str, s: i64| (p.as_bytes().to_vec(), s, s as u32);
        let t = PathTimes::new(&[e("", 1), e("a", 2), e("a.txt", 3), e("a/b", 4), e("a/b/c", 5), e("b", 6)]);
        assert_eq!(t.get(b""), Some((1, 1)));
        assert_eq!(t.get(b"a/b"), Some((4, 4)));
        assert_eq!(t.get(b"b"), Some((6, 6)));
        assert_eq!(t.get(b"a/"), None);
        assert_eq!(t.get(b"c"), None);
        let under: Vec<&[u8]> = t.with_prefix(b"a/").map(|(p, _, _)| p).collect();
        assert_eq!(under, [&b"a/b"[..], b"a/b/c"]);
        assert_eq!(t.with_prefix(b"").count(), 6);
        assert_eq!(t.with_prefix(b"zz").count(), 0);
        // Unsorted input with a repeat: sorted, the first kept.
        let t = PathTimes::new(&[e("b", 1), e("a", 2), e("b", 3)]);
        assert_eq!((t.get(b"a"), t.get(b"b")), (Some((2, 2)), Some((1, 1))));
        assert_eq!(PathTimes::default().get(b""), None);
    }

    #[test]
    fn children_are_listed_without_reading_below_them() {
        let e = |p: &str| (p.as_bytes().to_vec(), 1, 0);
        let t = PathTimes::new(&[e(""), e("a"), e("a.txt"), e("a/b"), e("a/b/c"), e("a/d"), e("a0"), e("b/x"), e("c")]);
        let names =
            |d: &str| t.children(d.as_bytes()).into_iter().map(|n| String::from_utf8(n).unwrap()).collect::<Vec<_>>();
        assert_eq!(names(""), ["a", "a.txt", "a0", "b", "c"]);
        assert_eq!(names("a"), ["b", "d"]);
        assert_eq!(names("a/b"), ["c"]);
        assert!(names("c").is_empty() && names("zz").is_empty());
        assert_eq!(t.len(), 9);
    }

    #[test]
    fn kept_times_map_back_the_same_and_a_damaged_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let at = d.path().join("stat").join("flat").join("t");
        let e = |p: &str, s: i64, n: u32| (p.as_bytes().to_vec(), s, n);
        let t = PathTimes::new(&[e("", 1, 0), e("a", -2, 5), e("a/b", 3, 999_999_999), e("c", i64::MAX, 7)]);
        let id = Hash::of(b"stat");
        let m = t.kept_at(&at, &id);
        assert!(matches!(m.buf, CacheBuf::Map(_)), "kept times are read from their file");
        let all: Vec<(Vec<u8>, i64, u32)> = m.with_prefix(b"").map(|(p, s, n)| (p.to_vec(), s, n)).collect();
        assert_eq!(all, [e("", 1, 0), e("a", -2, 5), e("a/b", 3, 999_999_999), e("c", i64::MAX, 7)]);
        assert_eq!(PathTimes::open(&at, &id).map(|t| t.len()), Some(4));
        assert!(PathTimes::open(&at, &Hash::of(b"another")).is_none(), "another object's times");
        let good = std::fs::read(&at).unwrap();
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            std::fs::write(&at, &b).unwrap();
            PathTimes::open(&at, &id).is_none()
        };
        assert!(bad(&|b| b.truncate(b.len() - 1)), "a short file");
        assert!(bad(&|b| b.push(0)), "a long file");
        assert!(bad(&|b| b[0] ^= 1), "another magic");
        assert!(bad(&|b| b[HEAD + ROW..HEAD + ROW + 4].copy_from_slice(&9u32.to_le_bytes())), "a path past the end");
        assert!(bad(&|b| b[HEAD + 3 * ROW..HEAD + 3 * ROW + 4].copy_from_slice(&0u32.to_le_bytes())), "out of order");
        assert!(bad(&|b| b[HEAD + 4..HEAD + 8].copy_from_slice(&1_000_000_000u32.to_le_bytes())), "a second of nanos");
        assert!(bad(&|b| b[40..48].copy_from_slice(&u64::MAX.to_le_bytes())), "a count that overflows");
        // Paths out of order though their starts climb ("a" made "z").
        assert!(
            bad(&|b| {
                let paths = b.len() - 5;
                b[paths..paths + 2].copy_from_slice(b"za");
            }),
            "unsorted paths"
        );
        std::fs::write(&at, &good).unwrap();
        assert!(PathTimes::open(&at, &id).is_some());
        assert!(PathTimes::open(&d.path().join("none"), &id).is_none());
        // A file that cannot be written: the times stay in memory.
        let t =
            PathTimes::new(&[e("x", 1, 1)]).kept_at(&d.path().join("stat").join("flat").join("t").join("below"), &id);
        assert!(matches!(t.buf, CacheBuf::Owned(_)) && t.get(b"x") == Some((1, 1)));
    }

    #[test]
    fn a_change_applied_removes_then_sets() {
        let e = |p: &str, s: i64| (p.as_bytes().to_vec(), s, 0u32);
        let t = PathTimes::new(&[e("", 1), e("a", 2), e("a/b", 3), e("c", 4), e("d", 5)]);
        let set = [e("a/b", 30), e("b", 9), e("c", 40), e("e", 7)];
        let gone = [b"a".to_vec(), b"c".to_vec(), b"d".to_vec(), b"zz".to_vec()];
        let u = t.apply(&set, &gone);
        let all: Vec<(String, i64)> =
            u.with_prefix(b"").map(|(p, s, _)| (String::from_utf8(p.to_vec()).unwrap(), s)).collect();
        let want = [("", 1), ("a/b", 30), ("b", 9), ("c", 40), ("e", 7)];
        assert_eq!(all, want.map(|(p, s)| (p.to_string(), s)));
        assert_eq!(u.len(), 5);
        assert_eq!(t.apply(&[], &[]).len(), t.len());
    }
}
