use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Import git commits as snapshots and move a ref to the last one.
///
/// Reads the repository with gix, writes what `git clone` of each commit
/// would put in the working tree (.gitattributes eol conversions applied;
/// submodules become empty directories; symlinks stay symlinks), stores it
/// in the disk cache and uploads only what the store lacks: importing the
/// same commit again uploads nothing. Each snapshot's parent is the ref's
/// previous snapshot. Prints the snapshot id of each commit.
#[derive(Args)]
pub struct ImportGitArgs {
    /// Path to the git repository (a worktree or a bare repository).
    repo: PathBuf,
    /// Revision to import (repeatable; default HEAD), e.g. main, v1.0, a commit id.
    #[arg(long = "rev", short = 'r', value_name = "REV")]
    revs: Vec<String>,
    /// Ref to move to the last imported snapshot.
    #[arg(long = "ref", default_value = "main", value_name = "NAME")]
    ref_name: String,
    /// Do not build and publish locality packs for the imported tips.
    #[arg(long)]
    no_packs: bool,
    /// Largest pack, in bytes.
    #[arg(long, default_value_t = mado_core::pack::DEFAULT_MAX_PACK_BYTES, value_name = "BYTES")]
    max_pack_bytes: u64,
}

pub async fn run(a: ImportGitArgs, ctx: &Ctx) -> Result<()> {
    let remote = ctx.remote()?;
    let cache = ctx.cache()?;
    let revs = if a.revs.is_empty() { vec!["HEAD".to_string()] } else { a.revs };
    let started = std::time::Instant::now();
    let pb = ctx.progress(None, "reading files");
    let pb2 = pb.clone();
    ctx.step(format!("staging {} revision(s) from {}", revs.len(), a.repo.display()));
    let report = mado_core::import::import_git(
        &remote,
        cache,
        &a.repo,
        revs,
        &a.ref_name,
        (!a.no_packs).then_some(mado_core::publish::PackOptions {
            mode: mado_core::pack::Mode::Recursive,
            cap: a.max_pack_bytes,
            index_check: mado_core::publish::IndexCheck::KnownAbsent,
            base: None,
            layers: None,
            primary: true,
        }),
        Arc::new(move |files, bytes| {
            pb2.set_position(files);
            // Every 256 files: a message per file would cost more than it tells.
            if files % 256 == 0 {
                pb2.set_message(format!("reading files ({} MB)", bytes >> 20));
            }
        }),
    )
    .await;
    pb.finish_and_clear();
    let report = report?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    for p in &report.packs {
        ctx.step(format!(
            "packed tree {}: {} packs, {} members, {} uploaded, built in {} ms",
            &p.tree[..12],
            p.packs,
            p.members,
            p.packs_uploaded,
            p.build_ms
        ));
    }
    ctx.step(format!(
        "uploaded {} objects ({} trees, {} B), {} snapshots",
        report.upload.objects_uploaded,
        report.upload.trees_uploaded,
        report.upload.bytes_uploaded,
        report.upload.snapshots_uploaded
    ));
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            report: &'a mado_core::import::ImportReport,
            remote: mado_core::store::Stats,
        }
        return ctx.print_json(&Out { report: &report, remote: remote.stats() });
    }
    for i in &report.imported {
        let note = if i.new_snapshot { "" } else { " (unchanged)" };
        println!("{} {} -> {}{note}", i.rev, &i.commit[..12.min(i.commit.len())], i.snapshot);
    }
    let packs: usize = report.packs.iter().map(|p| p.packs).sum();
    let new_packs: u64 = report.packs.iter().map(|p| p.packs_uploaded).sum();
    let up = &report.upload;
    let sent = if up.snapshots_uploaded == 0 {
        "nothing new to upload".to_string()
    } else {
        format!(
            "uploaded {new_packs} new packs (of {packs}), {} objects alone and {} snapshots: {} MB",
            up.objects_uploaded,
            up.snapshots_uploaded,
            up.bytes_uploaded >> 20
        )
    };
    println!(
        "{}: {} files, {} MB read; {sent}; {:.1} s ({:.0} MB/s read)",
        report.ref_name,
        report.files,
        report.bytes >> 20,
        secs,
        report.bytes as f64 / secs / 1e6,
    );
    Ok(())
}
