use anyhow::Result;
use clap::Args;

use crate::ctx::{config_path, default_store_dir, Ctx};

/// Set up mado: choose the store snapshots live in and write the config.
///
/// With no flag, the store is an embedded local directory under your data
/// directory ($XDG_DATA_HOME/mado/store or ~/.local/share/mado/store): no
/// server needed; with MADO_REMOTE_ADDR set, the store it names. Checks
/// that the store answers before saving.
#[derive(Args)]
pub struct InitArgs {
    /// Store URL: file:///absolute/path, s3://bucket/prefix (S3 settings
    /// come from the AWS_* variables or the profile AWS_PROFILE names),
    /// gs://bucket/prefix (GOOGLE_SERVICE_ACCOUNT) or az://container/prefix
    /// (AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY).
    #[arg(long)]
    remote: Option<String>,
}

#[derive(serde::Serialize)]
struct InitOut {
    config: String,
    remote: String,
    previous_remote: Option<String>,
}

pub async fn run(a: InitArgs, ctx: &Ctx) -> Result<()> {
    // MADO_REMOTE_ADDR overrides the config for every later command: with
    // no --remote, init saves that store rather than one the variable
    // would hide.
    let from_env = std::env::var("MADO_REMOTE_ADDR")
        .ok()
        .filter(|u| !u.is_empty())
        .map(|u| crate::ctx::local_url(&u))
        .transpose()?;
    let url = match a.remote.map(|u| crate::ctx::local_url(&u)).transpose()?.or(from_env.clone()) {
        Some(u) => u,
        None => {
            let dir = default_store_dir()?;
            format!("file://{}", dir.display())
        }
    };
    // Open and list once: fails now, with a hint, if the store is wrong.
    let remote = mado_core::store::Remote::open(&url, &Default::default())?;
    if let Err(e) = remote.list_refs().await {
        // A refusal the store explains (no bucket, wrong credentials)
        // already names the URL and what to do: one line, as it is.
        if e.is_user_error() {
            return Err(e.into());
        }
        return Err(anyhow::Error::from(e).context(format!("checking that {url} answers")));
    }
    ctx.step("remote answered");
    // The rest of the file (the cache cap) stays as it is.
    let mut cfg = crate::config::load()?;
    let previous = cfg.remote.replace(url.clone());
    crate::config::save(&cfg)?;
    let path = config_path()?;
    let out = InitOut { config: path.display().to_string(), remote: url, previous_remote: previous };
    if ctx.json {
        return ctx.print_json(&out);
    }
    match from_env {
        Some(e) if e == out.remote => say!(ctx, "remote: {} (from MADO_REMOTE_ADDR)", out.remote),
        Some(e) => say!(
            ctx,
            "remote: {}\nnote: MADO_REMOTE_ADDR ({e}) is set and overrides this for every command",
            out.remote
        ),
        None => say!(ctx, "remote: {}", out.remote),
    }
    say!(ctx, "config: {}", out.config);
    if let Some(p) = out.previous_remote.filter(|p| *p != out.remote) {
        say!(ctx, "(was: {p})");
    }
    Ok(())
}
