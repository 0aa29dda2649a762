use anyhow::{Context as _, Result};
use clap::Args;

use crate::ctx::{config_path, default_store_dir, read_config_remote, Ctx};

/// Set up mado: choose the store snapshots live in and write the config.
///
/// With no flag, the store is an embedded local directory under your data
/// directory ($XDG_DATA_HOME/mado/store or ~/.local/share/mado/store): no
/// server needed. Checks that the store answers before saving.
#[derive(Args)]
pub struct InitArgs {
    /// Store URL: file:///absolute/path or s3://bucket/prefix (S3 settings
    /// come from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY).
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
    let url = match a.remote {
        Some(u) => u,
        None => {
            let dir = default_store_dir()?;
            format!("file://{}", dir.display())
        }
    };
    // Open and list once: fails now, with a hint, if the store is wrong.
    let remote = mado_core::store::Remote::open(&url, &Default::default())?;
    remote.list_refs().await.with_context(|| format!("checking that {url} answers"))?;
    ctx.step("remote answered");
    let previous = read_config_remote()?;
    let path = config_path()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, format!("# mado configuration (written by `mado init`)\nremote = \"{url}\"\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    let out = InitOut { config: path.display().to_string(), remote: url, previous_remote: previous };
    if ctx.json {
        return ctx.print_json(&out);
    }
    println!("remote: {}", out.remote);
    println!("config: {}", out.config);
    if let Some(p) = out.previous_remote.filter(|p| *p != out.remote) {
        println!("(was: {p})");
    }
    Ok(())
}
