//! A workspace served by a read-write mount: opening it (base snapshot,
//! stat object and lease together), saving its overlay state, and
//! checkpointing from the filesystem core. Where its state lives on this
//! machine, and the locks on it, are `machine`'s.

use super::lease::release_lease;
use super::lease::{read_lease, take_lease_from};
use super::machine::{lock_mount, mount_state_dir, set_aside, state_key, uncheckpointed_at, MountLock};
use super::working_copy::{load_state_at, LocalState};
use super::{holder_id, holder_prefix, read_ws_ref, CheckpointLease, CheckpointReport, OVERLAY_FILE};
use crate::cache::DiskCache;
use crate::error::{Error, Next, Result, Warning};
use crate::fetch::Fetcher;
use crate::hash::SnapshotId;
use crate::upload::Staged;
use crate::vfs::SnapshotFs;
use crate::workspace::commit::commit;
use crate::workspace::commit::{Walked, WalkedStat};
use crate::workspace::working_copy::save_state_at;
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
    // Over a base without a stat object, the change lists every path (at a
    // million files, ~180 MiB while it runs): such checkpoints take turns
    // with the machine's other heavy work, a core each.
    let _slot = match fs.has_base_stat() {
        true => None,
        false => fetcher.cache.slot().await,
    };
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
    fs.tracker().note_checkpointed(at);
    if !report.unchanged {
        // The trees of the base the mount moved to were put in the cache by
        // the build, and stored only inline in the new index layer: that
        // layer is attached (from the cache's copy, else one GET), so the
        // next status or checkpoint finds them when the cache lost them.
        if let Err(e) = fetcher.attach(*walked.root).await {
            tracing::warn!("checkpoint {}: attaching its index: {e}", report.snapshot);
        }
    }
    Ok(report)
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
/// When the mount keeps its inode numbers, the image taken with the state
/// is written first, so the state in place always has its image.
pub fn save_mount_state(fs: &SnapshotFs, state_dir: &Path) -> Result<()> {
    write_state(fs, state_dir, false).map(drop)
}

/// [`save_mount_state`] by a daemon handing its mount over: the state and
/// the inode numbers the kernel knows, taken together (nothing changes
/// meanwhile: the mount serves no request by then).
pub fn save_for_handover(fs: &SnapshotFs, state_dir: &Path) -> Result<crate::vfs::InodeImage> {
    write_state(fs, state_dir, true)
}

/// Both saves: the state, with its inode image when the numbers are kept
/// (written to disk) or `want_image`; the image taken (empty when none
/// was).
fn write_state(fs: &SnapshotFs, state_dir: &Path, want_image: bool) -> Result<crate::vfs::InodeImage> {
    let _one_at_a_time = fs.tracker().save_guard();
    if !fs.keeps_numbers() && !want_image {
        let bytes = fs.save_state()?;
        crate::fsutil::save_atomic(&state_dir.join(OVERLAY_FILE), &bytes)?;
        return Ok(Default::default());
    }
    let (bytes, image, pos) = fs.save_state_numbered()?;
    if let Some(pos) = pos {
        crate::vfs::write_image(state_dir, &bytes, &image, pos)?;
    }
    crate::fsutil::save_atomic(&state_dir.join(OVERLAY_FILE), &bytes)?;
    if let Some(pos) = pos {
        crate::vfs::drop_older_numbers(state_dir, &bytes, pos);
    }
    Ok(image)
}

/// A workspace opened for a read-write mount.
pub struct MountedWorkspace {
    /// This machine's one mount of the workspace: keep it while serving.
    pub lock: MountLock,
    pub fs: Arc<SnapshotFs>,
    /// Where its state lives: `<cache>/workspaces/<key>/` (`workspace.json`,
    /// `overlay.json` and the upper layer in `upper/`).
    pub state_dir: PathBuf,
    pub snapshot: SnapshotId,
    /// Whether (and how) its pack index was attached.
    pub attach: crate::fetch::Attach,
    /// Uncheckpointed changes from an earlier mount were picked up.
    pub reopened: bool,
    /// The lease holder id this mount took the lease as.
    pub holder: String,
    pub warnings: Vec<Warning>,
}

/// What a daemon handing its mount over passes to the one taking it.
pub struct HandedOver {
    pub lock: MountLock,
    /// The inode numbers the kernel knows; `None` from the keeper of a
    /// mount whose daemon was killed: those saved with the state are read
    /// ([`SnapshotFs::load_recovered`]).
    pub image: Option<crate::vfs::InodeImage>,
}

/// Opens workspace `name` for a read-write mount at `mountpoint`. Round
/// trips: the ref and the lease together (two connections opened at once);
/// the snapshot and the pack index together, one on each; the stat object
/// and the lease's conditional PUT together. Changes left by an earlier mount of the
/// same checkpoint on this machine are picked up; changes on top of an
/// older checkpoint are set aside (and named in a warning), unless a
/// checkpoint holds them all.
///
/// With `handed`, a daemon is taking over the mount another one served
/// (and saved just before): its lock is passed over, not taken again, and
/// the saved state is loaded under the inode numbers the kernel knows.
pub async fn open_mount(
    fetcher: &Arc<Fetcher>,
    name: &str,
    mountpoint: &Path,
    steal: bool,
    handed: Option<HandedOver>,
    keep_numbers: bool,
) -> Result<MountedWorkspace> {
    let renumbered = handed.is_none();
    // Before any request: a second mount of the workspace here is refused.
    let (root, key) = state_key(fetcher, name)?;
    crate::fsutil::create_private_dir(&root)?;
    let (lock, image) = match handed {
        Some(h) => (h.lock, Some(h.image)),
        None => (lock_mount(&root, &key, mountpoint, name)?, None),
    };
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
    let (attach, snap) = futures::join!(fetcher.attach_hinted(*v.root, &v.layers), fetcher.snapshot(v.snapshot));
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
            // Its flat copy, kept by the checkpoint that made it or an
            // earlier mount: the object (every path) is not read.
            Some(id) => match crate::vfs::BaseTimes::kept(fetcher, &id) {
                Some(kept) => Ok(Some((id, kept))),
                None => {
                    let hint = if Some(id) == snap.stat { &snap.stat_layers[..] } else { &[] };
                    fetcher.stat(id, hint).await.map(|s| Some((id, s.into())))
                }
            },
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
            fetcher.attach(*old).await?;
        }
    }
    let upper = sd.join("upper");
    let fs = match (&saved, reopen, &image) {
        (Some(b), true, Some(Some(im))) => SnapshotFs::load_handed_over(fetcher.clone(), b, upper, stat, im)?,
        (Some(b), true, Some(None)) => match SnapshotFs::load_recovered(fetcher.clone(), b, upper, stat, &sd).await {
            Ok(fs) => fs,
            Err(e) => {
                let _ = release_lease(&fetcher.remote, name, &holder).await;
                return Err(e);
            }
        },
        (_, _, Some(_)) => {
            let _ = release_lease(&fetcher.remote, name, &holder).await;
            return Err(Error::LocalState {
                path: sd.display().to_string(),
                detail: "the mount handed over saved no state at the workspace's checkpoint".into(),
            });
        }
        (Some(b), true, None) => SnapshotFs::load_state(fetcher.clone(), b, upper, stat)?,
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
    if keep_numbers {
        fs.keep_numbers(&sd, renumbered)?;
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
    fs.tracker().set_uncheckpointed_before(reopen && prev.as_ref().is_none_or(|p| p.uncheckpointed != Some(false)));
    save_mount_state(&fs, &sd)?;
    Ok(MountedWorkspace { lock, fs, state_dir: sd, snapshot: v.snapshot, attach, reopened: reopen, holder, warnings })
}
