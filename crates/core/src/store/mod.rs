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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{check_ref_name, RefValue};
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

/// Who holds a store lock: writers (imports, checkpoints) hold shared
/// ones while they rely on objects already in the store; gc holds an
/// exclusive one while it sweeps. Neither waits: whoever finds the other
/// gives way with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    Writer,
    Gc,
}

impl LockKind {
    fn label(self) -> &'static str {
        match self {
            LockKind::Writer => "writer",
            LockKind::Gc => "gc",
        }
    }
    fn from_label(s: &str) -> Option<LockKind> {
        match s {
            "writer" => Some(LockKind::Writer),
            "gc" => Some(LockKind::Gc),
            _ => None,
        }
    }
}

/// A lock object `locks/gc/<kind>.<expires>.<nonce>` (empty; everything is
/// in its name, so one LIST reads every lock).
#[derive(Clone, Debug)]
pub struct StoreLock {
    key: Path,
    pub kind: LockKind,
    /// Seconds since the epoch.
    pub expires: i64,
}

/// How long a lock of a dead holder blocks the other side. A writer
/// holding it longer than this (a huge import) is not protected past it.
pub const LOCK_TTL: Duration = Duration::from_secs(3600);

/// How long a ref read waits before it says that the store is slow to
/// answer (it goes on waiting, up to the client's request timeout).
const SLOW_ANSWER: Duration = Duration::from_secs(5);

/// How long a writer waits for a gc that is sweeping the store before it
/// gives up: `MADO_GC_WAIT_SECS`, else two minutes.
pub fn gc_wait() -> Duration {
    let secs = std::env::var("MADO_GC_WAIT_SECS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(120);
    Duration::from_secs(secs)
}

/// This process as a store lock names its holder: `<boot>-<pid>-<start>`,
/// the first 16 hex digits of BLAKE3 over the kernel's boot id (unique to
/// this machine and this boot) and the pid namespace (a container on the
/// same machine has pids of its own, which this one's `/proc` cannot
/// check), the pid, and the process's start time in clock ticks since
/// boot (`/proc/<pid>/stat`, field 22: a pid reused by another process
/// starts later). `None` without `/proc`.
fn holder_tag() -> Option<String> {
    let boot = boot_tag()?;
    let pid = std::process::id();
    Some(format!("{boot}-{pid}-{}", start_ticks(pid)?))
}

fn boot_tag() -> Option<String> {
    let id = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let both = [id.trim_ascii(), b"\n", ns.as_os_str().as_encoded_bytes()].concat();
    Some(Hash::of(&both).to_hex()[..16].to_string())
}

/// Field 22 of `/proc/<pid>/stat` (after the command name, which may hold
/// spaces and parentheses: the fields start after its last `)`); `None`
/// for no such process, or one that has exited and not been reaped yet
/// (state `Z` or `X`, field 3).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if matches!(fields.next()?, "Z" | "X") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the lock holder `tag` names is known to be gone: it ran on
/// this machine in this boot, and no process with its pid and start time
/// is alive (killed with SIGKILL, or its machine lost power before it
/// could delete the lock). A holder elsewhere, or not named, is not known.
fn holder_gone(tag: &str) -> bool {
    let mut parts = tag.splitn(3, '-');
    let (Some(boot), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else { return false };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else { return false };
    boot_tag().is_some_and(|b| b == boot) && start_ticks(pid) != Some(start)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
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
                        "{} is not empty and holds no mado store (no objects/, refs/, packs/ …); \
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
                            "no store at {}: the directory does not exist; check the path, or make a store there \
                             with `mado init --remote {url}` (or `mado import-git REPO`, which makes it)",
                            root.display()
                        )));
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
                 or AWS_PROFILE naming a profile in ~/.aws/credentials (mado asked the EC2 instance metadata service, which did not answer)",
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
            _ if self.local_root.is_some() => "check that the store directory exists and is writable (mado init)".into(),
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

    fn ref_key(&self, name: &str) -> Result<Path> {
        check_ref_name(name).map_err(Error::User)?;
        Ok(self.key(&layout::reference(name)))
    }

    /// Reads a small mutable object (a ref, a lease) and the version to
    /// hand to [`Remote::cas_put`].
    pub async fn read_versioned(&self, key: &Path) -> Result<Option<(Bytes, RefVersion)>> {
        let r = match self.store.get_opts(key, GetOptions::default()).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.remote_err("GET", key, e)),
        };
        let (e_tag, version) = (r.meta.e_tag.clone(), r.meta.version.clone());
        let bytes = r.bytes().await.map_err(|e| self.remote_err("GET", key, e))?;
        let version = match self.local_root {
            Some(_) => RefVersion::Local(Hash::of(&bytes)),
            None => RefVersion::Conditional { e_tag, version },
        };
        Ok(Some((bytes, version)))
    }

    /// Writes `bytes` at `key` if the object is still at `expected` (`None`:
    /// it must not exist). One conditional PUT on S3; on the local store
    /// the compare and the write happen under an exclusive flock, so two
    /// processes can never both win. A lost race returns `Ok(Err(current))`.
    pub async fn cas_put(
        &self,
        key: &Path,
        expected: Option<&RefVersion>,
        bytes: Vec<u8>,
    ) -> Result<std::result::Result<RefVersion, Option<Bytes>>> {
        let new_local = Hash::of(&bytes);
        let wrote = Bytes::from(bytes);
        let payload = PutPayload::from(wrote.clone());
        if let Some(root) = &self.local_root {
            let lock_path = root.join("locks").join(local_lock_name(key.as_ref()));
            let _lock = crate::fsutil::lock_file(lock_path).await?;
            let current = self.read_versioned(key).await?;
            let matches = match (expected, &current) {
                (None, None) => true,
                (Some(RefVersion::Local(want)), Some((_, RefVersion::Local(have)))) => want == have,
                (Some(RefVersion::Conditional { .. }), _) => {
                    return Err(Error::Internal("a ref version read from another store".into()))
                }
                _ => false,
            };
            if !matches {
                return Ok(Err(current.map(|(b, _)| b)));
            }
            self.store.put(key, payload).await.map_err(|e| self.remote_err("PUT", key, e))?;
            return Ok(Ok(RefVersion::Local(new_local)));
        }
        let mode = match expected {
            None => PutMode::Create,
            Some(RefVersion::Conditional { e_tag, version }) => {
                PutMode::Update(UpdateVersion { e_tag: e_tag.clone(), version: version.clone() })
            }
            Some(RefVersion::Local(_)) => return Err(Error::Internal("a ref version read from another store".into())),
        };
        let opts = PutOptions { mode, ..Default::default() };
        match self.store.put_opts(key, payload, opts).await {
            Ok(r) => Ok(Ok(RefVersion::Conditional { e_tag: r.e_tag, version: r.version })),
            // Lost the race, or did we? A PUT whose answer was lost and
            // that the client retried finds its own bytes there.
            Err(object_store::Error::Precondition { .. }) | Err(object_store::Error::AlreadyExists { .. }) => {
                match self.read_versioned(key).await? {
                    Some((b, v)) if b == wrote => Ok(Ok(v)),
                    cur => Ok(Err(cur.map(|(b, _)| b))),
                }
            }
            // The connection broke: the PUT may or may not have landed.
            // Read it back to tell "applied" from "not applied".
            Err(e) => match self.read_versioned(key).await {
                Ok(Some((b, v))) if b == wrote => Ok(Ok(v)),
                _ => Err(self.remote_err("PUT", key, e)),
            },
        }
    }

    /// Reads a ref: its value and the version to hand to [`Remote::cas_ref`].
    pub async fn read_ref(&self, name: &str) -> Result<Option<(RefValue, RefVersion)>> {
        let key = self.ref_key(name)?;
        if let Some(root) = &self.local_root {
            // `a/b` under a ref file `a`: absent (creating it is refused
            // by `cas_ref` with a message), not an I/O error.
            let p = root.join(key.as_ref());
            if p.ancestors().skip(1).take_while(|a| a.starts_with(root)).any(|a| a.is_file()) {
                return Ok(None);
            }
        }
        // The first request of most commands: a store that took the
        // connection and sends nothing would otherwise hold the command
        // silent for the whole request timeout.
        let read = self.read_versioned(&key);
        let mut read = std::pin::pin!(read);
        let read = tokio::select! {
            r = &mut read => r,
            _ = tokio::time::sleep(SLOW_ANSWER) => {
                tracing::warn!(
                    "the store at {} has not answered the GET of ref {name} in {} s; still waiting \
                     (a request gives up after {} s)",
                    self.endpoint.as_deref().unwrap_or(&self.url),
                    SLOW_ANSWER.as_secs(),
                    cloud::REQUEST_TIMEOUT.as_secs()
                );
                read.await
            }
        };
        let Some((bytes, version)) = read? else { return Ok(None) };
        let value = RefValue::decode(&bytes).map_err(|e| Error::Corrupt {
            id: Hash::of(&bytes),
            what: "ref",
            path: name.to_string(),
            detail: e.to_string(),
        })?;
        Ok(Some((value, version)))
    }

    /// Moves ref `name` to `new` if it is still at `expected` (`None`: the
    /// ref must not exist); see [`Remote::cas_put`].
    pub async fn cas_ref(&self, name: &str, expected: Option<&RefVersion>, new: RefValue) -> Result<RefVersion> {
        let key = self.ref_key(name)?;
        if expected.is_none() {
            self.check_ref_conflict(name).await?;
        }
        match self.cas_put(&key, expected, new.encode()).await? {
            Ok(v) => Ok(v),
            Err(found) => Err(Error::RefMoved {
                name: name.to_string(),
                expected: if expected.is_some() { "the version read".into() } else { "absent".into() },
                found: match found.map(|b| RefValue::decode(&b)) {
                    Some(Ok(v)) => v.snapshot.short(),
                    Some(Err(_)) => "undecodable".into(),
                    None => "absent".into(),
                },
            }),
        }
    }

    /// A new ref `a/b` beside an existing `a` (or `a` beside `a/b`) would be
    /// a file and a folder of one name on a local store, and is ambiguous
    /// everywhere: refused, as git refuses it. One LIST, only when a ref is
    /// created.
    async fn check_ref_conflict(&self, name: &str) -> Result<()> {
        let base = self.key("refs");
        let metas: Vec<_> =
            self.store.list(Some(&base)).try_collect().await.map_err(|e| self.remote_err("LIST", &base, e))?;
        let base_str = format!("{base}/");
        for m in metas {
            let Some(other) = m.location.as_ref().strip_prefix(&base_str) else { continue };
            if other.starts_with(&format!("{name}/")) || name.starts_with(&format!("{other}/")) {
                return Err(Error::User(format!(
                    "ref {name} cannot be created beside ref {other} (one would be a folder of the other); pick another name"
                )));
            }
        }
        Ok(())
    }

    /// The names of the store's refs, sorted (one LIST; no ref is read).
    pub async fn ref_names(&self) -> Result<Vec<String>> {
        let base = self.key("refs");
        let metas: Vec<_> =
            self.store.list(Some(&base)).try_collect().await.map_err(|e| self.remote_err("LIST", &base, e))?;
        let base_str = format!("{base}/");
        let mut out: Vec<String> =
            metas.iter().filter_map(|m| m.location.as_ref().strip_prefix(&base_str).map(str::to_string)).collect();
        out.sort();
        Ok(out)
    }

    /// Every ref in the store, with its value, sorted by name.
    pub async fn list_refs(&self) -> Result<Vec<(String, RefValue)>> {
        let mut out = Vec::new();
        for name in self.ref_names().await? {
            if let Some((v, _)) = self.read_ref(&name).await? {
                out.push((name, v));
            }
        }
        Ok(out)
    }

    /// Announces that a writer or gc is at work on this store (see
    /// [`LockKind`]); the lock expires by itself after [`LOCK_TTL`] if its
    /// holder dies. One PUT.
    pub async fn put_lock(&self, kind: LockKind) -> Result<StoreLock> {
        let expires = unix_now() + LOCK_TTL.as_secs() as i64;
        let holder = holder_tag();
        let key = self.key(&layout::lock(kind.label(), expires, rand::random::<u64>(), holder.as_deref()));
        self.store.put(&key, PutPayload::from(Bytes::new())).await.map_err(|e| self.remote_err("PUT", &key, e))?;
        Ok(StoreLock { key, kind, expires })
    }

    /// The live locks other than `mine` (expired ones are ignored). One LIST.
    /// A lock whose holder ran on this machine and is gone (a `kill -9`
    /// of an import, a checkpoint or a gc) is not live either: it is
    /// deleted (best effort), rather than block the other side until it
    /// expires, an hour later.
    pub async fn other_locks(&self, mine: &StoreLock) -> Result<Vec<StoreLock>> {
        let base = self.key(layout::LOCKS);
        let metas: Vec<_> =
            self.store.list(Some(&base)).try_collect().await.map_err(|e| self.remote_err("LIST", &base, e))?;
        let now = unix_now();
        let mut live = Vec::new();
        for m in metas.into_iter().filter(|m| m.location != mine.key) {
            let Some(name) = m.location.filename().map(str::to_string) else { continue };
            let mut parts = name.split('.');
            let Some(kind) = parts.next().and_then(LockKind::from_label) else { continue };
            let Some(expires) = parts.next().and_then(|e| e.parse::<i64>().ok()) else { continue };
            if expires <= now {
                continue;
            }
            // parts: the nonce, then the holder (absent from older mados).
            if parts.nth(1).is_some_and(holder_gone) {
                tracing::info!(lock = %m.location, "deleting a lock whose holder on this machine is gone");
                let _ = self.store.delete(&m.location).await;
                continue;
            }
            live.push(StoreLock { key: m.location.clone(), kind, expires });
        }
        Ok(live)
    }

    /// Removes a lock (best effort: one that stays expires by itself).
    pub async fn drop_lock(&self, lock: StoreLock) {
        let _ = self.store.delete(&lock.key).await;
    }

    /// The writer's side of the gc protocol: announce the writer, then make
    /// sure no gc is sweeping (waiting for one that is, up to [`gc_wait`]). Must complete before the writer's first
    /// dedup decision (HEAD): then either gc sees this lock before it
    /// deletes anything, or this sees gc's (docs/DESIGN.md, "gc and
    /// writers").
    pub async fn begin_write(&self) -> Result<StoreLock> {
        let lock = self.put_lock(LockKind::Writer).await?;
        self.check_no_gc(lock).await
    }

    /// The second half of [`Remote::begin_write`], for a caller that put
    /// its lock alongside another request.
    pub async fn check_no_gc(&self, lock: StoreLock) -> Result<StoreLock> {
        // A sweep takes seconds: a writer that finds one steps back (its
        // lock gone, gc may go on) and asks again, waiting longer each
        // time, up to `gc_wait()`. It failed at once before (found by a
        // review: checkpoints next to a gc loop failed at random).
        let (start, limit) = (Instant::now(), gc_wait());
        let mut pause = Duration::from_millis(100);
        let mut lock = lock;
        loop {
            let others = match self.other_locks(&lock).await {
                Ok(o) => o,
                Err(e) => {
                    self.drop_lock(lock).await;
                    return Err(e);
                }
            };
            let Some(gc) = others.iter().find(|l| l.kind == LockKind::Gc) else { return Ok(lock) };
            let expires = gc.expires;
            self.drop_lock(lock).await;
            if start.elapsed() + pause > limit {
                return Err(Error::Busy(format!(
                    "`mado gc` is sweeping this store and did not finish within {} s; retry when it has \
                     (a gc killed on another machine holds its lock until {})",
                    limit.as_secs(),
                    crate::error::local_time(expires)
                )));
            }
            if pause == Duration::from_millis(100) {
                tracing::warn!("`mado gc` is sweeping this store; waiting for it to finish");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
            lock = self.put_lock(LockKind::Writer).await?;
        }
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

    /// Deletes a ref (no compare).
    pub async fn delete_ref(&self, name: &str) -> Result<()> {
        let key = self.ref_key(name)?;
        self.store.delete(&key).await.map_err(|e| self.remote_err("DELETE", &key, e))
    }
}

/// The file name of the local store's lock for `key`: the key with `/`
/// escaped, or, when that would pass the 255 bytes a file name may have
/// (a valid ref name of 199 bytes made a lock name past it, and an import
/// failed after its packs were uploaded), `hash-` and the key's hash.
fn local_lock_name(key: &str) -> String {
    let escaped = format!("{}.lock", key.replace('/', "%2F"));
    if escaped.len() <= 255 {
        return escaped;
    }
    format!("hash-{}.lock", Hash::of(key.as_bytes()).to_hex())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lock_name_always_fits_in_a_file_name() {
        assert_eq!(super::local_lock_name("refs/a/b"), "refs%2Fa%2Fb.lock");
        // A valid ref name of 199 bytes, mostly '/': 3 bytes each escaped.
        let long = format!("refs/{}", ["a"; 100].join("/"));
        let n = super::local_lock_name(&long);
        assert!(n.len() <= 255 && n.ends_with(".lock"), "{n}");
        assert_ne!(n, super::local_lock_name(&format!("{long}b")));
    }

    use super::*;
    use object_store::memory::InMemory;

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

    /// A lock left by a process of this machine that is gone (killed with
    /// SIGKILL) blocks nobody and is deleted; a live holder's lock, one of
    /// another machine and one of an older mado (no holder) still count.
    #[tokio::test]
    async fn a_lock_whose_holder_here_is_gone_is_not_live() {
        let r = Remote::from_store("memory://locks", Arc::new(InMemory::new()));
        let mine = r.put_lock(LockKind::Gc).await.unwrap();
        let me = holder_tag().expect("this test needs /proc");
        let boot = me.split('-').next().unwrap().to_string();
        // The boot part is a hash of this boot and pid namespace, not a
        // constant that every machine would share.
        let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
        let id = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap();
        let want = Hash::of(&[id.trim_ascii(), b"\n", ns.as_os_str().as_encoded_bytes()].concat()).to_hex();
        assert_eq!(boot, want[..16]);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let expires = unix_now() + 600;
        let r = &r;
        let put = |holder: Option<String>, n: u64| {
            let key = r.key(&layout::lock("writer", expires, n, holder.as_deref()));
            async move {
                r.store.put(&key, PutPayload::from(Bytes::new())).await.unwrap();
                key
            }
        };
        let gone = put(Some(format!("{boot}-{dead}-1")), 1).await;
        let reused = put(Some(format!("{boot}-{}-1", std::process::id())), 2).await;
        let live = put(Some(me.clone()), 3).await;
        let elsewhere = put(Some(format!("0123456789abcdef-{dead}-1")), 4).await;
        let older = put(None, 5).await;
        // Killed, not yet reaped by its parent (a zombie): gone as well.
        let mut z = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let z_tag = format!("{boot}-{}-{}", z.id(), start_ticks(z.id()).unwrap());
        z.kill().unwrap();
        let stat = format!("/proc/{}/stat", z.id());
        for _ in 0..500 {
            if std::fs::read_to_string(&stat).is_ok_and(|s| s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let zombie = put(Some(z_tag), 6).await;
        let mut keys: Vec<_> = r.other_locks(&mine).await.unwrap().into_iter().map(|l| l.key).collect();
        keys.sort();
        let mut want = vec![live, elsewhere, older];
        want.sort();
        assert_eq!(keys, want);
        // The dead holder's lock, the zombie's, and the one naming this pid
        // with another start time (a reused pid), are deleted.
        z.wait().unwrap();
        for k in [gone, reused, zombie] {
            assert!(r.store.head(&k).await.is_err(), "{k} is still there");
        }
    }

    #[tokio::test]
    async fn a_ref_cas_whose_answer_was_lost_is_read_back_as_applied() {
        let faults = Arc::new(fault::FaultStore::new(Arc::new(InMemory::new())));
        // Every ref PUT is applied and its answer lost.
        let lose = fault::Fault {
            op: fault::Op::Put,
            key_contains: "refs/".into(),
            times: u32::MAX,
            failure: fault::Failure::LoseAnswer,
        };
        faults.add(lose);
        let r = Remote::from_store("memory://test", faults.clone());
        let v = RefValue::new(Hash([1; 32]), Hash([2; 32]));
        r.cas_ref("main", None, v.clone()).await.expect("applied, although the answer was lost");
        assert_eq!(r.read_ref("main").await.unwrap().unwrap().0, v);
        // A real loss still fails: another value is there now.
        let (_, ver) = r.read_ref("main").await.unwrap().unwrap();
        let w = RefValue::new(Hash([3; 32]), Hash([4; 32]));
        r.cas_ref("main", Some(&ver), w).await.expect("applied too");
        let stale = r.cas_ref("main", Some(&ver), RefValue::new(Hash([5; 32]), Hash([6; 32]))).await;
        assert!(matches!(stale, Err(Error::RefMoved { .. })), "{stale:?}");
    }
}
