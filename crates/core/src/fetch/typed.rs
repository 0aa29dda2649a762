//! Typed reads on top of [`Fetcher::get`]: trees, snapshots, chunk
//! manifests, file content (whole or chunked) and path lookup.

use super::Fetcher;
use crate::error::{Error, Result};
use crate::hash::{Hash, SnapshotId};
use crate::object::{ChunkManifest, Entry, Kind, Snapshot, StatObject, Tree};
use crate::store::{Space, CONCURRENCY};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::sync::Arc;

/// Chunks of one file fetched ahead of the one being consumed: the
/// parallelism of a large file's sequential read. At 1 MiB a chunk and a
/// 20 ms round trip, 32 in flight keep ~1.6 GB/s of bandwidth busy.
pub const CHUNK_WINDOW: usize = 32;

/// Bytes of large-file pieces all readers of one fetcher may hold in memory
/// at once: what bounds a checkout's, a copy-up's or `cat`'s memory however
/// large and however many the files are (a chunk is at most 4 MiB).
pub const PIECE_BYTES_IN_MEMORY: usize = 128 << 20;

/// The unit of [`PIECE_BYTES_IN_MEMORY`]'s semaphore.
const PERMIT_BYTES: u64 = 64 << 10;

fn permits_for(len: u64) -> u32 {
    len.div_ceil(PERMIT_BYTES).max(1) as u32
}

/// A budget of `bytes` for [`Fetcher::piece_in`] (at least one 4 MiB
/// piece's worth).
pub fn piece_budget(bytes: usize) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(bytes.max(4 << 20) / PERMIT_BYTES as usize))
}

/// Permits in the fetcher's piece semaphore.
pub(super) const PIECE_PERMITS: usize = PIECE_BYTES_IN_MEMORY / PERMIT_BYTES as usize;

/// One piece of a file's content (see [`Fetcher::pieces`]).
pub struct Piece {
    pub offset: u64,
    pub bytes: Bytes,
    /// A hole of a chunked file: this many zero bytes at `offset`, and
    /// `bytes` empty.
    pub zeros: u64,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// The largest chunked file [`Fetcher::content`] assembles in memory (a
/// hostile tree could name a file of 2^40 bytes, holes costing the store
/// nothing); larger files are read a piece at a time.
pub const CONTENT_IN_MEMORY_MAX: u64 = 256 << 20;

impl Fetcher {
    pub async fn tree(self: &Arc<Self>, id: Hash, path: &str) -> Result<Tree> {
        let b = match self.inline_tree(&id) {
            Some(t) => Bytes::from(t),
            None => self.get(Space::Objects, id, "tree").await.map_err(|e| self.blame_index(e.at_path(path)))?,
        };
        Tree::decode(&b).map_err(|e| Error::corrupt(id, "tree", path, e))
    }

    /// A tree missing from the store while a pack index could not be
    /// attached (it carries the trees inline): the index is named, with
    /// why, rather than the tree alone (a damaged index read as a missing
    /// tree, from a cold cache).
    fn blame_index(&self, e: Error) -> Error {
        let Error::ObjectMissing { id, what: "tree", path } = &e else { return e };
        let failures = self.index_failures.lock().expect("index failures lock");
        let Some((tree, why)) = failures.last() else { return e };
        Error::Corrupt {
            id: *tree,
            what: "pack index",
            path: format!("packs/index/{}", tree.to_hex()),
            detail: format!(
                "{why}; it carries this snapshot's trees, so tree {} ({}) cannot be read; \
                 re-import or re-checkpoint the snapshot, or restore that file",
                id.short(),
                if path.is_empty() { "/" } else { path }
            ),
        }
    }

    pub async fn snapshot(self: &Arc<Self>, id: SnapshotId) -> Result<Snapshot> {
        let b = self.get(Space::Snapshots, *id, "snapshot").await?;
        Snapshot::decode(&b).map_err(|e| Error::corrupt(*id, "snapshot", "", e))
    }

    /// The whole stat object whose top is `id`: the layers below it that
    /// `hint` names (the snapshot lists them) come in the same round trip;
    /// any other layer the top names costs one more.
    pub async fn stat(self: &Arc<Self>, id: Hash, hint: &[Hash]) -> Result<StatObject> {
        merge_stat_chain(&self.stat_chain(id, hint).await?)
    }

    /// The stat object of `snap` (the mtimes a workspace checkpoint
    /// recorded), or `None` for a snapshot that has none (an import).
    pub async fn stat_of(self: &Arc<Self>, snap: &Snapshot) -> Result<Option<StatObject>> {
        match snap.stat {
            Some(id) => self.stat(id, &snap.stat_layers).await.map(Some),
            None => Ok(None),
        }
    }

    /// The stat object whose top is `id` as its layers, each as stored and
    /// with its id: the top first, then the layers it names, in order (one
    /// entry for a whole object). Fetched as [`Fetcher::stat`] says.
    pub async fn stat_chain(self: &Arc<Self>, id: Hash, hint: &[Hash]) -> Result<Vec<(Hash, StatObject)>> {
        let mut want = vec![id];
        want.extend(hint.iter().copied().filter(|h| *h != id).take(crate::object::MAX_STAT_LAYERS * 4));
        // A hinted layer the top does not name is not needed: its error is dropped.
        let mut got: HashMap<Hash, Result<StatObject>> = HashMap::new();
        let fetched = futures::future::join_all(want.iter().map(|h| self.stat_layer(*h))).await;
        got.extend(want.iter().copied().zip(fetched));
        let top = got.remove(&id).expect("the top was asked for")?;
        let missing: Vec<Hash> = top.base.iter().copied().filter(|b| !got.contains_key(b)).collect();
        let fetched = futures::future::join_all(missing.iter().map(|h| self.stat_layer(*h))).await;
        got.extend(missing.iter().copied().zip(fetched));
        let mut chain = Vec::with_capacity(1 + top.base.len());
        for b in &top.base {
            chain.push((*b, got.remove(b).expect("every layer below was asked for")?));
        }
        chain.insert(0, (id, top));
        Ok(chain)
    }

    /// A stat object's chain (its id first, the whole bottom last) and the
    /// layers of all of it but the bottom, decoded: what a layer placed
    /// over the chain needs ([`StatObject::layer_of_change`]); the bottom,
    /// the size of the tree, is not read. The layers are fetched at once.
    pub async fn stat_layers_above_bottom(
        self: &Arc<Self>,
        id: Hash,
        hint: &[Hash],
    ) -> Result<(Vec<Hash>, Vec<StatObject>)> {
        // The hint names the chain below `id`, the bottom last: all but it
        // are fetched with the top.
        let guess: Vec<Hash> =
            hint.iter().copied().filter(|h| *h != id).take(crate::object::MAX_STAT_LAYERS * 4).collect();
        let guess_above = &guess[..guess.len().saturating_sub(1)];
        let mut want = vec![id];
        want.extend_from_slice(guess_above);
        let fetched = futures::future::join_all(want.iter().map(|h| self.stat_layer(*h))).await;
        let mut got: HashMap<Hash, Result<StatObject>> = want.iter().copied().zip(fetched).collect();
        let top = got.remove(&id).expect("the top was asked for")?;
        let chain: Vec<Hash> = std::iter::once(id).chain(top.base.iter().copied()).collect();
        if top.base.is_empty() {
            return Ok((chain, Vec::new()));
        }
        let above_ids = &chain[1..chain.len() - 1];
        let missing: Vec<Hash> = above_ids.iter().copied().filter(|b| !got.contains_key(b)).collect();
        let fetched = futures::future::join_all(missing.iter().map(|h| self.stat_layer(*h))).await;
        got.extend(missing.iter().copied().zip(fetched));
        let mut above = vec![top];
        for b in above_ids {
            above.push(got.remove(b).expect("every layer above the bottom was asked for")?);
        }
        Ok((chain, above))
    }

    async fn stat_layer(self: &Arc<Self>, id: Hash) -> Result<StatObject> {
        let b = self.get(Space::Objects, id, "stat object").await?;
        StatObject::decode(&b).map_err(|e| Error::corrupt(id, "stat object", "", e))
    }

    /// The chunk manifest of a chunked entry.
    pub async fn manifest(self: &Arc<Self>, e: &Entry, path: &str) -> Result<ChunkManifest> {
        // Inline in an attached index (checked against its id when the
        // index was read), else fetched.
        let mb = match self.inline_tree(&e.id) {
            Some(b) => Bytes::from(b),
            None => self.get(Space::Objects, e.id, "chunk manifest").await.map_err(|er| er.at_path(path))?,
        };
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
            return Err(Error::User(format!("{path} is {}, not a file", e.kind.noun())));
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
        if e.size > CONTENT_IN_MEMORY_MAX {
            return Err(Error::User(format!(
                "{path} is {} bytes, too large to hold in memory (at most {CONTENT_IN_MEMORY_MAX})",
                e.size
            )));
        }
        let m = self.manifest(e, path).await?;
        // Owned ids and path: futures that borrow across a stream trip up
        // the compiler's Send checks when spawned.
        let spans: Vec<(u64, Option<Hash>)> = m.chunks.clone();
        let parts: Vec<(u64, Option<Bytes>)> = futures::stream::iter(spans.into_iter().map(|(len, id)| {
            let me = self.clone();
            let path = path.to_string();
            async move {
                let Some(id) = id else { return Ok((len, None)) };
                let b = me.get_in_order(id, "chunk").await.map_err(|er| er.at_path(&path))?;
                if b.len() as u64 != len {
                    return Err(Error::Corrupt {
                        id,
                        what: "chunk",
                        path,
                        detail: format!("{} bytes, its manifest says {len}", b.len()),
                    });
                }
                Ok((len, Some(b)))
            }
        }))
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
        let mut out = Vec::with_capacity(m.size as usize);
        for (len, p) in parts {
            match p {
                Some(p) => out.extend_from_slice(&p),
                // A hole: as many zeros.
                None => out.resize(out.len() + len as usize, 0),
            }
        }
        // Each chunk was verified by its id; a manifest without holes also
        // names the whole content.
        if m.content.is_some_and(|c| !c.verifies(&out)) || out.len() as u64 != m.size {
            return Err(Error::Corrupt {
                id: e.id,
                what: "chunk manifest",
                path: path.to_string(),
                detail: "reassembled content does not match the manifest's content hash".into(),
            });
        }
        Ok(Bytes::from(out))
    }

    /// A file's content in order, a piece at a time: the whole blob, or a
    /// chunked file's chunks fetched up to [`CHUNK_WINDOW`] ahead of the
    /// one being consumed. Each piece holds its size in the fetcher's
    /// semaphore until it is dropped (a fair one: the oldest waiter is
    /// served first, so the piece a writer waits for always comes), so
    /// however many large files are written at once, and however large,
    /// pieces in memory stay under [`PIECE_BYTES_IN_MEMORY`].
    ///
    /// The manifest is read through its id (which the tree holds) and each
    /// chunk is verified against the id and length the manifest gives, so
    /// the pieces are exactly the bytes the tree names; the manifest's
    /// whole-content hash, which would take a second pass over every byte,
    /// is checked only by [`Fetcher::content`].
    pub async fn pieces(
        self: &Arc<Self>,
        e: &Entry,
        path: &str,
    ) -> Result<futures::stream::BoxStream<'static, Result<Piece>>> {
        self.pieces_in(e, path, true).await
    }

    /// As [`Fetcher::pieces`], `ordered` or each piece as soon as it is here
    /// (for a writer at offsets: a chunk of a later pack that came first
    /// does not wait for an earlier one, so the window of chunks asked for
    /// keeps moving and the GETs ahead keep going out).
    async fn pieces_in(
        self: &Arc<Self>,
        e: &Entry,
        path: &str,
        ordered: bool,
    ) -> Result<futures::stream::BoxStream<'static, Result<Piece>>> {
        if !e.chunked {
            let piece = self.whole(e, path).await?;
            return Ok(futures::stream::iter([Ok(piece)]).boxed());
        }
        let m = self.manifest(e, path).await?;
        let spans: Vec<(u64, u64, Option<Hash>)> = m.spans().collect();
        let me = self.clone();
        let path = path.to_string();
        let each = futures::stream::iter(spans).map(move |(offset, len, id)| {
            let me = me.clone();
            let path = path.clone();
            async move {
                let Some(id) = id else {
                    // A hole: no bytes, no fetch, no memory.
                    let permit = me.piece_permits.clone().acquire_many_owned(0).await;
                    let permit = permit.expect("the semaphore is never closed");
                    return Ok(Piece { offset, bytes: Bytes::new(), zeros: len, _permit: permit });
                };
                let permit = me.piece_permits.clone().acquire_many_owned(permits_for(len)).await;
                let permit = permit.expect("the semaphore is never closed");
                // A cached chunk is read and verified on a blocking thread,
                // the window's reads side by side: read on this task, one
                // at a time, a warm checkout of a 300 MB file waited on
                // the disk for each chunk in turn (0.38-0.46 s against
                // 0.12 s for `cp` of the file).
                let cached = {
                    let me = me.clone();
                    tokio::task::spawn_blocking(move || me.cached(&id)).await.ok().flatten()
                };
                let bytes = match cached {
                    Some(b) => crate::bufpool::into_bytes(b),
                    None => me.get_in_order(id, "chunk").await.map_err(|er| er.at_path(&path))?,
                };
                if bytes.len() as u64 != len {
                    return Err(Error::Corrupt {
                        id,
                        what: "chunk",
                        path,
                        detail: format!("{} bytes, its manifest says {len}", bytes.len()),
                    });
                }
                Ok(Piece { offset, bytes, zeros: 0, _permit: permit })
            }
        });
        Ok(match ordered {
            true => each.buffered(CHUNK_WINDOW).boxed(),
            false => each.buffer_unordered(CHUNK_WINDOW).boxed(),
        })
    }

    /// The content of a file stored whole (at most 4 MiB), holding its
    /// size in the piece semaphore (see [`Fetcher::pieces`]) until dropped.
    /// `bytes` as a piece at offset 0, once `budget` (a semaphore made by
    /// [`piece_budget`]) has room for it. Not the fetcher's own budget: a
    /// consumer of [`Fetcher::stream_members`] must not wait on permits that
    /// readers parked on the same stream hold.
    pub async fn piece_in(budget: &Arc<tokio::sync::Semaphore>, bytes: Bytes) -> Piece {
        let permit = budget.clone().acquire_many_owned(permits_for(bytes.len() as u64)).await;
        Piece { offset: 0, bytes, zeros: 0, _permit: permit.expect("the semaphore is never closed") }
    }

    pub async fn whole(self: &Arc<Self>, e: &Entry, path: &str) -> Result<Piece> {
        let permit = self.piece_permits.clone().acquire_many_owned(permits_for(e.size)).await;
        let permit = permit.expect("the semaphore is never closed");
        let bytes = self.content(e, path).await?;
        Ok(Piece { offset: 0, bytes, zeros: 0, _permit: permit })
    }

    /// Writes a file entry's content into `file` as its pieces arrive, each
    /// at its own offset and in whatever order they come (see
    /// [`Fetcher::pieces`]), holes left as holes (`file` is new and
    /// empty); returns the file's length.
    pub async fn write_content(self: &Arc<Self>, e: &Entry, path: &str, file: Arc<std::fs::File>) -> Result<u64> {
        let mut pieces = self.pieces_in(e, path, false).await?;
        let mut n = 0;
        let mut holes = false;
        while let Some(piece) = pieces.next().await {
            let piece = piece?;
            if piece.zeros > 0 {
                n += piece.zeros;
                holes = true;
                continue;
            }
            let f = file.clone();
            let at = path.to_string();
            n += piece.bytes.len() as u64;
            tokio::task::spawn_blocking(move || {
                // A test interrupts a checkout here, its temp file half written.
                crate::failpoint::pause("content-write");
                crate::fsutil::write_sparse(&f, &piece.bytes, piece.offset)
                    .map_err(Error::io(format!("writing {at:?}")))
            })
            .await
            .map_err(|er| Error::Io { context: "write task".into(), source: std::io::Error::other(er) })??;
        }
        if holes {
            // A hole at the end: the length says it.
            file.set_len(n).map_err(Error::io(format!("writing {path:?}")))?;
        }
        Ok(n)
    }

    /// Resolves a `/`-separated path below `root` to its entry
    /// (`None` for the root itself).
    pub async fn lookup(self: &Arc<Self>, root: Hash, path: &str) -> Result<Option<Entry>> {
        let mut tree_id = root;
        let mut found: Option<Entry> = None;
        let mut walked = String::new();
        if path.split('/').any(|p| p == "..") {
            return Err(Error::User(format!(
                "{path:?}: a path in a snapshot has no `..`; give it from the snapshot's root"
            )));
        }
        // `./src` and `src/.` name `src`, as a shell's paths would.
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            if let Some(e) = &found {
                if e.kind != Kind::Directory {
                    return Err(Error::NotFound(format!("{walked} is {}, not a directory", e.kind.noun())));
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

/// The whole stat object of a chain as [`Fetcher::stat_chain`] returns it.
pub fn merge_stat_chain(chain: &[(Hash, StatObject)]) -> Result<StatObject> {
    let ((id, top), lower) = chain.split_first().expect("a chain has its top");
    top.clone().merge(lower.to_vec()).map_err(|detail| Error::Corrupt {
        id: *id,
        what: "stat object",
        path: String::new(),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use crate::fetch::Fetcher;
    use crate::hash::Hash;
    use crate::object::{Entry, Kind};
    use crate::store::Space;
    use crate::testutil::local_store;
    use bytes::Bytes;
    use futures::StreamExt;

    /// A whole (unchunked) file comes as one piece: its bytes, at 0.
    #[tokio::test]
    async fn a_whole_file_is_one_piece_of_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (remote, cache) = local_store(dir.path());
        let data = Bytes::from_static(b"the whole file");
        let id = Hash::of(&data);
        remote.put_object(Space::Objects, &id, data.clone()).await.unwrap();
        let f = Fetcher::new(remote, cache);
        let e = Entry { name: b"f".to_vec(), kind: Kind::File, chunked: false, size: data.len() as u64, id };
        let pieces: Vec<_> = f.pieces(&e, "f").await.unwrap().collect().await;
        assert_eq!(pieces.len(), 1);
        let p = pieces.into_iter().next().unwrap().unwrap();
        assert_eq!((p.offset, p.zeros, &p.bytes[..]), (0, 0, &data[..]));
    }
}
