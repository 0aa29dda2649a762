use anyhow::Result;
use clap::Args;
use mado_core::object::Kind;

use crate::ctx::Ctx;

/// List a directory of a snapshot: kind, size and name of each entry (a
/// file path lists that file).
#[derive(Args)]
pub struct LsArgs {
    /// Ref name or snapshot id (a unique prefix is enough), and any of git's ancestry steps: main~2, main^.
    spec: String,
    /// Directory (or file) inside the snapshot (default: the root).
    #[arg(default_value = "")]
    path: String,
}

#[derive(serde::Serialize)]
struct LsEntry {
    name: String,
    kind: &'static str,
    size: u64,
    id: String,
    chunked: bool,
}

pub async fn run(a: LsArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let mado_core::resolve::OpenTree { root, check, .. } = mado_core::resolve::open_tree(&fetcher, &a.spec).await?;
    // A file lists itself, as `ls FILE` does: its kind, size and path.
    let entries = match fetcher.lookup(*root, &a.path).await? {
        None => fetcher.tree(*root, &a.path).await?.entries,
        Some(e) if e.kind == Kind::Directory => fetcher.tree(e.id, &a.path).await?.entries,
        Some(e) => {
            let name = a.path.trim_end_matches('/').as_bytes().to_vec();
            vec![mado_core::object::Entry { name, ..e }]
        }
    };
    check.await?;
    let listed: Vec<LsEntry> = entries
        .iter()
        .map(|e| LsEntry {
            name: String::from_utf8_lossy(&e.name).into_owned(),
            kind: e.kind.label(),
            size: e.size,
            id: e.id.to_hex(),
            chunked: e.chunked,
        })
        .collect();
    if ctx.json {
        return ctx.print_json(&listed);
    }
    for (e, raw) in listed.iter().zip(&entries) {
        let suffix = if e.kind == "dir" { "/" } else { "" };
        println!("{:<7} {:>10}  {}{suffix}", e.kind, e.size, super::shown_bytes(&raw.name));
    }
    Ok(())
}
