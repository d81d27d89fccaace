//! Every algorithm on a real Redis and on the memory store.
//!
//! - The written-out sequences of the unit tests beside each Rust mirror in `src/algorithm/`
//!   (`src/algorithm/sequences.rs`), and a few of Redis's own, run on a `RedisStore` and on a
//!   `MemoryStore`, both on a manual clock; each step must give exactly the written decision on
//!   both.
//! - A key of the wrong type, or garbage in its fields, heals: it decides like a fresh key.
//! - `memory_per_key` measures the Redis memory one key takes (`MEMORY USAGE`) per algorithm.
//!
//! Every test starts its own `redis-server`.

use crate::sequences::{self, Expect, Step, S};
use crate::support;

use std::time::Duration;

use redis::Commands;
use redlimit::{clock::ManualClock, Algorithm, Decision, Limiter, Quota};
use support::{Ctx, RedisServer};

/// 2023-11-14T22:14:00Z: a whole minute, so minute windows start at T0.
const T0: Duration = Duration::from_secs(1_700_000_040);

fn summary(decision: &Decision) -> Expect {
    let retry = if decision.never_allowed() {
        -1
    } else {
        decision.retry_after.as_millis() as i64
    };
    (
        decision.allowed,
        decision.remaining,
        retry,
        decision.reset_after.as_millis() as i64,
    )
}

fn per(limit: u64, period_secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(period_secs)).unwrap()
}

async fn check(limiter: &Limiter, key: &str, quota: &Quota, cost: u64) -> Decision {
    limiter
        .try_check_quotas(key, &quota.into(), cost)
        .await
        .unwrap_or_else(|e| panic!("store failed: {e}"))
}

/// The decisions of `steps`, in order: `(at, quota, cost, expect)` (what the mirror wrote is
/// its unit tests' to check).
fn decisions(steps: &[Step]) -> Vec<(u64, Quota, u64, Expect)> {
    let mut quota = None;
    let mut decisions = Vec::new();
    for step in steps {
        match *step {
            Step::Quota(limit, period_us, burst) => {
                let period = Duration::from_micros(period_us);
                quota = Some(support::quota_with_burst(limit, period, burst));
            }
            Step::At(at, cost, expect) => {
                decisions.push((at, quota.expect("a quota first"), cost, expect));
            }
            Step::Wrote(_) | Step::Ttl(_) => {}
        }
    }
    decisions
}

/// Runs `steps` on the fresh key `key`, on Redis and in memory, asserting every decision.
async fn run(redis: &RedisServer, algorithm: Algorithm, key: &str, steps: &[Step]) {
    let clock = ManualClock::new(T0);
    let on_redis = Ctx::new(algorithm).manual(&clock).redis(redis);
    let in_memory = Ctx::new(algorithm).manual(&clock).memory();
    for (i, (at, quota, cost, expect)) in decisions(steps).iter().enumerate() {
        clock.set(T0 + Duration::from_micros(*at));
        for (store, limiter) in [("redis", &on_redis), ("memory", &in_memory)] {
            let got = summary(&check(limiter, key, quota, *cost).await);
            assert_eq!(
                got, *expect,
                "{algorithm} {key} step {i} (at {at} µs, cost {cost}) on {store}: \
                 (allowed, remaining, retry_after_ms, reset_after_ms)"
            );
        }
    }
}

/// A written-out sequence and the key it runs on.
type Named = (&'static str, &'static [Step]);

/// The written-out sequences each window algorithm runs on Redis and in memory (see [`run`]),
/// under a key named after it. Windows are [T0, T0 + 60 s), [T0 + 60 s, T0 + 120 s)...; the
/// sliding window's include Cloudflare's worked example: 50 a minute, 42 in the previous
/// window, 18 in this one, 15 s in: 42 * 0.75 + 18 = 49.5 < 50, admitted.
const NAMED: &[(Algorithm, &[Named])] = &[
    (
        Algorithm::FixedWindow,
        &[
            ("windows", sequences::FIXED_WINDOWS),
            ("burst-below-limit", sequences::FIXED_BURST_BELOW_LIMIT),
            ("tightened", sequences::FIXED_TIGHTENED),
            ("clock-stepped-back", sequences::FIXED_CLOCK_STEPPED_BACK),
        ],
    ),
    (
        Algorithm::SlidingLog,
        &[
            ("exact-window", sequences::LOG_EXACT_WINDOW),
            ("tightened", sequences::LOG_TIGHTENED),
            ("clock-stepped-back", sequences::LOG_CLOCK_STEPPED_BACK),
        ],
    ),
    (
        Algorithm::SlidingWindow,
        &[
            ("weighted-previous-window", sequences::WINDOW_WEIGHTED),
            ("retry-to-the-microsecond", sequences::WINDOW_RETRY),
            ("tightened", sequences::WINDOW_TIGHTENED),
            ("clock-stepped-back", sequences::WINDOW_CLOCK_STEPPED_BACK),
            ("cloudflare", sequences::WINDOW_CLOUDFLARE),
        ],
    ),
];

/// Runs `algorithm`'s sequences of [`NAMED`], each on its key (see [`run`]).
async fn run_named(redis: &RedisServer, algorithm: Algorithm) {
    for (_, named) in NAMED
        .iter()
        .filter(|(named_for, _)| *named_for == algorithm)
    {
        for (key, steps) in *named {
            run(redis, algorithm, key, steps).await;
        }
    }
}

/// The token bucket and GCRA make the same admissions: one table, run on both.
#[tokio::test]
async fn token_bucket_and_gcra_sequences() {
    let redis = RedisServer::start();
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let key = format!("{algorithm}-burst-refill-cost-peek");
        run(&redis, algorithm, &key, sequences::REFILL_BURST).await;
        let key = format!("{algorithm}-tightened");
        run(&redis, algorithm, &key, sequences::REFILL_TIGHTENED).await;
    }
}

#[tokio::test]
async fn token_bucket_sequences() {
    let redis = RedisServer::start();
    let steps = sequences::REFILL_CLOCK_STEPPED_BACK;
    run(&redis, Algorithm::TokenBucket, "clock-stepped-back", steps).await;
}

#[tokio::test]
async fn gcra_sequences() {
    let redis = RedisServer::start();
    let algorithm = Algorithm::Gcra;
    // A fractional debt goes through Redis and back exactly: 10 per 64 s drains 0.15625 a second.
    let steps = sequences::GCRA_FRACTIONAL_DEBT;
    run(&redis, algorithm, "fractional-debt", steps).await;
    // 11 a minute: T = 5.45 s is inexact, yet the 11th request of a burst passes.
    let resets = [
        5_455, 10_910, 16_364, 21_819, 27_273, 32_728, 38_182, 43_637, 49_091, 54_546, 60_000,
    ];
    let mut steps = vec![Step::Quota(11, 60 * S, 11)];
    steps.extend((0..11).map(|i| Step::At(0, 1, (true, 10 - i as u64, 0, resets[i]))));
    steps.push(Step::At(0, 1, (false, 0, 5_455, 60_000)));
    run(&redis, algorithm, "inexact-emission-interval", &steps).await;
    // 10^9 a second (T = 0.001 µs) with a burst of 10^12, near 1.7e15 µs.
    #[rustfmt::skip]
    run(&redis, algorithm, "a-billion-a-second", &[
        Step::Quota(1_000_000_000, S, 1_000_000_000_000),
        Step::At(0, 999_999_999_999, (true, 1, 0, 1_000_000)),
        Step::At(0, 1, (true, 0, 0, 1_000_000)),
        Step::At(0, 1, (false, 0, 1, 1_000_000)),
        Step::At(1, 1, (true, 999, 0, 1_000_000)),
    ]).await;
    // 10^13 at once, one a second: paid off in 10^16 ms (said exactly); PEXPIRE stops at 2^53 ms.
    #[rustfmt::skip]
    run(&redis, algorithm, "burst-far-above-a-tiny-rate", &[
        Step::Quota(1, S, 10_000_000_000_000),
        Step::At(0, 10_000_000_000_000, (true, 0, 0, 10_000_000_000_000_000)),
        Step::At(0, 1, (false, 0, 1_000, 10_000_000_000_000_000)),
    ]).await;
    let steps = sequences::REFILL_CLOCK_STEPPED_BACK;
    run(&redis, algorithm, "clock-stepped-back", steps).await;
}

#[tokio::test]
async fn fixed_window_sequences() {
    let redis = RedisServer::start();
    let algorithm = Algorithm::FixedWindow;
    run_named(&redis, algorithm).await;
    // The capacity is the burst, and the reply shows the limit.

    let clock = ManualClock::new(T0);
    let limiter = Ctx::new(algorithm).manual(&clock).redis(&redis);
    let q10b3 = per(10, 60).with_burst(3).unwrap();
    assert_eq!(check(&limiter, "limit", &q10b3, 1).await.limit, 10);
}

#[tokio::test]
async fn sliding_log_sequences() {
    let redis = RedisServer::start();
    let algorithm = Algorithm::SlidingLog;
    run_named(&redis, algorithm).await;

    // Member names "<now>:<n>" start after the units in the window. A period shortened at the
    // same µs drops older units, so the next name is taken ("5 s:3"): ZADD NX tries one more.
    #[rustfmt::skip]
    run(&redis, algorithm, "member-name-taken", &[
        Step::Quota(3, 10 * S, 3),
        Step::At(0, 2, (true, 1, 0, 10_000)),
        Step::At(5 * S, 1, (true, 0, 0, 10_000)),
        Step::Quota(3, 2 * S, 3),
        Step::At(5 * S, 2, (true, 0, 0, 2_000)),
        Step::At(5 * S, 1, (false, 0, 2_000, 2_000)),
    ]).await;
    // A cost of 2500 adds 2500 members, in batches.
    #[rustfmt::skip]
    run(&redis, algorithm, "large-cost", &[
        Step::Quota(2500, 10 * S, 2500),
        Step::At(0, 2500, (true, 0, 0, 10_000)),
        Step::At(0, 1, (false, 0, 10_000, 10_000)),
    ]).await;
    let log = |key: &str| {
        Ctx::new(algorithm)
            .manual(&ManualClock::new(T0))
            .memory()
            .storage_key(key)
    };
    let mut conn = redis.conn();
    assert_eq!(conn.zcard::<_, u64>(log("member-name-taken")).unwrap(), 3);
    assert_eq!(conn.zcard::<_, u64>(log("large-cost")).unwrap(), 2500);

    // One member per admitted unit, and only units still in the window are kept.
    let log_key = Ctx::new(algorithm)
        .manual(&ManualClock::new(T0))
        .memory()
        .storage_key("exact-window");
    let members: Vec<String> = redis.conn().zrange(&log_key, 0, -1).unwrap();
    assert_eq!(members.len(), 3, "{members:?}");
}

#[tokio::test]
async fn sliding_window_sequences() {
    let redis = RedisServer::start();
    let algorithm = Algorithm::SlidingWindow;
    run_named(&redis, algorithm).await;
    // A client at exactly the rate, on the windows' first µs: never denied.
    let q10 = per(10, 60);
    let clock = ManualClock::new(T0);
    for (store, limiter) in [
        ("redis", Ctx::new(algorithm).manual(&clock).redis(&redis)),
        ("memory", Ctx::new(algorithm).manual(&clock).memory()),
    ] {
        for at in (0..30).map(|i| i * 6 * S) {
            clock.set(T0 + Duration::from_micros(at));
            let d = check(&limiter, "steady", &q10, 1).await;
            assert!(
                d.allowed,
                "{store}: a client at the rate denied at {at} µs: {d:?}"
            );
        }
    }
}

/// The Redis key holding `algorithm`'s state for `key`: the storage key itself (a string, or
/// the sliding log's sorted set).
fn state_key(limiter: &Limiter, _algorithm: Algorithm, key: &str) -> String {
    limiter.storage_key(key)
}

/// Two cost-1 checks on the corrupt key in Redis decide like two on a fresh key in memory.
async fn decides_like_a_fresh_key(redis: &RedisServer, algorithm: Algorithm, key: &str) {
    let clock = ManualClock::new(T0 + Duration::from_millis(12_345));
    let on_redis = Ctx::new(algorithm).manual(&clock).redis(redis);
    let in_memory = Ctx::new(algorithm).manual(&clock).memory();
    let quota = per(10, 60);
    for _ in 0..2 {
        let healed = check(&on_redis, key, &quota, 1).await;
        let fresh = check(&in_memory, key, &quota, 1).await;
        assert_eq!(healed, fresh, "{algorithm} {key}");
        assert!(healed.allowed);
    }
}

#[tokio::test]
async fn a_key_of_the_wrong_type_heals() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    for &algorithm in Algorithm::ALL {
        let limiter = Ctx::new(algorithm).manual(&ManualClock::new(T0)).memory();
        let state = state_key(&limiter, algorithm, "wrong-type");
        let _: () = conn.del(&state).unwrap();
        // A string for the sliding log, a hash (the layout before version 2) for the others.
        if algorithm == Algorithm::SlidingLog {
            let _: () = conn.set(&state, "not a rate limit").unwrap();
        } else {
            let _: () = conn
                .hset_multiple(&state, &[("tk", "3"), ("ts", "1")])
                .unwrap();
        }
        decides_like_a_fresh_key(&redis, algorithm, "wrong-type").await;
        let kind: String = redis::cmd("TYPE").arg(&state).query(&mut conn).unwrap();
        let expected = if algorithm == Algorithm::SlidingLog {
            "zset"
        } else {
            "string"
        };
        assert_eq!(kind, expected, "{algorithm}");
        let _: () = conn.del(&state).unwrap();
    }
}

#[tokio::test]
async fn garbage_in_the_state_heals() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let garbage = [
        "garbage",
        "",
        "-1",
        "nan",
        "inf",
        "-inf",
        "1e400",
        "9007199254740993",
    ];
    for &algorithm in Algorithm::ALL {
        if algorithm == Algorithm::SlidingLog {
            continue;
        }
        // Garbage strings, and state strings of the right length whose tag or numbers are wrong:
        // NaN, infinite, negative, 2^53.
        let mut values: Vec<Vec<u8>> = garbage.iter().map(|g| g.as_bytes().to_vec()).collect();
        let clock = ManualClock::new(T0);
        let limiter = Ctx::new(algorithm).manual(&clock).redis(&redis);
        check(&limiter, "template", &per(10, 60), 1).await;
        let template: Vec<u8> = conn
            .get(state_key(&limiter, algorithm, "template"))
            .unwrap();
        for bad in [f64::NAN, f64::INFINITY, -1.0, 9_007_199_254_740_992.0] {
            for at in (1..template.len()).step_by(8) {
                let mut v = template.clone();
                v[at..at + 8].copy_from_slice(&bad.to_le_bytes());
                values.push(v);
            }
        }
        let mut wrong_tag = template.clone();
        wrong_tag[0] = b'?';
        values.push(wrong_tag);
        for (i, value) in values.iter().enumerate() {
            let key = format!("garbage-{i}");
            let state = state_key(&limiter, algorithm, &key);
            let _: () = conn.set(&state, value).unwrap();
            decides_like_a_fresh_key(&redis, algorithm, &key).await;
            let _: () = conn.del(&state).unwrap();
        }
    }
    // The sliding log: entries scored long ago or at -inf, under any member name, are out of
    // the window and dropped on the next write.
    let algorithm = Algorithm::SlidingLog;
    let limiter = Ctx::new(algorithm).manual(&ManualClock::new(T0)).memory();
    let state = state_key(&limiter, algorithm, "garbage");
    let _: () = redis::cmd("ZADD")
        .arg(&state)
        .arg("-inf")
        .arg("junk")
        .arg(0)
        .arg("epoch")
        .arg(1_000_000)
        .arg("1:1")
        .query(&mut conn)
        .unwrap();
    decides_like_a_fresh_key(&redis, algorithm, "garbage").await;
    let left: u64 = conn.zcard(&state).unwrap();
    assert_eq!(left, 2, "only the two units just admitted remain");
}

/// `MEMORY USAGE <key> SAMPLES 0` (exact), 0 when the key does not exist.
fn memory_usage(redis: &RedisServer, key: &str) -> u64 {
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query(&mut redis.conn())
        .unwrap();
    bytes.unwrap_or(0)
}

/// The Redis memory of one limiter key (`redlimit:{tenant-000042}`, every Redis key it uses),
/// after 1 and after `limit` admitted requests, for limits of 100 and 1000 a minute. Run with
/// `--nocapture` to see the table.
#[tokio::test]
async fn memory_per_key() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let key = "tenant-000042";
    println!(
        "bytes per key (MEMORY USAGE, {}):",
        support::redis_server_version()
    );
    println!(
        "{:<16} {:>8} {:>10} {:>9} {:>11}",
        "algorithm", "1 of 100", "100 of 100", "1 of 1000", "1000 of 1000"
    );
    for &algorithm in Algorithm::ALL {
        let limiter = Ctx::new(algorithm).manual(&clock).redis(&redis);
        let mut row = Vec::new();
        for limit in [100, 1000] {
            let quota = Quota::per_minute(limit).unwrap();
            let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
            for admitted in 1..=limit {
                assert!(check(&limiter, key, &quota, 1).await.allowed);
                if admitted == 1 || admitted == limit {
                    let bytes = memory_usage(&redis, &limiter.storage_key(key));
                    row.push(bytes);
                }
            }
        }
        println!(
            "{:<16} {:>8} {:>10} {:>9} {:>11}",
            algorithm.name(),
            row[0],
            row[1],
            row[2],
            row[3]
        );
        if algorithm == Algorithm::SlidingLog {
            // One sorted-set entry per unit: compact up to 128 entries, a skiplist beyond.
            assert!(row[0] < 200, "{algorithm}: {row:?}");
            assert!(
                (100 * 10..100 * 40).contains(&row[1]),
                "{algorithm}: {row:?}"
            );
            assert!(
                (1000 * 40..1000 * 150).contains(&row[3]),
                "{algorithm}: {row:?}"
            );
        } else {
            // One short string, whatever the limit and the count.
            assert!(row.iter().all(|&b| b < 200), "{algorithm}: {row:?}");
        }
    }
}

/// The script as the crate sends it: the driver with every step spliced in.
fn script_source() -> &'static str {
    redlimit::test_hooks::script_source()
}

/// A Redis of its own, a connection to it, the script as the crate sends it, and `T0` in µs:
/// what a test that calls the script by hand starts with.
fn by_hand() -> (RedisServer, redis::Connection, &'static str, f64) {
    let redis = RedisServer::start();
    let conn = redis.conn();
    (redis, conn, script_source(), T0.as_micros() as f64)
}

/// The byte naming `algorithm` in the script's arguments, as the crate sends it.
fn tag(algorithm: Algorithm) -> u8 {
    redlimit::algorithm::script_tag(algorithm)
}

/// The usual call, an admission under the caller's one quota, replies one integer,
/// `reset_after_ms * (burst + 1) + remaining`; a denial, and an admission whose integer would
/// reach 2^53, reply the packed string.
#[test]
fn one_quota_admission_replies_one_integer() {
    let (_redis, mut conn, source, now) = by_hand();
    let call = |conn: &mut redis::Connection, key: &str, tier: (f64, f64, f64)| {
        let args = support::script_args(now, 1.0, tag(Algorithm::TokenBucket), &[tier]);
        support::eval_on_key::<redis::Value>(conn, source, key, args)
    };
    // 10 a minute: 9 left, full again in 6 s.
    let minute = (10.0, 60e6, 10.0);
    assert_eq!(
        call(&mut conn, "redlimit:{i}", minute),
        redis::Value::Int(6_000 * 11 + 9)
    );
    for _ in 0..9 {
        assert!(matches!(
            call(&mut conn, "redlimit:{i}", minute),
            redis::Value::Int(_)
        ));
    }
    // Denied: the string, flags 0, with the retry.
    let redis::Value::BulkString(denied) = call(&mut conn, "redlimit:{i}", minute) else {
        panic!("a denial replies the packed string");
    };
    assert_eq!((denied.len(), denied[0], denied[1]), (26, 0, 1));
    // A burst of 2^52 refilled over a day: 2^52 * 86 400 000 ms is far past 2^53.
    let huge = (2f64.powi(52), 86_400e6, 2f64.powi(52));
    let redis::Value::BulkString(admitted) = call(&mut conn, "redlimit:{h}", huge) else {
        panic!("an integer past 2^53 is the packed string instead");
    };
    assert_eq!((admitted.len(), admitted[0], admitted[1]), (26, 1, 1));
    let remaining = f64::from_le_bytes(admitted[2..10].try_into().unwrap());
    assert_eq!(remaining, 2f64.powi(52) - 1.0);
}

/// Several tiers in one call, all or none: admitted only when every tier admits, then every
/// tier pays; a denial by one tier costs none, and the reply is the binding tier's. All tiers'
/// states live in one string. Token bucket, tier 1: 10 a minute; tier 2: 2 a minute.
#[test]
fn several_tiers_are_all_or_none() {
    let (_redis, mut conn, source, now) = by_hand();
    let pack =
        |cost: f64, alg: u8, tiers: &[(f64, f64, f64)]| support::script_args(now, cost, alg, tiers);
    // The reply: flags (1 allowed, 2 suspended), the binding tier's position (from 1), then
    // doubles remaining, retry_after_ms, reset_after_ms.
    let unpack = |reply: Vec<u8>| -> [i64; 5] {
        assert_eq!(reply.len(), 26, "{reply:?}");
        let mut out = [i64::from(reply[0]), i64::from(reply[1]), 0, 0, 0];
        for (i, v) in out.iter_mut().enumerate().skip(2) {
            let bytes: [u8; 8] = reply[2 + 8 * (i - 2)..10 + 8 * (i - 2)].try_into().unwrap();
            *v = f64::from_le_bytes(bytes) as i64;
        }
        out
    };
    let tiers = [(10.0, 60e6, 10.0), (2.0, 60e6, 2.0)];
    let call = |conn: &mut redis::Connection, cost: f64| -> [i64; 5] {
        let args = pack(cost, tag(Algorithm::TokenBucket), &tiers);
        unpack(support::eval_on_key(conn, source, "redlimit:{t}", args))
    };
    // The 2-a-minute tier binds (1 left of 2, while the other has 9 of 10).
    assert_eq!(call(&mut conn, 1.0), [1, 2, 1, 0, 30_000]);
    assert_eq!(call(&mut conn, 1.0), [1, 2, 0, 0, 60_000]);
    let both: Vec<u8> = conn.get("redlimit:{t}").unwrap();
    assert_eq!(both.len(), 34, "one string holds both tiers");
    // Denied by the second tier: the first is not charged.
    assert_eq!(call(&mut conn, 1.0), [0, 2, 0, 30_000, 60_000]);
    let after: Vec<u8> = conn.get("redlimit:{t}").unwrap();
    assert_eq!(both, after, "a denial charged a tier");
    // A cost above one tier's capacity is never allowed.
    assert_eq!(call(&mut conn, 3.0)[3], -1);
    // Malformed arguments: a clear error, never the key.
    let eval = |conn: &mut redis::Connection, keys: usize, args: &[&[u8]]| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(source).arg(keys);
        for k in 0..keys {
            cmd.arg(format!("redlimit:{{t}}:{k}"));
        }
        for a in args {
            cmd.arg(*a);
        }
        cmd.query::<Vec<u8>>(conn).unwrap_err().to_string()
    };
    let unknown = pack(1.0, b'x', &[(1.0, 1.0, 1.0)]);
    let error = eval(&mut conn, 1, &[&unknown]);
    assert!(error.contains("unknown algorithm"), "{error}");
    assert!(!error.contains("redlimit:{t}"), "{error}");
    let log_one_key = pack(1.0, tag(Algorithm::SlidingLog), &[(1.0, 1.0, 1.0)]);
    let nine = pack(1.0, tag(Algorithm::TokenBucket), &[(1.0, 1.0, 1.0); 9]);
    for (keys, args, why) in [
        (
            1,
            vec![pack(1.0, tag(Algorithm::TokenBucket), &[(0.0, 1.0, 1.0)])],
            "limit 0",
        ),
        (
            1,
            vec![pack(1.0, tag(Algorithm::TokenBucket), &[(1.5, 1.0, 1.0)])],
            "limit not whole",
        ),
        (
            1,
            vec![pack(
                1.0,
                tag(Algorithm::TokenBucket),
                &[(1.0, f64::NAN, 1.0)],
            )],
            "period NaN",
        ),
        (
            1,
            vec![pack(
                1.0,
                tag(Algorithm::TokenBucket),
                &[(1.0, 1.0, 2f64.powi(53))],
            )],
            "burst 2^53",
        ),
        (
            1,
            vec![pack(-2.0, tag(Algorithm::TokenBucket), &[(1.0, 1.0, 1.0)])],
            "negative cost",
        ),
        (
            1,
            vec![pack(1.0, tag(Algorithm::TokenBucket), &[])],
            "no tier",
        ),
        (1, vec![nine], "nine tiers"),
        (1, vec![log_one_key], "the sliding log without its key"),
        (1, vec![b"1".to_vec(), b"1".to_vec()], "the old protocol"),
        (1, vec![b"12345678901234567".to_vec()], "cut short"),
        (1, vec![], "no argument"),
        (
            0,
            vec![pack(1.0, tag(Algorithm::TokenBucket), &tiers)],
            "no key",
        ),
    ] {
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let error = eval(&mut conn, keys, &args);
        assert!(error.contains("invalid arguments"), "{why}: {error}");
        assert!(!error.contains("redlimit:{t}"), "{why}: {error}");
    }
}

/// The split form (lua/common.lua's header, "Split": the state's key alone, the tenant's
/// string and the sliding log's controls as arguments, what a Cluster slot migration needs)
/// replies exactly as the normal form, call by call, for every algorithm: under a tenant's
/// override of every route (3 a minute, over the caller's 10), and after a tenant reset that
/// follows 3 admissions (the sliding log's split form counts from the reset instead of
/// deleting its set, and must still give exactly 10 more).
#[test]
fn the_split_form_decides_as_the_normal_one() {
    let (_redis, mut conn, source, t0) = by_hand();
    let quota = (10.0, 60e6, 10.0);
    let override_three = {
        let mut s = vec![b'M'];
        s.extend(0f64.to_le_bytes());
        s.push(1);
        s.extend([3.0, 60e6, 3.0].map(f64::to_le_bytes).concat());
        s
    };
    let reset_at = |reset_us: f64| {
        let mut s = vec![b'M'];
        s.extend(0f64.to_le_bytes());
        s.push(0);
        s.extend(reset_us.to_le_bytes());
        s
    };
    for &algorithm in Algorithm::ALL {
        let alg = tag(algorithm);
        let log = algorithm == Algorithm::SlidingLog;
        let (normal, split) = (
            format!("redlimit:{{n-{algorithm}}}"),
            format!("redlimit:{{s-{algorithm}}}"),
        );
        let [log_controls, tenant_key] = redlimit::test_hooks::control_keys(&normal);
        let decide = |conn: &mut redis::Connection, now: f64, tenant: Option<&[u8]>| {
            let args = support::script_args(now, 1.0, alg, &[quota]);
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(source);
            if log {
                cmd.arg(3).arg(&log_controls).arg(&normal).arg(&tenant_key);
            } else {
                cmd.arg(2).arg(&normal).arg(&tenant_key);
            }
            let normal_reply: redis::Value = cmd.arg(&args).query(conn).unwrap();
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(source).arg(1).arg(&split).arg(&args);
            cmd.arg(tenant.unwrap_or_default());
            if log {
                // Its controls' string, as the caller would read it (absent: never written
                // in the split form).
                cmd.arg(b"".as_slice());
            }
            let split_reply: redis::Value = cmd.query(conn).unwrap();
            assert_eq!(normal_reply, split_reply, "{algorithm}");
            normal_reply
        };
        let admitted = |reply: &redis::Value| match reply {
            redis::Value::Int(_) => true,
            redis::Value::BulkString(bytes) => bytes[0] & 1 == 1,
            other => panic!("{other:?}"),
        };
        // Under the tenant's override: 3 of 5.
        let _: () = conn.set(&tenant_key, &override_three).unwrap();
        let mut now = t0;
        let mut n = 0;
        for _ in 0..5 {
            now += 1000.0;
            n += u32::from(admitted(&decide(&mut conn, now, Some(&override_three))));
        }
        assert_eq!(n, 3, "{algorithm}: under the override");
        // Without it: the caller's 10 (what the override used carries over as each algorithm
        // keeps it; the two forms agree on every reply); then a reset.
        let _: () = conn.del(&tenant_key).unwrap();
        for _ in 0..10 {
            now += 1000.0;
            decide(&mut conn, now, None);
        }
        now += 1000.0;
        let reset = reset_at(now);
        let _: () = conn.set(&tenant_key, &reset).unwrap();
        let mut n = 0;
        for _ in 0..12 {
            now += 1000.0;
            n += u32::from(admitted(&decide(&mut conn, now, Some(&reset))));
        }
        assert_eq!(n, 10, "{algorithm}: after the reset");
    }
}
