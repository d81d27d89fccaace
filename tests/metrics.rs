//! The `metrics` feature, read back through `metrics-util`'s debugging recorder after real
//! traffic: decisions by outcome and policy (never by key), store latency, the circuit breaker's
//! gauge, unkeyed requests.

mod support;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
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

/// A metric's labels as `(name, value)`.
type Labels = Vec<(String, String)>;

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
        Metrics(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let key = key.key();
                    let labels = key
                        .labels()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect();
                    (key.name().to_owned(), labels, value)
                })
                .collect(),
        )
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
    let anon = RateLimitLayer::builder(
        Limiter::new(MemoryStore::new()),
        Quota::per_minute(5).unwrap(),
        PeerIp::new(),
    )
    .policy_name("anon")
    .build()
    .unwrap();
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
