use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use mado_mount::protocol::{Op, Reply};
use std::time::Duration;

use crate::ctx::Ctx;

mod all;
mod prometheus;

/// What a running mount has done since it started: GETs, bytes, cache hits
/// and misses, packs exploded; with --all, every mount and workspace of
/// this user on this machine, with each daemon's private memory.
#[derive(Args)]
pub struct StatsArgs {
    /// A directory inside the mount (default: the current directory).
    #[arg(conflicts_with_all = ["all", "prometheus"])]
    dir: Option<PathBuf>,
    /// Every running mount and workspace daemon of this user (found by
    /// their control sockets), one line each, then the totals; with
    /// --json, `{"mounts": [...], "not_answering": [...]}`.
    #[arg(long)]
    all: bool,
    /// Serve the counters of every mount (as --all) in Prometheus' text
    /// format at http://ADDR/metrics until stopped, e.g. 127.0.0.1:9464.
    /// Each scrape asks every daemon afresh. Give a loopback address unless
    /// others should see your mounts' paths.
    #[arg(long, value_name = "ADDR")]
    prometheus: Option<SocketAddr>,
}

pub async fn run(a: StatsArgs, ctx: &Ctx) -> Result<()> {
    if let Some(addr) = a.prometheus {
        return prometheus::serve(addr).await;
    }
    if a.all {
        return all::print(ctx).await;
    }
    let v = match super::ask_daemon(a.dir.as_deref(), Op::Stats, Duration::from_secs(10))? {
        Reply::Stats(s) => s,
        r => return Err(super::unexpected(&r)),
    };
    if ctx.json {
        return ctx.print_json(&v);
    }
    let (r, p, c) = (&v.remote, &v.packs, &v.cache);
    println!("mount:  {} ({} ms up)", v.mountpoint.display(), v.uptime_ms);
    match v.keeper_pid {
        Some(k) => {
            println!("daemon: pid {} (kept by pid {k}: a new daemon takes the mount over if this one dies)", v.pid)
        }
        None => println!("daemon: pid {}", v.pid),
    }
    println!(
        "remote: {} GETs ({} ranged), {} HEADs, {} bytes down",
        r.all_gets(),
        r.ranged_gets,
        r.heads,
        r.bytes_down
    );
    println!("cache:  {} hits, {} misses, {} healed", c.hits, c.misses, c.healed);
    println!("packs:  {} exploded, {} members served", p.packs_exploded, p.members_from_packs);
    println!("nodes:  {} in memory", v.nodes_in_memory);
    println!("large:  {} chunks read ahead", v.chunks_read_ahead);
    if let Some(q) = &v.virtiofs {
        let ops: Vec<String> = q.by_op.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("guest:  {} requests ({} refused): {}", q.requests, q.refused, ops.join(", "));
    }
    if let Some(ms) = v.stuck_ms {
        println!(
            "warning: requests to this mount have been stuck for {} s (a request holds its inode table)",
            ms / 1000
        );
        match v.keeper_pid {
            Some(_) => println!(
                "  the daemon's log says more; kill -9 of pid {} starts a new daemon on the same mount (fsynced work \
                 is kept)",
                v.pid
            ),
            None => println!(
                "  the daemon's log says more; kill -9 of pid {} and `mado umount` end it (fsynced work is kept)",
                v.pid
            ),
        }
    }
    if let Some(w) = &v.workspace {
        println!("workspace: {} ({} changes since mounted)", w.name, w.changes);
        if let Some(e) = &w.last_save_error {
            println!("warning: the workspace's state could not be saved: {e}");
            println!("  changes since the last good save would be lost if the daemon died; checkpoints are refused");
        }
    }
    Ok(())
}
