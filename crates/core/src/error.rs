//! The core library's error type. Variants are the distinctions a caller
//! acts on (retry, report corruption, tell the user to fix input); each
//! carries the object id, key or path it is about.

use crate::codec::DecodeError;
use crate::hash::Hash;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An object the operation needs is not in the store.
    #[error("object {id} ({what}) not found in the store{}", at(path))]
    ObjectMissing { id: Hash, what: &'static str, path: String },

    /// Bytes whose hash does not match their key, or that do not decode.
    #[error("object {id} ({what}) is corrupt{}: {detail}", at(path))]
    Corrupt { id: Hash, what: &'static str, path: String, detail: String },

    /// A ref, path or snapshot the user named does not exist.
    #[error("{0}")]
    NotFound(String),

    /// Input the user gave is wrong; the message says how to fix it.
    #[error("{0}")]
    User(String),

    /// Another process has the store for a while (`mado gc` sweeping):
    /// nothing is wrong, and the same command later will do.
    #[error("{0}")]
    Busy(String),

    /// A compare-and-swap lost: the ref moved since it was read.
    #[error("ref {name} moved (expected {expected}, found {found}); re-read it and retry")]
    RefMoved { name: String, expected: String, found: String },

    /// A tree that would write outside the target or through a symlink.
    #[error("refusing unsafe path {path:?}: {reason}")]
    UnsafePath { path: String, reason: String },

    /// The remote could not be reached or refused the request.
    #[error("remote {url}: {op} {key} failed: {source}\n  hint: {hint}")]
    Remote {
        url: String,
        op: &'static str,
        key: String,
        hint: String,
        #[source]
        source: Box<object_store::Error>,
    },

    /// A workspace's single-writer lease is held by another working copy.
    #[error("{}", lease_message(name, holder, *expires, *expired))]
    LeaseHeld { name: String, holder: String, expires: i64, expired: bool },

    #[error("git: {0}")]
    Git(String),

    /// mado's own local state (a working copy's `.mado`, a mount's saved
    /// state) cannot be read or written; the message says what to do.
    #[error("{path}: {detail}")]
    LocalState { path: String, detail: String },

    /// An error and the steps that get the user past it, as data (the
    /// CLI words them as `hint:` lines; see [`Next`]).
    #[error("{error}")]
    Then { error: Box<Error>, next: Vec<Next> },

    /// A broken invariant: a bug in mado, never the user's doing.
    #[error("internal error (a bug in mado, please report it): {0}")]
    Internal(String),

    /// A filesystem operation refused, with the errno a mount answers.
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*errno))]
    Fs { errno: i32, what: String },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// Seconds since the epoch as local time (`2026-11-23 18:04:05 +01:00`).
pub fn local_time(secs: i64) -> String {
    match jiff::Timestamp::from_second(secs) {
        Ok(t) => t.to_zoned(jiff::tz::TimeZone::system()).strftime("%Y-%m-%d %H:%M:%S %:z").to_string(),
        Err(_) => format!("{secs} (unix time)"),
    }
}

fn lease_message(name: &str, holder: &str, expires: i64, expired: bool) -> String {
    let who = describe_holder(holder);
    match expired {
        true => format!("workspace {name} is leased by {who}; the lease expired at {}", local_time(expires)),
        false => format!("workspace {name} is leased by {who} until {}", local_time(expires)),
    }
}

/// Something a command reports and goes on from: what happened, and the
/// steps that would help (worded by the CLI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub text: String,
    pub next: Vec<Next>,
}

impl From<String> for Warning {
    fn from(text: String) -> Warning {
        Warning { text, next: Vec::new() }
    }
}

/// A step that gets the user past an error or a warning, with what it
/// needs to be taken; the CLI words it (and names the command). The core
/// says what happened and what would help, never how to type it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Next {
    /// The history of `base`, to pick an older snapshot that exists.
    Log { base: String },
    /// The store's refs, and a ref's snapshot ids.
    ListRefs,
    /// A store that could not be asked: a full snapshot id is read from
    /// the cache alone (a short one needs the store).
    FullIdOffline,
    /// An empty store: import a repository into it.
    ImportGit,
    /// The snapshot's objects are not in the cache: materialize it.
    Materialize,
    /// The directory is no working copy: create a workspace.
    CreateWorkspace,
    /// The store's workspaces.
    ListWorkspaces,
    /// Workspace `name` exists: resume it to get a working copy.
    ResumeExisting { name: String },
    /// A resume into `dir` was interrupted: run it again, or release the
    /// lease it took.
    FinishResume { name: String, dir: String },
    /// `name` named a checkpoint (`ws~1`): check it out, or start a
    /// workspace from it.
    CheckpointOfWorkspace { name: String },
    /// The lease's holder can release it, or unmount.
    ReleaseOnHolder { name: String },
    /// Take the lease (`--steal`): at once when it expired, else once it
    /// has.
    Steal { expired: bool },
    /// A read-only copy needs no lease.
    ReadOnlyCopy,
    /// The working copy holding the lease releases it (or unmounts), or
    /// the workspace is removed anyway.
    ReleaseOrForceRemove { name: String },
    /// A workspace served to a guest by a virtio-fs server here: stop it
    /// first.
    StopServer,
    /// Mounted at `at` already: work there, or unmount it first.
    UseOrUnmount { at: String },
    /// A mount at `at` whose daemon is gone: unmount it.
    UnmountDead { at: String },
    /// A path too long to check out: a subtree, or a mount.
    SubtreeOrMount,
    /// The workspace moved on elsewhere: resume it there, or checkpoint
    /// over it.
    ResumeOrForce,
    /// Another checkpoint won: checkpoint again, on top of it.
    CheckpointAgain,
    /// The workspace's ref is gone but its checkpoint `from` is in the
    /// store: make it again there (without a checkout), then checkpoint.
    RecreateAt { name: String, from: String },
    /// The workspace's ref and its checkpoint are gone: make it again
    /// from any snapshot, then checkpoint this copy over it.
    RecreateAndForce { name: String },
    /// The folders of set-aside changes.
    ListSetAside,
    /// The set-aside changes in `aside`, as a workspace of their own.
    RecoverAside { aside: String },
    /// The files of the set-aside changes in `aside`, written to a folder.
    RecoverTo { aside: String },
    /// A workspace's own saved changes come back with a mount of it.
    ResumeMount { name: String },
    /// Checkpoint a mount's unsaved work before resuming elsewhere, or
    /// resume anyway.
    MountFirstOrIgnore { name: String },
    /// A workspace's ref moves only under its lease: import elsewhere and
    /// start a workspace from that ref.
    WorkspaceFromRef,
    /// An empty store: make it.
    InitStore { url: String },
    /// The packs of an import could not be published: pack again.
    RepackRecursive,
}

/// `user@host:/path:nonce` as "user on host (working copy /path)".
pub fn describe_holder(h: &str) -> String {
    match holder_parts(h) {
        Some((user, host, path)) => format!("{user} on {host} (working copy {path})"),
        None => h.to_string(),
    }
}

/// The user, host and directory of lease holder id `user@host:DIR:nonce`
/// (`DIR` may itself hold `:`).
pub fn holder_parts(h: &str) -> Option<(&str, &str, &str)> {
    let (user, rest) = h.split_once('@')?;
    let (host, rest) = rest.split_once(':')?;
    let (path, _nonce) = rest.rsplit_once(':')?;
    Some((user, host, path))
}

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" (needed for {path:?})")
    }
}

impl Error {
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    pub fn corrupt(id: Hash, what: &'static str, path: &str, e: DecodeError) -> Error {
        Error::Corrupt { id, what, path: path.to_string(), detail: e.to_string() }
    }

    /// True for errors caused by what the user asked for (exit code 1).
    pub fn is_user_error(&self) -> bool {
        match self {
            Error::NotFound(_)
            | Error::User(_)
            | Error::RefMoved { .. }
            | Error::UnsafePath { .. }
            | Error::LeaseHeld { .. }
            | Error::LocalState { .. } => true,
            Error::Then { error, .. } => error.is_user_error(),
            // The machine's to fix, not mado's: a full disk, a read-only
            // or forbidden place (the message names it).
            Error::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EACCES | libc::EPERM)
            ),
            _ => false,
        }
    }

    /// `self`, and then `step` (after any it has).
    pub fn then(self, step: Next) -> Error {
        match self {
            Error::Then { error, mut next } => {
                next.push(step);
                Error::Then { error, next }
            }
            error => Error::Then { error: Box::new(error), next: vec![step] },
        }
    }

    /// The error itself, without the steps added to it.
    pub fn base(&self) -> &Error {
        match self {
            Error::Then { error, .. } => error.base(),
            e => e,
        }
    }

    /// The error itself, owned.
    pub fn into_base(self) -> Error {
        match self {
            Error::Then { error, .. } => error.into_base(),
            e => e,
        }
    }

    /// Whether the thing asked for does not exist ([`Error::NotFound`]).
    pub fn is_not_found(&self) -> bool {
        matches!(self.base(), Error::NotFound(_))
    }

    /// The steps that get the user past this error: those added with
    /// [`Error::then`], and a held lease's.
    pub fn next_steps(&self) -> Vec<Next> {
        match self {
            Error::Then { error, next } => {
                let mut v = error.next_steps();
                v.extend(next.iter().cloned());
                v
            }
            Error::LeaseHeld { name, expired: true, .. } => {
                vec![Next::Steal { expired: true }, Next::ReleaseOnHolder { name: name.clone() }]
            }
            Error::LeaseHeld { name, expired: false, .. } => {
                vec![Next::ReleaseOnHolder { name: name.clone() }, Next::Steal { expired: false }, Next::ReadOnlyCopy]
            }
            _ => Vec::new(),
        }
    }

    /// A full disk or quota (ENOSPC, EDQUOT) under a local write.
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)))
    }

    /// A problem of mado's own local state at `path`.
    pub fn local_state(path: &std::path::Path, detail: impl Into<String>) -> Error {
        Error::LocalState { path: path.display().to_string(), detail: detail.into() }
    }

    /// A refused filesystem operation (`errno` as in libc).
    pub fn fs(errno: rustix::io::Errno, what: impl Into<String>) -> Error {
        Error::Fs { errno: errno.raw_os_error(), what: what.into() }
    }

    /// Adds the path an object was needed for, if the error names none yet.
    pub fn at_path(self, p: &str) -> Error {
        match self {
            Error::ObjectMissing { id, what, path } if path.is_empty() => {
                Error::ObjectMissing { id, what, path: p.to_string() }
            }
            Error::Corrupt { id, what, path, detail } if path.is_empty() => {
                Error::Corrupt { id, what, path: p.to_string(), detail }
            }
            Error::Then { error, next } => Error::Then { error: Box::new(error.at_path(p)), next },
            e => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_or_a_forbidden_place_is_the_users_to_fix_other_io_is_not() {
        let io = |errno| Error::Io { context: "writing x".into(), source: std::io::Error::from_raw_os_error(errno) };
        for e in [libc::ENOSPC, libc::EDQUOT, libc::EROFS, libc::EACCES, libc::EPERM] {
            assert!(io(e).is_user_error(), "{e}");
        }
        for e in [libc::EIO, libc::ENOMEM, libc::EBADF] {
            assert!(!io(e).is_user_error(), "{e}");
        }
        let other = Error::Io { context: "x".into(), source: std::io::Error::other("no errno") };
        assert!(!other.is_user_error());
        assert!(Error::NotFound("x".into()).is_user_error() && Error::User("x".into()).is_user_error());
        assert!(!Error::Internal("x".into()).is_user_error());
    }
}
