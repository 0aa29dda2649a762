use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Write a snapshot's whole tree into a directory.
///
/// Reads through the disk cache (a warm checkout makes no GETs) with many
/// requests in flight; keeps exec bits and symlinks. Refuses a non-empty
/// directory unless --force, and never writes outside DIR or through a
/// symlink.
#[derive(Args)]
pub struct CheckoutArgs {
    /// Ref name or snapshot id.
    spec: String,
    /// Target directory (created if missing).
    dir: PathBuf,
    /// Write into a non-empty directory, replacing entries in the way
    /// (entries not in the snapshot are left alone).
    #[arg(long)]
    force: bool,
}

pub async fn run(a: CheckoutArgs, ctx: &Ctx) -> Result<()> {
    let remote = ctx.remote()?;
    let fetcher = ctx.fetcher()?;
    let (id, snap, attach) = mado_core::resolve::open(&fetcher, &a.spec).await?;
    ctx.step(format!("resolved {} to {}; packs: {attach:?}", a.spec, id.short()));
    let (pb, progress) = ctx.progress_counter("checking out");
    let report = mado_core::checkout::checkout(
        &fetcher,
        snap.root,
        &a.dir,
        mado_core::checkout::CheckoutOptions { force: a.force, progress: &progress },
    )
    .await;
    pb.finish_and_clear();
    let report = report?;
    ctx.step(format!("wrote {} files, {} symlinks, {} dirs", report.files, report.symlinks, report.dirs));
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            snapshot: String,
            dir: String,
            #[serde(flatten)]
            report: &'a mado_core::checkout::CheckoutReport,
            remote: mado_core::store::Stats,
            packs: mado_core::fetch::FetchStats,
        }
        return ctx.print_json(&Out {
            snapshot: id.to_hex(),
            dir: a.dir.display().to_string(),
            report: &report,
            remote: remote.stats(),
            packs: fetcher.stats(),
        });
    }
    println!(
        "checked out {} into {}: {} files ({} bytes), {} symlinks, {} directories",
        id.short(),
        a.dir.display(),
        report.files,
        report.bytes,
        report.symlinks,
        report.dirs
    );
    Ok(())
}
