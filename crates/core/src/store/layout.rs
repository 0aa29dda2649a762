//! Every key of the store, built here and nowhere else (docs/FORMAT.md,
//! "Store layout"). Keys are relative to the remote's prefix; `Remote`
//! adds it.

use crate::hash::Hash;

use super::Space;

/// Content objects (blobs, chunks, manifests, trees, stat objects).
pub const OBJECTS: &str = "objects";
/// Snapshots, apart from objects so that a short id resolves with one LIST.
pub const SNAPSHOTS: &str = "snapshots";
/// Packs, and their indexes under [`INDEXES`].
pub const PACKS: &str = "packs";
/// Pack indexes, one per tree.
pub const INDEXES: &str = "packs/index";
/// Writer and gc locks (the gc protocol).
pub const LOCKS: &str = "locks/gc";
/// Refs, by name.
const REFS: &str = "refs";
/// Workspace leases, by ref.
const LEASES: &str = "leases";

/// The folders a store holds at its top (a `file://` directory holding
/// none of them and other things is not a store).
pub const TOP_LEVEL: [&str; 6] = [OBJECTS, SNAPSHOTS, PACKS, REFS, LEASES, "locks"];

fn fanout(dir: &str, id: &Hash) -> String {
    let hex = id.to_hex();
    format!("{dir}/{}/{hex}", &hex[..2])
}

pub fn object(space: Space, id: &Hash) -> String {
    match space {
        Space::Objects => fanout(OBJECTS, id),
        Space::Snapshots => fanout(SNAPSHOTS, id),
    }
}

/// The LIST prefix of snapshots whose hex id starts with `two_hex`.
pub fn snapshot_fanout(two_hex: &str) -> String {
    format!("{SNAPSHOTS}/{two_hex}")
}

pub fn pack(id: &Hash) -> String {
    fanout(PACKS, id)
}

/// The pack index of tree `tree`.
pub fn index(tree: &Hash) -> String {
    format!("{INDEXES}/{}", tree.to_hex())
}

/// A ref (name already checked).
pub fn reference(name: &str) -> String {
    format!("{REFS}/{name}")
}

/// The lease of a workspace, by its ref (`ws/<name>`).
pub fn lease(ws_ref: &str) -> String {
    format!("{LEASES}/{ws_ref}")
}

/// A lock: `<label>.<expires>.<nonce>` (its name is all there is to it),
/// then `.<holder>` when the holder can be named (see `store::holder_tag`).
pub fn lock(label: &str, expires: i64, nonce: u64, holder: Option<&str>) -> String {
    match holder {
        Some(h) => format!("{LOCKS}/{label}.{expires}.{nonce:016x}.{h}"),
        None => format!("{LOCKS}/{label}.{expires}.{nonce:016x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout is a format: a key that moves orphans every store.
    #[test]
    fn keys_are_stable() {
        let id = Hash([0xab; 32]);
        let hex = id.to_hex();
        assert_eq!(object(Space::Objects, &id), format!("objects/ab/{hex}"));
        assert_eq!(object(Space::Snapshots, &id), format!("snapshots/ab/{hex}"));
        assert_eq!(snapshot_fanout("ab"), "snapshots/ab");
        assert_eq!(pack(&id), format!("packs/ab/{hex}"));
        assert_eq!(index(&id), format!("packs/index/{hex}"));
        assert_eq!(reference("main"), "refs/main");
        assert_eq!(lease("ws/x"), "leases/ws/x");
        assert_eq!(lock("gc", 17, 1, None), "locks/gc/gc.17.0000000000000001");
        assert_eq!(lock("writer", 17, 1, Some("b00t-42-7")), "locks/gc/writer.17.0000000000000001.b00t-42-7");
        assert_eq!(TOP_LEVEL, ["objects", "snapshots", "packs", "refs", "leases", "locks"]);
        assert!(LOCKS.starts_with(&format!("{}/", TOP_LEVEL[5])));
    }
}
