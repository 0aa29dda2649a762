//! Making a [`MadoFs`]: its parts, and the modes a mount or a session
//! asks for (no-open, a transport's largest I/O, durable saves, a
//! handover's seat).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use fuser::Request;
use mado_core::vfs::SnapshotFs;

use super::opens::OpenFiles;
use super::reply::{Cookies, Creator, Owner};
use super::{DurableSave, MadoFs, RequestCounters, RW_TTL, TTL};

impl MadoFs {
    pub fn new(core: Arc<SnapshotFs>, rt: tokio::runtime::Handle, want_passthrough: bool) -> MadoFs {
        MadoFs {
            core: core.clone(),
            rt,
            handles: Default::default(),
            io_modes: Default::default(),
            next_fh: Arc::new(AtomicU64::new(1)),
            cookies: Cookies::default(),
            lazy: None,
            want_passthrough,
            passthrough: Arc::new(AtomicBool::new(false)),
            requests: RequestCounters::default(),
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            ttl: if core.is_writable() { RW_TTL } else { TTL },
            durable: None,
            max_io: None,
            in_flight: None,
            ended: None,
        }
    }

    /// Counts requests in flight and says when the session ends, for
    /// `seat`'s handover.
    pub fn with_seat(mut self, seat: &crate::handover::Seat) -> MadoFs {
        self.in_flight = Some(seat.in_flight.clone());
        self.ended = Some(seat.ended.clone());
        self
    }

    /// Reads and writes of at most `n` bytes (the virtio-fs transport
    /// carries each request and reply whole in a socket buffer).
    /// No OPEN or RELEASE from the kernel: the first open is answered
    /// ENOSYS, after which the kernel sends neither (FUSE's no-open mode)
    /// and keeps every file's page cache across opens. Reads and writes
    /// come by inode; each file is opened here on its first READ (or
    /// copied up and opened for writing on its first WRITE) and the most
    /// recent few are kept. A warm read costs no request at all, a cold
    /// small file one instead of three (open, read, release). Where
    /// passthrough is not wanted (it needs an open): workspaces, whose
    /// later opens for writing could not join a passthrough inode, and
    /// the virtio-fs transport.
    pub fn with_no_open(mut self) -> MadoFs {
        self.core.untrack_opens();
        self.lazy = Some(Arc::default());
        self
    }

    pub fn with_max_io(mut self, n: u32) -> MadoFs {
        self.max_io = Some(n);
        self
    }

    /// fsync and fsyncdir return only once `save` has made the overlay
    /// state that reaches the synced file durable.
    pub fn with_durable_save(mut self, save: DurableSave) -> MadoFs {
        self.durable = Some(save);
        self
    }

    /// Whether the kernel accepted passthrough (known after init).
    pub fn passthrough_flag(&self) -> Arc<AtomicBool> {
        self.passthrough.clone()
    }

    /// How many OPEN, LOOKUP and IOCTL requests the kernel sent.
    pub fn request_counters(&self) -> RequestCounters {
        self.requests.clone()
    }

    pub(super) fn open_files(&self) -> OpenFiles {
        OpenFiles { handles: self.handles.clone(), io_modes: self.io_modes.clone() }
    }

    pub(super) fn owner(&self) -> Owner {
        Owner { uid: self.uid, gid: self.gid }
    }

    /// Who a node made for `req` in `parent` belongs to, when not the
    /// mount's owner: the caller's uid, and the caller's gid or, under a
    /// set-group-ID directory, the directory's (as a local filesystem).
    pub(super) fn creator(&self, req: &Request) -> Creator {
        Creator { uid: req.uid(), gid: req.gid(), mount: (self.uid, self.gid) }
    }
}
