//! mado's edge for mounts: the FUSE adapter ([`fs`]), the control socket
//! each mount daemon serves ([`control`]) and what it speaks ([`protocol`]), the
//! virtio-fs transport that serves the same adapter to VM guests
//! ([`virtiofs`]), and the daemon that ties a snapshot, the adapter, a
//! transport and the socket together ([`daemon`]), with its code mapped
//! before it serves ([`resident`]); a workspace mount passed to a new
//! daemon ([`handover`]) and kept through its daemon's death ([`keeper`]). The filesystem logic
//! itself is `mado_core::vfs`.

pub mod control;
pub mod daemon;
pub mod fs;
mod fuse_mount;
mod handler;
pub mod handover;
pub mod keeper;
pub mod protocol;
pub mod resident;
pub mod virtiofs;
