//! A workspace as a plain directory: its `.mado` state, the stat cache that
//! spares unchanged files a re-read, the walk that stages a checkpoint,
//! and materializing a snapshot into it (resume).

use crate::workspace::commit::commit;
use crate::workspace::commit::{Walked, WalkedStat};
use std::collections::HashMap;
use std::os::unix::ffi::OsStringExt;

use super::lease::release_lease;
use super::lease::{lease_expected, take_lease_seen, Seen};
use super::{holder_id, holder_prefix, CheckpointLease, CheckpointReport, ResumeLease, ResumeReport, STATE_DIR};
use crate::cache::DiskCache;
use crate::error::{Error, Next, Result};
use crate::fetch::Fetcher;
use crate::hash::{Hash, SnapshotId, TreeId};
use crate::object::{Entry, Kind, Lease, RefValue, StatObject, Tree};
use crate::upload::Staged;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The working copy's state (`DIR/.mado/workspace.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LocalState {
    pub name: String,
    pub remote: String,
    /// The snapshot the working copy was last checked out or checkpointed at.
    pub head: String,
    /// This working copy's lease holder id.
    pub holder: String,
    /// Resumed without the lease (`--read-only`): never checkpoints.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// The snapshot a checkpoint is moving the ref to, recorded before the
    /// ref moves: if the process dies after the ref moved and before `head`
    /// was saved, the next checkpoint knows the ref's new value is its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// A workspace mount's state only: whether it may hold changes no
    /// checkpoint has. Set while mounted (a daemon killed -9 leaves it so),
    /// and to what is known at a clean unmount; absent (older mado): not
    /// known, taken as yes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncheckpointed: Option<bool>,
}

impl LocalState {
    /// Whether the workspace's ref at snapshot `hex` is where this copy
    /// left it: its base, or the checkpoint it has pending.
    pub fn is_at(&self, hex: &str) -> bool {
        self.head == hex || self.pending.as_deref() == Some(hex)
    }
}

pub(super) use super::statcache::{StatCache, StatRow};

pub(super) fn state_dir(dir: &Path) -> PathBuf {
    dir.join(STATE_DIR)
}

/// The working copy holding `start` (it or an ancestor has `.mado/`).
pub fn find_working_copy(start: &Path) -> Option<PathBuf> {
    let mut p = std::path::absolute(start).ok()?;
    loop {
        if state_dir(&p).join("workspace.json").is_file() {
            return Some(p);
        }
        if !p.pop() {
            return None;
        }
    }
}

pub fn load_state(dir: &Path) -> Result<LocalState> {
    load_state_at(&state_dir(dir))
}

/// Loads the state kept in folder `sd` (a working copy's `.mado`, or a
/// mounted workspace's folder in the cache).
pub fn load_state_at(sd: &Path) -> Result<LocalState> {
    let dir = sd.parent().unwrap_or(sd);
    let p = sd.join("workspace.json");
    // Not a plain read: a FIFO planted there must not hang the command.
    let text = match crate::fsutil::read_regular(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::User(format!(
                "{} is not a workspace's working copy (no {})",
                dir.display(),
                p.display()
            ))
            .then(Next::CreateWorkspace))
        }
        Err(e) => {
            return Err(Error::local_state(&p, format!("unreadable ({e}); remove it and resume the workspace afresh")))
        }
    };
    serde_json::from_slice(&text).map_err(|e| {
        Error::local_state(&p, format!("unreadable ({e}); restore it from a backup, or resume the workspace afresh"))
    })
}

pub(super) fn save_state(dir: &Path, s: &LocalState) -> Result<()> {
    save_state_at(&state_dir(dir), s)
}

pub(super) fn save_state_at(d: &Path, s: &LocalState) -> Result<()> {
    std::fs::create_dir_all(d).map_err(Error::io(format!("creating {}", d.display())))?;
    let text = serde_json::to_string_pretty(s).map_err(|e| Error::Internal(format!("encoding workspace.json: {e}")))?;
    crate::fsutil::save_atomic(&d.join("workspace.json"), text.as_bytes())
}

pub(super) fn ns(t: std::io::Result<SystemTime>) -> i64 {
    t.ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

/// What the stat cache compares of a file's metadata.
fn row_of(m: &std::fs::Metadata, id: Hash, chunked: bool, gitlink: bool) -> StatRow {
    StatRow {
        size: m.len(),
        mtime_ns: m.mtime().saturating_mul(1_000_000_000).saturating_add(m.mtime_nsec()),
        ctime_ns: m.ctime().saturating_mul(1_000_000_000).saturating_add(m.ctime_nsec()),
        ino: m.ino(),
        id,
        chunked,
        gitlink,
        dir: false,
    }
}

pub(super) fn load_statcache(dir: &Path) -> StatCache {
    super::statcache::load(&state_dir(dir))
}

pub(super) fn save_statcache(dir: &Path, c: &StatCache) {
    super::statcache::save(&state_dir(dir), c)
}

/// One directory as the scan found it.
struct Listing {
    /// Its entries that are not left out, with their metadata.
    entries: Vec<(Vec<u8>, std::fs::Metadata)>,
    /// How many entries it has on disk, left out or not.
    on_disk: usize,
}

/// A directory waiting to be scanned: where it is, its path in the tree,
/// and the ignore rules in force above it.
type ScanItem = (PathBuf, Vec<u8>, crate::ignore_rules::Stack);

struct ScanQueue {
    todo: Vec<ScanItem>,
    /// Directories queued or being scanned.
    pending: usize,
    failed: Option<Error>,
}

/// Phase 1 of a walk: every directory of the working copy listed and every
/// entry stat'ed, on all cores (a checkpoint of an unchanged 40k-file
/// tree is nothing but these syscalls), leaving out `.mado` and what the
/// ignore rules skip. Directories are the unit of work, taken from one
/// shared queue; nothing recurses, so no depth can overflow a stack.
/// Returns the listings by path and how many paths were left out.
fn scan(dir: &Path, sc: &StatCache, ign: &crate::ignore_rules::Ignores) -> Result<(HashMap<Vec<u8>, Listing>, u64)> {
    use std::sync::{Condvar, Mutex};
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 4);
    let queue = Mutex::new(ScanQueue {
        todo: vec![(dir.to_path_buf(), Vec::new(), Default::default())],
        pending: 1,
        failed: None,
    });
    let woken = Condvar::new();
    let skipped = std::sync::atomic::AtomicU64::new(0);
    let worker = || {
        let mut found = Vec::new();
        loop {
            let item = {
                let mut q = queue.lock().expect("scan queue");
                loop {
                    if q.failed.is_some() {
                        return found;
                    }
                    if let Some(item) = q.todo.pop() {
                        break item;
                    }
                    if q.pending == 0 {
                        return found;
                    }
                    q = woken.wait(q).expect("scan queue");
                }
            };
            let rel = item.1.clone();
            let r = scan_dir(item, sc, ign, &skipped);
            let mut q = queue.lock().expect("scan queue");
            q.pending -= 1;
            match r {
                Ok((listing, subdirs)) => {
                    q.pending += subdirs.len();
                    q.todo.extend(subdirs);
                    found.push((rel, listing));
                }
                Err(e) => {
                    q.failed.get_or_insert(e);
                }
            }
            woken.notify_all();
        }
    };
    let found: Vec<Vec<(Vec<u8>, Listing)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        handles.into_iter().map(|h| h.join().expect("a scan thread panicked")).collect()
    });
    if let Some(e) = queue.into_inner().expect("scan queue").failed {
        return Err(e);
    }
    Ok((found.into_iter().flatten().collect(), skipped.into_inner()))
}

/// Lists and stats one directory; returns it and its subdirectories to scan.
fn scan_dir(
    (abs, rel, above): ScanItem,
    sc: &StatCache,
    ign: &crate::ignore_rules::Ignores,
    skipped: &std::sync::atomic::AtomicU64,
) -> Result<(Listing, Vec<ScanItem>)> {
    let read = |e: std::io::Error| Error::Io { context: format!("reading {}", abs.display()), source: e };
    let listed: Vec<std::fs::DirEntry> =
        std::fs::read_dir(&abs).map_err(read)?.collect::<std::io::Result<_>>().map_err(read)?;
    // The rule files are read only where they are listed.
    let rules = ign.enter(&abs, listed.iter().map(|de| de.file_name()), &above)?;
    let mut out = Listing { entries: Vec::with_capacity(listed.len()), on_disk: listed.len() };
    let mut subdirs = Vec::new();
    for de in listed {
        let name = de.file_name().into_vec();
        if rel.is_empty() && name == STATE_DIR.as_bytes() {
            continue;
        }
        // Stat'ed relative to the open directory: no path walk per file.
        let m =
            de.metadata().map_err(|e| Error::Io { context: format!("reading {}", de.path().display()), source: e })?;
        let r = if rel.is_empty() { name.clone() } else { [&rel[..], b"/", &name].concat() };
        let p = abs.join(std::ffi::OsStr::from_bytes(&name));
        if ign.skips(&rules, &name, &p, m.is_dir(), || tracked(sc, &r, m.is_dir())) {
            skipped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            continue;
        }
        if m.is_dir() {
            subdirs.push((p, r, rules.clone()));
        }
        out.entries.push((name, m));
    }
    Ok((out, subdirs))
}

/// Phase 2 of a walk: from the listings, stage the content of every file
/// the stat cache does not vouch for, and every tree.
struct Stager<'a> {
    dir: &'a Path,
    cache: &'a DiskCache,
    staged: &'a mut Staged,
    sc: &'a StatCache,
    /// Directory rows of `sc` may be used (their trees are the base's).
    reuse_dirs: bool,
    /// The next stat cache's rows (sorted once at the end).
    rows: Vec<(Vec<u8>, StatRow)>,
    listings: HashMap<Vec<u8>, Listing>,
    w: Walked,
    /// Every path's mtime (the stat object), sorted once at the end.
    times: Vec<(Vec<u8>, i64, u32)>,
}

impl Stager<'_> {
    fn dir_tree(&mut self, rel: &[u8]) -> Result<Hash> {
        let Some(listing) = self.listings.remove(rel) else {
            return Err(Error::Internal(format!("the walk did not list {:?}", String::from_utf8_lossy(rel))));
        };
        let mut entries = Vec::with_capacity(listing.entries.len());
        // Whether every entry is as the stat cache recorded it (then so is
        // this directory's tree, if its entry count is too).
        let mut as_recorded = self.reuse_dirs;
        for (name, m) in listing.entries {
            let r = if rel.is_empty() { name.clone() } else { [rel, b"/", &name].concat() };
            let p = || self.dir.join(std::ffi::OsStr::from_bytes(&r));
            let ft = m.file_type();
            if !(ft.is_dir() || ft.is_symlink() || ft.is_file()) {
                // Sockets, FIFOs, devices: not source. Left out, and counted
                // with the ignored paths; no mtime is recorded for them (a
                // resume would have nothing to set it on).
                self.w.ignored += 1;
                as_recorded = false;
                continue;
            }
            self.times.push((r.clone(), m.mtime(), m.mtime_nsec() as u32));
            let gitlink = self.sc.rows.get(&r).filter(|row| row.gitlink && ft.is_dir());
            let empty = || self.listings.get(&r).is_some_and(|l| l.on_disk == 0);
            let entry = if let Some(row) = gitlink.filter(|_| empty()) {
                let id = row.id;
                self.rows.push((r.clone(), row.clone()));
                self.listings.remove(&r);
                Entry { name, kind: Kind::Gitlink, chunked: false, size: 0, id }
            } else if ft.is_dir() {
                let id = self.dir_tree(&r)?;
                as_recorded &= self.sc.rows.get(&r).is_some_and(|row| row.dir && row.id == id);
                Entry { name, kind: Kind::Directory, chunked: false, size: 0, id }
            } else if ft.is_symlink() {
                // No row: its target is read every time.
                as_recorded = false;
                let p = p();
                let target = std::fs::read_link(&p).map_err(Error::io(format!("reading {}", p.display())))?;
                let t = target.as_os_str().as_bytes();
                let (id, _) = self.staged.content(self.cache, t)?;
                Entry { name, kind: Kind::Symlink, chunked: false, size: t.len() as u64, id }
            } else if ft.is_file() {
                let kind = if m.permissions().mode() & 0o111 != 0 { Kind::Executable } else { Kind::File };
                let now = row_of(&m, Hash([0; 32]), false, false);
                // A file's row (not a gitlink's or a directory's).
                let row = self.sc.rows.get(&r).filter(|row| !row.gitlink && !row.dir);
                let cached = row.filter(|row| {
                    row.size == now.size
                        && row.mtime_ns == now.mtime_ns
                        && row.ctime_ns == now.ctime_ns
                        && row.ino == now.ino
                        && row.mtime_ns < self.sc.written_ns
                });
                as_recorded &= cached.is_some();
                let (id, chunked, size) = match cached {
                    Some(row) => {
                        self.w.files_unchanged += 1;
                        (row.id, row.chunked, m.len())
                    }
                    None => {
                        self.w.files_read += 1;
                        // Its id in the base, when the base is the cache's.
                        let was = row.filter(|row| self.reuse_dirs && !row.chunked).map(|row| row.id);
                        self.staged.file_was(self.cache, &p(), was)?
                    }
                };
                // The size is what was read (a file written to meanwhile is
                // recorded as read, and hashed again next time: its mtime
                // moved).
                self.rows.push((r, StatRow { id, chunked, ..now }));
                Entry { name, kind, chunked, size, id }
            } else {
                // Left out above.
                continue;
            };
            entries.push(entry);
        }
        let count = entries.len() as u64;
        let recorded = self.sc.rows.get(rel).filter(|row| row.dir && row.size == count);
        let id = match recorded.filter(|_| as_recorded) {
            // Unchanged since the base: its tree is the base's.
            Some(row) => row.id,
            None => {
                // A state folder below the root: another working copy
                // inside this one (the tree would refuse the name).
                let nested = entries.iter().any(|e| e.name.eq_ignore_ascii_case(STATE_DIR.as_bytes()));
                let tree = Tree::normalized(entries).map_err(|e| {
                    let mut reason = e.to_string();
                    if nested {
                        let dir = String::from_utf8_lossy(rel);
                        reason.push_str(&format!(
                            "\n  hint: {dir:?} is a working copy of its own; to checkpoint this one, \
                             leave it out with a line `/{dir}/` in {}",
                            self.dir.join(".madoignore").display()
                        ));
                    }
                    Error::UnsafePath { path: String::from_utf8_lossy(rel).into_owned(), reason }
                })?;
                self.staged.tree(self.cache, &tree)?
            }
        };
        let row =
            StatRow { size: count, mtime_ns: 0, ctime_ns: 0, ino: 0, id, chunked: false, gitlink: false, dir: true };
        self.rows.push((rel.to_vec(), row));
        Ok(id)
    }
}

/// Walks the working copy at `dir` into the cache: its new tree (every
/// changed file staged in the cache), its stat object and its next stat
/// cache.
/// `base`: the snapshot the working copy stands on, when the stat cache's
/// directory rows may be trusted for it (see [`StatRow::dir`]); `None` to
/// re-encode every directory.
pub(super) fn stage(dir: &Path, cache: &DiskCache, no_ignore: bool, base: Option<SnapshotId>) -> Result<Walked> {
    let mut staged = Staged::default();
    let sc = load_statcache(dir);
    let written_ns = ns(Ok(SystemTime::now()));
    let ign = crate::ignore_rules::Ignores::new(!no_ignore, !sc.rows.is_empty());
    let root_meta = std::fs::symlink_metadata(dir).map_err(Error::io(format!("reading {}", dir.display())))?;
    let (listings, ignored) = scan(dir, &sc, &ign)?;
    let w = Walked {
        root: TreeId::from_hash(Hash([0; 32])),
        stat: WalkedStat::Whole(StatObject::default()),
        files_read: 0,
        files_unchanged: 0,
        trees_built: None,
        statcache: None,
        ignored,
    };
    let times = vec![(Vec::new(), root_meta.mtime(), root_meta.mtime_nsec() as u32)];
    let reuse_dirs = base.is_some() && sc.head == base;
    let mut st = Stager { dir, cache, staged: &mut staged, sc: &sc, reuse_dirs, rows: Vec::new(), listings, w, times };
    // Building trees recurses once per level.
    st.w.root = TreeId::from_hash(crate::fsutil::on_deep_stack(|| st.dir_tree(&[]))?);
    let mut w = st.w;
    st.times.sort_unstable();
    w.stat = WalkedStat::Whole(StatObject::whole(st.times));
    // The head is set once the checkpoint names the snapshot these trees
    // are in.
    w.statcache = Some(StatCache { written_ns, rows: st.rows.into_iter().collect(), head: None });
    Ok(w)
}

/// Checkpoints the working copy at `dir` (a plain directory).
pub async fn checkpoint(
    fetcher: &Arc<Fetcher>,
    dir: &Path,
    message: &str,
    lease: CheckpointLease,
) -> Result<CheckpointReport> {
    let mut st = load_state(dir)?;
    let dir2 = dir.to_path_buf();
    // Directory rows name trees of the snapshot the cache was written for:
    // trusted only when that is the base this checkpoint goes on (not
    // after a checkpoint that may have moved the ref without saying so,
    // nor when forcing over a ref that moved).
    let base = match (&st.pending, lease.force) {
        (None, false) => st.head.parse().ok(),
        _ => None,
    };
    let stage = move |cache: Arc<DiskCache>| stage(&dir2, &cache, lease.no_ignore, base);
    let (report, mut walked, _, unlock) = commit(fetcher, &st, &state_dir(dir), message, lease, true, stage).await?;
    let saved = (|| {
        if !report.unchanged || st.pending.is_some() {
            st.head = report.snapshot.clone();
            st.pending = None;
            save_state(dir, &st)?;
        }
        if let Some(sc) = &mut walked.statcache {
            sc.head = report.snapshot.parse().ok();
            save_statcache(dir, sc);
        }
        Ok::<_, Error>(())
    })();
    unlock.done().await;
    saved?;
    Ok(report)
}

/// The marker a resume leaves in the working copy's state folder until its
/// state is saved (FORMAT.md): what is in a directory holding it and no
/// `workspace.json` was written by a resume that did not finish.
const RESUMING: &str = "resuming";

/// Makes `dir` (and its state folder) and marks it as being resumed, by
/// lease holder `holder` of workspace `name`.
fn mark_resuming(dir: &Path, name: &str, holder: &str) -> Result<()> {
    let sd = state_dir(dir);
    std::fs::create_dir_all(&sd).map_err(Error::io(format!("creating {}", sd.display())))?;
    crate::fsutil::save_atomic(&sd.join(RESUMING), format!("{name}\n{holder}\n").as_bytes())
}

/// Whether `dir` holds what an interrupted resume left: a real state folder
/// (not a symlink) with the marker in it and no saved state.
fn interrupted_resume(dir: &Path) -> bool {
    let sd = state_dir(dir);
    let real_dir = std::fs::symlink_metadata(&sd).is_ok_and(|m| m.is_dir());
    real_dir
        && std::fs::symlink_metadata(sd.join(RESUMING)).is_ok_and(|m| m.is_file())
        && std::fs::symlink_metadata(sd.join("workspace.json")).is_err()
}

/// The workspace and lease holder of the interrupted resume whose partial
/// copy `dir` holds, if it holds one.
pub fn interrupted_resume_of(dir: &Path) -> Option<(String, String)> {
    if !interrupted_resume(dir) {
        return None;
    }
    let text = std::fs::read_to_string(state_dir(dir).join(RESUMING)).ok()?;
    let mut lines = text.lines();
    let name = lines.next()?.to_string();
    // A marker of the first form holds the name only.
    Some((name, lines.next().unwrap_or_default().to_string()))
}

/// A held lease, with the way out when its holder is an interrupted
/// resume on this machine (Ctrl-C, kill -9: the lease stays for 15 minutes,
/// and the usual hint, `ws release` in the holder, found no working copy).
fn explain_held(e: Error) -> Error {
    let Error::LeaseHeld { name, holder, .. } = &e else { return e };
    let Some(dir) = holder_dir_here(holder) else { return e };
    match interrupted_resume_of(&dir) {
        Some((_, h)) if h == *holder => {
            Error::User(format!("workspace {name} is leased by a resume into {} that was interrupted", dir.display()))
                .then(Next::FinishResume { name: name.clone(), dir: dir.display().to_string() })
        }
        _ => e,
    }
}

/// The directory lease holder `holder` names, when it is of this machine
/// (`user@host:DIR:nonce`).
fn holder_dir_here(holder: &str) -> Option<PathBuf> {
    let (_, _, dir) = crate::error::holder_parts(holder)?;
    let dir = Path::new(dir);
    holder.starts_with(&holder_prefix(dir)).then(|| dir.to_path_buf())
}

/// The holder of lease `cur` when it names directory `dir` on this machine
/// (`user@host:DIR:nonce`, as [`holder_id`] makes for `dir`).
fn abandoned_here(cur: &Seen, dir: &Path) -> Option<String> {
    let (bytes, _) = cur.as_ref()?;
    let l = Lease::decode(bytes).ok()?;
    let nonce = l.holder.strip_prefix(&holder_prefix(dir))?;
    (nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_hexdigit())).then_some(l.holder)
}

/// Checks out `snapshot` into `dir` and records the working copy.
pub(super) async fn materialize_into(
    fetcher: &Arc<Fetcher>,
    name: &str,
    at: &RefValue,
    dir: &Path,
    lease_mode: ResumeLease,
    seen: Option<Seen>,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ResumeReport> {
    // What a resume into this directory left when it was interrupted
    // (Ctrl-C, kill -9: its marker, and no state yet) is its own partial
    // copy: removed (once the tree shows nothing else is there), and this
    // resume starts over.
    let partial = interrupted_resume(dir);
    // A directory this resume makes goes again if it fails.
    let made = std::fs::symlink_metadata(dir).is_err();
    let undo = || crate::fsutil::undo_dir(dir, made);
    // The lease is taken alongside the checkout: refuse a non-empty target
    // first, so a failed resume does not hold the lease for nothing.
    if !partial && !crate::checkout::is_empty_dir(dir)? {
        return Err(Error::User(format!("{} is not empty; resume into a new or empty directory", dir.display())));
    }
    // A lease held for this same directory on this machine, now empty, is
    // one whose copy is gone (a resume into it killed or interrupted before
    // it finished, or a copy deleted without `ws release`): taken over as
    // that holder, rather than waiting for it to expire.
    let held_here = seen.as_ref().and_then(|cur| abandoned_here(cur, dir));
    let holder = held_here.unwrap_or_else(|| holder_id(dir));
    // A lease already seen held by another is refused before any work.
    if let (ResumeLease::Take { steal }, Some(cur)) = (lease_mode, &seen) {
        lease_expected(name, &holder, steal, cur).map_err(explain_held)?;
    }
    // Round trips: the snapshot and the pack index together (the ref named
    // the root); then the packs, the stat object and the lease together.
    let (snapshot, root) = (at.snapshot, at.root);
    let (snap, attach) = futures::join!(fetcher.snapshot(snapshot), fetcher.attach_hinted(*root, &at.layers));
    let snap = snap?;
    attach?;
    if snap.root != root {
        return Err(Error::Corrupt {
            id: *snapshot,
            what: "snapshot",
            path: name.to_string(),
            detail: "the workspace ref names a different root tree than its snapshot".into(),
        });
    }
    if partial {
        if let Some(p) = crate::checkout::first_foreign(fetcher, *root, dir, &[STATE_DIR]).await? {
            return Err(Error::User(format!(
                "{} holds the partial copy an interrupted resume left, and {p}, which this resume would not \
                 have written; move away what you put there and run this again (it then removes the rest and \
                 starts over), or resume into another directory",
                dir.display()
            )));
        }
        crate::fsutil::empty_dir(dir).map_err(Error::io(format!("removing the partial copy in {}", dir.display())))?;
    }
    let stat_fut = fetcher.stat_of(&snap);
    // Marked before a file is written, so that an interrupted resume's
    // files are known to be its own (`interrupted_resume`).
    mark_resuming(dir, name, &holder)?;
    let co_fut = crate::checkout::checkout(
        fetcher,
        *snap.root,
        dir,
        crate::checkout::CheckoutOptions { force: false, allow_name: Some(super::STATE_DIR), paths: &[], progress },
    );
    let lease_fut = async {
        match lease_mode {
            ResumeLease::Take { steal } => take_lease_seen(&fetcher.remote, name, &holder, steal, seen).await,
            ResumeLease::ReadOnly => Ok(()),
        }
    };
    let (stat, co, lease) = futures::join!(stat_fut, co_fut, lease_fut);
    if let Err(e) = lease {
        // No copy that looks like a working copy but cannot checkpoint:
        // the directory was empty, so it is emptied again.
        undo();
        return Err(e);
    }
    let (stat, co) = match (stat, co) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => {
            if let ResumeLease::Take { .. } = lease_mode {
                let _ = release_lease(&fetcher.remote, name, &holder).await;
            }
            // Nor half a copy: the directory was empty, so it is again.
            undo();
            return Err(e);
        }
    };
    let mut report = ResumeReport {
        workspace: name.to_string(),
        snapshot: snapshot.to_hex(),
        // Absolute: a script reading --json may run elsewhere.
        dir: std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()).display().to_string(),
        files: co.files + co.symlinks,
        read_only: matches!(lease_mode, ResumeLease::ReadOnly),
        removed_partial: partial,
        ..Default::default()
    };
    crate::failpoint::hit("resume-before-state");
    // State first: writing into `.mado/` touches the root's mtime, which
    // is restored next.
    save_state(
        dir,
        &LocalState {
            name: name.to_string(),
            remote: fetcher.remote.url().to_string(),
            head: snapshot.to_hex(),
            holder,
            read_only: matches!(lease_mode, ResumeLease::ReadOnly),
            pending: None,
            uncheckpointed: None,
        },
    )?;
    // A working copy now: nothing here is a partial copy any more.
    let _ = std::fs::remove_file(state_dir(dir).join(RESUMING));
    if let Some(stat) = &stat {
        crate::checkout::set_mtimes(dir, &stat.entries)?;
        report.mtimes_restored = stat.entries.len() as u64;
    }
    // Seed the stat cache from what was just written: the ids are known,
    // so a stat per file is enough (no re-reading).
    let dir2 = dir.to_path_buf();
    let written = co.written;
    tokio::task::spawn_blocking(move || {
        let mut sc = StatCache { written_ns: ns(Ok(SystemTime::now())), rows: BTreeMap::new(), head: Some(snapshot) };
        for (rel, e) in written {
            let p = dir2.join(std::ffi::OsStr::from_bytes(&rel));
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                sc.rows.insert(rel, row_of(&m, e.id, e.chunked, e.kind == Kind::Gitlink));
            }
        }
        save_statcache(&dir2, &sc);
    })
    .await
    .map_err(|e| Error::Io { context: "stat cache".into(), source: std::io::Error::other(e) })?;
    Ok(report)
}

/// Whether the stat cache knows `key`, or (a directory) anything below it.
fn tracked(sc: &StatCache, key: &[u8], is_dir: bool) -> bool {
    if sc.rows.contains_key(key) {
        return true;
    }
    if !is_dir {
        return false;
    }
    let prefix = [key, b"/"].concat();
    sc.rows.range(prefix.clone()..).next().is_some_and(|(k, _)| k.starts_with(&prefix))
}
