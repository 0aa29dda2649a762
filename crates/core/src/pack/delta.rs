//! Trees of an index layer written as their difference from a tree below.
//!
//! A checkpoint of a few edits writes every directory on their paths
//! again; at the top of a monorepo that is a root of thousands of
//! entries, each with its 32-byte id, for one changed entry. A layer
//! (index version 3) may carry such a tree as a delta: the id of a tree
//! in a layer below it, the names gone from it and the entries added or
//! changed. A reader rebuilds the tree from its base and checks it against
//! its id, so a delta never yields bytes other than the tree it names.

use std::borrow::Cow;
use std::collections::HashMap;

use super::PackIndex;
use crate::codec::{put_bytes, put_varint, DecodeError, Reader};
use crate::hash::Hash;
use crate::object::{put_entry, read_entry, Entry, Kind, Tree};

/// Tree `id` as tree `base` (in a layer below) with `removed` gone and
/// `upserts` added or replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeDelta {
    pub id: Hash,
    pub base: Hash,
    /// Names of the base's entries that `id` lacks, sorted.
    pub removed: Vec<Vec<u8>>,
    /// Entries of `id` that the base lacks or holds otherwise, sorted.
    pub upserts: Vec<Entry>,
}

impl TreeDelta {
    /// What turns `base` into `new` (both as decoded: sorted, unique).
    pub fn between(id: Hash, new: &Tree, base_id: Hash, base: &Tree) -> TreeDelta {
        let (mut removed, mut upserts) = (Vec::new(), Vec::new());
        let (mut n, mut b) = (new.entries.iter().peekable(), base.entries.iter().peekable());
        loop {
            match (n.peek(), b.peek()) {
                (None, None) => break,
                (Some(_), None) => upserts.push(n.next().expect("peeked").clone()),
                (None, Some(_)) => removed.push(b.next().expect("peeked").name.clone()),
                (Some(x), Some(y)) => match x.name.cmp(&y.name) {
                    std::cmp::Ordering::Less => upserts.push(n.next().expect("peeked").clone()),
                    std::cmp::Ordering::Greater => removed.push(b.next().expect("peeked").name.clone()),
                    std::cmp::Ordering::Equal => {
                        let (x, y) = (n.next().expect("peeked"), b.next().expect("peeked"));
                        if x != y {
                            upserts.push(x.clone());
                        }
                    }
                },
            }
        }
        TreeDelta { id, base: base_id, removed, upserts }
    }

    /// The tree's bytes, from its base's: `Err` says why not (a base that
    /// does not decode, a removed name it lacks, a result of another id).
    pub fn apply(&self, base: &[u8]) -> Result<Vec<u8>, String> {
        let what = || format!("tree {} (a delta over {})", self.id.short(), self.base.short());
        let b = Tree::decode(base).map_err(|e| format!("{}: its base does not decode: {e}", what()))?;
        if let Some(gone) = self.removed.iter().find(|r| b.get(r).is_none()) {
            return Err(format!("{}: removes {:?}, which its base lacks", what(), String::from_utf8_lossy(gone)));
        }
        let kept = |e: &Entry| {
            self.removed.binary_search(&e.name).is_err()
                && self.upserts.binary_search_by(|u| u.name.cmp(&e.name)).is_err()
        };
        let mut entries: Vec<Entry> = b.entries.into_iter().filter(kept).collect();
        entries.extend(self.upserts.iter().cloned());
        let bytes = Tree::normalized(entries).map_err(|e| format!("{}: {e}", what()))?.encode();
        if !self.id.verifies(&bytes) {
            return Err(format!("{}: the rebuilt tree does not match its id", what()));
        }
        Ok(bytes)
    }

    pub(crate) fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.id.as_bytes());
        out.extend_from_slice(self.base.as_bytes());
        put_varint(out, self.removed.len() as u64);
        for r in &self.removed {
            put_bytes(out, r);
        }
        put_varint(out, self.upserts.len() as u64);
        for e in &self.upserts {
            put_entry(out, e);
        }
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<TreeDelta, DecodeError> {
        let id = r.hash()?;
        let base = r.hash()?;
        if base == id {
            return Err(DecodeError::Invalid(format!("tree delta {} is over itself", id.short())));
        }
        let nr = r.count(2)?;
        let mut removed = Vec::with_capacity(nr);
        for _ in 0..nr {
            removed.push(r.bytes()?.to_vec());
        }
        let nu = r.count(36)?;
        let mut upserts = Vec::with_capacity(nu);
        for _ in 0..nu {
            upserts.push(read_entry(r)?);
        }
        let sorted = removed.windows(2).all(|w| w[0] < w[1]) && upserts.windows(2).all(|w| w[0].name < w[1].name);
        if !sorted {
            return Err(DecodeError::Invalid(format!("tree delta {}: names not sorted or repeated", id.short())));
        }
        Ok(TreeDelta { id, base, removed, upserts })
    }

    fn encoded_len(&self) -> usize {
        let mut out = Vec::new();
        self.put(&mut out);
        out.len()
    }
}

/// The deltas worth writing for layer `layer`'s trees: each new directory
/// against the directory at the same path in the tree its chain starts
/// from (`layer.base[0]`), walked down from the root through what changed,
/// where the delta is under half the tree's bytes. `below` gives the
/// bytes of a tree the chain below holds (a delta's base must be one).
pub fn choose<'a>(layer: &PackIndex, below: &dyn Fn(&Hash) -> Option<Cow<'a, [u8]>>) -> Vec<TreeDelta> {
    let Some(old_root) = layer.base.first() else { return Vec::new() };
    let new: HashMap<Hash, &[u8]> = layer.trees.iter().map(|(id, t)| (*id, &t[..])).collect();
    let mut out = Vec::new();
    let mut todo = vec![(layer.tree, *old_root)];
    while let Some((n, o)) = todo.pop() {
        let Some(nb) = new.get(&n) else { continue };
        let Some(ob) = below(&o) else { continue };
        let (Ok(nt), Ok(ot)) = (Tree::decode(nb), Tree::decode(&ob)) else { continue };
        let d = TreeDelta::between(n, &nt, o, &ot);
        if d.encoded_len() * 2 < nb.len() {
            out.push(d);
        }
        for e in nt.entries.iter().filter(|e| e.kind == Kind::Directory && new.contains_key(&e.id)) {
            if let Some(was) = ot.get(&e.name).filter(|w| w.kind == Kind::Directory && w.id != e.id) {
                todo.push((e.id, was.id));
            }
        }
    }
    out
}

/// Layer `layer` as stored: its trees in `deltas` written as deltas
/// (index version 3), the rest whole.
pub fn encode_with(layer: &PackIndex, deltas: Vec<TreeDelta>) -> Vec<u8> {
    if deltas.is_empty() {
        return layer.encode();
    }
    let as_delta: std::collections::HashSet<Hash> = deltas.iter().map(|d| d.id).collect();
    let trees = layer.trees.iter().filter(|(id, _)| !as_delta.contains(id)).cloned().collect();
    PackIndex { trees, deltas, ..layer.clone() }.encode()
}

/// Rebuilds the delta trees of every layer of a chain (the top first, as
/// stored), each from the layers below it, the bottom up: afterwards every
/// layer holds its trees whole. `Err` names the tree that cannot be had.
pub fn resolve_chain(layers: &mut [PackIndex]) -> Result<(), String> {
    if layers.iter().all(|l| l.deltas.is_empty()) {
        return Ok(());
    }
    // Where each tree of the layers below the one being resolved is: its
    // layer's position in the chain and its own in that layer's trees.
    let mut at: HashMap<Hash, (usize, usize)> = HashMap::new();
    for i in (0..layers.len()).rev() {
        let (head, below) = layers.split_at_mut(i + 1);
        let this = &mut head[i];
        let lookup = |id: &Hash| at.get(id).map(|&(l, t)| Cow::Borrowed(&below[l - i - 1].trees[t].1[..]));
        this.resolve_deltas(&lookup)?;
        for (t, (id, _)) in this.trees.iter().enumerate() {
            at.entry(*id).or_insert((i, t));
        }
    }
    Ok(())
}

impl PackIndex {
    /// Rebuilds this layer's delta trees from the trees `below` gives (the
    /// layers under it) and adds them to its trees.
    pub fn resolve_deltas<'a>(&mut self, below: &dyn Fn(&Hash) -> Option<Cow<'a, [u8]>>) -> Result<(), String> {
        for d in std::mem::take(&mut self.deltas) {
            let Some(base) = below(&d.base) else {
                return Err(format!(
                    "tree {} of index layer {} is a delta over tree {}, which no layer below it holds",
                    d.id.short(),
                    self.tree.short(),
                    d.base.short()
                ));
            };
            let bytes = d.apply(&base)?;
            self.trees.push((d.id, bytes));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::Mode;

    fn file(name: &str, v: u8) -> Entry {
        Entry { name: name.as_bytes().to_vec(), kind: Kind::File, chunked: false, size: v as u64, id: Hash([v; 32]) }
    }

    fn dir(name: &str, id: Hash) -> Entry {
        Entry { name: name.as_bytes().to_vec(), kind: Kind::Directory, chunked: false, size: 0, id }
    }

    fn tree(entries: Vec<Entry>) -> (Hash, Vec<u8>) {
        let t = Tree::normalized(entries).unwrap().encode();
        (Hash::of(&t), t)
    }

    fn layer(root: Hash, trees: Vec<(Hash, Vec<u8>)>, base: Vec<Hash>) -> PackIndex {
        PackIndex { tree: root, mode: Mode::Recursive, dirs: 1, packs: vec![], trees, base, deltas: vec![] }
    }

    #[test]
    fn a_delta_rebuilds_its_tree_and_nothing_else() {
        let base: Vec<Entry> = (0..50).map(|i| file(&format!("f{i:02}"), i)).collect();
        let (bid, bbytes) = tree(base.clone());
        let mut new = base.clone();
        new.remove(10); // gone
        new[20] = file("f21", 99); // changed
        new.push(file("zz", 7)); // added
        new.insert(0, dir("a", Hash([5; 32]))); // added first
        let (nid, nbytes) = tree(new.clone());
        let d = TreeDelta::between(nid, &Tree::decode(&nbytes).unwrap(), bid, &Tree::decode(&bbytes).unwrap());
        assert_eq!(d.removed, vec![b"f10".to_vec()]);
        assert_eq!(d.upserts.iter().map(|e| e.name.clone()).collect::<Vec<_>>(), [&b"a"[..], b"f21", b"zz"]);
        assert_eq!(d.apply(&bbytes).unwrap(), nbytes);
        // The same bytes after a trip through the encoding.
        let mut enc = Vec::new();
        d.put(&mut enc);
        let back = TreeDelta::read(&mut Reader::new(&enc)).unwrap();
        assert_eq!(back, d);
        // Over another base: refused, never another tree.
        let (_, other) = tree(base[1..].to_vec());
        assert!(d.apply(&other).unwrap_err().contains("does not match its id"));
        let lacking = tree(base.iter().filter(|e| e.name != b"f10").cloned().collect()).1;
        assert!(d.apply(&lacking).unwrap_err().contains("which its base lacks"));
        assert!(d.apply(b"not a tree").unwrap_err().contains("does not decode"));
        // The same tree twice: no change at all.
        let same = TreeDelta::between(bid, &Tree::decode(&bbytes).unwrap(), bid, &Tree::decode(&bbytes).unwrap());
        assert!(same.removed.is_empty() && same.upserts.is_empty());
    }

    #[test]
    fn hostile_deltas_are_refused() {
        let d = TreeDelta {
            id: Hash([1; 32]),
            base: Hash([2; 32]),
            removed: vec![b"b".to_vec(), b"a".to_vec()],
            upserts: vec![],
        };
        let mut enc = Vec::new();
        d.put(&mut enc);
        assert!(TreeDelta::read(&mut Reader::new(&enc)).is_err(), "unsorted names");
        let d = TreeDelta { removed: vec![b"a".to_vec(), b"a".to_vec()], ..d };
        let mut enc = Vec::new();
        d.put(&mut enc);
        assert!(TreeDelta::read(&mut Reader::new(&enc)).is_err(), "a removed name twice");
        let d = TreeDelta { removed: vec![], upserts: vec![file("x", 1), file("x", 2)], ..d };
        let mut enc = Vec::new();
        d.put(&mut enc);
        assert!(TreeDelta::read(&mut Reader::new(&enc)).is_err(), "a name twice");
        let d = TreeDelta { base: d.id, upserts: vec![], ..d };
        let mut enc = Vec::new();
        d.put(&mut enc);
        assert!(TreeDelta::read(&mut Reader::new(&enc)).is_err(), "over itself");
        // A bad name in an upsert is refused when the tree is rebuilt.
        let (bid, bbytes) = tree(vec![file("a", 1)]);
        let d = TreeDelta { id: Hash([3; 32]), base: bid, removed: vec![], upserts: vec![file("..", 1)] };
        assert!(d.apply(&bbytes).is_err());
    }

    /// A root of many directories, one of them (and its big child) changed.
    fn big_change() -> (PackIndex, PackIndex, Vec<u8>) {
        let leaf: Vec<Entry> = (0..100).map(|i| file(&format!("f{i:03}"), i)).collect();
        let (old_leaf, old_leaf_b) = tree(leaf.clone());
        let mut leaf2 = leaf;
        leaf2[40] = file("f040", 200);
        let (new_leaf, new_leaf_b) = tree(leaf2);
        // Four entries: a delta of one (about 110 bytes) is over half of
        // it, under it less 2.
        let mid = |leaf: Hash| vec![dir("leaf", leaf), file("x", 1), file("y", 2), file("z", 3)];
        let (old_mid, old_mid_b) = tree(mid(old_leaf));
        let (new_mid, new_mid_b) = tree(mid(new_leaf));
        let tops = |mid: Hash| -> Vec<Entry> {
            (0..300).map(|i| dir(&format!("d{i:03}"), if i == 7 { mid } else { Hash([i as u8; 32]) })).collect()
        };
        let (old_root, old_root_b) = tree(tops(old_mid));
        let (new_root, new_root_b) = tree(tops(new_mid));
        let bottom =
            layer(old_root, vec![(old_root, old_root_b), (old_mid, old_mid_b), (old_leaf, old_leaf_b)], vec![]);
        let top = layer(
            new_root,
            vec![(new_root, new_root_b.clone()), (new_mid, new_mid_b), (new_leaf, new_leaf_b)],
            vec![old_root],
        );
        (bottom, top, new_root_b)
    }

    #[test]
    fn a_layer_writes_its_big_directories_as_deltas_and_a_reader_rebuilds_them() {
        let (bottom, top, _) = big_change();
        let below = |id: &Hash| bottom.trees.iter().find(|t| t.0 == *id).map(|t| Cow::Borrowed(&t.1[..]));
        let deltas = choose(&top, &below);
        // The root (300 entries) and the leaf (100) pay; the four-entry
        // directory between them does not.
        let mut ids: Vec<Hash> = deltas.iter().map(|d| d.id).collect();
        ids.sort();
        let mut want = vec![top.trees[0].0, top.trees[2].0];
        want.sort();
        assert_eq!(ids, want);
        let whole = top.encode();
        let enc = encode_with(&top, deltas);
        assert!(enc.len() * 4 < whole.len(), "{} bytes as deltas, {} whole", enc.len(), whole.len());
        let stored = PackIndex::decode(&enc).unwrap();
        assert_eq!((stored.trees.len(), stored.deltas.len()), (1, 2));
        // Merged over the layer below: the view as if written whole.
        let view = stored.clone().merge(vec![bottom.clone()]).unwrap();
        let want = top.clone().merge(vec![bottom.clone()]).unwrap();
        let sorted = |mut v: Vec<(Hash, Vec<u8>)>| {
            v.sort();
            v
        };
        assert_eq!(sorted(view.trees.clone()), sorted(want.trees.clone()));
        assert!(view.deltas.is_empty());
        // Without the layer below at hand: an error naming the tree.
        let mut alone = stored.clone();
        let err = alone.resolve_deltas(&|_: &Hash| None::<Cow<'_, [u8]>>).unwrap_err();
        assert!(err.contains("no layer below it holds"), "{err}");
        // A flat layer is never made with deltas left in it.
        assert!(crate::pack::flat::encode_to(&stored, &mut Vec::new()).is_err());
        // A layer with nothing to rebuild from (a whole index) writes none.
        assert!(choose(&bottom, &below).is_empty());
    }

    #[test]
    fn a_chain_of_delta_layers_resolves_from_the_bottom_up() {
        let (bottom, top, root1) = big_change();
        let below = |id: &Hash| bottom.trees.iter().find(|t| t.0 == *id).map(|t| Cow::Borrowed(&t.1[..]));
        let l1 = PackIndex::decode(&encode_with(&top, choose(&top, &below))).unwrap();
        // A second change over the first layer: its root a delta over
        // layer 1's root, itself a delta over the bottom's.
        let mut root2 = Tree::decode(&root1).unwrap().entries;
        root2[100] = dir("d100", Hash([77; 32]));
        let (r2, r2b) = tree(root2);
        let l2 = layer(r2, vec![(r2, r2b.clone())], vec![top.tree, bottom.tree]);
        let all = top.clone().merge(vec![bottom.clone()]).unwrap();
        let below2 = |id: &Hash| all.trees.iter().find(|t| t.0 == *id).map(|t| Cow::Borrowed(&t.1[..]));
        let d2 = choose(&l2, &below2);
        assert_eq!(d2.len(), 1);
        assert_eq!(d2[0].base, top.tree);
        let l2s = PackIndex::decode(&encode_with(&l2, d2)).unwrap();
        let mut chain = vec![l2s.clone(), l1.clone(), bottom.clone()];
        resolve_chain(&mut chain).unwrap();
        assert!(chain.iter().all(|l| l.deltas.is_empty()));
        assert_eq!(chain[0].trees, vec![(r2, r2b)]);
        // Merge does the same, and a chain missing layer 1 fails.
        let view = l2s.clone().merge(vec![l1, bottom.clone()]).unwrap();
        assert!(view.trees.iter().any(|t| t.0 == r2));
        let mut short = vec![l2s, bottom];
        assert!(resolve_chain(&mut short).is_err());
    }

    #[test]
    fn a_version_3_index_without_deltas_is_refused() {
        let (_, top, _) = big_change();
        let mut enc = top.encode();
        assert_eq!(enc[4], 2);
        // Claim version 3 over a body with no delta section.
        enc[4] = 3;
        assert!(PackIndex::decode(&enc).is_err());
    }
}
