//! What unit tests across the crate share.

use std::path::Path;
use std::sync::Arc;

use crate::cache::DiskCache;
use crate::store::{OpenOptions, Remote};

/// A store (the local directory kind) and a disk cache, in `dir`.
pub(crate) fn local_store(dir: &Path) -> (Arc<Remote>, Arc<DiskCache>) {
    let remote = Remote::open(&format!("file://{}/store", dir.display()), &OpenOptions::default()).unwrap();
    (Arc::new(remote), Arc::new(DiskCache::open(dir.join("cache"), None).unwrap()))
}
