//! Locality packs: many small objects in one content-addressed blob, so a
//! cold subtree costs one ranged GET instead of one GET per file.
//!
//! - A **pack** (`MADP`) is a member table followed by the member bodies in
//!   walk order. Each member is one object (blob, chunk manifest or chunk),
//!   stored raw or as a zstd frame; its key stays the hash of its raw bytes.
//!   A member can be read from its byte range alone, and a streaming reader
//!   can use members in order as they arrive.
//! - A **pack index** (`MADI`) covers one tree: every pack's id, size and
//!   member table, plus every tree of the covered subtree inline. With the
//!   index in hand a reader lists any directory with no further request and
//!   reads any member with one ranged GET of its pack.
//! - Packs are how content goes up (packs-first, docs/PACKS.md): an import
//!   stores its objects only in packs (those too large for one alone), and
//!   its trees inline in the index. In stores from before, every object is
//!   also stored alone and packs are a cache of them.
//!
//! How pack roots are chosen (docs/PACKS.md): v2 (recursive, the default)
//! treats a directory whose whole subtree fits the cap as one unit, and
//! packs a too-large directory's files and fitting subdirectories together
//! in name order, up to the cap; too-large subdirectories recurse. v1
//! (per-directory) packs each dense directory's own small files.

use std::collections::HashSet;

use crate::codec::{put_varint, DecodeError, Reader};
use crate::error::Result;
use crate::hash::Hash;

mod build;
pub mod delta;
pub mod flat;

pub use build::{build, build_delta, build_delta_flat, is_run_pack, Absorb, Built, FlatBase, Source};

pub const DEFAULT_MAX_PACK_BYTES: u64 = 64 << 20;
/// A file too large for a pack of the plan (more than the cap) is packed
/// apart, its manifest and chunks in file order in packs of at most this
/// many raw bytes (or the cap, if smaller): a sequential reader of it
/// reads whole packs, one ranged GET each, a few at once, instead of one
/// GET per chunk; a random reader one member's range. Small enough that
/// the packs in flight for one reader stay well under its memory bound.
pub const RUN_PACK_BYTES: u64 = 16 << 20;
/// A pack holds at most this many members, whatever their size: a reader
/// holds one pack's member table (and the cache one pack's record of what
/// it has) at a time, so that table stays small however small the files
/// are. A million source files of 225 bytes made three packs of up to
/// 900k members under the byte cap alone, and the first read of any file
/// built a 60 MB table.
pub const MAX_PACK_MEMBERS: usize = 16 << 10;
/// v1 packs a directory only if it has at least this many small files.
pub const PER_DIR_MIN_FILES: usize = 8;
const PACK_MAGIC: &[u8; 4] = b"MADP";
const INDEX_MAGIC: &[u8; 4] = b"MADI";
pub const PACK_VERSION: u8 = 1;
/// zstd level: fast enough to build packs at import time.
const ZSTD_LEVEL: i32 = 3;
/// Members larger than this are stored raw when their first
/// [`PROBE_BYTES`] do not compress.
const PROBE_ABOVE: usize = 256 << 10;
const PROBE_BYTES: usize = 64 << 10;
/// An index larger than this (decompressed) is refused as hostile.
const MAX_INDEX_BYTES: u64 = 1 << 30;
/// A member larger than this is refused as hostile (the largest object
/// mado writes is a 4 MiB chunk or blob, or a chunk manifest).
const MAX_MEMBER_BYTES: u64 = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberKind {
    Blob = 1,
    Manifest = 2,
    Chunk = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    Raw = 0,
    Zstd = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: Hash,
    pub kind: MemberKind,
    pub codec: Codec,
    /// Byte offset in the pack.
    pub offset: u64,
    pub stored_len: u64,
    pub raw_len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackEntry {
    pub id: Hash,
    pub size: u64,
    /// Where the member bodies start.
    pub header_len: u64,
    pub members: Vec<Member>,
}

impl PackEntry {
    /// The bytes of members `lo..=hi` in the pack (one ranged GET's range).
    pub fn members_range(&self, lo: usize, hi: usize) -> std::ops::Range<u64> {
        let last = &self.members[hi];
        self.members[lo].offset..last.offset + last.stored_len
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    PerDir = 1,
    Recursive = 2,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::PerDir => "per-dir",
            Mode::Recursive => "recursive",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackIndex {
    /// The tree this index covers.
    pub tree: Hash,
    pub mode: Mode,
    /// Directories in the covered tree.
    pub dirs: u64,
    pub packs: Vec<PackEntry>,
    /// Every tree of the covered subtree: (id, encoded bytes).
    pub trees: Vec<(Hash, Vec<u8>)>,
    /// Empty for a whole index. For a layer (written by a checkpoint or an
    /// incremental import on top of its parent's index): the trees whose
    /// indexes are the layers below, nearest first, down to a whole one;
    /// this layer then holds only the packs and trees they lack. A view
    /// merged from its layers ([`PackIndex::merge`]) keeps the list.
    pub base: Vec<Hash>,
    /// A layer's trees written as deltas over trees of the layers below
    /// it, as decoded and not yet rebuilt ([`delta::resolve_chain`]);
    /// empty once resolved, and in every index built here.
    pub deltas: Vec<delta::TreeDelta>,
}

/// A chain of index layers is compacted into one whole index when it
/// would grow past this many layers, so a cold reader fetches at most this
/// many (all in one round trip).
pub const MAX_INDEX_LAYERS: usize = 8;

/// Index encoding versions: 1, a whole index; 2, a layer (1 plus the list
/// of the layers below); 3, a layer with some trees as deltas (2 plus
/// those, [`delta`]).
const INDEX_LAYERED: u8 = 2;
const INDEX_DELTAS: u8 = 3;

fn kind_from(c: u8) -> Result<MemberKind, DecodeError> {
    Ok(match c {
        1 => MemberKind::Blob,
        2 => MemberKind::Manifest,
        3 => MemberKind::Chunk,
        _ => return Err(DecodeError::Invalid(format!("unknown member kind {c}"))),
    })
}

fn codec_from(c: u8) -> Result<Codec, DecodeError> {
    Ok(match c {
        0 => Codec::Raw,
        1 => Codec::Zstd,
        _ => return Err(DecodeError::Invalid(format!("unknown member codec {c}"))),
    })
}

/// A member as stored: compressed when that saves at least an eighth.
/// `z` is the calling thread's compressor: making a zstd context costs
/// more than compressing a small source file, so each thread keeps one.
fn stored_form<'a>(
    z: &mut Option<zstd::bulk::Compressor<'static>>,
    raw: &'a [u8],
) -> (Codec, std::borrow::Cow<'a, [u8]>) {
    if raw.len() < 64 {
        return (Codec::Raw, raw.into());
    }
    if z.is_none() {
        *z = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
    }
    // A large member whose first part does not compress (a large file's
    // chunk of media, an archive or random bytes) is stored raw without
    // compressing all of it: zstd would spend ~2 ms a MiB to give it back.
    let gains = |c: &[u8], of: usize| c.len() < of - of / 8;
    if raw.len() > PROBE_ABOVE {
        let probe = &raw[..PROBE_BYTES];
        if !matches!(z.as_mut().map(|z| z.compress(probe)), Some(Ok(c)) if gains(&c, probe.len())) {
            return (Codec::Raw, raw.into());
        }
    }
    match z.as_mut().map(|z| z.compress(raw)) {
        Some(Ok(c)) if gains(&c, raw.len()) => (Codec::Zstd, c.into()),
        _ => (Codec::Raw, raw.into()),
    }
}

/// Every member's stored form, in order, compressed on every core: the
/// build of a large import is bound by zstd, and each member is its own
/// frame, so the work splits freely and the bytes do not change.
fn stored_forms<'a>(members: &[(Hash, MemberKind, &'a [u8])]) -> Vec<(Codec, std::borrow::Cow<'a, [u8]>)> {
    let threads = crate::fsutil::cpu_threads();
    let part = |c: &[(Hash, MemberKind, &'a [u8])]| {
        let mut z = None;
        c.iter().map(|(_, _, raw)| stored_form(&mut z, raw)).collect::<Vec<_>>()
    };
    if threads <= 1 || members.len() < 2 * threads {
        return part(members);
    }
    let per = members.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = members.chunks(per).map(|c| s.spawn(move || part(c))).collect();
        parts.into_iter().flat_map(|h| h.join().expect("a compression thread panicked")).collect()
    })
}

/// A member in the form a pack stores it (compressed or not).
pub struct Stored {
    pub id: Hash,
    pub kind: MemberKind,
    pub codec: Codec,
    pub body: Vec<u8>,
    pub raw_len: u64,
}

/// Every member's stored form (compressed on every core), owned: a builder
/// can hold them to decide which go in one pack by their stored size.
pub fn stored_members(members: &[(Hash, MemberKind, &[u8])]) -> Vec<Stored> {
    members
        .iter()
        .zip(stored_forms(members))
        .map(|((id, kind, raw), (codec, body))| Stored {
            id: *id,
            kind: *kind,
            codec,
            body: body.into_owned(),
            raw_len: raw.len() as u64,
        })
        .collect()
}

/// Lays members out as a pack; returns its bytes and its entry.
pub fn assemble(members: &[Stored]) -> (Vec<u8>, PackEntry) {
    let rows: Vec<Row<'_>> = members.iter().map(|m| (m.id, m.kind, m.codec, &m.body[..], m.raw_len)).collect();
    lay_out(&rows)
}

/// A member as [`lay_out`] writes it: id, kind, codec, stored bytes, raw length.
type Row<'a> = (Hash, MemberKind, Codec, &'a [u8], u64);

/// The pack's bytes (the member table, then the bodies) in one buffer
/// sized up front, and its entry.
fn lay_out(rows: &[Row<'_>]) -> (Vec<u8>, PackEntry) {
    let bodies: usize = rows.iter().map(|r| r.3.len()).sum();
    let mut out = Vec::with_capacity(16 + rows.len() * 48 + bodies);
    out.extend_from_slice(PACK_MAGIC);
    out.push(PACK_VERSION);
    put_varint(&mut out, rows.len() as u64);
    for (id, kind, codec, body, raw_len) in rows {
        out.extend_from_slice(id.as_bytes());
        out.push(*kind as u8);
        out.push(*codec as u8);
        put_varint(&mut out, body.len() as u64);
        put_varint(&mut out, *raw_len);
    }
    let header_len = out.len() as u64;
    let mut entries = Vec::with_capacity(rows.len());
    for (id, kind, codec, body, raw_len) in rows {
        entries.push(Member {
            id: *id,
            kind: *kind,
            codec: *codec,
            offset: out.len() as u64,
            stored_len: body.len() as u64,
            raw_len: *raw_len,
        });
        out.extend_from_slice(body);
    }
    let entry = PackEntry { id: Hash::of(&out), size: out.len() as u64, header_len, members: entries };
    (out, entry)
}

/// Encodes a pack from raw members (compressed where it pays): a raw
/// member's bytes are copied once, into the pack.
pub fn build_pack(members: &[(Hash, MemberKind, &[u8])]) -> (Vec<u8>, PackEntry) {
    let forms = stored_forms(members);
    let rows: Vec<Row<'_>> = members
        .iter()
        .zip(&forms)
        .map(|((id, kind, raw), (codec, body))| (*id, *kind, *codec, &body[..], raw.len() as u64))
        .collect();
    lay_out(&rows)
}

/// Decodes a member's stored bytes and checks them against its id.
/// Decompresses with this thread's zstd context (a context costs more to
/// set up than a small member costs to decompress).
fn unzstd(stored: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    with_dctx(|d| d.decompress(stored, capacity))
}

fn with_dctx<T>(f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<T>) -> std::io::Result<T> {
    thread_local! {
        static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
    }
    DCTX.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new()?);
        }
        f(d.as_mut().expect("just set"))
    })
}

/// Decodes member `m` from its stored bytes onto the end of `out`, into
/// room `out` already has (`m.raw_len` bytes of spare capacity: nothing
/// is allocated, and with a reused buffer no fresh page is touched), and
/// checks it against its id. On an error `out` is as it was.
pub fn decode_member_append(m: &Member, stored: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let start = out.len();
    if out.capacity() - start < m.raw_len as usize {
        return Err(format!("no room for {} bytes", m.raw_len));
    }
    let decoded = match m.codec {
        Codec::Raw => {
            out.extend_from_slice(stored);
            Ok(())
        }
        Codec::Zstd => with_dctx(|d| {
            // Written from the cursor on, after what `out` holds; the room
            // offered is all of its spare capacity, so a frame longer than
            // its row says fails the length check below, not here.
            let mut at = std::io::Cursor::new(&mut *out);
            at.set_position(start as u64);
            d.decompress_to_buffer(stored, &mut at).map(|_| ())
        })
        .map_err(|e| format!("zstd: {e}")),
    };
    let checked = decoded.and_then(|()| check_member(m, &out[start..]));
    if checked.is_err() {
        out.truncate(start);
    }
    checked
}

pub fn decode_member(m: &Member, stored: &[u8]) -> Result<Vec<u8>, String> {
    let raw = match m.codec {
        Codec::Raw => stored.to_vec(),
        Codec::Zstd => unzstd(stored, m.raw_len as usize).map_err(|e| format!("zstd: {e}"))?,
    };
    check_member(m, &raw)?;
    Ok(raw)
}

/// [`decode_member`] of stored bytes the caller hands over: a raw member
/// (a large file's chunk, usually) is checked and given back as it is,
/// with no copy.
pub fn decode_member_owned(m: &Member, stored: bytes::Bytes) -> Result<bytes::Bytes, String> {
    match m.codec {
        Codec::Raw => {
            check_member(m, &stored)?;
            Ok(stored)
        }
        Codec::Zstd => decode_member(m, &stored).map(bytes::Bytes::from),
    }
}

/// [`decode_member_owned`] for bytes read into a buffer of the caller's.
pub fn decode_member_vec(m: &Member, stored: Vec<u8>) -> Result<Vec<u8>, String> {
    match m.codec {
        Codec::Raw => {
            check_member(m, &stored)?;
            Ok(stored)
        }
        Codec::Zstd => decode_member(m, &stored),
    }
}

fn check_member(m: &Member, raw: &[u8]) -> Result<(), String> {
    if raw.len() as u64 != m.raw_len {
        return Err(format!("{} bytes, table says {}", raw.len(), m.raw_len));
    }
    if !m.id.verifies(raw) {
        return Err("content does not match its id".into());
    }
    Ok(())
}

/// Parses a pack's header (for a standalone pack; readers normally use the
/// tables in the index).
pub fn decode_pack_header(buf: &[u8]) -> Result<(u64, Vec<Member>), DecodeError> {
    let mut r = Reader::new(buf);
    r.magic(PACK_MAGIC)?;
    r.version("pack", PACK_VERSION)?;
    let n = r.count(36)?;
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        let id = r.hash()?;
        let kind = kind_from(r.u8()?)?;
        let codec = codec_from(r.u8()?)?;
        let stored_len = r.varint()?;
        let raw_len = r.varint()?;
        rows.push((id, kind, codec, stored_len, raw_len));
    }
    let header_len = r.pos() as u64;
    let mut offset = header_len;
    let members = rows
        .into_iter()
        .map(|(id, kind, codec, stored_len, raw_len)| {
            let m = Member { id, kind, codec, offset, stored_len, raw_len };
            offset = offset.saturating_add(stored_len);
            m
        })
        .collect();
    Ok((header_len, members))
}

/// A member's row as the index stores it (the disk cache's record of a
/// cached pack uses the same rows): id, kind, codec, then varints offset,
/// stored length and raw length.
pub(crate) fn put_member_row(out: &mut Vec<u8>, m: &Member) {
    out.extend_from_slice(m.id.as_bytes());
    out.push(m.kind as u8);
    out.push(m.codec as u8);
    put_varint(out, m.offset);
    put_varint(out, m.stored_len);
    put_varint(out, m.raw_len);
}

/// Reads a row written by [`put_member_row`] (ranges unchecked).
pub(crate) fn read_member_row(r: &mut Reader<'_>) -> Result<Member, DecodeError> {
    let id = r.hash()?;
    let kind = kind_from(r.u8()?)?;
    let codec = codec_from(r.u8()?)?;
    let (offset, stored_len, raw_len) = (r.varint()?, r.varint()?, r.varint()?);
    Ok(Member { id, kind, codec, offset, stored_len, raw_len })
}

/// Checks a pack's member table as an index gives it: ranges in order,
/// not overlapping, inside the pack, no member over 64 MiB, a raw
/// member's stored and raw lengths equal.
pub(crate) fn check_members(pack: &Hash, size: u64, header_len: u64, members: &[Member]) -> Result<(), String> {
    let mut end = header_len;
    for m in members {
        let Member { id, codec, offset, stored_len, raw_len, .. } = *m;
        let ok = offset >= end
            && offset.checked_add(stored_len).is_some_and(|e| e <= size)
            && raw_len <= MAX_MEMBER_BYTES
            && stored_len <= MAX_MEMBER_BYTES
            && (codec == Codec::Zstd || stored_len == raw_len);
        if !ok {
            return Err(format!("member {} of pack {} has a bad range", id.short(), pack.short()));
        }
        end = offset + stored_len;
    }
    Ok(())
}

impl PackIndex {
    /// An upper bound of the encoded body's length (a varint is at most 10
    /// bytes): the body is built in one allocation, not grown by doubling
    /// (at a million files that was two copies of 100 MB at once).
    fn body_bound(&self) -> usize {
        let members: usize = self.packs.iter().map(|p| p.members.len()).sum();
        let trees: usize = self.trees.iter().map(|(_, t)| t.len() + 42).sum();
        let deltas: usize = self.deltas.iter().map(|d| 80 + d.removed.len() * 256 + d.upserts.len() * 300).sum();
        74 + self.packs.len() * 62 + members * 64 + trees + self.base.len() * 32 + deltas
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.body_bound());
        body.extend_from_slice(self.tree.as_bytes());
        body.push(self.mode as u8);
        put_varint(&mut body, self.dirs);
        put_varint(&mut body, self.packs.len() as u64);
        for p in &self.packs {
            body.extend_from_slice(p.id.as_bytes());
            put_varint(&mut body, p.size);
            put_varint(&mut body, p.header_len);
            put_varint(&mut body, p.members.len() as u64);
            for m in &p.members {
                put_member_row(&mut body, m);
            }
        }
        put_varint(&mut body, self.trees.len() as u64);
        for (id, t) in &self.trees {
            body.extend_from_slice(id.as_bytes());
            crate::codec::put_bytes(&mut body, t);
        }
        if !self.base.is_empty() {
            put_varint(&mut body, self.base.len() as u64);
            for b in &self.base {
                body.extend_from_slice(b.as_bytes());
            }
        }
        let version = match (self.base.is_empty(), self.deltas.is_empty()) {
            (true, _) => PACK_VERSION,
            (false, true) => INDEX_LAYERED,
            (false, false) => {
                put_varint(&mut body, self.deltas.len() as u64);
                for d in &self.deltas {
                    d.put(&mut body);
                }
                INDEX_DELTAS
            }
        };
        let mut out = Vec::new();
        out.extend_from_slice(INDEX_MAGIC);
        out.push(version);
        put_varint(&mut out, body.len() as u64);
        // Compressed into the output itself, after its head (no second
        // copy of it): the same bytes as zstd::bulk::compress.
        let head = out.len();
        out.reserve_exact(zstd::zstd_safe::compress_bound(body.len()));
        let mut at = std::io::Cursor::new(out);
        at.set_position(head as u64);
        let mut z = zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a zstd context");
        z.compress_to_buffer(&body, &mut at).expect("zstd compresses in memory");
        drop(body);
        let mut out = at.into_inner();
        out.shrink_to_fit();
        out
    }

    pub fn decode(buf: &[u8]) -> Result<PackIndex, DecodeError> {
        let mut r = Reader::new(buf);
        r.magic(INDEX_MAGIC)?;
        let version = r.u8()?;
        if !(PACK_VERSION..=INDEX_DELTAS).contains(&version) {
            return Err(DecodeError::Version { format: "pack index", version, supported: INDEX_DELTAS });
        }
        let raw_len = r.varint()?;
        if raw_len > MAX_INDEX_BYTES {
            return Err(DecodeError::Invalid(format!("index claims {raw_len} bytes")));
        }
        let rest = r.take(r.remaining())?;
        let body = zstd::bulk::decompress(rest, raw_len as usize)
            .map_err(|e| DecodeError::Invalid(format!("index does not decompress: {e}")))?;
        if body.len() as u64 != raw_len {
            return Err(DecodeError::Invalid("index length mismatch".into()));
        }
        let mut r = Reader::new(&body);
        let tree = r.hash()?;
        let mode = match r.u8()? {
            1 => Mode::PerDir,
            2 => Mode::Recursive,
            m => return Err(DecodeError::Invalid(format!("unknown pack mode {m}"))),
        };
        let dirs = r.varint()?;
        let np = r.count(36)?;
        let mut packs = Vec::with_capacity(np);
        for _ in 0..np {
            let pack_id = r.hash()?;
            let size = r.varint()?;
            let header_len = r.varint()?;
            let nm = r.count(37)?;
            let mut members = Vec::with_capacity(nm);
            for _ in 0..nm {
                members.push(read_member_row(&mut r)?);
            }
            check_members(&pack_id, size, header_len, &members).map_err(DecodeError::Invalid)?;
            packs.push(PackEntry { id: pack_id, size, header_len, members });
        }
        let nt = r.count(33)?;
        let mut trees = Vec::with_capacity(nt);
        for _ in 0..nt {
            let id = r.hash()?;
            let t = r.bytes()?.to_vec();
            if !id.verifies(&t) {
                return Err(DecodeError::Invalid(format!("inline tree {} does not match its id", id.short())));
            }
            trees.push((id, t));
        }
        let mut base = Vec::new();
        if version >= INDEX_LAYERED {
            let n = r.count(32)?;
            if n == 0 || n >= MAX_INDEX_LAYERS * 4 {
                return Err(DecodeError::Invalid(format!("index layer names {n} layers below it")));
            }
            for _ in 0..n {
                let b = r.hash()?;
                if b == tree || base.contains(&b) {
                    return Err(DecodeError::Invalid(format!("index layer chain repeats {}", b.short())));
                }
                base.push(b);
            }
        }
        let mut deltas = Vec::new();
        if version == INDEX_DELTAS {
            let n = r.count(68)?;
            if n == 0 {
                return Err(DecodeError::Invalid("index layer of version 3 holds no tree delta".into()));
            }
            for _ in 0..n {
                deltas.push(delta::TreeDelta::read(&mut r)?);
            }
        }
        r.finish()?;
        Ok(PackIndex { tree, mode, dirs, packs, trees, base, deltas })
    }

    /// Every layer's tree, this one first (one entry for a whole index).
    pub fn layers(&self) -> Vec<Hash> {
        std::iter::once(self.tree).chain(self.base.iter().copied()).collect()
    }

    /// The view of a layered index: `self` (the top layer) over `lower`
    /// (the layers of `self.base`, in that order). Returns why not when a
    /// layer is not the one named, or names another chain below it.
    /// Trees written as deltas are rebuilt from the layers below them.
    pub fn merge(mut self, mut lower: Vec<PackIndex>) -> Result<PackIndex, String> {
        if lower.len() != self.base.len() {
            return Err(format!("{} layers below, {} named", lower.len(), self.base.len()));
        }
        for (i, l) in lower.iter().enumerate() {
            if l.tree != self.base[i] || l.base[..] != self.base[i + 1..] {
                return Err(format!("layer {} is not the one named", l.tree.short()));
            }
        }
        if !self.deltas.is_empty() || lower.iter().any(|l| !l.deltas.is_empty()) {
            lower.insert(0, self);
            delta::resolve_chain(&mut lower)?;
            self = lower.remove(0);
        }
        let mut seen_packs: HashSet<Hash> = self.packs.iter().map(|p| p.id).collect();
        let mut seen_trees: HashSet<Hash> = self.trees.iter().map(|t| t.0).collect();
        for l in lower {
            self.packs.extend(l.packs.into_iter().filter(|p| seen_packs.insert(p.id)));
            self.trees.extend(l.trees.into_iter().filter(|t| seen_trees.insert(t.0)));
        }
        Ok(self)
    }

    /// The layer to publish for the view `self` built on top of `parent`
    /// (a view, maybe itself layered): only what `parent` lacks, naming
    /// `parent`'s layers below it; or `self` whole when that chain would
    /// grow past [`MAX_INDEX_LAYERS`] or the layer would not be smaller.
    pub fn layer_over(&self, parent: &PackIndex) -> PackIndex {
        let old_packs: HashSet<Hash> = parent.packs.iter().map(|p| p.id).collect();
        let old_trees: HashSet<Hash> = parent.trees.iter().map(|t| t.0).collect();
        self.layer_over_sets(parent.layers(), &|p| old_packs.contains(p), &|t| old_trees.contains(t), self.trees.len())
    }

    /// [`PackIndex::layer_over`] given what the chain below holds.
    /// `view_trees`: how many trees the whole view has (`self` may hold
    /// only some: a partial delta build).
    fn layer_over_sets(
        &self,
        below: Vec<Hash>,
        old_pack: &dyn Fn(&Hash) -> bool,
        old_tree: &dyn Fn(&Hash) -> bool,
        view_trees: usize,
    ) -> PackIndex {
        let packs: Vec<PackEntry> = self.packs.iter().filter(|p| !old_pack(&p.id)).cloned().collect();
        let trees: Vec<(Hash, Vec<u8>)> = self.trees.iter().filter(|t| !old_tree(&t.0)).cloned().collect();
        if below.len() >= MAX_INDEX_LAYERS || below.contains(&self.tree) || trees.len() * 2 > view_trees.max(1) {
            return PackIndex { base: Vec::new(), ..self.clone() };
        }
        PackIndex { tree: self.tree, mode: self.mode, dirs: self.dirs, packs, trees, base: below, deltas: Vec::new() }
    }

    /// The layer to publish for the view `self` over its parent's chain
    /// `parts` (each layer as stored, the parent's top first, the whole
    /// bottom last), going over `parts[at]` (see [`build::Absorb`]): it
    /// replaces the layers above that one. Or `self` whole, when the layer
    /// would not be smaller by half. `Err` when the layers do not form the
    /// chain they name.
    /// `view_trees`: the view's tree count when `self` holds only some of
    /// its trees (a partial delta build), else `None`. The chain below is
    /// read where it is, not merged into a copy.
    pub fn layer_over_at(
        &self,
        parts: &[PackIndex],
        at: usize,
        view_trees: Option<usize>,
    ) -> Result<PackIndex, String> {
        if at >= parts.len() {
            return Ok(PackIndex { base: Vec::new(), ..self.clone() });
        }
        let below = parts[at].layers();
        if below.len() != parts.len() - at || parts[at..].iter().zip(&below).any(|(l, t)| l.tree != *t) {
            return Err(format!("layer {} is not over the chain given", parts[at].tree.short()));
        }
        let old_packs: HashSet<Hash> = parts[at..].iter().flat_map(|l| l.packs.iter().map(|p| p.id)).collect();
        let old_trees: HashSet<Hash> = parts[at..].iter().flat_map(|l| l.trees.iter().map(|t| t.0)).collect();
        let (old_pack, old_tree) = (|p: &Hash| old_packs.contains(p), |t: &Hash| old_trees.contains(t));
        Ok(self.layer_over_sets(below, &old_pack, &old_tree, view_trees.unwrap_or(self.trees.len())))
    }

    /// [`PackIndex::layer_over_at`] over a [`build::FlatBase`]: what its
    /// bottom holds is looked up in place. `self` holds part of the view's
    /// trees (a partial delta build).
    pub fn layer_over_flat(&self, base: &build::FlatBase, at: usize) -> Result<PackIndex, String> {
        let chain = base.layers();
        if at >= chain.len() {
            return Ok(PackIndex { base: Vec::new(), ..self.clone() });
        }
        for (i, l) in base.above.iter().enumerate() {
            if l.base[..] != chain[i + 1..] {
                return Err(format!("layer {} is not over the chain given", l.tree.short()));
            }
        }
        let above = &base.above[at.min(base.above.len())..];
        let old_packs: HashSet<Hash> = above
            .iter()
            .flat_map(|l| l.packs.iter().map(|p| p.id))
            .chain((0..base.bottom.pack_count()).filter_map(|p| base.bottom.pack_id(p)))
            .collect();
        let old_trees: HashSet<Hash> = above.iter().flat_map(|l| l.trees.iter().map(|t| t.0)).collect();
        let bottom = &base.bottom;
        let (old_pack, old_tree) =
            (|p: &Hash| old_packs.contains(p), |t: &Hash| old_trees.contains(t) || bottom.has_inline(t));
        Ok(self.layer_over_sets(chain[at..].to_vec(), &old_pack, &old_tree, base.view_trees()))
    }

    pub fn member_count(&self) -> usize {
        self.packs.iter().map(|p| p.members.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::ChunkManifest;
    use crate::object::Kind;
    use crate::object::Tree;
    use crate::Error;

    #[test]
    fn a_member_decodes_onto_the_end_of_a_buffer_with_room_for_it() {
        let raw = b"some text, some text, some text, some text".repeat(50);
        let (_, pack) = build_pack(&[(Hash::of(&raw), MemberKind::Blob, &raw[..])]);
        let m = pack.members[0];
        assert_eq!(m.codec, Codec::Zstd);
        let (bytes, _) = build_pack(&[(Hash::of(&raw), MemberKind::Blob, &raw[..])]);
        let stored = &bytes[m.offset as usize..(m.offset + m.stored_len) as usize];
        // Exactly the room it needs, after what the buffer holds.
        let mut out = Vec::with_capacity(3 + raw.len());
        out.extend_from_slice(b"abc");
        decode_member_append(&m, stored, &mut out).unwrap();
        assert_eq!((&out[..3], &out[3..]), (&b"abc"[..], &raw[..]));
        // One byte short: refused, the buffer as it was.
        let mut out = Vec::with_capacity(2 + raw.len() - 1);
        out.extend_from_slice(b"ab");
        let e = decode_member_append(&m, stored, &mut out).unwrap_err();
        assert!(e.contains("no room"), "{e}");
        assert_eq!(out, b"ab");
        // Damaged: refused, the buffer as it was.
        let mut bad = stored.to_vec();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x10;
        let mut out = Vec::with_capacity(raw.len() + 10);
        out.push(7);
        assert!(decode_member_append(&m, &bad, &mut out).is_err());
        assert_eq!(out, [7]);
    }
    use crate::object::Entry;
    use std::collections::HashMap;

    /// zstd only where it saves an eighth, and never on tiny members.
    #[test]
    fn members_are_compressed_only_when_it_pays() {
        let text = b"fn main() { println!(\"hello\"); }\n".repeat(300);
        assert_eq!(stored_form(&mut None, &text).0, Codec::Zstd);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        assert_eq!(stored_form(&mut None, &noise).0, Codec::Raw, "incompressible bytes stay raw");
        let mostly_noise = [noise.clone(), vec![0u8; 300]].concat();
        assert_eq!(
            stored_form(&mut None, &mostly_noise).0,
            Codec::Raw,
            "a saving under an eighth is not worth a frame"
        );
        let small = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"; // 63 bytes
        assert_eq!(stored_form(&mut None, small).0, Codec::Raw, "under 64 bytes stays raw");
    }

    #[test]
    fn members_compressed_on_every_core_keep_their_bytes_and_order() {
        let data: Vec<Vec<u8>> =
            (0..100usize).map(|i| format!("member {i} ").repeat(i % 50 + 1).into_bytes()).collect();
        let members: Vec<(Hash, MemberKind, &[u8])> =
            data.iter().map(|d| (Hash::of(d), MemberKind::Blob, d.as_slice())).collect();
        // A fresh context per member (zstd's one-shot call) gives the
        // same bytes as a thread's reused one.
        let seq: Vec<_> = members
            .iter()
            .map(|(_, _, raw)| match zstd::bulk::compress(raw, ZSTD_LEVEL) {
                Ok(z) if raw.len() >= 64 && z.len() < raw.len() - raw.len() / 8 => (Codec::Zstd, z.into()),
                _ => (Codec::Raw, std::borrow::Cow::Borrowed(*raw)),
            })
            .collect();
        assert_eq!(stored_forms(&members), seq);
        let (bytes, entry) = build_pack(&members);
        for (m, d) in entry.members.iter().zip(&data) {
            let stored = &bytes[m.offset as usize..(m.offset + m.stored_len) as usize];
            assert_eq!(&decode_member(m, stored).unwrap(), d);
        }
    }

    fn index_with(tree: u8, packs: &[u8], trees: &[&[u8]], base: &[u8]) -> PackIndex {
        let h = |b: u8| Hash([b; 32]);
        PackIndex {
            tree: h(tree),
            mode: Mode::Recursive,
            dirs: 1,
            packs: packs.iter().map(|p| PackEntry { id: h(*p), size: 10, header_len: 10, members: vec![] }).collect(),
            trees: trees.iter().map(|t| (Hash::of(t), t.to_vec())).collect(),
            base: base.iter().map(|b| h(*b)).collect(),
            deltas: Vec::new(),
        }
    }

    #[test]
    fn index_layers_encode_merge_and_refuse_wrong_chains() {
        let whole = index_with(1, &[10, 11], &[b"t1", b"t2"], &[]);
        assert_eq!(whole.encode()[4], PACK_VERSION, "a whole index keeps version 1 bytes");
        let layer = index_with(2, &[12], &[b"t3"], &[1]);
        let enc = layer.encode();
        assert_eq!(enc[4], INDEX_LAYERED);
        assert_eq!(PackIndex::decode(&enc).unwrap(), layer);
        let view = layer.clone().merge(vec![whole.clone()]).unwrap();
        assert_eq!(view.packs.iter().map(|p| p.id.0[0]).collect::<Vec<_>>(), vec![12, 10, 11]);
        assert_eq!(view.trees.len(), 3);
        assert_eq!(view.layers(), vec![Hash([2; 32]), Hash([1; 32])]);
        // Wrong layer, wrong chain below, wrong count.
        assert!(layer.clone().merge(vec![index_with(9, &[], &[], &[])]).is_err());
        assert!(layer.clone().merge(vec![index_with(1, &[], &[], &[7])]).is_err());
        assert!(layer.clone().merge(vec![]).is_err());
        // A chain naming itself or repeating a layer does not decode.
        for base in [&[2u8][..], &[1, 1]] {
            let bad = index_with(2, &[], &[], base).encode();
            assert!(PackIndex::decode(&bad).is_err(), "{base:?}");
        }
    }

    /// The index's body is built in one allocation of at most its bound,
    /// even with every varint at its longest, and compressed into the
    /// output after its head: the bytes zstd's one-shot call gives, so an
    /// index published before reads as the same bytes (a compare finds
    /// nothing to write).
    #[test]
    fn an_index_encodes_within_its_bound_to_zstds_one_shot_bytes() {
        let mut idx = index_with(3, &[20, 21], &[b"tree one", b"tree two"], &[4]);
        let wide = Member {
            id: Hash([5; 32]),
            kind: MemberKind::Blob,
            codec: Codec::Zstd,
            offset: u64::MAX,
            stored_len: u64::MAX,
            raw_len: u64::MAX,
        };
        idx.packs[0].members = vec![wide; 50];
        idx.packs[0].size = u64::MAX;
        idx.packs[0].header_len = u64::MAX;
        idx.dirs = u64::MAX;
        let enc = idx.encode();
        let mut r = crate::codec::Reader::new(&enc[INDEX_MAGIC.len() + 1..]);
        let raw_len = r.varint().unwrap() as usize;
        let head = enc.len() - r.remaining();
        let body = zstd::bulk::decompress(&enc[head..], raw_len).unwrap();
        assert_eq!(body.len(), raw_len);
        assert!(raw_len <= idx.body_bound(), "{raw_len} > {}", idx.body_bound());
        assert_eq!(&enc[head..], &zstd::bulk::compress(&body, ZSTD_LEVEL).unwrap()[..]);
        assert_eq!(enc.capacity(), enc.len(), "no slack is kept");
    }

    #[test]
    fn a_layer_holds_only_what_its_parent_lacks_and_chains_stay_bounded() {
        let trees: Vec<Vec<u8>> = (0..10u8).map(|i| vec![b't', i]).collect();
        let all: Vec<&[u8]> = trees.iter().map(|t| t.as_slice()).collect();
        let parent = index_with(1, &[10, 11], &all[..9], &[]);
        let child = index_with(2, &[10, 11, 12], &all, &[]);
        let layer = child.layer_over(&parent);
        assert_eq!(layer.base, vec![Hash([1; 32])]);
        assert_eq!(layer.packs.len(), 1);
        assert_eq!(layer.trees.len(), 1);
        // A parent chain at the bound: the child goes up whole (compacted).
        let deep: Vec<u8> = (20..20 + MAX_INDEX_LAYERS as u8 - 1).collect();
        let long = index_with(1, &[10, 11], &all[..9], &deep);
        assert_eq!(long.layers().len(), MAX_INDEX_LAYERS);
        let whole = child.layer_over(&long);
        assert!(whole.base.is_empty() && whole.packs.len() == 3 && whole.trees.len() == 10);
        // A view that knows its own chain still goes up whole, naming none.
        let view = PackIndex { base: vec![Hash([99; 32])], ..child.clone() };
        assert!(view.layer_over(&long).base.is_empty());
        // One under the bound still layers.
        let shorter = index_with(1, &[10, 11], &all[..9], &deep[1..]);
        assert_eq!(child.layer_over(&shorter).base.len(), MAX_INDEX_LAYERS - 1);
        // A layer that would hold most trees is not worth a layer.
        let far = index_with(1, &[10], &all[..2], &[]);
        assert!(child.layer_over(&far).base.is_empty());
        // Exactly half the trees new is still a layer.
        let half = index_with(1, &[10], &all[..5], &[]);
        assert_eq!(child.layer_over(&half).trees.len(), 5);
        assert!(!child.layer_over(&half).base.is_empty());
    }

    /// A store in memory and a tree builder for tests.
    #[derive(Default)]
    struct Mem(HashMap<Hash, Vec<u8>>);

    impl Mem {
        fn put(&mut self, b: Vec<u8>) -> Hash {
            let id = Hash::of(&b);
            self.0.insert(id, b);
            id
        }
        fn file(&mut self, name: &str, content: Vec<u8>) -> Entry {
            let size = content.len() as u64;
            Entry { name: name.into(), kind: Kind::File, chunked: false, size, id: self.put(content) }
        }
        fn dir(&mut self, name: &str, entries: Vec<Entry>) -> Entry {
            let t = Tree::normalized(entries).unwrap();
            Entry { name: name.into(), kind: Kind::Directory, chunked: false, size: 0, id: self.put(t.encode()) }
        }
    }

    fn build_all(m: &Mem, root: Hash, mode: Mode, cap: u64) -> (Built, HashMap<Hash, Vec<u8>>) {
        let mut out = HashMap::new();
        let src = |id: &Hash| m.0.get(id).cloned().ok_or_else(|| Error::NotFound(id.to_hex()));
        let b = build(root, mode, cap, &src, &mut |id, bytes| {
            out.insert(id, bytes);
            Ok(())
        })
        .unwrap();
        (b, out)
    }

    /// A thin tree: 40 directories of 3 files each, under two levels.
    fn thin(m: &mut Mem) -> Hash {
        let mut top = Vec::new();
        for a in 0..4 {
            let mut mid = Vec::new();
            for b in 0..10 {
                let files = (0..3)
                    .map(|c| m.file(&format!("f{c}.txt"), format!("file {a}/{b}/{c} ").repeat(20).into_bytes()))
                    .collect();
                mid.push(m.dir(&format!("d{b}"), files));
            }
            top.push(m.dir(&format!("p{a}"), mid));
        }
        top.push(m.file("README", b"top".to_vec()));
        m.dir("", top).id
    }

    /// A whole (unchunked) file over the chunk threshold goes in no pack:
    /// each is counted and named as going alone, and the small files
    /// beside it are packed.
    #[test]
    fn whole_files_over_the_chunk_threshold_go_alone_each_counted() {
        let mut m = Mem::default();
        let big = |n: u8| vec![n; crate::chunk::CHUNK_THRESHOLD as usize + 1];
        let (a, b) = (m.file("a.bin", big(1)), m.file("b.bin", big(2)));
        let ids = [a.id, b.id];
        let small = m.file("small.txt", b"small".to_vec());
        let root = m.dir("", vec![a, b, small.clone()]).id;
        let (built, _) = build_all(&m, root, Mode::Recursive, DEFAULT_MAX_PACK_BYTES);
        assert_eq!(built.unpacked, 2);
        assert_eq!(built.loose, ids.iter().map(|id| (*id, MemberKind::Blob)).collect::<Vec<_>>());
        assert_eq!(built.index.member_count(), 1);
        assert_eq!(built.index.packs[0].members[0].id, small.id);
    }

    /// Tiny files far under the byte cap still make packs of at most
    /// MAX_PACK_MEMBERS members, each member once, in walk order.
    #[test]
    fn a_pack_holds_at_most_max_pack_members_members_however_small() {
        let mut m = Mem::default();
        let n = MAX_PACK_MEMBERS * 2 + 100;
        let mut dirs = Vec::new();
        for d in 0..4 {
            let files = (0..n / 4).map(|f| m.file(&format!("f{f:05}"), format!("{d}/{f}").into_bytes())).collect();
            dirs.push(m.dir(&format!("d{d}"), files));
        }
        let root = m.dir("", dirs).id;
        for mode in [Mode::Recursive, Mode::PerDir] {
            let (b, _) = build_all(&m, root, mode, DEFAULT_MAX_PACK_BYTES);
            assert!(b.index.packs.len() >= 3, "{mode:?}: {} packs", b.index.packs.len());
            assert!(b.index.packs.iter().all(|p| p.members.len() <= MAX_PACK_MEMBERS), "{mode:?}");
            let ids: Vec<Hash> = b.index.packs.iter().flat_map(|p| p.members.iter().map(|m| m.id)).collect();
            assert_eq!(ids.len(), n, "{mode:?}: every file once");
            let walk: Vec<Hash> =
                (0..4).flat_map(|d| (0..n / 4).map(move |f| Hash::of(format!("{d}/{f}").as_bytes()))).collect();
            assert_eq!(ids, walk, "{mode:?}: in walk order");
        }
    }

    #[test]
    fn recursive_packs_a_thin_tree_into_one_pack_and_round_trips() {
        let mut m = Mem::default();
        let root = thin(&mut m);
        let (b, packs) = build_all(&m, root, Mode::Recursive, DEFAULT_MAX_PACK_BYTES);
        assert_eq!(b.index.packs.len(), 1);
        assert_eq!(b.index.member_count(), 121);
        assert_eq!(b.index.dirs, 45);
        assert_eq!(b.index.trees.len(), 45);
        let enc = b.index.encode();
        assert_eq!(PackIndex::decode(&enc).unwrap(), b.index);
        // Every member decodes from its byte range alone.
        let p = &b.index.packs[0];
        let bytes = &packs[&p.id];
        assert_eq!(Hash::of(bytes), p.id);
        for mem in &p.members {
            let stored = &bytes[mem.offset as usize..(mem.offset + mem.stored_len) as usize];
            assert_eq!(decode_member(mem, stored).unwrap(), m.0[&mem.id]);
        }
        assert!(p.members.iter().any(|m| m.codec == Codec::Zstd), "repetitive text compresses");
        let (hl, hdr) = decode_pack_header(bytes).unwrap();
        assert_eq!((hl, hdr), (p.header_len, p.members.clone()));
    }

    #[test]
    fn cap_splits_in_name_order_and_per_dir_skips_sparse_dirs() {
        let mut m = Mem::default();
        let root = thin(&mut m);
        // Each d* subtree is ~3 × 200 bytes; a 2 KiB cap forces splits.
        let (b, _) = build_all(&m, root, Mode::Recursive, 2048);
        assert!(b.index.packs.len() > 1);
        // The cap holds for what a pack stores; its text compresses, so a
        // pack holds more than the cap before compression (consecutive
        // groups go together while they fit).
        let stored = |p: &PackEntry| p.members.iter().map(|x| x.stored_len).sum::<u64>();
        let raw = |p: &PackEntry| p.members.iter().map(|x| x.raw_len).sum::<u64>();
        assert!(b.index.packs.iter().all(|p| stored(p) <= 2048));
        assert!(b.index.packs.iter().any(|p| raw(p) > 2048), "compressed groups share a pack");
        // Members stay in walk (name) order across packs.
        let order: Vec<Hash> = b.index.packs.iter().flat_map(|p| p.members.iter().map(|x| x.id)).collect();
        let (one, _) = build_all(&m, root, Mode::Recursive, DEFAULT_MAX_PACK_BYTES);
        assert_eq!(order, one.index.packs[0].members.iter().map(|x| x.id).collect::<Vec<_>>());
        assert_eq!(b.index.member_count(), 121, "every small file is packed exactly once");
        // Per-directory: no directory has 8 files, so nothing is packed.
        let (v1, _) = build_all(&m, root, Mode::PerDir, DEFAULT_MAX_PACK_BYTES);
        assert_eq!(v1.index.packs.len(), 0);
        assert_eq!(v1.unpacked, 121);
    }

    #[test]
    fn building_is_deterministic() {
        let mut m = Mem::default();
        let root = thin(&mut m);
        let (a, _) = build_all(&m, root, Mode::Recursive, 4096);
        let (b, _) = build_all(&m, root, Mode::Recursive, 4096);
        assert_eq!(a.index.encode(), b.index.encode());
    }

    #[test]
    fn delta_packs_reuse_the_base_and_pack_only_new_members() {
        let mut m = Mem::default();
        let root = thin(&mut m);
        let (base, _) = build_all(&m, root, Mode::Recursive, DEFAULT_MAX_PACK_BYTES);
        // Change one file: a new root with one new blob.
        let t = Tree::decode(&m.0[&root]).unwrap();
        let mut entries = t.entries.clone();
        let readme = entries.iter_mut().find(|e| e.name == b"README").unwrap();
        let new = m.file("README", b"changed".to_vec());
        *readme = new;
        let root2 = m.dir("", entries).id;
        let mut emitted = Vec::new();
        let src = |id: &Hash| m.0.get(id).cloned().ok_or_else(|| Error::NotFound(id.to_hex()));
        let d = build_delta(root2, DEFAULT_MAX_PACK_BYTES, &base.index, None, &src, &mut |id, b| {
            emitted.push((id, b.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(emitted.len(), 1, "one new pack");
        assert_eq!(d.index.packs.len(), 2, "the base pack and the new one");
        assert_eq!(d.index.packs[1].members.len(), 1);
        assert!(emitted[0].1 < 200, "only the new member: {} bytes", emitted[0].1);
        assert_eq!(d.index.packs[0], base.index.packs[0]);
        assert_eq!(d.index.tree, root2);
        // New members past the cap start new packs, in walk order, each
        // member in one pack, no pack empty.
        let t = Tree::decode(&m.0[&root2]).unwrap();
        let mut entries = t.entries.clone();
        for i in 0..5 {
            entries.push(m.file(&format!("new{i}"), format!("new file {i} ").repeat(10).into_bytes()));
        }
        let root3 = m.dir("", entries).id;
        let src = |id: &Hash| m.0.get(id).cloned().ok_or_else(|| Error::NotFound(id.to_hex()));
        let d = build_delta(root3, 250, &base.index, None, &src, &mut |_, _| Ok(())).unwrap();
        let fresh: Vec<&PackEntry> = d.index.packs.iter().filter(|p| *p != &base.index.packs[0]).collect();
        let sizes: Vec<usize> = fresh.iter().map(|p| p.members.len()).collect();
        // README (7 bytes), then five of 120 bytes, while they fit in 250.
        assert_eq!(sizes, vec![3, 2, 1], "{sizes:?}");
    }

    /// A chunked file of `n` distinct chunks of `len` bytes (`tag` makes
    /// its bytes its own).
    fn chunked(m: &mut Mem, name: &str, tag: u8, n: usize, len: usize) -> Entry {
        let chunks: Vec<(u64, Option<Hash>)> = (0..n)
            .map(|i| (len as u64, Some(m.put(format!("{tag}:{i}:").repeat(len / 4).as_bytes()[..len].to_vec()))))
            .collect();
        let size = chunks.iter().map(|c| c.0).sum();
        let manifest = ChunkManifest { size, content: Some(Hash([tag; 32])), chunks };
        Entry { name: name.into(), kind: Kind::File, chunked: true, size, id: m.put(manifest.encode()) }
    }

    /// A file larger than the cap goes in packs of its own (nothing loose),
    /// its manifest then its chunks in file order, each pack at most
    /// min(cap, RUN_PACK_BYTES) of raw bytes; the plan's packs stay as
    /// they were. v1 leaves it loose. A delta build over it after an
    /// append keeps its packs and packs only the new members, apart.
    #[test]
    fn a_file_over_the_cap_is_packed_apart_in_runs_and_an_append_adds_a_small_run() {
        let mut m = Mem::default();
        let small = m.file("a.txt", b"small text file ".repeat(8));
        let big = chunked(&mut m, "big.bin", 1, 40, 1000);
        let other = chunked(&mut m, "mid.bin", 2, 3, 1000);
        let root = m.dir("", vec![small.clone(), big.clone(), other.clone()]).id;
        let cap = 8_000;
        let (b, out) = build_all(&m, root, Mode::Recursive, cap);
        assert!(b.loose.is_empty() && b.unpacked == 0, "nothing goes alone: {:?}", b.loose);
        let manifest = ChunkManifest::decode(&m.0[&big.id]).unwrap();
        let runs: Vec<&PackEntry> = b
            .index
            .packs
            .iter()
            .filter(|p| p.members.iter().any(|x| x.id == big.id || manifest.data_chunks().any(|c| c == x.id)))
            .collect();
        assert!(runs.iter().all(|p| is_run_pack(p)), "a run pack holds no blob");
        let order: Vec<Hash> = runs.iter().flat_map(|p| p.members.iter().map(|x| x.id)).collect();
        let want: Vec<Hash> = std::iter::once(big.id).chain(manifest.data_chunks()).collect();
        assert_eq!(order, want, "the manifest, then the chunks in file order, each once");
        for (k, p) in runs.iter().enumerate() {
            let raw: u64 = p.members.iter().map(|x| x.raw_len).sum();
            assert!(raw <= cap, "a run pack of {raw} raw bytes over the cap {cap}");
            assert!(k + 1 == runs.len() || raw + 1000 > cap, "runs are filled: {raw} bytes");
            let bytes = &out[&p.id];
            for x in &p.members {
                let got = decode_member(x, &bytes[x.offset as usize..(x.offset + x.stored_len) as usize]).unwrap();
                assert_eq!(got, m.0[&x.id]);
            }
        }
        // The small file and the file under the cap share the plan's pack.
        let planned: Vec<&PackEntry> = b.index.packs.iter().filter(|p| !runs.contains(p)).collect();
        assert_eq!(planned.len(), 1);
        assert!(
            planned[0].members.iter().any(|x| x.id == small.id) && planned[0].members.iter().any(|x| x.id == other.id)
        );
        // v1: the large file's members go alone, as before.
        let (v1, _) = build_all(&m, root, Mode::PerDir, cap);
        assert!(v1.loose.iter().any(|(id, k)| *id == big.id && *k == MemberKind::Manifest));
        assert_eq!(v1.loose.iter().filter(|(_, k)| *k == MemberKind::Chunk).count(), 43);
        // An append: a new last chunk and a new manifest.
        let mut grown = manifest.clone();
        let extra = m.put(b"appended bytes".to_vec());
        grown.chunks.push((14, Some(extra)));
        grown.size += 14;
        let big2 = Entry { size: grown.size, id: m.put(grown.encode()), ..big.clone() };
        let root2 = m.dir("", vec![small, big2.clone(), other]).id;
        let src = |id: &Hash| m.0.get(id).cloned().ok_or_else(|| Error::NotFound(id.to_hex()));
        let mut emitted = Vec::new();
        let d = build_delta(root2, cap, &b.index, None, &src, &mut |id, bytes| {
            emitted.push((id, bytes.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(emitted.len(), 1, "one new pack: {emitted:?}");
        let new = d.index.packs.iter().find(|p| p.id == emitted[0].0).unwrap();
        let ids: Vec<Hash> = new.members.iter().map(|x| x.id).collect();
        assert_eq!(ids, vec![big2.id, extra]);
        for p in &runs {
            assert!(d.index.packs.contains(p), "the file's packs stay in the index");
        }
        assert!(d.loose.is_empty());
    }

    /// What a delta build may absorb: each layer's size (trees and packs),
    /// the packs each brought, and the bottom layer's trees.
    #[test]
    fn absorb_lists_each_layers_size_packs_and_the_bottom_trees() {
        let top = index_with(3, &[12, 13], &[b"t4"], &[2, 1]);
        let mid = index_with(2, &[11], &[b"t3", b"t5", b"t6"], &[1]);
        let bottom = index_with(1, &[10], &[b"t1", b"t2"], &[]);
        let a = build::Absorb::of(&[top, mid, bottom]);
        assert_eq!(a.sizes, vec![3, 4, 3]);
        assert_eq!(a.packs, vec![vec![Hash([12; 32]), Hash([13; 32])], vec![Hash([11; 32])], vec![Hash([10; 32])]]);
        assert_eq!(a.bottom_trees, [Hash::of(b"t1"), Hash::of(b"t2")].into_iter().collect());
    }

    /// A layer's size also counts its foldable packs' bytes (one entry per
    /// 4 KiB), but not a pack kept whole when absorbed (1 MiB or more):
    /// folding a layer costs its small packs' bytes again, never the large
    /// ones'.
    #[test]
    fn absorb_weighs_a_layer_by_the_bytes_its_small_packs_would_send_again() {
        let sized = |mut l: PackIndex, sizes: &[u64]| {
            for (p, s) in l.packs.iter_mut().zip(sizes) {
                p.size = *s;
            }
            l
        };
        let small = sized(index_with(3, &[12], &[b"t4"], &[2, 1]), &[40 << 10]);
        let large = sized(index_with(2, &[11], &[b"t3"], &[1]), &[build::ABSORB_MAX_PACK_BYTES]);
        let just_under = sized(index_with(4, &[14], &[b"t7"], &[1]), &[build::ABSORB_MAX_PACK_BYTES - 1]);
        let bottom = index_with(1, &[10], &[b"t1", b"t2"], &[]);
        let a = build::Absorb::of(&[small, large, just_under, bottom]);
        let under = ((build::ABSORB_MAX_PACK_BYTES - 1) >> 12) as usize;
        assert_eq!(a.sizes, vec![2 + 10, 2, 2 + under, 3]);
    }

    /// A delta build over a layered base walks only what changed and what
    /// lies above the bottom layer; it must produce what the whole walk
    /// does: the same packs, placement, layer, and directory count. Edits:
    /// a changed file, a new directory, a removed one, a directory moved,
    /// one put back as the bottom had it, and a bottom subtree copied.
    #[test]
    fn a_partial_delta_build_matches_the_whole_walk() {
        let mut m = Mem::default();
        let root = thin(&mut m);
        let (bottom, _) = build_all(&m, root, Mode::Recursive, DEFAULT_MAX_PACK_BYTES);
        let tree = |m: &Mem, id: &Hash| Tree::decode(&m.0[id]).unwrap().entries;
        let top0 = tree(&m, &root);
        let p1_bottom = top0.iter().find(|e| e.name == b"p1").unwrap().clone();
        let mut parts = vec![bottom.index.clone()];
        let mut top = top0.clone();
        // The last step changes nearly every directory: the layer would not
        // be small, so the whole walk runs.
        for step in 0..13usize {
            let big = step == 12;
            // Edit `top`.
            let pi = step % 4;
            let name = format!("p{pi}");
            match step % 6 {
                _ if big => {
                    // New directories for 3/5 of the view's trees: a layer
                    // over half the view's size is written whole.
                    let n = parts.iter().map(|l| l.trees.len()).sum::<usize>() * 3 / 5;
                    let many = (0..n)
                        .map(|i| {
                            let f = m.file("big.txt", format!("big {i}").into_bytes());
                            m.dir(&format!("b{i:04}"), vec![f])
                        })
                        .collect();
                    top.push(m.dir("big", many));
                }
                0 | 3 => {
                    let i = top
                        .iter()
                        .position(|e| e.name == name.as_bytes())
                        .or_else(|| top.iter().position(|e| e.kind == Kind::Directory))
                        .unwrap();
                    let name = String::from_utf8(top[i].name.clone()).unwrap();
                    let mut mid = tree(&m, &top[i].id);
                    let k = step % mid.len();
                    let f = m.file("f0.txt", format!("edit {step}").into_bytes());
                    let dname = String::from_utf8(mid[k].name.clone()).unwrap();
                    mid[k].id = m.dir(&dname, vec![f]).id;
                    top[i] = m.dir(&name, mid);
                }
                1 => {
                    let f = m.file("n.txt", format!("new {step}").into_bytes());
                    // A submodule's commit: no member, in neither walk.
                    let sub = Entry {
                        name: b"sub".to_vec(),
                        kind: Kind::Gitlink,
                        chunked: false,
                        size: 0,
                        id: Hash([9; 32]),
                    };
                    let inner = m.dir("inner", vec![f, sub]);
                    top.push(m.dir(&format!("new{step}"), vec![inner]));
                }
                2 => top.retain(|e| !e.name.starts_with(b"new")),
                4 => {
                    let i = top.iter().position(|e| e.name == b"p2" || e.name.starts_with(b"moved")).unwrap();
                    let mut moved = top.remove(i);
                    moved.name = format!("moved{step}").into_bytes();
                    top.push(moved);
                }
                _ => {
                    top.retain(|e| e.name != b"p1");
                    top.push(p1_bottom.clone());
                    let mut copy = p1_bottom.clone();
                    copy.name = format!("copy{step}").into_bytes();
                    top.push(copy);
                }
            }
            let new_root = m.dir("", top.clone()).id;
            let view = parts[0].clone().merge(parts[1..].to_vec()).unwrap();
            let src = |id: &Hash| m.0.get(id).cloned().ok_or_else(|| Error::NotFound(id.to_hex()));
            let run = |absorb: &build::Absorb| {
                let mut out = Vec::new();
                let b = build_delta(new_root, DEFAULT_MAX_PACK_BYTES, &view, Some(absorb), &src, &mut |id, bytes| {
                    out.push((id, bytes));
                    Ok(())
                })
                .unwrap();
                (b, out)
            };
            let fast_absorb = build::Absorb::of(&parts);
            let mut whole_absorb = build::Absorb::of(&parts);
            whole_absorb.bottom_trees.clear();
            let (fast, fast_packs) = run(&fast_absorb);
            let (whole, whole_packs) = run(&whole_absorb);
            assert_eq!(fast.partial, !big, "step {step}: a small change walks partially, a big one whole");
            assert!(!whole.partial);
            assert_eq!(fast_packs, whole_packs, "step {step}: the same new packs");
            assert_eq!(fast.placed_at, whole.placed_at, "step {step}");
            let (full, _) = build_all(&m, new_root, Mode::Recursive, DEFAULT_MAX_PACK_BYTES);
            // Placed by the trees the view lacks.
            let in_view: HashSet<Hash> = view.trees.iter().map(|t| t.0).collect();
            let new_trees = full.index.trees.iter().filter(|t| !in_view.contains(&t.0)).count() + 1;
            let want = crate::object::compaction_point(&fast_absorb.sizes, new_trees, MAX_INDEX_LAYERS);
            assert_eq!(fast.placed_at, want, "step {step}: the placement");
            assert_eq!(fast.index.dirs, full.index.dirs, "step {step}: the directory count");
            assert_eq!(whole.index.dirs, full.index.dirs, "step {step}");
            let at = fast.placed_at;
            let lf = fast.index.layer_over_at(&parts, at, fast.partial.then_some(view.trees.len())).unwrap();
            let lw = whole.index.layer_over_at(&parts, at, None).unwrap();
            assert_eq!(lf, lw, "step {step}: the same layer");
            // Over the chain as a checkpoint has it (the bottom flat, read
            // in place): the same packs, place and layer, or no build
            // when the change is too large for a layer.
            let flats: Vec<std::sync::Arc<flat::FlatIndex>> = parts
                .iter()
                .map(|l| std::sync::Arc::new(flat::FlatIndex::from_bytes(flat::encode(l)).unwrap()))
                .collect();
            let fb = build::FlatBase::of(&flats).unwrap();
            assert_eq!(fb.layers(), parts.iter().map(|l| l.tree).collect::<Vec<_>>());
            let mut flat_packs = Vec::new();
            let fl = build::build_delta_flat(new_root, DEFAULT_MAX_PACK_BYTES, &fb, &src, &mut |id, bytes| {
                flat_packs.push((id, bytes));
                Ok(())
            })
            .unwrap();
            match fl {
                None => assert!(big, "step {step}: a small change builds over the flat base"),
                Some(fl) => {
                    assert!(!big, "step {step}: a big change is not built over the flat base");
                    assert_eq!(flat_packs, fast_packs, "step {step}: the same new packs over the flat base");
                    assert_eq!((fl.placed_at, fl.partial, fl.index.dirs), (at, true, full.index.dirs), "step {step}");
                    let ll = fl.index.layer_over_flat(&fb, at).unwrap();
                    assert_eq!(ll, lf, "step {step}: the same layer over the flat base");
                }
            }
            if big {
                break;
            }
            assert!(fast.index.trees.len() < whole.index.trees.len(), "step {step}: the fast walk read less");
            assert!(!lf.base.is_empty(), "step {step}: a layer");
            parts = std::iter::once(lf).chain(parts[at..].iter().cloned()).collect();
        }
    }

    /// If this fails, the pack encoding changed: bump PACK_VERSION.
    #[test]
    fn pack_golden_bytes() {
        let a = b"hello".to_vec();
        let (bytes, entry) = build_pack(&[(Hash::of(&a), MemberKind::Blob, &a)]);
        let hex: String = bytes.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex, format!("4d4144500101{}01000505{}", Hash::of(&a).to_hex(), "68656c6c6f"));
        assert_eq!(entry.header_len, 6 + 32 + 4);
    }

    #[test]
    fn hostile_indexes_are_refused() {
        let mut m = Mem::default();
        let root = thin(&mut m);
        let (b, _) = build_all(&m, root, Mode::Recursive, 4096);
        let enc = b.index.encode();
        for cut in 0..enc.len() {
            assert!(PackIndex::decode(&enc[..cut]).is_err());
        }
        // A member range past the end of its pack.
        let mut bad = b.index.clone();
        bad.packs[0].members[0].stored_len = bad.packs[0].size;
        assert!(PackIndex::decode(&bad.encode()).is_err());
        // A tree that does not match its id.
        let mut bad = b.index.clone();
        bad.trees[0].1.push(0);
        assert!(PackIndex::decode(&bad.encode()).is_err());
        // A claimed size beyond the limit.
        let mut huge = b"MADI\x01".to_vec();
        put_varint(&mut huge, u64::MAX);
        assert!(PackIndex::decode(&huge).is_err());
        // A member whose bytes do not match its id.
        let mem = Member {
            id: Hash([1; 32]),
            kind: MemberKind::Blob,
            codec: Codec::Raw,
            offset: 0,
            stored_len: 3,
            raw_len: 3,
        };
        assert!(decode_member(&mem, b"abc").is_err());
    }
}
