use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use clap::{Args, Subcommand};
use mado_core::fetch::Fetcher;
use mado_core::store::Stats;
use mado_core::workspace;
use mado_mount::protocol::{Op, Reply};

use crate::ctx::Ctx;

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
    /// compare-and-swap under the workspace's single-writer lease.
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

#[derive(Args)]
pub struct RecoverArgs {
    /// The set-aside folder (as the mount's warning or the listing names
    /// it, or its last component).
    aside: Option<PathBuf>,
    /// The new workspace's name (default: NAME-recovered).
    #[arg(long = "as", value_name = "NEW", requires = "aside")]
    as_name: Option<String>,
    /// Instead, write the files the changes hold (what the mount wrote,
    /// its symlinks and new directories; not its removals) into DIR, a
    /// new or empty directory. Reads nothing from the store: for changes
    /// whose checkpoint gc deleted.
    #[arg(long, value_name = "DIR", requires = "aside", conflicts_with = "as_name")]
    to: Option<PathBuf>,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("working_copy").required(true).multiple(false).args(["dir", "mount", "no_checkout"])))]
pub struct CreateArgs {
    name: String,
    /// Ref name or snapshot id to start from (main~2, main^: git's ancestry steps).
    #[arg(long, default_value = "main", value_name = "REF")]
    from: String,
    /// The working copy as a plain directory: a new or empty directory.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The working copy as a read-write FUSE mount at DIR (an empty directory; created if missing).
    #[arg(long, value_name = "DIR")]
    mount: Option<PathBuf>,
    /// Only create the workspace, with no working copy here: to serve it
    /// to a VM guest (`mado serve-virtiofs NAME --workspace`), or to
    /// resume it later (`ws resume`).
    #[arg(long)]
    no_checkout: bool,
    /// With --mount: let other users in, the kernel checking the modes
    /// (see `mado mount --allow-other`).
    #[arg(long, requires = "mount")]
    allow_other: bool,
}

#[derive(Args)]
pub struct CheckpointArgs {
    /// Workspace name: outside any copy of it, its mount on this machine or
    /// the copy `serve-virtiofs` serves (default: the working copy or mount
    /// around the current directory).
    name: Option<String>,
    #[arg(short, long, default_value = "checkpoint")]
    message: String,
    /// The working copy (default: found from the current directory).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Take the lease even though another holder had it, once it has expired.
    #[arg(long)]
    steal: bool,
    /// Replace the workspace's head even though it moved since this working
    /// copy's base (the newer checkpoints stay in `ws log`, not in the head).
    #[arg(long)]
    force: bool,
    /// Keep everything: by default a working copy's checkpoint leaves out
    /// `.git` directories and the untracked paths that `.gitignore` and
    /// `.madoignore` files ignore (git's syntax; a tracked path stays).
    #[arg(long)]
    no_ignore: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    /// The working copy (default: found from the current directory).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// As `ws checkpoint --no-ignore` would see it.
    #[arg(long)]
    no_ignore: bool,
}

#[derive(Args)]
pub struct ReleaseArgs {
    /// Workspace name (checked against the working copy's).
    name: Option<String>,
    /// The working copy (default: found from the current directory).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct ResumeArgs {
    name: String,
    /// Where to restore it: a new or empty directory (with --mount: the mount point).
    dir: PathBuf,
    /// Mount it read-write at DIR instead of materializing it; changes not
    /// yet checkpointed by an earlier mount on this machine are kept.
    #[arg(long)]
    mount: bool,
    /// With --mount: let other users in, the kernel checking the modes
    /// (see `mado mount --allow-other`).
    #[arg(long, requires = "mount")]
    allow_other: bool,
    /// Take the lease once it has expired, even if another holder had it.
    #[arg(long)]
    steal: bool,
    /// Restore a copy without taking the lease: it can be read and changed
    /// but never checkpointed (for looking at a workspace someone else holds).
    #[arg(long, conflicts_with_all = ["mount", "steal"])]
    read_only: bool,
    /// Resume into DIR even though a mount of the workspace on this machine
    /// saved changes no checkpoint holds (they stay saved; the next mount
    /// sets them aside, and `mado ws recover` gets them back).
    #[arg(long, conflicts_with = "mount")]
    ignore_mount_changes: bool,
}

#[derive(Args)]
pub struct LogArgs {
    name: String,
    /// Show at most this many checkpoints (default: all).
    #[arg(long = "max-count", alias = "max", short = 'n', value_name = "N")]
    max: Option<usize>,
}

#[derive(Args)]
pub struct RmArgs {
    name: String,
    /// Remove it even while a working copy holds its lease (that copy can
    /// then no longer checkpoint).
    #[arg(long)]
    force: bool,
}

fn print_resume(ctx: &Ctx, verb: &str, r: &workspace::ResumeReport) -> Result<()> {
    if r.read_only {
        note!(ctx, "note: resumed --read-only: this copy holds no lease and cannot checkpoint");
    }
    if r.removed_partial {
        note!(ctx, "note: removed the partial copy an interrupted resume had left in {}", r.dir);
    }
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            r: &'a workspace::ResumeReport,
            remote: mado_core::store::Stats,
            packs: mado_core::fetch::FetchStats,
        }
        let f = ctx.fetcher()?;
        return ctx.print_json(&Out { r, remote: f.remote.stats(), packs: f.stats() });
    }
    say!(
        ctx,
        "{verb} workspace {} at {} in {}: {} files, {} mtimes restored",
        r.workspace,
        &r.snapshot[..12],
        r.dir,
        r.files,
        r.mtimes_restored
    );
    Ok(())
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

async fn create(a: CreateArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    match a {
        CreateArgs { name, from, mount: Some(mp), allow_other, .. } => {
            // A new workspace's mount point is made for it, as `ws create
            // --dir` and `checkout` make their directory.
            let made = !mp.exists();
            if made {
                std::fs::create_dir_all(&mp)
                    .map_err(|e| mado_core::Error::User(format!("cannot create {}: {e}", mp.display())))?;
            }
            if !mp.is_dir() {
                return Err(mado_core::Error::User(format!("{} is not a directory", mp.display())).into());
            }
            // What this command made goes again if it fails (an empty
            // directory only: remove_dir leaves anything with content).
            let unmake = |mp: &std::path::Path| {
                if made {
                    let _ = std::fs::remove_dir(mp);
                }
            };
            if let Err(e) = workspace::create_ref(fetcher, &name, &from).await {
                unmake(&mp);
                return Err(e.into());
            }
            ctx.step("workspace ref created");
            let mounted =
                super::mount::run(super::mount::workspace_args(&name, mp.clone(), false, allow_other), ctx).await;
            if mounted.is_err() {
                unmake(&mp);
                // Never mounted, so never changed: take the new ref back,
                // so that fixing the cause and running the same command
                // again works (rather than "already exists").
                let _ = workspace::remove(&fetcher.remote, &name, true, None).await;
                // Nor its state folder, if the daemon made one.
                let _ = workspace::forget_unused_mount_state(fetcher, &name);
            }
            mounted
        }
        a if a.no_checkout => {
            let id = workspace::create_ref(fetcher, &a.name, &a.from).await?.snapshot;
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "workspace": a.name, "snapshot": id.to_hex() }));
            }
            say!(ctx, "created workspace {} at {} (no working copy)", a.name, &id.to_hex()[..12]);
            Ok(())
        }
        a => {
            let dir = a.dir.expect("clap requires --dir, --mount or --no-checkout");
            let (pb, p) = ctx.progress_counter("checking out");
            let r = workspace::create(fetcher, &a.name, &a.from, &dir, &p).await;
            pb.finish_and_clear();
            print_resume(ctx, "created", &r?)
        }
    }
}

async fn resume(a: ResumeArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    match a {
        a if a.mount => {
            super::mount::run(super::mount::workspace_args(&a.name, a.dir, a.steal, a.allow_other), ctx).await
        }
        a => {
            // Work a mount here saved and never checkpointed would not be
            // in this copy, and a checkpoint from it would leave that work
            // behind: said before anything is fetched or written.
            if let Some(st) = workspace::uncheckpointed_mount_state(fetcher, &a.name)? {
                check_mount_changes(ctx, fetcher, &a, &st).await?;
            }
            let (pb, p) = ctx.progress_counter("restoring");
            let lease = if a.read_only {
                workspace::ResumeLease::ReadOnly
            } else {
                workspace::ResumeLease::Take { steal: a.steal }
            };
            let r = workspace::resume(fetcher, &a.name, &a.dir, lease, &p).await;
            pb.finish_and_clear();
            print_resume(ctx, "resumed", &r?)
        }
    }
}

async fn checkpoint(a: CheckpointArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    let start = match a.dir.clone() {
        Some(d) => d,
        None => std::env::current_dir()?,
    };
    // A mount around the directory first (a working copy's `.mado`
    // is looked up through it, then above it); else a workspace
    // served to a VM guest (`mado serve-virtiofs --workspace`),
    // which has no directory here: found by its name.
    let mounted = mado_mount::control::find_mount(&start)?.is_some();
    let served = match (&a.name, mounted) {
        (Some(n), false) => {
            Some(mado_mount::control::workspace_socket_path(fetcher.remote.url(), n)?).filter(|s| s.exists())
        }
        _ => None,
    };
    // Named, from outside any copy of it: its mount on this machine
    // (the daemon checks the name is its workspace's).
    let mounted_here = match (&a.name, mounted, a.dir.is_some(), &served) {
        (Some(n), false, false, None) if workspace::find_working_copy(&start).is_none() => {
            workspace::last_mounted_at(fetcher, n)
                .filter(|at| mado_mount::control::find_mount(at).is_ok_and(|m| m.is_some()))
        }
        _ => None,
    };
    let by_daemon = mounted || mounted_here.is_some() || served.is_some();
    let (r, remote) = if mounted {
        // The daemon did the work: its counts.
        checkpoint_mount(&start, &a)?
    } else if let Some(at) = mounted_here {
        checkpoint_mount(&at, &a)?
    } else if let Some(sock) = served {
        checkpoint_served(&sock, &a)?
    } else {
        let dir = working_copy_around(&start)?;
        (checkpoint_dir(fetcher, &dir, &a).await?, fetcher.remote.stats())
    };
    if by_daemon {
        // --verbose closes with this process's own counts, which
        // are not the checkpoint's (they read 0 PUTs after 8 MB
        // went up: found by a review).
        ctx.step(format!("the daemon serving the workspace checkpointed it; its remote: {remote}"));
    }
    print_checkpoint(ctx, &r, remote)
}

async fn status(a: StatusArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    let start = match a.dir {
        Some(d) => d,
        None => std::env::current_dir()?,
    };
    // Inside a workspace mount: its daemon answers.
    let s = if mado_mount::control::find_mount(&start)?.is_some() {
        let op = Op::Status { no_ignore: a.no_ignore };
        match super::ask_daemon(Some(&start), op, std::time::Duration::from_secs(24 * 3600))? {
            Reply::Status { status } => status,
            r => return Err(super::unexpected(&r)),
        }
    } else {
        let dir = working_copy_around(&start)?;
        workspace::status(fetcher, &dir, a.no_ignore).await?
    };
    if ctx.json {
        return ctx.print_json(&s);
    }
    for (tag, paths) in [("A", &s.added), ("M", &s.modified), ("D", &s.deleted)] {
        for p in paths {
            println!("{tag} {}", super::shown(p));
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
            Some(mado_core::Error::NotFound(_)) => {
                mado_core::Error::NotFound(format!("no workspace named {}; see `mado ws list`", a.name)).into()
            }
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
    let held = workspace::lock_for_removal(fetcher, &a.name);
    if let (Err(e), false) = (&held, a.force) {
        return Err(mado_core::Error::User(format!(
            "{e}\n  hint: unmount it first; with --force the workspace goes now, and that mount's \
             work is set aside when it ends (`mado ws recover` lists it)"
        ))
        .into());
    }
    // A lease held by a mount of it here whose daemon died (the
    // state lock is ours, so no daemon serves it) refuses nothing.
    let dead = held.as_ref().ok().and_then(|_| workspace::local_mount_holder(fetcher, &a.name));
    workspace::remove(&fetcher.remote, &a.name, a.force, dead.as_deref()).await?;
    let aside = match &held {
        Ok(lock) => workspace::set_aside_removed(fetcher, &a.name, lock),
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

/// Before `ws resume NAME DIR`: work a mount here saved and never
/// checkpointed (`st`) would not be in the copy, and a checkpoint from it
/// would leave that work behind: refused (said before anything is fetched
/// or written) unless --ignore-mount-changes or --read-only.
async fn check_mount_changes(
    ctx: &Ctx,
    fetcher: &std::sync::Arc<mado_core::fetch::Fetcher>,
    a: &ResumeArgs,
    st: &workspace::MountState,
) -> Result<()> {
    let on = match st.head.get(..12) {
        Some(h) => format!(" on top of checkpoint {h}"),
        None => String::new(),
    };
    // A live mount's changes are not known here (it may have none): what
    // it may have made since its last checkpoint is what no copy has.
    let what = if st.live {
        format!(
            "workspace {} is mounted on this machine: what that mount changed since its last checkpoint \
             is in no checkpoint (its state is in {})",
            a.name,
            st.dir.display()
        )
    } else {
        format!(
            "workspace {} has changes{on} that a mount on this machine saved and no checkpoint holds (in {})",
            a.name,
            st.dir.display()
        )
    };
    if a.read_only {
        note!(ctx, "note: {what}; this copy does not have them");
        return Ok(());
    }
    // The lease a live mount holds: that refusal says more. The lease a
    // dead one took (its daemon killed) is known here to be held by no
    // one: no reason to wait for it to expire.
    let dead = match workspace::check_lease_free(&fetcher.remote, &a.name, a.steal).await {
        Ok(()) => false,
        Err(mado_core::Error::LeaseHeld { holder, .. }) if !st.live && !st.holder.is_empty() && holder == st.holder => {
            true
        }
        Err(e) => return Err(e.into()),
    };
    if !a.ignore_mount_changes {
        let died = if dead { " (its daemon died; mounting it again here picks them up)" } else { "" };
        return Err(mado_core::Error::User(format!(
            "{what}{died}; a copy resumed into a directory would not have them\n  hint: mount it to see and \
             checkpoint them (`mado ws resume {} --mount DIR`, then `mado ws checkpoint` in it), or resume \
             anyway with --ignore-mount-changes (they stay saved: the next mount sets them aside, and \
             `mado ws recover` gets them back)",
            a.name
        ))
        .into());
    }
    if dead {
        workspace::release_lease(&fetcher.remote, &a.name, &st.holder).await?;
        note!(ctx, "note: released the lease the dead mount of {} held", a.name);
    }
    note!(ctx, "note: {what}; they stay saved, and are not in {}", a.dir.display());
    Ok(())
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

/// Asks the daemon of the workspace mount holding `start` to checkpoint
/// (it refuses a `name` other than its workspace's before doing anything).
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

fn checkpoint_mount(start: &std::path::Path, a: &CheckpointArgs) -> Result<(workspace::CheckpointReport, Stats)> {
    let op = Op::Checkpoint {
        message: a.message.clone(),
        steal: a.steal,
        force: a.force,
        name: a.name.clone(),
        no_ignore: a.no_ignore,
    };
    // A checkpoint of a large change may take long: no short bound here.
    match super::ask_daemon(Some(start), op, std::time::Duration::from_secs(24 * 3600))? {
        Reply::Checkpoint { report, remote } => Ok((report, remote)),
        r => Err(super::unexpected(&r)),
    }
}

fn checkpoint_served(sock: &std::path::Path, a: &CheckpointArgs) -> Result<(workspace::CheckpointReport, Stats)> {
    let name = a.name.clone().unwrap_or_default();
    let op = Op::Checkpoint {
        message: a.message.clone(),
        steal: a.steal,
        force: a.force,
        name: a.name.clone(),
        no_ignore: a.no_ignore,
    };
    let what = format!("workspace {name}");
    let hint = "if its `mado serve-virtiofs` died, start it again (it takes the lease back)";
    match super::ask_socket(sock, &what, hint, op, std::time::Duration::from_secs(24 * 3600))? {
        Reply::Checkpoint { report, remote } => Ok((report, remote)),
        r => Err(super::unexpected(&r)),
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

const EX_CREATE: &str = "Examples:
  mado ws create agent-1 --from main --mount ~/work/agent-1   # a read-write mount
  mado ws create agent-2 --from release --dir ~/work/agent-2  # a plain directory
  mado ws create vm-1 --no-checkout                           # to serve to a VM guest";

const EX_CHECKPOINT: &str = "Examples:
  cd ~/work/agent-1 && mado ws checkpoint -m \"tests pass\"
  mado ws checkpoint --dir ~/work/agent-2 --json
  mado ws checkpoint vm-1 -m \"from the guest\"     # a workspace served to a VM";

const EX_STATUS: &str = "Examples:
  cd ~/work/agent-2 && mado ws status
  mado ws status --dir ~/work/agent-2 --json";

const EX_RESUME: &str = "Examples:
  mado ws resume agent-1 ~/elsewhere              # takes the lease
  mado ws resume agent-1 ~/peek --read-only       # no lease, never checkpoints
  mado ws resume agent-1 ~/mnt/agent-1 --mount    # as a read-write mount";

const EX_LIST: &str = "Examples:
  mado ws list
  mado ws list --json | jq -r '.[].name'";

const EX_WS_LOG: &str = "Examples:
  mado ws log agent-1                         # every checkpoint, newest first
  mado ws log agent-1 -n 3 --json";

const EX_RELEASE: &str = "Examples:
  mado ws release                             # inside a plain working copy
  mado ws release agent-2 --dir ~/work/agent-2";

const EX_RECOVER: &str = "Examples:
  mado ws recover                       # list the changes mounts set aside here
  mado ws recover ~/.local/share/mado/workspaces/3f2a….old-1795782237 --as fix-retry
  mado ws resume fix-retry --mount ~/w  # the changes, on the checkpoint they were made on
  cd ~/w && mado ws checkpoint -m 'recovered'
  mado ws recover 3f2a….old-1795782237 --to ~/saved   # just the files, when gc deleted their checkpoint";

const EX_RM: &str = "Examples:
  mado ws rm agent-1                          # the ref and lease; then `mado gc` reclaims the rest
  mado ws rm --force agent-1                  # even while a working copy holds its lease";
