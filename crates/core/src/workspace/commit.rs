//! What both kinds of checkpoint share once content is staged: lease,
//! ref and store lock together, the upload in closure order, packs, the
//! snapshot, and last the ref's compare-and-swap.

use super::lease::release_lease;
use super::lease::take_lease_was;
use super::working_copy::LocalState;
use super::{now, ws_ref, CheckpointLease, CheckpointReport};
use crate::cache::DiskCache;
use crate::error::{Error, Next, Result};
use crate::failpoint::hit as failpoint;
use crate::fetch::Fetcher;
use crate::hash::{Hash, SnapshotId, TreeId};
use crate::object::{RefValue, Snapshot, StatObject};
use crate::store::Space;
use crate::workspace::working_copy::save_state_at;
use crate::workspace::working_copy::StatCache;
use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;

pub(super) fn author() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "mado".into());
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{user}@{host}")
}

/// The writer's store lock, being given up once the ref moved: its DELETE
/// is in flight while the caller records the checkpoint locally (a round
/// trip that no longer waits on that work, or the other way round).
#[must_use = "await the unlock before returning, or gc waits for the lock to expire"]
pub(super) struct Unlock(tokio::task::JoinHandle<()>);

impl Unlock {
    pub(super) async fn done(self) {
        let _ = self.0.await;
    }
}

/// The shared part of a checkpoint: `stage` (on a blocking thread) while
/// the lease and the ref are read, then objects, packs, snapshot and,
/// last, the ref. The store lock is released by the returned [`Unlock`].
/// `whole_stat`: `stage` lists every path ([`WalkedStat::Whole`]).
pub(super) async fn commit(
    fetcher: &Arc<Fetcher>,
    st: &LocalState,
    state_at: &Path,
    message: &str,
    opts: CheckpointLease,
    whole_stat: bool,
    stage: impl FnOnce(Arc<DiskCache>) -> Result<Walked> + Send + 'static,
) -> Result<(CheckpointReport, Walked, Hash, Unlock)> {
    let remote = &fetcher.remote;
    let refname = ws_ref(&st.name)?;
    if st.read_only {
        return Err(Error::User(format!(
            "this working copy of workspace {} was resumed --read-only and cannot checkpoint; \
             resume it again without --read-only once its lease is free",
            st.name
        )));
    }
    // The walk (local: hashing what changed into the cache) runs while the
    // lease, the ref and the writer's store lock make their round trips
    // (the lock is a PUT then a LIST, as long as the lease's GET then
    // conditional PUT): after the walk, only the uploads and the ref wait
    // on the network.
    let cache = fetcher.cache.clone();
    let started = std::time::Instant::now();
    let walk = async {
        let w = tokio::task::spawn_blocking(move || stage(cache))
            .await
            .map_err(|e| Error::Io { context: "walking the workspace".into(), source: std::io::Error::other(e) })?;
        tracing::debug!(ms = started.elapsed().as_millis() as u64, "checkpoint: walk done");
        w
    };
    // The parent is most likely the snapshot this copy last recorded: its
    // stat layers are merged and its index loaded (local work, from the
    // cache) while the walk runs, not after it. The stager is one thread,
    // so this uses a core that would otherwise wait. Used only if the ref
    // names it; any failure here is met again, and reported, after the walk.
    let guess = st.pending.as_deref().unwrap_or(&st.head).parse::<SnapshotId>().ok();
    let early = async {
        let p = match guess {
            Some(id) => load_parent(fetcher, id, whole_stat).await.ok(),
            None => None,
        };
        tracing::debug!(ms = started.elapsed().as_millis() as u64, "checkpoint: parent loaded");
        p
    };
    let (walked, (lease, cur, lock), early) = futures::join!(
        walk,
        async {
            futures::join!(
                take_lease_was(remote, &st.name, &st.holder, opts.steal, None),
                remote.read_ref(&refname),
                remote.begin_write()
            )
        },
        early
    );
    let lock = lock?;
    let r = commit_locked(fetcher, st, state_at, message, opts, walked, lease, cur, early).await;
    // After the ref moved (or failed to): gc may sweep again.
    let remote = remote.clone();
    let unlock = Unlock(tokio::spawn(async move { remote.drop_lock(lock).await }));
    match r {
        Ok((report, walked, stat_id)) => Ok((report, walked, stat_id, unlock)),
        Err(e) => {
            unlock.done().await;
            Err(e)
        }
    }
}

/// A parent's stat object: its id, its chain (its id first, the whole
/// bottom last) with the layers above the bottom, and, when the walk lists
/// every path (a plain working copy), its whole (merged) view with every
/// layer as stored.
struct ParentStat {
    id: Hash,
    chain: Vec<Hash>,
    above: Vec<StatObject>,
    whole: Option<(StatObject, Vec<(Hash, StatObject)>)>,
}

/// What a walk says of the new snapshot's stat object.
pub(super) enum WalkedStat {
    /// Every path (a plain working copy's walk).
    Whole(StatObject),
    /// How it differs from the stat object of the mount's base (a mount's
    /// build), with the mount, which has that base.
    Change(crate::vfs::StatChange, Arc<crate::vfs::SnapshotFs>),
}

impl WalkedStat {
    fn whole(&self) -> Result<StatObject> {
        match self {
            WalkedStat::Whole(s) => Ok(s.clone()),
            WalkedStat::Change(c, fs) => fs.stat_view(c),
        }
    }
}

/// What a checkpoint needs of its parent snapshot: the snapshot, its stat
/// object's chain, and its pack index.
pub(super) struct Parent {
    id: SnapshotId,
    snap: Snapshot,
    stat: Option<ParentStat>,
    /// `None`: the parent has no index (a store from before packs-first).
    /// Its layers above the bottom decoded (the new layer may absorb the
    /// small ones at the top), the bottom read in place.
    index: Option<Arc<crate::pack::FlatBase>>,
}

/// Loads [`Parent`] for snapshot `id` (from the cache, where the resume or
/// the last checkpoint left it; else the store).
/// `whole_stat`: merge the parent's whole stat object too (a walk of
/// every path compares with it); else only the layers above its bottom
/// are read.
async fn load_parent(fetcher: &Arc<Fetcher>, id: SnapshotId, whole_stat: bool) -> Result<Parent> {
    let snap = fetcher.snapshot(id).await?;
    let stat = async {
        match snap.stat {
            Some(sid) if whole_stat => {
                let (whole, parts) = whole_stat_of(fetcher, sid, &snap.stat_layers).await?;
                let chain = parts.iter().map(|(h, _)| *h).collect();
                let above = parts[..parts.len() - 1].iter().map(|(_, l)| l.clone()).collect();
                Ok::<_, Error>(Some(ParentStat { id: sid, chain, above, whole: Some((whole, parts)) }))
            }
            Some(sid) => {
                let (chain, above) = fetcher.stat_layers_above_bottom(sid, &snap.stat_layers).await?;
                Ok(Some(ParentStat { id: sid, chain, above, whole: None }))
            }
            None => Ok(None),
        }
    };
    // The layers' flat copies, mapped (made once from the index, if this
    // machine had none): only the small layers above the bottom decode.
    let index = async {
        let got = crate::fetch::load_flat_layers(&fetcher.remote, &fetcher.cache, *snap.root, &[]).await?;
        let Ok((layers, _)) = got else { return Ok::<_, Error>(None) };
        Ok(crate::pack::FlatBase::of(&layers).ok().map(Arc::new))
    };
    let (stat, index) = futures::try_join!(stat, index)?;
    Ok(Parent { id, snap, stat, index })
}

/// Stat object `sid`'s whole view and its chain's layers as stored.
async fn whole_stat_of(
    fetcher: &Arc<Fetcher>,
    sid: Hash,
    hint: &[Hash],
) -> Result<(StatObject, Vec<(Hash, StatObject)>)> {
    let parts = fetcher.stat_chain(sid, hint).await?;
    tokio::task::spawn_blocking(move || crate::fetch::merge_stat_chain(&parts).map(|whole| (whole, parts)))
        .await
        .map_err(|e| Error::Io { context: "merging stat layers".into(), source: std::io::Error::other(e) })?
}

/// The stat object a checkpoint uploads: a layer over its parent's chain,
/// or whole; `None` when it is the parent's. From a mount's change over
/// the parent's own stat object, without the parent's whole object (see
/// [`StatObject::layer_of_change`]); else from the two whole objects.
async fn stat_to_upload(
    fetcher: &Arc<Fetcher>,
    walked: &WalkedStat,
    parent: Option<ParentStat>,
    hint: &[Hash],
) -> Result<Option<StatObject>> {
    let Some(ps) = parent else { return walked.whole().map(Some) };
    let corrupt = |detail| Error::Corrupt { id: ps.id, what: "stat object", path: String::new(), detail };
    if let WalkedStat::Change(change, fs) = walked {
        if change.over == Some(ps.id) {
            if change.is_empty() {
                return Ok(None);
            }
            let delta = crate::object::StatDelta { set: &change.set, removed: &change.removed, len: change.len };
            let layer =
                StatObject::layer_of_change(&delta, &ps.chain, &ps.above, &|p| fs.base_stat_of(p)).map_err(corrupt)?;
            return match layer {
                Some(layer) => Ok(Some(layer)),
                None => fs.stat_view(change).map(Some),
            };
        }
    }
    let (parent_whole, parts) = match ps.whole {
        Some(w) => w,
        None => whole_stat_of(fetcher, ps.id, hint).await?,
    };
    let now = walked.whole()?;
    if now.entries == parent_whole.entries {
        return Ok(None);
    }
    now.layer_over_chain(&parent_whole, &parts).map(Some).map_err(corrupt)
}

/// The rest of [`commit`], under the writer's store lock. `early`: the
/// parent as loaded during the walk, if it was guessed right.
#[allow(clippy::too_many_arguments)]
pub(super) async fn commit_locked(
    fetcher: &Arc<Fetcher>,
    st: &LocalState,
    state_at: &Path,
    message: &str,
    opts: CheckpointLease,
    walked: Result<Walked>,
    lease: Result<bool>,
    cur: Result<Option<(RefValue, crate::store::RefVersion)>>,
    early: Option<Parent>,
) -> Result<(CheckpointReport, Walked, Hash)> {
    let remote = &fetcher.remote;
    let cache = fetcher.cache.clone();
    let refname = ws_ref(&st.name)?;
    let lease_was_ours = lease?;
    let cur = cur?;
    // A checkpoint refused before it writes gives back a lease it took
    // only for itself.
    let give_back = || async {
        if !lease_was_ours {
            let _ = release_lease(remote, &st.name, &st.holder).await;
        }
    };
    let Some((cur, ver)) = cur else {
        give_back().await;
        // Made again at this copy's last checkpoint if the store still
        // holds it; after a gc swept it, from any snapshot, and a forced
        // checkpoint then puts this copy's tree on top (the hint named
        // the swept snapshot, which could not work).
        let kept = match st.head.parse::<Hash>() {
            Ok(h) => remote.has_object(crate::store::Space::Snapshots, &h).await.unwrap_or(true),
            Err(_) => false,
        };
        let next = match kept {
            true => Next::RecreateAt { name: st.name.clone(), from: st.head.clone() },
            false => Next::RecreateAndForce { name: st.name.clone() },
        };
        return Err(Error::NotFound(format!(
            "workspace {} is no longer in the store (no ref {refname}: removed with ws rm?)",
            st.name
        ))
        .then(next));
    };
    // Like a push that is not a fast-forward: the workspace moved on since
    // this working copy's base (another copy checkpointed), and a
    // checkpoint here would drop those changes from its head.
    let ours = st.is_at(&cur.snapshot.to_hex());
    if !ours && !opts.force {
        let moved = fetcher.snapshot(cur.snapshot).await.ok();
        let by =
            moved.map(|s| format!(" (by {} at {})", s.author, crate::error::local_time(s.time))).unwrap_or_default();
        // So that the copy that moved the workspace (or a resume) is not
        // locked out.
        give_back().await;
        return Err(Error::User(format!(
            "workspace {} moved to {}{by} since this working copy's base {}",
            st.name,
            &cur.snapshot.to_hex()[..12],
            crate::hash::short_hex(&st.head)
        ))
        .then(Next::ResumeOrForce));
    }
    let walked = walked?;
    // The parent's whole stat object (what changed goes up as a layer; its
    // layers are kept too: the new layer may absorb the small ones) and
    // its index (what the store has).
    let whole_stat = matches!(walked.stat, WalkedStat::Whole(_));
    let parent = match early {
        Some(p) if p.id == cur.snapshot => p,
        _ => load_parent(fetcher, cur.snapshot, whole_stat).await?,
    };
    let Parent { snap: parent_snap, stat: parent_stat, index: parent_index, .. } = parent;
    let parent_stat_id = parent_stat.as_ref().map(|p| p.id);
    let mut report = CheckpointReport {
        workspace: st.name.clone(),
        parent: cur.snapshot.to_hex(),
        files_read: walked.files_read,
        files_unchanged: walked.files_unchanged,
        trees_built: walked.trees_built,
        paths_ignored: walked.ignored,
        ..Default::default()
    };
    let up = stat_to_upload(fetcher, &walked.stat, parent_stat, &parent_snap.stat_layers).await?;
    let up = match (up, parent_stat_id) {
        (Some(up), _) => up,
        (None, Some(id)) if parent_snap.root == walked.root => {
            report.snapshot = cur.snapshot.to_hex();
            report.unchanged = true;
            return Ok((report, walked, id));
        }
        // Only the content changed, every time as it was (set back by
        // hand): the same object, whole.
        (None, _) => walked.stat.whole()?,
    };
    let t0 = std::time::Instant::now();
    let stat_bytes = up.encode();
    let stat_id = Hash::of(&stat_bytes);
    cache.put(&stat_id, &stat_bytes)?;
    report.stat_bytes = stat_bytes.len() as u64;
    // What the store has: the parent's index (its packs and the trees it
    // carries). With one, content goes up packs-first on top of it: new
    // members only, no HEAD per object; the stat object alone, alongside.
    // The same root as the parent's (only mtimes changed): nothing but the
    // stat object goes up. A tree indexed in the store already (another
    // workspace made the same edits) is found by the conditional PUT of
    // its index (IndexCheck::Concurrent), not in a round trip of its own.
    let (base, indexed) = match parent_snap.root == walked.root {
        true => (None, true),
        false => (parent_index, false),
    };
    let pack_opts = |flat, primary, index_check| crate::publish::PackOptions {
        mode: crate::pack::Mode::Recursive,
        cap: crate::pack::DEFAULT_MAX_PACK_BYTES,
        index_check,
        base: None,
        layers: None,
        flat,
        primary,
    };
    // The snapshot goes up alongside the content: nothing reaches it
    // before the ref moves, and the ref moves only once both are up.
    let snap = Snapshot {
        root: walked.root,
        parents: vec![cur.snapshot],
        time: now(),
        author: author(),
        message: message.to_string(),
        source: format!("ws:{}", st.name),
        stat: Some(stat_id),
        stat_layers: up.base.clone(),
    };
    let enc = snap.encode();
    let sid = SnapshotId::from_hash(Hash::of(&enc));
    cache.put(&sid, &enc)?;
    let snapshot = async {
        remote.put_object(Space::Snapshots, &sid, Bytes::from(enc)).await?;
        failpoint("checkpoint-after-snapshot");
        Ok::<_, Error>(())
    };
    // The layers below the new tree's index, for the ref (a reader's hint).
    let mut layers: Vec<Hash> = Vec::new();
    let uploads = async {
        if indexed {
            // Only mtimes changed: the stat object is all that is new (a
            // leaf, PUT without a HEAD first: the same bytes again are
            // harmless).
            remote.put_object(Space::Objects, &stat_id, Bytes::from(stat_bytes.clone())).await?;
            report.upload.objects_uploaded = 1;
            report.upload.bytes_uploaded = stat_bytes.len() as u64;
            failpoint("checkpoint-after-objects");
        } else {
            // With a parent's index, what changed goes up as packs over
            // it; without one (a snapshot imported `--no-packs`, or a
            // store from before packs-first), the whole tree is packed and
            // indexed now, so that later checkpoints and reads are
            // packs-first. Objects alone as well, as this did until a
            // review found it, put every new object up twice (an 8 MB
            // file: 16.8 MB up, 8.4 MB reported).
            let check = match base {
                Some(_) => crate::publish::IndexCheck::Concurrent,
                None => crate::publish::IndexCheck::KnownAbsent,
            };
            let stat = async {
                remote.put_object(Space::Objects, &stat_id, Bytes::from(stat_bytes.clone())).await?;
                failpoint("checkpoint-after-objects");
                Ok::<_, Error>(())
            };
            let packs = crate::publish::publish_packs(
                remote,
                &cache,
                *walked.root,
                pack_opts(base, true, check),
                Some(fetcher.clone()),
            );
            let (stat, p) = futures::join!(stat, packs);
            stat?;
            let p = p?;
            // An index found in the store names its own layers (a reader
            // with no hint reads them in one more round trip).
            layers = p.index.as_ref().map(|i| i.base.clone()).unwrap_or_default();
            report.index_bytes = p.index_bytes;
            report.index_layers = p.index_layers;
            report.upload.objects_uploaded = 1 + p.loose_uploaded;
            report.upload.bytes_uploaded = stat_bytes.len() as u64 + p.bytes_uploaded;
            report.packs_uploaded = p.packs_uploaded;
        }
        failpoint("checkpoint-after-packs");
        Ok::<_, Error>(())
    };
    tracing::debug!(ms = t0.elapsed().as_millis() as u64, "checkpoint: stat layer placed");
    let (uploaded, snapshot) = futures::join!(uploads, snapshot);
    tracing::debug!(ms = t0.elapsed().as_millis() as u64, "checkpoint: uploaded");
    uploaded?;
    snapshot?;
    crate::failpoint::pause("checkpoint-before-ref");
    let mut intent = st.clone();
    intent.pending = Some(sid.to_hex());
    save_state_at(state_at, &intent)?;
    remote.cas_ref(&refname, Some(&ver), RefValue { snapshot: sid, root: walked.root, layers }).await.map_err(|e| {
        match e {
            // Two checkpoints of one copy at once: the other won.
            Error::RefMoved { found, .. } => Error::User(format!(
                "another checkpoint of workspace {} finished first (it is now at {})",
                st.name,
                crate::hash::short_hex(&found)
            ))
            .then(Next::CheckpointAgain),
            e => e,
        }
    })?;
    failpoint("checkpoint-after-ref");
    report.snapshot = sid.to_hex();
    report.upload.snapshots_uploaded = 1;
    Ok((report, walked, stat_id))
}

/// What walking a working copy produced.
pub(super) struct Walked {
    pub(super) root: TreeId,
    pub(super) stat: WalkedStat,
    pub(super) files_read: u64,
    pub(super) files_unchanged: u64,
    pub(super) trees_built: Option<u64>,
    /// The plain directory's new stat cache.
    pub(super) statcache: Option<StatCache>,
    /// Paths the ignore rules left out.
    pub(super) ignored: u64,
}
