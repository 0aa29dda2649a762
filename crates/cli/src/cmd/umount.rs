use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Unmount a mado mount and wait for its daemon to exit (a workspace's
/// state is saved by then). Also cleans up a mount
/// whose daemon was killed ("Transport endpoint is not connected").
#[derive(Args)]
pub struct UmountArgs {
    /// The mount point.
    dir: PathBuf,
}

pub async fn run(a: UmountArgs, ctx: &Ctx) -> Result<()> {
    if !mado_mount::daemon::is_disconnected(&a.dir) && !mado_mount::daemon::is_mount_point(&a.dir) {
        return Err(mado_core::Error::User(format!("{} is not mounted: nothing to unmount", a.dir.display())).into());
    }
    mado_mount::daemon::unmount_and_wait(&a.dir, std::time::Duration::from_secs(30)).map_err(|e| {
        let text = e.to_string();
        let why = if text.contains("busy") {
            // A process has a file open in it or its working directory
            // there (a shell `cd`'d into it).
            "a process still uses it: a file open in it, or a shell whose current directory is inside; close or leave it (`fuser -vm DIR` lists them) and unmount again"
        } else if mado_mount::control::find_mount(&a.dir).is_ok_and(|m| m.is_some()) {
            "it is a mado mount; see the daemon's log (`mado stats DIR` names it)"
        } else {
            "is it a mado mount?"
        };
        mado_core::Error::User(format!("cannot unmount {}: {e}\n  hint: {why}", a.dir.display()))
    })?;
    if ctx.json {
        let abs = std::path::absolute(&a.dir).unwrap_or_else(|_| a.dir.clone());
        return ctx.print_json(&serde_json::json!({ "unmounted": abs.display().to_string() }));
    }
    say!(ctx, "unmounted {}", a.dir.display());
    Ok(())
}
