use std::io::Write;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Write a file's content from a snapshot to stdout (a symlink's target).
#[derive(Args)]
pub struct CatArgs {
    /// Ref name or snapshot id (a unique prefix is enough), and any of git's ancestry steps: main~2, main^.
    spec: String,
    /// Path of the file inside the snapshot.
    path: String,
}

pub async fn run(a: CatArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let mado_core::resolve::OpenTree { root, check, .. } = mado_core::resolve::open_tree(&fetcher, &a.spec).await?;
    let entry = fetcher.lookup(*root, &a.path).await?.ok_or_else(|| {
        mado_core::Error::User("give a file path, not the root; use `mado ls` for directories".into())
    })?;
    if entry.kind == mado_core::object::Kind::Symlink || !entry.kind.has_content() {
        // A symlink's target, or the error naming what the entry is.
        let data = fetcher.content(&entry, &a.path).await?;
        std::io::stdout().lock().write_all(&data)?;
        return Ok(check.await?);
    }
    // A piece at a time: a large file streams through a bounded window.
    let mut pieces = fetcher.pieces(&entry, &a.path).await?;
    let mut out = std::io::stdout();
    let zeros = vec![0u8; 1 << 16];
    while let Some(piece) = futures::StreamExt::next(&mut pieces).await {
        let piece = piece?;
        out.write_all(&piece.bytes)?;
        // A hole of a large file: its zeros, a block at a time.
        let mut left = piece.zeros;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            out.write_all(&zeros[..n])?;
            left -= n as u64;
        }
    }
    out.flush()?;
    Ok(check.await?)
}
