use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Delete what no ref reaches: snapshots, objects, and the packs and pack
/// indexes of trees no ref reaches.
///
/// A pack stays while a kept index names it (packs are where imported and
/// checkpointed content lives), and an index stays while its tree is
/// reachable or a kept index stands on it as a layer. gc stops, deleting
/// nothing, when something reachable cannot be read. Deletion runs in
/// reverse closure order, so the store is consistent at every instant, and
/// spares anything younger than --grace (an upload in progress). The
/// checkpoints that work set aside on this machine was made on (`mado ws
/// recover`) are kept as if a ref named them.
#[derive(Args)]
pub struct GcArgs {
    /// Only count what would be deleted.
    #[arg(long)]
    dry_run: bool,
    /// Keep unreachable objects younger than this many seconds.
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    grace: u64,
}

pub async fn run(a: GcArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    // The checkpoints that work set aside on this machine was made on (a
    // workspace removed while it had uncheckpointed changes) are kept as if
    // a ref named them, or `ws recover` could no longer bring the work
    // back. Other machines' are not known here.
    let keep: Vec<mado_core::SnapshotId> = mado_core::workspace::list_set_aside(&fetcher)
        .unwrap_or_default()
        .iter()
        .filter_map(|s| s.checkpoint.parse().ok())
        .collect();
    let r = mado_core::gc::gc(&fetcher, Duration::from_secs(a.grace), a.dry_run, &keep).await?;
    if ctx.json {
        return ctx.print_json(&r);
    }
    let verb = if r.dry_run { "would delete" } else { "deleted" };
    say!(
        ctx,
        "{} refs reach {} snapshots and {} objects; {verb} {} snapshots, {} objects, {} pack indexes, {} packs ({} bytes); spared {} younger than {} s",
        r.refs,
        r.snapshots_kept,
        r.objects_kept,
        r.deleted_snapshots,
        r.deleted_objects,
        r.deleted_indexes,
        r.deleted_packs,
        r.bytes_freed,
        r.spared_young,
        a.grace
    );
    if r.kept_for_set_aside > 0 {
        say!(
            ctx,
            "kept {} snapshots no ref reaches: work set aside on this machine was made on them (`mado ws recover` lists it)",
            r.kept_for_set_aside
        );
    }
    Ok(())
}
