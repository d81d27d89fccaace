//! The `redlimit` command run as a process, as an operator runs it, against private Redis
//! servers (single node and Cluster) from the library's test harness.

#[path = "../../../tests/support/mod.rs"]
mod support;

mod commands;
mod connection;
mod limited;
mod probes;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The binary under test, built by cargo for this test run.
const BINARY: &str = env!("CARGO_BIN_EXE_redlimit");

/// How long a command that must exit on its own may take (a bound on a hang, not a goal).
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `redlimit args` to its exit, with no `REDIS_URL` and no header secret in its
/// environment.
fn run_to_exit(args: &[&str]) -> Output {
    let what = format!("redlimit {args:?}");
    support::example::output_within(redlimit_command().args(args), EXIT_TIMEOUT, &what)
}

/// The binary under test with no `REDIS_URL`, no header secret and no stdin.
fn redlimit_command() -> Command {
    let mut command = Command::new(BINARY);
    command
        .env_remove("REDIS_URL")
        .env_remove("REDLIMIT_HEADER_SECRET")
        .stdin(Stdio::null());
    command
}

/// The stdout of `output`, asserting it succeeded (`what` names the run).
fn stdout_of_success(output: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed with {}: {stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The words of `line` as [`assert_usage_errors`] reads them.
fn command_words(line: &str, dead: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let (word, after) = match rest.strip_prefix('\'') {
            Some(quoted) => quoted.split_once('\'').expect("a closing quote"),
            None => rest.split_once(' ').unwrap_or((rest, "")),
        };
        words.push(if word == "DEAD" { dead } else { word }.to_owned());
        rest = after.trim_start();
    }
    words
}

/// Runs each set of bad arguments and asserts a usage error: exit status 2, the expected words
/// on stderr, nothing on stdout.
///
/// A case is a command line, split at spaces; a word in single quotes is kept whole (`'bad name'`)
/// and the word `DEAD` stands for `dead`.
fn assert_usage_errors(cases: &[(&str, &str)], dead: &str) {
    for (line, message) in cases {
        let args = command_words(line, dead);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = run_to_exit(&args);
        support::example::assert_usage_error(&output, &args, message);
        assert!(output.stdout.is_empty(), "{args:?} printed on stdout");
    }
}
