//! mado as a tool in a shell: completion scripts, the man page, `mado
//! refs`, `log -n` / `ws log -n`, and dates people can read.

mod common;

use std::process::Output;

use common::*;

/// Runs with `TZ` set, so local times are predictable.
fn run_tz(m: &Mado, tz: &str, args: &[&str]) -> String {
    let o: Output = m.cmd(args).env("TZ", tz).output().unwrap();
    assert!(o.status.success(), "mado {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// Runs without any remote configured: completion and man need none.
fn run_storeless(m: &Mado, args: &[&str]) -> Output {
    m.cmd(args).env_remove("MADO_REMOTE_ADDR").output().unwrap()
}

fn stdout_ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn completion_scripts_for_every_shell_name_the_subcommands() {
    let m = Mado::local();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = stdout_ok(run_storeless(&m, &["completion", shell]), shell);
        assert!(!out.trim().is_empty(), "{shell}: empty script");
        for sub in ["import-git", "refs", "checkout", "completion"] {
            assert!(out.contains(sub), "{shell}: the script does not mention {sub}");
        }
    }
    // bash accepts the bash script.
    let script = m.dir.path().join("mado.bash");
    std::fs::write(&script, stdout_ok(run_storeless(&m, &["completion", "bash"]), "bash")).unwrap();
    let check = std::process::Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(check.status.success(), "bash -n: {}", String::from_utf8_lossy(&check.stderr));
    // The help says where to put it.
    let help = m.ok(&["completion", "--help"]);
    assert!(help.contains("mado completion bash > ~/.local/share/bash-completion/completions/mado"), "{help}");
    assert!(help.contains("fish/completions/mado.fish"), "{help}");
    // An unknown shell is a usage error.
    let o = run_storeless(&m, &["completion", "tcsh"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bash"), "the error lists the shells");
}

/// A roff man page: `.TH` first, after clap_mangen's two-line preamble that
/// defines the apostrophe string (`.ie \n(.g .ds Aq \(aq` / `.el .ds Aq '`).
fn is_man_page(page: &str) -> bool {
    let first = page.lines().find(|l| !l.starts_with(".ie ") && !l.starts_with(".el "));
    first.is_some_and(|l| l.starts_with(".TH mado")) && page.contains("\n.SH NAME\n")
}

#[test]
fn man_page_is_roff_and_per_command_pages_go_into_a_directory() {
    let m = Mado::local();
    let page = stdout_ok(run_storeless(&m, &["man"]), "man");
    assert!(is_man_page(&page), "{}", &page[..page.len().min(200)]);
    assert!(page.contains("import\\-git") && page.contains("refs"), "the page lists the subcommands");
    // groff reads it (UTF-8, through preconv as man does) without a warning,
    // where groff is installed.
    if let Ok(mut g) = std::process::Command::new("groff")
        .args(["-k", "-Tutf8", "-man", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write as _;
        g.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
        let o = g.wait_with_output().unwrap();
        assert!(o.status.success() && o.stderr.is_empty(), "groff: {}", String::from_utf8_lossy(&o.stderr));
    }
    let help = m.ok(&["man", "--help"]);
    assert!(help.contains("~/.local/share/man/man1"), "{help}");
    let dir = m.dir.path().join("man1");
    stdout_ok(run_storeless(&m, &["man", "--dir", dir.to_str().unwrap()]), "man --dir");
    for f in ["mado.1", "mado-log.1", "mado-refs.1", "mado-ws-create.1"] {
        let p = std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(is_man_page(&p), "{f}");
    }
}

#[test]
fn refs_lists_imports_and_workspaces() {
    let m = Mado::local();
    // A store with no refs yet: an empty list, not an error.
    std::fs::create_dir_all(m.store_dir()).unwrap();
    assert_eq!(m.json(&["refs"]), serde_json::json!([]));
    setup(&m);
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "agent", "--from", "main", "--dir", w.to_str().unwrap()]);
    let refs = m.json(&["refs"]);
    let refs = refs.as_array().unwrap();
    let names: Vec<&str> = refs.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["main", "ws/agent"], "{refs:?}");
    let log = m.json(&["log", "main"]);
    for r in refs {
        // Full ids and numbers; the workspace starts at main's snapshot.
        assert_eq!(r["snapshot"], log[0]["snapshot"], "{r}");
        assert_eq!(r["root"], log[0]["root"], "{r}");
        assert_eq!(r["snapshot"].as_str().unwrap().len(), 64);
        assert_eq!(r["time"], 1767323045, "{r}");
        assert_eq!(r["message"], "fixture\n");
    }
    let text = run_tz(&m, "UTC", &["refs"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let head: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(head, ["REF", "SNAPSHOT", "ROOT", "TIME", "MESSAGE"], "a header names the columns: {text}");
    let lines = &lines[1..];
    let snap = log[0]["snapshot"].as_str().unwrap();
    let root = log[0]["root"].as_str().unwrap();
    for (line, name) in lines.iter().zip(["main", "ws/agent"]) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], name, "{line}");
        assert_eq!(f[1], &snap[..12], "{line}");
        assert_eq!(f[2], &root[..12], "{line}");
        assert!(line.contains("2026-01-02 03:04:05 +00:00  fixture"), "{line}");
    }
}

/// `--verbose` says in words which pack index a read attached, not as a
/// Rust structure.
#[test]
fn verbose_describes_the_attached_index_in_words() {
    let m = Mado::local();
    setup(&m);
    let out = m.cmd(&["-v", "checkout", "main", m.dir.path().join("co").to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let line = err.lines().find(|l| l.contains("packs:")).unwrap_or_default();
    assert!(line.contains("attached a recursive index (pack v"), "{err}");
    assert!(line.contains("1 layer,") && line.ends_with("from the local copy"), "{line}");
    assert!(!err.contains("Attached {"), "{err}");
}

#[test]
fn log_and_ws_log_take_a_count() {
    let m = Mado::local();
    let repo = setup(&m);
    std::fs::write(repo.join("README.md"), "changed\n").unwrap();
    git(&repo, &["commit", "-qam", "second"]);
    m.ok(&["import-git", repo.to_str().unwrap()]);
    assert_eq!(m.json(&["log", "main"]).as_array().unwrap().len(), 2, "default: all");
    let one = m.json(&["log", "main", "-n", "1"]);
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["message"], "second\n");
    assert_eq!(m.json(&["log", "main", "--max-count", "5"]).as_array().unwrap().len(), 2);
    let text = m.ok(&["log", "main", "-n", "1"]);
    assert_eq!(text.lines().filter(|l| l.starts_with("snapshot ")).count(), 1, "{text}");
    assert!(m.ok(&["log", "main", "-n", "0"]).is_empty());
    assert!(m.fails(&["log", "main", "-n", "x"], 1).contains("invalid value"));

    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "agent", "--dir", w.to_str().unwrap()]);
    for i in 0..2 {
        std::fs::write(w.join("added.txt"), format!("{i}\n")).unwrap();
        m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap(), "-m", &format!("cp {i}")]);
    }
    assert_eq!(m.json(&["ws", "log", "agent"]).as_array().unwrap().len(), 4, "2 checkpoints, 2 imports");
    let two = m.json(&["ws", "log", "agent", "-n", "2"]);
    let msgs: Vec<&str> = two.as_array().unwrap().iter().map(|e| e["message"].as_str().unwrap()).collect();
    assert_eq!(msgs, ["cp 1", "cp 0"]);
    let text = m.ok(&["ws", "log", "agent", "-n", "1"]);
    assert_eq!(text.lines().filter(|l| l.starts_with("snapshot ")).count(), 1, "{text}");
}

#[test]
fn log_shows_local_dates_and_json_keeps_numbers() {
    let m = Mado::local();
    setup(&m);
    let text = run_tz(&m, "UTC", &["log", "main"]);
    assert!(text.contains("Date:     2026-01-02 03:04:05 +00:00"), "{text}");
    assert!(!text.contains("unix"), "{text}");
    // The zone comes from TZ.
    let tokyo = run_tz(&m, "Asia/Tokyo", &["log", "main"]);
    assert!(tokyo.contains("Date:     2026-01-02 12:04:05 +09:00"), "{tokyo}");
    let j = m.json(&["log", "main"]);
    assert_eq!(j[0]["time"], 1767323045, "{j}");

    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "agent", "--dir", w.to_str().unwrap()]);
    std::fs::write(w.join("added.txt"), "x\n").unwrap();
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap(), "-m", "cp"]);
    let wl = m.json(&["ws", "log", "agent"]);
    let t = wl[0]["time"].as_i64().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - t).abs() < 600, "a checkpoint's time is now: {wl}");
    let text = run_tz(&m, "UTC", &["ws", "log", "agent", "-n", "1"]);
    let date = text.lines().find_map(|l| l.strip_prefix("Date:     ")).unwrap_or_else(|| panic!("{text}"));
    assert!(date.ends_with(" +00:00") && date.len() == "2026-01-02 03:04:05 +00:00".len(), "{date}");
}

/// `mado diff`: the paths two snapshots differ by (added, modified, deleted),
/// with a ref compared with its parent by default; a directory replaced by a
/// file is its files deleted and the file added.
#[test]
fn diff_lists_what_changed_between_two_snapshots() {
    let m = Mado::local();
    let repo = m.dir.path().join("repo");
    for p in ["keep/a.txt", "keep/deep/b.txt", "edit.txt", "gone.txt", "dir/x.txt", "dir/y.txt", "run.sh"] {
        std::fs::create_dir_all(repo.join(p).parent().unwrap()).unwrap();
        std::fs::write(repo.join(p), format!("{p}\n")).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    commit_all(&repo, "one");
    let one = m.json(&["import-git", repo.to_str().unwrap()])["imported"][0]["snapshot"].as_str().unwrap().to_string();
    std::fs::write(repo.join("edit.txt"), "edited\n").unwrap();
    std::fs::remove_file(repo.join("gone.txt")).unwrap();
    std::fs::remove_dir_all(repo.join("dir")).unwrap();
    std::fs::write(repo.join("dir"), "now a file\n").unwrap();
    std::fs::write(repo.join("keep/deep/new.txt"), "new\n").unwrap();
    std::fs::set_permissions(repo.join("run.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    commit_all(&repo, "two");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let d = m.json(&["diff", &one, "main"]);
    assert_eq!(d["added"], serde_json::json!(["dir", "keep/deep/new.txt"]), "{d}");
    assert_eq!(d["modified"], serde_json::json!(["edit.txt", "run.sh"]), "{d}");
    assert_eq!(d["deleted"], serde_json::json!(["dir/x.txt", "dir/y.txt", "gone.txt"]), "{d}");
    // One side: against its parent, the same; as text, one line per path.
    assert_eq!(m.json(&["diff", "main"])["added"], d["added"]);
    let text = m.ok(&["diff", "main"]);
    assert!(text.lines().any(|l| l == "A keep/deep/new.txt") && text.lines().any(|l| l == "D gone.txt"), "{text}");
    assert_eq!(text.lines().count(), 7, "{text}");
    // The same snapshot twice: nothing; a first import has no parent.
    assert_eq!(m.ok(&["diff", "main", "main"]), "");
    let o = m.run(&["diff", &one]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no parent"), "{o:?}");
    // --stat and -p agree with git's own.
    let git_stat = git(&repo, &["diff", "--stat", "HEAD~1", "HEAD"]);
    let stat = m.ok(&["diff", &one, "main", "--stat"]);
    assert_eq!(stat.lines().last(), git_stat.lines().last(), "{stat}\n{git_stat}");
    assert!(stat.contains(" M edit.txt") && stat.contains("| ") && stat.contains("+-"), "{stat}");
    let patch = m.ok(&["diff", &one, "main", "-p"]);
    assert!(patch.contains("--- a/edit.txt\n+++ b/edit.txt\n@@ -1 +1 @@\n-edit.txt\n+edited\n"), "{patch}");
    assert!(patch.contains("--- /dev/null\n+++ b/keep/deep/new.txt\n"), "{patch}");
    assert!(patch.contains("--- a/gone.txt\n+++ /dev/null\n"), "{patch}");
    // chmod +x shows as git shows it.
    assert!(patch.contains("old mode 100644\nnew mode 100755\n"), "{patch}");
    let j = m.json(&["diff", &one, "main", "--stat", "-p"]);
    let edit = j["stat"].as_array().unwrap().iter().find(|s| s["path"] == "edit.txt").unwrap().clone();
    assert_eq!(
        (edit["lines_added"].as_u64(), edit["lines_removed"].as_u64(), edit["binary"].as_bool()),
        (Some(1), Some(1), Some(false)),
        "{j}"
    );
    assert_eq!(j["patches"].as_array().unwrap().len(), 7, "{j}");
    // A binary file is named, not printed.
    std::fs::write(repo.join("blob.bin"), b"\0\x01\x02binary").unwrap();
    commit_all(&repo, "three");
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let patch = m.ok(&["diff", "main", "-p"]);
    assert_eq!(patch, "Binary files blob.bin differ (0 -> 9 bytes)\n", "{patch}");
}

/// The config file is TOML read strictly: `mado config` sets and reads its
/// keys, a size takes a unit, and a file or variable mado cannot read is
/// an error naming it (exit 1), never silently ignored.
#[test]
fn config_is_strict_toml_with_sizes_and_a_command() {
    let m = Mado::local();
    let cfg = m.home().join(".config/mado/config.toml");
    m.ok(&["init"]);
    m.ok(&["config", "set", "cache.max_size", "10G"]);
    assert_eq!(m.ok(&["config", "get", "cache.max_size"]).trim(), "10G");
    let stats = m.json(&["cache", "stats"]);
    assert_eq!(stats["cap"], 10u64 << 30, "{stats}");
    // The variable wins over the file, and takes units too.
    let o = m.cmd(&["cache", "stats", "--json"]).env("MADO_DISK_CACHE_MAX_BYTES", "1.5G").output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cap"], 3u64 << 29, "{v}");
    let o = m.cmd(&["cache", "stats"]).env("MADO_DISK_CACHE_MAX_BYTES", "10X").output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("MADO_DISK_CACHE_MAX_BYTES"));
    // init changes the remote and keeps the rest.
    m.ok(&["init"]);
    assert_eq!(m.ok(&["config", "get", "cache.max_size"]).trim(), "10G");
    let list = m.json(&["config", "list"]);
    assert_eq!(list["keys"].as_array().unwrap().len(), 2, "{list}");
    assert!(m.fails(&["config", "set", "cache.max_size", "lots"], 1).contains("not a size"));
    assert!(m.fails(&["config", "set", "colour", "red"], 1).contains("no config key"));
    assert!(m.fails(&["config", "set", "remote", "ftp://x"], 1).contains("unsupported scheme"));
    m.ok(&["config", "unset", "cache.max_size"]);
    assert!(m.fails(&["config", "get", "cache.max_size"], 1).contains("not set"));
    let good = std::fs::read_to_string(&cfg).unwrap();
    // Garbage, an unknown key, a duplicate: refused, naming the file, and
    // nothing is written over it.
    for bad in
        ["%%% garbage [[[\n".to_string(), format!("{good}colour = 1\n"), format!("{good}remote = \"file:///y\"\n")]
    {
        std::fs::write(&cfg, &bad).unwrap();
        let err = m.fails(&["refs"], 1);
        assert!(err.contains(cfg.to_str().unwrap()) && err.contains("not valid"), "{err}");
        assert!(m.fails(&["init"], 1).contains("not valid"));
        assert_eq!(std::fs::read_to_string(&cfg).unwrap(), bad);
    }
}

/// import-git as a user calls it: from inside the repository (it finds the
/// root, as git does), with a URL (refused: clone it first), with
/// uncommitted changes (imported anyway, with a warning that they are not).
#[test]
fn import_git_finds_the_repository_refuses_urls_and_warns_of_uncommitted_work() {
    let m = Mado::local();
    m.ok(&["init"]);
    let repo = fixture_repo(m.dir.path());
    // The fixture writes win.bat with LF where its attributes say CRLF:
    // git counts that as a change until it writes the file itself.
    git(&repo, &["reset", "-q", "--hard"]);
    let o = m.cmd(&["import-git", "."]).current_dir(repo.join("src/deep")).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("importing the whole repository at") && err.contains(repo.to_str().unwrap()), "{err}");
    assert!(!err.contains("uncommitted"), "{err}");
    assert!(m.ok(&["ls", "main"]).contains("README.md"), "the root was imported");
    for url in ["https://example.com/x/y.git", "git@example.com:x/y.git", "ssh://git@example.com/x"] {
        let err = m.fails(&["import-git", url], 1);
        assert!(err.contains("is a URL") && err.contains("clone it first"), "{err}");
    }
    let err = m.fails(&["import-git", m.dir.path().to_str().unwrap()], 1);
    assert!(err.contains("not in a git repository"), "{err}");
    std::fs::write(repo.join("README.md"), "changed, not committed\n").unwrap();
    let o = m.cmd(&["import-git", repo.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("1 uncommitted change(s)") && err.contains("not imported"), "{err}");
    assert_eq!(m.ok(&["cat", "main", "README.md"]), "# fixture\n", "HEAD is what was imported");
}

/// `-q` leaves stdout and stderr empty on success; under `--json` an error
/// is one JSON object on stderr, and `ws rm` answers in JSON too.
#[test]
fn quiet_prints_nothing_and_json_errors_are_json() {
    let m = Mado::local();
    let repo = fixture_repo(m.dir.path());
    git(&repo, &["reset", "-q", "--hard"]);
    let out = m.dir.path().join("out");
    for args in [
        vec!["init", "-q"],
        vec!["import-git", repo.to_str().unwrap(), "-q"],
        vec!["checkout", "main", out.to_str().unwrap(), "--quiet"],
        vec!["ws", "create", "w", "--from", "main", "--dir", m.dir.path().join("w").to_str().unwrap(), "-q"],
    ] {
        let o = m.run(&args);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout.is_empty() && o.stderr.is_empty(), "{args:?} printed {o:?}");
    }
    assert!(out.join("README.md").is_file());
    // What a command is asked to show still prints.
    assert!(m.ok(&["ls", "main", "-q"]).contains("README.md"));
    // The working copy at w holds the lease: `ws rm` is refused (it could
    // no longer checkpoint), naming the holder and both ways on.
    let err = m.fails(&["ws", "rm", "w"], 1);
    assert!(err.contains("leased by") && err.contains("ws release") && err.contains("--force"), "{err}");
    assert!(!err.contains("--steal") && !err.contains("--read-only"), "hints of other commands: {err}");
    m.ok(&["ws", "release", "--dir", m.dir.path().join("w").to_str().unwrap()]);
    let rm = m.json(&["ws", "rm", "w"]);
    assert_eq!(rm["removed"], "w", "{rm}");
    m.ok(&["ws", "create", "w2", "--dir", m.dir.path().join("w2").to_str().unwrap()]);
    let rm = m.json(&["ws", "rm", "w2", "--force"]);
    assert_eq!(rm["removed"], "w2", "{rm}");
    assert!(!m.ok(&["ws", "list"]).contains("w2"));
    let o = m.run(&["ws", "resume", "nope", m.dir.path().join("x").to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let e: serde_json::Value = serde_json::from_slice(&o.stderr).expect("one JSON object on stderr");
    assert_eq!((e["kind"].as_str(), e["exit_code"].as_i64()), (Some("user"), Some(1)), "{e}");
    assert!(e["error"].as_str().unwrap().contains("no workspace named nope"), "{e}");
    // Errors raised before a command runs are JSON too: a usage error,
    // a bad log level; --help still prints its text.
    for (args, says) in [
        (vec!["checkout", "--json"], "required arguments"),
        (vec!["ls", "main", "--no-such-flag", "--json"], "--no-such-flag"),
        (vec!["--json", "ls", "main", "--log-level", "chatty"], "chatty"),
    ] {
        let o = m.run(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
        let e: serde_json::Value = serde_json::from_slice(&o.stderr)
            .unwrap_or_else(|_| panic!("{args:?}: not one JSON object: {}", String::from_utf8_lossy(&o.stderr)));
        assert_eq!(e["kind"], "user", "{e}");
        assert!(e.to_string().contains(says), "{args:?}: {e}");
    }
    let o = m.run(&["ls", "--help", "--json"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("Usage"));
    // A store that does not answer: exit 2, kind "remote" (worth a retry).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let o = m
        .cmd(&["refs", "--json"])
        .env("MADO_REMOTE_ADDR", "s3://nobody/prefix")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{closed}"))
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ALLOW_HTTP", "true")
        .output()
        .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&o.stderr)
        .unwrap_or_else(|_| panic!("not one JSON object: {}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(
        (e["kind"].as_str(), e["exit_code"].as_i64(), o.status.code()),
        (Some("remote"), Some(2), Some(2)),
        "{e}"
    );
}

/// Under --json, progress is JSON lines on stderr (every line parses),
/// each naming the work, how far it is and its total.
#[test]
fn json_progress_is_a_stream_of_json_lines() {
    let m = Mado::local();
    setup(&m);
    empty_cache(&m);
    let out = m.dir.path().join("out");
    let o = m
        .cmd(&["checkout", "main", out.to_str().unwrap(), "--json"])
        .env("MADO_PROGRESS_INTERVAL_MS", "1")
        .env("MADO_INJECT_RTT_MS", "20")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is the JSON report alone");
    assert!(report["files"].as_u64().unwrap() > 5, "{report}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    assert!(!lines.is_empty(), "no progress line");
    assert!(lines.iter().all(|l| l["progress"] == "checking out" && l["done"].is_u64()), "{lines:?}");
}

/// Logging: --log-level (or MADO_LOG / RUST_LOG) turns on timestamped
/// lines on stderr; a word that is not a level is refused.
#[test]
fn log_level_shows_each_request_and_refuses_a_misspelt_level() {
    let m = Mado::local();
    setup(&m);
    let o = m.run(&["log", "main", "-n", "1", "--log-level", "debug"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.lines().any(|l| l.contains("DEBUG") && l.contains("GET") && l.contains("refs/main")), "{err}");
    let o = m.cmd(&["log", "main", "-n", "1"]).env("RUST_LOG", "debug").output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("DEBUG"), "RUST_LOG is honoured");
    // By default a command logs nothing on success.
    assert!(m.run(&["log", "main", "-n", "1"]).stderr.is_empty());
    assert!(m.fails(&["log", "main", "--log-level", "degub"], 1).contains("not a level"));
}

/// A name with a newline (or a quote, a tab, an escape) is printed quoted
/// with escapes, one line per entry, so that it cannot pass for another
/// line in `ls`, `diff` or `ws status`; `--json` gives it as it is.
#[test]
fn names_with_control_characters_are_quoted_one_per_line() {
    use std::io::Write;
    let m = Mado::local();
    let repo = m.dir.path().join("odd");
    init_repo(&repo);
    let stream = b"commit refs/heads/main\ncommitter a <a@b> 0 +0000\ndata 2\nx\n\
M 100644 inline \"new\\nline.txt\"\ndata 2\nn\n\
M 100644 inline \"D fake\\tpath\"\ndata 2\nt\n\
M 100644 inline plain.txt\ndata 2\np\n\n";
    let mut c = git_cmd(&repo).args(["fast-import", "--quiet"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
    c.stdin.take().unwrap().write_all(stream).unwrap();
    assert!(c.wait().unwrap().success());
    m.ok(&["import-git", repo.to_str().unwrap()]);
    let ls = m.ok(&["ls", "main"]);
    assert_eq!(ls.lines().count(), 3, "{ls}");
    assert!(ls.contains("\"new\\nline.txt\"") && ls.contains("\"D fake\\tpath\"") && ls.contains(" plain.txt"), "{ls}");
    let names: Vec<String> =
        m.json(&["ls", "main"]).as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect();
    assert!(names.contains(&"new\nline.txt".to_string()), "{names:?}");
    // A working copy that deletes them: `ws status` and `diff` quote too.
    let w = m.dir.path().join("w");
    m.ok(&["ws", "create", "odd", "--dir", w.to_str().unwrap()]);
    std::fs::remove_file(w.join("new\nline.txt")).unwrap();
    let st = m.ok(&["ws", "status", "--dir", w.to_str().unwrap()]);
    assert_eq!(st.trim_end(), "D \"new\\nline.txt\"", "{st}");
    m.ok(&["ws", "checkpoint", "--dir", w.to_str().unwrap()]);
    let d = m.ok(&["diff", "main", "ws/odd"]);
    assert_eq!(d.trim_end(), "D \"new\\nline.txt\"", "{d}");
}
