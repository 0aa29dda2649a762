//! `ws status`: what a checkpoint of a plain working copy would record,
//! against the snapshot it is based on, as paths added, modified (content,
//! kind or exec bit) and deleted. The working copy is walked exactly as a
//! checkpoint walks it (same stat cache, same ignore rules; changed files
//! are hashed into the cache), and the two trees are compared, skipping
//! every subtree whose id did not change. Nothing is uploaded, no lease is
//! taken, and the working copy's state is not written.

use super::*;
use crate::object::{Entry, Tree};

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
    let (_, walked) = tokio::task::spawn_blocking(move || working_copy::stage(&d, &cache, no_ignore))
        .await
        .map_err(|e| Error::Io { context: "walking the working copy".into(), source: std::io::Error::other(e) })??;
    let mut out = Status {
        workspace: st.name.clone(),
        base: st.head.clone(),
        paths_ignored: walked.ignored,
        ..Default::default()
    };
    // Pairs of trees that differ, iteratively (no depth can overflow).
    let mut todo: Vec<(String, Option<Hash>, Option<Hash>)> = vec![(String::new(), Some(snap.root), Some(walked.root))];
    while let Some((path, old, new)) = todo.pop() {
        if old == new {
            continue;
        }
        let load = |id: Option<Hash>| {
            let f = fetcher.clone();
            let p = path.clone();
            async move {
                match id {
                    Some(id) => f.tree(id, &p).await,
                    None => Ok(Tree { entries: Vec::new() }),
                }
            }
        };
        let (a, b) = futures::try_join!(load(old), load(new))?;
        let join = |name: &[u8]| {
            let n = String::from_utf8_lossy(name);
            if path.is_empty() {
                n.into_owned()
            } else {
                format!("{path}/{n}")
            }
        };
        let find = |t: &Tree, name: &[u8]| t.entries.iter().find(|e| e.name == name).cloned();
        let is_dir = |e: &Entry| e.kind == Kind::Directory;
        for e in &a.entries {
            match find(&b, &e.name) {
                None if is_dir(e) => todo.push((join(&e.name), Some(e.id), None)),
                None => out.deleted.push(join(&e.name)),
                Some(n) if is_dir(e) && is_dir(&n) => todo.push((join(&e.name), Some(e.id), Some(n.id))),
                Some(n) if is_dir(e) => {
                    todo.push((join(&e.name), Some(e.id), None));
                    out.added.push(join(&n.name));
                }
                Some(n) if is_dir(&n) => {
                    out.deleted.push(join(&e.name));
                    todo.push((join(&n.name), None, Some(n.id)));
                }
                Some(n) if n.id != e.id || n.kind != e.kind => out.modified.push(join(&e.name)),
                Some(_) => {}
            }
        }
        for n in &b.entries {
            if find(&a, &n.name).is_none() {
                if is_dir(n) {
                    todo.push((join(&n.name), None, Some(n.id)));
                } else {
                    out.added.push(join(&n.name));
                }
            }
        }
    }
    out.added.sort();
    out.modified.sort();
    out.deleted.sort();
    Ok(out)
}
