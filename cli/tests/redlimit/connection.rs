//! How `redlimit` reaches Redis: `REDIS_URL`, a password file, a wrong password (exit 1, never
//! printed), TLS with a private CA and a client certificate, Sentinel; and what it prints
//! without Redis: `--help`, completions, one-line errors for a bad duration or quota.

use std::process::Output;
use std::time::Duration;

use redlimit::Limiter;

use crate::support::example::dead_redis_url;
use crate::support::sentinel::{RedisSentinel, MASTER_NAME};
use crate::support::{self, RedisServer, TlsFiles, TlsSetup};
use crate::{file_with, run};

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A Redis with the user `operator` (every command and key) whose password is `password`.
fn redis_with_operator(password: &str) -> RedisServer {
    let redis = RedisServer::start();
    crate::create_operator(&redis, password);
    redis
}

/// `REDIS_URL` names the Redis when no flag does, and `--password-file` gives the password of
/// the URL's user: the password is never on the command line.
#[tokio::test]
async fn redis_url_from_the_environment_and_a_password_file() {
    let redis = redis_with_operator("s3cret-from-a-file");
    let url = format!("redis://operator@127.0.0.1:{}/", redis.port());
    let password = file_with("s3cret-from-a-file\n");
    let path = password.path().to_str().unwrap();
    let output = run(
        &["--password-file", path, "suspend", "t", "1m"],
        &[("REDIS_URL", &url)],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).starts_with("suspend: \"t\" is denied on every instance for 1m\n"));
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    let status = limiter.inspect("t").await.unwrap();
    assert!(
        status.suspended_for.is_some(),
        "suspended through REDIS_URL"
    );

    // `inspect` and `limited` scan with the same password.
    let output = run(
        &["--password-file", path, "limited"],
        &[("REDIS_URL", &url)],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).starts_with("t (every route): suspended, "));
}

/// A wrong password exits 1 and is printed nowhere, whether in the URL or in a password file.
#[test]
fn a_wrong_password_exits_1_without_printing_it() {
    let redis = redis_with_operator("the-right-one");
    let wrong = "wr0ng-pa55word";
    let in_url = format!("redis://operator:{wrong}@127.0.0.1:{}/", redis.port());
    let file = file_with(wrong);
    let in_file = format!("redis://operator@127.0.0.1:{}/", redis.port());
    let path = file.path().to_str().unwrap();
    // Every node with the same wrong password (different ones are a usage error).
    let dead = dead_redis_url().replace("redis://", &format!("redis://operator:{wrong}@"));
    let cluster = in_url.clone() + "," + &dead;
    let cases: [Vec<&str>; 5] = [
        vec!["--redis", &in_url, "inspect", "k"],
        vec!["--redis", &in_url, "limited"],
        vec![
            "--redis",
            &in_file,
            "--password-file",
            path,
            "suspend",
            "k",
            "1m",
        ],
        vec!["--redis-cluster", &cluster, "limited"],
        vec!["--redis", &in_url, "--json", "limited", "--watch", "1s"],
    ];
    for args in cases {
        let output = run(&args, &[]);
        let (out, err) = (stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            !err.contains(wrong) && !out.contains(wrong),
            "{args:?}: {err}{out}"
        );
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// A bad duration or quota is one line on stderr, exit 2, before anything is sent.
#[test]
fn a_bad_duration_or_quota_exits_2_with_one_line() {
    let redis = RedisServer::start();
    let url = redis.url();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--redis", &url, "suspend", "k", "ten minutes"],
            "is not a duration",
        ),
        (&["--redis", &url, "suspend", "k", "0s"], "more than 0"),
        (
            &["--redis", &url, "set-quota", "k", "10/1s", "5/forever"],
            "is not a duration",
        ),
        (
            &["--redis", &url, "set-quota", "k", "lots/1m"],
            "whole number",
        ),
    ];
    for (args, message) in cases {
        let output = run(args, &[]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.starts_with("error: ") && err.contains(message), "{err}");
        assert!(output.stdout.is_empty());
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// `--help` for the command and every subcommand, and completions for the shells.
#[test]
fn help_and_completions_are_generated() {
    let commands = [
        "inspect",
        "limited",
        "set-quota",
        "clear-quota",
        "suspend",
        "resume",
        "reset",
        "completions",
    ];
    let output = run(&["--help"], &[]);
    assert!(output.status.success());
    let help = stdout(&output);
    for command in commands {
        assert!(help.contains(command), "{command} in {help}");
        let output = run(&[command, "--help"], &[]);
        assert!(output.status.success(), "{command} --help");
        assert!(stdout(&output).contains("Usage: redlimit "), "{command}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let output = run(&["completions", shell], &[]);
        assert!(output.status.success(), "{shell}: {}", stderr(&output));
        let script = stdout(&output);
        assert!(
            script.contains("set-quota") && script.contains("redis-cluster"),
            "{shell}"
        );
    }
}

/// `rediss://` with a private CA and a client certificate (mutual TLS).
#[tokio::test]
async fn tls_with_a_private_ca_and_a_client_certificate() {
    let files = TlsFiles::generate("redlimit-cli");
    let redis = RedisServer::start_tls(&TlsSetup::new(&files, true));
    let url = redis.tls_url();
    let (ca, cert, key) = (files.ca(), files.client_cert(), files.client_key());
    let tls = [
        "--tls-ca",
        ca.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let mut args = vec!["--redis", &url];
    args.extend(tls);
    let suspend: Vec<&str> = args.iter().copied().chain(["suspend", "t", "1m"]).collect();
    let output = run(&suspend, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let limited: Vec<&str> = args.iter().copied().chain(["limited"]).collect();
    let output = run(&limited, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).starts_with("t (every route): suspended, "));

    // Without the client certificate the server refuses: exit 1.
    let output = run(&["--redis", &url, "--tls-ca", tls[1], "inspect", "t"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
}

/// Through Sentinel: the primary it names takes the control, and its keys are scanned.
#[tokio::test]
async fn sentinel_names_the_primary() {
    let sentinel = RedisSentinel::start();
    let sentinels = sentinel.sentinel_urls().join(",");
    let args = ["--sentinel", &sentinels, "--service", MASTER_NAME];
    let suspend: Vec<&str> = args.iter().copied().chain(["suspend", "t", "1m"]).collect();
    let output = run(&suspend, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let limiter: Limiter = support::Ctx::default().redis(&sentinel.master);
    let status = limiter.inspect("t").await.unwrap();
    assert!(
        status
            .suspended_for
            .is_some_and(|left| left > Duration::ZERO),
        "on the primary"
    );
    let limited: Vec<&str> = args.iter().copied().chain(["limited"]).collect();
    let output = run(&limited, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).starts_with("t (every route): suspended, "));
}
