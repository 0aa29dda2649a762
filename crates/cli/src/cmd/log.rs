use anyhow::Result;
use clap::Args;
use mado_core::error::local_time;

use crate::ctx::Ctx;

/// Show a ref's history: each snapshot, newest first.
///
/// Times are shown in local time (`TZ` sets the zone); `--json` gives them
/// as seconds since the Unix epoch. `mado refs` lists the refs.
#[derive(Args)]
pub struct LogArgs {
    /// Ref name or snapshot id (a unique prefix is enough), and any of git's ancestry steps: main~2, main^.
    #[arg(default_value = "main")]
    spec: String,
    /// Show at most this many snapshots (default: all).
    #[arg(long = "max-count", alias = "max", short = 'n', value_name = "N")]
    max: Option<usize>,
}

#[derive(serde::Serialize)]
struct LogEntry {
    snapshot: String,
    root: String,
    parents: Vec<String>,
    time: i64,
    author: String,
    source: String,
    message: String,
}

impl LogArgs {
    pub fn for_ref(spec: String, max: Option<usize>) -> LogArgs {
        LogArgs { spec, max }
    }
}

pub async fn run(a: LogArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let mut next: Option<mado_core::SnapshotId> = Some(mado_core::resolve::resolve(&fetcher, &a.spec).await?.snapshot);
    let mut out = Vec::new();
    while let Some(id) = next {
        if a.max.is_some_and(|m| out.len() >= m) {
            break;
        }
        let s = fetcher.snapshot(id).await?;
        next = s.parents.first().copied();
        let e = LogEntry {
            snapshot: id.to_hex(),
            root: s.root.to_hex(),
            parents: s.parents.iter().map(|p| p.to_hex()).collect(),
            time: s.time,
            author: s.author,
            source: s.source,
            message: s.message,
        };
        if !ctx.json {
            println!("snapshot {}", e.snapshot);
            if !e.source.is_empty() {
                println!("Source:   {}", e.source);
            }
            println!("Author:   {}", e.author);
            println!("Date:     {}", local_time(e.time));
            println!();
            for l in e.message.trim_end().lines() {
                println!("    {l}");
            }
            println!();
        }
        out.push(e);
    }
    if ctx.json {
        ctx.print_json(&out)?;
    }
    Ok(())
}
