//! The `redlimit` command run as a process, as an operator runs it, against private Redis
//! servers (single node and Cluster) from the library's test harness.

#[path = "../../../tests/support/mod.rs"]
mod support;

mod commands;
mod connection;
mod dead_master;
mod hashed_probes;
mod limited;
mod probes;
mod secrets;

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

/// Runs `redlimit` with `flags` (those that name the Redis) and `args`, asserting it succeeds:
/// its stdout.
fn run_ok(flags: &[&str], args: &[&str]) -> String {
    let output = run_on(flags, args);
    stdout_of_success(&output, &format!("{args:?}"))
}

/// Runs `redlimit` with `flags` (those that name the Redis) and `args`.
fn run_on(flags: &[&str], args: &[&str]) -> Output {
    let output = redlimit_command().args(flags).args(args).output();
    output.expect("run redlimit")
}

/// A private single node or Cluster, a limiter on it, and the flags that point `redlimit` at it.
struct Deployment {
    servers: (Option<support::RedisServer>, Option<support::RedisCluster>),
    limiter: redlimit::Limiter,
    flags: [String; 2],
}

impl Deployment {
    fn single_node() -> Deployment {
        let redis = support::RedisServer::start();
        Deployment {
            limiter: support::Ctx::default().redis(&redis),
            flags: ["--redis".to_owned(), redis.url()],
            servers: (Some(redis), None),
        }
    }

    fn cluster() -> Deployment {
        let cluster = support::RedisCluster::start();
        Deployment {
            limiter: support::Ctx::default().cluster(&cluster),
            flags: ["--redis-cluster".to_owned(), cluster.urls().join(",")],
            servers: (None, Some(cluster)),
        }
    }

    /// The single node.
    fn node(&self) -> &support::RedisServer {
        self.servers.0.as_ref().expect("a single node")
    }

    /// The flags that point `redlimit` at these servers.
    fn flags(&self) -> [&str; 2] {
        self.flags.each_ref().map(String::as_str)
    }
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

/// Runs each set of bad arguments and asserts a usage error: exit status 2, the expected words
/// on stderr, nothing on stdout.
///
/// A case is a command line, split at spaces; a word in single quotes is kept whole (`'bad name'`)
/// and the word `DEAD` stands for `dead`.
fn assert_usage_errors(cases: &[(&str, &str)], dead: &str) {
    for (line, message) in cases {
        let words = support::example::words(line).into_iter();
        let args: Vec<&str> = words.map(|w| if w == "DEAD" { dead } else { w }).collect();
        let output = run_to_exit(&args);
        support::example::assert_usage_error(&output, &args, message);
        assert!(output.stdout.is_empty(), "{args:?} printed on stdout");
    }
}
