use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use clap::Args;

use crate::ctx::Ctx;

/// Import git commits as snapshots and move a ref to the last one.
///
/// Reads the repository with gix, writes what `git clone` of each commit
/// would put in the working tree (.gitattributes eol conversions applied;
/// submodules become empty directories; symlinks stay symlinks), stores it
/// in the disk cache and uploads only what the store lacks: importing the
/// same commit again uploads nothing. Each snapshot's parent is the ref's
/// previous snapshot. Prints the snapshot id of each commit.
#[derive(Args)]
pub struct ImportGitArgs {
    /// Path to a local git repository (a worktree, any directory inside it,
    /// or a bare repository). A URL is refused: clone it first.
    repo: PathBuf,
    /// Revision to import (repeatable; default HEAD), e.g. main, v1.0, a commit id.
    #[arg(long = "rev", short = 'r', value_name = "REV")]
    revs: Vec<String>,
    /// Ref to move to the last imported snapshot. A new ref's first import
    /// builds on the packs of the --base ref: what they hold is not sent
    /// again.
    #[arg(long = "ref", default_value = "main", value_name = "NAME")]
    ref_name: String,
    /// The ref whose packs a new ref's first import builds on (content it
    /// holds is not packed and sent again; a ref imported with --no-packs
    /// has no packs to build on). Default: main, when there is one.
    #[arg(long = "base", value_name = "REF")]
    base: Option<String>,
    /// Do not build and publish locality packs for the imported tips.
    #[arg(long)]
    no_packs: bool,
    /// Largest pack, in bytes.
    #[arg(long, default_value_t = mado_core::pack::DEFAULT_MAX_PACK_BYTES, value_name = "BYTES")]
    max_pack_bytes: u64,
}

pub async fn run(mut a: ImportGitArgs, ctx: &Ctx) -> Result<()> {
    let root = locate_repo(&a.repo)?;
    if root != a.repo {
        note!(ctx, "note: importing the whole repository at {} ({} is inside it)", root.display(), a.repo.display());
        a.repo = root;
    }
    let remote = ctx.remote_creating()?;
    let cache = ctx.cache()?;
    if let Some(b) = &a.base {
        // Named: it must be there (the default, main, may not be).
        if remote.read_ref(b).await?.is_none() {
            return Err(mado_core::Error::User(format!(
                "--base {b}: no such ref to build on; see `mado refs`, or leave --base out"
            ))
            .into());
        }
    }
    let revs = if a.revs.is_empty() { vec!["HEAD".to_string()] } else { a.revs };
    // Uncommitted changes are not imported: ask git beside the import.
    let dirty = revs.iter().any(|r| r == "HEAD").then(|| {
        let repo = a.repo.clone();
        std::thread::spawn(move || uncommitted_changes(&repo))
    });
    let started = std::time::Instant::now();
    let pb = ctx.progress(None, "reading files");
    let pb2 = pb.clone();
    ctx.step(format!("staging {} revision(s) from {}", revs.len(), a.repo.display()));
    let report = mado_core::import::import_git(
        &remote,
        cache,
        &a.repo,
        revs,
        &a.ref_name,
        (!a.no_packs).then_some(mado_core::publish::PackOptions {
            mode: mado_core::pack::Mode::Recursive,
            cap: a.max_pack_bytes,
            index_check: mado_core::publish::IndexCheck::KnownAbsent,
            base: None,
            layers: None,
            flat: None,
            primary: true,
        }),
        Some(a.base.as_deref().unwrap_or(mado_core::import::SEED_REF)),
        Arc::new(move |files, bytes| {
            pb2.set_position(files);
            // Every 256 files: a message per file would cost more than it tells.
            if files % 256 == 0 {
                let secs = started.elapsed().as_secs_f64().max(1e-3);
                pb2.set_message(format!("reading files, {} MB at {:.0} MB/s", bytes >> 20, bytes as f64 / 1e6 / secs));
            }
        }),
    )
    .await;
    pb.finish_and_clear();
    let report = report?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    for n in &report.next {
        eprintln!("  hint: {}", crate::hint::words(n));
    }
    if let Some(n) = dirty.and_then(|t| t.join().ok().flatten()).filter(|&n| n > 0) {
        eprintln!(
            "warning: {} has {n} uncommitted change(s), which are not imported: mado imports commits (HEAD), \
             not the working tree; commit them and import again to include them",
            a.repo.display()
        );
    }
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    print_report(ctx, &report, remote.stats(), secs)
}

/// What was imported and sent: step lines, then the JSON object or the
/// summary lines.
fn print_report(
    ctx: &Ctx,
    report: &mado_core::import::ImportReport,
    remote: mado_core::store::Stats,
    secs: f64,
) -> Result<()> {
    for p in &report.packs {
        ctx.step(format!(
            "packed tree {}: {} packs, {} members, {} uploaded, built in {} ms",
            &p.tree[..12],
            p.packs,
            p.members,
            p.packs_uploaded,
            p.build_ms
        ));
    }
    // Packs-first, trees travel inline in the index: none go up alone.
    let trees = match report.upload.trees_uploaded {
        0 => String::new(),
        n => format!(", {n} of them trees"),
    };
    // The bytes count the packs too (a `--verbose` line said "0 objects
    // alone (524 MB)").
    ctx.step(format!(
        "uploaded {} objects alone{trees} and {} snapshots; {} B up in all, packs included",
        report.upload.objects_uploaded, report.upload.snapshots_uploaded, report.upload.bytes_uploaded
    ));
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            report: &'a mado_core::import::ImportReport,
            remote: mado_core::store::Stats,
        }
        return ctx.print_json(&Out { report, remote });
    }
    for i in &report.imported {
        let note = if i.new_snapshot { "" } else { " (unchanged)" };
        say!(ctx, "{} {} -> {}{note}", i.rev, mado_core::hash::short_hex(&i.commit), i.snapshot);
    }
    let packs: usize = report.packs.iter().map(|p| p.packs).sum();
    let new_packs: u64 = report.packs.iter().map(|p| p.packs_uploaded).sum();
    let up = &report.upload;
    // Packs sent for a tree whose index another writer had put up first:
    // its own packs serve, and these are left for gc.
    let unused: u64 = report.packs.iter().filter(|p| p.index_existed).map(|p| p.packs_uploaded).sum();
    let sent = if up.snapshots_uploaded == 0 {
        "nothing new to upload".to_string()
    } else {
        let of = if packs > 0 { format!(" (of {packs})") } else { String::new() };
        let unused = match unused {
            0 => String::new(),
            n => format!(" ({n} not needed: the store had the tree's packs already; gc reclaims them)"),
        };
        let on = match &report.built_on {
            Some(r) => format!(" on top of {r}'s"),
            None => String::new(),
        };
        format!(
            "uploaded {new_packs} new packs{of}{unused}{on}, {} objects alone and {} snapshots: {} MB",
            up.objects_uploaded,
            up.snapshots_uploaded,
            up.bytes_uploaded >> 20
        )
    };
    say!(
        ctx,
        "{}: {} files, {} MB read; {sent}; {:.1} s ({:.0} MB/s read)",
        report.ref_name,
        report.files,
        report.bytes >> 20,
        secs,
        report.bytes as f64 / secs / 1e6,
    );
    Ok(())
}

/// The repository `arg` names: `arg` itself, or the nearest directory
/// above it with a `.git` (as git finds it from a subdirectory). A URL is
/// refused with what to do instead.
fn locate_repo(arg: &Path) -> Result<PathBuf> {
    let text = arg.to_string_lossy();
    let user = |m: String| anyhow::Error::new(mado_core::Error::User(m));
    if !arg.exists() {
        let scp_like = text.split_once(':').is_some_and(|(host, _)| !host.contains('/') && host.contains('@'));
        if text.contains("://") || scp_like {
            return Err(user(format!(
                "{text} is a URL; mado imports from a local repository: clone it first \
                 (`git clone --filter=blob:none {text} DIR`), then `mado import-git DIR`"
            )));
        }
        return Err(user(format!("{text} does not exist; give the path of a local git repository")));
    }
    let abs = std::path::absolute(arg).unwrap_or_else(|_| arg.to_path_buf());
    let is_bare = |d: &Path| d.join("HEAD").is_file() && d.join("objects").is_dir() && d.join("refs").is_dir();
    if abs.join(".git").exists() || is_bare(&abs) {
        return Ok(arg.to_path_buf());
    }
    for dir in abs.ancestors().skip(1) {
        if dir.join(".git").exists() {
            return Ok(dir.to_path_buf());
        }
    }
    Err(user(format!(
        "{text} is not in a git repository (no .git in it or above it); \
         give the path of a local repository, or `git clone URL DIR` first"
    )))
}

/// How many tracked paths differ from HEAD in the working tree (`git
/// status`); `None` when git cannot say (no git, a bare repository).
fn uncommitted_changes(repo: &Path) -> Option<usize> {
    let o = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["status", "--porcelain", "-z", "--untracked-files=no"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    Some(o.stdout.split(|&b| b == 0).filter(|l| !l.is_empty()).count())
}
