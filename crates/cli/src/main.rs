//! The `mado` command line: parses arguments, runs one command, prints the
//! error chain once and exits 0 (ok), 1 (user error, with a hint) or 2
//! (internal or remote error). Each command is a file in `cmd/`.

mod cmd;
mod ctx;

use clap::Parser;

/// mado: lazy, content-addressed workspaces for source trees.
///
/// Snapshots live in an object store (a local directory by default, or
/// S3/MinIO); every read goes through a persistent, verified disk cache.
/// Start with `mado init`, then `mado import-git <repo>` and
/// `mado checkout main <dir>`.
#[derive(Parser)]
#[command(name = "mado", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: cmd::Command,
    /// Print each step as `[+<total ms> Δ<delta ms>] step` and, at the end,
    /// the remote request counts (GETs, PUTs, bytes, round trips).
    #[arg(long, short, global = true)]
    verbose: bool,
    /// Print the result as JSON on stdout (for scripts).
    #[arg(long, global = true)]
    json: bool,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help and --version print to stdout and succeed; a usage
            // error is the user's (exit 1), never "internal" (2).
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    if !cli.cmd.is_mount_daemon() {
        // `mado log | head -1`: a closed stdout ends the command quietly,
        // as it does for git and cat (Rust ignores SIGPIPE, so every
        // print would otherwise fail with EPIPE and panic). Not in the
        // mount daemon, which must outlive a control client that hangs up.
        // SAFETY: called before any other thread exists; SIG_DFL is a
        // valid disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    let ctx = ctx::Ctx::new(cli.verbose, cli.json);
    let result = rt.block_on(cmd::run(cli.cmd, &ctx));
    ctx.finish();
    let code = match result {
        Ok(()) => 0,
        Err(e) => ctx::report_error(&e),
    };
    // Exit now: dropping the runtime would wait for blocking threads, and
    // one may be stuck on a store that stalls (its reader already got EIO).
    std::process::exit(code);
}
