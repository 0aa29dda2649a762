//! The remote: where snapshots live, and the only door to the store. Keys
//! are built by [`layout`]; this module opens a store from its URL, does
//! verified object reads, pack and index transfers, locks, and moves
//! refs with compare-and-swap.
//!
//! Key layout under the URL's prefix (docs/FORMAT.md, "Store layout"):
//! - `objects/<2 hex>/<64 hex>`: blobs, chunks, chunk manifests, trees;
//! - `snapshots/<2 hex>/<64 hex>`: snapshots, kept apart so a short id
//!   resolves with one small LIST;
//! - `refs/<name>`: a [`RefValue`], moved only by compare-and-swap.
//!
//! Invariant (the *closure rule*): an object is written only after every
//! object it references is in the store, and a ref only after its snapshot.
//! So the presence of a tree proves the presence of everything below it,
//! which is what lets an upload skip whole unchanged subtrees with one HEAD.

pub mod aws_profile;
mod cloud;
pub mod counting;
pub mod delay;
pub mod fault;
pub mod layout;
mod local;
mod locks;
mod refs;

pub use locks::{gc_wait, LockKind, StoreLock, LOCK_TTL};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{Error, Next, Result};
use crate::hash::Hash;
pub use counting::{Counters, CountingStore, Stats};

/// How many independent requests one operation keeps in flight.
pub const CONCURRENCY: usize = 32;

/// Which namespace an object lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    Objects,
    Snapshots,
}

/// Options for opening a remote.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Delay added before every request (tests, quick measurements).
    pub inject_rtt: Option<Duration>,
}

/// Version of a ref as read, handed back to [`Remote::cas_ref`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefVersion {
    /// S3 and friends: the ETag (and version) of the ref object.
    Conditional { e_tag: Option<String>, version: Option<String> },
    /// Local store: the hash of the bytes, compared under a file lock.
    Local(Hash),
}

pub struct Remote {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    /// Set for `file://` stores: refs are compared under an flock here.
    local_root: Option<PathBuf>,
    /// For S3: the endpoint requests go to, as resolved (for messages).
    endpoint: Option<String>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote({})", self.url)
    }
}

/// The in-memory store named by `url` (one per URL per process).
fn memory_store(url: &str) -> Arc<dyn ObjectStore> {
    static STORES: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Arc<dyn ObjectStore>>>> =
        std::sync::OnceLock::new();
    let mut stores = STORES.get_or_init(Default::default).lock().expect("memory stores lock");
    stores.entry(url.to_string()).or_insert_with(|| Arc::new(object_store::memory::InMemory::new())).clone()
}

/// Blocks in which a pack in a local store is read as a stream.
const FILE_STREAM_BLOCK: usize = 1 << 20;

/// Bytes `range` of `file` (a pack of a `file://` store) as a stream of
/// [`FILE_STREAM_BLOCK`] reads, each on a blocking thread. object_store's
/// own stream of a local file reads 8 KiB per blocking task: a cold read
/// of a 1 GiB file through a mount of the embedded store took 4.6 s at
/// RTT 0 that way, slower than the same read from MinIO over loopback.
fn file_stream(
    file: std::fs::File,
    range: std::ops::Range<u64>,
    key: Path,
) -> futures::stream::BoxStream<'static, Result<Bytes>> {
    let file = Arc::new(file);
    futures::stream::try_unfold(range.start, move |at| {
        let (file, key, end) = (file.clone(), key.clone(), range.end);
        async move {
            if at >= end {
                return Ok(None);
            }
            let len = (end - at).min(FILE_STREAM_BLOCK as u64) as usize;
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = crate::bufpool::take(len);
                crate::bufpool::read_exact_at(&file, &mut buf, len, at).map(|()| buf)
            })
            .await
            .map_err(|e| Error::Internal(format!("reading {key}: {e}")))?;
            match read {
                Ok(buf) => Ok(Some((crate::bufpool::into_bytes(buf), at + len as u64))),
                Err(e) => Err(Error::Io { context: format!("reading {key}"), source: e }),
            }
        }
    })
    .boxed()
}

impl Remote {
    /// [`Remote::open`] for a command that makes the store if it is not
    /// there (`import-git`): a `file://` directory that holds other things
    /// and nothing of a store's is refused, so that a mistyped path does
    /// not get `objects/`, `refs/` and the rest written among unrelated
    /// files.
    pub fn open_creating(url: &str, opts: &OpenOptions) -> Result<Remote> {
        if let Some(root) =
            url::Url::parse(url).ok().filter(|u| u.scheme() == "file").and_then(|u| u.to_file_path().ok())
        {
            if let Ok(rd) = std::fs::read_dir(&root) {
                let names: Vec<String> = rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                if !names.is_empty() && !names.iter().any(|n| layout::TOP_LEVEL.contains(&n.as_str())) {
                    return Err(Error::User(format!(
                        "{} is not empty and holds no store (no objects/, refs/, packs/ …); \
                         choose an empty or new directory for the store, or check MADO_REMOTE_ADDR and the config",
                        root.display()
                    )));
                }
            }
        }
        Remote::open(url, opts)
    }

    /// [`Remote::open`] for a command that only uses a store: a `file://`
    /// store whose directory does not exist is an error naming it (a
    /// mistyped path would otherwise be made, empty, and every read would
    /// answer "no refs" or "no such ref" instead).
    pub fn open_existing(url: &str, opts: &OpenOptions) -> Result<Remote> {
        if let Ok(parsed) = url::Url::parse(url) {
            if parsed.scheme() == "file" {
                if let Ok(root) = parsed.to_file_path() {
                    if root.exists() && !root.is_dir() {
                        return Err(Error::User(format!(
                            "no store at {}: it is a file, not a directory; check MADO_REMOTE_ADDR or the config",
                            root.display()
                        )));
                    }
                    if !root.exists() {
                        return Err(Error::User(format!(
                            "no store at {}: the directory does not exist; check the path",
                            root.display()
                        ))
                        .then(Next::InitStore { url: url.to_string() }));
                    }
                }
            }
        }
        Remote::open(url, opts)
    }

    /// Opens `file:///abs/path` or `s3://bucket[/prefix]`. S3 settings come
    /// from the standard AWS environment variables (`AWS_ENDPOINT_URL`,
    /// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`), then from
    /// the profile `AWS_PROFILE` names in the shared config files
    /// ([`aws_profile`]); an `http://` endpoint (MinIO on loopback) is
    /// allowed as is.
    pub fn open(url: &str, opts: &OpenOptions) -> Result<Remote> {
        let parsed = url::Url::parse(url).map_err(|e| {
            Error::User(format!(
                "remote URL {url:?} is not a URL ({e}); use file:///absolute/path or s3://bucket/prefix"
            ))
        })?;
        let (inner, prefix, local_root, endpoint): (Arc<dyn ObjectStore>, String, Option<PathBuf>, Option<String>) =
            match parsed.scheme() {
                "file" => {
                    let root = parsed.to_file_path().map_err(|_| {
                        Error::User(format!("remote URL {url:?}: a file:// URL needs an absolute path"))
                    })?;
                    crate::fsutil::create_private_dir(&root)?;
                    let fs = object_store::local::LocalFileSystem::new_with_prefix(&root)
                        .map_err(|e| Error::User(format!("remote URL {url:?}: cannot open {}: {e}", root.display())))?;
                    (Arc::new(local::RegularFiles::new(fs)), String::new(), Some(root), None)
                }
                // A store in this process's memory, shared by every remote of
                // the same URL and gone when the process ends: for unit tests
                // of the layers above the store, never in place of a real
                // backend.
                "memory" => (memory_store(url), String::new(), None, None),
                "s3" => cloud::s3(&parsed, url)?,
                "gs" => cloud::gcs(&parsed, url)?,
                "az" | "azure" => cloud::azure(&parsed, url)?,
                other => {
                    return Err(Error::User(format!(
                        "remote URL {url:?}: unsupported scheme {other:?}; use file:///absolute/path, \
                         s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"
                    )))
                }
            };
        let inner: Arc<dyn ObjectStore> = match opts.inject_rtt {
            Some(rtt) => Arc::new(delay::DelayStore::new(inner, rtt)),
            None => inner,
        };
        let counters = Arc::new(Counters::default());
        let store = Arc::new(CountingStore::new(inner, counters.clone()));
        Ok(Remote { url: url.to_string(), store, prefix, local_root, endpoint, counters })
    }

    /// A remote over `store` as given, with no URL to parse: for tests of
    /// the layers above that wrap a real backend (`memory://`, a local
    /// folder), e.g. in a [`fault::FaultStore`].
    pub fn from_store(label: &str, store: Arc<dyn ObjectStore>) -> Remote {
        let counters = Arc::new(Counters::default());
        let store = Arc::new(CountingStore::new(store, counters.clone()));
        Remote { url: label.to_string(), store, prefix: String::new(), local_root: None, endpoint: None, counters }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn stats(&self) -> Stats {
        self.counters.stats()
    }

    /// Full key for `rel` (built by [`layout`]) under this remote's prefix.
    pub(crate) fn key(&self, rel: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(rel)
        } else {
            Path::from(format!("{}/{rel}", self.prefix))
        }
    }

    pub fn object_key(&self, space: Space, id: &Hash) -> Path {
        self.key(&layout::object(space, id))
    }

    /// The error for a failed request, with the URL, the key and a hint.
    pub fn remote_err(&self, op: &'static str, key: &Path, e: object_store::Error) -> Error {
        // What the service says in its XML, as one line and what to do
        // (exit 1): these are the user's to fix, not internal errors.
        let text = e.to_string();
        let code = text.split("<Code>").nth(1).and_then(|r| r.split("</Code>").next()).unwrap_or_default();
        let scheme = self.url.split("://").next().unwrap_or_default();
        let (service, creds_hint) = match scheme {
            "gs" => ("GCS", "check GOOGLE_SERVICE_ACCOUNT (or GOOGLE_APPLICATION_CREDENTIALS)"),
            "az" | "azure" => {
                ("Azure", "check AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY)")
            }
            _ => ("AWS S3", "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the profile AWS_PROFILE names)"),
        };
        let endpoint = self.endpoint.clone().unwrap_or_else(|| service.into());
        let bucket = self.url.split("://").nth(1).and_then(|r| r.split('/').next()).unwrap_or_default();
        if text.contains("169.254.169.254") {
            // No credentials anywhere: object_store fell back to the EC2
            // instance metadata service, which is not there.
            return Error::User(format!(
                "remote {}: no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
                 or AWS_PROFILE naming a profile in ~/.aws/credentials (the EC2 instance metadata service was asked, which did not answer)",
                self.url
            ));
        }
        match code {
            "NoSuchBucket" | "ContainerNotFound" => {
                let what = if code == "ContainerNotFound" { "container" } else { "bucket" };
                let make = match scheme {
                    "gs" => format!("`gcloud storage buckets create gs://{bucket}`"),
                    "az" | "azure" => format!("`az storage container create -n {bucket}`"),
                    _ => format!("`aws s3 mb s3://{bucket}`, `mc mb`"),
                };
                return Error::User(format!(
                    "remote {}: {what} {bucket:?} does not exist at {endpoint}; create it ({make}) or fix the URL",
                    self.url
                ));
            }
            "SignatureDoesNotMatch"
            | "InvalidAccessKeyId"
            | "AuthenticationFailed"
            | "AuthorizationFailure"
            | "InvalidAuthenticationInfo" => {
                return Error::User(format!(
                    "remote {}: {endpoint} refused the credentials ({code}); {creds_hint}",
                    self.url
                ));
            }
            "AccessDenied" | "AuthorizationPermissionMismatch" => {
                return Error::User(format!(
                    "remote {}: access to {key} denied by {endpoint}; check the credentials' permissions and the bucket policy",
                    self.url
                ));
            }
            _ => {}
        }
        let hint = match &e {
            object_store::Error::Generic { .. } if self.local_root.is_none() => format!(
                "check that {endpoint} is up and reachable, the bucket exists and the credentials are right ({creds_hint})"
            ),
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                format!("{creds_hint}, and the bucket's policy")
            }
            _ if self.local_root.is_some() => "check that the store directory exists and is writable".into(),
            _ => "check the remote URL and that the server is up (retry later if it is overloaded)".into(),
        };
        Error::Remote { url: self.url.clone(), op, key: key.to_string(), hint, source: Box::new(e) }
    }

    /// Reads an object and checks that its bytes hash to `id`.
    pub async fn get_object(&self, space: Space, id: &Hash, what: &'static str) -> Result<Bytes> {
        let key = self.object_key(space, id);
        if let Some(root) = &self.local_root {
            // The local backend opens with a blocking open: a FIFO or a
            // device planted in the store would hang it.
            if let Ok(m) = std::fs::symlink_metadata(root.join(key.as_ref())) {
                if !m.file_type().is_file() {
                    return Err(Error::Corrupt {
                        id: *id,
                        what,
                        path: String::new(),
                        detail: "the store holds something other than a regular file there".into(),
                    });
                }
            }
        }
        let bytes = match self.store.get(&key).await {
            Ok(r) => r.bytes().await.map_err(|e| self.remote_err("GET", &key, e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::ObjectMissing { id: *id, what, path: String::new() })
            }
            Err(e) => return Err(self.remote_err("GET", &key, e)),
        };
        if !id.verifies(&bytes) {
            return Err(Error::Corrupt {
                id: *id,
                what,
                path: String::new(),
                detail: format!("stored bytes ({} B) hash to {}", bytes.len(), Hash::of(&bytes).short()),
            });
        }
        Ok(bytes)
    }

    /// Writes an object. Content-addressed, so overwriting is harmless.
    pub async fn put_object(&self, space: Space, id: &Hash, bytes: Bytes) -> Result<()> {
        let key = self.object_key(space, id);
        self.store.put(&key, PutPayload::from(bytes)).await.map_err(|e| self.remote_err("PUT", &key, e))?;
        Ok(())
    }

    /// HEAD: is the object in the store?
    pub async fn has_object(&self, space: Space, id: &Hash) -> Result<bool> {
        self.exists(&self.object_key(space, id)).await
    }

    /// HEAD of any key: present or not.
    pub async fn exists(&self, key: &Path) -> Result<bool> {
        match self.store.head(key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.remote_err("HEAD", key, e)),
        }
    }

    /// HEADs many objects at once (one round trip for up to [`CONCURRENCY`]).
    pub async fn have_objects(&self, space: Space, ids: &[Hash]) -> Result<Vec<bool>> {
        futures::stream::iter(ids.iter().map(|id| self.has_object(space, id))).buffered(CONCURRENCY).try_collect().await
    }

    /// Snapshot ids starting with `prefix` (at least 2 hex digits): one LIST.
    pub async fn snapshots_with_prefix(&self, prefix: &str) -> Result<Vec<Hash>> {
        let prefix = prefix.to_ascii_lowercase();
        let dir = self.key(&layout::snapshot_fanout(&prefix[..2]));
        let listed = self.store.list_with_delimiter(Some(&dir)).await.map_err(|e| self.remote_err("LIST", &dir, e))?;
        Ok(listed
            .objects
            .iter()
            .filter_map(|m| m.location.filename())
            .filter(|name| name.starts_with(&prefix))
            .filter_map(|name| name.parse().ok())
            .collect())
    }

    /// HEAD of a pack.
    pub async fn has_pack(&self, id: &Hash) -> Result<bool> {
        self.exists(&self.key(&layout::pack(id))).await
    }

    /// Uploads a pack.
    pub async fn put_pack(&self, id: &Hash, bytes: Bytes) -> Result<()> {
        if let Some(e) = crate::failpoint::error("put-pack") {
            return Err(e);
        }
        let key = self.key(&layout::pack(id));
        self.store.put(&key, PutPayload::from(bytes)).await.map_err(|e| self.remote_err("PUT", &key, e))?;
        Ok(())
    }

    /// Bytes `range` of a pack, as one buffer (a member read alone).
    pub async fn pack_range(&self, id: &Hash, range: std::ops::Range<u64>) -> Result<Bytes> {
        let key = self.key(&layout::pack(id));
        let opts = GetOptions { range: Some(GetRange::Bounded(range)), ..Default::default() };
        let r = self.store.get_opts(&key, opts).await.map_err(|e| self.get_err(&key, e))?;
        r.bytes().await.map_err(|e| self.remote_err("GET", &key, e))
    }

    /// Bytes `range` of a pack as they arrive (one ranged GET), so a pack
    /// is exploded while it downloads. A pack missing from the store is
    /// [`Error::NotFound`].
    pub async fn pack_stream(
        &self,
        id: &Hash,
        range: std::ops::Range<u64>,
    ) -> Result<futures::stream::BoxStream<'static, Result<Bytes>>> {
        let key = self.key(&layout::pack(id));
        let opts = GetOptions { range: Some(GetRange::Bounded(range)), ..Default::default() };
        let r = self.store.get_opts(&key, opts).await.map_err(|e| self.get_err(&key, e))?;
        if let object_store::GetResultPayload::File(file, _) = r.payload {
            return Ok(file_stream(file, r.range, key));
        }
        Ok(r.into_stream()
            .map_err(move |e| Error::Io { context: format!("reading {key}"), source: std::io::Error::other(e) })
            .boxed())
    }

    /// HEAD of tree `tree`'s pack index.
    pub async fn has_index(&self, tree: &Hash) -> Result<bool> {
        self.exists(&self.key(&layout::index(tree))).await
    }

    /// Tree `tree`'s pack index, `None` if it has none.
    pub async fn get_index(&self, tree: &Hash) -> Result<Option<Bytes>> {
        self.get_if_present(&self.key(&layout::index(tree))).await
    }

    pub async fn put_index(&self, tree: &Hash, bytes: Bytes) -> Result<()> {
        let key = self.key(&layout::index(tree));
        self.store.put(&key, PutPayload::from(bytes)).await.map_err(|e| self.remote_err("PUT", &key, e))?;
        Ok(())
    }

    /// Writes tree `tree`'s pack index only if none is there (a conditional
    /// PUT): `false` when one was, which is left as it is.
    pub async fn create_index(&self, tree: &Hash, bytes: Bytes) -> Result<bool> {
        let key = self.key(&layout::index(tree));
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(&key, PutPayload::from(bytes), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.remote_err("PUT", &key, e)),
        }
    }

    /// A whole object by a key that a listing returned; `None` if gone.
    pub async fn get_if_present(&self, key: &Path) -> Result<Option<Bytes>> {
        match self.store.get(key).await {
            Ok(r) => Ok(Some(r.bytes().await.map_err(|e| self.remote_err("GET", key, e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.remote_err("GET", key, e)),
        }
    }

    /// The first bytes of an object by a key that a listing returned.
    pub async fn head_bytes(&self, key: &Path, n: u64) -> Result<Bytes> {
        self.store.get_range(key, 0..n).await.map_err(|e| self.get_err(key, e))
    }

    /// Everything under `prefix` (a [`layout`] directory). One LIST, paged.
    pub async fn list(&self, prefix: &str) -> Result<Vec<object_store::ObjectMeta>> {
        let key = self.key(prefix);
        self.store.list(Some(&key)).try_collect().await.map_err(|e| self.remote_err("LIST", &key, e))
    }

    /// Deletes keys a listing returned (batched where the store can).
    pub async fn delete_keys(&self, keys: Vec<Path>) -> Result<()> {
        let stream = futures::stream::iter(keys.into_iter().map(Ok)).boxed();
        self.store
            .delete_stream(stream)
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| self.remote_err("DELETE", &self.key(""), e))?;
        Ok(())
    }

    /// Deletes a workspace's lease (best effort: a lease left behind
    /// names a ref that no longer exists).
    pub async fn delete_lease(&self, ws_ref: &str) {
        let _ = self.store.delete(&self.key(&layout::lease(ws_ref))).await;
    }

    /// A GET's error, with a missing key as [`Error::NotFound`].
    fn get_err(&self, key: &Path, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound(format!("{key} is missing from {}", self.url)),
            e => self.remote_err("GET", key, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_pack_streams_in_large_blocks_and_a_short_one_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let remote = Remote::open(&url, &OpenOptions::default()).unwrap();
        let body: Vec<u8> = (0..(FILE_STREAM_BLOCK * 2 + 12345)).map(|i| (i * 7 % 251) as u8).collect();
        let id = Hash::of(&body);
        remote.put_pack(&id, Bytes::from(body.clone())).await.unwrap();
        let (from, to) = (1000u64, body.len() as u64 - 10);
        let parts: Vec<Bytes> = remote.pack_stream(&id, from..to).await.unwrap().try_collect().await.unwrap();
        // Blocks of FILE_STREAM_BLOCK, not object_store's 8 KiB reads.
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].len(), FILE_STREAM_BLOCK);
        assert_eq!(parts.concat(), &body[from as usize..to as usize]);
        // A pack cut short after the GET answered (another process, a
        // full disk): the stream fails, naming the pack, and never hangs.
        let stream = remote.pack_stream(&id, 0..body.len() as u64).await.unwrap();
        let file = dir.path().join(layout::pack(&id));
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(FILE_STREAM_BLOCK as u64 + 5).unwrap();
        let e = stream.try_collect::<Vec<Bytes>>().await.unwrap_err().to_string();
        assert!(e.contains(&id.to_string()), "{e}");
    }
}
