//! Exit codes and a closed stdout, in one place.
//!
//! - 0: done.
//! - 1: the user's to fix (bad input, a usage error, a lease held
//!   elsewhere, a local state to repair, a full disk, a read-only or
//!   forbidden place); the message says what to do.
//! - 2: mado's or the remote's (an internal error, a store that failed,
//!   a store a `mado gc` kept busy longer than a writer waits).
//! - 130: interrupted (Ctrl-C) while writing a tree: `checkout`,
//!   `materialize`, `ws create`, `ws resume` (128 + SIGINT, as a shell
//!   reports a command SIGINT killed).
//!
//! A closed stdout (`mado log | head -1`) ends the command quietly, as it
//! does for git and cat.

use mado_core::Error;

pub const OK: i32 = 0;
pub const USER: i32 = 1;
pub const INTERNAL: i32 = 2;
pub const INTERRUPTED: i32 = 130;

/// An error another mado process met and passed on (a mount daemon,
/// through its readiness pipe), with the code and kind it had there.
#[derive(Debug, serde::Serialize, serde::Deserialize, Clone)]
pub struct Relayed {
    pub message: String,
    pub causes: Vec<String>,
    pub code: i32,
    pub kind: String,
}

impl Relayed {
    /// What `e` would have been reported as in this process.
    pub fn of(e: &Error) -> Relayed {
        let code = if e.is_user_error() { USER } else { INTERNAL };
        let mut causes = Vec::new();
        let mut at: Option<&dyn std::error::Error> = std::error::Error::source(e);
        while let Some(c) = at {
            causes.push(c.to_string());
            at = c.source();
        }
        let message = crate::hint::with_hints(&e.to_string(), &e.next_steps());
        Relayed { message, causes, code, kind: kind_of(code, [e]).into() }
    }
}

impl std::fmt::Display for Relayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Relayed {}

/// The `kind` of an error with exit code `code`, whose mado errors are
/// `errs`: `busy` (a gc kept the store), `remote` (the store or the
/// network failed: worth a retry, unlike mado's own), `user` or `internal`.
fn kind_of<'a>(code: i32, errs: impl IntoIterator<Item = &'a Error>) -> &'static str {
    let (mut busy, mut remote) = (false, false);
    for m in errs {
        busy |= matches!(m.base(), Error::Busy(_));
        remote |= matches!(m.base(), Error::Remote { .. });
    }
    match code {
        _ if busy => "busy",
        INTERNAL if remote => "remote",
        USER => "user",
        _ => "internal",
    }
}

fn relayed(e: &anyhow::Error) -> Option<&Relayed> {
    e.chain().find_map(|c| c.downcast_ref::<Relayed>())
}

/// The code for a command's error: 1 if any cause is the user's to fix.
pub fn code_of(e: &anyhow::Error) -> i32 {
    if let Some(r) = relayed(e) {
        return r.code;
    }
    if e.chain().any(|c| c.downcast_ref::<Error>().is_some_and(|m| m.is_user_error())) {
        USER
    } else {
        INTERNAL
    }
}

/// The code for a command line clap refused: `--help` and `--version`
/// print to stdout and succeed; a usage error is the user's.
pub fn code_of_usage(e: &clap::Error) -> i32 {
    if e.use_stderr() {
        USER
    } else {
        OK
    }
}

/// Prints `e` once with each of its causes once, and returns its code.
/// Under `--json`, one JSON object on stderr instead: `error`, `causes`,
/// `exit_code` and `kind` (`user` or `internal`).
pub fn report(e: &anyhow::Error, json: bool) -> i32 {
    let code = code_of(e);
    // The steps past it, worded here (the core names them as data).
    let message = crate::hint::with_lines(&e.to_string(), crate::hint::lines(e));
    // Error types that print their source in their own message would
    // otherwise repeat it at every level.
    let mut shown = message.clone();
    let mut causes = Vec::new();
    let relayed_causes = relayed(e).map(|r| r.causes.clone()).unwrap_or_default();
    for c in e.chain().skip(1).map(|c| c.to_string()).chain(relayed_causes) {
        if shown.contains(&c) {
            continue;
        }
        shown.push_str(&c);
        causes.push(c);
    }
    if json {
        let mut v = json_error(&message, &causes, code);
        v["kind"] = match relayed(e) {
            Some(r) => r.kind.clone().into(),
            None => kind_of(code, e.chain().filter_map(|c| c.downcast_ref::<Error>())).into(),
        };
        // A held lease, for a script to wait on or steal: its fields as
        // numbers, not only the sentence.
        if let Some(Error::LeaseHeld { name, holder, expires, expired }) = e
            .chain()
            .find_map(|c| c.downcast_ref::<Error>().map(Error::base).filter(|m| matches!(m, Error::LeaseHeld { .. })))
        {
            v["lease"] = serde_json::json!({
                "workspace": name, "holder": holder, "expires": expires, "expired": expired,
            });
        }
        eprintln!("{v}");
        return code;
    }
    eprintln!("error: {message}");
    for c in causes {
        eprintln!("  caused by: {c}");
    }
    code
}

/// The one JSON object an error is under `--json`: `error`, `causes`,
/// `exit_code`, `kind` (`user`, `remote` for a store or network failure,
/// `busy` for a store a gc kept busy, or `internal`) and, when the message ends with hints (`\n  hint: …`
/// lines), `hints`, each without its prefix (and `error` without them).
fn json_error(error: &str, causes: &[impl serde::Serialize], code: i32) -> serde_json::Value {
    let mut parts = error.split("\n  hint: ");
    let error = parts.next().unwrap_or_default();
    let hints: Vec<&str> = parts.map(str::trim_end).collect();
    let mut v = serde_json::json!({
        "error": error,
        "causes": causes,
        "exit_code": code,
        "kind": kind_of(code, std::iter::empty()),
    });
    if !hints.is_empty() {
        v["hints"] = hints.into();
    }
    v
}

/// Reports an error raised before a command runs (a usage error clap
/// refused, a bad log level, a mount helper option): the same one JSON
/// object as [`report`] under `--json`, else the text as it is. `--help`
/// and `--version` print as usual.
pub fn report_early(text: &str, code: i32, json: bool) -> i32 {
    if json {
        let first = text.lines().next().unwrap_or_default();
        let error = first.strip_prefix("error: ").unwrap_or(first).trim();
        let rest: Vec<&str> = text.lines().skip(1).map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
        eprintln!("{}", json_error(error, &rest, code));
    } else {
        eprint!("{}", text);
        if !text.ends_with('\n') {
            eprintln!();
        }
    }
    code
}

/// Whether the command line asks for JSON, looked for before it is parsed
/// (so that a usage error can be JSON too): `--json` before any `--`.
pub fn wants_json(argv: &[std::ffi::OsString]) -> bool {
    argv.iter().skip(1).take_while(|a| *a != "--").any(|a| a == "--json")
}

/// A closed stdout kills the process quietly (SIGPIPE's default) instead
/// of every print failing with EPIPE. Not for the mount daemon, which must
/// outlive a control client that hangs up.
pub fn quiet_on_closed_stdout() {
    // SAFETY: called before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_leave_the_error_for_their_own_field() {
        let v = json_error("no such thing\n  hint: try this\n  hint: or that", &[] as &[String], USER);
        assert_eq!(v["error"], "no such thing");
        assert_eq!(v["hints"], serde_json::json!(["try this", "or that"]));
        assert_eq!(v["kind"], "user");
        let v = json_error("plain", &[] as &[String], INTERNAL);
        assert_eq!((v["error"].as_str(), v.get("hints"), v["kind"].as_str()), (Some("plain"), None, Some("internal")));
    }

    #[test]
    fn json_is_found_before_a_double_dash_only() {
        let v = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(wants_json(&v(&["mado", "ls", "--json"])));
        assert!(wants_json(&v(&["mado", "--json", "ls"])));
        assert!(!wants_json(&v(&["mado", "ls", "--", "--json"])));
        // The program's own name is not an argument.
        assert!(!wants_json(&v(&["--json", "ls"])));
    }

    #[test]
    fn each_kind_of_error_has_its_code() {
        let code = |e: Error| code_of(&anyhow::Error::from(e));
        assert_eq!(code(Error::User("bad input".into())), USER);
        assert_eq!(code(Error::NotFound("no ref x".into())), USER);
        assert_eq!(code(Error::LocalState { path: "p".into(), detail: "torn".into() }), USER);
        let held = Error::LeaseHeld { name: "w".into(), holder: "h".into(), expires: 0, expired: false };
        assert_eq!(code(held), USER);
        assert_eq!(code(Error::Internal("a bug".into())), INTERNAL);
        assert_eq!(code(Error::Io { context: "reading".into(), source: std::io::Error::other("x") }), INTERNAL);
        // A user error anywhere in the chain decides.
        let wrapped = anyhow::Error::from(Error::User("bad".into())).context("while importing");
        assert_eq!(code_of(&wrapped), USER);
    }
}
