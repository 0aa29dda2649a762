//! `ws create` and `ws resume`: a workspace's working copy made here.

use std::sync::Arc;

use anyhow::Result;
use mado_core::fetch::Fetcher;
use mado_core::workspace::{self, Workspace};

use super::args::{CreateArgs, ResumeArgs};
use crate::ctx::Ctx;

pub(super) async fn create(a: CreateArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
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
            let ws = Workspace::new(fetcher, &name)?;
            if let Err(e) = ws.create_ref(&from).await {
                unmake(&mp);
                return Err(e.into());
            }
            ctx.step("workspace ref created");
            let mounted = super::super::mount::run(
                super::super::mount::workspace_args(&name, mp.clone(), false, allow_other),
                ctx,
            )
            .await;
            if mounted.is_err() {
                unmake(&mp);
                // Never mounted, so never changed: take the new ref back,
                // so that fixing the cause and running the same command
                // again works (rather than "already exists").
                let _ = ws.remove(true, None).await;
                // Nor its state folder, if the daemon made one.
                let _ = ws.forget_unused_mount_state();
            }
            mounted
        }
        a if a.no_checkout => {
            let id = Workspace::new(fetcher, &a.name)?.create_ref(&a.from).await?.snapshot;
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "workspace": a.name, "snapshot": id.to_hex() }));
            }
            say!(ctx, "created workspace {} at {} (no working copy)", a.name, &id.to_hex()[..12]);
            Ok(())
        }
        a => {
            let dir = a.dir.expect("clap requires --dir, --mount or --no-checkout");
            let (pb, p) = ctx.progress_counter("checking out");
            let r = Workspace::new(fetcher, &a.name)?.create(&a.from, &dir, &p).await;
            pb.finish_and_clear();
            print_resume(ctx, "created", &r?)
        }
    }
}

pub(super) async fn resume(a: ResumeArgs, ctx: &Ctx, fetcher: &Arc<Fetcher>) -> Result<()> {
    match a {
        a if a.mount => {
            super::super::mount::run(super::super::mount::workspace_args(&a.name, a.dir, a.steal, a.allow_other), ctx)
                .await
        }
        a => {
            // Work a mount here saved and never checkpointed would not be
            // in this copy, and a checkpoint from it would leave that work
            // behind: said before anything is fetched or written.
            let ws = Workspace::new(fetcher, &a.name)?;
            if let Some(st) = ws.uncheckpointed_mount_state()? {
                check_mount_changes(ctx, &ws, &a, &st).await?;
            }
            let (pb, p) = ctx.progress_counter("restoring");
            let lease = if a.read_only {
                workspace::ResumeLease::ReadOnly
            } else {
                workspace::ResumeLease::Take { steal: a.steal }
            };
            let r = ws.resume(&a.dir, lease, &p).await;
            pb.finish_and_clear();
            print_resume(ctx, "resumed", &r?)
        }
    }
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

/// Before `ws resume NAME DIR`: work a mount here saved and never
/// checkpointed (`st`) would not be in the copy, and a checkpoint from it
/// would leave that work behind: refused (said before anything is fetched
/// or written) unless --ignore-mount-changes or --read-only.
async fn check_mount_changes(ctx: &Ctx, ws: &Workspace, a: &ResumeArgs, st: &workspace::MountState) -> Result<()> {
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
    let dead = match ws.check_lease_free(a.steal).await {
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
        ws.release_lease(&st.holder).await?;
        note!(ctx, "note: released the lease the dead mount of {} held", a.name);
    }
    note!(ctx, "note: {what}; they stay saved, and are not in {}", a.dir.display());
    Ok(())
}
