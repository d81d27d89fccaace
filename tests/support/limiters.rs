//! Limiters as most tests want them, on each backend: a private Redis, a private Cluster or a
//! `MemoryStore`, under the test's algorithm, clock, store timeout, circuit breaker, failure
//! policy, deny cache and prefix. Tests that need other store options (ACL credentials, TLS)
//! build their own.
//!
//! ```ignore
//! let limiter = support::redis_limiter(&redis, Algorithm::Gcra);
//! let limiter = Ctx::new(algorithm).manual(&clock).redis(&redis);
//! let limiter = Ctx::default().without_breaker().failure_policy(FailClosed::default()).redis(&redis);
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redlimit::failure_policy::FailurePolicy;
use redlimit::limiter::LimiterBuilder;
use redlimit::store::{CircuitBreaker, MemoryStore, RedisStore, RedisStoreBuilder, Store};
use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Decision, Limiter, Quota, Quotas, Target,
};

use super::{RedisCluster, RedisServer};

/// A private Redis and a limiter on it (the default context: a generous timeout, so a slow
/// answer on a busy machine never turns into a fail-open admission), on a manual clock at
/// 1 700 000 000 s that moves only when told.
pub struct Fixture {
    _redis: RedisServer,
    pub clock: ManualClock,
    pub limiter: Limiter,
}

impl Fixture {
    pub fn new() -> Self {
        let redis = RedisServer::start();
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let limiter = Ctx::default().manual(&clock).redis(&redis);
        Fixture {
            _redis: redis,
            clock,
            limiter,
        }
    }
}

/// A quota of `limit` per `period`, up to `burst` at once.
pub fn quota_with_burst(limit: u64, period: Duration, burst: u64) -> Quota {
    Quota::new(limit, period)
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// The store timeout unless a test says otherwise: generous, because these tests are about
/// decisions, and a slow answer on a busy 2-core machine must not turn into an error or a
/// fail-open admission (the failure tests set their own timeouts).
pub const PATIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a test varies about its limiters: the algorithm, the clock, the store timeout, and
/// the options most tests leave at the crate's defaults.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub algorithm: Algorithm,
    pub clock: Clock,
    pub timeout: Duration,
    pub options: Options,
}

/// What most tests leave at the crate's defaults (`None`: the default).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `Some(None)`: no circuit breaker; `Some(Some(b))`: `b`.
    pub breaker: Option<Option<CircuitBreaker>>,
    policy: Option<SetPolicy>,
    pub deny_cache: Option<usize>,
    pub prefix: Option<String>,
}

/// Sets a failure policy on a limiter builder (the policy's type is the test's).
#[derive(Clone)]
struct SetPolicy(Arc<dyn Fn(LimiterBuilder) -> LimiterBuilder + Send + Sync>);

impl fmt::Debug for SetPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SetPolicy")
    }
}

impl Default for Ctx {
    /// The crate's default algorithm, clock and options, and [`PATIENT_TIMEOUT`].
    fn default() -> Self {
        Ctx {
            algorithm: Algorithm::default(),
            clock: Clock::default(),
            timeout: PATIENT_TIMEOUT,
            options: Options::default(),
        }
    }
}

impl Ctx {
    /// Limiters under `algorithm`, otherwise as [`Ctx::default`].
    pub fn new(algorithm: Algorithm) -> Self {
        Ctx {
            algorithm,
            ..Ctx::default()
        }
    }

    /// The same, on the client clock `clock`.
    pub fn manual(self, clock: &ManualClock) -> Self {
        self.clock(Clock::Manual(clock.clone()))
    }

    /// The same, on `clock`.
    pub fn clock(self, clock: Clock) -> Self {
        Ctx { clock, ..self }
    }

    /// The same, with store calls timing out after `timeout`.
    pub fn timeout(self, timeout: Duration) -> Self {
        Ctx { timeout, ..self }
    }

    /// The same, with stores that have no circuit breaker.
    pub fn without_breaker(mut self) -> Self {
        self.options.breaker = Some(None);
        self
    }

    /// The same, with stores behind `breaker`.
    pub fn breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.options.breaker = Some(Some(breaker));
        self
    }

    /// The same, with limiters under `policy` when the store fails.
    pub fn failure_policy(mut self, policy: impl FailurePolicy + Clone) -> Self {
        let set = move |builder: LimiterBuilder| builder.failure_policy(policy.clone());
        self.options.policy = Some(SetPolicy(Arc::new(set)));
        self
    }

    /// The same, with a deny cache of `max_keys` keys.
    pub fn deny_cache(mut self, max_keys: usize) -> Self {
        self.options.deny_cache = Some(max_keys);
        self
    }

    /// The same, with storage keys under `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.options.prefix = Some(prefix.into());
        self
    }

    /// A limiter on `store`.
    pub fn limiter(&self, store: impl Store) -> Limiter {
        let mut builder = Limiter::builder(store)
            .algorithm(self.algorithm)
            .clock(self.clock.clone());
        let options = &self.options;
        if let Some(SetPolicy(set)) = &options.policy {
            builder = set(builder);
        }
        if let Some(max_keys) = options.deny_cache {
            builder = builder.deny_cache(max_keys);
        }
        if let Some(prefix) = &options.prefix {
            builder = builder.prefix(prefix.as_str());
        }
        builder.build().expect("valid limiter")
    }

    /// The store options of this context on `builder`.
    fn store(&self, builder: RedisStoreBuilder) -> RedisStore {
        let builder = builder.timeout(self.timeout);
        let builder = match self.options.breaker {
            None => builder,
            Some(None) => builder.without_circuit_breaker(),
            Some(Some(breaker)) => builder.circuit_breaker(breaker),
        };
        builder.build().expect("valid store")
    }

    /// A store on its own connection to `server`.
    pub fn redis_store(&self, server: &RedisServer) -> RedisStore {
        self.store(RedisStore::builder(server.url()))
    }

    /// A store on its own connections to `cluster`.
    pub fn cluster_store(&self, cluster: &RedisCluster) -> RedisStore {
        self.store(RedisStore::cluster_builder(cluster.urls()))
    }

    /// A limiter on its own connection to `server`.
    pub fn redis(&self, server: &RedisServer) -> Limiter {
        self.limiter(self.redis_store(server))
    }

    /// A limiter on its own connections to `cluster`.
    pub fn cluster(&self, cluster: &RedisCluster) -> Limiter {
        self.limiter(self.cluster_store(cluster))
    }

    /// A limiter on a new `MemoryStore` of its own.
    pub fn memory(&self) -> Limiter {
        self.limiter(MemoryStore::new())
    }
}

/// A store on its own connection to `server`, with [`PATIENT_TIMEOUT`].
pub fn redis_store(server: &RedisServer) -> RedisStore {
    Ctx::default().redis_store(server)
}

/// A limiter under `algorithm` on its own connection to `server` (server clock).
pub fn redis_limiter(server: &RedisServer, algorithm: Algorithm) -> Limiter {
    Ctx::new(algorithm).redis(server)
}

/// A limiter under `algorithm` on its own connections to `cluster` (server clock).
pub fn cluster_limiter(cluster: &RedisCluster, algorithm: Algorithm) -> Limiter {
    Ctx::new(algorithm).cluster(cluster)
}

/// A limiter under `algorithm` on a `MemoryStore` of its own.
pub fn memory_limiter(algorithm: Algorithm) -> Limiter {
    Ctx::new(algorithm).memory()
}

/// The message of the error `store.verify()` must fail with, a Redis error (not a timeout nor a
/// closed breaker); printed after `what`, which names the case.
pub async fn redis_error_on_verify(store: &RedisStore, what: &str) -> String {
    let error = store.verify().await.expect_err(what);
    let message = error.to_string();
    println!("{what}: {message}");
    assert!(
        matches!(error, redlimit::store::StoreError::Redis(_)),
        "{error:?}"
    );
    message
}

/// A circuit breaker that opens after `failures` consecutive failures and probes again after
/// 50 ms, so a test sees it open and close quickly.
pub fn breaker_opening_after(failures: u32) -> CircuitBreaker {
    CircuitBreaker {
        failure_threshold: failures,
        cool_down: Duration::from_millis(50),
    }
}

/// Whether `limiter`'s store answers a check of `key` (cost 1) within about 10 s: after a
/// restart, once it has reconnected.
pub async fn answers_within_10s(limiter: &Limiter, key: &str, quota: &Quota) -> bool {
    for _ in 0..200 {
        let answer = limiter.try_check_quotas(key, &quota.into(), 1).await;
        if answer.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The store's own decision on one request of `target` under `quota`, without the failure
/// policy, so a store error fails the test.
pub async fn decision<'a>(
    limiter: &Limiter,
    target: impl Into<Target<'a>>,
    quota: &Quota,
) -> Decision {
    let decision = limiter.try_check_quotas(target, &quota.into(), 1).await;
    decision.expect("the store decides")
}

/// Whether `limiter` admits one request of `target` under `quota` ([`decision`]).
pub async fn admits<'a>(limiter: &Limiter, target: impl Into<Target<'a>>, quota: &Quota) -> bool {
    decision(limiter, target, quota).await.allowed
}

/// Whether `limiter` admits one request on `target` under every tier of `quotas` (the store
/// must decide).
pub async fn admits_quotas<'a>(
    limiter: &Limiter,
    target: impl Into<Target<'a>>,
    quotas: &Quotas,
) -> bool {
    let decision = limiter.try_check_quotas(target, quotas, 1).await;
    decision.expect("the store decides").allowed
}

/// How long `target` stays suspended, as `limiter` reads it (`None`: not suspended).
pub async fn suspended_for<'a>(
    limiter: &Limiter,
    target: impl Into<Target<'a>>,
) -> Option<Duration> {
    let status = limiter.inspect(target).await;
    status.expect("the store answers inspect").suspended_for
}

/// A blocking check of 30 s on `key` under one a minute, twice: the first is admitted, the
/// second denied with the block's time left (at least 29 s). Returns that denial.
pub async fn denied_by_a_block(limiter: &Limiter, key: &str) -> Decision {
    let block = redlimit::limiter::BlockFor::new(Duration::from_secs(30)).unwrap();
    let one = redlimit::Quotas::from(Quota::per_minute(1).unwrap());
    assert!(limiter
        .check_blocking(key, &one, 1, &block)
        .await
        .is_allowed());
    let denied = *limiter
        .check_blocking(key, &one, 1, &block)
        .await
        .decision()
        .unwrap();
    assert!(
        !denied.allowed && denied.retry_after >= Duration::from_secs(29),
        "{denied:?}"
    );
    denied
}

/// Decisions that must be admissions, each a denial noted under what it was, reported together
/// at the end so that one run shows every case that failed.
#[derive(Debug, Default)]
pub struct Denials(Vec<String>);

impl Denials {
    /// Notes `decision` under `what` if it is a denial.
    pub fn note(&mut self, what: impl fmt::Display, decision: &Decision) {
        if !decision.allowed {
            let retry = decision.retry_after;
            self.0
                .push(format!("{what}: denied, retry_after {retry:?}"));
        }
    }

    /// Asserts that none was noted; `why` says what a denial means.
    pub fn assert_none(&self, why: &str) {
        assert!(self.0.is_empty(), "{why}: {:#?}", self.0);
    }
}

/// A store as the ACL user `limiter`, who may touch only the keys that match `keys` (an ACL key
/// pattern, e.g. `redlimit:{ok*`), with `timeout` and `max_batch`: a server that refuses one
/// decision's keys and not another's.
pub fn store_limited_to(
    redis: &RedisServer,
    keys: &str,
    timeout: Duration,
    max_batch: usize,
) -> RedisStore {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("limiter")
        .arg("on")
        .arg(">pw")
        .arg("resetkeys")
        .arg(format!("~{keys}"))
        .arg("+@all")
        .query(&mut redis.conn())
        .expect("ACL SETUSER");
    RedisStore::builder(format!("redis://limiter:pw@127.0.0.1:{}/", redis.port()))
        .timeout(timeout)
        .max_batch(max_batch)
        .build()
        .expect("valid store")
}
