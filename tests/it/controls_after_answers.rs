//! A control made through a limiter after its outbound layer handed an upstream's answer back
//! wins over the writes that answer started and that are still in flight on this instance:
//! an operator's `resume` is not undone by the pacing suspension of a `503` with
//! `Retry-After` (or of nothing left until a reset), and an operator's `clear_quota` is not
//! undone by the learning round of an announcement. On Redis and on the memory store.

use std::convert::Infallible;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::store::MemoryStore;
use redlimit::{Algorithm, Limiter, Quota};
use tower::{Layer, ServiceExt};

use crate::support::{self, RedisServer};

fn per_second(limit: u64) -> Quota {
    Quota::per_second(limit).unwrap()
}

/// An answer that asks the fleet to pause 1 s: a `503` with `Retry-After: 1`, or a `200` saying
/// nothing is left until the reset in 1 s.
#[derive(Debug, Clone, Copy)]
enum Pause {
    RetryAfter,
    NothingLeft,
}

/// One call through `layer` to an upstream answering `status` with `headers`; the answer.
async fn answer(
    layer: &OutboundLayer,
    status: StatusCode,
    headers: &'static [(&'static str, &'static str)],
) -> Result<StatusCode, OutboundError<Infallible>> {
    let upstream = tower::service_fn(move |_: Request<String>| async move {
        let mut response = Response::new(String::new());
        *response.status_mut() = status;
        for (name, value) in headers {
            let value = HeaderValue::from_static(value);
            response.headers_mut().insert(*name, value);
        }
        Ok::<_, Infallible>(response)
    });
    let response = layer
        .layer(upstream)
        .oneshot(Request::new(String::new()))
        .await?;
    Ok(response.status())
}

/// The upstream asks `pause` on `key`; as soon as the answer is back, the operator resumes the
/// key through the same limiter. Returns what went wrong: the next call refused, or the key
/// found suspended once the layer has settled.
async fn resumed_after(limiter: &Limiter, key: &str, pause: Pause) -> Option<String> {
    let layer = OutboundLayer::builder(limiter.clone(), per_second(50), key)
        .max_wait(Duration::ZERO)
        .build()
        .unwrap();
    let (status, headers): (_, &'static [_]) = match pause {
        Pause::RetryAfter => (StatusCode::SERVICE_UNAVAILABLE, &[("retry-after", "1")]),
        Pause::NothingLeft => (StatusCode::OK, &[("ratelimit", "p;r=0;t=1")]),
    };
    let got = answer(&layer, status, headers).await;
    assert_eq!(got.ok(), Some(status), "{key}");
    limiter.resume(key).await.unwrap();
    let next = answer(&layer, StatusCode::OK, &[]).await;
    layer.settled().await;
    let left = limiter.inspect(key).await.unwrap().suspended_for;
    match (next, left) {
        (Ok(_), None) => None,
        (next, left) => Some(format!(
            "{key} {pause:?}: next call {next:?}, suspended for {left:?}"
        )),
    }
}

/// Ten rounds of each answer on `limiter`; what went wrong in each.
async fn ten_resumes(limiter: &Limiter, store: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for pause in [Pause::RetryAfter, Pause::NothingLeft] {
        for i in 0..10 {
            let key = format!("{store}-{pause:?}-{i}");
            wrong.extend(resumed_after(limiter, &key, pause).await);
        }
    }
    println!("{store}: {} of 20 resumes undone", wrong.len());
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_after_the_answer_wins_over_its_pacing_write_on_redis() {
    let redis = RedisServer::start();
    let limiter = support::redis_limiter(&redis, Algorithm::TokenBucket);
    let wrong = ten_resumes(&limiter, "redis").await;
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(limiter.stats().store_errors, 0);
}

#[tokio::test]
async fn a_resume_after_the_answer_wins_over_its_pacing_write_in_memory() {
    let limiter = Limiter::new(MemoryStore::new());
    let wrong = ten_resumes(&limiter, "memory").await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// An operator's `clear_quota` made as soon as an answer announcing a quota is back: the
/// learning round that answer started does not set it afterwards.
async fn ten_clears(limiter: &Limiter, store: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for i in 0..10 {
        let key = format!("{store}-learned-{i}");
        let layer = OutboundLayer::builder(limiter.clone(), per_second(50), key.as_str())
            .learn_quota(per_second(50))
            .max_wait(Duration::ZERO)
            .build()
            .unwrap();
        let got = answer(&layer, StatusCode::OK, &[("ratelimit-policy", "p;q=5;w=1")]).await;
        assert_eq!(got.ok(), Some(StatusCode::OK));
        limiter.clear_quota(key.as_str()).await.unwrap();
        layer.settled().await;
        let status = limiter.inspect(key.as_str()).await.unwrap();
        if let Some(quota) = status.quota_override {
            wrong.push(format!("{key}: {quota:?} after clear_quota"));
        }
    }
    println!("{store}: {} of 10 clears undone", wrong.len());
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_quota_after_the_answer_wins_over_its_learning_round() {
    let redis = RedisServer::start();
    let on_redis = support::redis_limiter(&redis, Algorithm::TokenBucket);
    let mut wrong = ten_clears(&on_redis, "redis").await;
    wrong.extend(ten_clears(&Limiter::new(MemoryStore::new()), "memory").await);
    assert!(wrong.is_empty(), "{wrong:#?}");
}
