use anyhow::Result;
use clap::Args;
use futures::{StreamExt as _, TryStreamExt as _};
use mado_core::error::local_time;

use crate::ctx::Ctx;

/// List every ref in the store (`main`, imports' `--ref`s, workspaces'
/// `ws/NAME`): its snapshot, root tree, the snapshot's time and message.
///
/// Text: a header line, then `NAME SNAPSHOT ROOT TIME MESSAGE` (ids
/// shortened, the first line of the message); `--json`: full ids and the time in seconds since the
/// Unix epoch.
#[derive(Args)]
pub struct RefsArgs {}

#[derive(serde::Serialize)]
struct RefEntry {
    name: String,
    snapshot: String,
    root: String,
    time: i64,
    author: String,
    message: String,
}

pub async fn run(_a: RefsArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let refs = fetcher.remote.list_refs().await?;
    ctx.step(format!("listed {} refs", refs.len()));
    // The snapshots come down together (each is one small GET, or a cache hit).
    let out: Vec<RefEntry> = futures::stream::iter(refs)
        .map(|(name, v)| {
            let fetcher = fetcher.clone();
            async move {
                let s = fetcher.snapshot(v.snapshot).await?;
                anyhow::Ok(RefEntry {
                    name,
                    snapshot: v.snapshot.to_hex(),
                    root: v.root.to_hex(),
                    time: s.time,
                    author: s.author,
                    message: s.message,
                })
            }
        })
        .buffered(16)
        .try_collect()
        .await?;
    if ctx.json {
        return ctx.print_json(&out);
    }
    if out.is_empty() {
        eprintln!("no refs yet; import one with `mado import-git <repo>`");
        return Ok(());
    }
    let width = out.iter().map(|e| e.name.len()).max().unwrap_or(0).max(4);
    println!("{:<width$}  {:<12}  {:<12}  {:<26}  MESSAGE", "REF", "SNAPSHOT", "ROOT", "TIME");
    for e in &out {
        println!(
            "{:<width$}  {}  {}  {}  {}",
            e.name,
            &e.snapshot[..12],
            &e.root[..12],
            local_time(e.time),
            e.message.lines().next().unwrap_or("")
        );
    }
    Ok(())
}
