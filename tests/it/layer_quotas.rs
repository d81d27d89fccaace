//! Several quotas, tiers, suspension and overrides through the layer, on a real Redis.
//!
//! Each test starts its own `redis-server`; the limiter runs on a `ManualClock` that moves only
//! when a test says so, so every number in the headers is exact.

use crate::greeter;
use crate::support;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use redlimit::key::{GlobalKey, HeaderKey};
use redlimit::store::RedisStore;
use redlimit::{
    clock::ManualClock,
    layer::{resolver_fn, QuotaResolver, Resolved},
    Algorithm, Decision, Quota, Quotas, RateLimitLayer, Target,
};
use support::{Ctx, Fixture, RedisServer};
use tower::ServiceExt;

/// 10 a second and 20 a minute.
fn two_tiers() -> Quotas {
    Quotas::new([
        Quota::per_second(10).unwrap(),
        Quota::per_minute(20).unwrap(),
    ])
    .unwrap()
}

/// An axum app answering `ok` behind `layer`; the handler echoes the `remaining` of the
/// decision it reads from the extensions.
fn app<K: redlimit::key::KeyExtractor>(layer: RateLimitLayer<K>) -> Router {
    Router::new()
        .route(
            "/",
            get(|Extension(decision): Extension<Decision>| async move {
                decision.remaining.to_string()
            }),
        )
        .layer(layer)
}

fn get_with(headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::get("/");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

fn grpc_request() -> Request<Body> {
    Request::post("/pkg.Service/Method")
        .header("content-type", "application/grpc+proto")
        .body(Body::empty())
        .unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

async fn body_text(response: Response<Body>) -> String {
    let bytes: Bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Sends `request` `n` times; the responses.
async fn send(app: &Router, n: usize, request: impl Fn() -> Request<Body>) -> Vec<Response<Body>> {
    let mut responses = Vec::with_capacity(n);
    for _ in 0..n {
        responses.push(app.clone().oneshot(request()).await.unwrap());
    }
    responses
}

fn statuses(responses: &[Response<Body>]) -> Vec<u16> {
    responses.iter().map(|r| r.status().as_u16()).collect()
}

const BOTH_TIERS: &str = r#""default-1";q=10;w=1, "default-2";q=20;w=60"#;

/// 10/s + 20/min: both tiers listed on every response, the binding one in `RateLimit`, and a
/// request the per-second tier denies takes nothing from the per-minute tier.
#[tokio::test]
async fn two_tiers_list_both_name_the_binding_one_and_deny_all_or_none() {
    let fx = Fixture::new();
    let layer = RateLimitLayer::new(fx.limiter.clone(), two_tiers(), GlobalKey::new("client"));
    assert_eq!(layer.scope(), "default:token-bucket:10/1s+20/60s");
    let app = app(layer);
    let get = || get_with(&[]);

    // t = 0: the second's 10.
    let first = send(&app, 10, get).await;
    assert_eq!(statuses(&first), [200; 10]);
    let h = first[0].headers();
    assert_eq!(header(h, "ratelimit-policy"), Some(BOTH_TIERS));
    // 9 left this second, 19 this minute: the per-second tier binds. The key is full in every
    // tier in 3 s (the minute's token), but the per-second tier's own `t` is at most its
    // `w=1` (`t=3` or `t=30` under `w=1` would contradict the policy).
    assert_eq!(header(h, "ratelimit"), Some(r#""default-1";r=9;t=1"#));
    let last = first.into_iter().last().unwrap();
    assert_eq!(
        header(last.headers(), "ratelimit"),
        Some(r#""default-1";r=0;t=1"#)
    );
    assert_eq!(
        body_text(last).await,
        "0",
        "the handler reads the binding decision"
    );

    // Five more this second: the per-second tier denies them (the minute still has 10).
    let denied = send(&app, 5, get).await;
    assert_eq!(statuses(&denied), [429; 5]);
    for response in &denied {
        let h = response.headers();
        assert_eq!(header(h, "retry-after"), Some("1"));
        assert_eq!(header(h, "ratelimit-policy"), Some(BOTH_TIERS));
        assert_eq!(header(h, "ratelimit"), Some(r#""default-1";r=0;t=1"#));
    }

    // t = 3 s: the second is full again and the minute got one back: 10 + 1 = 11 left, had the
    // denials consumed from it, 6.
    fx.clock.advance(Duration::from_secs(3));
    let again = send(&app, 10, get).await;
    assert_eq!(statuses(&again), [200; 10]);
    // The 10th leaves 0 this second and 1 this minute (the key full again in 19 × 3 s; the
    // per-second tier in 1 s).
    let h = again[9].headers();
    assert_eq!(header(h, "ratelimit"), Some(r#""default-1";r=0;t=1"#));
    let over = send(&app, 1, get).await;
    assert_eq!(statuses(&over), [429]);
    assert_eq!(
        header(over[0].headers(), "ratelimit"),
        Some(r#""default-1";r=0;t=1"#)
    );

    // t = 6 s: the second is full, the minute holds 2: now the minute binds.
    fx.clock.advance(Duration::from_secs(3));
    let minute_bound = send(&app, 3, get).await;
    assert_eq!(statuses(&minute_bound), [200, 200, 429]);
    let h = minute_bound[0].headers();
    // 1 left; full again after 19 tokens at one per 3 s.
    assert_eq!(header(h, "ratelimit"), Some(r#""default-2";r=1;t=57"#));
    let h = minute_bound[1].headers();
    assert_eq!(header(h, "ratelimit"), Some(r#""default-2";r=0;t=60"#));
    let h = minute_bound[2].headers();
    assert_eq!(header(h, "retry-after"), Some("3"));
    assert_eq!(header(h, "ratelimit-policy"), Some(BOTH_TIERS));
    assert_eq!(header(h, "ratelimit"), Some(r#""default-2";r=0;t=3"#));
    assert_eq!(fx.limiter.stats().denied, 7);
}

/// FREE 2 a minute and PRO 5 a minute, chosen from the `x-plan` header: once by a closure that
/// answers at once, once by a lookup that waits (`Resolved::Pending`).
#[tokio::test]
async fn free_and_pro_tiers_from_a_header_sync_and_async() {
    let free = Quota::per_minute(2).unwrap();
    let pro = Quota::per_minute(5).unwrap();
    let sync = resolver_fn(move |parts, _key| match parts.headers.get("x-plan") {
        Some(plan) if plan == "pro" => Resolved::Ready(pro.into()),
        _ => Resolved::Default,
    });
    check_free_and_pro(free, sync).await;

    /// The plans of API keys as "the billing database" knows them, read asynchronously.
    struct Billing {
        plans: Arc<HashMap<&'static str, Quotas>>,
    }
    impl QuotaResolver for Billing {
        fn resolve(&self, parts: &http::request::Parts, _key: &str) -> Resolved {
            let plans = self.plans.clone();
            let plan = parts
                .headers
                .get("x-plan")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("free")
                .to_owned();
            Resolved::pending(async move {
                tokio::task::yield_now().await; // a round trip to the database
                plans.get(plan.as_str()).copied()
            })
        }
    }
    let billing = Billing {
        plans: Arc::new(HashMap::from([("pro", Quotas::from(pro))])),
    };
    check_free_and_pro(free, billing).await;
}

/// Keys `alice` (FREE, the layer's default) and `bob` (`x-plan: pro`) through a layer with
/// `resolver`.
async fn check_free_and_pro(free: Quota, resolver: impl QuotaResolver) {
    let fx = Fixture::new();
    let layer = RateLimitLayer::builder(
        fx.limiter.clone(),
        free,
        HeaderKey::named("x-api-key").unwrap(),
    )
    .policy_name("api")
    .resolver(resolver)
    .build()
    .unwrap();
    // The scope is the layer's own (its policy name), whatever the tier.
    assert_eq!(layer.scope(), "api");
    let app = app(layer);

    let alice = send(&app, 3, || get_with(&[("x-api-key", "alice")])).await;
    assert_eq!(statuses(&alice), [200, 200, 429]);
    assert_eq!(
        header(alice[0].headers(), "ratelimit-policy"),
        Some(r#""api";q=2;w=60"#)
    );
    assert_eq!(
        header(alice[0].headers(), "ratelimit"),
        Some(r#""api";r=1;t=30"#)
    );
    assert_eq!(header(alice[2].headers(), "retry-after"), Some("30"));

    let pro = || get_with(&[("x-api-key", "bob"), ("x-plan", "pro")]);
    let bob = send(&app, 6, pro).await;
    assert_eq!(statuses(&bob), [200, 200, 200, 200, 200, 429]);
    assert_eq!(
        header(bob[0].headers(), "ratelimit-policy"),
        Some(r#""api";q=5;w=60"#)
    );
    assert_eq!(
        header(bob[0].headers(), "ratelimit"),
        Some(r#""api";r=4;t=12"#)
    );
    assert_eq!(header(bob[5].headers(), "retry-after"), Some("12"));
    assert_eq!(
        header(bob[5].headers(), "ratelimit"),
        Some(r#""api";r=0;t=12"#)
    );
}

/// A suspended key is denied over HTTP and gRPC with the time left, `r=0`, and a message that
/// says so, without calling the service; resumed, it passes again with its quota intact.
#[tokio::test]
async fn a_suspended_key_is_told_so_over_http_and_grpc() {
    let fx = Fixture::new();
    let layer = RateLimitLayer::new(fx.limiter.clone(), two_tiers(), GlobalKey::new("client"));
    let target = Target::scoped(layer.scope(), "client");
    let app = app(layer.clone());

    fx.limiter
        .suspend(target, Duration::from_secs(120))
        .await
        .unwrap();
    let http = app.clone().oneshot(get_with(&[])).await.unwrap();
    assert_eq!(http.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = http.headers();
    assert_eq!(header(h, "retry-after"), Some("120"));
    assert_eq!(header(h, "ratelimit-policy"), Some(BOTH_TIERS));
    let state = header(h, "ratelimit").unwrap();
    assert!(state.ends_with(";r=0;t=120"), "{state}");
    assert_eq!(
        body_text(http).await,
        "rate limit: suspended, retry later\n"
    );

    fx.clock.advance(Duration::from_secs(30));
    let grpc = app.clone().oneshot(grpc_request()).await.unwrap();
    assert_eq!(grpc.status(), StatusCode::OK);
    let h = grpc.headers();
    assert_eq!(header(h, "grpc-status"), Some("8"));
    assert!(header(h, "grpc-message").unwrap().contains("suspended"));
    assert_eq!(header(h, "retry-after"), Some("90"));
    assert_eq!(header(h, "grpc-retry-pushback-ms"), Some("90000"));
    assert_eq!(fx.limiter.stats().suspended, 2);

    fx.limiter
        .resume(Target::scoped(layer.scope(), "client"))
        .await
        .unwrap();
    let resumed = app.oneshot(get_with(&[])).await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    assert_eq!(
        header(resumed.headers(), "ratelimit"),
        Some(r#""default-1";r=9;t=1"#)
    );
}

/// An override set with `set_quota` is what the headers show (alone, under the bare policy
/// name), it wins over the resolver, and clearing it brings the tiers back.
#[tokio::test]
async fn an_override_shows_in_the_headers_and_wins_over_the_resolver() {
    let fx = Fixture::new();
    let pro: Quotas = Quota::per_minute(1000).unwrap().into();
    let layer = RateLimitLayer::builder(fx.limiter.clone(), two_tiers(), GlobalKey::new("client"))
        .resolver(resolver_fn(move |parts, _key| {
            parts.headers.contains_key("x-pro").then_some(pro)
        }))
        .build()
        .unwrap();
    let target = || Target::scoped(layer.scope(), "client");
    let app = app(layer.clone());

    let granted: Quotas = Quota::per_minute(3).unwrap().into();
    fx.limiter.set_quota(target(), &granted).await.unwrap();
    // Through the default tiers and through the resolver's PRO tier alike: the override.
    let responses = send(&app, 2, || get_with(&[])).await;
    assert_eq!(statuses(&responses), [200, 200]);
    let h = responses[0].headers();
    assert_eq!(header(h, "ratelimit-policy"), Some(r#""default";q=3;w=60"#));
    assert_eq!(header(h, "ratelimit"), Some(r#""default";r=2;t=20"#));
    let responses = send(&app, 2, || get_with(&[("x-pro", "1")])).await;
    assert_eq!(statuses(&responses), [200, 429]);
    let h = responses[1].headers();
    assert_eq!(header(h, "ratelimit-policy"), Some(r#""default";q=3;w=60"#));
    assert_eq!(header(h, "ratelimit"), Some(r#""default";r=0;t=20"#));
    assert_eq!(header(h, "retry-after"), Some("20"));

    fx.limiter.clear_quota(target()).await.unwrap();
    fx.clock.advance(Duration::from_secs(60)); // whatever the state, full again
    let pro = app
        .clone()
        .oneshot(get_with(&[("x-pro", "1")]))
        .await
        .unwrap();
    assert_eq!(pro.status(), StatusCode::OK);
    assert_eq!(
        header(pro.headers(), "ratelimit-policy"),
        Some(r#""default";q=1000;w=60"#)
    );
    let free = app.oneshot(get_with(&[])).await.unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    assert_eq!(header(free.headers(), "ratelimit-policy"), Some(BOTH_TIERS));
}

/// With jitter the `Retry-After` of a denial lies between the true wait and the wait plus the
/// bound, and varies; the `RateLimit` header keeps the exact wait.
#[tokio::test]
async fn retry_after_jitter_stays_within_its_bound() {
    let fx = Fixture::new();
    let layer = RateLimitLayer::builder(
        fx.limiter.clone(),
        Quota::per_minute(1).unwrap(),
        GlobalKey::new("client"),
    )
    .retry_after_jitter(Duration::from_secs(30))
    .build()
    .unwrap();
    let app = app(layer);
    let responses = send(&app, 41, || get_with(&[])).await;
    assert_eq!(responses[0].status(), StatusCode::OK);
    let mut seen = std::collections::BTreeSet::new();
    for response in &responses[1..] {
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry: u64 = header(response.headers(), "retry-after")
            .unwrap()
            .parse()
            .unwrap();
        assert!((60..=90).contains(&retry), "{retry}");
        assert_eq!(
            header(response.headers(), "ratelimit"),
            Some(r#""default";r=0;t=60"#)
        );
        seen.insert(retry);
    }
    assert!(seen.len() > 1, "40 draws over 31 values: {seen:?}");
}

/// A real tonic client calling a server whose key is suspended gets `RESOURCE_EXHAUSTED`, a
/// message that says "suspended", and the time left in its retry metadata.
#[tokio::test]
async fn a_tonic_client_is_told_the_key_is_suspended() {
    use greeter::HelloRequest;

    let fx = Fixture::new();
    let layer = RateLimitLayer::new(fx.limiter.clone(), two_tiers(), GlobalKey::new("client"));
    fx.limiter
        .suspend(
            Target::scoped(layer.scope(), "client"),
            Duration::from_secs(45),
        )
        .await
        .unwrap();
    let server = crate::tonic::Server::start(layer).await;
    let mut client = server.client_from("127.0.0.1").await;
    let hello = HelloRequest {
        name: "test".to_owned(),
    };
    let status = client.say_hello(hello).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("suspended"), "{status:?}");
    let metadata = |name: &str| status.metadata().get(name).unwrap().to_str().unwrap();
    assert_eq!(metadata("retry-after"), "45");
    assert_eq!(metadata("grpc-retry-pushback-ms"), "45000");
    drop(server);
}

/// The issue-21 override: a layer of 10/1s + 500/60s under the override 10/1s + 50/60s. The
/// override binds on its 10/1s, equal to the layer's first tier; the headers describe the
/// override alone (before: the layer's list, `"default-2";q=500;w=60` included).
#[tokio::test]
async fn an_override_equal_to_a_layer_tier_is_advertised_as_itself() {
    let fx = Fixture::new();
    let layer_quotas = Quotas::new([
        Quota::per_second(10).unwrap(),
        Quota::per_minute(500).unwrap(),
    ])
    .unwrap();
    let layer = RateLimitLayer::new(fx.limiter.clone(), layer_quotas, GlobalKey::new("client"));
    let app = app(layer.clone());
    let granted = Quotas::new([
        Quota::per_second(10).unwrap(),
        Quota::per_minute(50).unwrap(),
    ])
    .unwrap();
    fx.limiter
        .set_quota(Target::scoped(layer.scope(), "client"), &granted)
        .await
        .unwrap();
    let responses = send(&app, 11, || get_with(&[])).await;
    assert_eq!(
        statuses(&responses),
        [[200; 10].as_slice(), &[429]].concat()
    );
    for response in &responses {
        let h = response.headers();
        assert_eq!(header(h, "ratelimit-policy"), Some(r#""default";q=10;w=1"#));
        let state = header(h, "ratelimit").unwrap();
        assert!(state.starts_with(r#""default";r="#), "{state}");
    }
    assert_eq!(
        header(responses[9].headers(), "ratelimit"),
        Some(r#""default";r=0;t=1"#)
    );
}

/// A gRPC-Web request denied by the layer is answered in gRPC-Web (a trailers-only response
/// with `content-type: application/grpc-web`), never as native gRPC.
#[tokio::test]
async fn a_grpc_web_request_is_answered_in_grpc_web() {
    let fx = Fixture::new();
    let layer = RateLimitLayer::new(
        fx.limiter.clone(),
        Quota::per_minute(1).unwrap(),
        GlobalKey::new("client"),
    );
    let app = app(layer);
    let grpc_web = |content_type: &'static str| {
        move || {
            Request::get("/")
                .header("content-type", content_type)
                .header("x-grpc-web", "1")
                .body(Body::empty())
                .unwrap()
        }
    };
    let first = send(&app, 1, grpc_web("application/grpc-web+proto")).await;
    assert_eq!(statuses(&first), [200]);
    for (sent, answered) in [
        ("application/grpc-web+proto", "application/grpc-web"),
        ("application/grpc-web", "application/grpc-web"),
        (
            "application/grpc-web-text+proto",
            "application/grpc-web-text",
        ),
    ] {
        let denied = send(&app, 1, grpc_web(sent)).await.pop().unwrap();
        assert_eq!(denied.status(), StatusCode::OK, "{sent}");
        let h = denied.headers();
        assert_eq!(header(h, "content-type"), Some(answered), "{sent}");
        assert_eq!(header(h, "grpc-status"), Some("8"), "{sent}");
        assert_eq!(header(h, "grpc-message"), Some("rate limit exceeded"));
        assert_eq!(header(h, "retry-after"), Some("60"));
        assert_eq!(body_text(denied).await, "", "{sent}: trailers-only");
    }
    // Native gRPC keeps its own content type.
    let native = send(&app, 1, grpc_web("application/grpc+proto"))
        .await
        .pop()
        .unwrap();
    assert_eq!(
        header(native.headers(), "content-type"),
        Some("application/grpc")
    );
}

/// One property-test scenario: an algorithm, the layer's quotas, maybe an override, and steps.
#[derive(Debug, Clone)]
struct HeaderScenario {
    algorithm: Algorithm,
    quotas: Vec<Quota>,
    /// The override's quotas; its first one may copy the layer's first (the case that was
    /// advertised as the layer's own tier).
    overridden: Option<Vec<Quota>>,
    /// Each step: advance the clock by this many ms, then send a request of this cost.
    steps: Vec<(u64, u64)>,
}

fn any_quota() -> impl Strategy<Value = Quota> {
    let period_ms = prop_oneof![
        Just(250u64),
        Just(1_000),
        Just(1_500),
        Just(60_000),
        Just(3_600_000),
        100u64..=120_000,
    ];
    (1u64..=20, period_ms, 1u64..=5).prop_map(|(limit, period_ms, burst_times)| {
        let quota = Quota::new(limit, Duration::from_millis(period_ms)).unwrap();
        // Bursts above the limit are where `q=limit` and `r` disagreed.
        quota.with_burst(limit * burst_times).unwrap()
    })
}

fn header_scenario() -> impl Strategy<Value = HeaderScenario> {
    let algorithm = proptest::sample::select(Algorithm::ALL.to_vec());
    let quotas = proptest::collection::vec(any_quota(), 1..=2);
    let overridden =
        proptest::option::of((proptest::collection::vec(any_quota(), 1..=2), any::<bool>()));
    let step = (
        prop_oneof![Just(0u64), 1u64..=2_000, 1u64..=200_000],
        1u64..=3,
    );
    let steps = proptest::collection::vec(step, 1..=25);
    (algorithm, quotas, overridden, steps).prop_map(|(algorithm, quotas, overridden, steps)| {
        let overridden = overridden.map(|(mut own, copy_first)| {
            if copy_first {
                own[0] = quotas[0];
            }
            own
        });
        HeaderScenario {
            algorithm,
            quotas,
            overridden,
            steps,
        }
    })
}

/// `RateLimit-Policy` items by name: (q, w).
fn policy_items(value: &str) -> Vec<(String, u64, u64)> {
    value
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap().to_owned();
            let q = parts
                .next()
                .unwrap()
                .strip_prefix("q=")
                .unwrap()
                .parse()
                .unwrap();
            let w = parts
                .next()
                .unwrap()
                .strip_prefix("w=")
                .unwrap()
                .parse()
                .unwrap();
            (name, q, w)
        })
        .collect()
}

/// `RateLimit`: (name, r, t).
fn state_item(value: &str) -> (String, u64, u64) {
    let mut parts = value.split(';');
    let name = parts.next().unwrap().to_owned();
    let r = parts
        .next()
        .unwrap()
        .strip_prefix("r=")
        .unwrap()
        .parse()
        .unwrap();
    let t = parts
        .next()
        .unwrap()
        .strip_prefix("t=")
        .unwrap()
        .parse()
        .unwrap();
    (name, r, t)
}

/// Counts what the property test saw, for its closing line.
#[derive(Default)]
struct HeaderTally {
    cases: u64,
    responses: u64,
    denied: u64,
    overridden: u64,
}

/// Runs one scenario through the layer on a real Redis and checks every response's headers.
async fn check_headers(
    store: &RedisStore,
    key: &str,
    scenario: &HeaderScenario,
    tally: &mut HeaderTally,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let limiter = Ctx::new(scenario.algorithm)
        .manual(&clock)
        .limiter(store.clone());
    let quotas = Quotas::new(scenario.quotas.iter().copied()).unwrap();
    let layer = RateLimitLayer::builder(limiter.clone(), quotas, GlobalKey::new(key))
        .legacy_headers(true)
        .cost(|parts| {
            let cost = parts
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            cost.unwrap_or(1)
        })
        .build()
        .unwrap();
    if let Some(own) = &scenario.overridden {
        let own = Quotas::new(own.iter().copied()).unwrap();
        limiter
            .set_quota(Target::scoped(layer.scope(), key), &own)
            .await
            .unwrap();
    }
    // The handler reports the decision's own reset, before the headers cap anything.
    let app = Router::new()
        .route(
            "/",
            get(|Extension(decision): Extension<Decision>| async move {
                decision.reset_after_secs().to_string()
            }),
        )
        .layer(layer);
    for (i, &(advance_ms, cost)) in scenario.steps.iter().enumerate() {
        clock.advance(Duration::from_millis(advance_ms));
        let request = Request::get("/")
            .header("x-cost", cost.to_string())
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let h = response.headers().clone();
        let policy = policy_items(header(&h, "ratelimit-policy").unwrap());
        let (name, r, t) = state_item(header(&h, "ratelimit").unwrap());
        let context = format!("step {i}: {status} {h:?}");
        let Some(&(_, q, w)) = policy.iter().find(|(n, _, _)| *n == name) else {
            return Err(TestCaseError::fail(format!(
                "{name} not in the policy; {context}"
            )));
        };
        prop_assert!(r <= q, "r {} > q {}; {}", r, q, context);
        prop_assert!(t <= w, "t {} > w {}; {}", t, w, context);
        let (q_text, r_text) = (q.to_string(), r.to_string());
        prop_assert_eq!(header(&h, "x-ratelimit-limit"), Some(q_text.as_str()));
        prop_assert_eq!(header(&h, "x-ratelimit-remaining"), Some(r_text.as_str()));
        if scenario.overridden.is_some() {
            // The override alone, never the layer's list.
            prop_assert_eq!(policy.len(), 1, "{}", context);
            prop_assert_eq!(name.as_str(), "\"default\"", "{}", context);
            tally.overridden += 1;
        }
        tally.responses += 1;
        if status == StatusCode::OK {
            if scenario.quotas.len() == 1 && scenario.overridden.is_none() {
                // One tier: its own reset fits its window without the headers' cap.
                let reset: u64 = body_text(response).await.parse().unwrap();
                prop_assert!(reset <= w, "reset {} > w {}; {}", reset, w, context);
            }
        } else {
            tally.denied += 1;
        }
    }
    Ok(())
}

/// `r ≤ q` and `t ≤ w` on every response, for every algorithm, with and without an override
/// (a token bucket of 10 a minute with a burst of 50 must not send `q=10` with `r=49`).
#[test]
fn headers_never_contradict_themselves() {
    let redis = RedisServer::start();
    let runtime = support::current_thread_runtime();
    let store = runtime.block_on(async {
        RedisStore::builder(redis.url())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    });
    let tally = RefCell::new(HeaderTally::default());
    let config = ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&header_scenario(), |scenario| {
        let supported = scenario
            .quotas
            .iter()
            .chain(scenario.overridden.iter().flatten())
            .all(|quota| scenario.algorithm.supports(quota).is_ok());
        prop_assume!(supported);
        let mut tally = tally.borrow_mut();
        tally.cases += 1;
        let key = format!("case-{}", tally.cases);
        runtime.block_on(check_headers(&store, &key, &scenario, &mut tally))
    });
    let tally = tally.into_inner();
    if let Err(error) = result {
        panic!("{error}");
    }
    println!(
        "headers property: {} cases, {} responses ({} denied, {} under an override), r <= q and t <= w on each",
        tally.cases, tally.responses, tally.denied, tally.overridden
    );
    assert!(tally.denied > 0 && tally.overridden > 0);
}
