//! `ws status`: what a checkpoint of a plain working copy would record,
//! against the snapshot it is based on, as paths added, modified (content,
//! kind or exec bit) and deleted. The working copy is walked exactly as a
//! checkpoint walks it (same stat cache, same ignore rules; changed files
//! are hashed into the cache), and the two trees are compared, skipping
//! every subtree whose id did not change. Nothing is uploaded, no lease is
//! taken, and the working copy's state is not written.

use super::*;

/// What changed in a working copy since its base snapshot.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Status {
    pub workspace: String,
    /// The snapshot the working copy is based on.
    pub base: String,
    pub added: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
    /// Paths a checkpoint would leave out (`.git`, ignore rules).
    pub paths_ignored: u64,
}

/// The status of the plain working copy at `dir`.
pub async fn status(fetcher: &Arc<Fetcher>, dir: &Path, no_ignore: bool) -> Result<Status> {
    let st = load_state(dir)?;
    let base: Hash = st.head.parse().map_err(|_| Error::local_state(dir, "a bad head snapshot id"))?;
    let snap = fetcher.snapshot(base).await?;
    // The base's trees through its index (a local copy, once resumed).
    let _ = fetcher.attach(snap.root).await;
    let (cache, d) = (fetcher.cache.clone(), dir.to_path_buf());
    // Directory rows of the stat cache are the base's trees (while no
    // checkpoint is pending): unchanged directories are not re-encoded.
    let reuse = st.pending.is_none().then_some(base);
    let (_, walked) =
        tokio::task::spawn_blocking(move || working_copy::stage(&d, &cache, no_ignore, reuse)).await.map_err(
            |e| Error::Io { context: "walking the working copy".into(), source: std::io::Error::other(e) },
        )??;
    let mut out = Status {
        workspace: st.name.clone(),
        base: st.head.clone(),
        paths_ignored: walked.ignored,
        ..Default::default()
    };
    let c = crate::diff::diff_trees(fetcher, snap.root, walked.root).await?;
    (out.added, out.modified, out.deleted) = (c.added, c.modified, c.deleted);
    Ok(out)
}
