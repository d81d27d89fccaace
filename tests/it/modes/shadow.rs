//! Shadow mode: decided and recorded like a real limit, never enforced.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use redlimit::key::GlobalKey;
use redlimit::layer::RateLimitLayerBuilder;
use redlimit::layer::ShadowLimited;
use redlimit::{Limiter, Quota, Quotas, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

use crate::support::service::counting;
use crate::support::{Ctx, RedisServer};

fn request() -> Request<Full<Bytes>> {
    Request::new(Full::new(Bytes::new()))
}

/// A layer over `limiter` in shadow on the key "s", `limit` a minute.
fn shadow_per_minute(limiter: &Limiter, limit: u64) -> RateLimitLayerBuilder<GlobalKey> {
    let quota = Quota::per_minute(limit).unwrap();
    RateLimitLayer::builder(limiter.clone(), quota, GlobalKey::new("s")).shadow(true)
}

/// A layer in shadow over 3 a minute: 10 requests all reach the service, 7 are recorded as
/// shadow-limited, none carries a RateLimit header (unless asked), none is denied.
async fn shadow_layer_forwards_everything(limiter: Limiter, headers: bool) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = shadow_per_minute(&limiter, 3)
        .shadow_headers(headers)
        .build()
        .unwrap();
    let mut svc = layer.layer(counting(calls.clone()));
    let mut marked = 0;
    for _ in 0..10 {
        let response = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers().contains_key("ratelimit"), headers);
        // The inner service echoes the remaining it saw: 2, 1, 0, then 0 for the denials.
        marked += usize::from(response.headers()["x-seen-remaining"] == "0");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    let stats = limiter.stats();
    assert_eq!(
        (stats.allowed, stats.denied, stats.shadow_limited),
        (3, 7, 7)
    );
    assert_eq!(marked, 8);
}

#[tokio::test]
async fn a_shadow_layer_never_denies_on_redis_and_in_memory() {
    let redis = RedisServer::start();
    shadow_layer_forwards_everything(Ctx::default().redis(&redis), false).await;
    shadow_layer_forwards_everything(Ctx::default().memory(), false).await;
    shadow_layer_forwards_everything(Ctx::default().memory(), true).await;
}

/// The Decision in the extensions is the denial, with a ShadowLimited beside it.
#[tokio::test]
async fn the_request_knows_it_would_have_been_denied() {
    let limiter = Ctx::default().memory();
    let layer =
        RateLimitLayer::builder(limiter, Quota::per_minute(1).unwrap(), GlobalKey::new("s"))
            .shadow(true)
            .build()
            .unwrap();
    let svc = tower::service_fn(|req: Request<Full<Bytes>>| async move {
        let decision = *req.extensions().get::<redlimit::Decision>().unwrap();
        let shadow = req.extensions().get::<ShadowLimited>().copied();
        Ok::<_, std::convert::Infallible>(http::Response::new(format!(
            "{} {}",
            decision.allowed,
            shadow.map_or("-".to_owned(), |s| s.0.allowed.to_string())
        )))
    });
    let mut svc = layer.layer(svc);
    let first = svc.ready().await.unwrap().call(request()).await.unwrap();
    let second = svc.ready().await.unwrap().call(request()).await.unwrap();
    use http_body_util::BodyExt;
    let body = |r: http::Response<redlimit::layer::ResponseBody<String>>| async move {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    };
    assert_eq!(body(first).await, "true -");
    assert_eq!(body(second).await, "false false");
}

/// A shadow tier of 2 a minute beside an enforced 5 a minute: the enforced tier decides alone
/// (5 pass, then 429), the shadow tier admits 2 and consumes nothing when it "denies" (its
/// state stays at 0 tokens, never below, and it never blocks the enforced tier).
#[tokio::test]
async fn a_shadow_tier_never_blocks_the_enforced_ones() {
    let redis = RedisServer::start();
    for limiter in [Ctx::default().redis(&redis), Ctx::default().memory()] {
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = RateLimitLayer::builder(
            limiter.clone(),
            Quota::per_minute(5).unwrap(),
            GlobalKey::new("t"),
        )
        .policy_name("api")
        .shadow_quotas(Quotas::from(Quota::per_minute(2).unwrap()))
        .build()
        .unwrap();
        let mut svc = layer.layer(tower::service_fn({
            let calls = calls.clone();
            move |req: Request<Full<Bytes>>| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let shadow = req.extensions().get::<ShadowLimited>().is_some();
                    Ok::<_, std::convert::Infallible>(http::Response::new(shadow.to_string()))
                }
            }
        }));
        let mut statuses = Vec::new();
        let mut shadowed = 0;
        for _ in 0..7 {
            let response = svc.ready().await.unwrap().call(request()).await.unwrap();
            statuses.push(response.status().as_u16());
            use http_body_util::BodyExt;
            let body = response.into_body().collect().await.unwrap().to_bytes();
            shadowed += usize::from(&body[..] == b"true");
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(
            shadowed, 3,
            "the shadow tier would have denied the 3rd to 5th"
        );
        let stats = limiter.stats();
        assert_eq!(
            (stats.allowed, stats.denied, stats.shadow_limited),
            (5, 2, 3)
        );
        // The shadow tier's own state: 2 admitted, nothing taken by its denials.
        let status = limiter
            .inspect(redlimit::Target::scoped("api.shadow", "t"))
            .await
            .unwrap();
        assert_eq!(status.tiers[0].fields[0], ("tokens", 0.0));
        let enforced = limiter
            .inspect(redlimit::Target::scoped("api", "t"))
            .await
            .unwrap();
        assert_eq!(enforced.tiers[0].fields[0], ("tokens", 0.0));
    }
}

/// With Redis down, a shadow layer under FailClosed still forwards.
#[tokio::test]
async fn a_shadow_layer_forwards_when_the_store_fails_closed() {
    let store = redlimit::store::RedisStore::builder(crate::support::example::dead_redis_url())
        .timeout(std::time::Duration::from_millis(50))
        .build()
        .unwrap();
    let limiter = Limiter::builder(store)
        .failure_policy(redlimit::failure_policy::FailClosed::default())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = shadow_per_minute(&limiter, 3).build().unwrap();
    let mut svc = layer.layer(counting(calls.clone()));
    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(limiter.stats().failed_closed, 1);
}

/// Shadow denials are logged at a bounded rate: about 250 of them over 2.5 s give one line a
/// second at most (the gate is process-wide, so another test may take a second's line), each
/// saying how many it left out.
// One thread: the subscriber set for this test sees every event of the calls it makes.
#[tokio::test(flavor = "current_thread")]
async fn shadow_denials_are_logged_at_a_bounded_rate() {
    let (captured, _guard) = crate::support::logs::capture(tracing::Level::INFO);
    let layer = shadow_per_minute(&Ctx::default().memory(), 1)
        .build()
        .unwrap();
    let mut svc = layer.layer(counting(Arc::new(AtomicUsize::new(0))));
    let started = std::time::Instant::now();
    let mut denials = 0;
    while started.elapsed() < std::time::Duration::from_millis(2_500) {
        svc.ready().await.unwrap().call(request()).await.unwrap();
        denials += 1;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let text = captured.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("shadow rate limit would have denied"))
        .collect();
    assert!(denials > 100, "{denials}");
    assert!((1..=3).contains(&lines.len()), "{denials} denials: {text}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("suppressed=") && !l.contains("\"s\"")),
        "{text}"
    );
}

/// A shadow layer with `block_for` blocks nobody: its would-be denials write no suspension.
#[tokio::test]
async fn a_shadow_layer_never_blocks() {
    let limiter = Ctx::default().memory();
    let layer = shadow_per_minute(&limiter, 1)
        .block_for(std::time::Duration::from_secs(600))
        .build()
        .unwrap();
    let mut svc = layer.layer(counting(Arc::new(AtomicUsize::new(0))));
    for _ in 0..3 {
        let response = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(limiter.stats().shadow_limited, 2);
    assert_eq!(limiter.inspect("s").await.unwrap().suspended_for, None);
}
