//! An example binary (`examples/NAME.rs`) run as a user runs it: built once per test run, started
//! on a free port, its `listening on ADDR` awaited, its stdout and stderr kept for assertions.
//! Shared by the example-driving tests (`tests/examples/`); the CLI's tests run their command
//! with its helpers too.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::free_port;

/// How long an example may take to print `listening on` (or to exit).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A Redis URL on which nothing listens.
pub fn dead_redis_url() -> String {
    format!("redis://127.0.0.1:{}/", free_port())
}

/// The binary of `cargo run --example NAME`, built once per test run with this test's profile.
pub fn example_binary(name: &str) -> PathBuf {
    static BINARIES: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BINARIES.get_or_init(Default::default).lock().unwrap();
    if let Some(binary) = built.get(name) {
        return binary.clone();
    }
    // A test runs from <target>/<profile>/deps/; examples land in <target>/<profile>/examples/.
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable inside <target>/<profile>/deps")
        .to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let output = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", name, "--profile", &profile])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run cargo build --example {name}: {e}"));
    assert!(
        output.status.success(),
        "cargo build --example {name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let binary = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(binary.exists(), "no example binary at {}", binary.display());
    built.insert(name.to_owned(), binary.clone());
    binary
}

/// Runs the example `name` with each set of bad flags and asserts a usage error: exit status 2,
/// the expected words on stderr, and no server started.
pub fn assert_usage_errors(name: &str, cases: &[(&[&str], &str)]) {
    for (args, message) in cases {
        let output = run_to_exit(name, args);
        assert_usage_error(&output, args, message);
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("listening on"),
            "{args:?} must not start the server"
        );
    }
}

/// The words of `line`, split at white space; a word in single quotes is kept whole, spaces and
/// all (`'--key ip|api-key'`).
pub fn words(line: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let (word, after) = match rest.strip_prefix('\'') {
            Some(quoted) => quoted.split_once('\'').expect("a closing quote"),
            None => rest.split_once(char::is_whitespace).unwrap_or((rest, "")),
        };
        words.push(word);
        rest = after.trim_start();
    }
    words
}

/// The line an example prints at start when it uses the Redis at `url`: the URL and the
/// installed server's version, as the example verified it.
pub fn redis_store_line(url: &str) -> String {
    format!(
        "store: redis {url} (Redis {})",
        super::redis_server_version()
    )
}

/// The `--help` text of the example `name`, asserting that it exits 0 and holds every one of
/// [`words`]`(phrases)`.
pub fn help_naming(name: &str, phrases: &str) -> String {
    let output = run_to_exit(name, &["--help"]);
    let usage = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{name} --help: {usage}");
    for word in words(phrases) {
        assert!(usage.contains(word), "usage lacks {word}: {usage}");
    }
    usage
}

/// Asserts that `usage` names every algorithm.
pub fn assert_names_every_algorithm(usage: &str) {
    for algorithm in redlimit::Algorithm::ALL {
        assert!(usage.contains(algorithm.name()), "usage lacks {algorithm}");
    }
}

/// Runs the example to completion (for flags that must make it exit), with `REDIS_URL` dead.
pub fn run_to_exit(name: &str, args: &[&str]) -> Output {
    let mut command = Command::new(example_binary(name));
    command
        .args(args)
        .env("REDIS_URL", dead_redis_url())
        .stdin(Stdio::null());
    output_within(
        &mut command,
        START_TIMEOUT,
        &format!("the example {name} with {args:?}"),
    )
}

/// Runs `command` to its exit, its stdout and stderr piped and kept; kills it and panics,
/// naming it `what`, if it runs longer than `timeout` (a bound on a hang).
pub fn output_within(command: &mut Command, timeout: Duration, what: &str) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("poll the child").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not exit");
        }
        thread::sleep(Duration::from_millis(20));
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("collect the output of {what}: {e}"))
}

/// The stderr of `output`, asserting it exited with `code` (`what` names the run).
pub fn stderr_of_exit(output: &Output, code: i32, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{what}: {stderr}");
    stderr
}

/// Asserts that `output`, of a run with `args`, is a usage error: exit status 2 and `message`
/// on stderr.
pub fn assert_usage_error(output: &Output, args: &[&str], message: &str) {
    let stderr = stderr_of_exit(output, 2, &format!("{args:?} must exit 2"));
    assert!(
        stderr.contains(message),
        "{args:?}: stderr {stderr:?} should mention {message:?}"
    );
}

/// A running example server; killed on drop.
pub struct Example {
    child: Child,
    /// The address after `listening on`.
    pub addr: SocketAddr,
    /// The stdout lines up to and including `listening on ADDR`.
    pub stdout: Vec<String>,
    /// Everything on stderr so far.
    pub stderr: Arc<Mutex<String>>,
}

impl Example {
    /// Starts example `name` on a free port (`--bind 127.0.0.1:0`) with the [`words`] of `flags`
    /// and `envs` (`RUST_LOG=warn` unless given) and waits for `listening on ADDR`.
    pub fn start(name: &str, flags: &str, envs: &[(&str, &str)]) -> Example {
        let mut command = Command::new(example_binary(name));
        command
            .args(["--bind", "127.0.0.1:0"])
            .args(words(flags))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in envs {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("spawn the example");

        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        thread::spawn(move || {
            let mut buffer = [0; 4096];
            while let Ok(n @ 1..) = err_pipe.read(&mut buffer) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        let lines = stdout_lines(&mut child);

        let mut example = Example {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            stdout: Vec::new(),
            stderr,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    let listening = line.strip_prefix("listening on ").map(str::to_owned);
                    example.stdout.push(line);
                    if let Some(addr) = listening {
                        example.addr = addr.parse().expect("an address after `listening on`");
                        return example;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no `listening on` line in time; {}", example.output())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = example.child.wait().expect("wait for the example");
                    panic!("the example exited with {status}; {}", example.output())
                }
            }
        }
    }

    /// Asserts that the example printed `line` on stdout before it was ready.
    pub fn assert_printed(&self, line: &str) {
        let printed = self.stdout.iter().any(|l| l == line);
        assert!(printed, "no line {line:?}; {}", self.output());
    }

    /// Asserts that the example printed a line starting with `prefix` before it was ready.
    pub fn assert_printed_starting(&self, prefix: &str) {
        let printed = self.stdout.iter().any(|l| l.starts_with(prefix));
        assert!(printed, "no line starting {prefix:?}; {}", self.output());
    }

    /// The output so far, for failure messages.
    pub fn output(&self) -> String {
        format!(
            "stdout so far:\n{}\nstderr:\n{}",
            self.stdout.join("\n"),
            self.stderr.lock().unwrap()
        )
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's stdout (piped), line by line, from a reader thread.
pub fn stdout_lines(child: &mut Child) -> Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}
