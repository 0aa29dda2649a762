//! A wrapper that adds a fixed delay before every request, standing in for
//! network latency in tests and quick measurements (the benchmark harness
//! uses a real TCP proxy instead). With a delay, the round-trip depth the
//! counting wrapper reports shows up directly in wall time.
//!
//! Not object_store's `ThrottledStore`: over a local folder its GET panics
//! (object_store 0.14.2 `throttle.rs`, `throttle_get`: a file payload is
//! `unimplemented!()`), and the local folder is mado's default store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};

#[derive(Debug)]
pub struct DelayStore {
    inner: Arc<dyn ObjectStore>,
    rtt: Duration,
}

impl DelayStore {
    pub fn new(inner: Arc<dyn ObjectStore>, rtt: Duration) -> Self {
        DelayStore { inner, rtt }
    }
}

impl fmt::Display for DelayStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Delay({:?}, {})", self.rtt, self.inner)
    }
}

#[async_trait]
impl ObjectStore for DelayStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        tokio::time::sleep(self.rtt).await;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        tokio::time::sleep(self.rtt).await;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        tokio::time::sleep(self.rtt).await;
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let rtt = self.rtt;
        let inner = self.inner.clone();
        futures::stream::once(async move {
            tokio::time::sleep(rtt).await;
            inner.delete_stream(locations)
        })
        .flatten()
        .boxed()
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let rtt = self.rtt;
        let s = self.inner.list(prefix);
        futures::stream::once(async move {
            tokio::time::sleep(rtt).await;
            s
        })
        .flatten()
        .boxed()
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        tokio::time::sleep(self.rtt).await;
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        tokio::time::sleep(self.rtt).await;
        self.inner.copy_opts(from, to, options).await
    }
}
