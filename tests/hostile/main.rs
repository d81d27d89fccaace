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
//! - two instances on skewed client clocks: no more admitted than by the fastest clock alone,
//!   plus `rate × skew`;
//! - corrupt or wrong-type stored values: the next check succeeds and the key heals fully;
//! - a property test over every key extraction path.
//!
//! Tests run over `Algorithm::ALL`, so they cover every algorithm the crate has.
//!
//! One module per concern: `keys` (huge and hostile keys), `extraction` (the property test
//! over every key extraction path), `flood` (floods of distinct keys), `lockout` (a tightened
//! quota, a clock stepped back), `skew` (instances whose clocks differ) and `state` (corrupt or
//! wrong-type stored values). The helpers they share live here.

#[path = "../support/mod.rs"]
mod support;

mod extraction;
mod flood;
mod keys;
mod lockout;
mod skew;
mod state;

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use redis::aio::MultiplexedConnection;
use redlimit::key::KeyExtractor;
use redlimit::store::RedisStore;
use redlimit::{clock::ManualClock, Algorithm, Decision, Limiter, Quota, RateLimitLayer};
use support::{Ctx, RedisServer};
use tower::{Layer, ServiceExt};

// ---------------------------------------------------------------------------------------------
// Running alone or side by side
// ---------------------------------------------------------------------------------------------

/// The million-key flood runs alone (`exclusive`), so that its throughput and memory figures
/// are not those of a machine shared with the other tests of this binary, which run side by side
/// (`shared`).
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub(crate) async fn exclusive() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().await
}

pub(crate) async fn shared() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().await
}

/// `shared` for the tests without a runtime.
pub(crate) fn shared_blocking() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.blocking_read()
}

// ---------------------------------------------------------------------------------------------
// Limiters and Redis
// ---------------------------------------------------------------------------------------------

/// An arbitrary fixed instant for the manual clocks (2023-11-14).
pub(crate) const T0: Duration = Duration::from_secs(1_700_000_000);

/// Correctness tests, not latency tests: a generous timeout so a loaded 2-core machine does
/// not turn a slow call into a fail-open, and no breaker.
fn ctx(algorithm: Algorithm) -> Ctx {
    Ctx::new(algorithm)
        .timeout(Duration::from_secs(2))
        .without_breaker()
}

pub(crate) fn redis_store(redis: &RedisServer) -> RedisStore {
    ctx(Algorithm::default()).redis_store(redis)
}

pub(crate) fn redis_limiter(redis: &RedisServer, algorithm: Algorithm) -> Limiter {
    ctx(algorithm).redis(redis)
}

/// A limiter on the client clock `clock` (a manual clock standing at `T0`).
pub(crate) fn manual_limiter(redis: &RedisServer, algorithm: Algorithm) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(T0);
    (ctx(algorithm).manual(&clock).redis(redis), clock)
}

pub(crate) async fn aconn(redis: &RedisServer) -> MultiplexedConnection {
    redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the private redis")
}

/// The Redis keys of one limiter key: its storage key and any `<storage key>:<suffix>`.
pub(crate) async fn keys_of(conn: &mut MultiplexedConnection, storage_key: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{storage_key}*"))
        .query_async(conn)
        .await
        .expect("KEYS pattern");
    keys.sort();
    keys
}

pub(crate) async fn key_type(conn: &mut MultiplexedConnection, key: &str) -> String {
    redis::cmd("TYPE")
        .arg(key)
        .query_async(conn)
        .await
        .expect("TYPE")
}

pub(crate) async fn memory_usage(conn: &mut MultiplexedConnection, key: &[u8]) -> u64 {
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

pub(crate) async fn flushall(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("FLUSHALL")
        .query_async(conn)
        .await
        .expect("FLUSHALL");
}

pub(crate) async fn used_memory(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .expect("INFO memory");
    support::info_field(&info, "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory in INFO memory")
}

// ---------------------------------------------------------------------------------------------
// Key shapes and requests
// ---------------------------------------------------------------------------------------------

/// Whether `id` is kept literally in a storage key (mirrors the documented rule in
/// `redlimit::key`: 1 to 200 bytes of printable ASCII, no braces, not starting with `#`).
fn is_plain(key: &str) -> bool {
    (1..=200).contains(&key.len())
        && !key.starts_with('#')
        && key
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
}

pub(crate) fn is_hash_id(id: &str) -> bool {
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
pub(crate) fn check_redis_key(key: &[u8], prefix: &str) -> Result<String, String> {
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
    // After the hash tag: a scope, i.e. configuration (a layer's policy name and quota, or an
    // algorithm's `:log`), never client input; a default-named layer's is under 50 bytes.
    let suffix = &text[close + 1..];
    if suffix.len() > 64 {
        return Err(format!(
            "unexpectedly long suffix after the hash tag: {text:?}"
        ));
    }
    Ok(id.to_owned())
}

/// Checks `Limiter::storage_key(key)` against the documented rule.
pub(crate) fn check_storage_key(storage: &str, prefix: &str, key: &str) -> Result<(), String> {
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

/// A key carried in the request extensions, for an `FnKey` that returns arbitrary strings.
#[derive(Clone)]
pub(crate) struct RawKey(pub(crate) String);

/// Sends one request through `layer` around an inner service answering 200.
pub(crate) async fn send<K: KeyExtractor>(
    layer: &RateLimitLayer<K>,
    request: Request<String>,
) -> StatusCode {
    let service = layer.layer(tower::service_fn(|_request: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    }));
    service
        .oneshot(request)
        .await
        .expect("the inner service is infallible")
        .status()
}

// ---------------------------------------------------------------------------------------------
// Decisions
// ---------------------------------------------------------------------------------------------

/// A decision any caller can live with: the quota's limit, remaining within capacity, no
/// retry hint when allowed, and bounded times when denied (never "never" for cost 1).
pub(crate) fn assert_sane(d: &Decision, quota: &Quota, context: &str) {
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

pub(crate) async fn decide(limiter: &Limiter, key: &str, quota: &Quota, context: &str) -> Decision {
    let d = limiter
        .try_check_quotas(key, &quota.into(), 1)
        .await
        .unwrap_or_else(|e| panic!("{context}: the check failed: {e}"));
    assert_sane(&d, quota, context);
    d
}

/// Checks `key` at one instant until it is denied (or `max` admissions): how many were admitted.
pub(crate) async fn burst(
    limiter: &Limiter,
    key: &str,
    quota: &Quota,
    max: u64,
    context: &str,
) -> u64 {
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
pub(crate) struct Probe {
    /// How long until a request was admitted; `None` if not within the horizon.
    pub(crate) waited: Option<Duration>,
    /// The largest `retry_after` while denied.
    pub(crate) max_retry: Duration,
    /// A denial at or after the time an earlier `retry_after` promised admission.
    pub(crate) broken_promise: Option<String>,
}

/// From the clock's current time, checks every `step` until a request is admitted (at most
/// `horizon`). Denials consume nothing, so the state only gets better: a `retry_after` is a
/// promise, and a denial after it is due is recorded.
pub(crate) async fn first_admission(
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
