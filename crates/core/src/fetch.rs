//! The fetcher: every read of committed content goes through here. It
//! checks the disk cache first (a verified hit costs no network), and on a
//! miss fetches from the remote, verifies, and fills the cache.
//!
//! Concurrent requests for one id inside the process collapse into one GET
//! (single flight): the first caller fetches, the others await the same
//! shared future, woken when it completes. No timer is involved.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};

use crate::cache::DiskCache;
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{ChunkManifest, Entry, Kind, Snapshot, Tree};
use crate::store::{Remote, Space, CONCURRENCY};

type Flight = Shared<BoxFuture<'static, Result<Bytes, Arc<Error>>>>;

pub struct Fetcher {
    pub remote: Arc<Remote>,
    pub cache: Arc<DiskCache>,
    inflight: Mutex<HashMap<(Space, Hash), Flight>>,
}

/// Re-creates an error shared between waiters of one flight.
fn unshare(e: Arc<Error>) -> Error {
    match Arc::try_unwrap(e) {
        Ok(e) => e,
        Err(e) => match &*e {
            Error::ObjectMissing { id, what, path } => Error::ObjectMissing {
                id: *id,
                what,
                path: path.clone(),
            },
            Error::Corrupt {
                id,
                what,
                path,
                detail,
            } => Error::Corrupt {
                id: *id,
                what,
                path: path.clone(),
                detail: detail.clone(),
            },
            other => Error::Io {
                context: other.to_string(),
                source: std::io::Error::other("shared fetch failed"),
            },
        },
    }
}

impl Fetcher {
    pub fn new(remote: Arc<Remote>, cache: Arc<DiskCache>) -> Arc<Fetcher> {
        Arc::new(Fetcher {
            remote,
            cache,
            inflight: Mutex::new(HashMap::new()),
        })
    }

    /// The bytes of object `id`, from the cache or the remote.
    pub async fn get(
        self: &Arc<Self>,
        space: Space,
        id: Hash,
        what: &'static str,
    ) -> Result<Bytes> {
        if let Some(b) = self.cache.get(&id) {
            return Ok(Bytes::from(b));
        }
        let flight = {
            let mut map = self.inflight.lock().expect("inflight lock");
            map.entry((space, id))
                .or_insert_with(|| {
                    let me = self.clone();
                    async move {
                        let r = me.remote.get_object(space, &id, what).await;
                        if let Ok(b) = &r {
                            // A failed cache write costs only a later re-fetch.
                            let _ = me.cache.put(&id, b);
                        }
                        me.inflight
                            .lock()
                            .expect("inflight lock")
                            .remove(&(space, id));
                        r.map_err(Arc::new)
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        flight.await.map_err(unshare)
    }

    pub async fn tree(self: &Arc<Self>, id: Hash, path: &str) -> Result<Tree> {
        let b = self
            .get(Space::Objects, id, "tree")
            .await
            .map_err(|e| e.at_path(path))?;
        Tree::decode(&b).map_err(|e| Error::corrupt(id, "tree", path, e))
    }

    pub async fn snapshot(self: &Arc<Self>, id: Hash) -> Result<Snapshot> {
        let b = self.get(Space::Snapshots, id, "snapshot").await?;
        Snapshot::decode(&b).map_err(|e| Error::corrupt(id, "snapshot", "", e))
    }

    /// The whole content of a file or symlink entry, reassembling chunks
    /// (fetched concurrently) when the entry is chunked.
    pub async fn content(self: &Arc<Self>, e: &Entry, path: &str) -> Result<Bytes> {
        if !e.kind.has_content() {
            return Err(Error::User(format!(
                "{path} is a {}, not a file",
                e.kind.label()
            )));
        }
        if !e.chunked {
            let b = self
                .get(Space::Objects, e.id, "blob")
                .await
                .map_err(|er| er.at_path(path))?;
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
        let mb = self
            .get(Space::Objects, e.id, "chunk manifest")
            .await
            .map_err(|er| er.at_path(path))?;
        let m = ChunkManifest::decode(&mb)
            .map_err(|er| Error::corrupt(e.id, "chunk manifest", path, er))?;
        if m.size != e.size {
            return Err(Error::Corrupt {
                id: e.id,
                what: "chunk manifest",
                path: path.to_string(),
                detail: format!("manifest size {} != tree size {}", m.size, e.size),
            });
        }
        let parts: Vec<Bytes> = futures::stream::iter(m.chunks.iter().map(|(_, id)| {
            let me = self.clone();
            let id = *id;
            async move {
                me.get(Space::Objects, id, "chunk")
                    .await
                    .map_err(|er| er.at_path(path))
            }
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
                    return Err(Error::NotFound(format!(
                        "{walked} is a {}, not a directory",
                        e.kind.label()
                    )));
                }
                tree_id = e.id;
            }
            let t = self.tree(tree_id, &walked).await?;
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(part);
            found = Some(
                t.get(part.as_bytes())
                    .cloned()
                    .ok_or_else(|| Error::NotFound(format!("no such path: {walked}")))?,
            );
        }
        Ok(found)
    }
}
