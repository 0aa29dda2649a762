//! The cloud backends behind `s3://`, `gs://` and `az://` URLs: each
//! builder from its standard environment (and, for S3, the AWS profile
//! files), with the same bounded timeouts and retries.

use std::sync::Arc;
use std::time::Duration;

use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::aws_profile::{self, Credentials};
use crate::error::{Error, Result};

/// Connect and request bounds: an unreachable remote fails within about
/// `CONNECT_TIMEOUT × (MAX_RETRIES + 1)` plus backoff, never hangs.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_RETRIES: usize = 2;
const RETRY_TIMEOUT: Duration = Duration::from_secs(15);

/// A backend, the key prefix under it, the endpoint (for messages).
pub(super) type Opened = (Arc<dyn ObjectStore>, String, Option<std::path::PathBuf>, Option<String>);

fn client_options(endpoint: Option<&str>) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_pool_idle_timeout(Duration::from_secs(90))
        .with_allow_http(endpoint.is_some_and(|e| e.starts_with("http://")))
}

/// Whether a client can do without the system's root certificates: every
/// request it makes is plain http (an `http://` endpoint, and keys given
/// as they are, so no token service over https is ever asked). Loading
/// them reads every file of `/etc/ssl/certs` when the client is built:
/// 4–5 ms each time a command starts, 30–60 ms with a cold page cache.
fn plain_http_only(endpoint: Option<&str>, static_keys: bool) -> bool {
    static_keys && endpoint.is_some_and(|e| e.starts_with("http://"))
}

fn retry() -> RetryConfig {
    RetryConfig { max_retries: MAX_RETRIES, retry_timeout: RETRY_TIMEOUT, ..Default::default() }
}

/// The bucket (or container) a URL names, and the prefix after it.
fn bucket_and_prefix(parsed: &url::Url, url: &str, form: &str) -> Result<(String, String)> {
    match parsed.host_str() {
        Some(b) if !b.is_empty() => Ok((b.to_string(), parsed.path().trim_matches('/').to_string())),
        _ => Err(Error::User(format!("remote URL {url:?}: no bucket; use {form}"))),
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// `s3://bucket/prefix`: the AWS environment variables, then the profile
/// (see [`aws_profile`]); an `http://` endpoint (MinIO) is allowed.
pub(super) fn s3(parsed: &url::Url, url: &str) -> Result<Opened> {
    let (bucket, prefix) = bucket_and_prefix(parsed, url, "s3://bucket/prefix")?;
    let profile = aws_profile::load(&env)?;
    let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(&bucket);
    let endpoint = env("AWS_ENDPOINT_URL_S3")
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .or_else(|| env("AWS_ENDPOINT"))
        .or_else(|| profile.as_ref().and_then(|p| p.endpoint_url.clone()));
    if let Some(ep) = &endpoint {
        b = b.with_endpoint(ep).with_allow_http(ep.starts_with("http://"));
    }
    if env("AWS_REGION").is_none() && env("AWS_DEFAULT_REGION").is_none() {
        b = b.with_region(profile.as_ref().and_then(|p| p.region.clone()).unwrap_or("us-east-1".into()));
    }
    // Keys in the environment win over the profile's.
    let mut static_keys = env("AWS_ACCESS_KEY_ID").is_some() && env("AWS_SECRET_ACCESS_KEY").is_some();
    if let (Some(p), None) = (&profile, env("AWS_ACCESS_KEY_ID")) {
        use object_store::aws::AmazonS3ConfigKey as K;
        match p.credentials()? {
            Credentials::Static(c) => {
                b = b.with_access_key_id(c.key_id).with_secret_access_key(c.secret_key);
                if let Some(t) = c.token {
                    b = b.with_token(t);
                }
                static_keys = true;
            }
            Credentials::Process(provider) => b = b.with_credentials(provider),
            Credentials::WebIdentity { role_arn, token_file, session_name } => {
                b = b.with_config(K::RoleArn, role_arn).with_config(K::WebIdentityTokenFile, token_file);
                if let Some(n) = session_name {
                    b = b.with_config(K::RoleSessionName, n);
                }
            }
            Credentials::None => {}
        }
    }
    let options = client_options(endpoint.as_deref())
        .with_no_system_certificates(plain_http_only(endpoint.as_deref(), static_keys));
    let s3 = b.with_client_options(options).with_retry(retry()).build().map_err(|e| {
        Error::User(format!(
            "remote URL {url:?}: {e}\n  hint: set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        ))
    })?;
    Ok((Arc::new(s3), prefix, None, endpoint))
}

/// `gs://bucket/prefix`: credentials as object_store reads them
/// (`GOOGLE_SERVICE_ACCOUNT` naming a key file, `GOOGLE_SERVICE_ACCOUNT_KEY`,
/// or application default credentials); a key file's `gcs_base_url` or
/// `GOOGLE_BASE_URL` names another endpoint (an emulator).
pub(super) fn gcs(parsed: &url::Url, url: &str) -> Result<Opened> {
    let (bucket, prefix) = bucket_and_prefix(parsed, url, "gs://bucket/prefix")?;
    let endpoint = env("GOOGLE_BASE_URL").or_else(|| gcs_base_url_of_key_file().filter(|u| !u.is_empty()));
    let gcs = object_store::gcp::GoogleCloudStorageBuilder::from_env()
        .with_bucket_name(&bucket)
        .with_client_options(client_options(endpoint.as_deref()))
        .with_retry(retry())
        .build()
        .map_err(|e| {
            Error::User(format!(
                "remote URL {url:?}: {e}\n  hint: set GOOGLE_SERVICE_ACCOUNT to a service account key file, \
                 or GOOGLE_APPLICATION_CREDENTIALS"
            ))
        })?;
    Ok((Arc::new(gcs), prefix, None, endpoint))
}

/// The `gcs_base_url` of the key file `GOOGLE_SERVICE_ACCOUNT` names: an
/// emulator's address, which needs plain http allowed.
fn gcs_base_url_of_key_file() -> Option<String> {
    let path = env("GOOGLE_SERVICE_ACCOUNT").or_else(|| env("GOOGLE_SERVICE_ACCOUNT_PATH"))?;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v.get("gcs_base_url")?.as_str().map(str::to_string)
}

/// `az://container/prefix` (or `azure://`): `AZURE_STORAGE_ACCOUNT_NAME`
/// with a key, a SAS or Entra ID credentials, as object_store reads them;
/// `AZURE_STORAGE_USE_EMULATOR=true` for Azurite (`AZURITE_BLOB_STORAGE_URL`).
pub(super) fn azure(parsed: &url::Url, url: &str) -> Result<Opened> {
    let (container, prefix) = bucket_and_prefix(parsed, url, "az://container/prefix")?;
    let endpoint = env("AZURITE_BLOB_STORAGE_URL").or_else(|| env("AZURE_STORAGE_ENDPOINT"));
    let az = object_store::azure::MicrosoftAzureBuilder::from_env()
        .with_container_name(&container)
        .with_client_options(client_options(endpoint.as_deref()))
        .with_retry(retry())
        .build()
        .map_err(|e| {
            Error::User(format!(
                "remote URL {url:?}: {e}\n  hint: set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY \
                 (or AZURE_STORAGE_SAS_KEY), or AZURE_STORAGE_USE_EMULATOR=true for Azurite"
            ))
        })?;
    Ok((Arc::new(az), prefix, None, endpoint))
}

#[cfg(test)]
mod tests {
    use super::plain_http_only;

    #[test]
    fn only_plain_http_with_keys_given_skips_the_system_roots() {
        assert!(plain_http_only(Some("http://127.0.0.1:9000"), true));
        // https, the default endpoint, or keys that may need a token
        // service over https: the roots are loaded.
        assert!(!plain_http_only(Some("https://s3.example.com"), true));
        assert!(!plain_http_only(None, true));
        assert!(!plain_http_only(Some("http://127.0.0.1:9000"), false));
    }
}
