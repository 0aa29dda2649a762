//! The control protocol between a running mount and the `mado` commands
//! that ask it (`stats`, `pack-status`, `ws checkpoint`): typed, versioned
//! requests and replies, one line of JSON each way (docs/FORMAT.md,
//! "Control protocol"). The daemon and the CLI share these types, so a
//! field cannot be renamed on one side only.

use std::path::PathBuf;

use mado_core::cache::CacheStats;
use mado_core::fetch::{Attach, FetchStats};
use mado_core::store::Stats;
use mado_core::workspace::CheckpointReport;
use serde::{Deserialize, Serialize};

/// Bumped on any change a peer of the previous version would misread.
pub const VERSION: u32 = 1;

/// A request, with the protocol version it was written for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    #[serde(flatten)]
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    PackStatus,
    Stats,
    /// Checkpoint the mounted workspace (`name`, when given, must be it).
    Checkpoint {
        message: String,
        steal: bool,
        force: bool,
        name: Option<String>,
        /// Keep what ignore rules name (absent, and left out when false:
        /// the wire form of every earlier request stays as it was).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_ignore: bool,
    },
    /// What a checkpoint of the mounted workspace would record (`ws
    /// status`); changes nothing.
    Status {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_ignore: bool,
    },
    /// Hand the mount to a new daemon of the program `exe` (`mado
    /// restart`), without unmounting; this daemon then exits.
    HandOver {
        exe: std::path::PathBuf,
    },
}

impl Request {
    pub fn new(op: Op) -> Request {
        Request { v: VERSION, op }
    }
}

/// A reply. An error says whether it is the user's to fix (exit 1).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub enum Reply {
    PackStatus(PackStatus),
    Stats(Box<MountStats>),
    Checkpoint {
        report: CheckpointReport,
        remote: Stats,
    },
    Status {
        status: mado_core::workspace::Status,
    },
    /// The mount is served by daemon `to` now; daemon `from` exits.
    HandedOver {
        from: u32,
        to: u32,
    },
    /// `next`: the steps past it, as data (the CLI words them).
    Error {
        message: String,
        user_error: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        next: Vec<mado_core::error::Next>,
    },
}

impl Reply {
    /// An error reply with no step to suggest.
    pub fn error(message: impl Into<String>, user_error: bool) -> Reply {
        Reply::Error { message: message.into(), user_error, next: Vec::new() }
    }

    /// The reply for `e`: its message, whose it is to fix, its steps.
    pub fn of_error(e: &mado_core::Error) -> Reply {
        Reply::Error { message: e.base().to_string(), user_error: e.is_user_error(), next: e.next_steps() }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackStatus {
    pub mountpoint: PathBuf,
    #[serde(rename = "ref")]
    pub spec: String,
    pub snapshot: String,
    pub attached: bool,
    pub status: Attach,
    /// `status` in a sentence, with what to do about it.
    pub message: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountStats {
    pub mountpoint: PathBuf,
    #[serde(rename = "ref")]
    pub spec: String,
    pub snapshot: String,
    pub uptime_ms: u64,
    pub pid: u32,
    /// The process that keeps a workspace's FUSE mount through this
    /// daemon's death (starting another), when it has one.
    #[serde(default)]
    pub keeper_pid: Option<u32>,
    pub remote: Stats,
    pub packs: FetchStats,
    pub cache: CacheStats,
    pub reads: u64,
    pub nodes_in_memory: usize,
    /// How long requests have been stuck (the inode table's lock unavailable
    /// for over the watchdog's 10 s), while they are; `None` otherwise.
    #[serde(default)]
    pub stuck_ms: Option<u64>,
    /// Chunks of large files fetched or loaded ahead of a sequential reader.
    #[serde(default)]
    pub chunks_read_ahead: u64,
    /// Large files read whole whose whole copy was kept in the disk cache
    /// (later opens pass through to it).
    #[serde(default)]
    pub files_assembled: u64,
    pub passthrough: bool,
    /// OPEN requests the kernel sent this FUSE mount; in no-open mode (a
    /// workspace) only the first, which turns them off.
    #[serde(default)]
    pub opens: u64,
    /// LOOKUP requests the kernel sent this FUSE mount (a name it has an
    /// entry for, positive or negative, costs none until the entry expires).
    #[serde(default)]
    pub lookups: u64,
    /// IOCTL requests (answered ENOTTY: a program's isatty() of a file in
    /// the mount, one request each).
    #[serde(default)]
    pub ioctls: u64,
    /// GETATTR requests (attributes the kernel held no valid copy of: after
    /// a change, or once they expire).
    #[serde(default)]
    pub getattrs: u64,
    pub workspace: Option<WorkspaceStats>,
    /// For `mado serve-virtiofs`: the guest's FUSE requests by kind.
    #[serde(default)]
    pub virtiofs: Option<VirtioFsStats>,
}

/// What a serve-virtiofs process was asked.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VirtioFsStats {
    /// Requests taken off the virtqueues (malformed ones included).
    pub requests: u64,
    /// Malformed chains, answered by the transport itself.
    pub refused: u64,
    /// Well-formed requests by FUSE opcode name (`lookup`, `open`, ...).
    pub by_op: std::collections::BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkspaceStats {
    pub name: String,
    pub state_dir: PathBuf,
    pub reopened: bool,
    /// Changes since the mount started.
    pub changes: u64,
    /// Why the last save of the overlay state failed, while it fails.
    pub last_save_error: Option<String>,
}

/// Decodes a request line; a line of another version or an unknown op is
/// refused with the reason (a daemon started by another mado version), to
/// be sent back as an error reply.
pub fn decode_request(line: &str) -> Result<Request, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("a request that is not JSON: {e}"))?;
    if v["v"].as_u64() != Some(VERSION as u64) {
        return Err(format!(
            "this mount's daemon speaks control protocol v{VERSION}, the request is v{}; \
             remount with the same mado version as the command",
            v["v"]
        ));
    }
    serde_json::from_value(v).map_err(|e| format!("an unknown request: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire form is a format: these lines must keep decoding.
    #[test]
    fn requests_have_a_stable_wire_form() {
        let line = r#"{"v":1,"op":"checkpoint","message":"m","steal":false,"force":true,"name":null}"#;
        let r = decode_request(line).unwrap();
        let want = Op::Checkpoint { message: "m".into(), steal: false, force: true, name: None, no_ignore: false };
        assert_eq!(r, Request::new(want));
        assert_eq!(serde_json::to_string(&r).unwrap(), line);
        let line = r#"{"v":1,"op":"checkpoint","message":"m","steal":false,"force":true,"name":null,"no_ignore":true}"#;
        let r = decode_request(line).unwrap();
        assert!(matches!(r.op, Op::Checkpoint { no_ignore: true, .. }), "{r:?}");
        assert_eq!(serde_json::to_string(&r).unwrap(), line);
        assert_eq!(decode_request(r#"{"v":1,"op":"stats"}"#).unwrap().op, Op::Stats);
        assert_eq!(decode_request(r#"{"v":1,"op":"pack-status"}"#).unwrap().op, Op::PackStatus);
    }

    #[test]
    fn other_versions_and_unknown_ops_are_refused_with_a_reason() {
        for (line, says) in [
            (r#"{"v":2,"op":"stats"}"#, "protocol v1"),
            (r#"{"op":"stats"}"#, "protocol v1"),
            (r#"{"v":1,"op":"format-disk"}"#, "unknown request"),
            ("not json", "not JSON"),
        ] {
            match decode_request(line) {
                Err(message) => assert!(message.contains(says), "{line}: {message}"),
                Ok(r) => panic!("{line}: {r:?}"),
            }
        }
    }
}
