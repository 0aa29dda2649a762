//! Packs kept whole in the cache: a fetched pack (or the span of it a walk
//! wanted) is one file, `packs/data/<pack>.pack`, holding the pack's own
//! bytes at their own offsets (sparse where nothing was fetched), and
//! `packs/data/<pack>.have` lists the members in it. A 3,000-file subtree
//! is then one sequential write of its compressed bytes, not 3,000 files
//! each through a temp file and a rename.
//!
//! - The `.have` record is written after the bytes it names, by a rename
//!   (no fsync), by the one process that holds the pack's lock.
//! - Every member read is verified (BLAKE3, through [`decode_member`]), so
//!   the record is only a hint: a hole, a torn write, a bit flip, a file
//!   truncated or replaced by a symlink fails verification, and the pack's
//!   two files are deleted (self-heal) and the read is a miss.
//! - A process keeps each pack file it read open (a bounded table), so a
//!   hit is one `pread`, and an eviction by another process only unlinks a
//!   file this one may still read (its bytes stay verified).

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::codec::{put_varint, DecodeError, Reader};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::pack::{decode_member, decode_member_vec, put_member_row, read_member_row, Member};

use super::DiskCache;

const HAVE_MAGIC: &[u8; 4] = b"MHAV";
const HAVE_VERSION: u8 = 1;
/// Open pack files one process keeps (each holds a descriptor and its
/// member table: 1 MiB at 16,384 members). A stat walk of a million files
/// lists every pack's first member once; with 256 kept, a mount daemon
/// held 170 MiB of these tables after it (issue #46).
const OPEN_PACKS: usize = 16;

/// One pack file as this process knows it.
pub(super) struct OpenPack {
    file: Arc<fs::File>,
    /// Sorted by id (a table of 16,384 rows as a hash map took 2.7 MiB).
    members: Vec<Member>,
    /// Length and mtime of the `.have` record it was read from.
    stamp: (u64, i64, i64),
}

/// A `.have` record's rows sorted by id, each id once (the last row of
/// an id counts, as it always did).
fn by_id(mut rows: Vec<Member>) -> Vec<Member> {
    rows.reverse();
    rows.sort_by_key(|m| m.id);
    rows.dedup_by_key(|m| m.id);
    rows.shrink_to_fit();
    rows
}

impl OpenPack {
    fn member(&self, id: &Hash) -> Option<Member> {
        self.members.binary_search_by(|m| m.id.cmp(id)).ok().map(|i| self.members[i])
    }
}

/// The packs a process keeps open, at most [`OPEN_PACKS`]: the one used
/// longest ago makes room for a new one (readers spread over more packs
/// than that open and decode only what they come back to after it went).
#[derive(Default)]
pub(super) struct OpenPacks {
    map: HashMap<Hash, (Arc<OpenPack>, u64)>,
    uses: u64,
}

impl OpenPacks {
    fn get(&mut self, id: &Hash) -> Option<Arc<OpenPack>> {
        self.uses += 1;
        let uses = self.uses;
        self.map.get_mut(id).map(|(p, used)| {
            *used = uses;
            p.clone()
        })
    }

    fn insert(&mut self, id: Hash, p: Arc<OpenPack>) {
        if self.map.len() >= OPEN_PACKS && !self.map.contains_key(&id) {
            if let Some(oldest) = self.map.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k) {
                self.map.remove(&oldest);
            }
        }
        self.uses += 1;
        self.map.insert(id, (p, self.uses));
    }

    pub(super) fn remove(&mut self, id: &Hash) {
        self.map.remove(id);
    }

    pub(super) fn clear(&mut self) {
        self.map = HashMap::new();
    }

    pub(super) fn contains_key(&self, id: &Hash) -> bool {
        self.map.contains_key(id)
    }
}

/// The `.have` record: magic, version, member rows, then the BLAKE3 of all
/// that (a torn record is detected, not trusted).
pub(crate) fn encode_have(rows: &[Member]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + rows.len() * 48);
    out.extend_from_slice(HAVE_MAGIC);
    out.push(HAVE_VERSION);
    put_varint(&mut out, rows.len() as u64);
    for m in rows {
        put_member_row(&mut out, m);
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

pub(crate) fn decode_have(buf: &[u8]) -> Result<Vec<Member>, DecodeError> {
    if buf.len() < 32 {
        return Err(DecodeError::Truncated(buf.len()));
    }
    let (body, sum) = buf.split_at(buf.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(DecodeError::Invalid("checksum mismatch (torn or rotten)".into()));
    }
    let mut r = Reader::new(body);
    r.magic(HAVE_MAGIC)?;
    r.version("pack presence record", HAVE_VERSION)?;
    let n = r.count(37)?;
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        rows.push(read_member_row(&mut r)?);
    }
    r.finish()?;
    Ok(rows)
}

fn stamp_of(m: &fs::Metadata) -> (u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (m.len(), m.mtime(), m.mtime_nsec())
}

/// A pack file being filled by the process holding the pack's lock.
/// Writes may run on several threads at once (each at its own offset).
pub struct PackWriter {
    pack: Hash,
    file: fs::File,
    written: std::sync::atomic::AtomicU64,
}

impl PackWriter {
    /// Writes `bytes` (the pack's bytes from `offset`) into the file.
    pub fn write_at(&self, c: &DiskCache, offset: u64, bytes: &[u8]) -> Result<()> {
        self.file.write_all_at(bytes, offset).map_err(|e| {
            c.warn_if_full(&e);
            Error::Io { context: format!("writing {}", c.pack_data_path(&self.pack).display()), source: e }
        })?;
        self.written.fetch_add(bytes.len() as u64, Relaxed);
        Ok(())
    }

    /// Records `members` (whose bytes were all written and verified) as
    /// present, beside those already recorded. Nothing is trusted before
    /// this, and a read verifies even after it.
    pub fn commit(&self, c: &DiskCache, members: &[Member]) -> Result<()> {
        let have = c.pack_have_path(&self.pack);
        let mut rows: HashMap<Hash, Member> = match fs::read(&have) {
            Ok(b) => decode_have(&b).map(|v| v.into_iter().map(|m| (m.id, m)).collect()).unwrap_or_default(),
            Err(_) => HashMap::new(),
        };
        for m in members {
            rows.insert(m.id, *m);
        }
        let mut rows: Vec<Member> = rows.into_values().collect();
        rows.sort_by_key(|m| m.offset);
        crate::fsutil::replace_cache_file(&have, &encode_have(&rows))?;
        c.set_probation(&c.pack_data_path(&self.pack), Some(self.pack));
        c.open_packs.lock().expect("open packs lock").remove(&self.pack);
        c.counters.writes.fetch_add(1, Relaxed);
        c.grew(self.written.load(Relaxed), &c.pack_data_path(&self.pack));
        Ok(())
    }
}

impl DiskCache {
    /// The bytes of pack `id` kept in the cache.
    pub fn pack_data_path(&self, id: &Hash) -> PathBuf {
        self.root.join("packs").join("data").join(format!("{}.pack", id.to_hex()))
    }

    /// The record of which members of pack `id` the cache holds.
    pub fn pack_have_path(&self, id: &Hash) -> PathBuf {
        self.root.join("packs").join("data").join(format!("{}.have", id.to_hex()))
    }

    /// Starts (or extends) the cache's copy of pack `id`. The caller holds
    /// the pack's lock ([`DiskCache::lock_pack`]).
    pub fn pack_writer(&self, id: &Hash) -> Result<PackWriter> {
        let p = self.pack_data_path(id);
        let open = || {
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                // A FIFO planted there fails at once (ENXIO), not hangs.
                .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
                .open(&p)
        };
        let file = match open() {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                fs::create_dir_all(p.parent().expect("cache paths have a parent"))
                    .map_err(Error::io(format!("creating {}", p.display())))?;
                open()
            }
            r => r,
        };
        let file = match file {
            Ok(f) if f.metadata().map(|m| m.is_file()).unwrap_or(false) => f,
            Ok(_) | Err(_) => {
                // Something other than our file sits there: replace it.
                self.drop_pack(id);
                open().map_err(Error::io(format!("creating {}", p.display())))?
            }
        };
        Ok(PackWriter { pack: *id, file, written: Default::default() })
    }

    /// Closes the pack files kept open, and drops their member tables.
    pub fn shed(&self) {
        self.open_packs.lock().expect("open packs lock").clear();
    }

    /// The members of pack `id` the cache holds (re-read from disk when the
    /// record changed since this process last looked).
    fn open_pack(&self, id: &Hash, refresh: bool) -> Option<Arc<OpenPack>> {
        let known = self.open_packs.lock().expect("open packs lock").get(id);
        if let Some(p) = &known {
            if !refresh {
                return Some(p.clone());
            }
        }
        let have = self.pack_have_path(id);
        let meta = fs::symlink_metadata(&have).ok()?;
        if known.as_ref().is_some_and(|p| p.stamp == stamp_of(&meta)) {
            return known;
        }
        let rows = match crate::fsutil::read_regular(&have).map(|b| decode_have(&b)) {
            Ok(Ok(rows)) => rows,
            Ok(Err(_)) | Err(_) => {
                self.heal_pack(id);
                return None;
            }
        };
        let file = match crate::fsutil::open_regular(&self.pack_data_path(id)) {
            Ok(f) => f,
            Err(_) => {
                self.heal_pack(id);
                return None;
            }
        };
        let p = Arc::new(OpenPack { file: Arc::new(file), members: by_id(rows), stamp: stamp_of(&meta) });
        self.open_packs.lock().expect("open packs lock").insert(*id, p.clone());
        Some(p)
    }

    /// The row of member `member` if the cache's copy of pack `pack` has it.
    /// A record that lacks it is read again (another process may have
    /// added the member since); no record at all is looked for once.
    fn pack_row(&self, pack: &Hash, member: &Hash) -> Option<(Arc<OpenPack>, Member)> {
        let p = self.open_pack(pack, false)?;
        if let Some(m) = p.member(member) {
            return Some((p, m));
        }
        let p = self.open_pack(pack, true)?;
        p.member(member).map(|m| (p, m))
    }

    /// True when the cache holds a record of pack `id` (some of its members).
    pub fn pack_recorded(&self, id: &Hash) -> bool {
        self.open_packs.lock().expect("open packs lock").contains_key(id) || self.pack_have_path(id).exists()
    }

    /// True when the cache's copy of `pack` lists `member` (not verified).
    pub fn pack_has(&self, pack: &Hash, member: &Hash) -> bool {
        self.pack_row(pack, member).is_some()
    }

    /// Those of `members` that the cache's copy of pack `pack` lists (not
    /// verified), as [`DiskCache::pack_has`] says of each, with one look-up
    /// of the pack rather than one per member.
    pub fn pack_listed<'a>(&self, pack: &Hash, members: impl IntoIterator<Item = &'a Hash>) -> Vec<Hash> {
        let members: Vec<&Hash> = members.into_iter().collect();
        let listed = |p: &OpenPack| members.iter().filter(|m| p.member(m).is_some()).map(|m| **m).collect::<Vec<_>>();
        let Some(p) = self.open_pack(pack, false) else { return Vec::new() };
        let got = listed(&p);
        if got.len() == members.len() {
            return got;
        }
        self.open_pack(pack, true).map(|p| listed(&p)).unwrap_or(got)
    }

    /// Copies member `member` of pack `pack` from the cache's copy into `to`
    /// at `at`, in the kernel ([`crate::fsutil::copy_range`]), when the
    /// cache lists it and it is stored raw (its stored bytes are its
    /// content). Not verified: the caller checks what it builds. `false`
    /// when it cannot.
    pub fn pack_copy_raw(&self, pack: &Hash, member: &Hash, to: &fs::File, at: u64) -> bool {
        let Some((p, m)) = self.pack_row(pack, member) else { return false };
        m.codec == crate::pack::Codec::Raw && crate::fsutil::copy_range(&p.file, m.offset, to, at, m.stored_len).is_ok()
    }

    /// Member `member` of pack `pack` from the cache, verified; a member
    /// that fails is healed (the pack's files go) and reported as a miss.
    pub fn pack_get(&self, pack: &Hash, member: &Hash) -> Option<Vec<u8>> {
        // Absent is not counted as a miss: the caller goes on to the
        // loose entry, which counts.
        let (p, m) = self.pack_row(pack, member)?;
        let mut buf = crate::bufpool::take(m.stored_len as usize);
        let got = crate::bufpool::read_exact_at(&p.file, &mut buf, m.stored_len as usize, m.offset)
            .map_err(|e| e.to_string())
            .and_then(|_| decode_member_vec(&m, buf));
        match got {
            Ok(raw) => {
                self.counters.hits.fetch_add(1, Relaxed);
                self.used(&self.pack_data_path(pack), Some(pack));
                Some(raw)
            }
            Err(_) => {
                self.heal_pack(pack);
                self.counters.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    fn heal_pack(&self, id: &Hash) {
        self.counters.healed.fetch_add(1, Relaxed);
        self.drop_pack(id);
    }

    /// Removes the cache's copy of pack `id`; returns the bytes it held.
    pub(super) fn drop_pack(&self, id: &Hash) -> u64 {
        self.open_packs.lock().expect("open packs lock").remove(id);
        let data = self.pack_data_path(id);
        let held = fs::symlink_metadata(&data).map(|m| super::held(&m)).unwrap_or(0);
        let _ = fs::remove_file(self.pack_have_path(id));
        if fs::remove_file(&data).is_ok() {
            held
        } else {
            0
        }
    }

    /// Removes the cache's file of pack `id` if no record names its
    /// content (a fetch that failed before recording anything).
    pub fn discard_unrecorded(&self, id: &Hash) {
        if !self.pack_have_path(id).exists() {
            let _ = fs::remove_file(self.pack_data_path(id));
        }
    }

    /// Checks every member of every cached pack; removes the packs that
    /// hold a bad one (or whose record is unreadable) and names them.
    pub(super) fn verify_packs(&self, report: &mut super::VerifyReport, progress: &mut impl FnMut(u64, u64)) {
        let dir = self.root.join("packs").join("data");
        let Ok(rd) = fs::read_dir(&dir) else { return };
        let mut ids: Vec<Hash> = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some((stem, ext)) = name.split_once('.') else { continue };
            if !matches!(ext, "pack" | "have") {
                continue;
            }
            match stem.parse::<Hash>() {
                Ok(id) if !ids.contains(&id) => ids.push(id),
                Ok(_) => {}
                Err(_) => {
                    let _ = fs::remove_file(e.path());
                    report.bad.push(name);
                }
            }
        }
        for id in ids {
            // A pack being downloaded (its lock held by another process)
            // has bytes that are not recorded yet, and a record that will
            // name more of them: removed here, the download's work was
            // lost, and a later check found its record without its bytes
            // and called the pack bad.
            let Ok(_lock) = self.lock_unless_busy(&id) else {
                report.busy.push(format!("pack {id}"));
                continue;
            };
            report.checked += 1;
            progress(report.checked, report.checked);
            if !self.pack_have_path(&id).exists() && !self.pack_data_path(&id).is_symlink() {
                // Bytes a fetch wrote but never recorded: not trusted, not bad.
                let _ = fs::remove_file(self.pack_data_path(&id));
                continue;
            }
            let ok = (|| {
                let rows = decode_have(&crate::fsutil::read_regular(&self.pack_have_path(&id)).ok()?).ok()?;
                let f = crate::fsutil::open_regular(&self.pack_data_path(&id)).ok()?;
                let mut buf = Vec::new();
                for m in rows {
                    crate::bufpool::read_exact_at(&f, &mut buf, m.stored_len as usize, m.offset).ok()?;
                    decode_member(&m, &buf).ok()?;
                }
                Some(())
            })()
            .is_some();
            if !ok {
                self.drop_pack(&id);
                report.bad.push(format!("pack {id}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{build_pack, MemberKind};
    use std::path::Path;

    fn cache() -> (tempfile::TempDir, DiskCache) {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path().to_path_buf(), None).unwrap();
        (d, c)
    }

    fn pack_of(n: usize) -> (Vec<u8>, crate::pack::PackEntry, Vec<Vec<u8>>) {
        let raws: Vec<Vec<u8>> = (0..n).map(|i| format!("member {i} ").repeat(20 + i).into_bytes()).collect();
        let members: Vec<(Hash, MemberKind, &[u8])> =
            raws.iter().map(|r| (Hash::of(r), MemberKind::Blob, &r[..])).collect();
        let (bytes, entry) = build_pack(&members);
        (bytes, entry, raws)
    }

    fn store(c: &DiskCache, bytes: &[u8], entry: &crate::pack::PackEntry, range: std::ops::RangeInclusive<usize>) {
        let w = c.pack_writer(&entry.id).unwrap();
        let (lo, hi) = (&entry.members[*range.start()], &entry.members[*range.end()]);
        w.write_at(c, lo.offset, &bytes[lo.offset as usize..(hi.offset + hi.stored_len) as usize]).unwrap();
        w.commit(c, &entry.members[range]).unwrap();
    }

    #[test]
    fn open_packs_keep_the_ones_used_last() {
        let f = Arc::new(tempfile::tempfile().unwrap());
        let open = || Arc::new(OpenPack { file: f.clone(), members: Vec::new(), stamp: (0, 0, 0) });
        let id = |i: usize| Hash::of(&i.to_le_bytes());
        let mut t = OpenPacks::default();
        for i in 0..OPEN_PACKS {
            t.insert(id(i), open());
        }
        assert!(t.get(&id(0)).is_some(), "kept while there is room");
        t.insert(id(OPEN_PACKS), open());
        assert!(t.contains_key(&id(0)), "the pack just used stays");
        assert!(!t.contains_key(&id(1)), "the one used longest ago went");
        assert_eq!(t.map.len(), OPEN_PACKS);
        // Putting back one it has evicts nothing.
        t.insert(id(0), open());
        assert!(t.contains_key(&id(2)) && t.map.len() == OPEN_PACKS);
        t.remove(&id(0));
        assert!(t.get(&id(0)).is_none());
        t.clear();
        assert!(t.map.is_empty());
    }

    #[test]
    fn spans_are_kept_by_offset_and_merged() {
        let (_d, c) = cache();
        let (bytes, entry, raws) = pack_of(6);
        store(&c, &bytes, &entry, 0..=1);
        assert!(c.pack_has(&entry.id, &entry.members[1].id));
        assert!(!c.pack_has(&entry.id, &entry.members[4].id));
        store(&c, &bytes, &entry, 4..=5);
        for (i, raw) in raws.iter().enumerate() {
            let got = c.pack_get(&entry.id, &Hash::of(raw));
            assert_eq!(got.as_deref(), [0, 1, 4, 5].contains(&i).then_some(&raw[..]), "member {i}");
        }
        // The file is sparse where nothing was fetched: one file, both spans.
        let rows = decode_have(&fs::read(c.pack_have_path(&entry.id)).unwrap()).unwrap();
        assert_eq!(rows.len(), 4);
        let r = c.verify(|_, _| {});
        assert!(r.bad.is_empty(), "{:?}", r.bad);
        assert_eq!(c.usage().packs, 1);
    }

    #[test]
    fn a_rotten_truncated_or_planted_pack_file_is_healed_never_served() {
        let (bytes, entry, raws) = pack_of(4);
        let id = Hash::of(&raws[2]);
        type Damage = fn(&Path);
        let damages: [(&str, Damage); 5] = [
            ("bit flip", |p| {
                let mut b = fs::read(p).unwrap();
                let n = b.len();
                b[n - 3] ^= 1;
                fs::write(p, b).unwrap();
            }),
            ("truncated", |p| fs::File::options().write(true).open(p).unwrap().set_len(40).unwrap()),
            ("symlink", |p| {
                let elsewhere = p.with_extension("elsewhere");
                fs::rename(p, &elsewhere).unwrap();
                std::os::unix::fs::symlink(&elsewhere, p).unwrap();
            }),
            ("removed", |p| fs::remove_file(p).unwrap()),
            ("fifo", |p| {
                fs::remove_file(p).unwrap();
                rustix::fs::mknodat(rustix::fs::CWD, p, rustix::fs::FileType::Fifo, 0o600.into(), 0).unwrap();
            }),
        ];
        for (what, damage) in damages {
            let (_d, c) = cache();
            store(&c, &bytes, &entry, 0..=3);
            // A second process (no open file yet) finds the damage.
            let c2 = DiskCache::open(c.root.clone(), None).unwrap();
            damage(&c2.pack_data_path(&entry.id));
            let got = c2.pack_get(&entry.id, &Hash::of(&raws[3]));
            assert_eq!(got, None, "{what}: a damaged pack is not served");
            assert!(!c2.pack_has(&entry.id, &id), "{what}: healed");
            assert!(!c2.pack_have_path(&entry.id).exists(), "{what}");
            // Filled again, it serves again.
            store(&c2, &bytes, &entry, 0..=3);
            assert_eq!(c2.pack_get(&entry.id, &id).as_deref(), Some(&raws[2][..]), "{what}");
        }
    }

    /// A span another process records later is seen by a process that had
    /// already read the pack's record (the record is re-read when it changed).
    #[test]
    fn a_span_recorded_by_another_process_is_seen() {
        let (_d, c1) = cache();
        let (bytes, entry, raws) = pack_of(6);
        store(&c1, &bytes, &entry, 0..=1);
        assert!(c1.pack_get(&entry.id, &Hash::of(&raws[0])).is_some());
        let c2 = DiskCache::open(c1.root.clone(), None).unwrap();
        store(&c2, &bytes, &entry, 4..=5);
        assert_eq!(c1.pack_get(&entry.id, &Hash::of(&raws[5])).as_deref(), Some(&raws[5][..]));
        assert!(!c1.pack_has(&entry.id, &Hash::of(&raws[3])));
    }

    #[test]
    fn a_torn_presence_record_is_not_trusted() {
        let (_d, c) = cache();
        let (bytes, entry, raws) = pack_of(3);
        store(&c, &bytes, &entry, 0..=2);
        let have = c.pack_have_path(&entry.id);
        let b = fs::read(&have).unwrap();
        fs::write(&have, &b[..b.len() - 5]).unwrap();
        let c2 = DiskCache::open(c.root.clone(), None).unwrap();
        assert_eq!(c2.pack_get(&entry.id, &Hash::of(&raws[0])), None);
        assert_eq!(c2.stats().healed, 1);
        let r = c.verify(|_, _| {});
        assert!(r.bad.is_empty(), "already healed: {:?}", r.bad);
    }

    #[test]
    fn verify_names_a_bad_pack_and_removes_it() {
        let (_d, c) = cache();
        let (bytes, entry, _) = pack_of(3);
        store(&c, &bytes, &entry, 0..=2);
        // Its bytes and its record are one pack, checked once.
        let r = c.verify(|_, _| {});
        assert_eq!((r.checked, r.bad.len()), (1, 0), "{r:?}");
        let p = c.pack_data_path(&entry.id);
        let mut b = fs::read(&p).unwrap();
        let at = entry.members[1].offset as usize;
        b[at] ^= 0xff;
        fs::write(&p, b).unwrap();
        let r = c.verify(|_, _| {});
        assert_eq!(r.bad, vec![format!("pack {}", entry.id)]);
        assert!(!p.exists());
    }

    /// A pack another process is downloading (its lock held): its bytes
    /// written, its record not yet, and later a second span on the way.
    /// `cache verify` leaves it alone and says so; once the lock is free,
    /// unrecorded bytes are removed (not reported bad) as before.
    #[test]
    fn verify_leaves_a_pack_being_downloaded_alone() {
        let (_d, c) = cache();
        let (bytes, entry, raws) = pack_of(4);
        let held = c.pack_locks.try_lock(&entry.id).unwrap().expect("the lock is free");
        let w = c.pack_writer(&entry.id).unwrap();
        let (lo, hi) = (&entry.members[0], &entry.members[1]);
        w.write_at(&c, lo.offset, &bytes[lo.offset as usize..(hi.offset + hi.stored_len) as usize]).unwrap();
        let r = c.verify(|_, _| {});
        assert_eq!((r.bad.len(), r.busy.clone()), (0, vec![format!("pack {}", entry.id)]));
        assert!(c.pack_data_path(&entry.id).exists(), "the download's bytes stay");
        w.commit(&c, &entry.members[0..=1]).unwrap();
        drop(held);
        assert_eq!(c.pack_get(&entry.id, &Hash::of(&raws[1])).as_deref(), Some(&raws[1][..]));
        let r = c.verify(|_, _| {});
        assert!(r.bad.is_empty() && r.busy.is_empty(), "{r:?}");
        // Unrecorded bytes with the lock free: removed, not called bad.
        let other = pack_of(2);
        let w = c.pack_writer(&other.1.id).unwrap();
        w.write_at(&c, other.1.members[0].offset, &other.0[other.1.members[0].offset as usize..]).unwrap();
        let r = c.verify(|_, _| {});
        assert!(r.bad.is_empty() && r.busy.is_empty(), "{r:?}");
        assert!(!c.pack_data_path(&other.1.id).exists());
    }

    /// Eviction passes over a pack whose lock is held (a download or
    /// build under way, in this process or another), and takes it once
    /// the lock is free.
    #[test]
    fn eviction_leaves_a_pack_being_written_alone() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::open(d.path().to_path_buf(), Some(4_000)).unwrap();
        let (bytes, entry, raws) = pack_of(6);
        let held = c.pack_locks.try_lock(&entry.id).unwrap().expect("the lock is free");
        store(&c, &bytes, &entry, 0..=2);
        // The oldest entry, but busy; another process writes past the cap.
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        fs::File::options().write(true).open(c.pack_data_path(&entry.id)).unwrap().set_modified(old).unwrap();
        for i in 0..6u8 {
            // Each put by a process of its own (a process evicts its own
            // newest writes first).
            let other = DiskCache::open(d.path().to_path_buf(), Some(4_000)).unwrap();
            let b = vec![i; 1_500];
            other.put(&Hash::of(&b), &b).unwrap();
        }
        assert!(c.pack_data_path(&entry.id).exists(), "a pack being written was evicted");
        assert_eq!(c.pack_get(&entry.id, &Hash::of(&raws[1])).as_deref(), Some(&raws[1][..]));
        assert_eq!(c.stats().healed, 0);
        drop(held);
        // Free again, and the oldest entry: the next process's first write
        // past the cap takes it.
        fs::File::options().write(true).open(c.pack_data_path(&entry.id)).unwrap().set_modified(old).unwrap();
        let c = DiskCache::open(d.path().to_path_buf(), Some(4_000)).unwrap();
        let b = vec![99u8; 1_500];
        c.put(&Hash::of(&b), &b).unwrap();
        assert!(!c.pack_data_path(&entry.id).exists(), "the pack, free again, is evicted");
    }

    #[test]
    fn presence_record_round_trips_and_rejects_garbage() {
        let (_, entry, _) = pack_of(5);
        let enc = encode_have(&entry.members);
        assert_eq!(decode_have(&enc).unwrap(), entry.members);
        for cut in [0, 10, enc.len() - 1] {
            assert!(decode_have(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = enc.clone();
        bad[6] ^= 1;
        assert!(decode_have(&bad).is_err());
    }
}
