//! Exit codes and a closed stdout, in one place.
//!
//! - 0: done.
//! - 1: the user's to fix (bad input, a usage error, a lease held
//!   elsewhere, a local state to repair); the message says what to do.
//! - 2: mado's or the remote's (an internal error, a store that failed).
//!
//! A closed stdout (`mado log | head -1`) ends the command quietly, as it
//! does for git and cat.

use mado_core::Error;

pub const OK: i32 = 0;
pub const USER: i32 = 1;
pub const INTERNAL: i32 = 2;

/// The code for a command's error: 1 if any cause is the user's to fix.
pub fn code_of(e: &anyhow::Error) -> i32 {
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
    // Error types that print their source in their own message would
    // otherwise repeat it at every level.
    let mut shown = e.to_string();
    let mut causes = Vec::new();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if shown.contains(&c) {
            continue;
        }
        shown.push_str(&c);
        causes.push(c);
    }
    if json {
        let v = serde_json::json!({
            "error": e.to_string(),
            "causes": causes,
            "exit_code": code,
            "kind": if code == USER { "user" } else { "internal" },
        });
        eprintln!("{v}");
        return code;
    }
    eprintln!("error: {e}");
    for c in causes {
        eprintln!("  caused by: {c}");
    }
    code
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
