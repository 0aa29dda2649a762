use anyhow::Result;
use clap::Subcommand;

use crate::config::{self, Config, Size, KEYS};
use crate::ctx::{config_path, Ctx};

/// Read and change the configuration file ($MADO_CONFIG,
/// $XDG_CONFIG_HOME/mado/config.toml or ~/.config/mado/config.toml).
///
/// Keys: `remote` (the store URL) and `cache.max_size` (the disk cache's
/// cap: bytes or a size with a unit such as 10G; 0 = unbounded).
/// MADO_REMOTE_ADDR and MADO_DISK_CACHE_MAX_BYTES, when set, win over the
/// file.
///
#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Every key: its value in the file (or unset) and what it means.
    List,
    /// Print one key's value (exit 1 when it is unset).
    Get { key: String },
    /// Set a key, checking the value first.
    Set { key: String, value: String },
    /// Remove a key from the file.
    Unset { key: String },
    /// Print the config file's path.
    Path,
}

fn user(msg: String) -> anyhow::Error {
    anyhow::Error::new(mado_core::Error::User(msg))
}

fn unknown(key: &str) -> anyhow::Error {
    let known: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
    user(format!("no config key {key:?}; the keys are: {}", known.join(", ")))
}

fn value_of(c: &Config, key: &str) -> Result<Option<String>> {
    Ok(match key {
        "remote" => c.remote.clone(),
        "cache.max_size" => c.cache.max_size.as_ref().map(|s| match s {
            Size::Bytes(n) => n.to_string(),
            Size::Text(t) => t.clone(),
        }),
        _ => return Err(unknown(key)),
    })
}

pub fn run(c: ConfigCommand, ctx: &Ctx) -> Result<()> {
    let path = config_path()?;
    match c {
        ConfigCommand::Path => {
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "path": path.display().to_string() }));
            }
            println!("{}", path.display());
        }
        ConfigCommand::List => {
            let cfg = config::load()?;
            let mut rows = Vec::new();
            for (k, what) in KEYS {
                rows.push(serde_json::json!({ "key": k, "value": value_of(&cfg, k)?, "about": what }));
            }
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "path": path.display().to_string(), "keys": rows }));
            }
            println!("# {}", path.display());
            for (var, key) in [("MADO_REMOTE_ADDR", "remote"), ("MADO_DISK_CACHE_MAX_BYTES", "cache.max_size")] {
                if let Some(v) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
                    println!("# {var}={v} is set: it wins over {key} below");
                }
            }
            for r in rows {
                let v = r["value"].as_str().map(|v| format!("{v:?}")).unwrap_or_else(|| "(unset)".into());
                println!(
                    "{} = {v}    # {}",
                    r["key"].as_str().unwrap_or_default(),
                    r["about"].as_str().unwrap_or_default()
                );
            }
        }
        ConfigCommand::Get { key } => {
            let cfg = config::load()?;
            let v = value_of(&cfg, &key)?;
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "key": key, "value": v }));
            }
            match v {
                Some(v) => println!("{v}"),
                None => return Err(user(format!("{key} is not set in {}", path.display()))),
            }
        }
        ConfigCommand::Set { key, value } => {
            let mut cfg = config::load()?;
            match key.as_str() {
                "remote" => {
                    // Parsed and built (no request), so a typo fails here.
                    mado_core::store::Remote::open(&value, &Default::default())?;
                    cfg.remote = Some(value.clone());
                }
                "cache.max_size" => {
                    config::parse_size(&value).map_err(user)?;
                    cfg.cache.max_size = Some(Size::Text(value.trim().to_string()));
                }
                _ => return Err(unknown(&key)),
            }
            config::save(&cfg)?;
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "key": key, "value": value }));
            }
            println!("{key} = {value:?}");
        }
        ConfigCommand::Unset { key } => {
            let mut cfg = config::load()?;
            match key.as_str() {
                "remote" => cfg.remote = None,
                "cache.max_size" => cfg.cache.max_size = None,
                _ => return Err(unknown(&key)),
            }
            config::save(&cfg)?;
            if ctx.json {
                return ctx.print_json(&serde_json::json!({ "key": key, "value": null }));
            }
            println!("{key} unset");
        }
    }
    Ok(())
}
