//! Probes (outside review) of the remembered expiry (`lua/common.lua`'s write: a one-tier key
//! on Redis's clock keeps its TTL with `SET … KEEPTTL` while the expiry it remembers after its
//! state is late enough): a key never expires before its state is fresh again, and an idle
//! key outlives its freshness by at most half of it (and half of its period). Against a previous release's script on the
//! same keys (a rolling deploy), remembered times that are no time, and quota changes.

use crate::support;

use std::time::Duration;

use redlimit::{Algorithm, Limiter, Quota};
use support::{Ctx, RedisServer};

/// The algorithms that keep one packed state in the key's string (the sliding log keeps a
/// sorted set).
fn packed() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL
        .iter()
        .copied()
        .filter(|&a| a != Algorithm::SlidingLog)
}

fn pttl(redis: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut redis.conn())
        .expect("PTTL")
}

fn stored(redis: &RedisServer, key: &str) -> Vec<u8> {
    let bytes: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query(&mut redis.conn())
        .expect("GET");
    bytes.expect("the key")
}

/// The decision script's one argument on Redis's clock (now_us -1): cost 1, the algorithm's
/// byte, one tier.
fn server_clock_args(algorithm: Algorithm, limit: f64, period_us: f64, burst: f64) -> Vec<u8> {
    let mut args = [-1f64, 1.0].map(f64::to_le_bytes).concat();
    args.push(redlimit::algorithm::script_tag(algorithm));
    args.extend([limit, period_us, burst].map(f64::to_le_bytes).concat());
    args
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
/// reached every instance still runs it: its steps read a state only from a string of exactly
/// the state's length, its one-tier path takes only such strings, and it always sets the TTL.
fn previous_release_script() -> String {
    fn replace(source: &mut String, from: &str, to: &str, times: usize) {
        assert_eq!(source.matches(from).count(), times, "{from:?}");
        *source = source.replace(from, to);
    }
    let mut source = redlimit::mirror::script_source().to_owned();
    // The steps (each twice: the one-tier path and the loop over tiers).
    replace(
        &mut source,
        "if stored and #stored >= 17 then",
        "if stored and #stored == 17 then",
        6,
    );
    replace(
        &mut source,
        "if stored and #stored >= 25 then",
        "if stored and #stored == 25 then",
        2,
    );
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
#[ignore = "defect, not fixed here: the previous release reads a state followed by the \
            remembered expiry as a fresh key (over-admission while a deploy is rolling); a fix \
            needs a layout the previous release parses (see the report)"]
fn a_previous_release_reads_what_this_release_admitted() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let previous = previous_release_script();
    let current = redlimit::mirror::script_source();
    for algorithm in packed() {
        // 5 a minute, a burst of 5: 5 of 20 requests within the minute, whichever release
        // decides each.
        let args = server_clock_args(algorithm, 5.0, 60e6, 5.0);
        let mut run = |name: &str, pick: &dyn Fn(usize) -> bool| {
            let key = format!("redlimit:{{{name}-{algorithm}}}");
            (0..20)
                .filter(|&i| {
                    let source: &str = if pick(i) { current } else { &previous };
                    let reply: redis::Value = redis::cmd("EVAL")
                        .arg(source)
                        .arg(1)
                        .arg(&key)
                        .arg(&args)
                        .query(&mut conn)
                        .expect("a decision");
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
/// NaN, negative), after a valid state, in a key without a TTL (restored by hand, or written
/// by something else): the next admission sets a TTL as it would on a fresh key, rather than
/// keeping none for ever.
#[tokio::test]
async fn a_remembered_expiry_that_is_no_time_gives_the_key_a_ttl() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(1_000).unwrap();
    let corrupt = [
        f64::INFINITY,
        1e300,
        2f64.powi(60),
        f64::NAN,
        -1.0,
        f64::NEG_INFINITY,
    ];
    for algorithm in packed() {
        let limiter = Ctx::new(algorithm).redis(&redis);
        for (i, expiry) in corrupt.into_iter().enumerate() {
            let target = format!("corrupt-{i}");
            let key = limiter.storage_key(target.as_str());
            // The second admission finds the key alive: it remembers the expiry.
            support::decision(&limiter, target.as_str(), &quota).await;
            support::decision(&limiter, target.as_str(), &quota).await;
            let mut bytes = stored(&redis, &key);
            let at = bytes.len() - 9;
            assert_eq!(bytes[at], b'X', "{algorithm}: {bytes:?}");
            bytes[at + 1..].copy_from_slice(&expiry.to_le_bytes());
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(&bytes)
                .query(&mut redis.conn())
                .expect("SET");
            let decision = support::decision(&limiter, target.as_str(), &quota).await;
            assert!(decision.allowed, "{algorithm}");
            let left = pttl(&redis, &key);
            let fresh = decision.reset_after.as_millis() as i64;
            assert!(
                left >= fresh - 2 && left <= fresh + fresh / 2 + 2,
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
