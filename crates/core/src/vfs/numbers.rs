//! The inode numbers of a workspace mount, kept on disk so that a daemon
//! started after another was killed (kill -9, a crash) can serve the
//! kernel's mount under the numbers the kernel already holds
//! ([`SnapshotFs::load_recovered`]). docs/FORMAT.md ("Inode numbers")
//! gives the bytes.
//!
//! Two parts, both in the workspace's state folder and neither fsynced
//! (a daemon's death keeps the page cache; a machine's ends the mount):
//!
//! - with each saved state, its [`InodeImage`] (`inodes-<sum>`, named for
//!   the state's checksum, so an image is only ever read with the state it
//!   was taken with), and where the log stood at that moment;
//! - a log (`inodes.log.<generation>`) of every change to the numbering
//!   since: a directory's children numbered (first number, count: the
//!   children of a tree are numbered in its order, so one record says
//!   it), a directory's children dropped (folded), a number given to a
//!   new node. Written under the table's lock, before the kernel can learn
//!   any number it records.
//!
//! A number is never given twice, so a record that cannot be replayed
//! leaves that number unknown (the kernel's use of it fails), never
//! pointing at another node.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::inode::{Body, State};
use super::saved::InodeImage;
use super::{SnapshotFs, ROOT_INO};
use crate::error::{Error, Result};
use crate::hash::Hash;

const IMAGE_MAGIC: &[u8; 4] = b"MADK";
const IMAGE_VERSION: u8 = 1;
const LOG_PREFIX: &str = "inodes.log.";
const IMAGE_PREFIX: &str = "inodes-";

/// Records of the log.
const REC_EXPAND: u8 = 1;
const REC_FOLD: u8 = 2;
const REC_INSERT: u8 = 3;
const REC_RENAME: u8 = 4;
const REC_REMOVE: u8 = 5;
const REC_LINK: u8 = 6;
const REC_COPY_UP: u8 = 7;
const REC_SETATTR: u8 = 8;
/// What a new node is, in its insert record.
const NEW_DIR: u8 = 0;
const NEW_UPPER: u8 = 1;
const NEW_LINK: u8 = 2;
const NEW_SPECIAL: u8 = 3;

/// A log this large starts a new generation at the next save.
const ROTATE_AT: u64 = 16 << 20;

/// How far numbering skips ahead after a log that could not be read whole.
const LOST_LOG_GAP: u64 = 1 << 40;

/// How many references a recovered node is taken to hold: more than the
/// kernel can ever forget, so no node it may know is dropped (they stay in
/// memory until the unmount).
pub(super) const RECOVERED_LOOKUPS: u64 = u64::MAX / 4;

/// Where the log stood: its generation and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPos {
    pub generation: u64,
    pub offset: u64,
}

/// The open log, held in the inode table's state.
pub(super) struct NumberLog {
    dir: PathBuf,
    file: std::fs::File,
    generation: u64,
    len: u64,
    /// A write failed: the log no longer tells every number, so no image
    /// is written any more and those on disk are gone.
    broken: bool,
}

fn log_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{LOG_PREFIX}{generation}"))
}

fn image_path(dir: &Path, state: &[u8]) -> PathBuf {
    let sum = &state[state.len().saturating_sub(32)..];
    let hex: String = sum.iter().take(12).map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{IMAGE_PREFIX}{hex}"))
}

/// The generations of the logs in `dir`, in order.
fn generations(dir: &Path) -> Vec<u64> {
    let mut g: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix(LOG_PREFIX)?.parse().ok())
        .collect();
    g.sort_unstable();
    g
}

fn remove_matching(dir: &Path, keep: impl Fn(&str) -> bool) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str() else { continue };
        if (n.starts_with(LOG_PREFIX) || n.starts_with(IMAGE_PREFIX)) && !keep(n) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl NumberLog {
    /// Opens a new generation in `dir`; with `fresh`, the numbers of an
    /// earlier mount (images and logs) are removed first.
    fn open(dir: &Path, fresh: bool) -> Result<NumberLog> {
        if fresh {
            remove_matching(dir, |_| false);
        }
        let generation = generations(dir).last().map_or(1, |g| g + 1);
        let path = log_path(dir, generation);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(Error::io(format!("opening {}", path.display())))?;
        Ok(NumberLog { dir: dir.to_path_buf(), file, generation, len: 0, broken: false })
    }

    fn put(&mut self, rec: &[u8]) {
        if self.broken {
            return;
        }
        match self.file.write_all(rec) {
            Ok(()) => self.len += rec.len() as u64,
            Err(e) => {
                tracing::error!(
                    "writing {}: {e}; a daemon started after this one is killed will not take the mount over",
                    log_path(&self.dir, self.generation).display()
                );
                self.broken = true;
                remove_matching(&self.dir, |n| n.starts_with(LOG_PREFIX));
            }
        }
    }

    fn record(&mut self, tag: u8, values: &[u64]) {
        let mut rec = Vec::with_capacity(1 + values.len() * 5);
        rec.push(tag);
        for v in values {
            crate::codec::put_varint(&mut rec, *v);
        }
        self.put(&rec);
    }

    /// Where the log stands now, to save with an image; a log grown large
    /// moves to a new generation first (the old one is removed once an
    /// image naming the new one is on disk).
    pub(super) fn pos(&mut self) -> Option<LogPos> {
        if self.broken {
            return None;
        }
        if self.len >= ROTATE_AT {
            if let Ok(next) = NumberLog::open(&self.dir, false) {
                *self = next;
            }
        }
        Some(LogPos { generation: self.generation, offset: self.len })
    }
}

impl State {
    /// Directory `dir`'s children got the numbers `first..first + count`.
    pub(super) fn log_expand(&mut self, dir: u64, first: u64, count: u64) {
        if let Some(l) = &mut self.log {
            l.record(REC_EXPAND, &[dir, first, count]);
        }
    }

    /// Directory `dir`'s children were dropped (folded).
    pub(super) fn log_fold(&mut self, dir: u64) {
        if let Some(l) = &mut self.log {
            l.record(REC_FOLD, &[dir]);
        }
    }

    /// Node `ino`, new, was named `name` in `parent`.
    pub(super) fn log_insert(&mut self, ino: u64, parent: u64, name: &[u8]) {
        let Some(n) = self.nodes.get(ino) else { return };
        let Some(l) = &mut self.log else { return };
        use crate::codec::{put_bytes, put_varint};
        let mut rec = vec![REC_INSERT];
        for v in [ino, parent] {
            put_varint(&mut rec, v);
        }
        put_bytes(&mut rec, name);
        put_varint(&mut rec, n.perm as u64);
        match &n.body {
            Body::Dir { .. } => rec.push(NEW_DIR),
            Body::Upper { blob, .. } => {
                rec.push(NEW_UPPER);
                put_varint(&mut rec, *blob);
            }
            Body::Link(t) => {
                rec.push(NEW_LINK);
                put_bytes(&mut rec, t);
            }
            Body::Special(k, rdev) => {
                rec.push(NEW_SPECIAL);
                rec.push(special_code(*k));
                put_varint(&mut rec, *rdev as u64);
            }
            Body::Lower(_) => return,
        }
        l.put(&rec);
    }

    /// `parent/name` moved to `new_parent/new_name`.
    pub(super) fn log_rename(&mut self, parent: u64, name: &[u8], new_parent: u64, new_name: &[u8]) {
        let Some(l) = &mut self.log else { return };
        let mut rec = vec![REC_RENAME];
        crate::codec::put_varint(&mut rec, parent);
        crate::codec::put_bytes(&mut rec, name);
        crate::codec::put_varint(&mut rec, new_parent);
        crate::codec::put_bytes(&mut rec, new_name);
        l.put(&rec);
    }

    /// `parent/name` was removed (`dir`: by rmdir).
    pub(super) fn log_remove(&mut self, parent: u64, name: &[u8], dir: bool) {
        let Some(l) = &mut self.log else { return };
        let mut rec = vec![REC_REMOVE];
        crate::codec::put_varint(&mut rec, parent);
        crate::codec::put_bytes(&mut rec, name);
        rec.push(dir as u8);
        l.put(&rec);
    }

    /// Lower file `ino`'s bytes went to `upper/<blob>` (to be written).
    pub(super) fn log_copy_up(&mut self, ino: u64, blob: u64) {
        if let Some(l) = &mut self.log {
            l.record(REC_COPY_UP, &[ino, blob]);
        }
    }

    /// Node `ino`'s attributes were set (its size is its upper file's
    /// length, never replayed: writes after a truncate would be cut).
    pub(super) fn log_setattr(&mut self, ino: u64, a: &super::SetAttr) {
        let Some(l) = &mut self.log else { return };
        use crate::codec::put_varint;
        let flags = a.mode.is_some() as u8
            | (a.mtime.is_some() as u8) << 1
            | (a.atime.is_some() as u8) << 2
            | (a.uid.is_some() as u8) << 3
            | (a.gid.is_some() as u8) << 4;
        if flags == 0 {
            return;
        }
        let mut rec = vec![REC_SETATTR];
        put_varint(&mut rec, ino);
        rec.push(flags);
        if let Some(m) = a.mode {
            put_varint(&mut rec, m as u64);
        }
        for (s, ns) in [a.mtime, a.atime].into_iter().flatten() {
            rec.extend_from_slice(&s.to_le_bytes());
            put_varint(&mut rec, ns as u64);
        }
        for id in [a.uid, a.gid].into_iter().flatten() {
            put_varint(&mut rec, id as u64);
        }
        l.put(&rec);
    }

    /// Node `ino` was named `new_parent/new_name` too (a hard link).
    pub(super) fn log_link(&mut self, ino: u64, new_parent: u64, new_name: &[u8]) {
        let Some(l) = &mut self.log else { return };
        let mut rec = vec![REC_LINK];
        crate::codec::put_varint(&mut rec, ino);
        crate::codec::put_varint(&mut rec, new_parent);
        crate::codec::put_bytes(&mut rec, new_name);
        l.put(&rec);
    }
}

/// A FIFO (0), socket (1), block (2) or character device (3) in a record.
fn special_code(k: super::NodeKind) -> u8 {
    use super::NodeKind::*;
    match k {
        Socket => 1,
        BlockDev => 2,
        CharDev => 3,
        _ => 0,
    }
}

fn special_kind(code: u8) -> Option<super::NodeKind> {
    use super::NodeKind::*;
    Some(match code {
        0 => Fifo,
        1 => Socket,
        2 => BlockDev,
        3 => CharDev,
        _ => return None,
    })
}

/// A new node's body in an insert record.
#[derive(Clone, Debug, PartialEq, Eq)]
enum New {
    Dir,
    Upper(u64),
    Link(Vec<u8>),
    Special(u8, u32),
}

/// One record of a log, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Rec {
    Expand { dir: u64, first: u64, count: u64 },
    Fold { dir: u64 },
    Insert { ino: u64, parent: u64, name: Vec<u8>, perm: u16, new: New },
    Rename { parent: u64, name: Vec<u8>, new_parent: u64, new_name: Vec<u8> },
    Remove { parent: u64, name: Vec<u8>, dir: bool },
    Link { ino: u64, new_parent: u64, new_name: Vec<u8> },
    CopyUp { ino: u64, blob: u64 },
    SetAttr { ino: u64, attr: super::SetAttr },
}

fn read_setattr(r: &mut crate::codec::Reader) -> std::result::Result<Rec, crate::codec::DecodeError> {
    use crate::codec::DecodeError;
    let ino = r.varint()?;
    let flags = r.u8()?;
    if flags & !31 != 0 {
        return Err(DecodeError::Invalid(format!("setattr flags {flags}")));
    }
    let small = |v: u64| u32::try_from(v).map_err(|_| DecodeError::Invalid(format!("{v} out of range")));
    let mut a = super::SetAttr::default();
    if flags & 1 != 0 {
        a.mode = Some(small(r.varint()?)?);
    }
    for (bit, t) in [(2u8, &mut a.mtime), (4, &mut a.atime)] {
        if flags & bit != 0 {
            let s = r.i64_le()?;
            let ns = small(r.varint()?)?;
            if ns >= 1_000_000_000 {
                return Err(DecodeError::Invalid(format!("nanoseconds {ns}")));
            }
            *t = Some((s, ns));
        }
    }
    for (bit, id) in [(8u8, &mut a.uid), (16, &mut a.gid)] {
        if flags & bit != 0 {
            *id = Some(small(r.varint()?)?);
        }
    }
    Ok(Rec::SetAttr { ino, attr: a })
}

/// The records of a log's bytes; a record cut short at the end (a daemon
/// killed inside a write) ends it. A damaged one ends it too, and says so.
fn records(bytes: &[u8]) -> (Vec<Rec>, Option<String>) {
    let mut r = crate::codec::Reader::new(bytes);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let one = (|| {
            Ok::<_, crate::codec::DecodeError>(match r.u8()? {
                REC_EXPAND => Rec::Expand { dir: r.varint()?, first: r.varint()?, count: r.varint()? },
                REC_FOLD => Rec::Fold { dir: r.varint()? },
                REC_INSERT => {
                    let (ino, parent, name) = (r.varint()?, r.varint()?, r.bytes()?.to_vec());
                    let perm = (r.varint()? & 0o7777) as u16;
                    let new = match r.u8()? {
                        NEW_DIR => New::Dir,
                        NEW_UPPER => New::Upper(r.varint()?),
                        NEW_LINK => New::Link(r.bytes()?.to_vec()),
                        NEW_SPECIAL => {
                            let k = r.u8()?;
                            let rdev = u32::try_from(r.varint()?)
                                .map_err(|_| crate::codec::DecodeError::Invalid("device number".into()))?;
                            New::Special(k, rdev)
                        }
                        t => return Err(crate::codec::DecodeError::Invalid(format!("new node kind {t}"))),
                    };
                    Rec::Insert { ino, parent, name, perm, new }
                }
                REC_RENAME => Rec::Rename {
                    parent: r.varint()?,
                    name: r.bytes()?.to_vec(),
                    new_parent: r.varint()?,
                    new_name: r.bytes()?.to_vec(),
                },
                REC_REMOVE => Rec::Remove { parent: r.varint()?, name: r.bytes()?.to_vec(), dir: r.u8()? != 0 },
                REC_LINK => Rec::Link { ino: r.varint()?, new_parent: r.varint()?, new_name: r.bytes()?.to_vec() },
                REC_COPY_UP => Rec::CopyUp { ino: r.varint()?, blob: r.varint()? },
                REC_SETATTR => read_setattr(&mut r)?,
                t => return Err(crate::codec::DecodeError::Invalid(format!("record type {t}"))),
            })
        })();
        match one {
            Ok(rec) => out.push(rec),
            Err(crate::codec::DecodeError::Truncated(_)) => break,
            Err(e) => {
                let why = format!("record {} is damaged: {e}", out.len() + 1);
                return (out, Some(why));
            }
        }
    }
    (out, None)
}

/// An image file's bytes: `MADK`, version, the state's checksum, the log's
/// generation and offset, the image, then a checksum of all before it.
fn encode_image(state: &[u8], image: &InodeImage, pos: LogPos) -> Vec<u8> {
    let mut out = IMAGE_MAGIC.to_vec();
    out.push(IMAGE_VERSION);
    out.extend_from_slice(&state[state.len().saturating_sub(32)..]);
    crate::codec::put_varint(&mut out, pos.generation);
    crate::codec::put_varint(&mut out, pos.offset);
    out.extend_from_slice(&image.encode());
    let sum = Hash::of(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

fn decode_image(bytes: &[u8], state: &[u8]) -> std::result::Result<(InodeImage, LogPos), String> {
    if bytes.len() < 4 + 1 + 32 + 32 || &bytes[..4] != IMAGE_MAGIC {
        return Err("not an inode image".into());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if Hash::of(body).as_bytes() != sum {
        return Err("checksum mismatch: the file is torn or corrupt".into());
    }
    if body[4] != IMAGE_VERSION {
        return Err(format!("version {} (this mado reads {IMAGE_VERSION})", body[4]));
    }
    if body[5..37] != state[state.len().saturating_sub(32)..] {
        return Err("it was taken with another state".into());
    }
    let mut r = crate::codec::Reader::new(&body[37..]);
    let generation = r.varint().map_err(|e| e.to_string())?;
    let offset = r.varint().map_err(|e| e.to_string())?;
    let rest = r.take(r.remaining()).map_err(|e| e.to_string())?;
    let image = InodeImage::decode(rest).map_err(|e| e.to_string())?;
    Ok((image, LogPos { generation, offset }))
}

/// Writes the image taken with saved state `state` into `dir` (before the
/// state itself is put in place, so the state on disk always has its
/// image); not fsynced.
pub(crate) fn write_image(dir: &Path, state: &[u8], image: &InodeImage, pos: LogPos) -> Result<()> {
    crate::fsutil::replace_cache_file(&image_path(dir, state), &encode_image(state, image, pos))
}

/// Once state `state` is in place: the images of other states and the
/// logs before `pos`'s generation go.
pub(crate) fn drop_older_numbers(dir: &Path, state: &[u8], pos: LogPos) {
    let keep = image_path(dir, state);
    let keep = keep.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    remove_matching(dir, |n| match n.strip_prefix(LOG_PREFIX) {
        Some(g) => g.parse::<u64>().is_ok_and(|g| g >= pos.generation),
        None => n == keep,
    });
}

impl SnapshotFs {
    /// Keeps this mount's inode numbers in `dir` from now on (see the
    /// module's comment); with `fresh`, those of an earlier mount are
    /// removed first (a mount that numbers its nodes anew).
    pub fn keep_numbers(&self, dir: &Path, fresh: bool) -> Result<()> {
        let log = NumberLog::open(dir, fresh)?;
        self.st_mut().log = Some(log);
        Ok(())
    }

    /// Whether [`SnapshotFs::keep_numbers`] is on (and its log whole).
    pub fn keeps_numbers(&self) -> bool {
        self.st().log.as_ref().is_some_and(|l| !l.broken)
    }

    /// [`SnapshotFs::save_state_and_inodes`], and where the number log
    /// stood, all taken together; `None` for the last when no number is
    /// kept.
    pub fn save_state_numbered(&self) -> Result<(Vec<u8>, InodeImage, Option<LogPos>)> {
        let mut image = InodeImage::default();
        let mut pos = None;
        let bytes = self.encode_state(Some(&mut image), Some(&mut pos))?;
        Ok((bytes, image, pos))
    }

    /// Restores a mount whose daemon was killed while the kernel kept the
    /// mount: state `bytes` under the numbers saved with it (its image in
    /// `dir`), then the log since replayed, so every number the kernel may
    /// hold names the node it named (but for changes after the last save,
    /// which a killed daemon loses anyway). Fails when `dir` has no image
    /// of this state.
    pub async fn load_recovered(
        fetcher: std::sync::Arc<crate::fetch::Fetcher>,
        bytes: &[u8],
        upper_dir: PathBuf,
        base_stat: Option<(Hash, super::BaseTimes)>,
        dir: &Path,
    ) -> Result<SnapshotFs> {
        let path = image_path(dir, bytes);
        let no_image = |detail: String| Error::LocalState { path: path.display().to_string(), detail };
        let raw = std::fs::read(&path).map_err(|e| no_image(format!("no inode numbers saved with the state: {e}")))?;
        let (mut image, pos) = decode_image(&raw, bytes).map_err(no_image)?;
        for n in &mut image.nodes {
            n.1 = RECOVERED_LOOKUPS;
        }
        let fs = SnapshotFs::load_numbered(fetcher, bytes, upper_dir, base_stat, Some(&image), true)?;
        let mut log = Vec::new();
        let gens = generations(dir);
        // Numbers the log would have told of may be lost (its file gone or
        // damaged): numbering then starts far above any it could hold, so
        // none is given twice; the nodes it named are unknown.
        let mut whole = gens.contains(&pos.generation);
        for g in gens.into_iter().filter(|g| *g >= pos.generation) {
            let b = std::fs::read(log_path(dir, g))
                .map_err(Error::io(format!("reading {}", log_path(dir, g).display())))?;
            let from = if g == pos.generation { (pos.offset as usize).min(b.len()) } else { 0 };
            let (r, damaged) = records(&b[from..]);
            log.extend(r);
            if let Some(e) = damaged {
                tracing::warn!("{}: {e}; replayed up to there", log_path(dir, g).display());
                whole = false;
                break;
            }
        }
        fs.replay(log).await;
        if !whole {
            let mut st = fs.st_mut();
            st.next_ino = st.next_ino.saturating_add(LOST_LOG_GAP);
        }
        let next_blob = SnapshotFs::saved_header(bytes)?.0.next_blob;
        super::saved::drop_unnamed_uppers(&fs.st(), &fs.upper_dir()?, next_blob);
        Ok(fs)
    }

    /// Applies the log's records to the table just loaded.
    async fn replay(&self, log: Vec<Rec>) {
        let mut high = self.st().next_ino;
        let (mut done, mut skipped) = (0usize, 0usize);
        for rec in log {
            let ok = match rec {
                Rec::Insert { ino, parent, name, perm, new } => {
                    high = high.max(ino + 1);
                    self.replay_insert(ino, parent, &name, perm, new).await
                }
                // Through the operations themselves: each does to the
                // table what it did to the killed daemon's.
                Rec::Rename { parent, name, new_parent, new_name } => {
                    self.rename(parent, &name, new_parent, &new_name, false).await.is_ok()
                }
                Rec::Remove { parent, name, dir } => match dir {
                    true => self.rmdir(parent, &name).await.is_ok(),
                    false => self.unlink(parent, &name).await.is_ok(),
                },
                Rec::Link { ino, new_parent, new_name } => self.link(ino, new_parent, &new_name).await.is_ok(),
                Rec::CopyUp { ino, blob } => self.replay_copy_up(ino, blob),
                Rec::SetAttr { ino, attr } => self.setattr(ino, attr).await.is_ok(),
                Rec::Fold { dir } => self.replay_fold(dir),
                Rec::Expand { dir, first, count } => {
                    high = high.max(first + count);
                    self.replay_expand(dir, first, count).await
                }
            };
            if ok {
                done += 1;
            } else {
                skipped += 1;
            }
        }
        let mut st = self.st_mut();
        st.next_ino = st.next_ino.max(high);
        tracing::info!("replayed {done} inode number records ({skipped} no longer apply)");
    }

    fn replay_fold(&self, dir: u64) -> bool {
        let mut st = self.st_mut();
        let Ok(super::inode::Node { body: Body::Dir { clean: Some(_), children: Some(kids), .. }, .. }) = st.get(dir)
        else {
            return false;
        };
        // What the killed daemon folded was idle then: leaves of the
        // snapshot, nothing changed (their lookups are the recovered ones).
        if !kids.values().all(|c| st.get(*c).is_ok_and(|n| n.is_plain_leaf())) {
            return false;
        }
        st.fold(dir);
        true
    }

    /// A node made after the last save, made again under its number: a
    /// new file only while its upper file is there (its bytes are).
    async fn replay_insert(&self, ino: u64, parent: u64, name: &[u8], perm: u16, new: New) -> bool {
        if self.load(parent).await.is_err() || crate::object::check_name(name).is_err() {
            return false;
        }
        let body = match new {
            New::Dir => Body::Dir { clean: None, origin: None, children: Some(Box::default()) },
            New::Link(t) => Body::Link(t.into()),
            New::Special(k, rdev) => match special_kind(k) {
                Some(k) => Body::Special(k, rdev),
                None => return false,
            },
            New::Upper(blob) => {
                let Ok(p) = self.blob_path(blob) else { return false };
                let Ok(m) = std::fs::symlink_metadata(&p) else { return false };
                Body::Upper { blob, size: m.len(), clean: None }
            }
        };
        let mut st = self.st_mut();
        if st.nodes.get(ino).is_some() || !matches!(st.children(parent), Ok(Some(c)) if !c.contains_key(name)) {
            return false;
        }
        if let Body::Upper { blob, .. } = body {
            st.next_blob = st.next_blob.max(blob + 1);
            st.spare.retain(|(b, _)| *b != blob);
        }
        let name: super::inode::Name = name.into();
        let mut node = super::inode::Node::new(parent, name.clone(), perm, super::now(), body);
        node.lookups.set(RECOVERED_LOOKUPS);
        st.nodes.insert(ino, node);
        if let Ok(c) = st.children_mut(parent) {
            c.insert(name, ino);
        }
        st.touch_dir(parent);
        drop(st);
        self.changed();
        true
    }

    /// A lower file copied up after the last save: its node takes the
    /// upper file, whatever was written to it since (re-hashed at the next
    /// checkpoint).
    fn replay_copy_up(&self, ino: u64, blob: u64) -> bool {
        let Ok(p) = self.blob_path(blob) else { return false };
        let Ok(m) = std::fs::symlink_metadata(&p) else { return false };
        let mut st = self.st_mut();
        match st.nodes.get_mut(ino) {
            Some(n) if matches!(n.body, Body::Lower(_)) => {
                n.body = Body::Upper { blob, size: m.len(), clean: None };
            }
            _ => return false,
        }
        st.next_blob = st.next_blob.max(blob + 1);
        st.spare.retain(|(b, _)| *b != blob);
        st.dirty(ino);
        drop(st);
        self.changed();
        true
    }

    async fn replay_expand(&self, dir: u64, first: u64, count: u64) -> bool {
        let (id, name) = {
            let st = self.st();
            match st.get(dir) {
                Ok(n) => match &n.body {
                    Body::Dir { clean: Some(id), children: None, .. } => {
                        (*id, String::from_utf8_lossy(&n.name).into_owned())
                    }
                    _ => return false,
                },
                Err(_) => return false,
            }
        };
        let Ok(tree) = self.tree_by_id(id, &name).await else { return false };
        if tree.entries.len() as u64 != count || first <= ROOT_INO {
            return false;
        }
        let mut st = self.st_mut();
        // Still unexpanded (nothing else runs yet), and the numbers free.
        if !matches!(st.get(dir).map(|n| &n.body), Ok(Body::Dir { children: None, .. }))
            || (first..first + count).any(|i| st.nodes.get(i).is_some())
        {
            return false;
        }
        let next = st.next_ino;
        st.next_ino = first;
        self.expand(&mut st, dir, &tree);
        st.next_ino = next.max(first + count);
        for i in first..first + count {
            if let Some(n) = st.nodes.get_mut(i) {
                n.lookups.set(RECOVERED_LOOKUPS);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::hundred_files as workspace;
    use super::*;

    /// What `workspace::save_mount_state` does with a mount that keeps its
    /// numbers; the state's bytes.
    fn save(fs: &SnapshotFs, dir: &Path) -> Vec<u8> {
        let (bytes, image, pos) = fs.save_state_numbered().unwrap();
        write_image(dir, &bytes, &image, pos.expect("numbers are kept")).unwrap();
        drop_older_numbers(dir, &bytes, pos.unwrap());
        bytes
    }

    /// After a kill, every number the kernel may hold names what it named,
    /// numbers given after the last save included (a directory looked
    /// into, folded and looked into again), and the changes made since
    /// are made again: a directory and a file made (with its bytes), a
    /// rename, an unlink. No number is given twice.
    #[tokio::test]
    async fn a_killed_mounts_numbers_come_back_from_its_image_and_log() {
        let d = tempfile::tempdir().unwrap();
        let sd = d.path().join("state");
        std::fs::create_dir(&sd).unwrap();
        let fs = workspace(d.path());
        fs.keep_numbers(&sd, true).unwrap();
        let dir = fs.lookup_counted(ROOT_INO, b"dir").await.unwrap().ino;
        let saved = save(&fs, &sd);
        // After the save: the directory's children numbered, all
        // forgotten (folded), numbered again; one held, one made.
        let first = fs.readdir(dir).await.unwrap();
        for (_, a) in &first {
            fs.note_lookup(a.ino, 1);
        }
        for (_, a) in &first {
            fs.forget(a.ino, 1);
        }
        let held = fs.lookup_counted(dir, b"f7").await.unwrap();
        assert!(first.iter().all(|(_, a)| a.ino < held.ino), "the directory was folded and numbered again");
        let made = fs.mkdir(ROOT_INO, b"made", 0o755).await.unwrap();
        let (file, h) = fs.create(made.ino, b"new.txt", 0o644).await.unwrap();
        fs.write(&h, 0, b"abc").unwrap();
        fs.rename(made.ino, b"new.txt", made.ino, b"renamed.txt", false).await.unwrap();
        fs.unlink(dir, b"f3").await.unwrap();
        // A lower file written (copied up) and one chmod'ed.
        let f6 = fs.lookup(dir, b"f6").await.unwrap().ino;
        let w = fs.open_for_write(f6).await.unwrap();
        fs.write(&w, 7, b"X").unwrap();
        let f5 = fs.lookup(dir, b"f5").await.unwrap().ino;
        fs.setattr(f5, super::super::SetAttr { mode: Some(0o600), ..Default::default() }).await.unwrap();

        let upper = d.path().join("upper");
        let plain = SnapshotFs::load_state(fs.fetcher().clone(), &saved, upper.clone(), None).unwrap();
        assert_ne!(plain.lookup(dir, b"f7").await.map(|a| a.ino).ok(), Some(held.ino), "this test shows nothing");

        let back = SnapshotFs::load_recovered(fs.fetcher().clone(), &saved, upper.clone(), None, &sd).await.unwrap();
        assert_eq!(back.getattr(held.ino).unwrap().size, 7, "the held file, by its number alone");
        assert_eq!(back.lookup(dir, b"f7").await.unwrap().ino, held.ino);
        assert_eq!(back.lookup(dir, b"f0").await.unwrap().ino, fs.lookup(dir, b"f0").await.unwrap().ino);
        assert!(back.getattr(first[0].1.ino).is_err(), "a folded number names nothing");
        assert_eq!(back.lookup(ROOT_INO, b"made").await.unwrap().ino, made.ino, "made after the save, made again");
        let again = back.lookup(made.ino, b"renamed.txt").await.unwrap();
        assert_eq!((again.ino, again.size), (file.ino, 3), "a new file, renamed, with its bytes");
        let r = back.open(file.ino).await.unwrap();
        assert_eq!(&back.read(&r, 0, 16).await.unwrap()[..], b"abc");
        assert!(back.lookup(made.ino, b"new.txt").await.is_err(), "the rename came through");
        assert!(back.lookup(dir, b"f3").await.is_err(), "the unlink came through");
        let r = back.open(f6).await.unwrap();
        assert_eq!(&back.read(&r, 0, 16).await.unwrap()[..], b"contentX", "a write to a copied-up file");
        assert_eq!(back.getattr(f5).unwrap().perm, 0o600, "a chmod");
        let n = back.mkdir(ROOT_INO, b"new", 0o755).await.unwrap();
        assert!(n.ino > file.ino, "number {} given twice", n.ino);
        // A node the kernel may hold is never dropped.
        back.forget(held.ino, 1000);
        assert!(back.getattr(held.ino).is_ok());

        // A log gone: its numbers are unknown, and numbering starts far
        // above any it could have given.
        let logs: Vec<_> = std::fs::read_dir(&sd)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(LOG_PREFIX))
            .collect();
        let hidden = d.path().join("hidden");
        std::fs::create_dir(&hidden).unwrap();
        for p in &logs {
            std::fs::rename(p, hidden.join(p.file_name().unwrap())).unwrap();
        }
        let blind = SnapshotFs::load_recovered(fs.fetcher().clone(), &saved, upper.clone(), None, &sd).await.unwrap();
        assert!(blind.getattr(held.ino).is_err());
        assert!(blind.mkdir(ROOT_INO, b"n2", 0o755).await.unwrap().ino > LOST_LOG_GAP);
        for p in &logs {
            std::fs::rename(hidden.join(p.file_name().unwrap()), p).unwrap();
        }
        // Only the image taken with a state is used with it.
        fs.mkdir(ROOT_INO, b"later", 0o755).await.unwrap();
        let unsaved = fs.save_state().unwrap();
        let e = SnapshotFs::load_recovered(fs.fetcher().clone(), &unsaved, upper.clone(), None, &sd).await.err();
        assert!(e.is_some_and(|e| e.to_string().contains("no inode numbers")));
        // A fresh mount's numbering removes the old one.
        fs.keep_numbers(&sd, true).unwrap();
        let e = SnapshotFs::load_recovered(fs.fetcher().clone(), &saved, upper, None, &sd).await.err();
        assert!(e.is_some(), "an image left from an earlier mount was used");
    }

    #[test]
    fn a_log_reads_back_its_records_and_stops_at_a_torn_one() {
        let mut b = vec![REC_EXPAND];
        for v in [2u64, 300, 7] {
            crate::codec::put_varint(&mut b, v);
        }
        b.extend_from_slice(&[REC_FOLD, 2, REC_INSERT, 0x80, 0x02, 1, 1, b'x', 0xa4, 0x03, NEW_UPPER, 9]);
        b.extend_from_slice(&[REC_REMOVE, 1, 1, b'y', 1]);
        let (whole, damaged) = records(&b);
        assert!(damaged.is_none());
        let x = Rec::Insert { ino: 256, parent: 1, name: b"x".to_vec(), perm: 0o644, new: New::Upper(9) };
        let y = Rec::Remove { parent: 1, name: b"y".to_vec(), dir: true };
        assert_eq!(whole, vec![Rec::Expand { dir: 2, first: 300, count: 7 }, Rec::Fold { dir: 2 }, x, y]);
        assert_eq!(records(&b[..b.len() - 1]), (whole[..3].to_vec(), None), "a torn last record is dropped");
        let mut bad = b.clone();
        bad.push(9);
        let (good, damaged) = records(&bad);
        assert_eq!(good.len(), 4, "the records before a damaged one are kept");
        assert!(damaged.is_some_and(|e| e.contains("record 5")));
    }

    #[test]
    fn an_image_is_read_only_with_the_state_it_was_taken_with() {
        let state = [7u8; 64];
        let image = InodeImage { nodes: vec![(1, 0), (5, 2)], next_ino: 9 };
        let pos = LogPos { generation: 3, offset: 44 };
        let b = encode_image(&state, &image, pos);
        assert_eq!(decode_image(&b, &state), Ok((image, pos)));
        let mut other = state;
        other[63] = 8;
        assert!(decode_image(&b, &other).unwrap_err().contains("another state"));
        let mut bad = b.clone();
        bad[6] ^= 1;
        assert!(decode_image(&bad, &state).unwrap_err().contains("checksum"));
        assert!(decode_image(&b[..20], &state).is_err());
    }
}
