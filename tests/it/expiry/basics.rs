//! The key's expiry on Redis's clock: the decision script remembers it before the state of a
//! one-tier key found alive and keeps it while it is late enough (`SET … KEEPTTL`), setting one
//! half as long again as needed only when the key must live longer (`lua/common.lua`'s write). Whatever
//! writes the key in between (an operator's override, a refund, a client-clock instance, a
//! `FLUSHALL`), a key never expires before its state is fresh again.

use crate::support;

use std::time::{Duration, Instant};

use redlimit::{clock::Clock, Algorithm, Limiter, Quota, Quotas};
use support::{Ctx, RedisServer};

/// The algorithms that keep one packed state in the key's string (the sliding log keeps a
/// sorted set).
pub(crate) fn packed() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL
        .iter()
        .copied()
        .filter(|&a| a != Algorithm::SlidingLog)
}

/// The packed state's length: the sliding window keeps three numbers, the others two.
fn state_len(algorithm: Algorithm) -> usize {
    if algorithm == Algorithm::SlidingWindow {
        25
    } else {
        17
    }
}

/// A limiter of `algorithm` on `redis`, the name `<prefix>-<algorithm>` and its storage key.
fn on_redis(redis: &RedisServer, algorithm: Algorithm, prefix: &str) -> (Limiter, String, String) {
    let limiter = Ctx::new(algorithm).redis(redis);
    let name = format!("{prefix}-{algorithm}");
    let key = limiter.storage_key(name.as_str());
    (limiter, name, key)
}

pub(crate) fn pttl(redis: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut redis.conn())
        .expect("PTTL")
}

pub(crate) fn stored(redis: &RedisServer, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut redis.conn())
        .expect("GET")
}

#[tokio::test]
async fn a_busy_key_keeps_its_expiry_instead_of_setting_one_on_every_admission() {
    let redis = RedisServer::start();
    // Each admission makes the key live 3.6 s longer (until the bucket is full again): an
    // expiry set on every admission moves up on every admission.
    let quota = Quota::per_hour(1_000).unwrap();
    for algorithm in packed() {
        let (limiter, name, key) = on_redis(&redis, algorithm, "busy");
        let mut last = i64::MAX;
        let mut moved = 0;
        for _ in 0..200 {
            let decision = support::decision(&limiter, name.as_str(), &quota).await;
            assert!(decision.allowed, "{algorithm}");
            let left = pttl(&redis, &key);
            assert!(left > 0, "{algorithm}: the key lives ({left})");
            if left > last {
                moved += 1;
            }
            last = left;
        }
        // Half of slack: the expiry moves about once per 50 % more admissions (14 times in 200
        // when it grows with each); on every one without it.
        assert!(
            moved <= 30,
            "{algorithm}: the expiry moved on {moved} of 200 admissions"
        );
        // Controls that change nothing (no override; as the suspension's end, minus the
        // expiry), then the state.
        let bytes = stored(&redis, &key).expect("the key");
        assert_eq!(
            bytes.len(),
            10 + state_len(algorithm),
            "{algorithm}: the expiry and the state"
        );
        let until = f64::from_le_bytes(bytes[1..9].try_into().unwrap());
        assert_eq!((bytes[0], bytes[9]), (b'M', 0), "{algorithm}");
        assert!(until < 0.0, "{algorithm}: {until}");
        // The operator sees one tier, no suspension and no override.
        let status = limiter.inspect(name.as_str()).await.expect("inspect");
        assert_eq!(status.tiers.len(), 1, "{algorithm}: {status:?}");
        assert_eq!(
            (status.suspended_for, status.quota_override.is_some()),
            (None, false),
            "{algorithm}: {status:?}"
        );
    }
}

/// A small deterministic generator (the sequence is the same on every run).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test]
async fn a_key_never_expires_before_its_state_is_fresh_whatever_writes_it_in_between() {
    let redis = RedisServer::start();
    // Short TTLs (at most 2 s), so that keys expire and come back during the run.
    let quota = support::quota_with_burst(20, Duration::from_secs(1), 10);
    let quotas: Quotas = quota.into();
    let tight: Quotas = support::quota_with_burst(5, Duration::from_secs(1), 3).into();
    for algorithm in packed() {
        let server = Ctx::new(algorithm).redis(&redis);
        let client = Ctx::new(algorithm).clock(Clock::System).redis(&redis);
        let key = server.storage_key("k");
        let mut random = Lcg(algorithm as u64 + 7);
        let mut checked = 0;
        for step in 0..400 {
            let roll = random.below(100);
            let limiter: &Limiter = if roll < 8 { &client } else { &server };
            match roll {
                0..=1 => redis.flushall(),
                2..=3 => {
                    server.set_quota("k", &tight).await.expect("override");
                }
                4..=6 => {
                    server.clear_quota("k").await.expect("clear");
                }
                7..=9 => {
                    let units = 1 + random.below(2);
                    server.refund("k", &quotas, units).await.expect("refund");
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(random.below(15))).await;
            let cost = random.below(4);
            let sent = Instant::now();
            let decision = limiter
                .try_check_quotas("k", &quotas, cost)
                .await
                .expect("the store decides");
            let left = pttl(&redis, &key);
            let elapsed = sent.elapsed();
            // The key lives at least until its state is fresh again, counted from the
            // decision (which ran after `sent`): a key gone or expiring sooner forgets what it
            // admitted. Within 2 ms: `reset_after` is rounded up to the ms, PTTL down.
            let fresh_in = decision.reset_after.saturating_sub(elapsed);
            if fresh_in > Duration::from_millis(2) {
                checked += 1;
                assert!(
                    left >= 0 && Duration::from_millis(left as u64 + 2) >= fresh_in,
                    "{algorithm}, step {step} (roll {roll}, cost {cost}): the key expires in \
                     {left} ms, its state is fresh in {fresh_in:?}: {decision:?}, stored {:?}",
                    stored(&redis, &key)
                );
            }
        }
        assert!(
            checked > 100,
            "{algorithm}: {checked} decisions left state behind"
        );
    }
}

#[tokio::test]
async fn a_new_key_gets_its_exact_ttl_and_no_remembered_time() {
    let quota = Quota::per_hour(1_000).unwrap();
    let redis = RedisServer::start();
    for algorithm in packed() {
        let (limiter, name, key) = on_redis(&redis, algorithm, "once");
        let decision = support::decision(&limiter, name.as_str(), &quota).await;
        let bytes = stored(&redis, &key).expect("the key");
        assert_eq!(bytes.len(), state_len(algorithm), "{algorithm}: {bytes:?}");
        // Its TTL is when its state is fresh again, not more.
        let left = Duration::from_millis(pttl(&redis, &key) as u64);
        assert!(
            left <= decision.reset_after
                && left + Duration::from_millis(100) >= decision.reset_after,
            "{algorithm}: the key lives {left:?}, its state is fresh in {:?}",
            decision.reset_after
        );
    }
}
