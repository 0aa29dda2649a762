//! Building and publishing a tree's packs: the builder runs on a blocking
//! thread and hands each finished pack through a small channel to an async
//! uploader, so at most a few packs are in memory and uploads overlap
//! building. Packs go up before the index that names them (the closure
//! rule), the index goes to its derived key, and a copy becomes the local
//! pointer.
//!
//! Idempotent: packs are content-addressed and the build is deterministic,
//! so an unchanged tree produces the same pack ids; each is HEADed and
//! uploaded only if missing, and the index is compared before it is written.
//! A checkpoint's index goes up beside its packs instead ([`IndexCheck::Concurrent`]).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;

use serde::Serialize;

use crate::cache::DiskCache;
use crate::error::{Error, Next, Result};
use crate::fsutil::save_cache_file;
use crate::hash::Hash;
use crate::pack::{build, MemberKind, Mode};
use crate::store::{Remote, Space};

#[derive(Clone, Debug)]
pub struct PackOptions {
    pub mode: Mode,
    pub cap: u64,
    pub index_check: IndexCheck,
    /// Build on top of this index (a checkpoint's parent): only new
    /// members are packed and uploaded.
    pub base: Option<std::sync::Arc<crate::pack::PackIndex>>,
    /// The base's layers as stored (its top first), when the caller has
    /// them already; else they are read from the local copies its load left.
    pub layers: Option<std::sync::Arc<Vec<crate::pack::PackIndex>>>,
    /// Packs are how this content goes up (not a cache of objects stored
    /// alone): new packs are PUT without a HEAD (they hold only new
    /// members), and objects too large for any pack go up alone.
    pub primary: bool,
    /// Build on top of this base, read in place (a checkpoint's parent;
    /// `base` and `layers` are then not used): the build costs what changed
    /// since its bottom layer. A change too large for a layer merges it.
    pub flat: Option<Arc<crate::pack::FlatBase>>,
}

/// How to decide whether the index must be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexCheck {
    /// Read the published index and compare bytes (one GET).
    Compare,
    /// The caller knows none is published, or that the one published names
    /// what the store lacks (import checked): written after the packs.
    KnownAbsent,
    /// The caller's ref is the only way to the index, and it moves after
    /// this returns: the index goes up alongside the packs with a
    /// conditional PUT (no round trip of its own, none waiting on the
    /// packs). An index found there (another workspace made the same
    /// edits, or a writer stopped between its index and its packs) is
    /// kept when everything it names is in the store, replaced when not.
    Concurrent,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PackReport {
    pub tree: String,
    pub mode: String,
    pub packs: usize,
    pub members: usize,
    /// Objects too large for any pack, fetched alone.
    pub unpacked_objects: u64,
    pub dirs: u64,
    pub packs_uploaded: u64,
    pub bytes_uploaded: u64,
    /// Objects too large for a pack, uploaded alone (packs-first only).
    pub loose_uploaded: u64,
    pub index_uploaded: bool,
    /// The tree was indexed in the store already, soundly
    /// (IndexCheck::Concurrent): that index stays, and the packs that went
    /// up meanwhile are garbage for gc.
    pub index_existed: bool,
    pub index_bytes: u64,
    /// Layers a reader merges for this tree's index (1: a whole index).
    pub index_layers: usize,
    pub build_ms: u64,
    /// GETs a cold walk-and-read of the whole tree would make without
    /// packs (every tree and object) and with them (index + packs +
    /// unpacked objects).
    pub model_gets_unpacked: u64,
    pub model_gets_packed: u64,
    /// The index published: the whole view (a next build on top of it
    /// needs no re-read), or for a checkpoint's partial delta build only
    /// the layer (its `base` names the chain below).
    #[serde(skip)]
    pub index: Option<Arc<crate::pack::PackIndex>>,
}

/// Builds `tree`'s packs from objects in the disk cache and publishes them.
///
/// `inline` (the fetcher that brought the tree in, if any) supplies trees
/// that arrived inline with a pack index and so are not in the cache.
pub async fn publish_packs(
    remote: &Remote,
    cache: &Arc<DiskCache>,
    tree: Hash,
    opts: PackOptions,
    inline: Option<Arc<crate::fetch::Fetcher>>,
) -> Result<PackReport> {
    build_and_publish(remote, cache, tree, opts, inline, None).await
}

/// [`publish_packs`] for content an import staged in a spill file
/// ([`crate::upload::Staged::spilling`]): members are read from `staged`
/// first (then the cache), and every pack built is also kept in the disk
/// cache whole, as a fetch of it would have left it, so reads right after
/// the import need no GET.
pub async fn publish_staged_packs(
    remote: &Remote,
    cache: &Arc<DiskCache>,
    tree: Hash,
    opts: PackOptions,
    staged: Arc<crate::upload::Spilled>,
) -> Result<PackReport> {
    build_and_publish(remote, cache, tree, opts, None, Some(staged)).await
}

async fn build_and_publish(
    remote: &Remote,
    cache: &Arc<DiskCache>,
    tree: Hash,
    opts: PackOptions,
    inline: Option<Arc<crate::fetch::Fetcher>>,
    staged: Option<Arc<crate::upload::Spilled>>,
) -> Result<PackReport> {
    if let Some(e) = crate::failpoint::error("publish-packs") {
        return Err(e);
    }
    let started = Instant::now();
    // On top of a base: its chain, layer by layer (local copies, left by
    // the load of the base), so the new layer and pack can absorb the
    // small ones at the top (pack::Absorb).
    // (A whole base has nothing above it to absorb.) An absorbing layer
    // keeps only the trees of its own root: a reader of an older snapshot
    // attaches that snapshot's index (a reopened mount attaches the one
    // its saved state was rebased on: workspace::mounted).
    let parts: Option<Arc<Vec<crate::pack::PackIndex>>> = match (&opts.base, &opts.layers) {
        (Some(b), _) if b.base.is_empty() => None,
        (Some(b), Some(l)) if l.iter().map(|x| x.tree).eq(b.layers()) => Some(l.clone()),
        (Some(b), _) => {
            let got = crate::fetch::load_index_layers(remote, cache, b.tree, &b.base).await?;
            got.ok().map(|(layers, _)| Arc::new(layers)).filter(|l| l.iter().map(|x| x.tree).eq(b.layers()))
        }
        _ => None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Hash, Vec<u8>)>(2);
    let c = cache.clone();
    let delta = opts.base.is_some() || opts.flat.is_some();
    let rt = tokio::runtime::Handle::current();
    let memory = staged.clone();
    let (base, flat) = (opts.base.clone(), opts.flat.clone());
    let builder = tokio::task::spawn_blocking(move || {
        let mut emit = |id, bytes| {
            tx.blocking_send((id, bytes))
                .map_err(|_| Error::Internal("the pack upload stopped before the builder".into()))
        };
        let reader = Reader { cache: c, staged: memory, fetcher: inline, rt };
        if let Some(fb) = &flat {
            // Trees of the layers above the bottom, in memory; the
            // bottom's read in place.
            let above: std::collections::HashMap<Hash, &Vec<u8>> =
                fb.above.iter().flat_map(|l| l.trees.iter()).map(|(id, t)| (*id, t)).collect();
            let trees =
                |id: &Hash| above.get(id).map(|t| (*t).clone()).or_else(|| fb.bottom.inline(id).map(<[u8]>::to_vec));
            let holders = |id: &Hash| {
                let mut out: Vec<crate::pack::PackEntry> = fb
                    .above
                    .iter()
                    .flat_map(|l| l.packs.iter())
                    .filter(|p| p.members.iter().any(|m| m.id == *id))
                    .cloned()
                    .collect();
                if let Some(p) = fb.bottom.member(id).and_then(|(p, _)| fb.bottom.pack(p).ok()) {
                    out.push(p);
                }
                out
            };
            let src = |id: &Hash| reader.read(id, &trees, &holders);
            let built =
                crate::fsutil::on_deep_stack(|| crate::pack::build_delta_flat(tree, opts.cap, fb, &src, &mut emit))?;
            if let Some(b) = built {
                return Ok((b, Chain::Flat(fb.clone())));
            }
        }
        // The whole view: the base as given, or the flat one merged (a
        // change too large for a layer over it).
        let (base, parts) = match (&flat, base) {
            (Some(fb), _) => {
                let mut layers = fb.above.clone();
                layers.push(fb.bottom.to_index().map_err(Error::Internal)?);
                let view = layers[0].clone().merge(layers[1..].to_vec()).map_err(Error::Internal)?;
                let parts = (layers.len() > 1).then(|| Arc::new(layers));
                (Some(Arc::new(view)), parts)
            }
            (None, b) => (b, parts),
        };
        let absorb = chain_of(&base, &parts).map(crate::pack::Absorb::of);
        let base_packs: &[crate::pack::PackEntry] = base.as_ref().map_or(&[], |b| &b.packs[..]);
        // Every pack of the base holding `id`: the cache may hold any of
        // them (built once, when first asked).
        let in_base = std::sync::OnceLock::new();
        let holders = |id: &Hash| {
            let map = in_base.get_or_init(|| {
                let mut m: std::collections::HashMap<Hash, Vec<usize>> = std::collections::HashMap::new();
                for (pi, p) in base_packs.iter().enumerate() {
                    for member in &p.members {
                        m.entry(member.id).or_default().push(pi);
                    }
                }
                m
            });
            map.get(id).into_iter().flatten().map(|pi| base_packs[*pi].clone()).collect()
        };
        // Trees the base carries are read from it, in memory: a delta build
        // walks every tree of the new root, and on a big tree thousands of
        // cache reads (each verified) cost more than the rest of it.
        let base_trees: std::collections::HashMap<Hash, &Vec<u8>> =
            base.iter().flat_map(|b| b.trees.iter()).map(|(id, t)| (*id, t)).collect();
        let trees = |id: &Hash| base_trees.get(id).map(|t| (*t).clone());
        let src = |id: &Hash| reader.read(id, &trees, &holders);
        // Planning recurses once per tree level.
        let built = crate::fsutil::on_deep_stack(|| match &base {
            Some(b) => crate::pack::build_delta(tree, opts.cap, b, absorb.as_ref(), &src, &mut emit),
            None => build(tree, opts.mode, opts.cap, &src, &mut emit),
        })?;
        Ok::<_, Error>((built, Chain::Merged { view: base.clone(), parts }))
    });
    // A checkpoint (IndexCheck::Concurrent) writes its index alongside its
    // packs, as soon as the build has it, with a conditional PUT: no round
    // trip waits for the packs. Nothing reaches the index before the
    // caller's ref moves, and the ref moves only once the packs are up too;
    // an index that was there already is trusted only once what it names
    // is seen in the store ([`reconcile`]), as a writer that crashed
    // between the two PUTs leaves an index whose packs never came. Every
    // other caller writes the index after its packs (the closure rule).
    let concurrent = opts.index_check == IndexCheck::Concurrent;
    let uploads = futures::stream::poll_fn(|cx| rx.poll_recv(cx))
        .map(|(id, bytes)| {
            let bytes = Bytes::from(bytes);
            // Kept whole in the cache, as a fetch would leave it: an
            // import's (reads right after it need no GET) and a delta
            // build's (the next checkpoint may fold its members in).
            let keep = (staged.is_some() || delta).then(|| keep_pack(cache, id, bytes.clone()));
            async move {
                let put = async {
                    if !opts.primary && remote.has_pack(&id).await? {
                        return Ok::<u64, Error>(0);
                    }
                    let n = bytes.len() as u64;
                    remote.put_pack(&id, bytes).await?;
                    Ok(n)
                };
                let keep = async {
                    if let Some(k) = keep {
                        k.await
                    }
                };
                futures::join!(put, keep).0
            }
        })
        .buffer_unordered(4)
        .collect::<Vec<_>>();
    let finish = async {
        let built = builder
            .await
            .map_err(|e| Error::Io { context: "pack builder".into(), source: std::io::Error::other(e) })??;
        let (crate::pack::Built { index, unpacked, loose, placed_at, partial }, chain) = built;
        let (idx, enc) = place_index(remote, cache, &chain, index, (placed_at, partial), staged.is_some()).await?;
        let early = match concurrent {
            true => {
                // Every member of the tree is in a pack the index names, or
                // must be stored alone: those the store lacks go up too.
                let loose = upload_loose(remote, cache, staged.as_deref(), &loose);
                let created = remote.create_index(&tree, enc.clone());
                let (loose, created) = futures::join!(loose, created);
                Some((loose?, created?))
            }
            false => None,
        };
        Ok::<_, Error>((loose, unpacked, idx, enc, early))
    };
    let (uploads, finished) = futures::join!(uploads, finish);
    let mut report = PackReport::default();
    for u in uploads {
        let n = u?;
        if n > 0 {
            report.packs_uploaded += 1;
            report.bytes_uploaded += n;
        }
    }
    let (loose, unpacked, idx, enc, early) = finished?;
    let ((n, bytes), uploaded) = match early {
        Some((loose, true)) => (loose, true),
        Some((loose, false)) => match reconcile(remote, &tree, &enc).await? {
            found @ (Existing::Ours | Existing::Sound { .. }) => {
                // Its packs and the layers below it are in the store, and so
                // is everything stored alone (the same tree leaves the same
                // objects out of packs, and those went up above). Packs that
                // went up meanwhile and no index names are garbage for gc.
                // (The refused PUT carried ours.)
                let sent = enc.len() as u64;
                let (bytes, layer) = match found {
                    Existing::Sound { bytes, layer } => (bytes, layer),
                    _ => (enc, idx),
                };
                save_cache_file(&cache.index_path(&tree), &bytes);
                crate::fetch::keep_flat(cache, &layer);
                report.tree = tree.to_hex();
                report.index_existed = true;
                report.loose_uploaded = loose.0;
                report.bytes_uploaded += loose.1 + sent;
                report.index_layers = 1 + layer.base.len();
                report.index = Some(Arc::new(layer));
                report.build_ms = started.elapsed().as_millis() as u64;
                return Ok(report);
            }
            Existing::Broken => {
                // Left by a writer that never finished: its ref never moved
                // (a ref moves only once its packs are up), so nothing
                // reads it; ours, whose packs are all up now, replaces it.
                remote.put_index(&tree, enc.clone()).await?;
                (loose, true)
            }
        },
        None => {
            // Every member of the tree is now in a pack the index names, or
            // must be stored alone: those the store lacks go up (packs-first
            // content never went up alone; a rebuild may leave out what a
            // pack held). Then the index.
            let loose = upload_loose(remote, cache, staged.as_deref(), &loose).await?;
            let same = if opts.index_check == IndexCheck::Compare {
                remote.get_index(&tree).await?.is_some_and(|b| b[..] == enc[..])
            } else {
                false
            };
            if !same {
                remote.put_index(&tree, enc.clone()).await?;
            }
            (loose, !same)
        }
    };
    report.loose_uploaded = n;
    report.bytes_uploaded += bytes;
    if uploaded {
        report.index_uploaded = true;
        report.bytes_uploaded += enc.len() as u64;
    }
    save_cache_file(&cache.index_path(&tree), &enc);
    crate::fetch::keep_flat(cache, &idx);
    let members = idx.member_count();
    report.tree = tree.to_hex();
    report.mode = idx.mode.label().to_string();
    report.packs = idx.packs.len();
    report.members = members;
    report.unpacked_objects = unpacked;
    report.dirs = idx.dirs;
    report.index_bytes = enc.len() as u64;
    report.index_layers = 1 + idx.base.len();
    report.build_ms = started.elapsed().as_millis() as u64;
    report.model_gets_unpacked = idx.trees.len() as u64 + members as u64 + unpacked;
    report.model_gets_packed = 1 + idx.packs.len() as u64 + unpacked;
    report.index = Some(Arc::new(idx));
    Ok(report)
}

/// What a build was placed over: a merged view (with its layers as
/// stored, when it has more than one), or a flat base.
enum Chain {
    Merged { view: Option<Arc<crate::pack::PackIndex>>, parts: Option<Arc<Vec<crate::pack::PackIndex>>> },
    Flat(Arc<crate::pack::FlatBase>),
}

/// A merged base's chain as stored: its layers, or a whole base alone
/// (nothing to absorb then, but a delta build still walks only what
/// changed).
fn chain_of<'a>(
    view: &'a Option<Arc<crate::pack::PackIndex>>,
    parts: &'a Option<Arc<Vec<crate::pack::PackIndex>>>,
) -> Option<&'a [crate::pack::PackIndex]> {
    match (parts, view) {
        (Some(p), _) => Some(&p[..]),
        (None, Some(b)) if b.base.is_empty() => Some(std::slice::from_ref(&**b)),
        _ => None,
    }
}

/// Reads what a build packs: an import's staged content, the base's
/// trees, the disk cache (or the fetcher's view of it), the cache's copy
/// of a base pack holding it, and last the store.
struct Reader {
    cache: Arc<DiskCache>,
    staged: Option<Arc<crate::upload::Spilled>>,
    fetcher: Option<Arc<crate::fetch::Fetcher>>,
    rt: tokio::runtime::Handle,
}

impl Reader {
    fn read(
        &self,
        id: &Hash,
        trees: &dyn Fn(&Hash) -> Option<Vec<u8>>,
        holders: &dyn Fn(&Hash) -> Vec<crate::pack::PackEntry>,
    ) -> Result<Vec<u8>> {
        if let Some(b) = self.staged.as_ref().map(|m| m.get(id)).transpose()?.flatten() {
            return Ok(b);
        }
        if let Some(t) = trees(id) {
            return Ok(t);
        }
        let local = match &self.fetcher {
            Some(f) => f.cached(id).or_else(|| f.inline_tree(id)),
            None => self.cache.get(id),
        };
        if let Some(b) = local {
            return Ok(b);
        }
        // A member to fold in may live only in a pack this machine never
        // fetched or evicted: the cache's copy of a base pack, else the
        // pack through the fetcher (which keeps it, so the pack's other
        // members are then read from the cache). Last, the object alone (a
        // lazy mount may never have read a file the build must re-read).
        let packs = holders(id);
        if let Some(b) = packs.iter().find_map(|p| self.cache.pack_get(&p.id, id)) {
            return Ok(b);
        }
        if let Some(f) = &self.fetcher {
            for p in packs {
                if let Some(b) = self.rt.block_on(f.member_of(Arc::new(p), id)) {
                    return Ok(b.to_vec());
                }
            }
            if let Ok(b) = self.rt.block_on(f.get(crate::store::Space::Objects, *id, "object")) {
                return Ok(b.to_vec());
            }
        }
        Err(Error::User(format!("object {id} is not in the disk cache")).then(Next::Materialize))
    }
}

/// Places a build's index for publishing: over its base's chain as a
/// layer (where the compaction rule says, absorbing the small layers at
/// its top; crate::object::layering), or whole. Returns the index the
/// caller reports (the view for an import, which builds its next commit
/// on it; for a checkpoint's partial build, the layer) and the bytes to
/// publish.
async fn place_index(
    remote: &Remote,
    cache: &DiskCache,
    chain: &Chain,
    mut idx: crate::pack::PackIndex,
    (placed_at, partial): (usize, bool),
    view_wanted: bool,
) -> Result<(crate::pack::PackIndex, Bytes)> {
    let layer = match chain {
        Chain::Merged { view: None, .. } => {
            let enc = Bytes::from(idx.encode());
            return Ok((idx, enc));
        }
        Chain::Flat(fb) => idx.layer_over_flat(fb, placed_at).map_err(Error::Internal)?,
        Chain::Merged { view: view @ Some(base), parts } => {
            let placed = match chain_of(view, parts) {
                Some(chain) => idx.layer_over_at(chain, placed_at, partial.then_some(base.trees.len())).ok(),
                None => None,
            };
            match placed {
                Some(layer) => layer,
                None => {
                    // Without every layer at hand, a full chain is
                    // compacted into one layer over the bottom (whole) index.
                    let layers = base.layers();
                    let bottom = match layers.last() {
                        Some(b) if layers.len() >= crate::pack::MAX_INDEX_LAYERS => {
                            crate::fetch::load_index(remote, cache, *b, &[]).await?.ok().map(|(i, _)| i)
                        }
                        _ => None,
                    };
                    idx.layer_over(bottom.as_ref().unwrap_or(base))
                }
            }
        }
    };
    if partial && layer.base.is_empty() {
        // build_delta walks partially only when the result is a layer.
        return Err(Error::Internal(format!(
            "the delta index of {} holds only part of the tree's trees and cannot be written whole",
            idx.tree
        )));
    }
    idx.base = layer.base.clone();
    // Shared, not copied, by the PUT and the cache's copy (at a million
    // files the index is 70 MB). A layer's big directories go as deltas
    // over the trees below it.
    let enc = Bytes::from(encode_layer(&layer, chain));
    if partial {
        idx = match (chain, view_wanted) {
            (Chain::Merged { view, parts }, true) => match chain_of(view, parts) {
                Some(chain) => layer.merge(chain[placed_at..].to_vec()).map_err(Error::Internal)?,
                None => layer,
            },
            _ => layer,
        };
    }
    Ok((idx, enc))
}

/// Layer `layer` as stored, its new directories written as deltas where
/// that pays ([`crate::pack::delta::choose`]), each over a tree of a layer
/// the chain below it holds.
fn encode_layer(layer: &crate::pack::PackIndex, chain: &Chain) -> Vec<u8> {
    if layer.base.is_empty() || layer.trees.is_empty() {
        return layer.encode();
    }
    let below = |t: &Hash| layer.base.contains(t);
    let (parts, flat): (Vec<&crate::pack::PackIndex>, _) = match chain {
        Chain::Flat(fb) => {
            let bottom = below(&fb.bottom.tree()).then_some(&fb.bottom);
            (fb.above.iter().filter(|l| below(&l.tree)).collect(), bottom)
        }
        Chain::Merged { parts: Some(p), .. } => (p.iter().filter(|l| below(&l.tree)).collect(), None),
        // A view holds every tree of its layers: all of them below.
        Chain::Merged { view: Some(v), parts: None } if v.layers() == layer.base => (vec![&**v], None),
        Chain::Merged { .. } => (Vec::new(), None),
    };
    let trees: std::collections::HashMap<Hash, &[u8]> =
        parts.iter().flat_map(|l| l.trees.iter()).map(|(id, t)| (*id, &t[..])).collect();
    let lookup = |id: &Hash| {
        trees
            .get(id)
            .map(|t| std::borrow::Cow::Borrowed(*t))
            .or_else(|| flat?.inline(id).map(std::borrow::Cow::Borrowed))
    };
    crate::pack::delta::encode_with(layer, crate::pack::delta::choose(layer, &lookup))
}

/// What a conditional PUT of an index found in its place.
enum Existing {
    /// The same bytes: ours (a retry of a build that was cut off after it).
    Ours,
    /// Another index of the tree whose packs and lower layers are all in
    /// the store: a reader of it finds everything.
    Sound { bytes: Bytes, layer: crate::pack::PackIndex },
    /// Undecodable, of another tree, or naming a pack or a layer the store
    /// lacks (left by a writer that stopped between its index and its
    /// packs).
    Broken,
}

/// Looks at the index found at tree `tree`'s key: one GET, then one HEAD
/// per pack and lower layer it names, all at once (a GET of each lower
/// layer when it holds tree deltas: they must rebuild from them).
async fn reconcile(remote: &Remote, tree: &Hash, ours: &[u8]) -> Result<Existing> {
    let Some(bytes) = remote.get_index(tree).await? else {
        // Gone since (gc of an unreached index): write ours.
        return Ok(Existing::Broken);
    };
    if bytes[..] == ours[..] {
        return Ok(Existing::Ours);
    }
    let mut layer = match crate::pack::PackIndex::decode(&bytes) {
        Ok(l) if l.tree == *tree => l,
        _ => return Ok(Existing::Broken),
    };
    let packs = layer.packs.iter().map(|p| remote.has_pack(&p.id));
    let deltas = !layer.deltas.is_empty();
    let lower = layer.base.iter().map(|t| async move {
        match deltas {
            true => remote.get_index(t).await,
            false => Ok(remote.has_index(t).await?.then(Bytes::new)),
        }
    });
    let (packs, lower) = futures::join!(futures::future::join_all(packs), futures::future::join_all(lower));
    for present in packs {
        if !present? {
            return Ok(Existing::Broken);
        }
    }
    let mut chain = vec![];
    for (t, got) in layer.base.iter().zip(lower) {
        match (got?, deltas) {
            (None, _) => return Ok(Existing::Broken),
            (Some(_), false) => {}
            (Some(b), true) => match crate::pack::PackIndex::decode(&b) {
                Ok(l) if l.tree == *t => chain.push(l),
                _ => return Ok(Existing::Broken),
            },
        }
    }
    if deltas {
        chain.insert(0, layer);
        if crate::pack::delta::resolve_chain(&mut chain).is_err() {
            return Ok(Existing::Broken);
        }
        layer = chain.swap_remove(0);
    }
    Ok(Existing::Sound { bytes, layer })
}

/// Whether the index at tree `tree`'s key is there and everything it names
/// is in the store (see [`reconcile`]): a writer may trust it instead of
/// publishing the tree again.
pub async fn index_is_sound(remote: &Remote, tree: &Hash) -> Result<bool> {
    Ok(matches!(reconcile(remote, tree, &[]).await?, Existing::Sound { .. }))
}

/// Uploads the objects a build left out of every pack (too large, or not
/// in a dense directory), those the store lacks: one HEAD batch, then chunks and blobs,
/// then manifests (the closure rule). Returns (objects, bytes) uploaded.
async fn upload_loose(
    remote: &Remote,
    cache: &DiskCache,
    staged: Option<&crate::upload::Spilled>,
    loose: &[(Hash, MemberKind)],
) -> Result<(u64, u64)> {
    let ids: Vec<Hash> = loose.iter().map(|(id, _)| *id).collect();
    let have = remote.have_objects(Space::Objects, &ids).await?;
    let missing: Vec<(Hash, MemberKind)> =
        loose.iter().zip(have).filter(|(_, present)| !present).map(|(m, _)| *m).collect();
    let (manifests, leaves): (Vec<_>, Vec<_>) = missing.into_iter().partition(|(_, k)| *k == MemberKind::Manifest);
    let ids = |v: Vec<(Hash, MemberKind)>| v.into_iter().map(|(id, _)| id).collect();
    let absent = |id: &Hash| {
        Error::User(format!("object {id} is neither in the store nor in the disk cache")).then(Next::Materialize)
    };
    crate::upload::put_from_cache(remote, cache, staged, ids(leaves), ids(manifests), &absent).await
}

/// Keeps pack `id` (built here, `bytes` whole) in the disk cache as a fetch
/// of it would: under the pack's lock, its bytes, then the record of every
/// member. Not when the cache holds every member already, in this pack or
/// loose (a large file's chunks, which staging wrote there as they were
/// cut: a second copy would double the cache's share of the file). Best
/// effort: a cache that cannot take it (a full disk warns once) costs a
/// later read its fetch, never the import.
async fn keep_pack(cache: &Arc<DiskCache>, id: Hash, bytes: Bytes) {
    let Ok((_, members)) = crate::pack::decode_pack_header(&bytes) else { return };
    // Without the lock (an unwritable cache) the write below fails too.
    let Ok(_lock) = cache.lock_pack(&id).await else { return };
    let c = cache.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if members.iter().all(|m| c.pack_has(&id, &m.id) || c.contains(&m.id)) {
            return;
        }
        let kept = c.pack_writer(&id).and_then(|w| {
            w.write_at(&c, 0, &bytes)?;
            w.commit(&c, &members)
        });
        if kept.is_err() {
            c.discard_unrecorded(&id);
        }
    })
    .await;
}
