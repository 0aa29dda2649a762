//! What a checkpoint of a plain working copy leaves out: every `.git`
//! (a working copy's own repository is not the workspace's content), and
//! untracked paths that a `.gitignore` or `.madoignore` on the way down
//! ignores (build outputs, `node_modules`, `target/`), with git's syntax
//! and precedence (a deeper file and a later line win; `!` re-includes).
//!
//! As in git, rules only apply to untracked paths: a path the working
//! copy's stat cache knows (it was in the last snapshot written or
//! checkpointed here) stays, ignored or not. Without a stat cache (a lost
//! `.mado/statcache.json`), no rule applies but `.git`: nothing tracked is
//! ever dropped because local state went missing.
//! `--no-ignore` turns all of it off.

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::working_copy::StatCache;
use crate::error::{Error, Result};

/// The rule files read in each directory, in increasing precedence.
const RULE_FILES: [&str; 2] = [".gitignore", ".madoignore"];

pub(super) struct Ignores {
    on: bool,
    /// Rules apply (there is a stat cache to tell tracked paths).
    rules: bool,
    /// The matchers of the directories being walked, outermost first.
    stack: Vec<Gitignore>,
    /// Paths left out (files and whole directories).
    pub(super) skipped: u64,
}

impl Ignores {
    pub(super) fn new(on: bool, sc: &StatCache) -> Ignores {
        Ignores { on, rules: on && !sc.rows.is_empty(), stack: Vec::new(), skipped: 0 }
    }

    /// Reads the rule files of directory `abs`; true when it had any (the
    /// caller pops them with [`Ignores::leave`] after the directory).
    pub(super) fn enter(&mut self, abs: &Path) -> Result<bool> {
        if !self.rules {
            return Ok(false);
        }
        let mut b = GitignoreBuilder::new(abs);
        let mut any = false;
        for f in RULE_FILES {
            let p = abs.join(f);
            if p.is_file() {
                if let Some(e) = b.add(&p) {
                    return Err(Error::User(format!(
                        "{}: {e}; fix the rule, or checkpoint with --no-ignore",
                        p.display()
                    )));
                }
                any = true;
            }
        }
        if !any {
            return Ok(false);
        }
        let gi = b.build().map_err(|e| Error::User(format!("the ignore rules in {}: {e}", abs.display())))?;
        self.stack.push(gi);
        Ok(true)
    }

    pub(super) fn leave(&mut self) {
        self.stack.pop();
    }

    /// Whether the entry `name` at `path` (`key`: its stat cache key) is
    /// left out of the checkpoint.
    pub(super) fn skips(&mut self, name: &[u8], path: &Path, is_dir: bool, key: &str, sc: &StatCache) -> bool {
        if !self.on {
            return false;
        }
        let skip = name == b".git" || (self.rules && self.ignored(path, is_dir) && !tracked(sc, key, is_dir));
        self.skipped += skip as u64;
        skip
    }

    fn ignored(&self, path: &Path, is_dir: bool) -> bool {
        // The innermost directory with a say decides.
        for gi in self.stack.iter().rev() {
            let m = gi.matched(path, is_dir);
            if m.is_ignore() {
                return true;
            }
            if m.is_whitelist() {
                return false;
            }
        }
        false
    }
}

/// Whether the stat cache knows `key`, or (a directory) anything below it.
fn tracked(sc: &StatCache, key: &str, is_dir: bool) -> bool {
    if sc.rows.contains_key(key) {
        return true;
    }
    if !is_dir {
        return false;
    }
    let prefix = format!("{key}/");
    sc.rows.range(prefix.clone()..).next().is_some_and(|(k, _)| k.starts_with(&prefix))
}
