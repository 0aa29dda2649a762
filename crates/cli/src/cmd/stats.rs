use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// What a running mount has done since it started: GETs, bytes, cache hits
/// and misses, packs exploded.
#[derive(Args)]
pub struct StatsArgs {
    /// A directory inside the mount (default: the current directory).
    dir: Option<PathBuf>,
}

pub async fn run(a: StatsArgs, ctx: &Ctx) -> Result<()> {
    let v = super::ask_daemon(a.dir, "stats")?;
    if ctx.json {
        return ctx.print_json(&v);
    }
    let r = &v["remote"];
    let p = &v["packs"];
    let c = &v["cache"];
    println!("mount:  {} ({} ms up)", v["mountpoint"].as_str().unwrap_or("?"), v["uptime_ms"]);
    println!(
        "remote: {} GETs ({} ranged), {} HEADs, {} bytes down",
        r["gets"].as_u64().unwrap_or(0) + r["ranged_gets"].as_u64().unwrap_or(0),
        r["ranged_gets"],
        r["heads"],
        r["bytes_down"]
    );
    println!("cache:  {} hits, {} misses, {} healed", c["hits"], c["misses"], c["healed"]);
    println!("packs:  {} exploded, {} members served", p["packs_exploded"], p["members_from_packs"]);
    println!("nodes:  {} in memory", v["nodes_in_memory"]);
    let w = &v["workspace"];
    if w.is_object() {
        println!("workspace: {} ({} changes since mounted)", w["name"].as_str().unwrap_or("?"), w["changes"]);
        if let Some(e) = w["last_save_error"].as_str() {
            println!("warning: the workspace's state could not be saved: {e}");
            println!("  changes since the last good save would be lost if the daemon died; checkpoints are refused");
        }
    }
    Ok(())
}
