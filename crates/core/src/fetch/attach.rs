//! Finding a tree's pack index (the local pointer in the cache, else the
//! derived pointer in the store) and attaching it: members by id, inline
//! trees, and why no index could be attached.

use super::Fetcher;
use crate::cache::DiskCache;
use crate::error::Result;
use crate::hash::Hash;
use crate::pack::flat::FlatIndex;
use crate::pack::{PackEntry, PackIndex};
use crate::store::Remote;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// How the index of an attached tree was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Discovery {
    /// The local pointer (a copy of the index in the disk cache).
    LocalPointer,
    /// The derived pointer in the store (`packs/index/<tree id>`).
    DerivedPointer,
}

/// The result of looking for a tree's pack index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Attach {
    Attached {
        mode: String,
        version: u8,
        /// Index layers merged (1: a whole index).
        layers: usize,
        dirs: u64,
        packs: usize,
        members: usize,
        via: Discovery,
    },
    /// No index was ever built for this tree.
    NoIndex,
    /// The index found names another tree.
    OtherTree { found: String },
    /// The index does not decode.
    Undecodable { detail: String },
    /// The index is there but its packs were deleted (`mado gc`).
    Swept { missing: usize, packs: usize },
}

/// The attached index layers, read in place ([`FlatIndex`]), with the
/// packs lately read out of them.
#[derive(Default)]
pub(super) struct PackSet {
    layers: Vec<Arc<FlatIndex>>,
    /// Packs by (layer's tree, number in it) a lookup built, up to
    /// [`RECENT_MEMBERS`] members in all: a walk through a pack does not
    /// build its table again for each member.
    recent: Mutex<HashMap<(Hash, usize), Arc<PackEntry>>>,
}

/// Members of the packs [`PackSet`] keeps built, at most: 16 full packs
/// (a table of 262,144 members is 16 MiB; a million, kept before, held
/// 64 MiB in a mount daemon after a stat walk of a million files). Any
/// number stay alive while a reader holds them.
const RECENT_MEMBERS: usize = 1 << 18;

impl PackSet {
    /// The pack holding member `id`, and where in it.
    pub(super) fn member(&self, id: &Hash) -> Option<(Arc<PackEntry>, usize)> {
        self.layers.iter().find_map(|l| {
            let (p, i) = l.member(id)?;
            Some((self.pack(l, p)?, i))
        })
    }

    /// The id of the pack holding member `id`, its table not built (a
    /// question asked per file, of packs of 16,384 members).
    pub(super) fn pack_id_of(&self, id: &Hash) -> Option<Hash> {
        self.layers.iter().find_map(|l| l.pack_id(l.member(id)?.0))
    }

    /// [`PackSet::member`] of each of `ids` (those in no attached pack
    /// left out), each pack's table built once however the ids are
    /// ordered: a caller asking for a whole tree's members in hash order
    /// would otherwise build every pack's table again and again.
    pub(super) fn members<'a>(&self, ids: impl Iterator<Item = &'a Hash>) -> Vec<(Arc<PackEntry>, usize)> {
        let mut by_pack: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
        for id in ids {
            if let Some((l, (p, i))) = self.layers.iter().enumerate().find_map(|(n, l)| Some((n, l.member(id)?))) {
                by_pack.entry((l, p)).or_default().push(i);
            }
        }
        let mut out = Vec::new();
        for ((l, p), places) in by_pack {
            if let Some(pack) = self.pack(&self.layers[l], p) {
                out.extend(places.into_iter().map(|i| (pack.clone(), i)));
            }
        }
        out
    }

    /// Pack `p` of layer `l`, built from its rows (or kept from before);
    /// `None`, with a warning, when its rows are damaged.
    fn pack(&self, l: &FlatIndex, p: usize) -> Option<Arc<PackEntry>> {
        let key = (l.tree(), p);
        if let Some(pack) = self.recent.lock().expect("recent packs lock").get(&key) {
            return Some(pack.clone());
        }
        let pack = match l.pack(p) {
            Ok(pack) => Arc::new(pack),
            Err(why) => {
                tracing::warn!("pack index layer {} is damaged ({why}): reading without it", l.tree().short());
                return None;
            }
        };
        let mut recent = self.recent.lock().expect("recent packs lock");
        let held: usize = recent.values().map(|p| p.members.len()).sum();
        if held + pack.members.len() > RECENT_MEMBERS {
            recent.clear();
        }
        recent.insert(key, pack.clone());
        Some(pack)
    }

    /// Summed over the attached layers: see [`FlatIndex::file_shape`].
    pub(super) fn file_shape(&self) -> Option<(u64, u64)> {
        (!self.layers.is_empty())
            .then(|| self.layers.iter().map(|l| l.file_shape()).fold((0, 0), |(a, b), (c, d)| (a + c, b + d)))
    }

    /// Whether an attached layer lists `id` inline (not verified).
    pub(super) fn has_inline(&self, id: &Hash) -> bool {
        self.layers.iter().any(|l| l.has_inline(id))
    }

    /// An object that came inline with an attached layer (a tree, or a
    /// chunked file's manifest).
    pub(super) fn inline(&self, id: &Hash) -> Option<Vec<u8>> {
        self.layers.iter().find_map(|l| l.inline(id).map(<[u8]>::to_vec))
    }
}

impl Fetcher {
    /// The local pointer: where a copy of `tree`'s index is kept.
    pub fn local_pointer(&self, tree: &Hash) -> PathBuf {
        self.cache.index_path(tree)
    }

    /// Chunked files' manifests and whole small files the attached
    /// indexes list; `None` when no index is attached.
    pub fn file_shape(&self) -> Option<(u64, u64)> {
        self.packs.read().expect("packs lock").file_shape()
    }

    /// Object `id` when it can be had without the network: inline in an
    /// attached index, or in the disk cache (verified either way).
    pub fn local(&self, id: &Hash) -> Option<Vec<u8>> {
        self.inline_tree(id).or_else(|| self.cached(id))
    }

    /// Drops the pack tables kept for reuse (the attached index's and the
    /// cache's): after the kernel forgot most of a mount's inodes, a walk
    /// that built them is over. Each is built again from its local file
    /// when next needed.
    pub fn shed(&self) {
        self.packs.read().expect("packs lock").recent.lock().expect("recent packs lock").clear();
        self.cache.shed();
    }

    /// Whether [`Fetcher::local`] would find `id` (not read or verified).
    pub fn is_local(&self, id: &Hash) -> bool {
        self.packs.read().expect("packs lock").has_inline(id) || self.is_cached(id)
    }

    /// A tree (or manifest) that came inline with an attached index, if any.
    pub fn inline_tree(&self, id: &Hash) -> Option<Vec<u8>> {
        self.packs.read().expect("packs lock").inline(id)
    }

    /// Finds and attaches the pack index of `tree`: the local pointer
    /// first, else the derived pointer in the store (one GET), which is
    /// then kept as the local pointer.
    pub async fn attach(&self, tree: Hash) -> Result<Attach> {
        self.attach_hinted(tree, &[]).await
    }

    /// Finds the index of `tree` without attaching it (the local pointer,
    /// else the derived one); `Err` holds why there is none.
    pub async fn locate(&self, tree: Hash) -> Result<std::result::Result<(PackIndex, Discovery), Attach>> {
        load_index(&self.remote, &self.cache, tree, &[]).await
    }

    /// Attaches `tree`'s index, fetching the layers `hint` names (from the
    /// ref) together with it.
    pub async fn attach_hinted(&self, tree: Hash, hint: &[Hash]) -> Result<Attach> {
        Ok(match load_flat_layers(&self.remote, &self.cache, tree, hint).await? {
            Ok((layers, via)) => self.install(layers, via),
            Err(Attach::NoIndex) => Attach::NoIndex,
            Err(reason) => {
                self.index_failures.lock().expect("index failures lock").push((tree, reason.describe()));
                reason
            }
        })
    }

    fn install(&self, layers: Vec<Arc<FlatIndex>>, via: Discovery) -> Attach {
        let status = Attach::Attached {
            mode: layers[0].mode().label().to_string(),
            version: crate::pack::PACK_VERSION,
            layers: layers.len(),
            dirs: layers[0].dirs(),
            packs: layers.iter().map(|l| l.pack_count()).sum(),
            members: layers.iter().map(|l| l.member_count()).sum(),
            via,
        };
        let mut set = self.packs.write().expect("packs lock");
        for l in layers {
            if !set.layers.iter().any(|have| have.tree() == l.tree()) {
                set.layers.push(l);
            }
        }
        status
    }
}

type Located = std::result::Result<(PackIndex, Discovery), Attach>;

/// Tree `tree`'s pack index as a reader sees it: the local pointer, else
/// the derived pointer in the store; a layered index is merged with every
/// layer below it ([`load_index_layers`]). A missing or wrong layer is a
/// reason not to attach (reads then go object by object), never a wrong
/// answer.
pub async fn load_index(remote: &Remote, cache: &DiskCache, tree: Hash, hint: &[Hash]) -> Result<Located> {
    Ok(load_index_layers(remote, cache, tree, hint).await?.and_then(|(mut layers, via)| {
        let lower = layers.split_off(1);
        let top = layers.pop().expect("the top layer");
        top.merge(lower).map(|idx| (idx, via)).map_err(|detail| Attach::Undecodable { detail })
    }))
}

/// Tree `tree`'s index layers as stored, not merged: the top first, then
/// every layer it names (one for a whole index); each from its local copy,
/// else the store, with its delta trees rebuilt. The layers `hint` names
/// (the ref carries them) are fetched in the same round trip as the top; a
/// layer the top names that the hint did not costs one more.
pub async fn load_index_layers(
    remote: &Remote,
    cache: &DiskCache,
    tree: Hash,
    hint: &[Hash],
) -> Result<std::result::Result<(Vec<PackIndex>, Discovery), Attach>> {
    let got = layer_chain(tree, hint, |t| one_layer(remote, cache, t), |l: &PackIndex| &l.base).await?;
    let got = got.and_then(|(mut layers, via)| match crate::pack::delta::resolve_chain(&mut layers) {
        Ok(()) => Ok((layers, via)),
        Err(detail) => Err(Attach::Undecodable { detail }),
    });
    Ok(forget_if_undecodable(cache, &tree, got))
}

/// A chain that does not hold together: the top's local copies (its
/// index and flat files) go with the failure, as a top that names a layer
/// the store lacks may be a copy of a damaged index the store has had
/// repaired since; the next load asks the store again (one GET).
fn forget_if_undecodable<T>(
    cache: &DiskCache,
    tree: &Hash,
    got: std::result::Result<T, Attach>,
) -> std::result::Result<T, Attach> {
    if let Err(Attach::Undecodable { .. }) = &got {
        let _ = std::fs::remove_file(cache.index_path(tree));
        let _ = std::fs::remove_file(cache.flat_index_path(tree));
    }
    got
}

/// Tree `tree`'s index layers, the top first, then every layer it names
/// (`below` reads a layer's list), each got by `one`: the layers `hint`
/// names in the top's round trip, any other it names in one more. A layer
/// below that cannot be had, or that names another chain below it than
/// the top says, is why there is no index.
async fn layer_chain<L, F, Fut>(
    tree: Hash,
    hint: &[Hash],
    one: F,
    below: impl Fn(&L) -> &[Hash],
) -> Result<std::result::Result<(Vec<L>, Discovery), Attach>>
where
    F: Fn(Hash) -> Fut,
    Fut: std::future::Future<Output = Result<std::result::Result<(L, Discovery), Attach>>>,
{
    let mut want = vec![tree];
    want.extend(hint.iter().copied().filter(|h| *h != tree).take(crate::pack::MAX_INDEX_LAYERS * 4));
    let mut got = HashMap::new();
    for (t, r) in want.iter().zip(futures::future::join_all(want.iter().map(|t| one(*t))).await) {
        got.insert(*t, r?);
    }
    let (top, via) = match got.remove(&tree).expect("the top was asked for") {
        Ok(x) => x,
        Err(reason) => return Ok(Err(reason)),
    };
    let base = below(&top).to_vec();
    let missing: Vec<Hash> = base.iter().copied().filter(|b| !got.contains_key(b)).collect();
    for (t, r) in missing.iter().zip(futures::future::join_all(missing.iter().map(|t| one(*t))).await) {
        got.insert(*t, r?);
    }
    let mut layers = vec![top];
    for (i, b) in base.iter().enumerate() {
        let layer = match got.remove(b) {
            Some(Ok((l, _))) => l,
            Some(Err(reason)) => {
                // The whole id: a damaged reference may share its first
                // characters with a layer that is there.
                let detail = format!("index layer {} named below {}: {}", b.to_hex(), tree.short(), reason.describe());
                return Ok(Err(Attach::Undecodable { detail }));
            }
            None => unreachable!("every layer below was asked for"),
        };
        if below(&layer) != &base[i + 1..] {
            let detail = format!("layer {} is not the one named", b.short());
            return Ok(Err(Attach::Undecodable { detail }));
        }
        layers.push(layer);
    }
    Ok(Ok((layers, via)))
}

/// One index layer, the local pointer first.
async fn one_layer(remote: &Remote, cache: &DiskCache, tree: Hash) -> Result<Located> {
    let local = cache.index_path(&tree);
    if let Ok(bytes) = std::fs::read(&local) {
        if let Ok(idx) = PackIndex::decode(&bytes) {
            if idx.tree == tree {
                return Ok(Ok((idx, Discovery::LocalPointer)));
            }
        }
        // A bad local copy: drop it and ask the store.
        let _ = std::fs::remove_file(&local);
    }
    let Some(bytes) = remote.get_index(&tree).await? else {
        return Ok(Err(Attach::NoIndex));
    };
    let idx = match PackIndex::decode(&bytes) {
        Ok(i) => i,
        Err(e) => return Ok(Err(Attach::Undecodable { detail: e.to_string() })),
    };
    if idx.tree != tree {
        return Ok(Err(Attach::OtherTree { found: idx.tree.to_hex() }));
    }
    crate::fsutil::save_cache_file(&local, &bytes);
    Ok(Ok((idx, Discovery::DerivedPointer)))
}

/// A layer on its way to its flat form: flat already, or decoded with
/// tree deltas that need the layers below it first.
enum Layer {
    Flat(Arc<FlatIndex>),
    Pending(PackIndex),
}

impl Layer {
    fn base(&self) -> &[Hash] {
        match self {
            Layer::Flat(f) => f.base(),
            Layer::Pending(idx) => &idx.base,
        }
    }
}

type FlatLayer = std::result::Result<(Layer, Discovery), Attach>;

/// Tree `tree`'s index layers, flat (the top first, then every layer it
/// names, checked to be the chain named): each from its flat file in the
/// cache, else made from the index (its local copy, else the store) and
/// kept there ([`layer_chain`]); nothing is merged or held decoded.
pub async fn load_flat_layers(
    remote: &Remote,
    cache: &DiskCache,
    tree: Hash,
    hint: &[Hash],
) -> Result<std::result::Result<(Vec<Arc<FlatIndex>>, Discovery), Attach>> {
    let (layers, via) = match layer_chain(tree, hint, |t| one_flat(remote, cache, t), Layer::base).await? {
        Ok(x) => x,
        Err(reason) => return Ok(forget_if_undecodable(cache, &tree, Err(reason))),
    };
    // The bottom up: a layer's delta trees are rebuilt from the flat
    // layers below it, then it is made flat in turn.
    let mut flats: Vec<Arc<FlatIndex>> = Vec::with_capacity(layers.len());
    for layer in layers.into_iter().rev() {
        let flat = match layer {
            Layer::Flat(f) => f,
            Layer::Pending(mut idx) => {
                let below = |id: &Hash| flats.iter().find_map(|f| f.inline(id)).map(std::borrow::Cow::Borrowed);
                if let Err(detail) = idx.resolve_deltas(&below) {
                    return Ok(forget_if_undecodable(cache, &tree, Err(Attach::Undecodable { detail })));
                }
                flat_of(cache, idx)?
            }
        };
        flats.push(flat);
    }
    flats.reverse();
    Ok(Ok((flats, via)))
}

/// Keeps the flat form of index layer `layer` (as stored: not a merged
/// view) in the cache, so that the first attach of it reads it in place.
/// A writer that just made the layer calls it; failing is harmless.
pub fn keep_flat(cache: &DiskCache, layer: &PackIndex) {
    let path = cache.flat_index_path(&layer.tree);
    let _ = crate::fsutil::replace_cache_file_with(&path, |w| crate::pack::flat::encode_to(layer, w));
}

/// One index layer, flat: its flat file in the cache, else one made now
/// from the index ([`one_layer`]) and saved for every later attach.
async fn one_flat(remote: &Remote, cache: &DiskCache, tree: Hash) -> Result<FlatLayer> {
    let path = cache.flat_index_path(&tree);
    match FlatIndex::open(&path) {
        Ok(Some(f)) if f.tree() == tree => return Ok(Ok((Layer::Flat(Arc::new(f)), Discovery::LocalPointer))),
        Ok(None) => {}
        // Unsound, or of another tree: made again below.
        _ => {
            let _ = std::fs::remove_file(&path);
        }
    }
    let (idx, via) = match one_layer(remote, cache, tree).await? {
        Ok(x) => x,
        Err(reason) => return Ok(Err(reason)),
    };
    if !idx.deltas.is_empty() {
        return Ok(Ok((Layer::Pending(idx), via)));
    }
    Ok(Ok((Layer::Flat(flat_of(cache, idx)?), via)))
}

/// Layer `idx` (its trees whole) made flat and kept in the cache.
fn flat_of(cache: &DiskCache, idx: PackIndex) -> Result<Arc<FlatIndex>> {
    keep_flat(cache, &idx);
    let flat = match FlatIndex::open(&cache.flat_index_path(&idx.tree)).ok().flatten() {
        Some(f) if f.tree() == idx.tree => f,
        // A cache that cannot take the file: the same tables, in memory.
        _ => FlatIndex::from_bytes(crate::pack::flat::encode(&idx))
            .map_err(|e| crate::Error::Internal(format!("a flat index just made does not read: {e}")))?,
    };
    Ok(Arc::new(flat))
}

/// For people (`--verbose`): what was attached, or why not.
impl std::fmt::Display for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attach::Attached { mode, version, layers, dirs, packs, members, via } => {
                let via = match via {
                    Discovery::LocalPointer => "the local copy",
                    Discovery::DerivedPointer => "the store",
                };
                let n = |k: usize, one: &str, many: &str| format!("{k} {}", if k == 1 { one } else { many });
                write!(
                    f,
                    "attached a {mode} index (pack v{version}, {}, {}, {}, {}) from {via}",
                    n(*layers, "layer", "layers"),
                    n(*dirs as usize, "directory", "directories"),
                    n(*packs, "pack", "packs"),
                    n(*members, "member", "members"),
                )
            }
            Attach::NoIndex => f.write_str("none: this tree has no pack index (reads go object by object)"),
            other => write!(f, "none: the index is {} (reads go object by object)", other.describe()),
        }
    }
}

impl Attach {
    /// A short reason, for messages.
    pub fn describe(&self) -> String {
        match self {
            Attach::Attached { .. } => "attached".into(),
            Attach::NoIndex => "missing".into(),
            Attach::OtherTree { found } => format!("names tree {found}"),
            Attach::Undecodable { detail } => format!("undecodable ({detail})"),
            Attach::Swept { missing, packs } => format!("{missing} of {packs} packs swept"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FlatIndex, PackSet};
    use crate::hash::Hash;
    use crate::pack::{build_pack, flat, MemberKind, Mode, PackIndex};
    use std::sync::Arc;

    /// Packs read out of a layer are kept built: a walk through two packs,
    /// back and forth, builds each table once.
    #[test]
    fn packs_lately_read_are_kept_built() {
        let blobs: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 10 + i as usize]).collect();
        let pack = |bs: &[Vec<u8>]| {
            let rows: Vec<(Hash, MemberKind, &[u8])> =
                bs.iter().map(|b| (Hash::of(b), MemberKind::Blob, &b[..])).collect();
            build_pack(&rows).1
        };
        let idx = PackIndex {
            tree: Hash([5; 32]),
            mode: Mode::Recursive,
            dirs: 1,
            packs: vec![pack(&blobs[..4]), pack(&blobs[4..])],
            trees: Vec::new(),
            base: Vec::new(),
            deltas: Vec::new(),
        };
        let layer = Arc::new(FlatIndex::from_bytes(flat::encode(&idx)).unwrap());
        let set = PackSet { layers: vec![layer], recent: Default::default() };
        let (first, i) = set.member(&Hash::of(&blobs[1])).unwrap();
        assert_eq!((first.id, i), (idx.packs[0].id, 1));
        let (second, j) = set.member(&Hash::of(&blobs[6])).unwrap();
        assert_eq!((second.id, j), (idx.packs[1].id, 2));
        let (again, _) = set.member(&Hash::of(&blobs[2])).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the first pack's table was built again");
        let (again, _) = set.member(&Hash::of(&blobs[7])).unwrap();
        assert!(Arc::ptr_eq(&second, &again), "the second pack's table was built again");
        assert_eq!(set.pack_id_of(&Hash::of(&blobs[5])), Some(idx.packs[1].id));
        assert!(set.member(&Hash::of(b"in no pack")).is_none());
    }
}
