use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use mado_mount::daemon;

use crate::ctx::Ctx;

/// Serve a snapshot (read-only) or a workspace (read-write) to a VM guest
/// over virtio-fs: a vhost-user-fs backend, as virtiofsd is.
///
/// Listens on SOCKET for a VMM (QEMU's `vhost-user-fs-pci`, Cloud
/// Hypervisor's `--fs`, Firecracker's vhost-user) and serves the same
/// filesystem `mado mount` does: lazy reads, pack prefetch on first touch,
/// the verified disk cache, `--read-timeout`. The guest mounts it with
/// `mount -t virtiofs TAG DIR` (the tag is the VMM's setting). One VMM
/// connection at a time; when it ends, the next one is served, until
/// SIGTERM or SIGINT.
///
/// With --workspace, SPEC names a workspace: the guest's changes go to a
/// local upper layer, the lease is held while serving, and a final save
/// is made on SIGTERM/SIGINT before the lease is released. `mado ws
/// checkpoint NAME` reaches this process by the workspace's name; `mado
/// stats SOCKET` and `mado pack-status SOCKET` by the socket's path.
///
/// Prints one line on stderr once the socket is listening ("serving ...");
/// runs in the foreground.
#[derive(Args)]
pub struct ServeVirtiofsArgs {
    /// Ref name or snapshot id, and any of git's ancestry steps: main~2, main^ (with --workspace: the workspace name).
    spec: String,
    /// The vhost-user socket to listen on (replaced if stale).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Serve workspace SPEC read-write.
    #[arg(long)]
    workspace: bool,
    /// With --workspace: take the lease even though another holder had it, once expired.
    #[arg(long, requires = "workspace")]
    steal: bool,
    /// Seconds a read may wait for the store before failing with EIO.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    read_timeout: u64,
}

pub fn run(a: ServeVirtiofsArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let opts = daemon::MountOptions {
        spec: a.spec.clone(),
        serve: daemon::Serve::VirtioFs { socket: a.socket.clone() },
        read_timeout: Duration::from_secs(a.read_timeout),
        passthrough: false,
        workspace: a.workspace,
        steal: a.steal,
        handover_fd: None,
    };
    let (json, what) = (ctx.json, if a.workspace { "workspace " } else { "" });
    let socket = a.socket.display().to_string();
    let spec = a.spec.clone();
    let report = move |r: std::result::Result<daemon::Ready, &mado_core::Error>| {
        if let Ok(ready) = r {
            for w in &ready.warnings {
                eprintln!("warning: {}", crate::hint::with_hints(&w.text, &w.next));
            }
            if json {
                let v = serde_json::json!({
                    "ok": true,
                    "socket": socket,
                    "spec": spec,
                    "snapshot": ready.snapshot,
                    "status": ready.attach,
                    "advisory": ready.advisory,
                });
                println!("{v}");
            }
            eprintln!(
                "serving {what}{spec} ({}) on {socket} [pid {}]",
                mado_core::hash::short_hex(&ready.snapshot),
                std::process::id()
            );
            if let Some(adv) = &ready.advisory {
                eprintln!("advisory: {adv}");
            }
        }
    };
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| daemon::run(opts, fetcher, &handle, report))?;
    Ok(())
}
