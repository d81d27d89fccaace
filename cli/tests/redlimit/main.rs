//! The `redlimit` command run as a process, as an operator runs it, against private Redis
//! servers (single node and Cluster) from the library's test harness.

#[path = "../../../tests/support/mod.rs"]
mod support;

mod commands;
mod connection;
mod limited;
mod probes;

use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The binary under test, built by cargo for this test run.
const BINARY: &str = env!("CARGO_BIN_EXE_redlimit");

/// How long a command that must exit on its own may take (a bound on a hang, not a goal).
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `redlimit args` to its exit, with no `REDIS_URL` and no header secret in its
/// environment.
fn run_to_exit(args: &[&str]) -> Output {
    let mut child = Command::new(BINARY)
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("REDLIMIT_HEADER_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlimit");
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while child.try_wait().expect("poll redlimit").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("redlimit {args:?} did not exit");
        }
        thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("redlimit's output")
}

/// Runs each set of bad arguments and asserts a usage error: exit status 2, the expected words
/// on stderr, nothing on stdout.
fn assert_usage_errors(cases: &[(&[&str], &str)]) {
    for (args, message) in cases {
        let output = run_to_exit(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?} must exit 2: {stderr}"
        );
        assert!(
            stderr.contains(message),
            "{args:?}: stderr {stderr:?} should mention {message:?}"
        );
        assert!(output.stdout.is_empty(), "{args:?} printed on stdout");
    }
}
