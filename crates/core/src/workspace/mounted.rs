//! A workspace served by a read-write mount: opening it (base snapshot,
//! stat object and lease together), saving its overlay state, and
//! checkpointing from the filesystem core.

use super::lease::release_lease;
use super::lease::{read_lease, take_lease_from};
use super::working_copy::{load_state_at, LocalState};
use super::{
    create_ref_or_moved, holder_id, holder_prefix, now, read_ws_ref, remove, CheckpointLease, CheckpointReport,
    OVERLAY_FILE,
};
use crate::cache::DiskCache;
use crate::error::{Error, Next, Result, Warning};
use crate::fetch::Fetcher;
use crate::hash::Hash;
use crate::upload::Staged;
use crate::vfs::SnapshotFs;
use crate::workspace::commit::commit;
use crate::workspace::commit::{Walked, WalkedStat};
use crate::workspace::working_copy::save_state_at;
use serde::Serialize;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Checkpoints a read-write mount: only files written since the last
/// checkpoint are hashed and only the directories above them re-encoded.
pub async fn checkpoint_mount(
    fetcher: &Arc<Fetcher>,
    fs: &Arc<SnapshotFs>,
    state_dir: &Path,
    message: &str,
    lease: CheckpointLease,
) -> Result<CheckpointReport> {
    // One checkpoint of a mount at a time: its build notes the stat change
    // against the base that its rebase then moves.
    let _turn = fs.checkpoint_turn().await?;
    let mut st = load_state_at(state_dir)?;
    // Every change counted so far is in the build below.
    let at = fs.changes();
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
    let skips = prepare_build(fs, lease.no_ignore, false).await?;
    let fs2 = fs.clone();
    let stage = move |cache: Arc<DiskCache>| {
        let mut staged = Staged::default();
        let b = fs2.build_skipping(&cache, &mut staged, &skips)?;
        let w = Walked {
            root: b.root,
            stat: WalkedStat::Change(b.stat, fs2.clone()),
            files_read: b.files_read,
            files_unchanged: b.files_unchanged,
            trees_built: Some(b.trees_built),
            statcache: None,
            ignored: b.ignored,
        };
        Ok(w)
    };
    let (report, walked, stat_id, unlock) = commit(fetcher, &st, state_dir, message, lease, false, stage).await?;
    let t0 = std::time::Instant::now();
    let saved = (|| {
        if !report.unchanged || st.pending.is_some() {
            // The rebased overlay is saved before the record names the new
            // head: killed in between, the record still says `pending`, and
            // a reopen attaches both snapshots' indexes.
            let WalkedStat::Change(change, _) = &walked.stat else {
                return Err(Error::Internal("a mount's build listed every path".into()));
            };
            fs.rebase(walked.root, stat_id, change);
            save_mount_state(fs, state_dir)?;
            st.head = report.snapshot.clone();
            st.pending = None;
            save_state_at(state_dir, &st)?;
        } else {
            save_mount_state(fs, state_dir)?;
        }
        Ok::<_, Error>(())
    })();
    tracing::debug!(ms = t0.elapsed().as_millis() as u64, "checkpoint: rebased and saved");
    unlock.done().await;
    saved?;
    fs.note_checkpointed(at);
    Ok(report)
}

/// Records, at a clean unmount, whether a workspace mount's state holds
/// changes no checkpoint has (`ws resume` into a directory warns of them).
pub fn record_unmounted(state_dir: &Path, uncheckpointed: bool) -> Result<()> {
    let mut st = load_state_at(state_dir)?;
    st.uncheckpointed = Some(uncheckpointed);
    save_state_at(state_dir, &st)
}

/// The saved state of a mount of workspace `name` on this machine that may
/// hold changes no checkpoint has: its folder, and the checkpoint those
/// changes were made on (`None` when there is none).
pub fn uncheckpointed_mount_state(fetcher: &Fetcher, name: &str) -> Result<Option<MountState>> {
    let (root, key) = state_key(fetcher, name)?;
    Ok(uncheckpointed_at(&root, &key))
}

/// [`uncheckpointed_mount_state`] of the state `key` in `root`.
fn uncheckpointed_at(root: &Path, key: &str) -> Option<MountState> {
    let sd = root.join(key);
    if !sd.join(OVERLAY_FILE).exists() {
        return None;
    }
    let live = mount_lock_held(root, key);
    match load_state_at(&sd) {
        Ok(st) if st.uncheckpointed == Some(false) => None,
        Ok(st) => Some(MountState { dir: sd, head: st.head, holder: st.holder, live }),
        // Saved changes beside a record that cannot be read: as changes.
        Err(_) => Some(MountState { dir: sd, head: String::new(), holder: String::new(), live }),
    }
}

/// A workspace mount's saved state on this machine, as
/// [`uncheckpointed_mount_state`] finds it.
#[derive(Clone, Debug)]
pub struct MountState {
    pub dir: PathBuf,
    /// The checkpoint its changes were made on ("" if unreadable).
    pub head: String,
    /// The lease holder id the mount took the lease as.
    pub holder: String,
    /// A daemon serves it now (else: unmounted, or its daemon died).
    pub live: bool,
}

/// What a build of a mounted workspace needs before it runs (shared by a
/// checkpoint and `ws status`, which is `dry`): for a checkpoint, every
/// tree in memory when the base has no stat object (its paths are listed
/// from them); and the new paths .gitignore / .madoignore rules leave out,
/// as in a plain working copy's checkpoint (none with `no_ignore`).
pub(super) async fn prepare_build(fs: &Arc<SnapshotFs>, no_ignore: bool, dry: bool) -> Result<crate::vfs::Skips> {
    if !dry && fs.needs_trees_for_build() {
        fs.preload_trees().await?;
    }
    let mut skips = match no_ignore {
        true => crate::vfs::Skips { keep_git: true, ..Default::default() },
        false => fs.ignored_new_entries().await?,
    };
    skips.dry = dry;
    Ok(skips)
}

/// Where the state of a mount of workspace `name` of this fetcher's remote
/// lives on this machine: the workspaces' root, and the folder's name in it
/// (also the name of its lock, `<key>.lock`).
fn state_key(fetcher: &Fetcher, name: &str) -> Result<(PathBuf, String)> {
    Ok((workspaces_root()?, DiskCache::workspace_key(fetcher.remote.url(), name)))
}

/// The root of mounted workspaces' states: `$MADO_WORKSPACES_DIR`, else
/// `$XDG_DATA_HOME/mado/workspaces`, else `~/.local/share/mado/workspaces`.
/// Not the cache: an upper layer holds work no checkpoint has saved yet,
/// and wiping a cache must never lose it.
pub fn workspaces_root() -> Result<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = env("MADO_WORKSPACES_DIR") {
        return Ok(d);
    }
    let data = match (env("XDG_DATA_HOME"), env("HOME")) {
        (Some(d), _) => d,
        (None, Some(h)) => h.join(".local/share"),
        (None, None) => {
            return Err(Error::User(
                "cannot place a workspace's state: set HOME, XDG_DATA_HOME or MADO_WORKSPACES_DIR".into(),
            ))
        }
    };
    Ok(data.join("mado").join("workspaces"))
}

/// The state folder of workspace `name` of this fetcher's remote while it
/// is mounted. A state an older mado left in the cache is moved here first
/// (kept where it is, with a warning, if it cannot be moved).
fn mount_state_dir(fetcher: &Fetcher, name: &str, warnings: &mut Vec<Warning>) -> Result<PathBuf> {
    let (root, key) = state_key(fetcher, name)?;
    // Private: the upper layers hold copies of the user's files.
    crate::fsutil::create_private_dir(&root)?;
    let sd = root.join(key);
    let old = fetcher.cache.legacy_workspace_dir(fetcher.remote.url(), name);
    if old.is_dir() && !sd.exists() {
        if let Err(e) = std::fs::rename(&old, &sd) {
            warnings.push(
                format!(
                    "the state of workspace {name} is still in the cache at {} (moving it to {} failed: {e}); \
                     do not wipe the cache before checkpointing",
                    old.display(),
                    sd.display()
                )
                .into(),
            );
            return Ok(old);
        }
    }
    Ok(sd)
}

/// Removes the state folder of workspace `name` when it holds no work (no
/// saved overlay): after a mount that failed before serving, so nothing is
/// left behind. A folder with an overlay is kept.
pub fn forget_unused_mount_state(fetcher: &Fetcher, name: &str) -> Result<()> {
    let (root, key) = state_key(fetcher, name)?;
    let sd = root.join(key);
    if sd.is_dir()
        && !sd.join(super::OVERLAY_FILE).exists()
        && !sd.join("upper").read_dir().is_ok_and(|mut d| d.next().is_some())
    {
        std::fs::remove_dir_all(&sd).map_err(Error::io(format!("removing {}", sd.display())))?;
    }
    Ok(())
}

/// After `ws rm NAME`: the saved state of a mount of it on this machine is
/// set aside when it may hold changes no checkpoint has (returned: `ws
/// recover` lists it), and deleted when it holds none, so that a new
/// workspace of the same name never starts from it. A state a live mount
/// uses (`rm --force` of a mounted workspace) is left to that mount.
pub fn set_aside_removed(fetcher: &Fetcher, name: &str, _held: &MountLock) -> Result<Option<PathBuf>> {
    let (root, key) = state_key(fetcher, name)?;
    let sd = root.join(&key);
    if !sd.is_dir() {
        return Ok(None);
    }
    if uncheckpointed_at(&root, &key).is_none() {
        std::fs::remove_dir_all(&sd).map_err(Error::io(format!("removing {}", sd.display())))?;
        return Ok(None);
    }
    set_aside(&sd).map(Some)
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
        if let Err(e) = save_mount_state(fs, &self.state_dir) {
            // A full disk: the files deleted since the last save hold the
            // space the save needs (see `free_doomed_now`).
            if !e.is_no_space() || fs.free_doomed_now() == 0 {
                return Err(e);
            }
            save_mount_state(fs, &self.state_dir)?;
        }
        *saved = now;
        fs.note_saved(now);
        Ok(())
    }
}

/// Writes a read-write mount's state (atomically) into its folder.
pub fn save_mount_state(fs: &SnapshotFs, state_dir: &Path) -> Result<()> {
    let _one_at_a_time = fs.save_guard();
    let bytes = fs.save_state()?;
    crate::fsutil::save_atomic(&state_dir.join(OVERLAY_FILE), &bytes)
}

/// One mount of a workspace per machine: held (an flock on
/// `<workspaces>/<key>.lock`) for as long as a daemon serves it. A second
/// mount here would share the first's state folder and lease holder, and
/// each would overwrite the other's saved changes. The kernel lets go of
/// it when the daemon dies, so a remount after `kill -9` is not refused.
pub struct MountLock(#[allow(dead_code)] std::fs::File);

/// Takes workspace `key`'s mount lock for `mountpoint`, or says where it is
/// mounted already.
fn lock_mount(root: &Path, key: &str, mountpoint: &Path, name: &str) -> Result<MountLock> {
    let abs = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    lock_state(root, key, &abs.display().to_string(), name)
}

/// Takes the lock of workspace `key`'s state for `by` (a mount point, or
/// what else holds it), or says who holds it.
fn lock_state(root: &Path, key: &str, by: &str, name: &str) -> Result<MountLock> {
    use std::io::{Read, Seek, Write};
    let path = root.join(format!("{key}.lock"));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(Error::io(format!("opening {}", path.display())))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut at = String::new();
            let _ = f.read_to_string(&mut at);
            let at = at.trim();
            if !at.starts_with('/') {
                return Err(Error::User(format!(
                    "workspace {name} is busy on this machine ({}); try again",
                    if at.is_empty() { "another process holds its state" } else { at }
                )));
            }
            use std::os::unix::fs::FileTypeExt;
            if std::fs::metadata(at).is_ok_and(|m| m.file_type().is_socket()) {
                return Err(Error::User(format!(
                    "workspace {name} is already served to a VM guest on this machine (control socket {at})"
                ))
                .then(Next::StopServer));
            }
            return Err(Error::User(format!("workspace {name} is already mounted on this machine at {at}"))
                .then(Next::UseOrUnmount { at: at.to_string() }));
        }
        Err(e) => return Err(Error::Io { context: format!("locking {}", path.display()), source: e.into() }),
    }
    let _ = f.set_len(0).and_then(|()| f.rewind()).and_then(|()| f.write_all(by.as_bytes()));
    Ok(MountLock(f))
}

/// Where workspace `name` was last mounted on this machine (what its mount
/// lock names), without taking the lock: the caller checks that a mount
/// of it is there now (the file outlives the mount).
pub fn last_mounted_at(fetcher: &Fetcher, name: &str) -> Option<PathBuf> {
    let (root, key) = state_key(fetcher, name).ok()?;
    let at = std::fs::read_to_string(root.join(format!("{key}.lock"))).ok()?;
    let at = at.trim();
    at.starts_with('/').then(|| PathBuf::from(at))
}

/// For `ws rm NAME`: holds workspace `name`'s state on this machine so no
/// mount starts while the workspace is removed (a mount that won that race
/// served a workspace that no longer existed, and its work was then set
/// aside by no one). `Err` names where it is mounted now.
pub fn lock_for_removal(fetcher: &Fetcher, name: &str) -> Result<MountLock> {
    let (root, key) = state_key(fetcher, name)?;
    crate::fsutil::create_private_dir(&root)?;
    lock_state(&root, &key, "being removed (ws rm)", name)
}

/// The lease holder id a mount of workspace `name` on this machine took
/// (from its saved state), if there is one.
pub fn local_mount_holder(fetcher: &Fetcher, name: &str) -> Option<String> {
    let (root, key) = state_key(fetcher, name).ok()?;
    load_state_at(&root.join(key)).ok().map(|st| st.holder).filter(|h| !h.is_empty())
}

/// At a mount's end: when its workspace was removed meanwhile (`ws rm
/// --force` of a mounted workspace), the state it leaves may hold work no
/// checkpoint has, and nothing would ever list it: set aside, like the
/// state `ws rm` finds (returned). One GET (the ref).
pub async fn set_aside_if_removed(fetcher: &Fetcher, name: &str, state_dir: &Path) -> Result<Option<PathBuf>> {
    match read_ws_ref(fetcher, name).await {
        Ok(_) => Ok(None),
        Err(e) if e.is_not_found() => set_aside(state_dir).map(Some),
        Err(e) => Err(e),
    }
}

/// Whether a daemon on this machine serves the workspace whose state key
/// is `key` (its mount lock is held).
fn mount_lock_held(root: &Path, key: &str) -> bool {
    let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(root.join(format!("{key}.lock"))) else {
        return false;
    };
    matches!(
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive),
        Err(rustix::io::Errno::WOULDBLOCK)
    )
}

/// A workspace opened for a read-write mount.
pub struct MountedWorkspace {
    /// This machine's one mount of the workspace: keep it while serving.
    pub lock: MountLock,
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
    pub warnings: Vec<Warning>,
}

/// Opens workspace `name` for a read-write mount at `mountpoint`. Round
/// trips: the ref and the lease together (two connections opened at once);
/// the snapshot and the pack index together, one on each; the stat object
/// and the lease's conditional PUT together. Changes left by an earlier mount of the
/// same checkpoint on this machine are picked up; changes on top of an
/// older checkpoint are set aside (and named in a warning), unless a
/// checkpoint holds them all.
pub async fn open_mount(
    fetcher: &Arc<Fetcher>,
    name: &str,
    mountpoint: &Path,
    steal: bool,
) -> Result<MountedWorkspace> {
    // Before any request: a second mount of the workspace here is refused.
    let (root, key) = state_key(fetcher, name)?;
    crate::fsutil::create_private_dir(&root)?;
    let lock = lock_mount(&root, &key, mountpoint, name)?;
    let (v, seen) = futures::join!(read_ws_ref(fetcher, name), read_lease(&fetcher.remote, name));
    let v = match v {
        // Removed elsewhere (`ws rm` on another machine) while this machine
        // kept changes of a mount of it: set aside now, so that `ws
        // recover` lists them (nothing else would) and a new workspace of
        // the name starts clean.
        Err(e) if e.is_not_found() && uncheckpointed_at(&root, &key).is_some() => {
            let aside = set_aside(&root.join(&key))?;
            return Err(Error::NotFound(format!(
                "{}\n  note: changes a mount of it saved on this machine, which no checkpoint holds, \
                 were set aside in {}",
                e.base(),
                aside.display()
            ))
            .then(Next::ListSetAside));
        }
        v => v?,
    };
    let seen = seen?;
    let (attach, snap) = futures::join!(fetcher.attach_hinted(v.root, &v.layers), fetcher.snapshot(v.snapshot));
    let snap = snap?;
    let attach = attach?;
    let mut warnings = Vec::new();
    let sd = mount_state_dir(fetcher, name, &mut warnings)?;
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
    // Changes made on top of an older checkpoint are set aside, but only
    // once the lease is ours: a mount refused for the lease leaves them
    // where they are (it once moved them, and said nothing).
    let (reopen, set_aside_head) = match (&prev, &saved) {
        (Some(p), Some(_)) if p.is_at(&v.snapshot.to_hex()) => (true, None),
        // Its clean unmount recorded that no change came after its last
        // checkpoint began: a checkpoint holds every change, nothing to
        // set aside (the fresh state below replaces it).
        (Some(p), Some(_)) if p.uncheckpointed == Some(false) => (false, None),
        (Some(p), _) => (false, Some(p.head.clone())),
        _ => (false, None),
    };
    // The holder id names the mount point: mounted again elsewhere, the
    // same state takes its lease under a new id naming the new place (the
    // old one named a directory that is no longer this copy: errors
    // pointed there, and a resume into it could pass for this copy).
    let (holder, moved_from) = match (&prev, reopen) {
        (Some(p), true) if p.holder.starts_with(&holder_prefix(mountpoint)) => (p.holder.clone(), None),
        (Some(p), true) => (holder_id(mountpoint), Some(p.holder.as_str()).filter(|h| !h.is_empty())),
        _ => (holder_id(mountpoint), None),
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
                let hint = if Some(id) == snap.stat { &snap.stat_layers[..] } else { &[] };
                fetcher.stat(id, hint).await.map(|s| Some((id, s)))
            }
            None => Ok(None),
        }
    };
    let (stat, lease) =
        futures::join!(stat_fut, take_lease_from(&fetcher.remote, name, &holder, moved_from, steal, Some(seen)));
    let stat = stat?;
    // A read-write mount without the lease could never checkpoint.
    lease?;
    if let Some(head) = set_aside_head {
        match set_aside(&sd) {
            Ok(aside) => warnings.push(Warning {
                text: format!(
                    "local changes made on top of checkpoint {} were set aside in {} (the workspace is now at {})",
                    crate::hash::short_hex(&head),
                    aside.display(),
                    &v.snapshot.to_hex()[..12],
                ),
                next: vec![Next::RecoverAside { aside: aside.display().to_string() }],
            }),
            Err(e) => {
                let _ = release_lease(&fetcher.remote, name, &holder).await;
                return Err(e);
            }
        }
    }
    // The saved nodes name trees of the snapshot they were last rebased
    // on. When that is not the ref's (a checkpoint moved the ref and died
    // before the overlay was rebased: `pending`), those trees live in that
    // snapshot's index (packs-first: trees travel only inline in indexes),
    // and the ref's need not carry them (a layer that absorbed others keeps
    // only live trees), so that index is attached too.
    if let (Some(b), true) = (&saved, reopen) {
        let old = SnapshotFs::saved_root(b)?;
        if old != v.root {
            fetcher.attach(old).await?;
        }
    }
    let upper = sd.join("upper");
    let fs = match (&saved, reopen) {
        (Some(b), true) => SnapshotFs::load_state(fetcher.clone(), b, upper, stat)?,
        _ => {
            let _ = std::fs::remove_dir_all(&upper);
            SnapshotFs::writable(fetcher.clone(), v.root, snap.time, upper, stat)?
        }
    };
    for p in fs.lost_on_load() {
        warnings.push(
            format!(
                "{} was lost: the saved state named it, but its bytes in {} are missing; it is removed from \
                 the workspace (the last checkpoint still holds what it held then)",
                String::from_utf8_lossy(p),
                sd.join("upper").display()
            )
            .into(),
        );
    }
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
            // While mounted, unknown; a clean unmount records it.
            uncheckpointed: Some(true),
        },
    )?;
    fs.set_uncheckpointed_before(reopen && prev.as_ref().is_none_or(|p| p.uncheckpointed != Some(false)));
    save_mount_state(&fs, &sd)?;
    Ok(MountedWorkspace { lock, fs, state_dir: sd, snapshot: v.snapshot, attach, reopened: reopen, holder, warnings })
}

/// Changes a workspace mount set aside (made on a checkpoint older than
/// the workspace's head when it was mounted again).
#[derive(Clone, Debug, Serialize)]
pub struct SetAside {
    /// Its folder, beside the workspaces' states.
    pub dir: String,
    pub workspace: String,
    /// The checkpoint the changes were made on.
    pub checkpoint: String,
    /// When they were set aside, seconds since the epoch.
    pub time: i64,
}

/// When the folder `dir` was set aside, from its name
/// (`<key>.old-<seconds>`, or `<key>.old-<seconds>.<n>` when several were
/// set aside in one second); `None` for any other folder.
fn set_aside_time(dir: &Path) -> Option<i64> {
    let name = dir.file_name()?.to_str()?;
    let (_, t) = name.split_once(".old-")?;
    let secs = t.split_once('.').map_or(t, |(s, _)| s);
    secs.parse().ok()
}

/// A new name for state folder `sd` set aside now: `<key>.old-<seconds>`,
/// with `.<n>` added when that is taken (two in one second).
fn set_aside_path(sd: &Path) -> PathBuf {
    let base = format!("{}.old-{}", sd.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(), now());
    let mut p = sd.with_file_name(&base);
    let mut n = 1;
    while p.exists() {
        p = sd.with_file_name(format!("{base}.{n}"));
        n += 1;
    }
    p
}

/// Sets state folder `sd` aside now (renamed to [`set_aside_path`]), and
/// says where it went.
fn set_aside(sd: &Path) -> Result<PathBuf> {
    let aside = set_aside_path(sd);
    std::fs::rename(sd, &aside).map_err(Error::io(format!("setting aside {}", sd.display())))?;
    Ok(aside)
}

/// Every set-aside state of this fetcher's remote on this machine, oldest
/// first.
pub fn list_set_aside(fetcher: &Fetcher) -> Result<Vec<SetAside>> {
    let root = workspaces_root()?;
    let Ok(rd) = std::fs::read_dir(&root) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let dir = e.path();
        let Some(time) = set_aside_time(&dir) else { continue };
        if !dir.join(OVERLAY_FILE).is_file() {
            continue;
        }
        let Ok(st) = load_state_at(&dir) else { continue };
        if st.remote != fetcher.remote.url() {
            continue;
        }
        out.push(SetAside { dir: dir.display().to_string(), workspace: st.name, checkpoint: st.head, time });
    }
    out.sort_by_key(|a| (a.time, a.dir.clone()));
    Ok(out)
}

/// `ws recover`: makes the set-aside state in `aside` the state of a new
/// workspace `new_name`, created at the checkpoint those changes were made
/// on, so that its next mount (`ws resume NEW --mount DIR`) shows them and
/// can checkpoint them. Nothing is uploaded here.
/// `new_name` defaults to `<workspace>-recovered`; the name used is
/// returned beside what was recovered.
pub async fn recover_set_aside(
    fetcher: &Arc<Fetcher>,
    aside: &Path,
    new_name: Option<&str>,
) -> Result<(SetAside, String)> {
    // Only a set-aside folder: a live workspace's own state (which a
    // refused resume names) moved away would lose its mount's changes.
    if set_aside_time(aside).is_none() {
        return Err(Error::User(format!(
            "{} is not a folder of set-aside changes (those end in .old-<time>)",
            aside.display()
        ))
        .then(Next::ListSetAside)
        .then(Next::ResumeMount { name: "NAME".into() }));
    }
    if !aside.join(OVERLAY_FILE).is_file() {
        return Err(Error::User(format!("{} holds no set-aside changes (no {OVERLAY_FILE})", aside.display()))
            .then(Next::ListSetAside));
    }
    let mut st = load_state_at(aside)?;
    if st.remote != fetcher.remote.url() {
        return Err(Error::User(format!(
            "{} holds changes to workspace {} of the store {}, not of {}; recover it with MADO_REMOTE_ADDR={}",
            aside.display(),
            st.name,
            st.remote,
            fetcher.remote.url(),
            st.remote
        )));
    }
    let new_name = new_name.map_or_else(|| format!("{}-recovered", st.name), str::to_string);
    let new_name = new_name.as_str();
    let head: Hash = st.head.parse().map_err(|_| {
        Error::local_state(aside, format!("names no checkpoint its changes were made on ({:?})", st.head))
    })?;
    let (root, key) = state_key(fetcher, new_name)?;
    let target = root.join(key);
    if target.exists() {
        return Err(Error::User(format!(
            "a mount of workspace {new_name} already keeps its state on this machine ({}); choose another name with --as",
            target.display()
        )));
    }
    create_ref_or_moved(fetcher, new_name, &head.to_hex()).await.map_err(|e| match e {
        Error::RefMoved { .. } => {
            Error::User(format!("a workspace named {new_name} already exists; choose another name with --as"))
        }
        e if e.is_not_found() => Error::User(format!(
            "the checkpoint {} these changes were made on is no longer in the store (its workspace was \
             removed and gc ran), so they cannot become a workspace; {} keeps them",
            head.short(),
            aside.display(),
        ))
        .then(Next::RecoverTo { aside: aside.display().to_string() }),
        e => e,
    })?;
    if let Err(e) = std::fs::rename(aside, &target) {
        let _ = remove(&fetcher.remote, new_name, true, None).await;
        return Err(Error::io(format!("moving {} to {}", aside.display(), target.display()))(e));
    }
    let from = std::mem::replace(&mut st.name, new_name.to_string());
    st.pending = None;
    st.uncheckpointed = Some(true);
    save_state_at(&target, &st)?;
    let time = set_aside_time(aside).unwrap_or(0);
    let recovered = SetAside { dir: target.display().to_string(), workspace: from, checkpoint: head.to_hex(), time };
    Ok((recovered, new_name.to_string()))
}

/// What [`export_set_aside`] wrote.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Exported {
    pub workspace: String,
    /// The checkpoint the changes were made on.
    pub checkpoint: String,
    pub dir: String,
    pub files: u64,
    pub bytes: u64,
    pub symlinks: u64,
    pub dirs: u64,
}

/// `ws recover FOLDER --to DIR`: writes what the set-aside state in
/// `aside` holds beyond its checkpoint (the files the mount wrote, its
/// symlinks and new directories) into `to`, a new or empty directory, at
/// their paths; nothing is read from the store, so it works when gc has
/// deleted that checkpoint. Removals and unchanged files are not in it.
pub fn export_set_aside(aside: &Path, to: &Path) -> Result<Exported> {
    use std::os::unix::fs::{symlink, PermissionsExt};
    if set_aside_time(aside).is_none() {
        return Err(Error::User(format!(
            "{} is not a folder of set-aside changes (those end in .old-<time>)",
            aside.display()
        ))
        .then(Next::ListSetAside));
    }
    let saved = std::fs::read(aside.join(OVERLAY_FILE)).map_err(|e| {
        Error::io(format!("reading {}", aside.join(OVERLAY_FILE).display()))(e).then(Next::ListSetAside)
    })?;
    let st = load_state_at(aside)?;
    let changes = crate::vfs::SnapshotFs::saved_changes(&saved)?;
    if std::fs::read_dir(to).is_ok_and(|mut d| d.next().is_some()) {
        return Err(Error::User(format!("{} is not empty; choose an empty or new directory", to.display())));
    }
    std::fs::create_dir_all(to).map_err(Error::io(format!("creating {}", to.display())))?;
    let mut out = Exported {
        workspace: st.name,
        checkpoint: st.head,
        dir: std::path::absolute(to).unwrap_or_else(|_| to.to_path_buf()).display().to_string(),
        ..Default::default()
    };
    // Paths come from the saved state, checked name by name (no `..`, no
    // `/`); each parent is a directory made here before its children (a
    // path never goes through a symlink made here), and nothing existing
    // is written over.
    let at = |p: &[u8]| to.join(std::ffi::OsStr::from_bytes(p));
    let parent_of = |p: &Path| -> Result<()> {
        let parent = p.parent().expect("below the target");
        std::fs::create_dir_all(parent).map_err(Error::io(format!("creating {}", parent.display())))
    };
    for c in changes {
        match c {
            crate::vfs::SavedChange::Dir { path, perm } => {
                let p = at(&path);
                parent_of(&p)?;
                std::fs::create_dir(&p).map_err(Error::io(format!("creating {}", p.display())))?;
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(u32::from(perm) & 0o7777));
                out.dirs += 1;
            }
            crate::vfs::SavedChange::Symlink { path, target } => {
                let p = at(&path);
                parent_of(&p)?;
                symlink(std::ffi::OsStr::from_bytes(&target), &p)
                    .map_err(Error::io(format!("creating symlink {}", p.display())))?;
                out.symlinks += 1;
            }
            crate::vfs::SavedChange::File { path, blob, perm, mtime } => {
                let p = at(&path);
                parent_of(&p)?;
                let from = aside.join("upper").join(blob.to_string());
                let mut src = crate::fsutil::open_regular(&from).map_err(Error::io(format!(
                    "reading {} (the bytes of {})",
                    from.display(),
                    crate::fsutil::show_path(&path)
                )))?;
                let mut dst = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&p)
                    .map_err(Error::io(format!("creating {}", p.display())))?;
                out.bytes +=
                    std::io::copy(&mut src, &mut dst).map_err(Error::io(format!("writing {}", p.display())))?;
                let _ = dst.set_permissions(std::fs::Permissions::from_mode(u32::from(perm) & 0o7777));
                let t = std::time::UNIX_EPOCH + std::time::Duration::new(mtime.0.max(0) as u64, mtime.1);
                let _ = dst.set_modified(t);
                out.files += 1;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two set-asides of one state in one second get two folders (the
    /// second used to fail with "Directory not empty"), both listed.
    #[test]
    fn set_aside_folders_are_unique_and_dated() {
        let d = tempfile::tempdir().unwrap();
        let sd = d.path().join("0123abcd");
        let mut made = Vec::new();
        for _ in 0..3 {
            std::fs::create_dir(&sd).unwrap();
            let aside = set_aside_path(&sd);
            std::fs::rename(&sd, &aside).unwrap();
            made.push(aside);
        }
        made.dedup();
        assert_eq!(made.len(), 3);
        for a in &made {
            let t = set_aside_time(a).unwrap();
            assert!((t - now()).abs() < 60, "{}", a.display());
        }
        assert_eq!(set_aside_time(&sd), None);
        assert_eq!(set_aside_time(Path::new("/x/abc.old-12")), Some(12));
        assert_eq!(set_aside_time(Path::new("/x/abc.old-12.3")), Some(12));
        assert_eq!(set_aside_time(Path::new("/x/abc.old-x")), None);
        assert_eq!(set_aside_time(Path::new("/x/abc.lock")), None);
    }
}
