//! One large blob read out of a git object database as a stream, so an
//! import holds a chunk of it in memory, never the whole file (gix loads a
//! blob whole; git itself streams the blobs it stores undeltified, which
//! is how it stores anything above `core.bigFileThreshold`).
//!
//! Three forms are read: a loose object (`objects/xx/yyyy…`, a zlib stream
//! of `blob <size>\0<bytes>`), a whole entry of a pack found through the
//! pack's `.idx`, and a delta entry of a pack (`OFS_DELTA` or `REF_DELTA`,
//! as git stores every revised file under 512 MiB after a `gc` or in a
//! clone). A delta's base is written to an unnamed temporary file (a base
//! that is itself a delta, the same way, down the chain) and the delta's
//! instructions are applied as the bytes are read: copies are read from
//! that file, inserts from the delta's own stream. Memory stays at a few
//! buffers; the disk holds one base at a time (two while a chain is
//! resolved). Alternates are followed one level. Anything else (a layout
//! this does not know) answers `None`, and the caller loads the blob whole
//! as before. The bytes are checked against the blob's SHA-1 as they
//! stream by: a corrupt or truncated object, or a delta that does not
//! apply, fails the read naming the blob.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use gix::hash::ObjectId;

/// Pack entry type of a whole blob (git's `OBJ_BLOB`).
const PACK_BLOB: u8 = 3;
/// Pack entry types of deltas: against an entry at an earlier offset of
/// the same pack, and against an object named by its id.
const PACK_OFS_DELTA: u8 = 6;
const PACK_REF_DELTA: u8 = 7;
/// The longest delta chain followed (git makes chains of at most 50 by
/// default, `pack.depth`; a cycle in a hostile pack ends here too).
const MAX_DEPTH: usize = 64;

/// A zlib stream read from a file, inflated as it is read.
struct Inflated {
    input: BufReader<File>,
    inflate: gix::zlib::Decompress,
}

impl Inflated {
    fn new(input: BufReader<File>) -> Inflated {
        Inflated { input, inflate: gix::zlib::Decompress::new() }
    }
}

impl Read for Inflated {
    fn read(&mut self, dst: &mut [u8]) -> std::io::Result<usize> {
        gix::zlib::stream::inflate::read(&mut self.input, &mut self.inflate, dst)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("inflating: {e}")))
    }
}

/// A blob's content, as it is read: inflated, or a delta applied.
type Content = Box<dyn Read + Send>;

/// A blob's content, read and checked at its end.
pub struct BlobStream {
    content: Content,
    hasher: gix::hash::Hasher,
    oid: ObjectId,
    size: u64,
    remaining: u64,
    checked: bool,
}

/// Opens blob `oid` of `size` bytes (its header size) for streaming, or
/// `None` when it is not stored in a way this reads. A delta's bases are
/// written to unnamed files in `scratch`.
pub fn open(objects: &Path, oid: &ObjectId, size: u64, scratch: &Path) -> std::io::Result<Option<BlobStream>> {
    let found = content_of(objects, oid, scratch, 0, true).map_err(|e| named(oid, e))?;
    let Some((content, header_size)) = found else { return Ok(None) };
    if header_size != size {
        return Err(corrupt(oid, format!("stored as {header_size} bytes, expected {size}")));
    }
    let mut s = BlobStream {
        content,
        hasher: gix::hash::hasher(gix::hash::Kind::Sha1),
        oid: *oid,
        size,
        remaining: size,
        checked: false,
    };
    s.hasher.update(format!("blob {size}\0").as_bytes());
    Ok(Some(s))
}

/// Object `oid`'s content and size, if it is a blob stored in a form this
/// reads (loose, or a pack entry whole or as a delta).
fn content_of(
    objects: &Path,
    oid: &ObjectId,
    scratch: &Path,
    depth: usize,
    alternates: bool,
) -> std::io::Result<Option<(Content, u64)>> {
    let hex = oid.to_hex().to_string();
    let loose = objects.join(&hex[..2]).join(&hex[2..]);
    if let Ok(f) = File::open(&loose) {
        let mut z = Inflated::new(BufReader::with_capacity(256 << 10, f));
        let size = loose_header(&mut z, oid)?;
        return Ok(Some((Box::new(z), size)));
    }
    for idx in pack_indexes(objects) {
        let Ok(index) = gix::odb::pack::index::File::at(&idx, gix::hash::Kind::Sha1) else { continue };
        let Some(i) = index.lookup(oid) else { continue };
        let offset = index.pack_offset_at_index(i);
        return entry_content(&idx.with_extension("pack"), offset, objects, oid, scratch, depth);
    }
    if alternates {
        for alt in alternate_dirs(objects) {
            if let Some(c) = content_of(&alt, oid, scratch, depth, false)? {
                return Ok(Some(c));
            }
        }
    }
    Ok(None)
}

/// The content of the pack entry at `offset` of `pack` (part of object
/// `oid`, for errors), if it is a blob or a delta that makes one.
fn entry_content(
    pack: &Path,
    offset: u64,
    objects: &Path,
    oid: &ObjectId,
    scratch: &Path,
    depth: usize,
) -> std::io::Result<Option<(Content, u64)>> {
    if depth > MAX_DEPTH {
        return Err(corrupt(oid, format!("its delta chain is longer than {MAX_DEPTH}")));
    }
    let mut f = File::open(pack)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut input = BufReader::with_capacity(256 << 10, f);
    let (kind, len) = entry_header(&mut input, oid)?;
    let base = match kind {
        PACK_BLOB => return Ok(Some((Box::new(Inflated::new(input)), len))),
        PACK_OFS_DELTA => {
            let back = ofs_back(&mut input, oid)?;
            let at = offset.checked_sub(back).filter(|a| *a < offset).ok_or_else(|| {
                corrupt(oid, format!("a delta at pack offset {offset} names its base {back} bytes before it"))
            })?;
            entry_content(pack, at, objects, oid, scratch, depth + 1)?
        }
        PACK_REF_DELTA => {
            let mut id = [0u8; 20];
            input.read_exact(&mut id)?;
            let base = ObjectId::from_bytes_or_panic(&id);
            content_of(objects, &base, scratch, depth + 1, true)?
        }
        _ => return Ok(None),
    };
    let Some((mut base, base_len)) = base else { return Ok(None) };
    // The base, whole, where copies can read it at any offset.
    let mut file = unnamed_file(scratch)?;
    let copied = std::io::copy(&mut base, &mut file)?;
    if copied != base_len {
        return Err(corrupt(oid, format!("a delta's base holds {copied} bytes, its entry says {base_len}")));
    }
    drop(base);
    let mut delta = BufReader::with_capacity(64 << 10, Inflated::new(input).take(len));
    let (want_base, result) = (delta_varint(&mut delta, oid)?, delta_varint(&mut delta, oid)?);
    if want_base != base_len {
        return Err(corrupt(oid, format!("a delta for a base of {want_base} bytes, applied to {base_len}")));
    }
    Ok(Some((Box::new(Delta { delta, base: file, base_len, op: Op::Next, oid: *oid }), result)))
}

/// A pack entry's type and inflated size.
fn entry_header(input: &mut impl Read, oid: &ObjectId) -> std::io::Result<(u8, u64)> {
    let mut b = byte(input)?;
    let kind = (b >> 4) & 7;
    let mut len = (b & 0x0f) as u64;
    let mut shift = 4;
    while b & 0x80 != 0 {
        b = byte(input)?;
        if shift > 57 {
            return Err(corrupt(oid, "its pack entry size does not end"));
        }
        len |= ((b & 0x7f) as u64) << shift;
        shift += 7;
    }
    Ok((kind, len))
}

/// An `OFS_DELTA`'s distance back to its base (git's offset encoding).
fn ofs_back(input: &mut impl Read, oid: &ObjectId) -> std::io::Result<u64> {
    let mut b = byte(input)?;
    let mut back = (b & 0x7f) as u64;
    let mut n = 0;
    while b & 0x80 != 0 {
        b = byte(input)?;
        n += 1;
        if n > 9 {
            return Err(corrupt(oid, "a delta's base offset does not end"));
        }
        back = ((back + 1) << 7) | (b & 0x7f) as u64;
    }
    Ok(back)
}

/// A size at the start of a delta (little-endian base-128).
fn delta_varint(input: &mut impl Read, oid: &ObjectId) -> std::io::Result<u64> {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let b = byte(input)?;
        if shift > 63 {
            return Err(corrupt(oid, "a delta's size does not end"));
        }
        v |= ((b & 0x7f) as u64) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
}

fn byte(input: &mut impl Read) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    input.read_exact(&mut b)?;
    Ok(b[0])
}

/// Where a delta's reader is in its instructions.
enum Op {
    Next,
    Copy { at: u64, left: u64 },
    Insert { left: u64 },
}

/// A delta applied as its result is read.
struct Delta {
    delta: BufReader<std::io::Take<Inflated>>,
    base: File,
    base_len: u64,
    op: Op,
    oid: ObjectId,
}

impl Read for Delta {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.op {
                Op::Next => {
                    if self.delta.fill_buf()?.is_empty() {
                        return Ok(0);
                    }
                    let op = byte(&mut self.delta)?;
                    self.op = if op & 0x80 != 0 {
                        let mut field = |bits: u8, n: usize| -> std::io::Result<u64> {
                            let mut v = 0u64;
                            for i in 0..n {
                                if bits & (1 << i) != 0 {
                                    v |= (byte(&mut self.delta)? as u64) << (8 * i);
                                }
                            }
                            Ok(v)
                        };
                        let at = field(op & 0x0f, 4)?;
                        let left = match field((op >> 4) & 0x07, 3)? {
                            0 => 0x10000,
                            n => n,
                        };
                        if at.checked_add(left).is_none_or(|end| end > self.base_len) {
                            return Err(corrupt(
                                &self.oid,
                                format!("a delta copies {left} bytes at {at} of a {}-byte base", self.base_len),
                            ));
                        }
                        Op::Copy { at, left }
                    } else if op != 0 {
                        Op::Insert { left: op as u64 }
                    } else {
                        return Err(corrupt(&self.oid, "a delta holds the reserved instruction 0"));
                    };
                }
                Op::Copy { at, left } => {
                    let n = (left.min(buf.len() as u64)) as usize;
                    self.base.read_exact_at(&mut buf[..n], at)?;
                    self.op = if left as usize == n {
                        Op::Next
                    } else {
                        Op::Copy { at: at + n as u64, left: left - n as u64 }
                    };
                    return Ok(n);
                }
                Op::Insert { left } => {
                    let n = (left.min(buf.len() as u64)) as usize;
                    self.delta.read_exact(&mut buf[..n])?;
                    self.op = if left as usize == n { Op::Next } else { Op::Insert { left: left - n as u64 } };
                    return Ok(n);
                }
            }
        }
    }
}

/// A file in `dir` that no name reaches: gone when closed (`O_TMPFILE`;
/// where the filesystem has none, made under a name removed at once).
fn unnamed_file(dir: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = std::fs::OpenOptions::new().read(true).write(true).mode(0o600).custom_flags(libc::O_TMPFILE).open(dir);
    if let Ok(f) = tmp {
        return Ok(f);
    }
    let p = dir.join(format!("gitbase-{}-{}", std::process::id(), rand::random::<u64>()));
    let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&p)?;
    let _ = std::fs::remove_file(&p);
    Ok(f)
}

fn pack_indexes(objects: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(objects.join("pack"))
        .into_iter()
        .flatten()
        .filter_map(|d| d.ok().map(|d| d.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .collect();
    out.sort();
    out
}

fn alternate_dirs(objects: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(objects.join("info/alternates")) else { return Vec::new() };
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(|l| objects.join(l)).collect()
}

fn corrupt(oid: &ObjectId, what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("git blob {oid} is corrupt in the repository: {what}"))
}

/// `e`, from reading blob `oid`'s bytes (or a delta base's), naming the
/// blob. An error that is not about the bytes (a file that cannot be
/// opened or made) is passed on as it is, with the blob named in it.
fn named(oid: &ObjectId, e: std::io::Error) -> std::io::Error {
    let text = e.to_string();
    if text.contains(&oid.to_string()) {
        return e;
    }
    match e.kind() {
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => corrupt(oid, text),
        kind => std::io::Error::new(kind, format!("reading git blob {oid}: {text}")),
    }
}

/// A loose object inflates to `blob <size>\0` then the bytes: the size.
fn loose_header(z: &mut Inflated, oid: &ObjectId) -> std::io::Result<u64> {
    let mut header = Vec::new();
    loop {
        let mut b = [0u8; 1];
        if z.read(&mut b).map_err(|e| corrupt(oid, e))? == 0 || header.len() > 64 {
            return Err(corrupt(oid, "its loose object header does not end"));
        }
        if b[0] == 0 {
            break;
        }
        header.push(b[0]);
    }
    let size = std::str::from_utf8(&header).ok().and_then(|h| h.strip_prefix("blob ")).and_then(|n| n.parse().ok());
    size.ok_or_else(|| corrupt(oid, format!("loose header {:?}, not a blob's", String::from_utf8_lossy(&header))))
}

impl BlobStream {
    fn read_content(&mut self, dst: &mut [u8]) -> std::io::Result<usize> {
        let oid = self.oid;
        self.content.read(dst).map_err(|e| named(&oid, e))
    }

    /// At the end: nothing left to read and the bytes hash to the id.
    fn finish(&mut self) -> std::io::Result<()> {
        let mut extra = [0u8; 1];
        if self.read_content(&mut extra)? != 0 {
            return Err(corrupt(&self.oid, format!("more than its {} bytes", self.size)));
        }
        let h = std::mem::replace(&mut self.hasher, gix::hash::hasher(gix::hash::Kind::Sha1));
        let got = h.try_finalize().map_err(|e| corrupt(&self.oid, e))?;
        if got != self.oid {
            return Err(corrupt(&self.oid, format!("its bytes hash to {got}")));
        }
        self.checked = true;
        Ok(())
    }
}

impl Read for BlobStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.remaining == 0 {
            if !self.checked {
                self.finish()?;
            }
            return Ok(0);
        }
        let want = buf.len().min(self.remaining.min(usize::MAX as u64) as usize);
        let n = self.read_content(&mut buf[..want])?;
        if n == 0 && want > 0 {
            let at = self.size - self.remaining;
            return Err(corrupt(&self.oid, format!("it ends after {at} of {} bytes", self.size)));
        }
        self.hasher.update(&buf[..n]);
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::chunk::tests::pseudo_random as bytes;

    pub(in crate::import) fn git(repo: &Path, args: &[&str]) -> String {
        let o = std::process::Command::new("git")
            .current_dir(repo)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", repo)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// A repository holding `data` as big.bin, committed.
    fn repo_with(data: &[u8], config: &[(&str, &str)]) -> (tempfile::TempDir, ObjectId) {
        let t = tempfile::tempdir().unwrap();
        git(t.path(), &["init", "-q"]);
        for (k, v) in config {
            git(t.path(), &["config", k, v]);
        }
        std::fs::write(t.path().join("big.bin"), data).unwrap();
        git(t.path(), &["add", "big.bin"]);
        git(t.path(), &["commit", "-qm", "x"]);
        let id = ObjectId::from_hex(git(t.path(), &["rev-parse", "HEAD:big.bin"]).as_bytes()).unwrap();
        (t, id)
    }

    fn read_all(mut s: BlobStream) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Where delta bases go (a folder kept for the test process's life).
    fn scratch() -> PathBuf {
        static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        DIR.get_or_init(|| tempfile::tempdir().unwrap()).path().to_path_buf()
    }

    fn objects(t: &tempfile::TempDir) -> PathBuf {
        t.path().join(".git/objects")
    }

    #[test]
    fn a_loose_blob_streams_its_bytes() {
        let data = bytes(300_000, 1);
        let (t, id) = repo_with(&data, &[]);
        let s = open(&objects(&t), &id, data.len() as u64, &scratch()).unwrap().expect("a loose object streams");
        assert_eq!(read_all(s).unwrap(), data);
        // A size other than the object's is refused before any byte.
        let e = open(&objects(&t), &id, 5, &scratch()).err().expect("a wrong size is refused").to_string();
        assert!(e.contains("stored as 300000 bytes, expected 5") && e.contains(&id.to_string()), "{e}");
    }

    #[test]
    fn a_whole_pack_entry_streams_and_a_delta_does_not() {
        let data = bytes(200_000, 2);
        let (t, id) = repo_with(&data, &[("core.bigFileThreshold", "1k")]);
        // The blob's own loose file (its fan-out folder may exist: a tree
        // or commit whose id starts with the same byte).
        let hex = id.to_string();
        let loose = objects(&t).join(&hex[..2]).join(&hex[2..]);
        assert!(!loose.exists(), "a big file goes into a pack");
        let s = open(&objects(&t), &id, data.len() as u64, &scratch()).unwrap().expect("a whole entry streams");
        assert_eq!(read_all(s).unwrap(), data);
        let e = open(&objects(&t), &id, 7, &scratch()).err().expect("a wrong size is refused").to_string();
        assert!(e.contains("stored as 200000 bytes, expected 7"), "{e}");

        // Two close versions, repacked: one becomes a delta of the other,
        // and streams too (applied as it is read).
        let mut v2 = data.clone();
        v2[100_000..100_100].fill(0);
        v2.extend_from_slice(&bytes(70_000, 9));
        std::fs::write(t.path().join("big.bin"), &v2).unwrap();
        git(t.path(), &["commit", "-qam", "two"]);
        let id2 = ObjectId::from_hex(git(t.path(), &["rev-parse", "HEAD:big.bin"]).as_bytes()).unwrap();
        git(t.path(), &["-c", "core.bigFileThreshold=512m", "repack", "-adfq", "--window=10"]);
        let listed = git(t.path(), &["verify-pack", "-v", &pack_idx(&t)]);
        assert!(listed.lines().any(|l| l.split_whitespace().count() >= 7), "a delta entry: {listed}");
        for (i, want) in [(id, &data), (id2, &v2)] {
            let s = open(&objects(&t), &i, want.len() as u64, &scratch()).unwrap().expect("whole or delta, it streams");
            assert_eq!(&read_all(s).unwrap(), want);
        }
        assert_eq!(std::fs::read_dir(scratch()).unwrap().count(), 0, "no base file is left");
    }

    fn pack_idx(t: &tempfile::TempDir) -> String {
        let dir = objects(t).join("pack");
        let idx = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "idx"));
        idx.unwrap().to_str().unwrap().to_string()
    }

    /// Delta chains (each version a delta of the next, as git lays them
    /// out) of several depths, ids named in the pack (`REF_DELTA`, as a
    /// thin pack or `--no-delta-base-offset` makes them) and a delta
    /// whose instructions are damaged.
    #[test]
    fn delta_chains_and_ref_deltas_stream_and_a_damaged_delta_is_refused() {
        let t = tempfile::tempdir().unwrap();
        git(t.path(), &["init", "-q"]);
        let mut data = bytes(150_000, 5);
        let mut versions = Vec::new();
        for v in 0..6u8 {
            data[(v as usize) * 20_000..(v as usize) * 20_000 + 50].fill(v);
            data.extend_from_slice(&[v; 3_000]);
            std::fs::write(t.path().join("big.bin"), &data).unwrap();
            git(t.path(), &["add", "big.bin"]);
            git(t.path(), &["commit", "-qm", "v"]);
            let id = ObjectId::from_hex(git(t.path(), &["rev-parse", "HEAD:big.bin"]).as_bytes()).unwrap();
            versions.push((id, data.clone()));
        }
        for extra in [&[][..], &["-c", "repack.useDeltaBaseOffset=false"][..]] {
            let mut args = extra.to_vec();
            args.extend(["-c", "core.bigFileThreshold=512m", "repack", "-adfq", "--window=10", "--depth=50"]);
            git(t.path(), &args);
            let listed = git(t.path(), &["verify-pack", "-v", &pack_idx(&t)]);
            let deepest = listed.lines().filter_map(|l| l.split_whitespace().nth(5)?.parse::<u32>().ok()).max();
            assert!(deepest.is_some_and(|d| d >= 2), "a chain of two or more: {listed}");
            for (id, want) in &versions {
                let s = open(&objects(&t), id, want.len() as u64, &scratch()).unwrap().expect("it streams");
                assert_eq!(&read_all(s).unwrap(), want, "{id} {extra:?}");
            }
        }
        // A byte of the pack's deltas flipped: every version still either
        // reads right or fails naming its blob, never reads wrong.
        let pack = PathBuf::from(pack_idx(&t)).with_extension("pack");
        let mut b = std::fs::read(&pack).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x55;
        let mut perm = std::fs::metadata(&pack).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o644);
        std::fs::set_permissions(&pack, perm).unwrap();
        std::fs::write(&pack, b).unwrap();
        let mut failed = 0;
        for (id, want) in &versions {
            match open(&objects(&t), id, want.len() as u64, &scratch()).and_then(|s| read_all(s.expect("found"))) {
                Ok(got) => assert_eq!(&got, want, "{id} read wrong bytes"),
                Err(e) => {
                    assert!(e.to_string().contains(&id.to_string()), "{e}");
                    failed += 1;
                }
            }
        }
        assert!(failed > 0, "the damage was seen");
    }

    /// A pack entry whose size never ends is refused, not shifted past
    /// 64 bits; so is a delta's base offset or size.
    #[test]
    fn endless_sizes_and_offsets_are_refused() {
        let id = ObjectId::from_hex(b"0123456789012345678901234567890123456789").unwrap();
        let mut bytes = vec![0x80 | (PACK_BLOB << 4)];
        bytes.extend([0xff; 12]);
        bytes.push(0);
        let e = entry_header(&mut &bytes[..], &id).unwrap_err().to_string();
        assert!(e.contains("does not end"), "{e}");
        let e = ofs_back(&mut &[0xffu8; 12][..], &id).unwrap_err().to_string();
        assert!(e.contains("does not end"), "{e}");
        let e = delta_varint(&mut &[0xffu8; 12][..], &id).unwrap_err().to_string();
        assert!(e.contains("does not end"), "{e}");
    }

    #[test]
    fn unknown_ids_and_alternates() {
        let data = bytes(50_000, 3);
        let (t, id) = repo_with(&data, &[]);
        let missing = ObjectId::from_hex(b"0123456789012345678901234567890123456789").unwrap();
        assert!(open(&objects(&t), &missing, 1, &scratch()).unwrap().is_none());
        // A second repository borrowing the first one's objects.
        let other = tempfile::tempdir().unwrap();
        git(other.path(), &["init", "-q"]);
        let alt = other.path().join(".git/objects/info/alternates");
        std::fs::write(&alt, format!("# borrowed\n{}\n", objects(&t).display())).unwrap();
        let s = open(&other.path().join(".git/objects"), &id, data.len() as u64, &scratch())
            .unwrap()
            .expect("via alternates");
        assert_eq!(read_all(s).unwrap(), data);
    }

    #[test]
    fn corrupt_and_truncated_objects_fail_at_the_end_naming_the_blob() {
        let data = bytes(100_000, 4);
        let (t, id) = repo_with(&data, &[]);
        let hex = id.to_string();
        let path = objects(&t).join(&hex[..2]).join(&hex[2..]);
        // Other bytes of the same size, a valid zlib stream: only the
        // SHA-1 check can tell.
        let other = t.path().join("other.bin");
        std::fs::write(&other, bytes(100_000, 6)).unwrap();
        let oid = git(t.path(), &["hash-object", "-w", other.to_str().unwrap()]);
        let opath = objects(&t).join(&oid[..2]).join(&oid[2..]);
        let good = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::copy(&opath, &path).unwrap();
        let e = read_all(open(&objects(&t), &id, 100_000, &scratch()).unwrap().unwrap()).unwrap_err().to_string();
        assert!(e.contains(&hex) && e.contains("hash to"), "{e}");
        // Cut short: the stream ends before its bytes.
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        let r = open(&objects(&t), &id, 100_000, &scratch()).and_then(|s| read_all(s.unwrap()));
        let e = r.unwrap_err().to_string();
        assert!(e.contains(&hex), "{e}");
        // Extra bytes after the blob's: refused too.
        let mut longer = data.clone();
        longer.extend_from_slice(b"tail");
        std::fs::write(&other, &longer).unwrap();
        let lid = git(t.path(), &["hash-object", "-w", other.to_str().unwrap()]);
        let lpath = objects(&t).join(&lid[..2]).join(&lid[2..]);
        std::fs::remove_file(&path).unwrap();
        std::fs::copy(&lpath, &path).unwrap();
        let e = open(&objects(&t), &id, 100_000, &scratch()).err().expect("the header says 100004").to_string();
        assert!(e.contains("100004"), "{e}");
    }
}
