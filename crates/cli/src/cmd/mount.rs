use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use mado_mount::daemon;

use crate::ctx::Ctx;

/// Mount a snapshot read-only with FUSE (or, with --workspace, a workspace
/// read-write); content is fetched lazily.
///
/// Returns once the mount is ready (or says why it failed) and leaves a
/// daemon serving it; --foreground stays attached instead. Directory
/// listings and attributes come from the snapshot's trees with no network;
/// the first read of a file in a packed subtree fetches its whole pack in
/// one ranged GET. `mado pack-status DIR` and `mado stats DIR` ask the
/// daemon; `mado umount DIR` ends it. A daemon that was killed leaves a
/// disconnected mount: `mado umount DIR` (or mounting again) cleans it up.
///
/// With --workspace, SPEC names a workspace (`mado ws create`): the mount
/// is read-write, changes go to a local upper layer, and `mado ws
/// checkpoint` inside it uploads only what changed.
#[derive(Args)]
pub struct MountArgs {
    /// Ref name or snapshot id, and any of git's ancestry steps: main~2, main^ (with --workspace: the workspace name).
    spec: String,
    /// Mount point: an empty directory (made if missing).
    dir: PathBuf,
    /// Stay attached to the terminal instead of running as a daemon.
    #[arg(long)]
    pub foreground: bool,
    /// Seconds a read may wait for the store before failing with EIO.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    read_timeout: u64,
    /// Do not use FUSE passthrough for files already in the disk cache.
    #[arg(long)]
    no_passthrough: bool,
    /// Mount workspace SPEC read-write.
    #[arg(long)]
    workspace: bool,
    /// With --workspace: take the lease even though another holder had it, once expired.
    #[arg(long, requires = "workspace")]
    steal: bool,
    /// Let other users in (FUSE's allow_other), e.g. an agent running as
    /// another uid in a container mounted by root. The kernel checks every
    /// access against the files' modes. Needs root, or `user_allow_other`
    /// in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// (internal) report readiness on this inherited file descriptor.
    #[arg(long, hide = true)]
    ready_fd: Option<i32>,
    /// (internal) take the mount over from the daemon at the other end of
    /// this inherited socket (`mado restart`).
    #[arg(long, hide = true, requires = "foreground")]
    handover_fd: Option<i32>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ReadyMsg {
    ok: bool,
    mountpoint: String,
    snapshot: String,
    status: serde_json::Value,
    advisory: Option<String>,
    error: Option<String>,
    /// The error as the daemon would have reported it (its exit code,
    /// kind and causes), so `mado mount` exits as the daemon would have.
    #[serde(default)]
    failed: Option<crate::exit::Relayed>,
    #[serde(default)]
    warnings: Vec<String>,
}

/// The arguments that mount workspace `name` read-write at `dir`.
pub fn workspace_args(name: &str, dir: PathBuf, steal: bool, allow_other: bool) -> MountArgs {
    MountArgs {
        spec: name.to_string(),
        dir,
        foreground: false,
        read_timeout: 30,
        no_passthrough: false,
        workspace: true,
        steal,
        allow_other,
        ready_fd: None,
        handover_fd: None,
    }
}

pub async fn run(a: MountArgs, ctx: &Ctx) -> Result<()> {
    if a.handover_fd.is_some() {
        // The mount is there, served by the daemon handing it over, which
        // answers nothing meanwhile: not a stat of it until this one serves.
        return run_daemon(a, ctx);
    }
    // A missing mount point is made, as `checkout` and `ws create` make
    // their directory; and removed again (while empty) if the mount fails.
    let made = !a.dir.exists() && !daemon::is_disconnected(&a.dir);
    if made {
        std::fs::create_dir_all(&a.dir)
            .map_err(|e| mado_core::Error::User(format!("cannot create {}: {e}", a.dir.display())))?;
    }
    let dir = a.dir.clone();
    let r = mount(a, ctx).await;
    if r.is_err() && made {
        let _ = std::fs::remove_dir(&dir);
    }
    r
}

async fn mount(a: MountArgs, ctx: &Ctx) -> Result<()> {
    if !a.dir.is_dir() && !daemon::is_disconnected(&a.dir) {
        return Err(mado_core::Error::User(format!(
            "{} is not a directory (it is a file or another kind); mount on an empty directory, or a path that does \
             not exist yet",
            a.dir.display()
        ))
        .into());
    }
    if !daemon::is_disconnected(&a.dir) {
        check_mount_point(&a.dir)?;
    }
    // The store is opened here first: a store that is not there is the
    // user's to fix (exit 1), said before a daemon starts.
    ctx.remote()?;
    if a.foreground {
        return run_daemon(a, ctx);
    }
    // Re-run ourselves as the daemon, and wait on a pipe: the daemon writes
    // one line when the mount is up, or the pipe closes if it dies.
    let (mut r, w) = std::io::pipe().context("creating the readiness pipe")?;
    rustix::io::fcntl_setfd(w.as_fd(), rustix::io::FdFlags::empty()).context("sharing the readiness pipe")?;
    let mp = mado_mount::control::absolute(&a.dir)?;
    let log = mado_mount::control::log_path(&mp)?;
    let logf = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("mount").arg(&a.spec).arg(&mp).arg("--foreground");
    cmd.arg("--read-timeout").arg(a.read_timeout.to_string());
    cmd.arg("--ready-fd").arg(std::os::fd::AsRawFd::as_raw_fd(&w).to_string());
    if a.no_passthrough {
        cmd.arg("--no-passthrough");
    }
    if a.workspace {
        cmd.arg("--workspace");
    }
    if a.steal {
        cmd.arg("--steal");
    }
    if a.allow_other {
        cmd.arg("--allow-other");
    }
    if ctx.verbose {
        cmd.arg("--verbose");
    }
    use std::os::unix::process::CommandExt;
    cmd.stdin(std::process::Stdio::null()).stdout(logf.try_clone()?).stderr(logf).process_group(0);
    let child = cmd.spawn().context("starting the mount daemon")?;
    drop(w);
    let mut line = String::new();
    r.read_to_string(&mut line).context("waiting for the mount daemon")?;
    let msg: Option<ReadyMsg> = serde_json::from_str(line.trim()).ok();
    match msg {
        Some(m) if m.ok => {
            ctx.step("mount is ready");
            if ctx.json {
                return ctx.print_json(&m);
            }
            for w in &m.warnings {
                eprintln!("warning: {w}");
            }
            let what = if a.workspace { "workspace " } else { "" };
            let rw = if a.workspace { "read-write" } else { "read-only" };
            say!(
                ctx,
                "mounted {what}{} ({}) {rw} at {} [daemon pid {}, log {}]",
                a.spec,
                &m.snapshot[..12],
                m.mountpoint,
                child.id(),
                log.display()
            );
            if let Some(adv) = &m.advisory {
                eprintln!("advisory: {adv}");
            }
            Ok(())
        }
        Some(m) => Err(match m.failed {
            Some(r) => r.into(),
            None => mado_core::Error::User(m.error.unwrap_or_default()).into(),
        }),
        None => {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            Err(anyhow::anyhow!(
                "the mount daemon exited before the mount was ready; its log ({}):\n{tail}",
                log.display()
            ))
        }
    }
}

fn run_daemon(a: MountArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let opts = daemon::MountOptions {
        spec: a.spec.clone(),
        serve: daemon::Serve::Fuse { mountpoint: a.dir.clone(), allow_other: a.allow_other },
        read_timeout: Duration::from_secs(a.read_timeout),
        passthrough: !a.no_passthrough,
        workspace: a.workspace,
        steal: a.steal,
        handover_fd: a.handover_fd,
    };
    let ready_fd = a.ready_fd;
    let mp = a.dir.display().to_string();
    let report = move |r: std::result::Result<daemon::Ready, &mado_core::Error>| {
        let msg = match r {
            Ok(ready) => ReadyMsg {
                ok: true,
                mountpoint: mp.clone(),
                snapshot: ready.snapshot,
                status: serde_json::to_value(&ready.attach).unwrap_or_default(),
                advisory: ready.advisory,
                error: None,
                failed: None,
                warnings: ready.warnings.iter().map(|w| crate::hint::with_hints(&w.text, &w.next)).collect(),
            },
            Err(e) => ReadyMsg {
                ok: false,
                mountpoint: mp.clone(),
                snapshot: String::new(),
                status: serde_json::Value::Null,
                advisory: None,
                error: Some(e.to_string()),
                failed: Some(crate::exit::Relayed::of(e)),
                warnings: Vec::new(),
            },
        };
        let line = serde_json::to_string(&msg).unwrap_or_default();
        match ready_fd {
            Some(fd) => {
                // SAFETY: the parent `mado mount` passed this descriptor
                // (the write end of its readiness pipe) and nothing else in
                // this process uses it; we take sole ownership here.
                let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
                let _ = writeln!(f, "{line}");
            }
            None if msg.ok => {
                for w in &msg.warnings {
                    eprintln!("warning: {w}");
                }
                note!(ctx, "mounted {} at {}", msg.snapshot, msg.mountpoint);
                if let Some(a) = &msg.advisory {
                    eprintln!("advisory: {a}");
                }
            }
            None => {}
        }
    };
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| daemon::run(opts, fetcher, &handle, report))?;
    Ok(())
}

/// A mount point must be an empty directory that is not already a mount:
/// mounting over files hides them, and a second daemon on a live mount
/// stacks (one umount would then remove both).
fn check_mount_point(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let here = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    let parent = std::fs::metadata(dir.join("..")).with_context(|| format!("reading {}/..", dir.display()))?;
    if here.dev() != parent.dev() || here.ino() == parent.ino() {
        return Err(mado_core::Error::User(format!(
            "{} is already a mount point; unmount it first (`mado umount {}`)",
            dir.display(),
            dir.display()
        ))
        .into());
    }
    if !mado_core::checkout::is_empty_dir(dir)? {
        return Err(mado_core::Error::User(format!(
            "{} is not empty; mount on an empty directory (a mount would hide its files)",
            dir.display()
        ))
        .into());
    }
    Ok(())
}
