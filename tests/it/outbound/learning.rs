//! What learning may do with an upstream's announcements, which are untrusted input: the window
//! it accepts is bounded, a learned quota never admits more than the ceiling in any of the
//! ceiling's windows and keeps every configured tier, each key learns its own, an operator's
//! override is never loosened, a flapping upstream costs one write per period, and the caller
//! gets the upstream's answer without waiting for learning's writes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::Request;
use redlimit::limiter::OverrideSource;
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::{Algorithm, Limiter, Quota, Quotas};
use tower::{BoxError, Layer, Service, ServiceExt};

use super::provider::{
    call, expiring_layer, header, learning, learning_layer, learning_with, outcomes,
    per_path_layer, per_second, policy, to_key, Upstream, KEY,
};
use super::support::{debug_sleep_via, RedisServer};
use super::{limiters, Body};

#[tokio::test]
async fn a_hundred_year_window_is_not_learned_and_never_locks_the_key_out() {
    let (_redis, limiter, upstream, _, layer) = learning().await;
    upstream.announce(policy(1, 3_153_600_000));
    let got = outcomes(&layer, &upstream, 5).await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(status.quota_override, None);
    assert_eq!(layer.stats().learned, 0);
}

#[tokio::test]
async fn a_learned_quota_expires_without_a_confirming_answer() {
    let (_redis, limiter, upstream, _, layer) = learning_with(|limiter, ceiling| {
        expiring_layer(limiter, ceiling, Duration::from_millis(500))
    })
    .await;
    upstream.announce(policy(5, 1));
    // The second call waits for the first one's learning.
    outcomes(&layer, &upstream, 2).await;
    let learned = limiter.inspect(KEY).await.unwrap().quota_override;
    assert_eq!(learned, Some(Quotas::from(per_second(5))));
    // Its record tells it from an operator's: learned, with the time it has left.
    let source = limiter.inspect(KEY).await.unwrap().override_source;
    assert!(
        matches!(source, Some(OverrideSource::Learned { left: Some(left) }) if left <= Duration::from_secs(2)),
        "{source:?}"
    );
    // The upstream stops announcing: nothing confirms the quota any more.
    upstream.announce(Vec::new());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    outcomes(&layer, &upstream, 2).await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(status.quota_override, None, "still learned after its TTL");
}

/// How late a call admitted at the end of a second may reach the upstream: the upstream counts
/// a call when it arrives, and under load the connection and the request take that long.
const ARRIVAL_LAG: Duration = Duration::from_millis(200);

/// Upstream calls per aligned second of the wall clock, each counted from [`ARRIVAL_LAG`] past
/// the second's start: a call that arrives then was admitted within that second, so a count
/// above the quota is the limiter's, not a late arrival from the second before.
fn per_aligned_second(hits: &[SystemTime]) -> Vec<usize> {
    let since_epoch = |t: &SystemTime| t.duration_since(UNIX_EPOCH).unwrap();
    let (Some(first), Some(last)) = (hits.first(), hits.last()) else {
        return Vec::new();
    };
    (since_epoch(first).as_secs()..=since_epoch(last).as_secs())
        .map(|s| {
            let from = Duration::from_secs(s) + ARRIVAL_LAG;
            let to = Duration::from_secs(s + 1);
            hits.iter()
                .filter(|t| (from..to).contains(&since_epoch(t)))
                .count()
        })
        .collect()
}

/// Under a ceiling of 50 a second, an upstream announces the same rate over 5 minutes (a burst
/// of 15 000): after one call has learned it and the key idled 1.5 s, 8 workers call as fast as
/// the limiter lets them for 3 s. In no aligned second (past its first [`ARRIVAL_LAG`]) does
/// the upstream see more than `most`, what the ceiling itself admits there.
async fn a_learned_quota_never_exceeds_the_ceiling(algorithm: Algorithm, most: usize) {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, algorithm, 1).remove(0);
    let upstream = Upstream::start().await;
    let layer = learning_layer(&limiter, per_second(50), Duration::from_secs(2));
    upstream.announce(policy(15_000, 300));
    outcomes(&layer, &upstream, 2).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let until = Instant::now() + Duration::from_secs(3);
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (layer, client) = (layer.clone(), upstream.client());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let _ = layer
                        .layer(client.clone())
                        .oneshot(Request::new(Body::default()))
                        .await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let hits = upstream.hits();
    let seconds = per_aligned_second(&hits[2..]);
    println!("{algorithm:?}: upstream calls per aligned second: {seconds:?}");
    assert!(layer.stats().learned >= 1);
    assert!(
        seconds.iter().all(|&n| n <= most),
        "{algorithm:?}: {seconds:?}"
    );
    assert_eq!(limiter.stats().store_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_quota_never_exceeds_the_ceiling_in_any_second() {
    a_learned_quota_never_exceeds_the_ceiling(Algorithm::FixedWindow, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_token_bucket_never_exceeds_the_ceilings_burst_and_rate() {
    // The ceiling's own bucket: its burst of 50, then 50 a second.
    a_learned_quota_never_exceeds_the_ceiling(Algorithm::TokenBucket, 100).await;
}

#[tokio::test]
async fn each_key_learns_its_own_quota() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::FixedWindow, 1).remove(0);
    let upstream = Upstream::start().await;
    let layer = per_path_layer(&limiter, per_second(50), None);
    upstream.announce(policy(5, 1));
    let keys = ["t1", "t2", "t3"];
    // Twice each: a key's second call waits for its first one's learning.
    for _ in 0..2 {
        for key in keys {
            layer
                .layer(upstream.client())
                .oneshot(to_key(key))
                .await
                .unwrap();
        }
    }
    let mut learned = Vec::new();
    for key in keys {
        learned.push(limiter.inspect(key).await.unwrap().quota_override);
    }
    let five = Some(Quotas::from(per_second(5)));
    assert!(learned.iter().all(|q| *q == five), "{learned:?}");
    assert_eq!(layer.stats().learned, 3);
}

#[tokio::test]
async fn learning_never_loosens_an_operators_override() {
    let (_redis, limiter, upstream, _, layer) = learning().await;
    let operators = Quotas::from(per_second(5));
    limiter.set_quota(KEY, &operators).await.unwrap();
    upstream.announce(policy(20, 1));
    // The second call waits for the first one's learning.
    outcomes(&layer, &upstream, 2).await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(status.quota_override, Some(operators));
    assert_eq!(layer.stats().learned, 0);
}

/// An operator sets the very quota learning had set: it is the operator's from then on, so an
/// announcement that would clear or change a learned quota leaves it alone.
#[tokio::test]
async fn an_operators_quota_equal_to_the_learned_one_is_the_operators() {
    let (_redis, limiter, upstream, _, layer) = learning().await;
    let twenty = Quotas::from(per_second(20));
    upstream.announce(policy(20, 1));
    call(&layer, &upstream).await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(status.quota_override, Some(twenty));
    assert!(
        matches!(
            status.override_source,
            Some(OverrideSource::Learned { left: Some(_) })
        ),
        "{:?}",
        status.override_source
    );
    let status = limiter.set_quota(KEY, &twenty).await.unwrap();
    assert_eq!(status.override_source, Some(OverrideSource::Operator));
    // The layer's own tiers (which clear a learned quota), then another quota.
    for q in [50, 30] {
        upstream.announce(policy(q, 1));
        call(&layer, &upstream).await;
        let status = limiter.inspect(KEY).await.unwrap();
        assert_eq!(
            (status.quota_override, status.override_source),
            (Some(twenty), Some(OverrideSource::Operator)),
            "after q={q}"
        );
    }
    // Cleared by the operator: learning sets its own again.
    limiter.clear_quota(KEY).await.unwrap();
    call(&layer, &upstream).await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(status.quota_override, Some(Quotas::from(per_second(30))));
    assert!(matches!(
        status.override_source,
        Some(OverrideSource::Learned { .. })
    ));
}

/// Two instances learn from a flapping upstream (200 or 300 a second, a round after every
/// response) while an operator sets and clears the key's quota: what the operator set is
/// never replaced by learning, and never reads as learned; a learned quota never reads as the
/// operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_controls_racing_two_learning_instances_are_never_taken_for_learned() {
    let redis = RedisServer::start();
    let instances = limiters(&redis, Algorithm::FixedWindow, 2);
    let ceiling = per_second(1000);
    let operators = Quotas::from(per_second(5000));
    let learnable = [Quotas::from(per_second(200)), Quotas::from(per_second(300))];
    let stop = Arc::new(AtomicBool::new(false));
    let flap = Arc::new(AtomicU64::new(0));
    let layers: Vec<OutboundLayer> = instances
        .iter()
        .map(|limiter| {
            OutboundLayer::builder(limiter.clone(), ceiling, KEY)
                .learn_quota(ceiling)
                .learn_period(Duration::ZERO)
                .max_wait(Duration::from_secs(1))
                .build()
                .unwrap()
        })
        .collect();
    let workers: Vec<_> = layers
        .iter()
        .map(|layer| {
            let (layer, stop, flap) = (layer.clone(), stop.clone(), flap.clone());
            tokio::spawn(async move {
                let upstream = tower::service_fn(move |_: Request<Body>| {
                    let q = if flap.fetch_add(1, Ordering::Relaxed) % 2 == 0 {
                        200
                    } else {
                        300
                    };
                    let mut response = http::Response::new(Body::default());
                    response.headers_mut().extend(policy(q, 1));
                    async move { Ok::<_, BoxError>(response) }
                });
                let mut client = layer.layer(upstream);
                while !stop.load(Ordering::Relaxed) {
                    // A call refused past its wait changes nothing here.
                    if let Ok(ready) = client.ready().await {
                        let _ = ready.call(Request::new(Body::default())).await;
                    }
                }
            })
        })
        .collect();
    let operator = &instances[0];
    let mut violations = Vec::new();
    let mut learned_seen = 0;
    for round in 0..30 {
        let status = operator.set_quota(KEY, &operators).await.unwrap();
        if status.override_source != Some(OverrideSource::Operator) {
            violations.push(format!(
                "{round}: set_quota answered {:?}",
                status.override_source
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let status = operator.inspect(KEY).await.unwrap();
        if (status.quota_override, status.override_source)
            != (Some(operators), Some(OverrideSource::Operator))
        {
            violations.push(format!(
                "{round}: after set_quota {:?} {:?}",
                status.quota_override, status.override_source
            ));
        }
        operator.clear_quota(KEY).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let status = operator.inspect(KEY).await.unwrap();
        match status.quota_override {
            None => {}
            Some(q) if learnable.contains(&q) => {
                learned_seen += 1;
                if !matches!(status.override_source, Some(OverrideSource::Learned { .. })) {
                    violations.push(format!("{round}: {q:?} reads {:?}", status.override_source));
                }
            }
            Some(q) => violations.push(format!("{round}: after clear_quota {q:?}")),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    for layer in &layers {
        layer.settled().await;
    }
    let learned: u64 = layers.iter().map(|l| l.stats().learned).sum();
    println!(
        "{learned} learned quotas written, {learned_seen} of 30 clears followed by a learned one, {} violations",
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    // The race was real: learning ran between the operator's controls.
    assert!(learned_seen > 0 && learned > 10, "{learned_seen} {learned}");
}

/// `cmdstat_evalsha` plus `cmdstat_eval` calls so far.
fn script_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test]
async fn a_flapping_upstream_costs_one_write_per_period() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::FixedWindow, 1).remove(0);
    let upstream = Upstream::start().await;
    let layer = learning_layer(&limiter, per_second(1000), Duration::from_secs(5));
    let before = script_calls(&redis);
    for i in 0..100 {
        upstream.announce(policy(if i % 2 == 0 { 200 } else { 300 }, 1));
        call(&layer, &upstream).await;
    }
    let per_call = (script_calls(&redis) - before) as f64 / 100.0;
    let learned = layer.stats().learned;
    println!("{learned} writes, {per_call:.2} script calls per upstream call");
    // 100 calls at 200 a second take well under the default period (30 s).
    assert!(
        learned <= 2,
        "{learned} writes, {per_call:.2} script calls per upstream call"
    );
    assert!(
        per_call <= 1.2,
        "{per_call:.2} script calls per upstream call"
    );
}

#[tokio::test]
async fn learning_keeps_every_configured_tier_as_a_cap() {
    let redis = RedisServer::start();
    let limiter = limiters(&redis, Algorithm::FixedWindow, 1).remove(0);
    let upstream = Upstream::start().await;
    let configured = Quotas::new([per_second(10), Quota::per_minute(500).unwrap()]).unwrap();
    let layer = OutboundLayer::builder(limiter.clone(), configured, KEY)
        .learn_quota(per_second(10))
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    upstream.announce(vec![header("x-ratelimit-limit", "5")]);
    outcomes(&layer, &upstream, 2).await;
    let status = limiter.inspect(KEY).await.unwrap();
    let expected = Quotas::new([per_second(5), Quota::per_minute(500).unwrap()]).unwrap();
    assert_eq!(status.quota_override, Some(expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_does_not_wait_for_learning() {
    let (redis, limiter, upstream, _, layer) = learning().await;
    upstream.announce(policy(5, 1));
    // Redis stops answering for 3 s just as the upstream answers (after the admission).
    let client = redis.client();
    let (sent, asleep) = std::sync::mpsc::channel();
    upstream.on_next_request(move || {
        let _ = sent.send(debug_sleep_via(&client, Duration::from_secs(3)));
    });
    let call = layer
        .layer(upstream.client())
        .oneshot(Request::new(Body::default()));
    let response = answered_without_waiting(call, "").await.unwrap();
    assert!(response.status().is_success());
    asleep.recv().unwrap().join().unwrap();
    // The learning still happened: this instance's next call waited for it.
    outcomes(&layer, &upstream, 1).await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(status.quota_override, Some(Quotas::from(per_second(5))));
}

/// The upstream answers `status` with `headers`, after putting the private Redis to sleep for
/// `sleep` (after the admission, before the layer's pacing write).
fn sleepy_upstream(
    redis: &RedisServer,
    status: u16,
    headers: Vec<super::provider::Header>,
    sleep: Duration,
) -> impl tower::Service<
    Request<Body>,
    Response = http::Response<Body>,
    Error = BoxError,
    Future = impl std::future::Future<Output = Result<http::Response<Body>, BoxError>> + Send,
> + Clone
       + Send
       + 'static {
    let client = redis.client();
    tower::service_fn(move |_: Request<Body>| {
        let (client, headers) = (client.clone(), headers.clone());
        async move {
            debug_sleep_via(&client, sleep);
            let mut response = http::Response::new(Body::default());
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            response.headers_mut().extend(headers);
            Ok::<_, BoxError>(response)
        }
    })
}

/// What `call` gives, checked to come within 2 s: the writes after the answer wait on a
/// sleeping Redis, the answer must not. `what` starts the message (the case, or nothing).
async fn answered_without_waiting<T>(call: impl std::future::Future<Output = T>, what: &str) -> T {
    let started = Instant::now();
    let output = call.await;
    let waited = started.elapsed();
    println!("{what}the response waited {waited:?}");
    assert!(
        waited < Duration::from_secs(2),
        "{what}the response waited {waited:?}"
    );
    output
}

/// The two answers that ask for a pause of 30 s: a 200 with nothing left until the reset, and a
/// 429 with `Retry-After`.
fn pause_answers() -> [(u16, Vec<super::provider::Header>); 2] {
    [
        (200, vec![header("ratelimit", "p;r=0;t=30")]),
        (429, vec![header("retry-after", "30")]),
    ]
}

/// Once `layer` has settled, `other` (another instance) sees `key` suspended for more than
/// 20 s; `what` says which case failed.
async fn assert_paused_elsewhere(layer: &OutboundLayer, other: &Limiter, key: &str, what: &str) {
    layer.settled().await;
    let left = other.inspect(key).await.unwrap().suspended_for;
    assert!(
        left.is_some_and(|left| left > Duration::from_secs(20)),
        "{what}: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_does_not_wait_for_pacing() {
    let redis = RedisServer::start();
    let instances = limiters(&redis, Algorithm::TokenBucket, 2);
    for (status, headers) in pause_answers() {
        // Redis sleeps 3 s just as the upstream answers: the pacing write waits for it.
        let upstream = sleepy_upstream(&redis, status, headers, Duration::from_secs(3));
        let key = format!("paced-{status}");
        let layer = OutboundLayer::builder(instances[0].clone(), per_second(50), key.clone())
            .max_wait(Duration::ZERO)
            .build()
            .unwrap();
        let call = layer
            .layer(upstream.clone())
            .oneshot(Request::new(Body::default()));
        let what = format!("{status}: ");
        let response = answered_without_waiting(call, &what).await.unwrap();
        assert_eq!(response.status().as_u16(), status);
        // This instance's next call waits for the pacing write, and is paced: refused.
        let next = layer
            .layer(upstream)
            .oneshot(Request::new(Body::default()))
            .await;
        assert!(
            matches!(next, Err(OutboundError::Acquire(_))),
            "{status}: the next call went out"
        );
        // Another instance sees the suspension once the layer has settled.
        assert_paused_elsewhere(&layer, &instances[1], &key, &status.to_string()).await;
    }
}

/// A caller that gives up on its call (a timeout drops the response future) while Redis is
/// slow never loses the suspension the upstream asked for: it is written all the same, and
/// another instance sees it once the layer has settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_response_future_never_loses_the_suspension() {
    let redis = RedisServer::start();
    let instances = limiters(&redis, Algorithm::TokenBucket, 2);
    for (status, headers) in pause_answers() {
        let key = format!("dropped-{status}");
        let layer = OutboundLayer::builder(instances[0].clone(), per_second(50), key.clone())
            .build()
            .unwrap();
        let upstream = sleepy_upstream(&redis, status, headers, Duration::from_secs(1));
        let call = layer.layer(upstream).oneshot(Request::new(Body::default()));
        let outcome = tokio::time::timeout(Duration::from_millis(300), call).await;
        println!(
            "{status}: the caller {}",
            if outcome.is_ok() {
                "got the answer"
            } else {
                "gave up"
            }
        );
        let what = format!("{status}: the suspension was lost");
        assert_paused_elsewhere(&layer, &instances[1], &key, &what).await;
    }
}

/// Learning's controls and an operator's, on Redis (`lua/control.lua`) and on the memory store
/// (its mirror), for every algorithm, unscoped and scoped: the key's string and its learning
/// record hold the same bytes after every control.
#[tokio::test]
async fn learning_controls_store_the_same_bytes_on_redis_and_in_memory() {
    use redlimit::store::{Control, ControlRequest, MemoryStore, StoreExt};

    let server = RedisServer::start();
    let mut conn = server.conn();
    let start = 1_800_000_000_000_000u64;
    let (five, twenty, thirty) = (
        Quotas::from(per_second(5)),
        Quotas::from(per_second(20)),
        Quotas::new([per_second(30), Quota::per_minute(900).unwrap()]).unwrap(),
    );
    let ttl = Duration::from_secs(600);
    let steps = [
        Control::Learn(&twenty, ttl),
        Control::Inspect,
        Control::Learn(&thirty, ttl),
        Control::SetQuota(&five),
        Control::Learn(&twenty, ttl),
        Control::Unlearn,
        Control::ClearQuota,
        Control::Learn(&twenty, Duration::from_millis(1500)),
        Control::Suspend(Duration::from_secs(60)),
        Control::Learn(&twenty, ttl),
        Control::Unlearn,
        Control::Unlearn,
        Control::Learn(&thirty, ttl),
        Control::SetQuota(&thirty),
        Control::Unlearn,
        Control::ClearQuota,
        Control::Learn(&twenty, ttl),
        // On the tenant's key: an operator's override of every route; learning then sets
        // nothing and clears the route's learned override.
        Control::SetQuota(&five),
        Control::Learn(&thirty, ttl),
        Control::Learn(&twenty, ttl),
        Control::ClearQuota,
        Control::Learn(&twenty, ttl),
    ];
    let on_tenant = |i: usize| i == 17 || i == 20;
    for &algorithm in Algorithm::ALL {
        let redis = super::support::Ctx::new(algorithm).redis_store(&server);
        let memory = MemoryStore::new();
        let id = format!("redlimit:{{d-{algorithm}}}");
        for (key, record) in [
            (id.clone(), format!("{id}#l")),
            (format!("{id}:api"), format!("{id}:api#l")),
        ] {
            let tenant = format!("{id}#t");
            let strings = match algorithm {
                Algorithm::SlidingLog => [format!("{key}#m"), record, tenant.clone()],
                _ => [key.clone(), record, tenant.clone()],
            };
            for (i, control) in steps.iter().enumerate() {
                let now = start + i as u64 * 1_000;
                let request = ControlRequest {
                    key: if on_tenant(i) { &tenant } else { &key },
                    algorithm,
                    control: *control,
                    now_micros: Some(now),
                };
                let (a, b) = (redis.control(request).await, memory.control(request).await);
                let (a, b) = (a.unwrap(), b.unwrap());
                let what = format!("{algorithm} {key} step {i} {control:?}");
                let (ta, tb) = (
                    a.expires_in().unwrap_or_default(),
                    b.expires_in().unwrap_or_default(),
                );
                assert!(
                    ta.abs_diff(tb) < Duration::from_secs(1),
                    "{what}: {ta:?} {tb:?}"
                );
                for string in &strings {
                    let on_redis: Option<Vec<u8>> =
                        redis::cmd("GET").arg(string).query(&mut conn).unwrap();
                    assert_eq!(
                        on_redis,
                        memory.stored_state(string, now),
                        "{what}: {string}"
                    );
                    // The first step writes both: the strings compared are the ones written.
                    assert!(
                        i > 0 || on_redis.is_some() || string == &tenant,
                        "{what}: {string} not written"
                    );
                }
            }
        }
    }
}
