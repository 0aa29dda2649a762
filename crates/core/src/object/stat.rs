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

    pub fn encode(&self) -> Vec<u8> {
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
        if version != 1 && version != STAT_LAYERED {
            return Err(DecodeError::Version { format: "stat object", version, supported: STAT_LAYERED });
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
        let old: BTreeMap<&[u8], (i64, u32)> = parent.entries.iter().map(|(p, s, n)| (&p[..], (*s, *n))).collect();
        let new: std::collections::HashSet<&[u8]> = self.entries.iter().map(|e| &e.0[..]).collect();
        let entries: Vec<_> =
            self.entries.iter().filter(|(p, s, n)| old.get(&p[..]) != Some(&(*s, *n))).cloned().collect();
        let removed: Vec<Vec<u8>> =
            parent.entries.iter().filter(|e| !new.contains(&e.0[..])).map(|e| e.0.clone()).collect();
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
    /// first, the whole bottom last): a layer placed where
    /// [`crate::object::compaction_point`] says, absorbing the small layers
    /// above that point, or `self` whole. `Err` when the layers do not
    /// form the chain they name.
    pub fn layer_over_chain(&self, parts: &[(Hash, StatObject)]) -> Result<StatObject, String> {
        if parts.is_empty() {
            return Ok(StatObject::whole(self.entries.clone()));
        }
        let view = |k: usize| parts[k].1.clone().merge(parts[k + 1..].to_vec());
        let chain: Vec<Hash> = parts.iter().map(|(id, _)| *id).collect();
        let over_parent = self.layer_over(&view(0)?, &chain);
        if over_parent.base.is_empty() {
            return Ok(over_parent);
        }
        let sizes: Vec<usize> = parts.iter().map(|(_, l)| l.entries.len() + l.removed.len()).collect();
        let delta = over_parent.entries.len() + over_parent.removed.len();
        match super::compaction_point(&sizes, delta, MAX_STAT_LAYERS) {
            0 => Ok(over_parent),
            k => Ok(self.layer_over(&view(k)?, &chain[k..])),
        }
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
