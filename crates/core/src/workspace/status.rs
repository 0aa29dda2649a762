//! `ws status`: what a checkpoint of a working copy (plain or mounted) would record,
//! against the snapshot it is based on, as paths added, modified (content,
//! kind or exec bit) and deleted. The working copy is walked exactly as a
//! checkpoint walks it (same stat cache, same ignore rules; changed files
//! are hashed into the cache), and the two trees are compared, skipping
//! every subtree whose id did not change. Nothing is uploaded, no lease is
//! taken, and the working copy's state is not written.

use super::working_copy::{self};
use super::working_copy::{load_state, load_state_at};
use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::hash::SnapshotId;
use crate::upload::Staged;
use std::path::Path;
use std::sync::Arc;

/// What changed in a working copy since its base snapshot.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    pub workspace: String,
    /// The snapshot the working copy is based on.
    pub base: String,
    pub added: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
    /// Paths a checkpoint would leave out (`.git`, ignore rules).
    pub paths_ignored: u64,
    /// The workspace's head when it is not this copy's base (nor the
    /// checkpoint it has pending): another copy checkpointed since, and a
    /// checkpoint here would be refused. Plain working copies only; `None`
    /// also when the store could not be asked.
    pub moved_to: Option<String>,
}

/// The status of the plain working copy at `dir`.
pub async fn status(fetcher: &Arc<Fetcher>, dir: &Path, no_ignore: bool) -> Result<Status> {
    let st = load_state(dir)?;
    let base: SnapshotId = st.head.parse().map_err(|_| Error::local_state(dir, "a bad head snapshot id"))?;
    let snap = fetcher.snapshot(base).await?;
    // The base's trees through its index (a local copy, once resumed).
    let _ = fetcher.attach(*snap.root).await;
    let (cache, d) = (fetcher.cache.clone(), dir.to_path_buf());
    // Directory rows of the stat cache are the base's trees (while no
    // checkpoint is pending): unchanged directories are not re-encoded.
    let reuse = st.pending.is_none().then_some(base);
    let walk = tokio::task::spawn_blocking(move || working_copy::stage(&d, &cache, no_ignore, reuse));
    // The head, asked for during the walk: one round trip, not after it.
    let head = async { fetcher.remote.read_ref(&super::ws_ref(&st.name)?).await };
    let (walked, head) = futures::join!(walk, head);
    let walked = walked
        .map_err(|e| Error::Io { context: "walking the working copy".into(), source: std::io::Error::other(e) })??;
    let moved_to = match head {
        Ok(Some((v, _))) => Some(v.snapshot.to_hex()).filter(|h| !st.is_at(h)),
        _ => None,
    };
    let mut out = Status {
        workspace: st.name.clone(),
        base: st.head.clone(),
        paths_ignored: walked.ignored,
        moved_to,
        ..Default::default()
    };
    let c = crate::diff::diff_trees(fetcher, snap.root, walked.root).await?;
    (out.added, out.modified, out.deleted) = (c.added, c.modified, c.deleted);
    Ok(out)
}

/// The status of a mounted workspace: what its next checkpoint would
/// record against the snapshot the mount is based on, with the same ignore
/// rules. A dry build: changed files are hashed into the cache, but no id
/// is recorded in the mount's tree (the next checkpoint stages them again)
/// and nothing is uploaded or saved.
pub async fn mount_status(
    fetcher: &Arc<Fetcher>,
    fs: &Arc<crate::vfs::SnapshotFs>,
    state_dir: &Path,
    no_ignore: bool,
) -> Result<Status> {
    let st = load_state_at(state_dir)?;
    let skips = super::mounted::prepare_build(fs, no_ignore, true).await?;
    // The snapshot the mount's tree is based on (the last checkpoint).
    let base_root = fs.root();
    let (fs2, cache) = (fs.clone(), fetcher.cache.clone());
    let built = tokio::task::spawn_blocking(move || {
        let mut staged = Staged::default();
        fs2.build_skipping(&cache, &mut staged, &skips)
    })
    .await
    .map_err(|e| Error::Io { context: "building the status".into(), source: std::io::Error::other(e) })??;
    let c = crate::diff::diff_trees(fetcher, base_root, built.root).await?;
    Ok(Status {
        workspace: st.name.clone(),
        base: st.head.clone(),
        added: c.added,
        modified: c.modified,
        deleted: c.deleted,
        paths_ignored: built.ignored,
        moved_to: None,
    })
}
