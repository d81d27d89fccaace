//! Credentials with least privilege: the limiter works as an ACL user that may run only the
//! commands the scripts and the client need, only on keys under its prefix (the line the
//! README gives), and a wrong password is a clear error that never loops hot.

mod support;

use std::time::{Duration, Instant};

use redlimit::store::{RedisStore, StoreError};
use redlimit::{Algorithm, FailClosed, Limiter, Quota, Verdict};
use support::{info_field, RedisServer};

/// The README's ACL line for the limiter's user (read from the README, so the two cannot
/// drift apart), with `PASSWORD` replaced by the test's password.
fn acl_rules() -> String {
    let readme = include_str!("../README.md");
    let line = readme
        .lines()
        .find_map(|l| l.strip_prefix("ACL SETUSER limiter "))
        .expect("the README gives the ACL SETUSER line for the limiter's user");
    line.replace(">PASSWORD", ">s3cret-pass")
}

fn create_user(redis: &RedisServer) {
    let mut admin = redis.conn();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg("limiter");
    for rule in acl_rules().split_whitespace() {
        cmd.arg(rule);
    }
    let _: () = cmd.query(&mut admin).expect("ACL SETUSER");
}

fn url_for(redis: &RedisServer, password: &str) -> String {
    format!("redis://limiter:{password}@127.0.0.1:{}/", redis.port())
}

#[tokio::test]
async fn the_limiter_works_as_the_least_privileged_user() {
    let redis = RedisServer::start();
    create_user(&redis);
    // From the URL, and from the builder.
    let from_url = RedisStore::new(url_for(&redis, "s3cret-pass")).unwrap();
    let from_builder = RedisStore::builder(redis.url())
        .credentials(Some("limiter"), "s3cret-pass")
        .build()
        .unwrap();
    for (i, store) in [from_url, from_builder].into_iter().enumerate() {
        let server = store.verify().await.expect("verified as the ACL user");
        assert!(server.version.is_some(), "HELLO is allowed: {server:?}");
        for &algorithm in Algorithm::ALL {
            let limiter = Limiter::builder(store.clone())
                .algorithm(algorithm)
                .build()
                .unwrap();
            let quota = Quota::per_hour(3).unwrap();
            // Decided on Redis's clock (the default): `TIME` runs inside the script.
            let key = format!("acl-{algorithm}-{i}");
            for _ in 0..3 {
                let decision = limiter.try_check(&key, &quota, 1).await;
                let decision = decision.unwrap_or_else(|e| panic!("{algorithm}: {e}"));
                assert!(decision.allowed, "{algorithm}");
            }
            let denied = limiter.try_check(&key, &quota, 1).await.unwrap();
            assert!(!denied.allowed, "{algorithm}: the limit holds");
        }
    }

    // The same user cannot read or write outside its prefix.
    let _: () = redis::cmd("SET")
        .arg("sessions:alice")
        .arg("token")
        .query(&mut redis.conn())
        .unwrap();
    let client = redis::Client::open(url_for(&redis, "s3cret-pass")).unwrap();
    let mut as_limiter = client.get_multiplexed_async_connection().await.unwrap();
    let read: redis::RedisResult<Option<String>> = redis::cmd("GET")
        .arg("sessions:alice")
        .query_async(&mut as_limiter)
        .await;
    let error = read.expect_err("no access outside redlimit:*");
    println!("GET outside the prefix: {error}");
    assert_eq!(
        error.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    );
    let keys: redis::RedisResult<Vec<String>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut as_limiter)
        .await;
    assert!(keys.is_err(), "KEYS is not granted: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error_and_never_loops_hot() {
    let redis = RedisServer::start();
    create_user(&redis);
    let store = RedisStore::builder(url_for(&redis, "wrong-pass"))
        .without_circuit_breaker()
        .build()
        .unwrap();
    let error = store.verify().await.expect_err("wrong password");
    let message = error.to_string();
    println!("wrong password: {message}");
    assert!(matches!(error, StoreError::Redis(_)), "{error:?}");
    assert!(
        message.contains("authentication failed") || message.contains("WRONGPASS"),
        "{message}"
    );
    assert!(
        !message.contains("wrong-pass"),
        "never the password: {message}"
    );

    let connections = |redis: &RedisServer| -> u64 {
        info_field(&redis.info("stats"), "total_connections_received")
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = connections(&redis);
    let limiter = Limiter::builder(store)
        .failure_policy(FailClosed::default())
        .build()
        .unwrap();
    let quota = Quota::per_hour(3).unwrap();
    let started = Instant::now();
    let mut calls = 0;
    while started.elapsed() < Duration::from_secs(2) {
        let verdict = limiter.check("k", &quota).await;
        assert!(
            matches!(verdict, Verdict::FailedClosed { .. }),
            "{verdict:?}"
        );
        calls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The harness's own INFO connection counts once per call of `connections`.
    let opened = connections(&redis) - before - 1;
    println!("wrong password: {calls} calls in 2 s opened {opened} connections");
    assert!(calls > 100, "{calls}");
    assert!(
        opened <= 12,
        "connection attempts back off: {opened} in 2 s"
    );
}
