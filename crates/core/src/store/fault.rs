//! A store wrapper that fails the requests a test names, for unit tests of
//! the layers above the store (what a flaky network or a hostile server
//! does to them), the way mountpoint-s3 tests its client's callers. It
//! stands in for nothing: wrap a real backend (`memory://`, `file://`).
//!
//! A [`Fault`] applies to requests of one [`Op`] whose key contains a
//! given string, for the next `times` matching requests.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};

/// Which requests a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A GET (whole or ranged), not a HEAD.
    Get,
    Head,
    Put,
    List,
    Delete,
}

/// What happens to a request that a fault hits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The request fails as a broken connection would.
    Error,
    /// The request is applied, then the answer is lost: the caller sees an
    /// error and cannot tell whether it happened.
    LoseAnswer,
    /// A GET answers with these bytes instead of the object's.
    Garbage(Vec<u8>),
    /// A GET waits, unanswered, until [`FaultStore::release`] (a slow
    /// server, or a request held up behind a connection's handshake), then
    /// is served: what a caller does meanwhile shows what it waits for.
    Hold,
}

#[derive(Clone, Debug)]
pub struct Fault {
    pub op: Op,
    /// Hits keys containing this ("" for every key).
    pub key_contains: String,
    /// How many matching requests it hits before it is spent.
    pub times: u32,
    pub failure: Failure,
}

#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    faults: Mutex<Vec<Fault>>,
    /// Open once released: held GETs wait on it.
    released: tokio::sync::Semaphore,
}

impl FaultStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultStore {
        FaultStore { inner, faults: Mutex::new(Vec::new()), released: tokio::sync::Semaphore::new(0) }
    }

    /// Lets every GET held by [`Failure::Hold`] go on, now and later.
    pub fn release(&self) {
        self.released.close();
    }

    pub fn add(&self, f: Fault) {
        self.faults.lock().expect("faults lock").push(f);
    }

    /// Faults not yet spent.
    pub fn pending(&self) -> usize {
        self.faults.lock().expect("faults lock").len()
    }

    /// The failure for this request, if a fault hits it (and counts it).
    fn take(&self, op: Op, key: &Path) -> Option<Failure> {
        let mut faults = self.faults.lock().expect("faults lock");
        let i = faults.iter().position(|f| f.op == op && key.as_ref().contains(&f.key_contains))?;
        let failure = faults[i].failure.clone();
        faults[i].times -= 1;
        if faults[i].times == 0 {
            faults.remove(i);
        }
        Some(failure)
    }
}

fn broken(key: &Path) -> object_store::Error {
    object_store::Error::Generic { store: "FaultStore", source: format!("injected: connection reset ({key})").into() }
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fault({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        match self.take(Op::Put, location) {
            Some(Failure::LoseAnswer) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(broken(location))
            }
            Some(_) => Err(broken(location)),
            None => self.inner.put_opts(location, payload, opts).await,
        }
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        match self.take(Op::Put, location) {
            Some(_) => Err(broken(location)),
            None => self.inner.put_multipart_opts(location, opts).await,
        }
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let op = if options.head { Op::Head } else { Op::Get };
        match self.take(op, location) {
            None => self.inner.get_opts(location, options).await,
            Some(Failure::Garbage(bytes)) => {
                let mut r = self.inner.get_opts(location, options).await?;
                r.range = r.range.start..r.range.start + bytes.len() as u64;
                let body = Bytes::from(bytes);
                r.payload = GetResultPayload::Stream(futures::stream::once(async move { Ok(body) }).boxed());
                Ok(r)
            }
            Some(Failure::LoseAnswer) => {
                let _ = self.inner.get_opts(location, options).await;
                Err(broken(location))
            }
            Some(Failure::Error) => Err(broken(location)),
            Some(Failure::Hold) => {
                // A closed semaphore answers every wait at once.
                let _ = self.released.acquire().await;
                self.inner.get_opts(location, options).await
            }
        }
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let hit = self.faults.lock().expect("faults lock").iter().any(|f| f.op == Op::Delete);
        if hit && self.take(Op::Delete, &Path::from("")).is_some() {
            return futures::stream::once(async { Err(broken(&Path::from("delete"))) }).boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let key = prefix.cloned().unwrap_or_default();
        if self.take(Op::List, &key).is_some() {
            return futures::stream::once(async move { Err(broken(&key)) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let key = prefix.cloned().unwrap_or_default();
        if self.take(Op::List, &key).is_some() {
            return Err(broken(&key));
        }
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: object_store::CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::FaultStore;
    use object_store::memory::InMemory;
    use std::sync::Arc;

    /// A store names itself in what object_store reports of it: the
    /// injecting one names the store it wraps.
    #[test]
    fn it_names_the_store_it_wraps() {
        assert_eq!(FaultStore::new(Arc::new(InMemory::new())).to_string(), "Fault(InMemory)");
    }
}
