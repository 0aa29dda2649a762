//! Fault injection for crash tests: `MADO_FAILPOINT=<name>` aborts the
//! process the first time it reaches the named point, `<name>#<n>` the
//! n-th time, as a crash or `kill -9` would (no unwinding, no destructors,
//! nothing flushed).

use std::sync::atomic::{AtomicU64, Ordering};

static HITS: AtomicU64 = AtomicU64::new(0);

/// Aborts the process if `MADO_FAILPOINT` names `name` (and this is the
/// hit it counts to).
pub fn hit(name: &str) {
    let Ok(spec) = std::env::var("MADO_FAILPOINT") else { return };
    let (point, nth) = match spec.split_once('#') {
        Some((p, n)) => (p, n.parse::<u64>().unwrap_or(1)),
        None => (spec.as_str(), 1),
    };
    if point != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 == nth {
        eprintln!("failpoint {name} (hit {nth}): aborting");
        std::process::abort();
    }
}

/// Stops the process at the named point until a test lets it go on:
/// with `MADO_PAUSE=<name>` and `MADO_PAUSE_FIFO=<path of a FIFO>`, writes
/// `<path>.paused` and then blocks reading the FIFO until the test writes
/// to it and closes it (an event, not a timer). For tests that run
/// something else (gc, another writer) inside a window.
pub fn pause(name: &str) {
    if std::env::var("MADO_PAUSE").as_deref() != Ok(name) {
        return;
    }
    let Ok(fifo) = std::env::var("MADO_PAUSE_FIFO") else { return };
    let _ = std::fs::write(format!("{fifo}.paused"), name);
    eprintln!("paused at {name}");
    let _ = std::fs::read(&fifo);
}

/// An injected error at the named point: with `MADO_FAIL=<name>`, the
/// operation there fails as if the store had refused it (the process goes
/// on). For tests of what a caller does with a failure it can survive.
pub fn error(name: &str) -> Option<crate::error::Error> {
    (std::env::var("MADO_FAIL").as_deref() == Ok(name)).then(|| crate::error::Error::Io {
        context: format!("injected failure at {name}"),
        source: std::io::Error::other("MADO_FAIL"),
    })
}
