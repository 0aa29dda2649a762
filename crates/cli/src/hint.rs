//! The words of the next steps the core names as data ([`Next`]): the one
//! place that says which `mado` command to type. An error prints as its
//! message, then one `  hint: …` line per step.

use mado_core::error::Next;
use mado_core::Error;

/// One step, as the user types it.
pub fn words(n: &Next) -> String {
    match n {
        Next::Log { base } => format!("`mado log {base}` shows its history"),
        Next::ListRefs => "`mado refs` lists the refs, `mado log REF` a ref's snapshot ids".into(),
        Next::FullIdOffline => "a short snapshot id is looked up in the store; the full id (`mado log --json`, \
             `mado refs --json`) is read from the cache alone"
            .into(),
        Next::ImportGit => "import a repository into it with `mado import-git REPO`".into(),
        Next::Materialize => "run `mado materialize` first".into(),
        Next::CreateWorkspace => "create one with `mado ws create NAME --dir DIR` (or --mount DIR)".into(),
        Next::ListWorkspaces => "`mado ws list` lists the workspaces".into(),
        Next::ResumeExisting { name } => format!("`mado ws resume {name} DIR` gets a working copy of it"),
        Next::FinishResume { name, dir } => format!(
            "run it again (`mado ws resume {name} {dir}`: it removes the partial copy and finishes), \
             or `mado ws release --dir {dir}` to free the lease"
        ),
        Next::CheckpointOfWorkspace { name } => format!(
            "for an older checkpoint, `mado checkout ws/{name} DIR` writes it, \
             `mado ws create NEW --from ws/{name}` starts a workspace there"
        ),
        Next::ReleaseOnHolder { name } => format!("`mado ws release {name}` (or unmount) on the holder"),
        Next::Steal { expired: true } => "run again with --steal to take it (its checkpoints stay)".into(),
        Next::Steal { expired: false } => "--steal once it has expired".into(),
        Next::ReadOnlyCopy => "`mado ws resume --read-only` for a copy that will not checkpoint".into(),
        Next::ReleaseOrForceRemove { name } => {
            format!("`mado ws release` in it first (or unmount it), or `mado ws rm --force {name}`")
        }
        Next::StopServer => "stop that `mado serve-virtiofs` first (SIGTERM; two servers of one workspace \
             would overwrite each other's changes)"
            .into(),
        Next::UseOrUnmount { at } => format!(
            "work in that mount, or `mado umount {at}` first (two mounts of one workspace would overwrite \
             each other's changes)"
        ),
        Next::UnmountDead { at } => format!("`mado umount {at}` first (a workspace's saved changes stay)"),
        Next::SubtreeOrMount => "check out a subtree below it, or use `mado mount`, which has no such limit".into(),
        Next::ResumeOrForce => "resume it elsewhere to continue from there, or `mado ws checkpoint --force` \
             to replace it with this copy"
            .into(),
        Next::CheckpointAgain => "run `mado ws checkpoint` again to checkpoint on top of it".into(),
        Next::RecreateAt { name, from } => format!(
            "`mado ws create {name} --from {from} --no-checkout` makes it again at this copy's last \
             checkpoint; then checkpoint here again"
        ),
        Next::RecreateAndForce { name } => format!(
            "this copy's last checkpoint is gone from the store too (swept by `mado gc`); \
             `mado ws create {name} --from main --no-checkout` (or any snapshot), then \
             `mado ws checkpoint --force` here, make it again with this copy's files"
        ),
        Next::ListSetAside => "`mado ws recover` lists the folders of set-aside changes".into(),
        Next::RecoverAside { aside } => format!("`mado ws recover {aside}` makes them a workspace of their own"),
        Next::RecoverTo { aside } => format!("`mado ws recover {aside} --to DIR` writes the files they hold into DIR"),
        Next::ResumeMount { name } => {
            format!("a workspace's own saved changes come back with `mado ws resume {name} DIR --mount`")
        }
        Next::MountFirstOrIgnore { name } => format!(
            "mount it to see and checkpoint them (`mado ws resume {name} --mount DIR`, then `mado ws checkpoint` \
             in it), or resume anyway with --ignore-mount-changes (they stay saved: the next mount sets them \
             aside, and `mado ws recover` gets them back)"
        ),
        Next::WorkspaceFromRef => {
            "import into another ref and start a workspace from it (`mado ws create NAME --from REF`)".into()
        }
        Next::InitStore { url } => {
            format!("make it with `mado init --remote {url}` (or `mado import-git REPO`, which makes it)")
        }
        Next::RepackRecursive => "run `mado pack --recursive` to retry".into(),
    }
}

/// The hint lines of every mado error in `e`'s chain, each once.
pub fn lines(e: &anyhow::Error) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for m in e.chain().filter_map(|c| c.downcast_ref::<Error>()) {
        for w in m.next_steps().iter().map(words) {
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
    out
}

/// `message` with `  hint: …` lines for `steps`.
pub fn with_hints(message: &str, steps: &[Next]) -> String {
    with_lines(message, steps.iter().map(words))
}

/// `message` with a `  hint: …` line for each of `hints`, already worded.
pub fn with_lines(message: &str, hints: impl IntoIterator<Item = String>) -> String {
    let mut s = message.to_string();
    for h in hints {
        s.push_str("\n  hint: ");
        s.push_str(&h);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lease_says_how_to_get_it_and_steps_added_to_an_error_follow_its_own() {
        let held = Error::LeaseHeld { name: "w".into(), holder: "u@h:/d:1".into(), expires: 0, expired: true };
        let e = anyhow::Error::from(held.then(Next::ListWorkspaces));
        let l = lines(&e);
        assert_eq!(l.len(), 3, "{l:?}");
        assert!(l[0].contains("--steal") && l[1].contains("mado ws release w") && l[2].contains("ws list"), "{l:?}");
        let not_found = Error::NotFound("no workspace named w".into()).then(Next::ListWorkspaces);
        assert!(not_found.is_not_found() && not_found.is_user_error());
        assert_eq!(not_found.to_string(), "no workspace named w", "the message is the core's alone");
        assert_eq!(with_hints("m", &not_found.next_steps()), "m\n  hint: `mado ws list` lists the workspaces");
    }
}
