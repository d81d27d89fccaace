//! The tower layer on a real Redis: headers, 429s, readiness, and the frameworks it must fit
//! (tower's `Buffer`, axum, hyper, tonic).
//!
//! Each test starts its own `redis-server`. The limiter runs on a `ManualClock` that never moves,
//! so every number in the headers is exact.

use crate::support;

use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use redlimit::key::{GlobalKey, HeaderKey};
use redlimit::{
    clock::ManualClock,
    layer::{MissingKey, ResponseBody},
    Decision, Limiter, Quota, Quotas, RateLimitLayer, Target,
};
use support::service::{counting, status_of, statuses_of, SEEN};
use support::{Ctx, Fixture, RedisServer};
use tower::buffer::Buffer;
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service, ServiceExt};

impl Fixture {
    /// 2 requests a minute, all against one key.
    fn layer(&self) -> RateLimitLayer<GlobalKey> {
        RateLimitLayer::new(self.limiter.clone(), two_a_minute(), GlobalKey::new("all"))
    }
}

fn two_a_minute() -> Quota {
    Quota::per_minute(2).unwrap()
}

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).body(Full::default()).unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

async fn body_text<B>(response: Response<B>) -> String
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Two allowed responses with the IETF headers and the decision in the extensions, then a 429
/// that never reaches the inner service.
#[tokio::test]
async fn allowed_then_429_with_headers_and_inner_not_called() {
    let fx = Fixture::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = fx.layer().layer(counting(calls.clone()));

    let first = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let h = first.headers();
    assert_eq!(header(h, "ratelimit-policy"), Some("\"default\";q=2;w=60"));
    // One request left; the bucket is full again 30 s later.
    assert_eq!(header(h, "ratelimit"), Some("\"default\";r=1;t=30"));
    assert_eq!(header(h, SEEN), Some("1"), "the handler reads the Decision");
    assert_eq!(header(h, "retry-after"), None);
    assert_eq!(body_text(first).await, "ok");

    let second = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(
        header(second.headers(), "ratelimit"),
        Some("\"default\";r=0;t=60")
    );
    assert_eq!(header(second.headers(), SEEN), Some("0"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let third = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = third.headers();
    // A token every 30 s, and the clock stood still.
    assert_eq!(header(h, "retry-after"), Some("30"));
    let retry: u64 = header(h, "retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1);
    assert_eq!(header(h, "ratelimit-policy"), Some("\"default\";q=2;w=60"));
    assert_eq!(header(h, "ratelimit"), Some("\"default\";r=0;t=30"));
    assert_eq!(header(h, SEEN), None);
    assert_eq!(calls.load(Ordering::SeqCst), 2, "inner called for a 429");
    assert!(!body_text(third).await.is_empty());
    assert_eq!(fx.limiter.stats().denied, 1);
}

/// `Buffer` over the layer (a shared, cloneable front), and the layer over a `Buffer` (whose
/// `call` panics unless the very instance made ready is called).
#[tokio::test]
async fn works_behind_and_in_front_of_a_buffer() {
    let fx = Fixture::new();

    let calls = Arc::new(AtomicUsize::new(0));
    let buffered = Buffer::new(fx.layer().layer(counting(calls.clone())), 16);
    let statuses = statuses_of(&buffered, 3, || get("/")).await;
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A second key space: the same limiter under another key.
    let layer = RateLimitLayer::new(fx.limiter.clone(), two_a_minute(), GlobalKey::new("other"));
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(Buffer::new(counting(calls.clone()), 1));
    let statuses = statuses_of(&svc, 3, || get("/")).await;
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A gRPC request is answered the gRPC way: HTTP 200, trailers-only, `grpc-status: 8`.
#[tokio::test]
async fn grpc_request_gets_resource_exhausted() {
    let fx = Fixture::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = fx.layer().layer(counting(calls.clone()));
    let grpc = || {
        Request::post("/pkg.Service/Method")
            .header("content-type", "application/grpc+proto")
            .body(Full::default())
            .unwrap()
    };

    for _ in 0..2 {
        let ok = svc.clone().oneshot(grpc()).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(header(ok.headers(), "grpc-status"), None);
    }
    let denied = svc.clone().oneshot(grpc()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::OK);
    let h = denied.headers();
    assert_eq!(header(h, "grpc-status"), Some("8"));
    assert!(header(h, "grpc-message").is_some());
    assert_eq!(header(h, "content-type"), Some("application/grpc"));
    assert_eq!(header(h, "retry-after"), Some("30"));
    assert_eq!(header(h, "ratelimit"), Some("\"default\";r=0;t=30"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(body_text(denied).await, "", "trailers-only: no body");
}

/// Skipped requests pass unchecked and do not consume; the cost function weighs requests, and a
/// cost above capacity gets a 429 that points at the period.
#[tokio::test]
async fn skip_predicate_and_cost_function() {
    let fx = Fixture::new();
    let layer = RateLimitLayer::builder(fx.limiter.clone(), two_a_minute(), GlobalKey::new("k"))
        .skip(|parts| parts.uri.path() == "/health")
        .cost(|parts| match parts.uri.path() {
            "/export" => 2,
            "/huge" => 3,
            _ => 1,
        })
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(counting(calls.clone()));

    for _ in 0..5 {
        let health = svc.clone().oneshot(get("/health")).await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
        assert_eq!(header(health.headers(), "ratelimit"), None);
        assert_eq!(header(health.headers(), SEEN), Some("none"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    // More than the bucket can ever hold: never allowed, Retry-After is the period.
    let huge = svc.clone().oneshot(get("/huge")).await.unwrap();
    assert_eq!(huge.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(huge.headers(), "retry-after"), Some("60"));
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    // The skipped and the impossible requests left the bucket full: one export takes it all.
    let export = svc.clone().oneshot(get("/export")).await.unwrap();
    assert_eq!(export.status(), StatusCode::OK);
    assert_eq!(
        header(export.headers(), "ratelimit"),
        Some("\"default\";r=0;t=60")
    );
    assert_eq!(
        status_of(&svc, get("/")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Health checks still pass with the bucket empty.
    assert_eq!(status_of(&svc, get("/health")).await, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}

/// A cost the quota can never hold: the 429's `RateLimit` field must stay a valid structured
/// field (integers have at most 15 digits, RFC 8941) and agree with `Retry-After`.
#[tokio::test]
async fn cost_above_capacity_headers_are_valid() {
    let fx = Fixture::new();
    let layer = RateLimitLayer::builder(fx.limiter.clone(), two_a_minute(), GlobalKey::new("k"))
        .cost(|_| 3)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let huge = layer
        .layer(counting(calls.clone()))
        .oneshot(get("/"))
        .await
        .unwrap();
    assert_eq!(huge.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let h = huge.headers();
    assert_eq!(header(h, "retry-after"), Some("60"));
    let state = header(h, "ratelimit").unwrap();
    let t: u64 = state.rsplit(";t=").next().unwrap().parse().unwrap();
    assert!(
        t <= 999_999_999_999_999,
        "not a structured-field integer: {state}"
    );
    assert_eq!(state, "\"default\";r=2;t=60");
}

/// A layer of two a minute per `x-api-key` on `fx`'s limiter, answering requests without the
/// header as `on_missing` says.
fn by_api_key(fx: &Fixture, on_missing: MissingKey) -> RateLimitLayer<HeaderKey> {
    let key = HeaderKey::named("x-api-key").unwrap();
    RateLimitLayer::builder(fx.limiter.clone(), two_a_minute(), key)
        .on_missing_key(on_missing)
        .build()
        .unwrap()
}

fn keyed(key: &str) -> Request<Full<Bytes>> {
    Request::get("/")
        .header("x-api-key", key)
        .body(Full::default())
        .unwrap()
}

/// The default rule: keyless requests share one key (`unkeyed`), separate from keyed clients.
#[tokio::test]
async fn missing_key_shares_one_key_by_default() {
    let fx = Fixture::new();
    let layer = by_api_key(&fx, MissingKey::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(counting(calls.clone()));

    let statuses = statuses_of(&svc, 3, || get("/")).await;
    assert_eq!(statuses, [200, 200, 429], "keyless requests share a quota");
    let keyed_response = svc.clone().oneshot(keyed("k-1")).await.unwrap();
    assert_eq!(keyed_response.status(), StatusCode::OK);
    assert_eq!(header(keyed_response.headers(), SEEN), Some("1"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn missing_key_reject_answers_the_status_without_calling_inner() {
    let fx = Fixture::new();
    let layer = by_api_key(&fx, MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(counting(calls.clone()));

    assert_eq!(status_of(&svc, get("/")).await, StatusCode::UNAUTHORIZED);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(fx.limiter.stats().allowed + fx.limiter.stats().denied, 0);
    assert_eq!(status_of(&svc, keyed("k-1")).await, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn missing_key_allow_lets_keyless_requests_through_unlimited() {
    let fx = Fixture::new();
    let layer = by_api_key(&fx, MissingKey::Allow);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(counting(calls.clone()));

    for _ in 0..5 {
        let response = svc.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(response.headers(), SEEN), Some("none"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    // Keyed requests are still limited.
    let statuses = statuses_of(&svc, 3, || keyed("k")).await;
    assert_eq!(statuses, [200, 200, 429]);
}

/// `ConcurrencyLimit` hands its single permit to the instance that `poll_ready` made ready, and
/// panics if another instance is called: the layer must call the ready one, keep its permit for
/// the request's lifetime, and release it when it rejects.
#[tokio::test]
async fn the_instance_made_ready_is_the_one_called() {
    let fx = Fixture::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = fx
        .layer()
        .layer(ConcurrencyLimit::new(counting(calls.clone()), 1));

    svc.ready().await.unwrap();
    let in_flight = svc.call(get("/"));
    // The only permit travels with the request: nothing else can be ready until it completes.
    assert!(svc.ready().now_or_never().is_none(), "permit not held");
    let response = in_flight.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The permit came back: the next request is served too.
    let response = svc.ready().await.unwrap().call(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A rejected request drops the ready instance, and with it the permit.
    let response = svc.ready().await.unwrap().call(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let ready = poll_fn(|cx| match svc.poll_ready(cx) {
        Poll::Ready(result) => Poll::Ready(Some(result)),
        Poll::Pending => Poll::Ready(None),
    })
    .await;
    assert!(matches!(ready, Some(Ok(()))), "a 429 kept the inner permit");
}

/// The layer on an axum `Router`: handlers read the decision with `Extension<Decision>`.
#[tokio::test]
async fn axum_router() {
    use axum::body::Body;
    use axum::routing::get as route_get;
    use axum::Extension;

    let fx = Fixture::new();
    let app = axum::Router::new()
        .route(
            "/",
            route_get(|Extension(decision): Extension<Decision>| async move {
                format!("remaining={}", decision.remaining)
            }),
        )
        .layer(fx.layer());
    let request = || Request::get("/").body(Body::empty()).unwrap();

    let first = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        header(first.headers(), "ratelimit-policy"),
        Some("\"default\";q=2;w=60")
    );
    assert_eq!(body_text(first).await, "remaining=1");
    let second = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(body_text(second).await, "remaining=0");
    let third = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(third.headers(), "retry-after"), Some("30"));
}

/// The layer served by hyper over a real TCP connection (HTTP/1.1).
#[tokio::test]
async fn hyper_http1_server() {
    use hyper_util::rt::TokioIo;

    let fx = Fixture::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = fx.layer().layer(counting(calls.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = svc.clone();
            let hyper_svc = hyper::service::service_fn(move |request: Request<_>| {
                // hyper's `Incoming` body, collected so the inner service sees `Full<Bytes>`.
                let svc = svc.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let body: hyper::body::Incoming = body;
                    let bytes = body.collect().await.unwrap().to_bytes();
                    svc.oneshot(Request::from_parts(parts, Full::new(bytes)))
                        .await
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_svc),
            );
        }
    });

    let mut status_lines = Vec::new();
    for _ in 0..3 {
        let raw = support::service::raw_get(addr).await;
        let lower = raw.to_ascii_lowercase();
        assert!(
            lower.contains("ratelimit-policy: \"default\";q=2;w=60"),
            "{raw}"
        );
        status_lines.push(raw.lines().next().unwrap().to_owned());
        if raw.starts_with("HTTP/1.1 429") {
            assert!(lower.contains("retry-after: 30"), "{raw}");
            assert!(raw.ends_with("rate limit exceeded\n"), "{raw}");
        }
    }
    server.abort();
    assert_eq!(
        status_lines,
        [
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 429 Too Many Requests"
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Compile-time: the response body satisfies what hyper, axum and tonic ask of a body.
#[test]
fn response_body_satisfies_the_framework_bounds() {
    fn body<B>()
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
    }
    body::<ResponseBody<tonic::body::Body>>();
    body::<ResponseBody<axum::body::Body>>();
    body::<ResponseBody<Full<Bytes>>>();
    body::<ResponseBody<hyper::body::Incoming>>();
}

/// A minimal gRPC service for tonic's router: answers every call with an OK trailers-only
/// response.
#[derive(Clone, Default)]
struct Echo {
    calls: Arc<AtomicUsize>,
}

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

impl Service<Request<tonic::body::Body>> for Echo {
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<tonic::body::Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "0")
            .body(tonic::body::Body::default())
            .unwrap()))
    }
}

/// The layer in tonic's `Server::builder().layer(..)`, over HTTP/2: the third call is
/// `RESOURCE_EXHAUSTED` and never reaches the service.
#[tokio::test]
async fn tonic_server_layer() {
    let fx = Fixture::new();
    let echo = Echo::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(fx.layer())
            .add_service(echo.clone())
            .serve_with_incoming(incoming),
    );

    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let request = Request::post("/test.Echo/Call")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::default())
            .unwrap();
        let response = channel.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let grpc_status = header(response.headers(), "grpc-status").map(str::to_owned);
        statuses.push(grpc_status.unwrap_or_default());
    }
    server.abort();
    assert_eq!(statuses, ["0", "0", "8"]);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 2);
}

/// Two stacked layers on one limiter and one key (2 a second inside 5 a minute) keep separate
/// counts in their policies' scopes, and the response lists both policies.
#[tokio::test]
async fn stacked_layers_keep_separate_counts_and_both_headers() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let limiter = Ctx::default().manual(&clock).redis(&redis);
    let named = |quota: Quota, name: &str| {
        RateLimitLayer::builder(limiter.clone(), quota, GlobalKey::new("g"))
            .policy_name(name)
            .build()
            .unwrap()
    };
    let per_second = named(Quota::per_second(2).unwrap(), "second");
    let per_minute = named(Quota::per_minute(5).unwrap(), "minute");
    let calls = Arc::new(AtomicUsize::new(0));
    let service = per_minute.layer(per_second.layer(counting(calls.clone())));

    let first = service.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let states: Vec<&str> = first
        .headers()
        .get_all("ratelimit")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(states, ["\"second\";r=1;t=1", "\"minute\";r=4;t=12"]);

    // One request a second for a minute: the per-minute token bucket holds — its 5, then one
    // every 12 s over the 59 s that follow (9 in all, where shared state let all 60 through).
    let mut admitted = 1;
    for _ in 1..60 {
        clock.advance(Duration::from_secs(1));
        if status_of(&service, get("/")).await == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 9, "5 a minute must hold under a 2-a-second layer");
    assert_eq!(calls.load(Ordering::SeqCst), 9);
    assert_eq!(
        redis.keys(),
        // A named layer counts in its policy name.
        ["redlimit:{g}:minute", "redlimit:{g}:second"]
    );
}

/// The tokens the token-bucket tier `tier` of `key` holds in `scope`, as stored.
async fn tokens_left(limiter: &Limiter, scope: &str, key: &str, tier: usize) -> f64 {
    let status = limiter.inspect(Target::scoped(scope, key)).await.unwrap();
    let fields = &status.tiers[tier].fields;
    fields.iter().find(|(name, _)| *name == "tokens").unwrap().1
}

/// A limiter on a private Redis, on a clock that stands still.
fn still_limiter(redis: &RedisServer) -> Limiter {
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    Ctx::default().manual(&clock).redis(redis)
}

/// The README's way to stack limits, "2 a second inside 100 a minute", as one layer with
/// `Quotas`: 30 requests at once admit 2, and the minute's budget goes down by exactly those 2
/// (100 -> 98): a request one tier denies consumes from none.
#[tokio::test]
async fn one_layer_with_quotas_charges_the_outer_budget_only_for_admissions() {
    let redis = RedisServer::start();
    let limiter = still_limiter(&redis);
    let tiers = Quotas::new([
        Quota::per_second(2).unwrap(),
        Quota::per_minute(100).unwrap(),
    ])
    .unwrap();
    let layer = RateLimitLayer::new(limiter.clone(), tiers, GlobalKey::new("client"));
    let scope = layer.scope().to_owned();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(counting(calls.clone()));

    let mut admitted = 0;
    for _ in 0..30 {
        if status_of(&service, get("/")).await == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let minute = tokens_left(&limiter, &scope, "client", 1).await;
    println!(
        "one layer with Quotas: 30 requests, {admitted} admitted, minute budget 100 -> {minute}"
    );
    assert_eq!(
        minute,
        100.0 - admitted as f64,
        "the minute is charged for admissions only"
    );
}

/// What stacking two layers costs (documented in the README): the outer layer counts every
/// request that reaches it, the ones the inner layer then denies included. 30 requests at once
/// through 100 a minute around 2 a second: 2 admitted, the minute's budget down by 30 (to 70).
#[tokio::test]
async fn stacked_layers_charge_the_outer_budget_for_inner_denials() {
    let redis = RedisServer::start();
    let limiter = still_limiter(&redis);
    let per_second = RateLimitLayer::new(
        limiter.clone(),
        Quota::per_second(2).unwrap(),
        GlobalKey::new("client"),
    );
    let per_minute = RateLimitLayer::new(
        limiter.clone(),
        Quota::per_minute(100).unwrap(),
        GlobalKey::new("client"),
    );
    let scope = per_minute.scope().to_owned();
    let service = per_minute.layer(per_second.layer(counting(Arc::new(AtomicUsize::new(0)))));

    let mut admitted = 0;
    for _ in 0..30 {
        if status_of(&service, get("/")).await == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2);
    let minute = tokens_left(&limiter, &scope, "client", 0).await;
    println!("two stacked layers: 30 requests, {admitted} admitted, minute budget 100 -> {minute}");
    assert_eq!(minute, 70.0);
}

/// gRPC is told by its media type, in any case, with parameters and surrounding whitespace; a
/// type that merely starts like gRPC's is plain HTTP. `RateLimitLayer` and
/// `ConcurrencyLimitLayer` answer each of them alike.
#[tokio::test]
async fn grpc_is_told_by_its_media_type_in_both_layers() {
    use redlimit::concurrency::ConcurrencyLimitLayer;
    use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome};

    // The request's content-type, and the content-type of a gRPC answer (None: HTTP 429).
    let cases = [
        ("Application/GRPC", Some("application/grpc")),
        ("application/grpc+proto", Some("application/grpc")),
        (
            "APPLICATION/gRPC+Proto ; charset=utf-8",
            Some("application/grpc"),
        ),
        (" application/grpc-web+json", Some("application/grpc-web")),
        (
            "Application/gRPC-Web-Text",
            Some("application/grpc-web-text"),
        ),
        ("application/grpcfoo", None),
        ("application/grpc-webfoo", None),
        ("application/grpc+", None),
        ("text/plain; x=application/grpc", None),
    ];
    let fx = Fixture::new();
    let rate = fx.layer().layer(counting(Arc::new(AtomicUsize::new(0))));
    for _ in 0..2 {
        assert_eq!(status_of(&rate, get("/")).await, StatusCode::OK);
    }
    let slots = ConcurrencyLimiter::new(fx.limiter.clone(), 1).unwrap();
    let SlotOutcome::Acquired(_held) = slots.acquire("busy").await else {
        panic!("the only slot of \"busy\" is free");
    };
    let concurrency = ConcurrencyLimitLayer::new(slots, GlobalKey::new("busy"), "busy")
        .unwrap()
        .layer(counting(Arc::new(AtomicUsize::new(0))));
    let request = |content_type: &str| {
        Request::post("/pkg.Service/Method")
            .header("content-type", content_type)
            .body(Full::default())
            .unwrap()
    };
    let mut wrong = Vec::new();
    for (content_type, answered) in cases {
        let by_rate = rate.clone().oneshot(request(content_type)).await.unwrap();
        let by_slots = concurrency
            .clone()
            .oneshot(request(content_type))
            .await
            .unwrap();
        for (layer, status, headers) in [
            ("rate", by_rate.status(), by_rate.headers()),
            ("concurrency", by_slots.status(), by_slots.headers()),
        ] {
            let seen = match header(headers, "grpc-status") {
                Some(code) => format!(
                    "{status} grpc-status {code} {:?}",
                    header(headers, "content-type")
                ),
                None => format!("{status} {:?}", header(headers, "content-type")),
            };
            let expected = match answered {
                Some(answer) => format!("200 OK grpc-status 8 Some({answer:?})"),
                None => "429 Too Many Requests Some(\"text/plain; charset=utf-8\")".to_owned(),
            };
            if seen != expected {
                wrong.push(format!(
                    "{layer} {content_type:?}: {seen}, expected {expected}"
                ));
            }
        }
    }
    println!(
        "media types answered wrongly: {} of {}",
        wrong.len(),
        2 * cases.len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}
