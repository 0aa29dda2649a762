//! Phase 1 of an import: a commit's tree walked with gix, the
//! repository's conversions applied, every object staged (no network).
//!
//! The names are checked first, on one thread, so an error names the first
//! bad path in tree order. Then the tree is cut into subtrees near its top
//! ([`split_points`]) that the cores stage at once, each thread with its own
//! gix handle and filter pipeline: reading, inflating, converting and
//! hashing run outside the one lock, which only guards what is staged. The
//! trees above the cut are staged last, on one thread, from the subtrees'
//! ids. A tree id does not depend on which thread staged what.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

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

/// Subtrees a staging thread is given, at least, where the tree has them:
/// a big subtree then keeps one thread busy while the others take the rest.
const SUBTREES_PER_THREAD: usize = 16;

/// How far below the root the cut into subtrees goes at most.
const MAX_SPLIT_DEPTH: usize = 4;

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
    let threads = crate::fsutil::cpu_threads();
    crate::fsutil::on_deep_stack(|| stage_here(repo_path, revs, cache, staged, progress, threads))
}

fn stage_here(
    repo_path: &Path,
    revs: &[String],
    cache: &DiskCache,
    staged: Staged,
    progress: &(dyn Fn(u64, u64) + Sync),
    threads: usize,
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
    let shared = Shared { cache, staged: Mutex::new(staged), progress };
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
        // Refuse hostile names before anything is staged, so the error
        // names the path (the first in tree order) rather than a failure
        // further on.
        let mut attributes = Vec::new();
        check(&repo, tree_id, "", &mut attributes)?;
        let index = attributes_index(&repo, &attributes);
        let cut = split_points(&repo, tree_id, threads * SUBTREES_PER_THREAD)?;
        let done = stage_subtrees(&repo, &index, &cut, &shared, threads)?;
        let mut walker = Walker::new(&repo, &index, &shared, &done)?;
        let root = TreeId::from_hash(walker.walk(tree_id, "")?);
        out.push(StagedRev { rev: rev.clone(), commit: commit.id.to_string(), root, time, author: author_s, message });
    }
    let mut staged = shared.staged.into_inner().map_err(|_| poisoned())?;
    staged.finish()?;
    Ok((staged, out))
}

fn poisoned() -> Error {
    Error::Internal("a staging thread panicked".into())
}

/// What the staging threads share: the staged objects behind one lock.
struct Shared<'a> {
    cache: &'a DiskCache,
    staged: Mutex<Staged>,
    progress: &'a (dyn Fn(u64, u64) + Sync),
}

impl Shared<'_> {
    fn lock(&self) -> Result<MutexGuard<'_, Staged>> {
        self.staged.lock().map_err(|_| poisoned())
    }
}

fn join(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if dir.is_empty() {
        name.into_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// Checks every name and the depth of git tree `id` at `path`, reading no
/// blob, and notes each `.gitattributes` file (its path and blob).
fn check(
    repo: &gix::Repository,
    id: gix::ObjectId,
    path: &str,
    attributes: &mut Vec<(String, gix::ObjectId)>,
) -> Result<()> {
    if !path.is_empty() && path.matches('/').count() + 1 > crate::fsutil::MAX_TREE_DEPTH {
        return Err(Error::UnsafePath {
            path: crate::fsutil::show_path(path.as_bytes()),
            reason: format!(
                "the tree is more than {} levels deep (git's core.maxTreeDepth)",
                crate::fsutil::MAX_TREE_DEPTH
            ),
        });
    }
    let tree = repo.find_tree(id).map_err(git_err(format!("reading tree {path:?}")))?;
    let decoded = tree.decode().map_err(|e| Error::Git(format!("decoding tree {path:?}: {e}")))?;
    for e in &decoded.entries {
        let name: &[u8] = e.filename.as_ref();
        // The path is made only where it is used: not for each of a
        // million files.
        let p = || join(path, name);
        check_name(name).map_err(|reason| Error::UnsafePath { path: p(), reason })?;
        if name.eq_ignore_ascii_case(b".git") {
            return Err(Error::UnsafePath { path: p(), reason: "git refuses to check out a .git entry".into() });
        }
        match e.mode.kind() {
            gix::object::tree::EntryKind::Tree => check(repo, e.oid.to_owned(), &p(), attributes)?,
            gix::object::tree::EntryKind::Blob | gix::object::tree::EntryKind::BlobExecutable
                if name == b".gitattributes" =>
            {
                attributes.push((p(), e.oid.to_owned()))
            }
            _ => {}
        }
    }
    // Duplicate names (e.g. "a" as a symlink and as a directory).
    let mut seen = HashSet::new();
    for e in &decoded.entries {
        let n: &[u8] = e.filename.as_ref();
        if !seen.insert(n) {
            return Err(Error::UnsafePath { path: join(path, n), reason: "the name appears twice in one tree".into() });
        }
    }
    Ok(())
}

/// An index of the tree's `.gitattributes` files alone: all that the
/// attribute lookups read from it (an index of the whole tree, as
/// `index_from_tree` builds, holds an entry per file).
fn attributes_index(repo: &gix::Repository, files: &[(String, gix::ObjectId)]) -> gix::index::State {
    let mut index = gix::index::State::new(repo.object_hash());
    for (path, id) in files {
        index.dangerously_push_entry(
            Default::default(),
            *id,
            gix::index::entry::Flags::empty(),
            gix::index::entry::Mode::FILE,
            path.as_str().into(),
        );
    }
    index.sort_entries();
    index
}

/// Where the walk is cut for the staging threads: subtrees (git id, path)
/// that together hold every file but those of the trees above them, at
/// least `want` of them where the top of the tree has that many
/// directories. A tree without subdirectories stays whole.
fn split_points(repo: &gix::Repository, root: gix::ObjectId, want: usize) -> Result<Vec<(gix::ObjectId, String)>> {
    let mut level = vec![(root, String::new())];
    for _ in 0..MAX_SPLIT_DEPTH {
        if level.len() >= want {
            break;
        }
        let mut next = Vec::new();
        let mut deeper = false;
        for (id, path) in level {
            let tree = repo.find_tree(id).map_err(git_err(format!("reading tree {path:?}")))?;
            let decoded = tree.decode().map_err(|e| Error::Git(format!("decoding tree {path:?}: {e}")))?;
            let subtrees: Vec<_> = decoded
                .entries
                .iter()
                .filter(|e| e.mode.kind() == gix::object::tree::EntryKind::Tree)
                .map(|e| (e.oid.to_owned(), join(&path, e.filename.as_ref())))
                .collect();
            if subtrees.is_empty() {
                next.push((id, path));
            } else {
                deeper = true;
                next.extend(subtrees);
            }
        }
        level = next;
        if !deeper {
            break;
        }
    }
    Ok(level)
}

/// Stages the subtrees `cut` on up to `threads` threads at once; returns
/// each one's mado tree id by its path. The first error stops them all.
fn stage_subtrees(
    repo: &gix::Repository,
    index: &gix::index::State,
    cut: &[(gix::ObjectId, String)],
    shared: &Shared<'_>,
    threads: usize,
) -> Result<HashMap<String, Hash>> {
    let threads = threads.min(cut.len());
    let sync = repo.clone().into_sync();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let work = || -> Result<Vec<(usize, Hash)>> {
        let repo = sync.to_thread_local();
        let none = HashMap::new();
        let mut w = Walker::new(&repo, index, shared, &none)?;
        let mut out = Vec::new();
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((id, path)) = cut.get(i) else { break };
            match w.walk(*id, path) {
                Ok(h) => out.push((i, h)),
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(out)
    };
    // One thread: the walk runs here (no thread to start).
    let results: Vec<Result<Vec<(usize, Hash)>>> = if threads <= 1 {
        vec![work()]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    // As deep a stack as the walk on one thread has.
                    std::thread::Builder::new()
                        .name(format!("mado-stage-{i}"))
                        .stack_size(1 << 30)
                        .spawn_scoped(s, work)
                        .map_err(Error::io("starting a staging thread"))
                })
                .collect();
            handles.into_iter().map(|h| h?.join().map_err(|_| poisoned())?).collect()
        })
    };
    let mut done = HashMap::with_capacity(cut.len());
    for r in results {
        for (i, h) in r? {
            done.insert(cut[i].1.clone(), h);
        }
    }
    Ok(done)
}

/// A filter pipeline whose `.gitattributes` come from the tree itself.
fn pipeline_for<'r>(repo: &'r gix::Repository, index: &gix::index::State) -> Result<gix::filter::Pipeline<'r>> {
    let stack = repo
        .attributes_only(index, gix::worktree::stack::state::attributes::Source::IdMapping)
        .map_err(git_err("reading .gitattributes"))?
        .detach();
    gix::filter::Pipeline::new(repo, stack).map_err(git_err("setting up git filters"))
}

/// One thread's walk: its gix handle and filter pipeline.
struct Walker<'a, 'r> {
    repo: &'r gix::Repository,
    shared: &'a Shared<'a>,
    pipeline: gix::filter::Pipeline<'r>,
    /// Subtrees already staged (by another walk), by path.
    done: &'a HashMap<String, Hash>,
}

impl<'a, 'r> Walker<'a, 'r> {
    fn new(
        repo: &'r gix::Repository,
        index: &gix::index::State,
        shared: &'a Shared<'a>,
        done: &'a HashMap<String, Hash>,
    ) -> Result<Self> {
        Ok(Walker { repo, shared, pipeline: pipeline_for(repo, index)?, done })
    }

    /// Stages the git tree `id` at `path` (names already checked); returns
    /// the mado tree id.
    fn walk(&mut self, id: gix::ObjectId, path: &str) -> Result<Hash> {
        let tree = self.repo.find_tree(id).map_err(git_err(format!("reading tree {path:?}")))?;
        let decoded = tree.decode().map_err(|e| Error::Git(format!("decoding tree {path:?}: {e}")))?;
        let mut entries = Vec::with_capacity(decoded.entries.len());
        for e in &decoded.entries {
            let name: &[u8] = e.filename.as_ref();
            let p = join(path, name);
            let oid = e.oid.to_owned();
            let entry = match e.mode.kind() {
                gix::object::tree::EntryKind::Tree => {
                    let sub = match self.done.get(&p) {
                        Some(h) => *h,
                        None => self.walk(oid, &p)?,
                    };
                    Entry { name: name.to_vec(), kind: Kind::Directory, chunked: false, size: 0, id: sub }
                }
                gix::object::tree::EntryKind::Commit => {
                    let mut id = [0u8; 32];
                    let raw = oid.as_bytes();
                    id[..raw.len().min(32)].copy_from_slice(&raw[..raw.len().min(32)]);
                    Entry { name: name.to_vec(), kind: Kind::Gitlink, chunked: false, size: 0, id: Hash(id) }
                }
                gix::object::tree::EntryKind::Link => self.blob(oid, Kind::Symlink, name, &p)?,
                gix::object::tree::EntryKind::BlobExecutable => self.blob(oid, Kind::Executable, name, &p)?,
                gix::object::tree::EntryKind::Blob => self.blob(oid, Kind::File, name, &p)?,
            };
            entries.push(entry);
        }
        let tree = Tree::normalized(entries)
            .map_err(|e| Error::UnsafePath { path: path.to_string(), reason: e.to_string() })?;
        let enc = tree.encode();
        let id = Hash::of(&enc);
        self.shared.lock()?.tree_encoded(self.shared.cache, &tree, enc, id)
    }

    /// Stages the blob `oid` at `path` as a file of kind `kind`.
    fn blob(&mut self, oid: gix::ObjectId, kind: Kind, name: &[u8], path: &str) -> Result<Entry> {
        if kind != Kind::Symlink {
            if let Some((id, chunked, size)) = self.stream_large(oid, path)? {
                return Ok(Entry { name: name.to_vec(), kind, chunked, size, id });
            }
        }
        let blob = self.repo.find_blob(oid).map_err(git_err(format!("reading blob {path:?}")))?;
        let converted = match kind {
            Kind::Symlink => None,
            _ => self.convert(&blob.data, path)?,
        };
        let data = converted.as_deref().unwrap_or(&blob.data);
        // Hashed (and split) outside the lock.
        let split = crate::chunk::split(data);
        let (id, chunked) = {
            let mut staged = self.shared.lock()?;
            (self.shared.progress)(staged.files + 1, staged.bytes + data.len() as u64);
            staged.content_split_of(self.shared.cache, data, split)?
        };
        Ok(Entry { name: name.to_vec(), kind, chunked, size: data.len() as u64, id })
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
        let cache = self.shared.cache;
        let scratch = cache.build_dir()?;
        let Some(stream) =
            gitblob::open(&objects, &oid, size, &scratch).map_err(Error::io(format!("reading blob {path:?}")))?
        else {
            return Ok(None);
        };
        // Read, chunked and written to the cache outside the lock.
        let streamed =
            crate::chunk::split_stream(stream, &format!("blob {oid} at {path:?}"), |id, piece| cache.put(id, piece))?;
        let mut staged = self.shared.lock()?;
        (self.shared.progress)(staged.files + 1, staged.bytes + size);
        staged.streamed(cache, streamed, None).map(Some)
    }

    /// Whether the `.gitattributes` filters (eol, ident, a filter driver,
    /// an encoding) would change some content at `path`: a probe that each
    /// of them rewrites goes through the pipeline.
    fn converts(&mut self, path: &str) -> Result<bool> {
        use gix::filter::plumbing::pipeline::convert::ToWorktreeOutcome;
        let out = self
            .pipeline
            .convert_to_worktree(b"mado\nprobe\r\n$Id$\n", path.into(), Default::default())
            .map_err(|e| Error::Git(format!("applying .gitattributes filters to {path:?}: {e}")))?;
        Ok(!matches!(out, ToWorktreeOutcome::Unchanged(_)))
    }

    /// What `git clone` writes for this blob at this path (`None`: the
    /// blob as it is).
    fn convert(&mut self, data: &[u8], path: &str) -> Result<Option<Vec<u8>>> {
        use gix::filter::plumbing::pipeline::convert::ToWorktreeOutcome;
        use std::io::Read;
        let out = self
            .pipeline
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

    /// A tree of every shape the cut meets: files at the top, a directory
    /// without subdirectories, a deep chain, the same subtree at two paths
    /// (converted at one of them only), an executable and a symlink.
    fn shaped_repo(repo: &Path) {
        std::fs::create_dir_all(repo.join("flat")).unwrap();
        for i in 0..40 {
            std::fs::write(repo.join(format!("flat/f{i}.txt")), format!("flat {i}\n")).unwrap();
        }
        let deep = repo.join("deep/a/b/c/d/e/f");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("leaf.txt"), "leaf\n").unwrap();
        std::fs::write(repo.join("deep/a/b/mid.txt"), "mid\n").unwrap();
        for top in ["one", "two"] {
            std::fs::create_dir_all(repo.join(top).join("same")).unwrap();
            std::fs::write(repo.join(top).join("same/x.txt"), "same\n").unwrap();
        }
        std::fs::write(repo.join(".gitattributes"), "two/same/*.txt text eol=crlf\n").unwrap();
        std::fs::write(repo.join("README"), "top\n").unwrap();
        std::fs::write(repo.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("README", repo.join("link")).unwrap();
        git(repo, &["init", "-q"]);
        git(repo, &["update-index", "--add", "--chmod=+x", "run.sh"]);
        git(repo, &["add", "."]);
        git(repo, &["update-index", "--chmod=+x", "run.sh"]);
        git(repo, &["commit", "-qm", "x"]);
    }

    /// [`shaped_repo`] in `dir`, opened, and its HEAD's tree.
    fn shaped_tree(dir: &Path) -> (gix::Repository, gix::ObjectId) {
        let repo = dir.join("repo");
        shaped_repo(&repo);
        let r = gix::open(&repo).unwrap();
        let root = r.head_commit().unwrap().tree_id().unwrap().detach();
        (r, root)
    }

    fn staged_root(repo: &Path, cache_dir: &Path, threads: usize) -> Result<TreeId> {
        let cache = DiskCache::open(cache_dir.to_path_buf(), None).unwrap();
        let revs = ["HEAD".to_string()];
        let (_, out) = stage_here(repo, &revs, &cache, Staged::default(), &|_, _| {}, threads)?;
        Ok(out[0].root)
    }

    /// Staged on several threads, a tree has the id it has on one, every
    /// file converted by its own path.
    #[test]
    fn threads_stage_the_tree_one_thread_stages() {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        shaped_repo(&repo);
        let one = staged_root(&repo, &t.path().join("c1"), 1).unwrap();
        for threads in [2, 3, 8] {
            let cache_dir = t.path().join(format!("c{threads}"));
            assert_eq!(staged_root(&repo, &cache_dir, threads).unwrap(), one, "{threads} threads");
            let cache = DiskCache::open(cache_dir, None).unwrap();
            assert!(cache.contains(&Hash::of(b"same\r\n")), "two/same/x.txt was not converted");
            assert!(cache.contains(&Hash::of(b"same\n")), "one/same/x.txt was converted");
            assert!(cache.contains(&Hash::of(b"leaf\n")));
        }
    }

    /// The cut goes down to the wanted number of subtrees, keeps a
    /// directory without subdirectories whole, and never puts one cut
    /// subtree inside another.
    #[test]
    fn the_cut_covers_the_tree_once() {
        let t = tempfile::tempdir().unwrap();
        let (r, root) = shaped_tree(t.path());
        let paths = |want| -> Vec<String> {
            let mut p: Vec<String> = split_points(&r, root, want).unwrap().into_iter().map(|(_, p)| p).collect();
            p.sort();
            p
        };
        assert_eq!(paths(1), vec![""], "one is had at the root");
        assert_eq!(paths(4), vec!["deep", "flat", "one", "two"]);
        // Short of the wanted number, the cut goes on down, as deep as it
        // is let (a chain of single directories does not add subtrees).
        assert_eq!(paths(5), vec!["deep/a/b/c", "flat", "one/same", "two/same"]);
        assert_eq!(MAX_SPLIT_DEPTH, 4);
    }

    /// The threads give each cut subtree the id one walk gives it.
    #[test]
    fn each_cut_subtree_is_staged_by_the_threads() {
        let t = tempfile::tempdir().unwrap();
        let (r, root) = shaped_tree(t.path());
        let cache = DiskCache::open(t.path().join("c"), None).unwrap();
        let shared = Shared { cache: &cache, staged: Mutex::new(Staged::default()), progress: &|_, _| {} };
        let index = attributes_index(&r, &[]);
        let cut = split_points(&r, root, 5).unwrap();
        let done = stage_subtrees(&r, &index, &cut, &shared, 2).unwrap();
        assert_eq!(done.len(), cut.len());
        let none = HashMap::new();
        let mut one = Walker::new(&r, &index, &shared, &none).unwrap();
        for (id, path) in &cut {
            assert_eq!(done.get(path), Some(&one.walk(*id, path).unwrap()), "{path}");
        }
    }

    /// A blob missing from the repository fails the import on whichever
    /// thread reads it, naming its path.
    #[test]
    fn a_missing_blob_is_named_from_any_thread() {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        shaped_repo(&repo);
        let id = String::from_utf8(
            std::process::Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["rev-parse", "HEAD:deep/a/b/mid.txt"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let id = id.trim();
        std::fs::remove_file(repo.join(".git/objects").join(&id[..2]).join(&id[2..])).unwrap();
        for threads in [1, 2] {
            let e = staged_root(&repo, &t.path().join(format!("c{threads}")), threads).unwrap_err().to_string();
            assert!(e.contains("deep/a/b/mid.txt"), "{threads} threads: {e}");
        }
    }
}
