use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use mado_mount::protocol::{Op, Reply};

use crate::ctx::Ctx;

/// Hand a workspace mount to a new daemon of this mado binary, without
/// unmounting it (after an upgrade, or to shed a daemon's memory).
///
/// The old daemon stops taking requests, lets those it took finish, saves
/// the workspace's state and passes the kernel's connection, its inode
/// numbers and the workspace's lock to the new one, which serves from
/// there on. Processes using the mount see a pause, not an error: open
/// files, current directories and the lease stay as they were. If the new
/// daemon fails to start, the old one goes on serving. Needs root (the
/// daemon of a root mount).
#[derive(Args)]
pub struct RestartArgs {
    /// The workspace's mount point (or a directory inside it).
    dir: PathBuf,
}

pub async fn run(a: RestartArgs, ctx: &Ctx) -> Result<()> {
    let exe = std::env::current_exe()?;
    let wait = std::time::Duration::from_secs(300);
    let (from, to) = match super::ask_daemon(Some(&a.dir), Op::HandOver { exe }, wait)? {
        Reply::HandedOver { from, to } => (from, to),
        r => return Err(super::unexpected(&r)),
    };
    if ctx.json {
        return ctx.print_json(&serde_json::json!({ "dir": a.dir.display().to_string(), "from_pid": from, "pid": to }));
    }
    say!(ctx, "{} is served by a new daemon (pid {to}; pid {from} handed it over)", a.dir.display());
    Ok(())
}
