//! What is logged of a store's failures (docs/failure.md, "What is logged"), probed on real
//! Redis processes and on addresses where nothing listens: one `warn` line at an episode's
//! first failure, whatever the URL's form, the circuit breaker, the number of limiters and
//! runtimes sharing the store, or how Redis fails; and never a password, at any level.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use redlimit::store::RedisStore;
use redlimit::{Limiter, Quota};
use support::logs::Captured;
use support::RedisServer;

/// The warning of the first failure of an episode.
const FIRST_FAILURE: &str = "rate limit store failed; the failure policy decides until it answers";

/// The `WARN` lines of `text`.
fn warnings(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains(" WARN ")).collect()
}

/// A subscriber at TRACE writing to one [`Captured`], to install on every thread that runs
/// calls (each worker of a multi-thread runtime, each helper thread).
fn shared_capture() -> (Captured, tracing::Dispatch) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::Dispatch::new(subscriber))
}

/// A multi-thread runtime whose workers log to `dispatch`.
fn logged_multi_thread_runtime(dispatch: &tracing::Dispatch) -> tokio::runtime::Runtime {
    let dispatch = dispatch.clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .on_thread_start(move || {
            // The worker's default for its whole life.
            std::mem::forget(tracing::dispatcher::set_default(&dispatch));
        })
        .build()
        .unwrap()
}

/// A limiter on `redis` that has admitted a check of `warm` under 1 000 a minute, and that
/// quota.
async fn warm_limiter(redis: &RedisServer) -> (Limiter, Quota) {
    let limiter = Limiter::new(RedisStore::new(redis.url()).unwrap());
    let quota = Quota::per_minute(1_000).unwrap();
    assert!(support::admits(&limiter, "warm", &quota).await);
    (limiter, quota)
}

/// `requests` checks through `limiter`, `gap` apart, each answered by the policy (open).
async fn checks_fail_open(limiter: &Limiter, requests: usize, gap: Duration) {
    let quota = Quota::per_minute(100).unwrap();
    for _ in 0..requests {
        assert!(limiter.check("k", &quota).await.is_allowed());
        tokio::time::sleep(gap).await;
    }
}

/// Asserts one warning in `text`, and none of `secrets` at any level.
fn assert_one_warning_and_no_secret(text: &str, secrets: &[&str], what: &str) {
    let shown = warnings(text);
    assert_eq!(shown.len(), 1, "{what}: one warning in all:\n{text}");
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{what}: {secret:?} is logged:\n{text}"
        );
    }
}

/// Every URL form with a password, nothing listening at its address: one warning at TRACE,
/// and no password at any level, with the circuit breaker on (the defaults) and off.
#[tokio::test(flavor = "current_thread")]
async fn a_wrong_url_of_every_form_warns_once_and_never_shows_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let sock = |name: &str| dir.path().join(name).display().to_string();
    let secret = "Pw9zSECRET";
    let mut cases: Vec<(String, Vec<String>)> = Vec::new();
    for breaker in [true, false] {
        let p = support::free_port();
        let urls = [
            format!("redis://limiter:{secret}@127.0.0.1:{p}/"),
            format!("redis://:{secret}@127.0.0.1:{p}/"),
            format!("redis://127.0.0.1:{p}/?pass={secret}"),
            format!("redis://127.0.0.1:{p}/?password={secret}"),
            format!("redis://u:{secret}%40%3A%2F%3F%23@127.0.0.1:{p}/"),
            format!("redis://u:a@{secret}@127.0.0.1:{p}/"),
            format!("redis://u:a?{secret}@127.0.0.1:{p}/"),
            format!("redis://u:a#{secret}@127.0.0.1:{p}/"),
            format!("redis://u:a:{secret}@127.0.0.1:{p}/"),
            format!("rediss://u:{secret}@127.0.0.1:{p}/"),
            format!("valkey://u:{secret}@127.0.0.1:{p}/"),
            format!("unix://{}?pass={secret}", sock(&format!("a{breaker}.sock"))),
            format!(
                "redis+unix://{}?user=u&pass={secret}",
                sock(&format!("b{breaker}.sock"))
            ),
        ];
        for url in urls {
            cases.push((url, vec![format!("breaker {breaker}")]));
        }
    }
    for (url, what) in cases {
        let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
        let builder = RedisStore::builder(&url);
        let store = if what[0] == "breaker true" {
            builder.build()
        } else {
            builder.without_circuit_breaker().build()
        };
        let Ok(store) = store else {
            continue; // refused at build: nothing to log
        };
        let limiter = Limiter::new(store);
        checks_fail_open(&limiter, 40, Duration::from_millis(5)).await;
        let text = captured.text();
        assert_one_warning_and_no_secret(&text, &[secret], &format!("{url} ({})", what[0]));
        assert!(warnings(&text)[0].contains(FIRST_FAILURE), "{url}:\n{text}");
    }
}

/// A Cluster's node list and a Sentinel's sentinels, with passwords, nothing listening.
#[tokio::test(flavor = "current_thread")]
async fn a_wrong_cluster_or_sentinel_warns_once_and_never_shows_a_password() {
    let secret = "Cl9zSECRET";
    let (a, b) = (support::free_port(), support::free_port());
    let nodes = [
        format!("redis://:{secret}@127.0.0.1:{a}/"),
        format!("redis://u:{secret}@127.0.0.1:{b}/"),
    ];
    let s = support::free_port();
    let sentinels = [format!("redis://:{secret}@127.0.0.1:{s}")];
    for store in [
        RedisStore::cluster(nodes).unwrap(),
        RedisStore::sentinel(sentinels, "mymaster").unwrap(),
    ] {
        let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
        let what = format!("{store:?}");
        let limiter = Limiter::new(store);
        checks_fail_open(&limiter, 30, Duration::from_millis(10)).await;
        assert_one_warning_and_no_secret(&captured.text(), &[secret], &what);
    }
}

/// A circuit breaker that opens at the first failure: its opening is the episode's one line,
/// through `check` (with a policy) and through `try_check_quotas` (without).
#[tokio::test(flavor = "current_thread")]
async fn a_breaker_opening_at_the_first_failure_is_the_one_warning() {
    for with_policy in [true, false] {
        let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
        let url = format!("redis://u:Th1SECRET@127.0.0.1:{}/", support::free_port());
        let store = RedisStore::builder(&url)
            .circuit_breaker(support::breaker_opening_after(1))
            .build()
            .unwrap();
        let limiter = Limiter::new(store);
        let quota = Quota::per_minute(100).unwrap();
        for _ in 0..60 {
            if with_policy {
                assert!(limiter.check("k", &quota).await.is_allowed());
            } else {
                assert!(limiter
                    .try_check_quotas("k", &quota.into(), 1)
                    .await
                    .is_err());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let what = format!("threshold 1, policy {with_policy}");
        assert_one_warning_and_no_secret(&captured.text(), &["Th1SECRET"], &what);
    }
}

/// One failing store shared by several limiters: one episode, one warning.
#[tokio::test(flavor = "current_thread")]
async fn a_failing_store_shared_by_several_limiters_warns_once() {
    let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
    let url = format!("redis://u:Sh4SECRET@127.0.0.1:{}/", support::free_port());
    let store = RedisStore::new(&url).unwrap();
    let limiters: Vec<Limiter> = (0..4).map(|_| Limiter::new(store.clone())).collect();
    for _ in 0..20 {
        for limiter in &limiters {
            checks_fail_open(limiter, 1, Duration::from_millis(5)).await;
        }
    }
    assert_one_warning_and_no_secret(&captured.text(), &["Sh4SECRET"], "4 limiters");
}

/// A failing store checked by 64 concurrent callers on a multi-thread runtime, with the
/// defaults and with a breaker opening at the first failure: one warning in all.
#[test]
fn concurrent_failures_on_a_multi_thread_runtime_warn_once() {
    for threshold in [None, Some(1), Some(2)] {
        let (captured, dispatch) = shared_capture();
        let runtime = logged_multi_thread_runtime(&dispatch);
        let url = format!("redis://u:Mt5SECRET@127.0.0.1:{}/", support::free_port());
        let builder = RedisStore::builder(&url);
        let store = match threshold {
            Some(n) => builder.circuit_breaker(support::breaker_opening_after(n)),
            None => builder,
        }
        .build()
        .unwrap();
        let limiter = Arc::new(Limiter::new(store));
        runtime.block_on(async {
            let tasks = (0..64).map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    checks_fail_open(&limiter, 10, Duration::from_millis(2)).await;
                })
            });
            for task in join_all(tasks).await {
                task.unwrap();
            }
        });
        drop(runtime);
        let what = format!("64 callers, threshold {threshold:?}");
        assert_one_warning_and_no_secret(&captured.text(), &["Mt5SECRET"], &what);
    }
}

/// One failing store used from several runtimes on threads of their own (current-thread and
/// multi-thread): one warning in all.
#[test]
fn a_failing_store_used_from_several_runtimes_warns_once() {
    let (captured, dispatch) = shared_capture();
    let url = format!("redis://u:Rt6SECRET@127.0.0.1:{}/", support::free_port());
    let store = RedisStore::new(&url).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let store = store.clone();
            let dispatch = dispatch.clone();
            std::thread::spawn(move || {
                let _guard = tracing::dispatcher::set_default(&dispatch);
                let runtime = if i % 2 == 0 {
                    support::current_thread_runtime()
                } else {
                    logged_multi_thread_runtime(&dispatch)
                };
                let limiter = Limiter::new(store);
                runtime.block_on(checks_fail_open(&limiter, 30, Duration::from_millis(3)));
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_one_warning_and_no_secret(&captured.text(), &["Rt6SECRET"], "4 runtimes");
}

/// `maxmemory` with `noeviction`: every decision's write is refused (`OOM`). The store
/// answers each call with that error: one warning for the whole episode, not one a second.
#[tokio::test(flavor = "current_thread")]
async fn oom_refusals_warn_once_for_the_episode() {
    let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
    let redis = RedisServer::start();
    let (limiter, quota) = warm_limiter(&redis).await;
    redis.out_of_memory();
    // Over more than two seconds, on keys never written: a line a second would show.
    for i in 0..50 {
        let key = format!("k{i}");
        assert!(limiter.check(key.as_str(), &quota).await.is_allowed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = captured.text();
    let stats = limiter.stats();
    assert!(stats.store_errors >= 50, "the writes failed: {stats:?}");
    assert_eq!(warnings(&text).len(), 1, "one warning:\n{text}");
}

/// `DEBUG SLEEP` past the timeout: every call times out; one warning.
#[tokio::test(flavor = "current_thread")]
async fn a_redis_asleep_past_the_timeout_warns_once() {
    let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
    let redis = RedisServer::start();
    let (limiter, quota) = warm_limiter(&redis).await;
    let sleeping = redis.debug_sleep(Duration::from_millis(2_500));
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..20 {
        assert!(limiter.check("k", &quota).await.is_allowed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    RedisServer::awake(sleeping).await;
    let text = captured.text();
    assert_eq!(warnings(&text).len(), 1, "one warning:\n{text}");
}

/// Redis killed with calls in flight and restarted, twice, more than a second apart: one
/// warning per outage.
#[tokio::test(flavor = "current_thread")]
async fn each_outage_of_a_killed_redis_warns_once() {
    let (captured, _guard) = support::logs::capture(tracing::Level::TRACE);
    let mut redis = RedisServer::start();
    let limiter = Limiter::new(RedisStore::new(redis.url()).unwrap());
    let quota = Quota::per_minute(100_000).unwrap();
    for outage in 1..=2 {
        assert!(support::answers_within_10s(&limiter, "k", &quota).await);
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let in_flight = join_all((0..32).map(|_| limiter.check("k", &quota)));
        let (_, ()) = tokio::join!(in_flight, async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            redis.stop();
        });
        checks_fail_open(&limiter, 30, Duration::from_millis(20)).await;
        let text = captured.text();
        assert_eq!(warnings(&text).len(), outage, "outage {outage}:\n{text}");
        redis.restart();
    }
}
