//! `import-git`: turn git commits into mado snapshots.
//!
//! Two phases, so the network is touched only once it has to be:
//! 1. **Stage** (blocking thread, no network): walk the commit's tree with
//!    gix, apply the repository's `.gitattributes` conversions as `git
//!    clone` would (read from the commit's own tree, not the worktree),
//!    split large files, and stage every object: into the disk cache, or
//!    (when packs are built, the default) trees and small blobs in one
//!    spill file up to [`SPILL_BUDGET`], the packs then being what reaches
//!    the cache. Hostile names are refused here, with the path.
//! 2. **Upload** (async), packs-first by default: what the store has is
//!    what the index of the ref's tree names, so the new members go up as
//!    packs built on top of it (no HEAD or PUT per object), then the index,
//!    alongside the snapshots, and finally the ref moves with
//!    compare-and-swap. With `--no-packs`: find what the store lacks
//!    top-down (a present tree proves its subtree), then write leaves,
//!    trees by height, snapshots, and the ref.

mod gitblob;
mod stage;

pub use stage::{stage, StagedRev};

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::cache::DiskCache;
use crate::error::{Error, Next, Result};
use crate::hash::{Hash, SnapshotId};
use crate::object::{RefValue, Snapshot};
use crate::store::{Remote, Space};
use crate::upload::{upload_closure, Spilled, Staged, UploadReport};

/// Blob bytes an import stages in its spill file before it stages in the
/// cache (see [`Staged::spilling`]).
pub const SPILL_BUDGET: u64 = 4 << 30;

/// One imported commit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Imported {
    pub rev: String,
    pub commit: String,
    pub snapshot: String,
    pub root: String,
    /// False when the ref already held this content (nothing new written).
    pub new_snapshot: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ImportReport {
    pub imported: Vec<Imported>,
    pub files: u64,
    pub bytes: u64,
    pub upload: UploadReport,
    /// Packs built for tips whose index was not published yet.
    pub packs: Vec<crate::publish::PackReport>,
    pub ref_name: String,
    /// The ref whose packs a new ref's import built on (what they hold
    /// was not sent again), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub built_on: Option<String>,
    /// What went wrong without failing the import (packs not published).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What would help with the warnings (publishing the packs again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<Next>,
}

/// Phase 2 and the ref: snapshots chained on `ref_name`'s history.
pub async fn publish(
    remote: &Remote,
    cache: &Arc<DiskCache>,
    staged: &Staged,
    revs: &[StagedRev],
    ref_name: &str,
    packs: Option<crate::publish::PackOptions>,
    seed: Option<&str>,
) -> Result<ImportReport> {
    let roots: Vec<Hash> = revs.iter().map(|r| *r.root).collect();
    let spilled = staged.spilled();
    let primary = packs.as_ref().filter(|o| o.primary).cloned();
    // One new tree, packs-first (an import of one commit, the usual case):
    // whether its index exists is asked alongside its packs, after the
    // writer's lock (IndexCheck::Concurrent), not in a round trip before.
    let single = primary.is_some() && roots.iter().collect::<HashSet<_>>().len() == 1;
    // A tree this cache holds the index of was packed before (here, or in
    // another store this cache serves): its index is asked beside the
    // writer's lock instead (no round trip more), so that an import of it
    // under another ref builds and sends no pack when the store has them.
    // (An import of what the ref holds stops after the ref: no request.)
    let known_here = roots.first().is_some_and(|r| cache.index_path(r).exists());
    let ask_after = single && !known_here;
    let ask_with_lock = single && known_here;
    let index_probe = async {
        let mut out = Vec::new();
        if packs.is_some() && !single {
            let heads = roots.iter().map(|r| async move { remote.has_index(r).await.map(|present| (*r, present)) });
            for r in futures::future::join_all(heads).await {
                out.push(r?);
            }
        }
        Ok::<_, Error>(out)
    };
    // Round trip 1: the ref, the index probe, and (one new tree) the
    // writer's lock, whose LIST goes in round trip 2 with the ref's
    // snapshot and the index of the ref's tree (the base of the packs)
    // when they are not cached. An import of what the ref already holds
    // stops there: the ref proves its whole closure is in the store, so
    // there is nothing to upload and nothing for gc to race.
    // The lock goes early only when the tree looks new here (no local copy
    // of its index): an import of what the ref already holds, told apart
    // only once the ref is read, then makes no write at all.
    let early = ask_after;
    let early_lock = async {
        match early {
            true => Some(remote.begin_write().await),
            false => None,
        }
    };
    // The base comes early only with the early lock (that is when it is
    // used): otherwise it is fetched alongside the lock below, once.
    let with_base = early;
    // A new ref builds its packs on the seed's index (`main` unless the
    // caller names another), so what the store holds under it is not sent
    // again (a release branch, another commit of the same repository).
    let seed = primary.as_ref().and(seed).filter(|s| *s != ref_name);
    let ((current, early_base), indexed, early_lock) =
        futures::join!(read_ref_and_base(remote, cache, ref_name, with_base, seed), index_probe, early_lock);
    let current = current?;
    let noop = {
        let mut at = current.as_ref().map(|(_, _, s)| (s.root, s.source.clone()));
        revs.iter().all(|r| {
            let same =
                at.as_ref().is_some_and(|(root, source)| *root == r.root && *source == format!("git:{}", r.commit));
            at = Some((r.root, format!("git:{}", r.commit)));
            same
        })
    };
    let ((imported, pack_reports, warnings), upload, built_on) = if noop {
        if let Some(Ok(lock)) = early_lock {
            remote.drop_lock(lock).await;
        }
        let mut upload = UploadReport::default();
        let nothing = async { Ok((Vec::new(), UploadReport::default())) };
        let r =
            finish_publish(remote, cache, revs, ref_name, packs, Ok(current), &mut upload, indexed, &spilled, nothing)
                .await?;
        (r, upload, None)
    } else {
        // Something to publish: the writer's lock (a PUT, then a LIST for a
        // sweeping gc) before the first dedup HEAD, so gc never deletes an
        // object this import finds present and reuses (docs/DESIGN.md).
        // Packs-first: the index of what the ref holds is the base (what
        // the store has), fetched alongside the lock.
        let (lock, base, probed) = match early_lock {
            Some(lock) => (lock, early_base, None),
            None => {
                let base = async {
                    match (&primary, &current, &seed) {
                        (Some(_), Some((v, _, _)), _) => index_of(remote, cache, &v.root).await,
                        (Some(_), None, Some(s)) => Ok(seed_index(remote, cache, s).await),
                        _ => Ok(None),
                    }
                };
                let probe = async {
                    match (ask_with_lock, roots.first()) {
                        (true, Some(r)) => Some(remote.has_index(r).await.map(|present| (*r, present))),
                        _ => None,
                    }
                };
                futures::join!(remote.begin_write(), base, probe)
            }
        };
        let lock = lock?;
        let seeded = current.is_none() && matches!(&base, Ok(Some(_)));
        let r = async {
            let mut upload = UploadReport::default();
            // Packs-first: the packs and index go up alongside the
            // snapshots (nothing reaches either before the ref moves).
            let (alongside, packs, indexed) = match primary {
                Some(opts) => {
                    let base = base?;
                    let indexed: Vec<(Hash, Option<bool>)> = match (ask_after, probed) {
                        // Not asked yet: asked alongside the packs.
                        (true, _) => roots.iter().take(1).map(|r| (*r, None)).collect(),
                        (false, Some(p)) => vec![p.map(|(r, present)| (r, Some(present)))?],
                        (false, None) => indexed?.into_iter().map(|(r, present)| (r, Some(present))).collect(),
                    };
                    let spilled = &spilled;
                    let f = async move { publish_primary(remote, cache, &indexed, base, &opts, spilled).await };
                    (futures::future::Either::Left(f), None, Ok(Vec::new()))
                }
                None => {
                    upload = upload_closure(remote, cache, staged, &roots).await?;
                    let none = async { Ok((Vec::new(), UploadReport::default())) };
                    (futures::future::Either::Right(none), packs, indexed)
                }
            };
            let r = finish_publish(
                remote,
                cache,
                revs,
                ref_name,
                packs,
                Ok(current),
                &mut upload,
                indexed,
                &spilled,
                alongside,
            )
            .await?;
            Ok::<_, Error>((r, upload))
        }
        .await;
        // After the ref moved (or failed to): gc may sweep again.
        remote.drop_lock(lock).await;
        let (r, upload) = r?;
        (r, upload, seeded.then(|| seed.unwrap_or_default().to_string()))
    };
    spill(cache, staged, &roots, &pack_reports).await;
    Ok(ImportReport {
        imported,
        files: staged.files,
        bytes: staged.bytes,
        upload,
        packs: pack_reports,
        ref_name: ref_name.to_string(),
        built_on,
        next: if warnings.is_empty() { Vec::new() } else { vec![Next::RepackRecursive] },
        warnings,
    })
}

type CurrentRef = Option<(RefValue, crate::store::RefVersion, Snapshot)>;

/// Tree `root`'s pack index in the store, if it has one that decodes.
async fn index_of(remote: &Remote, cache: &DiskCache, root: &Hash) -> Result<Option<Arc<crate::pack::PackIndex>>> {
    Ok(crate::fetch::load_index(remote, cache, *root, &[]).await?.ok().map(|(idx, _)| Arc::new(idx)))
}

/// Packs-first: each new root's content goes up as packs (plus the
/// objects too large for one, alone), then its index, built on top of
/// `base` (the index of what the ref held, then of each root before it),
/// so only members the store lacks are packed. No HEAD per object: what
/// the store has is what the base index names.
async fn publish_primary(
    remote: &Remote,
    cache: &Arc<DiskCache>,
    indexed: &[(Hash, Option<bool>)],
    mut base: Option<Arc<crate::pack::PackIndex>>,
    opts: &crate::publish::PackOptions,
    spilled: &Option<Arc<Spilled>>,
) -> Result<(Vec<crate::publish::PackReport>, UploadReport)> {
    let mut upload = UploadReport::default();
    let mut reports = Vec::new();
    let mut done = HashSet::new();
    for (root, present) in indexed {
        if !done.insert(*root) {
            continue;
        }
        // An index found by the probe is trusted once what it names is seen
        // in the store: a checkpoint writes its index beside its packs, and
        // one that stopped between the two leaves an index to replace.
        if *present == Some(true) && crate::publish::index_is_sound(remote, root).await? {
            base = index_of(remote, cache, root).await?;
            continue;
        }
        let index_check = match present {
            // Unknown: the index goes up beside the packs, conditionally
            // (a sound one found there stays: the packs that went up
            // meanwhile are garbage for gc).
            None => crate::publish::IndexCheck::Concurrent,
            // Absent, or found unsound: written after the packs, over it.
            Some(_) => crate::publish::IndexCheck::KnownAbsent,
        };
        let o = crate::publish::PackOptions { index_check, base: base.clone(), primary: true, ..opts.clone() };
        let r = packs_of(remote, cache, *root, o, spilled).await?;
        upload.objects_uploaded += r.loose_uploaded;
        upload.bytes_uploaded += r.bytes_uploaded;
        base = r.index.clone();
        reports.push(r);
    }
    Ok((reports, upload))
}

/// Builds and publishes `root`'s packs from what was staged: from the spill file
/// (the packs then kept in the cache) when the import staged there.
async fn packs_of(
    remote: &Remote,
    cache: &Arc<DiskCache>,
    root: Hash,
    opts: crate::publish::PackOptions,
    spilled: &Option<Arc<Spilled>>,
) -> Result<crate::publish::PackReport> {
    match spilled {
        Some(m) => crate::publish::publish_staged_packs(remote, cache, root, opts, m.clone()).await,
        None => crate::publish::publish_packs(remote, cache, root, opts, None).await,
    }
}

/// Content spilled at staging that no pack in the cache carries (a tree
/// indexed already, or the ref's own, or members of the ref's packs this
/// cache never read) goes to the cache as loose objects, where staging in
/// the cache would have left it: reads right after an import stay local.
/// Everything spilled is below one of `roots`. Best effort, as any cache
/// write (a full disk warns once). What the packs carry is one sorted list
/// of ids, not a map: on a big tree the import's peak is near.
async fn spill(cache: &Arc<DiskCache>, staged: &Staged, roots: &[Hash], built: &[crate::publish::PackReport]) {
    let Some(spilled) = staged.spilled() else { return };
    let mut indexes = Vec::new();
    let mut done = HashSet::new();
    for root in roots {
        if !done.insert(*root) {
            continue;
        }
        let hex = root.to_hex();
        match built.iter().rev().find(|r| r.tree == hex).and_then(|r| r.index.clone()) {
            Some(i) => indexes.push(i),
            None => indexes.extend(local_index(cache, root).map(Arc::new)),
        }
    }
    // The trees, and the members the cache's copies of the packs list.
    let mut covered: Vec<Hash> = Vec::new();
    for i in &indexes {
        covered.reserve(i.trees.len() + i.member_count());
        covered.extend(i.trees.iter().map(|(t, _)| *t));
        for p in &i.packs {
            covered.extend(cache.pack_listed(&p.id, p.members.iter().map(|m| &m.id)));
        }
    }
    drop(indexes);
    // Usually all that was spilled (a new tree, packed whole): told by
    // the ids' first bytes, without reading the spill file back. (Two
    // ids sharing their first 8 bytes count once: then the long way. An id
    // of another object taken for a spilled one, a chance of about one in
    // 2^64 per pair, leaves that one out of the cache: a read of it then
    // costs a GET, never a wrong byte.)
    let mut hit: HashSet<u64, std::hash::BuildHasherDefault<crate::upload::IdPrefix>> = HashSet::default();
    hit.extend(covered.iter().filter(|id| spilled.may_hold(id)).map(crate::upload::prefix));
    if hit.len() == spilled.len() {
        return;
    }
    drop(hit);
    covered.sort_unstable();
    covered.dedup();
    let Ok(ids) = spilled.ids() else { return };
    let left: Vec<Hash> = ids.into_iter().filter(|id| covered.binary_search(id).is_err()).collect();
    drop(covered);
    if left.is_empty() {
        return;
    }
    let c = cache.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for id in left {
            if let Ok(Some(b)) = spilled.get(&id) {
                if c.put(&id, &b).is_err() {
                    return;
                }
            }
        }
    })
    .await;
}

/// Tree `root`'s pack index from the cache's copies of its layers alone
/// (no network); its top layer alone when a layer below is not there.
fn local_index(cache: &DiskCache, root: &Hash) -> Option<crate::pack::PackIndex> {
    let read = |t: &Hash| {
        let b = std::fs::read(cache.index_path(t)).ok()?;
        crate::pack::PackIndex::decode(&b).ok().filter(|i| i.tree == *t)
    };
    let top = read(root)?;
    let lower: Option<Vec<_>> = top.base.iter().map(read).collect();
    match lower {
        Some(lower) => {
            let fallback = top.clone();
            Some(top.merge(lower).unwrap_or(fallback))
        }
        None => Some(top),
    }
}

/// The rest of [`publish`], under the writer's lock: packs, snapshots and
/// the ref.
#[allow(clippy::too_many_arguments)]
async fn finish_publish(
    remote: &Remote,
    cache: &Arc<DiskCache>,
    revs: &[StagedRev],
    ref_name: &str,
    packs: Option<crate::publish::PackOptions>,
    current: Result<CurrentRef>,
    upload: &mut UploadReport,
    indexed: Result<Vec<(Hash, bool)>>,
    spilled: &Option<Arc<Spilled>>,
    alongside: impl std::future::Future<Output = Result<(Vec<crate::publish::PackReport>, UploadReport)>>,
) -> Result<(Vec<Imported>, Vec<crate::publish::PackReport>, Vec<String>)> {
    let (current, indexed) = (current?, indexed?);
    // Packs for each tip whose index is not published yet, built from what
    // this import just put in the disk cache: no GET.
    let mut pack_reports = Vec::new();
    let mut warnings = Vec::new();
    if let Some(opts) = &packs {
        let mut done = HashSet::new();
        for (root, present) in indexed {
            if present || !done.insert(root) {
                continue;
            }
            let opts =
                crate::publish::PackOptions { index_check: crate::publish::IndexCheck::KnownAbsent, ..opts.clone() };
            // Packs are a cache: an import whose objects are all up does
            // not fail for them. One retry, then a warning.
            let mut last = None;
            for _ in 0..2 {
                match packs_of(remote, cache, root, opts.clone(), spilled).await {
                    Ok(r) => {
                        pack_reports.push(r);
                        last = None;
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if let Some(e) = last {
                warnings.push(format!(
                    "the packs of tree {} could not be published ({e}); the import is complete and reads \
                     fall back to one request per object",
                    &root.to_hex()[..12]
                ));
            }
        }
    }
    let mut parent: Option<(SnapshotId, Snapshot)> = current.as_ref().map(|(v, _, s)| (v.snapshot, s.clone()));
    let current = current.map(|(v, ver, _)| (v, ver));
    let mut imported = Vec::new();
    let snapshots = async {
        for r in revs {
            let source = format!("git:{}", r.commit);
            if let Some((pid, p)) = &parent {
                if p.root == r.root && p.source == source {
                    imported.push(Imported {
                        rev: r.rev.clone(),
                        commit: r.commit.clone(),
                        snapshot: pid.to_hex(),
                        root: r.root.to_hex(),
                        new_snapshot: false,
                    });
                    continue;
                }
            }
            let snap = Snapshot {
                root: r.root,
                parents: parent.as_ref().map(|(id, _)| vec![*id]).unwrap_or_default(),
                time: r.time,
                author: r.author.clone(),
                message: r.message.clone(),
                source,
                stat: None,
                stat_layers: Vec::new(),
            };
            let enc = snap.encode();
            let id = SnapshotId::from_hash(Hash::of(&enc));
            cache.put(&id, &enc)?;
            upload.bytes_uploaded += enc.len() as u64;
            upload.snapshots_uploaded += 1;
            remote.put_object(Space::Snapshots, &id, Bytes::from(enc)).await?;
            imported.push(Imported {
                rev: r.rev.clone(),
                commit: r.commit.clone(),
                snapshot: id.to_hex(),
                root: r.root.to_hex(),
                new_snapshot: true,
            });
            parent = Some((id, snap));
        }
        Ok::<_, Error>(())
    };
    let (done, along) = futures::join!(snapshots, alongside);
    done?;
    let (more, up) = along?;
    pack_reports.extend(more);
    upload.objects_uploaded += up.objects_uploaded;
    upload.bytes_uploaded += up.bytes_uploaded;
    let tip = parent.as_ref().map(|(id, s)| (*id, s.root));
    if let Some((tip, root)) = tip {
        if current.as_ref().map(|(v, _)| v.snapshot) != Some(tip) {
            crate::failpoint::pause("import-before-ref");
            // The layers of the tip's index, if this import published it.
            let layers = pack_reports
                .iter()
                .rev()
                .find(|r| r.tree == root.to_hex())
                .and_then(|r| r.index.as_ref())
                .map(|i| i.base.clone())
                .unwrap_or_default();
            let v = RefValue { snapshot: tip, root, layers };
            remote.cas_ref(ref_name, current.as_ref().map(|(_, ver)| ver), v).await?;
        }
        cache.note_ref(remote.url(), ref_name, &tip);
    }
    Ok((imported, pack_reports, warnings))
}

/// The ref a new ref's packs build on unless the caller names another:
/// what the store holds under it is not packed and sent again.
pub const SEED_REF: &str = "main";

/// The ref and its snapshot (from the cache when present), and
/// (`with_base`) the index of the ref's tree, fetched together with the
/// snapshot once the ref named it. When the ref does not exist yet, the
/// base is the index of `seed` (read then: the first import into a ref
/// reads it, no later one does).
async fn read_ref_and_base(
    remote: &Remote,
    cache: &DiskCache,
    ref_name: &str,
    with_base: bool,
    seed: Option<&str>,
) -> (Result<CurrentRef>, Result<Option<Arc<crate::pack::PackIndex>>>) {
    let (v, ver) = match remote.read_ref(ref_name).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            let base = match (with_base, seed) {
                (true, Some(s)) => seed_index(remote, cache, s).await,
                _ => None,
            };
            return (Ok(None), Ok(base));
        }
        Err(e) => return (Err(e), Ok(None)),
    };
    // The ref names its index's layers: all of them come in one round trip.
    let base = async {
        match with_base {
            true => {
                Ok(crate::fetch::load_index(remote, cache, *v.root, &v.layers).await?.ok().map(|(i, _)| Arc::new(i)))
            }
            false => Ok(None),
        }
    };
    let (snap, base) = futures::join!(snapshot_of(remote, cache, ref_name, &v), base);
    (snap.map(|s| Some((v, ver, s))), base)
}

/// The index of ref `seed`'s tree (its layers in one round trip after the
/// ref's), or `None` when the seed cannot be read or its index decoded: it
/// only saves uploads, and nothing fails for it.
async fn seed_index(remote: &Remote, cache: &DiskCache, seed: &str) -> Option<Arc<crate::pack::PackIndex>> {
    let (v, _) = remote.read_ref(seed).await.ok()??;
    crate::fetch::load_index(remote, cache, *v.root, &v.layers).await.ok()?.ok().map(|(i, _)| Arc::new(i))
}

async fn snapshot_of(remote: &Remote, cache: &DiskCache, ref_name: &str, v: &RefValue) -> Result<Snapshot> {
    let b = match cache.get(&v.snapshot) {
        Some(b) => Bytes::from(b),
        None => {
            let b = remote.get_object(Space::Snapshots, &v.snapshot, "snapshot").await?;
            let _ = cache.put(&v.snapshot, &b);
            b
        }
    };
    Snapshot::decode(&b).map_err(|e| Error::corrupt(*v.snapshot, "snapshot", ref_name, e))
}

/// Stage and publish in one call (the CLI's `import-git`): [`stage`]'s
/// arguments, then [`publish`]'s.
#[allow(clippy::too_many_arguments)]
pub async fn import_git(
    remote: &Remote,
    cache: Arc<DiskCache>,
    repo: &Path,
    revs: Vec<String>,
    ref_name: &str,
    packs: Option<crate::publish::PackOptions>,
    seed: Option<&str>,
    progress: Arc<dyn Fn(u64, u64) + Send + Sync>,
) -> Result<ImportReport> {
    crate::object::check_ref_name(ref_name).map_err(Error::User)?;
    if ref_name.starts_with("ws/") {
        // A workspace's ref moves only under its lease, from a working copy
        // whose base it is.
        return Err(Error::User(format!("{ref_name} is a workspace's ref")).then(Next::WorkspaceFromRef));
    }
    let repo = repo.to_path_buf();
    let c = cache.clone();
    // Packs are built from what is staged: small content need not be in
    // the cache as one file per object (the packs go there instead).
    // Without packs, the objects staged in the cache are what reads find.
    let staged = if packs.is_some() { Staged::spilling(&cache, SPILL_BUDGET)? } else { Staged::default() };
    let (staged, revs) = tokio::task::spawn_blocking(move || stage(&repo, &revs, &c, staged, &*progress))
        .await
        .map_err(|e| Error::Io { context: "import task".into(), source: std::io::Error::other(e) })??;
    publish(remote, &cache, &staged, &revs, ref_name, packs, seed).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::gitblob::tests::git;

    fn packs_first() -> crate::publish::PackOptions {
        crate::publish::PackOptions {
            mode: crate::pack::Mode::Recursive,
            cap: 1 << 20,
            index_check: crate::publish::IndexCheck::KnownAbsent,
            base: None,
            layers: None,
            flat: None,
            primary: true,
        }
    }

    async fn import(remote: &Remote, cache: &Path, repo: &Path, rev: &str, ref_name: &str) -> Arc<DiskCache> {
        let cache = Arc::new(DiskCache::open(cache.to_path_buf(), None).unwrap());
        let revs = vec![rev.to_string()];
        let seed = Some(SEED_REF);
        import_git(remote, cache.clone(), repo, revs, ref_name, Some(packs_first()), seed, Arc::new(|_, _| {}))
            .await
            .unwrap();
        cache
    }

    /// What an import spilled and none of its packs holds (here, files the
    /// store has in the seed's packs, which this cache never read) goes to
    /// the cache alone; what its packs hold does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spilled_objects_no_pack_holds_go_to_the_cache_alone() {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        std::fs::create_dir_all(repo.join("d")).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("d/a.txt"), "kept a\n").unwrap();
        std::fs::write(repo.join("b.txt"), "kept b\n").unwrap();
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-qm", "one"]);
        std::fs::write(repo.join("d/c.txt"), "new c\n").unwrap();
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-qm", "two"]);
        let url = url::Url::from_directory_path(t.path().join("store")).unwrap().to_string();
        let remote = Remote::open_creating(&url, &Default::default()).unwrap();

        let first = import(&remote, &t.path().join("c1"), &repo, "HEAD~1", "main").await;
        for text in ["kept a\n", "kept b\n"] {
            assert!(!first.contains(&Hash::of(text.as_bytes())), "{text:?} is in a pack and alone too");
        }
        let second = import(&remote, &t.path().join("c2"), &repo, "HEAD", "other").await;
        for text in ["kept a\n", "kept b\n"] {
            assert!(
                second.contains(&Hash::of(text.as_bytes())),
                "{text:?}, packed under main only, is not in the cache"
            );
        }
        assert!(!second.contains(&Hash::of(b"new c\n")), "new c is in this import's pack and alone too");
    }
}
