//! The `redlimit` command run as a process, as an operator runs it, against private Redis
//! servers (single node and Cluster) from the library's test harness.

#[path = "../../../tests/support/mod.rs"]
mod support;

mod commands;
mod connection;
mod dead_master;
mod exit_codes;
mod hashed_names;
mod limited;
mod passwords;
mod secrets;
mod stored_keys;
mod tenants;
mod watch;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlimit::{Limiter, Quota, Target};

use support::RedisServer;

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

/// Runs `redlimit args` with exactly `envs` of the Redis settings, to its exit or
/// [`EXIT_TIMEOUT`] (then it panics: a hang); returns the output and how long it took.
fn run_timed(args: &[&str], envs: &[(&str, &str)]) -> (Output, Duration) {
    run_within(args, envs, EXIT_TIMEOUT)
}

/// [`run_timed`] with another bound on a hang.
fn run_within(args: &[&str], envs: &[(&str, &str)], bound: Duration) -> (Output, Duration) {
    let mut command = Command::new(crate::BINARY);
    command
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("REDLIMIT_HEADER_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in envs {
        command.env(name, value);
    }
    let started = Instant::now();
    let mut child = command.spawn().expect("spawn redlimit");
    // Read both pipes while waiting: a large output must not block the child.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = out.read_to_end(&mut bytes);
        bytes
    });
    let err = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = err.read_to_end(&mut bytes);
        bytes
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll redlimit") {
            break status;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            panic!("redlimit {args:?} did not exit within {bound:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    let output = Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    };
    (output, took)
}

/// Runs `redlimit args` with exactly `envs` of the Redis settings (see [`run_timed`]).
fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    run_timed(args, envs).0
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `redlimit --redis URL args` (see [`run`]), with no other Redis setting.
fn run_at(url: &str, args: &[&str]) -> Output {
    run(&[&["--redis", url], args].concat(), &[])
}

/// Runs it against `redis`, asserting exit 0; returns the output.
fn ok_output(redis: &RedisServer, args: &[&str]) -> Output {
    let output = run_at(&redis.url(), args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    output
}

/// Runs it against `redis`, asserting exit 0; returns stdout.
fn ok(redis: &RedisServer, args: &[&str]) -> String {
    text(&ok_output(redis, args).stdout)
}

/// Spawns `redlimit args` (see [`redlimit_command`]) with its stdout a pipe, and `stderr`.
fn spawn(args: &[&str], stderr: Stdio) -> std::process::Child {
    let command = redlimit_command()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn();
    command.expect("spawn redlimit")
}

/// A limited tenant (its quota spent on a layer's route) beside the hostile keys, so the
/// listing still has a row to show.
async fn a_limited_tenant(redis: &RedisServer) -> String {
    let limiter: Limiter = support::Ctx::default().redis(redis);
    let quota = Quota::per_hour(2).unwrap();
    let scope = "default:token-bucket:2/3600s";
    for _ in 0..2 {
        let verdict = limiter
            .check_quotas(Target::scoped(scope, "spent"), &quota.into(), 1)
            .await;
        assert!(verdict.is_allowed());
    }
    scope.to_owned()
}

/// Spawns `limited --watch INTERVAL` on `url`; its stdout lines arrive on the receiver.
fn watch(url: &str, interval: &str) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = spawn(
        &["--redis", url, "limited", "--watch", interval],
        Stdio::piped(),
    );
    let lines = support::example::stdout_lines(&mut child);
    (child, lines)
}

/// Adds to `node` the user `operator` (every command and key) whose password is `password`.
fn create_operator(node: &RedisServer, password: &str) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("operator")
        .arg("on")
        .arg(format!(">{password}"))
        .arg("~*")
        .arg("+@all")
        .query(&mut node.conn())
        .expect("ACL SETUSER");
}

/// A file holding `content`, removed on drop.
fn file_with(content: impl AsRef<[u8]>) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
    file.write_all(content.as_ref()).expect("write it");
    file
}

/// Writes `value` at the raw key `name` (any bytes).
fn set_raw(redis: &RedisServer, name: &[u8], value: &[u8]) {
    let _: () = redis::cmd("SET")
        .arg(name)
        .arg(value)
        .query(&mut redis.conn())
        .unwrap();
}

/// A control character other than a line end: what a terminal would act on.
fn assert_no_control_bytes(what: &str, bytes: &[u8]) {
    let bad: Vec<u8> = bytes
        .iter()
        .copied()
        .filter(|&b| (b < 0x20 && b != b'\n') || b == 0x7f)
        .collect();
    assert!(
        bad.is_empty(),
        "{what} printed raw control bytes {bad:x?}: {:?}",
        text(bytes)
    );
}

/// Waits for the child's exit (a bound on a hang); its code and stderr.
fn exit_of(mut child: std::process::Child) -> (Option<i32>, String) {
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
            return (status.code(), stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("limited --watch did not exit");
        }
        thread::sleep(Duration::from_millis(10));
    }
}
