//! Hostile and odd input, against a real private Redis (never a mock).
//!
//! Every test asserts what would break if a protection were missing, and prints its figures:
//! - huge keys (a 1 MB header through `HeaderKey` / `FnKey`, a 1 MB key to `Limiter::check`)
//!   become short Redis keys that do not contain the raw value;
//! - non-UTF-8 and control bytes, braces, forwarded headers: no panic, bounded keys, exactly one
//!   hash tag per stored key, distinct keys stay distinct;
//! - a flood of distinct keys: Redis memory and key count are bounded by expiry;
//! - a flood of distinct keys into a bounded `MemoryStore`: never above its cap;
//! - a quota tightened from 100 to 10, a clock stepped back: no lockout, no error;
//! - corrupt or wrong-type stored values: the next check succeeds and the key heals fully;
//! - a property test over every key extraction path.
//!
//! Tests run over `Algorithm::ALL`, so they cover every algorithm the crate has.

mod support;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use redis::aio::MultiplexedConnection;
use redlimit::key::{Cidr, FnKey, HeaderKey, KeyExtractor, PeerIp};
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{
    Algorithm, Clock, Decision, Limiter, ManualClock, Quota, RateLimitLayer, Verdict,
    DEFAULT_PREFIX,
};
use support::RedisServer;
use tower::{Layer, ServiceExt};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The million-key flood runs alone (`exclusive`), so that its throughput and memory figures
/// are not those of a machine shared with the other tests of this file, which run side by side
/// (`shared`).
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

async fn exclusive() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().await
}

async fn shared() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().await
}

/// `shared` for the tests without a runtime.
fn shared_blocking() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.blocking_read()
}

/// An arbitrary fixed instant for the manual clocks (2023-11-14).
const T0: Duration = Duration::from_secs(1_700_000_000);

fn redis_store(redis: &RedisServer) -> RedisStore {
    // Correctness tests, not latency tests: a generous timeout so a loaded 2-core machine does
    // not turn a slow call into a fail-open.
    RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(2))
        .without_circuit_breaker()
        .build()
        .expect("valid url")
}

fn redis_limiter(redis: &RedisServer, algorithm: Algorithm) -> Limiter {
    Limiter::builder(redis_store(redis))
        .algorithm(algorithm)
        .build()
        .expect("valid limiter")
}

/// A limiter on the client clock `clock` (a manual clock standing at `T0`).
fn manual_limiter(redis: &RedisServer, algorithm: Algorithm) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder(redis_store(redis))
        .algorithm(algorithm)
        .clock(Clock::Manual(clock.clone()))
        .build()
        .expect("valid limiter");
    (limiter, clock)
}

async fn aconn(redis: &RedisServer) -> MultiplexedConnection {
    redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the private redis")
}

/// Every key in the private server (`KEYS *` is fine on a test server), binary-safe.
async fn all_keys(conn: &mut MultiplexedConnection) -> Vec<Vec<u8>> {
    redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS *")
}

/// The Redis keys of one limiter key: its storage key and any `<storage key>:<suffix>`.
async fn keys_of(conn: &mut MultiplexedConnection, storage_key: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{storage_key}*"))
        .query_async(conn)
        .await
        .expect("KEYS pattern");
    keys.sort();
    keys
}

async fn key_type(conn: &mut MultiplexedConnection, key: &str) -> String {
    redis::cmd("TYPE")
        .arg(key)
        .query_async(conn)
        .await
        .expect("TYPE")
}

async fn memory_usage(conn: &mut MultiplexedConnection, key: &[u8]) -> u64 {
    let usage: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .expect("MEMORY USAGE");
    usage.unwrap_or(0)
}

async fn flushall(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("FLUSHALL")
        .query_async(conn)
        .await
        .expect("FLUSHALL");
}

async fn dbsize(conn: &mut MultiplexedConnection) -> u64 {
    redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .expect("DBSIZE")
}

async fn used_memory(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .expect("INFO memory");
    support::info_field(&info, "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory in INFO memory")
}

/// Whether `id` is kept literally in a storage key (mirrors the documented rule in
/// `redlimit::key`: 1 to 200 bytes of printable ASCII, no braces, not starting with `#`).
fn is_plain(key: &str) -> bool {
    (1..=200).contains(&key.len())
        && !key.starts_with('#')
        && key
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
}

fn is_hash_id(id: &str) -> bool {
    id.len() == 65
        && id.starts_with('#')
        && id[1..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks the shape of a Redis key written by a limiter with `prefix`:
/// `<prefix>:{<id>}<suffix>`, all printable ASCII, exactly one `{` and one `}` (so the whole id
/// is the Cluster hash tag), `<id>` either a plain key or `#` + 64 hex digits.
/// Returns the id (the hash tag).
fn check_redis_key(key: &[u8], prefix: &str) -> Result<String, String> {
    let text = std::str::from_utf8(key).map_err(|_| format!("key is not UTF-8: {key:?}"))?;
    if !key.iter().all(u8::is_ascii_graphic) {
        return Err(format!("key has non-printable bytes: {text:?}"));
    }
    let head = format!("{prefix}:{{");
    if !text.starts_with(&head) {
        return Err(format!("key does not start with {head:?}: {text:?}"));
    }
    if text.matches('{').count() != 1 || text.matches('}').count() != 1 {
        return Err(format!(
            "key must have exactly one '{{' and one '}}': {text:?}"
        ));
    }
    let close = text.find('}').expect("one '}'");
    let id = &text[head.len()..close];
    if !(is_plain(id) || is_hash_id(id)) {
        return Err(format!(
            "hash tag is neither plain nor a sha256 id: {text:?}"
        ));
    }
    let suffix = &text[close + 1..];
    if suffix.len() > 16 {
        return Err(format!(
            "unexpectedly long suffix after the hash tag: {text:?}"
        ));
    }
    Ok(id.to_owned())
}

/// Checks `Limiter::storage_key(key)` against the documented rule.
fn check_storage_key(storage: &str, prefix: &str, key: &str) -> Result<(), String> {
    let id = check_redis_key(storage.as_bytes(), prefix)?;
    if !storage.ends_with('}') {
        return Err(format!("storage key has a suffix: {storage:?}"));
    }
    if is_plain(key) {
        if id != key {
            return Err(format!("plain key {key:?} not kept literally: {storage:?}"));
        }
    } else if !is_hash_id(&id) || storage.len() != prefix.len() + 68 {
        return Err(format!(
            "non-plain key ({} bytes) not replaced by its hash: {storage:?}",
            key.len()
        ));
    }
    if storage.len() > prefix.len() + 3 + 200 {
        return Err(format!("storage key of {} bytes", storage.len()));
    }
    Ok(())
}

/// A deterministic pseudo-random printable-ASCII string (no braces needed: hashed anyway).
fn pseudo_random_printable(len: usize, seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            (b'!' + (r >> 58) as u8 % 94) as char
        })
        .collect()
}

/// Sends one request through `layer` around an inner service answering 200.
async fn send<K: KeyExtractor>(layer: &RateLimitLayer<K>, request: Request<String>) -> StatusCode {
    let service = layer.layer(tower::service_fn(|_request: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    }));
    service
        .oneshot(request)
        .await
        .expect("the inner service is infallible")
        .status()
}

fn with_header(name: &str, value: HeaderValue) -> Request<String> {
    let mut request = Request::new(String::new());
    request
        .headers_mut()
        .insert(http::HeaderName::try_from(name).unwrap(), value);
    request
}

/// A decision any caller can live with: the quota's limit, remaining within capacity, no
/// retry hint when allowed, and bounded times when denied (never "never" for cost 1).
fn assert_sane(d: &Decision, quota: &Quota, context: &str) {
    let period = quota.period();
    let bound = period * 2 + Duration::from_millis(1);
    assert_eq!(d.limit, quota.limit(), "{context}: limit {d:?}");
    assert!(
        d.remaining <= quota.burst().max(quota.limit()),
        "{context}: remaining above capacity {d:?}"
    );
    if d.allowed {
        assert_eq!(d.retry_after, Duration::ZERO, "{context}: {d:?}");
    } else {
        assert!(
            d.retry_after > Duration::ZERO && d.retry_after <= bound,
            "{context}: denied with retry_after {:?} (period {period:?}) {d:?}",
            d.retry_after
        );
    }
    assert!(
        d.reset_after <= bound,
        "{context}: reset_after {:?} (period {period:?}) {d:?}",
        d.reset_after
    );
}

async fn decide(limiter: &Limiter, key: &str, quota: &Quota, context: &str) -> Decision {
    let d = limiter
        .try_check(key, quota, 1)
        .await
        .unwrap_or_else(|e| panic!("{context}: the check failed: {e}"));
    assert_sane(&d, quota, context);
    d
}

/// Checks `key` at one instant until it is denied (or `max` admissions): how many were admitted.
async fn burst(limiter: &Limiter, key: &str, quota: &Quota, max: u64, context: &str) -> u64 {
    let mut admitted = 0;
    while admitted < max {
        if !decide(limiter, key, quota, context).await.allowed {
            break;
        }
        admitted += 1;
    }
    admitted
}

/// What probing a denied key over time found.
struct Probe {
    /// How long until a request was admitted; `None` if not within the horizon.
    waited: Option<Duration>,
    /// The largest `retry_after` while denied.
    max_retry: Duration,
    /// A denial at or after the time an earlier `retry_after` promised admission.
    broken_promise: Option<String>,
}

/// From the clock's current time, checks every `step` until a request is admitted (at most
/// `horizon`). Denials consume nothing, so the state only gets better: a `retry_after` is a
/// promise, and a denial after it is due is recorded.
async fn first_admission(
    limiter: &Limiter,
    clock: &ManualClock,
    key: &str,
    quota: &Quota,
    step: Duration,
    horizon: Duration,
    context: &str,
) -> Probe {
    let mut waited = Duration::ZERO;
    let mut max_retry = Duration::ZERO;
    let mut promised: Option<Duration> = None;
    let mut broken_promise = None;
    loop {
        let d = decide(limiter, key, quota, context).await;
        if d.allowed {
            return Probe {
                waited: Some(waited),
                max_retry,
                broken_promise,
            };
        }
        if let Some(due) = promised.filter(|due| waited >= *due) {
            broken_promise.get_or_insert_with(|| {
                format!(
                    "retry_after promised admission after {due:?}, still denied after {waited:?} \
                     (now retry_after {:?})",
                    d.retry_after
                )
            });
        }
        let due = waited + d.retry_after;
        promised = Some(promised.map_or(due, |p| p.min(due)));
        max_retry = max_retry.max(d.retry_after);
        if waited >= horizon {
            return Probe {
                waited: None,
                max_retry,
                broken_promise,
            };
        }
        clock.advance(step);
        waited += step;
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Huge keys
// ---------------------------------------------------------------------------------------------

/// A 1 MB header value as the key, through the layer with `HeaderKey` and with an `FnKey`
/// returning the raw value, and a 1 MB key given to `Limiter::check`: Redis holds only short
/// keys (< 100 bytes, a hex digest as hash tag), never the value, and the same huge value still
/// counts against one key (2 admitted, the 3rd gets 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megabyte_keys_become_short_redis_keys() {
    let _machine = shared().await;
    const MB: usize = 1 << 20;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    let quota = Quota::per_minute(2).unwrap();
    let header_raw = pseudo_random_printable(MB, 1);
    let fn_raw = pseudo_random_printable(MB, 2);
    let direct_raw = pseudo_random_printable(MB, 3);

    for &algorithm in Algorithm::ALL {
        let limiter = redis_limiter(&redis, algorithm);
        // Script loaded and connection open before the baseline.
        assert!(limiter.check("warm-up", &quota).await.is_allowed());
        flushall(&mut conn).await;
        let memory_before = used_memory(&mut conn).await;

        let by_header = RateLimitLayer::new(
            limiter.clone(),
            quota,
            HeaderKey::named("x-api-key").unwrap(),
        );
        let by_fn = RateLimitLayer::new(
            limiter.clone(),
            quota,
            FnKey::new(|parts: &http::request::Parts| {
                parts.headers.get("x-raw")?.to_str().ok().map(str::to_owned)
            }),
        );
        let header_value = HeaderValue::from_str(&header_raw).unwrap();
        let fn_value = HeaderValue::from_str(&fn_raw).unwrap();
        let mut header_statuses = Vec::new();
        let mut fn_statuses = Vec::new();
        let mut direct = Vec::new();
        for _ in 0..3 {
            header_statuses
                .push(send(&by_header, with_header("x-api-key", header_value.clone())).await);
            fn_statuses.push(send(&by_fn, with_header("x-raw", fn_value.clone())).await);
            direct.push(limiter.check(&direct_raw, &quota).await.is_allowed());
        }
        let expected = [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ];
        assert_eq!(
            header_statuses, expected,
            "{algorithm}: HeaderKey, 1 MB value"
        );
        assert_eq!(fn_statuses, expected, "{algorithm}: FnKey, 1 MB value");
        assert_eq!(direct, [true, true, false], "{algorithm}: check(1 MB key)");
        assert_eq!(
            limiter.stats().store_errors,
            0,
            "{algorithm}: no store error"
        );

        let keys = all_keys(&mut conn).await;
        let mut tags = BTreeSet::new();
        for key in &keys {
            let tag =
                check_redis_key(key, DEFAULT_PREFIX).unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            assert!(key.len() < 100, "{algorithm}: key of {} bytes", key.len());
            for raw in [&header_raw, &fn_raw, &direct_raw] {
                assert!(
                    !String::from_utf8_lossy(key).contains(&raw[..16]),
                    "{algorithm}: a Redis key contains the raw value"
                );
            }
            let header_tag = tag.starts_with("x-api-key:")
                && tag.len() == "x-api-key:".len() + 32
                && tag["x-api-key:".len()..]
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit());
            assert!(
                header_tag || is_hash_id(&tag),
                "{algorithm}: unexpected hash tag {tag:?}"
            );
            tags.insert(tag);
        }
        assert_eq!(tags.len(), 3, "{algorithm}: three limiter keys: {tags:?}");
        for raw in [&fn_raw, &direct_raw] {
            let storage = limiter.storage_key(raw);
            assert!(
                keys.iter().any(|k| k.starts_with(storage.as_bytes())),
                "{algorithm}: storage_key() is what Redis holds"
            );
        }
        let memory_after = used_memory(&mut conn).await;
        let mut per_key = Vec::new();
        for key in &keys {
            per_key.push(format!(
                "{} ({} B key, MEMORY USAGE {} B)",
                String::from_utf8_lossy(key),
                key.len(),
                memory_usage(&mut conn, key).await
            ));
        }
        let grew = memory_after.saturating_sub(memory_before);
        println!(
            "{algorithm}: 3 x 1 MB keys -> {} Redis keys, used_memory +{grew} B:\n  {}",
            keys.len(),
            per_key.join("\n  ")
        );
        assert!(
            grew < 64 * 1024,
            "{algorithm}: used_memory grew {grew} B for 3 x 1 MB keys"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Non-UTF-8, control bytes, braces, forwarded headers
// ---------------------------------------------------------------------------------------------

/// A key carried in the request extensions, for an `FnKey` that returns arbitrary strings.
#[derive(Clone)]
struct RawKey(String);

fn hostile_header_values() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = vec![
        (0x80..=0xff).collect(),
        b"\t".to_vec(),
        b"a\tb".to_vec(),
        b"\xff\xfe{}".to_vec(),
        b"{tenant}".to_vec(),
        b"\x80{a}\xff".to_vec(),
        b"}{".to_vec(),
        b"#abc".to_vec(),
        b"  spaced  ".to_vec(),
        "é🦀".as_bytes().to_vec(),
        b"\xc3\x28".to_vec(), // invalid UTF-8 sequence
    ];
    values.push(vec![0xff; 300]);
    values
}

fn hostile_strings() -> Vec<String> {
    vec![
        "\0".into(),
        "\n".into(),
        "\r\n".into(),
        "\x1b[31mred".into(),
        "\x7f".into(),
        "a\0b".into(),
        "{".into(),
        "}".into(),
        "{}".into(),
        "{a}".into(),
        "a".into(),
        "a{b}c".into(),
        "}{".into(),
        "{{x}}".into(),
        "#".into(),
        "#abc".into(),
        "".into(),
        " ".into(),
        "é".into(),
        "🦀".into(),
        "\u{202e}rtl".into(),
        "\u{feff}bom".into(),
        "x".repeat(200),
        "x".repeat(201),
        "{".repeat(300),
        "tenant-42".into(),
        "redlimit:{evil}".into(),
    ]
}

/// Non-UTF-8 and control bytes in headers (`HeaderKey`, `FnKey`, forwarded headers through
/// `PeerIp::trust_proxies`), keys with braces: no panic, no store error, every Redis key bounded
/// and printable with exactly one `{...}` section, and distinct hostile keys stay distinct
/// (quota 1/min: first request 200, repeat 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_control_bytes_and_braces_are_safe() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    let one = Quota::per_minute(1).unwrap();
    let many = Quota::per_minute(1_000).unwrap();

    for &algorithm in Algorithm::ALL {
        flushall(&mut conn).await;
        let limiter = redis_limiter(&redis, algorithm);

        // HeaderKey: non-UTF-8 values hash fine; each distinct value is its own key.
        let by_header =
            RateLimitLayer::new(limiter.clone(), one, HeaderKey::named("x-api-key").unwrap());
        for value in hostile_header_values() {
            let header = HeaderValue::from_bytes(&value).expect("valid header bytes");
            let first = send(&by_header, with_header("x-api-key", header.clone())).await;
            let again = send(&by_header, with_header("x-api-key", header)).await;
            assert_eq!(
                (first, again),
                (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
                "{algorithm}: HeaderKey {value:?}"
            );
        }

        // FnKey over the raw bytes (lossy UTF-8: different bytes may share a key, so only
        // "no panic, no error, 200 or 429" is asserted here).
        let lossy = RateLimitLayer::new(
            limiter.clone(),
            one,
            FnKey::new(|parts: &http::request::Parts| {
                let value = parts.headers.get("x-raw")?;
                Some(format!(
                    "lossy:{}",
                    String::from_utf8_lossy(value.as_bytes())
                ))
            }),
        );
        for value in hostile_header_values() {
            let header = HeaderValue::from_bytes(&value).unwrap();
            let status = send(&lossy, with_header("x-raw", header)).await;
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{algorithm}: lossy FnKey {value:?} -> {status}"
            );
        }

        // FnKey returning arbitrary strings: control bytes, braces, '#', empty, 200/201 bytes.
        let by_string = RateLimitLayer::new(
            limiter.clone(),
            one,
            FnKey::new(|parts: &http::request::Parts| {
                parts.extensions.get::<RawKey>().map(|k| k.0.clone())
            }),
        );
        let strings = hostile_strings();
        for key in &strings {
            let request = || {
                let mut request = Request::new(String::new());
                request.extensions_mut().insert(RawKey(key.clone()));
                request
            };
            let first = send(&by_string, request()).await;
            let again = send(&by_string, request()).await;
            assert_eq!(
                (first, again),
                (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
                "{algorithm}: FnKey {key:?} must be its own key"
            );
            check_storage_key(&limiter.storage_key(key), DEFAULT_PREFIX, key)
                .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
        }
        let distinct: BTreeSet<String> = strings.iter().map(|k| limiter.storage_key(k)).collect();
        assert_eq!(
            distinct.len(),
            strings.len(),
            "{algorithm}: no two keys collide"
        );

        // PeerIp behind trusted proxies with hostile forwarded headers.
        let peer_ip = PeerIp::new().trust_proxies([
            "10.0.0.0/8".parse::<Cidr>().unwrap(),
            "::1".parse::<Cidr>().unwrap(),
        ]);
        let by_ip = RateLimitLayer::new(limiter.clone(), many, peer_ip.clone());
        let long_chain = format!("198.51.100.1{}", ", 10.0.0.2".repeat(20_000));
        let forwarded: Vec<(&str, Vec<u8>)> = vec![
            ("10.0.0.1:1234", (0x80..=0xff).collect()),
            ("10.0.0.1:1234", b"\t203.0.113.9\t".to_vec()),
            ("10.0.0.1:1234", b"203.0.113.7, \xff\xfe".to_vec()),
            ("10.0.0.1:1234", b"\xff, 203.0.113.8".to_vec()),
            ("10.0.0.1:1234", b"1.2.3.4, 10.1.1.1".to_vec()),
            ("10.0.0.1:1234", b"[2001:db8::1]:443".to_vec()),
            ("10.0.0.1:1234", b"999.1.1.1, {x}".to_vec()),
            ("10.0.0.1:1234", b",,, ,".to_vec()),
            ("10.0.0.1:1234", long_chain.into_bytes()),
            ("[::1]:80", b"2001:db8:aaaa:bbbb:cccc::1".to_vec()),
            ("[::1]:80", b"::ffff:192.0.2.1".to_vec()),
            ("198.51.100.200:1", b"203.0.113.66".to_vec()),
        ];
        for (peer, value) in &forwarded {
            let header = HeaderValue::from_bytes(value).expect("valid header bytes");
            let mut request = with_header("x-forwarded-for", header);
            request
                .extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
            let (parts, _) = {
                let mut clone = Request::new(());
                *clone.headers_mut() = request.headers().clone();
                clone
                    .extensions_mut()
                    .insert(peer.parse::<SocketAddr>().unwrap());
                clone.into_parts()
            };
            let key = peer_ip.extract(&parts).expect("a peer address gives a key");
            assert!(key.starts_with("ip:") && key.len() <= 50, "{key}");
            let status = send(&by_ip, request).await;
            assert_eq!(status, StatusCode::OK, "{algorithm}: XFF from {peer}");
        }

        assert_eq!(
            limiter.stats().store_errors,
            0,
            "{algorithm}: no store error"
        );
        let keys = all_keys(&mut conn).await;
        let mut longest = 0;
        for key in &keys {
            check_redis_key(key, DEFAULT_PREFIX).unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            longest = longest.max(key.len());
        }
        println!(
            "{algorithm}: {} header values, {} hostile strings, {} forwarded headers -> {} Redis \
             keys, all printable with one hash tag, longest {longest} B (the 200-byte plain key)",
            hostile_header_values().len(),
            strings.len(),
            forwarded.len(),
            keys.len()
        );
        assert!(longest <= DEFAULT_PREFIX.len() + 3 + 200 + 16);
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Floods of distinct keys: Redis memory bounded by expiry
// ---------------------------------------------------------------------------------------------

/// The flood's target; it stops early (and says so) if the machine is too slow.
const FLOOD_KEYS: usize = 1_000_000;
const FLOOD_DEADLINE: Duration = Duration::from_secs(55);

/// A million checks on distinct keys with the token bucket through `Limiter::check`: every one
/// is decided by Redis and admitted, the key count never approaches the number of keys (expiry
/// keeps up during the flood), and once the keys' time is over, key count and memory are back
/// at the baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_distinct_keys_are_bounded_by_expiry() {
    let _machine = exclusive().await;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    // One check empties the bucket (limit 1), so each key lives exactly one period: 1 s.
    let quota = Quota::new(1, Duration::from_secs(1)).unwrap();
    let ttl = quota.period();

    // Warm up (script loaded, connections open), then the baseline.
    const TASKS: usize = 8;
    const IN_FLIGHT: usize = 128; // per task: enough to keep Redis busy, more only adds latency
    let limiters: Vec<Limiter> = (0..TASKS)
        .map(|_| redis_limiter(&redis, Algorithm::TokenBucket))
        .collect();
    for limiter in &limiters {
        assert!(limiter.check("warm-up", &quota).await.decision().is_some());
    }
    flushall(&mut conn).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base_keys = dbsize(&mut conn).await;
    let base_memory = used_memory(&mut conn).await;

    // Sample the key count and memory during the flood.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let mut conn = aconn(&redis).await;
        tokio::spawn(async move {
            let (mut peak_keys, mut peak_memory) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                peak_keys = peak_keys.max(dbsize(&mut conn).await);
                peak_memory = peak_memory.max(used_memory(&mut conn).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (peak_keys, peak_memory)
        })
    };

    let started = Instant::now();
    let deadline = started + FLOOD_DEADLINE;
    let next = Arc::new(AtomicUsize::new(0));
    let issued = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = limiters
        .iter()
        .cloned()
        .map(|limiter| {
            let next = next.clone();
            let issued = issued.clone();
            let admitted = admitted.clone();
            tokio::spawn(async move {
                let keys = std::iter::from_fn(|| {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    (i < FLOOD_KEYS).then(|| {
                        issued.fetch_add(1, Ordering::Relaxed);
                        i
                    })
                });
                stream::iter(keys)
                    .map(|i| {
                        let limiter = limiter.clone();
                        async move { limiter.check(&format!("flood-{i}"), &quota).await }
                    })
                    .buffer_unordered(IN_FLIGHT)
                    .for_each(|verdict| {
                        if let Verdict::Decided(d) = verdict {
                            if d.allowed {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        async {}
                    })
                    .await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("flood task");
    }
    let flood_time = started.elapsed();
    let keys_right_after = dbsize(&mut conn).await;
    let memory_right_after = used_memory(&mut conn).await;
    let done = issued.load(Ordering::Relaxed);
    // The newest keys are still alive: their exact size.
    let mut sample = 0;
    for i in (done.saturating_sub(64)..done).rev() {
        let key = limiters[0].storage_key(&format!("flood-{i}"));
        sample = memory_usage(&mut conn, key.as_bytes()).await;
        if sample > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (peak_keys, peak_memory) = sampler.await.expect("sampler");

    let admitted = admitted.load(Ordering::Relaxed);
    let errors: u64 = limiters.iter().map(|l| l.stats().store_errors).sum();

    // Let the last keys' time pass, then wait for Redis to expire them (lazily + actively).
    let drain_started = Instant::now();
    tokio::time::sleep(ttl).await;
    let (mut keys_after, mut memory_after) = (u64::MAX, u64::MAX);
    while drain_started.elapsed() < ttl + Duration::from_secs(10) {
        keys_after = dbsize(&mut conn).await;
        memory_after = used_memory(&mut conn).await;
        if keys_after <= base_keys && memory_after <= base_memory + 256 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain_time = drain_started.elapsed();

    let rate = done as f64 / flood_time.as_secs_f64();
    let per_key = (memory_right_after.saturating_sub(base_memory)) / keys_right_after.max(1);
    if done < FLOOD_KEYS {
        println!(
            "flood: REDUCED to {done} keys: the {FLOOD_DEADLINE:?} deadline was reached on this machine"
        );
    }
    println!(
        "flood: {done} distinct keys via Limiter::check (token bucket, quota 1/s, {TASKS} tasks x \
         {IN_FLIGHT} in flight) in {flood_time:.2?} = {rate:.0} checks/s; admitted {admitted}, \
         store errors {errors}"
    );
    println!(
        "flood: baseline {base_keys} keys / {base_memory} B; right after {keys_right_after} keys / \
         {memory_right_after} B (~{per_key} B per key, MEMORY USAGE of one key {sample} B); \
         peak during flood {peak_keys} keys / {peak_memory} B; {drain_time:.2?} after the flood \
         {keys_after} keys / {memory_after} B"
    );

    assert!(
        done >= 100_000,
        "flood too slow to mean anything: {done} keys"
    );
    assert_eq!(errors, 0, "every check decided by Redis");
    assert_eq!(
        admitted, done as u64,
        "each distinct key's first check is admitted"
    );
    assert!(
        peak_keys < done as u64 / 4,
        "keys accumulated during the flood: peak {peak_keys} of {done}"
    );
    assert!(
        keys_after <= base_keys,
        "{keys_after} keys left after expiry (baseline {base_keys})"
    );
    assert!(
        memory_after <= base_memory + 256 * 1024,
        "used_memory {memory_after} B after expiry, baseline {base_memory} B"
    );
}

/// Every algorithm: 10 000 distinct keys on a 500 ms quota leave nothing behind once their
/// time is over. Prints each algorithm's Redis keys and memory per limiter key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_expires_its_keys() {
    let _machine = shared().await;
    const KEYS: usize = 10_000;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    let quota = Quota::new(1, Duration::from_millis(500)).unwrap();

    for &algorithm in Algorithm::ALL {
        let limiters: Vec<Limiter> = (0..4).map(|_| redis_limiter(&redis, algorithm)).collect();
        for limiter in &limiters {
            // Script loaded and connections open before the baseline.
            assert!(limiter.check("warm-up", &quota).await.decision().is_some());
        }
        flushall(&mut conn).await;
        let base_memory = used_memory(&mut conn).await;

        let started = Instant::now();
        let tasks: Vec<_> = limiters
            .iter()
            .cloned()
            .enumerate()
            .map(|(t, limiter)| {
                tokio::spawn(async move {
                    stream::iter((t..KEYS).step_by(4))
                        .map(|i| {
                            let limiter = limiter.clone();
                            async move {
                                limiter
                                    .try_check(&format!("{i}"), &quota, 1)
                                    .await
                                    .map(|d| d.allowed)
                            }
                        })
                        .buffer_unordered(128)
                        .filter(|r| std::future::ready(!matches!(r, Ok(true))))
                        .count()
                        .await
                })
            })
            .collect();
        let mut failures = 0;
        for task in tasks {
            failures += task.await.expect("flood task");
        }
        let flood_time = started.elapsed();
        let keys_right_after = dbsize(&mut conn).await;
        let memory_right_after = used_memory(&mut conn).await;
        // The Redis keys of one limiter key with one request, and their exact size. A key
        // written just before its window ends may already be gone: then take another.
        let mut layout = Vec::new();
        let mut per_limiter_key = 0;
        for attempt in 0..20 {
            let key = format!("sample-{attempt}");
            assert!(limiters[0].check(&key, &quota).await.is_allowed());
            let storage = limiters[0].storage_key(&key);
            for key in keys_of(&mut conn, &storage).await {
                let usage = memory_usage(&mut conn, key.as_bytes()).await;
                per_limiter_key += usage;
                layout.push(format!(
                    "{key} ({}, {usage} B)",
                    key_type(&mut conn, &key).await
                ));
            }
            if per_limiter_key > 0 {
                break;
            }
            layout.clear();
        }

        let drain_started = Instant::now();
        let mut keys_after = u64::MAX;
        while drain_started.elapsed() < Duration::from_secs(8) {
            keys_after = dbsize(&mut conn).await;
            if keys_after == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let drain_time = drain_started.elapsed();
        let memory_after = used_memory(&mut conn).await;
        println!(
            "{algorithm}: {KEYS} keys in {flood_time:.2?}; right after: {keys_right_after} Redis \
             keys, used_memory +{} B; one limiter key = [{}] = {per_limiter_key} B; all expired \
             {drain_time:.2?} later ({keys_after} keys, used_memory {:+} B vs baseline)",
            memory_right_after.saturating_sub(base_memory),
            layout.join(", "),
            memory_after as i64 - base_memory as i64
        );
        assert_eq!(
            failures, 0,
            "{algorithm}: every first check admitted, no error"
        );
        assert!(!layout.is_empty(), "{algorithm}: the key was stored");
        assert!(
            per_limiter_key <= 1024,
            "{algorithm}: {per_limiter_key} B for one limiter key with one request"
        );
        assert_eq!(keys_after, 0, "{algorithm}: keys left after expiry");
        assert!(
            memory_after <= base_memory + 256 * 1024,
            "{algorithm}: used_memory {memory_after} B after expiry, baseline {base_memory} B"
        );
    }
}

/// A bounded `MemoryStore` under a flood of 200 000 distinct keys from 2 threads, with a monitor
/// thread polling `len()`: it never exceeds the cap (10 000, rounded up to a multiple of 64
/// shards = 10 048), holds keys up to the cap, and still enforces the newest key.
#[test]
fn memory_store_flood_never_exceeds_its_cap() {
    let _machine = shared_blocking();
    const MAX_KEYS: usize = 10_000;
    const THREADS: usize = 2;
    let cap = MAX_KEYS.div_ceil(64) * 64;
    let quota = Quota::per_hour(10).unwrap(); // nothing expires: eviction must do the work

    for &algorithm in Algorithm::ALL {
        // The cap is enforced by the store, whatever the algorithm: the full flood for the
        // default algorithm, a shorter one (still 4x the cap) for the others.
        let keys: usize = if algorithm == Algorithm::default() {
            200_000
        } else {
            40_000
        };
        let store = MemoryStore::with_max_keys(MAX_KEYS);
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let monitor = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut max_len, mut polls) = (0, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    max_len = max_len.max(store.len());
                    polls += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                (max_len, polls)
            })
        };
        let flooders: Vec<_> = (0..THREADS)
            .map(|t| {
                let limiter = limiter.clone();
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    runtime.block_on(async {
                        for i in (t..keys).step_by(THREADS) {
                            let verdict = limiter.check(&format!("mem-{i}"), &quota).await;
                            assert!(verdict.is_allowed(), "first check of a distinct key");
                        }
                    })
                })
            })
            .collect();
        for flooder in flooders {
            flooder.join().expect("flooder");
        }
        stop.store(true, Ordering::Relaxed);
        let (max_len, polls) = monitor.join().unwrap();
        let final_len = store.len();
        let elapsed = started.elapsed();

        // The newest key is still remembered and enforced.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let newest_kept = rt.block_on(async {
            let one = Quota::per_hour(1).unwrap();
            limiter.check("newest", &one).await.is_allowed()
                && !limiter.check("newest", &one).await.is_allowed()
        });
        println!(
            "{algorithm}: MemoryStore::with_max_keys({MAX_KEYS}) (cap {cap}): {keys} distinct keys \
             from {THREADS} threads in {elapsed:.2?}; len() max {max_len} over {polls} polls, \
             final {final_len}"
        );
        assert!(
            max_len <= cap,
            "{algorithm}: len() reached {max_len} > {cap}"
        );
        assert!(
            final_len <= cap,
            "{algorithm}: final len {final_len} > {cap}"
        );
        assert!(
            final_len >= cap / 2,
            "{algorithm}: only {final_len} keys held: the store should fill up to its cap"
        );
        assert!(
            newest_kept,
            "{algorithm}: the newest key must still be enforced"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Quota tightened, clock stepped back: no lockout, no error
// ---------------------------------------------------------------------------------------------

/// Where the no-lockout scenarios run: the Redis scripts, and their Rust mirrors in
/// `MemoryStore` (which also serves `LocalFallback`).
#[derive(Clone, Copy)]
enum Backend<'a> {
    Redis(&'a RedisServer),
    Memory,
}

impl Backend<'_> {
    fn name(self) -> &'static str {
        match self {
            Backend::Redis(_) => "redis",
            Backend::Memory => "memory",
        }
    }

    /// A limiter on a manual clock standing at `T0`.
    fn limiter(self, algorithm: Algorithm) -> (Limiter, ManualClock) {
        match self {
            Backend::Redis(redis) => manual_limiter(redis, algorithm),
            Backend::Memory => {
                let clock = ManualClock::new(T0);
                let limiter = Limiter::builder(MemoryStore::new())
                    .algorithm(algorithm)
                    .clock(Clock::Manual(clock.clone()))
                    .build()
                    .unwrap();
                (limiter, clock)
            }
        }
    }
}

/// How long a fresh key exhausted at `at` under `quota` stays locked, and its largest
/// `retry_after`: what the algorithm itself imposes, the yardstick for "no extra lockout".
async fn natural_lockout(
    backend: Backend<'_>,
    algorithm: Algorithm,
    quota: &Quota,
    at_micros: u64,
    step: Duration,
) -> (Duration, Duration) {
    let (limiter, clock) = backend.limiter(algorithm);
    clock.set(Duration::from_micros(at_micros));
    let context = format!("{algorithm} on {}: baseline", backend.name());
    // Never reused: a key's state from another scenario would be a disturbance of its own.
    static BASELINES: AtomicU64 = AtomicU64::new(0);
    let key = &format!("baseline-{}", BASELINES.fetch_add(1, Ordering::Relaxed));
    let admitted = burst(&limiter, key, quota, quota.burst() * 3, &context).await;
    assert_eq!(
        admitted,
        quota.burst(),
        "{context}: a fresh key admits its burst"
    );
    let probe = first_admission(
        &limiter,
        &clock,
        key,
        quota,
        step,
        quota.period() * 3,
        &context,
    )
    .await;
    assert_eq!(probe.broken_promise, None, "{context}");
    (
        probe.waited.expect("a fresh key is admitted again"),
        probe.max_retry,
    )
}

/// After a disturbance at the clock's current time (`at_micros`): at most the burst admitted at
/// once, admitted again no later than a fresh key exhausted at the same instant (and within two
/// periods), `retry_after` never beyond the period (or the fresh key's), and a full burst three
/// periods later. Returns a line of figures, or what went wrong.
async fn no_lockout(
    backend: Backend<'_>,
    algorithm: Algorithm,
    limiter: &Limiter,
    clock: &ManualClock,
    key: &str,
    quota: &Quota,
    context: &str,
) -> Result<String, String> {
    let at = clock.now_micros();
    let step = quota.period() / 40;
    let at_once = burst(limiter, key, quota, quota.burst() * 3, context).await;
    let Probe {
        waited,
        max_retry,
        broken_promise,
    } = first_admission(
        limiter,
        clock,
        key,
        quota,
        step,
        quota.period() * 2,
        context,
    )
    .await;
    let (natural, natural_retry) = natural_lockout(backend, algorithm, quota, at, step).await;
    let line = format!(
        "{context}: {at_once} admitted at once, admitted again after {} (fresh key exhausted \
         then: {natural:?}), max retry_after {max_retry:?} (fresh key: {natural_retry:?})",
        waited.map_or_else(|| "NEVER (2 periods)".to_owned(), |w| format!("{w:?}"))
    );
    let mut problems = Vec::new();
    if at_once > quota.burst() {
        problems.push(format!(
            "{at_once} admitted at once, capacity {}",
            quota.burst()
        ));
    }
    match waited {
        None => problems.push("LOCKED OUT for 2 periods".to_owned()),
        Some(waited) if waited > natural.max(quota.period()) + step => {
            problems.push(format!("locked {waited:?}, a fresh key only {natural:?}"))
        }
        Some(_) => {}
    }
    if let Some(broken) = broken_promise {
        problems.push(broken);
    }
    if max_retry > natural_retry.max(quota.period()) {
        problems.push(format!("retry_after {max_retry:?} beyond the period"));
    }
    // And the key keeps working.
    clock.advance(quota.period() * 3);
    let full = burst(limiter, key, quota, quota.burst() * 3, context).await;
    if full != quota.burst() {
        problems.push(format!(
            "{full} admitted 3 periods later, burst {}",
            quota.burst()
        ));
    }
    if problems.is_empty() {
        Ok(line)
    } else {
        Err(format!("{line}\n    FAILED: {}", problems.join("; ")))
    }
}

fn report(results: Vec<Result<String, String>>) {
    let mut failures = Vec::new();
    for result in results {
        match result {
            Ok(line) => println!("{line}"),
            Err(line) => {
                println!("{line}");
                failures.push(line);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A quota tightened from 100 to 10 while state exists (1, 50 or all 100 consumed; also from
/// 100/s to 10/min), for every algorithm, in Redis and in the memory store, on a client clock:
/// never an error, every decision sane, the key's `remaining` within the new capacity, at most
/// the new capacity admitted at once, admitted again no later than a fresh key exhausted at the
/// same instant under the new quota (within two periods at worst), full burst later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tightened_quota_never_locks_out() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    let new = Quota::per_minute(10).unwrap();
    let scenarios = [
        (Quota::per_minute(100).unwrap(), 1),
        (Quota::per_minute(100).unwrap(), 50),
        (Quota::per_minute(100).unwrap(), 100),
        (Quota::per_second(100).unwrap(), 100),
    ];
    let mut results = Vec::new();
    for backend in [Backend::Redis(&redis), Backend::Memory] {
        for &algorithm in Algorithm::ALL {
            let (limiter, clock) = backend.limiter(algorithm);
            for (n, (old, consumed)) in scenarios.iter().enumerate() {
                let key = format!("tighten-{n}");
                let context = format!(
                    "{algorithm} on {}: {}/{:?} with {consumed} consumed -> {}/{:?}",
                    backend.name(),
                    old.limit(),
                    old.period(),
                    new.limit(),
                    new.period()
                );
                let admitted_old = burst(&limiter, &key, old, *consumed, &context).await;
                assert_eq!(
                    admitted_old, *consumed,
                    "{context}: consuming under the old quota"
                );
                // Peek: what the key looks like under the new quota, consuming nothing.
                let peek = limiter
                    .try_check(&key, &new, 0)
                    .await
                    .unwrap_or_else(|e| panic!("{context}: peek failed: {e}"));
                assert_sane(&peek, &new, &context);
                let result =
                    no_lockout(backend, algorithm, &limiter, &clock, &key, &new, &context).await;
                results.push(if peek.remaining > new.burst() {
                    Err(format!("{context}: peek says {} remaining", peek.remaining))
                } else {
                    result
                });
            }
        }
    }
    report(results);
}

/// The clock stepped back (30 s, 1 hour, 1 day) after a key was exhausted, for every algorithm,
/// in Redis and in the memory store: never an error, every decision sane, `retry_after` within
/// the period (or what a fresh key gets), admitted again no later than a fresh key exhausted at
/// the stepped-back time, and a full burst later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_stepped_back_never_locks_out() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    let quota = Quota::per_minute(10).unwrap();
    let steps_back = [
        Duration::from_secs(30),
        Duration::from_secs(3600),
        Duration::from_secs(86_400),
    ];
    let mut results = Vec::new();
    for backend in [Backend::Redis(&redis), Backend::Memory] {
        for &algorithm in Algorithm::ALL {
            let (limiter, clock) = backend.limiter(algorithm);
            for (n, back) in steps_back.iter().enumerate() {
                let key = format!("clock-{n}");
                let context = format!(
                    "{algorithm} on {}: exhausted, clock stepped back {back:?}",
                    backend.name()
                );
                let consumed = burst(&limiter, &key, &quota, quota.burst() * 3, &context).await;
                assert_eq!(consumed, quota.burst(), "{context}: the fresh key's burst");
                clock.set(Duration::from_micros(clock.now_micros()) - *back);
                results.push(
                    no_lockout(backend, algorithm, &limiter, &clock, &key, &quota, &context).await,
                );
            }
        }
    }
    report(results);
}

// ---------------------------------------------------------------------------------------------
// 5. Corrupt and wrong-type stored values self-heal
// ---------------------------------------------------------------------------------------------

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
        "list" => {
            let _: () = redis::cmd("RPUSH")
                .arg(key)
                .arg(garbage)
                .query_async(conn)
                .await
                .unwrap();
            format!("RPUSH {key}")
        }
        "set" => {
            let _: () = redis::cmd("SADD")
                .arg(key)
                .arg(garbage)
                .query_async(conn)
                .await
                .unwrap();
            format!("SADD {key}")
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
    let probe = first_admission(
        limiter,
        clock,
        key,
        quota,
        step,
        quota.period() * 2,
        context,
    )
    .await;
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

// ---------------------------------------------------------------------------------------------
// 6. Property test over the key extraction paths
// ---------------------------------------------------------------------------------------------

/// Maps any byte to one a `HeaderValue` accepts: tab, visible ASCII and space, obs-text
/// (0x80..=0xff).
fn header_byte(b: u8) -> u8 {
    match b {
        b'\t' | 0x20..=0x7e | 0x80..=0xff => b,
        0x7f => b'~',
        _ => b + 0x20,
    }
}

/// Short header values, shrinkable byte by byte.
fn header_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>().prop_map(header_byte), 0..max)
}

/// Long header values (up to `max` bytes), expanded from a seed: cheap to generate.
fn long_header_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    (any::<u64>(), 0..max).prop_map(|(seed, len)| {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                header_byte(x as u8)
            })
            .collect()
    })
}

/// One `X-Forwarded-For` hop: addresses (v4, v6, with ports, padded) or garbage.
fn hop() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<Ipv4Addr>().prop_map(|ip| ip.to_string().into_bytes()),
        any::<Ipv6Addr>().prop_map(|ip| ip.to_string().into_bytes()),
        (any::<Ipv4Addr>(), any::<u16>()).prop_map(|(ip, p)| format!("{ip}:{p}").into_bytes()),
        (any::<Ipv6Addr>(), any::<u16>()).prop_map(|(ip, p)| format!("[{ip}]:{p}").into_bytes()),
        any::<Ipv4Addr>().prop_map(|ip| format!(" \t{ip} ").into_bytes()),
        any::<Ipv4Addr>().prop_map(|ip| ip.to_ipv6_mapped().to_string().into_bytes()),
        header_bytes(24),
    ]
}

#[derive(Debug, Clone)]
struct KeyCase {
    header: Vec<u8>,
    secret: Option<Vec<u8>>,
    fn_key: String,
    forwarded: Vec<Vec<Vec<u8>>>,
    peer: SocketAddr,
    trusted: Vec<(IpAddr, u8)>,
    trust_peer: bool,
    trust_all: bool,
    ipv6_prefix: u8,
}

fn key_case() -> impl Strategy<Value = KeyCase> {
    let fn_key = prop_oneof![
        any::<String>(),
        "[ -~]{0,220}",
        "[a-z0-9{}#:-]{0,12}",
        Just("x".repeat(200)),
        Just("x".repeat(201)),
        proptest::collection::vec(any::<char>(), 150..400)
            .prop_map(|chars| chars.into_iter().collect()),
    ];
    (
        prop_oneof![header_bytes(64), long_header_bytes(3000)],
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32)),
        fn_key,
        proptest::collection::vec(proptest::collection::vec(hop(), 0..6), 0..3),
        any::<SocketAddr>(),
        proptest::collection::vec((any::<IpAddr>(), any::<u8>()), 0..4),
        any::<bool>(),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(
            |(
                header,
                secret,
                fn_key,
                forwarded,
                peer,
                trusted,
                trust_peer,
                trust_all,
                ipv6_prefix,
            )| {
                KeyCase {
                    header,
                    secret,
                    fn_key,
                    forwarded,
                    peer,
                    trusted,
                    trust_peer,
                    trust_all,
                    ipv6_prefix,
                }
            },
        )
}

/// Arbitrary header bytes (`HeaderKey`, with and without a secret), arbitrary strings
/// (`FnKey`), arbitrary forwarded lists, peers (v4/v6) and trusted proxies (`PeerIp`): no panic;
/// every storage key is printable ASCII with exactly one `{` and one `}`, the id is the key when
/// plain and its SHA-256 otherwise, at most prefix + 70 bytes for hashed, header and IP keys
/// (and prefix + 203 for a plain key of the maximal 200 bytes); and the same requests through
/// the layer on real Redis store exactly that key, without a store error.
#[test]
fn prop_key_extraction_paths_stay_bounded() {
    let _machine = shared_blocking();
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prefix = "rl-prop";
    let limiter = Limiter::builder(redis_store(&redis))
        .prefix(prefix)
        .build()
        .unwrap();
    // Room for every case, and each request keeps its key for a while (TTL 3.6 s) so that the
    // test can see it in Redis.
    let quota = Quota::new(1_000_000, Duration::from_secs(3_600_000)).unwrap();
    let conn = std::cell::RefCell::new(redis.conn());
    let cases = AtomicU64::new(0);
    let hashed_fn_keys = AtomicU64::new(0);
    let longest = AtomicUsize::new(0);

    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1000,
        failure_persistence: None, // this test may only create tests/hostile.rs
        ..ProptestConfig::default()
    });
    let started = Instant::now();
    runner
        .run(&key_case(), |case| {
            cases.fetch_add(1, Ordering::Relaxed);
            let header = HeaderValue::from_bytes(&case.header)
                .map_err(|e| TestCaseError::fail(format!("valid header bytes refused: {e}")))?;
            let mut request = http::Request::builder().header("x-api-key", header);
            for line in &case.forwarded {
                let joined = line.join(&b","[..]);
                let value = HeaderValue::from_bytes(&joined).map_err(|e| {
                    TestCaseError::fail(format!("valid forwarded bytes refused: {e}"))
                })?;
                request = request.header("x-forwarded-for", value);
            }
            let mut request = request.body(String::new()).unwrap();
            request.extensions_mut().insert(case.peer);
            request.extensions_mut().insert(RawKey(case.fn_key.clone()));

            let mut header_key = HeaderKey::named("x-api-key").unwrap();
            if let Some(secret) = &case.secret {
                header_key = header_key.with_secret(secret.clone());
            }
            let mut trusted: Vec<Cidr> = case
                .trusted
                .iter()
                .filter_map(|(ip, bits)| format!("{ip}/{}", bits % 129).parse().ok())
                .collect();
            if case.trust_peer {
                trusted.push(case.peer.ip().to_string().parse().unwrap());
            }
            if case.trust_all {
                trusted.push("0.0.0.0/0".parse().unwrap());
                trusted.push("::/0".parse().unwrap());
            }
            let peer_ip = PeerIp::new()
                .trust_proxies(trusted)
                .ipv6_prefix(case.ipv6_prefix);
            let fn_key = FnKey::new(|parts: &http::request::Parts| {
                parts.extensions.get::<RawKey>().map(|k| k.0.clone())
            });

            let (parts, _) = {
                let mut copy = Request::new(());
                *copy.headers_mut() = request.headers().clone();
                copy.extensions_mut().insert(case.peer);
                copy.extensions_mut().insert(RawKey(case.fn_key.clone()));
                copy.into_parts()
            };
            let keys = [
                ("HeaderKey", header_key.extract(&parts), true),
                ("FnKey", fn_key.extract(&parts), false),
                ("PeerIp", peer_ip.extract(&parts), true),
            ];
            for (path, key, short) in &keys {
                let key = key
                    .as_ref()
                    .ok_or_else(|| TestCaseError::fail(format!("{path}: no key")))?;
                let storage = limiter.storage_key(key);
                check_storage_key(&storage, prefix, key)
                    .map_err(|e| TestCaseError::fail(format!("{path}: {e}")))?;
                let hashed = is_hash_id(&storage[prefix.len() + 2..storage.len() - 1]);
                if *short || hashed {
                    prop_assert!(
                        storage.len() <= prefix.len() + 70,
                        "{}: {} bytes: {}",
                        path,
                        storage.len(),
                        storage
                    );
                }
                if *path == "FnKey" && hashed {
                    hashed_fn_keys.fetch_add(1, Ordering::Relaxed);
                }
                longest.fetch_max(storage.len(), Ordering::Relaxed);
            }

            // Through the layer on real Redis: the key stored is exactly storage_key(k).
            let statuses = runtime.block_on(async {
                let by_header = RateLimitLayer::new(limiter.clone(), quota, header_key);
                let by_fn = RateLimitLayer::new(limiter.clone(), quota, fn_key);
                let by_ip = RateLimitLayer::new(limiter.clone(), quota, peer_ip);
                let copy = |request: &Request<String>| {
                    let mut new = Request::new(String::new());
                    *new.headers_mut() = request.headers().clone();
                    new.extensions_mut().insert(case.peer);
                    new.extensions_mut().insert(RawKey(case.fn_key.clone()));
                    new
                };
                [
                    send(&by_header, copy(&request)).await,
                    send(&by_fn, copy(&request)).await,
                    send(&by_ip, request).await,
                ]
            });
            prop_assert_eq!(statuses, [StatusCode::OK; 3]);
            for (path, key, _) in &keys {
                let storage = limiter.storage_key(key.as_deref().unwrap());
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&storage)
                    .query(&mut *conn.borrow_mut())
                    .unwrap();
                prop_assert!(exists, "{}: {} not in Redis", path, storage);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(limiter.stats().store_errors, 0, "no store error");

    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut *conn.borrow_mut())
        .unwrap();
    for key in &keys {
        check_redis_key(key, prefix).unwrap_or_else(|e| panic!("{e}"));
    }
    println!(
        "proptest: {} cases x 3 extraction paths in {:.2?}: {} FnKey keys hashed, longest \
         storage key {} B, {} Redis keys, all bounded with one hash tag",
        cases.load(Ordering::Relaxed),
        started.elapsed(),
        hashed_fn_keys.load(Ordering::Relaxed),
        longest.load(Ordering::Relaxed),
        keys.len()
    );
}
