//! Typed reads on top of [`Fetcher::get`]: trees, snapshots, chunk
//! manifests, file content (whole or chunked) and path lookup.

use super::*;

impl Fetcher {
    pub async fn tree(self: &Arc<Self>, id: Hash, path: &str) -> Result<Tree> {
        let inline = self.packs.read().expect("packs lock").trees.get(&id).cloned();
        let b = match inline {
            Some(t) => Bytes::from((*t).clone()),
            None => self.get(Space::Objects, id, "tree").await.map_err(|e| e.at_path(path))?,
        };
        Tree::decode(&b).map_err(|e| Error::corrupt(id, "tree", path, e))
    }

    pub async fn snapshot(self: &Arc<Self>, id: Hash) -> Result<Snapshot> {
        let b = self.get(Space::Snapshots, id, "snapshot").await?;
        Snapshot::decode(&b).map_err(|e| Error::corrupt(id, "snapshot", "", e))
    }

    /// The whole stat object whose top is `id`: the layers below it that
    /// `hint` names (the snapshot lists them) come in the same round trip;
    /// any other layer the top names costs one more.
    pub async fn stat(self: &Arc<Self>, id: Hash, hint: &[Hash]) -> Result<StatObject> {
        let mut want = vec![id];
        want.extend(hint.iter().copied().filter(|h| *h != id).take(crate::object::MAX_STAT_LAYERS * 4));
        // A hinted layer the top does not name is not needed: its error is dropped.
        let mut got: HashMap<Hash, Result<StatObject>> = HashMap::new();
        let fetched = futures::future::join_all(want.iter().map(|h| self.stat_layer(*h))).await;
        got.extend(want.iter().copied().zip(fetched));
        let top = got.remove(&id).expect("the top was asked for")?;
        if top.base.is_empty() {
            return Ok(top);
        }
        let missing: Vec<Hash> = top.base.iter().copied().filter(|b| !got.contains_key(b)).collect();
        let fetched = futures::future::join_all(missing.iter().map(|h| self.stat_layer(*h))).await;
        got.extend(missing.iter().copied().zip(fetched));
        let mut lower = Vec::with_capacity(top.base.len());
        for b in &top.base {
            lower.push((*b, got.remove(b).expect("every layer below was asked for")?));
        }
        top.merge(lower).map_err(|detail| Error::Corrupt { id, what: "stat object", path: String::new(), detail })
    }

    async fn stat_layer(self: &Arc<Self>, id: Hash) -> Result<StatObject> {
        let b = self.get(Space::Objects, id, "stat object").await?;
        StatObject::decode(&b).map_err(|e| Error::corrupt(id, "stat object", "", e))
    }

    /// The chunk manifest of a chunked entry.
    pub async fn manifest(self: &Arc<Self>, e: &Entry, path: &str) -> Result<ChunkManifest> {
        let mb = self.get(Space::Objects, e.id, "chunk manifest").await.map_err(|er| er.at_path(path))?;
        let m = ChunkManifest::decode(&mb).map_err(|er| Error::corrupt(e.id, "chunk manifest", path, er))?;
        if m.size != e.size {
            return Err(Error::Corrupt {
                id: e.id,
                what: "chunk manifest",
                path: path.to_string(),
                detail: format!("manifest size {} != tree size {}", m.size, e.size),
            });
        }
        Ok(m)
    }

    /// The whole content of a file or symlink entry, reassembling chunks
    /// (fetched concurrently) when the entry is chunked.
    pub async fn content(self: &Arc<Self>, e: &Entry, path: &str) -> Result<Bytes> {
        if !e.kind.has_content() {
            return Err(Error::User(format!("{path} is a {}, not a file", e.kind.label())));
        }
        if !e.chunked {
            let b = self.get(Space::Objects, e.id, "blob").await.map_err(|er| er.at_path(path))?;
            if b.len() as u64 != e.size {
                return Err(Error::Corrupt {
                    id: e.id,
                    what: "blob",
                    path: path.to_string(),
                    detail: format!("{} bytes, tree says {}", b.len(), e.size),
                });
            }
            return Ok(b);
        }
        let m = self.manifest(e, path).await?;
        // Owned ids and path: futures that borrow across a stream trip up
        // the compiler's Send checks when spawned.
        let ids: Vec<Hash> = m.chunks.iter().map(|(_, id)| *id).collect();
        let parts: Vec<Bytes> = futures::stream::iter(ids.into_iter().map(|id| {
            let me = self.clone();
            let path = path.to_string();
            async move { me.get(Space::Objects, id, "chunk").await.map_err(|er| er.at_path(&path)) }
        }))
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
        let mut out = Vec::with_capacity(m.size as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        if !m.content.verifies(&out) {
            return Err(Error::Corrupt {
                id: e.id,
                what: "chunk manifest",
                path: path.to_string(),
                detail: "reassembled content does not match the manifest's content hash".into(),
            });
        }
        Ok(Bytes::from(out))
    }

    /// Resolves a `/`-separated path below `root` to its entry
    /// (`None` for the root itself).
    pub async fn lookup(self: &Arc<Self>, root: Hash, path: &str) -> Result<Option<Entry>> {
        let mut tree_id = root;
        let mut found: Option<Entry> = None;
        let mut walked = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if let Some(e) = &found {
                if e.kind != Kind::Directory {
                    return Err(Error::NotFound(format!("{walked} is a {}, not a directory", e.kind.label())));
                }
                tree_id = e.id;
            }
            let t = self.tree(tree_id, &walked).await?;
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(part);
            found = Some(
                t.get(part.as_bytes()).cloned().ok_or_else(|| Error::NotFound(format!("no such path: {walked}")))?,
            );
        }
        Ok(found)
    }
}
