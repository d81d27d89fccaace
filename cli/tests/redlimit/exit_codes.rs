//! What `redlimit`'s exit status tells: 2 for bad arguments, before any connection; 1 for a
//! Redis dead, silent, asleep or refusing `SCAN`, or a `REDIS_URL` that does not parse, each
//! within its bound; not a failure for a slow link or a reader that stops reading.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redlimit::Limiter;

use crate::support::example::dead_redis_url;
use crate::support::{self, RedisServer};
use crate::{a_limited_tenant, run, run_at, run_timed, text, EXIT_TIMEOUT};

/// Bad arguments exit 2, with nothing on stdout, before any connection; ours are one line.
#[test]
fn bad_arguments_exit_2() {
    let redis = RedisServer::start();
    let url = redis.url();
    let u = url.as_str();
    // (args, words on stderr, one line: not one of clap's usage errors)
    let cases: &[(&[&str], &str, bool)] = &[
        (
            &["--bogus", "limited"],
            "unexpected argument '--bogus'",
            false,
        ),
        (&[], "Usage: redlimit", false),
        (&["--redis", u], "requires a subcommand", false),
        (&["--redis", u, "suspend", "k"], "<DURATION>", false),
        (&["--redis", u, "suspend"], "<KEY>", false),
        (&["--redis", u, "suspend", "", "1s"], "<KEY>", false),
        (&["--redis", u, "suspend", "k", "0s"], "more than 0", true),
        (&["--redis", u, "suspend", "k", "0ms"], "more than 0", true),
        (
            &["--redis", u, "suspend", "k", "-1s"],
            "unexpected argument '-1'",
            false,
        ),
        (
            &["--redis", u, "suspend", "k", "--", "-1s"],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "suspend", "k", "1e30s"],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "suspend", "k", "99999999999999999999d"],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "suspend", "k", "18446744073709551615ms"],
            "30 days",
            true,
        ),
        (
            &["--redis", u, "suspend", "k", "18446744073709551616ms"],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "suspend", "k", "307445734561825861m"],
            "is not a duration",
            true,
        ),
        (&["--redis", u, "suspend", "k", "721h"], "30 days", true),
        (
            &["--redis", u, "suspend", "k", "\u{ff13}\u{ff10}s"],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "suspend", "k", ""],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "suspend", "k", " 30s"],
            "is not a duration",
            true,
        ),
        (&["--redis", u, "set-quota", "k"], "<N/DURATION>", false),
        (
            &["--redis", u, "set-quota", "k", ""],
            "is not N/DURATION",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "0/1s"],
            "at least 1",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "10/0s"],
            "more than 0",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "18446744073709551616/1s"],
            "whole number",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "18446744073709551615/1s"],
            "at most 10^15",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "1/18446744073709551615ms"],
            "100 years",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "1/1s/1s"],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "1e3/1s"],
            "whole number",
            true,
        ),
        (
            &["--redis", u, "set-quota", "k", "\u{0661}/1s"],
            "whole number",
            true,
        ),
        (
            &["--redis", u, "limited", "--watch", "0s"],
            "more than 0",
            true,
        ),
        (
            &["--redis", u, "limited", "--watch", "soon"],
            "is not a duration",
            true,
        ),
        (
            &["--redis", u, "--prefix", "", "limited"],
            "--prefix must not be empty",
            true,
        ),
        (
            &["--redis", u, "--prefix", "a{b", "limited"],
            "key prefix",
            true,
        ),
        (
            &["--redis", u, "--scope", "", "inspect", "k"],
            "--scope must not be empty",
            true,
        ),
        (
            &["--redis", u, "--algorithm", "nope", "limited"],
            "unknown algorithm",
            false,
        ),
        (
            &["--redis", u, "--header", "bad header", "inspect", "k"],
            "not a header name",
            true,
        ),
        (
            &["--redis", u, "--header", "x-api-key", "inspect", "k\n1"],
            "not a valid",
            true,
        ),
        (&["--redis", "", "limited"], "invalid URL", true),
        (&["--redis", "not a url", "limited"], "invalid URL", true),
        (
            &["--redis", "http://127.0.0.1/", "limited"],
            "invalid URL",
            true,
        ),
        (
            &["--redis", "redis://127.0.0.1:99999/", "limited"],
            "invalid URL",
            true,
        ),
        (
            &["--redis", "redis://127.0.0.1/abc", "limited"],
            "invalid URL",
            true,
        ),
        (
            &["--redis", u, "--redis-cluster", u, "limited"],
            "cannot be used with",
            false,
        ),
        (&["--sentinel", u, "limited"], "--service", false),
        (&["--service", "mymaster", "limited"], "--sentinel", false),
        (
            &["--redis-cluster", ",", "limited"],
            "needs at least one URL",
            true,
        ),
        (&["limited"], "give the limiters' Redis", true),
        (
            &["--redis", u, "completions", "tcsh"],
            "invalid value 'tcsh'",
            false,
        ),
    ];
    for (args, words, one_line) in cases {
        let output = run(args, &[]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(words),
            "{args:?}: {stderr:?} lacks {words:?}"
        );
        assert!(output.stdout.is_empty(), "{args:?} printed on stdout");
        if *one_line {
            assert!(
                stderr.starts_with("error: ") && stderr.lines().count() == 1,
                "{args:?}: not one line: {stderr:?}"
            );
        }
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// Nothing listens, or a listener never answers: exit 1, with the reason, well before the
/// hang bound.
#[test]
fn a_dead_or_silent_redis_exits_1() {
    // Accepts connections and never answers; holds them until the test ends.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("redis://127.0.0.1:{}/", silent.local_addr().unwrap().port());
    let (held, accepted) = mpsc::channel::<TcpStream>();
    thread::spawn(move || {
        for stream in silent.incoming().map_while(Result::ok) {
            if held.send(stream).is_err() {
                break;
            }
        }
    });
    let dead = dead_redis_url();
    for (url, words) in [(&dead, "Connection refused"), (&silent_url, "timed out")] {
        for command in [&["limited"][..], &["inspect", "k"], &["suspend", "k", "1m"]] {
            let mut args = vec!["--redis", url.as_str()];
            args.extend_from_slice(command);
            let (output, took) = run_timed(&args, &[]);
            let stderr = text(&output.stderr);
            eprintln!("{args:?}: exit {:?} after {took:?}", output.status.code());
            assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.starts_with("error: ") && stderr.contains(words),
                "{args:?}: {stderr}"
            );
        }
    }
    drop(accepted);
}

/// A Redis blocked by `DEBUG SLEEP`: the command gives up (exit 1) while it still sleeps.
#[test]
fn a_sleeping_redis_does_not_hang_the_command() {
    let redis = RedisServer::start();
    let sleep = Duration::from_secs(25);
    let _asleep = redis.debug_sleep(sleep);
    let url = redis.url();
    for command in [&["suspend", "k", "1m"][..], &["limited"]] {
        let mut args = vec!["--redis", url.as_str()];
        args.extend_from_slice(command);
        let (output, took) = run_timed(&args, &[]);
        eprintln!("{args:?}: exit {:?} after {took:?}", output.status.code());
        assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
        assert!(text(&output.stderr).contains("timed out"));
    }
}

/// Forwards connections to `upstream`, each reply `delay` late: Redis as an operator across a
/// VPN or an ocean sees it.
fn slow_proxy(upstream: u16, delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            let pipe = |mut from: TcpStream, mut to: TcpStream, delay: Duration| {
                thread::spawn(move || {
                    let mut buffer = [0u8; 65536];
                    while let Ok(n @ 1..) = from.read(&mut buffer) {
                        thread::sleep(delay);
                        if to.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            };
            pipe(
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                Duration::ZERO,
            );
            pipe(server, client, delay);
        }
    });
    port
}

/// 150 ms between the operator and Redis is a slow link, not Redis trouble: every command still
/// works (and a suspension that took effect is not reported as a failure).
#[tokio::test]
async fn a_slow_link_to_redis_is_not_a_failure() {
    let redis = RedisServer::start();
    let port = slow_proxy(redis.port(), Duration::from_millis(150));
    let url = format!("redis://127.0.0.1:{port}/");
    for command in [
        &["suspend", "t", "1m"][..],
        &["inspect", "t"],
        &["limited"],
        &["resume", "t"],
    ] {
        let output = run_at(&url, command);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{command:?} through a 150 ms link: {}",
            text(&output.stderr)
        );
    }
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    assert_eq!(limiter.inspect("t").await.unwrap().suspended_for, None);
}

/// A `REDIS_URL` that does not parse is named as such, not as a `--redis` never given.
#[test]
fn a_bad_redis_url_variable_is_named() {
    let output = run(&["limited"], &[("REDIS_URL", "not a url")]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: REDIS_URL: invalid URL"),
        "{stderr}"
    );
}

/// As the README's service user (no `+scan`), every command that scans exits 1 naming the
/// rule it lacks, `--json` and `--watch` included; the controls still work.
#[test]
fn the_services_user_is_told_it_lacks_scan() {
    let redis = RedisServer::start();
    let readme = include_str!("../../../README.md");
    let rules = readme
        .lines()
        .find_map(|line| line.strip_prefix("ACL SETUSER limiter "))
        .expect("the README's service line")
        .replace(">PASSWORD", ">pw-service");
    let mut acl = redis::cmd("ACL");
    acl.arg("SETUSER").arg("limiter");
    for rule in rules.split_whitespace() {
        acl.arg(rule);
    }
    let _: () = acl.query(&mut redis.conn()).unwrap();
    let url = format!("redis://limiter:pw-service@127.0.0.1:{}/", redis.port());
    for command in [
        &["inspect", "t"][..],
        &["--json", "inspect", "t"],
        &["limited"],
        &["--json", "limited"],
        &["limited", "--watch", "1s"],
    ] {
        let output = run_at(&url, command);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{command:?}: {stderr}");
        assert!(
            stderr.contains("(the user needs +scan: see the README"),
            "{command:?}: {stderr}"
        );
        assert!(!stderr.contains("pw-service"), "{stderr}");
    }
    let output = run(&["--redis", &url, "suspend", "t", "1m"], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
}

/// Runs `redlimit args` with its stdout a pipe closed at once (`| head -0`): the command ends,
/// without a panic, with exit 0.
fn run_into_a_closed_pipe(args: &[&str]) -> Output {
    let mut child = crate::spawn(args, Stdio::piped());
    drop(child.stdout.take());
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{args:?} did not exit");
        thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A reader that stops reading (`redlimit ... | head -1`) ends the command: no panic (exit
/// 101), the documented exit 0; `limited --watch` stops too.
#[tokio::test]
async fn a_closed_stdout_is_not_a_panic() {
    let redis = RedisServer::start();
    let route = a_limited_tenant(&redis).await;
    let url = redis.url();
    for args in [
        &["completions", "bash"][..],
        &["--redis", &url, "inspect", "spent", "--scope", &route],
        &["--redis", &url, "--json", "limited"],
        &["--redis", &url, "limited", "--watch", "50ms"],
        &["--redis", &url, "suspend", "t", "1m"],
    ] {
        let output = run_into_a_closed_pipe(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
