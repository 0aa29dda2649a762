//! Staged content and its upload in closure order: what an import, a
//! checkpoint of a working copy and a checkpoint of a mounted workspace
//! share. Content is first written into the disk cache (no network), then
//! what the store lacks goes up leaves first and trees by height, so a
//! tree in the store always proves its whole subtree (the closure rule).
//!
//! An import stages in memory instead ([`Staged::in_memory`]): trees and
//! small blobs stay in a map, up to a budget, and reach the disk only
//! inside the packs built from them (which the import keeps in the cache
//! whole), not as one cache file per object.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use crate::cache::DiskCache;
use crate::chunk::{split, split_file, split_stream, Split, Streamed};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{Kind, Tree};
use crate::store::{Remote, Space, CONCURRENCY};

/// Objects staged by phase 1 (in the cache, or in memory), with the tree
/// structure needed to upload them in closure order.
#[derive(Default)]
pub struct Staged {
    /// Tree id -> (encoded bytes, child ids that are objects).
    trees: HashMap<Hash, (Bytes, Vec<Hash>)>,
    /// Chunk manifest id -> chunk ids.
    manifests: HashMap<Hash, Vec<Hash>>,
    /// In-memory mode: what is staged here instead of in the cache.
    memory: Option<Memory>,
    /// The length of every content staged, by id: a tree entry naming one
    /// must say that size ([`Staged::tree`] refuses it otherwise), so no
    /// snapshot is published that cannot be read back.
    sizes: HashMap<Hash, u64>,
    pub files: u64,
    pub bytes: u64,
}

/// Staged objects kept in memory, by id (trees and small blobs).
pub type InMemory = HashMap<Hash, Bytes>;

/// A blob above this size is staged in the cache even in in-memory mode
/// (as are chunks and manifests: a large file is streamed to the cache).
pub const IN_MEMORY_MAX_BLOB: usize = 1 << 20;

struct Memory {
    objects: Arc<InMemory>,
    /// Blob bytes held in `objects` (trees are held in any mode).
    held: u64,
    budget: u64,
}

impl Staged {
    /// Stages trees and blobs up to [`IN_MEMORY_MAX_BLOB`] in memory, not
    /// in the cache, until the blobs held reach `budget` bytes; past it,
    /// blobs go to the cache as in the default mode. Trees are never
    /// written to the cache in this mode. Whoever reads the staged
    /// content (pack builds, uploads) asks [`Staged::memory`] first.
    pub fn in_memory(budget: u64) -> Staged {
        Staged { memory: Some(Memory { objects: Arc::default(), held: 0, budget }), ..Staged::default() }
    }

    /// The objects staged in memory (none in the default mode).
    pub fn memory(&self) -> Option<Arc<InMemory>> {
        self.memory.as_ref().map(|m| m.objects.clone())
    }

    /// Keeps blob `id` in memory if the mode and the budget allow it.
    fn keep_blob(&mut self, id: &Hash, data: &[u8]) -> bool {
        let Some(m) = self.memory.as_mut() else { return false };
        if m.objects.contains_key(id) {
            return true;
        }
        if data.len() > IN_MEMORY_MAX_BLOB || m.held + data.len() as u64 > m.budget {
            return false;
        }
        m.held += data.len() as u64;
        Arc::make_mut(&mut m.objects).insert(*id, Bytes::copy_from_slice(data));
        true
    }

    /// The ids staged in memory that `root` reaches (itself included),
    /// through the trees staged here.
    pub fn in_memory_below(&self, root: &Hash) -> Vec<Hash> {
        let Some(m) = &self.memory else { return Vec::new() };
        let mut seen = HashSet::from([*root]);
        let mut stack = vec![*root];
        let mut out = Vec::new();
        while let Some(id) = stack.pop() {
            if m.objects.contains_key(&id) {
                out.push(id);
            }
            for k in self.trees.get(&id).map(|(_, k)| k.as_slice()).unwrap_or(&[]) {
                if seen.insert(*k) {
                    stack.push(*k);
                }
            }
        }
        out
    }

    /// Stores a file's content in the cache (split if large); returns its
    /// id and whether it is chunked.
    pub fn content(&mut self, cache: &DiskCache, data: &[u8]) -> Result<(Hash, bool)> {
        self.content_was(cache, data, None)
    }

    /// [`Staged::content`], but a whole blob that hashes to `known` is not
    /// written: the caller knows the store has it.
    fn content_was(&mut self, cache: &DiskCache, data: &[u8], known: Option<Hash>) -> Result<(Hash, bool)> {
        self.files += 1;
        self.bytes += data.len() as u64;
        let r = self.content_split(cache, data, known)?;
        self.sizes.insert(r.0, data.len() as u64);
        Ok(r)
    }

    fn content_split(&mut self, cache: &DiskCache, data: &[u8], known: Option<Hash>) -> Result<(Hash, bool)> {
        match split(data) {
            Split::Whole { id } => {
                if Some(id) != known && !self.keep_blob(&id, data) {
                    cache.put(&id, data)?;
                }
                Ok((id, false))
            }
            Split::Chunked { encoded, id, chunks, .. } => {
                for (cid, piece) in &chunks {
                    cache.put(cid, piece)?;
                }
                cache.put(&id, &encoded)?;
                self.manifests.insert(id, chunks.iter().map(|(h, _)| *h).collect());
                Ok((id, true))
            }
        }
    }

    /// Stores the content `reader` yields, like [`Staged::content`] but
    /// streamed: a large file is chunked and its chunks written to the
    /// cache as they are cut, so memory stays at one chunk whatever the
    /// file's size. Returns its id, whether it is chunked, and its size.
    pub fn content_from(
        &mut self,
        cache: &DiskCache,
        reader: impl std::io::Read,
        what: &str,
    ) -> Result<(Hash, bool, u64)> {
        self.content_from_was(cache, reader, what, None)
    }

    fn content_from_was(
        &mut self,
        cache: &DiskCache,
        reader: impl std::io::Read,
        what: &str,
        known: Option<Hash>,
    ) -> Result<(Hash, bool, u64)> {
        let streamed = split_stream(reader, what, |id, piece| cache.put(id, piece))?;
        self.streamed(cache, streamed, known)
    }

    /// Stores the regular file `file` as [`Staged::content_from`] stores
    /// its bytes, without reading its holes ([`split_file`]): a sparse
    /// file costs its data.
    pub fn content_of_file(
        &mut self,
        cache: &DiskCache,
        file: &std::fs::File,
        what: &str,
    ) -> Result<(Hash, bool, u64)> {
        self.content_of_file_was(cache, file, what, None)
    }

    fn content_of_file_was(
        &mut self,
        cache: &DiskCache,
        file: &std::fs::File,
        what: &str,
        known: Option<Hash>,
    ) -> Result<(Hash, bool, u64)> {
        let streamed = split_file(file, what, |id, piece| cache.put(id, piece))?;
        self.streamed(cache, streamed, known)
    }

    fn streamed(&mut self, cache: &DiskCache, streamed: Streamed, known: Option<Hash>) -> Result<(Hash, bool, u64)> {
        match streamed {
            Streamed::Whole { data } => {
                let (id, chunked) = self.content_was(cache, &data, known)?;
                Ok((id, chunked, data.len() as u64))
            }
            Streamed::Chunked { encoded, id, chunks, size } => {
                self.files += 1;
                self.bytes += size;
                cache.put(&id, &encoded)?;
                self.manifests.insert(id, chunks);
                self.sizes.insert(id, size);
                Ok((id, true, size))
            }
        }
    }

    /// Stores the file at `path` (streamed, see [`Staged::content_from`]).
    pub fn file(&mut self, cache: &DiskCache, path: &std::path::Path) -> Result<(Hash, bool, u64)> {
        self.file_was(cache, path, None)
    }

    /// [`Staged::file`] for a file that was `known` in the snapshot the
    /// working copy stands on (its stat moved, maybe only its times): when
    /// it still hashes to that id, the store has it, and it is not written
    /// to the cache again (a `touch` of a thousand files would otherwise
    /// write a thousand cache entries).
    pub fn file_was(
        &mut self,
        cache: &DiskCache,
        path: &std::path::Path,
        known: Option<Hash>,
    ) -> Result<(Hash, bool, u64)> {
        let f = crate::fsutil::open_regular(path).map_err(Error::io(format!("reading {}", path.display())))?;
        self.content_of_file_was(cache, &f, &path.display().to_string(), known)
    }

    /// Stores a tree in the cache (in memory only, in in-memory mode) and
    /// remembers its children for upload.
    pub fn tree(&mut self, cache: &DiskCache, tree: &Tree) -> Result<Hash> {
        for e in &tree.entries {
            match self.sizes.get(&e.id) {
                Some(&n) if n != e.size && matches!(e.kind, Kind::File | Kind::Executable | Kind::Symlink) => {
                    return Err(Error::Internal(format!(
                        "refusing to record {:?} as {} bytes: the content staged for it ({}) is {n} bytes",
                        String::from_utf8_lossy(&e.name),
                        e.size,
                        e.id.short()
                    )));
                }
                _ => {}
            }
        }
        let enc = Bytes::from(tree.encode());
        let id = Hash::of(&enc);
        match self.memory.as_mut() {
            Some(m) => {
                Arc::make_mut(&mut m.objects).insert(id, enc.clone());
            }
            None => cache.put(&id, &enc)?,
        }
        let children = tree.entries.iter().filter(|e| e.kind != Kind::Gitlink).map(|e| e.id).collect();
        self.trees.insert(id, (enc, children));
        Ok(id)
    }
}

/// What an upload did.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct UploadReport {
    pub objects_uploaded: u64,
    pub bytes_uploaded: u64,
    pub trees_uploaded: u64,
    pub snapshots_uploaded: u64,
}

/// Phase 2: uploads what the store lacks below `roots`, in closure order.
pub async fn upload_closure(
    remote: &Remote,
    cache: &DiskCache,
    staged: &Staged,
    roots: &[Hash],
) -> Result<UploadReport> {
    let mut report = UploadReport::default();
    // Top-down: one batch of HEADs per tree level, pruning present subtrees.
    let mut frontier: Vec<Hash> = roots.to_vec();
    let mut seen: HashSet<Hash> = frontier.iter().copied().collect();
    let mut missing_levels: Vec<Vec<Hash>> = Vec::new();
    let mut missing_leaves: Vec<Hash> = Vec::new();
    while !frontier.is_empty() {
        let have = remote.have_objects(Space::Objects, &frontier).await?;
        let mut next = Vec::new();
        let mut level = Vec::new();
        for (id, present) in frontier.iter().zip(have) {
            if present {
                continue;
            }
            let kids: &[Hash] = if let Some((_, kids)) = staged.trees.get(id) {
                level.push(*id);
                kids
            } else if let Some(chunks) = staged.manifests.get(id) {
                missing_leaves.push(*id);
                chunks
            } else {
                missing_leaves.push(*id);
                &[]
            };
            for k in kids {
                if seen.insert(*k) {
                    next.push(*k);
                }
            }
        }
        missing_levels.push(level);
        frontier = next;
    }
    // Leaves (blobs, chunks, manifests) first, all in flight together.
    // A manifest before its chunks would break the closure rule, so
    // manifests go after the plain leaves.
    let (manifests, plain): (Vec<Hash>, Vec<Hash>) =
        missing_leaves.into_iter().partition(|id| staged.manifests.contains_key(id));
    let evicted = |id: &Hash| {
        Error::User(format!(
            "object {id} was evicted from the disk cache before upload; raise the cache cap (setting cache.max_size, or MADO_DISK_CACHE_MAX_BYTES) and import again"
        ))
    };
    let memory = staged.memory.as_ref().map(|m| &*m.objects);
    let (n, bytes) = put_from_cache(remote, cache, memory, plain, manifests, &evicted).await?;
    report.objects_uploaded += n;
    report.bytes_uploaded += bytes;
    // Trees by height: a tree goes up only once every missing tree below it
    // is in the store, whatever depth it was first reached at (a subtree
    // shared by two paths at different depths gets one height).
    let mut missing_trees: Vec<Hash> = missing_levels.into_iter().flatten().collect();
    missing_trees.sort();
    missing_trees.dedup();
    for (i, batch) in
        tree_batches(&missing_trees, |id| staged.trees.get(id).map(|(_, k)| k.as_slice())).into_iter().enumerate()
    {
        if i > 0 {
            crate::failpoint::hit("upload-between-tree-batches");
        }
        let n: Vec<u64> = futures::stream::iter(batch.into_iter().map(|id| async move {
            let bytes = staged.trees[&id].0.clone();
            let n = bytes.len() as u64;
            remote.put_object(Space::Objects, &id, bytes).await?;
            Ok::<u64, Error>(n)
        }))
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
        report.trees_uploaded += n.len() as u64;
        report.objects_uploaded += n.len() as u64;
        report.bytes_uploaded += n.iter().sum::<u64>();
    }
    Ok(report)
}

/// Uploads objects from `memory` (what was staged there) or else the disk
/// cache: `leaves` (blobs, chunks) all in
/// flight together, then `manifests` (a manifest before its chunks would
/// break the closure rule). `absent` words the error for an object the
/// cache no longer holds. Returns (objects, bytes) uploaded.
pub(crate) async fn put_from_cache(
    remote: &Remote,
    cache: &DiskCache,
    memory: Option<&InMemory>,
    leaves: Vec<Hash>,
    manifests: Vec<Hash>,
    absent: &(dyn Fn(&Hash) -> Error + Sync),
) -> Result<(u64, u64)> {
    let (mut n, mut bytes) = (0, 0);
    for batch in [leaves, manifests] {
        let sizes: Vec<u64> = futures::stream::iter(batch.into_iter().map(|id| async move {
            let b = match memory.and_then(|m| m.get(&id)) {
                Some(b) => b.clone(),
                None => Bytes::from(cache.get(&id).ok_or_else(|| absent(&id))?),
            };
            let len = b.len() as u64;
            remote.put_object(Space::Objects, &id, b).await?;
            Ok::<u64, Error>(len)
        }))
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
        n += sizes.len() as u64;
        bytes += sizes.iter().sum::<u64>();
    }
    Ok((n, bytes))
}

/// Groups `trees` (the trees to upload) into batches by height: batch 0
/// holds trees none of whose children is in `trees`, batch k trees whose
/// highest child in `trees` is in batch k-1. Uploading batch after batch
/// keeps the closure rule. Iterative, so a tree thousands of levels deep
/// cannot overflow the stack.
pub(crate) fn tree_batches<'a>(trees: &[Hash], kids: impl Fn(&Hash) -> Option<&'a [Hash]>) -> Vec<Vec<Hash>> {
    let wanted: HashSet<Hash> = trees.iter().copied().collect();
    let mut height: HashMap<Hash, usize> = HashMap::with_capacity(trees.len());
    for start in trees {
        if height.contains_key(start) {
            continue;
        }
        // Post-order: (tree, children already pushed?).
        let mut stack = vec![(*start, false)];
        while let Some((id, expanded)) = stack.pop() {
            if height.contains_key(&id) {
                continue;
            }
            let children: Vec<Hash> = kids(&id).unwrap_or(&[]).iter().copied().filter(|k| wanted.contains(k)).collect();
            if !expanded {
                stack.push((id, true));
                stack.extend(children.into_iter().filter(|k| !height.contains_key(k)).map(|k| (k, false)));
                continue;
            }
            let h = children.iter().filter_map(|k| height.get(k)).map(|h| h + 1).max().unwrap_or(0);
            height.insert(id, h);
        }
    }
    let mut batches: Vec<Vec<Hash>> = Vec::new();
    for id in trees {
        let h = height[id];
        if batches.len() <= h {
            batches.resize_with(h + 1, Vec::new);
        }
        batches[h].push(*id);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> Hash {
        Hash([n; 32])
    }

    /// Checks the closure rule on a batch plan: every tree's children
    /// that are uploaded too sit in strictly earlier batches.
    fn assert_closure(batches: &[Vec<Hash>], kids: &HashMap<Hash, Vec<Hash>>) {
        let mut batch_of = HashMap::new();
        for (i, b) in batches.iter().enumerate() {
            for id in b {
                assert!(batch_of.insert(*id, i).is_none(), "{id} planned twice");
            }
        }
        for (id, b) in &batch_of {
            for k in kids.get(id).into_iter().flatten() {
                if let Some(kb) = batch_of.get(k) {
                    assert!(kb < b, "{k} (batch {kb}) does not go before its parent {id} (batch {b})");
                }
            }
        }
    }

    #[test]
    fn a_subtree_at_two_depths_goes_before_both_parents() {
        // root -> a -> b -> shared -> leaf; root -> shared (shallow).
        let kids: HashMap<Hash, Vec<Hash>> =
            [(h(1), vec![h(2), h(4)]), (h(2), vec![h(3)]), (h(3), vec![h(4)]), (h(4), vec![h(5)]), (h(5), vec![])]
                .into_iter()
                .collect();
        let trees: Vec<Hash> = (1..=5).map(h).collect();
        let batches = tree_batches(&trees, |id| kids.get(id).map(|v| v.as_slice()));
        assert_closure(&batches, &kids);
        assert_eq!(batches.len(), 5, "a chain of five trees needs five batches: {batches:?}");
        assert_eq!(batches[0], vec![h(5)]);
        assert_eq!(batches[4], vec![h(1)]);
        // Children already in the store (not in `trees`) do not delay a parent.
        let partial = tree_batches(&[h(1), h(2)], |id| kids.get(id).map(|v| v.as_slice()));
        assert_eq!(partial, vec![vec![h(2)], vec![h(1)]]);
    }

    fn file(name: &str, id: Hash, size: usize) -> crate::object::Entry {
        crate::object::Entry { name: name.into(), kind: Kind::File, chunked: false, size: size as u64, id }
    }

    /// In-memory mode keeps trees and small blobs out of the cache until
    /// the blobs reach the budget; past it, and for blobs above
    /// IN_MEMORY_MAX_BLOB, content goes to the cache as in the default
    /// mode. An upload reads both.
    #[tokio::test]
    async fn in_memory_staging_keeps_small_content_out_of_the_cache_up_to_its_budget() {
        let d = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(d.path().join("cache"), None).unwrap();
        let mut staged = Staged::in_memory(2500);
        let (a, b, c) = (vec![b'a'; 1000], vec![b'b'; 1000], vec![b'c'; 1000]);
        let (ia, _) = staged.content(&cache, &a).unwrap();
        let (ib, _) = staged.content(&cache, &b).unwrap();
        // The same content again is not counted twice against the budget.
        assert_eq!(staged.content(&cache, &a).unwrap().0, ia);
        let (ic, _) = staged.content(&cache, &c).unwrap();
        let big = vec![b'd'; IN_MEMORY_MAX_BLOB + 1];
        let mut roomy = Staged::in_memory(u64::MAX);
        let (id, chunked) = roomy.content(&cache, &big).unwrap();
        assert!(!chunked);
        assert!(cache.contains(&id) && !roomy.memory().unwrap().contains_key(&id), "a blob above 1 MiB is cached");

        let mem = staged.memory().unwrap();
        for (id, what) in [(ia, "a"), (ib, "b")] {
            assert!(mem.contains_key(&id) && !cache.contains(&id), "{what} is in memory only");
        }
        assert!(cache.contains(&ic) && !mem.contains_key(&ic), "past the budget, content goes to the cache");

        let tree = Tree::normalized(vec![file("a", ia, 1000), file("b", ib, 1000), file("c", ic, 1000)]).unwrap();
        let root = staged.tree(&cache, &tree).unwrap();
        assert!(!cache.contains(&root), "trees are not cached in memory mode");
        assert_eq!(staged.memory().unwrap()[&root][..], tree.encode()[..]);
        let mut below = staged.in_memory_below(&root);
        below.sort();
        let mut want = vec![root, ia, ib];
        want.sort();
        assert_eq!(below, want);

        // The default mode caches everything, as before.
        let mut plain = Staged::default();
        let e = vec![b'e'; 10];
        let (ie, _) = plain.content(&cache, &e).unwrap();
        let t = plain.tree(&cache, &Tree::normalized(vec![file("e", ie, 10)]).unwrap()).unwrap();
        assert!(cache.contains(&ie) && cache.contains(&t) && plain.memory().is_none());

        // Without packs, the upload reads memory and the cache alike.
        let remote = Remote::open(&format!("file://{}/store", d.path().display()), &Default::default()).unwrap();
        let r = upload_closure(&remote, &cache, &staged, &[root]).await.unwrap();
        assert_eq!((r.objects_uploaded, r.trees_uploaded), (4, 1));
        assert!(remote.have_objects(Space::Objects, &[root, ia, ib, ic]).await.unwrap().iter().all(|p| *p));
    }

    #[test]
    fn deep_chains_do_not_overflow_the_stack() {
        let n = 20_000u32;
        let id = |i: u32| {
            let mut b = [0u8; 32];
            b[..4].copy_from_slice(&i.to_le_bytes());
            Hash(b)
        };
        let kids: HashMap<Hash, Vec<Hash>> =
            (0..n).map(|i| (id(i), if i + 1 < n { vec![id(i + 1)] } else { vec![] })).collect();
        let trees: Vec<Hash> = (0..n).map(id).collect();
        let batches = tree_batches(&trees, |x| kids.get(x).map(|v| v.as_slice()));
        assert_eq!(batches.len(), n as usize);
        assert_closure(&batches, &kids);
    }
}
