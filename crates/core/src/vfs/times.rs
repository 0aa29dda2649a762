//! A snapshot's mtimes by path (its stat object), held compactly: every
//! path in one buffer, one fixed row per path, sorted by path. A million
//! paths hold about their bytes plus 16 bytes each (a map of them took
//! about 300 bytes a path), and are looked up by binary search.

/// Mtimes by path; see the module comment.
#[derive(Default)]
pub(super) struct PathTimes {
    paths: Vec<u8>,
    rows: Vec<Row>,
}

#[derive(Clone, Copy)]
struct Row {
    /// Where the path starts in `paths` (it ends where the next starts).
    start: u32,
    nanos: u32,
    secs: i64,
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
        let mut paths = Vec::with_capacity(order.iter().map(|i| entries[*i].0.len()).sum());
        let mut rows = Vec::with_capacity(order.len());
        for i in order {
            let (p, secs, nanos) = &entries[i];
            // A stat object is at most 256 MiB: its paths fit.
            rows.push(Row { start: paths.len() as u32, nanos: *nanos, secs: *secs });
            paths.extend_from_slice(p);
        }
        PathTimes { paths, rows }
    }

    fn path(&self, i: usize) -> &[u8] {
        let end = self.rows.get(i + 1).map_or(self.paths.len(), |r| r.start as usize);
        &self.paths[self.rows[i].start as usize..end]
    }

    pub(super) fn get(&self, path: &[u8]) -> Option<(i64, u32)> {
        let i = self.first_at_or_after(path);
        (i < self.rows.len() && self.path(i) == path).then(|| (self.rows[i].secs, self.rows[i].nanos))
    }

    fn first_at_or_after(&self, path: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.rows.len());
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

    /// Every (path, secs, nanos) whose path starts with `prefix`, in order.
    pub(super) fn with_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = (&'a [u8], i64, u32)> + 'a {
        (self.first_at_or_after(prefix)..self.rows.len())
            .map(|i| (self.path(i), self.rows[i].secs, self.rows[i].nanos))
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
}
