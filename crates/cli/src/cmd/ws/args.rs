//! The arguments of `mado ws` subcommands, and their examples.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct RecoverArgs {
    /// The set-aside folder (as the mount's warning or the listing names
    /// it, or its last component).
    pub aside: Option<PathBuf>,
    /// The new workspace's name (default: NAME-recovered).
    #[arg(long = "as", value_name = "NEW", requires = "aside")]
    pub as_name: Option<String>,
    /// Instead, write the files the changes hold (what the mount wrote,
    /// its symlinks and new directories; not its removals) into DIR, a
    /// new or empty directory. Reads nothing from the store: for changes
    /// whose checkpoint gc deleted.
    #[arg(long, value_name = "DIR", requires = "aside", conflicts_with = "as_name")]
    pub to: Option<PathBuf>,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("working_copy").required(true).multiple(false).args(["dir", "mount", "no_checkout"])))]
pub struct CreateArgs {
    pub name: String,
    /// Ref name or snapshot id to start from (main~2, main^: git's ancestry steps).
    #[arg(long, default_value = "main", value_name = "REF")]
    pub from: String,
    /// The working copy as a plain directory: a new or empty directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The working copy as a read-write FUSE mount at DIR (an empty directory; created if missing).
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,
    /// Only create the workspace, with no working copy here: to serve it
    /// to a VM guest (`mado serve-virtiofs NAME --workspace`), or to
    /// resume it later (`ws resume`).
    #[arg(long)]
    pub no_checkout: bool,
    /// With --mount: let other users in, the kernel checking the modes
    /// (see `mado mount --allow-other`).
    #[arg(long, requires = "mount")]
    pub allow_other: bool,
}

#[derive(Args)]
pub struct CheckpointArgs {
    /// Workspace name: outside any copy of it, its mount on this machine or
    /// the copy `serve-virtiofs` serves (default: the working copy or mount
    /// around the current directory).
    pub name: Option<String>,
    #[arg(short, long, default_value = "checkpoint")]
    pub message: String,
    /// The working copy (default: found from the current directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Take the lease even though another holder had it, once it has expired.
    #[arg(long)]
    pub steal: bool,
    /// Replace the workspace's head even though it moved since this working
    /// copy's base (the newer checkpoints stay in `ws log`, not in the head).
    #[arg(long)]
    pub force: bool,
    /// Keep everything: by default a working copy's checkpoint leaves out
    /// `.git` directories and the untracked paths that `.gitignore` and
    /// `.madoignore` files ignore (git's syntax; a tracked path stays).
    #[arg(long)]
    pub no_ignore: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    /// The working copy (default: found from the current directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// As `ws checkpoint --no-ignore` would see it.
    #[arg(long)]
    pub no_ignore: bool,
}

#[derive(Args)]
pub struct ReleaseArgs {
    /// Workspace name (checked against the working copy's).
    pub name: Option<String>,
    /// The working copy (default: found from the current directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct ResumeArgs {
    pub name: String,
    /// Where to restore it: a new or empty directory (with --mount: the mount point).
    pub dir: PathBuf,
    /// Mount it read-write at DIR instead of materializing it; changes not
    /// yet checkpointed by an earlier mount on this machine are kept.
    #[arg(long)]
    pub mount: bool,
    /// With --mount: let other users in, the kernel checking the modes
    /// (see `mado mount --allow-other`).
    #[arg(long, requires = "mount")]
    pub allow_other: bool,
    /// Take the lease once it has expired, even if another holder had it.
    #[arg(long)]
    pub steal: bool,
    /// Restore a copy without taking the lease: it can be read and changed
    /// but never checkpointed (for looking at a workspace someone else holds).
    #[arg(long, conflicts_with_all = ["mount", "steal"])]
    pub read_only: bool,
    /// Resume into DIR even though a mount of the workspace on this machine
    /// saved changes no checkpoint holds (they stay saved; the next mount
    /// sets them aside, and `mado ws recover` gets them back).
    #[arg(long, conflicts_with = "mount")]
    pub ignore_mount_changes: bool,
}

#[derive(Args)]
pub struct LogArgs {
    pub name: String,
    /// Show at most this many checkpoints (default: all).
    #[arg(long = "max-count", alias = "max", short = 'n', value_name = "N")]
    pub max: Option<usize>,
}

#[derive(Args)]
pub struct RmArgs {
    pub name: String,
    /// Remove it even while a working copy holds its lease (that copy can
    /// then no longer checkpoint).
    #[arg(long)]
    pub force: bool,
}

pub const EX_CREATE: &str = "Examples:
  mado ws create agent-1 --from main --mount ~/work/agent-1   # a read-write mount
  mado ws create agent-2 --from release --dir ~/work/agent-2  # a plain directory
  mado ws create vm-1 --no-checkout                           # to serve to a VM guest";

pub const EX_CHECKPOINT: &str = "Examples:
  cd ~/work/agent-1 && mado ws checkpoint -m \"tests pass\"
  mado ws checkpoint --dir ~/work/agent-2 --json
  mado ws checkpoint vm-1 -m \"from the guest\"     # a workspace served to a VM";

pub const EX_STATUS: &str = "Examples:
  cd ~/work/agent-2 && mado ws status
  mado ws status --dir ~/work/agent-2 --json";

pub const EX_RESUME: &str = "Examples:
  mado ws resume agent-1 ~/elsewhere              # takes the lease
  mado ws resume agent-1 ~/peek --read-only       # no lease, never checkpoints
  mado ws resume agent-1 ~/mnt/agent-1 --mount    # as a read-write mount";

pub const EX_LIST: &str = "Examples:
  mado ws list
  mado ws list --json | jq -r '.[].name'";

pub const EX_WS_LOG: &str = "Examples:
  mado ws log agent-1                         # every checkpoint, newest first
  mado ws log agent-1 -n 3 --json";

pub const EX_RELEASE: &str = "Examples:
  mado ws release                             # inside a plain working copy
  mado ws release agent-2 --dir ~/work/agent-2";

pub const EX_RECOVER: &str = "Examples:
  mado ws recover                       # list the changes mounts set aside here
  mado ws recover ~/.local/share/mado/workspaces/3f2a….old-1795782237 --as fix-retry
  mado ws resume fix-retry --mount ~/w  # the changes, on the checkpoint they were made on
  cd ~/w && mado ws checkpoint -m 'recovered'
  mado ws recover 3f2a….old-1795782237 --to ~/saved   # just the files, when gc deleted their checkpoint";

pub const EX_RM: &str = "Examples:
  mado ws rm agent-1                          # the ref and lease; then `mado gc` reclaims the rest
  mado ws rm --force agent-1                  # even while a working copy holds its lease";
