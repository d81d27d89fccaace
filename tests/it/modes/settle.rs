//! Cost settled after the response: by status (a login limiter counting only failures), and
//! reserve-then-settle to a response header; settlements that fail never block a response.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use redlimit::key::GlobalKey;
use redlimit::{Limiter, Quota, Quotas, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

use crate::support::service::{status_of, with_header, TestService};
use crate::support::{Ctx, RedisServer};

/// The login route's inner service: 200 for the password "right", 401 otherwise; counts the
/// failures it answered.
fn login(failures: Arc<AtomicUsize>) -> impl TestService {
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let failures = failures.clone();
        async move {
            let right = is_right(&req);
            // Slow enough that concurrent attempts overlap.
            tokio::time::sleep(Duration::from_millis(20)).await;
            if !right {
                failures.fetch_add(1, Ordering::SeqCst);
            }
            Ok(answer(right))
        }
    })
}

/// Whether the attempt's password is "right".
fn is_right(req: &Request<Full<Bytes>>) -> bool {
    req.headers()
        .get("x-password")
        .is_some_and(|p| p == "right")
}

/// The login route's answer: 200 for the right password, 401 otherwise.
fn answer(right: bool) -> Response<Full<Bytes>> {
    let status = if right {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    };
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// What a peek at `key` in `scope` says is left.
async fn left(limiter: &Limiter, scope: &str, key: &str, quotas: &Quotas) -> u64 {
    let verdict = limiter
        .check_quotas(redlimit::Target::scoped(scope, key), quotas, 0)
        .await;
    verdict.decision().expect("decided").remaining
}

fn attempt(password: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .header("x-user", "alice")
        .header("x-password", password)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A layer reserving `reserve` per request on `user`'s `policy` and settling to the number the
/// response carries in the header `used` (`reserve` when it has none).
fn settle_to_header(
    limiter: Limiter,
    quota: Quota,
    (policy, user): (&'static str, &'static str),
    reserve: u64,
    used: &'static str,
) -> RateLimitLayer<GlobalKey> {
    RateLimitLayer::builder(limiter, quota, GlobalKey::new(user))
        .policy_name(policy)
        .cost(move |_| reserve)
        .cost_from_response(move |response| {
            response
                .headers()
                .get(used)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(reserve)
        })
        .build()
        .unwrap()
}

fn login_layer(limiter: Limiter) -> RateLimitLayer<GlobalKey> {
    // One user's login route (a global key names it in clear, for the peeks below).
    RateLimitLayer::builder(
        limiter,
        Quota::per_minute(5).unwrap(),
        GlobalKey::new("alice"),
    )
    .policy_name("login")
    .cost_from_status([StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN])
    .build()
    .unwrap()
}

/// Three instances on one Redis, a login route whose 401s cost 1 at 5 a minute: 12
/// successes (free), then 30 concurrent failures from all three instances: exactly 5 reach the
/// service, 25 are answered 429; the successes all passed.
#[tokio::test]
async fn exactly_five_failed_logins_pass_across_three_instances() {
    let redis = RedisServer::start();
    let failures = Arc::new(AtomicUsize::new(0));
    let instances: Vec<_> = (0..3)
        .map(|_| {
            let limiter = Ctx::default().redis(&redis);
            (
                limiter.clone(),
                login_layer(limiter).layer(login(failures.clone())),
            )
        })
        .collect();
    for i in 0..12 {
        let status = status_of(&instances[i % 3].1, attempt("right")).await;
        assert_eq!(status, StatusCode::OK, "success #{i}");
    }
    // The successes' reservations are given back (settled as tasks of their own).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let quotas = Quotas::from(Quota::per_minute(5).unwrap());
    let peek = left(&instances[0].0, "login", "alice", &quotas).await;
    assert_eq!(peek, 5, "successes are free");

    let mut attempts = Vec::new();
    for i in 0..30 {
        let svc = instances[i % 3].1.clone();
        attempts.push(tokio::spawn(async move {
            status_of(&svc, attempt("wrong")).await
        }));
    }
    let mut statuses = Vec::new();
    for attempt in attempts {
        statuses.push(attempt.await.unwrap());
    }
    let unauthorized = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((unauthorized, limited), (5, 25));
    assert_eq!(failures.load(Ordering::SeqCst), 5);
    let settle_failures: u64 = instances
        .iter()
        .map(|(l, _)| l.stats().settle_failures)
        .sum();
    assert_eq!(settle_failures, 0);
}

/// An LLM gateway: reserve 1 000 tokens, settle to `x-tokens-used`: 300 gives 700 back, 1 500
/// takes 500 more.
#[tokio::test]
async fn reserve_then_settle_to_a_response_header() {
    let redis = RedisServer::start();
    for limiter in [Ctx::default().redis(&redis), Ctx::default().memory()] {
        let layer = settle_to_header(
            limiter.clone(),
            Quota::per_hour(10_000).unwrap(),
            ("llm", "bob"),
            1_000,
            "x-tokens-used",
        );
        let mut svc = layer.layer(tower::service_fn(|req: Request<Full<Bytes>>| async move {
            let used = req.headers()["x-want"].clone();
            Ok::<_, Infallible>(with_header("x-tokens-used", used))
        }));
        let quotas = Quotas::from(Quota::per_hour(10_000).unwrap());
        let call = |want: &'static str| {
            Request::builder()
                .header("x-user", "bob")
                .header("x-want", want)
                .body(Full::new(Bytes::new()))
                .unwrap()
        };
        let response = svc.ready().await.unwrap().call(call("300")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let remaining = left(&limiter, "llm", "bob", &quotas).await;
        // 10 000 - 300, give or take the refill of a few ms (10 000 an hour: 2.8 a second).
        assert!((9_700..=9_702).contains(&remaining), "{remaining}");
        svc.ready().await.unwrap().call(call("1500")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let remaining = left(&limiter, "llm", "bob", &quotas).await;
        assert!((8_200..=8_203).contains(&remaining), "{remaining}");
    }
}

/// Redis goes down while the service answers: the response is not delayed nor failed, and the
/// failed settlement is counted.
#[tokio::test]
async fn a_failed_settlement_never_blocks_the_response() {
    let mut redis = RedisServer::start();
    let store = redlimit::store::RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let limiter = Limiter::new(store);
    let slow = tower::service_fn(|_: Request<Full<Bytes>>| async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let mut svc = login_layer(limiter.clone()).layer(slow);
    let call = svc.ready().await.unwrap().call(attempt("right"));
    let pending = tokio::spawn(call);
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.stop();
    let started = std::time::Instant::now();
    let response = pending.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_millis(290),
        "{:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(limiter.stats().settle_failures, 1);
}

/// Shadow tiers are settled too: a shadow tier of 2 a minute beside an enforced 5 a minute,
/// counting only 401s: six successes are free in both, so the shadow tier never "denies".
#[tokio::test]
async fn shadow_tiers_are_settled_like_the_enforced_ones() {
    let limiter = Ctx::default().memory();
    let layer = RateLimitLayer::builder(
        limiter.clone(),
        Quota::per_minute(5).unwrap(),
        GlobalKey::new("alice"),
    )
    .policy_name("login")
    .shadow_quotas(Quota::per_minute(2).unwrap())
    .cost_from_status([StatusCode::UNAUTHORIZED])
    .build()
    .unwrap();
    let failures = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(login(failures));
    for i in 0..6 {
        let status = status_of(&svc, attempt("right")).await;
        assert_eq!(status, StatusCode::OK, "#{i}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(limiter.stats().shadow_limited, 0);
    let shadow = Quotas::from(Quota::per_minute(2).unwrap());
    assert_eq!(left(&limiter, "login.shadow", "alice", &shadow).await, 2);
}

/// A gated login service: "right" waits for a permit of `gate` (counted in `entered` first)
/// and answers 200, anything else 401 at once.
fn gated_login(gate: Arc<tokio::sync::Semaphore>, entered: Arc<AtomicUsize>) -> impl TestService {
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let (gate, entered) = (gate.clone(), entered.clone());
        async move {
            let right = is_right(&req);
            if right {
                entered.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
            }
            Ok(answer(right))
        }
    })
}

/// Waits (up to 10 s) until `n` requests are inside the gated service.
pub(crate) async fn until_entered(entered: &AtomicUsize, n: usize) {
    for _ in 0..2_000 {
        if entered.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "only {} of {n} requests reached the service",
        entered.load(Ordering::SeqCst)
    );
}

/// A fixed window of 5 failed logins per 2 s: five slow successes reserved late in window 1
/// and answered early in window 2 give nothing back to window 2, so window 2 lets exactly 5
/// failures through (on Redis and in memory, on a manual clock at the boundary).
#[tokio::test]
async fn a_refund_never_reaches_the_window_after_its_reservation() {
    let redis = RedisServer::start();
    let period = Duration::from_secs(2);
    // A window boundary: 1 700 000 000 s is a multiple of 2 s.
    let boundary = Duration::from_secs(1_700_000_000);
    for backend in ["redis", "memory"] {
        let clock = redlimit::clock::ManualClock::new(boundary - Duration::from_millis(100));
        let ctx = Ctx::new(redlimit::Algorithm::FixedWindow).manual(&clock);
        let limiter = match backend {
            "redis" => ctx.redis(&redis),
            _ => ctx.memory(),
        };
        let layer = RateLimitLayer::builder(
            limiter.clone(),
            Quota::new(5, period).unwrap(),
            GlobalKey::new("carol"),
        )
        .policy_name("login")
        .cost_from_status([StatusCode::UNAUTHORIZED])
        .build()
        .unwrap();
        let (gate, entered) = (Arc::new(tokio::sync::Semaphore::new(0)), Arc::default());
        let svc = layer.layer(gated_login(gate.clone(), Arc::clone(&entered)));
        // Window 1, its last 100 ms: five slow successes reserve the whole window.
        let slow: Vec<_> = (0..5)
            .map(|_| {
                let svc = svc.clone();
                tokio::spawn(async move { status_of(&svc, attempt("right")).await })
            })
            .collect();
        until_entered(&entered, 5).await;
        // Window 2: five failures fill it, then the successes answer and settle.
        clock.set(boundary + Duration::from_millis(100));
        let mut unauthorized = 0;
        for _ in 0..5 {
            let status = status_of(&svc, attempt("wrong")).await;
            unauthorized += usize::from(status == StatusCode::UNAUTHORIZED);
        }
        gate.add_permits(5);
        for call in slow {
            assert_eq!(call.await.unwrap(), StatusCode::OK, "{backend}");
        }
        limiter.flush_settlements().await;
        for _ in 0..10 {
            let status = status_of(&svc, attempt("wrong")).await;
            unauthorized += usize::from(status == StatusCode::UNAUTHORIZED);
        }
        assert_eq!(
            unauthorized, 5,
            "{backend}: {unauthorized} failed logins reached the service in one window of 5"
        );
        assert_eq!(limiter.stats().settle_failures, 0, "{backend}");
    }
}

/// 10 an hour, cost 5 settled to `x-used`: a request admitted by the local fallback while
/// Redis was down, answered after Redis came back with 0 used, gives nothing to Redis, which
/// then admits exactly its 10.
#[tokio::test]
async fn a_fallback_admission_is_never_refunded_into_redis() {
    let mut redis = RedisServer::start();
    let limiter = Ctx::default()
        .without_breaker()
        .timeout(Duration::from_millis(500))
        .failure_policy(redlimit::failure_policy::LocalFallback::new(1))
        .redis(&redis);
    let layer = settle_to_header(
        limiter.clone(),
        Quota::per_hour(10).unwrap(),
        ("api", "dave"),
        5,
        "x-used",
    );
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let inner = {
        let (gate, entered) = (gate.clone(), entered.clone());
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            let (gate, entered) = (gate.clone(), entered.clone());
            async move {
                let used = req.headers()["x-used"].clone();
                if req.headers().contains_key("x-slow") {
                    entered.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.unwrap().forget();
                }
                Ok::<_, Infallible>(with_header("x-used", used))
            }
        })
    };
    let svc = layer.layer(inner);
    let call = |used: &'static str, slow: bool| {
        let mut request = Request::builder().header("x-used", used);
        if slow {
            request = request.header("x-slow", "1");
        }
        request.body(Full::new(Bytes::new())).unwrap()
    };
    redis.stop();
    let held = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(call("0", true)).await.unwrap() })
    };
    until_entered(&entered, 1).await;
    assert_eq!(limiter.stats().fallback_decisions, 1);
    redis.restart();
    let quotas = Quotas::from(Quota::per_hour(10).unwrap());
    // Until the store answers again (it reconnects in the background).
    for _ in 0..200 {
        let peek = limiter
            .try_check_quotas(redlimit::Target::scoped("api", "dave"), &quotas, 0)
            .await;
        if peek.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut admitted = 0;
    for _ in 0..2 {
        let status = status_of(&svc, call("5", false)).await;
        admitted += 5 * u64::from(status == StatusCode::OK);
    }
    gate.add_permits(1);
    assert_eq!(held.await.unwrap().status(), StatusCode::OK);
    limiter.flush_settlements().await;
    let status = status_of(&svc, call("5", false)).await;
    admitted += 5 * u64::from(status == StatusCode::OK);
    assert_eq!(
        admitted, 10,
        "Redis admitted {admitted} units against a quota of 10"
    );
}

/// A limiter on `backend` and a service reserving 200 of `user`'s 1 000 an hour on "llm" and
/// settling every response to 0, so each request spawns a refund of 200.
fn refund_all(
    backend: &str,
    redis: &RedisServer,
    user: &'static str,
) -> (
    Limiter,
    impl Service<Request<Full<Bytes>>, Response = Response<impl Sized>, Error = Infallible> + Clone,
) {
    let limiter = match backend {
        "redis" => Ctx::default().redis(redis),
        _ => Ctx::default().memory(),
    };
    let layer = RateLimitLayer::builder(
        limiter.clone(),
        Quota::per_hour(1_000).unwrap(),
        GlobalKey::new(user),
    )
    .policy_name("llm")
    .cost(|_| 200)
    .cost_from_response(|_| 0)
    .build()
    .unwrap();
    let svc = layer.layer(tower::service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    }));
    (limiter, svc)
}

/// A settlement pending when the runtime shuts down is counted as failed; one awaited with
/// `flush_settlements` lands (memory and Redis).
#[test]
fn a_settlement_lost_at_shutdown_is_counted_and_flush_lands_it() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_hour(1_000).unwrap());
    for backend in ["redis", "memory"] {
        let rt = crate::support::current_thread_runtime();
        let (limiter, svc) = rt.block_on(async {
            let (limiter, svc) = refund_all(backend, &redis, "erin");
            // Connected, so the reservation is Redis's.
            assert_eq!(left(&limiter, "llm", "erin", &quotas).await, 1_000);
            let response = svc.clone().oneshot(Request::new(Full::new(Bytes::new())));
            assert_eq!(response.await.unwrap().status(), StatusCode::OK);
            (limiter, svc)
        });
        // The refund of 200 was spawned and never ran.
        drop(rt);
        assert_eq!(
            limiter.stats().settle_failures,
            1,
            "{backend}: a settlement lost at shutdown must be counted"
        );
        drop((limiter, svc));

        // The same, flushed before the runtime goes: the 200 are back.
        crate::support::current_thread_runtime().block_on(async {
            let (limiter, svc) = refund_all(backend, &redis, "frank");
            assert_eq!(left(&limiter, "llm", "frank", &quotas).await, 1_000);
            let response = svc.oneshot(Request::new(Full::new(Bytes::new())));
            assert_eq!(response.await.unwrap().status(), StatusCode::OK);
            limiter.flush_settlements().await;
            assert_eq!(
                left(&limiter, "llm", "frank", &quotas).await,
                1_000,
                "{backend}"
            );
            assert_eq!(limiter.stats().settle_failures, 0, "{backend}");
        });
    }
}
