//! Learning and pacing after the response: each test states the promise of docs/outbound.md it
//! tries to break (an operator's override is never loosened, a learned quota expires, hostile
//! pacing headers are capped, a caller that gives up loses no pacing, a flapping upstream costs
//! one write per period), with the figures it saw.

use std::sync::Arc;
use std::time::Duration;

use http::Request;
use redlimit::limiter::OverrideSource;
use redlimit::outbound::OutboundLayer;
use redlimit::{Algorithm, Quota, Quotas, Target};
use tower::{Layer, ServiceExt};

use super::provider::{
    expiring_layer, header, layer, learning, learning_layer, learning_with, outcomes,
    per_path_layer, per_second, policy, to_key, Header, Upstream, KEY,
};
use super::support::{debug_sleep_via, Ctx, RedisServer};
use super::{limiters, Body};

/// Two calls whose answers announce `headers`, and the learning rounds they start, settled.
async fn announce_twice(layer: &OutboundLayer, upstream: &Upstream, headers: Vec<Header>) {
    upstream.announce(headers);
    calls(layer, upstream, 2).await;
    layer.settled().await;
}

/// How many of `n` calls through `layer`, each after the previous one, went out.
async fn calls(layer: &OutboundLayer, upstream: &Upstream, n: usize) -> usize {
    let outcomes = outcomes(layer, upstream, n).await;
    outcomes.iter().filter(|outcome| outcome.is_ok()).count()
}

/// Operator precedence: "learning never loosens an operator's override". An operator's override
/// of every route of the tenant (`Target::all_routes`) is shadowed by a route override, so a
/// learned 20/s on the route admits 20 a second under the operator's 5/s, and learning keeps
/// renewing it as its own.
#[tokio::test]
async fn a_learned_route_quota_never_loosens_an_operators_override_of_every_route() {
    let (_redis, limiter, upstream, ceiling, layer) = learning().await;
    announce_twice(&layer, &upstream, policy(20, 1)).await;
    assert_eq!(
        limiter.inspect(KEY).await.unwrap().quota_override,
        Some(Quotas::from(per_second(20)))
    );
    // The operator tightens every route of the tenant to 5 a second.
    let operators = Quotas::from(per_second(5));
    limiter
        .set_quota(Target::all_routes(KEY), &operators)
        .await
        .unwrap();
    // More answers confirm the learned quota.
    calls(&layer, &upstream, 2).await;
    layer.settled().await;
    let status = limiter.inspect(KEY).await.unwrap();
    let mut admitted = 0;
    for _ in 0..40 {
        admitted += usize::from(limiter.check(KEY, &ceiling).await.is_allowed());
    }
    assert!(
        admitted <= 5 + 5,
        "the operator set 5/s on every route, the route admitted {admitted} in a burst \
         (override in force {:?}, source {:?})",
        status.quota_override,
        status.override_source
    );
}

/// Expiry: "a learned quota lasts `learned_ttl` from the last answer that confirmed it; the
/// first round after that without one clears it". The round after the TTL meets a Redis that
/// does not answer within the store's timeout; Redis is back, answers keep coming without an
/// announcement, yet no round ever runs again: the learned quota stays for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_expiry_round_never_leaves_the_learned_quota_for_good() {
    let redis = RedisServer::start();
    let limiter = Ctx::new(Algorithm::FixedWindow)
        .timeout(Duration::from_millis(300))
        .redis(&redis);
    let upstream = Upstream::start().await;
    let layer = expiring_layer(&limiter, per_second(50), Duration::from_millis(300));
    announce_twice(&layer, &upstream, policy(5, 1)).await;
    assert_eq!(
        limiter.inspect(KEY).await.unwrap().quota_override,
        Some(Quotas::from(per_second(5)))
    );
    // The upstream stops announcing; the learned quota's time runs out.
    upstream.announce(Vec::new());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Redis sleeps 1.5 s as the upstream answers (after the admission): the expiry round fails.
    let client = redis.client();
    let (sent, asleep) = std::sync::mpsc::channel();
    upstream.on_next_request(move || {
        let _ = sent.send(debug_sleep_via(&client, Duration::from_millis(1500)));
    });
    calls(&layer, &upstream, 1).await;
    layer.settled().await;
    asleep.recv().unwrap().join().unwrap();
    // Redis is back: 3 s of answers that announce nothing, several learning periods.
    for _ in 0..10 {
        calls(&layer, &upstream, 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    layer.settled().await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(
        status.quota_override, None,
        "still {:?} ({:?}) 3 s after a failed expiry round",
        status.quota_override, status.override_source
    );
}

/// The learning record lives at "the same key in the scope `learned`": a route of that scope
/// (a layer scoped `learned`, e.g. an inbound one on the same tenant ids) reads the record as
/// its controls, so learning on the unscoped key suspends it for the learned quota's time and
/// replaces its quota.
#[tokio::test]
async fn learning_never_suspends_a_route_scoped_learned() {
    let (_redis, limiter, upstream, _, layer) = learning().await;
    let other = Quotas::from(Quota::per_minute(1000).unwrap());
    let acquire_on_the_route = || {
        let now = std::time::Instant::now();
        limiter.acquire_cost(Target::scoped("learned", KEY), &other, 1, now)
    };
    // The scope is accepted.
    let verdict = acquire_on_the_route().await;
    assert!(verdict.is_ok(), "{verdict:?}");
    announce_twice(&layer, &upstream, policy(5, 1)).await;
    let status = limiter
        .inspect(Target::scoped("learned", KEY))
        .await
        .unwrap();
    let verdict = acquire_on_the_route().await;
    assert!(
        verdict.is_ok(),
        "a route scoped `learned`, 1 of 1000/min used: {verdict:?}; it reads suspended for \
         {:?} with the override {:?}",
        status.suspended_for,
        status.quota_override
    );
}

/// Hostile `Retry-After` (huge seconds, a far-future date) and `RateLimit` resets: a pacing
/// write never suspends the key past `max_auto_suspension` (5 min by default).
#[tokio::test]
async fn hostile_pacing_headers_are_capped() {
    // Pacing only: a learned quota (`X-RateLimit-Limit: 1`) would refuse the next call.
    let (_redis, limiter, upstream, _, layer) =
        learning_with(|limiter, ceiling| layer(limiter, ceiling, None)).await;
    let cap = Duration::from_secs(300);
    for headers in [
        vec![header("ratelimit", "p;r=0;t=999999999999999")],
        vec![
            header("x-ratelimit-limit", "1"),
            header("x-ratelimit-remaining", "0"),
            header("x-ratelimit-reset", "99999999999"),
        ],
        vec![header("ratelimit", "p;r=0;t=1, p;r=0;t=999999")],
    ] {
        limiter.resume(KEY).await.unwrap();
        upstream.announce(headers.clone());
        calls(&layer, &upstream, 1).await;
        layer.settled().await;
        let status = limiter.inspect(KEY).await.unwrap();
        let left = status.suspended_for;
        assert!(left.is_some_and(|l| l <= cap), "{headers:?}: {left:?}");
        assert!(
            status
                .expires_in
                .is_some_and(|e| e <= Duration::from_secs(31 * 86_400)),
            "{status:?}"
        );
    }
}

/// Cancellation: a caller that gives up (a `timeout` around the call) while the upstream is
/// slow, at every point; `settled()` never hangs, and the next call still decides under the
/// pacing the earlier answers called for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_calls_never_hang_settled_or_lose_pacing() {
    let (_redis, limiter, upstream, _, layer) = learning().await;
    upstream.announce(vec![
        header("ratelimit-policy", "p;q=10;w=1"),
        header("ratelimit", "p;r=0;t=2"),
    ]);
    for ms in [0u64, 1, 2, 5, 10, 20] {
        limiter.resume(KEY).await.unwrap();
        let service = layer.layer(upstream.client());
        let _ = tokio::time::timeout(
            Duration::from_millis(ms),
            service.oneshot(Request::new(Body::default())),
        )
        .await;
        let settled = tokio::time::timeout(Duration::from_secs(5), layer.settled()).await;
        assert!(settled.is_ok(), "settled() hung after a {ms} ms timeout");
    }
    // One answer completes: the next call is refused under the pacing (max_wait 0).
    limiter.resume(KEY).await.unwrap();
    calls(&layer, &upstream, 1).await;
    let next = tokio::time::timeout(Duration::from_secs(5), calls(&layer, &upstream, 1)).await;
    assert_eq!(
        next,
        Ok(0),
        "the next call after `remaining: 0` was admitted"
    );
}

/// The learning round of a key is registered after its task is spawned: a task that ends first
/// (on another worker) leaves a round "in flight" that never ends, and the key never learns
/// again in this process. 200 per-request keys on a fast store, each learns 20/s then 10/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_learns_again_after_its_first_round() {
    let limiter = super::support::memory_limiter(Algorithm::FixedWindow);
    let upstream = Arc::new(Upstream::start().await);
    let layer = per_path_layer(&limiter, per_second(50), Some(Duration::ZERO));
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for (q, _) in [(20u64, 0), (10, 1)] {
        upstream.announce(policy(q, 1));
        for key in &keys {
            let _ = layer.layer(upstream.client()).oneshot(to_key(key)).await;
        }
        layer.settled().await;
    }
    let mut stuck = 0;
    for key in &keys {
        let status = limiter.inspect(key.as_str()).await.unwrap();
        if status.quota_override != Some(Quotas::from(per_second(10))) {
            stuck += 1;
        }
        assert!(matches!(
            status.override_source,
            Some(OverrideSource::Learned { .. })
        ));
    }
    assert_eq!(stuck, 0, "{stuck} of 200 keys never learned again");
}

/// The same root as above, from the operator's side: an operator who sets the same quota on
/// the key and on its route of scope `learned` has written the key's learning record, byte for
/// byte: the key's operator override then reads as learned, and learning replaces it with the
/// upstream's looser quota.
#[tokio::test]
async fn an_operators_quota_on_the_scope_learned_never_makes_the_keys_override_learned() {
    let (_redis, limiter, upstream, _, layer) = learning().await;
    let operators = Quotas::from(per_second(5));
    limiter.set_quota(KEY, &operators).await.unwrap();
    limiter
        .set_quota(Target::scoped("learned", KEY), &operators)
        .await
        .unwrap();
    let source = limiter.inspect(KEY).await.unwrap().override_source;
    announce_twice(&layer, &upstream, policy(20, 1)).await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(
        (status.quota_override, source),
        (Some(operators), Some(OverrideSource::Operator)),
        "the operator's 5/s read as {source:?} and became {:?}",
        status.quota_override
    );
}

/// Operator precedence, the other order: the operator's override of every route is in force
/// first; learning sets nothing on the route.
#[tokio::test]
async fn learning_sets_nothing_under_an_operators_override_of_every_route() {
    let (_redis, limiter, upstream, _, layer) = learning().await;
    let operators = Quotas::from(per_second(5));
    limiter
        .set_quota(Target::all_routes(KEY), &operators)
        .await
        .unwrap();
    announce_twice(&layer, &upstream, policy(20, 1)).await;
    let status = limiter.inspect(KEY).await.unwrap();
    assert_eq!(status.quota_override, Some(operators));
    assert_eq!(layer.stats().learned, 0);
}

/// Writes: a flapping upstream (`q=200` / `q=300` alternating) seen by two instances over 60
/// calls within one learning period (30 s): at most one change per key per period fleet-wide.
#[tokio::test]
async fn two_instances_under_a_flapping_upstream_change_the_quota_once_a_period() {
    let redis = RedisServer::start();
    let instances = limiters(&redis, Algorithm::FixedWindow, 2);
    let upstream = Upstream::start().await;
    let ceiling = Quota::per_minute(60_000).unwrap();
    let layers: Vec<OutboundLayer> = instances
        .iter()
        .map(|limiter| learning_layer(limiter, ceiling, Duration::from_secs(1)))
        .collect();
    for i in 0..60 {
        upstream.announce(policy(if i % 2 == 0 { 200 } else { 300 }, 60));
        calls(&layers[i % 2], &upstream, 1).await;
        if i % 10 == 0 {
            layers[i % 2].settled().await;
        }
    }
    for layer in &layers {
        layer.settled().await;
    }
    let changes: u64 = layers.iter().map(|l| l.stats().learned).sum();
    assert!(
        changes <= 1,
        "{changes} changes of the learned quota in one period"
    );
}
