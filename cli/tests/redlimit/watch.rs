//! `limited --watch`'s output and end: one JSON array per refresh, exit 0 on Ctrl-C, exit 1
//! when Redis dies between refreshes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::RedisServer;
use crate::{a_limited_tenant, exit_of, watch, EXIT_TIMEOUT};

/// `--json limited --watch` into a pipe: one JSON array per refresh, one a line, no heading.
#[tokio::test]
async fn watch_json_is_one_array_per_refresh() {
    let redis = RedisServer::start();
    a_limited_tenant(&redis).await;
    let args = [
        "--redis",
        &redis.url(),
        "--json",
        "limited",
        "--watch",
        "50ms",
    ];
    let mut child = crate::spawn(&args, Stdio::null());
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = lines.next().expect("a refresh").expect("a line");
        let rows: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(rows.as_array().map(Vec::len), Some(1), "{line}");
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Ctrl-C (SIGINT) ends `limited --watch` with exit 0.
#[test]
fn watch_ends_on_ctrl_c() {
    let redis = RedisServer::start();
    let (child, lines) = watch(&redis.url(), "1h");
    let first = lines.recv_timeout(EXIT_TIMEOUT).expect("a first refresh");
    assert!(first.starts_with("refresh 1, every 1h"), "{first}");
    let _ = lines.recv_timeout(EXIT_TIMEOUT).expect("its list");
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (code, stderr) = exit_of(child);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Redis killed between two refreshes: `limited --watch` exits 1 with a message, no hang.
#[test]
fn watch_exits_1_when_redis_dies() {
    let mut redis = RedisServer::start();
    let (child, lines) = watch(&redis.url(), "200ms");
    let first = lines.recv_timeout(EXIT_TIMEOUT).expect("a first refresh");
    assert!(first.starts_with("refresh 1, "), "{first}");
    redis.stop();
    let (code, stderr) = exit_of(child);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.starts_with("error: Redis at "), "{stderr}");
}
