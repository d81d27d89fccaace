//! A learned quota's record (`<key>#l`) read back from the store is bounded, whoever wrote it:
//! a record whose end is no time (NaN, an infinity, negative), years ahead, or set under a
//! longer `learned_ttl` than this instance's (a rolling change of the setting) never freezes
//! the learned quota. A later announcement replaces it, silence clears it, and `inspect` never
//! reports more time left than a learning write can set; on Redis and on the memory store.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Request, Response};
use redlimit::limiter::{OverrideSource, MAX_SUSPENSION};
use redlimit::outbound::OutboundLayer;
use redlimit::store::{Control, ControlRequest, MemoryStore, StoreExt};
use redlimit::{Algorithm, Limiter, Quota, Quotas};
use tower::{Layer, ServiceExt};

use crate::support::{self, RedisServer};

fn per_second(limit: u64) -> Quota {
    Quota::per_second(limit).unwrap()
}

/// A fresh layer on `key` (a new instance's: no learning round run yet) learning below
/// 50 a second with the default period (30 s) and `learned_ttl`.
fn layer(limiter: &Limiter, key: &str, learned_ttl: Duration) -> OutboundLayer {
    OutboundLayer::builder(limiter.clone(), per_second(50), key)
        .learn_quota(per_second(50))
        .learned_ttl(learned_ttl)
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap()
}

const TEN_MINUTES: Duration = Duration::from_secs(600);

/// One call through `layer` to an upstream that announces `policy` (`RateLimit-Policy`; nothing
/// when `None`), then the layer's learning round.
async fn answer(layer: &OutboundLayer, policy: Option<&'static str>) {
    let upstream = tower::service_fn(move |_: Request<String>| async move {
        let mut response = Response::new(String::new());
        if let Some(policy) = policy {
            let value = HeaderValue::from_static(policy);
            response.headers_mut().insert("ratelimit-policy", value);
        }
        Ok::<_, Infallible>(response)
    });
    layer
        .layer(upstream)
        .oneshot(Request::new(String::new()))
        .await
        .expect("the call goes out");
    layer.settled().await;
}

/// The override in force on `key` and who set it.
async fn learned(limiter: &Limiter, key: &str) -> (Option<Quotas>, Option<OverrideSource>) {
    let status = limiter.inspect(key).await.unwrap();
    (status.quota_override, status.override_source)
}

/// Learns 40 a second on `key` through a first instance's layer.
async fn learn_forty(limiter: &Limiter, key: &str, learned_ttl: Duration) {
    answer(&layer(limiter, key, learned_ttl), Some("p;q=40;w=1")).await;
    let (quota, source) = learned(limiter, key).await;
    assert_eq!(quota, Some(Quotas::from(per_second(40))), "{key}");
    assert!(
        matches!(source, Some(OverrideSource::Learned { .. })),
        "{key}: {source:?}"
    );
}

/// What must hold once `key`'s learned 40 a second has a record that is corrupt or far ahead:
/// `inspect` reports at most what a learning write can set, another instance's answer
/// announcing 5 a second learns it, and on `silent` (a key in the same state) a third
/// instance's answer announcing nothing clears the learned quota. Returns what went wrong.
async fn never_frozen(limiter: &Limiter, key: &str, silent: &str, what: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    let (_, source) = learned(limiter, key).await;
    match source {
        Some(OverrideSource::Learned { left }) if left.is_none_or(|l| l <= MAX_SUSPENSION) => {}
        other => wrong.push(format!("{what}: inspect says {other:?}")),
    }
    answer(&layer(limiter, key, TEN_MINUTES), Some("p;q=5;w=1")).await;
    let (quota, _) = learned(limiter, key).await;
    if quota != Some(Quotas::from(per_second(5))) {
        wrong.push(format!("{what}: a later announcement left {quota:?}"));
    }
    answer(&layer(limiter, silent, TEN_MINUTES), None).await;
    let (quota, _) = learned(limiter, silent).await;
    if quota.is_some() {
        wrong.push(format!("{what}: silence left {quota:?}"));
    }
    wrong
}

/// The record's end (µs since the epoch, as the store's clock counts) replaced with `end` on
/// Redis, its override and TTL kept; `tail` is appended (a record longer than its controls).
fn rewrite_end(redis: &RedisServer, record_key: &str, end: f64, tail: &[u8]) {
    let mut conn = redis.conn();
    let mut record: Vec<u8> = redis::cmd("GET").arg(record_key).query(&mut conn).unwrap();
    assert_eq!(record.first(), Some(&b'M'), "{record_key}: {record:?}");
    record[1..9].copy_from_slice(&end.to_le_bytes());
    record.extend_from_slice(tail);
    let _: () = redis::cmd("SET")
        .arg(record_key)
        .arg(record)
        .arg("KEEPTTL")
        .query(&mut conn)
        .unwrap();
}

fn now_micros() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as f64
}

const YEAR_MICROS: f64 = 365.0 * 86_400.0 * 1e6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_far_learning_record_never_freezes_the_learned_quota_on_redis() {
    let redis = RedisServer::start();
    let limiter = support::redis_limiter(&redis, Algorithm::TokenBucket);
    let ends: [(&str, f64, &[u8]); 7] = [
        ("infinite", f64::INFINITY, b""),
        ("nan", f64::NAN, b""),
        ("negative infinite", f64::NEG_INFINITY, b""),
        ("negative", -1e15, b""),
        ("largest double", f64::MAX, b""),
        ("ten years ahead", now_micros() + 10.0 * YEAR_MICROS, b""),
        // Longer than its controls: what follows them is kept, the end still bounded.
        (
            "years ahead, longer",
            now_micros() + 10.0 * YEAR_MICROS,
            b"\x01\x02\x03",
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (what, end, tail)) in ends.into_iter().enumerate() {
        let (key, silent) = (format!("far-{i}"), format!("far-silent-{i}"));
        for key in [&key, &silent] {
            learn_forty(&limiter, key, TEN_MINUTES).await;
            let record = format!("{}#l", limiter.storage_key(key));
            rewrite_end(&redis, &record, end, tail);
        }
        wrong.extend(never_frozen(&limiter, &key, &silent, what).await);
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A record set under a 30-day `learned_ttl` (another instance's setting, during a rolling
/// change) is read under this instance's own (10 minutes): it is replaced and cleared as its
/// own would be, on Redis and on the memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_learned_under_a_longer_ttl_follows_this_instances_ttl() {
    let redis = RedisServer::start();
    let on_redis = support::redis_limiter(&redis, Algorithm::TokenBucket);
    let in_memory = Limiter::new(MemoryStore::new());
    let thirty_days = Duration::from_secs(30 * 86_400);
    let mut wrong = Vec::new();
    for (store, limiter) in [("redis", &on_redis), ("memory", &in_memory)] {
        for key in ["long", "long-silent"] {
            learn_forty(limiter, key, thirty_days).await;
        }
        let what = format!("{store}: learned for 30 days");
        wrong.extend(never_frozen(limiter, "long", "long-silent", &what).await);
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// On the memory store: a record written years ahead (a learning write stamped with a clock
/// far ahead) never freezes the learned quota either.
#[tokio::test]
async fn a_learning_record_years_ahead_never_freezes_the_learned_quota_in_memory() {
    let store = MemoryStore::new();
    let limiter = Limiter::new(store.clone());
    let forty = Quotas::from(per_second(40));
    let ahead = (now_micros() + 10.0 * YEAR_MICROS) as u64;
    for key in ["ahead", "ahead-silent"] {
        let storage_key = limiter.storage_key(key);
        let request = ControlRequest {
            key: &storage_key,
            algorithm: Algorithm::TokenBucket,
            control: Control::Learn(&forty, TEN_MINUTES),
            now_micros: Some(ahead),
        };
        store.control(request).await.unwrap();
        let (quota, source) = learned(&limiter, key).await;
        assert_eq!(quota, Some(forty), "{key}");
        assert!(
            matches!(source, Some(OverrideSource::Learned { .. })),
            "{source:?}"
        );
    }
    let wrong = never_frozen(&limiter, "ahead", "ahead-silent", "ten years ahead").await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A record cut short holds no whole override, so it marks nothing: the override reads as an
/// operator's (learning never takes for its own an override it cannot prove it set), and an
/// operator's `clear_quota` ends it, after which learning learns again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learning_record_cut_short_marks_nothing_and_clear_quota_ends_it() {
    let redis = RedisServer::start();
    let limiter = support::redis_limiter(&redis, Algorithm::TokenBucket);
    let key = "cut";
    learn_forty(&limiter, key, TEN_MINUTES).await;
    let record_key = format!("{}#l", limiter.storage_key(key));
    let mut conn = redis.conn();
    let record: Vec<u8> = redis::cmd("GET").arg(&record_key).query(&mut conn).unwrap();
    let _: () = redis::cmd("SET")
        .arg(&record_key)
        .arg(&record[..record.len() - 1])
        .arg("KEEPTTL")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        learned(&limiter, key).await.1,
        Some(OverrideSource::Operator)
    );
    answer(&layer(&limiter, key, TEN_MINUTES), Some("p;q=5;w=1")).await;
    let (quota, _) = learned(&limiter, key).await;
    assert_eq!(
        quota,
        Some(Quotas::from(per_second(40))),
        "an operator's stays"
    );
    limiter.clear_quota(key).await.unwrap();
    answer(&layer(&limiter, key, TEN_MINUTES), Some("p;q=5;w=1")).await;
    let (quota, source) = learned(&limiter, key).await;
    assert_eq!(quota, Some(Quotas::from(per_second(5))));
    assert!(matches!(source, Some(OverrideSource::Learned { .. })));
}
