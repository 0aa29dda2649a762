//! The configuration file (`config.toml`, see [`crate::ctx::config_path`]):
//! TOML read with serde, refusing unknown keys, duplicates and anything
//! that is not TOML, each with the file and line. `mado config` reads and
//! writes it by key (`remote`, `cache.max_size`).
//!
//! ```toml
//! remote = "s3://bucket/prefix"
//!
//! [cache]
//! max_size = "10G"
//! ```

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::ctx::config_path;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The store snapshots live in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    #[serde(default, skip_serializing_if = "CacheConfig::is_empty")]
    pub cache: CacheConfig,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// The disk cache's cap: bytes, or a size with a unit ("10G").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<Size>,
}

impl CacheConfig {
    fn is_empty(&self) -> bool {
        self.max_size.is_none()
    }
}

/// A size as written: a number of bytes or a string with a unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    pub fn bytes(&self) -> std::result::Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(t) => parse_size(t),
        }
    }
}

/// The keys `mado config` knows, with what each means.
pub const KEYS: &[(&str, &str)] = &[
    ("remote", "the store URL: file:///path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"),
    ("cache.max_size", "the disk cache's cap: bytes or a size with a unit (512M, 10G, 1T); 0 = unbounded"),
];

/// Parses a size: bytes (`1048576`) or a number with a unit. `K`, `M`,
/// `G`, `T` (alone, or as `KiB`...) are powers of 1024; `KB`, `MB`, `GB`,
/// `TB` are powers of 1000; fractions are allowed (`1.5G`).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let bad = || format!("{text:?} is not a size; write bytes or a number with a unit: 512M, 10G, 1.5T, 20GB");
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    if num.is_empty() {
        return Err(bad());
    }
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(|| format!("{text:?} is too large"));
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    let v = f * mult as f64;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(v.round() as u64)
}

fn user(msg: String) -> anyhow::Error {
    anyhow::Error::new(mado_core::Error::User(msg))
}

/// The config file's contents (empty when there is none). A file that is
/// not TOML, or has a key mado does not know, is an error naming it.
pub fn load() -> Result<Config> {
    let p = config_path()?;
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", p.display())),
    };
    let c: Config = toml::from_str(&text).map_err(|e| {
        user(format!(
            "the config file {} is not valid: {}\n  hint: fix or remove it; the keys mado knows are {}",
            p.display(),
            e.to_string().trim_end(),
            KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        ))
    })?;
    if let Some(s) = &c.cache.max_size {
        s.bytes().map_err(|e| user(format!("the config file {}: cache.max_size: {e}", p.display())))?;
    }
    Ok(c)
}

/// Writes the config file whole (comments are not kept).
pub fn save(c: &Config) -> Result<()> {
    let p = config_path()?;
    if let Some(dir) = p.parent() {
        mado_core::fsutil::create_private_dir(dir)?;
    }
    let text = format!("# mado configuration (`mado config` and `mado init` write it)\n{}", toml::to_string(c)?);
    let tmp = p.with_extension("toml.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))?;
    Ok(())
}

/// The disk cache's cap: `MADO_DISK_CACHE_MAX_BYTES` if set, else the
/// config's `cache.max_size`; `None` (unbounded) when neither is, or 0.
pub fn cache_cap() -> Result<Option<u64>> {
    if let Some(v) = std::env::var("MADO_DISK_CACHE_MAX_BYTES").ok().filter(|v| !v.trim().is_empty()) {
        let n = parse_size(&v).map_err(|e| user(format!("MADO_DISK_CACHE_MAX_BYTES: {e} (0 = unbounded)")))?;
        return Ok(Some(n).filter(|&n| n > 0));
    }
    let c = load()?;
    Ok(match &c.cache.max_size {
        Some(s) => Some(s.bytes().map_err(user)?).filter(|&n| n > 0),
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_and_without_units() {
        for (t, want) in [
            ("0", 0),
            ("1024", 1024),
            (" 10G ", 10 << 30),
            ("10g", 10 << 30),
            ("10GiB", 10 << 30),
            ("512M", 512 << 20),
            ("1.5G", 3 << 29),
            ("2k", 2048),
            ("20GB", 20_000_000_000),
            ("3 MB", 3_000_000),
            ("1T", 1 << 40),
            ("7b", 7),
        ] {
            assert_eq!(parse_size(t), Ok(want), "{t:?}");
        }
        for t in ["", "G", "10X", "ten", "-5", "1.2.3G", "99999999999T", "1e3"] {
            assert!(parse_size(t).is_err(), "{t:?}");
        }
    }

    #[test]
    fn unknown_keys_duplicates_and_garbage_are_refused() {
        let ok: Config = toml::from_str("remote = \"file:///x\"\n[cache]\nmax_size = \"10G\"\n").unwrap();
        assert_eq!(ok.cache.max_size.as_ref().unwrap().bytes(), Ok(10 << 30));
        let n: Config = toml::from_str("[cache]\nmax_size = 4096\n").unwrap();
        assert_eq!(n.cache.max_size.unwrap().bytes(), Ok(4096));
        for bad in ["bogus = 1\n", "remote = \"a\"\nremote = \"b\"\n", "%%% garbage [[[", "[cache]\nmax = 1\n"] {
            assert!(toml::from_str::<Config>(bad).is_err(), "{bad:?}");
        }
        // What save writes reads back the same.
        let text = toml::to_string(&ok).unwrap();
        assert_eq!(toml::from_str::<Config>(&text).unwrap(), ok);
        assert_eq!(toml::to_string(&Config::default()).unwrap(), "");
    }
}
