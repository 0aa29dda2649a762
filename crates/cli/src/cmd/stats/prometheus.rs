//! `mado stats --prometheus ADDR`: every daemon's counters in Prometheus'
//! text exposition format (version 0.0.4) at `http://ADDR/metrics`, asked
//! afresh on every scrape. A minimal HTTP/1.1 server: one request per
//! connection, GET only.

use super::all::{collect, label, Fleet};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A request's head larger than this is refused.
const MAX_HEAD: usize = 8 << 10;

pub async fn serve(addr: SocketAddr) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
    let at = listener.local_addr()?;
    println!("serving metrics at http://{at}/metrics (Ctrl-C stops)");
    use std::io::Write as _;
    std::io::stdout().flush()?;
    loop {
        let (conn, _) = listener.accept().await?;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(30), answer(conn)).await;
        });
    }
}

async fn answer(mut conn: tokio::net::TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics") => match tokio::task::spawn_blocking(collect).await {
            Ok(Ok(fleet)) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(&fleet)),
            Ok(Err(e)) => ("500 Internal Server Error", "text/plain", format!("{e:#}\n")),
            Err(e) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "GET /metrics only\n".into()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The metrics of `fleet`, one family after another.
pub fn render(fleet: &Fleet) -> String {
    type Get = fn(&super::all::Seen) -> Option<f64>;
    let families: [(&str, &str, &str, Get); 15] = [
        ("mado_remote_gets_total", "counter", "GETs sent to the store (ranged or not)", |m| {
            Some(m.stats.remote.all_gets() as f64)
        }),
        ("mado_remote_heads_total", "counter", "HEADs sent to the store", |m| Some(m.stats.remote.heads as f64)),
        ("mado_remote_puts_total", "counter", "PUTs sent to the store", |m| Some(m.stats.remote.puts as f64)),
        ("mado_remote_bytes_down_total", "counter", "bytes read from the store", |m| {
            Some(m.stats.remote.bytes_down as f64)
        }),
        ("mado_remote_bytes_up_total", "counter", "bytes written to the store", |m| {
            Some(m.stats.remote.bytes_up as f64)
        }),
        ("mado_cache_hits_total", "counter", "reads the disk cache answered", |m| Some(m.stats.cache.hits as f64)),
        ("mado_cache_misses_total", "counter", "reads the disk cache could not answer", |m| {
            Some(m.stats.cache.misses as f64)
        }),
        ("mado_reads_total", "counter", "file reads served", |m| Some(m.stats.reads as f64)),
        ("mado_lookups_total", "counter", "LOOKUP requests from the kernel", |m| Some(m.stats.lookups as f64)),
        ("mado_ioctls_total", "counter", "IOCTL requests from the kernel (isatty of a file)", |m| {
            Some(m.stats.ioctls as f64)
        }),
        ("mado_getattrs_total", "counter", "GETATTR requests from the kernel", |m| Some(m.stats.getattrs as f64)),
        ("mado_nodes_in_memory", "gauge", "inodes the daemon holds", |m| Some(m.stats.nodes_in_memory as f64)),
        ("mado_private_memory_bytes", "gauge", "the daemon's private resident memory (RssAnon)", |m| {
            m.private_bytes.map(|b| b as f64)
        }),
        ("mado_uptime_seconds", "gauge", "time since the daemon started", |m| Some(m.stats.uptime_ms as f64 / 1000.0)),
        ("mado_workspace_changes", "gauge", "changes to a workspace since it was mounted", |m| {
            m.stats.workspace.as_ref().map(|w| w.changes as f64)
        }),
    ];
    let mut out = String::new();
    for (name, kind, help, get) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for m in &fleet.mounts {
            if let Some(v) = get(m) {
                let s = &m.stats;
                let _ = writeln!(
                    out,
                    "{name}{{mount=\"{}\",what=\"{}\",pid=\"{}\"}} {v}",
                    escape(&s.mountpoint.display().to_string()),
                    escape(&label(s)),
                    s.pid
                );
            }
        }
    }
    let _ = writeln!(out, "# HELP mado_daemons_not_answering control sockets whose daemon did not answer");
    let _ = writeln!(out, "# TYPE mado_daemons_not_answering gauge");
    let _ = writeln!(out, "mado_daemons_not_answering {}", fleet.not_answering.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn an_empty_fleet_still_says_so() {
        let text = render(&Fleet::default());
        assert!(text.contains("# TYPE mado_remote_gets_total counter"));
        assert!(text.ends_with("mado_daemons_not_answering 0\n"), "{text}");
    }
}
