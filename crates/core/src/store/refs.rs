//! Refs and other small mutable objects (leases): read with their
//! version, written by compare-and-swap.

use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use super::{cloud, layout, RefVersion, Remote};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::object::{check_ref_name, RefValue};

/// How long a ref read waits before it says that the store is slow to
/// answer (it goes on waiting, up to the client's request timeout).
const SLOW_ANSWER: Duration = Duration::from_secs(5);

impl Remote {
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
        use futures::StreamExt;
        // The refs read together (64 in flight): a hundred take two round
        // trips after the listing, not a hundred.
        let names = self.ref_names().await?;
        let read = futures::stream::iter(names).map(|name| async move { Ok((self.read_ref(&name).await?, name)) });
        let got: Vec<Result<_>> = read.buffered(64).collect().await;
        let mut out = Vec::new();
        for r in got {
            if let (Some((v, _)), name) = r? {
                out.push((name, v));
            }
        }
        Ok(out)
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
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;
    use crate::hash::{SnapshotId, TreeId};
    use crate::store::fault;

    #[test]
    fn a_lock_name_always_fits_in_a_file_name() {
        assert_eq!(super::local_lock_name("refs/a/b"), "refs%2Fa%2Fb.lock");
        // A valid ref name of 199 bytes, mostly '/': 3 bytes each escaped.
        let long = format!("refs/{}", ["a"; 100].join("/"));
        let n = super::local_lock_name(&long);
        assert!(n.len() <= 255 && n.ends_with(".lock"), "{n}");
        assert_ne!(n, super::local_lock_name(&format!("{long}b")));
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
        let v = RefValue::new(SnapshotId::from_hash(Hash([1; 32])), TreeId::from_hash(Hash([2; 32])));
        r.cas_ref("main", None, v.clone()).await.expect("applied, although the answer was lost");
        assert_eq!(r.read_ref("main").await.unwrap().unwrap().0, v);
        // A real loss still fails: another value is there now.
        let (_, ver) = r.read_ref("main").await.unwrap().unwrap();
        let w = RefValue::new(SnapshotId::from_hash(Hash([3; 32])), TreeId::from_hash(Hash([4; 32])));
        r.cas_ref("main", Some(&ver), w).await.expect("applied too");
        let stale = r
            .cas_ref(
                "main",
                Some(&ver),
                RefValue::new(SnapshotId::from_hash(Hash([5; 32])), TreeId::from_hash(Hash([6; 32]))),
            )
            .await;
        assert!(matches!(stale, Err(Error::RefMoved { .. })), "{stale:?}");
    }
}
