//! Finding a tree's pack index (the local pointer in the cache, else the
//! derived pointer in the store) and attaching it: members by id, inline
//! trees, and why no index could be attached.

use super::*;

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
        dirs: u64,
        packs: usize,
        members: usize,
        via: Discovery,
    },
    /// No index was ever built for this tree.
    NoIndex,
    /// The index found names another tree.
    OtherTree {
        found: String,
    },
    /// The index does not decode.
    Undecodable {
        detail: String,
    },
    /// The index is there but its packs were deleted (`mado gc`).
    Swept {
        missing: usize,
        packs: usize,
    },
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

    /// HEADs every attached pack (one round trip); those missing are marked
    /// bad, so reads go per object without trying them. Returns (missing, total).
    pub async fn check_packs(&self) -> Result<(usize, usize)> {
        let packs: Vec<Hash> = {
            let set = self.packs.read().expect("packs lock");
            let mut v: Vec<Hash> = set.members.values().map(|(p, _)| p.id).collect();
            v.sort();
            v.dedup();
            v
        };
        let heads = packs.iter().map(|id| async move {
            let present = self.remote.has_pack(id).await?;
            Ok::<_, Error>((!present).then_some(*id))
        });
        let mut missing = 0;
        for r in futures::future::join_all(heads).await {
            if let Some(id) = r? {
                missing += 1;
                self.bad_packs.lock().expect("bad packs lock").insert(id);
            }
        }
        Ok((missing, packs.len()))
    }

    /// A tree that came inline with an attached index, if any.
    pub fn inline_tree(&self, id: &Hash) -> Option<Arc<Vec<u8>>> {
        self.packs.read().expect("packs lock").trees.get(id).cloned()
    }

    /// Finds and attaches the pack index of `tree`: the local pointer
    /// first, else the derived pointer in the store (one GET), which is
    /// then kept as the local pointer.
    pub async fn attach(&self, tree: Hash) -> Result<Attach> {
        Ok(match self.locate(tree).await? {
            Ok((idx, via)) => self.install(idx, via),
            Err(reason) => reason,
        })
    }

    /// Finds the index of `tree` without attaching it (the local pointer,
    /// else the derived one); `Err` holds why there is none.
    pub async fn locate(&self, tree: Hash) -> Result<std::result::Result<(PackIndex, Discovery), Attach>> {
        let local = self.local_pointer(&tree);
        if let Ok(bytes) = std::fs::read(&local) {
            if let Ok(idx) = PackIndex::decode(&bytes) {
                if idx.tree == tree {
                    return Ok(Ok((idx, Discovery::LocalPointer)));
                }
            }
            // A bad local copy: drop it and ask the store.
            let _ = std::fs::remove_file(&local);
        }
        let Some(bytes) = self.remote.get_index(&tree).await? else {
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

    fn install(&self, idx: PackIndex, via: Discovery) -> Attach {
        let mut set = self.packs.write().expect("packs lock");
        let status = Attach::Attached {
            mode: idx.mode.label().to_string(),
            version: crate::pack::PACK_VERSION,
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
