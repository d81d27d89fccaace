//! Wait mode and the outbound layer on a real Redis: the rate a fleet of waiters reaches,
//! deadlines, backpressure behind `tower::buffer::Buffer`, and auto-suspend stopping every
//! worker when the upstream answers 429 + `Retry-After`.
//!
//! Each test starts its own `redis-server`; every "worker" is a limiter with its own
//! `RedisStore` (its own connection), as separate processes would have. The limiters use Redis's
//! clock; the tests stamp events with the same wall clock (`SystemTime`) to count admissions per
//! aligned second, as an upstream enforcing fixed windows would.

use crate::support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use redlimit::key::FnKey;
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::{limiter::AcquireError, Algorithm, Limiter, Quota, Quotas};
use support::RedisServer;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};

type Body = Full<Bytes>;

/// `n` limiters on their own connections to `redis`.
fn limiters(redis: &RedisServer, algorithm: Algorithm, n: usize) -> Vec<Limiter> {
    (0..n)
        .map(|_| {
            // A generous timeout: a slow answer on a busy machine must not turn into a
            // fail-open admission (each test also checks that no store call failed).
            support::redis_limiter(redis, algorithm)
        })
        .collect()
}

/// The `retry_after` and `suspended` of a `DeadlineExceeded` (any other error fails the test).
fn deadline_exceeded(error: AcquireError) -> (Duration, bool) {
    match error {
        AcquireError::DeadlineExceeded {
            retry_after,
            suspended,
            ..
        } => (retry_after, suspended),
        other => panic!("{other:?}"),
    }
}

fn request() -> Request<Body> {
    Request::new(Body::default())
}

fn ok() -> Response<Body> {
    Response::new(Body::default())
}

/// Seconds since the epoch, as a float.
fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Sleeps until the next whole second of the wall clock; returns it.
async fn next_whole_second() -> SystemTime {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let next = Duration::from_secs(now.as_secs() + 1);
    tokio::time::sleep(next - now).await;
    UNIX_EPOCH + next
}

/// A service standing in for the upstream: records the wall-clock time of each call.
fn recording_upstream(calls: Arc<Mutex<Vec<SystemTime>>>) -> impl support::service::TestService {
    tower::service_fn(move |_: Request<Body>| {
        calls.lock().unwrap().push(SystemTime::now());
        async { Ok::<_, Infallible>(ok()) }
    })
}

/// Admissions per aligned second of `[start, start + seconds)`.
fn per_window(stamps: &[SystemTime], start: SystemTime, seconds: u64) -> Vec<usize> {
    let start = unix(start) as u64;
    (0..seconds)
        .map(|i| {
            stamps
                .iter()
                .filter(|t| unix(**t) as u64 == start + i)
                .count()
        })
        .collect()
}

const RATE: u64 = 20;
const RUN: u64 = 3;
const WORKERS: usize = 3;

/// Fixed windows of 20 a second, three waiters calling `Limiter::acquire` as fast as it lets
/// them for 3 aligned seconds: every second gets 19 or 20 admissions (≥ 95 %), never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_reach_the_rate_of_fixed_windows_and_never_exceed_it() {
    let redis = RedisServer::start();
    let limiters = limiters(&redis, Algorithm::FixedWindow, WORKERS);
    let quotas = Quotas::from(Quota::per_second(RATE).unwrap());
    let stamps = Arc::new(Mutex::new(Vec::new()));

    let start = next_whole_second().await;
    let end = Instant::now() + Duration::from_secs(RUN);
    let tasks: Vec<_> = limiters
        .iter()
        .map(|limiter| {
            let (limiter, quotas, stamps) = (limiter.clone(), quotas, stamps.clone());
            tokio::spawn(async move {
                loop {
                    match limiter.acquire("partner-api", &quotas, end).await {
                        Ok(verdict) => {
                            assert!(verdict.decision().is_some_and(|d| d.allowed));
                            stamps.lock().unwrap().push(SystemTime::now());
                        }
                        Err(AcquireError::DeadlineExceeded { .. }) => return,
                        Err(error) => panic!("{error}"),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let stamps = stamps.lock().unwrap().clone();
    let windows = per_window(&stamps, start, RUN);
    println!("fixed window, {RATE}/s, {WORKERS} waiters: {windows:?} per aligned second");
    for (i, &count) in windows.iter().enumerate() {
        assert!(
            count as u64 <= RATE,
            "second {i}: {count} > {RATE}: {windows:?}"
        );
        assert!(
            count as u64 >= RATE * 95 / 100,
            "second {i}: {count} < 95 %: {windows:?}"
        );
    }
    let after = stamps
        .iter()
        .filter(|t| unix(**t) >= unix(start) + RUN as f64)
        .count();
    assert!(after <= RATE as usize, "{after} admissions after the run");
    for limiter in &limiters {
        assert_eq!(limiter.stats().store_errors, 0);
    }
}

/// The default token bucket (burst = limit): `workers` callers as fast as it lets them for 3
/// aligned seconds, through the outbound layer with a fixed key (the wait in `poll_ready`) or
/// through `Limiter::acquire`. After the initial burst the upstream sees the quota's rate within
/// 5 %, and no stretch of calls ever exceeds burst + rate × its length.
async fn token_bucket_rate(workers: usize, through_layer: bool) {
    let redis = RedisServer::start();
    let limiters = limiters(&redis, Algorithm::TokenBucket, workers);
    let quota = Quota::per_second(RATE).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));

    let start = next_whole_second().await;
    let end = start + Duration::from_secs(RUN);
    let deadline = Instant::now() + Duration::from_secs(RUN);
    let tasks: Vec<_> = limiters
        .iter()
        .map(|limiter| {
            let layer = OutboundLayer::new(limiter.clone(), quota, "partner-api");
            let mut client = layer.layer(recording_upstream(calls.clone()));
            let (limiter, calls) = (limiter.clone(), calls.clone());
            tokio::spawn(async move {
                while SystemTime::now() < end {
                    if !through_layer {
                        match limiter
                            .acquire("partner-api", &quota.into(), deadline)
                            .await
                        {
                            Ok(_) => calls.lock().unwrap().push(SystemTime::now()),
                            Err(AcquireError::DeadlineExceeded { .. }) => return,
                            Err(error) => panic!("{error}"),
                        }
                        continue;
                    }
                    let wait = end.duration_since(SystemTime::now()).unwrap_or_default();
                    let Ok(ready) = tokio::time::timeout(wait, client.ready()).await else {
                        return; // still waiting at the end of the run
                    };
                    let response = ready.unwrap().call(request()).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let mut stamps = calls.lock().unwrap().clone();
    stamps.sort();
    let windows = per_window(&stamps, start, RUN);
    let via = if through_layer {
        "outbound layer"
    } else {
        "Limiter::acquire"
    };
    println!("token bucket, {RATE}/s burst {RATE}, {workers} workers through {via}: {windows:?} per aligned second");
    let stamps: Vec<f64> = stamps.iter().map(|t| unix(*t)).collect();
    // Never exceeds: any n consecutive calls span at least (n - burst) / rate seconds (one call
    // of slack for the time between Redis's decision and the stamp).
    let (rate, burst) = (RATE as f64, RATE as usize);
    for i in 0..stamps.len() {
        for j in i..stamps.len() {
            let calls_in_span = j - i + 1;
            let allowed = burst + 1 + ((stamps[j] - stamps[i]) * rate) as usize;
            assert!(
                calls_in_span <= allowed,
                "{calls_in_span} calls in {:.3} s",
                stamps[j] - stamps[i]
            );
        }
    }
    // Reaches the rate: the burst is spent in the first second; the last two seconds get
    // 2 × rate calls within 5 %.
    let steady = windows[1] + windows[2];
    let expected = 2 * RATE as usize;
    assert!(
        steady * 100 >= expected * 95,
        "{steady} calls in 2 s, expected ~{expected}"
    );
    assert!(
        steady <= expected + 1,
        "{steady} calls in 2 s, expected ~{expected}"
    );
    for limiter in &limiters {
        assert_eq!(limiter.stats().store_errors, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_workers_reach_the_token_bucket_rate_and_never_exceed_it() {
    token_bucket_rate(WORKERS, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_waiter_reaches_the_token_bucket_rate_and_never_exceeds_it() {
    token_bucket_rate(1, false).await;
}

/// A wait that would pass the deadline fails at once with a typed error and consumes nothing;
/// a cost above the capacity is `NeverAllowed`; through the layer the upstream is not called.
#[tokio::test]
async fn past_the_deadline_is_a_typed_error_and_consumes_nothing() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::TokenBucket, 1).remove(0);
    let quotas = Quotas::from(Quota::per_minute(2).unwrap());
    let remaining = || async {
        let peek = limiter.check_quotas("api", &quotas, 0).await;
        peek.decision().expect("a decision").remaining
    };
    assert!(limiter.check_quotas("api", &quotas, 1).await.is_allowed());
    assert_eq!(remaining().await, 1);

    // Cost 2 needs 30 s more; the deadline is 2 s away: an error now, not in 2 s.
    let asked = Instant::now();
    let deadline = asked + Duration::from_secs(2);
    let error = limiter
        .acquire_cost("api", &quotas, 2, deadline)
        .await
        .unwrap_err();
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "slept {:?}",
        asked.elapsed()
    );
    let (retry_after, suspended) = deadline_exceeded(error);
    assert!(retry_after > Duration::from_secs(29) && retry_after <= Duration::from_secs(30));
    assert!(!suspended);
    assert_eq!(remaining().await, 1);

    // A suspended key: the error says so, with the time left.
    limiter
        .suspend("api", Duration::from_secs(60))
        .await
        .unwrap();
    let error = limiter.acquire("api", &quotas, deadline).await.unwrap_err();
    assert!(asked.elapsed() < Duration::from_secs(1));
    let (retry_after, suspended) = deadline_exceeded(error);
    assert!(
        suspended && retry_after > Duration::from_secs(59),
        "{error}"
    );
    assert!(error.to_string().contains("suspended"));
    limiter.resume("api").await.unwrap();
    assert_eq!(remaining().await, 1);

    let error = limiter
        .acquire_cost("api", &quotas, 3, deadline)
        .await
        .unwrap_err();
    assert_eq!(error, AcquireError::NeverAllowed);
    assert_eq!(remaining().await, 1);

    // The layer, on the same key: the last unit goes out, the next request fails typed.
    let calls = Arc::new(Mutex::new(Vec::new()));
    let layer = OutboundLayer::builder(limiter.clone(), quotas, "api")
        .max_wait(Duration::from_secs(2))
        .build()
        .unwrap();
    let client = layer.layer(recording_upstream(calls.clone()));
    client.clone().oneshot(request()).await.unwrap();
    let asked = Instant::now();
    let error = client.oneshot(request()).await.unwrap_err();
    assert!(asked.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(
            error,
            OutboundError::Acquire(AcquireError::DeadlineExceeded { .. })
        ),
        "{error:?}"
    );
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(remaining().await, 0);

    // Per-request keys: the same, in the response future; no key is an error, not a bypass.
    let per_path = FnKey::new(|parts| {
        let path = parts.uri.path();
        (path != "/").then(|| path.to_owned())
    });
    let layer = OutboundLayer::builder_with_extractor(limiter.clone(), quotas, per_path)
        .max_wait(Duration::from_secs(2))
        .build()
        .unwrap();
    let client = layer.layer(recording_upstream(calls.clone()));
    let to = |path: &str| Request::get(path).body(Body::default()).unwrap();
    for _ in 0..2 {
        client.clone().oneshot(to("/a")).await.unwrap();
    }
    let error = client.clone().oneshot(to("/a")).await.unwrap_err();
    assert!(matches!(
        error,
        OutboundError::Acquire(AcquireError::DeadlineExceeded { .. })
    ));
    let error = client.clone().oneshot(to("/")).await.unwrap_err();
    assert!(matches!(error, OutboundError::MissingKey));
    client.oneshot(to("/b")).await.unwrap();
    assert_eq!(calls.lock().unwrap().len(), 4);
}

/// With a fixed key the wait is in `poll_ready`: the service is not ready until the quota
/// admits, and behind a `Buffer` concurrent callers go out one slot apart. A deadline error is
/// one request's error: the `Buffer` stays usable.
#[tokio::test]
async fn poll_ready_is_backpressure_behind_a_buffer() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::TokenBucket, 1).remove(0);
    // One call every 500 ms.
    let quota = Quota::per_second(2).unwrap().with_burst(1).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));

    let layer = OutboundLayer::new(limiter.clone(), quota, "slow-api");
    let mut client = layer.layer(recording_upstream(calls.clone()));
    client.ready().await.unwrap().call(request()).await.unwrap();
    let first = Instant::now();
    let pending = tokio::time::timeout(Duration::from_millis(250), client.ready()).await;
    assert!(pending.is_err(), "ready while the quota is spent");
    client.ready().await.unwrap().call(request()).await.unwrap();
    assert!(
        first.elapsed() >= Duration::from_millis(450),
        "{:?}",
        first.elapsed()
    );

    // Behind a Buffer: 4 callers at once go out 500 ms apart.
    let calls = Arc::new(Mutex::new(Vec::new()));
    let layer = OutboundLayer::new(limiter.clone(), quota, "buffered-api");
    let buffered = Buffer::new(layer.layer(recording_upstream(calls.clone())), 16);
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| tokio::spawn(buffered.clone().oneshot(request())))
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert!(started.elapsed() >= Duration::from_millis(1_400));
    let stamps: Vec<f64> = calls.lock().unwrap().iter().map(|t| unix(*t)).collect();
    assert_eq!(stamps.len(), 4);
    for pair in stamps.windows(2) {
        assert!(
            pair[1] - pair[0] >= 0.45,
            "calls {:.3} s apart",
            pair[1] - pair[0]
        );
    }

    // A request that cannot be admitted in time fails; the Buffer keeps serving.
    let calls = Arc::new(Mutex::new(Vec::new()));
    let layer = OutboundLayer::builder(limiter, Quota::per_minute(1).unwrap(), "rare-api")
        .max_wait(Duration::from_millis(100))
        .build()
        .unwrap();
    let buffered = Buffer::new(layer.layer(recording_upstream(calls.clone())), 16);
    buffered.clone().oneshot(request()).await.unwrap();
    for _ in 0..2 {
        let error: BoxError = buffered.clone().oneshot(request()).await.unwrap_err();
        let error = error
            .downcast::<OutboundError<Infallible>>()
            .unwrap_or_else(|e| panic!("not the layer's error: {e}"));
        assert!(matches!(
            *error,
            OutboundError::Acquire(AcquireError::DeadlineExceeded { .. })
        ));
    }
    assert_eq!(calls.lock().unwrap().len(), 1);
}

/// How the tripping worker's upstream says "back off for 2 s".
#[derive(Debug, Clone, Copy)]
enum RetryAfter {
    Seconds,
    /// An IMF-fixdate 2 to 3 s ahead (whole seconds).
    Date,
}

/// When one worker's upstream answers `429` + `Retry-After`, every worker (each its own
/// limiter and connection) stops calling until that time, then resumes.
async fn auto_suspend_stops_every_worker(retry_after: RetryAfter) {
    let redis = RedisServer::start();
    let limiters = limiters(&redis, Algorithm::TokenBucket, WORKERS);
    let quota = Quota::per_second(50).unwrap();
    // (worker, time) of every upstream call.
    let calls: Arc<Mutex<Vec<(usize, SystemTime)>>> = Arc::default();
    let trip = Arc::new(AtomicBool::new(false));
    // When the 429 was answered, and when the back-off ends.
    let tripped: Arc<Mutex<Option<(SystemTime, SystemTime)>>> = Arc::default();
    let answered_429 = Arc::new(AtomicUsize::new(0));

    let started = Instant::now();
    let stop = started + Duration::from_millis(4_500);
    let tasks: Vec<_> = limiters
        .iter()
        .enumerate()
        .map(|(worker, limiter)| {
            let (calls, trip, tripped) = (calls.clone(), trip.clone(), tripped.clone());
            let upstream = tower::service_fn(move |_: Request<Body>| {
                let now = SystemTime::now();
                calls.lock().unwrap().push((worker, now));
                let response = if worker == 0 && trip.swap(false, Ordering::SeqCst) {
                    let (value, end) = match retry_after {
                        RetryAfter::Seconds => ("2".to_owned(), now + Duration::from_secs(2)),
                        RetryAfter::Date => {
                            let whole = Duration::from_secs(unix(now) as u64 + 3);
                            let date = UNIX_EPOCH + whole;
                            (httpdate::fmt_http_date(date), date)
                        }
                    };
                    *tripped.lock().unwrap() = Some((now, end));
                    Response::builder()
                        .status(StatusCode::TOO_MANY_REQUESTS)
                        .header("retry-after", value)
                        .body(Body::default())
                        .unwrap()
                } else {
                    ok()
                };
                async move { Ok::<_, Infallible>(response) }
            });
            let layer = OutboundLayer::new(limiter.clone(), quota, "partner-api");
            let mut client = ServiceBuilder::new().layer(layer.clone()).service(upstream);
            let answered_429 = answered_429.clone();
            tokio::spawn(async move {
                let mut returned_429 = None;
                while Instant::now() < stop {
                    let Ok(ready) = tokio::time::timeout_at(stop.into(), client.ready()).await
                    else {
                        break;
                    };
                    let response = ready.unwrap().call(request()).await.unwrap();
                    if response.status() == StatusCode::TOO_MANY_REQUESTS {
                        answered_429.fetch_add(1, Ordering::SeqCst);
                        // The suspension is written after the 429 is handed back: the other
                        // workers obey from their first call after the write.
                        layer.settled().await;
                        returned_429 = Some(SystemTime::now());
                    }
                }
                returned_429
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    trip.store(true, Ordering::SeqCst);
    let mut suspended_at = None;
    for task in tasks {
        suspended_at = suspended_at.or(task.await.unwrap());
    }

    assert_eq!(answered_429.load(Ordering::SeqCst), 1);
    let suspended_at = suspended_at.expect("worker 0 got the 429");
    let (tripped_at, end) = tripped.lock().unwrap().expect("the upstream tripped");
    let calls = calls.lock().unwrap().clone();
    let (quiet_from, quiet_to) = (unix(suspended_at) + 0.02, unix(end) - 0.01);
    let during: Vec<_> = calls
        .iter()
        .filter(|(_, t)| (quiet_from..quiet_to).contains(&unix(*t)))
        .collect();
    println!(
        "{retry_after:?}: after the 429, suspended by +{:.3} s, back-off until +{:.3} s; {} calls in all, {} in the quiet window",
        unix(suspended_at) - unix(tripped_at),
        unix(end) - unix(tripped_at),
        calls.len(),
        during.len(),
    );
    assert!(quiet_to - quiet_from > 1.9, "the back-off covers ~2 s");
    assert!(
        during.is_empty(),
        "upstream called {} times while suspended, first: {:?}",
        during.len(),
        during.first()
    );
    for worker in 0..WORKERS {
        let before = calls
            .iter()
            .any(|(w, t)| *w == worker && unix(*t) < unix(tripped_at));
        let resumed = calls
            .iter()
            .any(|(w, t)| *w == worker && (unix(end)..unix(end) + 0.7).contains(&unix(*t)));
        assert!(
            before && resumed,
            "worker {worker}: called before {before}, resumed {resumed}"
        );
    }
    for limiter in &limiters {
        assert_eq!(limiter.stats().store_errors, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_suspend_on_retry_after_seconds_or_http_date_stops_every_worker() {
    for retry_after in [RetryAfter::Seconds, RetryAfter::Date] {
        auto_suspend_stops_every_worker(retry_after).await;
    }
}

/// With per-request keys only the key whose upstream answered is suspended (503 counts as well
/// as 429); with auto-suspend off nothing is.
#[tokio::test]
async fn auto_suspend_targets_the_request_key_and_can_be_turned_off() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::TokenBucket, 1).remove(0);
    let quota = Quota::per_second(10).unwrap();
    let busy = tower::service_fn(|_: Request<Body>| async {
        let response = Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .header("retry-after", "30")
            .body(Body::default())
            .unwrap();
        Ok::<_, Infallible>(response)
    });
    let per_path = || FnKey::new(|parts| Some(parts.uri.path().to_owned()));
    let to = |path: &str| Request::get(path).body(Body::default()).unwrap();
    let suspended_for = |key: &'static str| {
        let limiter = limiter.clone();
        async move { limiter.inspect(key).await.unwrap().suspended_for }
    };

    let layer = OutboundLayer::builder_with_extractor(limiter.clone(), quota, per_path())
        .build()
        .unwrap();
    let response = layer.layer(busy).oneshot(to("/a")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The suspension is written after the response.
    layer.settled().await;
    let left = suspended_for("/a").await.expect("/a is suspended");
    assert!(
        left > Duration::from_secs(29) && left <= Duration::from_secs(30),
        "{left:?}"
    );
    assert_eq!(suspended_for("/b").await, None);

    let layer = OutboundLayer::builder_with_extractor(limiter.clone(), quota, per_path())
        .auto_suspend(false)
        .build()
        .unwrap();
    let response = layer.layer(busy).oneshot(to("/c")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    layer.settled().await;
    assert_eq!(suspended_for("/c").await, None);
}

/// Per-request keys wait for their quota before they take the inner service's readiness: behind
/// `ConcurrencyLimit(1)`, a key that has quota is served while a key that has none waits (before,
/// the waiting key held the only slot for its whole wait, ~1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_waiting_for_quota_holds_no_inner_capacity() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::TokenBucket, 1).remove(0);
    // One a second per key: a second request for a key waits ~1 s.
    let quota = Quota::per_second(1).unwrap().with_burst(1).unwrap();
    let served: Arc<Mutex<Vec<String>>> = Arc::default();
    let upstream = {
        let served = served.clone();
        tower::service_fn(move |request: Request<Body>| {
            served.lock().unwrap().push(request.uri().path().to_owned());
            async { Ok::<_, Infallible>(ok()) }
        })
    };
    let per_path = FnKey::new(|parts| Some(parts.uri.path().to_owned()));
    let layer = OutboundLayer::builder_with_extractor(limiter.clone(), quota, per_path)
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(upstream);
    let to = |path: &str| Request::get(path).body(Body::default()).unwrap();

    client.clone().oneshot(to("/slow")).await.unwrap();
    let slow = tokio::spawn(client.clone().oneshot(to("/slow")));
    // The second /slow has been denied once: it is waiting for its quota.
    while limiter.stats().denied == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let asked = Instant::now();
    let fast = client.clone().oneshot(to("/fast")).await.unwrap();
    let fast_took = asked.elapsed();
    assert_eq!(fast.status(), StatusCode::OK);
    let slow_done_first = slow.is_finished();
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
    let served = served.lock().unwrap().clone();
    println!("served in order: {served:?}; the key with quota took {fast_took:?}");
    assert!(
        !slow_done_first,
        "the key with quota waited for the one without"
    );
    assert_eq!(served, ["/slow", "/fast", "/slow"]);
    assert_eq!(limiter.stats().store_errors, 0);
}

/// A large cost among small ones on the same key, in one process: waiters are served in arrival
/// order, so the cost of 5 is admitted within its deadline while 4 waiters of cost 1 keep asking
/// (before, they took every unit as it came and the cost of 5 timed out after 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_cost_is_not_starved_by_small_ones() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::TokenBucket, 1).remove(0);
    let quotas = Quotas::from(Quota::per_second(10).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let small = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, stop, small) = (limiter.clone(), stop.clone(), small.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    limiter.acquire("shared", &quotas, deadline).await.unwrap();
                    small.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    // The small waiters have spent the burst and wait for each unit.
    while limiter.stats().denied < 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = small.load(Ordering::SeqCst);
    let asked = Instant::now();
    let large = limiter
        .acquire_cost("shared", &quotas, 5, asked + Duration::from_secs(3))
        .await;
    let waited = asked.elapsed();
    let meanwhile = small.load(Ordering::SeqCst) - before;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    println!(
        "cost 5 among 4 waiters of cost 1: {} after {waited:?}; {meanwhile} small admissions meanwhile",
        if large.is_ok() { "admitted" } else { "refused" }
    );
    let large = large.unwrap_or_else(|e| panic!("the cost of 5 was starved: {e}"));
    assert!(large.is_allowed());
    // At most the small waiters queued before it (4), and one in flight each.
    assert!(
        meanwhile <= 8,
        "{meanwhile} small admissions while the large one waited"
    );
    assert_eq!(limiter.stats().store_errors, 0);
}
// The upstream announces its limit (RateLimit-Policy / RateLimit / X-RateLimit-*), over real HTTP.
#[path = "outbound/provider.rs"]
mod provider;
// What learning may do with those announcements (untrusted input).
#[path = "outbound/learning.rs"]
mod learning;

// Learning and pacing after the response: what an upstream, an operator or a caller may break.
#[path = "outbound/after_the_response.rs"]
mod after_the_response;
