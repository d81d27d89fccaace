//! Misconfiguration is loud: a quota the algorithm refuses stops the layer from being
//! built, and requests without a key are counted and logged once, with the likely cause.

use crate::support;

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use redlimit::key::PeerIp;
use redlimit::{limiter::ConfigError, quota::QuotaError, Algorithm, Quota, RateLimitLayer};
use support::RedisServer;

/// Built anyway, the layer would answer 429 to every request forever.
#[test]
#[should_panic(expected = "use sliding-window")]
fn a_layer_with_a_quota_the_algorithm_refuses_is_not_built() {
    let redis = RedisServer::start();
    let huge = Quota::per_second(1_000_000).unwrap();
    let limiter = support::redis_limiter(&redis, Algorithm::SlidingLog);
    let built = RateLimitLayer::builder(limiter.clone(), huge, PeerIp::new()).build();
    assert_eq!(
        built.err(),
        Some(ConfigError::Quota(QuotaError::BurstTooLargeForSlidingLog))
    );
    RateLimitLayer::new(limiter, huge, PeerIp::new());
}

/// axum served without `into_make_service_with_connect_info`: `PeerIp` sees no address, every
/// client lands on the shared key: it is counted and said once.
#[tokio::test(flavor = "current_thread")]
async fn requests_without_a_key_are_counted_and_warned_about_once() {
    let (logs, _guard) = crate::support::logs::capture(tracing::Level::WARN);

    let redis = RedisServer::start();
    let limiter = support::redis_limiter(&redis, Algorithm::TokenBucket);
    let layer = RateLimitLayer::new(
        limiter.clone(),
        Quota::per_minute(100).unwrap(),
        PeerIp::new(),
    );
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    for _ in 0..3 {
        let raw = support::service::raw_get(addr).await;
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    }
    server.abort();

    let stats = limiter.stats();
    assert_eq!((stats.unkeyed, stats.allowed), (3, 3));
    let logs = logs.text();
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("MissingKey::Shared"))
        .collect();
    assert_eq!(warnings.len(), 1, "{logs}");
    assert!(warnings[0].contains("WARN"), "{logs}");
    assert!(
        warnings[0].contains("into_make_service_with_connect_info"),
        "{logs}"
    );
}
