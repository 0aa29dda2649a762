//! One file per command: an `XxxArgs` struct whose doc comments are the
//! help, and a `run` function.

mod cache;
mod cat;
mod checkout;
mod completion;
mod config;
mod diff;
mod gc;
mod import_git;
mod init;
mod log;
mod ls;
mod materialize;
mod mount;
mod pack;
mod pack_status;
mod refs;
mod restart;
mod serve_virtiofs;
mod stats;
mod umount;
mod ws;

use anyhow::Result;
use clap::Subcommand;
use mado_mount::protocol::{Op, Reply, Request};

use crate::ctx::Ctx;

#[derive(Subcommand)]
pub enum Command {
    #[command(after_help = EX_INIT)]
    Init(init::InitArgs),
    #[command(name = "import-git")]
    #[command(after_help = EX_IMPORT_GIT)]
    ImportGit(import_git::ImportGitArgs),
    #[command(after_help = EX_LOG)]
    Log(log::LogArgs),
    #[command(after_help = EX_REFS)]
    Refs(refs::RefsArgs),
    #[command(after_help = EX_LS)]
    Ls(ls::LsArgs),
    #[command(after_help = EX_DIFF)]
    Diff(diff::DiffArgs),
    #[command(after_help = EX_CAT)]
    Cat(cat::CatArgs),
    #[command(after_help = EX_CHECKOUT)]
    Checkout(checkout::CheckoutArgs),
    #[command(after_help = EX_PACK)]
    Pack(pack::PackArgs),
    #[command(after_help = EX_MATERIALIZE)]
    Materialize(materialize::MaterializeArgs),
    #[command(after_help = EX_GC)]
    Gc(gc::GcArgs),
    #[command(after_help = EX_MOUNT)]
    Mount(mount::MountArgs),
    #[command(after_help = EX_UMOUNT)]
    Umount(umount::UmountArgs),
    #[command(after_help = EX_RESTART)]
    Restart(restart::RestartArgs),
    #[command(name = "serve-virtiofs", after_help = EX_SERVE_VIRTIOFS)]
    ServeVirtiofs(serve_virtiofs::ServeVirtiofsArgs),
    #[command(name = "pack-status", after_help = EX_PACK_STATUS)]
    PackStatus(pack_status::PackStatusArgs),
    #[command(after_help = EX_STATS)]
    Stats(stats::StatsArgs),
    #[command(subcommand, after_help = EX_WS)]
    Ws(ws::WsCommand),
    #[command(subcommand, after_help = EX_CACHE)]
    Cache(cache::CacheCommand),
    #[command(subcommand, after_help = EX_CONFIG)]
    Config(config::ConfigCommand),
    #[command(after_help = EX_COMPLETION)]
    Completion(completion::CompletionArgs),
    Man(completion::ManArgs),
}

impl Command {
    /// Whether this command brings content down and writes it out (a
    /// checkout, materialize, `cat`): bulk bytes through short-lived
    /// buffers, with nothing else in memory.
    pub fn writes_content_out(&self) -> bool {
        matches!(self, Command::Checkout(_) | Command::Materialize(_) | Command::Cat(_))
    }

    /// Whether this process is a mount daemon (`mado mount --foreground`).
    /// Writes files into a directory the user named: on Ctrl-C (SIGINT)
    /// its work is dropped, so that temp names are removed, before the
    /// process exits (see `main`).
    pub fn writes_a_tree(&self) -> bool {
        matches!(self, Command::Checkout(_) | Command::Materialize(_))
            || matches!(self, Command::Ws(ws::WsCommand::Create(_) | ws::WsCommand::Resume(_)))
    }

    pub fn is_mount_daemon(&self) -> bool {
        matches!(self, Command::Mount(a) if a.foreground) || matches!(self, Command::ServeVirtiofs(_))
    }
}

pub async fn run(cmd: Command, ctx: &Ctx) -> Result<()> {
    // One span per command: every line it logs (MADO_LOG=debug) says which.
    let span = tracing::info_span!("command", name = cmd.name());
    let r = tracing::Instrument::instrument(dispatch(cmd, ctx), span).await;
    // Pack downloads finish writing the cache before the process exits.
    ctx.drain_fetches().await;
    r
}

impl Command {
    /// The command's name as typed (`ws checkpoint`), for its span.
    fn name(&self) -> &'static str {
        match self {
            Command::Init(_) => "init",
            Command::ImportGit(_) => "import-git",
            Command::Log(_) => "log",
            Command::Diff(_) => "diff",
            Command::Refs(_) => "refs",
            Command::Ls(_) => "ls",
            Command::Cat(_) => "cat",
            Command::Checkout(_) => "checkout",
            Command::Pack(_) => "pack",
            Command::Materialize(_) => "materialize",
            Command::Gc(_) => "gc",
            Command::Mount(_) => "mount",
            Command::Umount(_) => "umount",
            Command::Restart(_) => "restart",
            Command::ServeVirtiofs(_) => "serve-virtiofs",
            Command::PackStatus(_) => "pack-status",
            Command::Stats(_) => "stats",
            Command::Ws(c) => c.name(),
            Command::Cache(_) => "cache",
            Command::Config(_) => "config",
            Command::Completion(_) => "completion",
            Command::Man(_) => "man",
        }
    }
}

async fn dispatch(cmd: Command, ctx: &Ctx) -> Result<()> {
    match cmd {
        Command::Init(a) => init::run(a, ctx).await,
        Command::ImportGit(a) => import_git::run(a, ctx).await,
        Command::Log(a) => log::run(a, ctx).await,
        Command::Diff(a) => diff::run(a, ctx).await,
        Command::Refs(a) => refs::run(a, ctx).await,
        Command::Ls(a) => ls::run(a, ctx).await,
        Command::Cat(a) => cat::run(a, ctx).await,
        Command::Checkout(a) => checkout::run(a, ctx).await,
        Command::Pack(a) => pack::run(a, ctx).await,
        Command::Materialize(a) => materialize::run(a, ctx).await,
        Command::Gc(a) => gc::run(a, ctx).await,
        Command::Mount(a) => mount::run(a, ctx).await,
        Command::Umount(a) => umount::run(a, ctx).await,
        Command::Restart(a) => restart::run(a, ctx).await,
        Command::ServeVirtiofs(a) => serve_virtiofs::run(a, ctx),
        Command::PackStatus(a) => pack_status::run(a, ctx).await,
        Command::Stats(a) => stats::run(a, ctx).await,
        Command::Ws(c) => ws::run(c, ctx).await,
        Command::Cache(c) => cache::run(c, ctx).await,
        Command::Config(c) => config::run(c, ctx),
        Command::Completion(a) => completion::completion(a),
        Command::Man(a) => completion::man(a, ctx),
    }
}

/// A path (or name) for a line of human output: as it is, or quoted with
/// escapes (`"a\nb"`, as `{:?}` writes it) when it holds a control
/// character, a quote or a backslash, so that a newline in a name cannot
/// pass for another line (git quotes such paths too). `--json` gives them
/// as they are.
/// [`shown`] of a name as the tree holds it: one that is not UTF-8 is
/// quoted with its bytes escaped (`"bad\xffname"`), never shown with a
/// replacement character that names nothing.
pub(crate) fn shown_bytes(b: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(b) {
        Ok(s) => shown(s),
        Err(_) => std::borrow::Cow::Owned(format!("\"{}\"", b.escape_ascii())),
    }
}

pub(crate) fn shown(p: &str) -> std::borrow::Cow<'_, str> {
    if p.chars().any(|c| c.is_control() || c == '"' || c == '\\') {
        std::borrow::Cow::Owned(format!("{p:?}"))
    } else {
        std::borrow::Cow::Borrowed(p)
    }
}

/// Sends `op` to the daemon of the mount holding `dir` (default: the
/// current directory) and waits up to `wait` for its reply; an error reply
/// becomes an error (the user's when the daemon says so).
fn ask_daemon(dir: Option<&std::path::Path>, op: Op, wait: std::time::Duration) -> Result<Reply> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir()?,
    };
    let Some((mp, sock)) = mado_mount::control::find_mount(&dir)? else {
        return Err(mado_core::Error::User(format!(
            "no mado mount at or above {}; start one with `mado mount REF DIR`",
            dir.display()
        ))
        .into());
    };
    let hint = format!("if it died, run `mado umount {}`", mp.display());
    ask_socket(&sock, &mp.display().to_string(), &hint, op, wait)
}

/// Sends `op` to the daemon listening on control socket `sock` (serving
/// `what`); `hint` says what to do if it does not answer.
fn ask_socket(sock: &std::path::Path, what: &str, hint: &str, op: Op, wait: std::time::Duration) -> Result<Reply> {
    let reply = mado_mount::control::request(sock, &Request::new(op), wait)
        .map_err(|e| mado_core::Error::User(format!("the daemon of {what} does not answer ({e}); {hint}")))?;
    match reply {
        // As if raised here: the same exit code, the hints worded here.
        Reply::Error { message, user_error: true, next } => {
            Err(next.into_iter().fold(mado_core::Error::User(message), mado_core::Error::then).into())
        }
        Reply::Error { message, user_error: false, next } => {
            Err(anyhow::anyhow!(crate::hint::with_hints(&message, &next)))
        }
        r => Ok(r),
    }
}

/// A reply of another kind than asked for: a daemon of another version.
fn unexpected(r: &Reply) -> anyhow::Error {
    anyhow::anyhow!("the mount's daemon answered with an unexpected reply ({r:?}); remount it")
}

const EX_INIT: &str = "Examples:
  mado init                                   # the embedded store in ~/.local/share/mado/store
  mado init --remote s3://bucket/projects     # S3 or MinIO (AWS_* variables or AWS_PROFILE)
  AWS_PROFILE=minio mado init --remote s3://bucket/p
  mado init --remote gs://bucket/p            # GCS (GOOGLE_SERVICE_ACCOUNT)
  mado init --remote az://container/p         # Azure (AZURE_STORAGE_ACCOUNT_NAME, _KEY)";

const EX_IMPORT_GIT: &str = "Examples:
  mado import-git ~/src/project               # HEAD; the ref main moves to it
  mado import-git . --rev v1.0 --ref release  # a tag, into its own ref
  mado import-git . -r v1.0 -r v1.1 -r main   # several commits, each on the last
  mado import-git . --verbose                 # each step, and the request counts";

const EX_CHECKOUT: &str = "Examples:
  mado checkout main ~/work/project           # the whole tree
  mado checkout main ~/work/part src/lib docs # only those paths
  mado checkout release /tmp/r --force        # over what is in a non-empty directory";

const EX_MOUNT: &str = "Examples:
  mado mount main ~/mnt/project               # read-only, lazy
  mado stats ~/mnt/project; mado umount ~/mnt/project
  mado mount agent-1 ~/work/agent-1 --workspace   # a workspace, read-write";

const EX_DIFF: &str = "Examples:
  mado diff main                              # main against its parent
  mado diff release main --stat               # two refs: paths and sizes
  mado diff ws/agent-1 -p                     # a checkpoint against its parent, with the text";

const EX_LOG: &str = "Examples:
  mado log                                    # main, newest first
  mado log ws/agent-1 -n 3                    # a workspace's last three checkpoints
  mado log main --json | jq '.[0].snapshot'";

const EX_CAT: &str = "Examples:
  mado cat main src/lib.rs
  mado cat ws/agent-1 notes.md > notes.md";

const EX_MATERIALIZE: &str = "Examples:
  mado materialize src/lib                    # a subtree of main into the cache
  mado materialize --rev release              # a whole tree, before going offline";

const EX_GC: &str = "Examples:
  mado gc --dry-run                           # what would be deleted
  mado gc";

const EX_REFS: &str = "Examples:
  mado refs                                   # every ref: imports and ws/NAME
  mado refs --json | jq -r '.[].name'";

const EX_LS: &str = "Examples:
  mado ls main                                # the root of main
  mado ls main src/lib                        # a directory in it
  mado ls ws/agent-1 --json                   # kind, size and id of each entry";

const EX_PACK: &str = "Examples:
  mado pack                                   # recursive packs of main (import-git already does this)
  mado pack -r release                        # another ref; an unchanged tree uploads nothing
  mado pack --per-dir -r main                 # per-directory packs (v1)";

const EX_UMOUNT: &str = "Examples:
  mado umount ~/mnt/project                   # waits for the daemon to finish (a workspace saves its state)";

const EX_RESTART: &str = "Examples:
  mado restart ~/work/agent-1                 # after installing a new mado: its daemon takes the mount over
  mado restart ~/work/agent-1 --json          # {\"dir\":..., \"from_pid\":..., \"pid\":...}";

const EX_SERVE_VIRTIOFS: &str = "Examples:
  mado serve-virtiofs main --socket /run/mado.sock           # read-only, to a VM guest
  mado serve-virtiofs vm-1 --workspace --socket /run/vm-1.sock
  # then: qemu ... -chardev socket,id=fs,path=/run/mado.sock \\
  #   -device vhost-user-fs-pci,chardev=fs,tag=mado   (guest: mount -t virtiofs mado /mnt)";

const EX_PACK_STATUS: &str = "Examples:
  mado pack-status ~/mnt/project              # prefetcher attached, or why not
  cd ~/mnt/project/src && mado pack-status --json";

const EX_STATS: &str = "Examples:
  mado stats ~/mnt/project                    # the daemon's requests, GETs and cache hits
  mado stats --json
  mado stats --all                            # every mount and workspace of yours on this machine
  mado stats --prometheus 127.0.0.1:9464      # the same at http://127.0.0.1:9464/metrics";

const EX_CACHE: &str = "Examples:
  mado cache stats                            # where it is, what it holds, its cap
  mado cache verify                           # re-hash every entry; bad ones are deleted
  mado config set cache.max_size 20G          # cap it";

const EX_CONFIG: &str = "Examples:
  mado config list
  mado config set cache.max_size 20G
  mado config get remote
  mado config unset cache.max_size";

const EX_COMPLETION: &str = "Examples:
  mado completion bash > ~/.local/share/bash-completion/completions/mado
  mado completion zsh > ~/.zfunc/_mado
  mado completion fish > ~/.config/fish/completions/mado.fish";

const EX_WS: &str = "Examples:
  mado ws create agent-1 --from main --mount ~/work/agent-1
  mado ws checkpoint -m wip                   # inside the working copy
  mado ws list; mado ws log agent-1 -n 3
  mado ws resume agent-1 ~/elsewhere";

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_shown_quoted_when_they_would_not_read_back() {
        assert_eq!(super::shown_bytes(b"plain.txt"), "plain.txt");
        assert_eq!(super::shown_bytes("café.txt".as_bytes()), "café.txt");
        assert_eq!(super::shown_bytes(b"new\nline"), "\"new\\nline\"");
        assert_eq!(super::shown_bytes(b"caf\xe9.txt"), "\"caf\\xe9.txt\"");
    }
}
