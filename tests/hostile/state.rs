//! Corrupt and wrong-type stored values self-heal.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlimit::{clock::ManualClock, Algorithm, Limiter, Quota};

use crate::support::RedisServer;
use crate::{aconn, burst, decide, first_admission, key_type, keys_of, manual_limiter, shared};

fn garbage_values() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = [
        "garbage",
        "",
        " ",
        "-1",
        "-9999999999",
        "nan",
        "NaN",
        "-nan",
        "inf",
        "-inf",
        "+inf",
        "1e308",
        "1e999",
        "-1e308",
        "9007199254740993",
        "99999999999999999999999",
        "0x7fffffffffffffff",
        "1.5",
        "3.99",
        "1e-300",
        "0",
        "{}",
        "1 2",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    values.push(b"\0\xff\xfe".to_vec());
    values.push("9".repeat(10_000).into_bytes());
    values
}

/// What a wrong-type (or foreign) value is planted as.
#[derive(Debug, Clone, Copy)]
enum Plant {
    Text,
    Number,
    List,
    Set,
    SortedSet,
    ForeignHash,
}

const PLANTS: [Plant; 6] = [
    Plant::Text,
    Plant::Number,
    Plant::List,
    Plant::Set,
    Plant::SortedSet,
    Plant::ForeignHash,
];

async fn plant(conn: &mut MultiplexedConnection, key: &str, plant: Plant) {
    let _: () = redis::cmd("DEL").arg(key).query_async(conn).await.unwrap();
    let mut cmd = match plant {
        Plant::Text => redis::cmd("SET"),
        Plant::Number => redis::cmd("SET"),
        Plant::List => redis::cmd("RPUSH"),
        Plant::Set => redis::cmd("SADD"),
        Plant::SortedSet => redis::cmd("ZADD"),
        Plant::ForeignHash => redis::cmd("HSET"),
    };
    cmd.arg(key);
    match plant {
        Plant::Text => cmd.arg("not a limiter value"),
        Plant::Number => cmd.arg("12345"),
        Plant::List | Plant::Set => cmd.arg("a").arg("b"),
        Plant::SortedSet => cmd.arg("+inf").arg("forever").arg("1").arg("past"),
        Plant::ForeignHash => cmd.arg("field").arg("value"),
    };
    let _: () = cmd.query_async(conn).await.expect("plant a value");
}

/// Corrupts one Redis key of a limiter key in place, keeping its type, with `garbage`.
/// Returns a description, or `None` when the key's type has no such corruption.
async fn corrupt(
    conn: &mut MultiplexedConnection,
    key: &str,
    kind: &str,
    field: Option<&str>,
    garbage: &[u8],
    now_micros: u64,
) -> String {
    match kind {
        "hash" => {
            let fields: Vec<String> = match field {
                Some(field) => vec![field.to_owned()],
                None => redis::cmd("HKEYS")
                    .arg(key)
                    .query_async(conn)
                    .await
                    .unwrap(),
            };
            for field in &fields {
                let _: () = redis::cmd("HSET")
                    .arg(key)
                    .arg(field)
                    .arg(garbage)
                    .query_async(conn)
                    .await
                    .unwrap();
            }
            format!(
                "HSET {key} {fields:?} = {:?}",
                String::from_utf8_lossy(garbage)
            )
        }
        "string" => {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(garbage)
                .arg("KEEPTTL")
                .query_async(conn)
                .await
                .unwrap();
            format!("SET {key} {:?}", String::from_utf8_lossy(garbage))
        }
        "zset" => {
            // Extreme scores: infinities, huge, negative, far future in µs and in ns.
            let hour = now_micros + 3_600_000_000;
            let day = now_micros + 86_400_000_000;
            let ns = now_micros.saturating_mul(1000);
            let _: () = redis::cmd("ZADD")
                .arg(key)
                .arg("+inf")
                .arg("inf")
                .arg("-inf")
                .arg("-inf")
                .arg("1e300")
                .arg("huge")
                .arg("-1")
                .arg("negative")
                .arg(hour)
                .arg("hour-ahead")
                .arg(day)
                .arg("day-ahead")
                .arg(ns)
                .arg("nanoseconds")
                .arg(0)
                .arg(garbage)
                .query_async(conn)
                .await
                .unwrap();
            format!(
                "ZADD {key} extreme scores + member {:?}",
                String::from_utf8_lossy(garbage)
            )
        }
        "list" | "set" => {
            let command = if kind == "list" { "RPUSH" } else { "SADD" };
            let _: () = redis::cmd(command)
                .arg(key)
                .arg(garbage)
                .query_async(conn)
                .await
                .unwrap();
            format!("{command} {key}")
        }
        other => panic!("unexpected Redis type {other} for {key}"),
    }
}

/// After damage to `key`'s stored state at the clock's current time: the next check is Ok and
/// sane (admitted when `expect_allowed`), at most the burst is admitted at once, and two
/// periods later the key admits exactly its full burst again (fully healed, no permanent loss
/// of capacity and no lockout). Returns how long the key stayed locked.
async fn assert_heals(
    limiter: &Limiter,
    clock: &ManualClock,
    key: &str,
    quota: &Quota,
    expect_allowed: bool,
    context: &str,
) -> Duration {
    let first = decide(limiter, key, quota, context).await;
    if expect_allowed {
        assert!(first.allowed, "{context}: denied after healing {first:?}");
    }
    let at_once = u64::from(first.allowed)
        + if first.allowed {
            burst(limiter, key, quota, quota.burst() * 3, context).await
        } else {
            0
        };
    assert!(
        at_once <= quota.burst(),
        "{context}: {at_once} admitted at once, capacity {}",
        quota.burst()
    );
    let step = quota.period() / 20;
    let within = quota.period() * 2;
    let probe = first_admission(limiter, clock, key, quota, step, within, context).await;
    if let Some(broken) = probe.broken_promise {
        panic!("{context}: {broken}");
    }
    let waited = probe
        .waited
        .unwrap_or_else(|| panic!("{context}: locked out for 2 periods"));
    clock.advance(quota.period() * 2 + step);
    let full = burst(limiter, key, quota, quota.burst() * 3, context).await;
    assert_eq!(
        full,
        quota.burst(),
        "{context}: not fully healed two periods later"
    );
    waited
}

/// Stored values corrupted in place (garbage, negative, NaN/inf, huge numbers in every hash
/// field; extreme scores in sorted sets) or replaced by a value of the wrong type (string, number,
/// list, set, sorted set, foreign hash — before first use and after use), for every algorithm
/// and every Redis key it uses (plus `<storage_key>` and `<storage_key>:log`): never an error,
/// sane decisions, never more than the burst at once, fully healed two periods later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_or_wrong_type_state_self_heals() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    // A long period: Redis expires keys on its own clock, so TTLs (derived from the manual
    // clock) must outlast a slow burst of checks at one manual instant.
    let quota = Quota::per_minute(10).unwrap();
    let runs = Algorithm::ALL.iter().map(|&algorithm| {
        let redis = &redis;
        async move {
            let mut conn = aconn(redis).await;
            let (limiter, clock) = manual_limiter(redis, algorithm);
            let mut case = 0usize;
            let mut longest_lockout = Duration::ZERO;
            let mut next_key = || {
                case += 1;
                format!("{algorithm}-case-{case}")
            };

            // The layout: which Redis keys one limiter key uses, and their types.
            let probe = next_key();
            assert_eq!(burst(&limiter, &probe, &quota, 3, "layout").await, 3);
            let storage = limiter.storage_key(&probe);
            let mut layout = Vec::new();
            for key in keys_of(&mut conn, &storage).await {
                let suffix = key[storage.len()..].to_owned();
                let kind = key_type(&mut conn, &key).await;
                let fields: Vec<String> = if kind == "hash" {
                    redis::cmd("HKEYS")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap()
                } else {
                    Vec::new()
                };
                layout.push((suffix, kind, fields));
            }
            assert!(!layout.is_empty(), "{algorithm}: nothing stored");

            // Corrupt in place, keeping the type.
            let mut corruptions = 0;
            for (suffix, kind, fields) in &layout {
                let mut targets: Vec<Option<&str>> = fields.iter().map(|f| Some(&**f)).collect();
                if targets.len() != 1 {
                    targets.push(None); // every field at once
                }
                for target in targets {
                    for garbage in garbage_values() {
                        let key = next_key();
                        assert_eq!(burst(&limiter, &key, &quota, 3, "before").await, 3);
                        let redis_key = format!("{}{suffix}", limiter.storage_key(&key));
                        let what = corrupt(
                            &mut conn,
                            &redis_key,
                            kind,
                            target,
                            &garbage,
                            clock.now_micros(),
                        )
                        .await;
                        let context = format!("{algorithm}: {what}");
                        let locked =
                            assert_heals(&limiter, &clock, &key, &quota, false, &context).await;
                        longest_lockout = longest_lockout.max(locked);
                        corruptions += 1;
                    }
                }
            }

            // Wrong types, before first use and after use.
            let mut suffixes: BTreeSet<String> = layout.iter().map(|l| l.0.clone()).collect();
            suffixes.insert(String::new());
            suffixes.insert(":log".to_owned());
            let mut wrong_types = 0;
            for suffix in &suffixes {
                for kind in PLANTS {
                    for used_before in [false, true] {
                        let key = next_key();
                        if used_before {
                            assert_eq!(burst(&limiter, &key, &quota, 3, "before").await, 3);
                        }
                        let redis_key = format!("{}{suffix}", limiter.storage_key(&key));
                        plant(&mut conn, &redis_key, kind).await;
                        let context = format!(
                            "{algorithm}: {kind:?} planted at {redis_key} (used before: \
                             {used_before})"
                        );
                        assert_heals(&limiter, &clock, &key, &quota, true, &context).await;
                        wrong_types += 1;
                    }
                }
            }
            let layout_text: Vec<String> = layout
                .iter()
                .map(|(suffix, kind, fields)| format!("<key>{suffix}: {kind} {fields:?}"))
                .collect();
            println!(
                "{algorithm}: layout [{}]; {corruptions} in-place corruptions and {wrong_types} \
                 wrong-type plants all healed, no error; longest lockout after corruption \
                 {longest_lockout:?} (period {:?})",
                layout_text.join(", "),
                quota.period()
            );
            assert_eq!(limiter.stats().store_errors, 0);
        }
    });
    futures::future::join_all(runs).await;
}

/// The tenant's controls key (written by an operator's suspension) replaced by a value of
/// another type or by garbage bytes reads as absent, for every algorithm: no error, the burst
/// admitted as on a fresh key, and the key left as it was (only an operator's control
/// replaces it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_or_corrupt_tenant_key_reads_as_absent() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    let quota = Quota::per_minute(10).unwrap();
    let mut conn = aconn(&redis).await;
    for &algorithm in Algorithm::ALL {
        let (limiter, _clock) = manual_limiter(&redis, algorithm);
        let replacements: Vec<(&str, Vec<Vec<u8>>)> = vec![
            ("RPUSH", vec![b"a".to_vec()]),
            ("SADD", vec![b"a".to_vec()]),
            ("HSET", vec![b"f".to_vec(), b"v".to_vec()]),
            ("ZADD", vec![b"1".to_vec(), b"a".to_vec()]),
            ("SET", vec![b"M".to_vec()]),
            (
                "SET",
                vec![b"M\xff\xff\xff\xff\xff\xff\xef\x7f\x09".to_vec()],
            ),
            ("SET", vec![vec![b'M'; 300]]),
        ];
        for (case, (command, args)) in replacements.into_iter().enumerate() {
            let key = format!("{algorithm}-tenant-{case}");
            let context = format!("{algorithm} {command} {args:?}");
            // The tenant's key is the one an operator's suspension adds.
            let storage = limiter.storage_key(&key);
            let before = keys_of(&mut conn, &storage).await;
            limiter
                .suspend(key.as_str(), Duration::from_secs(60))
                .await
                .unwrap();
            let tenant: Vec<String> = keys_of(&mut conn, &storage)
                .await
                .into_iter()
                .filter(|k| !before.contains(k))
                .collect();
            assert_eq!(
                tenant.len(),
                1,
                "{context}: the suspension's key: {tenant:?}"
            );
            let tenant = &tenant[0];
            let _: () = redis::cmd("DEL")
                .arg(tenant)
                .query_async(&mut conn)
                .await
                .unwrap();
            let mut cmd = redis::cmd(command);
            cmd.arg(tenant);
            for arg in &args {
                cmd.arg(arg.as_slice());
            }
            let _: () = cmd.query_async(&mut conn).await.unwrap();
            let kind = key_type(&mut conn, tenant).await;
            assert_eq!(
                burst(&limiter, &key, &quota, 20, &context).await,
                10,
                "{context}"
            );
            assert_eq!(
                key_type(&mut conn, tenant).await,
                kind,
                "{context}: left as it was"
            );
        }
    }
}
