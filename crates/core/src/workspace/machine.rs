//! A workspace's state on this machine: where each workspace's mount
//! state lives (`<cache>/workspaces/<key>/`), the locks that make a mount
//! this machine's only one, what a clean unmount records, and the work a
//! mount set aside (made on a checkpoint older than the workspace's head).

use super::working_copy::{load_state_at, save_state_at};
use super::{create_ref_or_moved, now, read_ws_ref, remove, OVERLAY_FILE};
use crate::cache::DiskCache;
use crate::error::{Error, Next, Result, Warning};
use crate::fetch::Fetcher;
use crate::hash::Hash;
use serde::Serialize;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
pub(super) fn uncheckpointed_at(root: &Path, key: &str) -> Option<MountState> {
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

/// Where the state of a mount of workspace `name` of this fetcher's remote
/// lives on this machine: the workspaces' root, and the folder's name in it
/// (also the name of its lock, `<key>.lock`).
pub(super) fn state_key(fetcher: &Fetcher, name: &str) -> Result<(PathBuf, String)> {
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
pub(super) fn mount_state_dir(fetcher: &Fetcher, name: &str, warnings: &mut Vec<Warning>) -> Result<PathBuf> {
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

/// One mount of a workspace per machine: held (an flock on
/// `<workspaces>/<key>.lock`) for as long as a daemon serves it. A second
/// mount here would share the first's state folder and lease holder, and
/// each would overwrite the other's saved changes. The kernel lets go of
/// it when the daemon dies, so a remount after `kill -9` is not refused.
pub struct MountLock(std::fs::File);

impl MountLock {
    /// The lock another process holds and passed over (its descriptor
    /// shares the flock: a daemon handing its mount over keeps the
    /// workspace locked throughout).
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> MountLock {
        MountLock(std::fs::File::from(fd))
    }
}

impl std::os::fd::AsFd for MountLock {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Takes workspace `key`'s mount lock for `mountpoint`, or says where it is
/// mounted already.
pub(super) fn lock_mount(root: &Path, key: &str, mountpoint: &Path, name: &str) -> Result<MountLock> {
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
pub(super) fn set_aside(sd: &Path) -> Result<PathBuf> {
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
