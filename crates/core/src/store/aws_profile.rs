//! The AWS shared configuration files (`~/.aws/config` and
//! `~/.aws/credentials`), read the way the AWS CLI reads them, for what
//! `object_store`'s `from_env` leaves out: a named profile's keys, region
//! and `endpoint_url` (top level, or under an `s3 =` block), a
//! `credential_process`, and a web identity (`role_arn` with
//! `web_identity_token_file`).
//!
//! Precedence, as in the AWS CLI: environment variables first
//! (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL_S3`,
//! `AWS_ENDPOINT_URL`), then the profile (`AWS_PROFILE`, else `default`),
//! where the credentials file wins over the config file for a key both set.
//! Profiles that need AWS's own SDK to resolve (SSO, a role assumed from
//! another profile) are refused with a message saying how to hand mado
//! their credentials instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use object_store::aws::AwsCredential;
use object_store::CredentialProvider;

use crate::error::{Error, Result};

/// What mado takes from one profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    /// `s3 =` block's `endpoint_url` if set, else the profile's own.
    pub endpoint_url: Option<String>,
    pub credential_process: Option<String>,
    pub role_arn: Option<String>,
    pub web_identity_token_file: Option<String>,
    pub role_session_name: Option<String>,
    /// Keys naming a way to get credentials that mado cannot follow
    /// (`sso_session`, `source_profile`, ...).
    pub unsupported: Vec<String>,
}

/// Sections of an INI file as the AWS CLI writes them: `[name]` headers,
/// `key = value` lines, `#`/`;` comments, and nested blocks (`s3 =`
/// followed by indented `key = value` lines) stored as `s3.key`.
pub fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section: Option<String> = None;
    let mut block: Option<String> = None;
    for raw in text.lines() {
        let line = raw.trim_end();
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            section = rest.strip_suffix(']').map(|s| s.trim().to_string());
            block = None;
            if let Some(s) = &section {
                out.entry(s.clone()).or_default();
            }
            continue;
        }
        let Some(sec) = &section else { continue };
        let Some((k, v)) = trimmed.split_once('=') else { continue };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        let indented = line.starts_with(' ') || line.starts_with('\t');
        let key = match (&block, indented) {
            (Some(b), true) => format!("{b}.{k}"),
            _ => {
                block = None;
                if v.is_empty() {
                    block = Some(k);
                    continue;
                }
                k
            }
        };
        out.entry(sec.clone()).or_default().insert(key, v);
    }
    out
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::User(format!("cannot read the AWS file {}: {e}", path.display()))),
    }
}

/// The profile the environment selects, from the files the environment
/// names (`AWS_CONFIG_FILE`, `AWS_SHARED_CREDENTIALS_FILE`, else under
/// `~/.aws`). `None` when the default profile is asked for and neither file
/// has it; an error when a profile named by `AWS_PROFILE` is in neither.
pub fn load(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Profile>> {
    let named = env("AWS_PROFILE").or_else(|| env("AWS_DEFAULT_PROFILE")).filter(|p| !p.is_empty());
    let name = named.clone().unwrap_or_else(|| "default".to_string());
    let aws_dir = home().map(|h| h.join(".aws"));
    let config_path = env("AWS_CONFIG_FILE").map(PathBuf::from).or_else(|| aws_dir.as_ref().map(|d| d.join("config")));
    let creds_path = env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| aws_dir.as_ref().map(|d| d.join("credentials")));
    let config = match &config_path {
        Some(p) => read_optional(p)?.map(|t| parse_ini(&t)).unwrap_or_default(),
        None => Default::default(),
    };
    let creds = match &creds_path {
        Some(p) => read_optional(p)?.map(|t| parse_ini(&t)).unwrap_or_default(),
        None => Default::default(),
    };
    // The config file names profiles `[profile NAME]`, except `[default]`.
    let from_config =
        config.get(&format!("profile {name}")).or_else(|| config.get(&name).filter(|_| name == "default"));
    let from_creds = creds.get(&name);
    if from_config.is_none() && from_creds.is_none() {
        return match named {
            Some(p) => Err(Error::User(format!(
                "AWS profile {p:?} (AWS_PROFILE) is in neither {} nor {}; add it (`aws configure --profile {p}`) or unset AWS_PROFILE",
                config_path.map(|p| p.display().to_string()).unwrap_or_else(|| "~/.aws/config".into()),
                creds_path.map(|p| p.display().to_string()).unwrap_or_else(|| "~/.aws/credentials".into()),
            ))),
            None => Ok(None),
        };
    }
    let mut keys: BTreeMap<String, String> = from_config.cloned().unwrap_or_default();
    keys.extend(from_creds.cloned().unwrap_or_default());
    let take = |k: &str| keys.get(k).filter(|v| !v.is_empty()).cloned();
    let unsupported = ["sso_session", "sso_start_url", "sso_account_id", "source_profile", "credential_source"]
        .iter()
        .filter(|k| keys.contains_key(**k))
        .map(|k| k.to_string())
        .collect();
    Ok(Some(Profile {
        name,
        access_key_id: take("aws_access_key_id"),
        secret_access_key: take("aws_secret_access_key"),
        session_token: take("aws_session_token"),
        region: take("region"),
        endpoint_url: take("s3.endpoint_url").or_else(|| take("endpoint_url")),
        credential_process: take("credential_process"),
        role_arn: take("role_arn"),
        web_identity_token_file: take("web_identity_token_file"),
        role_session_name: take("role_session_name"),
        unsupported,
    }))
}

/// How a profile gives its credentials.
#[derive(Debug)]
pub enum Credentials {
    Static(AwsCredential),
    Process(Arc<ProcessCredentials>),
    WebIdentity {
        role_arn: String,
        token_file: String,
        session_name: Option<String>,
    },
    /// The profile names no credentials: leave them to the environment.
    None,
}

impl Profile {
    pub fn credentials(&self) -> Result<Credentials> {
        if let (Some(id), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            return Ok(Credentials::Static(AwsCredential {
                key_id: id.clone(),
                secret_key: secret.clone(),
                token: self.session_token.clone(),
            }));
        }
        if let Some(cmd) = &self.credential_process {
            return Ok(Credentials::Process(Arc::new(ProcessCredentials::new(&self.name, cmd))));
        }
        if let (Some(role), Some(file), true) =
            (&self.role_arn, &self.web_identity_token_file, self.unsupported.is_empty())
        {
            return Ok(Credentials::WebIdentity {
                role_arn: role.clone(),
                token_file: file.clone(),
                session_name: self.role_session_name.clone(),
            });
        }
        if !self.unsupported.is_empty() || self.role_arn.is_some() {
            let p = &self.name;
            return Err(Error::User(format!(
                "AWS profile {p:?} gets its credentials through {} , which cannot be followed here; \
                 hand them over instead: `eval \"$(aws configure export-credentials --profile {p} --format env)\"`, \
                 or give the profile a credential_process",
                if self.unsupported.is_empty() { "role_arn".to_string() } else { self.unsupported.join(", ") }
            )));
        }
        if self.access_key_id.is_some() != self.secret_access_key.is_some() {
            return Err(Error::User(format!(
                "AWS profile {:?} has only one of aws_access_key_id and aws_secret_access_key; set both",
                self.name
            )));
        }
        Ok(Credentials::None)
    }
}

/// Credentials from a profile's `credential_process`: the command is run
/// (through `sh -c`) when none are held or those held expire within five
/// minutes, and must print the AWS CLI's JSON (`Version: 1`,
/// `AccessKeyId`, `SecretAccessKey`, optional `SessionToken` and
/// `Expiration` in RFC 3339).
#[derive(Debug)]
pub struct ProcessCredentials {
    profile: String,
    command: String,
    held: Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

const REFRESH_BEFORE: Duration = Duration::from_secs(300);

impl ProcessCredentials {
    pub fn new(profile: &str, command: &str) -> ProcessCredentials {
        ProcessCredentials { profile: profile.to_string(), command: command.to_string(), held: Mutex::new(None) }
    }

    fn err(&self, why: String) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: format!("credential_process of AWS profile {:?} ({}): {why}", self.profile, self.command).into(),
        }
    }

    /// Runs the command and parses what it printed.
    pub fn run(&self) -> std::result::Result<(AwsCredential, Option<SystemTime>), object_store::Error> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| self.err(format!("cannot run it: {e}")))?;
        if !out.status.success() {
            return Err(self.err(format!(
                "it failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        parse_process_output(&out.stdout).map_err(|e| self.err(e))
    }
}

/// The AWS CLI's credential_process JSON.
pub fn parse_process_output(stdout: &[u8]) -> std::result::Result<(AwsCredential, Option<SystemTime>), String> {
    let v: serde_json::Value = serde_json::from_slice(stdout).map_err(|e| format!("it did not print JSON ({e})"))?;
    if v.get("Version").and_then(|x| x.as_u64()) != Some(1) {
        return Err("its JSON has no \"Version\": 1".into());
    }
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).filter(|s| !s.is_empty()).map(str::to_string);
    let key_id = field("AccessKeyId").ok_or("its JSON has no AccessKeyId")?;
    let secret_key = field("SecretAccessKey").ok_or("its JSON has no SecretAccessKey")?;
    let expires = match field("Expiration") {
        Some(t) => {
            let ts: jiff::Timestamp = t.parse().map_err(|e| format!("its Expiration {t:?} is not RFC 3339 ({e})"))?;
            Some(SystemTime::from(ts))
        }
        None => None,
    };
    Ok((AwsCredential { key_id, secret_key, token: field("SessionToken") }, expires))
}

#[async_trait::async_trait]
impl CredentialProvider for ProcessCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        {
            let held = self.held.lock().expect("credential lock");
            if let Some((c, expires)) = &*held {
                let fresh = expires.is_none_or(|t| t > SystemTime::now() + REFRESH_BEFORE);
                if fresh {
                    return Ok(c.clone());
                }
            }
        }
        let (c, expires) = self.run()?;
        let c = Arc::new(c);
        *self.held.lock().expect("credential lock") = Some((c.clone(), expires));
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        move |k| m.get(k).cloned()
    }

    fn files(config: &str, creds: &str) -> (tempfile::TempDir, Vec<(&'static str, String)>) {
        let d = tempfile::tempdir().unwrap();
        let (c, k) = (d.path().join("config"), d.path().join("credentials"));
        std::fs::write(&c, config).unwrap();
        std::fs::write(&k, creds).unwrap();
        let v = vec![
            ("AWS_CONFIG_FILE", c.display().to_string()),
            ("AWS_SHARED_CREDENTIALS_FILE", k.display().to_string()),
        ];
        (d, v)
    }

    #[test]
    fn ini_sections_comments_and_nested_blocks() {
        let t = "# c\n[default]\nregion = eu-west-1\n; c\n[profile m]\nregion=us-east-2\ns3 =\n  endpoint_url = http://s3.local:9000\n  addressing_style = path\nendpoint_url = http://all.local\n";
        let p = parse_ini(t);
        assert_eq!(p["default"]["region"], "eu-west-1");
        assert_eq!(p["profile m"]["region"], "us-east-2");
        assert_eq!(p["profile m"]["s3.endpoint_url"], "http://s3.local:9000");
        assert_eq!(p["profile m"]["s3.addressing_style"], "path");
        // A key at the left margin ends the block.
        assert_eq!(p["profile m"]["endpoint_url"], "http://all.local");
        assert!(!p["profile m"].contains_key("s3"));
    }

    #[test]
    fn a_named_profile_merges_both_files_and_the_credentials_file_wins() {
        let (_d, mut e) = files(
            "[default]\nregion = eu-west-1\n[profile minio]\nregion = us-east-2\nendpoint_url = http://127.0.0.1:9000\naws_access_key_id = from-config\n",
            "[default]\naws_access_key_id = d\naws_secret_access_key = ds\n[minio]\naws_access_key_id = AK\naws_secret_access_key = SK\naws_session_token = T\n",
        );
        e.push(("AWS_PROFILE", "minio".into()));
        let p = load(&env_of(&e)).unwrap().unwrap();
        assert_eq!(p.name, "minio");
        assert_eq!(p.region.as_deref(), Some("us-east-2"));
        assert_eq!(p.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        match p.credentials().unwrap() {
            Credentials::Static(c) => {
                assert_eq!((c.key_id.as_str(), c.secret_key.as_str(), c.token.as_deref()), ("AK", "SK", Some("T")))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_default_profile_is_used_without_aws_profile_and_may_be_missing() {
        let (_d, e) = files("[default]\nregion = ap-south-1\n", "");
        let p = load(&env_of(&e)).unwrap().unwrap();
        assert_eq!((p.name.as_str(), p.region.as_deref()), ("default", Some("ap-south-1")));
        assert!(matches!(p.credentials().unwrap(), Credentials::None));
        // `[profile default]` is not how the config file names the default,
        // but `[default]` in the credentials file is.
        let (_d, e) = files("[profile other]\nregion = x\n", "");
        assert_eq!(load(&env_of(&e)).unwrap(), None);
    }

    #[test]
    fn a_missing_named_profile_is_an_error_naming_it() {
        let (_d, mut e) = files("[default]\nregion = x\n", "");
        e.push(("AWS_PROFILE", "nope".into()));
        let err = load(&env_of(&e)).unwrap_err().to_string();
        assert!(err.contains("\"nope\"") && err.contains("AWS_PROFILE"), "{err}");
    }

    #[test]
    fn sso_and_source_profile_are_refused_with_what_to_do() {
        let (_d, mut e) = files("[profile s]\nsso_session = corp\nsso_account_id = 1\n", "");
        e.push(("AWS_PROFILE", "s".into()));
        let err = load(&env_of(&e)).unwrap().unwrap().credentials().unwrap_err().to_string();
        assert!(err.contains("sso_session") && err.contains("export-credentials"), "{err}");
        let (_d, mut e) = files("[profile r]\nrole_arn = arn:x\nsource_profile = default\n", "");
        e.push(("AWS_PROFILE", "r".into()));
        let err = load(&env_of(&e)).unwrap().unwrap().credentials().unwrap_err().to_string();
        assert!(err.contains("source_profile"), "{err}");
        let (_d, mut e) = files("[profile h]\naws_access_key_id = a\n", "");
        e.push(("AWS_PROFILE", "h".into()));
        let err = load(&env_of(&e)).unwrap().unwrap().credentials().unwrap_err().to_string();
        assert!(err.contains("only one"), "{err}");
    }

    #[test]
    fn web_identity_is_handed_to_the_builder() {
        let (_d, mut e) = files("[profile w]\nrole_arn = arn:aws:iam::1:role/r\nweb_identity_token_file = /t\n", "");
        e.push(("AWS_PROFILE", "w".into()));
        match load(&env_of(&e)).unwrap().unwrap().credentials().unwrap() {
            Credentials::WebIdentity { role_arn, token_file, session_name } => {
                assert_eq!(
                    (role_arn.as_str(), token_file.as_str(), session_name),
                    ("arn:aws:iam::1:role/r", "/t", None)
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn credential_process_runs_once_while_fresh_and_again_near_expiry() {
        let d = tempfile::tempdir().unwrap();
        let count = d.path().join("count");
        let far = "2999-01-01T00:00:00Z";
        let cmd = format!(
            "echo x >> {c}; printf '{{\"Version\":1,\"AccessKeyId\":\"K%s\",\"SecretAccessKey\":\"S\",\"SessionToken\":\"T\",\"Expiration\":\"{far}\"}}' $(wc -l < {c})",
            c = count.display()
        );
        let p = ProcessCredentials::new("p", &cmd);
        let a = p.get_credential().await.unwrap();
        let b = p.get_credential().await.unwrap();
        assert_eq!((a.key_id.as_str(), b.key_id.as_str(), a.token.as_deref()), ("K1", "K1", Some("T")));
        // Expiring within the refresh margin: run again.
        let soon = SystemTime::now() + Duration::from_secs(60);
        *p.held.lock().unwrap() = Some((a, Some(soon)));
        assert_eq!(p.get_credential().await.unwrap().key_id, "K2");
    }

    #[test]
    fn credential_process_output_is_checked() {
        assert!(parse_process_output(b"nope").unwrap_err().contains("JSON"));
        assert!(parse_process_output(br#"{"AccessKeyId":"a","SecretAccessKey":"s"}"#).unwrap_err().contains("Version"));
        assert!(parse_process_output(br#"{"Version":1,"SecretAccessKey":"s"}"#).unwrap_err().contains("AccessKeyId"));
        let (c, exp) = parse_process_output(br#"{"Version":1,"AccessKeyId":"a","SecretAccessKey":"s"}"#).unwrap();
        assert_eq!((c.key_id.as_str(), c.token, exp), ("a", None, None));
        assert!(parse_process_output(br#"{"Version":1,"AccessKeyId":"a","SecretAccessKey":"s","Expiration":"soon"}"#)
            .unwrap_err()
            .contains("RFC 3339"));
        let failing = ProcessCredentials::new("p", "echo boom >&2; exit 3");
        let e = failing.run().unwrap_err().to_string();
        assert!(e.contains("boom") && e.contains("\"p\""), "{e}");
    }
}
