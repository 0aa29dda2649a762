//! The control socket: one Unix socket per mount, through which `mado
//! pack-status`, `mado stats` and `mado ws checkpoint` ask the running
//! daemon. What they say is [`crate::protocol`].
//!
//! Sockets live in `<disk cache>/mounts/`, named by a hash of the mount
//! point's absolute path, so a client finds the socket of the mount that
//! holds any directory by walking up from it. Paths are made absolute
//! without resolving them: a mount whose daemon died cannot be stat'ed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::protocol::{decode_request, Reply, Request};

/// The folder for sockets, logs and state of running mounts.
pub fn runtime_dir() -> std::io::Result<PathBuf> {
    let dir = mado_core::cache::mounts_dir().map_err(std::io::Error::other)?;
    std::fs::create_dir_all(&dir)?;
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
    Ok(runtime_dir()?.join(format!("{}.log", key(mountpoint))))
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

/// Serves requests until the listener is dropped.
pub async fn serve(listener: tokio::net::UnixListener, answer: Answer) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    while let Ok((stream, _)) = listener.accept().await {
        let answer = answer.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut lines = tokio::io::BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = match decode_request(&line) {
                    Ok(req) => answer(req).await,
                    Err(message) => Reply::Error { message, user_error: true },
                };
                let mut out = serde_json::to_string(&reply).unwrap_or_else(|e| {
                    let e = Reply::Error { message: format!("encoding the reply: {e}"), user_error: false };
                    serde_json::to_string(&e).expect("an error reply encodes")
                });
                out.push('\n');
                if w.write_all(out.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}
