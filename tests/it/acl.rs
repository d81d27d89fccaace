//! Credentials with least privilege: the limiter works as an ACL user that may run only the
//! commands the scripts and the client need, only on keys under its prefix (the line the
//! README gives): every decision, every fleet control and auto-suspend, on every algorithm. A
//! control the server refuses is loud, and a wrong password is a clear error that never loops
//! hot.

use crate::support;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use redlimit::outbound::OutboundLayer;
use redlimit::store::RedisStore;
use redlimit::{failure_policy::FailClosed, Algorithm, Limiter, Quota, Quotas, Target, Verdict};
use support::{info_field, RedisServer};
use tower::{Layer, ServiceExt};

/// The README's ACL line for the limiter's user (read from the README, so the two cannot
/// drift apart), with `PASSWORD` replaced by the test's password.
fn acl_rules() -> String {
    let readme = include_str!("../../README.md");
    let line = readme
        .lines()
        .find_map(|l| l.strip_prefix("ACL SETUSER limiter "))
        .expect("the README gives the ACL SETUSER line for the limiter's user");
    line.replace(">PASSWORD", ">s3cret-pass")
}

fn create_user(redis: &RedisServer) {
    create_user_with(redis, &acl_rules());
}

fn create_user_with(redis: &RedisServer, rules: &str) {
    let mut admin = redis.conn();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg("limiter");
    for rule in rules.split_whitespace() {
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
                let decision = limiter.try_check_quotas(&key, &quota.into(), 1).await;
                let decision = decision.unwrap_or_else(|e| panic!("{algorithm}: {e}"));
                assert!(decision.allowed, "{algorithm}");
            }
            let denied = limiter
                .try_check_quotas(&key, &quota.into(), 1)
                .await
                .unwrap();
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
    let message = support::redis_error_on_verify(&store, "wrong password").await;
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

/// A store as the ACL user with a generous timeout: permissions are what these tests check, and
/// a loaded machine must not turn a slow reply into a failed control.
fn patient_store(redis: &RedisServer) -> RedisStore {
    RedisStore::builder(url_for(redis, "s3cret-pass"))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Every fleet control, through the public `Limiter` API, as the README's user, on every
/// algorithm: each succeeds and does what it says (every control needs `+pttl`, the sliding
/// log's also `+zcard`; without them they fail with NOPERM).
#[tokio::test]
async fn every_control_works_as_the_least_privileged_user() {
    let redis = RedisServer::start();
    create_user(&redis);
    let store = patient_store(&redis);
    store.verify().await.expect("verified as the ACL user");
    let quota = Quota::per_hour(3).unwrap();
    let tight = Quotas::from(Quota::per_hour(1).unwrap());
    for &algorithm in Algorithm::ALL {
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        let key = format!("controls-{algorithm}");
        let key = key.as_str();
        let fail = |control: &str, error: &dyn std::fmt::Display| -> ! {
            panic!("{algorithm}: {control} as the ACL user: {error}")
        };
        assert!(support::admits(&limiter, key, &quota).await);

        let status = limiter
            .set_quota(key, &tight)
            .await
            .unwrap_or_else(|e| fail("set_quota", &e));
        assert_eq!(status.quota_override.as_ref(), Some(&tight), "{algorithm}");
        let status = limiter
            .inspect(key)
            .await
            .unwrap_or_else(|e| fail("inspect", &e));
        assert_eq!(status.quota_override.as_ref(), Some(&tight), "{algorithm}");
        if algorithm == Algorithm::SlidingLog {
            // `ZCARD` runs under `pcall`: without it the count would be missing, silently.
            assert_eq!(status.log_entries, Some(1), "{algorithm}: {status:?}");
        }

        let status = limiter
            .suspend(key, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| fail("suspend", &e));
        assert!(status.suspended_for.is_some(), "{algorithm}: {status:?}");
        let denied = limiter
            .try_check_quotas(key, &quota.into(), 1)
            .await
            .unwrap();
        assert!(
            !denied.allowed && denied.suspended,
            "{algorithm}: {denied:?}"
        );
        let status = limiter
            .resume(key)
            .await
            .unwrap_or_else(|e| fail("resume", &e));
        assert_eq!(status.suspended_for, None, "{algorithm}");

        let status = limiter
            .clear_quota(key)
            .await
            .unwrap_or_else(|e| fail("clear_quota", &e));
        assert_eq!(status.quota_override, None, "{algorithm}");
        limiter
            .reset(key)
            .await
            .unwrap_or_else(|e| fail("reset", &e));
        for _ in 0..3 {
            let decision = limiter
                .try_check_quotas(key, &quota.into(), 1)
                .await
                .unwrap();
            assert!(
                decision.allowed,
                "{algorithm}: reset gives the full quota back"
            );
        }
        println!("{algorithm}: set_quota, inspect, suspend, resume, clear_quota, reset: ok");
    }
}

/// An upstream's `429` + `Retry-After: 30` through an `OutboundLayer` suspends the key for the
/// fleet as the README's user, on every algorithm, unscoped and scoped: a suspension refused
/// with NOPERM would leave the fleet calling.
#[tokio::test]
async fn auto_suspend_works_as_the_least_privileged_user() {
    let redis = RedisServer::start();
    create_user(&redis);
    let store = patient_store(&redis);
    let quota = Quota::per_second(10).unwrap();
    let busy = tower::service_fn(|_: Request<Full<Bytes>>| async {
        let response = Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("retry-after", "30")
            .body(Full::<Bytes>::default())
            .unwrap();
        Ok::<_, Infallible>(response)
    });
    for &algorithm in Algorithm::ALL {
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        for scope in [None, Some("search")] {
            // One key per case: an unscoped suspension is the tenant's and reaches every route.
            let key = format!("partner-{algorithm}-{}", scope.unwrap_or("tenant"));
            let builder = OutboundLayer::builder(limiter.clone(), quota, key.as_str());
            let layer = match scope {
                Some(scope) => builder.scope(scope),
                None => builder,
            }
            .build()
            .unwrap();
            let response = layer
                .layer(busy)
                .oneshot(Request::new(Full::default()))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            // The suspension is written after the response.
            layer.settled().await;
            let target = match scope {
                Some(scope) => Target::scoped(scope, &key),
                None => Target::key(&key),
            };
            let status = limiter
                .inspect(target)
                .await
                .unwrap_or_else(|e| panic!("{algorithm} {scope:?}: inspect: {e}"));
            let left = status
                .suspended_for
                .unwrap_or_else(|| panic!("{algorithm} {scope:?}: not suspended: {status:?}"));
            assert!(
                left > Duration::from_secs(29) && left <= Duration::from_secs(30),
                "{algorithm} {scope:?}: {left:?}"
            );
        }
        assert_eq!(limiter.stats().store_errors, 0, "{algorithm}");
    }
}

/// A control the server refuses at run time (here: an ACL without `+pttl`, which every control
/// calls) is loud: an error-level log line and `redlimit_store_errors_total{call="control"}`.
// One thread: the subscriber and the recorder set for this test see every event of its calls.
#[tokio::test(flavor = "current_thread")]
async fn a_control_that_fails_is_an_error_log_and_a_metric() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // This thread's recorder (the metrics of the other tests of this binary stay out of it).
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (captured, _guard) = crate::support::logs::capture(tracing::Level::INFO);

    let redis = RedisServer::start();
    create_user_with(&redis, &acl_rules().replace(" +pttl", ""));
    let store = RedisStore::new(url_for(&redis, "s3cret-pass")).unwrap();
    let limiter = Limiter::new(store);
    let error = limiter
        .suspend("k", Duration::from_secs(30))
        .await
        .expect_err("PTTL is not granted");
    println!("suspend without +pttl: {error}");

    let text = captured.text();
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("rate limit control failed"))
        .collect();
    assert_eq!(errors.len(), 1, "one error-level line:\n{text}");
    assert!(
        errors[0].contains("Suspend"),
        "says which control: {}",
        errors[0]
    );
    let failed =
        crate::recorded::metrics(&snapshotter)
            .into_iter()
            .find_map(|(name, labels, value)| {
                let control = labels.iter().any(|(k, v)| k == "call" && v == "control");
                (name == "redlimit_store_errors_total" && control).then_some(value)
            });
    assert_eq!(failed, Some(DebugValue::Counter(1)), "counted once");
}

/// On Cluster the README's line plus `+cluster|slots +asking` (slot discovery; following `ASK`
/// while a slot moves) serves every algorithm's decisions and controls on all three masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_addendum_is_enough_on_cluster() {
    let cluster = support::RedisCluster::start();
    for node in cluster.nodes() {
        create_user_with(node, &format!("{} +cluster|slots +asking", acl_rules()));
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| url_for(node, "s3cret-pass"))
        .collect();
    let store = RedisStore::cluster_builder(urls)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    store
        .verify()
        .await
        .expect("verified on Cluster as the ACL user");
    let quota = Quota::per_hour(3).unwrap();
    for &algorithm in Algorithm::ALL {
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        // Keys on every master.
        for i in 0..12 {
            let key = format!("acl-cluster-{algorithm}-{i}");
            assert!(support::admits(&limiter, &key, &quota).await);
            let status = limiter
                .suspend(key.as_str(), Duration::from_secs(60))
                .await
                .unwrap_or_else(|e| panic!("{algorithm}: suspend on Cluster: {e}"));
            assert!(status.suspended_for.is_some(), "{algorithm}");
            limiter.resume(key.as_str()).await.unwrap();
        }
    }
}

/// The production modes as the README's user: a refund on every algorithm (the sliding log's
/// needs `+zrem`), a block that doubles, and a concurrency slot taken and given back (`+zrem`).
#[tokio::test]
async fn the_production_modes_work_as_the_least_privileged_user() {
    use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome};
    use redlimit::limiter::BlockFor;
    let redis = RedisServer::start();
    create_user(&redis);
    let quotas = Quotas::from(Quota::per_minute(3).unwrap());
    for &algorithm in Algorithm::ALL {
        let limiter = Limiter::builder(patient_store(&redis))
            .algorithm(algorithm)
            .build()
            .unwrap();
        let key = format!("modes-{algorithm}");
        assert!(
            limiter
                .try_check_quotas(&key, &quotas, 3)
                .await
                .unwrap()
                .allowed
        );
        limiter
            .refund(key.as_str(), &quotas, 2)
            .await
            .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
        assert_eq!(
            limiter
                .try_check_quotas(&key, &quotas, 0)
                .await
                .unwrap()
                .remaining,
            2
        );
        let block = BlockFor::new(Duration::from_secs(5))
            .unwrap()
            .doubling_up_to(Duration::from_secs(20))
            .unwrap();
        // Two pass, the third is denied and blocks.
        for _ in 0..3 {
            limiter.check_blocking(&key, &quotas, 1, &block).await;
        }
        let denied = limiter.try_check_quotas(&key, &quotas, 1).await.unwrap();
        assert!(denied.suspended, "{algorithm}: {denied:?}");
        assert_eq!(limiter.stats().store_errors, 0, "{algorithm}");
    }
    let slots = ConcurrencyLimiter::new(Limiter::new(patient_store(&redis)), 1).unwrap();
    let SlotOutcome::Acquired(slot) = slots.acquire("k").await else {
        panic!("no slot as the ACL user")
    };
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Full { .. }));
    drop(slot);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Acquired(_)));
}

/// A user that may neither load the script nor send it with `EVAL` fails every check: one
/// episode of failures, one warning, though the script's load fails in it too (the load's
/// failure goes through the store's one episode gate, as the failure policy's line does).
#[tokio::test]
async fn a_script_load_refused_in_a_failing_episode_adds_no_second_warning() {
    let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
    let redis = RedisServer::start();
    let rules = acl_rules()
        .replace(" +script|load", "")
        .replace(" +eval ", " ");
    create_user_with(&redis, &rules);
    let limiter = Limiter::new(RedisStore::new(url_for(&redis, "s3cret-pass")).unwrap());
    let quota = Quota::per_minute(100).unwrap();
    for _ in 0..5 {
        let verdict = limiter.check("k", &quota).await;
        assert!(matches!(verdict, Verdict::FailedOpen), "{verdict:?}");
    }
    let text = captured.text();
    let warnings: Vec<_> = text.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(
        text.contains("rate limit script could not be loaded"),
        "the load was refused:\n{text}"
    );
    assert_eq!(warnings.len(), 1, "one episode, one warning:\n{text}");
}
