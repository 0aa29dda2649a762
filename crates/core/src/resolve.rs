//! Naming snapshots: `REF` arguments are a ref name or a snapshot id (a
//! unique prefix of at least 4 hex digits is enough), followed by any
//! number of git's ancestry steps: `~N` (the first parent, N times; `~`
//! alone is `~1`) and `^N` (the Nth parent; `^` alone is `^1`, `^0` the
//! snapshot itself).

use std::sync::Arc;

use crate::error::{Error, Next, Result};
use crate::fetch::{Attach, Fetcher};
use crate::hash::{is_hex_prefix, Hash, SnapshotId, TreeId};
use crate::object::{check_ref_name, Snapshot};
use crate::store::Remote;

/// What a name resolved to. A ref also names its snapshot's root tree.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub snapshot: SnapshotId,
    pub root: Option<TreeId>,
    /// The index layers below the root's (from the ref; a hint).
    pub layers: Vec<Hash>,
}

/// Resolves `spec`. Costs one GET for a ref, nothing for a full id, one
/// LIST for a short id; then one GET per ancestry step (a snapshot read,
/// served by the cache once read).
pub async fn resolve(fetcher: &Arc<Fetcher>, spec: &str) -> Result<Resolved> {
    let (base, steps) = split_ancestry(spec)?;
    let store = fetcher.remote.url();
    let r = resolve_name(&fetcher.remote, base).await.map_err(|e| offline_hint(&fetcher.cache, store, base, e))?;
    if r.root.is_some() {
        fetcher.cache.note_ref(store, base, &r.snapshot);
    }
    if steps.is_empty() {
        return Ok(r);
    }
    let mut id = r.snapshot;
    for (done, parent) in steps.into_iter().enumerate() {
        let snap = fetcher.snapshot(id).await?;
        id = *snap.parents.get(parent).ok_or_else(|| {
            let has = match snap.parents.len() {
                0 => "no parent".to_string(),
                1 => "only one parent".to_string(),
                n => format!("only {n} parents"),
            };
            let which = match done {
                0 => base.to_string(),
                n => format!("{n} step{} back from {base}", if n == 1 { "" } else { "s" }),
            };
            Error::NotFound(format!("{spec}: snapshot {} ({which}) has {has}", id.short()))
                .then(Next::Log { base: base.to_string() })
        })?;
    }
    Ok(Resolved { snapshot: id, root: None, layers: Vec::new() })
}

/// A store that could not be asked for ref `name`: when this machine read
/// that ref of this store before, the error's hint names the snapshot it
/// was then (a full id is read from the cache alone, without the store);
/// a short id gets the hint that its full id is.
fn offline_hint(cache: &crate::cache::DiskCache, store: &str, name: &str, mut e: Error) -> Error {
    let short = is_hex_prefix(name) && name.len() < 64;
    if let Error::Remote { hint, .. } = &mut e {
        if let Some((id, when)) = cache.seen_ref(store, name) {
            let ago = when.elapsed().map(|d| d.as_secs()).unwrap_or(0);
            let ago = match ago {
                0..120 => format!("{ago} s"),
                120..7200 => format!("{} min", ago / 60),
                7200..172800 => format!("{} h", ago / 3600),
                _ => format!("{} days", ago / 86400),
            };
            hint.push_str(&format!(
                "\n  hint: this machine last read {name} as snapshot {id} ({ago} ago); that full id in its place \
                 reads what this cache holds of it without the store"
            ));
        }
        if short {
            return e.then(Next::FullIdOffline);
        }
    }
    e
}

/// Splits `spec` into its name and its ancestry steps, each the index of
/// the parent it follows.
fn split_ancestry(spec: &str) -> Result<(&str, Vec<usize>)> {
    let Some(at) = spec.find(['~', '^']) else { return Ok((spec, Vec::new())) };
    let (base, mut rest) = spec.split_at(at);
    let bad = || {
        Error::User(format!(
            "cannot read {spec:?}: after the name, only ancestry steps may follow: ~N (first parent, N times) \
             or ^N (the Nth parent), N optional"
        ))
    };
    if base.is_empty() {
        return Err(bad());
    }
    let mut steps = Vec::new();
    while let Some(op) = rest.chars().next() {
        let digits = rest[1..].bytes().take_while(u8::is_ascii_digit).count();
        let (step, tail) = rest.split_at(1 + digits);
        let too_many =
            || Error::User(format!("cannot read {spec:?}: {} is more steps than any history here has", &step[1..]));
        let n: Option<usize> = if digits == 0 { None } else { Some(step[1..].parse().map_err(|_| too_many())?) };
        match (op, n) {
            ('~', n) => {
                let n = n.unwrap_or(1);
                if n > 100_000 {
                    return Err(too_many());
                }
                steps.extend(std::iter::repeat_n(0, n));
            }
            ('^', Some(0)) => {}
            ('^', n) => steps.push(n.unwrap_or(1) - 1),
            _ => return Err(bad()),
        }
        rest = tail;
    }
    Ok((base, steps))
}

/// Resolves a name without ancestry steps.
async fn resolve_name(remote: &Remote, spec: &str) -> Result<Resolved> {
    if let Ok(h) = spec.parse::<SnapshotId>() {
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
            [one] => Ok(Resolved { snapshot: SnapshotId::from_hash(*one), root: None, layers: Vec::new() }),
            [] => Err(Error::NotFound(format!("no ref or snapshot named {spec:?}")).then(Next::ListRefs)),
            many => Err(Error::User(format!(
                "{spec:?} matches {} snapshots; give more digits ({} …)",
                many.len(),
                many.iter().take(3).map(|h| h.short()).collect::<Vec<_>>().join(", ")
            ))),
        };
    }
    // A few hex digits: meant as a short id, perhaps.
    let short = if is_hex_prefix(spec) { " (a snapshot id needs at least 4 hex digits)" } else { "" };
    // What the store does have (one LIST, on this failing path only): a
    // store whose bucket is missing fails here with that, not as a
    // missing ref.
    let names = remote.ref_names().await?;
    let (have, next) = match names.len() {
        0 => (format!("the store at {} has no refs yet", remote.url()), Next::ImportGit),
        n => {
            let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
            let more = if n > 8 { format!(" and {} more", n - 8) } else { String::new() };
            (format!("refs there: {}{more}", shown.join(", ")), Next::ListRefs)
        }
    };
    Err(Error::NotFound(format!("no ref named {spec:?}{short}; {have}")).then(next))
}

/// Resolves `spec`, reads its snapshot and attaches the root tree's pack
/// index. From a ref, the snapshot and the index are fetched together (the
/// ref names the root), so a cold open costs two round trips.
///
/// The index is asked for first, so it takes the connection the ref's GET
/// left idle; the snapshot's GET opens the second one.
pub async fn open(fetcher: &Arc<Fetcher>, spec: &str) -> Result<(SnapshotId, Snapshot, Attach)> {
    let r = resolve(fetcher, spec).await?;
    match r.root {
        Some(root) => {
            let (attach, snap) = futures::join!(fetcher.attach_hinted(*root, &r.layers), fetcher.snapshot(r.snapshot));
            let snap = snap?;
            if snap.root != root {
                return Err(Error::Corrupt {
                    id: *r.snapshot,
                    what: "snapshot",
                    path: spec.to_string(),
                    detail: "the ref names a different root tree than its snapshot".into(),
                });
            }
            Ok((r.snapshot, snap, attach?))
        }
        None => {
            let snap = fetcher.snapshot(r.snapshot).await?;
            let attach = fetcher.attach(*snap.root).await?;
            Ok((r.snapshot, snap, attach))
        }
    }
}

/// What [`open_tree`] found: the snapshot's id, its root tree, and how the
/// root's pack index was attached; `check` finishes the snapshot's read.
pub struct OpenTree {
    pub snapshot: SnapshotId,
    pub root: TreeId,
    pub attach: Attach,
    /// The snapshot object's read, still under way: await it before
    /// reporting success. It fails if the snapshot cannot be read or names
    /// another root than the ref did. Dropped, it is abandoned.
    pub check: SnapshotCheck,
}

/// See [`OpenTree::check`].
pub type SnapshotCheck = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

/// Resolves `spec` to its root tree and attaches that tree's pack index,
/// for a command that needs the tree only (checkout, materialize, cat,
/// ls), without waiting for the snapshot object when a ref names the root.
///
/// [`open`] waits for both GETs of its second round trip, and the one that
/// finds no idle connection pays for a new one first (a handshake: one more
/// round trip on a network). Here the index is asked for first, so it takes
/// the connection the ref's GET left idle; the snapshot's GET goes on
/// beside it (it is still fetched: the cache then holds it, so a later open
/// by snapshot id costs nothing, and the root it names is checked against
/// the ref's) while the caller goes on with the tree. A snapshot id, or a
/// ref of version 1 (no root), reads the snapshot first.
pub async fn open_tree(fetcher: &Arc<Fetcher>, spec: &str) -> Result<OpenTree> {
    let r = resolve(fetcher, spec).await?;
    let Some(root) = r.root else {
        let root = fetcher.snapshot(r.snapshot).await?.root;
        let attach = fetcher.attach(*root).await?;
        return Ok(OpenTree { snapshot: r.snapshot, root, attach, check: Box::pin(async { Ok(()) }) });
    };
    let attach = fetcher.attach_hinted(*root, &r.layers);
    let (f, id, name) = (fetcher.clone(), r.snapshot, spec.to_string());
    let snap = Box::pin(async move {
        let snap = f.snapshot(id).await?;
        if snap.root != root {
            return Err(Error::Corrupt {
                id: *id,
                what: "snapshot",
                path: name,
                detail: "the ref names a different root tree than its snapshot".into(),
            });
        }
        Ok(())
    });
    // Polled in this order: the index's GET first.
    let (attach, check): (Result<Attach>, SnapshotCheck) = match futures::future::select(Box::pin(attach), snap).await {
        futures::future::Either::Left((attach, snap)) => {
            // Driven on from here: its connection's handshake needs polling.
            let task = tokio::spawn(snap);
            (attach, Box::pin(async move { task.await.map_err(|e| Error::Internal(format!("{e}")))? }))
        }
        futures::future::Either::Right((checked, attach)) => (attach.await, Box::pin(async move { checked })),
    };
    Ok(OpenTree { snapshot: r.snapshot, root, attach: attach?, check })
}

#[cfg(test)]
mod tests {
    use super::split_ancestry;

    #[test]
    fn ancestry_steps_are_split_as_git_reads_them() {
        let steps = |s| split_ancestry(s).map(|(b, v)| (b.to_string(), v)).map_err(|e| e.to_string());
        assert_eq!(steps("main"), Ok(("main".into(), vec![])));
        assert_eq!(steps("ws/a~"), Ok(("ws/a".into(), vec![0])));
        assert_eq!(steps("main~3"), Ok(("main".into(), vec![0, 0, 0])));
        assert_eq!(steps("main~0"), Ok(("main".into(), vec![])));
        assert_eq!(steps("main^"), Ok(("main".into(), vec![0])));
        assert_eq!(steps("main^2"), Ok(("main".into(), vec![1])));
        assert_eq!(steps("main^0"), Ok(("main".into(), vec![])));
        assert_eq!(steps("main^^2~2"), Ok(("main".into(), vec![0, 1, 0, 0])));
        assert_eq!(steps("abcd12~10"), Ok(("abcd12".into(), vec![0; 10])));
        assert_eq!(steps("main~100000").map(|(_, v)| v.len()), Ok(100_000), "the most steps taken");
        for bad in ["~1", "^", "main~x", "main~1x", "main^-1"] {
            assert!(steps(bad).unwrap_err().contains("ancestry steps"), "{bad}");
        }
        for far in ["main~100001", "main~99999999999999999999999", "main^99999999999999999999999"] {
            assert!(steps(far).unwrap_err().contains("more steps than"), "{far}");
        }
    }
}
