//! What changed between two trees, as paths added, modified (content, kind
//! or exec bit) and deleted: the comparison behind `mado diff` and `mado ws
//! status`. Subtrees whose ids are equal are skipped without being read, so
//! the cost follows the change; trees are read through the fetcher (their
//! index's inline copies, the cache, else the store), both sides of a pair
//! together. Iterative: no tree depth can overflow a stack.

use std::sync::Arc;

use crate::error::Result;
use crate::fetch::Fetcher;
use crate::hash::{Hash, TreeId};
use crate::object::{Entry, Kind, Tree};

/// Paths that differ between two trees, each list sorted.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.modified.is_empty() && self.deleted.is_empty()
    }
}

/// The changes that turn tree `old` into tree `new`. A directory that
/// becomes a file (or the reverse) is the directory's paths deleted (or
/// added) and the file added (or deleted).
pub async fn diff_trees(fetcher: &Arc<Fetcher>, old: TreeId, new: TreeId) -> Result<Changes> {
    let (old, new) = (old.hash(), new.hash());
    let mut out = Changes::default();
    let mut todo: Vec<(String, Option<Hash>, Option<Hash>)> = vec![(String::new(), Some(old), Some(new))];
    while let Some((path, old, new)) = todo.pop() {
        if old == new {
            continue;
        }
        let load = |id: Option<Hash>| {
            let f = fetcher.clone();
            let p = path.clone();
            async move {
                match id {
                    Some(id) => f.tree(id, &p).await,
                    None => Ok(Tree { entries: Vec::new() }),
                }
            }
        };
        let (a, b) = futures::try_join!(load(old), load(new))?;
        // An empty directory on one side only: a working copy and a mount
        // keep it and a checkpoint records it, so it is a change ("path/").
        if !path.is_empty() {
            if old.is_none() && b.entries.is_empty() {
                out.added.push(format!("{path}/"));
            }
            if new.is_none() && a.entries.is_empty() {
                out.deleted.push(format!("{path}/"));
            }
        }
        let join = |name: &[u8]| {
            let n = String::from_utf8_lossy(name);
            if path.is_empty() {
                n.into_owned()
            } else {
                format!("{path}/{n}")
            }
        };
        let dir = |e: &Entry| (e.kind == Kind::Directory).then_some(e.id);
        // Entries are sorted by name (a decoded tree is checked for it):
        // one pass over both.
        let (mut i, mut j) = (0, 0);
        while i < a.entries.len() || j < b.entries.len() {
            let (x, y) = (a.entries.get(i), b.entries.get(j));
            let order = match (x, y) {
                (Some(x), Some(y)) => x.name.cmp(&y.name),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match order {
                std::cmp::Ordering::Less => {
                    let x = x.expect("an entry on the left");
                    match dir(x) {
                        Some(id) => todo.push((join(&x.name), Some(id), None)),
                        None => out.deleted.push(join(&x.name)),
                    }
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    let y = y.expect("an entry on the right");
                    match dir(y) {
                        Some(id) => todo.push((join(&y.name), None, Some(id))),
                        None => out.added.push(join(&y.name)),
                    }
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    let (x, y) = (x.expect("left"), y.expect("right"));
                    match (dir(x), dir(y)) {
                        (Some(p), Some(q)) => todo.push((join(&x.name), Some(p), Some(q))),
                        (Some(p), None) => {
                            todo.push((join(&x.name), Some(p), None));
                            out.added.push(join(&y.name));
                        }
                        (None, Some(q)) => {
                            out.deleted.push(join(&x.name));
                            todo.push((join(&y.name), None, Some(q)));
                        }
                        (None, None) if x.id != y.id || x.kind != y.kind => out.modified.push(join(&x.name)),
                        (None, None) => {}
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
    }
    out.added.sort();
    out.modified.sort();
    out.deleted.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::DiskCache;
    use crate::store::{Remote, Space};
    use bytes::Bytes;

    fn file(name: &str, content: &[u8]) -> Entry {
        Entry { name: name.into(), kind: Kind::File, chunked: false, size: content.len() as u64, id: Hash::of(content) }
    }

    async fn put(remote: &Remote, entries: Vec<Entry>) -> Entry {
        let enc = Tree { entries }.encode();
        let id = Hash::of(&enc);
        remote.put_object(Space::Objects, &id, Bytes::from(enc)).await.unwrap();
        Entry { name: Vec::new(), kind: Kind::Directory, chunked: false, size: 0, id }
    }

    /// Entries equal on both sides are stepped over in step, so the ones
    /// after them pair up with their own kind: a change among many equal
    /// names is that change alone, in a subtree too.
    #[tokio::test]
    async fn only_what_differs_is_listed_past_equal_entries() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/store", dir.path().display());
        let remote = Arc::new(Remote::open(&url, &Default::default()).unwrap());
        let f = Fetcher::new(remote.clone(), Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap()));
        let sub_old = put(&remote, vec![file("a", b"1"), file("b", b"2"), file("c", b"3")]).await;
        let sub_new =
            put(&remote, vec![file("a", b"1"), file("b", b"2"), file("c", b"changed"), file("d", b"4")]).await;
        let named = |mut e: Entry, n: &str| {
            e.name = n.into();
            e
        };
        let old = put(&remote, vec![file("k", b"k"), file("l", b"l"), named(sub_old, "s"), file("x", b"x")]).await;
        let new = put(&remote, vec![file("k", b"k"), file("l", b"l2"), named(sub_new, "s"), file("y", b"y")]).await;
        let c = diff_trees(&f, TreeId::from_hash(old.id), TreeId::from_hash(new.id)).await.unwrap();
        assert_eq!(
            c,
            Changes {
                added: vec!["s/d".into(), "y".into()],
                modified: vec!["l".into(), "s/c".into()],
                deleted: vec!["x".into()]
            }
        );
        assert!(diff_trees(&f, TreeId::from_hash(old.id), TreeId::from_hash(old.id)).await.unwrap().is_empty());
    }

    /// An empty directory added or removed is a change of its own (with a
    /// `/`), alone or beside a file; one that holds files is its files.
    #[tokio::test]
    async fn an_empty_directory_added_or_removed_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/store", dir.path().display());
        let remote = Arc::new(Remote::open(&url, &Default::default()).unwrap());
        let f = Fetcher::new(remote.clone(), Arc::new(DiskCache::open(dir.path().join("cache"), None).unwrap()));
        let named = |mut e: Entry, n: &str| {
            e.name = n.into();
            e
        };
        let empty = put(&remote, vec![]).await;
        let full = put(&remote, vec![file("f", b"f")]).await;
        let a = put(&remote, vec![file("k", b"k"), named(empty.clone(), "old")]).await;
        let b = put(&remote, vec![file("k", b"k"), named(empty, "new"), named(full, "sub")]).await;
        let c = diff_trees(&f, TreeId::from_hash(a.id), TreeId::from_hash(b.id)).await.unwrap();
        assert_eq!(
            c,
            Changes { added: vec!["new/".into(), "sub/f".into()], modified: vec![], deleted: vec!["old/".into()] }
        );
    }
}
