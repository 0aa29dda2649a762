//! The `mado` command line: parses arguments, runs one command, prints the
//! error chain once and exits with a code that means something (exit.rs).
//! Each command is a file in `cmd/`.

#[macro_use]
mod ctx;
mod alloc;
mod cmd;
mod config;
mod exit;
mod hint;

use clap::Parser;

/// mimalloc rather than glibc's malloc: the walk of a checkpoint and a
/// checkout allocate from several threads at once, and glibc grows each
/// thread's arena a page range at a time (one `mprotect` each: ~7,500 of
/// them in a checkpoint of a 40k-file working copy). Large zeroed blocks
/// are mapped instead (alloc.rs).
#[global_allocator]
static ALLOC: alloc::Alloc = alloc::Alloc::new();

/// mado: lazy, content-addressed workspaces for source trees.
///
/// Snapshots live in an object store (a local directory by default, or
/// S3/MinIO); every read goes through a persistent, verified disk cache.
/// Start with `mado init`, then `mado import-git <repo>` and
/// `mado checkout main <dir>`. Shell completion: `mado completion --help`;
/// the manual page: `mado man`.
#[derive(Parser)]
#[command(name = "mado", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: cmd::Command,
    /// Print each step as `[+<total ms> Δ<delta ms>] step` and, at the end,
    /// the remote request counts (GETs, PUTs, bytes, round trips).
    #[arg(long, short, global = true)]
    verbose: bool,
    /// Print the result as JSON on stdout (for scripts); an error is one
    /// JSON object on stderr: {"error", "causes", "exit_code", "kind"}, and
    /// "hints" (what to do next) when there are any.
    #[arg(long, global = true)]
    json: bool,
    /// Print no progress, summaries or notes: only errors, warnings and
    /// what the command was asked to show (a listing, a file, JSON).
    #[arg(long, short, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// What to log on stderr (a mount daemon: its log file), with times:
    /// error, warn, info, debug, trace, or filter directives such as
    /// `mado_core::fetch=debug`. Default: $MADO_LOG, else $RUST_LOG, else
    /// warn (info for a mount daemon).
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
}

/// Logging through `tracing`: timestamped lines on stderr, filtered by
/// `--log-level`, `MADO_LOG` or `RUST_LOG`. The filter chosen is put in
/// `MADO_LOG`, so a daemon this process starts logs the same way.
fn init_logging(arg: Option<&str>, daemon: bool) -> Result<(), String> {
    let chosen = arg
        .map(str::to_string)
        .or_else(|| std::env::var("MADO_LOG").ok().filter(|v| !v.is_empty()))
        .or_else(|| std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty()));
    // fuser warns of every request it does not implement (getxattr of
    // security.capability on each write): not news, so errors only.
    let directives =
        chosen.clone().unwrap_or_else(|| if daemon { "info,fuser=error" } else { "warn,fuser=error" }.into());
    // A bare word is a target to a filter: a misspelt level would pass.
    let levels = ["off", "error", "warn", "info", "debug", "trace"];
    if !directives.contains(['=', ',']) && !levels.contains(&directives.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "--log-level / MADO_LOG {directives:?} is not a level; use error, warn, info, debug or trace (or target=level)"
        ));
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .map_err(|e| format!("--log-level / MADO_LOG {directives:?}: {e} (use error, warn, info, debug or trace)"))?;
    if let Some(c) = chosen {
        std::env::set_var("MADO_LOG", c);
    }
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    Ok(())
}

/// Chunks of large files are ~1 MiB buffers allocated and freed on many
/// threads. glibc's malloc raises its mmap threshold after such frees and
/// then keeps the freed buffers in per-thread arenas: a mount daemon reading
/// a 1 GiB file peaked at 200 MiB with 64 MiB of chunks live (measured,
/// issue #19's bound is 256 MiB). A fixed threshold maps each big buffer
/// and gives it back when freed: the same read peaks at ~90 MiB.
fn bound_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a malloc parameter; called once at start,
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// No transparent huge pages for this process (and the daemons it
/// starts). mimalloc asks for them on its arenas, and as it gives freed
/// memory back at once (above), every fresh allocation after a free then
/// faulted in, and zeroed, a whole 2 MiB page: a cold checkout of a
/// 15,000-file tree spent a quarter of its time in the kernel's
/// `clear_page` and peaked at 470 MiB; without them, 90 MiB and ~35 %
/// faster (measured). mimalloc reads its own THP option before `main`, too
/// early to set, so the kernel's per-process switch is used.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_THP_DISABLE) only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// mimalloc's option "purge delay" (index 15 of `mi_option_e` in both of
/// the versions libmimalloc-sys bundles).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps freed memory before giving it back, in ms.
/// A command that brings content down and writes it out (checkout,
/// materialize, `cat`) keeps it a second, so its next buffers reuse pages
/// already mapped: given back at once, every buffer faulted in and zeroed
/// fresh pages, 40 % of a cold 1 GiB checkout's CPU (0.9 s of kernel time
/// against 1.8 s, measured; peak 130 against 95 MiB). Every other command
/// gives it back at once: with mimalloc's 10 ms a mount reading a large
/// file peaked 30-80 MiB higher, and with a second an import of a 1 GiB
/// file peaked at 301 MiB, over issue #19's 256 MiB bound.
///
/// A mount daemon keeps it 50 ms: the packs it streams in are assembled
/// in fresh buffers, and given back at once their pages were faulted in
/// again for the next pack, a third of the daemon's CPU on a cold read of
/// a 1 GiB file (perf). Measured on the embedded store, two runs each: a
/// cold `cat` through the mount 1.54-1.58 s at 0 ms, 1.04-1.16 s at 50 ms
/// (the daemon's CPU 2.4-2.5 s against 1.4-1.7 s); its peak 149-155 MiB
/// against 205-208 MiB, under the bound; 200 ms and 1 s gained nothing
/// more. What it keeps is what it freed in the last 50 ms, so the peak
/// does not grow with the file.
fn purge_delay_ms(cmd: &cmd::Command) -> i64 {
    if cmd.writes_content_out() {
        1000
    } else if cmd.is_mount_daemon() {
        50
    } else {
        0
    }
}

/// Called as `mount.fuse.mado SPEC DIR [-o OPTIONS]` (a link to mado in
/// /sbin, which mount(8) runs for `-t fuse.mado` and fstab lines of that
/// type), the arguments become `mado mount SPEC DIR ...`. Options:
/// `workspace`, `allow_other`, `remote=URL`, `config=PATH`,
/// `read_timeout=SECONDS`; mount(8)'s generic ones (`rw`, `defaults`,
/// `noauto`, `nofail`, `_netdev`, `x-*`, ...) are left to it.
fn mount_helper_args(argv: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, String> {
    let mut out: Vec<std::ffi::OsString> = vec!["mado".into(), "mount".into()];
    let mut positional = Vec::new();
    let mut opts = Vec::new();
    let mut it = argv.into_iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => opts.extend(it.next().map(|o| o.to_string_lossy().into_owned())),
            Some(o) if o.starts_with("-o") => opts.push(o[2..].to_string()),
            // mount(8)'s own flags: no mtab, sloppy, fake, verbose.
            Some("-n" | "-s" | "-f" | "-v") => {}
            _ => positional.push(a),
        }
    }
    let [spec, dir]: [std::ffi::OsString; 2] =
        positional.try_into().map_err(|_| "usage: mount.fuse.mado SPEC DIR [-o OPTIONS]".to_string())?;
    out.push(spec);
    out.push(dir);
    for o in opts.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let (k, v) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        match (k, v) {
            ("workspace", None) => out.push("--workspace".into()),
            ("allow_other", None) => out.push("--allow-other".into()),
            ("remote", Some(v)) => std::env::set_var("MADO_REMOTE_ADDR", v),
            ("config", Some(v)) => std::env::set_var("MADO_CONFIG", v),
            ("read_timeout", Some(v)) => {
                out.push("--read-timeout".into());
                out.push(v.into());
            }
            ("rw" | "ro" | "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "nofail" | "_netdev"
            | "exec" | "noexec" | "suid" | "nosuid" | "dev" | "nodev" | "atime" | "noatime" | "relatime"
            | "async" | "sync", None) => {}
            _ if k.starts_with("x-") || k == "comment" => {}
            _ => return Err(format!("mount.fuse.mado: unknown option {o:?} (known: workspace, allow_other, remote=URL, config=PATH, read_timeout=SECONDS)")),
        }
    }
    Ok(out)
}

fn main() {
    no_huge_pages();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // A mount's keeper (started by its daemon, never by hand): no command
    // line, no runtime.
    if argv.get(1).is_some_and(|a| a == mado_mount::keeper::KEEPER_ARG) {
        let _ = init_logging(None, true);
        match argv.get(2).and_then(|a| a.to_str()?.parse().ok()) {
            Some(fd) => mado_mount::keeper::run(fd),
            None => std::process::exit(exit::USER),
        }
    }
    let json = exit::wants_json(&argv);
    let as_helper =
        argv.first().and_then(|a| std::path::Path::new(a).file_name()).is_some_and(|n| n == "mount.fuse.mado");
    let argv = if as_helper {
        match mount_helper_args(argv) {
            Ok(a) => a,
            Err(e) => std::process::exit(exit::report_early(&e.to_string(), exit::USER, json)),
        }
    } else {
        argv
    };
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let code = exit::code_of_usage(&e);
            if code == exit::OK || !json {
                let _ = e.print();
                std::process::exit(code);
            }
            std::process::exit(exit::report_early(&e.render().to_string(), code, json));
        }
    };
    // A daemon in the foreground logs its work (info) on stderr, unless
    // --json asked that stderr hold nothing but warnings and its one
    // JSON error.
    if let Err(e) = init_logging(cli.log_level.as_deref(), cli.cmd.is_mount_daemon() && !cli.json) {
        std::process::exit(exit::report_early(&format!("error: {e}"), exit::USER, cli.json));
    }
    // SAFETY: mi_collect only walks and frees the allocator's own memory.
    mado_core::memory::set_give_back(|| unsafe { libmimalloc_sys::mi_collect(true) });
    let delay = purge_delay_ms(&cli.cmd);
    // SAFETY: sets a plain integer option; mimalloc reads it on each purge.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, delay as std::os::raw::c_long) };
    if !cli.cmd.is_mount_daemon() {
        exit::quiet_on_closed_stdout();
    }
    bound_malloc();
    // SAFETY: mi_collect(false) only frees this thread's own empty pages.
    mado_core::memory::set_tidy(|| unsafe { libmimalloc_sys::mi_collect(false) });
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if cli.cmd.is_mount_daemon() {
        builder.on_thread_park(mado_core::memory::tidy);
    }
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(exit::INTERNAL);
        }
    };
    let cli_json = cli.json;
    let ctx = ctx::Ctx::new(cli.verbose, cli.json, cli.quiet);
    let interruptible = cli.cmd.writes_a_tree();
    let result = rt.block_on(async {
        if !interruptible {
            return Some(cmd::run(cli.cmd, &ctx).await);
        }
        // Ctrl-C drops the command's work here (a temp file being written
        // is removed as its write is dropped) instead of killing the
        // process where it stands.
        tokio::select! {
            r = cmd::run(cli.cmd, &ctx) => Some(r),
            _ = tokio::signal::ctrl_c() => None,
        }
    });
    ctx::stop_progress();
    let Some(result) = result else {
        // The writers still running are dropped with the runtime (and
        // their temp names with them); a blocking write in progress gets a
        // moment to end.
        rt.shutdown_timeout(std::time::Duration::from_secs(2));
        eprintln!("interrupted");
        std::process::exit(exit::INTERRUPTED);
    };
    ctx.finish();
    let code = match result {
        Ok(()) => exit::OK,
        Err(e) => exit::report(&e, cli_json),
    };
    // Exit now: dropping the runtime would wait for blocking threads, and
    // one may be stuck on a store that stalls (its reader already got EIO).
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// Every command a user runs shows examples under `--help` (a group
    /// such as `ws` or `cache` shows its own, and so does each of its
    /// commands but the smallest: `cache stats|verify`, `config get|set|…`,
    /// which the group's examples cover).
    #[test]
    fn every_command_has_examples_in_its_help() {
        let mut cli = super::Cli::command();
        cli.build();
        let mut missing = Vec::new();
        for sub in cli.get_subcommands() {
            let name = sub.get_name();
            if name == "help" || name == "man" {
                continue;
            }
            let has = |c: &clap::Command| c.get_after_help().is_some_and(|h| h.to_string().starts_with("Examples:"));
            if !has(sub) {
                missing.push(name.to_string());
            }
            if name == "ws" {
                for w in sub.get_subcommands().filter(|w| w.get_name() != "help") {
                    if !has(w) {
                        missing.push(format!("ws {}", w.get_name()));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "no examples in --help of: {missing:?}");
    }
}
