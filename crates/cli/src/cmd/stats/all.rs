//! `mado stats --all`: every daemon of this user on this machine, found by
//! its control socket, asked for its counters at once.

use anyhow::Result;
use mado_mount::protocol::{MountStats, Op, Reply, Request};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

use crate::ctx::Ctx;

/// How long one daemon may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

/// One daemon's answer, with its private memory.
#[derive(Serialize)]
pub struct Seen {
    #[serde(flatten)]
    pub stats: MountStats,
    /// The daemon's private resident memory (RssAnon), in bytes; `None`
    /// when /proc does not say.
    pub private_bytes: Option<u64>,
}

/// What a round of asking found.
#[derive(Serialize, Default)]
pub struct Fleet {
    pub mounts: Vec<Seen>,
    /// Sockets whose daemon did not answer (killed: `mado umount` of its
    /// mount point cleans up), with why.
    pub not_answering: Vec<(PathBuf, String)>,
}

/// Asks every control socket in the runtime directory, all at once.
pub fn collect() -> Result<Fleet> {
    let dir = mado_mount::control::runtime_dir()?;
    let mut socks: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "sock")).collect()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    socks.sort();
    let answers: Vec<(PathBuf, std::io::Result<Reply>)> = std::thread::scope(|s| {
        let asks: Vec<_> = socks
            .iter()
            .map(|p| (p, s.spawn(move || mado_mount::control::request(p, &Request::new(Op::Stats), ANSWER_WITHIN))))
            .collect();
        asks.into_iter()
            .map(|(p, h)| (p.clone(), h.join().unwrap_or_else(|_| Err(std::io::Error::other("asking panicked")))))
            .collect()
    });
    let mut fleet = Fleet::default();
    for (sock, answer) in answers {
        match answer {
            Ok(Reply::Stats(s)) => {
                let private_bytes = private_bytes(s.pid);
                fleet.mounts.push(Seen { stats: *s, private_bytes });
            }
            Ok(other) => fleet.not_answering.push((sock, format!("an unexpected reply: {other:?}"))),
            Err(e) => fleet.not_answering.push((sock, e.to_string())),
        }
    }
    fleet.mounts.sort_by(|a, b| a.stats.mountpoint.cmp(&b.stats.mountpoint));
    Ok(fleet)
}

/// A process's private resident memory (RssAnon), from /proc.
fn private_bytes(pid: u32) -> Option<u64> {
    crate::ctx::status_kib(&pid.to_string(), "RssAnon").map(|kib| kib * 1024)
}

/// The name a line shows for a daemon: its workspace, else its ref.
pub fn label(s: &MountStats) -> String {
    match &s.workspace {
        Some(w) => format!("ws {}", w.name),
        None => s.spec.clone(),
    }
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

pub async fn print(ctx: &Ctx) -> Result<()> {
    let fleet = tokio::task::spawn_blocking(collect).await??;
    if ctx.json {
        return ctx.print_json(&fleet);
    }
    println!(
        "{:<40} {:<20} {:>7} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10}",
        "MOUNT", "WHAT", "GETS", "DOWN MiB", "UP MiB", "HITS", "MISSES", "NODES", "MEM MiB"
    );
    let (mut gets, mut down, mut up, mut mem) = (0, 0, 0, 0);
    for m in &fleet.mounts {
        let s = &m.stats;
        let mount = s.mountpoint.display().to_string();
        let mem_text = m.private_bytes.map_or("?".into(), mib);
        println!(
            "{mount:<40} {:<20} {:>7} {:>10} {:>10} {:>8} {:>8} {:>9} {mem_text:>10}",
            label(s),
            s.remote.all_gets(),
            mib(s.remote.bytes_down),
            mib(s.remote.bytes_up),
            s.cache.hits,
            s.cache.misses,
            s.nodes_in_memory,
        );
        gets += s.remote.all_gets();
        down += s.remote.bytes_down;
        up += s.remote.bytes_up;
        mem += m.private_bytes.unwrap_or(0);
    }
    let n = fleet.mounts.len();
    println!(
        "{:<40} {:<20} {gets:>7} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10}",
        format!("{n} daemon{}", if n == 1 { "" } else { "s" }),
        "",
        mib(down),
        mib(up),
        "",
        "",
        "",
        mib(mem)
    );
    for (sock, why) in &fleet.not_answering {
        eprintln!("warning: the daemon of {} does not answer ({why})", sock.display());
    }
    if !fleet.not_answering.is_empty() {
        eprintln!("  hint: a killed daemon's mount is cleaned up by `mado umount DIR`");
    }
    Ok(())
}
