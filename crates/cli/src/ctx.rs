//! What every command shares: configuration, the remote, the disk cache,
//! the `--verbose` step log, progress bars, and error reporting.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mado_core::cache::DiskCache;
use mado_core::fetch::Fetcher;
use mado_core::store::{OpenOptions, Remote};

pub struct Ctx {
    pub verbose: bool,
    pub json: bool,
    /// `--quiet`: no progress, no summaries, no notes (errors and
    /// warnings still print; so does what a command is asked to show).
    pub quiet: bool,
    start: Instant,
    last: Mutex<Instant>,
    remote: OnceLock<Arc<Remote>>,
    cache: OnceLock<Arc<DiskCache>>,
    fetcher: OnceLock<Arc<Fetcher>>,
}

/// `$MADO_CONFIG`, else `$XDG_CONFIG_HOME/mado/config.toml`, else
/// `~/.config/mado/config.toml`.
pub fn config_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("MADO_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => home()?.join(".config"),
    };
    Ok(base.join("mado").join("config.toml"))
}

pub fn home() -> Result<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).ok_or_else(|| {
        anyhow::Error::new(mado_core::Error::User("HOME is not set; set HOME (or XDG_* directories)".into()))
    })
}

/// The embedded default store: `$XDG_DATA_HOME/mado/store`, else
/// `~/.local/share/mado/store`.
pub fn default_store_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => home()?.join(".local").join("share"),
    };
    Ok(base.join("mado").join("store"))
}

/// The `remote` the config file names.
pub fn read_config_remote() -> Result<Option<String>> {
    Ok(crate::config::load()?.remote)
}

/// Prints a command's closing summary on stdout, unless `--quiet`.
macro_rules! say {
    ($ctx:expr, $($arg:tt)*) => {
        if !$ctx.quiet {
            println!($($arg)*);
        }
    };
}

/// Prints an informational line on stderr (not a warning), unless `--quiet`.
macro_rules! note {
    ($ctx:expr, $($arg:tt)*) => {
        if !$ctx.quiet {
            eprintln!($($arg)*);
        }
    };
}

impl Ctx {
    pub fn new(verbose: bool, json: bool, quiet: bool) -> Ctx {
        let now = Instant::now();
        Ctx {
            verbose,
            json,
            quiet,
            start: now,
            last: Mutex::new(now),
            remote: OnceLock::new(),
            cache: OnceLock::new(),
            fetcher: OnceLock::new(),
        }
    }

    /// Logs a step under `--verbose`: `[+<total ms> Δ<delta ms>] step`.
    pub fn step(&self, what: impl AsRef<str>) {
        if !self.verbose {
            return;
        }
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let total = now.duration_since(self.start).as_millis();
        let delta = now.duration_since(*last).as_millis();
        *last = now;
        eprintln!("[+{total}ms Δ{delta}ms] {}", what.as_ref());
    }

    pub fn remote_url(&self) -> Result<String> {
        if let Some(u) = std::env::var("MADO_REMOTE_ADDR").ok().filter(|u| !u.is_empty()) {
            // `file:store` or `./store` is the current directory's (a mount
            // daemon keeps the directory it was started in).
            return local_url(&u);
        }
        match read_config_remote()? {
            Some(u) => Ok(u),
            None => Err(anyhow::Error::new(mado_core::Error::User(
                "no remote configured; run `mado init` (embedded local store) or `mado init --remote s3://bucket/prefix`, or set MADO_REMOTE_ADDR".into(),
            ))),
        }
    }

    /// The configured store, which must exist (a `file://` store's
    /// directory is not made here: see [`Ctx::remote_creating`]).
    pub fn remote(&self) -> Result<Arc<Remote>> {
        self.remote_with(false)
    }

    /// The configured store, a `file://` one made if missing: for commands
    /// that put the first snapshot in a store (`import-git`).
    pub fn remote_creating(&self) -> Result<Arc<Remote>> {
        self.remote_with(true)
    }

    fn remote_with(&self, create: bool) -> Result<Arc<Remote>> {
        if let Some(r) = self.remote.get() {
            return Ok(r.clone());
        }
        let url = self.remote_url()?;
        let inject_rtt =
            std::env::var("MADO_INJECT_RTT_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
        let opts = OpenOptions { inject_rtt };
        let r =
            Arc::new(if create { Remote::open_creating(&url, &opts)? } else { Remote::open_existing(&url, &opts)? });
        self.step(format!("opened remote {url}"));
        Ok(self.remote.get_or_init(|| r).clone())
    }

    pub fn cache(&self) -> Result<Arc<DiskCache>> {
        if let Some(c) = self.cache.get() {
            return Ok(c.clone());
        }
        let c = Arc::new(DiskCache::open_default(crate::config::cache_cap()?)?);
        self.step(format!("opened disk cache {}", c.root().display()));
        Ok(self.cache.get_or_init(|| c).clone())
    }

    pub fn fetcher(&self) -> Result<Arc<Fetcher>> {
        if let Some(f) = self.fetcher.get() {
            return Ok(f.clone());
        }
        let f = Fetcher::new(self.remote()?, self.cache()?);
        Ok(self.fetcher.get_or_init(|| f).clone())
    }

    /// Waits for pack downloads still writing to the cache.
    pub async fn drain_fetches(&self) {
        if let Some(f) = self.fetcher.get() {
            f.drain().await;
        }
    }

    /// Prints the fetcher's warnings (each names a pack) on stderr.
    pub fn flush_warnings(&self) {
        if let Some(f) = self.fetcher.get() {
            for w in f.take_warnings() {
                eprintln!("warning: {w}");
            }
        }
    }

    /// A progress bar on stderr, hidden when stderr is not a terminal or
    /// output is JSON.
    pub fn progress(&self, len: Option<u64>, what: &str) -> ProgressBar {
        if self.json && !self.quiet {
            return json_progress(len, what);
        }
        if self.json || self.quiet || !std::io::stderr().is_terminal() {
            return ProgressBar::hidden();
        }
        let pb = match len {
            Some(n) => ProgressBar::new(n).with_style(
                ProgressStyle::with_template(
                    "{spinner} {msg} [{bar:30}] {pos}/{len} ({per_sec}, {elapsed} elapsed, {eta} left)",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{spinner} {msg}: {pos} ({per_sec}, {elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        pb.set_message(what.to_string());
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    }

    /// A progress bar and a `(done, total)` callback that drives it, for core
    /// functions that report progress.
    pub fn progress_counter(&self, what: &str) -> (ProgressBar, impl Fn(u64, u64) + Sync) {
        let pb = self.progress(Some(0), what);
        let pb2 = pb.clone();
        (pb, move |done, total| {
            pb2.set_length(total);
            pb2.set_position(done);
        })
    }

    /// Prints a JSON value on stdout.
    pub fn print_json(&self, v: &impl serde::Serialize) -> Result<()> {
        println!("{}", serde_json::to_string_pretty(v)?);
        Ok(())
    }

    /// Under `--verbose`, the closing counts of the remote and the cache.
    pub fn finish(&self) {
        self.flush_warnings();
        if !self.verbose {
            return;
        }
        if let Some(f) = self.fetcher.get() {
            let s = f.stats();
            self.step(format!(
                "packs: {} exploded, {} members served ({} before their pack finished), {} failed",
                s.packs_exploded, s.members_from_packs, s.members_early, s.pack_failures
            ));
        }
        if let Some(r) = self.remote.get() {
            self.step(format!("remote (this process): {}", r.stats()));
        }
        if let Some(c) = self.cache.get() {
            let s = c.stats();
            self.step(format!(
                "cache: {} hits, {} misses, {} healed, {} written, {} evicted",
                s.hits, s.misses, s.healed, s.writes, s.evicted
            ));
        }
        if let Some(kib) = peak_resident_kib() {
            self.step(format!("memory: peak {kib} KiB resident"));
        }
    }
}

/// This process's peak resident memory (the kernel's VmHWM, which counts
/// from exec, unlike getrusage's maxrss that also counts the parent's
/// memory when it was spawned with vfork).
fn peak_resident_kib() -> Option<u64> {
    status_kib("self", "VmHWM")
}

/// A memory figure of process `pid` ("self" for this one) from
/// `/proc/PID/status`, in KiB (`field` without its colon, e.g. "RssAnon").
pub fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?.split_whitespace().next()?.parse().ok()
}

/// Set once the process is about to print its result or error and exit:
/// no progress line is written after that (none is cut short by the exit).
static PROGRESS_STOPPED: Mutex<bool> = Mutex::new(false);

/// Stops every JSON progress stream (waiting for a line being written).
pub fn stop_progress() {
    *PROGRESS_STOPPED.lock().unwrap_or_else(|e| e.into_inner()) = true;
}

/// Under `--json`, progress is a stream of JSON lines on stderr, at most
/// two a second while the work lasts (`MADO_PROGRESS_INTERVAL_MS`):
/// `{"progress": WHAT, "done", "total" (absent when unknown), "message",
/// "elapsed_ms"}`, with `"finished": true` once the work is done (if the
/// command goes on after it). Every line is whole: none is written once
/// the process starts to exit ([`stop_progress`]). The bar draws nothing.
fn json_progress(len: Option<u64>, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(len, indicatif::ProgressDrawTarget::hidden());
    pb.set_message(what.to_string());
    let watched = pb.clone();
    let what = what.to_string();
    let started = Instant::now();
    // MADO_PROGRESS_INTERVAL_MS: another pace (tests use a short one).
    let every = std::env::var("MADO_PROGRESS_INTERVAL_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(500u64);
    std::thread::spawn(move || {
        let line = |finished: bool| {
            let mut v = serde_json::json!({
                "progress": what,
                "done": watched.position(),
                "message": watched.message(),
                "elapsed_ms": started.elapsed().as_millis() as u64,
            });
            if let Some(t) = watched.length() {
                v["total"] = t.into();
            }
            if finished {
                v["finished"] = true.into();
            }
            // Under the lock the process takes before it exits: a line is
            // written whole or not at all.
            let stopped = PROGRESS_STOPPED.lock().unwrap_or_else(|e| e.into_inner());
            if !*stopped {
                use std::io::Write;
                let _ = std::io::stderr().write_all(format!("{v}\n").as_bytes());
            }
        };
        // The bar's last clone is the watcher's: the work dropped it.
        loop {
            std::thread::sleep(Duration::from_millis(every.max(1)));
            if watched.is_finished() {
                line(true);
                return;
            }
            line(false);
        }
    });
    pb
}

/// A local store named by a relative path (`file:store`, `file://store`,
/// `./store`, `~/store`) is resolved against the current directory (or the
/// home directory) and saved absolute, so it does not depend on where mado
/// runs later. Other URLs are kept as given.
pub fn local_url(given: &str) -> Result<String> {
    let path = match given.strip_prefix("file:") {
        Some(rest) if rest.starts_with("///") => return Ok(given.to_string()),
        Some(rest) => rest.strip_prefix("//").unwrap_or(rest).to_string(),
        None if given.contains("://") => return Ok(given.to_string()),
        None => given.to_string(),
    };
    // `s3:/bucket` or `s3:bucket` is a mistyped URL, not a folder named
    // `s3:` in the current directory.
    if let Some((scheme, _)) = path.split_once(':') {
        const REMOTE: [&str; 11] =
            ["s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "http", "https", "memory"];
        if REMOTE.contains(&scheme.to_ascii_lowercase().as_str()) {
            return Err(mado_core::Error::User(format!(
                "{given:?} is not a store address: write `{scheme}://BUCKET/PREFIX` (two slashes after the scheme)"
            ))
            .into());
        }
    }
    let p = std::path::PathBuf::from(&path);
    let abs = if let Some(rest) = path.strip_prefix("~/") {
        std::path::PathBuf::from(std::env::var("HOME").context("expanding ~: HOME is not set")?).join(rest)
    } else {
        // Relative to the current directory, `.` components dropped.
        std::path::absolute(&p)?
    };
    Ok(format!("file://{}", abs.display()))
}
