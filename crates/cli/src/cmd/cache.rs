use anyhow::Result;
use clap::Subcommand;

use crate::ctx::Ctx;

/// Inspect the disk cache ($MADO_CACHE_DIR, $XDG_CACHE_HOME/mado or ~/.cache/mado).
#[derive(Subcommand)]
pub enum CacheCommand {
    /// Where the cache is, how many entries and bytes it holds, and its cap
    /// (`mado config set cache.max_size 10G`, or MADO_DISK_CACHE_MAX_BYTES
    /// which wins; unset or 0 = unbounded).
    Stats,
    /// Re-hash every entry; delete (and list) any that does not match its
    /// key. Deleted entries are fetched again when next needed.
    Verify,
}

pub async fn run(c: CacheCommand, ctx: &Ctx) -> Result<()> {
    let cache = ctx.cache()?;
    match c {
        CacheCommand::Stats => {
            let u = cache.usage();
            if ctx.json {
                return ctx.print_json(&u);
            }
            println!("path:    {}", u.path);
            println!("loose:   {} (objects one file each)", u.entries);
            println!("packs:   {} (fetched packs, one file each)", u.packs);
            println!("bytes:   {}", u.bytes);
            println!("cap:     {}", u.cap.map_or("unbounded".to_string(), |c| format!("{} ({c} bytes)", human(c))));
        }
        CacheCommand::Verify => {
            let pb = ctx.progress(Some(0), "verifying");
            let r = cache.verify(|done, total| {
                pb.set_length(total);
                pb.set_position(done);
            });
            pb.finish_and_clear();
            if ctx.json {
                return ctx.print_json(&r);
            }
            println!("checked {} entries (loose objects and packs), {} bad (removed)", r.checked, r.bad.len());
            for b in &r.bad {
                println!("  removed {b}");
            }
            if !r.busy.is_empty() {
                println!("{} packs being downloaded by another process were left unchecked", r.busy.len());
            }
        }
    }
    Ok(())
}

/// Bytes in binary units, one decimal: `10.0 GiB`.
fn human(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}
