//! The `metrics` feature, read back through `metrics-util`'s debugging recorder after real
//! traffic: decisions by outcome and policy (never by key), store latency, the circuit breaker's
//! gauge, unkeyed requests.

#[path = "support/recorded.rs"]
mod recorded;
mod support;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use recorded::Labels;
use redlimit::key::{HeaderKey, PeerIp};
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{
    failure_policy::{FailClosed, FailOpen, FailurePolicy, LocalFallback},
    limiter::DIRECT_POLICY_LABEL,
    Limiter, Quota, RateLimitLayer,
};
use support::example::dead_redis_url;
use support::service::counting;
use support::{Ctx, RedisServer};
use tower::{Layer, ServiceExt};

/// A snapshot: each metric's name, labels and value.
struct Metrics(Vec<(String, Labels, DebugValue)>);

/// The row of `name` in the guide's metrics table (`docs/using.md`), if it has one.
fn table_row(name: &str) -> Option<&'static str> {
    let cell = format!("| `{name}` |");
    include_str!("../docs/using.md")
        .lines()
        .find(|line| line.starts_with(&cell))
}

impl Metrics {
    /// A snapshot, each of its metrics held to the guide's table: its row, every label it
    /// carries named there, and the values of the labels the crate fixes listed there.
    fn take(snapshotter: &Snapshotter) -> Metrics {
        let metrics = Metrics::read(snapshotter);
        for (name, labels, _) in &metrics.0 {
            let row = table_row(name)
                .unwrap_or_else(|| panic!("{name} is recorded but not in docs/using.md's table"));
            for (key, value) in labels {
                assert!(
                    row.contains(&format!("`{key}`")),
                    "{name}: label {key} not in {row}"
                );
                if ["outcome", "call", "kind"].contains(&key.as_str()) {
                    assert!(
                        row.contains(&format!("`{value}`")),
                        "{name}: {key}={value} not in {row}"
                    );
                }
            }
        }
        metrics
    }

    fn read(snapshotter: &Snapshotter) -> Metrics {
        Metrics(recorded::metrics(snapshotter))
    }

    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        self.0
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && l.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, value)| value)
    }

    /// A counter's value (0 when never recorded).
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            Some(other) => panic!("{name} {labels:?} is not a counter: {other:?}"),
        }
    }

    fn decisions(&self, policy: &str, outcome: &str) -> u64 {
        self.counter(
            "redlimit_decisions_total",
            &[("policy", policy), ("outcome", outcome)],
        )
    }

    /// A histogram's samples (drained by each snapshot).
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.find(name, labels) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
            None => Vec::new(),
            Some(other) => panic!("{name} {labels:?} is not a histogram: {other:?}"),
        }
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        match self.find(name, &[]) {
            Some(DebugValue::Gauge(value)) => Some(value.into_inner()),
            None => None,
            Some(other) => panic!("{name} is not a gauge: {other:?}"),
        }
    }

    fn any_label_contains(&self, text: &str) -> bool {
        self.0
            .iter()
            .any(|(_, labels, _)| labels.iter().any(|(_, v)| v.contains(text)))
    }
}

fn get(api_key: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = Request::get("/");
    if let Some(key) = api_key {
        request = request.header("x-api-key", key);
    }
    request.body(Full::default()).unwrap()
}

/// Sends `n` requests through `layer` with `api_key`; the statuses.
async fn statuses<K>(layer: &RateLimitLayer<K>, api_key: Option<&str>, n: usize) -> Vec<u16>
where
    RateLimitLayer<K>: Clone,
    K: redlimit::key::KeyExtractor + Clone + Send + Sync + 'static,
{
    let service = layer.layer(counting(Arc::new(AtomicUsize::new(0))));
    let mut out = Vec::new();
    for _ in 0..n {
        let response = service.clone().oneshot(get(api_key)).await.unwrap();
        out.push(response.status().as_u16());
    }
    out
}

fn api_key_layer(limiter: Limiter, policy: &str, limit: u64) -> RateLimitLayer<HeaderKey> {
    RateLimitLayer::builder(
        limiter,
        Quota::per_minute(limit).unwrap(),
        HeaderKey::named("x-api-key").unwrap(),
    )
    .policy_name(policy)
    .build()
    .unwrap()
}

/// A layer of 5 a minute on a memory store, keyed by the peer address.
fn peer_ip_layer(policy: &str) -> RateLimitLayer<PeerIp> {
    let limiter = Limiter::new(MemoryStore::new());
    RateLimitLayer::builder(limiter, Quota::per_minute(5).unwrap(), PeerIp::new())
        .policy_name(policy)
        .build()
        .unwrap()
}

fn dead_limiter(policy: impl FailurePolicy) -> Limiter {
    Limiter::builder(RedisStore::new(dead_redis_url()).unwrap())
        .failure_policy(policy)
        .build()
        .unwrap()
}

/// All in one test: the recorder is global to this test binary, and so is the circuit gauge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_real_traffic() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    // A layer on a real Redis: 2 allowed, then limited, labelled by the policy name.
    let redis = RedisServer::start();
    let api = api_key_layer(Ctx::default().redis(&redis), "api", 2);
    assert_eq!(
        statuses(&api, Some("secret-tenant-key"), 3).await,
        [200, 200, 429]
    );
    // A layer whose key is the peer address, which a bare service never has: unkeyed.
    let anon = peer_ip_layer("anon");
    assert_eq!(statuses(&anon, None, 2).await, [200, 200]);

    let metrics = Metrics::take(&snapshotter);
    assert_eq!(metrics.decisions("api", "allowed"), 2);
    assert_eq!(metrics.decisions("api", "limited"), 1);
    let latencies = metrics.samples("redlimit_store_latency_seconds", &[("policy", "api")]);
    assert_eq!(latencies.len(), 3, "one sample per store call");
    assert!(
        latencies.iter().all(|&s| s > 0.0 && s < 5.0),
        "{latencies:?}"
    );
    assert_eq!(
        metrics.counter("redlimit_unkeyed_requests_total", &[("policy", "anon")]),
        2
    );
    assert_eq!(metrics.decisions("anon", "allowed"), 2);
    // A `MemoryStore` decides at once: no round trip, no latency sample.
    assert_eq!(
        metrics.samples("redlimit_store_latency_seconds", &[("policy", "anon")]),
        Vec::<f64>::new()
    );
    assert_eq!(
        metrics.counter("redlimit_unkeyed_requests_total", &[("policy", "api")]),
        0
    );
    // Never labelled by key.
    assert!(!metrics.any_label_contains("secret-tenant-key"));
    assert!(!metrics.any_label_contains("unkeyed"));
    // A Redis store starts with a closed circuit.
    assert_eq!(metrics.gauge("redlimit_circuit_breaker_open"), Some(0.0));

    // Limiter::check outside a layer, with a deny cache: the documented `direct` label.
    let direct = Limiter::builder(MemoryStore::new())
        .deny_cache(100)
        .build()
        .unwrap();
    let one = Quota::per_minute(1).unwrap();
    let allowed: Vec<bool> = [
        direct.check("k", &one).await,
        direct.check("k", &one).await,
        direct.check("k", &one).await,
    ]
    .iter()
    .map(|v| v.is_allowed())
    .collect();
    assert_eq!(allowed, [true, false, false]);
    let metrics = Metrics::take(&snapshotter);
    assert_eq!(DIRECT_POLICY_LABEL, "direct");
    assert_eq!(metrics.decisions("direct", "allowed"), 1);
    assert_eq!(metrics.decisions("direct", "limited"), 1);
    assert_eq!(metrics.decisions("direct", "deny_cache"), 1);

    // A suspended key: its own outcome, not `limited`.
    let suspended = Limiter::new(MemoryStore::new());
    suspended
        .suspend("k", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!suspended.check("k", &one).await.is_allowed());
    assert_eq!(suspended.stats().suspended, 1);
    let metrics = Metrics::take(&snapshotter);
    assert_eq!(metrics.decisions("direct", "suspended"), 1);

    // Redis down: each failure policy's outcome.
    let open = api_key_layer(dead_limiter(FailOpen), "open", 1);
    assert_eq!(statuses(&open, Some("t"), 3).await, [200, 200, 200]);
    let closed = api_key_layer(dead_limiter(FailClosed::default()), "closed", 1);
    assert_eq!(statuses(&closed, Some("t"), 2).await, [503, 503]);
    let local = api_key_layer(dead_limiter(LocalFallback::new(1)), "local", 1);
    assert_eq!(statuses(&local, Some("t"), 2).await, [200, 429]);
    let metrics = Metrics::take(&snapshotter);
    assert_eq!(metrics.decisions("open", "store_error_admitted"), 3);
    assert_eq!(metrics.decisions("open", "allowed"), 0);
    assert_eq!(metrics.decisions("closed", "store_error_rejected"), 2);
    assert_eq!(metrics.decisions("local", "local_fallback"), 2);

    // The circuit breaker's gauge: 1 once Redis is gone, 0 once a probe finds it back.
    let mut redis = RedisServer::start();
    let limiter = Ctx::default()
        .timeout(redlimit::store::DEFAULT_TIMEOUT)
        .breaker(support::breaker_opening_after(1))
        .redis(&redis);
    let quota = Quota::per_minute(100).unwrap();
    assert!(support::admits(&limiter, "b", &quota).await);
    redis.stop();
    for _ in 0..5 {
        let _ = limiter.try_check_quotas("b", &quota.into(), 1).await;
    }
    assert_eq!(
        Metrics::take(&snapshotter).gauge("redlimit_circuit_breaker_open"),
        Some(1.0)
    );
    redis.restart();
    let back = support::answers_within_10s(&limiter, "b", &quota).await;
    assert!(back, "Redis answered again after the restart");
    assert_eq!(
        Metrics::take(&snapshotter).gauge("redlimit_circuit_breaker_open"),
        Some(0.0)
    );
}

/// Runs `body` on a current-thread runtime with `recorder` as this thread's recorder
/// (`metrics::with_local_recorder`): the limiter's tasks (settlements) run on this thread too.
fn locally<F: std::future::Future<Output = ()>>(recorder: &DebuggingRecorder, body: F) {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(body)
    });
}

/// A recorder installed locally, not globally, gets every outcome under
/// the right `policy`: two layers with different names on one limiter, a layer built before the
/// recorder was set, a shadow layer and shadow tiers, the deny cache, the failure policies,
/// unkeyed requests, `direct` checks; and one latency sample per Redis check.
#[test]
fn probe_local_recorder_counts_every_outcome_under_its_policy() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let redis = RedisServer::start();
    // Built (and its metric keys with it) before any recorder is set for this thread.
    let early = api_key_layer(Limiter::new(MemoryStore::new()), "local-early", 1);
    locally(&recorder, async {
        let limiter = Ctx::default().redis(&redis);
        let one = api_key_layer(limiter.clone(), "local-one", 1);
        let two = api_key_layer(limiter.clone(), "local-two", 2);
        assert_eq!(statuses(&one, Some("a"), 3).await, [200, 429, 429]);
        assert_eq!(statuses(&two, Some("a"), 3).await, [200, 200, 429]);
        assert_eq!(statuses(&early, Some("a"), 2).await, [200, 429]);
        let shadow = RateLimitLayer::builder(
            Limiter::new(MemoryStore::new()),
            Quota::per_minute(1).unwrap(),
            HeaderKey::named("x-api-key").unwrap(),
        )
        .policy_name("local-shadow")
        .shadow(true)
        .build()
        .unwrap();
        assert_eq!(statuses(&shadow, Some("a"), 3).await, [200, 200, 200]);
        let tiers = RateLimitLayer::builder(
            Limiter::new(MemoryStore::new()),
            Quota::per_minute(10).unwrap(),
            HeaderKey::named("x-api-key").unwrap(),
        )
        .policy_name("local-tiers")
        .shadow_quotas(Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
        assert_eq!(statuses(&tiers, Some("a"), 3).await, [200, 200, 200]);
        let cached = Limiter::builder(MemoryStore::new())
            .deny_cache(100)
            .build()
            .unwrap();
        let cached = api_key_layer(cached, "local-cache", 1);
        assert_eq!(statuses(&cached, Some("a"), 3).await, [200, 429, 429]);
        let open = api_key_layer(dead_limiter(FailOpen), "local-open", 1);
        assert_eq!(statuses(&open, Some("a"), 2).await, [200, 200]);
        let closed = api_key_layer(dead_limiter(FailClosed::default()), "local-closed", 1);
        assert_eq!(statuses(&closed, Some("a"), 2).await, [503, 503]);
        let fallback = api_key_layer(dead_limiter(LocalFallback::new(1)), "local-fallback", 1);
        assert_eq!(statuses(&fallback, Some("a"), 2).await, [200, 429]);
        let anon = peer_ip_layer("local-anon");
        assert_eq!(statuses(&anon, None, 2).await, [200, 200]);
        let q = Quota::per_minute(1).unwrap();
        assert!(limiter.check("direct-key", &q).await.is_allowed());
        assert!(!limiter.check("direct-key", &q).await.is_allowed());
    });
    let m = Metrics::take(&snapshotter);
    let expected = [
        ("local-one", "allowed", 1),
        ("local-one", "limited", 2),
        ("local-two", "allowed", 2),
        ("local-two", "limited", 1),
        ("local-early", "allowed", 1),
        ("local-early", "limited", 1),
        ("local-shadow", "allowed", 1),
        ("local-shadow", "shadow_limited", 2),
        ("local-shadow", "limited", 0),
        ("local-tiers", "allowed", 3),
        ("local-tiers", "shadow_limited", 2),
        ("local-cache", "allowed", 1),
        ("local-cache", "limited", 1),
        ("local-cache", "deny_cache", 1),
        ("local-open", "store_error_admitted", 2),
        ("local-closed", "store_error_rejected", 2),
        ("local-fallback", "local_fallback", 2),
        ("local-anon", "allowed", 2),
        ("direct", "allowed", 1),
        ("direct", "limited", 1),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter(|&&(policy, outcome, n)| m.decisions(policy, outcome) != n)
        .map(|&(policy, outcome, n)| {
            format!(
                "{policy}/{outcome}: {} (expected {n})",
                m.decisions(policy, outcome)
            )
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(
        m.counter(
            "redlimit_unkeyed_requests_total",
            &[("policy", "local-anon")]
        ),
        2
    );
    let latency = |policy| m.samples("redlimit_store_latency_seconds", &[("policy", policy)]);
    assert_eq!(latency("local-one").len(), 3, "one sample per Redis check");
    assert_eq!(latency("local-two").len(), 3, "one sample per Redis check");
    assert_eq!(latency("direct").len(), 2, "one sample per Redis check");
    for policy in ["local-early", "local-shadow", "local-cache", "local-anon"] {
        assert!(
            latency(policy).is_empty(),
            "{policy}: a MemoryStore decides at once"
        );
    }
    assert!(
        !latency("local-open").is_empty(),
        "a failed Redis call is a store call"
    );
}

/// One request through a layer on Redis named `policy` that reserves `reserve` and settles
/// at `used` from the response; the metrics it recorded once its settlement is done.
fn settled_on_redis(policy: &'static str, reserve: u64, used: u64) -> Metrics {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let redis = RedisServer::start();
    locally(&recorder, async {
        let limiter = Ctx::default().redis(&redis);
        let layer = RateLimitLayer::builder(
            limiter.clone(),
            Quota::per_minute(10).unwrap(),
            HeaderKey::named("x-api-key").unwrap(),
        )
        .policy_name(policy)
        .cost(move |_| reserve)
        .cost_from_response(move |_| used)
        .build()
        .unwrap();
        assert_eq!(statuses(&layer, Some("a"), 1).await, [200]);
        limiter.flush_settlements().await;
        assert_eq!(limiter.stats().settle_failures, 0);
    });
    Metrics::take(&snapshotter)
}

/// docs/using.md, `redlimit_store_latency_seconds` times "every
/// decision's store call that waits for its answer"; "refunds ... are not timed". A layer's
/// settlement on Redis: its check is one sample under the layer's policy, its refund none.
#[test]
fn probe_a_settlements_check_is_timed_and_its_refund_is_not() {
    let m = settled_on_redis("local-settle", 5, 0);
    let samples = m.samples(
        "redlimit_store_latency_seconds",
        &[("policy", "local-settle")],
    );
    assert_eq!(
        samples.len(),
        1,
        "the check is timed, the refund is not: {samples:?}"
    );
}

/// A layer's settlement that charges more after the response (a peek
/// and a check on Redis) records its latency under the layer's `policy`, never as `direct`
/// traffic, and counts no decision.
#[test]
fn probe_a_settlements_charge_records_its_latency_under_the_layers_policy() {
    let m = settled_on_redis("local-charge", 1, 4);
    let latency = |policy| m.samples("redlimit_store_latency_seconds", &[("policy", policy)]);
    assert_eq!(
        (latency("local-charge").len(), latency("direct").len()),
        // The layer's check, then the settlement's peek and check.
        (3, 0),
        "(the layer's samples, direct's samples)"
    );
    assert_eq!(m.decisions("local-charge", "allowed"), 1);
    assert_eq!(m.decisions("direct", "allowed"), 0);
}
