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
    if expired {
        format!(
            "workspace {name} is leased by {who}; the lease expired at {}.\n  \
             hint: run again with --steal to take it (its checkpoints stay), or `mado ws release {name}` on the holder",
            local_time(expires)
        )
    } else {
        format!(
            "workspace {name} is leased by {who} until {}.\n  \
             hint: `mado ws release {name}` (or unmount) on the holder; --steal once it has expired; \
             or `mado ws resume --read-only` for a copy that will not checkpoint",
            local_time(expires)
        )
    }
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
            // The machine's to fix, not mado's: a full disk, a read-only
            // or forbidden place (the message names it).
            Error::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EACCES | libc::EPERM)
            ),
            _ => false,
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
