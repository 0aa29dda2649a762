use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use mado_mount::protocol::{Op, Reply};
use std::time::Duration;

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
    let v = match super::ask_daemon(a.dir.as_deref(), Op::PackStatus, Duration::from_secs(10))? {
        Reply::PackStatus(s) => s,
        r => return Err(super::unexpected(&r)),
    };
    if ctx.json {
        return ctx.print_json(&v);
    }
    println!("{}: {}", v.mountpoint.display(), v.message);
    Ok(())
}
