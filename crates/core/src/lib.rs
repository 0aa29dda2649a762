//! mado's core library: objects and their formats, the remote store and
//! its wrappers, the disk cache, the fetcher, git import and checkout. No
//! FUSE and no command-line parsing live here (see docs/DESIGN.md).

pub mod bufpool;
pub mod cache;
pub mod checkout;
pub mod chunk;
pub mod codec;
pub mod diff;
pub mod error;
pub mod failpoint;
pub mod fetch;
pub mod fsutil;
pub mod gc;
pub mod hash;
pub mod ignore_rules;
pub mod import;
pub mod materialize;
pub mod memory;
pub mod object;
pub mod pack;
pub mod priority;
pub mod publish;
pub mod resolve;
pub mod store;
pub mod upload;
pub mod vfs;
pub mod workspace;

#[cfg(test)]
mod testutil;

pub use error::{Error, Result};
pub use hash::{Hash, SnapshotId, TreeId};
