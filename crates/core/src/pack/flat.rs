//! The flat form of one pack index layer (`MADX`), kept in the disk cache
//! beside the index it was made from: fixed-width tables sorted by id,
//! read in place through a memory map. A process attaching the index of a
//! million-file tree decodes nothing and keeps none of it in its own
//! memory: a lookup touches a few pages, and those pages live in the page
//! cache, shared by every process on the machine that maps the same file
//! (every mount of one snapshot, or of its checkpoints, which share the
//! layers below).
//!
//! The file is made by mado from an index that decoded and validated, and
//! never written in place (a rename puts it there whole). Still, it is
//! read as untrusted: every table's extent is checked against the file's
//! length when it is opened, a pack's member ranges are checked as the
//! index decoder checks them before a reader sees them, and an inline
//! object must hash to its id. A damaged file can then only make a read
//! miss the index (and go object by object), never return wrong bytes.
//! FORMAT.md, "Flat pack index", has the layout.

use super::{check_members, Codec, Member, MemberKind, Mode, PackEntry, PackIndex};
use crate::fsutil::CacheBuf;
use crate::hash::Hash;
use std::path::Path;

const MAGIC: &[u8; 4] = b"MADX";
const VERSION: u8 = 1;
/// Magic, version, padding (8); tree (32); mode and padding (8); dirs;
/// counts of packs, members, inline objects and layers below; the inline
/// bytes' length; how many inline objects are chunk manifests and how
/// many members are whole small files (8 × 8).
const HEAD: usize = 8 + 32 + 8 + 8 * 8;
const FANOUT: usize = 256 * 4;
const PACK_ROW: usize = 64;
const MEMBER_ROW: usize = 64;
const INLINE_ROW: usize = 48;

/// One index layer, flat (see the module's comment).
pub struct FlatIndex {
    buf: CacheBuf,
    tree: Hash,
    mode: Mode,
    dirs: u64,
    packs: usize,
    members: usize,
    inline: usize,
    base: Vec<Hash>,
    manifests: u64,
    small_files: u64,
    at_packs: usize,
    at_members: usize,
    at_order: usize,
    at_inline: usize,
    at_blob: usize,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn hash_at(b: &[u8], at: usize) -> Hash {
    Hash(b[at..at + 32].try_into().expect("32 bytes"))
}

/// Encodes `idx` (one layer, as stored: not a merged view) flat. Its
/// delta trees must have been rebuilt ([`super::delta::resolve_chain`]):
/// a flat layer holds its trees whole, and `encode` panics otherwise.
pub fn encode(idx: &PackIndex) -> Vec<u8> {
    let mut out = Vec::new();
    encode_to(idx, &mut out).expect("writing to memory");
    out
}

/// [`encode`], written to `out` as it goes (an index of a million members
/// is over 100 MB flat: a writer of it need not hold it).
pub fn encode_to(idx: &PackIndex, out: &mut (impl std::io::Write + ?Sized)) -> std::io::Result<()> {
    if !idx.deltas.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("index layer {} still holds tree deltas", idx.tree.short()),
        ));
    }
    // Members sorted by (id, pack): a lookup finds the first pack that
    // holds an id, as a merged index does.
    let mut rows: Vec<(Hash, u32, u32, &Member)> = Vec::with_capacity(idx.member_count());
    for (p, pack) in idx.packs.iter().enumerate() {
        for (i, m) in pack.members.iter().enumerate() {
            rows.push((m.id, p as u32, i as u32, m));
        }
    }
    rows.sort_by(|a, b| (a.0.as_bytes(), a.1).cmp(&(b.0.as_bytes(), b.1)));
    let mut first = Vec::with_capacity(idx.packs.len());
    let mut n = 0u64;
    for p in &idx.packs {
        first.push(n);
        n += p.members.len() as u64;
    }
    let mut order = vec![0u32; rows.len()];
    for (row, (_, p, i, _)) in rows.iter().enumerate() {
        order[(first[*p as usize] + *i as u64) as usize] = row as u32;
    }
    let mut inline: Vec<&(Hash, Vec<u8>)> = idx.trees.iter().collect();
    inline.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    inline.dedup_by(|a, b| a.0 == b.0);
    let blob_len: usize = inline.iter().map(|t| t.1.len()).sum();

    out.write_all(MAGIC)?;
    out.write_all(&[VERSION, 0, 0, 0])?;
    out.write_all(idx.tree.as_bytes())?;
    out.write_all(&[idx.mode as u8, 0, 0, 0, 0, 0, 0, 0])?;
    for v in [idx.dirs, idx.packs.len() as u64, rows.len() as u64, inline.len() as u64, idx.base.len() as u64] {
        out.write_all(&v.to_le_bytes())?;
    }
    out.write_all(&(blob_len as u64).to_le_bytes())?;
    let manifests = inline.iter().filter(|t| t.1.starts_with(crate::object::MANIFEST_MAGIC)).count() as u64;
    let small_files = rows.iter().filter(|r| r.3.kind == MemberKind::Blob).count() as u64;
    out.write_all(&manifests.to_le_bytes())?;
    out.write_all(&small_files.to_le_bytes())?;
    put_fanout(out, rows.iter().map(|r| r.0.as_bytes()[0]))?;
    put_fanout(out, inline.iter().map(|t| t.0.as_bytes()[0]))?;
    for b in &idx.base {
        out.write_all(b.as_bytes())?;
    }
    for (p, f) in idx.packs.iter().zip(&first) {
        out.write_all(p.id.as_bytes())?;
        for v in [p.size, p.header_len, *f, p.members.len() as u64] {
            out.write_all(&v.to_le_bytes())?;
        }
    }
    for (id, p, i, m) in &rows {
        out.write_all(id.as_bytes())?;
        out.write_all(&p.to_le_bytes())?;
        out.write_all(&i.to_le_bytes())?;
        out.write_all(&m.offset.to_le_bytes())?;
        // The index decoder refuses members over 64 MiB.
        out.write_all(&(m.stored_len as u32).to_le_bytes())?;
        out.write_all(&(m.raw_len as u32).to_le_bytes())?;
        out.write_all(&[m.kind as u8, m.codec as u8, 0, 0, 0, 0, 0, 0])?;
    }
    for r in &order {
        out.write_all(&r.to_le_bytes())?;
    }
    let mut at = 0u64;
    for (id, t) in &inline {
        out.write_all(id.as_bytes())?;
        out.write_all(&at.to_le_bytes())?;
        out.write_all(&(t.len() as u64).to_le_bytes())?;
        at += t.len() as u64;
    }
    for (_, t) in &inline {
        out.write_all(t)?;
    }
    Ok(())
}

/// 256 cumulative counts: entry `b` is how many keys start with a byte `<= b`.
fn put_fanout(out: &mut (impl std::io::Write + ?Sized), first_bytes: impl Iterator<Item = u8>) -> std::io::Result<()> {
    let mut counts = [0u32; 256];
    for b in first_bytes {
        counts[b as usize] += 1;
    }
    let mut sum = 0u32;
    for c in counts {
        sum += c;
        out.write_all(&sum.to_le_bytes())?;
    }
    Ok(())
}

impl FlatIndex {
    /// Maps the flat index at `path`: `Ok(None)` when there is none, `Err`
    /// with why when the file is not a sound one.
    pub fn open(path: &Path) -> std::io::Result<Option<FlatIndex>> {
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        FlatIndex::parse(CacheBuf::map(&file)?).map(Some).map_err(std::io::Error::other)
    }

    /// A flat index held in memory (a cache that cannot be written).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<FlatIndex, String> {
        FlatIndex::parse(CacheBuf::Owned(bytes))
    }

    fn parse(buf: CacheBuf) -> Result<FlatIndex, String> {
        let b = &buf[..];
        if b.len() < HEAD + 2 * FANOUT || &b[..4] != MAGIC {
            return Err("not a flat pack index".into());
        }
        if b[4] != VERSION {
            return Err(format!("flat pack index version {} (this mado reads {VERSION})", b[4]));
        }
        let tree = hash_at(b, 8);
        let mode = match b[40] {
            1 => Mode::PerDir,
            2 => Mode::Recursive,
            m => return Err(format!("unknown pack mode {m}")),
        };
        let dirs = u64_at(b, 48);
        let [packs, members, inline, layers, blob, manifests, small_files] =
            [56, 64, 72, 80, 88, 96, 104].map(|at| u64_at(b, at));
        if layers > 64 || members > u32::MAX as u64 {
            return Err(format!("flat pack index of {members} members over {layers} layers"));
        }
        let size = |n: u64, row: usize| n.checked_mul(row as u64);
        let parts = [
            Some(32 * layers),
            size(packs, PACK_ROW),
            size(members, MEMBER_ROW),
            size(members, 4),
            size(inline, INLINE_ROW),
            Some(blob),
        ];
        let mut at = (HEAD + 2 * FANOUT) as u64;
        let mut starts = [0usize; 6];
        for (i, p) in parts.iter().enumerate() {
            starts[i] = at as usize;
            at = p.and_then(|p| at.checked_add(p)).ok_or("flat pack index counts overflow")?;
        }
        if at != b.len() as u64 {
            return Err(format!("flat pack index is {} bytes, its counts say {at}", b.len()));
        }
        for (f, n) in [(HEAD, members), (HEAD + FANOUT, inline)] {
            let mut last = 0;
            for k in 0..256 {
                let v = u32_at(b, f + 4 * k);
                if v < last {
                    return Err("flat pack index fanout goes backwards".into());
                }
                last = v;
            }
            if last as u64 != n {
                return Err("flat pack index fanout does not end at its count".into());
            }
        }
        let base = (0..layers as usize).map(|i| hash_at(b, starts[0] + 32 * i)).collect();
        Ok(FlatIndex {
            tree,
            mode,
            dirs,
            packs: packs as usize,
            members: members as usize,
            inline: inline as usize,
            base,
            manifests,
            small_files,
            at_packs: starts[1],
            at_members: starts[2],
            at_order: starts[3],
            at_inline: starts[4],
            at_blob: starts[5],
            buf,
        })
    }

    /// The tree this layer's index covers.
    pub fn tree(&self) -> Hash {
        self.tree
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Directories in the covered tree.
    pub fn dirs(&self) -> u64 {
        self.dirs
    }

    /// The layers below, nearest first (empty for a whole index).
    pub fn base(&self) -> &[Hash] {
        &self.base
    }

    pub fn pack_count(&self) -> usize {
        self.packs
    }

    pub fn member_count(&self) -> usize {
        self.members
    }

    /// Chunked (large) files' manifests this layer carries inline, and the
    /// whole small files among its members: what share of the tree is
    /// large, known without reading a tree.
    pub fn file_shape(&self) -> (u64, u64) {
        (self.manifests, self.small_files)
    }

    /// The range of rows (of `count` rows of `row` bytes at `at`, with the
    /// fanout at `fan`) whose id starts with `id`'s first byte, and where
    /// in it `id` is (the first row `>= id`).
    fn find(&self, fan: usize, at: usize, row: usize, id: &Hash) -> Option<usize> {
        let b = &self.buf[..];
        let first = id.as_bytes()[0] as usize;
        let lo = if first == 0 { 0 } else { u32_at(b, fan + 4 * (first - 1)) as usize };
        let hi = u32_at(b, fan + 4 * first) as usize;
        let key = |r: usize| &b[at + r * row..at + r * row + 32];
        let (mut l, mut h) = (lo, hi);
        while l < h {
            let mid = l + (h - l) / 2;
            if key(mid) < id.as_bytes().as_slice() {
                l = mid + 1;
            } else {
                h = mid;
            }
        }
        (l < hi && key(l) == id.as_bytes().as_slice()).then_some(l)
    }

    /// The pack that holds member `id` (the first, if several do), and
    /// where in it.
    pub fn member(&self, id: &Hash) -> Option<(usize, usize)> {
        let r = self.find(HEAD, self.at_members, MEMBER_ROW, id)?;
        let at = self.at_members + r * MEMBER_ROW;
        let b = &self.buf[..];
        Some((u32_at(b, at + 32) as usize, u32_at(b, at + 36) as usize))
    }

    /// Pack `p` with its members in pack order; `Err` names what is wrong
    /// with it (the same checks as the index decoder's).
    pub fn pack(&self, p: usize) -> Result<PackEntry, String> {
        if p >= self.packs {
            return Err(format!("pack {p} of {}", self.packs));
        }
        let b = &self.buf[..];
        let at = self.at_packs + p * PACK_ROW;
        let id = hash_at(b, at);
        let (size, header_len, first, count) =
            (u64_at(b, at + 32), u64_at(b, at + 40), u64_at(b, at + 48), u64_at(b, at + 56));
        if first.checked_add(count).is_none_or(|e| e > self.members as u64) {
            return Err(format!("pack {} names members past the table", id.short()));
        }
        let mut members = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            let row = u32_at(b, self.at_order + 4 * (first as usize + i)) as usize;
            if row >= self.members {
                return Err(format!("pack {} names row {row} of {}", id.short(), self.members));
            }
            let r = self.at_members + row * MEMBER_ROW;
            if u32_at(b, r + 32) as usize != p || u32_at(b, r + 36) as usize != i {
                return Err(format!("pack {}'s member {i} is another's", id.short()));
            }
            let kind = match b[r + 56] {
                1 => MemberKind::Blob,
                2 => MemberKind::Manifest,
                3 => MemberKind::Chunk,
                k => return Err(format!("unknown member kind {k}")),
            };
            let codec = match b[r + 57] {
                0 => Codec::Raw,
                1 => Codec::Zstd,
                c => return Err(format!("unknown codec {c}")),
            };
            members.push(Member {
                id: hash_at(b, r),
                kind,
                codec,
                offset: u64_at(b, r + 40),
                stored_len: u32_at(b, r + 48) as u64,
                raw_len: u32_at(b, r + 52) as u64,
            });
        }
        check_members(&id, size, header_len, &members)?;
        Ok(PackEntry { id, size, header_len, members })
    }

    /// Pack `p`'s id (its members not read).
    pub fn pack_id(&self, p: usize) -> Option<Hash> {
        (p < self.packs).then(|| hash_at(&self.buf[..], self.at_packs + p * PACK_ROW))
    }

    /// How many objects (trees and chunk manifests) this layer carries inline.
    pub fn inline_count(&self) -> usize {
        self.inline
    }

    /// Whether this layer lists `id` inline (its bytes not read).
    pub fn has_inline(&self, id: &Hash) -> bool {
        self.find(HEAD + FANOUT, self.at_inline, INLINE_ROW, id).is_some()
    }

    /// The inline object (a tree, or a chunked file's manifest) `id`, if
    /// this layer carries it and it hashes to its id.
    pub fn inline(&self, id: &Hash) -> Option<&[u8]> {
        let r = self.find(HEAD + FANOUT, self.at_inline, INLINE_ROW, id)?;
        let b = &self.buf[..];
        let at = self.at_inline + r * INLINE_ROW;
        let (off, len) = (u64_at(b, at + 32), u64_at(b, at + 40));
        let end = off.checked_add(len)?;
        if end > (b.len() - self.at_blob) as u64 {
            return None;
        }
        let bytes = &b[self.at_blob + off as usize..self.at_blob + end as usize];
        id.verifies(bytes).then_some(bytes)
    }

    /// The layer as an index again (tests and checks: it decodes all of it).
    pub fn to_index(&self) -> Result<PackIndex, String> {
        let packs = (0..self.packs).map(|p| self.pack(p)).collect::<Result<Vec<_>, _>>()?;
        let b = &self.buf[..];
        let mut trees = Vec::with_capacity(self.inline);
        for r in 0..self.inline {
            let id = hash_at(b, self.at_inline + r * INLINE_ROW);
            let t = self.inline(&id).ok_or_else(|| format!("inline object {} is damaged", id.short()))?;
            trees.push((id, t.to_vec()));
        }
        Ok(PackIndex {
            tree: self.tree,
            mode: self.mode,
            dirs: self.dirs,
            packs,
            trees,
            base: self.base.clone(),
            deltas: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::build_pack;

    /// Three packs; `shared` is in the first and the last; two inline
    /// trees and a manifest; a chain of two layers below.
    fn sample() -> (PackIndex, Vec<Vec<u8>>) {
        let blobs: Vec<Vec<u8>> =
            (0..40u32).map(|i| format!("file {i} {}", "x".repeat(i as usize * 7)).into_bytes()).collect();
        let shared = b"in two packs".to_vec();
        let pack = |members: Vec<&Vec<u8>>| {
            let rows: Vec<(Hash, MemberKind, &[u8])> =
                members.iter().map(|b| (Hash::of(b), MemberKind::Blob, &b[..])).collect();
            build_pack(&rows).1
        };
        let packs = vec![
            pack(blobs[..15].iter().chain([&shared]).collect()),
            pack(blobs[15..30].iter().collect()),
            pack([&shared].into_iter().chain(&blobs[30..]).collect()),
        ];
        let trees = [b"tree one".to_vec(), b"tree two, longer".to_vec(), b"MADM a manifest".to_vec()];
        let idx = PackIndex {
            tree: Hash([7; 32]),
            mode: Mode::Recursive,
            dirs: 3,
            packs,
            trees: trees.iter().map(|t| (Hash::of(t), t.clone())).collect(),
            base: vec![Hash([8; 32]), Hash([9; 32])],
            deltas: Vec::new(),
        };
        let mut all = blobs;
        all.push(shared);
        (idx, all)
    }

    #[test]
    fn a_flat_layer_reads_back_as_the_index_it_was_made_from() {
        let (idx, blobs) = sample();
        let flat = FlatIndex::from_bytes(encode(&idx)).unwrap();
        assert_eq!((flat.tree(), flat.mode(), flat.dirs()), (idx.tree, idx.mode, idx.dirs));
        assert_eq!(flat.base(), &idx.base[..]);
        assert_eq!((flat.pack_count(), flat.member_count()), (3, 42));
        assert_eq!(flat.file_shape(), (1, 42), "one manifest inline; every member a small file");
        let mut back = flat.to_index().unwrap();
        let mut want = idx.clone();
        want.trees.sort();
        back.trees.sort();
        assert_eq!(back, want);
        for b in &blobs {
            let id = Hash::of(b);
            let (p, i) = flat.member(&id).unwrap();
            // The first pack that holds it, as a merged index answers.
            let first = idx.packs.iter().position(|pk| pk.members.iter().any(|m| m.id == id)).unwrap();
            assert_eq!(p, first);
            assert_eq!(idx.packs[p].members[i].id, id);
        }
        for (id, t) in &idx.trees {
            assert_eq!(flat.inline(id), Some(&t[..]));
            assert!(flat.has_inline(id));
            assert_eq!(flat.member(id), None);
        }
        for missing in [Hash([0; 32]), Hash([0xff; 32]), Hash::of(b"nothing")] {
            assert_eq!(flat.member(&missing), None);
            assert_eq!(flat.inline(&missing), None);
            assert!(!flat.has_inline(&missing));
        }
    }

    /// If this fails, the flat encoding changed: bump its version.
    #[test]
    fn flat_golden_bytes() {
        let a = b"hello".to_vec();
        let (_, entry) = build_pack(&[(Hash::of(&a), MemberKind::Blob, &a)]);
        let idx = PackIndex {
            tree: Hash([1; 32]),
            mode: Mode::PerDir,
            dirs: 2,
            packs: vec![entry],
            trees: vec![(Hash::of(b"t"), b"t".to_vec())],
            base: vec![],
            deltas: Vec::new(),
        };
        let enc = encode(&idx);
        assert_eq!(enc.len(), HEAD + 2 * FANOUT + PACK_ROW + MEMBER_ROW + 4 + INLINE_ROW + 1);
        assert_eq!(&enc[..8], b"MADX\x01\x00\x00\x00");
        assert_eq!(Hash::of(&enc).to_hex(), "f92643dd7ea468f3f9ba11c5816b94ce02c1c10d8209620765437d6d25885cac");
    }

    #[test]
    fn a_cut_or_damaged_flat_layer_is_refused_or_misses_never_misleads() {
        let (idx, blobs) = sample();
        let enc = encode(&idx);
        for cut in 0..enc.len() {
            assert!(FlatIndex::from_bytes(enc[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        let ids: Vec<Hash> = blobs.iter().map(|b| Hash::of(b)).chain(idx.trees.iter().map(|t| t.0)).collect();
        for at in 0..enc.len() {
            let mut bad = enc.clone();
            bad[at] ^= 0x41;
            let Ok(flat) = FlatIndex::from_bytes(bad) else { continue };
            for id in &ids {
                if let Some((p, _)) = flat.member(id) {
                    if let Ok(pack) = flat.pack(p) {
                        check_members(&pack.id, pack.size, pack.header_len, &pack.members).unwrap();
                    }
                }
                if let Some(t) = flat.inline(id) {
                    assert!(id.verifies(t), "byte {at}: inline bytes that are not {id:?}'s");
                }
            }
            for p in 0..flat.pack_count() + 1 {
                let _ = flat.pack(p);
            }
        }
    }

    /// Two packs of the same shape whose order entries are swapped: each
    /// table would name the other's member at a sound range. Refused.
    #[test]
    fn a_pack_whose_order_entry_names_another_packs_row_is_refused() {
        let (x, y) = (b"same length x".to_vec(), b"same length y".to_vec());
        let pack = |b: &Vec<u8>| build_pack(&[(Hash::of(b), MemberKind::Blob, &b[..])]).1;
        let idx = PackIndex {
            tree: Hash([3; 32]),
            mode: Mode::Recursive,
            dirs: 1,
            packs: vec![pack(&x), pack(&y)],
            trees: vec![],
            base: vec![],
            deltas: Vec::new(),
        };
        let mut enc = encode(&idx);
        let at = FlatIndex::from_bytes(enc.clone()).unwrap().at_order;
        let (a, b) = (enc[at..at + 4].to_vec(), enc[at + 4..at + 8].to_vec());
        enc[at..at + 4].copy_from_slice(&b);
        enc[at + 4..at + 8].copy_from_slice(&a);
        let flat = FlatIndex::from_bytes(enc).unwrap();
        assert!(flat.pack(0).is_err() && flat.pack(1).is_err());
    }

    #[test]
    fn a_flat_file_is_mapped_and_a_missing_or_foreign_one_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let (idx, _) = sample();
        let path = dir.path().join("flat");
        assert!(FlatIndex::open(&path).unwrap().is_none());
        std::fs::write(&path, encode(&idx)).unwrap();
        let flat = FlatIndex::open(&path).unwrap().unwrap();
        assert!(matches!(flat.buf, CacheBuf::Map(_)));
        assert_eq!(flat.to_index().unwrap().packs, idx.packs);
        std::fs::write(&path, b"MADI not flat at all").unwrap();
        assert!(FlatIndex::open(&path).is_err());
    }
}
