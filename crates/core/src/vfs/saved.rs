//! The saved state of a workspace mount (`overlay.state`, format in
//! docs/FORMAT.md): what a restarted or killed daemon picks up.

use super::inode::{Body, Lower, Meta, Name, Node, State};
use super::{NodeKind, SnapshotFs, ROOT_INO};
use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::hash::{Hash, TreeId};
use crate::object::{check_name, Kind};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

// ---- The saved state of a read-write mount (`overlay.state`) ----
//
// Flat and checksummed (docs/FORMAT.md, "Overlay state"): one record per
// node in memory, parents before children, each naming its parent by
// record index, so no depth of directories can make it unreadable, and a
// torn or rotten file reads as corrupt, never as an empty overlay.

const OVERLAY_MAGIC: &[u8; 4] = b"MADV";
/// Version 3 added FIFO and socket records (REC_SPECIAL), version 4 hard
/// links (REC_ALIAS), version 5 device nodes (REC_SPECIAL kinds 2 and 3,
/// with a device number); older files (which cannot hold them) are read
/// as they are. A state with no device node is written as version 4, so
/// that an older mado still reads it.
const OVERLAY_VERSION: u8 = 4;
const OVERLAY_VERSION_5: u8 = 5;
const OVERLAY_VERSION_2: u8 = 2;
const OVERLAY_VERSION_3: u8 = 3;
/// Node bodies in the saved state.
const REC_DIR: u8 = 0;
const REC_LOWER: u8 = 1;
const REC_UPPER: u8 = 2;
const REC_LINK: u8 = 3;
const REC_SPECIAL: u8 = 4;
/// Another name of the node an earlier record made (a hard link): its
/// record index follows.
const REC_ALIAS: u8 = 5;
/// The numbers the kernel knows a mount's nodes by, taken with its saved
/// state ([`SnapshotFs::save_state_and_inodes`]): per record of the state,
/// in order, the node's inode number and the lookups the kernel holds on
/// it; and the next number to hand out. A node no name reaches (unlinked,
/// still open) is in no record: its number is not carried over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeImage {
    pub nodes: Vec<(u64, u64)>,
    pub next_ino: u64,
}

const IMAGE_MAGIC: &[u8; 4] = b"MADN";

impl InodeImage {
    /// `MADN`, the next number, the count, then each (number, lookups),
    /// all varints (docs/FORMAT.md, "Mount handover").
    pub fn encode(&self) -> Vec<u8> {
        use crate::codec::put_varint;
        let mut out = Vec::with_capacity(16 + self.nodes.len() * 6);
        out.extend_from_slice(IMAGE_MAGIC);
        put_varint(&mut out, self.next_ino);
        put_varint(&mut out, self.nodes.len() as u64);
        for (ino, lookups) in &self.nodes {
            put_varint(&mut out, *ino);
            put_varint(&mut out, *lookups);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<InodeImage> {
        let mut r = crate::codec::Reader::new(bytes);
        let image = (|| {
            r.magic(IMAGE_MAGIC)?;
            let next_ino = r.varint()?;
            let n = r.count(2)?;
            let mut nodes = Vec::with_capacity(n);
            for _ in 0..n {
                nodes.push((r.varint()?, r.varint()?));
            }
            r.finish()?;
            Ok::<_, crate::codec::DecodeError>(InodeImage { nodes, next_ino })
        })();
        image.map_err(image_err)
    }
}

fn put_opt_hash(out: &mut Vec<u8>, h: Option<Hash>) {
    match h {
        None => out.push(0),
        Some(h) => {
            out.push(1);
            out.extend_from_slice(h.as_bytes());
        }
    }
}

fn opt_hash(r: &mut crate::codec::Reader) -> std::result::Result<Option<Hash>, crate::codec::DecodeError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.hash()?)),
        f => Err(crate::codec::DecodeError::Invalid(format!("bad flag {f}"))),
    }
}

/// A node's owner and times beyond its mtime (version 4): a flag byte
/// (1 owner, 2 atime, 4 ctime), then those present.
fn put_meta(out: &mut Vec<u8>, m: Option<&Meta>) {
    use crate::codec::put_varint;
    let none = Meta::default();
    let m = m.unwrap_or(&none);
    let flags = m.owner.is_some() as u8 | (m.atime.is_some() as u8) << 1 | (m.ctime.is_some() as u8) << 2;
    out.push(flags);
    if let Some((uid, gid)) = m.owner {
        put_varint(out, uid as u64);
        put_varint(out, gid as u64);
    }
    for (s, ns) in [m.atime, m.ctime].into_iter().flatten() {
        out.extend_from_slice(&s.to_le_bytes());
        put_varint(out, ns as u64);
    }
}

fn read_meta(r: &mut crate::codec::Reader) -> std::result::Result<Option<Box<Meta>>, crate::codec::DecodeError> {
    use crate::codec::DecodeError;
    let flags = r.u8()?;
    if flags & !7 != 0 {
        return Err(DecodeError::Invalid(format!("bad meta flags {flags}")));
    }
    let mut m = Meta::default();
    if flags & 1 != 0 {
        let id = |v: u64| u32::try_from(v).map_err(|_| DecodeError::Invalid(format!("owner id {v} out of range")));
        m.owner = Some((id(r.varint()?)?, id(r.varint()?)?));
    }
    let mut time = |bit: u8| -> std::result::Result<Option<(i64, u32)>, DecodeError> {
        if flags & bit == 0 {
            return Ok(None);
        }
        let s = r.i64_le()?;
        let ns = r.varint()?;
        if ns >= 1_000_000_000 {
            return Err(DecodeError::Invalid(format!("nanoseconds {ns} out of range")));
        }
        Ok(Some((s, ns as u32)))
    };
    m.atime = time(2)?;
    m.ctime = time(4)?;
    Ok((m != Meta::default()).then(|| Box::new(m)))
}

/// One record of a saved state, as read: `body` is the node's, or
/// `Err(k)` for another name of the node record `k` made (a hard link).
struct Rec {
    parent: u64,
    name: Name,
    perm: u16,
    mtime: (i64, u32),
    meta: Option<Box<Meta>>,
    body: std::result::Result<Body, u64>,
}

fn read_record(r: &mut crate::codec::Reader, version: u8) -> std::result::Result<Rec, crate::codec::DecodeError> {
    use crate::codec::DecodeError;
    let parent = r.varint()?;
    let name: Name = r.bytes()?.into();
    let perm = r.varint()? as u16;
    let mtime = (r.i64_le()?, r.varint()? as u32);
    let meta = match version >= OVERLAY_VERSION {
        true => read_meta(r)?,
        false => None,
    };
    let body = match r.u8()? {
        REC_ALIAS => return Ok(Rec { parent, name, perm, mtime, meta, body: Err(r.varint()?) }),
        REC_DIR => {
            let clean = opt_hash(r)?;
            let origin = match r.u8()? {
                0 => None,
                1 => Some(r.bytes()?.into()),
                f => return Err(DecodeError::Invalid(format!("bad origin flag {f}"))),
            };
            let loaded = r.u8()? != 0;
            if !loaded && clean.is_none() {
                return Err(DecodeError::Invalid("an unloaded directory without a tree".into()));
            }
            Body::Dir { clean, origin, children: loaded.then(Box::default) }
        }
        REC_LOWER => {
            let k = r.u8()?;
            let kind = [Kind::File, Kind::Executable, Kind::Symlink, Kind::Directory, Kind::Gitlink]
                .into_iter()
                .find(|x| *x as u8 == k)
                .ok_or_else(|| DecodeError::Invalid(format!("unknown kind {k}")))?;
            let chunked = r.u8()? != 0;
            let size = r.varint()?;
            let id = r.hash()?;
            Body::Lower(Lower { kind, chunked, size, id })
        }
        REC_UPPER => Body::Upper { blob: r.varint()?, size: r.varint()?, clean: None },
        REC_LINK => Body::Link(r.bytes()?.into()),
        REC_SPECIAL => match r.u8()? {
            0 => Body::Special(NodeKind::Fifo, 0),
            1 => Body::Special(NodeKind::Socket, 0),
            k @ (2 | 3) if version >= OVERLAY_VERSION_5 => {
                let rdev = u32::try_from(r.varint()?)
                    .map_err(|_| DecodeError::Invalid("a device number out of range".into()))?;
                Body::Special(if k == 2 { NodeKind::BlockDev } else { NodeKind::CharDev }, rdev)
            }
            k => return Err(DecodeError::Invalid(format!("unknown special kind {k}"))),
        },
        t => return Err(DecodeError::Invalid(format!("unknown record type {t}"))),
    };
    Ok(Rec { parent, name, perm, mtime, meta, body: Ok(body) })
}

/// What a saved state holds that no checkpoint may have: a file whose
/// bytes are in the upper folder, a symlink, or a directory the mount
/// made, at its path from the root.
#[derive(Clone, Debug, PartialEq)]
pub enum SavedChange {
    /// Upper file `blob` (the upper folder's file of that number).
    File {
        path: Vec<u8>,
        blob: u64,
        perm: u16,
        mtime: (i64, u32),
    },
    Symlink {
        path: Vec<u8>,
        target: Vec<u8>,
    },
    /// A directory with no tree of the snapshot behind it (made by the mount).
    Dir {
        path: Vec<u8>,
        perm: u16,
    },
}

fn image_err(e: impl std::fmt::Display) -> Error {
    Error::LocalState { path: "the inode numbers a mount handed over".into(), detail: format!("unusable ({e})") }
}

fn state_err(e: impl std::fmt::Display) -> Error {
    Error::LocalState {
        path: "the saved state of this workspace mount".into(),
        detail: format!(
            "unreadable ({e}); its upper files are kept; \
             checkpoint from a backup of the state folder or remove it to start from the last checkpoint"
        ),
    }
}

/// The header of a saved state: what must be fetched before loading it.
pub(super) struct SavedHeader {
    version: u8,
    root: Hash,
    time: i64,
    base_stat: Option<Hash>,
    pub(super) next_blob: u64,
}

impl SnapshotFs {
    /// The state of a read-write mount, for [`SnapshotFs::load_state`].
    pub fn save_state(&self) -> Result<Vec<u8>> {
        self.encode_state(None, None)
    }

    /// [`SnapshotFs::save_state`], and the numbers the kernel knows its
    /// nodes by, taken together: for a daemon handing its mount to another
    /// process ([`SnapshotFs::load_handed_over`]).
    pub fn save_state_and_inodes(&self) -> Result<(Vec<u8>, InodeImage)> {
        let mut image = InodeImage::default();
        let bytes = self.encode_state(Some(&mut image), None)?;
        Ok((bytes, image))
    }

    pub(super) fn encode_state(
        &self,
        mut image: Option<&mut InodeImage>,
        log_pos: Option<&mut Option<super::numbers::LogPos>>,
    ) -> Result<Vec<u8>> {
        use crate::codec::{put_bytes, put_varint};
        let u = self.overlay()?;
        // The state lock first: root and base stat are leaves below it,
        // and a rebase changes all three under it. The number log's place
        // is taken just before (under the write lock: it may start a new
        // generation); what changes in between is in both the log and the
        // state, and its records no longer apply on a replay, or apply
        // again to the same effect (a fold, then the same expansion).
        if let Some(at) = log_pos {
            *at = self.st_mut().log.as_mut().and_then(|l| l.pos());
        }
        let st = self.st();
        let base_id = u.base.read().expect("base stat lock").id;
        let mut out = Vec::with_capacity(64 + st.nodes.len() * 64);
        out.extend_from_slice(OVERLAY_MAGIC);
        let devices =
            st.nodes.values().any(|n| matches!(n.body, Body::Special(NodeKind::BlockDev | NodeKind::CharDev, _)));
        out.push(if devices { OVERLAY_VERSION_5 } else { OVERLAY_VERSION });
        out.extend_from_slice(self.root().as_bytes());
        out.extend_from_slice(&self.time.to_le_bytes());
        put_opt_hash(&mut out, base_id);
        put_varint(&mut out, st.next_blob);
        // Pre-order, iteratively: (ino, index of its parent's record, the
        // name it has there).
        let mut records: Vec<(u64, u64, &[u8])> = Vec::new();
        let mut stack = vec![(ROOT_INO, 0u64, &st.get(ROOT_INO)?.name[..])];
        while let Some((ino, parent, name)) = stack.pop() {
            let me = records.len() as u64;
            records.push((ino, parent, name));
            if let Body::Dir { children: Some(c), .. } = &st.get(ino)?.body {
                stack.extend(c.iter().rev().map(|(name, k)| (*k, me, &name[..])));
            }
        }
        put_varint(&mut out, records.len() as u64);
        if let Some(im) = image.as_deref_mut() {
            im.next_ino = st.next_ino;
        }
        // A node with hard links is written once; its other names are
        // aliases of that record.
        let mut first: HashMap<u64, u64> = HashMap::new();
        for (i, (ino, parent, name)) in records.iter().enumerate() {
            let (ino, parent) = (*ino, *parent);
            let n = st.get(ino)?;
            if let Some(im) = image.as_deref_mut() {
                im.nodes.push((ino, n.lookups.get()));
            }
            put_varint(&mut out, parent);
            put_bytes(&mut out, name);
            put_varint(&mut out, n.perm as u64);
            let (secs, nanos) = n.mtime();
            out.extend_from_slice(&secs.to_le_bytes());
            put_varint(&mut out, nanos as u64);
            put_meta(&mut out, n.meta.as_deref());
            if !n.links().is_empty() {
                if let Some(at) = first.get(&ino) {
                    out.push(REC_ALIAS);
                    put_varint(&mut out, *at);
                    continue;
                }
                first.insert(ino, i as u64);
            }
            match &n.body {
                Body::Dir { clean, origin, children } => {
                    out.push(REC_DIR);
                    put_opt_hash(&mut out, *clean);
                    match origin {
                        None => out.push(0),
                        Some(o) => {
                            out.push(1);
                            put_bytes(&mut out, o);
                        }
                    }
                    out.push(children.is_some() as u8);
                }
                Body::Lower(e) => {
                    out.push(REC_LOWER);
                    out.push(e.kind as u8);
                    out.push(e.chunked as u8);
                    put_varint(&mut out, e.size);
                    out.extend_from_slice(e.id.as_bytes());
                }
                Body::Upper { blob, size, .. } => {
                    out.push(REC_UPPER);
                    put_varint(&mut out, *blob);
                    put_varint(&mut out, *size);
                }
                Body::Link(t) => {
                    out.push(REC_LINK);
                    put_bytes(&mut out, t);
                }
                Body::Special(k, rdev) => {
                    out.push(REC_SPECIAL);
                    match k {
                        NodeKind::Socket => out.push(1),
                        NodeKind::BlockDev | NodeKind::CharDev => {
                            out.push(if *k == NodeKind::BlockDev { 2 } else { 3 });
                            put_varint(&mut out, *rdev as u64);
                        }
                        _ => out.push(0),
                    }
                }
            }
        }
        let sum = Hash::of(&out);
        out.extend_from_slice(sum.as_bytes());
        Ok(out)
    }

    pub(super) fn saved_header(bytes: &[u8]) -> Result<(SavedHeader, crate::codec::Reader<'_>)> {
        if bytes.len() < 4 + 32 || !bytes.starts_with(OVERLAY_MAGIC) {
            return Err(state_err("not an overlay state"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if Hash::of(body).as_bytes() != sum {
            return Err(state_err("checksum mismatch: the file is torn or corrupt"));
        }
        let mut r = crate::codec::Reader::new(body);
        let h = (|| {
            r.magic(OVERLAY_MAGIC)?;
            let version = r.u8()?;
            if ![OVERLAY_VERSION_5, OVERLAY_VERSION, OVERLAY_VERSION_3, OVERLAY_VERSION_2].contains(&version) {
                return Err(crate::codec::DecodeError::Version {
                    format: "overlay state",
                    version,
                    supported: OVERLAY_VERSION_5,
                });
            }
            let root = r.hash()?;
            let time = r.i64_le()?;
            let base_stat = opt_hash(&mut r)?;
            let next_blob = r.varint()?;
            Ok::<_, crate::codec::DecodeError>(SavedHeader { version, root, time, base_stat, next_blob })
        })()
        .map_err(state_err)?;
        Ok((h, r))
    }

    /// The root tree of the snapshot a saved state's nodes were made on
    /// (its index must be attached before [`SnapshotFs::load_state`]).
    pub fn saved_root(bytes: &[u8]) -> Result<TreeId> {
        Ok(TreeId::from_hash(Self::saved_header(bytes)?.0.root))
    }

    /// The base stat object id a saved state refers to (to fetch it
    /// before [`SnapshotFs::load_state`]).
    pub fn saved_base_stat(bytes: &[u8]) -> Result<Option<Hash>> {
        Ok(Self::saved_header(bytes)?.0.base_stat)
    }

    /// What saved state `bytes` holds beyond the snapshot it was made on,
    /// read without that snapshot (which gc may have deleted): its upper
    /// files, symlinks and new directories, each at its path, parents
    /// before children. Removals and unchanged files are not in it.
    pub fn saved_changes(bytes: &[u8]) -> Result<Vec<SavedChange>> {
        let (h, mut r) = Self::saved_header(bytes)?;
        let n = r.count(16).map_err(state_err)?;
        // Record index -> its path, and whether it is a directory.
        let mut paths: Vec<(Vec<u8>, bool)> = Vec::with_capacity(n);
        let mut uppers: HashMap<u64, (u64, u16, (i64, u32))> = HashMap::new();
        let mut out = Vec::new();
        for i in 0..n {
            let Rec { parent, name, perm, mtime, body, .. } = read_record(&mut r, h.version).map_err(state_err)?;
            let path = if i == 0 {
                Vec::new()
            } else {
                let (p, is_dir) = paths
                    .get(parent as usize)
                    .ok_or_else(|| state_err(format!("record {i} names parent {parent}, not an earlier record")))?;
                if !is_dir {
                    return Err(state_err(format!("record {i}: its parent is not a directory")));
                }
                check_name(&name).map_err(state_err)?;
                if p.is_empty() {
                    name.to_vec()
                } else {
                    [&p[..], b"/", &name[..]].concat()
                }
            };
            let body = match body {
                Ok(b) => b,
                // Another name of a node: an upper file's bytes again.
                Err(of) => {
                    if let Some(&(blob, perm, mtime)) = uppers.get(&of) {
                        out.push(SavedChange::File { path: path.clone(), blob, perm, mtime });
                    }
                    paths.push((path, false));
                    continue;
                }
            };
            let is_dir = matches!(body, Body::Dir { .. });
            match body {
                Body::Upper { blob, .. } => {
                    uppers.insert(i as u64, (blob, perm, mtime));
                    out.push(SavedChange::File { path: path.clone(), blob, perm, mtime })
                }
                Body::Link(target) => out.push(SavedChange::Symlink { path: path.clone(), target: target.into_vec() }),
                Body::Dir { clean: None, origin: None, .. } if i > 0 => {
                    out.push(SavedChange::Dir { path: path.clone(), perm })
                }
                _ => {}
            }
            paths.push((path, is_dir));
        }
        r.finish().map_err(state_err)?;
        Ok(out)
    }

    /// Restores a read-write mount from its saved state. Files of the
    /// upper layer are re-hashed at the next checkpoint (a crash may have
    /// come between a write and the last save).
    pub fn load_state(
        fetcher: Arc<Fetcher>,
        bytes: &[u8],
        upper_dir: PathBuf,
        base_stat: Option<(Hash, super::BaseTimes)>,
    ) -> Result<SnapshotFs> {
        Self::load_numbered(fetcher, bytes, upper_dir, base_stat, None, false)
    }

    /// [`SnapshotFs::load_state`] of a state another process saved with
    /// [`SnapshotFs::save_state_and_inodes`] while the kernel kept its
    /// mount: every node under the number, and with the lookups, the
    /// kernel knows it by, so the kernel's references stay good.
    pub fn load_handed_over(
        fetcher: Arc<Fetcher>,
        bytes: &[u8],
        upper_dir: PathBuf,
        base_stat: Option<(Hash, super::BaseTimes)>,
        image: &InodeImage,
    ) -> Result<SnapshotFs> {
        Self::load_numbered(fetcher, bytes, upper_dir, base_stat, Some(image), false)
    }

    pub(super) fn load_numbered(
        fetcher: Arc<Fetcher>,
        bytes: &[u8],
        upper_dir: PathBuf,
        base_stat: Option<(Hash, super::BaseTimes)>,
        image: Option<&InodeImage>,
        keep_unnamed: bool,
    ) -> Result<SnapshotFs> {
        let (h, mut r) = Self::saved_header(bytes)?;
        let fs = SnapshotFs::writable(fetcher, TreeId::from_hash(h.root), h.time, upper_dir, base_stat)?;
        let mut st = State {
            nodes: Default::default(),
            next_ino: ROOT_INO,
            next_blob: h.next_blob,
            spare: Default::default(),
            shrunk: false,
            log: None,
        };
        let n = r.count(16).map_err(state_err)?;
        if let Some(im) = image {
            if im.nodes.len() != n || im.nodes.first().is_some_and(|(ino, _)| *ino != ROOT_INO) {
                return Err(image_err(format!("they name {} nodes, the state {n}", im.nodes.len())));
            }
        }
        // Where record `i` goes: the next number, or the one handed over.
        let place = |st: &mut State, i: usize, mut node: Node| -> Result<u64> {
            let Some(im) = image else { return Ok(st.push(node)) };
            let (ino, lookups) = im.nodes[i];
            if ino == 0 || ino >= im.next_ino || st.nodes.get(ino).is_some() {
                return Err(image_err(format!("record {i}: inode {ino} given twice or out of range")));
            }
            node.lookups.set(lookups);
            st.nodes.insert(ino, node);
            Ok(ino)
        };
        // Record index -> inode (records are numbered 0.., inodes 1..).
        let mut inos: Vec<u64> = Vec::with_capacity(n);
        let mut holders = Vec::new();
        for i in 0..n {
            let Rec { parent, name, perm, mtime, meta, body } = read_record(&mut r, h.version).map_err(state_err)?;
            let body = match body {
                Ok(b) => b,
                Err(of) => {
                    // A hard link: the node record `of` made, named here too.
                    let at = |k: u64| inos.get(k as usize).copied().filter(|_| (k as usize) < i);
                    let (Some(p), Some(ino)) = (at(parent), at(of)) else {
                        return Err(state_err(format!("record {i}: a link to a record that is not an earlier one")));
                    };
                    check_name(&name).map_err(state_err)?;
                    if Self::is_dir_body(&st.get(ino)?.body) || ino == ROOT_INO {
                        return Err(state_err(format!("record {i}: a link to a directory")));
                    }
                    match &mut st.get_mut(p)?.body {
                        Body::Dir { children: Some(c), .. } => {
                            if c.insert(name.clone(), ino).is_some() {
                                return Err(state_err(format!("record {i}: a name appears twice in one directory")));
                            }
                        }
                        _ => return Err(state_err(format!("record {i}: its parent is not a loaded directory"))),
                    }
                    st.get_mut(ino)?.meta_mut().links.push((p, name));
                    if matches!(st.get(ino)?.body, Body::Upper { .. }) {
                        holders.push(p);
                    }
                    // Records are numbered in order: this one names the node.
                    inos.push(ino);
                    continue;
                }
            };
            let is_upper = matches!(body, Body::Upper { .. });
            let ino = if i == 0 {
                st.next_ino = ROOT_INO;
                place(&mut st, i, Node::new(ROOT_INO, name, perm, mtime, body).with_meta(meta))?
            } else {
                let p = *inos
                    .get(parent as usize)
                    .filter(|_| (parent as usize) < i)
                    .ok_or_else(|| state_err(format!("record {i} names parent {parent}, not an earlier record")))?;
                check_name(&name).map_err(state_err)?;
                let ino = place(&mut st, i, Node::new(p, name.clone(), perm, mtime, body).with_meta(meta))?;
                match &mut st.get_mut(p)?.body {
                    Body::Dir { children: Some(c), .. } => {
                        if c.insert(name, ino).is_some() {
                            return Err(state_err(format!("record {i}: a name appears twice in one directory")));
                        }
                    }
                    _ => return Err(state_err(format!("record {i}: its parent is not a loaded directory"))),
                }
                if is_upper {
                    holders.push(p);
                }
                ino
            };
            inos.push(ino);
        }
        r.finish().map_err(state_err)?;
        if n == 0 {
            return Err(state_err("no root record"));
        }
        if let Some(im) = image {
            st.next_ino = im.next_ino;
        }
        // Every directory above an upper file is rebuilt at the next
        // checkpoint. The saved state keeps "changed directories only
        // below changed ones", so `dirty` may stop early here too.
        for h in holders {
            st.dirty(h);
        }
        // A recovered mount's log may name more upper files: it drops the
        // others once replayed (`drop_unnamed_uppers`).
        if !keep_unnamed {
            drop_unnamed_uppers(&st, &fs.upper_dir()?, h.next_blob);
        }
        let lost = reconcile_upper(&mut st, &fs.upper_dir()?)?;
        *fs.state.write().expect("state lock") = st;
        Ok(SnapshotFs { lost_on_load: lost, ..fs })
    }

    /// The paths a saved state named whose upper files were missing when it
    /// was loaded (removed from the workspace; see `reconcile_upper`).
    pub fn lost_on_load(&self) -> &[Vec<u8>] {
        &self.lost_on_load
    }
}

/// Upper files below `next_blob` (the saved state's) that no node names
/// are a killed daemon's spare or unlinked files (no one else uses the
/// folder: the mount lock is held): their space goes back now. Those from
/// `next_blob` on are taken over as new files.
pub(super) fn drop_unnamed_uppers(st: &State, upper: &Path, next_blob: u64) {
    let named: std::collections::HashSet<u64> = st
        .nodes
        .values()
        .filter_map(|n| match n.body {
            Body::Upper { blob, .. } => Some(blob),
            _ => None,
        })
        .collect();
    if let Ok(rd) = std::fs::read_dir(upper) {
        for e in rd.flatten() {
            let blob = e.file_name().to_str().and_then(|n| n.parse::<u64>().ok());
            if blob.is_some_and(|b| b < next_blob && !named.contains(&b)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// After a load: every upper file's node takes the file's length (a killed
/// daemon's last save may predate writes that reached the file: the
/// mount, a checkpoint and a resume then all show the file's bytes), and
/// a node whose upper file is missing (a damaged folder) loses its names,
/// which are returned, rather than becoming a file whose every read and
/// every checkpoint fails.
fn reconcile_upper(st: &mut State, upper_dir: &Path) -> Result<Vec<Vec<u8>>> {
    let uppers: Vec<(u64, u64)> = st
        .nodes
        .iter()
        .filter_map(|(ino, n)| match n.body {
            Body::Upper { blob, .. } => Some((ino, blob)),
            _ => None,
        })
        .collect();
    let mut lost = Vec::new();
    for (ino, blob) in uppers {
        let p = upper_dir.join(blob.to_string());
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() => {
                if let Body::Upper { size, clean, .. } = &mut st.get_mut(ino)?.body {
                    *size = m.len();
                    *clean = None;
                }
            }
            Ok(_) => return Err(state_err(format!("{} is not a regular file", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let n = st.get(ino)?.clone();
                for (parent, name) in std::iter::once((n.parent, n.name.clone())).chain(n.links().iter().cloned()) {
                    lost.push(path_in(st, parent, &name));
                    if let Ok(c) = st.children_mut(parent) {
                        c.remove(&name);
                    }
                    st.touch_dir(parent);
                }
                st.nodes.remove(ino);
            }
            Err(e) => return Err(Error::io(format!("reading {}", p.display()))(e)),
        }
    }
    lost.sort();
    Ok(lost)
}

/// The path of entry `name` of directory `dir`, from the root.
fn path_in(st: &State, mut dir: u64, name: &[u8]) -> Vec<u8> {
    let mut parts = vec![name.to_vec()];
    while dir != ROOT_INO {
        let Ok(n) = st.get(dir) else { break };
        parts.push(n.name.to_vec());
        dir = n.parent;
    }
    parts.reverse();
    parts.join(&b'/')
}
