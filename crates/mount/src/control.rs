//! The control socket: one Unix socket per mount, through which `mado
//! pack-status` and `mado stats` ask the running daemon. Requests and
//! answers are one line of JSON each: `{"op":"pack-status"}`.
//!
//! Sockets live in `<disk cache>/mounts/`, named by a hash of the mount
//! point's absolute path, so a client finds the socket of the mount that
//! holds any directory by walking up from it. Paths are made absolute
//! without resolving them: a mount whose daemon died cannot be stat'ed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Sends one request and reads one answer (bounded waits).
pub fn request(sock: &Path, op: &str) -> std::io::Result<serde_json::Value> {
    request_with(sock, &serde_json::json!({ "op": op }), Duration::from_secs(10))
}

/// Sends request `req` (an object with at least `op`) and waits up to
/// `wait` for the answer.
pub fn request_with(sock: &Path, req: &serde_json::Value, wait: Duration) -> std::io::Result<serde_json::Value> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(wait))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}

/// Maps a request to its answer.
pub type Answer = std::sync::Arc<
    dyn Fn(serde_json::Value) -> std::pin::Pin<Box<dyn std::future::Future<Output = serde_json::Value> + Send>>
        + Send
        + Sync,
>;

/// Serves requests until the listener is dropped.
pub async fn serve(listener: tokio::net::UnixListener, answer: Answer) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    while let Ok((stream, _)) = listener.accept().await {
        let answer = answer.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut lines = tokio::io::BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let req = serde_json::from_str::<serde_json::Value>(&line).unwrap_or_default();
                let mut out = answer(req).await.to_string();
                out.push('\n');
                if w.write_all(out.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}
