//! The local folder store: object_store's `LocalFileSystem`, with every
//! read first checked to be of a regular file. A FIFO where a ref or an
//! object should be made its GET wait for a writer for ever (the request
//! timeout does not cover a local read), and a daemon started on it stayed
//! hung after its parent died; a device or a directory there is no object
//! either. The check opens the file non-blocking (a FIFO's open returns at
//! once) and looks at what was opened; the read itself is then
//! `LocalFileSystem`'s.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};

#[derive(Debug)]
pub struct RegularFiles {
    inner: Arc<LocalFileSystem>,
}

impl RegularFiles {
    pub fn new(inner: LocalFileSystem) -> Self {
        RegularFiles { inner: Arc::new(inner) }
    }

    /// Ok when `location` is a regular file or absent (the inner GET then
    /// says NotFound as it would).
    fn check(&self, location: &Path) -> Result<()> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let p = self.inner.path_to_filesystem(location)?;
        let f = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&p) {
            Ok(f) => f,
            // Absent, or a directory: the inner GET answers as it does.
            Err(_) => return Ok(()),
        };
        let t = f.metadata().map_err(|e| generic(&p, e.to_string()))?.file_type();
        if t.is_file() {
            return Ok(());
        }
        let what = if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_block_device() || t.is_char_device() {
            "a device"
        } else if t.is_dir() {
            return Ok(());
        } else {
            "not a regular file"
        };
        Err(generic(&p, format!("{what} where a stored object should be; remove it")))
    }
}

fn generic(p: &std::path::Path, msg: String) -> object_store::Error {
    object_store::Error::Generic { store: "LocalFileSystem", source: format!("{}: {msg}", p.display()).into() }
}

impl fmt::Display for RegularFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
impl ObjectStore for RegularFiles {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.check(location)?;
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.check(from)?;
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    /// A FIFO at a key is an error naming it, at once; a regular file reads.
    #[tokio::test]
    async fn a_fifo_where_an_object_should_be_is_an_error_not_a_hang() {
        let d = tempfile::tempdir().unwrap();
        let s = RegularFiles::new(LocalFileSystem::new_with_prefix(d.path()).unwrap());
        std::fs::create_dir(d.path().join("refs")).unwrap();
        let fifo = std::ffi::CString::new(d.path().join("refs/main").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), s.get(&Path::from("refs/main"))).await;
        let Err(e) = r.expect("a GET of a FIFO hung") else { panic!("a FIFO read as an object") };
        assert!(e.to_string().contains("a FIFO") && e.to_string().contains("refs/main"), "{e}");
        std::fs::write(d.path().join("refs/ok"), b"fine").unwrap();
        assert_eq!(&s.get(&Path::from("refs/ok")).await.unwrap().bytes().await.unwrap()[..], b"fine");
        assert!(matches!(s.get(&Path::from("refs/none")).await, Err(object_store::Error::NotFound { .. })));
    }
}
