use anyhow::Result;
use clap::Args;
use mado_core::pack::Mode;

use crate::ctx::Ctx;

/// Build and publish locality packs for a snapshot's tree.
///
/// A pack holds many small objects so a cold subtree costs one ranged GET
/// instead of one GET per file. Recursive packs (the default) cover whole
/// thin subtrees across many small directories; --per-dir packs each dense
/// directory's own files. The index is published at a key derived from the
/// tree id, so any client finds it; a copy is kept as the local pointer.
/// Idempotent: an unchanged tree uploads nothing.
#[derive(Args)]
pub struct PackArgs {
    /// Ref name or snapshot id to pack (main~2, main^: git's ancestry steps).
    #[arg(short = 'r', long = "rev", default_value = "main", value_name = "REF")]
    spec: String,
    /// Recursive-subtree packs (v2; the default).
    #[arg(long, conflicts_with = "per_dir")]
    recursive: bool,
    /// Per-directory packs (v1): each directory with at least 8 small files.
    #[arg(long)]
    per_dir: bool,
    /// Largest pack, in bytes.
    #[arg(long, default_value_t = mado_core::pack::DEFAULT_MAX_PACK_BYTES, value_name = "BYTES")]
    max_pack_bytes: u64,
}

pub async fn run(a: PackArgs, ctx: &Ctx) -> Result<()> {
    let remote = ctx.remote()?;
    let cache = ctx.cache()?;
    let fetcher = ctx.fetcher()?;
    let (_, snap, attach) = mado_core::resolve::open(&fetcher, &a.spec).await?;
    ctx.step(format!("opened {}; existing packs: {attach}", a.spec));
    // The builder reads from the disk cache: bring the tree in first
    // (through any packs it already has).
    let (pb, progress) = ctx.progress_counter("fetching content");
    let m = mado_core::materialize::materialize(&fetcher, *snap.root, "", &progress).await;
    pb.finish_and_clear();
    m?;
    ctx.step("content is in the disk cache");
    let mode = if a.per_dir { Mode::PerDir } else { Mode::Recursive };
    let opts = mado_core::publish::PackOptions {
        mode,
        cap: a.max_pack_bytes,
        index_check: mado_core::publish::IndexCheck::Compare,
        base: None,
        layers: None,
        flat: None,
        primary: false,
    };
    let report = mado_core::publish::publish_packs(&remote, &cache, *snap.root, opts, Some(fetcher.clone())).await?;
    ctx.step(format!("built {} packs in {} ms", report.packs, report.build_ms));
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            report: &'a mado_core::publish::PackReport,
            remote: mado_core::store::Stats,
        }
        return ctx.print_json(&Out { report: &report, remote: remote.stats() });
    }
    say!(
        ctx,
        "{} packs ({}) over {} directories: {} objects packed, {} too large to pack",
        report.packs,
        report.mode,
        report.dirs,
        report.members,
        report.unpacked_objects
    );
    say!(
        ctx,
        "uploaded {} packs, {} bytes{}",
        report.packs_uploaded,
        report.bytes_uploaded,
        if report.index_uploaded { " (and the index)" } else { "; the index was already current" }
    );
    say!(
        ctx,
        "a cold walk of the whole tree: {} GETs unpacked, {} with these packs",
        report.model_gets_unpacked,
        report.model_gets_packed
    );
    Ok(())
}
