//! Workspaces: a ref `ws/<name>`, a single-writer lease, and a local
//! working copy (a plain directory; read-write mounts come later).
//!
//! - **Checkpoint**: walk the working copy (unchanged files are recognised
//!   by a stat cache, as git's index does, not re-read), stage new content
//!   and trees in the disk cache, upload what the store lacks (closure
//!   order), the stat object, the packs, the snapshot, and last move the
//!   ref with compare-and-swap. Killed at any step, the ref is at the old
//!   snapshot or at a complete new one.
//! - **Mtimes live outside trees**, in a per-snapshot stat object, so two
//!   workspaces with the same content share every tree.
//! - **Lease**: `leases/ws/<name>`, holder and expiry, taken and renewed by
//!   conditional PUT. Another holder's lease is an error naming it and its
//!   expiry; `--steal` takes an expired one.
//! - **Resume**: check the snapshot out (through packs, many reads in
//!   flight) and restore every mtime, so a build tool sees nothing to redo.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::cache::DiskCache;
use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::hash::Hash;
use crate::object::{check_ref_name, Entry, Kind, Lease, RefValue, Snapshot, StatObject, Tree};
use crate::store::{Remote, Space};
use crate::upload::{upload_closure, Staged, UploadReport};
use crate::vfs::SnapshotFs;

/// The folder inside a working copy that holds mado's state for it.
pub const STATE_DIR: &str = ".mado";
/// A mounted workspace's overlay state, in its state folder (docs/FORMAT.md).
pub const OVERLAY_FILE: &str = "overlay.state";
/// How long a lease lasts without renewal (each checkpoint renews it).
pub const LEASE_SECS: i64 = 15 * 60;

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn ws_ref(name: &str) -> Result<String> {
    let r = format!("ws/{name}");
    check_ref_name(&r).map_err(Error::User)?;
    Ok(r)
}

use crate::failpoint::hit as failpoint;

/// Takes or renews the lease of workspace `name` for `holder`. A lease
/// another holder keeps is refused with [`Error::LeaseHeld`]; an expired
/// one is taken only with `steal`; a released one is free.
pub async fn take_lease(remote: &Remote, name: &str, holder: &str, steal: bool) -> Result<()> {
    let key = remote.key(&crate::store::layout::lease(&ws_ref(name)?));
    for _ in 0..3 {
        let cur = remote.read_versioned(&key).await?;
        let expected = match &cur {
            None => None,
            Some((bytes, ver)) => match Lease::decode(bytes).ok() {
                Some(l) if l.holder == holder || l.holder.is_empty() => Some(ver.clone()),
                Some(l) if l.expires > now() || !steal => {
                    return Err(Error::LeaseHeld {
                        name: name.to_string(),
                        holder: l.holder,
                        expires: l.expires,
                        expired: l.expires <= now(),
                    })
                }
                // Expired and stolen, or undecodable (overwritten).
                _ => Some(ver.clone()),
            },
        };
        let lease = Lease { holder: holder.to_string(), expires: now() + LEASE_SECS };
        if remote.cas_put(&key, expected.as_ref(), lease.encode()).await?.is_ok() {
            return Ok(());
        }
    }
    Err(Error::User(format!(
        "workspace {name}: the lease kept changing under us (another working copy is taking it); try again"
    )))
}

/// Gives up `holder`'s lease of workspace `name`, so another working copy
/// can take it at once (without --steal). Returns false when `holder` did
/// not hold it (nothing is changed then).
pub async fn release_lease(remote: &Remote, name: &str, holder: &str) -> Result<bool> {
    let key = remote.key(&crate::store::layout::lease(&ws_ref(name)?));
    for _ in 0..3 {
        let Some((bytes, ver)) = remote.read_versioned(&key).await? else { return Ok(false) };
        match Lease::decode(&bytes) {
            Ok(l) if l.holder == holder => {}
            _ => return Ok(false),
        }
        let released = Lease { holder: String::new(), expires: 0 };
        if remote.cas_put(&key, Some(&ver), released.encode()).await?.is_ok() {
            return Ok(true);
        }
    }
    Err(Error::User(format!("workspace {name}: the lease kept changing under us; try again")))
}

/// Releases the lease a plain working copy at `dir` holds.
pub async fn release(fetcher: &Arc<Fetcher>, dir: &Path) -> Result<(String, bool)> {
    let st = load_state(dir)?;
    let released = release_lease(&fetcher.remote, &st.name, &st.holder).await?;
    Ok((st.name, released))
}

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
}

/// One stat-cache row: what a file looked like when its id was known.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct StatRow {
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    id: String,
    chunked: bool,
    /// A gitlink, checked out as an empty directory: written back as the
    /// gitlink while the directory stays empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gitlink: bool,
}

#[derive(Default, Serialize, Deserialize)]
struct StatCache {
    /// When the cache was written: a file changed within the same tick
    /// could look unchanged ("racy"), so rows at or after it are re-read.
    written_ns: i128,
    rows: BTreeMap<String, StatRow>,
}

fn state_dir(dir: &Path) -> PathBuf {
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
    let text = std::fs::read_to_string(&p).map_err(|_| {
        Error::User(format!(
            "{} is not a mado workspace (no {}); create one with `mado ws create`",
            dir.display(),
            p.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| {
        Error::local_state(&p, format!("unreadable ({e}); restore it from a backup, or resume the workspace afresh"))
    })
}

fn save_state(dir: &Path, s: &LocalState) -> Result<()> {
    save_state_at(&state_dir(dir), s)
}

fn save_state_at(d: &Path, s: &LocalState) -> Result<()> {
    std::fs::create_dir_all(d).map_err(Error::io(format!("creating {}", d.display())))?;
    let text = serde_json::to_string_pretty(s).map_err(|e| Error::Internal(format!("encoding workspace.json: {e}")))?;
    crate::fsutil::save_atomic(&d.join("workspace.json"), text.as_bytes())
}

fn ns(t: std::io::Result<SystemTime>) -> i128 {
    t.ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_nanos() as i128).unwrap_or(0)
}

fn key_of(rel: &[u8]) -> String {
    // Paths as lossless strings: hex for anything that is not UTF-8.
    match std::str::from_utf8(rel) {
        Ok(s) => format!("u:{s}"),
        Err(_) => format!("x:{}", rel.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

fn load_statcache(dir: &Path) -> StatCache {
    std::fs::read(state_dir(dir).join("statcache.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn save_statcache(dir: &Path, c: &StatCache) {
    if let Ok(b) = serde_json::to_vec(c) {
        crate::fsutil::save_cache_file(&state_dir(dir).join("statcache.json"), &b);
    }
}

/// What walking a working copy produced.
struct Walked {
    root: Hash,
    stat: StatObject,
    files_read: u64,
    files_unchanged: u64,
    trees_built: Option<u64>,
    /// The plain directory's new stat cache.
    statcache: Option<StatCache>,
}

/// Walks `dir` (skipping `.mado`), staging changed content and all trees.
fn walk(dir: &Path, cache: &DiskCache, staged: &mut Staged, sc: &StatCache, new_sc: &mut StatCache) -> Result<Walked> {
    let mut w = Walked {
        root: Hash([0; 32]),
        stat: StatObject::default(),
        files_read: 0,
        files_unchanged: 0,
        trees_built: None,
        statcache: None,
    };
    let root_meta = std::fs::symlink_metadata(dir).map_err(Error::io(format!("reading {}", dir.display())))?;
    w.stat.entries.push((Vec::new(), root_meta.mtime(), root_meta.mtime_nsec() as u32));
    w.root = walk_dir(dir, &[], cache, staged, sc, new_sc, &mut w)?;
    w.stat.entries.sort();
    Ok(w)
}

fn walk_dir(
    abs: &Path,
    rel: &[u8],
    cache: &DiskCache,
    staged: &mut Staged,
    sc: &StatCache,
    new_sc: &mut StatCache,
    w: &mut Walked,
) -> Result<Hash> {
    let mut entries = Vec::new();
    let rd = std::fs::read_dir(abs).map_err(Error::io(format!("reading {}", abs.display())))?;
    for de in rd {
        let de = de.map_err(Error::io(format!("reading {}", abs.display())))?;
        let name = de.file_name().as_bytes().to_vec();
        if rel.is_empty() && name == STATE_DIR.as_bytes() {
            continue;
        }
        let p = de.path();
        let r = if rel.is_empty() { name.clone() } else { [rel, b"/", &name].concat() };
        let m = std::fs::symlink_metadata(&p).map_err(Error::io(format!("reading {}", p.display())))?;
        w.stat.entries.push((r.clone(), m.mtime(), m.mtime_nsec() as u32));
        let ft = m.file_type();
        let key = key_of(&r);
        let gitlink = sc.rows.get(&key).filter(|row| row.gitlink && ft.is_dir());
        let entry = if let Some(row) = gitlink.filter(|_| crate::checkout::is_empty_dir(&p).unwrap_or(false)) {
            new_sc.rows.insert(key, row.clone());
            let id = row.id.parse().map_err(|_| Error::local_state(&p, "a bad gitlink id in the stat cache"))?;
            Entry { name, kind: Kind::Gitlink, chunked: false, size: 0, id }
        } else if ft.is_dir() {
            let id = walk_dir(&p, &r, cache, staged, sc, new_sc, w)?;
            Entry { name, kind: Kind::Directory, chunked: false, size: 0, id }
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&p).map_err(Error::io(format!("reading {}", p.display())))?;
            let t = target.as_os_str().as_bytes();
            let (id, _) = staged.content(cache, t)?;
            Entry { name, kind: Kind::Symlink, chunked: false, size: t.len() as u64, id }
        } else if ft.is_file() {
            let kind = if m.permissions().mode() & 0o111 != 0 { Kind::Executable } else { Kind::File };
            let mtime_ns = ns(m.modified());
            let row_now = |id: Hash, chunked: bool| StatRow {
                size: m.len(),
                mtime_ns,
                ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
                ino: m.ino(),
                id: id.to_hex(),
                chunked,
                gitlink: false,
            };
            let cached = sc.rows.get(&key).filter(|row| {
                let fresh = row_now(Hash([0; 32]), row.chunked);
                row.size == fresh.size
                    && row.mtime_ns == fresh.mtime_ns
                    && row.ctime_ns == fresh.ctime_ns
                    && row.ino == fresh.ino
                    && row.mtime_ns < sc.written_ns
            });
            let (id, chunked) = match cached.and_then(|row| row.id.parse::<Hash>().ok().map(|h| (h, row.chunked))) {
                Some(v) => {
                    w.files_unchanged += 1;
                    v
                }
                None => {
                    let data = std::fs::read(&p).map_err(Error::io(format!("reading {}", p.display())))?;
                    w.files_read += 1;
                    staged.content(cache, &data)?
                }
            };
            new_sc.rows.insert(key, row_now(id, chunked));
            Entry { name, kind, chunked, size: m.len(), id }
        } else {
            // Sockets, FIFOs, devices: not source. Skipped.
            continue;
        };
        entries.push(entry);
    }
    let tree = Tree::normalized(entries)
        .map_err(|e| Error::UnsafePath { path: String::from_utf8_lossy(rel).into_owned(), reason: e.to_string() })?;
    staged.tree(cache, &tree)
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckpointReport {
    pub workspace: String,
    pub snapshot: String,
    pub parent: String,
    /// Nothing changed since the last checkpoint: no new snapshot.
    pub unchanged: bool,
    pub files_read: u64,
    pub files_unchanged: u64,
    /// Directories re-encoded (a mount knows; a plain directory re-encodes all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trees_built: Option<u64>,
    pub upload: UploadReport,
    pub packs_uploaded: u64,
}

fn author() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "mado".into());
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{user}@{host}")
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
    let stage = move |cache: Arc<DiskCache>| {
        let mut staged = Staged::default();
        let sc = load_statcache(&dir2);
        let mut new_sc = StatCache { written_ns: ns(Ok(SystemTime::now())), rows: BTreeMap::new() };
        let mut w = crate::fsutil::on_deep_stack(|| walk(&dir2, &cache, &mut staged, &sc, &mut new_sc))?;
        w.statcache = Some(new_sc);
        Ok((staged, w))
    };
    let (report, walked, _) = commit(fetcher, &st, &state_dir(dir), message, lease, stage).await?;
    if !report.unchanged || st.pending.is_some() {
        st.head = report.snapshot.clone();
        st.pending = None;
        save_state(dir, &st)?;
    }
    if let Some(sc) = &walked.statcache {
        save_statcache(dir, sc);
    }
    Ok(report)
}

/// How a checkpoint treats the lease and the workspace's head.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckpointLease {
    /// Take the lease even though another holder had it, once expired.
    pub steal: bool,
    /// Replace the workspace's head although it moved since this working
    /// copy's base (the newer checkpoints stay in the log, not in the head).
    pub force: bool,
}

/// Checkpoints a read-write mount: only files written since the last
/// checkpoint are hashed and only the directories above them re-encoded.
pub async fn checkpoint_mount(
    fetcher: &Arc<Fetcher>,
    fs: &Arc<SnapshotFs>,
    state_dir: &Path,
    message: &str,
    lease: CheckpointLease,
) -> Result<CheckpointReport> {
    let mut st = load_state_at(state_dir)?;
    // A checkpoint is refused while the overlay cannot be saved: after a
    // crash, what it would report as checkpointed could not be found again.
    save_mount_state(fs, state_dir).map_err(|e| {
        Error::local_state(
            state_dir,
            format!(
                "refusing to checkpoint: the workspace's state cannot be saved ({e}); free space or fix permissions"
            ),
        )
    })?;
    if fs.needs_trees_for_build() {
        fs.preload_trees().await?;
    }
    let fs2 = fs.clone();
    let stage = move |cache: Arc<DiskCache>| {
        let mut staged = Staged::default();
        let b = fs2.build(&cache, &mut staged)?;
        let w = Walked {
            root: b.root,
            stat: b.stat,
            files_read: b.files_read,
            files_unchanged: b.files_unchanged,
            trees_built: Some(b.trees_built),
            statcache: None,
        };
        Ok((staged, w))
    };
    let (report, walked, stat_id) = commit(fetcher, &st, state_dir, message, lease, stage).await?;
    if !report.unchanged || st.pending.is_some() {
        fs.rebase(stat_id, &walked.stat);
        st.head = report.snapshot.clone();
        st.pending = None;
        save_state_at(state_dir, &st)?;
    }
    save_mount_state(fs, state_dir)?;
    Ok(report)
}

/// Saves a mounted workspace's state when it changed since the last save:
/// shared by the saver that runs after each burst of changes and by
/// fsync, so concurrent and repeated requests cost one save.
pub struct StateSaver {
    state_dir: PathBuf,
    /// `SnapshotFs::changes()` as of the last good save.
    saved: std::sync::Mutex<u64>,
}

impl StateSaver {
    pub fn new(state_dir: PathBuf) -> StateSaver {
        StateSaver { state_dir, saved: std::sync::Mutex::new(0) }
    }

    /// Returns once every change made before the call is on disk
    /// (written, fsynced and renamed into place).
    pub fn save(&self, fs: &SnapshotFs) -> Result<()> {
        let mut saved = self.saved.lock().expect("saver lock");
        let now = fs.changes();
        if now <= *saved {
            return Ok(());
        }
        save_mount_state(fs, &self.state_dir)?;
        *saved = now;
        Ok(())
    }
}

/// Writes a read-write mount's state (atomically) into its folder.
pub fn save_mount_state(fs: &SnapshotFs, state_dir: &Path) -> Result<()> {
    let bytes = fs.save_state()?;
    crate::fsutil::save_atomic(&state_dir.join(OVERLAY_FILE), &bytes)
}

/// The shared part of a checkpoint: lease and ref, `stage` (on a blocking
/// thread), then objects, packs, snapshot and, last, the ref.
async fn commit(
    fetcher: &Arc<Fetcher>,
    st: &LocalState,
    state_at: &Path,
    message: &str,
    opts: CheckpointLease,
    stage: impl FnOnce(Arc<DiskCache>) -> Result<(Staged, Walked)> + Send + 'static,
) -> Result<(CheckpointReport, Walked, Hash)> {
    let remote = &fetcher.remote;
    let refname = ws_ref(&st.name)?;
    if st.read_only {
        return Err(Error::User(format!(
            "this working copy of workspace {} was resumed --read-only and cannot checkpoint; \
             resume it again without --read-only once its lease is free",
            st.name
        )));
    }
    // The lease, the ref and the writer's store lock go together (the lock
    // is a PUT then a LIST, as long as the lease's GET then conditional PUT).
    let (lease, cur, lock) = futures::join!(
        take_lease(remote, &st.name, &st.holder, opts.steal),
        remote.read_ref(&refname),
        remote.begin_write()
    );
    let lock = lock?;
    let r = commit_locked(fetcher, st, state_at, message, opts, stage, lease, cur).await;
    // After the ref moved (or failed to): gc may sweep again.
    remote.drop_lock(lock).await;
    r
}

/// The rest of [`commit`], under the writer's store lock.
#[allow(clippy::too_many_arguments)]
async fn commit_locked(
    fetcher: &Arc<Fetcher>,
    st: &LocalState,
    state_at: &Path,
    message: &str,
    opts: CheckpointLease,
    stage: impl FnOnce(Arc<DiskCache>) -> Result<(Staged, Walked)> + Send + 'static,
    lease: Result<()>,
    cur: Result<Option<(RefValue, crate::store::RefVersion)>>,
) -> Result<(CheckpointReport, Walked, Hash)> {
    let remote = &fetcher.remote;
    let cache = fetcher.cache.clone();
    let refname = ws_ref(&st.name)?;
    lease?;
    let (cur, ver) = cur?.ok_or_else(|| Error::NotFound(format!("workspace {} has no ref {refname}", st.name)))?;
    // Like a push that is not a fast-forward: the workspace moved on since
    // this working copy's base (another copy checkpointed), and a
    // checkpoint here would drop those changes from its head.
    let ours = cur.snapshot.to_hex() == st.head || st.pending.as_deref() == Some(&cur.snapshot.to_hex());
    if !ours && !opts.force {
        let moved = fetcher.snapshot(cur.snapshot).await.ok();
        let by =
            moved.map(|s| format!(" (by {} at {})", s.author, crate::error::local_time(s.time))).unwrap_or_default();
        return Err(Error::User(format!(
            "workspace {} moved to {}{by} since this working copy's base {}; \
             resume it elsewhere to continue from there, or `mado ws checkpoint --force` to replace it with this copy",
            st.name,
            &cur.snapshot.to_hex()[..12],
            &st.head[..12.min(st.head.len())]
        )));
    }
    let c2 = cache.clone();
    let (staged, walked) = tokio::task::spawn_blocking(move || stage(c2))
        .await
        .map_err(|e| Error::Io { context: "walking the workspace".into(), source: std::io::Error::other(e) })??;
    let stat_bytes = walked.stat.encode();
    let stat_id = Hash::of(&stat_bytes);
    cache.put(&stat_id, &stat_bytes)?;
    let parent_snap = fetcher.snapshot(cur.snapshot).await?;
    let mut report = CheckpointReport {
        workspace: st.name.clone(),
        parent: cur.snapshot.to_hex(),
        files_read: walked.files_read,
        files_unchanged: walked.files_unchanged,
        trees_built: walked.trees_built,
        ..Default::default()
    };
    if parent_snap.root == walked.root && parent_snap.stat == Some(stat_id) {
        report.snapshot = cur.snapshot.to_hex();
        report.unchanged = true;
        return Ok((report, walked, stat_id));
    }
    // Objects and trees (what the store lacks), and the stat object.
    report.upload = upload_closure(remote, &cache, &staged, &[walked.root, stat_id]).await?;
    failpoint("checkpoint-after-objects");
    // Packs for the new tree, on top of the parent's: only new content is
    // packed and uploaded, so the cost follows the change.
    if parent_snap.root != walked.root {
        let base = fetcher.locate(parent_snap.root).await?.ok().map(|(idx, _)| Arc::new(idx));
        let opts = crate::publish::PackOptions {
            mode: crate::pack::Mode::Recursive,
            cap: crate::pack::DEFAULT_MAX_PACK_BYTES,
            index_check: crate::publish::IndexCheck::KnownAbsent,
            base,
        };
        let p = crate::publish::publish_packs(remote, &cache, walked.root, opts, Some(fetcher.clone())).await?;
        report.packs_uploaded = p.packs_uploaded;
    }
    failpoint("checkpoint-after-packs");
    let snap = Snapshot {
        root: walked.root,
        parents: vec![cur.snapshot],
        time: now(),
        author: author(),
        message: message.to_string(),
        source: format!("ws:{}", st.name),
        stat: Some(stat_id),
    };
    let enc = snap.encode();
    let sid = Hash::of(&enc);
    cache.put(&sid, &enc)?;
    remote.put_object(Space::Snapshots, &sid, Bytes::from(enc)).await?;
    failpoint("checkpoint-after-snapshot");
    crate::failpoint::pause("checkpoint-before-ref");
    let mut intent = st.clone();
    intent.pending = Some(sid.to_hex());
    save_state_at(state_at, &intent)?;
    remote.cas_ref(&refname, Some(&ver), RefValue { snapshot: sid, root: walked.root }).await?;
    failpoint("checkpoint-after-ref");
    report.snapshot = sid.to_hex();
    Ok((report, walked, stat_id))
}

fn holder_id(dir: &Path) -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!(
        "{}@{host}:{}:{:08x}",
        std::env::var("USER").unwrap_or_else(|_| "mado".into()),
        dir.display(),
        rand::random::<u32>()
    )
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ResumeReport {
    pub workspace: String,
    pub snapshot: String,
    pub dir: String,
    pub files: u64,
    pub mtimes_restored: u64,
    /// Resumed without the lease (`--read-only`).
    pub read_only: bool,
}

/// Whether a resume takes the workspace's lease.
#[derive(Clone, Copy, Debug)]
pub enum ResumeLease {
    /// Take it (`steal`: even from an expired holder); refuse if held.
    Take { steal: bool },
    /// A copy that never checkpoints: no lease.
    ReadOnly,
}

/// Removes everything inside `dir` (not following symlinks).
fn empty_dir(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// Checks out `snapshot` into `dir` and records the working copy.
async fn materialize_into(
    fetcher: &Arc<Fetcher>,
    name: &str,
    snapshot: Hash,
    root: Hash,
    dir: &Path,
    lease_mode: ResumeLease,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ResumeReport> {
    // The lease is taken alongside the checkout: refuse a non-empty target
    // first, so a failed resume does not hold the lease for nothing.
    if !crate::checkout::is_empty_dir(dir)? {
        return Err(Error::User(format!("{} is not empty; resume into a new or empty directory", dir.display())));
    }
    // Round trips: the snapshot and the pack index together (the ref named
    // the root); then the packs, the stat object and the lease together.
    let (snap, attach) = futures::join!(fetcher.snapshot(snapshot), fetcher.attach(root));
    let snap = snap?;
    attach?;
    if snap.root != root {
        return Err(Error::Corrupt {
            id: snapshot,
            what: "snapshot",
            path: name.to_string(),
            detail: "the workspace ref names a different root tree than its snapshot".into(),
        });
    }
    let holder = holder_id(dir);
    let stat_fut = async {
        match snap.stat {
            Some(id) => {
                let b = fetcher.get(Space::Objects, id, "stat object").await?;
                StatObject::decode(&b).map(Some).map_err(|e| Error::corrupt(id, "stat object", "", e))
            }
            None => Ok(None),
        }
    };
    let co_fut =
        crate::checkout::checkout(fetcher, snap.root, dir, crate::checkout::CheckoutOptions { force: false, progress });
    let lease_fut = async {
        match lease_mode {
            ResumeLease::Take { steal } => take_lease(&fetcher.remote, name, &holder, steal).await,
            ResumeLease::ReadOnly => Ok(()),
        }
    };
    let (stat, co, lease) = futures::join!(stat_fut, co_fut, lease_fut);
    if let Err(e) = lease {
        // No copy that looks like a working copy but cannot checkpoint:
        // the directory was empty, so it is emptied again.
        let _ = empty_dir(dir);
        return Err(e);
    }
    let (stat, co) = match (stat, co) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => {
            if let ResumeLease::Take { .. } = lease_mode {
                let _ = release_lease(&fetcher.remote, name, &holder).await;
            }
            return Err(e);
        }
    };
    let mut report = ResumeReport {
        workspace: name.to_string(),
        snapshot: snapshot.to_hex(),
        dir: dir.display().to_string(),
        files: co.files + co.symlinks,
        read_only: matches!(lease_mode, ResumeLease::ReadOnly),
        ..Default::default()
    };
    // State first: creating `.mado/` touches the root's mtime, which is
    // restored next.
    save_state(
        dir,
        &LocalState {
            name: name.to_string(),
            remote: fetcher.remote.url().to_string(),
            head: snapshot.to_hex(),
            holder,
            read_only: matches!(lease_mode, ResumeLease::ReadOnly),
            pending: None,
        },
    )?;
    if let Some(stat) = &stat {
        crate::checkout::set_mtimes(dir, &stat.entries)?;
        report.mtimes_restored = stat.entries.len() as u64;
    }
    // Seed the stat cache from what was just written: the ids are known,
    // so a stat per file is enough (no re-reading).
    let dir2 = dir.to_path_buf();
    let written = co.written;
    tokio::task::spawn_blocking(move || {
        let mut sc = StatCache { written_ns: ns(Ok(SystemTime::now())), rows: BTreeMap::new() };
        for (rel, e) in written {
            let p = dir2.join(std::ffi::OsStr::from_bytes(&rel));
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                sc.rows.insert(
                    key_of(&rel),
                    StatRow {
                        size: m.len(),
                        mtime_ns: ns(m.modified()),
                        ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
                        ino: m.ino(),
                        id: e.id.to_hex(),
                        chunked: e.chunked,
                        gitlink: e.kind == Kind::Gitlink,
                    },
                );
            }
        }
        save_statcache(&dir2, &sc);
    })
    .await
    .map_err(|e| Error::Io { context: "stat cache".into(), source: std::io::Error::other(e) })?;
    Ok(report)
}

/// `ws create`: a new workspace from `spec`, materialized into `dir`.
pub async fn create(
    fetcher: &Arc<Fetcher>,
    name: &str,
    spec: &str,
    dir: &Path,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ResumeReport> {
    if !crate::checkout::is_empty_dir(dir)? {
        return Err(Error::User(format!("{} is not empty; create into a new or empty directory", dir.display())));
    }
    let (snapshot, root) = create_ref(fetcher, name, spec).await?;
    materialize_into(fetcher, name, snapshot, root, dir, ResumeLease::Take { steal: false }, progress).await
}

/// The ref of workspace `name` (an error naming it when there is none).
async fn read_ws_ref(fetcher: &Fetcher, name: &str) -> Result<RefValue> {
    let refname = ws_ref(name)?;
    let (v, _) = fetcher
        .remote
        .read_ref(&refname)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no workspace named {name}; see `mado ws list`")))?;
    Ok(v)
}

/// A workspace opened for a read-write mount.
pub struct MountedWorkspace {
    pub fs: Arc<SnapshotFs>,
    /// Where its state lives: `<cache>/workspaces/<key>/` (`workspace.json`,
    /// `overlay.json` and the upper layer in `upper/`).
    pub state_dir: PathBuf,
    pub snapshot: Hash,
    /// Whether (and how) its pack index was attached.
    pub attach: crate::fetch::Attach,
    /// Uncheckpointed changes from an earlier mount were picked up.
    pub reopened: bool,
    /// The lease holder id this mount took the lease as.
    pub holder: String,
    pub warnings: Vec<String>,
}

/// Opens workspace `name` for a read-write mount at `mountpoint`. Round
/// trips: the ref; the snapshot and the pack index together; the stat
/// object and the lease together. Changes left by an earlier mount of the
/// same checkpoint on this machine are picked up; changes on top of an
/// older checkpoint are set aside (and named in a warning).
pub async fn open_mount(
    fetcher: &Arc<Fetcher>,
    name: &str,
    mountpoint: &Path,
    steal: bool,
) -> Result<MountedWorkspace> {
    let v = read_ws_ref(fetcher, name).await?;
    let (snap, attach) = futures::join!(fetcher.snapshot(v.snapshot), fetcher.attach(v.root));
    let snap = snap?;
    let attach = attach?;
    let sd = fetcher.cache.workspace_dir(fetcher.remote.url(), name);
    let mut warnings = Vec::new();
    if sd.join("overlay.json").exists() && !sd.join(OVERLAY_FILE).exists() {
        return Err(Error::User(format!(
            "{} holds changes saved by an older mado (overlay.json); check them out with that version, \
             or move the folder away to start from the last checkpoint",
            sd.display()
        )));
    }
    let saved = std::fs::read(sd.join(OVERLAY_FILE)).ok();
    // Changes saved here and a working-copy record that cannot be read:
    // refuse rather than start over (which would delete the upper files).
    let prev = match load_state_at(&sd) {
        Ok(p) => Some(p),
        Err(e) if saved.is_some() => return Err(e),
        Err(_) => None,
    };
    let reopen = match (&prev, &saved) {
        (Some(p), Some(_)) if p.head == v.snapshot.to_hex() || p.pending == Some(v.snapshot.to_hex()) => true,
        (Some(p), _) => {
            let aside = sd.with_extension(format!("old-{}", now()));
            let _ = std::fs::rename(&sd, &aside);
            warnings.push(format!(
                "local changes made on top of checkpoint {} were set aside in {} (the workspace is now at {})",
                &p.head[..12.min(p.head.len())],
                aside.display(),
                &v.snapshot.to_hex()[..12]
            ));
            false
        }
        _ => false,
    };
    let holder = match (&prev, reopen) {
        (Some(p), true) => p.holder.clone(),
        _ => holder_id(mountpoint),
    };
    // The base stat object: the snapshot's, or the one the saved state
    // was rebased on.
    let base_id = match (&saved, reopen) {
        (Some(b), true) => SnapshotFs::saved_base_stat(b)?,
        _ => snap.stat,
    };
    let stat_fut = async {
        match base_id {
            Some(id) => {
                let b = fetcher.get(Space::Objects, id, "stat object").await?;
                StatObject::decode(&b).map(|s| Some((id, s))).map_err(|e| Error::corrupt(id, "stat object", "", e))
            }
            None => Ok(None),
        }
    };
    let (stat, lease) = futures::join!(stat_fut, take_lease(&fetcher.remote, name, &holder, steal));
    let stat = stat?;
    // A read-write mount without the lease could never checkpoint.
    lease?;
    let upper = sd.join("upper");
    let fs = match (&saved, reopen) {
        (Some(b), true) => SnapshotFs::load_state(fetcher.clone(), b, upper, stat)?,
        _ => {
            let _ = std::fs::remove_dir_all(&upper);
            SnapshotFs::writable(fetcher.clone(), v.root, snap.time, upper, stat)?
        }
    };
    let fs = Arc::new(fs);
    save_state_at(
        &sd,
        &LocalState {
            name: name.to_string(),
            remote: fetcher.remote.url().to_string(),
            head: v.snapshot.to_hex(),
            holder: holder.clone(),
            read_only: false,
            pending: None,
        },
    )?;
    save_mount_state(&fs, &sd)?;
    Ok(MountedWorkspace { fs, state_dir: sd, snapshot: v.snapshot, attach, reopened: reopen, holder, warnings })
}

/// Creates the ref of a new workspace from `spec`.
pub async fn create_ref(fetcher: &Arc<Fetcher>, name: &str, spec: &str) -> Result<(Hash, Hash)> {
    let refname = ws_ref(name)?;
    let r = crate::resolve::resolve(&fetcher.remote, spec).await?;
    let root = match r.root {
        Some(root) => root,
        None => fetcher.snapshot(r.snapshot).await?.root,
    };
    fetcher.remote.cas_ref(&refname, None, RefValue { snapshot: r.snapshot, root }).await.map_err(|e| match e {
        Error::RefMoved { .. } => Error::User(format!(
            "workspace {name} already exists; use `mado ws resume {name} DIR` to get a working copy"
        )),
        e => e,
    })?;
    Ok((r.snapshot, root))
}

/// `ws resume`: the workspace's latest checkpoint into `dir`, byte for byte.
pub async fn resume(
    fetcher: &Arc<Fetcher>,
    name: &str,
    dir: &Path,
    lease: ResumeLease,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ResumeReport> {
    let v = read_ws_ref(fetcher, name).await?;
    materialize_into(fetcher, name, v.snapshot, v.root, dir, lease, progress).await
}

#[derive(Clone, Debug, Serialize)]
pub struct WsInfo {
    pub name: String,
    pub snapshot: String,
    pub time: i64,
    pub message: String,
}

/// Every workspace in the store.
pub async fn list(fetcher: &Arc<Fetcher>) -> Result<Vec<WsInfo>> {
    let mut out = Vec::new();
    for (name, v) in fetcher.remote.list_refs().await? {
        let Some(ws) = name.strip_prefix("ws/") else { continue };
        let s = fetcher.snapshot(v.snapshot).await?;
        out.push(WsInfo { name: ws.to_string(), snapshot: v.snapshot.to_hex(), time: s.time, message: s.message });
    }
    Ok(out)
}

/// Deletes the workspace's ref and lease (working copies are left alone).
pub async fn remove(remote: &Remote, name: &str) -> Result<()> {
    let refname = ws_ref(name)?;
    if remote.read_ref(&refname).await?.is_none() {
        return Err(Error::NotFound(format!("no workspace named {name}")));
    }
    remote.delete_ref(&refname).await?;
    remote.delete_lease(&refname).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_object_golden_and_hostile() {
        let s = StatObject { entries: vec![(b"".to_vec(), 5, 0), (b"a/b".to_vec(), 1_700_000_000, 123)] };
        let enc = s.encode();
        let hex: String = enc.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "4d41444601020005000000000000000003612f6200f15365000000007b");
        assert_eq!(StatObject::decode(&enc).unwrap(), s);
        for bad in [&b"../x"[..], b"/etc", b"a/../b", b"a\0"] {
            let t = StatObject { entries: vec![(bad.to_vec(), 0, 0)] };
            assert!(StatObject::decode(&t.encode()).is_err(), "{bad:?}");
        }
        for cut in 0..enc.len() {
            assert!(StatObject::decode(&enc[..cut]).is_err());
        }
        let l = Lease { holder: "me".into(), expires: 9 };
        assert_eq!(Lease::decode(&l.encode()).unwrap(), l);
    }
}
