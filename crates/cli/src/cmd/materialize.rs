use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Prefetch a tree or subtree into the disk cache, so nothing later waits
/// on the network (run it before going offline or before a build).
///
/// Packed subtrees come in one ranged GET per pack; other objects are
/// fetched alone with many requests in flight.
#[derive(Args)]
pub struct MaterializeArgs {
    /// Subtree to prefetch (default: the whole tree).
    #[arg(default_value = "")]
    path: String,
    /// Ref name or snapshot id (a unique prefix is enough), and any of git's ancestry steps: main~2, main^.
    #[arg(short = 'r', long = "rev", default_value = "main", value_name = "REF")]
    spec: String,
}

pub async fn run(a: MaterializeArgs, ctx: &Ctx) -> Result<()> {
    let remote = ctx.remote()?;
    let fetcher = ctx.fetcher()?;
    let mado_core::resolve::OpenTree { snapshot: id, root, attach, check } =
        mado_core::resolve::open_tree(&fetcher, &a.spec).await?;
    ctx.step(format!("opened {} ({}); packs: {attach}", a.spec, id.short()));
    let (pb, progress) = ctx.progress_counter("materializing");
    let r = mado_core::materialize::materialize(&fetcher, *root, &a.path, &progress).await;
    pb.finish_and_clear();
    // `mado materialize REF`, as other commands take a ref first: say so.
    let r = match r {
        Err(mado_core::Error::NotFound(m))
            if !a.path.contains('/') && a.spec == "main" && matches!(remote.read_ref(&a.path).await, Ok(Some(_))) =>
        {
            return Err(mado_core::Error::User(format!(
                "{m}\n  hint: {} is a ref; materialize takes a path, and the ref with -r: `mado materialize -r {}`",
                a.path, a.path
            ))
            .into())
        }
        r => r?,
    };
    check.await?;
    ctx.step(format!("{} files in the cache", r.files));
    ctx.flush_warnings();
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            snapshot: String,
            path: &'a str,
            #[serde(flatten)]
            report: &'a mado_core::materialize::MaterializeReport,
            attach: &'a mado_core::fetch::Attach,
            remote: mado_core::store::Stats,
            packs: mado_core::fetch::FetchStats,
        }
        return ctx.print_json(&Out {
            snapshot: id.to_hex(),
            path: &a.path,
            report: &r,
            attach: &attach,
            remote: remote.stats(),
            packs: fetcher.stats(),
        });
    }
    let s = remote.stats();
    let p = fetcher.stats();
    say!(
        ctx,
        "materialized {} files ({} bytes) in {} directories: {} GETs ({} ranged), {} packs exploded",
        r.files,
        r.bytes,
        r.dirs,
        s.all_gets(),
        s.ranged_gets,
        p.packs_exploded
    );
    Ok(())
}
