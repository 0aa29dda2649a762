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

    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    /// The names directly below directory `dir` (`""`: the top), in order,
    /// each found by one search: a name's own paths below it are skipped
    /// over, not read.
    pub(super) fn children(&self, dir: &[u8]) -> Vec<Vec<u8>> {
        let prefix = if dir.is_empty() { Vec::new() } else { [dir, b"/"].concat() };
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut i = self.first_at_or_after(&prefix);
        while i < self.rows.len() {
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
                    i = self.first_at_or_after(&[&prefix[..], name, b"0"].concat());
                }
            }
        }
        out
    }

    /// These times with a change applied: `removed` paths gone, then
    /// `entries` set (both sorted by path, as a stat layer holds them).
    pub(super) fn apply(&self, entries: &[(Vec<u8>, i64, u32)], removed: &[Vec<u8>]) -> PathTimes {
        let mut paths = Vec::with_capacity(self.paths.len() + entries.iter().map(|e| e.0.len()).sum::<usize>());
        let mut rows = Vec::with_capacity(self.rows.len() + entries.len());
        let mut push = |p: &[u8], secs: i64, nanos: u32| {
            rows.push(Row { start: paths.len() as u32, nanos, secs });
            paths.extend_from_slice(p);
        };
        let (mut i, mut e, mut r) = (0, 0, 0);
        while i < self.rows.len() || e < entries.len() {
            let old = (i < self.rows.len()).then(|| self.path(i));
            match (old, entries.get(e)) {
                (Some(o), n) if n.is_none_or(|n| o < &n.0[..]) => {
                    while removed.get(r).is_some_and(|x| &x[..] < o) {
                        r += 1;
                    }
                    if removed.get(r).is_none_or(|x| &x[..] != o) {
                        push(o, self.rows[i].secs, self.rows[i].nanos);
                    }
                    i += 1;
                }
                (o, Some(n)) => {
                    if o == Some(&n.0[..]) {
                        i += 1;
                    }
                    push(&n.0, n.1, n.2);
                    e += 1;
                }
                (Some(_) | None, None) => unreachable!("the loop runs while either has a path"),
            }
        }
        PathTimes { paths, rows }
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
