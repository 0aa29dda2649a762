//! What replies carry: attributes as the kernel wants them, times, owners
//! of new nodes, and the offsets and pages of directory listings.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus, TimeOrNow};
use mado_core::vfs::{Attr, NodeKind, SetAttr, SnapshotFs, ROOT_INO};
use mado_core::Error;

/// A time as seconds and nanoseconds, as the kernel gives and takes it
/// (a time before 1970 has negative seconds and nanoseconds counted
/// forward: 1969-12-31 23:59:59.5 is (-1, 500000000)).
pub(super) fn system_time((s, n): (i64, u32)) -> std::time::SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, n)
    } else {
        UNIX_EPOCH - Duration::new(s.unsigned_abs(), 0) + Duration::from_nanos(n as u64)
    }
}

pub(super) fn time_of(t: TimeOrNow) -> (i64, u32) {
    let t = match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => std::time::SystemTime::now(),
    };
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            // fuser 0.18 (time.rs, `system_time_from_time`) makes the
            // kernel's (-s, n) into the epoch minus (s, n), where n counts
            // forward from -s: so the kernel's pair is read straight back
            // from that distance. (Counted as a true time, a touch to
            // 1960-01-01 00:00:00.5 was stored one second early.)
            let d = e.duration();
            (-(d.as_secs() as i64), d.subsec_nanos())
        }
    }
}

/// The caller that makes a node, and the mount's owner.
#[derive(Clone, Copy)]
pub(super) struct Creator {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mount: (u32, u32),
}

impl Creator {
    /// Gives node `a` (just made in `parent`) its owner, when that is not
    /// the mount's; a directory made under a set-group-ID one is one too.
    pub(super) async fn own(self, core: &SnapshotFs, parent: u64, a: Attr) -> mado_core::Result<Attr> {
        let p = core.getattr(parent)?;
        let setgid = p.perm & 0o2000 != 0;
        let gid = match setgid {
            true => p.owner.map_or(self.mount.1, |o| o.1),
            false => self.gid,
        };
        let mode = (setgid && a.kind == NodeKind::Dir).then_some(u32::from(a.perm) | 0o2000);
        if (self.uid, gid) == self.mount && mode.is_none() {
            return Ok(a);
        }
        let owner = ((self.uid, gid) != self.mount).then_some((self.uid, gid));
        let set = SetAttr { mode, uid: owner.map(|o| o.0), gid: owner.map(|o| o.1), ..Default::default() };
        core.setattr(a.ino, set).await
    }
}

/// Who owns a node nobody chowned: the user running the daemon.
#[derive(Clone, Copy)]
pub(super) struct Owner {
    pub(super) uid: u32,
    pub(super) gid: u32,
}

impl Owner {
    pub(super) fn attr(self, a: &Attr) -> FileAttr {
        let at = system_time;
        let t = at((a.mtime, a.mtime_ns));
        let (uid, gid) = a.owner.unwrap_or((self.uid, self.gid));
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: at(a.atime),
            mtime: t,
            ctime: at(a.ctime),
            crtime: t,
            kind: match a.kind {
                NodeKind::Dir => FileType::Directory,
                NodeKind::File => FileType::RegularFile,
                NodeKind::Symlink => FileType::Symlink,
                NodeKind::Fifo => FileType::NamedPipe,
                NodeKind::Socket => FileType::Socket,
                NodeKind::BlockDev => FileType::BlockDevice,
                NodeKind::CharDev => FileType::CharDevice,
            },
            perm: a.perm,
            nlink: a.nlink,
            uid,
            gid,
            rdev: a.rdev,
            blksize: 4096,
            flags: 0,
        }
    }

    /// What a negative entry carries: inode 0, nothing else that counts.
    pub(super) fn absent(self) -> FileAttr {
        let a = Attr {
            ino: 0,
            kind: NodeKind::File,
            size: 0,
            perm: 0,
            nlink: 0,
            mtime: 0,
            mtime_ns: 0,
            atime: (0, 0),
            ctime: (0, 0),
            owner: None,
            rdev: 0,
        };
        self.attr(&a)
    }

    /// `.`, `..` and the entries, with attributes.
    pub(super) fn dir_entries(
        self,
        core: &SnapshotFs,
        ino: u64,
        list: mado_core::vfs::DirList,
    ) -> Vec<(Vec<u8>, FileAttr)> {
        let mut out = Vec::with_capacity(list.len() + 2);
        if let Ok(a) = core.getattr(ino) {
            out.push((b".".to_vec(), self.attr(&a)));
        }
        if let Ok(a) = core.getattr(if ino == ROOT_INO { ROOT_INO } else { core.parent_of(ino) }) {
            out.push((b"..".to_vec(), self.attr(&a)));
        }
        out.extend(list.into_iter().map(|(n, a)| (n, self.attr(&a))));
        out
    }
}

/// The offsets a listing gives the kernel, with no state per listing:
/// `.` is 1, `..` is 2, and a child's is 3 plus a keyed hash of its name
/// (62 bits; the key is this session's own, so no one can choose names
/// that collide). A directory is listed in that order and a READDIR at
/// offset `o` goes on with the entries whose cookie is above `o`. A name
/// removed or added never moves another, so a listing that unlinks as it
/// reads (`rm -rf`, Rust's `remove_dir_all`) sees every entry that stays
/// exactly once (POSIX), an offset past the end ends the listing, and the
/// kernel needs no OPENDIR or RELEASEDIR (no-opendir mode). Two names of
/// one directory with the same 62 bits could lose one of them in a listing
/// cut between the two; ext4's hashed directories take the same odds.
#[derive(Clone, Default)]
pub(super) struct Cookies(std::hash::RandomState);

impl Cookies {
    /// At most this many entries are sorted for one reply (a reply holds
    /// fewer; the kernel asks again from the last one it took).
    pub(super) const BATCH: usize = 1024;

    pub(super) fn of(&self, name: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        match name {
            b"." => 1,
            b".." => 2,
            _ => 3 + (self.0.hash_one(name) >> 2),
        }
    }

    /// Whether the entry `name` comes after offset `offset`.
    pub(super) fn after(&self, name: &[u8], offset: u64) -> bool {
        self.of(name) > offset
    }

    /// The entries (`.`, `..`, then the children) after `offset`, each with
    /// its cookie: the first [`Cookies::BATCH`] in listing order, the rest
    /// behind them in no order.
    pub(super) fn after_offset(&self, entries: Vec<(Vec<u8>, FileAttr)>, offset: u64) -> Vec<(u64, Vec<u8>, FileAttr)> {
        let mut v: Vec<_> =
            entries.into_iter().map(|(n, a)| (self.of(&n), n, a)).filter(|(c, _, _)| *c > offset).collect();
        let order =
            |a: &(u64, Vec<u8>, FileAttr), b: &(u64, Vec<u8>, FileAttr)| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1));
        if v.len() > Self::BATCH {
            v.select_nth_unstable_by(Self::BATCH, order);
            v[..Self::BATCH].sort_unstable_by(order);
        } else {
            v.sort_unstable_by(order);
        }
        v
    }
}

/// Each entry the kernel takes from a READDIRPLUS reply (all but `.` and
/// `..`) is a reference it will FORGET, like a lookup's; the entries after
/// the offset were counted when listed, and those not sent are given back.
pub(super) fn fill_plus(
    core: &SnapshotFs,
    mut reply: ReplyDirectoryPlus,
    entries: Vec<(u64, Vec<u8>, FileAttr)>,
    ttl: Duration,
) {
    let mut sent = entries.len().min(Cookies::BATCH);
    for (i, (cookie, name, attr)) in entries.iter().enumerate().take(Cookies::BATCH) {
        if reply.add(attr.ino, *cookie, OsStr::from_bytes(name), &ttl, attr, Generation(0)) {
            sent = i;
            break;
        }
    }
    reply.ok();
    let back: Vec<u64> =
        entries[sent..].iter().filter(|(_, name, _)| name != b"." && name != b"..").map(|(_, _, a)| a.ino.0).collect();
    core.uncount(&back);
}

pub(super) fn fill(mut reply: ReplyDirectory, entries: Vec<(u64, Vec<u8>, FileAttr)>) {
    for (cookie, name, attr) in entries.iter().take(Cookies::BATCH) {
        if reply.add(attr.ino, *cookie, attr.kind, OsStr::from_bytes(name)) {
            break;
        }
    }
    reply.ok();
}

/// The one place errors become errnos.
pub(super) fn errno(e: &Error) -> Errno {
    match e.base() {
        Error::Fs { errno, .. } => Errno::from_i32(*errno),
        // A full disk or quota under the upper folder is the writer's to
        // see as such (it was EIO: "Input/output error" for a full disk).
        Error::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)) =>
        {
            tracing::warn!("{e}");
            Errno::from_i32(source.raw_os_error().expect("matched"))
        }
        Error::NotFound(_) => Errno::ENOENT,
        Error::User(_) => Errno::EINVAL,
        e => {
            // The caller only sees EIO: the daemon's log says why.
            tracing::warn!("EIO: {e}");
            Errno::EIO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn entry(name: &str, ino: u64) -> (Vec<u8>, FileAttr) {
        let a = Attr {
            ino,
            size: 0,
            kind: NodeKind::File,
            perm: 0o644,
            mtime: 0,
            mtime_ns: 0,
            atime: (0, 0),
            ctime: (0, 0),
            nlink: 1,
            owner: None,
            rdev: 0,
        };
        (name.as_bytes().to_vec(), Owner { uid: 0, gid: 0 }.attr(&a))
    }

    /// What a directory holds now, as `dir_entries` gives it.
    fn listing(names: &BTreeMap<String, u64>) -> Vec<(Vec<u8>, FileAttr)> {
        let mut v = vec![entry(".", 1), entry("..", 1)];
        v.extend(names.iter().map(|(n, i)| entry(n, *i)));
        v
    }

    /// A listing read a few entries per READDIR while names are removed
    /// (some already listed, some not yet) and added between the calls:
    /// every name there from start to end comes exactly once, and nothing
    /// that was never there comes at all.
    #[test]
    fn a_listing_changed_between_its_pages_loses_and_repeats_nothing() {
        let c = Cookies::default();
        let mut names: BTreeMap<String, u64> = (0..3000).map(|i| (format!("f{i:05}"), 10 + i)).collect();
        let first = names.clone();
        let (mut offset, mut seen, mut next_new) = (0u64, Vec::<String>::new(), 0);
        let mut removed = BTreeSet::new();
        loop {
            let rest = c.after_offset(listing(&names), offset);
            // What READDIRPLUS counts as taken is what the listing holds.
            let picked: BTreeSet<Vec<u8>> =
                listing(&names).into_iter().map(|e| e.0).filter(|n| c.after(n, offset)).collect();
            assert_eq!(picked, rest.iter().map(|e| e.1.clone()).collect::<BTreeSet<_>>());
            let page: Vec<_> = rest.into_iter().take(37).collect();
            if page.is_empty() {
                break;
            }
            for (cookie, name, _) in &page {
                assert!(*cookie > offset, "cookies grow along a listing");
                offset = *cookie;
                seen.push(String::from_utf8(name.clone()).unwrap());
            }
            // Remove one listed name (not the last: the next page starts
            // after it) and one not yet listed; add one.
            let listed = seen.get(seen.len().saturating_sub(5)).cloned();
            for victim in [listed, names.keys().nth(names.len() / 2).cloned()].into_iter().flatten() {
                if names.remove(&victim).is_some() {
                    removed.insert(victim);
                }
            }
            names.insert(format!("new{next_new}"), 100_000 + next_new);
            next_new += 1;
        }
        assert_eq!(&seen[..2], [".", ".."]);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &seen[2..] {
            *counts.entry(n.as_str()).or_default() += 1;
        }
        assert!(counts.values().all(|n| *n == 1), "a name came twice");
        for n in first.keys().filter(|n| !removed.contains(*n)) {
            assert!(counts.contains_key(n.as_str()), "{n} stayed but was never listed");
        }
        for n in counts.keys() {
            assert!(first.contains_key(*n) || n.starts_with("new"), "{n} was never there");
        }
        // An offset past every cookie ends the listing.
        assert!(c.after_offset(listing(&names), u64::MAX >> 1).is_empty());
    }

    /// More entries than one batch: the batch is the first ones in listing
    /// order, and the rest follow it.
    #[test]
    fn a_large_directory_sorts_only_its_first_batch() {
        let c = Cookies::default();
        let names: BTreeMap<String, u64> = (0..5000).map(|i| (format!("n{i}"), 10 + i)).collect();
        let all = c.after_offset(listing(&names), 0);
        assert_eq!(all.len(), 5002);
        let mut sorted: Vec<u64> = all.iter().map(|e| e.0).collect();
        sorted.sort_unstable();
        let batch: Vec<u64> = all[..Cookies::BATCH].iter().map(|e| e.0).collect();
        assert_eq!(batch, sorted[..Cookies::BATCH], "the batch is the smallest cookies, in order");
        assert_eq!((all[0].1.as_slice(), all[1].1.as_slice()), (&b"."[..], &b".."[..]));
        // Exactly one batch (with `.` and `..`): all of it, in order.
        let names: BTreeMap<String, u64> = (0..Cookies::BATCH as u64 - 2).map(|i| (format!("m{i}"), 10 + i)).collect();
        let one = c.after_offset(listing(&names), 0);
        assert_eq!(one.len(), Cookies::BATCH);
        assert!(one.windows(2).all(|w| w[0].0 < w[1].0));
        // Two sessions' cookies differ (each has its own key) but each is
        // the same for a name every time.
        let d = Cookies::default();
        assert_eq!(c.of(b"n1"), c.of(b"n1"));
        assert_ne!((c.of(b"n1"), c.of(b"n2")), (d.of(b"n1"), d.of(b"n2")));
        assert!(c.of(b"n1") >= 3 && c.of(b"n1") < 1 << 63);
    }
}
