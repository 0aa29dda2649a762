use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Show what changed between two snapshots: paths added (A), modified (M:
/// content, kind or exec bit) and deleted (D), sorted.
///
/// Each side is a ref name (`main`, `ws/NAME`) or a snapshot id; with one,
/// it is compared with its parent snapshot. Only trees that differ are
/// read, so the cost follows the change. File times are not compared
/// (trees hold none). Exit status 0 either way; `--json` for scripts:
/// `{"from", "to", "added", "modified", "deleted"}`.
#[derive(Args)]
pub struct DiffArgs {
    /// The older side: a ref name or a snapshot id.
    from: String,
    /// The newer side (default: FROM, compared with its parent).
    to: Option<String>,
}

#[derive(serde::Serialize)]
struct Out {
    from: String,
    to: String,
    #[serde(flatten)]
    changes: mado_core::diff::Changes,
}

pub async fn run(a: DiffArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let (from_id, from, to_id, to) = match &a.to {
        Some(to) => {
            let ((fi, f, _), (ti, t, _)) = futures::try_join!(
                mado_core::resolve::open(&fetcher, &a.from),
                mado_core::resolve::open(&fetcher, to)
            )?;
            (fi, f, ti, t)
        }
        None => {
            let (ti, t, _) = mado_core::resolve::open(&fetcher, &a.from).await?;
            let Some(parent) = t.parents.first().copied() else {
                return Err(mado_core::Error::User(format!(
                    "{} has no parent snapshot to compare with; name two: `mado diff FROM TO`",
                    a.from
                ))
                .into());
            };
            // The parent's trees live in its own index (packs-first).
            let p = fetcher.snapshot(parent).await?;
            fetcher.attach(p.root).await?;
            (parent, p, ti, t)
        }
    };
    ctx.step(format!("comparing {} with {}", from_id.short(), to_id.short()));
    let changes = mado_core::diff::diff_trees(&fetcher, from.root, to.root).await?;
    if ctx.json {
        return ctx.print_json(&Out { from: from_id.to_hex(), to: to_id.to_hex(), changes });
    }
    let mut lines: Vec<(&str, char)> = Vec::new();
    lines.extend(changes.added.iter().map(|p| (p.as_str(), 'A')));
    lines.extend(changes.modified.iter().map(|p| (p.as_str(), 'M')));
    lines.extend(changes.deleted.iter().map(|p| (p.as_str(), 'D')));
    lines.sort();
    for (p, c) in lines {
        println!("{c} {p}");
    }
    Ok(())
}
