//! What a checkpoint of a plain working copy leaves out: every `.git`
//! (a working copy's own repository is not the workspace's content), and
//! untracked paths that a `.gitignore` or `.madoignore` on the way down
//! ignores (build outputs, `node_modules`, `target/`), with git's syntax
//! and precedence (a deeper file and a later line win; `!` re-includes).
//!
//! As in git, rules only apply to untracked paths: a path the caller says
//! is tracked (a working copy: its stat cache knows it, as it was in the
//! last snapshot written or checkpointed there) stays, ignored or not.
//! Where the caller cannot tell (a working copy that lost
//! `.mado/statcache.bin`), no rule applies but `.git`: nothing tracked is
//! ever dropped because local state went missing.
//! `--no-ignore` turns all of it off.
//!
//! Below vfs and workspace: both read rules here, and neither's notion of
//! "tracked" is known to it.

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::error::{Error, Result};

/// The rule files read in each directory, in increasing precedence.
pub(crate) const RULE_FILES: [&str; 2] = [".gitignore", ".madoignore"];

pub(crate) struct Ignores {
    on: bool,
    /// Rules apply (there is a stat cache to tell tracked paths).
    rules: bool,
}

/// The matchers of the directories from the root down to one being
/// walked, outermost first; shared by the directories below it that add
/// no rules of their own.
pub(crate) type Stack = std::sync::Arc<Vec<Gitignore>>;

impl Ignores {
    /// `on`: whether anything is left out; `can_tell`: whether the caller
    /// can tell tracked paths (rules apply only then).
    pub(crate) fn new(on: bool, can_tell: bool) -> Ignores {
        Ignores { on, rules: on && can_tell }
    }

    /// The rules in force inside directory `abs`, whose entries are
    /// `names`: `parent`'s, plus its own rule files if it lists any.
    pub(crate) fn enter(
        &self,
        abs: &Path,
        names: impl Iterator<Item = std::ffi::OsString>,
        parent: &Stack,
    ) -> Result<Stack> {
        if !self.rules {
            return Ok(parent.clone());
        }
        let listed: Vec<std::ffi::OsString> = names.filter(|n| RULE_FILES.iter().any(|f| n == f)).collect();
        if listed.is_empty() {
            return Ok(parent.clone());
        }
        let mut b = GitignoreBuilder::new(abs);
        let mut any = false;
        for f in RULE_FILES {
            let p = abs.join(f);
            if listed.iter().any(|n| n == f) && p.is_file() {
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
            return Ok(parent.clone());
        }
        let gi = b.build().map_err(|e| Error::User(format!("the ignore rules in {}: {e}", abs.display())))?;
        let mut stack = parent.as_ref().clone();
        stack.push(gi);
        Ok(std::sync::Arc::new(stack))
    }

    /// Whether the entry `name` at `path`, under the rules `stack`, is
    /// left out of the checkpoint; `tracked` says whether the path (a
    /// directory: anything below it) is tracked.
    pub(crate) fn skips(
        &self,
        stack: &[Gitignore],
        name: &[u8],
        path: &Path,
        is_dir: bool,
        tracked: impl FnOnce() -> bool,
    ) -> bool {
        if !self.on {
            return false;
        }
        name == b".git" || (self.rules && ignored(stack, path, is_dir) && !tracked())
    }
}

pub(crate) fn ignored(stack: &[Gitignore], path: &Path, is_dir: bool) -> bool {
    // The innermost directory with a say decides.
    for gi in stack.iter().rev() {
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

/// The matcher of rule files' contents (`(file name, text)`, in increasing
/// precedence) in directory `abs`; `None` when they hold no rule.
pub(crate) fn matcher_from_texts(abs: &Path, texts: &[(String, String)]) -> Result<Option<Gitignore>> {
    let mut b = GitignoreBuilder::new(abs);
    for (name, text) in texts {
        for line in text.lines() {
            b.add_line(None, line).map_err(|e| {
                Error::User(format!("{}/{name}: {e}; fix the rule, or checkpoint with --no-ignore", abs.display()))
            })?;
        }
    }
    let gi = b.build().map_err(|e| Error::User(format!("the ignore rules in {}: {e}", abs.display())))?;
    Ok((!gi.is_empty()).then_some(gi))
}
