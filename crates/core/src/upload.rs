//! Staged content and its upload in closure order: what an import, a
//! checkpoint of a working copy and a checkpoint of a mounted workspace
//! share. Content is first written into the disk cache (no network), then
//! what the store lacks goes up leaves first and trees by height, so a
//! tree in the store always proves its whole subtree (the closure rule).
//!
//! An import stages in a spill file instead ([`Staged::spilling`]): trees
//! and small blobs, up to a budget, go to one file read back by offset, and
//! reach the cache only inside the packs built from them (which the import
//! keeps in the cache whole), not as one cache file per object.

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

/// Objects staged by phase 1 (in the cache, or in a spill file), with the
/// tree structure needed to upload them in closure order.
#[derive(Default)]
pub struct Staged {
    /// Tree id -> (encoded bytes, unless spilled; child ids that are objects).
    trees: HashMap<Hash, (Option<Bytes>, Vec<Hash>)>,
    /// Chunk manifest id -> chunk ids.
    manifests: HashMap<Hash, Vec<Hash>>,
    /// Spill mode: what is staged there instead of in the cache.
    spill: Option<Arc<Spilled>>,
    /// The length of every content staged in the cache, by id (the spill
    /// file knows its own): a tree entry naming one must say that size
    /// ([`Staged::tree`] refuses it otherwise), so no snapshot is
    /// published that cannot be read back.
    sizes: HashMap<Hash, u64>,
    pub files: u64,
    pub bytes: u64,
}

/// A blob above this size is staged in the cache even in spill mode (as
/// are chunks and manifests: a large file is streamed to the cache).
pub const SPILL_MAX_BLOB: usize = 1 << 20;

/// Bytes a spill file gathers in memory before it writes them.
const SPILL_WRITE_BYTES: usize = 4 << 20;

/// Trees and small blobs an import staged outside the cache's one file per
/// object: appended to one file, unlinked as soon as it is made (a killed
/// import leaves nothing), in the cache's own folder, and read back by
/// offset. Each record is the object's id, its length (4 bytes, little
/// endian) and its bytes. Memory holds about 17 bytes an object (a table
/// slot keyed by the id's first 8 bytes, the full id checked against the
/// record's), not its bytes, so an import's peak does not grow with the
/// content of the tree.
pub struct Spilled {
    /// The first 8 bytes of an id -> (record offset << 24 | length).
    short: HashMap<u64, u64, std::hash::BuildHasherDefault<IdPrefix>>,
    /// Objects of 16 MiB or more (a tree of a huge directory), and any
    /// whose first 8 bytes another id has: (record offset, length).
    other: HashMap<Hash, (u64, u64)>,
    file: std::fs::File,
    /// The folder it was made in (unlinked at once), for messages: a full
    /// disk there stops the import.
    dir: std::path::PathBuf,
    /// Bytes appended after `written` (not in the file yet).
    tail: Vec<u8>,
    written: u64,
    /// Blob bytes held (trees are held in any case).
    held: u64,
    budget: u64,
}

/// Hashes a table key that is already the start of a uniform content id.
#[derive(Default)]
pub struct IdPrefix(u64);

impl std::hash::Hasher for IdPrefix {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Reads a file from the start by offset (the spill file's own position
/// is where it is written).
struct ReadAt<'a> {
    file: &'a std::fs::File,
    at: u64,
}

impl std::io::Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// A record's head: the id and the length.
const RECORD_HEAD: u64 = 36;
const SHORT_LEN_BITS: u32 = 24;

pub(crate) fn prefix(id: &Hash) -> u64 {
    u64::from_le_bytes(id.0[..8].try_into().expect("8 bytes"))
}

impl Spilled {
    fn create(cache: &DiskCache, budget: u64) -> Result<Spilled> {
        let dir = cache.build_dir()?;
        let path = dir.join(format!("spill-{}-{}", std::process::id(), rand::random::<u64>()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        let _ = std::fs::remove_file(&path);
        Ok(Spilled {
            short: HashMap::default(),
            other: HashMap::new(),
            file,
            dir,
            tail: Vec::new(),
            written: 0,
            held: 0,
            budget,
        })
    }

    /// Reads `len` bytes at `at` of the file, or of what it gathered.
    fn read(&self, at: u64, len: u64) -> Result<Vec<u8>> {
        if at >= self.written {
            let from = (at - self.written) as usize;
            return Ok(self.tail[from..from + len as usize].to_vec());
        }
        let mut buf = vec![0; len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&self.file, &mut buf, at)
            .map_err(Error::io("reading the import's spill file"))?;
        Ok(buf)
    }

    /// Where object `id`'s record is, and its length.
    fn find(&self, id: &Hash) -> Result<Option<(u64, u64)>> {
        if let Some(&at) = self.other.get(id) {
            return Ok(Some(at));
        }
        let Some(&v) = self.short.get(&prefix(id)) else { return Ok(None) };
        let (at, len) = (v >> SHORT_LEN_BITS, v & ((1 << SHORT_LEN_BITS) - 1));
        Ok((self.read(at, 32)? == id.0).then_some((at, len)))
    }

    pub fn contains(&self, id: &Hash) -> Result<bool> {
        Ok(self.find(id)?.is_some())
    }

    /// Every object staged here, in the order staged: one pass over the
    /// file.
    pub fn ids(&self) -> Result<Vec<Hash>> {
        use std::io::Read;
        let mut out = Vec::with_capacity(self.short.len() + self.other.len());
        let mut r = std::io::BufReader::with_capacity(1 << 20, ReadAt { file: &self.file, at: 0 });
        let mut at = 0;
        let mut head = [0u8; RECORD_HEAD as usize];
        let mut skip = Vec::new();
        while at < self.written {
            r.read_exact(&mut head).map_err(Error::io("reading the import's spill file"))?;
            let len = u32::from_le_bytes(head[32..].try_into().expect("4 bytes")) as u64;
            out.push(Hash(head[..32].try_into().expect("32 bytes")));
            skip.resize(len as usize, 0);
            r.read_exact(&mut skip).map_err(Error::io("reading the import's spill file"))?;
            at += RECORD_HEAD + len;
        }
        let mut t = &self.tail[..];
        while !t.is_empty() {
            let len = u32::from_le_bytes(t[32..36].try_into().expect("4 bytes")) as usize;
            out.push(Hash(t[..32].try_into().expect("32 bytes")));
            t = &t[RECORD_HEAD as usize + len..];
        }
        Ok(out)
    }

    /// How many objects are staged here.
    pub fn len(&self) -> usize {
        self.short.len() + self.other.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether object `id` may be staged here: an object whose id starts
    /// as one staged here does (not read back to be sure). False: it is not.
    pub fn may_hold(&self, id: &Hash) -> bool {
        self.short.contains_key(&prefix(id)) || self.other.contains_key(id)
    }

    /// The length of object `id`, if staged here.
    pub fn len_of(&self, id: &Hash) -> Result<Option<u64>> {
        Ok(self.find(id)?.map(|(_, len)| len))
    }

    /// The bytes of object `id`, if staged here.
    pub fn get(&self, id: &Hash) -> Result<Option<Vec<u8>>> {
        match self.find(id)? {
            Some((at, len)) => self.read(at + RECORD_HEAD, len).map(Some),
            None => Ok(None),
        }
    }

    fn put(&mut self, id: Hash, data: &[u8]) -> Result<()> {
        if self.contains(&id)? {
            return Ok(());
        }
        self.append(id, data)
    }

    /// [`Spilled::put`] of an object the caller found absent.
    fn append(&mut self, id: Hash, data: &[u8]) -> Result<()> {
        let len = u32::try_from(data.len())
            .map_err(|_| Error::Internal(format!("object {} is too large to spill", id.short())))?;
        let at = self.written + self.tail.len() as u64;
        self.tail.extend_from_slice(&id.0);
        self.tail.extend_from_slice(&len.to_le_bytes());
        self.tail.extend_from_slice(data);
        let len = u64::from(len);
        let key = prefix(&id);
        if len >= 1 << SHORT_LEN_BITS || at >= 1 << (64 - SHORT_LEN_BITS) || self.short.contains_key(&key) {
            self.other.insert(id, (at, len));
        } else {
            self.short.insert(key, at << SHORT_LEN_BITS | len);
        }
        if self.tail.len() >= SPILL_WRITE_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        use std::io::Write;
        (&self.file)
            .write_all(&self.tail)
            .map_err(Error::io(format!("writing the import's spill file in {}", self.dir.display())))?;
        self.written += self.tail.len() as u64;
        self.tail.clear();
        Ok(())
    }
}

impl Staged {
    /// Stages trees and blobs up to [`SPILL_MAX_BLOB`] in one spill file
    /// ([`Spilled`]), not in the cache, until the blobs held reach `budget`
    /// bytes; past it, blobs go to the cache as in the default mode. Trees
    /// are never written to the cache in this mode. Whoever reads the
    /// staged content (pack builds, uploads) asks [`Staged::spilled`] first.
    pub fn spilling(cache: &DiskCache, budget: u64) -> Result<Staged> {
        Ok(Staged { spill: Some(Arc::new(Spilled::create(cache, budget)?)), ..Staged::default() })
    }

    /// The objects staged in the spill file (none in the default mode).
    pub fn spilled(&self) -> Option<Arc<Spilled>> {
        self.spill.clone()
    }

    fn spill_mut(&mut self) -> Result<Option<&mut Spilled>> {
        match self.spill.as_mut() {
            None => Ok(None),
            Some(s) => {
                Arc::get_mut(s).map(Some).ok_or_else(|| Error::Internal("content staged after its upload began".into()))
            }
        }
    }

    /// Keeps blob `id` in the spill file if the mode and the budget allow it.
    fn keep_blob(&mut self, id: &Hash, data: &[u8]) -> Result<bool> {
        let Some(m) = self.spill_mut()? else { return Ok(false) };
        if m.contains(id)? {
            return Ok(true);
        }
        if data.len() > SPILL_MAX_BLOB || m.held + data.len() as u64 > m.budget {
            return Ok(false);
        }
        m.held += data.len() as u64;
        m.append(*id, data)?;
        Ok(true)
    }

    /// Writes out what the spill file gathered: staging is done.
    pub fn finish(&mut self) -> Result<()> {
        match self.spill_mut()? {
            Some(m) => m.flush(),
            None => Ok(()),
        }
    }

    /// The children of staged tree `id` that are objects (`None`: not a
    /// tree staged here). A spilled tree's are read from its bytes.
    fn kids(&self, id: &Hash) -> Result<Option<Vec<Hash>>> {
        match self.trees.get(id) {
            None => Ok(None),
            Some((Some(_), kids)) => Ok(Some(kids.clone())),
            Some((None, _)) => {
                let b = self.tree_bytes(id)?;
                let t = Tree::decode(&b).map_err(|e| Error::corrupt(*id, "staged tree", "", e))?;
                Ok(Some(t.entries.iter().filter(|e| e.kind != Kind::Gitlink).map(|e| e.id).collect()))
            }
        }
    }

    /// The encoded bytes of staged tree `id`.
    fn tree_bytes(&self, id: &Hash) -> Result<Bytes> {
        match self.trees.get(id) {
            Some((Some(b), _)) => Ok(b.clone()),
            _ => match self.spill.as_ref().map(|m| m.get(id)).transpose()?.flatten() {
                Some(b) => Ok(Bytes::from(b)),
                None => Err(Error::Internal(format!("tree {} was not staged", id.short()))),
            },
        }
    }

    /// Stores a file's content in the cache (split if large); returns its
    /// id and whether it is chunked.
    pub fn content(&mut self, cache: &DiskCache, data: &[u8]) -> Result<(Hash, bool)> {
        self.content_was(cache, data, None)
    }

    /// [`Staged::content`], but a whole blob that hashes to `known` is not
    /// written: the caller knows the store has it.
    fn content_was(&mut self, cache: &DiskCache, data: &[u8], known: Option<Hash>) -> Result<(Hash, bool)> {
        self.content_placed(cache, data, split(data), known)
    }

    /// [`Staged::content`] of content already [`split`]: the hashing done
    /// beforehand, outside a lock that guards the staged objects.
    pub(crate) fn content_split_of(&mut self, cache: &DiskCache, data: &[u8], s: Split<'_>) -> Result<(Hash, bool)> {
        self.content_placed(cache, data, s, None)
    }

    fn content_placed(
        &mut self,
        cache: &DiskCache,
        data: &[u8],
        s: Split<'_>,
        known: Option<Hash>,
    ) -> Result<(Hash, bool)> {
        self.files += 1;
        self.bytes += data.len() as u64;
        let (id, chunked, spilled) = self.place(cache, data, s, known)?;
        // The spill file knows a spilled blob's length.
        if !spilled {
            self.sizes.insert(id, data.len() as u64);
        }
        Ok((id, chunked))
    }

    /// Stores `data`, split as `s`; returns its id, whether it is chunked,
    /// and whether it is in the spill file.
    fn place(
        &mut self,
        cache: &DiskCache,
        data: &[u8],
        s: Split<'_>,
        known: Option<Hash>,
    ) -> Result<(Hash, bool, bool)> {
        match s {
            Split::Whole { id } => {
                let spilled = Some(id) != known && self.keep_blob(&id, data)?;
                if Some(id) != known && !spilled {
                    cache.put(&id, data)?;
                }
                Ok((id, false, spilled))
            }
            Split::Chunked { encoded, id, chunks, .. } => {
                for (cid, piece) in &chunks {
                    cache.put(cid, piece)?;
                }
                cache.put(&id, &encoded)?;
                self.manifests.insert(id, chunks.iter().map(|(h, _)| *h).collect());
                Ok((id, true, false))
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

    /// Stages what [`split_stream`] (or [`split_file`]) made of a file;
    /// returns its id, whether it is chunked, and its size.
    pub(crate) fn streamed(
        &mut self,
        cache: &DiskCache,
        streamed: Streamed,
        known: Option<Hash>,
    ) -> Result<(Hash, bool, u64)> {
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

    /// Stores a tree in the cache (in the spill file only, in spill mode)
    /// and remembers its children for upload.
    pub fn tree(&mut self, cache: &DiskCache, tree: &Tree) -> Result<Hash> {
        let enc = tree.encode();
        let id = Hash::of(&enc);
        self.tree_encoded(cache, tree, enc, id)
    }

    /// [`Staged::tree`] of a tree already encoded (as `enc`, whose id is
    /// `id`): the encoding and hashing done outside a lock that guards the
    /// staged objects.
    pub(crate) fn tree_encoded(&mut self, cache: &DiskCache, tree: &Tree, enc: Vec<u8>, id: Hash) -> Result<Hash> {
        debug_assert_eq!(Hash::of(&enc), id);
        for e in &tree.entries {
            let staged = match (self.sizes.get(&e.id), &self.spill) {
                (Some(n), _) => Some(*n),
                (None, Some(m)) => m.len_of(&e.id)?,
                (None, None) => None,
            };
            match staged {
                Some(n) if n != e.size && matches!(e.kind, Kind::File | Kind::Executable | Kind::Symlink) => {
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
        let held = match self.spill_mut()? {
            Some(m) => {
                m.put(id, &enc)?;
                None
            }
            None => {
                cache.put(&id, &enc)?;
                Some(Bytes::from(enc))
            }
        };
        // A spilled tree's children are read back from it when asked
        // (an upload without packs): on a big tree they would be most of
        // what staging holds.
        let children = match held {
            Some(_) => tree.entries.iter().filter(|e| e.kind != Kind::Gitlink).map(|e| e.id).collect(),
            None => Vec::new(),
        };
        self.trees.insert(id, (held, children));
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
            let kids: Vec<Hash> = if let Some(kids) = staged.kids(id)? {
                level.push(*id);
                kids
            } else if let Some(chunks) = staged.manifests.get(id) {
                missing_leaves.push(*id);
                chunks.clone()
            } else {
                missing_leaves.push(*id);
                Vec::new()
            };
            for k in kids {
                if seen.insert(k) {
                    next.push(k);
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
    let (n, bytes) = put_from_cache(remote, cache, staged.spill.as_deref(), plain, manifests, &evicted).await?;
    report.objects_uploaded += n;
    report.bytes_uploaded += bytes;
    // Trees by height: a tree goes up only once every missing tree below it
    // is in the store, whatever depth it was first reached at (a subtree
    // shared by two paths at different depths gets one height).
    let mut missing_trees: Vec<Hash> = missing_levels.into_iter().flatten().collect();
    missing_trees.sort();
    missing_trees.dedup();
    let kids: HashMap<Hash, Vec<Hash>> =
        missing_trees.iter().map(|id| Ok((*id, staged.kids(id)?.unwrap_or_default()))).collect::<Result<_>>()?;
    for (i, batch) in tree_batches(&missing_trees, |id| kids.get(id).map(|k| k.as_slice())).into_iter().enumerate() {
        if i > 0 {
            crate::failpoint::hit("upload-between-tree-batches");
        }
        let n: Vec<u64> = futures::stream::iter(batch.into_iter().map(|id| async move {
            let bytes = staged.tree_bytes(&id)?;
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

/// Uploads objects from `spilled` (what was staged there) or else the disk
/// cache: `leaves` (blobs, chunks) all in
/// flight together, then `manifests` (a manifest before its chunks would
/// break the closure rule). `absent` words the error for an object the
/// cache no longer holds. Returns (objects, bytes) uploaded.
pub(crate) async fn put_from_cache(
    remote: &Remote,
    cache: &DiskCache,
    spilled: Option<&Spilled>,
    leaves: Vec<Hash>,
    manifests: Vec<Hash>,
    absent: &(dyn Fn(&Hash) -> Error + Sync),
) -> Result<(u64, u64)> {
    let (mut n, mut bytes) = (0, 0);
    for batch in [leaves, manifests] {
        let sizes: Vec<u64> = futures::stream::iter(batch.into_iter().map(|id| async move {
            let b = match spilled.map(|m| m.get(&id)).transpose()?.flatten() {
                Some(b) => Bytes::from(b),
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

    /// The default mode spills nothing: each tree and blob staged is in
    /// the cache at once, and the staging holds no spill file.
    #[test]
    fn default_staging_puts_trees_and_blobs_in_the_cache() {
        let d = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(d.path().join("cache"), None).unwrap();
        let mut staged = Staged::default();
        let (blob, _) = staged.content(&cache, b"in the cache").unwrap();
        let tree = Tree { entries: vec![file("f", blob, 12)] };
        let id = staged.tree(&cache, &tree).unwrap();
        staged.finish().unwrap();
        assert!(staged.spilled().is_none());
        assert_eq!(cache.get(&blob).as_deref(), Some(&b"in the cache"[..]));
        assert_eq!(cache.get(&id), Some(tree.encode()));
    }

    /// Spill mode keeps trees and small blobs out of the cache until the
    /// blobs reach the budget; past it, and for blobs above SPILL_MAX_BLOB,
    /// content goes to the cache as in the default mode. An upload reads
    /// both.
    #[tokio::test]
    async fn spill_staging_keeps_small_content_out_of_the_cache_up_to_its_budget() {
        let d = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(d.path().join("cache"), None).unwrap();
        let mut staged = Staged::spilling(&cache, 2500).unwrap();
        let (a, b, c) = (vec![b'a'; 1000], vec![b'b'; 1000], vec![b'c'; 1000]);
        let (ia, _) = staged.content(&cache, &a).unwrap();
        let (ib, _) = staged.content(&cache, &b).unwrap();
        // The same content again is not counted twice against the budget.
        assert_eq!(staged.content(&cache, &a).unwrap().0, ia);
        let (ic, _) = staged.content(&cache, &c).unwrap();
        let big = vec![b'd'; SPILL_MAX_BLOB + 1];
        let mut roomy = Staged::spilling(&cache, u64::MAX).unwrap();
        let (id, chunked) = roomy.content(&cache, &big).unwrap();
        assert!(!chunked);
        assert!(
            cache.contains(&id) && !roomy.spilled().unwrap().contains(&id).unwrap(),
            "a blob above 1 MiB is cached"
        );
        // The spill file is unlinked: nothing is left in the cache's folder.
        let left: Vec<_> = std::fs::read_dir(cache.build_dir().unwrap()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");

        {
            let mem = staged.spilled().unwrap();
            for (id, what, bytes) in [(ia, "a", &a), (ib, "b", &b)] {
                assert!(mem.contains(&id).unwrap() && !cache.contains(&id), "{what} is in the spill file only");
                // Read back before it is written out, from what it gathered.
                assert_eq!(mem.get(&id).unwrap().as_ref(), Some(bytes));
            }
            assert!(cache.contains(&ic) && !mem.contains(&ic).unwrap(), "past the budget, content goes to the cache");
        }

        let tree = Tree::normalized(vec![file("a", ia, 1000), file("b", ib, 1000), file("c", ic, 1000)]).unwrap();
        let root = staged.tree(&cache, &tree).unwrap();
        // A tree naming a size other than its content's is refused, for
        // spilled content as for cached.
        let lie = Tree::normalized(vec![file("a", ia, 999)]).unwrap();
        assert!(matches!(staged.tree(&cache, &lie), Err(Error::Internal(_))));
        staged.finish().unwrap();
        assert!(!cache.contains(&root), "trees are not cached in spill mode");
        let mem = staged.spilled().unwrap();
        assert_eq!(mem.get(&root).unwrap().unwrap(), tree.encode());
        assert_eq!(mem.get(&ib).unwrap().unwrap(), b);
        assert_eq!(mem.get(&ic).unwrap(), None);
        let mut held: Vec<Hash> = mem.ids().unwrap();
        held.sort();
        let mut want = vec![root, ia, ib];
        want.sort();
        assert_eq!(held, want);
        assert_eq!(staged.kids(&root).unwrap(), Some(vec![ia, ib, ic]), "a spilled tree's children, read back");
        drop(mem);

        // The default mode caches everything, as before.
        let mut plain = Staged::default();
        let e = vec![b'e'; 10];
        let (ie, _) = plain.content(&cache, &e).unwrap();
        let t = plain.tree(&cache, &Tree::normalized(vec![file("e", ie, 10)]).unwrap()).unwrap();
        assert!(cache.contains(&ie) && cache.contains(&t) && plain.spilled().is_none());

        // Without packs, the upload reads the spill file and the cache alike.
        let remote = Remote::open(&format!("file://{}/store", d.path().display()), &Default::default()).unwrap();
        let r = upload_closure(&remote, &cache, &staged, &[root]).await.unwrap();
        assert_eq!((r.objects_uploaded, r.trees_uploaded), (4, 1));
        assert!(remote.have_objects(Space::Objects, &[root, ia, ib, ic]).await.unwrap().iter().all(|p| *p));
    }

    /// The spill file's table is keyed by an id's first 8 bytes: two ids
    /// that share them are both found, each with its own bytes, and an id
    /// that shares them with a staged one but was never staged is not
    /// found. An object too long for the short table, and every record
    /// (written out or still gathered), reads back.
    /// Staging counts the files and bytes it was given, spilled or not,
    /// and hashing first gives what staging whole gives.
    #[test]
    fn staged_content_is_counted_however_it_is_hashed() {
        let d = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(d.path().join("cache"), None).unwrap();
        for mut s in [Staged::default(), Staged::spilling(&cache, u64::MAX).unwrap()] {
            assert_eq!(s.content(&cache, b"one").unwrap(), (Hash::of(b"one"), false));
            let data = b"and two";
            assert_eq!(s.content_split_of(&cache, data, split(data)).unwrap(), (Hash::of(data), false));
            assert_eq!((s.files, s.bytes), (2, 10));
        }
    }

    #[test]
    fn spilled_objects_sharing_an_id_prefix_each_read_back() {
        let d = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(d.path().join("cache"), None).unwrap();
        let mut m = Spilled::create(&cache, u64::MAX).unwrap();
        let id = |last: u8| {
            let mut b = [7u8; 32];
            b[31] = last;
            Hash(b)
        };
        let (a, b, absent) = (id(1), id(2), id(3));
        m.put(a, b"first").unwrap();
        m.put(b, b"second").unwrap();
        m.put(a, b"not again").unwrap();
        let big = vec![9u8; (1 << SHORT_LEN_BITS) + 5];
        let huge = Hash([1; 32]);
        m.put(huge, &big).unwrap();
        let fresh = Hash([2; 32]);
        m.put(fresh, b"in the tail").unwrap();
        assert!(m.written > 0 && !m.tail.is_empty(), "one record written out, one still gathered");
        // Only the id sharing a prefix and the huge one need the exact table.
        assert_eq!(m.other.len(), 2);
        assert_eq!(m.get(&a).unwrap().as_deref(), Some(&b"first"[..]));
        assert_eq!(m.get(&b).unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(m.len_of(&b).unwrap(), Some(6));
        assert_eq!(m.get(&absent).unwrap(), None);
        assert!(!m.contains(&absent).unwrap() && m.contains(&huge).unwrap());
        assert_eq!(m.get(&huge).unwrap().unwrap(), big);
        assert_eq!(m.get(&fresh).unwrap().as_deref(), Some(&b"in the tail"[..]));
        assert_eq!(m.ids().unwrap(), vec![a, b, huge, fresh]);
        assert_eq!(m.len(), 4);
        // Told by the first 8 bytes: `absent` starts as `a` does.
        assert!([a, b, huge, fresh, absent].iter().all(|id| m.may_hold(id)));
        assert!(!m.may_hold(&Hash([3; 32])));
        m.flush().unwrap();
        assert_eq!(m.ids().unwrap(), vec![a, b, huge, fresh]);
        assert_eq!(m.get(&fresh).unwrap().as_deref(), Some(&b"in the tail"[..]));
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
