//! Store backends and how their credentials are found: AWS shared config
//! profiles against the MinIO server the suite starts.

mod common;

use common::*;

/// The MinIO settings the suite exported, to be written into profiles.
fn minio_env() -> (String, String, String) {
    let v = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set with MADO_TEST_S3_URL"));
    (v("AWS_ENDPOINT_URL"), v("AWS_ACCESS_KEY_ID"), v("AWS_SECRET_ACCESS_KEY"))
}

/// A mado command that sees no AWS_* variable but those given.
fn without_aws_env(m: &Mado, args: &[&str]) -> std::process::Command {
    let mut c = m.cmd(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    c
}

fn run(mut c: std::process::Command) -> (Option<i32>, String) {
    let o = c.output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn an_aws_profile_with_endpoint_url_reaches_minio() {
    let Some(base) = s3_base() else { return };
    let (endpoint, key, secret) = minio_env();
    let m = Mado::s3(&base);
    let aws = m.home().join(".aws");
    std::fs::create_dir_all(&aws).unwrap();
    // Keys in the credentials file; region and the endpoint (in an `s3 =`
    // block) in the config file; a wrong default that must not be used.
    std::fs::write(
        aws.join("credentials"),
        format!("[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[minio]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"),
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = eu-west-3\n\n[profile minio]\nregion = us-east-1\ns3 =\n  endpoint_url = {endpoint}\n"
        ),
    )
    .unwrap();
    let repo = fixture_repo(m.dir.path());
    let with_profile = |args: &[&str]| {
        let mut c = without_aws_env(&m, args);
        c.env("AWS_PROFILE", "minio");
        c
    };
    let (code, err) = run(with_profile(&["init", "--remote", &m.remote]));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run(with_profile(&["import-git", repo.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{err}");
    let out = m.dir.path().join("out");
    let (code, err) = run(with_profile(&["checkout", "main", out.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{err}");
    for f in ["README.md", "src/lib.rs", "src/deep/er/still.txt", "big.bin"] {
        assert_eq!(std::fs::read(out.join(f)).unwrap(), std::fs::read(repo.join(f)).unwrap(), "{f}");
    }

    // The same keys from a credential_process (the AWS CLI's JSON).
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile minio]\ns3 =\n  endpoint_url = {endpoint}\n[profile proc]\nendpoint_url = {endpoint}\ncredential_process = printf '{{\"Version\": 1, \"AccessKeyId\": \"{key}\", \"SecretAccessKey\": \"{secret}\"}}'\n"
        ),
    )
    .unwrap();
    let mut c = without_aws_env(&m, &["log", "main", "--json"]);
    c.env("AWS_PROFILE", "proc");
    let (code, err) = run(c);
    assert_eq!(code, Some(0), "{err}");

    // Keys in the environment win over the profile's (here: wrong ones).
    let mut c = with_profile(&["log", "main"]);
    c.env("AWS_ACCESS_KEY_ID", &key).env("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    let (code, err) = run(c);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the credentials"), "{err}");

    // A profile that is nowhere: one line naming it, exit 1.
    let mut c = without_aws_env(&m, &["log", "main"]);
    c.env("AWS_PROFILE", "absent");
    let (code, err) = run(c);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("\"absent\"") && err.contains("AWS_PROFILE"), "{err}");

    // No credentials anywhere (the metadata service object_store falls
    // back to is not there): one line saying what to set, exit 1.
    std::fs::remove_dir_all(&aws).unwrap();
    let mut c = without_aws_env(&m, &["log", "main"]);
    c.env("AWS_ENDPOINT_URL", &endpoint);
    let (code, err) = run(c);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no AWS credentials found") && err.contains("AWS_PROFILE"), "{err}");
}

/// Azure Blob (Azurite): a missing container and a wrong key are one line
/// each, exit 1, saying what to do. (Imports, checkouts, checkpoints and
/// the lease race run on Azurite in the every-backend tests.)
#[test]
fn azure_refusals_are_one_clear_line_azurite() {
    let Some(base) = azure_base() else { return };
    let m = Mado::s3(&base);
    let err = m.fails(&["init", "--remote", "az://no-such-container/x"], 1);
    assert!(err.contains("container \"no-such-container\" does not exist") && err.contains("create it"), "{err}");
    assert!(!err.contains("<?xml"), "{err}");
    let key = std::env::var("AZURE_STORAGE_ACCOUNT_KEY").unwrap();
    let mut wrong = key.into_bytes();
    wrong[0] = if wrong[0] == b'A' { b'B' } else { b'A' };
    let o = m
        .cmd(&["init", "--remote", &m.remote])
        .env("AZURE_STORAGE_ACCOUNT_KEY", String::from_utf8(wrong).unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("refused the credentials") && err.contains("AZURE_STORAGE_ACCOUNT_KEY"), "{err}");
}

/// Google Cloud Storage (fake-gcs-server). The emulator has no XML-API
/// upload (the `PUT /bucket/object` object_store writes with; upstream
/// fake-gcs-server issue #331), so the store is written locally and
/// uploaded through the emulator's JSON API; mado then reads it through
/// `gs://`: refs, log, ls, cat and a cold checkout.
#[test]
fn a_store_in_gcs_reads_back_fake_gcs() {
    let Some(base) = gcs_base() else { return };
    let endpoint = std::env::var("MADO_GCS_ENDPOINT").expect("MADO_GCS_ENDPOINT with MADO_TEST_GCS_URL");
    let local = Mado::local();
    let repo = setup(&local);
    let gs = Mado::s3(&base);
    let (bucket, prefix) = gs.remote.trim_start_matches("gs://").split_once('/').unwrap();
    let store = local.store_dir();
    let mut files = vec![];
    let mut stack = vec![store.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 3, "{files:?}");
    for f in &files {
        let rel = f.strip_prefix(&store).unwrap().to_str().unwrap();
        if rel.starts_with("locks/") {
            continue;
        }
        let name = format!("{prefix}/{rel}").replace('/', "%2F");
        let url = format!("{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}");
        let o = std::process::Command::new("curl")
            .args(["-sf", "-X", "POST", "--data-binary"])
            .arg(format!("@{}", f.display()))
            .arg(&url)
            .output()
            .unwrap();
        assert!(o.status.success(), "uploading {rel}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let refs = gs.json(&["refs"]);
    assert!(refs.to_string().contains("\"main\""), "{refs}");
    assert_eq!(
        gs.json(&["log", "main"]).as_array().map(|a| a.len()),
        local.json(&["log", "main"]).as_array().map(|a| a.len())
    );
    assert!(gs.ok(&["ls", "main", "src"]).contains("lib.rs"));
    assert_eq!(gs.ok(&["cat", "main", "src/lib.rs"]).as_bytes(), std::fs::read(repo.join("src/lib.rs")).unwrap());
    let (a, b) = (gs.dir.path().join("a"), local.dir.path().join("b"));
    gs.ok(&["checkout", "main", a.to_str().unwrap()]);
    local.ok(&["checkout", "main", b.to_str().unwrap()]);
    assert_same_tree(&a, &b);
}
