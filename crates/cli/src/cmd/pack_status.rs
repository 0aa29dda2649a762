use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Ask the running mount daemon whether a pack prefetcher is attached (mode,
/// index version, directories, and whether it was found via the local or
/// the derived pointer), or the reason it is not.
#[derive(Args)]
pub struct PackStatusArgs {
    /// A directory inside the mount (default: the current directory).
    dir: Option<PathBuf>,
}

pub async fn run(a: PackStatusArgs, ctx: &Ctx) -> Result<()> {
    let v = super::ask_daemon(a.dir, "pack-status")?;
    if ctx.json {
        return ctx.print_json(&v);
    }
    println!("{}: {}", v["mountpoint"].as_str().unwrap_or("?"), v["message"].as_str().unwrap_or("?"));
    Ok(())
}
