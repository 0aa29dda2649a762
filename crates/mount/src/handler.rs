//! The control socket's answers for one mount: one method per [`Op`].
//! The daemon builds a [`ControlHandler`] once the snapshot is open and
//! hands [`ControlHandler::answer`] to `control::serve`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mado_core::fetch::{Attach, Fetcher};
use mado_core::vfs::SnapshotFs;

use crate::fs::RequestCounters;
use crate::protocol::{MountStats, Op, PackStatus, Reply, Request, WorkspaceStats};

/// A workspace being served read-write.
pub(crate) struct Ws {
    pub handle: mado_core::workspace::Workspace,
    pub state_dir: PathBuf,
    pub reopened: bool,
    /// The lease holder id; the lease is released when the mount ends.
    pub holder: String,
    /// This machine's one mount of the workspace, held to the end.
    pub _lock: mado_core::workspace::MountLock,
    /// The process that keeps the mount through this daemon's death.
    pub keeper: std::sync::OnceLock<crate::keeper::Link>,
}

/// What the control socket's answers read: the mount's parts and counters.
pub(crate) struct ControlHandler {
    pub status: Arc<Attach>,
    pub core: Arc<SnapshotFs>,
    pub fetcher: Arc<Fetcher>,
    pub spec: String,
    pub mountpoint: PathBuf,
    /// The snapshot the mount shows: a workspace's last checkpoint.
    pub snapshot: Mutex<String>,
    pub started: Instant,
    pub passthrough: Arc<AtomicBool>,
    pub requests: RequestCounters,
    pub ws: Option<Arc<Ws>>,
    /// The last failed save of a workspace's state (cleared by a good one).
    pub save_error: Arc<Mutex<Option<String>>>,
    pub virtiofs: Option<Arc<crate::virtiofs::Counts>>,
    /// Since when the watchdog has found the mount stuck.
    pub stuck: Arc<Mutex<Option<Instant>>>,
    /// A workspace's FUSE session, which `mado restart` hands over.
    pub seat: Option<Arc<crate::handover::Seat>>,
    /// Held by a checkpoint or status (shared) and a handover (alone): a
    /// mount is never handed over halfway through a checkpoint.
    pub busy: tokio::sync::RwLock<()>,
}

type Answering = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>;

impl ControlHandler {
    /// The reply to `req`: at once for what counters say, on a blocking
    /// thread for what walks the workspace.
    pub fn answer(self: &Arc<Self>, req: Request) -> Answering {
        match req.op {
            Op::PackStatus => {
                let reply = self.pack_status();
                Box::pin(async move { reply })
            }
            Op::Stats => {
                let reply = self.stats();
                Box::pin(async move { reply })
            }
            Op::Status { no_ignore } => {
                let me = self.clone();
                Box::pin(async move {
                    let _busy = me.busy.read().await;
                    me.status(no_ignore).await
                })
            }
            Op::Checkpoint { message, steal, force, name, no_ignore } => {
                let me = self.clone();
                Box::pin(async move {
                    let _busy = me.busy.read().await;
                    me.checkpoint(message, steal, force, name, no_ignore).await
                })
            }
            Op::HandOver { exe } => {
                let me = self.clone();
                Box::pin(async move { me.hand_over(exe).await })
            }
        }
    }

    /// Hands this mount to a new daemon of the program `exe` (`mado
    /// restart`); its pid once it serves, after which this process exits.
    async fn hand_over(self: &Arc<Self>, exe: PathBuf) -> Reply {
        let (Some(seat), Some(ws)) = (self.seat.clone(), self.ws.clone()) else {
            return Reply::error(
                format!(
                    "{} is not a workspace's FUSE mount: a read-only mount holds nothing to hand over;                      unmount and mount it again",
                    self.mountpoint.display()
                ),
                true,
            );
        };
        let busy = self.busy.write().await;
        let core = self.core.clone();
        let argv = crate::handover::successor_argv(&exe);
        let r = tokio::task::spawn_blocking(move || {
            seat.hand_over(&argv, || {
                let image = mado_core::workspace::save_for_handover(&core, &ws.state_dir)?;
                let lock = std::os::fd::AsFd::as_fd(&ws._lock)
                    .try_clone_to_owned()
                    .map_err(mado_core::Error::io("copying the mount lock"))?;
                let keeper = ws.keeper.get().map(|k| k.share()).transpose()?;
                Ok((image, lock, keeper))
            })
        })
        .await;
        match r {
            Ok(Ok(pid)) => {
                // Held to the exit: no checkpoint starts here any more.
                std::mem::forget(busy);
                Reply::HandedOver { from: std::process::id(), to: pid }
            }
            Ok(Err(e)) => Reply::of_error(&e),
            Err(e) => Reply::error(format!("handover task failed: {e}"), false),
        }
    }

    fn pack_status(&self) -> Reply {
        let s = swept_or(&self.status, &self.fetcher);
        Reply::PackStatus(PackStatus {
            mountpoint: self.mountpoint.clone(),
            spec: self.spec.clone(),
            snapshot: self.snapshot.lock().expect("snapshot lock").clone(),
            attached: matches!(s, Attach::Attached { .. }),
            message: reason_text(&s),
            status: s,
        })
    }

    fn stats(&self) -> Reply {
        let (core, fetcher) = (&self.core, &self.fetcher);
        let stuck = *self.stuck.lock().expect("stuck lock");
        Reply::Stats(Box::new(MountStats {
            mountpoint: self.mountpoint.clone(),
            spec: self.spec.clone(),
            snapshot: self.snapshot.lock().expect("snapshot lock").clone(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            pid: std::process::id(),
            keeper_pid: self.ws.as_ref().and_then(|w| w.keeper.get()).map(|k| k.keeper_pid),
            remote: fetcher.remote.stats(),
            packs: fetcher.stats(),
            cache: fetcher.cache.stats(),
            reads: core.reads(),
            // Not counted while requests are stuck: this answer would wait
            // behind them too.
            nodes_in_memory: if stuck.is_some() { 0 } else { core.node_count() },
            stuck_ms: stuck.map(|t| t.elapsed().as_millis() as u64),
            chunks_read_ahead: core.chunks_read_ahead(),
            files_assembled: core.files_assembled(),
            passthrough: self.passthrough.load(Relaxed),
            opens: self.requests.opens.load(Relaxed),
            lookups: self.requests.lookups.load(Relaxed),
            ioctls: self.requests.ioctls.load(Relaxed),
            getattrs: self.requests.getattrs.load(Relaxed),
            workspace: self.ws.as_ref().map(|w| WorkspaceStats {
                name: w.handle.name().to_string(),
                state_dir: w.state_dir.clone(),
                reopened: w.reopened,
                changes: core.changes(),
                last_save_error: self.save_error.lock().expect("save error lock").clone(),
            }),
            virtiofs: self.virtiofs.as_ref().map(|c| c.snapshot()),
        }))
    }

    /// What a checkpoint would record; changes nothing.
    async fn status(&self, no_ignore: bool) -> Reply {
        let Some(ws) = self.ws.clone() else {
            return Reply::error("this mount is a read-only snapshot, not a workspace: nothing changes", true);
        };
        let (fetcher, core) = (self.fetcher.clone(), self.core.clone());
        let h = tokio::runtime::Handle::current();
        let r = tokio::task::spawn_blocking(move || {
            h.block_on(mado_core::workspace::mount_status(&fetcher, &core, &ws.state_dir, no_ignore))
        })
        .await;
        match r {
            Ok(Ok(status)) => Reply::Status { status },
            Ok(Err(e)) => Reply::of_error(&e),
            Err(e) => Reply::error(format!("status task failed: {e}"), false),
        }
    }

    async fn checkpoint(
        &self,
        message: String,
        steal: bool,
        force: bool,
        name: Option<String>,
        no_ignore: bool,
    ) -> Reply {
        let Some(ws) = self.ws.clone() else {
            return Reply::error("this mount is a read-only snapshot, not a workspace", true);
        };
        // Refused before anything is done: a checkpoint asked for by name
        // must be of this mount's workspace.
        if let Some(n) = name.filter(|n| *n != ws.handle.name()) {
            return Reply::error(
                format!("{} is a mount of workspace {}, not {n}", self.mountpoint.display(), ws.handle.name()),
                true,
            );
        }
        let lease = mado_core::workspace::CheckpointLease { steal, force, no_ignore };
        // On a thread of its own: the checkpoint's future is not Send (it
        // borrows across its upload streams). A new thread, not one of the
        // runtime's, as it runs at a lower CPU priority (background work
        // yields to the mount's readers; docs/DESIGN.md, "Background
        // work"), which an unprivileged thread could not undo.
        let h = tokio::runtime::Handle::current();
        let before = self.fetcher.remote.stats();
        let (fetcher, core) = (self.fetcher.clone(), self.core.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new().name("checkpoint".into()).spawn(move || {
            mado_core::priority::lower_this_thread(mado_core::priority::checkpoint_nice());
            let r = h.block_on(mado_core::workspace::checkpoint_mount(&fetcher, &core, &ws.state_dir, &message, lease));
            let _ = tx.send(r);
        });
        let r = match spawned {
            Ok(_) => rx.await.map_err(|_| "the checkpoint thread ended without an answer".to_string()),
            Err(e) => Err(format!("starting the checkpoint thread: {e}")),
        };
        mado_core::memory::give_back();
        match r {
            Ok(Ok(report)) => {
                // The checkpoint saved the state itself.
                *self.save_error.lock().expect("save error lock") = None;
                *self.snapshot.lock().expect("snapshot lock") = report.snapshot.clone();
                Reply::Checkpoint { report, remote: self.fetcher.remote.stats().since(&before) }
            }
            Ok(Err(e)) => Reply::of_error(&e),
            Err(e) => Reply::error(format!("checkpoint task failed: {e}"), false),
        }
    }
}

/// The pack status in words, for `mado pack-status`.
pub(crate) fn reason_text(a: &Attach) -> String {
    match a {
        Attach::Attached { mode, version, layers, dirs, packs, members, via } => format!(
            "prefetcher attached: {mode} packs (index v{version}, {layers} layer{}), {dirs} directories, {packs} packs, {members} objects; discovered via {}",
            if *layers == 1 { "" } else { "s" },
            match via {
                mado_core::fetch::Discovery::LocalPointer => "local pointer",
                mado_core::fetch::Discovery::DerivedPointer => "derived pointer",
            }
        ),
        Attach::NoIndex => "no prefetcher: no pack index was built for this tree (run `mado pack --recursive`)".into(),
        Attach::OtherTree { found } => {
            format!("no prefetcher: the index found covers another tree ({}); run `mado pack --recursive`", &found[..12])
        }
        Attach::Undecodable { detail } => {
            format!("no prefetcher: the pack index is undecodable ({detail}); run `mado pack --recursive`")
        }
        Attach::Swept { missing, packs } => format!(
            "the index's packs were swept: {missing} of its {packs} found missing so far (their files are read one by one); run `mado pack --recursive`"
        ),
    }
}

/// The index's state, or `Swept` once a read found packs it names gone
/// from the store. Found by the reads themselves (a GET that finds no pack
/// marks it bad, and its objects are read one by one): a HEAD of every
/// pack at each mount cost as many requests as the index has packs, all
/// at once beside the first reads, to spare one failed GET in the rare
/// case of a gc that swept them.
fn swept_or(attach: &Attach, fetcher: &Fetcher) -> Attach {
    let missing = fetcher.stats().packs_missing as usize;
    match attach {
        Attach::Attached { packs, .. } if missing > 0 => Attach::Swept { missing, packs: *packs },
        a => a.clone(),
    }
}
