use std::io::Write;

use anyhow::Result;
use clap::Args;
use futures::StreamExt;

use crate::ctx::Ctx;

/// Show what changed between two snapshots: paths added (A), modified (M:
/// content, kind or exec bit) and deleted (D), sorted.
///
/// Each side is a ref name (`main`, `ws/NAME`) or a snapshot id, with any
/// of git's ancestry steps (`main~2`, `main^`); with one,
/// it is compared with its parent snapshot. Only trees that differ are
/// read, so the cost follows the change. File times are not compared
/// (trees hold none). `--stat` and `-p` read the changed files' content
/// too. Exit status 0 either way; `--json` for scripts: `{"from", "to",
/// "added", "modified", "deleted"}`, with `stat` and `patches` when asked.
#[derive(Args)]
pub struct DiffArgs {
    /// The older side: a ref name or a snapshot id (main~1, main^: git's
    /// ancestry steps).
    from: String,
    /// The newer side (default: FROM, compared with its parent).
    to: Option<String>,
    /// Per changed path: lines added and removed (a text file) or its size
    /// before and after (binary), then the totals, as `git diff --stat`.
    #[arg(long)]
    stat: bool,
    /// The changes of each text file as a unified diff (binary files, and
    /// files over 8 MiB, are named only), as `git diff -p`.
    #[arg(short = 'p', long = "patch")]
    patch: bool,
}

#[derive(serde::Serialize)]
struct Out {
    from: String,
    to: String,
    #[serde(flatten)]
    changes: mado_core::diff::Changes,
    #[serde(skip_serializing_if = "Option::is_none")]
    stat: Option<Vec<FileStat>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patches: Option<Vec<Patch>>,
}

#[derive(serde::Serialize)]
struct FileStat {
    path: String,
    status: char,
    binary: bool,
    lines_added: u64,
    lines_removed: u64,
    old_size: u64,
    new_size: u64,
}

#[derive(serde::Serialize)]
struct Patch {
    path: String,
    /// The unified diff, or a line saying why there is none.
    text: String,
}

/// Files above this are compared by size only.
const MAX_DIFF_BYTES: u64 = 8 << 20;

/// One side of a changed path: its bytes (empty when absent or not a file)
/// and whether it is text.
struct Side {
    data: bytes::Bytes,
    size: u64,
    present: bool,
    /// git's mode of the entry (100644, 100755, 120000, …), when present.
    mode: Option<&'static str>,
}

/// The mode git shows for an entry of kind `k`.
fn git_mode(k: mado_core::object::Kind) -> &'static str {
    use mado_core::object::Kind;
    match k {
        Kind::File => "100644",
        Kind::Executable => "100755",
        Kind::Symlink => "120000",
        Kind::Directory => "040000",
        Kind::Gitlink => "160000",
    }
}

async fn side(fetcher: &std::sync::Arc<mado_core::fetch::Fetcher>, root: mado_core::Hash, path: &str) -> Result<Side> {
    // An empty directory is listed as "path/".
    let path = path.trim_end_matches('/');
    let e = match fetcher.lookup(root, path).await {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(Side { data: Default::default(), size: 0, present: false, mode: None }),
        Err(e) if e.is_not_found() => {
            return Ok(Side { data: Default::default(), size: 0, present: false, mode: None })
        }
        Err(e) => return Err(e.into()),
    };
    let mode = Some(git_mode(e.kind));
    if !e.kind.has_content() {
        return Ok(Side { data: Default::default(), size: 0, present: true, mode });
    }
    let size = e.size;
    if size > MAX_DIFF_BYTES {
        return Ok(Side { data: Default::default(), size, present: true, mode });
    }
    let data = fetcher.content(&e, path).await?;
    Ok(Side { size: data.len() as u64, data, present: true, mode })
}

/// Text as git judges it: no NUL in the first 8,000 bytes, and UTF-8.
fn is_text(b: &[u8]) -> bool {
    !b[..b.len().min(8000)].contains(&0) && std::str::from_utf8(b).is_ok()
}

pub async fn run(a: DiffArgs, ctx: &Ctx) -> Result<()> {
    let fetcher = ctx.fetcher()?;
    let (from_id, from, to_id, to) = match &a.to {
        Some(to) => {
            let ((fi, f, _), (ti, t, _)) = futures::try_join!(
                mado_core::resolve::open(&fetcher, &a.from),
                mado_core::resolve::open(&fetcher, to)
            )?;
            (fi, f, ti, t)
        }
        None => {
            let (ti, t, _) = mado_core::resolve::open(&fetcher, &a.from).await?;
            let Some(parent) = t.parents.first().copied() else {
                return Err(mado_core::Error::User(format!(
                    "{} has no parent snapshot to compare with; name two: `mado diff FROM TO`",
                    a.from
                ))
                .into());
            };
            // The parent's trees live in its own index (packs-first).
            let p = fetcher.snapshot(parent).await?;
            fetcher.attach(*p.root).await?;
            (parent, p, ti, t)
        }
    };
    ctx.step(format!("comparing {} with {}", from_id.short(), to_id.short()));
    let changes = mado_core::diff::diff_trees(&fetcher, from.root, to.root).await?;
    let mut lines: Vec<(String, char)> = Vec::new();
    lines.extend(changes.added.iter().map(|p| (p.clone(), 'A')));
    lines.extend(changes.modified.iter().map(|p| (p.clone(), 'M')));
    lines.extend(changes.deleted.iter().map(|p| (p.clone(), 'D')));
    lines.sort();
    let (mut stats, mut patches) = (Vec::new(), Vec::new());
    if a.stat || a.patch {
        // Both sides of every changed path, 16 at a time, in order.
        let (f, from_root, to_root) = (&fetcher, from.root, to.root);
        let sides: Vec<Result<(Side, Side)>> = futures::stream::iter(lines.iter())
            .map(|(p, _)| async move { Ok(futures::try_join!(side(f, *from_root, p), side(f, *to_root, p))?) })
            .buffered(16)
            .collect()
            .await;
        for ((path, status), s) in lines.iter().zip(sides) {
            let (old, new) = s?;
            let (stat, patch) = compare(path, *status, &old, &new, a.patch)?;
            stats.push(stat);
            patches.extend(patch);
        }
    }
    if ctx.json {
        return ctx.print_json(&Out {
            from: from_id.to_hex(),
            to: to_id.to_hex(),
            changes,
            stat: a.stat.then_some(stats),
            patches: a.patch.then_some(patches),
        });
    }
    let mut out = std::io::stdout().lock();
    if a.stat {
        let width = stats.iter().map(|s| s.path.chars().count()).max().unwrap_or(0).min(60);
        let (mut ta, mut tr) = (0, 0);
        for s in &stats {
            let what = if s.binary {
                format!("Bin {} -> {} bytes", s.old_size, s.new_size)
            } else {
                ta += s.lines_added;
                tr += s.lines_removed;
                format!(
                    "{:>5} {}{}",
                    s.lines_added + s.lines_removed,
                    "+".repeat(s.lines_added.min(40) as usize),
                    "-".repeat(s.lines_removed.min(40) as usize)
                )
            };
            writeln!(out, " {} {:<width$} | {what}", s.status, super::shown(&s.path))?;
        }
        let n = stats.len();
        let files = if n == 1 { "file" } else { "files" };
        writeln!(out, " {n} {files} changed, {ta} insertions(+), {tr} deletions(-)")?;
    }
    if a.patch {
        for p in &patches {
            write!(out, "{}", p.text)?;
        }
    }
    if !a.stat && !a.patch {
        for (p, c) in lines {
            writeln!(out, "{c} {}", super::shown(&p))?;
        }
    }
    Ok(())
}

/// One changed path's line counts, and its patch when `patch`: a binary
/// or too large file is named, not compared; a mode change is shown as
/// git shows it.
fn compare(path: &str, status: char, old: &Side, new: &Side, patch: bool) -> Result<(FileStat, Option<Patch>)> {
    let too_big = old.size > MAX_DIFF_BYTES || new.size > MAX_DIFF_BYTES;
    let binary = too_big || !is_text(&old.data) || !is_text(&new.data);
    let (mut added, mut removed, mut text) = (0, 0, String::new());
    if binary {
        text = if too_big {
            format!("{path}: over {} MiB, not compared ({} -> {} bytes)\n", MAX_DIFF_BYTES >> 20, old.size, new.size)
        } else {
            format!("Binary files {path} differ ({} -> {} bytes)\n", old.size, new.size)
        };
    } else {
        let (o, n) = (std::str::from_utf8(&old.data)?, std::str::from_utf8(&new.data)?);
        let d = similar::TextDiff::from_lines(o, n);
        for c in d.iter_all_changes() {
            match c.tag() {
                similar::ChangeTag::Insert => added += 1,
                similar::ChangeTag::Delete => removed += 1,
                similar::ChangeTag::Equal => {}
            }
        }
        if patch {
            let (ha, hb) = (
                if old.present { format!("a/{path}") } else { "/dev/null".into() },
                if new.present { format!("b/{path}") } else { "/dev/null".into() },
            );
            text = d.unified_diff().context_radius(3).header(&ha, &hb).to_string();
        }
    }
    if let (true, Some(om), Some(nm)) = (patch, old.mode, new.mode) {
        if om != nm {
            text = format!("old mode {om}\nnew mode {nm}\n{text}");
        }
    }
    let stat = FileStat {
        path: path.to_string(),
        status,
        binary,
        lines_added: added,
        lines_removed: removed,
        old_size: old.size,
        new_size: new.size,
    };
    Ok((stat, patch.then(|| Patch { path: path.to_string(), text })))
}
