//! Workspaces: a ref `ws/<name>`, a single-writer lease, and a working
//! copy (a plain directory, or a read-write mount).
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
//!
//! Parts: `lease` (take, renew, release), `working_copy` (a plain
//! directory: its state, stat cache, walk and materialize), `mounted` (a
//! workspace served by a mount: open, saved state, checkpoint), `commit`
//! (what both checkpoints share: lease, upload, snapshot, ref CAS).

use crate::workspace::working_copy::materialize_into;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Next, Result};
use crate::fetch::Fetcher;
use crate::object::{check_ref_name, Lease, RefValue};
use crate::store::{Remote, Space};
use crate::upload::UploadReport;

mod commit;
mod handle;
mod lease;
mod machine;
mod mounted;
mod statcache;
mod status;
mod working_copy;

pub use handle::Workspace;
use lease::read_lease;
pub use lease::{release, release_interrupted};
pub use machine::{
    export_set_aside, list_set_aside, record_unmounted, recover_set_aside, workspaces_root, MountLock, MountState,
    SetAside,
};
pub use mounted::{checkpoint_mount, save_for_handover, save_mount_state, HandedOver, MountedWorkspace, StateSaver};
pub use status::{mount_status, status, Status};

pub use working_copy::{checkpoint, find_working_copy, interrupted_resume_of, load_state, load_state_at, LocalState};

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
    if name.contains(['~', '^']) {
        // `ws resume a~1`: a checkpoint, where a workspace is named.
        return Err(Error::User(format!("{name:?} is not a workspace name: this command takes the name alone"))
            .then(Next::CheckpointOfWorkspace { name: name.to_string() }));
    }
    let r = format!("ws/{name}");
    // Worded for the name the user gave, not the ref it makes.
    check_ref_name(&r).map_err(|_| {
        Error::User(format!(
            "invalid workspace name {name:?}: use letters, digits, '.', '_' and '-' (/-separated parts, none \
             empty or starting with '.')"
        ))
    })?;
    Ok(r)
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
    /// Bytes of the pack index uploaded (a layer over the parent's index
    /// when it has one) and the layers a reader merges.
    pub index_bytes: u64,
    pub index_layers: usize,
    /// Bytes of the stat object uploaded.
    pub stat_bytes: u64,
    /// Paths left out: `.git` directories, and untracked paths the ignore
    /// rules name (whole directories count once).
    pub paths_ignored: u64,
}

/// How a checkpoint treats the lease and the workspace's head.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckpointLease {
    /// Take the lease even though another holder had it, once expired.
    pub steal: bool,
    /// Replace the workspace's head although it moved since this working
    /// copy's base (the newer checkpoints stay in the log, not in the head).
    pub force: bool,
    /// Keep everything: `.git` directories and what `.gitignore` and
    /// `.madoignore` ignore (a plain working copy; see `ignore.rs`).
    pub no_ignore: bool,
}

fn holder_id(dir: &Path) -> String {
    format!("{}{:08x}", holder_prefix(dir), rand::random::<u32>())
}

/// What every lease holder id of a working copy at `dir` on this machine
/// starts with: `user@host:DIR:` (the id then ends with an 8-digit nonce).
fn holder_prefix(dir: &Path) -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!(
        "{}@{host}:{}:",
        std::env::var("USER").unwrap_or_else(|_| "mado".into()),
        // Absolute: a lease error elsewhere names where the copy is.
        std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()).display()
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
    /// The partial copy an interrupted resume had left in the directory
    /// was removed first.
    pub removed_partial: bool,
}

/// Whether a resume takes the workspace's lease.
#[derive(Clone, Copy, Debug)]
pub enum ResumeLease {
    /// Take it (`steal`: even from an expired holder); refuse if held.
    Take { steal: bool },
    /// A copy that never checkpoints: no lease.
    ReadOnly,
}

/// `ws create`: a new workspace from `spec`, materialized into `dir`.
async fn create(
    fetcher: &Arc<Fetcher>,
    name: &str,
    spec: &str,
    dir: &Path,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ResumeReport> {
    if !crate::checkout::is_empty_dir(dir)? {
        if let Some((ws, _)) = interrupted_resume_of(dir) {
            return Err(Error::User(format!(
                "{} holds the partial copy of workspace {ws}, whose creation or resume was interrupted \
                 (the workspace exists)",
                dir.display(),
            ))
            .then(Next::FinishResume { name: ws, dir: dir.display().to_string() }));
        }
        return Err(Error::User(format!("{} is not empty; create into a new or empty directory", dir.display())));
    }
    // The lease (normally absent) is read beside the ref's creation: its
    // GET opens the second connection that the snapshot ‖ index round trip
    // then finds ready.
    let (v, seen) = futures::join!(create_ref(fetcher, name, spec), read_lease(&fetcher.remote, name));
    let (v, seen) = (v?, seen?);
    let r = materialize_into(fetcher, name, &v, dir, ResumeLease::Take { steal: false }, Some(seen), progress).await;
    if r.is_err() {
        // No copy was made (a failed resume leaves none): the new ref is
        // taken back, so that the same command works once the cause is
        // fixed (it said "already exists").
        let _ = remove(&fetcher.remote, name, true, None).await;
    }
    r
}

/// The ref of workspace `name` (an error naming it when there is none).
async fn read_ws_ref(fetcher: &Fetcher, name: &str) -> Result<RefValue> {
    let refname = ws_ref(name)?;
    let (v, _) = fetcher
        .remote
        .read_ref(&refname)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no workspace named {name}")).then(Next::ListWorkspaces))?;
    Ok(v)
}

/// Creates the ref of a new workspace from `spec`: `Error::RefMoved` when
/// one of that name exists.
async fn create_ref_or_moved(fetcher: &Arc<Fetcher>, name: &str, spec: &str) -> Result<RefValue> {
    let refname = ws_ref(name)?;
    let r = crate::resolve::resolve(fetcher, spec).await?;
    let root = match r.root {
        Some(root) => root,
        None => {
            // A snapshot named by id may be in this machine's cache only
            // (gc deleted it from the store): a ref to it would name what
            // the store cannot serve. Asked beside the snapshot's read.
            let (snap, there) =
                futures::join!(fetcher.snapshot(r.snapshot), fetcher.remote.has_object(Space::Snapshots, &r.snapshot));
            if !there? {
                return Err(Error::NotFound(format!(
                    "snapshot {} is not in the store (gc deleted it once no ref reached it)",
                    r.snapshot.short()
                )));
            }
            snap?.root
        }
    };
    let v = RefValue { snapshot: r.snapshot, root, layers: r.layers.clone() };
    fetcher.remote.cas_ref(&refname, None, v.clone()).await?;
    Ok(v)
}

/// Creates the ref of a new workspace from `spec`; one of that name is
/// refused, pointing at a resume of it.
async fn create_ref(fetcher: &Arc<Fetcher>, name: &str, spec: &str) -> Result<RefValue> {
    create_ref_or_moved(fetcher, name, spec).await.map_err(|e| match e {
        Error::RefMoved { .. } => Error::User(format!("workspace {name} already exists"))
            .then(Next::ResumeExisting { name: name.to_string() }),
        e => e,
    })
}

/// `ws resume`: the workspace's latest checkpoint into `dir`, byte for byte.
///
/// Round trips: the ref and the lease together (two connections opened at
/// once); then the snapshot and the pack index, one on each; then the
/// packs, the stat object and the lease's conditional PUT. A lease another
/// holder keeps is refused after the first, before anything is written.
async fn resume(
    fetcher: &Arc<Fetcher>,
    name: &str,
    dir: &Path,
    lease: ResumeLease,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ResumeReport> {
    let (v, seen) = match lease {
        ResumeLease::Take { .. } => {
            let (v, seen) = futures::join!(read_ws_ref(fetcher, name), read_lease(&fetcher.remote, name));
            (v?, Some(seen?))
        }
        ResumeLease::ReadOnly => (read_ws_ref(fetcher, name).await?, None),
    };
    materialize_into(fetcher, name, &v, dir, lease, seen, progress).await
}

#[derive(Clone, Debug, Serialize)]
pub struct WsInfo {
    pub name: String,
    pub snapshot: String,
    pub time: i64,
    pub message: String,
}

/// Every workspace in the store, in name order with numbers by value
/// (`agent-2` before `agent-10`). The refs in one listing, read 64 at a
/// time, then every snapshot at once: a hundred agents' workspaces cost
/// four round trips (cold), not a hundred and three.
pub async fn list(fetcher: &Arc<Fetcher>) -> Result<Vec<WsInfo>> {
    use futures::StreamExt;
    let refs: Vec<(String, RefValue)> = fetcher
        .remote
        .list_refs()
        .await?
        .into_iter()
        .filter_map(|(name, v)| name.strip_prefix("ws/").map(|ws| (ws.to_string(), v)))
        .collect();
    let mut out: Vec<WsInfo> = futures::stream::iter(refs)
        .map(|(name, v)| async move {
            let s = fetcher.snapshot(v.snapshot).await?;
            Ok::<_, Error>(WsInfo { name, snapshot: v.snapshot.to_hex(), time: s.time, message: s.message })
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    out.sort_by(|a, b| natural_cmp(&a.name, &b.name));
    Ok(out)
}

/// Names compared with their runs of digits by value: `a2` < `a10`.
fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let b = s.as_bytes();
        for i in 1..=b.len() {
            if i == b.len() || b[i].is_ascii_digit() != b[start].is_ascii_digit() {
                out.push((b[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    // A run of digits by value (its length without leading zeros, then
    // its digits), before any other text.
    fn key<'a>(&(digits, p): &(bool, &'a str)) -> (u8, usize, &'a str) {
        match digits {
            true => (0, p.trim_start_matches('0').len(), p.trim_start_matches('0')),
            false => (1, 0, p),
        }
    }
    let (pa, pb) = (parts(a), parts(b));
    for (x, y) in pa.iter().zip(&pb) {
        let o = key(x).cmp(&key(y));
        if o != std::cmp::Ordering::Equal {
            return o;
        }
    }
    pa.len().cmp(&pb.len()).then_with(|| a.cmp(b))
}

/// Deletes the workspace's ref and lease (working copies are left alone).
/// A lease some working copy holds (not released, not expired) refuses it
/// unless `force`: that copy could no longer checkpoint, and its changes
/// since its last checkpoint would have nowhere to go. One round trip (the
/// ref and the lease together) before the deletes.
///
/// `dead`: a holder known to be gone (a mount here whose daemon died),
/// whose lease refuses nothing.
/// Deletes the ref and the lease; returns what the ref named.
async fn remove(remote: &Remote, name: &str, force: bool, dead: Option<&str>) -> Result<RefValue> {
    let refname = ws_ref(name)?;
    let (cur, lease) = futures::join!(remote.read_ref(&refname), read_lease(remote, name));
    let Some((cur, _)) = cur? else {
        return Err(Error::NotFound(format!("no workspace named {name}")));
    };
    if let Some((bytes, _)) = lease? {
        match Lease::decode(&bytes) {
            Ok(l) if !force && !l.holder.is_empty() && l.expires > now() && dead != Some(l.holder.as_str()) => {
                return Err(Error::User(format!(
                    "workspace {name} is leased by {} until {}: that working copy could not checkpoint \
                     after this",
                    crate::error::describe_holder(&l.holder),
                    crate::error::local_time(l.expires)
                ))
                .then(Next::ReleaseOrForceRemove { name: name.to_string() }));
            }
            _ => {}
        }
    }
    remote.delete_ref(&refname).await?;
    remote.delete_lease(&refname).await;
    Ok(cur)
}

#[cfg(test)]
mod name_tests {
    use super::{natural_cmp, ws_ref};

    #[test]
    fn workspaces_are_listed_with_their_numbers_by_value() {
        let mut names = vec!["agent-10", "agent-2", "agent-1", "b", "agent-02x", "agent", "a10b2", "a10b10", "a9"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["a9", "a10b2", "a10b10", "agent", "agent-1", "agent-2", "agent-02x", "agent-10", "b"]);
    }

    #[test]
    fn a_workspace_name_is_refused_in_its_own_words() {
        assert_eq!(ws_ref("agent-7").unwrap(), "ws/agent-7");
        assert_eq!(ws_ref("team/a.b_c").unwrap(), "ws/team/a.b_c");
        for bad in ["../evil", "", "a//b", ".hidden", "a b", "/abs"] {
            let e = ws_ref(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("invalid workspace name {bad:?}")) && !e.contains("ws/"), "{bad}: {e}");
        }
    }
}
