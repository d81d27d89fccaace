//! Limiters as most tests want them, on each backend: a private Redis, a private Cluster or a
//! `MemoryStore`, under the test's algorithm, clock and store timeout. Tests that need other
//! store options (a short timeout, a circuit breaker, ACL credentials, TLS) build their own.
//!
//! ```ignore
//! let limiter = support::redis_limiter(&redis, Algorithm::Gcra);
//! let limiter = Ctx::new(algorithm).manual(&clock).redis(&redis);
//! ```

use std::time::Duration;

use redlimit::store::{MemoryStore, RedisStore, Store};
use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Limiter, Quota,
};

use super::{RedisCluster, RedisServer};

/// The store timeout unless a test says otherwise: generous, because these tests are about
/// decisions, and a slow answer on a busy 2-core machine must not turn into an error or a
/// fail-open admission (the failure tests set their own timeouts).
pub const PATIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a test varies about its limiters: the algorithm, the clock and the store timeout.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub algorithm: Algorithm,
    pub clock: Clock,
    pub timeout: Duration,
}

impl Default for Ctx {
    /// The crate's default algorithm and clock, and [`PATIENT_TIMEOUT`].
    fn default() -> Self {
        Ctx {
            algorithm: Algorithm::default(),
            clock: Clock::default(),
            timeout: PATIENT_TIMEOUT,
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

    /// A limiter on `store`.
    pub fn limiter(&self, store: impl Store) -> Limiter {
        Limiter::builder(store)
            .algorithm(self.algorithm)
            .clock(self.clock.clone())
            .build()
            .expect("valid limiter")
    }

    /// A store on its own connection to `server`.
    pub fn redis_store(&self, server: &RedisServer) -> RedisStore {
        RedisStore::builder(server.url())
            .timeout(self.timeout)
            .build()
            .expect("valid url")
    }

    /// A store on its own connections to `cluster`.
    pub fn cluster_store(&self, cluster: &RedisCluster) -> RedisStore {
        RedisStore::cluster_builder(cluster.urls())
            .timeout(self.timeout)
            .build()
            .expect("valid urls")
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

/// Whether `limiter` admits one request of `key` under `quota`: the store's own decision, without
/// the failure policy, so a store error fails the test.
pub async fn admits(limiter: &Limiter, key: &str, quota: &Quota) -> bool {
    let decision = limiter.try_check_quotas(key, &quota.into(), 1).await;
    decision.expect("the store decides").allowed
}
