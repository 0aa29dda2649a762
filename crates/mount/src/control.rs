//! The control socket: one Unix socket per mount, through which `mado
//! pack-status`, `mado stats` and `mado ws checkpoint` ask the running
//! daemon. What they say is [`crate::protocol`].
//!
//! Sockets live in the user's runtime directory (`$XDG_RUNTIME_DIR/mado`,
//! else `/run/user/UID/mado`, else `/tmp/mado-UID`, each private to the
//! user), named by a hash of the mount point's absolute path, so a client
//! finds the socket of the mount that holds any directory by walking up
//! from it, and the path stays short whatever the cache's path (a Unix
//! socket's path must fit in 108 bytes). Paths are made absolute without
//! resolving them: a mount whose daemon died cannot be stat'ed. Daemon logs
//! go to `$XDG_STATE_HOME/mado/logs` (`~/.local/state/mado/logs`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::protocol::{decode_request, Reply, Request};

/// The longest socket path this module makes (sun_path is 108 bytes,
/// with its NUL).
const MAX_SOCKET_PATH: usize = 100;

/// A socket name: 24 hex digits, `ws-` and `.sock` at most.
const NAME_LEN: usize = 3 + 24 + 5;

/// A private directory of this user's at `dir` (made 0700 if missing, and
/// made 0700 again if others may read or search it); refused if another
/// user owns it or others may write to it (what they put there stays).
fn private_dir(dir: &Path) -> std::io::Result<PathBuf> {
    match std::fs::create_dir(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if m.is_dir() && m.uid() == me && m.mode() & 0o077 != 0 && m.mode() & 0o022 == 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of this user's (owner {}, mode {:o}); remove it or set XDG_RUNTIME_DIR",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(dir.to_path_buf())
}

/// The folder for the control sockets of running mounts.
pub fn runtime_dir() -> std::io::Result<PathBuf> {
    let uid = rustix::process::geteuid().as_raw();
    let mut candidates = Vec::new();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        candidates.push(PathBuf::from(x).join("mado"));
    }
    let run_user = PathBuf::from(format!("/run/user/{uid}"));
    if run_user.is_dir() {
        candidates.push(run_user.join("mado"));
    }
    candidates.push(std::env::temp_dir().join(format!("mado-{uid}")));
    candidates.push(PathBuf::from(format!("/tmp/mado-{uid}")));
    let mut last = None;
    for c in candidates {
        if c.as_os_str().len() + 1 + NAME_LEN > MAX_SOCKET_PATH {
            last = Some(std::io::Error::other(format!("{} is too long for a socket path", c.display())));
            continue;
        }
        match c.parent().filter(|p| p.is_dir()).map(|_| private_dir(&c)) {
            Some(Ok(d)) => return Ok(d),
            Some(Err(e)) => last = Some(e),
            None => {}
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no directory for control sockets; set XDG_RUNTIME_DIR")))
}

/// The folder of the daemons' logs: `$XDG_STATE_HOME/mado/logs`, else
/// `~/.local/state/mado/logs`.
pub fn log_dir() -> std::io::Result<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => {
            let home = std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .ok_or_else(|| std::io::Error::other("HOME is not set; set HOME or XDG_STATE_HOME"))?;
            PathBuf::from(home).join(".local").join("state")
        }
    };
    let dir = base.join("mado").join("logs");
    mado_core::fsutil::create_private_dir(&dir).map_err(std::io::Error::other)?;
    Ok(dir)
}

fn key(mountpoint: &Path) -> String {
    blake3::hash(mountpoint.as_os_str().as_encoded_bytes()).to_hex()[..24].to_string()
}

/// The absolute, lexically normalized form of `p`.
pub fn absolute(p: &Path) -> std::io::Result<PathBuf> {
    let abs = std::path::absolute(p)?;
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    Ok(out)
}

pub fn socket_path(mountpoint: &Path) -> std::io::Result<PathBuf> {
    Ok(runtime_dir()?.join(format!("{}.sock", key(mountpoint))))
}

/// Where a daemon serving workspace `name` of `remote` without a directory
/// on this machine (to a VM guest) links its control socket.
pub fn workspace_socket_path(remote: &str, name: &str) -> std::io::Result<PathBuf> {
    let key = blake3::hash(format!("{remote}\0{name}").as_bytes()).to_hex()[..24].to_string();
    Ok(runtime_dir()?.join(format!("ws-{key}.sock")))
}

pub fn log_path(mountpoint: &Path) -> std::io::Result<PathBuf> {
    Ok(log_dir()?.join(format!("{}.log", key(mountpoint))))
}

/// The mount holding `dir` (or an ancestor) and its socket.
pub fn find_mount(dir: &Path) -> std::io::Result<Option<(PathBuf, PathBuf)>> {
    let mut p = absolute(dir)?;
    loop {
        let sock = socket_path(&p)?;
        if sock.exists() {
            return Ok(Some((p, sock)));
        }
        if !p.pop() {
            return Ok(None);
        }
    }
}

/// Sends `req` and waits up to `wait` for the reply.
pub fn request(sock: &Path, req: &Request, wait: Duration) -> std::io::Result<Reply> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(wait))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let line = serde_json::to_string(req).map_err(std::io::Error::other)?;
    writeln!(s, "{line}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}

/// Maps a request to its reply.
pub type Answer =
    std::sync::Arc<dyn Fn(Request) -> std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>> + Send + Sync>;

/// Binds a control socket at `path` (whatever was there goes: the caller
/// owns the private directory it is in), mode 0600 whatever the umask.
pub fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Whether the process at the other end of `stream` may be answered: the
/// daemon's own user, or root. Anyone else (a socket's mode and folder
/// are the first fence; this is the second) gets one error line.
fn peer_allowed(stream: &tokio::net::UnixStream) -> bool {
    let me = rustix::process::geteuid().as_raw();
    stream.peer_cred().is_ok_and(|c| c.uid() == me || c.uid() == 0)
}

/// Serves requests until the listener is dropped.
pub async fn serve(listener: tokio::net::UnixListener, answer: Answer) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    while let Ok((mut stream, _)) = listener.accept().await {
        if !peer_allowed(&stream) {
            let who = stream.peer_cred().map(|c| c.uid().to_string()).unwrap_or_else(|_| "unknown".into());
            tracing::warn!(
                "refused a control connection from uid {who}: only this mount's owner and root are answered"
            );
            let e = Reply::error("only the mount's owner and root may use its control socket", true);
            let mut out = serde_json::to_string(&e).expect("an error reply encodes");
            out.push('\n');
            tokio::spawn(async move {
                let _ = stream.write_all(out.as_bytes()).await;
            });
            continue;
        }
        let answer = answer.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut lines = tokio::io::BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = match decode_request(&line) {
                    Ok(req) => answer(req).await,
                    Err(message) => Reply::error(message, true),
                };
                let mut out = serde_json::to_string(&reply).unwrap_or_else(|e| {
                    let e = Reply::error(format!("encoding the reply: {e}"), false);
                    serde_json::to_string(&e).expect("an error reply encodes")
                });
                out.push('\n');
                if w.write_all(out.as_bytes()).await.is_err() {
                    break;
                }
                if matches!(reply, Reply::HandedOver { .. }) {
                    // The mount is the new daemon's: this one ends here,
                    // with no teardown (the lease and the lock are its).
                    let _ = w.flush().await;
                    std::process::exit(0);
                }
            }
        });
    }
}
