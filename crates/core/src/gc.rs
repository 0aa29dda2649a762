//! Garbage collection: delete what no ref reaches.
//!
//! Mark: from every ref, follow snapshot parents, then trees, then chunk
//! manifests to their chunks. Packs are never consulted for liveness: an
//! object a pack holds but no ref reaches is deleted like any other.
//!
//! Sweep, in the reverse of the closure rule so the store is consistent at
//! every instant (a present object still has everything it references):
//! snapshots, then pack indexes of unreached trees, then packs that no kept
//! index names, then trees, then chunk manifests, then blobs and chunks.
//! Anything younger than the grace period is kept, so an import or a
//! checkpoint that is uploading (objects first, ref last) is never cut.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::fetch::Fetcher;
use crate::hash::{Hash, SnapshotId};
use crate::object::{ChunkManifest, Kind};
use crate::pack::PackIndex;
use crate::store::{layout, Space, CONCURRENCY};

#[derive(Clone, Debug, Default, Serialize)]
pub struct GcReport {
    pub refs: usize,
    pub snapshots_kept: usize,
    pub objects_kept: usize,
    pub deleted_snapshots: u64,
    pub deleted_objects: u64,
    pub deleted_indexes: u64,
    pub deleted_packs: u64,
    pub bytes_freed: u64,
    /// Unreachable but younger than the grace period.
    pub spared_young: u64,
    /// Snapshots no ref reaches, kept because work set aside on this
    /// machine was made on them (`mado ws recover` lists it).
    pub kept_for_set_aside: usize,
    pub dry_run: bool,
}

struct Listed {
    key: Path,
    name: String,
    size: u64,
    young: bool,
}

async fn list(f: &Fetcher, prefix: &str, grace: Duration) -> Result<Vec<Listed>> {
    let cutoff = chrono_now_minus(grace);
    let metas = f.remote.list(prefix).await?;
    Ok(metas
        .into_iter()
        .map(|m| Listed {
            name: m.location.filename().unwrap_or_default().to_string(),
            young: m.last_modified.timestamp() > cutoff,
            size: m.size,
            key: m.location,
        })
        .collect())
}

fn chrono_now_minus(grace: Duration) -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    now.as_secs() as i64 - grace.as_secs() as i64
}

/// Marks and sweeps. With `dry_run`, only counts. `keep`: snapshots kept
/// besides those the refs reach (the checkpoints that work set aside on
/// this machine was made on: a workspace removed while it had
/// uncheckpointed changes; `ws recover` needs them), missing ones skipped.
pub async fn gc(f: &Arc<Fetcher>, grace: Duration, dry_run: bool, keep: &[SnapshotId]) -> Result<GcReport> {
    if dry_run {
        return gc_locked(f, grace, true, keep).await;
    }
    // The exclusive side of the writers' protocol (docs/DESIGN.md, "gc and
    // writers"): announce the sweep, then give way to any writer at work.
    let lock = f.remote.put_lock(crate::store::LockKind::Gc).await?;
    let others = match f.remote.other_locks(&lock).await {
        Ok(o) => o,
        Err(e) => {
            f.remote.drop_lock(lock).await;
            return Err(e);
        }
    };
    if let Some(other) = others.first() {
        let (kind, expires) = (other.kind, other.expires);
        f.remote.drop_lock(lock).await;
        return Err(Error::Busy(format!(
            "gc deleted nothing: {} is at work on this store (its lock expires at {} at the latest); \
             retry when it has finished",
            match kind {
                crate::store::LockKind::Writer => "an import or a checkpoint",
                crate::store::LockKind::Gc => "another gc",
            },
            crate::error::local_time(expires)
        )));
    }
    let r = gc_locked(f, grace, false, keep).await;
    f.remote.drop_lock(lock).await;
    r
}

/// The snapshots gc keeps, and what they name directly.
#[derive(Default)]
struct Marked {
    snaps: HashSet<SnapshotId>,
    /// Their root trees.
    roots: HashSet<Hash>,
    /// Their stat objects and the layers below them.
    stats: HashSet<Hash>,
}

impl Marked {
    /// Marks the snapshots `todo` names and their ancestors; returns how
    /// many were not marked before. `missing_ok`: a snapshot that is gone
    /// (deleted by an older gc) marks nothing, where a ref's stops gc.
    async fn reach(&mut self, f: &Arc<Fetcher>, mut todo: Vec<SnapshotId>, missing_ok: bool) -> Result<usize> {
        let mut added = 0;
        while let Some(id) = todo.pop() {
            if self.snaps.contains(&id) {
                continue;
            }
            let s = match f.snapshot(id).await {
                Ok(s) => s,
                Err(Error::NotFound(_)) if missing_ok => continue,
                Err(e) => return Err(e),
            };
            self.snaps.insert(id);
            added += 1;
            self.roots.insert(s.root.hash());
            if let Some(stat) = s.stat {
                self.stats.insert(stat);
            }
            // The layers below a stat layer (a parent's, already reached
            // through `parents`; marked here too, so no history edit can
            // orphan them).
            self.stats.extend(s.stat_layers.iter().copied());
            todo.extend(s.parents);
        }
        Ok(added)
    }
}

async fn gc_locked(f: &Arc<Fetcher>, grace: Duration, dry_run: bool, keep: &[SnapshotId]) -> Result<GcReport> {
    let mut report = GcReport { dry_run, ..Default::default() };
    // Mark snapshots.
    let refs = f.remote.list_refs().await?;
    report.refs = refs.len();
    let mut marked = Marked::default();
    marked.reach(f, refs.iter().map(|(_, v)| v.snapshot).collect(), false).await?;
    // Then the snapshots the caller keeps (set-aside work's checkpoints):
    // as if a ref named them.
    report.kept_for_set_aside = marked.reach(f, keep.to_vec(), true).await?;
    let Marked { snaps, roots, stats } = marked;
    // Mark objects: stat objects directly (they are leaves), trees level
    // by level (the roots' indexes carry the trees inline), manifests to
    // their chunks. Fail closed: a reachable tree that cannot be read or
    // decoded stops gc before anything is deleted, since what it would
    // have kept alive is unknown.
    let mut live: HashSet<Hash> = stats;
    for r in &roots {
        let _ = f.attach(*r).await?;
    }
    let mut level: Vec<Hash> = roots.iter().copied().collect();
    let mut manifests = Vec::new();
    while !level.is_empty() {
        level.retain(|id| live.insert(*id));
        let trees: Vec<_> =
            futures::stream::iter(level.iter().map(|id| {
                let f = f.clone();
                let id = *id;
                async move {
                    f.tree(id, "").await.map_err(|e| e.at_path("a reachable tree: gc stopped and deleted nothing"))
                }
            }))
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        let mut next = Vec::new();
        for t in trees {
            for e in t.entries {
                match e.kind {
                    Kind::Directory => next.push(e.id),
                    Kind::Gitlink => {}
                    _ if e.chunked => manifests.push(e.id),
                    _ => {
                        live.insert(e.id);
                    }
                }
            }
        }
        level = next;
    }
    for m in manifests {
        if !live.insert(m) {
            continue;
        }
        let b = f.get(Space::Objects, m, "chunk manifest").await?;
        let man = ChunkManifest::decode(&b).map_err(|e| Error::corrupt(m, "chunk manifest", "", e))?;
        live.extend(man.data_chunks());
    }
    report.snapshots_kept = snaps.len();
    report.objects_kept = live.len();

    let mut doomed: Vec<Vec<Path>> = Vec::new();
    let take = |items: Vec<Listed>,
                keep: &dyn Fn(&Listed) -> bool,
                counter: &mut u64,
                report_young: &mut u64,
                bytes: &mut u64| {
        let mut out = Vec::new();
        for it in items {
            if keep(&it) {
                continue;
            }
            if it.young {
                *report_young += 1;
                continue;
            }
            *counter += 1;
            *bytes += it.size;
            out.push(it.key);
        }
        out
    };
    let parse = |it: &Listed| it.name.parse::<Hash>().ok();
    // 1. Snapshots.
    let listed = list(f, layout::SNAPSHOTS, grace).await?;
    let mut young = 0;
    let mut bytes = 0;
    let keep_snap = |it: &Listed| parse(it).is_some_and(|h| snaps.contains(&SnapshotId::from_hash(h)));
    doomed.push(take(listed, &keep_snap, &mut report.deleted_snapshots, &mut young, &mut bytes));
    // 2. Indexes of trees no ref reaches; 3. packs no kept index names.
    // A kept index keeps the layers below it (their trees need not be
    // live: an older checkpoint's root), and every layer its packs.
    let indexes = list(f, layout::INDEXES, grace).await?;
    let mut kept_packs: HashSet<Hash> = HashSet::new();
    let mut layers: HashSet<Hash> = HashSet::new();
    let mut read: HashSet<Hash> = HashSet::new();
    for round in 0..2 {
        for it in &indexes {
            let Some(h) = parse(it) else { continue };
            let keep = match round {
                0 => live.contains(&h) || it.young,
                _ => layers.contains(&h),
            };
            if !keep || !read.insert(h) {
                continue;
            }
            // Fail closed: the packs of a live index that cannot be read
            // may hold the only copy of live content.
            let live_one = round == 1 || live.contains(&h);
            let got = f.remote.get_if_present(&it.key).await;
            let idx = match got {
                Ok(Some(b)) => PackIndex::decode(&b).map_err(|e| e.to_string()),
                Ok(None) => Err("listed, then gone".to_string()),
                Err(e) => Err(e.to_string()),
            };
            match idx {
                Ok(idx) => {
                    kept_packs.extend(idx.packs.iter().map(|p| p.id));
                    layers.extend(idx.base.iter().copied());
                }
                Err(e) if live_one => {
                    return Err(Error::Corrupt {
                        id: h,
                        what: "pack index",
                        path: String::new(),
                        detail: format!("{e}; a live index must be readable: gc stopped and deleted nothing"),
                    })
                }
                Err(_) => {}
            }
        }
    }
    let keep_index = |it: &Listed| parse(it).is_some_and(|h| live.contains(&h) || layers.contains(&h));
    doomed.push(take(indexes, &keep_index, &mut report.deleted_indexes, &mut young, &mut bytes));
    let packs: Vec<Listed> =
        list(f, layout::PACKS, grace).await?.into_iter().filter(|it| !it.key.as_ref().contains("/index/")).collect();
    let keep_pack = |it: &Listed| parse(it).is_some_and(|h| kept_packs.contains(&h));
    doomed.push(take(packs, &keep_pack, &mut report.deleted_packs, &mut young, &mut bytes));
    // 4. Objects: trees, then manifests, then the rest. The kind is read
    // from the magic of objects about to go (cache or store).
    let objects = list(f, layout::OBJECTS, grace).await?;
    let keep_obj = |it: &Listed| parse(it).is_some_and(|h| live.contains(&h));
    let dead = take(objects, &keep_obj, &mut report.deleted_objects, &mut young, &mut bytes);
    let mut by_rank: [Vec<Path>; 3] = Default::default();
    for key in dead {
        let rank = match f.remote.head_bytes(&key, 4).await {
            Ok(m) if &m[..] == b"MADT" => 0,
            Ok(m) if &m[..] == b"MADM" => 1,
            _ => 2,
        };
        by_rank[rank].push(key);
    }
    doomed.extend(by_rank);
    report.spared_young = young;
    report.bytes_freed = bytes;
    if !dry_run {
        for batch in doomed {
            f.remote.delete_keys(batch).await?;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::gc;
    use crate::fetch::Fetcher;
    use crate::hash::Hash;
    use crate::store::Space;
    use crate::testutil::local_store;
    use bytes::Bytes;
    use std::time::Duration;

    /// A dry run says it is one, counts what the sweep then deletes, and
    /// deletes nothing.
    #[tokio::test]
    async fn a_dry_run_counts_what_the_sweep_deletes_and_deletes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (remote, cache) = local_store(dir.path());
        let f = Fetcher::new(remote.clone(), cache);
        let data = Bytes::from_static(b"no ref reaches this");
        let id = Hash::of(&data);
        remote.put_object(Space::Objects, &id, data).await.unwrap();
        let dry = gc(&f, Duration::ZERO, true, &[]).await.unwrap();
        assert!(dry.dry_run);
        assert_eq!((dry.refs, dry.deleted_objects, dry.spared_young), (0, 1, 0));
        assert!(dry.bytes_freed > 0);
        assert!(remote.has_object(Space::Objects, &id).await.unwrap(), "a dry run deleted it");
        let swept = gc(&f, Duration::ZERO, false, &[]).await.unwrap();
        assert!(!swept.dry_run);
        assert_eq!((swept.deleted_objects, swept.bytes_freed), (1, dry.bytes_freed));
        assert!(!remote.has_object(Space::Objects, &id).await.unwrap());
        // Younger than the grace period: spared, and counted as spared.
        let id = Hash::of(b"young");
        remote.put_object(Space::Objects, &id, Bytes::from_static(b"young")).await.unwrap();
        let spared = gc(&f, Duration::from_secs(3600), false, &[]).await.unwrap();
        assert_eq!((spared.deleted_objects, spared.spared_young), (0, 1));
        assert!(remote.has_object(Space::Objects, &id).await.unwrap());
    }
}
