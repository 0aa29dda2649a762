//! Phase 1 of an import: a commit's tree walked with gix, the
//! repository's conversions applied, every object staged (no network).

use std::collections::HashSet;
use std::path::Path;

use super::gitblob;
use crate::cache::DiskCache;
use crate::error::{Error, Result};
use crate::hash::{Hash, TreeId};
use crate::object::{check_name, Entry, Kind, Tree};
use crate::upload::Staged;

/// One commit, staged.
pub struct StagedRev {
    pub rev: String,
    pub commit: String,
    pub root: TreeId,
    pub time: i64,
    pub author: String,
    pub message: String,
}

fn git_err(what: impl std::fmt::Display) -> impl FnOnce(gix::Error) -> Error {
    move |e| Error::Git(format!("{what}: {e}"))
}

/// Phase 1 for each of `revs` into `staged` (blocking: call from a
/// blocking thread).
pub fn stage(
    repo_path: &Path,
    revs: &[String],
    cache: &DiskCache,
    staged: Staged,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(Staged, Vec<StagedRev>)> {
    crate::fsutil::on_deep_stack(|| stage_here(repo_path, revs, cache, staged, progress))
}

fn stage_here(
    repo_path: &Path,
    revs: &[String],
    cache: &DiskCache,
    mut staged: Staged,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(Staged, Vec<StagedRev>)> {
    let repo = gix::open(repo_path)
        .map_err(|e| Error::User(format!("{} is not a git repository I can open: {e}", repo_path.display())))?;
    if repo.git_dir_trust() != gix::sec::Trust::Full {
        // As git does ("dubious ownership"): a repository another user owns
        // is read only when the user said so. (Read with reduced trust, its
        // config is not applied and large blobs are refused half-way.)
        return Err(Error::User(format!(
            "{} is owned by another user, and git would refuse it too (\"dubious ownership\"); \
             if you trust it, allow it with `git config --global --add safe.directory {}` and import again",
            repo_path.display(),
            repo.workdir().unwrap_or(repo.git_dir()).display()
        )));
    }
    let mut out = Vec::new();
    for rev in revs {
        let id = repo
            .rev_parse_single(rev.as_str())
            .map_err(|e| Error::User(format!("cannot resolve revision {rev:?} in {}: {e}", repo_path.display())))?;
        let commit = id
            .object()
            .map_err(git_err(format!("reading {rev}")))?
            .peel_to_commit()
            .map_err(|e| Error::User(format!("revision {rev:?} is not a commit: {e}")))?;
        let tree_id = commit.tree_id().map_err(git_err(format!("tree of {rev}")))?.detach();
        let author = commit.author().map_err(git_err(format!("author of {rev}")))?;
        let author_s = format!("{} <{}>", author.name, author.email);
        let time = commit.time().map(|t| t.seconds).unwrap_or(0);
        let message = commit.message_raw_sloppy().to_string();
        let mut walker = Walker { repo: &repo, cache, staged: &mut staged, pipeline: None, progress };
        // Refuse hostile names before gix builds an index from the tree,
        // so the error names the path rather than an index failure.
        walker.walk(tree_id, "", true)?;
        walker.pipeline = Some(pipeline_for(&repo, tree_id)?);
        let root = TreeId::from_hash(walker.walk(tree_id, "", false)?);
        out.push(StagedRev { rev: rev.clone(), commit: commit.id.to_string(), root, time, author: author_s, message });
    }
    staged.finish()?;
    Ok((staged, out))
}

/// A filter pipeline whose `.gitattributes` come from `tree` itself.
fn pipeline_for(repo: &gix::Repository, tree: gix::ObjectId) -> Result<gix::filter::Pipeline<'_>> {
    let index = repo.index_from_tree(&tree).map_err(git_err("reading .gitattributes"))?;
    let stack = repo
        .attributes_only(&index, gix::worktree::stack::state::attributes::Source::IdMapping)
        .map_err(git_err("reading .gitattributes"))?
        .detach();
    gix::filter::Pipeline::new(repo, stack).map_err(git_err("setting up git filters"))
}

struct Walker<'a, 'r> {
    repo: &'r gix::Repository,
    cache: &'a DiskCache,
    staged: &'a mut Staged,
    pipeline: Option<gix::filter::Pipeline<'r>>,
    progress: &'a (dyn Fn(u64, u64) + Sync),
}

fn join(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if dir.is_empty() {
        name.into_owned()
    } else {
        format!("{dir}/{name}")
    }
}

impl Walker<'_, '_> {
    /// Stages the git tree `id` at `path`; returns the mado tree id. With
    /// `check_only`, validates names and reads no blobs.
    fn walk(&mut self, id: gix::ObjectId, path: &str, check_only: bool) -> Result<Hash> {
        if check_only && !path.is_empty() && path.matches('/').count() + 1 > crate::fsutil::MAX_TREE_DEPTH {
            return Err(Error::UnsafePath {
                path: crate::fsutil::show_path(path.as_bytes()),
                reason: format!(
                    "the tree is more than {} levels deep (git's core.maxTreeDepth)",
                    crate::fsutil::MAX_TREE_DEPTH
                ),
            });
        }
        let tree = self.repo.find_tree(id).map_err(git_err(format!("reading tree {path:?}")))?;
        let decoded = tree.decode().map_err(|e| Error::Git(format!("decoding tree {path:?}: {e}")))?;
        let mut entries = Vec::with_capacity(decoded.entries.len());

        for e in &decoded.entries {
            let name: &[u8] = e.filename.as_ref();
            let p = join(path, name);
            check_name(name).map_err(|reason| Error::UnsafePath { path: p.clone(), reason })?;
            if name.eq_ignore_ascii_case(b".git") {
                return Err(Error::UnsafePath { path: p, reason: "git refuses to check out a .git entry".into() });
            }
            let oid = e.oid.to_owned();
            let entry = match e.mode.kind() {
                gix::object::tree::EntryKind::Tree => {
                    let sub = self.walk(oid, &p, check_only)?;
                    Entry { name: name.to_vec(), kind: Kind::Directory, chunked: false, size: 0, id: sub }
                }
                gix::object::tree::EntryKind::Commit => {
                    let mut id = [0u8; 32];
                    let raw = oid.as_bytes();
                    id[..raw.len().min(32)].copy_from_slice(&raw[..raw.len().min(32)]);
                    Entry { name: name.to_vec(), kind: Kind::Gitlink, chunked: false, size: 0, id: Hash(id) }
                }
                _ if check_only => continue,
                kind => {
                    if kind != gix::object::tree::EntryKind::Link {
                        if let Some((id, chunked, size)) = self.stream_large(oid, &p)? {
                            let k = if kind == gix::object::tree::EntryKind::BlobExecutable {
                                Kind::Executable
                            } else {
                                Kind::File
                            };
                            entries.push(Entry { name: name.to_vec(), kind: k, chunked, size, id });
                            continue;
                        }
                    }
                    let blob = self.repo.find_blob(oid).map_err(git_err(format!("reading blob {p:?}")))?;
                    let (k, data): (Kind, std::borrow::Cow<'_, [u8]>) = match kind {
                        gix::object::tree::EntryKind::Link => (Kind::Symlink, blob.data.as_slice().into()),
                        k => {
                            let k = if k == gix::object::tree::EntryKind::BlobExecutable {
                                Kind::Executable
                            } else {
                                Kind::File
                            };
                            match self.convert(&blob.data, &p)? {
                                Some(converted) => (k, converted.into()),
                                None => (k, blob.data.as_slice().into()),
                            }
                        }
                    };
                    (self.progress)(self.staged.files + 1, self.staged.bytes + data.len() as u64);
                    let (id, chunked) = self.store_content(&data)?;
                    Entry { name: name.to_vec(), kind: k, chunked, size: data.len() as u64, id }
                }
            };

            entries.push(entry);
        }
        if check_only {
            // Duplicate names (e.g. "a" as a symlink and as a directory).
            let mut seen = HashSet::new();
            for e in &decoded.entries {
                let n: &[u8] = e.filename.as_ref();
                if !seen.insert(n) {
                    return Err(Error::UnsafePath {
                        path: join(path, n),
                        reason: "the name appears twice in one tree".into(),
                    });
                }
            }
            return Ok(Hash([0; 32]));
        }
        let tree = Tree::normalized(entries)
            .map_err(|e| Error::UnsafePath { path: path.to_string(), reason: e.to_string() })?;

        self.staged.tree(self.cache, &tree)
    }

    /// A blob larger than a chunk, stored as git stores big files and with
    /// no filter that would change it at this path, is chunked as it is
    /// inflated: memory stays at a chunk. `None`: read it whole instead.
    fn stream_large(&mut self, oid: gix::ObjectId, path: &str) -> Result<Option<(Hash, bool, u64)>> {
        let size = self.repo.find_header(oid).map_err(git_err(format!("reading blob {path:?}")))?.size();
        if !crate::chunk::needs_chunking(size) || self.converts(path)? {
            return Ok(None);
        }
        let objects = self.repo.common_dir().join("objects");
        let scratch = self.cache.build_dir()?;
        let Some(stream) =
            gitblob::open(&objects, &oid, size, &scratch).map_err(Error::io(format!("reading blob {path:?}")))?
        else {
            return Ok(None);
        };
        (self.progress)(self.staged.files + 1, self.staged.bytes + size);
        self.staged.content_from(self.cache, stream, &format!("blob {oid} at {path:?}")).map(Some)
    }

    /// Whether the `.gitattributes` filters (eol, ident, a filter driver,
    /// an encoding) would change some content at `path`: a probe that each
    /// of them rewrites goes through the pipeline.
    fn converts(&mut self, path: &str) -> Result<bool> {
        use gix::filter::plumbing::pipeline::convert::ToWorktreeOutcome;
        let pipeline = self.pipeline.as_mut().expect("pipeline is set before content is read");
        let out = pipeline
            .convert_to_worktree(b"mado\nprobe\r\n$Id$\n", path.into(), Default::default())
            .map_err(|e| Error::Git(format!("applying .gitattributes filters to {path:?}: {e}")))?;
        Ok(!matches!(out, ToWorktreeOutcome::Unchanged(_)))
    }

    /// What `git clone` writes for this blob at this path (`None`: the
    /// blob as it is).
    fn convert(&mut self, data: &[u8], path: &str) -> Result<Option<Vec<u8>>> {
        use gix::filter::plumbing::pipeline::convert::ToWorktreeOutcome;
        use std::io::Read;
        let pipeline = self.pipeline.as_mut().expect("pipeline is set before content is read");
        let out = pipeline
            .convert_to_worktree(data, path.into(), Default::default())
            .map_err(|e| Error::Git(format!("applying .gitattributes filters to {path:?}: {e}")))?;
        Ok(Some(match out {
            ToWorktreeOutcome::Unchanged(_) => return Ok(None),
            ToWorktreeOutcome::Buffer(b) => b.to_vec(),
            ToWorktreeOutcome::Process(gix::filter::plumbing::driver::apply::MaybeDelayed::Immediate(mut r)) => {
                let mut v = Vec::new();
                r.read_to_end(&mut v).map_err(Error::io(format!("running the git filter for {path:?}")))?;
                v
            }
            ToWorktreeOutcome::Process(_) => {
                return Err(Error::Git(format!("{path:?}: delayed git filter drivers are not supported")))
            }
        }))
    }

    fn store_content(&mut self, data: &[u8]) -> Result<(Hash, bool)> {
        self.staged.content(self.cache, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::gitblob::tests::git;

    /// A file's attributes are looked up by its path in the tree: a rule
    /// for `sub/*.txt` converts sub/a.txt, as `git clone` would, and not a
    /// file of the same name elsewhere.
    #[test]
    fn attributes_apply_by_the_path_in_the_tree() {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        std::fs::create_dir_all(repo.join("sub")).unwrap();
        git(&repo, &["init", "-q"]);
        std::fs::write(repo.join(".gitattributes"), "sub/*.txt text eol=crlf\n").unwrap();
        std::fs::write(repo.join("sub/a.txt"), "in sub\n").unwrap();
        std::fs::write(repo.join("a.txt"), "at the top\n").unwrap();
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-qm", "x"]);
        let cache = DiskCache::open(t.path().join("cache"), None).unwrap();
        let (_, revs) = stage(&repo, &["HEAD".to_string()], &cache, Staged::default(), &|_, _| {}).unwrap();
        assert_eq!(revs.len(), 1);
        assert!(cache.contains(&Hash::of(b"in sub\r\n")), "sub/a.txt was not converted");
        assert!(!cache.contains(&Hash::of(b"in sub\n")));
        assert!(cache.contains(&Hash::of(b"at the top\n")), "a.txt was converted");
    }
}
