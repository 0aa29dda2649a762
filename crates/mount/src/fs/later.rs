//! How a request waits: answered on the FUSE thread when nothing has to
//! be fetched, else moved with its reply to the runtime.

use std::future::Future;
use std::sync::{Arc, Mutex};

use fuser::{Generation, ReplyData, ReplyEmpty, ReplyEntry, ReplyWrite};
use mado_core::vfs::Attr;

use super::opens::LazyOpens;
use super::{errno, MadoFs};

impl MadoFs {
    /// A READ in no-open mode: the inode's file from the recent ones, or
    /// opened now.
    pub(super) fn read_lazily(&self, lazy: Arc<Mutex<LazyOpens>>, ino: u64, offset: u64, size: u32, reply: ReplyData) {
        let core = self.core.clone();
        self.drive(async move {
            let hit = lazy.lock().expect("lazy lock").get(ino);
            let f = match hit {
                Some(f) => f,
                None => match core.open(ino).await {
                    Ok(f) => lazy.lock().expect("lazy lock").keep(&core, ino, Arc::new(f)),
                    Err(e) => return reply.error(errno(&e)),
                },
            };
            match core.read(&f, offset, size).await {
                Ok(b) => reply.data(&b),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// A WRITE in no-open mode: to the inode's file open for writing, or
    /// copied up and opened now.
    pub(super) fn write_lazily(
        &self,
        lazy: Arc<Mutex<LazyOpens>>,
        ino: u64,
        offset: u64,
        data: &[u8],
        reply: ReplyWrite,
    ) {
        let hit = lazy.lock().expect("lazy lock").writable(ino);
        if let Some(f) = hit {
            return match self.core.write(&f, offset, data) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let (core, data) = (self.core.clone(), data.to_vec());
        self.drive(async move {
            let f = match core.open_for_write(ino).await {
                Ok(f) => lazy.lock().expect("lazy lock").keep(&core, ino, Arc::new(f)),
                Err(e) => return reply.error(errno(&e)),
            };
            match core.write(&f, offset, &data) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// A directory's first listing (offset 0) starts the download of the
    /// pack its first file is in, when cold ([`SnapshotFs::warm_dir`]): a
    /// walk lists before it reads, so its first read waits less than a
    /// round trip. Nothing for an unpacked store or a cached pack.
    pub(super) fn warm(&self, ino: u64, offset: u64) {
        if offset == 0 {
            let _rt = self.rt.enter();
            self.core.warm_dir_waiting(ino, std::time::Duration::from_millis(5));
        }
    }

    /// Runs `task`, which answers its request itself: here on the FUSE
    /// thread when it finishes without waiting (nothing to fetch: the
    /// common case in a warm tree or a workspace's own files), else on the
    /// runtime from where it stopped, so a slow fetch never holds this
    /// thread. A request answered here costs no hand-off between threads
    /// (two context switches and a wake-up, most of a small request's time
    /// on two cores).
    pub(super) fn drive(&self, task: impl Future<Output = ()> + Send + 'static) {
        mado_core::memory::tidy();
        let mut task = Box::pin(task);
        let _in_runtime = self.rt.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if task.as_mut().poll(&mut cx).is_pending() {
            // Polled again there, with a waker that counts, in the
            // request's span; counted in flight until it has answered.
            let flying = self.in_flight.as_ref().map(|f| f.start());
            let task = async move {
                task.await;
                drop(flying);
            };
            self.rt.spawn(tracing::Instrument::instrument(task, tracing::Span::current()));
        }
    }

    /// Answers an fsync: the upper file's bytes, then the state naming it.
    pub(super) fn sync_later(
        &self,
        sync_file: impl FnOnce() -> mado_core::Result<()> + Send + 'static,
        reply: ReplyEmpty,
    ) {
        let (durable, span) = (self.durable.clone(), tracing::Span::current());
        let flying = self.in_flight.as_ref().map(|f| f.start());
        self.rt.spawn_blocking(move || {
            let _span = span.enter();
            let _flying = flying;
            if let Err(e) = sync_file() {
                return reply.error(errno(&e));
            }
            if let Some(save) = durable {
                if let Err(e) = save() {
                    return reply.error(errno(&e));
                }
            }
            reply.ok();
        });
    }

    /// Answers `reply` with the entry `fut` yields, from a tokio task.
    pub(super) fn entry_later(
        &self,
        reply: ReplyEntry,
        fut: impl Future<Output = mado_core::Result<Attr>> + Send + 'static,
    ) {
        let (owner, ttl, core) = (self.owner(), self.ttl, self.core.clone());
        self.drive(async move {
            match fut.await {
                Ok(a) => {
                    core.note_lookup(a.ino, 1);
                    reply.entry(&ttl, &owner.attr(&a), Generation(0))
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// Answers `reply` with success or the error `fut` yields.
    pub(super) fn empty_later(
        &self,
        reply: ReplyEmpty,
        fut: impl Future<Output = mado_core::Result<()>> + Send + 'static,
    ) {
        self.drive(async move {
            match fut.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}
