//! Finding a tree's pack index (the local pointer in the cache, else the
//! derived pointer in the store) and attaching it: members by id, inline
//! trees, and why no index could be attached.

use super::Fetcher;
use crate::cache::DiskCache;
use crate::error::Result;
use crate::hash::Hash;
use crate::pack::{PackEntry, PackIndex};
use crate::store::Remote;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

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

#[derive(Default)]
pub(super) struct PackSet {
    /// Member id -> (pack, index of the member in it).
    pub(super) members: HashMap<Hash, (Arc<PackEntry>, usize)>,
    pub(super) trees: HashMap<Hash, Arc<Vec<u8>>>,
}

impl Fetcher {
    /// The local pointer: where a copy of `tree`'s index is kept.
    pub fn local_pointer(&self, tree: &Hash) -> PathBuf {
        self.cache.index_path(tree)
    }

    /// A tree that came inline with an attached index, if any.
    pub fn inline_tree(&self, id: &Hash) -> Option<Arc<Vec<u8>>> {
        self.packs.read().expect("packs lock").trees.get(id).cloned()
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
        Ok(match load_index(&self.remote, &self.cache, tree, hint).await? {
            Ok((idx, via)) => self.install(idx, via),
            Err(Attach::NoIndex) => Attach::NoIndex,
            Err(reason) => {
                self.index_failures.lock().expect("index failures lock").push((tree, reason.describe()));
                reason
            }
        })
    }

    fn install(&self, idx: PackIndex, via: Discovery) -> Attach {
        let mut set = self.packs.write().expect("packs lock");
        let status = Attach::Attached {
            mode: idx.mode.label().to_string(),
            version: crate::pack::PACK_VERSION,
            layers: 1 + idx.base.len(),
            dirs: idx.dirs,
            packs: idx.packs.len(),
            members: idx.member_count(),
            via,
        };
        for p in idx.packs {
            let p = Arc::new(p);
            for (i, m) in p.members.iter().enumerate() {
                set.members.entry(m.id).or_insert_with(|| (p.clone(), i));
            }
        }
        for (id, t) in idx.trees {
            set.trees.insert(id, Arc::new(t));
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
/// else the store. The layers `hint` names (the ref carries them) are
/// fetched in the same round trip as the top; a layer the top names that
/// the hint did not costs one more.
pub async fn load_index_layers(
    remote: &Remote,
    cache: &DiskCache,
    tree: Hash,
    hint: &[Hash],
) -> Result<std::result::Result<(Vec<PackIndex>, Discovery), Attach>> {
    let mut want = vec![tree];
    want.extend(hint.iter().copied().filter(|h| *h != tree).take(crate::pack::MAX_INDEX_LAYERS * 4));
    let mut got: HashMap<Hash, Located> = HashMap::new();
    for (t, r) in want.iter().zip(futures::future::join_all(want.iter().map(|t| one_layer(remote, cache, *t))).await) {
        got.insert(*t, r?);
    }
    let (top, via) = match got.remove(&tree).expect("the top was asked for") {
        Ok(x) => x,
        Err(reason) => return Ok(Err(reason)),
    };
    if top.base.is_empty() {
        return Ok(Ok((vec![top], via)));
    }
    let missing: Vec<Hash> = top.base.iter().copied().filter(|b| !got.contains_key(b)).collect();
    for (t, r) in
        missing.iter().zip(futures::future::join_all(missing.iter().map(|t| one_layer(remote, cache, *t))).await)
    {
        got.insert(*t, r?);
    }
    let mut layers = Vec::with_capacity(1 + top.base.len());
    for b in &top.base {
        match got.remove(b) {
            Some(Ok((l, _))) => layers.push(l),
            Some(Err(reason)) => {
                let detail = format!("index layer {} below {}: {}", b.short(), tree.short(), reason.describe());
                return Ok(Err(Attach::Undecodable { detail }));
            }
            None => unreachable!("every layer below was asked for"),
        }
    }
    layers.insert(0, top);
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
