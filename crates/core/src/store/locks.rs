//! Store locks: how writers and gc learn of each other (docs/DESIGN.md,
//! "gc and writers"). A lock is an empty object whose name says
//! everything, so one LIST reads them all.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use super::{layout, Remote};
use crate::error::{Error, Result};
use crate::hash::Hash;

/// Who holds a store lock: writers (imports, checkpoints) hold shared
/// ones while they rely on objects already in the store; gc holds an
/// exclusive one while it sweeps. Neither waits: whoever finds the other
/// gives way with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    Writer,
    Gc,
}

impl LockKind {
    fn label(self) -> &'static str {
        match self {
            LockKind::Writer => "writer",
            LockKind::Gc => "gc",
        }
    }
    fn from_label(s: &str) -> Option<LockKind> {
        match s {
            "writer" => Some(LockKind::Writer),
            "gc" => Some(LockKind::Gc),
            _ => None,
        }
    }
}

/// A lock object `locks/gc/<kind>.<expires>.<nonce>` (empty; everything is
/// in its name, so one LIST reads every lock).
#[derive(Clone, Debug)]
pub struct StoreLock {
    key: Path,
    pub kind: LockKind,
    /// Seconds since the epoch.
    pub expires: i64,
}

/// How long a lock of a dead holder blocks the other side. A writer
/// holding it longer than this (a huge import) is not protected past it.
pub const LOCK_TTL: Duration = Duration::from_secs(3600);

/// How long a writer waits for a gc that is sweeping the store before it
/// gives up: `MADO_GC_WAIT_SECS`, else two minutes.
pub fn gc_wait() -> Duration {
    let secs = std::env::var("MADO_GC_WAIT_SECS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(120);
    Duration::from_secs(secs)
}

/// This process as a store lock names its holder: `<boot>-<pid>-<start>`,
/// the first 16 hex digits of BLAKE3 over the kernel's boot id (unique to
/// this machine and this boot) and the pid namespace (a container on the
/// same machine has pids of its own, which this one's `/proc` cannot
/// check), the pid, and the process's start time in clock ticks since
/// boot (`/proc/<pid>/stat`, field 22: a pid reused by another process
/// starts later). `None` without `/proc`.
fn holder_tag() -> Option<String> {
    let boot = boot_tag()?;
    let pid = std::process::id();
    Some(format!("{boot}-{pid}-{}", start_ticks(pid)?))
}

fn boot_tag() -> Option<String> {
    let id = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let both = [id.trim_ascii(), b"\n", ns.as_os_str().as_encoded_bytes()].concat();
    Some(Hash::of(&both).to_hex()[..16].to_string())
}

/// Field 22 of `/proc/<pid>/stat` (after the command name, which may hold
/// spaces and parentheses: the fields start after its last `)`); `None`
/// for no such process, or one that has exited and not been reaped yet
/// (state `Z` or `X`, field 3).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if matches!(fields.next()?, "Z" | "X") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the lock holder `tag` names is known to be gone: it ran on
/// this machine in this boot, and no process with its pid and start time
/// is alive (killed with SIGKILL, or its machine lost power before it
/// could delete the lock). A holder elsewhere, or not named, is not known.
fn holder_gone(tag: &str) -> bool {
    let mut parts = tag.splitn(3, '-');
    let (Some(boot), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else { return false };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else { return false };
    boot_tag().is_some_and(|b| b == boot) && start_ticks(pid) != Some(start)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

impl Remote {
    /// Announces that a writer or gc is at work on this store (see
    /// [`LockKind`]); the lock expires by itself after [`LOCK_TTL`] if its
    /// holder dies. One PUT.
    pub async fn put_lock(&self, kind: LockKind) -> Result<StoreLock> {
        let expires = unix_now() + LOCK_TTL.as_secs() as i64;
        let holder = holder_tag();
        let key = self.key(&layout::lock(kind.label(), expires, rand::random::<u64>(), holder.as_deref()));
        self.store.put(&key, PutPayload::from(Bytes::new())).await.map_err(|e| self.remote_err("PUT", &key, e))?;
        Ok(StoreLock { key, kind, expires })
    }

    /// The live locks other than `mine` (expired ones are ignored). One LIST.
    /// A lock whose holder ran on this machine and is gone (a `kill -9`
    /// of an import, a checkpoint or a gc) is not live either: it is
    /// deleted (best effort), rather than block the other side until it
    /// expires, an hour later.
    pub async fn other_locks(&self, mine: &StoreLock) -> Result<Vec<StoreLock>> {
        let base = self.key(layout::LOCKS);
        let metas: Vec<_> =
            self.store.list(Some(&base)).try_collect().await.map_err(|e| self.remote_err("LIST", &base, e))?;
        let now = unix_now();
        let mut live = Vec::new();
        for m in metas.into_iter().filter(|m| m.location != mine.key) {
            let Some(name) = m.location.filename().map(str::to_string) else { continue };
            let mut parts = name.split('.');
            let Some(kind) = parts.next().and_then(LockKind::from_label) else { continue };
            let Some(expires) = parts.next().and_then(|e| e.parse::<i64>().ok()) else { continue };
            if expires <= now {
                continue;
            }
            // parts: the nonce, then the holder (absent from older mados).
            if parts.nth(1).is_some_and(holder_gone) {
                tracing::info!(lock = %m.location, "deleting a lock whose holder on this machine is gone");
                let _ = self.store.delete(&m.location).await;
                continue;
            }
            live.push(StoreLock { key: m.location.clone(), kind, expires });
        }
        Ok(live)
    }

    /// Removes a lock (best effort: one that stays expires by itself).
    pub async fn drop_lock(&self, lock: StoreLock) {
        let _ = self.store.delete(&lock.key).await;
    }

    /// The writer's side of the gc protocol: announce the writer, then make
    /// sure no gc is sweeping (waiting for one that is, up to [`gc_wait`]). Must complete before the writer's first
    /// dedup decision (HEAD): then either gc sees this lock before it
    /// deletes anything, or this sees gc's (docs/DESIGN.md, "gc and
    /// writers").
    pub async fn begin_write(&self) -> Result<StoreLock> {
        let lock = self.put_lock(LockKind::Writer).await?;
        self.check_no_gc(lock).await
    }

    /// The second half of [`Remote::begin_write`], for a caller that put
    /// its lock alongside another request.
    pub async fn check_no_gc(&self, lock: StoreLock) -> Result<StoreLock> {
        // A sweep takes seconds: a writer that finds one steps back (its
        // lock gone, gc may go on) and asks again, waiting longer each
        // time, up to `gc_wait()` (failing at once, checkpoints next to a
        // gc loop failed at random).
        let (start, limit) = (Instant::now(), gc_wait());
        let mut pause = Duration::from_millis(100);
        let mut lock = lock;
        loop {
            let others = match self.other_locks(&lock).await {
                Ok(o) => o,
                Err(e) => {
                    self.drop_lock(lock).await;
                    return Err(e);
                }
            };
            let Some(gc) = others.iter().find(|l| l.kind == LockKind::Gc) else { return Ok(lock) };
            let expires = gc.expires;
            self.drop_lock(lock).await;
            if start.elapsed() + pause > limit {
                return Err(Error::Busy(format!(
                    "a gc is sweeping this store and did not finish within {} s; retry when it has \
                     (a gc killed on another machine holds its lock until {})",
                    limit.as_secs(),
                    crate::error::local_time(expires)
                )));
            }
            if pause == Duration::from_millis(100) {
                tracing::warn!("a gc is sweeping this store; waiting for it to finish");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
            lock = self.put_lock(LockKind::Writer).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;

    /// A lock left by a process of this machine that is gone (killed with
    /// SIGKILL) blocks nobody and is deleted; a live holder's lock, one of
    /// another machine and one of an older mado (no holder) still count.
    #[tokio::test]
    async fn a_lock_whose_holder_here_is_gone_is_not_live() {
        let r = Remote::from_store("memory://locks", Arc::new(InMemory::new()));
        let mine = r.put_lock(LockKind::Gc).await.unwrap();
        let me = holder_tag().expect("this test needs /proc");
        let boot = me.split('-').next().unwrap().to_string();
        // The boot part is a hash of this boot and pid namespace, not a
        // constant that every machine would share.
        let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
        let id = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap();
        let want = Hash::of(&[id.trim_ascii(), b"\n", ns.as_os_str().as_encoded_bytes()].concat()).to_hex();
        assert_eq!(boot, want[..16]);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let expires = unix_now() + 600;
        let r = &r;
        let put = |holder: Option<String>, n: u64| {
            let key = r.key(&layout::lock("writer", expires, n, holder.as_deref()));
            async move {
                r.store.put(&key, PutPayload::from(Bytes::new())).await.unwrap();
                key
            }
        };
        let gone = put(Some(format!("{boot}-{dead}-1")), 1).await;
        let reused = put(Some(format!("{boot}-{}-1", std::process::id())), 2).await;
        let live = put(Some(me.clone()), 3).await;
        let elsewhere = put(Some(format!("0123456789abcdef-{dead}-1")), 4).await;
        let older = put(None, 5).await;
        // Killed, not yet reaped by its parent (a zombie): gone as well.
        let mut z = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let z_tag = format!("{boot}-{}-{}", z.id(), start_ticks(z.id()).unwrap());
        z.kill().unwrap();
        let stat = format!("/proc/{}/stat", z.id());
        for _ in 0..500 {
            if std::fs::read_to_string(&stat).is_ok_and(|s| s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'))
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let zombie = put(Some(z_tag), 6).await;
        let mut keys: Vec<_> = r.other_locks(&mine).await.unwrap().into_iter().map(|l| l.key).collect();
        keys.sort();
        let mut want = vec![live, elsewhere, older];
        want.sort();
        assert_eq!(keys, want);
        // The dead holder's lock, the zombie's, and the one naming this pid
        // with another start time (a reused pid), are deleted.
        z.wait().unwrap();
        for k in [gone, reused, zombie] {
            assert!(r.store.head(&k).await.is_err(), "{k} is still there");
        }
    }
}
