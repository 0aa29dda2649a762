//! `latency-proxy`: a TCP proxy for loopback benchmarks. Each direction of
//! each connection is delayed by RTT/2, bytes kept in order (a chunk read
//! at t is written at t + RTT/2); a new connection pays one more RTT before
//! its first bytes go upstream, as a TCP handshake would. It counts
//! connections and bytes, and with `--http` parses the client's HTTP/1.1
//! requests (request line, headers, Content-Length or chunked bodies) to
//! count requests by method and ranged GETs.
//!
//! ```text
//! latency-proxy --upstream 127.0.0.1:9000 [--listen 127.0.0.1:0] [--rtt-ms 20] [--http]
//! ```
//!
//! With `LATENCY_PROXY_LOG` set (and `--http`), it prints each request's
//! line and range to stderr, prefixed by the time in ms (mod 100 s).
//!
//! It prints one JSON line, `{"port":P,"control":C}`, once listening. The
//! control port takes one command per connection and answers one JSON
//! line: `stats`, `reset` (answers the counts, then zeroes them), or
//! `rtt N` (sets the RTT in milliseconds for data read from then on).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    ranged_gets: AtomicU64,
    methods: Mutex<BTreeMap<String, u64>>,
    rtt_us: AtomicU64,
}

impl Counters {
    fn json(&self) -> serde_json::Value {
        let methods = self.methods.lock().expect("methods lock").clone();
        let requests: u64 = methods.values().sum();
        serde_json::json!({
            "connections": self.connections.load(Relaxed),
            "requests": requests,
            "methods": methods,
            "ranged_gets": self.ranged_gets.load(Relaxed),
            "bytes_up": self.bytes_up.load(Relaxed),
            "bytes_down": self.bytes_down.load(Relaxed),
            "rtt_ms": self.rtt_us.load(Relaxed) as f64 / 1000.0,
        })
    }

    fn reset(&self) {
        self.connections.store(0, Relaxed);
        self.bytes_up.store(0, Relaxed);
        self.bytes_down.store(0, Relaxed);
        self.ranged_gets.store(0, Relaxed);
        self.methods.lock().expect("methods lock").clear();
    }

    fn half_rtt(&self) -> Duration {
        Duration::from_micros(self.rtt_us.load(Relaxed) / 2)
    }
}

/// Where an HTTP/1.1 request stream is.
enum Http {
    Head(Vec<u8>),
    Body(u64),
    /// Inside a chunked body: reading a size line.
    ChunkSize(Vec<u8>),
    /// Chunk data left, then its CRLF.
    ChunkData(u64),
    /// After the last chunk: trailer lines until an empty one.
    Trailer(Vec<u8>),
}

/// Feeds client bytes through the request parser, counting requests.
fn parse(state: &mut Http, mut data: &[u8], c: &Counters) {
    while !data.is_empty() {
        match state {
            Http::Head(buf) => {
                let start = buf.len().saturating_sub(3);
                buf.extend_from_slice(data);
                data = &[];
                let Some(end) = find(&buf[start..], b"\r\n\r\n").map(|i| start + i + 4) else {
                    if buf.len() > 1 << 20 {
                        // Not HTTP after all: stop parsing.
                        *state = Http::Body(u64::MAX);
                    }
                    continue;
                };
                let rest = buf[end..].to_vec();
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let mut lines = head.split("\r\n");
                let request = lines.next().unwrap_or("");
                let method = request.split(' ').next().unwrap_or("").to_string();
                let (mut len, mut chunked, mut range) = (0u64, false, None);
                for l in lines {
                    let Some((k, v)) = l.split_once(':') else { continue };
                    let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                    match k.as_str() {
                        "content-length" => len = v.parse().unwrap_or(0),
                        "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
                        "range" => range = Some(v),
                        _ => {}
                    }
                }
                if std::env::var_os("LATENCY_PROXY_LOG").is_some() {
                    // One line per request (its request line and range), for
                    // seeing what a client asks for.
                    let ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis();
                    let range = range.map(|r| format!("range: {r}")).unwrap_or_default();
                    eprintln!("{} {request} {range}", ms % 100_000);
                }
                if method == "GET" && range.is_some() {
                    c.ranged_gets.fetch_add(1, Relaxed);
                }
                *c.methods.lock().expect("methods lock").entry(method).or_default() += 1;
                *state = if chunked { Http::ChunkSize(Vec::new()) } else { Http::Body(len) };
                parse(state, &rest, c);
            }
            Http::Body(n) => {
                if *n == u64::MAX {
                    return;
                }
                let take = (*n).min(data.len() as u64) as usize;
                *n -= take as u64;
                data = &data[take..];
                if *n == 0 {
                    *state = Http::Head(Vec::new());
                }
            }
            Http::ChunkSize(line) => {
                let (b, rest) = (data[0], &data[1..]);
                data = rest;
                line.push(b);
                if line.ends_with(b"\r\n") {
                    let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
                    let size = u64::from_str_radix(text.split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
                    *state = if size == 0 { Http::Trailer(Vec::new()) } else { Http::ChunkData(size + 2) };
                }
            }
            Http::ChunkData(n) => {
                let take = (*n).min(data.len() as u64) as usize;
                *n -= take as u64;
                data = &data[take..];
                if *n == 0 {
                    *state = Http::ChunkSize(Vec::new());
                }
            }
            Http::Trailer(line) => {
                let (b, rest) = (data[0], &data[1..]);
                data = rest;
                line.push(b);
                if line.ends_with(b"\r\n") {
                    if line.len() == 2 {
                        *state = Http::Head(Vec::new());
                    } else {
                        line.clear();
                    }
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Copies `from` to `to`, each chunk delivered RTT/2 after it was read
/// (plus `first_extra` for the first one).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    c: Arc<Counters>,
    up: bool,
    http: bool,
    first_extra: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut state = Http::Head(Vec::new());
    let mut buf = vec![0u8; 256 << 10];
    let mut extra = first_extra;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let due = Instant::now() + c.half_rtt() + extra;
        extra = Duration::ZERO;
        if up {
            c.bytes_up.fetch_add(n as u64, Relaxed);
            if http {
                parse(&mut state, &buf[..n], &c);
            }
        } else {
            c.bytes_down.fetch_add(n as u64, Relaxed);
        }
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn serve_conn(client: TcpStream, upstream: String, c: Arc<Counters>, http: bool) {
    c.connections.fetch_add(1, Relaxed);
    let Ok(server) = TcpStream::connect(&upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // The handshake a real network would cost: one RTT before the first
    // request bytes can leave.
    let handshake = c.half_rtt() * 2;
    let a = tokio::spawn(pump(cr, sw, c.clone(), true, http, handshake));
    let b = tokio::spawn(pump(sr, cw, c.clone(), false, http, Duration::ZERO));
    let _ = tokio::join!(a, b);
}

async fn control(listener: TcpListener, c: Arc<Counters>) {
    while let Ok((s, _)) = listener.accept().await {
        let c = c.clone();
        tokio::spawn(async move {
            let (r, mut w) = s.into_split();
            let mut line = String::new();
            if BufReader::new(r).read_line(&mut line).await.is_err() {
                return;
            }
            let cmd: Vec<&str> = line.split_whitespace().collect();
            let out = match cmd.as_slice() {
                ["stats"] => c.json(),
                ["reset"] => {
                    let v = c.json();
                    c.reset();
                    v
                }
                ["rtt", ms] => match ms.parse::<f64>() {
                    Ok(ms) => {
                        c.rtt_us.store((ms * 1000.0) as u64, Relaxed);
                        c.json()
                    }
                    Err(_) => serde_json::json!({ "error": "rtt takes milliseconds" }),
                },
                _ => serde_json::json!({ "error": "commands: stats, reset, rtt N" }),
            };
            let _ = w.write_all(format!("{out}\n").as_bytes()).await;
        });
    }
}

fn usage() -> ! {
    eprintln!("usage: latency-proxy --upstream HOST:PORT [--listen ADDR] [--rtt-ms N] [--http]");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (mut upstream, mut listen, mut rtt, mut http) = (None, "127.0.0.1:0".to_string(), 0f64, false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--upstream" => upstream = args.next(),
            "--listen" => listen = args.next().unwrap_or_else(|| usage()),
            "--rtt-ms" => rtt = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()),
            "--http" => http = true,
            _ => usage(),
        }
    }
    let upstream = upstream.unwrap_or_else(|| usage());
    let c = Arc::new(Counters::default());
    c.rtt_us.store((rtt * 1000.0) as u64, Relaxed);
    let (l, ctl) = match (TcpListener::bind(&listen).await, TcpListener::bind("127.0.0.1:0").await) {
        (Ok(l), Ok(ctl)) => (l, ctl),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("latency-proxy: cannot listen on {listen}: {e}");
            std::process::exit(1)
        }
    };
    let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
    let cport = ctl.local_addr().map(|a| a.port()).unwrap_or(0);
    println!("{}", serde_json::json!({ "port": port, "control": cport }));
    tokio::spawn(control(ctl, c.clone()));
    while let Ok((s, _)) = l.accept().await {
        tokio::spawn(serve_conn(s, upstream.clone(), c.clone(), http));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_requests_across_split_reads_and_bodies() {
        let c = Counters::default();
        let mut st = Http::Head(Vec::new());
        let stream = b"GET /a HTTP/1.1\r\nRange: bytes=0-9\r\n\r\nPUT /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloPOST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nHEAD /d HTTP/1.1\r\n\r\n";
        // Byte by byte and all at once give the same counts.
        for b in stream.iter() {
            parse(&mut st, std::slice::from_ref(b), &c);
        }
        let mut st = Http::Head(Vec::new());
        parse(&mut st, stream, &c);
        let m = c.methods.lock().unwrap().clone();
        assert_eq!(m.get("GET"), Some(&2));
        assert_eq!(m.get("PUT"), Some(&2));
        assert_eq!(m.get("POST"), Some(&2));
        assert_eq!(m.get("HEAD"), Some(&2));
        assert_eq!(c.ranged_gets.load(Relaxed), 2);
    }

    #[tokio::test]
    async fn delays_each_direction_by_half_the_rtt() {
        // An echo server behind the proxy at RTT 40 ms: connect + one
        // exchange costs the handshake RTT plus one RTT.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let eaddr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
        });
        let c = Arc::new(Counters::default());
        c.rtt_us.store(40_000, Relaxed);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let c2 = c.clone();
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            serve_conn(s, eaddr.to_string(), c2, false).await;
        });
        let t = std::time::Instant::now();
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        let el = t.elapsed();
        assert_eq!(&b, b"ping");
        assert!(el >= Duration::from_millis(80), "{el:?}");
        assert!(el < Duration::from_millis(400), "{el:?}");
        assert_eq!(c.bytes_up.load(Relaxed), 4);
        assert_eq!(c.bytes_down.load(Relaxed), 4);
    }
}
