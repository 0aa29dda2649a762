//! One file per command: an `XxxArgs` struct whose doc comments are the
//! help, and a `run` function.

mod cache;
mod cat;
mod checkout;
mod gc;
mod import_git;
mod init;
mod log;
mod ls;
mod materialize;
mod pack;

use anyhow::Result;
use clap::Subcommand;

use crate::ctx::Ctx;

#[derive(Subcommand)]
pub enum Command {
    Init(init::InitArgs),
    #[command(name = "import-git")]
    ImportGit(import_git::ImportGitArgs),
    Log(log::LogArgs),
    Ls(ls::LsArgs),
    Cat(cat::CatArgs),
    Checkout(checkout::CheckoutArgs),
    Pack(pack::PackArgs),
    Materialize(materialize::MaterializeArgs),
    Gc(gc::GcArgs),
    #[command(subcommand)]
    Cache(cache::CacheCommand),
}

pub async fn run(cmd: Command, ctx: &Ctx) -> Result<()> {
    match cmd {
        Command::Init(a) => init::run(a, ctx).await,
        Command::ImportGit(a) => import_git::run(a, ctx).await,
        Command::Log(a) => log::run(a, ctx).await,
        Command::Ls(a) => ls::run(a, ctx).await,
        Command::Cat(a) => cat::run(a, ctx).await,
        Command::Checkout(a) => checkout::run(a, ctx).await,
        Command::Pack(a) => pack::run(a, ctx).await,
        Command::Materialize(a) => materialize::run(a, ctx).await,
        Command::Gc(a) => gc::run(a, ctx).await,
        Command::Cache(c) => cache::run(c, ctx).await,
    }
}
