//! The stat object (`MADF`, docs/FORMAT.md): a snapshot's file times by
//! path, kept outside trees so that two workspaces with the same content
//! share every tree.
//!
//! A checkpoint writes a *layer*: the entries that changed since its
//! parent's stat object and the paths that went, naming the layers below
//! it (its parent's chain); a reader merges the chain into the whole
//! object. Chains are compacted (written whole) past
//! [`MAX_STAT_LAYERS`], or when a layer would be as large as the whole.

use std::collections::BTreeMap;

use crate::codec::{put_bytes, put_varint, DecodeError, Reader};
use crate::hash::Hash;

const STAT_MAGIC: &[u8; 4] = b"MADF";
/// 1: whole; 2: a layer (base list, removed paths, changed entries).
const STAT_LAYERED: u8 = 2;
/// 3: a version 1 or 2 object, zstd-compressed (paths and times of a real
/// tree shrink ~7×: a 15,000-file tree's 1.1 MB to 150 KB).
const STAT_ZSTD: u8 = 3;
/// Objects smaller than this are stored as they are.
const STAT_COMPRESS_FROM: usize = 4096;
/// The most a compressed object may say it holds: far above any real
/// tree's (~60 bytes a path), and a bound on what a hostile one costs.
const STAT_MAX_PLAIN: u64 = 256 << 20;
/// The most layers a reader merges (one round trip fetches them all).
pub const MAX_STAT_LAYERS: usize = 8;

/// Per-snapshot file times: (path, seconds, nanoseconds), sorted by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatObject {
    pub entries: Vec<(Vec<u8>, i64, u32)>,
    /// Empty for a whole object. For a layer: the stat objects below it,
    /// nearest first, down to a whole one.
    pub base: Vec<Hash>,
    /// For a layer: paths the layers below list that are gone.
    pub removed: Vec<Vec<u8>>,
}

fn check_path(p: &[u8]) -> Result<(), DecodeError> {
    if p.split(|c| *c == b'/').any(|seg| seg == b".." || seg == b".") || p.starts_with(b"/") || p.contains(&0) {
        return Err(DecodeError::Invalid(format!("bad path {:?}", String::from_utf8_lossy(p))));
    }
    Ok(())
}

impl StatObject {
    /// A whole stat object of `entries` (sorted by path).
    pub fn whole(entries: Vec<(Vec<u8>, i64, u32)>) -> StatObject {
        StatObject { entries, ..Default::default() }
    }

    /// The stored form: [`StatObject::encode_plain`], compressed (version
    /// 3) when that is at least [`STAT_COMPRESS_FROM`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let plain = self.encode_plain();
        if plain.len() < STAT_COMPRESS_FROM {
            return plain;
        }
        let mut out = Vec::with_capacity(plain.len() / 4);
        out.extend_from_slice(STAT_MAGIC);
        out.push(STAT_ZSTD);
        put_varint(&mut out, plain.len() as u64);
        out.extend(zstd::bulk::compress(&plain, 3).expect("zstd compresses in memory"));
        out
    }

    /// Version 1 (whole) or 2 (a layer), uncompressed.
    pub fn encode_plain(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.entries.len() * 24);
        out.extend_from_slice(STAT_MAGIC);
        if self.base.is_empty() {
            out.push(1);
        } else {
            out.push(STAT_LAYERED);
            put_varint(&mut out, self.base.len() as u64);
            for b in &self.base {
                out.extend_from_slice(b.as_bytes());
            }
            put_varint(&mut out, self.removed.len() as u64);
            for p in &self.removed {
                put_bytes(&mut out, p);
            }
        }
        put_varint(&mut out, self.entries.len() as u64);
        for (p, s, n) in &self.entries {
            put_bytes(&mut out, p);
            out.extend_from_slice(&s.to_le_bytes());
            put_varint(&mut out, *n as u64);
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<StatObject, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(STAT_MAGIC)?;
        let version = r.u8()?;
        if version == STAT_ZSTD {
            let len = r.varint()?;
            if len > STAT_MAX_PLAIN {
                return Err(DecodeError::Invalid(format!("compressed stat object says it holds {len} bytes")));
            }
            let plain = zstd::bulk::decompress(&buf[r.pos()..], len as usize)
                .map_err(|e| DecodeError::Invalid(format!("compressed stat object: {e}")))?;
            if plain.len() as u64 != len {
                return Err(DecodeError::Invalid(format!(
                    "compressed stat object holds {} bytes, says {len}",
                    plain.len()
                )));
            }
            // Once: a compressed object holds a plain one.
            if plain.get(4) == Some(&STAT_ZSTD) {
                return Err(DecodeError::Invalid("compressed stat object holds another".into()));
            }
            return StatObject::decode(&plain);
        }
        if version != 1 && version != STAT_LAYERED {
            return Err(DecodeError::Version { format: "stat object", version, supported: STAT_ZSTD });
        }
        let (mut base, mut removed) = (Vec::new(), Vec::new());
        if version == STAT_LAYERED {
            let n = r.count(32)?;
            if n == 0 || n > MAX_STAT_LAYERS * 4 {
                return Err(DecodeError::Invalid(format!("stat layer names {n} layers below it")));
            }
            for _ in 0..n {
                let b = r.hash()?;
                if base.contains(&b) {
                    return Err(DecodeError::Invalid(format!("stat layer chain repeats {}", b.short())));
                }
                base.push(b);
            }
            let n = r.count(1)?;
            for _ in 0..n {
                let p = r.bytes()?.to_vec();
                check_path(&p)?;
                removed.push(p);
            }
        }
        let n = r.count(10)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let p = r.bytes()?.to_vec();
            check_path(&p)?;
            // Sorted, each path once, as every writer writes them (readers
            // search them).
            if entries.last().is_some_and(|(q, _, _): &(Vec<u8>, i64, u32)| *q >= p) {
                return Err(DecodeError::Invalid("stat entries out of order".into()));
            }
            let s = r.i64_le()?;
            let nanos = r.varint()?;
            if nanos >= 1_000_000_000 {
                return Err(DecodeError::Invalid("nanoseconds out of range".into()));
            }
            entries.push((p, s, nanos as u32));
        }
        r.finish()?;
        Ok(StatObject { entries, base, removed })
    }

    /// The whole object of the chain `self` (a layer) over `lower` (the
    /// objects `self.base` names, in that order): `Err` says why not when a
    /// layer is not the one named (checked by id) or names another chain.
    pub fn merge(self, lower: Vec<(Hash, StatObject)>) -> Result<StatObject, String> {
        if lower.len() != self.base.len() {
            return Err(format!("{} stat layers below, {} named", lower.len(), self.base.len()));
        }
        let mut map: BTreeMap<Vec<u8>, (i64, u32)> = BTreeMap::new();
        for (i, (id, l)) in lower.iter().enumerate().rev() {
            if *id != self.base[i] || l.base[..] != self.base[i + 1..] {
                return Err(format!("stat layer {} is not the one named", id.short()));
            }
            apply(&mut map, l);
        }
        apply(&mut map, &self);
        Ok(StatObject::whole(map.into_iter().map(|(p, (s, n))| (p, s, n)).collect()))
    }

    /// The object to upload for the whole object `self`, whose parent's
    /// whole object is `parent` with layer chain `parent_chain` (its own id
    /// first): a layer of what changed, or `self` whole when the chain is
    /// at [`MAX_STAT_LAYERS`] or the layer would not be smaller by half.
    pub fn layer_over(&self, parent: &StatObject, parent_chain: &[Hash]) -> StatObject {
        // Both lists are sorted by path: one pass over the two.
        let (mut entries, mut removed) = (Vec::new(), Vec::new());
        let (mut a, mut b) = (self.entries.iter().peekable(), parent.entries.iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.0 == y.0 => {
                    if (x.1, x.2) != (y.1, y.2) {
                        entries.push((*x).clone());
                    }
                    a.next();
                    b.next();
                }
                (Some(x), Some(y)) if x.0 < y.0 => {
                    entries.push((*x).clone());
                    a.next();
                }
                (Some(_), Some(y)) => {
                    removed.push(y.0.clone());
                    b.next();
                }
                (Some(x), None) => {
                    entries.push((*x).clone());
                    a.next();
                }
                (None, Some(y)) => {
                    removed.push(y.0.clone());
                    b.next();
                }
                (None, None) => break,
            }
        }
        let whole = parent_chain.is_empty()
            || parent_chain.len() >= MAX_STAT_LAYERS
            || (entries.len() + removed.len()) * 2 > self.entries.len().max(1);
        if whole {
            return StatObject::whole(self.entries.clone());
        }
        StatObject { entries, base: parent_chain.to_vec(), removed }
    }
}

impl StatObject {
    /// The object to upload for the whole object `self` over its parent's
    /// chain `parts` (each layer as stored with its id, the parent's top
    /// first, the whole bottom last; `parent` is their merge): a layer
    /// placed where [`crate::object::compaction_point`] says, absorbing the
    /// small layers above that point, or `self` whole. `Err` when the
    /// layers do not form the chain they name.
    pub fn layer_over_chain(&self, parent: &StatObject, parts: &[(Hash, StatObject)]) -> Result<StatObject, String> {
        if parts.is_empty() {
            return Ok(StatObject::whole(self.entries.clone()));
        }
        let chain: Vec<Hash> = parts.iter().map(|(id, _)| *id).collect();
        for (i, (id, l)) in parts.iter().enumerate() {
            if l.base[..] != chain[i + 1..] {
                return Err(format!("stat layer {} is not the one named", id.short()));
            }
        }
        let over_parent = self.layer_over(parent, &chain);
        if over_parent.base.is_empty() {
            return Ok(over_parent);
        }
        let sizes: Vec<usize> = parts.iter().map(|(_, l)| l.entries.len() + l.removed.len()).collect();
        let delta = over_parent.entries.len() + over_parent.removed.len();
        let k = super::compaction_point(&sizes, delta, MAX_STAT_LAYERS);
        if k == 0 {
            return Ok(over_parent);
        }
        // The object at position k differs from the parent's only at the
        // paths the layers above it touched: those are looked up again in
        // the layers from k down (the first that mentions a path decides).
        let below = &parts[k..];
        let at_k = |p: &[u8]| -> Option<(i64, u32)> {
            for (_, l) in below {
                if let Ok(i) = l.entries.binary_search_by(|e| e.0[..].cmp(p)) {
                    return Some((l.entries[i].1, l.entries[i].2));
                }
                if l.removed.iter().any(|r| r[..] == *p) {
                    return None;
                }
            }
            None
        };
        let touched: std::collections::BTreeSet<&[u8]> = parts[..k]
            .iter()
            .flat_map(|(_, l)| l.entries.iter().map(|e| &e.0[..]).chain(l.removed.iter().map(|r| &r[..])))
            .collect();
        let mut view: Vec<(Vec<u8>, i64, u32)> =
            parent.entries.iter().filter(|e| !touched.contains(&e.0[..])).cloned().collect();
        view.extend(touched.iter().filter_map(|p| at_k(p).map(|(s, n)| (p.to_vec(), s, n))));
        view.sort_unstable();
        Ok(self.layer_over(&StatObject::whole(view), &chain[k..]))
    }
}

/// A path's (seconds, nanoseconds) in some stat object, if it has the path.
pub type TimeOf<'a> = dyn Fn(&[u8]) -> Option<(i64, u32)> + 'a;

/// A change to a parent's stat object: paths set (new or with a new
/// time) and paths gone, both sorted, and the whole object's length after.
pub struct StatDelta<'a> {
    pub set: &'a [(Vec<u8>, i64, u32)],
    pub removed: &'a [Vec<u8>],
    pub len: usize,
}

impl StatObject {
    /// [`StatObject::layer_over_chain`] for a snapshot whose stat object is
    /// its parent's with `change` applied, without the parent's whole
    /// object: `chain` is the parent's chain (its id first, the whole
    /// bottom last), `above` the decoded layers of all of it but the
    /// bottom, and `before` looks a path up in the parent's whole object.
    /// `None`: the new object is to be written whole (the caller makes it).
    /// The cost follows the change and the layers above the bottom.
    ///
    /// A layer placed at k holds every path the new change or the absorbed
    /// layers (those above k) touched, with its time now, or as removed.
    /// A path removed there that the object at k lacks too is harmless: a
    /// removal takes out what is there.
    pub fn layer_of_change(
        change: &StatDelta<'_>,
        chain: &[Hash],
        above: &[StatObject],
        before: &TimeOf<'_>,
    ) -> Result<Option<StatObject>, String> {
        if chain.is_empty() {
            return Ok(None);
        }
        if above.len() + 1 != chain.len() {
            return Err(format!("{} stat layers above the bottom of a chain of {}", above.len(), chain.len()));
        }
        for (i, l) in above.iter().enumerate() {
            if l.base[..] != chain[i + 1..] {
                return Err(format!("stat layer {} is not the one named", chain[i].short()));
            }
        }
        let mut sizes: Vec<usize> = above.iter().map(|l| l.entries.len() + l.removed.len()).collect();
        // The bottom's size: never read (a layer goes at most over it).
        sizes.push(usize::MAX);
        let k = super::compaction_point(&sizes, change.set.len() + change.removed.len(), MAX_STAT_LAYERS);
        let now = |p: &[u8]| -> Option<(i64, u32)> {
            if let Ok(i) = change.set.binary_search_by(|e| e.0[..].cmp(p)) {
                return Some((change.set[i].1, change.set[i].2));
            }
            if change.removed.binary_search_by(|r| r[..].cmp(p)).is_ok() {
                return None;
            }
            before(p)
        };
        let touched: std::collections::BTreeSet<&[u8]> = above[..k]
            .iter()
            .flat_map(|l| l.entries.iter().map(|e| &e.0[..]).chain(l.removed.iter().map(|r| &r[..])))
            .chain(change.set.iter().map(|e| &e.0[..]))
            .chain(change.removed.iter().map(|r| &r[..]))
            .collect();
        let (mut entries, mut removed) = (Vec::new(), Vec::new());
        for p in touched {
            match now(p) {
                Some((s, n)) => entries.push((p.to_vec(), s, n)),
                None => removed.push(p.to_vec()),
            }
        }
        if chain.len() - k >= MAX_STAT_LAYERS || (entries.len() + removed.len()) * 2 > change.len.max(1) {
            return Ok(None);
        }
        Ok(Some(StatObject { entries, base: chain[k..].to_vec(), removed }))
    }
}

fn apply(map: &mut BTreeMap<Vec<u8>, (i64, u32)>, layer: &StatObject) {
    for p in &layer.removed {
        map.remove(p);
    }
    for (p, s, n) in &layer.entries {
        map.insert(p.clone(), (*s, *n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Lease;

    #[test]
    fn stat_object_golden_and_hostile() {
        let s = StatObject::whole(vec![(b"".to_vec(), 5, 0), (b"a/b".to_vec(), 1_700_000_000, 123)]);
        let enc = s.encode();
        let hex: String = enc.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "4d41444601020005000000000000000003612f6200f15365000000007b");
        assert_eq!(StatObject::decode(&enc).unwrap(), s);
        for bad in [&b"../x"[..], b"/etc", b"a/../b", b"a\0"] {
            let t = StatObject::whole(vec![(bad.to_vec(), 0, 0)]);
            assert!(StatObject::decode(&t.encode()).is_err(), "{bad:?}");
        }
        for cut in 0..enc.len() {
            assert!(StatObject::decode(&enc[..cut]).is_err());
        }
        let l = Lease { holder: "me".into(), expires: 9 };
        assert_eq!(Lease::decode(&l.encode()).unwrap(), l);
    }

    /// A stat object of a real tree's size is stored compressed (version
    /// 3), reads back the same, and a hostile compressed one is an error.
    #[test]
    fn a_large_stat_object_is_compressed_and_checked() {
        let mut entries: Vec<_> = (0..2000u32)
            .map(|i| (format!("vendor/crate-{}/src/module_{i}.rs", i / 40).into_bytes(), 1_790_000_000 + i as i64, i))
            .collect();
        entries.sort();
        let s = StatObject::whole(entries);
        let plain = s.encode_plain();
        let enc = s.encode();
        assert_eq!(&enc[..5], b"MADF\x03");
        assert!(enc.len() * 4 < plain.len(), "{} bytes from {}", enc.len(), plain.len());
        assert_eq!(StatObject::decode(&enc).unwrap(), s);
        // Small ones stay plain (and are read as before): up to 4,095
        // bytes; from 4,096, compressed.
        let small = StatObject::whole(vec![(b"a".to_vec(), 1, 0)]);
        assert_eq!(small.encode(), small.encode_plain());
        let of_len = |n: usize| StatObject::whole(vec![(vec![b'a'; n - 17], 1, 0)]);
        assert_eq!(of_len(4095).encode_plain().len(), 4095);
        assert_eq!(of_len(4095).encode(), of_len(4095).encode_plain());
        assert_eq!(of_len(4096).encode_plain().len(), 4096);
        assert_eq!(&of_len(4096).encode()[..5], b"MADF\x03");
        // A layer too.
        let layer = StatObject { base: vec![Hash::of(b"x")], ..s.clone() };
        assert_eq!(StatObject::decode(&layer.encode()).unwrap(), layer);
        let wrap = |declared: u64, body: &[u8]| {
            let mut out = b"MADF\x03".to_vec();
            put_varint(&mut out, declared);
            out.extend_from_slice(body);
            out
        };
        let z = zstd::bulk::compress(&plain, 3).unwrap();
        assert_eq!(StatObject::decode(&wrap(plain.len() as u64, &z)).unwrap(), s);
        for bad in [
            wrap(plain.len() as u64 - 1, &z),
            wrap(plain.len() as u64 + 1, &z),
            wrap(plain.len() as u64, &z[..z.len() / 2]),
            wrap(plain.len() as u64, b"not zstd at all"),
            wrap(STAT_MAX_PLAIN + 1, &z),
            wrap(enc.len() as u64, &zstd::bulk::compress(&enc, 3).unwrap()),
        ] {
            assert!(StatObject::decode(&bad).is_err());
        }
        for cut in 0..enc.len() {
            assert!(StatObject::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
        // The bound on the declared size is checked before anything is
        // allocated: past it, refused for that; at it, read (and refused
        // for what it holds).
        let err = |b: Vec<u8>| StatObject::decode(&b).unwrap_err().to_string();
        assert!(err(wrap(STAT_MAX_PLAIN + 1, &z)).contains("says it holds"));
        let at = err(wrap(STAT_MAX_PLAIN, &z));
        assert!(!at.contains("says it holds") && at.contains("holds"), "{at}");
    }

    /// Entries sorted, each path once; a layer names 1 to 32 layers below.
    #[test]
    fn stat_entries_are_unique_and_layers_bounded() {
        let whole = |e: &[&[u8]]| StatObject::whole(e.iter().map(|p| (p.to_vec(), 1, 0)).collect());
        assert!(StatObject::decode(&whole(&[b"a", b"b"]).encode_plain()).is_ok());
        assert!(StatObject::decode(&whole(&[b"b", b"a"]).encode_plain()).is_err());
        assert!(StatObject::decode(&whole(&[b"a", b"a"]).encode_plain()).is_err(), "a path twice");
        let layer =
            |n: usize| StatObject { base: (0..n).map(|i| Hash::of(&i.to_le_bytes())).collect(), ..whole(&[b"a"]) };
        assert!(StatObject::decode(&layer(1).encode_plain()).is_ok());
        assert!(StatObject::decode(&layer(MAX_STAT_LAYERS * 4).encode_plain()).is_ok());
        assert!(StatObject::decode(&layer(MAX_STAT_LAYERS * 4 + 1).encode_plain()).is_err());
        // A layer that names none below it (the encoder never writes one).
        let mut none = b"MADF\x02".to_vec();
        put_varint(&mut none, 0);
        put_varint(&mut none, 0);
        put_varint(&mut none, 0);
        assert!(StatObject::decode(&none).is_err());
    }

    /// 300 checkpoints of random edits, adds and removals, each placed by
    /// the compaction rule: every layer merged with the chain it names is
    /// the whole object it stands for, the chain never passes the bound,
    /// and the uploads stay near the changes made.
    #[test]
    fn layers_placed_by_the_compaction_rule_merge_back_to_the_whole() {
        let rnd = crate::chunk::tests::pseudo_random(300 * 16 * 3, 7);
        let mut r = rnd.iter().copied();
        let path = |i: u8| format!("d{}/f{}", i % 13, i).into_bytes();
        let mut whole: BTreeMap<Vec<u8>, (i64, u32)> = (0..200u8).map(|i| (path(i), (i as i64, 0))).collect();
        let flat = |m: &BTreeMap<Vec<u8>, (i64, u32)>| {
            StatObject::whole(m.iter().map(|(p, (s, n))| (p.clone(), *s, *n)).collect())
        };
        // The store: id -> object as uploaded.
        let mut store: std::collections::HashMap<Hash, StatObject> = std::collections::HashMap::new();
        let first = flat(&whole);
        let mut top = Hash::of(&first.encode());
        store.insert(top, first);
        let (mut changed, mut uploaded) = (0usize, 0usize);
        for round in 0..300i64 {
            for _ in 0..(r.next().unwrap() % 16 + 1) {
                let (op, i) = (r.next().unwrap(), r.next().unwrap());
                match op % 5 {
                    0 => whole.remove(&path(i)),
                    _ => whole.insert(path(i), (1_000 + round, op as u32)),
                };
                changed += 1;
            }
            let now = flat(&whole);
            // The parent's chain as a reader has it, and its merge.
            let parent = &store[&top];
            let chain: Vec<Hash> = std::iter::once(top).chain(parent.base.iter().copied()).collect();
            let parts: Vec<(Hash, StatObject)> = chain.iter().map(|h| (*h, store[h].clone())).collect();
            let view = parts[0].1.clone().merge(parts[1..].to_vec()).unwrap();
            let up = now.layer_over_chain(&view, &parts).unwrap();
            assert!(up.base.len() < MAX_STAT_LAYERS, "round {round}: a chain of {}", up.base.len() + 1);
            uploaded += up.entries.len() + up.removed.len();
            let below: Vec<(Hash, StatObject)> = up.base.iter().map(|h| (*h, store[h].clone())).collect();
            assert_eq!(up.clone().merge(below.clone()).unwrap(), now, "round {round}");
            // And it holds only what differs from the object it goes over.
            if let Some(((_, first), rest)) = below.split_first() {
                let under = first.clone().merge(rest.to_vec()).unwrap();
                let under: BTreeMap<&[u8], (i64, u32)> =
                    under.entries.iter().map(|(p, s, n)| (&p[..], (*s, *n))).collect();
                for (p, s, n) in &up.entries {
                    assert_ne!(under.get(&p[..]), Some(&(*s, *n)), "round {round}: an unchanged entry uploaded");
                }
                for p in &up.removed {
                    assert!(under.contains_key(&p[..]), "round {round}: a removal of nothing");
                }
            }
            top = Hash::of(&up.encode());
            store.insert(top, up);
        }
        assert!(uploaded < changed * 8, "{uploaded} entries uploaded for {changed} changes");
    }

    /// The same as a mount makes them, from the change alone: 300
    /// checkpoints of random changes, each layer made from the change, the
    /// layers above the bottom and lookups in the parent's object; merged
    /// with the chain it names, every layer is the object it stands for,
    /// and the chain and the uploads stay as bounded.
    #[test]
    fn layers_made_from_a_change_alone_merge_back_to_the_whole() {
        let rnd = crate::chunk::tests::pseudo_random(300 * 16 * 3, 11);
        let mut r = rnd.iter().copied();
        let path = |i: u8| format!("d{}/f{}", i % 13, i).into_bytes();
        let mut whole: BTreeMap<Vec<u8>, (i64, u32)> = (0..200u8).map(|i| (path(i), (i as i64, 0))).collect();
        let flat = |m: &BTreeMap<Vec<u8>, (i64, u32)>| {
            StatObject::whole(m.iter().map(|(p, (s, n))| (p.clone(), *s, *n)).collect())
        };
        let mut store: std::collections::HashMap<Hash, StatObject> = std::collections::HashMap::new();
        let first = flat(&whole);
        let mut top = Hash::of(&first.encode());
        store.insert(top, first);
        let (mut changed, mut uploaded, mut wholes) = (0usize, 0usize, 0usize);
        for round in 0..300i64 {
            let before = whole.clone();
            for _ in 0..(r.next().unwrap() % 16 + 1) {
                let (op, i) = (r.next().unwrap(), r.next().unwrap());
                match op % 5 {
                    0 => whole.remove(&path(i)),
                    _ => whole.insert(path(i), (1_000 + round, op as u32)),
                };
                changed += 1;
            }
            let set: Vec<(Vec<u8>, i64, u32)> = whole
                .iter()
                .filter(|(p, t)| before.get(*p) != Some(t))
                .map(|(p, (s, n))| (p.clone(), *s, *n))
                .collect();
            let removed: Vec<Vec<u8>> = before.keys().filter(|p| !whole.contains_key(*p)).cloned().collect();
            let change = StatDelta { set: &set, removed: &removed, len: whole.len() };
            let chain: Vec<Hash> = std::iter::once(top).chain(store[&top].base.iter().copied()).collect();
            let above: Vec<StatObject> = chain[..chain.len() - 1].iter().map(|h| store[h].clone()).collect();
            let lookup = |p: &[u8]| before.get(p).copied();
            let up =
                StatObject::layer_of_change(&change, &chain, &above, &lookup).unwrap().unwrap_or_else(|| flat(&whole));
            assert!(up.base.len() < MAX_STAT_LAYERS, "round {round}: a chain of {}", up.base.len() + 1);
            wholes += up.base.is_empty() as usize;
            uploaded += up.entries.len() + up.removed.len();
            let below: Vec<(Hash, StatObject)> = up.base.iter().map(|h| (*h, store[h].clone())).collect();
            assert_eq!(up.clone().merge(below).unwrap(), flat(&whole), "round {round}");
            top = Hash::of(&up.encode());
            store.insert(top, up);
        }
        assert!(uploaded < changed * 8, "{uploaded} entries uploaded for {changed} changes");
        // A 200-path object changed ~8 paths a round: written whole about
        // each time the changes since the last reach half of it.
        assert!(wholes < 30, "{wholes} whole objects in 300 rounds");
        // A chain whose layers do not name what is below them is refused.
        let bottom = StatObject::whole(vec![(b"a".to_vec(), 1, 0)]);
        let stray = StatObject { entries: vec![], base: vec![Hash([9; 32])], removed: vec![b"a".to_vec()] };
        let change = StatDelta { set: &[], removed: &[], len: 1 };
        let chain = [Hash([1; 32]), Hash::of(&bottom.encode())];
        let none = |_: &[u8]| None;
        assert!(StatObject::layer_of_change(&change, &chain, &[stray], &none).is_err());
        assert!(StatObject::layer_of_change(&change, &chain, &[], &none).is_err());
    }

    #[test]
    fn stat_layers_hold_the_change_and_merge_back_whole() {
        let e = |p: &str, s: i64| (p.as_bytes().to_vec(), s, 0u32);
        let parent = StatObject::whole((0..100).map(|i| e(&format!("f{i:03}"), i)).collect());
        let pid = Hash::of(&parent.encode());
        let mut child = parent.clone();
        child.entries[5].1 = 999; // touched
        child.entries.remove(7); // deleted
        child.entries.push(e("g", 1)); // added
        child.entries.sort();
        let layer = child.layer_over(&parent, &[pid]);
        assert_eq!(layer.base, vec![pid]);
        assert_eq!(layer.entries, vec![e("f005", 999), e("g", 1)]);
        assert_eq!(layer.removed, vec![b"f007".to_vec()]);
        let enc = layer.encode();
        assert_eq!(enc[4], STAT_LAYERED);
        assert!(enc.len() < parent.encode().len() / 10, "{} bytes", enc.len());
        let back = StatObject::decode(&enc).unwrap();
        assert_eq!(back, layer);
        assert_eq!(back.clone().merge(vec![(pid, parent.clone())]).unwrap(), child);
        // The wrong layer below, or a missing one, is refused.
        let other = StatObject::whole(vec![e("x", 1)]);
        assert!(back.clone().merge(vec![(Hash::of(&other.encode()), other)]).is_err());
        assert!(back.clone().merge(vec![]).is_err());
        for cut in 0..enc.len() {
            assert!(StatObject::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
        // Compaction: at the bound, with no parent, or when most changed.
        let long: Vec<Hash> = (0..MAX_STAT_LAYERS as u8).map(|i| Hash([i; 32])).collect();
        assert!(child.layer_over(&parent, &long).base.is_empty());
        assert!(child.layer_over(&parent, &[]).base.is_empty());
        let mut most = parent.clone();
        for x in most.entries.iter_mut().take(60) {
            x.1 += 1;
        }
        assert!(most.layer_over(&parent, &[pid]).base.is_empty());
        // Version 1 bytes are unchanged for a whole object.
        assert_eq!(parent.encode()[4], 1);
    }
}
