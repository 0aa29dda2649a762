//! The stat cache of a plain working copy (`.mado/statcache.bin`): what
//! each file looked like when its content id was last known, so a
//! checkpoint re-reads only files whose size, times or inode moved, as
//! git's index does.
//!
//! Binary, sorted by path with each path stored as the length it shares
//! with the previous one plus the rest (a 40k-file tree's cache is ~2.5 MB
//! and loads in a few ms; the JSON form it replaces was 7.8 MB and took
//! ~100 ms each way), and checksummed: a torn or foreign file reads as no
//! cache (every file is re-read; nothing is ever trusted wrongly). A
//! `statcache.json` written by an older mado is read once and replaced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::codec::{put_bytes, put_varint, DecodeError, Reader};
use crate::hash::{Hash, SnapshotId};

const MAGIC: &[u8; 4] = b"MADC";
/// Version 2 added the snapshot the cache was written for and directory
/// rows; version 1 files are read as they are (no directory rows).
const VERSION: u8 = 2;
const VERSION_1: u8 = 1;
const FILE: &str = "statcache.bin";
const LEGACY_FILE: &str = "statcache.json";

const FLAG_CHUNKED: u8 = 1;
const FLAG_GITLINK: u8 = 2;
const FLAG_DIR: u8 = 4;

/// One row: what a file looked like when its id was known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StatRow {
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    pub(super) ctime_ns: i64,
    pub(super) ino: u64,
    pub(super) id: Hash,
    pub(super) chunked: bool,
    /// A gitlink, checked out as an empty directory: written back as the
    /// gitlink while the directory stays empty.
    pub(super) gitlink: bool,
    /// A directory: `id` is its tree and `size` how many entries the tree
    /// has. The tree is reused while every entry is as its row says and
    /// their number is the same (no entry came or went), so an unchanged
    /// directory is neither re-encoded nor hashed. Its times are unused.
    pub(super) dir: bool,
}

#[derive(Default, Debug, PartialEq, Eq)]
pub(super) struct StatCache {
    /// When the cache was written: a file changed within the same tick
    /// could look unchanged ("racy"), so rows at or after it are re-read.
    pub(super) written_ns: i64,
    /// By path relative to the working copy (raw bytes, `/`-separated).
    pub(super) rows: BTreeMap<Vec<u8>, StatRow>,
    /// The snapshot the rows were written for (its checkpoint or resume):
    /// directory rows name trees of that snapshot, so they are used only
    /// while it is the working copy's base. `None` in a version 1 file.
    pub(super) head: Option<SnapshotId>,
}

impl StatCache {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.rows.len() * 72);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.written_ns.to_le_bytes());
        match self.head {
            None => out.push(0),
            Some(h) => {
                out.push(1);
                out.extend_from_slice(&h.0);
            }
        }
        put_varint(&mut out, self.rows.len() as u64);
        let mut prev: &[u8] = &[];
        for (path, r) in &self.rows {
            let shared = prev.iter().zip(path).take_while(|(a, b)| a == b).count();
            put_varint(&mut out, shared as u64);
            put_bytes(&mut out, &path[shared..]);
            put_varint(&mut out, r.size);
            out.extend_from_slice(&r.mtime_ns.to_le_bytes());
            out.extend_from_slice(&r.ctime_ns.to_le_bytes());
            put_varint(&mut out, r.ino);
            out.extend_from_slice(&r.id.0);
            out.push(
                if r.chunked { FLAG_CHUNKED } else { 0 }
                    | if r.gitlink { FLAG_GITLINK } else { 0 }
                    | if r.dir { FLAG_DIR } else { 0 },
            );
            prev = path;
        }
        let sum = Hash::of(&out);
        out.extend_from_slice(&sum.0);
        out
    }

    pub(super) fn decode(buf: &[u8]) -> Result<StatCache, DecodeError> {
        if buf.len() < 32 {
            return Err(DecodeError::Truncated(buf.len()));
        }
        let (body, sum) = buf.split_at(buf.len() - 32);
        if Hash::of(body).0 != sum {
            return Err(DecodeError::Invalid("checksum mismatch".into()));
        }
        let mut r = Reader::new(body);
        r.magic(MAGIC)?;
        let version = r.u8()?;
        if version != VERSION && version != VERSION_1 {
            return Err(DecodeError::Version { format: "stat cache", version, supported: VERSION });
        }
        let written_ns = r.i64_le()?;
        let head = match version {
            VERSION_1 => None,
            _ => match r.u8()? {
                0 => None,
                1 => Some(SnapshotId::from_hash(r.hash()?)),
                f => return Err(DecodeError::Invalid(format!("bad head flag {f}"))),
            },
        };
        let known =
            if version == VERSION_1 { FLAG_CHUNKED | FLAG_GITLINK } else { FLAG_CHUNKED | FLAG_GITLINK | FLAG_DIR };
        // A row is at least 2 + 1 + 8 + 8 + 1 + 32 + 1 bytes.
        let n = r.count(53)?;
        let mut rows = BTreeMap::new();
        let mut prev: Vec<u8> = Vec::new();
        for _ in 0..n {
            let shared = r.varint()? as usize;
            if shared > prev.len() {
                return Err(DecodeError::Invalid(format!("a path shares {shared} bytes of a shorter one")));
            }
            let mut path = prev[..shared].to_vec();
            path.extend_from_slice(r.bytes()?);
            if path <= prev && !(prev.is_empty() && rows.is_empty()) {
                return Err(DecodeError::Invalid("paths out of order".into()));
            }
            let size = r.varint()?;
            let mtime_ns = r.i64_le()?;
            let ctime_ns = r.i64_le()?;
            let ino = r.varint()?;
            let id = r.hash()?;
            let flags = r.u8()?;
            if flags & !known != 0 {
                return Err(DecodeError::Invalid(format!("unknown flags {flags:#x}")));
            }
            let row = StatRow {
                size,
                mtime_ns,
                ctime_ns,
                ino,
                id,
                chunked: flags & FLAG_CHUNKED != 0,
                gitlink: flags & FLAG_GITLINK != 0,
                dir: flags & FLAG_DIR != 0,
            };
            rows.insert(path.clone(), row);
            prev = path;
        }
        r.finish()?;
        Ok(StatCache { written_ns, rows, head })
    }
}

fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// The stat cache kept in `state_dir` (a working copy's `.mado`); empty
/// when there is none or it cannot be read.
pub(super) fn load(state_dir: &Path) -> StatCache {
    // Not a plain read: a FIFO planted there must not hang a checkpoint.
    match crate::fsutil::read_regular(&path_in(state_dir)) {
        Ok(b) => StatCache::decode(&b).unwrap_or_default(),
        Err(_) => load_legacy(&state_dir.join(LEGACY_FILE)).unwrap_or_default(),
    }
}

/// Writes the stat cache (not durably: a lost one only costs re-reads),
/// and drops an older mado's JSON form.
pub(super) fn save(state_dir: &Path, c: &StatCache) {
    crate::fsutil::save_cache_file(&path_in(state_dir), &c.encode());
    let _ = std::fs::remove_file(state_dir.join(LEGACY_FILE));
}

/// Removes the stat cache (tests, and a reset).
#[cfg(test)]
pub(super) fn remove(state_dir: &Path) {
    let _ = std::fs::remove_file(path_in(state_dir));
}

/// The JSON form before version 1 of the binary one: keys `u:<path>` (UTF-8)
/// or `x:<hex>`, ids in hex.
fn load_legacy(p: &Path) -> Option<StatCache> {
    #[derive(Deserialize)]
    struct Row {
        size: u64,
        mtime_ns: i128,
        ctime_ns: i128,
        ino: u64,
        id: String,
        chunked: bool,
        #[serde(default)]
        gitlink: bool,
    }
    #[derive(Deserialize)]
    struct Legacy {
        written_ns: i128,
        rows: BTreeMap<String, Row>,
    }
    let l: Legacy = serde_json::from_slice(&crate::fsutil::read_regular(p).ok()?).ok()?;
    let clamp = |t: i128| t.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    let mut rows = BTreeMap::new();
    for (k, r) in l.rows {
        let path = if let Some(s) = k.strip_prefix("u:") {
            s.as_bytes().to_vec()
        } else {
            let hex = k.strip_prefix("x:")?;
            (0..hex.len())
                .step_by(2)
                .map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
                .collect::<Option<Vec<u8>>>()?
        };
        let row = StatRow {
            size: r.size,
            mtime_ns: clamp(r.mtime_ns),
            ctime_ns: clamp(r.ctime_ns),
            ino: r.ino,
            id: r.id.parse().ok()?,
            chunked: r.chunked,
            gitlink: r.gitlink,
            dir: false,
        };
        rows.insert(path, row);
    }
    Some(StatCache { written_ns: clamp(l.written_ns), rows, head: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: u64) -> StatRow {
        StatRow {
            size: i * 1000,
            mtime_ns: 1_700_000_000_000_000_000 + i as i64,
            ctime_ns: -5 - i as i64,
            ino: i << 40,
            id: Hash::of(&i.to_le_bytes()),
            chunked: i.is_multiple_of(3),
            gitlink: i.is_multiple_of(5),
            dir: i.is_multiple_of(7),
        }
    }

    fn sample() -> StatCache {
        let mut c = StatCache {
            written_ns: 1_700_000_000_123_456_789,
            rows: BTreeMap::new(),
            head: Some(SnapshotId::from_hash(Hash::of(b"head"))),
        };
        for (i, p) in
            [&b"a"[..], b"a/b", b"a/b/c.rs", b"a/bc", b"b\xff\xfe", b"z/y/x/w/v", b"z/y/x/w/v2"].iter().enumerate()
        {
            c.rows.insert(p.to_vec(), row(i as u64));
        }
        c
    }

    #[test]
    fn round_trips_every_field_and_odd_paths() {
        let c = sample();
        let enc = c.encode();
        assert_eq!(StatCache::decode(&enc).unwrap(), c);
        let empty = StatCache::default();
        assert_eq!(StatCache::decode(&empty.encode()).unwrap(), empty);
    }

    /// A version 1 file (no head, no directory rows) still reads, with
    /// its rows; a directory flag in one is refused.
    #[test]
    fn a_version_1_cache_reads_without_head_or_directory_rows() {
        let mut c = sample();
        c.head = None;
        for r in c.rows.values_mut() {
            r.dir = false;
        }
        let v2 = c.encode();
        // Version 1: the same bytes without the head flag byte.
        let mut v1 = v2[..v2.len() - 32].to_vec();
        v1[4] = VERSION_1;
        assert_eq!(v1[4 + 1 + 8], 0, "the head flag");
        v1.remove(4 + 1 + 8);
        let sum = Hash::of(&v1);
        v1.extend_from_slice(&sum.0);
        assert_eq!(StatCache::decode(&v1).unwrap(), c);
        let mut d = c;
        d.rows.values_mut().next().unwrap().dir = true;
        let mut bad = d.encode()[..].to_vec();
        bad.truncate(bad.len() - 32);
        bad[4] = VERSION_1;
        bad.remove(4 + 1 + 8);
        let sum = Hash::of(&bad);
        bad.extend_from_slice(&sum.0);
        assert!(StatCache::decode(&bad).is_err(), "a directory row in version 1");
    }

    #[test]
    fn shared_prefixes_keep_it_small() {
        let mut c = StatCache::default();
        for i in 0..1000u64 {
            c.rows.insert(format!("some/long/directory/name/here/file{i:04}.rs").into_bytes(), row(i));
        }
        let per_row = c.encode().len() / 1000;
        assert!(per_row < 70, "{per_row} bytes per row");
    }

    #[test]
    fn any_damage_reads_as_no_cache() {
        let enc = sample().encode();
        for i in 0..enc.len() {
            let mut bad = enc.clone();
            bad[i] ^= 0x10;
            assert!(StatCache::decode(&bad).is_err(), "a flip at byte {i} was accepted");
        }
        for n in 0..enc.len() {
            assert!(StatCache::decode(&enc[..n]).is_err(), "a cut at {n} was accepted");
        }
    }

    #[test]
    fn a_consistent_but_hostile_body_is_refused() {
        // Valid checksums over bodies a bug or a hand could write.
        let seal = |body: Vec<u8>| {
            let mut b = body.clone();
            b.extend_from_slice(&Hash::of(&body).0);
            b
        };
        let head = |n: u64| {
            let mut b = MAGIC.to_vec();
            b.push(VERSION);
            b.extend_from_slice(&0i64.to_le_bytes());
            b.push(0);
            put_varint(&mut b, n);
            b
        };
        let one_row = |b: &mut Vec<u8>, shared: u64, rest: &[u8], flags: u8| {
            put_varint(b, shared);
            put_bytes(b, rest);
            put_varint(b, 1);
            b.extend_from_slice(&[0; 16]);
            put_varint(b, 1);
            b.extend_from_slice(&[7; 32]);
            b.push(flags);
        };
        let mut b = head(1);
        one_row(&mut b, 3, b"x", 0);
        assert!(StatCache::decode(&seal(b)).is_err(), "a prefix longer than the previous path");
        let mut b = head(2);
        one_row(&mut b, 0, b"b", 0);
        one_row(&mut b, 0, b"a", 0);
        assert!(StatCache::decode(&seal(b)).is_err(), "paths out of order");
        let mut b = head(1);
        one_row(&mut b, 0, b"a", 0x80);
        assert!(StatCache::decode(&seal(b)).is_err(), "unknown flags");
        let mut b = head(1_000_000);
        one_row(&mut b, 0, b"a", 0);
        assert!(StatCache::decode(&seal(b)).is_err(), "a count the bytes cannot hold");
        let mut b = head(1);
        one_row(&mut b, 0, b"a", 0);
        assert!(StatCache::decode(&seal(b)).is_ok(), "the same row, well formed, reads");
    }

    #[test]
    fn an_older_json_cache_is_read_and_replaced() {
        let d = tempfile::tempdir().unwrap();
        let id = Hash::of(b"x");
        let json = format!(
            r#"{{"written_ns":42,"rows":{{"u:src/a.rs":{{"size":3,"mtime_ns":7,"ctime_ns":8,"ino":9,"id":"{id}","chunked":false}},"x:ff41":{{"size":1,"mtime_ns":1,"ctime_ns":1,"ino":1,"id":"{id}","chunked":true,"gitlink":true}}}}}}"#,
            id = id.to_hex()
        );
        std::fs::write(d.path().join(LEGACY_FILE), json).unwrap();
        let c = load(d.path());
        assert_eq!(c.written_ns, 42);
        assert_eq!(
            c.rows[&b"src/a.rs"[..]],
            StatRow { size: 3, mtime_ns: 7, ctime_ns: 8, ino: 9, id, chunked: false, gitlink: false, dir: false }
        );
        let odd = &c.rows[&b"\xffA"[..]];
        assert!(odd.chunked && odd.gitlink);
        save(d.path(), &c);
        assert!(!d.path().join(LEGACY_FILE).exists(), "the JSON form is dropped");
        assert_eq!(load(d.path()), c, "and the binary one reads the same");
        remove(d.path());
        assert_eq!(load(d.path()), StatCache::default());
    }

    #[test]
    fn a_fifo_or_a_symlink_in_its_place_reads_as_no_cache() {
        use rustix::fs::{mknodat, FileType, Mode, CWD};
        let d = tempfile::tempdir().unwrap();
        mknodat(CWD, path_in(d.path()), FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        assert_eq!(load(d.path()), StatCache::default(), "no hang on a FIFO");
        std::fs::remove_file(path_in(d.path())).unwrap();
        let real = d.path().join("elsewhere");
        std::fs::write(&real, sample().encode()).unwrap();
        std::os::unix::fs::symlink(&real, path_in(d.path())).unwrap();
        assert_eq!(load(d.path()), StatCache::default(), "a symlink is not followed");
    }
}
