//! The remembered expiry at its edges (`lua/common.lua`'s write: a one-tier key on Redis's clock
//! keeps its TTL with `SET … KEEPTTL` while the expiry it remembers after its state is late
//! enough): a key never expires before its state is fresh again, and an idle key outlives its
//! freshness by at most half of it and half of its period. Against a previous release's script
//! on the same keys (a rolling deploy), Redis without `KEEPTTL`, remembered times that are no
//! time, quota and tier changes, operators on a busy key, and a fleet of mixed clocks.

use crate::support;

use std::time::{Duration, Instant};

use super::basics::{packed, pttl, Lcg};
use redlimit::{Algorithm, Limiter, Quota};
use support::{Ctx, RedisServer};

/// The ms since `sent`: what a key's PTTL, read after a decision sent then, lost meanwhile.
fn since(sent: Instant) -> i64 {
    sent.elapsed().as_millis() as i64
}

/// Writes `bytes` at `key` by hand, to live an hour.
fn put_for_an_hour(redis: &RedisServer, key: &str, bytes: &[u8]) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(bytes)
        .arg("PX")
        .arg(3_600_000)
        .query(&mut redis.conn())
        .expect("SET");
}

/// The key's string, which must be there.
fn stored(redis: &RedisServer, key: &str) -> Vec<u8> {
    super::basics::stored(redis, key).expect("the key")
}

/// The decision script's one argument on Redis's clock (now_us -1): cost 1, the algorithm's
/// byte, one tier.
fn server_clock_args(algorithm: Algorithm, limit: f64, period_us: f64, burst: f64) -> Vec<u8> {
    let tag = redlimit::algorithm::script_tag(algorithm);
    support::script_args(-1.0, 1.0, tag, &[(limit, period_us, burst)])
}

/// Whether a decision script's reply admits: an integer (the one-quota admission), or the
/// packed reply with flag 1.
fn admits(reply: &redis::Value) -> bool {
    match reply {
        redis::Value::Int(_) => true,
        redis::Value::BulkString(bytes) => bytes[0] & 1 == 1,
        other => panic!("a decision's reply: {other:?}"),
    }
}

/// The decision script of the release before the remembered expiry, as a deploy that has not
/// reached every instance still runs it: its one-tier path takes only strings of a state's
/// length, and it always sets the TTL.
fn previous_release_script() -> String {
    fn replace(source: &mut String, from: &str, to: &str, times: usize) {
        assert_eq!(source.matches(from).count(), times, "{from:?}");
        *source = source.replace(from, to);
    }
    let mut source = redlimit::test_hooks::script_source().to_owned();
    // The one-tier path's strings, and the write.
    let start = source
        .find("local plain = not t and tiers == 1 and not log\n")
        .expect("the one-tier test");
    let end = start
        + source[start..]
            .find("\nif not plain then\n")
            .expect("its end");
    source.replace_range(
        start..end,
        "local plain = not t and tiers == 1 and not log and\n  (not s or #s == 17 or #s == 25)",
    );
    replace(
        &mut source,
        "  if plain and clocked and s then\n",
        "  if false then\n",
        1,
    );
    source
}

/// A rolling deploy: instances of the previous release and of this one decide on the same
/// keys, on Redis's clock. Each must read what the other admitted: a key this release wrote
/// (its state and the remembered expiry) must not read as a fresh one to the previous release,
/// or every request alternating between them is admitted.
#[test]
fn a_previous_release_reads_what_this_release_admitted() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let previous = previous_release_script();
    let current = redlimit::test_hooks::script_source();
    for algorithm in packed() {
        // 5 a minute, a burst of 5: 5 of 20 requests within the minute, whichever release
        // decides each.
        let args = server_clock_args(algorithm, 5.0, 60e6, 5.0);
        let mut run = |name: &str, pick: &dyn Fn(usize) -> bool| {
            let key = format!("redlimit:{{{name}-{algorithm}}}");
            (0..20)
                .filter(|&i| {
                    let source: &str = if pick(i) { current } else { &previous };
                    let reply: redis::Value = support::eval_on_key(&mut conn, source, &key, &args);
                    admits(&reply)
                })
                .count()
        };
        // Each release on its own keeps the quota.
        assert_eq!(
            run("previous", &|_| false),
            5,
            "{algorithm}: previous alone"
        );
        assert_eq!(run("current", &|_| true), 5, "{algorithm}: current alone");
        let admitted = run("both", &|i| i % 2 == 0);
        assert!(
            admitted <= 5,
            "{algorithm}: {admitted} of 20 admitted under 5 a minute, both releases deciding"
        );
    }
}

/// A remembered expiry that is no time Redis could have set (infinite, past 2^53 ms from now,
/// NaN, negative), before a valid state, in a key without a TTL (restored by hand, or written
/// by something else): the next admission sets a TTL as it would on a fresh key, rather than
/// keeping none for ever.
#[tokio::test]
async fn a_remembered_expiry_that_is_no_time_gives_the_key_a_ttl() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(1_000).unwrap();
    let corrupt = [f64::INFINITY, 1e300, 2f64.powi(60), f64::NAN, -1.0];
    for algorithm in packed() {
        let limiter = Ctx::new(algorithm).redis(&redis);
        for (i, expiry) in corrupt.into_iter().enumerate() {
            let target = format!("corrupt-{i}");
            let key = limiter.storage_key(target.as_str());
            // The second admission finds the key alive: it remembers the expiry.
            support::decision(&limiter, target.as_str(), &quota).await;
            support::decision(&limiter, target.as_str(), &quota).await;
            let mut bytes = stored(&redis, &key);
            assert_eq!((bytes[0], bytes[9]), (b'M', 0), "{algorithm}: {bytes:?}");
            // Remembered as the suspension's end, negated.
            bytes[1..9].copy_from_slice(&(-expiry).to_le_bytes());
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(&bytes)
                .query(&mut redis.conn())
                .expect("SET");
            let sent = Instant::now();
            let decision = support::decision(&limiter, target.as_str(), &quota).await;
            assert!(decision.allowed, "{algorithm}");
            let left = pttl(&redis, &key) + since(sent);
            let fresh = decision.reset_after.as_millis() as i64;
            assert!(
                left >= fresh - 2 && left <= fresh + fresh / 2 + 2 + since(sent),
                "{algorithm}, remembered {expiry}: the key expires in {left} ms, its state is \
                 fresh in {fresh} ms"
            );
        }
    }
}

/// An idle key outlives its freshness by at most half of it and half of its period
/// (`lua/common.lua`'s write), also after the quota loosens: a key that lived an hour under a
/// tight quota and is then admitted under a loose one is fresh again within a second, and must
/// not stay for most of the hour.
#[tokio::test]
async fn a_looser_quota_shortens_the_expiry_it_remembers() {
    let redis = RedisServer::start();
    let tight = Quota::per_hour(1_000).unwrap();
    let loose = Quota::per_second(1_000).unwrap();
    let mut outlived = Vec::new();
    for algorithm in packed() {
        let limiter: Limiter = Ctx::new(algorithm).redis(&redis);
        let key = limiter.storage_key("loosened");
        for _ in 0..100 {
            assert!(
                support::decision(&limiter, "loosened", &tight)
                    .await
                    .allowed
            );
        }
        let before = pttl(&redis, &key);
        let decision = support::decision(&limiter, "loosened", &loose).await;
        assert!(decision.allowed, "{algorithm}");
        let left = pttl(&redis, &key);
        let fresh = decision.reset_after.as_millis() as i64;
        if left > fresh + (fresh + 1_000) / 2 + 2 {
            outlived.push(format!(
                "{algorithm}: fresh in {fresh} ms, expires in {left} ms (in {before} ms under \
                 the tight quota)"
            ));
        }
    }
    assert!(outlived.is_empty(), "{outlived:#?}");
}

/// The period's part of that bound: a fixed window's state is fresh at the window's end, and a
/// key admitted early in a window remembers an expiry half of what was left past it. Admitted
/// again near the end, it is fresh again soon, and outlives that by no more than half of it
/// and half of the window.
#[tokio::test]
async fn a_fixed_window_admitted_near_its_end_outlives_it_by_half_the_window_at_most() {
    let redis = RedisServer::start();
    let limiter: Limiter = Ctx::new(Algorithm::FixedWindow).redis(&redis);
    let key = limiter.storage_key("window");
    let quota = Quota::per_second(1_000).unwrap();
    let mut first = support::decision(&limiter, "window", &quota).await;
    if first.reset_after < Duration::from_millis(600) {
        // Early in the next window.
        tokio::time::sleep(first.reset_after + Duration::from_millis(20)).await;
        first = support::decision(&limiter, "window", &quota).await;
    }
    tokio::time::sleep(first.reset_after - Duration::from_millis(150)).await;
    let last = support::decision(&limiter, "window", &quota).await;
    let left = pttl(&redis, &key);
    let fresh = last.reset_after.as_millis() as i64;
    assert!(
        left >= fresh - 2 && left <= fresh + (fresh + 1_000) / 2 + 2,
        "the window is fresh in {fresh} ms, the key expires in {left} ms (the first admission \
         was {} ms before its end)",
        first.reset_after.as_millis()
    );
}

/// A mixed fleet on one key: Redis's clock, client clocks ahead of and behind it by up to
/// `Clock::MAX_SKEW` (one of them stepping back), a caller with two quotas, concurrent
/// decisions (batched), and every operator's write (overrides of one and two tiers,
/// suspensions, resets, refunds). After each decision on Redis's clock, the key lives at least
/// until its state is fresh again.
#[tokio::test]
async fn a_mixed_fleet_never_lets_a_key_expire_before_its_state_is_fresh() {
    use redlimit::clock::{Clock, ManualClock};
    use redlimit::Quotas;
    use std::time::{SystemTime, UNIX_EPOCH};

    let redis = RedisServer::start();
    let quota = support::quota_with_burst(60, Duration::from_secs(1), 20);
    let quotas: Quotas = quota.into();
    let two: Quotas =
        Quotas::new([quota, Quota::new(40, Duration::from_secs(2)).unwrap()]).unwrap();
    let tight: Quotas = support::quota_with_burst(5, Duration::from_secs(1), 3).into();
    let wall = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let skew = Duration::from_millis(4_000);
    for algorithm in packed() {
        let server = Ctx::new(algorithm).redis(&redis);
        let ahead_clock = ManualClock::new(wall() + skew);
        let behind_clock = ManualClock::new(wall() - skew);
        let ahead = Ctx::new(algorithm)
            .clock(Clock::Manual(ahead_clock.clone()))
            .redis(&redis);
        let behind = Ctx::new(algorithm)
            .clock(Clock::Manual(behind_clock.clone()))
            .redis(&redis);
        let key = server.storage_key("k");
        let mut random = Lcg(algorithm as u64 + 11);
        let mut checked = 0;
        for step in 0..300 {
            ahead_clock.set(wall() + skew);
            if random.below(10) == 0 {
                // Stepping back by up to a second.
                behind_clock.set(wall() - skew - Duration::from_millis(random.below(1_000)));
            } else {
                behind_clock.set(wall() - skew);
            }
            let roll = random.below(100);
            match roll {
                0..=2 => {
                    server.set_quota("k", &tight).await.expect("override");
                }
                3..=4 => {
                    server.set_quota("k", &two).await.expect("override");
                }
                5..=8 => {
                    server.clear_quota("k").await.expect("clear");
                }
                9 => {
                    server
                        .suspend("k", Duration::from_millis(5))
                        .await
                        .expect("suspend");
                }
                10..=11 => {
                    server.resume("k").await.expect("resume");
                }
                12 => {
                    server.reset("k").await.expect("reset");
                }
                13..=16 => {
                    let units = 1 + random.below(2);
                    server.refund("k", &quotas, units).await.expect("refund");
                }
                17..=22 => {
                    let limiter = if roll.is_multiple_of(2) {
                        &ahead
                    } else {
                        &behind
                    };
                    limiter
                        .try_check_quotas("k", &quotas, random.below(3))
                        .await
                        .expect("the store decides");
                }
                23..=26 => {
                    server
                        .try_check_quotas("k", &two, 1)
                        .await
                        .expect("the store decides");
                }
                27..=32 => {
                    // Concurrent decisions: they queue, and go as one batch.
                    let calls = (0..8).map(|_| server.try_check_quotas("k", &quotas, 1));
                    for decision in futures::future::join_all(calls).await {
                        decision.expect("the store decides");
                    }
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(random.below(10))).await;
            let sent = Instant::now();
            // An admission that costs writes (a peek leaves the TTL a client clock set, counted
            // on that clock).
            let decision = server
                .try_check_quotas("k", &quotas, 1 + random.below(3))
                .await
                .expect("the store decides");
            let left = pttl(&redis, &key);
            let fresh_in = decision.reset_after.saturating_sub(sent.elapsed());
            if fresh_in > Duration::from_millis(2) && decision.allowed {
                checked += 1;
                assert!(
                    left >= 0 && Duration::from_millis(left as u64 + 2) >= fresh_in,
                    "{algorithm}, step {step} (roll {roll}): the key expires in {left} ms, its \
                     state is fresh in {fresh_in:?}: {decision:?}"
                );
            }
        }
        assert!(checked > 20, "{algorithm}: {checked} decisions checked");
    }
}

/// Redis 5.0 (the oldest the crate supports) has no `SET … KEEPTTL` and answers it with a
/// syntax error: the write then sets a TTL, so every admission still counts and the key still
/// lives until its state is fresh. Redis 5 stands in here as the script with the option
/// misspelt, which Redis refuses the same way.
#[test]
fn without_keepttl_the_write_sets_a_ttl() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let current = redlimit::test_hooks::script_source();
    assert_eq!(current.matches("'KEEPTTL'").count(), 1);
    let redis5 = current.replace("'KEEPTTL'", "'KEEPTTL5'");
    for algorithm in packed() {
        // 10 an hour, a burst of 10: each admission makes the key live 6 minutes longer.
        let args = server_clock_args(algorithm, 10.0, 3_600e6, 10.0);
        let key = format!("redlimit:{{redis5-{algorithm}}}");
        let mut admitted = 0;
        for _ in 0..15 {
            let reply: redis::Value = support::eval_on_key(&mut conn, &redis5, &key, &args);
            if admits(&reply) {
                admitted += 1;
                let left = pttl(&redis, &key);
                assert!(left > 0, "{algorithm}: the key lives ({left} ms)");
            }
        }
        assert_eq!(
            admitted, 10,
            "{algorithm}: 10 of 15 admitted under 10 an hour"
        );
    }
}

/// Whether `key` holds the busy form: the remembered expiry's head (`'M'`, a negative double,
/// a 0 byte) before one state.
fn remembers(redis: &RedisServer, key: &str) -> bool {
    let bytes = stored(redis, key);
    let until = f64::from_le_bytes(bytes[1..9].try_into().unwrap());
    (bytes.len() == 27 || bytes.len() == 35) && bytes[0] == b'M' && until < 0.0 && bytes[9] == 0
}

/// Every operator on a busy key (its string the remembered expiry's head and its state): the
/// next decisions count on from the state (one unit less each), a suspension denies, inspect
/// shows no suspension and one tier, and after each admission the key lives at least until its
/// state is fresh.
#[tokio::test]
async fn operators_on_a_busy_key_keep_its_count_and_its_life() {
    use redlimit::limiter::BlockFor;
    use redlimit::{Quotas, Target};

    let redis = RedisServer::start();
    // 100 an hour: nothing comes back within the test.
    let quota = Quota::per_hour(100).unwrap();
    let quotas: Quotas = quota.into();
    let block = BlockFor::new(Duration::from_secs(3_600)).unwrap();
    let mut failures = Vec::new();
    for (algorithm, scoped) in packed().flat_map(|a| [(a, false), (a, true)]) {
        let limiter: Limiter = Ctx::new(algorithm).redis(&redis);
        let id = format!("busy-{algorithm}-{scoped}");
        let busy = id.as_str();
        // Unscoped, a suspension and a reset are the tenant's; scoped, the route's own.
        let route = if scoped {
            Target::scoped("api", busy)
        } else {
            Target::key(busy)
        };
        let key = limiter.storage_key(route);
        let mut last = None;
        let admit = async |what: &str, failures: &mut Vec<String>, last: &mut Option<u64>| {
            let sent = Instant::now();
            let decision = support::decision(&limiter, route, &quota).await;
            let left = pttl(&redis, &key) + since(sent);
            let fresh = decision.reset_after.as_millis() as i64;
            if !decision.allowed {
                failures.push(format!(
                    "{algorithm} (scoped {scoped}), after {what}: denied {decision:?}"
                ));
                return;
            }
            if left + 2 < fresh {
                failures.push(format!(
                    "{algorithm} (scoped {scoped}), after {what}: expires in {left} ms, fresh in {fresh} ms"
                ));
            }
            if let Some(before) = *last {
                if decision.remaining + 1 != before {
                    failures.push(format!(
                        "{algorithm} (scoped {scoped}), after {what}: remaining {} after {before}",
                        decision.remaining
                    ));
                }
            }
            *last = Some(decision.remaining);
        };
        // Suspends `target` for a minute: the route's next decision must say so.
        let suspended = async |target: Target<'_>, what: &str, failures: &mut Vec<String>| {
            limiter
                .suspend(target, Duration::from_secs(60))
                .await
                .unwrap();
            let denied = support::decision(&limiter, route, &quota).await;
            if !denied.suspended {
                failures.push(format!(
                    "{algorithm} (scoped {scoped}): {what}, decided {denied:?}"
                ));
            }
        };
        for _ in 0..3 {
            admit("admissions", &mut failures, &mut last).await;
        }
        assert!(
            remembers(&redis, &key),
            "{algorithm} (scoped {scoped}): {:?}",
            stored(&redis, &key)
        );
        let status = limiter.inspect(route).await.unwrap();
        if status.suspended_for.is_some()
            || status.tiers.len() != 1
            || status.tiers[0].algorithm != Some(algorithm)
            || status.quota_override.is_some()
        {
            failures.push(format!("{algorithm} (scoped {scoped}): inspect {status:?}"));
        }

        // Suspend, then resume.
        suspended(route, "suspended", &mut failures).await;
        limiter.resume(route).await.unwrap();
        admit("resume", &mut failures, &mut last).await;
        admit("resume, again", &mut failures, &mut last).await;
        // Extend a suspension the busy key does not have.
        limiter
            .extend_suspension(route, Duration::from_secs(60))
            .await
            .unwrap();
        let status = limiter.inspect(route).await.unwrap();
        if status
            .suspended_for
            .is_none_or(|d| d < Duration::from_secs(59))
        {
            failures.push(format!(
                "{algorithm} (scoped {scoped}): extended, inspect {status:?}"
            ));
        }
        limiter.resume(route).await.unwrap();
        admit("extend, resume", &mut failures, &mut last).await;
        admit("extend, resume, again", &mut failures, &mut last).await;
        // An override of the same quota, then cleared: on the route, then on the tenant.
        limiter.set_quota(route, &quotas).await.unwrap();
        admit("set_quota", &mut failures, &mut last).await;
        limiter.clear_quota(route).await.unwrap();
        admit("clear_quota", &mut failures, &mut last).await;
        admit("clear_quota, again", &mut failures, &mut last).await;
        limiter
            .set_quota(Target::all_routes(busy), &quotas)
            .await
            .unwrap();
        admit("tenant set_quota", &mut failures, &mut last).await;
        limiter.clear_quota(Target::all_routes(busy)).await.unwrap();
        admit("tenant clear_quota", &mut failures, &mut last).await;
        admit("tenant clear_quota, again", &mut failures, &mut last).await;
        // The tenant suspended, then resumed.
        suspended(Target::all_routes(busy), "tenant suspended", &mut failures).await;
        limiter.resume(Target::all_routes(busy)).await.unwrap();
        admit("tenant resume", &mut failures, &mut last).await;
        admit("tenant resume, again", &mut failures, &mut last).await;
        // A refund gives one back.
        limiter.refund(route, &quotas, 1).await.unwrap();
        last = last.map(|r| r + 1);
        admit("refund", &mut failures, &mut last).await;
        admit("refund, again", &mut failures, &mut last).await;
        // Block mode admits and counts as a decision does.
        let verdict = limiter.check_blocking(route, &quotas, 1, &block).await;
        let decision = *verdict.decision().unwrap();
        if !decision.allowed || last.is_some_and(|r| decision.remaining + 1 != r) {
            failures.push(format!(
                "{algorithm} (scoped {scoped}): blocking check {decision:?} after {last:?}"
            ));
        }
        last = Some(decision.remaining);
        admit("block mode", &mut failures, &mut last).await;
        admit("block mode, again", &mut failures, &mut last).await;
        let status = limiter.inspect(route).await.unwrap();
        if status.suspended_for.is_some() || status.tiers.len() != 1 {
            failures.push(format!(
                "{algorithm} (scoped {scoped}): inspect at the end {status:?}"
            ));
        }
        // The route's reset, then the tenant's: fresh.
        limiter.reset(route).await.unwrap();
        last = Some(100);
        admit("reset", &mut failures, &mut last).await;
        admit("reset, again", &mut failures, &mut last).await;
        admit("reset, again", &mut failures, &mut last).await;
        limiter.reset(Target::all_routes(busy)).await.unwrap();
        last = Some(100);
        admit("tenant reset", &mut failures, &mut last).await;
        admit("tenant reset, again", &mut failures, &mut last).await;
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A key that changes tier keeps its count (docs/headers.md, "Tiers per request"): after
/// admissions under two quotas, a request under the first alone counts on from the first
/// tier's state, on Redis and in memory alike (a string of several states without controls is
/// no one tier's: it is read tier by tier).
#[tokio::test]
async fn a_key_that_drops_a_tier_keeps_the_first_tiers_count() {
    use redlimit::Quotas;

    let redis = RedisServer::start();
    let first = Quota::per_hour(100).unwrap();
    let second = Quota::new(1_000, Duration::from_secs(86_400)).unwrap();
    let both = Quotas::new([first, second]).unwrap();
    let mut failures = Vec::new();
    for algorithm in packed() {
        let ctx = Ctx::new(algorithm);
        for (store, limiter) in [("redis", ctx.redis(&redis)), ("memory", ctx.memory())] {
            let target = format!("dropped-{algorithm}");
            let key = target.as_str();
            for _ in 0..10 {
                limiter.try_check_quotas(key, &both, 1).await.unwrap();
            }
            let decision = support::decision(&limiter, key, &first).await;
            if !decision.allowed || decision.remaining != 89 {
                failures.push(format!(
                    "{algorithm} ({store}): after 10 under two quotas, one more under the \
                     first: {decision:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Heads of a busy key's string that no script writes: a suspension's end of -0.0, a negative
/// NaN, 0, a past time (no suspension: the state after it counts on), +infinity (a suspension
/// without end, as for any controls), an override count with no override after it (cut short:
/// the string reads as absent), another algorithm's state after the head (a fresh key; a
/// control is refused). Decisions, inspect and the route's controls agree on each, no control
/// writes a negative end back, and a control on a suspension without end still writes (its TTL
/// capped at 2^53 ms).
#[tokio::test]
async fn heads_no_script_writes_read_alike_everywhere() {
    use redlimit::limiter::ControlError;
    use redlimit::{Quotas, Target};

    let redis = RedisServer::start();
    let quota = Quota::per_hour(100).unwrap();
    let quotas: Quotas = quota.into();
    let mut failures = Vec::new();
    for algorithm in packed() {
        let limiter: Limiter = Ctx::new(algorithm).redis(&redis);
        let other = packed()
            .find(|&a| a != algorithm && a != Algorithm::SlidingWindow)
            .unwrap();
        for (name, ends) in [
            ("-0.0", Some(-0.0)),
            ("-NaN", Some(f64::from_bits(0xfff8_0000_0000_0000))),
            ("0", Some(0.0)),
            ("past", Some(1.0)),
            ("+inf", Some(f64::INFINITY)),
            ("n 1", None),
            ("other algorithm", None),
        ] {
            if name == "n 1" && algorithm == Algorithm::SlidingWindow {
                // 35 bytes hold controls with one override tier: the state's bytes read as an
                // override's quota, which the script refuses as it refuses any corrupt one.
                continue;
            }
            let id = format!("head-{algorithm}-{name}");
            let route = Target::scoped("api", &id);
            let key = limiter.storage_key(route);
            for _ in 0..2 {
                support::decision(&limiter, route, &quota).await;
            }
            let mut bytes = stored(&redis, &key);
            assert!(remembers(&redis, &key), "{algorithm}: {bytes:?}");
            let counted = support::decision(&limiter, route, &quota).await.remaining;
            bytes = stored(&redis, &key);
            match (name, ends) {
                (_, Some(until)) => bytes[1..9].copy_from_slice(&until.to_le_bytes()),
                ("n 1", _) => bytes[9] = 1,
                _ => {
                    let foreign = Ctx::new(other).redis(&redis);
                    let id = format!("foreign-{algorithm}");
                    support::decision(&foreign, id.as_str(), &quota).await;
                    let state = stored(&redis, &foreign.storage_key(id.as_str()));
                    bytes.truncate(10);
                    bytes.extend_from_slice(&state);
                }
            }
            put_for_an_hour(&redis, &key, &bytes);
            let what = format!("{algorithm}, head {name}");
            let status = limiter.inspect(route).await.unwrap();
            let sent = Instant::now();
            let decision = support::decision(&limiter, route, &quota).await;
            let suspended = name == "+inf";
            let fresh = matches!(name, "n 1" | "other algorithm");
            if decision.suspended != suspended || status.suspended_for.is_some() != suspended {
                failures.push(format!("{what}: {decision:?}; {status:?}"));
            }
            if !suspended {
                let expected = if fresh { 99 } else { counted - 1 };
                // Inspect shows what is stored: nothing for a string cut short, else the state.
                let shown = match name {
                    "n 1" => vec![],
                    "other algorithm" => vec![Some(other)],
                    _ => vec![Some(algorithm)],
                };
                let tiers: Vec<_> = status.tiers.iter().map(|t| t.algorithm).collect();
                if !decision.allowed || decision.remaining != expected || tiers != shown {
                    failures.push(format!(
                        "{what}: remaining {} (expected {expected}); {status:?}",
                        decision.remaining
                    ));
                }
                let left = pttl(&redis, &key) + since(sent);
                if left + 2 < decision.reset_after.as_millis() as i64 {
                    failures.push(format!("{what}: expires in {left} ms, {decision:?}"));
                }
            }
            // The route's controls on the head as it was: none writes a negative end back.
            put_for_an_hour(&redis, &key, &bytes);
            let set = limiter.set_quota(route, &quotas).await;
            if name == "other algorithm" {
                if !matches!(set, Err(ControlError::WrongKind(_))) {
                    failures.push(format!("{what}: set_quota {set:?}"));
                }
                continue;
            }
            let status = set.unwrap();
            let written = redis::cmd("GET")
                .arg(&key)
                .query::<Option<Vec<u8>>>(&mut redis.conn())
                .unwrap();
            let until = written
                .as_deref()
                .and_then(|w| w.get(1..9))
                .map(|b| f64::from_le_bytes(b.try_into().unwrap()));
            let end_ok = if suspended {
                until == Some(f64::INFINITY)
            } else {
                until == Some(0.0)
            };
            if !end_ok || status.suspended_for.is_some() != suspended {
                failures.push(format!("{what}: set_quota wrote {written:?}; {status:?}"));
            }
            limiter.clear_quota(route).await.unwrap();
            limiter
                .extend_suspension(route, Duration::from_secs(60))
                .await
                .unwrap();
            let denied = support::decision(&limiter, route, &quota).await;
            limiter.resume(route).await.unwrap();
            let decision = support::decision(&limiter, route, &quota).await;
            if !denied.suspended || decision.suspended || !decision.allowed {
                failures.push(format!("{what}: extended {denied:?}, resumed {decision:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The split form of a Cluster slot migration (`TRYAGAIN`: the caller reads the tenant's string
/// and sends it in ARGV) on a busy key, between decisions in the usual form: each counts on from
/// the state after the remembered expiry, and the key lives at least until its state is fresh.
#[test]
fn the_split_form_counts_on_a_busy_key() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let script = redlimit::test_hooks::script_source();
    for algorithm in packed() {
        // 100 an hour: nothing comes back within the test.
        let args = server_clock_args(algorithm, 100.0, 3_600e6, 100.0);
        let key = format!("redlimit:{{split-{algorithm}}}");
        let tenant = format!("redlimit:{{split-{algorithm}}}#t");
        let mut remaining = Vec::new();
        for i in 0..8 {
            let mut call = redis::cmd("EVAL");
            call.arg(script);
            // Every third in the split form: the tenant's string (absent: '') in ARGV.
            if i % 3 == 2 {
                call.arg(1).arg(&key).arg(&args).arg("");
            } else {
                call.arg(1 + 1).arg(&key).arg(&tenant).arg(&args);
            }
            let sent = Instant::now();
            let reply: redis::Value = call.query(&mut conn).expect("a decision");
            assert!(admits(&reply), "{algorithm}, call {i}: {reply:?}");
            // One quota's admission replies reset_after_ms * (burst + 1) + remaining, else
            // the packed '<BBddd'.
            let (reset_ms, left) = match reply {
                redis::Value::Int(both) => (both / 101, both % 101),
                redis::Value::BulkString(bytes) => {
                    let at = |i: usize| f64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
                    (at(18) as i64, at(2) as i64)
                }
                other => panic!("{algorithm}, call {i}: {other:?}"),
            };
            remaining.push(left);
            let ttl = pttl(&redis, &key) + since(sent);
            assert!(
                ttl + 2 >= reset_ms,
                "{algorithm}, call {i}: expires in {ttl} ms, fresh in {reset_ms} ms"
            );
        }
        assert_eq!(
            remaining,
            (92..100).rev().collect::<Vec<_>>(),
            "{algorithm}"
        );
    }
}
