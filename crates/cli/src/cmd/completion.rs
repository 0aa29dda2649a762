//! `mado completion SHELL` and `mado man`: what a shell and `man` need,
//! generated from the same definitions as `--help`.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

use crate::ctx::Ctx;

/// Print a shell completion script on stdout.
///
/// Install it where your shell looks for completions, for example:
///
///   bash:       mado completion bash > ~/.local/share/bash-completion/completions/mado
///
///   zsh:        mado completion zsh > ~/.zfunc/_mado
///               (with `fpath+=~/.zfunc; autoload -Uz compinit; compinit` in ~/.zshrc)
///
///   fish:       mado completion fish > ~/.config/fish/completions/mado.fish
///
///   elvish:     mado completion elvish >> ~/.config/elvish/rc.elv
///
///   powershell: mado completion powershell >> $PROFILE
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct CompletionArgs {
    /// The shell to complete for.
    shell: Shell,
}

/// Print the manual page (roff) on stdout, or one page per command into a
/// directory.
///
/// Install it for your user, for example:
///
///   mkdir -p ~/.local/share/man/man1
///   mado man > ~/.local/share/man/man1/mado.1
///
/// or every command's page (`man mado-ws-create`):
///
///   mado man --dir ~/.local/share/man/man1
///
/// Read it without installing: `mado man | man -l -`.
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct ManArgs {
    /// Write mado.1 and a page per subcommand (mado-log.1, mado-ws-create.1,
    /// ...) into DIR instead of printing mado.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn completion(a: CompletionArgs) -> Result<()> {
    let mut cmd = crate::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "mado", &mut out);
    std::io::stdout().write_all(&out)?;
    Ok(())
}

pub fn man(a: ManArgs, ctx: &Ctx) -> Result<()> {
    let cmd = crate::Cli::command();
    match a.dir {
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            std::io::stdout().write_all(&out)?;
            Ok(())
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| mado_core::Error::User(format!("cannot create {}: {e}", dir.display())))?;
            clap_mangen::generate_to(cmd, &dir).with_context(|| format!("writing man pages into {}", dir.display()))?;
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "dir": dir }));
            }
            println!("wrote the man pages into {}", dir.display());
            Ok(())
        }
    }
}
