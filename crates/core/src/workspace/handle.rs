//! [`Workspace`]: one workspace of a store, by name. What concerns that
//! workspace (its ref, its lease, this machine's state of its mounts) is
//! a method here, so a caller names the store and the workspace once.
//! What works on a working copy's directory instead (checkpoint, status,
//! release) is reached from that directory, and stays a function.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::machine::{self, MountLock, MountState};
use super::mounted::{self, HandedOver, MountedWorkspace};
use super::{lease, ws_ref, ResumeLease, ResumeReport};
use crate::error::Result;
use crate::fetch::Fetcher;
use crate::object::{RefValue, Snapshot};

/// Workspace `name` of the store `fetcher` reads.
#[derive(Clone)]
pub struct Workspace {
    fetcher: Arc<Fetcher>,
    name: String,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Workspace({} in {})", self.name, self.fetcher.remote.url())
    }
}

impl Workspace {
    /// The handle of workspace `name`; an error when `name` cannot name a
    /// workspace (`a~1`, `../x`), before any request.
    pub fn new(fetcher: &Arc<Fetcher>, name: &str) -> Result<Workspace> {
        ws_ref(name)?;
        Ok(Workspace { fetcher: fetcher.clone(), name: name.to_string() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn fetcher(&self) -> &Arc<Fetcher> {
        &self.fetcher
    }

    /// `ws create`: a new workspace from `spec`, materialized into `dir`.
    pub async fn create(&self, spec: &str, dir: &Path, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<ResumeReport> {
        super::create(&self.fetcher, &self.name, spec, dir, progress).await
    }

    /// The workspace's ref, made from `spec` (no copy anywhere); refused,
    /// pointing at a resume, when the workspace exists.
    pub async fn create_ref(&self, spec: &str) -> Result<RefValue> {
        super::create_ref(&self.fetcher, &self.name, spec).await
    }

    /// `ws resume`: the latest checkpoint into `dir`, byte for byte.
    pub async fn resume(
        &self,
        dir: &Path,
        lease: ResumeLease,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<ResumeReport> {
        super::resume(&self.fetcher, &self.name, dir, lease, progress).await
    }

    /// Deletes the ref and the lease; see [`super::remove`] for when a
    /// held lease refuses it. The flat copy of its last checkpoint's times
    /// that a mount here kept in the disk cache goes too: it was kept for
    /// the next mount of that checkpoint, and none will come (a mount of
    /// another workspace on the same checkpoint makes it again).
    pub async fn remove(&self, force: bool, dead: Option<&str>) -> Result<()> {
        let was = super::remove(&self.fetcher.remote, &self.name, force, dead).await?;
        // From the cache alone: no round trip for a copy that only a
        // mount here, which had the snapshot, could have made.
        let stat = self.fetcher.cache.get(&was.snapshot).and_then(|b| Snapshot::decode(&b).ok()).and_then(|s| s.stat);
        if let Some(stat) = stat {
            let _ = std::fs::remove_file(self.fetcher.cache.flat_times_path(&stat));
        }
        Ok(())
    }

    /// `Err(LeaseHeld)` when another working copy keeps the lease.
    pub async fn check_lease_free(&self, steal: bool) -> Result<()> {
        lease::check_lease_free(&self.fetcher.remote, &self.name, steal).await
    }

    /// Gives up `holder`'s lease; false when `holder` did not hold it.
    pub async fn release_lease(&self, holder: &str) -> Result<bool> {
        lease::release_lease(&self.fetcher.remote, &self.name, holder).await
    }

    /// Opens the workspace for a read-write mount at `mountpoint`.
    ///
    /// With `keep_numbers`, the mount's inode numbers are kept on disk as
    /// it runs, for a daemon started after this one is killed
    /// ([`Workspace::open_handed_over`] with no image).
    pub async fn open_mount(&self, mountpoint: &Path, steal: bool, keep_numbers: bool) -> Result<MountedWorkspace> {
        mounted::open_mount(&self.fetcher, &self.name, mountpoint, steal, None, keep_numbers).await
    }

    /// [`Workspace::open_mount`] by a daemon taking over the mount that
    /// another one served at `mountpoint` (see [`mounted::HandedOver`]).
    pub async fn open_handed_over(&self, mountpoint: &Path, handed: HandedOver) -> Result<MountedWorkspace> {
        mounted::open_mount(&self.fetcher, &self.name, mountpoint, false, Some(handed), true).await
    }

    /// The saved state of a mount of the workspace on this machine that
    /// may hold changes no checkpoint has.
    pub fn uncheckpointed_mount_state(&self) -> Result<Option<MountState>> {
        machine::uncheckpointed_mount_state(&self.fetcher, &self.name)
    }

    /// Removes this machine's state folder of the workspace when it holds
    /// no work (no saved overlay).
    pub fn forget_unused_mount_state(&self) -> Result<()> {
        machine::forget_unused_mount_state(&self.fetcher, &self.name)
    }

    /// Where the workspace was last mounted on this machine (the caller
    /// checks that a mount is there now).
    pub fn last_mounted_at(&self) -> Option<PathBuf> {
        machine::last_mounted_at(&self.fetcher, &self.name)
    }

    /// For `ws rm`: holds the workspace's state here so no mount starts
    /// while it is removed; `Err` names where it is mounted now.
    pub fn lock_for_removal(&self) -> Result<MountLock> {
        machine::lock_for_removal(&self.fetcher, &self.name)
    }

    /// The lease holder id a mount of the workspace here took, if any.
    pub fn local_mount_holder(&self) -> Option<String> {
        machine::local_mount_holder(&self.fetcher, &self.name)
    }

    /// After `ws rm`: this machine's saved state of the workspace is set
    /// aside when it may hold work no checkpoint has (returned), else
    /// deleted.
    pub fn set_aside_removed(&self, held: &MountLock) -> Result<Option<PathBuf>> {
        machine::set_aside_removed(&self.fetcher, &self.name, held)
    }

    /// At a mount's end: sets `state_dir` aside if the workspace was
    /// removed meanwhile.
    pub async fn set_aside_if_removed(&self, state_dir: &Path) -> Result<Option<PathBuf>> {
        machine::set_aside_if_removed(&self.fetcher, &self.name, state_dir).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::DiskCache;
    use crate::error::Error;
    use crate::hash::{Hash, SnapshotId, TreeId};
    use crate::object::{Snapshot, Tree};
    use crate::store::{Remote, Space};
    use bytes::Bytes;

    /// A store holding one snapshot of the empty tree, and a fetcher of it.
    async fn store_with_a_snapshot(dir: &Path) -> (Arc<Fetcher>, SnapshotId) {
        let url = format!("file://{}/store", dir.display());
        let remote = Arc::new(Remote::open(&url, &Default::default()).unwrap());
        let tree = Tree { entries: vec![] }.encode();
        let root = Hash::of(&tree);
        remote.put_object(Space::Objects, &root, Bytes::from(tree)).await.unwrap();
        let snap = Snapshot {
            root: TreeId::from_hash(root),
            parents: vec![],
            time: 1_700_000_000,
            author: "a".into(),
            message: "m".into(),
            source: String::new(),
            stat: None,
            stat_layers: vec![],
        }
        .encode();
        let id = SnapshotId::from_hash(Hash::of(&snap));
        remote.put_object(Space::Snapshots, &id, Bytes::from(snap)).await.unwrap();
        let cache = Arc::new(DiskCache::open(dir.join("cache"), None).unwrap());
        (Fetcher::new(remote, cache), id)
    }

    #[tokio::test]
    async fn a_handle_names_one_workspace_from_its_ref_to_its_removal() {
        let dir = tempfile::tempdir().unwrap();
        let (f, id) = store_with_a_snapshot(dir.path()).await;
        for bad in ["a~1", "../x", ""] {
            assert!(Workspace::new(&f, bad).is_err(), "{bad:?} was taken as a name");
        }
        let ws = Workspace::new(&f, "one").unwrap();
        assert_eq!(ws.name(), "one");
        let other = Workspace::new(&f, "two").unwrap();
        let v = ws.create_ref(&id.to_hex()).await.unwrap();
        assert_eq!(v.snapshot, id);
        assert_eq!(f.remote.read_ref("ws/one").await.unwrap().unwrap().0, v);
        assert!(f.remote.read_ref("ws/two").await.unwrap().is_none());
        let again = ws.create_ref(&id.to_hex()).await.unwrap_err();
        assert!(again.to_string().contains("workspace one already exists"), "{again}");
        // No lease is held, so a check passes and a release finds nothing.
        ws.check_lease_free(false).await.unwrap();
        assert!(!ws.release_lease("nobody").await.unwrap());
        assert!(matches!(other.remove(false, None).await, Err(Error::NotFound(_))));
        ws.remove(false, None).await.unwrap();
        assert!(f.remote.read_ref("ws/one").await.unwrap().is_none());
        assert!(matches!(ws.remove(false, None).await, Err(Error::NotFound(_))));
    }
}
