//! A workspace as a plain directory: its `.mado` state, the stat cache that
//! spares unchanged files a re-read, the walk that stages a checkpoint,
//! and materializing a snapshot into it (resume).

use super::*;

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
pub(super) struct StatRow {
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
pub(super) struct StatCache {
    /// When the cache was written: a file changed within the same tick
    /// could look unchanged ("racy"), so rows at or after it are re-read.
    written_ns: i128,
    pub(super) rows: BTreeMap<String, StatRow>,
}

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

pub(super) fn save_state(dir: &Path, s: &LocalState) -> Result<()> {
    save_state_at(&state_dir(dir), s)
}

pub(super) fn save_state_at(d: &Path, s: &LocalState) -> Result<()> {
    std::fs::create_dir_all(d).map_err(Error::io(format!("creating {}", d.display())))?;
    let text = serde_json::to_string_pretty(s).map_err(|e| Error::Internal(format!("encoding workspace.json: {e}")))?;
    crate::fsutil::save_atomic(&d.join("workspace.json"), text.as_bytes())
}

pub(super) fn ns(t: std::io::Result<SystemTime>) -> i128 {
    t.ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_nanos() as i128).unwrap_or(0)
}

pub(super) fn key_of(rel: &[u8]) -> String {
    // Paths as lossless strings: hex for anything that is not UTF-8.
    match std::str::from_utf8(rel) {
        Ok(s) => format!("u:{s}"),
        Err(_) => format!("x:{}", rel.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

pub(super) fn load_statcache(dir: &Path) -> StatCache {
    std::fs::read(state_dir(dir).join("statcache.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

pub(super) fn save_statcache(dir: &Path, c: &StatCache) {
    if let Ok(b) = serde_json::to_vec(c) {
        crate::fsutil::save_cache_file(&state_dir(dir).join("statcache.json"), &b);
    }
}

/// Walks `dir` (skipping `.mado`, and what `ign` leaves out), staging
/// changed content and all trees.
pub(super) fn walk(
    dir: &Path,
    cache: &DiskCache,
    staged: &mut Staged,
    sc: &StatCache,
    new_sc: &mut StatCache,
    ign: &mut super::ignore::Ignores,
) -> Result<Walked> {
    let mut w = Walked {
        root: Hash([0; 32]),
        stat: StatObject::default(),
        files_read: 0,
        files_unchanged: 0,
        trees_built: None,
        statcache: None,
        ignored: 0,
    };
    let root_meta = std::fs::symlink_metadata(dir).map_err(Error::io(format!("reading {}", dir.display())))?;
    w.stat.entries.push((Vec::new(), root_meta.mtime(), root_meta.mtime_nsec() as u32));
    w.root = walk_dir(dir, &[], cache, staged, sc, new_sc, &mut w, ign)?;
    w.stat.entries.sort();
    Ok(w)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn walk_dir(
    abs: &Path,
    rel: &[u8],
    cache: &DiskCache,
    staged: &mut Staged,
    sc: &StatCache,
    new_sc: &mut StatCache,
    w: &mut Walked,
    ign: &mut super::ignore::Ignores,
) -> Result<Hash> {
    let mut entries = Vec::new();
    let rd = std::fs::read_dir(abs).map_err(Error::io(format!("reading {}", abs.display())))?;
    let rules_here = ign.enter(abs)?;
    for de in rd {
        let de = de.map_err(Error::io(format!("reading {}", abs.display())))?;
        let name = de.file_name().as_bytes().to_vec();
        if rel.is_empty() && name == STATE_DIR.as_bytes() {
            continue;
        }
        let p = de.path();
        let r = if rel.is_empty() { name.clone() } else { [rel, b"/", &name].concat() };
        let m = std::fs::symlink_metadata(&p).map_err(Error::io(format!("reading {}", p.display())))?;
        let ft = m.file_type();
        let key = key_of(&r);
        if ign.skips(&name, &p, ft.is_dir(), &key, sc) {
            continue;
        }
        w.stat.entries.push((r.clone(), m.mtime(), m.mtime_nsec() as u32));
        let gitlink = sc.rows.get(&key).filter(|row| row.gitlink && ft.is_dir());
        let entry = if let Some(row) = gitlink.filter(|_| crate::checkout::is_empty_dir(&p).unwrap_or(false)) {
            new_sc.rows.insert(key, row.clone());
            let id = row.id.parse().map_err(|_| Error::local_state(&p, "a bad gitlink id in the stat cache"))?;
            Entry { name, kind: Kind::Gitlink, chunked: false, size: 0, id }
        } else if ft.is_dir() {
            let id = walk_dir(&p, &r, cache, staged, sc, new_sc, w, ign)?;
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
            let (id, chunked, size) = match cached.and_then(|row| row.id.parse::<Hash>().ok().map(|h| (h, row.chunked)))
            {
                Some((id, chunked)) => {
                    w.files_unchanged += 1;
                    (id, chunked, m.len())
                }
                None => {
                    w.files_read += 1;
                    staged.file(cache, &p)?
                }
            };
            // The size is what was read (a file written to meanwhile is
            // recorded as read, and hashed again next time: its mtime moved).
            new_sc.rows.insert(key, row_now(id, chunked));
            Entry { name, kind, chunked, size, id }
        } else {
            // Sockets, FIFOs, devices: not source. Skipped.
            continue;
        };
        entries.push(entry);
    }
    if rules_here {
        ign.leave();
    }
    let tree = Tree::normalized(entries)
        .map_err(|e| Error::UnsafePath { path: String::from_utf8_lossy(rel).into_owned(), reason: e.to_string() })?;
    staged.tree(cache, &tree)
}

/// Walks the working copy at `dir` into the cache: its new tree (every
/// changed file staged), its stat object and its next stat cache.
pub(super) fn stage(dir: &Path, cache: &DiskCache, no_ignore: bool) -> Result<(Staged, Walked)> {
    let mut staged = Staged::default();
    let sc = load_statcache(dir);
    let mut new_sc = StatCache { written_ns: ns(Ok(SystemTime::now())), rows: BTreeMap::new() };
    let mut ign = super::ignore::Ignores::new(!no_ignore, &sc);
    let mut w = crate::fsutil::on_deep_stack(|| walk(dir, cache, &mut staged, &sc, &mut new_sc, &mut ign))?;
    w.statcache = Some(new_sc);
    w.ignored = ign.skipped;
    Ok((staged, w))
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
    let stage = move |cache: Arc<DiskCache>| stage(&dir2, &cache, lease.no_ignore);
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

/// Removes everything inside `dir` (not following symlinks).
pub(super) fn empty_dir(dir: &Path) -> std::io::Result<()> {
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
pub(super) async fn materialize_into(
    fetcher: &Arc<Fetcher>,
    name: &str,
    at: &RefValue,
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
    let (snapshot, root) = (at.snapshot, at.root);
    let (snap, attach) = futures::join!(fetcher.snapshot(snapshot), fetcher.attach_hinted(root, &at.layers));
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
            Some(id) => fetcher.stat(id, &snap.stat_layers).await.map(Some),
            None => Ok(None),
        }
    };
    let co_fut = crate::checkout::checkout(
        fetcher,
        snap.root,
        dir,
        crate::checkout::CheckoutOptions { force: false, paths: &[], progress },
    );
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
