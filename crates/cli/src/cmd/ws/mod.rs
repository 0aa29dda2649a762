//! `mado ws`: workspaces. One file per group of subcommands; `run` only
//! dispatches.

mod args;
mod checkpoint;
mod resume;

use std::sync::Arc;

use anyhow::Result;
use clap::Subcommand;
use mado_core::fetch::Fetcher;
use mado_core::workspace;

use crate::ctx::Ctx;
use args::{
    CheckpointArgs, CreateArgs, LogArgs, RecoverArgs, ReleaseArgs, ResumeArgs, RmArgs, StatusArgs, EX_CHECKPOINT,
    EX_CREATE, EX_LIST, EX_RECOVER, EX_RELEASE, EX_RESUME, EX_RM, EX_STATUS, EX_WS_LOG,
};
use checkpoint::{checkpoint, status};
use resume::{create, resume};

/// Workspaces: a named, checkpointed working copy that can be resumed,
/// byte for byte (content, exec bits, symlinks, mtimes), on any machine.
#[derive(Subcommand)]
pub enum WsCommand {
    /// Create workspace NAME from a snapshot, as a read-write mount
    /// (--mount: lazy, changes kept locally until checkpointed) or a plain
    /// directory (--dir: materialized through packs, for machines without FUSE).
    #[command(after_help = EX_CREATE)]
    Create(CreateArgs),
    /// Upload what changed in the working copy, as a new snapshot whose
    /// parent is the previous checkpoint, and move `ws/NAME` with
    /// compare-and-swap under the workspace's single-writer lease. It runs
    /// at a lower CPU priority (nice +10; MADO_CHECKPOINT_NICE=0 to 19
    /// sets it, 0 keeps the caller's), so it yields to foreground work.
    #[command(after_help = EX_CHECKPOINT)]
    Checkpoint(CheckpointArgs),
    /// What a checkpoint of this working copy (a plain directory or a
    /// workspace mount) would record: paths added, modified (content, kind
    /// or exec bit) and deleted since the snapshot it is based on, like `git
    /// status --short`. Nothing is uploaded and no lease is taken.
    #[command(after_help = EX_STATUS)]
    Status(StatusArgs),
    /// Restore a workspace's latest checkpoint into DIR (content, exec
    /// bits, symlinks and mtimes), taking its lease when free.
    #[command(after_help = EX_RESUME)]
    Resume(ResumeArgs),
    /// List the workspaces in the store.
    #[command(after_help = EX_LIST)]
    List,
    /// Show a workspace's checkpoints, newest first (times in local time;
    /// `--json` gives seconds since the Unix epoch).
    #[command(after_help = EX_WS_LOG)]
    Log(LogArgs),
    /// Give up the lease a plain working copy holds, so the workspace can be
    /// resumed elsewhere at once (a mount releases its lease when unmounted).
    #[command(after_help = EX_RELEASE)]
    Release(ReleaseArgs),
    /// Delete a workspace's ref and lease (working copies are left alone;
    /// `mado gc` reclaims what nothing else reaches).
    #[command(after_help = EX_RM)]
    Rm(RmArgs),
    /// Get back changes a workspace mount set aside: with no argument, list
    /// them; with one, make them a new workspace (created at the checkpoint
    /// they were made on) whose next mount shows them, to checkpoint there.
    /// A mount sets changes aside when the workspace moved on elsewhere
    /// since they were made.
    #[command(after_help = EX_RECOVER)]
    Recover(RecoverArgs),
}

impl WsCommand {
    /// `ws` and the subcommand, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            WsCommand::Create(_) => "ws create",
            WsCommand::Checkpoint(_) => "ws checkpoint",
            WsCommand::Status(_) => "ws status",
            WsCommand::Resume(_) => "ws resume",
            WsCommand::List => "ws list",
            WsCommand::Log(_) => "ws log",
            WsCommand::Release(_) => "ws release",
            WsCommand::Rm(_) => "ws rm",
            WsCommand::Recover(_) => "ws recover",
        }
    }
}

pub async fn run(c: WsCommand, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    match c {
        WsCommand::Create(a) => create(a, ctx, &fetcher).await,
        WsCommand::Resume(a) => resume(a, ctx, &fetcher).await,
        WsCommand::Checkpoint(a) => checkpoint(a, ctx, &fetcher).await,
        WsCommand::Status(a) => status(a, ctx, &fetcher).await,
        WsCommand::List => list(ctx, &fetcher).await,
        WsCommand::Log(a) => log(a, ctx).await,
        WsCommand::Release(a) => release(a, ctx, &fetcher).await,
        WsCommand::Recover(a) => recover(a, ctx, &fetcher).await,
        WsCommand::Rm(a) => rm(a, ctx, &fetcher).await,
    }
}

async fn list(ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    let l = workspace::list(fetcher).await?;
    if ctx.json {
        return ctx.print_json(&l);
    }
    if !l.is_empty() {
        println!("{:<24} {:<12}  MESSAGE", "WORKSPACE", "SNAPSHOT");
    }
    for w in l {
        println!("{:<24} {}  {}", w.name, &w.snapshot[..12], w.message.lines().next().unwrap_or(""));
    }
    Ok(())
}

async fn log(a: LogArgs, ctx: &Ctx) -> Result<()> {
    let args = super::log::LogArgs::for_ref(format!("ws/{}", a.name), a.max);
    super::log::run(args, ctx).await.map_err(|e| {
        // "no ref named ws/x" would point at import-git.
        match e.downcast_ref::<mado_core::Error>() {
            Some(m) if m.is_not_found() => mado_core::Error::NotFound(format!("no workspace named {}", a.name))
                .then(mado_core::error::Next::ListWorkspaces)
                .into(),
            _ => e,
        }
    })
}

async fn release(a: ReleaseArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    let start = match a.dir {
        Some(d) => d,
        None => std::env::current_dir()?,
    };
    // The partial copy of an interrupted resume: its lease.
    if let Some((name, released)) = workspace::release_interrupted(fetcher, &start, a.name.as_deref()).await? {
        if ctx.json {
            return ctx.print_json(&serde_json::json!({ "workspace": name, "released": released }));
        }
        if released {
            say!(
                ctx,
                "released the lease of workspace {name} that an interrupted resume into {} held",
                start.display()
            );
        } else {
            say!(
                ctx,
                "the interrupted resume into {} did not hold the lease of workspace {name}; nothing to release",
                start.display()
            );
        }
        note!(
            ctx,
            "note: {} holds that resume's partial copy: remove it, or `mado ws resume {name} {}` (which removes it and finishes)",
            start.display(),
            start.display()
        );
        return Ok(());
    }
    let dir = workspace::find_working_copy(&start).ok_or_else(|| {
        match mado_mount::control::find_mount(&start).ok().flatten() {
            // A mount holds its lease while mounted.
            Some((mp, _)) => mado_core::Error::User(format!(
                "{} is in the mount at {}, which holds its workspace's lease while mounted; \
                 `mado umount {}` gives it back",
                start.display(),
                mp.display(),
                mp.display()
            )),
            None => mado_core::Error::User(format!(
                "{} is not inside a plain working copy; pass the copy's directory with --dir \
                 (a mount gives its lease back when unmounted: `mado umount DIR`)",
                start.display()
            )),
        }
    })?;
    let st = workspace::load_state(&dir)?;
    if let Some(n) = a.name.as_ref().filter(|n| **n != st.name) {
        return Err(mado_core::Error::User(format!(
            "{} is a working copy of workspace {}, not {n}",
            dir.display(),
            st.name
        ))
        .into());
    }
    let (name, released) = workspace::release(fetcher, &dir).await?;
    if ctx.json {
        return ctx.print_json(&serde_json::json!({ "workspace": name, "released": released }));
    }
    if released {
        say!(ctx, "released the lease of workspace {name}: it can be resumed elsewhere now");
    } else {
        say!(ctx, "this working copy did not hold the lease of workspace {name}; nothing to release");
    }
    Ok(())
}

async fn recover(a: RecoverArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    match a {
        RecoverArgs { aside: None, .. } => {
            let all = workspace::list_set_aside(fetcher)?;
            if ctx.json {
                return ctx.print_json(&all);
            }
            if all.is_empty() {
                note!(ctx, "no changes set aside for this store on this machine");
                return Ok(());
            }
            println!("{:<20}  {:<12}  {:<26}  SET-ASIDE FOLDER", "WORKSPACE", "CHECKPOINT", "SET ASIDE");
            for a in &all {
                println!(
                    "{:<20}  {:<12}  {:<26}  {}",
                    a.workspace,
                    mado_core::hash::short_hex(&a.checkpoint),
                    mado_core::error::local_time(a.time),
                    a.dir
                );
            }
            Ok(())
        }
        RecoverArgs { aside: Some(aside), as_name, to } => {
            // A bare folder name is looked up beside the workspaces' states.
            let path = if aside.components().count() == 1 && !aside.exists() {
                workspace::workspaces_root()?.join(&aside)
            } else {
                aside
            };
            if let Some(to) = to {
                let x = workspace::export_set_aside(&path, &to)?;
                if ctx.json {
                    return ctx.print_json(&x);
                }
                say!(
                    ctx,
                    "wrote the changes set aside from workspace {} (made on checkpoint {}) into {}: \
                 {} files ({} bytes), {} symlinks, {} new directories\n\
                 these are what the mount wrote; files it removed or left unchanged are not there. \
                 {} still holds them: remove it once you have what you need",
                    x.workspace,
                    mado_core::hash::short_hex(&x.checkpoint),
                    x.dir,
                    x.files,
                    x.bytes,
                    x.symlinks,
                    x.dirs,
                    path.display()
                );
                return Ok(());
            }
            let (r, new) = workspace::recover_set_aside(fetcher, &path, as_name.as_deref()).await?;
            if ctx.json {
                return ctx.print_json(&serde_json::json!({
                    "workspace": new, "from": r.workspace, "snapshot": r.checkpoint, "state": r.dir,
                }));
            }
            say!(
                ctx,
                "recovered the changes set aside from workspace {} (made on checkpoint {}) as workspace {new}\n\
             next: `mado ws resume {new} --mount DIR` shows them; `mado ws checkpoint` there saves them",
                r.workspace,
                &r.checkpoint[..12]
            );
            Ok(())
        }
    }
}

async fn rm(a: RmArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    // No mount of it starts here meanwhile; one running now keeps
    // its state (with --force: set aside when it ends).
    let ws = workspace::Workspace::new(fetcher, &a.name)?;
    let held = ws.lock_for_removal();
    if let (Err(e), false) = (&held, a.force) {
        return Err(mado_core::Error::User(format!(
            "{e}\n  hint: unmount it first; with --force the workspace goes now, and that mount's \
             work is set aside when it ends (`mado ws recover` lists it)"
        ))
        .into());
    }
    // A lease held by a mount of it here whose daemon died (the
    // state lock is ours, so no daemon serves it) refuses nothing.
    let dead = held.as_ref().ok().and_then(|_| ws.local_mount_holder());
    ws.remove(a.force, dead.as_deref()).await?;
    let aside = match &held {
        Ok(lock) => ws.set_aside_removed(lock),
        Err(_) => Ok(None),
    };
    drop(held);
    match aside {
        Ok(Some(aside)) => note!(
            ctx,
            "note: changes a mount of {} on this machine saved and never checkpointed were set aside in {}; \
             `mado ws recover {}` makes them a workspace (before `mado gc` deletes the checkpoint they \
             were made on)",
            a.name,
            aside.display(),
            aside.display()
        ),
        Ok(None) => {}
        Err(e) => note!(ctx, "warning: the saved state of a mount of {} here: {e}", a.name),
    }
    if ctx.json {
        return ctx.print_json(&serde_json::json!({ "removed": a.name }));
    }
    say!(ctx, "removed workspace {} (working copies are untouched)", a.name);
    Ok(())
}
