//! One large blob read out of a git object database as a stream, so an
//! import holds a chunk of it in memory, never the whole file (gix loads a
//! blob whole; git itself streams the blobs it stores undeltified, which
//! is how it stores anything above `core.bigFileThreshold`).
//!
//! Two places are read: a loose object (`objects/xx/yyyy…`, a zlib stream
//! of `blob <size>\0<bytes>`) and a whole (non-delta) entry of a pack found
//! through the pack's `.idx`; alternates are followed one level. Anything
//! else (a delta entry, a repository layout this does not know) answers
//! `None`, and the caller loads the blob whole as before. The bytes are
//! checked against the blob's SHA-1 as they stream by: a corrupt or
//! truncated object fails the read at its end, naming the blob.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use gix::hash::ObjectId;

/// Pack entry type of a whole blob (git's `OBJ_BLOB`).
const PACK_BLOB: u8 = 3;

/// A blob's content, inflated as it is read and checked at its end.
pub struct BlobStream {
    input: BufReader<File>,
    inflate: gix::zlib::Decompress,
    hasher: gix::hash::Hasher,
    oid: ObjectId,
    size: u64,
    remaining: u64,
    checked: bool,
}

/// Opens blob `oid` of `size` bytes (its header size) for streaming, or
/// `None` when it is not stored in a way this reads.
pub fn open(objects: &Path, oid: &ObjectId, size: u64) -> std::io::Result<Option<BlobStream>> {
    open_in(objects, oid, size, true)
}

fn open_in(objects: &Path, oid: &ObjectId, size: u64, alternates: bool) -> std::io::Result<Option<BlobStream>> {
    let hex = oid.to_hex().to_string();
    let loose = objects.join(&hex[..2]).join(&hex[2..]);
    if let Ok(f) = File::open(&loose) {
        let mut s = BlobStream::new(f, *oid, size);
        s.loose_header()?;
        return Ok(Some(s));
    }
    for idx in pack_indexes(objects) {
        let Ok(index) = gix::odb::pack::index::File::at(&idx, gix::hash::Kind::Sha1) else { continue };
        let Some(i) = index.lookup(oid) else { continue };
        let offset = index.pack_offset_at_index(i);
        let mut f = File::open(idx.with_extension("pack"))?;
        f.seek(SeekFrom::Start(offset))?;
        let mut s = BlobStream::new(f, *oid, size);
        return match s.pack_header()? {
            true => Ok(Some(s)),
            false => Ok(None),
        };
    }
    if alternates {
        for alt in alternate_dirs(objects) {
            if let Some(s) = open_in(&alt, oid, size, false)? {
                return Ok(Some(s));
            }
        }
    }
    Ok(None)
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

impl BlobStream {
    fn new(f: File, oid: ObjectId, size: u64) -> BlobStream {
        BlobStream {
            input: BufReader::with_capacity(256 << 10, f),
            inflate: gix::zlib::Decompress::new(),
            hasher: gix::hash::hasher(gix::hash::Kind::Sha1),
            oid,
            size,
            remaining: size,
            checked: false,
        }
    }

    /// Starts the object id's hash with git's `blob <size>\0` header.
    fn hash_header(&mut self) {
        self.hasher.update(format!("blob {}\0", self.size).as_bytes());
    }

    /// A loose object inflates to `blob <size>\0` then the bytes.
    fn loose_header(&mut self) -> std::io::Result<()> {
        let mut header = Vec::new();
        loop {
            let mut b = [0u8; 1];
            if self.inflate_into(&mut b)? == 0 || header.len() > 64 {
                return Err(corrupt(&self.oid, "its loose object header does not end"));
            }
            if b[0] == 0 {
                break;
            }
            header.push(b[0]);
        }
        let want = format!("blob {}", self.size);
        if header != want.as_bytes() {
            return Err(corrupt(
                &self.oid,
                format!("loose header {:?}, expected {want:?}", String::from_utf8_lossy(&header)),
            ));
        }
        self.hash_header();
        Ok(())
    }

    /// A pack entry starts with its type and inflated size (a varint);
    /// false when it is not a whole blob (a delta, say).
    fn pack_header(&mut self) -> std::io::Result<bool> {
        let mut byte = || -> std::io::Result<u8> {
            let mut b = [0u8; 1];
            self.input.read_exact(&mut b)?;
            Ok(b[0])
        };
        let first = byte()?;
        let kind = (first >> 4) & 7;
        let mut len = (first & 0x0f) as u64;
        let mut shift = 4;
        let mut b = first;
        while b & 0x80 != 0 {
            b = byte()?;
            if shift > 57 {
                return Err(corrupt(&self.oid, "its pack entry size does not end"));
            }
            len |= ((b & 0x7f) as u64) << shift;
            shift += 7;
        }
        if kind != PACK_BLOB {
            return Ok(false);
        }
        if len != self.size {
            return Err(corrupt(&self.oid, format!("pack entry of {len} bytes, expected {}", self.size)));
        }
        self.hash_header();
        Ok(true)
    }

    fn inflate_into(&mut self, dst: &mut [u8]) -> std::io::Result<usize> {
        gix::zlib::stream::inflate::read(&mut self.input, &mut self.inflate, dst)
            .map_err(|e| corrupt(&self.oid, format!("inflating: {e}")))
    }

    /// At the end: nothing left to inflate and the bytes hash to the id.
    fn finish(&mut self) -> std::io::Result<()> {
        let mut extra = [0u8; 1];
        if self.inflate_into(&mut extra)? != 0 {
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
        let n = self.inflate_into(&mut buf[..want])?;
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
mod tests {
    use super::*;
    use crate::chunk::tests::pseudo_random as bytes;

    fn git(repo: &Path, args: &[&str]) -> String {
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

    fn objects(t: &tempfile::TempDir) -> PathBuf {
        t.path().join(".git/objects")
    }

    #[test]
    fn a_loose_blob_streams_its_bytes() {
        let data = bytes(300_000, 1);
        let (t, id) = repo_with(&data, &[]);
        let s = open(&objects(&t), &id, data.len() as u64).unwrap().expect("a loose object streams");
        assert_eq!(read_all(s).unwrap(), data);
        // A size other than the object's is refused before any byte.
        let e = open(&objects(&t), &id, 5).err().expect("a wrong size is refused").to_string();
        assert!(e.contains("loose header") && e.contains(&id.to_string()), "{e}");
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
        let s = open(&objects(&t), &id, data.len() as u64).unwrap().expect("a whole entry streams");
        assert_eq!(read_all(s).unwrap(), data);
        let e = open(&objects(&t), &id, 7).err().expect("a wrong size is refused").to_string();
        assert!(e.contains("pack entry of 200000 bytes"), "{e}");

        // Two close versions, repacked: one becomes a delta of the other.
        let mut v2 = data.clone();
        v2[100_000..100_100].fill(0);
        std::fs::write(t.path().join("big.bin"), &v2).unwrap();
        git(t.path(), &["commit", "-qam", "two"]);
        let id2 = ObjectId::from_hex(git(t.path(), &["rev-parse", "HEAD:big.bin"]).as_bytes()).unwrap();
        git(t.path(), &["-c", "core.bigFileThreshold=512m", "repack", "-adfq", "--window=10"]);
        let streams = [(id, data.len()), (id2, v2.len())]
            .map(|(i, n)| open(&objects(&t), &i, n as u64).unwrap().map(read_all).map(|r| r.unwrap()));
        assert!(streams.iter().any(Option::is_none), "one version is a delta, read whole by the caller");
        for (got, want) in streams.iter().zip([&data, &v2]) {
            if let Some(got) = got {
                assert_eq!(got, want);
            }
        }
    }

    /// A pack entry whose size never ends is refused, not shifted past
    /// 64 bits.
    #[test]
    fn an_endless_pack_entry_size_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("bad.pack");
        let mut bytes = vec![0x80 | (PACK_BLOB << 4)];
        bytes.extend([0xff; 12]);
        bytes.push(0);
        std::fs::write(&p, &bytes).unwrap();
        let id = ObjectId::from_hex(b"0123456789012345678901234567890123456789").unwrap();
        let mut s = BlobStream::new(File::open(&p).unwrap(), id, 1);
        let e = s.pack_header().unwrap_err().to_string();
        assert!(e.contains("does not end"), "{e}");
    }

    #[test]
    fn unknown_ids_and_alternates() {
        let data = bytes(50_000, 3);
        let (t, id) = repo_with(&data, &[]);
        let missing = ObjectId::from_hex(b"0123456789012345678901234567890123456789").unwrap();
        assert!(open(&objects(&t), &missing, 1).unwrap().is_none());
        // A second repository borrowing the first one's objects.
        let other = tempfile::tempdir().unwrap();
        git(other.path(), &["init", "-q"]);
        let alt = other.path().join(".git/objects/info/alternates");
        std::fs::write(&alt, format!("# borrowed\n{}\n", objects(&t).display())).unwrap();
        let s = open(&other.path().join(".git/objects"), &id, data.len() as u64).unwrap().expect("via alternates");
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
        let e = read_all(open(&objects(&t), &id, 100_000).unwrap().unwrap()).unwrap_err().to_string();
        assert!(e.contains(&hex) && e.contains("hash to"), "{e}");
        // Cut short: the stream ends before its bytes.
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        let r = open(&objects(&t), &id, 100_000).and_then(|s| read_all(s.unwrap()));
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
        let e = open(&objects(&t), &id, 100_000).err().expect("the header says 100004").to_string();
        assert!(e.contains("100004"), "{e}");
    }
}
