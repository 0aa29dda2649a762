//! mado's object model and its version-1 binary encodings (docs/FORMAT.md).
//!
//! Blobs are raw file bytes and have no encoding. Trees, snapshots, chunk
//! manifests and refs start with a 4-byte magic and a version byte. Every
//! decoder validates the whole input (names, order, lengths, trailing
//! bytes) and returns [`DecodeError`] instead of panicking, so a hostile
//! object can never reach the checkout or mount code unchecked.

mod layering;
mod lease;
mod stat;

pub use layering::compaction_point;
pub use lease::Lease;
pub use stat::{StatDelta, StatObject, MAX_STAT_LAYERS};

use crate::codec::{put_bytes, put_varint, DecodeError, Reader};
use crate::hash::{Hash, SnapshotId, TreeId};

/// What a tree entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    File,
    Executable,
    Symlink,
    Directory,
    /// A git submodule commit; checked out as an empty directory.
    Gitlink,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Executable => 2,
            Kind::Symlink => 3,
            Kind::Directory => 4,
            Kind::Gitlink => 5,
        }
    }
    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::File,
            2 => Kind::Executable,
            3 => Kind::Symlink,
            4 => Kind::Directory,
            5 => Kind::Gitlink,
            _ => return None,
        })
    }
    /// Entries whose id names file content (possibly through a manifest).
    pub fn has_content(self) -> bool {
        matches!(self, Kind::File | Kind::Executable | Kind::Symlink)
    }
    /// The kind in a sentence, with its article ("an executable file").
    pub fn noun(self) -> &'static str {
        match self {
            Kind::File => "a file",
            Kind::Executable => "an executable file",
            Kind::Symlink => "a symlink",
            Kind::Directory => "a directory",
            Kind::Gitlink => "a submodule (gitlink)",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Executable => "exec",
            Kind::Symlink => "symlink",
            Kind::Directory => "dir",
            Kind::Gitlink => "gitlink",
        }
    }
}

/// One entry of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub kind: Kind,
    /// The id names a [`ChunkManifest`] rather than the content itself.
    pub chunked: bool,
    /// Content length for files and symlinks (target length); 0 otherwise.
    pub size: u64,
    /// Blob, manifest or tree id. For a gitlink: the submodule's git commit
    /// id, left-aligned and zero-padded to 32 bytes.
    pub id: Hash,
}

/// A directory: entries sorted by name bytes, unique, no mtimes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Tree {
    pub entries: Vec<Entry>,
}

const TREE_MAGIC: &[u8; 4] = b"MADT";
const SNAP_MAGIC: &[u8; 4] = b"MADS";
pub(crate) const MANIFEST_MAGIC: &[u8; 4] = b"MADM";
const REF_MAGIC: &[u8; 4] = b"MADR";
pub const FORMAT_VERSION: u8 = 1;

const FLAG_CHUNKED: u8 = 1;

/// Why a name cannot be a tree entry. Refusing these at every decode is
/// what keeps checkout from ever writing outside its target.
pub fn check_name(name: &[u8]) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty entry name".into());
    }
    if name == b"." || name == b".." {
        return Err(format!("entry name {:?} is not allowed", String::from_utf8_lossy(name)));
    }
    if name.contains(&b'/') {
        return Err(format!("entry name {:?} contains '/'", String::from_utf8_lossy(name)));
    }
    if name.contains(&0) {
        return Err(format!("entry name {:?} contains NUL", String::from_utf8_lossy(name)));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "entry name {:?}... is {} bytes long; filesystems allow at most {MAX_NAME_BYTES}",
            String::from_utf8_lossy(&name[..32]),
            name.len()
        ));
    }
    if name.eq_ignore_ascii_case(b".mado") {
        // A working copy's control folder: a tree that carried one could
        // point `mado ws checkpoint` at another workspace.
        return Err(format!(
            "entry name {:?} is reserved for mado's working-copy state",
            String::from_utf8_lossy(name)
        ));
    }
    Ok(())
}

/// One tree entry's bytes (a tree's, and an index layer's tree delta's).
pub(crate) fn put_entry(out: &mut Vec<u8>, e: &Entry) {
    put_bytes(out, &e.name);
    out.push(e.kind.code());
    out.push(if e.chunked { FLAG_CHUNKED } else { 0 });
    put_varint(out, e.size);
    out.extend_from_slice(e.id.as_bytes());
}

/// [`put_entry`]'s reverse; the name is checked where the entry is used
/// ([`Tree::normalized`], [`Tree::decode`]).
pub(crate) fn read_entry(r: &mut Reader<'_>) -> Result<Entry, DecodeError> {
    let name = r.bytes()?.to_vec();
    let at = r.pos();
    let kind =
        Kind::from_code(r.u8()?).ok_or_else(|| DecodeError::Invalid(format!("unknown entry kind at byte {at}")))?;
    let flags = r.u8()?;
    if flags & !FLAG_CHUNKED != 0 {
        return Err(DecodeError::Invalid(format!("unknown entry flags {flags:#x}")));
    }
    let size = r.varint()?;
    let id = r.hash()?;
    Ok(Entry { name, kind, chunked: flags & FLAG_CHUNKED != 0, size, id })
}

/// The longest file name Linux filesystems accept (NAME_MAX).
pub const MAX_NAME_BYTES: usize = 255;

impl Tree {
    /// Sorts entries and checks names and uniqueness: the form every
    /// encoded tree has.
    pub fn normalized(mut entries: Vec<Entry>) -> Result<Tree, DecodeError> {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let t = Tree { entries };
        t.validate()?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), DecodeError> {
        for (i, e) in self.entries.iter().enumerate() {
            check_name(&e.name).map_err(DecodeError::Invalid)?;
            if i > 0 && self.entries[i - 1].name >= e.name {
                return Err(DecodeError::Invalid(format!(
                    "entries not sorted or duplicated at {:?}",
                    String::from_utf8_lossy(&e.name)
                )));
            }
            if e.chunked && !matches!(e.kind, Kind::File | Kind::Executable) {
                return Err(DecodeError::Invalid(format!(
                    "{} entry {:?} marked chunked",
                    e.kind.label(),
                    String::from_utf8_lossy(&e.name)
                )));
            }
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.entries.len() * 48);
        out.extend_from_slice(TREE_MAGIC);
        out.push(FORMAT_VERSION);
        put_varint(&mut out, self.entries.len() as u64);
        for e in &self.entries {
            put_entry(&mut out, e);
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Tree, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(TREE_MAGIC)?;
        r.version("tree", FORMAT_VERSION)?;
        // Smallest entry: 1 (len) + 0 (name) + 1 (kind) + 1 (flags) + 1 (size) + 32.
        let n = r.count(36)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            entries.push(read_entry(&mut r)?);
        }
        r.finish()?;
        let t = Tree { entries };
        t.validate()?;
        Ok(t)
    }

    pub fn get(&self, name: &[u8]) -> Option<&Entry> {
        self.entries.binary_search_by(|e| e.name.as_slice().cmp(name)).ok().map(|i| &self.entries[i])
    }
}

/// A point in a history: a root tree and how it came to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub root: TreeId,
    pub parents: Vec<SnapshotId>,
    /// Seconds since the Unix epoch.
    pub time: i64,
    pub author: String,
    pub message: String,
    /// Where the content came from, e.g. `git:<commit id>`; empty if none.
    pub source: String,
    /// Per-snapshot stat object (file mtimes) for workspaces; none for imports.
    pub stat: Option<Hash>,
    /// When `stat` is a layer: the stat objects below it, nearest first
    /// (so a reader fetches them all in one round trip).
    pub stat_layers: Vec<Hash>,
}

fn utf8(b: &[u8], what: &str) -> Result<String, DecodeError> {
    String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Invalid(format!("{what} is not UTF-8")))
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.message.len());
        out.extend_from_slice(SNAP_MAGIC);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(self.root.as_bytes());
        put_varint(&mut out, self.parents.len() as u64);
        for p in &self.parents {
            out.extend_from_slice(p.as_bytes());
        }
        out.extend_from_slice(&self.time.to_le_bytes());
        put_bytes(&mut out, self.author.as_bytes());
        put_bytes(&mut out, self.message.as_bytes());
        put_bytes(&mut out, self.source.as_bytes());
        match self.stat {
            None => out.push(0),
            Some(h) if self.stat_layers.is_empty() => {
                out.push(1);
                out.extend_from_slice(h.as_bytes());
            }
            Some(h) => {
                out.push(2);
                out.extend_from_slice(h.as_bytes());
                put_varint(&mut out, self.stat_layers.len() as u64);
                for l in &self.stat_layers {
                    out.extend_from_slice(l.as_bytes());
                }
            }
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Snapshot, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(SNAP_MAGIC)?;
        r.version("snapshot", FORMAT_VERSION)?;
        let root = TreeId::from_hash(r.hash()?);
        let n = r.count(32)?;
        let parents = (0..n).map(|_| r.hash().map(SnapshotId::from_hash)).collect::<Result<Vec<_>, _>>()?;
        let time = r.i64_le()?;
        let author = utf8(r.bytes()?, "author")?;
        let message = utf8(r.bytes()?, "message")?;
        let source = utf8(r.bytes()?, "source")?;
        let mut stat_layers = Vec::new();
        let stat = match r.u8()? {
            0 => None,
            1 => Some(r.hash()?),
            2 => {
                let top = r.hash()?;
                let n = r.count(32)?;
                if n == 0 {
                    return Err(DecodeError::Invalid("stat layers flagged, none listed".into()));
                }
                for _ in 0..n {
                    stat_layers.push(r.hash()?);
                }
                Some(top)
            }
            f => return Err(DecodeError::Invalid(format!("bad stat flag {f}"))),
        };
        r.finish()?;
        Ok(Snapshot { root, parents, time, author, message, source, stat, stat_layers })
    }
}

/// The chunk list of a file split with FastCDC, with its runs of zeros
/// left out as holes (`crate::chunk`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkManifest {
    pub size: u64,
    /// BLAKE3 of the whole file content, for a file without holes (version
    /// 1). A manifest with holes (version 2) has none: hashing the zeros
    /// would cost what the holes spare, and its pieces name the content.
    pub content: Option<Hash>,
    /// (length, chunk id), in file order; `None` is a hole, that many
    /// zero bytes stored as nothing.
    pub chunks: Vec<(u64, Option<Hash>)>,
}

/// A manifest with holes.
const MANIFEST_SPARSE: u8 = 2;

impl ChunkManifest {
    /// Each piece as (offset in the file, length, chunk id or `None` for
    /// a hole), in file order.
    pub fn spans(&self) -> impl Iterator<Item = (u64, u64, Option<Hash>)> + '_ {
        let mut at = 0;
        self.chunks.iter().map(move |(len, id)| {
            at += len;
            (at - len, *len, *id)
        })
    }

    /// The ids of the chunks that hold bytes, in file order.
    pub fn data_chunks(&self) -> impl Iterator<Item = Hash> + '_ {
        self.chunks.iter().filter_map(|(_, id)| *id)
    }

    /// Whether some of the file is a hole.
    pub fn has_holes(&self) -> bool {
        self.chunks.iter().any(|(_, id)| id.is_none())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + self.chunks.len() * 37);
        out.extend_from_slice(MANIFEST_MAGIC);
        match self.content {
            Some(content) => {
                out.push(FORMAT_VERSION);
                put_varint(&mut out, self.size);
                out.extend_from_slice(content.as_bytes());
                put_varint(&mut out, self.chunks.len() as u64);
                for (len, id) in &self.chunks {
                    put_varint(&mut out, *len);
                    out.extend_from_slice(id.expect("a manifest with a content hash has no holes").as_bytes());
                }
            }
            None => {
                out.push(MANIFEST_SPARSE);
                put_varint(&mut out, self.size);
                put_varint(&mut out, self.chunks.len() as u64);
                for (len, id) in &self.chunks {
                    put_varint(&mut out, *len);
                    match id {
                        Some(id) => {
                            out.push(0);
                            out.extend_from_slice(id.as_bytes());
                        }
                        None => out.push(1),
                    }
                }
            }
        }
        out
    }

    pub fn decode(buf: &[u8]) -> Result<ChunkManifest, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(MANIFEST_MAGIC)?;
        let version = r.u8()?;
        if version != FORMAT_VERSION && version != MANIFEST_SPARSE {
            return Err(DecodeError::Version { format: "chunk manifest", version, supported: MANIFEST_SPARSE });
        }
        let sparse = version == MANIFEST_SPARSE;
        let size = r.varint()?;
        let content = if sparse { None } else { Some(r.hash()?) };
        let n = r.count(if sparse { 2 } else { 33 })?;
        let mut chunks: Vec<(u64, Option<Hash>)> = Vec::with_capacity(n.min(1 << 16));
        let mut total: u64 = 0;
        for _ in 0..n {
            let len = r.varint()?;
            if len == 0 {
                return Err(DecodeError::Invalid("empty chunk".into()));
            }
            total = total.checked_add(len).ok_or_else(|| DecodeError::Invalid("chunk lengths overflow".into()))?;
            let id = match sparse {
                false => Some(r.hash()?),
                true => match r.u8()? {
                    0 => Some(r.hash()?),
                    1 if chunks.last().is_some_and(|(_, id)| id.is_none()) => {
                        return Err(DecodeError::Invalid("two holes in a row".into()))
                    }
                    1 => None,
                    t => return Err(DecodeError::Invalid(format!("bad piece tag {t}"))),
                },
            };
            chunks.push((len, id));
        }
        r.finish()?;
        if total != size {
            return Err(DecodeError::Invalid(format!("chunk lengths add up to {total}, manifest says {size}")));
        }
        let m = ChunkManifest { size, content, chunks };
        if sparse && !m.has_holes() {
            return Err(DecodeError::Invalid("a version-2 manifest without a hole".into()));
        }
        Ok(m)
    }
}

/// The value of a ref: the snapshot it points at, and that snapshot's root
/// tree (so a reader can ask for the tree's pack index in the same round
/// trip as the snapshot, instead of after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefValue {
    pub snapshot: SnapshotId,
    pub root: TreeId,
    /// The layers below the root's pack index (their trees, nearest first),
    /// when that index is a layer: a hint, so a reader fetches every layer
    /// in the round trip of the top one (docs/PACKS.md, "Layers").
    pub layers: Vec<Hash>,
}

/// Refs are written as version 2 (with a checksum), or 3 (2 plus the
/// index layers) when there are layers; version 1 (without a checksum) is
/// still read.
const REF_VERSION: u8 = 2;
const REF_LAYERED: u8 = 3;
/// Bytes of BLAKE3 over the rest of a version-2 ref.
const REF_SUM_LEN: usize = 8;

impl RefValue {
    /// A ref with no index layers named.
    pub fn new(snapshot: SnapshotId, root: TreeId) -> RefValue {
        RefValue { snapshot, root, layers: Vec::new() }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 1 + 64 + REF_SUM_LEN);
        out.extend_from_slice(REF_MAGIC);
        out.push(if self.layers.is_empty() { REF_VERSION } else { REF_LAYERED });
        out.extend_from_slice(self.snapshot.as_bytes());
        out.extend_from_slice(self.root.as_bytes());
        if !self.layers.is_empty() {
            put_varint(&mut out, self.layers.len() as u64);
            for l in &self.layers {
                out.extend_from_slice(l.as_bytes());
            }
        }
        let sum = Hash::of(&out);
        out.extend_from_slice(&sum.as_bytes()[..REF_SUM_LEN]);
        out
    }

    /// Refs are the one object not named by its hash: the checksum makes a
    /// corrupted ref read as corrupt, never as a valid-looking other id.
    pub fn decode(buf: &[u8]) -> Result<RefValue, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(REF_MAGIC)?;
        let version = r.u8()?;
        if !(1..=REF_LAYERED).contains(&version) {
            return Err(DecodeError::Version { format: "ref", version, supported: REF_LAYERED });
        }
        let snapshot = SnapshotId::from_hash(r.hash()?);
        let root = TreeId::from_hash(r.hash()?);
        let mut layers = Vec::new();
        if version == REF_LAYERED {
            let n = r.count(32)?;
            for _ in 0..n.min(64) {
                layers.push(r.hash()?);
            }
            if n > 64 {
                return Err(DecodeError::Invalid(format!("ref names {n} index layers")));
            }
        }
        if version >= REF_VERSION {
            let body = &buf[..r.pos()];
            let sum = r.take(REF_SUM_LEN)?;
            if Hash::of(body).as_bytes()[..REF_SUM_LEN] != *sum {
                return Err(DecodeError::Invalid("ref checksum mismatch: the ref is corrupt".into()));
            }
        }
        r.finish()?;
        Ok(RefValue { snapshot, root, layers })
    }
}

/// Checks a ref name: `/`-separated segments of `[A-Za-z0-9._-]`, none
/// empty or starting with `.`, at most 200 bytes.
pub fn check_ref_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && !seg.starts_with('.')
                && seg.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid ref name {name:?}: use /-separated segments of letters, digits, '.', '_' and '-', not starting with '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> Hash {
        Hash([n; 32])
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn sample_tree() -> Tree {
        Tree::normalized(vec![
            Entry { name: b"src".to_vec(), kind: Kind::Directory, chunked: false, size: 0, id: h(1) },
            Entry { name: b"big.bin".to_vec(), kind: Kind::File, chunked: true, size: 300, id: h(2) },
            Entry { name: b"run.sh".to_vec(), kind: Kind::Executable, chunked: false, size: 5, id: h(3) },
            Entry { name: b"link".to_vec(), kind: Kind::Symlink, chunked: false, size: 4, id: h(4) },
        ])
        .unwrap()
    }

    /// Golden bytes: if this fails, the tree encoding changed and every
    /// stored tree id with it. Bump FORMAT_VERSION instead.
    #[test]
    fn tree_golden_bytes() {
        let enc = sample_tree().encode();
        let expect = concat!(
            "4d41445401",
            "04",
            "07",
            "6269672e62696e",
            "01",
            "01",
            "ac02",
            "0202020202020202020202020202020202020202020202020202020202020202",
            "04",
            "6c696e6b",
            "03",
            "00",
            "04",
            "0404040404040404040404040404040404040404040404040404040404040404",
            "06",
            "72756e2e7368",
            "02",
            "00",
            "05",
            "0303030303030303030303030303030303030303030303030303030303030303",
            "03",
            "737263",
            "04",
            "00",
            "00",
            "0101010101010101010101010101010101010101010101010101010101010101",
        );
        assert_eq!(hex(&enc), expect);
        assert_eq!(Tree::decode(&enc).unwrap(), sample_tree());
        assert_eq!(Hash::of(&enc).to_hex(), Hash::of(&crate::hash::parse_hex(expect).unwrap()).to_hex());
    }

    #[test]
    fn snapshot_golden_bytes() {
        let s = Snapshot {
            root: TreeId::from_hash(h(7)),
            parents: vec![SnapshotId::from_hash(h(8))],
            time: 1_700_000_000,
            author: "A <a@b>".into(),
            message: "m".into(),
            source: "git:ab".into(),
            stat: None,
            stat_layers: vec![],
        };
        let enc = s.encode();
        let expect = concat!(
            "4d41445301",
            "0707070707070707070707070707070707070707070707070707070707070707",
            "01",
            "0808080808080808080808080808080808080808080808080808080808080808",
            "00f1536500000000",
            "07",
            "41203c6140623e",
            "01",
            "6d",
            "06",
            "6769743a6162",
            "00",
        );
        assert_eq!(hex(&enc), expect);
        assert_eq!(Snapshot::decode(&enc).unwrap(), s);
        let with_stat = Snapshot { stat: Some(h(9)), ..s };
        assert_eq!(Snapshot::decode(&with_stat.encode()).unwrap(), with_stat);
        let layered = Snapshot { stat_layers: vec![h(10), h(11)], ..with_stat.clone() };
        let enc = layered.encode();
        assert_eq!(Snapshot::decode(&enc).unwrap(), layered);
        assert_eq!(enc.len(), with_stat.encode().len() + 1 + 64);
        for cut in 0..enc.len() {
            assert!(Snapshot::decode(&enc[..cut]).is_err());
        }
    }

    /// BLAKE3("MADR" 02 05×32 06×32), first 8 bytes.
    const REF_GOLDEN_SUM: &str = "0531cdd287778349";

    #[test]
    fn manifest_and_ref_golden_bytes() {
        let m = ChunkManifest { size: 5, content: Some(h(1)), chunks: vec![(2, Some(h(2))), (3, Some(h(3)))] };
        let enc = m.encode();
        assert_eq!(
            hex(&enc),
            concat!(
                "4d41444d01",
                "05",
                "0101010101010101010101010101010101010101010101010101010101010101",
                "02",
                "02",
                "0202020202020202020202020202020202020202020202020202020202020202",
                "03",
                "0303030303030303030303030303030303030303030303030303030303030303",
            )
        );
        assert_eq!(ChunkManifest::decode(&enc).unwrap(), m);
        let r = RefValue::new(SnapshotId::from_hash(h(5)), TreeId::from_hash(h(6)));
        let enc = r.encode();
        assert_eq!(
            hex(&enc[..69]),
            concat!(
                "4d41445202",
                "0505050505050505050505050505050505050505050505050505050505050505",
                "0606060606060606060606060606060606060606060606060606060606060606",
            )
        );
        assert_eq!(hex(&enc[69..]), REF_GOLDEN_SUM);
        assert_eq!(RefValue::decode(&enc).unwrap(), r);
        // Version 3 names the index layers; a flipped bit in them is caught.
        let layered = RefValue { layers: vec![h(7), h(8)], ..r.clone() };
        let enc3 = layered.encode();
        assert_eq!(hex(&enc3[..5]), "4d41445203");
        assert_eq!(RefValue::decode(&enc3).unwrap(), layered);
        let mut bad = enc3.clone();
        bad[80] ^= 1;
        assert!(RefValue::decode(&bad).is_err());
        for cut in 0..enc3.len() {
            assert!(RefValue::decode(&enc3[..cut]).is_err(), "cut at {cut}");
        }
        // Version 1 (no checksum) is still read.
        let mut v1 = enc[..69].to_vec();
        v1[4] = 1;
        assert_eq!(RefValue::decode(&v1).unwrap(), r);
        // Every single flipped bit of a version-2 ref is caught.
        for i in 0..enc.len() {
            for bit in 0..8 {
                let mut c = enc.clone();
                c[i] ^= 1 << bit;
                assert!(RefValue::decode(&c).is_err(), "a flip at byte {i} bit {bit} decoded");
            }
        }
    }

    fn raw_tree(entries: &[(&[u8], u8)]) -> Vec<u8> {
        let mut out = b"MADT\x01".to_vec();
        put_varint(&mut out, entries.len() as u64);
        for (name, kind) in entries {
            put_bytes(&mut out, name);
            out.push(*kind);
            out.push(0);
            put_varint(&mut out, 0);
            out.extend_from_slice(&[0u8; 32]);
        }
        out
    }

    #[test]
    fn hostile_names_are_refused() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/etc", b"a\0b"] {
            let err = Tree::decode(&raw_tree(&[(bad, 1)])).unwrap_err();
            assert!(matches!(err, DecodeError::Invalid(_)), "{bad:?}: {err}");
        }
        // Duplicate names (e.g. a symlink and a directory both called "a").
        assert!(Tree::decode(&raw_tree(&[(b"a", 3), (b"a", 4)])).is_err());
        // Unsorted.
        assert!(Tree::decode(&raw_tree(&[(b"b", 1), (b"a", 1)])).is_err());
        // Non-UTF-8 names are fine.
        assert!(Tree::decode(&raw_tree(&[(b"caf\xe9", 1)])).is_ok());
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let encodings = [
            sample_tree().encode(),
            Snapshot {
                root: TreeId::from_hash(h(1)),
                parents: vec![SnapshotId::from_hash(h(2)), SnapshotId::from_hash(h(3))],
                time: -5,
                author: "x".into(),
                message: "y".into(),
                source: String::new(),
                stat: Some(h(4)),
                stat_layers: vec![],
            }
            .encode(),
            ChunkManifest { size: 3, content: Some(h(1)), chunks: vec![(1, Some(h(2))), (2, Some(h(3)))] }.encode(),
            ChunkManifest { size: 7, content: None, chunks: vec![(1, Some(h(2))), (4, None), (2, Some(h(3)))] }
                .encode(),
            RefValue::new(SnapshotId::from_hash(h(1)), TreeId::from_hash(h(2))).encode(),
        ];
        for enc in &encodings {
            for cut in 0..enc.len() {
                let p = &enc[..cut];
                assert!(
                    Tree::decode(p).is_err()
                        && Snapshot::decode(p).is_err()
                        && ChunkManifest::decode(p).is_err()
                        && RefValue::decode(p).is_err(),
                    "a truncated encoding decoded"
                );
            }
            for i in 0..enc.len() {
                for bit in 0..8 {
                    let mut c = enc.clone();
                    c[i] ^= 1 << bit;
                    // Must not panic; may decode when the flip lands in an id.
                    let _ = (Tree::decode(&c), Snapshot::decode(&c), ChunkManifest::decode(&c), RefValue::decode(&c));
                }
            }
            let mut trailing = enc.clone();
            trailing.push(0);
            assert!(Tree::decode(&trailing).is_err() && RefValue::decode(&trailing).is_err());
        }
    }

    #[test]
    fn a_manifest_with_holes_golden_bytes_and_rules() {
        let m = ChunkManifest { size: 0x90, content: None, chunks: vec![(2, Some(h(2))), (0x8e, None)] };
        let enc = m.encode();
        assert_eq!(
            hex(&enc),
            concat!(
                "4d41444d02",
                "9001",
                "02",
                "02",
                "00",
                "0202020202020202020202020202020202020202020202020202020202020202",
                "8e01",
                "01"
            )
        );
        assert_eq!(ChunkManifest::decode(&enc).unwrap(), m);
        assert!(m.has_holes());
        assert_eq!(m.spans().collect::<Vec<_>>(), vec![(0, 2, Some(h(2))), (2, 0x8e, None)]);
        assert_eq!(m.data_chunks().collect::<Vec<_>>(), vec![h(2)]);
        let bad = |chunks: Vec<(u64, Option<Hash>)>| {
            let size = chunks.iter().map(|c| c.0).sum();
            ChunkManifest::decode(&ChunkManifest { size, content: None, chunks }.encode()).unwrap_err().to_string()
        };
        assert!(bad(vec![(1, None), (2, None)]).contains("two holes"));
        assert!(bad(vec![(1, Some(h(1)))]).contains("without a hole"));
        let mut tagged = enc.clone();
        tagged[9] = 7;
        assert!(ChunkManifest::decode(&tagged).unwrap_err().to_string().contains("tag 7"));
    }

    #[test]
    fn manifest_lengths_must_add_up() {
        let m = ChunkManifest { size: 9, content: Some(h(1)), chunks: vec![(2, Some(h(2)))] };
        assert!(ChunkManifest::decode(&m.encode()).is_err());
    }

    #[test]
    fn ref_names() {
        assert!(check_ref_name("main").is_ok());
        assert!(check_ref_name("ws/agent-1").is_ok());
        for bad in ["", "../x", "a//b", ".hidden", "a b", "a/./b", "x/"] {
            assert!(check_ref_name(bad).is_err(), "{bad}");
        }
    }
}
