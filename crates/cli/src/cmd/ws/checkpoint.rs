//! `ws checkpoint` and `ws status`, and how both find the working copy
//! they are about: a mount, a workspace served to a VM guest, or a plain
//! directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use mado_core::fetch::Fetcher;
use mado_core::store::Stats;
use mado_core::workspace;
use mado_mount::protocol::{Op, Reply};

use super::args::{CheckpointArgs, StatusArgs};
use crate::ctx::Ctx;

const SERVED_HINT: &str = "if its `mado serve-virtiofs` died, start it again (it takes the lease back)";

/// Where the working copy a `ws` command is about lives.
#[derive(Debug)]
pub(super) enum Location {
    /// In a workspace mount on this machine: a path inside it (its
    /// daemon answers).
    Mount(PathBuf),
    /// Served to a VM guest by `mado serve-virtiofs --workspace` (no
    /// directory here): its daemon's control socket.
    Served(PathBuf),
    /// A plain working copy: its root.
    Dir(PathBuf),
}

/// The working copy for `dir` (else the current directory) and workspace
/// `name`, in this order: a mount around the directory (a working copy's
/// `.mado` is looked up through it, then above it); a workspace `name`
/// served to a VM guest; `name`'s mount on this machine when the command
/// runs from outside any copy of it without --dir (the daemon checks the
/// name is its workspace's); the plain working copy at or above the
/// directory.
pub(super) fn locate(fetcher: &Arc<Fetcher>, name: Option<&str>, dir: Option<&Path>) -> Result<Location> {
    let start = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir()?,
    };
    if mado_mount::control::find_mount(&start)?.is_some() {
        return Ok(Location::Mount(start));
    }
    let Some(name) = name else { return Ok(Location::Dir(working_copy_around(&start)?)) };
    let sock = mado_mount::control::workspace_socket_path(fetcher.remote.url(), name)?;
    if sock.exists() {
        return Ok(Location::Served(sock));
    }
    if dir.is_none() && workspace::find_working_copy(&start).is_none() {
        let mounted_here = workspace::Workspace::new(fetcher, name)?
            .last_mounted_at()
            .filter(|at| mado_mount::control::find_mount(at).is_ok_and(|m| m.is_some()));
        if let Some(at) = mounted_here {
            return Ok(Location::Mount(at));
        }
    }
    Ok(Location::Dir(working_copy_around(&start)?))
}

pub(super) async fn checkpoint(a: CheckpointArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    let at = locate(fetcher, a.name.as_deref(), a.dir.as_deref())?;
    let (r, remote) = match &at {
        Location::Dir(dir) => {
            // This process does nothing else: all of it yields the CPU to
            // foreground work (docs/DESIGN.md, "Background work").
            mado_core::priority::lower_this_process(mado_core::priority::checkpoint_nice());
            (checkpoint_dir(fetcher, dir, &a).await?, fetcher.remote.stats())
        }
        // The daemon did the work: its counts.
        by_daemon => {
            let op = Op::Checkpoint {
                message: a.message.clone(),
                steal: a.steal,
                force: a.force,
                name: a.name.clone(),
                no_ignore: a.no_ignore,
            };
            match ask_daemon_at(by_daemon, op)? {
                Reply::Checkpoint { report, remote } => (report, remote),
                r => return Err(super::super::unexpected(&r)),
            }
        }
    };
    if !matches!(at, Location::Dir(_)) {
        // --verbose closes with this process's own counts, which are not
        // the checkpoint's (they read 0 PUTs after 8 MB went up).
        ctx.step(format!("the daemon serving the workspace checkpointed it; its remote: {remote}"));
    }
    print_checkpoint(ctx, &r, remote)
}

pub(super) async fn status(a: StatusArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    let s = match locate(fetcher, None, a.dir.as_deref())? {
        Location::Dir(dir) => workspace::status(fetcher, &dir, a.no_ignore).await?,
        // Inside a workspace mount: its daemon answers.
        by_daemon => match ask_daemon_at(&by_daemon, Op::Status { no_ignore: a.no_ignore })? {
            Reply::Status { status } => status,
            r => return Err(super::super::unexpected(&r)),
        },
    };
    if ctx.json {
        return ctx.print_json(&s);
    }
    for (tag, paths) in [("A", &s.added), ("M", &s.modified), ("D", &s.deleted)] {
        for p in paths {
            println!("{tag} {}", super::super::shown(p));
        }
    }
    if s.paths_ignored > 0 {
        note!(ctx, "({} paths left out: .git, ignore rules, FIFOs and sockets)", s.paths_ignored);
    }
    if s.added.is_empty() && s.modified.is_empty() && s.deleted.is_empty() {
        note!(ctx, "nothing changed since {} (workspace {})", mado_core::hash::short_hex(&s.base), s.workspace);
    }
    if let Some(to) = &s.moved_to {
        note!(
            ctx,
            "note: workspace {} moved on to {} since this copy's base {} (another copy checkpointed): \
             a checkpoint here would be refused; resume it elsewhere to continue from there, \
             or `mado ws checkpoint --force` to replace it with this copy",
            s.workspace,
            mado_core::hash::short_hex(to),
            mado_core::hash::short_hex(&s.base)
        );
    }
    Ok(())
}

/// The plain working copy at or above `start` (a mount's daemon is asked
/// before this), or the error saying what to do.
fn working_copy_around(start: &std::path::Path) -> Result<PathBuf> {
    workspace::find_working_copy(start).ok_or_else(|| {
        mado_core::Error::User(format!(
            "{} is not inside a workspace (a plain working copy or a workspace mount); pass --dir, \
             or create one with `mado ws create`",
            start.display()
        ))
        .into()
    })
}

/// Checkpoints a plain-directory working copy.
async fn checkpoint_dir(
    fetcher: &std::sync::Arc<mado_core::fetch::Fetcher>,
    dir: &std::path::Path,
    a: &CheckpointArgs,
) -> Result<workspace::CheckpointReport> {
    if let Some(n) = &a.name {
        let st = workspace::load_state(dir)?;
        if &st.name != n {
            return Err(mado_core::Error::User(format!(
                "{} is a working copy of workspace {}, not {n}",
                dir.display(),
                st.name
            ))
            .into());
        }
    }
    let lease = workspace::CheckpointLease { steal: a.steal, force: a.force, no_ignore: a.no_ignore };
    Ok(workspace::checkpoint(fetcher, dir, &a.message, lease).await?)
}

/// Sends `op` to the daemon serving `at`, a mount or a workspace served
/// to a VM guest (a mount's daemon refuses a checkpoint naming another
/// workspace than its own before doing anything). A checkpoint of a large
/// change may take long: no short bound here.
fn ask_daemon_at(at: &Location, op: Op) -> Result<Reply> {
    let day = std::time::Duration::from_secs(24 * 3600);
    match at {
        Location::Mount(inside) => super::super::ask_daemon(Some(inside), op, day),
        Location::Served(sock) => {
            let what = format!("the workspace served at {}", sock.display());
            super::super::ask_socket(sock, &what, SERVED_HINT, op, day)
        }
        Location::Dir(dir) => Err(anyhow::anyhow!("no daemon serves the plain working copy {}", dir.display())),
    }
}

fn print_checkpoint(ctx: &Ctx, r: &workspace::CheckpointReport, remote: Stats) -> Result<()> {
    ctx.step(format!("read {} files, {} unchanged", r.files_read, r.files_unchanged));
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            r: &'a workspace::CheckpointReport,
            remote: Stats,
        }
        return ctx.print_json(&Out { r, remote });
    }
    if r.unchanged {
        say!(ctx, "workspace {}: nothing changed since {}", r.workspace, &r.snapshot[..12]);
    } else {
        // Trees travel inline in the index layer (packs-first), not as
        // objects: the line counts what went up by what it went up as.
        say!(
            ctx,
            "workspace {} -> {}: {} bytes up ({} packs, an index layer of {} bytes, {} objects alone); {} files read",
            r.workspace,
            &r.snapshot[..12],
            remote.bytes_up,
            r.packs_uploaded,
            r.index_bytes,
            r.upload.objects_uploaded,
            r.files_read
        );
    }
    Ok(())
}
