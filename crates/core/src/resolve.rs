//! Naming snapshots: `REF` arguments are a ref name or a snapshot id (a
//! unique prefix of at least 4 hex digits is enough).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fetch::{Attach, Fetcher};
use crate::hash::{is_hex_prefix, Hash};
use crate::object::{check_ref_name, Snapshot};
use crate::store::Remote;

/// What a name resolved to. A ref also names its snapshot's root tree.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub snapshot: Hash,
    pub root: Option<Hash>,
    /// The index layers below the root's (from the ref; a hint).
    pub layers: Vec<Hash>,
}

/// Resolves `spec`. Costs one GET for a ref, nothing for a full id, one
/// LIST for a short id.
pub async fn resolve(remote: &Remote, spec: &str) -> Result<Resolved> {
    if let Ok(h) = spec.parse::<Hash>() {
        return Ok(Resolved { snapshot: h, root: None, layers: Vec::new() });
    }
    if check_ref_name(spec).is_ok() {
        if let Some((v, _)) = remote.read_ref(spec).await? {
            return Ok(Resolved { snapshot: v.snapshot, root: Some(v.root), layers: v.layers });
        }
    }
    if is_hex_prefix(spec) && spec.len() >= 4 {
        let found = remote.snapshots_with_prefix(spec).await?;
        return match found.as_slice() {
            [one] => Ok(Resolved { snapshot: *one, root: None, layers: Vec::new() }),
            [] => Err(Error::NotFound(format!(
                "no ref or snapshot named {spec:?}; see `mado refs` for refs and `mado log REF` for snapshot ids"
            ))),
            many => Err(Error::User(format!(
                "{spec:?} matches {} snapshots; give more digits ({} …)",
                many.len(),
                many.iter().take(3).map(|h| h.short()).collect::<Vec<_>>().join(", ")
            ))),
        };
    }
    Err(Error::NotFound(format!(
        "no ref named {spec:?}; list refs with `mado refs` or import one with `mado import-git`"
    )))
}

/// Resolves `spec`, reads its snapshot and attaches the root tree's pack
/// index. From a ref, the snapshot and the index are fetched together (the
/// ref names the root), so a cold open costs two round trips.
pub async fn open(fetcher: &Arc<Fetcher>, spec: &str) -> Result<(Hash, Snapshot, Attach)> {
    let r = resolve(&fetcher.remote, spec).await?;
    match r.root {
        Some(root) => {
            let (snap, attach) = futures::join!(fetcher.snapshot(r.snapshot), fetcher.attach_hinted(root, &r.layers));
            let snap = snap?;
            if snap.root != root {
                return Err(Error::Corrupt {
                    id: r.snapshot,
                    what: "snapshot",
                    path: spec.to_string(),
                    detail: "the ref names a different root tree than its snapshot".into(),
                });
            }
            Ok((r.snapshot, snap, attach?))
        }
        None => {
            let snap = fetcher.snapshot(r.snapshot).await?;
            let attach = fetcher.attach(snap.root).await?;
            Ok((r.snapshot, snap, attach))
        }
    }
}
