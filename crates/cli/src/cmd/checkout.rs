use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Write a snapshot's tree, or only some of its paths, into a directory.
///
/// Reads through the disk cache (a warm checkout makes no GETs) with many
/// requests in flight; keeps exec bits and symlinks. Refuses a non-empty
/// directory unless --force, and never writes outside DIR or through a
/// symlink.
///
/// A checkout into an empty or new directory that fails or is interrupted
/// (Ctrl-C) leaves it empty (or not there) again. One killed leaves the
/// file `.mado-checkout-partial` at DIR's top: the same checkout run again
/// removes what it wrote and starts over, unless DIR holds a path its tree
/// does not have (someone's file: it is refused, and nothing removed).
///
/// With PATHs, only those directories or files are written, each at its
/// own path under DIR (`mado checkout main w src/lib` gives `w/src/lib`);
/// from a packed snapshot only their span of each pack is downloaded.
#[derive(Args)]
pub struct CheckoutArgs {
    /// Ref name or snapshot id (a unique prefix is enough), and any of git's ancestry steps: main~2, main^.
    spec: String,
    /// Target directory (created if missing).
    dir: PathBuf,
    /// Paths inside the snapshot to check out (default: everything).
    paths: Vec<String>,
    /// Write into a non-empty directory, replacing entries in the way
    /// (entries not in the snapshot are left alone).
    #[arg(long)]
    force: bool,
}

pub async fn run(a: CheckoutArgs, ctx: &Ctx) -> Result<()> {
    let remote = ctx.remote()?;
    let fetcher = ctx.fetcher()?;
    let mado_core::resolve::OpenTree { snapshot: id, root, attach, check } =
        mado_core::resolve::open_tree(&fetcher, &a.spec).await?;
    ctx.step(format!("resolved {} to {}; packs: {attach}", a.spec, id.short()));
    let (pb, progress) = ctx.progress_counter("checking out");
    // A workspace checkpoint recorded every path's mtime (its stat object):
    // read beside the checkout, and set once the files are written, as a
    // resume does. An imported snapshot records none: files keep the time
    // they were written (README, "Modification times").
    let stat = async { fetcher.stat_of(&fetcher.snapshot(id).await?).await };
    let (report, stat) = futures::join!(
        mado_core::checkout::checkout(
            &fetcher,
            *root,
            &a.dir,
            mado_core::checkout::CheckoutOptions {
                force: a.force,
                allow_name: None,
                paths: &a.paths,
                progress: &progress
            },
        ),
        stat
    );
    pb.finish_and_clear();
    let report = report?;
    if report.removed_partial {
        note!(ctx, "note: removed what an interrupted checkout had written into {} first", a.dir.display());
    }
    check.await?;
    if let Some(stat) = stat? {
        let n = mado_core::checkout::restore_mtimes(&a.dir, stat, &a.paths)?;
        ctx.step(format!("restored {n} mtimes"));
    }
    ctx.step(format!("wrote {} files, {} symlinks, {} dirs", report.files, report.symlinks, report.dirs));
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            snapshot: String,
            dir: String,
            paths: &'a [String],
            #[serde(flatten)]
            report: &'a mado_core::checkout::CheckoutReport,
            remote: mado_core::store::Stats,
            packs: mado_core::fetch::FetchStats,
        }
        return ctx.print_json(&Out {
            snapshot: id.to_hex(),
            dir: a.dir.display().to_string(),
            paths: &a.paths,
            report: &report,
            remote: remote.stats(),
            packs: fetcher.stats(),
        });
    }
    say!(
        ctx,
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
