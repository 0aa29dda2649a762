use std::io::Write;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Write a file's content from a snapshot to stdout (a symlink's target).
#[derive(Args)]
pub struct CatArgs {
    /// Ref name or snapshot id.
    spec: String,
    /// Path of the file inside the snapshot.
    path: String,
}

pub async fn run(a: CatArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let (_, snap, _) = mado_core::resolve::open(&fetcher, &a.spec).await?;
    let entry = fetcher.lookup(snap.root, &a.path).await?.ok_or_else(|| {
        mado_core::Error::User("give a file path, not the root; use `mado ls` for directories".into())
    })?;
    let data = fetcher.content(&entry, &a.path).await?;
    let mut out = std::io::stdout().lock();
    out.write_all(&data)?;
    out.flush()?;
    Ok(())
}
